#ifndef GLMRT_OPS_CUH
#define GLMRT_OPS_CUH

#include <cuda_runtime.h>

#include "device_model.cuh"

extern "C" {
#include "error.h"
}

typedef struct glmrt_cuda_kv_layout {
    uint16_t *base;
    int64_t layer_elements;
    int64_t page_elements;
    int64_t head_elements;
    int32_t page_size;
    int32_t num_kv_heads;
    int32_t head_dim;
} glmrt_cuda_kv_layout;

#define GLMRT_ROPE_PATH_AUTO 0
#define GLMRT_ROPE_PATH_SHARED_MEMORY 1

typedef struct glmrt_cuda_rope_args {
    float *qkv;
    int64_t qkv_stride;
    int32_t num_tokens;
    const int32_t *positions;
    const int32_t *token_seq;
    const int32_t *seq_page_begin;
    const int32_t *page_ids;
    int32_t num_q_heads;
    int32_t rotary_dim;
    const float *q_norm;
    const float *k_norm;
    float eps;
    float theta;
    glmrt_cuda_kv_layout kv;
    int32_t layer;
    int32_t path;
} glmrt_cuda_rope_args;

__host__ __device__ __forceinline__ int32_t glmrt_fed_token_code(int32_t sample_index)
{
    return -1 - sample_index;
}

__host__ __device__ __forceinline__ int32_t glmrt_fed_token_index(int32_t code)
{
    return -1 - code;
}

glmrt_status glmrt_cuda_embed(const glmrt_cuda_matrix *embed, const int32_t *token_ids, const int32_t *fed_tokens,
                              int32_t num_tokens, float *out, cudaStream_t stream, glmrt_error *error);
glmrt_status glmrt_cuda_silu_mul(const float *gate_up, int32_t width, int32_t num_rows, const int32_t *device_rows,
                                 float *out, cudaStream_t stream, glmrt_error *error);
glmrt_status glmrt_cuda_qk_rope_store(const glmrt_cuda_rope_args *args, cudaStream_t stream, glmrt_error *error);

#endif
