#include <stdint.h>

#include "attention.cuh"
#include "attention_kernels.cuh"
#include "attention_tile.cuh"
#include "cuda_check.cuh"

__global__ void glmrt_attention_merge_kernel(const glmrt_cuda_attention_merge *merges, int32_t group,
                                             int32_t num_kv_heads, int32_t head_dim, const float *partial_out,
                                             const float *partial_stats, float *out, int64_t out_stride)
{
    const glmrt_cuda_attention_merge merge = merges[blockIdx.x];
    const int32_t head = blockIdx.y;
    const int32_t kv_head = head / group;
    const int32_t g = head % group;
    for (int32_t d = threadIdx.x; d < head_dim; d += blockDim.x) {
        int64_t index = ((int64_t)merge.partial_begin * num_kv_heads + kv_head) * group + g;
        float merged_max = partial_stats[index * 2];
        float total = partial_stats[index * 2 + 1];
        float value = partial_out[index * head_dim + d];
        for (int32_t s = 1; s < merge.num_splits; ++s) {
            index = ((int64_t)(merge.partial_begin + s) * num_kv_heads + kv_head) * group + g;
            glmrt_attn_fold_weights w = glmrt_attn_fold_weigh(merged_max, partial_stats[index * 2]);
            value = glmrt_attn_fold_value(value, partial_out[index * head_dim + d], w);
            total = glmrt_attn_fold_value(total, partial_stats[index * 2 + 1], w);
            merged_max = w.max;
        }
        out[(int64_t)merge.token * out_stride + (int64_t)head * head_dim + d] = glmrt_attn_normalize(value, total);
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
    if (tokens_per_item == glmrt_cuda_attention_prefill_tokens(args->kv.head_dim)) {
        return glmrt_attention_prefill_launch(args, stream, error);
    }
    return glmrt_error_set(error, GLMRT_ERR_INVARIANT,
                           "attention items of %d tokens: decode items have 1, prefill items %d", tokens_per_item,
                           glmrt_cuda_attention_prefill_tokens(args->kv.head_dim));
}

glmrt_status glmrt_cuda_attention_merge_run(const glmrt_cuda_attention_merge *merges, int32_t num_merges,
                                            int32_t num_q_heads, int32_t group, int32_t num_kv_heads,
                                            int32_t head_dim, const float *partial_out, const float *partial_stats,
                                            float *out, int64_t out_stride, cudaStream_t stream, glmrt_error *error)
{
    if (num_merges <= 0) {
        return GLMRT_OK;
    }
    dim3 grid((unsigned)num_merges, (unsigned)num_q_heads);
    int threads = head_dim < 128 ? head_dim : 128;
    glmrt_attention_merge_kernel<<<grid, threads, 0, stream>>>(merges, group, num_kv_heads, head_dim, partial_out,
                                                               partial_stats, out, out_stride);
    GLMRT_CUDA_LAUNCHED(error, "glmrt_attention_merge_kernel");
    return GLMRT_OK;
}
