#include <stdlib.h>

#include <algorithm>

#include "activation_quant.cuh"
#include "cuda_test_support.cuh"
#include "device_math.cuh"
#include "ops.cuh"
#include "qgemm.cuh"
#include "test_matrices.cuh"

#define GLMRT_QTEST_SMS 132
#define GLMRT_QTEST_FEW_SMS 16
#define GLMRT_QTEST_BOUND 1e-3

typedef struct glmrt_qtest_case {
    const char *name;
    int32_t format;
    int32_t scale_kind;
    int32_t block;
} glmrt_qtest_case;

typedef struct glmrt_qtest_rows {
    std::vector<float> x;
    int32_t rows;
    int32_t cols;
} glmrt_qtest_rows;

typedef struct glmrt_qtest_operand {
    glmrt_cuda_qgemm_operand operand;
    uint8_t *data;
    float *scales;
} glmrt_qtest_operand;

static glmrt_qtest_rows glmrt_qtest_make_rows(glmrt_test_rng *rng, int32_t rows, int32_t cols)
{
    glmrt_qtest_rows r;
    r.rows = rows;
    r.cols = cols;
    r.x.resize((size_t)rows * cols);
    for (int32_t i = 0; i < rows; ++i) {
        float magnitude = powf(10.0f, (float)(i % 7) - 3.0f);
        for (int32_t c = 0; c < cols; ++c) {
            float value = glmrt_test_normal(rng) * magnitude;
            if (i % 23 == 3) {
                value = 0.0f;
            } else if (i % 23 == 7) {
                value = (c % 5 == 0 ? 3.0e4f : -3.0e4f);
            } else if (i % 23 == 11) {
                value = (c % 2 == 0 ? 1.0f : -1.0f);
            }
            r.x[(size_t)i * cols + c] = value;
        }
    }
    return r;
}

static glmrt_qtest_operand *glmrt_qtest_operand_new(int32_t kind, int32_t cols, int32_t capacity_rows,
                                                    glmrt_error *error, glmrt_status *status)
{
    glmrt_qtest_operand *o = nullptr;
    if (posix_memalign((void **)&o, 64, sizeof(glmrt_qtest_operand)) != 0) {
        *status = GLMRT_ERR_OUT_OF_MEMORY;
        return nullptr;
    }
    memset(o, 0, sizeof(*o));
    o->data = glmrt_test_alloc<uint8_t>((size_t)capacity_rows * cols * glmrt_operand_bytes(kind));
    o->scales = glmrt_test_alloc<float>((size_t)capacity_rows);
    if (*status == GLMRT_OK) {
        *status = glmrt_cuda_qgemm_operand_prepare(&o->operand, kind, o->data, o->scales, cols, capacity_rows,
                                                   "test activations", error);
    }
    return o;
}

static void glmrt_qtest_expect_none(glmrt_test_report *report, const char *what, long differing, glmrt_status status,
                                    const glmrt_error *error)
{
    glmrt_test_expect(report, status == GLMRT_OK && differing == 0, what, (double)differing, 0);
    if (status != GLMRT_OK) {
        printf("error: %s\n", error->message);
    }
}

static void glmrt_qtest_operand_free(glmrt_qtest_operand *o)
{
    if (o != nullptr) {
        cudaFree(o->data);
        cudaFree(o->scales);
        free(o);
    }
}

static glmrt_cuda_qgemm_weight *glmrt_qtest_weight_on(glmrt_cuda_matrix *m, int32_t num_sms, int32_t allow_split,
                                                      glmrt_error *error, glmrt_status *status)
{
    glmrt_cuda_qgemm_weight *q = nullptr;
    if (posix_memalign((void **)&q, 64, sizeof(glmrt_cuda_qgemm_weight)) != 0) {
        *status = GLMRT_ERR_OUT_OF_MEMORY;
        return nullptr;
    }
    if (*status == GLMRT_OK) {
        *status = glmrt_cuda_qgemm_weight_prepare(m, num_sms, allow_split, q, error);
    }
    m->qgemm = q;
    return q;
}

static glmrt_cuda_qgemm_weight *glmrt_qtest_weight_new(glmrt_cuda_matrix *m, int32_t allow_split, glmrt_error *error,
                                                       glmrt_status *status)
{
    return glmrt_qtest_weight_on(m, GLMRT_QTEST_SMS, allow_split, error, status);
}

static glmrt_status glmrt_qtest_quantize_counted(const float *d_x, int64_t stride, const int32_t *d_rows, int32_t op,
                                                 int32_t rows, const int32_t *d_counted,
                                                 const glmrt_cuda_qgemm_operand *out, glmrt_error *error)
{
    glmrt_cuda_activation_args args;
    args.x = d_x;
    args.x_stride = stride;
    args.x_rows = d_rows;
    args.op = op;
    args.num_rows = rows;
    args.device_rows = d_counted;
    args.out = out;
    return glmrt_cuda_activation_quantize(&args, 0, error);
}

static glmrt_status glmrt_qtest_quantize(const float *d_x, int64_t stride, const int32_t *d_rows, int32_t op,
                                         int32_t rows, const glmrt_cuda_qgemm_operand *out, glmrt_error *error)
{
    return glmrt_qtest_quantize_counted(d_x, stride, d_rows, op, rows, nullptr, out, error);
}

static glmrt_status glmrt_qtest_run(const glmrt_cuda_matrix *m, const glmrt_cuda_qgemm_operand *x, int32_t rows,
                                    float *d_y, int64_t y_stride, const float *d_bias, int32_t accumulate,
                                    const glmrt_cuda_qgemm_split *split, glmrt_error *error)
{
    glmrt_cuda_qgemm_call call;
    memset(&call, 0, sizeof(call));
    call.w = m;
    call.x = x;
    call.num_rows = rows;
    call.y = d_y;
    call.y_stride = y_stride;
    call.bias = d_bias;
    call.accumulate = accumulate;
    return glmrt_cuda_qgemm_run(&call, split, 0, error);
}

static double glmrt_qtest_operand_value(int32_t kind, const std::vector<uint8_t> &q, int64_t index)
{
    if (kind == GLMRT_OPERAND_FP8) {
        return glmrt_fp8_e4m3_to_float(q[(size_t)index]);
    }
    uint16_t bits;
    memcpy(&bits, &q[(size_t)index * 2], 2);
    return glmrt_bf16_to_float(bits);
}

static double glmrt_qtest_raw_weight(const glmrt_host_matrix &h, int32_t group, int32_t row, int32_t col)
{
    const glmrt_cuda_matrix &m = h.m;
    const uint8_t *base = h.data.data() + (size_t)group * m.group_bytes;
    int64_t index = (int64_t)row * m.cols + col;
    if (m.format == GLMRT_CUDA_FORMAT_BF16) {
        uint16_t bits;
        memcpy(&bits, base + index * 2, 2);
        return glmrt_bf16_to_float(bits);
    }
    return glmrt_fp8_e4m3_to_float(base[index]);
}

