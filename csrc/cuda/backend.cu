#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend_state.cuh"
#include "cuda_backend.h"
#include "cuda_check.cuh"
#include "device_math.cuh"
#include "model_layout.cuh"
#include "weight_random.cuh"
#include "weight_upload.cuh"

#define GLMRT_CUDA_STAGE_BYTES (32ll << 20)
#define GLMRT_CUDA_RESERVE_BYTES (512ll << 20)

static void glmrt_cuda_state_release(glmrt_cuda_state *st)
{
    if (st->stream != nullptr) {
        cudaStreamSynchronize(st->stream);
    }
    if (st->weight_memory != nullptr) {
        cudaFree(st->weight_memory);
    }
    if (st->workspace_memory != nullptr) {
        cudaFree(st->workspace_memory);
    }
    if (st->kv_memory != nullptr) {
        cudaFree(st->kv_memory);
    }
    if (st->host_step_inputs != nullptr) {
        cudaFreeHost(st->host_step_inputs);
    }
    if (st->host_sampled != nullptr) {
        cudaFreeHost(st->host_sampled);
    }
    if (st->stream != nullptr) {
        cudaStreamDestroy(st->stream);
    }
    glmrt_cuda_model_release(&st->model);
    st->weight_memory = nullptr;
    st->workspace_memory = nullptr;
    st->kv_memory = nullptr;
    st->host_step_inputs = nullptr;
    st->host_sampled = nullptr;
    st->stream = nullptr;
}

static void glmrt_cuda_destroy(void *state)
{
    glmrt_cuda_state *st = (glmrt_cuda_state *)state;
    if (st == nullptr) {
        return;
    }
    cudaSetDevice(st->device);
    glmrt_cuda_state_release(st);
    free(st);
}

static glmrt_status glmrt_cuda_device_alloc(glmrt_cuda_state *st, void **out, int64_t bytes, const char *what)
{
    cudaError_t result = cudaMalloc(out, (size_t)bytes);
    if (result == cudaSuccess) {
        return GLMRT_OK;
    }
    cudaGetLastError();
    size_t free_bytes = 0;
    size_t total_bytes = 0;
    cudaMemGetInfo(&free_bytes, &total_bytes);
    *out = nullptr;
    return glmrt_error_set(st->error, result == cudaErrorMemoryAllocation ? GLMRT_ERR_OUT_OF_MEMORY : GLMRT_ERR_BACKEND,
                           "cudaMalloc of %lld bytes for %s on device %d failed: %s (free %lld of %lld bytes; weights %lld, workspace %lld)",
                           (long long)bytes, what, st->device, cudaGetErrorString(result), (long long)free_bytes,
                           (long long)total_bytes, (long long)st->weight_bytes, (long long)st->workspace_bytes);
}

static glmrt_status glmrt_cuda_open_device(glmrt_cuda_state *st)
{
    int count = 0;
    GLMRT_CUDA_TRY(st->error, cudaGetDeviceCount(&count));
    if (st->device >= count) {
        return glmrt_error_set(st->error, GLMRT_ERR_INVALID_ARGUMENT, "device_id %d, but %d CUDA devices are visible",
                               st->device, count);
    }
    GLMRT_CUDA_TRY(st->error, cudaSetDevice(st->device));
    cudaDeviceProp prop;
    GLMRT_CUDA_TRY(st->error, cudaGetDeviceProperties(&prop, st->device));
    st->num_sms = prop.multiProcessorCount;
    glmrt_engine_info *info = &st->engine->info;
    snprintf(info->device_name, sizeof(info->device_name), "%.127s", prop.name);
    GLMRT_CUDA_TRY(st->error, cudaStreamCreateWithFlags(&st->stream, cudaStreamNonBlocking));
    return GLMRT_OK;
}

static glmrt_status glmrt_cuda_load_weights(glmrt_cuda_state *st)
{
    glmrt_engine *engine = st->engine;
    glmrt_cuda_arena arena;
    arena.base = nullptr;
    arena.used = 0;
    GLMRT_TRY(glmrt_cuda_model_layout(engine, &st->shard, &arena, &st->model, nullptr, st->error));
    st->weight_bytes = arena.used;
    GLMRT_TRY(glmrt_cuda_device_alloc(st, (void **)&st->weight_memory, st->weight_bytes, "weights"));
    arena.base = st->weight_memory;
    arena.used = 0;
    if (engine->options.random_weights) {
        glmrt_cuda_random_fill fill;
        fill.seed = engine->options.random_seed;
        fill.next_tensor = 0;
        fill.stream = st->stream;
        fill.num_sms = st->num_sms;
        glmrt_cuda_layout_visitor visitor = glmrt_cuda_random_visitor(&fill);
        GLMRT_TRY(glmrt_cuda_model_layout(engine, &st->shard, &arena, &st->model, &visitor, st->error));
        GLMRT_CUDA_TRY(st->error, cudaStreamSynchronize(st->stream));
        return GLMRT_OK;
    }
    glmrt_cuda_stager stager;
    glmrt_status status = glmrt_cuda_stager_init(&stager, GLMRT_CUDA_STAGE_BYTES, st->stream, st->error);
    if (status == GLMRT_OK) {
        glmrt_cuda_upload upload;
        upload.stager = &stager;
        glmrt_cuda_layout_visitor visitor = glmrt_cuda_upload_visitor(&upload);
        status = glmrt_cuda_model_layout(engine, &st->shard, &arena, &st->model, &visitor, st->error);
    }
    if (status == GLMRT_OK) {
        status = glmrt_cuda_stager_finish(&stager, st->error);
    }
    glmrt_cuda_stager_free(&stager);
    return status;
}

