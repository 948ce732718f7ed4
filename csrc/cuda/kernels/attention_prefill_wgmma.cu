#include "dependent_launch.cuh"
#include "attention_kernels.cuh"
#include "attention_prefill_rows.cuh"
#include "attention_tile.cuh"
#include "cuda_check.cuh"
#include "device_arch.cuh"
#include "wgmma_ops.cuh"

#define GLMRT_WGMMA_PREFILL_CONSUMERS 2
#define GLMRT_WGMMA_PREFILL_GROUP_THREADS 128
#define GLMRT_WGMMA_PREFILL_THREADS ((GLMRT_WGMMA_PREFILL_CONSUMERS + 1) * GLMRT_WGMMA_PREFILL_GROUP_THREADS)
#define GLMRT_WGMMA_PREFILL_GROUP_ROWS 64
#define GLMRT_WGMMA_PREFILL_WARP_ROWS 16
#define GLMRT_WGMMA_PREFILL_STAGES 3
#define GLMRT_WGMMA_PREFILL_PRODUCER_REGISTERS 40
#define GLMRT_WGMMA_PREFILL_CONSUMER_REGISTERS 232
#define GLMRT_WGMMA_PREFILL_ONES_BYTES 1024
#define GLMRT_WGMMA_PREFILL_FIRST_CONSUMER_BARRIER 1
#define GLMRT_WGMMA_PREFILL_KEY_STEP_BYTES (16 * GLMRT_ATTN_PANEL_ROW_BYTES)

template <int HD>
struct glmrt_wgmma_prefill_shape {
    static constexpr int rows = GLMRT_ATTENTION_PREFILL_ROWS;
    static constexpr int chunks = HD / 8;
    static constexpr int k_steps = HD / 16;
    static constexpr int key_tiles = GLMRT_ATTENTION_KEY_TILE / 8;
    static constexpr int value_tiles = HD / 8;
    static constexpr int value_steps = GLMRT_ATTENTION_KEY_TILE / 16;
    static constexpr int tile_bytes = GLMRT_ATTENTION_KEY_TILE * HD * 2;
    static constexpr int stage_bytes = 2 * tile_bytes;
    static constexpr int group_q_bytes = GLMRT_WGMMA_PREFILL_GROUP_ROWS * HD * 2;
    static constexpr int q_offset = GLMRT_WGMMA_PREFILL_STAGES * stage_bytes;
    static constexpr int ones_offset = q_offset + GLMRT_WGMMA_PREFILL_CONSUMERS * group_q_bytes;
    static constexpr int keys_offset = ones_offset + GLMRT_WGMMA_PREFILL_ONES_BYTES;
    static constexpr int span_offset = keys_offset + rows * 4;
    static constexpr int merged_offset = span_offset + rows * 4;
    static constexpr int group_merged_pairs = GLMRT_WGMMA_PREFILL_GROUP_THREADS * ((HD / 8) * 2 + 2);
    static constexpr int merged_bytes = GLMRT_WGMMA_PREFILL_CONSUMERS * group_merged_pairs * (int)sizeof(float2);
    static constexpr int barrier_offset = merged_offset + merged_bytes;
    static constexpr int item_offset = barrier_offset + 2 * GLMRT_WGMMA_PREFILL_STAGES * 8;
    static constexpr size_t shared_bytes =
        (size_t)item_offset + sizeof(glmrt_cuda_attention_item) + GLMRT_ATTN_SMEM_ALIGN;
    static_assert(HD == 64 || HD == 128, "key tiles of whole 64-column panels");
    static_assert(GLMRT_ATTN_PANEL_BYTES == GLMRT_WGMMA_PREFILL_GROUP_ROWS * GLMRT_ATTN_PANEL_ROW_BYTES,
                  "query and key panels share one layout");
    static_assert(rows == GLMRT_WGMMA_PREFILL_CONSUMERS * GLMRT_WGMMA_PREFILL_GROUP_ROWS, "rows a block");
    static_assert(GLMRT_WGMMA_PREFILL_GROUP_ROWS <= GLMRT_WGMMA_PREFILL_GROUP_THREADS, "one consumer thread sets up each row");
    static_assert(shared_bytes <= 227 * 1024, "one block an SM");
};

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

typedef struct glmrt_wgmma_prefill_smem {
    uint32_t base;
    uint8_t *aligned;
    int32_t *row_keys;
    int32_t *row_span;
    float2 *merged;
    uint64_t *full;
    uint64_t *empty;
} glmrt_wgmma_prefill_smem;

