#include <string.h>

#include "activation_quant.cuh"
#include "attention_round.cuh"
#include "cuda_check.cuh"
#include "dependent_launch.cuh"
#include "device_math.cuh"
#include "moe.cuh"
#include "norm.cuh"
#include "peer_reduce.cuh"
#include "ops.cuh"
#include "rank_gather.cuh"
#include "rank_reduce.cuh"
#include "rank_state.cuh"
#include "route_resident.cuh"
#include "router.cuh"

#define GLMRT_OWN_ROWS_MIN_TOKENS 256

typedef struct glmrt_step_context {
    glmrt_cuda_state *state;
    const glmrt_cuda_step_counts *counts;
    glmrt_cuda_step_view view;
    glmrt_error *error;
    cudaStream_t stream;
    int32_t rows_owned;
    int32_t routes_own_rows;
    int32_t decode_path;
} glmrt_step_context;

typedef struct glmrt_step_rows {
    int32_t begin;
    int32_t end;
} glmrt_step_rows;

typedef glmrt_cuda_qgemm_operand glmrt_cuda_matmuls::*glmrt_operand_slot;

static const glmrt_cuda_qgemm_operand *glmrt_step_operand(const glmrt_step_context *step, glmrt_operand_slot which)
{
    glmrt_cuda_matmuls *m = step->state->matmuls;
    return m != nullptr ? &(m->*which) : nullptr;
}

static glmrt_status glmrt_step_check_peers(const glmrt_step_context *step)
{
    const int32_t *abandoned = step->state->step_abandoned;
    if (abandoned != nullptr && __atomic_load_n(abandoned, __ATOMIC_ACQUIRE)) {
        return glmrt_error_set(step->error, GLMRT_ERR_BACKEND, "stopped because another GPU failed in this step");
    }
    return GLMRT_OK;
}

static glmrt_step_rows glmrt_step_own_rows(const glmrt_cuda_state *st, int32_t num_rows)
{
    glmrt_step_rows rows;
    rows.begin = glmrt_peer_row_begin(num_rows, st->peer.rank, st->peer.num_ranks);
    rows.end = glmrt_peer_row_begin(num_rows, st->peer.rank + 1, st->peer.num_ranks);
    return rows;
}

static int32_t glmrt_operand_row_words(const glmrt_cuda_qgemm_operand *x)
{
    return (int32_t)((int64_t)x->cols * glmrt_operand_bytes(x->kind) / (int64_t)sizeof(uint32_t));
}

static int glmrt_operand_rows_gatherable(const glmrt_cuda_qgemm_operand *x)
{
    return glmrt_cuda_operand_gather_supported(x, x) && (x->kind != GLMRT_OPERAND_FP8 || x->scales != nullptr);
}

static void glmrt_step_add_operand_rows(glmrt_cuda_peer_row_gather *gather, const glmrt_cuda_qgemm_operand *x)
{
    glmrt_cuda_peer_row_gather_add(gather, x->data, glmrt_operand_row_words(x));
    if (x->kind == GLMRT_OPERAND_FP8) {
        glmrt_cuda_peer_row_gather_add(gather, x->scales, 1);
    }
}

static int glmrt_matrix_takes_rounded_rows(const glmrt_cuda_matrix *w)
{
    return w->rows <= 0 || w->qgemm != nullptr;
}

static int glmrt_layer_rounds_every_input(const glmrt_cuda_state *st, const glmrt_cuda_layer *layer)
{
    if (!glmrt_matrix_takes_rounded_rows(&layer->qkv)) {
        return 0;
    }
    if (!layer->is_moe) {
        return glmrt_matrix_takes_rounded_rows(&layer->dense_gate_up);
    }
    if (layer->has_shared && !glmrt_matrix_takes_rounded_rows(&layer->shared_gate_up)) {
        return 0;
    }
    return layer->experts_gate_up.qgemm != nullptr && layer->experts_down.qgemm != nullptr &&
           glmrt_cuda_operand_gather_supported(&st->matmuls->rows, &st->matmuls->expert_in);
}

int glmrt_cuda_forward_can_own_rows(const glmrt_cuda_state *st)
{
    if (st->ws.partial == nullptr || st->matmuls == nullptr || st->peer.num_ranks < 2 ||
        !glmrt_operand_rows_gatherable(&st->matmuls->rows)) {
        return 0;
    }
    for (int32_t i = 0; i < st->dims.num_layers; ++i) {
        if (!glmrt_layer_rounds_every_input(st, &st->model.layers[i])) {
            return 0;
        }
    }
    return 1;
}

static int glmrt_step_can_route_own_rows(const glmrt_cuda_state *st, int32_t num_rows)
{
    return num_rows >= GLMRT_OWN_ROWS_MIN_TOKENS &&
           glmrt_cuda_peer_gather_rows_fits(&st->peer, num_rows, 2 * (int64_t)st->dims.top_k);
}

static int glmrt_step_can_own_rows(const glmrt_cuda_state *st, int32_t num_rows)
{
    const glmrt_cuda_dims *d = &st->dims;
    if (!st->rows_owned_capable || num_rows < GLMRT_OWN_ROWS_MIN_TOKENS) {
        return 0;
    }
    const int64_t operand_words = glmrt_operand_row_words(&st->matmuls->rows) + 1 + 2 * (int64_t)d->top_k;
    return glmrt_cuda_peer_scatter_rows_fits(&st->peer, num_rows, d->hidden) &&
           glmrt_cuda_peer_gather_rows_fits(&st->peer, num_rows, operand_words) &&
           glmrt_cuda_peer_gather_rows_fits(&st->peer, num_rows, d->hidden);
}

static glmrt_status glmrt_step_reduce(const glmrt_step_context *step, int32_t rows)
{
    glmrt_cuda_state *st = step->state;
    GLMRT_TRY(glmrt_step_check_peers(step));
    if (step->rows_owned) {
        return glmrt_cuda_peer_reduce_bf16_scatter_rows(&st->peer, st->ws.partial, st->ws.hidden, rows, st->dims.hidden,
                                                        step->stream, step->error);
    }
    return glmrt_cuda_reduce_hidden(st->comm, &st->peer, &st->ordered, st->ws.partial, st->ws.hidden,
                                    (int64_t)rows * st->dims.hidden, step->stream, step->error);
}

