#ifndef GLMRT_ATTENTION_TILE_CUH
#define GLMRT_ATTENTION_TILE_CUH

#include <math.h>

#include "attention.cuh"
#include "attention_mma.cuh"

typedef struct glmrt_attn_fold_weights {
    float merged;
    float chunk;
    float max;
} glmrt_attn_fold_weights;

#define GLMRT_ATTN_TILE_PAGES (GLMRT_ATTENTION_KEY_TILE + 1)
#define GLMRT_ATTN_MAX_SLACK 8.0f
#define GLMRT_ATTN_SMEM_ALIGN 1024

typedef struct glmrt_attn_slot {
    int32_t page_index;
    int32_t slot;
} glmrt_attn_slot;

__device__ __forceinline__ glmrt_attn_slot glmrt_attn_slot_of(int32_t key, int32_t page_size)
{
    glmrt_attn_slot at;
    if ((page_size & (page_size - 1)) == 0) {
        int shift = __ffs(page_size) - 1;
        at.page_index = key >> shift;
        at.slot = key & (page_size - 1);
    } else {
        at.page_index = key / page_size;
        at.slot = key - at.page_index * page_size;
    }
    return at;
}

template <int HD, int THREADS>
struct glmrt_attn_tile_layout {
    static constexpr int chunks = HD / 8;
    static constexpr int keys_per_pass = THREADS / chunks;
    static constexpr int passes = GLMRT_ATTENTION_KEY_TILE / keys_per_pass;
    static_assert(THREADS % chunks == 0 && GLMRT_ATTENTION_KEY_TILE % keys_per_pass == 0, "tile load layout");
    static_assert(keys_per_pass % 8 == 0, "a pass moves whole swizzle periods of 8 keys");
};

template <int HD, int THREADS>
__device__ __forceinline__ void glmrt_attn_fetch_pass_pages(const int32_t *pages, int32_t page_size,
                                                            int32_t tile_start, int32_t key_limit, int32_t *ids)
{
    using layout = glmrt_attn_tile_layout<HD, THREADS>;
    const int first_row = threadIdx.x / layout::chunks;
#pragma unroll
    for (int pass = 0; pass < layout::passes; ++pass) {
        int32_t key = tile_start + first_row + pass * layout::keys_per_pass;
        ids[pass] = key < key_limit ? pages[glmrt_attn_slot_of(key, page_size).page_index] : 0;
    }
}

template <int THREADS>
__device__ __forceinline__ void glmrt_attn_fetch_tile_pages(const int32_t *pages, int32_t page_size,
                                                            int32_t tile_start, int32_t key_limit, uint32_t ring_slot)
{
    if (tile_start >= key_limit) {
        return;
    }
    int32_t first = glmrt_attn_slot_of(tile_start, page_size).page_index;
    int32_t last_key = min(tile_start + GLMRT_ATTENTION_KEY_TILE, key_limit) - 1;
    int32_t count = glmrt_attn_slot_of(last_key, page_size).page_index - first + 1;
    for (int32_t i = threadIdx.x; i < count; i += THREADS) {
        asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(ring_slot + 4u * (uint32_t)i),
                     "l"(pages + first + i)
                     : "memory");
    }
}

#define GLMRT_ATTN_PANEL_COLS 64
#define GLMRT_ATTN_PANEL_ROW_BYTES (GLMRT_ATTN_PANEL_COLS * 2)
#define GLMRT_ATTN_PANEL_BYTES (GLMRT_ATTENTION_KEY_TILE * GLMRT_ATTN_PANEL_ROW_BYTES)

__device__ __forceinline__ uint32_t glmrt_attn_panel_offset(int row, int chunk)
{
    return (uint32_t)((chunk >> 3) * GLMRT_ATTN_PANEL_BYTES + row * GLMRT_ATTN_PANEL_ROW_BYTES +
                      (((chunk & 7) ^ (row & 7)) << 4));
}

template <int HD, bool PANELS>
struct glmrt_attn_tile_rows {
    static __device__ __forceinline__ uint32_t offset(int row, int chunk)
    {
        if constexpr (PANELS) {
            return glmrt_attn_panel_offset(row, chunk);
        } else {
            return glmrt_attn_chunk_offset<HD / 8>(row, chunk);
        }
    }
    static constexpr int row_bytes = PANELS ? GLMRT_ATTN_PANEL_ROW_BYTES : HD * 2;
};

__device__ __forceinline__ const char *glmrt_attn_head_keys(const glmrt_cuda_attention_args &args, int32_t kv_head)
{
    return reinterpret_cast<const char *>(args.kv.base) +
           2 * ((int64_t)args.layer * args.kv.layer_elements + (int64_t)kv_head * args.kv.head_elements);
}

