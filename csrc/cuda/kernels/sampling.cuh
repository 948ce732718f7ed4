#ifndef GLMRT_CUDA_SAMPLING_CUH
#define GLMRT_CUDA_SAMPLING_CUH

#include <cuda_runtime.h>
#include <stdint.h>

extern "C" {
#include "error.h"
}

typedef struct glmrt_cuda_sample_params {
    double uniform;
    float temperature;
    float top_p;
    float min_p;
    float repetition_penalty;
    float frequency_penalty;
    float presence_penalty;
    int32_t top_k;
    int32_t history_begin;
    int32_t num_history;
    int32_t num_prompt;
} glmrt_cuda_sample_params;

typedef struct glmrt_cuda_sampler {
    int32_t max_rows;
    int32_t vocab_size;
    float *values;
    int32_t *counts;
    uint32_t *keys_in;
    uint32_t *keys_out;
    int32_t *ids_in;
    int32_t *ids_out;
    int32_t *row_offsets;
    unsigned long long *argmax_keys;
    uint32_t *argmax_arrivals;
    void *sort_temp;
    size_t sort_temp_bytes;
} glmrt_cuda_sampler;

typedef struct glmrt_cuda_sample_args {
    const float *logits;
    int32_t num_rows;
    const glmrt_cuda_sample_params *params;
    const int32_t *history;
    int32_t needs_sort;
    int32_t *out_tokens;
    int32_t *host_tokens;
    int32_t logits_only;
} glmrt_cuda_sample_args;

glmrt_status glmrt_cuda_sampler_sort_bytes(int32_t max_rows, int32_t vocab_size, size_t *out_bytes,
                                           glmrt_error *error);
int64_t glmrt_cuda_sampler_bytes(int32_t max_rows, int32_t vocab_size, size_t sort_bytes);
glmrt_status glmrt_cuda_sampler_init(glmrt_cuda_sampler *sampler, cudaStream_t stream, glmrt_error *error);
glmrt_status glmrt_cuda_sample(glmrt_cuda_sampler *sampler, const glmrt_cuda_sample_args *args,
                               cudaStream_t stream, glmrt_error *error);

#endif
