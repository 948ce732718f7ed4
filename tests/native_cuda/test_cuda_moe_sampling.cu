#include <algorithm>
#include <math.h>

#include "cuda_test_support.cuh"
#include "moe.cuh"
#include "route_resident.cuh"
#include "router.cuh"
#include "sampling.cuh"
#include "test_matrices.cuh"

extern "C" {
#include "moe.h"
#include "sampling.h"
}

typedef struct glmrt_route_case {
    const char *name;
    int32_t experts;
    int32_t top_k;
    int32_t groups;
    int32_t keep;
    int32_t tokens;
    float tie_step;
} glmrt_route_case;

typedef struct glmrt_dispatch_buffers {
    int32_t *sorted;
    int32_t *rows;
    glmrt_cuda_gemm_tile *tiles;
    int32_t *counters;
    int32_t max_tiles;
} glmrt_dispatch_buffers;

static glmrt_dispatch_buffers glmrt_dispatch_alloc(int32_t experts, int32_t assignments, int32_t tile_rows)
{
    glmrt_dispatch_buffers b;
    b.max_tiles = glmrt_cuda_moe_max_tiles(assignments, experts, tile_rows);
    b.sorted = glmrt_test_alloc<int32_t>(assignments);
    b.rows = glmrt_test_alloc<int32_t>(assignments);
    b.tiles = glmrt_test_alloc<glmrt_cuda_gemm_tile>(b.max_tiles);
    b.counters = glmrt_test_alloc<int32_t>(2);
    return b;
}

static void glmrt_dispatch_free(glmrt_dispatch_buffers *b)
{
    cudaFree(b->sorted);
    cudaFree(b->rows);
    cudaFree(b->tiles);
    cudaFree(b->counters);
}

static glmrt_cuda_dispatch_args glmrt_dispatch_args_for(const glmrt_dispatch_buffers *b, const int32_t *ids,
                                                        int32_t tokens, int32_t top_k, int32_t experts,
                                                        int32_t tile_rows)
{
    glmrt_cuda_dispatch_args args = {ids, tokens, top_k, 0, experts, tile_rows, b->sorted, b->rows, b->tiles,
                                     b->counters, b->counters + 1};
    return args;
}

static long glmrt_dispatch_errors(const glmrt_dispatch_buffers *b, const std::vector<int32_t> &ids, int32_t tokens,
                                  int32_t top_k, int32_t tile_rows)
{
    const int32_t assignments = tokens * top_k;
    std::vector<int32_t> sorted = glmrt_test_download(b->sorted, (size_t)assignments);
    std::vector<int32_t> rows = glmrt_test_download(b->rows, (size_t)assignments);
    std::vector<glmrt_cuda_gemm_tile> tiles = glmrt_test_download(b->tiles, b->max_tiles);
    std::vector<int32_t> counters = glmrt_test_download(b->counters, 2);
    long bad = 0;
    std::vector<int32_t> row_expert((size_t)assignments, -1);
    int32_t covered = 0;
    for (int32_t i = 0; i < counters[0] && i < b->max_tiles; ++i) {
        for (int32_t r = 0; r < tiles[i].num_rows; ++r) {
            row_expert[tiles[i].row_begin + r] = tiles[i].group;
            covered += 1;
        }
        bad += tiles[i].num_rows < 1 || tiles[i].num_rows > tile_rows;
    }
    bad += counters[1] != assignments || covered != assignments;
    for (int32_t a = 0; a < assignments; ++a) {
        int32_t row = rows[a];
        bad += row < 0 || row >= assignments || sorted[row] != a / top_k || row_expert[row] != ids[a];
    }
    return bad;
}

static void glmrt_check_route_dispatch_fused(glmrt_test_report *report, const glmrt_route_case *rc,
                                             glmrt_cuda_route_args route, const std::vector<int32_t> &ids,
                                             const std::vector<float> &weights)
{
    const int32_t k = rc->top_k;
    const int32_t tokens = rc->tokens < 20 ? rc->tokens : 20;
    const int32_t tile_rows = 4;
    int32_t *d_ids = glmrt_test_alloc<int32_t>((size_t)tokens * k);
    float *d_weights = glmrt_test_alloc<float>((size_t)tokens * k);
    route.num_tokens = tokens;
    route.topk_ids = d_ids;
    route.topk_weights = d_weights;
    glmrt_dispatch_buffers b = glmrt_dispatch_alloc(rc->experts, tokens * k, tile_rows);
    glmrt_cuda_dispatch_args dispatch = glmrt_dispatch_args_for(&b, d_ids, tokens, k, rc->experts, tile_rows);
    glmrt_error error;
    glmrt_error_clear(&error);
    glmrt_status status = glmrt_cuda_moe_route_dispatch(&route, &dispatch, 0, &error);
    std::vector<int32_t> fused_ids = glmrt_test_download(d_ids, (size_t)tokens * k);
    std::vector<float> fused_weights = glmrt_test_download(d_weights, (size_t)tokens * k);
    long bad = status == GLMRT_OK ? glmrt_dispatch_errors(&b, fused_ids, tokens, k, tile_rows) : 1;
    bad += memcmp(fused_ids.data(), ids.data(), fused_ids.size() * sizeof(int32_t)) != 0;
    bad += memcmp(fused_weights.data(), weights.data(), fused_weights.size() * sizeof(float)) != 0;
    char what[160];
    snprintf(what, sizeof(what), "routing and dispatch of %d tokens in one block (%s) equal the two kernels", tokens,
             rc->name);
    glmrt_test_expect(report, bad == 0, what, (double)bad, 0);
    glmrt_dispatch_free(&b);
    cudaFree(d_ids);
    cudaFree(d_weights);
}

