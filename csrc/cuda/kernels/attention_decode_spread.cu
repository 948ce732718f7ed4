#include "dependent_launch.cuh"
#include "attention_kernels.cuh"
#include "attention_decode_item.cuh"
#include "cluster_ops.cuh"
#include "cuda_check.cuh"

#define GLMRT_SPREAD_SLICE_CHUNKS 4
#define GLMRT_SPREAD_TILES_A_BLOCK 2
#define GLMRT_SPREAD_PARITIES 2
#define GLMRT_SPREAD_BLOCKS_AN_SM 2

__host__ __device__ constexpr int32_t glmrt_spread_blocks(int32_t head_dim)
{
    return head_dim / (8 * GLMRT_SPREAD_SLICE_CHUNKS);
}

template <int HD>
struct glmrt_spread_shape {
    using tile = glmrt_decode_shape<HD, 1>;
    static constexpr int blocks = glmrt_spread_blocks(HD);
    static constexpr int round_tiles = blocks * GLMRT_SPREAD_TILES_A_BLOCK;
    static constexpr int slice_dims = 8 * GLMRT_SPREAD_SLICE_CHUNKS;
    static constexpr int slice_tile_bytes = GLMRT_ATTENTION_KEY_TILE * 16 * GLMRT_SPREAD_SLICE_CHUNKS;
    static constexpr int slice_loads = round_tiles * GLMRT_ATTENTION_KEY_TILE * GLMRT_SPREAD_SLICE_CHUNKS / tile::threads;
    static constexpr int p_tile_bytes = GLMRT_DECODE_ROWS * GLMRT_ATTENTION_KEY_TILE * 2;
    static constexpr int sum_warp = tile::warps > GLMRT_SPREAD_SLICE_CHUNKS ? GLMRT_SPREAD_SLICE_CHUNKS : 0;
    static constexpr int v_offset = GLMRT_SPREAD_TILES_A_BLOCK * tile::kv_tile_bytes;
    static constexpr int p_offset = v_offset + round_tiles * slice_tile_bytes;
    static constexpr int q_offset = p_offset + GLMRT_SPREAD_PARITIES * round_tiles * p_tile_bytes;
    static constexpr int round_max_offset = q_offset + GLMRT_DECODE_ROWS * tile::row_bytes;
    static constexpr int warp_max_offset = round_max_offset + GLMRT_SPREAD_PARITIES * round_tiles * GLMRT_DECODE_ROWS * 4;
    static constexpr int sum_offset = warp_max_offset + GLMRT_SPREAD_TILES_A_BLOCK * GLMRT_DECODE_ROWS * tile::warps * 4;
    static constexpr size_t spread_bytes = (size_t)sum_offset + GLMRT_DECODE_ROWS * 4 + GLMRT_ATTN_SMEM_ALIGN;
    static constexpr size_t item_bytes = glmrt_decode_shape<HD, GLMRT_DECODE_STAGES>::shared_bytes;
    static constexpr size_t shared_bytes = spread_bytes > item_bytes ? spread_bytes : item_bytes;
    static_assert(glmrt_decode_shape<HD, GLMRT_DECODE_STAGES>::threads == tile::threads, "one block shape for both");
    static_assert(blocks >= 1 && blocks <= 4, "a cluster of one to four blocks");
    static_assert(tile::warps >= GLMRT_SPREAD_SLICE_CHUNKS, "a warp for every 8 value columns of a slice");
    static_assert(slice_loads * tile::threads == round_tiles * GLMRT_ATTENTION_KEY_TILE * GLMRT_SPREAD_SLICE_CHUNKS,
                  "value slices in whole passes");
};

typedef struct glmrt_spread_round {
    int32_t first_tile;
    int32_t tiles;
    int32_t parity;
} glmrt_spread_round;

