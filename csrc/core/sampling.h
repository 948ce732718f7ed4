#ifndef GLMRT_SAMPLING_H
#define GLMRT_SAMPLING_H

#include "error.h"

typedef struct glmrt_sampler_scratch {
    int32_t vocab_size;
    float *values;
    int32_t *indices;
    int32_t *counts;
    double *weights;
} glmrt_sampler_scratch;

glmrt_status glmrt_sampler_scratch_init(glmrt_sampler_scratch *scratch, int32_t vocab_size, glmrt_error *error);
void glmrt_sampler_scratch_free(glmrt_sampler_scratch *scratch);

glmrt_status glmrt_sampling_params_validate(const glmrt_sampling_params *params, int32_t vocab_size,
                                            glmrt_error *error);
int glmrt_sampling_params_use_history(const glmrt_sampling_params *params);
double glmrt_sampling_uniform(uint64_t seed, int64_t draw_index);
glmrt_token glmrt_sample_row(const float *logits, int32_t vocab_size, const glmrt_sampling_params *params,
                             const glmrt_token *history, int32_t num_prompt_tokens, int32_t num_history,
                             glmrt_sampler_scratch *scratch);
glmrt_status glmrt_sampler_distribution(const float *logits, int32_t vocab_size,
                                        const glmrt_sampling_params *params, const glmrt_token *history,
                                        int32_t num_prompt_tokens, int32_t num_history,
                                        glmrt_sampler_scratch *scratch, float *out_probs);

#endif
