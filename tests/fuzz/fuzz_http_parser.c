/*
 * fuzz_http_parser: libFuzzer target for the one HTTP/1.1 request parser every arclight server
 * reads requests with (lib/http/http1.c): the request head under limits taken from the input,
 * then what follows it as a chunked body, fed whole and in pieces.
 *
 * Input: byte 0 picks the limits (max_line, max_head, max_headers) and byte 1 the size of the
 * pieces the body is fed in; the rest is the request. Checked on every input: nothing is read
 * outside the buffer (ASan), a head is accepted only within its limits and with slices inside
 * it, errors are one of the statuses http1.h lists and say why, al_http_head_end agrees with
 * the parser whether asked once or byte by byte, and a chunked body decodes to the same bytes
 * and the same verdict however it is split.
 */
#include "http/http1.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct sink {
    char *p;
    size_t n, cap;
} sink;

static int sink_add(void *ud, const char *d, size_t n)
{
    sink *s = ud;
    if (s->n + n > s->cap) {
        size_t cap = (s->n + n) * 2 + 64;
        char *p = realloc(s->p, cap);
        if (!p) return -1;
        s->p = p, s->cap = cap;
    }
    memcpy(s->p + s->n, d, n);
    s->n += n;
    return 0;
}

static int in_buf(al_slice s, const char *b, size_t n)
{
    return s.n == 0 || (s.p >= b && s.p + s.n <= b + n);
}

/* Decodes body[0..n) as chunked in pieces of `step` bytes (0: at once). */
static int decode(const char *body, size_t n, size_t step, sink *out, size_t *used_total)
{
    al_http_chunked c;
    memset(&c, 0, sizeof c);
    char err[128];
    size_t off = 0;
    int rc = 0;
    *used_total = 0;
    while (off < n) {
        size_t piece = step ? (n - off < step ? n - off : step) : n - off;
        size_t used = 0;
        err[0] = '\0';
        rc = al_http_chunked_feed(&c, body + off, piece, &used, 1 << 20, sink_add, out, err,
                                  sizeof err);
        if (used > piece) abort();
        off += used;
        if (rc != 0) break;
        if (used < piece) abort(); /* only the end of the body stops short of a piece */
    }
    if (rc < 0 && (!err[0] || (rc != -400 && rc != -413 && rc != -500))) abort();
    *used_total = off;
    return rc;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2) return 0;
    static const size_t lines[4] = {16, 64, 8192, 0};
    static const size_t heads[4] = {32, 256, 4096, 0};
    static const size_t hdrs[4] = {1, 3, 100, 0};
    al_http_limits lim = {lines[data[0] & 3], heads[(data[0] >> 2) & 3], hdrs[(data[0] >> 4) & 3]};
    size_t step = data[1] % 9;
    const char *buf = (const char *)data + 2;
    size_t n = size - 2;
    size_t max_head = lim.max_head ? lim.max_head : 32768;

    static al_http_head h;
    char err[128] = "";
    int hl = al_http_parse_head(buf, n, &lim, &h, err, sizeof err);
    if (hl > 0) {
        if ((size_t)hl > n || (size_t)hl > max_head) abort();
        /* an absolute-form target without a path gets the path "/", a literal outside buf */
        int root = h.path.n == 1 && h.path.p[0] == '/';
        if (!in_buf(h.method, buf, (size_t)hl) || !in_buf(h.target, buf, (size_t)hl) ||
            (!root && !in_buf(h.path, buf, (size_t)hl)) || !in_buf(h.query, buf, (size_t)hl) ||
            !in_buf(h.host, buf, (size_t)hl))
            abort();
        if (h.path.n == 0 || (h.path.p[0] != '/' && !(h.path.n == 1 && h.path.p[0] == '*')))
            abort();
        for (size_t i = 0; i < h.nheaders; i++) {
            if (!in_buf(h.headers[i].name, buf, (size_t)hl) ||
                !in_buf(h.headers[i].value, buf, (size_t)hl))
                abort();
            for (size_t k = 0; k < h.headers[i].value.n; k++)
                if (h.headers[i].value.p[k] == '\0' || h.headers[i].value.p[k] == '\n') abort();
        }
        if (h.chunked && h.content_length >= 0) abort();
        if (h.minor_version >= 1 && !al_http_header_get(&h, "host")) abort();
        if (h.content_length > 999999999999999LL) abort();
        /* the head's end as the incremental search finds it, fed one byte at a time */
        size_t scanned = 0, end = 0;
        for (size_t k = 1; k <= n && !end; k++)
            end = al_http_head_end(buf, k, &scanned);
        if (end != (size_t)hl) abort();
        if (h.chunked) {
            sink a = {0}, b = {0};
            size_t ua, ub;
            int ra = decode(buf + hl, n - (size_t)hl, 0, &a, &ua);
            int rb = decode(buf + hl, n - (size_t)hl, step ? step : 1, &b, &ub);
            if (ra != rb || a.n != b.n || (a.n && memcmp(a.p, b.p, a.n) != 0)) abort();
            if (ra == 1 && ua != ub) abort();
            free(a.p);
            free(b.p);
        }
    } else if (hl < 0) {
        static const int ok[] = {400, 414, 431, 501, 505};
        int known = 0;
        for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++)
            known |= -hl == ok[i];
        if (!known || !err[0]) abort();
    } else if (n >= max_head) {
        abort(); /* past the limit there is always an answer */
    }
    return 0;
}
