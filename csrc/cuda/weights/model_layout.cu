#include <stdlib.h>
#include <string.h>

#include "cuda_check.cuh"
#include "device_math.cuh"
#include "gemm.cuh"
#include "model_layout.cuh"

#define GLMRT_CUDA_DEFAULT_BLOCK 128

typedef struct glmrt_layout_walk {
    const glmrt_engine *engine;
    const glmrt_model_config *config;
    const glmrt_rank *rank;
    glmrt_cuda_arena *arena;
    const glmrt_cuda_layout_visitor *visitor;
    glmrt_error *error;
    int32_t random;
} glmrt_layout_walk;

const glmrt_linear *glmrt_cuda_matrix_spec_part(const glmrt_cuda_matrix_spec *spec, int32_t part, int32_t group)
{
    if (spec->group_parts[part] != nullptr) {
        return &spec->group_parts[part][spec->group_begin + group];
    }
    return spec->parts[part];
}

static glmrt_status glmrt_format_from_linear(const glmrt_linear *linear, const char *role, int32_t *format,
                                             int32_t *scale_kind, glmrt_error *error)
{
    switch (linear->dtype) {
    case GLMRT_DTYPE_F32:
    case GLMRT_DTYPE_F16:
        *format = GLMRT_CUDA_FORMAT_F32;
        *scale_kind = GLMRT_CUDA_SCALE_NONE;
        return GLMRT_OK;
    case GLMRT_DTYPE_BF16:
        *format = GLMRT_CUDA_FORMAT_BF16;
        *scale_kind = GLMRT_CUDA_SCALE_NONE;
        return GLMRT_OK;
    case GLMRT_DTYPE_F8_E4M3:
        *format = GLMRT_CUDA_FORMAT_FP8;
        if (linear->quant == GLMRT_QUANT_FP8_CHANNEL) {
            *scale_kind = GLMRT_CUDA_SCALE_CHANNEL;
            return GLMRT_OK;
        }
        if (linear->quant == GLMRT_QUANT_FP8_BLOCK) {
            *scale_kind = GLMRT_CUDA_SCALE_BLOCK;
            return GLMRT_OK;
        }
        return glmrt_error_set(error, GLMRT_ERR_FORMAT, "%s: FP8 weight %s without a scale format", role,
                               linear->name != nullptr ? linear->name : "(unnamed)");
    default:
        return glmrt_error_set(error, GLMRT_ERR_UNSUPPORTED, "%s: weight %s has dtype %s, not supported on CUDA", role,
                               linear->name != nullptr ? linear->name : "(unnamed)", glmrt_dtype_name(linear->dtype));
    }
}

