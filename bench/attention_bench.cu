#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <algorithm>
#include <random>
#include <vector>

#include "attention.cuh"
#include "bench_fill.cuh"
#include "step_inputs.cuh"

#define GLMRT_BENCH_HEAD_DIM 128
#define GLMRT_BENCH_KV_HEADS 8
#define GLMRT_BENCH_GROUP 12
#define GLMRT_BENCH_PAGE_SIZE 16

typedef struct glmrt_bench_case {
    const char *kind;
    int32_t batch;
    int32_t context;
    int32_t chunk;
    int32_t prefill_path;
    int32_t decode_path;
} glmrt_bench_case;

typedef struct glmrt_bench_batch {
    std::vector<int32_t> token_ids;
    std::vector<int32_t> positions;
    std::vector<int32_t> token_seq;
    std::vector<int32_t> seq_token_start;
    std::vector<int32_t> seq_num_tokens;
    std::vector<int32_t> seq_context_len;
    std::vector<int32_t> seq_num_pages;
    std::vector<std::vector<int32_t>> tables;
    std::vector<const int32_t *> table_ptrs;
    glmrt_step_batch batch;
} glmrt_bench_batch;

__global__ void glmrt_bench_fill_bf16(uint16_t *data, int64_t count, uint32_t seed)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += (int64_t)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)i * 2654435761u ^ seed;
        h ^= h >> 15;
        h *= 2246822519u;
        h ^= h >> 13;
        data[i] = (uint16_t)(0x3e00u | (h & 0x80ffu));
    }
}

static int glmrt_bench_ok(cudaError_t result, const char *what)
{
    if (result != cudaSuccess) {
        printf("error %s: %s\n", what, cudaGetErrorString(result));
        return 0;
    }
    return 1;
}

static void glmrt_bench_batch_build(glmrt_bench_batch *b, const glmrt_bench_case *c, int32_t num_pages,
                                    std::mt19937 *rng)
{
    std::vector<int32_t> pages(num_pages);
    for (int32_t i = 0; i < num_pages; ++i) pages[i] = i;
    std::shuffle(pages.begin(), pages.end(), *rng);
    int32_t next = 0;
    int32_t count = c->chunk > 0 ? c->chunk : 1;
    b->tables.resize(c->batch);
    for (int32_t s = 0; s < c->batch; ++s) {
        int32_t first = c->context - count;
        int32_t page_count = (c->context + GLMRT_BENCH_PAGE_SIZE - 1) / GLMRT_BENCH_PAGE_SIZE;
        for (int32_t p = 0; p < page_count; ++p) b->tables[s].push_back(pages[next++]);
        b->seq_token_start.push_back((int32_t)b->positions.size());
        b->seq_num_tokens.push_back(count);
        b->seq_context_len.push_back(c->context);
        b->seq_num_pages.push_back(page_count);
        for (int32_t t = 0; t < count; ++t) {
            b->token_ids.push_back(1);
            b->positions.push_back(first + t);
            b->token_seq.push_back(s);
        }
    }
    for (int32_t s = 0; s < c->batch; ++s) b->table_ptrs.push_back(b->tables[s].data());
    glmrt_step_batch *batch = &b->batch;
    memset(batch, 0, sizeof(*batch));
    batch->num_tokens = (int32_t)b->positions.size();
    batch->token_ids = b->token_ids.data();
    batch->positions = b->positions.data();
    batch->token_seq = b->token_seq.data();
    batch->num_seqs = c->batch;
    batch->seq_token_start = b->seq_token_start.data();
    batch->seq_num_tokens = b->seq_num_tokens.data();
    batch->seq_context_len = b->seq_context_len.data();
    batch->seq_page_tables = b->table_ptrs.data();
    batch->seq_num_pages = b->seq_num_pages.data();
}

