#include <atomic>
#include <string.h>

#include "cluster_ops.cuh"
#include "cuda_check.cuh"
#include "dependent_launch.cuh"
#include "moe_blocks.cuh"
#include "route_resident.cuh"
#include "router.cuh"
#include "router_lanes.cuh"
#include "router_mma.cuh"

#define GLMRT_ROUTE_RESIDENT_WARPS 2
#define GLMRT_ROUTE_RESIDENT_STEPS (GLMRT_ROUTE_RESIDENT_COLS / GLMRT_ROUTER_WARP_COLS)

template <int FORMAT>
__device__ __forceinline__ void glmrt_resident_weights(float4 (&weights)[GLMRT_ROUTE_RESIDENT_STEPS],
                                                       const uint8_t *row, int32_t cols, int lane)
{
#pragma unroll
    for (int s = 0; s < GLMRT_ROUTE_RESIDENT_STEPS; ++s) {
        const int32_t c = lane * GLMRT_ROUTER_LANE_COLS + s * GLMRT_ROUTER_WARP_COLS;
        weights[s] = c < cols ? glmrt_router_weights<FORMAT>(row, c) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
}

__device__ __forceinline__ float glmrt_resident_dot(const float4 (&weights)[GLMRT_ROUTE_RESIDENT_STEPS],
                                                    const float *x, int32_t cols, int lane)
{
    float acc = 0.0f;
#pragma unroll
    for (int s = 0; s < GLMRT_ROUTE_RESIDENT_STEPS; ++s) {
        const int32_t c = lane * GLMRT_ROUTER_LANE_COLS + s * GLMRT_ROUTER_WARP_COLS;
        if (c < cols) {
            acc = glmrt_router_dot4(weights[s], *reinterpret_cast<const float4 *>(x + c), acc);
        }
    }
    return glmrt_warp_sum(acc);
}

__device__ __forceinline__ bool glmrt_resident_last_of(int32_t *arrivals, int32_t blocks)
{
    __shared__ int last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        last = atomicAdd(arrivals, 1) == blocks - 1;
    }
    __syncthreads();
    if (!last) {
        return false;
    }
    __threadfence();
    if (threadIdx.x == 0) {
        *arrivals = 0;
    }
    return true;
}

__device__ __forceinline__ bool glmrt_resident_last_block(int32_t *arrivals)
{
    return glmrt_resident_last_of(arrivals, (int32_t)gridDim.x);
}

template <int FORMAT, bool ROUTE>
__global__ void __launch_bounds__(GLMRT_ROUTE_RESIDENT_WARPS * 32)
    glmrt_route_resident_kernel(glmrt_cuda_matrix w, const float *x, int64_t x_stride, int32_t num_tokens,
                                float *logits, int64_t logits_stride, glmrt_cuda_route_args route,
                                glmrt_cuda_dispatch_args dispatch, int32_t *arrivals)
{
    __shared__ __align__(16) float rows[GLMRT_ROUTE_RESIDENT_TOKENS][GLMRT_ROUTE_RESIDENT_COLS];
    const int warp = threadIdx.x >> 5;
    const int lane = threadIdx.x & 31;
    const int32_t expert = (int32_t)blockIdx.x * GLMRT_ROUTE_RESIDENT_WARPS + warp;
    const int64_t row_bytes = (int64_t)w.cols * (FORMAT == GLMRT_CUDA_FORMAT_F32 ? 4 : 2);
    float4 weights[GLMRT_ROUTE_RESIDENT_STEPS];
    glmrt_resident_weights<FORMAT>(weights, w.data + (int64_t)min(expert, w.rows - 1) * row_bytes, w.cols, lane);
    glmrt_dependent_enter();
    glmrt_router_stage_rows(&rows[0][0], GLMRT_ROUTE_RESIDENT_COLS, x, x_stride, num_tokens, w.cols);
    glmrt_router_staged_wait<0>();
    for (int32_t t = 0; t < num_tokens; ++t) {
        const float logit = glmrt_resident_dot(weights, rows[t], w.cols, lane);
        if (lane == 0 && expert < w.rows) {
            logits[(int64_t)t * logits_stride + expert] = logit;
        }
    }
    if constexpr (ROUTE) {
        if (!glmrt_resident_last_block(arrivals)) {
            return;
        }
        for (int32_t token = warp; token < num_tokens; token += GLMRT_ROUTE_RESIDENT_WARPS) {
            glmrt_route_token(route, token, lane);
        }
        __syncthreads();
        glmrt_dispatch_small(dispatch);
    }
}