static float *glmrt_step_sum_target(const glmrt_step_context *step)
{
    return step->state->ws.partial != nullptr ? step->state->ws.partial : step->state->ws.hidden;
}

static glmrt_status glmrt_step_quantize(const glmrt_step_context *step, const glmrt_cuda_qgemm_operand *out,
                                        const float *x, int64_t x_stride, const int32_t *x_rows, int32_t op,
                                        int32_t num_rows, const int32_t *device_rows)
{
    glmrt_cuda_activation_args args;
    args.x = x;
    args.x_stride = x_stride;
    args.x_rows = x_rows;
    args.op = op;
    args.num_rows = num_rows;
    args.device_rows = device_rows;
    args.out = out;
    return glmrt_cuda_activation_quantize(&args, step->stream, step->error);
}

static glmrt_cuda_qgemm_call glmrt_step_dense_call(const glmrt_cuda_matrix *w, const glmrt_cuda_qgemm_operand *x,
                                                   float *y, int64_t y_stride, int32_t num_rows, const float *bias,
                                                   int32_t accumulate)
{
    glmrt_cuda_qgemm_call call;
    memset(&call, 0, sizeof(call));
    call.w = w;
    call.x = x;
    call.num_rows = num_rows;
    call.y = y;
    call.y_stride = y_stride;
    call.bias = bias;
    call.accumulate = accumulate;
    return call;
}

static glmrt_status glmrt_step_native_dense(const glmrt_step_context *step, const glmrt_cuda_matrix *w,
                                            const glmrt_cuda_qgemm_operand *x, float *y, int64_t y_stride,
                                            int32_t num_rows, const float *bias, int32_t accumulate)
{
    const glmrt_cuda_qgemm_call call = glmrt_step_dense_call(w, x, y, y_stride, num_rows, bias, accumulate);
    return glmrt_cuda_qgemm_run(&call, &step->state->matmuls->split, step->stream, step->error);
}

static int32_t glmrt_step_gated_op(const glmrt_cuda_qgemm_call *call)
{
    return glmrt_cuda_qgemm_gates(call) ? GLMRT_ACTIVATION_COPY : GLMRT_ACTIVATION_SILU_MUL;
}

typedef struct glmrt_step_norm_target {
    const float *weight;
    const int32_t *x_rows;
    int32_t first_row;
    int32_t num_rows;
    float *y;
    int32_t rounds;
    glmrt_operand_slot operand;
} glmrt_step_norm_target;

static glmrt_cuda_qgemm_operand glmrt_operand_from_row(const glmrt_cuda_qgemm_operand *x, int32_t first_row)
{
    glmrt_cuda_qgemm_operand from_row = *x;
    from_row.data += (int64_t)first_row * x->cols * glmrt_operand_bytes(x->kind);
    from_row.scales = x->scales != nullptr ? x->scales + first_row : nullptr;
    from_row.capacity_rows -= first_row;
    return from_row;
}

static glmrt_status glmrt_step_norm(const glmrt_step_context *step, const glmrt_step_norm_target *target)
{
    glmrt_cuda_state *st = step->state;
    const int64_t first = (int64_t)target->first_row * st->dims.hidden;
    glmrt_cuda_qgemm_operand rounded;
    if (target->rounds) {
        rounded = glmrt_operand_from_row(glmrt_step_operand(step, target->operand), target->first_row);
    }
    glmrt_cuda_rmsnorm_args norm;
    norm.x = st->ws.hidden + first;
    norm.x_stride = st->dims.hidden;
    norm.x_rows = target->x_rows;
    norm.num_rows = target->num_rows;
    norm.weight = target->weight;
    norm.n = st->dims.hidden;
    norm.eps = st->rms_eps;
    norm.y = target->y + first;
    norm.y_stride = st->dims.hidden;
    norm.quantized = target->rounds ? &rounded : nullptr;
    return glmrt_cuda_rmsnorm_run(&norm, step->stream, step->error);
}

static glmrt_status glmrt_step_norm_rows(const glmrt_step_context *step, const float *weight, glmrt_step_rows rows,
                                         int rounds)
{
    glmrt_step_norm_target target;
    target.weight = weight;
    target.x_rows = nullptr;
    target.first_row = rows.begin;
    target.num_rows = rows.end - rows.begin;
    target.y = step->state->ws.normed;
    target.rounds = rounds;
    target.operand = &glmrt_cuda_matmuls::rows;
    return glmrt_step_norm(step, &target);
}

static glmrt_cuda_peer_row_gather glmrt_step_row_gather(const glmrt_step_context *step)
{
    glmrt_cuda_peer_row_gather gather;
    glmrt_cuda_peer_row_gather_clear(&gather, step->counts->num_tokens);
    return gather;
}

static glmrt_status glmrt_step_gather_rows(const glmrt_step_context *step, const glmrt_cuda_peer_row_gather *gather)
{
    GLMRT_TRY(glmrt_step_check_peers(step));
    return glmrt_cuda_peer_gather_rows(&step->state->peer, gather, step->stream, step->error);
}

static glmrt_status glmrt_step_gather_operand_rows(const glmrt_step_context *step)
{
    glmrt_cuda_peer_row_gather gather = glmrt_step_row_gather(step);
    glmrt_step_add_operand_rows(&gather, glmrt_step_operand(step, &glmrt_cuda_matmuls::rows));
    return glmrt_step_gather_rows(step, &gather);
}

