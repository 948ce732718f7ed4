#include <string.h>

#include "cuda_check.cuh"
#include "dependent_launch.cuh"
#include "device_math.cuh"
#include "ops.cuh"
#include "step_inputs.cuh"

extern "C" {
#include "sampling.h"
}

#define GLMRT_STEP_ALIGN 16

typedef struct glmrt_step_offsets {
    int64_t device_counts;
    int64_t token_ids;
    int64_t positions;
    int64_t token_seq;
    int64_t seq_page_begin;
    int64_t sample_rows;
    int64_t sample_params;
    int64_t merges;
    int64_t decode_items;
    int64_t prefill_items;
    int64_t page_ids;
    int64_t history;
    int64_t end;
} glmrt_step_offsets;

static int64_t glmrt_step_section(int64_t *cursor, int64_t bytes)
{
    int64_t at = *cursor;
    *cursor += (bytes + GLMRT_STEP_ALIGN - 1) / GLMRT_STEP_ALIGN * GLMRT_STEP_ALIGN;
    return at;
}

static glmrt_step_offsets glmrt_step_layout(const glmrt_cuda_step_sections *n)
{
    glmrt_step_offsets o;
    int64_t cursor = 0;
    o.device_counts = glmrt_step_section(&cursor, (int64_t)sizeof(glmrt_cuda_step_device_counts));
    o.token_ids = glmrt_step_section(&cursor, (int64_t)n->tokens * 4);
    o.positions = glmrt_step_section(&cursor, (int64_t)n->tokens * 4);
    o.token_seq = glmrt_step_section(&cursor, (int64_t)n->tokens * 4);
    o.seq_page_begin = glmrt_step_section(&cursor, (int64_t)n->seqs * 4);
    o.sample_rows = glmrt_step_section(&cursor, (int64_t)n->samples * 4);
    o.sample_params = glmrt_step_section(&cursor, (int64_t)n->samples * (int64_t)sizeof(glmrt_cuda_sample_params));
    o.merges = glmrt_step_section(&cursor, (int64_t)n->merges * (int64_t)sizeof(glmrt_cuda_attention_merge));
    o.decode_items = glmrt_step_section(&cursor, (int64_t)n->decode_items * (int64_t)sizeof(glmrt_cuda_attention_item));
    o.prefill_items =
        glmrt_step_section(&cursor, (int64_t)n->prefill_items * (int64_t)sizeof(glmrt_cuda_attention_item));
    o.page_ids = glmrt_step_section(&cursor, n->pages * 4);
    o.history = glmrt_step_section(&cursor, n->history * 4);
    o.end = cursor;
    return o;
}

static glmrt_cuda_step_sections glmrt_step_capacity_sections(const glmrt_cuda_step_capacity *capacity)
{
    glmrt_cuda_step_sections n;
    n.tokens = capacity->max_tokens;
    n.seqs = capacity->max_seqs;
    n.samples = capacity->max_samples;
    n.decode_items = capacity->max_decode_items;
    n.prefill_items = capacity->max_prefill_items;
    n.merges = capacity->max_merges;
    n.pages = capacity->max_pages;
    n.history = capacity->max_history;
    return n;
}

int64_t glmrt_cuda_step_capacity_bytes(const glmrt_cuda_step_capacity *capacity)
{
    glmrt_cuda_step_sections n = glmrt_step_capacity_sections(capacity);
    return glmrt_step_layout(&n).end;
}

int32_t glmrt_cuda_step_bucket_items(const glmrt_cuda_step_capacity *capacity, int32_t bucket)
{
    int64_t items = (int64_t)bucket * GLMRT_ATTENTION_MAX_SPLITS;
    return items < capacity->max_decode_items ? (int32_t)items : capacity->max_decode_items;
}

static glmrt_cuda_step_sections glmrt_step_bucket_sections(const glmrt_cuda_step_capacity *capacity, int32_t bucket)
{
    glmrt_cuda_step_sections n = glmrt_step_capacity_sections(capacity);
    n.tokens = bucket;
    n.seqs = bucket;
    n.samples = bucket;
    n.decode_items = glmrt_cuda_step_bucket_items(capacity, bucket);
    n.prefill_items = 0;
    n.merges = bucket;
    return n;
}

