#include "kv_pages.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define RANDOM_POOL_PAGES 64
#define RANDOM_OWNERS 8
#define RANDOM_OPERATIONS 100000
#define RANDOM_CHECK_EVERY 100

typedef struct pool_snapshot {
    int32_t num_free;
    glmrt_page_id free_stack[RANDOM_POOL_PAGES];
    int64_t page_owner[RANDOM_POOL_PAGES];
} pool_snapshot;

typedef struct owner_pages {
    int32_t count;
    glmrt_page_id ids[RANDOM_POOL_PAGES];
} owner_pages;

static int num_passed;
static int num_failed;
static uint64_t random_state = 0x2545F4914F6CDD1Dull;

static int expect(int ok, const char *what)
{
    if (ok) {
        num_passed += 1;
    } else {
        num_failed += 1;
        fprintf(stderr, "FAILED: %s\n", what);
    }
    return ok;
}

static uint32_t random_below(uint32_t bound)
{
    random_state ^= random_state << 13;
    random_state ^= random_state >> 7;
    random_state ^= random_state << 17;
    return (uint32_t)((random_state >> 11) % bound);
}

static void snapshot_take(const glmrt_kv_pages *pages, pool_snapshot *snapshot)
{
    memset(snapshot, 0, sizeof(*snapshot));
    snapshot->num_free = pages->num_free;
    memcpy(snapshot->free_stack, pages->free_stack, (size_t)pages->num_free * sizeof(glmrt_page_id));
    memcpy(snapshot->page_owner, pages->page_owner, (size_t)pages->num_pages * sizeof(int64_t));
}

static int snapshot_matches(const glmrt_kv_pages *pages, const pool_snapshot *snapshot)
{
    return pages->num_free == snapshot->num_free &&
           memcmp(snapshot->free_stack, pages->free_stack, (size_t)pages->num_free * sizeof(glmrt_page_id)) == 0 &&
           memcmp(snapshot->page_owner, pages->page_owner, (size_t)pages->num_pages * sizeof(int64_t)) == 0;
}

static void test_init_rejects_bad_sizes(void)
{
    glmrt_kv_pages pages;
    glmrt_error error;
    glmrt_error_clear(&error);
    expect(glmrt_kv_pages_init(&pages, 0, 16, &error) == GLMRT_ERR_INVALID_ARGUMENT, "init rejects 0 pages");
    expect(strstr(error.message, "at least 1 page") != NULL, "init explains the page count");
    expect(glmrt_kv_pages_init(&pages, 4, 0, &error) == GLMRT_ERR_INVALID_ARGUMENT, "init rejects page size 0");
    expect(glmrt_kv_pages_init(NULL, 4, 4, &error) == GLMRT_ERR_INVALID_ARGUMENT, "init rejects a NULL pool");
    expect(glmrt_kv_pages_init(&pages, 4, 16, &error) == GLMRT_OK, "init accepts 4 pages of 16");
    expect(pages.num_free == 4 && pages.num_pages == 4 && pages.page_size == 16, "init sizes the pool");
    expect(glmrt_kv_pages_check(&pages, 0, &error) == GLMRT_OK, "fresh pool passes the check");
    glmrt_kv_pages_free(&pages);
    glmrt_kv_pages_free(&pages);
    expect(pages.free_stack == NULL && pages.num_pages == 0, "free twice leaves an empty pool");
    expect(glmrt_kv_pages_check(&pages, -1, &error) == GLMRT_ERR_INVARIANT, "check rejects a freed pool");
}

static void test_pages_for_tokens_rounds_up(void)
{
    glmrt_kv_pages pages;
    glmrt_error error;
    expect(glmrt_kv_pages_init(&pages, 8, 16, &error) == GLMRT_OK, "init for rounding");
    expect(glmrt_kv_pages_for_tokens(&pages, 0) == 0, "0 tokens need 0 pages");
    expect(glmrt_kv_pages_for_tokens(&pages, 1) == 1, "1 token needs 1 page");
    expect(glmrt_kv_pages_for_tokens(&pages, 16) == 1, "16 tokens need 1 page");
    expect(glmrt_kv_pages_for_tokens(&pages, 17) == 2, "17 tokens need 2 pages");
    expect(glmrt_kv_pages_for_tokens(&pages, 128) == 8, "128 tokens need 8 pages");
    expect(glmrt_kv_pages_can_alloc(&pages, 8) && !glmrt_kv_pages_can_alloc(&pages, 9), "can_alloc bounds");
    expect(!glmrt_kv_pages_can_alloc(&pages, -1), "can_alloc rejects a negative count");
    glmrt_kv_pages_free(&pages);
}

