#include <math.h>

#include "dependent_launch.cuh"
#include "cuda_check.cuh"
#include "device_math.cuh"
#include "moe.cuh"
#include "moe_blocks.cuh"

#define GLMRT_ROUTE_WARPS 4
#define GLMRT_DISPATCH_THREADS 1024
#define GLMRT_ROUTE_DISPATCH_TOKENS (GLMRT_DISPATCH_THREADS / 32)
#define GLMRT_COMBINE_THREADS 128
#define GLMRT_COMBINE_LOADS 8

__global__ void glmrt_route_kernel(glmrt_cuda_route_args args)
{
    glmrt_dependent_enter();
    int32_t token = blockIdx.x * GLMRT_ROUTE_WARPS + (threadIdx.x >> 5);
    if (token < args.num_tokens) {
        glmrt_route_token(args, token, threadIdx.x & 31);
    }
}

glmrt_status glmrt_cuda_moe_check(int32_t num_experts, int32_t top_k, int32_t num_groups, glmrt_error *error)
{
    if (num_experts < 1 || num_experts > GLMRT_MOE_MAX_EXPERTS) {
        return glmrt_error_set(error, GLMRT_ERR_UNSUPPORTED, "CUDA MoE supports 1 to %d experts, the model has %d",
                               GLMRT_MOE_MAX_EXPERTS, num_experts);
    }
    if (top_k < 1 || top_k > GLMRT_MOE_MAX_TOP_K || top_k > num_experts) {
        return glmrt_error_set(error, GLMRT_ERR_UNSUPPORTED, "CUDA MoE supports 1 to %d experts a token, the model has %d",
                               GLMRT_MOE_MAX_TOP_K, top_k);
    }
    if (num_groups < 1 || num_groups > GLMRT_MOE_MAX_GROUPS || num_experts % num_groups != 0) {
        return glmrt_error_set(error, GLMRT_ERR_UNSUPPORTED, "CUDA MoE cannot split %d experts into %d groups",
                               num_experts, num_groups);
    }
    return GLMRT_OK;
}

glmrt_status glmrt_cuda_moe_route(const glmrt_cuda_route_args *args, cudaStream_t stream, glmrt_error *error)
{
    if (args->num_tokens <= 0) {
        return GLMRT_OK;
    }
    unsigned blocks = (unsigned)glmrt_ceil_div(args->num_tokens, GLMRT_ROUTE_WARPS);
    glmrt_dependent_launch dependent;
    const cudaLaunchConfig_t *config = glmrt_dependent_config(&dependent, blocks, GLMRT_ROUTE_WARPS * 32, 0, stream);
    GLMRT_CUDA_TRY(error, cudaLaunchKernelEx(config, glmrt_route_kernel, *args));
    return GLMRT_OK;
}

int32_t glmrt_cuda_moe_max_tiles(int32_t num_assignments, int32_t num_local_experts, int32_t tile_rows)
{
    int32_t busy = num_assignments < num_local_experts ? num_assignments : num_local_experts;
    return glmrt_ceil_div(num_assignments, tile_rows) + busy;
}

__global__ void __launch_bounds__(GLMRT_DISPATCH_THREADS) glmrt_dispatch_kernel(glmrt_cuda_dispatch_args args)
{
    glmrt_dependent_enter();
    glmrt_dispatch_block(args);
}

__global__ void __launch_bounds__(GLMRT_DISPATCH_THREADS)
    glmrt_route_dispatch_kernel(glmrt_cuda_route_args route, glmrt_cuda_dispatch_args dispatch)
{
    glmrt_dependent_enter();
    const int32_t warps = (int32_t)(blockDim.x >> 5);
    for (int32_t token = (int32_t)(threadIdx.x >> 5); token < route.num_tokens; token += warps) {
        glmrt_route_token(route, token, threadIdx.x & 31);
    }
    __syncthreads();
    glmrt_dispatch_small(dispatch);
}

glmrt_status glmrt_cuda_moe_dispatch_check(const glmrt_cuda_dispatch_args *args, glmrt_error *error)
{
    if (args->num_local_experts > GLMRT_MOE_MAX_EXPERTS) {
        return glmrt_error_set(error, GLMRT_ERR_UNSUPPORTED, "%d local experts exceed %d", args->num_local_experts,
                               GLMRT_MOE_MAX_EXPERTS);
    }
    return GLMRT_OK;
}

glmrt_status glmrt_cuda_moe_route_dispatch(const glmrt_cuda_route_args *route, const glmrt_cuda_dispatch_args *dispatch,
                                           cudaStream_t stream, glmrt_error *error)
{
    if (route->num_tokens <= 0) {
        return GLMRT_OK;
    }
    if (route->num_tokens > GLMRT_ROUTE_DISPATCH_TOKENS) {
        GLMRT_TRY(glmrt_cuda_moe_route(route, stream, error));
        return glmrt_cuda_moe_dispatch(dispatch, stream, error);
    }
    GLMRT_TRY(glmrt_cuda_moe_dispatch_check(dispatch, error));
    glmrt_dependent_launch dependent;
    const cudaLaunchConfig_t *config = glmrt_dependent_config(&dependent, 1, GLMRT_DISPATCH_THREADS, 0, stream);
    GLMRT_CUDA_TRY(error, cudaLaunchKernelEx(config, glmrt_route_dispatch_kernel, *route, *dispatch));
    return GLMRT_OK;
}