glmrt_status glmrt_cuda_step_bucket_counts(const glmrt_cuda_step_capacity *capacity, int32_t bucket,
                                           glmrt_cuda_step_counts *c, glmrt_error *error)
{
    memset(c, 0, sizeof(*c));
    if (bucket < 1 || bucket > capacity->max_tokens || bucket > capacity->max_seqs || bucket > capacity->max_merges ||
        bucket > capacity->max_samples) {
        return glmrt_error_set(error, GLMRT_ERR_INVARIANT,
                               "decode bucket of %d rows is outside the plan of %d tokens and %d sequences", bucket,
                               capacity->max_tokens, capacity->max_seqs);
    }
    c->bucket = bucket;
    c->layout = glmrt_step_bucket_sections(capacity, bucket);
    c->num_tokens = bucket;
    c->num_seqs = bucket;
    c->num_samples = bucket;
    c->num_decode_items = c->layout.decode_items;
    c->num_merges = bucket;
    c->bytes = glmrt_step_layout(&c->layout).end;
    return GLMRT_OK;
}

void glmrt_cuda_step_view_at(const glmrt_cuda_step_counts *counts, uint8_t *base, glmrt_cuda_step_view *view)
{
    glmrt_step_offsets o = glmrt_step_layout(&counts->layout);
    view->device_counts = (glmrt_cuda_step_device_counts *)(base + o.device_counts);
    view->token_ids = (int32_t *)(base + o.token_ids);
    view->positions = (int32_t *)(base + o.positions);
    view->token_seq = (int32_t *)(base + o.token_seq);
    view->seq_page_begin = (int32_t *)(base + o.seq_page_begin);
    view->page_ids = (int32_t *)(base + o.page_ids);
    view->sample_rows = (int32_t *)(base + o.sample_rows);
    view->sample_params = (glmrt_cuda_sample_params *)(base + o.sample_params);
    view->history = (int32_t *)(base + o.history);
    view->decode_items = (glmrt_cuda_attention_item *)(base + o.decode_items);
    view->prefill_items = (glmrt_cuda_attention_item *)(base + o.prefill_items);
    view->merges = (glmrt_cuda_attention_merge *)(base + o.merges);
}

static int32_t glmrt_seq_context(const glmrt_step_batch *batch, int32_t s)
{
    return batch->positions[batch->seq_token_start[s] + batch->seq_num_tokens[s] - 1] + 1;
}

typedef struct glmrt_item_writer {
    glmrt_cuda_attention_item *decode;
    glmrt_cuda_attention_item *prefill;
    glmrt_cuda_attention_merge *merges;
    const glmrt_cuda_split_policy *policy;
    const int32_t *seq_page_begin;
    int32_t num_decode;
    int32_t num_prefill;
    int32_t num_merges;
    int32_t num_partials;
} glmrt_item_writer;

static int32_t glmrt_item_page_begin(const glmrt_item_writer *w, int32_t seq)
{
    return w->seq_page_begin != nullptr ? w->seq_page_begin[seq] : 0;
}

static void glmrt_item_put(const glmrt_item_writer *w, glmrt_cuda_attention_item *items, int32_t index,
                           const glmrt_cuda_attention_item *item)
{
    if (items == nullptr) {
        return;
    }
    items[index] = *item;
    items[index].split_keys = w->policy->keys_per_split;
    items[index].max_splits = w->policy->max_splits;
}

static void glmrt_items_for_decode(int32_t seq, int32_t token, int32_t context, glmrt_item_writer *w)
{
    const glmrt_cuda_split_policy *policy = w->policy;
    int32_t span = glmrt_attention_split_span(context, policy->keys_per_split, policy->max_splits);
    int32_t splits = glmrt_ceil_div(context, span);
    glmrt_cuda_attention_item item;
    memset(&item, 0, sizeof(item));
    item.seq = seq;
    item.page_begin = glmrt_item_page_begin(w, seq);
    item.token_begin = token;
    item.num_tokens = 1;
    item.partial = -1;
    if (splits <= 1) {
        item.key_end = context;
        glmrt_item_put(w, w->decode, w->num_decode++, &item);
        return;
    }
    int32_t partial_begin = w->num_partials;
    for (int32_t split = 0; split < splits; ++split) {
        item.key_begin = split * span;
        item.key_end = item.key_begin + span < context ? item.key_begin + span : context;
        item.partial = w->num_partials++;
        glmrt_item_put(w, w->decode, w->num_decode++, &item);
    }
    if (w->merges != nullptr) {
        glmrt_cuda_attention_merge *merge = &w->merges[w->num_merges];
        merge->token = token;
        merge->partial_begin = partial_begin;
        merge->num_splits = splits;
        merge->reserved = 0;
    }
    w->num_merges += 1;
}

