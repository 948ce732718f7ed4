#include "cuda_check.cuh"
#include "rank_gather.cuh"

static glmrt_status glmrt_gather_nccl(ncclResult_t result, const char *what, glmrt_error *error)
{
    if (result != ncclSuccess) {
        return glmrt_error_set(error, GLMRT_ERR_BACKEND, "%s of the logits failed: %s", what,
                               ncclGetErrorString(result));
    }
    return GLMRT_OK;
}

static glmrt_status glmrt_gather_exchange(const glmrt_cuda_logits_gather *g, cudaStream_t stream, glmrt_error *error)
{
    const glmrt_rank *rank = g->rank;
    ncclResult_t result = ncclGroupStart();
    if (result != ncclSuccess) {
        return glmrt_gather_nccl(result, "ncclGroupStart", error);
    }
    float *part = g->parts;
    for (int32_t r = 1; r < rank->num_ranks && result == ncclSuccess; ++r) {
        const glmrt_rank_range range = g->plan->ranks[r].vocab_rows;
        if (range.count <= 0) {
            continue;
        }
        size_t count = (size_t)g->rows * (size_t)range.count;
        if (rank->index == 0) {
            result = ncclRecv(part, count, ncclFloat, r, g->comm, stream);
            part += count;
        } else if (rank->index == r) {
            result = ncclSend(g->logits, count, ncclFloat, 0, g->comm, stream);
        }
    }
    ncclResult_t ended = ncclGroupEnd();
    GLMRT_TRY(glmrt_gather_nccl(result, "ncclSend or ncclRecv", error));
    return glmrt_gather_nccl(ended, "ncclGroupEnd", error);
}

static glmrt_status glmrt_gather_place(const glmrt_cuda_logits_gather *g, cudaStream_t stream, glmrt_error *error)
{
    const glmrt_rank *rank = g->rank;
    const float *part = g->parts;
    for (int32_t r = 1; r < rank->num_ranks; ++r) {
        const glmrt_rank_range range = g->plan->ranks[r].vocab_rows;
        if (range.count <= 0) {
            continue;
        }
        size_t width = (size_t)range.count * sizeof(float);
        GLMRT_CUDA_TRY(error, cudaMemcpy2DAsync(g->logits + range.begin, (size_t)g->vocab * sizeof(float), part, width,
                                                width, (size_t)g->rows, cudaMemcpyDeviceToDevice, stream));
        part += (size_t)g->rows * (size_t)range.count;
    }
    return GLMRT_OK;
}

glmrt_status glmrt_cuda_gather_logits(const glmrt_cuda_logits_gather *gather, cudaStream_t stream,
                                      glmrt_error *error)
{
    if (gather->comm == nullptr || gather->rank->num_ranks < 2 || gather->rows <= 0) {
        return GLMRT_OK;
    }
    if (gather->rank->index == 0 && gather->parts == nullptr) {
        return glmrt_error_set(error, GLMRT_ERR_INVARIANT, "GPU 0 has no buffer for the other GPUs' logits");
    }
    GLMRT_TRY(glmrt_gather_exchange(gather, stream, error));
    if (gather->rank->index != 0) {
        return GLMRT_OK;
    }
    return glmrt_gather_place(gather, stream, error);
}
