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
        float4 q = *reinterpret_cast<const float4 *>(source);
        lane.v[0] = q.x;
        lane.v[1] = q.y;
        lane.v[2] = q.z;
        lane.v[3] = q.w;
    } else if constexpr (PER == 2) {
        float2 q = *reinterpret_cast<const float2 *>(source);
        lane.v[0] = q.x;
        lane.v[1] = q.y;
    } else {
        lane.v[0] = *source;
    }
    return lane;
}

template <int PER>
__device__ __forceinline__ glmrt_merge_lane<PER> glmrt_merge_values(const glmrt_cuda_attention_merge_args &args,
                                                                   const glmrt_cuda_attention_merge merge,
                                                                   int32_t head, int32_t column)
{
    const int32_t kv_head = head / args.group;
    const int32_t g = head - kv_head * args.group;
    const int32_t head_dim = args.head_dim;
    int64_t index = ((int64_t)merge.partial_begin * args.num_kv_heads + kv_head) * args.group + g;
    float merged_max = args.partial_stats[index * 2];
    float total = args.partial_stats[index * 2 + 1];
    glmrt_merge_lane<PER> value = glmrt_merge_load<PER>(args.partial_out + index * head_dim + column);
    for (int32_t s = 1; s < merge.num_splits; ++s) {
        index = ((int64_t)(merge.partial_begin + s) * args.num_kv_heads + kv_head) * args.group + g;
        glmrt_attn_fold_weights w = glmrt_attn_fold_weigh(merged_max, args.partial_stats[index * 2]);
        glmrt_merge_lane<PER> chunk = glmrt_merge_load<PER>(args.partial_out + index * head_dim + column);
#pragma unroll
        for (int k = 0; k < PER; ++k) {
            value.v[k] = glmrt_attn_fold_value(value.v[k], chunk.v[k], w);
        }
        total = glmrt_attn_fold_value(total, args.partial_stats[index * 2 + 1], w);
        merged_max = w.max;
    }
#pragma unroll
    for (int k = 0; k < PER; ++k) {
        value.v[k] = glmrt_attn_normalize(value.v[k], total);
    }
    return value;
}

#endif
