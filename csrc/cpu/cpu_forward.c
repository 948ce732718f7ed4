#include <math.h>
#include <string.h>

#include "cpu_backend.h"
#include "norm_rope.h"

static void forward_embed_task(void *context, int32_t t, int32_t thread_index)
{
    glmrt_cpu_backend *b = context;
    const glmrt_cpu_dims *d = &b->dims;
    const glmrt_step_batch *batch = b->step.batch;
    float *hidden = b->act.hidden + (int64_t)t * d->hidden;
    glmrt_linear_dequant_row(&b->weights->embed, batch->token_ids[t], hidden);
    glmrt_rope_angles_fill(b->act.inv_freq, d->rotary_half, batch->positions[t],
                           b->act.rope_cos + (int64_t)t * d->rotary_half, b->act.rope_sin + (int64_t)t * d->rotary_half);
    glmrt_rms_norm_row(hidden, b->layers[0].input_norm, d->hidden, b->config.rms_norm_eps,
                       b->act.normed + (int64_t)t * d->hidden);
}

static void forward_heads_norm_rope(const glmrt_cpu_backend *b, float *heads, int32_t count, const float *norm,
                                    int32_t t)
{
    const glmrt_cpu_dims *d = &b->dims;
    const float *cos_values = b->act.rope_cos + (int64_t)t * d->rotary_half;
    const float *sin_values = b->act.rope_sin + (int64_t)t * d->rotary_half;
    for (int32_t h = 0; h < count; ++h) {
        float *head = heads + (int64_t)h * d->head_dim;
        if (norm != NULL) {
            glmrt_rms_norm_row(head, norm, d->head_dim, b->config.rms_norm_eps, head);
        }
        glmrt_rope_apply(head, d->rotary_half, cos_values, sin_values);
    }
}

static void forward_qk_store_task(void *context, int32_t t, int32_t thread_index)
{
    glmrt_cpu_backend *b = context;
    const glmrt_cpu_dims *d = &b->dims;
    const glmrt_cpu_layer_params *layer = b->step.layer;
    float *key = b->act.k + (int64_t)t * d->kv_dim;
    forward_heads_norm_rope(b, b->act.q + (int64_t)t * d->q_dim, d->num_heads, layer->q_norm, t);
    forward_heads_norm_rope(b, key, d->num_kv_heads, layer->k_norm, t);
    if (b->native_matmuls) {
        float *value = b->act.v + (int64_t)t * d->kv_dim;
        glmrt_round_bf16_span(key, key, d->kv_dim);
        glmrt_round_bf16_span(value, value, d->kv_dim);
    }
    glmrt_kv_cache_store_token(&b->kv, b->step.layer_index, b->step.batch, t, key,
                               b->act.v + (int64_t)t * d->kv_dim);
}

static void forward_residual_norm_task(void *context, int32_t t, int32_t thread_index)
{
    glmrt_cpu_backend *b = context;
    int32_t width = b->dims.hidden;
    float *hidden = b->act.hidden + (int64_t)t * width;
    if (b->step.residual_add != NULL) {
        const float *add = b->step.residual_add + (int64_t)t * width;
        for (int32_t i = 0; i < width; ++i) {
            hidden[i] += add[i];
        }
    }
    if (b->step.norm_weight != NULL) {
        glmrt_rms_norm_row(hidden, b->step.norm_weight, width, b->config.rms_norm_eps,
                           b->act.normed + (int64_t)t * width);
    }
}

static void forward_route_task(void *context, int32_t t, int32_t thread_index)
{
    glmrt_cpu_backend *b = context;
    const glmrt_cpu_dims *d = &b->dims;
    glmrt_moe_route_token(&b->config, b->act.router_logits + (int64_t)t * d->num_experts, b->step.layer->router_bias,
                          &b->threads[thread_index].router, b->act.route_experts + (int64_t)t * d->top_k,
                          b->act.route_weights + (int64_t)t * d->top_k);
}

