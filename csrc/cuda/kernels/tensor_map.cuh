#ifndef GLMRT_TENSOR_MAP_CUH
#define GLMRT_TENSOR_MAP_CUH

#include <cuda.h>
#include <cuda_runtime.h>
#include <stdint.h>

extern "C" {
#include "error.h"
}

#define GLMRT_TENSOR_MAP_ROW_BYTES 128

enum glmrt_cuda_operand_kind {
    GLMRT_OPERAND_FP8 = 0,
    GLMRT_OPERAND_BF16 = 1
};

__host__ __device__ __forceinline__ int32_t glmrt_operand_bytes(int32_t kind)
{
    return kind == GLMRT_OPERAND_FP8 ? 1 : 2;
}

__host__ __device__ __forceinline__ int32_t glmrt_operand_block_elements(int32_t kind)
{
    return GLMRT_TENSOR_MAP_ROW_BYTES / glmrt_operand_bytes(kind);
}

glmrt_status glmrt_cuda_tensor_map_rows(CUtensorMap *map, int32_t kind, const void *base, int64_t row_elements,
                                        int64_t num_rows, int32_t box_rows, const char *what, glmrt_error *error);

#endif
