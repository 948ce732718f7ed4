#include <cub/cub.cuh>
#include <float.h>
#include <math.h>

#include "dependent_launch.cuh"
#include "cuda_check.cuh"
#include "device_arena.cuh"
#include "device_math.cuh"
#include "sampling.cuh"

#define GLMRT_SAMPLE_THREADS 1024
#define GLMRT_COUNT_REPETITION_DONE (1 << 30)
#define GLMRT_COUNT_ADDITIVE_DONE (1 << 29)
#define GLMRT_COUNT_MASK (GLMRT_COUNT_ADDITIVE_DONE - 1)
#define GLMRT_NO_CROSSING 0x7fffffff
#define GLMRT_ARGMAX_SLICES 16

__device__ __forceinline__ uint32_t glmrt_order_key(float value)
{
    if (value == 0.0f) {
        value = 0.0f;
    }
    uint32_t bits = __float_as_uint(value);
    return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
}

__device__ __forceinline__ float glmrt_order_value(uint32_t key)
{
    uint32_t bits = (key & 0x80000000u) ? (key & 0x7fffffffu) : ~key;
    return __uint_as_float(bits);
}

__device__ __forceinline__ bool glmrt_token_in_vocab(int32_t token, int32_t vocab_size)
{
    return token >= 0 && token < vocab_size;
}

__device__ void glmrt_apply_penalties(float *values, int32_t *counts, int32_t vocab_size,
                                      const glmrt_cuda_sample_params &p, const int32_t *history)
{
    bool repetition = p.repetition_penalty != 1.0f;
    bool additive = p.frequency_penalty != 0.0f || p.presence_penalty != 0.0f;
    if ((!repetition && !additive) || p.num_history <= 0) {
        return;
    }
    const int32_t *all = history + p.history_begin;
    const int32_t *output = all + p.num_prompt;
    int32_t num_output = p.num_history - p.num_prompt;
    for (int32_t i = threadIdx.x; i < num_output; i += blockDim.x) {
        if (glmrt_token_in_vocab(output[i], vocab_size)) {
            atomicAdd(&counts[output[i]], 1);
        }
    }
    __syncthreads();
    if (repetition) {
        for (int32_t i = threadIdx.x; i < p.num_history; i += blockDim.x) {
            int32_t token = all[i];
            if (!glmrt_token_in_vocab(token, vocab_size)) {
                continue;
            }
            int32_t old = atomicOr(&counts[token], GLMRT_COUNT_REPETITION_DONE);
            if (!(old & GLMRT_COUNT_REPETITION_DONE)) {
                float v = values[token];
                values[token] = v > 0.0f ? __fdiv_rn(v, p.repetition_penalty) : __fmul_rn(v, p.repetition_penalty);
            }
        }
        __syncthreads();
    }
    if (additive) {
        for (int32_t i = threadIdx.x; i < num_output; i += blockDim.x) {
            int32_t token = output[i];
            if (!glmrt_token_in_vocab(token, vocab_size)) {
                continue;
            }
            int32_t old = atomicOr(&counts[token], GLMRT_COUNT_ADDITIVE_DONE);
            if (!(old & GLMRT_COUNT_ADDITIVE_DONE)) {
                float count = (float)(old & GLMRT_COUNT_MASK);
                float penalty = __fadd_rn(__fmul_rn(p.frequency_penalty, count), p.presence_penalty);
                values[token] = __fsub_rn(values[token], penalty);
            }
        }
        __syncthreads();
    }
    for (int32_t i = threadIdx.x; i < p.num_history; i += blockDim.x) {
        if (glmrt_token_in_vocab(all[i], vocab_size)) {
            counts[all[i]] = 0;
        }
    }
    __syncthreads();
}

__device__ __forceinline__ bool glmrt_sample_reads_logits(const glmrt_cuda_sample_params &p, int32_t needs_sort)
{
    bool penalties = p.num_history > 0 && (p.repetition_penalty != 1.0f || p.frequency_penalty != 0.0f ||
                                           p.presence_penalty != 0.0f);
    return !needs_sort && !penalties;
}

