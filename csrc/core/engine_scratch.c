#include <stdlib.h>
#include <string.h>

#include "engine_scratch.h"

void glmrt_step_scratch_free(glmrt_step_scratch *scratch)
{
    free(scratch->flight_requests);
    free(scratch->relaunch_requests);
    free(scratch->token_ids);
    free(scratch->positions);
    free(scratch->token_seq);
    free(scratch->seq_requests);
    free(scratch->seq_batch_index);
    free(scratch->seq_token_start);
    free(scratch->seq_num_tokens);
    free(scratch->seq_context_len);
    free((void *)scratch->seq_page_tables);
    free(scratch->seq_new_pages);
    free(scratch->seq_num_pages);
    free(scratch->seq_hit_pages);
    free(scratch->request_computed);
    free(scratch->samples);
    free(scratch->sample_seq);
    free(scratch->sample_token_index);
    free(scratch->token_feed);
    free(scratch->seq_discard);
    free(scratch->sampled);
    free(scratch->logits);
    memset(scratch, 0, sizeof(*scratch));
}

glmrt_status glmrt_step_scratch_init(glmrt_step_scratch *scratch, int32_t max_batch, int32_t max_tokens,
                                     int32_t vocab_size, glmrt_error *error)
{
    memset(scratch, 0, sizeof(*scratch));
    size_t batch = (size_t)max_batch;
    size_t tokens = (size_t)max_tokens;
    scratch->flight_requests = calloc(batch, sizeof(glmrt_request *));
    scratch->relaunch_requests = calloc(batch, sizeof(glmrt_request *));
    scratch->token_ids = calloc(tokens, sizeof(glmrt_token));
    scratch->positions = calloc(tokens, sizeof(glmrt_pos));
    scratch->token_seq = calloc(tokens, sizeof(int32_t));
    scratch->seq_requests = calloc(batch, sizeof(glmrt_request *));
    scratch->seq_batch_index = calloc(batch, sizeof(int32_t));
    scratch->seq_token_start = calloc(batch, sizeof(int32_t));
    scratch->seq_num_tokens = calloc(batch, sizeof(int32_t));
    scratch->seq_context_len = calloc(batch, sizeof(int32_t));
    scratch->seq_page_tables = calloc(batch, sizeof(glmrt_page_id *));
    scratch->seq_new_pages = calloc(batch, sizeof(int32_t));
    scratch->seq_num_pages = calloc(batch, sizeof(int32_t));
    scratch->seq_hit_pages = calloc(batch, sizeof(int32_t));
    scratch->request_computed = calloc(batch, sizeof(int32_t));
    scratch->samples = calloc(batch, sizeof(glmrt_step_sample));
    scratch->sample_seq = calloc(batch, sizeof(int32_t));
    scratch->sample_token_index = calloc(batch, sizeof(int32_t));
    scratch->token_feed = calloc(tokens, sizeof(int32_t));
    scratch->seq_discard = calloc(batch, sizeof(int32_t));
    scratch->sampled = calloc(batch, sizeof(glmrt_token));
    scratch->logits = vocab_size > 0 ? calloc(batch * (size_t)vocab_size, sizeof(float)) : NULL;
    if (!scratch->flight_requests || !scratch->relaunch_requests || !scratch->token_ids || !scratch->positions || !scratch->token_seq || !scratch->seq_requests ||
        !scratch->seq_batch_index || !scratch->seq_token_start || !scratch->seq_num_tokens ||
        !scratch->seq_context_len || !scratch->seq_page_tables || !scratch->seq_new_pages || !scratch->seq_num_pages || !scratch->seq_hit_pages ||
        !scratch->request_computed ||
        !scratch->samples || !scratch->sample_seq ||
        !scratch->sample_token_index || !scratch->token_feed || !scratch->seq_discard || !scratch->sampled ||
        (vocab_size > 0 && !scratch->logits)) {
        glmrt_step_scratch_free(scratch);
        return glmrt_error_set(error, GLMRT_ERR_OUT_OF_MEMORY,
                               "cannot allocate step scratch for batch %d, %d tokens, vocabulary %d", max_batch,
                               max_tokens, vocab_size);
    }
    return GLMRT_OK;
}

int64_t glmrt_step_scratch_bytes(int32_t max_batch, int32_t max_tokens, int32_t vocab_size)
{
    int64_t per_token = 4 * 4;
    int64_t per_seq = (int64_t)sizeof(void *) * 5 + 13 * 4 + (int64_t)sizeof(glmrt_step_sample);
    return per_token * max_tokens + per_seq * max_batch + (int64_t)max_batch * vocab_size * 4;
}
