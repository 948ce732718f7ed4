#include <stdint.h>

#include "dependent_launch.cuh"
#include "attention.cuh"
#include "attention_kernels.cuh"
#include "attention_merge.cuh"
#include "attention_tile.cuh"
#include "cuda_check.cuh"
#include "device_arch.cuh"
#include "device_math.cuh"

#define GLMRT_MERGE_WARPS 8

template <int PER>
__device__ __forceinline__ void glmrt_merge_head(const glmrt_cuda_attention_merge_args &args,
                                                 const glmrt_cuda_attention_merge merge, int32_t head, int lane)
{
    const int32_t column = lane * PER;
    const glmrt_merge_lane<PER> value = glmrt_merge_values<PER>(args, merge, head, column);
    float *out = args.out + (int64_t)merge.token * args.out_stride + (int64_t)head * args.head_dim + column;
#pragma unroll
    for (int k = 0; k < PER; ++k) {
        out[k] = value.v[k];
    }
}

template <int PER>
__global__ void __launch_bounds__(GLMRT_MERGE_WARPS * 32) glmrt_attention_merge_kernel(glmrt_cuda_attention_merge_args args)
{
    glmrt_dependent_enter();
    const int32_t count = args.device_num_merges != nullptr ? *args.device_num_merges : args.num_merges;
    const int32_t head = (int32_t)blockIdx.y * GLMRT_MERGE_WARPS + (int32_t)(threadIdx.x >> 5);
    if (head >= args.num_kv_heads * args.group) {
        return;
    }
    for (int32_t index = blockIdx.x; index < count; index += gridDim.x) {
        glmrt_merge_head<PER>(args, args.merges[index], head, (int)(threadIdx.x & 31));
    }
}

glmrt_status glmrt_attention_kernel_prepare(const glmrt_attention_kernel_choice *choice, int32_t head_dim,
                                            glmrt_error *error)
{
    if (choice->kernel == nullptr) {
        return glmrt_error_set(error, GLMRT_ERR_INVARIANT, "no %s kernel for head_dim %d", choice->name, head_dim);
    }
    GLMRT_CUDA_TRY(error, cudaFuncSetAttribute(choice->kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               (int)choice->shared));
    return GLMRT_OK;
}

glmrt_status glmrt_attention_items_launch(const glmrt_attention_kernel_choice *choice,
                                          const glmrt_cuda_attention_args *args, dim3 grid, cudaStream_t stream,
                                          glmrt_error *error)
{
    if (choice->kernel == nullptr) {
        return glmrt_error_set(error, GLMRT_ERR_INVARIANT, "no %s kernel for head_dim %d", choice->name,
                               args->kv.head_dim);
    }
    glmrt_dependent_launch dependent;
    const cudaLaunchConfig_t *config = glmrt_dependent_config(&dependent, grid, choice->threads, choice->shared, stream);
    GLMRT_CUDA_TRY(error, cudaLaunchKernelEx(config, choice->kernel, *args));
    return GLMRT_OK;
}

int32_t glmrt_cuda_attention_prefill_tokens(int32_t head_dim)
{
    return GLMRT_ATTENTION_PREFILL_TOKENS;
}

glmrt_status glmrt_cuda_attention_prepare(int32_t head_dim, int32_t group, glmrt_error *error)
{
    if (group < 1 || group > GLMRT_ATTENTION_MAX_GROUP) {
        return glmrt_error_set(error, GLMRT_ERR_UNSUPPORTED,
                               "CUDA attention supports 1 to %d query heads a kv head, the model has %d",
                               GLMRT_ATTENTION_MAX_GROUP, group);
    }
    if (!glmrt_attention_head_dim_supported(head_dim)) {
        return glmrt_error_set(error, GLMRT_ERR_UNSUPPORTED,
                               "CUDA attention supports head_dim 32, 64 or 128, the model has %d", head_dim);
    }
    GLMRT_TRY(glmrt_attention_decode_prepare(head_dim, error));
    GLMRT_TRY(glmrt_attention_prefill_prepare(head_dim, error));
    if (glmrt_attention_prefill_wgmma_supported(head_dim)) {
        GLMRT_TRY(glmrt_attention_prefill_wgmma_prepare(head_dim, error));
    }
    return GLMRT_OK;
}