static void glmrt_qtest_reference(const glmrt_host_matrix &h, int32_t group, int32_t kind,
                                  const std::vector<uint8_t> &q, const std::vector<float> &scales, int32_t row,
                                  int32_t n, const std::vector<float> &bias, double *out_value, double *out_magnitude)
{
    const glmrt_cuda_matrix &m = h.m;
    const float *w_scale = h.scale.empty() ? nullptr : h.scale.data() + (size_t)group * m.group_scales;
    double sum = 0.0;
    double magnitude = 0.0;
    double block_sum = 0.0;
    double block_magnitude = 0.0;
    for (int32_t k = 0; k < m.cols; ++k) {
        double term = glmrt_qtest_operand_value(kind, q, (int64_t)row * m.cols + k) * glmrt_qtest_raw_weight(h, group, n, k);
        block_sum += term;
        block_magnitude += fabs(term);
        bool block_end = m.scale_kind == GLMRT_CUDA_SCALE_BLOCK ? (k + 1) % m.block_cols == 0 || k + 1 == m.cols
                                                                : k + 1 == m.cols;
        if (block_end) {
            double s = 1.0;
            if (m.scale_kind == GLMRT_CUDA_SCALE_BLOCK) {
                s = w_scale[(int64_t)glmrt_cuda_matrix_row_block(&m, n) * m.scale_cols + k / m.block_cols];
            } else if (m.scale_kind == GLMRT_CUDA_SCALE_CHANNEL) {
                s = w_scale[n];
            }
            sum += block_sum * s;
            magnitude += block_magnitude * s;
            block_sum = 0.0;
            block_magnitude = 0.0;
        }
    }
    double x_scale = kind == GLMRT_OPERAND_FP8 ? scales[(size_t)row] : 1.0;
    *out_value = sum * x_scale + (bias.empty() ? 0.0 : bias[(size_t)n]);
    *out_magnitude = magnitude * x_scale + (bias.empty() ? 0.0 : fabs(bias[(size_t)n]));
}

static long glmrt_qtest_check_quantized(int32_t kind, const glmrt_qtest_rows &rows,
                                        const std::vector<int32_t> &gather, const std::vector<uint8_t> &q,
                                        const std::vector<float> &scales, int32_t cols)
{
    long mismatches = 0;
    for (size_t r = 0; r < gather.size(); ++r) {
        const float *source = rows.x.data() + (size_t)gather[r] * rows.cols;
        std::vector<float> values(source, source + cols);
        if (kind == GLMRT_OPERAND_BF16) {
            for (int32_t c = 0; c < cols; ++c) {
                uint16_t bits;
                memcpy(&bits, &q[((size_t)r * cols + c) * 2], 2);
                mismatches += bits != glmrt_float_to_bf16(values[(size_t)c]);
            }
            continue;
        }
        float amax = 0.0f;
        for (float v : values) {
            amax = fmaxf(amax, fabsf(v));
        }
        float scale = amax > 0.0f ? amax / GLMRT_FP8_E4M3_MAX : 1.0f;
        mismatches += memcmp(&scale, &scales[r], 4) != 0;
        for (int32_t c = 0; c < cols; ++c) {
            mismatches += q[(size_t)r * cols + c] != glmrt_fp8_e4m3_from_float(values[(size_t)c] / scale);
        }
    }
    return mismatches;
}

static long glmrt_qtest_gather_rounded(int32_t kind, const float *d_act, int32_t rows, const int32_t *d_gather,
                                       int32_t gathered, int32_t width, const std::vector<uint8_t> &expected,
                                       const std::vector<float> &expected_scales, glmrt_status *status,
                                       glmrt_error *error)
{
    glmrt_qtest_operand *whole = glmrt_qtest_operand_new(kind, width, rows, error, status);
    glmrt_qtest_operand *copied = glmrt_qtest_operand_new(kind, width, gathered, error, status);
    if (*status == GLMRT_OK) {
        *status = glmrt_qtest_quantize(d_act, width, nullptr, GLMRT_ACTIVATION_COPY, rows, &whole->operand, error);
    }
    if (*status == GLMRT_OK) {
        glmrt_cuda_operand_gather_args args;
        args.source = &whole->operand;
        args.source_rows = d_gather;
        args.num_rows = gathered;
        args.device_rows = nullptr;
        args.out = &copied->operand;
        *status = glmrt_cuda_operand_gather(&args, 0, error);
    }
    long mismatches = 0;
    if (*status == GLMRT_OK) {
        std::vector<uint8_t> q = glmrt_test_download(copied->data, (size_t)gathered * width * glmrt_operand_bytes(kind));
        mismatches += memcmp(q.data(), expected.data(), q.size()) != 0;
        if (kind == GLMRT_OPERAND_FP8) {
            std::vector<float> s = glmrt_test_download(copied->scales, (size_t)gathered);
            mismatches += memcmp(s.data(), expected_scales.data(), s.size() * 4) != 0;
        }
    }
    glmrt_qtest_operand_free(whole);
    glmrt_qtest_operand_free(copied);
    return *status == GLMRT_OK ? mismatches : 1;
}

static long glmrt_qtest_counted_rows(int32_t kind, const float *d_gate_up, int32_t rows, int32_t counted,
                                     int32_t width, const std::vector<uint8_t> &expected,
                                     const std::vector<float> &expected_scales, glmrt_status *status, glmrt_error *error)
{
    const size_t row_bytes = (size_t)width * glmrt_operand_bytes(kind);
    glmrt_qtest_operand *o = glmrt_qtest_operand_new(kind, width, rows, error, status);
    int32_t *d_count = glmrt_test_upload(std::vector<int32_t>{counted});
    if (*status == GLMRT_OK && d_count == nullptr) {
        *status = glmrt_error_set(error, GLMRT_ERR_OUT_OF_MEMORY, "cannot upload the device row count");
    }
    if (*status == GLMRT_OK && (cudaMemset(o->data, 0xA5, (size_t)rows * row_bytes) != cudaSuccess ||
                                cudaMemset(o->scales, 0xA5, (size_t)rows * sizeof(float)) != cudaSuccess)) {
        *status = glmrt_error_set(error, GLMRT_ERR_BACKEND, "cannot fill the rounded rows before the counted rounding");
    }
    if (*status == GLMRT_OK) {
        *status = glmrt_qtest_quantize_counted(d_gate_up, 2 * (int64_t)width, nullptr, GLMRT_ACTIVATION_SILU_MUL, rows,
                                               d_count, &o->operand, error);
    }
    long mismatches = 0;
    if (*status == GLMRT_OK) {
        std::vector<uint8_t> q = glmrt_test_download(o->data, (size_t)rows * row_bytes);
        std::vector<float> s = glmrt_test_download(o->scales, (size_t)rows);
        mismatches += memcmp(q.data(), expected.data(), (size_t)counted * row_bytes) != 0;
        for (size_t i = (size_t)counted * row_bytes; i < q.size(); ++i) {
            mismatches += q[i] != 0xA5;
        }
        if (kind == GLMRT_OPERAND_FP8) {
            mismatches += memcmp(s.data(), expected_scales.data(), (size_t)counted * sizeof(float)) != 0;
        }
        const uint32_t untouched_bits = 0xA5A5A5A5u;
        for (int32_t r = kind == GLMRT_OPERAND_FP8 ? counted : 0; r < rows; ++r) {
            mismatches += memcmp(&s[(size_t)r], &untouched_bits, sizeof(float)) != 0;
        }
    }
    cudaFree(d_count);
    glmrt_qtest_operand_free(o);
    return *status == GLMRT_OK ? mismatches : 1;
}

