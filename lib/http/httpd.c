/*
 * httpd.c: the HTTP/1.1 server (httpd.h) on libevent bufferevents.
 *
 * A connection reads one request at a time: its head (into the request's own copy, so that
 * the request outlives the connection), then its body, then hands it to the handler and reads
 * no further request until the reply has been written (pipelined bytes wait in the input
 * buffer, which stops being read past one head and 64 KiB). One timer per connection carries
 * the deadline of its state: the idle wait, the whole head, the next piece of body.
 */
#include "http/httpd.h"

#include <errno.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/listener.h>
#include <event2/util.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

enum { C_HEAD, C_BODY, C_HANDLER, C_WRITING, C_CLOSING };

typedef struct conn conn;

struct al_httpd {
    struct event_base *base;
    struct evconnlistener *listener;
    al_httpd_opts o;
    al_httpd_handler_fn handler;
    void *ud;
    conn *conns;
    int nconns;
    int port;
    int draining;
};

struct conn {
    al_httpd *s;
    struct bufferevent *bev;
    struct event *timer;
    int state;
    int head_started; /* a byte of the current head has arrived */
    size_t scanned;   /* al_http_head_end's memory */
    int keep_alive;
    al_httpd_req *req;
    int64_t body_need;  /* Content-Length bytes still to read */
    al_http_chunked ch; /* when chunked */
    int chunked;
    conn *prev, *next;
};

struct al_httpd_req {
    conn *c; /* NULL once the connection is gone */
    al_httpd *s;
    al_http_head head;
    char *raw; /* the head's bytes (head's slices point here) */
    char *path;
    char *body;
    size_t body_len, body_cap;
    int head_only;  /* HEAD */
    int http10;     /* HTTP/1.0: no chunked replies */
    int keep_alive; /* of this exchange */
    struct evbuffer *hdrs; /* extra reply headers */
    int started;    /* the reply's head went out */
    int streaming;  /* send_start: chunks follow */
    int owner_done; /* the owner has finished (send, end, abort) */
    int net_done;   /* the network side is over (written, or the connection gone) */
    void (*on_done)(al_httpd_req *, void *);
    void *done_ud;
};

static void conn_close(conn *c);
static void conn_process(conn *c);

/* ------------------------------------------------------------------------------------------
 * Helpers
 * ------------------------------------------------------------------------------------------ */

const char *al_http_reason(int status)
{
    switch (status) {
    case 100: return "Continue";
    case 200: return "OK";
    case 201: return "Created";
    case 204: return "No Content";
    case 301: return "Moved Permanently";
    case 302: return "Found";
    case 304: return "Not Modified";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 409: return "Conflict";
    case 411: return "Length Required";
    case 413: return "Content Too Large";
    case 414: return "URI Too Long";
    case 415: return "Unsupported Media Type";
    case 422: return "Unprocessable Content";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 499: return "Client Closed Request";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 502: return "Bad Gateway";
    case 503: return "Service Unavailable";
    case 504: return "Gateway Timeout";
    case 505: return "HTTP Version Not Supported";
    default: return "Unknown";
    }
}

/* Length of the valid UTF-8 sequence at s[0..n), or 0 (overlongs, surrogates and code points
 * past U+10FFFF are not valid). */
