#ifndef GLMRT_RANK_PLAN_H
#define GLMRT_RANK_PLAN_H

#ifdef __cplusplus
extern "C" {
#endif
#include "error.h"
#include "glmrt.h"
#ifdef __cplusplus
}
#endif

#define GLMRT_RANK_COLUMN_STEP 16
#define GLMRT_RANK_DEFAULT_BLOCK 128

typedef struct glmrt_rank_range {
    int32_t begin;
    int32_t count;
} glmrt_rank_range;

typedef struct glmrt_rank {
    int32_t index;
    int32_t num_ranks;
    glmrt_rank_range q_heads;
    glmrt_rank_range kv_heads;
    glmrt_rank_range experts;
    glmrt_rank_range vocab_rows;
    glmrt_rank_range dense_columns;
    glmrt_rank_range shared_columns;
    glmrt_rank_range expert_columns;
} glmrt_rank;

typedef struct glmrt_rank_plan {
    int32_t num_ranks;
    glmrt_rank ranks[GLMRT_MAX_DEVICES];
} glmrt_rank_plan;

#ifdef __cplusplus
extern "C" {
#endif

glmrt_status glmrt_expert_split_check(int32_t expert_split, glmrt_error *error);
glmrt_status glmrt_rank_plan_build(const glmrt_model_config *config, int32_t num_ranks, int32_t expert_split,
                                    glmrt_rank_plan *out, glmrt_error *error);

#ifdef __cplusplus
}
#endif

#endif
