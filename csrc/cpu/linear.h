#ifndef GLMRT_CPU_LINEAR_H
#define GLMRT_CPU_LINEAR_H

#include "threadpool.h"
#include "weights.h"

#define GLMRT_LINEAR_TILE_ROWS 8
#define GLMRT_DOT_LANES 16

typedef struct glmrt_matmul_job {
    const glmrt_linear *weight;
    const glmrt_linear *up_weight;
    const float *bias;
    int32_t num_rows;
    const float *x;
    int64_t x_stride;
    const int32_t *x_row_ids;
    float *y;
    int64_t y_stride;
    const int32_t *y_row_ids;
} glmrt_matmul_job;

typedef struct glmrt_linear_runner {
    glmrt_threadpool *pool;
    int32_t num_threads;
    int32_t max_cols;
    int64_t tile_floats;
    float *tiles;
    int32_t job_capacity;
    int64_t *job_first_task;
    const glmrt_matmul_job *jobs;
    int32_t num_jobs;
} glmrt_linear_runner;

glmrt_status glmrt_linear_runner_init(glmrt_linear_runner *runner, glmrt_threadpool *pool, int32_t max_cols,
                                      int32_t job_capacity, glmrt_error *error);
void glmrt_linear_runner_free(glmrt_linear_runner *runner);
int64_t glmrt_linear_runner_bytes(const glmrt_linear_runner *runner);

glmrt_status glmrt_linear_validate(const glmrt_linear *weight, int32_t rows, int32_t cols, const char *role,
                                   glmrt_error *error);
void glmrt_linear_dequant_row(const glmrt_linear *weight, int32_t row, float *out);
float glmrt_dot(const float *a, const float *b, int32_t n);
int glmrt_linear_rounds_inputs(const glmrt_linear *weight);
void glmrt_round_bf16_span(const float *x, float *out, int32_t n);
void glmrt_linear_round_row(const glmrt_linear *weight, const float *x, float *out, int32_t n);
glmrt_status glmrt_linear_run(glmrt_linear_runner *runner, const glmrt_matmul_job *jobs, int32_t num_jobs,
                              glmrt_error *error);

#endif