static size_t utf8_seq(const unsigned char *s, size_t n)
{
    if (n == 0) return 0;
    unsigned c = s[0];
    if (c < 0x80) return 1;
    size_t L = (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (!L || L > n) return 0;
    for (size_t i = 1; i < L; i++)
        if ((s[i] >> 6) != 2) return 0;
    uint32_t cp = L == 2   ? ((c & 0x1f) << 6) | (s[1] & 0x3f)
                  : L == 3 ? ((c & 0x0f) << 12) | ((s[1] & 0x3f) << 6) | (s[2] & 0x3f)
                           : ((c & 0x07) << 18) | ((s[1] & 0x3f) << 12) | ((s[2] & 0x3f) << 6) |
                                 (s[3] & 0x3f);
    if ((L == 2 && cp < 0x80) || (L == 3 && cp < 0x800) || (L == 4 && cp < 0x10000) ||
        cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
        return 0;
    return L;
}

size_t al_utf8_cut(const char *s, size_t n, size_t max)
{
    if (n <= max) return n;
    size_t k = max;
    /* back over continuation bytes to the start of the sequence that max cuts */
    while (k > 0 && k + 3 > max && ((unsigned char)s[k] >> 6) == 2)
        k--;
    if (((unsigned char)s[k] >> 6) == 2) return max; /* not UTF-8 there anyway */
    return k;
}

int al_utf8_valid(const char *s, size_t n)
{
    for (size_t i = 0; i < n;) {
        if ((unsigned char)s[i] < 0x80) {
            i++;
            continue;
        }
        size_t L = utf8_seq((const unsigned char *)s + i, n - i);
        if (!L) return 0;
        i += L;
    }
    return 1;
}

size_t al_utf8_clean(const char *s, size_t n, char *out, size_t cap)
{
    size_t o = 0;
    if (cap == 0) return 0;
    for (size_t i = 0; i < n;) {
        size_t L = utf8_seq((const unsigned char *)s + i, n - i);
        const char *src = L ? s + i : "\xEF\xBF\xBD";
        size_t tl = L ? L : 3;
        if (o + tl + 1 > cap) break;
        memcpy(out + o, src, tl);
        o += tl, i += L ? L : 1;
    }
    out[o] = '\0';
    return o;
}

size_t al_json_escape(const char *s, size_t n, char *out, size_t cap)
{
    static const char hex[] = "0123456789abcdef";
    size_t o = 0;
    if (cap == 0) return 0;
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)s[i];
        char tmp[8];
        size_t tl, adv;
        if (c == '"' || c == '\\') {
            tmp[0] = '\\', tmp[1] = (char)c, tl = 2, adv = 1;
        } else if (c == '\n') {
            memcpy(tmp, "\\n", 2), tl = 2, adv = 1;
        } else if (c == '\t') {
            memcpy(tmp, "\\t", 2), tl = 2, adv = 1;
        } else if (c == '\r') {
            memcpy(tmp, "\\r", 2), tl = 2, adv = 1;
        } else if (c < 0x20 || c == 0x7f) {
            memcpy(tmp, "\\u00", 4), tmp[4] = hex[c >> 4], tmp[5] = hex[c & 15], tl = 6, adv = 1;
        } else if (c < 0x80) {
            tmp[0] = (char)c, tl = 1, adv = 1;
        } else {
            size_t L = utf8_seq((const unsigned char *)s + i, n - i);
            if (L) {
                memcpy(tmp, s + i, L), tl = L, adv = L;
            } else {
                memcpy(tmp, "\xEF\xBF\xBD", 3), tl = 3, adv = 1;
            }
        }
        if (o + tl + 1 > cap) break;
        memcpy(out + o, tmp, tl);
        o += tl, i += adv;
    }
    out[o] = '\0';
    return o;
}

static size_t default_error_body(int status, const char *message, char *out, size_t cap)
{
    char esc[700];
    al_json_escape(message, strlen(message), esc, sizeof esc);
    int n = snprintf(out, cap, "{\"error\":{\"message\":\"%s\",\"type\":\"%s\",\"code\":%d}}", esc,
                     status >= 500 ? "server_error" : "invalid_request_error", status);
    return n < 0 ? 0 : (size_t)n < cap ? (size_t)n : cap - 1;
}

/* ------------------------------------------------------------------------------------------
 * Requests
 * ------------------------------------------------------------------------------------------ */

static void req_free(al_httpd_req *r)
{
    if (r->hdrs) evbuffer_free(r->hdrs);
    free(r->raw);
    free(r->path);
    free(r->body);
    free(r);
}

/* Both sides are done with r: free it. */
static void req_maybe_free(al_httpd_req *r)
{
    if (r->owner_done && r->net_done) req_free(r);
}

static void req_net_done(al_httpd_req *r)
{
    if (r->net_done) return;
    r->net_done = 1;
    if (r->on_done) r->on_done(r, r->done_ud);
}

const al_http_head *al_httpd_req_head(const al_httpd_req *r)
{
    return &r->head;
}

int al_httpd_req_method_is(const al_httpd_req *r, const char *m)
{
    return al_slice_eq(r->head.method, m);
}