static glmrt_status glmrt_decide_format(const glmrt_layout_walk *walk, const glmrt_cuda_matrix_spec *spec,
                                        glmrt_cuda_matrix *m)
{
    const glmrt_model_config *config = walk->config;
    m->block_rows = 1;
    m->block_cols = spec->cols;
    if (walk->random) {
        if (spec->high_precision_only || config->weight_quant == GLMRT_QUANT_NONE) {
            m->format = GLMRT_CUDA_FORMAT_BF16;
            m->scale_kind = GLMRT_CUDA_SCALE_NONE;
            return GLMRT_OK;
        }
        m->format = GLMRT_CUDA_FORMAT_FP8;
        if (config->weight_quant == GLMRT_QUANT_FP8_BLOCK) {
            m->scale_kind = GLMRT_CUDA_SCALE_BLOCK;
            m->block_rows = config->weight_block_rows > 0 ? config->weight_block_rows : GLMRT_CUDA_DEFAULT_BLOCK;
            m->block_cols = config->weight_block_cols > 0 ? config->weight_block_cols : GLMRT_CUDA_DEFAULT_BLOCK;
        } else {
            m->scale_kind = GLMRT_CUDA_SCALE_CHANNEL;
        }
        return GLMRT_OK;
    }
    for (int32_t p = 0; p < spec->num_parts; ++p) {
        const glmrt_linear *part = glmrt_cuda_matrix_spec_part(spec, p, 0);
        if (part == nullptr || part->data == nullptr) {
            return glmrt_error_set(walk->error, GLMRT_ERR_MISSING_TENSOR, "%s of layer %d has no bound weight",
                                   spec->role, spec->layer);
        }
        int32_t format = 0;
        int32_t scale_kind = 0;
        GLMRT_TRY(glmrt_format_from_linear(part, spec->role, &format, &scale_kind, walk->error));
        if (p == 0) {
            m->format = format;
            m->scale_kind = scale_kind;
            if (scale_kind == GLMRT_CUDA_SCALE_BLOCK) {
                m->block_rows = part->block_rows;
                m->block_cols = part->block_cols;
            }
        } else if (format != m->format || scale_kind != m->scale_kind ||
                   (scale_kind == GLMRT_CUDA_SCALE_BLOCK &&
                    (part->block_rows != m->block_rows || part->block_cols != m->block_cols))) {
            return glmrt_error_set(walk->error, GLMRT_ERR_UNSUPPORTED,
                                   "%s of layer %d fuses weights of different formats (%s and part %d)", spec->role,
                                   spec->layer, glmrt_dtype_name(glmrt_cuda_matrix_spec_part(spec, 0, 0)->dtype), p);
        }
    }
    return GLMRT_OK;
}

static glmrt_status glmrt_place_matrix(glmrt_layout_walk *walk, const glmrt_cuda_matrix_spec *spec,
                                       glmrt_cuda_matrix *m)
{
    memset(m, 0, sizeof(*m));
    GLMRT_TRY(glmrt_decide_format(walk, spec, m));
    m->cols = spec->cols;
    m->num_segments = spec->num_parts;
    m->num_groups = spec->num_groups;
    int32_t rows = 0;
    int32_t blocks = 0;
    for (int32_t p = 0; p < spec->num_parts; ++p) {
        m->segment_block_begin[p] = blocks;
        rows += spec->part_rows[p];
        m->segment_row_end[p] = rows;
        blocks += glmrt_ceil_div(spec->part_rows[p], m->block_rows);
    }
    m->rows = rows;
    if (m->scale_kind == GLMRT_CUDA_SCALE_BLOCK) {
        m->scale_rows = blocks;
        m->scale_cols = glmrt_ceil_div(m->cols, m->block_cols);
    } else if (m->scale_kind == GLMRT_CUDA_SCALE_CHANNEL) {
        m->scale_rows = rows;
        m->scale_cols = 1;
    }
    m->group_bytes = (int64_t)rows * m->cols * glmrt_cuda_format_bytes(m->format);
    m->group_scales = (int64_t)m->scale_rows * m->scale_cols;
    m->data = glmrt_cuda_arena_take(walk->arena, m->group_bytes * m->num_groups);
    if (m->scale_kind != GLMRT_CUDA_SCALE_NONE) {
        m->scale = glmrt_cuda_arena_array<float>(walk->arena, m->group_scales * m->num_groups);
    }
    GLMRT_TRY(glmrt_cuda_gemm_check_matrix(m, spec->role, walk->error));
    if (walk->visitor == nullptr) {
        return GLMRT_OK;
    }
    return walk->visitor->matrix(walk->visitor->context, spec, m, walk->error);
}

static glmrt_status glmrt_place_vector_slice(glmrt_layout_walk *walk, const char *role, int32_t layer, int32_t kind,
                                             const glmrt_vector *source, int32_t source_begin, int32_t length,
                                             int32_t source_length, float *at)
{
    if (walk->visitor == nullptr) {
        return GLMRT_OK;
    }
    glmrt_cuda_vector_spec spec;
    spec.role = role;
    spec.layer = layer;
    spec.kind = kind;
    spec.source = walk->random ? nullptr : source;
    spec.length = length;
    spec.source_begin = source_begin;
    spec.source_length = source_length;
    return walk->visitor->vector(walk->visitor->context, &spec, at, walk->error);
}