static void glmrt_check_route(glmrt_test_report *report, glmrt_test_rng *rng, const glmrt_route_case *rc)
{
    const int32_t e = rc->experts;
    const int32_t k = rc->top_k;
    std::vector<float> logits((size_t)rc->tokens * e);
    std::vector<float> bias(e);
    for (float &v : logits) {
        v = glmrt_test_normal(rng) * 2.0f;
        if (rc->tie_step > 0.0f) v = roundf(v / rc->tie_step) * rc->tie_step;
    }
    for (float &v : bias) v = rc->tie_step > 0.0f ? 0.0f : glmrt_test_normal(rng) * 0.1f;
    float *d_logits = glmrt_test_upload(logits);
    float *d_bias = glmrt_test_upload(bias);
    int32_t *d_ids = glmrt_test_alloc<int32_t>((size_t)rc->tokens * k);
    float *d_weights = glmrt_test_alloc<float>((size_t)rc->tokens * k);
    glmrt_cuda_route_args args;
    args.logits = d_logits;
    args.correction_bias = d_bias;
    args.num_tokens = rc->tokens;
    args.num_experts = e;
    args.top_k = k;
    args.num_groups = rc->groups;
    args.keep_groups = rc->keep;
    args.normalize = 1;
    args.scaling = 2.5f;
    args.topk_ids = d_ids;
    args.topk_weights = d_weights;
    glmrt_error error;
    glmrt_error_clear(&error);
    glmrt_status status = glmrt_cuda_moe_check(e, k, rc->groups, &error);
    if (status == GLMRT_OK) status = glmrt_cuda_moe_route(&args, 0, &error);
    std::vector<int32_t> ids = glmrt_test_download(d_ids, (size_t)rc->tokens * k);
    std::vector<float> weights = glmrt_test_download(d_weights, (size_t)rc->tokens * k);
    glmrt_model_config config;
    memset(&config, 0, sizeof(config));
    config.n_routed_experts = e;
    config.num_experts_per_tok = k;
    config.n_group = rc->groups;
    config.topk_group = rc->keep;
    config.norm_topk_prob = 1;
    config.routed_scaling_factor = 2.5f;
    std::vector<float> scores(e), choice(e), group_scores(rc->groups);
    std::vector<uint8_t> group_kept(rc->groups), taken(e);
    glmrt_moe_router_scratch scratch = {scores.data(), choice.data(), group_scores.data(), group_kept.data(),
                                        taken.data()};
    std::vector<int32_t> ref_ids(k);
    std::vector<float> ref_weights(k);
    long id_mismatch = status == GLMRT_OK ? 0 : 1;
    double worst = 0.0;
    for (int32_t t = 0; t < rc->tokens && status == GLMRT_OK; ++t) {
        glmrt_moe_route_token(&config, logits.data() + (size_t)t * e, bias.data(), &scratch, ref_ids.data(),
                              ref_weights.data());
        for (int32_t s = 0; s < k; ++s) {
            id_mismatch += ids[(size_t)t * k + s] != ref_ids[s];
            worst = fmax(worst, fabs(weights[(size_t)t * k + s] - ref_weights[s]) / fabs(ref_weights[s]));
        }
    }
    char what[160];
    snprintf(what, sizeof(what), "router %s picks the CPU's experts in the CPU's order", rc->name);
    glmrt_test_expect(report, id_mismatch == 0, what, (double)id_mismatch, 0);
    snprintf(what, sizeof(what), "router %s weights match the CPU", rc->name);
    glmrt_test_expect(report, status == GLMRT_OK && worst < 1e-6, what, worst, 1e-6);
    int32_t tile_rows = 4;
    glmrt_dispatch_buffers buffers = glmrt_dispatch_alloc(e, rc->tokens * k, tile_rows);
    glmrt_cuda_dispatch_args dispatch = glmrt_dispatch_args_for(&buffers, d_ids, rc->tokens, k, e, tile_rows);
    if (status == GLMRT_OK) status = glmrt_cuda_moe_dispatch(&dispatch, 0, &error);
    long bad = status == GLMRT_OK ? glmrt_dispatch_errors(&buffers, ids, rc->tokens, k, tile_rows) : 1;
    snprintf(what, sizeof(what), "dispatch %s sorts every assignment into its expert's tiles", rc->name);
    glmrt_test_expect(report, bad == 0, what, (double)bad, 0);
    glmrt_check_route_dispatch_fused(report, rc, args, ids, weights);
    glmrt_dispatch_free(&buffers);
    cudaFree(d_logits);
    cudaFree(d_bias);
    cudaFree(d_ids);
    cudaFree(d_weights);
}