const char *al_httpd_req_path(const al_httpd_req *r)
{
    return r->path;
}

const char *al_httpd_req_body(const al_httpd_req *r, size_t *len)
{
    if (len) *len = r->body_len;
    return r->body ? r->body : "";
}

int al_httpd_req_closed(const al_httpd_req *r)
{
    return r->c == NULL;
}

void al_httpd_req_on_done(al_httpd_req *r, void (*fn)(al_httpd_req *, void *), void *ud)
{
    r->on_done = fn;
    r->done_ud = ud;
}

static void put_clean(struct evbuffer *b, const char *s)
{
    for (; *s; s++) {
        char c = *s == '\r' || *s == '\n' ? ' ' : *s;
        evbuffer_add(b, &c, 1);
    }
}

void al_httpd_add_header(al_httpd_req *r, const char *name, const char *value)
{
    if (r->started) return;
    if (!r->hdrs && !(r->hdrs = evbuffer_new())) return;
    put_clean(r->hdrs, name);
    evbuffer_add(r->hdrs, ": ", 2);
    put_clean(r->hdrs, value);
    evbuffer_add(r->hdrs, "\r\n", 2);
}

/* ------------------------------------------------------------------------------------------
 * Writing
 * ------------------------------------------------------------------------------------------ */

static struct evbuffer *conn_out(conn *c)
{
    return bufferevent_get_output(c->bev);
}

/* The reply's head: status line, the server's headers, the owner's, the blank line. length:
 * the Content-Length, or -1 for a body in pieces. */
static void write_head(al_httpd_req *r, int status, const char *ctype, int64_t length)
{
    conn *c = r->c;
    struct evbuffer *o = conn_out(c);
    if (c->s->draining) r->keep_alive = 0;
    if (length < 0 && r->http10) r->keep_alive = 0; /* close-delimited */
    evbuffer_add_printf(o, "HTTP/1.1 %d %s\r\n", status, al_http_reason(status));
    if (ctype) evbuffer_add_printf(o, "Content-Type: %s\r\n", ctype);
    if (length >= 0)
        evbuffer_add_printf(o, "Content-Length: %lld\r\n", (long long)length);
    else if (!r->http10)
        evbuffer_add(o, "Transfer-Encoding: chunked\r\n", 28);
    if (!r->keep_alive)
        evbuffer_add(o, "Connection: close\r\n", 19);
    else if (r->http10)
        evbuffer_add(o, "Connection: keep-alive\r\n", 24);
    if (r->hdrs) evbuffer_add_buffer(o, r->hdrs);
    evbuffer_add(o, "\r\n", 2);
    r->started = 1;
}

/* The owner has handed over the whole reply: the connection writes it out. */
static void reply_queued(al_httpd_req *r)
{
    conn *c = r->c;
    c->state = C_WRITING;
    c->keep_alive = r->keep_alive;
    if (evbuffer_get_length(conn_out(c)) == 0) {
        /* nothing left to write (a reply that was already flushed): finish now */
        bufferevent_trigger(c->bev, EV_WRITE, BEV_TRIG_IGNORE_WATERMARKS | BEV_TRIG_DEFER_CALLBACKS);
    }
}

void al_httpd_send(al_httpd_req *r, int status, const char *ctype, const void *body, size_t len)
{
    if (r->owner_done) return;
    r->owner_done = 1;
    if (!r->c || r->started) {
        if (r->c) conn_close(r->c);
        req_maybe_free(r);
        return;
    }
    write_head(r, status, ctype, (int64_t)len);
    if (len && !r->head_only) evbuffer_add(conn_out(r->c), body, len);
    reply_queued(r);
}

void al_httpd_send_buffer(al_httpd_req *r, int status, const char *ctype, struct evbuffer *body)
{
    if (r->owner_done) return;
    r->owner_done = 1;
    if (!r->c || r->started) {
        if (body) evbuffer_drain(body, evbuffer_get_length(body));
        if (r->c) conn_close(r->c);
        req_maybe_free(r);
        return;
    }
    size_t len = body ? evbuffer_get_length(body) : 0;
    write_head(r, status, ctype, (int64_t)len);
    if (len) {
        if (r->head_only)
            evbuffer_drain(body, len);
        else
            evbuffer_add_buffer(conn_out(r->c), body);
    }
    reply_queued(r);
}

