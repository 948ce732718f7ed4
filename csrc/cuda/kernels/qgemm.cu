#include <string.h>

#include "device_arch.cuh"
#include "qgemm_kernel.cuh"

int glmrt_cuda_qgemm_device_supported(int device)
{
    return glmrt_cuda_device_hopper(device);
}

static int glmrt_qgemm_block_cols_supported(int32_t block_cols)
{
    if (block_cols <= 0 || block_cols % 32 != 0) {
        return 0;
    }
    return block_cols <= GLMRT_TENSOR_MAP_ROW_BYTES ? GLMRT_TENSOR_MAP_ROW_BYTES % block_cols == 0
                                                    : block_cols % GLMRT_TENSOR_MAP_ROW_BYTES == 0;
}

int glmrt_cuda_qgemm_matrix_supported(const glmrt_cuda_matrix *w)
{
    if (w->rows <= 0 || w->cols <= 0 || w->data == nullptr) {
        return 0;
    }
    if (w->format == GLMRT_CUDA_FORMAT_FP8) {
        if (w->cols % 16 != 0 || w->scale == nullptr) {
            return 0;
        }
        if (w->scale_kind == GLMRT_CUDA_SCALE_CHANNEL) {
            return 1;
        }
        return w->scale_kind == GLMRT_CUDA_SCALE_BLOCK && w->block_rows > 0 &&
               glmrt_qgemm_block_cols_supported(w->block_cols);
    }
    return w->format == GLMRT_CUDA_FORMAT_BF16 && w->scale_kind == GLMRT_CUDA_SCALE_NONE && w->cols % 8 == 0;
}

int32_t glmrt_cuda_qgemm_operand_kind(const glmrt_cuda_matrix *w)
{
    return w->format == GLMRT_CUDA_FORMAT_FP8 ? GLMRT_OPERAND_FP8 : GLMRT_OPERAND_BF16;
}

int32_t glmrt_cuda_qgemm_splits_for(int32_t weight_tiles, int32_t k_blocks, int32_t num_sms)
{
    int32_t splits = GLMRT_QGEMM_CTAS_PER_SM_TARGET * (num_sms > 0 ? num_sms : 1) / weight_tiles;
    const int32_t most = k_blocks / GLMRT_QGEMM_MIN_SPLIT_K_BLOCKS;
    if (splits > most) {
        splits = most;
    }
    if (splits > GLMRT_QGEMM_MAX_SPLITS) {
        splits = GLMRT_QGEMM_MAX_SPLITS;
    }
    return splits < 1 ? 1 : splits;
}

int32_t glmrt_cuda_qgemm_tile_rows(int32_t rows_per_group)
{
    int32_t tile = GLMRT_QGEMM_ACTIVATION_BOX_ROWS;
    while (tile < rows_per_group && tile < GLMRT_QGEMM_MAX_TILE_ROWS) {
        tile *= 2;
    }
    return tile;
}

int32_t glmrt_cuda_qgemm_expert_tile_rows(int32_t assignments, int32_t num_experts)
{
    const int32_t active = assignments < num_experts ? assignments : num_experts;
    const int32_t rows_per_expert = active > 0 ? assignments / active : 1;
    return glmrt_cuda_qgemm_tile_rows(GLMRT_QGEMM_EXPERT_TILE_HEADROOM * rows_per_expert);
}

int64_t glmrt_cuda_qgemm_split_partial_elements(int32_t max_split_units)
{
    return (int64_t)(max_split_units > 0 ? max_split_units : 1) * GLMRT_QGEMM_PARTIAL_TILE;
}

int32_t glmrt_cuda_qgemm_split_counters(int32_t max_split_n)
{
    return glmrt_ceil_div(max_split_n > 0 ? max_split_n : 1, GLMRT_QGEMM_WEIGHT_TILE_ROWS);
}