static void glmrt_items_for_prefill(const glmrt_step_batch *batch, int32_t seq, glmrt_item_writer *w)
{
    int32_t start = batch->seq_token_start[seq];
    int32_t count = batch->seq_num_tokens[seq];
    int32_t group = w->policy->group;
    int32_t rows = count * group;
    glmrt_cuda_attention_item item;
    memset(&item, 0, sizeof(item));
    item.seq = seq;
    item.page_begin = glmrt_item_page_begin(w, seq);
    item.token_begin = start;
    item.num_tokens = count;
    item.partial = -1;
    for (int32_t row = 0; row < rows; row += GLMRT_ATTENTION_PREFILL_ROWS) {
        int32_t end_row = row + GLMRT_ATTENTION_PREFILL_ROWS < rows ? row + GLMRT_ATTENTION_PREFILL_ROWS : rows;
        int32_t keys = 0;
        for (int32_t t = row / group; t <= (end_row - 1) / group; ++t) {
            int32_t token_keys = batch->positions[start + t] + 1;
            keys = token_keys > keys ? token_keys : keys;
        }
        item.row_begin = row;
        item.key_end = keys;
        glmrt_item_put(w, w->prefill, w->num_prefill++, &item);
    }
}

static void glmrt_items_build(const glmrt_step_batch *batch, glmrt_item_writer *w)
{
    for (int32_t s = 0; s < batch->num_seqs; ++s) {
        if (batch->seq_num_tokens[s] == 1) {
            glmrt_items_for_decode(s, batch->seq_token_start[s], glmrt_seq_context(batch, s), w);
        } else {
            glmrt_items_for_prefill(batch, s, w);
        }
    }
}

static glmrt_status glmrt_split_policy_check(const glmrt_cuda_split_policy *policy, glmrt_error *error)
{
    if (policy->keys_per_split < GLMRT_ATTENTION_KEY_TILE || policy->keys_per_split % GLMRT_ATTENTION_KEY_TILE != 0 ||
        policy->max_splits < 1 || policy->group < 1 || policy->group > GLMRT_ATTENTION_MAX_GROUP) {
        return glmrt_error_set(error, GLMRT_ERR_INVARIANT,
                               "attention split policy of %d keys, %d splits, group %d: keys must be a multiple of %d, "
                               "splits at least 1, group 1 to %d",
                               policy->keys_per_split, policy->max_splits, policy->group, GLMRT_ATTENTION_KEY_TILE,
                               GLMRT_ATTENTION_MAX_GROUP);
    }
    return GLMRT_OK;
}

