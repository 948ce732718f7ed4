#include <stddef.h>
#include <string.h>

#include "model_config.h"
#include "rank_plan.h"

static glmrt_rank_range glmrt_range_split(int32_t total, int32_t parts, int32_t index)
{
    glmrt_rank_range range;
    int32_t base = total / parts;
    int32_t extra = total % parts;
    range.begin = index * base + (index < extra ? index : extra);
    range.count = base + (index < extra ? 1 : 0);
    return range;
}

static glmrt_rank_range glmrt_range_whole(int32_t total)
{
    return glmrt_range_split(total, 1, 0);
}

static glmrt_rank_range glmrt_kv_heads_for(const glmrt_rank_range *q_heads, int32_t group)
{
    glmrt_rank_range range;
    range.begin = q_heads->begin / group;
    int32_t last = (q_heads->begin + q_heads->count - 1) / group;
    range.count = q_heads->count > 0 ? last - range.begin + 1 : 0;
    return range;
}

static glmrt_rank_range glmrt_range_split_units(int32_t total, int32_t unit, int32_t parts, int32_t index)
{
    int32_t units = (total + unit - 1) / unit;
    glmrt_rank_range in_units = glmrt_range_split(units, parts, index);
    glmrt_rank_range range;
    range.begin = in_units.begin * unit;
    int32_t end = (in_units.begin + in_units.count) * unit;
    if (end > total) {
        end = total;
    }
    range.count = end > range.begin ? end - range.begin : 0;
    if (range.begin > total) {
        range.begin = total;
    }
    return range;
}

static int32_t glmrt_gcd(int32_t a, int32_t b)
{
    while (b != 0) {
        int32_t r = a % b;
        a = b;
        b = r;
    }
    return a;
}

static int32_t glmrt_lcm(int32_t a, int32_t b)
{
    return a / glmrt_gcd(a, b) * b;
}

static int32_t glmrt_column_unit(const glmrt_model_config *config)
{
    if (config->weight_quant != GLMRT_QUANT_FP8_BLOCK) {
        return GLMRT_RANK_COLUMN_STEP;
    }
    int32_t rows = config->weight_block_rows > 0 ? config->weight_block_rows : GLMRT_RANK_DEFAULT_BLOCK;
    int32_t cols = config->weight_block_cols > 0 ? config->weight_block_cols : GLMRT_RANK_DEFAULT_BLOCK;
    return glmrt_lcm(glmrt_lcm(rows, cols), GLMRT_RANK_COLUMN_STEP);
}

glmrt_status glmrt_expert_split_check(int32_t expert_split, glmrt_error *error)
{
    if (expert_split != GLMRT_EXPERT_SPLIT_WHOLE && expert_split != GLMRT_EXPERT_SPLIT_COLUMNS) {
        return glmrt_error_set(error, GLMRT_ERR_INVALID_ARGUMENT,
                               "expert_split must be %d (whole) or %d (columns), got %d", GLMRT_EXPERT_SPLIT_WHOLE,
                               GLMRT_EXPERT_SPLIT_COLUMNS, expert_split);
    }
    return GLMRT_OK;
}

