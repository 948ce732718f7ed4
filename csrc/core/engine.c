#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine_scratch.h"
#include "rank_plan.h"

static glmrt_status validate_options(const glmrt_engine_options *o, glmrt_error *error)
{
    if (o->max_batch < 1) {
        return glmrt_error_set(error, GLMRT_ERR_INVALID_ARGUMENT, "max_batch must be >= 1, got %d", o->max_batch);
    }
    if (o->max_tokens_per_step < o->max_batch) {
        return glmrt_error_set(error, GLMRT_ERR_INVALID_ARGUMENT,
                               "max_tokens_per_step %d must be >= max_batch %d so every decoding request gets a token",
                               o->max_tokens_per_step, o->max_batch);
    }
    if (o->kv_page_size < 1) {
        return glmrt_error_set(error, GLMRT_ERR_INVALID_ARGUMENT, "kv_page_size must be >= 1, got %d", o->kv_page_size);
    }
    if (o->kv_num_pages < 0) {
        return glmrt_error_set(error, GLMRT_ERR_INVALID_ARGUMENT, "kv_num_pages must be >= 0, got %d", o->kv_num_pages);
    }
    if (o->kv_num_pages == 0 && o->backend == GLMRT_BACKEND_CPU) {
        return glmrt_error_set(error, GLMRT_ERR_INVALID_ARGUMENT, "the CPU backend needs kv_num_pages >= 1");
    }
    if (o->num_threads < 0 || o->max_context < 0 || o->device_id < 0) {
        return glmrt_error_set(error, GLMRT_ERR_INVALID_ARGUMENT, "num_threads, max_context and device_id must be >= 0");
    }
    if (o->num_devices < 1 || o->num_devices > GLMRT_MAX_DEVICES) {
        return glmrt_error_set(error, GLMRT_ERR_INVALID_ARGUMENT, "num_devices must be in [1, %d], got %d",
                               GLMRT_MAX_DEVICES, o->num_devices);
    }
    if (o->num_devices > 1 && o->backend == GLMRT_BACKEND_CPU) {
        return glmrt_error_set(error, GLMRT_ERR_UNSUPPORTED,
                               "the CPU backend runs on one device; num_devices %d needs the CUDA backend",
                               o->num_devices);
    }
    if (!(o->kv_memory_fraction > 0.0f && o->kv_memory_fraction <= 1.0f)) {
        return glmrt_error_set(error, GLMRT_ERR_INVALID_ARGUMENT, "kv_memory_fraction must be in (0, 1], got %g",
                               (double)o->kv_memory_fraction);
    }
    if (o->matmul_precision != GLMRT_MATMUL_DEFAULT && o->matmul_precision != GLMRT_MATMUL_HIGH &&
        o->matmul_precision != GLMRT_MATMUL_NATIVE) {
        return glmrt_error_set(error, GLMRT_ERR_INVALID_ARGUMENT,
                               "matmul_precision must be %d (default), %d (high) or %d (native), got %d",
                               GLMRT_MATMUL_DEFAULT, GLMRT_MATMUL_HIGH, GLMRT_MATMUL_NATIVE, o->matmul_precision);
    }
    if (o->decode_graphs != GLMRT_DECODE_GRAPHS_DEFAULT && o->decode_graphs != GLMRT_DECODE_GRAPHS_OFF) {
        return glmrt_error_set(error, GLMRT_ERR_INVALID_ARGUMENT, "decode_graphs must be %d (default) or %d (off), got %d",
                               GLMRT_DECODE_GRAPHS_DEFAULT, GLMRT_DECODE_GRAPHS_OFF, o->decode_graphs);
    }
    if (o->dependent_launches != GLMRT_DEPENDENT_LAUNCHES_DEFAULT &&
        o->dependent_launches != GLMRT_DEPENDENT_LAUNCHES_OFF) {
        return glmrt_error_set(error, GLMRT_ERR_INVALID_ARGUMENT,
                               "dependent_launches must be %d (default) or %d (off), got %d",
                               GLMRT_DEPENDENT_LAUNCHES_DEFAULT, GLMRT_DEPENDENT_LAUNCHES_OFF, o->dependent_launches);
    }
    if (o->all_reduce != GLMRT_ALL_REDUCE_NCCL && o->all_reduce != GLMRT_ALL_REDUCE_PEER &&
        o->all_reduce != GLMRT_ALL_REDUCE_AUTO && o->all_reduce != GLMRT_ALL_REDUCE_PEER_BF16) {
        return glmrt_error_set(error, GLMRT_ERR_INVALID_ARGUMENT,
                               "all_reduce must be %d (nccl), %d (peer), %d (auto) or %d (peer-bf16), got %d",
                               GLMRT_ALL_REDUCE_NCCL, GLMRT_ALL_REDUCE_PEER, GLMRT_ALL_REDUCE_AUTO,
                               GLMRT_ALL_REDUCE_PEER_BF16, o->all_reduce);
    }
    if (o->launch_ahead != GLMRT_LAUNCH_AHEAD_DEFAULT && o->launch_ahead != GLMRT_LAUNCH_AHEAD_OFF &&
        o->launch_ahead != GLMRT_LAUNCH_AHEAD_ALWAYS) {
        return glmrt_error_set(error, GLMRT_ERR_INVALID_ARGUMENT,
                               "launch_ahead must be %d (default), %d (off) or %d (always), got %d",
                               GLMRT_LAUNCH_AHEAD_DEFAULT, GLMRT_LAUNCH_AHEAD_OFF, GLMRT_LAUNCH_AHEAD_ALWAYS,
                               o->launch_ahead);
    }
    glmrt_status split_checked = glmrt_expert_split_check(o->expert_split, error);
    if (split_checked != GLMRT_OK) {
        return split_checked;
    }
    if (o->random_weights && o->backend == GLMRT_BACKEND_CPU) {
        return glmrt_error_set(error, GLMRT_ERR_UNSUPPORTED, "random weights are supported by the CUDA backend only");
    }
    return GLMRT_OK;
}

