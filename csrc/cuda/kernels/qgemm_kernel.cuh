#ifndef GLMRT_QGEMM_KERNEL_CUH
#define GLMRT_QGEMM_KERNEL_CUH

#include <atomic>

#include "cuda_check.cuh"
#include "dependent_launch.cuh"
#include "device_math.cuh"
#include "qgemm.cuh"
#include "wgmma_ops.cuh"

#define GLMRT_QGEMM_K_STEPS 4
#define GLMRT_QGEMM_CONSUMER_BARRIER 1
#define GLMRT_QGEMM_PRODUCER_REGISTERS 56
#define GLMRT_QGEMM_CONSUMER_REGISTERS 224
#define GLMRT_QGEMM_STAGE_CAP 8
#define GLMRT_QGEMM_OUT_PAD 4
#define GLMRT_QGEMM_SINGLE_SMEM_BUDGET (104 * 1024)
#define GLMRT_QGEMM_PAIR_SMEM_BUDGET (200 * 1024)

typedef struct glmrt_qgemm_params {
    glmrt_cuda_matrix w;
    const float *x_scales;
    float *y;
    int64_t y_stride;
    const float *bias;
    const glmrt_cuda_gemm_tile *tiles;
    const int32_t *num_tiles;
    float *partials;
    int32_t *counters;
    int32_t num_rows;
    int32_t k_blocks;
    int32_t splits;
    int32_t split_k_blocks;
    int32_t weight_tiles;
    int32_t token_tiles;
    int32_t split_units;
    int32_t accumulate;
    int32_t gated_rows;
    int32_t weights_read_once;
} glmrt_qgemm_params;

template <int KIND, int SCALE, int PROMOTE, int BN, int FOLD>
struct glmrt_qgemm_shape {
    static constexpr int bn = BN;
    static constexpr int consumers = BN >= 128 ? 2 : 1;
    static constexpr int consumer_threads = 128 * consumers;
    static constexpr int threads = consumer_threads + 128;
    static constexpr bool raise = consumers == 2;
    static constexpr int min_blocks = consumers == 1 ? 2 : 1;
    static constexpr int weight_tile_bytes = GLMRT_QGEMM_WEIGHT_TILE_ROWS * GLMRT_TENSOR_MAP_ROW_BYTES;
    static constexpr int box_rows = BN;
    static constexpr int box_bytes = box_rows * GLMRT_TENSOR_MAP_ROW_BYTES;
    static constexpr int a_bytes = consumers * weight_tile_bytes;
    static constexpr int b_bytes = BN * GLMRT_TENSOR_MAP_ROW_BYTES;
    static constexpr int stage_bytes = a_bytes + b_bytes;
    static constexpr bool folds = FOLD != 0;
    static constexpr bool staged = BN == GLMRT_QGEMM_MAX_TILE_ROWS;
    static constexpr int fold_bytes = folds && !staged ? consumer_threads * (BN / 2) * 4 : 0;
    static constexpr int cta_rows = consumers * GLMRT_QGEMM_WEIGHT_TILE_ROWS;
    static constexpr int out_stride = cta_rows + GLMRT_QGEMM_OUT_PAD;
    static constexpr int out_bytes = staged ? BN * out_stride * 4 : 0;
    static constexpr int budget =
        (consumers == 1 ? GLMRT_QGEMM_SINGLE_SMEM_BUDGET : GLMRT_QGEMM_PAIR_SMEM_BUDGET) - fold_bytes - out_bytes;
    static constexpr int fit = budget / stage_bytes;
    static constexpr int stages = fit > GLMRT_QGEMM_STAGE_CAP ? GLMRT_QGEMM_STAGE_CAP : fit;
    static constexpr int smem_bytes =
        stages * stage_bytes + fold_bytes + out_bytes + GLMRT_WGMMA_SWIZZLE_ATOM_BYTES + 2 * stages * 8;
    static constexpr int acc = BN / 2;
    static constexpr bool promoted = KIND == GLMRT_OPERAND_FP8;
    static constexpr int promotions = promoted ? GLMRT_QGEMM_K_STEPS / PROMOTE : 1;
    static constexpr bool two_partials = promoted && consumers == 2;
    static_assert(BN % box_rows == 0, "token tiles are whole TMA boxes");
    static_assert(stages >= 2, "the pipeline needs two stages");
    static_assert(GLMRT_QGEMM_K_STEPS % PROMOTE == 0, "promotion steps divide a k block");
};

__device__ __forceinline__ int32_t glmrt_qgemm_fragment_token(int i, int lane)
{
    return (i >> 2) * 8 + (lane & 3) * 2 + (i & 1);
}

__device__ __forceinline__ int32_t glmrt_qgemm_fragment_row(int i)
{
    return (i & 2) ? 8 : 0;
}

__device__ __forceinline__ float *glmrt_qgemm_staged_slots(float *out_tile, int consumer, int warp, int lane)
{
    return out_tile + consumer * GLMRT_QGEMM_WEIGHT_TILE_ROWS + warp * 16 + lane / 4;
}

template <typename SHAPE>
__device__ __forceinline__ int32_t glmrt_qgemm_staged_slot(int i, int lane)
{
    return glmrt_qgemm_fragment_token(i, lane) * SHAPE::out_stride + glmrt_qgemm_fragment_row(i);
}

typedef struct glmrt_qgemm_segment {
    int32_t tile;
    int32_t token_tile;
    int32_t split;
    int32_t k_begin;
    int32_t k_end;
} glmrt_qgemm_segment;

typedef struct glmrt_qgemm_walk {
    int32_t next;
    int32_t end;
    int32_t step;
    int32_t token_tiles;
    int32_t cta_tiles;
} glmrt_qgemm_walk;

__device__ __forceinline__ glmrt_qgemm_walk glmrt_qgemm_walk_begin(const glmrt_qgemm_params &p, int32_t units,
                                                                   int consumers)
{
    glmrt_qgemm_walk walk;
    walk.token_tiles = p.tiles != nullptr ? *p.num_tiles : p.token_tiles;
    walk.cta_tiles = (p.weight_tiles + consumers - 1) / consumers;
    walk.next = (int32_t)blockIdx.x;
    walk.end = p.split_units ? (int32_t)blockIdx.x + 1 : units;
    walk.step = (int32_t)gridDim.x;
    return walk;
}

