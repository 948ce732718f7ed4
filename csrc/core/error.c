#include "error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

glmrt_status glmrt_error_set(glmrt_error *error, glmrt_status code, const char *format, ...)
{
    if (error == NULL) {
        return code;
    }
    error->code = code;
    va_list args;
    va_start(args, format);
    int written = vsnprintf(error->message, sizeof(error->message), format, args);
    va_end(args);
    if (written < 0) {
        snprintf(error->message, sizeof(error->message), "error %d (message could not be formatted)", (int)code);
    }
    return code;
}

void glmrt_error_clear(glmrt_error *error)
{
    if (error == NULL) {
        return;
    }
    error->code = GLMRT_OK;
    error->message[0] = '\0';
}

void glmrt_error_copy_out(const glmrt_error *error, char *destination, int32_t capacity)
{
    if (destination == NULL || capacity <= 0) {
        return;
    }
    if (error == NULL) {
        destination[0] = '\0';
        return;
    }
    size_t length = strnlen(error->message, sizeof(error->message));
    size_t limit = (size_t)capacity - 1;
    if (length > limit) {
        length = limit;
    }
    memcpy(destination, error->message, length);
    destination[length] = '\0';
}
