/*
 * http1.h: the proxy's HTTP/1.1 request-head parser and its small JSON editor. Both face
 * untrusted bytes, both are pure functions over (pointer, length) slices with no allocation,
 * and both have a fuzz target (tests/fuzz/fuzz_proxy_http1.c). Also the appenders that build
 * the heads the proxy writes.
 */
#ifndef ARCLIGHT_PROXY_HTTP1_H
#define ARCLIGHT_PROXY_HTTP1_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef struct al_slice {
    const char *p;
    size_t n;
} al_slice;

/* Appenders for the heads built per call (answers to agents, requests upstream): memcpy
 * instead of the printf family, which was ~4 % of the loop thread. The caller sizes the
 * buffer; each returns the end of what it wrote. */
static inline char *al_put_mem(char *o, const void *p, size_t n)
{
    memcpy(o, p, n);
    return o + n;
}

static inline char *al_put_str(char *o, const char *s)
{
    return al_put_mem(o, s, strlen(s));
}

static inline char *al_put_u64(char *o, uint64_t v)
{
    char t[24];
    size_t i = sizeof t;
    do {
        t[--i] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    return al_put_mem(o, t + i, sizeof t - i);
}

#define AL_HTTP1_HEADERS_CAP 256

typedef struct al_http1_header {
    al_slice name, value;
} al_http1_header;

typedef struct al_http1_head {
    al_slice method, target;
    int minor_version; /* HTTP/1.<minor> */
    al_http1_header headers[AL_HTTP1_HEADERS_CAP];
    size_t nheaders;
    int64_t content_length; /* -1: no Content-Length */
    int chunked;            /* Transfer-Encoding: chunked */
    int keep_alive;         /* after Connection and the version's default */
} al_http1_head;

typedef struct al_http1_limits {
    size_t max_head_bytes; /* request line + headers (nginx: 4 x 8 KiB buffers) */
    size_t max_headers;    /* <= AL_HTTP1_HEADERS_CAP */
} al_http1_limits;

/* Parses the request head at the start of buf[0..len).
 *   > 0  the head is complete and valid; the value is its length (body follows)
 *   0    incomplete: read more (len is still within the limits)
 *   < 0  -(HTTP status) to answer with: -400 malformed, -431 head too large or too many
 *        headers, -501 unsupported transfer coding, -505 not HTTP/1.x; errstr says why.
 * Slices in out point into buf. */
int al_http1_parse_head(const char *buf, size_t len, const al_http1_limits *lim, al_http1_head *out,
                        char *errstr, size_t errlen);

/* The value of header `name` (case-insensitive), or NULL. */
const al_slice *al_http1_header_get(const al_http1_head *h, const char *name);

int al_slice_eq(al_slice s, const char *lit);     /* exact */
int al_slice_caseeq(al_slice s, const char *lit); /* ASCII case-insensitive */

/* ------------------------------------------------------------------------------------------
 * JSON editing that keeps every byte it does not touch: the proxy removes the fields it asked
 * the upstream for (token ids, logprobs, usage) from the answer without re-serialising it, so
 * the agent gets the upstream's own bytes.
 * ------------------------------------------------------------------------------------------ */

typedef struct al_json_strip {
    const char *const *top_remove;    /* members of the top-level object to delete */
    const char *const *top_null;      /* members of the top-level object whose value becomes null */
    const char *const *choice_remove; /* members of each object in top-level "choices" */
    const char *const *choice_null;   /* members of each choice whose value becomes null */
} al_json_strip;

/* Writes the edited text to out (capacity outcap >= len suffices: edits never grow the
 * text by more than "null" replacing a shorter value, so give len + 64 * choices; the
 * function checks). Returns the output length, or -1 when in is not one valid JSON object
 * or out is too small (then nothing useful is in out). Keys are compared as raw bytes. */
long al_json_strip_apply(const char *in, size_t len, const al_json_strip *spec, char *out,
                         size_t outcap);

/* Lookups over JSON text without building a tree (the hot path reads a few fields of each
 * request and response). None reads outside in[0..n).
 *
 * al_json_valid: 1 when in[0..n) is exactly one JSON value (whitespace around it allowed,
 * nesting at most 512 deep), 0 otherwise.
 * al_json_member: the value of member `key` (compared as raw bytes) of the object in[0..n):
 * 1 with *val, 0 when there is no such member, -1 when in is not an object (what follows the
 * member found is not checked: validate first).
 * al_json_element: the i-th element of the array in[0..n): 1 with *val, 0 when there are
 * fewer elements, -1 when in is not an array. */
int al_json_valid(const char *in, size_t n);
int al_json_member(const char *in, size_t n, const char *key, al_slice *val);
/* Several members of one object in one pass: vals[i] is keys[i]'s value (the first one), or
 * {NULL, 0} when absent. Returns how many were found, or -1 on malformed JSON (or when in is
 * not an object) before all were found. */
int al_json_members(const char *in, size_t n, const char *const *keys, al_slice *vals,
                    size_t nkeys);
int al_json_element(const char *in, size_t n, size_t i, al_slice *val);

/* Walks the elements of the array in[0..n) in one pass:
 *     al_json_iter it; al_slice v;
 *     if (al_json_iter_init(&it, p, n) == 0) while (al_json_iter_next(&it, &v) == 1) ...
 * init: 0, or -1 when in is not an array; next: 1 with *val, 0 at the end, -1 on bad input. */
typedef struct al_json_iter {
    const char *s, *e;
    int first;
} al_json_iter;
int al_json_iter_init(al_json_iter *it, const char *in, size_t n);
int al_json_iter_next(al_json_iter *it, al_slice *val);

#endif