static int glmrt_sampler_alloc(glmrt_cuda_sampler *s, int32_t rows, int32_t vocab, glmrt_error *error)
{
    memset(s, 0, sizeof(*s));
    s->max_rows = rows;
    s->vocab_size = vocab;
    size_t cells = (size_t)rows * vocab;
    s->values = glmrt_test_alloc<float>(cells);
    s->counts = glmrt_test_alloc<int32_t>(cells);
    s->keys_in = glmrt_test_alloc<uint32_t>(cells);
    s->keys_out = glmrt_test_alloc<uint32_t>(cells);
    s->ids_in = glmrt_test_alloc<int32_t>(cells);
    s->ids_out = glmrt_test_alloc<int32_t>(cells);
    s->row_offsets = glmrt_test_alloc<int32_t>(rows + 1);
    s->argmax_keys = glmrt_test_alloc<unsigned long long>(rows);
    s->argmax_arrivals = glmrt_test_alloc<uint32_t>(rows);
    if (glmrt_cuda_sampler_sort_bytes(rows, vocab, &s->sort_temp_bytes, error) != GLMRT_OK) {
        return 0;
    }
    s->sort_temp = glmrt_test_alloc<uint8_t>(s->sort_temp_bytes);
    return glmrt_cuda_sampler_init(s, 0, error) == GLMRT_OK;
}

static void glmrt_sampler_release(glmrt_cuda_sampler *s)
{
    cudaFree(s->values);
    cudaFree(s->counts);
    cudaFree(s->keys_in);
    cudaFree(s->keys_out);
    cudaFree(s->ids_in);
    cudaFree(s->ids_out);
    cudaFree(s->row_offsets);
    cudaFree(s->argmax_keys);
    cudaFree(s->argmax_arrivals);
    cudaFree(s->sort_temp);
}

