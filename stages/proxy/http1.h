/*
 * http1.h: the appenders that build the heads the proxy writes. Requests are read with the one
 * HTTP/1.1 parser of the project (lib/http/http1.h, shared with serve, the trainer's checkpoint
 * server and --metrics; fuzzed by tests/fuzz/fuzz_http_parser.c and, for the proxy's limits,
 * tests/fuzz/fuzz_proxy_http1.c). The JSON editor is json_edit.h.
 */
#ifndef ARCLIGHT_PROXY_HTTP1_H
#define ARCLIGHT_PROXY_HTTP1_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "slice.h"

#include "http/http1.h"

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

#endif
