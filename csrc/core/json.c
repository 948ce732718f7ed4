#include "json.h"

#include <stdalign.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ARENA_BLOCK_BYTES ((size_t)64 * 1024)
#define NUMBER_SCRATCH_BYTES 128
#define SHOWN_KEY_BYTES 160

struct glmrt_json_arena_block {
    glmrt_json_arena_block *next;
    size_t used;
    size_t capacity;
    alignas(max_align_t) unsigned char data[];
};

typedef struct json_parser {
    const unsigned char *text;
    size_t length;
    size_t pos;
    glmrt_json_document *document;
    glmrt_error *error;
    glmrt_json_value *values;
    size_t num_values;
    size_t values_capacity;
    glmrt_json_member *members;
    size_t num_members;
    size_t members_capacity;
    size_t values_parsed;
} json_parser;

static void *arena_alloc(glmrt_json_document *document, size_t bytes)
{
    size_t align = alignof(max_align_t);
    size_t rounded = (bytes + align - 1) & ~(align - 1);
    if (rounded < bytes) {
        return NULL;
    }
    glmrt_json_arena_block *block = document->blocks;
    if (block == NULL || block->capacity - block->used < rounded) {
        size_t capacity = rounded > ARENA_BLOCK_BYTES ? rounded : ARENA_BLOCK_BYTES;
        if (capacity > SIZE_MAX - sizeof(glmrt_json_arena_block)) {
            return NULL;
        }
        glmrt_json_arena_block *fresh = malloc(sizeof(glmrt_json_arena_block) + capacity);
        if (fresh == NULL) {
            return NULL;
        }
        fresh->used = 0;
        fresh->capacity = capacity;
        if (block != NULL && rounded > ARENA_BLOCK_BYTES) {
            fresh->next = block->next;
            block->next = fresh;
        } else {
            fresh->next = block;
            document->blocks = fresh;
        }
        block = fresh;
    }
    void *result = block->data + block->used;
    block->used += rounded;
    return result;
}

void glmrt_json_free(glmrt_json_document *document)
{
    if (document == NULL) {
        return;
    }
    glmrt_json_arena_block *block = document->blocks;
    while (block != NULL) {
        glmrt_json_arena_block *next = block->next;
        free(block);
        block = next;
    }
    document->blocks = NULL;
    document->root = NULL;
}

static glmrt_status parser_fail(json_parser *parser, size_t offset, const char *reason)
{
    return glmrt_error_set(parser->error, GLMRT_ERR_FORMAT, "invalid JSON at byte %zu: %s", offset, reason);
}

static glmrt_status parser_out_of_memory(json_parser *parser)
{
    return glmrt_error_set(parser->error, GLMRT_ERR_OUT_OF_MEMORY, "out of memory while parsing JSON");
}

static void shown_bytes(const char *bytes, size_t length, char *out, size_t capacity)
{
    size_t n = 0;
    for (size_t i = 0; i < length && n + 1 < capacity; i++) {
        unsigned char c = (unsigned char)bytes[i];
        out[n++] = (c >= 0x20 && c < 0x7f) ? (char)c : '?';
    }
    out[n] = '\0';
}

static void skip_whitespace(json_parser *parser)
{
    while (parser->pos < parser->length) {
        unsigned char c = parser->text[parser->pos];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r') {
            return;
        }
        parser->pos++;
    }
}

static int has_byte(const json_parser *parser)
{
    return parser->pos < parser->length;
}

static unsigned char peek_byte(const json_parser *parser)
{
    return parser->text[parser->pos];
}

static int is_digit(unsigned char c)
{
    return c >= '0' && c <= '9';
}

static glmrt_status push_value(json_parser *parser, const glmrt_json_value *value)
{
    if (parser->num_values == parser->values_capacity) {
        size_t capacity = parser->values_capacity == 0 ? 64 : parser->values_capacity * 2;
        glmrt_json_value *grown = realloc(parser->values, capacity * sizeof(*grown));
        if (grown == NULL) {
            return parser_out_of_memory(parser);
        }
        parser->values = grown;
        parser->values_capacity = capacity;
    }
    parser->values[parser->num_values++] = *value;
    return GLMRT_OK;
}

