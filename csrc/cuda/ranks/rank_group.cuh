#ifndef GLMRT_RANK_GROUP_CUH
#define GLMRT_RANK_GROUP_CUH

#include <pthread.h>

#include "cuda_check.cuh"
#include "rank_state.cuh"

enum glmrt_rank_job {
    GLMRT_RANK_JOB_NONE = 0,
    GLMRT_RANK_JOB_LOAD = 1,
    GLMRT_RANK_JOB_FORWARD = 2,
    GLMRT_RANK_JOB_STOP = 3,
    GLMRT_RANK_JOB_CAPTURE = 4
};

typedef struct glmrt_rank_work {
    int32_t job;
    const glmrt_cuda_step_counts *counts;
    const uint8_t *host_inputs;
    float *out_logits;
    glmrt_token *out_sampled;
} glmrt_rank_work;

typedef struct glmrt_cuda_group glmrt_cuda_group;

typedef struct glmrt_rank_slot {
    glmrt_cuda_group *group;
    int32_t rank;
} glmrt_rank_slot;

struct glmrt_cuda_group {
    glmrt_engine *engine;
    int32_t num_ranks;
    int32_t all_reduce;
    glmrt_rank_plan plan;
    glmrt_cuda_state *ranks[GLMRT_MAX_DEVICES];
    ncclComm_t comms[GLMRT_MAX_DEVICES];
    int32_t comms_live;
    int32_t comms_aborted;
    int32_t *peer_abort;
    uint8_t *host_step_inputs[GLMRT_CUDA_FLIGHTS];
    int32_t num_input_buffers;
    int32_t next_input_buffer;
    pthread_t threads[GLMRT_MAX_DEVICES];
    glmrt_rank_slot slots[GLMRT_MAX_DEVICES];
    int32_t threads_started;
    pthread_mutex_t lock;
    pthread_cond_t work_ready;
    pthread_cond_t work_done;
    int32_t sync_ready;
    uint64_t generation;
    glmrt_rank_work work;
    int32_t ranks_done;
    int32_t step_abandoned;
    int32_t failing_rank;
    int32_t rank_waiting[GLMRT_MAX_DEVICES];
    glmrt_status rank_status[GLMRT_MAX_DEVICES];
    int32_t failed;
    char failure[GLMRT_ERROR_MESSAGE_CAPACITY];
    glmrt_cuda_step_counts step_counts;
    int32_t launched;
};

glmrt_status glmrt_cuda_group_create(glmrt_engine *engine, glmrt_cuda_group **out);
void glmrt_cuda_group_destroy(glmrt_cuda_group *group);
glmrt_status glmrt_cuda_group_launch(glmrt_cuda_group *group, const glmrt_step_batch *batch, float *out_logits,
                                     glmrt_token *out_sampled);
glmrt_status glmrt_cuda_group_complete(glmrt_cuda_group *group, glmrt_step_report *out_report);
int32_t glmrt_cuda_group_feeds_sampled_tokens(const glmrt_cuda_group *group);

#endif