glmrt_status glmrt_rank_plan_build(const glmrt_model_config *config, int32_t num_ranks, int32_t expert_split,
                                   glmrt_rank_plan *out, glmrt_error *error)
{
    if (config == NULL || out == NULL) {
        return glmrt_error_set(error, GLMRT_ERR_INVALID_ARGUMENT, "rank plan needs a config and an output");
    }
    memset(out, 0, sizeof(*out));
    if (num_ranks < 1 || num_ranks > GLMRT_MAX_DEVICES) {
        return glmrt_error_set(error, GLMRT_ERR_INVALID_ARGUMENT, "rank plan for %d GPUs, supported 1 to %d",
                               num_ranks, GLMRT_MAX_DEVICES);
    }
    glmrt_status split_checked = glmrt_expert_split_check(expert_split, error);
    if (split_checked != GLMRT_OK) {
        return split_checked;
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
    int32_t has_dense = config->first_k_dense_replace > 0 && config->intermediate_size > 0;
    int32_t has_moe = config->first_k_dense_replace < config->num_hidden_layers;
    int32_t unit = glmrt_column_unit(config);
    int32_t expert_columns = expert_split == GLMRT_EXPERT_SPLIT_COLUMNS;
    if (has_moe && !expert_columns && config->n_routed_experts < num_ranks) {
        return glmrt_error_set(error, GLMRT_ERR_UNSUPPORTED, "%d routed experts cannot give each of %d GPUs one",
                               config->n_routed_experts, num_ranks);
    }
    if (has_moe && expert_columns && (config->moe_intermediate_size + unit - 1) / unit < num_ranks) {
        return glmrt_error_set(error, GLMRT_ERR_UNSUPPORTED,
                               "the expert width %d in blocks of %d cannot give each of %d GPUs a share",
                               config->moe_intermediate_size, unit, num_ranks);
    }
    if (has_dense && (config->intermediate_size + unit - 1) / unit < num_ranks) {
        return glmrt_error_set(error, GLMRT_ERR_UNSUPPORTED,
                               "the dense MLP width %d in blocks of %d cannot give each of %d GPUs a share",
                               config->intermediate_size, unit, num_ranks);
    }
    if (config->weight_quant == GLMRT_QUANT_FP8_BLOCK && num_ranks > 1) {
        int32_t rows = config->weight_block_rows > 0 ? config->weight_block_rows : GLMRT_RANK_DEFAULT_BLOCK;
        int32_t cols = config->weight_block_cols > 0 ? config->weight_block_cols : GLMRT_RANK_DEFAULT_BLOCK;
        int32_t q_rows = heads / num_ranks * config->head_dim;
        if (q_rows % rows != 0 || q_rows % cols != 0) {
            return glmrt_error_set(error, GLMRT_ERR_UNSUPPORTED,
                                   "%d query rows a GPU over %d GPUs do not fall on the %dx%d FP8 scale blocks",
                                   q_rows, num_ranks, rows, cols);
        }
        int32_t kv_rows = (kv_heads >= num_ranks ? kv_heads / num_ranks : 1) * config->head_dim;
        if (kv_rows % rows != 0) {
            return glmrt_error_set(error, GLMRT_ERR_UNSUPPORTED,
                                   "%d key/value rows a GPU over %d GPUs do not fall on the %d-row FP8 scale blocks",
                                   kv_rows, num_ranks, rows);
        }
    }
    out->num_ranks = num_ranks;
    int32_t shared_width = config->moe_intermediate_size * (config->n_shared_experts > 0 ? config->n_shared_experts : 0);
    for (int32_t r = 0; r < num_ranks; ++r) {
        glmrt_rank *rank = &out->ranks[r];
        rank->index = r;
        rank->num_ranks = num_ranks;
        rank->q_heads = glmrt_range_split(heads, num_ranks, r);
        rank->kv_heads = glmrt_kv_heads_for(&rank->q_heads, group);
        int32_t routed = has_moe ? config->n_routed_experts : 0;
        int32_t expert_width = has_moe ? config->moe_intermediate_size : 0;
        rank->experts = expert_columns ? glmrt_range_whole(routed) : glmrt_range_split(routed, num_ranks, r);
        rank->expert_columns = expert_columns ? glmrt_range_split_units(expert_width, unit, num_ranks, r)
                                              : glmrt_range_whole(expert_width);
        rank->vocab_rows = glmrt_range_split_units(config->vocab_size, unit, num_ranks, r);
        rank->dense_columns = glmrt_range_split_units(has_dense ? config->intermediate_size : 0, unit, num_ranks, r);
        rank->shared_columns = glmrt_range_split_units(has_moe && shared_width > 0 ? shared_width : 0, unit,
                                                        num_ranks, r);
    }
    return GLMRT_OK;
}

static void glmrt_rank_info_from_rank(const glmrt_rank *rank, glmrt_rank_info *info)
{
    info->q_head_begin = rank->q_heads.begin;
    info->q_head_count = rank->q_heads.count;
    info->kv_head_begin = rank->kv_heads.begin;
    info->kv_head_count = rank->kv_heads.count;
    info->expert_begin = rank->experts.begin;
    info->expert_count = rank->experts.count;
    info->vocab_begin = rank->vocab_rows.begin;
    info->vocab_count = rank->vocab_rows.count;
    info->dense_begin = rank->dense_columns.begin;
    info->dense_count = rank->dense_columns.count;
    info->shared_begin = rank->shared_columns.begin;
    info->shared_count = rank->shared_columns.count;
    info->expert_column_begin = rank->expert_columns.begin;
    info->expert_column_count = rank->expert_columns.count;
}

glmrt_status glmrt_plan_ranks(const glmrt_model_config *config, int32_t num_devices, int32_t expert_split,
                              glmrt_rank_info *out_ranks, char *error_message, int32_t error_capacity)
{
    glmrt_error error;
    glmrt_error_clear(&error);
    glmrt_status status = GLMRT_OK;
    if (config == NULL || out_ranks == NULL) {
        status = glmrt_error_set(&error, GLMRT_ERR_INVALID_ARGUMENT, "the rank plan needs a config and an output");
    }
    if (status == GLMRT_OK) {
        status = glmrt_model_config_validate(config, &error);
    }
    glmrt_rank_plan plan;
    if (status == GLMRT_OK) {
        status = glmrt_rank_plan_build(config, num_devices, expert_split, &plan, &error);
    }
    if (status == GLMRT_OK) {
        for (int32_t r = 0; r < plan.num_ranks; ++r) {
            glmrt_rank_info_from_rank(&plan.ranks[r], &out_ranks[r]);
        }
    }
    glmrt_error_copy_out(&error, error_message, error_capacity);
    return status;
}
