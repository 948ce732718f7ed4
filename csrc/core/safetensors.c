#include "safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "json.h"

#define SHOWN_NAME_BYTES 200
#define METADATA_KEY "__metadata__"

typedef struct tensor_range {
    uint64_t begin;
    uint64_t end;
    int32_t tensor_index;
} tensor_range;

typedef struct header_context {
    const uint8_t *bytes;
    uint64_t data_start;
    uint64_t data_size;
    glmrt_safetensors_file *file;
    glmrt_error *error;
    char shown_name[SHOWN_NAME_BYTES];
} header_context;

static void show_name(header_context *context, const char *name, size_t length)
{
    size_t n = 0;
    for (size_t i = 0; i < length && n + 1 < sizeof(context->shown_name); i++) {
        unsigned char c = (unsigned char)name[i];
        context->shown_name[n++] = (c >= 0x20 && c != 0x7f) ? (char)c : '?';
    }
    context->shown_name[n] = '\0';
}

static uint64_t read_le64(const uint8_t *bytes)
{
    uint64_t value = 0;
    for (int i = 7; i >= 0; i--) {
        value = (value << 8) | bytes[i];
    }
    return value;
}

static glmrt_status tensor_fail(header_context *context, glmrt_status code, const char *what)
{
    return glmrt_error_set(context->error, code, "tensor \"%s\": %s", context->shown_name, what);
}

static glmrt_status parse_dtype(header_context *context, const glmrt_json_value *entry, glmrt_tensor *tensor)
{
    const glmrt_json_value *dtype = glmrt_json_object_find(entry, "dtype");
    if (dtype == NULL) {
        return tensor_fail(context, GLMRT_ERR_FORMAT, "missing \"dtype\"");
    }
    if (dtype->kind != GLMRT_JSON_STRING) {
        return tensor_fail(context, GLMRT_ERR_FORMAT, "\"dtype\" must be a string");
    }
    tensor->dtype = glmrt_dtype_from_name(dtype->string, dtype->string_length);
    if (tensor->dtype == GLMRT_DTYPE_INVALID) {
        char shown[64];
        size_t n = 0;
        for (size_t i = 0; i < dtype->string_length && n + 1 < sizeof(shown); i++) {
            unsigned char c = (unsigned char)dtype->string[i];
            shown[n++] = (c >= 0x20 && c < 0x7f) ? (char)c : '?';
        }
        shown[n] = '\0';
        return glmrt_error_set(context->error, GLMRT_ERR_FORMAT, "tensor \"%s\": unknown dtype \"%s\"",
                               context->shown_name, shown);
    }
    return GLMRT_OK;
}

static glmrt_status parse_shape(header_context *context, const glmrt_json_value *entry, glmrt_tensor *tensor,
                                uint64_t *out_numel)
{
    const glmrt_json_value *shape = glmrt_json_object_find(entry, "shape");
    if (shape == NULL) {
        return tensor_fail(context, GLMRT_ERR_FORMAT, "missing \"shape\"");
    }
    if (shape->kind != GLMRT_JSON_ARRAY) {
        return tensor_fail(context, GLMRT_ERR_FORMAT, "\"shape\" must be an array");
    }
    if (shape->num_items > GLMRT_MAX_DIMS) {
        return glmrt_error_set(context->error, GLMRT_ERR_FORMAT, "tensor \"%s\": shape has %zu dimensions, at most %d allowed",
                               context->shown_name, shape->num_items, GLMRT_MAX_DIMS);
    }
    tensor->ndim = (int32_t)shape->num_items;
    uint64_t numel = 1;
    int overflow = 0;
    int has_zero_extent = 0;
    for (size_t i = 0; i < shape->num_items; i++) {
        int64_t extent;
        if (!glmrt_json_get_int64(&shape->items[i], &extent) || extent < 0) {
            return tensor_fail(context, GLMRT_ERR_FORMAT, "\"shape\" entries must be non-negative integers");
        }
        tensor->shape[i] = extent;
        if (extent == 0) {
            has_zero_extent = 1;
        } else if (numel > UINT64_MAX / (uint64_t)extent) {
            overflow = 1;
        }
        numel *= (uint64_t)extent;
    }
    if (has_zero_extent) {
        numel = 0;
    } else if (overflow) {
        return tensor_fail(context, GLMRT_ERR_FORMAT, "element count of \"shape\" overflows 64 bits");
    }
    *out_numel = numel;
    return GLMRT_OK;
}

