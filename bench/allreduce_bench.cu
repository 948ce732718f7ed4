#include <cuda_runtime.h>
#include <math.h>
#include <nccl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_fill.cuh"
#include "peer_reduce.cuh"

#define GLMRT_BENCH_MAX_ROWS 2048
#define GLMRT_BENCH_HIDDEN 5120
#define GLMRT_BENCH_ODD_GROUPS_FLOATS (GLMRT_BENCH_HIDDEN + 4)
#define GLMRT_BENCH_GUARD_FLOATS 64
#define GLMRT_BENCH_CAPACITY_FLOATS ((int64_t)GLMRT_BENCH_MAX_ROWS * GLMRT_BENCH_HIDDEN)
#define GLMRT_BENCH_CALLS 64
#define GLMRT_BENCH_REPLAYS 20
#define GLMRT_BENCH_GATHER_WORDS 8
#define GLMRT_BENCH_GATHER_OPERAND_WORDS (GLMRT_BENCH_HIDDEN / 4)
#define GLMRT_BENCH_GATHER_ROUTE_WORDS 17

enum glmrt_bench_method {
    GLMRT_BENCH_NCCL = 0,
    GLMRT_BENCH_ONE_SHOT = 1,
    GLMRT_BENCH_TWO_SHOT = 2,
    GLMRT_BENCH_BF16_ONE_SHOT = 3,
    GLMRT_BENCH_BF16_TWO_SHOT = 4,
    GLMRT_BENCH_ROW_GATHER = 5,
    GLMRT_BENCH_BF16_SCATTER_ROWS = 6
};

typedef struct glmrt_bench_gpus {
    int32_t count;
    int32_t devices[GLMRT_MAX_DEVICES];
    cudaStream_t streams[GLMRT_MAX_DEVICES];
    ncclComm_t comms[GLMRT_MAX_DEVICES];
    float *buffers[GLMRT_MAX_DEVICES];
    float *results[GLMRT_MAX_DEVICES];
    float *second_results[GLMRT_MAX_DEVICES];
    glmrt_cuda_peer_reduce peers[GLMRT_MAX_DEVICES];
    int32_t *abort_flag;
    int32_t comms_live;
} glmrt_bench_gpus;

static int glmrt_bench_cuda(cudaError_t result, const char *what)
{
    if (result != cudaSuccess) {
        fprintf(stderr, "allreduce_bench: %s: %s\n", what, cudaGetErrorString(result));
        return 1;
    }
    return 0;
}

static int glmrt_bench_nccl(ncclResult_t result, const char *what)
{
    if (result != ncclSuccess) {
        fprintf(stderr, "allreduce_bench: %s: %s\n", what, ncclGetErrorString(result));
        return 1;
    }
    return 0;
}

static double glmrt_bench_seconds(void)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)now.tv_sec + 1e-9 * (double)now.tv_nsec;
}

static int glmrt_bench_open(glmrt_bench_gpus *gpus, int32_t count)
{
    int64_t floats = GLMRT_BENCH_CAPACITY_FLOATS;
    gpus->count = count;
    for (int32_t r = 0; r < count; ++r) {
        gpus->devices[r] = r;
        if (glmrt_bench_cuda(cudaSetDevice(r), "cudaSetDevice") ||
            glmrt_bench_cuda(cudaStreamCreateWithFlags(&gpus->streams[r], cudaStreamNonBlocking), "stream") ||
            glmrt_bench_cuda(cudaMalloc((void **)&gpus->buffers[r], (size_t)floats * sizeof(float)), "buffer") ||
            glmrt_bench_cuda(cudaMalloc((void **)&gpus->results[r], (size_t)floats * sizeof(float)), "result") ||
            glmrt_bench_cuda(cudaMalloc((void **)&gpus->second_results[r], (size_t)floats * sizeof(float)),
                             "result") ||
            glmrt_bench_cuda(cudaMemset(gpus->buffers[r], 0, (size_t)floats * sizeof(float)), "memset")) {
            return 1;
        }
    }
    if (glmrt_bench_nccl(ncclCommInitAll(gpus->comms, count, gpus->devices), "ncclCommInitAll")) {
        return 1;
    }
    gpus->comms_live = 1;
    glmrt_cuda_peer_reduce *ranks[GLMRT_MAX_DEVICES];
    for (int32_t r = 0; r < count; ++r) {
        ranks[r] = &gpus->peers[r];
    }
    glmrt_cuda_peer_group group;
    group.num_ranks = count;
    group.devices = gpus->devices;
    group.ranks = ranks;
    group.capacity = floats;
    group.streams = gpus->streams;
    group.bf16_partials = 1;
    glmrt_error error;
    glmrt_error_clear(&error);
    if (glmrt_cuda_peer_reduce_open(&group, &gpus->abort_flag, &error) != GLMRT_OK) {
        fprintf(stderr, "allreduce_bench: %s\n", error.message);
        return 1;
    }
    return 0;
}