template <int HD>
__device__ __forceinline__ void glmrt_spread_load_keys(const glmrt_cuda_attention_args &args,
                                                       const glmrt_cuda_attention_item &item, const int32_t *pages,
                                                       const glmrt_spread_round &round, int32_t num_tiles,
                                                       uint32_t rank, uint32_t base)
{
    using shape = glmrt_spread_shape<HD>;
    using tile = typename shape::tile;
#pragma unroll
    for (int j = 0; j < GLMRT_SPREAD_TILES_A_BLOCK; ++j) {
        const int32_t index = round.first_tile + (int32_t)rank + shape::blocks * j;
        if (index < num_tiles) {
            const int32_t tile_start = item.key_begin + index * GLMRT_ATTENTION_KEY_TILE;
            int32_t ids[glmrt_attn_tile_layout<HD, tile::threads>::passes];
            glmrt_attn_fetch_pass_pages<HD, tile::threads>(pages, args.kv.page_size, tile_start, item.key_end, ids);
            glmrt_attn_load_kv_tile<HD, tile::threads, false, false>(
                args, blockIdx.y, tile_start, item.key_end, [&ids](int pass, int32_t) { return ids[pass]; },
                base + (uint32_t)(j * tile::kv_tile_bytes), 0u);
        }
    }
    glmrt_attn_cp_async_commit();
}

template <int HD>
__device__ __forceinline__ void glmrt_spread_load_values(const glmrt_cuda_attention_args &args,
                                                         const glmrt_cuda_attention_item &item, const int32_t *pages,
                                                         const glmrt_spread_round &round, uint32_t rank,
                                                         uint32_t v_base)
{
    using shape = glmrt_spread_shape<HD>;
    using tile = typename shape::tile;
    constexpr int per_tile = GLMRT_ATTENTION_KEY_TILE * GLMRT_SPREAD_SLICE_CHUNKS;
    const char *values = glmrt_attn_head_keys(args, (int32_t)blockIdx.y) + glmrt_attn_value_bytes(args) +
                         (int64_t)rank * shape::slice_dims * 2;
    const int64_t page_bytes = 2 * args.kv.page_elements;
    int32_t page[shape::slice_loads];
    int32_t key[shape::slice_loads];
#pragma unroll
    for (int k = 0; k < shape::slice_loads; ++k) {
        const int idx = (int)threadIdx.x + k * tile::threads;
        const int32_t round_tile = idx / per_tile;
        const int32_t row = (idx % per_tile) / GLMRT_SPREAD_SLICE_CHUNKS;
        key[k] = round_tile < round.tiles
                     ? item.key_begin + (round.first_tile + round_tile) * GLMRT_ATTENTION_KEY_TILE + row
                     : item.key_end;
        page[k] = key[k] < item.key_end ? pages[glmrt_attn_slot_of(key[k], args.kv.page_size).page_index] : 0;
    }
#pragma unroll
    for (int k = 0; k < shape::slice_loads; ++k) {
        const int idx = (int)threadIdx.x + k * tile::threads;
        const int32_t round_tile = idx / per_tile;
        const int row = (idx % per_tile) / GLMRT_SPREAD_SLICE_CHUNKS;
        const int chunk = idx % GLMRT_SPREAD_SLICE_CHUNKS;
        const uint32_t dst = v_base + (uint32_t)(round_tile * shape::slice_tile_bytes) +
                             glmrt_attn_chunk_offset<GLMRT_SPREAD_SLICE_CHUNKS>(row, chunk);
        if (key[k] < item.key_end) {
            const glmrt_attn_slot at = glmrt_attn_slot_of(key[k], args.kv.page_size);
            glmrt_attn_cp_async(dst, values + (int64_t)page[k] * page_bytes + (int64_t)at.slot * (HD * 2) + chunk * 16);
        } else if (round_tile < round.tiles) {
            glmrt_attn_cp_async_zero(dst, values);
        }
    }
    glmrt_attn_cp_async_commit();
}