static void forward_combine_task(void *context, int32_t t, int32_t thread_index)
{
    glmrt_cpu_backend *b = context;
    const glmrt_cpu_dims *d = &b->dims;
    const float *shared = d->shared_width > 0 ? b->act.proj + (int64_t)t * d->hidden : NULL;
    glmrt_moe_combine_token(b->act.expert_out + (int64_t)t * d->top_k * d->hidden,
                            b->act.route_weights + (int64_t)t * d->top_k, d->top_k, shared, d->hidden,
                            b->act.hidden + (int64_t)t * d->hidden);
    if (b->step.norm_weight != NULL) {
        glmrt_rms_norm_row(b->act.hidden + (int64_t)t * d->hidden, b->step.norm_weight, d->hidden,
                           b->config.rms_norm_eps, b->act.normed + (int64_t)t * d->hidden);
    }
}

static void forward_final_norm_task(void *context, int32_t i, int32_t thread_index)
{
    glmrt_cpu_backend *b = context;
    int32_t t = b->step.batch->sample_token_index[i];
    glmrt_rms_norm_row(b->act.hidden + (int64_t)t * b->dims.hidden, b->final_norm, b->dims.hidden,
                       b->config.rms_norm_eps, b->act.final_hidden + (int64_t)i * b->dims.hidden);
}

static void forward_sample_task(void *context, int32_t i, int32_t thread_index)
{
    glmrt_cpu_backend *b = context;
    const glmrt_step_batch *batch = b->step.batch;
    const glmrt_step_sample *sample = &batch->samples[i];
    b->step.sampled[i] = glmrt_sample_row(b->act.logits + (int64_t)i * b->dims.vocab, b->dims.vocab,
                                          sample->params, sample->history, sample->num_prompt_tokens,
                                          sample->num_history, &b->threads[thread_index].sampler);
}

static void forward_run(glmrt_cpu_backend *b, int32_t num_tasks, glmrt_threadpool_task_fn fn, int64_t task_work)
{
    glmrt_threadpool_run_sized(b->pool, num_tasks, fn, b, task_work * num_tasks);
}

static void forward_round_task(void *context, int32_t task, int32_t thread_index)
{
    glmrt_cpu_backend *b = context;
    const glmrt_cpu_rounding *r = &b->step.rounding;
    (void)thread_index;
    glmrt_linear_round_row(r->weight, r->x + (int64_t)task * r->x_stride, r->out + (int64_t)task * r->out_stride,
                           r->cols);
}

static const float *forward_native_input(glmrt_cpu_backend *b, const glmrt_linear *weight, const float *x,
                                         int64_t x_stride, float *out, int64_t out_stride, int32_t rows)
{
    if (!b->native_matmuls || !glmrt_linear_rounds_inputs(weight) || rows <= 0) {
        return x;
    }
    glmrt_cpu_rounding *r = &b->step.rounding;
    r->weight = weight;
    r->x = x;
    r->x_stride = x_stride;
    r->out = out;
    r->out_stride = out_stride;
    r->cols = weight->cols;
    forward_run(b, rows, forward_round_task, 4 * (int64_t)weight->cols);
    return out;
}

static glmrt_matmul_job forward_job(const glmrt_linear *weight, const glmrt_linear *up_weight, const float *bias,
                                    int32_t rows, const float *x, int64_t x_stride, float *y, int64_t y_stride)
{
    glmrt_matmul_job job;
    memset(&job, 0, sizeof(job));
    job.weight = weight;
    job.up_weight = up_weight;
    job.bias = bias;
    job.num_rows = rows;
    job.x = x;
    job.x_stride = x_stride;
    job.y = y;
    job.y_stride = y_stride;
    return job;
}