static void glmrt_bench_close(glmrt_bench_gpus *gpus)
{
    for (int32_t r = 0; r < gpus->count; ++r) {
        cudaSetDevice(gpus->devices[r]);
        if (gpus->streams[r] != nullptr) {
            cudaStreamSynchronize(gpus->streams[r]);
        }
    }
    if (gpus->comms_live) {
        for (int32_t r = 0; r < gpus->count; ++r) {
            ncclCommDestroy(gpus->comms[r]);
        }
    }
    for (int32_t r = 0; r < gpus->count; ++r) {
        cudaSetDevice(gpus->devices[r]);
        glmrt_cuda_peer_reduce_release(&gpus->peers[r]);
        cudaFree(gpus->buffers[r]);
        cudaFree(gpus->results[r]);
        cudaFree(gpus->second_results[r]);
        if (gpus->streams[r] != nullptr) {
            cudaStreamDestroy(gpus->streams[r]);
        }
    }
    if (gpus->abort_flag != nullptr) {
        cudaFreeHost(gpus->abort_flag);
    }
}

static int glmrt_bench_gather_enqueue(glmrt_bench_gpus *gpus, int32_t r, int64_t rows, int32_t first_words,
                                      int32_t second_words)
{
    glmrt_error error;
    glmrt_error_clear(&error);
    glmrt_cuda_peer_row_gather gather;
    glmrt_cuda_peer_row_gather_clear(&gather, (int32_t)rows);
    glmrt_cuda_peer_row_gather_add(&gather, gpus->buffers[r], first_words);
    if (second_words > 0) {
        glmrt_cuda_peer_row_gather_add(&gather, gpus->results[r], second_words);
    }
    if (glmrt_cuda_peer_gather_rows(&gpus->peers[r], &gather, gpus->streams[r], &error) != GLMRT_OK) {
        fprintf(stderr, "allreduce_bench: %s\n", error.message);
        return 1;
    }
    return 0;
}

static int glmrt_bench_enqueue(glmrt_bench_gpus *gpus, int32_t method, float *const *buffers,
                               float *const *residuals, int64_t count)
{
    if (method == GLMRT_BENCH_NCCL) {
        ncclResult_t result = ncclGroupStart();
        for (int32_t r = 0; r < gpus->count && result == ncclSuccess; ++r) {
            result = ncclAllReduce(buffers[r], buffers[r], (size_t)count, ncclFloat, ncclSum, gpus->comms[r],
                                   gpus->streams[r]);
        }
        ncclResult_t ended = ncclGroupEnd();
        return glmrt_bench_nccl(result != ncclSuccess ? result : ended, "ncclAllReduce");
    }
    for (int32_t r = 0; r < gpus->count; ++r) {
        glmrt_error error;
        glmrt_error_clear(&error);
        if (glmrt_bench_cuda(cudaSetDevice(gpus->devices[r]), "cudaSetDevice")) {
            return 1;
        }
        if (method == GLMRT_BENCH_BF16_SCATTER_ROWS) {
            if (glmrt_cuda_peer_reduce_bf16_scatter_rows(&gpus->peers[r], buffers[r], residuals[r],
                                                         (int32_t)(count / GLMRT_BENCH_HIDDEN), GLMRT_BENCH_HIDDEN,
                                                         gpus->streams[r], &error) != GLMRT_OK) {
                fprintf(stderr, "allreduce_bench: %s\n", error.message);
                return 1;
            }
            continue;
        }
        if (method == GLMRT_BENCH_ROW_GATHER) {
            if (glmrt_bench_gather_enqueue(gpus, r, count, GLMRT_BENCH_GATHER_OPERAND_WORDS,
                                           GLMRT_BENCH_GATHER_ROUTE_WORDS)) {
                return 1;
            }
            continue;
        }
        const int bf16 = method == GLMRT_BENCH_BF16_ONE_SHOT || method == GLMRT_BENCH_BF16_TWO_SHOT;
        glmrt_peer_shots shots = method == GLMRT_BENCH_ONE_SHOT || method == GLMRT_BENCH_BF16_ONE_SHOT
                                     ? GLMRT_PEER_ONE_SHOT
                                     : GLMRT_PEER_TWO_SHOT;
        glmrt_status status =
            bf16 ? glmrt_cuda_peer_reduce_bf16_run_shots(&gpus->peers[r], buffers[r], residuals[r], count, shots,
                                                         gpus->streams[r], &error)
                 : glmrt_cuda_peer_reduce_run_shots(&gpus->peers[r], buffers[r], count, shots, gpus->streams[r], &error);
        if (status != GLMRT_OK) {
            fprintf(stderr, "allreduce_bench: %s\n", error.message);
            return 1;
        }
    }
    return 0;
}

