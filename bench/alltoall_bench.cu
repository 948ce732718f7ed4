#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <algorithm>
#include <random>
#include <vector>

#include "device_math.cuh"
#include "peer_reduce.cuh"
#include "peer_reduce_device.cuh"

#define GLMRT_EXCHANGE_HIDDEN 5120
#define GLMRT_EXCHANGE_EXPERTS 160
#define GLMRT_EXCHANGE_TOP_K 8
#define GLMRT_EXCHANGE_MAX_TOKENS 512
#define GLMRT_EXCHANGE_CHUNKS (GLMRT_EXCHANGE_HIDDEN / 8)
#define GLMRT_EXCHANGE_CALLS 64
#define GLMRT_EXCHANGE_REPLAYS 20
#define GLMRT_EXCHANGE_CAPACITY ((int64_t)GLMRT_EXCHANGE_MAX_TOKENS * GLMRT_EXCHANGE_HIDDEN)

typedef struct glmrt_exchange_args {
    glmrt_peer_reduce_args peer;
    const uint4 *rows;
    const int32_t *masks;
    uint4 *combined;
    int32_t rows_per_gpu;
    int32_t combine;
} glmrt_exchange_args;

typedef struct glmrt_exchange_gpus {
    int32_t count;
    int32_t devices[GLMRT_MAX_DEVICES];
    cudaStream_t streams[GLMRT_MAX_DEVICES];
    glmrt_cuda_peer_reduce peers[GLMRT_MAX_DEVICES];
    uint16_t *rows[GLMRT_MAX_DEVICES];
    uint16_t *combined[GLMRT_MAX_DEVICES];
    int32_t *masks[GLMRT_MAX_DEVICES];
    float *sums[GLMRT_MAX_DEVICES];
    float *residuals[GLMRT_MAX_DEVICES];
    int32_t *abort_flag;
} glmrt_exchange_gpus;

static __device__ __forceinline__ int64_t glmrt_exchange_dispatch_offset(void)
{
    return 0;
}

static __device__ __forceinline__ int64_t glmrt_exchange_combine_offset(const glmrt_exchange_args &a)
{
    return (int64_t)a.rows_per_gpu * GLMRT_EXCHANGE_CHUNKS;
}

static __device__ __forceinline__ uint4 *glmrt_exchange_inbox(const glmrt_exchange_args &a, int32_t receiver,
                                                              int64_t half, int64_t offset)
{
    return glmrt_peer_inbox<uint4>(a.peer, receiver, half, a.peer.rank) + offset;
}

static __device__ __forceinline__ const uint4 *glmrt_exchange_own_inbox(const glmrt_exchange_args &a, int64_t half,
                                                                        int32_t sender, int64_t offset)
{
    return glmrt_peer_own_inbox<uint4>(a.peer, half, sender) + offset;
}

static __device__ __forceinline__ uint32_t glmrt_exchange_scaled_pair(uint32_t pair, float factor)
{
    const float low = glmrt_bf16_decode((uint16_t)(pair & 0xffffu)) * factor;
    const float high = glmrt_bf16_decode((uint16_t)(pair >> 16)) * factor;
    return (uint32_t)glmrt_bf16_encode(low) | ((uint32_t)glmrt_bf16_encode(high) << 16);
}

static __device__ __forceinline__ uint4 glmrt_exchange_expert_output(uint4 row, int32_t gpu)
{
    const float factor = (float)(gpu + 1);
    return make_uint4(glmrt_exchange_scaled_pair(row.x, factor), glmrt_exchange_scaled_pair(row.y, factor),
                      glmrt_exchange_scaled_pair(row.z, factor), glmrt_exchange_scaled_pair(row.w, factor));
}

static __device__ __forceinline__ void glmrt_exchange_add_pair(float *sum, uint32_t pair)
{
    float values[2];
    glmrt_bf16x2_to_float2(pair, values);
    sum[0] += values[0];
    sum[1] += values[1];
}

