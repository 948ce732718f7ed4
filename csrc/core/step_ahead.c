#include <string.h>

#include "sampling.h"
#include "step_ahead.h"

int glmrt_step_launch_ahead_possible(const glmrt_engine *engine)
{
    const glmrt_backend_ops *ops = engine->backend_ops;
    if (ops == NULL || engine->options.launch_ahead == GLMRT_LAUNCH_AHEAD_OFF) {
        return 0;
    }
    if (!ops->launch_is_asynchronous) {
        return engine->options.launch_ahead == GLMRT_LAUNCH_AHEAD_ALWAYS;
    }
    return ops->feeds_sampled_tokens != NULL && engine->backend_state != NULL &&
           ops->feeds_sampled_tokens(engine->backend_state);
}

static int continues_after_one_token(const glmrt_request *request)
{
    return glmrt_request_num_generated(request) + 1 < request->params.max_new_tokens &&
           request->num_tokens + 1 < request->max_tokens;
}

static int kept_sample(const glmrt_step_flight *flight, int32_t k)
{
    return !flight->scratch->seq_discard[flight->batch.sample_seq[k]];
}

int glmrt_step_ahead_eligible(const glmrt_engine *engine)
{
    const glmrt_step_flight *flight = &engine->flight;
    if (!engine->info.launch_ahead || !flight->active || flight->num_requests == 0 ||
        flight->batch.num_samples != flight->num_seqs) {
        return 0;
    }
    int32_t kept = 0;
    int continuing = 0;
    for (int32_t k = 0; k < flight->batch.num_samples; ++k) {
        if (!kept_sample(flight, k)) {
            continue;
        }
        const glmrt_request *request = flight->scratch->seq_requests[flight->batch.sample_seq[k]];
        if (glmrt_sampling_params_use_history(&request->params)) {
            return 0;
        }
        kept += 1;
        continuing += continues_after_one_token(request);
    }
    return kept == flight->num_requests && continuing > 0;
}

static glmrt_step_scratch *other_scratch(glmrt_engine *engine, const glmrt_step_scratch *used)
{
    return used == &engine->scratch ? &engine->ahead_scratch : &engine->scratch;
}

static int32_t choose_sequences(glmrt_engine *engine, const glmrt_step_flight *flight, glmrt_step_scratch *to,
                                int32_t *out_pages)
{
    const glmrt_step_scratch *from = flight->scratch;
    int32_t n = 0;
    int32_t pages = 0;
    for (int32_t k = 0; k < flight->batch.num_samples; ++k) {
        if (!kept_sample(flight, k)) {
            continue;
        }
        glmrt_request *request = from->seq_requests[flight->batch.sample_seq[k]];
        if (!continues_after_one_token(request)) {
            continue;
        }
        int32_t needed = glmrt_kv_pages_for_tokens(&engine->kv_pages, (int64_t)request->num_tokens + 1);
        int32_t fresh = needed > request->num_pages ? needed - request->num_pages : 0;
        if (request->num_pages + fresh > request->page_table_capacity) {
            return -1;
        }
        to->seq_requests[n] = request;
        to->seq_new_pages[n] = fresh;
        to->seq_hit_pages[n] = 0;
        to->seq_discard[n] = 0;
        to->token_feed[n] = k;
        pages += fresh;
        n += 1;
    }
    *out_pages = pages;
    return n;
}

static void fill_sequence(glmrt_step_scratch *to, const glmrt_step_scratch *from, int32_t s, int feed_on_device)
{
    glmrt_request *request = to->seq_requests[s];
    int32_t source = to->token_feed[s];
    to->token_ids[s] = feed_on_device ? 0 : from->sampled[source];
    to->positions[s] = request->num_tokens;
    to->token_seq[s] = s;
    to->seq_token_start[s] = s;
    to->seq_num_tokens[s] = 1;
    to->seq_context_len[s] = request->num_tokens + 1;
    to->seq_page_tables[s] = request->page_table;
    to->seq_num_pages[s] = request->num_pages;
    glmrt_step_sample *sample = &to->samples[s];
    sample->params = &request->params;
    sample->history = request->tokens;
    sample->num_prompt_tokens = request->num_prompt_tokens;
    sample->num_history = request->num_tokens + 1;
    to->sample_seq[s] = s;
    to->sample_token_index[s] = s;
}

glmrt_status glmrt_step_ahead_launch(glmrt_engine *engine, glmrt_step_flight *out)
{
    const glmrt_step_flight *flight = &engine->flight;
    glmrt_step_scratch *to = other_scratch(engine, flight->scratch);
    int32_t pages = 0;
    int32_t n = choose_sequences(engine, flight, to, &pages);
    if (n <= 0) {
        return GLMRT_ERR_INVARIANT;
    }
    if (pages > glmrt_kv_pages_available(&engine->kv_pages)) {
        return GLMRT_ERR_OUT_OF_PAGES;
    }
    glmrt_status status = glmrt_step_take_fresh_pages(engine, to, n);
    if (status != GLMRT_OK) {
        return status;
    }
    int feed_on_device = engine->backend_ops->launch_is_asynchronous;
    for (int32_t s = 0; s < n; ++s) {
        fill_sequence(to, flight->scratch, s, feed_on_device);
    }
    to->step_prefix_queries = 0;
    to->step_prefix_hits = 0;
    memset(out, 0, sizeof(*out));
    glmrt_step_batch_point(&out->batch, to, n, n, n);
    out->batch.token_feed = feed_on_device ? to->token_feed : NULL;
    status = engine->backend_ops->launch(engine->backend_state, &out->batch, NULL, to->sampled);
    if (status != GLMRT_OK) {
        glmrt_step_release_pages(engine, to, n, n);
        return status;
    }
    out->num_seqs = n;
    out->scratch = to;
    engine->steps_launched_ahead += 1;
    engine->step_gaps.count += 1;
    engine->step_gaps.completed_at_ns = 0;
    return GLMRT_OK;
}
