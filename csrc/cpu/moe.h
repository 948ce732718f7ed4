#ifndef GLMRT_CPU_MOE_H
#define GLMRT_CPU_MOE_H

#include "linear.h"

typedef struct glmrt_moe_router_scratch {
    float *scores;
    float *choice;
    float *group_scores;
    uint8_t *group_kept;
    uint8_t *expert_taken;
} glmrt_moe_router_scratch;

typedef struct glmrt_moe_pairs {
    int32_t num_experts;
    int32_t *expert_counts;
    int32_t *expert_offsets;
    int32_t *pair_token;
    int32_t *pair_out_row;
} glmrt_moe_pairs;

void glmrt_moe_route_token(const glmrt_model_config *config, const float *logits, const float *correction_bias,
                           glmrt_moe_router_scratch *scratch, int32_t *out_experts, float *out_weights);
void glmrt_moe_pairs_group(glmrt_moe_pairs *pairs, int32_t num_tokens, int32_t top_k,
                           const int32_t *route_experts);
int32_t glmrt_moe_jobs_gate_up(const glmrt_moe_pairs *pairs, const glmrt_layer_weights *layer, const float *normed,
                               int32_t hidden_size, float *expert_act, int32_t expert_intermediate,
                               glmrt_matmul_job *jobs);
int32_t glmrt_moe_jobs_down(const glmrt_moe_pairs *pairs, const glmrt_layer_weights *layer,
                            const float *expert_act, int32_t expert_intermediate, float *expert_out,
                            int32_t hidden_size, glmrt_matmul_job *jobs);
void glmrt_moe_combine_token(const float *expert_out, const float *route_weights, int32_t top_k,
                             const float *shared_out, int32_t hidden_size, float *hidden);

#endif
