#include "dependent_launch.cuh"
#include "attention_kernels.cuh"
#include "attention_decode_item.cuh"
#include "cuda_check.cuh"

template <int HD, int STAGES>
__global__ void __launch_bounds__(glmrt_decode_shape<HD, STAGES>::threads)
    glmrt_attention_decode_kernel(glmrt_cuda_attention_args args)
{
    glmrt_dependent_enter();
    extern __shared__ __align__(128) uint8_t decode_shared[];
    const int32_t count = glmrt_attention_item_count(args);
    for (int32_t index = blockIdx.x; index < count; index += gridDim.x) {
        glmrt_decode_item<HD, STAGES>(args, args.items[index], decode_shared);
        __syncthreads();
    }
}

typedef void (*glmrt_decode_kernel_fn)(glmrt_cuda_attention_args);

template <int HD>
static glmrt_decode_kernel_fn glmrt_decode_pick_stages(int deep, size_t *shared)
{
    if (deep) {
        *shared = glmrt_decode_shape<HD, GLMRT_DECODE_DEEP_STAGES>::shared_bytes;
        return glmrt_attention_decode_kernel<HD, GLMRT_DECODE_DEEP_STAGES>;
    }
    *shared = glmrt_decode_shape<HD, GLMRT_DECODE_STAGES>::shared_bytes;
    return glmrt_attention_decode_kernel<HD, GLMRT_DECODE_STAGES>;
}

static glmrt_decode_kernel_fn glmrt_decode_pick(int32_t head_dim, int deep, size_t *shared)
{
    switch (head_dim) {
    case 32: return glmrt_decode_pick_stages<32>(deep, shared);
    case 64: return glmrt_decode_pick_stages<64>(deep, shared);
    case 128: return glmrt_decode_pick_stages<128>(deep, shared);
    default: return nullptr;
    }
}

int glmrt_attention_head_dim_supported(int32_t head_dim)
{
    return head_dim == 32 || head_dim == 64 || head_dim == 128;
}

glmrt_status glmrt_attention_decode_prepare(int32_t head_dim, glmrt_error *error)
{
    for (int deep = 0; deep < 2; ++deep) {
        size_t shared = 0;
        glmrt_decode_kernel_fn kernel = glmrt_decode_pick(head_dim, deep, &shared);
        if (kernel == nullptr) {
            return glmrt_error_set(error, GLMRT_ERR_INVARIANT, "no decode attention kernel for head_dim %d", head_dim);
        }
        GLMRT_CUDA_TRY(error, cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)shared));
    }
    return glmrt_attention_decode_spread_prepare(head_dim, error);
}

glmrt_status glmrt_attention_decode_launch(const glmrt_cuda_attention_args *args, cudaStream_t stream,
                                           glmrt_error *error)
{
    int32_t sms = 0;
    GLMRT_TRY(glmrt_cuda_current_sms(&sms, error));
    if (args->decode_path < GLMRT_ATTENTION_DECODE_AUTO || args->decode_path > GLMRT_ATTENTION_DECODE_SPREAD) {
        return glmrt_error_set(error, GLMRT_ERR_INVARIANT, "unknown decode attention path %d", args->decode_path);
    }
    const int32_t clusters = glmrt_attention_decode_spread_clusters(args, sms);
    if (clusters > 0) {
        return glmrt_attention_decode_spread_launch(args, clusters, stream, error);
    }
    int32_t grid_items = glmrt_attention_grid_items(args);
    int64_t blocks = (int64_t)grid_items * args->kv.num_kv_heads;
    size_t shared = 0;
    glmrt_decode_kernel_fn kernel = glmrt_decode_pick(args->kv.head_dim, blocks <= sms, &shared);
    if (kernel == nullptr) {
        return glmrt_error_set(error, GLMRT_ERR_INVARIANT, "no decode attention kernel for head_dim %d",
                               args->kv.head_dim);
    }
    dim3 grid((unsigned)grid_items, (unsigned)args->kv.num_kv_heads);
    int threads = args->kv.head_dim >= 64 ? 256 : 128;
    glmrt_dependent_launch dependent;
    const cudaLaunchConfig_t *config = glmrt_dependent_config(&dependent, grid, threads, shared, stream);
    GLMRT_CUDA_TRY(error, cudaLaunchKernelEx(config, kernel, *args));
    return GLMRT_OK;
}