__global__ void __launch_bounds__(GLMRT_SAMPLE_THREADS)
    glmrt_sample_prepare_kernel(glmrt_cuda_sampler sampler, glmrt_cuda_sample_args args)
{
    glmrt_dependent_enter();
    const int32_t row = blockIdx.x;
    const int32_t vocab = sampler.vocab_size;
    const glmrt_cuda_sample_params p = args.params[row];
    if (glmrt_sample_reads_logits(p, args.needs_sort)) {
        return;
    }
    const float *logits = args.logits + (int64_t)row * vocab;
    float *values = sampler.values + (int64_t)row * vocab;
    int32_t *counts = sampler.counts + (int64_t)row * vocab;
    for (int32_t i = threadIdx.x; i < vocab; i += blockDim.x) {
        values[i] = logits[i];
    }
    __syncthreads();
    glmrt_apply_penalties(values, counts, vocab, p, args.history);
    if (!args.needs_sort) {
        return;
    }
    uint32_t *keys = sampler.keys_in + (int64_t)row * vocab;
    int32_t *ids = sampler.ids_in + (int64_t)row * vocab;
    for (int32_t i = threadIdx.x; i < vocab; i += blockDim.x) {
        uint32_t key = 0;
        if (p.temperature != 0.0f) {
            float scaled = values[i] / p.temperature;
            if (!(isnan(scaled) || scaled == -INFINITY)) {
                key = glmrt_order_key(scaled == INFINITY ? FLT_MAX : scaled);
            }
        }
        keys[i] = key;
        ids[i] = i;
    }
}

typedef cub::BlockReduce<double, GLMRT_SAMPLE_THREADS> glmrt_block_reduce_double;
typedef cub::BlockScan<double, GLMRT_SAMPLE_THREADS> glmrt_block_scan_double;
typedef cub::BlockReduce<int32_t, GLMRT_SAMPLE_THREADS> glmrt_block_reduce_int;

union glmrt_sample_shared {
    typename glmrt_block_reduce_double::TempStorage reduce;
    typename glmrt_block_scan_double::TempStorage scan;
    typename glmrt_block_reduce_int::TempStorage reduce_int;
};

struct glmrt_weight_term {
    const uint32_t *keys;
    double max_value;
    double divisor;
    __device__ __forceinline__ double operator()(int32_t i) const
    {
        return exp((double)glmrt_order_value(keys[i]) - max_value) / divisor;
    }
};

__device__ double glmrt_block_total(int32_t length, const glmrt_weight_term &term, glmrt_sample_shared *shared,
                                    double *broadcast)
{
    double local = 0.0;
    for (int32_t i = threadIdx.x; i < length; i += blockDim.x) {
        local += term(i);
    }
    double total = glmrt_block_reduce_double(shared->reduce).Sum(local);
    if (threadIdx.x == 0) {
        *broadcast = total;
    }
    __syncthreads();
    double result = *broadcast;
    __syncthreads();
    return result;
}

__device__ int32_t glmrt_block_first_crossing(int32_t length, const glmrt_weight_term &term, double threshold,
                                              bool inclusive, glmrt_sample_shared *shared, int32_t *broadcast)
{
    int32_t chunk = (length + (int32_t)blockDim.x - 1) / (int32_t)blockDim.x;
    int32_t begin = min((int32_t)threadIdx.x * chunk, length);
    int32_t end = min(begin + chunk, length);
    double local = 0.0;
    for (int32_t i = begin; i < end; ++i) {
        local += term(i);
    }
    double before = 0.0;
    glmrt_block_scan_double(shared->scan).ExclusiveSum(local, before);
    __syncthreads();
    int32_t found = GLMRT_NO_CROSSING;
    double running = before;
    for (int32_t i = begin; i < end; ++i) {
        running += term(i);
        if (inclusive ? running >= threshold : running > threshold) {
            found = i;
            break;
        }
    }
    int32_t first = glmrt_block_reduce_int(shared->reduce_int).Reduce(found, cuda::minimum<int32_t>());
    if (threadIdx.x == 0) {
        *broadcast = first;
    }
    __syncthreads();
    int32_t result = *broadcast;
    __syncthreads();
    return result;
}

