#include <atomic>
#include <mutex>

#include "cuda_check.cuh"
#include "tensor_map.cuh"

typedef CUresult (*glmrt_encode_tiled_fn)(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *, const cuuint64_t *,
                                          const cuuint64_t *, const cuuint32_t *, const cuuint32_t *,
                                          CUtensorMapInterleave, CUtensorMapSwizzle, CUtensorMapL2promotion,
                                          CUtensorMapFloatOOBfill);

static std::once_flag glmrt_encode_once;
static std::atomic<glmrt_encode_tiled_fn> glmrt_encode_tiled(nullptr);
static cudaError_t glmrt_encode_lookup_result = cudaSuccess;

static void glmrt_lookup_encode_tiled()
{
    void *function = nullptr;
    cudaDriverEntryPointQueryResult query = cudaDriverEntryPointSymbolNotFound;
    glmrt_encode_lookup_result =
        cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &function, 12000, cudaEnableDefault, &query);
    if (glmrt_encode_lookup_result == cudaSuccess && query == cudaDriverEntryPointSuccess && function != nullptr) {
        glmrt_encode_tiled.store(reinterpret_cast<glmrt_encode_tiled_fn>(function), std::memory_order_release);
    }
}

glmrt_status glmrt_cuda_tensor_map_rows(CUtensorMap *map, int32_t kind, const void *base, int64_t row_elements,
                                        int64_t num_rows, int32_t box_rows, const char *what, glmrt_error *error)
{
    std::call_once(glmrt_encode_once, glmrt_lookup_encode_tiled);
    glmrt_encode_tiled_fn encode = glmrt_encode_tiled.load(std::memory_order_acquire);
    if (encode == nullptr) {
        return glmrt_error_set(error, GLMRT_ERR_BACKEND,
                               "the CUDA driver has no cuTensorMapEncodeTiled (lookup: %s); tensor-core matmuls need driver 12.0 or newer",
                               cudaGetErrorString(glmrt_encode_lookup_result));
    }
    int64_t row_bytes = row_elements * glmrt_operand_bytes(kind);
    if (((uintptr_t)base & 15u) != 0 || row_bytes % 16 != 0 || row_elements <= 0 || num_rows <= 0 ||
        box_rows <= 0 || box_rows > 256) {
        return glmrt_error_set(error, GLMRT_ERR_INVARIANT,
                               "tensor map for %s: base %p, %lld elements a row, %lld rows, box of %d rows: rows must be 16-byte multiples on 16-byte addresses",
                               what, base, (long long)row_elements, (long long)num_rows, box_rows);
    }
    cuuint64_t dims[2] = {(cuuint64_t)row_elements, (cuuint64_t)num_rows};
    cuuint64_t strides[1] = {(cuuint64_t)row_bytes};
    cuuint32_t box[2] = {(cuuint32_t)glmrt_operand_block_elements(kind), (cuuint32_t)box_rows};
    cuuint32_t element_strides[2] = {1, 1};
    CUtensorMapDataType type = kind == GLMRT_OPERAND_FP8 ? CU_TENSOR_MAP_DATA_TYPE_UINT8
                                                         : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
    CUresult result = encode(map, type, 2, const_cast<void *>(base), dims, strides, box, element_strides,
                             CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                             CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (result != CUDA_SUCCESS) {
        return glmrt_error_set(error, GLMRT_ERR_BACKEND,
                               "cuTensorMapEncodeTiled for %s failed with CUresult %d (%lld x %lld elements, box %d rows)",
                               what, (int)result, (long long)num_rows, (long long)row_elements, box_rows);
    }
    return GLMRT_OK;
}
