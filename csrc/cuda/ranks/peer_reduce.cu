#include <string.h>
#include <time.h>

#include "cuda_check.cuh"
#include "peer_reduce.cuh"
#include "peer_reduce_device.cuh"

#define GLMRT_PEER_CHECK_FLOATS (8 * GLMRT_PEER_REDUCE_MAX_BLOCKS)
#define GLMRT_PEER_CHECK_SECONDS 20
#define GLMRT_PEER_COPY_UNROLL 4

static __device__ __forceinline__ float4 glmrt_peer_ordered_sum(const glmrt_peer_reduce_args &a, int64_t half,
                                                                int64_t i)
{
    float4 values[GLMRT_MAX_DEVICES];
#pragma unroll
    for (int32_t p = 0; p < GLMRT_MAX_DEVICES; ++p) {
        if (p < a.num_ranks) {
            values[p] = p == a.rank ? a.x[i] : __ldcg(glmrt_peer_own_inbox<float4>(a, half, p) + i);
        }
    }
    float4 sum = values[0];
#pragma unroll
    for (int32_t p = 1; p < GLMRT_MAX_DEVICES; ++p) {
        if (p < a.num_ranks) {
            glmrt_float4_add(sum, values[p]);
        }
    }
    return sum;
}

static __device__ __forceinline__ void glmrt_peer_copy_part(float4 *target, const float4 *source, glmrt_peer_span part)
{
    const int64_t stride = blockDim.x;
    int64_t i = part.begin + threadIdx.x;
    for (; i + (GLMRT_PEER_COPY_UNROLL - 1) * stride < part.end; i += GLMRT_PEER_COPY_UNROLL * stride) {
        float4 values[GLMRT_PEER_COPY_UNROLL];
#pragma unroll
        for (int32_t u = 0; u < GLMRT_PEER_COPY_UNROLL; ++u) {
            values[u] = __ldcg(source + i + u * stride);
        }
#pragma unroll
        for (int32_t u = 0; u < GLMRT_PEER_COPY_UNROLL; ++u) {
            target[i + u * stride] = values[u];
        }
    }
    for (; i < part.end; i += stride) {
        target[i] = __ldcg(source + i);
    }
}

__global__ void __launch_bounds__(GLMRT_PEER_REDUCE_THREADS) glmrt_peer_one_shot_kernel(glmrt_peer_reduce_args a)
{
    const unsigned long long epoch = glmrt_peer_next_epoch(a);
    const int64_t half = (int64_t)(epoch & 1ull);
    const glmrt_peer_span part = glmrt_peer_block_part(0, a.count4);
    for (int64_t i = part.begin + threadIdx.x; i < part.end; i += blockDim.x) {
        glmrt_peer_send_to_others(a, half, i, a.x[i]);
    }
    if (glmrt_peer_barrier(a, GLMRT_PEER_AFTER_SEND, epoch)) {
        return;
    }
    for (int64_t i = part.begin + threadIdx.x; i < part.end; i += blockDim.x) {
        a.x[i] = glmrt_peer_ordered_sum(a, half, i);
    }
}

static __device__ void glmrt_peer_send_slices(const glmrt_peer_reduce_args &a, int64_t half)
{
    for (int32_t step = 1; step < a.num_ranks; ++step) {
        const int32_t s = glmrt_peer_rotated(a, step);
        glmrt_peer_copy_part(glmrt_peer_inbox<float4>(a, s, half, a.rank), a.x, glmrt_peer_slice_part(a, s));
    }
}

static __device__ void glmrt_peer_take_slices(const glmrt_peer_reduce_args &a, int64_t half)
{
    for (int32_t step = 1; step < a.num_ranks; ++step) {
        const int32_t s = glmrt_peer_rotated(a, step);
        glmrt_peer_copy_part(a.x, glmrt_peer_own_inbox<float4>(a, half, s), glmrt_peer_slice_part(a, s));
    }
}

