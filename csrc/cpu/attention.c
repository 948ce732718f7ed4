#include "attention.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "linear.h"

glmrt_status glmrt_kv_cache_init(glmrt_kv_cache *cache, int32_t num_layers, int32_t num_pages, int32_t page_size,
                                 int32_t num_kv_heads, int32_t head_dim, glmrt_error *error)
{
    memset(cache, 0, sizeof(*cache));
    if (num_layers <= 0 || num_pages <= 0 || page_size <= 0 || num_kv_heads <= 0 || head_dim <= 0) {
        return glmrt_error_set(error, GLMRT_ERR_INVALID_ARGUMENT,
                               "kv cache: bad shape layers %d pages %d page_size %d kv_heads %d head_dim %d",
                               (int)num_layers, (int)num_pages, (int)page_size, (int)num_kv_heads, (int)head_dim);
    }
    cache->num_layers = num_layers;
    cache->num_pages = num_pages;
    cache->page_size = page_size;
    cache->num_kv_heads = num_kv_heads;
    cache->head_dim = head_dim;
    cache->slot_floats = (int64_t)num_kv_heads * head_dim;
    cache->layer_floats = (int64_t)num_pages * page_size * cache->slot_floats;
    size_t count = (size_t)cache->layer_floats * (size_t)num_layers;
    cache->keys = calloc(count, sizeof(float));
    cache->values = calloc(count, sizeof(float));
    if (cache->keys == NULL || cache->values == NULL) {
        glmrt_kv_cache_free(cache);
        return glmrt_error_set(error, GLMRT_ERR_OUT_OF_MEMORY, "kv cache: cannot allocate 2 x %zu bytes",
                               count * sizeof(float));
    }
    return GLMRT_OK;
}

void glmrt_kv_cache_free(glmrt_kv_cache *cache)
{
    if (cache == NULL) {
        return;
    }
    free(cache->keys);
    free(cache->values);
    cache->keys = NULL;
    cache->values = NULL;
}

int64_t glmrt_kv_cache_bytes(const glmrt_kv_cache *cache)
{
    return 2 * cache->layer_floats * cache->num_layers * (int64_t)sizeof(float);
}

int64_t glmrt_kv_cache_bytes_per_page(const glmrt_kv_cache *cache)
{
    return 2 * (int64_t)cache->page_size * cache->slot_floats * cache->num_layers * (int64_t)sizeof(float);
}

static int64_t kv_cache_slot_offset(const glmrt_kv_cache *cache, int32_t layer, glmrt_page_id page,
                                    int32_t offset)
{
    return (int64_t)layer * cache->layer_floats + ((int64_t)page * cache->page_size + offset) * cache->slot_floats;
}

float *glmrt_kv_cache_key_slot(const glmrt_kv_cache *cache, int32_t layer, glmrt_page_id page, int32_t offset)
{
    return cache->keys + kv_cache_slot_offset(cache, layer, page, offset);
}

float *glmrt_kv_cache_value_slot(const glmrt_kv_cache *cache, int32_t layer, glmrt_page_id page, int32_t offset)
{
    return cache->values + kv_cache_slot_offset(cache, layer, page, offset);
}

void glmrt_kv_cache_store_token(const glmrt_kv_cache *cache, int32_t layer, const glmrt_step_batch *batch,
                                int32_t token, const float *key, const float *value)
{
    int32_t seq = batch->token_seq[token];
    glmrt_pos position = batch->positions[token];
    glmrt_page_id page = batch->seq_page_tables[seq][position / cache->page_size];
    int32_t offset = position % cache->page_size;
    size_t bytes = (size_t)cache->slot_floats * sizeof(float);
    memcpy(glmrt_kv_cache_key_slot(cache, layer, page, offset), key, bytes);
    memcpy(glmrt_kv_cache_value_slot(cache, layer, page, offset), value, bytes);
}

static float attention_softmax(float *scores, int32_t count)
{
    float max_score = scores[0];
    for (int32_t j = 1; j < count; ++j) {
        max_score = scores[j] > max_score ? scores[j] : max_score;
    }
    float sum = 0.0f;
    for (int32_t j = 0; j < count; ++j) {
        scores[j] = expf(scores[j] - max_score);
        sum += scores[j];
    }
    return sum;
}

static void attention_task(void *context, int32_t task, int32_t thread_index)
{
    const glmrt_attention_args *args = context;
    const glmrt_kv_cache *cache = args->cache;
    const glmrt_step_batch *batch = args->batch;
    int32_t head_dim = cache->head_dim;
    int32_t token = task / args->num_heads;
    int32_t head = task % args->num_heads;
    int32_t kv_head = head / (args->num_heads / cache->num_kv_heads);
    const glmrt_page_id *pages = batch->seq_page_tables[batch->token_seq[token]];
    int32_t count = batch->positions[token] + 1;
    const float *query = args->q + ((int64_t)token * args->num_heads + head) * head_dim;
    float *scores = args->scores + (int64_t)thread_index * args->scores_stride;
    for (int32_t j = 0; j < count; ++j) {
        const float *key = glmrt_kv_cache_key_slot(cache, args->layer, pages[j / cache->page_size],
                                                   j % cache->page_size) +
                           (int64_t)kv_head * head_dim;
        scores[j] = glmrt_dot(query, key, head_dim) * args->scale;
    }
    float sum = attention_softmax(scores, count);
    float *out = args->out + ((int64_t)token * args->num_heads + head) * head_dim;
    for (int32_t d = 0; d < head_dim; ++d) {
        out[d] = 0.0f;
    }
    for (int32_t j = 0; j < count; ++j) {
        float weight = scores[j] / sum;
        const float *value = glmrt_kv_cache_value_slot(cache, args->layer, pages[j / cache->page_size],
                                                       j % cache->page_size) +
                             (int64_t)kv_head * head_dim;
        for (int32_t d = 0; d < head_dim; ++d) {
            out[d] = fmaf(weight, value[d], out[d]);
        }
    }
}

void glmrt_attention_run(glmrt_threadpool *pool, const glmrt_attention_args *args)
{
    const glmrt_step_batch *batch = args->batch;
    int64_t attended = 0;
    for (int32_t t = 0; t < batch->num_tokens; ++t) {
        attended += batch->positions[t] + 1;
    }
    int64_t work_units = attended * args->num_heads * args->cache->head_dim * 3;
    glmrt_threadpool_run_sized(pool, batch->num_tokens * args->num_heads, attention_task, (void *)args, work_units);
}
