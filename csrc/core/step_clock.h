#ifndef GLMRT_STEP_CLOCK_H
#define GLMRT_STEP_CLOCK_H

#include <stdint.h>
#include <time.h>

typedef struct glmrt_step_gaps {
    int64_t completed_at_ns;
    int64_t total_ns;
    int64_t count;
} glmrt_step_gaps;

static inline int64_t glmrt_monotonic_ns(void)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (int64_t)now.tv_sec * 1000000000 + now.tv_nsec;
}

#endif
