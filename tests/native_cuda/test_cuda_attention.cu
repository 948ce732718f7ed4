#include "activation_quant.cuh"
#include "attention.cuh"
#include "attention_round.cuh"
#include "attention_tile.cuh"
#include "cuda_test_support.cuh"
#include "step_inputs.cuh"

extern "C" {
#include "fp8.h"
#include "norm_rope.h"
}

typedef struct glmrt_attention_setup {
    int32_t head_dim;
    int32_t num_kv_heads;
    int32_t group;
    int32_t page_size;
    int32_t num_pages;
    int32_t num_layers;
} glmrt_attention_setup;

typedef struct glmrt_fake_seq {
    int32_t first;
    int32_t count;
    int32_t shares;
} glmrt_fake_seq;

typedef struct glmrt_fake_batch {
    std::vector<glmrt_token> token_ids;
    std::vector<glmrt_pos> positions;
    std::vector<int32_t> token_seq;
    std::vector<int32_t> seq_token_start;
    std::vector<int32_t> seq_num_tokens;
    std::vector<int32_t> seq_context_len;
    std::vector<std::vector<glmrt_page_id>> tables;
    std::vector<const glmrt_page_id *> table_ptrs;
    std::vector<int32_t> seq_num_pages;
    std::vector<int32_t> owner;
    glmrt_step_batch batch;
} glmrt_fake_batch;

static void glmrt_fake_batch_build(glmrt_fake_batch *f, const std::vector<glmrt_fake_seq> &seqs,
                                   const glmrt_attention_setup *s, glmrt_test_rng *rng)
{
    std::vector<int32_t> free_pages(s->num_pages);
    for (int32_t i = 0; i < s->num_pages; ++i) free_pages[i] = i;
    for (int32_t i = s->num_pages - 1; i > 0; --i) {
        int32_t j = glmrt_test_below(rng, i + 1);
        int32_t held = free_pages[i];
        free_pages[i] = free_pages[j];
        free_pages[j] = held;
    }
    int32_t next_page = 0;
    f->tables.resize(seqs.size());
    for (size_t q = 0; q < seqs.size(); ++q) {
        int32_t context = seqs[q].first + seqs[q].count;
        int32_t pages = (context + s->page_size - 1) / s->page_size;
        if (seqs[q].shares > 0) {
            f->tables[q] = f->tables[seqs[q].shares - 1];
        } else {
            for (int32_t p = 0; p < pages; ++p) f->tables[q].push_back(free_pages[next_page++]);
        }
        f->seq_token_start.push_back((int32_t)f->token_ids.size());
        f->seq_num_tokens.push_back(seqs[q].count);
        f->seq_context_len.push_back(context);
        for (int32_t t = 0; t < seqs[q].count; ++t) {
            f->token_ids.push_back(1);
            f->positions.push_back(seqs[q].first + t);
            f->token_seq.push_back((int32_t)q);
        }
        f->seq_num_pages.push_back(pages);
        f->owner.push_back(seqs[q].shares > 0 ? f->owner[seqs[q].shares - 1] : (int32_t)q);
    }
    for (size_t q = 0; q < seqs.size(); ++q) {
        f->table_ptrs.push_back(f->tables[q].data());
    }
    glmrt_step_batch *b = &f->batch;
    memset(b, 0, sizeof(*b));
    b->num_tokens = (int32_t)f->token_ids.size();
    b->token_ids = f->token_ids.data();
    b->positions = f->positions.data();
    b->token_seq = f->token_seq.data();
    b->num_seqs = (int32_t)seqs.size();
    b->seq_token_start = f->seq_token_start.data();
    b->seq_num_tokens = f->seq_num_tokens.data();
    b->seq_context_len = f->seq_context_len.data();
    b->seq_page_tables = f->table_ptrs.data();
    b->seq_num_pages = f->seq_num_pages.data();
}

static size_t glmrt_kv_index(const glmrt_attention_setup *s, int32_t layer, int32_t page, int32_t which, int32_t head,
                             int32_t slot, int32_t d)
{
    size_t page_elements = (size_t)2 * s->num_kv_heads * s->page_size * s->head_dim;
    return (size_t)layer * page_elements * s->num_pages + (size_t)page * page_elements +
           ((size_t)which * s->num_kv_heads + head) * s->page_size * s->head_dim + (size_t)slot * s->head_dim + d;
}

static glmrt_cuda_kv_layout glmrt_kv_of(const glmrt_attention_setup *s, uint16_t *base)
{
    glmrt_cuda_kv_layout kv;
    kv.base = base;
    kv.page_size = s->page_size;
    kv.num_kv_heads = s->num_kv_heads;
    kv.head_dim = s->head_dim;
    kv.head_elements = (int64_t)s->page_size * s->head_dim;
    kv.page_elements = 2 * (int64_t)s->num_kv_heads * kv.head_elements;
    kv.layer_elements = kv.page_elements * s->num_pages;
    return kv;
}

typedef struct glmrt_attention_data {
    glmrt_fake_batch f;
    std::vector<uint16_t> cache;
    std::vector<float> q;
    std::vector<float> out;
    int64_t q_stride;
    int32_t num_heads;
    int32_t grid_limit;
    int32_t prefill_path;
    int32_t decode_path;
    int32_t check_round;
    int32_t round_blocks;
    int32_t round_same;
    glmrt_cuda_step_counts counts;
} glmrt_attention_data;

static float glmrt_query_value(int32_t owner, int32_t position, int32_t head, int32_t d)
{
    glmrt_test_rng rng = {((uint64_t)owner * 1000003ull + (uint64_t)position) * 4099ull + (uint64_t)head * 257ull +
                          (uint64_t)d};
    return glmrt_test_normal(&rng) * 2.0f;
}

static void glmrt_attention_fill(glmrt_attention_data *a, const glmrt_attention_setup *s,
                                 const std::vector<glmrt_fake_seq> &seqs, glmrt_test_rng *rng)
{
    glmrt_fake_batch_build(&a->f, seqs, s, rng);
    a->grid_limit = 0;
    a->prefill_path = GLMRT_ATTENTION_PREFILL_AUTO;
    a->decode_path = GLMRT_ATTENTION_DECODE_AUTO;
    a->check_round = 0;
    a->round_blocks = 0;
    a->round_same = 0;
    a->num_heads = s->num_kv_heads * s->group;
    size_t cache_elements = (size_t)s->num_layers * 2 * s->num_kv_heads * s->page_size * s->head_dim * s->num_pages;
    a->cache.resize(cache_elements);
    for (uint16_t &v : a->cache) v = glmrt_float_to_bf16(glmrt_test_normal(rng));
    int32_t tokens = a->f.batch.num_tokens;
    a->q_stride = (int64_t)(a->num_heads + 2 * s->num_kv_heads) * s->head_dim;
    a->q.assign((size_t)tokens * a->q_stride, 0.0f);
    for (int32_t t = 0; t < tokens; ++t) {
        int32_t owner = a->f.owner[a->f.token_seq[t]];
        for (int32_t h = 0; h < a->num_heads; ++h) {
            for (int32_t d = 0; d < s->head_dim; ++d) {
                a->q[(size_t)t * a->q_stride + (size_t)h * s->head_dim + d] =
                    glmrt_query_value(owner, a->f.positions[t], h, d);
            }
        }
    }
}