static __device__ __forceinline__ uint32_t glmrt_exchange_round_pair(const float *sum)
{
    return (uint32_t)glmrt_bf16_encode(sum[0]) | ((uint32_t)glmrt_bf16_encode(sum[1]) << 16);
}

static __device__ void glmrt_exchange_dispatch(const glmrt_exchange_args &a, int64_t half, glmrt_peer_span part)
{
    const int32_t *own_masks = a.masks + (int64_t)a.peer.rank * a.rows_per_gpu;
    for (int32_t step = 1; step < a.peer.num_ranks; ++step) {
        const int32_t target = glmrt_peer_rotated(a.peer, step);
        uint4 *inbox = glmrt_exchange_inbox(a, target, half, glmrt_exchange_dispatch_offset());
        for (int64_t i = part.begin + threadIdx.x; i < part.end; i += blockDim.x) {
            if ((own_masks[i / GLMRT_EXCHANGE_CHUNKS] >> target) & 1) {
                inbox[i] = a.rows[i];
            }
        }
    }
}

static __device__ void glmrt_exchange_return(const glmrt_exchange_args &a, int64_t half, glmrt_peer_span part)
{
    for (int32_t step = 1; step < a.peer.num_ranks; ++step) {
        const int32_t sender = glmrt_peer_rotated(a.peer, step);
        const int32_t *sender_masks = a.masks + (int64_t)sender * a.rows_per_gpu;
        const uint4 *received = glmrt_exchange_own_inbox(a, half, sender, glmrt_exchange_dispatch_offset());
        uint4 *reply = glmrt_exchange_inbox(a, sender, half, glmrt_exchange_combine_offset(a));
        for (int64_t i = part.begin + threadIdx.x; i < part.end; i += blockDim.x) {
            if ((sender_masks[i / GLMRT_EXCHANGE_CHUNKS] >> a.peer.rank) & 1) {
                reply[i] = glmrt_exchange_expert_output(__ldcg(received + i), a.peer.rank);
            }
        }
    }
}

static __device__ void glmrt_exchange_sum(const glmrt_exchange_args &a, int64_t half, glmrt_peer_span part)
{
    const int32_t *own_masks = a.masks + (int64_t)a.peer.rank * a.rows_per_gpu;
    for (int64_t i = part.begin + threadIdx.x; i < part.end; i += blockDim.x) {
        const int32_t mask = own_masks[i / GLMRT_EXCHANGE_CHUNKS];
        float sum[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
        for (int32_t gpu = 0; gpu < a.peer.num_ranks; ++gpu) {
            if (((mask >> gpu) & 1) == 0) {
                continue;
            }
            const uint4 part_value =
                gpu == a.peer.rank
                    ? glmrt_exchange_expert_output(a.rows[i], gpu)
                    : __ldcg(glmrt_exchange_own_inbox(a, half, gpu, glmrt_exchange_combine_offset(a)) + i);
            glmrt_exchange_add_pair(sum, part_value.x);
            glmrt_exchange_add_pair(sum + 2, part_value.y);
            glmrt_exchange_add_pair(sum + 4, part_value.z);
            glmrt_exchange_add_pair(sum + 6, part_value.w);
        }
        a.combined[i] = make_uint4(glmrt_exchange_round_pair(sum), glmrt_exchange_round_pair(sum + 2),
                                   glmrt_exchange_round_pair(sum + 4), glmrt_exchange_round_pair(sum + 6));
    }
}

__global__ void __launch_bounds__(GLMRT_PEER_REDUCE_THREADS) glmrt_exchange_kernel(glmrt_exchange_args a)
{
    const unsigned long long epoch = glmrt_peer_next_epoch(a.peer);
    const int64_t half = (int64_t)(epoch & 1ull);
    const glmrt_peer_span part = glmrt_peer_block_part(0, (int64_t)a.rows_per_gpu * GLMRT_EXCHANGE_CHUNKS);
    glmrt_exchange_dispatch(a, half, part);
    if (glmrt_peer_barrier(a.peer, GLMRT_PEER_AFTER_SEND, epoch) || !a.combine) {
        return;
    }
    glmrt_exchange_return(a, half, part);
    if (glmrt_peer_barrier(a.peer, GLMRT_PEER_AFTER_SUM, epoch)) {
        return;
    }
    glmrt_exchange_sum(a, half, part);
}

__global__ void glmrt_exchange_fill_rows(uint16_t *rows, int64_t count, uint32_t seed)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += (int64_t)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)i * 2246822519u ^ seed;
        h ^= h >> 16;
        h *= 2654435761u;
        rows[i] = glmrt_bf16_encode(2.0f * ((float)(h >> 8) * (1.0f / 16777216.0f) - 0.5f));
    }
}

