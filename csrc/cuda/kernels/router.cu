#include "dependent_launch.cuh"
#include "cuda_check.cuh"
#include "device_math.cuh"
#include "route_resident.cuh"
#include "router.cuh"
#include "router_lanes.cuh"
#include "router_mma.cuh"

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

template <int MT, int NT, int DEPTH>
struct glmrt_router_mma_tile {
    static constexpr int m_tiles = MT;
    static constexpr int n_tiles = NT;
    static constexpr int depth = DEPTH;
    static constexpr int experts = MT * GLMRT_ROUTER_MMA_EXPERTS;
    static constexpr int tokens = NT * GLMRT_ROUTER_MMA_TOKENS;
};

typedef glmrt_router_mma_tile<1, 1, 4> glmrt_router_mma_narrow;
typedef glmrt_router_mma_tile<1, 2, 2> glmrt_router_mma_middle;
typedef glmrt_router_mma_tile<2, 2, 1> glmrt_router_mma_wide;

#define GLMRT_ROUTER_MMA_NARROW_TOKENS 64
#define GLMRT_ROUTER_MMA_MIDDLE_TOKENS 512

template <typename TILE>
struct glmrt_router_mma_stage {
    uint4 w[TILE::m_tiles][2];
    glmrt_router_lane_tokens x[TILE::n_tiles];
};

template <typename TILE>
__device__ __forceinline__ void glmrt_router_mma_load_weights(glmrt_router_mma_stage<TILE> &stage,
                                                              const uint8_t *const (&rows)[TILE::m_tiles][2],
                                                              int32_t step, int32_t cols, int lane)
{
    const int32_t c = glmrt_router_mma_lane_col(step, lane);
#pragma unroll
    for (int m = 0; m < TILE::m_tiles; ++m) {
        stage.w[m][0] = glmrt_router_load_weights(rows[m][0], c, cols);
        stage.w[m][1] = glmrt_router_load_weights(rows[m][1], c, cols);
    }
}

template <typename TILE>
__device__ __forceinline__ void glmrt_router_mma_load_tokens(glmrt_router_mma_stage<TILE> &stage,
                                                             const float *const (&rows)[TILE::n_tiles], int32_t step,
                                                             int32_t cols, int lane)
{
    const int32_t c = glmrt_router_mma_lane_col(step, lane);
#pragma unroll
    for (int n = 0; n < TILE::n_tiles; ++n) {
        stage.x[n] = glmrt_router_load_tokens(rows[n], c, cols);
    }
}

template <typename TILE>
__device__ __forceinline__ void glmrt_router_mma_products(glmrt_router_chains (&acc)[TILE::m_tiles][TILE::n_tiles],
                                                          const glmrt_router_mma_stage<TILE> &stage)
{
#pragma unroll
    for (int n = 0; n < TILE::n_tiles; ++n) {
#pragma unroll
        for (int m = 0; m < TILE::m_tiles; ++m) {
            glmrt_router_chains_step(acc[m][n], stage.w[m][0], stage.w[m][1], stage.x[n]);
        }
    }
}

template <typename TILE>
__global__ void __launch_bounds__(GLMRT_ROUTER_MMA_THREADS, 1)
    glmrt_router_mma_kernel(glmrt_cuda_matrix w, const float *x, int64_t x_stride, int32_t num_tokens, float *logits,
                            int64_t logits_stride)
{
    __shared__ float parts[GLMRT_ROUTER_MMA_PARTS][TILE::experts][TILE::tokens];
    const int part = (int)(threadIdx.x >> 5);
    const int lane = (int)(threadIdx.x & 31);
    const int32_t first_expert = (int32_t)blockIdx.x * TILE::experts;
    const int32_t first_token = (int32_t)blockIdx.y * TILE::tokens;
    const int32_t cols = w.cols;
    const int64_t row_bytes = 2 * (int64_t)cols;
    const uint8_t *w_rows[TILE::m_tiles][2];
#pragma unroll
    for (int m = 0; m < TILE::m_tiles; ++m) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int32_t e = first_expert + m * GLMRT_ROUTER_MMA_EXPERTS + (lane >> 2) + h * 8;
            w_rows[m][h] = e < w.rows ? w.data + (int64_t)e * row_bytes : nullptr;
        }
    }
    const float *x_rows[TILE::n_tiles];
#pragma unroll
    for (int n = 0; n < TILE::n_tiles; ++n) {
        const int32_t t = first_token + n * GLMRT_ROUTER_MMA_TOKENS + (lane >> 2);
        x_rows[n] = t < num_tokens ? x + (int64_t)t * x_stride : nullptr;
    }
    const glmrt_router_mma_range range = glmrt_router_mma_part(cols, part);
    glmrt_router_mma_stage<TILE> ring[TILE::depth];