static double glmrt_bench_visible_pairs(const glmrt_bench_case *c)
{
    int32_t count = c->chunk > 0 ? c->chunk : 1;
    double pairs = 0.0;
    for (int32_t t = 0; t < count; ++t) pairs += (double)(c->context - count + t + 1);
    return pairs * c->batch;
}

static int glmrt_bench_run(const glmrt_bench_case *c, uint16_t *kv_cache, int32_t num_pages, float *q, float *out,
                           float *partial_out, float *partial_stats, int32_t iterations)
{
    std::mt19937 rng(1234u + (uint32_t)c->batch * 31u + (uint32_t)c->context);
    glmrt_bench_batch b;
    glmrt_bench_batch_build(&b, c, num_pages, &rng);
    const int32_t num_heads = GLMRT_BENCH_KV_HEADS * GLMRT_BENCH_GROUP;
    const int32_t tokens = b.batch.num_tokens;
    glmrt_cuda_step_capacity capacity;
    memset(&capacity, 0, sizeof(capacity));
    capacity.max_tokens = tokens;
    capacity.max_seqs = c->batch;
    capacity.max_samples = c->batch;
    capacity.max_pages = (int64_t)num_pages + c->batch;
    capacity.max_history = 16;
    capacity.max_partials = GLMRT_ATTENTION_MAX_SPLITS * c->batch;
    capacity.max_decode_items = c->batch + capacity.max_partials;
    capacity.prefill_tokens_per_item = glmrt_cuda_attention_prefill_tokens(GLMRT_BENCH_HEAD_DIM);
    capacity.max_prefill_items = tokens / capacity.prefill_tokens_per_item + c->batch + 1;
    capacity.max_merges = c->batch;
    glmrt_cuda_split_policy policy = {GLMRT_ATTENTION_KEYS_PER_SPLIT, GLMRT_ATTENTION_MAX_SPLITS, GLMRT_BENCH_GROUP};
    std::vector<uint8_t> packed((size_t)glmrt_cuda_step_capacity_bytes(&capacity));
    glmrt_cuda_step_counts counts;
    glmrt_error error;
    glmrt_error_clear(&error);
    if (glmrt_cuda_step_pack(&b.batch, &capacity, &policy, GLMRT_BENCH_PAGE_SIZE, num_pages, packed.data(), &counts,
                             &error) != GLMRT_OK) {
        printf("error pack: %s\n", error.message);
        return 0;
    }
    uint8_t *d_packed = nullptr;
    if (!glmrt_bench_ok(cudaMalloc((void **)&d_packed, (size_t)counts.bytes), "cudaMalloc step") ||
        !glmrt_bench_ok(cudaMemcpy(d_packed, packed.data(), (size_t)counts.bytes, cudaMemcpyHostToDevice), "copy step")) {
        return 0;
    }
    glmrt_cuda_step_view view;
    glmrt_cuda_step_view_at(&counts, d_packed, &view);
    glmrt_cuda_attention_args args;
    memset(&args, 0, sizeof(args));
    args.q = q;
    args.q_stride = (int64_t)(num_heads + 2 * GLMRT_BENCH_KV_HEADS) * GLMRT_BENCH_HEAD_DIM;
    args.positions = view.positions;
    args.page_ids = view.page_ids;
    args.kv.base = kv_cache;
    args.kv.page_size = GLMRT_BENCH_PAGE_SIZE;
    args.kv.num_kv_heads = GLMRT_BENCH_KV_HEADS;
    args.kv.head_dim = GLMRT_BENCH_HEAD_DIM;
    args.kv.head_elements = (int64_t)GLMRT_BENCH_PAGE_SIZE * GLMRT_BENCH_HEAD_DIM;
    args.kv.page_elements = 2 * (int64_t)GLMRT_BENCH_KV_HEADS * args.kv.head_elements;
    args.kv.layer_elements = args.kv.page_elements * num_pages;
    args.layer = 0;
    args.group = GLMRT_BENCH_GROUP;
    args.scale = 1.0f / sqrtf((float)GLMRT_BENCH_HEAD_DIM);
    args.out = out;
    args.out_stride = (int64_t)num_heads * GLMRT_BENCH_HEAD_DIM;
    args.partial_out = partial_out;
    args.partial_stats = partial_stats;
    args.prefill_path = c->prefill_path;
    args.decode_path = c->decode_path;
    const int decode = c->chunk == 0;
    args.items = decode ? view.decode_items : view.prefill_items;
    args.num_items = decode ? counts.num_decode_items : counts.num_prefill_items;
    const int32_t tokens_per_item = decode ? 1 : capacity.prefill_tokens_per_item;
    glmrt_cuda_attention_merge_args merge;
    memset(&merge, 0, sizeof(merge));
    merge.merges = view.merges;
    merge.num_merges = counts.num_merges;
    merge.group = GLMRT_BENCH_GROUP;
    merge.num_kv_heads = GLMRT_BENCH_KV_HEADS;
    merge.head_dim = GLMRT_BENCH_HEAD_DIM;
    merge.partial_out = partial_out;
    merge.partial_stats = partial_stats;
    merge.out = out;
    merge.out_stride = args.out_stride;
    cudaEvent_t start, stop;
    cudaEventCreate(&start);
    cudaEventCreate(&stop);
    float ms = 0.0f;
    int ok = 1;
    for (int32_t i = -3; i < iterations && ok; ++i) {
        if (i == 0) cudaEventRecord(start, 0);
        ok = glmrt_cuda_attention_run(&args, tokens_per_item, 0, &error) == GLMRT_OK;
        if (ok && decode) {
            ok = glmrt_cuda_attention_merge_run(&merge, 0, &error) == GLMRT_OK;
        }
    }
    cudaEventRecord(stop, 0);
    ok = ok && glmrt_bench_ok(cudaEventSynchronize(stop), "kernels");
    if (!ok && error.message[0] != 0) printf("error run: %s\n", error.message);
    cudaEventElapsedTime(&ms, start, stop);
    double us = ok ? 1000.0 * ms / iterations : 0.0;
    double kv_bytes = (double)c->batch * c->context * GLMRT_BENCH_KV_HEADS * 2.0 * GLMRT_BENCH_HEAD_DIM * 2.0;
    double flops = 4.0 * num_heads * GLMRT_BENCH_HEAD_DIM * glmrt_bench_visible_pairs(c);
    printf("{\"kind\": \"%s\", \"batch\": %d, \"context\": %d, \"chunk\": %d, \"us\": %.3f, \"kv_bytes\": %.0f, "
           "\"flops\": %.0f, \"items\": %d, \"merges\": %d, \"ok\": %d}\n",
           c->kind, c->batch, c->context, c->chunk, us, kv_bytes, flops, args.num_items, counts.num_merges, ok);
    fflush(stdout);
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    cudaFree(d_packed);
    return ok;
}

