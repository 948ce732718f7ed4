#ifndef GLMRT_FP8_CONVERT_CUH
#define GLMRT_FP8_CONVERT_CUH

#include <cuda_runtime.h>
#include <stdint.h>

extern "C" {
#include "error.h"
}

glmrt_status glmrt_cuda_fp8_decode(const uint8_t *bits, float *out, int64_t count, cudaStream_t stream,
                                   glmrt_error *error);
glmrt_status glmrt_cuda_fp8_encode(const float *values, uint8_t *out, int64_t count, cudaStream_t stream,
                                   glmrt_error *error);

#endif
