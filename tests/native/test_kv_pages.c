#include "kv_pages.h"
#include "native_checks.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_PAGES 64
#define MAX_TABLE 128
#define MAX_PAGE_SIZE 4
#define REBUILD_POOL_PAGES 4
#define REBUILD_CYCLES 200
#define RANDOM_POOL_PAGES 24
#define RANDOM_HOLDERS 6
#define RANDOM_HOLDER_CAPACITY 48
#define RANDOM_OPERATIONS 100000
#define RANDOM_CHECK_EVERY 100
#define RANDOM_MAX_BATCH 8

typedef struct pool_snapshot {
    int32_t num_free;
    int32_t num_cached;
    glmrt_page_id lru_head;
    glmrt_page_id lru_tail;
    int32_t num_registered;
    int32_t num_tombstones;
    int64_t num_evictions;
    glmrt_page_id free_stack[MAX_PAGES];
    int32_t ref_count[MAX_PAGES];
    glmrt_page_id lru_prev[MAX_PAGES];
    glmrt_page_id lru_next[MAX_PAGES];
    uint32_t generation[MAX_PAGES];
    uint64_t page_key[MAX_PAGES];
    glmrt_page_id parent_page[MAX_PAGES];
    uint32_t parent_generation[MAX_PAGES];
    glmrt_token page_tokens[MAX_PAGES * MAX_PAGE_SIZE];
    glmrt_page_id table[MAX_TABLE];
} pool_snapshot;

static int snapshot_fits(const glmrt_kv_pages *pages)
{
    return pages->num_pages <= MAX_PAGES && pages->page_size <= MAX_PAGE_SIZE &&
           (!pages->caching || pages->table_mask + 1 <= MAX_TABLE);
}

static void snapshot_take(const glmrt_kv_pages *pages, pool_snapshot *snapshot)
{
    size_t n = (size_t)pages->num_pages;
    memset(snapshot, 0, sizeof(*snapshot));
    if (!snapshot_fits(pages)) {
        return;
    }
    snapshot->num_free = pages->num_free;
    snapshot->num_cached = pages->num_cached;
    snapshot->lru_head = pages->lru_head;
    snapshot->lru_tail = pages->lru_tail;
    snapshot->num_registered = pages->num_registered;
    snapshot->num_tombstones = pages->num_tombstones;
    snapshot->num_evictions = pages->num_evictions;
    memcpy(snapshot->free_stack, pages->free_stack, (size_t)pages->num_free * sizeof(glmrt_page_id));
    memcpy(snapshot->ref_count, pages->ref_count, n * sizeof(int32_t));
    memcpy(snapshot->lru_prev, pages->lru_prev, n * sizeof(glmrt_page_id));
    memcpy(snapshot->lru_next, pages->lru_next, n * sizeof(glmrt_page_id));
    memcpy(snapshot->generation, pages->generation, n * sizeof(uint32_t));
    memcpy(snapshot->page_key, pages->page_key, n * sizeof(uint64_t));
    memcpy(snapshot->parent_page, pages->parent_page, n * sizeof(glmrt_page_id));
    memcpy(snapshot->parent_generation, pages->parent_generation, n * sizeof(uint32_t));
    if (pages->caching) {
        memcpy(snapshot->page_tokens, pages->page_tokens, n * (size_t)pages->page_size * sizeof(glmrt_token));
        memcpy(snapshot->table, pages->table, (size_t)(pages->table_mask + 1) * sizeof(glmrt_page_id));
    }
}

static int snapshot_matches(const glmrt_kv_pages *pages, const pool_snapshot *snapshot)
{
    size_t n = (size_t)pages->num_pages;
    if (!snapshot_fits(pages)) {
        return 0;
    }
    int same = pages->num_free == snapshot->num_free && pages->num_cached == snapshot->num_cached &&
               pages->lru_head == snapshot->lru_head && pages->lru_tail == snapshot->lru_tail &&
               pages->num_registered == snapshot->num_registered &&
               pages->num_tombstones == snapshot->num_tombstones && pages->num_evictions == snapshot->num_evictions;
    same = same &&
           memcmp(snapshot->free_stack, pages->free_stack, (size_t)pages->num_free * sizeof(glmrt_page_id)) == 0;
    same = same && memcmp(snapshot->ref_count, pages->ref_count, n * sizeof(int32_t)) == 0;
    same = same && memcmp(snapshot->lru_prev, pages->lru_prev, n * sizeof(glmrt_page_id)) == 0;
    same = same && memcmp(snapshot->lru_next, pages->lru_next, n * sizeof(glmrt_page_id)) == 0;
    same = same && memcmp(snapshot->generation, pages->generation, n * sizeof(uint32_t)) == 0;
    same = same && memcmp(snapshot->page_key, pages->page_key, n * sizeof(uint64_t)) == 0;
    same = same && memcmp(snapshot->parent_page, pages->parent_page, n * sizeof(glmrt_page_id)) == 0;
    same = same && memcmp(snapshot->parent_generation, pages->parent_generation, n * sizeof(uint32_t)) == 0;
    if (pages->caching) {
        same = same && memcmp(snapshot->page_tokens, pages->page_tokens,
                              n * (size_t)pages->page_size * sizeof(glmrt_token)) == 0;
        same = same &&
               memcmp(snapshot->table, pages->table, (size_t)(pages->table_mask + 1) * sizeof(glmrt_page_id)) == 0;
    }
    return same;
}

static int pool_is_consistent(const glmrt_kv_pages *pages)
{
    glmrt_error error;
    glmrt_error_clear(&error);
    glmrt_status status = glmrt_kv_pages_check(pages, &error);
    if (status != GLMRT_OK) {
        fprintf(stderr, "pool check: %s\n", error.message);
    }
    return status == GLMRT_OK;
}

static int lru_order_is(const glmrt_kv_pages *pages, const glmrt_page_id *order, int32_t count)
{
    int32_t index = 0;
    for (glmrt_page_id page = pages->lru_head; page != GLMRT_PAGE_NONE; page = pages->lru_next[page]) {
        if (index >= count || order[index] != page) {
            return 0;
        }
        index += 1;
    }
    return index == count && pages->num_cached == count;
}

static int free_stack_holds(const glmrt_kv_pages *pages, glmrt_page_id page)
{
    int found = 0;
    for (int32_t i = 0; i < pages->num_free; ++i) {
        found += pages->free_stack[i] == page;
    }
    return found;
}

static void register_chain(glmrt_kv_pages *pages, const glmrt_page_id *ids, const glmrt_token *tokens, int32_t count)
{
    glmrt_page_id parent = GLMRT_PAGE_NONE;
    for (int32_t i = 0; i < count; ++i) {
        glmrt_prefix_cache_register(pages, ids[i], parent, tokens + (size_t)i * (size_t)pages->page_size);
        parent = ids[i];
    }
}

static int32_t match_chain(const glmrt_kv_pages *pages, const glmrt_token *tokens, int32_t count, glmrt_page_id *out)
{
    glmrt_page_id parent = GLMRT_PAGE_NONE;
    int32_t matched = 0;
    while (matched < count) {
        const glmrt_token *page_tokens = tokens + (size_t)matched * (size_t)pages->page_size;
        glmrt_page_id page = glmrt_prefix_cache_lookup(pages, parent, page_tokens);
        if (page == GLMRT_PAGE_NONE) {
            break;
        }
        if (out != NULL) {
            out[matched] = page;
        }
        matched += 1;
        parent = page;
    }
    return matched;
}