static glmrt_status push_member(json_parser *parser, const char *key, size_t key_length,
                                const glmrt_json_value *value)
{
    if (parser->num_members == parser->members_capacity) {
        size_t capacity = parser->members_capacity == 0 ? 64 : parser->members_capacity * 2;
        glmrt_json_member *grown = realloc(parser->members, capacity * sizeof(*grown));
        if (grown == NULL) {
            return parser_out_of_memory(parser);
        }
        parser->members = grown;
        parser->members_capacity = capacity;
    }
    glmrt_json_member *member = &parser->members[parser->num_members++];
    member->key = key;
    member->key_length = key_length;
    member->value = *value;
    return GLMRT_OK;
}

static int hex_digit_value(unsigned char c)
{
    if (c >= '0' && c <= '9') {
        return c - '0';
    }
    if (c >= 'a' && c <= 'f') {
        return c - 'a' + 10;
    }
    if (c >= 'A' && c <= 'F') {
        return c - 'A' + 10;
    }
    return -1;
}

static int read_hex4(json_parser *parser, size_t at, uint32_t *out_unit)
{
    if (at > parser->length || parser->length - at < 4) {
        return 0;
    }
    uint32_t unit = 0;
    for (size_t i = 0; i < 4; i++) {
        int digit = hex_digit_value(parser->text[at + i]);
        if (digit < 0) {
            return 0;
        }
        unit = unit * 16 + (uint32_t)digit;
    }
    *out_unit = unit;
    return 1;
}

static size_t utf8_encode(uint32_t code_point, char *out)
{
    if (code_point < 0x80) {
        out[0] = (char)code_point;
        return 1;
    }
    if (code_point < 0x800) {
        out[0] = (char)(0xc0 | (code_point >> 6));
        out[1] = (char)(0x80 | (code_point & 0x3f));
        return 2;
    }
    if (code_point < 0x10000) {
        out[0] = (char)(0xe0 | (code_point >> 12));
        out[1] = (char)(0x80 | ((code_point >> 6) & 0x3f));
        out[2] = (char)(0x80 | (code_point & 0x3f));
        return 3;
    }
    out[0] = (char)(0xf0 | (code_point >> 18));
    out[1] = (char)(0x80 | ((code_point >> 12) & 0x3f));
    out[2] = (char)(0x80 | ((code_point >> 6) & 0x3f));
    out[3] = (char)(0x80 | (code_point & 0x3f));
    return 4;
}

static size_t utf8_sequence_length(const unsigned char *bytes, size_t available)
{
    unsigned char lead = bytes[0];
    size_t length;
    uint32_t minimum;
    uint32_t code_point;
    if (lead >= 0xc2 && lead <= 0xdf) {
        length = 2;
        minimum = 0x80;
        code_point = lead & 0x1f;
    } else if (lead >= 0xe0 && lead <= 0xef) {
        length = 3;
        minimum = 0x800;
        code_point = lead & 0x0f;
    } else if (lead >= 0xf0 && lead <= 0xf4) {
        length = 4;
        minimum = 0x10000;
        code_point = lead & 0x07;
    } else {
        return 0;
    }
    if (available < length) {
        return 0;
    }
    for (size_t i = 1; i < length; i++) {
        if ((bytes[i] & 0xc0) != 0x80) {
            return 0;
        }
        code_point = (code_point << 6) | (bytes[i] & 0x3f);
    }
    if (code_point < minimum || code_point > 0x10ffff || (code_point >= 0xd800 && code_point <= 0xdfff)) {
        return 0;
    }
    return length;
}

static glmrt_status decode_escape(json_parser *parser, size_t *at, char *out, size_t *out_length)
{
    size_t escape_at = *at;
    if (escape_at + 1 >= parser->length) {
        return parser_fail(parser, escape_at, "unterminated escape sequence");
    }
    unsigned char kind = parser->text[escape_at + 1];
    const char simple_from[] = "\"\\/bfnrt";
    const char simple_to[] = "\"\\/\b\f\n\r\t";
    const char *found = kind != '\0' ? strchr(simple_from, kind) : NULL;
    if (found != NULL) {
        out[0] = simple_to[found - simple_from];
        *out_length = 1;
        *at = escape_at + 2;
        return GLMRT_OK;
    }
    if (kind != 'u') {
        return parser_fail(parser, escape_at, "invalid escape sequence");
    }
    uint32_t unit;
    if (!read_hex4(parser, escape_at + 2, &unit)) {
        return parser_fail(parser, escape_at, "\\u escape needs four hex digits");
    }
    size_t next = escape_at + 6;
    uint32_t code_point = unit;
    if (unit >= 0xdc00 && unit <= 0xdfff) {
        return parser_fail(parser, escape_at, "unpaired UTF-16 low surrogate");
    }
    if (unit >= 0xd800 && unit <= 0xdbff) {
        uint32_t low;
        if (next + 1 >= parser->length || parser->text[next] != '\\' || parser->text[next + 1] != 'u' ||
            !read_hex4(parser, next + 2, &low) || low < 0xdc00 || low > 0xdfff) {
            return parser_fail(parser, escape_at, "UTF-16 high surrogate not followed by a low surrogate");
        }
        code_point = 0x10000 + ((unit - 0xd800) << 10) + (low - 0xdc00);
        next += 6;
    }
    *out_length = utf8_encode(code_point, out);
    *at = next;
    return GLMRT_OK;
}