#define GLMRT_ROUTE_RESIDENT_CLUSTER 4
#define GLMRT_ROUTE_RESIDENT_CLUSTER_PARTS (GLMRT_ROUTER_MMA_PARTS / GLMRT_ROUTE_RESIDENT_CLUSTER)
#define GLMRT_ROUTE_RESIDENT_MMA_THREADS (GLMRT_ROUTE_RESIDENT_CLUSTER_PARTS * 32)
#define GLMRT_ROUTE_RESIDENT_ROW_PAD 64
#define GLMRT_ROUTE_RESIDENT_MAX_DEVICES 64

typedef struct glmrt_resident_span {
    int32_t first_col;
    int32_t cols;
    int64_t pitch;
} glmrt_resident_span;

__host__ __device__ __forceinline__ int32_t glmrt_resident_span_cols(int32_t cols)
{
    return GLMRT_ROUTE_RESIDENT_CLUSTER_PARTS * glmrt_router_mma_part_steps(cols) * GLMRT_ROUTER_MMA_STEP_COLS;
}

__host__ __device__ __forceinline__ int64_t glmrt_resident_mma_shared_bytes(int32_t cols)
{
    const int64_t span = glmrt_resident_span_cols(cols);
    return GLMRT_ROUTER_MMA_EXPERTS * (2 * span + GLMRT_ROUTE_RESIDENT_ROW_PAD) +
           (int64_t)GLMRT_ROUTE_RESIDENT_TOKENS * span * (int64_t)sizeof(float);
}

__device__ __forceinline__ glmrt_resident_span glmrt_resident_cluster_span(int32_t cols, int32_t rank)
{
    const int32_t width = glmrt_resident_span_cols(cols);
    glmrt_resident_span span;
    span.first_col = min(cols, rank * width);
    span.cols = min(cols - span.first_col, width);
    span.pitch = 2 * (int64_t)width + GLMRT_ROUTE_RESIDENT_ROW_PAD;
    return span;
}

__device__ __forceinline__ void glmrt_resident_mma_stage_weights(uint8_t *tile, const glmrt_cuda_matrix &w,
                                                                 int32_t first_expert, const glmrt_resident_span &span)
{
    const int64_t row_bytes = 2 * (int64_t)w.cols;
    const uint32_t base = (uint32_t)__cvta_generic_to_shared(tile);
    const int32_t chunks = span.cols * 2 / 16;
    for (int32_t i = (int32_t)threadIdx.x; i < GLMRT_ROUTER_MMA_EXPERTS * chunks; i += (int32_t)blockDim.x) {
        const int32_t r = i / chunks;
        const int32_t c = i % chunks;
        const int32_t expert = min(first_expert + r, w.rows - 1);
        const uint8_t *from = w.data + (int64_t)expert * row_bytes + 2 * (int64_t)span.first_col + (int64_t)c * 16;
        const uint32_t to = base + (uint32_t)(r * span.pitch + (int64_t)c * 16);
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(to), "l"(from) : "memory");
    }
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}

__device__ __forceinline__ uint4 glmrt_resident_mma_weights(const uint8_t *tile, const glmrt_resident_span &span,
                                                            int row, int32_t col)
{
    if (col >= span.cols) {
        return make_uint4(0u, 0u, 0u, 0u);
    }
    return *reinterpret_cast<const uint4 *>(tile + row * span.pitch + 2 * (int64_t)col);
}

