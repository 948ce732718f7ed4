#include <string.h>

#include "cuda_check.cuh"
#include "dependent_launch.cuh"
#include "moe_blocks.cuh"
#include "route_resident.cuh"
#include "router.cuh"
#include "router_lanes.cuh"

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

__device__ __forceinline__ bool glmrt_resident_last_block(int32_t *arrivals)
{
    __shared__ int last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        last = atomicAdd(arrivals, 1) == (int)gridDim.x - 1;
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
    return glmrt_route_resident_launch<true>(args->router, args->x, args->x_stride, args->route->num_tokens,
                                             args->logits, args->route->num_experts, *args->route, *args->dispatch,
                                             args->arrivals, stream, error);
}