static int32_t glmrt_qgemm_promote_steps(const glmrt_cuda_matrix *w)
{
    if (w->format != GLMRT_CUDA_FORMAT_FP8 || w->scale_kind != GLMRT_CUDA_SCALE_BLOCK ||
        w->block_cols >= GLMRT_TENSOR_MAP_ROW_BYTES) {
        return GLMRT_QGEMM_K_STEPS;
    }
    return w->block_cols / 32;
}

glmrt_status glmrt_cuda_qgemm_weight_prepare(const glmrt_cuda_matrix *w, int32_t num_sms, int32_t allow_split,
                                             glmrt_cuda_qgemm_weight *out, glmrt_error *error)
{
    memset(out, 0, sizeof(*out));
    if (!glmrt_cuda_qgemm_matrix_supported(w)) {
        return glmrt_error_set(error, GLMRT_ERR_INVARIANT,
                               "matrix [%d, %d] of format %d with scale kind %d has no quantized GEMM", w->rows,
                               w->cols, w->format, w->scale_kind);
    }
    out->kind = glmrt_cuda_qgemm_operand_kind(w);
    const int64_t groups = w->num_groups > 1 ? w->num_groups : 1;
    GLMRT_TRY(glmrt_cuda_tensor_map_rows(&out->map, out->kind, w->data, w->cols, groups * w->rows,
                                         GLMRT_QGEMM_WEIGHT_TILE_ROWS, "weights", error));
    GLMRT_TRY(glmrt_cuda_tensor_map_rows(&out->pair_map, out->kind, w->data, w->cols, groups * w->rows,
                                         2 * GLMRT_QGEMM_WEIGHT_TILE_ROWS, "weights", error));
    out->k_blocks = glmrt_ceil_div(w->cols * glmrt_operand_bytes(out->kind), GLMRT_TENSOR_MAP_ROW_BYTES);
    out->weight_tiles = glmrt_ceil_div(w->rows, GLMRT_QGEMM_WEIGHT_TILE_ROWS);
    out->num_sms = num_sms > 0 ? num_sms : 1;
    const int32_t splits = allow_split ? glmrt_cuda_qgemm_splits_for(out->weight_tiles, out->k_blocks, out->num_sms) : 1;
    out->split_k_blocks = glmrt_ceil_div(out->k_blocks, splits);
    out->splits = glmrt_ceil_div(out->k_blocks, out->split_k_blocks);
    out->promote_steps = glmrt_qgemm_promote_steps(w);
    return GLMRT_OK;
}

glmrt_status glmrt_cuda_qgemm_operand_prepare(glmrt_cuda_qgemm_operand *operand, int32_t kind, uint8_t *data,
                                              float *scales, int32_t cols, int32_t capacity_rows, const char *what,
                                              glmrt_error *error)
{
    memset(operand, 0, sizeof(*operand));
    operand->data = data;
    operand->scales = scales;
    operand->kind = kind;
    operand->cols = cols;
    operand->capacity_rows = capacity_rows;
    if (kind == GLMRT_OPERAND_FP8 && scales == nullptr) {
        return glmrt_error_set(error, GLMRT_ERR_INVARIANT, "FP8 activations for %s need a scale buffer", what);
    }
    for (int32_t width = 0; width < GLMRT_QGEMM_TILE_WIDTHS; ++width) {
        GLMRT_TRY(glmrt_cuda_tensor_map_rows(&operand->map[width], kind, data, cols, capacity_rows,
                                             GLMRT_QGEMM_ACTIVATION_BOX_ROWS << width, what, error));
    }
    return GLMRT_OK;
}

