#ifndef GLMRT_CHECKPOINT_H
#define GLMRT_CHECKPOINT_H

#include "safetensors.h"

typedef struct glmrt_checkpoint_slot {
    const char *name;
    const glmrt_tensor *tensor;
} glmrt_checkpoint_slot;

typedef struct glmrt_checkpoint {
    int32_t num_files;
    glmrt_safetensors_file *files;
    int64_t num_tensors;
    int64_t num_slots;
    glmrt_checkpoint_slot *slots;
    uint64_t total_bytes;
} glmrt_checkpoint;

glmrt_status glmrt_checkpoint_open(const char *model_dir, glmrt_checkpoint *out, glmrt_error *error);
const glmrt_tensor *glmrt_checkpoint_find(const glmrt_checkpoint *checkpoint, const char *name);
void glmrt_checkpoint_close(glmrt_checkpoint *checkpoint);

#endif
