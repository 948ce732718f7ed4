#include <string.h>

#include "shard_plan.h"

static glmrt_cuda_range glmrt_range_split(int32_t total, int32_t parts, int32_t index)
{
    glmrt_cuda_range range;
    int32_t base = total / parts;
    int32_t extra = total % parts;
    range.begin = index * base + (index < extra ? index : extra);
    range.count = base + (index < extra ? 1 : 0);
    return range;
}

static glmrt_cuda_range glmrt_kv_heads_for(const glmrt_cuda_range *q_heads, int32_t group)
{
    glmrt_cuda_range range;
    range.begin = q_heads->begin / group;
    int32_t last = (q_heads->begin + q_heads->count - 1) / group;
    range.count = q_heads->count > 0 ? last - range.begin + 1 : 0;
    return range;
}

glmrt_status glmrt_cuda_shard_plan_build(const glmrt_model_config *config, int32_t num_ranks,
                                         glmrt_cuda_shard_plan *out, glmrt_error *error)
{
    if (config == NULL || out == NULL) {
        return glmrt_error_set(error, GLMRT_ERR_INVALID_ARGUMENT, "shard plan needs a config and an output");
    }
    memset(out, 0, sizeof(*out));
    if (num_ranks < 1 || num_ranks > GLMRT_CUDA_MAX_RANKS) {
        return glmrt_error_set(error, GLMRT_ERR_INVALID_ARGUMENT, "shard plan for %d GPUs, supported 1 to %d",
                               num_ranks, GLMRT_CUDA_MAX_RANKS);
    }
    int32_t heads = config->num_attention_heads;
    int32_t kv_heads = config->num_key_value_heads;
    if (kv_heads <= 0 || heads % kv_heads != 0) {
        return glmrt_error_set(error, GLMRT_ERR_INVALID_ARGUMENT, "%d attention heads do not form groups of %d kv heads",
                               heads, kv_heads);
    }
    if (heads % num_ranks != 0) {
        return glmrt_error_set(error, GLMRT_ERR_UNSUPPORTED, "%d attention heads cannot be split evenly over %d GPUs",
                               heads, num_ranks);
    }
    int32_t group = heads / kv_heads;
    int32_t heads_per_rank = heads / num_ranks;
    if (heads_per_rank % group != 0 && group % heads_per_rank != 0) {
        return glmrt_error_set(error, GLMRT_ERR_UNSUPPORTED,
                               "%d heads a GPU straddle the query groups of %d heads over %d GPUs", heads_per_rank,
                               group, num_ranks);
    }
    out->num_ranks = num_ranks;
    out->kv_heads_replicated = kv_heads < num_ranks;
    for (int32_t r = 0; r < num_ranks; ++r) {
        glmrt_cuda_shard *shard = &out->shards[r];
        shard->rank = r;
        shard->num_ranks = num_ranks;
        shard->q_heads = glmrt_range_split(heads, num_ranks, r);
        shard->kv_heads = glmrt_kv_heads_for(&shard->q_heads, group);
        shard->experts = glmrt_range_split(config->n_routed_experts > 0 ? config->n_routed_experts : 0, num_ranks, r);
        shard->vocab_rows = glmrt_range_split(config->vocab_size, num_ranks, r);
        shard->dense_columns = glmrt_range_split(config->intermediate_size > 0 ? config->intermediate_size : 0,
                                                 num_ranks, r);
        int32_t shared_width = config->moe_intermediate_size * (config->n_shared_experts > 0 ? config->n_shared_experts : 0);
        shard->shared_columns = glmrt_range_split(shared_width > 0 ? shared_width : 0, num_ranks, r);
    }
    return GLMRT_OK;
}

int32_t glmrt_cuda_shard_is_whole_model(const glmrt_cuda_shard *shard, const glmrt_model_config *config)
{
    return shard->num_ranks == 1 && shard->q_heads.count == config->num_attention_heads &&
           shard->kv_heads.count == config->num_key_value_heads && shard->vocab_rows.count == config->vocab_size;
}