template <int HD>
__device__ __forceinline__ glmrt_wgmma_prefill_smem glmrt_wgmma_prefill_layout(uint8_t *shared)
{
    using shape = glmrt_wgmma_prefill_shape<HD>;
    glmrt_wgmma_prefill_smem m;
    const uint32_t raw = glmrt_attn_smem_address(shared);
    m.base = glmrt_attn_smem_align(raw);
    m.aligned = shared + (m.base - raw);
    m.row_keys = reinterpret_cast<int32_t *>(m.aligned + shape::keys_offset);
    m.row_span = reinterpret_cast<int32_t *>(m.aligned + shape::span_offset);
    m.merged = reinterpret_cast<float2 *>(m.aligned + shape::merged_offset);
    m.full = reinterpret_cast<uint64_t *>(m.aligned + shape::barrier_offset);
    m.empty = m.full + GLMRT_WGMMA_PREFILL_STAGES;
    return m;
}

__device__ __forceinline__ uint32_t glmrt_wgmma_prefill_k_tile(uint32_t base, int32_t tile, int stage_bytes)
{
    return base + (uint32_t)((tile % GLMRT_WGMMA_PREFILL_STAGES) * stage_bytes);
}

typedef struct glmrt_wgmma_prefill_lows {
    uint32_t queries;
    uint32_t ones;
    uint32_t keys;
    uint32_t values;
} glmrt_wgmma_prefill_lows;

template <int HD>
__device__ __forceinline__ glmrt_wgmma_prefill_lows glmrt_wgmma_prefill_lows_at(const glmrt_wgmma_prefill_smem &m,
                                                                               uint32_t q_tile)
{
    using shape = glmrt_wgmma_prefill_shape<HD>;
    glmrt_wgmma_prefill_lows lows;
    lows.queries = glmrt_wgmma_descriptor_low(q_tile, 16);
    lows.ones = glmrt_wgmma_descriptor_low(m.base + (uint32_t)shape::ones_offset, 16);
    lows.keys = glmrt_wgmma_descriptor_low(m.base, 16);
    lows.values = glmrt_wgmma_descriptor_low(m.base + (uint32_t)shape::tile_bytes, GLMRT_ATTN_PANEL_BYTES);
    return lows;
}

template <int HD>
__device__ __forceinline__ uint32_t glmrt_wgmma_prefill_stage_low(uint32_t first_stage_low, int32_t tile)
{
    using shape = glmrt_wgmma_prefill_shape<HD>;
    return first_stage_low +
           (uint32_t)(tile % GLMRT_WGMMA_PREFILL_STAGES) * glmrt_wgmma_descriptor_low_step((uint32_t)shape::stage_bytes);
}

template <int HD>
struct glmrt_wgmma_prefill_feed {
    using layout = glmrt_attn_tile_layout<HD, GLMRT_WGMMA_PREFILL_GROUP_THREADS>;
    const int32_t *pages;
    const char *keys;
    int64_t page_bytes;
    int32_t value_bytes;
    int32_t page_mask;
    int32_t page_shift;
    int32_t first_row;
    uint32_t first_offset;
};

template <int HD>
__device__ __forceinline__ glmrt_wgmma_prefill_feed<HD> glmrt_wgmma_prefill_feed_of(const glmrt_cuda_attention_args &args,
                                                                                     const glmrt_cuda_attention_item &item)
{
    using feed_t = glmrt_wgmma_prefill_feed<HD>;
    using layout = typename feed_t::layout;
    const int chunk = threadIdx.x % layout::chunks;
    feed_t feed;
    feed.pages = args.page_ids + item.page_begin;
    feed.keys = glmrt_attn_head_keys(args, (int32_t)blockIdx.y) + chunk * 16;
    feed.page_bytes = 2 * (int64_t)args.kv.page_elements;
    feed.value_bytes = glmrt_attn_value_bytes(args);
    feed.page_mask = args.kv.page_size - 1;
    feed.page_shift = __ffs(args.kv.page_size) - 1;
    feed.first_row = (int)threadIdx.x / layout::chunks;
    feed.first_offset = glmrt_attn_panel_offset(feed.first_row, chunk);
    return feed;
}

template <int HD>
__device__ __forceinline__ void glmrt_wgmma_prefill_feed_pages(const glmrt_wgmma_prefill_feed<HD> &feed,
                                                               int32_t tile_start, int32_t key_end, int32_t *ids)
{
    using layout = typename glmrt_wgmma_prefill_feed<HD>::layout;
#pragma unroll
    for (int pass = 0; pass < layout::passes; ++pass) {
        const int32_t key = tile_start + feed.first_row + pass * layout::keys_per_pass;
        ids[pass] = key < key_end ? __ldg(feed.pages + (key >> feed.page_shift)) : 0;
    }
}

template <int HD>
__device__ __forceinline__ void glmrt_wgmma_prefill_fetch_pages(const glmrt_wgmma_prefill_feed<HD> &feed,
                                                                int32_t page_size, bool paged_by_shift,
                                                                int32_t tile_start, int32_t key_end, int32_t *ids)
{
    if (paged_by_shift) {
        glmrt_wgmma_prefill_feed_pages<HD>(feed, tile_start, key_end, ids);
    } else {
        glmrt_attn_fetch_pass_pages<HD, GLMRT_WGMMA_PREFILL_GROUP_THREADS>(feed.pages, page_size, tile_start, key_end, ids);
    }
}

