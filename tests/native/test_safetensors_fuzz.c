#include <dirent.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "checkpoint.h"
#include "json.h"
#include "safetensors.h"
#include "weights.h"

#define NUM_MUTATIONS 3000
#define MAX_SPECS 512
#define BASE_DATA_SLACK 16

static int32_t checks_passed;
static int32_t checks_failed;

static void check(int condition, const char *format, ...) __attribute__((format(printf, 2, 3)));

static void check(int condition, const char *format, ...)
{
    if (condition) {
        checks_passed++;
        return;
    }
    checks_failed++;
    va_list args;
    va_start(args, format);
    fprintf(stderr, "FAILED: ");
    vfprintf(stderr, format, args);
    fprintf(stderr, "\n");
    va_end(args);
}

typedef struct text_buffer {
    char *bytes;
    size_t length;
    size_t capacity;
} text_buffer;

static void text_reserve(text_buffer *text, size_t extra)
{
    if (text->length + extra + 1 <= text->capacity) {
        return;
    }
    size_t capacity = text->capacity == 0 ? 256 : text->capacity;
    while (capacity < text->length + extra + 1) {
        capacity *= 2;
    }
    char *grown = realloc(text->bytes, capacity);
    if (grown == NULL) {
        fprintf(stderr, "out of memory in the test driver\n");
        exit(2);
    }
    text->bytes = grown;
    text->capacity = capacity;
}

static void text_append_bytes(text_buffer *text, const char *bytes, size_t length)
{
    text_reserve(text, length);
    memcpy(text->bytes + text->length, bytes, length);
    text->length += length;
    text->bytes[text->length] = '\0';
}

static void text_append(text_buffer *text, const char *format, ...) __attribute__((format(printf, 2, 3)));

static void text_append(text_buffer *text, const char *format, ...)
{
    text_reserve(text, 64);
    va_list args;
    va_start(args, format);
    size_t available = text->capacity - text->length;
    int needed = vsnprintf(text->bytes + text->length, available, format, args);
    va_end(args);
    if (needed < 0) {
        fprintf(stderr, "formatting failed in the test driver\n");
        exit(2);
    }
    if ((size_t)needed >= available) {
        text_reserve(text, (size_t)needed);
        va_start(args, format);
        vsnprintf(text->bytes + text->length, (size_t)needed + 1, format, args);
        va_end(args);
    }
    text->length += (size_t)needed;
}

static void text_replace(text_buffer *text, size_t at, size_t removed, const char *bytes, size_t added)
{
    text_reserve(text, added);
    memmove(text->bytes + at + added, text->bytes + at + removed, text->length - at - removed);
    memcpy(text->bytes + at, bytes, added);
    text->length = text->length - removed + added;
    text->bytes[text->length] = '\0';
}

static void text_free(text_buffer *text)
{
    free(text->bytes);
    memset(text, 0, sizeof(*text));
}

typedef struct tensor_spec {
    char name[128];
    glmrt_dtype dtype;
    int32_t ndim;
    int64_t shape[GLMRT_MAX_DIMS];
} tensor_spec;

typedef struct spec_list {
    tensor_spec items[MAX_SPECS];
    int32_t count;
} spec_list;

static void spec_add(spec_list *list, const char *name, glmrt_dtype dtype, int32_t ndim, int64_t d0, int64_t d1)
{
    if (list->count >= MAX_SPECS) {
        fprintf(stderr, "spec list full\n");
        exit(2);
    }
    tensor_spec *spec = &list->items[list->count++];
    memset(spec, 0, sizeof(*spec));
    snprintf(spec->name, sizeof(spec->name), "%s", name);
    spec->dtype = dtype;
    spec->ndim = ndim;
    spec->shape[0] = d0;
    spec->shape[1] = d1;
}

static int32_t spec_find(const spec_list *list, const char *name)
{
    for (int32_t i = 0; i < list->count; i++) {
        if (strcmp(list->items[i].name, name) == 0) {
            return i;
        }
    }
    return -1;
}

static void spec_remove(spec_list *list, const char *name)
{
    int32_t index = spec_find(list, name);
    if (index < 0) {
        fprintf(stderr, "spec %s not present\n", name);
        exit(2);
    }
    memmove(&list->items[index], &list->items[index + 1], (size_t)(list->count - index - 1) * sizeof(tensor_spec));
    list->count--;
}

static uint64_t spec_nbytes(const tensor_spec *spec)
{
    uint64_t count = (uint64_t)glmrt_dtype_size(spec->dtype);
    for (int32_t d = 0; d < spec->ndim; d++) {
        count *= (uint64_t)spec->shape[d];
    }
    return count;
}

static void header_for_specs(const tensor_spec *specs, int32_t count, const char *metadata, text_buffer *header,
                             uint64_t *out_data_size)
{
    uint64_t offset = 0;
    text_append(header, "{");
    if (metadata != NULL) {
        text_append(header, "\"__metadata__\":%s", metadata);
    }
    for (int32_t i = 0; i < count; i++) {
        const tensor_spec *spec = &specs[i];
        uint64_t nbytes = spec_nbytes(spec);
        text_append(header, "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[", (i > 0 || metadata != NULL) ? "," : "",
                    spec->name, glmrt_dtype_name(spec->dtype));
        for (int32_t d = 0; d < spec->ndim; d++) {
            text_append(header, d == 0 ? "%lld" : ",%lld", (long long)spec->shape[d]);
        }
        text_append(header, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)offset,
                    (unsigned long long)(offset + nbytes));
        offset += nbytes;
    }
    text_append(header, "}");
    *out_data_size = offset;
}

static uint8_t *file_bytes(const char *header, size_t header_length, uint64_t length_prefix, uint64_t data_size,
                           size_t *out_size)
{
    size_t size = 8 + header_length + (size_t)data_size;
    uint8_t *bytes = malloc(size > 0 ? size : 1);
    if (bytes == NULL) {
        fprintf(stderr, "out of memory in the test driver\n");
        exit(2);
    }
    for (int i = 0; i < 8; i++) {
        bytes[i] = (uint8_t)(length_prefix >> (8 * i));
    }
    memcpy(bytes + 8, header, header_length);
    for (size_t i = 0; i < (size_t)data_size; i++) {
        bytes[8 + header_length + i] = (uint8_t)(i * 37 + 11);
    }
    *out_size = size;
    return bytes;
}

static uint8_t *file_for_specs(const tensor_spec *specs, int32_t count, size_t *out_size)
{
    text_buffer header = {0};
    uint64_t data_size = 0;
    header_for_specs(specs, count, "{\"format\":\"pt\"}", &header, &data_size);
    uint8_t *bytes = file_bytes(header.bytes, header.length, header.length, data_size, out_size);
    text_free(&header);
    return bytes;
}

static uint64_t rng_state;

