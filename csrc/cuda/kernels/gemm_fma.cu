#include "dependent_launch.cuh"
#include "cuda_check.cuh"
#include "device_math.cuh"
#include "gemm_kernels.cuh"

#define GLMRT_FMA_WARPS 8
#define GLMRT_FMA_CHANNELS_PER_WARP 4
#define GLMRT_FMA_CHANNELS_PER_BLOCK (GLMRT_FMA_WARPS * GLMRT_FMA_CHANNELS_PER_WARP)

template <int FORMAT>
struct glmrt_piece_raw;

template <>
struct glmrt_piece_raw<GLMRT_CUDA_FORMAT_FP8> {
    uint4 v;
    __device__ __forceinline__ void load(const uint8_t *row, int32_t k0)
    {
        v = __ldg(reinterpret_cast<const uint4 *>(row + k0));
    }
    __device__ __forceinline__ void decode(float *w) const
    {
        glmrt_fp8x4_to_float4(v.x, w);
        glmrt_fp8x4_to_float4(v.y, w + 4);
        glmrt_fp8x4_to_float4(v.z, w + 8);
        glmrt_fp8x4_to_float4(v.w, w + 12);
    }
};

template <>
struct glmrt_piece_raw<GLMRT_CUDA_FORMAT_BF16> {
    uint4 v[2];
    __device__ __forceinline__ void load(const uint8_t *row, int32_t k0)
    {
        const uint4 *at = reinterpret_cast<const uint4 *>(row + (int64_t)k0 * 2);
        v[0] = __ldg(at);
        v[1] = __ldg(at + 1);
    }
    __device__ __forceinline__ void decode(float *w) const
    {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            glmrt_bf16x2_to_float2(v[h].x, w + h * 8);
            glmrt_bf16x2_to_float2(v[h].y, w + h * 8 + 2);
            glmrt_bf16x2_to_float2(v[h].z, w + h * 8 + 4);
            glmrt_bf16x2_to_float2(v[h].w, w + h * 8 + 6);
        }
    }
};

template <>
struct glmrt_piece_raw<GLMRT_CUDA_FORMAT_F32> {
    float4 v[4];
    __device__ __forceinline__ void load(const uint8_t *row, int32_t k0)
    {
        const float4 *at = reinterpret_cast<const float4 *>(row + (int64_t)k0 * 4);
#pragma unroll
        for (int h = 0; h < 4; ++h) {
            v[h] = __ldg(at + h);
        }
    }
    __device__ __forceinline__ void decode(float *w) const
    {
#pragma unroll
        for (int h = 0; h < 4; ++h) {
            w[h * 4] = v[h].x;
            w[h * 4 + 1] = v[h].y;
            w[h * 4 + 2] = v[h].z;
            w[h * 4 + 3] = v[h].w;
        }
    }
};

__device__ __forceinline__ float glmrt_piece_dot(const float *w, const float *x)
{
    float p = __fmul_rn(w[0], x[0]);
#pragma unroll
    for (int i = 1; i < GLMRT_CUDA_PIECE; ++i) {
        p = __fmaf_rn(w[i], x[i], p);
    }
    return p;
}

__device__ __forceinline__ void glmrt_load_x_piece(const float *row, int32_t k0, float *x)
{
    const float4 *at = reinterpret_cast<const float4 *>(row + k0);
#pragma unroll
    for (int h = 0; h < 4; ++h) {
        float4 v = __ldg(at + h);
        x[h * 4] = v.x;
        x[h * 4 + 1] = v.y;
        x[h * 4 + 2] = v.z;
        x[h * 4 + 3] = v.w;
    }
}

