#ifndef GLMRT_ATTENTION_KERNELS_CUH
#define GLMRT_ATTENTION_KERNELS_CUH

#include "attention.cuh"

int glmrt_attention_head_dim_supported(int32_t head_dim);
glmrt_status glmrt_attention_decode_prepare(int32_t head_dim, glmrt_error *error);
glmrt_status glmrt_attention_decode_launch(const glmrt_cuda_attention_args *args, cudaStream_t stream,
                                           glmrt_error *error);
glmrt_status glmrt_attention_prefill_prepare(int32_t head_dim, glmrt_error *error);
glmrt_status glmrt_attention_prefill_launch(const glmrt_cuda_attention_args *args, cudaStream_t stream,
                                            glmrt_error *error);
int glmrt_attention_prefill_wgmma_supported(int32_t head_dim);
glmrt_status glmrt_attention_prefill_wgmma_prepare(int32_t head_dim, glmrt_error *error);
glmrt_status glmrt_attention_prefill_wgmma_launch(const glmrt_cuda_attention_args *args, cudaStream_t stream,
                                                  glmrt_error *error);

#endif