static void test_init_rejects_bad_arguments(void)
{
    glmrt_kv_pages pages;
    glmrt_error error;
    glmrt_error_clear(&error);
    expect(glmrt_kv_pages_init(NULL, 4, 4, 1, &error) == GLMRT_ERR_INVALID_ARGUMENT, "init rejects a NULL pool");
    expect(glmrt_kv_pages_init(&pages, 0, 16, 0, &error) == GLMRT_ERR_INVALID_ARGUMENT, "init rejects 0 pages");
    expect(error.code == GLMRT_ERR_INVALID_ARGUMENT && strstr(error.message, "at least 1 page") != NULL,
           "init explains the page count");
    expect(glmrt_kv_pages_init(&pages, -3, 16, 1, &error) == GLMRT_ERR_INVALID_ARGUMENT, "init rejects -3 pages");
    expect(pages.free_stack == NULL && pages.table == NULL && pages.num_pages == 0,
           "rejected init leaves an empty pool");
    expect(glmrt_kv_pages_init(&pages, 4, 0, 1, &error) == GLMRT_ERR_INVALID_ARGUMENT, "init rejects page size 0");
    expect(strstr(error.message, "page size") != NULL, "init explains the page size");
    expect(glmrt_kv_pages_init(&pages, 4, -2, 0, &error) == GLMRT_ERR_INVALID_ARGUMENT, "init rejects page size -2");
    expect(glmrt_kv_pages_init(&pages, 4, 16, 0, NULL) == GLMRT_OK, "init accepts a NULL error");
    glmrt_kv_pages_free(&pages);
    expect(glmrt_kv_pages_init(&pages, 4, 16, 0, &error) == GLMRT_OK, "init accepts 4 pages of 16 without caching");
    expect(pages.num_free == 4 && pages.num_cached == 0 && pages.num_pages == 4 && pages.page_size == 16,
           "init sizes the pool");
    expect(pages.caching == 0 && pages.table == NULL && pages.page_tokens == NULL,
           "a pool without caching has no prefix table");
    expect(pages.lru_head == GLMRT_PAGE_NONE && pages.lru_tail == GLMRT_PAGE_NONE && pages.num_evictions == 0,
           "a fresh pool has an empty cached list");
    int clean = 1;
    for (glmrt_page_id page = 0; page < 4; ++page) {
        clean = clean && pages.ref_count[page] == 0 && !glmrt_kv_pages_is_registered(&pages, page) &&
                free_stack_holds(&pages, page) == 1;
    }
    expect(clean, "every page of a fresh pool is free, unheld and unregistered");
    expect(glmrt_kv_pages_available(&pages) == 4, "a fresh pool has every page available");
    expect(glmrt_kv_pages_check(&pages, &error) == GLMRT_OK, "fresh pool passes the check");
    glmrt_kv_pages_free(&pages);
    glmrt_kv_pages_free(&pages);
    glmrt_kv_pages_free(NULL);
    expect(pages.free_stack == NULL && pages.num_pages == 0, "free twice leaves an empty pool");
    expect(glmrt_kv_pages_check(&pages, &error) == GLMRT_ERR_INVARIANT, "check rejects a freed pool");
    expect(glmrt_kv_pages_check(NULL, &error) == GLMRT_ERR_INVARIANT, "check rejects a NULL pool");
    expect(glmrt_kv_pages_init(&pages, 5, 2, 7, &error) == GLMRT_OK, "init accepts 5 pages of 2 with caching");
    int32_t capacity = pages.table_mask + 1;
    expect(pages.caching == 1 && pages.table != NULL && pages.page_tokens != NULL, "caching builds a prefix table");
    expect(capacity >= 10 && (capacity & (capacity - 1)) == 0, "the prefix table is a power of two over 2x pages");
    glmrt_token tokens[2] = {1, 2};
    expect(glmrt_prefix_cache_lookup(&pages, GLMRT_PAGE_NONE, tokens) == GLMRT_PAGE_NONE,
           "a fresh cache finds nothing");
    expect(pages.num_registered == 0 && pages.num_tombstones == 0 && glmrt_kv_pages_check(&pages, &error) == GLMRT_OK,
           "a fresh caching pool passes the check");
    glmrt_kv_pages_free(&pages);
}

static void test_pages_for_tokens_rounds_up(void)
{
    glmrt_kv_pages pages;
    glmrt_error error;
    expect(glmrt_kv_pages_init(&pages, 8, 16, 1, &error) == GLMRT_OK, "init for rounding");
    expect(glmrt_kv_pages_for_tokens(&pages, 0) == 0, "0 tokens need 0 pages");
    expect(glmrt_kv_pages_for_tokens(&pages, -5) == 0, "a negative token count needs 0 pages");
    expect(glmrt_kv_pages_for_tokens(&pages, 1) == 1, "1 token needs 1 page");
    expect(glmrt_kv_pages_for_tokens(&pages, 15) == 1, "15 tokens need 1 page");
    expect(glmrt_kv_pages_for_tokens(&pages, 16) == 1, "16 tokens need 1 page");
    expect(glmrt_kv_pages_for_tokens(&pages, 17) == 2, "17 tokens need 2 pages");
    expect(glmrt_kv_pages_for_tokens(&pages, 128) == 8, "128 tokens need 8 pages");
    expect(glmrt_kv_pages_for_tokens(&pages, (int64_t)1 << 40) == INT32_MAX, "a huge count clamps to INT32_MAX");
    expect(glmrt_kv_pages_for_tokens(NULL, 100) == 0, "a NULL pool needs 0 pages");
    expect(glmrt_kv_pages_can_alloc(&pages, 8) && !glmrt_kv_pages_can_alloc(&pages, 9), "can_alloc bounds");
    expect(glmrt_kv_pages_can_alloc(&pages, 0), "can_alloc accepts 0 pages");
    expect(!glmrt_kv_pages_can_alloc(&pages, -1), "can_alloc rejects a negative count");
    expect(!glmrt_kv_pages_can_alloc(NULL, 1), "can_alloc rejects a NULL pool");
    glmrt_kv_pages_free(&pages);
    expect(glmrt_kv_pages_init(&pages, 3, 1, 0, &error) == GLMRT_OK, "init with page size 1");
    expect(glmrt_kv_pages_for_tokens(&pages, 7) == 7, "page size 1 needs one page a token");
    glmrt_kv_pages_free(&pages);
}

static void test_alloc_release_and_exhaustion(void)
{
    glmrt_kv_pages pages;
    glmrt_error error;
    glmrt_page_id first[8];
    glmrt_page_id second[8];
    glmrt_page_id again[8];
    pool_snapshot before;
    expect(glmrt_kv_pages_init(&pages, 8, 4, 0, &error) == GLMRT_OK, "init for exhaustion");
    expect(glmrt_kv_pages_alloc(&pages, 5, first, &error) == GLMRT_OK, "alloc 5 of 8");
    expect(pages.num_free == 3 && glmrt_kv_pages_available(&pages) == 3, "3 pages stay free");
    int held_once = 1;
    for (int i = 0; i < 5; ++i) {
        held_once = held_once && first[i] >= 0 && first[i] < 8 && pages.ref_count[first[i]] == 1 &&
                    free_stack_holds(&pages, first[i]) == 0;
        for (int j = 0; j < i; ++j) {
            held_once = held_once && first[j] != first[i];
        }
    }
    expect(held_once, "allocated pages are distinct, off the free stack, with one holder each");
    snapshot_take(&pages, &before);
    second[0] = -7;
    expect(glmrt_kv_pages_alloc(&pages, 4, second, &error) == GLMRT_ERR_OUT_OF_PAGES, "alloc 4 of 3 fails");
    expect(strstr(error.message, "needed 4 pages, 3 free") != NULL, "exhaustion message names both counts");
    expect(snapshot_matches(&pages, &before) && second[0] == -7, "failed alloc changes nothing");
    expect(glmrt_kv_pages_alloc(&pages, 0, NULL, &error) == GLMRT_OK, "alloc of 0 pages succeeds");
    expect(snapshot_matches(&pages, &before), "alloc of 0 pages changes nothing");
    expect(glmrt_kv_pages_alloc(&pages, 3, second, &error) == GLMRT_OK, "alloc the last 3");
    expect(pages.num_free == 0 && glmrt_kv_pages_available(&pages) == 0 && pool_is_consistent(&pages),
           "pool is full");
    expect(glmrt_kv_pages_alloc(&pages, 1, second + 3, &error) == GLMRT_ERR_OUT_OF_PAGES, "full pool refuses");
    expect(pages.num_evictions == 0, "a pool without cached pages evicts nothing");
    expect(glmrt_kv_pages_release(&pages, second, 3, &error) == GLMRT_OK, "release the last 3");
    expect(pages.num_free == 3 && pages.num_cached == 0, "released pages go to the free stack");
    expect(glmrt_kv_pages_alloc(&pages, 3, again, &error) == GLMRT_OK, "alloc 3 again");
    expect(again[0] == second[0] && again[1] == second[1] && again[2] == second[2],
           "the free stack hands back the released pages in their order");
    expect(glmrt_kv_pages_release(&pages, first, 5, &error) == GLMRT_OK, "release the first 5");
    expect(glmrt_kv_pages_release(&pages, again, 3, &error) == GLMRT_OK, "release the other 3");
    expect(pages.num_free == 8 && pool_is_consistent(&pages), "pool is empty again");
    expect(glmrt_kv_pages_release(&pages, NULL, 0, &error) == GLMRT_OK, "release of 0 pages succeeds");
    glmrt_kv_pages_free(&pages);
}

