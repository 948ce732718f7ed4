#include "dependent_launch.cuh"
#include "cuda_check.cuh"
#include "device_math.cuh"
#include "ops.cuh"

#define GLMRT_EMBED_THREADS 256
#define GLMRT_ROPE_WARPS 4
#define GLMRT_ROPE_WIDE_HEADS_PER_WARP 4
#define GLMRT_ROPE_WIDE_MIN_TOKENS 64
#define GLMRT_ROPE_MAX_HEAD_DIM 128
#define GLMRT_ELEMENTWISE_THREADS 256

__device__ __forceinline__ void glmrt_embed_bf16_row(const uint16_t *row, int32_t cols, float *row_out)
{
    if ((cols & 7) == 0) {
        const uint4 *packed = reinterpret_cast<const uint4 *>(row);
        float4 *wide_out = reinterpret_cast<float4 *>(row_out);
        const int32_t vectors = cols / 8;
#pragma unroll 4
        for (int32_t v = threadIdx.x; v < vectors; v += blockDim.x) {
            const uint4 bits = packed[v];
            wide_out[2 * v] = glmrt_bf16x4_to_float4(bits.x, bits.y);
            wide_out[2 * v + 1] = glmrt_bf16x4_to_float4(bits.z, bits.w);
        }
        return;
    }
    for (int32_t i = threadIdx.x; i < cols; i += blockDim.x) {
        row_out[i] = glmrt_bf16_bits_to_float(row[i]);
    }
}

__global__ void glmrt_embed_kernel(glmrt_cuda_matrix embed, const int32_t *token_ids, const int32_t *fed_tokens,
                                   float *out)
{
    glmrt_dependent_enter();
    int32_t token = token_ids[blockIdx.x];
    if (token < 0 && fed_tokens != nullptr) {
        token = fed_tokens[glmrt_fed_token_index(token)];
    }
    float *row_out = out + (int64_t)blockIdx.x * embed.cols;
    if (token < 0 || token >= embed.rows) {
        for (int32_t i = threadIdx.x; i < embed.cols; i += blockDim.x) {
            row_out[i] = __uint_as_float(0x7fc00000u);
        }
        return;
    }
    if (embed.format == GLMRT_CUDA_FORMAT_BF16) {
        glmrt_embed_bf16_row(reinterpret_cast<const uint16_t *>(embed.data) + (int64_t)token * embed.cols, embed.cols,
                             row_out);
    } else if (embed.format == GLMRT_CUDA_FORMAT_F32) {
        const float *row = reinterpret_cast<const float *>(embed.data) + (int64_t)token * embed.cols;
        for (int32_t i = threadIdx.x; i < embed.cols; i += blockDim.x) {
            row_out[i] = row[i];
        }
    } else {
        const uint8_t *row = embed.data + (int64_t)token * embed.cols;
        for (int32_t i = threadIdx.x; i < embed.cols; i += blockDim.x) {
            float scale = 1.0f;
            if (embed.scale_kind == GLMRT_CUDA_SCALE_CHANNEL) {
                scale = embed.scale[token];
            } else if (embed.scale_kind == GLMRT_CUDA_SCALE_BLOCK) {
                scale = embed.scale[(int64_t)glmrt_cuda_matrix_row_block(&embed, token) * embed.scale_cols +
                                    i / embed.block_cols];
            }
            row_out[i] = glmrt_fp8_e4m3_bits_to_float(row[i]) * scale;
        }
    }
}

glmrt_status glmrt_cuda_embed(const glmrt_cuda_matrix *embed, const int32_t *token_ids, const int32_t *fed_tokens,
                              int32_t num_tokens, float *out, cudaStream_t stream, glmrt_error *error)
{
    if (num_tokens <= 0) {
        return GLMRT_OK;
    }
    glmrt_dependent_launch dependent;
    const cudaLaunchConfig_t *config = glmrt_dependent_config(&dependent, num_tokens, GLMRT_EMBED_THREADS, 0, stream);
    GLMRT_CUDA_TRY(error, cudaLaunchKernelEx(config, glmrt_embed_kernel, *embed, token_ids, fed_tokens, out));
    return GLMRT_OK;
}

