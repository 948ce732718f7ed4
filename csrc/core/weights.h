#ifndef GLMRT_WEIGHTS_H
#define GLMRT_WEIGHTS_H

#include "checkpoint.h"

typedef struct glmrt_vector {
    const char *name;
    glmrt_dtype dtype;
    int32_t length;
    const uint8_t *data;
} glmrt_vector;

typedef struct glmrt_linear {
    const char *name;
    int32_t quant;
    glmrt_dtype dtype;
    int32_t rows;
    int32_t cols;
    const uint8_t *data;
    glmrt_dtype scale_dtype;
    int32_t scale_rows;
    int32_t scale_cols;
    int32_t block_rows;
    int32_t block_cols;
    const uint8_t *scale;
} glmrt_linear;

typedef struct glmrt_layer_weights {
    int32_t is_moe;
    glmrt_vector input_norm;
    glmrt_vector post_attention_norm;
    glmrt_linear q_proj;
    glmrt_linear k_proj;
    glmrt_linear v_proj;
    glmrt_linear o_proj;
    glmrt_vector q_bias;
    glmrt_vector k_bias;
    glmrt_vector v_bias;
    glmrt_vector q_norm;
    glmrt_vector k_norm;
    glmrt_linear mlp_gate;
    glmrt_linear mlp_up;
    glmrt_linear mlp_down;
    glmrt_linear router;
    glmrt_vector router_bias;
    glmrt_linear *expert_gate;
    glmrt_linear *expert_up;
    glmrt_linear *expert_down;
    glmrt_linear shared_gate;
    glmrt_linear shared_up;
    glmrt_linear shared_down;
} glmrt_layer_weights;

typedef struct glmrt_weights {
    glmrt_linear embed;
    glmrt_vector final_norm;
    glmrt_linear lm_head;
    int32_t num_layers;
    glmrt_layer_weights *layers;
    uint64_t total_bytes;
} glmrt_weights;

glmrt_status glmrt_weights_bind(const glmrt_checkpoint *checkpoint, const glmrt_model_config *config,
                                glmrt_weights *out, glmrt_error *error);
void glmrt_weights_free(glmrt_weights *weights);

#endif
