#include <atomic>

#include "dependent_launch.cuh"
#include "cuda_check.cuh"
#include "device_math.cuh"
#include "gemm_kernels.cuh"
#include "gemm_mma_ops.cuh"
#include "gemm_mma_tiles.cuh"

__device__ __forceinline__ void glmrt_mma_chunk(float *target, const uint4 &high0, const uint4 &high1,
                                                const uint4 &low0, const uint4 &low1, const uint32_t *b)
{
    const uint32_t high_first[4] = {high0.x, high1.x, high0.y, high1.y};
    const uint32_t low_first[4] = {low0.x, low1.x, low0.y, low1.y};
    const uint32_t high_second[4] = {high0.z, high1.z, high0.w, high1.w};
    const uint32_t low_second[4] = {low0.z, low1.z, low0.w, low1.w};
    glmrt_mma_bf16_16816(target, high_first, b[0], b[1]);
    glmrt_mma_bf16_16816(target, low_first, b[0], b[1]);
    glmrt_mma_bf16_16816(target, high_second, b[2], b[3]);
    glmrt_mma_bf16_16816(target, low_second, b[2], b[3]);
}

template <int FORMAT, int SCALE, int MT, int NT, int WN>
__global__ void __launch_bounds__(glmrt_mma_shape<FORMAT, MT, NT, WN>::threads)
    glmrt_gemm_mma_kernel(glmrt_cuda_gemm_args args)
{
    glmrt_dependent_enter();
    typedef glmrt_mma_shape<FORMAT, MT, NT, WN> shape;
    extern __shared__ __align__(16) uint8_t glmrt_mma_shared[];
    uint8_t *a_high = glmrt_mma_shared;
    uint8_t *a_low = a_high + shape::a_bytes;
    uint8_t *stages = a_low + shape::a_bytes;
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int k_warp = warp % GLMRT_MMA_K_WARPS;
    const int n_warp = warp / GLMRT_MMA_K_WARPS;
    const int g = lane >> 2;
    const int t = lane & 3;
    int32_t group = 0;
    int32_t row_begin;
    int32_t count;
    if (args.tiles != nullptr) {
        if ((int32_t)blockIdx.x >= *args.num_tiles) {
            return;
        }
        glmrt_cuda_gemm_tile tile = args.tiles[blockIdx.x];
        group = tile.group;
        row_begin = tile.row_begin;
        count = min(tile.num_rows, shape::block_m);
    } else {
        row_begin = (int32_t)blockIdx.x * shape::block_m;
        count = min(shape::block_m, args.num_rows - row_begin);
    }
    if (count <= 0) {
        return;
    }
    const glmrt_cuda_matrix &w = args.w;
    const int32_t cols = w.cols;
    const int32_t rows = w.rows;
    const int32_t n_block = (int32_t)blockIdx.y * shape::block_n;
    const uint8_t *data = w.data + (int64_t)group * w.group_bytes;
    const float *scale = w.scale != nullptr ? w.scale + (int64_t)group * w.group_scales : nullptr;
    const int32_t k_tiles = glmrt_ceil_div(cols, GLMRT_MMA_BK);
    const int32_t warp_n = n_block + n_warp * 8 * NT;

    glmrt_mma_weight_loader<FORMAT, MT, NT, WN> weights;
    weights.init(data, (int64_t)cols * shape::weight_bytes, n_block, rows);
    glmrt_mma_activation_loader<FORMAT, MT, NT, WN> activations;
    activations.init(args, row_begin, count);

    int32_t scale_row[NT][2];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            int32_t n = min(warp_n + nt * 8 + 2 * t + e, rows - 1);
            scale_row[nt][e] = SCALE == GLMRT_CUDA_SCALE_BLOCK ? glmrt_cuda_matrix_row_block(&w, n) * w.scale_cols : 0;
        }
    }

    float acc[MT][NT][4];
    float part[MT][NT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                acc[mt][nt][i] = 0.0f;
                part[mt][nt][i] = 0.0f;
            }
        }
    }

