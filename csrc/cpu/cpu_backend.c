#include "cpu_backend.h"

#include <stdlib.h>
#include <string.h>

#include "norm_rope.h"

#define CPU_ARENA_MAX_ENTRIES 32
#define CPU_ARENA_ALIGN 64

typedef struct cpu_arena {
    int32_t count;
    void **slots[CPU_ARENA_MAX_ENTRIES];
    int64_t bytes[CPU_ARENA_MAX_ENTRIES];
} cpu_arena;

static void cpu_arena_add(cpu_arena *arena, void *slot, int64_t count, int64_t element_size)
{
    if (arena->count < CPU_ARENA_MAX_ENTRIES) {
        arena->slots[arena->count] = (void **)slot;
        arena->bytes[arena->count] = (count > 0 ? count : 1) * element_size;
        arena->count += 1;
    }
}

static int64_t cpu_arena_total(const cpu_arena *arena)
{
    int64_t total = 0;
    for (int32_t i = 0; i < arena->count; ++i) {
        total += (arena->bytes[i] + CPU_ARENA_ALIGN - 1) / CPU_ARENA_ALIGN * CPU_ARENA_ALIGN;
    }
    return total;
}

static void cpu_arena_assign(const cpu_arena *arena, uint8_t *base)
{
    for (int32_t i = 0; i < arena->count; ++i) {
        *arena->slots[i] = base;
        base += (arena->bytes[i] + CPU_ARENA_ALIGN - 1) / CPU_ARENA_ALIGN * CPU_ARENA_ALIGN;
    }
}

static glmrt_status cpu_arena_alloc(int64_t total, void **out_storage, const char *what, glmrt_error *error)
{
    void *storage = NULL;
    if (total <= 0 || posix_memalign(&storage, CPU_ARENA_ALIGN, (size_t)total) != 0) {
        return glmrt_error_set(error, GLMRT_ERR_OUT_OF_MEMORY, "cpu backend: cannot allocate %lld bytes of %s",
                               (long long)total, what);
    }
    *out_storage = storage;
    return GLMRT_OK;
}

static int32_t cpu_max(int32_t a, int32_t b)
{
    return a > b ? a : b;
}

static glmrt_status cpu_allocate_activations(glmrt_cpu_backend *backend, glmrt_error *error)
{
    const glmrt_cpu_dims *d = &backend->dims;
    glmrt_cpu_activations *a = &backend->act;
    int64_t t = d->max_tokens;
    int64_t pairs = t * d->top_k;
    cpu_arena arena = {0};
    cpu_arena_add(&arena, &a->hidden, t * d->hidden, sizeof(float));
    cpu_arena_add(&arena, &a->normed, t * d->hidden, sizeof(float));
    cpu_arena_add(&arena, &a->proj, t * d->hidden, sizeof(float));
    cpu_arena_add(&arena, &a->q, t * d->q_dim, sizeof(float));
    cpu_arena_add(&arena, &a->k, t * d->kv_dim, sizeof(float));
    cpu_arena_add(&arena, &a->v, t * d->kv_dim, sizeof(float));
    cpu_arena_add(&arena, &a->attn, t * d->q_dim, sizeof(float));
    cpu_arena_add(&arena, &a->mlp_act, t * d->mlp_width, sizeof(float));
    cpu_arena_add(&arena, &a->rope_cos, t * d->rotary_half, sizeof(float));
    cpu_arena_add(&arena, &a->rope_sin, t * d->rotary_half, sizeof(float));
    cpu_arena_add(&arena, &a->router_logits, t * d->num_experts, sizeof(float));
    cpu_arena_add(&arena, &a->route_experts, pairs, sizeof(int32_t));
    cpu_arena_add(&arena, &a->route_weights, pairs, sizeof(float));
    cpu_arena_add(&arena, &a->expert_act, pairs * d->expert_width, sizeof(float));
    cpu_arena_add(&arena, &a->expert_out, pairs * d->hidden, sizeof(float));
    cpu_arena_add(&arena, &a->final_hidden, (int64_t)d->max_batch * d->hidden, sizeof(float));
    cpu_arena_add(&arena, &a->logits, (int64_t)d->max_batch * d->vocab, sizeof(float));
    cpu_arena_add(&arena, &a->inv_freq, d->rotary_half, sizeof(float));
    cpu_arena_add(&arena, &a->native_rows, backend->native_matmuls ? t * d->hidden : 1, sizeof(float));
    cpu_arena_add(&arena, &a->jobs, d->job_capacity, sizeof(glmrt_matmul_job));
    cpu_arena_add(&arena, &a->pairs.expert_counts, d->num_experts, sizeof(int32_t));
    cpu_arena_add(&arena, &a->pairs.expert_offsets, (int64_t)d->num_experts + 1, sizeof(int32_t));
    cpu_arena_add(&arena, &a->pairs.pair_token, pairs, sizeof(int32_t));
    cpu_arena_add(&arena, &a->pairs.pair_out_row, pairs, sizeof(int32_t));
    int64_t total = cpu_arena_total(&arena);
    glmrt_status status = cpu_arena_alloc(total, &backend->activation_storage, "activations", error);
    if (status != GLMRT_OK) {
        return status;
    }
    cpu_arena_assign(&arena, backend->activation_storage);
    a->pairs.num_experts = d->num_experts;
    backend->workspace_bytes += total;
    glmrt_rope_inv_freq_fill(backend->config.rope_theta, 2 * d->rotary_half, a->inv_freq);
    return GLMRT_OK;
}

