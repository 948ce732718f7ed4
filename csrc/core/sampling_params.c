#include "sampling.h"

#include <math.h>
#include <stddef.h>
#include <string.h>

void glmrt_sampling_params_default(glmrt_sampling_params *params)
{
    if (params == NULL) {
        return;
    }
    memset(params, 0, sizeof(*params));
    params->temperature = 1.0f;
    params->top_p = 1.0f;
    params->min_p = 0.0f;
    params->repetition_penalty = 1.0f;
    params->frequency_penalty = 0.0f;
    params->presence_penalty = 0.0f;
    params->top_k = 0;
    params->max_new_tokens = 16;
    params->seed = 0;
    params->ignore_eos = 0;
    params->num_stop_token_ids = 0;
    params->stop_token_ids = NULL;
}

static glmrt_status validate_filters(const glmrt_sampling_params *p, glmrt_error *error)
{
    if (!isfinite(p->temperature) || p->temperature < 0.0f) {
        return glmrt_error_set(error, GLMRT_ERR_INVALID_ARGUMENT, "temperature must be finite and >= 0, got %g",
                               (double)p->temperature);
    }
    if (!(p->top_p > 0.0f && p->top_p <= 1.0f)) {
        return glmrt_error_set(error, GLMRT_ERR_INVALID_ARGUMENT, "top_p must be in (0, 1], got %g",
                               (double)p->top_p);
    }
    if (p->top_k < 0) {
        return glmrt_error_set(error, GLMRT_ERR_INVALID_ARGUMENT, "top_k must be >= 0 (0 disables it), got %d",
                               p->top_k);
    }
    if (!(p->min_p >= 0.0f && p->min_p <= 1.0f)) {
        return glmrt_error_set(error, GLMRT_ERR_INVALID_ARGUMENT, "min_p must be in [0, 1], got %g",
                               (double)p->min_p);
    }
    return GLMRT_OK;
}

static glmrt_status validate_penalties(const glmrt_sampling_params *p, glmrt_error *error)
{
    if (!isfinite(p->repetition_penalty) || p->repetition_penalty <= 0.0f) {
        return glmrt_error_set(error, GLMRT_ERR_INVALID_ARGUMENT,
                               "repetition_penalty must be finite and > 0, got %g", (double)p->repetition_penalty);
    }
    if (!isfinite(p->frequency_penalty)) {
        return glmrt_error_set(error, GLMRT_ERR_INVALID_ARGUMENT, "frequency_penalty must be finite, got %g",
                               (double)p->frequency_penalty);
    }
    if (!isfinite(p->presence_penalty)) {
        return glmrt_error_set(error, GLMRT_ERR_INVALID_ARGUMENT, "presence_penalty must be finite, got %g",
                               (double)p->presence_penalty);
    }
    return GLMRT_OK;
}

static glmrt_status validate_stop_tokens(const glmrt_sampling_params *p, int32_t vocab_size, glmrt_error *error)
{
    if (p->num_stop_token_ids < 0 || p->num_stop_token_ids > GLMRT_MAX_STOP_TOKEN_IDS) {
        return glmrt_error_set(error, GLMRT_ERR_INVALID_ARGUMENT, "num_stop_token_ids must be in [0, %d], got %d",
                               GLMRT_MAX_STOP_TOKEN_IDS, p->num_stop_token_ids);
    }
    if (p->num_stop_token_ids > 0 && p->stop_token_ids == NULL) {
        return glmrt_error_set(error, GLMRT_ERR_INVALID_ARGUMENT, "%d stop token ids given with a NULL array",
                               p->num_stop_token_ids);
    }
    for (int32_t i = 0; i < p->num_stop_token_ids; ++i) {
        if (p->stop_token_ids[i] < 0 || p->stop_token_ids[i] >= vocab_size) {
            return glmrt_error_set(error, GLMRT_ERR_INVALID_ARGUMENT,
                                   "stop token id %d is outside the vocabulary of %d", p->stop_token_ids[i],
                                   vocab_size);
        }
    }
    return GLMRT_OK;
}

glmrt_status glmrt_sampling_params_validate(const glmrt_sampling_params *params, int32_t vocab_size,
                                            glmrt_error *error)
{
    if (params == NULL) {
        return glmrt_error_set(error, GLMRT_ERR_INVALID_ARGUMENT, "sampling params are NULL");
    }
    if (vocab_size < 1) {
        return glmrt_error_set(error, GLMRT_ERR_INVALID_ARGUMENT, "vocabulary size must be >= 1, got %d",
                               vocab_size);
    }
    glmrt_status status = validate_filters(params, error);
    if (status == GLMRT_OK) status = validate_penalties(params, error);
    if (status == GLMRT_OK) status = validate_stop_tokens(params, vocab_size, error);
    if (status == GLMRT_OK && params->max_new_tokens < 1) {
        status = glmrt_error_set(error, GLMRT_ERR_INVALID_ARGUMENT, "max_new_tokens must be >= 1, got %d",
                                 params->max_new_tokens);
    }
    return status;
}

int glmrt_sampling_params_use_history(const glmrt_sampling_params *params)
{
    return params->repetition_penalty != 1.0f || params->frequency_penalty != 0.0f ||
           params->presence_penalty != 0.0f;
}