static glmrt_cuda_qgemm_operand glmrt_rounded_rows(int32_t rows, int32_t cols)
{
    glmrt_cuda_qgemm_operand rounded;
    memset(&rounded, 0, sizeof(rounded));
    rounded.kind = GLMRT_OPERAND_FP8;
    rounded.cols = cols;
    rounded.capacity_rows = rows;
    rounded.data = glmrt_test_alloc<uint8_t>((size_t)rows * cols);
    rounded.scales = glmrt_test_alloc<float>((size_t)rows);
    return rounded;
}

static bool glmrt_rounded_same(const glmrt_cuda_qgemm_operand *x, const glmrt_cuda_qgemm_operand *y, int32_t rows)
{
    const std::vector<uint8_t> x_data = glmrt_test_download(x->data, (size_t)rows * x->cols);
    const std::vector<uint8_t> y_data = glmrt_test_download(y->data, (size_t)rows * y->cols);
    const std::vector<float> x_scales = glmrt_test_download(x->scales, (size_t)rows);
    const std::vector<float> y_scales = glmrt_test_download(y->scales, (size_t)rows);
    return x_data == y_data && memcmp(x_scales.data(), y_scales.data(), (size_t)rows * sizeof(float)) == 0;
}

static void glmrt_poison_merged_rows(float *d_rows, int64_t stride, const glmrt_cuda_step_counts *counts,
                                     uint8_t *packed)
{
    glmrt_cuda_step_view host;
    glmrt_cuda_step_view_at(counts, packed, &host);
    for (int32_t i = 0; i < counts->num_merges; ++i) {
        cudaMemset(d_rows + (int64_t)host.merges[i].token * stride, 0xff, (size_t)stride * sizeof(float));
    }
}

static glmrt_status glmrt_merge_round_compare(glmrt_attention_data *a, const glmrt_cuda_attention_merge_args *merge,
                                              const float *d_before, int32_t tokens, glmrt_error *error)
{
    const int32_t cols = a->num_heads * merge->head_dim;
    int sms = 0;
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
    glmrt_cuda_qgemm_operand separate = glmrt_rounded_rows(tokens, cols);
    glmrt_cuda_qgemm_operand fused = glmrt_rounded_rows(tokens, cols);
    a->round_blocks = glmrt_cuda_attention_merge_round_blocks(merge, tokens, &fused, sms);
    glmrt_status status = GLMRT_OK;
    if (a->round_blocks > 0) {
        glmrt_cuda_activation_args rounding;
        memset(&rounding, 0, sizeof(rounding));
        rounding.x = merge->out;
        rounding.x_stride = merge->out_stride;
        rounding.op = GLMRT_ACTIVATION_COPY;
        rounding.num_rows = tokens;
        rounding.out = &separate;
        status = glmrt_cuda_activation_quantize(&rounding, 0, error);
        glmrt_cuda_attention_merge_args from_before = *merge;
        from_before.out = const_cast<float *>(d_before);
        if (status == GLMRT_OK) status = glmrt_cuda_attention_merge_round(&from_before, tokens, &fused, sms, 0, error);
        cudaError_t synced = cudaDeviceSynchronize();
        if (status == GLMRT_OK && synced != cudaSuccess) {
            status = glmrt_error_set(error, GLMRT_ERR_BACKEND, "merge and rounding failed: %s",
                                     cudaGetErrorString(synced));
        }
        a->round_same = status == GLMRT_OK && glmrt_rounded_same(&separate, &fused, tokens) ? 1 : 0;
    }
    cudaFree(separate.data);
    cudaFree(separate.scales);
    cudaFree(fused.data);
    cudaFree(fused.scales);
    return status;
}

