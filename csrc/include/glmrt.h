#ifndef GLMRT_H
#define GLMRT_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define GLMRT_ABI_VERSION 13
#define GLMRT_MAX_EOS_TOKEN_IDS 16
#define GLMRT_MAX_STOP_TOKEN_IDS 256
#define GLMRT_ERROR_MESSAGE_CAPACITY 1024
#define GLMRT_MAX_DEVICES 16

typedef int32_t glmrt_status;
typedef int32_t glmrt_token;
typedef int32_t glmrt_pos;
typedef int32_t glmrt_page_id;

enum glmrt_status_code {
    GLMRT_OK = 0,
    GLMRT_ERR_INVALID_ARGUMENT = 1,
    GLMRT_ERR_IO = 2,
    GLMRT_ERR_FORMAT = 3,
    GLMRT_ERR_MISSING_TENSOR = 4,
    GLMRT_ERR_OUT_OF_MEMORY = 5,
    GLMRT_ERR_OUT_OF_PAGES = 6,
    GLMRT_ERR_CONTEXT_LENGTH = 7,
    GLMRT_ERR_UNSUPPORTED = 8,
    GLMRT_ERR_BACKEND = 9,
    GLMRT_ERR_INVARIANT = 10
};

enum glmrt_backend_kind {
    GLMRT_BACKEND_CPU = 0,
    GLMRT_BACKEND_CUDA = 1
};

enum glmrt_weight_quant {
    GLMRT_QUANT_NONE = 0,
    GLMRT_QUANT_FP8_CHANNEL = 1,
    GLMRT_QUANT_FP8_BLOCK = 2
};

enum glmrt_matmul_precision {
    GLMRT_MATMUL_DEFAULT = 0,
    GLMRT_MATMUL_HIGH = 1,
    GLMRT_MATMUL_NATIVE = 2
};

enum glmrt_decode_graphs {
    GLMRT_DECODE_GRAPHS_DEFAULT = 0,
    GLMRT_DECODE_GRAPHS_OFF = 1
};

enum glmrt_dependent_launches {
    GLMRT_DEPENDENT_LAUNCHES_DEFAULT = 0,
    GLMRT_DEPENDENT_LAUNCHES_OFF = 1
};

enum glmrt_launch_ahead {
    GLMRT_LAUNCH_AHEAD_DEFAULT = 0,
    GLMRT_LAUNCH_AHEAD_OFF = 1,
    GLMRT_LAUNCH_AHEAD_ALWAYS = 2
};

enum glmrt_all_reduce {
    GLMRT_ALL_REDUCE_NONE = -1,
    GLMRT_ALL_REDUCE_NCCL = 0,
    GLMRT_ALL_REDUCE_PEER = 1,
    GLMRT_ALL_REDUCE_AUTO = 2,
    GLMRT_ALL_REDUCE_PEER_BF16 = 3
};

enum glmrt_expert_split {
    GLMRT_EXPERT_SPLIT_WHOLE = 0,
    GLMRT_EXPERT_SPLIT_COLUMNS = 1
};

enum glmrt_finish_reason {
    GLMRT_FINISH_NONE = 0,
    GLMRT_FINISH_STOP = 1,
    GLMRT_FINISH_LENGTH = 2
};

typedef struct glmrt_model_config {
    int32_t vocab_size;
    int32_t hidden_size;
    int32_t intermediate_size;
    int32_t moe_intermediate_size;
    int32_t num_hidden_layers;
    int32_t num_attention_heads;
    int32_t num_key_value_heads;
    int32_t head_dim;
    int32_t n_routed_experts;
    int32_t n_shared_experts;
    int32_t num_experts_per_tok;
    int32_t first_k_dense_replace;
    int32_t n_group;
    int32_t topk_group;
    int32_t norm_topk_prob;
    int32_t use_qk_norm;
    int32_t attention_bias;
    int32_t tie_word_embeddings;
    int32_t max_position_embeddings;
    int32_t weight_quant;
    int32_t weight_block_rows;
    int32_t weight_block_cols;
    float routed_scaling_factor;
    float rms_norm_eps;
    float rope_theta;
    float partial_rotary_factor;
    int32_t num_eos_token_ids;
    glmrt_token eos_token_ids[GLMRT_MAX_EOS_TOKEN_IDS];
} glmrt_model_config;