__global__ void __launch_bounds__(GLMRT_PEER_REDUCE_THREADS) glmrt_peer_two_shot_kernel(glmrt_peer_reduce_args a)
{
    const unsigned long long epoch = glmrt_peer_next_epoch(a);
    const int64_t half = (int64_t)(epoch & 1ull);
    glmrt_peer_send_slices(a, half);
    if (glmrt_peer_barrier(a, GLMRT_PEER_AFTER_SEND, epoch)) {
        return;
    }
    const glmrt_peer_span mine = glmrt_peer_slice_part(a, a.rank);
    for (int64_t i = mine.begin + threadIdx.x; i < mine.end; i += blockDim.x) {
        const float4 sum = glmrt_peer_ordered_sum(a, half, i);
        a.x[i] = sum;
        glmrt_peer_send_to_others(a, half, i, sum);
    }
    if (glmrt_peer_barrier(a, GLMRT_PEER_AFTER_SUM, epoch)) {
        return;
    }
    glmrt_peer_take_slices(a, half);
}

glmrt_status glmrt_cuda_peer_unreachable(const int32_t *devices, int32_t num_devices, int32_t *out_from,
                                         int32_t *out_to, glmrt_error *error)
{
    *out_from = -1;
    *out_to = -1;
    for (int32_t r = 0; r < num_devices; ++r) {
        for (int32_t p = 0; p < num_devices; ++p) {
            int reachable = 1;
            if (p != r) {
                GLMRT_CUDA_TRY(error, cudaDeviceCanAccessPeer(&reachable, devices[r], devices[p]));
            }
            if (!reachable) {
                *out_from = devices[r];
                *out_to = devices[p];
                return GLMRT_OK;
            }
        }
    }
    return GLMRT_OK;
}

static glmrt_status glmrt_peer_enable_access(const glmrt_cuda_peer_group *group, glmrt_error *error)
{
    int32_t from = -1;
    int32_t to = -1;
    GLMRT_TRY(glmrt_cuda_peer_unreachable(group->devices, group->num_ranks, &from, &to, error));
    if (from >= 0) {
        return glmrt_error_set(error, GLMRT_ERR_UNSUPPORTED,
                               "all_reduce peer needs device %d to reach the memory of device %d directly, which this "
                               "machine does not allow; use all_reduce nccl",
                               from, to);
    }
    for (int32_t r = 0; r < group->num_ranks; ++r) {
        GLMRT_CUDA_TRY(error, cudaSetDevice(group->devices[r]));
        for (int32_t p = 0; p < group->num_ranks; ++p) {
            if (p == r) {
                continue;
            }
            cudaError_t enabled = cudaDeviceEnablePeerAccess(group->devices[p], 0);
            if (enabled == cudaErrorPeerAccessAlreadyEnabled) {
                cudaGetLastError();
            } else if (enabled != cudaSuccess) {
                cudaGetLastError();
                return glmrt_error_set(error, GLMRT_ERR_BACKEND, "cannot let device %d read device %d: %s",
                                       group->devices[r], group->devices[p], cudaGetErrorString(enabled));
            }
        }
    }
    return GLMRT_OK;
}