static glmrt_status parse_string(json_parser *parser, const char **out_text, size_t *out_length)
{
    size_t start = parser->pos + 1;
    size_t end = start;
    while (end < parser->length && parser->text[end] != '"') {
        end += parser->text[end] == '\\' ? 2 : 1;
    }
    if (end >= parser->length) {
        return parser_fail(parser, parser->pos, "unterminated string");
    }
    char *decoded = arena_alloc(parser->document, end - start + 1);
    if (decoded == NULL) {
        return parser_out_of_memory(parser);
    }
    size_t length = 0;
    size_t at = start;
    while (at < end) {
        unsigned char c = parser->text[at];
        if (c < 0x20) {
            return parser_fail(parser, at, "control character inside a string");
        }
        if (c == '\\') {
            size_t written = 0;
            glmrt_status status = decode_escape(parser, &at, decoded + length, &written);
            if (status != GLMRT_OK) {
                return status;
            }
            length += written;
        } else if (c < 0x80) {
            decoded[length++] = (char)c;
            at++;
        } else {
            size_t sequence = utf8_sequence_length(parser->text + at, end - at);
            if (sequence == 0) {
                return parser_fail(parser, at, "invalid UTF-8 inside a string");
            }
            memcpy(decoded + length, parser->text + at, sequence);
            length += sequence;
            at += sequence;
        }
    }
    decoded[length] = '\0';
    parser->pos = end + 1;
    *out_text = decoded;
    *out_length = length;
    return GLMRT_OK;
}

static size_t scan_digits(json_parser *parser, size_t at)
{
    while (at < parser->length && is_digit(parser->text[at])) {
        at++;
    }
    return at;
}

static int integer_from_digits(const unsigned char *digits, size_t count, int negative, int64_t *out)
{
    uint64_t limit = negative ? (uint64_t)INT64_MAX + 1u : (uint64_t)INT64_MAX;
    uint64_t magnitude = 0;
    for (size_t i = 0; i < count; i++) {
        uint64_t digit = (uint64_t)(digits[i] - '0');
        if (magnitude > (limit - digit) / 10) {
            return 0;
        }
        magnitude = magnitude * 10 + digit;
    }
    if (negative) {
        *out = magnitude == (uint64_t)INT64_MAX + 1u ? INT64_MIN : -(int64_t)magnitude;
    } else {
        *out = (int64_t)magnitude;
    }
    return 1;
}

static glmrt_status number_to_double(json_parser *parser, size_t start, size_t end, double *out)
{
    size_t length = end - start;
    char local[NUMBER_SCRATCH_BYTES];
    char *copy = length < sizeof(local) ? local : malloc(length + 1);
    if (copy == NULL) {
        return parser_out_of_memory(parser);
    }
    memcpy(copy, parser->text + start, length);
    copy[length] = '\0';
    *out = strtod(copy, NULL);
    if (copy != local) {
        free(copy);
    }
    return GLMRT_OK;
}

