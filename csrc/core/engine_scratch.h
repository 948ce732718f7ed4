#ifndef GLMRT_ENGINE_SCRATCH_H
#define GLMRT_ENGINE_SCRATCH_H

#include "engine.h"

glmrt_status glmrt_step_scratch_init(glmrt_step_scratch *scratch, int32_t max_batch, int32_t max_tokens,
                                     int32_t vocab_size, glmrt_error *error);
void glmrt_step_scratch_free(glmrt_step_scratch *scratch);
int64_t glmrt_step_scratch_bytes(int32_t max_batch, int32_t max_tokens, int32_t vocab_size);

#endif
