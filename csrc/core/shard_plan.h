#ifndef GLMRT_SHARD_PLAN_H
#define GLMRT_SHARD_PLAN_H

#ifdef __cplusplus
extern "C" {
#endif
#include "error.h"
#include "glmrt.h"
#ifdef __cplusplus
}
#endif

#define GLMRT_SHARD_COLUMN_STEP 16
#define GLMRT_SHARD_DEFAULT_BLOCK 128

typedef struct glmrt_shard_range {
    int32_t begin;
    int32_t count;
} glmrt_shard_range;

typedef struct glmrt_shard {
    int32_t rank;
    int32_t num_ranks;
    glmrt_shard_range q_heads;
    glmrt_shard_range kv_heads;
    glmrt_shard_range experts;
    glmrt_shard_range vocab_rows;
    glmrt_shard_range dense_columns;
    glmrt_shard_range shared_columns;
} glmrt_shard;

typedef struct glmrt_shard_plan {
    int32_t num_ranks;
    glmrt_shard shards[GLMRT_MAX_DEVICES];
} glmrt_shard_plan;

#ifdef __cplusplus
extern "C" {
#endif

glmrt_status glmrt_shard_plan_build(const glmrt_model_config *config, int32_t num_ranks, glmrt_shard_plan *out,
                                    glmrt_error *error);

#ifdef __cplusplus
}
#endif

#endif