static glmrt_status parse_number(json_parser *parser, glmrt_json_value *out)
{
    size_t start = parser->pos;
    size_t at = start;
    int negative = 0;
    if (parser->text[at] == '-') {
        negative = 1;
        at++;
    }
    if (at >= parser->length || !is_digit(parser->text[at])) {
        return parser_fail(parser, start, "a number needs digits");
    }
    size_t integer_start = at;
    if (parser->text[at] == '0') {
        at++;
        if (at < parser->length && is_digit(parser->text[at])) {
            return parser_fail(parser, start, "leading zeros are not allowed in numbers");
        }
    } else {
        at = scan_digits(parser, at);
    }
    size_t integer_end = at;
    int plain_integer = 1;
    if (at < parser->length && parser->text[at] == '.') {
        plain_integer = 0;
        size_t fraction_start = at + 1;
        at = scan_digits(parser, fraction_start);
        if (at == fraction_start) {
            return parser_fail(parser, start, "a decimal point must be followed by digits");
        }
    }
    if (at < parser->length && (parser->text[at] == 'e' || parser->text[at] == 'E')) {
        plain_integer = 0;
        at++;
        if (at < parser->length && (parser->text[at] == '+' || parser->text[at] == '-')) {
            at++;
        }
        size_t exponent_start = at;
        at = scan_digits(parser, exponent_start);
        if (at == exponent_start) {
            return parser_fail(parser, start, "an exponent must have digits");
        }
    }
    memset(out, 0, sizeof(*out));
    out->kind = GLMRT_JSON_NUMBER;
    out->source_offset = start;
    if (plain_integer) {
        out->is_int64 = integer_from_digits(parser->text + integer_start, integer_end - integer_start, negative,
                                            &out->int64_value);
    }
    glmrt_status status = number_to_double(parser, start, at, &out->number);
    parser->pos = at;
    return status;
}

static glmrt_status parse_literal(json_parser *parser, const char *word, glmrt_json_kind kind,
                                  glmrt_json_value *out)
{
    size_t length = strlen(word);
    if (parser->length - parser->pos < length || memcmp(parser->text + parser->pos, word, length) != 0) {
        return parser_fail(parser, parser->pos, "unexpected character");
    }
    memset(out, 0, sizeof(*out));
    out->kind = kind;
    out->source_offset = parser->pos;
    parser->pos += length;
    return GLMRT_OK;
}

static glmrt_status parse_value(json_parser *parser, int32_t depth, glmrt_json_value *out);

static int compare_members_by_key(const void *left, const void *right)
{
    const glmrt_json_member *a = *(const glmrt_json_member *const *)left;
    const glmrt_json_member *b = *(const glmrt_json_member *const *)right;
    size_t shorter = a->key_length < b->key_length ? a->key_length : b->key_length;
    int order = shorter == 0 ? 0 : memcmp(a->key, b->key, shorter);
    if (order != 0) {
        return order;
    }
    return (a->key_length > b->key_length) - (a->key_length < b->key_length);
}

static glmrt_status finish_array(json_parser *parser, size_t first, glmrt_json_value *out)
{
    size_t count = parser->num_values - first;
    out->num_items = count;
    if (count > 0) {
        out->items = arena_alloc(parser->document, count * sizeof(glmrt_json_value));
        if (out->items == NULL) {
            return parser_out_of_memory(parser);
        }
        memcpy(out->items, parser->values + first, count * sizeof(glmrt_json_value));
    }
    parser->num_values = first;
    return GLMRT_OK;
}

static glmrt_status finish_object(json_parser *parser, size_t first, glmrt_json_value *out)
{
    size_t count = parser->num_members - first;
    out->num_items = count;
    parser->num_members = first;
    if (count == 0) {
        return GLMRT_OK;
    }
    out->members = arena_alloc(parser->document, count * sizeof(glmrt_json_member));
    out->members_by_key = arena_alloc(parser->document, count * sizeof(glmrt_json_member *));
    if (out->members == NULL || out->members_by_key == NULL) {
        return parser_out_of_memory(parser);
    }
    memcpy(out->members, parser->members + first, count * sizeof(glmrt_json_member));
    for (size_t i = 0; i < count; i++) {
        out->members_by_key[i] = &out->members[i];
    }
    qsort(out->members_by_key, count, sizeof(glmrt_json_member *), compare_members_by_key);
    for (size_t i = 1; i < count; i++) {
        if (compare_members_by_key(&out->members_by_key[i - 1], &out->members_by_key[i]) == 0) {
            char shown[SHOWN_KEY_BYTES];
            shown_bytes(out->members_by_key[i]->key, out->members_by_key[i]->key_length, shown, sizeof(shown));
            return glmrt_error_set(parser->error, GLMRT_ERR_FORMAT,
                                   "invalid JSON at byte %zu: duplicate key \"%s\" in object", out->source_offset,
                                   shown);
        }
    }
    return GLMRT_OK;
}

