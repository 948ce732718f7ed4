#include "cuda_check.cuh"
#include "device_math.cuh"
#include "weight_random.cuh"

#define GLMRT_RANDOM_WEIGHT_STD 0.02f
#define GLMRT_RANDOM_FP8_RANGE 240.0f
#define GLMRT_RANDOM_THREADS 256

__device__ __forceinline__ uint64_t glmrt_random_mix(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

__device__ __forceinline__ float glmrt_random_symmetric(uint64_t stream, int64_t index)
{
    uint64_t bits = glmrt_random_mix(stream + 0x9E3779B97F4A7C15ull * ((uint64_t)index + 1u));
    float unit = (float)(bits >> 40) * 0x1.0p-24f;
    return 2.0f * unit - 1.0f;
}

__global__ void glmrt_random_fp8_kernel(uint8_t *out, int64_t count, uint64_t stream)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += (int64_t)gridDim.x * blockDim.x) {
        out[i] = glmrt_float_to_fp8_e4m3_bits(glmrt_random_symmetric(stream, i) * GLMRT_RANDOM_FP8_RANGE);
    }
}

__global__ void glmrt_random_bf16_kernel(uint16_t *out, int64_t count, uint64_t stream, float amplitude)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += (int64_t)gridDim.x * blockDim.x) {
        out[i] = glmrt_float_to_bf16_bits(glmrt_random_symmetric(stream, i) * amplitude);
    }
}

__global__ void glmrt_random_f32_kernel(float *out, int64_t count, uint64_t stream, float center, float amplitude)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += (int64_t)gridDim.x * blockDim.x) {
        out[i] = center + glmrt_random_symmetric(stream, i) * amplitude;
    }
}

static unsigned glmrt_random_blocks(const glmrt_cuda_random_fill *fill, int64_t count)
{
    int64_t wanted = glmrt_ceil_div64(count, GLMRT_RANDOM_THREADS);
    int64_t cap = (int64_t)(fill->num_sms > 0 ? fill->num_sms : 1) * 32;
    return (unsigned)(wanted < cap ? (wanted > 0 ? wanted : 1) : cap);
}

static uint64_t glmrt_random_stream(glmrt_cuda_random_fill *fill)
{
    uint64_t tensor = fill->next_tensor++;
    uint64_t z = fill->seed ^ (0xD1B54A32D192ED03ull * (tensor + 1u));
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static glmrt_status glmrt_random_floats(glmrt_cuda_random_fill *fill, float *out, int64_t count, float center,
                                        float amplitude, glmrt_error *error)
{
    uint64_t stream = glmrt_random_stream(fill);
    glmrt_random_f32_kernel<<<glmrt_random_blocks(fill, count), GLMRT_RANDOM_THREADS, 0, fill->stream>>>(
        out, count, stream, center, amplitude);
    GLMRT_CUDA_LAUNCHED(error, "glmrt_random_f32_kernel");
    return GLMRT_OK;
}

static glmrt_status glmrt_random_matrix(void *context, const glmrt_cuda_matrix_spec *spec,
                                        const glmrt_cuda_matrix *m, glmrt_error *error)
{
    glmrt_cuda_random_fill *fill = (glmrt_cuda_random_fill *)context;
    int64_t count = m->group_bytes / glmrt_cuda_format_bytes(m->format) * m->num_groups;
    float uniform_amplitude = GLMRT_RANDOM_WEIGHT_STD * 1.7320508f;
    uint64_t stream = glmrt_random_stream(fill);
    unsigned blocks = glmrt_random_blocks(fill, count);
    if (m->format == GLMRT_CUDA_FORMAT_FP8) {
        glmrt_random_fp8_kernel<<<blocks, GLMRT_RANDOM_THREADS, 0, fill->stream>>>(m->data, count, stream);
        GLMRT_CUDA_LAUNCHED(error, "glmrt_random_fp8_kernel");
    } else if (m->format == GLMRT_CUDA_FORMAT_BF16) {
        glmrt_random_bf16_kernel<<<blocks, GLMRT_RANDOM_THREADS, 0, fill->stream>>>((uint16_t *)m->data, count,
                                                                                     stream, uniform_amplitude);
        GLMRT_CUDA_LAUNCHED(error, "glmrt_random_bf16_kernel");
    } else {
        GLMRT_TRY(glmrt_random_floats(fill, (float *)m->data, count, 0.0f, uniform_amplitude, error));
    }
    if (m->scale_kind == GLMRT_CUDA_SCALE_NONE) {
        return GLMRT_OK;
    }
    float fp8_std = GLMRT_RANDOM_FP8_RANGE / 1.7320508f;
    float scale = GLMRT_RANDOM_WEIGHT_STD / fp8_std;
    return glmrt_random_floats(fill, m->scale, m->group_scales * m->num_groups, scale, 0.25f * scale, error);
}

static glmrt_status glmrt_random_vector(void *context, const glmrt_cuda_vector_spec *spec, float *placed,
                                        glmrt_error *error)
{
    glmrt_cuda_random_fill *fill = (glmrt_cuda_random_fill *)context;
    switch (spec->kind) {
    case GLMRT_CUDA_VECTOR_NORM:
        return glmrt_random_floats(fill, placed, spec->length, 1.0f, 0.1f, error);
    case GLMRT_CUDA_VECTOR_ROUTER_BIAS:
        return glmrt_random_floats(fill, placed, spec->length, 0.0f, 0.01f, error);
    default:
        return glmrt_random_floats(fill, placed, spec->length, 0.0f, 0.02f, error);
    }
}

glmrt_cuda_layout_visitor glmrt_cuda_random_visitor(glmrt_cuda_random_fill *fill)
{
    glmrt_cuda_layout_visitor visitor;
    visitor.context = fill;
    visitor.matrix = glmrt_random_matrix;
    visitor.vector = glmrt_random_vector;
    return visitor;
}