#pragma unroll
    for (int s = 0; s < shape::stages - 1; ++s) {
        if (s < k_tiles) {
            weights.issue(stages + s * shape::stage_bytes, s, cols);
        }
        glmrt_cp_async_commit();
    }
    activations.zero_absent_rows(a_high, a_low);
    activations.fetch(0, cols);

    for (int32_t kt = 0; kt < k_tiles; ++kt) {
        activations.store(a_high, a_low);
        glmrt_cp_async_wait<shape::stages - 2>();
        __syncthreads();
        const int32_t ahead = kt + shape::stages - 1;
        if (ahead < k_tiles) {
            weights.issue(stages + (ahead % shape::stages) * shape::stage_bytes, ahead, cols);
        }
        glmrt_cp_async_commit();
        if (kt + 1 < k_tiles) {
            activations.fetch(kt + 1, cols);
        }
        const uint8_t *stage = stages + (kt % shape::stages) * shape::stage_bytes;
        const int32_t k0 = kt * GLMRT_MMA_BK + k_warp * GLMRT_MMA_CHUNK;
        if (k0 < cols) {
            uint32_t b[NT][4];
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) {
                const uint8_t *row = stage + (n_warp * 8 * NT + nt * 8 + g) * shape::b_row_bytes;
                glmrt_mma_weight_fragment<FORMAT>(row, k_warp, t, b[nt]);
            }
            float chunk_scale[NT][2];
            if (SCALE == GLMRT_CUDA_SCALE_BLOCK) {
                const int32_t k_block = k0 / w.block_cols;
#pragma unroll
                for (int nt = 0; nt < NT; ++nt) {
                    chunk_scale[nt][0] = __ldg(scale + scale_row[nt][0] + k_block);
                    chunk_scale[nt][1] = __ldg(scale + scale_row[nt][1] + k_block);
                }
            }
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                const int32_t a_offset = (mt * 16 + g) * GLMRT_MMA_A_ROW_BYTES + (k_warp * 4 + t) * 16;
                const uint4 high0 = *reinterpret_cast<const uint4 *>(a_high + a_offset);
                const uint4 high1 = *reinterpret_cast<const uint4 *>(a_high + a_offset + 8 * GLMRT_MMA_A_ROW_BYTES);
                const uint4 low0 = *reinterpret_cast<const uint4 *>(a_low + a_offset);
                const uint4 low1 = *reinterpret_cast<const uint4 *>(a_low + a_offset + 8 * GLMRT_MMA_A_ROW_BYTES);
#pragma unroll
                for (int nt = 0; nt < NT; ++nt) {
                    if (SCALE == GLMRT_CUDA_SCALE_BLOCK) {
                        glmrt_mma_chunk(part[mt][nt], high0, high1, low0, low1, b[nt]);
#pragma unroll
                        for (int i = 0; i < 4; ++i) {
                            acc[mt][nt][i] = __fmaf_rn(part[mt][nt][i], chunk_scale[nt][i & 1], acc[mt][nt][i]);
                            part[mt][nt][i] = 0.0f;
                        }
                    } else {
                        glmrt_mma_chunk(acc[mt][nt], high0, high1, low0, low1, b[nt]);
                    }
                }
            }
        }
        __syncthreads();
    }
    glmrt_cp_async_wait<0>();
    __syncthreads();

    float *combine = reinterpret_cast<float *>(glmrt_mma_shared);
    if (k_warp > 0) {
        float *mine = combine + ((n_warp * (GLMRT_MMA_K_WARPS - 1) + k_warp - 1) * shape::acc_values) * 32;
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    mine[((mt * NT + nt) * 4 + i) * 32 + lane] = acc[mt][nt][i];
                }
            }
        }
    }
    __syncthreads();
    if (k_warp != 0) {
        return;
    }
#pragma unroll
    for (int other = 0; other < GLMRT_MMA_K_WARPS - 1; ++other) {
        const float *theirs = combine + ((n_warp * (GLMRT_MMA_K_WARPS - 1) + other) * shape::acc_values) * 32;
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    acc[mt][nt][i] = __fadd_rn(acc[mt][nt][i], theirs[((mt * NT + nt) * 4 + i) * 32 + lane]);
                }
            }
        }
    }
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int32_t r = mt * 16 + g + (i >> 1) * 8;
                const int32_t n = warp_n + nt * 8 + 2 * t + (i & 1);
                if (r < count && n < rows) {
                    float value = acc[mt][nt][i];
                    if (SCALE == GLMRT_CUDA_SCALE_CHANNEL) {
                        value = __fmul_rn(value, __ldg(scale + n));
                    }
                    if (args.bias != nullptr) {
                        value = __fadd_rn(value, __ldg(args.bias + n));
                    }
                    float *out = args.y + (int64_t)(row_begin + r) * args.y_stride + n;
                    *out = args.accumulate ? __fadd_rn(*out, value) : value;
                }
            }
        }
    }
}

