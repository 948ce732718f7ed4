#ifndef GLMRT_MOE_CUH
#define GLMRT_MOE_CUH

#include <cuda_runtime.h>

#include "gemm.cuh"

#define GLMRT_MOE_MAX_EXPERTS 512
#define GLMRT_MOE_MAX_TOP_K 32
#define GLMRT_MOE_MAX_GROUPS 32
#define GLMRT_MOE_COUNTERS 4
#define GLMRT_MOE_ARRIVALS_COUNTER 2

typedef struct glmrt_cuda_route_args {
    const float *logits;
    const float *correction_bias;
    int32_t num_tokens;
    int32_t num_experts;
    int32_t top_k;
    int32_t num_groups;
    int32_t keep_groups;
    int32_t normalize;
    float scaling;
    int32_t *topk_ids;
    float *topk_weights;
} glmrt_cuda_route_args;

typedef struct glmrt_cuda_dispatch_args {
    const int32_t *topk_ids;
    int32_t num_tokens;
    int32_t top_k;
    int32_t expert_begin;
    int32_t num_local_experts;
    int32_t tile_rows;
    int32_t *sorted_token;
    int32_t *assignment_row;
    glmrt_cuda_gemm_tile *tiles;
    int32_t *num_tiles;
    int32_t *num_sorted;
} glmrt_cuda_dispatch_args;

typedef struct glmrt_cuda_combine_args {
    const float *expert_out;
    const int32_t *assignment_row;
    const float *topk_weights;
    int32_t top_k;
    const float *shared_out;
    float *hidden;
    int32_t add_residual;
    int32_t num_tokens;
    int32_t hidden_size;
} glmrt_cuda_combine_args;

glmrt_status glmrt_cuda_moe_check(int32_t num_experts, int32_t top_k, int32_t num_groups, glmrt_error *error);
glmrt_status glmrt_cuda_moe_route(const glmrt_cuda_route_args *args, cudaStream_t stream, glmrt_error *error);
int32_t glmrt_cuda_moe_max_tiles(int32_t num_assignments, int32_t num_local_experts, int32_t tile_rows);
glmrt_status glmrt_cuda_moe_dispatch_check(const glmrt_cuda_dispatch_args *args, glmrt_error *error);
glmrt_status glmrt_cuda_moe_dispatch(const glmrt_cuda_dispatch_args *args, cudaStream_t stream, glmrt_error *error);
glmrt_status glmrt_cuda_moe_route_dispatch(const glmrt_cuda_route_args *route, const glmrt_cuda_dispatch_args *dispatch,
                                           cudaStream_t stream, glmrt_error *error);
glmrt_status glmrt_cuda_moe_combine(const glmrt_cuda_combine_args *args, cudaStream_t stream, glmrt_error *error);

#endif