static void glmrt_check_sampler(glmrt_test_report *report, glmrt_test_rng *rng, int32_t vocab, int32_t rows)
{
    const float temperatures[] = {0.0f, 0.6f, 1.0f, 1.7f};
    const int32_t top_ks[] = {0, 1, 5, 50, 1000};
    const float top_ps[] = {1.0f, 0.9f, 0.5f, 0.05f};
    const float min_ps[] = {0.0f, 0.05f, 0.3f};
    const float repetitions[] = {1.0f, 1.3f, 0.8f};
    std::vector<float> logits((size_t)rows * vocab);
    std::vector<glmrt_sampling_params> params(rows);
    std::vector<glmrt_cuda_sample_params> device_params(rows);
    std::vector<int32_t> history;
    std::vector<int32_t> history_begin(rows), history_length(rows), prompt_length(rows);
    for (int32_t r = 0; r < rows; ++r) {
        float *row = logits.data() + (size_t)r * vocab;
        int ties = r % 5 == 1;
        for (int32_t v = 0; v < vocab; ++v) {
            row[v] = glmrt_test_normal(rng) * 3.0f;
            if (ties) row[v] = roundf(row[v] * 2.0f) * 0.5f;
        }
        if (r % 7 == 3) {
            row[glmrt_test_below(rng, vocab)] = -INFINITY;
            row[glmrt_test_below(rng, vocab)] = NAN;
        }
        glmrt_sampling_params *p = &params[r];
        memset(p, 0, sizeof(*p));
        p->temperature = temperatures[r % 4];
        p->top_k = top_ks[glmrt_test_below(rng, 5)];
        p->top_p = top_ps[glmrt_test_below(rng, 4)];
        p->min_p = min_ps[glmrt_test_below(rng, 3)];
        p->repetition_penalty = repetitions[glmrt_test_below(rng, 3)];
        p->frequency_penalty = glmrt_test_below(rng, 2) ? 0.5f : 0.0f;
        p->presence_penalty = glmrt_test_below(rng, 2) ? 0.7f : 0.0f;
        p->seed = glmrt_test_next(rng);
        int32_t length = 1 + glmrt_test_below(rng, 300);
        int32_t prompt = glmrt_test_below(rng, length + 1);
        history_begin[r] = (int32_t)history.size();
        history_length[r] = length;
        prompt_length[r] = prompt;
        for (int32_t i = 0; i < length; ++i) history.push_back(glmrt_test_below(rng, 64) * (vocab / 64));
        glmrt_cuda_sample_params *d = &device_params[r];
        memset(d, 0, sizeof(*d));
        d->temperature = p->temperature;
        d->top_p = p->top_p;
        d->min_p = p->min_p;
        d->top_k = p->top_k;
        d->repetition_penalty = p->repetition_penalty;
        d->frequency_penalty = p->frequency_penalty;
        d->presence_penalty = p->presence_penalty;
        d->uniform = glmrt_sampling_uniform(p->seed, (int64_t)length - prompt);
        d->history_begin = history_begin[r];
        d->num_history = length;
        d->num_prompt = prompt;
    }
    glmrt_error error;
    glmrt_error_clear(&error);
    glmrt_cuda_sampler sampler;
    int ready = glmrt_sampler_alloc(&sampler, rows, vocab, &error);
    float *d_logits = glmrt_test_upload(logits);
    glmrt_cuda_sample_params *d_params = glmrt_test_upload(device_params);
    int32_t *d_history = glmrt_test_upload(history);
    int32_t *d_tokens = glmrt_test_alloc<int32_t>(rows);
    glmrt_cuda_sample_args args = {d_logits, rows, d_params, d_history, 1, d_tokens, nullptr, 0};
    glmrt_status status = ready ? glmrt_cuda_sample(&sampler, &args, 0, &error) : GLMRT_ERR_BACKEND;
    std::vector<int32_t> tokens = glmrt_test_download(d_tokens, rows);
    if (status == GLMRT_OK) {
        status = glmrt_cuda_sample(&sampler, &args, 0, &error);
    }
    std::vector<int32_t> again = glmrt_test_download(d_tokens, rows);
    std::vector<unsigned long long> argmax_left = glmrt_test_download(sampler.argmax_keys, rows);
    std::vector<uint32_t> arrivals_left = glmrt_test_download(sampler.argmax_arrivals, rows);
    glmrt_sampler_scratch scratch;
    glmrt_sampler_scratch_init(&scratch, vocab, &error);
    long mismatches = status == GLMRT_OK ? 0 : rows;
    for (int32_t r = 0; r < rows && status == GLMRT_OK; ++r) {
        glmrt_token ref = glmrt_sample_row(logits.data() + (size_t)r * vocab, vocab, &params[r],
                                           history.data() + history_begin[r], prompt_length[r], history_length[r],
                                           &scratch);
        if (ref != tokens[r]) {
            mismatches += 1;
            printf("  row %d (t %.2f k %d p %.2f min_p %.2f rep %.1f): gpu %d cpu %d\n", r, params[r].temperature,
                   params[r].top_k, params[r].top_p, params[r].min_p, params[r].repetition_penalty, tokens[r], ref);
        }
    }
    int32_t counts_left = 0;
    std::vector<int32_t> counts = glmrt_test_download(sampler.counts, (size_t)rows * vocab);
    for (int32_t c : counts) counts_left += c != 0;
    int32_t argmax_state_left = 0;
    for (int32_t r = 0; r < rows; ++r) argmax_state_left += argmax_left[r] != 0ull || arrivals_left[r] != 0u;
    glmrt_test_expect(report, status == GLMRT_OK && again == tokens,
                      "GPU sampler gives the same tokens when it runs again on the same rows", 0, 0);
    glmrt_test_expect(report, argmax_state_left == 0, "GPU argmax leaves its per-row keys and counts at zero",
                      argmax_state_left, 0);
    char what[160];
    snprintf(what, sizeof(what), "GPU sampler picks the CPU sampler's token on %d rows of %d", rows, vocab);
    glmrt_test_expect(report, mismatches == 0, what, (double)mismatches, 0);
    glmrt_test_expect(report, counts_left == 0, "GPU sampler leaves its penalty counts at zero", counts_left, 0);
    glmrt_sampler_scratch_free(&scratch);
    glmrt_sampler_release(&sampler);
    cudaFree(d_logits);
    cudaFree(d_params);
    cudaFree(d_history);
    cudaFree(d_tokens);
}

static void glmrt_check_router_logits(glmrt_test_report *report, glmrt_test_rng *rng, int32_t format,
                                      int32_t experts, int32_t cols, int32_t tokens)
{
    glmrt_host_matrix h = glmrt_make_matrix(rng, format, GLMRT_CUDA_SCALE_NONE, {experts}, cols, 1, 0);
    uint8_t *d_data = nullptr;
    float *d_scale = nullptr;
    glmrt_device_matrix(&h, &d_data, &d_scale);
    std::vector<float> x((size_t)tokens * cols);
    for (float &v : x) v = glmrt_test_normal(rng);
    float *d_x = glmrt_test_upload(x);
    float *d_batch = glmrt_test_alloc<float>((size_t)tokens * experts);
    float *d_alone = glmrt_test_alloc<float>((size_t)experts);
    glmrt_error error;
    glmrt_error_clear(&error);
    glmrt_status status = glmrt_cuda_router_logits(&h.m, d_x, cols, tokens, d_batch, experts, 0, &error);
    std::vector<float> batch = glmrt_test_download(d_batch, (size_t)tokens * experts);
    double worst = 0.0;
    for (int32_t t = 0; t < tokens; ++t) {
        for (int32_t e = 0; e < experts; ++e) {
            double exact = 0.0;
            double magnitude = 1e-30;
            for (int32_t c = 0; c < cols; ++c) {
                double term = glmrt_host_weight(h, 0, e, c) * (double)x[(size_t)t * cols + c];
                exact += term;
                magnitude += fabs(term);
            }
            worst = fmax(worst, fabs(batch[(size_t)t * experts + e] - exact) / magnitude);
        }
    }
    long differing = 0;
    for (int32_t t : {0, tokens / 2, tokens - 1}) {
        if (status == GLMRT_OK) {
            status = glmrt_cuda_router_logits(&h.m, d_x + (size_t)t * cols, cols, 1, d_alone, experts, 0, &error);
        }
        std::vector<float> alone = glmrt_test_download(d_alone, (size_t)experts);
        differing += memcmp(alone.data(), &batch[(size_t)t * experts], (size_t)experts * sizeof(float)) != 0;
    }
    char what[160];
    snprintf(what, sizeof(what), "router logits, format %d, %d experts x %d columns, %d tokens, against float64", format,
             experts, cols, tokens);
    glmrt_test_expect(report, status == GLMRT_OK && worst < 1e-5, what, worst, 1e-5);
    snprintf(what, sizeof(what), "router logits, format %d: a token alone equals it in a batch of %d", format, tokens);
    glmrt_test_expect(report, status == GLMRT_OK && differing == 0, what, (double)differing, 0);
    cudaFree(d_data);
    cudaFree(d_x);
    cudaFree(d_batch);
    cudaFree(d_alone);
}