template <int HD>
__device__ __forceinline__ void glmrt_wgmma_prefill_feed_tile(const glmrt_wgmma_prefill_feed<HD> &feed,
                                                              int32_t tile_start, const int32_t *ids, uint32_t k_tile,
                                                              uint32_t v_tile)
{
    using layout = typename glmrt_wgmma_prefill_feed<HD>::layout;
#pragma unroll
    for (int pass = 0; pass < layout::passes; ++pass) {
        const int32_t key = tile_start + feed.first_row + pass * layout::keys_per_pass;
        const char *src = feed.keys + (int64_t)ids[pass] * feed.page_bytes + (key & feed.page_mask) * (HD * 2);
        const uint32_t offset = feed.first_offset + (uint32_t)(pass * layout::keys_per_pass * GLMRT_ATTN_PANEL_ROW_BYTES);
        glmrt_attn_cp_async(k_tile + offset, src);
        glmrt_attn_cp_async(v_tile + offset, src + feed.value_bytes);
    }
}

template <int HD>
__device__ __forceinline__ void glmrt_wgmma_prefill_produce(const glmrt_cuda_attention_args &args,
                                                            const glmrt_cuda_attention_item &item,
                                                            const glmrt_wgmma_prefill_smem &m)
{
    using shape = glmrt_wgmma_prefill_shape<HD>;
    using layout = glmrt_attn_tile_layout<HD, GLMRT_WGMMA_PREFILL_GROUP_THREADS>;
    const glmrt_wgmma_prefill_feed<HD> feed = glmrt_wgmma_prefill_feed_of<HD>(args, item);
    const bool paged_by_shift = (args.kv.page_size & feed.page_mask) == 0;
    const int32_t num_tiles = (item.key_end + GLMRT_ATTENTION_KEY_TILE - 1) / GLMRT_ATTENTION_KEY_TILE;
    int32_t ids[layout::passes];
    glmrt_wgmma_prefill_fetch_pages<HD>(feed, args.kv.page_size, paged_by_shift, 0, item.key_end, ids);
    for (int32_t tile = 0; tile < num_tiles; ++tile) {
        if (tile >= GLMRT_WGMMA_PREFILL_STAGES) {
            glmrt_mbarrier_wait(&m.empty[tile % GLMRT_WGMMA_PREFILL_STAGES],
                                (uint32_t)((tile / GLMRT_WGMMA_PREFILL_STAGES - 1) & 1));
        }
        const uint32_t k_tile = glmrt_wgmma_prefill_k_tile(m.base, tile, shape::stage_bytes);
        const int32_t tile_start = tile * GLMRT_ATTENTION_KEY_TILE;
        const int32_t next_start = tile_start + GLMRT_ATTENTION_KEY_TILE;
        if (paged_by_shift && next_start <= item.key_end) {
            glmrt_wgmma_prefill_feed_tile<HD>(feed, tile_start, ids, k_tile, k_tile + shape::tile_bytes);
        } else {
            glmrt_attn_load_kv_tile<HD, GLMRT_WGMMA_PREFILL_GROUP_THREADS, true>(
                args, blockIdx.y, tile_start, item.key_end, [&ids](int pass, int32_t) { return ids[pass]; }, k_tile,
                k_tile + shape::tile_bytes);
        }
        glmrt_attn_cp_async_arrive(glmrt_shared_address(&m.full[tile % GLMRT_WGMMA_PREFILL_STAGES]));
        if (tile + 1 < num_tiles) {
            glmrt_wgmma_prefill_fetch_pages<HD>(feed, args.kv.page_size, paged_by_shift, next_start, item.key_end, ids);
        }
    }
    glmrt_attn_cp_async_wait_all();
}

__device__ __forceinline__ int32_t glmrt_wgmma_prefill_row_keys(const glmrt_cuda_attention_args &args,
                                                                 const glmrt_cuda_attention_item &item, int row)
{
    const int32_t global_row = item.row_begin + row;
    if (global_row < item.num_tokens * args.group) {
        return args.positions[item.token_begin + global_row / args.group] + 1;
    }
    return item.key_end;
}

__device__ __forceinline__ int2 glmrt_wgmma_prefill_key_bounds(const int32_t *row_keys, int first, int count, int lane)
{
    int32_t low = INT32_MAX;
    int32_t high = 0;
    for (int r = lane; r < count; r += 32) {
        low = min(low, row_keys[first + r]);
        high = max(high, row_keys[first + r]);
    }
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
        low = min(low, __shfl_xor_sync(0xffffffffu, low, offset));
        high = max(high, __shfl_xor_sync(0xffffffffu, high, offset));
    }
    return make_int2(low, high);
}