static void test_alloc_is_all_or_nothing(void)
{
    glmrt_kv_pages pages;
    glmrt_error error;
    glmrt_page_id first[8];
    glmrt_page_id second[8];
    pool_snapshot before;
    expect(glmrt_kv_pages_init(&pages, 8, 4, &error) == GLMRT_OK, "init for exhaustion");
    expect(glmrt_kv_pages_alloc(&pages, 1, 5, first, &error) == GLMRT_OK, "alloc 5 of 8");
    expect(pages.num_free == 3, "3 pages stay free");
    for (int i = 0; i < 5; ++i) {
        expect(pages.page_owner[first[i]] == 1, "allocated pages belong to owner 1");
    }
    snapshot_take(&pages, &before);
    second[0] = -7;
    expect(glmrt_kv_pages_alloc(&pages, 2, 4, second, &error) == GLMRT_ERR_OUT_OF_PAGES, "alloc 4 of 3 fails");
    expect(strstr(error.message, "needed 4 pages, 3 free") != NULL, "exhaustion message names both counts");
    expect(snapshot_matches(&pages, &before) && second[0] == -7, "failed alloc changes nothing");
    expect(glmrt_kv_pages_alloc(&pages, 2, 0, NULL, &error) == GLMRT_OK, "alloc of 0 pages succeeds");
    expect(glmrt_kv_pages_alloc(&pages, 2, 3, second, &error) == GLMRT_OK, "alloc the last 3");
    expect(pages.num_free == 0 && glmrt_kv_pages_check(&pages, 8, &error) == GLMRT_OK, "pool is full");
    expect(glmrt_kv_pages_alloc(&pages, 3, 1, second + 3, &error) == GLMRT_ERR_OUT_OF_PAGES, "full pool refuses");
    expect(glmrt_kv_pages_release(&pages, 1, first, 5, &error) == GLMRT_OK, "owner 1 releases");
    expect(glmrt_kv_pages_release(&pages, 2, second, 3, &error) == GLMRT_OK, "owner 2 releases");
    expect(pages.num_free == 8 && glmrt_kv_pages_check(&pages, 0, &error) == GLMRT_OK, "pool is empty again");
    glmrt_kv_pages_free(&pages);
}

static void test_alloc_rejects_bad_arguments(void)
{
    glmrt_kv_pages pages;
    glmrt_error error;
    glmrt_page_id ids[4];
    pool_snapshot before;
    expect(glmrt_kv_pages_init(&pages, 4, 4, &error) == GLMRT_OK, "init for arguments");
    snapshot_take(&pages, &before);
    expect(glmrt_kv_pages_alloc(&pages, 1, -1, ids, &error) == GLMRT_ERR_INVALID_ARGUMENT, "negative count");
    expect(glmrt_kv_pages_alloc(&pages, 1, 2, NULL, &error) == GLMRT_ERR_INVALID_ARGUMENT, "NULL output");
    expect(glmrt_kv_pages_alloc(&pages, -1, 1, ids, &error) == GLMRT_ERR_INVALID_ARGUMENT, "owner -1");
    expect(glmrt_kv_pages_alloc(NULL, 1, 1, ids, &error) == GLMRT_ERR_INVALID_ARGUMENT, "NULL pool");
    expect(glmrt_kv_pages_release(&pages, 1, NULL, 1, &error) == GLMRT_ERR_INVALID_ARGUMENT, "NULL release ids");
    expect(glmrt_kv_pages_release(&pages, 1, ids, -2, &error) == GLMRT_ERR_INVALID_ARGUMENT, "negative release");
    expect(snapshot_matches(&pages, &before), "rejected arguments change nothing");
    glmrt_kv_pages_free(&pages);
}