static void test_bad_arguments_change_nothing(void)
{
    glmrt_kv_pages pages;
    glmrt_kv_pages unset;
    glmrt_error error;
    glmrt_page_id ids[4];
    pool_snapshot before;
    memset(&unset, 0, sizeof(unset));
    expect(glmrt_kv_pages_init(&pages, 4, 4, 1, &error) == GLMRT_OK, "init for arguments");
    expect(glmrt_kv_pages_alloc(&pages, 2, ids, &error) == GLMRT_OK, "alloc 2 for arguments");
    snapshot_take(&pages, &before);
    expect(glmrt_kv_pages_alloc(&pages, -1, ids + 2, &error) == GLMRT_ERR_INVALID_ARGUMENT, "negative alloc count");
    expect(glmrt_kv_pages_alloc(&pages, 2, NULL, &error) == GLMRT_ERR_INVALID_ARGUMENT, "NULL alloc output");
    expect(glmrt_kv_pages_alloc(NULL, 1, ids + 2, &error) == GLMRT_ERR_INVALID_ARGUMENT, "alloc from a NULL pool");
    expect(glmrt_kv_pages_alloc(&unset, 1, ids + 2, &error) == GLMRT_ERR_INVALID_ARGUMENT,
           "alloc from an uninitialised pool");
    expect(glmrt_kv_pages_release(&pages, NULL, 1, &error) == GLMRT_ERR_INVALID_ARGUMENT, "NULL release ids");
    expect(glmrt_kv_pages_release(&pages, ids, -2, &error) == GLMRT_ERR_INVALID_ARGUMENT, "negative release count");
    expect(glmrt_kv_pages_release(NULL, ids, 1, &error) == GLMRT_ERR_INVALID_ARGUMENT, "release to a NULL pool");
    expect(glmrt_kv_pages_release(&unset, ids, 1, &error) == GLMRT_ERR_INVALID_ARGUMENT,
           "release to an uninitialised pool");
    glmrt_page_id outside[2] = {ids[0], 4};
    expect(glmrt_kv_pages_release(&pages, outside, 2, &error) == GLMRT_ERR_INVARIANT,
           "release of a page past the pool is refused");
    expect(strstr(error.message, "outside the pool") != NULL, "the refusal names the range");
    glmrt_page_id negative[2] = {ids[1], -1};
    expect(glmrt_kv_pages_release(&pages, negative, 2, &error) == GLMRT_ERR_INVARIANT,
           "release of page -1 is refused");
    glmrt_page_id free_page = pages.free_stack[0];
    expect(glmrt_kv_pages_release(&pages, &free_page, 1, &error) == GLMRT_ERR_INVARIANT,
           "release of a free page is refused");
    expect(snapshot_matches(&pages, &before), "refused arguments change nothing");
    expect(pool_is_consistent(&pages), "pool is consistent after refusals");
    expect(glmrt_kv_pages_release(&pages, ids, 2, &error) == GLMRT_OK, "release the 2 pages");
    expect(pages.num_free == 4 && pool_is_consistent(&pages), "pool is empty after the arguments test");
    glmrt_kv_pages_free(&pages);
}

static void test_refused_release_leaves_later_releases_valid(void)
{
    glmrt_kv_pages pages;
    glmrt_error error;
    glmrt_page_id ids[2];
    expect(glmrt_kv_pages_init(&pages, 4, 2, 0, &error) == GLMRT_OK, "init for a refused release");
    expect(glmrt_kv_pages_alloc(&pages, 2, ids, &error) == GLMRT_OK, "alloc 2 for a refused release");
    glmrt_page_id outside[2] = {ids[0], 99};
    expect(glmrt_kv_pages_release(&pages, outside, 2, &error) == GLMRT_ERR_INVARIANT,
           "release with a page outside the pool after a valid one is refused");
    glmrt_status status = glmrt_kv_pages_release(&pages, ids, 1, &error);
    if (status != GLMRT_OK) {
        fprintf(stderr, "release after a refused out of range release: %s\n", error.message);
    }
    expect(status == GLMRT_OK, "a valid release after a refused out of range release succeeds");
    expect(pages.ref_count[ids[0]] == 0 && pages.num_free == 3, "the valid release frees its page");
    expect(glmrt_kv_pages_release(&pages, ids + 1, 1, &error) == GLMRT_OK, "release the other page");
    expect(pages.num_free == 4 && pool_is_consistent(&pages), "pool is empty after a refused release");
    glmrt_kv_pages_free(&pages);
}

static void test_shared_pages(void)
{
    glmrt_kv_pages pages;
    glmrt_error error;
    glmrt_page_id ids[2];
    pool_snapshot before;
    expect(glmrt_kv_pages_init(&pages, 4, 4, 0, &error) == GLMRT_OK, "init for shared pages");
    expect(glmrt_kv_pages_alloc(&pages, 2, ids, &error) == GLMRT_OK, "first holder allocates 2");
    glmrt_page_id a = ids[0];
    glmrt_page_id b = ids[1];
    expect(glmrt_kv_pages_acquire(&pages, a, &error) == GLMRT_OK, "acquire of a held or cached page");
    expect(pages.ref_count[a] == 2 && pages.num_free == 2 && glmrt_kv_pages_available(&pages) == 2,
           "a second holder shares a page without taking another");
    expect(glmrt_kv_pages_acquire(&pages, a, &error) == GLMRT_OK, "acquire of a held or cached page");
    expect(pages.ref_count[a] == 3 && pool_is_consistent(&pages), "a third holder shares the page");
    snapshot_take(&pages, &before);
    glmrt_page_id four[4] = {a, a, a, a};
    expect(glmrt_kv_pages_release(&pages, four, 4, &error) == GLMRT_ERR_INVARIANT,
           "releasing a page of 3 holders 4 times is refused");
    expect(strstr(error.message, "4 times") != NULL && strstr(error.message, "3 holders") != NULL,
           "the refusal names both counts");
    expect(snapshot_matches(&pages, &before), "the refused over-release changes nothing");
    glmrt_page_id mixed[3] = {b, a, b};
    expect(glmrt_kv_pages_release(&pages, mixed, 3, &error) == GLMRT_ERR_INVARIANT,
           "a release with one over-released page among valid ones is refused");
    expect(snapshot_matches(&pages, &before), "the partly valid release changes nothing");
    glmrt_page_id valid_then_over[4] = {a, a, b, b};
    expect(glmrt_kv_pages_release(&pages, valid_then_over, 4, &error) == GLMRT_ERR_INVARIANT,
           "an over-release at the end of a batch is refused");
    expect(snapshot_matches(&pages, &before), "the late over-release changes nothing");
    expect(glmrt_kv_pages_release(&pages, &a, 1, &error) == GLMRT_OK, "the first holder leaves the shared page");
    expect(pages.ref_count[a] == 2 && pages.num_free == 2 && free_stack_holds(&pages, a) == 0,
           "the shared page stays with the other holders");
    glmrt_page_id twice[2] = {a, a};
    expect(glmrt_kv_pages_release(&pages, twice, 2, &error) == GLMRT_OK, "the last 2 holders leave in one release");
    expect(pages.ref_count[a] == 0 && pages.num_free == 3 && free_stack_holds(&pages, a) == 1,
           "the page returns to the free stack once");
    expect(pool_is_consistent(&pages), "pool is consistent after shared releases");
    snapshot_take(&pages, &before);
    expect(glmrt_kv_pages_release(&pages, &a, 1, &error) == GLMRT_ERR_INVARIANT,
           "releasing a page without holders is refused");
    expect(strstr(error.message, "0 holders") != NULL, "the refusal says the page has no holders");
    expect(snapshot_matches(&pages, &before), "releasing a free page changes nothing");
    expect(glmrt_kv_pages_acquire(&pages, b, &error) == GLMRT_OK, "acquire of a held or cached page");
    expect(glmrt_kv_pages_release(&pages, &b, 1, &error) == GLMRT_OK, "the second holder of b leaves first");
    expect(pages.ref_count[b] == 1 && pages.num_free == 3, "b stays with its first holder");
    expect(glmrt_kv_pages_release(&pages, &b, 1, &error) == GLMRT_OK, "the first holder of b leaves last");
    expect(pages.num_free == 4 && pool_is_consistent(&pages), "pool is empty after shared pages");
    glmrt_kv_pages_free(&pages);
}

static void test_caching_off_registers_nothing(void)
{
    glmrt_kv_pages pages;
    glmrt_error error;
    glmrt_page_id ids[4];
    glmrt_token tokens[6] = {1, 2, 3, 4, 5, 6};
    expect(glmrt_kv_pages_init(&pages, 4, 2, 0, &error) == GLMRT_OK, "init without caching");
    expect(glmrt_kv_pages_alloc(&pages, 3, ids, &error) == GLMRT_OK, "alloc 3 without caching");
    register_chain(&pages, ids, tokens, 3);
    int none = 1;
    for (int i = 0; i < 3; ++i) {
        none = none && !glmrt_kv_pages_is_registered(&pages, ids[i]);
    }
    expect(none && pages.num_registered == 0, "nothing registers without caching");
    expect(glmrt_prefix_cache_lookup(&pages, GLMRT_PAGE_NONE, tokens) == GLMRT_PAGE_NONE &&
               glmrt_prefix_cache_lookup(&pages, ids[0], tokens + 2) == GLMRT_PAGE_NONE,
           "lookups find nothing without caching");
    expect(match_chain(&pages, tokens, 3, NULL) == 0, "a chain matches nothing without caching");
    expect(glmrt_kv_pages_release(&pages, ids, 3, &error) == GLMRT_OK, "release without caching");
    expect(pages.num_free == 4 && pages.num_cached == 0 && pages.lru_head == GLMRT_PAGE_NONE,
           "released pages go to the free stack without caching");
    expect(glmrt_kv_pages_alloc(&pages, 4, ids, &error) == GLMRT_OK, "alloc the whole pool without caching");
    int fresh = pages.num_evictions == 0;
    for (int i = 0; i < 4; ++i) {
        fresh = fresh && pages.generation[ids[i]] == 0;
    }
    expect(fresh, "a pool without caching never evicts");
    expect(glmrt_kv_pages_release(&pages, ids, 4, &error) == GLMRT_OK && pool_is_consistent(&pages),
           "pool without caching is consistent");
    glmrt_kv_pages_free(&pages);
}