static uint64_t rng_next(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

static size_t rng_below(size_t bound)
{
    return bound == 0 ? 0 : (size_t)(rng_next() % bound);
}

static void base_specs(spec_list *list)
{
    list->count = 0;
    spec_add(list, "a.weight", GLMRT_DTYPE_F32, 2, 2, 3);
    spec_add(list, "b.bias", GLMRT_DTYPE_BF16, 1, 4, 0);
    spec_add(list, "c.fp8", GLMRT_DTYPE_F8_E4M3, 2, 3, 5);
    spec_add(list, "d.index", GLMRT_DTYPE_I64, 1, 2, 0);
    spec_add(list, "e.flag", GLMRT_DTYPE_BOOL, 0, 0, 0);
    spec_add(list, "f.empty", GLMRT_DTYPE_F16, 2, 0, 4);
    spec_add(list, "g.half", GLMRT_DTYPE_F16, 3, 1, 2);
    list->items[6].shape[2] = 2;
}

static void check_parsed_invariants(const uint8_t *bytes, size_t size, const glmrt_safetensors_file *file,
                                    const char *label)
{
    int ok = file->num_tensors >= 0 && file->data_start >= 8 && file->data_start <= size && file->file_size == size;
    for (int32_t i = 0; ok && i < file->num_tensors; i++) {
        const glmrt_tensor *tensor = &file->tensors[i];
        int64_t numel = glmrt_tensor_numel(tensor);
        ok = tensor->name != NULL && tensor->dtype != GLMRT_DTYPE_INVALID && tensor->ndim >= 0 &&
             tensor->ndim <= GLMRT_MAX_DIMS && numel >= 0 &&
             tensor->nbytes == (uint64_t)numel * (uint64_t)glmrt_dtype_size(tensor->dtype) &&
             tensor->data >= bytes + file->data_start && tensor->data + tensor->nbytes <= bytes + size;
    }
    check(ok, "%s: parsed file violates its invariants", label);
}

static void check_valid_base(void)
{
    spec_list *list = calloc(1, sizeof(spec_list));
    base_specs(list);
    size_t size = 0;
    uint8_t *bytes = file_for_specs(list->items, list->count, &size);
    glmrt_safetensors_file file;
    glmrt_error error;
    glmrt_error_clear(&error);
    glmrt_status status = glmrt_safetensors_parse(bytes, size, &file, &error);
    check(status == GLMRT_OK, "valid base file parses (%s)", error.message);
    if (status == GLMRT_OK) {
        check(file.num_tensors == list->count, "valid base file has %d tensors", list->count);
        uint64_t offset = 0;
        for (int32_t i = 0; i < file.num_tensors && i < list->count; i++) {
            const glmrt_tensor *tensor = &file.tensors[i];
            check(strcmp(tensor->name, list->items[i].name) == 0, "tensor %d is named %s", i, list->items[i].name);
            check(tensor->dtype == list->items[i].dtype, "tensor %s has its dtype", list->items[i].name);
            check(tensor->ndim == list->items[i].ndim, "tensor %s has its ndim", list->items[i].name);
            check(tensor->data == bytes + file.data_start + offset, "tensor %s points into the buffer",
                  list->items[i].name);
            check(tensor->nbytes == spec_nbytes(&list->items[i]), "tensor %s has its byte size", list->items[i].name);
            offset += spec_nbytes(&list->items[i]);
        }
        check_parsed_invariants(bytes, size, &file, "valid base file");
    }
    glmrt_safetensors_close(&file);
    glmrt_safetensors_close(&file);
    check(file.tensors == NULL && file.map == NULL, "closing twice leaves a zeroed struct");
    free(bytes);
    free(list);
}

static int find_nth(const text_buffer *text, const char *needle, size_t nth, size_t *out_at)
{
    size_t needle_length = strlen(needle);
    size_t seen = 0;
    for (size_t at = 0; at + needle_length <= text->length; at++) {
        if (memcmp(text->bytes + at, needle, needle_length) == 0) {
            if (seen == nth) {
                *out_at = at;
                return 1;
            }
            seen++;
        }
    }
    return 0;
}

static void mutate_swap_offsets(text_buffer *text)
{
    size_t at;
    if (!find_nth(text, "\"data_offsets\":[", rng_below(7), &at)) {
        return;
    }
    size_t start = at + strlen("\"data_offsets\":[");
    char *comma = memchr(text->bytes + start, ',', text->length - start);
    char *close = comma == NULL ? NULL : memchr(comma, ']', text->length - (size_t)(comma - text->bytes));
    if (comma == NULL || close == NULL) {
        return;
    }
    char swapped[128];
    int written = snprintf(swapped, sizeof(swapped), "%.*s,%.*s", (int)(close - comma - 1), comma + 1,
                           (int)(comma - (text->bytes + start)), text->bytes + start);
    if (written > 0 && (size_t)written < sizeof(swapped)) {
        text_replace(text, start, (size_t)(close - (text->bytes + start)), swapped, (size_t)written);
    }
}

static void mutate_number(text_buffer *text)
{
    static const char *const replacements[] = {
        "18446744073709551615", "18446744073709551616", "99999999999999999999999", "9223372036854775807",
        "9223372036854775808", "-1", "1e2", "0.5", "-0", "00", "1E400", "4294967296", "2147483648", "0", "1",
    };
    size_t digits[4096];
    size_t num_digits = 0;
    for (size_t i = 0; i < text->length && num_digits < 4096; i++) {
        if (text->bytes[i] >= '0' && text->bytes[i] <= '9' && (i == 0 || text->bytes[i - 1] < '0' ||
                                                                text->bytes[i - 1] > '9')) {
            digits[num_digits++] = i;
        }
    }
    if (num_digits == 0) {
        return;
    }
    size_t at = digits[rng_below(num_digits)];
    size_t end = at;
    while (end < text->length && text->bytes[end] >= '0' && text->bytes[end] <= '9') {
        end++;
    }
    const char *replacement = replacements[rng_below(sizeof(replacements) / sizeof(replacements[0]))];
    text_replace(text, at, end - at, replacement, strlen(replacement));
}

static void mutate_duplicate_entry(text_buffer *text)
{
    size_t start;
    if (!find_nth(text, "},\"", rng_below(7), &start)) {
        return;
    }
    start += 2;
    size_t end;
    char *next = strstr(text->bytes + start, "},\"");
    end = next == NULL ? text->length - 1 : (size_t)(next - text->bytes) + 1;
    size_t length = end - start;
    char *entry = malloc(length + 1);
    memcpy(entry, text->bytes + start, length);
    entry[0] = '"';
    if (length > 1 && rng_below(2) == 0) {
        entry[1] = 'z';
    }
    text_replace(text, end, 0, ",", 1);
    text_replace(text, end + 1, 0, entry, length);
    free(entry);
}

static void mutate_deep_nesting(text_buffer *text)
{
    size_t depth = 1 + rng_below(100);
    text_buffer nested = {0};
    text_append(&nested, "\"deep\":");
    for (size_t i = 0; i < depth; i++) {
        text_append(&nested, "[");
    }
    text_append(&nested, "1");
    for (size_t i = 0; i < depth; i++) {
        text_append(&nested, "]");
    }
    text_append(&nested, ",");
    size_t at = 0;
    size_t insert_at = find_nth(text, "{\"dtype\"", rng_below(7), &at) ? at + 1 : 1;
    text_replace(text, insert_at, 0, nested.bytes, nested.length);
    text_free(&nested);
}

static void mutate_text_bytes(text_buffer *text)
{
    static const char significant[] = "{}[]\",:\\ 0123456789-+.eEtrufalsn\x01\x1f\x7f\xc3\xa9\xed\xff";
    size_t kind = rng_below(5);
    size_t at = rng_below(text->length + 1);
    if (kind == 0 && text->length > 0) {
        text->bytes[rng_below(text->length)] = (char)rng_next();
    } else if (kind == 1 && text->length > 0) {
        text->bytes[rng_below(text->length)] ^= (char)(1u << rng_below(8));
    } else if (kind == 2) {
        char inserted = significant[rng_below(sizeof(significant) - 1)];
        text_replace(text, at, 0, &inserted, 1);
    } else if (kind == 3 && at < text->length) {
        size_t removed = 1 + rng_below(text->length - at);
        text_replace(text, at, removed > 8 ? rng_below(9) : removed, "", 0);
    } else {
        size_t digits = 0;
        for (size_t i = 0; i < text->length; i++) {
            digits += text->bytes[i] >= '0' && text->bytes[i] <= '9';
        }
        size_t target = rng_below(digits);
        for (size_t i = 0; i < text->length; i++) {
            if (text->bytes[i] >= '0' && text->bytes[i] <= '9' && target-- == 0) {
                text->bytes[i] = (char)('0' + rng_below(10));
                break;
            }
        }
    }
}

static void mutate_header(text_buffer *text)
{
    size_t rounds = 1 + rng_below(3);
    for (size_t r = 0; r < rounds; r++) {
        switch (rng_below(6)) {
        case 0:
            mutate_swap_offsets(text);
            break;
        case 1:
            mutate_number(text);
            break;
        case 2:
            mutate_duplicate_entry(text);
            break;
        case 3:
            mutate_deep_nesting(text);
            break;
        default:
            mutate_text_bytes(text);
            break;
        }
    }
}

static uint64_t mutated_length_prefix(uint64_t header_length, uint64_t data_size)
{
    switch (rng_below(8)) {
    case 0:
        return rng_next();
    case 1:
        return header_length + rng_below(9) - 4;
    case 2:
        return 0;
    case 3:
        return UINT64_MAX;
    case 4:
        return GLMRT_SAFETENSORS_MAX_HEADER_BYTES + 1;
    case 5:
        return header_length + data_size + 1 + rng_below(4);
    default:
        return header_length;
    }
}

static void run_mutation(const text_buffer *base_header, uint64_t data_size, int32_t iteration)
{
    text_buffer header = {0};
    text_append_bytes(&header, base_header->bytes, base_header->length);
    mutate_header(&header);
    uint64_t prefix = rng_below(4) == 0 ? mutated_length_prefix(header.length, data_size) : header.length;
    uint64_t data = data_size + BASE_DATA_SLACK;
    size_t size = 0;
    uint8_t *bytes = file_bytes(header.bytes, header.length, prefix, data, &size);
    if (rng_below(10) == 0) {
        size = rng_below(size + 1);
    }
    uint8_t *exact = malloc(size > 0 ? size : 1);
    memcpy(exact, bytes, size);
    free(bytes);
    glmrt_safetensors_file file;
    glmrt_error error;
    glmrt_error_clear(&error);
    glmrt_status status = glmrt_safetensors_parse(size > 0 ? exact : NULL, size, &file, &error);
    char label[64];
    snprintf(label, sizeof(label), "mutation %d", iteration);
    if (status == GLMRT_OK) {
        check_parsed_invariants(exact, size, &file, label);
    } else {
        check((status == GLMRT_ERR_FORMAT || status == GLMRT_ERR_OUT_OF_MEMORY) && error.message[0] != '\0' &&
                  file.tensors == NULL && file.num_tensors == 0,
              "%s: status %d with message \"%s\"", label, status, error.message);
    }
    glmrt_safetensors_close(&file);
    free(exact);
    text_free(&header);
}

static void run_mutations(void)
{
    spec_list *list = calloc(1, sizeof(spec_list));
    base_specs(list);
    text_buffer header = {0};
    uint64_t data_size = 0;
    header_for_specs(list->items, list->count, "{\"format\":\"pt\"}", &header, &data_size);
    rng_state = 0x9e3779b97f4a7c15ull;
    for (int32_t i = 0; i < NUM_MUTATIONS; i++) {
        run_mutation(&header, data_size, i);
    }
    text_free(&header);
    free(list);
}

typedef struct malformed_case {
    const char *label;
    const char *header;
    int64_t length_delta;
    uint64_t data_size;
    glmrt_status expected;
    const char *expected_text;
} malformed_case;

static const malformed_case malformed_cases[] = {
    {"header not an object", "[1,2]", 0, 0, GLMRT_ERR_FORMAT, "must be a JSON object"},
    {"invalid JSON", "{\"a\":", 0, 0, GLMRT_ERR_FORMAT, "not valid JSON"},
    {"trailing garbage", "{} x", 0, 0, GLMRT_ERR_FORMAT, "after the document"},
    {"unknown dtype", "{\"t\":{\"dtype\":\"F7\",\"shape\":[1],\"data_offsets\":[0,1]}}", 0, 1, GLMRT_ERR_FORMAT,
     "unknown dtype \"F7\""},
    {"dtype not a string", "{\"t\":{\"dtype\":4,\"shape\":[1],\"data_offsets\":[0,1]}}", 0, 1, GLMRT_ERR_FORMAT,
     "\"dtype\" must be a string"},
    {"missing dtype", "{\"t\":{\"shape\":[1],\"data_offsets\":[0,1]}}", 0, 1, GLMRT_ERR_FORMAT, "missing \"dtype\""},
    {"missing shape", "{\"t\":{\"dtype\":\"U8\",\"data_offsets\":[0,1]}}", 0, 1, GLMRT_ERR_FORMAT, "missing \"shape\""},
    {"missing offsets", "{\"t\":{\"dtype\":\"U8\",\"shape\":[1]}}", 0, 1, GLMRT_ERR_FORMAT, "missing \"data_offsets\""},
    {"entry not an object", "{\"t\":[1]}", 0, 0, GLMRT_ERR_FORMAT, "entry must be an object"},
    {"negative extent", "{\"t\":{\"dtype\":\"U8\",\"shape\":[-1],\"data_offsets\":[0,1]}}", 0, 1, GLMRT_ERR_FORMAT,
     "non-negative integers"},
    {"fractional extent", "{\"t\":{\"dtype\":\"U8\",\"shape\":[1.5],\"data_offsets\":[0,1]}}", 0, 1, GLMRT_ERR_FORMAT,
     "non-negative integers"},
    {"nine dimensions", "{\"t\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,1]}}", 0, 1,
     GLMRT_ERR_FORMAT, "9 dimensions"},
    {"element count overflow",
     "{\"t\":{\"dtype\":\"U8\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,0]}}", 0, 0, GLMRT_ERR_FORMAT,
     "overflows"},
    {"byte size overflow", "{\"t\":{\"dtype\":\"F64\",\"shape\":[4611686018427387904],\"data_offsets\":[0,0]}}", 0, 0,
     GLMRT_ERR_FORMAT, "overflows"},
    {"size mismatch", "{\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4]}}", 0, 8, GLMRT_ERR_FORMAT,
     "need 8 bytes"},
    {"begin after end", "{\"t\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[2,1]}}", 0, 4, GLMRT_ERR_FORMAT,
     "is after end"},
    {"end past data", "{\"t\":{\"dtype\":\"U8\",\"shape\":[8],\"data_offsets\":[0,8]}}", 0, 4, GLMRT_ERR_FORMAT,
     "past the end of the data section"},
    {"three offsets", "{\"t\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1,2]}}", 0, 4, GLMRT_ERR_FORMAT,
     "[begin, end]"},
    {"offset too large", "{\"t\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,18446744073709551616]}}", 0, 4,
     GLMRT_ERR_FORMAT, "non-negative integers"},
    {"overlapping ranges",
     "{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]},\"b\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[2,6]}}",
     0, 8, GLMRT_ERR_FORMAT, "overlapping"},
    {"duplicate name",
     "{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]},\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[4,8]}}",
     0, 8, GLMRT_ERR_FORMAT, "duplicate key \"a\""},
    {"metadata not an object", "{\"__metadata__\":\"x\"}", 0, 0, GLMRT_ERR_FORMAT, "\"__metadata__\" must be an object"},
    {"header length past end", "{}", 1, 0, GLMRT_ERR_FORMAT, "runs past the end"},
    {"deep nesting",
     "{\"a\":[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]}",
     0, 0, GLMRT_ERR_FORMAT, "nesting deeper than 64"},
};

static void check_malformed_cases(void)
{
    size_t count = sizeof(malformed_cases) / sizeof(malformed_cases[0]);
    for (size_t i = 0; i < count; i++) {
        const malformed_case *c = &malformed_cases[i];
        size_t header_length = strlen(c->header);
        size_t size = 0;
        uint8_t *bytes = file_bytes(c->header, header_length, (uint64_t)((int64_t)header_length + c->length_delta),
                                    c->data_size, &size);
        glmrt_safetensors_file file;
        glmrt_error error;
        glmrt_error_clear(&error);
        glmrt_status status = glmrt_safetensors_parse(bytes, size, &file, &error);
        check(status == c->expected && strstr(error.message, c->expected_text) != NULL,
              "%s: status %d (expected %d), message \"%s\" (expected to contain \"%s\")", c->label, status, c->expected,
              error.message, c->expected_text);
        glmrt_safetensors_close(&file);
        free(bytes);
    }
}

static void expect_prefix_failure(const uint8_t *bytes, size_t size, const char *expected_text, const char *label)
{
    uint8_t *exact = malloc(size > 0 ? size : 1);
    memcpy(exact, bytes, size);
    glmrt_safetensors_file file;
    glmrt_error error;
    glmrt_error_clear(&error);
    glmrt_status status = glmrt_safetensors_parse(size > 0 ? exact : NULL, size, &file, &error);
    check(status == GLMRT_ERR_FORMAT && strstr(error.message, expected_text) != NULL,
          "%s: status %d, message \"%s\"", label, status, error.message);
    free(exact);
}

static void check_length_prefix_cases(void)
{
    const uint8_t short_file[5] = {1, 0, 0, 0, 0};
    expect_prefix_failure(short_file, 5, "shorter than the 8-byte", "file shorter than 8 bytes");
    expect_prefix_failure(short_file, 0, "shorter than the 8-byte", "empty file");
    uint8_t zero_length[10] = {0, 0, 0, 0, 0, 0, 0, 0, '{', '}'};
    expect_prefix_failure(zero_length, 10, "header length is 0", "zero header length");
    uint8_t huge[10] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, '{', '}'};
    expect_prefix_failure(huge, 10, "exceeds the limit", "header length above the limit");
    uint8_t past_end[10] = {3, 0, 0, 0, 0, 0, 0, 0, '{', '}'};
    expect_prefix_failure(past_end, 10, "runs past the end", "header length past the end");
}

