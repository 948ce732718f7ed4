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
    cudaLaunchAttribute attributes[2];
} glmrt_dependent_launch;

static inline const cudaLaunchConfig_t *glmrt_dependent_config(glmrt_dependent_launch *launch, dim3 grid, dim3 block,
                                                               size_t shared, cudaStream_t stream)
{
    launch->attributes[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    launch->attributes[0].val.programmaticStreamSerializationAllowed = 1;
    launch->config.gridDim = grid;
    launch->config.blockDim = block;
    launch->config.dynamicSmemBytes = shared;
    launch->config.stream = stream;
    launch->config.attrs = launch->attributes;
    launch->config.numAttrs = glmrt_cuda_dependent_launches() ? 1u : 0u;
    return &launch->config;
}

static inline const cudaLaunchConfig_t *glmrt_dependent_cluster_config(glmrt_dependent_launch *launch, dim3 grid,
                                                                       dim3 block, size_t shared,
                                                                       cudaStream_t stream, unsigned cluster_x)
{
    glmrt_dependent_config(launch, grid, block, shared, stream);
    cudaLaunchAttribute *cluster = &launch->attributes[launch->config.numAttrs];
    cluster->id = cudaLaunchAttributeClusterDimension;
    cluster->val.clusterDim.x = cluster_x;
    cluster->val.clusterDim.y = 1;
    cluster->val.clusterDim.z = 1;
    launch->config.numAttrs += 1;
    return &launch->config;
}

#endif