static glmrt_status glmrt_qgemm_check(const glmrt_cuda_qgemm_call *call, const glmrt_cuda_qgemm_weight *q,
                                      glmrt_error *error)
{
    const glmrt_cuda_matrix *w = call->w;
    if (q == nullptr) {
        return glmrt_error_set(error, GLMRT_ERR_INVARIANT, "matrix [%d, %d] was not prepared for quantized GEMMs",
                               w->rows, w->cols);
    }
    if (call->x->kind != q->kind || call->x->cols != w->cols) {
        return glmrt_error_set(error, GLMRT_ERR_INVARIANT,
                               "activations of kind %d and %d columns do not match weights of kind %d and %d columns",
                               call->x->kind, call->x->cols, q->kind, w->cols);
    }
    if (call->tiles == nullptr && call->num_rows > call->x->capacity_rows) {
        return glmrt_error_set(error, GLMRT_ERR_INVARIANT, "%d activation rows exceed the buffer's %d",
                               call->num_rows, call->x->capacity_rows);
    }
    return GLMRT_OK;
}

int glmrt_cuda_qgemm_weight_splits(const glmrt_cuda_qgemm_weight *q)
{
    return q->splits > 1;
}

static int32_t glmrt_qgemm_dense_tile_rows(int32_t num_rows, const glmrt_cuda_qgemm_weight *q)
{
    if (num_rows <= GLMRT_QGEMM_SPLIT_MAX_ROWS) {
        return glmrt_cuda_qgemm_tile_rows(num_rows);
    }
    const int64_t narrow_units = (int64_t)glmrt_ceil_div(num_rows, GLMRT_QGEMM_SPLIT_MAX_ROWS) * q->weight_tiles;
    const int64_t one_wave = (int64_t)GLMRT_QGEMM_CTAS_PER_SM_TARGET * q->num_sms;
    return narrow_units <= one_wave ? GLMRT_QGEMM_SPLIT_MAX_ROWS : GLMRT_QGEMM_MAX_TILE_ROWS;
}

typedef struct glmrt_qgemm_plan {
    bool split_units;
    bool splits;
    int32_t bn;
    int32_t consumers;
    int32_t fold;
} glmrt_qgemm_plan;

static glmrt_qgemm_plan glmrt_qgemm_plan_for(const glmrt_cuda_qgemm_call *call, const glmrt_cuda_qgemm_weight *q)
{
    const bool grouped = call->tiles != nullptr;
    glmrt_qgemm_plan plan;
    plan.split_units = !grouped && call->num_rows <= GLMRT_QGEMM_SPLIT_MAX_ROWS;
    plan.bn = grouped ? call->tile_rows : glmrt_qgemm_dense_tile_rows(call->num_rows, q);
    plan.splits = !grouped && glmrt_cuda_qgemm_weight_splits(q);
    plan.consumers = plan.bn >= GLMRT_QGEMM_MAX_TILE_ROWS ? 2 : 1;
    plan.fold = !plan.split_units && plan.splits ? 1 : 0;
    return plan;
}

static bool glmrt_qgemm_weights_read_once(bool grouped, int32_t token_tiles, int32_t bn)
{
    return grouped ? bn < GLMRT_QGEMM_MAX_TILE_ROWS : token_tiles == 1;
}

static bool glmrt_qgemm_plan_gates(const glmrt_cuda_qgemm_call *call, const glmrt_qgemm_plan *plan)
{
    const glmrt_cuda_matrix *w = call->w;
    return call->gated != 0 && plan->consumers == 2 && call->accumulate == 0 &&
           call->bias == nullptr && w->rows % (2 * GLMRT_QGEMM_WEIGHT_TILE_ROWS) == 0 && call->y_stride >= w->rows / 2 &&
           call->y_stride % 4 == 0 && ((uintptr_t)call->y & 15u) == 0;
}

int glmrt_cuda_qgemm_gates(const glmrt_cuda_qgemm_call *call)
{
    const glmrt_cuda_qgemm_weight *q = call->w->qgemm;
    if (q == nullptr) {
        return 0;
    }
    const glmrt_qgemm_plan plan = glmrt_qgemm_plan_for(call, q);
    return glmrt_qgemm_plan_gates(call, &plan) ? 1 : 0;
}