static glmrt_status glmrt_place_vector(glmrt_layout_walk *walk, const char *role, int32_t layer, int32_t kind,
                                       const glmrt_vector *source, int32_t length, float *at)
{
    return glmrt_place_vector_slice(walk, role, layer, kind, source, 0, length, length, at);
}

static float *glmrt_take_vector(glmrt_layout_walk *walk, const char *role, int32_t layer, int32_t kind,
                                const glmrt_vector *source, int32_t length, glmrt_status *status)
{
    float *at = glmrt_cuda_arena_array<float>(walk->arena, length);
    if (*status == GLMRT_OK) {
        *status = glmrt_place_vector(walk, role, layer, kind, source, length, at);
    }
    return at;
}

static void glmrt_spec_init(glmrt_cuda_matrix_spec *spec, const char *role, int32_t layer, int32_t cols)
{
    memset(spec, 0, sizeof(*spec));
    spec->role = role;
    spec->layer = layer;
    spec->cols = cols;
    spec->source_cols = cols;
    spec->num_groups = 1;
}

static void glmrt_spec_slice_columns(glmrt_cuda_matrix_spec *spec, int32_t col_begin, int32_t source_cols)
{
    spec->col_begin = col_begin;
    spec->source_cols = source_cols;
}

static void glmrt_spec_add_rows(glmrt_cuda_matrix_spec *spec, const glmrt_linear *part, int32_t row_begin,
                                int32_t rows)
{
    spec->parts[spec->num_parts] = part;
    spec->part_rows[spec->num_parts] = rows;
    spec->part_row_begin[spec->num_parts] = row_begin;
    spec->num_parts += 1;
}

static void glmrt_spec_add(glmrt_cuda_matrix_spec *spec, const glmrt_linear *part, int32_t rows)
{
    glmrt_spec_add_rows(spec, part, 0, rows);
}

static const glmrt_layer_weights *glmrt_source_layer(const glmrt_layout_walk *walk, int32_t index)
{
    if (walk->random || walk->engine->weights.layers == nullptr || index >= walk->engine->weights.num_layers) {
        return nullptr;
    }
    return &walk->engine->weights.layers[index];
}

typedef struct glmrt_head_rows {
    int32_t q_begin;
    int32_t q_rows;
    int32_t q_total;
    int32_t kv_begin;
    int32_t kv_rows;
    int32_t kv_total;
} glmrt_head_rows;

static glmrt_head_rows glmrt_head_rows_of(const glmrt_layout_walk *walk)
{
    int32_t hd = walk->config->head_dim;
    glmrt_head_rows rows;
    rows.q_begin = walk->rank->q_heads.begin * hd;
    rows.q_rows = walk->rank->q_heads.count * hd;
    rows.q_total = walk->config->num_attention_heads * hd;
    rows.kv_begin = walk->rank->kv_heads.begin * hd;
    rows.kv_rows = walk->rank->kv_heads.count * hd;
    rows.kv_total = walk->config->num_key_value_heads * hd;
    return rows;
}

static glmrt_status glmrt_layout_qkv_bias(glmrt_layout_walk *walk, int32_t index, const glmrt_layer_weights *src,
                                          const glmrt_head_rows *h, glmrt_cuda_layer *layer)
{
    layer->qkv_bias = glmrt_cuda_arena_array<float>(walk->arena, (int64_t)h->q_rows + 2 * h->kv_rows);
    float *base = layer->qkv_bias;
    GLMRT_TRY(glmrt_place_vector_slice(walk, "self_attn.q_proj.bias", index, GLMRT_CUDA_VECTOR_BIAS,
                                       src != nullptr ? &src->q_bias : nullptr, h->q_begin, h->q_rows, h->q_total,
                                       base));
    GLMRT_TRY(glmrt_place_vector_slice(walk, "self_attn.k_proj.bias", index, GLMRT_CUDA_VECTOR_BIAS,
                                       src != nullptr ? &src->k_bias : nullptr, h->kv_begin, h->kv_rows, h->kv_total,
                                       base != nullptr ? base + h->q_rows : nullptr));
    return glmrt_place_vector_slice(walk, "self_attn.v_proj.bias", index, GLMRT_CUDA_VECTOR_BIAS,
                                    src != nullptr ? &src->v_bias : nullptr, h->kv_begin, h->kv_rows, h->kv_total,
                                    base != nullptr ? base + h->q_rows + h->kv_rows : nullptr);
}

