#ifndef GLMRT_CUDA_BACKEND_H
#define GLMRT_CUDA_BACKEND_H

#ifdef __cplusplus
extern "C" {
#endif

#include "backend.h"

extern const glmrt_backend_ops glmrt_cuda_backend_ops;

#ifdef __cplusplus
}
#endif

#endif
