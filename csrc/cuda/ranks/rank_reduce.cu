#include "rank_reduce.cuh"

glmrt_status glmrt_cuda_reduce_hidden(ncclComm_t comm, const glmrt_cuda_peer_reduce *peer, float *hidden,
                                      int64_t count, cudaStream_t stream, glmrt_error *error)
{
    if (comm == nullptr || count <= 0) {
        return GLMRT_OK;
    }
    if (glmrt_cuda_peer_reduce_fits(peer, count)) {
        return glmrt_cuda_peer_reduce_run(peer, hidden, count, stream, error);
    }
    ncclResult_t result = ncclAllReduce(hidden, hidden, (size_t)count, ncclFloat, ncclSum, comm, stream);
    if (result != ncclSuccess) {
        return glmrt_error_set(error, GLMRT_ERR_BACKEND, "ncclAllReduce of %lld floats failed: %s",
                               (long long)count, ncclGetErrorString(result));
    }
    return GLMRT_OK;
}
