#include "engine.h"
#include "sampling.h"

#include <stdlib.h>
#include <string.h>

static int request_is_live(const glmrt_engine *engine, const glmrt_request *request)
{
    return glmrt_live_set_has(&engine->live_requests, request);
}

static glmrt_status require_live_request(glmrt_engine *engine, const glmrt_request *request, const char *action)
{
    if (request == NULL) {
        return glmrt_error_set(&engine->error, GLMRT_ERR_INVALID_ARGUMENT, "%s: request is NULL", action);
    }
    if (!request_is_live(engine, request)) {
        return glmrt_error_set(&engine->error, GLMRT_ERR_INVALID_ARGUMENT,
                               "%s: request is not a live request of this engine (freed, or from another engine)",
                               action);
    }
    return GLMRT_OK;
}

static glmrt_status require_request_at_rest(glmrt_engine *engine, const glmrt_request *request, const char *action)
{
    glmrt_status status = require_live_request(engine, request, action);
    if (status == GLMRT_OK && request->in_flight) {
        status = glmrt_error_set(&engine->error, GLMRT_ERR_INVALID_ARGUMENT,
                                 "%s: request %lld is in the step in flight; complete the step first", action,
                                 (long long)request->id);
    }
    return status;
}

static glmrt_status validate_prompt(glmrt_engine *engine, const glmrt_token *prompt_tokens, int32_t num_prompt_tokens)
{
    if (engine->kv_pages.num_pages < 1 || engine->kv_pages.page_size < 1) {
        return glmrt_error_set(&engine->error, GLMRT_ERR_INVARIANT, "engine has no KV page pool");
    }
    if (num_prompt_tokens <= 0) {
        return glmrt_error_set(&engine->error, GLMRT_ERR_INVALID_ARGUMENT, "prompt has no tokens");
    }
    if (prompt_tokens == NULL) {
        return glmrt_error_set(&engine->error, GLMRT_ERR_INVALID_ARGUMENT, "prompt of %d tokens is NULL",
                               num_prompt_tokens);
    }
    for (int32_t i = 0; i < num_prompt_tokens; ++i) {
        if (prompt_tokens[i] < 0 || prompt_tokens[i] >= engine->config.vocab_size) {
            return glmrt_error_set(&engine->error, GLMRT_ERR_INVALID_ARGUMENT,
                                   "prompt token %d at position %d is outside the vocabulary of %d",
                                   prompt_tokens[i], i, engine->config.vocab_size);
        }
    }
    if (num_prompt_tokens > engine->max_context) {
        return glmrt_error_set(&engine->error, GLMRT_ERR_CONTEXT_LENGTH,
                               "prompt has %d tokens, the context limit is %d", num_prompt_tokens,
                               engine->max_context);
    }
    int32_t needed = glmrt_kv_pages_for_tokens(&engine->kv_pages, num_prompt_tokens);
    if (needed > engine->kv_pages.num_pages) {
        return glmrt_error_set(&engine->error, GLMRT_ERR_OUT_OF_PAGES,
                               "prompt of %d tokens needs %d KV pages and can never fit in the pool of %d pages",
                               num_prompt_tokens, needed, engine->kv_pages.num_pages);
    }
    return GLMRT_OK;
}

static int32_t request_capacity(const glmrt_engine *engine, int32_t num_prompt_tokens, int32_t max_new_tokens)
{
    int64_t limit = engine->max_sequence_tokens;
    int64_t wanted = (int64_t)num_prompt_tokens + max_new_tokens;
    int64_t capacity = wanted < limit ? wanted : limit;
    if (capacity < (int64_t)num_prompt_tokens + 1) {
        capacity = (int64_t)num_prompt_tokens + 1;
    }
    return (int32_t)capacity;
}

static glmrt_status copy_stop_tokens(glmrt_engine *engine, glmrt_request *request,
                                     const glmrt_sampling_params *params)
{
    const glmrt_token *source = params->stop_token_ids;
    int32_t count = params->num_stop_token_ids;
    if (count == 0 && source == NULL) {
        source = engine->config.eos_token_ids;
        count = engine->config.num_eos_token_ids;
    }
    request->params.stop_token_ids = NULL;
    request->params.num_stop_token_ids = 0;
    if (count <= 0) {
        return GLMRT_OK;
    }
    request->stop_token_ids = malloc((size_t)count * sizeof(glmrt_token));
    if (request->stop_token_ids == NULL) {
        return glmrt_error_set(&engine->error, GLMRT_ERR_OUT_OF_MEMORY, "cannot allocate %d stop token ids", count);
    }
    memcpy(request->stop_token_ids, source, (size_t)count * sizeof(glmrt_token));
    request->params.stop_token_ids = request->stop_token_ids;
    request->params.num_stop_token_ids = count;
    return GLMRT_OK;
}

