#include <stdlib.h>
#include <string.h>

#include "cuda_check.cuh"
#include "device_math.cuh"
#include "rank_state.cuh"

#define GLMRT_MATMULS_PER_LAYER 8
#define GLMRT_MATMULS_ALIGN 64
#define GLMRT_MATMUL_KIND_NONE (-1)

static void *glmrt_matmuls_aligned(size_t bytes)
{
    size_t rounded = (bytes + GLMRT_MATMULS_ALIGN - 1) / GLMRT_MATMULS_ALIGN * GLMRT_MATMULS_ALIGN;
    void *memory = aligned_alloc(GLMRT_MATMULS_ALIGN, rounded > 0 ? rounded : GLMRT_MATMULS_ALIGN);
    if (memory != nullptr) {
        memset(memory, 0, rounded > 0 ? rounded : GLMRT_MATMULS_ALIGN);
    }
    return memory;
}

void glmrt_cuda_matmuls_release(glmrt_cuda_state *st)
{
    if (st->matmuls == nullptr) {
        return;
    }
    free(st->matmuls->weights);
    free(st->matmuls);
    st->matmuls = nullptr;
}

static int32_t glmrt_matmul_kind_of(const glmrt_cuda_matrix *w)
{
    if (w->rows <= 0 || !glmrt_cuda_qgemm_matrix_supported(w)) {
        return GLMRT_MATMUL_KIND_NONE;
    }
    return glmrt_cuda_qgemm_operand_kind(w);
}

static glmrt_status glmrt_matmuls_take(glmrt_cuda_state *st, glmrt_cuda_matrix *w, int32_t kind, int32_t allow_split)
{
    glmrt_cuda_matmuls *m = st->matmuls;
    if (kind == GLMRT_MATMUL_KIND_NONE || glmrt_matmul_kind_of(w) != kind) {
        return GLMRT_OK;
    }
    if (m->num_weights >= m->capacity) {
        return glmrt_error_set(st->error, GLMRT_ERR_INVARIANT, "more native matmuls than the %d planned", m->capacity);
    }
    glmrt_cuda_qgemm_weight *q = &m->weights[m->num_weights];
    GLMRT_TRY(glmrt_cuda_qgemm_weight_prepare(w, st->num_sms, allow_split, q, st->error));
    m->num_weights += 1;
    w->qgemm = q;
    if (glmrt_cuda_qgemm_weight_splits(q)) {
        if (w->rows > st->dims.max_split_n) {
            st->dims.max_split_n = w->rows;
        }
        if (q->weight_tiles * q->splits > st->dims.max_split_units) {
            st->dims.max_split_units = q->weight_tiles * q->splits;
        }
    }
    return GLMRT_OK;
}

static glmrt_status glmrt_matmuls_take_layer(glmrt_cuda_state *st, glmrt_cuda_layer *layer, int32_t kind)
{
    GLMRT_TRY(glmrt_matmuls_take(st, &layer->qkv, kind, 1));
    GLMRT_TRY(glmrt_matmuls_take(st, &layer->o_proj, kind, 1));
    if (!layer->is_moe) {
        GLMRT_TRY(glmrt_matmuls_take(st, &layer->dense_gate_up, kind, 1));
        return glmrt_matmuls_take(st, &layer->dense_down, kind, 1);
    }
    GLMRT_TRY(glmrt_matmuls_take(st, &layer->experts_gate_up, kind, 0));
    GLMRT_TRY(glmrt_matmuls_take(st, &layer->experts_down, kind, 0));
    if (layer->has_shared) {
        GLMRT_TRY(glmrt_matmuls_take(st, &layer->shared_gate_up, kind, 1));
        GLMRT_TRY(glmrt_matmuls_take(st, &layer->shared_down, kind, 1));
    }
    return GLMRT_OK;
}