typedef void (*glmrt_mma_kernel_fn)(glmrt_cuda_gemm_args);

typedef struct glmrt_mma_launch {
    glmrt_mma_kernel_fn kernel;
    int32_t block_m;
    int32_t block_n;
    int32_t threads;
    int32_t smem_bytes;
    std::atomic<uint64_t> *configured_devices;
} glmrt_mma_launch;

template <int FORMAT, int SCALE, int MT, int NT, int WN>
static glmrt_mma_launch glmrt_mma_launch_of()
{
    typedef glmrt_mma_shape<FORMAT, MT, NT, WN> shape;
    static std::atomic<uint64_t> configured_devices(0);
    glmrt_mma_launch launch;
    launch.kernel = glmrt_gemm_mma_kernel<FORMAT, SCALE, MT, NT, WN>;
    launch.block_m = shape::block_m;
    launch.block_n = shape::block_n;
    launch.threads = shape::threads;
    launch.smem_bytes = shape::smem_bytes;
    launch.configured_devices = &configured_devices;
    return launch;
}

template <int FORMAT, int SCALE>
static int glmrt_mma_pick_shape(int32_t mt, int32_t nt, int32_t wn, glmrt_mma_launch *launch)
{
    if (mt == 1 && nt == 2 && wn == 1) {
        *launch = glmrt_mma_launch_of<FORMAT, SCALE, 1, 2, 1>();
    } else if (mt == 1 && nt == 4 && wn == 1) {
        *launch = glmrt_mma_launch_of<FORMAT, SCALE, 1, 4, 1>();
    } else if (mt == 2 && nt == 4 && wn == 1) {
        *launch = glmrt_mma_launch_of<FORMAT, SCALE, 2, 4, 1>();
    } else if (mt == 2 && nt == 4 && wn == 2) {
        *launch = glmrt_mma_launch_of<FORMAT, SCALE, 2, 4, 2>();
    } else if (mt == 4 && nt == 4 && wn == 2) {
        *launch = glmrt_mma_launch_of<FORMAT, SCALE, 4, 4, 2>();
    } else {
        return 0;
    }
    return 1;
}

static int glmrt_mma_pick(const glmrt_cuda_matrix *w, int32_t mt, int32_t nt, int32_t wn, glmrt_mma_launch *launch)
{
    if (w->format == GLMRT_CUDA_FORMAT_FP8 && w->scale_kind == GLMRT_CUDA_SCALE_CHANNEL) {
        return glmrt_mma_pick_shape<GLMRT_CUDA_FORMAT_FP8, GLMRT_CUDA_SCALE_CHANNEL>(mt, nt, wn, launch);
    }
    if (w->format == GLMRT_CUDA_FORMAT_FP8 && w->scale_kind == GLMRT_CUDA_SCALE_BLOCK) {
        return glmrt_mma_pick_shape<GLMRT_CUDA_FORMAT_FP8, GLMRT_CUDA_SCALE_BLOCK>(mt, nt, wn, launch);
    }
    if (w->format == GLMRT_CUDA_FORMAT_BF16 && w->scale_kind == GLMRT_CUDA_SCALE_NONE) {
        return glmrt_mma_pick_shape<GLMRT_CUDA_FORMAT_BF16, GLMRT_CUDA_SCALE_NONE>(mt, nt, wn, launch);
    }
    return 0;
}

static int64_t glmrt_mma_blocks(int32_t rows, int32_t block_n, int32_t row_tiles)
{
    return (int64_t)glmrt_ceil_div(rows, block_n) * row_tiles;
}

static void glmrt_mma_choose_width(int32_t mt, int32_t rows, int32_t row_tiles, int32_t *nt, int32_t *wn)
{
    *nt = 4;
    *wn = mt == 4 ? 2 : 1;
    if (mt == 1 && glmrt_mma_blocks(rows, 32, row_tiles) < GLMRT_MMA_WIDE_GRID) {
        *nt = 2;
    }
    if (mt == 2 && glmrt_mma_blocks(rows, 64, row_tiles) >= GLMRT_MMA_WIDE_GRID) {
        *wn = 2;
    }
}

