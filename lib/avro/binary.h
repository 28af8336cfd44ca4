/*
 * binary.h (internal to lib/avro): Avro binary primitives with bounds checks, shared by
 * the typed codecs and the schema-driven (generic) walker.
 *
 * Every reader function checks each length against the bytes left before it touches
 * memory, and on failure writes a message naming the field and the offset into the whole
 * message (header included) and returns -1.
 */
#ifndef ARCLIGHT_AVRO_BINARY_H
#define ARCLIGHT_AVRO_BINARY_H

#include "avro/codec.h"
#include "core/util.h"

#include <stdint.h>
#include <string.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#define AL_AVRO_BIG_ENDIAN 1
#endif

/* Writes the error and returns -1 from the calling reader. Spelled out (rather than
 * `return al_err(...)`) so that the compiler sees that outputs are set whenever 0 is
 * returned. */
#define AL_FAIL(...)                                                                               \
    do {                                                                                           \
        al_err(__VA_ARGS__);                                                                       \
        return -1;                                                                                 \
    } while (0)

typedef struct al_rd {
    const uint8_t *base; /* start of the message: offsets in errors count from here */
    const uint8_t *p;
    const uint8_t *end;
    char *errstr;
    size_t errlen;
} al_rd;

static inline size_t al_rd_off(const al_rd *r) { return (size_t)(r->p - r->base); }
static inline size_t al_rd_left(const al_rd *r) { return (size_t)(r->end - r->p); }

/* Zig-zag varint, at most 10 bytes. */
static inline int al_rd_long(al_rd *r, const char *field, int64_t *v)
{
    const uint8_t *p = r->p;
    if (p < r->end && !(*p & 0x80)) { /* one-byte fast path */
        uint64_t u = *p;
        *v = (int64_t)((u >> 1) ^ (~(u & 1) + 1));
        r->p = p + 1;
        return 0;
    }
    uint64_t u = 0;
    for (unsigned shift = 0;; shift += 7) {
        if (p >= r->end)
            AL_FAIL(r->errstr, r->errlen,
                          "truncated: field %s ends inside a varint at offset %zu", field,
                          al_rd_off(r));
        if (shift > 63)
            AL_FAIL(r->errstr, r->errlen,
                          "bad varint: field %s has a varint longer than 10 bytes at offset %zu",
                          field, al_rd_off(r));
        uint8_t b = *p++;
        u |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) break;
    }
    *v = (int64_t)((u >> 1) ^ (~(u & 1) + 1));
    r->p = p;
    return 0;
}

static inline int al_rd_int(al_rd *r, const char *field, int32_t *v)
{
    size_t off = al_rd_off(r);
    int64_t x;
    if (al_rd_long(r, field, &x)) return -1;
    if (x < INT32_MIN || x > INT32_MAX)
        AL_FAIL(r->errstr, r->errlen,
                      "bad int: field %s holds %lld, out of the int range, at offset %zu", field,
                      (long long)x, off);
    *v = (int32_t)x;
    return 0;
}

/* A byte length (of bytes, string or an array block's byte size) that must fit in the
 * rest of the message. */
static inline int al_rd_len(al_rd *r, const char *field, size_t *n)
{
    size_t off = al_rd_off(r);
    int64_t x;
    if (al_rd_long(r, field, &x)) return -1;
    if (x < 0)
        AL_FAIL(r->errstr, r->errlen, "bad length: field %s has negative length %lld at offset %zu",
                      field, (long long)x, off);
    if ((uint64_t)x > al_rd_left(r))
        AL_FAIL(r->errstr, r->errlen,
                      "truncated: field %s needs %lld bytes, %zu left at offset %zu", field,
                      (long long)x, al_rd_left(r), al_rd_off(r));
    *n = (size_t)x;
    return 0;
}

static inline int al_rd_fixed(al_rd *r, const char *field, size_t n, const uint8_t **out)
{
    if (n > al_rd_left(r))
        AL_FAIL(r->errstr, r->errlen,
                      "truncated: field %s needs %zu bytes, %zu left at offset %zu", field, n,
                      al_rd_left(r), al_rd_off(r));
    *out = r->p;
    r->p += n;
    return 0;
}