static glmrt_status parse_offsets(header_context *context, const glmrt_json_value *entry, uint64_t *out_begin,
                                  uint64_t *out_end)
{
    const glmrt_json_value *offsets = glmrt_json_object_find(entry, "data_offsets");
    if (offsets == NULL) {
        return tensor_fail(context, GLMRT_ERR_FORMAT, "missing \"data_offsets\"");
    }
    if (offsets->kind != GLMRT_JSON_ARRAY || offsets->num_items != 2) {
        return tensor_fail(context, GLMRT_ERR_FORMAT, "\"data_offsets\" must be an array [begin, end]");
    }
    int64_t begin;
    int64_t end;
    if (!glmrt_json_get_int64(&offsets->items[0], &begin) || !glmrt_json_get_int64(&offsets->items[1], &end) ||
        begin < 0 || end < 0) {
        return tensor_fail(context, GLMRT_ERR_FORMAT, "\"data_offsets\" entries must be non-negative integers");
    }
    if (begin > end) {
        return glmrt_error_set(context->error, GLMRT_ERR_FORMAT,
                               "tensor \"%s\": data_offsets begin %lld is after end %lld", context->shown_name,
                               (long long)begin, (long long)end);
    }
    if ((uint64_t)end > context->data_size) {
        return glmrt_error_set(context->error, GLMRT_ERR_FORMAT,
                               "tensor \"%s\": data_offsets end %lld is past the end of the data section (%llu bytes)",
                               context->shown_name, (long long)end, (unsigned long long)context->data_size);
    }
    *out_begin = (uint64_t)begin;
    *out_end = (uint64_t)end;
    return GLMRT_OK;
}

static glmrt_status parse_tensor(header_context *context, const glmrt_json_member *member, glmrt_tensor *tensor,
                                 tensor_range *range)
{
    show_name(context, member->key, member->key_length);
    if (memchr(member->key, '\0', member->key_length) != NULL) {
        return tensor_fail(context, GLMRT_ERR_FORMAT, "name contains a NUL character");
    }
    if (member->value.kind != GLMRT_JSON_OBJECT) {
        return tensor_fail(context, GLMRT_ERR_FORMAT, "entry must be an object");
    }
    uint64_t numel = 0;
    uint64_t begin = 0;
    uint64_t end = 0;
    glmrt_status status = parse_dtype(context, &member->value, tensor);
    if (status == GLMRT_OK) {
        status = parse_shape(context, &member->value, tensor, &numel);
    }
    if (status == GLMRT_OK) {
        status = parse_offsets(context, &member->value, &begin, &end);
    }
    if (status != GLMRT_OK) {
        return status;
    }
    uint64_t element_size = (uint64_t)glmrt_dtype_size(tensor->dtype);
    if (numel > UINT64_MAX / element_size) {
        return tensor_fail(context, GLMRT_ERR_FORMAT, "byte size of the tensor overflows 64 bits");
    }
    uint64_t nbytes = numel * element_size;
    if (nbytes != end - begin) {
        return glmrt_error_set(context->error, GLMRT_ERR_FORMAT,
                               "tensor \"%s\": shape and dtype %s need %llu bytes but data_offsets [%llu, %llu] span %llu",
                               context->shown_name, glmrt_dtype_name(tensor->dtype), (unsigned long long)nbytes,
                               (unsigned long long)begin, (unsigned long long)end, (unsigned long long)(end - begin));
    }
    tensor->nbytes = nbytes;
    tensor->data = context->bytes + context->data_start + begin;
    tensor->file_index = 0;
    range->begin = begin;
    range->end = end;
    return GLMRT_OK;
}

static int compare_ranges(const void *left, const void *right)
{
    const tensor_range *a = left;
    const tensor_range *b = right;
    if (a->begin != b->begin) {
        return a->begin < b->begin ? -1 : 1;
    }
    if (a->end != b->end) {
        return a->end < b->end ? -1 : 1;
    }
    return (a->tensor_index > b->tensor_index) - (a->tensor_index < b->tensor_index);
}

static glmrt_status check_overlaps(header_context *context, tensor_range *ranges, int32_t count)
{
    qsort(ranges, (size_t)count, sizeof(tensor_range), compare_ranges);
    for (int32_t i = 1; i < count; i++) {
        if (ranges[i].begin < ranges[i - 1].end) {
            const glmrt_tensor *first = &context->file->tensors[ranges[i - 1].tensor_index];
            const glmrt_tensor *second = &context->file->tensors[ranges[i].tensor_index];
            return glmrt_error_set(context->error, GLMRT_ERR_FORMAT,
                                   "tensors \"%.200s\" [%llu, %llu] and \"%.200s\" [%llu, %llu] have overlapping data ranges",
                                   first->name, (unsigned long long)ranges[i - 1].begin,
                                   (unsigned long long)ranges[i - 1].end, second->name,
                                   (unsigned long long)ranges[i].begin, (unsigned long long)ranges[i].end);
        }
    }
    return GLMRT_OK;
}