static int glmrt_exchange_cuda(cudaError_t result, const char *what)
{
    if (result != cudaSuccess) {
        fprintf(stderr, "alltoall_bench: %s: %s\n", what, cudaGetErrorString(result));
        return 1;
    }
    return 0;
}

static double glmrt_exchange_seconds(void)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)now.tv_sec + 1e-9 * (double)now.tv_nsec;
}

static int glmrt_exchange_sync(glmrt_exchange_gpus *gpus)
{
    for (int32_t r = 0; r < gpus->count; ++r) {
        if (glmrt_exchange_cuda(cudaSetDevice(gpus->devices[r]), "cudaSetDevice") ||
            glmrt_exchange_cuda(cudaStreamSynchronize(gpus->streams[r]), "cudaStreamSynchronize")) {
            return 1;
        }
    }
    return 0;
}

static int glmrt_exchange_open(glmrt_exchange_gpus *gpus, int32_t count)
{
    const size_t row_bytes = (size_t)GLMRT_EXCHANGE_MAX_TOKENS * GLMRT_EXCHANGE_HIDDEN * sizeof(uint16_t);
    const size_t sum_bytes = (size_t)GLMRT_EXCHANGE_CAPACITY * sizeof(float);
    gpus->count = count;
    for (int32_t r = 0; r < count; ++r) {
        gpus->devices[r] = r;
        if (glmrt_exchange_cuda(cudaSetDevice(r), "cudaSetDevice") ||
            glmrt_exchange_cuda(cudaStreamCreateWithFlags(&gpus->streams[r], cudaStreamNonBlocking), "stream") ||
            glmrt_exchange_cuda(cudaMalloc((void **)&gpus->rows[r], row_bytes), "rows") ||
            glmrt_exchange_cuda(cudaMalloc((void **)&gpus->combined[r], row_bytes), "combined rows") ||
            glmrt_exchange_cuda(cudaMalloc((void **)&gpus->masks[r], (size_t)GLMRT_MAX_DEVICES *
                                                                         GLMRT_EXCHANGE_MAX_TOKENS * sizeof(int32_t)),
                                "masks") ||
            glmrt_exchange_cuda(cudaMalloc((void **)&gpus->sums[r], sum_bytes), "sums") ||
            glmrt_exchange_cuda(cudaMalloc((void **)&gpus->residuals[r], sum_bytes), "residuals") ||
            glmrt_exchange_cuda(cudaMemset(gpus->sums[r], 0, sum_bytes), "clear sums") ||
            glmrt_exchange_cuda(cudaMemset(gpus->residuals[r], 0, sum_bytes), "clear residuals")) {
            return 1;
        }
    }
    glmrt_cuda_peer_reduce *ranks[GLMRT_MAX_DEVICES];
    for (int32_t r = 0; r < count; ++r) {
        ranks[r] = &gpus->peers[r];
    }
    glmrt_cuda_peer_group group;
    memset(&group, 0, sizeof(group));
    group.num_ranks = count;
    group.devices = gpus->devices;
    group.ranks = ranks;
    group.capacity = GLMRT_EXCHANGE_CAPACITY;
    group.streams = gpus->streams;
    group.bf16_partials = 1;
    glmrt_error error;
    glmrt_error_clear(&error);
    if (glmrt_cuda_peer_reduce_open(&group, &gpus->abort_flag, &error) != GLMRT_OK) {
        fprintf(stderr, "alltoall_bench: %s\n", error.message);
        return 1;
    }
    int32_t blocks = gpus->peers[0].blocks;
    for (int32_t r = 0; r < count; ++r) {
        if (glmrt_exchange_cuda(cudaSetDevice(gpus->devices[r]), "cudaSetDevice")) {
            return 1;
        }
        if (glmrt_peer_resident_blocks(gpus->devices[r], (const void *)glmrt_exchange_kernel, &blocks, &error) !=
            GLMRT_OK) {
            fprintf(stderr, "alltoall_bench: occupancy: %s\n", error.message);
            return 1;
        }
    }
    if (blocks < gpus->peers[0].blocks) {
        fprintf(stderr, "alltoall_bench: the exchange kernel holds %d blocks at once, the peer sum %d\n", blocks,
                gpus->peers[0].blocks);
        return 1;
    }
    return 0;
}

