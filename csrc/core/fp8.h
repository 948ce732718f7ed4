#ifndef GLMRT_FP8_H
#define GLMRT_FP8_H

#include <stdint.h>

#define GLMRT_FP8_E4M3_MAX 448.0f

float glmrt_fp8_e4m3_to_float(uint8_t bits);
uint8_t glmrt_fp8_e4m3_from_float(float value);
void glmrt_fp8_e4m3_fill_table(float table[256]);
float glmrt_bf16_to_float(uint16_t bits);
uint16_t glmrt_float_to_bf16(float value);
float glmrt_f16_to_float(uint16_t bits);

#endif
