#ifndef GLMRT_BACKEND_H
#define GLMRT_BACKEND_H

#include "request.h"
#include "weights.h"

typedef struct glmrt_step_sample {
    const glmrt_sampling_params *params;
    const glmrt_token *history;
    int32_t num_prompt_tokens;
    int32_t num_history;
} glmrt_step_sample;

static inline int64_t glmrt_step_sample_draw_index(const glmrt_step_sample *sample)
{
    return (int64_t)sample->num_history - sample->num_prompt_tokens;
}

typedef struct glmrt_step_batch {
    int32_t num_tokens;
    const glmrt_token *token_ids;
    const glmrt_pos *positions;
    const int32_t *token_seq;
    int32_t num_seqs;
    const int32_t *seq_token_start;
    const int32_t *seq_num_tokens;
    const int32_t *seq_context_len;
    const glmrt_page_id *const *seq_page_tables;
    const int32_t *seq_num_pages;
    int32_t num_samples;
    const int32_t *sample_seq;
    const int32_t *sample_token_index;
    const glmrt_step_sample *samples;
    const int32_t *token_feed;
} glmrt_step_batch;

typedef struct glmrt_step_report {
    int64_t device_ns;
    int32_t rows_owned;
} glmrt_step_report;

typedef struct glmrt_backend_ops {
    const char *name;
    glmrt_status (*create)(glmrt_engine *engine, void **out_state);
    void (*destroy)(void *state);
    glmrt_status (*launch)(void *state, const glmrt_step_batch *batch, float *out_logits,
                           glmrt_token *out_sampled);
    glmrt_status (*complete)(void *state, glmrt_step_report *out_report);
    int32_t (*feeds_sampled_tokens)(void *state);
    int32_t launch_is_asynchronous;
} glmrt_backend_ops;

extern const glmrt_backend_ops glmrt_cpu_backend_ops;
const glmrt_backend_ops *glmrt_backend_find(int32_t backend_kind);

#endif
