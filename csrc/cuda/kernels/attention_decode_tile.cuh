#ifndef GLMRT_ATTENTION_DECODE_TILE_CUH
#define GLMRT_ATTENTION_DECODE_TILE_CUH

#include "attention_tile.cuh"

#define GLMRT_DECODE_ROWS 16

template <int HD, int STAGES>
struct glmrt_decode_shape {
    static constexpr int warps = HD >= 64 ? 8 : 4;
    static constexpr int threads = warps * 32;
    static constexpr int chunks = HD / 8;
    static constexpr int k_steps = HD / 16;
    static constexpr int warp_key_tiles = GLMRT_ATTENTION_KEY_TILE / 8 / warps;
    static constexpr int warp_dims = HD / warps;
    static constexpr int warp_tiles = warp_dims / 8;
    static constexpr int row_bytes = HD * 2;
    static constexpr int kv_tile_bytes = GLMRT_ATTENTION_KEY_TILE * row_bytes;
    static constexpr int stage_bytes = 2 * kv_tile_bytes;
    static constexpr int q_offset = STAGES * stage_bytes;
    static constexpr int p_offset = q_offset + GLMRT_DECODE_ROWS * row_bytes;
    static constexpr int max_offset = p_offset + GLMRT_DECODE_ROWS * GLMRT_ATTENTION_KEY_TILE * 2;
    static constexpr int sum_offset = max_offset + GLMRT_DECODE_ROWS * warps * 4;
    static constexpr size_t shared_bytes = (size_t)sum_offset + GLMRT_DECODE_ROWS * 4 + GLMRT_ATTN_SMEM_ALIGN;
    static_assert(warp_key_tiles == 1 || warp_key_tiles == 2, "keys a warp scores");
    static_assert(warp_tiles == 1 || warp_tiles == 2, "value columns a warp");
    static_assert(k_steps % 2 == 0, "head dim a multiple of 32");
};

template <int HD, int STAGES>
__device__ __forceinline__ void glmrt_decode_scores(float (*score)[4], const uint32_t (*q_frag)[4], uint32_t k_tile,
                                                    int warp, int lane)
{
    using shape = glmrt_decode_shape<HD, STAGES>;
    const int first_key = 8 * shape::warp_key_tiles * warp;
#pragma unroll
    for (int j = 0; j < shape::warp_key_tiles; ++j) {
        score[j][0] = score[j][1] = score[j][2] = score[j][3] = 0.0f;
    }
    if constexpr (shape::warp_key_tiles == 1) {
        const uint32_t k_lane = k_tile + glmrt_attn_lane_offset<shape::chunks>(first_key + (lane & 7), (lane >> 3) & 1);
        const uint32_t k_pairs = k_lane ^ ((uint32_t)(lane >> 4) << 5);
#pragma unroll
        for (int ks = 0; ks < shape::k_steps; ks += 2) {
            uint32_t b[4];
            glmrt_attn_ldmatrix_x4(b, glmrt_attn_pair_offset(k_pairs, ks));
            glmrt_attn_mma(score[0], q_frag[ks], b[0], b[1]);
            glmrt_attn_mma(score[0], q_frag[ks + 1], b[2], b[3]);
        }
    } else {
        const int k_row = first_key + (lane & 7) + ((lane >> 4) << 3);
        const uint32_t k_lane = k_tile + glmrt_attn_lane_offset<shape::chunks>(k_row, (lane >> 3) & 1);
#pragma unroll
        for (int ks = 0; ks < shape::k_steps; ++ks) {
            uint32_t b[4];
            glmrt_attn_ldmatrix_x4(b, glmrt_attn_pair_offset(k_lane, ks));
            glmrt_attn_mma(score[0], q_frag[ks], b[0], b[1]);
            glmrt_attn_mma(score[1], q_frag[ks], b[2], b[3]);
        }
    }
}

template <int HD, int THREADS>
__device__ __forceinline__ void glmrt_decode_store_q(const glmrt_cuda_attention_args &args,
                                                     const glmrt_cuda_attention_item &item, uint32_t q_tile)
{
    constexpr int chunks = HD / 8;
    const float q_scale = glmrt_attn_q_scale(args.scale);
    const float *q_rows =
        args.q + (int64_t)item.token_begin * args.q_stride + (int64_t)blockIdx.y * args.group * HD;
    for (int idx = threadIdx.x; idx < GLMRT_DECODE_ROWS * chunks; idx += THREADS) {
        int row = idx / chunks;
        int chunk = idx % chunks;
        uint32_t dst = q_tile + glmrt_attn_chunk_offset<chunks>(row, chunk);
        if (row < args.group) {
            glmrt_attn_store_q_chunk(dst, q_rows + (int64_t)row * HD + chunk * 8, q_scale);
        } else {
            glmrt_attn_store_zero16(dst);
        }
    }
}

template <int HD, int STAGES>
__device__ __forceinline__ void glmrt_decode_mask_max(float (*score)[4], int32_t key0, int32_t key_end, float *local)
{
    using shape = glmrt_decode_shape<HD, STAGES>;
    local[0] = -INFINITY;
    local[1] = -INFINITY;
#pragma unroll
    for (int j = 0; j < shape::warp_key_tiles; ++j) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            if (key0 + 8 * j + e >= key_end) {
                score[j][e] = -INFINITY;
                score[j][2 + e] = -INFINITY;
            }
            local[0] = fmaxf(local[0], score[j][e]);
            local[1] = fmaxf(local[1], score[j][2 + e]);
        }
    }
    local[0] = glmrt_attn_quad_max(local[0]);
    local[1] = glmrt_attn_quad_max(local[1]);
}

__device__ __forceinline__ int glmrt_decode_fragment_row(int lane)
{
    return (lane & 7) + ((lane >> 3) & 1) * 8;
}

__device__ __forceinline__ void glmrt_decode_add_weight_sums(float *sum_frag, const uint32_t (*p_frag)[4])
{
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) {
        glmrt_attn_mma(sum_frag, p_frag[ks], GLMRT_ATTN_BF16X2_ONES, GLMRT_ATTN_BF16X2_ONES);
    }
}

__device__ __forceinline__ void glmrt_decode_share_row_sums(float *row_sum, const float *sum_frag, bool holds_sums,
                                                            int lane)
{
    if (holds_sums && (lane & 3) == 0) {
        row_sum[lane >> 2] = sum_frag[0];
        row_sum[(lane >> 2) + 8] = sum_frag[2];
    }
    __syncthreads();
}

__device__ __forceinline__ int32_t glmrt_decode_num_tiles(const glmrt_cuda_attention_item &item)
{
    return (item.key_end - item.key_begin + GLMRT_ATTENTION_KEY_TILE - 1) / GLMRT_ATTENTION_KEY_TILE;
}

template <int HD>
__device__ __forceinline__ void glmrt_decode_q_fragments(uint32_t (*q_frag)[4], uint32_t q_tile, int lane)
{
    constexpr int chunks = HD / 8;
    const uint32_t a_lane = glmrt_attn_lane_offset<chunks>(glmrt_decode_fragment_row(lane), lane >> 4);
#pragma unroll
    for (int ks = 0; ks < HD / 16; ++ks) {
        glmrt_attn_ldmatrix_x4(q_frag[ks], q_tile + glmrt_attn_pair_offset(a_lane, ks));
    }
}

__device__ __forceinline__ uint32_t glmrt_decode_p_lane(int lane)
{
    return glmrt_attn_lane_offset<8>(glmrt_decode_fragment_row(lane), lane >> 4);
}

#endif