int main(void)
{
    const glmrt_bench_case cases[] = {
        {"decode", 64, 1024, 0, GLMRT_ATTENTION_PREFILL_AUTO, GLMRT_ATTENTION_DECODE_AUTO},
        {"decode", 256, 1024, 0, GLMRT_ATTENTION_PREFILL_AUTO, GLMRT_ATTENTION_DECODE_AUTO},
        {"decode", 8, 8192, 0, GLMRT_ATTENTION_PREFILL_AUTO, GLMRT_ATTENTION_DECODE_AUTO},
        {"decode", 1, 32768, 0, GLMRT_ATTENTION_PREFILL_AUTO, GLMRT_ATTENTION_DECODE_AUTO},
        {"decode", 1, 1024, 0, GLMRT_ATTENTION_PREFILL_AUTO, GLMRT_ATTENTION_DECODE_AUTO},
        {"decode one block an item", 1, 1024, 0, GLMRT_ATTENTION_PREFILL_AUTO, GLMRT_ATTENTION_DECODE_BLOCK},
        {"decode spread over a cluster", 1, 1024, 0, GLMRT_ATTENTION_PREFILL_AUTO, GLMRT_ATTENTION_DECODE_SPREAD},
        {"decode spread over a cluster", 1, 32768, 0, GLMRT_ATTENTION_PREFILL_AUTO, GLMRT_ATTENTION_DECODE_SPREAD},
        {"prefill", 1, 2048, 2048, GLMRT_ATTENTION_PREFILL_AUTO, GLMRT_ATTENTION_DECODE_AUTO},
        {"prefill", 1, 8192, 2048, GLMRT_ATTENTION_PREFILL_AUTO, GLMRT_ATTENTION_DECODE_AUTO},
        {"prefill mma.sync", 1, 2048, 2048, GLMRT_ATTENTION_PREFILL_MMA, GLMRT_ATTENTION_DECODE_AUTO},
        {"prefill mma.sync", 1, 8192, 2048, GLMRT_ATTENTION_PREFILL_MMA, GLMRT_ATTENTION_DECODE_AUTO},
    };
    const int32_t num_pages = 256 * 1024 / GLMRT_BENCH_PAGE_SIZE + 64;
    const int32_t num_heads = GLMRT_BENCH_KV_HEADS * GLMRT_BENCH_GROUP;
    const int64_t kv_elements = (int64_t)num_pages * 2 * GLMRT_BENCH_KV_HEADS * GLMRT_BENCH_PAGE_SIZE * GLMRT_BENCH_HEAD_DIM;
    const int64_t max_tokens = 2048;
    const int64_t q_elements = max_tokens * (num_heads + 2 * GLMRT_BENCH_KV_HEADS) * GLMRT_BENCH_HEAD_DIM;
    const int64_t partials = (int64_t)GLMRT_ATTENTION_MAX_SPLITS * 256;
    uint16_t *kv_cache = nullptr;
    float *q = nullptr;
    float *out = nullptr;
    float *partial_out = nullptr;
    float *partial_stats = nullptr;
    if (!glmrt_bench_ok(cudaMalloc((void **)&kv_cache, (size_t)kv_elements * 2), "cudaMalloc kv") ||
        !glmrt_bench_ok(cudaMalloc((void **)&q, (size_t)q_elements * 4), "cudaMalloc q") ||
        !glmrt_bench_ok(cudaMalloc((void **)&out, (size_t)max_tokens * num_heads * GLMRT_BENCH_HEAD_DIM * 4), "cudaMalloc out") ||
        !glmrt_bench_ok(cudaMalloc((void **)&partial_out, (size_t)partials * num_heads * GLMRT_BENCH_HEAD_DIM * 4), "cudaMalloc partials") ||
        !glmrt_bench_ok(cudaMalloc((void **)&partial_stats, (size_t)partials * num_heads * 2 * 4), "cudaMalloc stats")) {
        return 1;
    }
    glmrt_bench_fill_bf16<<<1024, 256>>>(kv_cache, kv_elements, 17u);
    glmrt_bench_fill_floats<<<1024, 256>>>(q, q_elements, 29u, 0.0f, 4.0f);
    if (!glmrt_bench_ok(cudaDeviceSynchronize(), "fill")) return 1;
    glmrt_error error;
    glmrt_error_clear(&error);
    if (glmrt_cuda_attention_prepare(GLMRT_BENCH_HEAD_DIM, GLMRT_BENCH_GROUP, &error) != GLMRT_OK) {
        printf("error prepare: %s\n", error.message);
        return 1;
    }
    int failures = 0;
    for (const glmrt_bench_case &c : cases) {
        failures += !glmrt_bench_run(&c, kv_cache, num_pages, q, out, partial_out, partial_stats, c.chunk > 0 ? 10 : 20);
    }
    cudaFree(kv_cache);
    cudaFree(q);
    cudaFree(out);
    cudaFree(partial_out);
    cudaFree(partial_stats);
    return failures == 0 ? 0 : 1;
}