static int glmrt_bench_sync(glmrt_bench_gpus *gpus)
{
    for (int32_t r = 0; r < gpus->count; ++r) {
        if (glmrt_bench_cuda(cudaSetDevice(gpus->devices[r]), "cudaSetDevice") ||
            glmrt_bench_cuda(cudaStreamSynchronize(gpus->streams[r]), "cudaStreamSynchronize")) {
            return 1;
        }
    }
    return 0;
}

static int glmrt_bench_fill_inputs(glmrt_bench_gpus *gpus, int64_t count, float *const *targets)
{
    for (int32_t r = 0; r < gpus->count; ++r) {
        if (glmrt_bench_cuda(cudaSetDevice(gpus->devices[r]), "cudaSetDevice")) {
            return 1;
        }
        glmrt_bench_fill_floats<<<64, 256, 0, gpus->streams[r]>>>(targets[r], count, 977u * (uint32_t)(r + 1), 0.0f,
                                                                  2.0f);
        if (glmrt_bench_cuda(cudaGetLastError(), "fill")) {
            return 1;
        }
    }
    return glmrt_bench_sync(gpus);
}

typedef struct glmrt_bench_agreement {
    double largest_to_nccl;
    int ranks_agree;
    int shots_agree;
} glmrt_bench_agreement;

static int glmrt_bench_copy_back(glmrt_bench_gpus *gpus, int32_t r, const float *source, float *target, int64_t count)
{
    return glmrt_bench_cuda(cudaSetDevice(gpus->devices[r]), "cudaSetDevice") ||
           glmrt_bench_cuda(cudaMemcpy(target, source, (size_t)count * sizeof(float), cudaMemcpyDeviceToHost),
                            "copy");
}

static void glmrt_bench_compare_rank(int32_t r, const float *nccl_values, const float *one_shot, const float *two_shot,
                                     float *first_rank, int64_t count, glmrt_bench_agreement *agreement)
{
    for (int64_t i = 0; i < count; ++i) {
        double difference = fabs((double)nccl_values[i] - (double)one_shot[i]);
        agreement->largest_to_nccl = difference > agreement->largest_to_nccl ? difference : agreement->largest_to_nccl;
        if (memcmp(&one_shot[i], &two_shot[i], sizeof(float)) != 0) {
            agreement->shots_agree = 0;
        }
        if (r == 0) {
            first_rank[i] = one_shot[i];
        } else if (memcmp(&first_rank[i], &one_shot[i], sizeof(float)) != 0) {
            agreement->ranks_agree = 0;
        }
    }
}

static int glmrt_bench_compare(glmrt_bench_gpus *gpus, int64_t count, glmrt_bench_agreement *agreement)
{
    float *nccl_values = (float *)malloc((size_t)count * sizeof(float));
    float *one_shot = (float *)malloc((size_t)count * sizeof(float));
    float *two_shot = (float *)malloc((size_t)count * sizeof(float));
    float *first_rank = (float *)malloc((size_t)count * sizeof(float));
    int failed = nccl_values == nullptr || one_shot == nullptr || two_shot == nullptr || first_rank == nullptr;
    agreement->largest_to_nccl = 0.0;
    agreement->ranks_agree = 1;
    agreement->shots_agree = 1;
    for (int32_t r = 0; r < gpus->count && !failed; ++r) {
        failed = glmrt_bench_copy_back(gpus, r, gpus->buffers[r], nccl_values, count) ||
                 glmrt_bench_copy_back(gpus, r, gpus->results[r], one_shot, count) ||
                 glmrt_bench_copy_back(gpus, r, gpus->second_results[r], two_shot, count);
        if (!failed) {
            glmrt_bench_compare_rank(r, nccl_values, one_shot, two_shot, first_rank, count, agreement);
        }
    }
    free(nccl_values);
    free(one_shot);
    free(two_shot);
    free(first_rank);
    return failed;
}

