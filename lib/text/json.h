/*
 * json.h: a small JSON reader for lib/text and lib/model (config.json, tokenizer.json,
 * safetensors headers). Both depend on nothing but libc and libm, so they
 * cannot use jansson.
 *
 * al_json_parse builds a tree in one arena; al_json_free releases all of it. Strings are
 * unescaped to UTF-8 (\u escapes and surrogate pairs included) and NUL-terminated; their
 * byte length is kept as well, since JSON strings may contain \u0000. Object members keep
 * their document order. Nesting deeper than 512 levels is an error, not a stack overflow.
 */
#ifndef ARCLIGHT_TEXT_JSON_H
#define ARCLIGHT_TEXT_JSON_H

#include "core/buf.h"

#include <stddef.h>
#include <stdint.h>

typedef enum al_json_type {
    AL_JSON_NULL,
    AL_JSON_FALSE,
    AL_JSON_TRUE,
    AL_JSON_NUMBER,
    AL_JSON_STRING,
    AL_JSON_ARRAY,
    AL_JSON_OBJECT,
} al_json_type;

typedef struct al_json al_json;
struct al_json {
    al_json_type type;
    double number;      /* AL_JSON_NUMBER */
    int64_t integer;    /* AL_JSON_NUMBER: exact value when is_integer */
    int is_integer;     /* the literal had no fraction or exponent and fits int64 */
    const char *string; /* AL_JSON_STRING: UTF-8, NUL-terminated */
    size_t string_len;  /* AL_JSON_STRING: bytes, not counting the NUL */
    size_t count;       /* AL_JSON_ARRAY / AL_JSON_OBJECT: number of items */
    al_json **items;    /* AL_JSON_ARRAY / AL_JSON_OBJECT: the values */
    const char **keys;  /* AL_JSON_OBJECT: the member names (UTF-8, NUL-terminated) */
    size_t *key_lens;   /* AL_JSON_OBJECT: member name lengths */
};

/* Parses `len` bytes of JSON text. Returns the root (owned by the caller, release with
 * al_json_free) or NULL with "what, at byte N" in errstr. Trailing non-space is an error. */
al_json *al_json_parse(const char *text, size_t len, char *errstr, size_t errlen);
void al_json_free(al_json *root);

/* Member of an object by name (first match), or NULL if `obj` is not an object or has no
 * such member. */
const al_json *al_json_get(const al_json *obj, const char *key);

/* Typed look-ups with a default for absent or null members. They return the default when
 * the member has another type too; use al_json_get to tell the two apart. */
double al_json_get_number(const al_json *obj, const char *key, double dflt);
int64_t al_json_get_int(const al_json *obj, const char *key, int64_t dflt);
int al_json_get_bool(const al_json *obj, const char *key, int dflt);
const char *al_json_get_string(const al_json *obj, const char *key, const char *dflt);

/* Appends `s` (len bytes of UTF-8) as a quoted JSON string. */
void al_json_quote(al_buf *b, const char *s, size_t len);
/* Appends v as compact JSON (no spaces; what an OpenAI client sends). Integers keep their
 * exact value, other numbers are written with 17 significant digits. */
void al_json_write(al_buf *b, const al_json *v);

#endif
