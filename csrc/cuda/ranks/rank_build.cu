#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_check.cuh"
#include "device_math.cuh"
#include "model_layout.cuh"
#include "moe.cuh"
#include "rank_state.cuh"
#include "weight_random.cuh"
#include "weight_upload.cuh"

#define GLMRT_CUDA_STAGE_BYTES (32ll << 20)
#define GLMRT_CUDA_RESERVE_BYTES (512ll << 20)

void glmrt_cuda_rank_release(glmrt_cuda_state *st)
{
    if (st->stream != nullptr) {
        cudaStreamSynchronize(st->stream);
    }
    glmrt_cuda_decode_graphs_release(st);
    glmrt_cuda_peer_reduce_release(&st->peer);
    glmrt_cuda_ordered_gather_release(&st->ordered);
    cudaFree(st->weight_memory);
    cudaFree(st->workspace_memory);
    cudaFree(st->kv_memory);
    for (int32_t f = 0; f < GLMRT_CUDA_FLIGHTS; ++f) {
        glmrt_cuda_flight *flight = &st->flights[f];
        cudaFreeHost(flight->host_sampled);
        if (flight->started != nullptr) {
            cudaEventDestroy(flight->started);
        }
        if (flight->finished != nullptr) {
            cudaEventDestroy(flight->finished);
        }
    }
    if (st->shared_stream != nullptr) {
        cudaStreamSynchronize(st->shared_stream);
        cudaStreamDestroy(st->shared_stream);
    }
    if (st->shared_fork != nullptr) {
        cudaEventDestroy(st->shared_fork);
    }
    if (st->shared_join != nullptr) {
        cudaEventDestroy(st->shared_join);
    }
    if (st->stream != nullptr) {
        cudaStreamDestroy(st->stream);
    }
    glmrt_cuda_model_release(&st->model);
    glmrt_cuda_matmuls_release(st);
    st->weight_memory = nullptr;
    st->workspace_memory = nullptr;
    st->kv_memory = nullptr;
    memset(st->flights, 0, sizeof(st->flights));
    st->flight_head = 0;
    st->flights_queued = 0;
    st->stream = nullptr;
    st->shared_stream = nullptr;
    st->shared_fork = nullptr;
    st->shared_join = nullptr;
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
    const char *hint = st->rank.num_ranks == 1 && bytes > (int64_t)total_bytes / 2
                           ? "; num_devices (server: --num-devices) splits the model over several GPUs"
                           : "";
    return glmrt_error_set(st->error, result == cudaErrorMemoryAllocation ? GLMRT_ERR_OUT_OF_MEMORY : GLMRT_ERR_BACKEND,
                           "cudaMalloc of %lld bytes for %s on device %d failed: %s (free %lld of %lld bytes; weights %lld, workspace %lld)%s",
                           (long long)bytes, what, st->device, cudaGetErrorString(result), (long long)free_bytes,
                           (long long)total_bytes, (long long)st->weight_bytes, (long long)st->workspace_bytes, hint);
}

static glmrt_status glmrt_cuda_open_device(glmrt_cuda_state *st)
{
    int count = 0;
    GLMRT_CUDA_TRY(st->error, cudaGetDeviceCount(&count));
    if (st->device >= count) {
        return glmrt_error_set(st->error, GLMRT_ERR_INVALID_ARGUMENT,
                               "device %d (device_id %d + GPU %d of %d) is not among the %d visible CUDA devices",
                               st->device, st->engine->options.device_id, st->rank.index, st->rank.num_ranks, count);
    }
    GLMRT_CUDA_TRY(st->error, cudaSetDevice(st->device));
    cudaDeviceProp prop;
    GLMRT_CUDA_TRY(st->error, cudaGetDeviceProperties(&prop, st->device));
    st->num_sms = prop.multiProcessorCount;
    if (st->rank.index == 0) {
        glmrt_engine_info *info = &st->engine->info;
        snprintf(info->device_name, sizeof(info->device_name), "%.127s", prop.name);
    }
    GLMRT_CUDA_TRY(st->error, cudaStreamCreateWithFlags(&st->stream, cudaStreamNonBlocking));
    GLMRT_CUDA_TRY(st->error, cudaStreamCreateWithFlags(&st->shared_stream, cudaStreamNonBlocking));
    GLMRT_CUDA_TRY(st->error, cudaEventCreateWithFlags(&st->shared_fork, cudaEventDisableTiming));
    GLMRT_CUDA_TRY(st->error, cudaEventCreateWithFlags(&st->shared_join, cudaEventDisableTiming));
    return GLMRT_OK;
}

