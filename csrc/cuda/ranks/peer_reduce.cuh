#ifndef GLMRT_PEER_REDUCE_CUH
#define GLMRT_PEER_REDUCE_CUH

#include <cuda_runtime.h>
#include <stdint.h>

extern "C" {
#include "error.h"
#include "glmrt.h"
}

#define GLMRT_PEER_REDUCE_MAX_BLOCKS 128
#define GLMRT_PEER_REDUCE_MIN_BLOCKS 8
#define GLMRT_PEER_REDUCE_THREADS 256
#define GLMRT_PEER_ONE_SHOT_MAX_BYTES (768 * 1024)

typedef enum glmrt_peer_shots {
    GLMRT_PEER_SHOTS_BY_SIZE = 0,
    GLMRT_PEER_ONE_SHOT = 1,
    GLMRT_PEER_TWO_SHOT = 2
} glmrt_peer_shots;

typedef struct glmrt_cuda_peer_reduce {
    int32_t rank;
    int32_t num_ranks;
    int32_t blocks;
    int64_t capacity;
    int64_t bytes;
    uint8_t *memory;
    float *staging;
    unsigned long long *signals;
    unsigned long long *epochs;
    float *peer_staging[GLMRT_MAX_DEVICES];
    unsigned long long *peer_signals[GLMRT_MAX_DEVICES];
    const int32_t *abort_flag;
} glmrt_cuda_peer_reduce;

typedef struct glmrt_cuda_peer_group {
    int32_t num_ranks;
    const int32_t *devices;
    glmrt_cuda_peer_reduce *const *ranks;
    int64_t capacity;
    const int32_t *abort_flag;
    int32_t *host_abort_flag;
    const cudaStream_t *streams;
    int32_t bf16_partials;
} glmrt_cuda_peer_group;

#define GLMRT_PEER_GATHER_ARRAYS 4

typedef struct glmrt_cuda_peer_row_gather {
    uint32_t *arrays[GLMRT_PEER_GATHER_ARRAYS];
    int32_t words[GLMRT_PEER_GATHER_ARRAYS];
    int32_t num_arrays;
    int32_t num_rows;
} glmrt_cuda_peer_row_gather;

static inline __host__ __device__ int32_t glmrt_peer_row_begin(int32_t num_rows, int32_t rank, int32_t num_ranks)
{
    return (int32_t)((int64_t)num_rows * rank / num_ranks);
}

glmrt_status glmrt_cuda_peer_unreachable(const int32_t *devices, int32_t num_devices, int32_t *out_from,
                                         int32_t *out_to, glmrt_error *error);
glmrt_status glmrt_cuda_peer_reduce_open(glmrt_cuda_peer_group *group, int32_t **out_host_abort_flag,
                                         glmrt_error *error);
void glmrt_cuda_peer_reduce_release(glmrt_cuda_peer_reduce *peer);
int glmrt_cuda_peer_reduce_fits(const glmrt_cuda_peer_reduce *peer, int64_t count);
glmrt_status glmrt_cuda_peer_reduce_run_shots(const glmrt_cuda_peer_reduce *peer, float *x, int64_t count,
                                              glmrt_peer_shots shots, cudaStream_t stream, glmrt_error *error);
glmrt_status glmrt_cuda_peer_reduce_run(const glmrt_cuda_peer_reduce *peer, float *x, int64_t count,
                                        cudaStream_t stream, glmrt_error *error);
glmrt_status glmrt_cuda_peer_reduce_bf16_run_shots(const glmrt_cuda_peer_reduce *peer, const float *partial,
                                                   float *residual, int64_t count, glmrt_peer_shots shots,
                                                   cudaStream_t stream, glmrt_error *error);
glmrt_status glmrt_cuda_peer_reduce_bf16_run(const glmrt_cuda_peer_reduce *peer, const float *partial,
                                             float *residual, int64_t count, cudaStream_t stream,
                                             glmrt_error *error);
void glmrt_cuda_peer_row_gather_clear(glmrt_cuda_peer_row_gather *rows, int32_t num_rows);
void glmrt_cuda_peer_row_gather_add(glmrt_cuda_peer_row_gather *rows, void *array, int32_t words);
int glmrt_cuda_peer_gather_rows_fits(const glmrt_cuda_peer_reduce *peer, int32_t num_rows, int64_t row_words);
glmrt_status glmrt_cuda_peer_gather_rows(const glmrt_cuda_peer_reduce *peer, const glmrt_cuda_peer_row_gather *rows,
                                         cudaStream_t stream, glmrt_error *error);
int glmrt_cuda_peer_scatter_rows_fits(const glmrt_cuda_peer_reduce *peer, int32_t num_rows, int32_t row_floats);
glmrt_status glmrt_cuda_peer_reduce_bf16_scatter_rows(const glmrt_cuda_peer_reduce *peer, const float *partial,
                                                      float *residual, int32_t num_rows, int32_t row_floats,
                                                      cudaStream_t stream, glmrt_error *error);

#endif