static int glmrt_bench_report(glmrt_bench_gpus *gpus, int64_t count, const char *what, const char *reference)
{
    glmrt_bench_agreement agreement;
    if (glmrt_bench_compare(gpus, count, &agreement)) {
        return 1;
    }
    printf("%s over %lld floats: every GPU's sum %s, one-shot and two-shot %s, largest difference to %s %.3g\n", what,
           (long long)count, agreement.ranks_agree ? "has the same bits" : "DIFFERS between GPUs",
           agreement.shots_agree ? "have the same bits" : "DIFFER", reference, agreement.largest_to_nccl);
    return agreement.ranks_agree && agreement.shots_agree ? 0 : 1;
}

static int glmrt_bench_check_rows(glmrt_bench_gpus *gpus, int64_t rows)
{
    int64_t count = rows * GLMRT_BENCH_HIDDEN;
    if (glmrt_bench_fill_inputs(gpus, count, gpus->buffers) || glmrt_bench_fill_inputs(gpus, count, gpus->results) ||
        glmrt_bench_fill_inputs(gpus, count, gpus->second_results) ||
        glmrt_bench_enqueue(gpus, GLMRT_BENCH_NCCL, gpus->buffers, nullptr, count) ||
        glmrt_bench_enqueue(gpus, GLMRT_BENCH_ONE_SHOT, gpus->results, nullptr, count) ||
        glmrt_bench_enqueue(gpus, GLMRT_BENCH_TWO_SHOT, gpus->second_results, nullptr, count) || glmrt_bench_sync(gpus)) {
        return 1;
    }
    return glmrt_bench_report(gpus, count, "check", "NCCL's");
}

static int glmrt_bench_zero(glmrt_bench_gpus *gpus, float *const *targets, int64_t count)
{
    for (int32_t r = 0; r < gpus->count; ++r) {
        if (glmrt_bench_cuda(cudaSetDevice(gpus->devices[r]), "cudaSetDevice") ||
            glmrt_bench_cuda(cudaMemsetAsync(targets[r], 0, (size_t)count * sizeof(float), gpus->streams[r]),
                             "memset")) {
            return 1;
        }
    }
    return glmrt_bench_sync(gpus);
}

static int glmrt_bench_check_guard(glmrt_bench_gpus *gpus, float *const *targets, int64_t count)
{
    float guard[GLMRT_BENCH_GUARD_FLOATS];
    for (int32_t r = 0; r < gpus->count; ++r) {
        if (glmrt_bench_copy_back(gpus, r, targets[r] + count, guard, GLMRT_BENCH_GUARD_FLOATS)) {
            return 1;
        }
        for (int32_t i = 0; i < GLMRT_BENCH_GUARD_FLOATS; ++i) {
            if (guard[i] != 0.0f) {
                printf("check of the BF16 sums over %lld floats: GPU %d wrote past the sum, at float %lld\n",
                       (long long)count, r, (long long)(count + i));
                return 1;
            }
        }
    }
    return 0;
}

static int glmrt_bench_check_bf16(glmrt_bench_gpus *gpus, int64_t count)
{
    const int64_t guarded =
        count + GLMRT_BENCH_GUARD_FLOATS <= GLMRT_BENCH_CAPACITY_FLOATS ? count + GLMRT_BENCH_GUARD_FLOATS : count;
    if (glmrt_bench_fill_inputs(gpus, count, gpus->buffers) || glmrt_bench_zero(gpus, gpus->results, guarded) ||
        glmrt_bench_zero(gpus, gpus->second_results, guarded) ||
        glmrt_bench_enqueue(gpus, GLMRT_BENCH_BF16_ONE_SHOT, gpus->buffers, gpus->results, count) ||
        glmrt_bench_enqueue(gpus, GLMRT_BENCH_BF16_TWO_SHOT, gpus->buffers, gpus->second_results, count) ||
        glmrt_bench_enqueue(gpus, GLMRT_BENCH_NCCL, gpus->buffers, nullptr, count) || glmrt_bench_sync(gpus)) {
        return 1;
    }
    if (guarded > count && (glmrt_bench_check_guard(gpus, gpus->results, count) ||
                            glmrt_bench_check_guard(gpus, gpus->second_results, count))) {
        return 1;
    }
    return glmrt_bench_report(gpus, count, "check of the BF16 sums", "NCCL's FP32 sum");
}