typedef struct glmrt_resident_case {
    int32_t format;
    int32_t experts;
    int32_t cols;
    int32_t top_k;
    int32_t groups;
    int32_t keep;
    int32_t tokens;
} glmrt_resident_case;

static glmrt_cuda_route_args glmrt_resident_route_args(const glmrt_resident_case *rc, const float *logits,
                                                       const float *bias, int32_t *ids, float *weights)
{
    glmrt_cuda_route_args route = {logits, bias, rc->tokens, rc->experts, rc->top_k, rc->groups, rc->keep, 1, 2.5f,
                                   ids, weights};
    return route;
}

static void glmrt_check_route_resident(glmrt_test_report *report, glmrt_test_rng *rng, const glmrt_resident_case *rc)
{
    const int32_t assignments = rc->tokens * rc->top_k;
    const int32_t tile_rows = 4;
    glmrt_host_matrix h = glmrt_make_matrix(rng, rc->format, GLMRT_CUDA_SCALE_NONE, {rc->experts}, rc->cols, 1, 0);
    uint8_t *d_data = nullptr;
    float *d_scale = nullptr;
    glmrt_device_matrix(&h, &d_data, &d_scale);
    const int32_t narrow_tokens = rc->tokens + GLMRT_ROUTE_RESIDENT_TOKENS + 1;
    std::vector<float> x((size_t)narrow_tokens * rc->cols);
    for (float &v : x) v = glmrt_test_normal(rng);
    std::vector<float> bias(rc->experts);
    for (float &v : bias) v = glmrt_test_normal(rng) * 0.1f;
    float *d_x = glmrt_test_upload(x);
    float *d_bias = glmrt_test_upload(bias);
    float *d_logits[2] = {glmrt_test_alloc<float>((size_t)narrow_tokens * rc->experts),
                          glmrt_test_alloc<float>((size_t)rc->tokens * rc->experts)};
    int32_t *d_ids[2] = {glmrt_test_alloc<int32_t>(assignments), glmrt_test_alloc<int32_t>(assignments)};
    float *d_weights[2] = {glmrt_test_alloc<float>(assignments), glmrt_test_alloc<float>(assignments)};
    glmrt_dispatch_buffers b[2] = {glmrt_dispatch_alloc(rc->experts, assignments, tile_rows),
                                   glmrt_dispatch_alloc(rc->experts, assignments, tile_rows)};
    std::vector<int32_t> zero_arrivals(1, 0);
    int32_t *d_arrivals = glmrt_test_upload(zero_arrivals);
    glmrt_cuda_route_args route[2];
    glmrt_cuda_dispatch_args dispatch[2];
    for (int i = 0; i < 2; ++i) {
        route[i] = glmrt_resident_route_args(rc, d_logits[i], d_bias, d_ids[i], d_weights[i]);
        dispatch[i] = glmrt_dispatch_args_for(&b[i], d_ids[i], rc->tokens, rc->top_k, rc->experts, tile_rows);
    }
    glmrt_error error;
    glmrt_error_clear(&error);
    glmrt_status status = glmrt_cuda_router_logits(&h.m, d_x, rc->cols, narrow_tokens, d_logits[0], rc->experts, 0,
                                                   &error);
    if (status == GLMRT_OK) status = glmrt_cuda_moe_route(&route[0], 0, &error);
    if (status == GLMRT_OK) status = glmrt_cuda_moe_dispatch(&dispatch[0], 0, &error);
    glmrt_cuda_route_resident_args resident = {&h.m, d_x, rc->cols, d_logits[1], &route[1], &dispatch[1], d_arrivals};
    long bad = glmrt_cuda_router_resident_fits(&h.m, rc->tokens) ? 0 : 1;
    for (int repeat = 0; repeat < 2 && status == GLMRT_OK; ++repeat) {
        cudaMemset(d_logits[1], 0, (size_t)rc->tokens * rc->experts * sizeof(float));
        cudaMemset(d_ids[1], 0xff, (size_t)assignments * sizeof(int32_t));
        status = glmrt_cuda_route_resident(&resident, 0, &error);
        std::vector<float> ref_logits = glmrt_test_download(d_logits[0], (size_t)rc->tokens * rc->experts);
        std::vector<float> logits = glmrt_test_download(d_logits[1], (size_t)rc->tokens * rc->experts);
        std::vector<int32_t> ref_ids = glmrt_test_download(d_ids[0], (size_t)assignments);
        std::vector<int32_t> ids = glmrt_test_download(d_ids[1], (size_t)assignments);
        std::vector<float> ref_weights = glmrt_test_download(d_weights[0], (size_t)assignments);
        std::vector<float> weights = glmrt_test_download(d_weights[1], (size_t)assignments);
        std::vector<int32_t> arrivals = glmrt_test_download(d_arrivals, 1);
        bad += memcmp(logits.data(), ref_logits.data(), logits.size() * sizeof(float)) != 0;
        bad += memcmp(ids.data(), ref_ids.data(), ids.size() * sizeof(int32_t)) != 0;
        bad += memcmp(weights.data(), ref_weights.data(), weights.size() * sizeof(float)) != 0;
        bad += glmrt_dispatch_errors(&b[1], ids, rc->tokens, rc->top_k, tile_rows);
        bad += arrivals[0] != 0;
    }
    bad += status != GLMRT_OK;
    char what[200];
    snprintf(what, sizeof(what),
             "router, routing and dispatch in one kernel for %d token(s), format %d, %d experts x %d columns, top %d "
             "of %d groups keep %d, twice, equal the batched router and the routing kernels bit for bit",
             rc->tokens, rc->format, rc->experts, rc->cols, rc->top_k, rc->groups, rc->keep);
    glmrt_test_expect(report, bad == 0, what, (double)bad, 0);
    for (int i = 0; i < 2; ++i) {
        cudaFree(d_logits[i]);
        cudaFree(d_ids[i]);
        cudaFree(d_weights[i]);
        glmrt_dispatch_free(&b[i]);
    }
    cudaFree(d_arrivals);
    cudaFree(d_data);
    cudaFree(d_x);
    cudaFree(d_bias);
}