__device__ __forceinline__ bool glmrt_qgemm_walk_next(const glmrt_qgemm_params &p, glmrt_qgemm_walk *walk,
                                                      glmrt_qgemm_segment *segment)
{
    if (walk->next >= walk->end) {
        return false;
    }
    if (p.split_units) {
        const int32_t split = walk->next / p.weight_tiles;
        segment->tile = walk->next % p.weight_tiles;
        segment->token_tile = 0;
        segment->split = split;
        segment->k_begin = split * p.split_k_blocks;
        segment->k_end = min(p.k_blocks, segment->k_begin + p.split_k_blocks);
    } else if (p.tiles != nullptr) {
        segment->token_tile = walk->next / walk->cta_tiles;
        segment->tile = walk->next % walk->cta_tiles;
        segment->split = 0;
        segment->k_begin = 0;
        segment->k_end = p.k_blocks;
    } else {
        segment->token_tile = walk->next % walk->token_tiles;
        segment->tile = walk->next / walk->token_tiles;
        segment->split = 0;
        segment->k_begin = 0;
        segment->k_end = p.k_blocks;
    }
    walk->next += walk->step;
    return true;
}

__device__ __forceinline__ int32_t glmrt_qgemm_units(const glmrt_qgemm_params &p, int consumers)
{
    if (p.split_units) {
        return 0;
    }
    const int32_t cta_tiles = (p.weight_tiles + consumers - 1) / consumers;
    const int32_t token_tiles = p.tiles != nullptr ? *p.num_tiles : p.token_tiles;
    return token_tiles * cta_tiles;
}

__device__ __forceinline__ int32_t glmrt_qgemm_weight_row(const glmrt_qgemm_params &p, int32_t group,
                                                          const glmrt_qgemm_segment &segment, int consumers)
{
    return group * p.w.rows + segment.tile * GLMRT_QGEMM_WEIGHT_TILE_ROWS * consumers;
}

__device__ __forceinline__ int32_t glmrt_qgemm_consumer_row(const glmrt_qgemm_params &p,
                                                             const glmrt_qgemm_segment &segment, int consumers,
                                                             int consumer)
{
    if (p.gated_rows > 0) {
        return consumer * p.gated_rows + segment.tile * GLMRT_QGEMM_WEIGHT_TILE_ROWS;
    }
    return (segment.tile * consumers + consumer) * GLMRT_QGEMM_WEIGHT_TILE_ROWS;
}

__device__ __forceinline__ void glmrt_qgemm_token_tile(const glmrt_qgemm_params &p, int32_t token_tile, int bn,
                                                       int32_t *group, int32_t *row_begin, int32_t *count)
{
    if (p.tiles != nullptr) {
        const glmrt_cuda_gemm_tile tile = p.tiles[token_tile];
        *group = tile.group;
        *row_begin = tile.row_begin;
        *count = min(tile.num_rows, bn);
        return;
    }
    *group = 0;
    *row_begin = token_tile * bn;
    *count = min(bn, p.num_rows - *row_begin);
}

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

__device__ __forceinline__ void glmrt_qgemm_consumer_sync(int consumers)
{
    asm volatile("bar.sync %0, %1;\n" ::"n"(GLMRT_QGEMM_CONSUMER_BARRIER), "r"(consumers * 128) : "memory");
}

__device__ __forceinline__ void glmrt_qgemm_load_weight_box(void *at, const CUtensorMap *w_map, uint64_t *full,
                                                            int32_t inner, int32_t row, const glmrt_qgemm_params &p)
{
    if (p.weights_read_once) {
        glmrt_tma_load_2d_evict_first(at, w_map, full, inner, row);
        return;
    }
    glmrt_tma_load_2d(at, w_map, full, inner, row);
}

template <typename SHAPE>
__device__ __forceinline__ void glmrt_qgemm_load_weight_tile(uint8_t *at, const CUtensorMap *w_map, uint64_t *full,
                                                             int32_t inner, const glmrt_qgemm_params &p,
                                                             int32_t group, const glmrt_qgemm_segment &segment)
{
    if (SHAPE::staged && p.gated_rows > 0) {
        const int32_t gate_row = group * p.w.rows + segment.tile * GLMRT_QGEMM_WEIGHT_TILE_ROWS;
        glmrt_qgemm_load_weight_box(at, w_map, full, inner, gate_row, p);
        glmrt_qgemm_load_weight_box(at + SHAPE::weight_tile_bytes, w_map, full, inner, gate_row + p.gated_rows, p);
        return;
    }
    glmrt_qgemm_load_weight_box(at, w_map, full, inner, glmrt_qgemm_weight_row(p, group, segment, SHAPE::consumers),
                                p);
}

template <typename SHAPE, int KIND>
__device__ __forceinline__ int32_t glmrt_qgemm_preload_weights(const CUtensorMap *w_map, const glmrt_qgemm_params &p,
                                                               uint8_t *tiles, uint64_t *full)
{
    glmrt_qgemm_walk walk = glmrt_qgemm_walk_begin(p, glmrt_qgemm_units(p, SHAPE::consumers), SHAPE::consumers);
    glmrt_qgemm_segment segment;
    int32_t issued = 0;
    while (issued < SHAPE::stages && glmrt_qgemm_walk_next(p, &walk, &segment)) {
        for (int32_t kb = segment.k_begin; kb < segment.k_end && issued < SHAPE::stages; ++kb, ++issued) {
            glmrt_mbarrier_expect_bytes(&full[issued], SHAPE::stage_bytes);
            glmrt_qgemm_load_weight_tile<SHAPE>(tiles + issued * SHAPE::stage_bytes, w_map, &full[issued],
                                                kb * glmrt_operand_block_elements(KIND), p, 0, segment);
        }
    }
    return issued;
}