static uint32_t glmrt_bench_gather_pattern(int64_t row, int32_t column)
{
    return (uint32_t)(row * 977 + column * 31 + 1);
}

static uint32_t glmrt_bench_gather_stale(int32_t r)
{
    return 0xFFFFFFFFu - (uint32_t)r;
}

static void glmrt_bench_gather_host_rows(uint32_t *words, int64_t rows, int32_t width, int32_t column_base, int32_t r,
                                         int32_t num_ranks)
{
    const int64_t begin = glmrt_peer_row_begin((int32_t)rows, r, num_ranks);
    const int64_t end = glmrt_peer_row_begin((int32_t)rows, r + 1, num_ranks);
    for (int64_t row = 0; row < rows; ++row) {
        for (int32_t c = 0; c < width; ++c) {
            const int own = row >= begin && row < end;
            words[row * width + c] = own ? glmrt_bench_gather_pattern(row, column_base + c) : glmrt_bench_gather_stale(r);
        }
    }
}

static int64_t glmrt_bench_gather_first_wrong(const uint32_t *words, int64_t rows, int32_t width, int32_t column_base)
{
    for (int64_t i = 0; i < rows * width; ++i) {
        if (words[i] != glmrt_bench_gather_pattern(i / width, column_base + (int32_t)(i % width))) {
            return i;
        }
    }
    return -1;
}

static int glmrt_bench_gather_move(glmrt_bench_gpus *gpus, int32_t r, uint32_t *host, int64_t rows, int32_t width,
                                   float *device, int upload)
{
    const size_t bytes = (size_t)(rows * width) * sizeof(uint32_t);
    if (width == 0 || glmrt_bench_cuda(cudaSetDevice(gpus->devices[r]), "cudaSetDevice")) {
        return width == 0 ? 0 : 1;
    }
    return upload ? glmrt_bench_cuda(cudaMemcpy(device, host, bytes, cudaMemcpyHostToDevice), "copy")
                  : glmrt_bench_cuda(cudaMemcpy(host, device, bytes, cudaMemcpyDeviceToHost), "copy");
}

static int glmrt_bench_gather_verify(glmrt_bench_gpus *gpus, uint32_t *first, uint32_t *second, int64_t rows,
                                     int32_t first_words, int32_t second_words)
{
    for (int32_t r = 0; r < gpus->count; ++r) {
        if (glmrt_bench_gather_move(gpus, r, first, rows, first_words, gpus->buffers[r], 0) ||
            glmrt_bench_gather_move(gpus, r, second, rows, second_words, gpus->results[r], 0)) {
            return 1;
        }
        const int64_t wrong_first = glmrt_bench_gather_first_wrong(first, rows, first_words, 0);
        const int64_t wrong_second = glmrt_bench_gather_first_wrong(second, rows, second_words, first_words);
        if (wrong_first >= 0 || wrong_second >= 0) {
            printf("check of the row gather over %lld rows of %d and %d words: GPU %d holds a wrong word at %lld of "
                   "the %s array\n",
                   (long long)rows, first_words, second_words, r,
                   (long long)(wrong_first >= 0 ? wrong_first : wrong_second), wrong_first >= 0 ? "first" : "second");
            return 1;
        }
    }
    printf("check of the row gather over %lld rows of %d and %d words: every GPU holds every row\n", (long long)rows,
           first_words, second_words);
    return 0;
}

