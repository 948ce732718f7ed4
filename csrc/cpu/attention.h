#ifndef GLMRT_CPU_ATTENTION_H
#define GLMRT_CPU_ATTENTION_H

#include "backend.h"
#include "threadpool.h"

typedef struct glmrt_kv_cache {
    int32_t num_layers;
    int32_t num_pages;
    int32_t page_size;
    int32_t num_kv_heads;
    int32_t head_dim;
    int64_t slot_floats;
    int64_t layer_floats;
    float *keys;
    float *values;
} glmrt_kv_cache;

typedef struct glmrt_attention_args {
    const glmrt_kv_cache *cache;
    int32_t layer;
    const glmrt_step_batch *batch;
    int32_t num_heads;
    float scale;
    const float *q;
    float *out;
    float *scores;
    int64_t scores_stride;
} glmrt_attention_args;

glmrt_status glmrt_kv_cache_init(glmrt_kv_cache *cache, int32_t num_layers, int32_t num_pages, int32_t page_size,
                                 int32_t num_kv_heads, int32_t head_dim, glmrt_error *error);
void glmrt_kv_cache_free(glmrt_kv_cache *cache);
int64_t glmrt_kv_cache_bytes(const glmrt_kv_cache *cache);
int64_t glmrt_kv_cache_bytes_per_page(const glmrt_kv_cache *cache);
float *glmrt_kv_cache_key_slot(const glmrt_kv_cache *cache, int32_t layer, glmrt_page_id page, int32_t offset);
float *glmrt_kv_cache_value_slot(const glmrt_kv_cache *cache, int32_t layer, glmrt_page_id page, int32_t offset);
void glmrt_kv_cache_store_token(const glmrt_kv_cache *cache, int32_t layer, const glmrt_step_batch *batch,
                                int32_t token, const float *key, const float *value);
void glmrt_attention_run(glmrt_threadpool *pool, const glmrt_attention_args *args);

#endif