static glmrt_status glmrt_attention_compute(glmrt_attention_data *a, const glmrt_attention_setup *s,
                                            const glmrt_cuda_split_policy *policy, glmrt_error *error)
{
    int32_t tokens = a->f.batch.num_tokens;
    int32_t seqs = a->f.batch.num_seqs;
    glmrt_cuda_step_capacity capacity;
    memset(&capacity, 0, sizeof(capacity));
    capacity.max_tokens = tokens;
    capacity.max_seqs = seqs;
    capacity.max_samples = seqs;
    capacity.max_pages = (int64_t)s->num_pages * seqs + seqs;
    capacity.max_history = 16;
    capacity.max_partials = 64 * seqs;
    capacity.max_decode_items = 64 * seqs + seqs;
    capacity.prefill_tokens_per_item = glmrt_cuda_attention_prefill_tokens(s->head_dim);
    capacity.max_prefill_items = tokens + seqs;
    capacity.max_merges = seqs;
    std::vector<uint8_t> packed((size_t)glmrt_cuda_step_capacity_bytes(&capacity));
    glmrt_status status = glmrt_cuda_step_pack(&a->f.batch, &capacity, policy, s->page_size, s->num_pages,
                                               packed.data(), &a->counts, error);
    if (status != GLMRT_OK) {
        return status;
    }
    packed.resize((size_t)a->counts.bytes);
    const int32_t hd = s->head_dim;
    uint8_t *d_packed = glmrt_test_upload(packed);
    uint16_t *d_cache = glmrt_test_upload(a->cache);
    float *d_q = glmrt_test_upload(a->q);
    float *d_out = glmrt_test_alloc<float>((size_t)tokens * a->num_heads * hd);
    float *d_partial = glmrt_test_alloc<float>((size_t)capacity.max_partials * a->num_heads * hd);
    float *d_stats = glmrt_test_alloc<float>((size_t)capacity.max_partials * a->num_heads * 2);
    glmrt_cuda_step_view view;
    glmrt_cuda_step_view_at(&a->counts, d_packed, &view);
    status = glmrt_cuda_attention_prepare(hd, s->group, error);
    glmrt_cuda_attention_args args;
    memset(&args, 0, sizeof(args));
    args.q = d_q;
    args.q_stride = a->q_stride;
    args.positions = view.positions;
    args.page_ids = view.page_ids;
    args.kv = glmrt_kv_of(s, d_cache);
    args.layer = s->num_layers - 1;
    args.group = s->group;
    args.scale = 1.0f / sqrtf((float)hd);
    args.out = d_out;
    args.out_stride = (int64_t)a->num_heads * hd;
    args.partial_out = d_partial;
    args.partial_stats = d_stats;
    args.prefill_path = a->prefill_path;
    args.decode_path = a->decode_path;
    args.items = view.decode_items;
    args.num_items = a->counts.num_decode_items;
    if (a->grid_limit > 0) {
        args.device_num_items = &view.device_counts->num_decode_items;
        args.max_grid_items = a->grid_limit;
    }
    if (status == GLMRT_OK) status = glmrt_cuda_attention_run(&args, 1, 0, error);
    args.items = view.prefill_items;
    args.num_items = a->counts.num_prefill_items;
    args.device_num_items = nullptr;
    args.max_grid_items = 0;
    if (status == GLMRT_OK) status = glmrt_cuda_attention_run(&args, capacity.prefill_tokens_per_item, 0, error);
    const size_t out_elements = (size_t)tokens * a->num_heads * hd;
    float *d_before = a->check_round ? glmrt_test_alloc<float>(out_elements) : nullptr;
    if (d_before != nullptr) {
        cudaMemcpy(d_before, d_out, out_elements * sizeof(float), cudaMemcpyDeviceToDevice);
        glmrt_poison_merged_rows(d_before, args.out_stride, &a->counts, packed.data());
    }
    glmrt_cuda_attention_merge_args merge;
    memset(&merge, 0, sizeof(merge));
    merge.merges = view.merges;
    merge.num_merges = a->counts.num_merges;
    merge.group = s->group;
    merge.num_kv_heads = s->num_kv_heads;
    merge.head_dim = hd;
    merge.partial_out = d_partial;
    merge.partial_stats = d_stats;
    merge.out = d_out;
    merge.out_stride = args.out_stride;
    if (a->grid_limit > 0) {
        merge.device_num_merges = &view.device_counts->num_merges;
        merge.max_grid_merges = a->grid_limit;
    }
    if (status == GLMRT_OK) status = glmrt_cuda_attention_merge_run(&merge, 0, error);
    if (status == GLMRT_OK && d_before != nullptr) status = glmrt_merge_round_compare(a, &merge, d_before, tokens, error);
    cudaFree(d_before);
    a->out = glmrt_test_download(d_out, (size_t)tokens * a->num_heads * hd);
    cudaError_t synced = cudaDeviceSynchronize();
    if (status == GLMRT_OK && synced != cudaSuccess) {
        status = glmrt_error_set(error, GLMRT_ERR_BACKEND, "attention kernels failed: %s", cudaGetErrorString(synced));
    }
    cudaFree(d_packed);
    cudaFree(d_cache);
    cudaFree(d_q);
    cudaFree(d_out);
    cudaFree(d_partial);
    cudaFree(d_stats);
    return status;
}

typedef struct glmrt_reference_error {
    double exact;
    double rounded;
} glmrt_reference_error;

static void glmrt_reference_token(const glmrt_attention_data *a, const glmrt_attention_setup *s, int32_t token,
                                  glmrt_reference_error *worst)
{
    const int32_t hd = s->head_dim;
    const int32_t layer = s->num_layers - 1;
    const int32_t seq = a->f.token_seq[token];
    const int32_t count = a->f.positions[token] + 1;
    const float scale = 1.0f / sqrtf((float)hd);
    const float q_scale = scale * 1.4426950408889634f;
    std::vector<double> exact(count), rounded(count), q_exact(hd), q_rounded(hd), out_exact(hd), out_rounded(hd);
    std::vector<const uint16_t *> keys(count), values(count);
    for (int32_t h = 0; h < a->num_heads; ++h) {
        int32_t kvh = h / s->group;
        for (int32_t d = 0; d < hd; ++d) {
            float v = a->q[(size_t)token * a->q_stride + (size_t)h * hd + d];
            q_exact[d] = v;
            q_rounded[d] = glmrt_bf16_to_float(glmrt_float_to_bf16(v * q_scale));
        }
        double max_exact = -INFINITY, max_rounded = -INFINITY;
        for (int32_t j = 0; j < count; ++j) {
            int32_t page = a->f.tables[seq][j / s->page_size];
            keys[j] = &a->cache[glmrt_kv_index(s, layer, page, 0, kvh, j % s->page_size, 0)];
            values[j] = &a->cache[glmrt_kv_index(s, layer, page, 1, kvh, j % s->page_size, 0)];
            double dot_exact = 0.0, dot_rounded = 0.0;
            for (int32_t d = 0; d < hd; ++d) {
                double k = glmrt_bf16_to_float(keys[j][d]);
                dot_exact += q_exact[d] * k;
                dot_rounded += q_rounded[d] * k;
            }
            exact[j] = dot_exact * scale;
            rounded[j] = dot_rounded;
            max_exact = fmax(max_exact, exact[j]);
            max_rounded = fmax(max_rounded, rounded[j]);
        }
        double total_exact = 0.0, total_rounded = 0.0;
        for (int32_t j = 0; j < count; ++j) {
            exact[j] = exp(exact[j] - max_exact);
            rounded[j] = glmrt_bf16_to_float(glmrt_float_to_bf16((float)exp2(rounded[j] - max_rounded)));
            total_exact += exact[j];
            total_rounded += rounded[j];
        }
        std::fill(out_exact.begin(), out_exact.end(), 0.0);
        std::fill(out_rounded.begin(), out_rounded.end(), 0.0);
        for (int32_t j = 0; j < count; ++j) {
            for (int32_t d = 0; d < hd; ++d) {
                double v = glmrt_bf16_to_float(values[j][d]);
                out_exact[d] += exact[j] * v;
                out_rounded[d] += rounded[j] * v;
            }
        }
        for (int32_t d = 0; d < hd; ++d) {
            double got = a->out[((size_t)token * a->num_heads + h) * hd + d];
            double e1 = fabs(got - out_exact[d] / total_exact);
            double e2 = fabs(got - out_rounded[d] / total_rounded);
            worst->exact = isnan(got) ? INFINITY : fmax(worst->exact, e1);
            worst->rounded = isnan(got) ? INFINITY : fmax(worst->rounded, e2);
        }
    }
}

