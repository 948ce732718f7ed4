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

__device__ __forceinline__ float glmrt_router_dot4(float4 w, float4 x, float acc)
{
    acc = __fmaf_rn(w.x, x.x, acc);
    acc = __fmaf_rn(w.y, x.y, acc);
    acc = __fmaf_rn(w.z, x.z, acc);
    return __fmaf_rn(w.w, x.w, acc);
}

#endif
