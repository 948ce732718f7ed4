#include <string.h>

#include "cuda_check.cuh"
#include "peer_reduce.cuh"
#include "peer_reduce_device.cuh"

typedef struct glmrt_peer_gather_args {
    glmrt_peer_reduce_args link;
    glmrt_cuda_peer_row_gather rows;
    int32_t wide[GLMRT_PEER_GATHER_ARRAYS];
} glmrt_peer_gather_args;

static __host__ __device__ __forceinline__ int64_t glmrt_peer_gather_region(int64_t words)
{
    return (words + 3) / 4 * 4;
}

static __device__ __forceinline__ int64_t glmrt_peer_gather_slice_rows(const glmrt_peer_gather_args &a, int32_t sender)
{
    return glmrt_peer_row_begin(a.rows.num_rows, sender + 1, a.link.num_ranks) -
           glmrt_peer_row_begin(a.rows.num_rows, sender, a.link.num_ranks);
}

template <typename UNIT>
static __device__ __forceinline__ void glmrt_peer_gather_send(const glmrt_peer_gather_args &a, int64_t half,
                                                              const uint32_t *source, int64_t words,
                                                              int64_t inbox_word)
{
    const int64_t per_unit = (int64_t)(sizeof(UNIT) / sizeof(uint32_t));
    const UNIT *from = reinterpret_cast<const UNIT *>(source);
    const glmrt_peer_span part = glmrt_peer_block_part(0, words / per_unit);
    for (int64_t u = part.begin + threadIdx.x; u < part.end; u += blockDim.x) {
        const UNIT value = from[u];
#pragma unroll
        for (int32_t q = 0; q < GLMRT_MAX_DEVICES; ++q) {
            if (q < a.link.num_ranks && q != a.link.rank) {
                reinterpret_cast<UNIT *>(glmrt_peer_inbox<uint32_t>(a.link, q, half, a.link.rank) + inbox_word)[u] =
                    value;
            }
        }
    }
}

template <typename UNIT>
static __device__ __forceinline__ void glmrt_peer_gather_take(const glmrt_peer_gather_args &a, int64_t half,
                                                              int32_t sender, uint32_t *target, int64_t words,
                                                              int64_t inbox_word)
{
    const int64_t per_unit = (int64_t)(sizeof(UNIT) / sizeof(uint32_t));
    const UNIT *inbox = reinterpret_cast<const UNIT *>(glmrt_peer_own_inbox<uint32_t>(a.link, half, sender) + inbox_word);
    UNIT *to = reinterpret_cast<UNIT *>(target);
    const glmrt_peer_span part = glmrt_peer_block_part(0, words / per_unit);
    for (int64_t u = part.begin + threadIdx.x; u < part.end; u += blockDim.x) {
        to[u] = __ldcg(inbox + u);
    }
}

static __device__ void glmrt_peer_gather_send_all(const glmrt_peer_gather_args &a, int64_t half)
{
    const int64_t rows = glmrt_peer_gather_slice_rows(a, a.link.rank);
    const int64_t begin = glmrt_peer_row_begin(a.rows.num_rows, a.link.rank, a.link.num_ranks);
    int64_t inbox_word = 0;
    for (int32_t k = 0; k < a.rows.num_arrays; ++k) {
        const int64_t words = rows * a.rows.words[k];
        const uint32_t *source = a.rows.arrays[k] + begin * a.rows.words[k];
        if (a.wide[k]) {
            glmrt_peer_gather_send<uint4>(a, half, source, words, inbox_word);
        } else {
            glmrt_peer_gather_send<uint32_t>(a, half, source, words, inbox_word);
        }
        inbox_word += glmrt_peer_gather_region(words);
    }
}

static __device__ void glmrt_peer_gather_take_all(const glmrt_peer_gather_args &a, int64_t half, int32_t sender)
{
    const int64_t rows = glmrt_peer_gather_slice_rows(a, sender);
    const int64_t begin = glmrt_peer_row_begin(a.rows.num_rows, sender, a.link.num_ranks);
    int64_t inbox_word = 0;
    for (int32_t k = 0; k < a.rows.num_arrays; ++k) {
        const int64_t words = rows * a.rows.words[k];
        uint32_t *target = a.rows.arrays[k] + begin * a.rows.words[k];
        if (a.wide[k]) {
            glmrt_peer_gather_take<uint4>(a, half, sender, target, words, inbox_word);
        } else {
            glmrt_peer_gather_take<uint32_t>(a, half, sender, target, words, inbox_word);
        }
        inbox_word += glmrt_peer_gather_region(words);
    }
}

