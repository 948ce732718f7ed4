#include "qgemm_kernel.cuh"

glmrt_status glmrt_qgemm_launch_fp8_block_narrow(int32_t promote, int32_t bn, int32_t fold, const CUtensorMap *w_map,
                                                 const CUtensorMap *x_map, const glmrt_qgemm_params *p,
                                                 int32_t grid_limit, int32_t num_sms, cudaStream_t stream,
                                                 glmrt_error *error)
{
    if (promote == 1) {
        return glmrt_qgemm_launch_width<GLMRT_OPERAND_FP8, GLMRT_CUDA_SCALE_BLOCK, 1>(bn, fold, w_map, x_map, p,
                                                                                     grid_limit, num_sms, stream, error);
    }
    if (promote == 2) {
        return glmrt_qgemm_launch_width<GLMRT_OPERAND_FP8, GLMRT_CUDA_SCALE_BLOCK, 2>(bn, fold, w_map, x_map, p,
                                                                                     grid_limit, num_sms, stream, error);
    }
    return glmrt_error_set(error, GLMRT_ERR_INVARIANT, "no quantized GEMM promoting every %d k steps", promote);
}