void al_httpd_send_start(al_httpd_req *r, int status, const char *ctype)
{
    if (r->owner_done || r->started) return;
    r->streaming = 1;
    if (!r->c) return;
    write_head(r, status, ctype, -1);
}

void al_httpd_send_chunk(al_httpd_req *r, const void *data, size_t len)
{
    if (r->owner_done || !r->streaming || !r->c || !len || r->head_only) return;
    struct evbuffer *o = conn_out(r->c);
    if (r->http10) {
        evbuffer_add(o, data, len);
        return;
    }
    evbuffer_add_printf(o, "%zx\r\n", len);
    evbuffer_add(o, data, len);
    evbuffer_add(o, "\r\n", 2);
}

void al_httpd_send_end(al_httpd_req *r)
{
    if (r->owner_done) return;
    if (!r->streaming) {
        al_httpd_req_abort(r);
        return;
    }
    r->owner_done = 1;
    if (!r->c) {
        req_maybe_free(r);
        return;
    }
    if (!r->http10 && !r->head_only) evbuffer_add(conn_out(r->c), "0\r\n\r\n", 5);
    reply_queued(r);
}

void al_httpd_req_abort(al_httpd_req *r)
{
    if (r->owner_done) return;
    r->owner_done = 1;
    if (r->c) conn_close(r->c); /* marks net_done and detaches r */
    req_maybe_free(r);
}

/* An error the server answers itself; the connection closes once it is written. */
static void conn_error(conn *c, int status, const char *msg)
{
    char body[1024];
    al_httpd_error_fn fn = c->s->o.error_body ? c->s->o.error_body : default_error_body;
    size_t n = fn(status, msg, body, sizeof body);
    struct evbuffer *o = conn_out(c);
    evbuffer_add_printf(o,
                        "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: "
                        "%zu\r\nConnection: close\r\n\r\n",
                        status, al_http_reason(status), n);
    evbuffer_add(o, body, n);
    c->state = C_CLOSING;
    c->keep_alive = 0;
    bufferevent_disable(c->bev, EV_READ);
    evtimer_del(c->timer);
}

/* ------------------------------------------------------------------------------------------
 * Connections
 * ------------------------------------------------------------------------------------------ */

static void arm(conn *c, int ms)
{
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    evtimer_add(c->timer, &tv);
}

static void conn_close(conn *c)
{
    al_httpd *s = c->s;
    al_httpd_req *r = c->req;
    c->req = NULL;
    if (r) {
        r->c = NULL;
        req_net_done(r);
        req_maybe_free(r);
    }
    if (c->prev)
        c->prev->next = c->next;
    else
        s->conns = c->next;
    if (c->next) c->next->prev = c->prev;
    s->nconns--;
    event_free(c->timer);
    bufferevent_free(c->bev);
    free(c);
}

/* Back to waiting for the next request (keep-alive). */
static void conn_next(conn *c)
{
    c->state = C_HEAD;
    c->head_started = 0;
    c->scanned = 0;
    c->chunked = 0;
    c->body_need = 0;
    memset(&c->ch, 0, sizeof c->ch);
    arm(c, c->s->o.idle_timeout_ms);
    bufferevent_enable(c->bev, EV_READ);
    if (evbuffer_get_length(bufferevent_get_input(c->bev))) conn_process(c);
}

static void on_timer(evutil_socket_t fd, short what, void *arg)
{
    (void)fd, (void)what;
    conn *c = arg;
    if (c->state == C_HEAD && !c->head_started) {
        conn_close(c); /* idle */
    } else if (c->state == C_HEAD || c->state == C_BODY) {
        al_httpd_req *r = c->req;
        c->req = NULL;
        if (r) { /* a request whose body did not come: nobody owns it yet */
            r->c = NULL;
            req_free(r);
        }
        conn_error(c, 408, c->state == C_HEAD ? "the request head did not arrive in time"
                                               : "the request body did not arrive in time");
    }
}

