#include "engine.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static int compare_request_addresses(const void *left, const void *right)
{
    uintptr_t a = (uintptr_t)*(glmrt_request *const *)left;
    uintptr_t b = (uintptr_t)*(glmrt_request *const *)right;
    return a < b ? -1 : (a > b ? 1 : 0);
}

static int32_t first_entry_not_live(const glmrt_engine *engine, glmrt_request *const *states, int32_t n)
{
    for (int32_t i = 0; i < n; ++i) {
        int live = 0;
        for (const glmrt_request *request = engine->live_head; request != NULL && !live; request = request->next) {
            live = request == states[i];
        }
        if (!live) {
            return i;
        }
    }
    return -1;
}

static glmrt_status validate_batch_members(glmrt_engine *engine, glmrt_request *const *states, int32_t n)
{
    glmrt_request **sorted = engine->scratch.sorted_states;
    for (int32_t i = 0; i < n; ++i) {
        if (states[i] == NULL) {
            return glmrt_error_set(&engine->error, GLMRT_ERR_INVALID_ARGUMENT, "batch entry %d is NULL", i);
        }
        sorted[i] = states[i];
    }
    qsort(sorted, (size_t)n, sizeof(*sorted), compare_request_addresses);
    for (int32_t i = 1; i < n; ++i) {
        if (sorted[i] == sorted[i - 1]) {
            return glmrt_error_set(&engine->error, GLMRT_ERR_INVALID_ARGUMENT,
                                   "a request appears twice in the batch");
        }
    }
    int32_t found = 0;
    for (glmrt_request *request = engine->live_head; request != NULL && found < n; request = request->next) {
        if (bsearch(&request, sorted, (size_t)n, sizeof(*sorted), compare_request_addresses) != NULL) {
            found += 1;
        }
    }
    if (found != n) {
        return glmrt_error_set(&engine->error, GLMRT_ERR_INVALID_ARGUMENT,
                               "batch entry %d is not a live request of this engine (freed, or from another engine)",
                               first_entry_not_live(engine, states, n));
    }
    return GLMRT_OK;
}

static glmrt_status validate_batch(glmrt_engine *engine, glmrt_request **states, int32_t n, const int64_t *out_tokens,
                                   const uint8_t *out_done, const float *out_logits)
{
    if (n < 0 || n > engine->options.max_batch) {
        return glmrt_error_set(&engine->error, GLMRT_ERR_INVALID_ARGUMENT, "batch of %d requests is outside [0, %d]",
                               n, engine->options.max_batch);
    }
    if (n == 0) {
        return GLMRT_OK;
    }
    if (states == NULL || out_tokens == NULL || out_done == NULL) {
        return glmrt_error_set(&engine->error, GLMRT_ERR_INVALID_ARGUMENT,
                               "batch of %d requests needs request, token and done arrays", n);
    }
    if (engine->backend_ops == NULL || engine->backend_ops->forward == NULL) {
        return glmrt_error_set(&engine->error, GLMRT_ERR_BACKEND, "engine has no backend forward pass");
    }
    if (out_logits != NULL && engine->scratch.logits == NULL) {
        return glmrt_error_set(&engine->error, GLMRT_ERR_INVARIANT, "engine has no logits scratch");
    }
    return validate_batch_members(engine, states, n);
}

static int32_t assign_decode_tokens(glmrt_request *const *states, int32_t n, int32_t budget, int32_t *chunk)
{
    for (int32_t i = 0; i < n; ++i) {
        chunk[i] = 0;
        if (!glmrt_request_is_finished(states[i]) && glmrt_request_num_pending(states[i]) == 1 && budget > 0) {
            chunk[i] = 1;
            budget -= 1;
        }
    }
    return budget;
}

static void assign_prefill_tokens(glmrt_request *const *states, int32_t n, int32_t budget, int32_t *chunk)
{
    for (int32_t i = 0; i < n && budget > 0; ++i) {
        int32_t pending = glmrt_request_num_pending(states[i]);
        if (glmrt_request_is_finished(states[i]) || pending <= 1) {
            continue;
        }
        chunk[i] = pending < budget ? pending : budget;
        budget -= chunk[i];
    }
}