template <int MT, int FORMAT, int SCALE>
__device__ __forceinline__ void glmrt_fma_rows(const glmrt_cuda_gemm_args &args, int32_t group, int32_t n_base,
                                               int32_t row_begin, int32_t count)
{
    constexpr int NT = GLMRT_FMA_CHANNELS_PER_WARP;
    const int lane = threadIdx.x & 31;
    const glmrt_cuda_matrix &w = args.w;
    const uint8_t *data = w.data + (int64_t)group * w.group_bytes;
    const float *scale = w.scale != nullptr ? w.scale + (int64_t)group * w.group_scales : nullptr;
    const int64_t row_bytes = (int64_t)w.cols * glmrt_cuda_format_bytes(FORMAT);
    const uint8_t *wrow[NT];
    int32_t block_row[NT];
#pragma unroll
    for (int j = 0; j < NT; ++j) {
        int32_t n = min(n_base + j, w.rows - 1);
        wrow[j] = data + (int64_t)n * row_bytes;
        block_row[j] = SCALE == GLMRT_CUDA_SCALE_BLOCK ? glmrt_cuda_matrix_row_block(&w, n) * w.scale_cols : 0;
    }
    const float *xrow[MT];
#pragma unroll
    for (int t = 0; t < MT; ++t) {
        int32_t r = row_begin + min(t, count - 1);
        int64_t source = args.x_rows != nullptr ? args.x_rows[r] : r;
        xrow[t] = args.x + source * args.x_stride;
    }
    float acc[MT][NT];
#pragma unroll
    for (int t = 0; t < MT; ++t) {
#pragma unroll
        for (int j = 0; j < NT; ++j) {
            acc[t][j] = 0.0f;
        }
    }
    for (int32_t k0 = lane * GLMRT_CUDA_PIECE; k0 < w.cols; k0 += GLMRT_WARP_SIZE * GLMRT_CUDA_PIECE) {
        glmrt_piece_raw<FORMAT> raw[NT];
#pragma unroll
        for (int j = 0; j < NT; ++j) {
            raw[j].load(wrow[j], k0);
        }
        float piece_scale[NT];
#pragma unroll
        for (int j = 0; j < NT; ++j) {
            piece_scale[j] = SCALE == GLMRT_CUDA_SCALE_BLOCK ? __ldg(scale + block_row[j] + k0 / w.block_cols) : 1.0f;
        }
        float wv[NT][GLMRT_CUDA_PIECE];
#pragma unroll
        for (int j = 0; j < NT; ++j) {
            raw[j].decode(wv[j]);
        }
#pragma unroll
        for (int t = 0; t < MT; ++t) {
            if (t < count) {
                float xv[GLMRT_CUDA_PIECE];
                glmrt_load_x_piece(xrow[t], k0, xv);
#pragma unroll
                for (int j = 0; j < NT; ++j) {
                    float p = glmrt_piece_dot(wv[j], xv);
                    if (SCALE == GLMRT_CUDA_SCALE_BLOCK) {
                        acc[t][j] = __fmaf_rn(p, piece_scale[j], acc[t][j]);
                    } else {
                        acc[t][j] = __fadd_rn(acc[t][j], p);
                    }
                }
            }
        }
    }
    float mine = 0.0f;
#pragma unroll
    for (int t = 0; t < MT; ++t) {
#pragma unroll
        for (int j = 0; j < NT; ++j) {
            float total = glmrt_warp_sum(acc[t][j]);
            if (lane == t * NT + j) {
                mine = total;
            }
        }
    }
    const int t = lane / NT;
    const int j = lane % NT;
    const int32_t n = n_base + j;
    if (lane < MT * NT && t < count && n < w.rows) {
        float value = mine;
        if (SCALE == GLMRT_CUDA_SCALE_CHANNEL) {
            value = __fmul_rn(value, __ldg(scale + n));
        }
        if (args.bias != nullptr) {
            value = __fadd_rn(value, __ldg(args.bias + n));
        }
        float *out = args.y + (int64_t)(row_begin + t) * args.y_stride + n;
        *out = args.accumulate ? __fadd_rn(*out, value) : value;
    }
}

template <int MT, int FORMAT, int SCALE>
__global__ void __launch_bounds__(GLMRT_FMA_WARPS * GLMRT_WARP_SIZE) glmrt_gemm_fma_kernel(glmrt_cuda_gemm_args args)
{
    glmrt_dependent_enter();
    const int warp = threadIdx.x >> 5;
    int32_t group = 0;
    int32_t row_begin;
    int32_t count;
    if (args.tiles != nullptr) {
        if ((int32_t)blockIdx.y >= *args.num_tiles) {
            return;
        }
        glmrt_cuda_gemm_tile tile = args.tiles[blockIdx.y];
        group = tile.group;
        row_begin = tile.row_begin;
        count = tile.num_rows;
    } else {
        row_begin = (int32_t)blockIdx.y * MT;
        count = min(MT, args.num_rows - row_begin);
    }
    const int32_t n_base = ((int32_t)blockIdx.x * GLMRT_FMA_WARPS + warp) * GLMRT_FMA_CHANNELS_PER_WARP;
    if (n_base >= args.w.rows) {
        return;
    }
    for (int32_t done = 0; done < count; done += MT) {
        glmrt_fma_rows<MT, FORMAT, SCALE>(args, group, n_base, row_begin + done, min(MT, count - done));
    }
}

