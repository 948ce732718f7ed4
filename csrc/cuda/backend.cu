#include "cuda_backend.h"
#include "rank_group.cuh"

static void glmrt_cuda_fill_info(glmrt_cuda_group *group)
{
    glmrt_engine_info *info = &group->engine->info;
    info->weight_bytes = 0;
    info->kv_cache_bytes = 0;
    info->workspace_bytes = 0;
    info->kv_bytes_per_page = 0;
    for (int32_t r = 0; r < group->num_ranks; ++r) {
        const glmrt_cuda_state *st = group->ranks[r];
        info->weight_bytes += st->weight_bytes;
        info->kv_cache_bytes += st->kv_bytes;
        info->workspace_bytes += st->workspace_bytes + st->peer.bytes + st->ordered.bytes;
        info->kv_bytes_per_page += st->kv_bytes_per_page;
    }
    info->workspace_bytes += group->ranks[0]->step_input_bytes * group->num_input_buffers;
    info->num_decode_graphs = group->ranks[0]->graphs.count;
    info->decode_graph_bytes = group->ranks[0]->graphs.bytes;
    info->num_devices = group->num_ranks;
    info->all_reduce = group->num_ranks > 1 ? group->all_reduce : GLMRT_ALL_REDUCE_NONE;
    info->num_threads = 0;
}

static glmrt_status glmrt_cuda_create(glmrt_engine *engine, void **out_state)
{
    if (engine == nullptr || out_state == nullptr) {
        return GLMRT_ERR_INVALID_ARGUMENT;
    }
    *out_state = nullptr;
    glmrt_cuda_group *group = nullptr;
    GLMRT_TRY(glmrt_cuda_group_create(engine, &group));
    glmrt_cuda_fill_info(group);
    *out_state = group;
    return GLMRT_OK;
}

static void glmrt_cuda_destroy(void *state)
{
    glmrt_cuda_group_destroy((glmrt_cuda_group *)state);
}

static glmrt_status glmrt_cuda_launch_op(void *state, const glmrt_step_batch *batch, float *out_logits,
                                         glmrt_token *out_sampled)
{
    if (state == nullptr) {
        return GLMRT_ERR_INVALID_ARGUMENT;
    }
    return glmrt_cuda_group_launch((glmrt_cuda_group *)state, batch, out_logits, out_sampled);
}

static int32_t glmrt_cuda_feeds_sampled_tokens_op(void *state)
{
    return state != nullptr && glmrt_cuda_group_feeds_sampled_tokens((const glmrt_cuda_group *)state);
}

static glmrt_status glmrt_cuda_complete_op(void *state, glmrt_step_report *out_report)
{
    if (state == nullptr) {
        return GLMRT_ERR_INVALID_ARGUMENT;
    }
    return glmrt_cuda_group_complete((glmrt_cuda_group *)state, out_report);
}

extern "C" const glmrt_backend_ops glmrt_cuda_backend_ops = {
    "cuda",
    glmrt_cuda_create,
    glmrt_cuda_destroy,
    glmrt_cuda_launch_op,
    glmrt_cuda_complete_op,
    glmrt_cuda_feeds_sampled_tokens_op,
    1,
};
