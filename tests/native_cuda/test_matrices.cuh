#ifndef GLMRT_TEST_MATRICES_CUH
#define GLMRT_TEST_MATRICES_CUH

#include "cuda_test_support.cuh"
#include "device_model.cuh"

extern "C" {
#include "error.h"
#include "fp8.h"
}

typedef struct glmrt_host_matrix {
    glmrt_cuda_matrix m;
    std::vector<uint8_t> data;
    std::vector<float> scale;
} glmrt_host_matrix;

static inline uint8_t glmrt_random_fp8(glmrt_test_rng *rng)
{
    uint8_t bits;
    do {
        bits = (uint8_t)glmrt_test_next(rng);
    } while ((bits & 0x7f) == 0x7f);
    return bits;
}

static inline glmrt_host_matrix glmrt_make_matrix(glmrt_test_rng *rng, int32_t format, int32_t scale_kind,
                                           const std::vector<int32_t> &parts, int32_t cols, int32_t groups,
                                           int32_t block)
{
    glmrt_host_matrix h;
    glmrt_cuda_matrix &m = h.m;
    memset(&m, 0, sizeof(m));
    m.format = format;
    m.scale_kind = scale_kind;
    m.cols = cols;
    m.block_rows = scale_kind == GLMRT_CUDA_SCALE_BLOCK ? block : 1;
    m.block_cols = scale_kind == GLMRT_CUDA_SCALE_BLOCK ? block : cols;
    m.num_segments = (int32_t)parts.size();
    int32_t rows = 0;
    int32_t blocks = 0;
    for (size_t p = 0; p < parts.size(); ++p) {
        m.segment_block_begin[p] = blocks;
        rows += parts[p];
        m.segment_row_end[p] = rows;
        blocks += (parts[p] + m.block_rows - 1) / m.block_rows;
    }
    m.rows = rows;
    m.scale_rows = scale_kind == GLMRT_CUDA_SCALE_BLOCK ? blocks : (scale_kind == GLMRT_CUDA_SCALE_CHANNEL ? rows : 0);
    m.scale_cols = scale_kind == GLMRT_CUDA_SCALE_BLOCK ? (cols + block - 1) / block : (scale_kind ? 1 : 0);
    m.num_groups = groups;
    m.group_bytes = (int64_t)rows * cols * glmrt_cuda_format_bytes(format);
    m.group_scales = (int64_t)m.scale_rows * m.scale_cols;
    h.data.resize((size_t)(m.group_bytes * groups));
    for (size_t i = 0; i < h.data.size();) {
        if (format == GLMRT_CUDA_FORMAT_FP8) {
            h.data[i++] = glmrt_random_fp8(rng);
        } else if (format == GLMRT_CUDA_FORMAT_BF16) {
            uint16_t bits = glmrt_float_to_bf16(glmrt_test_normal(rng) * 0.05f);
            memcpy(&h.data[i], &bits, 2);
            i += 2;
        } else {
            float v = glmrt_test_normal(rng) * 0.05f;
            memcpy(&h.data[i], &v, 4);
            i += 4;
        }
    }
    h.scale.resize((size_t)(m.group_scales * groups));
    for (float &s : h.scale) {
        s = (float)(1e-3 * (0.5 + glmrt_test_unit(rng)));
    }
    return h;
}

static inline double glmrt_host_weight(const glmrt_host_matrix &h, int32_t group, int32_t row, int32_t col)
{
    const glmrt_cuda_matrix &m = h.m;
    const uint8_t *base = h.data.data() + (size_t)group * m.group_bytes;
    int64_t index = (int64_t)row * m.cols + col;
    if (m.format == GLMRT_CUDA_FORMAT_F32) {
        float v;
        memcpy(&v, base + index * 4, 4);
        return v;
    }
    if (m.format == GLMRT_CUDA_FORMAT_BF16) {
        uint16_t bits;
        memcpy(&bits, base + index * 2, 2);
        return glmrt_bf16_to_float(bits);
    }
    double value = glmrt_fp8_e4m3_to_float(base[index]);
    const float *scale = h.scale.data() + (size_t)group * m.group_scales;
    if (m.scale_kind == GLMRT_CUDA_SCALE_CHANNEL) {
        return value * scale[row];
    }
    return value * scale[(int64_t)glmrt_cuda_matrix_row_block(&m, row) * m.scale_cols + col / m.block_cols];
}

static inline glmrt_status glmrt_device_matrix(glmrt_host_matrix *h, uint8_t **d_data, float **d_scale)
{
    *d_data = glmrt_test_upload(h->data);
    *d_scale = h->scale.empty() ? nullptr : glmrt_test_upload(h->scale);
    h->m.data = *d_data;
    h->m.scale = *d_scale;
    return GLMRT_OK;
}

#endif
