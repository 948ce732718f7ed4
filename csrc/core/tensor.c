#include "tensor.h"

#include <string.h>

typedef struct glmrt_dtype_info {
    glmrt_dtype dtype;
    const char *name;
    int32_t size;
} glmrt_dtype_info;

static const glmrt_dtype_info dtype_table[] = {
    {GLMRT_DTYPE_F64, "F64", 8},
    {GLMRT_DTYPE_F32, "F32", 4},
    {GLMRT_DTYPE_F16, "F16", 2},
    {GLMRT_DTYPE_BF16, "BF16", 2},
    {GLMRT_DTYPE_F8_E4M3, "F8_E4M3", 1},
    {GLMRT_DTYPE_F8_E5M2, "F8_E5M2", 1},
    {GLMRT_DTYPE_I64, "I64", 8},
    {GLMRT_DTYPE_I32, "I32", 4},
    {GLMRT_DTYPE_I16, "I16", 2},
    {GLMRT_DTYPE_I8, "I8", 1},
    {GLMRT_DTYPE_U8, "U8", 1},
    {GLMRT_DTYPE_BOOL, "BOOL", 1},
};

#define DTYPE_TABLE_LENGTH ((int32_t)(sizeof(dtype_table) / sizeof(dtype_table[0])))

static const glmrt_dtype_info *dtype_info_find(glmrt_dtype dtype)
{
    for (int32_t i = 0; i < DTYPE_TABLE_LENGTH; i++) {
        if (dtype_table[i].dtype == dtype) {
            return &dtype_table[i];
        }
    }
    return NULL;
}

int32_t glmrt_dtype_size(glmrt_dtype dtype)
{
    const glmrt_dtype_info *info = dtype_info_find(dtype);
    return info == NULL ? 0 : info->size;
}

const char *glmrt_dtype_name(glmrt_dtype dtype)
{
    const glmrt_dtype_info *info = dtype_info_find(dtype);
    return info == NULL ? "INVALID" : info->name;
}

glmrt_dtype glmrt_dtype_from_name(const char *name, size_t length)
{
    if (name == NULL) {
        return GLMRT_DTYPE_INVALID;
    }
    for (int32_t i = 0; i < DTYPE_TABLE_LENGTH; i++) {
        const char *candidate = dtype_table[i].name;
        if (strlen(candidate) == length && memcmp(candidate, name, length) == 0) {
            return dtype_table[i].dtype;
        }
    }
    return GLMRT_DTYPE_INVALID;
}

int64_t glmrt_tensor_numel(const glmrt_tensor *tensor)
{
    if (tensor == NULL) {
        return 0;
    }
    for (int32_t i = 0; i < tensor->ndim; i++) {
        if (tensor->shape[i] == 0) {
            return 0;
        }
    }
    int64_t count = 1;
    for (int32_t i = 0; i < tensor->ndim; i++) {
        if (tensor->shape[i] < 0 || __builtin_mul_overflow(count, tensor->shape[i], &count)) {
            return -1;
        }
    }
    return count;
}