static int32_t glmrt_token_at(const glmrt_attention_data *a, int32_t seq, int32_t position)
{
    int32_t start = a->f.seq_token_start[seq];
    return start + position - a->f.positions[start];
}

static void glmrt_expect_reference(glmrt_test_report *report, const glmrt_attention_data *a,
                                   const glmrt_attention_setup *s, const std::vector<int32_t> &tokens,
                                   const char *label)
{
    glmrt_reference_error worst = {0.0, 0.0};
    for (int32_t token : tokens) glmrt_reference_token(a, s, token, &worst);
    char what[200];
    snprintf(what, sizeof(what), "%s: %zu tokens against float64", label, tokens.size());
    glmrt_test_expect(report, worst.exact < 3e-2, what, worst.exact, 3e-2);
    snprintf(what, sizeof(what), "%s: %zu tokens against float64 of bf16 q and p", label, tokens.size());
    glmrt_test_expect(report, worst.rounded < 5e-3, what, worst.rounded, 5e-3);
}

static void glmrt_expect_same_rows(glmrt_test_report *report, const glmrt_attention_data *a,
                                   const glmrt_attention_data *b, const std::vector<int32_t> &a_tokens,
                                   const std::vector<int32_t> &b_tokens, int32_t row_width, const char *label)
{
    long differing = 0;
    for (size_t i = 0; i < a_tokens.size(); ++i) {
        const float *x = &a->out[(size_t)a_tokens[i] * row_width];
        const float *y = &b->out[(size_t)b_tokens[i] * row_width];
        for (int32_t e = 0; e < row_width; ++e) {
            differing += memcmp(&x[e], &y[e], sizeof(float)) != 0;
        }
    }
    char what[200];
    snprintf(what, sizeof(what), "%s: %zu rows bit-identical", label, a_tokens.size());
    glmrt_test_expect(report, differing == 0, what, (double)differing, 0);
}

static int glmrt_attention_ran(glmrt_test_report *report, glmrt_status status, const glmrt_error *error,
                               const char *label)
{
    if (status == GLMRT_OK) {
        return 1;
    }
    printf("FAIL %s: %s\n", label, error->message);
    report->checks += 1;
    report->failures += 1;
    return 0;
}

static void glmrt_check_prefill_paths(glmrt_test_report *report, const glmrt_attention_data *a,
                                      const glmrt_attention_setup *s, const glmrt_cuda_split_policy *policy,
                                      const std::vector<int32_t> &tokens, const char *label)
{
    int device = 0;
    cudaGetDevice(&device);
    if (a->counts.num_prefill_items == 0 ||
        glmrt_cuda_attention_prefill_path(device, s->head_dim) != GLMRT_ATTENTION_PREFILL_WGMMA) {
        return;
    }
    glmrt_error error;
    glmrt_error_clear(&error);
    char what[200];
    glmrt_attention_data paths[2] = {*a, *a};
    paths[0].prefill_path = GLMRT_ATTENTION_PREFILL_MMA;
    paths[1].prefill_path = GLMRT_ATTENTION_PREFILL_WGMMA;
    for (glmrt_attention_data &run : paths) {
        if (!glmrt_attention_ran(report, glmrt_attention_compute(&run, s, policy, &error), &error, label)) return;
    }
    snprintf(what, sizeof(what), "%s: prefill by mma.sync and by wgmma", label);
    glmrt_expect_same_rows(report, &paths[0], &paths[1], tokens, tokens, a->num_heads * s->head_dim, what);
}

static void glmrt_check_decode_paths(glmrt_test_report *report, const glmrt_attention_data *a,
                                     const glmrt_attention_setup *s, const glmrt_cuda_split_policy *policy,
                                     const std::vector<int32_t> &tokens, const char *label)
{
    if (a->counts.num_decode_items == 0) {
        return;
    }
    glmrt_error error;
    glmrt_error_clear(&error);
    char what[200];
    glmrt_attention_data paths[3] = {*a, *a, *a};
    paths[0].decode_path = GLMRT_ATTENTION_DECODE_BLOCK;
    paths[1].decode_path = GLMRT_ATTENTION_DECODE_SPREAD;
    paths[2].decode_path = GLMRT_ATTENTION_DECODE_SPREAD;
    paths[2].grid_limit = 2;
    for (glmrt_attention_data &run : paths) {
        if (!glmrt_attention_ran(report, glmrt_attention_compute(&run, s, policy, &error), &error, label)) return;
    }
    snprintf(what, sizeof(what), "%s: decode by one block an item and spread over a cluster", label);
    glmrt_expect_same_rows(report, &paths[0], &paths[1], tokens, tokens, a->num_heads * s->head_dim, what);
    snprintf(what, sizeof(what), "%s: decode spread over a cluster, items looped over 2 clusters a head", label);
    glmrt_expect_same_rows(report, &paths[0], &paths[2], tokens, tokens, a->num_heads * s->head_dim, what);
}

static void glmrt_check_attention(glmrt_test_report *report, glmrt_test_rng *rng, const glmrt_attention_setup *s,
                                  const glmrt_cuda_split_policy *policy, const std::vector<glmrt_fake_seq> &seqs,
                                  const char *label)
{
    glmrt_attention_data a;
    glmrt_attention_fill(&a, s, seqs, rng);
    glmrt_error error;
    glmrt_error_clear(&error);
    if (!glmrt_attention_ran(report, glmrt_attention_compute(&a, s, policy, &error), &error, label)) return;
    std::vector<int32_t> tokens;
    for (int32_t t = 0; t < a.f.batch.num_tokens; ++t) tokens.push_back(t);
    char what[200];
    snprintf(what, sizeof(what), "%s (%d decode, %d prefill items, %d merges)", label, a.counts.num_decode_items,
             a.counts.num_prefill_items, a.counts.num_merges);
    glmrt_expect_reference(report, &a, s, tokens, what);
    glmrt_attention_data looped = a;
    looped.grid_limit = 3;
    if (!glmrt_attention_ran(report, glmrt_attention_compute(&looped, s, policy, &error), &error, label)) return;
    snprintf(what, sizeof(what), "%s: items counted on the device and looped over 3 blocks a head", label);
    glmrt_expect_same_rows(report, &a, &looped, tokens, tokens, a.num_heads * s->head_dim, what);
    glmrt_check_prefill_paths(report, &a, s, policy, tokens, label);
    glmrt_check_decode_paths(report, &a, s, policy, tokens, label);
}

typedef struct glmrt_position_pair {
    int32_t seq_a;
    int32_t seq_b;
    int32_t first;
    int32_t last;
} glmrt_position_pair;

