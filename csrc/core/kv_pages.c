#include "kv_pages.h"

#include <stdlib.h>
#include <string.h>

static glmrt_status kv_pages_debug_check(const glmrt_kv_pages *pages, glmrt_error *error)
{
#ifdef GLMRT_DEBUG
    return glmrt_kv_pages_check(pages, -1, error);
#else
    (void)pages;
    (void)error;
    return GLMRT_OK;
#endif
}

glmrt_status glmrt_kv_pages_init(glmrt_kv_pages *pages, int32_t num_pages, int32_t page_size,
                                 glmrt_error *error)
{
    if (pages == NULL) {
        return glmrt_error_set(error, GLMRT_ERR_INVALID_ARGUMENT, "KV page pool is NULL");
    }
    memset(pages, 0, sizeof(*pages));
    if (num_pages < 1) {
        return glmrt_error_set(error, GLMRT_ERR_INVALID_ARGUMENT, "KV page pool needs at least 1 page, got %d",
                               num_pages);
    }
    if (page_size < 1) {
        return glmrt_error_set(error, GLMRT_ERR_INVALID_ARGUMENT, "KV page size must be >= 1 token, got %d",
                               page_size);
    }
    pages->free_stack = malloc((size_t)num_pages * sizeof(*pages->free_stack));
    pages->page_owner = malloc((size_t)num_pages * sizeof(*pages->page_owner));
    pages->check_marks = calloc((size_t)num_pages, sizeof(*pages->check_marks));
    if (pages->free_stack == NULL || pages->page_owner == NULL || pages->check_marks == NULL) {
        glmrt_kv_pages_free(pages);
        return glmrt_error_set(error, GLMRT_ERR_OUT_OF_MEMORY, "cannot allocate bookkeeping for %d KV pages",
                               num_pages);
    }
    pages->num_pages = num_pages;
    pages->page_size = page_size;
    pages->num_free = num_pages;
    for (int32_t i = 0; i < num_pages; ++i) {
        pages->free_stack[i] = num_pages - 1 - i;
        pages->page_owner[i] = GLMRT_PAGE_OWNER_NONE;
    }
    return GLMRT_OK;
}

void glmrt_kv_pages_free(glmrt_kv_pages *pages)
{
    if (pages == NULL) {
        return;
    }
    free(pages->free_stack);
    free(pages->page_owner);
    free(pages->check_marks);
    memset(pages, 0, sizeof(*pages));
}

int32_t glmrt_kv_pages_for_tokens(const glmrt_kv_pages *pages, int64_t num_tokens)
{
    if (pages == NULL || pages->page_size < 1 || num_tokens <= 0) {
        return 0;
    }
    int64_t count = (num_tokens + pages->page_size - 1) / pages->page_size;
    return count > INT32_MAX ? INT32_MAX : (int32_t)count;
}

int glmrt_kv_pages_can_alloc(const glmrt_kv_pages *pages, int32_t count)
{
    return pages != NULL && count >= 0 && count <= pages->num_free;
}

glmrt_status glmrt_kv_pages_alloc(glmrt_kv_pages *pages, int64_t owner, int32_t count,
                                  glmrt_page_id *out_ids, glmrt_error *error)
{
    if (pages == NULL || pages->free_stack == NULL) {
        return glmrt_error_set(error, GLMRT_ERR_INVALID_ARGUMENT, "KV page pool is not initialised");
    }
    if (owner < 0) {
        return glmrt_error_set(error, GLMRT_ERR_INVALID_ARGUMENT, "KV page owner must be >= 0, got %lld",
                               (long long)owner);
    }
    if (count < 0 || (count > 0 && out_ids == NULL)) {
        return glmrt_error_set(error, GLMRT_ERR_INVALID_ARGUMENT,
                               "KV page allocation of %d pages needs a count >= 0 and an output array", count);
    }
    if (count > pages->num_free) {
        return glmrt_error_set(error, GLMRT_ERR_OUT_OF_PAGES, "needed %d pages, %d free", count, pages->num_free);
    }
    for (int32_t i = 0; i < count; ++i) {
        glmrt_page_id page = pages->free_stack[--pages->num_free];
        pages->page_owner[page] = owner;
        out_ids[i] = page;
    }
    return kv_pages_debug_check(pages, error);
}

static glmrt_status validate_release_ids(const glmrt_kv_pages *pages, int64_t owner, const glmrt_page_id *ids,
                                         int32_t count, glmrt_error *error)
{
    for (int32_t i = 0; i < count; ++i) {
        glmrt_page_id page = ids[i];
        if (page < 0 || page >= pages->num_pages) {
            return glmrt_error_set(error, GLMRT_ERR_INVARIANT, "release of page %d outside the pool of %d pages",
                                   page, pages->num_pages);
        }
        if (pages->page_owner[page] == GLMRT_PAGE_OWNER_NONE) {
            return glmrt_error_set(error, GLMRT_ERR_INVARIANT, "double free of KV page %d by owner %lld", page,
                                   (long long)owner);
        }
        if (pages->page_owner[page] != owner) {
            return glmrt_error_set(error, GLMRT_ERR_INVARIANT, "owner %lld released KV page %d owned by %lld",
                                   (long long)owner, page, (long long)pages->page_owner[page]);
        }
    }
    return GLMRT_OK;
}