static glmrt_status glmrt_step_count(const glmrt_step_batch *batch, const glmrt_cuda_step_capacity *capacity,
                                     const glmrt_cuda_split_policy *policy, int32_t page_size,
                                     glmrt_cuda_step_counts *c, glmrt_error *error)
{
    memset(c, 0, sizeof(*c));
    c->num_tokens = batch->num_tokens;
    c->num_seqs = batch->num_seqs;
    c->num_samples = batch->num_samples;
    if (c->num_tokens > capacity->max_tokens || c->num_seqs > capacity->max_seqs ||
        c->num_samples > capacity->max_samples) {
        return glmrt_error_set(error, GLMRT_ERR_INVALID_ARGUMENT,
                               "step of %d tokens, %d sequences, %d samples exceeds the CUDA plan of %d, %d, %d",
                               c->num_tokens, c->num_seqs, c->num_samples, capacity->max_tokens, capacity->max_seqs,
                               capacity->max_samples);
    }
    for (int32_t s = 0; s < batch->num_seqs; ++s) {
        int32_t context = glmrt_seq_context(batch, s);
        int32_t pages = glmrt_ceil_div(context, page_size);
        c->num_pages += pages;
    }
    for (int32_t i = 0; i < batch->num_samples; ++i) {
        const glmrt_step_sample *sample = &batch->samples[i];
        if (sample->params->temperature != 0.0f) {
            c->needs_sort = 1;
        }
        if (glmrt_sampling_params_use_history(sample->params)) {
            c->num_history += sample->num_history;
        }
    }
    if (c->num_pages > capacity->max_pages || c->num_history > capacity->max_history) {
        return glmrt_error_set(error, GLMRT_ERR_INVARIANT, "step needs %lld page ids and %lld history tokens, plan has %lld and %lld",
                               (long long)c->num_pages, (long long)c->num_history, (long long)capacity->max_pages,
                               (long long)capacity->max_history);
    }
    GLMRT_TRY(glmrt_split_policy_check(policy, error));
    glmrt_item_writer counter;
    memset(&counter, 0, sizeof(counter));
    counter.policy = policy;
    glmrt_items_build(batch, &counter);
    if (counter.num_decode > capacity->max_decode_items || counter.num_prefill > capacity->max_prefill_items ||
        counter.num_merges > capacity->max_merges || counter.num_partials > capacity->max_partials) {
        return glmrt_error_set(error, GLMRT_ERR_INVARIANT, "attention work of %d decode and %d prefill items exceeds the plan",
                               counter.num_decode, counter.num_prefill);
    }
    c->num_decode_items = counter.num_decode;
    c->num_prefill_items = counter.num_prefill;
    c->num_merges = counter.num_merges;
    c->num_partials = counter.num_partials;
    c->layout.tokens = c->num_tokens;
    c->layout.seqs = c->num_seqs;
    c->layout.samples = c->num_samples;
    c->layout.decode_items = c->num_decode_items;
    c->layout.prefill_items = c->num_prefill_items;
    c->layout.merges = c->num_merges;
    c->layout.pages = c->num_pages;
    c->layout.history = c->num_history;
    c->bytes = glmrt_step_layout(&c->layout).end;
    return GLMRT_OK;
}

static glmrt_status glmrt_step_fit_bucket(const glmrt_cuda_step_capacity *capacity, int32_t bucket,
                                          glmrt_cuda_step_counts *c, glmrt_error *error)
{
    int32_t pads = bucket - c->num_tokens;
    if (pads < 0 || c->num_samples != c->num_tokens || c->num_prefill_items != 0 ||
        c->num_decode_items + pads > glmrt_cuda_step_bucket_items(capacity, bucket) ||
        c->num_pages + 1 > capacity->max_pages) {
        return glmrt_error_set(error, GLMRT_ERR_INVARIANT,
                               "step of %d tokens, %d samples, %d attention items and %lld page ids does not fit the decode bucket of %d",
                               c->num_tokens, c->num_samples, c->num_decode_items, (long long)c->num_pages, bucket);
    }
    c->bucket = bucket;
    c->layout = glmrt_step_bucket_sections(capacity, bucket);
    glmrt_step_offsets o = glmrt_step_layout(&c->layout);
    c->bytes = o.page_ids + (c->num_pages + 1) * 4;
    c->history_offset = o.history;
    c->history_bytes = c->num_history * 4;
    return GLMRT_OK;
}

int32_t glmrt_cuda_step_device_decode_items(const glmrt_cuda_step_counts *counts)
{
    const int32_t pads = counts->bucket > counts->num_tokens ? counts->bucket - counts->num_tokens : 0;
    return counts->num_decode_items + pads;
}

static void glmrt_step_write_pads(const glmrt_cuda_step_counts *c, int32_t pad_page, glmrt_cuda_step_view *v,
                                  glmrt_item_writer *writer)
{
    int32_t pad_entry = (int32_t)c->num_pages;
    v->page_ids[pad_entry] = pad_page;
    for (int32_t row = c->num_tokens; row < c->bucket; ++row) {
        v->token_ids[row] = 0;
        v->positions[row] = 0;
        v->token_seq[row] = row;
        v->seq_page_begin[row] = pad_entry;
        v->sample_rows[row] = row;
        memset(&v->sample_params[row], 0, sizeof(v->sample_params[row]));
        glmrt_items_for_decode(row, row, 1, writer);
    }
    v->device_counts->num_decode_items = writer->num_decode;
}