static void test_release_rejects_double_and_foreign_frees(void)
{
    glmrt_kv_pages pages;
    glmrt_error error;
    glmrt_page_id mine[3];
    glmrt_page_id theirs[2];
    pool_snapshot before;
    expect(glmrt_kv_pages_init(&pages, 8, 4, &error) == GLMRT_OK, "init for release");
    expect(glmrt_kv_pages_alloc(&pages, 10, 3, mine, &error) == GLMRT_OK, "owner 10 allocates");
    expect(glmrt_kv_pages_alloc(&pages, 20, 2, theirs, &error) == GLMRT_OK, "owner 20 allocates");
    expect(glmrt_kv_pages_release(&pages, 10, mine, 1, &error) == GLMRT_OK, "owner 10 releases one page");
    snapshot_take(&pages, &before);
    expect(glmrt_kv_pages_release(&pages, 10, mine, 1, &error) == GLMRT_ERR_INVARIANT, "double free rejected");
    expect(strstr(error.message, "double free") != NULL, "double free is named");
    expect(snapshot_matches(&pages, &before), "double free changes nothing");
    glmrt_page_id repeated[2] = {mine[1], mine[1]};
    expect(glmrt_kv_pages_release(&pages, 10, repeated, 2, &error) == GLMRT_ERR_INVARIANT,
           "a page twice in one release is rejected");
    expect(snapshot_matches(&pages, &before), "repeated page in one release changes nothing");
    expect(glmrt_kv_pages_release(&pages, 20, mine + 1, 1, &error) == GLMRT_ERR_INVARIANT,
           "foreign release rejected");
    expect(strstr(error.message, "owned by 10") != NULL, "foreign release names the owner");
    expect(snapshot_matches(&pages, &before), "foreign release changes nothing");
    glmrt_page_id mixed[3] = {theirs[0], theirs[1], mine[2]};
    expect(glmrt_kv_pages_release(&pages, 20, mixed, 3, &error) == GLMRT_ERR_INVARIANT,
           "release with a foreign page at the end is rejected");
    expect(snapshot_matches(&pages, &before), "partly valid release changes nothing");
    glmrt_page_id outside[2] = {theirs[0], 8};
    expect(glmrt_kv_pages_release(&pages, 20, outside, 2, &error) == GLMRT_ERR_INVARIANT,
           "release of a page outside the pool is rejected");
    glmrt_page_id negative = -1;
    expect(glmrt_kv_pages_release(&pages, 20, &negative, 1, &error) == GLMRT_ERR_INVARIANT,
           "release of page -1 is rejected");
    expect(snapshot_matches(&pages, &before), "out of range release changes nothing");
    expect(glmrt_kv_pages_check(&pages, 4, &error) == GLMRT_OK, "pool is consistent after rejections");
    expect(glmrt_kv_pages_check(&pages, 5, &error) == GLMRT_ERR_INVARIANT, "check compares the expected count");
    expect(glmrt_kv_pages_release(&pages, 10, mine + 1, 2, &error) == GLMRT_OK, "owner 10 releases the rest");
    expect(glmrt_kv_pages_release(&pages, 20, theirs, 2, &error) == GLMRT_OK, "owner 20 releases");
    expect(glmrt_kv_pages_check(&pages, 0, &error) == GLMRT_OK, "everything is free");
    glmrt_kv_pages_free(&pages);
}

static void test_check_detects_corruption(void)
{
    glmrt_kv_pages pages;
    glmrt_error error;
    glmrt_page_id ids[2];
    expect(glmrt_kv_pages_init(&pages, 6, 4, &error) == GLMRT_OK, "init for corruption");
    expect(glmrt_kv_pages_alloc(&pages, 3, 2, ids, &error) == GLMRT_OK, "alloc for corruption");
    glmrt_page_id free_page = pages.free_stack[0];
    pages.page_owner[free_page] = 9;
    expect(glmrt_kv_pages_check(&pages, -1, &error) == GLMRT_ERR_INVARIANT, "owned page on the free list");
    pages.page_owner[free_page] = GLMRT_PAGE_OWNER_NONE;
    glmrt_page_id held = pages.free_stack[1];
    pages.free_stack[1] = pages.free_stack[0];
    expect(glmrt_kv_pages_check(&pages, -1, &error) == GLMRT_ERR_INVARIANT, "page twice on the free list");
    pages.free_stack[1] = held;
    pages.page_owner[ids[0]] = GLMRT_PAGE_OWNER_NONE;
    expect(glmrt_kv_pages_check(&pages, -1, &error) == GLMRT_ERR_INVARIANT, "lost page is detected");
    pages.page_owner[ids[0]] = 3;
    pages.page_owner[ids[1]] = -5;
    expect(glmrt_kv_pages_check(&pages, -1, &error) == GLMRT_ERR_INVARIANT, "invalid owner is detected");
    pages.page_owner[ids[1]] = 3;
    expect(glmrt_kv_pages_check(&pages, 2, &error) == GLMRT_OK, "restored pool passes");
    glmrt_kv_pages_free(&pages);
}

static int random_release(glmrt_kv_pages *pages, owner_pages *owners, glmrt_error *error)
{
    int32_t owner = (int32_t)random_below(RANDOM_OWNERS);
    owner_pages *held = &owners[owner];
    if (held->count == 0) {
        return glmrt_kv_pages_release(pages, owner, NULL, 0, error) == GLMRT_OK;
    }
    int32_t count = 1 + (int32_t)random_below((uint32_t)held->count);
    glmrt_page_id chosen[RANDOM_POOL_PAGES];
    for (int32_t i = 0; i < count; ++i) {
        int32_t pick = i + (int32_t)random_below((uint32_t)(held->count - i));
        glmrt_page_id swap = held->ids[i];
        held->ids[i] = held->ids[pick];
        held->ids[pick] = swap;
        chosen[i] = held->ids[i];
    }
    if (glmrt_kv_pages_release(pages, owner, chosen, count, error) != GLMRT_OK) {
        return 0;
    }
    memmove(held->ids, held->ids + count, (size_t)(held->count - count) * sizeof(glmrt_page_id));
    held->count -= count;
    return 1;
}