typedef struct glmrt_engine_options {
    int32_t backend;
    int32_t num_threads;
    int32_t max_batch;
    int32_t max_tokens_per_step;
    int32_t kv_page_size;
    int32_t kv_num_pages;
    int32_t max_context;
    int32_t device_id;
    int32_t num_devices;
    float kv_memory_fraction;
    int32_t random_weights;
    uint64_t random_seed;
    int32_t enable_prefix_caching;
    int32_t matmul_precision;
    int32_t decode_graphs;
    int32_t dependent_launches;
    int32_t all_reduce;
    int32_t expert_split;
    int32_t launch_ahead;
} glmrt_engine_options;

typedef struct glmrt_rank_info {
    int32_t q_head_begin;
    int32_t q_head_count;
    int32_t kv_head_begin;
    int32_t kv_head_count;
    int32_t expert_begin;
    int32_t expert_count;
    int32_t vocab_begin;
    int32_t vocab_count;
    int32_t dense_begin;
    int32_t dense_count;
    int32_t shared_begin;
    int32_t shared_count;
    int32_t expert_column_begin;
    int32_t expert_column_count;
} glmrt_rank_info;

typedef struct glmrt_sampling_params {
    float temperature;
    float top_p;
    float min_p;
    float repetition_penalty;
    float frequency_penalty;
    float presence_penalty;
    int32_t top_k;
    int32_t max_new_tokens;
    uint64_t seed;
    int32_t ignore_eos;
    int32_t num_stop_token_ids;
    const glmrt_token *stop_token_ids;
} glmrt_sampling_params;

typedef struct glmrt_engine_stats {
    int32_t kv_pages_total;
    int32_t kv_pages_free;
    int32_t kv_page_size;
    int32_t live_requests;
    int64_t tokens_processed;
    int64_t steps;
    int64_t tokens_generated;
    int32_t kv_pages_cached;
    int64_t prefix_cache_queries;
    int64_t prefix_cache_hits;
    int64_t prefix_cache_evictions;
    int64_t device_forward_ns;
    int64_t step_gap_ns;
    int64_t step_gaps;
    int64_t rows_owned_steps;
    int64_t steps_launched_ahead;
} glmrt_engine_stats;

typedef struct glmrt_engine_info {
    int32_t backend;
    int32_t num_threads;
    int32_t max_batch;
    int32_t max_tokens_per_step;
    int32_t max_context;
    int32_t max_sequence_tokens;
    int32_t max_prompt_tokens;
    int32_t kv_page_size;
    int32_t kv_num_pages;
    int32_t num_devices;
    int64_t weight_bytes;
    int64_t kv_cache_bytes;
    int64_t workspace_bytes;
    int64_t kv_bytes_per_page;
    int32_t num_native_matmuls;
    int32_t num_decode_graphs;
    int64_t decode_graph_bytes;
    int32_t asynchronous_launch;
    int32_t all_reduce;
    int32_t launch_ahead;
    char device_name[128];
} glmrt_engine_info;

typedef struct glmrt_request_info {
    int64_t request_id;
    int32_t num_prompt_tokens;
    int32_t num_tokens;
    int32_t num_computed_tokens;
    int32_t num_generated_tokens;
    int32_t num_pages;
    int32_t max_tokens;
    int32_t finish_reason;
} glmrt_request_info;

typedef struct glmrt_step_plan {
    int32_t num_requests;
    int32_t num_scheduled_requests;
    int32_t num_scheduled_tokens;
    int32_t num_new_pages;
    int32_t num_free_pages;
} glmrt_step_plan;

typedef struct glmrt_engine glmrt_engine;
typedef struct glmrt_request glmrt_request;

int32_t glmrt_abi_version(void);
const char *glmrt_status_name(glmrt_status status);
const char *glmrt_finish_reason_name(int32_t finish_reason);

void glmrt_engine_options_default(glmrt_engine_options *options);
void glmrt_sampling_params_default(glmrt_sampling_params *params);

