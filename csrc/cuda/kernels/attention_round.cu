#include <stdint.h>

#include "activation_quant.cuh"
#include "attention.cuh"
#include "attention_merge.cuh"
#include "attention_round.cuh"
#include "cuda_check.cuh"
#include "dependent_launch.cuh"

__device__ __forceinline__ int32_t glmrt_merge_round_find(const glmrt_cuda_attention_merge_args &merge, int32_t row,
                                                         int32_t *found)
{
    if (threadIdx.x == 0) {
        *found = -1;
    }
    __syncthreads();
    const int32_t count = merge.device_num_merges != nullptr ? *merge.device_num_merges : merge.num_merges;
    for (int32_t i = (int32_t)threadIdx.x; i < count; i += (int32_t)blockDim.x) {
        if (merge.merges[i].token == row) {
            *found = i;
        }
    }
    __syncthreads();
    return *found;
}

__device__ __forceinline__ float4 glmrt_merge_round_values(const glmrt_cuda_attention_merge_args &merge,
                                                           int32_t merge_index, int32_t row, int32_t column)
{
    if (merge_index < 0) {
        return *reinterpret_cast<const float4 *>(merge.out + (int64_t)row * merge.out_stride + column);
    }
    const int32_t head = column / merge.head_dim;
    const glmrt_merge_lane<4> lane =
        glmrt_merge_values<4>(merge, merge.merges[merge_index], head, column - head * merge.head_dim);
    return make_float4(lane.v[0], lane.v[1], lane.v[2], lane.v[3]);
}

__global__ void __launch_bounds__(GLMRT_ACTIVATION_THREADS)
    glmrt_attention_merge_round_kernel(glmrt_cuda_attention_merge_args merge, uint8_t *out, float *out_scales,
                                       int32_t cols, int32_t slice_cols)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    glmrt_dependent_enter();
    __shared__ float warp_max[GLMRT_ACTIVATION_THREADS / 32];
    __shared__ float slice_max;
    __shared__ int32_t found;
    const int32_t row = (int32_t)blockIdx.y;
    const int32_t merge_index = glmrt_merge_round_find(merge, row, &found);
    const int32_t lo = (int32_t)blockIdx.x * slice_cols;
    const int32_t hi = min(cols, lo + slice_cols);
    const int32_t first = lo + (int32_t)threadIdx.x * 4;
    float4 cached[GLMRT_CLUSTER_VECTORS];
    float amax = 0.0f;
#pragma unroll
    for (int k = 0; k < GLMRT_CLUSTER_VECTORS; ++k) {
        const int32_t c = first + k * GLMRT_CLUSTER_VECTOR_STRIDE;
        cached[k] = c < hi ? glmrt_merge_round_values(merge, merge_index, row, c) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        amax = glmrt_abs_max4(cached[k], amax);
    }
    const float scale = glmrt_activation_cluster_scale(amax, warp_max, &slice_max);
    glmrt_activation_cluster_store<GLMRT_OPERAND_FP8>(out, out_scales, cols, row, cached, first, hi, scale);
#endif
}

static int32_t glmrt_merge_round_cols(const glmrt_cuda_attention_merge_args *merge)
{
    return merge->num_kv_heads * merge->group * merge->head_dim;
}

int32_t glmrt_cuda_attention_merge_round_blocks(const glmrt_cuda_attention_merge_args *merge, int32_t num_rows,
                                                const glmrt_cuda_qgemm_operand *rounded, int32_t sms)
{
    const int32_t cols = glmrt_merge_round_cols(merge);
    if (rounded == nullptr || rounded->cols != cols || merge->head_dim % 4 != 0 || merge->out_stride % 4 != 0 ||
        num_rows < 1 || num_rows > rounded->capacity_rows) {
        return 0;
    }
    return glmrt_cuda_activation_cluster_blocks(num_rows, cols, rounded->kind, sms);
}

glmrt_status glmrt_cuda_attention_merge_round(const glmrt_cuda_attention_merge_args *merge, int32_t num_rows,
                                              const glmrt_cuda_qgemm_operand *rounded, int32_t sms,
                                              cudaStream_t stream, glmrt_error *error)
{
    const int32_t blocks = glmrt_cuda_attention_merge_round_blocks(merge, num_rows, rounded, sms);
    if (blocks <= 0) {
        return glmrt_error_set(error, GLMRT_ERR_INVARIANT,
                               "the merge and rounding of %d rows of %d heads of %d cannot run in one cluster kernel",
                               num_rows, merge->num_kv_heads * merge->group, merge->head_dim);
    }
    const int32_t cols = glmrt_merge_round_cols(merge);
    dim3 grid((unsigned)blocks, (unsigned)num_rows);
    glmrt_dependent_launch dependent;
    const cudaLaunchConfig_t *config =
        glmrt_dependent_cluster_config(&dependent, grid, GLMRT_ACTIVATION_THREADS, 0, stream, (unsigned)blocks);
    GLMRT_CUDA_TRY(error, cudaLaunchKernelEx(config, glmrt_attention_merge_round_kernel, *merge, rounded->data,
                                             rounded->scales, cols,
                                             glmrt_cuda_activation_cluster_slice_cols(cols, blocks)));
    return GLMRT_OK;
}
