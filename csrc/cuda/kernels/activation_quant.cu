#include "activation_quant.cuh"
#include "cuda_check.cuh"
#include "dependent_launch.cuh"

#define GLMRT_ACTIVATION_CACHED 12
#define GLMRT_QUANTIZE_THREADS 512
#define GLMRT_QUANTIZE_CACHED 6
#define GLMRT_QUANTIZE_BLOCKS_PER_SM 2
#define GLMRT_ROW_BLOCKS_PER_SM 8
#define GLMRT_ROW_THREADS 128
#define GLMRT_ROW_WARPS (GLMRT_ROW_THREADS / 32)
#define GLMRT_ROW_TEAMS 8
#define GLMRT_ROW_VECTORS 3
#define GLMRT_ROW_COLS (GLMRT_ROW_THREADS * 4 * GLMRT_ROW_VECTORS)

template <int OP>
__device__ __forceinline__ float4 glmrt_activation_values(const float *row, int32_t cols, int32_t col)
{
    const float4 first = *reinterpret_cast<const float4 *>(row + col);
    if (OP == GLMRT_ACTIVATION_COPY) {
        return first;
    }
    const float4 up = *reinterpret_cast<const float4 *>(row + cols + col);
    return make_float4(glmrt_silu_times(first.x, up.x), glmrt_silu_times(first.y, up.y),
                       glmrt_silu_times(first.z, up.z), glmrt_silu_times(first.w, up.w));
}

template <int OP, int COUNT>
__device__ __forceinline__ float glmrt_activation_load(float4 *cached, const float *row, int32_t cols, int32_t end,
                                                       int32_t first, int32_t stride)
{
    float amax = 0.0f;
#pragma unroll
    for (int k = 0; k < COUNT; ++k) {
        const int32_t c = first + k * stride;
        cached[k] = c < end ? glmrt_activation_values<OP>(row, cols, c) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        amax = glmrt_abs_max4(cached[k], amax);
    }
    return amax;
}

__device__ __forceinline__ int32_t glmrt_activation_rows_counted(int32_t num_rows, const int32_t *device_rows)
{
    return device_rows != nullptr ? min(*device_rows, num_rows) : num_rows;
}

__device__ __forceinline__ const float *glmrt_activation_source(const float *x, int64_t x_stride,
                                                               const int32_t *x_rows, int32_t r)
{
    const int64_t source = x_rows != nullptr ? x_rows[r] : r;
    return x + source * x_stride;
}

__device__ __forceinline__ const float *glmrt_activation_row(const float *x, int64_t x_stride, const int32_t *x_rows,
                                                            int32_t num_rows, const int32_t *device_rows, int32_t r)
{
    if (r >= glmrt_activation_rows_counted(num_rows, device_rows)) {
        return nullptr;
    }
    return glmrt_activation_source(x, x_stride, x_rows, r);
}

template <int OP, int KIND, int THREADS, int CACHED, int BLOCKS_PER_SM>
__global__ void __launch_bounds__(THREADS, BLOCKS_PER_SM)
    glmrt_activation_quantize_kernel(const float *x, int64_t x_stride, const int32_t *x_rows, int32_t num_rows,
                                     const int32_t *device_rows, uint8_t *out, float *out_scales, int32_t cols,
                                     int32_t slice_cols)
{
    glmrt_dependent_enter();
    __shared__ float warp_max[THREADS / 32];
    const int32_t r = (int32_t)blockIdx.x;
    const float *row = glmrt_activation_row(x, x_stride, x_rows, num_rows, device_rows, r);
    if (row == nullptr) {
        return;
    }
    const int32_t first = (int32_t)threadIdx.x * 4;
    const int32_t stride = THREADS * 4;
    const int32_t lo = (int32_t)blockIdx.y * slice_cols;
    const int32_t hi = min(cols, lo + slice_cols);
    float4 cached[CACHED];
    float amax = glmrt_activation_load<OP, CACHED>(cached, row, cols, cols, first, stride);
    float scale = 1.0f;
    if (KIND == GLMRT_OPERAND_FP8) {
        for (int32_t c = first + CACHED * stride; c < cols; c += stride) {
            amax = glmrt_abs_max4(glmrt_activation_values<OP>(row, cols, c), amax);
        }
        scale = glmrt_activation_scale(glmrt_activation_block_max(amax, warp_max));
    }
#pragma unroll
    for (int k = 0; k < CACHED; ++k) {
        const int32_t c = first + k * stride;
        if (c >= lo && c < hi) {
            glmrt_operand_store4<KIND>(out, cols, r, c / 4, cached[k], scale);
        }
    }
    for (int32_t c = first + CACHED * stride; c < hi; c += stride) {
        if (c >= lo) {
            glmrt_operand_store4<KIND>(out, cols, r, c / 4, glmrt_activation_values<OP>(row, cols, c), scale);
        }
    }
    if (KIND == GLMRT_OPERAND_FP8 && threadIdx.x == 0 && blockIdx.y == 0) {
        out_scales[r] = scale;
    }
}

