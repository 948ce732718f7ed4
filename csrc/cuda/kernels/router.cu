#include "dependent_launch.cuh"
#include "cuda_check.cuh"
#include "device_math.cuh"
#include "route_resident.cuh"
#include "router.cuh"
#include "router_lanes.cuh"

#define GLMRT_ROUTER_PACKED_TOKENS 32

template <int WARPS, int TOKENS, int EXPERTS, int CHUNK>
struct glmrt_router_tile {
    static constexpr int warps = WARPS;
    static constexpr int tokens = TOKENS;
    static constexpr int experts = EXPERTS;
    static constexpr int chunk = CHUNK;
    static constexpr int steps = CHUNK / GLMRT_ROUTER_WARP_COLS;
    static constexpr int block_experts = WARPS * EXPERTS;
    static_assert(CHUNK % GLMRT_ROUTER_WARP_COLS == 0, "a chunk is whole warp-wide column steps");
};

typedef glmrt_router_tile<8, 8, 1, 1024> glmrt_router_narrow;
typedef glmrt_router_tile<4, 8, 4, 512> glmrt_router_packed;

template <int FORMAT, typename TILE>
__device__ __forceinline__ void glmrt_router_chunk_weights(uint4 (*weights)[TILE::steps], const uint8_t *const *rows,
                                                           int32_t base, int32_t width, int lane)
{
#pragma unroll
    for (int e = 0; e < TILE::experts; ++e) {
#pragma unroll
        for (int s = 0; s < TILE::steps; ++s) {
            const int32_t c = lane * GLMRT_ROUTER_LANE_COLS + s * GLMRT_ROUTER_WARP_COLS;
            weights[e][s] = c < width ? glmrt_router_weight_bits<FORMAT>(rows[e], base + c) : make_uint4(0u, 0u, 0u, 0u);
        }
    }
}

template <int FORMAT, typename TILE>
__device__ __forceinline__ void glmrt_router_chunk_products(float (*acc)[TILE::tokens],
                                                            const uint4 (*weights)[TILE::steps],
                                                            const float (*tile)[TILE::chunk], int32_t width, int lane)
{
#pragma unroll
    for (int s = 0; s < TILE::steps; ++s) {
        const int32_t c = lane * GLMRT_ROUTER_LANE_COLS + s * GLMRT_ROUTER_WARP_COLS;
        if (c < width) {
            float4 xt[TILE::tokens];
#pragma unroll
            for (int t = 0; t < TILE::tokens; ++t) {
                xt[t] = *reinterpret_cast<const float4 *>(&tile[t][c]);
            }
#pragma unroll
            for (int e = 0; e < TILE::experts; ++e) {
                const float4 w = glmrt_router_weight_values<FORMAT>(weights[e][s]);
#pragma unroll
                for (int t = 0; t < TILE::tokens; ++t) {
                    acc[e][t] = glmrt_router_dot4(w, xt[t], acc[e][t]);
                }
            }
        }
    }
}