void glmrt_request_destroy(glmrt_request *request)
{
    free(request->tokens);
    free(request->page_table);
    free(request->stop_token_ids);
    free(request);
}

static glmrt_status request_build(glmrt_engine *engine, const glmrt_token *prompt_tokens, int32_t num_prompt_tokens,
                                  const glmrt_sampling_params *params, glmrt_request *request)
{
    request->engine = engine;
    request->params = *params;
    request->num_prompt_tokens = num_prompt_tokens;
    request->num_tokens = num_prompt_tokens;
    request->max_tokens = request_capacity(engine, num_prompt_tokens, params->max_new_tokens);
    request->page_table_capacity = glmrt_kv_pages_for_tokens(&engine->kv_pages, request->max_tokens);
    request->finish_reason = GLMRT_FINISH_NONE;
    request->tokens = malloc((size_t)request->max_tokens * sizeof(glmrt_token));
    request->page_table = malloc((size_t)request->page_table_capacity * sizeof(glmrt_page_id));
    if (request->tokens == NULL || request->page_table == NULL) {
        return glmrt_error_set(&engine->error, GLMRT_ERR_OUT_OF_MEMORY,
                               "cannot allocate a request of %d tokens and %d pages", request->max_tokens,
                               request->page_table_capacity);
    }
    memcpy(request->tokens, prompt_tokens, (size_t)num_prompt_tokens * sizeof(glmrt_token));
    return copy_stop_tokens(engine, request, params);
}

static glmrt_status request_register(glmrt_engine *engine, glmrt_request *request)
{
    glmrt_status status = glmrt_live_set_add(&engine->live_requests, request, &engine->error);
    if (status != GLMRT_OK) {
        return status;
    }
    request->id = engine->next_request_id++;
    return GLMRT_OK;
}

glmrt_status glmrt_request_create(glmrt_engine *engine, const glmrt_token *prompt_tokens,
                                  int32_t num_prompt_tokens, const glmrt_sampling_params *params,
                                  glmrt_request **out_request)
{
    if (engine == NULL) {
        return GLMRT_ERR_INVALID_ARGUMENT;
    }
    if (out_request == NULL) {
        return glmrt_error_set(&engine->error, GLMRT_ERR_INVALID_ARGUMENT, "request output pointer is NULL");
    }
    *out_request = NULL;
    glmrt_sampling_params defaults;
    if (params == NULL) {
        glmrt_sampling_params_default(&defaults);
        params = &defaults;
    }
    glmrt_status status = validate_prompt(engine, prompt_tokens, num_prompt_tokens);
    if (status == GLMRT_OK) status = glmrt_sampling_params_validate(params, engine->config.vocab_size, &engine->error);
    if (status != GLMRT_OK) {
        return status;
    }
    glmrt_request *request = calloc(1, sizeof(*request));
    if (request == NULL) {
        return glmrt_error_set(&engine->error, GLMRT_ERR_OUT_OF_MEMORY, "cannot allocate a request");
    }
    status = request_build(engine, prompt_tokens, num_prompt_tokens, params, request);
    if (status != GLMRT_OK) {
        glmrt_request_destroy(request);
        return status;
    }
    status = request_register(engine, request);
    if (status != GLMRT_OK) {
        glmrt_request_destroy(request);
        return status;
    }
    *out_request = request;
    return GLMRT_OK;
}

static glmrt_status request_release_pages(glmrt_engine *engine, glmrt_request *request)
{
    glmrt_status status = glmrt_kv_pages_release(&engine->kv_pages, request->page_table, request->num_pages,
                                                 &engine->error);
    if (status == GLMRT_OK) {
        request->num_pages = 0;
        request->num_registered_pages = 0;
        request->num_computed_tokens = 0;
    }
    return status;
}