static glmrt_status plan_sequences(glmrt_engine *engine, glmrt_request *const *states, int32_t n,
                                   int32_t *out_num_seqs)
{
    glmrt_step_scratch *scratch = &engine->scratch;
    int32_t *chunk = scratch->seq_num_tokens;
    int32_t budget = assign_decode_tokens(states, n, engine->options.max_tokens_per_step, chunk);
    assign_prefill_tokens(states, n, budget, chunk);
    int32_t num_seqs = 0;
    int64_t new_pages = 0;
    for (int32_t i = 0; i < n; ++i) {
        if (chunk[i] == 0) {
            continue;
        }
        glmrt_request *request = states[i];
        int32_t count = chunk[i];
        int32_t needed = glmrt_kv_pages_for_tokens(&engine->kv_pages, (int64_t)request->num_computed_tokens + count);
        int32_t fresh = needed > request->num_pages ? needed - request->num_pages : 0;
        if (request->num_pages + fresh > request->page_table_capacity) {
            return glmrt_error_set(&engine->error, GLMRT_ERR_INVARIANT,
                                   "request %lld needs %d pages, its page table holds %d", (long long)request->id,
                                   request->num_pages + fresh, request->page_table_capacity);
        }
        scratch->seq_num_tokens[num_seqs] = count;
        scratch->seq_batch_index[num_seqs] = i;
        scratch->seq_requests[num_seqs] = request;
        scratch->seq_new_pages[num_seqs] = fresh;
        new_pages += fresh;
        num_seqs += 1;
    }
    if (new_pages > engine->kv_pages.num_free) {
        return glmrt_error_set(&engine->error, GLMRT_ERR_OUT_OF_PAGES, "step needs %lld pages, %d free",
                               (long long)new_pages, engine->kv_pages.num_free);
    }
    *out_num_seqs = num_seqs;
    return GLMRT_OK;
}

static void release_step_pages(glmrt_engine *engine, int32_t num_seqs)
{
    glmrt_step_scratch *scratch = &engine->scratch;
    glmrt_error ignored;
    for (int32_t s = num_seqs - 1; s >= 0; --s) {
        glmrt_request *request = scratch->seq_requests[s];
        int32_t fresh = scratch->seq_new_pages[s];
        request->num_pages -= fresh;
        glmrt_kv_pages_release(&engine->kv_pages, request->id, request->page_table + request->num_pages, fresh,
                               &ignored);
    }
}

static glmrt_status allocate_step_pages(glmrt_engine *engine, int32_t num_seqs)
{
    glmrt_step_scratch *scratch = &engine->scratch;
    for (int32_t s = 0; s < num_seqs; ++s) {
        glmrt_request *request = scratch->seq_requests[s];
        int32_t fresh = scratch->seq_new_pages[s];
        glmrt_status status = glmrt_kv_pages_alloc(&engine->kv_pages, request->id, fresh,
                                                   request->page_table + request->num_pages, &engine->error);
        if (status != GLMRT_OK) {
            release_step_pages(engine, s);
            return status;
        }
        request->num_pages += fresh;
    }
    return GLMRT_OK;
}

static void fill_step_batch(glmrt_engine *engine, int32_t num_seqs, glmrt_step_batch *batch)
{
    glmrt_step_scratch *scratch = &engine->scratch;
    int32_t num_tokens = 0;
    int32_t num_samples = 0;
    for (int32_t s = 0; s < num_seqs; ++s) {
        glmrt_request *request = scratch->seq_requests[s];
        int32_t count = scratch->seq_num_tokens[s];
        int32_t first = request->num_computed_tokens;
        scratch->seq_token_start[s] = num_tokens;
        scratch->seq_context_len[s] = first + count;
        scratch->seq_page_tables[s] = request->page_table;
        for (int32_t j = 0; j < count; ++j) {
            scratch->token_ids[num_tokens + j] = request->tokens[first + j];
            scratch->positions[num_tokens + j] = first + j;
            scratch->token_seq[num_tokens + j] = s;
        }
        num_tokens += count;
        if (first + count == request->num_tokens) {
            scratch->sample_seq[num_samples] = s;
            scratch->sample_token_index[num_samples] = num_tokens - 1;
            num_samples += 1;
        }
    }
    batch->num_tokens = num_tokens;
    batch->token_ids = scratch->token_ids;
    batch->positions = scratch->positions;
    batch->token_seq = scratch->token_seq;
    batch->num_seqs = num_seqs;
    batch->seq_requests = scratch->seq_requests;
    batch->seq_token_start = scratch->seq_token_start;
    batch->seq_num_tokens = scratch->seq_num_tokens;
    batch->seq_context_len = scratch->seq_context_len;
    batch->seq_page_tables = scratch->seq_page_tables;
    batch->num_samples = num_samples;
    batch->sample_seq = scratch->sample_seq;
    batch->sample_token_index = scratch->sample_token_index;
}

static glmrt_status check_sampled_tokens(glmrt_engine *engine, const glmrt_step_batch *batch)
{
    for (int32_t k = 0; k < batch->num_samples; ++k) {
        glmrt_token token = engine->scratch.sampled[k];
        if (token < 0 || token >= engine->config.vocab_size) {
            return glmrt_error_set(&engine->error, GLMRT_ERR_BACKEND,
                                   "backend %s sampled token %d outside the vocabulary of %d",
                                   engine->backend_ops->name, token, engine->config.vocab_size);
        }
    }
    return GLMRT_OK;
}