__global__ void __launch_bounds__(GLMRT_ROUTE_RESIDENT_MMA_THREADS)
    glmrt_route_resident_mma_kernel(glmrt_cuda_matrix w, const float *x, int64_t x_stride, int32_t num_tokens,
                                    float *logits, int64_t logits_stride, glmrt_cuda_route_args route,
                                    glmrt_cuda_dispatch_args dispatch, int32_t *arrivals)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    extern __shared__ __align__(16) uint8_t glmrt_resident_mma_tile[];
    __shared__ float parts[GLMRT_ROUTE_RESIDENT_CLUSTER_PARTS][GLMRT_ROUTER_MMA_EXPERTS][GLMRT_ROUTER_MMA_TOKENS];
    const int warp = (int)(threadIdx.x >> 5);
    const int lane = (int)(threadIdx.x & 31);
    const uint32_t rank = glmrt_cluster_rank();
    const int part = (int)rank * GLMRT_ROUTE_RESIDENT_CLUSTER_PARTS + warp;
    const int32_t cols = w.cols;
    const int32_t first_expert = (int32_t)(blockIdx.x / GLMRT_ROUTE_RESIDENT_CLUSTER) * GLMRT_ROUTER_MMA_EXPERTS;
    const glmrt_resident_span span = glmrt_resident_cluster_span(cols, (int32_t)rank);
    float *token_rows = reinterpret_cast<float *>(glmrt_resident_mma_tile + GLMRT_ROUTER_MMA_EXPERTS * span.pitch);
    glmrt_resident_mma_stage_weights(glmrt_resident_mma_tile, w, first_expert, span);
    glmrt_dependent_enter();
    glmrt_router_stage_rows(token_rows, glmrt_resident_span_cols(cols), x + span.first_col, x_stride, num_tokens,
                            span.cols);
    glmrt_router_staged_wait<0>();
    const glmrt_router_mma_range range = glmrt_router_mma_part(cols, part);
    const int g = lane >> 2;
    const float *token_row = g < num_tokens ? token_rows + (int64_t)g * glmrt_resident_span_cols(cols) : nullptr;
    glmrt_router_chains acc;
    glmrt_router_chains_clear(acc);
    for (int32_t step = range.begin; step < range.end; ++step) {
        const int32_t c = glmrt_router_mma_lane_col(step, lane) - span.first_col;
        glmrt_router_chains_step(acc, glmrt_resident_mma_weights(glmrt_resident_mma_tile, span, g, c),
                                 glmrt_resident_mma_weights(glmrt_resident_mma_tile, span, g + 8, c),
                                 glmrt_router_load_tokens(token_row, c, span.cols));
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        parts[warp][glmrt_router_fragment_expert(i, lane)][glmrt_router_fragment_token(i, lane)] =
            glmrt_router_chains_value(acc, i);
    }
    glmrt_cluster_sync();
    if (rank == 0) {
        for (int idx = (int)threadIdx.x; idx < GLMRT_ROUTER_MMA_EXPERTS * num_tokens;
             idx += GLMRT_ROUTE_RESIDENT_MMA_THREADS) {
            const int t = idx / GLMRT_ROUTER_MMA_EXPERTS;
            const int e = idx % GLMRT_ROUTER_MMA_EXPERTS;
            float values[GLMRT_ROUTER_MMA_PARTS];
#pragma unroll
            for (int p = 0; p < GLMRT_ROUTER_MMA_PARTS; ++p) {
                values[p] = glmrt_cluster_load(&parts[p % GLMRT_ROUTE_RESIDENT_CLUSTER_PARTS][e][t],
                                               (uint32_t)(p / GLMRT_ROUTE_RESIDENT_CLUSTER_PARTS));
            }
            if (first_expert + e < w.rows) {
                logits[(int64_t)t * logits_stride + first_expert + e] = glmrt_router_parts_fold(values, 1);
            }
        }
    }
    glmrt_cluster_sync();
    if (rank != 0 || !glmrt_resident_last_of(arrivals, (int32_t)(gridDim.x / GLMRT_ROUTE_RESIDENT_CLUSTER))) {
        return;
    }
    for (int32_t token = warp; token < num_tokens; token += GLMRT_ROUTE_RESIDENT_CLUSTER_PARTS) {
        glmrt_route_token(route, token, lane);
    }
    __syncthreads();
    glmrt_dispatch_small(dispatch);
