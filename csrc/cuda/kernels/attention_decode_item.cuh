#ifndef GLMRT_ATTENTION_DECODE_ITEM_CUH
#define GLMRT_ATTENTION_DECODE_ITEM_CUH

#include "attention_decode_tile.cuh"

#define GLMRT_DECODE_STAGES 3
#define GLMRT_DECODE_DEEP_STAGES 6

template <int HD, int STAGES>
__device__ __forceinline__ void glmrt_decode_load_tile(const glmrt_cuda_attention_args &args,
                                                       const glmrt_cuda_attention_item &item, const int32_t *ids,
                                                       int32_t tile, uint32_t base)
{
    using shape = glmrt_decode_shape<HD, STAGES>;
    uint32_t k_tile = base + (uint32_t)((tile % STAGES) * shape::stage_bytes);
    glmrt_attn_load_kv_tile<HD, shape::threads>(
        args, blockIdx.y, item.key_begin + tile * GLMRT_ATTENTION_KEY_TILE, item.key_end,
        [ids](int pass, int32_t) { return ids[pass]; }, k_tile, k_tile + shape::kv_tile_bytes);
}

template <int HD, int STAGES>
__device__ __forceinline__ void glmrt_decode_fetch_pages(const glmrt_cuda_attention_args &args, const int32_t *pages,
                                                         const glmrt_cuda_attention_item &item, int32_t tile,
                                                         int32_t *ids)
{
    using shape = glmrt_decode_shape<HD, STAGES>;
    glmrt_attn_fetch_pass_pages<HD, shape::threads>(pages, args.kv.page_size,
                                                    item.key_begin + tile * GLMRT_ATTENTION_KEY_TILE, item.key_end,
                                                    ids);
}

template <int HD, int STAGES>
__device__ __forceinline__ void glmrt_decode_values(float (*acc)[4], const uint32_t (*p_frag)[4], uint32_t v_tile,
                                                    int warp, int lane)
{
    using shape = glmrt_decode_shape<HD, STAGES>;
    const int key_row = glmrt_decode_fragment_row(lane);
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) {
        const uint32_t rows = v_tile + (uint32_t)(ks * 16 * shape::row_bytes);
        if constexpr (shape::warp_tiles == 1) {
            uint32_t b[2];
            glmrt_attn_ldmatrix_x2_trans(b, rows + glmrt_attn_chunk_offset<shape::chunks>(key_row, warp));
            glmrt_attn_mma(acc[0], p_frag[ks], b[0], b[1]);
        } else {
            uint32_t b[4];
            const uint32_t v_lane = glmrt_attn_lane_offset<shape::chunks>(key_row, lane >> 4);
            glmrt_attn_ldmatrix_x4_trans(b, rows + glmrt_attn_pair_offset(v_lane, warp));
            glmrt_attn_mma(acc[0], p_frag[ks], b[0], b[1]);
            glmrt_attn_mma(acc[1], p_frag[ks], b[2], b[3]);
        }
    }
}

template <int HD, int STAGES>
__device__ __forceinline__ void glmrt_decode_item(const glmrt_cuda_attention_args &args,
                                                  const glmrt_cuda_attention_item item, uint8_t *decode_shared)
{
    using shape = glmrt_decode_shape<HD, STAGES>;
    const uint32_t raw = glmrt_attn_smem_address(decode_shared);
    const uint32_t base = glmrt_attn_smem_align(raw);
    uint8_t *aligned = decode_shared + (base - raw);
    const uint32_t q_tile = base + shape::q_offset;
    const uint32_t p_tile = base + shape::p_offset;
    float *tile_max = reinterpret_cast<float *>(aligned + shape::max_offset);
    float *row_sum = reinterpret_cast<float *>(aligned + shape::sum_offset);
    const int32_t kv_head = blockIdx.y;
    const int32_t group = args.group;
    const int warp = threadIdx.x >> 5;
    const int lane = threadIdx.x & 31;
    const int g = lane >> 2;
    const int t = lane & 3;
    glmrt_decode_store_q<HD, shape::threads>(args, item, q_tile);
    const int32_t *pages = args.page_ids + item.page_begin;
    const int32_t num_tiles = glmrt_decode_num_tiles(item);
    int32_t ids[glmrt_attn_tile_layout<HD, shape::threads>::passes];
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < num_tiles) {
            glmrt_decode_fetch_pages<HD, STAGES>(args, pages, item, s, ids);
            glmrt_decode_load_tile<HD, STAGES>(args, item, ids, s, base);
        }
        glmrt_attn_cp_async_commit();
    }
    if (STAGES - 1 < num_tiles) {
        glmrt_decode_fetch_pages<HD, STAGES>(args, pages, item, STAGES - 1, ids);
    }
    __syncthreads();
    const uint32_t p_lane = glmrt_decode_p_lane(lane);
    uint32_t q_frag[shape::k_steps][4];
    glmrt_decode_q_fragments<HD>(q_frag, q_tile, lane);
    float acc[shape::warp_tiles][4];
