#include "dependent_launch.cuh"
#include "attention_kernels.cuh"
#include "attention_prefill_rows.cuh"
#include "attention_tile.cuh"
#include "cuda_check.cuh"

#define GLMRT_PREFILL_WARPS 4
#define GLMRT_PREFILL_THREADS (GLMRT_PREFILL_WARPS * 32)
#define GLMRT_PREFILL_WARP_ROWS 32
#define GLMRT_PREFILL_STAGES 2
#define GLMRT_PREFILL_PAGE_SLOTS 3

template <int HD>
struct glmrt_prefill_shape {
    static constexpr int rows = GLMRT_ATTENTION_PREFILL_ROWS;
    static constexpr int chunks = HD / 8;
    static constexpr int k_steps = HD / 16;
    static constexpr int value_tiles = HD / 8;
    static constexpr int key_tiles = GLMRT_ATTENTION_KEY_TILE / 8;
    static constexpr int row_bytes = HD * 2;
    static constexpr int kv_tile_bytes = GLMRT_ATTENTION_KEY_TILE * row_bytes;
    static constexpr int stage_bytes = 2 * kv_tile_bytes;
    static constexpr int q_offset = GLMRT_PREFILL_STAGES * stage_bytes;
    static constexpr int keys_offset = q_offset + rows * row_bytes;
    static constexpr int span_offset = keys_offset + rows * 4;
    static constexpr int fold_offset = span_offset + rows * 4;
    static constexpr int ring_offset = fold_offset + rows * 4 * (int)sizeof(float2);
    static constexpr int item_offset = ring_offset + GLMRT_PREFILL_PAGE_SLOTS * GLMRT_ATTN_TILE_PAGES * 4;
    static constexpr size_t shared_bytes =
        (size_t)item_offset + sizeof(glmrt_cuda_attention_item) + GLMRT_ATTN_SMEM_ALIGN;
    static_assert(rows == GLMRT_PREFILL_WARPS * GLMRT_PREFILL_WARP_ROWS, "rows a block");
    static_assert(rows == GLMRT_PREFILL_THREADS, "one thread sets up each row");
};

template <int HD>
__device__ __forceinline__ void glmrt_prefill_load_tile(const glmrt_cuda_attention_args &args, int32_t key_end,
                                                        int32_t tile, uint32_t base, const int32_t *ring)
{
    using shape = glmrt_prefill_shape<HD>;
    const int32_t tile_start = tile * GLMRT_ATTENTION_KEY_TILE;
    const int32_t first_page = glmrt_attn_slot_of(tile_start, args.kv.page_size).page_index;
    const int32_t *ids = ring + (tile % GLMRT_PREFILL_PAGE_SLOTS) * GLMRT_ATTN_TILE_PAGES;
    uint32_t k_tile = base + (uint32_t)((tile % GLMRT_PREFILL_STAGES) * shape::stage_bytes);
    glmrt_attn_load_kv_tile<HD, GLMRT_PREFILL_THREADS>(
        args, blockIdx.y, tile_start, key_end,
        [ids, first_page](int, int32_t page_index) { return ids[page_index - first_page]; }, k_tile,
        k_tile + shape::kv_tile_bytes);
}

template <int HD>
__device__ __forceinline__ void glmrt_prefill_fetch_pages(const glmrt_cuda_attention_args &args, const int32_t *pages,
                                                          int32_t key_end, int32_t tile, uint32_t ring)
{
    glmrt_attn_fetch_tile_pages<GLMRT_PREFILL_THREADS>(
        pages, args.kv.page_size, tile * GLMRT_ATTENTION_KEY_TILE, key_end,
        ring + (uint32_t)((tile % GLMRT_PREFILL_PAGE_SLOTS) * GLMRT_ATTN_TILE_PAGES * 4));
}