static glmrt_status json_parse_exact(const char *text, size_t length, glmrt_json_document *document,
                                     glmrt_error *error)
{
    char *exact = malloc(length > 0 ? length : 1);
    memcpy(exact, text, length);
    glmrt_status status = glmrt_json_parse(length > 0 ? exact : NULL, length, document, error);
    free(exact);
    return status;
}

static void json_expect_invalid(const char *text, size_t length, const char *expected_text)
{
    glmrt_json_document document;
    glmrt_error error;
    glmrt_error_clear(&error);
    glmrt_status status = json_parse_exact(text, length, &document, &error);
    check(status == GLMRT_ERR_FORMAT && strstr(error.message, expected_text) != NULL && document.root == NULL,
          "JSON %.*s is rejected with \"%s\" (got status %d, \"%s\")", (int)(length > 60 ? 60 : length), text,
          expected_text, status, error.message);
    glmrt_json_free(&document);
}

static const glmrt_json_value *json_expect_valid(const char *text, size_t length, glmrt_json_document *document)
{
    glmrt_error error;
    glmrt_error_clear(&error);
    glmrt_status status = json_parse_exact(text, length, document, &error);
    check(status == GLMRT_OK && document->root != NULL, "JSON %.*s parses (%s)", (int)(length > 60 ? 60 : length),
          text, error.message);
    return status == GLMRT_OK ? document->root : NULL;
}