#endif
}

typedef void (*glmrt_route_resident_fn)(glmrt_cuda_matrix, const float *, int64_t, int32_t, float *, int64_t,
                                        glmrt_cuda_route_args, glmrt_cuda_dispatch_args, int32_t *);

static glmrt_status glmrt_route_resident_mma_shared(glmrt_route_resident_fn kernel, glmrt_error *error)
{
    static std::atomic<int32_t> sized[GLMRT_ROUTE_RESIDENT_MAX_DEVICES];
    int device = 0;
    GLMRT_CUDA_TRY(error, cudaGetDevice(&device));
    const bool cached = device >= 0 && device < GLMRT_ROUTE_RESIDENT_MAX_DEVICES;
    if (cached && sized[device].load(std::memory_order_acquire) != 0) {
        return GLMRT_OK;
    }
    const int64_t most = glmrt_resident_mma_shared_bytes(GLMRT_ROUTE_RESIDENT_COLS);
    GLMRT_CUDA_TRY(error, cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)most));
    if (cached) {
        sized[device].store(1, std::memory_order_release);
    }
    return GLMRT_OK;
}

static glmrt_status glmrt_route_resident_mma_launch(const glmrt_cuda_matrix *w, const float *x, int64_t x_stride,
                                                    int32_t num_tokens, float *logits, int64_t logits_stride,
                                                    const glmrt_cuda_route_args &route,
                                                    const glmrt_cuda_dispatch_args &dispatch, int32_t *arrivals,
                                                    cudaStream_t stream, glmrt_error *error)
{
    glmrt_route_resident_fn kernel = glmrt_route_resident_mma_kernel;
    GLMRT_TRY(glmrt_route_resident_mma_shared(kernel, error));
    const int64_t bytes = glmrt_resident_mma_shared_bytes(w->cols);
    dim3 grid((unsigned)(glmrt_ceil_div(w->rows, GLMRT_ROUTER_MMA_EXPERTS) * GLMRT_ROUTE_RESIDENT_CLUSTER));
    glmrt_dependent_launch dependent;
    const cudaLaunchConfig_t *config = glmrt_dependent_cluster_config(
        &dependent, grid, GLMRT_ROUTE_RESIDENT_MMA_THREADS, (size_t)bytes, stream, GLMRT_ROUTE_RESIDENT_CLUSTER);
    GLMRT_CUDA_TRY(error, cudaLaunchKernelEx(config, kernel, *w, x, x_stride, num_tokens, logits, logits_stride,
                                             route, dispatch, arrivals));
    return GLMRT_OK;
}

template <bool ROUTE>
static glmrt_status glmrt_route_resident_launch(const glmrt_cuda_matrix *w, const float *x, int64_t x_stride,
                                                int32_t num_tokens, float *logits, int64_t logits_stride,
                                                const glmrt_cuda_route_args &route,
                                                const glmrt_cuda_dispatch_args &dispatch, int32_t *arrivals,
                                                cudaStream_t stream, glmrt_error *error)
{
    dim3 grid((unsigned)glmrt_ceil_div(w->rows, GLMRT_ROUTE_RESIDENT_WARPS));
    glmrt_dependent_launch dependent;
    const cudaLaunchConfig_t *config =
        glmrt_dependent_config(&dependent, grid, GLMRT_ROUTE_RESIDENT_WARPS * 32, 0, stream);
    void (*kernel)(glmrt_cuda_matrix, const float *, int64_t, int32_t, float *, int64_t, glmrt_cuda_route_args,
                   glmrt_cuda_dispatch_args, int32_t *) =
        w->format == GLMRT_CUDA_FORMAT_F32 ? glmrt_route_resident_kernel<GLMRT_CUDA_FORMAT_F32, ROUTE>
                                           : glmrt_route_resident_kernel<GLMRT_CUDA_FORMAT_BF16, ROUTE>;
    GLMRT_CUDA_TRY(error, cudaLaunchKernelEx(config, kernel, *w, x, x_stride, num_tokens, logits, logits_stride, route,
                                             dispatch, arrivals));
    return GLMRT_OK;
}