static void cpu_thread_layout(const glmrt_cpu_dims *d, glmrt_cpu_thread_scratch *s, cpu_arena *arena)
{
    memset(arena, 0, sizeof(*arena));
    cpu_arena_add(arena, &s->scores, d->max_context, sizeof(float));
    cpu_arena_add(arena, &s->router.scores, d->num_experts, sizeof(float));
    cpu_arena_add(arena, &s->router.choice, d->num_experts, sizeof(float));
    cpu_arena_add(arena, &s->router.group_scores, d->num_groups, sizeof(float));
    cpu_arena_add(arena, &s->router.group_kept, d->num_groups, sizeof(uint8_t));
    cpu_arena_add(arena, &s->router.expert_taken, d->num_experts, sizeof(uint8_t));
}

static glmrt_status cpu_allocate_threads(glmrt_cpu_backend *backend, glmrt_error *error)
{
    const glmrt_cpu_dims *d = &backend->dims;
    backend->threads = calloc((size_t)backend->num_threads, sizeof(*backend->threads));
    if (backend->threads == NULL) {
        return glmrt_error_set(error, GLMRT_ERR_OUT_OF_MEMORY, "cpu backend: cannot allocate thread scratch");
    }
    cpu_arena arena;
    cpu_thread_layout(d, &backend->threads[0], &arena);
    int64_t per_thread = cpu_arena_total(&arena);
    glmrt_status status = cpu_arena_alloc(per_thread * backend->num_threads, &backend->thread_storage,
                                          "thread scratch", error);
    if (status != GLMRT_OK) {
        return status;
    }
    backend->workspace_bytes += per_thread * backend->num_threads;
    backend->thread_stride_bytes = per_thread;
    for (int32_t i = 0; i < backend->num_threads; ++i) {
        cpu_thread_layout(d, &backend->threads[i], &arena);
        cpu_arena_assign(&arena, (uint8_t *)backend->thread_storage + per_thread * i);
        status = glmrt_sampler_scratch_init(&backend->threads[i].sampler, d->vocab, error);
        if (status != GLMRT_OK) {
            return status;
        }
        backend->workspace_bytes += (int64_t)d->vocab * 4 * (int64_t)sizeof(float);
    }
    return GLMRT_OK;
}

static glmrt_status cpu_derive_dims(glmrt_cpu_backend *backend, const glmrt_engine *engine, glmrt_error *error)
{
    const glmrt_model_config *c = &backend->config;
    glmrt_cpu_dims *d = &backend->dims;
    const glmrt_engine_options *o = &engine->options;
    d->num_layers = c->num_hidden_layers;
    d->hidden = c->hidden_size;
    d->vocab = c->vocab_size;
    d->num_heads = c->num_attention_heads;
    d->num_kv_heads = c->num_key_value_heads;
    d->head_dim = c->head_dim;
    d->q_dim = d->num_heads * d->head_dim;
    d->kv_dim = d->num_kv_heads * d->head_dim;
    d->rotary_half = glmrt_rope_rotary_dim(d->head_dim, c->partial_rotary_factor) / 2;
    d->has_moe = c->first_k_dense_replace < c->num_hidden_layers;
    int32_t has_dense = c->first_k_dense_replace > 0;
    d->expert_width = d->has_moe ? c->moe_intermediate_size : 0;
    d->shared_width = d->has_moe ? c->moe_intermediate_size * c->n_shared_experts : 0;
    d->num_experts = d->has_moe ? c->n_routed_experts : 0;
    d->top_k = d->has_moe ? c->num_experts_per_tok : 0;
    d->num_groups = d->has_moe ? (c->n_group > 0 ? c->n_group : 1) : 0;
    d->mlp_width = cpu_max(has_dense ? c->intermediate_size : 0, d->shared_width);
    d->max_tokens = o->max_tokens_per_step;
    d->max_batch = o->max_batch;
    d->max_context = engine->max_context;
    d->max_cols = cpu_max(cpu_max(d->hidden, d->q_dim), cpu_max(d->mlp_width, d->expert_width));
    d->job_capacity = d->num_experts + 4;
    return GLMRT_OK;
}

