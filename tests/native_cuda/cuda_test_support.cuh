#ifndef GLMRT_CUDA_TEST_SUPPORT_CUH
#define GLMRT_CUDA_TEST_SUPPORT_CUH

#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <vector>

typedef struct glmrt_test_rng {
    uint64_t state;
} glmrt_test_rng;

static inline uint64_t glmrt_test_next(glmrt_test_rng *rng)
{
    uint64_t z = (rng->state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static inline double glmrt_test_unit(glmrt_test_rng *rng)
{
    return (double)(glmrt_test_next(rng) >> 11) * 0x1.0p-53;
}

static inline float glmrt_test_normal(glmrt_test_rng *rng)
{
    double u1 = glmrt_test_unit(rng);
    double u2 = glmrt_test_unit(rng);
    if (u1 < 1e-300) {
        u1 = 1e-300;
    }
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

static inline int32_t glmrt_test_below(glmrt_test_rng *rng, int32_t bound)
{
    return (int32_t)(glmrt_test_next(rng) % (uint64_t)bound);
}

typedef struct glmrt_test_report {
    int32_t checks;
    int32_t failures;
} glmrt_test_report;

static inline void glmrt_test_expect(glmrt_test_report *report, int ok, const char *what, double measured,
                                     double bound)
{
    report->checks += 1;
    if (!ok) {
        report->failures += 1;
    }
    printf("%s %-64s measured %.3e bound %.3e\n", ok ? "PASS" : "FAIL", what, measured, bound);
}

static inline int glmrt_test_cuda_ok(glmrt_test_report *report, cudaError_t result, const char *call)
{
    if (result == cudaSuccess) {
        return 1;
    }
    report->checks += 1;
    report->failures += 1;
    printf("FAIL CUDA call %s: %s\n", call, cudaGetErrorString(result));
    return 0;
}

template <typename T>
static inline T *glmrt_test_upload(const std::vector<T> &host)
{
    T *device = nullptr;
    size_t bytes = host.size() * sizeof(T);
    if (cudaMalloc((void **)&device, bytes > 0 ? bytes : 1) != cudaSuccess) {
        return nullptr;
    }
    if (bytes > 0 && cudaMemcpy(device, host.data(), bytes, cudaMemcpyHostToDevice) != cudaSuccess) {
        cudaFree(device);
        return nullptr;
    }
    return device;
}

template <typename T>
static inline T *glmrt_test_alloc(size_t count)
{
    T *device = nullptr;
    if (cudaMalloc((void **)&device, (count > 0 ? count : 1) * sizeof(T)) != cudaSuccess) {
        return nullptr;
    }
    cudaMemset(device, 0xff, (count > 0 ? count : 1) * sizeof(T));
    return device;
}

template <typename T>
static inline std::vector<T> glmrt_test_download(const T *device, size_t count)
{
    std::vector<T> host(count);
    cudaDeviceSynchronize();
    if (count > 0) {
        cudaMemcpy(host.data(), device, count * sizeof(T), cudaMemcpyDeviceToHost);
    }
    return host;
}

static inline int glmrt_test_finish(const char *name, const glmrt_test_report *report)
{
    cudaError_t last = cudaDeviceSynchronize();
    if (last != cudaSuccess) {
        printf("FAIL %s: device error %s\n", name, cudaGetErrorString(last));
        return 1;
    }
    printf("%s: %d checks, %d failures\n", name, report->checks, report->failures);
    return report->failures == 0 ? 0 : 1;
}

#endif
