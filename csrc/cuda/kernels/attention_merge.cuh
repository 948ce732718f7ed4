#ifndef GLMRT_ATTENTION_MERGE_CUH
#define GLMRT_ATTENTION_MERGE_CUH

#include "attention.cuh"
#include "attention_tile.cuh"

template <int PER>
struct glmrt_merge_lane {
    float v[PER];
};

template <int PER>
__device__ __forceinline__ glmrt_merge_lane<PER> glmrt_merge_load(const float *source)
{
    glmrt_merge_lane<PER> lane;
    if constexpr (PER == 4) {
        float4 q = __ldcg(reinterpret_cast<const float4 *>(source));
        lane.v[0] = q.x;
        lane.v[1] = q.y;
        lane.v[2] = q.z;
        lane.v[3] = q.w;
    } else if constexpr (PER == 2) {
        float2 q = __ldcg(reinterpret_cast<const float2 *>(source));
        lane.v[0] = q.x;
        lane.v[1] = q.y;
    } else {
        lane.v[0] = __ldcg(source);
    }
    return lane;
}

template <int PER>
__device__ __forceinline__ void glmrt_merge_head(const glmrt_cuda_attention_merge_args &args,
                                                 const glmrt_cuda_attention_merge merge, int32_t head, int lane)
{
    const int32_t kv_head = head / args.group;
    const int32_t g = head - kv_head * args.group;
    const int32_t head_dim = args.head_dim;
    const int32_t column = lane * PER;
    int64_t index = ((int64_t)merge.partial_begin * args.num_kv_heads + kv_head) * args.group + g;
    float merged_max = __ldcg(args.partial_stats + index * 2);
    float total = __ldcg(args.partial_stats + index * 2 + 1);
    glmrt_merge_lane<PER> value = glmrt_merge_load<PER>(args.partial_out + index * head_dim + column);
    for (int32_t s = 1; s < merge.num_splits; ++s) {
        index = ((int64_t)(merge.partial_begin + s) * args.num_kv_heads + kv_head) * args.group + g;
        glmrt_attn_fold_weights w = glmrt_attn_fold_weigh(merged_max, __ldcg(args.partial_stats + index * 2));
        glmrt_merge_lane<PER> chunk = glmrt_merge_load<PER>(args.partial_out + index * head_dim + column);
#pragma unroll
        for (int k = 0; k < PER; ++k) {
            value.v[k] = glmrt_attn_fold_value(value.v[k], chunk.v[k], w);
        }
        total = glmrt_attn_fold_value(total, __ldcg(args.partial_stats + index * 2 + 1), w);
        merged_max = w.max;
    }
    float *out = args.out + (int64_t)merge.token * args.out_stride + (int64_t)head * head_dim + column;
#pragma unroll
    for (int k = 0; k < PER; ++k) {
        out[k] = glmrt_attn_normalize(value.v[k], total);
    }
}

__device__ __forceinline__ glmrt_cuda_attention_merge_args glmrt_merge_args_of(const glmrt_cuda_attention_args &args)
{
    glmrt_cuda_attention_merge_args merge;
    merge.merges = args.merges;
    merge.num_merges = 0;
    merge.device_num_merges = nullptr;
    merge.max_grid_merges = 0;
    merge.group = args.group;
    merge.num_kv_heads = (int32_t)args.kv.num_kv_heads;
    merge.head_dim = (int32_t)args.kv.head_dim;
    merge.partial_out = args.partial_out;
    merge.partial_stats = args.partial_stats;
    merge.out = args.out;
    merge.out_stride = args.out_stride;
    return merge;
}

template <int HD>
__device__ __forceinline__ void glmrt_merge_when_last_split(const glmrt_cuda_attention_args &args,
                                                            const glmrt_cuda_attention_item &item, int warps)
{
    __shared__ int last_split;
    const int32_t kv_head = (int32_t)blockIdx.y;
    const glmrt_cuda_attention_merge merge = args.merges[item.merge];
    int32_t *arrivals = args.merge_arrivals + (int64_t)item.merge * args.kv.num_kv_heads + kv_head;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        last_split = atomicAdd(arrivals, 1) == merge.num_splits - 1;
    }
    __syncthreads();
    if (!last_split) {
        return;
    }
    __threadfence();
    if (threadIdx.x == 0) {
        *arrivals = 0;
    }
    const glmrt_cuda_attention_merge_args folded = glmrt_merge_args_of(args);
    const int warp = (int)(threadIdx.x >> 5);
    const int lane = (int)(threadIdx.x & 31);
    for (int32_t g = warp; g < args.group; g += warps) {
        glmrt_merge_head<HD / 32>(folded, merge, kv_head * args.group + g, lane);
    }
}

#endif