static void glmrt_check_route_resident_refusals(glmrt_test_report *report, glmrt_test_rng *rng)
{
    glmrt_host_matrix wide = glmrt_make_matrix(rng, GLMRT_CUDA_FORMAT_BF16, GLMRT_CUDA_SCALE_NONE, {8}, 5632, 1, 0);
    glmrt_host_matrix fits = glmrt_make_matrix(rng, GLMRT_CUDA_FORMAT_BF16, GLMRT_CUDA_SCALE_NONE, {8}, 512, 1, 0);
    long wrong = 0;
    wrong += glmrt_cuda_router_resident_fits(&wide.m, 1) != 0;
    wrong += glmrt_cuda_router_resident_fits(&fits.m, 0) != 0;
    wrong += glmrt_cuda_router_resident_fits(&fits.m, GLMRT_ROUTE_RESIDENT_TOKENS + 1) != 0;
    wrong += glmrt_cuda_router_resident_fits(&fits.m, GLMRT_ROUTE_RESIDENT_TOKENS) != 1;
    glmrt_cuda_route_args route = {nullptr, nullptr, 3, 8, 2, 1, 1, 1, 1.0f, nullptr, nullptr};
    glmrt_cuda_dispatch_args dispatch = {nullptr, 3, 2, 0, 8, 4, nullptr, nullptr, nullptr, nullptr, nullptr};
    glmrt_cuda_route_resident_args args = {&fits.m, nullptr, 512, nullptr, &route, &dispatch, nullptr};
    glmrt_error error;
    glmrt_error_clear(&error);
    wrong += glmrt_cuda_route_resident(&args, 0, &error) != GLMRT_ERR_INVARIANT;
    route.num_tokens = 1;
    dispatch.num_tokens = 1;
    glmrt_error_clear(&error);
    wrong += glmrt_cuda_route_resident(&args, 0, &error) != GLMRT_ERR_INVARIANT;
    glmrt_test_expect(report, wrong == 0, "resident routing refuses what does not fit with a status", (double)wrong, 0);
}