static glmrt_status glmrt_step_norm_input(const glmrt_step_context *step, const float *weight,
                                          const glmrt_cuda_matrix *consumer, int gather_now)
{
    if (!step->rows_owned) {
        glmrt_step_rows all;
        all.begin = 0;
        all.end = step->counts->num_tokens;
        return glmrt_step_norm_rows(step, weight, all, consumer != nullptr && consumer->qgemm != nullptr);
    }
    GLMRT_TRY(glmrt_step_norm_rows(step, weight, glmrt_step_own_rows(step->state, step->counts->num_tokens), 1));
    return gather_now ? glmrt_step_gather_operand_rows(step) : GLMRT_OK;
}

static glmrt_status glmrt_step_dense_rounded(const glmrt_step_context *step, const glmrt_cuda_matrix *w,
                                             glmrt_operand_slot rounded, const float *x, int64_t x_stride, float *y,
                                             int64_t y_stride, int32_t num_rows, const float *bias, int32_t accumulate)
{
    if (w->qgemm != nullptr) {
        return glmrt_step_native_dense(step, w, glmrt_step_operand(step, rounded), y, y_stride, num_rows, bias,
                                       accumulate);
    }
    return glmrt_cuda_gemm_dense(w, x, x_stride, y, y_stride, num_rows, bias, accumulate, step->stream, step->error);
}

static glmrt_status glmrt_step_dense(const glmrt_step_context *step, const glmrt_cuda_matrix *w,
                                     glmrt_operand_slot rounded, const float *x, int64_t x_stride, float *y,
                                     int64_t y_stride, int32_t num_rows, const float *bias, int32_t accumulate)
{
    if (w->qgemm != nullptr) {
        GLMRT_TRY(glmrt_step_quantize(step, glmrt_step_operand(step, rounded), x, x_stride, nullptr,
                                      GLMRT_ACTIVATION_COPY, num_rows, nullptr));
    }
    return glmrt_step_dense_rounded(step, w, rounded, x, x_stride, y, y_stride, num_rows, bias, accumulate);
}

static glmrt_status glmrt_step_dense_normed(const glmrt_step_context *step, const glmrt_cuda_matrix *w, float *y,
                                            int64_t y_stride, const float *bias)
{
    return glmrt_step_dense_rounded(step, w, &glmrt_cuda_matmuls::rows, step->state->ws.normed,
                                    step->state->dims.hidden, y, y_stride, step->counts->num_tokens, bias, 0);
}

static glmrt_cuda_attention_merge_args glmrt_step_merge_args(const glmrt_step_context *step)
{
    glmrt_cuda_state *st = step->state;
    const glmrt_cuda_dims *d = &st->dims;
    glmrt_cuda_attention_merge_args merge;
    merge.merges = step->view.merges;
    merge.num_merges = step->counts->num_merges;
    merge.device_num_merges = step->counts->bucket > 0 ? &step->view.device_counts->num_merges : nullptr;
    merge.max_grid_merges = 0;
    merge.group = d->group;
    merge.num_kv_heads = d->num_kv_heads;
    merge.head_dim = d->head_dim;
    merge.partial_out = st->ws.partial_out;
    merge.partial_stats = st->ws.partial_stats;
    merge.out = st->ws.attn;
    merge.out_stride = d->q_width;
    return merge;
}

static glmrt_status glmrt_step_merge_and_round(const glmrt_step_context *step, const glmrt_cuda_layer *layer)
{
    glmrt_cuda_state *st = step->state;
    const glmrt_cuda_dims *d = &st->dims;
    const int32_t t = step->counts->num_tokens;
    const glmrt_cuda_attention_merge_args merge = glmrt_step_merge_args(step);
    const glmrt_cuda_qgemm_operand *rounded = glmrt_step_operand(step, &glmrt_cuda_matmuls::attention);
    if (layer->o_proj.qgemm != nullptr && glmrt_cuda_attention_merge_round_blocks(&merge, t, rounded, st->num_sms) > 0) {
        GLMRT_TRY(glmrt_cuda_attention_merge_round(&merge, t, rounded, st->num_sms, step->stream, step->error));
        return glmrt_step_dense_rounded(step, &layer->o_proj, &glmrt_cuda_matmuls::attention, st->ws.attn, d->q_width,
                                        glmrt_step_sum_target(step), d->hidden, t, nullptr, st->owns_residual);
    }
    GLMRT_TRY(glmrt_cuda_attention_merge_run(&merge, step->stream, step->error));
    return glmrt_step_dense(step, &layer->o_proj, &glmrt_cuda_matmuls::attention, st->ws.attn, d->q_width,
                            glmrt_step_sum_target(step), d->hidden, t, nullptr, st->owns_residual);
}

