#ifndef GLMRT_PEER_REDUCE_DEVICE_CUH
#define GLMRT_PEER_REDUCE_DEVICE_CUH

#include <cuda_runtime.h>
#include <stdint.h>

#include "peer_reduce.cuh"

#define GLMRT_PEER_ABORT_POLL 1024u
#define GLMRT_PEER_SIGNAL_SETS 2
#define GLMRT_PEER_AFTER_SEND 0
#define GLMRT_PEER_AFTER_SUM 1

typedef struct glmrt_peer_reduce_args {
    float4 *x;
    float4 *residual;
    int64_t count4;
    int64_t capacity;
    float *own_staging;
    unsigned long long *own_signals;
    unsigned long long *epochs;
    float *peer_staging[GLMRT_MAX_DEVICES];
    unsigned long long *peer_signals[GLMRT_MAX_DEVICES];
    const volatile int32_t *abort_flag;
    int32_t rank;
    int32_t num_ranks;
} glmrt_peer_reduce_args;

typedef struct glmrt_peer_span {
    int64_t begin;
    int64_t end;
} glmrt_peer_span;

static __device__ __forceinline__ void glmrt_store_release_system(unsigned long long *slot, unsigned long long value)
{
    asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(slot), "l"(value) : "memory");
}

static __device__ __forceinline__ unsigned long long glmrt_load_acquire_system(const unsigned long long *slot)
{
    unsigned long long value;
    asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(value) : "l"(slot) : "memory");
    return value;
}

static __device__ __forceinline__ int64_t glmrt_peer_slot(int32_t set, int32_t rank, int32_t block)
{
    return ((int64_t)set * GLMRT_MAX_DEVICES + rank) * GLMRT_PEER_REDUCE_MAX_BLOCKS + block;
}

static __device__ int glmrt_peer_wait_for(const glmrt_peer_reduce_args &a, const unsigned long long *slot,
                                          unsigned long long epoch)
{
    uint32_t spins = 0;
    while (glmrt_load_acquire_system(slot) < epoch) {
        spins += 1;
        if (spins % GLMRT_PEER_ABORT_POLL == 0 && *a.abort_flag != 0) {
            return 1;
        }
    }
    return 0;
}

static __device__ int glmrt_peer_barrier(const glmrt_peer_reduce_args &a, int32_t set, unsigned long long epoch)
{
    const int32_t block = (int32_t)blockIdx.x;
    const int32_t peer = (int32_t)threadIdx.x;
    __syncthreads();
    int aborted = 0;
    if (peer < a.num_ranks && peer != a.rank) {
        glmrt_store_release_system(a.peer_signals[peer] + glmrt_peer_slot(set, a.rank, block), epoch);
        aborted = glmrt_peer_wait_for(a, a.own_signals + glmrt_peer_slot(set, peer, block), epoch);
    }
    return __syncthreads_or(aborted);
}

static __device__ unsigned long long glmrt_peer_next_epoch(const glmrt_peer_reduce_args &a)
{
    __shared__ unsigned long long shared_epoch;
    if (threadIdx.x == 0) {
        shared_epoch = a.epochs[blockIdx.x] + 1ull;
        a.epochs[blockIdx.x] = shared_epoch;
    }
    __syncthreads();
    return shared_epoch;
}

static __device__ __forceinline__ glmrt_peer_span glmrt_peer_block_part(int64_t begin, int64_t end)
{
    const int64_t per_block = (end - begin + gridDim.x - 1) / gridDim.x;
    glmrt_peer_span part;
    part.begin = begin + (int64_t)blockIdx.x * per_block;
    part.end = part.begin + per_block < end ? part.begin + per_block : end;
    part.begin = part.begin < end ? part.begin : end;
    return part;
}

static __device__ __forceinline__ glmrt_peer_span glmrt_peer_slice_part(const glmrt_peer_reduce_args &a, int32_t slice)
{
    const int64_t begin = a.count4 * slice / a.num_ranks;
    const int64_t end = a.count4 * (slice + 1) / a.num_ranks;
    return glmrt_peer_block_part(begin, end);
}

static __device__ __forceinline__ void glmrt_float4_add(float4 &sum, const float4 &v)
{
    sum.x += v.x;
    sum.y += v.y;
    sum.z += v.z;
    sum.w += v.w;
}

static __device__ __forceinline__ int64_t glmrt_peer_slot_offset(const glmrt_peer_reduce_args &a, int64_t half,
                                                                  int32_t sender)
{
    return (half * a.num_ranks + sender) * a.capacity;
}

template <typename PAYLOAD>
static __device__ __forceinline__ PAYLOAD *glmrt_peer_inbox(const glmrt_peer_reduce_args &a, int32_t receiver,
                                                            int64_t half, int32_t sender)
{
    return reinterpret_cast<PAYLOAD *>(a.peer_staging[receiver] + glmrt_peer_slot_offset(a, half, sender));
}

template <typename PAYLOAD>
static __device__ __forceinline__ const PAYLOAD *glmrt_peer_own_inbox(const glmrt_peer_reduce_args &a, int64_t half,
                                                                      int32_t sender)
{
    return reinterpret_cast<const PAYLOAD *>(a.own_staging + glmrt_peer_slot_offset(a, half, sender));
}

template <typename PAYLOAD>
static __device__ __forceinline__ void glmrt_peer_send_to_others(const glmrt_peer_reduce_args &a, int64_t half,
                                                                 int64_t i, const PAYLOAD &value)
{
#pragma unroll
    for (int32_t q = 0; q < GLMRT_MAX_DEVICES; ++q) {
        if (q < a.num_ranks && q != a.rank) {
            glmrt_peer_inbox<PAYLOAD>(a, q, half, a.rank)[i] = value;
        }
    }
}

static __device__ __forceinline__ int32_t glmrt_peer_rotated(const glmrt_peer_reduce_args &a, int32_t step)
{
    return (a.rank + step) % a.num_ranks;
}

glmrt_status glmrt_peer_reduce_args_for(const glmrt_cuda_peer_reduce *peer, float *x, int64_t count,
                                        glmrt_peer_reduce_args *args, glmrt_error *error);
void glmrt_peer_link_args(const glmrt_cuda_peer_reduce *peer, glmrt_peer_reduce_args *args);
glmrt_status glmrt_peer_launched(const char *what, int64_t count, glmrt_error *error);
glmrt_peer_shots glmrt_peer_shots_for(int64_t count, glmrt_peer_shots shots);
glmrt_status glmrt_peer_resident_blocks(int32_t device, const void *kernel, int32_t *out_blocks, glmrt_error *error);
glmrt_status glmrt_peer_bf16_resident_blocks(int32_t device, int32_t *blocks, glmrt_error *error);
glmrt_status glmrt_peer_gather_resident_blocks(int32_t device, int32_t *blocks, glmrt_error *error);

#endif