static int32_t effective_max_context(const glmrt_model_config *config, const glmrt_engine_options *options)
{
    int32_t limit = config->max_position_embeddings;
    if (options->max_context > 0 && options->max_context < limit) {
        limit = options->max_context;
    }
    return limit;
}

static int32_t sequence_token_limit(const glmrt_engine *engine)
{
    int64_t pool_tokens = (int64_t)engine->kv_pages.num_pages * engine->kv_pages.page_size;
    return engine->max_context < pool_tokens ? engine->max_context : (int32_t)pool_tokens;
}

static void release_live_requests(glmrt_engine *engine)
{
    for (int32_t i = 0; i < engine->live_requests.capacity; ++i) {
        if (engine->live_requests.slots[i] != NULL) {
            glmrt_request_destroy(engine->live_requests.slots[i]);
        }
    }
    glmrt_live_set_free(&engine->live_requests);
}

void glmrt_engine_free(glmrt_engine *engine)
{
    if (engine == NULL) {
        return;
    }
    glmrt_step_abandon(engine);
    release_live_requests(engine);
    if (engine->backend_ops != NULL && engine->backend_state != NULL) {
        engine->backend_ops->destroy(engine->backend_state);
    }
    engine->backend_state = NULL;
    glmrt_step_scratch_free(&engine->scratch);
    glmrt_step_scratch_free(&engine->ahead_scratch);
    glmrt_kv_pages_free(&engine->kv_pages);
    glmrt_weights_free(&engine->weights);
    if (engine->has_checkpoint) {
        glmrt_checkpoint_close(&engine->checkpoint);
        engine->has_checkpoint = 0;
    }
    free(engine);
}

static glmrt_status load_weights(glmrt_engine *engine, const char *model_dir)
{
    if (engine->options.random_weights) {
        return GLMRT_OK;
    }
    if (model_dir == NULL || model_dir[0] == '\0') {
        return glmrt_error_set(&engine->error, GLMRT_ERR_INVALID_ARGUMENT, "model directory is empty");
    }
    glmrt_status status = glmrt_checkpoint_open(model_dir, &engine->checkpoint, &engine->error);
    if (status != GLMRT_OK) {
        return status;
    }
    engine->has_checkpoint = 1;
    return glmrt_weights_bind(&engine->checkpoint, &engine->config, &engine->weights, &engine->error);
}

static glmrt_status init_kv_pages(glmrt_engine *engine)
{
    if (engine->options.kv_num_pages < 1) {
        return glmrt_error_set(&engine->error, GLMRT_ERR_BACKEND, "backend %s did not size the KV page pool",
                               engine->backend_ops->name);
    }
    return glmrt_kv_pages_init(&engine->kv_pages, engine->options.kv_num_pages, engine->options.kv_page_size,
                               engine->options.enable_prefix_caching, &engine->error);
}

