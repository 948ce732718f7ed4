#include "cuda_check.cuh"

glmrt_status glmrt_cuda_fail(glmrt_error *error, cudaError_t result, const char *call, const char *file, int line)
{
    glmrt_status code = result == cudaErrorMemoryAllocation ? GLMRT_ERR_OUT_OF_MEMORY : GLMRT_ERR_BACKEND;
    return glmrt_error_set(error, code, "CUDA call %s failed at %s:%d: %s (%s)", call, file, line,
                           cudaGetErrorString(result), cudaGetErrorName(result));
}

glmrt_status glmrt_cuda_current_sms(int32_t *out, glmrt_error *error)
{
    int device = 0;
    int sms = 0;
    GLMRT_CUDA_TRY(error, cudaGetDevice(&device));
    GLMRT_CUDA_TRY(error, cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    *out = sms;
    return GLMRT_OK;
}
