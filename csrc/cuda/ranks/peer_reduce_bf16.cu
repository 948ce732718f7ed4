#include "cuda_check.cuh"
#include "device_math.cuh"
#include "peer_reduce.cuh"
#include "peer_reduce_device.cuh"

static __device__ __forceinline__ uint2 glmrt_peer_bf16_pack(float4 v)
{
    const uint32_t low = (uint32_t)glmrt_float_to_bf16_bits(v.x) | ((uint32_t)glmrt_float_to_bf16_bits(v.y) << 16);
    const uint32_t high = (uint32_t)glmrt_float_to_bf16_bits(v.z) | ((uint32_t)glmrt_float_to_bf16_bits(v.w) << 16);
    return make_uint2(low, high);
}

static __device__ __forceinline__ float4 glmrt_peer_bf16_unpack(uint2 bits)
{
    return glmrt_bf16x4_to_float4(bits.x, bits.y);
}

static __device__ __forceinline__ uint2 glmrt_peer_bf16_rounded_sum(const glmrt_peer_reduce_args &a, int64_t half,
                                                                    int64_t i, uint2 own)
{
    float4 sum = glmrt_peer_bf16_unpack(a.rank == 0 ? own : __ldcg(glmrt_peer_own_inbox<uint2>(a, half, 0) + i));
#pragma unroll
    for (int32_t p = 1; p < GLMRT_MAX_DEVICES; ++p) {
        if (p < a.num_ranks) {
            glmrt_float4_add(sum,
                             glmrt_peer_bf16_unpack(p == a.rank ? own : __ldcg(glmrt_peer_own_inbox<uint2>(a, half, p) + i)));
        }
    }
    return glmrt_peer_bf16_pack(sum);
}

static __device__ __forceinline__ void glmrt_peer_bf16_add_to_residual(const glmrt_peer_reduce_args &a, int64_t i,
                                                                       uint2 rounded)
{
    float4 residual = a.residual[i];
    glmrt_float4_add(residual, glmrt_peer_bf16_unpack(rounded));
    a.residual[i] = residual;
}

static __device__ __forceinline__ uint4 glmrt_peer_bf16_pack_pair(float4 low, float4 high)
{
    const uint2 first = glmrt_peer_bf16_pack(low);
    const uint2 second = glmrt_peer_bf16_pack(high);
    return make_uint4(first.x, first.y, second.x, second.y);
}

static __device__ __forceinline__ void glmrt_peer_bf16_add_pair(float4 &low, float4 &high, uint4 bits)
{
    glmrt_float4_add(low, glmrt_peer_bf16_unpack(make_uint2(bits.x, bits.y)));
    glmrt_float4_add(high, glmrt_peer_bf16_unpack(make_uint2(bits.z, bits.w)));
}

static __device__ __forceinline__ bool glmrt_peer_pair_has_high(const glmrt_peer_reduce_args &a, int64_t j)
{
    return 2 * j + 1 < a.count4;
}

static __device__ __forceinline__ uint4 glmrt_peer_bf16_own_pair(const glmrt_peer_reduce_args &a, int64_t j)
{
    const float4 high = glmrt_peer_pair_has_high(a, j) ? a.x[2 * j + 1] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    return glmrt_peer_bf16_pack_pair(a.x[2 * j], high);
}

static __device__ __forceinline__ uint4 glmrt_peer_bf16_rounded_pair_sum(const glmrt_peer_reduce_args &a, int64_t half,
                                                                         int64_t j, uint4 own)
{
    const uint4 first = a.rank == 0 ? own : __ldcg(glmrt_peer_own_inbox<uint4>(a, half, 0) + j);
    float4 low = glmrt_peer_bf16_unpack(make_uint2(first.x, first.y));
    float4 high = glmrt_peer_bf16_unpack(make_uint2(first.z, first.w));
#pragma unroll
    for (int32_t p = 1; p < GLMRT_MAX_DEVICES; ++p) {
        if (p < a.num_ranks) {
            glmrt_peer_bf16_add_pair(low, high,
                                     p == a.rank ? own : __ldcg(glmrt_peer_own_inbox<uint4>(a, half, p) + j));
        }
    }
    return glmrt_peer_bf16_pack_pair(low, high);
}

static __device__ __forceinline__ void glmrt_peer_bf16_add_pair_to_residual(const glmrt_peer_reduce_args &a, int64_t j,
                                                                            uint4 rounded)
{
    const bool has_high = glmrt_peer_pair_has_high(a, j);
    float4 low = a.residual[2 * j];
    float4 high = has_high ? a.residual[2 * j + 1] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    glmrt_peer_bf16_add_pair(low, high, rounded);
    a.residual[2 * j] = low;
    if (has_high) {
        a.residual[2 * j + 1] = high;
    }
}

