#ifndef GLMRT_ENGINE_H
#define GLMRT_ENGINE_H

#include "backend.h"
#include "kv_pages.h"
#include "live_set.h"
#include "model_config.h"
#include "step_clock.h"

typedef struct glmrt_step_scratch {
    glmrt_request **flight_requests;
    glmrt_request **relaunch_requests;
    glmrt_token *token_ids;
    glmrt_pos *positions;
    int32_t *token_seq;
    glmrt_request **seq_requests;
    int32_t *seq_batch_index;
    int32_t *seq_token_start;
    int32_t *seq_num_tokens;
    int32_t *seq_context_len;
    const glmrt_page_id **seq_page_tables;
    int32_t *seq_new_pages;
    int32_t *seq_num_pages;
    int32_t *seq_hit_pages;
    int32_t *request_computed;
    glmrt_step_sample *samples;
    int32_t *sample_seq;
    int32_t *sample_token_index;
    int32_t *token_feed;
    int32_t *seq_discard;
    glmrt_token *sampled;
    float *logits;
    int64_t step_prefix_queries;
    int64_t step_prefix_hits;
} glmrt_step_scratch;

typedef struct glmrt_step_flight {
    int32_t active;
    int32_t num_requests;
    int32_t num_seqs;
    glmrt_step_scratch *scratch;
    glmrt_step_batch batch;
} glmrt_step_flight;

struct glmrt_engine {
    glmrt_model_config config;
    glmrt_engine_options options;
    glmrt_error error;
    int32_t has_checkpoint;
    glmrt_checkpoint checkpoint;
    glmrt_weights weights;
    glmrt_kv_pages kv_pages;
    int32_t max_context;
    int32_t max_sequence_tokens;
    glmrt_live_set live_requests;
    int64_t batch_stamp;
    int64_t next_request_id;
    int64_t tokens_processed;
    int64_t tokens_generated;
    int64_t steps;
    int64_t prefix_cache_queries;
    int64_t prefix_cache_hits;
    int64_t device_forward_ns;
    int64_t rows_owned_steps;
    int64_t steps_launched_ahead;
    glmrt_step_gaps step_gaps;
    glmrt_step_scratch scratch;
    glmrt_step_scratch ahead_scratch;
    glmrt_step_flight flight;
    glmrt_step_flight draining;
    const glmrt_backend_ops *backend_ops;
    void *backend_state;
    glmrt_engine_info info;
};

void glmrt_step_abandon(glmrt_engine *engine);
int glmrt_step_launch_ahead_possible(const glmrt_engine *engine);

static inline glmrt_status glmrt_engine_require_no_flight(glmrt_engine *engine, const char *action)
{
    if (!engine->flight.active) {
        return GLMRT_OK;
    }
    return glmrt_error_set(&engine->error, GLMRT_ERR_INVALID_ARGUMENT,
                           "%s: a step is in flight; complete it with glmrt_step_complete first", action);
}

#endif
