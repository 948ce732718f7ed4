#include <stdint.h>
#include <string.h>

#include "step_plan.h"

static glmrt_status check_batch_members(glmrt_engine *engine, glmrt_request *const *requests, int32_t n)
{
    engine->batch_stamp += 1;
    for (int32_t i = 0; i < n; ++i) {
        glmrt_request *request = requests[i];
        if (request == NULL) {
            return glmrt_error_set(&engine->error, GLMRT_ERR_INVALID_ARGUMENT, "batch entry %d is NULL", i);
        }
        if (!glmrt_live_set_has(&engine->live_requests, request)) {
            return glmrt_error_set(&engine->error, GLMRT_ERR_INVALID_ARGUMENT,
                                   "batch entry %d is not a live request of this engine (freed, or from another engine)",
                                   i);
        }
        if (request->batch_stamp == engine->batch_stamp) {
            return glmrt_error_set(&engine->error, GLMRT_ERR_INVALID_ARGUMENT,
                                   "a request appears twice in the batch (entry %d)", i);
        }
        request->batch_stamp = engine->batch_stamp;
    }
    return GLMRT_OK;
}

glmrt_status glmrt_step_check_batch(glmrt_engine *engine, glmrt_request *const *requests, int32_t n)
{
    if (n < 0 || n > engine->options.max_batch) {
        return glmrt_error_set(&engine->error, GLMRT_ERR_INVALID_ARGUMENT, "batch of %d requests is outside [0, %d]",
                               n, engine->options.max_batch);
    }
    if (n == 0) {
        return GLMRT_OK;
    }
    if (requests == NULL) {
        return glmrt_error_set(&engine->error, GLMRT_ERR_INVALID_ARGUMENT, "batch of %d requests has no request array",
                               n);
    }
    return check_batch_members(engine, requests, n);
}

int32_t glmrt_step_count_prefix_hits(const glmrt_engine *engine, const glmrt_request *request,
                                     int32_t *out_cached_hits)
{
    const glmrt_kv_pages *pages = &engine->kv_pages;
    *out_cached_hits = 0;
    if (!pages->caching || request->num_computed_tokens != 0 || request->num_pages != 0 ||
        glmrt_request_is_finished(request)) {
        return 0;
    }
    int32_t limit = (request->num_tokens - 1) / pages->page_size;
    glmrt_page_id parent = GLMRT_PAGE_NONE;
    int32_t hits = 0;
    while (hits < limit) {
        glmrt_page_id page = glmrt_prefix_cache_lookup(pages, parent, request->tokens + (size_t)hits * pages->page_size);
        if (page == GLMRT_PAGE_NONE) {
            break;
        }
        *out_cached_hits += pages->ref_count[page] == 0;
        parent = page;
        hits += 1;
    }
    return hits;
}

static int32_t pending_of(const glmrt_request *request, int32_t computed)
{
    return request->num_tokens - computed;
}

static int32_t assign_decode_tokens(glmrt_request *const *requests, const int32_t *computed, int32_t n,
                                    int32_t budget, int32_t *chunk)
{
    for (int32_t i = 0; i < n; ++i) {
        chunk[i] = 0;
        if (!glmrt_request_is_finished(requests[i]) && pending_of(requests[i], computed[i]) == 1 && budget > 0) {
            chunk[i] = 1;
            budget -= 1;
        }
    }
    return budget;
}

static void assign_prefill_tokens(glmrt_request *const *requests, const int32_t *computed, int32_t n,
                                  int32_t budget, int32_t *chunk)
{
    for (int32_t i = 0; i < n && budget > 0; ++i) {
        int32_t pending = pending_of(requests[i], computed[i]);
        if (glmrt_request_is_finished(requests[i]) || pending <= 1) {
            continue;
        }
        chunk[i] = pending < budget ? pending : budget;
        budget -= chunk[i];
    }
}