__device__ __forceinline__ int32_t glmrt_attn_value_bytes(const glmrt_cuda_attention_args &args)
{
    return 2 * args.kv.num_kv_heads * args.kv.head_elements;
}

template <int HD, int THREADS, bool PANELS = false, bool VALUES = true, typename PageOf>
__device__ __forceinline__ void glmrt_attn_load_kv_tile(const glmrt_cuda_attention_args &args, int32_t kv_head,
                                                        int32_t tile_start, int32_t key_limit, PageOf page_of,
                                                        uint32_t k_tile, uint32_t v_tile)
{
    using layout = glmrt_attn_tile_layout<HD, THREADS>;
    const int chunk = threadIdx.x % layout::chunks;
    const int first_row = threadIdx.x / layout::chunks;
    const char *keys = glmrt_attn_settled(glmrt_attn_head_keys(args, kv_head) + chunk * 16);
    const int32_t page_bytes = (int32_t)glmrt_attn_settled((uint32_t)(2 * args.kv.page_elements));
    const int32_t value_bytes = (int32_t)glmrt_attn_settled((uint32_t)glmrt_attn_value_bytes(args));
    const int32_t page_size = args.kv.page_size;
    const bool power_of_two = (page_size & (page_size - 1)) == 0;
    const int shift = __ffs(page_size) - 1;
    using rows = glmrt_attn_tile_rows<HD, PANELS>;
    const uint32_t first_offset = glmrt_attn_settled(rows::offset(first_row, chunk));
    const int32_t first_key = tile_start + first_row;
#pragma unroll
    for (int pass = 0; pass < layout::passes; ++pass) {
        const int32_t key = first_key + pass * layout::keys_per_pass;
        const uint32_t offset = first_offset + (uint32_t)(pass * layout::keys_per_pass * rows::row_bytes);
        if (key < key_limit) {
            const int32_t page_index = power_of_two ? key >> shift : key / page_size;
            const int32_t slot = key - page_index * page_size;
            const char *src = keys + (int64_t)page_of(pass, page_index) * page_bytes + slot * (HD * 2);
            glmrt_attn_cp_async(k_tile + offset, src);
            if constexpr (VALUES) {
                glmrt_attn_cp_async(v_tile + offset, src + value_bytes);
            }
        } else {
            glmrt_attn_cp_async_zero(k_tile + offset, keys);
            if constexpr (VALUES) {
                glmrt_attn_cp_async_zero(v_tile + offset, keys);
            }
        }
    }
}

__device__ __forceinline__ void glmrt_attn_store_q_values(uint32_t shared_dst, float4 low, float4 high, float q_scale)
{
    uint4 packed;
    packed.x = glmrt_attn_pack_bf16(__fmul_rn(low.x, q_scale), __fmul_rn(low.y, q_scale));
    packed.y = glmrt_attn_pack_bf16(__fmul_rn(low.z, q_scale), __fmul_rn(low.w, q_scale));
    packed.z = glmrt_attn_pack_bf16(__fmul_rn(high.x, q_scale), __fmul_rn(high.y, q_scale));
    packed.w = glmrt_attn_pack_bf16(__fmul_rn(high.z, q_scale), __fmul_rn(high.w, q_scale));
    glmrt_attn_store16(shared_dst, packed);
}

__device__ __forceinline__ void glmrt_attn_store_q_chunk(uint32_t shared_dst, const float *q, float q_scale)
{
    glmrt_attn_store_q_values(shared_dst, *reinterpret_cast<const float4 *>(q), *reinterpret_cast<const float4 *>(q + 4),
                              q_scale);
}

__device__ __forceinline__ float glmrt_attn_q_scale(float scale)
{
    return __fmul_rn(scale, GLMRT_ATTN_LOG2E);
}

__device__ __forceinline__ float glmrt_attn_quad_max(float value)
{
    value = fmaxf(value, __shfl_xor_sync(0xffffffffu, value, 1));
    return fmaxf(value, __shfl_xor_sync(0xffffffffu, value, 2));
}

__device__ __forceinline__ float glmrt_attn_running_max(float old_max, float tile_max)
{
    return tile_max > __fadd_rn(old_max, GLMRT_ATTN_MAX_SLACK) ? tile_max : old_max;
}

__device__ __forceinline__ float glmrt_attn_rescale(float old_max, float new_max)
{
    return old_max == new_max ? 1.0f : glmrt_attn_exp2(__fsub_rn(old_max, new_max));
}

__device__ __forceinline__ float glmrt_attn_weight_reference(float new_max)
{
    return new_max == -INFINITY ? 0.0f : new_max;
}

