#ifndef GLMRT_CLUSTER_OPS_CUH
#define GLMRT_CLUSTER_OPS_CUH

#include <stdint.h>

__device__ __forceinline__ uint32_t glmrt_cluster_rank(void)
{
    uint32_t rank;
    asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(rank));
    return rank;
}

__device__ __forceinline__ void glmrt_cluster_sync(void)
{
    asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}

__device__ __forceinline__ void glmrt_cluster_arrive_relaxed(void)
{
    asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory");
}

__device__ __forceinline__ void glmrt_cluster_wait(void)
{
    asm volatile("barrier.cluster.wait.aligned;\n" ::: "memory");
}

__device__ __forceinline__ void glmrt_cluster_store(uint32_t shared_address, uint32_t rank, uint32_t value)
{
    uint32_t remote;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(shared_address), "r"(rank));
    asm volatile("st.shared::cluster.u32 [%0], %1;\n" ::"r"(remote), "r"(value) : "memory");
}

__device__ __forceinline__ float glmrt_cluster_load(const float *local, uint32_t rank)
{
    const uint32_t address = (uint32_t)__cvta_generic_to_shared(local);
    uint32_t remote;
    float value;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(address), "r"(rank));
    asm volatile("ld.shared::cluster.f32 %0, [%1];\n" : "=f"(value) : "r"(remote) : "memory");
    return value;
}

#endif
