#ifndef GLMRT_KV_PAGES_H
#define GLMRT_KV_PAGES_H

#include "error.h"

#define GLMRT_PAGE_OWNER_NONE (-1)

typedef struct glmrt_kv_pages {
    int32_t num_pages;
    int32_t page_size;
    int32_t num_free;
    glmrt_page_id *free_stack;
    int64_t *page_owner;
    uint8_t *check_marks;
} glmrt_kv_pages;

glmrt_status glmrt_kv_pages_init(glmrt_kv_pages *pages, int32_t num_pages, int32_t page_size,
                                 glmrt_error *error);
void glmrt_kv_pages_free(glmrt_kv_pages *pages);
int32_t glmrt_kv_pages_for_tokens(const glmrt_kv_pages *pages, int64_t num_tokens);
int glmrt_kv_pages_can_alloc(const glmrt_kv_pages *pages, int32_t count);
glmrt_status glmrt_kv_pages_alloc(glmrt_kv_pages *pages, int64_t owner, int32_t count,
                                  glmrt_page_id *out_ids, glmrt_error *error);
glmrt_status glmrt_kv_pages_release(glmrt_kv_pages *pages, int64_t owner, const glmrt_page_id *ids,
                                    int32_t count, glmrt_error *error);
glmrt_status glmrt_kv_pages_check(const glmrt_kv_pages *pages, int64_t expected_used, glmrt_error *error);

#endif
