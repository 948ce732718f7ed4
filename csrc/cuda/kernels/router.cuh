#ifndef GLMRT_ROUTER_CUH
#define GLMRT_ROUTER_CUH

#include <cuda_runtime.h>

#include "device_model.cuh"

extern "C" {
#include "error.h"
}

int glmrt_cuda_router_supports(const glmrt_cuda_matrix *w);
glmrt_status glmrt_cuda_router_logits(const glmrt_cuda_matrix *w, const float *x, int64_t x_stride,
                                      int32_t num_tokens, float *logits, int64_t logits_stride, cudaStream_t stream,
                                      glmrt_error *error);

#endif