static void glmrt_qtest_activations(glmrt_test_report *report, glmrt_test_rng *rng, int32_t rows, int32_t gathered,
                                    int32_t width)
{
    glmrt_qtest_rows gate_up = glmrt_qtest_make_rows(rng, rows, 2 * width);
    float *d_gate_up = glmrt_test_upload(gate_up.x);
    float *d_act = glmrt_test_alloc<float>((size_t)rows * width);
    std::vector<int32_t> gather;
    for (int32_t r = 0; r < gathered; ++r) {
        gather.push_back((r * 37) % rows);
    }
    int32_t *d_gather = glmrt_test_upload(gather);
    glmrt_error error;
    glmrt_error_clear(&error);
    glmrt_status status = glmrt_cuda_silu_mul(d_gate_up, width, rows, nullptr, d_act, 0, &error);
    std::vector<float> act = glmrt_test_download(d_act, (size_t)rows * width);
    glmrt_qtest_rows act_rows;
    act_rows.x = act;
    act_rows.rows = rows;
    act_rows.cols = width;
    for (int32_t kind : {GLMRT_OPERAND_FP8, GLMRT_OPERAND_BF16}) {
        glmrt_qtest_operand *o = glmrt_qtest_operand_new(kind, width, rows > gathered ? rows : gathered, &error,
                                                         &status);
        std::vector<int32_t> identity;
        for (int32_t r = 0; r < rows; ++r) {
            identity.push_back(r);
        }
        long mismatches = 0;
        if (status == GLMRT_OK) {
            status = glmrt_qtest_quantize(d_gate_up, 2 * width, nullptr, GLMRT_ACTIVATION_SILU_MUL, rows, &o->operand,
                                          &error);
        }
        std::vector<uint8_t> q = glmrt_test_download(o->data, (size_t)rows * width * glmrt_operand_bytes(kind));
        std::vector<float> s = glmrt_test_download(o->scales, (size_t)rows);
        mismatches += glmrt_qtest_check_quantized(kind, act_rows, identity, q, s, width);
        const int32_t counted = rows / 3 + 1;
        const long counted_mismatches = glmrt_qtest_counted_rows(kind, d_gate_up, rows, counted, width, q, s, &status,
                                                                 &error);
        char counted_what[200];
        snprintf(counted_what, sizeof(counted_what),
                 "%s SiLU-mul rounding of %d rows counted on the device out of %d writes those rows alone, the same bits",
                 kind == GLMRT_OPERAND_FP8 ? "per-token E4M3" : "BF16", counted, rows);
        glmrt_test_expect(report, status == GLMRT_OK && counted_mismatches == 0, counted_what,
                          (double)counted_mismatches, 0);
        if (status == GLMRT_OK) {
            status = glmrt_qtest_quantize(d_act, width, d_gather, GLMRT_ACTIVATION_COPY, (int32_t)gather.size(),
                                          &o->operand, &error);
        }
        q = glmrt_test_download(o->data, gather.size() * width * glmrt_operand_bytes(kind));
        s = glmrt_test_download(o->scales, gather.size());
        mismatches += glmrt_qtest_check_quantized(kind, act_rows, gather, q, s, width);
        long copy_mismatches = glmrt_qtest_gather_rounded(kind, d_act, rows, d_gather, (int32_t)gather.size(), width,
                                                          q, s, &status, &error);
        char gathered_what[200];
        snprintf(gathered_what, sizeof(gathered_what),
                 "%s rows rounded once and gathered equal the gathered rounding bit for bit, %d rows",
                 kind == GLMRT_OPERAND_FP8 ? "per-token E4M3" : "BF16", gathered);
        glmrt_test_expect(report, status == GLMRT_OK && copy_mismatches == 0, gathered_what, (double)copy_mismatches,
                          0);
        char what[160];
        snprintf(what, sizeof(what),
                 "%s activations (SiLU-mul fused and gathered rows), %d and %d rows of %d columns, equal the CPU rule",
                 kind == GLMRT_OPERAND_FP8 ? "per-token E4M3" : "BF16", rows, gathered, width);
        glmrt_test_expect(report, status == GLMRT_OK && mismatches == 0, what, (double)mismatches, 0);
        glmrt_qtest_operand_free(o);
    }
    cudaFree(d_gate_up);
    cudaFree(d_act);
    cudaFree(d_gather);
}

static double glmrt_qtest_compare(const glmrt_host_matrix &h, int32_t group, int32_t kind,
                                  const std::vector<uint8_t> &q, const std::vector<float> &s,
                                  const std::vector<float> &y, int32_t rows, int32_t y_stride,
                                  const std::vector<float> &bias, double *out_l2)
{
    double worst = 0.0;
    double diff2 = 0.0;
    double ref2 = 0.0;
    for (int32_t r = 0; r < rows; ++r) {
        for (int32_t n = 0; n < h.m.rows; ++n) {
            double ref;
            double magnitude;
            glmrt_qtest_reference(h, group, kind, q, s, r, n, bias, &ref, &magnitude);
            double got = y[(size_t)r * y_stride + n];
            if (isnan(got)) {
                worst = INFINITY;
                continue;
            }
            worst = fmax(worst, fabs(got - ref) / (magnitude + 1e-30));
            diff2 += (got - ref) * (got - ref);
            ref2 += ref * ref;
        }
    }
    *out_l2 = ref2 > 0.0 ? sqrt(diff2 / ref2) : sqrt(diff2);
    return worst;
}

static long glmrt_qtest_wide_tiles_differ(glmrt_cuda_matrix *m, const glmrt_cuda_qgemm_operand *x, int32_t rows,
                                          int32_t n, const float *d_bias, const glmrt_cuda_qgemm_split *split,
                                          int32_t allow_split, float *d_out, const std::vector<float> &y,
                                          glmrt_error *error, glmrt_status *status)
{
    const glmrt_cuda_qgemm_weight *many = m->qgemm;
    glmrt_cuda_qgemm_weight *few = glmrt_qtest_weight_on(m, GLMRT_QTEST_FEW_SMS, allow_split, error, status);
    long differing = -1;
    if (*status == GLMRT_OK && few->splits == many->splits) {
        *status = glmrt_qtest_run(m, x, rows, d_out, n, d_bias, 0, split, error);
        std::vector<float> y_few = glmrt_test_download(d_out, (size_t)rows * n);
        differing = 0;
        for (size_t i = 0; i < y_few.size(); ++i) {
            differing += memcmp(&y_few[i], &y[i], 4) != 0;
        }
    }
    m->qgemm = many;
    free(few);
    return differing;
}