template <int HD>
__device__ __forceinline__ void glmrt_spread_round_maxes(float (*score)[glmrt_decode_shape<HD, 1>::warp_key_tiles][4],
                                                         const glmrt_cuda_attention_item &item,
                                                         const glmrt_spread_round &round, int32_t num_tiles,
                                                         uint32_t rank, float *warp_max, uint32_t round_max)
{
    using shape = glmrt_spread_shape<HD>;
    using tile = typename shape::tile;
    const int warp = threadIdx.x >> 5;
    const int lane = threadIdx.x & 31;
    const int g = lane >> 2;
    const int t = lane & 3;
#pragma unroll
    for (int j = 0; j < GLMRT_SPREAD_TILES_A_BLOCK; ++j) {
        const int32_t index = round.first_tile + (int32_t)rank + shape::blocks * j;
        if (index < num_tiles) {
            float local[2];
            const int32_t key0 = item.key_begin + index * GLMRT_ATTENTION_KEY_TILE + 8 * tile::warp_key_tiles * warp + 2 * t;
            glmrt_decode_mask_max<HD, 1>(score[j], key0, item.key_end, local);
            if (t == 0) {
                warp_max[(j * GLMRT_DECODE_ROWS + g) * tile::warps + warp] = local[0];
                warp_max[(j * GLMRT_DECODE_ROWS + g + 8) * tile::warps + warp] = local[1];
            }
        }
    }
    __syncthreads();
    if (warp != 0) {
        return;
    }
#pragma unroll
    for (int j = 0; j < GLMRT_SPREAD_TILES_A_BLOCK; ++j) {
        const int32_t in_round = (int32_t)rank + shape::blocks * j;
        if (round.first_tile + in_round < num_tiles) {
            float block_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
            for (int w = 0; w < tile::warps; ++w) {
                block_max[0] = fmaxf(block_max[0], warp_max[(j * GLMRT_DECODE_ROWS + g) * tile::warps + w]);
                block_max[1] = fmaxf(block_max[1], warp_max[(j * GLMRT_DECODE_ROWS + g + 8) * tile::warps + w]);
            }
            const uint32_t slot =
                round_max + (uint32_t)(((round.parity * shape::round_tiles + in_round) * GLMRT_DECODE_ROWS + g) * 4);
            for (int peer = t; peer < shape::blocks; peer += 4) {
                glmrt_cluster_store(slot, (uint32_t)peer, __float_as_uint(block_max[0]));
                glmrt_cluster_store(slot + 32u, (uint32_t)peer, __float_as_uint(block_max[1]));
            }
        }
    }
}