static glmrt_status glmrt_peer_allocate(glmrt_cuda_peer_reduce *peer, int32_t device, int64_t capacity,
                                        glmrt_error *error)
{
    int64_t staging_bytes = 2 * (int64_t)peer->num_ranks * capacity * (int64_t)sizeof(float);
    int64_t signal_bytes =
        (int64_t)GLMRT_PEER_SIGNAL_SETS * GLMRT_MAX_DEVICES * GLMRT_PEER_REDUCE_MAX_BLOCKS * (int64_t)sizeof(unsigned long long);
    int64_t epoch_bytes = (int64_t)GLMRT_PEER_REDUCE_MAX_BLOCKS * (int64_t)sizeof(unsigned long long);
    int64_t bytes = staging_bytes + signal_bytes + epoch_bytes;
    GLMRT_CUDA_TRY(error, cudaSetDevice(device));
    cudaError_t made = cudaMalloc((void **)&peer->memory, (size_t)bytes);
    if (made != cudaSuccess) {
        cudaGetLastError();
        peer->memory = nullptr;
        return glmrt_error_set(error, GLMRT_ERR_OUT_OF_MEMORY,
                               "cannot allocate %lld bytes on device %d for the peer all-reduce: %s", (long long)bytes,
                               device, cudaGetErrorString(made));
    }
    GLMRT_CUDA_TRY(error, cudaMemset(peer->memory + staging_bytes, 0, (size_t)(signal_bytes + epoch_bytes)));
    GLMRT_CUDA_TRY(error, cudaDeviceSynchronize());
    peer->bytes = bytes;
    peer->capacity = capacity;
    peer->staging = reinterpret_cast<float *>(peer->memory);
    peer->signals = reinterpret_cast<unsigned long long *>(peer->memory + staging_bytes);
    peer->epochs = reinterpret_cast<unsigned long long *>(peer->memory + staging_bytes + signal_bytes);
    return GLMRT_OK;
}

glmrt_status glmrt_peer_resident_blocks(int32_t device, const void *kernel, int32_t *out_blocks, glmrt_error *error)
{
    int sms = 0;
    int per_sm = 0;
    GLMRT_CUDA_TRY(error, cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    GLMRT_CUDA_TRY(error, cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, GLMRT_PEER_REDUCE_THREADS, 0));
    int64_t resident = (int64_t)sms * per_sm;
    *out_blocks = resident < *out_blocks ? (int32_t)resident : *out_blocks;
    return GLMRT_OK;
}

static glmrt_status glmrt_peer_choose_blocks(const glmrt_cuda_peer_group *group, int32_t *out_blocks,
                                             glmrt_error *error)
{
    int32_t blocks = GLMRT_PEER_REDUCE_MAX_BLOCKS;
    for (int32_t r = 0; r < group->num_ranks; ++r) {
        GLMRT_CUDA_TRY(error, cudaSetDevice(group->devices[r]));
        GLMRT_TRY(glmrt_peer_resident_blocks(group->devices[r], (const void *)glmrt_peer_one_shot_kernel, &blocks,
                                             error));
        GLMRT_TRY(glmrt_peer_resident_blocks(group->devices[r], (const void *)glmrt_peer_two_shot_kernel, &blocks,
                                             error));
        GLMRT_TRY(glmrt_peer_gather_resident_blocks(group->devices[r], &blocks, error));
        if (group->bf16_partials) {
            GLMRT_TRY(glmrt_peer_bf16_resident_blocks(group->devices[r], &blocks, error));
        }
    }
    if (blocks < GLMRT_PEER_REDUCE_MIN_BLOCKS) {
        return glmrt_error_set(error, GLMRT_ERR_UNSUPPORTED,
                               "the GPUs run %d blocks of the peer all-reduce at once, it needs %d; use all_reduce nccl",
                               blocks, GLMRT_PEER_REDUCE_MIN_BLOCKS);
    }
    *out_blocks = blocks;
    return GLMRT_OK;
}

static int glmrt_peer_streams_done(const glmrt_cuda_peer_group *group, cudaError_t *out_error)
{
    int done = 1;
    for (int32_t r = 0; r < group->num_ranks; ++r) {
        cudaError_t state = cudaStreamQuery(group->streams[r]);
        if (state == cudaErrorNotReady) {
            done = 0;
        } else if (state != cudaSuccess) {
            *out_error = state;
            return 1;
        }
    }
    return done;
}

