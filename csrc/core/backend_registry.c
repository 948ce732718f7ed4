#include "backend.h"

#ifdef GLMRT_WITH_CUDA
#include "../cuda/cuda_backend.h"
#endif

const glmrt_backend_ops *glmrt_backend_find(int32_t backend_kind)
{
    if (backend_kind == GLMRT_BACKEND_CPU) {
        return &glmrt_cpu_backend_ops;
    }
#ifdef GLMRT_WITH_CUDA
    if (backend_kind == GLMRT_BACKEND_CUDA) {
        return &glmrt_cuda_backend_ops;
    }
#endif
    return NULL;
}