static glmrt_status forward_attention(glmrt_cpu_backend *b, int32_t rows, glmrt_error *error)
{
    const glmrt_cpu_dims *d = &b->dims;
    const glmrt_cpu_layer_params *layer = b->step.layer;
    const glmrt_layer_weights *w = layer->weights;
    glmrt_matmul_job *jobs = b->act.jobs;
    const float *x = forward_native_input(b, &w->q_proj, b->act.normed, d->hidden, b->act.native_rows, d->hidden, rows);
    jobs[0] = forward_job(&w->q_proj, NULL, layer->q_bias, rows, x, d->hidden, b->act.q, d->q_dim);
    jobs[1] = forward_job(&w->k_proj, NULL, layer->k_bias, rows, x, d->hidden, b->act.k, d->kv_dim);
    jobs[2] = forward_job(&w->v_proj, NULL, layer->v_bias, rows, x, d->hidden, b->act.v, d->kv_dim);
    glmrt_status status = glmrt_linear_run(&b->linear, jobs, 3, error);
    if (status != GLMRT_OK) {
        return status;
    }
    forward_run(b, rows, forward_qk_store_task, 4 * ((int64_t)d->q_dim + d->kv_dim));
    glmrt_attention_args args;
    args.cache = &b->kv;
    args.layer = b->step.layer_index;
    args.batch = b->step.batch;
    args.num_heads = d->num_heads;
    args.scale = (float)pow((double)d->head_dim, -0.5);
    args.q = b->act.q;
    args.out = b->act.attn;
    args.scores = b->threads[0].scores;
    args.scores_stride = b->thread_stride_bytes / (int64_t)sizeof(float);
    glmrt_attention_run(b->pool, &args);
    x = forward_native_input(b, &w->o_proj, b->act.attn, d->q_dim, b->act.attn, d->q_dim, rows);
    jobs[0] = forward_job(&w->o_proj, NULL, NULL, rows, x, d->q_dim, b->act.proj, d->hidden);
    status = glmrt_linear_run(&b->linear, jobs, 1, error);
    if (status != GLMRT_OK) {
        return status;
    }
    b->step.residual_add = b->act.proj;
    b->step.norm_weight = layer->post_attention_norm;
    forward_run(b, rows, forward_residual_norm_task, 3 * (int64_t)d->hidden);
    return GLMRT_OK;
}

static glmrt_status forward_dense_mlp(glmrt_cpu_backend *b, int32_t rows, glmrt_error *error)
{
    const glmrt_cpu_dims *d = &b->dims;
    const glmrt_layer_weights *w = b->step.layer->weights;
    int32_t width = b->config.intermediate_size;
    glmrt_matmul_job *jobs = b->act.jobs;
    const float *x = forward_native_input(b, &w->mlp_gate, b->act.normed, d->hidden, b->act.native_rows, d->hidden,
                                          rows);
    jobs[0] = forward_job(&w->mlp_gate, &w->mlp_up, NULL, rows, x, d->hidden, b->act.mlp_act, width);
    glmrt_status status = glmrt_linear_run(&b->linear, jobs, 1, error);
    if (status != GLMRT_OK) {
        return status;
    }
    x = forward_native_input(b, &w->mlp_down, b->act.mlp_act, width, b->act.mlp_act, width, rows);
    jobs[0] = forward_job(&w->mlp_down, NULL, NULL, rows, x, width, b->act.proj, d->hidden);
    status = glmrt_linear_run(&b->linear, jobs, 1, error);
    if (status != GLMRT_OK) {
        return status;
    }
    b->step.residual_add = b->act.proj;
    forward_run(b, rows, forward_residual_norm_task, 3 * (int64_t)d->hidden);
    return GLMRT_OK;
}