static glmrt_status glmrt_peer_await_check(const glmrt_cuda_peer_group *group, glmrt_error *error)
{
    struct timespec pause;
    pause.tv_sec = 0;
    pause.tv_nsec = 1000 * 1000;
    cudaError_t failed = cudaSuccess;
    for (int32_t waited_ms = 0; waited_ms < GLMRT_PEER_CHECK_SECONDS * 1000; ++waited_ms) {
        if (glmrt_peer_streams_done(group, &failed)) {
            if (failed != cudaSuccess) {
                cudaGetLastError();
                return glmrt_error_set(error, GLMRT_ERR_BACKEND, "the peer all-reduce check failed: %s",
                                       cudaGetErrorString(failed));
            }
            return GLMRT_OK;
        }
        nanosleep(&pause, nullptr);
    }
    __atomic_store_n(group->host_abort_flag, 1, __ATOMIC_RELEASE);
    for (int32_t r = 0; r < group->num_ranks; ++r) {
        cudaStreamSynchronize(group->streams[r]);
    }
    cudaGetLastError();
    return glmrt_error_set(error, GLMRT_ERR_BACKEND,
                           "the peer all-reduce check between %d GPUs did not finish within %d s; use all_reduce nccl",
                           group->num_ranks, GLMRT_PEER_CHECK_SECONDS);
}

static glmrt_status glmrt_peer_check_values(const glmrt_cuda_peer_group *group, float *const *buffers, int64_t offset,
                                            int64_t count, glmrt_error *error)
{
    float values[GLMRT_PEER_CHECK_FLOATS];
    float expected = 0.5f * (float)group->num_ranks * (float)(group->num_ranks + 1);
    for (int32_t r = 0; r < group->num_ranks; ++r) {
        GLMRT_CUDA_TRY(error, cudaSetDevice(group->devices[r]));
        GLMRT_CUDA_TRY(error, cudaMemcpy(values, buffers[r] + offset, (size_t)count * sizeof(float),
                                         cudaMemcpyDeviceToHost));
        for (int64_t i = 0; i < count; ++i) {
            if (values[i] != expected) {
                return glmrt_error_set(error, GLMRT_ERR_BACKEND,
                                       "the peer all-reduce check gave %g at %lld on device %d, expected %g; use "
                                       "all_reduce nccl",
                                       (double)values[i], (long long)i, group->devices[r], (double)expected);
            }
        }
    }
    return GLMRT_OK;
}

static glmrt_status glmrt_peer_check_run(const glmrt_cuda_peer_group *group, float *const *buffers, int64_t count,
                                         glmrt_peer_shots shots, int bf16, glmrt_error *error)
{
    float values[GLMRT_PEER_CHECK_FLOATS];
    for (int32_t r = 0; r < group->num_ranks; ++r) {
        for (int64_t i = 0; i < count; ++i) {
            values[i] = (float)(r + 1);
        }
        GLMRT_CUDA_TRY(error, cudaSetDevice(group->devices[r]));
        GLMRT_CUDA_TRY(error, cudaMemcpy(buffers[r], values, (size_t)count * sizeof(float), cudaMemcpyHostToDevice));
        GLMRT_CUDA_TRY(error, cudaMemset(buffers[r] + count, 0, (size_t)count * sizeof(float)));
    }
    for (int32_t r = 0; r < group->num_ranks; ++r) {
        GLMRT_CUDA_TRY(error, cudaSetDevice(group->devices[r]));
        if (bf16) {
            GLMRT_TRY(glmrt_cuda_peer_reduce_bf16_run_shots(group->ranks[r], buffers[r], buffers[r] + count, count,
                                                            shots, group->streams[r], error));
        } else {
            GLMRT_TRY(glmrt_cuda_peer_reduce_run_shots(group->ranks[r], buffers[r], count, shots, group->streams[r],
                                                       error));
        }
    }
    GLMRT_TRY(glmrt_peer_await_check(group, error));
    return glmrt_peer_check_values(group, buffers, bf16 ? count : 0, count, error);
}