template <int HD>
__global__ void __launch_bounds__(GLMRT_PREFILL_THREADS, 2) glmrt_attention_prefill_kernel(glmrt_cuda_attention_args args)
{
    glmrt_dependent_enter();
    using shape = glmrt_prefill_shape<HD>;
    extern __shared__ __align__(128) uint8_t prefill_shared[];
    const uint32_t raw = glmrt_attn_smem_address(prefill_shared);
    const uint32_t base = glmrt_attn_smem_align(raw);
    uint8_t *aligned = prefill_shared + (base - raw);
    const uint32_t q_tile = base + shape::q_offset;
    int32_t *row_keys = reinterpret_cast<int32_t *>(aligned + shape::keys_offset);
    int32_t *row_span = reinterpret_cast<int32_t *>(aligned + shape::span_offset);
    float2 *fold = reinterpret_cast<float2 *>(aligned + shape::fold_offset);
    const int32_t *ring = reinterpret_cast<const int32_t *>(aligned + shape::ring_offset);
    const uint32_t ring_address = base + shape::ring_offset;
    glmrt_cuda_attention_item *block_item = reinterpret_cast<glmrt_cuda_attention_item *>(aligned + shape::item_offset);
    if (threadIdx.x == 0) {
        *block_item = args.items[gridDim.x - 1 - blockIdx.x];
    }
    __syncthreads();
    const glmrt_cuda_attention_item &item = *block_item;
    const int32_t kv_head = blockIdx.y;
    const int32_t group = args.group;
    const int32_t total_rows = item.num_tokens * group;
    const int warp = threadIdx.x >> 5;
    const int lane = threadIdx.x & 31;
    const int g = lane >> 2;
    const int t = lane & 3;
    {
        int32_t global_row = item.row_begin + (int32_t)threadIdx.x;
        int32_t keys = item.key_end;
        if (global_row < total_rows) {
            keys = args.positions[item.token_begin + global_row / group] + 1;
        }
        row_keys[threadIdx.x] = keys;
        row_span[threadIdx.x] = glmrt_attention_split_span(keys, item.split_keys, item.max_splits);
    }
    glmrt_prefill_load_queries<HD, GLMRT_ATTENTION_PREFILL_ROWS, GLMRT_PREFILL_THREADS, false>(args, item, kv_head, 0,
                                                                                              q_tile, (int)threadIdx.x);
    const int32_t *pages = args.page_ids + item.page_begin;
    const int32_t num_tiles = (item.key_end + GLMRT_ATTENTION_KEY_TILE - 1) / GLMRT_ATTENTION_KEY_TILE;
    glmrt_prefill_fetch_pages<HD>(args, pages, item.key_end, 0, ring_address);
    glmrt_prefill_fetch_pages<HD>(args, pages, item.key_end, 1, ring_address);
    glmrt_attn_cp_async_commit();
    glmrt_attn_cp_async_wait<0>();
    __syncthreads();
    glmrt_prefill_load_tile<HD>(args, item.key_end, 0, base, ring);
    glmrt_attn_cp_async_commit();
    const int row_base = warp * GLMRT_PREFILL_WARP_ROWS;
    int32_t warp_min_keys = row_keys[row_base + lane];
    int32_t warp_max_keys = warp_min_keys;
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
        warp_min_keys = min(warp_min_keys, __shfl_xor_sync(0xffffffffu, warp_min_keys, offset));
        warp_max_keys = max(warp_max_keys, __shfl_xor_sync(0xffffffffu, warp_max_keys, offset));
    }
    glmrt_prefill_state<HD, 2> st;
