#include "dependent_launch.cuh"
#include "cuda_check.cuh"
#include "device_math.cuh"
#include "router.cuh"

#define GLMRT_ROUTER_WARPS 8
#define GLMRT_ROUTER_TOKENS 8
#define GLMRT_ROUTER_CHUNK 1024
#define GLMRT_ROUTER_LANE_COLS 4
#define GLMRT_ROUTER_WARP_COLS (32 * GLMRT_ROUTER_LANE_COLS)
#define GLMRT_ROUTER_STEPS (GLMRT_ROUTER_CHUNK / GLMRT_ROUTER_WARP_COLS)

template <int FORMAT>
__device__ __forceinline__ float4 glmrt_router_weights(const uint8_t *row, int32_t col)
{
    if (FORMAT == GLMRT_CUDA_FORMAT_F32) {
        return *reinterpret_cast<const float4 *>(row + (int64_t)col * 4);
    }
    const uint2 bits = *reinterpret_cast<const uint2 *>(row + (int64_t)col * 2);
    return make_float4(__uint_as_float(bits.x << 16), __uint_as_float(bits.x & 0xffff0000u),
                       __uint_as_float(bits.y << 16), __uint_as_float(bits.y & 0xffff0000u));
}

__device__ __forceinline__ float glmrt_router_dot4(float4 w, float4 x, float acc)
{
    acc = __fmaf_rn(w.x, x.x, acc);
    acc = __fmaf_rn(w.y, x.y, acc);
    acc = __fmaf_rn(w.z, x.z, acc);
    return __fmaf_rn(w.w, x.w, acc);
}

template <int FORMAT>
__device__ __forceinline__ void glmrt_router_chunk_weights(float4 *weights, const uint8_t *row, int32_t base,
                                                           int32_t width, int lane)
{
#pragma unroll
    for (int s = 0; s < GLMRT_ROUTER_STEPS; ++s) {
        const int32_t c = lane * GLMRT_ROUTER_LANE_COLS + s * GLMRT_ROUTER_WARP_COLS;
        weights[s] = c < width ? glmrt_router_weights<FORMAT>(row, base + c) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
}

template <int FORMAT>
__global__ void __launch_bounds__(GLMRT_ROUTER_WARPS * 32)
    glmrt_router_kernel(glmrt_cuda_matrix w, const float *x, int64_t x_stride, int32_t num_tokens, float *logits,
                        int64_t logits_stride)
{
    __shared__ __align__(16) float tile[GLMRT_ROUTER_TOKENS][GLMRT_ROUTER_CHUNK];
    const int warp = threadIdx.x >> 5;
    const int lane = threadIdx.x & 31;
    const int32_t expert = (int32_t)blockIdx.x * GLMRT_ROUTER_WARPS + warp;
    const int32_t first_token = (int32_t)blockIdx.y * GLMRT_ROUTER_TOKENS;
    const int32_t tokens = min(GLMRT_ROUTER_TOKENS, num_tokens - first_token);
    const uint8_t *row = w.data + (int64_t)min(expert, w.rows - 1) * w.cols * (FORMAT == GLMRT_CUDA_FORMAT_F32 ? 4 : 2);
    float4 weights[GLMRT_ROUTER_STEPS];
    glmrt_router_chunk_weights<FORMAT>(weights, row, 0, min(GLMRT_ROUTER_CHUNK, w.cols), lane);
    glmrt_dependent_enter();
    float acc[GLMRT_ROUTER_TOKENS];
#pragma unroll
    for (int t = 0; t < GLMRT_ROUTER_TOKENS; ++t) {
        acc[t] = 0.0f;
    }
    for (int32_t base = 0; base < w.cols; base += GLMRT_ROUTER_CHUNK) {
        const int32_t width = min(GLMRT_ROUTER_CHUNK, w.cols - base);
        const int32_t quads = width / 4;
        if (base > 0) {
            glmrt_router_chunk_weights<FORMAT>(weights, row, base, width, lane);
        }
        __syncthreads();
#pragma unroll 8
        for (int32_t i = (int32_t)threadIdx.x; i < tokens * quads; i += (int32_t)blockDim.x) {
            const int32_t t = i / quads;
            const int32_t q = i - t * quads;
            *reinterpret_cast<float4 *>(&tile[t][4 * q]) =
                *reinterpret_cast<const float4 *>(x + (int64_t)(first_token + t) * x_stride + base + 4 * q);
        }
        __syncthreads();
#pragma unroll
        for (int s = 0; s < GLMRT_ROUTER_STEPS; ++s) {
            const int32_t c = lane * GLMRT_ROUTER_LANE_COLS + s * GLMRT_ROUTER_WARP_COLS;
            if (c < width) {
#pragma unroll
                for (int t = 0; t < GLMRT_ROUTER_TOKENS; ++t) {
                    if (t < tokens) {
                        acc[t] = glmrt_router_dot4(weights[s], *reinterpret_cast<const float4 *>(&tile[t][c]), acc[t]);
                    }
                }
            }
        }
    }
#pragma unroll
    for (int t = 0; t < GLMRT_ROUTER_TOKENS; ++t) {
        acc[t] = glmrt_warp_sum(acc[t]);
    }
    if (lane == 0 && expert < w.rows) {
        for (int t = 0; t < tokens; ++t) {
            logits[(int64_t)(first_token + t) * logits_stride + expert] = acc[t];
        }
    }
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
    dim3 grid((unsigned)glmrt_ceil_div(w->rows, GLMRT_ROUTER_WARPS), (unsigned)glmrt_ceil_div(num_tokens, GLMRT_ROUTER_TOKENS));
    void (*kernel)(glmrt_cuda_matrix, const float *, int64_t, int32_t, float *, int64_t) =
        w->format == GLMRT_CUDA_FORMAT_F32 ? glmrt_router_kernel<GLMRT_CUDA_FORMAT_F32>
                                           : glmrt_router_kernel<GLMRT_CUDA_FORMAT_BF16>;
    glmrt_dependent_launch dependent;
    const cudaLaunchConfig_t *config = glmrt_dependent_config(&dependent, grid, GLMRT_ROUTER_WARPS * 32, 0, stream);
    GLMRT_CUDA_TRY(error, cudaLaunchKernelEx(config, kernel, *w, x, x_stride, num_tokens, logits, logits_stride));
    return GLMRT_OK;
}
