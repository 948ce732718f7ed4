#include <string.h>

#include "cuda_check.cuh"
#include "device_math.cuh"
#include "rank_state.cuh"

#define GLMRT_DECODE_GRAPH_WAVES 4

static int32_t glmrt_decode_bucket_after(int32_t bucket)
{
    if (bucket < 16) {
        return bucket * 2;
    }
    if (bucket < 128) {
        return bucket + 16;
    }
    if (bucket < 256) {
        return bucket + 32;
    }
    return bucket + 64;
}

static int32_t glmrt_decode_bucket_limit(const glmrt_cuda_state *st)
{
    int32_t limit = st->capacity.max_seqs;
    if (st->capacity.max_tokens < limit) {
        limit = st->capacity.max_tokens;
    }
    return limit;
}

int glmrt_cuda_decode_graphs_wanted(const glmrt_cuda_state *st)
{
    return st->engine->options.decode_graphs == GLMRT_DECODE_GRAPHS_DEFAULT;
}

int32_t glmrt_cuda_decode_graph_grid(const glmrt_cuda_state *st, int32_t bucket)
{
    int32_t heads = st->dims.num_kv_heads > 0 ? st->dims.num_kv_heads : 1;
    int32_t resident = glmrt_ceil_div(GLMRT_DECODE_GRAPH_WAVES * st->num_sms, heads);
    int32_t grid = 2 * bucket > resident ? 2 * bucket : resident;
    int32_t items = glmrt_cuda_step_bucket_items(&st->capacity, bucket);
    return grid < items ? grid : items;
}

int32_t glmrt_cuda_decode_graph_spread_items(const glmrt_cuda_state *st)
{
    return glmrt_cuda_attention_spread_items(st->dims.head_dim, st->dims.num_kv_heads, st->num_sms);
}

cudaGraphExec_t glmrt_cuda_decode_graph_of(const glmrt_cuda_state *st, int32_t bucket, int32_t decode_items)
{
    const int spread = decode_items <= glmrt_cuda_decode_graph_spread_items(st);
    cudaGraphExec_t block_graph = nullptr;
    for (int32_t i = 0; i < st->graphs.count; ++i) {
        if (st->graphs.buckets[i] != bucket) {
            continue;
        }
        if (st->graphs.spread[i] == spread) {
            return st->graphs.execs[i];
        }
        if (!st->graphs.spread[i]) {
            block_graph = st->graphs.execs[i];
        }
    }
    return block_graph;
}

int32_t glmrt_cuda_decode_graph_bucket(const glmrt_cuda_state *st, const glmrt_step_batch *batch)
{
    if (st->graphs.count == 0 || batch->num_tokens != batch->num_seqs || batch->num_samples != batch->num_tokens) {
        return 0;
    }
    for (int32_t s = 0; s < batch->num_seqs; ++s) {
        if (batch->seq_num_tokens[s] != 1) {
            return 0;
        }
    }
    for (int32_t i = 0; i < st->graphs.count; ++i) {
        if (st->graphs.buckets[i] >= batch->num_tokens) {
            return st->graphs.buckets[i];
        }
    }
    return 0;
}

glmrt_status glmrt_cuda_decode_graphs_pack_warm_up(const glmrt_cuda_state *st, uint8_t *host_inputs,
                                                   glmrt_cuda_step_counts *out_counts, glmrt_error *error)
{
    glmrt_step_batch empty;
    memset(&empty, 0, sizeof(empty));
    glmrt_cuda_step_padding padding;
    padding.bucket = glmrt_decode_bucket_limit(st);
    padding.pad_page = st->kv_pad_page;
    return glmrt_cuda_step_pack_padded(&empty, &st->capacity, &st->split_policy, st->kv.page_size, st->kv_num_pages,
                                       &padding, host_inputs, out_counts, error);
}

static glmrt_status glmrt_decode_graph_add(glmrt_cuda_state *st, const glmrt_cuda_step_counts *counts, int32_t rows,
                                            int32_t spread)
{
    if (st->graphs.count >= GLMRT_CUDA_MAX_DECODE_GRAPHS) {
        return GLMRT_OK;
    }
    cudaGraphExec_t exec = nullptr;
    const int32_t path = spread ? GLMRT_ATTENTION_DECODE_SPREAD : GLMRT_ATTENTION_DECODE_BLOCK;
    GLMRT_TRY(glmrt_cuda_forward_capture(st, counts, path, &exec));
    st->graphs.buckets[st->graphs.count] = rows;
    st->graphs.spread[st->graphs.count] = spread;
    st->graphs.execs[st->graphs.count] = exec;
    st->graphs.count += 1;
    return GLMRT_OK;
}

static glmrt_status glmrt_decode_graphs_capture_all(glmrt_cuda_state *st, const glmrt_cuda_step_counts *warm_up,
                                                    const uint8_t *host_inputs)
{
    const int32_t limit = glmrt_decode_bucket_limit(st);
    GLMRT_TRY(glmrt_cuda_forward_padded_warm_up(st, warm_up, host_inputs));
    for (int32_t spread = 0; spread < 2; ++spread) {
        const int32_t most_rows = spread ? glmrt_cuda_decode_graph_spread_items(st) : limit;
        for (int32_t bucket = 1; bucket > 0 && st->graphs.count < GLMRT_CUDA_MAX_DECODE_GRAPHS;
             bucket = bucket >= limit ? 0 : glmrt_decode_bucket_after(bucket)) {
            const int32_t rows = bucket < limit ? bucket : limit;
            if (rows > most_rows) {
                break;
            }
            glmrt_cuda_step_counts counts;
            GLMRT_TRY(glmrt_cuda_step_bucket_counts(&st->capacity, rows, &counts, st->error));
            GLMRT_TRY(glmrt_decode_graph_add(st, &counts, rows, spread));
        }
    }
    return GLMRT_OK;
}

glmrt_status glmrt_cuda_decode_graphs_capture(glmrt_cuda_state *st, const glmrt_cuda_step_counts *warm_up,
                                              const uint8_t *host_inputs)
{
    GLMRT_CUDA_TRY(st->error, cudaSetDevice(st->device));
    size_t free_before = 0;
    size_t free_after = 0;
    size_t total = 0;
    GLMRT_CUDA_TRY(st->error, cudaMemGetInfo(&free_before, &total));
    glmrt_status status = glmrt_decode_graphs_capture_all(st, warm_up, host_inputs);
    if (status != GLMRT_OK) {
        glmrt_cuda_decode_graphs_release(st);
        return status;
    }
    GLMRT_CUDA_TRY(st->error, cudaMemGetInfo(&free_after, &total));
    st->graphs.bytes = free_before > free_after ? (int64_t)(free_before - free_after) : 0;
    return GLMRT_OK;
}

void glmrt_cuda_decode_graphs_release(glmrt_cuda_state *st)
{
    for (int32_t i = 0; i < st->graphs.count; ++i) {
        if (st->graphs.execs[i] != nullptr) {
            cudaGraphExecDestroy(st->graphs.execs[i]);
        }
    }
    memset(&st->graphs, 0, sizeof(st->graphs));
}