glmrt_status glmrt_request_free(glmrt_engine *engine, glmrt_request *request)
{
    if (engine == NULL) {
        return GLMRT_ERR_INVALID_ARGUMENT;
    }
    glmrt_status status = require_request_at_rest(engine, request, "request_free");
    if (status != GLMRT_OK) {
        return status;
    }
    status = request_release_pages(engine, request);
    glmrt_live_set_remove(&engine->live_requests, request);
    glmrt_request_destroy(request);
    return status;
}

glmrt_status glmrt_request_preempt(glmrt_engine *engine, glmrt_request *request)
{
    if (engine == NULL) {
        return GLMRT_ERR_INVALID_ARGUMENT;
    }
    glmrt_status status = require_request_at_rest(engine, request, "request_preempt");
    if (status != GLMRT_OK) {
        return status;
    }
    if (glmrt_request_is_finished(request)) {
        return glmrt_error_set(&engine->error, GLMRT_ERR_INVALID_ARGUMENT,
                               "request %lld is finished and cannot be preempted", (long long)request->id);
    }
    return request_release_pages(engine, request);
}

static void fill_request_info(const glmrt_request *request, glmrt_request_info *out_info)
{
    out_info->request_id = request->id;
    out_info->num_prompt_tokens = request->num_prompt_tokens;
    out_info->num_tokens = request->num_tokens;
    out_info->num_computed_tokens = request->num_computed_tokens;
    out_info->num_generated_tokens = glmrt_request_num_generated(request);
    out_info->num_pages = request->num_pages;
    out_info->max_tokens = request->max_tokens;
    out_info->finish_reason = request->finish_reason;
}

glmrt_status glmrt_request_get_info(glmrt_engine *engine, const glmrt_request *request,
                                    glmrt_request_info *out_info)
{
    if (engine == NULL) {
        return GLMRT_ERR_INVALID_ARGUMENT;
    }
    glmrt_status status = require_live_request(engine, request, "request_get_info");
    if (status != GLMRT_OK) {
        return status;
    }
    if (out_info == NULL) {
        return glmrt_error_set(&engine->error, GLMRT_ERR_INVALID_ARGUMENT, "request info output is NULL");
    }
    fill_request_info(request, out_info);
    return GLMRT_OK;
}

glmrt_status glmrt_request_get_infos(glmrt_engine *engine, glmrt_request *const *requests, int32_t n,
                                     glmrt_request_info *out_infos)
{
    if (engine == NULL) {
        return GLMRT_ERR_INVALID_ARGUMENT;
    }
    if (n < 0 || (n > 0 && (requests == NULL || out_infos == NULL))) {
        return glmrt_error_set(&engine->error, GLMRT_ERR_INVALID_ARGUMENT,
                               "request_get_infos needs %d requests and an output array", n);
    }
    for (int32_t i = 0; i < n; ++i) {
        glmrt_status status = require_live_request(engine, requests[i], "request_get_infos");
        if (status != GLMRT_OK) {
            return status;
        }
    }
    for (int32_t i = 0; i < n; ++i) {
        fill_request_info(requests[i], &out_infos[i]);
    }
    return GLMRT_OK;
}

glmrt_status glmrt_request_get_tokens(glmrt_engine *engine, const glmrt_request *request, glmrt_token *out_tokens,
                                      int32_t capacity, int32_t *out_count)
{
    if (engine == NULL) {
        return GLMRT_ERR_INVALID_ARGUMENT;
    }
    glmrt_status status = require_live_request(engine, request, "request_get_tokens");
    if (status != GLMRT_OK) {
        return status;
    }
    if (out_count == NULL) {
        return glmrt_error_set(&engine->error, GLMRT_ERR_INVALID_ARGUMENT, "token count output is NULL");
    }
    *out_count = request->num_tokens;
    if (capacity < request->num_tokens) {
        return glmrt_error_set(&engine->error, GLMRT_ERR_INVALID_ARGUMENT,
                               "token buffer holds %d tokens, the request has %d", capacity, request->num_tokens);
    }
    if (out_tokens == NULL) {
        return glmrt_error_set(&engine->error, GLMRT_ERR_INVALID_ARGUMENT, "token output buffer is NULL");
    }
    memcpy(out_tokens, request->tokens, (size_t)request->num_tokens * sizeof(glmrt_token));
    return GLMRT_OK;
}