static glmrt_status glmrt_cuda_load_weights(glmrt_cuda_state *st)
{
    glmrt_engine *engine = st->engine;
    glmrt_cuda_arena arena;
    arena.base = nullptr;
    arena.used = 0;
    GLMRT_TRY(glmrt_cuda_model_layout(engine, &st->rank, &arena, &st->model, nullptr, st->error));
    st->weight_bytes = arena.used;
    GLMRT_TRY(glmrt_cuda_device_alloc(st, (void **)&st->weight_memory, st->weight_bytes, "weights"));
    arena.base = st->weight_memory;
    arena.used = 0;
    if (engine->options.random_weights) {
        glmrt_cuda_random_fill fill;
        fill.seed = engine->options.random_seed;
        fill.stream = st->stream;
        fill.num_sms = st->num_sms;
        glmrt_cuda_layout_visitor visitor = glmrt_cuda_random_visitor(&fill);
        GLMRT_TRY(glmrt_cuda_model_layout(engine, &st->rank, &arena, &st->model, &visitor, st->error));
        GLMRT_CUDA_TRY(st->error, cudaStreamSynchronize(st->stream));
        return GLMRT_OK;
    }
    glmrt_cuda_stager stager;
    glmrt_status status = glmrt_cuda_stager_init(&stager, GLMRT_CUDA_STAGE_BYTES, st->stream, st->error);
    if (status == GLMRT_OK) {
        glmrt_cuda_upload upload;
        upload.stager = &stager;
        glmrt_cuda_layout_visitor visitor = glmrt_cuda_upload_visitor(&upload);
        status = glmrt_cuda_model_layout(engine, &st->rank, &arena, &st->model, &visitor, st->error);
    }
    if (status == GLMRT_OK) {
        status = glmrt_cuda_stager_finish(&stager, st->error);
    }
    glmrt_cuda_stager_free(&stager);
    return status;
}

glmrt_status glmrt_cuda_rank_load(glmrt_cuda_state *st)
{
    glmrt_engine *engine = st->engine;
    GLMRT_TRY(glmrt_cuda_dims_derive(engine, &st->rank, &st->dims, st->error));
    GLMRT_TRY(glmrt_cuda_open_device(st));
    GLMRT_TRY(glmrt_cuda_attention_prepare(st->dims.head_dim, st->dims.group, st->error));
    st->owns_residual = st->rank.index == 0 && !st->dims.bf16_partials;
    st->rms_eps = engine->config.rms_norm_eps;
    st->attention_scale = 1.0f / sqrtf((float)st->dims.head_dim);
    GLMRT_TRY(glmrt_cuda_load_weights(st));
    return glmrt_cuda_matmuls_plan(st);
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
    st->split_policy.group = d->group;
}

static glmrt_status glmrt_cuda_sort_bytes(const glmrt_cuda_state *st, size_t *out)
{
    *out = 0;
    if (!st->dims.samples) {
        return GLMRT_OK;
    }
    return glmrt_cuda_sampler_sort_bytes(st->dims.max_batch, st->dims.vocab, out, st->error);
}

static int64_t glmrt_cuda_page_bytes(glmrt_cuda_state *st)
{
    const glmrt_cuda_dims *d = &st->dims;
    int64_t bytes = (int64_t)d->num_layers * 2 * d->num_kv_heads * st->engine->options.kv_page_size * d->head_dim * 2;
    return bytes > 0 ? bytes : 2;
}