static void test_prefix_chain_lookup(void)
{
    glmrt_kv_pages pages;
    glmrt_error error;
    glmrt_page_id chain[3];
    glmrt_page_id found[3];
    glmrt_page_id extra[2];
    glmrt_token tokens[12] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
    glmrt_token changed[12];
    expect(glmrt_kv_pages_init(&pages, 8, 4, 1, &error) == GLMRT_OK, "init for a prefix chain");
    expect(glmrt_kv_pages_alloc(&pages, 3, chain, &error) == GLMRT_OK, "alloc a chain of 3");
    register_chain(&pages, chain, tokens, 3);
    expect(pages.num_registered == 3 && glmrt_kv_pages_is_registered(&pages, chain[0]) &&
               glmrt_kv_pages_is_registered(&pages, chain[1]) && glmrt_kv_pages_is_registered(&pages, chain[2]),
           "the chain of 3 registers");
    expect(pages.parent_page[chain[0]] == GLMRT_PAGE_NONE && pages.parent_page[chain[1]] == chain[0] &&
               pages.parent_page[chain[2]] == chain[1],
           "each page records its parent");
    expect(glmrt_prefix_cache_lookup(&pages, GLMRT_PAGE_NONE, tokens) == chain[0], "lookup finds the first page");
    expect(glmrt_prefix_cache_lookup(&pages, chain[0], tokens + 4) == chain[1], "lookup finds the second page");
    expect(glmrt_prefix_cache_lookup(&pages, chain[1], tokens + 8) == chain[2], "lookup finds the third page");
    expect(match_chain(&pages, tokens, 3, found) == 3 && found[0] == chain[0] && found[1] == chain[1] &&
               found[2] == chain[2],
           "the chain matches in order");
    expect(pool_is_consistent(&pages), "pool is consistent with a registered chain");
    memcpy(changed, tokens, sizeof(tokens));
    changed[5] = 99;
    expect(match_chain(&pages, changed, 3, NULL) == 1, "a different token in the second page stops at 1");
    memcpy(changed, tokens, sizeof(tokens));
    changed[0] = 99;
    expect(match_chain(&pages, changed, 3, NULL) == 0, "a different first token matches nothing");
    memcpy(changed, tokens, sizeof(tokens));
    changed[11] = 99;
    expect(match_chain(&pages, changed, 3, NULL) == 2, "a different last token stops at 2");
    expect(glmrt_prefix_cache_lookup(&pages, GLMRT_PAGE_NONE, tokens + 4) == GLMRT_PAGE_NONE,
           "the second page does not match without its parent");
    expect(glmrt_prefix_cache_lookup(&pages, chain[1], tokens + 4) == GLMRT_PAGE_NONE,
           "the second page does not match under another parent");
    expect(glmrt_prefix_cache_lookup(&pages, chain[2], tokens + 8) == GLMRT_PAGE_NONE,
           "the third page does not match under itself");
    expect(glmrt_kv_pages_alloc(&pages, 2, extra, &error) == GLMRT_OK, "alloc 2 more pages");
    expect(glmrt_prefix_cache_lookup(&pages, extra[1], tokens + 4) == GLMRT_PAGE_NONE,
           "lookup under an unregistered parent finds nothing");
    glmrt_prefix_cache_register(&pages, extra[0], GLMRT_PAGE_NONE, tokens);
    expect(!glmrt_kv_pages_is_registered(&pages, extra[0]), "an equal first page is not registered twice");
    glmrt_prefix_cache_register(&pages, extra[0], chain[0], tokens + 4);
    expect(!glmrt_kv_pages_is_registered(&pages, extra[0]), "an equal second page is not registered twice");
    glmrt_prefix_cache_register(&pages, extra[0], extra[1], tokens + 4);
    expect(!glmrt_kv_pages_is_registered(&pages, extra[0]), "a page under an unregistered parent is not registered");
    glmrt_prefix_cache_register(&pages, chain[1], GLMRT_PAGE_NONE, tokens + 8);
    expect(pages.parent_page[chain[1]] == chain[0] &&
               glmrt_prefix_cache_lookup(&pages, GLMRT_PAGE_NONE, tokens + 8) == GLMRT_PAGE_NONE,
           "a registered page keeps its first key");
    expect(pages.num_registered == 3 && pool_is_consistent(&pages), "ignored registrations change nothing");
    memcpy(changed, tokens, sizeof(tokens));
    changed[4] = 50;
    glmrt_prefix_cache_register(&pages, extra[0], chain[0], changed + 4);
    expect(glmrt_kv_pages_is_registered(&pages, extra[0]) &&
               glmrt_prefix_cache_lookup(&pages, chain[0], changed + 4) == extra[0] &&
               glmrt_prefix_cache_lookup(&pages, chain[0], tokens + 4) == chain[1],
           "a branch under the same parent registers beside the chain");
    expect(match_chain(&pages, changed, 3, found) == 2 && found[1] == extra[0], "the branch matches its own path");
    expect(glmrt_kv_pages_acquire(&pages, chain[0], &error) == GLMRT_OK, "acquire of a held or cached page");
    expect(glmrt_kv_pages_release(&pages, chain, 3, &error) == GLMRT_OK, "the first holder releases the chain");
    expect(pages.ref_count[chain[0]] == 1 && pages.num_cached == 2 && glmrt_kv_pages_available(&pages) == 5,
           "a shared registered page stays held while its children are cached");
    expect(match_chain(&pages, tokens, 3, found) == 3, "cached pages still match");
    expect(glmrt_kv_pages_release(&pages, chain, 1, &error) == GLMRT_OK, "the second holder releases the root");
    expect(pages.num_cached == 3 && pages.num_free == 3, "the whole chain is cached");
    expect(glmrt_kv_pages_release(&pages, extra, 2, &error) == GLMRT_OK, "release the extra pages");
    expect(pages.num_cached == 4 && pages.num_free == 4 && glmrt_kv_pages_available(&pages) == 8,
           "the registered branch is cached and the other page is free");
    expect(pool_is_consistent(&pages), "pool is consistent with a cached chain");
    glmrt_kv_pages_free(&pages);
}

