#ifndef GLMRT_ATTENTION_PREFILL_ROWS_CUH
#define GLMRT_ATTENTION_PREFILL_ROWS_CUH

#include "attention_tile.cuh"

template <int HD, int TILES>
struct glmrt_prefill_state {
    float acc[TILES][HD / 8][4];
    float sum_frag[TILES][4];
    float run_max[TILES][2];
};

#define GLMRT_PREFILL_QUERY_BATCH 8

template <int HD, int ROWS, int THREADS, bool PANELS>
__device__ __forceinline__ void glmrt_prefill_load_queries(const glmrt_cuda_attention_args &args,
                                                           const glmrt_cuda_attention_item &item, int32_t kv_head,
                                                           int32_t first_row, uint32_t q_tile, int thread)
{
    constexpr int chunks = HD / 8;
    constexpr int per_thread = ROWS * chunks / THREADS;
    constexpr int batch = per_thread < GLMRT_PREFILL_QUERY_BATCH ? per_thread : GLMRT_PREFILL_QUERY_BATCH;
    static_assert(ROWS * chunks % THREADS == 0 && per_thread % batch == 0, "whole batches of query chunks a thread");
    constexpr int rows_a_step = THREADS / chunks;
    static_assert(THREADS % chunks == 0, "a thread keeps its chunk column");
    const int32_t group = args.group;
    const int32_t total_rows = item.num_tokens * group;
    const float q_scale = glmrt_attn_q_scale(args.scale);
    const int chunk = thread % chunks;
    int32_t global_row = item.row_begin + first_row + thread / chunks;
    int32_t token = item.token_begin + global_row / group;
    int32_t head_in_group = global_row % group;
    const float *group_q = args.q + (int64_t)kv_head * group * HD + chunk * 8;
#pragma unroll
    for (int first = 0; first < per_thread; first += batch) {
        float4 low[batch];
        float4 high[batch];
#pragma unroll
        for (int k = 0; k < batch; ++k) {
            low[k] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            high[k] = low[k];
            if (global_row < total_rows) {
                const float *q = group_q + (int64_t)token * args.q_stride + head_in_group * HD;
                low[k] = *reinterpret_cast<const float4 *>(q);
                high[k] = *reinterpret_cast<const float4 *>(q + 4);
            }
            global_row += rows_a_step;
            head_in_group += rows_a_step;
            while (head_in_group >= group) {
                head_in_group -= group;
                ++token;
            }
        }
#pragma unroll
        for (int k = 0; k < batch; ++k) {
            const int idx = thread + (first + k) * THREADS;
            glmrt_attn_store_q_values(q_tile + glmrt_attn_tile_rows<HD, PANELS>::offset(idx / chunks, idx % chunks),
                                      low[k], high[k], q_scale);
        }
    }
}

template <int MT, int H, int HD, int TILES>
__device__ __forceinline__ void glmrt_prefill_fold_row(glmrt_prefill_state<HD, TILES> &st, float *row_out, float2 *merged,
                                                       bool first)
{
    constexpr int n_tiles = HD / 8;
    const float chunk_max = st.run_max[MT][H];
    const float chunk_sum = st.sum_frag[MT][2 * H];
    if (first) {
#pragma unroll
        for (int n = 0; n < n_tiles; ++n) {
            *reinterpret_cast<float2 *>(row_out + 8 * n) = make_float2(st.acc[MT][n][2 * H], st.acc[MT][n][2 * H + 1]);
        }
        *merged = make_float2(chunk_max, chunk_sum);
    } else {
        float2 state = *merged;
        glmrt_attn_fold_weights w = glmrt_attn_fold_weigh(state.x, chunk_max);
#pragma unroll
        for (int n = 0; n < n_tiles; ++n) {
            float2 old = *reinterpret_cast<float2 *>(row_out + 8 * n);
            old.x = glmrt_attn_fold_value(old.x, st.acc[MT][n][2 * H], w);
            old.y = glmrt_attn_fold_value(old.y, st.acc[MT][n][2 * H + 1], w);
            *reinterpret_cast<float2 *>(row_out + 8 * n) = old;
        }
        *merged = make_float2(w.max, glmrt_attn_fold_value(state.y, chunk_sum, w));
    }
#pragma unroll
    for (int n = 0; n < n_tiles; ++n) {
        st.acc[MT][n][2 * H] = 0.0f;
        st.acc[MT][n][2 * H + 1] = 0.0f;
    }
    st.sum_frag[MT][2 * H] = 0.0f;
    st.sum_frag[MT][2 * H + 1] = 0.0f;
    st.run_max[MT][H] = -INFINITY;
}