static std::vector<float> glmrt_qtest_random_bias(glmrt_test_rng *rng, int32_t n)
{
    std::vector<float> bias((size_t)n);
    for (float &v : bias) {
        v = glmrt_test_normal(rng) * 0.1f;
    }
    return bias;
}

static glmrt_cuda_qgemm_split glmrt_qtest_split_new(int32_t n)
{
    glmrt_cuda_qgemm_split split;
    split.partial_elements = glmrt_cuda_qgemm_split_partial_elements(
        GLMRT_QGEMM_MAX_SPLITS * glmrt_ceil_div(n, GLMRT_QGEMM_WEIGHT_TILE_ROWS));
    split.num_counters = glmrt_cuda_qgemm_split_counters(n);
    split.partials = glmrt_test_alloc<float>((size_t)split.partial_elements);
    split.counters = glmrt_test_alloc<int32_t>((size_t)split.num_counters);
    cudaMemset(split.counters, 0, (size_t)split.num_counters * sizeof(int32_t));
    return split;
}

static void glmrt_qtest_split_free(glmrt_cuda_qgemm_split *split)
{
    cudaFree(split->partials);
    cudaFree(split->counters);
}

static void glmrt_qtest_dense(glmrt_test_report *report, glmrt_test_rng *rng, const glmrt_qtest_case *tc,
                              int32_t cols, int32_t allow_split)
{
    std::vector<int32_t> parts = {96, 40, 40, 336};
    glmrt_host_matrix h = glmrt_make_matrix(rng, tc->format, tc->scale_kind, parts, cols, 1, tc->block);
    uint8_t *d_data;
    float *d_scale;
    glmrt_device_matrix(&h, &d_data, &d_scale);
    const int32_t n = h.m.rows;
    const int32_t m_rows = 300;
    const int32_t kind = glmrt_cuda_qgemm_operand_kind(&h.m);
    glmrt_qtest_rows x = glmrt_qtest_make_rows(rng, m_rows, cols);
    std::vector<float> bias = glmrt_qtest_random_bias(rng, n);
    float *d_x = glmrt_test_upload(x.x);
    float *d_bias = glmrt_test_upload(bias);
    float *d_y = glmrt_test_alloc<float>((size_t)m_rows * n);
    float *d_y_small = glmrt_test_alloc<float>((size_t)m_rows * n);
    glmrt_cuda_qgemm_split split = glmrt_qtest_split_new(n);
    glmrt_error error;
    glmrt_error_clear(&error);
    glmrt_status status = GLMRT_OK;
    glmrt_cuda_qgemm_weight *q = glmrt_qtest_weight_new(&h.m, allow_split, &error, &status);
    glmrt_qtest_operand *o = glmrt_qtest_operand_new(kind, cols, m_rows, &error, &status);
    if (status == GLMRT_OK) {
        status = glmrt_qtest_quantize(d_x, cols, nullptr, GLMRT_ACTIVATION_COPY, m_rows, &o->operand, &error);
    }
    if (status == GLMRT_OK) {
        status = glmrt_qtest_run(&h.m, &o->operand, m_rows, d_y, n, d_bias, 0, &split, &error);
    }
    std::vector<float> y = glmrt_test_download(d_y, (size_t)m_rows * n);
    std::vector<uint8_t> qx = glmrt_test_download(o->data, (size_t)m_rows * cols * glmrt_operand_bytes(kind));
    std::vector<float> sx = glmrt_test_download(o->scales, (size_t)m_rows);
    double l2 = 0.0;
    double worst = status == GLMRT_OK ? glmrt_qtest_compare(h, 0, kind, qx, sx, y, m_rows, n, bias, &l2) : INFINITY;
    char what[200];
    snprintf(what, sizeof(what), "qgemm %s K=%d (%d splits) matches a float64 reference of the same math", tc->name,
             cols, q != nullptr ? q->splits : 0);
    glmrt_test_expect(report, status == GLMRT_OK && worst < GLMRT_QTEST_BOUND, what, worst, GLMRT_QTEST_BOUND);
    snprintf(what, sizeof(what), "qgemm %s K=%d relative L2 error", tc->name, cols);
    glmrt_test_expect(report, status == GLMRT_OK && l2 < GLMRT_QTEST_BOUND, what, l2, GLMRT_QTEST_BOUND);
    const long wide_differing = status == GLMRT_OK ? glmrt_qtest_wide_tiles_differ(&h.m, &o->operand, m_rows, n, d_bias,
                                                                                  &split, allow_split, d_y_small, y,
                                                                                  &error, &status)
                                                   : -1;
    snprintf(what, sizeof(what),
             "qgemm %s K=%d %d rows in 128-row tiles (%d SMs) equal them in 64-row tiles (%d SMs) bitwise", tc->name,
             cols, m_rows, GLMRT_QTEST_FEW_SMS, GLMRT_QTEST_SMS);
    glmrt_test_expect(report, status == GLMRT_OK && wide_differing == 0, what, (double)wide_differing, 0);
    long differing = 0;
    const int32_t windows[][2] = {{0, 1}, {5, 1}, {7, 8}, {9, 13}, {20, 16}, {31, 33}, {100, 64}, {150, 65}, {2, 130}};
    for (const int32_t *window : windows) {
        if (status != GLMRT_OK) {
            break;
        }
        status = glmrt_qtest_quantize(d_x + (size_t)window[0] * cols, cols, nullptr, GLMRT_ACTIVATION_COPY, window[1],
                                      &o->operand, &error);
        if (status == GLMRT_OK) {
            status = glmrt_qtest_run(&h.m, &o->operand, window[1], d_y_small, n, d_bias, 0, &split, &error);
        }
        std::vector<float> y_small = glmrt_test_download(d_y_small, (size_t)window[1] * n);
        differing += memcmp(y_small.data(), y.data() + (size_t)window[0] * n, y_small.size() * 4) != 0;
    }
    snprintf(what, sizeof(what), "qgemm %s K=%d rows are bitwise equal alone and in 8 to 300 rows", tc->name, cols);
    glmrt_test_expect(report, status == GLMRT_OK && differing == 0, what, (double)differing, 0);
    if (status == GLMRT_OK) {
        status = glmrt_qtest_quantize(d_x, cols, nullptr, GLMRT_ACTIVATION_COPY, 17, &o->operand, &error);
    }
    if (status == GLMRT_OK) {
        status = glmrt_qtest_run(&h.m, &o->operand, 17, d_y, n, d_bias, 1, &split, &error);
    }
    std::vector<float> y_twice = glmrt_test_download(d_y, (size_t)17 * n);
    long wrong_sums = 0;
    for (size_t i = 0; i < y_twice.size(); ++i) {
        float expected = y[i] + y[i];
        wrong_sums += memcmp(&expected, &y_twice[i], 4) != 0;
    }
    snprintf(what, sizeof(what), "qgemm %s K=%d accumulates into its output", tc->name, cols);
    glmrt_test_expect(report, status == GLMRT_OK && wrong_sums == 0, what, (double)wrong_sums, 0);
    glmrt_qtest_operand_free(o);
    free(q);
    cudaFree(d_data);
    cudaFree(d_scale);
    cudaFree(d_x);
    cudaFree(d_bias);
    cudaFree(d_y);
    cudaFree(d_y_small);
    glmrt_qtest_split_free(&split);
}

