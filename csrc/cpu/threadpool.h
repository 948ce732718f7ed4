#ifndef GLMRT_THREADPOOL_H
#define GLMRT_THREADPOOL_H

#include "error.h"

#define GLMRT_THREADPOOL_MIN_PARALLEL_WORK 65536

typedef struct glmrt_threadpool glmrt_threadpool;

typedef void (*glmrt_threadpool_task_fn)(void *context, int32_t task_index, int32_t thread_index);

glmrt_status glmrt_threadpool_create(int32_t num_threads, glmrt_threadpool **out_pool, glmrt_error *error);
void glmrt_threadpool_destroy(glmrt_threadpool *pool);
int32_t glmrt_threadpool_num_threads(const glmrt_threadpool *pool);
void glmrt_threadpool_run(glmrt_threadpool *pool, int32_t num_tasks, glmrt_threadpool_task_fn fn,
                          void *context);
void glmrt_threadpool_run_sized(glmrt_threadpool *pool, int32_t num_tasks, glmrt_threadpool_task_fn fn,
                                void *context, int64_t work_units);
int32_t glmrt_threadpool_default_threads(void);

#endif