static void check_json_structures(void)
{
    glmrt_json_document document;
    const char *text = " {\"a\" : [1, 2, {\"b\": null}], \"c\": \"x\", \"t\": true, \"f\": false} ";
    const glmrt_json_value *root = json_expect_valid(text, strlen(text), &document);
    if (root != NULL) {
        const glmrt_json_value *a = glmrt_json_object_find(root, "a");
        check(root->kind == GLMRT_JSON_OBJECT && root->num_items == 4, "object has 4 members");
        check(a != NULL && a->kind == GLMRT_JSON_ARRAY && a->num_items == 3, "array has 3 items");
        const glmrt_json_value *inner = glmrt_json_array_at(a, 2);
        const glmrt_json_value *b = glmrt_json_object_find(inner, "b");
        check(b != NULL && b->kind == GLMRT_JSON_NULL, "nested null found");
        check(glmrt_json_string_equals(glmrt_json_object_find(root, "c"), "x"), "string member found");
        check(glmrt_json_object_find(root, "t")->kind == GLMRT_JSON_TRUE, "true parsed");
        check(glmrt_json_object_find(root, "f")->kind == GLMRT_JSON_FALSE, "false parsed");
        check(glmrt_json_object_find(root, "missing") == NULL, "absent key gives NULL");
        check(strcmp(root->members[0].key, "a") == 0 && strcmp(root->members[3].key, "f") == 0,
              "members keep document order");
        check(glmrt_json_array_at(a, 3) == NULL, "array index past the end gives NULL");
    }
    glmrt_json_free(&document);
    glmrt_json_free(&document);
}

