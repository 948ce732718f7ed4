#include "sampling.h"
#include "sampling_order.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define GLMRT_COUNT_REPETITION_DONE (1 << 30)
#define GLMRT_COUNT_ADDITIVE_DONE (1 << 29)
#define GLMRT_COUNT_MASK (GLMRT_COUNT_ADDITIVE_DONE - 1)
#define GLMRT_GOLDEN_GAMMA 0x9E3779B97F4A7C15ull

glmrt_status glmrt_sampler_scratch_init(glmrt_sampler_scratch *scratch, int32_t vocab_size, glmrt_error *error)
{
    if (scratch == NULL) {
        return glmrt_error_set(error, GLMRT_ERR_INVALID_ARGUMENT, "sampler scratch is NULL");
    }
    memset(scratch, 0, sizeof(*scratch));
    if (vocab_size < 1) {
        return glmrt_error_set(error, GLMRT_ERR_INVALID_ARGUMENT, "sampler vocabulary must be >= 1, got %d",
                               vocab_size);
    }
    size_t count = (size_t)vocab_size;
    scratch->values = malloc(count * sizeof(*scratch->values));
    scratch->indices = malloc(count * sizeof(*scratch->indices));
    scratch->counts = calloc(count, sizeof(*scratch->counts));
    scratch->weights = malloc(count * sizeof(*scratch->weights));
    if (scratch->values == NULL || scratch->indices == NULL || scratch->counts == NULL || scratch->weights == NULL) {
        glmrt_sampler_scratch_free(scratch);
        return glmrt_error_set(error, GLMRT_ERR_OUT_OF_MEMORY, "cannot allocate sampler scratch for %d tokens",
                               vocab_size);
    }
    scratch->vocab_size = vocab_size;
    return GLMRT_OK;
}

void glmrt_sampler_scratch_free(glmrt_sampler_scratch *scratch)
{
    if (scratch == NULL) {
        return;
    }
    free(scratch->values);
    free(scratch->indices);
    free(scratch->counts);
    free(scratch->weights);
    memset(scratch, 0, sizeof(*scratch));
}

