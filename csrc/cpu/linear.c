#include "linear.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fp8.h"
#include "number_formats.h"

#define GLMRT_KERNEL_BLOCK 4

typedef struct linear_block {
    const float *x[GLMRT_KERNEL_BLOCK];
    const float *w[GLMRT_KERNEL_BLOCK];
    float out[GLMRT_KERNEL_BLOCK][GLMRT_KERNEL_BLOCK];
} linear_block;

static int linear_dtype_supported(glmrt_dtype dtype)
{
    return dtype == GLMRT_DTYPE_F32 || dtype == GLMRT_DTYPE_BF16 || dtype == GLMRT_DTYPE_F16 ||
           dtype == GLMRT_DTYPE_F8_E4M3;
}

static int linear_scale_dtype_supported(glmrt_dtype dtype)
{
    return dtype == GLMRT_DTYPE_F32 || dtype == GLMRT_DTYPE_BF16 || dtype == GLMRT_DTYPE_F16;
}

static glmrt_status linear_validate_scale(const glmrt_linear *weight, const char *role, glmrt_error *error)
{
    if (weight->scale == NULL || !linear_scale_dtype_supported(weight->scale_dtype)) {
        return glmrt_error_set(error, GLMRT_ERR_FORMAT, "%s: FP8 weight without a usable scale (dtype %s)", role,
                               glmrt_dtype_name(weight->scale_dtype));
    }
    if (weight->quant == GLMRT_QUANT_FP8_CHANNEL) {
        if (weight->scale_cols != 1 || (weight->scale_rows != weight->rows && weight->scale_rows != 1)) {
            return glmrt_error_set(error, GLMRT_ERR_FORMAT, "%s: channel scale shape [%d, %d] for %d rows", role,
                                   (int)weight->scale_rows, (int)weight->scale_cols, (int)weight->rows);
        }
        return GLMRT_OK;
    }
    if (weight->quant != GLMRT_QUANT_FP8_BLOCK) {
        return glmrt_error_set(error, GLMRT_ERR_FORMAT, "%s: FP8 weight with quant mode %d", role,
                               (int)weight->quant);
    }
    if (weight->block_rows <= 0 || weight->block_cols <= 0) {
        return glmrt_error_set(error, GLMRT_ERR_FORMAT, "%s: block scale with block %dx%d", role,
                               (int)weight->block_rows, (int)weight->block_cols);
    }
    int64_t need_rows = ((int64_t)weight->rows + weight->block_rows - 1) / weight->block_rows;
    int64_t need_cols = ((int64_t)weight->cols + weight->block_cols - 1) / weight->block_cols;
    if (weight->scale_rows < need_rows || weight->scale_cols < need_cols) {
        return glmrt_error_set(error, GLMRT_ERR_FORMAT, "%s: block scale [%d, %d] too small for [%d, %d] in %dx%d",
                               role, (int)weight->scale_rows, (int)weight->scale_cols, (int)weight->rows,
                               (int)weight->cols, (int)weight->block_rows, (int)weight->block_cols);
    }
    return GLMRT_OK;
}

glmrt_status glmrt_linear_validate(const glmrt_linear *weight, int32_t rows, int32_t cols, const char *role,
                                   glmrt_error *error)
{
    if (weight == NULL || weight->data == NULL) {
        return glmrt_error_set(error, GLMRT_ERR_MISSING_TENSOR, "%s: weight is missing", role);
    }
    if (weight->rows != rows || weight->cols != cols) {
        return glmrt_error_set(error, GLMRT_ERR_FORMAT, "%s: shape [%d, %d], expected [%d, %d]", role,
                               (int)weight->rows, (int)weight->cols, (int)rows, (int)cols);
    }
    if (!linear_dtype_supported(weight->dtype)) {
        return glmrt_error_set(error, GLMRT_ERR_UNSUPPORTED, "%s: weight dtype %s is not supported", role,
                               glmrt_dtype_name(weight->dtype));
    }
    if (weight->dtype == GLMRT_DTYPE_F8_E4M3) {
        return linear_validate_scale(weight, role, error);
    }
    if (weight->quant != GLMRT_QUANT_NONE) {
        return glmrt_error_set(error, GLMRT_ERR_FORMAT, "%s: quant mode %d on a %s weight", role, (int)weight->quant,
                               glmrt_dtype_name(weight->dtype));
    }
    return GLMRT_OK;
}