static glmrt_status glmrt_layout_attention(glmrt_layout_walk *walk, int32_t index, const glmrt_layer_weights *src,
                                           glmrt_cuda_layer *layer)
{
    const glmrt_model_config *c = walk->config;
    int32_t hd = c->head_dim;
    glmrt_head_rows h = glmrt_head_rows_of(walk);
    glmrt_cuda_matrix_spec spec;
    glmrt_spec_init(&spec, "self_attn.qkv_proj", index, c->hidden_size);
    glmrt_spec_add_rows(&spec, src != nullptr ? &src->q_proj : nullptr, h.q_begin, h.q_rows);
    glmrt_spec_add_rows(&spec, src != nullptr ? &src->k_proj : nullptr, h.kv_begin, h.kv_rows);
    glmrt_spec_add_rows(&spec, src != nullptr ? &src->v_proj : nullptr, h.kv_begin, h.kv_rows);
    GLMRT_TRY(glmrt_place_matrix(walk, &spec, &layer->qkv));
    if (c->attention_bias) {
        GLMRT_TRY(glmrt_layout_qkv_bias(walk, index, src, &h, layer));
    }
    glmrt_status status = GLMRT_OK;
    if (c->use_qk_norm) {
        layer->q_norm = glmrt_take_vector(walk, "self_attn.q_norm.weight", index, GLMRT_CUDA_VECTOR_NORM,
                                          src != nullptr ? &src->q_norm : nullptr, hd, &status);
        layer->k_norm = glmrt_take_vector(walk, "self_attn.k_norm.weight", index, GLMRT_CUDA_VECTOR_NORM,
                                          src != nullptr ? &src->k_norm : nullptr, hd, &status);
    }
    GLMRT_TRY(status);
    glmrt_spec_init(&spec, "self_attn.o_proj", index, h.q_rows);
    glmrt_spec_slice_columns(&spec, h.q_begin, h.q_total);
    glmrt_spec_add(&spec, src != nullptr ? &src->o_proj : nullptr, c->hidden_size);
    return glmrt_place_matrix(walk, &spec, &layer->o_proj);
}

static glmrt_status glmrt_layout_gated(glmrt_layout_walk *walk, int32_t index, const char *gate_up_role,
                                       const char *down_role, const glmrt_linear *gate, const glmrt_linear *up,
                                       const glmrt_linear *down, const glmrt_rank_range *columns, int32_t total,
                                       glmrt_cuda_matrix *gate_up_out, glmrt_cuda_matrix *down_out)
{
    const glmrt_model_config *c = walk->config;
    glmrt_cuda_matrix_spec spec;
    glmrt_spec_init(&spec, gate_up_role, index, c->hidden_size);
    glmrt_spec_add_rows(&spec, gate, columns->begin, columns->count);
    glmrt_spec_add_rows(&spec, up, columns->begin, columns->count);
    GLMRT_TRY(glmrt_place_matrix(walk, &spec, gate_up_out));
    glmrt_spec_init(&spec, down_role, index, columns->count);
    glmrt_spec_slice_columns(&spec, columns->begin, total);
    glmrt_spec_add(&spec, down, c->hidden_size);
    return glmrt_place_matrix(walk, &spec, down_out);
}