static void test_cached_pages_evict_least_recent_first(void)
{
    glmrt_kv_pages pages;
    glmrt_error error;
    glmrt_page_id ids[6];
    glmrt_page_id taken[3];
    glmrt_token tokens_a[6] = {1, 1, 2, 2, 3, 3};
    glmrt_token tokens_b[4] = {7, 7, 8, 8};
    pool_snapshot before;
    expect(glmrt_kv_pages_init(&pages, 6, 2, 1, &error) == GLMRT_OK, "init for eviction");
    expect(glmrt_kv_pages_alloc(&pages, 6, ids, &error) == GLMRT_OK, "alloc the whole pool for eviction");
    glmrt_page_id a0 = ids[0], a1 = ids[1], a2 = ids[2], b0 = ids[3], b1 = ids[4], u = ids[5];
    register_chain(&pages, ids, tokens_a, 3);
    register_chain(&pages, ids + 3, tokens_b, 2);
    uint32_t generation_a0 = pages.generation[a0];
    uint32_t generation_a2 = pages.generation[a2];
    expect(glmrt_kv_pages_release(&pages, ids, 3, &error) == GLMRT_OK, "release chain a in one call");
    expect(pages.num_cached == 3 && pages.num_free == 0 && glmrt_kv_pages_available(&pages) == 3,
           "released registered pages are cached and available");
    expect(glmrt_kv_pages_can_alloc(&pages, 3) && !glmrt_kv_pages_can_alloc(&pages, 4), "can_alloc counts cached");
    glmrt_page_id order_a[3] = {a2, a1, a0};
    expect(lru_order_is(&pages, order_a, 3), "a chain released together is cached leaf first");
    expect(glmrt_kv_pages_release(&pages, &u, 1, &error) == GLMRT_OK, "release the unregistered page");
    expect(pages.num_free == 1 && pages.num_cached == 3 && free_stack_holds(&pages, u) == 1,
           "an unregistered page goes to the free stack");
    expect(glmrt_kv_pages_release(&pages, &b0, 1, &error) == GLMRT_OK, "release b0");
    expect(glmrt_kv_pages_release(&pages, &b1, 1, &error) == GLMRT_OK, "release b1");
    glmrt_page_id order_all[5] = {a2, a1, a0, b0, b1};
    expect(lru_order_is(&pages, order_all, 5) && glmrt_kv_pages_available(&pages) == 6,
           "cached pages are in release order");
    expect(pool_is_consistent(&pages), "pool with cached pages passes the check");
    snapshot_take(&pages, &before);
    glmrt_page_id cached_twice[2] = {b0, b0};
    expect(glmrt_kv_pages_release(&pages, cached_twice, 2, &error) == GLMRT_ERR_INVARIANT,
           "releasing a cached page is refused");
    expect(snapshot_matches(&pages, &before), "releasing a cached page changes nothing");
    expect(glmrt_kv_pages_acquire(&pages, a1, &error) == GLMRT_OK, "acquire of a held or cached page");
    glmrt_page_id order_taken[4] = {a2, a0, b0, b1};
    expect(pages.ref_count[a1] == 1 && lru_order_is(&pages, order_taken, 4) && glmrt_kv_pages_available(&pages) == 5,
           "acquiring a cached page takes it off the cached list");
    expect(glmrt_kv_pages_is_registered(&pages, a1) && pool_is_consistent(&pages),
           "an acquired cached page stays registered");
    expect(glmrt_kv_pages_release(&pages, &a1, 1, &error) == GLMRT_OK, "release the reacquired page");
    glmrt_page_id order_back[5] = {a2, a0, b0, b1, a1};
    expect(lru_order_is(&pages, order_back, 5), "a page released again becomes the most recent");
    expect(glmrt_kv_pages_alloc(&pages, 3, taken, &error) == GLMRT_OK, "alloc 3 over one free page");
    expect(taken[0] == u && taken[1] == a2 && taken[2] == a0, "alloc takes the free page, then the oldest cached");
    expect(pages.num_evictions == 2 && pages.num_free == 0 && pages.num_cached == 3, "alloc counts 2 evictions");
    expect(!glmrt_kv_pages_is_registered(&pages, a2) && !glmrt_kv_pages_is_registered(&pages, a0) &&
               pages.ref_count[a2] == 1 && pages.ref_count[a0] == 1,
           "evicted pages are unregistered and held by the new holder");
    expect(pages.generation[a0] == generation_a0 + 1 && pages.generation[a2] == generation_a2 + 1,
           "eviction bumps the page generation");
    expect(match_chain(&pages, tokens_a, 3, NULL) == 0 && match_chain(&pages, tokens_b, 2, NULL) == 2,
           "the evicted chain no longer matches and the other still does");
    expect(glmrt_prefix_cache_lookup(&pages, a0, tokens_a + 2) == GLMRT_PAGE_NONE,
           "the orphaned child does not match under its evicted parent");
    glmrt_page_id order_left[3] = {b0, b1, a1};
    expect(lru_order_is(&pages, order_left, 3) && pool_is_consistent(&pages), "the rest stay cached in order");
    snapshot_take(&pages, &before);
    glmrt_page_id more[4];
    expect(glmrt_kv_pages_alloc(&pages, 4, more, &error) == GLMRT_ERR_OUT_OF_PAGES, "alloc past free and cached fails");
    expect(strstr(error.message, "0 free and 3 cached") != NULL, "exhaustion names free and cached counts");
    expect(snapshot_matches(&pages, &before), "a failed alloc evicts nothing");
    expect(glmrt_kv_pages_alloc(&pages, 3, more, &error) == GLMRT_OK, "alloc the 3 cached pages");
    expect(more[0] == b0 && more[1] == b1 && more[2] == a1 && pages.num_evictions == 5 && pages.num_cached == 0,
           "the remaining cached pages are evicted oldest first");
    expect(pages.num_registered == 0 && pool_is_consistent(&pages), "nothing stays registered after all evictions");
    expect(glmrt_kv_pages_release(&pages, taken, 3, &error) == GLMRT_OK &&
               glmrt_kv_pages_release(&pages, more, 3, &error) == GLMRT_OK,
           "release everything after eviction");
    expect(pages.num_free == 6 && pool_is_consistent(&pages), "pool is free after eviction");
    glmrt_kv_pages_free(&pages);
}

static void test_generation_blocks_stale_children(void)
{
    glmrt_kv_pages pages;
    glmrt_error error;
    glmrt_page_id ids[2];
    glmrt_page_id taken;
    glmrt_page_id found[2];
    glmrt_token tokens[4] = {3, 1, 4, 1};
    expect(glmrt_kv_pages_init(&pages, 2, 2, 1, &error) == GLMRT_OK, "init for generations");
    expect(glmrt_kv_pages_alloc(&pages, 2, ids, &error) == GLMRT_OK, "alloc parent and child");
    glmrt_page_id parent = ids[0];
    glmrt_page_id child = ids[1];
    register_chain(&pages, ids, tokens, 2);
    uint32_t parent_generation = pages.generation[parent];
    expect(match_chain(&pages, tokens, 2, NULL) == 2, "parent and child match");
    expect(glmrt_kv_pages_release(&pages, &parent, 1, &error) == GLMRT_OK, "release the parent first");
    expect(glmrt_kv_pages_release(&pages, &child, 1, &error) == GLMRT_OK, "release the child second");
    expect(glmrt_kv_pages_alloc(&pages, 1, &taken, &error) == GLMRT_OK && taken == parent,
           "alloc evicts the parent");
    expect(pages.generation[parent] == parent_generation + 1 && !glmrt_kv_pages_is_registered(&pages, parent),
           "the evicted parent has a new generation");
    expect(glmrt_kv_pages_is_registered(&pages, child) && pages.num_cached == 1, "the child stays cached");
    expect(glmrt_prefix_cache_lookup(&pages, parent, tokens + 2) == GLMRT_PAGE_NONE,
           "the child does not match under the unregistered parent");
    glmrt_prefix_cache_register(&pages, parent, GLMRT_PAGE_NONE, tokens);
    expect(glmrt_kv_pages_is_registered(&pages, parent) &&
               glmrt_prefix_cache_lookup(&pages, GLMRT_PAGE_NONE, tokens) == parent,
           "the parent page registers again with the same tokens");
    expect(glmrt_prefix_cache_lookup(&pages, parent, tokens + 2) == GLMRT_PAGE_NONE,
           "the old child does not match under the parent's new generation");
    expect(match_chain(&pages, tokens, 2, NULL) == 1, "the chain stops after the new parent");
    expect(pool_is_consistent(&pages), "pool is consistent with an orphaned child");
    expect(glmrt_kv_pages_alloc(&pages, 1, &taken, &error) == GLMRT_OK && taken == child,
           "alloc evicts the orphaned child");
    glmrt_prefix_cache_register(&pages, child, parent, tokens + 2);
    expect(glmrt_kv_pages_is_registered(&pages, child) &&
               glmrt_prefix_cache_lookup(&pages, parent, tokens + 2) == child,
           "a new child registers under the new parent");
    expect(match_chain(&pages, tokens, 2, found) == 2 && found[0] == parent && found[1] == child,
           "the new chain matches");
    expect(pages.num_evictions == 2 && pool_is_consistent(&pages), "pool is consistent after the new chain");
    expect(glmrt_kv_pages_release(&pages, ids, 2, &error) == GLMRT_OK && pages.num_cached == 2,
           "the new chain is cached");
    glmrt_kv_pages_free(&pages);
}

static int rebuild_entry_expected(const glmrt_page_id *entry_page, const glmrt_page_id *entry_parent_cycle,
                                  const int32_t *owner_cycle, int32_t cycle)
{
    if (owner_cycle[entry_page[cycle]] != cycle) {
        return 0;
    }
    int32_t parent_cycle = entry_parent_cycle[cycle];
    return parent_cycle < 0 || owner_cycle[entry_page[parent_cycle]] == parent_cycle;
}

