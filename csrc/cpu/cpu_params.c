#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_backend.h"
#include "fp8.h"

typedef struct params_cursor {
    float *next;
    int64_t used;
} params_cursor;

static glmrt_status params_vector_check(const glmrt_vector *vector, int32_t length, const char *role,
                                        int32_t layer, glmrt_error *error)
{
    if (vector->data == NULL) {
        return glmrt_error_set(error, GLMRT_ERR_MISSING_TENSOR, "layer %d %s is missing", (int)layer, role);
    }
    if (vector->length != length) {
        return glmrt_error_set(error, GLMRT_ERR_FORMAT, "layer %d %s has length %d, expected %d", (int)layer, role,
                               (int)vector->length, (int)length);
    }
    if (vector->dtype != GLMRT_DTYPE_F32 && vector->dtype != GLMRT_DTYPE_BF16 && vector->dtype != GLMRT_DTYPE_F16) {
        return glmrt_error_set(error, GLMRT_ERR_UNSUPPORTED, "layer %d %s has dtype %s", (int)layer, role,
                               glmrt_dtype_name(vector->dtype));
    }
    return GLMRT_OK;
}

static float *params_vector_take(params_cursor *cursor, const glmrt_vector *vector)
{
    float *out = NULL;
    if (cursor->next != NULL) {
        out = cursor->next + cursor->used;
        for (int32_t i = 0; i < vector->length; ++i) {
            if (vector->dtype == GLMRT_DTYPE_F32) {
                memcpy(&out[i], vector->data + (int64_t)i * 4, sizeof(float));
                continue;
            }
            uint16_t bits;
            memcpy(&bits, vector->data + (int64_t)i * 2, sizeof(bits));
            out[i] = vector->dtype == GLMRT_DTYPE_BF16 ? glmrt_bf16_to_float(bits) : glmrt_f16_to_float(bits);
        }
    }
    cursor->used += vector->length;
    return out;
}

static glmrt_status params_take(params_cursor *cursor, const glmrt_vector *vector, int32_t length,
                                const char *role, int32_t layer, float **out, glmrt_error *error)
{
    glmrt_status status = params_vector_check(vector, length, role, layer, error);
    if (status != GLMRT_OK) {
        return status;
    }
    *out = params_vector_take(cursor, vector);
    return GLMRT_OK;
}

static glmrt_status params_check_linear(const glmrt_linear *weight, int32_t rows, int32_t cols, const char *role,
                                        int32_t layer, glmrt_error *error)
{
    char label[96];
    snprintf(label, sizeof(label), "layer %d %s", (int)layer, role);
    return glmrt_linear_validate(weight, rows, cols, label, error);
}

static glmrt_status params_attention(const glmrt_cpu_backend *backend, params_cursor *cursor, int32_t l,
                                     glmrt_cpu_layer_params *out, glmrt_error *error)
{
    const glmrt_cpu_dims *d = &backend->dims;
    const glmrt_layer_weights *w = out->weights;
    glmrt_status status = params_check_linear(&w->q_proj, d->q_dim, d->hidden, "q_proj", l, error);
    if (status == GLMRT_OK) {
        status = params_check_linear(&w->k_proj, d->kv_dim, d->hidden, "k_proj", l, error);
    }
    if (status == GLMRT_OK) {
        status = params_check_linear(&w->v_proj, d->kv_dim, d->hidden, "v_proj", l, error);
    }
    if (status == GLMRT_OK) {
        status = params_check_linear(&w->o_proj, d->hidden, d->q_dim, "o_proj", l, error);
    }
    if (status == GLMRT_OK && backend->config.attention_bias) {
        status = params_take(cursor, &w->q_bias, d->q_dim, "q_proj bias", l, &out->q_bias, error);
        if (status == GLMRT_OK) {
            status = params_take(cursor, &w->k_bias, d->kv_dim, "k_proj bias", l, &out->k_bias, error);
        }
        if (status == GLMRT_OK) {
            status = params_take(cursor, &w->v_bias, d->kv_dim, "v_proj bias", l, &out->v_bias, error);
        }
    }
    if (status == GLMRT_OK && backend->config.use_qk_norm) {
        status = params_take(cursor, &w->q_norm, d->head_dim, "q_norm", l, &out->q_norm, error);
        if (status == GLMRT_OK) {
            status = params_take(cursor, &w->k_norm, d->head_dim, "k_norm", l, &out->k_norm, error);
        }
    }
    return status;
}

static glmrt_status params_experts(const glmrt_cpu_backend *backend, int32_t l, const glmrt_layer_weights *w,
                                   glmrt_error *error)
{
    const glmrt_cpu_dims *d = &backend->dims;
    if (w->expert_gate == NULL || w->expert_up == NULL || w->expert_down == NULL) {
        return glmrt_error_set(error, GLMRT_ERR_MISSING_TENSOR, "layer %d has no routed expert weights", (int)l);
    }
    glmrt_status status = GLMRT_OK;
    for (int32_t e = 0; e < d->num_experts && status == GLMRT_OK; ++e) {
        char role[64];
        snprintf(role, sizeof(role), "expert %d gate_proj", (int)e);
        status = params_check_linear(&w->expert_gate[e], d->expert_width, d->hidden, role, l, error);
        if (status == GLMRT_OK) {
            snprintf(role, sizeof(role), "expert %d up_proj", (int)e);
            status = params_check_linear(&w->expert_up[e], d->expert_width, d->hidden, role, l, error);
        }
        if (status == GLMRT_OK) {
            snprintf(role, sizeof(role), "expert %d down_proj", (int)e);
            status = params_check_linear(&w->expert_down[e], d->hidden, d->expert_width, role, l, error);
        }
    }
    return status;
}

