#include "activation_quant.cuh"
#include "cuda_check.cuh"
#include "device_math.cuh"

extern "C" {
#include "fp8.h"
}

#define GLMRT_ACTIVATION_THREADS 256

template <int OP>
__device__ __forceinline__ float4 glmrt_activation_values(const float *row, int32_t cols, int32_t col)
{
    const float4 first = *reinterpret_cast<const float4 *>(row + col);
    if (OP == GLMRT_ACTIVATION_COPY) {
        return first;
    }
    const float4 up = *reinterpret_cast<const float4 *>(row + cols + col);
    return make_float4(glmrt_silu_times(first.x, up.x), glmrt_silu_times(first.y, up.y),
                       glmrt_silu_times(first.z, up.z), glmrt_silu_times(first.w, up.w));
}

__device__ __forceinline__ float glmrt_activation_block_max(float value, float *shared)
{
    value = glmrt_warp_max(value);
    if ((threadIdx.x & 31) == 0) {
        shared[threadIdx.x >> 5] = value;
    }
    __syncthreads();
    float result = 0.0f;
    for (int w = 0; w < (int)(blockDim.x >> 5); ++w) {
        result = fmaxf(result, shared[w]);
    }
    return result;
}

__device__ __forceinline__ uint32_t glmrt_fp8x4_bits(float4 v, float scale)
{
    return (uint32_t)glmrt_float_to_fp8_e4m3_bits(__fdiv_rn(v.x, scale)) |
           ((uint32_t)glmrt_float_to_fp8_e4m3_bits(__fdiv_rn(v.y, scale)) << 8) |
           ((uint32_t)glmrt_float_to_fp8_e4m3_bits(__fdiv_rn(v.z, scale)) << 16) |
           ((uint32_t)glmrt_float_to_fp8_e4m3_bits(__fdiv_rn(v.w, scale)) << 24);
}

__device__ __forceinline__ uint2 glmrt_bf16x4_bits(float4 v)
{
    uint2 out;
    out.x = (uint32_t)glmrt_float_to_bf16_bits(v.x) | ((uint32_t)glmrt_float_to_bf16_bits(v.y) << 16);
    out.y = (uint32_t)glmrt_float_to_bf16_bits(v.z) | ((uint32_t)glmrt_float_to_bf16_bits(v.w) << 16);
    return out;
}

template <int OP, int KIND>
__global__ void __launch_bounds__(GLMRT_ACTIVATION_THREADS)
    glmrt_activation_quantize_kernel(const float *x, int64_t x_stride, const int32_t *x_rows, int32_t num_rows,
                                     const int32_t *device_rows, uint8_t *out, float *out_scales, int32_t cols)
{
    __shared__ float warp_max[GLMRT_ACTIVATION_THREADS / 32];
    const int32_t rows = device_rows != nullptr ? min(*device_rows, num_rows) : num_rows;
    const int32_t r = (int32_t)blockIdx.x;
    if (r >= rows) {
        return;
    }
    const int64_t source = x_rows != nullptr ? x_rows[r] : r;
    const float *row = x + source * x_stride;
    if (KIND == GLMRT_OPERAND_BF16) {
        uint2 *target = reinterpret_cast<uint2 *>(out + (int64_t)r * cols * 2);
        for (int32_t c = (int32_t)threadIdx.x * 4; c < cols; c += GLMRT_ACTIVATION_THREADS * 4) {
            target[c / 4] = glmrt_bf16x4_bits(glmrt_activation_values<OP>(row, cols, c));
        }
        return;
    }
    float amax = 0.0f;
    for (int32_t c = (int32_t)threadIdx.x * 4; c < cols; c += GLMRT_ACTIVATION_THREADS * 4) {
        const float4 v = glmrt_activation_values<OP>(row, cols, c);
        amax = fmaxf(amax, fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w))));
    }
    amax = glmrt_activation_block_max(amax, warp_max);
    const float scale = amax > 0.0f ? __fdiv_rn(amax, GLMRT_FP8_E4M3_MAX) : 1.0f;
    uint32_t *target = reinterpret_cast<uint32_t *>(out + (int64_t)r * cols);
    for (int32_t c = (int32_t)threadIdx.x * 4; c < cols; c += GLMRT_ACTIVATION_THREADS * 4) {
        target[c / 4] = glmrt_fp8x4_bits(glmrt_activation_values<OP>(row, cols, c), scale);
    }
    if (threadIdx.x == 0) {
        out_scales[r] = scale;
    }
}

template <int OP>
static glmrt_status glmrt_activation_launch(const glmrt_cuda_activation_args *a, cudaStream_t stream,
                                            glmrt_error *error)
{
    const glmrt_cuda_qgemm_operand *o = a->out;
    if (o->kind == GLMRT_OPERAND_FP8) {
        glmrt_activation_quantize_kernel<OP, GLMRT_OPERAND_FP8><<<a->num_rows, GLMRT_ACTIVATION_THREADS, 0, stream>>>(
            a->x, a->x_stride, a->x_rows, a->num_rows, a->device_rows, o->data, o->scales, o->cols);
    } else {
        glmrt_activation_quantize_kernel<OP, GLMRT_OPERAND_BF16><<<a->num_rows, GLMRT_ACTIVATION_THREADS, 0, stream>>>(
            a->x, a->x_stride, a->x_rows, a->num_rows, a->device_rows, o->data, o->scales, o->cols);
    }
    GLMRT_CUDA_LAUNCHED(error, "glmrt_activation_quantize_kernel");
    return GLMRT_OK;
}

glmrt_status glmrt_cuda_activation_quantize(const glmrt_cuda_activation_args *args, cudaStream_t stream,
                                            glmrt_error *error)
{
    if (args->num_rows <= 0) {
        return GLMRT_OK;
    }
    const glmrt_cuda_qgemm_operand *o = args->out;
    if (args->num_rows > o->capacity_rows || o->cols % 4 != 0 || ((uintptr_t)args->x & 15u) != 0 ||
        args->x_stride % 4 != 0) {
        return glmrt_error_set(error, GLMRT_ERR_INVARIANT,
                               "activation quantization of %d rows of %d columns into a buffer of %d rows needs 16-byte aligned rows",
                               args->num_rows, o->cols, o->capacity_rows);
    }
    if (args->op == GLMRT_ACTIVATION_SILU_MUL) {
        return glmrt_activation_launch<GLMRT_ACTIVATION_SILU_MUL>(args, stream, error);
    }
    return glmrt_activation_launch<GLMRT_ACTIVATION_COPY>(args, stream, error);
}
