#include <atomic>

#include "cuda_check.cuh"
#include "device_math.cuh"
#include "gemm_kernels.cuh"
#include "gemm_mma_ops.cuh"

#define GLMRT_MMA_K_WARPS 4
#define GLMRT_MMA_NT 4
#define GLMRT_MMA_CHUNK 32
#define GLMRT_MMA_BK (GLMRT_MMA_K_WARPS * GLMRT_MMA_CHUNK)
#define GLMRT_MMA_A_ROW_BYTES 320
#define GLMRT_MMA_DEFAULT_SHARED 49152

template <int FORMAT, int MT, int WN>
struct glmrt_mma_shape {
    static constexpr int threads = 32 * GLMRT_MMA_K_WARPS * WN;
    static constexpr int weight_bytes = FORMAT == GLMRT_CUDA_FORMAT_FP8 ? 1 : 2;
    static constexpr int block_m = 16 * MT;
    static constexpr int block_n = 8 * GLMRT_MMA_NT * WN;
    static constexpr int b_row_data = GLMRT_MMA_BK * weight_bytes;
    static constexpr int b_row_bytes = b_row_data + (weight_bytes == 1 ? 32 : 64);
    static constexpr int b_row_pieces = b_row_data / 16;
    static constexpr int b_pieces_per_thread = block_n * b_row_pieces / threads;
    static constexpr int stages = WN == 1 ? 6 : 4;
    static constexpr int b_stage_bytes = block_n * b_row_bytes;
    static constexpr int a_bytes = block_m * GLMRT_MMA_A_ROW_BYTES;
    static constexpr int a_groups_per_row = GLMRT_MMA_BK / 8;
    static constexpr int a_units_per_thread = block_m * a_groups_per_row / threads;
    static constexpr int a_rows_per_pass = threads / a_groups_per_row;
    static constexpr int acc_values = MT * GLMRT_MMA_NT * 4;
    static constexpr int combine_bytes = (GLMRT_MMA_K_WARPS - 1) * WN * acc_values * 32 * 4;
    static constexpr int pipeline_bytes = 2 * a_bytes + stages * b_stage_bytes;
    static constexpr int smem_bytes = pipeline_bytes > combine_bytes ? pipeline_bytes : combine_bytes;
    static_assert(block_n * b_row_pieces % threads == 0, "weight pieces must spread evenly over the threads");
    static_assert(block_m * a_groups_per_row % threads == 0, "activation groups must spread evenly over the threads");
    static_assert(a_units_per_thread <= 4, "activation prefetch must stay within 32 registers");
};

template <int FORMAT, int MT, int WN>
struct glmrt_mma_weight_loader {
    typedef glmrt_mma_shape<FORMAT, MT, WN> shape;
    const uint8_t *source[shape::b_pieces_per_thread];
    int32_t target[shape::b_pieces_per_thread];
    int32_t first_col[shape::b_pieces_per_thread];

    __device__ __forceinline__ void init(const uint8_t *data, int64_t row_bytes, int32_t n_block, int32_t rows)
    {
#pragma unroll
        for (int p = 0; p < shape::b_pieces_per_thread; ++p) {
            int32_t piece = (int32_t)threadIdx.x + p * shape::threads;
            int32_t row = piece / shape::b_row_pieces;
            int32_t part = piece % shape::b_row_pieces;
            int32_t n = min(n_block + row, rows - 1);
            source[p] = data + (int64_t)n * row_bytes + part * 16;
            target[p] = row * shape::b_row_bytes + part * 16;
            first_col[p] = part * 16 / shape::weight_bytes;
        }
    }

    __device__ __forceinline__ void issue(uint8_t *stage, int32_t k_tile, int32_t cols) const
    {
        const int32_t k_base = k_tile * GLMRT_MMA_BK;
#pragma unroll
        for (int p = 0; p < shape::b_pieces_per_thread; ++p) {
            if (k_base + first_col[p] < cols) {
                glmrt_cp_async_16(stage + target[p], source[p] + (int64_t)k_base * shape::weight_bytes);
            }
        }
    }
};

template <int FORMAT, int MT, int WN>
struct glmrt_mma_activation_loader {
    typedef glmrt_mma_shape<FORMAT, MT, WN> shape;
    const float *source[shape::a_units_per_thread];
    float4 next[shape::a_units_per_thread][2];
    int32_t offset[shape::a_units_per_thread];
    int32_t first_col;

    __device__ __forceinline__ void init(const glmrt_cuda_gemm_args &args, int32_t row_begin, int32_t count)
    {
        const int32_t group_index = (int32_t)threadIdx.x % shape::a_groups_per_row;
        first_col = group_index * 8;
#pragma unroll
        for (int i = 0; i < shape::a_units_per_thread; ++i) {
            int32_t row = (int32_t)threadIdx.x / shape::a_groups_per_row + i * shape::a_rows_per_pass;
            offset[i] = row * GLMRT_MMA_A_ROW_BYTES + group_index * 16;
            source[i] = nullptr;
            if (row < count) {
                int64_t source_row = args.x_rows != nullptr ? args.x_rows[row_begin + row] : row_begin + row;
                source[i] = args.x + source_row * args.x_stride + first_col;
            }
        }
    }