static glmrt_status parse_array(json_parser *parser, int32_t depth, glmrt_json_value *out)
{
    memset(out, 0, sizeof(*out));
    out->kind = GLMRT_JSON_ARRAY;
    out->source_offset = parser->pos;
    if (depth > GLMRT_JSON_MAX_DEPTH) {
        return parser_fail(parser, parser->pos, "nesting deeper than 64 levels");
    }
    size_t first = parser->num_values;
    parser->pos++;
    skip_whitespace(parser);
    if (has_byte(parser) && peek_byte(parser) == ']') {
        parser->pos++;
        return GLMRT_OK;
    }
    for (;;) {
        glmrt_json_value item;
        glmrt_status status = parse_value(parser, depth, &item);
        if (status == GLMRT_OK) {
            status = push_value(parser, &item);
        }
        if (status != GLMRT_OK) {
            return status;
        }
        skip_whitespace(parser);
        if (!has_byte(parser)) {
            return parser_fail(parser, parser->pos, "unterminated array");
        }
        unsigned char c = peek_byte(parser);
        parser->pos++;
        if (c == ']') {
            return finish_array(parser, first, out);
        }
        if (c != ',') {
            return parser_fail(parser, parser->pos - 1, "expected ',' or ']' in array");
        }
        skip_whitespace(parser);
        if (has_byte(parser) && peek_byte(parser) == ']') {
            return parser_fail(parser, parser->pos, "trailing comma in array");
        }
    }
}

static glmrt_status parse_member(json_parser *parser, int32_t depth)
{
    skip_whitespace(parser);
    if (!has_byte(parser) || peek_byte(parser) != '"') {
        return parser_fail(parser, parser->pos, "expected a string key in object");
    }
    const char *key;
    size_t key_length;
    glmrt_status status = parse_string(parser, &key, &key_length);
    if (status != GLMRT_OK) {
        return status;
    }
    skip_whitespace(parser);
    if (!has_byte(parser) || peek_byte(parser) != ':') {
        return parser_fail(parser, parser->pos, "expected ':' after object key");
    }
    parser->pos++;
    glmrt_json_value value;
    status = parse_value(parser, depth, &value);
    if (status != GLMRT_OK) {
        return status;
    }
    return push_member(parser, key, key_length, &value);
}

static glmrt_status parse_object(json_parser *parser, int32_t depth, glmrt_json_value *out)
{
    memset(out, 0, sizeof(*out));
    out->kind = GLMRT_JSON_OBJECT;
    out->source_offset = parser->pos;
    if (depth > GLMRT_JSON_MAX_DEPTH) {
        return parser_fail(parser, parser->pos, "nesting deeper than 64 levels");
    }
    size_t first = parser->num_members;
    parser->pos++;
    skip_whitespace(parser);
    if (has_byte(parser) && peek_byte(parser) == '}') {
        parser->pos++;
        return GLMRT_OK;
    }
    for (;;) {
        glmrt_status status = parse_member(parser, depth);
        if (status != GLMRT_OK) {
            return status;
        }
        skip_whitespace(parser);
        if (!has_byte(parser)) {
            return parser_fail(parser, parser->pos, "unterminated object");
        }
        unsigned char c = peek_byte(parser);
        parser->pos++;
        if (c == '}') {
            return finish_object(parser, first, out);
        }
        if (c != ',') {
            return parser_fail(parser, parser->pos - 1, "expected ',' or '}' in object");
        }
        skip_whitespace(parser);
        if (has_byte(parser) && peek_byte(parser) == '}') {
            return parser_fail(parser, parser->pos, "trailing comma in object");
        }
    }
}

static glmrt_status parse_value(json_parser *parser, int32_t depth, glmrt_json_value *out)
{
    skip_whitespace(parser);
    if (!has_byte(parser)) {
        return parser_fail(parser, parser->pos, "unexpected end of input, expected a value");
    }
    parser->values_parsed += 1;
    if (parser->values_parsed > GLMRT_JSON_MAX_VALUES) {
        return glmrt_error_set(parser->error, GLMRT_ERR_FORMAT, "invalid JSON at byte %zu: more than %d values",
                               parser->pos, GLMRT_JSON_MAX_VALUES);
    }
    unsigned char c = peek_byte(parser);
    switch (c) {
    case '{':
        return parse_object(parser, depth + 1, out);
    case '[':
        return parse_array(parser, depth + 1, out);
    case '"':
        memset(out, 0, sizeof(*out));
        out->kind = GLMRT_JSON_STRING;
        out->source_offset = parser->pos;
        return parse_string(parser, &out->string, &out->string_length);
    case 't':
        return parse_literal(parser, "true", GLMRT_JSON_TRUE, out);
    case 'f':
        return parse_literal(parser, "false", GLMRT_JSON_FALSE, out);
    case 'n':
        return parse_literal(parser, "null", GLMRT_JSON_NULL, out);
    default:
        if (c == '-' || is_digit(c)) {
            return parse_number(parser, out);
        }
        return parser_fail(parser, parser->pos, "unexpected character, expected a value");
    }
}