static void cpu_backend_destroy(void *state)
{
    glmrt_cpu_backend *backend = state;
    if (backend == NULL) {
        return;
    }
    glmrt_threadpool_destroy(backend->pool);
    backend->pool = NULL;
    if (backend->threads != NULL) {
        for (int32_t i = 0; i < backend->num_threads; ++i) {
            glmrt_sampler_scratch_free(&backend->threads[i].sampler);
        }
    }
    free(backend->threads);
    free(backend->thread_storage);
    free(backend->activation_storage);
    free(backend->param_storage);
    free(backend->layers);
    glmrt_linear_runner_free(&backend->linear);
    glmrt_kv_cache_free(&backend->kv);
    free(backend);
}

static glmrt_status cpu_backend_build(glmrt_cpu_backend *backend, glmrt_engine *engine, glmrt_error *error)
{
    glmrt_status status = cpu_derive_dims(backend, engine, error);
    if (status == GLMRT_OK) {
        status = glmrt_cpu_backend_prepare_params(backend, error);
    }
    if (status != GLMRT_OK) {
        return status;
    }
    int32_t requested = engine->options.num_threads;
    if (requested < 0) {
        return glmrt_error_set(error, GLMRT_ERR_INVALID_ARGUMENT, "cpu backend: num_threads %d is negative",
                               (int)requested);
    }
    backend->num_threads = requested == 0 ? glmrt_threadpool_default_threads() : requested;
    status = glmrt_threadpool_create(backend->num_threads, &backend->pool, error);
    if (status == GLMRT_OK) {
        status = glmrt_linear_runner_init(&backend->linear, backend->pool, backend->dims.max_cols,
                                          backend->dims.job_capacity, error);
    }
    if (status == GLMRT_OK) {
        backend->workspace_bytes += glmrt_linear_runner_bytes(&backend->linear);
        status = glmrt_kv_cache_init(&backend->kv, backend->dims.num_layers, engine->kv_pages.num_pages,
                                     engine->kv_pages.page_size, backend->dims.num_kv_heads,
                                     backend->dims.head_dim, error);
    }
    if (status == GLMRT_OK) {
        status = cpu_allocate_activations(backend, error);
    }
    if (status == GLMRT_OK) {
        status = cpu_allocate_threads(backend, error);
    }
    return status;
}

static void cpu_backend_fill_info(const glmrt_cpu_backend *backend, glmrt_engine *engine)
{
    glmrt_engine_info *info = &engine->info;
    info->weight_bytes = (int64_t)engine->weights.total_bytes;
    info->kv_cache_bytes = glmrt_kv_cache_bytes(&backend->kv);
    info->kv_bytes_per_page = glmrt_kv_cache_bytes_per_page(&backend->kv);
    info->workspace_bytes = backend->workspace_bytes;
    info->num_threads = backend->num_threads;
    info->num_devices = 1;
    memset(info->device_name, 0, sizeof(info->device_name));
    memcpy(info->device_name, "cpu", 3);
}

static glmrt_status cpu_backend_create(glmrt_engine *engine, void **out_state)
{
    if (engine == NULL || out_state == NULL) {
        return GLMRT_ERR_INVALID_ARGUMENT;
    }
    *out_state = NULL;
    glmrt_cpu_backend *backend = calloc(1, sizeof(*backend));
    if (backend == NULL) {
        return glmrt_error_set(&engine->error, GLMRT_ERR_OUT_OF_MEMORY, "cpu backend: out of memory");
    }
    backend->engine = engine;
    backend->config = engine->config;
    backend->native_matmuls = engine->options.matmul_precision == GLMRT_MATMUL_NATIVE;
    backend->weights = &engine->weights;
    glmrt_status status = cpu_backend_build(backend, engine, &engine->error);
    if (status != GLMRT_OK) {
        cpu_backend_destroy(backend);
        return status;
    }
    cpu_backend_fill_info(backend, engine);
    *out_state = backend;
    return GLMRT_OK;
}

static glmrt_status cpu_backend_launch(void *state, const glmrt_step_batch *batch, float *out_logits,
                                       glmrt_token *out_sampled)
{
    glmrt_cpu_backend *backend = state;
    int64_t started = glmrt_monotonic_ns();
    glmrt_status status = glmrt_cpu_backend_forward_step(backend, batch, out_logits, out_sampled);
    backend->last_forward_ns = glmrt_monotonic_ns() - started;
    return status;
}

static glmrt_status cpu_backend_complete(void *state, glmrt_step_report *out_report)
{
    glmrt_cpu_backend *backend = state;
    out_report->device_ns = backend->last_forward_ns;
    out_report->rows_owned = 0;
    backend->last_forward_ns = 0;
    return GLMRT_OK;
}

const glmrt_backend_ops glmrt_cpu_backend_ops = {
    "cpu",
    cpu_backend_create,
    cpu_backend_destroy,
    cpu_backend_launch,
    cpu_backend_complete,
    NULL,
    0,
};