static void glmrt_step_write_samples(const glmrt_step_batch *batch, glmrt_cuda_step_view *v)
{
    int32_t history_used = 0;
    for (int32_t i = 0; i < batch->num_samples; ++i) {
        const glmrt_step_sample *sample = &batch->samples[i];
        const glmrt_sampling_params *sp = sample->params;
        glmrt_cuda_sample_params *p = &v->sample_params[i];
        memset(p, 0, sizeof(*p));
        v->sample_rows[i] = batch->sample_token_index[i];
        p->temperature = sp->temperature;
        p->top_p = sp->top_p;
        p->min_p = sp->min_p;
        p->top_k = sp->top_k;
        p->repetition_penalty = sp->repetition_penalty;
        p->frequency_penalty = sp->frequency_penalty;
        p->presence_penalty = sp->presence_penalty;
        int64_t draw = glmrt_step_sample_draw_index(sample);
        p->uniform = sp->temperature != 0.0f ? glmrt_sampling_uniform(sp->seed, draw) : 0.0;
        if (glmrt_sampling_params_use_history(sp)) {
            p->history_begin = history_used;
            p->num_history = sample->num_history;
            p->num_prompt = sample->num_prompt_tokens;
            memcpy(v->history + history_used, sample->history, (size_t)sample->num_history * sizeof(int32_t));
            history_used += sample->num_history;
        }
    }
}

static glmrt_status glmrt_step_copy_pages(const glmrt_page_id *table, int32_t pages, int32_t num_pool_pages,
                                          int32_t seq, int32_t *out, glmrt_error *error)
{
    uint32_t outside = 0;
    for (int32_t i = 0; i < pages; ++i) {
        outside |= (uint32_t)(table[i] < 0) | (uint32_t)(table[i] >= num_pool_pages);
    }
    if (outside != 0) {
        int32_t i = 0;
        while (table[i] >= 0 && table[i] < num_pool_pages) {
            ++i;
        }
        return glmrt_error_set(error, GLMRT_ERR_INVARIANT, "sequence %d holds page %d outside the pool of %d", seq,
                               table[i], num_pool_pages);
    }
    memcpy(out, table, (size_t)pages * sizeof(*out));
    return GLMRT_OK;
}

glmrt_status glmrt_cuda_step_pack_padded(const glmrt_step_batch *batch, const glmrt_cuda_step_capacity *capacity,
                                         const glmrt_cuda_split_policy *policy, int32_t page_size,
                                         int32_t num_pool_pages, const glmrt_cuda_step_padding *padding,
                                         uint8_t *host, glmrt_cuda_step_counts *counts, glmrt_error *error)
{
    GLMRT_TRY(glmrt_step_count(batch, capacity, policy, page_size, counts, error));
    if (padding != nullptr && padding->bucket > 0) {
        GLMRT_TRY(glmrt_step_fit_bucket(capacity, padding->bucket, counts, error));
    }
    glmrt_cuda_step_view v;
    glmrt_cuda_step_view_at(counts, host, &v);
    v.device_counts->num_decode_items = counts->num_decode_items;
    v.device_counts->num_prefill_items = counts->num_prefill_items;
    v.device_counts->num_merges = counts->num_merges;
    v.device_counts->reserved = 0;
    size_t token_bytes = (size_t)batch->num_tokens * sizeof(int32_t);
    memcpy(v.token_ids, batch->token_ids, token_bytes);
    if (batch->token_feed != nullptr) {
        for (int32_t i = 0; i < batch->num_tokens; ++i) {
            if (batch->token_feed[i] >= 0) {
                v.token_ids[i] = glmrt_fed_token_code(batch->token_feed[i]);
            }
        }
    }
    memcpy(v.positions, batch->positions, token_bytes);
    memcpy(v.token_seq, batch->token_seq, token_bytes);
    int32_t page_cursor = 0;
    for (int32_t s = 0; s < batch->num_seqs; ++s) {
        int32_t pages = glmrt_ceil_div(glmrt_seq_context(batch, s), page_size);
        v.seq_page_begin[s] = page_cursor;
        GLMRT_TRY(glmrt_step_copy_pages(batch->seq_page_tables[s], pages, num_pool_pages, s,
                                        v.page_ids + page_cursor, error));
        page_cursor += pages;
    }
    glmrt_step_write_samples(batch, &v);
    glmrt_item_writer writer;
    memset(&writer, 0, sizeof(writer));
    writer.decode = v.decode_items;
    writer.prefill = v.prefill_items;
    writer.merges = v.merges;
    writer.policy = policy;
    writer.seq_page_begin = v.seq_page_begin;
    glmrt_items_build(batch, &writer);
    if (counts->bucket > 0) {
        glmrt_step_write_pads(counts, padding->pad_page, &v, &writer);
    }
    return GLMRT_OK;
}

