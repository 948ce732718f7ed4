#include <string.h>

#include "activation_quant.cuh"
#include "cuda_check.cuh"
#include "device_math.cuh"
#include "moe.cuh"
#include "ops.cuh"
#include "rank_reduce.cuh"
#include "rank_state.cuh"

typedef struct glmrt_step_context {
    glmrt_cuda_state *state;
    const glmrt_cuda_step_counts *counts;
    glmrt_cuda_step_view view;
    glmrt_error *error;
    cudaStream_t stream;
} glmrt_step_context;

static const glmrt_cuda_qgemm_operand *glmrt_step_operand(const glmrt_step_context *step,
                                                         glmrt_cuda_qgemm_operand glmrt_cuda_matmuls::*which)
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

static glmrt_status glmrt_step_reduce(const glmrt_step_context *step, int32_t rows)
{
    glmrt_cuda_state *st = step->state;
    GLMRT_TRY(glmrt_step_check_peers(step));
    return glmrt_cuda_reduce_hidden(st->comm, st->ws.hidden, (int64_t)rows * st->dims.hidden, step->stream,
                                    step->error);
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

static glmrt_status glmrt_step_native_dense(const glmrt_step_context *step, const glmrt_cuda_matrix *w,
                                            const glmrt_cuda_qgemm_operand *x, float *y, int64_t y_stride,
                                            int32_t num_rows, const float *bias, int32_t accumulate)
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
    return glmrt_cuda_qgemm_run(&call, &step->state->matmuls->split, step->stream, step->error);
}

static glmrt_status glmrt_step_dense(const glmrt_step_context *step, const glmrt_cuda_matrix *w,
                                     const glmrt_cuda_qgemm_operand *x_native, const float *x, int64_t x_stride,
                                     float *y, int64_t y_stride, int32_t num_rows, const float *bias,
                                     int32_t accumulate)
{
    if (w->qgemm != nullptr) {
        GLMRT_TRY(glmrt_step_quantize(step, x_native, x, x_stride, nullptr, GLMRT_ACTIVATION_COPY, num_rows, nullptr));
        return glmrt_step_native_dense(step, w, x_native, y, y_stride, num_rows, bias, accumulate);
    }
    return glmrt_cuda_gemm_dense(w, x, x_stride, y, y_stride, num_rows, bias, accumulate, step->stream, step->error);
}

static glmrt_status glmrt_layer_attention(glmrt_step_context *step, int32_t index)
{
    glmrt_cuda_state *st = step->state;
    const glmrt_cuda_dims *d = &st->dims;
    const glmrt_cuda_layer *layer = &st->model.layers[index];
    glmrt_cuda_workspace *ws = &st->ws;
    const glmrt_model_config *config = &st->engine->config;
    int32_t t = step->counts->num_tokens;
    GLMRT_TRY(glmrt_cuda_rmsnorm(ws->hidden, d->hidden, nullptr, t, layer->input_norm, d->hidden, st->rms_eps,
                                 ws->normed, d->hidden, step->stream, step->error));
    GLMRT_TRY(glmrt_step_dense(step, &layer->qkv, glmrt_step_operand(step, &glmrt_cuda_matmuls::rows), ws->normed,
                               d->hidden, ws->qkv, d->qkv_width, t, layer->qkv_bias, 0));
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
    GLMRT_TRY(glmrt_cuda_qk_rope_store(&rope, step->stream, step->error));
    glmrt_cuda_attention_args attention;
    attention.q = ws->qkv;
    attention.q_stride = d->qkv_width;
    attention.positions = step->view.positions;
    attention.seq_page_begin = step->view.seq_page_begin;
    attention.page_ids = step->view.page_ids;
    attention.kv = st->kv;
    attention.layer = index;
    attention.group = d->group;
    attention.scale = st->attention_scale;
    attention.out = ws->attn;
    attention.out_stride = d->q_width;
    attention.partial_out = ws->partial_out;
    attention.partial_stats = ws->partial_stats;
    attention.items = step->view.decode_items;
    attention.num_items = step->counts->num_decode_items;
    GLMRT_TRY(glmrt_cuda_attention_run(&attention, 1, step->stream, step->error));
    attention.items = step->view.prefill_items;
    attention.num_items = step->counts->num_prefill_items;
    GLMRT_TRY(glmrt_cuda_attention_run(&attention, st->capacity.prefill_tokens_per_item, step->stream, step->error));
    GLMRT_TRY(glmrt_cuda_attention_merge_run(step->view.merges, step->counts->num_merges, d->num_q_heads, d->group,
                                             d->num_kv_heads, d->head_dim, ws->partial_out, ws->partial_stats,
                                             ws->attn, d->q_width, step->stream, step->error));
    GLMRT_TRY(glmrt_step_dense(step, &layer->o_proj, glmrt_step_operand(step, &glmrt_cuda_matmuls::attention),
                               ws->attn, d->q_width, ws->hidden, d->hidden, t, nullptr, st->owns_residual));
    return glmrt_step_reduce(step, t);
}

