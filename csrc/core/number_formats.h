#ifndef GLMRT_NUMBER_FORMATS_H
#define GLMRT_NUMBER_FORMATS_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define GLMRT_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define GLMRT_HOST_DEVICE static inline
#endif

#define GLMRT_E4M3_SIGN_BIT 0x80u
#define GLMRT_E4M3_NAN_BITS 0x7Fu
#define GLMRT_E4M3_MAX_BITS 0x7Eu
#define GLMRT_E4M3_MIN_NORMAL 0.015625f
#define GLMRT_E4M3_SATURATE_FROM 480.0f

GLMRT_HOST_DEVICE uint32_t glmrt_float_to_bits(float value)
{
    uint32_t bits;
    memcpy(&bits, &value, sizeof(bits));
    return bits;
}

GLMRT_HOST_DEVICE float glmrt_bits_to_float(uint32_t bits)
{
    float value;
    memcpy(&value, &bits, sizeof(value));
    return value;
}

GLMRT_HOST_DEVICE float glmrt_e4m3_decode(uint8_t bits)
{
    int negative = (bits & GLMRT_E4M3_SIGN_BIT) != 0;
    int exponent = (bits >> 3) & 0xF;
    int mantissa = bits & 0x7;
    float magnitude;
    if (exponent == 0xF && mantissa == 0x7) {
        magnitude = glmrt_bits_to_float(0x7FC00000u);
    } else if (exponent == 0) {
        magnitude = ldexpf((float)mantissa, -9);
    } else {
        magnitude = ldexpf((float)(8 + mantissa), exponent - 10);
    }
    return negative ? -magnitude : magnitude;
}

GLMRT_HOST_DEVICE uint8_t glmrt_e4m3_subnormal_bits(float magnitude)
{
    float scaled = magnitude * 512.0f;
    int whole = (int)scaled;
    float fraction = scaled - (float)whole;
    if (fraction > 0.5f || (fraction == 0.5f && (whole & 1))) {
        whole += 1;
    }
    return (uint8_t)whole;
}

GLMRT_HOST_DEVICE uint8_t glmrt_e4m3_normal_bits(float magnitude)
{
    uint32_t bits = glmrt_float_to_bits(magnitude);
    uint32_t lowest_kept = (bits >> 20) & 1u;
    uint32_t rounded = bits + 0x7FFFFu + lowest_kept;
    int exponent = (int)((rounded >> 23) & 0xFFu) - 127;
    uint32_t mantissa = (rounded >> 20) & 0x7u;
    if (exponent > 8 || (exponent == 8 && mantissa == 0x7u)) {
        return GLMRT_E4M3_MAX_BITS;
    }
    return (uint8_t)(((uint32_t)(exponent + 7) << 3) | mantissa);
}

GLMRT_HOST_DEVICE uint8_t glmrt_e4m3_encode(float value)
{
    uint32_t bits = glmrt_float_to_bits(value);
    uint8_t sign = (bits >> 31) ? GLMRT_E4M3_SIGN_BIT : 0u;
    if ((bits & 0x7FFFFFFFu) > 0x7F800000u) {
        return (uint8_t)(sign | GLMRT_E4M3_NAN_BITS);
    }
    float magnitude = glmrt_bits_to_float(bits & 0x7FFFFFFFu);
    if (magnitude >= GLMRT_E4M3_SATURATE_FROM) {
        return (uint8_t)(sign | GLMRT_E4M3_MAX_BITS);
    }
    if (magnitude < GLMRT_E4M3_MIN_NORMAL) {
        return (uint8_t)(sign | glmrt_e4m3_subnormal_bits(magnitude));
    }
    return (uint8_t)(sign | glmrt_e4m3_normal_bits(magnitude));
}

GLMRT_HOST_DEVICE float glmrt_bf16_decode(uint16_t bits)
{
    return glmrt_bits_to_float((uint32_t)bits << 16);
}

GLMRT_HOST_DEVICE uint16_t glmrt_bf16_encode(float value)
{
    uint32_t bits = glmrt_float_to_bits(value);
    if ((bits & 0x7FFFFFFFu) > 0x7F800000u) {
        return (uint16_t)((bits >> 16) | 0x0040u);
    }
    uint32_t lowest_kept = (bits >> 16) & 1u;
    return (uint16_t)((bits + 0x7FFFu + lowest_kept) >> 16);
}

#endif