template <int HD>
__device__ __forceinline__ void glmrt_decode_spread_item(const glmrt_cuda_attention_args &args,
                                                         const glmrt_cuda_attention_item item, uint8_t *spread_shared)
{
    using shape = glmrt_spread_shape<HD>;
    using tile = typename shape::tile;
    const uint32_t raw = glmrt_attn_smem_address(spread_shared);
    const uint32_t base = glmrt_attn_smem_align(raw);
    uint8_t *aligned = spread_shared + (base - raw);
    const uint32_t v_base = base + shape::v_offset;
    const uint32_t p_base = base + shape::p_offset;
    const uint32_t q_tile = base + shape::q_offset;
    const uint32_t round_max = base + shape::round_max_offset;
    const float *round_max_local = reinterpret_cast<const float *>(aligned + shape::round_max_offset);
    float *warp_max = reinterpret_cast<float *>(aligned + shape::warp_max_offset);
    float *row_sum = reinterpret_cast<float *>(aligned + shape::sum_offset);
    const uint32_t rank = glmrt_cluster_rank();
    const int32_t kv_head = blockIdx.y;
    const int warp = threadIdx.x >> 5;
    const int lane = threadIdx.x & 31;
    const int g = lane >> 2;
    const int t = lane & 3;
    const int32_t *pages = args.page_ids + item.page_begin;
    const int32_t num_tiles = glmrt_decode_num_tiles(item);
    glmrt_cluster_arrive_relaxed();
    glmrt_decode_store_q<HD, tile::threads>(args, item, q_tile);
    __syncthreads();
    const uint32_t p_lane = glmrt_decode_p_lane(lane);
    uint32_t q_frag[tile::k_steps][4];
    glmrt_decode_q_fragments<HD>(q_frag, q_tile, lane);
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    float sum_frag[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    float run_max[2] = {-INFINITY, -INFINITY};
    for (int32_t first = 0; first < num_tiles; first += shape::round_tiles) {
        glmrt_spread_round round;
        round.first_tile = first;
        round.tiles = min(shape::round_tiles, num_tiles - first);
        round.parity = (first / shape::round_tiles) % GLMRT_SPREAD_PARITIES;
        glmrt_spread_load_keys<HD>(args, item, pages, round, num_tiles, rank, base);
        glmrt_spread_load_values<HD>(args, item, pages, round, rank, v_base);
        glmrt_attn_cp_async_wait<1>();
        __syncthreads();
        float score[GLMRT_SPREAD_TILES_A_BLOCK][tile::warp_key_tiles][4];
#pragma unroll
        for (int j = 0; j < GLMRT_SPREAD_TILES_A_BLOCK; ++j) {
            if (first + (int32_t)rank + shape::blocks * j < num_tiles) {
                glmrt_decode_scores<HD, 1>(score[j], q_frag, base + (uint32_t)(j * tile::kv_tile_bytes), warp, lane);
            }
        }
        if (first == 0) {
            glmrt_cluster_wait();
        }
        glmrt_spread_round_maxes<HD>(score, item, round, num_tiles, rank, warp_max, round_max);
        glmrt_cluster_sync();
        const float *maxes = round_max_local + round.parity * shape::round_tiles * GLMRT_DECODE_ROWS;
        float own_reference[GLMRT_SPREAD_TILES_A_BLOCK][2];
        float prefix_max[2] = {run_max[0], run_max[1]};
#pragma unroll
        for (int i = 0; i < shape::round_tiles; ++i) {
            if (i < round.tiles) {
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    prefix_max[h] = glmrt_attn_running_max(prefix_max[h], maxes[i * GLMRT_DECODE_ROWS + g + 8 * h]);
#pragma unroll
                    for (int j = 0; j < GLMRT_SPREAD_TILES_A_BLOCK; ++j) {
                        if (i == (int)rank + shape::blocks * j) {
                            own_reference[j][h] = glmrt_attn_weight_reference(prefix_max[h]);
                        }
                    }
                }
            }
        }
#pragma unroll
        for (int j = 0; j < GLMRT_SPREAD_TILES_A_BLOCK; ++j) {
            const int32_t in_round = (int32_t)rank + shape::blocks * j;
            if (first + in_round >= num_tiles) {
                continue;
            }
            const uint32_t p_tile = p_base + (uint32_t)((round.parity * shape::round_tiles + in_round) * shape::p_tile_bytes);
#pragma unroll
            for (int k = 0; k < tile::warp_key_tiles; ++k) {
                const int col = 8 * (tile::warp_key_tiles * warp + k) + 2 * t;
                const uint32_t top = glmrt_attn_pack_bf16(glmrt_attn_weight(score[j][k][0], own_reference[j][0]),
                                                          glmrt_attn_weight(score[j][k][1], own_reference[j][0]));
                const uint32_t bottom = glmrt_attn_pack_bf16(glmrt_attn_weight(score[j][k][2], own_reference[j][1]),
                                                             glmrt_attn_weight(score[j][k][3], own_reference[j][1]));
                const uint32_t at_top = p_tile + glmrt_attn_chunk_offset<8>(g, col >> 3) + (col & 7) * 2;
                const uint32_t at_bottom = p_tile + glmrt_attn_chunk_offset<8>(g + 8, col >> 3) + (col & 7) * 2;
#pragma unroll
                for (int peer = 0; peer < shape::blocks; ++peer) {
                    glmrt_cluster_store(at_top, (uint32_t)peer, top);
                    glmrt_cluster_store(at_bottom, (uint32_t)peer, bottom);
                }
            }
        }
        glmrt_attn_cp_async_wait<0>();
        glmrt_cluster_sync();
        const int key_row = glmrt_decode_fragment_row(lane);
#pragma unroll
        for (int i = 0; i < shape::round_tiles; ++i) {
            if (i >= round.tiles) {
                continue;
            }
            float alpha[2];
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const float new_max = glmrt_attn_running_max(run_max[h], maxes[i * GLMRT_DECODE_ROWS + g + 8 * h]);
                alpha[h] = glmrt_attn_rescale(run_max[h], new_max);
                run_max[h] = new_max;
            }
            const uint32_t p_tile = p_base + (uint32_t)((round.parity * shape::round_tiles + i) * shape::p_tile_bytes);
            const uint32_t v_tile = v_base + (uint32_t)(i * shape::slice_tile_bytes);
            if (warp < GLMRT_SPREAD_SLICE_CHUNKS || warp == shape::sum_warp) {
                uint32_t p_frag[4][4];
#pragma unroll
                for (int ks = 0; ks < 4; ++ks) {
                    glmrt_attn_ldmatrix_x4(p_frag[ks], p_tile + glmrt_attn_pair_offset(p_lane, ks));
                }
                if (warp < GLMRT_SPREAD_SLICE_CHUNKS) {
                    glmrt_attn_scale_rows(acc, alpha);
#pragma unroll
                    for (int ks = 0; ks < 4; ++ks) {
                        uint32_t b[2];
                        glmrt_attn_ldmatrix_x2_trans(
                            b, v_tile + glmrt_attn_chunk_offset<GLMRT_SPREAD_SLICE_CHUNKS>(ks * 16 + key_row, warp));
                        glmrt_attn_mma(acc, p_frag[ks], b[0], b[1]);
                    }
                }
                if (warp == shape::sum_warp) {
                    glmrt_attn_scale_rows(sum_frag, alpha);
                    glmrt_decode_add_weight_sums(sum_frag, p_frag);
                }
            }
        }
        __syncthreads();
    }
    if (num_tiles == 0) {
        glmrt_cluster_wait();
    }
    glmrt_decode_share_row_sums(row_sum, sum_frag, warp == shape::sum_warp, lane);
    const int64_t num_kv_heads = args.kv.num_kv_heads;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        const int row = g + 8 * half;
        if (row >= args.group) {
            continue;
        }
        const float total = row_sum[row];
        const int64_t head = (int64_t)kv_head * args.group + row;
        const int column = (int)rank * shape::slice_dims + 8 * warp + 2 * t;
        if (item.partial < 0) {
            if (warp < GLMRT_SPREAD_SLICE_CHUNKS) {
                float *dst = args.out + (int64_t)item.token_begin * args.out_stride + head * HD + column;
                *reinterpret_cast<float2 *>(dst) = make_float2(glmrt_attn_normalize(acc[2 * half], total),
                                                               glmrt_attn_normalize(acc[2 * half + 1], total));
            }
        } else {
            const int64_t index = ((int64_t)item.partial * num_kv_heads + kv_head) * args.group + row;
            if (warp < GLMRT_SPREAD_SLICE_CHUNKS) {
                *reinterpret_cast<float2 *>(args.partial_out + index * HD + column) =
                    make_float2(acc[2 * half], acc[2 * half + 1]);
            }
            if (rank == 0 && warp == 0 && t == 0) {
                args.partial_stats[index * 2] = run_max[half];
                args.partial_stats[index * 2 + 1] = total;
            }
        }
    }
    __syncthreads();
}

