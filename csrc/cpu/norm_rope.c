#include "norm_rope.h"

#include <math.h>

#include "linear.h"

void glmrt_rms_norm_row(const float *x, const float *weight, int32_t n, float eps, float *out)
{
    float mean_square = glmrt_dot(x, x, n) / (float)n;
    float inverse = 1.0f / sqrtf(mean_square + eps);
    for (int32_t i = 0; i < n; ++i) {
        out[i] = weight[i] * (x[i] * inverse);
    }
}

int32_t glmrt_rope_rotary_dim(int32_t head_dim, float partial_rotary_factor)
{
    int32_t rotary_dim = (int32_t)((double)head_dim * (double)partial_rotary_factor);
    if (rotary_dim > head_dim) {
        rotary_dim = head_dim;
    }
    if (rotary_dim < 0) {
        rotary_dim = 0;
    }
    return rotary_dim & ~1;
}

void glmrt_rope_inv_freq_fill(float theta, int32_t rotary_dim, float *inv_freq)
{
    int32_t half = rotary_dim / 2;
    for (int32_t i = 0; i < half; ++i) {
        float exponent = (float)(2 * i) / (float)rotary_dim;
        inv_freq[i] = 1.0f / powf(theta, exponent);
    }
}

void glmrt_rope_angles_fill(const float *inv_freq, int32_t half, glmrt_pos position, float *cos_out,
                            float *sin_out)
{
    for (int32_t i = 0; i < half; ++i) {
        float angle = (float)position * inv_freq[i];
        cos_out[i] = cosf(angle);
        sin_out[i] = sinf(angle);
    }
}

void glmrt_rope_apply(float *head, int32_t half, const float *cos_values, const float *sin_values)
{
    for (int32_t i = 0; i < half; ++i) {
        float first = head[i];
        float second = head[i + half];
        head[i] = first * cos_values[i] - second * sin_values[i];
        head[i + half] = second * cos_values[i] + first * sin_values[i];
    }
}
