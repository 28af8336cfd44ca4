/*
 * http1.h: the proxy's HTTP/1.1 request-head parser. It faces untrusted bytes, is a pure
 * function over (pointer, length) slices with no allocation, and has a fuzz target
 * (tests/fuzz/fuzz_proxy_http1.c). Also the appenders that build the heads the proxy writes.
 * The JSON editor that used to live here is json_edit.h.
 */
#ifndef ARCLIGHT_PROXY_HTTP1_H
#define ARCLIGHT_PROXY_HTTP1_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "slice.h"

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

#endif
