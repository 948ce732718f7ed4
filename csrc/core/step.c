#include <math.h>
#include <stdint.h>
#include <string.h>

#include "step_ahead.h"
#include "step_plan.h"

static glmrt_status check_step_outputs(glmrt_engine *engine, int32_t n, const int64_t *out_tokens,
                                       const int32_t *out_finish_reasons)
{
    if (n > 0 && (out_tokens == NULL || out_finish_reasons == NULL)) {
        return glmrt_error_set(&engine->error, GLMRT_ERR_INVALID_ARGUMENT,
                               "batch of %d requests needs token and finish-reason arrays", n);
    }
    return GLMRT_OK;
}

static glmrt_status check_step_backend(glmrt_engine *engine, int want_logits)
{
    const glmrt_backend_ops *ops = engine->backend_ops;
    if (ops == NULL || ops->launch == NULL || ops->complete == NULL) {
        return glmrt_error_set(&engine->error, GLMRT_ERR_BACKEND, "engine has no backend forward pass");
    }
    if (want_logits && engine->scratch.logits == NULL) {
        return glmrt_error_set(&engine->error, GLMRT_ERR_INVARIANT, "engine has no logits scratch");
    }
    return GLMRT_OK;
}

static void release_sequence_pages(glmrt_engine *engine, glmrt_step_scratch *scratch, int32_t s,
                                   int32_t fresh_taken)
{
    if (scratch->seq_discard[s]) {
        return;
    }
    glmrt_request *request = scratch->seq_requests[s];
    glmrt_error ignored;
    request->num_pages -= fresh_taken;
    glmrt_kv_pages_release(&engine->kv_pages, request->page_table + request->num_pages, fresh_taken, &ignored);
    int32_t hits = scratch->seq_hit_pages[s];
    if (hits > 0) {
        glmrt_kv_pages_release(&engine->kv_pages, request->page_table, hits, &ignored);
        request->num_pages = 0;
        request->num_registered_pages = 0;
        request->num_computed_tokens = 0;
    }
}

void glmrt_step_release_pages(glmrt_engine *engine, glmrt_step_scratch *scratch, int32_t num_seqs,
                              int32_t num_allocated)
{
    for (int32_t s = num_seqs - 1; s >= 0; --s) {
        release_sequence_pages(engine, scratch, s, s < num_allocated ? scratch->seq_new_pages[s] : 0);
    }
}

glmrt_status glmrt_step_take_fresh_pages(glmrt_engine *engine, glmrt_step_scratch *scratch, int32_t num_seqs)
{
    for (int32_t s = 0; s < num_seqs; ++s) {
        glmrt_request *request = scratch->seq_requests[s];
        int32_t fresh = scratch->seq_new_pages[s];
        glmrt_status status = glmrt_kv_pages_alloc(&engine->kv_pages, fresh, request->page_table + request->num_pages,
                                                   &engine->error);
        if (status != GLMRT_OK) {
            glmrt_step_release_pages(engine, scratch, num_seqs, s);
            return status;
        }
        request->num_pages += fresh;
    }
    return GLMRT_OK;
}

static glmrt_status acquire_prefix_hits(glmrt_engine *engine, int32_t s)
{
    glmrt_step_scratch *scratch = &engine->scratch;
    glmrt_request *request = scratch->seq_requests[s];
    glmrt_kv_pages *pages = &engine->kv_pages;
    if (!pages->caching || request->num_computed_tokens != 0 || request->num_pages != 0) {
        return GLMRT_OK;
    }
    scratch->step_prefix_queries += request->num_tokens;
    glmrt_page_id parent = GLMRT_PAGE_NONE;
    for (int32_t i = 0; i < scratch->seq_hit_pages[s]; ++i) {
        glmrt_page_id page = glmrt_prefix_cache_lookup(pages, parent, request->tokens + (size_t)i * pages->page_size);
        glmrt_status status = glmrt_kv_pages_acquire(pages, page, &engine->error);
        if (status != GLMRT_OK) {
            glmrt_error ignored;
            glmrt_kv_pages_release(pages, request->page_table, i, &ignored);
            scratch->seq_hit_pages[s] = 0;
            return status;
        }
        request->page_table[i] = page;
        parent = page;
    }
    request->num_pages = scratch->seq_hit_pages[s];
    request->num_registered_pages = request->num_pages;
    request->num_computed_tokens = request->num_pages * pages->page_size;
    scratch->step_prefix_hits += request->num_computed_tokens;
    return GLMRT_OK;
}

