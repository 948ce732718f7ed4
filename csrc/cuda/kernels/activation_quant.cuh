#ifndef GLMRT_ACTIVATION_QUANT_CUH
#define GLMRT_ACTIVATION_QUANT_CUH

#include <cuda_runtime.h>

#include "cluster_ops.cuh"
#include "device_math.cuh"
#include "qgemm.cuh"

extern "C" {
#include "fp8.h"
}

#define GLMRT_ACTIVATION_THREADS 256
#define GLMRT_CLUSTER_BLOCKS 8
#define GLMRT_CLUSTER_VECTORS 4
#define GLMRT_CLUSTER_VECTOR_STRIDE (GLMRT_ACTIVATION_THREADS * 4)
#define GLMRT_CLUSTER_BLOCK_COLS (GLMRT_CLUSTER_VECTOR_STRIDE * GLMRT_CLUSTER_VECTORS)

enum glmrt_cuda_activation_op {
    GLMRT_ACTIVATION_COPY = 0,
    GLMRT_ACTIVATION_SILU_MUL = 1
};

typedef struct glmrt_cuda_activation_args {
    const float *x;
    int64_t x_stride;
    const int32_t *x_rows;
    int32_t op;
    int32_t num_rows;
    const int32_t *device_rows;
    const glmrt_cuda_qgemm_operand *out;
} glmrt_cuda_activation_args;

__device__ __forceinline__ float glmrt_activation_block_max(float value, float *shared)
{
    value = glmrt_warp_max(value);
    if ((threadIdx.x & 31) == 0) {
        shared[threadIdx.x >> 5] = value;
    }
    __syncthreads();
    float result = 0.0f;
    for (int w = 0; w < (int)(blockDim.x >> 5); ++w) {
        result = fmaxf(result, shared[w]);
    }
    return result;
}

__device__ __forceinline__ float glmrt_activation_scale(float amax)
{
    return amax > 0.0f ? __fdiv_rn(amax, GLMRT_FP8_E4M3_MAX) : 1.0f;
}

__device__ __forceinline__ float glmrt_activation_cluster_scale(float amax, float *warp_max, float *slice_max)
{
    const float block_max = glmrt_activation_block_max(amax, warp_max);
    if (threadIdx.x == 0) {
        *slice_max = block_max;
    }
    glmrt_cluster_sync();
    float row_max = 0.0f;
    for (uint32_t b = 0; b < gridDim.x; ++b) {
        row_max = fmaxf(row_max, glmrt_cluster_load(slice_max, b));
    }
    glmrt_cluster_sync();
    return glmrt_activation_scale(row_max);
}

__device__ __forceinline__ float glmrt_abs_max4(float4 v, float amax)
{
    return fmaxf(amax, fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w))));
}

__device__ __forceinline__ uint32_t glmrt_fp8x4_bits(float4 v, float scale)
{
    const uint32_t low = glmrt_fp8x2_e4m3_bits(__fdiv_rn(v.x, scale), __fdiv_rn(v.y, scale));
    const uint32_t high = glmrt_fp8x2_e4m3_bits(__fdiv_rn(v.z, scale), __fdiv_rn(v.w, scale));
    return low | (high << 16);
}

__device__ __forceinline__ uint2 glmrt_bf16x4_bits(float4 v)
{
    uint2 out;
    out.x = (uint32_t)glmrt_float_to_bf16_bits(v.x) | ((uint32_t)glmrt_float_to_bf16_bits(v.y) << 16);
    out.y = (uint32_t)glmrt_float_to_bf16_bits(v.z) | ((uint32_t)glmrt_float_to_bf16_bits(v.w) << 16);
    return out;
}

template <int KIND>
__device__ __forceinline__ void glmrt_operand_store4(uint8_t *data, int32_t cols, int64_t row, int32_t quad, float4 v,
                                                     float scale)
{
    if (KIND == GLMRT_OPERAND_FP8) {
        reinterpret_cast<uint32_t *>(data + row * cols)[quad] = glmrt_fp8x4_bits(v, scale);
    } else {
        reinterpret_cast<uint2 *>(data + row * cols * 2)[quad] = glmrt_bf16x4_bits(v);
    }
}

template <int KIND>
__device__ __forceinline__ void glmrt_activation_cluster_store(uint8_t *out, float *out_scales, int32_t cols,
                                                               int32_t row, const float4 *cached, int32_t first,
                                                               int32_t hi, float scale)
{
#pragma unroll
    for (int k = 0; k < GLMRT_CLUSTER_VECTORS; ++k) {
        const int32_t c = first + k * GLMRT_CLUSTER_VECTOR_STRIDE;
        if (c < hi) {
            glmrt_operand_store4<KIND>(out, cols, row, c / 4, cached[k], scale);
        }
    }
    if (threadIdx.x == 0 && blockIdx.x == 0) {
        out_scales[row] = scale;
    }
}

glmrt_status glmrt_cuda_activation_quantize(const glmrt_cuda_activation_args *args, cudaStream_t stream,
                                            glmrt_error *error);
int32_t glmrt_cuda_activation_cluster_blocks(int32_t num_rows, int32_t cols, int32_t kind, int32_t sms);
int32_t glmrt_cuda_activation_cluster_slice_cols(int32_t cols, int32_t blocks);

typedef struct glmrt_cuda_operand_gather_args {
    const glmrt_cuda_qgemm_operand *source;
    const int32_t *source_rows;
    int32_t num_rows;
    const int32_t *device_rows;
    const glmrt_cuda_qgemm_operand *out;
} glmrt_cuda_operand_gather_args;

int glmrt_cuda_operand_gather_supported(const glmrt_cuda_qgemm_operand *source, const glmrt_cuda_qgemm_operand *out);
glmrt_status glmrt_cuda_operand_gather(const glmrt_cuda_operand_gather_args *args, cudaStream_t stream,
                                       glmrt_error *error);

#endif