template <typename SHAPE, int KIND>
__device__ __forceinline__ void glmrt_qgemm_produce(const CUtensorMap *w_map, const CUtensorMap *x_map,
                                                    const glmrt_qgemm_params &p, int32_t units, int32_t preloaded,
                                                    uint8_t *tiles, uint64_t *full, uint64_t *empty)
{
    glmrt_qgemm_walk walk = glmrt_qgemm_walk_begin(p, units, SHAPE::consumers);
    glmrt_qgemm_segment segment;
    int stage = 0;
    uint32_t phase = 0;
    int32_t issued = 0;
    while (glmrt_qgemm_walk_next(p, &walk, &segment)) {
        int32_t group;
        int32_t row_begin;
        int32_t count;
        glmrt_qgemm_token_tile(p, segment.token_tile, SHAPE::bn, &group, &row_begin, &count);
        for (int32_t kb = segment.k_begin; kb < segment.k_end; ++kb, ++issued) {
            uint8_t *at = tiles + stage * SHAPE::stage_bytes;
            const int32_t inner = kb * glmrt_operand_block_elements(KIND);
            if (issued >= preloaded) {
                glmrt_mbarrier_wait(&empty[stage], phase ^ 1u);
                glmrt_mbarrier_expect_bytes(&full[stage], SHAPE::stage_bytes);
                glmrt_qgemm_load_weight_tile<SHAPE>(at, w_map, &full[stage], inner, p, group, segment);
            }
#pragma unroll
            for (int j = 0; j < SHAPE::b_bytes / SHAPE::box_bytes; ++j) {
                glmrt_tma_load_2d(at + SHAPE::a_bytes + j * SHAPE::box_bytes, x_map, &full[stage], inner,
                                  row_begin + j * SHAPE::box_rows);
            }
            if (++stage == SHAPE::stages) {
                stage = 0;
                phase ^= 1u;
            }
        }
    }
}

#define GLMRT_QGEMM_EPILOGUE_CHUNK 8
#define GLMRT_QGEMM_GATHER_CHUNK 16

typedef struct glmrt_qgemm_row_terms {
    float channel_scale[2];
    float bias[2];
} glmrt_qgemm_row_terms;

template <int SCALE>
__device__ __forceinline__ glmrt_qgemm_row_terms glmrt_qgemm_load_row_terms(const glmrt_qgemm_params &p, int32_t group,
                                                                            int32_t row0)
{
    const float *group_scale = p.w.scale != nullptr ? p.w.scale + (int64_t)group * p.w.group_scales : nullptr;
    glmrt_qgemm_row_terms terms;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        const int32_t n = row0 + half * 8;
        terms.channel_scale[half] = SCALE == GLMRT_CUDA_SCALE_CHANNEL && n < p.w.rows ? __ldg(group_scale + n) : 1.0f;
        terms.bias[half] = p.bias != nullptr && n < p.w.rows ? __ldg(p.bias + n) : 0.0f;
    }
    return terms;
}

template <int SCALE>
__device__ __forceinline__ float glmrt_qgemm_output_value(const glmrt_qgemm_params &p, float value,
                                                          const glmrt_qgemm_row_terms &terms, int half, float x_scale)
{
    if (SCALE == GLMRT_CUDA_SCALE_CHANNEL) {
        value = __fmul_rn(__fmul_rn(value, terms.channel_scale[half]), x_scale);
    } else if (SCALE == GLMRT_CUDA_SCALE_BLOCK) {
        value = __fmul_rn(value, x_scale);
    }
    if (p.bias != nullptr) {
        value = __fadd_rn(value, terms.bias[half]);
    }
    return value;
}

template <int KIND, int SCALE, int PROMOTE, int BN, int FOLD>
__device__ __forceinline__ void glmrt_qgemm_finish(const glmrt_qgemm_params &p, const float *result, int32_t group,
                                                   int32_t row_begin, int32_t count, int32_t row0, int lane)
{
    typedef glmrt_qgemm_shape<KIND, SCALE, PROMOTE, BN, FOLD> shape;
    constexpr int chunk = shape::acc < GLMRT_QGEMM_EPILOGUE_CHUNK ? shape::acc : GLMRT_QGEMM_EPILOGUE_CHUNK;
    constexpr int chunk_tokens = chunk / 2;
    static_assert(shape::acc % chunk == 0 && chunk % 4 == 0, "epilogue chunks cover whole fragment quads");
    const glmrt_qgemm_row_terms terms = glmrt_qgemm_load_row_terms<SCALE>(p, group, row0);
#pragma unroll
    for (int c = 0; c < shape::acc; c += chunk) {
        float row_scale[chunk_tokens];
        float old[chunk];
#pragma unroll
        for (int t = 0; t < chunk_tokens; ++t) {
            const int32_t token = glmrt_qgemm_fragment_token(c + (t >> 1) * 4 + (t & 1), lane);
            row_scale[t] = SCALE != GLMRT_CUDA_SCALE_NONE && token < count ? __ldg(p.x_scales + row_begin + token)
                                                                            : 1.0f;
        }
#pragma unroll
        for (int j = 0; j < chunk; ++j) {
            const int32_t token = glmrt_qgemm_fragment_token(c + j, lane);
            const int32_t n = row0 + glmrt_qgemm_fragment_row(c + j);
            old[j] = p.accumulate && token < count && n < p.w.rows
                         ? p.y[((int64_t)row_begin + token) * p.y_stride + n]
                         : 0.0f;
        }
#pragma unroll
        for (int j = 0; j < chunk; ++j) {
            const int i = c + j;
            const int32_t token = glmrt_qgemm_fragment_token(i, lane);
            const int half = glmrt_qgemm_fragment_row(i) ? 1 : 0;
            const int32_t n = row0 + half * 8;
            if (token < count && n < p.w.rows) {
                const float value =
                    glmrt_qgemm_output_value<SCALE>(p, result[i], terms, half, row_scale[(j >> 2) * 2 + (j & 1)]);
                p.y[((int64_t)row_begin + token) * p.y_stride + n] = p.accumulate ? __fadd_rn(old[j], value) : value;
            }
        }
    }
}