glmrt_status glmrt_cuda_moe_dispatch(const glmrt_cuda_dispatch_args *args, cudaStream_t stream, glmrt_error *error)
{
    if (args->num_tokens <= 0) {
        return GLMRT_OK;
    }
    GLMRT_TRY(glmrt_cuda_moe_dispatch_check(args, error));
    glmrt_dependent_launch dependent;
    const cudaLaunchConfig_t *config = glmrt_dependent_config(&dependent, 1, GLMRT_DISPATCH_THREADS, 0, stream);
    GLMRT_CUDA_TRY(error, cudaLaunchKernelEx(config, glmrt_dispatch_kernel, *args));
    return GLMRT_OK;
}

__device__ __forceinline__ float4 glmrt_combine_scaled(const float *expert_out, int64_t offset, float weight)
{
    const float4 v = *reinterpret_cast<const float4 *>(expert_out + offset);
    return make_float4(__fmul_rn(v.x, weight), __fmul_rn(v.y, weight), __fmul_rn(v.z, weight), __fmul_rn(v.w, weight));
}

__device__ __forceinline__ float4 glmrt_combine_add(float4 a, float4 b)
{
    return make_float4(__fadd_rn(a.x, b.x), __fadd_rn(a.y, b.y), __fadd_rn(a.z, b.z), __fadd_rn(a.w, b.w));
}

__global__ void __launch_bounds__(GLMRT_COMBINE_THREADS) glmrt_combine_kernel(glmrt_cuda_combine_args args)
{
    glmrt_dependent_enter();
    const int32_t token = blockIdx.x;
    const int32_t d = 4 * ((int32_t)blockIdx.y * GLMRT_COMBINE_THREADS + (int32_t)threadIdx.x);
    if (d >= args.hidden_size) {
        return;
    }
    const int32_t *rows = args.assignment_row + (int64_t)token * args.top_k;
    const float *weights = args.topk_weights + (int64_t)token * args.top_k;
    float4 routed = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int32_t base = 0; base < args.top_k; base += GLMRT_COMBINE_LOADS) {
        float4 values[GLMRT_COMBINE_LOADS];
        int32_t slot_rows[GLMRT_COMBINE_LOADS];
#pragma unroll
        for (int32_t k = 0; k < GLMRT_COMBINE_LOADS; ++k) {
            slot_rows[k] = base + k < args.top_k ? rows[base + k] : -1;
            values[k] = slot_rows[k] >= 0
                            ? glmrt_combine_scaled(args.expert_out, (int64_t)slot_rows[k] * args.hidden_size + d,
                                                   weights[base + k])
                            : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
#pragma unroll
        for (int32_t k = 0; k < GLMRT_COMBINE_LOADS; ++k) {
            if (slot_rows[k] >= 0) {
                routed = glmrt_combine_add(routed, values[k]);
            }
        }
    }
    float4 *hidden = reinterpret_cast<float4 *>(args.hidden + (int64_t)token * args.hidden_size + d);
    float4 mixed = routed;
    if (args.shared_out != nullptr) {
        mixed = glmrt_combine_add(routed,
                                  *reinterpret_cast<const float4 *>(args.shared_out + (int64_t)token * args.hidden_size + d));
    }
    *hidden = args.add_residual ? glmrt_combine_add(*hidden, mixed) : mixed;
}

glmrt_status glmrt_cuda_moe_combine(const glmrt_cuda_combine_args *args, cudaStream_t stream, glmrt_error *error)
{
    if (args->num_tokens <= 0) {
        return GLMRT_OK;
    }
    if (args->hidden_size % 4 != 0 || ((uintptr_t)args->hidden & 15u) != 0 || ((uintptr_t)args->expert_out & 15u) != 0 ||
        (args->shared_out != nullptr && ((uintptr_t)args->shared_out & 15u) != 0)) {
        return glmrt_error_set(error, GLMRT_ERR_INVARIANT,
                               "the MoE combine reads 16-byte aligned rows of a multiple of 4 values, got %d",
                               args->hidden_size);
    }
    dim3 grid((unsigned)args->num_tokens,
              (unsigned)glmrt_ceil_div(args->hidden_size, 4 * GLMRT_COMBINE_THREADS));
    glmrt_dependent_launch dependent;
    const cudaLaunchConfig_t *config = glmrt_dependent_config(&dependent, grid, GLMRT_COMBINE_THREADS, 0, stream);
    GLMRT_CUDA_TRY(error, cudaLaunchKernelEx(config, glmrt_combine_kernel, *args));
    return GLMRT_OK;
}
