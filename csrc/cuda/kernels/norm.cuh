#ifndef GLMRT_NORM_CUH
#define GLMRT_NORM_CUH

#include <cuda_runtime.h>

#include "qgemm.cuh"

typedef struct glmrt_cuda_rmsnorm_args {
    const float *x;
    int64_t x_stride;
    const int32_t *x_rows;
    int32_t num_rows;
    const float *weight;
    int32_t n;
    float eps;
    float *y;
    int64_t y_stride;
    const glmrt_cuda_qgemm_operand *quantized;
} glmrt_cuda_rmsnorm_args;

glmrt_status glmrt_cuda_rmsnorm_run(const glmrt_cuda_rmsnorm_args *args, cudaStream_t stream, glmrt_error *error);

#endif