glmrt_status glmrt_cuda_qgemm_run(const glmrt_cuda_qgemm_call *call, const glmrt_cuda_qgemm_split *split,
                                  cudaStream_t stream, glmrt_error *error)
{
    const bool grouped = call->tiles != nullptr;
    if (grouped ? call->grid_tiles <= 0 : call->num_rows <= 0) {
        return GLMRT_OK;
    }
    const glmrt_cuda_matrix *w = call->w;
    const glmrt_cuda_qgemm_weight *q = w->qgemm;
    GLMRT_TRY(glmrt_qgemm_check(call, q, error));
    const glmrt_qgemm_plan plan = glmrt_qgemm_plan_for(call, q);
    const bool split_units = plan.split_units;
    const int32_t bn = plan.bn;
    const bool splits = plan.splits;
    if (bn != glmrt_cuda_qgemm_tile_rows(bn)) {
        return glmrt_error_set(error, GLMRT_ERR_INVARIANT,
                               "grouped GEMM tiles of %d rows; the quantized GEMM takes 8 to %d in powers of two", bn,
                               GLMRT_QGEMM_MAX_TILE_ROWS);
    }
    const bool gated = glmrt_qgemm_plan_gates(call, &plan);
    const int32_t token_tiles = grouped ? call->grid_tiles : glmrt_ceil_div(call->num_rows, bn);
    int32_t grid_limit = token_tiles * glmrt_ceil_div(q->weight_tiles, plan.consumers);
    if (split_units) {
        grid_limit = q->weight_tiles * (splits ? q->splits : 1);
    }
    if (split_units && splits &&
        (split == nullptr || split->partials == nullptr ||
         (int64_t)q->weight_tiles * q->splits * GLMRT_QGEMM_PARTIAL_TILE > split->partial_elements ||
         q->weight_tiles > split->num_counters)) {
        return glmrt_error_set(error, GLMRT_ERR_INVARIANT,
                               "split GEMM over [%d, %d] in %d parts needs more partial space than the workspace holds",
                               w->rows, w->cols, grid_limit);
    }
    glmrt_qgemm_params p;
    memset(&p, 0, sizeof(p));
    p.w = *w;
    p.x_scales = call->x->scales;
    p.y = call->y;
    p.y_stride = call->y_stride;
    p.bias = call->bias;
    p.tiles = call->tiles;
    p.num_tiles = call->num_tiles;
    p.partials = split != nullptr ? split->partials : nullptr;
    p.counters = split != nullptr ? split->counters : nullptr;
    p.num_rows = call->num_rows;
    p.k_blocks = q->k_blocks;
    p.splits = splits ? q->splits : 1;
    p.split_k_blocks = splits ? q->split_k_blocks : q->k_blocks;
    p.weight_tiles = q->weight_tiles;
    p.token_tiles = grouped ? 1 : token_tiles;
    p.split_units = split_units ? 1 : 0;
    p.accumulate = call->accumulate;
    p.gated_rows = gated ? w->rows / 2 : 0;
    p.weights_read_once = glmrt_qgemm_weights_read_once(grouped, token_tiles, bn) ? 1 : 0;
    int32_t width = 0;
    while ((GLMRT_QGEMM_ACTIVATION_BOX_ROWS << width) < bn) {
        ++width;
    }
    const CUtensorMap *x_map = &call->x->map[width];
    const CUtensorMap *w_map = plan.consumers == 2 && !gated ? &q->pair_map : &q->map;
    if (q->kind == GLMRT_OPERAND_BF16) {
        return glmrt_qgemm_launch_bf16(bn, plan.fold, w_map, x_map, &p, grid_limit, q->num_sms, stream, error);
    }
    if (w->scale_kind == GLMRT_CUDA_SCALE_CHANNEL) {
        return glmrt_qgemm_launch_fp8_channel(bn, plan.fold, w_map, x_map, &p, grid_limit, q->num_sms, stream,
                                              error);
    }
    return glmrt_qgemm_launch_fp8_block(q->promote_steps, bn, plan.fold, w_map, x_map, &p, grid_limit, q->num_sms,
                                        stream, error);
}