__global__ void glmrt_silu_mul_kernel(const float *gate_up, int32_t width, int32_t num_rows,
                                      const int32_t *device_rows, float *out)
{
    glmrt_dependent_enter();
    int32_t rows = device_rows != nullptr ? min(*device_rows, num_rows) : num_rows;
    int64_t total = (int64_t)rows * width;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t row = i / width;
        int64_t col = i - row * width;
        const float *source = gate_up + row * 2 * width;
        out[i] = glmrt_silu_times(source[col], source[width + col]);
    }
}

glmrt_status glmrt_cuda_silu_mul(const float *gate_up, int32_t width, int32_t num_rows, const int32_t *device_rows,
                                 float *out, cudaStream_t stream, glmrt_error *error)
{
    if (num_rows <= 0) {
        return GLMRT_OK;
    }
    int64_t total = (int64_t)num_rows * width;
    int64_t blocks = glmrt_ceil_div64(total, GLMRT_ELEMENTWISE_THREADS);
    if (blocks > 65536) {
        blocks = 65536;
    }
    glmrt_dependent_launch dependent;
    const cudaLaunchConfig_t *config = glmrt_dependent_config(&dependent, (unsigned)blocks, GLMRT_ELEMENTWISE_THREADS,
                                                              0, stream);
    GLMRT_CUDA_TRY(error, cudaLaunchKernelEx(config, glmrt_silu_mul_kernel, gate_up, width, num_rows, device_rows,
                                             out));
    return GLMRT_OK;
}

__device__ __forceinline__ float glmrt_head_rms_inverse(float lane_squares, int32_t head_dim, float eps)
{
    return 1.0f / sqrtf(glmrt_warp_sum(lane_squares) / (float)head_dim + eps);
}

__device__ __forceinline__ float glmrt_head_rms_scaled(float weight, float value, float inverse)
{
    return weight * (value * inverse);
}

__device__ __forceinline__ void glmrt_head_rms_norm(float *head, const float *weight, int32_t head_dim, float eps,
                                                    int lane)
{
    float sum = 0.0f;
    for (int32_t i = lane; i < head_dim; i += 32) {
        sum = __fmaf_rn(head[i], head[i], sum);
    }
    const float inverse = glmrt_head_rms_inverse(sum, head_dim, eps);
    __syncwarp();
    for (int32_t i = lane; i < head_dim; i += 32) {
        head[i] = glmrt_head_rms_scaled(weight[i], head[i], inverse);
    }
    __syncwarp();
}

__device__ __forceinline__ void glmrt_rope_angles(float *cosines, float *sines, int32_t rotary_dim, float theta,
                                                  int32_t position)
{
    int32_t half = rotary_dim / 2;
    for (int32_t i = (int32_t)threadIdx.x; i < half; i += (int32_t)blockDim.x) {
        float exponent = (float)(2 * i) / (float)rotary_dim;
        float inv_freq = 1.0f / powf(theta, exponent);
        float angle = (float)position * inv_freq;
        cosines[i] = cosf(angle);
        sines[i] = sinf(angle);
    }
    __syncthreads();
}

__device__ __forceinline__ float2 glmrt_rope_rotate(float first, float second, float c, float s)
{
    return make_float2(first * c - second * s, second * c + first * s);
}

__device__ __forceinline__ void glmrt_head_rope(float *head, int32_t rotary_dim, const float *cosines,
                                                const float *sines, int lane)
{
    int32_t half = rotary_dim / 2;
    for (int32_t i = lane; i < half; i += 32) {
        const float2 rotated = glmrt_rope_rotate(head[i], head[i + half], cosines[i], sines[i]);
        head[i] = rotated.x;
        head[i + half] = rotated.y;
    }
    __syncwarp();
}

__device__ __forceinline__ int glmrt_rope_is_query(const glmrt_cuda_rope_args &args, int32_t h)
{
    return h < args.num_q_heads;
}

__device__ __forceinline__ int glmrt_rope_is_key(const glmrt_cuda_rope_args &args, int32_t h)
{
    return h >= args.num_q_heads && h < args.num_q_heads + args.kv.num_kv_heads;
}

__device__ __forceinline__ const float *glmrt_rope_norm_of(const glmrt_cuda_rope_args &args, int32_t h)
{
    return glmrt_rope_is_query(args, h) ? args.q_norm : args.k_norm;
}

typedef struct glmrt_rope_slot {
    uint16_t *page_base;
    int32_t slot;
} glmrt_rope_slot;

