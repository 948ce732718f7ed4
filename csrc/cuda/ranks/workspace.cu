#include <string.h>

#include "cuda_check.cuh"
#include "device_arena.cuh"
#include "device_math.cuh"
#include "moe.cuh"
#include "rank_state.cuh"


static int32_t glmrt_max_i32(int32_t a, int32_t b)
{
    return a > b ? a : b;
}

static int32_t glmrt_rotary_dim(int32_t head_dim, float factor)
{
    int32_t dim = (int32_t)((double)head_dim * (double)factor);
    if (dim > head_dim) {
        dim = head_dim;
    }
    if (dim < 0) {
        dim = 0;
    }
    return dim & ~1;
}

glmrt_status glmrt_cuda_dims_derive(const glmrt_engine *engine, const glmrt_rank *rank, glmrt_cuda_dims *d,
                                    glmrt_error *error)
{
    const glmrt_model_config *c = &engine->config;
    const glmrt_engine_options *o = &engine->options;
    memset(d, 0, sizeof(*d));
    d->num_layers = c->num_hidden_layers;
    d->hidden = c->hidden_size;
    d->vocab = c->vocab_size;
    d->vocab_local = rank->vocab_rows.count;
    d->has_head = d->vocab_local > 0;
    d->samples = rank->index == 0;
    d->logits_cols = d->samples ? d->vocab : d->vocab_local;
    d->head_dim = c->head_dim;
    d->num_q_heads = rank->q_heads.count;
    d->num_kv_heads = rank->kv_heads.count;
    d->group = rank->kv_heads.count > 0 ? rank->q_heads.count / rank->kv_heads.count : 1;
    d->q_width = d->num_q_heads * d->head_dim;
    d->kv_width = d->num_kv_heads * d->head_dim;
    d->qkv_width = d->q_width + 2 * d->kv_width;
    d->rotary_dim = glmrt_rotary_dim(c->head_dim, c->partial_rotary_factor);
    d->has_moe = c->first_k_dense_replace < c->num_hidden_layers;
    d->dense_width = c->first_k_dense_replace > 0 ? rank->dense_columns.count : 0;
    d->shared_width = d->has_moe ? rank->shared_columns.count : 0;
    d->mlp_width = glmrt_max_i32(glmrt_max_i32(d->dense_width, d->shared_width), 1);
    d->max_tokens = o->max_tokens_per_step;
    d->max_batch = o->max_batch;
    d->max_partials = GLMRT_ATTENTION_MAX_SPLITS * d->max_batch;
    d->bf16_partials = o->all_reduce == GLMRT_ALL_REDUCE_PEER_BF16 && rank->num_ranks > 1;
    if (c->hidden_size % GLMRT_CUDA_PIECE != 0) {
        return glmrt_error_set(error, GLMRT_ERR_UNSUPPORTED, "CUDA backend needs hidden_size divisible by %d, got %d",
                               GLMRT_CUDA_PIECE, c->hidden_size);
    }
    if (!d->has_moe) {
        return GLMRT_OK;
    }
    d->expert_width = rank->expert_columns.count;
    d->num_experts = c->n_routed_experts;
    d->num_local_experts = rank->experts.count;
    d->top_k = c->num_experts_per_tok;
    d->num_groups = c->n_group > 0 ? c->n_group : 1;
    d->keep_groups = c->topk_group > 0 && c->topk_group < d->num_groups ? c->topk_group : d->num_groups;
    GLMRT_TRY(glmrt_cuda_moe_check(d->num_experts, d->top_k, d->num_groups, error));
    d->max_assignments = d->max_tokens * d->top_k;
    d->max_expert_tiles = glmrt_cuda_moe_max_tiles(d->max_assignments, d->num_local_experts, 1);
    return GLMRT_OK;
}

static void glmrt_cuda_workspace_layout_activations(const glmrt_cuda_dims *d, glmrt_cuda_arena *arena,
                                                    glmrt_cuda_workspace *ws)
{
    int64_t t = d->max_tokens;
    int64_t a = d->max_assignments > 0 ? d->max_assignments : 1;
    int64_t b = d->max_batch;
    if (d->activation_bytes > 0) {
        int64_t wide = glmrt_max_i32(d->q_width, d->mlp_width);
        ws->act_rows = glmrt_cuda_arena_take(arena, t * d->hidden * d->activation_bytes);
        ws->act_row_scales = glmrt_cuda_arena_array<float>(arena, t);
        ws->act_wide = glmrt_cuda_arena_take(arena, t * wide * d->activation_bytes);
        ws->act_wide_scales = glmrt_cuda_arena_array<float>(arena, t);
        if (d->has_moe) {
            ws->act_expert_in = glmrt_cuda_arena_take(arena, a * d->hidden * d->activation_bytes);
            ws->act_expert_in_scales = glmrt_cuda_arena_array<float>(arena, a);
            ws->act_expert = glmrt_cuda_arena_take(arena, a * d->expert_width * d->activation_bytes);
            ws->act_expert_scales = glmrt_cuda_arena_array<float>(arena, a);
        }
    }
    if (d->head_activation_bytes > 0) {
        ws->act_head = glmrt_cuda_arena_take(arena, b * d->hidden * d->head_activation_bytes);
        ws->act_head_scales = glmrt_cuda_arena_array<float>(arena, b);
    }
    if (d->max_split_n > 0) {
        ws->split_partials =
            glmrt_cuda_arena_array<float>(arena, glmrt_cuda_qgemm_split_partial_elements(d->max_split_units));
        ws->split_counters = glmrt_cuda_arena_array<int32_t>(arena, glmrt_cuda_qgemm_split_counters(d->max_split_n));
    }
}

