#include "fp8.h"

#include <math.h>

#include "number_formats.h"

float glmrt_fp8_e4m3_to_float(uint8_t bits)
{
    return glmrt_e4m3_decode(bits);
}

uint8_t glmrt_fp8_e4m3_from_float(float value)
{
    return glmrt_e4m3_encode(value);
}

void glmrt_fp8_e4m3_fill_table(float table[256])
{
    for (int bits = 0; bits < 256; ++bits) {
        table[bits] = glmrt_fp8_e4m3_to_float((uint8_t)bits);
    }
}

float glmrt_bf16_to_float(uint16_t bits)
{
    return glmrt_bf16_decode(bits);
}

uint16_t glmrt_float_to_bf16(float value)
{
    return glmrt_bf16_encode(value);
}

float glmrt_f16_to_float(uint16_t bits)
{
    uint32_t sign = (uint32_t)(bits & 0x8000u) << 16;
    uint32_t exponent = (bits >> 10) & 0x1Fu;
    uint32_t mantissa = bits & 0x3FFu;
    if (exponent == 0x1Fu) {
        return glmrt_bits_to_float(sign | 0x7F800000u | (mantissa << 13));
    }
    if (exponent == 0) {
        float magnitude = ldexpf((float)mantissa, -24);
        return sign ? -magnitude : magnitude;
    }
    return glmrt_bits_to_float(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}
