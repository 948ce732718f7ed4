#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_fill.cuh"
#include "bench_graph.cuh"
#include "moe.cuh"
#include "route_resident.cuh"
#include "router.cuh"

extern "C" {
#include "error.h"
}

#define GLMRT_ROUTE_BENCH_EXPERTS 160
#define GLMRT_ROUTE_BENCH_COLS 5120
#define GLMRT_ROUTE_BENCH_TOP_K 8
#define GLMRT_ROUTE_BENCH_TILE_ROWS 16
#define GLMRT_ROUTE_BENCH_TOKENS 2
#define GLMRT_ROUTE_BENCH_CALLS 50
#define GLMRT_ROUTE_BENCH_REPLAYS 10
#define GLMRT_ROUTE_BENCH_EVICT_BYTES ((size_t)256 << 20)

typedef enum glmrt_route_bench_part {
    GLMRT_ROUTE_BENCH_FUSED = 0,
    GLMRT_ROUTE_BENCH_LOGITS = 1,
    GLMRT_ROUTE_BENCH_ROUTING = 2,
    GLMRT_ROUTE_BENCH_EVICTION = 3,
} glmrt_route_bench_part;

typedef struct glmrt_route_bench {
    cudaStream_t stream;
    glmrt_cuda_matrix router;
    float *floats;
    float *x;
    float *bias;
    float *logits;
    int32_t *ids;
    float *weights;
    int32_t *sorted;
    int32_t *rows;
    glmrt_cuda_gemm_tile *tiles;
    int32_t *counters;
    int32_t *arrivals;
    uint8_t *evicted;
} glmrt_route_bench;

__global__ void glmrt_route_bench_to_bf16(const float *from, __nv_bfloat16 *to, int64_t count)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += (int64_t)gridDim.x * blockDim.x) {
        to[i] = __float2bfloat16_rn(from[i]);
    }
}

static int glmrt_route_ok(cudaError_t result, const char *what)
{
    return glmrt_bench_check("route_bench", result, what);
}

static void glmrt_route_bench_free(glmrt_route_bench *b)
{
    cudaFree(b->router.data);
    cudaFree(b->floats);
    cudaFree(b->x);
    cudaFree(b->bias);
    cudaFree(b->logits);
    cudaFree(b->ids);
    cudaFree(b->weights);
    cudaFree(b->sorted);
    cudaFree(b->rows);
    cudaFree(b->tiles);
    cudaFree(b->counters);
    cudaFree(b->arrivals);
    cudaFree(b->evicted);
    if (b->stream != nullptr) {
        cudaStreamDestroy(b->stream);
    }
}

static int glmrt_route_bench_alloc(glmrt_route_bench *b)
{
    const int64_t weights = (int64_t)GLMRT_ROUTE_BENCH_EXPERTS * GLMRT_ROUTE_BENCH_COLS;
    const int32_t assignments = GLMRT_ROUTE_BENCH_TOKENS * GLMRT_ROUTE_BENCH_TOP_K;
    const int32_t max_tiles =
        glmrt_cuda_moe_max_tiles(assignments, GLMRT_ROUTE_BENCH_EXPERTS, GLMRT_ROUTE_BENCH_TILE_ROWS);
    return glmrt_route_ok(cudaMalloc((void **)&b->router.data, (size_t)weights * 2), "router weights") &&
           glmrt_route_ok(cudaMalloc((void **)&b->floats, (size_t)weights * sizeof(float)), "router values") &&
           glmrt_route_ok(cudaMalloc((void **)&b->x, (size_t)GLMRT_ROUTE_BENCH_TOKENS * GLMRT_ROUTE_BENCH_COLS * 4),
                          "token rows") &&
           glmrt_route_ok(cudaMalloc((void **)&b->bias, GLMRT_ROUTE_BENCH_EXPERTS * sizeof(float)), "bias") &&
           glmrt_route_ok(cudaMalloc((void **)&b->logits,
                                     (size_t)GLMRT_ROUTE_BENCH_TOKENS * GLMRT_ROUTE_BENCH_EXPERTS * sizeof(float)),
                          "logits") &&
           glmrt_route_ok(cudaMalloc((void **)&b->ids, (size_t)assignments * sizeof(int32_t)), "expert ids") &&
           glmrt_route_ok(cudaMalloc((void **)&b->weights, (size_t)assignments * sizeof(float)), "routing weights") &&
           glmrt_route_ok(cudaMalloc((void **)&b->sorted, (size_t)assignments * sizeof(int32_t)), "sorted tokens") &&
           glmrt_route_ok(cudaMalloc((void **)&b->rows, (size_t)assignments * sizeof(int32_t)), "assignment rows") &&
           glmrt_route_ok(cudaMalloc((void **)&b->tiles, (size_t)max_tiles * sizeof(glmrt_cuda_gemm_tile)), "tiles") &&
           glmrt_route_ok(cudaMalloc((void **)&b->counters, 2 * sizeof(int32_t)), "counters") &&
           glmrt_route_ok(cudaMalloc((void **)&b->arrivals, sizeof(int32_t)), "arrivals") &&
           glmrt_route_ok(cudaMemset(b->arrivals, 0, sizeof(int32_t)), "arrivals") &&
           glmrt_route_ok(cudaMalloc((void **)&b->evicted, GLMRT_ROUTE_BENCH_EVICT_BYTES), "eviction buffer") &&
           glmrt_route_ok(cudaStreamCreateWithFlags(&b->stream, cudaStreamNonBlocking), "stream");
}