__device__ __forceinline__ void glmrt_row_team_sync(int team)
{
    asm volatile("bar.sync %0, %1;\n" ::"r"(team + 1), "n"(GLMRT_ROW_THREADS) : "memory");
}

template <int KIND>
__device__ __forceinline__ float glmrt_row_team_scale(float amax, float (*team_max)[GLMRT_ROW_WARPS], int team,
                                                      int member)
{
    if (KIND != GLMRT_OPERAND_FP8) {
        return 1.0f;
    }
    const float warp_amax = glmrt_warp_max(amax);
    if ((member & 31) == 0) {
        team_max[team][member / 32] = warp_amax;
    }
    glmrt_row_team_sync(team);
    float row_max = 0.0f;
#pragma unroll
    for (int w = 0; w < GLMRT_ROW_WARPS; ++w) {
        row_max = fmaxf(row_max, team_max[team][w]);
    }
    return glmrt_activation_scale(row_max);
}

template <int OP, int KIND>
__global__ void __launch_bounds__(GLMRT_ROW_THREADS *GLMRT_ROW_TEAMS, 1)
    glmrt_activation_team_kernel(const float *x, int64_t x_stride, const int32_t *x_rows, int32_t num_rows,
                                 const int32_t *device_rows, uint8_t *out, float *out_scales, int32_t cols)
{
    glmrt_dependent_enter();
    __shared__ float team_max[2][GLMRT_ROW_TEAMS][GLMRT_ROW_WARPS];
    const int team = (int)threadIdx.x / GLMRT_ROW_THREADS;
    const int member = (int)threadIdx.x % GLMRT_ROW_THREADS;
    const int32_t rows = glmrt_activation_rows_counted(num_rows, device_rows);
    const int32_t first = member * 4;
    int parity = 0;
    for (int32_t r = team * (int32_t)gridDim.x + (int32_t)blockIdx.x; r < rows;
         r += (int32_t)gridDim.x * GLMRT_ROW_TEAMS, parity ^= 1) {
        float4 cached[GLMRT_ROW_VECTORS];
        const float amax = glmrt_activation_load<OP, GLMRT_ROW_VECTORS>(
            cached, glmrt_activation_source(x, x_stride, x_rows, r), cols, cols, first, GLMRT_ROW_THREADS * 4);
        const float scale = glmrt_row_team_scale<KIND>(amax, team_max[parity], team, member);
        if (KIND == GLMRT_OPERAND_FP8 && member == 0) {
            out_scales[r] = scale;
        }
#pragma unroll
        for (int k = 0; k < GLMRT_ROW_VECTORS; ++k) {
            const int32_t c = first + k * GLMRT_ROW_THREADS * 4;
            if (c < cols) {
                glmrt_operand_store4<KIND>(out, cols, r, c / 4, cached[k], scale);
            }
        }
    }
}

