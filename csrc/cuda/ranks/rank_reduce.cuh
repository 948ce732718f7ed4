#ifndef GLMRT_RANK_REDUCE_CUH
#define GLMRT_RANK_REDUCE_CUH

#include <cuda_runtime.h>
#include <nccl.h>

#include "peer_reduce.cuh"

extern "C" {
#include "error.h"
}

typedef struct glmrt_cuda_ordered_gather {
    float *rows;
    int64_t capacity;
    int64_t bytes;
    int32_t num_ranks;
} glmrt_cuda_ordered_gather;

int glmrt_cuda_ordered_gather_wanted(int32_t all_reduce, int32_t num_ranks);
glmrt_status glmrt_cuda_ordered_gather_allocate(glmrt_cuda_ordered_gather *gather, int32_t device, int32_t num_ranks,
                                                int64_t capacity, glmrt_error *error);
void glmrt_cuda_ordered_gather_release(glmrt_cuda_ordered_gather *gather);
glmrt_status glmrt_cuda_reduce_hidden(ncclComm_t comm, const glmrt_cuda_peer_reduce *peer,
                                      const glmrt_cuda_ordered_gather *gather, const float *partials, float *hidden,
                                      int64_t count, cudaStream_t stream, glmrt_error *error);

#endif