static int glmrt_route_bench_open(glmrt_route_bench *b)
{
    memset(b, 0, sizeof(*b));
    if (!glmrt_route_bench_alloc(b)) {
        return 0;
    }
    const int64_t weights = (int64_t)GLMRT_ROUTE_BENCH_EXPERTS * GLMRT_ROUTE_BENCH_COLS;
    glmrt_bench_fill_floats<<<264, 256>>>(b->floats, weights, 29u, 0.0f, 0.05f);
    glmrt_route_bench_to_bf16<<<264, 256>>>(b->floats, reinterpret_cast<__nv_bfloat16 *>(b->router.data), weights);
    glmrt_bench_fill_floats<<<40, 256>>>(b->x, (int64_t)GLMRT_ROUTE_BENCH_TOKENS * GLMRT_ROUTE_BENCH_COLS, 31u, 0.0f,
                                         2.0f);
    glmrt_bench_fill_floats<<<1, 256>>>(b->bias, GLMRT_ROUTE_BENCH_EXPERTS, 37u, 0.0f, 0.1f);
    b->router.format = GLMRT_CUDA_FORMAT_BF16;
    b->router.scale_kind = GLMRT_CUDA_SCALE_NONE;
    b->router.rows = GLMRT_ROUTE_BENCH_EXPERTS;
    b->router.cols = GLMRT_ROUTE_BENCH_COLS;
    b->router.num_groups = 1;
    return glmrt_route_ok(cudaGetLastError(), "fill") && glmrt_route_ok(cudaDeviceSynchronize(), "fill");
}

static glmrt_cuda_route_args glmrt_route_bench_route(const glmrt_route_bench *b, int32_t tokens)
{
    glmrt_cuda_route_args route = {b->logits, b->bias, tokens, GLMRT_ROUTE_BENCH_EXPERTS, GLMRT_ROUTE_BENCH_TOP_K,
                                   1, 1, 1, 2.5f, b->ids, b->weights};
    return route;
}

static glmrt_cuda_dispatch_args glmrt_route_bench_dispatch(const glmrt_route_bench *b, int32_t tokens)
{
    glmrt_cuda_dispatch_args dispatch = {b->ids,     tokens,  GLMRT_ROUTE_BENCH_TOP_K, 0,
                                         GLMRT_ROUTE_BENCH_EXPERTS, GLMRT_ROUTE_BENCH_TILE_ROWS,
                                         b->sorted, b->rows, b->tiles, b->counters, b->counters + 1};
    return dispatch;
}

static glmrt_status glmrt_route_bench_call(const glmrt_route_bench *b, int32_t part, int32_t tokens, glmrt_error *error)
{
    const glmrt_cuda_route_args route = glmrt_route_bench_route(b, tokens);
    const glmrt_cuda_dispatch_args dispatch = glmrt_route_bench_dispatch(b, tokens);
    if (part == GLMRT_ROUTE_BENCH_FUSED) {
        const glmrt_cuda_route_resident_args fused = {&b->router, b->x,     GLMRT_ROUTE_BENCH_COLS, b->logits,
                                                      &route,     &dispatch, b->arrivals};
        return glmrt_cuda_route_resident(&fused, b->stream, error);
    }
    if (part == GLMRT_ROUTE_BENCH_LOGITS) {
        return glmrt_cuda_router_logits(&b->router, b->x, GLMRT_ROUTE_BENCH_COLS, tokens, b->logits,
                                        GLMRT_ROUTE_BENCH_EXPERTS, b->stream, error);
    }
    if (part == GLMRT_ROUTE_BENCH_ROUTING) {
        return glmrt_cuda_moe_route_dispatch(&route, &dispatch, b->stream, error);
    }
    return GLMRT_OK;
}