static glmrt_status glmrt_layer_attention(glmrt_step_context *step, int32_t index)
{
    glmrt_cuda_state *st = step->state;
    const glmrt_cuda_dims *d = &st->dims;
    const glmrt_cuda_layer *layer = &st->model.layers[index];
    glmrt_cuda_workspace *ws = &st->ws;
    const glmrt_model_config *config = &st->engine->config;
    int32_t t = step->counts->num_tokens;
    GLMRT_TRY(glmrt_step_norm_input(step, layer->input_norm, &layer->qkv, 1));
    GLMRT_TRY(glmrt_step_dense_normed(step, &layer->qkv, ws->qkv, d->qkv_width, layer->qkv_bias));
    glmrt_cuda_rope_args rope;
    rope.qkv = ws->qkv;
    rope.qkv_stride = d->qkv_width;
    rope.num_tokens = t;
    rope.positions = step->view.positions;
    rope.token_seq = step->view.token_seq;
    rope.seq_page_begin = step->view.seq_page_begin;
    rope.page_ids = step->view.page_ids;
    rope.num_q_heads = d->num_q_heads;
    rope.rotary_dim = d->rotary_dim;
    rope.q_norm = layer->q_norm;
    rope.k_norm = layer->k_norm;
    rope.eps = st->rms_eps;
    rope.theta = config->rope_theta;
    rope.kv = st->kv;
    rope.layer = index;
    rope.path = GLMRT_ROPE_PATH_AUTO;
    GLMRT_TRY(glmrt_cuda_qk_rope_store(&rope, step->stream, step->error));
    glmrt_cuda_attention_args attention;
    attention.q = ws->qkv;
    attention.q_stride = d->qkv_width;
    attention.positions = step->view.positions;
    attention.page_ids = step->view.page_ids;
    attention.kv = st->kv;
    attention.layer = index;
    attention.group = d->group;
    attention.scale = st->attention_scale;
    attention.out = ws->attn;
    attention.out_stride = d->q_width;
    attention.partial_out = ws->partial_out;
    attention.partial_stats = ws->partial_stats;
    attention.prefill_path = GLMRT_ATTENTION_PREFILL_AUTO;
    attention.decode_path = step->decode_path;
    attention.items = step->view.decode_items;
    attention.num_items = step->counts->num_decode_items;
    attention.device_num_items = nullptr;
    attention.max_grid_items = 0;
    if (step->counts->bucket > 0) {
        attention.device_num_items = &step->view.device_counts->num_decode_items;
        attention.max_grid_items = step->decode_path == GLMRT_ATTENTION_DECODE_SPREAD
                                       ? glmrt_cuda_decode_graph_spread_items(st)
                                       : glmrt_cuda_decode_graph_grid(st, step->counts->bucket);
    }
    GLMRT_TRY(glmrt_cuda_attention_run(&attention, 1, step->stream, step->error));
    attention.items = step->view.prefill_items;
    attention.num_items = step->counts->num_prefill_items;
    attention.device_num_items = nullptr;
    attention.max_grid_items = 0;
    GLMRT_TRY(glmrt_cuda_attention_run(&attention, st->capacity.prefill_tokens_per_item, step->stream, step->error));
    GLMRT_TRY(glmrt_step_merge_and_round(step, layer));
    return glmrt_step_reduce(step, t);
}

static glmrt_status glmrt_layer_gated_mlp(glmrt_step_context *step, const glmrt_cuda_matrix *gate_up,
                                          const glmrt_cuda_matrix *down, glmrt_operand_slot act,
                                          float *out, int32_t accumulate)
{
    glmrt_cuda_state *st = step->state;
    const glmrt_cuda_dims *d = &st->dims;
    glmrt_cuda_workspace *ws = &st->ws;
    int32_t t = step->counts->num_tokens;
    int32_t width = down->cols;
    if (gate_up->qgemm != nullptr && down->qgemm != nullptr) {
        glmrt_cuda_qgemm_call call = glmrt_step_dense_call(gate_up, glmrt_step_operand(step, &glmrt_cuda_matmuls::rows),
                                                           ws->mlp_gate_up, 2 * (int64_t)width, t, nullptr, 0);
        call.gated = 1;
        GLMRT_TRY(glmrt_cuda_qgemm_run(&call, &st->matmuls->split, step->stream, step->error));
        const glmrt_cuda_qgemm_operand *x = glmrt_step_operand(step, act);
        GLMRT_TRY(glmrt_step_quantize(step, x, ws->mlp_gate_up, 2 * (int64_t)width, nullptr, glmrt_step_gated_op(&call),
                                      t, nullptr));
        return glmrt_step_native_dense(step, down, x, out, d->hidden, t, nullptr, accumulate);
    }
    GLMRT_TRY(glmrt_step_dense_normed(step, gate_up, ws->mlp_gate_up, 2 * (int64_t)width, nullptr));
    GLMRT_TRY(glmrt_cuda_silu_mul(ws->mlp_gate_up, width, t, nullptr, ws->mlp_act, step->stream, step->error));
    return glmrt_cuda_gemm_dense(down, ws->mlp_act, width, out, d->hidden, t, nullptr, accumulate, step->stream,
                                 step->error);
}

static int32_t glmrt_expert_tile_rows(const glmrt_cuda_dims *d, int32_t num_tokens, int32_t native)
{
    int32_t assignments = num_tokens * d->top_k;
    if (native) {
        return glmrt_cuda_qgemm_expert_tile_rows(assignments, d->num_experts);
    }
    int32_t active = assignments < d->num_experts ? assignments : d->num_experts;
    return glmrt_cuda_gemm_tile_rows(active > 0 ? assignments / active : 1);
}

static glmrt_status glmrt_layer_experts_rounded(glmrt_step_context *step, const glmrt_cuda_layer *layer,
                                                int32_t tile_rows, int32_t grid_tiles)
{
    glmrt_cuda_state *st = step->state;
    const glmrt_cuda_dims *d = &st->dims;
    glmrt_cuda_workspace *ws = &st->ws;
    glmrt_cuda_matmuls *m = st->matmuls;
    int32_t assignments = step->counts->num_tokens * d->top_k;
    const glmrt_cuda_qgemm_operand *rows = glmrt_step_operand(step, &glmrt_cuda_matmuls::rows);
    const int rows_rounded = step->rows_owned || (layer->has_shared && layer->shared_gate_up.qgemm != nullptr &&
                                                  glmrt_cuda_operand_gather_supported(rows, &m->expert_in));
    const int32_t *num_sorted = ws->moe_counters + 1;
    if (rows_rounded) {
        glmrt_cuda_operand_gather_args gather;
        gather.source = rows;
        gather.source_rows = ws->sorted_token;
        gather.num_rows = assignments;
        gather.device_rows = num_sorted;
        gather.out = &m->expert_in;
        GLMRT_TRY(glmrt_cuda_operand_gather(&gather, step->stream, step->error));
    } else {
        GLMRT_TRY(glmrt_step_quantize(step, &m->expert_in, ws->normed, d->hidden, ws->sorted_token,
                                      GLMRT_ACTIVATION_COPY, assignments, num_sorted));
    }
    glmrt_cuda_qgemm_call call;
    memset(&call, 0, sizeof(call));
    call.w = &layer->experts_gate_up;
    call.x = &m->expert_in;
    call.num_rows = assignments;
    call.tiles = ws->tiles;
    call.num_tiles = ws->moe_counters;
    call.grid_tiles = grid_tiles;
    call.tile_rows = tile_rows;
    call.y = ws->expert_gate_up;
    call.y_stride = 2 * (int64_t)d->expert_width;
    call.gated = 1;
    GLMRT_TRY(glmrt_cuda_qgemm_run(&call, &m->split, step->stream, step->error));
    GLMRT_TRY(glmrt_step_quantize(step, &m->expert_act, ws->expert_gate_up, 2 * (int64_t)d->expert_width, nullptr,
                                  glmrt_step_gated_op(&call), assignments, num_sorted));
    call.gated = 0;
    call.w = &layer->experts_down;
    call.x = &m->expert_act;
    call.y = ws->expert_out;
    call.y_stride = d->hidden;
    return glmrt_cuda_qgemm_run(&call, &m->split, step->stream, step->error);
}