__device__ __forceinline__ float glmrt_attn_weight(float score, float reference)
{
    return glmrt_attn_exp2(__fsub_rn(score, reference));
}

template <int KEY_TILES, int H>
__device__ __forceinline__ float glmrt_attn_row_softmax(float (*score)[4], float old_max, bool masked, int32_t limit,
                                                        int32_t key0)
{
    if (masked) {
#pragma unroll
        for (int j = 0; j < KEY_TILES; ++j) {
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                if (key0 + 8 * j + e >= limit) {
                    score[j][2 * H + e] = -INFINITY;
                }
            }
        }
    }
    float partial[KEY_TILES];
#pragma unroll
    for (int j = 0; j < KEY_TILES; ++j) {
        partial[j] = fmaxf(score[j][2 * H], score[j][2 * H + 1]);
    }
#pragma unroll
    for (int step = 1; step < KEY_TILES; step *= 2) {
#pragma unroll
        for (int j = 0; j + step < KEY_TILES; j += 2 * step) {
            partial[j] = fmaxf(partial[j], partial[j + step]);
        }
    }
    const float new_max = glmrt_attn_running_max(old_max, glmrt_attn_quad_max(partial[0]));
    const float reference = glmrt_attn_weight_reference(new_max);
#pragma unroll
    for (int j = 0; j < KEY_TILES; ++j) {
        score[j][2 * H] = glmrt_attn_weight(score[j][2 * H], reference);
        score[j][2 * H + 1] = glmrt_attn_weight(score[j][2 * H + 1], reference);
    }
    return new_max;
}

__device__ __forceinline__ void glmrt_attn_scale_rows(float *c, const float *alpha)
{
    c[0] = __fmul_rn(c[0], alpha[0]);
    c[1] = __fmul_rn(c[1], alpha[0]);
    c[2] = __fmul_rn(c[2], alpha[1]);
    c[3] = __fmul_rn(c[3], alpha[1]);
}

__device__ __forceinline__ void glmrt_attn_weights_to_a(uint32_t *a, const float *low_keys, const float *high_keys)
{
    a[0] = glmrt_attn_pack_bf16(low_keys[0], low_keys[1]);
    a[1] = glmrt_attn_pack_bf16(low_keys[2], low_keys[3]);
    a[2] = glmrt_attn_pack_bf16(high_keys[0], high_keys[1]);
    a[3] = glmrt_attn_pack_bf16(high_keys[2], high_keys[3]);
}

__device__ __forceinline__ uint32_t glmrt_attn_smem_align(uint32_t address)
{
    return (address + GLMRT_ATTN_SMEM_ALIGN - 1) & ~(uint32_t)(GLMRT_ATTN_SMEM_ALIGN - 1);
}

__device__ __forceinline__ glmrt_attn_fold_weights glmrt_attn_fold_weigh(float merged_max, float chunk_max)
{
    glmrt_attn_fold_weights w;
    w.max = fmaxf(merged_max, chunk_max);
    w.merged = glmrt_attn_exp2(__fsub_rn(merged_max, w.max));
    w.chunk = glmrt_attn_exp2(__fsub_rn(chunk_max, w.max));
    return w;
}

__device__ __forceinline__ float glmrt_attn_fold_value(float merged, float chunk, const glmrt_attn_fold_weights &w)
{
    return __fmaf_rn(chunk, w.chunk, __fmul_rn(merged, w.merged));
}

__device__ __forceinline__ float glmrt_attn_normalize(float sum, float weight_total)
{
    return __fdiv_rn(sum, weight_total);
}

#define GLMRT_ATTN_QUOTIENT_LOW 0x1p-40f
#define GLMRT_ATTN_QUOTIENT_HIGH 0x1p40f

__device__ __forceinline__ float glmrt_attn_refined_reciprocal(float divisor)
{
    float approximate;
    asm("rcp.approx.ftz.f32 %0, %1;\n" : "=f"(approximate) : "f"(divisor));
    return __fmaf_rn(approximate, __fmaf_rn(-divisor, approximate, 1.0f), approximate);
}

__device__ __forceinline__ float glmrt_attn_quotient_by(float sum, float divisor, float reciprocal)
{
    const float estimate = __fmul_rn(sum, reciprocal);
    return __fmaf_rn(reciprocal, __fmaf_rn(-divisor, estimate, sum), estimate);
}

__device__ __forceinline__ bool glmrt_attn_quotient_operand(float value)
{
    const float magnitude = fabsf(value);
    return magnitude >= GLMRT_ATTN_QUOTIENT_LOW && magnitude <= GLMRT_ATTN_QUOTIENT_HIGH;
}

#endif