static int run_rebuild_cycles(uint64_t seed, int32_t *out_rebuilds)
{
    glmrt_kv_pages pages;
    glmrt_error error;
    glmrt_page_id entry_page[REBUILD_CYCLES];
    glmrt_page_id entry_parent_cycle[REBUILD_CYCLES];
    glmrt_token entry_tokens[REBUILD_CYCLES][2];
    int32_t owner_cycle[REBUILD_POOL_PAGES];
    int ok = glmrt_kv_pages_init(&pages, REBUILD_POOL_PAGES, 2, 1, &error) == GLMRT_OK;
    pages.hash_seed = seed;
    int32_t capacity = pages.table_mask + 1;
    int32_t rebuilds = 0;
    for (int32_t i = 0; i < REBUILD_POOL_PAGES; ++i) {
        owner_cycle[i] = -1;
    }
    for (int32_t cycle = 0; ok && cycle < REBUILD_CYCLES; ++cycle) {
        glmrt_page_id page;
        ok = glmrt_kv_pages_alloc(&pages, 1, &page, &error) == GLMRT_OK;
        if (!ok) {
            break;
        }
        owner_cycle[page] = -1;
        glmrt_page_id parent = GLMRT_PAGE_NONE;
        entry_parent_cycle[cycle] = -1;
        if (cycle % 3 != 0 && rebuild_entry_expected(entry_page, entry_parent_cycle, owner_cycle, cycle - 1)) {
            parent = entry_page[cycle - 1];
            entry_parent_cycle[cycle] = cycle - 1;
        }
        entry_page[cycle] = page;
        entry_tokens[cycle][0] = cycle;
        entry_tokens[cycle][1] = cycle % 5;
        int32_t tombstones_before = pages.num_tombstones;
        glmrt_prefix_cache_register(&pages, page, parent, entry_tokens[cycle]);
        ok = glmrt_kv_pages_is_registered(&pages, page);
        owner_cycle[page] = cycle;
        rebuilds += tombstones_before >= 2 && pages.num_tombstones == 0;
        ok = ok && pages.num_registered + pages.num_tombstones <= capacity * 3 / 4;
        ok = ok && glmrt_kv_pages_release(&pages, &page, 1, &error) == GLMRT_OK;
        for (int32_t past = 0; ok && past <= cycle; ++past) {
            glmrt_page_id lookup_parent =
                entry_parent_cycle[past] < 0 ? GLMRT_PAGE_NONE : entry_page[entry_parent_cycle[past]];
            glmrt_page_id expected = rebuild_entry_expected(entry_page, entry_parent_cycle, owner_cycle, past)
                                         ? entry_page[past]
                                         : GLMRT_PAGE_NONE;
            glmrt_page_id found = glmrt_prefix_cache_lookup(&pages, lookup_parent, entry_tokens[past]);
            if (found != expected) {
                fprintf(stderr, "rebuild seed %llu cycle %d: entry %d found page %d, expected %d\n",
                        (unsigned long long)seed, cycle, past, found, expected);
                ok = 0;
            }
        }
        ok = ok && pool_is_consistent(&pages);
    }
    if (!ok) {
        fprintf(stderr, "rebuild seed %llu failed: %s\n", (unsigned long long)seed, error.message);
    }
    ok = ok && pages.num_evictions == REBUILD_CYCLES - REBUILD_POOL_PAGES;
    glmrt_kv_pages_free(&pages);
    *out_rebuilds = rebuilds;
    return ok;
}

static void test_table_rebuild_keeps_lookups(void)
{
    int all_ok = 1;
    int32_t fewest = REBUILD_CYCLES;
    for (uint64_t seed = 1; seed <= 16; ++seed) {
        int32_t rebuilds = 0;
        all_ok = all_ok && run_rebuild_cycles(seed * 0x9E3779B97F4A7C15ull, &rebuilds);
        fewest = rebuilds < fewest ? rebuilds : fewest;
    }
    expect(all_ok, "lookups stay correct over 200 register and evict cycles in a table of 16");
    expect(fewest >= 3, "the prefix table is rebuilt several times under every seed");
}

static void test_check_detects_corruption(void)
{
    glmrt_kv_pages pages;
    glmrt_error error;
    glmrt_page_id ids[4];
    glmrt_token tokens[4] = {5, 6, 7, 8};
    expect(glmrt_kv_pages_init(&pages, 6, 2, 1, &error) == GLMRT_OK, "init for corruption");
    expect(glmrt_kv_pages_alloc(&pages, 4, ids, &error) == GLMRT_OK, "alloc for corruption");
    register_chain(&pages, ids, tokens, 2);
    expect(glmrt_kv_pages_release(&pages, ids, 1, &error) == GLMRT_OK, "cache the root for corruption");
    glmrt_page_id cached = ids[0];
    glmrt_page_id held_registered = ids[1];
    glmrt_page_id held = ids[2];
    glmrt_page_id free_page = pages.free_stack[0];
    expect(pool_is_consistent(&pages), "the pool passes before corruption");
    pages.ref_count[free_page] = 1;
    expect(glmrt_kv_pages_check(&pages, &error) == GLMRT_ERR_INVARIANT, "a held page on the free stack");
    pages.ref_count[free_page] = 0;
    glmrt_page_id second_free = pages.free_stack[1];
    pages.free_stack[1] = pages.free_stack[0];
    expect(glmrt_kv_pages_check(&pages, &error) == GLMRT_ERR_INVARIANT, "a page twice on the free stack");
    pages.free_stack[1] = second_free;
    pages.ref_count[cached] = 1;
    expect(glmrt_kv_pages_check(&pages, &error) == GLMRT_ERR_INVARIANT, "a held page on the cached list");
    pages.ref_count[cached] = 0;
    pages.num_cached += 1;
    expect(glmrt_kv_pages_check(&pages, &error) == GLMRT_ERR_INVARIANT, "a wrong cached count");
    pages.num_cached -= 1;
    pages.lru_prev[cached] = held;
    expect(glmrt_kv_pages_check(&pages, &error) == GLMRT_ERR_INVARIANT, "a broken cached link");
    pages.lru_prev[cached] = GLMRT_PAGE_NONE;
    pages.ref_count[held] = 0;
    expect(glmrt_kv_pages_check(&pages, &error) == GLMRT_ERR_INVARIANT, "a lost page");
    pages.ref_count[held] = -1;
    expect(glmrt_kv_pages_check(&pages, &error) == GLMRT_ERR_INVARIANT, "a negative holder count");
    pages.ref_count[held] = 1;
    pages.page_key[free_page] = 3;
    expect(glmrt_kv_pages_check(&pages, &error) == GLMRT_ERR_INVARIANT, "a registered page on the free stack");
    pages.page_key[free_page] = 0;
    pages.page_key[held_registered] ^= 2;
    expect(glmrt_kv_pages_check(&pages, &error) == GLMRT_ERR_INVARIANT, "a registered page under a wrong key");
    pages.page_key[held_registered] ^= 2;
    pages.page_tokens[(size_t)held_registered * 2] += 1;
    expect(glmrt_kv_pages_check(&pages, &error) == GLMRT_ERR_INVARIANT, "registered tokens changed under the key");
    pages.page_tokens[(size_t)held_registered * 2] -= 1;
    pages.num_registered += 1;
    expect(glmrt_kv_pages_check(&pages, &error) == GLMRT_ERR_INVARIANT, "a wrong registered count");
    pages.num_registered -= 1;
    int32_t slot = -1;
    for (int32_t i = 0; i <= pages.table_mask; ++i) {
        slot = pages.table[i] == held_registered ? i : slot;
    }
    expect(slot >= 0, "the registered page has a table slot");
    if (slot >= 0) {
        pages.table[slot] = GLMRT_PAGE_NONE;
        expect(glmrt_kv_pages_check(&pages, &error) == GLMRT_ERR_INVARIANT, "a registered page missing from the table");
        pages.table[slot] = held_registered;
    }
    expect(pool_is_consistent(&pages), "the restored pool passes");
    expect(glmrt_kv_pages_release(&pages, ids + 1, 3, &error) == GLMRT_OK && pool_is_consistent(&pages),
           "release after corruption");
    glmrt_kv_pages_free(&pages);
}

typedef struct random_run {
    glmrt_kv_pages pages;
    glmrt_error error;
    uint64_t state;
    int32_t num_pages;
    int32_t page_size;
    int32_t caching;
    uint32_t alphabet;
    int32_t refs[RANDOM_POOL_PAGES];
    int32_t is_free[RANDOM_POOL_PAGES];
    int32_t num_free;
    glmrt_page_id lru[RANDOM_POOL_PAGES];
    int32_t num_cached;
    int32_t registered[RANDOM_POOL_PAGES];
    glmrt_page_id parent[RANDOM_POOL_PAGES];
    uint32_t parent_generation[RANDOM_POOL_PAGES];
    uint32_t generation[RANDOM_POOL_PAGES];
    glmrt_token tokens[RANDOM_POOL_PAGES][MAX_PAGE_SIZE];
    int64_t evictions;
    int32_t holder_count[RANDOM_HOLDERS];
    glmrt_page_id holder_ids[RANDOM_HOLDERS][RANDOM_HOLDER_CAPACITY];
    int64_t lookup_hits;
    int64_t registrations;
    int64_t ignored_registrations;
    int64_t equal_entries;
    int64_t cached_acquires;
    int64_t refused_releases;
    int64_t refused_allocs;
} random_run;

static uint32_t run_random(random_run *run, uint32_t bound)
{
    return next_random(&run->state, bound);
}

static glmrt_page_id model_lookup(const random_run *run, glmrt_page_id parent, const glmrt_token *tokens)
{
    if (!run->caching || (parent != GLMRT_PAGE_NONE && !run->registered[parent])) {
        return GLMRT_PAGE_NONE;
    }
    uint32_t parent_generation = parent == GLMRT_PAGE_NONE ? 0u : run->generation[parent];
    for (glmrt_page_id page = 0; page < run->num_pages; ++page) {
        if (run->registered[page] && run->parent[page] == parent &&
            run->parent_generation[page] == parent_generation &&
            memcmp(run->tokens[page], tokens, (size_t)run->page_size * sizeof(glmrt_token)) == 0) {
            return page;
        }
    }
    return GLMRT_PAGE_NONE;
}