template <int HD>
__device__ __forceinline__ void glmrt_wgmma_prefill_scores(float *score, uint32_t q_low, uint32_t k_low)
{
    using shape = glmrt_wgmma_prefill_shape<HD>;
    glmrt_wgmma_fence();
    glmrt_wgmma_bf16_m64n64_fresh(score, glmrt_wgmma_descriptor_of_low(q_low), glmrt_wgmma_descriptor_of_low(k_low));
#pragma unroll
    for (int ks = 1; ks < shape::k_steps; ++ks) {
        const uint32_t step = glmrt_wgmma_descriptor_low_step((uint32_t)((ks >> 2) * GLMRT_ATTN_PANEL_BYTES + (ks & 3) * 32));
        glmrt_wgmma_bf16_m64n64(score, glmrt_wgmma_descriptor_of_low(q_low + step),
                                glmrt_wgmma_descriptor_of_low(k_low + step), 1);
    }
    glmrt_wgmma_commit();
}

template <int HD>
__device__ __forceinline__ void glmrt_wgmma_prefill_values(glmrt_prefill_state<HD, 1> &st, uint32_t (*pa)[4],
                                                           uint32_t v_low, uint32_t ones_low)
{
    using shape = glmrt_wgmma_prefill_shape<HD>;
    glmrt_wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < shape::value_steps; ++ks) {
        const uint32_t value_step = glmrt_wgmma_descriptor_low_step((uint32_t)(ks * GLMRT_WGMMA_PREFILL_KEY_STEP_BYTES));
        const uint32_t ones_step = glmrt_wgmma_descriptor_low_step((uint32_t)(ks * 32));
        glmrt_wgmma_bf16_rs_trans_b<HD>(&st.acc[0][0][0], pa[ks], glmrt_wgmma_descriptor_of_low(v_low + value_step), 1);
        glmrt_wgmma_bf16_rs_m64n8(st.sum_frag[0], pa[ks], glmrt_wgmma_descriptor_of_low(ones_low + ones_step), 1);
    }
    glmrt_wgmma_commit();
}

template <int HD>
__device__ __forceinline__ void glmrt_wgmma_prefill_settle_values(glmrt_prefill_state<HD, 1> &st)
{
    glmrt_wgmma_wait_all();
    glmrt_wgmma_fence_registers<HD / 2>(&st.acc[0][0][0]);
    glmrt_wgmma_fence_registers<4>(st.sum_frag[0]);
}

template <int HD>
__device__ __forceinline__ void glmrt_wgmma_prefill_weigh(glmrt_prefill_state<HD, 1> &st, float (*score)[4],
                                                          uint32_t (*pa)[4], bool masked, const int32_t *row_keys,
                                                          int row, int32_t key0)
{
    using shape = glmrt_wgmma_prefill_shape<HD>;
    float alpha[2];
    glmrt_prefill_softmax<0>(st, score, alpha, masked, row_keys, row, key0);
    glmrt_wgmma_prefill_settle_values<HD>(st);
    if (__any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f)) {
#pragma unroll
        for (int n = 0; n < shape::value_tiles; ++n) {
            glmrt_attn_scale_rows(st.acc[0][n], alpha);
        }
        glmrt_attn_scale_rows(st.sum_frag[0], alpha);
    }
#pragma unroll
    for (int ks = 0; ks < shape::value_steps; ++ks) {
        glmrt_attn_weights_to_a(pa[ks], score[2 * ks], score[2 * ks + 1]);
    }
}

template <int HD>
struct glmrt_wgmma_prefill_merged {
    float2 *values;
    float2 *stats;
};

template <int HD>
__device__ __forceinline__ glmrt_wgmma_prefill_merged<HD> glmrt_wgmma_prefill_merged_at(const glmrt_wgmma_prefill_smem &m,
                                                                                         int consumer, int thread)
{
    glmrt_wgmma_prefill_merged<HD> merged;
    float2 *group = m.merged + consumer * glmrt_wgmma_prefill_shape<HD>::group_merged_pairs;
    merged.values = group + thread;
    merged.stats = group + (HD / 8) * 2 * GLMRT_WGMMA_PREFILL_GROUP_THREADS + thread;
    return merged;
}

template <int H, int HD>
__device__ __forceinline__ float2 &glmrt_wgmma_prefill_merged_value(const glmrt_wgmma_prefill_merged<HD> &merged, int n)
{
    return merged.values[(2 * n + H) * GLMRT_WGMMA_PREFILL_GROUP_THREADS];
}

template <int H, int HD>
__device__ __forceinline__ float2 &glmrt_wgmma_prefill_merged_stat(const glmrt_wgmma_prefill_merged<HD> &merged)
{
    return merged.stats[H * GLMRT_WGMMA_PREFILL_GROUP_THREADS];
}