template <int KIND, int SCALE, int PROMOTE, int BN, int FOLD>
__device__ __forceinline__ void glmrt_qgemm_stage_result(const glmrt_qgemm_params &p, const float *result,
                                                         float *out_tile, int32_t group, int32_t row_begin,
                                                         int32_t count, int32_t row0, int consumer, int local)
{
    typedef glmrt_qgemm_shape<KIND, SCALE, PROMOTE, BN, FOLD> shape;
    const int lane = local % 32;
    float *slots = glmrt_qgemm_staged_slots(out_tile, consumer, local / 32, lane);
    const glmrt_qgemm_row_terms terms = glmrt_qgemm_load_row_terms<SCALE>(p, group, row0);
    float row_scale[shape::acc / 2];
#pragma unroll
    for (int t = 0; t < shape::acc / 2; ++t) {
        const int32_t token = glmrt_qgemm_fragment_token((t >> 1) * 4 + (t & 1), lane);
        row_scale[t] = SCALE != GLMRT_CUDA_SCALE_NONE && token < count ? __ldg(p.x_scales + row_begin + token) : 1.0f;
    }
#pragma unroll
    for (int i = 0; i < shape::acc; ++i) {
        const int half = glmrt_qgemm_fragment_row(i) ? 1 : 0;
        const float value = glmrt_qgemm_output_value<SCALE>(p, result[i], terms, half, row_scale[(i >> 2) * 2 + (i & 1)]);
        slots[glmrt_qgemm_staged_slot<shape>(i, lane)] = value;
    }
}

__device__ __forceinline__ void glmrt_qgemm_store_value(const glmrt_qgemm_params &p, int64_t at, float value)
{
    p.y[at] = p.accumulate ? __fadd_rn(p.y[at], value) : value;
}

template <int KIND, int SCALE, int PROMOTE, int BN, int FOLD>
__device__ __forceinline__ void glmrt_qgemm_copy_out(const glmrt_qgemm_params &p, const float *out_tile,
                                                     int32_t row_begin, int32_t count, int32_t cta_row0, int thread)
{
    typedef glmrt_qgemm_shape<KIND, SCALE, PROMOTE, BN, FOLD> shape;
    constexpr int quads = shape::cta_rows / 4;
    const bool vectors = p.y_stride % 4 == 0 && (reinterpret_cast<uintptr_t>(p.y) & 15u) == 0;
    for (int32_t index = thread; index < count * quads; index += shape::consumer_threads) {
        const int32_t token = index / quads;
        const int32_t column = (index % quads) * 4;
        const int32_t n = cta_row0 + column;
        const float4 value = *reinterpret_cast<const float4 *>(out_tile + token * shape::out_stride + column);
        const int64_t at = ((int64_t)row_begin + token) * p.y_stride + n;
        if (vectors && n + 3 < p.w.rows) {
            float4 *target = reinterpret_cast<float4 *>(p.y + at);
            if (p.accumulate) {
                const float4 old = *target;
                *target = make_float4(__fadd_rn(old.x, value.x), __fadd_rn(old.y, value.y), __fadd_rn(old.z, value.z),
                                      __fadd_rn(old.w, value.w));
            } else {
                *target = value;
            }
            continue;
        }
        const float values[4] = {value.x, value.y, value.z, value.w};
#pragma unroll
        for (int c = 0; c < 4; ++c) {
            if (n + c < p.w.rows) {
                glmrt_qgemm_store_value(p, at + c, values[c]);
            }
        }
    }
}

template <int KIND, int SCALE, int PROMOTE, int BN, int FOLD>
__device__ __forceinline__ void glmrt_qgemm_copy_out_gated(const glmrt_qgemm_params &p, const float *out_tile,
                                                           int32_t row_begin, int32_t count, int32_t tile, int thread)
{
    typedef glmrt_qgemm_shape<KIND, SCALE, PROMOTE, BN, FOLD> shape;
    constexpr int quads = GLMRT_QGEMM_WEIGHT_TILE_ROWS / 4;
    const int32_t first_column = tile * GLMRT_QGEMM_WEIGHT_TILE_ROWS;
    for (int32_t index = thread; index < count * quads; index += shape::consumer_threads) {
        const int32_t token = index / quads;
        const int32_t column = (index % quads) * 4;
        const float *at = out_tile + token * shape::out_stride + column;
        const float4 gate = *reinterpret_cast<const float4 *>(at);
        const float4 up = *reinterpret_cast<const float4 *>(at + GLMRT_QGEMM_WEIGHT_TILE_ROWS);
        *reinterpret_cast<float4 *>(p.y + ((int64_t)row_begin + token) * p.y_stride + first_column + column) =
            make_float4(glmrt_silu_times(gate.x, up.x), glmrt_silu_times(gate.y, up.y),
                        glmrt_silu_times(gate.z, up.z), glmrt_silu_times(gate.w, up.w));
    }
}

__device__ __forceinline__ int64_t glmrt_qgemm_partial_slot(const glmrt_qgemm_params &p, int32_t tile, int32_t split)
{
    return ((int64_t)tile * p.splits + split) * GLMRT_QGEMM_PARTIAL_TILE;
}