template <int FORMAT, typename TILE>
__global__ void __launch_bounds__(TILE::warps * 32)
    glmrt_router_kernel(glmrt_cuda_matrix w, const float *x, int64_t x_stride, int32_t num_tokens, float *logits,
                        int64_t logits_stride)
{
    __shared__ __align__(16) float tile[TILE::tokens][TILE::chunk];
    const int warp = threadIdx.x >> 5;
    const int lane = threadIdx.x & 31;
    const int32_t first_expert = ((int32_t)blockIdx.x * TILE::warps + warp) * TILE::experts;
    const int32_t first_token = (int32_t)blockIdx.y * TILE::tokens;
    const int32_t tokens = min(TILE::tokens, num_tokens - first_token);
    const int64_t row_bytes = (int64_t)w.cols * (FORMAT == GLMRT_CUDA_FORMAT_F32 ? 4 : 2);
    const float *block_rows = x + (int64_t)first_token * x_stride;
    const uint8_t *rows[TILE::experts];
#pragma unroll
    for (int e = 0; e < TILE::experts; ++e) {
        rows[e] = w.data + (int64_t)min(first_expert + e, w.rows - 1) * row_bytes;
    }
    uint4 weights[TILE::experts][TILE::steps];
    uint4 next_weights[TILE::experts][TILE::steps];
    glmrt_router_chunk_weights<FORMAT, TILE>(weights, rows, 0, min(TILE::chunk, w.cols), lane);
    glmrt_dependent_enter();
    float acc[TILE::experts][TILE::tokens];
#pragma unroll
    for (int e = 0; e < TILE::experts; ++e) {
#pragma unroll
        for (int t = 0; t < TILE::tokens; ++t) {
            acc[e][t] = 0.0f;
        }
    }
    for (int32_t base = 0; base < w.cols; base += TILE::chunk) {
        const int32_t width = min(TILE::chunk, w.cols - base);
        const int32_t next = base + TILE::chunk;
        if (base > 0) {
            __syncthreads();
        }
        glmrt_router_stage_rows(&tile[0][0], TILE::chunk, block_rows + base, x_stride, tokens, width);
        if (next < w.cols) {
            glmrt_router_chunk_weights<FORMAT, TILE>(next_weights, rows, next, min(TILE::chunk, w.cols - next), lane);
        }
        glmrt_router_staged_wait<0>();
        glmrt_router_chunk_products<FORMAT, TILE>(acc, weights, tile, width, lane);
#pragma unroll
        for (int e = 0; e < TILE::experts; ++e) {
#pragma unroll
            for (int s = 0; s < TILE::steps; ++s) {
                weights[e][s] = next_weights[e][s];
            }
        }
    }
#pragma unroll
    for (int e = 0; e < TILE::experts; ++e) {
#pragma unroll
        for (int t = 0; t < TILE::tokens; ++t) {
            acc[e][t] = glmrt_warp_sum(acc[e][t]);
        }
        if (lane == 0 && first_expert + e < w.rows) {
            for (int t = 0; t < tokens; ++t) {
                logits[(int64_t)(first_token + t) * logits_stride + first_expert + e] = acc[e][t];
            }
        }
    }
}

typedef void (*glmrt_router_kernel_fn)(glmrt_cuda_matrix, const float *, int64_t, int32_t, float *, int64_t);

template <typename TILE>
static glmrt_status glmrt_router_launch(const glmrt_cuda_matrix *w, const float *x, int64_t x_stride,
                                        int32_t num_tokens, float *logits, int64_t logits_stride,
                                        cudaStream_t stream, glmrt_error *error)
{
    dim3 grid((unsigned)glmrt_ceil_div(w->rows, TILE::block_experts), (unsigned)glmrt_ceil_div(num_tokens, TILE::tokens));
    glmrt_router_kernel_fn kernel = w->format == GLMRT_CUDA_FORMAT_F32 ? glmrt_router_kernel<GLMRT_CUDA_FORMAT_F32, TILE>
                                                                       : glmrt_router_kernel<GLMRT_CUDA_FORMAT_BF16, TILE>;
    glmrt_dependent_launch dependent;
    const cudaLaunchConfig_t *config = glmrt_dependent_config(&dependent, grid, TILE::warps * 32, 0, stream);
    GLMRT_CUDA_TRY(error, cudaLaunchKernelEx(config, kernel, *w, x, x_stride, num_tokens, logits, logits_stride));
    return GLMRT_OK;
}

int glmrt_cuda_router_supports(const glmrt_cuda_matrix *w)
{
    return (w->format == GLMRT_CUDA_FORMAT_BF16 || w->format == GLMRT_CUDA_FORMAT_F32) &&
           w->scale_kind == GLMRT_CUDA_SCALE_NONE && w->num_groups <= 1 && w->cols % 4 == 0 && w->rows > 0;
}

glmrt_status glmrt_cuda_router_logits(const glmrt_cuda_matrix *w, const float *x, int64_t x_stride,
                                      int32_t num_tokens, float *logits, int64_t logits_stride, cudaStream_t stream,
                                      glmrt_error *error)
{
    if (num_tokens <= 0) {
        return GLMRT_OK;
    }
    if (!glmrt_cuda_router_supports(w) || ((uintptr_t)x & 15u) != 0 || x_stride % 4 != 0) {
        return glmrt_error_set(error, GLMRT_ERR_INVARIANT,
                               "the router kernel takes BF16 or F32 weights and 16-byte aligned f32 rows, got format %d",
                               w->format);
    }
    if (glmrt_cuda_router_resident_fits(w, num_tokens)) {
        return glmrt_cuda_router_resident_logits(w, x, x_stride, num_tokens, logits, logits_stride, stream, error);
    }
    if (num_tokens >= GLMRT_ROUTER_PACKED_TOKENS) {
        return glmrt_router_launch<glmrt_router_packed>(w, x, x_stride, num_tokens, logits, logits_stride, stream,
                                                        error);
    }
    return glmrt_router_launch<glmrt_router_narrow>(w, x, x_stride, num_tokens, logits, logits_stride, stream, error);
}
