#ifndef GLMRT_ACTIVATION_QUANT_CUH
#define GLMRT_ACTIVATION_QUANT_CUH

#include <cuda_runtime.h>

#include "qgemm.cuh"

enum glmrt_cuda_activation_op {
    GLMRT_ACTIVATION_COPY = 0,
    GLMRT_ACTIVATION_SILU_MUL = 1
};

typedef struct glmrt_cuda_activation_args {
    const float *x;
    int64_t x_stride;
    const int32_t *x_rows;
    int32_t op;
    int32_t num_rows;
    const int32_t *device_rows;
    const glmrt_cuda_qgemm_operand *out;
} glmrt_cuda_activation_args;

glmrt_status glmrt_cuda_activation_quantize(const glmrt_cuda_activation_args *args, cudaStream_t stream,
                                            glmrt_error *error);

#endif