static inline int al_rd_double(al_rd *r, const char *field, double *v)
{
    const uint8_t *p;
    if (al_rd_fixed(r, field, 8, &p)) return -1;
    uint64_t u = 0;
    for (int i = 7; i >= 0; i--) u = (u << 8) | p[i];
    memcpy(v, &u, 8);
    return 0;
}

static inline int al_rd_float(al_rd *r, const char *field, float *v)
{
    const uint8_t *p;
    if (al_rd_fixed(r, field, 4, &p)) return -1;
    uint32_t u = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
    memcpy(v, &u, 4);
    return 0;
}

static inline int al_rd_bool(al_rd *r, const char *field, int *v)
{
    const uint8_t *p;
    size_t off = al_rd_off(r);
    if (al_rd_fixed(r, field, 1, &p)) return -1;
    if (*p > 1)
        AL_FAIL(r->errstr, r->errlen, "bad boolean: field %s holds byte %u at offset %zu",
                      field, *p, off);
    *v = *p;
    return 0;
}

/* A union branch or enum index in [0, count). */
static inline int al_rd_index(al_rd *r, const char *field, const char *what, int64_t count,
                              int64_t *idx)
{
    size_t off = al_rd_off(r);
    if (al_rd_long(r, field, idx)) return -1;
    if (*idx < 0 || *idx >= count)
        AL_FAIL(r->errstr, r->errlen,
                      "bad %s index %lld for field %s at offset %zu (valid: 0..%lld)", what,
                      (long long)*idx, field, off, (long long)count - 1);
    return 0;
}

/* The count of the next array/map block (0 ends the array). A negative count is followed
 * by the block's byte size (Avro allows it so that readers can skip), which is checked.
 * Every item of arclight's arrays takes at least min_item_bytes, so a count larger than
 * the bytes left can be refused before anything is allocated. */
static inline int al_rd_block(al_rd *r, const char *field, size_t min_item_bytes, size_t *count)
{
    size_t off = al_rd_off(r);
    int64_t c;
    if (al_rd_long(r, field, &c)) return -1;
    if (c < 0) {
        size_t bytes;
        if (c == INT64_MIN)
            AL_FAIL(r->errstr, r->errlen, "bad block count for field %s at offset %zu",
                          field, off);
        c = -c;
        if (al_rd_len(r, field, &bytes)) return -1;
    }
    if (min_item_bytes && (uint64_t)c > al_rd_left(r) / min_item_bytes)
        AL_FAIL(r->errstr, r->errlen,
                      "truncated: field %s claims %lld items, only %zu bytes left at offset %zu",
                      field, (long long)c, al_rd_left(r), off);
    if (!min_item_bytes && c > (int64_t)1 << 32)
        AL_FAIL(r->errstr, r->errlen, "bad block count %lld for field %s at offset %zu",
                      (long long)c, field, off);
    *count = (size_t)c;
    return 0;
}

/* ---- writing ---------------------------------------------------------------------- */

static inline void al_wr_long_unchecked(al_buf *b, int64_t v)
{
    uint64_t u = ((uint64_t)v << 1) ^ (uint64_t)(v >> 63);
    uint8_t *p = (uint8_t *)b->data + b->len;
    while (u >= 0x80) {
        *p++ = (uint8_t)(u | 0x80);
        u >>= 7;
    }
    *p++ = (uint8_t)u;
    b->len = (size_t)(p - (uint8_t *)b->data);
}

static inline int al_wr_long(al_buf *b, int64_t v)
{
    if (al_buf_reserve(b, 10)) return -1;
    al_wr_long_unchecked(b, v);
    return 0;
}

static inline int al_wr_bytes(al_buf *b, const void *data, size_t n)
{
    if (al_buf_reserve(b, n + 10)) return -1;
    al_wr_long_unchecked(b, (int64_t)n);
    if (n) memcpy(b->data + b->len, data, n);
    b->len += n;
    return 0;
}

static inline int al_wr_string(al_buf *b, const char *s)
{
    return al_wr_bytes(b, s ? s : "", s ? strlen(s) : 0);
}

static inline int al_wr_double(al_buf *b, double v)
{
    if (al_buf_reserve(b, 8)) return -1;
    uint64_t u;
    memcpy(&u, &v, 8);
    for (int i = 0; i < 8; i++) b->data[b->len++] = (uint8_t)(u >> (8 * i));
    return 0;
}

