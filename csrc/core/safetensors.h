#ifndef GLMRT_SAFETENSORS_H
#define GLMRT_SAFETENSORS_H

#include "error.h"
#include "tensor.h"

#define GLMRT_SAFETENSORS_MAX_HEADER_BYTES (100ull * 1000ull * 1000ull)

typedef struct glmrt_safetensors_file {
    char *path;
    int fd;
    const uint8_t *map;
    uint64_t file_size;
    uint64_t data_start;
    int32_t num_tensors;
    glmrt_tensor *tensors;
    char *name_storage;
} glmrt_safetensors_file;

glmrt_status glmrt_safetensors_parse(const uint8_t *bytes, uint64_t size, glmrt_safetensors_file *out,
                                     glmrt_error *error);
glmrt_status glmrt_safetensors_open(const char *path, glmrt_safetensors_file *out, glmrt_error *error);
void glmrt_safetensors_close(glmrt_safetensors_file *file);

#endif