glmrt_status glmrt_engine_create(const char *model_dir, const glmrt_model_config *config,
                                 const glmrt_engine_options *options, glmrt_engine **out_engine,
                                 char *error_message, int32_t error_capacity);
void glmrt_engine_free(glmrt_engine *engine);
const char *glmrt_engine_last_error(const glmrt_engine *engine);
glmrt_status glmrt_engine_get_stats(glmrt_engine *engine, glmrt_engine_stats *out_stats);
glmrt_status glmrt_engine_get_info(glmrt_engine *engine, glmrt_engine_info *out_info);
glmrt_status glmrt_engine_check_invariants(glmrt_engine *engine);
glmrt_status glmrt_engine_plan_step(glmrt_engine *engine, glmrt_request *const *requests, int32_t n,
                                    int32_t *out_num_scheduled_tokens, glmrt_step_plan *out_plan);

glmrt_status glmrt_request_create(glmrt_engine *engine, const glmrt_token *prompt_tokens,
                                  int32_t num_prompt_tokens, const glmrt_sampling_params *params,
                                  glmrt_request **out_request);
glmrt_status glmrt_request_free(glmrt_engine *engine, glmrt_request *request);
glmrt_status glmrt_request_preempt(glmrt_engine *engine, glmrt_request *request);
glmrt_status glmrt_request_get_info(glmrt_engine *engine, const glmrt_request *request,
                                    glmrt_request_info *out_info);
glmrt_status glmrt_request_get_infos(glmrt_engine *engine, glmrt_request *const *requests, int32_t n,
                                     glmrt_request_info *out_infos);
glmrt_status glmrt_request_get_tokens(glmrt_engine *engine, const glmrt_request *request,
                                      glmrt_token *out_tokens, int32_t capacity, int32_t *out_count);

glmrt_status glmrt_run_batch_decode(glmrt_engine *engine, glmrt_request *const *requests, int32_t n,
                                    int64_t *out_tokens, int32_t *out_finish_reasons);
glmrt_status glmrt_step_launch(glmrt_engine *engine, glmrt_request *const *requests, int32_t n);
glmrt_status glmrt_step_complete(glmrt_engine *engine, int32_t capacity, int64_t *out_tokens,
                                 int32_t *out_finish_reasons, int32_t *out_count);
glmrt_status glmrt_step_complete_relaunch(glmrt_engine *engine, int32_t capacity, int64_t *out_tokens,
                                          int32_t *out_finish_reasons, int32_t *out_count, int32_t *out_relaunched);
glmrt_status glmrt_run_batch_decode_logits(glmrt_engine *engine, glmrt_request *const *requests, int32_t n,
                                           int64_t *out_tokens, int32_t *out_finish_reasons, float *out_logits);

glmrt_status glmrt_fp8_e4m3_decode(const uint8_t *bits, float *out_values, int64_t n);
glmrt_status glmrt_fp8_e4m3_encode(const float *values, uint8_t *out_bits, int64_t n);
glmrt_status glmrt_sample_logits(const float *logits, int32_t vocab_size, const glmrt_sampling_params *params,
                                 const glmrt_token *history, int32_t num_prompt_tokens, int32_t num_history,
                                 glmrt_token *out_token);
glmrt_status glmrt_sampling_probabilities(const float *logits, int32_t vocab_size,
                                          const glmrt_sampling_params *params, const glmrt_token *history,
                                          int32_t num_prompt_tokens, int32_t num_history, float *out_probs);
glmrt_status glmrt_plan_ranks(const glmrt_model_config *config, int32_t num_devices, int32_t expert_split,
                              glmrt_rank_info *out_ranks, char *error_message, int32_t error_capacity);
glmrt_status glmrt_model_config_check(const glmrt_model_config *config, char *error_message, int32_t error_capacity);
glmrt_status glmrt_checkpoint_validate(const char *model_dir, const glmrt_model_config *config,
                                        char *error_message, int32_t error_capacity);
glmrt_status glmrt_safetensors_validate(const char *path, char *error_message,
                                        int32_t error_capacity, int32_t *out_num_tensors);

#ifdef __cplusplus
}
#endif

#endif