static float linear_scale_at(const glmrt_linear *weight, int64_t index)
{
    const uint8_t *at = weight->scale;
    if (weight->scale_dtype == GLMRT_DTYPE_F32) {
        float value;
        memcpy(&value, at + index * 4, sizeof(value));
        return value;
    }
    uint16_t bits;
    memcpy(&bits, at + index * 2, sizeof(bits));
    return weight->scale_dtype == GLMRT_DTYPE_BF16 ? glmrt_bf16_to_float(bits) : glmrt_f16_to_float(bits);
}

static void dequant_fp8_span(const uint8_t *src, float scale, int32_t n, float *out)
{
    const float exponent_shift = 0x1p120f;
    for (int32_t k = 0; k < n; ++k) {
        uint32_t byte = src[k];
        float magnitude = glmrt_bits_to_float(((byte & 0x80u) << 24) | ((byte & 0x7fu) << 20));
        float value = magnitude * exponent_shift * scale;
        out[k] = (byte & 0x7fu) == 0x7fu ? NAN : value;
    }
}

static void dequant_bf16_span(const uint8_t *src, int32_t n, float *out)
{
    for (int32_t k = 0; k < n; ++k) {
        uint16_t bits;
        memcpy(&bits, src + (int64_t)k * 2, sizeof(bits));
        out[k] = glmrt_bf16_decode(bits);
    }
}

static void dequant_fp8_row(const glmrt_linear *weight, int32_t row, float *out)
{
    const uint8_t *src = weight->data + (int64_t)row * weight->cols;
    if (weight->quant == GLMRT_QUANT_FP8_CHANNEL) {
        float scale = linear_scale_at(weight, weight->scale_rows == 1 ? 0 : row);
        dequant_fp8_span(src, scale, weight->cols, out);
        return;
    }
    int64_t scale_row = (int64_t)(row / weight->block_rows) * weight->scale_cols;
    for (int32_t col = 0; col < weight->cols; col += weight->block_cols) {
        int32_t span = weight->cols - col < weight->block_cols ? weight->cols - col : weight->block_cols;
        float scale = linear_scale_at(weight, scale_row + col / weight->block_cols);
        dequant_fp8_span(src + col, scale, span, out + col);
    }
}

void glmrt_linear_dequant_row(const glmrt_linear *weight, int32_t row, float *out)
{
    int64_t cols = weight->cols;
    switch (weight->dtype) {
    case GLMRT_DTYPE_F32:
        memcpy(out, weight->data + (int64_t)row * cols * 4, (size_t)cols * sizeof(float));
        break;
    case GLMRT_DTYPE_BF16:
        dequant_bf16_span(weight->data + (int64_t)row * cols * 2, weight->cols, out);
        break;
    case GLMRT_DTYPE_F16: {
        const uint8_t *src = weight->data + (int64_t)row * cols * 2;
        for (int64_t k = 0; k < cols; ++k) {
            uint16_t bits;
            memcpy(&bits, src + k * 2, sizeof(bits));
            out[k] = glmrt_f16_to_float(bits);
        }
        break;
    }
    case GLMRT_DTYPE_F8_E4M3:
        dequant_fp8_row(weight, row, out);
        break;
    default:
        memset(out, 0, (size_t)cols * sizeof(float));
        break;
    }
}

int glmrt_linear_rounds_inputs(const glmrt_linear *weight)
{
    return weight->dtype == GLMRT_DTYPE_F8_E4M3 || weight->dtype == GLMRT_DTYPE_BF16;
}

void glmrt_round_bf16_span(const float *x, float *out, int32_t n)
{
    for (int32_t k = 0; k < n; ++k) {
        out[k] = glmrt_bf16_decode(glmrt_bf16_encode(x[k]));
    }
}

void glmrt_linear_round_row(const glmrt_linear *weight, const float *x, float *out, int32_t n)
{
    if (weight->dtype == GLMRT_DTYPE_BF16) {
        glmrt_round_bf16_span(x, out, n);
        return;
    }
    if (weight->dtype != GLMRT_DTYPE_F8_E4M3) {
        if (out != x) {
            memmove(out, x, (size_t)n * sizeof(float));
        }
        return;
    }
    float amax = 0.0f;
    for (int32_t k = 0; k < n; ++k) {
        amax = fmaxf(amax, fabsf(x[k]));
    }
    float scale = amax > 0.0f ? amax / GLMRT_FP8_E4M3_MAX : 1.0f;
    for (int32_t k = 0; k < n; ++k) {
        out[k] = glmrt_e4m3_decode(glmrt_e4m3_encode(x[k] / scale)) * scale;
    }
}