/* The request is complete: to the handler. */
static void conn_dispatch(conn *c)
{
    al_httpd_req *r = c->req;
    c->state = C_HANDLER;
    evtimer_del(c->timer);
    /* pipelined bytes wait; reading goes on (a hang-up must be seen) up to a bound */
    if (evbuffer_get_length(bufferevent_get_input(c->bev)) > c->s->o.limits.max_head + 65536)
        bufferevent_disable(c->bev, EV_READ);
    if (r->body) r->body[r->body_len] = '\0';
    c->s->handler(r, c->s->ud);
}

static int body_sink(void *ud, const char *data, size_t n)
{
    al_httpd_req *r = ud;
    if (r->body_len + n + 1 > r->body_cap) {
        size_t cap = r->body_cap ? r->body_cap * 2 : 4096;
        while (cap < r->body_len + n + 1)
            cap *= 2;
        char *b = realloc(r->body, cap);
        if (!b) return -1;
        r->body = b, r->body_cap = cap;
    }
    memcpy(r->body + r->body_len, data, n);
    r->body_len += n;
    return 0;
}

/* Moves the head's slices from old to new (same offsets). */
static void rebase(al_slice *s, const char *old, char *new_base, size_t oldlen)
{
    if (s->p >= old && s->p <= old + oldlen) s->p = new_base + (s->p - old);
}

static void conn_read_body(conn *c)
{
    struct evbuffer *in = bufferevent_get_input(c->bev);
    al_httpd_req *r = c->req;
    char err[160];
    if (c->chunked) {
        while (evbuffer_get_length(in)) {
            struct evbuffer_iovec v;
            if (evbuffer_peek(in, -1, NULL, &v, 1) < 1) break;
            size_t used = 0;
            int rc = al_http_chunked_feed(&c->ch, v.iov_base, v.iov_len, &used,
                                          c->s->o.max_body, body_sink, r, err, sizeof err);
            evbuffer_drain(in, used);
            if (rc < 0) {
                c->req = NULL;
                r->c = NULL;
                req_free(r);
                conn_error(c, -rc, err);
                return;
            }
            if (rc == 1) {
                conn_dispatch(c);
                return;
            }
        }
    } else {
        size_t avail = evbuffer_get_length(in);
        size_t take = avail < (size_t)c->body_need ? avail : (size_t)c->body_need;
        if (take) {
            evbuffer_remove(in, r->body + r->body_len, take);
            r->body_len += take;
            c->body_need -= (int64_t)take;
        }
        if (c->body_need == 0) {
            conn_dispatch(c);
            return;
        }
    }
    arm(c, c->s->o.body_timeout_ms);
}

