#ifndef GLMRT_REQUEST_H
#define GLMRT_REQUEST_H

#include "error.h"

struct glmrt_request {
    int64_t id;
    glmrt_engine *engine;
    glmrt_token *tokens;
    int32_t max_tokens;
    int32_t num_prompt_tokens;
    int32_t num_tokens;
    int32_t num_computed_tokens;
    glmrt_page_id *page_table;
    int32_t num_pages;
    int32_t num_registered_pages;
    int32_t page_table_capacity;
    glmrt_sampling_params params;
    glmrt_token *stop_token_ids;
    int32_t finish_reason;
    int32_t in_flight;
    int64_t last_step;
    int64_t batch_stamp;
};

void glmrt_request_destroy(glmrt_request *request);

static inline int32_t glmrt_request_num_generated(const glmrt_request *request)
{
    return request->num_tokens - request->num_prompt_tokens;
}

static inline int32_t glmrt_request_num_pending(const glmrt_request *request)
{
    return request->num_tokens - request->num_computed_tokens;
}

static inline int glmrt_request_is_finished(const glmrt_request *request)
{
    return request->finish_reason != GLMRT_FINISH_NONE;
}

#endif
