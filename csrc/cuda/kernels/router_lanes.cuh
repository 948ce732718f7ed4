#ifndef GLMRT_ROUTER_LANES_CUH
#define GLMRT_ROUTER_LANES_CUH

#include <cuda_runtime.h>
#include <stdint.h>

#include "device_math.cuh"
#include "device_model.cuh"

#define GLMRT_ROUTER_LANE_COLS 4
#define GLMRT_ROUTER_WARP_COLS (32 * GLMRT_ROUTER_LANE_COLS)

template <int FORMAT>
__device__ __forceinline__ float4 glmrt_router_weights(const uint8_t *row, int32_t col)
{
    if (FORMAT == GLMRT_CUDA_FORMAT_F32) {
        return *reinterpret_cast<const float4 *>(row + (int64_t)col * 4);
    }
    const uint2 bits = *reinterpret_cast<const uint2 *>(row + (int64_t)col * 2);
    return glmrt_bf16x4_to_float4(bits.x, bits.y);
}

template <int UNROLL>
__device__ __forceinline__ void glmrt_router_stage_rows(float *tile, int32_t tile_cols, const float *x,
                                                        int64_t x_stride, int32_t count, int32_t width)
{
    const int32_t quads = width / 4;
#pragma unroll UNROLL
    for (int32_t i = (int32_t)threadIdx.x; i < count * quads; i += (int32_t)blockDim.x) {
        const int32_t t = i / quads;
        const int32_t q = i - t * quads;
        *reinterpret_cast<float4 *>(tile + (int64_t)t * tile_cols + 4 * q) =
            *reinterpret_cast<const float4 *>(x + (int64_t)t * x_stride + 4 * q);
    }
}

__device__ __forceinline__ float glmrt_router_dot4(float4 w, float4 x, float acc)
{
    acc = __fmaf_rn(w.x, x.x, acc);
    acc = __fmaf_rn(w.y, x.y, acc);
    acc = __fmaf_rn(w.z, x.z, acc);
    return __fmaf_rn(w.w, x.w, acc);
}

#endif