__global__ void __launch_bounds__(GLMRT_PEER_REDUCE_THREADS) glmrt_peer_gather_rows_kernel(glmrt_peer_gather_args a)
{
    const unsigned long long epoch = glmrt_peer_next_epoch(a.link);
    const int64_t half = (int64_t)(epoch & 1ull);
    glmrt_peer_gather_send_all(a, half);
    if (glmrt_peer_barrier(a.link, GLMRT_PEER_AFTER_SEND, epoch)) {
        return;
    }
    for (int32_t step = 1; step < a.link.num_ranks; ++step) {
        glmrt_peer_gather_take_all(a, half, glmrt_peer_rotated(a.link, step));
    }
}

glmrt_status glmrt_peer_gather_resident_blocks(int32_t device, int32_t *blocks, glmrt_error *error)
{
    return glmrt_peer_resident_blocks(device, (const void *)glmrt_peer_gather_rows_kernel, blocks, error);
}

void glmrt_cuda_peer_row_gather_clear(glmrt_cuda_peer_row_gather *rows, int32_t num_rows)
{
    memset(rows, 0, sizeof(*rows));
    rows->num_rows = num_rows;
}

void glmrt_cuda_peer_row_gather_add(glmrt_cuda_peer_row_gather *rows, void *array, int32_t words)
{
    if (rows->num_arrays < GLMRT_PEER_GATHER_ARRAYS) {
        rows->arrays[rows->num_arrays] = reinterpret_cast<uint32_t *>(array);
        rows->words[rows->num_arrays] = words;
    }
    rows->num_arrays += 1;
}

static int64_t glmrt_peer_gather_widest_rows(const glmrt_cuda_peer_reduce *peer, int32_t num_rows)
{
    return (int64_t)num_rows - glmrt_peer_row_begin(num_rows, peer->num_ranks - 1, peer->num_ranks);
}

int glmrt_cuda_peer_gather_rows_fits(const glmrt_cuda_peer_reduce *peer, int32_t num_rows, int64_t row_words)
{
    if (peer == nullptr || peer->num_ranks < 2 || peer->memory == nullptr || num_rows < peer->num_ranks ||
        row_words < 1) {
        return 0;
    }
    return glmrt_peer_gather_widest_rows(peer, num_rows) * row_words + 4 * GLMRT_PEER_GATHER_ARRAYS <=
           peer->capacity;
}

static int glmrt_peer_gather_well_formed(const glmrt_cuda_peer_row_gather *rows, int64_t *out_row_words)
{
    *out_row_words = 0;
    if (rows->num_arrays < 1 || rows->num_arrays > GLMRT_PEER_GATHER_ARRAYS) {
        return 0;
    }
    for (int32_t k = 0; k < rows->num_arrays; ++k) {
        if (rows->arrays[k] == nullptr || rows->words[k] < 1 ||
            (rows->words[k] % 4 == 0 && (uintptr_t)rows->arrays[k] % sizeof(uint4) != 0)) {
            return 0;
        }
        *out_row_words += rows->words[k];
    }
    return 1;
}

glmrt_status glmrt_cuda_peer_gather_rows(const glmrt_cuda_peer_reduce *peer, const glmrt_cuda_peer_row_gather *rows,
                                         cudaStream_t stream, glmrt_error *error)
{
    int64_t words = 0;
    if (!glmrt_peer_gather_well_formed(rows, &words) || !glmrt_cuda_peer_gather_rows_fits(peer, rows->num_rows, words)) {
        return glmrt_error_set(error, GLMRT_ERR_INVARIANT,
                               "the peer row gather holds %lld words a GPU and moves rows of four words from 16-byte aligned "
                               "arrays, asked for %d rows of %lld words in %d arrays over %d GPUs",
                               (long long)(peer == nullptr ? 0 : peer->capacity), rows->num_rows, (long long)words,
                               rows->num_arrays, peer == nullptr ? 0 : peer->num_ranks);
    }
    glmrt_peer_gather_args args;
    memset(&args, 0, sizeof(args));
    glmrt_peer_link_args(peer, &args.link);
    args.rows = *rows;
    for (int32_t k = 0; k < rows->num_arrays; ++k) {
        args.wide[k] = rows->words[k] % 4 == 0;
    }
    glmrt_peer_gather_rows_kernel<<<peer->blocks, GLMRT_PEER_REDUCE_THREADS, 0, stream>>>(args);
    return glmrt_peer_launched("the peer row gather", (int64_t)rows->num_rows * words, error);
}
