#include "cuda_check.cuh"
#include "peer_reduce.cuh"
#include "peer_reduce_device.cuh"

typedef struct glmrt_peer_gather_args {
    glmrt_peer_reduce_args link;
    glmrt_cuda_peer_row_gather rows;
} glmrt_peer_gather_args;

static __device__ __forceinline__ int32_t glmrt_peer_gather_row_words(const glmrt_cuda_peer_row_gather &rows)
{
    return rows.first_words + rows.second_words;
}

static __device__ __forceinline__ uint32_t *glmrt_peer_gather_word(const glmrt_cuda_peer_row_gather &rows, int32_t row,
                                                                   int32_t column)
{
    if (column < rows.first_words) {
        return rows.first + (int64_t)row * rows.first_words + column;
    }
    return rows.second + (int64_t)row * rows.second_words + (column - rows.first_words);
}

static __device__ __forceinline__ glmrt_peer_span glmrt_peer_gather_part(const glmrt_peer_gather_args &a,
                                                                          int32_t sender)
{
    const int32_t begin = glmrt_peer_row_begin(a.rows.num_rows, sender, a.link.num_ranks);
    const int32_t end = glmrt_peer_row_begin(a.rows.num_rows, sender + 1, a.link.num_ranks);
    return glmrt_peer_block_part(0, (int64_t)(end - begin) * glmrt_peer_gather_row_words(a.rows));
}

__global__ void __launch_bounds__(GLMRT_PEER_REDUCE_THREADS) glmrt_peer_gather_rows_kernel(glmrt_peer_gather_args a)
{
    const unsigned long long epoch = glmrt_peer_next_epoch(a.link);
    const int64_t half = (int64_t)(epoch & 1ull);
    const int32_t words = glmrt_peer_gather_row_words(a.rows);
    const int32_t own_begin = glmrt_peer_row_begin(a.rows.num_rows, a.link.rank, a.link.num_ranks);
    const glmrt_peer_span own = glmrt_peer_gather_part(a, a.link.rank);
    for (int64_t w = own.begin + threadIdx.x; w < own.end; w += blockDim.x) {
        const uint32_t value = *glmrt_peer_gather_word(a.rows, own_begin + (int32_t)(w / words), (int32_t)(w % words));
        glmrt_peer_send_to_others(a.link, half, w, value);
    }
    if (glmrt_peer_barrier(a.link, GLMRT_PEER_AFTER_SEND, epoch)) {
        return;
    }
    for (int32_t step = 1; step < a.link.num_ranks; ++step) {
        const int32_t sender = glmrt_peer_rotated(a.link, step);
        const int32_t begin = glmrt_peer_row_begin(a.rows.num_rows, sender, a.link.num_ranks);
        const glmrt_peer_span part = glmrt_peer_gather_part(a, sender);
        const uint32_t *inbox = glmrt_peer_own_inbox<uint32_t>(a.link, half, sender);
        for (int64_t w = part.begin + threadIdx.x; w < part.end; w += blockDim.x) {
            *glmrt_peer_gather_word(a.rows, begin + (int32_t)(w / words), (int32_t)(w % words)) = __ldcg(inbox + w);
        }
    }
}

int glmrt_cuda_peer_gather_rows_fits(const glmrt_cuda_peer_reduce *peer, int32_t num_rows, int32_t row_words)
{
    if (peer == nullptr || peer->num_ranks < 2 || peer->memory == nullptr || num_rows < peer->num_ranks ||
        row_words < 1) {
        return 0;
    }
    const int64_t widest = (int64_t)num_rows - glmrt_peer_row_begin(num_rows, peer->num_ranks - 1, peer->num_ranks);
    return widest * row_words <= peer->capacity;
}

glmrt_status glmrt_cuda_peer_gather_rows(const glmrt_cuda_peer_reduce *peer, const glmrt_cuda_peer_row_gather *rows,
                                         cudaStream_t stream, glmrt_error *error)
{
    const int32_t words = rows->first_words + rows->second_words;
    if (rows->first_words < 1 || rows->second_words < 0 || (rows->second_words > 0 && rows->second == nullptr) ||
        rows->first == nullptr || !glmrt_cuda_peer_gather_rows_fits(peer, rows->num_rows, words)) {
        return glmrt_error_set(error, GLMRT_ERR_INVARIANT,
                               "the peer row gather holds %lld words a GPU, asked for %d rows of %d words over %d GPUs",
                               (long long)(peer == nullptr ? 0 : peer->capacity), rows->num_rows, words,
                               peer == nullptr ? 0 : peer->num_ranks);
    }
    glmrt_peer_gather_args args;
    glmrt_peer_link_args(peer, &args.link);
    args.rows = *rows;
    glmrt_peer_gather_rows_kernel<<<peer->blocks, GLMRT_PEER_REDUCE_THREADS, 0, stream>>>(args);
    return glmrt_peer_launched("the peer row gather", (int64_t)rows->num_rows * words, error);
}