static glmrt_status glmrt_route_bench_evicting_call(const glmrt_route_bench *b, int32_t part, int32_t tokens,
                                                   int evict, int call, glmrt_error *error)
{
    if (evict) {
        const cudaError_t evicted = cudaMemsetAsync(b->evicted, call & 0xff, GLMRT_ROUTE_BENCH_EVICT_BYTES, b->stream);
        if (evicted != cudaSuccess) {
            return glmrt_error_set(error, GLMRT_ERR_BACKEND, "%s", cudaGetErrorString(evicted));
        }
    }
    return glmrt_route_bench_call(b, part, tokens, error);
}

static int glmrt_route_bench_capture(glmrt_route_bench *b, int32_t part, int32_t tokens, int evict,
                                     cudaGraphExec_t *exec)
{
    return glmrt_bench_graph_capture(
        "route_bench", b->stream, GLMRT_ROUTE_BENCH_CALLS,
        [&](int call, glmrt_error *error) { return glmrt_route_bench_evicting_call(b, part, tokens, evict, call, error); },
        exec);
}

static int glmrt_route_bench_time(glmrt_route_bench *b, int32_t part, int32_t tokens, int evict, double *out_us)
{
    cudaGraphExec_t exec = nullptr;
    if (!glmrt_route_bench_capture(b, part, tokens, evict, &exec)) {
        return 0;
    }
    const int ok = glmrt_bench_graph_call_us("route_bench", b->stream, exec, GLMRT_ROUTE_BENCH_CALLS,
                                             GLMRT_ROUTE_BENCH_REPLAYS, out_us);
    cudaGraphExecDestroy(exec);
    return ok;
}

static const char *glmrt_route_bench_part_name(int32_t part)
{
    if (part == GLMRT_ROUTE_BENCH_FUSED) {
        return "router logits, routing and dispatch in one kernel (the decode step's fused route)";
    }
    if (part == GLMRT_ROUTE_BENCH_LOGITS) {
        return "router logits alone (tensor-core router kernel)";
    }
    return "routing and dispatch alone, one block (the fused route's last block runs the same code)";
}

int main(int argc, char **argv)
{
    static const int32_t parts[] = {GLMRT_ROUTE_BENCH_FUSED, GLMRT_ROUTE_BENCH_LOGITS, GLMRT_ROUTE_BENCH_ROUTING};
    if (argc > 1) {
        fprintf(stderr, "usage: route_bench (no arguments): times the MoE routing of 1 and %d tokens over %d experts "
                        "of %d columns, with the caches warm and after %zu MB written between calls\n",
                GLMRT_ROUTE_BENCH_TOKENS, GLMRT_ROUTE_BENCH_EXPERTS, GLMRT_ROUTE_BENCH_COLS,
                GLMRT_ROUTE_BENCH_EVICT_BYTES >> 20);
        return 2;
    }
    glmrt_route_bench b;
    if (!glmrt_route_bench_open(&b)) {
        glmrt_route_bench_free(&b);
        return 1;
    }
    double eviction_us = 0.0;
    int failed = !glmrt_route_bench_time(&b, GLMRT_ROUTE_BENCH_EVICTION, 1, 1, &eviction_us);
    if (!failed) {
        printf("MoE routing, %d experts of %d columns, top %d, %d calls a CUDA graph, %d replays; a cold call follows "
               "%zu MB written (%.2f us a write, taken off)\n",
               GLMRT_ROUTE_BENCH_EXPERTS, GLMRT_ROUTE_BENCH_COLS, GLMRT_ROUTE_BENCH_TOP_K, GLMRT_ROUTE_BENCH_CALLS,
               GLMRT_ROUTE_BENCH_REPLAYS, GLMRT_ROUTE_BENCH_EVICT_BYTES >> 20, eviction_us);
        printf("| part | tokens | us, back to back | us, after the write |\n|---|---|---|---|\n");
    }
    for (size_t i = 0; i < sizeof(parts) / sizeof(parts[0]) && !failed; ++i) {
        for (int32_t tokens = 1; tokens <= GLMRT_ROUTE_BENCH_TOKENS && !failed; ++tokens) {
            double warm_us = 0.0;
            double cold_us = 0.0;
            failed = !glmrt_route_bench_time(&b, parts[i], tokens, 0, &warm_us) ||
                     !glmrt_route_bench_time(&b, parts[i], tokens, 1, &cold_us);
            if (!failed) {
                printf("| %s | %d | %.2f | %.2f |\n", glmrt_route_bench_part_name(parts[i]), tokens, warm_us,
                       cold_us - eviction_us);
            }
        }
    }
    glmrt_route_bench_free(&b);
    return failed ? 1 : 0;
}