static int glmrt_bench_check_gather(glmrt_bench_gpus *gpus, int64_t rows, int32_t first_words, int32_t second_words)
{
    uint32_t *first = (uint32_t *)malloc((size_t)(rows * first_words) * sizeof(uint32_t));
    uint32_t *second = (uint32_t *)malloc((size_t)(rows * (second_words > 0 ? second_words : 1)) * sizeof(uint32_t));
    int failed = first == nullptr || second == nullptr;
    for (int32_t r = 0; r < gpus->count && !failed; ++r) {
        glmrt_bench_gather_host_rows(first, rows, first_words, 0, r, gpus->count);
        glmrt_bench_gather_host_rows(second, rows, second_words, first_words, r, gpus->count);
        failed = glmrt_bench_gather_move(gpus, r, first, rows, first_words, gpus->buffers[r], 1) ||
                 glmrt_bench_gather_move(gpus, r, second, rows, second_words, gpus->results[r], 1);
    }
    for (int32_t r = 0; r < gpus->count && !failed; ++r) {
        failed = glmrt_bench_cuda(cudaSetDevice(gpus->devices[r]), "cudaSetDevice") ||
                 glmrt_bench_gather_enqueue(gpus, r, rows, first_words, second_words);
    }
    if (!failed) {
        failed = glmrt_bench_sync(gpus) || glmrt_bench_gather_verify(gpus, first, second, rows, first_words,
                                                                     second_words);
    }
    free(first);
    free(second);
    return failed;
}

static int glmrt_bench_check_gathers(glmrt_bench_gpus *gpus)
{
    static const int64_t rows_list[] = {4, 7, 64, 301, GLMRT_BENCH_MAX_ROWS};
    for (size_t i = 0; i < sizeof(rows_list) / sizeof(rows_list[0]); ++i) {
        if (rows_list[i] >= gpus->count &&
            glmrt_bench_check_gather(gpus, rows_list[i], GLMRT_BENCH_GATHER_WORDS, GLMRT_BENCH_GATHER_WORDS)) {
            return 1;
        }
    }
    return glmrt_bench_check_gather(gpus, 13, 3, 0);
}

static int64_t glmrt_bench_scatter_first_wrong(const float *two_shot, const float *by_rows, int64_t rows,
                                               int32_t r, int32_t num_ranks)
{
    const int64_t begin = glmrt_peer_row_begin((int32_t)rows, r, num_ranks) * (int64_t)GLMRT_BENCH_HIDDEN;
    const int64_t end = glmrt_peer_row_begin((int32_t)rows, r + 1, num_ranks) * (int64_t)GLMRT_BENCH_HIDDEN;
    for (int64_t i = 0; i < rows * GLMRT_BENCH_HIDDEN; ++i) {
        const int own = i >= begin && i < end;
        if (own ? memcmp(&two_shot[i], &by_rows[i], sizeof(float)) != 0 : by_rows[i] != 0.0f) {
            return i;
        }
    }
    return -1;
}

static int glmrt_bench_check_scatter_rows(glmrt_bench_gpus *gpus, int64_t rows)
{
    const int64_t count = rows * GLMRT_BENCH_HIDDEN;
    if (glmrt_bench_fill_inputs(gpus, count, gpus->buffers) || glmrt_bench_zero(gpus, gpus->results, count) ||
        glmrt_bench_zero(gpus, gpus->second_results, count) ||
        glmrt_bench_enqueue(gpus, GLMRT_BENCH_BF16_TWO_SHOT, gpus->buffers, gpus->results, count) ||
        glmrt_bench_enqueue(gpus, GLMRT_BENCH_BF16_SCATTER_ROWS, gpus->buffers, gpus->second_results, count) ||
        glmrt_bench_sync(gpus)) {
        return 1;
    }
    float *two_shot = (float *)malloc((size_t)count * sizeof(float));
    float *by_rows = (float *)malloc((size_t)count * sizeof(float));
    int failed = two_shot == nullptr || by_rows == nullptr;
    int64_t wrong = -1;
    int32_t wrong_rank = 0;
    for (int32_t r = 0; r < gpus->count && !failed && wrong < 0; ++r) {
        failed = glmrt_bench_copy_back(gpus, r, gpus->results[r], two_shot, count) ||
                 glmrt_bench_copy_back(gpus, r, gpus->second_results[r], by_rows, count);
        wrong = failed ? -1 : glmrt_bench_scatter_first_wrong(two_shot, by_rows, rows, r, gpus->count);
        wrong_rank = r;
    }
    free(two_shot);
    free(by_rows);
    if (failed) {
        return 1;
    }
    if (wrong >= 0) {
        printf("check of the BF16 reduce by rows over %lld rows: GPU %d differs from the two-shot at float %lld\n",
               (long long)rows, wrong_rank, (long long)wrong);
        return 1;
    }
    printf("check of the BF16 reduce by rows over %lld rows: every GPU's own rows have the two-shot's bits, the others "
           "are untouched\n",
           (long long)rows);
    return 0;
}