template <int H, int HD>
__device__ __forceinline__ void glmrt_wgmma_prefill_fold(glmrt_prefill_state<HD, 1> &st,
                                                         const glmrt_wgmma_prefill_merged<HD> &merged, bool first)
{
    const float chunk_max = st.run_max[0][H];
    const float chunk_sum = st.sum_frag[0][2 * H];
    float2 &stat = glmrt_wgmma_prefill_merged_stat<H>(merged);
    if (first) {
#pragma unroll
        for (int n = 0; n < HD / 8; ++n) {
            glmrt_wgmma_prefill_merged_value<H>(merged, n) = make_float2(st.acc[0][n][2 * H], st.acc[0][n][2 * H + 1]);
        }
        stat = make_float2(chunk_max, chunk_sum);
    } else {
        const float2 state = stat;
        const glmrt_attn_fold_weights w = glmrt_attn_fold_weigh(state.x, chunk_max);
#pragma unroll
        for (int n = 0; n < HD / 8; ++n) {
            float2 &value = glmrt_wgmma_prefill_merged_value<H>(merged, n);
            const float2 old = value;
            value = make_float2(glmrt_attn_fold_value(old.x, st.acc[0][n][2 * H], w),
                                glmrt_attn_fold_value(old.y, st.acc[0][n][2 * H + 1], w));
        }
        stat = make_float2(w.max, glmrt_attn_fold_value(state.y, chunk_sum, w));
    }
#pragma unroll
    for (int n = 0; n < HD / 8; ++n) {
        st.acc[0][n][2 * H] = 0.0f;
        st.acc[0][n][2 * H + 1] = 0.0f;
    }
    st.sum_frag[0][2 * H] = 0.0f;
    st.sum_frag[0][2 * H + 1] = 0.0f;
    st.run_max[0][H] = -INFINITY;
}

template <int H, int HD>
__device__ __forceinline__ void glmrt_wgmma_prefill_boundary_row(glmrt_prefill_state<HD, 1> &st,
                                                                 const glmrt_wgmma_prefill_merged<HD> &merged,
                                                                 const glmrt_cuda_attention_item &item,
                                                                 const glmrt_wgmma_prefill_smem &m, int32_t group,
                                                                 int row, int32_t tile_start)
{
    const int32_t span = m.row_span[row];
    const bool real_row = item.row_begin + row < item.num_tokens * group;
    if (real_row && tile_start < m.row_keys[row] && tile_start % span == 0) {
        glmrt_wgmma_prefill_fold<H>(st, merged, tile_start == span);
    }
}

template <int HD>
__device__ __forceinline__ void glmrt_wgmma_prefill_store_row(const float (&values)[HD / 8][2], float total,
                                                              float *row_out)
{
    bool in_range = glmrt_attn_quotient_operand(total);
#pragma unroll
    for (int n = 0; n < HD / 8; ++n) {
        in_range = in_range && glmrt_attn_quotient_operand(values[n][0]) && glmrt_attn_quotient_operand(values[n][1]);
    }
    if (in_range) {
        const float reciprocal = glmrt_attn_refined_reciprocal(total);
#pragma unroll
        for (int n = 0; n < HD / 8; ++n) {
            *reinterpret_cast<float2 *>(row_out + 8 * n) =
                make_float2(glmrt_attn_quotient_by(values[n][0], total, reciprocal),
                            glmrt_attn_quotient_by(values[n][1], total, reciprocal));
        }
        return;
    }
#pragma unroll
    for (int n = 0; n < HD / 8; ++n) {
        *reinterpret_cast<float2 *>(row_out + 8 * n) =
            make_float2(glmrt_attn_normalize(values[n][0], total), glmrt_attn_normalize(values[n][1], total));
    }
}

template <int H, int HD>
__device__ __forceinline__ void glmrt_wgmma_prefill_finish_row(const glmrt_prefill_state<HD, 1> &st,
                                                               const glmrt_wgmma_prefill_merged<HD> &merged,
                                                               float *row_out, bool folded)
{
    const float chunk_sum = st.sum_frag[0][2 * H];
    float values[HD / 8][2];
    if (!folded) {
#pragma unroll
        for (int n = 0; n < HD / 8; ++n) {
            values[n][0] = st.acc[0][n][2 * H];
            values[n][1] = st.acc[0][n][2 * H + 1];
        }
        glmrt_wgmma_prefill_store_row<HD>(values, chunk_sum, row_out);
        return;
    }
    const float2 state = glmrt_wgmma_prefill_merged_stat<H>(merged);
    const glmrt_attn_fold_weights w = glmrt_attn_fold_weigh(state.x, st.run_max[0][H]);
    const float total = glmrt_attn_fold_value(state.y, chunk_sum, w);
#pragma unroll
    for (int n = 0; n < HD / 8; ++n) {
        const float2 old = glmrt_wgmma_prefill_merged_value<H>(merged, n);
        values[n][0] = glmrt_attn_fold_value(old.x, st.acc[0][n][2 * H], w);
        values[n][1] = glmrt_attn_fold_value(old.y, st.acc[0][n][2 * H + 1], w);
    }
    glmrt_wgmma_prefill_store_row<HD>(values, total, row_out);
}