static void check_json_strings(void)
{
    glmrt_json_document document;
    const char *text = "\"\\u00e9\\ud83d\\ude00\\n\\\"\\\\\\/\\b\\f\\r\\t\\u0041\xc3\xa9\"";
    const glmrt_json_value *root = json_expect_valid(text, strlen(text), &document);
    const char expected[] = "\xc3\xa9\xf0\x9f\x98\x80\n\"\\/\b\f\r\tA\xc3\xa9";
    check(root != NULL && root->kind == GLMRT_JSON_STRING && root->string_length == sizeof(expected) - 1 &&
              memcmp(root->string, expected, sizeof(expected) - 1) == 0,
          "escapes and surrogate pairs decode to UTF-8");
    glmrt_json_free(&document);
    const char *nul_text = "{\"\\u0000\":1,\"\":2}";
    root = json_expect_valid(nul_text, strlen(nul_text), &document);
    check(root != NULL && glmrt_json_object_find_bytes(root, "\0", 1) != NULL &&
              glmrt_json_object_find(root, "") != NULL,
          "keys with NUL and empty keys are distinct");
    glmrt_json_free(&document);
}

static void check_json_numbers(void)
{
    static const struct {
        const char *text;
        int is_int64;
        int64_t value;
        double number;
    } cases[] = {
        {"0", 1, 0, 0.0},
        {"-0", 1, 0, 0.0},
        {"42", 1, 42, 42.0},
        {"9223372036854775807", 1, INT64_MAX, 9223372036854775807.0},
        {"-9223372036854775808", 1, INT64_MIN, -9223372036854775808.0},
        {"9223372036854775808", 0, 0, 9223372036854775808.0},
        {"1.0", 0, 0, 1.0},
        {"1e2", 0, 0, 100.0},
        {"-2.5E-1", 0, 0, -0.25},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        glmrt_json_document document;
        const glmrt_json_value *root = json_expect_valid(cases[i].text, strlen(cases[i].text), &document);
        int64_t value = 0;
        int is_int64 = root != NULL && glmrt_json_get_int64(root, &value);
        check(root != NULL && root->kind == GLMRT_JSON_NUMBER && is_int64 == cases[i].is_int64 &&
                  (!is_int64 || value == cases[i].value) && root->number == cases[i].number,
              "number %s parses with int64 %d", cases[i].text, cases[i].is_int64);
        glmrt_json_free(&document);
    }
    glmrt_json_document document;
    const glmrt_json_value *root = json_expect_valid("12", 1, &document);
    int64_t value = 0;
    check(root != NULL && glmrt_json_get_int64(root, &value) && value == 1, "parser stops at the given length");
    glmrt_json_free(&document);
}

static void check_json_depth(void)
{
    char text[300];
    for (int depth = 63; depth <= 66; depth++) {
        int n = 0;
        for (int i = 0; i < depth; i++) {
            text[n++] = '[';
        }
        for (int i = 0; i < depth; i++) {
            text[n++] = ']';
        }
        if (depth <= GLMRT_JSON_MAX_DEPTH) {
            glmrt_json_document document;
            check(json_expect_valid(text, (size_t)n, &document) != NULL, "depth %d accepted", depth);
            glmrt_json_free(&document);
        } else {
            json_expect_invalid(text, (size_t)n, "nesting deeper than 64");
        }
    }
}

