#include "threadpool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define GLMRT_THREADPOOL_MAX_THREADS 1024

typedef struct glmrt_threadpool_worker {
    glmrt_threadpool *pool;
    int32_t thread_index;
    pthread_t thread;
} glmrt_threadpool_worker;

struct glmrt_threadpool {
    int32_t num_threads;
    int32_t num_started;
    glmrt_threadpool_worker *workers;
    pthread_mutex_t mutex;
    pthread_cond_t work_ready;
    pthread_cond_t work_done;
    uint32_t generation;
    int32_t stopping;
    glmrt_threadpool_task_fn fn;
    void *context;
    int32_t num_tasks;
    _Atomic uint64_t claim;
    atomic_int completed;
};

int32_t glmrt_threadpool_default_threads(void)
{
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    if (online < 1) {
        return 1;
    }
    if (online > GLMRT_THREADPOOL_MAX_THREADS) {
        return GLMRT_THREADPOOL_MAX_THREADS;
    }
    return (int32_t)online;
}

static uint64_t threadpool_claim_word(uint32_t generation, uint32_t next_task)
{
    return ((uint64_t)generation << 32) | next_task;
}

static int32_t threadpool_claim_task(glmrt_threadpool *pool, uint32_t generation, int32_t num_tasks)
{
    uint64_t word = atomic_load_explicit(&pool->claim, memory_order_acquire);
    for (;;) {
        uint32_t next_task = (uint32_t)(word & 0xffffffffu);
        if ((uint32_t)(word >> 32) != generation || next_task >= (uint32_t)num_tasks) {
            return -1;
        }
        if (atomic_compare_exchange_weak_explicit(&pool->claim, &word, word + 1, memory_order_acq_rel,
                                                  memory_order_acquire)) {
            return (int32_t)next_task;
        }
    }
}

static void threadpool_finish_task(glmrt_threadpool *pool, int32_t num_tasks)
{
    int done = atomic_fetch_add_explicit(&pool->completed, 1, memory_order_acq_rel) + 1;
    if (done == num_tasks) {
        pthread_mutex_lock(&pool->mutex);
        pthread_cond_signal(&pool->work_done);
        pthread_mutex_unlock(&pool->mutex);
    }
}

static void threadpool_drain(glmrt_threadpool *pool, uint32_t generation, glmrt_threadpool_task_fn fn,
                             void *context, int32_t num_tasks, int32_t thread_index)
{
    for (;;) {
        int32_t task = threadpool_claim_task(pool, generation, num_tasks);
        if (task < 0) {
            return;
        }
        fn(context, task, thread_index);
        threadpool_finish_task(pool, num_tasks);
    }
}

static void *threadpool_worker_main(void *argument)
{
    glmrt_threadpool_worker *worker = argument;
    glmrt_threadpool *pool = worker->pool;
    uint32_t seen_generation = 0;
    pthread_mutex_lock(&pool->mutex);
    for (;;) {
        while (!pool->stopping && pool->generation == seen_generation) {
            pthread_cond_wait(&pool->work_ready, &pool->mutex);
        }
        if (pool->stopping) {
            break;
        }
        seen_generation = pool->generation;
        glmrt_threadpool_task_fn fn = pool->fn;
        void *context = pool->context;
        int32_t num_tasks = pool->num_tasks;
        pthread_mutex_unlock(&pool->mutex);
        threadpool_drain(pool, seen_generation, fn, context, num_tasks, worker->thread_index);
        pthread_mutex_lock(&pool->mutex);
    }
    pthread_mutex_unlock(&pool->mutex);
    return NULL;
}

static void threadpool_stop_workers(glmrt_threadpool *pool)
{
    pthread_mutex_lock(&pool->mutex);
    pool->stopping = 1;
    pthread_cond_broadcast(&pool->work_ready);
    pthread_mutex_unlock(&pool->mutex);
    for (int32_t i = 0; i < pool->num_started; ++i) {
        pthread_join(pool->workers[i].thread, NULL);
    }
    pool->num_started = 0;
}

static glmrt_status threadpool_init_sync(glmrt_threadpool *pool, glmrt_error *error)
{
    if (pthread_mutex_init(&pool->mutex, NULL) != 0) {
        return glmrt_error_set(error, GLMRT_ERR_BACKEND, "thread pool: mutex init failed");
    }
    if (pthread_cond_init(&pool->work_ready, NULL) != 0) {
        pthread_mutex_destroy(&pool->mutex);
        return glmrt_error_set(error, GLMRT_ERR_BACKEND, "thread pool: condition variable init failed");
    }
    if (pthread_cond_init(&pool->work_done, NULL) != 0) {
        pthread_cond_destroy(&pool->work_ready);
        pthread_mutex_destroy(&pool->mutex);
        return glmrt_error_set(error, GLMRT_ERR_BACKEND, "thread pool: condition variable init failed");
    }
    return GLMRT_OK;
}

