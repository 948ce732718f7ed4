#include <algorithm>

#include "cuda_test_support.cuh"
#include "gemm_kernels.cuh"
#include "test_matrices.cuh"

typedef struct glmrt_gemm_case {
    const char *name;
    int32_t format;
    int32_t scale_kind;
    int32_t block;
} glmrt_gemm_case;

static void glmrt_check_dense(glmrt_test_report *report, glmrt_test_rng *rng, const glmrt_gemm_case *gc)
{
    const int32_t cols = 512 + 96;
    std::vector<int32_t> parts = {96, 40, 40};
    glmrt_host_matrix h = glmrt_make_matrix(rng, gc->format, gc->scale_kind, parts, cols, 1, gc->block);
    uint8_t *d_data;
    float *d_scale;
    glmrt_device_matrix(&h, &d_data, &d_scale);
    const int32_t n = h.m.rows;
    const int32_t m_rows = 77;
    std::vector<float> x((size_t)m_rows * cols);
    std::vector<float> bias(n);
    for (float &v : x) v = glmrt_test_normal(rng);
    for (float &v : bias) v = glmrt_test_normal(rng) * 0.1f;
    float *d_x = glmrt_test_upload(x);
    float *d_bias = glmrt_test_upload(bias);
    float *d_y = glmrt_test_alloc<float>((size_t)m_rows * n);
    float *d_y1 = glmrt_test_alloc<float>(n);
    glmrt_error error;
    glmrt_error_clear(&error);
    glmrt_status status = glmrt_cuda_gemm_check_matrix(&h.m, gc->name, &error);
    if (status == GLMRT_OK) status = glmrt_cuda_gemm_dense(&h.m, d_x, cols, d_y, n, m_rows, d_bias, 0, 0, &error);
    std::vector<float> y = glmrt_test_download(d_y, (size_t)m_rows * n);
    double worst = 0.0;
    for (int32_t r = 0; r < m_rows; ++r) {
        for (int32_t c = 0; c < n; ++c) {
            double ref = bias[c];
            double magnitude = fabs(bias[c]);
            for (int32_t k = 0; k < cols; ++k) {
                double term = (double)x[(size_t)r * cols + k] * glmrt_host_weight(h, 0, c, k);
                ref += term;
                magnitude += fabs(term);
            }
            double err = fabs((double)y[(size_t)r * n + c] - ref) / (magnitude + 1e-30);
            worst = isnan(y[(size_t)r * n + c]) ? INFINITY : fmax(worst, err);
        }
    }
    char what[160];
    snprintf(what, sizeof(what), "GEMM %s matches a float64 reference", gc->name);
    glmrt_test_expect(report, status == GLMRT_OK && worst < 1e-5, what, worst, 1e-5);
    long differing = 0;
    for (int32_t r = 0; r < m_rows && status == GLMRT_OK; r += 5) {
        status = glmrt_cuda_gemm_dense(&h.m, d_x + (size_t)r * cols, cols, d_y1, n, 1, d_bias, 0, 0, &error);
        std::vector<float> y1 = glmrt_test_download(d_y1, n);
        differing += memcmp(y1.data(), y.data() + (size_t)r * n, (size_t)n * 4) != 0;
    }
    const int32_t middle_rows = 20;
    const int32_t middle_first = 9;
    if (status == GLMRT_OK) {
        status = glmrt_cuda_gemm_dense(&h.m, d_x + (size_t)middle_first * cols, cols, d_y, n, middle_rows, d_bias, 0,
                                       0, &error);
    }
    std::vector<float> y_middle = glmrt_test_download(d_y, (size_t)middle_rows * n);
    for (int32_t r = 0; r < middle_rows && status == GLMRT_OK; ++r) {
        differing += memcmp(y_middle.data() + (size_t)r * n, y.data() + (size_t)(middle_first + r) * n,
                            (size_t)n * 4) != 0;
    }
    snprintf(what, sizeof(what), "GEMM %s rows are bitwise equal alone, in %d and in %d rows", gc->name,
             middle_rows, m_rows);
    glmrt_test_expect(report, status == GLMRT_OK && differing == 0, what, (double)differing, 0);
    if (glmrt_cuda_gemm_mma_supports(&h.m)) {
        const int32_t shapes[][3] = {{1, 2, 1}, {1, 4, 1}, {2, 4, 1}, {2, 4, 2}, {4, 4, 2}};
        glmrt_cuda_gemm_args args;
        memset(&args, 0, sizeof(args));
        args.x = d_x;
        args.x_stride = cols;
        args.y = d_y;
        args.y_stride = n;
        args.num_rows = m_rows;
        args.bias = d_bias;
        args.w = h.m;
        long shape_differing = 0;
        for (const int32_t *shape : shapes) {
            if (status == GLMRT_OK) {
                status = glmrt_cuda_gemm_mma_run_shape(&args, shape[0], shape[1], shape[2], 0, 0, &error);
            }
            std::vector<float> y_shape = glmrt_test_download(d_y, (size_t)m_rows * n);
            shape_differing += memcmp(y_shape.data(), y.data(), y.size() * 4) != 0;
        }
        snprintf(what, sizeof(what), "GEMM %s rows are bitwise equal in every tensor-core tile shape", gc->name);
        glmrt_test_expect(report, status == GLMRT_OK && shape_differing == 0, what, (double)shape_differing, 0);
    }
    cudaFree(d_data);
    cudaFree(d_scale);
    cudaFree(d_x);
    cudaFree(d_bias);
    cudaFree(d_y);
    cudaFree(d_y1);
}