static void glmrt_check_paths_agree(glmrt_test_report *report, glmrt_test_rng *rng, const glmrt_attention_setup *s,
                                    const glmrt_cuda_split_policy *policy, const std::vector<glmrt_fake_seq> &seqs,
                                    const std::vector<glmrt_position_pair> &pairs, int32_t solo_seq,
                                    const std::vector<int32_t> &reference_seqs, const char *label)
{
    glmrt_attention_data a;
    glmrt_attention_fill(&a, s, seqs, rng);
    glmrt_error error;
    glmrt_error_clear(&error);
    if (!glmrt_attention_ran(report, glmrt_attention_compute(&a, s, policy, &error), &error, label)) return;
    const int32_t row_width = a.num_heads * s->head_dim;
    char what[200];
    for (const glmrt_position_pair &pair : pairs) {
        std::vector<int32_t> a_tokens, b_tokens;
        for (int32_t p = pair.first; p <= pair.last; ++p) {
            a_tokens.push_back(glmrt_token_at(&a, pair.seq_a, p));
            b_tokens.push_back(glmrt_token_at(&a, pair.seq_b, p));
        }
        snprintf(what, sizeof(what), "%s: positions %d-%d of chunks of %d and %d tokens", label, pair.first,
                 pair.last, seqs[pair.seq_a].count, seqs[pair.seq_b].count);
        glmrt_expect_same_rows(report, &a, &a, a_tokens, b_tokens, row_width, what);
    }
    std::vector<int32_t> tokens;
    for (int32_t seq : reference_seqs) {
        int32_t start = a.f.seq_token_start[seq];
        int32_t count = a.f.seq_num_tokens[seq];
        tokens.push_back(start);
        tokens.push_back(start + count / 2);
        tokens.push_back(start + count - 1);
    }
    snprintf(what, sizeof(what), "%s (%d decode, %d prefill items, %d merges)", label, a.counts.num_decode_items,
             a.counts.num_prefill_items, a.counts.num_merges);
    glmrt_expect_reference(report, &a, s, tokens, what);
    std::vector<int32_t> all_tokens;
    for (int32_t t = 0; t < a.f.batch.num_tokens; ++t) all_tokens.push_back(t);
    glmrt_check_prefill_paths(report, &a, s, policy, all_tokens, label);
    glmrt_check_decode_paths(report, &a, s, policy, all_tokens, label);
    if (solo_seq < 0) return;
    std::vector<glmrt_fake_seq> solo_seqs = {seqs[solo_seq]};
    solo_seqs[0].shares = 0;
    glmrt_attention_data b;
    b.f.owner.clear();
    glmrt_test_rng same = {0};
    glmrt_fake_batch_build(&b.f, solo_seqs, s, &same);
    b.f.tables[0] = a.f.tables[solo_seq];
    b.f.table_ptrs[0] = b.f.tables[0].data();
    b.f.owner[0] = a.f.owner[solo_seq];
    b.num_heads = a.num_heads;
    b.grid_limit = 0;
    b.prefill_path = GLMRT_ATTENTION_PREFILL_AUTO;
    b.decode_path = GLMRT_ATTENTION_DECODE_AUTO;
    b.q_stride = a.q_stride;
    b.cache = a.cache;
    int32_t start = a.f.seq_token_start[solo_seq];
    int32_t count = a.f.seq_num_tokens[solo_seq];
    b.q.assign(a.q.begin() + (size_t)start * a.q_stride, a.q.begin() + (size_t)(start + count) * a.q_stride);
    if (!glmrt_attention_ran(report, glmrt_attention_compute(&b, s, policy, &error), &error, label)) return;
    std::vector<int32_t> a_tokens, b_tokens;
    for (int32_t t = 0; t < count; ++t) {
        a_tokens.push_back(start + t);
        b_tokens.push_back(t);
    }
    snprintf(what, sizeof(what), "%s: sequence %d alone equals it in the batch", label, solo_seq);
    glmrt_expect_same_rows(report, &a, &b, a_tokens, b_tokens, row_width, what);
}

