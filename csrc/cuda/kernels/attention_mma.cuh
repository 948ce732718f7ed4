#ifndef GLMRT_ATTENTION_MMA_CUH
#define GLMRT_ATTENTION_MMA_CUH

#include <cuda_bf16.h>
#include <stdint.h>

#define GLMRT_ATTN_BF16X2_ONES 0x3F803F80u
#define GLMRT_ATTN_LOG2E 1.4426950408889634f

__device__ __forceinline__ uint32_t glmrt_attn_smem_address(const void *pointer)
{
    return (uint32_t)__cvta_generic_to_shared(pointer);
}

__device__ __forceinline__ void glmrt_attn_cp_async(uint32_t shared_dst, const void *global_src)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(shared_dst), "l"(global_src) : "memory");
}

__device__ __forceinline__ void glmrt_attn_cp_async_zero(uint32_t shared_dst, const void *global_src)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, 0;\n" ::"r"(shared_dst), "l"(global_src) : "memory");
}

__device__ __forceinline__ void glmrt_attn_cp_async_arrive(uint32_t barrier)
{
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(barrier) : "memory");
}

__device__ __forceinline__ void glmrt_attn_cp_async_wait_all()
{
    asm volatile("cp.async.wait_all;\n" ::: "memory");
}

__device__ __forceinline__ void glmrt_attn_store_zero16(uint32_t shared_dst)
{
    asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};\n" ::"r"(shared_dst), "r"(0u) : "memory");
}

__device__ __forceinline__ void glmrt_attn_store16(uint32_t shared_dst, uint4 value)
{
    asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(shared_dst), "r"(value.x), "r"(value.y),
                 "r"(value.z), "r"(value.w)
                 : "memory");
}

__device__ __forceinline__ void glmrt_attn_store4(uint32_t shared_dst, uint32_t value)
{
    asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(shared_dst), "r"(value) : "memory");
}

__device__ __forceinline__ void glmrt_attn_cp_async_commit()
{
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}

template <int PENDING>
__device__ __forceinline__ void glmrt_attn_cp_async_wait()
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(PENDING) : "memory");
}

__device__ __forceinline__ void glmrt_attn_ldmatrix_x4(uint32_t *r, uint32_t address)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(address)
                 : "memory");
}

__device__ __forceinline__ void glmrt_attn_ldmatrix_x4_trans(uint32_t *r, uint32_t address)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(address)
                 : "memory");
}

__device__ __forceinline__ void glmrt_attn_ldmatrix_x2_trans(uint32_t *r, uint32_t address)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1])
                 : "r"(address)
                 : "memory");
}

__device__ __forceinline__ void glmrt_attn_mma(float *c, const uint32_t *a, uint32_t b0, uint32_t b1)
{
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ const char *glmrt_attn_settled(const char *pointer)
{
    uint64_t value;
    asm("mov.b64 %0, %1;\n" : "=l"(value) : "l"(reinterpret_cast<uint64_t>(pointer)));
    return reinterpret_cast<const char *>(value);
}

__device__ __forceinline__ uint32_t glmrt_attn_settled(uint32_t value)
{
    uint32_t out;
    asm("mov.b32 %0, %1;\n" : "=r"(out) : "r"(value));
    return out;
}

__device__ __forceinline__ float glmrt_attn_exp2(float x)
{
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

__device__ __forceinline__ uint32_t glmrt_attn_pack_bf16(float low, float high)
{
    __nv_bfloat162 pair = __floats2bfloat162_rn(low, high);
    return *reinterpret_cast<uint32_t *>(&pair);
}

template <int CHUNKS>
__device__ __forceinline__ uint32_t glmrt_attn_chunk_offset(int row, int chunk)
{
    static_assert(CHUNKS == 4 || CHUNKS % 8 == 0, "rows of 4 or a multiple of 8 chunks of 16 bytes");
    int swizzled = CHUNKS >= 8 ? (chunk ^ (row & 7)) : (chunk ^ ((row >> 1) & 3));
    return (uint32_t)((row * CHUNKS + swizzled) * 16);
}

template <int CHUNKS>
__device__ __forceinline__ uint32_t glmrt_attn_lane_offset(int row, int chunk_low)
{
    return glmrt_attn_chunk_offset<CHUNKS>(row, chunk_low);
}

__device__ __forceinline__ uint32_t glmrt_attn_pair_offset(uint32_t lane_offset, int pair)
{
    return lane_offset ^ ((uint32_t)pair << 5);
}

#endif