static void glmrt_cuda_plan_capacity(glmrt_cuda_state *st, int32_t kv_pages)
{
    const glmrt_cuda_dims *d = &st->dims;
    glmrt_cuda_step_capacity *c = &st->capacity;
    int32_t page_size = st->engine->options.kv_page_size;
    c->max_tokens = d->max_tokens;
    c->max_seqs = d->max_batch;
    c->max_samples = d->max_batch;
    c->max_pages = (int64_t)kv_pages + d->max_batch;
    c->max_history = (int64_t)kv_pages * page_size + d->max_batch;
    c->max_partials = d->max_partials;
    c->max_decode_items = d->max_batch + d->max_partials;
    c->prefill_tokens_per_item = glmrt_cuda_attention_prefill_tokens(d->head_dim);
    c->max_prefill_items = glmrt_ceil_div(d->max_tokens, c->prefill_tokens_per_item) + d->max_batch;
    c->max_merges = d->max_batch;
    st->split_policy.keys_per_split = GLMRT_ATTENTION_KEYS_PER_SPLIT;
    st->split_policy.max_splits = GLMRT_ATTENTION_MAX_SPLITS;
}

static glmrt_status glmrt_cuda_size_kv(glmrt_cuda_state *st, size_t sort_bytes)
{
    glmrt_engine *engine = st->engine;
    const glmrt_cuda_dims *d = &st->dims;
    int32_t page_size = engine->options.kv_page_size;
    st->kv_bytes_per_page = (int64_t)d->num_layers * 2 * d->num_kv_heads * page_size * d->head_dim * 2;
    if (st->kv_bytes_per_page <= 0) {
        st->kv_bytes_per_page = 2;
    }
    if (engine->options.kv_num_pages > 0) {
        st->kv_num_pages = engine->options.kv_num_pages;
        return GLMRT_OK;
    }
    glmrt_cuda_plan_capacity(st, 0);
    glmrt_cuda_workspace probe;
    int64_t fixed_workspace = 0;
    glmrt_cuda_workspace_layout(d, &st->capacity, sort_bytes, nullptr, &probe, &fixed_workspace);
    size_t free_bytes = 0;
    size_t total_bytes = 0;
    GLMRT_CUDA_TRY(st->error, cudaMemGetInfo(&free_bytes, &total_bytes));
    int64_t per_page = st->kv_bytes_per_page + ((int64_t)page_size + 1) * 4;
    int64_t available = (int64_t)free_bytes - fixed_workspace - GLMRT_CUDA_RESERVE_BYTES;
    int64_t pages = available > 0 ? (int64_t)((double)available * (double)engine->options.kv_memory_fraction) / per_page : 0;
    if (pages > 0x3fffffffLL) {
        pages = 0x3fffffffLL;
    }
    if (pages < 1) {
        return glmrt_error_set(st->error, GLMRT_ERR_OUT_OF_MEMORY,
                               "no device memory left for the KV cache: %lld bytes free after %lld bytes of weights, workspace needs %lld, a page needs %lld",
                               (long long)free_bytes, (long long)st->weight_bytes, (long long)fixed_workspace,
                               (long long)per_page);
    }
    st->kv_num_pages = (int32_t)pages;
    engine->options.kv_num_pages = st->kv_num_pages;
    return GLMRT_OK;
}