static int glmrt_layer_experts_native(const glmrt_cuda_layer *layer)
{
    return layer->experts_gate_up.qgemm != nullptr && layer->experts_down.qgemm != nullptr;
}

static glmrt_status glmrt_layer_experts(glmrt_step_context *step, const glmrt_cuda_layer *layer, int32_t tile_rows)
{
    glmrt_cuda_state *st = step->state;
    const glmrt_cuda_dims *d = &st->dims;
    glmrt_cuda_workspace *ws = &st->ws;
    int32_t t = step->counts->num_tokens;
    int32_t assignments = t * d->top_k;
    const int32_t native = glmrt_layer_experts_native(layer);
    int32_t grid_tiles = glmrt_cuda_moe_max_tiles(assignments, d->num_local_experts, tile_rows);
    if (native) {
        return glmrt_layer_experts_rounded(step, layer, tile_rows, grid_tiles);
    }
    glmrt_cuda_gemm_args gemm;
    memset(&gemm, 0, sizeof(gemm));
    gemm.x = ws->normed;
    gemm.x_stride = d->hidden;
    gemm.x_rows = ws->sorted_token;
    gemm.y = ws->expert_gate_up;
    gemm.y_stride = 2 * (int64_t)d->expert_width;
    gemm.num_rows = assignments;
    gemm.tiles = ws->tiles;
    gemm.num_tiles = ws->moe_counters;
    gemm.w = layer->experts_gate_up;
    GLMRT_TRY(glmrt_cuda_gemm_run(&gemm, tile_rows, grid_tiles, step->stream, step->error));
    GLMRT_TRY(glmrt_cuda_silu_mul(ws->expert_gate_up, d->expert_width, assignments, ws->moe_counters + 1,
                                  ws->expert_act, step->stream, step->error));
    gemm.x = ws->expert_act;
    gemm.x_stride = d->expert_width;
    gemm.x_rows = nullptr;
    gemm.y = ws->expert_out;
    gemm.y_stride = d->hidden;
    gemm.w = layer->experts_down;
    return glmrt_cuda_gemm_run(&gemm, tile_rows, grid_tiles, step->stream, step->error);
}

static void glmrt_layer_route_args(const glmrt_step_context *step, const glmrt_cuda_layer *layer,
                                   glmrt_cuda_route_args *route)
{
    glmrt_cuda_state *st = step->state;
    const glmrt_cuda_dims *d = &st->dims;
    glmrt_cuda_workspace *ws = &st->ws;
    route->logits = ws->router_logits;
    route->correction_bias = layer->router_bias;
    route->num_tokens = step->counts->num_tokens;
    route->num_experts = d->num_experts;
    route->top_k = d->top_k;
    route->num_groups = d->num_groups;
    route->keep_groups = d->keep_groups;
    route->normalize = st->engine->config.norm_topk_prob;
    route->scaling = st->engine->config.routed_scaling_factor;
    route->topk_ids = ws->topk_ids;
    route->topk_weights = ws->topk_weights;
}

static void glmrt_layer_dispatch_args(const glmrt_step_context *step, int32_t tile_rows,
                                      glmrt_cuda_dispatch_args *dispatch)
{
    glmrt_cuda_state *st = step->state;
    const glmrt_cuda_dims *d = &st->dims;
    glmrt_cuda_workspace *ws = &st->ws;
    dispatch->topk_ids = ws->topk_ids;
    dispatch->num_tokens = step->counts->num_tokens;
    dispatch->top_k = d->top_k;
    dispatch->expert_begin = st->rank.experts.begin;
    dispatch->num_local_experts = d->num_local_experts;
    dispatch->tile_rows = tile_rows;
    dispatch->sorted_token = ws->sorted_token;
    dispatch->assignment_row = ws->assignment_row;
    dispatch->tiles = ws->tiles;
    dispatch->num_tiles = ws->moe_counters;
    dispatch->num_sorted = ws->moe_counters + 1;
}

static glmrt_status glmrt_layer_router_logits(const glmrt_step_context *step, const glmrt_cuda_layer *layer,
                                              int32_t first_row, int32_t num_rows)
{
    glmrt_cuda_state *st = step->state;
    const glmrt_cuda_dims *d = &st->dims;
    const float *x = st->ws.normed + (int64_t)first_row * d->hidden;
    float *logits = st->ws.router_logits + (int64_t)first_row * d->num_experts;
    if (glmrt_cuda_router_supports(&layer->router)) {
        return glmrt_cuda_router_logits(&layer->router, x, d->hidden, num_rows, logits, d->num_experts, step->stream,
                                        step->error);
    }
    return glmrt_cuda_gemm_dense(&layer->router, x, d->hidden, logits, d->num_experts, num_rows, nullptr, 0,
                                 step->stream, step->error);
}

