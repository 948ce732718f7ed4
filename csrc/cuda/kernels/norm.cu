#include <string.h>

#include "dependent_launch.cuh"
#include "activation_quant.cuh"
#include "cuda_check.cuh"
#include "norm.cuh"

#define GLMRT_NORM_THREADS 256
#define GLMRT_NORM_CACHED 5
#define GLMRT_NORM_F32_ONLY (-1)

__device__ __forceinline__ float glmrt_block_sum(float value, float *shared)
{
    int lane = threadIdx.x & 31;
    int warp = threadIdx.x >> 5;
    value = glmrt_warp_sum(value);
    if (lane == 0) {
        shared[warp] = value;
    }
    __syncthreads();
    int num_warps = (int)blockDim.x >> 5;
    float total = 0.0f;
    for (int w = 0; w < num_warps; ++w) {
        total += shared[w];
    }
    __syncthreads();
    return total;
}

__device__ __forceinline__ float glmrt_square_sum4(float4 v, float sum)
{
    sum = __fmaf_rn(v.x, v.x, sum);
    sum = __fmaf_rn(v.y, v.y, sum);
    sum = __fmaf_rn(v.z, v.z, sum);
    return __fmaf_rn(v.w, v.w, sum);
}

__device__ __forceinline__ float4 glmrt_norm_scale4(float4 w, float4 v, float inverse)
{
    return make_float4(w.x * (v.x * inverse), w.y * (v.y * inverse), w.z * (v.z * inverse), w.w * (v.w * inverse));
}