static long glmrt_qtest_differing_rows(const std::vector<float> &a, const std::vector<float> &b, int32_t rows,
                                       int64_t stride, int32_t n)
{
    long differing = 0;
    for (int32_t r = 0; r < rows; ++r) {
        differing += memcmp(a.data() + (size_t)r * stride, b.data() + (size_t)r * stride, (size_t)n * 4) != 0;
    }
    return differing;
}

static void glmrt_qtest_wide(glmrt_test_report *report, glmrt_test_rng *rng, const glmrt_qtest_case *tc)
{
    const int32_t cols = 256;
    const int32_t m_rows = 300;
    const int64_t stride = 8192;
    std::vector<int32_t> parts = {8190};
    glmrt_host_matrix h = glmrt_make_matrix(rng, tc->format, tc->scale_kind, parts, cols, 1, tc->block);
    uint8_t *d_data;
    float *d_scale;
    glmrt_device_matrix(&h, &d_data, &d_scale);
    const int32_t n = h.m.rows;
    const int32_t kind = glmrt_cuda_qgemm_operand_kind(&h.m);
    glmrt_qtest_rows x = glmrt_qtest_make_rows(rng, m_rows, cols);
    std::vector<float> bias = glmrt_qtest_random_bias(rng, n);
    float *d_x = glmrt_test_upload(x.x);
    float *d_bias = glmrt_test_upload(bias);
    const size_t y_count = (size_t)m_rows * stride;
    float *d_y = glmrt_test_alloc<float>(y_count);
    float *d_y_windows = glmrt_test_alloc<float>(y_count);
    glmrt_error error;
    glmrt_error_clear(&error);
    glmrt_status status = GLMRT_OK;
    glmrt_cuda_qgemm_weight *q = glmrt_qtest_weight_new(&h.m, 0, &error, &status);
    glmrt_qtest_operand *o = glmrt_qtest_operand_new(kind, cols, m_rows, &error, &status);
    if (status == GLMRT_OK) {
        status = glmrt_qtest_quantize(d_x, cols, nullptr, GLMRT_ACTIVATION_COPY, m_rows, &o->operand, &error);
    }
    cudaMemset(d_y, 0xff, y_count * 4);
    cudaMemset(d_y_windows, 0xff, y_count * 4);
    if (status == GLMRT_OK) {
        status = glmrt_qtest_run(&h.m, &o->operand, m_rows, d_y, stride, d_bias, 0, nullptr, &error);
    }
    for (int32_t begin = 0; begin < m_rows && status == GLMRT_OK; begin += 50) {
        const int32_t rows = begin + 50 <= m_rows ? 50 : m_rows - begin;
        glmrt_qtest_operand *part = glmrt_qtest_operand_new(kind, cols, rows, &error, &status);
        if (status == GLMRT_OK) {
            status = glmrt_qtest_quantize(d_x + (size_t)begin * cols, cols, nullptr, GLMRT_ACTIVATION_COPY, rows,
                                          &part->operand, &error);
        }
        if (status == GLMRT_OK) {
            status = glmrt_qtest_run(&h.m, &part->operand, rows, d_y_windows + (size_t)begin * stride, stride, d_bias,
                                     0, nullptr, &error);
        }
        glmrt_qtest_operand_free(part);
    }
    std::vector<float> whole = glmrt_test_download(d_y, y_count);
    std::vector<float> windows = glmrt_test_download(d_y_windows, y_count);
    long differing = glmrt_qtest_differing_rows(whole, windows, m_rows, stride, n);
    long padding_written = 0;
    for (int32_t r = 0; r < m_rows; ++r) {
        for (int64_t c = n; c < stride; ++c) {
            uint32_t bits;
            memcpy(&bits, &whole[(size_t)r * stride + c], 4);
            padding_written += bits != 0xffffffffu;
        }
    }
    char what[200];
    snprintf(what, sizeof(what),
             "qgemm %s 300 rows over %d weight rows in 128-row tiles equal 50-row windows bitwise, padding untouched",
             tc->name, n);
    glmrt_test_expect(report, status == GLMRT_OK && differing == 0 && padding_written == 0, what,
                      (double)(differing + padding_written), 0);
    if (status == GLMRT_OK) {
        status = glmrt_qtest_run(&h.m, &o->operand, m_rows, d_y, stride, d_bias, 1, nullptr, &error);
    }
    std::vector<float> twice = glmrt_test_download(d_y, y_count);
    long wrong_sums = 0;
    for (int32_t r = 0; r < m_rows; ++r) {
        for (int32_t c = 0; c < n; ++c) {
            const size_t i = (size_t)r * stride + c;
            const float expected = whole[i] + whole[i];
            wrong_sums += memcmp(&expected, &twice[i], 4) != 0;
        }
    }
    snprintf(what, sizeof(what), "qgemm %s 300 rows in 128-row tiles accumulate into their output", tc->name);
    glmrt_qtest_expect_none(report, what, wrong_sums, status, &error);
    glmrt_qtest_operand_free(o);
    free(q);
    cudaFree(d_data);
    cudaFree(d_scale);
    cudaFree(d_x);
    cudaFree(d_bias);
    cudaFree(d_y);
    cudaFree(d_y_windows);
}

static std::vector<glmrt_cuda_gemm_tile> glmrt_qtest_group_tiles(const int32_t *group_rows, int32_t groups,
                                                                  int32_t tile_rows)
{
    std::vector<glmrt_cuda_gemm_tile> tiles;
    int32_t row_begin = 0;
    for (int32_t g = 0; g < groups; ++g) {
        for (int32_t t = 0; t < group_rows[g]; t += tile_rows) {
            glmrt_cuda_gemm_tile tile;
            tile.group = g;
            tile.row_begin = row_begin + t;
            tile.num_rows = std::min(tile_rows, group_rows[g] - t);
            tile.reserved = 0;
            tiles.push_back(tile);
        }
        row_begin += group_rows[g];
    }
    return tiles;
}

#define GLMRT_QTEST_GROUPS 3

