#include "cuda_check.cuh"
#include "device_math.cuh"
#include "fp8_convert.cuh"

#define GLMRT_FP8_THREADS 256
#define GLMRT_FP8_MAX_BLOCKS 4096

static unsigned glmrt_fp8_blocks(int64_t count)
{
    int64_t blocks = glmrt_ceil_div64(count, GLMRT_FP8_THREADS);
    return (unsigned)(blocks < 1 ? 1 : (blocks > GLMRT_FP8_MAX_BLOCKS ? GLMRT_FP8_MAX_BLOCKS : blocks));
}

__global__ void glmrt_fp8_decode_kernel(const uint8_t *bits, float *out, int64_t pairs)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < pairs; i += (int64_t)gridDim.x * blockDim.x) {
        uint16_t pair = (uint16_t)bits[2 * i] | ((uint16_t)bits[2 * i + 1] << 8);
        float2 values = glmrt_fp8x2_to_float2(pair);
        out[2 * i] = values.x;
        out[2 * i + 1] = values.y;
    }
}

__global__ void glmrt_fp8_encode_kernel(const float *values, uint8_t *out, int64_t count)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += (int64_t)gridDim.x * blockDim.x) {
        out[i] = glmrt_float_to_fp8_e4m3_bits(values[i]);
    }
}

glmrt_status glmrt_cuda_fp8_decode(const uint8_t *bits, float *out, int64_t count, cudaStream_t stream,
                                   glmrt_error *error)
{
    if (count <= 0) {
        return GLMRT_OK;
    }
    if (count % 2 != 0) {
        return glmrt_error_set(error, GLMRT_ERR_INVALID_ARGUMENT, "FP8 decode takes pairs, got %lld values",
                               (long long)count);
    }
    glmrt_fp8_decode_kernel<<<glmrt_fp8_blocks(count / 2), GLMRT_FP8_THREADS, 0, stream>>>(bits, out, count / 2);
    GLMRT_CUDA_LAUNCHED(error, "glmrt_fp8_decode_kernel");
    return GLMRT_OK;
}

glmrt_status glmrt_cuda_fp8_encode(const float *values, uint8_t *out, int64_t count, cudaStream_t stream,
                                   glmrt_error *error)
{
    if (count <= 0) {
        return GLMRT_OK;
    }
    glmrt_fp8_encode_kernel<<<glmrt_fp8_blocks(count), GLMRT_FP8_THREADS, 0, stream>>>(values, out, count);
    GLMRT_CUDA_LAUNCHED(error, "glmrt_fp8_encode_kernel");
    return GLMRT_OK;
}
