#include "qgemm_kernel.cuh"

glmrt_status glmrt_qgemm_launch_fp8_channel(int32_t bn, int32_t fold, const CUtensorMap *w_map,
                                            const CUtensorMap *x_map, const glmrt_qgemm_params *p,
                                            int32_t grid_limit, int32_t num_sms, cudaStream_t stream,
                                            glmrt_error *error)
{
    return glmrt_qgemm_launch_width<GLMRT_OPERAND_FP8, GLMRT_CUDA_SCALE_CHANNEL, GLMRT_QGEMM_K_STEPS>(
        bn, fold, w_map, x_map, p, grid_limit, num_sms, stream, error);
}