static void glmrt_exchange_close(glmrt_exchange_gpus *gpus, int failed)
{
    if (failed && gpus->abort_flag != nullptr) {
        __atomic_store_n(gpus->abort_flag, 1, __ATOMIC_RELEASE);
    }
    for (int32_t r = 0; r < gpus->count; ++r) {
        cudaSetDevice(gpus->devices[r]);
        if (gpus->streams[r] != nullptr) {
            cudaStreamSynchronize(gpus->streams[r]);
        }
    }
    for (int32_t r = 0; r < gpus->count; ++r) {
        cudaSetDevice(gpus->devices[r]);
        glmrt_cuda_peer_reduce_release(&gpus->peers[r]);
        cudaFree(gpus->rows[r]);
        cudaFree(gpus->combined[r]);
        cudaFree(gpus->masks[r]);
        cudaFree(gpus->sums[r]);
        cudaFree(gpus->residuals[r]);
        if (gpus->streams[r] != nullptr) {
            cudaStreamDestroy(gpus->streams[r]);
        }
    }
    if (gpus->abort_flag != nullptr) {
        cudaFreeHost(gpus->abort_flag);
    }
}

typedef struct glmrt_exchange_routing {
    int32_t rows_per_gpu;
    std::vector<int32_t> masks;
    double remote_copies;
} glmrt_exchange_routing;

static glmrt_exchange_routing glmrt_exchange_route(int32_t gpus, int32_t rows_per_gpu, uint32_t seed)
{
    glmrt_exchange_routing routing;
    routing.rows_per_gpu = rows_per_gpu;
    routing.masks.assign((size_t)gpus * rows_per_gpu, 0);
    std::mt19937 rng(seed);
    const int32_t experts_per_gpu = GLMRT_EXCHANGE_EXPERTS / gpus;
    int64_t copies = 0;
    for (int32_t home = 0; home < gpus; ++home) {
        for (int32_t row = 0; row < rows_per_gpu; ++row) {
            std::vector<int32_t> experts(GLMRT_EXCHANGE_EXPERTS);
            for (int32_t e = 0; e < GLMRT_EXCHANGE_EXPERTS; ++e) {
                experts[e] = e;
            }
            int32_t mask = 0;
            for (int32_t k = 0; k < GLMRT_EXCHANGE_TOP_K; ++k) {
                std::uniform_int_distribution<int32_t> pick(k, GLMRT_EXCHANGE_EXPERTS - 1);
                std::swap(experts[k], experts[pick(rng)]);
                mask |= 1 << (experts[k] / experts_per_gpu);
            }
            routing.masks[(size_t)home * rows_per_gpu + row] = mask;
            copies += __builtin_popcount((unsigned)(mask & ~(1 << home)));
        }
    }
    routing.remote_copies = (double)copies / ((double)gpus * rows_per_gpu);
    return routing;
}

