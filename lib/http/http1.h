/*
 * http1.h: the one HTTP/1.1 request parser of arclight: the request head and a chunked
 * request body. Every server of the project reads requests through it (lib/http/httpd.h:
 * serve, the trainer's checkpoint server, --metrics; the capture proxy). Pure functions over
 * (pointer, length) slices: no allocation, nothing read outside the buffer given, fuzzed by
 * tests/fuzz/fuzz_http_parser.c.
 *
 * What is refused, and with which status (nginx's answers where nginx has one):
 *   400  a malformed request line, header line or chunk; a NUL or another control byte in a
 *        header value; a bare CR; obsolete line folding; whitespace before a header's colon;
 *        a Content-Length that is not plain digits (+2, 1,1, 0x10) or that comes twice;
 *        Transfer-Encoding with Content-Length, or in HTTP/1.0; no Host in HTTP/1.1, or two
 *   414  a request line longer than max_line
 *   431  a header section larger than max_head, or more than max_headers fields
 *   413  a body larger than the server's limit (the caller's, from content_length; a
 *        chunked body here)
 *   501  a transfer coding other than chunked
 *   505  a version other than HTTP/1.x
 * Accepted as nginx and uvicorn accept them: bare LF line ends, empty lines before the request
 * line, absolute-form targets (http://host/path: the authority becomes the host), "*" for
 * OPTIONS, chunked bodies with extensions and trailers, Expect: 100-continue.
 *
 * At its end, the appenders that build the heads the servers and the proxy's upstream client
 * write.
 */
#ifndef ARCLIGHT_HTTP_HTTP1_H
#define ARCLIGHT_HTTP_HTTP1_H

#include "core/slice.h"

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define AL_HTTP_HEADERS_CAP 256

typedef struct al_http_header {
    al_slice name, value; /* value without surrounding whitespace */
} al_http_header;

typedef struct al_http_head {
    al_slice method;
    al_slice target;      /* as sent */
    al_slice path, query; /* path: "/..." ("*" for OPTIONS *); query: after '?', or empty */
    al_slice host;        /* the Host header, or the authority of an absolute-form target */
    int minor_version;    /* HTTP/1.<minor> */
    al_http_header headers[AL_HTTP_HEADERS_CAP];
    size_t nheaders;
    int64_t content_length; /* -1: none */
    int chunked;            /* Transfer-Encoding: chunked */
    int keep_alive;         /* after Connection and the version's default */
    int expect_continue;    /* Expect: 100-continue */
} al_http_head;

typedef struct al_http_limits {
    size_t max_line;    /* request line; longer: 414 (0: 8 KiB, one of nginx's large buffers) */
    size_t max_head;    /* request line + headers; larger: 431 (0: 32 KiB, nginx's 4 x 8 KiB) */
    size_t max_headers; /* fields; more: 431 (0: 100; at most AL_HTTP_HEADERS_CAP) */
} al_http_limits;

/* Where the head at the start of buf[0..len) ends (the length of the head, blank line
 * included), or 0 when it has not ended yet. *scanned (start it at 0) remembers how far the
 * search got, so that a caller that appends bytes and asks again scans each byte once. */
size_t al_http_head_end(const char *buf, size_t len, size_t *scanned);

/* Parses the request head at the start of buf[0..len).
 *   > 0  the head is complete and valid; the value is its length (the body follows)
 *   0    incomplete: read more (len is still within the limits)
 *   < 0  -(HTTP status) to answer with (see the top of this file); errstr says why.
 * Slices in out point into buf. */
int al_http_parse_head(const char *buf, size_t len, const al_http_limits *lim, al_http_head *out,
                       char *errstr, size_t errlen);

/* The value of header `name` (case-insensitive; the first one), or NULL. */
const al_slice *al_http_header_get(const al_http_head *h, const char *name);

/* Whether the comma-separated value v holds token tok (case-insensitive). */
int al_http_value_has_token(al_slice v, const char *tok);

/* ---- chunked request bodies (RFC 9112 7.1) ---------------------------------------------- */

/* Where decoded body bytes go: 0, or -1 (out of memory: the decode stops with -500). */
typedef int (*al_http_sink_fn)(void *ud, const char *data, size_t n);

/* Decoder state: zero-initialize before the first byte of a body. */
typedef struct al_http_chunked {
    int state;
    uint64_t left;       /* bytes left of the chunk being read */
    uint64_t total;      /* body bytes decoded so far */
    size_t line;         /* bytes of the size line or trailer line read so far */
    size_t trailer;      /* bytes of the trailer section read so far */
    int digits;          /* hex digits of the size read so far */
    int ext;             /* a ';' (chunk extensions) was seen on the size line */
} al_http_chunked;

/* Feeds in[0..n) to the decoder; decoded bytes go to sink. *used is how much of in was
 * consumed: all of it unless the body ended inside it (what follows is the next request).
 *   1    the body is complete (last chunk and trailers read)
 *   0    more is needed
 *   < 0  -400 malformed (a size that is not hex, more than 15 digits, a missing CRLF after the
 *        data, a size or trailer line over 4 KiB, trailers over 8 KiB, control bytes), -413 the
 *        body is larger than max_body, -500 the sink failed; errstr says why. */
int al_http_chunked_feed(al_http_chunked *c, const char *in, size_t n, size_t *used,
                         uint64_t max_body, al_http_sink_fn sink, void *ud, char *errstr,
                         size_t errlen);

/* ---- writing heads ---------------------------------------------------------------------- */

/* Appenders for the heads built per request (answers, requests upstream): memcpy instead of
 * the printf family, which was ~4 % of the proxy's loop thread. The caller sizes the buffer;
 * each returns the end of what it wrote. */
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

#endif