#pragma unroll
    for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
        for (int n = 0; n < shape::value_tiles; ++n) {
            st.acc[mt][n][0] = st.acc[mt][n][1] = st.acc[mt][n][2] = st.acc[mt][n][3] = 0.0f;
        }
        st.sum_frag[mt][0] = st.sum_frag[mt][1] = st.sum_frag[mt][2] = st.sum_frag[mt][3] = 0.0f;
        st.run_max[mt][0] = st.run_max[mt][1] = -INFINITY;
    }
    const int a_row = (lane & 7) + ((lane >> 3) & 1) * 8;
    const int k_row = (lane & 7) + ((lane >> 4) << 3);
    const uint32_t q_lane = q_tile + (uint32_t)(row_base * shape::row_bytes) +
                            glmrt_attn_lane_offset<shape::chunks>(a_row, lane >> 4);
    const uint32_t k_lane = glmrt_attn_lane_offset<shape::chunks>(k_row, (lane >> 3) & 1);
    const uint32_t v_lane = glmrt_attn_lane_offset<shape::chunks>(a_row, lane >> 4);
    int32_t next_boundary = item.split_keys;
    for (int32_t i = 0; i < num_tiles; ++i) {
        const int32_t tile_start = i * GLMRT_ATTENTION_KEY_TILE;
        const bool boundary = tile_start == next_boundary;
        if (boundary) {
            next_boundary += item.split_keys;
        }
        if (boundary && tile_start < warp_max_keys) {
            glmrt_prefill_boundary_row<0, 0>(st, args, item, kv_head, row_keys, row_span, fold, row_base, tile_start, g, t);
            glmrt_prefill_boundary_row<0, 1>(st, args, item, kv_head, row_keys, row_span, fold, row_base, tile_start, g, t);
            glmrt_prefill_boundary_row<1, 0>(st, args, item, kv_head, row_keys, row_span, fold, row_base, tile_start, g, t);
            glmrt_prefill_boundary_row<1, 1>(st, args, item, kv_head, row_keys, row_span, fold, row_base, tile_start, g, t);
        }
        glmrt_attn_cp_async_wait<0>();
        __syncthreads();
        if (i + 1 < num_tiles) {
            glmrt_prefill_load_tile<HD>(args, item.key_end, i + 1, base, ring);
        }
        if (i + 2 < num_tiles) {
            glmrt_prefill_fetch_pages<HD>(args, pages, item.key_end, i + 2, ring_address);
        }
        glmrt_attn_cp_async_commit();
        if (tile_start >= warp_max_keys) {
            continue;
        }
        const uint32_t k_tile = base + (uint32_t)((i % GLMRT_PREFILL_STAGES) * shape::stage_bytes);
        const uint32_t v_tile = k_tile + shape::kv_tile_bytes;
        float score[2][shape::key_tiles][4];
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
            for (int j = 0; j < shape::key_tiles; ++j) {
                score[mt][j][0] = score[mt][j][1] = score[mt][j][2] = score[mt][j][3] = 0.0f;
            }
        }
#pragma unroll
        for (int ks = 0; ks < shape::k_steps; ++ks) {
            uint32_t qa[2][4];
            const uint32_t q_at = glmrt_attn_pair_offset(q_lane, ks);
            glmrt_attn_ldmatrix_x4(qa[0], q_at);
            glmrt_attn_ldmatrix_x4(qa[1], q_at + (uint32_t)(16 * shape::row_bytes));
            const uint32_t k_at = k_tile + glmrt_attn_pair_offset(k_lane, ks);
#pragma unroll
            for (int np = 0; np < shape::key_tiles / 2; ++np) {
                uint32_t b[4];
                glmrt_attn_ldmatrix_x4(b, k_at + (uint32_t)(np * 16 * shape::row_bytes));
#pragma unroll
                for (int mt = 0; mt < 2; ++mt) {
                    glmrt_attn_mma(score[mt][2 * np], qa[mt], b[0], b[1]);
                    glmrt_attn_mma(score[mt][2 * np + 1], qa[mt], b[2], b[3]);
                }
            }
        }
        const bool masked = tile_start + GLMRT_ATTENTION_KEY_TILE > warp_min_keys;
        const int32_t key0 = tile_start + 2 * t;
        float alpha[2][2];
        glmrt_prefill_softmax<0>(st, score[0], alpha[0], masked, row_keys, row_base + g, key0);
        glmrt_prefill_softmax<1>(st, score[1], alpha[1], masked, row_keys, row_base + 16 + g, key0);
        const bool rescale = alpha[0][0] != 1.0f || alpha[0][1] != 1.0f || alpha[1][0] != 1.0f || alpha[1][1] != 1.0f;
        if (__any_sync(0xffffffffu, rescale)) {
#pragma unroll
            for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
                for (int n = 0; n < shape::value_tiles; ++n) {
                    glmrt_attn_scale_rows(st.acc[mt][n], alpha[mt]);
                }
                glmrt_attn_scale_rows(st.sum_frag[mt], alpha[mt]);
            }
        }
