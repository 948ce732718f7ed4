#include "fp8.h"

#include <math.h>
#include <string.h>

#define GLMRT_FP8_E4M3_SIGN 0x80u
#define GLMRT_FP8_E4M3_NAN 0x7Fu
#define GLMRT_FP8_E4M3_MAX_BITS 0x7Eu
#define GLMRT_FP8_E4M3_MIN_NORMAL 0.015625f

static uint32_t float_bits(float value)
{
    uint32_t bits;
    memcpy(&bits, &value, sizeof(bits));
    return bits;
}

static float bits_float(uint32_t bits)
{
    float value;
    memcpy(&value, &bits, sizeof(value));
    return value;
}

float glmrt_fp8_e4m3_to_float(uint8_t bits)
{
    int negative = (bits & GLMRT_FP8_E4M3_SIGN) != 0;
    int exponent = (bits >> 3) & 0xF;
    int mantissa = bits & 0x7;
    float magnitude;
    if (exponent == 0xF && mantissa == 0x7) {
        magnitude = NAN;
    } else if (exponent == 0) {
        magnitude = ldexpf((float)mantissa, -9);
    } else {
        magnitude = ldexpf((float)(8 + mantissa), exponent - 10);
    }
    return negative ? -magnitude : magnitude;
}

static uint8_t e4m3_subnormal_bits(float magnitude)
{
    float scaled = magnitude * 512.0f;
    int whole = (int)scaled;
    float fraction = scaled - (float)whole;
    if (fraction > 0.5f || (fraction == 0.5f && (whole & 1))) {
        whole += 1;
    }
    return (uint8_t)whole;
}

static uint8_t e4m3_normal_bits(float magnitude)
{
    uint32_t bits = float_bits(magnitude);
    uint32_t lowest_kept = (bits >> 20) & 1u;
    uint32_t rounded = bits + 0x7FFFFu + lowest_kept;
    int exponent = (int)((rounded >> 23) & 0xFFu) - 127;
    uint32_t mantissa = (rounded >> 20) & 0x7u;
    if (exponent > 8 || (exponent == 8 && mantissa == 0x7u)) {
        return GLMRT_FP8_E4M3_MAX_BITS;
    }
    return (uint8_t)(((uint32_t)(exponent + 7) << 3) | mantissa);
}

uint8_t glmrt_fp8_e4m3_from_float(float value)
{
    uint8_t sign = (float_bits(value) >> 31) ? GLMRT_FP8_E4M3_SIGN : 0u;
    if (isnan(value)) {
        return (uint8_t)(sign | GLMRT_FP8_E4M3_NAN);
    }
    float magnitude = fabsf(value);
    if (magnitude >= 480.0f) {
        return (uint8_t)(sign | GLMRT_FP8_E4M3_MAX_BITS);
    }
    if (magnitude < GLMRT_FP8_E4M3_MIN_NORMAL) {
        return (uint8_t)(sign | e4m3_subnormal_bits(magnitude));
    }
    return (uint8_t)(sign | e4m3_normal_bits(magnitude));
}

void glmrt_fp8_e4m3_fill_table(float table[256])
{
    for (int bits = 0; bits < 256; ++bits) {
        table[bits] = glmrt_fp8_e4m3_to_float((uint8_t)bits);
    }
}

float glmrt_bf16_to_float(uint16_t bits)
{
    return bits_float((uint32_t)bits << 16);
}

uint16_t glmrt_float_to_bf16(float value)
{
    uint32_t bits = float_bits(value);
    if (isnan(value)) {
        return (uint16_t)((bits >> 16) | 0x0040u);
    }
    uint32_t lowest_kept = (bits >> 16) & 1u;
    return (uint16_t)((bits + 0x7FFFu + lowest_kept) >> 16);
}

float glmrt_f16_to_float(uint16_t bits)
{
    uint32_t sign = (uint32_t)(bits & 0x8000u) << 16;
    uint32_t exponent = (bits >> 10) & 0x1Fu;
    uint32_t mantissa = bits & 0x3FFu;
    if (exponent == 0x1Fu) {
        return bits_float(sign | 0x7F800000u | (mantissa << 13));
    }
    if (exponent == 0) {
        float magnitude = ldexpf((float)mantissa, -24);
        return sign ? -magnitude : magnitude;
    }
    return bits_float(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}