int glmrt_cuda_router_resident_fits(const glmrt_cuda_matrix *router, int32_t num_tokens)
{
    return num_tokens >= 1 && num_tokens <= GLMRT_ROUTE_RESIDENT_TOKENS && glmrt_cuda_router_supports(router) &&
           router->cols <= GLMRT_ROUTE_RESIDENT_COLS && router->rows <= GLMRT_MOE_MAX_EXPERTS;
}

glmrt_status glmrt_cuda_router_resident_logits(const glmrt_cuda_matrix *w, const float *x, int64_t x_stride,
                                               int32_t num_tokens, float *logits, int64_t logits_stride,
                                               cudaStream_t stream, glmrt_error *error)
{
    if (!glmrt_cuda_router_resident_fits(w, num_tokens) || ((uintptr_t)x & 15u) != 0 || x_stride % 4 != 0) {
        return glmrt_error_set(error, GLMRT_ERR_INVARIANT,
                               "resident router logits take 1 to %d aligned rows and a BF16 or F32 router of at most "
                               "%d columns, got %d rows",
                               GLMRT_ROUTE_RESIDENT_TOKENS, GLMRT_ROUTE_RESIDENT_COLS, num_tokens);
    }
    if (glmrt_cuda_router_mma_supports(w)) {
        return glmrt_cuda_router_logits(w, x, x_stride, num_tokens, logits, logits_stride, stream, error);
    }
    glmrt_cuda_route_args route;
    glmrt_cuda_dispatch_args dispatch;
    memset(&route, 0, sizeof(route));
    memset(&dispatch, 0, sizeof(dispatch));
    return glmrt_route_resident_launch<false>(w, x, x_stride, num_tokens, logits, logits_stride, route, dispatch,
                                              nullptr, stream, error);
}

static glmrt_status glmrt_route_resident_check(const glmrt_cuda_route_resident_args *args, glmrt_error *error)
{
    const glmrt_cuda_route_args *route = args->route;
    const glmrt_cuda_dispatch_args *dispatch = args->dispatch;
    if (!glmrt_cuda_router_resident_fits(args->router, route->num_tokens)) {
        return glmrt_error_set(error, GLMRT_ERR_INVARIANT,
                               "resident routing takes 1 to %d tokens and a BF16 or F32 router of at most %d columns, "
                               "got %d tokens",
                               GLMRT_ROUTE_RESIDENT_TOKENS, GLMRT_ROUTE_RESIDENT_COLS, route->num_tokens);
    }
    if (((uintptr_t)args->x & 15u) != 0 || args->x_stride % 4 != 0 || route->logits != args->logits ||
        route->num_experts != args->router->rows || dispatch->num_tokens != route->num_tokens ||
        dispatch->top_k != route->top_k || dispatch->topk_ids != route->topk_ids || args->arrivals == nullptr) {
        return glmrt_error_set(error, GLMRT_ERR_INVARIANT,
                               "resident routing needs aligned rows, logits of %d experts and a dispatch of the same "
                               "routing",
                               args->router->rows);
    }
    return glmrt_cuda_moe_dispatch_check(dispatch, error);
}

glmrt_status glmrt_cuda_route_resident(const glmrt_cuda_route_resident_args *args, cudaStream_t stream,
                                       glmrt_error *error)
{
    GLMRT_TRY(glmrt_route_resident_check(args, error));
    if (glmrt_cuda_router_mma_supports(args->router)) {
        return glmrt_route_resident_mma_launch(args->router, args->x, args->x_stride, args->route->num_tokens,
                                               args->logits, args->route->num_experts, *args->route, *args->dispatch,
                                               args->arrivals, stream, error);
    }
    return glmrt_route_resident_launch<true>(args->router, args->x, args->x_stride, args->route->num_tokens,
                                             args->logits, args->route->num_experts, *args->route, *args->dispatch,
                                             args->arrivals, stream, error);
}