static void check_json_invalid(void)
{
    static const struct {
        const char *text;
        const char *expected;
    } cases[] = {
        {"", "unexpected end"},
        {"  ", "unexpected end"},
        {"[1,]", "trailing comma"},
        {"{\"a\":1,}", "trailing comma"},
        {"01", "leading zeros"},
        {"-01", "leading zeros"},
        {"-", "needs digits"},
        {"1.", "decimal point"},
        {".5", "unexpected character"},
        {"1e", "exponent"},
        {"1e+", "exponent"},
        {"+1", "unexpected character"},
        {"[1 2]", "expected ','"},
        {"{\"a\" 1}", "expected ':'"},
        {"{a:1}", "string key"},
        {"\"abc", "unterminated string"},
        {"\"a\x01\"", "control character"},
        {"\"a\tb\"", "control character"},
        {"\"\\x\"", "invalid escape"},
        {"\"\\ud800\"", "high surrogate"},
        {"\"\\udc00\"", "low surrogate"},
        {"\"\\ud800\\u0041\"", "high surrogate"},
        {"\"\\ud800\\n\"", "high surrogate"},
        {"\"\\u12G4\"", "four hex digits"},
        {"\"\\u00\"", "four hex digits"},
        {"\"\\", "unterminated"},
        {"tru", "unexpected character"},
        {"nul", "unexpected character"},
        {"True", "unexpected character"},
        {"NaN", "unexpected character"},
        {"Infinity", "unexpected character"},
        {"[", "unexpected end"},
        {"{", "string key"},
        {"[1", "unterminated array"},
        {"{\"a\":1", "unterminated object"},
        {"{\"a\":1}x", "after the document"},
        {"[1]]", "after the document"},
        {"1 2", "after the document"},
        {"{\"a\":1,\"a\":2}", "duplicate key \"a\""},
        {"{\"b\":{\"k\":1,\"j\":2,\"k\":3}}", "duplicate key \"k\""},
        {"\xef\xbb\xbf{}", "unexpected character"},
        {"\"\xc0\xaf\"", "invalid UTF-8"},
        {"\"\xed\xa0\x80\"", "invalid UTF-8"},
        {"\"\xf5\x80\x80\x80\"", "invalid UTF-8"},
        {"\"\xc3\"", "invalid UTF-8"},
        {"\"\x80\"", "invalid UTF-8"},
        {"[1,,2]", "unexpected character"},
        {"[,1]", "unexpected character"},
        {"{,}", "string key"},
        {"'a'", "unexpected character"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        json_expect_invalid(cases[i].text, strlen(cases[i].text), cases[i].expected);
    }
    json_expect_invalid("[1]\x00", 4, "after the document");
    json_expect_invalid("[1]", 2, "unterminated array");
    json_expect_invalid("\"ab\"", 3, "unterminated string");
}

typedef struct tiny_model {
    glmrt_model_config config;
    glmrt_dtype linear_dtype;
    int32_t scale_mode;
} tiny_model;

enum { SCALE_NONE = 0, SCALE_CHANNEL = 1, SCALE_BLOCK = 2 };

static void tiny_config(glmrt_model_config *config)
{
    memset(config, 0, sizeof(*config));
    config->vocab_size = 8;
    config->hidden_size = 4;
    config->intermediate_size = 6;
    config->moe_intermediate_size = 3;
    config->num_hidden_layers = 2;
    config->num_attention_heads = 2;
    config->num_key_value_heads = 1;
    config->head_dim = 2;
    config->n_routed_experts = 2;
    config->n_shared_experts = 1;
    config->num_experts_per_tok = 1;
    config->first_k_dense_replace = 1;
    config->use_qk_norm = 1;
    config->attention_bias = 1;
    config->weight_block_rows = 2;
    config->weight_block_cols = 2;
}

static void add_linear(spec_list *list, const tiny_model *model, const char *base, int64_t rows, int64_t cols)
{
    char name[128];
    snprintf(name, sizeof(name), "%s.weight", base);
    spec_add(list, name, model->linear_dtype, 2, rows, cols);
    if (model->scale_mode == SCALE_CHANNEL) {
        snprintf(name, sizeof(name), "%s.weight_scale", base);
        spec_add(list, name, GLMRT_DTYPE_F32, 2, rows, 1);
    } else if (model->scale_mode == SCALE_BLOCK) {
        snprintf(name, sizeof(name), "%s.weight_scale_inv", base);
        int64_t br = model->config.weight_block_rows;
        int64_t bc = model->config.weight_block_cols;
        spec_add(list, name, GLMRT_DTYPE_F32, 2, (rows + br - 1) / br, (cols + bc - 1) / bc);
    }
}

static void add_layer_specs(spec_list *list, const tiny_model *model, int32_t layer)
{
    const glmrt_model_config *c = &model->config;
    char base[128];
    int64_t q = (int64_t)c->num_attention_heads * c->head_dim;
    int64_t kv = (int64_t)c->num_key_value_heads * c->head_dim;
    const struct {
        const char *stem;
        int64_t length;
    } vectors[] = {{"input_layernorm.weight", c->hidden_size}, {"post_attention_layernorm.weight", c->hidden_size},
                   {"self_attn.q_proj.bias", q}, {"self_attn.k_proj.bias", kv}, {"self_attn.v_proj.bias", kv},
                   {"self_attn.q_norm.weight", c->head_dim}, {"self_attn.k_norm.weight", c->head_dim}};
    for (size_t i = 0; i < sizeof(vectors) / sizeof(vectors[0]); i++) {
        snprintf(base, sizeof(base), "model.layers.%d.%s", layer, vectors[i].stem);
        spec_add(list, base, GLMRT_DTYPE_BF16, 1, vectors[i].length, 0);
    }
    const struct {
        const char *stem;
        int64_t rows;
        int64_t cols;
    } attention[] = {{"q_proj", q, c->hidden_size}, {"k_proj", kv, c->hidden_size}, {"v_proj", kv, c->hidden_size},
                     {"o_proj", c->hidden_size, q}};
    for (size_t i = 0; i < 4; i++) {
        snprintf(base, sizeof(base), "model.layers.%d.self_attn.%s", layer, attention[i].stem);
        add_linear(list, model, base, attention[i].rows, attention[i].cols);
    }
    if (layer < c->first_k_dense_replace) {
        snprintf(base, sizeof(base), "model.layers.%d.mlp.gate_proj", layer);
        add_linear(list, model, base, c->intermediate_size, c->hidden_size);
        snprintf(base, sizeof(base), "model.layers.%d.mlp.up_proj", layer);
        add_linear(list, model, base, c->intermediate_size, c->hidden_size);
        snprintf(base, sizeof(base), "model.layers.%d.mlp.down_proj", layer);
        add_linear(list, model, base, c->hidden_size, c->intermediate_size);
        return;
    }
    snprintf(base, sizeof(base), "model.layers.%d.mlp.gate.weight", layer);
    spec_add(list, base, GLMRT_DTYPE_BF16, 2, c->n_routed_experts, c->hidden_size);
    snprintf(base, sizeof(base), "model.layers.%d.mlp.gate.e_score_correction_bias", layer);
    spec_add(list, base, GLMRT_DTYPE_F32, 1, c->n_routed_experts, 0);
    for (int32_t e = 0; e < c->n_routed_experts; e++) {
        snprintf(base, sizeof(base), "model.layers.%d.mlp.experts.%d.gate_proj", layer, e);
        add_linear(list, model, base, c->moe_intermediate_size, c->hidden_size);
        snprintf(base, sizeof(base), "model.layers.%d.mlp.experts.%d.up_proj", layer, e);
        add_linear(list, model, base, c->moe_intermediate_size, c->hidden_size);
        snprintf(base, sizeof(base), "model.layers.%d.mlp.experts.%d.down_proj", layer, e);
        add_linear(list, model, base, c->hidden_size, c->moe_intermediate_size);
    }
    int64_t shared = (int64_t)c->moe_intermediate_size * c->n_shared_experts;
    snprintf(base, sizeof(base), "model.layers.%d.mlp.shared_experts.gate_proj", layer);
    add_linear(list, model, base, shared, c->hidden_size);
    snprintf(base, sizeof(base), "model.layers.%d.mlp.shared_experts.up_proj", layer);
    add_linear(list, model, base, shared, c->hidden_size);
    snprintf(base, sizeof(base), "model.layers.%d.mlp.shared_experts.down_proj", layer);
    add_linear(list, model, base, c->hidden_size, shared);
}

static void model_specs(spec_list *list, const tiny_model *model)
{
    list->count = 0;
    const glmrt_model_config *c = &model->config;
    spec_add(list, "model.embed_tokens.weight", GLMRT_DTYPE_BF16, 2, c->vocab_size, c->hidden_size);
    spec_add(list, "model.norm.weight", GLMRT_DTYPE_BF16, 1, c->hidden_size, 0);
    spec_add(list, "lm_head.weight", GLMRT_DTYPE_BF16, 2, c->vocab_size, c->hidden_size);
    for (int32_t layer = 0; layer < c->num_hidden_layers; layer++) {
        add_layer_specs(list, model, layer);
    }
}

static char work_dir[256];

static void write_bytes(const char *path, const void *bytes, size_t size)
{
    FILE *file = fopen(path, "wb");
    if (file == NULL || fwrite(bytes, 1, size, file) != size || fclose(file) != 0) {
        fprintf(stderr, "cannot write %s\n", path);
        exit(2);
    }
}

static void write_specs(const char *file_name, const tensor_spec *specs, int32_t count)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/%s", work_dir, file_name);
    size_t size = 0;
    uint8_t *bytes = file_for_specs(specs, count, &size);
    write_bytes(path, bytes, size);
    free(bytes);
}