static int random_alloc(glmrt_kv_pages *pages, owner_pages *owners, glmrt_error *error)
{
    int32_t owner = (int32_t)random_below(RANDOM_OWNERS);
    int32_t count = (int32_t)random_below(9);
    owner_pages *held = &owners[owner];
    int32_t free_before = pages->num_free;
    glmrt_status status = glmrt_kv_pages_alloc(pages, owner, count, held->ids + held->count, error);
    if (count > free_before) {
        return status == GLMRT_ERR_OUT_OF_PAGES && pages->num_free == free_before;
    }
    if (status != GLMRT_OK) {
        return 0;
    }
    held->count += count;
    return pages->num_free == free_before - count;
}

static int random_bad_release(glmrt_kv_pages *pages, const owner_pages *owners, glmrt_error *error)
{
    pool_snapshot before;
    snapshot_take(pages, &before);
    int32_t owner = (int32_t)random_below(RANDOM_OWNERS);
    glmrt_page_id page;
    if (pages->num_free > 0 && random_below(2) == 0) {
        page = pages->free_stack[random_below((uint32_t)pages->num_free)];
    } else {
        int32_t other = (owner + 1 + (int32_t)random_below(RANDOM_OWNERS - 1)) % RANDOM_OWNERS;
        if (owners[other].count == 0) {
            return 1;
        }
        page = owners[other].ids[random_below((uint32_t)owners[other].count)];
    }
    glmrt_page_id ids[2] = {page, page};
    int32_t count = 1;
    if (owners[owner].count > 0) {
        ids[0] = owners[owner].ids[0];
        count = 2;
    }
    return glmrt_kv_pages_release(pages, owner, ids, count, error) == GLMRT_ERR_INVARIANT &&
           snapshot_matches(pages, &before);
}

static int owners_match_pool(const glmrt_kv_pages *pages, const owner_pages *owners, int64_t *out_used)
{
    int64_t used = 0;
    for (int32_t owner = 0; owner < RANDOM_OWNERS; ++owner) {
        for (int32_t i = 0; i < owners[owner].count; ++i) {
            if (pages->page_owner[owners[owner].ids[i]] != owner) {
                return 0;
            }
        }
        used += owners[owner].count;
    }
    *out_used = used;
    return 1;
}

static void test_random_operations_keep_the_pool_consistent(void)
{
    glmrt_kv_pages pages;
    glmrt_error error;
    owner_pages owners[RANDOM_OWNERS];
    memset(owners, 0, sizeof(owners));
    expect(glmrt_kv_pages_init(&pages, RANDOM_POOL_PAGES, 16, &error) == GLMRT_OK, "init for random operations");
    int failures = 0;
    int checks = 0;
    for (int op = 0; op < RANDOM_OPERATIONS && failures == 0; ++op) {
        uint32_t kind = random_below(100);
        int ok;
        if (kind < 50) {
            ok = random_alloc(&pages, owners, &error);
        } else if (kind < 90) {
            ok = random_release(&pages, owners, &error);
        } else {
            ok = random_bad_release(&pages, owners, &error);
        }
        if (!ok) {
            fprintf(stderr, "random operation %d of kind %u failed: %s\n", op, kind, error.message);
            failures += 1;
        }
        if ((op + 1) % RANDOM_CHECK_EVERY == 0) {
            int64_t used = 0;
            checks += 1;
            if (!owners_match_pool(&pages, owners, &used) || glmrt_kv_pages_check(&pages, used, &error) != GLMRT_OK) {
                fprintf(stderr, "pool check after operation %d failed: %s\n", op, error.message);
                failures += 1;
            }
        }
    }
    expect(failures == 0, "100000 random operations keep the pool consistent");
    expect(checks == RANDOM_OPERATIONS / RANDOM_CHECK_EVERY, "every batch of operations was checked");
    for (int32_t owner = 0; owner < RANDOM_OWNERS; ++owner) {
        expect(glmrt_kv_pages_release(&pages, owner, owners[owner].ids, owners[owner].count, &error) == GLMRT_OK,
               "final release of every owner");
    }
    expect(pages.num_free == RANDOM_POOL_PAGES && glmrt_kv_pages_check(&pages, 0, &error) == GLMRT_OK,
           "all pages return after random operations");
    glmrt_kv_pages_free(&pages);
}

int main(void)
{
    test_init_rejects_bad_sizes();
    test_pages_for_tokens_rounds_up();
    test_alloc_is_all_or_nothing();
    test_alloc_rejects_bad_arguments();
    test_release_rejects_double_and_foreign_frees();
    test_check_detects_corruption();
    test_random_operations_keep_the_pool_consistent();
    printf("%d passed, %d failed\n", num_passed, num_failed);
    return num_failed == 0 ? 0 : 1;
}