static int glmrt_bench_check(glmrt_bench_gpus *gpus)
{
    static const int64_t scatter_rows[] = {1, 3, 256, 301, GLMRT_BENCH_MAX_ROWS};
    for (size_t i = 0; i < sizeof(scatter_rows) / sizeof(scatter_rows[0]); ++i) {
        if (glmrt_bench_check_scatter_rows(gpus, scatter_rows[i])) {
            return 1;
        }
    }
    if (glmrt_bench_check_gathers(gpus)) {
        return 1;
    }
    static const int64_t rows_list[] = {1, 3, 64, GLMRT_BENCH_MAX_ROWS};
    for (size_t i = 0; i < sizeof(rows_list) / sizeof(rows_list[0]); ++i) {
        if (glmrt_bench_check_rows(gpus, rows_list[i]) ||
            glmrt_bench_check_bf16(gpus, rows_list[i] * GLMRT_BENCH_HIDDEN)) {
            return 1;
        }
    }
    return glmrt_bench_check_bf16(gpus, GLMRT_BENCH_ODD_GROUPS_FLOATS);
}

static int glmrt_bench_capture(glmrt_bench_gpus *gpus, int32_t method, int64_t count, cudaGraphExec_t *execs)
{
    for (int32_t r = 0; r < gpus->count; ++r) {
        if (glmrt_bench_cuda(cudaSetDevice(gpus->devices[r]), "cudaSetDevice") ||
            glmrt_bench_cuda(cudaStreamBeginCapture(gpus->streams[r], cudaStreamCaptureModeThreadLocal), "capture")) {
            return 1;
        }
    }
    int failed = 0;
    for (int32_t call = 0; call < GLMRT_BENCH_CALLS && !failed; ++call) {
        failed = glmrt_bench_enqueue(gpus, method, gpus->buffers, gpus->results, count);
    }
    cudaGraph_t graphs[GLMRT_MAX_DEVICES];
    memset(graphs, 0, sizeof(graphs));
    for (int32_t r = 0; r < gpus->count; ++r) {
        cudaSetDevice(gpus->devices[r]);
        cudaError_t ended = cudaStreamEndCapture(gpus->streams[r], &graphs[r]);
        if (!failed) {
            failed = glmrt_bench_cuda(ended, "end capture");
        }
    }
    for (int32_t r = 0; r < gpus->count; ++r) {
        cudaSetDevice(gpus->devices[r]);
        if (!failed) {
            failed = glmrt_bench_cuda(cudaGraphInstantiate(&execs[r], graphs[r], 0), "instantiate");
        }
        if (graphs[r] != nullptr) {
            cudaGraphDestroy(graphs[r]);
        }
    }
    return failed;
}

static int glmrt_bench_replay(glmrt_bench_gpus *gpus, cudaGraphExec_t *execs, double *out_us)
{
    for (int32_t replay = -2; replay < GLMRT_BENCH_REPLAYS; ++replay) {
        if (replay == 0) {
            if (glmrt_bench_sync(gpus)) {
                return 1;
            }
            *out_us = glmrt_bench_seconds();
        }
        for (int32_t r = 0; r < gpus->count; ++r) {
            if (glmrt_bench_cuda(cudaSetDevice(gpus->devices[r]), "cudaSetDevice") ||
                glmrt_bench_cuda(cudaGraphLaunch(execs[r], gpus->streams[r]), "graph launch")) {
                return 1;
            }
        }
    }
    if (glmrt_bench_sync(gpus)) {
        return 1;
    }
    *out_us = 1e6 * (glmrt_bench_seconds() - *out_us) / ((double)GLMRT_BENCH_REPLAYS * GLMRT_BENCH_CALLS);
    return 0;
}

static int glmrt_bench_time(glmrt_bench_gpus *gpus, int32_t method, int64_t count, double *out_us)
{
    cudaGraphExec_t execs[GLMRT_MAX_DEVICES];
    memset(execs, 0, sizeof(execs));
    int failed = glmrt_bench_capture(gpus, method, count, execs);
    if (!failed) {
        failed = glmrt_bench_replay(gpus, execs, out_us);
    }
    glmrt_bench_sync(gpus);
    for (int32_t r = 0; r < gpus->count; ++r) {
        if (execs[r] != nullptr) {
            cudaSetDevice(gpus->devices[r]);
            cudaGraphExecDestroy(execs[r]);
        }
    }
    return failed;
}