typedef void (*glmrt_fma_kernel_fn)(glmrt_cuda_gemm_args);

template <int MT>
static glmrt_fma_kernel_fn glmrt_fma_pick_format(const glmrt_cuda_matrix *w)
{
    if (w->format == GLMRT_CUDA_FORMAT_FP8) {
        if (w->scale_kind == GLMRT_CUDA_SCALE_BLOCK) {
            return glmrt_gemm_fma_kernel<MT, GLMRT_CUDA_FORMAT_FP8, GLMRT_CUDA_SCALE_BLOCK>;
        }
        if (w->scale_kind == GLMRT_CUDA_SCALE_CHANNEL) {
            return glmrt_gemm_fma_kernel<MT, GLMRT_CUDA_FORMAT_FP8, GLMRT_CUDA_SCALE_CHANNEL>;
        }
        return nullptr;
    }
    if (w->scale_kind != GLMRT_CUDA_SCALE_NONE) {
        return nullptr;
    }
    if (w->format == GLMRT_CUDA_FORMAT_BF16) {
        return glmrt_gemm_fma_kernel<MT, GLMRT_CUDA_FORMAT_BF16, GLMRT_CUDA_SCALE_NONE>;
    }
    if (w->format == GLMRT_CUDA_FORMAT_F32) {
        return glmrt_gemm_fma_kernel<MT, GLMRT_CUDA_FORMAT_F32, GLMRT_CUDA_SCALE_NONE>;
    }
    return nullptr;
}

static int32_t glmrt_fma_rows_per_block(int32_t rows)
{
    if (rows >= 8) {
        return 8;
    }
    if (rows >= 4) {
        return 4;
    }
    return rows >= 2 ? 2 : 1;
}

static glmrt_fma_kernel_fn glmrt_fma_pick(const glmrt_cuda_matrix *w, int32_t rows_per_block)
{
    switch (rows_per_block) {
    case 1: return glmrt_fma_pick_format<1>(w);
    case 2: return glmrt_fma_pick_format<2>(w);
    case 4: return glmrt_fma_pick_format<4>(w);
    case 8: return glmrt_fma_pick_format<8>(w);
    default: return nullptr;
    }
}

int glmrt_cuda_gemm_fma_supports(const glmrt_cuda_matrix *w)
{
    if (w->cols % GLMRT_CUDA_PIECE != 0 || glmrt_fma_pick(w, 1) == nullptr) {
        return 0;
    }
    return w->scale_kind != GLMRT_CUDA_SCALE_BLOCK || (w->block_cols % GLMRT_CUDA_PIECE == 0 && w->block_rows > 0);
}

glmrt_status glmrt_cuda_gemm_fma_run(const glmrt_cuda_gemm_args *args, int32_t tile_rows, int32_t grid_tiles,
                                     cudaStream_t stream, glmrt_error *error)
{
    int32_t rows_per_block = glmrt_fma_rows_per_block(args->tiles != nullptr ? tile_rows : args->num_rows);
    if (args->tiles == nullptr) {
        grid_tiles = glmrt_ceil_div(args->num_rows, rows_per_block);
    }
    if (grid_tiles <= 0) {
        return GLMRT_OK;
    }
    glmrt_fma_kernel_fn kernel = glmrt_fma_pick(&args->w, rows_per_block);
    if (kernel == nullptr) {
        return glmrt_error_set(error, GLMRT_ERR_INVARIANT, "no FMA GEMM for format %d, scale %d, %d rows a block",
                               args->w.format, args->w.scale_kind, rows_per_block);
    }
    dim3 grid((unsigned)glmrt_ceil_div(args->w.rows, GLMRT_FMA_CHANNELS_PER_BLOCK), (unsigned)grid_tiles);
    glmrt_dependent_launch dependent;
    const cudaLaunchConfig_t *config = glmrt_dependent_config(&dependent, grid, GLMRT_FMA_WARPS * GLMRT_WARP_SIZE, 0,
                                                              stream);
    GLMRT_CUDA_TRY(error, cudaLaunchKernelEx(config, kernel, *args));
    return GLMRT_OK;
}