template <int KIND, int SCALE, int PROMOTE, int BN, int FOLD>
__device__ __forceinline__ bool glmrt_qgemm_gather_splits(const glmrt_qgemm_params &p, float *result,
                                                          const glmrt_qgemm_segment &segment, int32_t count, int lane,
                                                          int warp, int local, int32_t *last_split)
{
    typedef glmrt_qgemm_shape<KIND, SCALE, PROMOTE, BN, FOLD> shape;
    const int32_t local_row = warp * 16 + lane / 4;
    float *mine = p.partials + glmrt_qgemm_partial_slot(p, segment.tile, segment.split);
#pragma unroll
    for (int i = 0; i < shape::acc; ++i) {
        const int32_t token = glmrt_qgemm_fragment_token(i, lane);
        const int32_t m = local_row + glmrt_qgemm_fragment_row(i);
        if (token < count) {
            __stcg(mine + token * GLMRT_QGEMM_WEIGHT_TILE_ROWS + m, result[i]);
        }
    }
    __threadfence();
    glmrt_qgemm_consumer_sync(shape::consumers);
    if (local == 0 && threadIdx.x == 0) {
        int32_t arrived = atomicAdd(p.counters + segment.tile, 1);
        int32_t is_last = arrived == p.splits - 1;
        if (is_last) {
            p.counters[segment.tile] = 0;
        }
        *last_split = is_last;
    }
    glmrt_qgemm_consumer_sync(shape::consumers);
    if (*last_split == 0) {
        return false;
    }
    __threadfence();
    constexpr int chunk = shape::acc < GLMRT_QGEMM_GATHER_CHUNK ? shape::acc : GLMRT_QGEMM_GATHER_CHUNK;
#pragma unroll
    for (int c = 0; c < shape::acc; c += chunk) {
        for (int32_t split = 0; split < p.splits; ++split) {
            const float *part = p.partials + glmrt_qgemm_partial_slot(p, segment.tile, split);
            float loaded[chunk];
#pragma unroll
            for (int j = 0; j < chunk; ++j) {
                const int32_t token = glmrt_qgemm_fragment_token(c + j, lane);
                const int32_t m = local_row + glmrt_qgemm_fragment_row(c + j);
                loaded[j] = token < count ? __ldcg(part + token * GLMRT_QGEMM_WEIGHT_TILE_ROWS + m) : 0.0f;
            }
#pragma unroll
            for (int j = 0; j < chunk; ++j) {
                result[c + j] = split == 0 ? loaded[j] : __fadd_rn(result[c + j], loaded[j]);
            }
        }
    }
    return true;
}

typedef struct glmrt_qgemm_cursor {
    int32_t stage;
    uint32_t phase;
} glmrt_qgemm_cursor;

template <int STAGES>
__device__ __forceinline__ void glmrt_qgemm_cursor_next(glmrt_qgemm_cursor *cursor)
{
    if (++cursor->stage == STAGES) {
        cursor->stage = 0;
        cursor->phase ^= 1u;
    }
}

typedef struct glmrt_qgemm_pipe {
    const uint8_t *tiles;
    uint64_t *full;
    uint64_t *empty;
    glmrt_qgemm_cursor issue;
    glmrt_qgemm_cursor settle;
} glmrt_qgemm_pipe;

typedef struct glmrt_qgemm_scale_rows {
    const float *group_scale;
    int32_t row0;
    int32_t row1;
    int32_t block_cols;
    int32_t scale_cols;
} glmrt_qgemm_scale_rows;

template <int SCALE, int PROMOTE>
__device__ __forceinline__ float2 glmrt_qgemm_group_scale(const glmrt_qgemm_scale_rows &rows, int32_t kb, int q)
{
    if constexpr (SCALE == GLMRT_CUDA_SCALE_BLOCK) {
        const int32_t w_block =
            min((kb * GLMRT_TENSOR_MAP_ROW_BYTES + q * PROMOTE * 32) / rows.block_cols, rows.scale_cols - 1);
        return make_float2(__ldg(rows.group_scale + rows.row0 + w_block), __ldg(rows.group_scale + rows.row1 + w_block));
    }
    return make_float2(1.0f, 1.0f);
}

template <typename SHAPE, int KIND, int SCALE, int PROMOTE>
__device__ __forceinline__ float2 glmrt_qgemm_issue_group(float *part, glmrt_qgemm_pipe *pipe, int32_t kb, int q,
                                                          int consumer, const glmrt_qgemm_scale_rows &rows,
                                                          bool accumulate)
{
    glmrt_qgemm_cursor *cursor = &pipe->issue;
    if (q == 0) {
        glmrt_mbarrier_wait(&pipe->full[cursor->stage], cursor->phase);
    }
    const float2 scale = glmrt_qgemm_group_scale<SCALE, PROMOTE>(rows, kb, q);
    const uint8_t *at = pipe->tiles + cursor->stage * SHAPE::stage_bytes;
    const uint64_t a_desc = glmrt_wgmma_descriptor(at + consumer * SHAPE::weight_tile_bytes);
    const uint64_t b_desc = glmrt_wgmma_descriptor(at + SHAPE::a_bytes);
    glmrt_wgmma_fence_registers<SHAPE::acc>(part);
    glmrt_wgmma_fence();
#pragma unroll
    for (int s = 0; s < PROMOTE; ++s) {
        const int step = q * PROMOTE + s;
        glmrt_wgmma<KIND, SHAPE::bn>(part, a_desc + 2 * step, b_desc + 2 * step, (s > 0 || accumulate) ? 1 : 0);
    }
    glmrt_wgmma_commit();
    if (q == SHAPE::promotions - 1) {
        glmrt_qgemm_cursor_next<SHAPE::stages>(cursor);
    }
    return scale;
}

template <typename SHAPE>
__device__ __forceinline__ void glmrt_qgemm_settle_group(float *part, glmrt_qgemm_pipe *pipe, int q, int lane)
{
    glmrt_wgmma_fence_registers<SHAPE::acc>(part);
    if (q == SHAPE::promotions - 1) {
        if (lane == 0) {
            glmrt_mbarrier_arrive(&pipe->empty[pipe->settle.stage]);
        }
        glmrt_qgemm_cursor_next<SHAPE::stages>(&pipe->settle);
    }
}

template <typename SHAPE, int SCALE>
__device__ __forceinline__ void glmrt_qgemm_promote_group(float *acc, float *part, float2 scale,
                                                          glmrt_qgemm_pipe *pipe, int q, int lane)
{
    glmrt_qgemm_settle_group<SHAPE>(part, pipe, q, lane);
#pragma unroll
    for (int i = 0; i < SHAPE::acc; ++i) {
        if constexpr (SCALE == GLMRT_CUDA_SCALE_BLOCK) {
            acc[i] = __fmaf_rn(part[i], glmrt_qgemm_fragment_row(i) ? scale.y : scale.x, acc[i]);
        } else {
            acc[i] = __fadd_rn(acc[i], part[i]);
        }
    }
}

template <typename SHAPE>
__device__ __forceinline__ int32_t glmrt_qgemm_fold_slot(int i, int lane)
{
    if constexpr (SHAPE::staged) {
        return glmrt_qgemm_staged_slot<SHAPE>(i, lane);
    } else {
        return i * SHAPE::consumer_threads;
    }
}