template <int MT, int H, int HD, int TILES>
__device__ __forceinline__ void glmrt_prefill_finish_row(const glmrt_prefill_state<HD, TILES> &st, float *row_out,
                                                         const float2 *merged, bool folded)
{
    constexpr int n_tiles = HD / 8;
    const float chunk_sum = st.sum_frag[MT][2 * H];
    if (!folded) {
#pragma unroll
        for (int n = 0; n < n_tiles; ++n) {
            *reinterpret_cast<float2 *>(row_out + 8 * n) =
                make_float2(glmrt_attn_normalize(st.acc[MT][n][2 * H], chunk_sum),
                            glmrt_attn_normalize(st.acc[MT][n][2 * H + 1], chunk_sum));
        }
        return;
    }
    float2 state = *merged;
    glmrt_attn_fold_weights w = glmrt_attn_fold_weigh(state.x, st.run_max[MT][H]);
    float total = glmrt_attn_fold_value(state.y, chunk_sum, w);
#pragma unroll
    for (int n = 0; n < n_tiles; ++n) {
        float2 old = *reinterpret_cast<float2 *>(row_out + 8 * n);
        old.x = glmrt_attn_normalize(glmrt_attn_fold_value(old.x, st.acc[MT][n][2 * H], w), total);
        old.y = glmrt_attn_normalize(glmrt_attn_fold_value(old.y, st.acc[MT][n][2 * H + 1], w), total);
        *reinterpret_cast<float2 *>(row_out + 8 * n) = old;
    }
}

__device__ __forceinline__ float *glmrt_prefill_row_out(const glmrt_cuda_attention_args &args,
                                                        const glmrt_cuda_attention_item &item, int32_t kv_head,
                                                        int32_t row, int head_dim, int t)
{
    int32_t global_row = item.row_begin + row;
    int32_t token = item.token_begin + global_row / args.group;
    int64_t head = (int64_t)kv_head * args.group + global_row % args.group;
    return args.out + (int64_t)token * args.out_stride + head * head_dim + 2 * t;
}

template <int MT, int H, int HD, int TILES>
__device__ __forceinline__ void glmrt_prefill_boundary_row(glmrt_prefill_state<HD, TILES> &st,
                                                           const glmrt_cuda_attention_args &args,
                                                           const glmrt_cuda_attention_item &item, int32_t kv_head,
                                                           const int32_t *row_keys, const int32_t *row_span,
                                                           float2 *fold, int row_base, int32_t tile_start, int g, int t)
{
    const int row = row_base + 16 * MT + g + 8 * H;
    const int32_t span = row_span[row];
    const bool real_row = item.row_begin + row < item.num_tokens * args.group;
    if (real_row && tile_start < row_keys[row] && tile_start % span == 0) {
        float *row_out = glmrt_prefill_row_out(args, item, kv_head, row, HD, t);
        glmrt_prefill_fold_row<MT, H>(st, row_out, &fold[row * 4 + t], tile_start == span);
    }
}

template <int MT, int HD, int TILES>
__device__ __forceinline__ void glmrt_prefill_softmax(glmrt_prefill_state<HD, TILES> &st, float (*score)[4], float *alpha,
                                                      bool masked, const int32_t *row_keys, int row, int32_t key0)
{
    constexpr int key_tiles = GLMRT_ATTENTION_KEY_TILE / 8;
    const int32_t limit_top = masked ? row_keys[row] : 0;
    const int32_t limit_bottom = masked ? row_keys[row + 8] : 0;
    float new_max = glmrt_attn_row_softmax<key_tiles, 0>(score, st.run_max[MT][0], masked, limit_top, key0);
    alpha[0] = glmrt_attn_rescale(st.run_max[MT][0], new_max);
    st.run_max[MT][0] = new_max;
    new_max = glmrt_attn_row_softmax<key_tiles, 1>(score, st.run_max[MT][1], masked, limit_bottom, key0);
    alpha[1] = glmrt_attn_rescale(st.run_max[MT][1], new_max);
    st.run_max[MT][1] = new_max;
}

#endif
