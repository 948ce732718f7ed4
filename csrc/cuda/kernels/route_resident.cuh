#ifndef GLMRT_ROUTE_RESIDENT_CUH
#define GLMRT_ROUTE_RESIDENT_CUH

#include <cuda_runtime.h>

#include "device_model.cuh"
#include "moe.cuh"

extern "C" {
#include "error.h"
}

#define GLMRT_ROUTE_RESIDENT_TOKENS 2
#define GLMRT_ROUTE_RESIDENT_COLS 5120

typedef struct glmrt_cuda_route_resident_args {
    const glmrt_cuda_matrix *router;
    const float *x;
    int64_t x_stride;
    float *logits;
    const glmrt_cuda_route_args *route;
    const glmrt_cuda_dispatch_args *dispatch;
    int32_t *arrivals;
} glmrt_cuda_route_resident_args;

int glmrt_cuda_router_resident_fits(const glmrt_cuda_matrix *router, int32_t num_tokens);
glmrt_status glmrt_cuda_router_resident_logits(const glmrt_cuda_matrix *w, const float *x, int64_t x_stride,
                                               int32_t num_tokens, float *logits, int64_t logits_stride,
                                               cudaStream_t stream, glmrt_error *error);
glmrt_status glmrt_cuda_route_resident(const glmrt_cuda_route_resident_args *args, cudaStream_t stream,
                                       glmrt_error *error);

#endif