static glmrt_status allocate_tables(header_context *context, const glmrt_json_value *root, int32_t num_tensors,
                                    tensor_range **out_ranges)
{
    glmrt_safetensors_file *file = context->file;
    size_t name_bytes = 0;
    for (size_t i = 0; i < root->num_items; i++) {
        name_bytes += root->members[i].key_length + 1;
    }
    size_t table_count = num_tensors > 0 ? (size_t)num_tensors : 1;
    file->tensors = calloc(table_count, sizeof(glmrt_tensor));
    file->name_storage = malloc(name_bytes > 0 ? name_bytes : 1);
    *out_ranges = calloc(table_count, sizeof(tensor_range));
    if (file->tensors == NULL || file->name_storage == NULL || *out_ranges == NULL) {
        return glmrt_error_set(context->error, GLMRT_ERR_OUT_OF_MEMORY,
                               "out of memory for a safetensors table of %d tensors", num_tensors);
    }
    return GLMRT_OK;
}

static glmrt_status parse_root(header_context *context, const glmrt_json_value *root)
{
    if (root->kind != GLMRT_JSON_OBJECT) {
        return glmrt_error_set(context->error, GLMRT_ERR_FORMAT, "safetensors header must be a JSON object, found %s",
                               glmrt_json_kind_name(root->kind));
    }
    const glmrt_json_value *metadata = glmrt_json_object_find(root, METADATA_KEY);
    if (metadata != NULL && metadata->kind != GLMRT_JSON_OBJECT) {
        return glmrt_error_set(context->error, GLMRT_ERR_FORMAT, "\"__metadata__\" must be an object, found %s",
                               glmrt_json_kind_name(metadata->kind));
    }
    size_t count = root->num_items - (metadata != NULL ? 1 : 0);
    if (count > (size_t)INT32_MAX) {
        return glmrt_error_set(context->error, GLMRT_ERR_FORMAT, "safetensors header lists too many tensors (%zu)", count);
    }
    int32_t num_tensors = (int32_t)count;
    tensor_range *ranges = NULL;
    glmrt_status status = allocate_tables(context, root, num_tensors, &ranges);
    char *name_cursor = context->file->name_storage;
    int32_t index = 0;
    for (size_t i = 0; status == GLMRT_OK && i < root->num_items; i++) {
        const glmrt_json_member *member = &root->members[i];
        if (&member->value == metadata) {
            continue;
        }
        glmrt_tensor *tensor = &context->file->tensors[index];
        memcpy(name_cursor, member->key, member->key_length);
        name_cursor[member->key_length] = '\0';
        tensor->name = name_cursor;
        name_cursor += member->key_length + 1;
        ranges[index].tensor_index = index;
        status = parse_tensor(context, member, tensor, &ranges[index]);
        index++;
    }
    if (status == GLMRT_OK) {
        context->file->num_tensors = num_tensors;
        status = check_overlaps(context, ranges, num_tensors);
    }
    free(ranges);
    return status;
}

static glmrt_status parse_length_prefix(const uint8_t *bytes, uint64_t size, uint64_t *out_header_length,
                                        glmrt_error *error)
{
    if (size < 8) {
        return glmrt_error_set(error, GLMRT_ERR_FORMAT,
                               "file is %llu bytes, shorter than the 8-byte header length prefix",
                               (unsigned long long)size);
    }
    uint64_t header_length = read_le64(bytes);
    if (header_length == 0) {
        return glmrt_error_set(error, GLMRT_ERR_FORMAT, "header length is 0");
    }
    if (header_length > GLMRT_SAFETENSORS_MAX_HEADER_BYTES) {
        return glmrt_error_set(error, GLMRT_ERR_FORMAT, "header length %llu exceeds the limit of %llu bytes",
                               (unsigned long long)header_length,
                               (unsigned long long)GLMRT_SAFETENSORS_MAX_HEADER_BYTES);
    }
    if (header_length > size - 8) {
        return glmrt_error_set(error, GLMRT_ERR_FORMAT,
                               "header length %llu runs past the end of the file (%llu bytes)",
                               (unsigned long long)header_length, (unsigned long long)size);
    }
    *out_header_length = header_length;
    return GLMRT_OK;
}

static void release_tables(glmrt_safetensors_file *file)
{
    free(file->tensors);
    free(file->name_storage);
    file->tensors = NULL;
    file->name_storage = NULL;
    file->num_tensors = 0;
}

