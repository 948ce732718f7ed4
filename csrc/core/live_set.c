#include "live_set.h"

#include <stdlib.h>

#define GLMRT_LIVE_SET_MIN_CAPACITY 64
#define GLMRT_LIVE_SET_MAX_CAPACITY (1 << 30)

static uint32_t home_slot(const void *item, int32_t capacity)
{
    uint64_t key = (uint64_t)(uintptr_t)item;
    key ^= key >> 33;
    key *= UINT64_C(0xff51afd7ed558ccd);
    key ^= key >> 33;
    return (uint32_t)(key & (uint64_t)(capacity - 1));
}

static uint32_t next_slot(uint32_t slot, int32_t capacity)
{
    return (slot + 1u) & (uint32_t)(capacity - 1);
}

static uint32_t slot_distance(uint32_t from, uint32_t to, int32_t capacity)
{
    return (to - from) & (uint32_t)(capacity - 1);
}

static void place(void **slots, int32_t capacity, void *item)
{
    uint32_t slot = home_slot(item, capacity);
    while (slots[slot] != NULL) {
        slot = next_slot(slot, capacity);
    }
    slots[slot] = item;
}

static glmrt_status rehash(glmrt_live_set *set, int32_t capacity, glmrt_error *error)
{
    void **slots = calloc((size_t)capacity, sizeof(*slots));
    if (slots == NULL) {
        return glmrt_error_set(error, GLMRT_ERR_OUT_OF_MEMORY, "cannot allocate a live-request table of %d slots",
                               capacity);
    }
    for (int32_t i = 0; i < set->capacity; ++i) {
        if (set->slots[i] != NULL) {
            place(slots, capacity, set->slots[i]);
        }
    }
    free(set->slots);
    set->slots = slots;
    set->capacity = capacity;
    return GLMRT_OK;
}

glmrt_status glmrt_live_set_reserve(glmrt_live_set *set, int32_t count, glmrt_error *error)
{
    if (count < 0 || count > GLMRT_LIVE_SET_MAX_CAPACITY / 2) {
        return glmrt_error_set(error, GLMRT_ERR_INVALID_ARGUMENT, "a live-request table cannot hold %d requests",
                               count);
    }
    int32_t capacity = set->capacity > GLMRT_LIVE_SET_MIN_CAPACITY ? set->capacity : GLMRT_LIVE_SET_MIN_CAPACITY;
    while (capacity < 2 * count) {
        capacity *= 2;
    }
    if (set->slots != NULL && capacity == set->capacity) {
        return GLMRT_OK;
    }
    return rehash(set, capacity, error);
}

glmrt_status glmrt_live_set_add(glmrt_live_set *set, void *item, glmrt_error *error)
{
    if (item == NULL) {
        return glmrt_error_set(error, GLMRT_ERR_INVALID_ARGUMENT, "a live-request table holds no NULL entries");
    }
    if (glmrt_live_set_has(set, item)) {
        return glmrt_error_set(error, GLMRT_ERR_INVARIANT, "the request is already in the live-request table");
    }
    glmrt_status status = glmrt_live_set_reserve(set, set->count + 1, error);
    if (status != GLMRT_OK) {
        return status;
    }
    place(set->slots, set->capacity, item);
    set->count += 1;
    return GLMRT_OK;
}

static int64_t find_slot(const glmrt_live_set *set, const void *item)
{
    if (set->slots == NULL || item == NULL) {
        return -1;
    }
    uint32_t slot = home_slot(item, set->capacity);
    while (set->slots[slot] != NULL) {
        if (set->slots[slot] == item) {
            return slot;
        }
        slot = next_slot(slot, set->capacity);
    }
    return -1;
}

int glmrt_live_set_has(const glmrt_live_set *set, const void *item)
{
    return find_slot(set, item) >= 0;
}

void glmrt_live_set_remove(glmrt_live_set *set, const void *item)
{
    int64_t found = find_slot(set, item);
    if (found < 0) {
        return;
    }
    uint32_t hole = (uint32_t)found;
    set->slots[hole] = NULL;
    for (uint32_t slot = next_slot(hole, set->capacity); set->slots[slot] != NULL;
         slot = next_slot(slot, set->capacity)) {
        uint32_t home = home_slot(set->slots[slot], set->capacity);
        if (slot_distance(home, slot, set->capacity) >= slot_distance(hole, slot, set->capacity)) {
            set->slots[hole] = set->slots[slot];
            set->slots[slot] = NULL;
            hole = slot;
        }
    }
    set->count -= 1;
}

void glmrt_live_set_free(glmrt_live_set *set)
{
    free(set->slots);
    set->slots = NULL;
    set->capacity = 0;
    set->count = 0;
}
