#ifndef GLMRT_DEVICE_MODEL_CUH
#define GLMRT_DEVICE_MODEL_CUH

#include <stdint.h>

#define GLMRT_CUDA_MAX_SEGMENTS 3
#define GLMRT_CUDA_PIECE 16

enum glmrt_cuda_weight_format {
    GLMRT_CUDA_FORMAT_F32 = 0,
    GLMRT_CUDA_FORMAT_BF16 = 1,
    GLMRT_CUDA_FORMAT_FP8 = 2
};

enum glmrt_cuda_scale_kind {
    GLMRT_CUDA_SCALE_NONE = 0,
    GLMRT_CUDA_SCALE_CHANNEL = 1,
    GLMRT_CUDA_SCALE_BLOCK = 2
};

struct glmrt_cuda_qgemm_weight;

typedef struct glmrt_cuda_matrix {
    int32_t format;
    int32_t scale_kind;
    int32_t rows;
    int32_t cols;
    int32_t block_rows;
    int32_t block_cols;
    int32_t scale_rows;
    int32_t scale_cols;
    int32_t num_segments;
    int32_t segment_row_end[GLMRT_CUDA_MAX_SEGMENTS];
    int32_t segment_block_begin[GLMRT_CUDA_MAX_SEGMENTS];
    int32_t num_groups;
    int64_t group_bytes;
    int64_t group_scales;
    uint8_t *data;
    float *scale;
    const struct glmrt_cuda_qgemm_weight *qgemm;
} glmrt_cuda_matrix;

typedef struct glmrt_cuda_layer {
    int32_t is_moe;
    float *input_norm;
    float *post_attention_norm;
    glmrt_cuda_matrix qkv;
    float *qkv_bias;
    float *q_norm;
    float *k_norm;
    glmrt_cuda_matrix o_proj;
    glmrt_cuda_matrix dense_gate_up;
    glmrt_cuda_matrix dense_down;
    glmrt_cuda_matrix router;
    float *router_bias;
    glmrt_cuda_matrix experts_gate_up;
    glmrt_cuda_matrix experts_down;
    int32_t has_shared;
    glmrt_cuda_matrix shared_gate_up;
    glmrt_cuda_matrix shared_down;
} glmrt_cuda_layer;

typedef struct glmrt_cuda_model {
    glmrt_cuda_matrix embed;
    float *final_norm;
    glmrt_cuda_matrix lm_head;
    int32_t lm_head_shares_embed;
    int32_t num_layers;
    glmrt_cuda_layer *layers;
} glmrt_cuda_model;

__host__ __device__ __forceinline__ int32_t glmrt_cuda_format_bytes(int32_t format)
{
    return format == GLMRT_CUDA_FORMAT_F32 ? 4 : (format == GLMRT_CUDA_FORMAT_BF16 ? 2 : 1);
}

__host__ __device__ __forceinline__ int32_t glmrt_cuda_matrix_row_block(const glmrt_cuda_matrix *m, int32_t row)
{
    int32_t segment_begin = 0;
    for (int32_t s = 0; s < m->num_segments; ++s) {
        if (row < m->segment_row_end[s]) {
            return m->segment_block_begin[s] + (row - segment_begin) / m->block_rows;
        }
        segment_begin = m->segment_row_end[s];
    }
    return m->scale_rows - 1;
}

#endif
