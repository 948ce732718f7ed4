#ifndef GLMRT_ROUTER_MMA_CUH
#define GLMRT_ROUTER_MMA_CUH

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "device_math.cuh"
#include "device_model.cuh"
#include "gemm_mma_ops.cuh"

#define GLMRT_ROUTER_MMA_PARTS 16
#define GLMRT_ROUTER_MMA_STEP_COLS 32
#define GLMRT_ROUTER_MMA_LANE_COLS 8
#define GLMRT_ROUTER_MMA_EXPERTS 16
#define GLMRT_ROUTER_MMA_TOKENS 8
#define GLMRT_ROUTER_MMA_THREADS (GLMRT_ROUTER_MMA_PARTS * 32)

__host__ __device__ __forceinline__ int32_t glmrt_router_mma_steps(int32_t cols)
{
    return (cols + GLMRT_ROUTER_MMA_STEP_COLS - 1) / GLMRT_ROUTER_MMA_STEP_COLS;
}

__host__ __device__ __forceinline__ int32_t glmrt_router_mma_part_steps(int32_t cols)
{
    return (glmrt_router_mma_steps(cols) + GLMRT_ROUTER_MMA_PARTS - 1) / GLMRT_ROUTER_MMA_PARTS;
}

typedef struct glmrt_router_mma_range {
    int32_t begin;
    int32_t end;
} glmrt_router_mma_range;

__device__ __forceinline__ glmrt_router_mma_range glmrt_router_mma_part(int32_t cols, int32_t part)
{
    const int32_t total = glmrt_router_mma_steps(cols);
    const int32_t per_part = glmrt_router_mma_part_steps(cols);
    glmrt_router_mma_range range;
    range.begin = min(total, part * per_part);
    range.end = min(total, range.begin + per_part);
    return range;
}

__device__ __forceinline__ int32_t glmrt_router_mma_lane_col(int32_t step, int lane)
{
    return step * GLMRT_ROUTER_MMA_STEP_COLS + GLMRT_ROUTER_MMA_LANE_COLS * (lane & 3);
}

typedef struct glmrt_router_lane_tokens {
    float4 first;
    float4 second;
} glmrt_router_lane_tokens;

typedef struct glmrt_router_thirds {
    uint32_t high[2];
    uint32_t middle[2];
    uint32_t low[2];
} glmrt_router_thirds;

__device__ __forceinline__ void glmrt_router_split_pair(float2 v, int slot, glmrt_router_thirds &b)
{
    const __nv_bfloat162 high = __floats2bfloat162_rn(v.x, v.y);
    const float2 high_back = __bfloat1622float2(high);
    const float2 rest = make_float2(__fsub_rn(v.x, high_back.x), __fsub_rn(v.y, high_back.y));
    const __nv_bfloat162 middle = __floats2bfloat162_rn(rest.x, rest.y);
    const float2 middle_back = __bfloat1622float2(middle);
    const __nv_bfloat162 low =
        __floats2bfloat162_rn(__fsub_rn(rest.x, middle_back.x), __fsub_rn(rest.y, middle_back.y));
    b.high[slot] = glmrt_bf16x2_bits(high);
    b.middle[slot] = glmrt_bf16x2_bits(middle);
    b.low[slot] = glmrt_bf16x2_bits(low);
}

__device__ __forceinline__ glmrt_router_thirds glmrt_router_split_quad(float4 v)
{
    glmrt_router_thirds b;
    glmrt_router_split_pair(make_float2(v.x, v.y), 0, b);
    glmrt_router_split_pair(make_float2(v.z, v.w), 1, b);
    return b;
}

__device__ __forceinline__ glmrt_router_lane_tokens glmrt_router_load_tokens(const float *row, int32_t col,
                                                                             int32_t cols)
{
    glmrt_router_lane_tokens t;
    if (row == nullptr || col >= cols) {
        t.first = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        t.second = t.first;
        return t;
    }
    const float4 *at = reinterpret_cast<const float4 *>(row + col);
    t.first = at[0];
    t.second = at[1];
    return t;
}

__device__ __forceinline__ uint4 glmrt_router_load_weights(const uint8_t *row, int32_t col, int32_t cols)
{
    if (row == nullptr || col >= cols) {
        return make_uint4(0u, 0u, 0u, 0u);
    }
    return __ldg(reinterpret_cast<const uint4 *>(row + 2 * (int64_t)col));
}

typedef struct glmrt_router_chains {
    float high[4];
    float middle[4];
    float low[4];
} glmrt_router_chains;

__device__ __forceinline__ void glmrt_router_chains_clear(glmrt_router_chains &c)
{
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        c.high[i] = 0.0f;
        c.middle[i] = 0.0f;
        c.low[i] = 0.0f;
    }
}

__device__ __forceinline__ void glmrt_router_chains_mma(glmrt_router_chains &c, const uint32_t *a,
                                                        const glmrt_router_thirds &b)
{
    glmrt_mma_bf16_16816(c.high, a, b.high[0], b.high[1]);
    glmrt_mma_bf16_16816(c.middle, a, b.middle[0], b.middle[1]);
    glmrt_mma_bf16_16816(c.low, a, b.low[0], b.low[1]);
}

__device__ __forceinline__ void glmrt_router_chains_step(glmrt_router_chains &c, uint4 upper, uint4 lower,
                                                         const glmrt_router_lane_tokens &tokens)
{
    const uint32_t first[4] = {upper.x, lower.x, upper.y, lower.y};
    const uint32_t second[4] = {upper.z, lower.z, upper.w, lower.w};
    glmrt_router_chains_mma(c, first, glmrt_router_split_quad(tokens.first));
    glmrt_router_chains_mma(c, second, glmrt_router_split_quad(tokens.second));
}

__device__ __forceinline__ float glmrt_router_chains_value(const glmrt_router_chains &c, int i)
{
    return __fadd_rn(c.high[i], __fadd_rn(c.middle[i], c.low[i]));
}

__device__ __forceinline__ int glmrt_router_fragment_expert(int i, int lane)
{
    return (lane >> 2) + (i >> 1) * 8;
}

__device__ __forceinline__ int glmrt_router_fragment_token(int i, int lane)
{
    return 2 * (lane & 3) + (i & 1);
}

__device__ __forceinline__ float glmrt_router_parts_fold(const float *parts, int32_t part_stride)
{
    float sum = parts[0];
#pragma unroll
    for (int p = 1; p < GLMRT_ROUTER_MMA_PARTS; ++p) {
        sum = __fadd_rn(sum, parts[p * part_stride]);
    }
    return sum;
}

int glmrt_cuda_router_mma_supports(const glmrt_cuda_matrix *w);

#endif
