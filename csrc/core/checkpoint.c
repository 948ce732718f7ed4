#include "checkpoint.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "json.h"

#define INDEX_FILE_NAME "model.safetensors.index.json"
#define SINGLE_FILE_NAME "model.safetensors"
#define INDEX_MAX_BYTES ((uint64_t)512 * 1024 * 1024)
#define MIN_SLOTS 16

static char *path_join(const char *directory, const char *name, size_t name_length)
{
    size_t directory_length = strlen(directory);
    int needs_separator = directory_length > 0 && directory[directory_length - 1] != '/';
    size_t total = directory_length + (size_t)needs_separator + name_length + 1;
    char *path = malloc(total);
    if (path == NULL) {
        return NULL;
    }
    memcpy(path, directory, directory_length);
    if (needs_separator) {
        path[directory_length] = '/';
    }
    memcpy(path + directory_length + needs_separator, name, name_length);
    path[total - 1] = '\0';
    return path;
}

static glmrt_status path_exists(const char *path, int *out_exists, glmrt_error *error)
{
    struct stat info;
    if (stat(path, &info) == 0) {
        *out_exists = 1;
        return GLMRT_OK;
    }
    if (errno == ENOENT || errno == ENOTDIR) {
        *out_exists = 0;
        return GLMRT_OK;
    }
    return glmrt_error_set(error, GLMRT_ERR_IO, "%s: cannot stat: %s", path, strerror(errno));
}

static glmrt_status read_whole_file(const char *path, char **out_bytes, size_t *out_size, glmrt_error *error)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        return glmrt_error_set(error, GLMRT_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    }
    struct stat info;
    if (fstat(fd, &info) != 0 || !S_ISREG(info.st_mode)) {
        close(fd);
        return glmrt_error_set(error, GLMRT_ERR_IO, "%s: not a readable regular file", path);
    }
    if ((uint64_t)info.st_size > INDEX_MAX_BYTES) {
        close(fd);
        return glmrt_error_set(error, GLMRT_ERR_FORMAT, "%s: %lld bytes is too large for an index file", path,
                               (long long)info.st_size);
    }
    size_t size = (size_t)info.st_size;
    char *bytes = malloc(size > 0 ? size : 1);
    if (bytes == NULL) {
        close(fd);
        return glmrt_error_set(error, GLMRT_ERR_OUT_OF_MEMORY, "out of memory reading %s", path);
    }
    size_t done = 0;
    while (done < size) {
        ssize_t got = read(fd, bytes + done, size - done);
        if (got < 0 && errno == EINTR) {
            continue;
        }
        if (got <= 0) {
            int saved = got < 0 ? errno : EIO;
            free(bytes);
            close(fd);
            return glmrt_error_set(error, GLMRT_ERR_IO, "%s: read failed: %s", path, strerror(saved));
        }
        done += (size_t)got;
    }
    close(fd);
    *out_bytes = bytes;
    *out_size = size;
    return GLMRT_OK;
}

static uint64_t name_hash(const char *name)
{
    uint64_t hash = 1469598103934665603ull;
    for (const unsigned char *p = (const unsigned char *)name; *p != '\0'; p++) {
        hash ^= *p;
        hash *= 1099511628211ull;
    }
    return hash;
}

static const char *file_path_of(const glmrt_checkpoint *checkpoint, int32_t file_index)
{
    if (file_index < 0 || file_index >= checkpoint->num_files || checkpoint->files[file_index].path == NULL) {
        return "(unknown file)";
    }
    return checkpoint->files[file_index].path;
}

static glmrt_status table_insert(glmrt_checkpoint *checkpoint, const glmrt_tensor *tensor, glmrt_error *error)
{
    uint64_t mask = (uint64_t)checkpoint->num_slots - 1;
    uint64_t slot = name_hash(tensor->name) & mask;
    while (checkpoint->slots[slot].name != NULL) {
        const glmrt_tensor *existing = checkpoint->slots[slot].tensor;
        if (strcmp(checkpoint->slots[slot].name, tensor->name) == 0) {
            return glmrt_error_set(error, GLMRT_ERR_FORMAT, "tensor \"%.300s\" appears in both %s and %s",
                                   tensor->name, file_path_of(checkpoint, existing->file_index),
                                   file_path_of(checkpoint, tensor->file_index));
        }
        slot = (slot + 1) & mask;
    }
    checkpoint->slots[slot].name = tensor->name;
    checkpoint->slots[slot].tensor = tensor;
    return GLMRT_OK;
}