static inline float dot_lanes_combine(const float lanes[GLMRT_DOT_LANES])
{
    float half[8];
    for (int j = 0; j < 8; ++j) {
        half[j] = lanes[j] + lanes[j + 8];
    }
    float quarter[4];
    for (int j = 0; j < 4; ++j) {
        quarter[j] = half[j] + half[j + 4];
    }
    float pair0 = quarter[0] + quarter[2];
    float pair1 = quarter[1] + quarter[3];
    return pair0 + pair1;
}

static inline __attribute__((always_inline)) void dot_block_kernel(linear_block *block, int32_t n, const int mb,
                                                                   const int rb)
{
    const float *x[GLMRT_KERNEL_BLOCK];
    const float *w[GLMRT_KERNEL_BLOCK];
    for (int i = 0; i < mb; ++i) {
        x[i] = block->x[i];
    }
    for (int r = 0; r < rb; ++r) {
        w[r] = block->w[r];
    }
    float acc[GLMRT_KERNEL_BLOCK][GLMRT_KERNEL_BLOCK][GLMRT_DOT_LANES];
    for (int i = 0; i < mb; ++i) {
        for (int r = 0; r < rb; ++r) {
            for (int j = 0; j < GLMRT_DOT_LANES; ++j) {
                acc[i][r][j] = 0.0f;
            }
        }
    }
    int32_t k = 0;
    for (; k + GLMRT_DOT_LANES <= n; k += GLMRT_DOT_LANES) {
        for (int j = 0; j < GLMRT_DOT_LANES; ++j) {
#pragma GCC unroll 4
            for (int i = 0; i < mb; ++i) {
#pragma GCC unroll 4
                for (int r = 0; r < rb; ++r) {
                    acc[i][r][j] = fmaf(x[i][k + j], w[r][k + j], acc[i][r][j]);
                }
            }
        }
    }
    int32_t tail = n - k;
    for (int i = 0; i < mb; ++i) {
        for (int r = 0; r < rb; ++r) {
            for (int j = 0; j < tail; ++j) {
                acc[i][r][j] = fmaf(x[i][k + j], w[r][k + j], acc[i][r][j]);
            }
            block->out[i][r] = dot_lanes_combine(acc[i][r]);
        }
    }
}

static void dot_block_4x4(linear_block *block, int32_t n)
{
    dot_block_kernel(block, n, 4, 4);
}

static void dot_block_1x4(linear_block *block, int32_t n)
{
    dot_block_kernel(block, n, 1, 4);
}

static void dot_block_4x1(linear_block *block, int32_t n)
{
    dot_block_kernel(block, n, 4, 1);
}

static void dot_block_1x1(linear_block *block, int32_t n)
{
    dot_block_kernel(block, n, 1, 1);
}

float glmrt_dot(const float *a, const float *b, int32_t n)
{
    linear_block block;
    block.x[0] = a;
    block.w[0] = b;
    dot_block_1x1(&block, n);
    return block.out[0][0];
}

static void dot_block_run(linear_block *block, int32_t n, int mb, int rb)
{
    if (mb == 4 && rb == 4) {
        dot_block_4x4(block, n);
    } else if (mb == 1 && rb == 4) {
        dot_block_1x4(block, n);
    } else if (mb == 4 && rb == 1) {
        dot_block_4x1(block, n);
    } else {
        dot_block_1x1(block, n);
    }
}

static inline float silu_times(float gate, float up)
{
    return gate / (1.0f + expf(-gate)) * up;
}

typedef struct linear_tile {
    const glmrt_matmul_job *job;
    int32_t row_begin;
    int32_t num_tile_rows;
    const float *gate_tile;
    const float *up_tile;
} linear_tile;

static void linear_store_block(const linear_tile *tile, const linear_block *gate, const linear_block *up,
                               int32_t m0, int mb, int32_t r0, int rb)
{
    const glmrt_matmul_job *job = tile->job;
    for (int i = 0; i < mb; ++i) {
        int32_t m = m0 + i;
        int64_t out_row = job->y_row_ids != NULL ? job->y_row_ids[m] : m;
        float *y = job->y + out_row * job->y_stride + tile->row_begin + r0;
        for (int r = 0; r < rb; ++r) {
            float value = gate->out[i][r];
            if (job->bias != NULL) {
                value += job->bias[tile->row_begin + r0 + r];
            }
            if (up != NULL) {
                value = silu_times(value, up->out[i][r]);
            }
            y[r] = value;
        }
    }
}