static long glmrt_dispatch_subset_errors(const glmrt_dispatch_buffers *expected, const glmrt_dispatch_buffers *actual,
                                         const std::vector<int32_t> &ids, int32_t assignments, int32_t top_k,
                                         int32_t begin, int32_t local)
{
    std::vector<int32_t> counters[2] = {glmrt_test_download(expected->counters, 2),
                                        glmrt_test_download(actual->counters, 2)};
    std::vector<glmrt_cuda_gemm_tile> tiles[2] = {glmrt_test_download(expected->tiles, expected->max_tiles),
                                                  glmrt_test_download(actual->tiles, actual->max_tiles)};
    std::vector<int32_t> rows = glmrt_test_download(actual->rows, (size_t)assignments);
    std::vector<int32_t> sorted = glmrt_test_download(actual->sorted, (size_t)assignments);
    long bad = counters[0][0] != counters[1][0] || counters[0][1] != counters[1][1];
    std::vector<int32_t> row_expert((size_t)assignments, -1);
    for (int32_t i = 0; i < counters[1][0] && i < actual->max_tiles && !bad; ++i) {
        const glmrt_cuda_gemm_tile &a = tiles[1][i];
        const glmrt_cuda_gemm_tile &e = tiles[0][i];
        bad += a.group != e.group || a.row_begin != e.row_begin || a.num_rows != e.num_rows;
        for (int32_t r = 0; r < a.num_rows && a.row_begin + r < assignments; ++r) {
            row_expert[a.row_begin + r] = a.group;
        }
    }
    std::vector<int32_t> used((size_t)assignments, 0);
    for (int32_t a = 0; a < assignments; ++a) {
        const int32_t expert = ids[a] - begin;
        const bool mine = expert >= 0 && expert < local;
        const int32_t row = rows[a];
        if (!mine) {
            bad += row != -1;
            continue;
        }
        if (row < 0 || row >= counters[1][1]) {
            bad += 1;
            continue;
        }
        bad += row_expert[row] != expert || sorted[row] != a / top_k || used[row] != 0;
        used[row] = 1;
    }
    return bad;
}

static void glmrt_check_dispatch_warp(glmrt_test_report *report, glmrt_test_rng *rng, int32_t tokens, int32_t begin,
                                      int32_t local, int32_t tile_rows)
{
    const int32_t experts = 160;
    const int32_t top_k = 8;
    const int32_t assignments = tokens * top_k;
    std::vector<float> logits((size_t)tokens * experts);
    for (float &v : logits) v = glmrt_test_normal(rng);
    float *d_logits = glmrt_test_upload(logits);
    int32_t *d_ids[2] = {glmrt_test_alloc<int32_t>(assignments), glmrt_test_alloc<int32_t>(assignments)};
    float *d_weights[2] = {glmrt_test_alloc<float>(assignments), glmrt_test_alloc<float>(assignments)};
    glmrt_dispatch_buffers b[2] = {glmrt_dispatch_alloc(local, assignments, tile_rows),
                                   glmrt_dispatch_alloc(local, assignments, tile_rows)};
    glmrt_cuda_route_args route[2];
    glmrt_cuda_dispatch_args dispatch[2];
    for (int i = 0; i < 2; ++i) {
        route[i] = {d_logits, nullptr, tokens, experts, top_k, 1, 1, 1, 2.5f, d_ids[i], d_weights[i]};
        dispatch[i] = glmrt_dispatch_args_for(&b[i], d_ids[i], tokens, top_k, local, tile_rows);
        dispatch[i].expert_begin = begin;
    }
    glmrt_error error;
    glmrt_error_clear(&error);
    glmrt_status status = glmrt_cuda_moe_route(&route[0], 0, &error);
    if (status == GLMRT_OK) status = glmrt_cuda_moe_dispatch(&dispatch[0], 0, &error);
    if (status == GLMRT_OK) status = glmrt_cuda_moe_route_dispatch(&route[1], &dispatch[1], 0, &error);
    std::vector<int32_t> ids = glmrt_test_download(d_ids[1], (size_t)assignments);
    std::vector<int32_t> expected_ids = glmrt_test_download(d_ids[0], (size_t)assignments);
    long bad = status != GLMRT_OK;
    bad += memcmp(ids.data(), expected_ids.data(), ids.size() * sizeof(int32_t)) != 0;
    if (!bad) {
        bad += glmrt_dispatch_subset_errors(&b[0], &b[1], ids, assignments, top_k, begin, local);
    }
    char what[200];
    snprintf(what, sizeof(what),
             "dispatch of %d assignments by one warp, experts %d to %d of 160, tiles of %d, equals the block's tiles",
             assignments, begin, begin + local - 1, tile_rows);
    glmrt_test_expect(report, bad == 0, what, (double)bad, 0);
    for (int i = 0; i < 2; ++i) {
        cudaFree(d_ids[i]);
        cudaFree(d_weights[i]);
        glmrt_dispatch_free(&b[i]);
    }
    cudaFree(d_logits);
}