static glmrt_status run_forward(glmrt_engine *engine, int32_t num_seqs, glmrt_step_batch *batch, int want_logits)
{
    glmrt_status status = allocate_step_pages(engine, num_seqs);
    if (status != GLMRT_OK) {
        return status;
    }
    fill_step_batch(engine, num_seqs, batch);
    status = engine->backend_ops->forward(engine->backend_state, batch, want_logits ? engine->scratch.logits : NULL,
                                          engine->scratch.sampled);
    if (status == GLMRT_OK) status = check_sampled_tokens(engine, batch);
    if (status != GLMRT_OK) {
        release_step_pages(engine, num_seqs);
    }
    return status;
}

static int token_stops(const glmrt_request *request, glmrt_token token)
{
    if (request->params.ignore_eos) {
        return 0;
    }
    for (int32_t i = 0; i < request->params.num_stop_token_ids; ++i) {
        if (request->params.stop_token_ids[i] == token) {
            return 1;
        }
    }
    return 0;
}

static void append_sampled_token(glmrt_engine *engine, glmrt_request *request, glmrt_token token)
{
    request->tokens[request->num_tokens++] = token;
    engine->tokens_generated += 1;
    if (token_stops(request, token)) {
        request->finish_reason = GLMRT_FINISH_STOP;
    } else if (glmrt_request_num_generated(request) >= request->params.max_new_tokens ||
               request->num_tokens >= request->max_tokens) {
        request->finish_reason = GLMRT_FINISH_LENGTH;
    }
}

static void commit_step(glmrt_engine *engine, const glmrt_step_batch *batch)
{
    glmrt_step_scratch *scratch = &engine->scratch;
    for (int32_t s = 0; s < batch->num_seqs; ++s) {
        scratch->seq_requests[s]->num_computed_tokens += scratch->seq_num_tokens[s];
    }
    for (int32_t k = 0; k < batch->num_samples; ++k) {
        append_sampled_token(engine, scratch->seq_requests[batch->sample_seq[k]], scratch->sampled[k]);
    }
    engine->tokens_processed += batch->num_tokens;
    if (batch->num_tokens > 0) {
        engine->steps += 1;
    }
}

static void write_outputs(glmrt_engine *engine, glmrt_request *const *states, int32_t n,
                          const glmrt_step_batch *batch, int64_t *out_tokens, uint8_t *out_done, float *out_logits)
{
    glmrt_step_scratch *scratch = &engine->scratch;
    int32_t vocab_size = engine->config.vocab_size;
    for (int32_t i = 0; i < n; ++i) {
        out_tokens[i] = -1;
        out_done[i] = (uint8_t)states[i]->finish_reason;
    }
    for (int32_t k = 0; k < batch->num_samples; ++k) {
        int32_t i = scratch->seq_batch_index[batch->sample_seq[k]];
        out_tokens[i] = scratch->sampled[k];
        if (out_logits != NULL) {
            memcpy(out_logits + (size_t)i * vocab_size, scratch->logits + (size_t)k * vocab_size,
                   (size_t)vocab_size * sizeof(float));
        }
    }
    if (out_logits == NULL) {
        return;
    }
    for (int32_t i = 0; i < n; ++i) {
        if (out_tokens[i] >= 0) {
            continue;
        }
        float *row = out_logits + (size_t)i * vocab_size;
        for (int32_t v = 0; v < vocab_size; ++v) {
            row[v] = NAN;
        }
    }
}

glmrt_status glmrt_run_batch_decode_logits(glmrt_engine *engine, glmrt_request **states, int32_t n,
                                           int64_t *out_tokens, uint8_t *out_done, float *out_logits)
{
    if (engine == NULL) {
        return GLMRT_ERR_INVALID_ARGUMENT;
    }
    glmrt_status status = validate_batch(engine, states, n, out_tokens, out_done, out_logits);
    if (status != GLMRT_OK || n == 0) {
        return status;
    }
    int32_t num_seqs = 0;
    status = plan_sequences(engine, states, n, &num_seqs);
    if (status != GLMRT_OK) {
        return status;
    }
    glmrt_step_batch batch;
    memset(&batch, 0, sizeof(batch));
    if (num_seqs > 0) {
        status = run_forward(engine, num_seqs, &batch, out_logits != NULL);
        if (status != GLMRT_OK) {
            return status;
        }
    }
    commit_step(engine, &batch);
    write_outputs(engine, states, n, &batch, out_tokens, out_done, out_logits);
    return GLMRT_OK;
}

glmrt_status glmrt_run_batch_decode(glmrt_engine *engine, glmrt_request **states, int32_t n, int64_t *out_tokens,
                                    uint8_t *out_done)
{
    return glmrt_run_batch_decode_logits(engine, states, n, out_tokens, out_done, NULL);
}
