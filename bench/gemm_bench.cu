#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "gemm.cuh"

typedef struct glmrt_bench_shape {
    const char *name;
    int32_t rows;
    int32_t cols;
    int32_t format;
} glmrt_bench_shape;

__global__ void glmrt_bench_fill_bytes(uint8_t *data, int64_t count, uint32_t seed, int32_t fp8)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += (int64_t)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)i * 2654435761u ^ seed;
        h ^= h >> 15;
        h *= 2246822519u;
        h ^= h >> 13;
        uint8_t b = (uint8_t)h;
        if (fp8) {
            b = (b & 0x7f) == 0x7f ? (uint8_t)(b ^ 1) : b;
        } else if ((i & 1) == 1) {
            b = (uint8_t)(0x3c | (b & 0x80) | (b & 0x03));
        }
        data[i] = b;
    }
}

__global__ void glmrt_bench_fill_floats(float *data, int64_t count, uint32_t seed, float base, float spread)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += (int64_t)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)i * 2246822519u ^ seed;
        h ^= h >> 16;
        h *= 2654435761u;
        data[i] = base + spread * ((float)(h >> 8) * (1.0f / 16777216.0f) - 0.5f);
    }
}

static int glmrt_bench_ok(cudaError_t result, const char *what)
{
    if (result != cudaSuccess) {
        printf("%s failed: %s\n", what, cudaGetErrorString(result));
        return 0;
    }
    return 1;
}

int main(void)
{
    const glmrt_bench_shape shapes[] = {
        {"qkv fp8", 14336, 5120, GLMRT_CUDA_FORMAT_FP8},
        {"o_proj fp8", 5120, 12288, GLMRT_CUDA_FORMAT_FP8},
        {"dense gate_up fp8", 24576, 5120, GLMRT_CUDA_FORMAT_FP8},
        {"dense down fp8", 5120, 12288, GLMRT_CUDA_FORMAT_FP8},
        {"lm_head bf16", 151552, 5120, GLMRT_CUDA_FORMAT_BF16},
    };
    const int32_t row_counts[] = {1, 8, 16, 32, 64, 256, 2048};
    const int32_t max_rows = 2048;
    const int32_t max_cols = 12288;
    const int64_t max_weight_bytes = (int64_t)151552 * 5120 * 2;
    uint8_t *weights = nullptr;
    float *scales = nullptr;
    float *x = nullptr;
    float *y = nullptr;
    if (!glmrt_bench_ok(cudaMalloc(&weights, max_weight_bytes), "cudaMalloc weights") ||
        !glmrt_bench_ok(cudaMalloc(&scales, 151552 * sizeof(float)), "cudaMalloc scales") ||
        !glmrt_bench_ok(cudaMalloc(&x, (size_t)max_rows * max_cols * sizeof(float)), "cudaMalloc x") ||
        !glmrt_bench_ok(cudaMalloc(&y, (size_t)max_rows * 151552 * sizeof(float)), "cudaMalloc y")) {
        return 1;
    }
    glmrt_bench_fill_floats<<<1024, 256>>>(x, (int64_t)max_rows * max_cols, 7u, 0.0f, 2.0f);
    glmrt_bench_fill_floats<<<256, 256>>>(scales, 151552, 9u, 1e-3f, 1e-3f);
    cudaEvent_t start;
    cudaEvent_t stop;
    cudaEventCreate(&start);
    cudaEventCreate(&stop);
    printf("| matrix | rows | us | weight GB/s | TFLOP/s |\n|---|---|---|---|---|\n");
    for (const glmrt_bench_shape &shape : shapes) {
        int32_t bytes_per = shape.format == GLMRT_CUDA_FORMAT_FP8 ? 1 : 2;
        int64_t weight_bytes = (int64_t)shape.rows * shape.cols * bytes_per;
        glmrt_bench_fill_bytes<<<2048, 256>>>(weights, weight_bytes, 11u, shape.format == GLMRT_CUDA_FORMAT_FP8);
        glmrt_cuda_matrix m;
        memset(&m, 0, sizeof(m));
        m.format = shape.format;
        m.scale_kind = shape.format == GLMRT_CUDA_FORMAT_FP8 ? GLMRT_CUDA_SCALE_CHANNEL : GLMRT_CUDA_SCALE_NONE;
        m.rows = shape.rows;
        m.cols = shape.cols;
        m.block_rows = 1;
        m.block_cols = shape.cols;
        m.scale_rows = shape.format == GLMRT_CUDA_FORMAT_FP8 ? shape.rows : 0;
        m.scale_cols = shape.format == GLMRT_CUDA_FORMAT_FP8 ? 1 : 0;
        m.num_segments = 1;
        m.segment_row_end[0] = shape.rows;
        m.num_groups = 1;
        m.group_bytes = weight_bytes;
        m.group_scales = m.scale_rows;
        m.data = weights;
        m.scale = shape.format == GLMRT_CUDA_FORMAT_FP8 ? scales : nullptr;
        for (int32_t rows : row_counts) {
            glmrt_error error;
            glmrt_error_clear(&error);
            glmrt_status status = GLMRT_OK;
            const int reps = rows >= 256 ? 5 : 20;
            for (int i = 0; i < 3 && status == GLMRT_OK; ++i) {
                status = glmrt_cuda_gemm_dense(&m, x, shape.cols, y, shape.rows, rows, nullptr, 0, 0, &error);
            }
            cudaEventRecord(start);
            for (int i = 0; i < reps && status == GLMRT_OK; ++i) {
                status = glmrt_cuda_gemm_dense(&m, x, shape.cols, y, shape.rows, rows, nullptr, 0, 0, &error);
            }
            cudaEventRecord(stop);
            if (status != GLMRT_OK || !glmrt_bench_ok(cudaEventSynchronize(stop), "gemm")) {
                printf("%s rows %d failed: %s\n", shape.name, rows, error.message);
                return 1;
            }
            float ms = 0.0f;
            cudaEventElapsedTime(&ms, start, stop);
            double seconds = ms * 1e-3 / reps;
            printf("| %s | %d | %.1f | %.0f | %.1f |\n", shape.name, rows, seconds * 1e6, weight_bytes / seconds * 1e-9,
                   2.0 * rows * shape.rows * (double)shape.cols / seconds * 1e-12);
        }
    }
    cudaFree(weights);
    cudaFree(scales);
    cudaFree(x);
    cudaFree(y);
    return 0;
}