static glmrt_status glmrt_peer_check_sum(const glmrt_cuda_peer_group *group, glmrt_error *error)
{
    int64_t count = group->capacity < GLMRT_PEER_CHECK_FLOATS ? group->capacity : GLMRT_PEER_CHECK_FLOATS;
    float *buffers[GLMRT_MAX_DEVICES];
    memset(buffers, 0, sizeof(buffers));
    glmrt_status status = GLMRT_OK;
    for (int32_t r = 0; r < group->num_ranks && status == GLMRT_OK; ++r) {
        cudaError_t result = cudaSetDevice(group->devices[r]);
        if (result == cudaSuccess) {
            result = cudaMalloc((void **)&buffers[r], 2 * (size_t)count * sizeof(float));
        }
        if (result != cudaSuccess) {
            cudaGetLastError();
            buffers[r] = nullptr;
            status = glmrt_error_set(error, GLMRT_ERR_OUT_OF_MEMORY,
                                     "cannot allocate the peer all-reduce check buffer on device %d: %s",
                                     group->devices[r], cudaGetErrorString(result));
        }
    }
    const int checks = group->bf16_partials ? 2 : 1;
    for (int bf16 = 0; bf16 < checks; ++bf16) {
        if (status == GLMRT_OK) {
            status = glmrt_peer_check_run(group, buffers, count, GLMRT_PEER_ONE_SHOT, bf16, error);
        }
        if (status == GLMRT_OK) {
            status = glmrt_peer_check_run(group, buffers, count, GLMRT_PEER_TWO_SHOT, bf16, error);
        }
    }
    for (int32_t r = 0; r < group->num_ranks; ++r) {
        if (buffers[r] != nullptr) {
            cudaSetDevice(group->devices[r]);
            cudaFree(buffers[r]);
        }
    }
    cudaGetLastError();
    return status;
}

static glmrt_status glmrt_peer_connect(const glmrt_cuda_peer_group *group, glmrt_error *error)
{
    if (group->num_ranks < 2 || group->capacity <= 0 || group->capacity % 4 != 0) {
        return glmrt_error_set(error, GLMRT_ERR_INVALID_ARGUMENT,
                               "the peer all-reduce needs two GPUs or more and a capacity in fours, got %d GPUs and %lld",
                               group->num_ranks, (long long)group->capacity);
    }
    GLMRT_TRY(glmrt_peer_enable_access(group, error));
    int32_t blocks = 0;
    GLMRT_TRY(glmrt_peer_choose_blocks(group, &blocks, error));
    for (int32_t r = 0; r < group->num_ranks; ++r) {
        glmrt_cuda_peer_reduce *peer = group->ranks[r];
        peer->rank = r;
        peer->num_ranks = group->num_ranks;
        peer->blocks = blocks;
        peer->abort_flag = group->abort_flag;
        GLMRT_TRY(glmrt_peer_allocate(peer, group->devices[r], group->capacity, error));
    }
    for (int32_t r = 0; r < group->num_ranks; ++r) {
        for (int32_t p = 0; p < group->num_ranks; ++p) {
            group->ranks[r]->peer_staging[p] = group->ranks[p]->staging;
            group->ranks[r]->peer_signals[p] = group->ranks[p]->signals;
        }
    }
    return glmrt_peer_check_sum(group, error);
}

glmrt_status glmrt_cuda_peer_reduce_open(glmrt_cuda_peer_group *group, int32_t **out_host_abort_flag,
                                         glmrt_error *error)
{
    *out_host_abort_flag = nullptr;
    GLMRT_CUDA_TRY(error, cudaSetDevice(group->devices[0]));
    int32_t *host_flag = nullptr;
    GLMRT_CUDA_TRY(error, cudaHostAlloc((void **)&host_flag, sizeof(int32_t),
                                        cudaHostAllocMapped | cudaHostAllocPortable));
    *out_host_abort_flag = host_flag;
    *host_flag = 0;
    int32_t *device_abort = nullptr;
    GLMRT_CUDA_TRY(error, cudaHostGetDevicePointer((void **)&device_abort, host_flag, 0));
    group->abort_flag = device_abort;
    group->host_abort_flag = host_flag;
    return glmrt_peer_connect(group, error);
}

void glmrt_cuda_peer_reduce_release(glmrt_cuda_peer_reduce *peer)
{
    if (peer->memory != nullptr) {
        cudaFree(peer->memory);
        cudaGetLastError();
    }
    memset(peer, 0, sizeof(*peer));
}

