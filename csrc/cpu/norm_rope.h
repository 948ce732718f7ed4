#ifndef GLMRT_CPU_NORM_ROPE_H
#define GLMRT_CPU_NORM_ROPE_H

#include "glmrt.h"

void glmrt_rms_norm_row(const float *x, const float *weight, int32_t n, float eps, float *out);
void glmrt_rope_inv_freq_fill(float theta, int32_t rotary_dim, float *inv_freq);
void glmrt_rope_angles_fill(const float *inv_freq, int32_t half, glmrt_pos position, float *cos_out,
                            float *sin_out);
void glmrt_rope_apply(float *head, int32_t half, const float *cos_values, const float *sin_values);
int32_t glmrt_rope_rotary_dim(int32_t head_dim, float partial_rotary_factor);

#endif
