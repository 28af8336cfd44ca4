/*
 * t1699_http_raw.h: raw HTTP/1.1 over a TCP socket for the tests that probe servers with
 * bytes no HTTP client library would send (header-only, static). Send what you like, read
 * back one or more responses: status, headers and body (by Content-Length, chunked, or up to
 * the close), with a deadline.
 */
#ifndef ARCLIGHT_T1699_HTTP_RAW_H
#define ARCLIGHT_T1699_HTTP_RAW_H

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static inline double hr_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* A connection to 127.0.0.1:port (-1 on failure). */
static inline int hr_connect(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        if (fd >= 0) close(fd);
        return -1;
    }
    return fd;
}

/* Writes all of p (a peer that closes early is fine: the rest is dropped). 0, or -1 when the
 * peer stopped reading. */
static inline int hr_send(int fd, const void *p, size_t n)
{
    const char *c = p;
    while (n) {
        ssize_t w = send(fd, c, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        c += w, n -= (size_t)w;
    }
    return 0;
}

/* What has been read from a connection and not parsed yet. */
typedef struct hr_conn {
    int fd;
    char *buf;
    size_t len, cap;
    int eof;
} hr_conn;

/* Reads more, waiting up to until (hr_now() time). 1 read something, 0 EOF, -1 timed out. */
static inline int hr_fill(hr_conn *c, double until)
{
    if (c->eof) return 0;
    double left = until - hr_now();
    if (left <= 0) return -1;
    struct pollfd p = {.fd = c->fd, .events = POLLIN};
    if (poll(&p, 1, (int)(left * 1000) + 1) <= 0) return -1;
    if (c->len + 65536 + 1 > c->cap) {
        c->cap = (c->len + 65536) * 2;
        c->buf = realloc(c->buf, c->cap);
    }
    ssize_t r = recv(c->fd, c->buf + c->len, 65536, 0);
    if (r <= 0) {
        c->eof = 1;
        return 0;
    }
    c->len += (size_t)r;
    c->buf[c->len] = 0;
    return 1;
}

typedef struct hr_resp {
    int status;     /* 0: no response came */
    char head[8192]; /* status line and headers, NUL-terminated */
    char *body;     /* malloc'd, NUL-terminated */
    size_t body_len;
    long long content_length; /* -1: none */
    int chunked, closed_after;
} hr_resp;

static inline void hr_resp_free(hr_resp *r)
{
    free(r->body);
    r->body = NULL;
}

/* The value of header name in r (case-insensitive) copied to out, or NULL. */
static inline const char *hr_header(const hr_resp *r, const char *name, char *out, size_t cap)
{
    size_t nl = strlen(name);
    for (const char *p = strchr(r->head, '\n'); p && p[1]; p = strchr(p + 1, '\n')) {
        const char *l = p + 1;
        if (!strncasecmp(l, name, nl) && l[nl] == ':') {
            const char *v = l + nl + 1;
            while (*v == ' ')
                v++;
            size_t k = strcspn(v, "\r\n");
            snprintf(out, cap, "%.*s", (int)k, v);
            return out;
        }
    }
    return NULL;
}

/* Parses the next response out of c (reading more as needed, for up to secs). head_only: the
 * response has no body whatever its headers say (the answer to HEAD). 1xx responses are
 * returned like any other. */
static inline void hr_read(hr_conn *c, hr_resp *r, int head_only, double secs)
{
    memset(r, 0, sizeof *r);
    r->content_length = -1;
    double until = hr_now() + secs;
    char *end;
    while (!(c->buf && (end = strstr(c->buf, "\r\n\r\n"))))
        if (hr_fill(c, until) <= 0) return;
    size_t hl = (size_t)(end - c->buf) + 4;
    snprintf(r->head, sizeof r->head, "%.*s", (int)(hl < sizeof r->head ? hl : sizeof r->head - 1),
             c->buf);
    r->status = atoi(c->buf + 9);
    char v[64];
    if (hr_header(r, "Content-Length", v, sizeof v)) r->content_length = atoll(v);
    if (hr_header(r, "Transfer-Encoding", v, sizeof v) && !strcasecmp(v, "chunked")) r->chunked = 1;
    if (hr_header(r, "Connection", v, sizeof v) && !strcasecmp(v, "close")) r->closed_after = 1;
    memmove(c->buf, c->buf + hl, c->len - hl + 1);
    c->len -= hl;
    r->body = calloc(1, 1);
    if (head_only || (r->status >= 100 && r->status < 200)) return;
    if (r->chunked) {
        for (;;) {
            char *le;
            while (!(le = strstr(c->buf ? c->buf : "", "\r\n")))
                if (hr_fill(c, until) <= 0) return;
            size_t sz = strtoul(c->buf, NULL, 16), ll = (size_t)(le - c->buf) + 2;
            while (c->len < ll + sz + 2)
                if (hr_fill(c, until) <= 0) return;
            r->body = realloc(r->body, r->body_len + sz + 1);
            memcpy(r->body + r->body_len, c->buf + ll, sz);
            r->body_len += sz;
            r->body[r->body_len] = 0;
            memmove(c->buf, c->buf + ll + sz + 2, c->len - ll - sz - 2 + 1);
            c->len -= ll + sz + 2;
            if (sz == 0) return;
        }
    }
    if (r->content_length >= 0) {
        while (c->len < (size_t)r->content_length)
            if (hr_fill(c, until) <= 0) break;
        size_t n = c->len < (size_t)r->content_length ? c->len : (size_t)r->content_length;
        r->body = realloc(r->body, n + 1);
        memcpy(r->body, c->buf, n);
        r->body[n] = 0;
        r->body_len = n;
        memmove(c->buf, c->buf + n, c->len - n + 1);
        c->len -= n;
        return;
    }
    while (hr_fill(c, until) > 0) {
    }
    r->body = realloc(r->body, c->len + 1);
    memcpy(r->body, c->buf ? c->buf : "", c->len);
    r->body[c->len] = 0;
    r->body_len = c->len;
    c->len = 0;
}

/* 1 when the server has closed the connection within secs (nothing more to read). */
static inline int hr_closed(hr_conn *c, double secs)
{
    double until = hr_now() + secs;
    for (;;) {
        int f = hr_fill(c, until);
        if (f == 0) return 1;
        if (f < 0) return 0;
    }
}

/* One exchange on a fresh connection: sends req (n bytes), reads one response. */
static inline void hr_exchange(int port, const char *req, size_t n, int head_only, hr_resp *r)
{
    hr_conn c = {.fd = hr_connect(port)};
    memset(r, 0, sizeof *r);
    if (c.fd < 0) return;
    hr_send(c.fd, req, n);
    hr_read(&c, r, head_only, 20);
    close(c.fd);
    free(c.buf);
}

#endif