static glmrt_status glmrt_layout_dense(glmrt_layout_walk *walk, int32_t index, const glmrt_layer_weights *src,
                                       glmrt_cuda_layer *layer)
{
    return glmrt_layout_gated(walk, index, "mlp.gate_up_proj", "mlp.down_proj",
                              src != nullptr ? &src->mlp_gate : nullptr, src != nullptr ? &src->mlp_up : nullptr,
                              src != nullptr ? &src->mlp_down : nullptr, &walk->rank->dense_columns,
                              walk->config->intermediate_size, &layer->dense_gate_up, &layer->dense_down);
}

static glmrt_status glmrt_layout_moe(glmrt_layout_walk *walk, int32_t index, const glmrt_layer_weights *src,
                                     glmrt_cuda_layer *layer)
{
    const glmrt_model_config *c = walk->config;
    int32_t hidden = c->hidden_size;
    int32_t width = c->moe_intermediate_size;
    glmrt_cuda_matrix_spec spec;
    glmrt_spec_init(&spec, "mlp.gate", index, hidden);
    spec.high_precision_only = 1;
    glmrt_spec_add(&spec, src != nullptr ? &src->router : nullptr, c->n_routed_experts);
    GLMRT_TRY(glmrt_place_matrix(walk, &spec, &layer->router));
    glmrt_status status = GLMRT_OK;
    layer->router_bias = glmrt_take_vector(walk, "mlp.gate.e_score_correction_bias", index,
                                           GLMRT_CUDA_VECTOR_ROUTER_BIAS, src != nullptr ? &src->router_bias : nullptr,
                                           c->n_routed_experts, &status);
    GLMRT_TRY(status);
    const glmrt_rank_range *columns = &walk->rank->expert_columns;
    glmrt_spec_init(&spec, "mlp.experts.gate_up_proj", index, hidden);
    spec.num_groups = walk->rank->experts.count;
    spec.group_begin = walk->rank->experts.begin;
    glmrt_spec_add_rows(&spec, nullptr, columns->begin, columns->count);
    glmrt_spec_add_rows(&spec, nullptr, columns->begin, columns->count);
    spec.group_parts[0] = src != nullptr ? src->expert_gate : nullptr;
    spec.group_parts[1] = src != nullptr ? src->expert_up : nullptr;
    GLMRT_TRY(glmrt_place_matrix(walk, &spec, &layer->experts_gate_up));
    glmrt_spec_init(&spec, "mlp.experts.down_proj", index, columns->count);
    glmrt_spec_slice_columns(&spec, columns->begin, width);
    spec.num_groups = walk->rank->experts.count;
    spec.group_begin = walk->rank->experts.begin;
    glmrt_spec_add(&spec, nullptr, hidden);
    spec.group_parts[0] = src != nullptr ? src->expert_down : nullptr;
    GLMRT_TRY(glmrt_place_matrix(walk, &spec, &layer->experts_down));
    layer->has_shared = c->n_shared_experts > 0 && walk->rank->shared_columns.count > 0;
    if (!layer->has_shared) {
        return GLMRT_OK;
    }
    return glmrt_layout_gated(walk, index, "mlp.shared_experts.gate_up_proj", "mlp.shared_experts.down_proj",
                              src != nullptr ? &src->shared_gate : nullptr, src != nullptr ? &src->shared_up : nullptr,
                              src != nullptr ? &src->shared_down : nullptr, &walk->rank->shared_columns,
                              c->moe_intermediate_size * c->n_shared_experts, &layer->shared_gate_up,
                              &layer->shared_down);
}