static glmrt_status glmrt_layer_gated_mlp(glmrt_step_context *step, const glmrt_cuda_matrix *gate_up,
                                          const glmrt_cuda_matrix *down, glmrt_cuda_qgemm_operand glmrt_cuda_matmuls::*act,
                                          float *out, int32_t accumulate)
{
    glmrt_cuda_state *st = step->state;
    const glmrt_cuda_dims *d = &st->dims;
    glmrt_cuda_workspace *ws = &st->ws;
    int32_t t = step->counts->num_tokens;
    int32_t width = down->cols;
    GLMRT_TRY(glmrt_step_dense(step, gate_up, glmrt_step_operand(step, &glmrt_cuda_matmuls::rows), ws->normed,
                               d->hidden, ws->mlp_gate_up, 2 * (int64_t)width, t, nullptr, 0));
    if (down->qgemm != nullptr) {
        const glmrt_cuda_qgemm_operand *x = glmrt_step_operand(step, act);
        GLMRT_TRY(glmrt_step_quantize(step, x, ws->mlp_gate_up, 2 * (int64_t)width, nullptr, GLMRT_ACTIVATION_SILU_MUL,
                                      t, nullptr));
        return glmrt_step_native_dense(step, down, x, out, d->hidden, t, nullptr, accumulate);
    }
    GLMRT_TRY(glmrt_cuda_silu_mul(ws->mlp_gate_up, width, t, nullptr, ws->mlp_act, step->stream, step->error));
    return glmrt_cuda_gemm_dense(down, ws->mlp_act, width, out, d->hidden, t, nullptr, accumulate, step->stream,
                                 step->error);
}

static int32_t glmrt_expert_tile_rows(const glmrt_cuda_dims *d, int32_t num_tokens, int32_t native)
{
    int32_t assignments = num_tokens * d->top_k;
    int32_t active = assignments < d->num_local_experts ? assignments : d->num_local_experts;
    int32_t rows_per_expert = active > 0 ? assignments / active : 1;
    return native ? glmrt_cuda_qgemm_tile_rows(rows_per_expert) : glmrt_cuda_gemm_tile_rows(rows_per_expert);
}

static glmrt_status glmrt_layer_experts_native(glmrt_step_context *step, const glmrt_cuda_layer *layer,
                                               int32_t tile_rows, int32_t grid_tiles)
{
    glmrt_cuda_state *st = step->state;
    const glmrt_cuda_dims *d = &st->dims;
    glmrt_cuda_workspace *ws = &st->ws;
    glmrt_cuda_matmuls *m = st->matmuls;
    int32_t assignments = step->counts->num_tokens * d->top_k;
    const int32_t *num_sorted = ws->moe_counters + 1;
    GLMRT_TRY(glmrt_step_quantize(step, &m->expert_in, ws->normed, d->hidden, ws->sorted_token, GLMRT_ACTIVATION_COPY,
                                  assignments, num_sorted));
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
    GLMRT_TRY(glmrt_cuda_qgemm_run(&call, &m->split, step->stream, step->error));
    GLMRT_TRY(glmrt_step_quantize(step, &m->expert_act, ws->expert_gate_up, 2 * (int64_t)d->expert_width, nullptr,
                                  GLMRT_ACTIVATION_SILU_MUL, assignments, num_sorted));
    call.w = &layer->experts_down;
    call.x = &m->expert_act;
    call.y = ws->expert_out;
    call.y_stride = d->hidden;
    return glmrt_cuda_qgemm_run(&call, &m->split, step->stream, step->error);
}

