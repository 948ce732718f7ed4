#ifndef GLMRT_ROUTER_LANES_CUH
#define GLMRT_ROUTER_LANES_CUH

#include <cuda_runtime.h>
#include <stdint.h>

#include "device_math.cuh"
#include "device_model.cuh"

#define GLMRT_ROUTER_LANE_COLS 4
#define GLMRT_ROUTER_WARP_COLS (32 * GLMRT_ROUTER_LANE_COLS)

template <int FORMAT>
__device__ __forceinline__ uint4 glmrt_router_weight_bits(const uint8_t *row, int32_t col)
{
    if (FORMAT == GLMRT_CUDA_FORMAT_F32) {
        return *reinterpret_cast<const uint4 *>(row + (int64_t)col * 4);
    }
    const uint2 bits = *reinterpret_cast<const uint2 *>(row + (int64_t)col * 2);
    return make_uint4(bits.x, bits.y, 0u, 0u);
}

template <int FORMAT>
__device__ __forceinline__ float4 glmrt_router_weight_values(uint4 bits)
{
    if (FORMAT == GLMRT_CUDA_FORMAT_F32) {
        return make_float4(__uint_as_float(bits.x), __uint_as_float(bits.y), __uint_as_float(bits.z),
                           __uint_as_float(bits.w));
    }
    return glmrt_bf16x4_to_float4(bits.x, bits.y);
}

template <int FORMAT>
__device__ __forceinline__ float4 glmrt_router_weights(const uint8_t *row, int32_t col)
{
    return glmrt_router_weight_values<FORMAT>(glmrt_router_weight_bits<FORMAT>(row, col));
}

__device__ __forceinline__ void glmrt_router_stage_rows(float *tile, int32_t tile_cols, const float *x, int64_t x_stride,
                                                        int32_t count, int32_t width)
{
    const int32_t quads = width / 4;
    const int32_t warps = (int32_t)(blockDim.x >> 5);
    const int32_t lane = (int32_t)(threadIdx.x & 31u);
    const uint32_t tile_base = (uint32_t)__cvta_generic_to_shared(tile);
    for (int32_t t = (int32_t)(threadIdx.x >> 5); t < count; t += warps) {
        const uint32_t tile_row = tile_base + 4u * (uint32_t)(t * tile_cols);
        const float *x_row = x + (int64_t)t * x_stride;
        for (int32_t q = lane; q < quads; q += 32) {
            asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(tile_row + 16u * (uint32_t)q),
                         "l"(x_row + 4 * q)
                         : "memory");
        }
    }
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}

template <int PENDING>
__device__ __forceinline__ void glmrt_router_staged_wait()
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(PENDING) : "memory");
    __syncthreads();
}

__device__ __forceinline__ float glmrt_router_dot4(float4 w, float4 x, float acc)
{
    acc = __fmaf_rn(w.x, x.x, acc);
    acc = __fmaf_rn(w.y, x.y, acc);
    acc = __fmaf_rn(w.z, x.z, acc);
    return __fmaf_rn(w.w, x.w, acc);
}

#endif