__device__ __forceinline__ unsigned long long glmrt_argmax_key(float value, int32_t id)
{
    return ((unsigned long long)glmrt_order_key(value) << 32) | (unsigned long long)(0xffffffffu - (uint32_t)id);
}

__device__ __forceinline__ int32_t glmrt_argmax_token(unsigned long long key)
{
    return key == 0ull ? 0 : (int32_t)(0xffffffffu - (uint32_t)(key & 0xffffffffull));
}

__device__ __forceinline__ unsigned long long glmrt_warp_max_key(unsigned long long key)
{
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
        unsigned long long other = __shfl_xor_sync(0xffffffffu, key, offset);
        key = other > key ? other : key;
    }
    return key;
}

__device__ unsigned long long glmrt_block_max_key(unsigned long long key, unsigned long long *warp_keys)
{
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    key = glmrt_warp_max_key(key);
    if (lane == 0) {
        warp_keys[warp] = key;
    }
    __syncthreads();
    if (warp == 0) {
        const int warps = (int)(blockDim.x >> 5);
        key = lane < warps ? warp_keys[lane] : 0ull;
        key = glmrt_warp_max_key(key);
    }
    return key;
}

__device__ __forceinline__ void glmrt_sample_emit(const glmrt_cuda_sample_args &args, int32_t row, int32_t token)
{
    args.out_tokens[row] = token;
    if (args.host_tokens != nullptr) {
        args.host_tokens[row] = token;
        __threadfence_system();
    }
}

__device__ void glmrt_slice_argmax(const float *values, int32_t vocab, glmrt_cuda_sampler &sampler, int32_t row,
                                   const glmrt_cuda_sample_args &args, unsigned long long *warp_keys)
{
    const int32_t slice = glmrt_ceil_div(vocab, (int32_t)gridDim.y);
    const int32_t begin = (int32_t)blockIdx.y * slice;
    const int32_t end = min(vocab, begin + slice);
    unsigned long long best = 0ull;
    for (int32_t i = begin + (int32_t)threadIdx.x; i < end; i += (int32_t)blockDim.x) {
        float v = values[i];
        if (!isnan(v)) {
            unsigned long long key = glmrt_argmax_key(v, i);
            best = key > best ? key : best;
        }
    }
    best = glmrt_block_max_key(best, warp_keys);
    if (threadIdx.x != 0) {
        return;
    }
    if (best != 0ull) {
        atomicMax(&sampler.argmax_keys[row], best);
    }
    __threadfence();
    uint32_t arrived = atomicAdd(&sampler.argmax_arrivals[row], 1u);
    if (arrived + 1u == gridDim.y) {
        __threadfence();
        unsigned long long key = atomicExch(&sampler.argmax_keys[row], 0ull);
        sampler.argmax_arrivals[row] = 0u;
        glmrt_sample_emit(args, row, glmrt_argmax_token(key));
    }
}

__device__ int32_t glmrt_first_zero_key(const uint32_t *keys, int32_t vocab)
{
    int32_t low = 0;
    int32_t high = vocab;
    while (low < high) {
        int32_t mid = low + (high - low) / 2;
        if (keys[mid] != 0u) {
            low = mid + 1;
        } else {
            high = mid;
        }
    }
    return low;
}

