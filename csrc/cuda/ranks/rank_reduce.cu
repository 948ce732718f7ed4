#include <string.h>

#include "cuda_check.cuh"
#include "rank_reduce.cuh"

#define GLMRT_ORDERED_SUM_THREADS 256
#define GLMRT_ORDERED_SUM_MAX_BLOCKS 4096

__global__ void __launch_bounds__(GLMRT_ORDERED_SUM_THREADS)
    glmrt_ordered_sum_kernel(float *hidden, const float *gathered, int64_t count, int32_t num_ranks)
{
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += stride) {
        float sum = gathered[i];
        for (int32_t p = 1; p < num_ranks; ++p) {
            sum += gathered[(int64_t)p * count + i];
        }
        hidden[i] = sum;
    }
}

int glmrt_cuda_ordered_gather_wanted(int32_t all_reduce, int32_t num_ranks)
{
    return all_reduce == GLMRT_ALL_REDUCE_NCCL && num_ranks > 2;
}

glmrt_status glmrt_cuda_ordered_gather_allocate(glmrt_cuda_ordered_gather *gather, int32_t device, int32_t num_ranks,
                                                int64_t capacity, glmrt_error *error)
{
    int64_t bytes = (int64_t)num_ranks * capacity * (int64_t)sizeof(float);
    GLMRT_CUDA_TRY(error, cudaSetDevice(device));
    cudaError_t made = cudaMalloc((void **)&gather->rows, (size_t)bytes);
    if (made != cudaSuccess) {
        cudaGetLastError();
        gather->rows = nullptr;
        return glmrt_error_set(error, GLMRT_ERR_OUT_OF_MEMORY,
                               "cannot allocate %lld bytes on device %d for the ordered NCCL sum: %s",
                               (long long)bytes, device, cudaGetErrorString(made));
    }
    gather->capacity = capacity;
    gather->bytes = bytes;
    gather->num_ranks = num_ranks;
    return GLMRT_OK;
}

void glmrt_cuda_ordered_gather_release(glmrt_cuda_ordered_gather *gather)
{
    if (gather->rows != nullptr) {
        cudaFree(gather->rows);
        cudaGetLastError();
    }
    memset(gather, 0, sizeof(*gather));
}

static glmrt_status glmrt_cuda_ordered_sum(ncclComm_t comm, const glmrt_cuda_ordered_gather *gather, float *hidden,
                                           int64_t count, cudaStream_t stream, glmrt_error *error)
{
    if (count > gather->capacity) {
        return glmrt_error_set(error, GLMRT_ERR_INVARIANT, "the ordered NCCL sum holds %lld floats, asked to sum %lld",
                               (long long)gather->capacity, (long long)count);
    }
    ncclResult_t result = ncclAllGather(hidden, gather->rows, (size_t)count, ncclFloat, comm, stream);
    if (result != ncclSuccess) {
        return glmrt_error_set(error, GLMRT_ERR_BACKEND, "ncclAllGather of %lld floats failed: %s", (long long)count,
                               ncclGetErrorString(result));
    }
    int64_t blocks = (count + GLMRT_ORDERED_SUM_THREADS - 1) / GLMRT_ORDERED_SUM_THREADS;
    blocks = blocks < GLMRT_ORDERED_SUM_MAX_BLOCKS ? blocks : GLMRT_ORDERED_SUM_MAX_BLOCKS;
    glmrt_ordered_sum_kernel<<<(unsigned)blocks, GLMRT_ORDERED_SUM_THREADS, 0, stream>>>(hidden, gather->rows, count,
                                                                                        gather->num_ranks);
    cudaError_t launched = cudaGetLastError();
    if (launched != cudaSuccess) {
        return glmrt_error_set(error, GLMRT_ERR_BACKEND, "the ordered sum of %lld floats failed to launch: %s",
                               (long long)count, cudaGetErrorString(launched));
    }
    return GLMRT_OK;
}

glmrt_status glmrt_cuda_reduce_hidden(ncclComm_t comm, const glmrt_cuda_peer_reduce *peer,
                                      const glmrt_cuda_ordered_gather *gather, const float *partials, float *hidden,
                                      int64_t count, cudaStream_t stream, glmrt_error *error)
{
    if (comm == nullptr || count <= 0) {
        return GLMRT_OK;
    }
    if (partials != nullptr) {
        return glmrt_cuda_peer_reduce_bf16_run(peer, partials, hidden, count, stream, error);
    }
    if (glmrt_cuda_peer_reduce_fits(peer, count)) {
        return glmrt_cuda_peer_reduce_run(peer, hidden, count, stream, error);
    }
    if (gather->rows != nullptr) {
        return glmrt_cuda_ordered_sum(comm, gather, hidden, count, stream, error);
    }
    ncclResult_t result = ncclAllReduce(hidden, hidden, (size_t)count, ncclFloat, ncclSum, comm, stream);
    if (result != ncclSuccess) {
        return glmrt_error_set(error, GLMRT_ERR_BACKEND, "ncclAllReduce of %lld floats failed: %s",
                               (long long)count, ncclGetErrorString(result));
    }
    return GLMRT_OK;
}