static glmrt_status build_table(glmrt_checkpoint *checkpoint, glmrt_error *error)
{
    int64_t total = 0;
    for (int32_t f = 0; f < checkpoint->num_files; f++) {
        total += checkpoint->files[f].num_tensors;
    }
    int64_t slots = MIN_SLOTS;
    while (slots < total * 2) {
        slots *= 2;
    }
    checkpoint->slots = calloc((size_t)slots, sizeof(glmrt_checkpoint_slot));
    if (checkpoint->slots == NULL) {
        return glmrt_error_set(error, GLMRT_ERR_OUT_OF_MEMORY, "out of memory for a table of %lld tensors",
                               (long long)total);
    }
    checkpoint->num_slots = slots;
    for (int32_t f = 0; f < checkpoint->num_files; f++) {
        glmrt_safetensors_file *file = &checkpoint->files[f];
        for (int32_t t = 0; t < file->num_tensors; t++) {
            file->tensors[t].file_index = f;
            glmrt_status status = table_insert(checkpoint, &file->tensors[t], error);
            if (status != GLMRT_OK) {
                return status;
            }
            checkpoint->num_tensors++;
            checkpoint->total_bytes += file->tensors[t].nbytes;
        }
    }
    return GLMRT_OK;
}

const glmrt_tensor *glmrt_checkpoint_find(const glmrt_checkpoint *checkpoint, const char *name)
{
    if (checkpoint == NULL || checkpoint->slots == NULL || checkpoint->num_slots <= 0 || name == NULL) {
        return NULL;
    }
    uint64_t mask = (uint64_t)checkpoint->num_slots - 1;
    uint64_t slot = name_hash(name) & mask;
    while (checkpoint->slots[slot].name != NULL) {
        if (strcmp(checkpoint->slots[slot].name, name) == 0) {
            return checkpoint->slots[slot].tensor;
        }
        slot = (slot + 1) & mask;
    }
    return NULL;
}

static int compare_strings(const void *left, const void *right)
{
    const glmrt_json_value *a = *(const glmrt_json_value *const *)left;
    const glmrt_json_value *b = *(const glmrt_json_value *const *)right;
    size_t shorter = a->string_length < b->string_length ? a->string_length : b->string_length;
    int order = shorter == 0 ? 0 : memcmp(a->string, b->string, shorter);
    if (order != 0) {
        return order;
    }
    return (a->string_length > b->string_length) - (a->string_length < b->string_length);
}

static int32_t shard_index_of(const glmrt_json_value **shard_names, int32_t num_shards, const glmrt_json_value *name)
{
    int32_t low = 0;
    int32_t high = num_shards;
    while (low < high) {
        int32_t middle = low + (high - low) / 2;
        int order = compare_strings(&name, &shard_names[middle]);
        if (order == 0) {
            return middle;
        }
        if (order < 0) {
            high = middle;
        } else {
            low = middle + 1;
        }
    }
    return -1;
}

static glmrt_status check_weight_map_entry(const char *index_path, const glmrt_json_member *member,
                                           glmrt_error *error)
{
    if (member->key_length == 0 || memchr(member->key, '\0', member->key_length) != NULL) {
        return glmrt_error_set(error, GLMRT_ERR_FORMAT, "%s: weight_map has an empty tensor name or one with a NUL",
                               index_path);
    }
    const glmrt_json_value *file = &member->value;
    if (file->kind != GLMRT_JSON_STRING) {
        return glmrt_error_set(error, GLMRT_ERR_FORMAT, "%s: weight_map entry \"%.300s\" must be a file name string",
                               index_path, member->key);
    }
    int plain = file->string_length > 0 && memchr(file->string, '\0', file->string_length) == NULL &&
                strchr(file->string, '/') == NULL && strstr(file->string, "..") == NULL &&
                strcmp(file->string, ".") != 0;
    if (!plain) {
        return glmrt_error_set(error, GLMRT_ERR_FORMAT,
                               "%s: weight_map entry \"%.300s\" names file \"%.300s\", which is not a plain file name",
                               index_path, member->key, file->string);
    }
    return GLMRT_OK;
}