static glmrt_status glmrt_layer_route_own_rows(glmrt_step_context *step, const glmrt_cuda_layer *layer,
                                               glmrt_cuda_route_args *route, const glmrt_cuda_dispatch_args *dispatch)
{
    glmrt_cuda_state *st = step->state;
    const int32_t t = step->counts->num_tokens;
    const int32_t k = st->dims.top_k;
    const glmrt_step_rows own = glmrt_step_own_rows(st, t);
    GLMRT_TRY(glmrt_layer_router_logits(step, layer, own.begin, own.end - own.begin));
    route->logits += (int64_t)own.begin * st->dims.num_experts;
    route->topk_ids += (int64_t)own.begin * k;
    route->topk_weights += (int64_t)own.begin * k;
    route->num_tokens = own.end - own.begin;
    GLMRT_TRY(glmrt_cuda_moe_route(route, step->stream, step->error));
    glmrt_cuda_peer_row_gather rows = glmrt_step_row_gather(step);
    if (step->rows_owned) {
        glmrt_step_add_operand_rows(&rows, glmrt_step_operand(step, &glmrt_cuda_matmuls::rows));
    }
    glmrt_cuda_peer_row_gather_add(&rows, st->ws.topk_ids, k);
    glmrt_cuda_peer_row_gather_add(&rows, st->ws.topk_weights, k);
    GLMRT_TRY(glmrt_step_gather_rows(step, &rows));
    return glmrt_cuda_moe_dispatch(dispatch, step->stream, step->error);
}

static glmrt_status glmrt_layer_route(glmrt_step_context *step, const glmrt_cuda_layer *layer, int32_t tile_rows)
{
    glmrt_cuda_state *st = step->state;
    const glmrt_cuda_dims *d = &st->dims;
    glmrt_cuda_workspace *ws = &st->ws;
    int32_t t = step->counts->num_tokens;
    glmrt_cuda_route_args route;
    glmrt_cuda_dispatch_args dispatch;
    glmrt_layer_route_args(step, layer, &route);
    glmrt_layer_dispatch_args(step, tile_rows, &dispatch);
    if (step->routes_own_rows) {
        return glmrt_layer_route_own_rows(step, layer, &route, &dispatch);
    }
    if (glmrt_cuda_router_resident_fits(&layer->router, t)) {
        glmrt_cuda_route_resident_args resident;
        resident.router = &layer->router;
        resident.x = ws->normed;
        resident.x_stride = d->hidden;
        resident.logits = ws->router_logits;
        resident.route = &route;
        resident.dispatch = &dispatch;
        resident.arrivals = ws->moe_counters + GLMRT_MOE_ARRIVALS_COUNTER;
        return glmrt_cuda_route_resident(&resident, step->stream, step->error);
    }
    GLMRT_TRY(glmrt_layer_router_logits(step, layer, 0, t));
    return glmrt_cuda_moe_route_dispatch(&route, &dispatch, step->stream, step->error);
}

static glmrt_status glmrt_layer_shared_expert_beside(glmrt_step_context *step, const glmrt_cuda_layer *layer)
{
    glmrt_cuda_state *st = step->state;
    glmrt_step_context beside = *step;
    beside.stream = st->shared_stream;
    GLMRT_CUDA_TRY(step->error, cudaStreamWaitEvent(beside.stream, st->shared_fork, 0));
    GLMRT_TRY(glmrt_layer_gated_mlp(&beside, &layer->shared_gate_up, &layer->shared_down,
                                    &glmrt_cuda_matmuls::shared_act, st->ws.shared_out, 0));
    GLMRT_CUDA_TRY(step->error, cudaEventRecord(st->shared_join, beside.stream));
    return GLMRT_OK;
}

static glmrt_status glmrt_layer_moe(glmrt_step_context *step, const glmrt_cuda_layer *layer)
{
    glmrt_cuda_state *st = step->state;
    const glmrt_cuda_dims *d = &st->dims;
    glmrt_cuda_workspace *ws = &st->ws;
    int32_t t = step->counts->num_tokens;
    int32_t tile_rows = glmrt_expert_tile_rows(d, t, glmrt_layer_experts_native(layer));
    if (layer->has_shared && !step->rows_owned) {
        GLMRT_CUDA_TRY(step->error, cudaEventRecord(st->shared_fork, step->stream));
    }
    GLMRT_TRY(glmrt_layer_route(step, layer, tile_rows));
    if (layer->has_shared && step->rows_owned) {
        GLMRT_CUDA_TRY(step->error, cudaEventRecord(st->shared_fork, step->stream));
    }
    if (layer->has_shared) {
        GLMRT_TRY(glmrt_layer_shared_expert_beside(step, layer));
    }
    GLMRT_TRY(glmrt_layer_experts(step, layer, tile_rows));
    if (layer->has_shared) {
        GLMRT_CUDA_TRY(step->error, cudaStreamWaitEvent(step->stream, st->shared_join, 0));
    }
    glmrt_cuda_combine_args combine;
    combine.expert_out = ws->expert_out;
    combine.assignment_row = ws->assignment_row;
    combine.topk_weights = ws->topk_weights;
    combine.top_k = d->top_k;
    combine.shared_out = layer->has_shared ? ws->shared_out : nullptr;
    combine.hidden = glmrt_step_sum_target(step);
    combine.add_residual = st->owns_residual;
    combine.num_tokens = t;
    combine.hidden_size = d->hidden;
    GLMRT_TRY(glmrt_cuda_moe_combine(&combine, step->stream, step->error));
    return glmrt_step_reduce(step, t);
}

static glmrt_status glmrt_layer_run(glmrt_step_context *step, int32_t index)
{
    glmrt_cuda_state *st = step->state;
    const glmrt_cuda_layer *layer = &st->model.layers[index];
    GLMRT_TRY(glmrt_layer_attention(step, index));
    const glmrt_cuda_matrix *gate_up = layer->is_moe ? (layer->has_shared ? &layer->shared_gate_up : nullptr)
                                                     : &layer->dense_gate_up;
    GLMRT_TRY(glmrt_step_norm_input(step, layer->post_attention_norm, gate_up, !layer->is_moe));
    if (layer->is_moe) {
        return glmrt_layer_moe(step, layer);
    }
    GLMRT_TRY(glmrt_layer_gated_mlp(step, &layer->dense_gate_up, &layer->dense_down, &glmrt_cuda_matmuls::dense_act,
                                    glmrt_step_sum_target(step), st->owns_residual));
    return glmrt_step_reduce(step, step->counts->num_tokens);
}