static glmrt_status build_engine(glmrt_engine *engine, const char *model_dir)
{
    glmrt_status status = validate_options(&engine->options, &engine->error);
    if (status == GLMRT_OK) status = glmrt_model_config_validate(&engine->config, &engine->error);
    if (status != GLMRT_OK) {
        return status;
    }
    engine->backend_ops = glmrt_backend_find(engine->options.backend);
    if (engine->backend_ops == NULL) {
        return glmrt_error_set(&engine->error, GLMRT_ERR_UNSUPPORTED,
                               "backend %d is not available in this build of the library", engine->options.backend);
    }
    if (engine->options.num_threads == 0) {
        long online = sysconf(_SC_NPROCESSORS_ONLN);
        engine->options.num_threads = online > 0 ? (int32_t)online : 1;
    }
    engine->max_context = effective_max_context(&engine->config, &engine->options);
    status = load_weights(engine, model_dir);
    if (status == GLMRT_OK && engine->options.kv_num_pages > 0) status = init_kv_pages(engine);
    if (status == GLMRT_OK) {
        status = glmrt_live_set_reserve(&engine->live_requests, engine->options.max_batch, &engine->error);
    }
    if (status == GLMRT_OK) {
        status = glmrt_step_scratch_init(&engine->scratch, engine->options.max_batch,
                                         engine->options.max_tokens_per_step, engine->config.vocab_size,
                                         &engine->error);
    }
    engine->info.all_reduce = GLMRT_ALL_REDUCE_NONE;
    if (status == GLMRT_OK) status = engine->backend_ops->create(engine, &engine->backend_state);
    if (status == GLMRT_OK && engine->kv_pages.num_pages == 0) status = init_kv_pages(engine);
    if (status == GLMRT_OK && glmrt_step_launch_ahead_possible(engine)) {
        status = glmrt_step_scratch_init(&engine->ahead_scratch, engine->options.max_batch,
                                         engine->options.max_tokens_per_step, 0, &engine->error);
        engine->info.launch_ahead = status == GLMRT_OK;
    }
    if (status != GLMRT_OK) {
        return status;
    }
    engine->info.backend = engine->options.backend;
    engine->info.asynchronous_launch = engine->backend_ops->launch_is_asynchronous;
    engine->info.num_threads = engine->options.num_threads;
    engine->info.max_batch = engine->options.max_batch;
    engine->info.max_tokens_per_step = engine->options.max_tokens_per_step;
    engine->info.max_context = engine->max_context;
    engine->max_sequence_tokens = sequence_token_limit(engine);
    engine->info.max_sequence_tokens = engine->max_sequence_tokens;
    engine->info.max_prompt_tokens = engine->max_sequence_tokens - 1;
    engine->info.kv_page_size = engine->kv_pages.page_size;
    engine->info.kv_num_pages = engine->kv_pages.num_pages;
    if (engine->info.num_devices == 0) {
        engine->info.num_devices = 1;
    }
    engine->info.workspace_bytes += glmrt_step_scratch_bytes(engine->options.max_batch,
                                                             engine->options.max_tokens_per_step,
                                                             engine->config.vocab_size);
    if (engine->info.launch_ahead) {
        engine->info.workspace_bytes += glmrt_step_scratch_bytes(engine->options.max_batch,
                                                                 engine->options.max_tokens_per_step, 0);
    }
    return GLMRT_OK;
}

glmrt_status glmrt_engine_create(const char *model_dir, const glmrt_model_config *config,
                                 const glmrt_engine_options *options, glmrt_engine **out_engine,
                                 char *error_message, int32_t error_capacity)
{
    glmrt_error local;
    glmrt_error_clear(&local);
    if (out_engine == NULL || config == NULL || options == NULL) {
        glmrt_error_set(&local, GLMRT_ERR_INVALID_ARGUMENT, "engine_create needs config, options and an output pointer");
        glmrt_error_copy_out(&local, error_message, error_capacity);
        return local.code;
    }
    *out_engine = NULL;
    glmrt_engine *engine = calloc(1, sizeof(*engine));
    if (engine == NULL) {
        glmrt_error_set(&local, GLMRT_ERR_OUT_OF_MEMORY, "cannot allocate the engine");
        glmrt_error_copy_out(&local, error_message, error_capacity);
        return local.code;
    }
    engine->config = *config;
    engine->options = *options;
    engine->next_request_id = 1;
    glmrt_status status = build_engine(engine, model_dir);
    if (status != GLMRT_OK) {
        glmrt_error_copy_out(&engine->error, error_message, error_capacity);
        glmrt_engine_free(engine);
        return status;
    }
    glmrt_error_clear(&engine->error);
    glmrt_error_copy_out(&engine->error, error_message, error_capacity);
    *out_engine = engine;
    return GLMRT_OK;
}

const char *glmrt_engine_last_error(const glmrt_engine *engine)
{
    if (engine == NULL) {
        return "engine is NULL";
    }
    return engine->error.message;
}

