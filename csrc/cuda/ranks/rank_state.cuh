#ifndef GLMRT_RANK_STATE_CUH
#define GLMRT_RANK_STATE_CUH

#include <cuda_runtime.h>
#include <nccl.h>

#include "attention.cuh"
#include "device_model.cuh"
#include "gemm.cuh"
#include "rank_reduce.cuh"
#include "qgemm.cuh"
#include "sampling.cuh"
#include "rank_plan.h"
#include "step_inputs.cuh"

extern "C" {
#include "engine.h"
}

typedef struct glmrt_cuda_dims {
    int32_t num_layers;
    int32_t hidden;
    int32_t vocab;
    int32_t vocab_local;
    int32_t has_head;
    int32_t samples;
    int32_t logits_cols;
    int32_t head_dim;
    int32_t num_q_heads;
    int32_t num_kv_heads;
    int32_t group;
    int32_t q_width;
    int32_t kv_width;
    int32_t qkv_width;
    int32_t rotary_dim;
    int32_t has_moe;
    int32_t dense_width;
    int32_t shared_width;
    int32_t mlp_width;
    int32_t expert_width;
    int32_t num_experts;
    int32_t num_local_experts;
    int32_t top_k;
    int32_t num_groups;
    int32_t keep_groups;
    int32_t max_tokens;
    int32_t max_batch;
    int32_t max_assignments;
    int32_t max_expert_tiles;
    int32_t max_partials;
    int32_t activation_bytes;
    int32_t head_activation_bytes;
    int32_t max_split_n;
    int32_t max_split_units;
    int32_t bf16_partials;
} glmrt_cuda_dims;

typedef struct glmrt_cuda_workspace {
    float *hidden;
    float *partial;
    float *normed;
    float *qkv;
    float *attn;
    float *mlp_gate_up;
    float *mlp_act;
    float *shared_out;
    float *router_logits;
    int32_t *topk_ids;
    float *topk_weights;
    int32_t *sorted_token;
    int32_t *assignment_row;
    glmrt_cuda_gemm_tile *tiles;
    int32_t *moe_counters;
    float *expert_gate_up;
    float *expert_act;
    float *expert_out;
    float *partial_out;
    float *partial_stats;
    float *sample_hidden;
    float *logits;
    float *logits_parts;
    int32_t *sampled;
    uint8_t *step_inputs;
    uint8_t *act_rows;
    float *act_row_scales;
    uint8_t *act_wide;
    float *act_wide_scales;
    uint8_t *act_expert_in;
    float *act_expert_in_scales;
    uint8_t *act_expert;
    float *act_expert_scales;
    uint8_t *act_head;
    float *act_head_scales;
    float *split_partials;
    int32_t *split_counters;
    glmrt_cuda_sampler sampler;
} glmrt_cuda_workspace;

typedef struct glmrt_cuda_matmuls {
    glmrt_cuda_qgemm_operand rows;
    glmrt_cuda_qgemm_operand attention;
    glmrt_cuda_qgemm_operand dense_act;
    glmrt_cuda_qgemm_operand shared_act;
    glmrt_cuda_qgemm_operand expert_in;
    glmrt_cuda_qgemm_operand expert_act;
    glmrt_cuda_qgemm_operand head;
    glmrt_cuda_qgemm_split split;
    glmrt_cuda_qgemm_weight *weights;
    int32_t num_weights;
    int32_t capacity;
    int32_t kind;
    int32_t head_kind;
} glmrt_cuda_matmuls;

#define GLMRT_CUDA_MAX_DECODE_GRAPHS 40

typedef struct glmrt_cuda_decode_graphs {
    int32_t count;
    int32_t buckets[GLMRT_CUDA_MAX_DECODE_GRAPHS];
    int32_t spread[GLMRT_CUDA_MAX_DECODE_GRAPHS];
    cudaGraphExec_t execs[GLMRT_CUDA_MAX_DECODE_GRAPHS];
    int64_t bytes;
} glmrt_cuda_decode_graphs;

#define GLMRT_CUDA_FLIGHTS 2

typedef struct glmrt_cuda_flight {
    int32_t *host_sampled;
    cudaEvent_t started;
    cudaEvent_t finished;
    int32_t pending_samples;
    glmrt_token *pending_sampled;
    int32_t rows_owned;
} glmrt_cuda_flight;

