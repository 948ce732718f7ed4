#include "sampling.h"

#include <stddef.h>

#define GLMRT_SAMPLING_MAX_HISTORY ((1 << 29) - 1)

static glmrt_status validate_public_inputs(const float *logits, int32_t vocab_size,
                                           const glmrt_sampling_params *params, const glmrt_token *history,
                                           int32_t num_prompt_tokens, int32_t num_history, const void *output)
{
    if (logits == NULL || output == NULL || vocab_size < 1) {
        return GLMRT_ERR_INVALID_ARGUMENT;
    }
    if (num_history < 0 || num_history > GLMRT_SAMPLING_MAX_HISTORY || num_prompt_tokens < 0 ||
        num_prompt_tokens > num_history || (num_history > 0 && history == NULL)) {
        return GLMRT_ERR_INVALID_ARGUMENT;
    }
    for (int32_t i = 0; i < num_history; ++i) {
        if (history[i] < 0 || history[i] >= vocab_size) {
            return GLMRT_ERR_INVALID_ARGUMENT;
        }
    }
    if (params != NULL && glmrt_sampling_params_validate(params, vocab_size, NULL) != GLMRT_OK) {
        return GLMRT_ERR_INVALID_ARGUMENT;
    }
    return GLMRT_OK;
}

static const glmrt_sampling_params *params_or_default(const glmrt_sampling_params *params,
                                                      glmrt_sampling_params *fallback)
{
    if (params != NULL) {
        return params;
    }
    glmrt_sampling_params_default(fallback);
    return fallback;
}

glmrt_status glmrt_sample_logits(const float *logits, int32_t vocab_size, const glmrt_sampling_params *params,
                                 const glmrt_token *history, int32_t num_prompt_tokens, int32_t num_history,
                                 glmrt_token *out_token)
{
    glmrt_status status = validate_public_inputs(logits, vocab_size, params, history, num_prompt_tokens,
                                                 num_history, out_token);
    if (status != GLMRT_OK) {
        return status;
    }
    glmrt_sampling_params fallback;
    glmrt_sampler_scratch scratch;
    status = glmrt_sampler_scratch_init(&scratch, vocab_size, NULL);
    if (status != GLMRT_OK) {
        return status;
    }
    glmrt_token token = glmrt_sample_row(logits, vocab_size, params_or_default(params, &fallback), history,
                                         num_prompt_tokens, num_history, &scratch);
    glmrt_sampler_scratch_free(&scratch);
    if (token < 0) {
        return GLMRT_ERR_INVARIANT;
    }
    *out_token = token;
    return GLMRT_OK;
}

glmrt_status glmrt_sampling_probabilities(const float *logits, int32_t vocab_size,
                                          const glmrt_sampling_params *params, const glmrt_token *history,
                                          int32_t num_prompt_tokens, int32_t num_history, float *out_probs)
{
    glmrt_status status = validate_public_inputs(logits, vocab_size, params, history, num_prompt_tokens,
                                                 num_history, out_probs);
    if (status != GLMRT_OK) {
        return status;
    }
    glmrt_sampling_params fallback;
    glmrt_sampler_scratch scratch;
    status = glmrt_sampler_scratch_init(&scratch, vocab_size, NULL);
    if (status != GLMRT_OK) {
        return status;
    }
    status = glmrt_sampler_distribution(logits, vocab_size, params_or_default(params, &fallback), history,
                                        num_prompt_tokens, num_history, &scratch, out_probs);
    glmrt_sampler_scratch_free(&scratch);
    return status;
}