static int model_register(random_run *run, glmrt_page_id page, glmrt_page_id parent, const glmrt_token *tokens)
{
    if (!run->caching || run->registered[page] || (parent != GLMRT_PAGE_NONE && !run->registered[parent]) ||
        model_lookup(run, parent, tokens) != GLMRT_PAGE_NONE) {
        return 0;
    }
    run->registered[page] = 1;
    run->parent[page] = parent;
    run->parent_generation[page] = parent == GLMRT_PAGE_NONE ? 0u : run->generation[parent];
    memcpy(run->tokens[page], tokens, (size_t)run->page_size * sizeof(glmrt_token));
    return 1;
}

static void model_lru_remove(random_run *run, int32_t index)
{
    memmove(run->lru + index, run->lru + index + 1, (size_t)(run->num_cached - index - 1) * sizeof(glmrt_page_id));
    run->num_cached -= 1;
}

static int model_take(random_run *run, glmrt_page_id page)
{
    if (page < 0 || page >= run->num_pages) {
        return 0;
    }
    if (run->num_free > 0) {
        if (!run->is_free[page]) {
            return 0;
        }
        run->is_free[page] = 0;
        run->num_free -= 1;
    } else {
        if (run->num_cached == 0 || run->lru[0] != page) {
            return 0;
        }
        model_lru_remove(run, 0);
        run->registered[page] = 0;
        run->parent[page] = GLMRT_PAGE_NONE;
        run->generation[page] += 1;
        run->evictions += 1;
    }
    run->refs[page] = 1;
    return 1;
}

static void model_release(random_run *run, glmrt_page_id page)
{
    run->refs[page] -= 1;
    if (run->refs[page] > 0) {
        return;
    }
    if (run->registered[page]) {
        run->lru[run->num_cached++] = page;
    } else {
        run->is_free[page] = 1;
        run->num_free += 1;
    }
}

static void model_acquire(random_run *run, glmrt_page_id page)
{
    if (run->refs[page] == 0) {
        for (int32_t i = 0; i < run->num_cached; ++i) {
            if (run->lru[i] == page) {
                model_lru_remove(run, i);
                break;
            }
        }
    }
    run->refs[page] += 1;
}

static void random_tokens(random_run *run, glmrt_token *tokens)
{
    for (int32_t i = 0; i < run->page_size; ++i) {
        tokens[i] = (glmrt_token)run_random(run, run->alphabet);
    }
}

static glmrt_page_id random_registered_page(random_run *run)
{
    int32_t count = 0;
    glmrt_page_id found[RANDOM_POOL_PAGES];
    for (glmrt_page_id page = 0; page < run->num_pages; ++page) {
        if (run->registered[page]) {
            found[count++] = page;
        }
    }
    return count == 0 ? GLMRT_PAGE_NONE : found[run_random(run, (uint32_t)count)];
}

static int random_holder_with_pages(random_run *run)
{
    int32_t start = (int32_t)run_random(run, RANDOM_HOLDERS);
    for (int32_t i = 0; i < RANDOM_HOLDERS; ++i) {
        int32_t holder = (start + i) % RANDOM_HOLDERS;
        if (run->holder_count[holder] > 0) {
            return holder;
        }
    }
    return -1;
}

static int random_alloc(random_run *run)
{
    int32_t holder = (int32_t)run_random(run, RANDOM_HOLDERS);
    int32_t count = (int32_t)run_random(run, 5);
    int32_t room = RANDOM_HOLDER_CAPACITY - run->holder_count[holder];
    count = count > room ? room : count;
    glmrt_page_id *out = run->holder_ids[holder] + run->holder_count[holder];
    if (count > run->num_free + run->num_cached) {
        pool_snapshot before;
        snapshot_take(&run->pages, &before);
        run->refused_allocs += 1;
        return glmrt_kv_pages_alloc(&run->pages, count, out, &run->error) == GLMRT_ERR_OUT_OF_PAGES &&
               snapshot_matches(&run->pages, &before);
    }
    if (glmrt_kv_pages_alloc(&run->pages, count, out, &run->error) != GLMRT_OK) {
        return 0;
    }
    for (int32_t i = 0; i < count; ++i) {
        if (!model_take(run, out[i])) {
            snprintf(run->error.message, sizeof(run->error.message), "alloc returned page %d out of order", out[i]);
            return 0;
        }
    }
    run->holder_count[holder] += count;
    return 1;
}

static int random_release(random_run *run)
{
    int32_t holder = (int32_t)run_random(run, RANDOM_HOLDERS);
    int32_t held = run->holder_count[holder];
    if (held == 0) {
        return glmrt_kv_pages_release(&run->pages, NULL, 0, &run->error) == GLMRT_OK;
    }
    glmrt_page_id *ids = run->holder_ids[holder];
    int32_t count = 1 + (int32_t)run_random(run, (uint32_t)(held < RANDOM_MAX_BATCH ? held : RANDOM_MAX_BATCH));
    glmrt_page_id chosen[RANDOM_MAX_BATCH];
    for (int32_t i = 0; i < count; ++i) {
        int32_t pick = i + (int32_t)run_random(run, (uint32_t)(held - i));
        glmrt_page_id swap = ids[i];
        ids[i] = ids[pick];
        ids[pick] = swap;
        chosen[i] = ids[i];
    }
    if (glmrt_kv_pages_release(&run->pages, chosen, count, &run->error) != GLMRT_OK) {
        return 0;
    }
    for (int32_t i = count - 1; i >= 0; --i) {
        model_release(run, chosen[i]);
    }
    memmove(ids, ids + count, (size_t)(held - count) * sizeof(glmrt_page_id));
    run->holder_count[holder] -= count;
    return 1;
}

static int random_over_release(random_run *run)
{
    glmrt_page_id page = (glmrt_page_id)run_random(run, (uint32_t)run->num_pages);
    int32_t times = run->refs[page] + 1;
    if (times > RANDOM_MAX_BATCH - 2) {
        return 1;
    }
    glmrt_page_id ids[RANDOM_MAX_BATCH];
    int32_t count = 0;
    int32_t holder = random_holder_with_pages(run);
    if (holder >= 0) {
        for (int32_t i = 0; i < run->holder_count[holder] && count < 2; ++i) {
            if (run->holder_ids[holder][i] != page && run_random(run, 2) == 0) {
                ids[count++] = run->holder_ids[holder][i];
            }
        }
    }
    for (int32_t i = 0; i < times; ++i) {
        ids[count++] = page;
    }
    for (int32_t i = count - 1; i > 0; --i) {
        int32_t pick = (int32_t)run_random(run, (uint32_t)(i + 1));
        glmrt_page_id swap = ids[i];
        ids[i] = ids[pick];
        ids[pick] = swap;
    }
    pool_snapshot before;
    snapshot_take(&run->pages, &before);
    run->refused_releases += 1;
    return glmrt_kv_pages_release(&run->pages, ids, count, &run->error) == GLMRT_ERR_INVARIANT &&
           snapshot_matches(&run->pages, &before);
}

static int random_acquire(random_run *run)
{
    int32_t holder = (int32_t)run_random(run, RANDOM_HOLDERS);
    if (run->holder_count[holder] >= RANDOM_HOLDER_CAPACITY) {
        return 1;
    }
    glmrt_page_id page;
    if (run->num_cached > 0 && run_random(run, 2) == 0) {
        page = run->lru[run_random(run, (uint32_t)run->num_cached)];
        run->cached_acquires += 1;
    } else {
        int32_t source = random_holder_with_pages(run);
        if (source < 0) {
            return 1;
        }
        page = run->holder_ids[source][run_random(run, (uint32_t)run->holder_count[source])];
    }
    int32_t before = run->pages.ref_count[page];
    if (glmrt_kv_pages_acquire(&run->pages, page, &run->error) != GLMRT_OK) {
        return 0;
    }
    model_acquire(run, page);
    run->holder_ids[holder][run->holder_count[holder]++] = page;
    return run->pages.ref_count[page] == before + 1;
}

