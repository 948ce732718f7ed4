#ifndef GLMRT_STEP_AHEAD_H
#define GLMRT_STEP_AHEAD_H

#include "engine.h"

void glmrt_step_release_pages(glmrt_engine *engine, glmrt_step_scratch *scratch, int32_t num_seqs,
                              int32_t num_allocated);
glmrt_status glmrt_step_take_fresh_pages(glmrt_engine *engine, glmrt_step_scratch *scratch, int32_t num_seqs);
void glmrt_step_mark_in_flight(glmrt_request *const *requests, int32_t n, int32_t in_flight);
void glmrt_step_batch_point(glmrt_step_batch *batch, const glmrt_step_scratch *scratch, int32_t num_tokens,
                            int32_t num_seqs, int32_t num_samples);

int glmrt_step_ahead_eligible(const glmrt_engine *engine);
glmrt_status glmrt_step_ahead_launch(glmrt_engine *engine, glmrt_step_flight *out);

#endif