template <typename SHAPE>
__device__ __forceinline__ void glmrt_qgemm_fold(float *total, float *acc, bool first_range, int lane)
{
#pragma unroll
    for (int i = 0; i < SHAPE::acc; ++i) {
        float *slot = total + glmrt_qgemm_fold_slot<SHAPE>(i, lane);
        *slot = first_range ? acc[i] : __fadd_rn(*slot, acc[i]);
        acc[i] = 0.0f;
    }
}

template <typename SHAPE>
__device__ __forceinline__ void glmrt_qgemm_unfold(const float *total, float *acc, int lane)
{
#pragma unroll
    for (int i = 0; i < SHAPE::acc; ++i) {
        acc[i] = __fadd_rn(total[glmrt_qgemm_fold_slot<SHAPE>(i, lane)], acc[i]);
    }
}

__device__ __forceinline__ int32_t glmrt_qgemm_first_fold(const glmrt_qgemm_params &p,
                                                           const glmrt_qgemm_segment &segment)
{
    return (segment.k_begin / p.split_k_blocks + 1) * p.split_k_blocks;
}

template <typename SHAPE, int KIND, int SCALE, int PROMOTE, int FOLD>
__device__ __forceinline__ bool glmrt_qgemm_mainloop_promoted(const glmrt_qgemm_params &p,
                                                              const glmrt_qgemm_segment &segment,
                                                              glmrt_qgemm_pipe *pipe, float *acc, float *total,
                                                              int consumer, int lane, const glmrt_qgemm_scale_rows &rows)
{
    float part_a[SHAPE::acc];
    float part_b[SHAPE::two_partials ? SHAPE::acc : 1];
    bool first_range = true;
    int32_t next_fold = glmrt_qgemm_first_fold(p, segment);
    const int32_t groups = (segment.k_end - segment.k_begin) * SHAPE::promotions;
    auto issue_group = [&](float *part, int32_t g) {
        return glmrt_qgemm_issue_group<SHAPE, KIND, SCALE, PROMOTE>(
            part, pipe, segment.k_begin + g / SHAPE::promotions, g % SHAPE::promotions, consumer, rows, false);
    };
    auto promote_group = [&](float *part, float2 scale, int32_t g) {
        const int32_t kb = segment.k_begin + g / SHAPE::promotions;
        const int q = g % SHAPE::promotions;
        if (FOLD && q == 0 && kb == next_fold) {
            glmrt_qgemm_fold<SHAPE>(total, acc, first_range, lane);
            first_range = false;
            next_fold += p.split_k_blocks;
        }
        glmrt_qgemm_promote_group<SHAPE, SCALE>(acc, part, scale, pipe, q, lane);
    };
    if (groups <= 0) {
        return first_range;
    }
    if constexpr (!SHAPE::two_partials) {
        for (int32_t g = 0; g < groups; ++g) {
            const float2 scale = issue_group(part_a, g);
            glmrt_wgmma_wait_all();
            promote_group(part_a, scale, g);
        }
        return first_range;
    }
    float2 scale_a = issue_group(part_a, 0);
    int32_t g = 0;
    for (; g + 2 < groups; g += 2) {
        const float2 scale_b = issue_group(part_b, g + 1);
        glmrt_wgmma_wait_all_but_one();
        promote_group(part_a, scale_a, g);
        scale_a = issue_group(part_a, g + 2);
        glmrt_wgmma_wait_all_but_one();
        promote_group(part_b, scale_b, g + 1);
    }
    if (g + 1 < groups) {
        const float2 scale_b = issue_group(part_b, g + 1);
        glmrt_wgmma_wait_all_but_one();
        promote_group(part_a, scale_a, g);
        glmrt_wgmma_wait_all();
        promote_group(part_b, scale_b, g + 1);
    } else {
        glmrt_wgmma_wait_all();
        promote_group(part_a, scale_a, g);
    }
    return first_range;
}

template <typename SHAPE, int KIND, int SCALE, int PROMOTE>
__device__ __forceinline__ bool glmrt_qgemm_mainloop_plain(const glmrt_qgemm_params &p,
                                                           const glmrt_qgemm_segment &segment, glmrt_qgemm_pipe *pipe,
                                                           float *acc, float *total, int consumer, int lane,
                                                           const glmrt_qgemm_scale_rows &rows)
{
    static_assert(PROMOTE == GLMRT_QGEMM_K_STEPS, "without promotion a K block is one group of products");
    bool first_range = true;
    bool range_start = true;
    int32_t next_fold = glmrt_qgemm_first_fold(p, segment);
    for (int32_t kb = segment.k_begin; kb < segment.k_end; ++kb) {
        if (SHAPE::folds && kb == next_fold) {
            glmrt_qgemm_fold<SHAPE>(total, acc, first_range, lane);
            first_range = false;
            range_start = true;
            next_fold += p.split_k_blocks;
        }
        glmrt_qgemm_issue_group<SHAPE, KIND, SCALE, PROMOTE>(acc, pipe, kb, 0, consumer, rows, !range_start);
        glmrt_wgmma_wait_all();
        glmrt_qgemm_settle_group<SHAPE>(acc, pipe, 0, lane);
        range_start = false;
    }
    return first_range;
}

