#ifndef GLMRT_WGMMA_OPS_CUH
#define GLMRT_WGMMA_OPS_CUH

#include <cuda.h>
#include <stdint.h>

#include "wgmma_instructions.cuh"

#define GLMRT_WGMMA_SWIZZLE_ATOM_BYTES 1024

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

__device__ __forceinline__ uint32_t glmrt_shared_address(const void *pointer)
{
    return (uint32_t)__cvta_generic_to_shared(pointer);
}

__device__ __forceinline__ void glmrt_mbarrier_init(uint64_t *barrier, uint32_t arrivals)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(glmrt_shared_address(barrier)), "r"(arrivals)
                 : "memory");
}

__device__ __forceinline__ void glmrt_fence_barrier_init()
{
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

__device__ __forceinline__ void glmrt_mbarrier_expect_bytes(uint64_t *barrier, uint32_t bytes)
{
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(glmrt_shared_address(barrier)),
                 "r"(bytes)
                 : "memory");
}

__device__ __forceinline__ void glmrt_mbarrier_arrive(uint64_t *barrier)
{
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(glmrt_shared_address(barrier)) : "memory");
}

__device__ __forceinline__ uint32_t glmrt_mbarrier_try_wait(uint64_t *barrier, uint32_t phase)
{
    uint32_t done = 0;
    asm volatile(
        "{\n"
        ".reg .pred ready;\n"
        "mbarrier.try_wait.parity.shared::cta.b64 ready, [%1], %2;\n"
        "selp.u32 %0, 1, 0, ready;\n"
        "}\n"
        : "=r"(done)
        : "r"(glmrt_shared_address(barrier)), "r"(phase)
        : "memory");
    return done;
}

__device__ __forceinline__ void glmrt_mbarrier_wait(uint64_t *barrier, uint32_t phase)
{
    while (!glmrt_mbarrier_try_wait(barrier, phase)) {
    }
}

__device__ __forceinline__ void glmrt_tma_load_2d(void *destination, const CUtensorMap *map, uint64_t *barrier,
                                                  int32_t inner, int32_t outer)
{
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];\n" ::
            "r"(glmrt_shared_address(destination)),
        "l"(map), "r"(glmrt_shared_address(barrier)), "r"(inner), "r"(outer)
        : "memory");
}

__device__ __forceinline__ uint64_t glmrt_l2_evict_first_policy(void)
{
    uint64_t policy;
    asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
    return policy;
}

__device__ __forceinline__ void glmrt_tma_load_2d_evict_first(void *destination, const CUtensorMap *map,
                                                              uint64_t *barrier, int32_t inner, int32_t outer)
{
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], "
                 "[%1, {%3, %4}], [%2], %5;\n" ::"r"(glmrt_shared_address(destination)),
                 "l"(map), "r"(glmrt_shared_address(barrier)), "r"(inner), "r"(outer),
                 "l"(glmrt_l2_evict_first_policy())
                 : "memory");
}

__device__ __forceinline__ void glmrt_tma_prefetch_map(const CUtensorMap *map)
{
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(map) : "memory");
}

__device__ __forceinline__ uint32_t glmrt_wgmma_descriptor_low(uint32_t address, uint32_t leading_bytes)
{
    return ((address & 0x3FFFFu) >> 4) | (((leading_bytes >> 4) & 0x3FFFu) << 16);
}

__device__ __forceinline__ uint32_t glmrt_wgmma_descriptor_low_step(uint32_t bytes)
{
    return bytes >> 4;
}

__device__ __forceinline__ uint64_t glmrt_wgmma_descriptor_of_low(uint32_t low)
{
    const uint32_t high = (GLMRT_WGMMA_SWIZZLE_ATOM_BYTES >> 4) | (1u << 30);
    return ((uint64_t)high << 32) | low;
}

__device__ __forceinline__ uint64_t glmrt_wgmma_descriptor_at(uint32_t address, uint32_t leading_bytes)
{
    return glmrt_wgmma_descriptor_of_low(glmrt_wgmma_descriptor_low(address, leading_bytes));
}

__device__ __forceinline__ uint64_t glmrt_wgmma_descriptor(const void *tile)
{
    return glmrt_wgmma_descriptor_at(glmrt_shared_address(tile), 16);
}

__device__ __forceinline__ void glmrt_fence_async_shared()
{
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

__device__ __forceinline__ void glmrt_named_barrier(uint32_t id, uint32_t threads)
{
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

__device__ __forceinline__ void glmrt_wgmma_fence()
{
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}

__device__ __forceinline__ void glmrt_wgmma_commit()
{
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}

__device__ __forceinline__ void glmrt_wgmma_wait_all()
{
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
}

__device__ __forceinline__ void glmrt_wgmma_wait_all_but_one()
{
    asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
}

template <int COUNT>
__device__ __forceinline__ void glmrt_wgmma_fence_registers(float *values)
{
#pragma unroll
    for (int i = 0; i < COUNT; ++i) {
        asm volatile("" : "+f"(values[i])::"memory");
    }
}

template <int REGISTERS>
__device__ __forceinline__ void glmrt_registers_raise()
{
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(REGISTERS));
}

template <int REGISTERS>
__device__ __forceinline__ void glmrt_registers_lower()
{
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(REGISTERS));
}

#endif

#endif