static uint64_t splitmix64_finalize(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

double glmrt_sampling_uniform(uint64_t seed, int64_t draw_index)
{
    uint64_t stream = splitmix64_finalize(seed + GLMRT_GOLDEN_GAMMA);
    uint64_t z = splitmix64_finalize(stream + GLMRT_GOLDEN_GAMMA * ((uint64_t)draw_index + 1u));
    return (double)(z >> 11) * 0x1.0p-53;
}

static int token_in_vocab(glmrt_token token, int32_t vocab_size)
{
    return token >= 0 && token < vocab_size;
}

static void apply_repetition(float *values, int32_t vocab_size, float penalty, const glmrt_token *history,
                             int32_t num_history, int32_t *counts)
{
    for (int32_t i = 0; i < num_history; ++i) {
        glmrt_token token = history[i];
        if (!token_in_vocab(token, vocab_size) || (counts[token] & GLMRT_COUNT_REPETITION_DONE)) {
            continue;
        }
        counts[token] |= GLMRT_COUNT_REPETITION_DONE;
        values[token] = values[token] > 0.0f ? values[token] / penalty : values[token] * penalty;
    }
}

static void apply_frequency_presence(float *values, int32_t vocab_size, const glmrt_sampling_params *params,
                                     const glmrt_token *output, int32_t num_output, int32_t *counts)
{
    for (int32_t i = 0; i < num_output; ++i) {
        glmrt_token token = output[i];
        if (!token_in_vocab(token, vocab_size) || (counts[token] & GLMRT_COUNT_ADDITIVE_DONE)) {
            continue;
        }
        int32_t count = counts[token] & GLMRT_COUNT_MASK;
        counts[token] |= GLMRT_COUNT_ADDITIVE_DONE;
        values[token] -= params->frequency_penalty * (float)count + params->presence_penalty;
    }
}

static void apply_penalties(float *values, int32_t vocab_size, const glmrt_sampling_params *params,
                            const glmrt_token *history, int32_t num_prompt_tokens, int32_t num_history,
                            int32_t *counts)
{
    int repetition = params->repetition_penalty != 1.0f;
    int additive = params->frequency_penalty != 0.0f || params->presence_penalty != 0.0f;
    if ((!repetition && !additive) || history == NULL || num_history <= 0) {
        return;
    }
    const glmrt_token *output = history + num_prompt_tokens;
    int32_t num_output = num_history - num_prompt_tokens;
    for (int32_t i = 0; i < num_output; ++i) {
        if (token_in_vocab(output[i], vocab_size) && (counts[output[i]] & GLMRT_COUNT_MASK) < GLMRT_COUNT_MASK) {
            counts[output[i]] += 1;
        }
    }
    if (repetition) {
        apply_repetition(values, vocab_size, params->repetition_penalty, history, num_history, counts);
    }
    if (additive) {
        apply_frequency_presence(values, vocab_size, params, output, num_output, counts);
    }
    for (int32_t i = 0; i < num_history; ++i) {
        if (token_in_vocab(history[i], vocab_size)) {
            counts[history[i]] = 0;
        }
    }
}

static glmrt_token argmax_token(const float *values, int32_t vocab_size)
{
    glmrt_token best = -1;
    for (int32_t token = 0; token < vocab_size; ++token) {
        if (isnan(values[token])) {
            continue;
        }
        if (best < 0 || values[token] > values[best]) {
            best = token;
        }
    }
    return best < 0 ? 0 : best;
}

static int32_t gather_candidates(float *values, int32_t vocab_size, float temperature, int32_t *indices)
{
    int32_t count = 0;
    for (int32_t token = 0; token < vocab_size; ++token) {
        float scaled = values[token] / temperature;
        if (isnan(scaled) || scaled == -INFINITY) {
            values[token] = -INFINITY;
            continue;
        }
        values[token] = scaled == INFINITY ? FLT_MAX : scaled;
        indices[count++] = token;
    }
    return count;
}

static double compute_weights(const glmrt_candidates *set, double *weights)
{
    double max_value = (double)set->values[glmrt_candidates_best(set)];
    double total = 0.0;
    for (int32_t i = 0; i < set->count; ++i) {
        int32_t token = set->indices[i];
        weights[token] = exp((double)set->values[token] - max_value);
        total += weights[token];
    }
    return total;
}

static double sum_weights(const glmrt_candidates *set, const double *weights)
{
    double total = 0.0;
    for (int32_t i = 0; i < set->count; ++i) {
        total += weights[set->indices[i]];
    }
    return total;
}

static void apply_top_p(glmrt_candidates *set, const double *weights, double total, float top_p)
{
    double cumulative = 0.0;
    for (int32_t position = 0; position < set->count; ++position) {
        cumulative += weights[glmrt_candidates_at(set, position)] / total;
        if (cumulative >= (double)top_p) {
            glmrt_candidates_truncate(set, position + 1);
            return;
        }
    }
}

static glmrt_token prepare_candidates(const float *logits, int32_t vocab_size, const glmrt_sampling_params *params,
                                      const glmrt_token *history, int32_t num_prompt_tokens, int32_t num_history,
                                      glmrt_sampler_scratch *scratch, glmrt_candidates *set, double *out_total)
{
    float *values = scratch->values;
    memcpy(values, logits, (size_t)vocab_size * sizeof(*values));
    apply_penalties(values, vocab_size, params, history, num_prompt_tokens, num_history, scratch->counts);
    if (params->temperature == 0.0f) {
        return argmax_token(values, vocab_size);
    }
    set->values = values;
    set->indices = scratch->indices;
    set->num_sorted = 0;
    set->count = gather_candidates(values, vocab_size, params->temperature, scratch->indices);
    if (set->count == 0) {
        return argmax_token(values, vocab_size);
    }
    glmrt_candidates_select_best(set, params->top_k);
    double total = compute_weights(set, scratch->weights);
    if (params->top_p < 1.0f) {
        apply_top_p(set, scratch->weights, total, params->top_p);
        total = sum_weights(set, scratch->weights);
    }
    if (params->min_p > 0.0f) {
        double max_weight = scratch->weights[glmrt_candidates_best(set)];
        glmrt_candidates_drop_below(set, scratch->weights, (double)params->min_p * max_weight);
        total = sum_weights(set, scratch->weights);
    }
    *out_total = total;
    return -1;
}

static glmrt_token draw_candidate(glmrt_candidates *set, const double *weights, double total, double uniform)
{
    double target = uniform * total;
    double cumulative = 0.0;
    glmrt_token token = -1;
    for (int32_t position = 0; position < set->count; ++position) {
        token = glmrt_candidates_at(set, position);
        cumulative += weights[token];
        if (cumulative > target) {
            return token;
        }
    }
    return token;
}

static int sample_inputs_usable(const float *logits, int32_t vocab_size, const glmrt_sampling_params *params,
                                const glmrt_token *history, int32_t num_prompt_tokens, int32_t num_history,
                                const glmrt_sampler_scratch *scratch)
{
    return logits != NULL && params != NULL && scratch != NULL && vocab_size >= 1 &&
           scratch->vocab_size >= vocab_size && scratch->values != NULL && num_history >= 0 &&
           num_prompt_tokens >= 0 && num_prompt_tokens <= num_history && (history != NULL || num_history == 0);
}

glmrt_token glmrt_sample_row(const float *logits, int32_t vocab_size, const glmrt_sampling_params *params,
                             const glmrt_token *history, int32_t num_prompt_tokens, int32_t num_history,
                             glmrt_sampler_scratch *scratch)
{
    if (!sample_inputs_usable(logits, vocab_size, params, history, num_prompt_tokens, num_history, scratch)) {
        return -1;
    }
    glmrt_candidates set;
    double total = 0.0;
    glmrt_token fixed = prepare_candidates(logits, vocab_size, params, history, num_prompt_tokens, num_history,
                                           scratch, &set, &total);
    if (fixed >= 0) {
        return fixed;
    }
    double uniform = glmrt_sampling_uniform(params->seed, (int64_t)num_history - num_prompt_tokens);
    return draw_candidate(&set, scratch->weights, total, uniform);
}

glmrt_status glmrt_sampler_distribution(const float *logits, int32_t vocab_size,
                                        const glmrt_sampling_params *params, const glmrt_token *history,
                                        int32_t num_prompt_tokens, int32_t num_history,
                                        glmrt_sampler_scratch *scratch, float *out_probs)
{
    if (!sample_inputs_usable(logits, vocab_size, params, history, num_prompt_tokens, num_history, scratch) ||
        out_probs == NULL) {
        return GLMRT_ERR_INVALID_ARGUMENT;
    }
    glmrt_candidates set;
    double total = 0.0;
    glmrt_token fixed = prepare_candidates(logits, vocab_size, params, history, num_prompt_tokens, num_history,
                                           scratch, &set, &total);
    memset(out_probs, 0, (size_t)vocab_size * sizeof(*out_probs));
    if (fixed >= 0) {
        out_probs[fixed] = 1.0f;
        return GLMRT_OK;
    }
    for (int32_t i = 0; i < set.count; ++i) {
        int32_t token = set.indices[i];
        out_probs[token] = (float)(scratch->weights[token] / total);
    }
    return GLMRT_OK;
}
