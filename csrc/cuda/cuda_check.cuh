#ifndef GLMRT_CUDA_CHECK_CUH
#define GLMRT_CUDA_CHECK_CUH

#include <cuda_runtime.h>

extern "C" {
#include "error.h"
}

glmrt_status glmrt_cuda_fail(glmrt_error *error, cudaError_t result, const char *call, const char *file, int line);
glmrt_status glmrt_cuda_current_sms(int32_t *out, glmrt_error *error);

#define GLMRT_CUDA_TRY(error, call)                                                        \
    do {                                                                                   \
        cudaError_t glmrt_cuda_result_ = (call);                                           \
        if (glmrt_cuda_result_ != cudaSuccess) {                                           \
            return glmrt_cuda_fail((error), glmrt_cuda_result_, #call, __FILE__, __LINE__); \
        }                                                                                  \
    } while (0)

#define GLMRT_CUDA_LAUNCHED(error, name)                                                    \
    do {                                                                                   \
        cudaError_t glmrt_cuda_result_ = cudaGetLastError();                               \
        if (glmrt_cuda_result_ != cudaSuccess) {                                           \
            return glmrt_cuda_fail((error), glmrt_cuda_result_, name, __FILE__, __LINE__);  \
        }                                                                                  \
    } while (0)

#define GLMRT_TRY(call)                           \
    do {                                          \
        glmrt_status glmrt_try_status_ = (call);  \
        if (glmrt_try_status_ != GLMRT_OK) {      \
            return glmrt_try_status_;             \
        }                                         \
    } while (0)

#endif