static int random_register(random_run *run)
{
    int32_t holder = random_holder_with_pages(run);
    if (holder < 0) {
        return 1;
    }
    const glmrt_page_id *ids = run->holder_ids[holder];
    int32_t index = (int32_t)run_random(run, (uint32_t)run->holder_count[holder]);
    glmrt_page_id page = ids[index];
    glmrt_page_id parent = GLMRT_PAGE_NONE;
    uint32_t choice = run_random(run, 4);
    if (choice == 1) {
        parent = random_registered_page(run);
    } else if (choice == 2) {
        parent = (glmrt_page_id)run_random(run, (uint32_t)run->num_pages);
    } else if (choice == 3 && index > 0) {
        parent = ids[index - 1];
    }
    glmrt_token tokens[MAX_PAGE_SIZE];
    random_tokens(run, tokens);
    run->equal_entries += run->caching && !run->registered[page] &&
                          (parent == GLMRT_PAGE_NONE || run->registered[parent]) &&
                          model_lookup(run, parent, tokens) != GLMRT_PAGE_NONE;
    int expected = model_register(run, page, parent, tokens);
    glmrt_prefix_cache_register(&run->pages, page, parent, tokens);
    run->registrations += expected;
    run->ignored_registrations += !expected;
    int ok = glmrt_kv_pages_is_registered(&run->pages, page) == run->registered[page];
    if (ok && run->registered[page]) {
        ok = glmrt_prefix_cache_lookup(&run->pages, run->parent[page], run->tokens[page]) ==
             model_lookup(run, run->parent[page], run->tokens[page]);
    }
    if (!ok) {
        snprintf(run->error.message, sizeof(run->error.message), "register of page %d under %d disagrees", page,
                 parent);
    }
    return ok;
}

static int random_lookup(random_run *run)
{
    glmrt_page_id parent = GLMRT_PAGE_NONE;
    glmrt_token tokens[MAX_PAGE_SIZE];
    uint32_t choice = run_random(run, 3);
    glmrt_page_id known = random_registered_page(run);
    if (choice == 0 && known != GLMRT_PAGE_NONE) {
        parent = run->parent[known];
        memcpy(tokens, run->tokens[known], sizeof(tokens));
        if (run_random(run, 4) == 0) {
            tokens[run_random(run, (uint32_t)run->page_size)] = (glmrt_token)run_random(run, run->alphabet);
        }
    } else {
        if (choice == 1) {
            parent = known;
        } else if (run_random(run, 2) == 0) {
            parent = (glmrt_page_id)run_random(run, (uint32_t)run->num_pages);
        }
        random_tokens(run, tokens);
    }
    glmrt_page_id expected = model_lookup(run, parent, tokens);
    glmrt_page_id found = glmrt_prefix_cache_lookup(&run->pages, parent, tokens);
    run->lookup_hits += found != GLMRT_PAGE_NONE;
    if (found != expected) {
        snprintf(run->error.message, sizeof(run->error.message), "lookup under %d found %d, expected %d", parent,
                 found, expected);
    }
    return found == expected;
}

static int random_state_matches(random_run *run)
{
    const glmrt_kv_pages *pages = &run->pages;
    int32_t counted[RANDOM_POOL_PAGES];
    memset(counted, 0, sizeof(counted));
    for (int32_t holder = 0; holder < RANDOM_HOLDERS; ++holder) {
        for (int32_t i = 0; i < run->holder_count[holder]; ++i) {
            counted[run->holder_ids[holder][i]] += 1;
        }
    }
    int32_t held = 0;
    for (glmrt_page_id page = 0; page < run->num_pages; ++page) {
        if (pages->ref_count[page] != counted[page] || run->refs[page] != counted[page]) {
            snprintf(run->error.message, sizeof(run->error.message), "page %d has %d holders, the test tracks %d",
                     page, pages->ref_count[page], counted[page]);
            return 0;
        }
        if (glmrt_kv_pages_is_registered(pages, page) != run->registered[page] ||
            pages->generation[page] != run->generation[page]) {
            snprintf(run->error.message, sizeof(run->error.message), "page %d registration or generation differs",
                     page);
            return 0;
        }
        held += counted[page] > 0;
    }
    if (pages->num_free + pages->num_cached + held != pages->num_pages || pages->num_free != run->num_free ||
        glmrt_kv_pages_available(pages) != run->num_free + run->num_cached) {
        snprintf(run->error.message, sizeof(run->error.message), "%d free + %d cached + %d held != %d pages",
                 pages->num_free, pages->num_cached, held, pages->num_pages);
        return 0;
    }
    if (!lru_order_is(pages, run->lru, run->num_cached) || pages->num_evictions != run->evictions) {
        snprintf(run->error.message, sizeof(run->error.message), "cached order or eviction count differs");
        return 0;
    }
    return glmrt_kv_pages_check(pages, &run->error) == GLMRT_OK;
}

static int random_step(random_run *run, uint32_t kind)
{
    if (kind < 25) {
        return random_alloc(run);
    }
    if (kind < 45) {
        return random_release(run);
    }
    if (kind < 50) {
        return random_over_release(run);
    }
    if (kind < 62) {
        return random_acquire(run);
    }
    if (kind < 82) {
        return random_register(run);
    }
    return random_lookup(run);
}

static void run_random_operations(int32_t page_size, uint32_t alphabet, int32_t caching, uint64_t seed)
{
    static random_run run;
    char what[160];
    memset(&run, 0, sizeof(run));
    run.state = seed;
    run.num_pages = RANDOM_POOL_PAGES;
    run.page_size = page_size;
    run.caching = caching;
    run.alphabet = alphabet;
    run.num_free = RANDOM_POOL_PAGES;
    for (glmrt_page_id page = 0; page < RANDOM_POOL_PAGES; ++page) {
        run.is_free[page] = 1;
        run.parent[page] = GLMRT_PAGE_NONE;
    }
    snprintf(what, sizeof(what), "init for random operations, page size %d, caching %d", page_size, caching);
    if (!expect(glmrt_kv_pages_init(&run.pages, RANDOM_POOL_PAGES, page_size, caching, &run.error) == GLMRT_OK,
                what)) {
        return;
    }
    run.pages.hash_seed = seed * 0xD1B54A32D192ED03ull;
    int failures = 0;
    int checks = 0;
    for (int op = 0; op < RANDOM_OPERATIONS && failures == 0; ++op) {
        uint32_t kind = run_random(&run, 100);
        glmrt_error_clear(&run.error);
        if (!random_step(&run, kind)) {
            fprintf(stderr, "seed %llu page size %d: random operation %d of kind %u failed: %s\n",
                    (unsigned long long)seed, page_size, op, kind, run.error.message);
            failures += 1;
        }
        if ((op + 1) % RANDOM_CHECK_EVERY == 0) {
            checks += 1;
            if (!random_state_matches(&run)) {
                fprintf(stderr, "seed %llu page size %d: pool check after operation %d failed: %s\n",
                        (unsigned long long)seed, page_size, op, run.error.message);
                failures += 1;
            }
        }
    }
    snprintf(what, sizeof(what), "100000 random operations keep the pool consistent (page size %d, caching %d)",
             page_size, caching);
    expect(failures == 0, what);
    expect(checks == RANDOM_OPERATIONS / RANDOM_CHECK_EVERY || failures != 0, "every batch of operations was checked");
    expect(run.refused_allocs > 0 && run.refused_releases > 0, "random operations hit refusals");
    if (caching) {
        snprintf(what, sizeof(what),
                 "random operations hit lookups (%lld), evictions (%lld), equal entries (%lld), cached acquires (%lld)",
                 (long long)run.lookup_hits, (long long)run.evictions, (long long)run.equal_entries,
                 (long long)run.cached_acquires);
        expect(run.lookup_hits > 1000 && run.evictions > 1000 && run.registrations > 1000 &&
                   run.ignored_registrations > 1000 && run.equal_entries > 500 && run.cached_acquires > 1000,
               what);
    } else {
        expect(run.pages.num_registered == 0 && run.pages.num_cached == 0 && run.lookup_hits == 0,
               "random operations without caching never cache");
    }
    int released = 1;
    for (int32_t holder = 0; holder < RANDOM_HOLDERS; ++holder) {
        released = released && glmrt_kv_pages_release(&run.pages, run.holder_ids[holder], run.holder_count[holder],
                                                       &run.error) == GLMRT_OK;
        run.holder_count[holder] = 0;
    }
    expect(released, "every holder releases its pages after random operations");
    expect(run.pages.num_free + run.pages.num_cached == RANDOM_POOL_PAGES && pool_is_consistent(&run.pages),
           "all pages return after random operations");
    glmrt_kv_pages_free(&run.pages);
}

static void test_random_operations_keep_the_pool_consistent(void)
{
    run_random_operations(2, 2, 1, 0x2545F4914F6CDD1Dull);
    run_random_operations(3, 2, 1, 0x9E3779B97F4A7C15ull);
    run_random_operations(4, 2, 1, 0xBF58476D1CE4E5B9ull);
    run_random_operations(2, 3, 0, 0x94D049BB133111EBull);
}

int main(void)
{
    test_init_rejects_bad_arguments();
    test_pages_for_tokens_rounds_up();
    test_alloc_release_and_exhaustion();
    test_bad_arguments_change_nothing();
    test_refused_release_leaves_later_releases_valid();
    test_shared_pages();
    test_caching_off_registers_nothing();
    test_prefix_chain_lookup();
    test_cached_pages_evict_least_recent_first();
    test_generation_blocks_stale_children();
    test_table_rebuild_keeps_lookups();
    test_check_detects_corruption();
    test_random_operations_keep_the_pool_consistent();
    return report_checks();
}