#pragma unroll
    for (int n = 0; n < shape::warp_tiles; ++n) {
        acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
    }
    float sum_frag[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    float run_max[2] = {-INFINITY, -INFINITY};
    for (int32_t i = 0; i < num_tiles; ++i) {
        glmrt_attn_cp_async_wait<STAGES - 2>();
        __syncthreads();
        if (i + STAGES - 1 < num_tiles) {
            glmrt_decode_load_tile<HD, STAGES>(args, item, ids, i + STAGES - 1, base);
        }
        glmrt_attn_cp_async_commit();
        if (i + STAGES < num_tiles) {
            glmrt_decode_fetch_pages<HD, STAGES>(args, pages, item, i + STAGES, ids);
        }
        const uint32_t k_tile = base + (uint32_t)((i % STAGES) * shape::stage_bytes);
        const uint32_t v_tile = k_tile + shape::kv_tile_bytes;
        float score[shape::warp_key_tiles][4];
        glmrt_decode_scores<HD, STAGES>(score, q_frag, k_tile, warp, lane);
        const int32_t key0 = item.key_begin + i * GLMRT_ATTENTION_KEY_TILE + 8 * shape::warp_key_tiles * warp + 2 * t;
        float local[2];
        glmrt_decode_mask_max<HD, STAGES>(score, key0, item.key_end, local);
        if (t == 0) {
            tile_max[g * shape::warps + warp] = local[0];
            tile_max[(g + 8) * shape::warps + warp] = local[1];
        }
        __syncthreads();
        float block_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int w = 0; w < shape::warps; ++w) {
            block_max[0] = fmaxf(block_max[0], tile_max[g * shape::warps + w]);
            block_max[1] = fmaxf(block_max[1], tile_max[(g + 8) * shape::warps + w]);
        }
        const float new_max[2] = {glmrt_attn_running_max(run_max[0], block_max[0]),
                                  glmrt_attn_running_max(run_max[1], block_max[1])};
        const float alpha[2] = {glmrt_attn_rescale(run_max[0], new_max[0]), glmrt_attn_rescale(run_max[1], new_max[1])};
        const float reference[2] = {glmrt_attn_weight_reference(new_max[0]), glmrt_attn_weight_reference(new_max[1])};
#pragma unroll
        for (int j = 0; j < shape::warp_key_tiles; ++j) {
            int col = 8 * (shape::warp_key_tiles * warp + j) + 2 * t;
            uint32_t top = glmrt_attn_pack_bf16(glmrt_attn_weight(score[j][0], reference[0]),
                                                glmrt_attn_weight(score[j][1], reference[0]));
            uint32_t bottom = glmrt_attn_pack_bf16(glmrt_attn_weight(score[j][2], reference[1]),
                                                   glmrt_attn_weight(score[j][3], reference[1]));
            glmrt_attn_store4(p_tile + glmrt_attn_chunk_offset<8>(g, col >> 3) + (col & 7) * 2, top);
            glmrt_attn_store4(p_tile + glmrt_attn_chunk_offset<8>(g + 8, col >> 3) + (col & 7) * 2, bottom);
        }
        __syncthreads();
        uint32_t p_frag[4][4];
#pragma unroll
        for (int ks = 0; ks < 4; ++ks) {
            glmrt_attn_ldmatrix_x4(p_frag[ks], p_tile + glmrt_attn_pair_offset(p_lane, ks));
        }
        if (__any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f)) {
#pragma unroll
            for (int n = 0; n < shape::warp_tiles; ++n) {
                glmrt_attn_scale_rows(acc[n], alpha);
            }
            glmrt_attn_scale_rows(sum_frag, alpha);
        }
        glmrt_decode_values<HD, STAGES>(acc, p_frag, v_tile, warp, lane);
        if (warp == 0) {
            glmrt_decode_add_weight_sums(sum_frag, p_frag);
        }
        run_max[0] = new_max[0];
        run_max[1] = new_max[1];
    }
    glmrt_attn_cp_async_wait<0>();
    glmrt_decode_share_row_sums(row_sum, sum_frag, warp == 0, lane);
    const int64_t num_kv_heads = args.kv.num_kv_heads;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        int row = g + 8 * half;
        if (row >= group) {
            continue;
        }
        float total = row_sum[row];
        int64_t head = (int64_t)kv_head * group + row;
        if (item.partial < 0) {
            float *dst = args.out + (int64_t)item.token_begin * args.out_stride + head * HD + warp * shape::warp_dims + 2 * t;
#pragma unroll
            for (int n = 0; n < shape::warp_tiles; ++n) {
                float2 value = make_float2(glmrt_attn_normalize(acc[n][2 * half], total),
                                           glmrt_attn_normalize(acc[n][2 * half + 1], total));
                *reinterpret_cast<float2 *>(dst + 8 * n) = value;
            }
        } else {
            int64_t index = ((int64_t)item.partial * num_kv_heads + kv_head) * group + row;
            float *dst = args.partial_out + index * HD + warp * shape::warp_dims + 2 * t;
#pragma unroll
            for (int n = 0; n < shape::warp_tiles; ++n) {
                *reinterpret_cast<float2 *>(dst + 8 * n) = make_float2(acc[n][2 * half], acc[n][2 * half + 1]);
            }
            if (warp == 0 && t == 0) {
                args.partial_stats[index * 2] = run_max[half];
                args.partial_stats[index * 2 + 1] = total;
            }
        }
    }
}

#endif