static void glmrt_qtest_grouped(glmrt_test_report *report, glmrt_test_rng *rng, const glmrt_qtest_case *tc,
                                int32_t rows, const int32_t (&group_rows)[GLMRT_QTEST_GROUPS])
{
    const int32_t cols = 608;
    const int32_t groups = GLMRT_QTEST_GROUPS;
    std::vector<int32_t> parts = {rows};
    glmrt_host_matrix h = glmrt_make_matrix(rng, tc->format, tc->scale_kind, parts, cols, groups, tc->block);
    uint8_t *d_data;
    float *d_scale;
    glmrt_device_matrix(&h, &d_data, &d_scale);
    const int32_t n = h.m.rows;
    const int32_t kind = glmrt_cuda_qgemm_operand_kind(&h.m);
    const int32_t assignments = group_rows[0] + group_rows[1] + group_rows[2];
    glmrt_qtest_rows tokens = glmrt_qtest_make_rows(rng, 70, cols);
    std::vector<int32_t> gather;
    for (int32_t a = 0; a < assignments; ++a) {
        gather.push_back(glmrt_test_below(rng, tokens.rows));
    }
    float *d_tokens = glmrt_test_upload(tokens.x);
    int32_t *d_gather = glmrt_test_upload(gather);
    float *d_y = glmrt_test_alloc<float>((size_t)assignments * n);
    float *d_y_dense = glmrt_test_alloc<float>((size_t)assignments * n);
    int32_t *d_count = glmrt_test_alloc<int32_t>(1);
    glmrt_error error;
    glmrt_error_clear(&error);
    glmrt_status status = GLMRT_OK;
    glmrt_cuda_qgemm_weight *q = glmrt_qtest_weight_new(&h.m, 0, &error, &status);
    glmrt_qtest_operand *o = glmrt_qtest_operand_new(kind, cols, assignments, &error, &status);
    if (status == GLMRT_OK) {
        status = glmrt_qtest_quantize(d_tokens, cols, d_gather, GLMRT_ACTIVATION_COPY, assignments, &o->operand, &error);
    }
    std::vector<uint8_t> qx = glmrt_test_download(o->data, (size_t)assignments * cols * glmrt_operand_bytes(kind));
    std::vector<float> sx = glmrt_test_download(o->scales, (size_t)assignments);
    std::vector<float> dense((size_t)assignments * n);
    int32_t row_begin = 0;
    for (int32_t g = 0; g < groups && status == GLMRT_OK; ++g) {
        glmrt_cuda_matrix view = h.m;
        view.data = d_data + (size_t)g * h.m.group_bytes;
        view.scale = d_scale != nullptr ? d_scale + (size_t)g * h.m.group_scales : nullptr;
        view.num_groups = 1;
        glmrt_cuda_qgemm_weight *view_q = nullptr;
        if (group_rows[g] > 0) {
            view_q = glmrt_qtest_weight_new(&view, 0, &error, &status);
            glmrt_qtest_operand *part = glmrt_qtest_operand_new(kind, cols, group_rows[g], &error, &status);
            std::vector<int32_t> part_gather(gather.begin() + row_begin, gather.begin() + row_begin + group_rows[g]);
            int32_t *d_part_gather = glmrt_test_upload(part_gather);
            if (status == GLMRT_OK) {
                status = glmrt_qtest_quantize(d_tokens, cols, d_part_gather, GLMRT_ACTIVATION_COPY, group_rows[g],
                                              &part->operand, &error);
            }
            if (status == GLMRT_OK) {
                status = glmrt_qtest_run(&view, &part->operand, group_rows[g], d_y_dense + (size_t)row_begin * n, n,
                                         nullptr, 0, nullptr, &error);
            }
            cudaFree(d_part_gather);
            glmrt_qtest_operand_free(part);
        }
        free(view_q);
        row_begin += group_rows[g];
    }
    dense = glmrt_test_download(d_y_dense, (size_t)assignments * n);
    double worst = 0.0;
    row_begin = 0;
    for (int32_t g = 0; g < groups; ++g) {
        std::vector<uint8_t> gq(qx.begin() + (size_t)row_begin * cols * glmrt_operand_bytes(kind),
                                qx.begin() + (size_t)(row_begin + group_rows[g]) * cols * glmrt_operand_bytes(kind));
        std::vector<float> gs(sx.begin() + row_begin, sx.begin() + row_begin + group_rows[g]);
        std::vector<float> gy(dense.begin() + (size_t)row_begin * n, dense.begin() + (size_t)(row_begin + group_rows[g]) * n);
        double l2 = 0.0;
        worst = fmax(worst, glmrt_qtest_compare(h, g, kind, gq, gs, gy, group_rows[g], n, std::vector<float>(), &l2));
        row_begin += group_rows[g];
    }
    char what[200];
    snprintf(what, sizeof(what),
             "qgemm %s per-expert matmuls of %d rows (experts of %d, %d and %d tokens) match a float64 reference",
             tc->name, rows, group_rows[0], group_rows[1], group_rows[2]);
    glmrt_test_expect(report, status == GLMRT_OK && worst < GLMRT_QTEST_BOUND, what, worst, GLMRT_QTEST_BOUND);
    long differing = 0;
    for (int32_t tile_rows : {8, 32, 128}) {
        std::vector<glmrt_cuda_gemm_tile> tiles = glmrt_qtest_group_tiles(group_rows, groups, tile_rows);
        int32_t count = (int32_t)tiles.size();
        glmrt_cuda_gemm_tile *d_tiles = glmrt_test_upload(tiles);
        cudaMemcpy(d_count, &count, sizeof(count), cudaMemcpyHostToDevice);
        cudaMemset(d_y, 0xff, (size_t)assignments * n * sizeof(float));
        glmrt_cuda_qgemm_call call;
        memset(&call, 0, sizeof(call));
        call.w = &h.m;
        call.x = &o->operand;
        call.num_rows = assignments;
        call.tiles = d_tiles;
        call.num_tiles = d_count;
        call.grid_tiles = count + 3;
        call.tile_rows = tile_rows;
        call.y = d_y;
        call.y_stride = n;
        if (status == GLMRT_OK) {
            status = glmrt_cuda_qgemm_run(&call, nullptr, 0, &error);
        }
        std::vector<float> y = glmrt_test_download(d_y, (size_t)assignments * n);
        differing += memcmp(y.data(), dense.data(), y.size() * 4) != 0;
        cudaFree(d_tiles);
    }
    snprintf(what, sizeof(what),
             "qgemm %s grouped tiles of 8, 32 and 128 rows over %d weight rows (experts of %d, %d and %d tokens) equal "
             "per-expert matmuls bitwise",
             tc->name, rows, group_rows[0], group_rows[1], group_rows[2]);
    glmrt_qtest_expect_none(report, what, differing, status, &error);
    glmrt_qtest_operand_free(o);
    free(q);
    cudaFree(d_data);
    cudaFree(d_scale);
    cudaFree(d_tokens);
    cudaFree(d_gather);
    cudaFree(d_y);
    cudaFree(d_y_dense);
    cudaFree(d_count);
}

