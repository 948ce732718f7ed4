#ifndef GLMRT_TENSOR_H
#define GLMRT_TENSOR_H

#include <stddef.h>
#include <stdint.h>

#define GLMRT_MAX_DIMS 8

typedef enum glmrt_dtype {
    GLMRT_DTYPE_INVALID = 0,
    GLMRT_DTYPE_F64,
    GLMRT_DTYPE_F32,
    GLMRT_DTYPE_F16,
    GLMRT_DTYPE_BF16,
    GLMRT_DTYPE_F8_E4M3,
    GLMRT_DTYPE_F8_E5M2,
    GLMRT_DTYPE_I64,
    GLMRT_DTYPE_I32,
    GLMRT_DTYPE_I16,
    GLMRT_DTYPE_I8,
    GLMRT_DTYPE_U8,
    GLMRT_DTYPE_BOOL
} glmrt_dtype;

typedef struct glmrt_tensor {
    const char *name;
    glmrt_dtype dtype;
    int32_t ndim;
    int64_t shape[GLMRT_MAX_DIMS];
    const uint8_t *data;
    uint64_t nbytes;
    int32_t file_index;
} glmrt_tensor;

int32_t glmrt_dtype_size(glmrt_dtype dtype);
const char *glmrt_dtype_name(glmrt_dtype dtype);
glmrt_dtype glmrt_dtype_from_name(const char *name, size_t length);
int64_t glmrt_tensor_numel(const glmrt_tensor *tensor);

#endif