static int glmrt_exchange_upload(glmrt_exchange_gpus *gpus, const glmrt_exchange_routing &routing)
{
    const int64_t values = (int64_t)routing.rows_per_gpu * GLMRT_EXCHANGE_HIDDEN;
    for (int32_t r = 0; r < gpus->count; ++r) {
        if (glmrt_exchange_cuda(cudaSetDevice(gpus->devices[r]), "cudaSetDevice") ||
            glmrt_exchange_cuda(cudaMemcpyAsync(gpus->masks[r], routing.masks.data(),
                                                routing.masks.size() * sizeof(int32_t), cudaMemcpyHostToDevice,
                                                gpus->streams[r]),
                                "masks")) {
            return 1;
        }
        glmrt_exchange_fill_rows<<<64, 256, 0, gpus->streams[r]>>>(gpus->rows[r], values, 7919u * (uint32_t)(r + 1));
        if (glmrt_exchange_cuda(cudaGetLastError(), "fill rows")) {
            return 1;
        }
    }
    return glmrt_exchange_sync(gpus);
}

static int glmrt_exchange_enqueue(glmrt_exchange_gpus *gpus, int32_t r, int32_t rows_per_gpu, int32_t combine)
{
    glmrt_exchange_args args;
    memset(&args, 0, sizeof(args));
    glmrt_error error;
    glmrt_error_clear(&error);
    const int64_t floats = (int64_t)rows_per_gpu * GLMRT_EXCHANGE_HIDDEN;
    if (glmrt_peer_reduce_args_for(&gpus->peers[r], gpus->sums[r], floats, &args.peer, &error) != GLMRT_OK) {
        fprintf(stderr, "alltoall_bench: %s\n", error.message);
        return 1;
    }
    args.rows = reinterpret_cast<const uint4 *>(gpus->rows[r]);
    args.masks = gpus->masks[r];
    args.combined = reinterpret_cast<uint4 *>(gpus->combined[r]);
    args.rows_per_gpu = rows_per_gpu;
    args.combine = combine;
    glmrt_exchange_kernel<<<gpus->peers[r].blocks, GLMRT_PEER_REDUCE_THREADS, 0, gpus->streams[r]>>>(args);
    return glmrt_exchange_cuda(cudaGetLastError(), "exchange launch");
}

static int glmrt_exchange_enqueue_all(glmrt_exchange_gpus *gpus, int32_t method, int32_t rows_per_gpu)
{
    for (int32_t r = 0; r < gpus->count; ++r) {
        if (glmrt_exchange_cuda(cudaSetDevice(gpus->devices[r]), "cudaSetDevice")) {
            return 1;
        }
        if (method < 2) {
            if (glmrt_exchange_enqueue(gpus, r, rows_per_gpu, method)) {
                return 1;
            }
            continue;
        }
        glmrt_error error;
        glmrt_error_clear(&error);
        const int64_t all_tokens = (int64_t)rows_per_gpu * gpus->count * GLMRT_EXCHANGE_HIDDEN;
        if (glmrt_cuda_peer_reduce_bf16_run(&gpus->peers[r], gpus->sums[r], gpus->residuals[r], all_tokens,
                                            gpus->streams[r], &error) != GLMRT_OK) {
            fprintf(stderr, "alltoall_bench: %s\n", error.message);
            return 1;
        }
    }
    return 0;
}

static float glmrt_exchange_expected_value(uint16_t row_value, int32_t mask, int32_t gpus)
{
    float sum = 0.0f;
    for (int32_t gpu = 0; gpu < gpus; ++gpu) {
        if ((mask >> gpu) & 1) {
            sum += glmrt_bf16_decode(glmrt_bf16_encode(glmrt_bf16_decode(row_value) * (float)(gpu + 1)));
        }
    }
    return sum;
}