    __device__ __forceinline__ void zero_absent_rows(uint8_t *high, uint8_t *low) const
    {
        const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
        for (int i = 0; i < shape::a_units_per_thread; ++i) {
            if (source[i] == nullptr) {
                *reinterpret_cast<uint4 *>(high + offset[i]) = zero;
                *reinterpret_cast<uint4 *>(low + offset[i]) = zero;
            }
        }
    }

    __device__ __forceinline__ void fetch(int32_t k_tile, int32_t cols)
    {
        const int32_t k_base = k_tile * GLMRT_MMA_BK;
#pragma unroll
        for (int i = 0; i < shape::a_units_per_thread; ++i) {
            next[i][0] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            next[i][1] = next[i][0];
            if (source[i] != nullptr && k_base + first_col < cols) {
                const float4 *at = reinterpret_cast<const float4 *>(source[i] + k_base);
                next[i][0] = __ldg(at);
                next[i][1] = __ldg(at + 1);
            }
        }
    }

    __device__ __forceinline__ void store(uint8_t *high, uint8_t *low) const
    {
#pragma unroll
        for (int i = 0; i < shape::a_units_per_thread; ++i) {
            if (source[i] == nullptr) {
                continue;
            }
            const float4 a = next[i][0];
            const float4 b = next[i][1];
            uint4 h;
            uint4 l;
            if (FORMAT == GLMRT_CUDA_FORMAT_FP8) {
                glmrt_split_bf16(a.x, a.z, h.x, l.x);
                glmrt_split_bf16(a.y, a.w, h.y, l.y);
                glmrt_split_bf16(b.x, b.z, h.z, l.z);
                glmrt_split_bf16(b.y, b.w, h.w, l.w);
            } else {
                glmrt_split_bf16(a.x, a.y, h.x, l.x);
                glmrt_split_bf16(a.z, a.w, h.y, l.y);
                glmrt_split_bf16(b.x, b.y, h.z, l.z);
                glmrt_split_bf16(b.z, b.w, h.w, l.w);
            }
            *reinterpret_cast<uint4 *>(high + offset[i]) = h;
            *reinterpret_cast<uint4 *>(low + offset[i]) = l;
        }
    }
};

template <int FORMAT>
__device__ __forceinline__ void glmrt_mma_weight_fragment(const uint8_t *row, int k_warp, int t, uint32_t *b)
{
    if (FORMAT == GLMRT_CUDA_FORMAT_FP8) {
        uint2 raw = *reinterpret_cast<const uint2 *>(row + k_warp * GLMRT_MMA_CHUNK + t * 8);
        glmrt_fp8x4_to_bf16_even_odd(raw.x, b[0], b[1]);
        glmrt_fp8x4_to_bf16_even_odd(raw.y, b[2], b[3]);
    } else {
        uint4 raw = *reinterpret_cast<const uint4 *>(row + (k_warp * GLMRT_MMA_CHUNK + t * 8) * 2);
        b[0] = raw.x;
        b[1] = raw.y;
        b[2] = raw.z;
        b[3] = raw.w;
    }
}

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

