#ifndef GLMRT_PEER_REDUCE_CUH
#define GLMRT_PEER_REDUCE_CUH

#include <cuda_runtime.h>
#include <stdint.h>

extern "C" {
#include "error.h"
#include "glmrt.h"
}

#define GLMRT_PEER_REDUCE_BLOCKS 64
#define GLMRT_PEER_REDUCE_THREADS 256
#define GLMRT_PEER_REDUCE_MAX_ROWS 128

typedef struct glmrt_cuda_peer_reduce {
    int32_t rank;
    int32_t num_ranks;
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
} glmrt_cuda_peer_group;

glmrt_status glmrt_cuda_peer_reduce_open(glmrt_cuda_peer_group *group, int32_t **out_host_abort_flag,
                                         glmrt_error *error);
void glmrt_cuda_peer_reduce_release(glmrt_cuda_peer_reduce *peer);
int glmrt_cuda_peer_reduce_fits(const glmrt_cuda_peer_reduce *peer, int64_t count);
glmrt_status glmrt_cuda_peer_reduce_run(const glmrt_cuda_peer_reduce *peer, float *x, int64_t count,
                                        cudaStream_t stream, glmrt_error *error);

#endif