static void glmrt_check_rope_store(glmrt_test_report *report, glmrt_test_rng *rng, const glmrt_attention_setup *s,
                                   const std::vector<glmrt_fake_seq> &seqs, const char *label)
{
    glmrt_fake_batch f;
    glmrt_fake_batch_build(&f, seqs, s, rng);
    const int32_t hd = s->head_dim;
    const int32_t num_heads = s->num_kv_heads * s->group;
    const int32_t tokens = f.batch.num_tokens;
    const int32_t width = (num_heads + 2 * s->num_kv_heads) * hd;
    const int32_t rotary = glmrt_rope_rotary_dim(hd, 0.5f);
    const float theta = 1000000.0f;
    std::vector<float> qkv((size_t)tokens * width);
    std::vector<float> q_norm(hd);
    std::vector<float> k_norm(hd);
    for (float &v : qkv) v = glmrt_test_normal(rng) * 3.0f;
    for (float &v : q_norm) v = 1.0f + 0.1f * glmrt_test_normal(rng);
    for (float &v : k_norm) v = 1.0f + 0.1f * glmrt_test_normal(rng);
    size_t cache_elements = (size_t)s->num_layers * 2 * s->num_kv_heads * s->page_size * hd * s->num_pages;
    std::vector<uint16_t> cache(cache_elements, 0);
    std::vector<int32_t> page_begin;
    std::vector<int32_t> page_ids;
    for (size_t q = 0; q < seqs.size(); ++q) {
        page_begin.push_back((int32_t)page_ids.size());
        page_ids.insert(page_ids.end(), f.tables[q].begin(), f.tables[q].end());
    }
    float *d_qkv = glmrt_test_upload(qkv);
    float *d_qn = glmrt_test_upload(q_norm);
    float *d_kn = glmrt_test_upload(k_norm);
    uint16_t *d_cache = glmrt_test_upload(cache);
    int32_t *d_pos = glmrt_test_upload(f.positions);
    int32_t *d_seq = glmrt_test_upload(f.token_seq);
    int32_t *d_begin = glmrt_test_upload(page_begin);
    int32_t *d_pages = glmrt_test_upload(page_ids);
    glmrt_cuda_rope_args args;
    args.qkv = d_qkv;
    args.qkv_stride = width;
    args.num_tokens = tokens;
    args.positions = d_pos;
    args.token_seq = d_seq;
    args.seq_page_begin = d_begin;
    args.page_ids = d_pages;
    args.num_q_heads = num_heads;
    args.rotary_dim = rotary;
    args.q_norm = d_qn;
    args.k_norm = d_kn;
    args.eps = 1e-5f;
    args.theta = theta;
    args.kv = glmrt_kv_of(s, d_cache);
    args.layer = s->num_layers - 1;
    args.path = GLMRT_ROPE_PATH_AUTO;
    glmrt_error error;
    glmrt_error_clear(&error);
    glmrt_status status = glmrt_cuda_qk_rope_store(&args, 0, &error);
    std::vector<float> got_q = glmrt_test_download(d_qkv, qkv.size());
    std::vector<uint16_t> got_cache = glmrt_test_download(d_cache, cache.size());
    cudaMemcpy(d_qkv, qkv.data(), qkv.size() * sizeof(float), cudaMemcpyHostToDevice);
    cudaMemcpy(d_cache, cache.data(), cache.size() * sizeof(uint16_t), cudaMemcpyHostToDevice);
    args.path = GLMRT_ROPE_PATH_SHARED_MEMORY;
    if (status == GLMRT_OK) status = glmrt_cuda_qk_rope_store(&args, 0, &error);
    const std::vector<float> shared_q = glmrt_test_download(d_qkv, qkv.size());
    const std::vector<uint16_t> shared_cache = glmrt_test_download(d_cache, cache.size());
    const bool same_bits = memcmp(got_q.data(), shared_q.data(), got_q.size() * sizeof(float)) == 0 &&
                           memcmp(got_cache.data(), shared_cache.data(), got_cache.size() * sizeof(uint16_t)) == 0;
    std::vector<float> inv_freq(rotary / 2);
    glmrt_rope_inv_freq_fill(theta, rotary, inv_freq.data());
    std::vector<float> cosv(rotary / 2), sinv(rotary / 2), head(hd);
    double worst = 0.0;
    long bf16_off = 0;
    for (int32_t t = 0; t < tokens; ++t) {
        glmrt_rope_angles_fill(inv_freq.data(), rotary / 2, f.positions[t], cosv.data(), sinv.data());
        for (int32_t h = 0; h < num_heads + 2 * s->num_kv_heads; ++h) {
            const float *src = qkv.data() + (size_t)t * width + (size_t)h * hd;
            int is_v = h >= num_heads + s->num_kv_heads;
            if (is_v) {
                memcpy(head.data(), src, hd * 4);
            } else {
                glmrt_rms_norm_row(src, h < num_heads ? q_norm.data() : k_norm.data(), hd, 1e-5f, head.data());
                glmrt_rope_apply(head.data(), rotary / 2, cosv.data(), sinv.data());
            }
            for (int32_t d = 0; d < hd; ++d) {
                if (h < num_heads) {
                    double got = got_q[(size_t)t * width + (size_t)h * hd + d];
                    worst = fmax(worst, fabs(got - head[d]) / (fabs(head[d]) + 0.1));
                } else {
                    int32_t kvh = is_v ? h - num_heads - s->num_kv_heads : h - num_heads;
                    int32_t page = f.tables[f.token_seq[t]][f.positions[t] / s->page_size];
                    uint16_t stored = got_cache[glmrt_kv_index(s, s->num_layers - 1, page, is_v, kvh, f.positions[t] % s->page_size, d)];
                    int diff = abs((int)stored - (int)glmrt_float_to_bf16(head[d]));
                    bf16_off += diff > 1;
                }
            }
        }
    }
    char what[200];
    snprintf(what, sizeof(what), "%s, %d tokens: qk-norm + partial rope on q matches the CPU", label, tokens);
    glmrt_test_expect(report, status == GLMRT_OK && worst < 1e-4, what, worst, 1e-4);
    snprintf(what, sizeof(what), "%s, %d tokens: k and v land in their pages within 1 bf16 ulp", label, tokens);
    glmrt_test_expect(report, status == GLMRT_OK && bf16_off == 0, what, (double)bf16_off, 0);
    snprintf(what, sizeof(what), "%s, %d tokens: the chosen kernel and the shared-memory one give the same bits", label,
             tokens);
    glmrt_test_expect(report, status == GLMRT_OK && same_bits, what, same_bits ? 0.0 : 1.0, 0);
    cudaFree(d_qkv);
    cudaFree(d_qn);
    cudaFree(d_kn);
    cudaFree(d_cache);
    cudaFree(d_pos);
    cudaFree(d_seq);
    cudaFree(d_begin);
    cudaFree(d_pages);
}

static std::vector<glmrt_fake_seq> glmrt_with_decodes(std::vector<glmrt_fake_seq> seqs, int32_t shares,
                                                      const std::vector<int32_t> &positions)
{
    for (int32_t p : positions) seqs.push_back({p, 1, shares});
    return seqs;
}

static void glmrt_check_long_contexts(glmrt_test_report *report, glmrt_test_rng *rng)
{
    const glmrt_attention_setup s = {128, 1, 12, 16, 2080, 1};
    const glmrt_cuda_split_policy policy = {GLMRT_ATTENTION_KEYS_PER_SPLIT, GLMRT_ATTENTION_MAX_SPLITS, 12};
    std::vector<glmrt_fake_seq> seqs = {{32768, 1, 0}, {0, 600, 1},    {500, 30, 1},  {4050, 100, 1},
                                        {8150, 100, 1}, {32700, 69, 1}, {16340, 60, 1}};
    const std::vector<int32_t> decode_positions = {0, 14, 15, 16, 510, 511, 512, 513, 599, 4095, 4096, 8191, 8192,
                                                   8193, 16383, 16384, 16385, 32767};
    const int32_t first_decode = (int32_t)seqs.size();
    seqs = glmrt_with_decodes(seqs, 1, decode_positions);
    std::vector<glmrt_position_pair> pairs = {{1, 2, 500, 529}, {5, 0, 32768, 32768}};
    for (size_t i = 0; i < decode_positions.size(); ++i) {
        int32_t p = decode_positions[i];
        int32_t chunk = p < 600 ? 1 : p < 4150 ? 3 : p < 8250 ? 4 : p < 16400 ? 6 : 5;
        pairs.push_back({chunk, first_decode + (int32_t)i, p, p});
    }
    std::vector<int32_t> reference = {0, 1, 2, 3, 4, 5, 6};
    for (size_t i = 0; i < decode_positions.size(); ++i) reference.push_back(first_decode + (int32_t)i);
    glmrt_check_paths_agree(report, rng, &s, &policy, seqs, pairs, 0, reference,
                            "head_dim 128 group 12, contexts 1 to 32769");
}