__global__ void __launch_bounds__(GLMRT_SAMPLE_THREADS)
    glmrt_sample_select_kernel(glmrt_cuda_sampler sampler, glmrt_cuda_sample_args args, const uint32_t *sorted_keys,
                               const int32_t *sorted_ids)
{
    glmrt_dependent_enter();
    __shared__ glmrt_sample_shared shared;
    __shared__ unsigned long long warp_keys[GLMRT_SAMPLE_THREADS / 32];
    __shared__ double broadcast_double;
    __shared__ int32_t broadcast_int;
    const int32_t row = blockIdx.x;
    const int32_t vocab = sampler.vocab_size;
    const glmrt_cuda_sample_params p = args.params[row];
    if (p.temperature == 0.0f || !args.needs_sort) {
        const float *source = glmrt_sample_reads_logits(p, args.needs_sort) ? args.logits : sampler.values;
        glmrt_slice_argmax(source + (int64_t)row * vocab, vocab, sampler, row, args, warp_keys);
        return;
    }
    if (blockIdx.y != 0) {
        return;
    }
    const uint32_t *keys = sorted_keys + (int64_t)row * vocab;
    const int32_t *ids = sorted_ids + (int64_t)row * vocab;
    if (threadIdx.x == 0) {
        broadcast_int = glmrt_first_zero_key(keys, vocab);
    }
    __syncthreads();
    int32_t count = broadcast_int;
    __syncthreads();
    if (count == 0) {
        if (threadIdx.x == 0) {
            glmrt_sample_emit(args, row, 0);
        }
        return;
    }
    int32_t length = p.top_k > 0 && p.top_k < count ? p.top_k : count;
    glmrt_weight_term weight;
    weight.keys = keys;
    weight.max_value = (double)glmrt_order_value(keys[0]);
    weight.divisor = 1.0;
    double total = glmrt_block_total(length, weight, &shared, &broadcast_double);
    if (p.top_p < 1.0f) {
        glmrt_weight_term share = weight;
        share.divisor = total;
        int32_t crossing = glmrt_block_first_crossing(length, share, (double)p.top_p, true, &shared, &broadcast_int);
        if (crossing != GLMRT_NO_CROSSING) {
            length = crossing + 1;
        }
        total = glmrt_block_total(length, weight, &shared, &broadcast_double);
    }
    if (p.min_p > 0.0f) {
        double threshold = (double)p.min_p * weight(0);
        if (threadIdx.x == 0) {
            int32_t low = 0;
            int32_t high = length;
            while (low < high) {
                int32_t mid = low + (high - low) / 2;
                if (weight(mid) >= threshold) {
                    low = mid + 1;
                } else {
                    high = mid;
                }
            }
            broadcast_int = low;
        }
        __syncthreads();
        length = broadcast_int;
        __syncthreads();
        total = glmrt_block_total(length, weight, &shared, &broadcast_double);
    }
    double target = p.uniform * total;
    int32_t chosen = glmrt_block_first_crossing(length, weight, target, false, &shared, &broadcast_int);
    if (threadIdx.x == 0) {
        int32_t position = chosen != GLMRT_NO_CROSSING ? chosen : length - 1;
        glmrt_sample_emit(args, row, ids[position]);
    }
}

__global__ void glmrt_sample_offsets_kernel(int32_t *offsets, int32_t rows, int32_t vocab)
{
    for (int32_t i = threadIdx.x; i <= rows; i += blockDim.x) {
        offsets[i] = i * vocab;
    }
}

glmrt_status glmrt_cuda_sampler_sort_bytes(int32_t max_rows, int32_t vocab_size, size_t *out_bytes,
                                           glmrt_error *error)
{
    size_t bytes = 0;
    int64_t items = (int64_t)max_rows * vocab_size;
    if (items > 0x7fffffffLL) {
        return glmrt_error_set(error, GLMRT_ERR_UNSUPPORTED, "sampler rows %d x vocabulary %d exceed the sort limit",
                               max_rows, vocab_size);
    }
    GLMRT_CUDA_TRY(error, (cub::DeviceSegmentedRadixSort::SortPairsDescending(
                              (void *)nullptr, bytes, (const uint32_t *)nullptr, (uint32_t *)nullptr,
                              (const int32_t *)nullptr, (int32_t *)nullptr, (int)items, max_rows,
                              (const int32_t *)nullptr, (const int32_t *)nullptr, 0, 32, (cudaStream_t)0)));
    *out_bytes = bytes;
    return GLMRT_OK;
}