template <int HD>
__device__ __forceinline__ void glmrt_wgmma_prefill_finish(const glmrt_prefill_state<HD, 1> &st,
                                                           const glmrt_wgmma_prefill_merged<HD> &merged,
                                                           const glmrt_cuda_attention_args &args,
                                                           const glmrt_cuda_attention_item &item,
                                                           const glmrt_wgmma_prefill_smem &m, int row_base, int g,
                                                           int t)
{
    const int32_t total_rows = item.num_tokens * args.group;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int row = row_base + g + 8 * h;
        if (item.row_begin + row >= total_rows) {
            continue;
        }
        float *row_out = glmrt_prefill_row_out(args, item, blockIdx.y, row, HD, t);
        const bool folded = m.row_keys[row] > m.row_span[row];
        if (h == 0) {
            glmrt_wgmma_prefill_finish_row<0>(st, merged, row_out, folded);
        } else {
            glmrt_wgmma_prefill_finish_row<1>(st, merged, row_out, folded);
        }
    }
}

template <int HD>
__device__ __forceinline__ void glmrt_wgmma_prefill_prepare_rows(const glmrt_cuda_attention_args &args,
                                                                 const glmrt_cuda_attention_item &item,
                                                                 const glmrt_wgmma_prefill_smem &m, int consumer,
                                                                 int thread, uint32_t q_tile)
{
    const int setup_row = consumer * GLMRT_WGMMA_PREFILL_GROUP_ROWS + thread;
    const bool sets_up_row = thread < GLMRT_WGMMA_PREFILL_GROUP_ROWS;
    const int32_t setup_keys = sets_up_row ? glmrt_wgmma_prefill_row_keys(args, item, setup_row) : 0;
    glmrt_prefill_load_queries<HD, GLMRT_WGMMA_PREFILL_GROUP_ROWS, GLMRT_WGMMA_PREFILL_GROUP_THREADS, true>(
        args, item, blockIdx.y, consumer * GLMRT_WGMMA_PREFILL_GROUP_ROWS, q_tile, thread);
    if (sets_up_row) {
        m.row_keys[setup_row] = setup_keys;
        m.row_span[setup_row] = glmrt_attention_split_span(setup_keys, item.split_keys, item.max_splits);
    }
    glmrt_fence_async_shared();
    glmrt_named_barrier(GLMRT_WGMMA_PREFILL_FIRST_CONSUMER_BARRIER + consumer, GLMRT_WGMMA_PREFILL_GROUP_THREADS);
}

template <int HD>
__device__ __forceinline__ void glmrt_wgmma_prefill_state_clear(glmrt_prefill_state<HD, 1> &st)
{
#pragma unroll
    for (int n = 0; n < HD / 8; ++n) {
        st.acc[0][n][0] = st.acc[0][n][1] = st.acc[0][n][2] = st.acc[0][n][3] = 0.0f;
    }
    st.sum_frag[0][0] = st.sum_frag[0][1] = st.sum_frag[0][2] = st.sum_frag[0][3] = 0.0f;
    st.run_max[0][0] = st.run_max[0][1] = -INFINITY;
}

template <int HD>
__device__ __forceinline__ void glmrt_wgmma_prefill_boundary_rows(glmrt_prefill_state<HD, 1> &st,
                                                                  const glmrt_wgmma_prefill_merged<HD> &merged,
                                                                  const glmrt_cuda_attention_item &item,
                                                                  const glmrt_wgmma_prefill_smem &m, int32_t group,
                                                                  int row, int32_t tile_start)
{
    glmrt_wgmma_prefill_boundary_row<0>(st, merged, item, m, group, row, tile_start);
    glmrt_wgmma_prefill_boundary_row<1>(st, merged, item, m, group, row + 8, tile_start);
}

__device__ __forceinline__ void glmrt_wgmma_prefill_pass_tiles(const glmrt_wgmma_prefill_smem &m, int32_t first,
                                                               int32_t end, int lane)
{
    for (int32_t i = first; i < end; ++i) {
        glmrt_mbarrier_wait(&m.full[i % GLMRT_WGMMA_PREFILL_STAGES], (uint32_t)((i / GLMRT_WGMMA_PREFILL_STAGES) & 1));
        if (lane == 0) {
            glmrt_mbarrier_arrive(&m.empty[i % GLMRT_WGMMA_PREFILL_STAGES]);
        }
    }
}