__device__ __forceinline__ glmrt_rope_slot glmrt_rope_slot_of(const glmrt_cuda_rope_args &args, int32_t token,
                                                              int32_t position)
{
    const int32_t seq = args.token_seq[token];
    const int32_t page = args.page_ids[args.seq_page_begin[seq] + position / args.kv.page_size];
    glmrt_rope_slot at;
    at.slot = position % args.kv.page_size;
    at.page_base = args.kv.base + (int64_t)args.layer * args.kv.layer_elements + (int64_t)page * args.kv.page_elements;
    return at;
}

__device__ __forceinline__ uint16_t *glmrt_rope_kv_target(const glmrt_cuda_rope_args &args, const glmrt_rope_slot &at,
                                                          int32_t h)
{
    const int is_key = glmrt_rope_is_key(args, h);
    const int32_t kv_head = is_key ? h - args.num_q_heads : h - args.num_q_heads - args.kv.num_kv_heads;
    return at.page_base + (int64_t)(is_key ? 0 : 1) * args.kv.num_kv_heads * args.kv.head_elements +
           (int64_t)kv_head * args.kv.head_elements + (int64_t)at.slot * args.kv.head_dim;
}

__device__ __forceinline__ void glmrt_rope_store_head(const glmrt_cuda_rope_args &args, float *head, float *source,
                                                      int32_t h, const float *cosines, const float *sines,
                                                      const glmrt_rope_slot &at, int lane)
{
    const int32_t head_dim = args.kv.head_dim;
    const int is_query = glmrt_rope_is_query(args, h);
    if (is_query || glmrt_rope_is_key(args, h)) {
        const float *norm = glmrt_rope_norm_of(args, h);
        if (norm != nullptr) {
            glmrt_head_rms_norm(head, norm, head_dim, args.eps, lane);
        }
        glmrt_head_rope(head, args.rotary_dim, cosines, sines, lane);
    }
    if (is_query) {
        for (int32_t i = lane; i < head_dim; i += 32) {
            source[i] = head[i];
        }
        return;
    }
    uint16_t *target = glmrt_rope_kv_target(args, at, h);
    for (int32_t i = lane; i < head_dim; i += 32) {
        target[i] = glmrt_float_to_bf16_bits(head[i]);
    }
}

template <int HD>
__device__ __forceinline__ void glmrt_head_rms_norm_lanes(float (&x)[HD / 32], const float *weight, float eps,
                                                          int lane)
{
    float sum = 0.0f;
#pragma unroll
    for (int v = 0; v < HD / 32; ++v) {
        sum = __fmaf_rn(x[v], x[v], sum);
    }
    const float inverse = glmrt_head_rms_inverse(sum, HD, eps);
#pragma unroll
    for (int v = 0; v < HD / 32; ++v) {
        x[v] = glmrt_head_rms_scaled(weight[lane + 32 * v], x[v], inverse);
    }
}

template <int HD>
__device__ __forceinline__ void glmrt_head_rope_lanes(float (&x)[HD / 32], int32_t half, const float *cosines,
                                                      const float *sines, int lane)
{
    if (half % 32 == 0) {
        const int pair_step = half / 32;
#pragma unroll
        for (int step = 1; step < HD / 32; ++step) {
#pragma unroll
            for (int v = 0; v + step < HD / 32; ++v) {
                if (step == pair_step && v < step) {
                    const int32_t i = lane + 32 * v;
                    const float2 rotated = glmrt_rope_rotate(x[v], x[v + step], cosines[i], sines[i]);
                    x[v] = rotated.x;
                    x[v + step] = rotated.y;
                }
            }
        }
        return;
    }
    const float partner = __shfl_xor_sync(0xffffffffu, x[0], half);
    if (lane < 2 * half) {
        const bool first_half = lane < half;
        const int32_t i = first_half ? lane : lane - half;
        const float2 rotated = first_half ? glmrt_rope_rotate(x[0], partner, cosines[i], sines[i])
                                          : glmrt_rope_rotate(partner, x[0], cosines[i], sines[i]);
        x[0] = first_half ? rotated.x : rotated.y;
    }
}

static int glmrt_rope_lanes_fit(int32_t head_dim, int32_t rotary_dim)
{
    const int32_t half = rotary_dim / 2;
    return (head_dim == 64 || head_dim == 128) && rotary_dim % 2 == 0 && half > 0 &&
           (half % 32 == 0 || (half < 32 && 32 % half == 0)) && 2 * half <= head_dim;
}

