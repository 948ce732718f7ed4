#ifndef GLMRT_MOE_BLOCKS_CUH
#define GLMRT_MOE_BLOCKS_CUH

#include <math.h>

#include "device_math.cuh"
#include "moe.cuh"

#define GLMRT_ROUTE_PER_LANE (GLMRT_MOE_MAX_EXPERTS / 32)

__device__ __forceinline__ bool glmrt_route_better(float a, int32_t ia, float b, int32_t ib)
{
    return a > b || (a == b && ia < ib && a == a);
}

__device__ __forceinline__ void glmrt_warp_best(float &value, int32_t &index)
{
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
        float other = __shfl_xor_sync(GLMRT_FULL_MASK, value, offset);
        int32_t other_index = __shfl_xor_sync(GLMRT_FULL_MASK, index, offset);
        bool take = index < 0 || (other_index >= 0 && glmrt_route_better(other, other_index, value, index));
        if (take) {
            value = other;
            index = other_index;
        }
    }
}

template <int PER_LANE>
__device__ __forceinline__ void glmrt_lane_best(const float *choice, const bool *taken, int lane, int32_t first,
                                                int32_t end, float &value, int32_t &index)
{
    value = -INFINITY;
    index = -1;
#pragma unroll
    for (int i = 0; i < PER_LANE; ++i) {
        int32_t e = lane + 32 * i;
        if (e >= first && e < end && !taken[i]) {
            if (index < 0 || choice[i] > value) {
                value = choice[i];
                index = e;
            }
        }
    }
}

__device__ __forceinline__ uint32_t glmrt_route_key(float value)
{
    if (value != value) {
        return 0u;
    }
    const uint32_t bits = value == 0.0f ? 0u : __float_as_uint(value);
    return (bits & 0x80000000u) != 0u ? ~bits : (bits | 0x80000000u);
}

template <int PER_LANE>
__device__ __forceinline__ int32_t glmrt_warp_first_alive(const uint32_t *keys, const bool *taken, int lane)
{
    uint32_t best_key = 0u;
    uint32_t best_index = 0xffffffffu;
#pragma unroll
    for (int i = 0; i < PER_LANE; ++i) {
        if (!taken[i] && (best_index == 0xffffffffu || keys[i] > best_key)) {
            best_key = keys[i];
            best_index = (uint32_t)(lane + 32 * i);
        }
    }
    const uint32_t top = __reduce_max_sync(GLMRT_FULL_MASK, best_key);
    const uint32_t candidate = best_index != 0xffffffffu && best_key == top ? best_index : 0xffffffffu;
    return (int32_t)__reduce_min_sync(GLMRT_FULL_MASK, candidate);
}

template <int PER_LANE>
static __device__ void glmrt_route_token_lanes(const glmrt_cuda_route_args &args, int32_t token, int lane)
{
    const float *logits = args.logits + (int64_t)token * args.num_experts;
    float score[PER_LANE];
    float choice[PER_LANE];
    bool taken[PER_LANE];
#pragma unroll
    for (int i = 0; i < PER_LANE; ++i) {
        int32_t e = lane + 32 * i;
        taken[i] = e >= args.num_experts;
        score[i] = 0.0f;
        choice[i] = -INFINITY;
        if (e < args.num_experts) {
            score[i] = 1.0f / (1.0f + expf(-logits[e]));
            choice[i] = args.correction_bias != nullptr ? score[i] + args.correction_bias[e] : score[i];
        }
    }
    if (args.keep_groups < args.num_groups) {
        int32_t group_size = args.num_experts / args.num_groups;
        float group_score = -INFINITY;
        for (int32_t g = 0; g < args.num_groups; ++g) {
            float first_value;
            int32_t first_index;
            glmrt_lane_best<PER_LANE>(choice, taken, lane, g * group_size, (g + 1) * group_size, first_value,
                                      first_index);
            glmrt_warp_best(first_value, first_index);
            float total = first_value;
            if (group_size >= 2) {
                bool skip[PER_LANE];
#pragma unroll
                for (int i = 0; i < PER_LANE; ++i) {
                    skip[i] = taken[i] || (lane + 32 * i) == first_index;
                }
                float second_value;
                int32_t second_index;
                glmrt_lane_best<PER_LANE>(choice, skip, lane, g * group_size, (g + 1) * group_size, second_value,
                                          second_index);
                glmrt_warp_best(second_value, second_index);
                total = first_value + second_value;
            }
            if (lane == g) {
                group_score = total;
            }
        }
        bool group_taken = lane >= args.num_groups;
        uint32_t kept = 0;
        for (int32_t round = 0; round < args.keep_groups; ++round) {
            float value = group_taken ? -INFINITY : group_score;
            int32_t index = group_taken ? -1 : lane;
            glmrt_warp_best(value, index);
            if (lane == index) {
                group_taken = true;
            }
            kept |= 1u << index;
        }
#pragma unroll
        for (int i = 0; i < PER_LANE; ++i) {
            int32_t e = lane + 32 * i;
            if (e < args.num_experts && !((kept >> (e / group_size)) & 1u)) {
                choice[i] = -INFINITY;
            }
        }
    }
    float sum = 0.0f;
    int32_t slot_id = -1;
    float slot_weight = 0.0f;
    uint32_t keys[PER_LANE];
#pragma unroll
    for (int i = 0; i < PER_LANE; ++i) {
        keys[i] = glmrt_route_key(choice[i]);
    }
    for (int32_t slot = 0; slot < args.top_k; ++slot) {
        const int32_t index = glmrt_warp_first_alive<PER_LANE>(keys, taken, lane);
        float weight = 0.0f;
#pragma unroll
        for (int i = 0; i < PER_LANE; ++i) {
            if (lane + 32 * i == index) {
                taken[i] = true;
                weight = score[i];
            }
        }
        weight = __shfl_sync(GLMRT_FULL_MASK, weight, index % 32);
        if (lane == slot) {
            slot_id = index;
            slot_weight = weight;
        }
        sum += weight;
    }
    if (lane < args.top_k) {
        const float denominator = sum + 1e-20f;
        const float weight = args.normalize ? slot_weight / denominator : slot_weight;
        args.topk_ids[(int64_t)token * args.top_k + lane] = slot_id;
        args.topk_weights[(int64_t)token * args.top_k + lane] = weight * args.scaling;
    }
}