int32_t glmrt_cuda_attention_prefill_path(int device, int32_t head_dim)
{
    if (glmrt_cuda_device_hopper(device) && glmrt_attention_prefill_wgmma_supported(head_dim)) {
        return GLMRT_ATTENTION_PREFILL_WGMMA;
    }
    return GLMRT_ATTENTION_PREFILL_MMA;
}

static glmrt_status glmrt_attention_prefill_path_resolve(const glmrt_cuda_attention_args *args, int32_t *path,
                                                         glmrt_error *error)
{
    int device = 0;
    GLMRT_CUDA_TRY(error, cudaGetDevice(&device));
    const int32_t best = glmrt_cuda_attention_prefill_path(device, args->kv.head_dim);
    *path = args->prefill_path == GLMRT_ATTENTION_PREFILL_AUTO ? best : args->prefill_path;
    if (*path == GLMRT_ATTENTION_PREFILL_MMA) {
        return GLMRT_OK;
    }
    if (*path != GLMRT_ATTENTION_PREFILL_WGMMA) {
        return glmrt_error_set(error, GLMRT_ERR_INVARIANT, "unknown prefill attention path %d", *path);
    }
    if (best != GLMRT_ATTENTION_PREFILL_WGMMA) {
        return glmrt_error_set(error, GLMRT_ERR_UNSUPPORTED,
                               "the tensor-core prefill attention needs an sm_90 device and head_dim 64 or 128, "
                               "not head_dim %d on device %d",
                               args->kv.head_dim, device);
    }
    return GLMRT_OK;
}

glmrt_status glmrt_cuda_attention_run(const glmrt_cuda_attention_args *args, int32_t tokens_per_item,
                                      cudaStream_t stream, glmrt_error *error)
{
    if (args->num_items <= 0) {
        return GLMRT_OK;
    }
    if (2 * args->kv.page_elements > INT32_MAX) {
        return glmrt_error_set(error, GLMRT_ERR_UNSUPPORTED,
                               "CUDA attention needs a KV page of at most 2 GiB, this one is %lld bytes",
                               (long long)(2 * args->kv.page_elements));
    }
    if (tokens_per_item == 1) {
        return glmrt_attention_decode_launch(args, stream, error);
    }
    if (args->device_num_items != nullptr) {
        return glmrt_error_set(error, GLMRT_ERR_INVARIANT,
                               "prefill attention takes its item count from the host, not from the device");
    }
    if (tokens_per_item == glmrt_cuda_attention_prefill_tokens(args->kv.head_dim)) {
        int32_t path = GLMRT_ATTENTION_PREFILL_MMA;
        GLMRT_TRY(glmrt_attention_prefill_path_resolve(args, &path, error));
        if (path == GLMRT_ATTENTION_PREFILL_WGMMA) {
            return glmrt_attention_prefill_wgmma_launch(args, stream, error);
        }
        return glmrt_attention_prefill_launch(args, stream, error);
    }
    return glmrt_error_set(error, GLMRT_ERR_INVARIANT,
                           "attention items of %d tokens: decode items have 1, prefill items %d", tokens_per_item,
                           glmrt_cuda_attention_prefill_tokens(args->kv.head_dim));
}

glmrt_status glmrt_cuda_attention_merge_run(const glmrt_cuda_attention_merge_args *args, cudaStream_t stream,
                                            glmrt_error *error)
{
    if (args->num_merges <= 0) {
        return GLMRT_OK;
    }
    const int32_t grid_merges = glmrt_attention_grid_limit(args->num_merges, args->max_grid_merges);
    dim3 grid((unsigned)grid_merges, (unsigned)glmrt_ceil_div(args->num_kv_heads * args->group, GLMRT_MERGE_WARPS));
    void (*kernel)(glmrt_cuda_attention_merge_args) = nullptr;
    switch (args->head_dim) {
    case 128: kernel = glmrt_attention_merge_kernel<4>; break;
    case 64: kernel = glmrt_attention_merge_kernel<2>; break;
    case 32: kernel = glmrt_attention_merge_kernel<1>; break;
    default:
        return glmrt_error_set(error, GLMRT_ERR_INVARIANT, "no split merge for head_dim %d", args->head_dim);
    }
    glmrt_dependent_launch dependent;
    const cudaLaunchConfig_t *config = glmrt_dependent_config(&dependent, grid, GLMRT_MERGE_WARPS * 32, 0, stream);
    GLMRT_CUDA_TRY(error, cudaLaunchKernelEx(config, kernel, *args));
    return GLMRT_OK;
}