__global__ void __launch_bounds__(GLMRT_PEER_REDUCE_THREADS) glmrt_peer_bf16_one_shot_kernel(glmrt_peer_reduce_args a)
{
    const unsigned long long epoch = glmrt_peer_next_epoch(a);
    const int64_t half = (int64_t)(epoch & 1ull);
    const glmrt_peer_span part = glmrt_peer_block_part(0, a.count4);
    for (int64_t i = part.begin + threadIdx.x; i < part.end; i += blockDim.x) {
        glmrt_peer_send_to_others(a, half, i, glmrt_peer_bf16_pack(a.x[i]));
    }
    if (glmrt_peer_barrier(a, GLMRT_PEER_AFTER_SEND, epoch)) {
        return;
    }
    for (int64_t i = part.begin + threadIdx.x; i < part.end; i += blockDim.x) {
        glmrt_peer_bf16_add_to_residual(a, i, glmrt_peer_bf16_rounded_sum(a, half, i, glmrt_peer_bf16_pack(a.x[i])));
    }
}

typedef struct glmrt_peer_pair_slices {
    int64_t units;
    int64_t unit_pairs;
} glmrt_peer_pair_slices;

static __device__ __forceinline__ glmrt_peer_span glmrt_peer_pair_slice(const glmrt_peer_pair_slices &slices,
                                                                        int32_t slice, int32_t num_ranks)
{
    return glmrt_peer_block_part(slices.units * slice / num_ranks * slices.unit_pairs,
                                 slices.units * (slice + 1) / num_ranks * slices.unit_pairs);
}

static __device__ __forceinline__ void glmrt_peer_bf16_take_slices(const glmrt_peer_reduce_args &a,
                                                                   const glmrt_peer_pair_slices &slices, int64_t half)
{
    for (int32_t step = 1; step < a.num_ranks; ++step) {
        const int32_t s = glmrt_peer_rotated(a, step);
        const glmrt_peer_span part = glmrt_peer_pair_slice(slices, s, a.num_ranks);
        const uint4 *inbox = glmrt_peer_own_inbox<uint4>(a, half, s);
        for (int64_t j = part.begin + threadIdx.x; j < part.end; j += blockDim.x) {
            glmrt_peer_bf16_add_pair_to_residual(a, j, __ldcg(inbox + j));
        }
    }
}

template <bool ALL_GATHER>
static __device__ __forceinline__ void glmrt_peer_bf16_by_slices(const glmrt_peer_reduce_args &a,
                                                                 const glmrt_peer_pair_slices &slices)
{
    const unsigned long long epoch = glmrt_peer_next_epoch(a);
    const int64_t half = (int64_t)(epoch & 1ull);
    for (int32_t step = 1; step < a.num_ranks; ++step) {
        const int32_t s = glmrt_peer_rotated(a, step);
        const glmrt_peer_span part = glmrt_peer_pair_slice(slices, s, a.num_ranks);
        uint4 *inbox = glmrt_peer_inbox<uint4>(a, s, half, a.rank);
        for (int64_t j = part.begin + threadIdx.x; j < part.end; j += blockDim.x) {
            inbox[j] = glmrt_peer_bf16_own_pair(a, j);
        }
    }
    if (glmrt_peer_barrier(a, GLMRT_PEER_AFTER_SEND, epoch)) {
        return;
    }
    const glmrt_peer_span mine = glmrt_peer_pair_slice(slices, a.rank, a.num_ranks);
    for (int64_t j = mine.begin + threadIdx.x; j < mine.end; j += blockDim.x) {
        const uint4 rounded = glmrt_peer_bf16_rounded_pair_sum(a, half, j, glmrt_peer_bf16_own_pair(a, j));
        glmrt_peer_bf16_add_pair_to_residual(a, j, rounded);
        if constexpr (ALL_GATHER) {
            glmrt_peer_send_to_others(a, half, j, rounded);
        }
    }
    if constexpr (ALL_GATHER) {
        if (!glmrt_peer_barrier(a, GLMRT_PEER_AFTER_SUM, epoch)) {
            glmrt_peer_bf16_take_slices(a, slices, half);
        }
    }
}

__global__ void __launch_bounds__(GLMRT_PEER_REDUCE_THREADS) glmrt_peer_bf16_two_shot_kernel(glmrt_peer_reduce_args a)
{
    glmrt_peer_pair_slices pairs;
    pairs.units = (a.count4 + 1) / 2;
    pairs.unit_pairs = 1;
    glmrt_peer_bf16_by_slices<true>(a, pairs);
}