glmrt_status glmrt_safetensors_parse(const uint8_t *bytes, uint64_t size, glmrt_safetensors_file *out,
                                     glmrt_error *error)
{
    if (out == NULL || (bytes == NULL && size > 0)) {
        return glmrt_error_set(error, GLMRT_ERR_INVALID_ARGUMENT, "glmrt_safetensors_parse: null argument");
    }
    memset(out, 0, sizeof(*out));
    out->fd = -1;
    uint64_t header_length = 0;
    glmrt_status status = parse_length_prefix(bytes, size, &header_length, error);
    if (status != GLMRT_OK) {
        return status;
    }
    glmrt_json_document document;
    glmrt_error json_error;
    glmrt_error_clear(&json_error);
    status = glmrt_json_parse((const char *)bytes + 8, (size_t)header_length, &document, &json_error);
    if (status != GLMRT_OK) {
        return glmrt_error_set(error, status, "safetensors header is not valid JSON: %s", json_error.message);
    }
    header_context context;
    memset(&context, 0, sizeof(context));
    context.bytes = bytes;
    context.data_start = 8 + header_length;
    context.data_size = size - context.data_start;
    context.file = out;
    context.error = error;
    status = parse_root(&context, document.root);
    glmrt_json_free(&document);
    if (status != GLMRT_OK) {
        release_tables(out);
        return status;
    }
    out->file_size = size;
    out->data_start = context.data_start;
    return GLMRT_OK;
}

static glmrt_status map_file(const char *path, const uint8_t **out_map, uint64_t *out_size, glmrt_error *error)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        return glmrt_error_set(error, GLMRT_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    }
    struct stat info;
    if (fstat(fd, &info) != 0) {
        int saved = errno;
        close(fd);
        return glmrt_error_set(error, GLMRT_ERR_IO, "%s: cannot stat: %s", path, strerror(saved));
    }
    if (!S_ISREG(info.st_mode)) {
        close(fd);
        return glmrt_error_set(error, GLMRT_ERR_IO, "%s: not a regular file", path);
    }
    uint64_t size = (uint64_t)info.st_size;
    if (size < 8) {
        close(fd);
        return glmrt_error_set(error, GLMRT_ERR_FORMAT,
                               "%s: file is %llu bytes, shorter than the 8-byte header length prefix", path,
                               (unsigned long long)size);
    }
    void *map = mmap(NULL, (size_t)size, PROT_READ, MAP_PRIVATE, fd, 0);
    int saved = errno;
    close(fd);
    if (map == MAP_FAILED) {
        return glmrt_error_set(error, GLMRT_ERR_IO, "%s: cannot mmap %llu bytes: %s", path, (unsigned long long)size,
                               strerror(saved));
    }
    *out_map = map;
    *out_size = size;
    return GLMRT_OK;
}

glmrt_status glmrt_safetensors_open(const char *path, glmrt_safetensors_file *out, glmrt_error *error)
{
    if (out == NULL) {
        return glmrt_error_set(error, GLMRT_ERR_INVALID_ARGUMENT, "glmrt_safetensors_open: null output");
    }
    memset(out, 0, sizeof(*out));
    out->fd = -1;
    if (path == NULL) {
        return glmrt_error_set(error, GLMRT_ERR_INVALID_ARGUMENT, "glmrt_safetensors_open: null path");
    }
    const uint8_t *map = NULL;
    uint64_t size = 0;
    glmrt_status status = map_file(path, &map, &size, error);
    if (status != GLMRT_OK) {
        return status;
    }
    glmrt_error parse_error;
    glmrt_error_clear(&parse_error);
    status = glmrt_safetensors_parse(map, size, out, &parse_error);
    if (status != GLMRT_OK) {
        munmap((void *)map, (size_t)size);
        return glmrt_error_set(error, status, "%s: %s", path, parse_error.message);
    }
    out->path = strdup(path);
    if (out->path == NULL) {
        release_tables(out);
        munmap((void *)map, (size_t)size);
        memset(out, 0, sizeof(*out));
        out->fd = -1;
        return glmrt_error_set(error, GLMRT_ERR_OUT_OF_MEMORY, "out of memory opening %s", path);
    }
    out->map = map;
    return GLMRT_OK;
}

void glmrt_safetensors_close(glmrt_safetensors_file *file)
{
    if (file == NULL) {
        return;
    }
    release_tables(file);
    if (file->map != NULL) {
        munmap((void *)file->map, (size_t)file->file_size);
    }
    free(file->path);
    memset(file, 0, sizeof(*file));
    file->fd = -1;
}