glmrt_status glmrt_cuda_matmuls_plan(glmrt_cuda_state *st)
{
    glmrt_cuda_dims *d = &st->dims;
    d->activation_bytes = 0;
    d->head_activation_bytes = 0;
    d->max_split_n = 0;
    d->max_split_units = 0;
    if (st->engine->options.matmul_precision == GLMRT_MATMUL_HIGH || !glmrt_cuda_qgemm_device_supported(st->device)) {
        return GLMRT_OK;
    }
    st->matmuls = (glmrt_cuda_matmuls *)glmrt_matmuls_aligned(sizeof(glmrt_cuda_matmuls));
    if (st->matmuls == nullptr) {
        return glmrt_error_set(st->error, GLMRT_ERR_OUT_OF_MEMORY, "cannot allocate the native matmul plan");
    }
    glmrt_cuda_matmuls *m = st->matmuls;
    m->capacity = d->num_layers * GLMRT_MATMULS_PER_LAYER + 1;
    m->weights = (glmrt_cuda_qgemm_weight *)glmrt_matmuls_aligned((size_t)m->capacity * sizeof(glmrt_cuda_qgemm_weight));
    if (m->weights == nullptr) {
        return glmrt_error_set(st->error, GLMRT_ERR_OUT_OF_MEMORY, "cannot allocate %d tensor maps", m->capacity);
    }
    m->kind = d->num_layers > 0 ? glmrt_matmul_kind_of(&st->model.layers[0].qkv) : GLMRT_MATMUL_KIND_NONE;
    for (int32_t i = 0; i < d->num_layers; ++i) {
        GLMRT_TRY(glmrt_matmuls_take_layer(st, &st->model.layers[i], m->kind));
    }
    m->head_kind = d->has_head ? glmrt_matmul_kind_of(&st->model.lm_head) : GLMRT_MATMUL_KIND_NONE;
    if (d->has_head) {
        GLMRT_TRY(glmrt_matmuls_take(st, &st->model.lm_head, m->head_kind, 0));
    }
    d->activation_bytes = m->kind != GLMRT_MATMUL_KIND_NONE ? glmrt_operand_bytes(m->kind) : 0;
    d->head_activation_bytes = m->head_kind != GLMRT_MATMUL_KIND_NONE ? glmrt_operand_bytes(m->head_kind) : 0;
    if (st->rank.index == 0) {
        st->engine->info.num_native_matmuls = m->num_weights;
    }
    return GLMRT_OK;
}

glmrt_status glmrt_cuda_matmuls_bind(glmrt_cuda_state *st)
{
    glmrt_cuda_matmuls *m = st->matmuls;
    if (m == nullptr) {
        return GLMRT_OK;
    }
    const glmrt_cuda_dims *d = &st->dims;
    glmrt_cuda_workspace *ws = &st->ws;
    glmrt_error *error = st->error;
    if (d->activation_bytes > 0) {
        GLMRT_TRY(glmrt_cuda_qgemm_operand_prepare(&m->rows, m->kind, ws->act_rows, ws->act_row_scales, d->hidden,
                                                   d->max_tokens, "normed rows", error));
        if (d->q_width > 0) {
            GLMRT_TRY(glmrt_cuda_qgemm_operand_prepare(&m->attention, m->kind, ws->act_wide, ws->act_wide_scales,
                                                       d->q_width, d->max_tokens, "attention output", error));
        }
        if (d->dense_width > 0) {
            GLMRT_TRY(glmrt_cuda_qgemm_operand_prepare(&m->dense_act, m->kind, ws->act_wide, ws->act_wide_scales,
                                                       d->dense_width, d->max_tokens, "dense MLP activations", error));
        }
        if (d->has_moe && d->shared_width > 0) {
            GLMRT_TRY(glmrt_cuda_qgemm_operand_prepare(&m->shared_act, m->kind, ws->act_wide, ws->act_wide_scales,
                                                       d->shared_width, d->max_tokens, "shared expert activations",
                                                       error));
        }
        if (d->has_moe && d->num_local_experts > 0) {
            GLMRT_TRY(glmrt_cuda_qgemm_operand_prepare(&m->expert_in, m->kind, ws->act_expert_in,
                                                       ws->act_expert_in_scales, d->hidden, d->max_assignments,
                                                       "expert inputs", error));
            GLMRT_TRY(glmrt_cuda_qgemm_operand_prepare(&m->expert_act, m->kind, ws->act_expert, ws->act_expert_scales,
                                                       d->expert_width, d->max_assignments, "expert activations",
                                                       error));
        }
    }
    if (d->head_activation_bytes > 0) {
        GLMRT_TRY(glmrt_cuda_qgemm_operand_prepare(&m->head, m->head_kind, ws->act_head, ws->act_head_scales, d->hidden,
                                                   d->max_batch, "lm_head input", error));
    }
    m->split.partials = ws->split_partials;
    m->split.counters = ws->split_counters;
    m->split.partial_elements = glmrt_cuda_qgemm_split_partial_elements(d->max_split_units);
    m->split.num_counters = d->max_split_n > 0 ? glmrt_cuda_qgemm_split_counters(d->max_split_n) : 0;
    if (m->split.num_counters > 0) {
        GLMRT_CUDA_TRY(error, cudaMemsetAsync(m->split.counters, 0, (size_t)m->split.num_counters * sizeof(int32_t),
                                              st->stream));
    }
    return GLMRT_OK;
}