template <int KIND, int SCALE, int PROMOTE, int BN, int FOLD>
__device__ __forceinline__ void glmrt_qgemm_consume(const glmrt_qgemm_params &p, int32_t units, uint8_t *tiles,
                                                    uint64_t *full, uint64_t *empty, float *fold_totals,
                                                    float *out_tile, int consumer, int local,
                                                    int32_t *last_contribution)
{
    typedef glmrt_qgemm_shape<KIND, SCALE, PROMOTE, BN, FOLD> shape;
    const int warp = local / 32;
    const int lane = local % 32;
    float acc[shape::acc];
    float *total = shape::staged ? glmrt_qgemm_staged_slots(out_tile, consumer, warp, lane)
                                 : fold_totals + threadIdx.x;
    glmrt_qgemm_walk walk = glmrt_qgemm_walk_begin(p, units, shape::consumers);
    glmrt_qgemm_segment segment;
    glmrt_qgemm_pipe pipe = {tiles, full, empty, {0, 0u}, {0, 0u}};
    while (glmrt_qgemm_walk_next(p, &walk, &segment)) {
        int32_t group;
        int32_t row_begin;
        int32_t count;
        glmrt_qgemm_token_tile(p, segment.token_tile, BN, &group, &row_begin, &count);
        const int32_t row0 = glmrt_qgemm_consumer_row(p, segment, shape::consumers, consumer) + warp * 16 + lane / 4;
        glmrt_qgemm_scale_rows rows;
        rows.group_scale = p.w.scale != nullptr ? p.w.scale + (int64_t)group * p.w.group_scales : nullptr;
        rows.row0 = 0;
        rows.row1 = 0;
        rows.block_cols = p.w.block_cols;
        rows.scale_cols = p.w.scale_cols;
        if (SCALE == GLMRT_CUDA_SCALE_BLOCK) {
            rows.row0 = glmrt_cuda_matrix_row_block(&p.w, min(row0, p.w.rows - 1)) * p.w.scale_cols;
            rows.row1 = glmrt_cuda_matrix_row_block(&p.w, min(row0 + 8, p.w.rows - 1)) * p.w.scale_cols;
        }
#pragma unroll
        for (int i = 0; i < shape::acc; ++i) {
            acc[i] = 0.0f;
        }
        if constexpr (shape::staged && shape::folds) {
            glmrt_qgemm_consumer_sync(shape::consumers);
        }
        bool first_range;
        if constexpr (shape::promoted) {
            first_range = glmrt_qgemm_mainloop_promoted<shape, KIND, SCALE, PROMOTE, FOLD>(
                p, segment, &pipe, acc, total, consumer, lane, rows);
        } else {
            first_range = glmrt_qgemm_mainloop_plain<shape, KIND, SCALE, PROMOTE>(
                p, segment, &pipe, acc, total, consumer, lane, rows);
        }
        if constexpr (shape::folds) {
            if (!first_range) {
                glmrt_qgemm_unfold<shape>(total, acc, lane);
            }
        }
        if constexpr (shape::consumers == 1) {
            if (p.split_units && p.splits > 1 &&
                !glmrt_qgemm_gather_splits<KIND, SCALE, PROMOTE, BN, FOLD>(p, acc, segment, count, lane, warp, local,
                                                                          last_contribution)) {
                continue;
            }
        }
        if constexpr (shape::staged) {
            glmrt_qgemm_consumer_sync(shape::consumers);
            glmrt_qgemm_stage_result<KIND, SCALE, PROMOTE, BN, FOLD>(p, acc, out_tile, group, row_begin, count,
                                                                     row0, consumer, local);
            glmrt_qgemm_consumer_sync(shape::consumers);
            if (p.gated_rows > 0) {
                glmrt_qgemm_copy_out_gated<KIND, SCALE, PROMOTE, BN, FOLD>(p, out_tile, row_begin, count, segment.tile,
                                                                           (int)threadIdx.x);
            } else {
                glmrt_qgemm_copy_out<KIND, SCALE, PROMOTE, BN, FOLD>(p, out_tile, row_begin, count,
                                                                     segment.tile * shape::cta_rows, (int)threadIdx.x);
            }
        } else {
            glmrt_qgemm_finish<KIND, SCALE, PROMOTE, BN, FOLD>(p, acc, group, row_begin, count, row0, lane);
        }
    }
}

#endif

template <int KIND, int SCALE, int PROMOTE, int BN, int FOLD>
__global__ void __launch_bounds__(glmrt_qgemm_shape<KIND, SCALE, PROMOTE, BN, FOLD>::threads,
                                  glmrt_qgemm_shape<KIND, SCALE, PROMOTE, BN, FOLD>::min_blocks)
    glmrt_qgemm_kernel(const __grid_constant__ CUtensorMap w_map, const __grid_constant__ CUtensorMap x_map,
                       const glmrt_qgemm_params p)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    typedef glmrt_qgemm_shape<KIND, SCALE, PROMOTE, BN, FOLD> shape;
    extern __shared__ __align__(1024) uint8_t glmrt_qgemm_shared[];
    __shared__ int32_t last_contribution;
    const uint32_t misalign = glmrt_shared_address(glmrt_qgemm_shared) & (GLMRT_WGMMA_SWIZZLE_ATOM_BYTES - 1);
    uint8_t *tiles = glmrt_qgemm_shared + ((GLMRT_WGMMA_SWIZZLE_ATOM_BYTES - misalign) & (GLMRT_WGMMA_SWIZZLE_ATOM_BYTES - 1));
    float *fold_totals = reinterpret_cast<float *>(tiles + shape::stages * shape::stage_bytes);
    float *out_tile = reinterpret_cast<float *>(tiles + shape::stages * shape::stage_bytes + shape::fold_bytes);
    uint64_t *full = reinterpret_cast<uint64_t *>(tiles + shape::stages * shape::stage_bytes + shape::fold_bytes +
                                                  shape::out_bytes);
    uint64_t *empty = full + shape::stages;
    const bool producer = (int)threadIdx.x >= shape::consumer_threads;
    if (threadIdx.x == shape::consumer_threads) {
        for (int s = 0; s < shape::stages; ++s) {
            glmrt_mbarrier_init(&full[s], 1);
            glmrt_mbarrier_init(&empty[s], 4 * shape::consumers);
        }
        glmrt_fence_barrier_init();
        glmrt_tma_prefetch_map(&w_map);
        glmrt_tma_prefetch_map(&x_map);
    }
    __syncthreads();
    if (producer) {
        if constexpr (shape::raise) {
            glmrt_registers_lower<GLMRT_QGEMM_PRODUCER_REGISTERS>();
        }
        if (threadIdx.x == shape::consumer_threads) {
            const int32_t preloaded = p.tiles == nullptr ? glmrt_qgemm_preload_weights<shape, KIND>(&w_map, p, tiles, full)
                                                         : 0;
            glmrt_dependent_enter();
            const int32_t units = glmrt_qgemm_units(p, shape::consumers);
            glmrt_qgemm_produce<shape, KIND>(&w_map, &x_map, p, units, preloaded, tiles, full, empty);
        } else {
            glmrt_dependent_enter();
        }
    } else {
        if constexpr (shape::raise) {
            glmrt_registers_raise<GLMRT_QGEMM_CONSUMER_REGISTERS>();
        }
        glmrt_dependent_enter();
        const int32_t units = glmrt_qgemm_units(p, shape::consumers);
        glmrt_qgemm_consume<KIND, SCALE, PROMOTE, BN, FOLD>(p, units, tiles, full, empty, fold_totals, out_tile,
                                                            (int)threadIdx.x / 128,
                                                            (int)threadIdx.x % 128, &last_contribution);
    }