template <int KIND>
__global__ void __launch_bounds__(GLMRT_NORM_THREADS)
    glmrt_rmsnorm_kernel(glmrt_cuda_rmsnorm_args args, glmrt_cuda_qgemm_operand quantized)
{
    __shared__ float partial[GLMRT_NORM_THREADS / 32];
    __shared__ float row_max[GLMRT_NORM_THREADS / 32];
    const float4 *weight4 = reinterpret_cast<const float4 *>(args.weight);
    const int32_t count = args.n / 4;
    float4 weights[GLMRT_NORM_CACHED];
#pragma unroll
    for (int k = 0; k < GLMRT_NORM_CACHED; ++k) {
        int32_t i = (int32_t)threadIdx.x + k * GLMRT_NORM_THREADS;
        weights[k] = i < count ? weight4[i] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
    glmrt_dependent_enter();
    int64_t source = args.x_rows != nullptr ? args.x_rows[blockIdx.x] : blockIdx.x;
    const float4 *row = reinterpret_cast<const float4 *>(args.x + source * args.x_stride);
    float4 *out = reinterpret_cast<float4 *>(args.y + (int64_t)blockIdx.x * args.y_stride);
    float4 cached[GLMRT_NORM_CACHED];
    float sum = 0.0f;
#pragma unroll
    for (int k = 0; k < GLMRT_NORM_CACHED; ++k) {
        int32_t i = (int32_t)threadIdx.x + k * GLMRT_NORM_THREADS;
        cached[k] = i < count ? row[i] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
#pragma unroll
    for (int k = 0; k < GLMRT_NORM_CACHED; ++k) {
        sum = glmrt_square_sum4(cached[k], sum);
    }
    for (int32_t i = (int32_t)threadIdx.x + GLMRT_NORM_CACHED * GLMRT_NORM_THREADS; i < count; i += GLMRT_NORM_THREADS) {
        sum = glmrt_square_sum4(row[i], sum);
    }
    const float inverse = 1.0f / sqrtf(glmrt_block_sum(sum, partial) / (float)args.n + args.eps);
    float amax = 0.0f;
#pragma unroll
    for (int k = 0; k < GLMRT_NORM_CACHED; ++k) {
        int32_t i = (int32_t)threadIdx.x + k * GLMRT_NORM_THREADS;
        if (i < count) {
            cached[k] = glmrt_norm_scale4(weights[k], cached[k], inverse);
            out[i] = cached[k];
            amax = glmrt_abs_max4(cached[k], amax);
        }
    }
    for (int32_t i = (int32_t)threadIdx.x + GLMRT_NORM_CACHED * GLMRT_NORM_THREADS; i < count; i += GLMRT_NORM_THREADS) {
        float4 v = glmrt_norm_scale4(weight4[i], row[i], inverse);
        out[i] = v;
        amax = glmrt_abs_max4(v, amax);
    }
    if (KIND == GLMRT_NORM_F32_ONLY) {
        return;
    }
    float scale = 1.0f;
    if (KIND == GLMRT_OPERAND_FP8) {
        scale = glmrt_activation_scale(glmrt_activation_block_max(amax, row_max));
        if (threadIdx.x == 0) {
            quantized.scales[blockIdx.x] = scale;
        }
    }
#pragma unroll
    for (int k = 0; k < GLMRT_NORM_CACHED; ++k) {
        int32_t i = (int32_t)threadIdx.x + k * GLMRT_NORM_THREADS;
        if (i < count) {
            glmrt_operand_store4<KIND>(quantized.data, quantized.cols, blockIdx.x, i, cached[k], scale);
        }
    }
    for (int32_t i = (int32_t)threadIdx.x + GLMRT_NORM_CACHED * GLMRT_NORM_THREADS; i < count; i += GLMRT_NORM_THREADS) {
        glmrt_operand_store4<KIND>(quantized.data, quantized.cols, blockIdx.x, i, out[i], scale);
    }
}

static glmrt_status glmrt_rmsnorm_check(const glmrt_cuda_rmsnorm_args *a, glmrt_error *error)
{
    if (a->n % 4 != 0 || a->x_stride % 4 != 0 || a->y_stride % 4 != 0 || ((uintptr_t)a->x & 15u) != 0 ||
        ((uintptr_t)a->y & 15u) != 0 || ((uintptr_t)a->weight & 15u) != 0) {
        return glmrt_error_set(error, GLMRT_ERR_INVARIANT,
                               "RMSNorm of rows of %d values needs 16-byte aligned rows of a multiple of 4 values",
                               a->n);
    }
    const glmrt_cuda_qgemm_operand *q = a->quantized;
    if (q != nullptr && (q->cols != a->n || a->num_rows > q->capacity_rows ||
                         (q->kind != GLMRT_OPERAND_FP8 && q->kind != GLMRT_OPERAND_BF16))) {
        return glmrt_error_set(error, GLMRT_ERR_INVARIANT,
                               "RMSNorm of %d rows of %d values cannot fill a matmul operand of %d rows of %d columns",
                               a->num_rows, a->n, q->capacity_rows, q->cols);
    }
    return GLMRT_OK;
}

glmrt_status glmrt_cuda_rmsnorm_run(const glmrt_cuda_rmsnorm_args *args, cudaStream_t stream, glmrt_error *error)
{
    if (args->num_rows <= 0) {
        return GLMRT_OK;
    }
    GLMRT_TRY(glmrt_rmsnorm_check(args, error));
    const glmrt_cuda_qgemm_operand *q = args->quantized;
    glmrt_cuda_qgemm_operand none;
    memset(&none, 0, sizeof(none));
    void (*kernel)(glmrt_cuda_rmsnorm_args, glmrt_cuda_qgemm_operand) = glmrt_rmsnorm_kernel<GLMRT_NORM_F32_ONLY>;
    if (q != nullptr) {
        kernel = q->kind == GLMRT_OPERAND_FP8 ? glmrt_rmsnorm_kernel<GLMRT_OPERAND_FP8>
                                              : glmrt_rmsnorm_kernel<GLMRT_OPERAND_BF16>;
    }
    glmrt_dependent_launch dependent;
    const cudaLaunchConfig_t *config = glmrt_dependent_config(&dependent, args->num_rows, GLMRT_NORM_THREADS, 0, stream);
    GLMRT_CUDA_TRY(error, cudaLaunchKernelEx(config, kernel, *args, q != nullptr ? *q : none));
    return GLMRT_OK;
}
