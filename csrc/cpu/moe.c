#include "moe.h"

#include <math.h>
#include <string.h>

static int32_t moe_pick_best(const float *values, const uint8_t *taken, int32_t count)
{
    int32_t best = -1;
    for (int32_t i = 0; i < count; ++i) {
        if (taken[i]) {
            continue;
        }
        if (best < 0 || values[i] > values[best]) {
            best = i;
        }
    }
    return best;
}

static float moe_group_score(const float *choice, int32_t group_size)
{
    int32_t first = 0;
    for (int32_t i = 1; i < group_size; ++i) {
        if (choice[i] > choice[first]) {
            first = i;
        }
    }
    if (group_size < 2) {
        return choice[first];
    }
    int32_t second = first == 0 ? 1 : 0;
    for (int32_t i = 0; i < group_size; ++i) {
        if (i != first && choice[i] > choice[second]) {
            second = i;
        }
    }
    return choice[first] + choice[second];
}

static void moe_keep_groups(const glmrt_model_config *config, glmrt_moe_router_scratch *scratch)
{
    int32_t num_groups = config->n_group > 0 ? config->n_group : 1;
    int32_t group_size = config->n_routed_experts / num_groups;
    int32_t keep = config->topk_group > 0 && config->topk_group < num_groups ? config->topk_group : num_groups;
    uint8_t *taken = scratch->group_kept;
    for (int32_t g = 0; g < num_groups; ++g) {
        scratch->group_scores[g] = moe_group_score(scratch->choice + (int64_t)g * group_size, group_size);
        taken[g] = 0;
    }
    for (int32_t round = 0; round < keep; ++round) {
        int32_t best = moe_pick_best(scratch->group_scores, taken, num_groups);
        taken[best] = 1;
    }
    for (int32_t g = 0; g < num_groups; ++g) {
        if (taken[g]) {
            continue;
        }
        for (int32_t i = 0; i < group_size; ++i) {
            scratch->choice[(int64_t)g * group_size + i] = -INFINITY;
        }
    }
}

void glmrt_moe_route_token(const glmrt_model_config *config, const float *logits, const float *correction_bias,
                           glmrt_moe_router_scratch *scratch, int32_t *out_experts, float *out_weights)
{
    int32_t num_experts = config->n_routed_experts;
    int32_t top_k = config->num_experts_per_tok;
    for (int32_t e = 0; e < num_experts; ++e) {
        scratch->scores[e] = 1.0f / (1.0f + expf(-logits[e]));
        scratch->choice[e] = correction_bias != NULL ? scratch->scores[e] + correction_bias[e] : scratch->scores[e];
    }
    moe_keep_groups(config, scratch);
    uint8_t *taken = scratch->expert_taken;
    memset(taken, 0, (size_t)num_experts);
    float sum = 0.0f;
    for (int32_t slot = 0; slot < top_k; ++slot) {
        int32_t best = moe_pick_best(scratch->choice, taken, num_experts);
        taken[best] = 1;
        out_experts[slot] = best;
        out_weights[slot] = scratch->scores[best];
        sum += out_weights[slot];
    }
    float denominator = sum + 1e-20f;
    for (int32_t slot = 0; slot < top_k; ++slot) {
        float weight = config->norm_topk_prob ? out_weights[slot] / denominator : out_weights[slot];
        out_weights[slot] = weight * config->routed_scaling_factor;
    }
}

void glmrt_moe_pairs_group(glmrt_moe_pairs *pairs, int32_t num_tokens, int32_t top_k,
                           const int32_t *route_experts)
{
    memset(pairs->expert_counts, 0, (size_t)pairs->num_experts * sizeof(int32_t));
    int32_t num_pairs = num_tokens * top_k;
    for (int32_t p = 0; p < num_pairs; ++p) {
        pairs->expert_counts[route_experts[p]] += 1;
    }
    int32_t offset = 0;
    for (int32_t e = 0; e < pairs->num_experts; ++e) {
        pairs->expert_offsets[e] = offset;
        offset += pairs->expert_counts[e];
    }
    pairs->expert_offsets[pairs->num_experts] = offset;
    memset(pairs->expert_counts, 0, (size_t)pairs->num_experts * sizeof(int32_t));
    for (int32_t p = 0; p < num_pairs; ++p) {
        int32_t expert = route_experts[p];
        int32_t index = pairs->expert_offsets[expert] + pairs->expert_counts[expert];
        pairs->expert_counts[expert] += 1;
        pairs->pair_token[index] = p / top_k;
        pairs->pair_out_row[index] = p;
    }
}

int32_t glmrt_moe_jobs_gate_up(const glmrt_moe_pairs *pairs, const glmrt_layer_weights *layer, const float *normed,
                               int32_t hidden_size, float *expert_act, int32_t expert_intermediate,
                               glmrt_matmul_job *jobs)
{
    int32_t num_jobs = 0;
    for (int32_t e = 0; e < pairs->num_experts; ++e) {
        if (pairs->expert_counts[e] == 0) {
            continue;
        }
        int32_t first = pairs->expert_offsets[e];
        glmrt_matmul_job *job = &jobs[num_jobs++];
        memset(job, 0, sizeof(*job));
        job->weight = &layer->expert_gate[e];
        job->up_weight = &layer->expert_up[e];
        job->num_rows = pairs->expert_counts[e];
        job->x = normed;
        job->x_stride = hidden_size;
        job->x_row_ids = pairs->pair_token + first;
        job->y = expert_act + (int64_t)first * expert_intermediate;
        job->y_stride = expert_intermediate;
    }
    return num_jobs;
}

int32_t glmrt_moe_jobs_down(const glmrt_moe_pairs *pairs, const glmrt_layer_weights *layer,
                            const float *expert_act, int32_t expert_intermediate, float *expert_out,
                            int32_t hidden_size, glmrt_matmul_job *jobs)
{
    int32_t num_jobs = 0;
    for (int32_t e = 0; e < pairs->num_experts; ++e) {
        if (pairs->expert_counts[e] == 0) {
            continue;
        }
        int32_t first = pairs->expert_offsets[e];
        glmrt_matmul_job *job = &jobs[num_jobs++];
        memset(job, 0, sizeof(*job));
        job->weight = &layer->expert_down[e];
        job->num_rows = pairs->expert_counts[e];
        job->x = expert_act + (int64_t)first * expert_intermediate;
        job->x_stride = expert_intermediate;
        job->y = expert_out;
        job->y_stride = hidden_size;
        job->y_row_ids = pairs->pair_out_row + first;
    }
    return num_jobs;
}

void glmrt_moe_combine_token(const float *expert_out, const float *route_weights, int32_t top_k,
                             const float *shared_out, int32_t hidden_size, float *hidden)
{
    for (int32_t d = 0; d < hidden_size; ++d) {
        float routed = 0.0f;
        for (int32_t slot = 0; slot < top_k; ++slot) {
            routed += expert_out[(int64_t)slot * hidden_size + d] * route_weights[slot];
        }
        float mixed = shared_out != NULL ? routed + shared_out[d] : routed;
        hidden[d] += mixed;
    }
}