static glmrt_status glmrt_cuda_allocate_runtime(glmrt_cuda_state *st)
{
    const glmrt_cuda_dims *d = &st->dims;
    size_t sort_bytes = 0;
    GLMRT_TRY(glmrt_cuda_sampler_sort_bytes(d->max_batch, d->vocab_local, &sort_bytes, st->error));
    GLMRT_TRY(glmrt_cuda_size_kv(st, sort_bytes));
    glmrt_cuda_plan_capacity(st, st->kv_num_pages);
    glmrt_cuda_workspace_layout(d, &st->capacity, sort_bytes, nullptr, &st->ws, &st->workspace_bytes);
    GLMRT_TRY(glmrt_cuda_device_alloc(st, (void **)&st->workspace_memory, st->workspace_bytes, "workspace"));
    glmrt_cuda_workspace_layout(d, &st->capacity, sort_bytes, st->workspace_memory, &st->ws, &st->workspace_bytes);
    st->kv_bytes = st->kv_bytes_per_page * st->kv_num_pages;
    GLMRT_TRY(glmrt_cuda_device_alloc(st, (void **)&st->kv_memory, st->kv_bytes, "the KV cache"));
    int32_t page_size = st->engine->options.kv_page_size;
    st->kv.base = st->kv_memory;
    st->kv.page_size = page_size;
    st->kv.num_kv_heads = d->num_kv_heads;
    st->kv.head_dim = d->head_dim;
    st->kv.head_elements = (int64_t)page_size * d->head_dim;
    st->kv.page_elements = 2 * (int64_t)d->num_kv_heads * st->kv.head_elements;
    st->kv.layer_elements = st->kv.page_elements * st->kv_num_pages;
    st->step_input_bytes = glmrt_cuda_step_capacity_bytes(&st->capacity);
    GLMRT_CUDA_TRY(st->error, cudaHostAlloc((void **)&st->host_step_inputs, (size_t)st->step_input_bytes,
                                            cudaHostAllocDefault));
    GLMRT_CUDA_TRY(st->error, cudaHostAlloc((void **)&st->host_sampled, (size_t)d->max_batch * sizeof(int32_t),
                                            cudaHostAllocDefault));
    GLMRT_TRY(glmrt_cuda_sampler_init(&st->ws.sampler, st->stream, st->error));
    GLMRT_CUDA_TRY(st->error, cudaStreamSynchronize(st->stream));
    return GLMRT_OK;
}

static void glmrt_cuda_fill_info(glmrt_cuda_state *st)
{
    glmrt_engine_info *info = &st->engine->info;
    info->weight_bytes = st->weight_bytes;
    info->kv_cache_bytes = st->kv_bytes;
    info->workspace_bytes = st->workspace_bytes + 2 * st->step_input_bytes;
    info->kv_bytes_per_page = st->kv_bytes_per_page;
    info->num_devices = st->plan.num_ranks;
    info->num_threads = 0;
}

static glmrt_status glmrt_cuda_build(glmrt_cuda_state *st)
{
    glmrt_engine *engine = st->engine;
    GLMRT_TRY(glmrt_cuda_shard_plan_build(&engine->config, 1, &st->plan, st->error));
    st->shard = st->plan.shards[0];
    GLMRT_TRY(glmrt_cuda_dims_derive(engine, &st->shard, &st->dims, st->error));
    GLMRT_TRY(glmrt_cuda_open_device(st));
    GLMRT_TRY(glmrt_cuda_attention_prepare(st->dims.head_dim, st->dims.group, st->error));
    st->rms_eps = engine->config.rms_norm_eps;
    st->attention_scale = 1.0f / sqrtf((float)st->dims.head_dim);
    GLMRT_TRY(glmrt_cuda_load_weights(st));
    GLMRT_TRY(glmrt_cuda_allocate_runtime(st));
    glmrt_cuda_fill_info(st);
    return GLMRT_OK;
}

static glmrt_status glmrt_cuda_create(glmrt_engine *engine, void **out_state)
{
    if (engine == nullptr || out_state == nullptr) {
        return GLMRT_ERR_INVALID_ARGUMENT;
    }
    *out_state = nullptr;
    glmrt_cuda_state *st = (glmrt_cuda_state *)calloc(1, sizeof(glmrt_cuda_state));
    if (st == nullptr) {
        return glmrt_error_set(&engine->error, GLMRT_ERR_OUT_OF_MEMORY, "cannot allocate the CUDA backend state");
    }
    st->engine = engine;
    st->error = &engine->error;
    st->device = engine->options.device_id;
    glmrt_status status = glmrt_cuda_build(st);
    if (status != GLMRT_OK) {
        glmrt_cuda_destroy(st);
        return status;
    }
    *out_state = st;
    return GLMRT_OK;
}

static glmrt_status glmrt_cuda_forward_op(void *state, const glmrt_step_batch *batch, float *out_logits,
                                          glmrt_token *out_sampled)
{
    glmrt_cuda_state *st = (glmrt_cuda_state *)state;
    if (st == nullptr) {
        return GLMRT_ERR_INVALID_ARGUMENT;
    }
    glmrt_status status = glmrt_cuda_forward(st, batch, out_logits, out_sampled);
    if (status != GLMRT_OK && st->stream != nullptr) {
        cudaStreamSynchronize(st->stream);
        cudaGetLastError();
    }
    return status;
}

extern "C" const glmrt_backend_ops glmrt_cuda_backend_ops = {
    "cuda",
    glmrt_cuda_create,
    glmrt_cuda_destroy,
    glmrt_cuda_forward_op,
};