static glmrt_status allocate_step_pages(glmrt_engine *engine, int32_t num_seqs)
{
    glmrt_step_scratch *scratch = &engine->scratch;
    scratch->step_prefix_queries = 0;
    scratch->step_prefix_hits = 0;
    for (int32_t s = 0; s < num_seqs; ++s) {
        glmrt_status status = acquire_prefix_hits(engine, s);
        if (status != GLMRT_OK) {
            glmrt_step_release_pages(engine, scratch, s, 0);
            return status;
        }
    }
    return glmrt_step_take_fresh_pages(engine, scratch, num_seqs);
}

void glmrt_step_batch_point(glmrt_step_batch *batch, const glmrt_step_scratch *scratch, int32_t num_tokens,
                            int32_t num_seqs, int32_t num_samples)
{
    memset(batch, 0, sizeof(*batch));
    batch->num_tokens = num_tokens;
    batch->token_ids = scratch->token_ids;
    batch->positions = scratch->positions;
    batch->token_seq = scratch->token_seq;
    batch->num_seqs = num_seqs;
    batch->seq_token_start = scratch->seq_token_start;
    batch->seq_num_tokens = scratch->seq_num_tokens;
    batch->seq_context_len = scratch->seq_context_len;
    batch->seq_page_tables = (const glmrt_page_id *const *)scratch->seq_page_tables;
    batch->seq_num_pages = scratch->seq_num_pages;
    batch->num_samples = num_samples;
    batch->sample_seq = scratch->sample_seq;
    batch->sample_token_index = scratch->sample_token_index;
    batch->samples = scratch->samples;
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
        scratch->seq_num_pages[s] = request->num_pages;
        for (int32_t j = 0; j < count; ++j) {
            scratch->token_ids[num_tokens + j] = request->tokens[first + j];
            scratch->positions[num_tokens + j] = first + j;
            scratch->token_seq[num_tokens + j] = s;
        }
        num_tokens += count;
        if (first + count == request->num_tokens) {
            glmrt_step_sample *sample = &scratch->samples[num_samples];
            sample->params = &request->params;
            sample->history = request->tokens;
            sample->num_prompt_tokens = request->num_prompt_tokens;
            sample->num_history = request->num_tokens;
            scratch->sample_seq[num_samples] = s;
            scratch->sample_token_index[num_samples] = num_tokens - 1;
            num_samples += 1;
        }
    }
    glmrt_step_batch_point(batch, scratch, num_tokens, num_seqs, num_samples);
}

static glmrt_status check_sampled_tokens(glmrt_engine *engine, const glmrt_step_scratch *scratch,
                                        const glmrt_step_batch *batch)
{
    for (int32_t k = 0; k < batch->num_samples; ++k) {
        glmrt_token token = scratch->sampled[k];
        if (token < 0 || token >= engine->config.vocab_size) {
            return glmrt_error_set(&engine->error, GLMRT_ERR_BACKEND,
                                   "backend %s sampled token %d outside the vocabulary of %d",
                                   engine->backend_ops->name, token, engine->config.vocab_size);
        }
    }
    return GLMRT_OK;
}

static int continues_last_step(const glmrt_engine *engine, int32_t num_seqs)
{
    for (int32_t s = 0; s < num_seqs; ++s) {
        if (engine->scratch.seq_requests[s]->last_step == engine->steps) {
            return 1;
        }
    }
    return 0;
}

static void close_step_gap(glmrt_engine *engine, int32_t num_seqs)
{
    glmrt_step_gaps *gaps = &engine->step_gaps;
    if (gaps->completed_at_ns != 0 && continues_last_step(engine, num_seqs)) {
        gaps->total_ns += glmrt_monotonic_ns() - gaps->completed_at_ns;
        gaps->count += 1;
    }
    gaps->completed_at_ns = 0;
}

static glmrt_status launch_forward(glmrt_engine *engine, int32_t num_seqs, glmrt_step_batch *batch, int want_logits)
{
    glmrt_status status = allocate_step_pages(engine, num_seqs);
    if (status != GLMRT_OK) {
        return status;
    }
    fill_step_batch(engine, num_seqs, batch);
    close_step_gap(engine, num_seqs);
    status = engine->backend_ops->launch(engine->backend_state, batch, want_logits ? engine->scratch.logits : NULL,
                                         engine->scratch.sampled);
    if (status != GLMRT_OK) {
        glmrt_step_release_pages(engine, &engine->scratch, num_seqs, num_seqs);
    }
    return status;
}