static __device__ void glmrt_route_token(const glmrt_cuda_route_args &args, int32_t token, int lane)
{
    if (args.num_experts <= 64) {
        glmrt_route_token_lanes<2>(args, token, lane);
    } else if (args.num_experts <= 160) {
        glmrt_route_token_lanes<5>(args, token, lane);
    } else if (args.num_experts <= 256) {
        glmrt_route_token_lanes<8>(args, token, lane);
    } else {
        glmrt_route_token_lanes<GLMRT_ROUTE_PER_LANE>(args, token, lane);
    }
}

__device__ __forceinline__ int32_t glmrt_dispatch_tiles(int32_t count, int32_t tile_rows)
{
    return (count + tile_rows - 1) / tile_rows;
}

__device__ __forceinline__ void glmrt_dispatch_write_tiles(const glmrt_cuda_dispatch_args &args, int32_t expert,
                                                           int32_t first_row, int32_t count, int32_t first_tile)
{
    for (int32_t t = 0; t * args.tile_rows < count; ++t) {
        glmrt_cuda_gemm_tile tile;
        tile.group = expert;
        tile.row_begin = first_row + t * args.tile_rows;
        tile.num_rows = min(args.tile_rows, count - t * args.tile_rows);
        tile.reserved = 0;
        args.tiles[first_tile + t] = tile;
    }
}

static __device__ void glmrt_dispatch_offsets(const glmrt_cuda_dispatch_args &args, const int32_t *counts, int32_t *offsets,
                                       int32_t *tile_offsets, int lane)
{
    const int32_t experts = args.num_local_experts;
    const int32_t per_lane = (experts + 31) / 32;
    const int32_t first = lane * per_lane;
    const int32_t end = min(experts, first + per_lane);
    int32_t rows = 0;
    int32_t tiles = 0;
    for (int32_t e = first; e < end; ++e) {
        rows += counts[e];
        tiles += glmrt_dispatch_tiles(counts[e], args.tile_rows);
    }
    int32_t rows_through = rows;
    int32_t tiles_through = tiles;
#pragma unroll
    for (int offset = 1; offset < 32; offset <<= 1) {
        const int32_t rows_below = __shfl_up_sync(GLMRT_FULL_MASK, rows_through, offset);
        const int32_t tiles_below = __shfl_up_sync(GLMRT_FULL_MASK, tiles_through, offset);
        if (lane >= offset) {
            rows_through += rows_below;
            tiles_through += tiles_below;
        }
    }
    int32_t running = rows_through - rows;
    int32_t running_tiles = tiles_through - tiles;
    for (int32_t e = first; e < end; ++e) {
        offsets[e] = running;
        tile_offsets[e] = running_tiles;
        running += counts[e];
        running_tiles += glmrt_dispatch_tiles(counts[e], args.tile_rows);
    }
    if (lane == 31) {
        offsets[experts] = rows_through;
        tile_offsets[experts] = tiles_through;
        *args.num_tiles = tiles_through;
        *args.num_sorted = rows_through;
    }
}