template <int HD>
__device__ __forceinline__ void glmrt_rope_store_lanes(const glmrt_cuda_rope_args &args, float (&x)[HD / 32],
                                                       float *source, int32_t h, const float *cosines,
                                                       const float *sines, const glmrt_rope_slot &at, int lane)
{
    const int is_query = glmrt_rope_is_query(args, h);
    if (is_query || glmrt_rope_is_key(args, h)) {
        const float *norm = glmrt_rope_norm_of(args, h);
        if (norm != nullptr) {
            glmrt_head_rms_norm_lanes<HD>(x, norm, args.eps, lane);
        }
        glmrt_head_rope_lanes<HD>(x, args.rotary_dim / 2, cosines, sines, lane);
    }
    if (is_query) {
#pragma unroll
        for (int v = 0; v < HD / 32; ++v) {
            source[lane + 32 * v] = x[v];
        }
        return;
    }
    uint16_t *target = glmrt_rope_kv_target(args, at, h);
#pragma unroll
    for (int v = 0; v < HD / 32; ++v) {
        target[lane + 32 * v] = glmrt_float_to_bf16_bits(x[v]);
    }
}

__host__ __device__ __forceinline__ int32_t glmrt_rope_num_heads(const glmrt_cuda_rope_args &args)
{
    return args.num_q_heads + 2 * args.kv.num_kv_heads;
}

template <int HEADS_PER_WARP>
__device__ __forceinline__ int32_t glmrt_rope_first_head(int warp)
{
    return ((int32_t)blockIdx.y * GLMRT_ROPE_WARPS + warp) * HEADS_PER_WARP;
}

template <int HEADS_PER_WARP, int VALUES>
__device__ __forceinline__ void glmrt_rope_load_heads(const float *row, int32_t first_head, int32_t num_heads,
                                                      int32_t head_dim, int lane,
                                                      float (&values)[HEADS_PER_WARP][VALUES])
{
#pragma unroll
    for (int k = 0; k < HEADS_PER_WARP; ++k) {
#pragma unroll
        for (int v = 0; v < VALUES; ++v) {
            const int32_t i = lane + 32 * v;
            values[k][v] = first_head + k < num_heads && i < head_dim ? row[(int64_t)(first_head + k) * head_dim + i]
                                                                      : 0.0f;
        }
    }
}

template <int HEADS_PER_WARP, int HD>
__global__ void __launch_bounds__(GLMRT_ROPE_WARPS * 32) glmrt_qk_rope_lanes_kernel(glmrt_cuda_rope_args args)
{
    glmrt_dependent_enter();
    extern __shared__ float rope_shared[];
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int32_t token = blockIdx.x;
    const int32_t first_head = glmrt_rope_first_head<HEADS_PER_WARP>(warp);
    float *cosines = rope_shared;
    float *sines = cosines + args.rotary_dim / 2;
    float *row = args.qkv + (int64_t)token * args.qkv_stride;
    const int32_t num_heads = glmrt_rope_num_heads(args);
    float values[HEADS_PER_WARP][HD / 32];
    glmrt_rope_load_heads<HEADS_PER_WARP, HD / 32>(row, first_head, num_heads, HD, lane, values);
    const int32_t position = args.positions[token];
    glmrt_rope_angles(cosines, sines, args.rotary_dim, args.theta, position);
    const glmrt_rope_slot at = glmrt_rope_slot_of(args, token, position);
#pragma unroll
    for (int k = 0; k < HEADS_PER_WARP; ++k) {
        const int32_t h = first_head + k;
        if (h < num_heads) {
            glmrt_rope_store_lanes<HD>(args, values[k], row + (int64_t)h * HD, h, cosines, sines, at, lane);
        }
    }
}

