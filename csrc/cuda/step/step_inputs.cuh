#ifndef GLMRT_STEP_INPUTS_CUH
#define GLMRT_STEP_INPUTS_CUH

#include <stdint.h>

#include "attention.cuh"
#include "sampling.cuh"

extern "C" {
#include "engine.h"
}

typedef struct glmrt_cuda_step_capacity {
    int32_t max_tokens;
    int32_t max_seqs;
    int32_t max_samples;
    int64_t max_pages;
    int64_t max_history;
    int32_t max_decode_items;
    int32_t max_prefill_items;
    int32_t max_merges;
    int32_t max_partials;
    int32_t prefill_tokens_per_item;
} glmrt_cuda_step_capacity;

typedef struct glmrt_cuda_step_device_counts {
    int32_t num_decode_items;
    int32_t num_prefill_items;
    int32_t num_merges;
    int32_t reserved;
} glmrt_cuda_step_device_counts;

typedef struct glmrt_cuda_step_view {
    glmrt_cuda_step_device_counts *device_counts;
    int32_t *token_ids;
    int32_t *positions;
    int32_t *token_seq;
    int32_t *seq_page_begin;
    int32_t *page_ids;
    int32_t *sample_rows;
    glmrt_cuda_sample_params *sample_params;
    int32_t *history;
    glmrt_cuda_attention_item *decode_items;
    glmrt_cuda_attention_item *prefill_items;
    glmrt_cuda_attention_merge *merges;
} glmrt_cuda_step_view;

typedef struct glmrt_cuda_step_sections {
    int32_t tokens;
    int32_t seqs;
    int32_t samples;
    int32_t decode_items;
    int32_t prefill_items;
    int32_t merges;
    int64_t pages;
    int64_t history;
} glmrt_cuda_step_sections;

typedef struct glmrt_cuda_step_counts {
    int32_t num_tokens;
    int32_t num_seqs;
    int32_t num_samples;
    int64_t num_pages;
    int64_t num_history;
    int32_t num_decode_items;
    int32_t num_prefill_items;
    int32_t num_merges;
    int32_t num_partials;
    int32_t needs_sort;
    int32_t bucket;
    glmrt_cuda_step_sections layout;
    int64_t bytes;
    int64_t history_offset;
    int64_t history_bytes;
} glmrt_cuda_step_counts;

typedef struct glmrt_cuda_step_padding {
    int32_t bucket;
    int32_t pad_page;
} glmrt_cuda_step_padding;

typedef struct glmrt_cuda_split_policy {
    int32_t keys_per_split;
    int32_t max_splits;
    int32_t group;
} glmrt_cuda_split_policy;


int64_t glmrt_cuda_step_capacity_bytes(const glmrt_cuda_step_capacity *capacity);
int32_t glmrt_cuda_step_bucket_items(const glmrt_cuda_step_capacity *capacity, int32_t bucket);
int32_t glmrt_cuda_step_device_decode_items(const glmrt_cuda_step_counts *counts);
glmrt_status glmrt_cuda_step_bucket_counts(const glmrt_cuda_step_capacity *capacity, int32_t bucket,
                                           glmrt_cuda_step_counts *counts, glmrt_error *error);
glmrt_status glmrt_cuda_step_pack_padded(const glmrt_step_batch *batch, const glmrt_cuda_step_capacity *capacity,
                                         const glmrt_cuda_split_policy *policy, int32_t page_size,
                                         int32_t num_pool_pages, const glmrt_cuda_step_padding *padding,
                                         uint8_t *host, glmrt_cuda_step_counts *counts, glmrt_error *error);
glmrt_status glmrt_cuda_step_pack(const glmrt_step_batch *batch, const glmrt_cuda_step_capacity *capacity,
                                  const glmrt_cuda_split_policy *policy, int32_t page_size, int32_t num_pool_pages,
                                  uint8_t *host, glmrt_cuda_step_counts *counts, glmrt_error *error);
void glmrt_cuda_step_view_at(const glmrt_cuda_step_counts *counts, uint8_t *base, glmrt_cuda_step_view *view);
glmrt_status glmrt_cuda_step_fetch(uint8_t *device, const uint8_t *host_mapped, int64_t bytes, cudaStream_t stream,
                                   glmrt_error *error);
glmrt_status glmrt_cuda_host_mapped_check(const void *host, const char *what, glmrt_error *error);

#endif