template <int HD>
__global__ void __launch_bounds__(glmrt_decode_shape<HD, 1>::threads, GLMRT_SPREAD_BLOCKS_AN_SM)
    glmrt_attention_decode_spread_kernel(glmrt_cuda_attention_args args)
{
    using shape = glmrt_spread_shape<HD>;
    glmrt_dependent_enter();
    extern __shared__ __align__(128) uint8_t spread_shared[];
    const int32_t count = glmrt_attention_item_count(args);
    const int32_t clusters = (int32_t)gridDim.x / shape::blocks;
    if (count <= clusters) {
        const int32_t index = (int32_t)blockIdx.x / shape::blocks;
        if (index < count) {
            glmrt_decode_spread_item<HD>(args, args.items[index], spread_shared);
        }
        return;
    }
    for (int32_t index = blockIdx.x; index < count; index += gridDim.x) {
        glmrt_decode_item<HD, GLMRT_DECODE_STAGES>(args, args.items[index], spread_shared);
        __syncthreads();
    }
}

template <int HD>
static glmrt_attention_kernel_choice glmrt_spread_choice_of(void)
{
    glmrt_attention_kernel_choice choice = {glmrt_attention_decode_spread_kernel<HD>, glmrt_spread_shape<HD>::shared_bytes,
                                            glmrt_spread_shape<HD>::tile::threads, "spread decode attention"};
    return choice;
}