static void glmrt_check_small_splits(glmrt_test_report *report, glmrt_test_rng *rng, const glmrt_attention_setup *s,
                                     const char *label)
{
    const glmrt_cuda_split_policy policy = {64, 4, s->group};
    std::vector<glmrt_fake_seq> seqs = {{0, 700, 0}, {250, 20, 1}, {640, 60, 1}, {1500, 1, 0}, {60, 9, 1}};
    const std::vector<int32_t> decode_positions = {0, 62, 63, 64, 65, 255, 256, 257, 511, 512, 513, 699};
    seqs = glmrt_with_decodes(seqs, 1, decode_positions);
    std::vector<glmrt_position_pair> pairs = {{0, 1, 250, 269}, {0, 2, 640, 699}, {0, 4, 60, 68}};
    for (size_t i = 0; i < decode_positions.size(); ++i) {
        pairs.push_back({0, 5 + (int32_t)i, decode_positions[i], decode_positions[i]});
    }
    std::vector<int32_t> reference = {0, 1, 2, 3, 4};
    for (size_t i = 0; i < decode_positions.size(); ++i) reference.push_back(5 + (int32_t)i);
    glmrt_check_paths_agree(report, rng, s, &policy, seqs, pairs, 0, reference, label);
}

__global__ void glmrt_normalize_probe_kernel(const float *sums, const float *totals, uint32_t *normalized,
                                             uint32_t *divided, int32_t count)
{
    const int32_t i = (int32_t)(blockIdx.x * blockDim.x + threadIdx.x);
    if (i < count) {
        const bool in_range = glmrt_attn_quotient_operand(sums[i]) && glmrt_attn_quotient_operand(totals[i]);
        const float quotient = glmrt_attn_quotient_by(sums[i], totals[i], glmrt_attn_refined_reciprocal(totals[i]));
        normalized[i] = __float_as_uint(in_range ? quotient : glmrt_attn_normalize(sums[i], totals[i]));
        divided[i] = __float_as_uint(__fdiv_rn(sums[i], totals[i]));
    }
}

static float glmrt_float_of_bits(uint32_t bits)
{
    float value;
    memcpy(&value, &bits, sizeof(value));
    return value;
}

static float glmrt_scaled_normal(glmrt_test_rng *rng, int32_t lowest_exponent, int32_t exponent_span)
{
    return ldexpf(glmrt_test_normal(rng), lowest_exponent + glmrt_test_below(rng, exponent_span));
}

static void glmrt_normalize_inputs(glmrt_test_rng *rng, std::vector<float> &sums, std::vector<float> &totals)
{
    const float specials[] = {0.0f, -0.0f, 0x1p-149f, -0x1p-149f, 0x1p-126f, INFINITY, -INFINITY, NAN, 0x1p-40f,
                              0x1p40f, 0x1.fffffep-41f, 0x1.000002p40f, 1.0f, 3.0f, 0x1.fffffep127f};
    const int32_t num_specials = (int32_t)(sizeof(specials) / sizeof(specials[0]));
    for (size_t i = 0; i < sums.size(); ++i) {
        const int32_t kind = (int32_t)(i % 4);
        if (kind == 0) {
            sums[i] = glmrt_float_of_bits((uint32_t)glmrt_test_next(rng));
            totals[i] = glmrt_float_of_bits((uint32_t)glmrt_test_next(rng) & 0x7fffffffu);
        } else if (kind == 1) {
            sums[i] = glmrt_scaled_normal(rng, -60, 120);
            totals[i] = fabsf(glmrt_scaled_normal(rng, -60, 120));
        } else if (kind == 2) {
            sums[i] = glmrt_scaled_normal(rng, -8, 20);
            totals[i] = ldexpf(1.0f + (float)glmrt_test_unit(rng), glmrt_test_below(rng, 26));
        } else {
            sums[i] = specials[glmrt_test_below(rng, num_specials)] * (glmrt_test_below(rng, 2) ? 1.0f : -1.0f);
            totals[i] = fabsf(specials[glmrt_test_below(rng, num_specials)]);
        }
    }
}

static void glmrt_check_normalize(glmrt_test_report *report, glmrt_test_rng *rng)
{
    const int32_t count = 1 << 22;
    std::vector<float> sums(count);
    std::vector<float> totals(count);
    glmrt_normalize_inputs(rng, sums, totals);
    float *sums_dev = glmrt_test_upload(sums);
    float *totals_dev = glmrt_test_upload(totals);
    uint32_t *normalized_dev = glmrt_test_alloc<uint32_t>(count);
    uint32_t *divided_dev = glmrt_test_alloc<uint32_t>(count);
    if (sums_dev != nullptr && totals_dev != nullptr && normalized_dev != nullptr && divided_dev != nullptr) {
        glmrt_normalize_probe_kernel<<<(count + 255) / 256, 256>>>(sums_dev, totals_dev, normalized_dev, divided_dev, count);
        if (glmrt_test_cuda_ok(report, cudaGetLastError(), "normalize probe launch")) {
            const std::vector<uint32_t> normalized = glmrt_test_download(normalized_dev, count);
            const std::vector<uint32_t> divided = glmrt_test_download(divided_dev, count);
            long differing = 0;
            for (int32_t i = 0; i < count; ++i) {
                const bool both_nan = isnan(glmrt_float_of_bits(normalized[i])) && isnan(glmrt_float_of_bits(divided[i]));
                differing += normalized[i] != divided[i] && !both_nan;
            }
            glmrt_test_expect(report, differing == 0, "reciprocal-and-residual quotient equals IEEE division on 4M pairs",
                              (double)differing, 0);
        }
    } else {
        glmrt_test_expect(report, 0, "normalisation probe buffers", 1, 0);
    }
    cudaFree(sums_dev);
    cudaFree(totals_dev);
    cudaFree(normalized_dev);
    cudaFree(divided_dev);
}

static void glmrt_check_merge_round(glmrt_test_report *report, glmrt_test_rng *rng, const glmrt_attention_setup *s,
                                    const std::vector<glmrt_fake_seq> &seqs, int32_t grid_limit, int must_fuse,
                                    const char *label)
{
    const glmrt_cuda_split_policy policy = {GLMRT_ATTENTION_KEYS_PER_SPLIT, GLMRT_ATTENTION_MAX_SPLITS, s->group};
    glmrt_attention_data a;
    glmrt_attention_fill(&a, s, seqs, rng);
    a.check_round = 1;
    a.grid_limit = grid_limit;
    glmrt_error error;
    glmrt_error_clear(&error);
    if (!glmrt_attention_ran(report, glmrt_attention_compute(&a, s, &policy, &error), &error, label)) return;
    char what[240];
    snprintf(what, sizeof(what), "%s, %d tokens, %d merges: merge and rounding in one cluster kernel (%d blocks a row) "
             "give the separate kernels' bits", label, a.f.batch.num_tokens, a.counts.num_merges, a.round_blocks);
    const bool fused_when_asked = !must_fuse || a.round_blocks > 0;
    const bool same_when_fused = a.round_blocks == 0 || a.round_same == 1;
    glmrt_test_expect(report, fused_when_asked && same_when_fused, what, a.round_blocks > 0 ? (double)a.round_same : -1.0,
                      1);
}

