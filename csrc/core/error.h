#ifndef GLMRT_ERROR_H
#define GLMRT_ERROR_H

#include "glmrt.h"

typedef struct glmrt_error {
    glmrt_status code;
    char message[GLMRT_ERROR_MESSAGE_CAPACITY];
} glmrt_error;

glmrt_status glmrt_error_set(glmrt_error *error, glmrt_status code, const char *format, ...)
    __attribute__((format(printf, 3, 4)));
void glmrt_error_clear(glmrt_error *error);
void glmrt_error_copy_out(const glmrt_error *error, char *destination, int32_t capacity);

#endif