static glmrt_status glmrt_layout_layer(glmrt_layout_walk *walk, int32_t index, glmrt_cuda_layer *layer)
{
    const glmrt_model_config *c = walk->config;
    const glmrt_layer_weights *src = glmrt_source_layer(walk, index);
    memset(layer, 0, sizeof(*layer));
    layer->is_moe = index >= c->first_k_dense_replace;
    glmrt_status status = GLMRT_OK;
    layer->input_norm = glmrt_take_vector(walk, "input_layernorm.weight", index, GLMRT_CUDA_VECTOR_NORM,
                                          src != nullptr ? &src->input_norm : nullptr, c->hidden_size, &status);
    layer->post_attention_norm = glmrt_take_vector(walk, "post_attention_layernorm.weight", index,
                                                   GLMRT_CUDA_VECTOR_NORM,
                                                   src != nullptr ? &src->post_attention_norm : nullptr,
                                                   c->hidden_size, &status);
    GLMRT_TRY(status);
    GLMRT_TRY(glmrt_layout_attention(walk, index, src, layer));
    return layer->is_moe ? glmrt_layout_moe(walk, index, src, layer) : glmrt_layout_dense(walk, index, src, layer);
}

static glmrt_status glmrt_layout_globals(glmrt_layout_walk *walk, glmrt_cuda_model *model)
{
    const glmrt_model_config *c = walk->config;
    const glmrt_weights *w = walk->random ? nullptr : &walk->engine->weights;
    glmrt_cuda_matrix_spec spec;
    glmrt_spec_init(&spec, "model.embed_tokens", -1, c->hidden_size);
    spec.high_precision_only = 1;
    glmrt_spec_add(&spec, w != nullptr ? &w->embed : nullptr, c->vocab_size);
    GLMRT_TRY(glmrt_place_matrix(walk, &spec, &model->embed));
    glmrt_status status = GLMRT_OK;
    model->final_norm = glmrt_take_vector(walk, "model.norm.weight", -1, GLMRT_CUDA_VECTOR_NORM,
                                          w != nullptr ? &w->final_norm : nullptr, c->hidden_size, &status);
    GLMRT_TRY(status);
    model->lm_head_shares_embed = w != nullptr && w->lm_head.data == w->embed.data &&
                                  walk->rank->vocab_rows.count == c->vocab_size;
    if (model->lm_head_shares_embed) {
        model->lm_head = model->embed;
        return GLMRT_OK;
    }
    if (walk->rank->vocab_rows.count == 0) {
        memset(&model->lm_head, 0, sizeof(model->lm_head));
        return GLMRT_OK;
    }
    glmrt_spec_init(&spec, "lm_head", -1, c->hidden_size);
    spec.high_precision_only = 1;
    glmrt_spec_add_rows(&spec, w != nullptr ? &w->lm_head : nullptr, walk->rank->vocab_rows.begin,
                        walk->rank->vocab_rows.count);
    return glmrt_place_matrix(walk, &spec, &model->lm_head);
}

glmrt_status glmrt_cuda_model_layout(const glmrt_engine *engine, const glmrt_rank *rank,
                                     glmrt_cuda_arena *arena, glmrt_cuda_model *model,
                                     const glmrt_cuda_layout_visitor *visitor, glmrt_error *error)
{
    glmrt_layout_walk walk;
    walk.engine = engine;
    walk.config = &engine->config;
    walk.rank = rank;
    walk.arena = arena;
    walk.visitor = visitor;
    walk.error = error;
    walk.random = engine->options.random_weights != 0;
    int32_t num_layers = engine->config.num_hidden_layers;
    if (model->layers == nullptr && num_layers > 0) {
        model->layers = (glmrt_cuda_layer *)calloc((size_t)num_layers, sizeof(glmrt_cuda_layer));
        if (model->layers == nullptr) {
            return glmrt_error_set(error, GLMRT_ERR_OUT_OF_MEMORY, "cannot allocate %d CUDA layer descriptors",
                                   num_layers);
        }
    }
    model->num_layers = num_layers;
    GLMRT_TRY(glmrt_layout_globals(&walk, model));
    for (int32_t i = 0; i < num_layers; ++i) {
        GLMRT_TRY(glmrt_layout_layer(&walk, i, &model->layers[i]));
    }
    return GLMRT_OK;
}

void glmrt_cuda_model_release(glmrt_cuda_model *model)
{
    free(model->layers);
    memset(model, 0, sizeof(*model));
}