static void glmrt_check_merge_rounds(glmrt_test_report *report, glmrt_test_rng *rng)
{
    const glmrt_attention_setup glm = {128, 8, 12, 16, 1400, 1};
    glmrt_check_merge_round(report, rng, &glm, {{1023, 1, 0}}, 0, 1, "head_dim 128 group 12, one row of 1,024 keys");
    glmrt_check_merge_round(report, rng, &glm, {{299, 1, 0}}, 0, 1, "head_dim 128 group 12, one row of 300 keys");
    const std::vector<glmrt_fake_seq> decodes = {{1023, 1, 0}, {40, 1, 0}, {2000, 1, 0}, {511, 1, 0},
                                                 {512, 1, 0},  {5000, 1, 0}, {0, 1, 0},   {700, 1, 0}};
    glmrt_check_merge_round(report, rng, &glm, decodes, 0, 1, "head_dim 128 group 12, eight decode rows");
    glmrt_check_merge_round(report, rng, &glm, decodes, 2, 1,
                            "head_dim 128 group 12, eight decode rows counted on the device");
    glmrt_check_merge_round(report, rng, &glm, {{0, 9, 0}, {1500, 1, 0}, {300, 2, 0}, {3000, 1, 0}}, 0, 1,
                            "head_dim 128 group 12, prefill chunks beside decode rows");
    const glmrt_attention_setup wide = {64, 2, 16, 8, 400, 1};
    glmrt_check_merge_round(report, rng, &wide, {{600, 1, 0}, {90, 1, 0}, {1200, 1, 0}}, 0, 0,
                            "head_dim 64 group 16");
    const glmrt_attention_setup small = {32, 2, 2, 16, 128, 1};
    glmrt_check_merge_round(report, rng, &small, {{600, 1, 0}, {5, 1, 0}}, 0, 0, "head_dim 32 group 2");
}

int main(int argc, char **argv)
{
    const int quick = argc > 1 && strcmp(argv[1], "quick") == 0;
    glmrt_test_report report = {0, 0};
    glmrt_test_rng rng = {4242};
    glmrt_test_rng normalize_rng = {977};
    glmrt_check_normalize(&report, &normalize_rng);
    glmrt_attention_setup glm = {128, 2, 12, 16, 256, 2};
    const std::vector<glmrt_fake_seq> rope_few = {{0, 5, 0}, {1000, 1, 0}, {77, 3, 0}};
    const std::vector<glmrt_fake_seq> rope_many = {{0, 70, 0}, {300, 1, 0}, {90, 4, 0}};
    glmrt_check_rope_store(&report, &rng, &glm, rope_few, "head_dim 128");
    glmrt_check_rope_store(&report, &rng, &glm, rope_many, "head_dim 128");
    const glmrt_cuda_split_policy glm_policy = {GLMRT_ATTENTION_KEYS_PER_SPLIT, GLMRT_ATTENTION_MAX_SPLITS, 12};
    std::vector<glmrt_fake_seq> mixed = {{699, 1, 0}, {36, 1, 0}, {20, 9, 0}, {0, 23, 0}, {1500, 1, 0}, {300, 2, 0}};
    glmrt_check_attention(&report, &rng, &glm, &glm_policy, mixed, "head_dim 128 group 12");
    glmrt_attention_setup small = {32, 2, 2, 16, 128, 1};
    const glmrt_cuda_split_policy small_policy = {GLMRT_ATTENTION_KEYS_PER_SPLIT, GLMRT_ATTENTION_MAX_SPLITS, 2};
    std::vector<glmrt_fake_seq> small_seqs = {{0, 17, 0}, {400, 1, 0}, {5, 1, 0}, {600, 80, 0}};
    glmrt_check_rope_store(&report, &rng, &small, rope_few, "head_dim 32");
    glmrt_check_attention(&report, &rng, &small, &small_policy, small_seqs, "head_dim 32 group 2");
    glmrt_attention_setup wide = {64, 1, 16, 8, 96, 1};
    const glmrt_cuda_split_policy wide_policy = {GLMRT_ATTENTION_KEYS_PER_SPLIT, GLMRT_ATTENTION_MAX_SPLITS, 16};
    std::vector<glmrt_fake_seq> wide_seqs = {{0, 6, 0}, {500, 1, 0}, {200, 3, 0}};
    glmrt_check_attention(&report, &rng, &wide, &wide_policy, wide_seqs, "head_dim 64 group 16");
    const std::vector<glmrt_fake_seq> rope_wide_few = {{0, 5, 0}, {500, 1, 0}, {77, 3, 0}};
    glmrt_check_rope_store(&report, &rng, &wide, rope_wide_few, "head_dim 64");
    glmrt_check_rope_store(&report, &rng, &wide, rope_many, "head_dim 64");
    glmrt_attention_setup single = {128, 4, 1, 16, 64, 1};
    const glmrt_cuda_split_policy single_policy = {GLMRT_ATTENTION_KEYS_PER_SPLIT, GLMRT_ATTENTION_MAX_SPLITS, 1};
    std::vector<glmrt_fake_seq> single_seqs = {{0, 40, 0}, {300, 1, 0}, {520, 150, 0}};
    glmrt_check_attention(&report, &rng, &single, &single_policy, single_seqs, "head_dim 128 group 1");
    glmrt_check_merge_rounds(&report, &rng);
    if (!quick) glmrt_check_long_contexts(&report, &rng);
    glmrt_attention_setup glm_splits = {128, 2, 12, 16, 256, 1};
    glmrt_check_small_splits(&report, &rng, &glm_splits, "head_dim 128 group 12, splits of 64 to 512 keys");
    glmrt_attention_setup model_like = {64, 2, 2, 7, 640, 1};
    glmrt_check_small_splits(&report, &rng, &model_like, "head_dim 64 group 2 pages of 7, splits of 64 to 512 keys");
    glmrt_attention_setup narrow = {32, 2, 4, 16, 256, 1};
    glmrt_check_small_splits(&report, &rng, &narrow, "head_dim 32 group 4, splits of 64 to 512 keys");
    return glmrt_test_finish("test_cuda_attention", &report);
}
