#ifndef GLMRT_CPU_BACKEND_H
#define GLMRT_CPU_BACKEND_H

#include "attention.h"
#include "engine.h"
#include "linear.h"
#include "moe.h"
#include "sampling.h"
#include "threadpool.h"

typedef struct glmrt_cpu_layer_params {
    int32_t is_moe;
    const glmrt_layer_weights *weights;
    float *input_norm;
    float *post_attention_norm;
    float *q_bias;
    float *k_bias;
    float *v_bias;
    float *q_norm;
    float *k_norm;
    float *router_bias;
} glmrt_cpu_layer_params;

typedef struct glmrt_cpu_thread_scratch {
    float *scores;
    glmrt_moe_router_scratch router;
    glmrt_sampler_scratch sampler;
} glmrt_cpu_thread_scratch;

typedef struct glmrt_cpu_activations {
    float *hidden;
    float *normed;
    float *proj;
    float *q;
    float *k;
    float *v;
    float *attn;
    float *mlp_act;
    float *rope_cos;
    float *rope_sin;
    float *router_logits;
    int32_t *route_experts;
    float *route_weights;
    float *expert_act;
    float *expert_out;
    float *final_hidden;
    float *logits;
    float *inv_freq;
    float *native_rows;
    glmrt_matmul_job *jobs;
    glmrt_moe_pairs pairs;
} glmrt_cpu_activations;

typedef struct glmrt_cpu_dims {
    int32_t num_layers;
    int32_t hidden;
    int32_t vocab;
    int32_t num_heads;
    int32_t num_kv_heads;
    int32_t head_dim;
    int32_t q_dim;
    int32_t kv_dim;
    int32_t rotary_half;
    int32_t mlp_width;
    int32_t expert_width;
    int32_t shared_width;
    int32_t num_experts;
    int32_t top_k;
    int32_t num_groups;
    int32_t has_moe;
    int32_t max_tokens;
    int32_t max_batch;
    int32_t max_context;
    int32_t max_cols;
    int32_t job_capacity;
} glmrt_cpu_dims;

typedef struct glmrt_cpu_rounding {
    const glmrt_linear *weight;
    const float *x;
    int64_t x_stride;
    float *out;
    int64_t out_stride;
    int32_t cols;
} glmrt_cpu_rounding;

typedef struct glmrt_cpu_step {
    const glmrt_step_batch *batch;
    glmrt_cpu_rounding rounding;
    int32_t layer_index;
    const glmrt_cpu_layer_params *layer;
    const float *residual_add;
    const float *norm_weight;
    glmrt_token *sampled;
} glmrt_cpu_step;

typedef struct glmrt_cpu_backend {
    glmrt_engine *engine;
    glmrt_model_config config;
    glmrt_cpu_dims dims;
    const glmrt_weights *weights;
    const glmrt_linear *lm_head;
    int32_t num_threads;
    int32_t native_matmuls;
    glmrt_threadpool *pool;
    glmrt_linear_runner linear;
    glmrt_kv_cache kv;
    glmrt_cpu_layer_params *layers;
    float *final_norm;
    float *param_storage;
    void *activation_storage;
    void *thread_storage;
    int64_t thread_stride_bytes;
    glmrt_cpu_activations act;
    glmrt_cpu_thread_scratch *threads;
    int64_t workspace_bytes;
    glmrt_cpu_step step;
    int64_t last_forward_ns;
} glmrt_cpu_backend;

glmrt_status glmrt_cpu_backend_prepare_params(glmrt_cpu_backend *backend, glmrt_error *error);
glmrt_status glmrt_cpu_backend_forward_step(glmrt_cpu_backend *backend, const glmrt_step_batch *batch,
                                            float *out_logits, glmrt_token *out_sampled);

#endif
