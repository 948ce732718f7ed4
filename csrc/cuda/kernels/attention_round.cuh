#ifndef GLMRT_ATTENTION_ROUND_CUH
#define GLMRT_ATTENTION_ROUND_CUH

#include "attention.cuh"
#include "qgemm.cuh"

int32_t glmrt_cuda_attention_merge_round_blocks(const glmrt_cuda_attention_merge_args *merge, int32_t num_rows,
                                                const glmrt_cuda_qgemm_operand *rounded, int32_t sms);
glmrt_status glmrt_cuda_attention_merge_round(const glmrt_cuda_attention_merge_args *merge, int32_t num_rows,
                                              const glmrt_cuda_qgemm_operand *rounded, int32_t sms,
                                              cudaStream_t stream, glmrt_error *error);

#endif