typedef struct glmrt_qtest_gated_run {
    const glmrt_cuda_matrix *w;
    const glmrt_cuda_qgemm_operand *x;
    int32_t rows;
    const glmrt_cuda_gemm_tile *d_tiles;
    const int32_t *d_count;
    int32_t grid_tiles;
    int32_t tile_rows;
    float *d_y;
    const glmrt_cuda_qgemm_split *split;
} glmrt_qtest_gated_run;

static glmrt_status glmrt_qtest_gated_products(const glmrt_qtest_gated_run *r, int32_t gated,
                                               const glmrt_cuda_qgemm_operand *act, int32_t *took_gate,
                                               glmrt_error *error)
{
    const int32_t width = r->w->rows / 2;
    glmrt_cuda_qgemm_call call;
    memset(&call, 0, sizeof(call));
    call.w = r->w;
    call.x = r->x;
    call.num_rows = r->rows;
    call.tiles = r->d_tiles;
    call.num_tiles = r->d_count;
    call.grid_tiles = r->grid_tiles;
    call.tile_rows = r->tile_rows;
    call.y = r->d_y;
    call.y_stride = 2 * (int64_t)width;
    call.gated = gated;
    *took_gate = glmrt_cuda_qgemm_gates(&call);
    cudaMemset(r->d_y, 0xff, (size_t)r->rows * 2 * width * sizeof(float));
    glmrt_status status = glmrt_cuda_qgemm_run(&call, r->split, 0, error);
    if (status == GLMRT_OK) {
        status = glmrt_qtest_quantize(r->d_y, 2 * (int64_t)width, nullptr,
                                      *took_gate ? GLMRT_ACTIVATION_COPY : GLMRT_ACTIVATION_SILU_MUL, r->rows, act,
                                      error);
    }
    return status;
}

static long glmrt_qtest_up_half_written(const float *d_y, int32_t rows, int32_t width)
{
    std::vector<float> y = glmrt_test_download(d_y, (size_t)rows * 2 * width);
    long written = 0;
    for (int32_t r = 0; r < rows; ++r) {
        for (int32_t c = width; c < 2 * width; ++c) {
            uint32_t bits;
            memcpy(&bits, &y[(size_t)r * 2 * width + c], 4);
            written += bits != 0xffffffffu;
        }
    }
    return written;
}

static long glmrt_qtest_gated_differs(const glmrt_qtest_gated_run *r, int32_t kind, int32_t expect_gate,
                                      glmrt_status *status, glmrt_error *error)
{
    const int32_t width = r->w->rows / 2;
    glmrt_qtest_operand *plain = glmrt_qtest_operand_new(kind, width, r->rows, error, status);
    glmrt_qtest_operand *gated = glmrt_qtest_operand_new(kind, width, r->rows, error, status);
    int32_t plain_gate = 0;
    int32_t took_gate = 0;
    long differing = 1;
    if (*status == GLMRT_OK) {
        *status = glmrt_qtest_gated_products(r, 0, &plain->operand, &plain_gate, error);
    }
    if (*status == GLMRT_OK) {
        *status = glmrt_qtest_gated_products(r, 1, &gated->operand, &took_gate, error);
    }
    if (*status == GLMRT_OK) {
        const size_t bytes = (size_t)r->rows * width * glmrt_operand_bytes(kind);
        std::vector<uint8_t> a = glmrt_test_download(plain->data, bytes);
        std::vector<uint8_t> b = glmrt_test_download(gated->data, bytes);
        std::vector<float> sa = glmrt_test_download(plain->scales, (size_t)r->rows);
        std::vector<float> sb = glmrt_test_download(gated->scales, (size_t)r->rows);
        differing = 0;
        for (size_t i = 0; i < bytes; ++i) {
            differing += a[i] != b[i];
        }
        if (kind == GLMRT_OPERAND_FP8) {
            differing += memcmp(sa.data(), sb.data(), sa.size() * 4) != 0;
        }
        differing += plain_gate != 0 || took_gate != expect_gate;
        differing += took_gate ? glmrt_qtest_up_half_written(r->d_y, r->rows, width) : 0;
    }
    glmrt_qtest_operand_free(plain);
    glmrt_qtest_operand_free(gated);
    return differing;
}

static long glmrt_qtest_gated_dense_rows(glmrt_qtest_gated_run *run, int32_t kind, int32_t rows, int32_t gates_at_rows,
                                         glmrt_status *status, glmrt_error *error)
{
    long differing = 0;
    for (int32_t dense_rows : {rows, 40}) {
        run->rows = dense_rows;
        differing += *status == GLMRT_OK
                         ? glmrt_qtest_gated_differs(run, kind, dense_rows == rows ? gates_at_rows : 0, status, error)
                         : 1;
    }
    return differing;
}

static void glmrt_qtest_gated_dense(glmrt_test_report *report, glmrt_test_rng *rng, const glmrt_qtest_case *tc,
                                    int32_t cols, int32_t allow_split)
{
    const int32_t width = 192;
    const int32_t rows = 400;
    std::vector<int32_t> parts = {width, width};
    glmrt_host_matrix h = glmrt_make_matrix(rng, tc->format, tc->scale_kind, parts, cols, 1, tc->block);
    uint8_t *d_data;
    float *d_scale;
    glmrt_device_matrix(&h, &d_data, &d_scale);
    const int32_t kind = glmrt_cuda_qgemm_operand_kind(&h.m);
    glmrt_qtest_rows x = glmrt_qtest_make_rows(rng, rows, cols);
    float *d_x = glmrt_test_upload(x.x);
    float *d_y = glmrt_test_alloc<float>((size_t)rows * 2 * width);
    glmrt_cuda_qgemm_split split = glmrt_qtest_split_new(2 * width);
    glmrt_error error;
    glmrt_error_clear(&error);
    glmrt_status status = GLMRT_OK;
    glmrt_cuda_qgemm_weight *q = glmrt_qtest_weight_on(&h.m, GLMRT_QTEST_FEW_SMS, allow_split, &error, &status);
    glmrt_qtest_operand *o = glmrt_qtest_operand_new(kind, cols, rows, &error, &status);
    if (status == GLMRT_OK) {
        status = glmrt_qtest_quantize(d_x, cols, nullptr, GLMRT_ACTIVATION_COPY, rows, &o->operand, &error);
    }
    glmrt_qtest_gated_run run;
    memset(&run, 0, sizeof(run));
    run.w = &h.m;
    run.x = &o->operand;
    run.d_y = d_y;
    run.split = &split;
    long differing = status == GLMRT_OK && (allow_split == 0 || q->splits > 1) ? 0 : 1;
    differing += glmrt_qtest_gated_dense_rows(&run, kind, rows, 1, &status, &error);
    char what[240];
    if (allow_split) {
        snprintf(what, sizeof(what),
                 "qgemm %s gate-up split along K (%d splits) with SiLU-times-up in the staged epilogue: %d rows "
                 "folded in the staged tile, and 40 rows of split partials on the two-pass path, round to the same "
                 "operand bits as the two-pass path",
                 tc->name, q != nullptr ? q->splits : 0, rows);
    } else {
        snprintf(what, sizeof(what),
                 "qgemm %s gate-up of %d rows with SiLU-times-up in the staged epilogue rounds to the same operand "
                 "bits as the two-pass path (and 40 rows take the two-pass path)",
                 tc->name, rows);
    }
    glmrt_qtest_expect_none(report, what, differing, status, &error);
    glmrt_qtest_operand_free(o);
    free(q);
    cudaFree(d_data);
    cudaFree(d_scale);
    cudaFree(d_x);
    cudaFree(d_y);
    glmrt_qtest_split_free(&split);
}