void glmrt_cuda_workspace_layout(const glmrt_cuda_dims *d, const glmrt_cuda_step_capacity *capacity,
                                 size_t sort_bytes, uint8_t *base, glmrt_cuda_workspace *ws, int64_t *out_bytes)
{
    glmrt_cuda_arena arena;
    arena.base = base;
    arena.used = 0;
    int64_t t = d->max_tokens;
    int64_t a = d->max_assignments > 0 ? d->max_assignments : 1;
    int64_t b = d->max_batch;
    memset(ws, 0, sizeof(*ws));
    ws->hidden = glmrt_cuda_arena_array<float>(&arena, t * d->hidden);
    if (d->bf16_partials) {
        ws->partial = glmrt_cuda_arena_array<float>(&arena, t * d->hidden);
    }
    ws->normed = glmrt_cuda_arena_array<float>(&arena, t * d->hidden);
    ws->qkv = glmrt_cuda_arena_array<float>(&arena, t * d->qkv_width);
    ws->attn = glmrt_cuda_arena_array<float>(&arena, t * d->q_width);
    ws->mlp_gate_up = glmrt_cuda_arena_array<float>(&arena, t * 2 * d->mlp_width);
    ws->mlp_act = glmrt_cuda_arena_array<float>(&arena, t * d->mlp_width);
    if (d->has_moe) {
        ws->shared_out = glmrt_cuda_arena_array<float>(&arena, t * d->hidden);
        ws->router_logits = glmrt_cuda_arena_array<float>(&arena, t * d->num_experts);
        ws->topk_ids = glmrt_cuda_arena_array<int32_t>(&arena, a);
        ws->topk_weights = glmrt_cuda_arena_array<float>(&arena, a);
        ws->sorted_token = glmrt_cuda_arena_array<int32_t>(&arena, a);
        ws->assignment_row = glmrt_cuda_arena_array<int32_t>(&arena, a);
        ws->tiles = glmrt_cuda_arena_array<glmrt_cuda_gemm_tile>(&arena, d->max_expert_tiles);
        ws->moe_counters = glmrt_cuda_arena_array<int32_t>(&arena, GLMRT_MOE_COUNTERS);
        ws->expert_gate_up = glmrt_cuda_arena_array<float>(&arena, a * 2 * d->expert_width);
        ws->expert_act = glmrt_cuda_arena_array<float>(&arena, a * d->expert_width);
        ws->expert_out = glmrt_cuda_arena_array<float>(&arena, a * d->hidden);
    }
    ws->partial_out = glmrt_cuda_arena_array<float>(&arena, (int64_t)d->max_partials * d->q_width);
    ws->partial_stats = glmrt_cuda_arena_array<float>(&arena, (int64_t)d->max_partials * d->num_q_heads * 2);
    ws->sample_hidden = glmrt_cuda_arena_array<float>(&arena, b * d->hidden);
    ws->logits = glmrt_cuda_arena_array<float>(&arena, b * d->logits_cols);
    if (d->samples && d->vocab_local < d->vocab) {
        ws->logits_parts = glmrt_cuda_arena_array<float>(&arena, b * (d->vocab - d->vocab_local));
    }
    ws->sampled = glmrt_cuda_arena_array<int32_t>(&arena, b);
    ws->step_inputs = glmrt_cuda_arena_take(&arena, glmrt_cuda_step_capacity_bytes(capacity));
    glmrt_cuda_workspace_layout_activations(d, &arena, ws);
    glmrt_cuda_sampler *s = &ws->sampler;
    int64_t cells = d->samples ? b * d->vocab : 0;
    s->max_rows = d->max_batch;
    s->vocab_size = d->samples ? d->vocab : 0;
    s->values = glmrt_cuda_arena_array<float>(&arena, cells);
    s->counts = glmrt_cuda_arena_array<int32_t>(&arena, cells);
    s->keys_in = glmrt_cuda_arena_array<uint32_t>(&arena, cells);
    s->keys_out = glmrt_cuda_arena_array<uint32_t>(&arena, cells);
    s->ids_in = glmrt_cuda_arena_array<int32_t>(&arena, cells);
    s->ids_out = glmrt_cuda_arena_array<int32_t>(&arena, cells);
    s->row_offsets = glmrt_cuda_arena_array<int32_t>(&arena, b + 1);
    s->argmax_keys = glmrt_cuda_arena_array<unsigned long long>(&arena, b);
    s->argmax_arrivals = glmrt_cuda_arena_array<uint32_t>(&arena, b);
    s->sort_temp = glmrt_cuda_arena_take(&arena, (int64_t)sort_bytes);
    s->sort_temp_bytes = sort_bytes;
    *out_bytes = arena.used;
}
