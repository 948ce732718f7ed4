#ifndef GLMRT_BENCH_FILL_CUH
#define GLMRT_BENCH_FILL_CUH

#include <cuda_runtime.h>
#include <stdint.h>

__global__ void glmrt_bench_fill_floats(float *data, int64_t count, uint32_t seed, float base, float spread)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += (int64_t)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)i * 2246822519u ^ seed;
        h ^= h >> 16;
        h *= 2654435761u;
        data[i] = base + spread * ((float)(h >> 8) * (1.0f / 16777216.0f) - 0.5f);
    }
}

#endif