static void glmrt_check_grouped(glmrt_test_report *report, glmrt_test_rng *rng, const glmrt_gemm_case *gc)
{
    const int32_t cols = 256;
    const int32_t groups = 5;
    const int32_t tokens = 11;
    std::vector<int32_t> parts = {64, 64};
    glmrt_host_matrix h = glmrt_make_matrix(rng, gc->format, gc->scale_kind, parts, cols, groups, gc->block);
    uint8_t *d_data;
    float *d_scale;
    glmrt_device_matrix(&h, &d_data, &d_scale);
    const int32_t n = h.m.rows;
    std::vector<float> x((size_t)tokens * cols);
    for (float &v : x) v = glmrt_test_normal(rng);
    const int32_t group_rows[groups] = {3, 0, 9, 1, 4};
    std::vector<int32_t> row_token;
    std::vector<int32_t> row_group;
    std::vector<glmrt_cuda_gemm_tile> tiles;
    const int32_t tile_rows = 4;
    for (int32_t g = 0; g < groups; ++g) {
        int32_t first = (int32_t)row_token.size();
        for (int32_t i = 0; i < group_rows[g]; ++i) {
            row_token.push_back(glmrt_test_below(rng, tokens));
            row_group.push_back(g);
        }
        for (int32_t t = 0; t < group_rows[g]; t += tile_rows) {
            glmrt_cuda_gemm_tile tile = {g, first + t, group_rows[g] - t < tile_rows ? group_rows[g] - t : tile_rows, 0};
            tiles.push_back(tile);
        }
    }
    int32_t num_tiles = (int32_t)tiles.size();
    std::vector<int32_t> count = {num_tiles};
    float *d_x = glmrt_test_upload(x);
    int32_t *d_rows = glmrt_test_upload(row_token);
    glmrt_cuda_gemm_tile *d_tiles = glmrt_test_upload(tiles);
    int32_t *d_count = glmrt_test_upload(count);
    float *d_y = glmrt_test_alloc<float>(row_token.size() * n);
    glmrt_cuda_gemm_args args;
    memset(&args, 0, sizeof(args));
    args.x = d_x;
    args.x_stride = cols;
    args.x_rows = d_rows;
    args.y = d_y;
    args.y_stride = n;
    args.num_rows = (int32_t)row_token.size();
    args.tiles = d_tiles;
    args.num_tiles = d_count;
    args.w = h.m;
    glmrt_error error;
    glmrt_error_clear(&error);
    glmrt_status status = glmrt_cuda_gemm_run(&args, tile_rows, num_tiles + 3, 0, &error);
    std::vector<float> y = glmrt_test_download(d_y, row_token.size() * n);
    double worst = 0.0;
    for (size_t r = 0; r < row_token.size(); ++r) {
        for (int32_t c = 0; c < n; ++c) {
            double ref = 0.0;
            double magnitude = 0.0;
            for (int32_t k = 0; k < cols; ++k) {
                double term = (double)x[(size_t)row_token[r] * cols + k] * glmrt_host_weight(h, row_group[r], c, k);
                ref += term;
                magnitude += fabs(term);
            }
            double value = y[r * n + c];
            worst = isnan(value) ? INFINITY : fmax(worst, fabs(value - ref) / (magnitude + 1e-30));
        }
    }
    char what[160];
    snprintf(what, sizeof(what), "grouped GEMM %s over gathered rows matches float64", gc->name);
    glmrt_test_expect(report, status == GLMRT_OK && worst < 1e-5, what, worst, 1e-5);
    cudaFree(d_data);
    cudaFree(d_scale);
    cudaFree(d_x);
    cudaFree(d_rows);
    cudaFree(d_tiles);
    cudaFree(d_count);
    cudaFree(d_y);
}