glmrt_status glmrt_cuda_rank_page_capacity(glmrt_cuda_state *st, int32_t *out_pages)
{
    glmrt_engine *engine = st->engine;
    int32_t page_size = engine->options.kv_page_size;
    size_t sort_bytes = 0;
    GLMRT_TRY(glmrt_cuda_sort_bytes(st, &sort_bytes));
    st->kv_bytes_per_page = glmrt_cuda_page_bytes(st);
    glmrt_cuda_plan_capacity(st, 0);
    glmrt_cuda_workspace probe;
    int64_t fixed_workspace = 0;
    glmrt_cuda_workspace_layout(&st->dims, &st->capacity, sort_bytes, nullptr, &probe, &fixed_workspace);
    size_t free_bytes = 0;
    size_t total_bytes = 0;
    GLMRT_CUDA_TRY(st->error, cudaSetDevice(st->device));
    GLMRT_CUDA_TRY(st->error, cudaMemGetInfo(&free_bytes, &total_bytes));
    int64_t per_page = st->kv_bytes_per_page + ((int64_t)page_size + 1) * 4;
    int64_t available = (int64_t)free_bytes - fixed_workspace - GLMRT_CUDA_RESERVE_BYTES;
    int64_t pages = available > 0 ? (int64_t)((double)available * (double)engine->options.kv_memory_fraction) / per_page : 0;
    pages -= 1;
    if (pages > 0x3fffffffLL) {
        pages = 0x3fffffffLL;
    }
    if (pages < 1) {
        return glmrt_error_set(st->error, GLMRT_ERR_OUT_OF_MEMORY,
                               "no memory left on device %d for the KV cache: %lld bytes free after %lld bytes of weights, workspace needs %lld, a page needs %lld",
                               st->device, (long long)free_bytes, (long long)st->weight_bytes,
                               (long long)fixed_workspace, (long long)per_page);
    }
    *out_pages = (int32_t)pages;
    return GLMRT_OK;
}

glmrt_status glmrt_cuda_rank_allocate(glmrt_cuda_state *st, int32_t kv_pages)
{
    const glmrt_cuda_dims *d = &st->dims;
    GLMRT_CUDA_TRY(st->error, cudaSetDevice(st->device));
    size_t sort_bytes = 0;
    GLMRT_TRY(glmrt_cuda_sort_bytes(st, &sort_bytes));
    st->kv_bytes_per_page = glmrt_cuda_page_bytes(st);
    st->kv_num_pages = kv_pages;
    glmrt_cuda_plan_capacity(st, st->kv_num_pages);
    glmrt_cuda_workspace_layout(d, &st->capacity, sort_bytes, nullptr, &st->ws, &st->workspace_bytes);
    GLMRT_TRY(glmrt_cuda_device_alloc(st, (void **)&st->workspace_memory, st->workspace_bytes, "workspace"));
    glmrt_cuda_workspace_layout(d, &st->capacity, sort_bytes, st->workspace_memory, &st->ws, &st->workspace_bytes);
    GLMRT_CUDA_TRY(st->error, cudaMemsetAsync(st->workspace_memory, 0, (size_t)st->workspace_bytes, st->stream));
    st->kv_pad_page = st->kv_num_pages;
    st->kv_bytes = st->kv_bytes_per_page * ((int64_t)st->kv_num_pages + 1);
    GLMRT_TRY(glmrt_cuda_device_alloc(st, (void **)&st->kv_memory, st->kv_bytes, "the KV cache"));
    GLMRT_CUDA_TRY(st->error, cudaMemsetAsync(st->kv_memory, 0, (size_t)st->kv_bytes, st->stream));
    int32_t page_size = st->engine->options.kv_page_size;
    st->kv.base = st->kv_memory;
    st->kv.page_size = page_size;
    st->kv.num_kv_heads = d->num_kv_heads;
    st->kv.head_dim = d->head_dim;
    st->kv.head_elements = (int64_t)page_size * d->head_dim;
    st->kv.page_elements = 2 * (int64_t)d->num_kv_heads * st->kv.head_elements;
    st->kv.layer_elements = st->kv.page_elements * ((int64_t)st->kv_num_pages + 1);
    st->step_input_bytes = glmrt_cuda_step_capacity_bytes(&st->capacity);
    for (int32_t f = 0; f < GLMRT_CUDA_FLIGHTS; ++f) {
        glmrt_cuda_flight *flight = &st->flights[f];
        GLMRT_CUDA_TRY(st->error, cudaHostAlloc((void **)&flight->host_sampled,
                                                (size_t)d->max_batch * sizeof(int32_t),
                                                cudaHostAllocPortable | cudaHostAllocMapped));
        GLMRT_TRY(glmrt_cuda_host_mapped_check(flight->host_sampled, "sampled tokens", st->error));
        GLMRT_CUDA_TRY(st->error, cudaEventCreate(&flight->started));
        GLMRT_CUDA_TRY(st->error, cudaEventCreate(&flight->finished));
    }
    if (d->samples) {
        GLMRT_TRY(glmrt_cuda_sampler_init(&st->ws.sampler, st->stream, st->error));
    }
    GLMRT_TRY(glmrt_cuda_matmuls_bind(st));
    GLMRT_CUDA_TRY(st->error, cudaStreamSynchronize(st->stream));
    return GLMRT_OK;
}