static void plan_prefix_hits(glmrt_engine *engine, glmrt_request *const *requests, int32_t n, int32_t *hits,
                             int32_t *cached_hits)
{
    int32_t *computed = engine->scratch.request_computed;
    for (int32_t i = 0; i < n; ++i) {
        hits[i] = glmrt_step_count_prefix_hits(engine, requests[i], &cached_hits[i]);
        computed[i] = requests[i]->num_computed_tokens + hits[i] * engine->kv_pages.page_size;
    }
}

glmrt_status glmrt_step_plan_sequences(glmrt_engine *engine, glmrt_request *const *requests, int32_t n,
                                       glmrt_step_plan *out_plan)
{
    glmrt_step_scratch *scratch = &engine->scratch;
    int32_t *chunk = scratch->seq_num_tokens;
    int32_t *hits = scratch->seq_hit_pages;
    int32_t *cached_hits = scratch->seq_new_pages;
    memset(out_plan, 0, sizeof(*out_plan));
    out_plan->num_requests = n;
    out_plan->num_free_pages = glmrt_kv_pages_available(&engine->kv_pages);
    if (n == 0) {
        return GLMRT_OK;
    }
    plan_prefix_hits(engine, requests, n, hits, cached_hits);
    const int32_t *computed = scratch->request_computed;
    int32_t budget = assign_decode_tokens(requests, computed, n, engine->options.max_tokens_per_step, chunk);
    assign_prefill_tokens(requests, computed, n, budget, chunk);
    int32_t num_seqs = 0;
    int64_t new_pages = 0;
    int32_t num_tokens = 0;
    for (int32_t i = 0; i < n; ++i) {
        if (chunk[i] == 0) {
            continue;
        }
        glmrt_request *request = requests[i];
        int32_t count = chunk[i];
        int32_t held = request->num_pages + hits[i];
        int32_t needed = glmrt_kv_pages_for_tokens(&engine->kv_pages, (int64_t)computed[i] + count);
        int32_t fresh = needed > held ? needed - held : 0;
        if (held + fresh > request->page_table_capacity) {
            return glmrt_error_set(&engine->error, GLMRT_ERR_INVARIANT,
                                   "request %lld needs %d pages, its page table holds %d", (long long)request->id,
                                   held + fresh, request->page_table_capacity);
        }
        new_pages += fresh + cached_hits[i];
        scratch->seq_num_tokens[num_seqs] = count;
        scratch->seq_batch_index[num_seqs] = i;
        scratch->seq_requests[num_seqs] = request;
        scratch->seq_hit_pages[num_seqs] = hits[i];
        scratch->seq_new_pages[num_seqs] = fresh;
        scratch->seq_discard[num_seqs] = 0;
        num_tokens += count;
        num_seqs += 1;
    }
    out_plan->num_scheduled_requests = num_seqs;
    out_plan->num_scheduled_tokens = num_tokens;
    out_plan->num_new_pages = (int32_t)new_pages;
    return GLMRT_OK;
}

glmrt_status glmrt_engine_plan_step(glmrt_engine *engine, glmrt_request *const *requests, int32_t n,
                                    int32_t *out_num_scheduled_tokens, glmrt_step_plan *out_plan)
{
    if (engine == NULL) {
        return GLMRT_ERR_INVALID_ARGUMENT;
    }
    if (out_plan == NULL) {
        return glmrt_error_set(&engine->error, GLMRT_ERR_INVALID_ARGUMENT, "plan output is NULL");
    }
    glmrt_status status = glmrt_engine_require_no_flight(engine, "engine_plan_step");
    if (status == GLMRT_OK) status = glmrt_step_check_batch(engine, requests, n);
    if (status == GLMRT_OK) status = glmrt_step_plan_sequences(engine, requests, n, out_plan);
    if (status != GLMRT_OK || out_num_scheduled_tokens == NULL) {
        return status;
    }
    for (int32_t i = 0; i < n; ++i) {
        out_num_scheduled_tokens[i] = 0;
    }
    for (int32_t s = 0; s < out_plan->num_scheduled_requests; ++s) {
        out_num_scheduled_tokens[engine->scratch.seq_batch_index[s]] = engine->scratch.seq_num_tokens[s];
    }
    return GLMRT_OK;
}
