#ifndef GLMRT_ATTENTION_KERNELS_CUH
#define GLMRT_ATTENTION_KERNELS_CUH

#include "attention.cuh"

typedef void (*glmrt_attention_kernel_fn)(glmrt_cuda_attention_args);

typedef struct glmrt_attention_kernel_choice {
    glmrt_attention_kernel_fn kernel;
    size_t shared;
    int threads;
    const char *name;
} glmrt_attention_kernel_choice;

int glmrt_attention_head_dim_supported(int32_t head_dim);
glmrt_status glmrt_attention_kernel_prepare(const glmrt_attention_kernel_choice *choice, int32_t head_dim,
                                            glmrt_error *error);
glmrt_status glmrt_attention_items_launch(const glmrt_attention_kernel_choice *choice,
                                          const glmrt_cuda_attention_args *args, dim3 grid, cudaStream_t stream,
                                          glmrt_error *error);
glmrt_status glmrt_attention_decode_prepare(int32_t head_dim, glmrt_error *error);
glmrt_status glmrt_attention_decode_launch(const glmrt_cuda_attention_args *args, cudaStream_t stream,
                                           glmrt_error *error);
glmrt_status glmrt_attention_decode_spread_prepare(int32_t head_dim, glmrt_error *error);
int32_t glmrt_attention_decode_spread_clusters(const glmrt_cuda_attention_args *args, int32_t sms);
glmrt_status glmrt_attention_decode_spread_launch(const glmrt_cuda_attention_args *args, int32_t clusters,
                                                  cudaStream_t stream, glmrt_error *error);
glmrt_status glmrt_attention_prefill_prepare(int32_t head_dim, glmrt_error *error);
glmrt_status glmrt_attention_prefill_launch(const glmrt_cuda_attention_args *args, cudaStream_t stream,
                                            glmrt_error *error);
int glmrt_attention_prefill_wgmma_supported(int32_t head_dim);
glmrt_status glmrt_attention_prefill_wgmma_prepare(int32_t head_dim, glmrt_error *error);
glmrt_status glmrt_attention_prefill_wgmma_launch(const glmrt_cuda_attention_args *args, cudaStream_t stream,
                                                  glmrt_error *error);

#endif
