#ifndef GLMRT_CUDA_SHARD_PLAN_H
#define GLMRT_CUDA_SHARD_PLAN_H

#ifdef __cplusplus
extern "C" {
#endif
#include "error.h"
#ifdef __cplusplus
}
#endif

#define GLMRT_CUDA_MAX_RANKS 16

typedef struct glmrt_cuda_range {
    int32_t begin;
    int32_t count;
} glmrt_cuda_range;

typedef struct glmrt_cuda_shard {
    int32_t rank;
    int32_t num_ranks;
    glmrt_cuda_range q_heads;
    glmrt_cuda_range kv_heads;
    glmrt_cuda_range experts;
    glmrt_cuda_range vocab_rows;
    glmrt_cuda_range dense_columns;
    glmrt_cuda_range shared_columns;
} glmrt_cuda_shard;

typedef struct glmrt_cuda_shard_plan {
    int32_t num_ranks;
    int32_t kv_heads_replicated;
    glmrt_cuda_shard shards[GLMRT_CUDA_MAX_RANKS];
} glmrt_cuda_shard_plan;

#ifdef __cplusplus
extern "C" {
#endif

glmrt_status glmrt_cuda_shard_plan_build(const glmrt_model_config *config, int32_t num_ranks,
                                         glmrt_cuda_shard_plan *out, glmrt_error *error);
int32_t glmrt_cuda_shard_is_whole_model(const glmrt_cuda_shard *shard, const glmrt_model_config *config);

#ifdef __cplusplus
}
#endif

#endif