static void clear_work_dir(void)
{
    DIR *dir = opendir(work_dir);
    if (dir == NULL) {
        return;
    }
    struct dirent *entry;
    char path[768];
    while ((entry = readdir(dir)) != NULL) {
        if (strcmp(entry->d_name, ".") != 0 && strcmp(entry->d_name, "..") != 0) {
            snprintf(path, sizeof(path), "%s/%s", work_dir, entry->d_name);
            unlink(path);
        }
    }
    closedir(dir);
}

static void write_index(const spec_list *list, int32_t split, const char *override_name, const char *override_file)
{
    text_buffer index = {0};
    text_append(&index, "{\"metadata\":{\"total_size\":0},\"weight_map\":{");
    for (int32_t i = 0; i < list->count; i++) {
        const char *file = i < split ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors";
        if (override_name != NULL && strcmp(list->items[i].name, override_name) == 0) {
            file = override_file;
        }
        text_append(&index, "%s\"%s\":\"%s\"", i > 0 ? "," : "", list->items[i].name, file);
    }
    text_append(&index, "}}");
    char path[512];
    snprintf(path, sizeof(path), "%s/model.safetensors.index.json", work_dir);
    write_bytes(path, index.bytes, index.length);
    text_free(&index);
}

static void write_sharded(const spec_list *list, int32_t split)
{
    write_specs("model-00001-of-00002.safetensors", list->items, split);
    write_specs("model-00002-of-00002.safetensors", list->items + split, list->count - split);
}

static glmrt_status open_and_bind(const glmrt_model_config *config, glmrt_checkpoint *checkpoint,
                                  glmrt_weights *weights, glmrt_error *error)
{
    glmrt_error_clear(error);
    memset(weights, 0, sizeof(*weights));
    glmrt_status status = glmrt_checkpoint_open(work_dir, checkpoint, error);
    if (status == GLMRT_OK) {
        status = glmrt_weights_bind(checkpoint, config, weights, error);
    }
    return status;
}

static void expect_bind_failure(const glmrt_model_config *config, glmrt_status expected, const char *text,
                                const char *label)
{
    glmrt_checkpoint checkpoint;
    glmrt_weights weights;
    glmrt_error error;
    glmrt_status status = open_and_bind(config, &checkpoint, &weights, &error);
    check(status == expected && strstr(error.message, text) != NULL,
          "%s: status %d (expected %d), message \"%s\" (expected to contain \"%s\")", label, status, expected,
          error.message, text);
    check(weights.layers == NULL, "%s: failed bind leaves no layers", label);
    glmrt_weights_free(&weights);
    glmrt_checkpoint_close(&checkpoint);
    clear_work_dir();
}

static void check_bind_bf16(void)
{
    tiny_model model = {.linear_dtype = GLMRT_DTYPE_BF16, .scale_mode = SCALE_NONE};
    tiny_config(&model.config);
    spec_list *list = calloc(1, sizeof(spec_list));
    model_specs(list, &model);
    spec_add(list, "model.layers.2.eh_proj.weight", GLMRT_DTYPE_BF16, 2, 4, 8);
    write_specs("model.safetensors", list->items, list->count);
    glmrt_checkpoint checkpoint;
    glmrt_weights weights;
    glmrt_error error;
    glmrt_status status = open_and_bind(&model.config, &checkpoint, &weights, &error);
    check(status == GLMRT_OK, "bf16 tiny model binds (%s)", error.message);
    if (status == GLMRT_OK) {
        check(checkpoint.num_files == 1 && checkpoint.num_tensors == list->count, "checkpoint counts its tensors");
        check(glmrt_checkpoint_find(&checkpoint, "no.such.tensor") == NULL, "absent tensor lookup gives NULL");
        check(weights.num_layers == 2 && !weights.layers[0].is_moe && weights.layers[1].is_moe,
              "layer 0 is dense and layer 1 is MoE");
        check(weights.layers[0].q_proj.rows == 4 && weights.layers[0].q_proj.cols == 4 &&
                  weights.layers[0].k_proj.rows == 2 && weights.layers[0].o_proj.cols == 4,
              "attention shapes follow the config");
        check(weights.layers[1].expert_down != NULL && weights.layers[1].expert_down[1].rows == 4 &&
                  weights.layers[1].expert_down[1].cols == 3 && weights.layers[1].shared_gate.rows == 3,
              "expert shapes follow the config");
        check(weights.layers[1].router.quant == GLMRT_QUANT_NONE && weights.layers[1].router_bias.length == 2 &&
                  weights.layers[1].router_bias.dtype == GLMRT_DTYPE_F32,
              "router and its bias bound");
        const glmrt_tensor *extra = glmrt_checkpoint_find(&checkpoint, "model.layers.2.eh_proj.weight");
        check(extra != NULL && weights.total_bytes == checkpoint.total_bytes - extra->nbytes,
              "bound bytes are all tensors except the ignored MTP one");
        check(weights.lm_head.data != weights.embed.data, "untied lm_head is its own tensor");
    }
    glmrt_weights_free(&weights);
    glmrt_weights_free(&weights);
    glmrt_checkpoint_close(&checkpoint);
    glmrt_checkpoint_close(&checkpoint);
    clear_work_dir();

    model_specs(list, &model);
    spec_remove(list, "model.layers.1.mlp.experts.1.down_proj.weight");
    write_specs("model.safetensors", list->items, list->count);
    expect_bind_failure(&model.config, GLMRT_ERR_MISSING_TENSOR, "model.layers.1.mlp.experts.1.down_proj.weight",
                        "missing expert tensor");

    model_specs(list, &model);
    list->items[spec_find(list, "model.layers.0.self_attn.q_proj.weight")].shape[0] = 6;
    write_specs("model.safetensors", list->items, list->count);
    expect_bind_failure(&model.config, GLMRT_ERR_FORMAT,
                        "model.layers.0.self_attn.q_proj.weight has shape [6, 4], expected [4, 4]", "wrong shape");

    model_specs(list, &model);
    list->items[spec_find(list, "model.norm.weight")].dtype = GLMRT_DTYPE_I32;
    write_specs("model.safetensors", list->items, list->count);
    expect_bind_failure(&model.config, GLMRT_ERR_FORMAT, "model.norm.weight has dtype I32", "wrong dtype");

    model_specs(list, &model);
    list->items[spec_find(list, "model.embed_tokens.weight")].dtype = GLMRT_DTYPE_F8_E4M3;
    write_specs("model.safetensors", list->items, list->count);
    expect_bind_failure(&model.config, GLMRT_ERR_FORMAT, "model.embed_tokens.weight has dtype F8_E4M3",
                        "fp8 embedding");

    model_specs(list, &model);
    spec_remove(list, "lm_head.weight");
    write_specs("model.safetensors", list->items, list->count);
    expect_bind_failure(&model.config, GLMRT_ERR_MISSING_TENSOR, "lm_head.weight", "untied lm_head missing");

    model.config.tie_word_embeddings = 1;
    write_specs("model.safetensors", list->items, list->count);
    status = open_and_bind(&model.config, &checkpoint, &weights, &error);
    check(status == GLMRT_OK && weights.lm_head.data == weights.embed.data, "tied lm_head uses the embedding (%s)",
          error.message);
    glmrt_weights_free(&weights);
    glmrt_checkpoint_close(&checkpoint);
    clear_work_dir();
    free(list);
}

