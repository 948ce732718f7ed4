#ifndef GLMRT_DEVICE_MATH_CUH
#define GLMRT_DEVICE_MATH_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <stdint.h>

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
    return __uint_as_float((uint32_t)bits << 16);
}

__device__ __forceinline__ uint16_t glmrt_float_to_bf16_bits(float value)
{
    uint32_t bits = __float_as_uint(value);
    if ((bits & 0x7fffffffu) > 0x7f800000u) {
        return (uint16_t)((bits >> 16) | 0x0040u);
    }
    uint32_t lowest_kept = (bits >> 16) & 1u;
    return (uint16_t)((bits + 0x7fffu + lowest_kept) >> 16);
}

__device__ __forceinline__ float glmrt_fp8_e4m3_bits_to_float(uint8_t bits)
{
    int negative = (bits & 0x80u) != 0;
    int exponent = (bits >> 3) & 0xf;
    int mantissa = bits & 0x7;
    float magnitude;
    if (exponent == 0xf && mantissa == 0x7) {
        magnitude = __uint_as_float(0x7fc00000u);
    } else if (exponent == 0) {
        magnitude = ldexpf((float)mantissa, -9);
    } else {
        magnitude = ldexpf((float)(8 + mantissa), exponent - 10);
    }
    return negative ? -magnitude : magnitude;
}

__device__ __forceinline__ uint8_t glmrt_fp8_e4m3_subnormal_bits(float magnitude)
{
    float scaled = magnitude * 512.0f;
    int whole = (int)scaled;
    float fraction = scaled - (float)whole;
    if (fraction > 0.5f || (fraction == 0.5f && (whole & 1))) {
        whole += 1;
    }
    return (uint8_t)whole;
}

__device__ __forceinline__ uint8_t glmrt_fp8_e4m3_normal_bits(float magnitude)
{
    uint32_t bits = __float_as_uint(magnitude);
    uint32_t lowest_kept = (bits >> 20) & 1u;
    uint32_t rounded = bits + 0x7ffffu + lowest_kept;
    int exponent = (int)((rounded >> 23) & 0xffu) - 127;
    uint32_t mantissa = (rounded >> 20) & 0x7u;
    if (exponent > 8 || (exponent == 8 && mantissa == 0x7u)) {
        return 0x7eu;
    }
    return (uint8_t)(((uint32_t)(exponent + 7) << 3) | mantissa);
}

__device__ __forceinline__ uint8_t glmrt_float_to_fp8_e4m3_bits(float value)
{
    uint8_t sign = (__float_as_uint(value) >> 31) ? 0x80u : 0u;
    if (isnan(value)) {
        return (uint8_t)(sign | 0x7fu);
    }
    float magnitude = fabsf(value);
    if (magnitude >= 480.0f) {
        return (uint8_t)(sign | 0x7eu);
    }
    if (magnitude < 0.015625f) {
        return (uint8_t)(sign | glmrt_fp8_e4m3_subnormal_bits(magnitude));
    }
    return (uint8_t)(sign | glmrt_fp8_e4m3_normal_bits(magnitude));
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

__device__ __forceinline__ float glmrt_silu_times(float gate, float up)
{
    return gate / (1.0f + expf(-gate)) * up;
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
