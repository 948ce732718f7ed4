#include "sampling_order.h"

#define GLMRT_SORT_FIRST_CHUNK 64
#define GLMRT_SORT_GROWTH 4
#define GLMRT_INSERTION_SORT_MAX 16

static void swap_ids(int32_t *ids, int32_t a, int32_t b)
{
    int32_t held = ids[a];
    ids[a] = ids[b];
    ids[b] = held;
}

static void sift_down(const float *values, int32_t *ids, int32_t root, int32_t count)
{
    for (;;) {
        int32_t child = 2 * root + 1;
        if (child >= count) {
            return;
        }
        if (child + 1 < count && glmrt_candidate_before(values, ids[child], ids[child + 1])) {
            child += 1;
        }
        if (!glmrt_candidate_before(values, ids[root], ids[child])) {
            return;
        }
        swap_ids(ids, root, child);
        root = child;
    }
}

static void heap_sort_range(const float *values, int32_t *ids, int32_t lo, int32_t hi)
{
    int32_t *base = ids + lo;
    int32_t count = hi - lo;
    for (int32_t root = count / 2 - 1; root >= 0; --root) {
        sift_down(values, base, root, count);
    }
    for (int32_t end = count - 1; end > 0; --end) {
        swap_ids(base, 0, end);
        sift_down(values, base, 0, end);
    }
}

static void insertion_sort_range(const float *values, int32_t *ids, int32_t lo, int32_t hi)
{
    for (int32_t i = lo + 1; i < hi; ++i) {
        int32_t moving = ids[i];
        int32_t j = i;
        while (j > lo && glmrt_candidate_before(values, moving, ids[j - 1])) {
            ids[j] = ids[j - 1];
            j -= 1;
        }
        ids[j] = moving;
    }
}

static void order_pair(const float *values, int32_t *ids, int32_t a, int32_t b)
{
    if (glmrt_candidate_before(values, ids[b], ids[a])) {
        swap_ids(ids, a, b);
    }
}

static int32_t partition_range(const float *values, int32_t *ids, int32_t lo, int32_t hi)
{
    int32_t last = hi - 1;
    int32_t mid = lo + (hi - lo) / 2;
    order_pair(values, ids, lo, mid);
    order_pair(values, ids, mid, last);
    order_pair(values, ids, lo, mid);
    swap_ids(ids, mid, last);
    int32_t pivot = ids[last];
    int32_t store = lo;
    for (int32_t i = lo; i < last; ++i) {
        if (glmrt_candidate_before(values, ids[i], pivot)) {
            swap_ids(ids, i, store);
            store += 1;
        }
    }
    swap_ids(ids, store, last);
    return store;
}

static int32_t depth_limit(int32_t count)
{
    int32_t depth = 8;
    while (count > 1) {
        count >>= 1;
        depth += 2;
    }
    return depth;
}

static void intro_sort_range(const float *values, int32_t *ids, int32_t lo, int32_t hi, int32_t depth)
{
    while (hi - lo > GLMRT_INSERTION_SORT_MAX) {
        if (--depth < 0) {
            heap_sort_range(values, ids, lo, hi);
            return;
        }
        int32_t pivot = partition_range(values, ids, lo, hi);
        if (pivot - lo < hi - pivot - 1) {
            intro_sort_range(values, ids, lo, pivot, depth);
            lo = pivot + 1;
        } else {
            intro_sort_range(values, ids, pivot + 1, hi, depth);
            hi = pivot;
        }
    }
    insertion_sort_range(values, ids, lo, hi);
}

static void sort_range(const float *values, int32_t *ids, int32_t lo, int32_t hi)
{
    if (hi - lo > 1) {
        intro_sort_range(values, ids, lo, hi, depth_limit(hi - lo));
    }
}

static void select_range(const float *values, int32_t *ids, int32_t lo, int32_t hi, int32_t boundary)
{
    int32_t depth = depth_limit(hi - lo);
    while (hi - lo > 1 && boundary > lo && boundary < hi) {
        if (--depth < 0) {
            sort_range(values, ids, lo, hi);
            return;
        }
        int32_t pivot = partition_range(values, ids, lo, hi);
        if (pivot >= boundary) {
            hi = pivot;
        } else {
            lo = pivot + 1;
        }
    }
}

void glmrt_candidates_select_best(glmrt_candidates *set, int32_t k)
{
    if (k <= 0 || k >= set->count) {
        return;
    }
    select_range(set->values, set->indices, 0, set->count, k);
    set->count = k;
    set->num_sorted = 0;
}

static void extend_sorted(glmrt_candidates *set, int32_t position)
{
    int32_t target = GLMRT_SORT_FIRST_CHUNK;
    if (set->num_sorted > set->count / GLMRT_SORT_GROWTH) {
        target = set->count;
    } else if (set->num_sorted * GLMRT_SORT_GROWTH > target) {
        target = set->num_sorted * GLMRT_SORT_GROWTH;
    }
    if (target < position + 1) {
        target = position + 1;
    }
    if (target > set->count) {
        target = set->count;
    }
    select_range(set->values, set->indices, set->num_sorted, set->count, target);
    sort_range(set->values, set->indices, set->num_sorted, target);
    set->num_sorted = target;
}

int32_t glmrt_candidates_at(glmrt_candidates *set, int32_t position)
{
    if (position >= set->num_sorted) {
        extend_sorted(set, position);
    }
    return set->indices[position];
}

int32_t glmrt_candidates_best(const glmrt_candidates *set)
{
    if (set->num_sorted > 0) {
        return set->indices[0];
    }
    int32_t best = set->indices[0];
    for (int32_t i = 1; i < set->count; ++i) {
        if (glmrt_candidate_before(set->values, set->indices[i], best)) {
            best = set->indices[i];
        }
    }
    return best;
}

void glmrt_candidates_truncate(glmrt_candidates *set, int32_t count)
{
    if (count < set->count) {
        set->count = count;
    }
    if (set->num_sorted > set->count) {
        set->num_sorted = set->count;
    }
}

void glmrt_candidates_drop_below(glmrt_candidates *set, const double *weights, double threshold)
{
    int32_t kept = 0;
    int32_t kept_sorted = 0;
    for (int32_t i = 0; i < set->count; ++i) {
        int32_t token = set->indices[i];
        if (weights[token] < threshold) {
            continue;
        }
        if (i < set->num_sorted) {
            kept_sorted += 1;
        }
        set->indices[kept++] = token;
    }
    set->count = kept;
    set->num_sorted = kept_sorted;
}