static glmrt_status collect_shard_names(const char *index_path, const glmrt_json_value *weight_map,
                                        const glmrt_json_value ***out_names, int32_t *out_count, glmrt_error *error)
{
    size_t count = weight_map->num_items;
    if (count == 0) {
        return glmrt_error_set(error, GLMRT_ERR_FORMAT, "%s: weight_map is empty", index_path);
    }
    if (count > (size_t)INT32_MAX) {
        return glmrt_error_set(error, GLMRT_ERR_FORMAT, "%s: weight_map is too large", index_path);
    }
    for (size_t i = 0; i < count; i++) {
        glmrt_status status = check_weight_map_entry(index_path, &weight_map->members[i], error);
        if (status != GLMRT_OK) {
            return status;
        }
    }
    const glmrt_json_value **names = malloc(count * sizeof(*names));
    if (names == NULL) {
        return glmrt_error_set(error, GLMRT_ERR_OUT_OF_MEMORY, "out of memory reading %s", index_path);
    }
    for (size_t i = 0; i < count; i++) {
        names[i] = &weight_map->members[i].value;
    }
    qsort(names, count, sizeof(*names), compare_strings);
    size_t unique = 0;
    for (size_t i = 0; i < count; i++) {
        if (unique == 0 || compare_strings(&names[unique - 1], &names[i]) != 0) {
            names[unique++] = names[i];
        }
    }
    *out_names = names;
    *out_count = (int32_t)unique;
    return GLMRT_OK;
}

static glmrt_status open_shards(glmrt_checkpoint *checkpoint, const char *model_dir,
                                const glmrt_json_value **shard_names, int32_t num_shards, glmrt_error *error)
{
    checkpoint->files = calloc((size_t)num_shards, sizeof(glmrt_safetensors_file));
    if (checkpoint->files == NULL) {
        return glmrt_error_set(error, GLMRT_ERR_OUT_OF_MEMORY, "out of memory for %d checkpoint files", num_shards);
    }
    for (int32_t i = 0; i < num_shards; i++) {
        char *path = path_join(model_dir, shard_names[i]->string, shard_names[i]->string_length);
        if (path == NULL) {
            return glmrt_error_set(error, GLMRT_ERR_OUT_OF_MEMORY, "out of memory opening checkpoint files");
        }
        glmrt_status status = glmrt_safetensors_open(path, &checkpoint->files[i], error);
        free(path);
        if (status != GLMRT_OK) {
            return status;
        }
        checkpoint->num_files = i + 1;
    }
    return GLMRT_OK;
}

static glmrt_status verify_weight_map(const glmrt_checkpoint *checkpoint, const char *index_path,
                                      const glmrt_json_value *weight_map, const glmrt_json_value **shard_names,
                                      int32_t num_shards, glmrt_error *error)
{
    for (size_t i = 0; i < weight_map->num_items; i++) {
        const glmrt_json_member *member = &weight_map->members[i];
        int32_t shard = shard_index_of(shard_names, num_shards, &member->value);
        const glmrt_tensor *tensor = glmrt_checkpoint_find(checkpoint, member->key);
        if (tensor == NULL || shard < 0 || tensor->file_index != shard) {
            return glmrt_error_set(error, GLMRT_ERR_MISSING_TENSOR,
                                   "%s: weight_map places tensor \"%.300s\" in %.300s, but that file has no such tensor",
                                   index_path, member->key, member->value.string);
        }
    }
    return GLMRT_OK;
}