static void check_bind_fp8(void)
{
    tiny_model model = {.linear_dtype = GLMRT_DTYPE_F8_E4M3, .scale_mode = SCALE_CHANNEL};
    tiny_config(&model.config);
    spec_list *list = calloc(1, sizeof(spec_list));
    model_specs(list, &model);
    write_specs("model.safetensors", list->items, list->count);
    glmrt_checkpoint checkpoint;
    glmrt_weights weights;
    glmrt_error error;
    glmrt_status status = open_and_bind(&model.config, &checkpoint, &weights, &error);
    check(status == GLMRT_OK, "fp8 channel model binds (%s)", error.message);
    if (status == GLMRT_OK) {
        const glmrt_linear *q = &weights.layers[0].q_proj;
        check(q->quant == GLMRT_QUANT_FP8_CHANNEL && q->scale_rows == 4 && q->scale_cols == 1 &&
                  q->scale_dtype == GLMRT_DTYPE_F32 && q->scale != NULL,
              "fp8 channel scale bound");
        check(weights.layers[1].expert_up[0].quant == GLMRT_QUANT_FP8_CHANNEL, "expert is fp8 channel");
        check(weights.total_bytes == checkpoint.total_bytes, "bound bytes count weights and scales");
    }
    glmrt_weights_free(&weights);
    glmrt_checkpoint_close(&checkpoint);
    clear_work_dir();

    spec_remove(list, "model.layers.0.self_attn.v_proj.weight_scale");
    write_specs("model.safetensors", list->items, list->count);
    expect_bind_failure(&model.config, GLMRT_ERR_MISSING_TENSOR, "FP8 weight model.layers.0.self_attn.v_proj.weight",
                        "fp8 weight without scale");

    model.scale_mode = SCALE_BLOCK;
    model.config.weight_quant = GLMRT_QUANT_FP8_BLOCK;
    model_specs(list, &model);
    write_specs("model.safetensors", list->items, list->count);
    status = open_and_bind(&model.config, &checkpoint, &weights, &error);
    check(status == GLMRT_OK, "fp8 block model binds (%s)", error.message);
    if (status == GLMRT_OK) {
        const glmrt_linear *down = &weights.layers[0].mlp_down;
        check(down->quant == GLMRT_QUANT_FP8_BLOCK && down->scale_rows == 2 && down->scale_cols == 3 &&
                  down->block_rows == 2 && down->block_cols == 2,
              "fp8 block scale shape is ceil(rows/2) x ceil(cols/2)");
    }
    glmrt_weights_free(&weights);
    glmrt_checkpoint_close(&checkpoint);
    clear_work_dir();

    list->items[spec_find(list, "model.layers.1.mlp.experts.0.down_proj.weight_scale_inv")].shape[1] = 1;
    write_specs("model.safetensors", list->items, list->count);
    expect_bind_failure(&model.config, GLMRT_ERR_FORMAT,
                        "model.layers.1.mlp.experts.0.down_proj.weight_scale_inv has shape [2, 1], expected [2, 2]",
                        "wrong block scale shape");
    free(list);
}

static void check_sharded(void)
{
    tiny_model model = {.linear_dtype = GLMRT_DTYPE_BF16, .scale_mode = SCALE_NONE};
    tiny_config(&model.config);
    spec_list *list = calloc(1, sizeof(spec_list));
    model_specs(list, &model);
    int32_t split = list->count / 2;
    write_sharded(list, split);
    write_index(list, split, NULL, NULL);
    glmrt_checkpoint checkpoint;
    glmrt_weights weights;
    glmrt_error error;
    glmrt_status status = open_and_bind(&model.config, &checkpoint, &weights, &error);
    check(status == GLMRT_OK && checkpoint.num_files == 2 && checkpoint.num_tensors == list->count,
          "sharded checkpoint binds (%s)", error.message);
    if (status == GLMRT_OK) {
        const glmrt_tensor *first = glmrt_checkpoint_find(&checkpoint, list->items[0].name);
        const glmrt_tensor *last = glmrt_checkpoint_find(&checkpoint, list->items[list->count - 1].name);
        check(first != NULL && last != NULL && first->file_index == 0 && last->file_index == 1,
              "tensors resolve to their shard");
    }
    glmrt_weights_free(&weights);
    glmrt_checkpoint_close(&checkpoint);
    clear_work_dir();

    write_sharded(list, split);
    write_index(list, split, list->items[3].name, "absent.safetensors");
    expect_bind_failure(&model.config, GLMRT_ERR_IO, "absent.safetensors", "index names a missing shard");

    write_sharded(list, split);
    write_index(list, split, list->items[3].name, "model-00002-of-00002.safetensors");
    expect_bind_failure(&model.config, GLMRT_ERR_MISSING_TENSOR, list->items[3].name, "index names the wrong shard");

    write_sharded(list, split);
    write_specs("model-00002-of-00002.safetensors", list->items + split - 1, list->count - split + 1);
    write_index(list, split, NULL, NULL);
    expect_bind_failure(&model.config, GLMRT_ERR_FORMAT, "appears in both", "tensor in two shards");

    write_sharded(list, split);
    write_index(list, split, list->items[0].name, "../model-00001-of-00002.safetensors");
    expect_bind_failure(&model.config, GLMRT_ERR_FORMAT, "not a plain file name", "shard outside the directory");

    char path[512];
    snprintf(path, sizeof(path), "%s/model.safetensors.index.json", work_dir);
    write_bytes(path, "{\"weight_map\":{\"a\":\"b\",}}", 25);
    expect_bind_failure(&model.config, GLMRT_ERR_FORMAT, "trailing comma", "invalid index JSON");

    expect_bind_failure(&model.config, GLMRT_ERR_IO, work_dir, "empty directory");
    free(list);
}

static void check_checkpoints(void)
{
    const char *tmp = getenv("TMPDIR");
    snprintf(work_dir, sizeof(work_dir), "%s/glmrt-checkpoint-XXXXXX", tmp != NULL && tmp[0] != '\0' ? tmp : "/tmp");
    if (mkdtemp(work_dir) == NULL) {
        check(0, "cannot create a temporary directory");
        return;
    }
    check_bind_bf16();
    check_bind_fp8();
    check_sharded();
    clear_work_dir();
    rmdir(work_dir);
}

int main(void)
{
    check_valid_base();
    check_length_prefix_cases();
    check_malformed_cases();
    check_json_structures();
    check_json_strings();
    check_json_numbers();
    check_json_depth();
    check_json_invalid();
    run_mutations();
    check_checkpoints();
    printf("%d passed, %d failed\n", checks_passed, checks_failed);
    return checks_failed == 0 ? 0 : 1;
}