template <int OP, int KIND>
__global__ void __launch_bounds__(GLMRT_ACTIVATION_THREADS)
    glmrt_activation_cluster_kernel(const float *x, int64_t x_stride, const int32_t *x_rows, int32_t num_rows,
                                    const int32_t *device_rows, uint8_t *out, float *out_scales, int32_t cols,
                                    int32_t slice_cols)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    glmrt_dependent_enter();
    __shared__ float warp_max[GLMRT_ACTIVATION_THREADS / 32];
    __shared__ float slice_max;
    const int32_t r = (int32_t)blockIdx.y;
    const float *row = glmrt_activation_row(x, x_stride, x_rows, num_rows, device_rows, r);
    if (row == nullptr) {
        return;
    }
    const int32_t lo = (int32_t)blockIdx.x * slice_cols;
    const int32_t hi = min(cols, lo + slice_cols);
    const int32_t first = lo + (int32_t)threadIdx.x * 4;
    float4 cached[GLMRT_CLUSTER_VECTORS];
    const float amax =
        glmrt_activation_load<OP, GLMRT_CLUSTER_VECTORS>(cached, row, cols, hi, first, GLMRT_CLUSTER_VECTOR_STRIDE);
    const float scale = glmrt_activation_cluster_scale(amax, warp_max, &slice_max);
    glmrt_activation_cluster_store<KIND>(out, out_scales, cols, r, cached, first, hi, scale);
#endif
}

template <int OP, int THREADS, int CACHED, int BLOCKS_PER_SM>
static glmrt_status glmrt_activation_launch_blocks(const glmrt_cuda_activation_args *a, int32_t slice_cols,
                                                   cudaStream_t stream, glmrt_error *error)
{
    const glmrt_cuda_qgemm_operand *o = a->out;
    void (*kernel)(const float *, int64_t, const int32_t *, int32_t, const int32_t *, uint8_t *, float *, int32_t,
                   int32_t) =
        o->kind == GLMRT_OPERAND_FP8
            ? glmrt_activation_quantize_kernel<OP, GLMRT_OPERAND_FP8, THREADS, CACHED, BLOCKS_PER_SM>
            : glmrt_activation_quantize_kernel<OP, GLMRT_OPERAND_BF16, THREADS, CACHED, BLOCKS_PER_SM>;
    dim3 grid((unsigned)a->num_rows, (unsigned)glmrt_ceil_div(o->cols, slice_cols));
    glmrt_dependent_launch dependent;
    const cudaLaunchConfig_t *config = glmrt_dependent_config(&dependent, grid, THREADS, 0, stream);
    GLMRT_CUDA_TRY(error, cudaLaunchKernelEx(config, kernel, a->x, a->x_stride, a->x_rows, a->num_rows, a->device_rows,
                                             o->data, o->scales, o->cols, slice_cols));
    return GLMRT_OK;
}

static int32_t glmrt_activation_team_blocks(int32_t num_rows, int32_t sms)
{
    const int32_t wanted = glmrt_ceil_div(num_rows, GLMRT_ROW_TEAMS);
    const int32_t half = (sms + 1) / 2;
    return wanted < half ? wanted : half;
}

template <int OP>
static glmrt_status glmrt_activation_launch_teams(const glmrt_cuda_activation_args *a, int32_t sms,
                                                  cudaStream_t stream, glmrt_error *error)
{
    const glmrt_cuda_qgemm_operand *o = a->out;
    if (o->cols > GLMRT_ROW_COLS) {
        return glmrt_error_set(error, GLMRT_ERR_INVARIANT,
                               "the rounding teams take rows of at most %d columns, got %d", GLMRT_ROW_COLS, o->cols);
    }
    void (*kernel)(const float *, int64_t, const int32_t *, int32_t, const int32_t *, uint8_t *, float *, int32_t) =
        o->kind == GLMRT_OPERAND_FP8 ? glmrt_activation_team_kernel<OP, GLMRT_OPERAND_FP8>
                                     : glmrt_activation_team_kernel<OP, GLMRT_OPERAND_BF16>;
    glmrt_dependent_launch dependent;
    const cudaLaunchConfig_t *config =
        glmrt_dependent_config(&dependent, (unsigned)glmrt_activation_team_blocks(a->num_rows, sms),
                               GLMRT_ROW_THREADS * GLMRT_ROW_TEAMS, 0, stream);
    GLMRT_CUDA_TRY(error, cudaLaunchKernelEx(config, kernel, a->x, a->x_stride, a->x_rows, a->num_rows, a->device_rows,
                                             o->data, o->scales, o->cols));
    return GLMRT_OK;
}

