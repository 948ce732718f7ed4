#ifndef GLMRT_QGEMM_CUH
#define GLMRT_QGEMM_CUH

#include <cuda.h>
#include <cuda_runtime.h>

#include "gemm.cuh"
#include "tensor_map.cuh"

#define GLMRT_QGEMM_WEIGHT_TILE_ROWS 64
#define GLMRT_QGEMM_ACTIVATION_BOX_ROWS 8
#define GLMRT_QGEMM_TILE_WIDTHS 5
#define GLMRT_QGEMM_MAX_TILE_ROWS 128
#define GLMRT_QGEMM_SPLIT_MAX_ROWS 64
#define GLMRT_QGEMM_EXPERT_TILE_HEADROOM 2
#define GLMRT_QGEMM_MAX_SPLITS 4
#define GLMRT_QGEMM_MIN_SPLIT_K_BLOCKS 4
#define GLMRT_QGEMM_CTAS_PER_SM_TARGET 2
#define GLMRT_QGEMM_PARTIAL_TILE (GLMRT_QGEMM_SPLIT_MAX_ROWS * GLMRT_QGEMM_WEIGHT_TILE_ROWS)

typedef struct glmrt_cuda_qgemm_weight {
    CUtensorMap map;
    CUtensorMap pair_map;
    int32_t kind;
    int32_t k_blocks;
    int32_t weight_tiles;
    int32_t splits;
    int32_t split_k_blocks;
    int32_t num_sms;
    int32_t promote_steps;
} glmrt_cuda_qgemm_weight;

typedef struct glmrt_cuda_qgemm_operand {
    CUtensorMap map[GLMRT_QGEMM_TILE_WIDTHS];
    uint8_t *data;
    float *scales;
    int32_t kind;
    int32_t cols;
    int32_t capacity_rows;
} glmrt_cuda_qgemm_operand;

typedef struct glmrt_cuda_qgemm_split {
    float *partials;
    int32_t *counters;
    int64_t partial_elements;
    int32_t num_counters;
} glmrt_cuda_qgemm_split;

typedef struct glmrt_cuda_qgemm_call {
    const glmrt_cuda_matrix *w;
    const glmrt_cuda_qgemm_operand *x;
    int32_t num_rows;
    const glmrt_cuda_gemm_tile *tiles;
    const int32_t *num_tiles;
    int32_t grid_tiles;
    int32_t tile_rows;
    float *y;
    int64_t y_stride;
    const float *bias;
    int32_t accumulate;
    int32_t gated;
} glmrt_cuda_qgemm_call;

int glmrt_cuda_qgemm_device_supported(int device);
int glmrt_cuda_qgemm_matrix_supported(const glmrt_cuda_matrix *w);
int32_t glmrt_cuda_qgemm_operand_kind(const glmrt_cuda_matrix *w);
int32_t glmrt_cuda_qgemm_splits_for(int32_t weight_tiles, int32_t k_blocks, int32_t num_sms);
int32_t glmrt_cuda_qgemm_tile_rows(int32_t rows_per_group);
int32_t glmrt_cuda_qgemm_expert_tile_rows(int32_t assignments, int32_t num_experts);
int64_t glmrt_cuda_qgemm_split_partial_elements(int32_t max_split_units);
int32_t glmrt_cuda_qgemm_split_counters(int32_t max_split_n);
int glmrt_cuda_qgemm_weight_splits(const glmrt_cuda_qgemm_weight *q);
glmrt_status glmrt_cuda_qgemm_weight_prepare(const glmrt_cuda_matrix *w, int32_t num_sms, int32_t allow_split,
                                             glmrt_cuda_qgemm_weight *out, glmrt_error *error);
glmrt_status glmrt_cuda_qgemm_operand_prepare(glmrt_cuda_qgemm_operand *operand, int32_t kind, uint8_t *data,
                                              float *scales, int32_t cols, int32_t capacity_rows, const char *what,
                                              glmrt_error *error);
int glmrt_cuda_qgemm_gates(const glmrt_cuda_qgemm_call *call);
glmrt_status glmrt_cuda_qgemm_run(const glmrt_cuda_qgemm_call *call, const glmrt_cuda_qgemm_split *split,
                                  cudaStream_t stream, glmrt_error *error);

#endif
