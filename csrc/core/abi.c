#include <string.h>

#include "glmrt.h"

int32_t glmrt_abi_version(void)
{
    return GLMRT_ABI_VERSION;
}

const char *glmrt_status_name(glmrt_status status)
{
    switch (status) {
    case GLMRT_OK: return "OK";
    case GLMRT_ERR_INVALID_ARGUMENT: return "INVALID_ARGUMENT";
    case GLMRT_ERR_IO: return "IO";
    case GLMRT_ERR_FORMAT: return "FORMAT";
    case GLMRT_ERR_MISSING_TENSOR: return "MISSING_TENSOR";
    case GLMRT_ERR_OUT_OF_MEMORY: return "OUT_OF_MEMORY";
    case GLMRT_ERR_OUT_OF_PAGES: return "OUT_OF_PAGES";
    case GLMRT_ERR_CONTEXT_LENGTH: return "CONTEXT_LENGTH";
    case GLMRT_ERR_UNSUPPORTED: return "UNSUPPORTED";
    case GLMRT_ERR_BACKEND: return "BACKEND";
    case GLMRT_ERR_INVARIANT: return "INVARIANT";
    default: return "UNKNOWN";
    }
}

const char *glmrt_finish_reason_name(int32_t finish_reason)
{
    switch (finish_reason) {
    case GLMRT_FINISH_NONE: return "";
    case GLMRT_FINISH_STOP: return "stop";
    case GLMRT_FINISH_LENGTH: return "length";
    default: return "unknown";
    }
}

void glmrt_engine_options_default(glmrt_engine_options *options)
{
    if (options == NULL) {
        return;
    }
    memset(options, 0, sizeof(*options));
    options->backend = GLMRT_BACKEND_CPU;
    options->num_threads = 0;
    options->max_batch = 32;
    options->max_tokens_per_step = 256;
    options->kv_page_size = 16;
    options->kv_num_pages = 1024;
    options->max_context = 0;
    options->device_id = 0;
    options->num_devices = 1;
    options->kv_memory_fraction = 0.9f;
    options->random_weights = 0;
    options->random_seed = 0;
    options->enable_prefix_caching = 1;
    options->matmul_precision = GLMRT_MATMUL_DEFAULT;
    options->decode_graphs = GLMRT_DECODE_GRAPHS_DEFAULT;
    options->dependent_launches = GLMRT_DEPENDENT_LAUNCHES_DEFAULT;
    options->all_reduce = GLMRT_ALL_REDUCE_AUTO;
    options->expert_split = GLMRT_EXPERT_SPLIT_WHOLE;
    options->launch_ahead = GLMRT_LAUNCH_AHEAD_DEFAULT;
}