static int glmrt_bench_table(glmrt_bench_gpus *gpus)
{
    static const int32_t rows_list[] = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048};
    printf("%d GPUs, hidden %d, fp32 in place, %d all-reduces a CUDA graph, %d replays\n", gpus->count,
           GLMRT_BENCH_HIDDEN, GLMRT_BENCH_CALLS, GLMRT_BENCH_REPLAYS);
    printf("| rows | KB a GPU | NCCL us | one-shot us | two-shot us | NCCL / faster peer | BF16 one-shot us | BF16 "
           "two-shot us | BF16 reduce by rows us | row gather us, 1,280 + 17 words a row |\n|---|---|---|---|---|---|---|---|---|---|\n");
    for (size_t i = 0; i < sizeof(rows_list) / sizeof(rows_list[0]); ++i) {
        int64_t count = (int64_t)rows_list[i] * GLMRT_BENCH_HIDDEN;
        double nccl_us = 0.0;
        double one_us = 0.0;
        double two_us = 0.0;
        double bf16_one_us = 0.0;
        double bf16_two_us = 0.0;
        double gather_us = 0.0;
        double scatter_us = 0.0;
        if (glmrt_bench_time(gpus, GLMRT_BENCH_NCCL, count, &nccl_us) ||
            glmrt_bench_time(gpus, GLMRT_BENCH_ONE_SHOT, count, &one_us) ||
            glmrt_bench_time(gpus, GLMRT_BENCH_TWO_SHOT, count, &two_us) ||
            glmrt_bench_time(gpus, GLMRT_BENCH_BF16_ONE_SHOT, count, &bf16_one_us) ||
            glmrt_bench_time(gpus, GLMRT_BENCH_BF16_TWO_SHOT, count, &bf16_two_us) ||
            glmrt_bench_time(gpus, GLMRT_BENCH_BF16_SCATTER_ROWS, count, &scatter_us) ||
            (rows_list[i] >= gpus->count && glmrt_bench_time(gpus, GLMRT_BENCH_ROW_GATHER, rows_list[i], &gather_us))) {
            return 1;
        }
        double faster = one_us < two_us ? one_us : two_us;
        printf("| %d | %.0f | %.2f | %.2f | %.2f | %.2fx | %.2f | %.2f | %.2f | %.2f |\n", rows_list[i],
               (double)count * 4.0 / 1024.0, nccl_us, one_us, two_us, nccl_us / faster, bf16_one_us, bf16_two_us,
               scatter_us, gather_us);
        fflush(stdout);
    }
    return 0;
}

int main(int argc, char **argv)
{
    int visible = 0;
    if (glmrt_bench_cuda(cudaGetDeviceCount(&visible), "cudaGetDeviceCount")) {
        return 1;
    }
    int32_t count = argc > 1 ? atoi(argv[1]) : visible;
    if (count > GLMRT_MAX_DEVICES) {
        count = GLMRT_MAX_DEVICES;
    }
    if (count < 2 || count > visible) {
        fprintf(stderr, "usage: allreduce_bench [GPUS [BLOCKS]]: needs 2 to %d GPUs, %d visible\n", GLMRT_MAX_DEVICES, visible);
        return 2;
    }
    glmrt_bench_gpus gpus;
    memset(&gpus, 0, sizeof(gpus));
    int failed = glmrt_bench_open(&gpus, count);
    int32_t chosen_blocks = failed ? 0 : gpus.peers[0].blocks;
    if (!failed) {
        printf("the peer all-reduce runs %d blocks a GPU\n", chosen_blocks);
        failed = glmrt_bench_check(&gpus);
    }
    if (!failed) {
        failed = glmrt_bench_table(&gpus);
    }
    for (int arg = 2; arg < argc && !failed; ++arg) {
        int32_t blocks = atoi(argv[arg]);
        if (blocks < 1 || blocks > chosen_blocks) {
            fprintf(stderr, "allreduce_bench: blocks must be 1 to %d, got %s\n", chosen_blocks, argv[arg]);
            failed = 1;
            break;
        }
        for (int32_t r = 0; r < count; ++r) {
            gpus.peers[r].blocks = blocks;
        }
        printf("\nthe peer all-reduce with %d blocks a GPU\n", blocks);
        failed = glmrt_bench_check(&gpus) || glmrt_bench_table(&gpus);
    }
    glmrt_bench_close(&gpus);
    return failed ? 1 : 0;
}