static void conn_read_head(conn *c)
{
    al_httpd *s = c->s;
    struct evbuffer *in = bufferevent_get_input(c->bev);
    size_t len = evbuffer_get_length(in);
    if (!len) return;
    if (!c->head_started) {
        c->head_started = 1;
        arm(c, s->o.head_timeout_ms); /* a deadline for the whole head, not per byte */
    }
    size_t look = len < s->o.limits.max_head + 2 ? len : s->o.limits.max_head + 2;
    const char *p = (const char *)evbuffer_pullup(in, (ev_ssize_t)look);
    if (!p) {
        conn_close(c);
        return;
    }
    size_t end = al_http_head_end(p, look, &c->scanned);
    if (!end) {
        /* only a head past a limit is worth parsing before it ends */
        size_t line_look = look < s->o.limits.max_line + 2 ? look : s->o.limits.max_line + 2;
        int line_over = look > s->o.limits.max_line + 1 && !memchr(p, '\n', line_look);
        if (look < s->o.limits.max_head && !line_over) return;
    }
    al_httpd_req *r = calloc(1, sizeof *r);
    char err[160];
    if (!r) {
        conn_close(c);
        return;
    }
    int hl = al_http_parse_head(p, look, &s->o.limits, &r->head, err, sizeof err);
    if (hl == 0) { /* cannot be: limits were passed; treat it as a malformed head */
        hl = -400;
        snprintf(err, sizeof err, "malformed request head");
    }
    if (hl < 0) {
        free(r);
        conn_error(c, -hl, err);
        return;
    }
    r->raw = malloc((size_t)hl + 1);
    if (!r->raw) {
        free(r);
        conn_close(c);
        return;
    }
    memcpy(r->raw, p, (size_t)hl);
    r->raw[hl] = '\0';
    al_http_head *h = &r->head;
    rebase(&h->method, p, r->raw, (size_t)hl);
    rebase(&h->target, p, r->raw, (size_t)hl);
    rebase(&h->path, p, r->raw, (size_t)hl);
    rebase(&h->query, p, r->raw, (size_t)hl);
    rebase(&h->host, p, r->raw, (size_t)hl);
    for (size_t i = 0; i < h->nheaders; i++) {
        rebase(&h->headers[i].name, p, r->raw, (size_t)hl);
        rebase(&h->headers[i].value, p, r->raw, (size_t)hl);
    }
    evbuffer_drain(in, (size_t)hl);
    r->path = malloc(h->path.n + 1);
    if (!r->path) {
        req_free(r);
        conn_close(c);
        return;
    }
    memcpy(r->path, h->path.p, h->path.n);
    r->path[h->path.n] = '\0';
    r->s = s;
    r->c = c;
    r->head_only = al_slice_eq(h->method, "HEAD");
    r->http10 = h->minor_version == 0;
    r->keep_alive = h->keep_alive && !s->draining;
    c->req = r;
    c->state = C_BODY;
    c->chunked = h->chunked;
    if (!h->chunked) {
        int64_t cl = h->content_length < 0 ? 0 : h->content_length;
        if ((uint64_t)cl > s->o.max_body) {
            c->req = NULL;
            r->c = NULL;
            req_free(r);
            char msg[128];
            snprintf(msg, sizeof msg, "request body of %lld bytes is larger than the limit of %zu",
                     (long long)cl, s->o.max_body);
            conn_error(c, 413, msg);
            return;
        }
        c->body_need = cl;
        if (cl > 0 && !(r->body = malloc((size_t)cl + 1))) {
            conn_close(c);
            return;
        }
        r->body_cap = (size_t)cl + 1;
    }
    /* a client that waits for 100 Continue gets it once the head is taken */
    if (h->expect_continue && !r->http10 &&
        (h->chunked || (size_t)c->body_need > evbuffer_get_length(in)))
        evbuffer_add(conn_out(c), "HTTP/1.1 100 Continue\r\n\r\n", 25);
    conn_read_body(c);
}

static void conn_process(conn *c)
{
    if (c->state == C_HEAD)
        conn_read_head(c);
    else if (c->state == C_BODY)
        conn_read_body(c);
    else if ((c->state == C_HANDLER || c->state == C_WRITING) &&
             evbuffer_get_length(bufferevent_get_input(c->bev)) > c->s->o.limits.max_head + 65536)
        bufferevent_disable(c->bev, EV_READ);
}

static void on_read(struct bufferevent *bev, void *arg)
{
    (void)bev;
    conn_process(arg);
}

static void on_write(struct bufferevent *bev, void *arg)
{
    conn *c = arg;
    if (evbuffer_get_length(bufferevent_get_output(bev)) != 0) return;
    if (c->state == C_CLOSING) {
        conn_close(c);
        return;
    }
    if (c->state != C_WRITING) return;
    al_httpd_req *r = c->req;
    c->req = NULL;
    if (r) {
        r->c = NULL;
        req_net_done(r);
        req_maybe_free(r);
    }
    if (!c->keep_alive || c->s->draining)
        conn_close(c);
    else
        conn_next(c);
}

static void on_event(struct bufferevent *bev, short what, void *arg)
{
    (void)bev;
    conn *c = arg;
    if (what & (BEV_EVENT_EOF | BEV_EVENT_ERROR | BEV_EVENT_TIMEOUT)) conn_close(c);
}