static __device__ void glmrt_dispatch_block(const glmrt_cuda_dispatch_args &args)
{
    __shared__ int32_t counts[GLMRT_MOE_MAX_EXPERTS];
    __shared__ int32_t offsets[GLMRT_MOE_MAX_EXPERTS + 1];
    __shared__ int32_t tile_offsets[GLMRT_MOE_MAX_EXPERTS + 1];
    const int32_t num_assignments = args.num_tokens * args.top_k;
    const int32_t experts = args.num_local_experts;
    for (int32_t e = threadIdx.x; e < experts; e += blockDim.x) {
        counts[e] = 0;
    }
    __syncthreads();
    for (int32_t a = threadIdx.x; a < num_assignments; a += blockDim.x) {
        int32_t local = args.topk_ids[a] - args.expert_begin;
        if (local >= 0 && local < experts) {
            atomicAdd(&counts[local], 1);
        }
    }
    __syncthreads();
    if (threadIdx.x < 32) {
        glmrt_dispatch_offsets(args, counts, offsets, tile_offsets, (int)threadIdx.x);
    }
    __syncthreads();
    for (int32_t e = threadIdx.x; e < experts; e += blockDim.x) {
        glmrt_dispatch_write_tiles(args, e, offsets[e], counts[e], tile_offsets[e]);
        counts[e] = 0;
    }
    __syncthreads();
    for (int32_t a = threadIdx.x; a < num_assignments; a += blockDim.x) {
        int32_t local = args.topk_ids[a] - args.expert_begin;
        if (local >= 0 && local < experts) {
            int32_t row = offsets[local] + atomicAdd(&counts[local], 1);
            args.sorted_token[row] = a / args.top_k;
            args.assignment_row[a] = row;
        } else {
            args.assignment_row[a] = -1;
        }
    }
}

#define GLMRT_DISPATCH_WARP_ASSIGNMENTS 32

typedef struct glmrt_dispatch_lane {
    int32_t local;
    int32_t count;
    bool leads;
    int32_t rows_before;
    int32_t tiles_before;
    int32_t total_rows;
    int32_t total_tiles;
} glmrt_dispatch_lane;

static __device__ glmrt_dispatch_lane glmrt_dispatch_lane_order(const glmrt_cuda_dispatch_args &args, int lane)
{
    glmrt_dispatch_lane order;
    order.local = -1;
    if (lane < args.num_tokens * args.top_k) {
        const int32_t e = args.topk_ids[lane] - args.expert_begin;
        order.local = e >= 0 && e < args.num_local_experts ? e : -1;
    }
    const uint32_t same = __match_any_sync(GLMRT_FULL_MASK, order.local);
    const uint32_t same_below = same & ((1u << lane) - 1u);
    order.count = __popc(same);
    order.leads = same_below == 0u && order.local >= 0;
    const int32_t tiles = order.leads ? glmrt_dispatch_tiles(order.count, args.tile_rows) : 0;
    order.rows_before = __popc(same_below);
    order.tiles_before = 0;
    order.total_rows = 0;
    order.total_tiles = 0;
    const int assignments = min(32, args.num_tokens * args.top_k);
    for (int src = 0; src < assignments; ++src) {
        const int32_t other = __shfl_sync(GLMRT_FULL_MASK, order.local, src);
        const int32_t other_tiles = __shfl_sync(GLMRT_FULL_MASK, tiles, src);
        if (other >= 0) {
            order.total_rows += 1;
            order.total_tiles += other_tiles;
            if (other < order.local) {
                order.rows_before += 1;
                order.tiles_before += other_tiles;
            }
        }
    }
    return order;
}

static __device__ void glmrt_dispatch_warp(const glmrt_cuda_dispatch_args &args, int lane)
{
    const glmrt_dispatch_lane order = glmrt_dispatch_lane_order(args, lane);
    if (order.leads) {
        glmrt_dispatch_write_tiles(args, order.local, order.rows_before, order.count, order.tiles_before);
    }
    if (lane < args.num_tokens * args.top_k) {
        if (order.local >= 0) {
            args.sorted_token[order.rows_before] = lane / args.top_k;
            args.assignment_row[lane] = order.rows_before;
        } else {
            args.assignment_row[lane] = -1;
        }
    }
    if (lane == 0) {
        *args.num_tiles = order.total_tiles;
        *args.num_sorted = order.total_rows;
    }
}

static __device__ void glmrt_dispatch_small(const glmrt_cuda_dispatch_args &args)
{
    if (args.num_tokens * args.top_k <= GLMRT_DISPATCH_WARP_ASSIGNMENTS) {
        if (threadIdx.x < 32) {
            glmrt_dispatch_warp(args, (int)threadIdx.x);
        }
        return;
    }
    glmrt_dispatch_block(args);
}

#endif