template <int OP>
static glmrt_status glmrt_activation_launch_cluster(const glmrt_cuda_activation_args *a, int32_t blocks,
                                                    cudaStream_t stream, glmrt_error *error)
{
    const glmrt_cuda_qgemm_operand *o = a->out;
    const int32_t slice_cols = glmrt_cuda_activation_cluster_slice_cols(o->cols, blocks);
    dim3 grid((unsigned)blocks, (unsigned)a->num_rows);
    glmrt_dependent_launch dependent;
    const cudaLaunchConfig_t *config = glmrt_dependent_cluster_config(&dependent, grid, GLMRT_ACTIVATION_THREADS, 0,
                                                                      stream, (unsigned)blocks);
    GLMRT_CUDA_TRY(error, cudaLaunchKernelEx(config, glmrt_activation_cluster_kernel<OP, GLMRT_OPERAND_FP8>, a->x,
                                             a->x_stride, a->x_rows, a->num_rows, a->device_rows, o->data, o->scales,
                                             o->cols, slice_cols));
    return GLMRT_OK;
}

static int32_t glmrt_activation_slice_cols(int32_t rows, int32_t cols, int32_t sms)
{
    int32_t slices = glmrt_ceil_div(2 * sms, rows);
    int32_t most = glmrt_ceil_div(cols, GLMRT_ACTIVATION_THREADS * 4);
    slices = slices < 1 ? 1 : (slices > most ? most : slices);
    return glmrt_ceil_div(glmrt_ceil_div(cols, slices), 4) * 4;
}

static int glmrt_activation_rows_by_teams(int32_t num_rows, int32_t cols, int32_t sms)
{
    return cols <= GLMRT_ROW_COLS && num_rows >= 2 * sms;
}

int32_t glmrt_cuda_activation_cluster_blocks(int32_t num_rows, int32_t cols, int32_t kind, int32_t sms)
{
    if (glmrt_activation_rows_by_teams(num_rows, cols, sms)) {
        return 0;
    }
    const int32_t slices = glmrt_ceil_div(cols, glmrt_activation_slice_cols(num_rows, cols, sms));
    if (kind != GLMRT_OPERAND_FP8 || slices <= 1 || cols > GLMRT_CLUSTER_BLOCKS * GLMRT_CLUSTER_BLOCK_COLS) {
        return 0;
    }
    const int32_t blocks = glmrt_ceil_div(cols, GLMRT_ACTIVATION_THREADS * 4);
    return blocks < GLMRT_CLUSTER_BLOCKS ? blocks : GLMRT_CLUSTER_BLOCKS;
}

int32_t glmrt_cuda_activation_cluster_slice_cols(int32_t cols, int32_t blocks)
{
    return glmrt_ceil_div(glmrt_ceil_div(cols, blocks), 4) * 4;
}

template <int OP>
static glmrt_status glmrt_activation_launch(const glmrt_cuda_activation_args *a, cudaStream_t stream,
                                            glmrt_error *error)
{
    const glmrt_cuda_qgemm_operand *o = a->out;
    int32_t sms = 0;
    GLMRT_TRY(glmrt_cuda_current_sms(&sms, error));
    if (glmrt_activation_rows_by_teams(a->num_rows, o->cols, sms)) {
        if (a->num_rows <= GLMRT_ROW_TEAMS * sms) {
            return glmrt_activation_launch_teams<OP>(a, sms, stream, error);
        }
        return glmrt_activation_launch_blocks<OP, GLMRT_ROW_THREADS, GLMRT_ROW_VECTORS, GLMRT_ROW_BLOCKS_PER_SM>(
            a, o->cols, stream, error);
    }
    const int32_t blocks = glmrt_cuda_activation_cluster_blocks(a->num_rows, o->cols, o->kind, sms);
    if (blocks > 0) {
        return glmrt_activation_launch_cluster<OP>(a, blocks, stream, error);
    }
    return glmrt_activation_launch_blocks<OP, GLMRT_QUANTIZE_THREADS, GLMRT_QUANTIZE_CACHED,
                                          GLMRT_QUANTIZE_BLOCKS_PER_SM>(
        a, glmrt_activation_slice_cols(a->num_rows, o->cols, sms), stream, error);
}