static void glmrt_qtest_gated_grouped(glmrt_test_report *report, glmrt_test_rng *rng, const glmrt_qtest_case *tc)
{
    const int32_t cols = 608;
    const int32_t width = 192;
    const int32_t groups = GLMRT_QTEST_GROUPS;
    const int32_t group_rows[groups] = {45, 0, 150};
    const int32_t rows = group_rows[0] + group_rows[1] + group_rows[2];
    std::vector<int32_t> parts = {width, width};
    glmrt_host_matrix h = glmrt_make_matrix(rng, tc->format, tc->scale_kind, parts, cols, groups, tc->block);
    uint8_t *d_data;
    float *d_scale;
    glmrt_device_matrix(&h, &d_data, &d_scale);
    const int32_t kind = glmrt_cuda_qgemm_operand_kind(&h.m);
    glmrt_qtest_rows x = glmrt_qtest_make_rows(rng, rows, cols);
    float *d_x = glmrt_test_upload(x.x);
    float *d_y = glmrt_test_alloc<float>((size_t)rows * 2 * width);
    int32_t *d_count = glmrt_test_alloc<int32_t>(1);
    glmrt_error error;
    glmrt_error_clear(&error);
    glmrt_status status = GLMRT_OK;
    glmrt_cuda_qgemm_weight *q = glmrt_qtest_weight_new(&h.m, 0, &error, &status);
    glmrt_qtest_operand *o = glmrt_qtest_operand_new(kind, cols, rows, &error, &status);
    if (status == GLMRT_OK) {
        status = glmrt_qtest_quantize(d_x, cols, nullptr, GLMRT_ACTIVATION_COPY, rows, &o->operand, &error);
    }
    glmrt_qtest_gated_run run;
    memset(&run, 0, sizeof(run));
    run.w = &h.m;
    run.x = &o->operand;
    run.d_y = d_y;
    run.rows = rows;
    long differing = 0;
    for (int32_t tile_rows : {128, 32}) {
        std::vector<glmrt_cuda_gemm_tile> tiles = glmrt_qtest_group_tiles(group_rows, groups, tile_rows);
        int32_t count = (int32_t)tiles.size();
        glmrt_cuda_gemm_tile *d_tiles = glmrt_test_upload(tiles);
        cudaMemcpy(d_count, &count, sizeof(count), cudaMemcpyHostToDevice);
        run.d_tiles = d_tiles;
        run.d_count = d_count;
        run.grid_tiles = count + 2;
        run.tile_rows = tile_rows;
        differing += status == GLMRT_OK ? glmrt_qtest_gated_differs(&run, kind, tile_rows == 128, &status, &error) : 1;
        cudaFree(d_tiles);
    }
    char what[240];
    snprintf(what, sizeof(what),
             "qgemm %s grouped gate-up in 128-row tiles with SiLU-times-up in the epilogue rounds to the same operand "
             "bits as the two-pass path (32-row tiles take the two-pass path)",
             tc->name);
    glmrt_qtest_expect_none(report, what, differing, status, &error);
    glmrt_qtest_operand_free(o);
    free(q);
    cudaFree(d_data);
    cudaFree(d_scale);
    cudaFree(d_x);
    cudaFree(d_y);
    cudaFree(d_count);
}

int main(void)
{
    glmrt_test_report report = {0, 0};
    glmrt_test_rng rng = {4242};
    int device = 0;
    cudaGetDevice(&device);
    if (!glmrt_cuda_qgemm_device_supported(device)) {
        printf("SKIP quantized GEMM needs an sm_90 device\n");
        return glmrt_test_finish("test_cuda_qgemm", &report);
    }
    glmrt_qtest_activations(&report, &rng, 67, 90, 1040);
    glmrt_qtest_activations(&report, &rng, 400, 450, 1040);
    glmrt_qtest_activations(&report, &rng, 1, 3, 12288);
    glmrt_qtest_activations(&report, &rng, 8, 5, 1536);
    glmrt_qtest_activations(&report, &rng, 2, 2, 10256);
    glmrt_qtest_activations(&report, &rng, 300, 300, 1536);
    glmrt_qtest_activations(&report, &rng, 900, 64, 1536);
    glmrt_qtest_activations(&report, &rng, 1056, 1000, 1536);
    glmrt_qtest_activations(&report, &rng, 2500, 40, 1536);
    int sms = 0;
    if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) == cudaSuccess && sms > 0) {
        glmrt_qtest_activations(&report, &rng, 2 * sms, 2 * sms, 1536);
        glmrt_qtest_activations(&report, &rng, 8 * sms, 8 * sms, 1040);
        glmrt_qtest_activations(&report, &rng, 8 * sms + 1, 64, 1536);
    }
    const glmrt_qtest_case cases[] = {
        {"bf16", GLMRT_CUDA_FORMAT_BF16, GLMRT_CUDA_SCALE_NONE, 0},
        {"fp8 per-channel", GLMRT_CUDA_FORMAT_FP8, GLMRT_CUDA_SCALE_CHANNEL, 0},
        {"fp8 128-block", GLMRT_CUDA_FORMAT_FP8, GLMRT_CUDA_SCALE_BLOCK, 128},
        {"fp8 64-block", GLMRT_CUDA_FORMAT_FP8, GLMRT_CUDA_SCALE_BLOCK, 64},
        {"fp8 32-block", GLMRT_CUDA_FORMAT_FP8, GLMRT_CUDA_SCALE_BLOCK, 32},
    };
    for (const glmrt_qtest_case &tc : cases) {
        glmrt_qtest_dense(&report, &rng, &tc, 608, 1);
        glmrt_qtest_dense(&report, &rng, &tc, 5120, 1);
        glmrt_qtest_wide(&report, &rng, &tc);
        glmrt_qtest_grouped(&report, &rng, &tc, 176, {45, 0, 150});
        glmrt_qtest_grouped(&report, &rng, &tc, 320, {45, 0, 150});
        glmrt_qtest_grouped(&report, &rng, &tc, 320, {100, 7, 121});
        glmrt_qtest_grouped(&report, &rng, &tc, 176, {77, 90, 64});
        glmrt_qtest_gated_dense(&report, &rng, &tc, 608, 0);
        glmrt_qtest_gated_grouped(&report, &rng, &tc);
        glmrt_qtest_gated_dense(&report, &rng, &tc, 5120, 1);
    }
    return glmrt_test_finish("test_cuda_qgemm", &report);
}