static void linear_tile_rows(const linear_tile *tile, int32_t m0, int mb)
{
    const glmrt_matmul_job *job = tile->job;
    int32_t n = job->weight->cols;
    linear_block gate;
    linear_block up;
    for (int i = 0; i < mb; ++i) {
        int64_t in_row = job->x_row_ids != NULL ? job->x_row_ids[m0 + i] : m0 + i;
        gate.x[i] = job->x + in_row * job->x_stride;
        up.x[i] = gate.x[i];
    }
    for (int32_t r0 = 0; r0 < tile->num_tile_rows;) {
        int rb = tile->num_tile_rows - r0 >= GLMRT_KERNEL_BLOCK ? GLMRT_KERNEL_BLOCK : 1;
        for (int r = 0; r < rb; ++r) {
            gate.w[r] = tile->gate_tile + (int64_t)(r0 + r) * n;
            up.w[r] = tile->up_tile != NULL ? tile->up_tile + (int64_t)(r0 + r) * n : NULL;
        }
        dot_block_run(&gate, n, mb, rb);
        if (tile->up_tile != NULL) {
            dot_block_run(&up, n, mb, rb);
        }
        linear_store_block(tile, &gate, tile->up_tile != NULL ? &up : NULL, m0, mb, r0, rb);
        r0 += rb;
    }
}

static int32_t linear_find_job(const glmrt_linear_runner *runner, int64_t task)
{
    int32_t low = 0;
    int32_t high = runner->num_jobs - 1;
    while (low < high) {
        int32_t mid = (low + high + 1) / 2;
        if (runner->job_first_task[mid] <= task) {
            low = mid;
        } else {
            high = mid - 1;
        }
    }
    return low;
}

static void linear_task(void *context, int32_t task, int32_t thread_index)
{
    glmrt_linear_runner *runner = context;
    int32_t job_index = linear_find_job(runner, task);
    const glmrt_matmul_job *job = &runner->jobs[job_index];
    int32_t n = job->weight->cols;
    linear_tile tile;
    tile.job = job;
    tile.row_begin = (int32_t)(task - runner->job_first_task[job_index]) * GLMRT_LINEAR_TILE_ROWS;
    tile.num_tile_rows = job->weight->rows - tile.row_begin;
    if (tile.num_tile_rows > GLMRT_LINEAR_TILE_ROWS) {
        tile.num_tile_rows = GLMRT_LINEAR_TILE_ROWS;
    }
    float *gate_tile = runner->tiles + (int64_t)thread_index * 2 * runner->tile_floats;
    float *up_tile = gate_tile + runner->tile_floats;
    for (int32_t r = 0; r < tile.num_tile_rows; ++r) {
        glmrt_linear_dequant_row(job->weight, tile.row_begin + r, gate_tile + (int64_t)r * n);
        if (job->up_weight != NULL) {
            glmrt_linear_dequant_row(job->up_weight, tile.row_begin + r, up_tile + (int64_t)r * n);
        }
    }
    tile.gate_tile = gate_tile;
    tile.up_tile = job->up_weight != NULL ? up_tile : NULL;
    int32_t m0 = 0;
    for (; m0 + GLMRT_KERNEL_BLOCK <= job->num_rows; m0 += GLMRT_KERNEL_BLOCK) {
        linear_tile_rows(&tile, m0, GLMRT_KERNEL_BLOCK);
    }
    for (; m0 < job->num_rows; ++m0) {
        linear_tile_rows(&tile, m0, 1);
    }
}

static glmrt_status linear_check_job(const glmrt_linear_runner *runner, const glmrt_matmul_job *job,
                                     glmrt_error *error)
{
    if (job->weight == NULL || job->weight->data == NULL || job->x == NULL || job->y == NULL) {
        return glmrt_error_set(error, GLMRT_ERR_INVALID_ARGUMENT, "matmul job without weight or buffers");
    }
    if (job->weight->cols > runner->max_cols) {
        return glmrt_error_set(error, GLMRT_ERR_INVARIANT, "matmul %s: %d columns exceed the tile width %d",
                               job->weight->name != NULL ? job->weight->name : "weight", (int)job->weight->cols,
                               (int)runner->max_cols);
    }
    if (job->up_weight != NULL &&
        (job->up_weight->rows != job->weight->rows || job->up_weight->cols != job->weight->cols)) {
        return glmrt_error_set(error, GLMRT_ERR_INVARIANT, "gated matmul with mismatched gate and up shapes");
    }
    return GLMRT_OK;
}

