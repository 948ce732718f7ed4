#ifndef GLMRT_DEPENDENT_LAUNCH_CUH
#define GLMRT_DEPENDENT_LAUNCH_CUH

#include <cuda_runtime.h>

__device__ __forceinline__ void glmrt_dependency_wait(void)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void glmrt_dependents_release(void)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void glmrt_dependent_enter(void)
{
    glmrt_dependency_wait();
    glmrt_dependents_release();
}

void glmrt_cuda_dependent_launches_set(bool enabled);
bool glmrt_cuda_dependent_launches(void);

typedef struct glmrt_dependent_launch {
    cudaLaunchConfig_t config;
    cudaLaunchAttribute attribute;
} glmrt_dependent_launch;

static inline const cudaLaunchConfig_t *glmrt_dependent_config(glmrt_dependent_launch *launch, dim3 grid, dim3 block,
                                                               size_t shared, cudaStream_t stream)
{
    launch->attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    launch->attribute.val.programmaticStreamSerializationAllowed = 1;
    launch->config.gridDim = grid;
    launch->config.blockDim = block;
    launch->config.dynamicSmemBytes = shared;
    launch->config.stream = stream;
    launch->config.attrs = &launch->attribute;
    launch->config.numAttrs = glmrt_cuda_dependent_launches() ? 1u : 0u;
    return &launch->config;
}

#endif