static glmrt_status forward_moe(glmrt_cpu_backend *b, int32_t rows, glmrt_error *error)
{
    const glmrt_cpu_dims *d = &b->dims;
    const glmrt_layer_weights *w = b->step.layer->weights;
    glmrt_cpu_activations *a = &b->act;
    a->jobs[0] = forward_job(&w->router, NULL, NULL, rows, a->normed, d->hidden, a->router_logits, d->num_experts);
    glmrt_status status = glmrt_linear_run(&b->linear, a->jobs, 1, error);
    if (status != GLMRT_OK) {
        return status;
    }
    forward_run(b, rows, forward_route_task, (int64_t)d->num_experts * (d->top_k + 4));
    glmrt_moe_pairs_group(&a->pairs, rows, d->top_k, a->route_experts);
    const float *x = forward_native_input(b, &w->expert_gate[0], a->normed, d->hidden, a->native_rows, d->hidden, rows);
    int32_t num_jobs = glmrt_moe_jobs_gate_up(&a->pairs, w, x, d->hidden, a->expert_act, d->expert_width, a->jobs);
    if (d->shared_width > 0) {
        a->jobs[num_jobs++] = forward_job(&w->shared_gate, &w->shared_up, NULL, rows, x, d->hidden, a->mlp_act,
                                          d->shared_width);
    }
    status = glmrt_linear_run(&b->linear, a->jobs, num_jobs, error);
    if (status != GLMRT_OK) {
        return status;
    }
    int32_t assignments = a->pairs.expert_offsets[d->num_experts];
    forward_native_input(b, &w->expert_down[0], a->expert_act, d->expert_width, a->expert_act, d->expert_width,
                         assignments);
    num_jobs = glmrt_moe_jobs_down(&a->pairs, w, a->expert_act, d->expert_width, a->expert_out, d->hidden, a->jobs);
    if (d->shared_width > 0) {
        x = forward_native_input(b, &w->shared_down, a->mlp_act, d->shared_width, a->mlp_act, d->shared_width, rows);
        a->jobs[num_jobs++] = forward_job(&w->shared_down, NULL, NULL, rows, x, d->shared_width, a->proj, d->hidden);
    }
    status = glmrt_linear_run(&b->linear, a->jobs, num_jobs, error);
    if (status != GLMRT_OK) {
        return status;
    }
    forward_run(b, rows, forward_combine_task, (int64_t)d->hidden * (d->top_k + 3));
    return GLMRT_OK;
}

static glmrt_status forward_layers(glmrt_cpu_backend *b, int32_t rows, glmrt_error *error)
{
    glmrt_status status = GLMRT_OK;
    for (int32_t l = 0; l < b->dims.num_layers && status == GLMRT_OK; ++l) {
        b->step.layer_index = l;
        b->step.layer = &b->layers[l];
        status = forward_attention(b, rows, error);
        if (status != GLMRT_OK) {
            break;
        }
        b->step.norm_weight = l + 1 < b->dims.num_layers ? b->layers[l + 1].input_norm : NULL;
        status = b->step.layer->is_moe ? forward_moe(b, rows, error) : forward_dense_mlp(b, rows, error);
    }
    return status;
}

static glmrt_status forward_logits(glmrt_cpu_backend *b, float *out_logits, glmrt_error *error)
{
    const glmrt_cpu_dims *d = &b->dims;
    int32_t num_samples = b->step.batch->num_samples;
    forward_run(b, num_samples, forward_final_norm_task, 3 * (int64_t)d->hidden);
    const float *x = forward_native_input(b, b->lm_head, b->act.final_hidden, d->hidden, b->act.final_hidden,
                                          d->hidden, num_samples);
    b->act.jobs[0] = forward_job(b->lm_head, NULL, NULL, num_samples, x, d->hidden, b->act.logits, d->vocab);
    glmrt_status status = glmrt_linear_run(&b->linear, b->act.jobs, 1, error);
    if (status != GLMRT_OK) {
        return status;
    }
    forward_run(b, num_samples, forward_sample_task, 16 * (int64_t)d->vocab);
    if (out_logits != NULL) {
        memcpy(out_logits, b->act.logits, (size_t)num_samples * (size_t)d->vocab * sizeof(float));
    }
    return GLMRT_OK;
}

glmrt_status glmrt_cpu_backend_forward_step(glmrt_cpu_backend *b, const glmrt_step_batch *batch,
                                            float *out_logits, glmrt_token *out_sampled)
{
    glmrt_error *error = &b->engine->error;
    if (batch->num_tokens == 0) {
        return GLMRT_OK;
    }
    memset(&b->step, 0, sizeof(b->step));
    b->step.batch = batch;
    b->step.sampled = out_sampled;
    forward_run(b, batch->num_tokens, forward_embed_task, 4 * (int64_t)b->dims.hidden);
    glmrt_status status = forward_layers(b, batch->num_tokens, error);
    if (status == GLMRT_OK && batch->num_samples > 0) {
        status = forward_logits(b, out_logits, error);
    }
    memset(&b->step, 0, sizeof(b->step));
    return status;
}