static inline int al_wr_float(al_buf *b, float v)
{
    if (al_buf_reserve(b, 4)) return -1;
    uint32_t u;
    memcpy(&u, &v, 4);
    for (int i = 0; i < 4; i++) b->data[b->len++] = (uint8_t)(u >> (8 * i));
    return 0;
}

static inline int al_wr_byte(al_buf *b, uint8_t v)
{
    if (al_buf_reserve(b, 1)) return -1;
    b->data[b->len++] = v;
    return 0;
}

/* n 4-byte elements (int32 or float32) as one Avro bytes value of packed little-endian
 * words. */
static inline int al_wr_packed32(al_buf *b, const void *elems, size_t n)
{
    if (n > SIZE_MAX / 8) return -1;
#ifndef AL_AVRO_BIG_ENDIAN
    return al_wr_bytes(b, elems, n * 4);
#else
    if (al_buf_reserve(b, n * 4 + 10)) return -1;
    al_wr_long_unchecked(b, (int64_t)(n * 4));
    const uint8_t *s = elems;
    for (size_t i = 0; i < n; i++)
        for (int k = 0; k < 4; k++) b->data[b->len++] = s[4 * i + 3 - k];
    return 0;
#endif
}

/* Starts a framed message: C3 01 + the fingerprint, little-endian. */
static inline int al_wr_header(al_buf *b, uint64_t fp)
{
    b->len = 0;
    if (al_buf_reserve(b, AL_AVRO_HEADER_LEN)) return -1;
    b->data[0] = AL_AVRO_MAGIC0;
    b->data[1] = AL_AVRO_MAGIC1;
    for (int i = 0; i < 8; i++) b->data[2 + i] = (uint8_t)(fp >> (8 * i));
    b->len = AL_AVRO_HEADER_LEN;
    return 0;
}

/* ---- helpers for the typed codecs (codec_common.c) --------------------------------- */

/* The fingerprint of the current version of a schema (by full name); the registry is
 * built on first use. Aborts if arclight's own embedded schema is missing, which only a
 * broken build can cause. */
uint64_t al_codec_current_fp(const char *fullname);
/* The same, looked up once per call site (the registry never changes a current version). */
#define AL_CODEC_FP(fullname)                                                                    \
    __extension__({                                                                              \
        static _Atomic uint64_t al_fp_cache_;                                                    \
        uint64_t al_fp_ = al_fp_cache_;                                                          \
        if (!al_fp_) al_fp_cache_ = al_fp_ = al_codec_current_fp(fullname);                      \
        al_fp_;                                                                                  \
    })

/* Checks the frame of a message for the schema `fullname` whose current fingerprint is
 * `fp`. Returns 0 with r positioned after the header when the message is written with the
 * current version; 1 when it is written with another registered version of the same
 * schema (*resolved then holds the message resolved to the current version, which the
 * caller decodes and frees); -1 with errstr otherwise. */
int al_codec_open(const void *buf, size_t len, const char *fullname, uint64_t fp, al_rd *r,
                  al_buf *resolved, char *errstr, size_t errlen);

/* The message must have been read to its last byte. */
int al_codec_finish(const al_rd *r, const char *schema);

/* Readers of the typed codecs: copy into the arena. A string is NUL-terminated (one with
 * a NUL byte inside is refused); an empty one is "" (not owned). A packed array of
 * elem-byte elements is refused when its byte length is not a multiple of elem; an empty
 * one is NULL with count 0. */
int al_rd_string_a(al_rd *r, al_arena *a, const char *field, const char **out);
int al_rd_opt_string_a(al_rd *r, al_arena *a, const char *field, const char **out);
int al_rd_bytes_a(al_rd *r, al_arena *a, const char *field, const uint8_t **out, size_t *n);
int al_rd_opt_bytes_a(al_rd *r, al_arena *a, const char *field, const uint8_t **out,
                      size_t *n);
int al_rd_packed_a(al_rd *r, al_arena *a, const char *field, size_t elem, const void **out,
                   size_t *count);
/* Writers: a nullable string/bytes (NULL: null) as union ["null", T]. */
int al_wr_opt_string(al_buf *b, const char *s);
int al_wr_opt_bytes(al_buf *b, const uint8_t *data, size_t n);

/* "out of memory" in errstr; returns -1. */
int al_codec_oom(char *errstr, size_t errlen, const char *what);

#endif
