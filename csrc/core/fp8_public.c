#include "fp8.h"
#include "glmrt.h"

#include <stddef.h>

glmrt_status glmrt_fp8_e4m3_decode(const uint8_t *bits, float *out_values, int64_t n)
{
    if (n < 0 || (n > 0 && (bits == NULL || out_values == NULL))) {
        return GLMRT_ERR_INVALID_ARGUMENT;
    }
    for (int64_t i = 0; i < n; ++i) {
        out_values[i] = glmrt_fp8_e4m3_to_float(bits[i]);
    }
    return GLMRT_OK;
}

glmrt_status glmrt_fp8_e4m3_encode(const float *values, uint8_t *out_bits, int64_t n)
{
    if (n < 0 || (n > 0 && (values == NULL || out_bits == NULL))) {
        return GLMRT_ERR_INVALID_ARGUMENT;
    }
    for (int64_t i = 0; i < n; ++i) {
        out_bits[i] = glmrt_fp8_e4m3_from_float(values[i]);
    }
    return GLMRT_OK;
}