static glmrt_status glmrt_mma_allow_shared(const glmrt_mma_launch *launch, glmrt_error *error)
{
    int device = 0;
    GLMRT_CUDA_TRY(error, cudaGetDevice(&device));
    uint64_t bit = device >= 0 && device < 64 ? 1ull << device : 0ull;
    if (bit != 0 && (launch->configured_devices->load(std::memory_order_acquire) & bit) != 0) {
        return GLMRT_OK;
    }
    GLMRT_CUDA_TRY(error, cudaFuncSetAttribute(launch->kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               launch->smem_bytes));
    GLMRT_CUDA_TRY(error, cudaFuncSetAttribute(launch->kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                               (int)cudaSharedmemCarveoutMaxShared));
    launch->configured_devices->fetch_or(bit, std::memory_order_release);
    return GLMRT_OK;
}

int glmrt_cuda_gemm_mma_supports(const glmrt_cuda_matrix *w)
{
    glmrt_mma_launch launch;
    return w->cols % GLMRT_MMA_CHUNK == 0 && glmrt_mma_pick(w, 1, 4, 1, &launch) &&
           (w->scale_kind != GLMRT_CUDA_SCALE_BLOCK || (w->block_cols % GLMRT_MMA_CHUNK == 0 && w->block_rows > 0));
}

int32_t glmrt_cuda_gemm_mma_block_rows(int32_t tile_rows)
{
    if (tile_rows <= 16) {
        return 16;
    }
    return tile_rows <= 32 ? 32 : GLMRT_GEMM_MMA_MAX_TILE_ROWS;
}

glmrt_status glmrt_cuda_gemm_mma_run_shape(const glmrt_cuda_gemm_args *args, int32_t mt, int32_t nt, int32_t wn,
                                           int32_t grid_tiles, cudaStream_t stream, glmrt_error *error)
{
    if (args->tiles == nullptr) {
        grid_tiles = glmrt_ceil_div(args->num_rows, 16 * mt);
    }
    if (grid_tiles <= 0) {
        return GLMRT_OK;
    }
    glmrt_mma_launch launch;
    if (!glmrt_mma_pick(&args->w, mt, nt, wn, &launch)) {
        return glmrt_error_set(error, GLMRT_ERR_INVARIANT,
                               "no tensor-core GEMM for format %d, scale %d in tiles of %dx%d with %d column groups",
                               args->w.format, args->w.scale_kind, 16 * mt, 8 * nt * wn, wn);
    }
    if (((uintptr_t)args->x & 15u) != 0 || args->x_stride % 4 != 0) {
        return glmrt_error_set(error, GLMRT_ERR_INVARIANT,
                               "GEMM activations must start on 16 bytes with a row stride that is a multiple of 4");
    }
    GLMRT_TRY(glmrt_mma_allow_shared(&launch, error));
    dim3 grid((unsigned)grid_tiles, (unsigned)glmrt_ceil_div(args->w.rows, launch.block_n));
    glmrt_dependent_launch dependent;
    const cudaLaunchConfig_t *config = glmrt_dependent_config(&dependent, grid, launch.threads, launch.smem_bytes,
                                                              stream);
    GLMRT_CUDA_TRY(error, cudaLaunchKernelEx(config, launch.kernel, *args));
    return GLMRT_OK;
}

glmrt_status glmrt_cuda_gemm_mma_run(const glmrt_cuda_gemm_args *args, int32_t tile_rows, int32_t grid_tiles,
                                     cudaStream_t stream, glmrt_error *error)
{
    if (tile_rows < 1 || tile_rows > GLMRT_GEMM_MMA_MAX_TILE_ROWS) {
        return glmrt_error_set(error, GLMRT_ERR_INVARIANT, "GEMM tiles of %d rows; the tensor-core GEMM takes 1 to %d",
                               tile_rows, GLMRT_GEMM_MMA_MAX_TILE_ROWS);
    }
    const int32_t block_rows = glmrt_cuda_gemm_mma_block_rows(tile_rows);
    const int32_t mt = block_rows / 16;
    const int32_t row_tiles = args->tiles == nullptr ? glmrt_ceil_div(args->num_rows, block_rows) : grid_tiles;
    int32_t nt;
    int32_t wn;
    glmrt_mma_choose_width(mt, args->w.rows, row_tiles, &nt, &wn);
    return glmrt_cuda_gemm_mma_run_shape(args, mt, nt, wn, row_tiles, stream, error);
}
