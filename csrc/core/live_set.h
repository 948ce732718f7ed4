#ifndef GLMRT_LIVE_SET_H
#define GLMRT_LIVE_SET_H

#include <stdint.h>

#include "error.h"

typedef struct glmrt_live_set {
    void **slots;
    int32_t capacity;
    int32_t count;
} glmrt_live_set;

glmrt_status glmrt_live_set_reserve(glmrt_live_set *set, int32_t count, glmrt_error *error);
glmrt_status glmrt_live_set_add(glmrt_live_set *set, void *item, glmrt_error *error);
void glmrt_live_set_remove(glmrt_live_set *set, const void *item);
int glmrt_live_set_has(const glmrt_live_set *set, const void *item);
void glmrt_live_set_free(glmrt_live_set *set);

#endif
