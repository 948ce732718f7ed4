#ifndef GLMRT_RANK_REDUCE_CUH
#define GLMRT_RANK_REDUCE_CUH

#include <cuda_runtime.h>
#include <nccl.h>

#include "peer_reduce.cuh"

extern "C" {
#include "error.h"
}

glmrt_status glmrt_cuda_reduce_hidden(ncclComm_t comm, const glmrt_cuda_peer_reduce *peer, float *hidden,
                                      int64_t count, cudaStream_t stream, glmrt_error *error);

#endif
