#ifndef GLMRT_RANK_GATHER_CUH
#define GLMRT_RANK_GATHER_CUH

#include <cuda_runtime.h>
#include <nccl.h>

#include "rank_plan.h"

extern "C" {
#include "error.h"
}

typedef struct glmrt_cuda_logits_gather {
    ncclComm_t comm;
    const glmrt_rank_plan *plan;
    const glmrt_rank *rank;
    float *logits;
    float *parts;
    int32_t rows;
    int32_t vocab;
} glmrt_cuda_logits_gather;

glmrt_status glmrt_cuda_gather_logits(const glmrt_cuda_logits_gather *gather, cudaStream_t stream,
                                      glmrt_error *error);

#endif