template <int HD>
__device__ __forceinline__ void glmrt_wgmma_prefill_consume(const glmrt_cuda_attention_args &args,
                                                            const glmrt_cuda_attention_item &item,
                                                            const glmrt_wgmma_prefill_smem &m, int consumer)
{
    using shape = glmrt_wgmma_prefill_shape<HD>;
    const int thread = (int)threadIdx.x % GLMRT_WGMMA_PREFILL_GROUP_THREADS;
    const int warp = thread >> 5;
    const int lane = thread & 31;
    const int g = lane >> 2;
    const int t = lane & 3;
    const uint32_t q_tile = m.base + (uint32_t)(shape::q_offset + consumer * shape::group_q_bytes);
    glmrt_wgmma_prefill_prepare_rows<HD>(args, item, m, consumer, thread, q_tile);
    const glmrt_wgmma_prefill_lows lows = glmrt_wgmma_prefill_lows_at<HD>(m, q_tile);
    const int group_first = consumer * GLMRT_WGMMA_PREFILL_GROUP_ROWS;
    const int row_base = group_first + warp * GLMRT_WGMMA_PREFILL_WARP_ROWS;
    const int32_t group_max_keys = glmrt_wgmma_prefill_key_bounds(m.row_keys, group_first, GLMRT_WGMMA_PREFILL_GROUP_ROWS, lane).y;
    const int2 warp_keys = glmrt_wgmma_prefill_key_bounds(m.row_keys, row_base, GLMRT_WGMMA_PREFILL_WARP_ROWS, lane);
    glmrt_prefill_state<HD, 1> st;
    const glmrt_wgmma_prefill_merged<HD> merged = glmrt_wgmma_prefill_merged_at<HD>(m, consumer, thread);
    glmrt_wgmma_prefill_state_clear<HD>(st);
    const int32_t num_tiles = (item.key_end + GLMRT_ATTENTION_KEY_TILE - 1) / GLMRT_ATTENTION_KEY_TILE;
    const int32_t active_tiles =
        min(num_tiles, (group_max_keys + GLMRT_ATTENTION_KEY_TILE - 1) / GLMRT_ATTENTION_KEY_TILE);
    float score[shape::key_tiles][4];
    uint32_t pa[shape::value_steps][4];
    if (active_tiles > 0) {
        glmrt_mbarrier_wait(&m.full[0], 0);
        glmrt_fence_async_shared();
        glmrt_wgmma_prefill_scores<HD>(&score[0][0], lows.queries, lows.keys);
        glmrt_wgmma_wait_all();
        glmrt_wgmma_fence_registers<GLMRT_ATTENTION_KEY_TILE / 2>(&score[0][0]);
        glmrt_wgmma_prefill_weigh<HD>(st, score, pa, GLMRT_ATTENTION_KEY_TILE > warp_keys.x, m.row_keys, row_base + g,
                                      2 * t);
    }
    int32_t next_boundary = item.split_keys;
    for (int32_t i = 0; i + 1 < active_tiles; ++i) {
        const int32_t next = i + 1;
        const int32_t next_start = next * GLMRT_ATTENTION_KEY_TILE;
        glmrt_mbarrier_wait(&m.full[next % GLMRT_WGMMA_PREFILL_STAGES],
                            (uint32_t)((next / GLMRT_WGMMA_PREFILL_STAGES) & 1));
        glmrt_fence_async_shared();
        glmrt_wgmma_prefill_scores<HD>(&score[0][0], lows.queries, glmrt_wgmma_prefill_stage_low<HD>(lows.keys, next));
        glmrt_wgmma_prefill_values<HD>(st, pa, glmrt_wgmma_prefill_stage_low<HD>(lows.values, i), lows.ones);
        glmrt_wgmma_wait_all_but_one();
        glmrt_wgmma_fence_registers<GLMRT_ATTENTION_KEY_TILE / 2>(&score[0][0]);
        if (next_start == next_boundary) {
            next_boundary += item.split_keys;
            glmrt_wgmma_prefill_settle_values<HD>(st);
            if (next_start < warp_keys.y) {
                glmrt_wgmma_prefill_boundary_rows<HD>(st, merged, item, m, args.group, row_base + g, next_start);
            }
        }
        glmrt_wgmma_prefill_weigh<HD>(st, score, pa, next_start + GLMRT_ATTENTION_KEY_TILE > warp_keys.x,
                                      m.row_keys, row_base + g, next_start + 2 * t);
        if (lane == 0) {
            glmrt_mbarrier_arrive(&m.empty[i % GLMRT_WGMMA_PREFILL_STAGES]);
        }
    }
    if (active_tiles > 0) {
        const int32_t last = active_tiles - 1;
        glmrt_wgmma_prefill_values<HD>(st, pa, glmrt_wgmma_prefill_stage_low<HD>(lows.values, last), lows.ones);
        glmrt_wgmma_prefill_settle_values<HD>(st);
        if (lane == 0) {
            glmrt_mbarrier_arrive(&m.empty[last % GLMRT_WGMMA_PREFILL_STAGES]);
        }
    }
    glmrt_wgmma_prefill_pass_tiles(m, active_tiles, num_tiles, lane);
    glmrt_wgmma_prefill_finish<HD>(st, merged, args, item, m, row_base, g, t);
}