static void glmrt_check_route_ranks_nan_last(glmrt_test_report *report, glmrt_test_rng *rng)
{
    const int32_t experts = 160;
    const int32_t top_k = 8;
    const int32_t tokens = 3;
    std::vector<float> logits((size_t)tokens * experts);
    for (float &v : logits) v = glmrt_test_normal(rng);
    for (int32_t e = 0; e < experts; e += 3) logits[e] = NAN;
    for (int32_t e = 0; e < experts; ++e) logits[(size_t)2 * experts + e] = e % 5 == 0 ? 1.0f : NAN;
    float *d_logits = glmrt_test_upload(logits);
    int32_t *d_ids = glmrt_test_alloc<int32_t>((size_t)tokens * top_k);
    float *d_weights = glmrt_test_alloc<float>((size_t)tokens * top_k);
    glmrt_cuda_route_args route = {d_logits, nullptr, tokens, experts, top_k, 1, 1, 0, 1.0f, d_ids, d_weights};
    glmrt_error error;
    glmrt_error_clear(&error);
    glmrt_status status = glmrt_cuda_moe_route(&route, 0, &error);
    std::vector<int32_t> ids = glmrt_test_download(d_ids, (size_t)tokens * top_k);
    long bad = status != GLMRT_OK;
    for (int32_t t = 0; t < tokens && !bad; ++t) {
        const float *row = logits.data() + (size_t)t * experts;
        std::vector<int32_t> order;
        for (int32_t e = 0; e < experts; ++e) {
            if (row[e] == row[e]) order.push_back(e);
        }
        std::stable_sort(order.begin(), order.end(), [row](int32_t a, int32_t b) { return row[a] > row[b]; });
        for (int32_t e = 0; e < experts; ++e) {
            if (row[e] != row[e]) order.push_back(e);
        }
        for (int32_t slot = 0; slot < top_k; ++slot) {
            bad += ids[(size_t)t * top_k + slot] != order[slot];
        }
    }
    glmrt_test_expect(report, bad == 0,
                      "routing ranks numbers by value then index and NaN scores after every number, by index", (double)bad,
                      0);
    cudaFree(d_logits);
    cudaFree(d_ids);
    cudaFree(d_weights);
}

int main(void)
{
    glmrt_test_report report = {0, 0};
    glmrt_test_rng rng = {99};
    const glmrt_route_case cases[] = {
        {"160 experts top 8", 160, 8, 1, 1, 300, 0.0f},
        {"64 experts in 8 groups keep 3", 64, 6, 8, 3, 200, 0.0f},
        {"8 experts top 2 with ties", 8, 2, 1, 1, 100, 0.5f},
        {"256 experts in 8 groups with ties", 256, 8, 8, 4, 100, 0.25f},
    };
    for (const glmrt_route_case &rc : cases) {
        glmrt_check_route(&report, &rng, &rc);
    }
    glmrt_check_router_logits(&report, &rng, GLMRT_CUDA_FORMAT_BF16, 160, 5120, 77);
    glmrt_check_router_logits(&report, &rng, GLMRT_CUDA_FORMAT_F32, 20, 1056, 13);
    glmrt_check_router_logits(&report, &rng, GLMRT_CUDA_FORMAT_BF16, 160, 5120, 301);
    glmrt_check_router_logits(&report, &rng, GLMRT_CUDA_FORMAT_F32, 37, 1056, 1100);
    glmrt_check_router_logits(&report, &rng, GLMRT_CUDA_FORMAT_BF16, 160, 5120, 7);
    glmrt_check_router_logits(&report, &rng, GLMRT_CUDA_FORMAT_F32, 37, 1056, 8);
    glmrt_check_router_logits(&report, &rng, GLMRT_CUDA_FORMAT_BF16, 160, 5120, 256);
    glmrt_check_router_logits(&report, &rng, GLMRT_CUDA_FORMAT_BF16, 160, 5120, 516);
    glmrt_check_router_logits(&report, &rng, GLMRT_CUDA_FORMAT_BF16, 160, 5120, 2048);
    glmrt_check_router_logits(&report, &rng, GLMRT_CUDA_FORMAT_BF16, 37, 1056, 397);
    const glmrt_resident_case resident_cases[] = {
        {GLMRT_CUDA_FORMAT_BF16, 160, 5120, 8, 1, 1, 1},
        {GLMRT_CUDA_FORMAT_BF16, 160, 5120, 8, 1, 1, 2},
        {GLMRT_CUDA_FORMAT_BF16, 37, 1056, 6, 1, 1, 2},
        {GLMRT_CUDA_FORMAT_F32, 160, 5120, 8, 1, 1, 2},
        {GLMRT_CUDA_FORMAT_F32, 64, 1056, 6, 8, 3, 2},
        {GLMRT_CUDA_FORMAT_BF16, 20, 132, 2, 1, 1, 1},
    };
    for (const glmrt_resident_case &rc : resident_cases) {
        glmrt_check_route_resident(&report, &rng, &rc);
    }
    glmrt_check_route_resident_refusals(&report, &rng);
    glmrt_check_route_ranks_nan_last(&report, &rng);
    glmrt_check_dispatch_warp(&report, &rng, 1, 0, 160, 4);
    glmrt_check_dispatch_warp(&report, &rng, 3, 40, 40, 4);
    glmrt_check_dispatch_warp(&report, &rng, 4, 0, 160, 1);
    glmrt_check_dispatch_warp(&report, &rng, 4, 120, 40, 2);
    glmrt_check_sampler(&report, &rng, 2048, 96);
    glmrt_check_sampler(&report, &rng, 151552, 40);
    return glmrt_test_finish("test_cuda_moe_sampling", &report);
}