template <int FORMAT, int SCALE, int MT, int WN>
__global__ void __launch_bounds__(glmrt_mma_shape<FORMAT, MT, WN>::threads)
    glmrt_gemm_mma_kernel(glmrt_cuda_gemm_args args)
{
    typedef glmrt_mma_shape<FORMAT, MT, WN> shape;
    constexpr int NT = GLMRT_MMA_NT;
    extern __shared__ __align__(16) uint8_t glmrt_mma_shared[];
    uint8_t *a_high = glmrt_mma_shared;
    uint8_t *a_low = a_high + shape::a_bytes;
    uint8_t *b_stages = a_low + shape::a_bytes;
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

    glmrt_mma_weight_loader<FORMAT, MT, WN> weights;
    weights.init(data, (int64_t)cols * shape::weight_bytes, n_block, rows);
    glmrt_mma_activation_loader<FORMAT, MT, WN> activations;
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
            weights.issue(b_stages + s * shape::b_stage_bytes, s, cols);
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
            weights.issue(b_stages + (ahead % shape::stages) * shape::b_stage_bytes, ahead, cols);
        }
        glmrt_cp_async_commit();
        if (kt + 1 < k_tiles) {
            activations.fetch(kt + 1, cols);
        }
        const int32_t k0 = kt * GLMRT_MMA_BK + k_warp * GLMRT_MMA_CHUNK;
        if (k0 < cols) {
            const uint8_t *stage = b_stages + (kt % shape::stages) * shape::b_stage_bytes;
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

template <int FORMAT, int SCALE, int MT, int WN>
static glmrt_mma_launch glmrt_mma_launch_of()
{
    typedef glmrt_mma_shape<FORMAT, MT, WN> shape;
    static std::atomic<uint64_t> configured_devices(0);
    glmrt_mma_launch launch;
    launch.kernel = glmrt_gemm_mma_kernel<FORMAT, SCALE, MT, WN>;
    launch.block_m = shape::block_m;
    launch.block_n = shape::block_n;
    launch.threads = shape::threads;
    launch.smem_bytes = shape::smem_bytes;
    launch.configured_devices = &configured_devices;
    return launch;
}

template <int FORMAT, int SCALE>
static int glmrt_mma_pick_shape(int32_t mt, int32_t wn, glmrt_mma_launch *launch)
{
    if (mt == 1 && wn == 1) {
        *launch = glmrt_mma_launch_of<FORMAT, SCALE, 1, 1>();
    } else if (mt == 2 && wn == 1) {
        *launch = glmrt_mma_launch_of<FORMAT, SCALE, 2, 1>();
    } else if (mt == 4 && wn == 2) {
        *launch = glmrt_mma_launch_of<FORMAT, SCALE, 4, 2>();
    } else {
        return 0;
    }
    return 1;
}

static int glmrt_mma_pick(const glmrt_cuda_matrix *w, int32_t mt, int32_t wn, glmrt_mma_launch *launch)
{
    if (w->format == GLMRT_CUDA_FORMAT_FP8 && w->scale_kind == GLMRT_CUDA_SCALE_CHANNEL) {
        return glmrt_mma_pick_shape<GLMRT_CUDA_FORMAT_FP8, GLMRT_CUDA_SCALE_CHANNEL>(mt, wn, launch);
    }
    if (w->format == GLMRT_CUDA_FORMAT_FP8 && w->scale_kind == GLMRT_CUDA_SCALE_BLOCK) {
        return glmrt_mma_pick_shape<GLMRT_CUDA_FORMAT_FP8, GLMRT_CUDA_SCALE_BLOCK>(mt, wn, launch);
    }
    if (w->format == GLMRT_CUDA_FORMAT_BF16 && w->scale_kind == GLMRT_CUDA_SCALE_NONE) {
        return glmrt_mma_pick_shape<GLMRT_CUDA_FORMAT_BF16, GLMRT_CUDA_SCALE_NONE>(mt, wn, launch);
    }
    return 0;
}

static glmrt_status glmrt_mma_allow_shared(const glmrt_mma_launch *launch, glmrt_error *error)
{
    if (launch->smem_bytes <= GLMRT_MMA_DEFAULT_SHARED) {
        return GLMRT_OK;
    }
    int device = 0;
    GLMRT_CUDA_TRY(error, cudaGetDevice(&device));
    uint64_t bit = device >= 0 && device < 64 ? 1ull << device : 0ull;
    if (bit != 0 && (launch->configured_devices->load(std::memory_order_acquire) & bit) != 0) {
        return GLMRT_OK;
    }
    GLMRT_CUDA_TRY(error, cudaFuncSetAttribute(launch->kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               launch->smem_bytes));
    launch->configured_devices->fetch_or(bit, std::memory_order_release);
    return GLMRT_OK;
}

int glmrt_cuda_gemm_mma_supports(const glmrt_cuda_matrix *w)
{
    glmrt_mma_launch launch;
    return w->cols % GLMRT_MMA_CHUNK == 0 && glmrt_mma_pick(w, 1, 1, &launch) &&
           (w->scale_kind != GLMRT_CUDA_SCALE_BLOCK || (w->block_cols % GLMRT_MMA_CHUNK == 0 && w->block_rows > 0));
}

int32_t glmrt_cuda_gemm_mma_block_rows(int32_t num_rows)
{
    if (num_rows <= 16) {
        return 16;
    }
    return num_rows <= 32 ? 32 : GLMRT_GEMM_MMA_MAX_TILE_ROWS;
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
    if (args->tiles == nullptr) {
        grid_tiles = glmrt_ceil_div(args->num_rows, block_rows);
    }
    if (grid_tiles <= 0) {
        return GLMRT_OK;
    }
    glmrt_mma_launch launch;
    if (!glmrt_mma_pick(&args->w, mt, mt == 4 ? 2 : 1, &launch)) {
        return glmrt_error_set(error, GLMRT_ERR_INVARIANT, "no tensor-core GEMM for format %d, scale %d, %d rows a tile",
                               args->w.format, args->w.scale_kind, tile_rows);
    }
    if (((uintptr_t)args->x & 15u) != 0 || args->x_stride % 4 != 0) {
        return glmrt_error_set(error, GLMRT_ERR_INVARIANT,
                               "GEMM activations must start on 16 bytes with a row stride that is a multiple of 4");
    }
    GLMRT_TRY(glmrt_mma_allow_shared(&launch, error));
    dim3 grid((unsigned)grid_tiles, (unsigned)glmrt_ceil_div(args->w.rows, launch.block_n));
    launch.kernel<<<grid, launch.threads, launch.smem_bytes, stream>>>(*args);
    GLMRT_CUDA_LAUNCHED(error, "glmrt_gemm_mma_kernel");
    return GLMRT_OK;
}