typedef struct glmrt_cuda_state {
    glmrt_engine *engine;
    glmrt_error *error;
    glmrt_error rank_error;
    int32_t device;
    int32_t owns_residual;
    int32_t rows_owned_capable;
    ncclComm_t comm;
    glmrt_cuda_peer_reduce peer;
    glmrt_cuda_ordered_gather ordered;
    int32_t *step_abandoned;
    int32_t *waiting_for_stream;
    int32_t num_sms;
    cudaStream_t stream;
    cudaStream_t shared_stream;
    cudaEvent_t shared_fork;
    cudaEvent_t shared_join;
    glmrt_rank rank;
    const glmrt_rank_plan *plan;
    glmrt_cuda_dims dims;
    glmrt_cuda_model model;
    uint8_t *weight_memory;
    int64_t weight_bytes;
    uint8_t *workspace_memory;
    int64_t workspace_bytes;
    glmrt_cuda_workspace ws;
    uint16_t *kv_memory;
    int64_t kv_bytes;
    int64_t kv_bytes_per_page;
    int32_t kv_num_pages;
    int32_t kv_pad_page;
    glmrt_cuda_kv_layout kv;
    glmrt_cuda_step_capacity capacity;
    glmrt_cuda_split_policy split_policy;
    glmrt_cuda_matmuls *matmuls;
    int64_t step_input_bytes;
    glmrt_cuda_decode_graphs graphs;
    glmrt_cuda_flight flights[GLMRT_CUDA_FLIGHTS];
    int32_t flight_head;
    int32_t flights_queued;
    int64_t last_device_ns;
    int32_t last_rows_owned;
    float rms_eps;
    float attention_scale;
} glmrt_cuda_state;

glmrt_status glmrt_cuda_dims_derive(const glmrt_engine *engine, const glmrt_rank *rank, glmrt_cuda_dims *d,
                                    glmrt_error *error);
void glmrt_cuda_workspace_layout(const glmrt_cuda_dims *d, const glmrt_cuda_step_capacity *capacity,
                                 size_t sort_bytes, uint8_t *base, glmrt_cuda_workspace *ws, int64_t *out_bytes);
glmrt_status glmrt_cuda_rank_load(glmrt_cuda_state *st);
glmrt_status glmrt_cuda_rank_page_capacity(glmrt_cuda_state *st, int32_t *out_pages);
glmrt_status glmrt_cuda_rank_allocate(glmrt_cuda_state *st, int32_t kv_pages);
void glmrt_cuda_rank_release(glmrt_cuda_state *st);
glmrt_status glmrt_cuda_matmuls_plan(glmrt_cuda_state *st);
glmrt_status glmrt_cuda_matmuls_bind(glmrt_cuda_state *st);
void glmrt_cuda_matmuls_release(glmrt_cuda_state *st);
glmrt_status glmrt_cuda_forward_enqueue(glmrt_cuda_state *st, const glmrt_cuda_step_counts *counts,
                                        const uint8_t *host_inputs, float *out_logits, glmrt_token *out_sampled);
glmrt_status glmrt_cuda_forward_wait(glmrt_cuda_state *st, int64_t *out_device_ns);
glmrt_status glmrt_cuda_forward_packed(glmrt_cuda_state *st, const glmrt_cuda_step_counts *counts,
                                       const uint8_t *host_inputs, float *out_logits, glmrt_token *out_sampled);
int glmrt_cuda_forward_can_own_rows(const glmrt_cuda_state *st);
glmrt_status glmrt_cuda_forward_capture(glmrt_cuda_state *st, const glmrt_cuda_step_counts *counts,
                                        int32_t decode_path, cudaGraphExec_t *out);
glmrt_status glmrt_cuda_forward_padded_warm_up(glmrt_cuda_state *st, const glmrt_cuda_step_counts *counts,
                                               const uint8_t *host_inputs);
int32_t glmrt_cuda_decode_graph_grid(const glmrt_cuda_state *st, int32_t bucket);
int32_t glmrt_cuda_decode_graph_spread_items(const glmrt_cuda_state *st);
cudaGraphExec_t glmrt_cuda_decode_graph_of(const glmrt_cuda_state *st, int32_t bucket, int32_t decode_items);
int32_t glmrt_cuda_decode_graph_bucket(const glmrt_cuda_state *st, const glmrt_step_batch *batch);
int glmrt_cuda_decode_graphs_wanted(const glmrt_cuda_state *st);
glmrt_status glmrt_cuda_decode_graphs_pack_warm_up(const glmrt_cuda_state *st, uint8_t *host_inputs,
                                                   glmrt_cuda_step_counts *out_counts, glmrt_error *error);
glmrt_status glmrt_cuda_decode_graphs_capture(glmrt_cuda_state *st, const glmrt_cuda_step_counts *warm_up,
                                              const uint8_t *host_inputs);
void glmrt_cuda_decode_graphs_release(glmrt_cuda_state *st);

#endif