static glmrt_status glmrt_step_logits(const glmrt_step_context *step)
{
    glmrt_cuda_state *st = step->state;
    const glmrt_cuda_dims *d = &st->dims;
    glmrt_cuda_workspace *ws = &st->ws;
    int32_t samples = step->counts->num_samples;
    glmrt_step_norm_target target;
    target.weight = st->model.final_norm;
    target.x_rows = step->view.sample_rows;
    target.first_row = 0;
    target.num_rows = samples;
    target.y = ws->sample_hidden;
    target.rounds = st->model.lm_head.qgemm != nullptr;
    target.operand = &glmrt_cuda_matmuls::head;
    GLMRT_TRY(glmrt_step_norm(step, &target));
    float *slice = ws->logits + (d->samples ? st->rank.vocab_rows.begin : 0);
    return glmrt_step_dense_rounded(step, &st->model.lm_head, &glmrt_cuda_matmuls::head, ws->sample_hidden, d->hidden,
                                    slice, d->logits_cols, samples, nullptr, 0);
}

static glmrt_status glmrt_step_gather_logits(const glmrt_step_context *step)
{
    glmrt_cuda_state *st = step->state;
    GLMRT_TRY(glmrt_step_check_peers(step));
    glmrt_cuda_logits_gather gather;
    gather.comm = st->comm;
    gather.plan = st->plan;
    gather.rank = &st->rank;
    gather.logits = st->ws.logits;
    gather.parts = st->ws.logits_parts;
    gather.rows = step->counts->num_samples;
    gather.vocab = st->dims.vocab;
    return glmrt_cuda_gather_logits(&gather, step->stream, step->error);
}

static glmrt_status glmrt_step_sample_tokens(const glmrt_step_context *step, int32_t *host_tokens)
{
    glmrt_cuda_workspace *ws = &step->state->ws;
    glmrt_cuda_sample_args sample;
    sample.logits = ws->logits;
    sample.num_rows = step->counts->num_samples;
    sample.params = step->view.sample_params;
    sample.history = step->view.history;
    sample.needs_sort = step->counts->needs_sort;
    sample.out_tokens = ws->sampled;
    sample.host_tokens = host_tokens;
    sample.logits_only = !step->counts->needs_sort && step->counts->num_history == 0;
    return glmrt_cuda_sample(&ws->sampler, &sample, step->stream, step->error);
}

static int32_t glmrt_step_samples(const glmrt_step_context *step)
{
    return step->state->dims.samples ? step->counts->num_samples : 0;
}

static glmrt_status glmrt_step_gather_residual_rows(const glmrt_step_context *step)
{
    glmrt_cuda_peer_row_gather gather = glmrt_step_row_gather(step);
    glmrt_cuda_peer_row_gather_add(&gather, step->state->ws.hidden, step->state->dims.hidden);
    return glmrt_step_gather_rows(step, &gather);
}

static glmrt_status glmrt_step_body(glmrt_step_context *step)
{
    glmrt_cuda_state *st = step->state;
    GLMRT_TRY(glmrt_cuda_embed(&st->model.embed, step->view.token_ids, st->ws.sampled, step->counts->num_tokens,
                               st->ws.hidden, step->stream, step->error));
    for (int32_t i = 0; i < st->dims.num_layers; ++i) {
        GLMRT_TRY(glmrt_layer_run(step, i));
    }
    if (step->counts->num_samples <= 0) {
        return GLMRT_OK;
    }
    if (step->rows_owned) {
        GLMRT_TRY(glmrt_step_gather_residual_rows(step));
    }
    if (st->dims.has_head) {
        GLMRT_TRY(glmrt_step_logits(step));
    }
    return glmrt_step_gather_logits(step);
}

static void glmrt_step_context_init(glmrt_cuda_state *st, const glmrt_cuda_step_counts *counts,
                                    glmrt_step_context *step)
{
    step->state = st;
    step->decode_path = GLMRT_ATTENTION_DECODE_AUTO;
    step->counts = counts;
    step->error = st->error;
    step->stream = st->stream;
    step->rows_owned = glmrt_step_can_own_rows(st, counts->num_tokens);
    step->routes_own_rows = step->rows_owned || glmrt_step_can_route_own_rows(st, counts->num_tokens);
    glmrt_cuda_dependent_launches_set(st->engine->options.dependent_launches == GLMRT_DEPENDENT_LAUNCHES_DEFAULT);
    glmrt_cuda_step_view_at(counts, st->ws.step_inputs, &step->view);
}

static glmrt_status glmrt_step_upload(const glmrt_cuda_state *st, const glmrt_cuda_step_counts *counts,
                                      const uint8_t *host_inputs)
{
    glmrt_error *error = st->error;
    GLMRT_TRY(glmrt_cuda_step_fetch(st->ws.step_inputs, host_inputs, counts->bytes, st->stream, error));
    if (counts->history_bytes > 0) {
        GLMRT_CUDA_TRY(error, cudaMemcpyAsync(st->ws.step_inputs + counts->history_offset,
                                              host_inputs + counts->history_offset, (size_t)counts->history_bytes,
                                              cudaMemcpyHostToDevice, st->stream));
    }
    return GLMRT_OK;
}

static glmrt_status glmrt_step_launch(glmrt_step_context *step)
{
    if (step->counts->bucket <= 0) {
        return glmrt_step_body(step);
    }
    cudaGraphExec_t graph = glmrt_cuda_decode_graph_of(step->state, step->counts->bucket,
                                                       glmrt_cuda_step_device_decode_items(step->counts));
    if (graph == nullptr) {
        return glmrt_error_set(step->error, GLMRT_ERR_INVARIANT, "no decode graph was captured for %d rows",
                               step->counts->bucket);
    }
    GLMRT_CUDA_TRY(step->error, cudaGraphLaunch(graph, step->stream));
    return GLMRT_OK;
}

static void glmrt_forward_mark_waiting(glmrt_cuda_state *st, int32_t waiting)
{
    if (st->waiting_for_stream != nullptr) {
        __atomic_store_n(st->waiting_for_stream, waiting, __ATOMIC_RELEASE);
    }
}

