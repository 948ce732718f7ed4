#include "glmrt.h"

#include <stddef.h>

#include "safetensors.h"

glmrt_status glmrt_safetensors_validate(const char *path, char *error_message, int32_t error_capacity,
                                        int32_t *out_num_tensors)
{
    glmrt_error error;
    glmrt_error_clear(&error);
    if (out_num_tensors != NULL) {
        *out_num_tensors = 0;
    }
    if (path == NULL) {
        glmrt_status status = glmrt_error_set(&error, GLMRT_ERR_INVALID_ARGUMENT, "glmrt_safetensors_validate: null path");
        glmrt_error_copy_out(&error, error_message, error_capacity);
        return status;
    }
    glmrt_safetensors_file file;
    glmrt_status status = glmrt_safetensors_open(path, &file, &error);
    if (status == GLMRT_OK && out_num_tensors != NULL) {
        *out_num_tensors = file.num_tensors;
    }
    glmrt_safetensors_close(&file);
    glmrt_error_copy_out(&error, error_message, error_capacity);
    return status;
}