int glmrt_cuda_peer_reduce_fits(const glmrt_cuda_peer_reduce *peer, int64_t count)
{
    return peer != nullptr && peer->num_ranks > 1 && count > 0 && count <= peer->capacity && count % 4 == 0;
}

glmrt_peer_shots glmrt_peer_shots_for(int64_t count, glmrt_peer_shots shots)
{
    if (shots != GLMRT_PEER_SHOTS_BY_SIZE) {
        return shots;
    }
    return count * (int64_t)sizeof(float) <= GLMRT_PEER_ONE_SHOT_MAX_BYTES ? GLMRT_PEER_ONE_SHOT : GLMRT_PEER_TWO_SHOT;
}

glmrt_status glmrt_peer_reduce_args_for(const glmrt_cuda_peer_reduce *peer, float *x, int64_t count,
                                        glmrt_peer_reduce_args *args, glmrt_error *error)
{
    if ((uintptr_t)x % sizeof(float4) != 0) {
        return glmrt_error_set(error, GLMRT_ERR_INVARIANT, "the peer all-reduce needs 16-byte aligned rows, got %p",
                               (const void *)x);
    }
    if (!glmrt_cuda_peer_reduce_fits(peer, count)) {
        return glmrt_error_set(error, GLMRT_ERR_INVARIANT,
                               "the peer all-reduce holds %lld floats in fours, asked to sum %lld",
                               (long long)(peer == nullptr ? 0 : peer->capacity), (long long)count);
    }
    glmrt_peer_link_args(peer, args);
    args->x = reinterpret_cast<float4 *>(x);
    args->count4 = count / 4;
    return GLMRT_OK;
}

void glmrt_peer_link_args(const glmrt_cuda_peer_reduce *peer, glmrt_peer_reduce_args *args)
{
    memset(args, 0, sizeof(*args));
    args->capacity = peer->capacity;
    args->own_staging = peer->staging;
    args->own_signals = peer->signals;
    args->epochs = peer->epochs;
    for (int32_t p = 0; p < peer->num_ranks; ++p) {
        args->peer_staging[p] = peer->peer_staging[p];
        args->peer_signals[p] = peer->peer_signals[p];
    }
    args->abort_flag = peer->abort_flag;
    args->rank = peer->rank;
    args->num_ranks = peer->num_ranks;
}

glmrt_status glmrt_peer_launched(const char *what, int64_t count, glmrt_error *error)
{
    cudaError_t launched = cudaGetLastError();
    if (launched != cudaSuccess) {
        return glmrt_error_set(error, GLMRT_ERR_BACKEND, "%s of %lld floats failed to launch: %s", what,
                               (long long)count, cudaGetErrorString(launched));
    }
    return GLMRT_OK;
}

glmrt_status glmrt_cuda_peer_reduce_run_shots(const glmrt_cuda_peer_reduce *peer, float *x, int64_t count,
                                              glmrt_peer_shots shots, cudaStream_t stream, glmrt_error *error)
{
    glmrt_peer_reduce_args args;
    GLMRT_TRY(glmrt_peer_reduce_args_for(peer, x, count, &args, error));
    if (glmrt_peer_shots_for(count, shots) == GLMRT_PEER_ONE_SHOT) {
        glmrt_peer_one_shot_kernel<<<peer->blocks, GLMRT_PEER_REDUCE_THREADS, 0, stream>>>(args);
    } else {
        glmrt_peer_two_shot_kernel<<<peer->blocks, GLMRT_PEER_REDUCE_THREADS, 0, stream>>>(args);
    }
    return glmrt_peer_launched("the peer all-reduce", count, error);
}

glmrt_status glmrt_cuda_peer_reduce_run(const glmrt_cuda_peer_reduce *peer, float *x, int64_t count,
                                        cudaStream_t stream, glmrt_error *error)
{
    return glmrt_cuda_peer_reduce_run_shots(peer, x, count, GLMRT_PEER_SHOTS_BY_SIZE, stream, error);
}
