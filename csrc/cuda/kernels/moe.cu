#include <math.h>

#include "dependent_launch.cuh"
#include "cuda_check.cuh"
#include "device_math.cuh"
#include "moe.cuh"

#define GLMRT_ROUTE_PER_LANE (GLMRT_MOE_MAX_EXPERTS / 32)
#define GLMRT_ROUTE_WARPS 4
#define GLMRT_DISPATCH_THREADS 1024
#define GLMRT_ROUTE_DISPATCH_TOKENS (GLMRT_DISPATCH_THREADS / 32)
#define GLMRT_COMBINE_THREADS 128
#define GLMRT_COMBINE_LOADS 8

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

__device__ __forceinline__ void glmrt_lane_best(const float *choice, const bool *taken, int lane, int32_t first,
                                                int32_t end, float &value, int32_t &index)
{
    value = -INFINITY;
    index = -1;
#pragma unroll
    for (int i = 0; i < GLMRT_ROUTE_PER_LANE; ++i) {
        int32_t e = lane + 32 * i;
        if (e >= first && e < end && !taken[i]) {
            if (index < 0 || choice[i] > value) {
                value = choice[i];
                index = e;
            }
        }
    }
}

__device__ void glmrt_route_token(const glmrt_cuda_route_args &args, int32_t token, int lane)
{
    const float *logits = args.logits + (int64_t)token * args.num_experts;
    float score[GLMRT_ROUTE_PER_LANE];
    float choice[GLMRT_ROUTE_PER_LANE];
    bool taken[GLMRT_ROUTE_PER_LANE];
#pragma unroll
    for (int i = 0; i < GLMRT_ROUTE_PER_LANE; ++i) {
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
            glmrt_lane_best(choice, taken, lane, g * group_size, (g + 1) * group_size, first_value, first_index);
            glmrt_warp_best(first_value, first_index);
            float total = first_value;
            if (group_size >= 2) {
                bool skip[GLMRT_ROUTE_PER_LANE];
#pragma unroll
                for (int i = 0; i < GLMRT_ROUTE_PER_LANE; ++i) {
                    skip[i] = taken[i] || (lane + 32 * i) == first_index;
                }
                float second_value;
                int32_t second_index;
                glmrt_lane_best(choice, skip, lane, g * group_size, (g + 1) * group_size, second_value, second_index);
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
        for (int i = 0; i < GLMRT_ROUTE_PER_LANE; ++i) {
            int32_t e = lane + 32 * i;
            if (e < args.num_experts && !((kept >> (e / group_size)) & 1u)) {
                choice[i] = -INFINITY;
            }
        }
    }
    float sum = 0.0f;
    float weights[GLMRT_MOE_MAX_TOP_K];
    int32_t ids[GLMRT_MOE_MAX_TOP_K];
    for (int32_t slot = 0; slot < args.top_k; ++slot) {
        float value;
        int32_t index;
        glmrt_lane_best(choice, taken, lane, 0, args.num_experts, value, index);
        glmrt_warp_best(value, index);
        float weight = 0.0f;
#pragma unroll
        for (int i = 0; i < GLMRT_ROUTE_PER_LANE; ++i) {
            if (lane + 32 * i == index) {
                taken[i] = true;
                weight = score[i];
            }
        }
        weight = __shfl_sync(GLMRT_FULL_MASK, weight, index % 32);
        ids[slot] = index;
        weights[slot] = weight;
        sum += weight;
    }
    if (lane == 0) {
        float denominator = sum + 1e-20f;
        for (int32_t slot = 0; slot < args.top_k; ++slot) {
            float weight = args.normalize ? weights[slot] / denominator : weights[slot];
            args.topk_ids[(int64_t)token * args.top_k + slot] = ids[slot];
            args.topk_weights[(int64_t)token * args.top_k + slot] = weight * args.scaling;
        }
    }
}

__global__ void glmrt_route_kernel(glmrt_cuda_route_args args)
{
    glmrt_dependent_enter();
    int32_t token = blockIdx.x * GLMRT_ROUTE_WARPS + (threadIdx.x >> 5);
    if (token < args.num_tokens) {
        glmrt_route_token(args, token, threadIdx.x & 31);
    }
}

glmrt_status glmrt_cuda_moe_check(int32_t num_experts, int32_t top_k, int32_t num_groups, glmrt_error *error)
{
    if (num_experts < 1 || num_experts > GLMRT_MOE_MAX_EXPERTS) {
        return glmrt_error_set(error, GLMRT_ERR_UNSUPPORTED, "CUDA MoE supports 1 to %d experts, the model has %d",
                               GLMRT_MOE_MAX_EXPERTS, num_experts);
    }
    if (top_k < 1 || top_k > GLMRT_MOE_MAX_TOP_K || top_k > num_experts) {
        return glmrt_error_set(error, GLMRT_ERR_UNSUPPORTED, "CUDA MoE supports 1 to %d experts a token, the model has %d",
                               GLMRT_MOE_MAX_TOP_K, top_k);
    }
    if (num_groups < 1 || num_groups > GLMRT_MOE_MAX_GROUPS || num_experts % num_groups != 0) {
        return glmrt_error_set(error, GLMRT_ERR_UNSUPPORTED, "CUDA MoE cannot split %d experts into %d groups",
                               num_experts, num_groups);
    }
    return GLMRT_OK;
}

glmrt_status glmrt_cuda_moe_route(const glmrt_cuda_route_args *args, cudaStream_t stream, glmrt_error *error)
{
    if (args->num_tokens <= 0) {
        return GLMRT_OK;
    }
    unsigned blocks = (unsigned)glmrt_ceil_div(args->num_tokens, GLMRT_ROUTE_WARPS);
    glmrt_dependent_launch dependent;
    const cudaLaunchConfig_t *config = glmrt_dependent_config(&dependent, blocks, GLMRT_ROUTE_WARPS * 32, 0, stream);
    GLMRT_CUDA_TRY(error, cudaLaunchKernelEx(config, glmrt_route_kernel, *args));
    return GLMRT_OK;
}

int32_t glmrt_cuda_moe_max_tiles(int32_t num_assignments, int32_t num_local_experts, int32_t tile_rows)
{
    int32_t busy = num_assignments < num_local_experts ? num_assignments : num_local_experts;
    return glmrt_ceil_div(num_assignments, tile_rows) + busy;
}

__device__ __forceinline__ int32_t glmrt_dispatch_tiles(int32_t count, int32_t tile_rows)
{
    return (count + tile_rows - 1) / tile_rows;
}

__device__ void glmrt_dispatch_offsets(const glmrt_cuda_dispatch_args &args, const int32_t *counts, int32_t *offsets,
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

__device__ void glmrt_dispatch_block(const glmrt_cuda_dispatch_args &args)
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
        int32_t first_tile = tile_offsets[e];
        int32_t count = counts[e];
        for (int32_t t = 0; t * args.tile_rows < count; ++t) {
            glmrt_cuda_gemm_tile tile;
            tile.group = e;
            tile.row_begin = offsets[e] + t * args.tile_rows;
            tile.num_rows = min(args.tile_rows, count - t * args.tile_rows);
            tile.reserved = 0;
            args.tiles[first_tile + t] = tile;
        }
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

__global__ void __launch_bounds__(GLMRT_DISPATCH_THREADS) glmrt_dispatch_kernel(glmrt_cuda_dispatch_args args)
{
    glmrt_dependent_enter();
    glmrt_dispatch_block(args);
}

__global__ void __launch_bounds__(GLMRT_DISPATCH_THREADS)
    glmrt_route_dispatch_kernel(glmrt_cuda_route_args route, glmrt_cuda_dispatch_args dispatch)
{
    glmrt_dependent_enter();
    const int32_t warps = (int32_t)(blockDim.x >> 5);
    for (int32_t token = (int32_t)(threadIdx.x >> 5); token < route.num_tokens; token += warps) {
        glmrt_route_token(route, token, threadIdx.x & 31);
    }
    __syncthreads();
    glmrt_dispatch_block(dispatch);
}

static glmrt_status glmrt_dispatch_check(const glmrt_cuda_dispatch_args *args, glmrt_error *error)
{
    if (args->num_local_experts > GLMRT_MOE_MAX_EXPERTS) {
        return glmrt_error_set(error, GLMRT_ERR_UNSUPPORTED, "%d local experts exceed %d", args->num_local_experts,
                               GLMRT_MOE_MAX_EXPERTS);
    }
    return GLMRT_OK;
}

glmrt_status glmrt_cuda_moe_route_dispatch(const glmrt_cuda_route_args *route, const glmrt_cuda_dispatch_args *dispatch,
                                           cudaStream_t stream, glmrt_error *error)
{
    if (route->num_tokens <= 0) {
        return GLMRT_OK;
    }
    if (route->num_tokens > GLMRT_ROUTE_DISPATCH_TOKENS) {
        GLMRT_TRY(glmrt_cuda_moe_route(route, stream, error));
        return glmrt_cuda_moe_dispatch(dispatch, stream, error);
    }
    GLMRT_TRY(glmrt_dispatch_check(dispatch, error));
    glmrt_dependent_launch dependent;
    const cudaLaunchConfig_t *config = glmrt_dependent_config(&dependent, 1, GLMRT_DISPATCH_THREADS, 0, stream);
    GLMRT_CUDA_TRY(error, cudaLaunchKernelEx(config, glmrt_route_dispatch_kernel, *route, *dispatch));
    return GLMRT_OK;
}

glmrt_status glmrt_cuda_moe_dispatch(const glmrt_cuda_dispatch_args *args, cudaStream_t stream, glmrt_error *error)
{
    if (args->num_tokens <= 0) {
        return GLMRT_OK;
    }
    GLMRT_TRY(glmrt_dispatch_check(args, error));
    glmrt_dependent_launch dependent;
    const cudaLaunchConfig_t *config = glmrt_dependent_config(&dependent, 1, GLMRT_DISPATCH_THREADS, 0, stream);
    GLMRT_CUDA_TRY(error, cudaLaunchKernelEx(config, glmrt_dispatch_kernel, *args));
    return GLMRT_OK;
}

__device__ __forceinline__ float4 glmrt_combine_scaled(const float *expert_out, int64_t offset, float weight)
{
    const float4 v = *reinterpret_cast<const float4 *>(expert_out + offset);
    return make_float4(__fmul_rn(v.x, weight), __fmul_rn(v.y, weight), __fmul_rn(v.z, weight), __fmul_rn(v.w, weight));
}

__device__ __forceinline__ float4 glmrt_combine_add(float4 a, float4 b)
{
    return make_float4(__fadd_rn(a.x, b.x), __fadd_rn(a.y, b.y), __fadd_rn(a.z, b.z), __fadd_rn(a.w, b.w));
}

__global__ void __launch_bounds__(GLMRT_COMBINE_THREADS) glmrt_combine_kernel(glmrt_cuda_combine_args args)
{
    glmrt_dependent_enter();
    const int32_t token = blockIdx.x;
    const int32_t d = 4 * ((int32_t)blockIdx.y * GLMRT_COMBINE_THREADS + (int32_t)threadIdx.x);
    if (d >= args.hidden_size) {
        return;
    }
    const int32_t *rows = args.assignment_row + (int64_t)token * args.top_k;
    const float *weights = args.topk_weights + (int64_t)token * args.top_k;
    float4 routed = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int32_t base = 0; base < args.top_k; base += GLMRT_COMBINE_LOADS) {
        float4 values[GLMRT_COMBINE_LOADS];
        int32_t slot_rows[GLMRT_COMBINE_LOADS];
#pragma unroll
        for (int32_t k = 0; k < GLMRT_COMBINE_LOADS; ++k) {
            slot_rows[k] = base + k < args.top_k ? rows[base + k] : -1;
            values[k] = slot_rows[k] >= 0
                            ? glmrt_combine_scaled(args.expert_out, (int64_t)slot_rows[k] * args.hidden_size + d,
                                                   weights[base + k])
                            : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
#pragma unroll
        for (int32_t k = 0; k < GLMRT_COMBINE_LOADS; ++k) {
            if (slot_rows[k] >= 0) {
                routed = glmrt_combine_add(routed, values[k]);
            }
        }
    }
    float4 *hidden = reinterpret_cast<float4 *>(args.hidden + (int64_t)token * args.hidden_size + d);
    float4 mixed = routed;
    if (args.shared_out != nullptr) {
        mixed = glmrt_combine_add(routed,
                                  *reinterpret_cast<const float4 *>(args.shared_out + (int64_t)token * args.hidden_size + d));
    }
    *hidden = args.add_residual ? glmrt_combine_add(*hidden, mixed) : mixed;
}

glmrt_status glmrt_cuda_moe_combine(const glmrt_cuda_combine_args *args, cudaStream_t stream, glmrt_error *error)
{
    if (args->num_tokens <= 0) {
        return GLMRT_OK;
    }
    if (args->hidden_size % 4 != 0 || ((uintptr_t)args->hidden & 15u) != 0 || ((uintptr_t)args->expert_out & 15u) != 0 ||
        (args->shared_out != nullptr && ((uintptr_t)args->shared_out & 15u) != 0)) {
        return glmrt_error_set(error, GLMRT_ERR_INVARIANT,
                               "the MoE combine reads 16-byte aligned rows of a multiple of 4 values, got %d",
                               args->hidden_size);
    }
    dim3 grid((unsigned)args->num_tokens,
              (unsigned)glmrt_ceil_div(args->hidden_size, 4 * GLMRT_COMBINE_THREADS));
    glmrt_dependent_launch dependent;
    const cudaLaunchConfig_t *config = glmrt_dependent_config(&dependent, grid, GLMRT_COMBINE_THREADS, 0, stream);
    GLMRT_CUDA_TRY(error, cudaLaunchKernelEx(config, glmrt_combine_kernel, *args));
    return GLMRT_OK;
}