template <int HD>
__device__ __forceinline__ void glmrt_wgmma_prefill_setup(const glmrt_cuda_attention_args &args,
                                                          const glmrt_wgmma_prefill_smem &m,
                                                          glmrt_cuda_attention_item *block_item)
{
    using shape = glmrt_wgmma_prefill_shape<HD>;
    if (threadIdx.x == 0) {
        *block_item = args.items[gridDim.x - 1 - blockIdx.x];
        for (int s = 0; s < GLMRT_WGMMA_PREFILL_STAGES; ++s) {
            glmrt_mbarrier_init(&m.full[s], GLMRT_WGMMA_PREFILL_GROUP_THREADS);
            glmrt_mbarrier_init(&m.empty[s], 4 * GLMRT_WGMMA_PREFILL_CONSUMERS);
        }
        glmrt_fence_barrier_init();
    }
    for (int i = threadIdx.x; i < GLMRT_WGMMA_PREFILL_ONES_BYTES / 4; i += GLMRT_WGMMA_PREFILL_THREADS) {
        glmrt_attn_store4(m.base + (uint32_t)(shape::ones_offset + 4 * i), GLMRT_ATTN_BF16X2_ONES);
    }
    glmrt_fence_async_shared();
    __syncthreads();
}

#endif

template <int HD>
__global__ void __launch_bounds__(GLMRT_WGMMA_PREFILL_THREADS, 1)
    glmrt_attention_prefill_wgmma_kernel(glmrt_cuda_attention_args args)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    glmrt_dependent_enter();
    using shape = glmrt_wgmma_prefill_shape<HD>;
    extern __shared__ __align__(128) uint8_t wgmma_prefill_shared[];
    const glmrt_wgmma_prefill_smem m = glmrt_wgmma_prefill_layout<HD>(wgmma_prefill_shared);
    glmrt_cuda_attention_item *block_item = reinterpret_cast<glmrt_cuda_attention_item *>(m.aligned + shape::item_offset);
    glmrt_wgmma_prefill_setup<HD>(args, m, block_item);
    const int group = (int)threadIdx.x / GLMRT_WGMMA_PREFILL_GROUP_THREADS;
    if (group == 0) {
        glmrt_registers_lower<GLMRT_WGMMA_PREFILL_PRODUCER_REGISTERS>();
        glmrt_wgmma_prefill_produce<HD>(args, *block_item, m);
    } else {
        glmrt_registers_raise<GLMRT_WGMMA_PREFILL_CONSUMER_REGISTERS>();
        glmrt_wgmma_prefill_consume<HD>(args, *block_item, m, group - 1);
    }
#endif
}

static glmrt_attention_kernel_choice glmrt_wgmma_prefill_pick(int32_t head_dim)
{
    glmrt_attention_kernel_choice choice = {nullptr, 0, GLMRT_WGMMA_PREFILL_THREADS, "tensor-core prefill attention"};
    switch (head_dim) {
    case 64:
        choice.kernel = glmrt_attention_prefill_wgmma_kernel<64>;
        choice.shared = glmrt_wgmma_prefill_shape<64>::shared_bytes;
        break;
    case 128:
        choice.kernel = glmrt_attention_prefill_wgmma_kernel<128>;
        choice.shared = glmrt_wgmma_prefill_shape<128>::shared_bytes;
        break;
    default: break;
    }
    return choice;
}

int glmrt_attention_prefill_wgmma_supported(int32_t head_dim)
{
    return glmrt_wgmma_prefill_pick(head_dim).kernel != nullptr;
}

glmrt_status glmrt_attention_prefill_wgmma_prepare(int32_t head_dim, glmrt_error *error)
{
    const glmrt_attention_kernel_choice choice = glmrt_wgmma_prefill_pick(head_dim);
    return glmrt_attention_kernel_prepare(&choice, head_dim, error);
}

glmrt_status glmrt_attention_prefill_wgmma_launch(const glmrt_cuda_attention_args *args, cudaStream_t stream,
                                                  glmrt_error *error)
{
    const glmrt_attention_kernel_choice choice = glmrt_wgmma_prefill_pick(args->kv.head_dim);
    return glmrt_attention_items_launch(&choice, args, dim3((unsigned)args->num_items, (unsigned)args->kv.num_kv_heads),
                                        stream, error);
}