__global__ void __launch_bounds__(GLMRT_PEER_REDUCE_THREADS)
    glmrt_peer_bf16_scatter_rows_kernel(glmrt_peer_reduce_args a, glmrt_peer_pair_slices rows)
{
    glmrt_peer_bf16_by_slices<false>(a, rows);
}

int glmrt_cuda_peer_scatter_rows_fits(const glmrt_cuda_peer_reduce *peer, int32_t num_rows, int32_t row_floats)
{
    return row_floats > 0 && row_floats % 8 == 0 && num_rows >= 1 &&
           glmrt_cuda_peer_reduce_fits(peer, (int64_t)num_rows * row_floats);
}

glmrt_status glmrt_cuda_peer_reduce_bf16_scatter_rows(const glmrt_cuda_peer_reduce *peer, const float *partial,
                                                      float *residual, int32_t num_rows, int32_t row_floats,
                                                      cudaStream_t stream, glmrt_error *error)
{
    const int64_t count = (int64_t)num_rows * row_floats;
    if (!glmrt_cuda_peer_scatter_rows_fits(peer, num_rows, row_floats) || (uintptr_t)residual % sizeof(float4) != 0) {
        return glmrt_error_set(error, GLMRT_ERR_INVARIANT,
                               "the BF16 peer reduce by rows takes rows of a multiple of 8 floats into a 16-byte "
                               "aligned residual within %lld floats, got %d rows of %d",
                               (long long)(peer == nullptr ? 0 : peer->capacity), num_rows, row_floats);
    }
    glmrt_peer_reduce_args args;
    GLMRT_TRY(glmrt_peer_reduce_args_for(peer, const_cast<float *>(partial), count, &args, error));
    args.residual = reinterpret_cast<float4 *>(residual);
    glmrt_peer_pair_slices rows;
    rows.units = num_rows;
    rows.unit_pairs = row_floats / 8;
    glmrt_peer_bf16_scatter_rows_kernel<<<peer->blocks, GLMRT_PEER_REDUCE_THREADS, 0, stream>>>(args, rows);
    return glmrt_peer_launched("the BF16 peer reduce by rows", count, error);
}

glmrt_status glmrt_peer_bf16_resident_blocks(int32_t device, int32_t *blocks, glmrt_error *error)
{
    GLMRT_TRY(glmrt_peer_resident_blocks(device, (const void *)glmrt_peer_bf16_one_shot_kernel, blocks, error));
    GLMRT_TRY(glmrt_peer_resident_blocks(device, (const void *)glmrt_peer_bf16_scatter_rows_kernel, blocks, error));
    return glmrt_peer_resident_blocks(device, (const void *)glmrt_peer_bf16_two_shot_kernel, blocks, error);
}

glmrt_status glmrt_cuda_peer_reduce_bf16_run_shots(const glmrt_cuda_peer_reduce *peer, const float *partial,
                                                   float *residual, int64_t count, glmrt_peer_shots shots,
                                                   cudaStream_t stream, glmrt_error *error)
{
    if ((uintptr_t)residual % sizeof(float4) != 0) {
        return glmrt_error_set(error, GLMRT_ERR_INVARIANT,
                               "the BF16 peer all-reduce needs a 16-byte aligned residual, got %p", (const void *)residual);
    }
    glmrt_peer_reduce_args args;
    GLMRT_TRY(glmrt_peer_reduce_args_for(peer, const_cast<float *>(partial), count, &args, error));
    args.residual = reinterpret_cast<float4 *>(residual);
    if (glmrt_peer_shots_for(count, shots) == GLMRT_PEER_ONE_SHOT) {
        glmrt_peer_bf16_one_shot_kernel<<<peer->blocks, GLMRT_PEER_REDUCE_THREADS, 0, stream>>>(args);
    } else {
        glmrt_peer_bf16_two_shot_kernel<<<peer->blocks, GLMRT_PEER_REDUCE_THREADS, 0, stream>>>(args);
    }
    return glmrt_peer_launched("the BF16 peer all-reduce", count, error);
}

glmrt_status glmrt_cuda_peer_reduce_bf16_run(const glmrt_cuda_peer_reduce *peer, const float *partial,
                                             float *residual, int64_t count, cudaStream_t stream,
                                             glmrt_error *error)
{
    return glmrt_cuda_peer_reduce_bf16_run_shots(peer, partial, residual, count, GLMRT_PEER_SHOTS_BY_SIZE, stream,
                                                 error);
}