int64_t glmrt_cuda_sampler_bytes(int32_t max_rows, int32_t vocab_size, size_t sort_bytes)
{
    int64_t cells = (int64_t)max_rows * vocab_size;
    return glmrt_cuda_arena_round(cells * 4) * 6 + glmrt_cuda_arena_round(((int64_t)max_rows + 1) * 4) +
           glmrt_cuda_arena_round((int64_t)max_rows * 8) + glmrt_cuda_arena_round((int64_t)max_rows * 4) +
           glmrt_cuda_arena_round((int64_t)sort_bytes);
}

glmrt_status glmrt_cuda_sampler_init(glmrt_cuda_sampler *sampler, cudaStream_t stream, glmrt_error *error)
{
    int64_t cells = (int64_t)sampler->max_rows * sampler->vocab_size;
    GLMRT_CUDA_TRY(error, cudaMemsetAsync(sampler->counts, 0, (size_t)cells * sizeof(int32_t), stream));
    GLMRT_CUDA_TRY(error, cudaMemsetAsync(sampler->argmax_keys, 0, (size_t)sampler->max_rows * sizeof(unsigned long long),
                                          stream));
    GLMRT_CUDA_TRY(error, cudaMemsetAsync(sampler->argmax_arrivals, 0, (size_t)sampler->max_rows * sizeof(uint32_t),
                                          stream));
    glmrt_sample_offsets_kernel<<<1, 256, 0, stream>>>(sampler->row_offsets, sampler->max_rows, sampler->vocab_size);
    GLMRT_CUDA_LAUNCHED(error, "glmrt_sample_offsets_kernel");
    return GLMRT_OK;
}

glmrt_status glmrt_cuda_sample(glmrt_cuda_sampler *sampler, const glmrt_cuda_sample_args *args,
                               cudaStream_t stream, glmrt_error *error)
{
    if (args->num_rows <= 0) {
        return GLMRT_OK;
    }
    if (args->num_rows > sampler->max_rows) {
        return glmrt_error_set(error, GLMRT_ERR_INVARIANT, "%d sample rows exceed the sampler capacity %d",
                               args->num_rows, sampler->max_rows);
    }
    if (!args->logits_only) {
        glmrt_dependent_launch prepare;
        const cudaLaunchConfig_t *prepare_config =
            glmrt_dependent_config(&prepare, args->num_rows, GLMRT_SAMPLE_THREADS, 0, stream);
        GLMRT_CUDA_TRY(error, cudaLaunchKernelEx(prepare_config, glmrt_sample_prepare_kernel, *sampler, *args));
    }
    if (args->needs_sort) {
        size_t bytes = sampler->sort_temp_bytes;
        int items = args->num_rows * sampler->vocab_size;
        GLMRT_CUDA_TRY(error, (cub::DeviceSegmentedRadixSort::SortPairsDescending(
                                  sampler->sort_temp, bytes, (const uint32_t *)sampler->keys_in, sampler->keys_out,
                                  (const int32_t *)sampler->ids_in, sampler->ids_out, items, args->num_rows,
                                  (const int32_t *)sampler->row_offsets, (const int32_t *)sampler->row_offsets + 1, 0,
                                  32, stream)));
    }
    int32_t sms = 0;
    GLMRT_TRY(glmrt_cuda_current_sms(&sms, error));
    int32_t slices = glmrt_ceil_div(2 * sms, args->num_rows);
    slices = slices < 1 ? 1 : (slices > GLMRT_ARGMAX_SLICES ? GLMRT_ARGMAX_SLICES : slices);
    dim3 grid((unsigned)args->num_rows, (unsigned)slices);
    glmrt_dependent_launch select;
    const cudaLaunchConfig_t *select_config = glmrt_dependent_config(&select, grid, GLMRT_SAMPLE_THREADS, 0, stream);
    GLMRT_CUDA_TRY(error, cudaLaunchKernelEx(select_config, glmrt_sample_select_kernel, *sampler, *args,
                                             sampler->keys_out, sampler->ids_out));
    return GLMRT_OK;
}