glmrt_status glmrt_linear_run(glmrt_linear_runner *runner, const glmrt_matmul_job *jobs, int32_t num_jobs,
                              glmrt_error *error)
{
    if (num_jobs > runner->job_capacity) {
        return glmrt_error_set(error, GLMRT_ERR_INVARIANT, "matmul: %d jobs exceed capacity %d", (int)num_jobs,
                               (int)runner->job_capacity);
    }
    int64_t total = 0;
    int64_t work_units = 0;
    for (int32_t j = 0; j < num_jobs; ++j) {
        glmrt_status status = linear_check_job(runner, &jobs[j], error);
        if (status != GLMRT_OK) {
            return status;
        }
        runner->job_first_task[j] = total;
        if (jobs[j].num_rows > 0) {
            total += (jobs[j].weight->rows + GLMRT_LINEAR_TILE_ROWS - 1) / GLMRT_LINEAR_TILE_ROWS;
            work_units += (int64_t)jobs[j].weight->rows * jobs[j].weight->cols * (jobs[j].num_rows + 1) *
                          (jobs[j].up_weight != NULL ? 2 : 1);
        }
    }
    if (total > INT32_MAX) {
        return glmrt_error_set(error, GLMRT_ERR_INVARIANT, "matmul: %lld tiles exceed the task range",
                               (long long)total);
    }
    runner->job_first_task[num_jobs] = total;
    runner->jobs = jobs;
    runner->num_jobs = num_jobs;
    glmrt_threadpool_run_sized(runner->pool, (int32_t)total, linear_task, runner, work_units);
    runner->jobs = NULL;
    runner->num_jobs = 0;
    return GLMRT_OK;
}

glmrt_status glmrt_linear_runner_init(glmrt_linear_runner *runner, glmrt_threadpool *pool, int32_t max_cols,
                                      int32_t job_capacity, glmrt_error *error)
{
    memset(runner, 0, sizeof(*runner));
    if (max_cols <= 0 || job_capacity <= 0) {
        return glmrt_error_set(error, GLMRT_ERR_INVALID_ARGUMENT, "matmul runner: bad sizes %d, %d",
                               (int)max_cols, (int)job_capacity);
    }
    runner->pool = pool;
    runner->num_threads = glmrt_threadpool_num_threads(pool);
    runner->max_cols = max_cols;
    runner->tile_floats = ((int64_t)GLMRT_LINEAR_TILE_ROWS * max_cols + 15) / 16 * 16;
    runner->job_capacity = job_capacity;
    size_t tile_bytes = (size_t)runner->num_threads * 2 * (size_t)runner->tile_floats * sizeof(float);
    if (posix_memalign((void **)&runner->tiles, 64, tile_bytes) != 0) {
        runner->tiles = NULL;
        return glmrt_error_set(error, GLMRT_ERR_OUT_OF_MEMORY, "matmul runner: cannot allocate %zu tile bytes",
                               tile_bytes);
    }
    runner->job_first_task = calloc((size_t)job_capacity + 1, sizeof(*runner->job_first_task));
    if (runner->job_first_task == NULL) {
        free(runner->tiles);
        runner->tiles = NULL;
        return glmrt_error_set(error, GLMRT_ERR_OUT_OF_MEMORY, "matmul runner: out of memory");
    }
    return GLMRT_OK;
}

void glmrt_linear_runner_free(glmrt_linear_runner *runner)
{
    if (runner == NULL) {
        return;
    }
    free(runner->tiles);
    free(runner->job_first_task);
    runner->tiles = NULL;
    runner->job_first_task = NULL;
}

int64_t glmrt_linear_runner_bytes(const glmrt_linear_runner *runner)
{
    return (int64_t)runner->num_threads * 2 * runner->tile_floats * (int64_t)sizeof(float) +
           ((int64_t)runner->job_capacity + 1) * (int64_t)sizeof(int64_t);
}