template <int HEADS_PER_WARP>
__global__ void __launch_bounds__(GLMRT_ROPE_WARPS * 32) glmrt_qk_rope_store_kernel(glmrt_cuda_rope_args args)
{
    glmrt_dependent_enter();
    extern __shared__ float rope_shared[];
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int32_t token = blockIdx.x;
    const int32_t head_dim = args.kv.head_dim;
    const int32_t first_head = glmrt_rope_first_head<HEADS_PER_WARP>(warp);
    float *heads = rope_shared + warp * HEADS_PER_WARP * head_dim;
    float *cosines = rope_shared + GLMRT_ROPE_WARPS * HEADS_PER_WARP * head_dim;
    float *sines = cosines + args.rotary_dim / 2;
    float *row = args.qkv + (int64_t)token * args.qkv_stride;
    const int32_t num_heads = glmrt_rope_num_heads(args);
    float values[HEADS_PER_WARP][GLMRT_ROPE_MAX_HEAD_DIM / 32];
    glmrt_rope_load_heads<HEADS_PER_WARP, GLMRT_ROPE_MAX_HEAD_DIM / 32>(row, first_head, num_heads, head_dim, lane,
                                                                       values);
    const int32_t position = args.positions[token];
    glmrt_rope_angles(cosines, sines, args.rotary_dim, args.theta, position);
#pragma unroll
    for (int k = 0; k < HEADS_PER_WARP; ++k) {
#pragma unroll
        for (int v = 0; v < GLMRT_ROPE_MAX_HEAD_DIM / 32; ++v) {
            const int32_t i = lane + 32 * v;
            if (i < head_dim) {
                heads[k * head_dim + i] = values[k][v];
            }
        }
    }
    __syncwarp();
    const glmrt_rope_slot at = glmrt_rope_slot_of(args, token, position);
    for (int k = 0; k < HEADS_PER_WARP; ++k) {
        const int32_t h = first_head + k;
        if (h < num_heads) {
            glmrt_rope_store_head(args, heads + k * head_dim, row + (int64_t)h * head_dim, h, cosines, sines, at,
                                  lane);
        }
    }
}

glmrt_status glmrt_cuda_qk_rope_store(const glmrt_cuda_rope_args *args, cudaStream_t stream, glmrt_error *error)
{
    if (args->num_tokens <= 0) {
        return GLMRT_OK;
    }
    const int32_t head_dim = args->kv.head_dim;
    if (head_dim <= 0 || head_dim > GLMRT_ROPE_MAX_HEAD_DIM || head_dim % 32 != 0 || args->rotary_dim > head_dim) {
        return glmrt_error_set(error, GLMRT_ERR_INVARIANT,
                               "rotary embedding over heads of %d dimensions (rotary %d) needs a multiple of 32 up to %d",
                               head_dim, args->rotary_dim, GLMRT_ROPE_MAX_HEAD_DIM);
    }
    const int wide = args->num_tokens >= GLMRT_ROPE_WIDE_MIN_TOKENS;
    const int32_t block_heads = GLMRT_ROPE_WARPS * (wide ? GLMRT_ROPE_WIDE_HEADS_PER_WARP : 1);
    const int lanes = args->path != GLMRT_ROPE_PATH_SHARED_MEMORY && glmrt_rope_lanes_fit(head_dim, args->rotary_dim);
    const size_t angles = 2 * (size_t)(args->rotary_dim / 2) * sizeof(float);
    const size_t shared = lanes ? angles : (size_t)block_heads * head_dim * sizeof(float) + angles;
    const int32_t num_heads = glmrt_rope_num_heads(*args);
    dim3 grid((unsigned)args->num_tokens, (unsigned)glmrt_ceil_div(num_heads, block_heads));
    glmrt_dependent_launch dependent;
    const cudaLaunchConfig_t *config = glmrt_dependent_config(&dependent, grid, GLMRT_ROPE_WARPS * 32, shared, stream);
    void (*kernel)(glmrt_cuda_rope_args) =
        wide ? glmrt_qk_rope_store_kernel<GLMRT_ROPE_WIDE_HEADS_PER_WARP> : glmrt_qk_rope_store_kernel<1>;
    if (lanes && head_dim == 128) {
        kernel = wide ? glmrt_qk_rope_lanes_kernel<GLMRT_ROPE_WIDE_HEADS_PER_WARP, 128>
                      : glmrt_qk_rope_lanes_kernel<1, 128>;
    } else if (lanes) {
        kernel = wide ? glmrt_qk_rope_lanes_kernel<GLMRT_ROPE_WIDE_HEADS_PER_WARP, 64>
                      : glmrt_qk_rope_lanes_kernel<1, 64>;
    }
    GLMRT_CUDA_TRY(error, cudaLaunchKernelEx(config, kernel, *args));
    return GLMRT_OK;
}