static glmrt_status open_sharded(glmrt_checkpoint *checkpoint, const char *model_dir, const char *index_path,
                                 glmrt_error *error)
{
    char *text = NULL;
    size_t size = 0;
    glmrt_status status = read_whole_file(index_path, &text, &size, error);
    if (status != GLMRT_OK) {
        return status;
    }
    glmrt_json_document document;
    glmrt_error json_error;
    glmrt_error_clear(&json_error);
    status = glmrt_json_parse(text, size, &document, &json_error);
    free(text);
    if (status != GLMRT_OK) {
        return glmrt_error_set(error, status, "%s: %s", index_path, json_error.message);
    }
    const glmrt_json_value *weight_map = glmrt_json_object_find(document.root, "weight_map");
    const glmrt_json_value **shard_names = NULL;
    int32_t num_shards = 0;
    if (document.root->kind != GLMRT_JSON_OBJECT || weight_map == NULL || weight_map->kind != GLMRT_JSON_OBJECT) {
        status = glmrt_error_set(error, GLMRT_ERR_FORMAT, "%s: expected an object with a \"weight_map\" object",
                                 index_path);
    } else {
        status = collect_shard_names(index_path, weight_map, &shard_names, &num_shards, error);
    }
    if (status == GLMRT_OK) {
        status = open_shards(checkpoint, model_dir, shard_names, num_shards, error);
    }
    if (status == GLMRT_OK) {
        status = build_table(checkpoint, error);
    }
    if (status == GLMRT_OK) {
        status = verify_weight_map(checkpoint, index_path, weight_map, shard_names, num_shards, error);
    }
    free(shard_names);
    glmrt_json_free(&document);
    return status;
}

static glmrt_status open_single(glmrt_checkpoint *checkpoint, const char *path, glmrt_error *error)
{
    checkpoint->files = calloc(1, sizeof(glmrt_safetensors_file));
    if (checkpoint->files == NULL) {
        return glmrt_error_set(error, GLMRT_ERR_OUT_OF_MEMORY, "out of memory opening %s", path);
    }
    glmrt_status status = glmrt_safetensors_open(path, &checkpoint->files[0], error);
    if (status != GLMRT_OK) {
        return status;
    }
    checkpoint->num_files = 1;
    return build_table(checkpoint, error);
}

static glmrt_status open_in_directory(glmrt_checkpoint *checkpoint, const char *model_dir, const char *index_path,
                                      const char *single_path, glmrt_error *error)
{
    int exists = 0;
    glmrt_status status = path_exists(index_path, &exists, error);
    if (status != GLMRT_OK) {
        return status;
    }
    if (exists) {
        return open_sharded(checkpoint, model_dir, index_path, error);
    }
    status = path_exists(single_path, &exists, error);
    if (status != GLMRT_OK) {
        return status;
    }
    if (exists) {
        return open_single(checkpoint, single_path, error);
    }
    return glmrt_error_set(error, GLMRT_ERR_IO, "no %s or %s in %s", INDEX_FILE_NAME, SINGLE_FILE_NAME, model_dir);
}

glmrt_status glmrt_checkpoint_open(const char *model_dir, glmrt_checkpoint *out, glmrt_error *error)
{
    if (out == NULL) {
        return glmrt_error_set(error, GLMRT_ERR_INVALID_ARGUMENT, "glmrt_checkpoint_open: null output");
    }
    memset(out, 0, sizeof(*out));
    if (model_dir == NULL || model_dir[0] == '\0') {
        return glmrt_error_set(error, GLMRT_ERR_INVALID_ARGUMENT, "glmrt_checkpoint_open: empty model directory");
    }
    char *index_path = path_join(model_dir, INDEX_FILE_NAME, strlen(INDEX_FILE_NAME));
    char *single_path = path_join(model_dir, SINGLE_FILE_NAME, strlen(SINGLE_FILE_NAME));
    glmrt_status status;
    if (index_path == NULL || single_path == NULL) {
        status = glmrt_error_set(error, GLMRT_ERR_OUT_OF_MEMORY, "out of memory opening %s", model_dir);
    } else {
        status = open_in_directory(out, model_dir, index_path, single_path, error);
    }
    free(index_path);
    free(single_path);
    if (status != GLMRT_OK) {
        glmrt_checkpoint_close(out);
    }
    return status;
}

void glmrt_checkpoint_close(glmrt_checkpoint *checkpoint)
{
    if (checkpoint == NULL) {
        return;
    }
    if (checkpoint->files != NULL) {
        for (int32_t i = 0; i < checkpoint->num_files; i++) {
            glmrt_safetensors_close(&checkpoint->files[i]);
        }
    }
    free(checkpoint->files);
    free(checkpoint->slots);
    memset(checkpoint, 0, sizeof(*checkpoint));
}