static void abandon_launched(glmrt_engine *engine, glmrt_step_flight *flight)
{
    if (flight->num_seqs > 0) {
        glmrt_step_report report = {0, 0};
        engine->backend_ops->complete(engine->backend_state, &report);
        glmrt_step_release_pages(engine, flight->scratch, flight->num_seqs, flight->num_seqs);
    }
}

static glmrt_status finish_forward(glmrt_engine *engine, const glmrt_step_flight *flight, glmrt_step_flight *ahead)
{
    glmrt_step_report report = {0, 0};
    glmrt_status status = engine->backend_ops->complete(engine->backend_state, &report);
    engine->device_forward_ns += report.device_ns;
    engine->rows_owned_steps += report.rows_owned ? 1 : 0;
    if (status == GLMRT_OK) status = check_sampled_tokens(engine, flight->scratch, &flight->batch);
    if (status != GLMRT_OK) {
        if (ahead != NULL) {
            abandon_launched(engine, ahead);
        }
        glmrt_step_release_pages(engine, flight->scratch, flight->num_seqs, flight->num_seqs);
    }
    return status;
}

void glmrt_step_mark_in_flight(glmrt_request *const *requests, int32_t n, int32_t in_flight)
{
    for (int32_t i = 0; i < n; ++i) {
        requests[i]->in_flight = in_flight;
    }
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

static void register_full_pages(glmrt_engine *engine, glmrt_request *request)
{
    glmrt_kv_pages *pages = &engine->kv_pages;
    int32_t full = request->num_computed_tokens / pages->page_size;
    while (pages->caching && request->num_registered_pages < full) {
        int32_t index = request->num_registered_pages;
        glmrt_page_id page = request->page_table[index];
        glmrt_page_id parent = index == 0 ? GLMRT_PAGE_NONE : request->page_table[index - 1];
        glmrt_prefix_cache_register(pages, page, parent, request->tokens + (size_t)index * pages->page_size);
        if (!glmrt_kv_pages_is_registered(pages, page)) {
            return;
        }
        request->num_registered_pages += 1;
    }
}

static void commit_step(glmrt_engine *engine, glmrt_step_scratch *scratch, const glmrt_step_batch *batch)
{
    int32_t committed_tokens = 0;
    for (int32_t s = 0; s < batch->num_seqs; ++s) {
        if (scratch->seq_discard[s]) {
            continue;
        }
        scratch->seq_requests[s]->num_computed_tokens += scratch->seq_num_tokens[s];
        scratch->seq_requests[s]->last_step = engine->steps + 1;
        register_full_pages(engine, scratch->seq_requests[s]);
        committed_tokens += scratch->seq_num_tokens[s];
    }
    engine->prefix_cache_queries += scratch->step_prefix_queries;
    engine->prefix_cache_hits += scratch->step_prefix_hits;
    scratch->step_prefix_queries = 0;
    scratch->step_prefix_hits = 0;
    for (int32_t k = 0; k < batch->num_samples; ++k) {
        if (!scratch->seq_discard[batch->sample_seq[k]]) {
            append_sampled_token(engine, scratch->seq_requests[batch->sample_seq[k]], scratch->sampled[k]);
        }
    }
    engine->tokens_processed += committed_tokens;
    if (committed_tokens > 0) {
        engine->steps += 1;
    }
}

static void write_outputs(glmrt_engine *engine, const glmrt_step_scratch *scratch, glmrt_request *const *requests,
                          int32_t n, const glmrt_step_batch *batch, int64_t *out_tokens, int32_t *out_finish_reasons,
                          float *out_logits)
{
    int32_t vocab_size = engine->config.vocab_size;
    for (int32_t i = 0; i < n; ++i) {
        out_tokens[i] = -1;
        out_finish_reasons[i] = requests[i]->finish_reason;
    }
    for (int32_t k = 0; k < batch->num_samples; ++k) {
        if (scratch->seq_discard[batch->sample_seq[k]]) {
            continue;
        }
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

static glmrt_status drain_ahead(glmrt_engine *engine)
{
    glmrt_step_flight *draining = &engine->draining;
    if (!draining->active) {
        return GLMRT_OK;
    }
    draining->active = 0;
    glmrt_step_report report = {0, 0};
    glmrt_status status = engine->backend_ops->complete(engine->backend_state, &report);
    engine->device_forward_ns += report.device_ns;
    return status;
}

static glmrt_status launch_step(glmrt_engine *engine, glmrt_request *const *requests, int32_t n, int want_logits,
                                const char *action)
{
    glmrt_status status = glmrt_engine_require_no_flight(engine, action);
    if (status == GLMRT_OK) status = drain_ahead(engine);
    if (status == GLMRT_OK) status = glmrt_step_check_batch(engine, requests, n);
    if (status == GLMRT_OK) status = check_step_backend(engine, want_logits);
    if (status != GLMRT_OK) {
        return status;
    }
    glmrt_step_plan plan;
    memset(&plan, 0, sizeof(plan));
    if (n > 0) {
        status = glmrt_step_plan_sequences(engine, requests, n, &plan);
    }
    if (status != GLMRT_OK) {
        return status;
    }
    if (plan.num_new_pages > plan.num_free_pages) {
        return glmrt_error_set(&engine->error, GLMRT_ERR_OUT_OF_PAGES, "step needs %d pages, %d free",
                               plan.num_new_pages, plan.num_free_pages);
    }
    glmrt_step_flight *flight = &engine->flight;
    memset(&flight->batch, 0, sizeof(flight->batch));
    flight->scratch = &engine->scratch;
    if (plan.num_scheduled_requests > 0) {
        status = launch_forward(engine, plan.num_scheduled_requests, &flight->batch, want_logits);
        if (status != GLMRT_OK) {
            return status;
        }
    }
    if (n > 0) {
        memcpy(engine->scratch.flight_requests, requests, (size_t)n * sizeof(*requests));
    }
    glmrt_step_mark_in_flight(engine->scratch.flight_requests, n, 1);
    flight->num_requests = n;
    flight->num_seqs = plan.num_scheduled_requests;
    flight->active = 1;
    return GLMRT_OK;
}

static void end_flight(glmrt_engine *engine)
{
    glmrt_step_mark_in_flight(engine->flight.scratch->flight_requests, engine->flight.num_requests, 0);
    engine->flight.active = 0;
}

static glmrt_status complete_step(glmrt_engine *engine, int64_t *out_tokens, int32_t *out_finish_reasons,
                                  float *out_logits, glmrt_step_flight *ahead)
{
    glmrt_step_flight *flight = &engine->flight;
    glmrt_status status = flight->num_seqs > 0 ? finish_forward(engine, flight, ahead) : GLMRT_OK;
    end_flight(engine);
    if (status != GLMRT_OK) {
        return status;
    }
    commit_step(engine, flight->scratch, &flight->batch);
    if (flight->num_seqs > 0) {
        engine->step_gaps.completed_at_ns = glmrt_monotonic_ns();
    }
    write_outputs(engine, flight->scratch, flight->scratch->flight_requests, flight->num_requests, &flight->batch,
                  out_tokens, out_finish_reasons, out_logits);
    return GLMRT_OK;
}

void glmrt_step_abandon(glmrt_engine *engine)
{
    drain_ahead(engine);
    glmrt_step_flight *flight = &engine->flight;
    if (flight->active) {
        abandon_launched(engine, flight);
        end_flight(engine);
    }
}

glmrt_status glmrt_step_launch(glmrt_engine *engine, glmrt_request *const *requests, int32_t n)
{
    if (engine == NULL) {
        return GLMRT_ERR_INVALID_ARGUMENT;
    }
    return launch_step(engine, requests, n, 0, "step_launch");
}

static glmrt_status check_complete_call(glmrt_engine *engine, int32_t capacity, const int64_t *out_tokens,
                                       const int32_t *out_finish_reasons, int32_t *out_count)
{
    if (out_count == NULL) {
        return glmrt_error_set(&engine->error, GLMRT_ERR_INVALID_ARGUMENT, "step_complete: count output is NULL");
    }
    *out_count = 0;
    if (!engine->flight.active) {
        return glmrt_error_set(&engine->error, GLMRT_ERR_INVALID_ARGUMENT,
                               "step_complete: no step is in flight; launch one with glmrt_step_launch first");
    }
    int32_t n = engine->flight.num_requests;
    if (capacity < n) {
        return glmrt_error_set(&engine->error, GLMRT_ERR_INVALID_ARGUMENT,
                               "step_complete: the step in flight has %d requests, the outputs hold %d", n, capacity);
    }
    return check_step_outputs(engine, n, out_tokens, out_finish_reasons);
}

glmrt_status glmrt_step_complete(glmrt_engine *engine, int32_t capacity, int64_t *out_tokens,
                                 int32_t *out_finish_reasons, int32_t *out_count)
{
    if (engine == NULL) {
        return GLMRT_ERR_INVALID_ARGUMENT;
    }
    int32_t n = engine->flight.num_requests;
    glmrt_status status = check_complete_call(engine, capacity, out_tokens, out_finish_reasons, out_count);
    if (status == GLMRT_OK) status = complete_step(engine, out_tokens, out_finish_reasons, NULL, NULL);
    if (status == GLMRT_OK) {
        *out_count = n;
    }
    return status;
}

static int32_t collect_unfinished(glmrt_engine *engine, int32_t n)
{
    glmrt_request *const *completed = engine->flight.scratch->flight_requests;
    glmrt_request **next = engine->scratch.relaunch_requests;
    int32_t count = 0;
    for (int32_t i = 0; i < n; ++i) {
        if (!glmrt_request_is_finished(completed[i])) {
            next[count++] = completed[i];
        }
    }
    return count;
}

static void drop_ahead_sequence(glmrt_engine *engine, glmrt_step_scratch *scratch, int32_t s)
{
    release_sequence_pages(engine, scratch, s, scratch->seq_new_pages[s]);
    scratch->seq_new_pages[s] = 0;
    scratch->seq_discard[s] = 1;
}

static void adopt_ahead(glmrt_engine *engine, glmrt_step_flight *ahead)
{
    glmrt_step_scratch *scratch = ahead->scratch;
    int32_t count = 0;
    for (int32_t s = 0; s < ahead->num_seqs; ++s) {
        glmrt_request *request = scratch->seq_requests[s];
        if (glmrt_request_is_finished(request)) {
            drop_ahead_sequence(engine, scratch, s);
            continue;
        }
        scratch->seq_batch_index[s] = count;
        scratch->flight_requests[count++] = request;
    }
    ahead->active = 1;
    ahead->num_requests = count;
    if (count == 0) {
        engine->draining = *ahead;
        return;
    }
    engine->flight = *ahead;
    glmrt_step_mark_in_flight(scratch->flight_requests, count, 1);
}

glmrt_status glmrt_step_complete_relaunch(glmrt_engine *engine, int32_t capacity, int64_t *out_tokens,
                                          int32_t *out_finish_reasons, int32_t *out_count, int32_t *out_relaunched)
{
    if (engine == NULL) {
        return GLMRT_ERR_INVALID_ARGUMENT;
    }
    if (out_relaunched == NULL) {
        return glmrt_error_set(&engine->error, GLMRT_ERR_INVALID_ARGUMENT,
                               "step_complete_relaunch: relaunched output is NULL");
    }
    *out_relaunched = 0;
    int32_t n = engine->flight.num_requests;
    glmrt_status status = check_complete_call(engine, capacity, out_tokens, out_finish_reasons, out_count);
    if (status != GLMRT_OK) {
        return status;
    }
    glmrt_step_flight ahead;
    memset(&ahead, 0, sizeof(ahead));
    int launched_ahead = glmrt_step_ahead_eligible(engine) && glmrt_step_ahead_launch(engine, &ahead) == GLMRT_OK;
    status = complete_step(engine, out_tokens, out_finish_reasons, NULL, launched_ahead ? &ahead : NULL);
    if (status != GLMRT_OK) {
        return status;
    }
    *out_count = n;
    if (launched_ahead) {
        adopt_ahead(engine, &ahead);
        *out_relaunched = engine->flight.active;
        return GLMRT_OK;
    }
    int32_t next = collect_unfinished(engine, n);
    if (next > 0 && launch_step(engine, engine->scratch.relaunch_requests, next, 0, "step_complete_relaunch") ==
                        GLMRT_OK) {
        *out_relaunched = 1;
    }
    return GLMRT_OK;
}

glmrt_status glmrt_run_batch_decode_logits(glmrt_engine *engine, glmrt_request *const *requests, int32_t n,
                                           int64_t *out_tokens, int32_t *out_finish_reasons, float *out_logits)
{
    if (engine == NULL) {
        return GLMRT_ERR_INVALID_ARGUMENT;
    }
    glmrt_status status = check_step_outputs(engine, n, out_tokens, out_finish_reasons);
    if (status == GLMRT_OK) status = launch_step(engine, requests, n, out_logits != NULL, "run_batch_decode");
    if (status != GLMRT_OK) {
        return status;
    }
    return complete_step(engine, out_tokens, out_finish_reasons, out_logits, NULL);
}

glmrt_status glmrt_run_batch_decode(glmrt_engine *engine, glmrt_request *const *requests, int32_t n,
                                    int64_t *out_tokens, int32_t *out_finish_reasons)
{
    return glmrt_run_batch_decode_logits(engine, requests, n, out_tokens, out_finish_reasons, NULL);
}
