#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "activation_quant.cuh"
#include "bench_fill.cuh"
#include "bench_graph.cuh"
#include "qgemm.cuh"

extern "C" {
#include "error.h"
}

#define GLMRT_ACT_BENCH_CAPACITY 2048
#define GLMRT_ACT_BENCH_WIDTH 1536
#define GLMRT_ACT_BENCH_CALLS 50
#define GLMRT_ACT_BENCH_REPLAYS 10

typedef struct glmrt_act_bench {
    float *gate_up;
    uint8_t *rounded;
    float *scales;
    int32_t *counted;
    cudaStream_t stream;
    glmrt_cuda_qgemm_operand operand;
} glmrt_act_bench;

static int glmrt_act_ok(cudaError_t result, const char *what)
{
    return glmrt_bench_check("activation_bench", result, what);
}

static void glmrt_act_bench_free(glmrt_act_bench *b)
{
    cudaFree(b->gate_up);
    cudaFree(b->rounded);
    cudaFree(b->scales);
    cudaFree(b->counted);
    if (b->stream != nullptr) {
        cudaStreamDestroy(b->stream);
    }
}

static int glmrt_act_bench_open(glmrt_act_bench *b)
{
    memset(b, 0, sizeof(*b));
    const int64_t inputs = (int64_t)GLMRT_ACT_BENCH_CAPACITY * 2 * GLMRT_ACT_BENCH_WIDTH;
    if (!glmrt_act_ok(cudaMalloc((void **)&b->gate_up, (size_t)inputs * sizeof(float)), "gate-up rows") ||
        !glmrt_act_ok(cudaMalloc((void **)&b->rounded, (size_t)GLMRT_ACT_BENCH_CAPACITY * GLMRT_ACT_BENCH_WIDTH),
                      "rounded rows") ||
        !glmrt_act_ok(cudaMalloc((void **)&b->scales, GLMRT_ACT_BENCH_CAPACITY * sizeof(float)), "row scales") ||
        !glmrt_act_ok(cudaMalloc((void **)&b->counted, sizeof(int32_t)), "row count") ||
        !glmrt_act_ok(cudaStreamCreateWithFlags(&b->stream, cudaStreamNonBlocking), "stream")) {
        return 0;
    }
    glmrt_bench_fill_floats<<<264, 256>>>(b->gate_up, inputs, 17u, 0.0f, 4.0f);
    if (!glmrt_act_ok(cudaGetLastError(), "fill") || !glmrt_act_ok(cudaDeviceSynchronize(), "fill")) {
        return 0;
    }
    glmrt_error error;
    glmrt_error_clear(&error);
    if (glmrt_cuda_qgemm_operand_prepare(&b->operand, GLMRT_OPERAND_FP8, b->rounded, b->scales, GLMRT_ACT_BENCH_WIDTH,
                                         GLMRT_ACT_BENCH_CAPACITY, "the rounded rows", &error) != GLMRT_OK) {
        fprintf(stderr, "activation_bench: %s\n", error.message);
        return 0;
    }
    return 1;
}

static int glmrt_act_bench_capture(glmrt_act_bench *b, const glmrt_cuda_activation_args *args, cudaGraphExec_t *exec)
{
    return glmrt_bench_graph_capture(
        "activation_bench", b->stream, GLMRT_ACT_BENCH_CALLS,
        [&](int, glmrt_error *error) { return glmrt_cuda_activation_quantize(args, b->stream, error); }, exec);
}

static int glmrt_act_bench_time(glmrt_act_bench *b, int32_t rows, int counted_on_device, double *out_us)
{
    if (!glmrt_act_ok(cudaMemcpy(b->counted, &rows, sizeof(rows), cudaMemcpyHostToDevice), "row count upload")) {
        return 0;
    }
    glmrt_cuda_activation_args args;
    args.x = b->gate_up;
    args.x_stride = 2 * (int64_t)GLMRT_ACT_BENCH_WIDTH;
    args.x_rows = nullptr;
    args.op = GLMRT_ACTIVATION_SILU_MUL;
    args.num_rows = counted_on_device ? GLMRT_ACT_BENCH_CAPACITY : rows;
    args.device_rows = counted_on_device ? b->counted : nullptr;
    args.out = &b->operand;
    cudaGraphExec_t exec = nullptr;
    if (!glmrt_act_bench_capture(b, &args, &exec)) {
        return 0;
    }
    const int ok = glmrt_bench_graph_call_us("activation_bench", b->stream, exec, GLMRT_ACT_BENCH_CALLS,
                                             GLMRT_ACT_BENCH_REPLAYS, out_us);
    cudaGraphExecDestroy(exec);
    return ok;
}

int main(int argc, char **argv)
{
    static const int32_t rows_list[] = {8, 64, 128, 512, 1280, 2048};
    if (argc > 1) {
        fprintf(stderr, "usage: activation_bench (no arguments): times the experts' SiLU-and-multiply rounding to "
                        "E4M3 rows of %d columns\n",
                GLMRT_ACT_BENCH_WIDTH);
        return 2;
    }
    glmrt_act_bench b;
    if (!glmrt_act_bench_open(&b)) {
        glmrt_act_bench_free(&b);
        return 1;
    }
    printf("SiLU-and-multiply rounding to per-token E4M3, rows of %d columns from %d-float gate-up rows, %d calls a "
           "CUDA graph, %d replays\n",
           GLMRT_ACT_BENCH_WIDTH, 2 * GLMRT_ACT_BENCH_WIDTH, GLMRT_ACT_BENCH_CALLS, GLMRT_ACT_BENCH_REPLAYS);
    printf("| rows | us, rows known to the host | GB/s | us, %d-row launch counted on the device | GB/s |\n"
           "|---|---|---|---|---|\n",
           GLMRT_ACT_BENCH_CAPACITY);
    int failed = 0;
    for (size_t i = 0; i < sizeof(rows_list) / sizeof(rows_list[0]) && !failed; ++i) {
        const int32_t rows = rows_list[i];
        const double bytes = (double)rows * (2.0 * GLMRT_ACT_BENCH_WIDTH * sizeof(float) + GLMRT_ACT_BENCH_WIDTH);
        double host_us = 0.0;
        double device_us = 0.0;
        failed = !glmrt_act_bench_time(&b, rows, 0, &host_us) || !glmrt_act_bench_time(&b, rows, 1, &device_us);
        if (!failed) {
            printf("| %d | %.2f | %.0f | %.2f | %.0f |\n", rows, host_us, bytes / host_us * 1e-3, device_us,
                   bytes / device_us * 1e-3);
        }
    }
    glmrt_act_bench_free(&b);
    return failed ? 1 : 0;
}
