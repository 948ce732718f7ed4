#ifndef GLMRT_ATTENTION_CUH
#define GLMRT_ATTENTION_CUH

#include "ops.cuh"

#define GLMRT_ATTENTION_MAX_GROUP 16
#define GLMRT_ATTENTION_KEY_TILE 64
#define GLMRT_ATTENTION_PREFILL_ROWS 128
#define GLMRT_ATTENTION_PREFILL_TOKENS (GLMRT_ATTENTION_PREFILL_ROWS / GLMRT_ATTENTION_MAX_GROUP)
#define GLMRT_ATTENTION_KEYS_PER_SPLIT 512
#define GLMRT_ATTENTION_MAX_SPLITS 32
#define GLMRT_ATTENTION_PREFILL_AUTO 0
#define GLMRT_ATTENTION_PREFILL_MMA 1
#define GLMRT_ATTENTION_PREFILL_WGMMA 2
#define GLMRT_ATTENTION_DECODE_AUTO 0
#define GLMRT_ATTENTION_DECODE_BLOCK 1
#define GLMRT_ATTENTION_DECODE_SPREAD 2

typedef struct glmrt_cuda_attention_item {
    int32_t seq;
    int32_t page_begin;
    int32_t token_begin;
    int32_t num_tokens;
    int32_t row_begin;
    int32_t key_begin;
    int32_t key_end;
    int32_t partial;
    int32_t split_keys;
    int32_t max_splits;
} glmrt_cuda_attention_item;

typedef struct glmrt_cuda_attention_merge {
    int32_t token;
    int32_t partial_begin;
    int32_t num_splits;
    int32_t reserved;
} glmrt_cuda_attention_merge;

typedef struct glmrt_cuda_attention_args {
    const float *q;
    int64_t q_stride;
    const int32_t *positions;
    const int32_t *page_ids;
    glmrt_cuda_kv_layout kv;
    int32_t layer;
    int32_t group;
    float scale;
    const glmrt_cuda_attention_item *items;
    int32_t num_items;
    const int32_t *device_num_items;
    int32_t max_grid_items;
    float *out;
    int64_t out_stride;
    float *partial_out;
    float *partial_stats;
    int32_t prefill_path;
    int32_t decode_path;
} glmrt_cuda_attention_args;

typedef struct glmrt_cuda_attention_merge_args {
    const glmrt_cuda_attention_merge *merges;
    int32_t num_merges;
    const int32_t *device_num_merges;
    int32_t max_grid_merges;
    int32_t group;
    int32_t num_kv_heads;
    int32_t head_dim;
    const float *partial_out;
    const float *partial_stats;
    float *out;
    int64_t out_stride;
} glmrt_cuda_attention_merge_args;

__device__ __forceinline__ int32_t glmrt_attention_item_count(const glmrt_cuda_attention_args &args)
{
    return args.device_num_items != nullptr ? *args.device_num_items : args.num_items;
}

static inline int32_t glmrt_attention_grid_limit(int32_t count, int32_t max_grid)
{
    return max_grid > 0 && max_grid < count ? max_grid : count;
}

static inline int32_t glmrt_attention_grid_items(const glmrt_cuda_attention_args *args)
{
    return glmrt_attention_grid_limit(args->num_items, args->max_grid_items);
}

__host__ __device__ __forceinline__ int32_t glmrt_attention_split_span(int32_t keys, int32_t split_keys,
                                                                       int32_t max_splits)
{
    int32_t span = split_keys;
    while ((keys + span - 1) / span > max_splits) {
        span *= 2;
    }
    return span;
}

int32_t glmrt_cuda_attention_prefill_tokens(int32_t head_dim);
int32_t glmrt_cuda_attention_spread_items(int32_t head_dim, int32_t num_kv_heads, int32_t sms);
int32_t glmrt_cuda_attention_prefill_path(int device, int32_t head_dim);
glmrt_status glmrt_cuda_attention_prepare(int32_t head_dim, int32_t group, glmrt_error *error);
glmrt_status glmrt_cuda_attention_run(const glmrt_cuda_attention_args *args, int32_t tokens_per_item,
                                      cudaStream_t stream, glmrt_error *error);
glmrt_status glmrt_cuda_attention_merge_run(const glmrt_cuda_attention_merge_args *args, cudaStream_t stream,
                                            glmrt_error *error);

#endif