glmrt_status glmrt_cuda_step_pack(const glmrt_step_batch *batch, const glmrt_cuda_step_capacity *capacity,
                                  const glmrt_cuda_split_policy *policy, int32_t page_size, int32_t num_pool_pages,
                                  uint8_t *host, glmrt_cuda_step_counts *counts, glmrt_error *error)
{
    return glmrt_cuda_step_pack_padded(batch, capacity, policy, page_size, num_pool_pages, nullptr, host, counts,
                                       error);
}

#define GLMRT_FETCH_THREADS 256
#define GLMRT_FETCH_WORDS 4

__global__ void __launch_bounds__(GLMRT_FETCH_THREADS)
    glmrt_step_fetch_kernel(uint4 *device, const uint4 *host_mapped, int64_t words)
{
    uint4 held[GLMRT_FETCH_WORDS];
    const int64_t first = (int64_t)blockIdx.x * GLMRT_FETCH_THREADS * GLMRT_FETCH_WORDS + threadIdx.x;
#pragma unroll
    for (int k = 0; k < GLMRT_FETCH_WORDS; ++k) {
        const int64_t i = first + k * GLMRT_FETCH_THREADS;
        held[k] = i < words ? host_mapped[i] : make_uint4(0u, 0u, 0u, 0u);
    }
    glmrt_dependent_enter();
#pragma unroll
    for (int k = 0; k < GLMRT_FETCH_WORDS; ++k) {
        const int64_t i = first + k * GLMRT_FETCH_THREADS;
        if (i < words) {
            device[i] = held[k];
        }
    }
}

glmrt_status glmrt_cuda_step_fetch(uint8_t *device, const uint8_t *host_mapped, int64_t bytes, cudaStream_t stream,
                                   glmrt_error *error)
{
    if (bytes <= 0) {
        return GLMRT_OK;
    }
    if (((uintptr_t)device & 15u) != 0 || ((uintptr_t)host_mapped & 15u) != 0) {
        return glmrt_error_set(error, GLMRT_ERR_INVARIANT, "step inputs need 16-byte aligned buffers");
    }
    const int64_t words = glmrt_ceil_div64(bytes, 16);
    const int64_t blocks = glmrt_ceil_div64(words, (int64_t)GLMRT_FETCH_THREADS * GLMRT_FETCH_WORDS);
    glmrt_dependent_launch dependent;
    const cudaLaunchConfig_t *config =
        glmrt_dependent_config(&dependent, (unsigned)blocks, GLMRT_FETCH_THREADS, 0, stream);
    GLMRT_CUDA_TRY(error, cudaLaunchKernelEx(config, glmrt_step_fetch_kernel, reinterpret_cast<uint4 *>(device),
                                             reinterpret_cast<const uint4 *>(host_mapped), words));
    return GLMRT_OK;
}

glmrt_status glmrt_cuda_host_mapped_check(const void *host, const char *what, glmrt_error *error)
{
    void *device = nullptr;
    GLMRT_CUDA_TRY(error, cudaHostGetDevicePointer(&device, const_cast<void *>(host), 0));
    if (device != host) {
        return glmrt_error_set(error, GLMRT_ERR_UNSUPPORTED,
                               "the %s are host memory the GPU reads and writes in place, which needs unified "
                               "addressing (host %p, device %p)",
                               what, host, device);
    }
    return GLMRT_OK;
}