#endif
}

typedef void (*glmrt_qgemm_kernel_fn)(const CUtensorMap, const CUtensorMap, const glmrt_qgemm_params);

#define GLMRT_QGEMM_MAX_DEVICES 64

typedef struct glmrt_qgemm_variant {
    std::atomic<int32_t> resident_per_sm[GLMRT_QGEMM_MAX_DEVICES];
} glmrt_qgemm_variant;

template <int KIND, int SCALE, int PROMOTE, int BN, int FOLD>
static glmrt_status glmrt_qgemm_launch(const CUtensorMap *w_map, const CUtensorMap *x_map,
                                       const glmrt_qgemm_params *p, int32_t grid_limit, int32_t num_sms,
                                       cudaStream_t stream, glmrt_error *error)
{
    typedef glmrt_qgemm_shape<KIND, SCALE, PROMOTE, BN, FOLD> shape;
    static glmrt_qgemm_variant variant;
    glmrt_qgemm_kernel_fn kernel = glmrt_qgemm_kernel<KIND, SCALE, PROMOTE, BN, FOLD>;
    int device = 0;
    GLMRT_CUDA_TRY(error, cudaGetDevice(&device));
    const bool cached = device >= 0 && device < GLMRT_QGEMM_MAX_DEVICES;
    int32_t resident = cached ? variant.resident_per_sm[device].load(std::memory_order_acquire) : 0;
    if (resident <= 0) {
        GLMRT_CUDA_TRY(error, cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                   shape::smem_bytes));
        int blocks = 0;
        GLMRT_CUDA_TRY(error, cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, shape::threads,
                                                                            shape::smem_bytes));
        resident = blocks > 0 ? blocks : 1;
        if (cached) {
            variant.resident_per_sm[device].store(resident, std::memory_order_release);
        }
    }
    int32_t grid = grid_limit;
    if (!p->split_units) {
        const int32_t resident_ctas = resident * num_sms;
        grid = grid_limit < resident_ctas ? grid_limit : resident_ctas;
    }
    if (grid <= 0) {
        return GLMRT_OK;
    }
    glmrt_dependent_launch dependent;
    const cudaLaunchConfig_t *config = glmrt_dependent_config(&dependent, grid, shape::threads, shape::smem_bytes, stream);
    GLMRT_CUDA_TRY(error, cudaLaunchKernelEx(config, kernel, *w_map, *x_map, *p));
    return GLMRT_OK;
}

template <int KIND, int SCALE, int PROMOTE>
static glmrt_status glmrt_qgemm_launch_width(int32_t bn, int32_t fold, const CUtensorMap *w_map,
                                             const CUtensorMap *x_map, const glmrt_qgemm_params *p,
                                             int32_t grid_limit, int32_t num_sms, cudaStream_t stream,
                                             glmrt_error *error)
{
    switch (bn) {
    case 8:
        return glmrt_qgemm_launch<KIND, SCALE, PROMOTE, 8, 0>(w_map, x_map, p, grid_limit, num_sms, stream, error);
    case 16:
        return glmrt_qgemm_launch<KIND, SCALE, PROMOTE, 16, 0>(w_map, x_map, p, grid_limit, num_sms, stream, error);
    case 32:
        return glmrt_qgemm_launch<KIND, SCALE, PROMOTE, 32, 0>(w_map, x_map, p, grid_limit, num_sms, stream, error);
    case 64:
        if (fold) {
            return glmrt_qgemm_launch<KIND, SCALE, PROMOTE, 64, 1>(w_map, x_map, p, grid_limit, num_sms, stream,
                                                                   error);
        }
        return glmrt_qgemm_launch<KIND, SCALE, PROMOTE, 64, 0>(w_map, x_map, p, grid_limit, num_sms, stream, error);
    case 128:
        if (fold) {
            return glmrt_qgemm_launch<KIND, SCALE, PROMOTE, 128, 1>(w_map, x_map, p, grid_limit, num_sms, stream,
                                                                    error);
        }
        return glmrt_qgemm_launch<KIND, SCALE, PROMOTE, 128, 0>(w_map, x_map, p, grid_limit, num_sms, stream, error);
    default:
        return glmrt_error_set(error, GLMRT_ERR_INVARIANT, "no quantized GEMM for token tiles of %d rows", bn);
    }
}

glmrt_status glmrt_qgemm_launch_fp8_channel(int32_t bn, int32_t fold, const CUtensorMap *w_map,
                                            const CUtensorMap *x_map, const glmrt_qgemm_params *p,
                                            int32_t grid_limit, int32_t num_sms, cudaStream_t stream,
                                            glmrt_error *error);
glmrt_status glmrt_qgemm_launch_fp8_block(int32_t promote, int32_t bn, int32_t fold, const CUtensorMap *w_map,
                                          const CUtensorMap *x_map, const glmrt_qgemm_params *p, int32_t grid_limit,
                                          int32_t num_sms, cudaStream_t stream, glmrt_error *error);
glmrt_status glmrt_qgemm_launch_bf16(int32_t bn, int32_t fold, const CUtensorMap *w_map, const CUtensorMap *x_map,
                                     const glmrt_qgemm_params *p, int32_t grid_limit, int32_t num_sms,
                                     cudaStream_t stream, glmrt_error *error);

#endif