static void glmrt_check_fp8_patterns(glmrt_test_report *report, glmrt_test_rng *rng)
{
    const int32_t patterns = 256;
    const int32_t cols = 32;
    std::vector<int32_t> parts = {patterns};
    glmrt_host_matrix h = glmrt_make_matrix(rng, GLMRT_CUDA_FORMAT_FP8, GLMRT_CUDA_SCALE_CHANNEL, parts, cols, 1, 0);
    std::fill(h.data.begin(), h.data.end(), (uint8_t)0);
    for (int32_t p = 0; p < patterns; ++p) {
        h.data[(size_t)p * cols + 7] = (uint8_t)p;
        h.scale[p] = 1.0f;
    }
    uint8_t *d_data;
    float *d_scale;
    glmrt_device_matrix(&h, &d_data, &d_scale);
    std::vector<float> x(cols, 0.0f);
    x[7] = 1.0f;
    float *d_x = glmrt_test_upload(x);
    float *d_y = glmrt_test_alloc<float>(patterns);
    glmrt_error error;
    glmrt_error_clear(&error);
    glmrt_status status = glmrt_cuda_gemm_dense(&h.m, d_x, cols, d_y, patterns, 1, nullptr, 0, 0, &error);
    std::vector<float> y = glmrt_test_download(d_y, patterns);
    long differing = 0;
    for (int32_t p = 0; p < patterns; ++p) {
        if ((p & 0x7f) == 0x7f) {
            continue;
        }
        float expected = glmrt_fp8_e4m3_to_float((uint8_t)p);
        differing += memcmp(&expected, &y[p], 4) != 0 && !(expected == 0.0f && y[p] == 0.0f);
    }
    glmrt_test_expect(report, status == GLMRT_OK && differing == 0,
                      "GEMM decodes every finite FP8 pattern exactly, subnormals included", (double)differing, 0);
    cudaFree(d_data);
    cudaFree(d_scale);
    cudaFree(d_x);
    cudaFree(d_y);
}

int main(void)
{
    glmrt_test_report report = {0, 0};
    glmrt_test_rng rng = {777};
    const glmrt_gemm_case cases[] = {
        {"f32", GLMRT_CUDA_FORMAT_F32, GLMRT_CUDA_SCALE_NONE, 0},
        {"bf16", GLMRT_CUDA_FORMAT_BF16, GLMRT_CUDA_SCALE_NONE, 0},
        {"fp8 per-channel", GLMRT_CUDA_FORMAT_FP8, GLMRT_CUDA_SCALE_CHANNEL, 0},
        {"fp8 128-block", GLMRT_CUDA_FORMAT_FP8, GLMRT_CUDA_SCALE_BLOCK, 128},
        {"fp8 32-block", GLMRT_CUDA_FORMAT_FP8, GLMRT_CUDA_SCALE_BLOCK, 32},
    };
    for (const glmrt_gemm_case &gc : cases) {
        glmrt_check_dense(&report, &rng, &gc);
        glmrt_check_grouped(&report, &rng, &gc);
    }
    glmrt_check_fp8_patterns(&report, &rng);
    return glmrt_test_finish("test_cuda_gemm", &report);
}