#pragma unroll
    for (int d = 0; d < TILE::depth; ++d) {
        if (range.begin + d < range.end) {
            glmrt_router_mma_load_weights<TILE>(ring[d], w_rows, range.begin + d, cols, lane);
        }
    }
    glmrt_dependent_enter();
#pragma unroll
    for (int d = 0; d < TILE::depth; ++d) {
        if (range.begin + d < range.end) {
            glmrt_router_mma_load_tokens<TILE>(ring[d], x_rows, range.begin + d, cols, lane);
        }
    }
    glmrt_router_chains acc[TILE::m_tiles][TILE::n_tiles];
#pragma unroll
    for (int m = 0; m < TILE::m_tiles; ++m) {
#pragma unroll
        for (int n = 0; n < TILE::n_tiles; ++n) {
            glmrt_router_chains_clear(acc[m][n]);
        }
    }
    for (int32_t base = range.begin; base < range.end; base += TILE::depth) {
#pragma unroll
        for (int d = 0; d < TILE::depth; ++d) {
            const int32_t step = base + d;
            if (step < range.end) {
                glmrt_router_mma_products<TILE>(acc, ring[d]);
                const int32_t next = step + TILE::depth;
                if (next < range.end) {
                    glmrt_router_mma_load_weights<TILE>(ring[d], w_rows, next, cols, lane);
                    glmrt_router_mma_load_tokens<TILE>(ring[d], x_rows, next, cols, lane);
                }
            }
        }
    }
#pragma unroll
    for (int m = 0; m < TILE::m_tiles; ++m) {
#pragma unroll
        for (int n = 0; n < TILE::n_tiles; ++n) {
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                parts[part][m * GLMRT_ROUTER_MMA_EXPERTS + glmrt_router_fragment_expert(i, lane)]
                     [n * GLMRT_ROUTER_MMA_TOKENS + glmrt_router_fragment_token(i, lane)] =
                         glmrt_router_chains_value(acc[m][n], i);
            }
        }
    }
    __syncthreads();
    for (int idx = (int)threadIdx.x; idx < TILE::experts * TILE::tokens; idx += GLMRT_ROUTER_MMA_THREADS) {
        const int t = idx / TILE::experts;
        const int e = idx % TILE::experts;
        const int32_t token = first_token + t;
        const int32_t expert = first_expert + e;
        if (token < num_tokens && expert < w.rows) {
            logits[(int64_t)token * logits_stride + expert] =
                glmrt_router_parts_fold(&parts[0][e][t], TILE::experts * TILE::tokens);
        }
    }
}

template <typename TILE>
static glmrt_status glmrt_router_mma_launch(const glmrt_cuda_matrix *w, const float *x, int64_t x_stride,
                                            int32_t num_tokens, float *logits, int64_t logits_stride,
                                            cudaStream_t stream, glmrt_error *error)
{
    dim3 grid((unsigned)glmrt_ceil_div(w->rows, TILE::experts), (unsigned)glmrt_ceil_div(num_tokens, TILE::tokens));
    glmrt_dependent_launch dependent;
    const cudaLaunchConfig_t *config = glmrt_dependent_config(&dependent, grid, GLMRT_ROUTER_MMA_THREADS, 0, stream);
    GLMRT_CUDA_TRY(error, cudaLaunchKernelEx(config, glmrt_router_mma_kernel<TILE>, *w, x, x_stride, num_tokens,
                                             logits, logits_stride));
    return GLMRT_OK;
}

static glmrt_status glmrt_router_mma_logits(const glmrt_cuda_matrix *w, const float *x, int64_t x_stride,
                                            int32_t num_tokens, float *logits, int64_t logits_stride,
                                            cudaStream_t stream, glmrt_error *error)
{
    if (num_tokens <= GLMRT_ROUTER_MMA_NARROW_TOKENS) {
        return glmrt_router_mma_launch<glmrt_router_mma_narrow>(w, x, x_stride, num_tokens, logits, logits_stride,
                                                                stream, error);
    }
    if (num_tokens <= GLMRT_ROUTER_MMA_MIDDLE_TOKENS) {
        return glmrt_router_mma_launch<glmrt_router_mma_middle>(w, x, x_stride, num_tokens, logits, logits_stride,
                                                                stream, error);
    }
    return glmrt_router_mma_launch<glmrt_router_mma_wide>(w, x, x_stride, num_tokens, logits, logits_stride, stream,
                                                          error);
}

int glmrt_cuda_router_mma_supports(const glmrt_cuda_matrix *w)
{
    return glmrt_cuda_router_supports(w) && w->format == GLMRT_CUDA_FORMAT_BF16 &&
           w->cols % GLMRT_ROUTER_MMA_LANE_COLS == 0 && ((uintptr_t)w->data & 15u) == 0;
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
    if (glmrt_cuda_router_mma_supports(w)) {
        return glmrt_router_mma_logits(w, x, x_stride, num_tokens, logits, logits_stride, stream, error);
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