glmrt_status glmrt_cuda_activation_quantize(const glmrt_cuda_activation_args *args, cudaStream_t stream,
                                            glmrt_error *error)
{
    if (args->num_rows <= 0) {
        return GLMRT_OK;
    }
    const glmrt_cuda_qgemm_operand *o = args->out;
    if (args->num_rows > o->capacity_rows || o->cols % 4 != 0 || ((uintptr_t)args->x & 15u) != 0 ||
        args->x_stride % 4 != 0) {
        return glmrt_error_set(error, GLMRT_ERR_INVARIANT,
                               "activation quantization of %d rows of %d columns into a buffer of %d rows needs 16-byte aligned rows",
                               args->num_rows, o->cols, o->capacity_rows);
    }
    if (args->op == GLMRT_ACTIVATION_SILU_MUL) {
        return glmrt_activation_launch<GLMRT_ACTIVATION_SILU_MUL>(args, stream, error);
    }
    return glmrt_activation_launch<GLMRT_ACTIVATION_COPY>(args, stream, error);
}

#define GLMRT_GATHER_THREADS 128

__global__ void __launch_bounds__(GLMRT_GATHER_THREADS)
    glmrt_operand_gather_kernel(const uint8_t *source, const float *source_scales, const int32_t *source_rows,
                                int32_t num_rows, const int32_t *device_rows, uint8_t *out, float *out_scales,
                                int64_t row_bytes)
{
    glmrt_dependent_enter();
    const int32_t rows = device_rows != nullptr ? min(*device_rows, num_rows) : num_rows;
    const int32_t r = (int32_t)blockIdx.x;
    if (r >= rows) {
        return;
    }
    const int64_t from = source_rows[r];
    const uint4 *in = reinterpret_cast<const uint4 *>(source + from * row_bytes);
    uint4 *to = reinterpret_cast<uint4 *>(out + (int64_t)r * row_bytes);
    const int32_t chunks = (int32_t)(row_bytes / 16);
    for (int32_t i = (int32_t)threadIdx.x; i < chunks; i += GLMRT_GATHER_THREADS) {
        to[i] = __ldg(in + i);
    }
    if (threadIdx.x == 0 && out_scales != nullptr) {
        out_scales[r] = source_scales[from];
    }
}

int glmrt_cuda_operand_gather_supported(const glmrt_cuda_qgemm_operand *source, const glmrt_cuda_qgemm_operand *out)
{
    return source != nullptr && out != nullptr && source->kind == out->kind && source->cols == out->cols &&
           ((int64_t)source->cols * glmrt_operand_bytes(source->kind)) % 16 == 0 &&
           ((uintptr_t)source->data & 15u) == 0 && ((uintptr_t)out->data & 15u) == 0;
}

glmrt_status glmrt_cuda_operand_gather(const glmrt_cuda_operand_gather_args *args, cudaStream_t stream,
                                       glmrt_error *error)
{
    if (args->num_rows <= 0) {
        return GLMRT_OK;
    }
    const glmrt_cuda_qgemm_operand *source = args->source;
    const glmrt_cuda_qgemm_operand *out = args->out;
    if (!glmrt_cuda_operand_gather_supported(source, out) || args->num_rows > out->capacity_rows ||
        args->source_rows == nullptr) {
        return glmrt_error_set(error, GLMRT_ERR_INVARIANT,
                               "gathering %d rounded rows needs two operands of one kind and width with 16-byte rows, "
                               "room for the rows and their source indices",
                               args->num_rows);
    }
    const int64_t row_bytes = (int64_t)source->cols * glmrt_operand_bytes(source->kind);
    const bool scaled = source->kind == GLMRT_OPERAND_FP8;
    glmrt_dependent_launch dependent;
    const cudaLaunchConfig_t *config = glmrt_dependent_config(&dependent, args->num_rows, GLMRT_GATHER_THREADS, 0,
                                                              stream);
    GLMRT_CUDA_TRY(error, cudaLaunchKernelEx(config, glmrt_operand_gather_kernel, source->data,
                                             scaled ? source->scales : nullptr, args->source_rows, args->num_rows,
                                             args->device_rows, out->data, scaled ? out->scales : nullptr, row_bytes));
    return GLMRT_OK;
}