static glmrt_attention_kernel_choice glmrt_spread_pick(int32_t head_dim)
{
    switch (head_dim) {
    case 32: return glmrt_spread_choice_of<32>();
    case 64: return glmrt_spread_choice_of<64>();
    case 128: return glmrt_spread_choice_of<128>();
    default: {
        glmrt_attention_kernel_choice none = {nullptr, 0, 0, "spread decode attention"};
        return none;
    }
    }
}

int32_t glmrt_cuda_attention_spread_items(int32_t head_dim, int32_t num_kv_heads, int32_t sms)
{
    if (glmrt_spread_pick(head_dim).kernel == nullptr || num_kv_heads < 1) {
        return 0;
    }
    return sms / (glmrt_spread_blocks(head_dim) * num_kv_heads);
}

int32_t glmrt_attention_decode_spread_clusters(const glmrt_cuda_attention_args *args, int32_t sms)
{
    const int32_t one_wave = glmrt_cuda_attention_spread_items(args->kv.head_dim, args->kv.num_kv_heads, sms);
    const int32_t grid_items = glmrt_attention_grid_items(args);
    if (args->decode_path == GLMRT_ATTENTION_DECODE_BLOCK ||
        (args->decode_path != GLMRT_ATTENTION_DECODE_SPREAD && grid_items > one_wave)) {
        return 0;
    }
    const int32_t resident = GLMRT_SPREAD_BLOCKS_AN_SM * one_wave;
    const int32_t clusters = resident < grid_items ? resident : grid_items;
    return clusters > 0 ? clusters : 1;
}

glmrt_status glmrt_attention_decode_spread_prepare(int32_t head_dim, glmrt_error *error)
{
    const glmrt_attention_kernel_choice choice = glmrt_spread_pick(head_dim);
    return glmrt_attention_kernel_prepare(&choice, head_dim, error);
}

glmrt_status glmrt_attention_decode_spread_launch(const glmrt_cuda_attention_args *args, int32_t clusters,
                                                  cudaStream_t stream, glmrt_error *error)
{
    const glmrt_attention_kernel_choice choice = glmrt_spread_pick(args->kv.head_dim);
    if (choice.kernel == nullptr) {
        return glmrt_error_set(error, GLMRT_ERR_INVARIANT, "no %s kernel for head_dim %d", choice.name,
                               args->kv.head_dim);
    }
    if (clusters < 1) {
        return glmrt_error_set(error, GLMRT_ERR_INVARIANT, "spread decode attention needs a cluster a head, got %d",
                               clusters);
    }
    const int32_t blocks = glmrt_spread_blocks(args->kv.head_dim);
    dim3 grid((unsigned)(clusters * blocks), (unsigned)args->kv.num_kv_heads);
    glmrt_dependent_launch dependent;
    const cudaLaunchConfig_t *config =
        glmrt_dependent_cluster_config(&dependent, grid, choice.threads, choice.shared, stream, (unsigned)blocks);
    GLMRT_CUDA_TRY(error, cudaLaunchKernelEx(config, choice.kernel, *args));
    return GLMRT_OK;
}