static void on_accept(struct evconnlistener *l, evutil_socket_t fd, struct sockaddr *sa, int salen,
                      void *arg)
{
    (void)l, (void)sa, (void)salen;
    al_httpd *s = arg;
    conn *c = calloc(1, sizeof *c);
    struct bufferevent *bev = c ? bufferevent_socket_new(s->base, fd, BEV_OPT_CLOSE_ON_FREE) : NULL;
    struct event *t = bev ? evtimer_new(s->base, on_timer, c) : NULL;
    if (!t) {
        if (bev) bufferevent_free(bev);
        else evutil_closesocket(fd);
        free(c);
        return;
    }
    c->s = s, c->bev = bev, c->timer = t, c->state = C_HEAD;
    c->next = s->conns;
    if (s->conns) s->conns->prev = c;
    s->conns = c;
    s->nconns++;
    bufferevent_setcb(bev, on_read, on_write, on_event, c);
    struct timeval wt = {s->o.write_timeout_ms / 1000, (s->o.write_timeout_ms % 1000) * 1000};
    bufferevent_set_timeouts(bev, NULL, &wt);
    bufferevent_enable(bev, EV_READ | EV_WRITE);
    if (s->nconns > s->o.max_connections) {
        conn_error(c, 503, "too many connections; try again later");
        return;
    }
    arm(c, s->o.head_timeout_ms);
}

/* ------------------------------------------------------------------------------------------
 * The server
 * ------------------------------------------------------------------------------------------ */

al_httpd *al_httpd_new(struct event_base *base, const al_httpd_opts *opts,
                       al_httpd_handler_fn handler, void *ud)
{
    al_httpd *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->base = base, s->handler = handler, s->ud = ud, s->port = -1;
    if (opts) s->o = *opts;
    al_http_limits *l = &s->o.limits;
    if (!l->max_line) l->max_line = 8192;
    if (!l->max_head) l->max_head = 32768;
    if (!l->max_headers) l->max_headers = 100;
    if (l->max_line > l->max_head) l->max_line = l->max_head;
    if (!s->o.max_body) s->o.max_body = 1 << 20;
    if (s->o.max_connections <= 0) s->o.max_connections = 1024;
    if (s->o.head_timeout_ms <= 0) s->o.head_timeout_ms = 60000;
    if (s->o.body_timeout_ms <= 0) s->o.body_timeout_ms = 60000;
    if (s->o.idle_timeout_ms <= 0) s->o.idle_timeout_ms = 75000;
    if (s->o.write_timeout_ms <= 0) s->o.write_timeout_ms = 60000;
    return s;
}

int al_httpd_bind(al_httpd *s, const char *host, int port, char *errstr, size_t errlen)
{
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
    struct addrinfo *res = NULL;
    const char *h = host && *host ? host : "127.0.0.1";
    int gr = getaddrinfo(h, ps, &hints, &res);
    if (gr != 0) {
        snprintf(errstr, errlen, "cannot resolve %s: %s", h, gai_strerror(gr));
        return -1;
    }
    int e = 0;
    for (struct addrinfo *a = res; a && !s->listener; a = a->ai_next) {
        errno = 0;
        s->listener = evconnlistener_new_bind(s->base, on_accept, s,
                                              LEV_OPT_CLOSE_ON_FREE | LEV_OPT_REUSEABLE, 1024,
                                              a->ai_addr, (int)a->ai_addrlen);
        if (!s->listener) e = errno;
    }
    freeaddrinfo(res);
    if (!s->listener) {
        snprintf(errstr, errlen, "cannot listen on %s:%d: %s", h, port,
                 e ? strerror(e) : "bind failed");
        return -1;
    }
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    s->port = port;
    if (getsockname(evconnlistener_get_fd(s->listener), (struct sockaddr *)&ss, &sl) == 0) {
        if (ss.ss_family == AF_INET) s->port = ntohs(((struct sockaddr_in *)&ss)->sin_port);
        if (ss.ss_family == AF_INET6) s->port = ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
    }
    return 0;
}

int al_httpd_port(const al_httpd *s)
{
    return s ? s->port : -1;
}

int al_httpd_connections(const al_httpd *s)
{
    return s ? s->nconns : 0;
}

void al_httpd_drain(al_httpd *s)
{
    if (!s || s->draining) return;
    s->draining = 1;
    if (s->listener) {
        evconnlistener_free(s->listener);
        s->listener = NULL;
    }
    for (conn *c = s->conns, *next; c; c = next) {
        next = c->next;
        if (c->state == C_HEAD && !c->head_started) conn_close(c);
    }
}

void al_httpd_free(al_httpd *s)
{
    if (!s) return;
    if (s->listener) evconnlistener_free(s->listener);
    while (s->conns)
        conn_close(s->conns);
    free(s);
}
