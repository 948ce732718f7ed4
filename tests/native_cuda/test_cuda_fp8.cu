#include "cuda_test_support.cuh"
#include "device_math.cuh"
#include "fp8_convert.cuh"

extern "C" {
#include "fp8.h"
}

static int glmrt_same_float(float a, float b)
{
    if (isnan(a) || isnan(b)) {
        return isnan(a) && isnan(b);
    }
    uint32_t ba;
    uint32_t bb;
    memcpy(&ba, &a, 4);
    memcpy(&bb, &b, 4);
    return ba == bb;
}

static void glmrt_check_decode(glmrt_test_report *report)
{
    std::vector<uint8_t> bits(256);
    for (int i = 0; i < 256; ++i) {
        bits[i] = (uint8_t)i;
    }
    uint8_t *d_bits = glmrt_test_upload(bits);
    float *d_out = glmrt_test_alloc<float>(256);
    glmrt_error error;
    glmrt_error_clear(&error);
    glmrt_status status = glmrt_cuda_fp8_decode(d_bits, d_out, 256, 0, &error);
    std::vector<float> out = glmrt_test_download(d_out, 256);
    int mismatches = status == GLMRT_OK ? 0 : 256;
    for (int i = 0; i < 256 && status == GLMRT_OK; ++i) {
        mismatches += !glmrt_same_float(out[i], glmrt_fp8_e4m3_to_float((uint8_t)i));
    }
    glmrt_test_expect(report, mismatches == 0, "fp8 decode on the GPU equals the CPU for all 256 patterns", mismatches, 0);
    cudaFree(d_bits);
    cudaFree(d_out);
}

static std::vector<float> glmrt_encode_inputs(glmrt_test_rng *rng)
{
    std::vector<float> values;
    for (int i = 0; i < 256; ++i) {
        float v = glmrt_fp8_e4m3_to_float((uint8_t)i);
        values.push_back(v);
        float next = glmrt_fp8_e4m3_to_float((uint8_t)(i + 1));
        if ((i & 0x7f) != 0x7f && !isnan(v) && !isnan(next)) {
            values.push_back(0.5f * (v + next));
            values.push_back(nextafterf(0.5f * (v + next), INFINITY));
            values.push_back(nextafterf(0.5f * (v + next), -INFINITY));
        }
    }
    const float edges[] = {0.0f, -0.0f, 448.0f, -448.0f, 464.0f, 463.99f, 480.0f, 479.99f, 1e30f, -1e30f,
                           INFINITY, -INFINITY, NAN, -NAN, 0.015625f, 0.0146484375f, 0.001953125f, 0.0009765625f,
                           0.00097656f, 1e-10f, -1e-10f, 1.0f, -1.0f};
    for (float e : edges) {
        values.push_back(e);
    }
    for (int i = 0; i < 1 << 20; ++i) {
        uint32_t bits = (uint32_t)glmrt_test_next(rng);
        float v;
        memcpy(&v, &bits, 4);
        values.push_back(v);
        values.push_back((float)(glmrt_test_unit(rng) * 1000.0 - 500.0));
        values.push_back(glmrt_test_normal(rng) * 0.05f);
    }
    return values;
}

static void glmrt_check_encode(glmrt_test_report *report, glmrt_test_rng *rng)
{
    std::vector<float> values = glmrt_encode_inputs(rng);
    float *d_values = glmrt_test_upload(values);
    uint8_t *d_out = glmrt_test_alloc<uint8_t>(values.size());
    glmrt_error error;
    glmrt_error_clear(&error);
    glmrt_status status = glmrt_cuda_fp8_encode(d_values, d_out, (int64_t)values.size(), 0, &error);
    std::vector<uint8_t> out = glmrt_test_download(d_out, values.size());
    long mismatches = status == GLMRT_OK ? 0 : (long)values.size();
    for (size_t i = 0; i < values.size() && status == GLMRT_OK; ++i) {
        if (out[i] != glmrt_fp8_e4m3_from_float(values[i])) {
            if (mismatches < 5) {
                printf("  encode %a: gpu 0x%02x cpu 0x%02x\n", values[i], out[i], glmrt_fp8_e4m3_from_float(values[i]));
            }
            mismatches += 1;
        }
    }
    char what[128];
    snprintf(what, sizeof(what), "fp8 encode on the GPU equals the CPU on %zu values", values.size());
    glmrt_test_expect(report, mismatches == 0, what, (double)mismatches, 0);
    cudaFree(d_values);
    cudaFree(d_out);
}

__global__ void glmrt_fp8_pair_sweep_kernel(uint32_t first, unsigned long long *mismatches)
{
    const uint32_t bits = first + (uint32_t)(blockIdx.x * blockDim.x + threadIdx.x);
    const float value = __uint_as_float(bits);
    const float partner = __uint_as_float(bits ^ 0x80000000u);
    const uint16_t pair = glmrt_fp8x2_e4m3_bits(value, partner);
    const uint16_t expected = (uint16_t)((uint32_t)glmrt_e4m3_encode(value) | ((uint32_t)glmrt_e4m3_encode(partner) << 8));
    if (pair != expected) {
        atomicAdd(mismatches, 1ull);
    }
}

static void glmrt_check_pair_encode_every_float(glmrt_test_report *report)
{
    const unsigned threads = 256;
    const uint64_t per_launch = 1ull << 28;
    unsigned long long *d_mismatches = glmrt_test_alloc<unsigned long long>(1);
    cudaMemset(d_mismatches, 0, sizeof(unsigned long long));
    for (uint64_t first = 0; first < (1ull << 32); first += per_launch) {
        glmrt_fp8_pair_sweep_kernel<<<(unsigned)(per_launch / threads), threads>>>((uint32_t)first, d_mismatches);
    }
    cudaError_t launched = cudaDeviceSynchronize();
    std::vector<unsigned long long> mismatches = glmrt_test_download(d_mismatches, 1);
    const double count = launched == cudaSuccess ? (double)mismatches[0] : -1.0;
    glmrt_test_expect(report, launched == cudaSuccess && mismatches[0] == 0,
                      "the paired hardware E4M3 rounding equals the software encoder on every float bit pattern", count,
                      0);
    cudaFree(d_mismatches);
}

int main(void)
{
    glmrt_test_report report = {0, 0};
    glmrt_test_rng rng = {12345};
    glmrt_check_decode(&report);
    glmrt_check_encode(&report, &rng);
    glmrt_check_pair_encode_every_float(&report);
    return glmrt_test_finish("test_cuda_fp8", &report);
}