static int glmrt_exchange_check(glmrt_exchange_gpus *gpus, const glmrt_exchange_routing &routing, int64_t *out_wrong)
{
    const int64_t values = (int64_t)routing.rows_per_gpu * GLMRT_EXCHANGE_HIDDEN;
    std::vector<uint16_t> rows((size_t)values);
    std::vector<uint16_t> combined((size_t)values);
    *out_wrong = 0;
    for (int32_t r = 0; r < gpus->count; ++r) {
        if (glmrt_exchange_cuda(cudaSetDevice(gpus->devices[r]), "cudaSetDevice") ||
            glmrt_exchange_cuda(cudaMemsetAsync(gpus->combined[r], 0, (size_t)values * sizeof(uint16_t),
                                                gpus->streams[r]),
                                "clear combined")) {
            return 1;
        }
    }
    if (glmrt_exchange_enqueue_all(gpus, 1, routing.rows_per_gpu) || glmrt_exchange_sync(gpus)) {
        return 1;
    }
    for (int32_t r = 0; r < gpus->count; ++r) {
        if (glmrt_exchange_cuda(cudaSetDevice(gpus->devices[r]), "cudaSetDevice") ||
            glmrt_exchange_cuda(cudaMemcpy(rows.data(), gpus->rows[r], (size_t)values * sizeof(uint16_t),
                                           cudaMemcpyDeviceToHost),
                                "copy rows") ||
            glmrt_exchange_cuda(cudaMemcpy(combined.data(), gpus->combined[r], (size_t)values * sizeof(uint16_t),
                                           cudaMemcpyDeviceToHost),
                                "copy combined")) {
            return 1;
        }
        for (int64_t i = 0; i < values; ++i) {
            const int32_t mask = routing.masks[(size_t)r * routing.rows_per_gpu + i / GLMRT_EXCHANGE_HIDDEN];
            const uint16_t expected = glmrt_bf16_encode(glmrt_exchange_expected_value(rows[i], mask, gpus->count));
            *out_wrong += combined[i] != expected;
        }
    }
    return 0;
}

static int glmrt_exchange_time(glmrt_exchange_gpus *gpus, int32_t method, int32_t rows_per_gpu, double *out_us)
{
    cudaGraphExec_t execs[GLMRT_MAX_DEVICES];
    cudaGraph_t graphs[GLMRT_MAX_DEVICES];
    memset(execs, 0, sizeof(execs));
    memset(graphs, 0, sizeof(graphs));
    int failed = 0;
    for (int32_t r = 0; r < gpus->count && !failed; ++r) {
        failed = glmrt_exchange_cuda(cudaSetDevice(gpus->devices[r]), "cudaSetDevice") ||
                 glmrt_exchange_cuda(cudaStreamBeginCapture(gpus->streams[r], cudaStreamCaptureModeThreadLocal),
                                     "capture");
    }
    for (int32_t call = 0; call < GLMRT_EXCHANGE_CALLS && !failed; ++call) {
        failed = glmrt_exchange_enqueue_all(gpus, method, rows_per_gpu);
    }
    for (int32_t r = 0; r < gpus->count; ++r) {
        cudaSetDevice(gpus->devices[r]);
        cudaError_t ended = cudaStreamEndCapture(gpus->streams[r], &graphs[r]);
        if (!failed) {
            failed = glmrt_exchange_cuda(ended, "end capture");
        }
    }
    for (int32_t r = 0; r < gpus->count && !failed; ++r) {
        failed = glmrt_exchange_cuda(cudaSetDevice(gpus->devices[r]), "cudaSetDevice") ||
                 glmrt_exchange_cuda(cudaGraphInstantiate(&execs[r], graphs[r], 0), "instantiate");
    }
    double started = 0.0;
    for (int32_t replay = -2; replay < GLMRT_EXCHANGE_REPLAYS && !failed; ++replay) {
        if (replay == 0) {
            failed = glmrt_exchange_sync(gpus);
            started = glmrt_exchange_seconds();
        }
        for (int32_t r = 0; r < gpus->count && !failed; ++r) {
            failed = glmrt_exchange_cuda(cudaSetDevice(gpus->devices[r]), "cudaSetDevice") ||
                     glmrt_exchange_cuda(cudaGraphLaunch(execs[r], gpus->streams[r]), "graph launch");
        }
    }
    if (!failed) {
        failed = glmrt_exchange_sync(gpus);
    }
    *out_us = 1e6 * (glmrt_exchange_seconds() - started) / ((double)GLMRT_EXCHANGE_REPLAYS * GLMRT_EXCHANGE_CALLS);
    for (int32_t r = 0; r < gpus->count; ++r) {
        cudaSetDevice(gpus->devices[r]);
        if (execs[r] != nullptr) {
            cudaGraphExecDestroy(execs[r]);
        }
        if (graphs[r] != nullptr) {
            cudaGraphDestroy(graphs[r]);
        }
    }
    return failed;
}