#pragma unroll
        for (int ks = 0; ks < 4; ++ks) {
            uint32_t pa[2][4];
            glmrt_attn_weights_to_a(pa[0], score[0][2 * ks], score[0][2 * ks + 1]);
            glmrt_attn_weights_to_a(pa[1], score[1][2 * ks], score[1][2 * ks + 1]);
            const uint32_t v_rows = v_tile + (uint32_t)(ks * 16 * shape::row_bytes);
#pragma unroll
            for (int dp = 0; dp < shape::value_tiles / 2; ++dp) {
                uint32_t b[4];
                glmrt_attn_ldmatrix_x4_trans(b, v_rows + glmrt_attn_pair_offset(v_lane, dp));
#pragma unroll
                for (int mt = 0; mt < 2; ++mt) {
                    glmrt_attn_mma(st.acc[mt][2 * dp], pa[mt], b[0], b[1]);
                    glmrt_attn_mma(st.acc[mt][2 * dp + 1], pa[mt], b[2], b[3]);
                }
            }
#pragma unroll
            for (int mt = 0; mt < 2; ++mt) {
                glmrt_attn_mma(st.sum_frag[mt], pa[mt], GLMRT_ATTN_BF16X2_ONES, GLMRT_ATTN_BF16X2_ONES);
            }
        }
    }
    glmrt_attn_cp_async_wait<0>();
#pragma unroll
    for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            int row = row_base + 16 * mt + g + 8 * h;
            if (item.row_begin + row >= total_rows) {
                continue;
            }
            float *row_out = glmrt_prefill_row_out(args, item, kv_head, row, HD, t);
            bool folded = row_keys[row] > row_span[row];
            const float2 *merged = &fold[row * 4 + t];
            if (mt == 0 && h == 0) {
                glmrt_prefill_finish_row<0, 0>(st, row_out, merged, folded);
            } else if (mt == 0) {
                glmrt_prefill_finish_row<0, 1>(st, row_out, merged, folded);
            } else if (h == 0) {
                glmrt_prefill_finish_row<1, 0>(st, row_out, merged, folded);
            } else {
                glmrt_prefill_finish_row<1, 1>(st, row_out, merged, folded);
            }
        }
    }
}

static glmrt_attention_kernel_choice glmrt_prefill_pick(int32_t head_dim)
{
    glmrt_attention_kernel_choice choice = {nullptr, 0, GLMRT_PREFILL_THREADS, "prefill attention"};
    switch (head_dim) {
    case 32:
        choice.kernel = glmrt_attention_prefill_kernel<32>;
        choice.shared = glmrt_prefill_shape<32>::shared_bytes;
        break;
    case 64:
        choice.kernel = glmrt_attention_prefill_kernel<64>;
        choice.shared = glmrt_prefill_shape<64>::shared_bytes;
        break;
    case 128:
        choice.kernel = glmrt_attention_prefill_kernel<128>;
        choice.shared = glmrt_prefill_shape<128>::shared_bytes;
        break;
    default: break;
    }
    return choice;
}

glmrt_status glmrt_attention_prefill_prepare(int32_t head_dim, glmrt_error *error)
{
    const glmrt_attention_kernel_choice choice = glmrt_prefill_pick(head_dim);
    return glmrt_attention_kernel_prepare(&choice, head_dim, error);
}

glmrt_status glmrt_attention_prefill_launch(const glmrt_cuda_attention_args *args, cudaStream_t stream,
                                            glmrt_error *error)
{
    const glmrt_attention_kernel_choice choice = glmrt_prefill_pick(args->kv.head_dim);
    return glmrt_attention_items_launch(&choice, args, dim3((unsigned)args->num_items, (unsigned)args->kv.num_kv_heads),
                                        stream, error);
}