glmrt_status glmrt_cuda_forward_capture(glmrt_cuda_state *st, const glmrt_cuda_step_counts *counts,
                                        int32_t decode_path, cudaGraphExec_t *out)
{
    *out = nullptr;
    glmrt_step_context step;
    glmrt_step_context_init(st, counts, &step);
    step.decode_path = decode_path;
    GLMRT_CUDA_TRY(st->error, cudaStreamBeginCapture(st->stream, cudaStreamCaptureModeThreadLocal));
    glmrt_status status = glmrt_step_body(&step);
    cudaGraph_t graph = nullptr;
    cudaError_t ended = cudaStreamEndCapture(st->stream, &graph);
    if (status == GLMRT_OK && ended != cudaSuccess) {
        status = glmrt_error_set(st->error, GLMRT_ERR_BACKEND, "capturing the decode step of %d rows failed: %s",
                                 counts->bucket, cudaGetErrorString(ended));
    }
    if (status == GLMRT_OK) {
        cudaError_t made = cudaGraphInstantiate(out, graph, 0);
        if (made != cudaSuccess) {
            *out = nullptr;
            status = glmrt_error_set(st->error, GLMRT_ERR_BACKEND, "instantiating the decode graph of %d rows failed: %s",
                                     counts->bucket, cudaGetErrorString(made));
        }
    }
    if (graph != nullptr) {
        cudaGraphDestroy(graph);
    }
    cudaGetLastError();
    return status;
}

glmrt_status glmrt_cuda_forward_padded_warm_up(glmrt_cuda_state *st, const glmrt_cuda_step_counts *counts,
                                               const uint8_t *host_inputs)
{
    glmrt_step_context step;
    glmrt_step_context_init(st, counts, &step);
    GLMRT_TRY(glmrt_step_upload(st, counts, host_inputs));
    GLMRT_TRY(glmrt_step_body(&step));
    glmrt_forward_mark_waiting(st, 1);
    cudaError_t synced = cudaStreamSynchronize(st->stream);
    glmrt_forward_mark_waiting(st, 0);
    GLMRT_CUDA_TRY(st->error, synced);
    return GLMRT_OK;
}

glmrt_status glmrt_cuda_forward_enqueue(glmrt_cuda_state *st, const glmrt_cuda_step_counts *counts,
                                        const uint8_t *host_inputs, float *out_logits, glmrt_token *out_sampled)
{
    glmrt_error *error = st->error;
    if (st->flights_queued >= GLMRT_CUDA_FLIGHTS) {
        return glmrt_error_set(error, GLMRT_ERR_INVARIANT, "%d CUDA steps are already in flight on device %d",
                               st->flights_queued, st->device);
    }
    glmrt_cuda_flight *flight = &st->flights[(st->flight_head + st->flights_queued) % GLMRT_CUDA_FLIGHTS];
    flight->pending_samples = 0;
    flight->pending_sampled = nullptr;
    GLMRT_CUDA_TRY(error, cudaSetDevice(st->device));
    glmrt_step_context step;
    glmrt_step_context_init(st, counts, &step);
    flight->rows_owned = counts->bucket > 0 ? glmrt_step_can_own_rows(st, counts->bucket) : step.rows_owned;
    GLMRT_CUDA_TRY(error, cudaEventRecord(flight->started, st->stream));
    GLMRT_TRY(glmrt_step_upload(st, counts, host_inputs));
    GLMRT_TRY(glmrt_step_launch(&step));
    int32_t samples = glmrt_step_samples(&step);
    if (samples > 0) {
        GLMRT_TRY(glmrt_step_sample_tokens(&step, flight->host_sampled));
        if (out_logits != nullptr) {
            GLMRT_CUDA_TRY(error, cudaMemcpyAsync(out_logits, st->ws.logits,
                                                  (size_t)samples * st->dims.logits_cols * sizeof(float),
                                                  cudaMemcpyDeviceToHost, st->stream));
        }
    }
    GLMRT_CUDA_TRY(error, cudaEventRecord(flight->finished, st->stream));
    flight->pending_samples = samples;
    flight->pending_sampled = out_sampled;
    st->flights_queued += 1;
    return GLMRT_OK;
}

glmrt_status glmrt_cuda_forward_wait(glmrt_cuda_state *st, int64_t *out_device_ns)
{
    glmrt_error *error = st->error;
    *out_device_ns = 0;
    if (st->flights_queued <= 0) {
        return GLMRT_OK;
    }
    glmrt_cuda_flight *flight = &st->flights[st->flight_head];
    st->flight_head = (st->flight_head + 1) % GLMRT_CUDA_FLIGHTS;
    st->flights_queued -= 1;
    st->last_rows_owned = flight->rows_owned;
    GLMRT_CUDA_TRY(error, cudaSetDevice(st->device));
    glmrt_forward_mark_waiting(st, 1);
    GLMRT_CUDA_TRY(error, cudaEventSynchronize(flight->finished));
    float elapsed_ms = 0.0f;
    GLMRT_CUDA_TRY(error, cudaEventElapsedTime(&elapsed_ms, flight->started, flight->finished));
    *out_device_ns = (int64_t)((double)elapsed_ms * 1.0e6);
    if (flight->pending_samples > 0 && flight->pending_sampled != nullptr) {
        memcpy(flight->pending_sampled, flight->host_sampled, (size_t)flight->pending_samples * sizeof(int32_t));
    }
    flight->pending_samples = 0;
    flight->pending_sampled = nullptr;
    return GLMRT_OK;
}

glmrt_status glmrt_cuda_forward_packed(glmrt_cuda_state *st, const glmrt_cuda_step_counts *counts,
                                       const uint8_t *host_inputs, float *out_logits, glmrt_token *out_sampled)
{
    GLMRT_TRY(glmrt_cuda_forward_enqueue(st, counts, host_inputs, out_logits, out_sampled));
    return glmrt_cuda_forward_wait(st, &st->last_device_ns);
}
