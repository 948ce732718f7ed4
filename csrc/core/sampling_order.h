#ifndef GLMRT_SAMPLING_ORDER_H
#define GLMRT_SAMPLING_ORDER_H

#include <stdint.h>

typedef struct glmrt_candidates {
    const float *values;
    int32_t *indices;
    int32_t count;
    int32_t num_sorted;
} glmrt_candidates;

static inline int glmrt_candidate_before(const float *values, int32_t a, int32_t b)
{
    return values[a] > values[b] || (values[a] == values[b] && a < b);
}

void glmrt_candidates_select_best(glmrt_candidates *set, int32_t k);
int32_t glmrt_candidates_at(glmrt_candidates *set, int32_t position);
int32_t glmrt_candidates_best(const glmrt_candidates *set);
void glmrt_candidates_truncate(glmrt_candidates *set, int32_t count);
void glmrt_candidates_drop_below(glmrt_candidates *set, const double *weights, double threshold);

#endif