static void threadpool_free_sync(glmrt_threadpool *pool)
{
    pthread_cond_destroy(&pool->work_done);
    pthread_cond_destroy(&pool->work_ready);
    pthread_mutex_destroy(&pool->mutex);
}

glmrt_status glmrt_threadpool_create(int32_t num_threads, glmrt_threadpool **out_pool, glmrt_error *error)
{
    if (out_pool == NULL) {
        return glmrt_error_set(error, GLMRT_ERR_INVALID_ARGUMENT, "thread pool: out_pool is NULL");
    }
    *out_pool = NULL;
    if (num_threads < 1 || num_threads > GLMRT_THREADPOOL_MAX_THREADS) {
        return glmrt_error_set(error, GLMRT_ERR_INVALID_ARGUMENT, "thread pool: num_threads %d outside 1..%d",
                               (int)num_threads, GLMRT_THREADPOOL_MAX_THREADS);
    }
    glmrt_threadpool *pool = calloc(1, sizeof(*pool));
    if (pool == NULL) {
        return glmrt_error_set(error, GLMRT_ERR_OUT_OF_MEMORY, "thread pool: out of memory");
    }
    pool->num_threads = num_threads;
    atomic_init(&pool->claim, 0);
    atomic_init(&pool->completed, 0);
    if (num_threads > 1) {
        pool->workers = calloc((size_t)(num_threads - 1), sizeof(*pool->workers));
        if (pool->workers == NULL) {
            free(pool);
            return glmrt_error_set(error, GLMRT_ERR_OUT_OF_MEMORY, "thread pool: out of memory");
        }
    }
    glmrt_status status = threadpool_init_sync(pool, error);
    if (status != GLMRT_OK) {
        free(pool->workers);
        free(pool);
        return status;
    }
    for (int32_t i = 0; i < num_threads - 1; ++i) {
        pool->workers[i].pool = pool;
        pool->workers[i].thread_index = i + 1;
        int rc = pthread_create(&pool->workers[i].thread, NULL, threadpool_worker_main, &pool->workers[i]);
        if (rc != 0) {
            threadpool_stop_workers(pool);
            threadpool_free_sync(pool);
            free(pool->workers);
            free(pool);
            return glmrt_error_set(error, GLMRT_ERR_BACKEND, "thread pool: pthread_create failed: %s",
                                   strerror(rc));
        }
        pool->num_started = i + 1;
    }
    *out_pool = pool;
    return GLMRT_OK;
}

void glmrt_threadpool_destroy(glmrt_threadpool *pool)
{
    if (pool == NULL) {
        return;
    }
    threadpool_stop_workers(pool);
    threadpool_free_sync(pool);
    free(pool->workers);
    free(pool);
}

int32_t glmrt_threadpool_num_threads(const glmrt_threadpool *pool)
{
    return pool == NULL ? 1 : pool->num_threads;
}

void glmrt_threadpool_run(glmrt_threadpool *pool, int32_t num_tasks, glmrt_threadpool_task_fn fn,
                          void *context)
{
    if (num_tasks <= 0 || fn == NULL) {
        return;
    }
    if (pool == NULL || pool->num_started == 0 || num_tasks == 1) {
        for (int32_t task = 0; task < num_tasks; ++task) {
            fn(context, task, 0);
        }
        return;
    }
    pthread_mutex_lock(&pool->mutex);
    pool->generation += 1;
    if (pool->generation == 0) {
        pool->generation = 1;
    }
    uint32_t generation = pool->generation;
    pool->fn = fn;
    pool->context = context;
    pool->num_tasks = num_tasks;
    atomic_store_explicit(&pool->completed, 0, memory_order_relaxed);
    atomic_store_explicit(&pool->claim, threadpool_claim_word(generation, 0), memory_order_release);
    pthread_cond_broadcast(&pool->work_ready);
    pthread_mutex_unlock(&pool->mutex);
    threadpool_drain(pool, generation, fn, context, num_tasks, 0);
    pthread_mutex_lock(&pool->mutex);
    while (atomic_load_explicit(&pool->completed, memory_order_acquire) < num_tasks) {
        pthread_cond_wait(&pool->work_done, &pool->mutex);
    }
    pthread_mutex_unlock(&pool->mutex);
}

void glmrt_threadpool_run_sized(glmrt_threadpool *pool, int32_t num_tasks, glmrt_threadpool_task_fn fn,
                                void *context, int64_t work_units)
{
    if (work_units < GLMRT_THREADPOOL_MIN_PARALLEL_WORK) {
        glmrt_threadpool_run(NULL, num_tasks, fn, context);
        return;
    }
    glmrt_threadpool_run(pool, num_tasks, fn, context);
}
