#include <stdint.h>

#include "attention.cuh"
#include "attention_kernels.cuh"
#include "attention_tile.cuh"
#include "cuda_check.cuh"
#include "device_math.cuh"

#define GLMRT_MERGE_THREADS 256

__device__ __forceinline__ void glmrt_attention_merge_one(const glmrt_cuda_attention_merge_args &args,
                                                          const glmrt_cuda_attention_merge merge)
{
    const int32_t parts = glmrt_ceil_div(args.group, args.heads_per_block);
    const int32_t kv_head = (int32_t)blockIdx.y / parts;
    const int32_t first = ((int32_t)blockIdx.y - kv_head * parts) * args.heads_per_block;
    const int32_t head_dim = args.head_dim;
    const int32_t values = (min(args.group, first + args.heads_per_block) - first) * head_dim;
    for (int32_t i = threadIdx.x; i < values; i += blockDim.x) {
        const int32_t g = first + i / head_dim;
        const int32_t d = i - (g - first) * head_dim;
        const int32_t head = kv_head * args.group + g;
        int64_t index = ((int64_t)merge.partial_begin * args.num_kv_heads + kv_head) * args.group + g;
        float merged_max = args.partial_stats[index * 2];
        float total = args.partial_stats[index * 2 + 1];
        float value = args.partial_out[index * head_dim + d];
        for (int32_t s = 1; s < merge.num_splits; ++s) {
            index = ((int64_t)(merge.partial_begin + s) * args.num_kv_heads + kv_head) * args.group + g;
            glmrt_attn_fold_weights w = glmrt_attn_fold_weigh(merged_max, args.partial_stats[index * 2]);
            value = glmrt_attn_fold_value(value, args.partial_out[index * head_dim + d], w);
            total = glmrt_attn_fold_value(total, args.partial_stats[index * 2 + 1], w);
            merged_max = w.max;
        }
        args.out[(int64_t)merge.token * args.out_stride + (int64_t)head * head_dim + d] =
            glmrt_attn_normalize(value, total);
    }
}

__global__ void glmrt_attention_merge_kernel(glmrt_cuda_attention_merge_args args)
{
    const int32_t count = args.device_num_merges != nullptr ? *args.device_num_merges : args.num_merges;
    for (int32_t index = blockIdx.x; index < count; index += gridDim.x) {
        glmrt_attention_merge_one(args, args.merges[index]);
    }
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
    return glmrt_attention_prefill_prepare(head_dim, error);
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
    int32_t sms = 0;
    GLMRT_TRY(glmrt_cuda_current_sms(&sms, error));
    const int32_t grid_merges = glmrt_attention_grid_limit(args->num_merges, args->max_grid_merges);
    const int64_t whole_groups = (int64_t)grid_merges * args->num_kv_heads;
    int32_t parts = (int32_t)((2 * (int64_t)sms + whole_groups - 1) / whole_groups);
    parts = parts < 1 ? 1 : (parts > args->group ? args->group : parts);
    glmrt_cuda_attention_merge_args launch = *args;
    launch.heads_per_block = glmrt_ceil_div(args->group, parts);
    parts = glmrt_ceil_div(args->group, launch.heads_per_block);
    dim3 grid((unsigned)grid_merges, (unsigned)(args->num_kv_heads * parts));
    int32_t values = launch.heads_per_block * args->head_dim;
    int threads = values < GLMRT_MERGE_THREADS ? glmrt_ceil_div(values, 32) * 32 : GLMRT_MERGE_THREADS;
    glmrt_attention_merge_kernel<<<grid, threads, 0, stream>>>(launch);
    GLMRT_CUDA_LAUNCHED(error, "glmrt_attention_merge_kernel");
    return GLMRT_OK;
}
