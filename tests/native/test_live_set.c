#include "live_set.h"
#include "native_checks.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define ITEMS 3000
#define OPERATIONS 200000
#define CHECK_EVERY 997

static int table_matches(const glmrt_live_set *set, char *const *items, const int *held, int32_t expected_count)
{
    int ok = set->count == expected_count;
    for (int32_t i = 0; i < ITEMS && ok; ++i) {
        ok = glmrt_live_set_has(set, items[i]) == held[i];
    }
    return ok;
}

static void test_empty_table(void)
{
    glmrt_live_set set = {0};
    char byte = 0;
    expect(!glmrt_live_set_has(&set, &byte), "an empty table holds nothing");
    expect(!glmrt_live_set_has(&set, NULL), "an empty table does not hold NULL");
    glmrt_live_set_remove(&set, &byte);
    expect(set.count == 0, "removing from an empty table changes nothing");
    glmrt_error error;
    glmrt_error_clear(&error);
    expect(glmrt_live_set_add(&set, NULL, &error) == GLMRT_ERR_INVALID_ARGUMENT, "NULL is refused");
    expect(glmrt_live_set_reserve(&set, -1, &error) == GLMRT_ERR_INVALID_ARGUMENT, "a negative size is refused");
    expect(glmrt_live_set_add(&set, &byte, &error) == GLMRT_OK, "one entry is added");
    expect(glmrt_live_set_add(&set, &byte, &error) == GLMRT_ERR_INVARIANT, "the same entry twice is refused");
    expect(set.count == 1 && glmrt_live_set_has(&set, &byte), "the refused second add left one entry");
    glmrt_live_set_remove(&set, &byte);
    expect(set.count == 0 && !glmrt_live_set_has(&set, &byte), "the entry is gone after its removal");
    glmrt_live_set_free(&set);
    expect(set.slots == NULL && set.capacity == 0, "freeing leaves an empty table");
}

static void test_random_operations(char *const *items)
{
    glmrt_live_set set = {0};
    glmrt_error error;
    glmrt_error_clear(&error);
    int *held = calloc(ITEMS, sizeof(*held));
    if (!expect(held != NULL, "the reference array is allocated")) {
        return;
    }
    uint64_t state = 0x9e3779b97f4a7c15ull;
    int32_t count = 0;
    int add_failed = 0;
    int32_t most = 0;
    for (int32_t op = 0; op < OPERATIONS; ++op) {
        uint32_t i = next_random(&state, ITEMS);
        if (held[i]) {
            glmrt_live_set_remove(&set, items[i]);
            held[i] = 0;
            count -= 1;
        } else {
            add_failed |= glmrt_live_set_add(&set, items[i], &error) != GLMRT_OK;
            held[i] = 1;
            count += 1;
        }
        most = count > most ? count : most;
        if (op % CHECK_EVERY == 0 && !expect(table_matches(&set, items, held, count), "the table equals the reference")) {
            break;
        }
    }
    expect(!add_failed, "every add of an absent entry succeeded");
    expect(table_matches(&set, items, held, count), "the table equals the reference at the end");
    expect(set.capacity >= 2 * most, "the table kept at most half its slots full");
    for (int32_t i = 0; i < ITEMS; ++i) {
        if (held[i]) {
            glmrt_live_set_remove(&set, items[i]);
            held[i] = 0;
        }
    }
    expect(table_matches(&set, items, held, 0), "removing every entry empties the table");
    glmrt_live_set_free(&set);
    free(held);
}

static void test_reserve_keeps_entries(char *const *items)
{
    glmrt_live_set set = {0};
    glmrt_error error;
    glmrt_error_clear(&error);
    int ok = 1;
    for (int32_t i = 0; i < 100; ++i) {
        ok &= glmrt_live_set_add(&set, items[i], &error) == GLMRT_OK;
    }
    expect(ok, "a hundred entries are added");
    expect(glmrt_live_set_reserve(&set, 2000, &error) == GLMRT_OK && set.capacity >= 4000, "reserve grows the table");
    int all = set.count == 100;
    for (int32_t i = 0; i < 100; ++i) {
        all &= glmrt_live_set_has(&set, items[i]);
    }
    expect(all, "a grown table still holds every entry");
    expect(!glmrt_live_set_has(&set, items[100]), "a grown table holds no other entry");
    glmrt_live_set_free(&set);
}

int main(void)
{
    char *block = malloc(ITEMS * 24);
    char *items[ITEMS];
    if (block == NULL) {
        fprintf(stderr, "cannot allocate the entries\n");
        return 1;
    }
    for (int32_t i = 0; i < ITEMS; ++i) {
        items[i] = block + (size_t)i * 24;
    }
    test_empty_table();
    test_random_operations(items);
    test_reserve_keeps_entries(items);
    free(block);
    return report_checks();
}