static glmrt_status glmrt_layer_experts(glmrt_step_context *step, const glmrt_cuda_layer *layer)
{
    glmrt_cuda_state *st = step->state;
    const glmrt_cuda_dims *d = &st->dims;
    glmrt_cuda_workspace *ws = &st->ws;
    int32_t t = step->counts->num_tokens;
    int32_t assignments = t * d->top_k;
    const int32_t native = layer->experts_gate_up.qgemm != nullptr && layer->experts_down.qgemm != nullptr;
    int32_t tile_rows = glmrt_expert_tile_rows(d, t, native);
    glmrt_cuda_dispatch_args dispatch;
    dispatch.topk_ids = ws->topk_ids;
    dispatch.num_tokens = t;
    dispatch.top_k = d->top_k;
    dispatch.expert_begin = st->rank.experts.begin;
    dispatch.num_local_experts = d->num_local_experts;
    dispatch.tile_rows = tile_rows;
    dispatch.expert_counts = ws->expert_counts;
    dispatch.sorted_token = ws->sorted_token;
    dispatch.assignment_row = ws->assignment_row;
    dispatch.tiles = ws->tiles;
    dispatch.num_tiles = ws->moe_counters;
    dispatch.num_sorted = ws->moe_counters + 1;
    GLMRT_TRY(glmrt_cuda_moe_dispatch(&dispatch, step->stream, step->error));
    int32_t grid_tiles = glmrt_cuda_moe_max_tiles(assignments, d->num_local_experts, tile_rows);
    if (native) {
        return glmrt_layer_experts_native(step, layer, tile_rows, grid_tiles);
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

static glmrt_status glmrt_layer_moe(glmrt_step_context *step, const glmrt_cuda_layer *layer)
{
    glmrt_cuda_state *st = step->state;
    const glmrt_cuda_dims *d = &st->dims;
    glmrt_cuda_workspace *ws = &st->ws;
    int32_t t = step->counts->num_tokens;
    GLMRT_TRY(glmrt_cuda_gemm_dense(&layer->router, ws->normed, d->hidden, ws->router_logits, d->num_experts, t,
                                    nullptr, 0, step->stream, step->error));
    glmrt_cuda_route_args route;
    route.logits = ws->router_logits;
    route.correction_bias = layer->router_bias;
    route.num_tokens = t;
    route.num_experts = d->num_experts;
    route.top_k = d->top_k;
    route.num_groups = d->num_groups;
    route.keep_groups = d->keep_groups;
    route.normalize = st->engine->config.norm_topk_prob;
    route.scaling = st->engine->config.routed_scaling_factor;
    route.topk_ids = ws->topk_ids;
    route.topk_weights = ws->topk_weights;
    GLMRT_TRY(glmrt_cuda_moe_route(&route, step->stream, step->error));
    GLMRT_TRY(glmrt_layer_experts(step, layer));
    if (layer->has_shared) {
        GLMRT_TRY(glmrt_layer_gated_mlp(step, &layer->shared_gate_up, &layer->shared_down,
                                        &glmrt_cuda_matmuls::shared_act, ws->shared_out, 0));
    }
    glmrt_cuda_combine_args combine;
    combine.expert_out = ws->expert_out;
    combine.assignment_row = ws->assignment_row;
    combine.topk_weights = ws->topk_weights;
    combine.top_k = d->top_k;
    combine.shared_out = layer->has_shared ? ws->shared_out : nullptr;
    combine.hidden = ws->hidden;
    combine.add_residual = st->owns_residual;
    combine.num_tokens = t;
    combine.hidden_size = d->hidden;
    GLMRT_TRY(glmrt_cuda_moe_combine(&combine, step->stream, step->error));
    return glmrt_step_reduce(step, t);
}

static glmrt_status glmrt_layer_run(glmrt_step_context *step, int32_t index)
{
    glmrt_cuda_state *st = step->state;
    const glmrt_cuda_dims *d = &st->dims;
    const glmrt_cuda_layer *layer = &st->model.layers[index];
    glmrt_cuda_workspace *ws = &st->ws;
    GLMRT_TRY(glmrt_layer_attention(step, index));
    GLMRT_TRY(glmrt_cuda_rmsnorm(ws->hidden, d->hidden, nullptr, step->counts->num_tokens, layer->post_attention_norm,
                                 d->hidden, st->rms_eps, ws->normed, d->hidden, step->stream, step->error));
    if (layer->is_moe) {
        return glmrt_layer_moe(step, layer);
    }
    GLMRT_TRY(glmrt_layer_gated_mlp(step, &layer->dense_gate_up, &layer->dense_down, &glmrt_cuda_matmuls::dense_act,
                                    ws->hidden, st->owns_residual));
    return glmrt_step_reduce(step, step->counts->num_tokens);
}

static glmrt_status glmrt_step_head(glmrt_step_context *step)
{
    glmrt_cuda_state *st = step->state;
    const glmrt_cuda_dims *d = &st->dims;
    glmrt_cuda_workspace *ws = &st->ws;
    int32_t samples = step->counts->num_samples;
    GLMRT_TRY(glmrt_cuda_rmsnorm(ws->hidden, d->hidden, step->view.sample_rows, samples, st->model.final_norm,
                                 d->hidden, st->rms_eps, ws->sample_hidden, d->hidden, step->stream, step->error));
    GLMRT_TRY(glmrt_step_dense(step, &st->model.lm_head, glmrt_step_operand(step, &glmrt_cuda_matmuls::head),
                               ws->sample_hidden, d->hidden, ws->logits, d->vocab_local, samples, nullptr, 0));
    glmrt_cuda_sample_args sample;
    sample.logits = ws->logits;
    sample.num_rows = samples;
    sample.params = step->view.sample_params;
    sample.history = step->view.history;
    sample.needs_sort = step->counts->needs_sort;
    sample.out_tokens = ws->sampled;
    return glmrt_cuda_sample(&ws->sampler, &sample, step->stream, step->error);
}

glmrt_status glmrt_cuda_forward_packed(glmrt_cuda_state *st, const glmrt_cuda_step_counts *counts,
                                       const uint8_t *host_inputs, float *out_logits, glmrt_token *out_sampled)
{
    glmrt_error *error = st->error;
    GLMRT_CUDA_TRY(error, cudaSetDevice(st->device));
    GLMRT_CUDA_TRY(error, cudaMemcpyAsync(st->ws.step_inputs, host_inputs, (size_t)counts->bytes,
                                          cudaMemcpyHostToDevice, st->stream));
    glmrt_step_context step;
    step.state = st;
    step.counts = counts;
    step.error = error;
    step.stream = st->stream;
    glmrt_cuda_step_view_at(counts, st->ws.step_inputs, &step.view);
    GLMRT_TRY(glmrt_cuda_embed(&st->model.embed, step.view.token_ids, counts->num_tokens, st->ws.hidden, st->stream,
                               error));
    for (int32_t i = 0; i < st->dims.num_layers; ++i) {
        GLMRT_TRY(glmrt_layer_run(&step, i));
    }
    int32_t samples = st->dims.has_head ? counts->num_samples : 0;
    if (samples > 0) {
        GLMRT_TRY(glmrt_step_head(&step));
        GLMRT_CUDA_TRY(error, cudaMemcpyAsync(st->host_sampled, st->ws.sampled, (size_t)samples * sizeof(int32_t),
                                              cudaMemcpyDeviceToHost, st->stream));
        if (out_logits != nullptr) {
            GLMRT_CUDA_TRY(error, cudaMemcpyAsync(out_logits, st->ws.logits,
                                                  (size_t)samples * st->dims.vocab_local * sizeof(float),
                                                  cudaMemcpyDeviceToHost, st->stream));
        }
    }
    if (st->waiting_for_stream != nullptr) {
        __atomic_store_n(st->waiting_for_stream, 1, __ATOMIC_RELEASE);
    }
    GLMRT_CUDA_TRY(error, cudaStreamSynchronize(st->stream));
    if (samples > 0 && out_sampled != nullptr) {
        memcpy(out_sampled, st->host_sampled, (size_t)samples * sizeof(int32_t));
    }
    return GLMRT_OK;
}
