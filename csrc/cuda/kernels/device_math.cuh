#ifndef GLMRT_DEVICE_MATH_CUH
#define GLMRT_DEVICE_MATH_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <stdint.h>

#include "number_formats.h"

#define GLMRT_WARP_SIZE 32
#define GLMRT_FULL_MASK 0xffffffffu

__device__ __forceinline__ float glmrt_warp_sum(float value)
{
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
        value += __shfl_xor_sync(GLMRT_FULL_MASK, value, offset);
    }
    return value;
}

__device__ __forceinline__ float glmrt_warp_max(float value)
{
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
        value = fmaxf(value, __shfl_xor_sync(GLMRT_FULL_MASK, value, offset));
    }
    return value;
}

__device__ __forceinline__ float glmrt_bf16_bits_to_float(uint16_t bits)
{
    return glmrt_bf16_decode(bits);
}

__device__ __forceinline__ uint16_t glmrt_float_to_bf16_bits(float value)
{
    return glmrt_bf16_encode(value);
}

__device__ __forceinline__ float glmrt_fp8_e4m3_bits_to_float(uint8_t bits)
{
    return glmrt_e4m3_decode(bits);
}

__device__ __forceinline__ bool glmrt_float_is_finite(float value)
{
    return (__float_as_uint(value) & 0x7FFFFFFFu) < 0x7F800000u;
}

__device__ __forceinline__ uint16_t glmrt_fp8x2_e4m3_bits(float low, float high)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    if (glmrt_float_is_finite(low) && glmrt_float_is_finite(high)) {
        uint16_t pair;
        asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(pair) : "f"(high), "f"(low));
        return pair;
    }
#endif
    return (uint16_t)((uint32_t)glmrt_e4m3_encode(low) | ((uint32_t)glmrt_e4m3_encode(high) << 8));
}

__device__ __forceinline__ uint8_t glmrt_float_to_fp8_e4m3_bits(float value)
{
    return (uint8_t)(glmrt_fp8x2_e4m3_bits(value, 0.0f) & 0xFFu);
}

__device__ __forceinline__ float2 glmrt_fp8x2_to_float2(uint16_t pair)
{
    __half2_raw raw = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)pair, __NV_E4M3);
    __half2 value = *reinterpret_cast<__half2 *>(&raw);
    return __half22float2(value);
}

__device__ __forceinline__ void glmrt_fp8x4_to_float4(uint32_t word, float *out)
{
    float2 low = glmrt_fp8x2_to_float2((uint16_t)(word & 0xffffu));
    float2 high = glmrt_fp8x2_to_float2((uint16_t)(word >> 16));
    out[0] = low.x;
    out[1] = low.y;
    out[2] = high.x;
    out[3] = high.y;
}

__device__ __forceinline__ void glmrt_bf16x2_to_float2(uint32_t word, float *out)
{
    out[0] = __uint_as_float(word << 16);
    out[1] = __uint_as_float(word & 0xffff0000u);
}

__device__ __forceinline__ float4 glmrt_bf16x4_to_float4(uint32_t low, uint32_t high)
{
    return make_float4(__uint_as_float(low << 16), __uint_as_float(low & 0xffff0000u), __uint_as_float(high << 16),
                       __uint_as_float(high & 0xffff0000u));
}

__device__ __forceinline__ float glmrt_silu_times(float gate, float up)
{
    return __fmul_rn(__fdiv_rn(gate, __fadd_rn(1.0f, expf(-gate))), up);
}

__host__ __device__ __forceinline__ int64_t glmrt_ceil_div64(int64_t a, int64_t b)
{
    return (a + b - 1) / b;
}

__host__ __device__ __forceinline__ int32_t glmrt_ceil_div(int32_t a, int32_t b)
{
    return (a + b - 1) / b;
}

#endif