glmrt_status glmrt_engine_get_stats(glmrt_engine *engine, glmrt_engine_stats *out_stats)
{
    if (engine == NULL) {
        return GLMRT_ERR_INVALID_ARGUMENT;
    }
    if (out_stats == NULL) {
        return glmrt_error_set(&engine->error, GLMRT_ERR_INVALID_ARGUMENT, "stats output is NULL");
    }
    out_stats->kv_pages_total = engine->kv_pages.num_pages;
    out_stats->kv_pages_free = glmrt_kv_pages_available(&engine->kv_pages);
    out_stats->kv_page_size = engine->kv_pages.page_size;
    out_stats->live_requests = engine->live_requests.count;
    out_stats->tokens_processed = engine->tokens_processed;
    out_stats->steps = engine->steps;
    out_stats->tokens_generated = engine->tokens_generated;
    out_stats->kv_pages_cached = engine->kv_pages.num_cached;
    out_stats->prefix_cache_queries = engine->prefix_cache_queries;
    out_stats->prefix_cache_hits = engine->prefix_cache_hits;
    out_stats->prefix_cache_evictions = engine->kv_pages.num_evictions;
    out_stats->device_forward_ns = engine->device_forward_ns;
    out_stats->step_gap_ns = engine->step_gaps.total_ns;
    out_stats->step_gaps = engine->step_gaps.count;
    out_stats->rows_owned_steps = engine->rows_owned_steps;
    out_stats->steps_launched_ahead = engine->steps_launched_ahead;
    return GLMRT_OK;
}

glmrt_status glmrt_engine_get_info(glmrt_engine *engine, glmrt_engine_info *out_info)
{
    if (engine == NULL) {
        return GLMRT_ERR_INVALID_ARGUMENT;
    }
    if (out_info == NULL) {
        return glmrt_error_set(&engine->error, GLMRT_ERR_INVALID_ARGUMENT, "info output is NULL");
    }
    *out_info = engine->info;
    return GLMRT_OK;
}

static glmrt_status check_request_pages(glmrt_engine *engine, const glmrt_request *request, int32_t *holders)
{
    for (int32_t i = 0; i < request->num_pages; ++i) {
        glmrt_page_id page = request->page_table[i];
        if (page < 0 || page >= engine->kv_pages.num_pages) {
            return glmrt_error_set(&engine->error, GLMRT_ERR_INVARIANT, "request %lld holds page %d outside the pool",
                                   (long long)request->id, page);
        }
        holders[page] += 1;
    }
    int32_t pages_for_computed = glmrt_kv_pages_for_tokens(&engine->kv_pages, request->num_computed_tokens);
    if (request->num_pages != pages_for_computed) {
        return glmrt_error_set(&engine->error, GLMRT_ERR_INVARIANT,
                               "request %lld holds %d pages for %d computed tokens, expected %d",
                               (long long)request->id, request->num_pages, request->num_computed_tokens,
                               pages_for_computed);
    }
    if (request->num_registered_pages < 0 || request->num_registered_pages > request->num_pages) {
        return glmrt_error_set(&engine->error, GLMRT_ERR_INVARIANT, "request %lld has %d registered of %d pages",
                               (long long)request->id, request->num_registered_pages, request->num_pages);
    }
    return GLMRT_OK;
}

static glmrt_status check_holders(glmrt_engine *engine, const int32_t *holders)
{
    for (glmrt_page_id page = 0; page < engine->kv_pages.num_pages; ++page) {
        if (holders[page] != engine->kv_pages.ref_count[page]) {
            return glmrt_error_set(&engine->error, GLMRT_ERR_INVARIANT,
                                   "page %d is in %d page tables but the pool counts %d holders", page, holders[page],
                                   engine->kv_pages.ref_count[page]);
        }
    }
    return GLMRT_OK;
}

glmrt_status glmrt_engine_check_invariants(glmrt_engine *engine)
{
    if (engine == NULL) {
        return GLMRT_ERR_INVALID_ARGUMENT;
    }
    glmrt_status status = glmrt_engine_require_no_flight(engine, "engine_check_invariants");
    if (status == GLMRT_OK) status = glmrt_kv_pages_check(&engine->kv_pages, &engine->error);
    if (status != GLMRT_OK) {
        return status;
    }
    int32_t *holders = engine->kv_pages.check_counts;
    memset(holders, 0, (size_t)engine->kv_pages.num_pages * sizeof(*holders));
    int32_t counted = 0;
    for (int32_t i = 0; i < engine->live_requests.capacity && status == GLMRT_OK; ++i) {
        const glmrt_request *request = engine->live_requests.slots[i];
        if (request != NULL) {
            status = check_request_pages(engine, request, holders);
            counted += 1;
        }
    }
    if (status == GLMRT_OK) status = check_holders(engine, holders);
    memset(holders, 0, (size_t)engine->kv_pages.num_pages * sizeof(*holders));
    if (status == GLMRT_OK && counted != engine->live_requests.count) {
        status = glmrt_error_set(&engine->error, GLMRT_ERR_INVARIANT,
                                 "the live-request table holds %d requests, its counter says %d", counted,
                                 engine->live_requests.count);
    }
    return status;
}