static glmrt_status params_mlp(const glmrt_cpu_backend *backend, params_cursor *cursor, int32_t l,
                               glmrt_cpu_layer_params *out, glmrt_error *error)
{
    const glmrt_cpu_dims *d = &backend->dims;
    const glmrt_layer_weights *w = out->weights;
    if (!out->is_moe) {
        int32_t width = backend->config.intermediate_size;
        glmrt_status status = params_check_linear(&w->mlp_gate, width, d->hidden, "mlp gate_proj", l, error);
        if (status == GLMRT_OK) {
            status = params_check_linear(&w->mlp_up, width, d->hidden, "mlp up_proj", l, error);
        }
        if (status == GLMRT_OK) {
            status = params_check_linear(&w->mlp_down, d->hidden, width, "mlp down_proj", l, error);
        }
        return status;
    }
    glmrt_status status = params_check_linear(&w->router, d->num_experts, d->hidden, "router", l, error);
    if (status == GLMRT_OK && w->router_bias.data != NULL) {
        status = params_take(cursor, &w->router_bias, d->num_experts, "router correction bias", l,
                             &out->router_bias, error);
    }
    if (status == GLMRT_OK) {
        status = params_experts(backend, l, w, error);
    }
    if (status == GLMRT_OK && d->shared_width > 0) {
        status = params_check_linear(&w->shared_gate, d->shared_width, d->hidden, "shared gate_proj", l, error);
        if (status == GLMRT_OK) {
            status = params_check_linear(&w->shared_up, d->shared_width, d->hidden, "shared up_proj", l, error);
        }
        if (status == GLMRT_OK) {
            status = params_check_linear(&w->shared_down, d->hidden, d->shared_width, "shared down_proj", l, error);
        }
    }
    return status;
}

static glmrt_status params_walk(glmrt_cpu_backend *backend, params_cursor *cursor, glmrt_error *error)
{
    const glmrt_cpu_dims *d = &backend->dims;
    glmrt_status status = GLMRT_OK;
    for (int32_t l = 0; l < d->num_layers && status == GLMRT_OK; ++l) {
        glmrt_cpu_layer_params *out = &backend->layers[l];
        out->weights = &backend->weights->layers[l];
        out->is_moe = l >= backend->config.first_k_dense_replace;
        status = params_take(cursor, &out->weights->input_norm, d->hidden, "input_layernorm", l, &out->input_norm,
                             error);
        if (status == GLMRT_OK) {
            status = params_take(cursor, &out->weights->post_attention_norm, d->hidden, "post_attention_layernorm",
                                 l, &out->post_attention_norm, error);
        }
        if (status == GLMRT_OK) {
            status = params_attention(backend, cursor, l, out, error);
        }
        if (status == GLMRT_OK) {
            status = params_mlp(backend, cursor, l, out, error);
        }
    }
    if (status == GLMRT_OK) {
        status = params_take(cursor, &backend->weights->final_norm, d->hidden, "final norm", -1,
                             &backend->final_norm, error);
    }
    return status;
}

static glmrt_status params_globals(glmrt_cpu_backend *backend, glmrt_error *error)
{
    const glmrt_cpu_dims *d = &backend->dims;
    const glmrt_weights *weights = backend->weights;
    if (weights->num_layers < d->num_layers || weights->layers == NULL) {
        return glmrt_error_set(error, GLMRT_ERR_FORMAT, "weights hold %d layers, the config needs %d",
                               (int)weights->num_layers, (int)d->num_layers);
    }
    glmrt_status status = glmrt_linear_validate(&weights->embed, d->vocab, d->hidden, "embed_tokens", error);
    if (status != GLMRT_OK) {
        return status;
    }
    backend->lm_head = &weights->lm_head;
    if (weights->lm_head.data == NULL && backend->config.tie_word_embeddings) {
        backend->lm_head = &weights->embed;
    }
    return glmrt_linear_validate(backend->lm_head, d->vocab, d->hidden, "lm_head", error);
}

glmrt_status glmrt_cpu_backend_prepare_params(glmrt_cpu_backend *backend, glmrt_error *error)
{
    glmrt_status status = params_globals(backend, error);
    if (status != GLMRT_OK) {
        return status;
    }
    backend->layers = calloc((size_t)backend->dims.num_layers, sizeof(*backend->layers));
    if (backend->layers == NULL) {
        return glmrt_error_set(error, GLMRT_ERR_OUT_OF_MEMORY, "cpu backend: cannot allocate layer table");
    }
    params_cursor sizing = {NULL, 0};
    status = params_walk(backend, &sizing, error);
    if (status != GLMRT_OK) {
        return status;
    }
    backend->param_storage = malloc((size_t)(sizing.used > 0 ? sizing.used : 1) * sizeof(float));
    if (backend->param_storage == NULL) {
        return glmrt_error_set(error, GLMRT_ERR_OUT_OF_MEMORY, "cpu backend: cannot allocate %lld parameter floats",
                               (long long)sizing.used);
    }
    backend->workspace_bytes += sizing.used * (int64_t)sizeof(float);
    params_cursor filling = {backend->param_storage, 0};
    return params_walk(backend, &filling, error);
}