static glmrt_status parse_document(json_parser *parser)
{
    glmrt_json_value root;
    glmrt_status status = parse_value(parser, 0, &root);
    if (status != GLMRT_OK) {
        return status;
    }
    skip_whitespace(parser);
    if (has_byte(parser)) {
        return parser_fail(parser, parser->pos, "unexpected characters after the document");
    }
    parser->document->root = arena_alloc(parser->document, sizeof(glmrt_json_value));
    if (parser->document->root == NULL) {
        return parser_out_of_memory(parser);
    }
    *parser->document->root = root;
    return GLMRT_OK;
}

glmrt_status glmrt_json_parse(const char *text, size_t length, glmrt_json_document *out, glmrt_error *error)
{
    if (out == NULL || (text == NULL && length > 0)) {
        return glmrt_error_set(error, GLMRT_ERR_INVALID_ARGUMENT, "glmrt_json_parse: null argument");
    }
    memset(out, 0, sizeof(*out));
    json_parser parser;
    memset(&parser, 0, sizeof(parser));
    parser.text = (const unsigned char *)text;
    parser.length = length;
    parser.document = out;
    parser.error = error;
    glmrt_status status = parse_document(&parser);
    free(parser.values);
    free(parser.members);
    if (status != GLMRT_OK) {
        glmrt_json_free(out);
    }
    return status;
}

const glmrt_json_value *glmrt_json_object_find_bytes(const glmrt_json_value *object, const char *key,
                                                     size_t key_length)
{
    if (object == NULL || object->kind != GLMRT_JSON_OBJECT || key == NULL) {
        return NULL;
    }
    glmrt_json_member probe = {key, key_length, {0}};
    const glmrt_json_member *probe_pointer = &probe;
    size_t low = 0;
    size_t high = object->num_items;
    while (low < high) {
        size_t middle = low + (high - low) / 2;
        int order = compare_members_by_key(&probe_pointer, &object->members_by_key[middle]);
        if (order == 0) {
            return &object->members_by_key[middle]->value;
        }
        if (order < 0) {
            high = middle;
        } else {
            low = middle + 1;
        }
    }
    return NULL;
}

const glmrt_json_value *glmrt_json_object_find(const glmrt_json_value *object, const char *key)
{
    return key == NULL ? NULL : glmrt_json_object_find_bytes(object, key, strlen(key));
}

const glmrt_json_value *glmrt_json_array_at(const glmrt_json_value *array, size_t index)
{
    if (array == NULL || array->kind != GLMRT_JSON_ARRAY || index >= array->num_items) {
        return NULL;
    }
    return &array->items[index];
}

int32_t glmrt_json_get_int64(const glmrt_json_value *value, int64_t *out_value)
{
    if (value == NULL || value->kind != GLMRT_JSON_NUMBER || !value->is_int64) {
        return 0;
    }
    if (out_value != NULL) {
        *out_value = value->int64_value;
    }
    return 1;
}

int32_t glmrt_json_string_equals(const glmrt_json_value *value, const char *text)
{
    if (value == NULL || value->kind != GLMRT_JSON_STRING || text == NULL) {
        return 0;
    }
    size_t length = strlen(text);
    return value->string_length == length && memcmp(value->string, text, length) == 0;
}

const char *glmrt_json_kind_name(glmrt_json_kind kind)
{
    switch (kind) {
    case GLMRT_JSON_NULL:
        return "null";
    case GLMRT_JSON_FALSE:
    case GLMRT_JSON_TRUE:
        return "boolean";
    case GLMRT_JSON_NUMBER:
        return "number";
    case GLMRT_JSON_STRING:
        return "string";
    case GLMRT_JSON_ARRAY:
        return "array";
    case GLMRT_JSON_OBJECT:
        return "object";
    }
    return "unknown";
}
