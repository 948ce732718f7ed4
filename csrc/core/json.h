#ifndef GLMRT_JSON_H
#define GLMRT_JSON_H

#include <stddef.h>
#include <stdint.h>

#include "error.h"

#define GLMRT_JSON_MAX_DEPTH 64
#define GLMRT_JSON_MAX_VALUES 2000000

typedef enum glmrt_json_kind {
    GLMRT_JSON_NULL = 0,
    GLMRT_JSON_FALSE,
    GLMRT_JSON_TRUE,
    GLMRT_JSON_NUMBER,
    GLMRT_JSON_STRING,
    GLMRT_JSON_ARRAY,
    GLMRT_JSON_OBJECT
} glmrt_json_kind;

typedef struct glmrt_json_member glmrt_json_member;

typedef struct glmrt_json_value {
    glmrt_json_kind kind;
    int32_t is_int64;
    int64_t int64_value;
    double number;
    const char *string;
    size_t string_length;
    size_t num_items;
    struct glmrt_json_value *items;
    glmrt_json_member *members;
    const glmrt_json_member **members_by_key;
    size_t source_offset;
} glmrt_json_value;

struct glmrt_json_member {
    const char *key;
    size_t key_length;
    glmrt_json_value value;
};

typedef struct glmrt_json_arena_block glmrt_json_arena_block;

typedef struct glmrt_json_document {
    glmrt_json_value *root;
    glmrt_json_arena_block *blocks;
} glmrt_json_document;

glmrt_status glmrt_json_parse(const char *text, size_t length, glmrt_json_document *out, glmrt_error *error);
void glmrt_json_free(glmrt_json_document *document);

const glmrt_json_value *glmrt_json_object_find(const glmrt_json_value *object, const char *key);
const glmrt_json_value *glmrt_json_object_find_bytes(const glmrt_json_value *object, const char *key,
                                                     size_t key_length);
const glmrt_json_value *glmrt_json_array_at(const glmrt_json_value *array, size_t index);
int32_t glmrt_json_get_int64(const glmrt_json_value *value, int64_t *out_value);
int32_t glmrt_json_string_equals(const glmrt_json_value *value, const char *text);
const char *glmrt_json_kind_name(glmrt_json_kind kind);

#endif