static int glmrt_exchange_table(glmrt_exchange_gpus *gpus)
{
    static const int32_t tokens_list[] = {8, 16, 32, 64, 128, 256, 512};
    printf("%d GPUs, hidden %d in BF16, %d experts top-%d spread whole over the GPUs, each GPU the home of a share "
           "of the tokens; %d exchanges a CUDA graph, %d replays\n",
           gpus->count, GLMRT_EXCHANGE_HIDDEN, GLMRT_EXCHANGE_EXPERTS, GLMRT_EXCHANGE_TOP_K, GLMRT_EXCHANGE_CALLS,
           GLMRT_EXCHANGE_REPLAYS);
    printf("| tokens | rows a GPU | remote copies a row | dispatch us | dispatch and combine us | BF16 all-reduce of "
           "every token us | check |\n|---|---|---|---|---|---|---|\n");
    for (size_t i = 0; i < sizeof(tokens_list) / sizeof(tokens_list[0]); ++i) {
        const int32_t tokens = tokens_list[i];
        if (tokens % gpus->count != 0) {
            continue;
        }
        const int32_t rows_per_gpu = tokens / gpus->count;
        const glmrt_exchange_routing routing = glmrt_exchange_route(gpus->count, rows_per_gpu, 104729u + (uint32_t)tokens);
        int64_t wrong = 0;
        double dispatch_us = 0.0;
        double exchange_us = 0.0;
        double reduce_us = 0.0;
        if (glmrt_exchange_upload(gpus, routing) || glmrt_exchange_check(gpus, routing, &wrong) ||
            glmrt_exchange_time(gpus, 0, rows_per_gpu, &dispatch_us) ||
            glmrt_exchange_time(gpus, 1, rows_per_gpu, &exchange_us) ||
            glmrt_exchange_time(gpus, 2, rows_per_gpu, &reduce_us)) {
            return 1;
        }
        printf("| %d | %d | %.2f | %.2f | %.2f | %.2f | %s |\n", tokens, rows_per_gpu, routing.remote_copies,
               dispatch_us, exchange_us, reduce_us, wrong == 0 ? "every combined value as expected" : "WRONG VALUES");
        fflush(stdout);
        if (wrong != 0) {
            fprintf(stderr, "alltoall_bench: %lld combined values differ from the host's sums at %d tokens\n",
                    (long long)wrong, tokens);
            return 1;
        }
    }
    return 0;
}

int main(int argc, char **argv)
{
    int visible = 0;
    if (glmrt_exchange_cuda(cudaGetDeviceCount(&visible), "cudaGetDeviceCount")) {
        return 1;
    }
    int32_t count = argc > 1 ? atoi(argv[1]) : visible;
    if (count < 2 || count > visible || count > GLMRT_MAX_DEVICES || GLMRT_EXCHANGE_EXPERTS % count != 0) {
        fprintf(stderr, "usage: alltoall_bench [GPUS]: 2 to %d GPUs that divide %d experts, %d visible\n",
                GLMRT_MAX_DEVICES, GLMRT_EXCHANGE_EXPERTS, visible);
        return 2;
    }
    glmrt_exchange_gpus gpus;
    memset(&gpus, 0, sizeof(gpus));
    int failed = glmrt_exchange_open(&gpus, count);
    if (!failed) {
        printf("the exchange runs %d blocks a GPU, the peer sum's count\n", gpus.peers[0].blocks);
        failed = glmrt_exchange_table(&gpus);
    }
    glmrt_exchange_close(&gpus, failed);
    return failed ? 1 : 0;
}