static glmrt_status claim_release_ids(glmrt_kv_pages *pages, int64_t owner, const glmrt_page_id *ids,
                                      int32_t count, glmrt_error *error)
{
    for (int32_t i = 0; i < count; ++i) {
        if (pages->page_owner[ids[i]] != owner) {
            for (int32_t j = 0; j < i; ++j) {
                pages->page_owner[ids[j]] = owner;
            }
            return glmrt_error_set(error, GLMRT_ERR_INVARIANT, "double free of KV page %d by owner %lld",
                                   ids[i], (long long)owner);
        }
        pages->page_owner[ids[i]] = GLMRT_PAGE_OWNER_NONE;
    }
    return GLMRT_OK;
}

glmrt_status glmrt_kv_pages_release(glmrt_kv_pages *pages, int64_t owner, const glmrt_page_id *ids,
                                    int32_t count, glmrt_error *error)
{
    if (pages == NULL || pages->free_stack == NULL) {
        return glmrt_error_set(error, GLMRT_ERR_INVALID_ARGUMENT, "KV page pool is not initialised");
    }
    if (count < 0 || (count > 0 && ids == NULL)) {
        return glmrt_error_set(error, GLMRT_ERR_INVALID_ARGUMENT,
                               "KV page release of %d pages needs a count >= 0 and an id array", count);
    }
    if (owner < 0) {
        return glmrt_error_set(error, GLMRT_ERR_INVARIANT, "release by owner %lld, which can own no page",
                               (long long)owner);
    }
    glmrt_status status = validate_release_ids(pages, owner, ids, count, error);
    if (status == GLMRT_OK) status = claim_release_ids(pages, owner, ids, count, error);
    if (status != GLMRT_OK) {
        return status;
    }
    for (int32_t i = count - 1; i >= 0; --i) {
        pages->free_stack[pages->num_free++] = ids[i];
    }
    return kv_pages_debug_check(pages, error);
}

static glmrt_status check_free_stack(const glmrt_kv_pages *pages, glmrt_error *error)
{
    memset(pages->check_marks, 0, (size_t)pages->num_pages);
    for (int32_t i = 0; i < pages->num_free; ++i) {
        glmrt_page_id page = pages->free_stack[i];
        if (page < 0 || page >= pages->num_pages) {
            return glmrt_error_set(error, GLMRT_ERR_INVARIANT, "free list entry %d holds page %d outside the pool",
                                   i, page);
        }
        if (pages->page_owner[page] != GLMRT_PAGE_OWNER_NONE) {
            return glmrt_error_set(error, GLMRT_ERR_INVARIANT, "free list holds page %d owned by %lld", page,
                                   (long long)pages->page_owner[page]);
        }
        if (pages->check_marks[page]) {
            return glmrt_error_set(error, GLMRT_ERR_INVARIANT, "free list holds page %d twice", page);
        }
        pages->check_marks[page] = 1;
    }
    return GLMRT_OK;
}

static glmrt_status check_owners(const glmrt_kv_pages *pages, int64_t expected_used, glmrt_error *error)
{
    int64_t owned = 0;
    for (int32_t page = 0; page < pages->num_pages; ++page) {
        int64_t owner = pages->page_owner[page];
        if (owner < GLMRT_PAGE_OWNER_NONE) {
            return glmrt_error_set(error, GLMRT_ERR_INVARIANT, "page %d has invalid owner %lld", page,
                                   (long long)owner);
        }
        owned += owner != GLMRT_PAGE_OWNER_NONE;
    }
    if (owned != (int64_t)pages->num_pages - pages->num_free) {
        return glmrt_error_set(error, GLMRT_ERR_INVARIANT, "%lld pages are owned but %d of %d are not free",
                               (long long)owned, pages->num_pages - pages->num_free, pages->num_pages);
    }
    if (expected_used >= 0 && owned != expected_used) {
        return glmrt_error_set(error, GLMRT_ERR_INVARIANT, "%lld pages are owned, requests hold %lld",
                               (long long)owned, (long long)expected_used);
    }
    return GLMRT_OK;
}

glmrt_status glmrt_kv_pages_check(const glmrt_kv_pages *pages, int64_t expected_used, glmrt_error *error)
{
    if (pages == NULL || pages->free_stack == NULL || pages->page_owner == NULL || pages->check_marks == NULL) {
        return glmrt_error_set(error, GLMRT_ERR_INVARIANT, "KV page pool is not initialised");
    }
    if (pages->num_free < 0 || pages->num_free > pages->num_pages) {
        return glmrt_error_set(error, GLMRT_ERR_INVARIANT, "free count %d outside [0, %d]", pages->num_free,
                               pages->num_pages);
    }
    glmrt_status status = check_free_stack(pages, error);
    if (status == GLMRT_OK) status = check_owners(pages, expected_used, error);
    return status;
}
