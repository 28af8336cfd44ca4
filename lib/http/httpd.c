/*
 * httpd.c: the HTTP/1.1 server (httpd.h) on plain socket events.
 *
 * A connection reads one request at a time: its head (into the request's own copy, so that
 * the request outlives the connection), then its body, then hands it to the handler and reads
 * no further request until the reply has been written (pipelined bytes wait in the
 * connection's read-ahead, which stops being read past one head and 64 KiB). One timer per
 * connection carries the deadline of its state: the idle wait, the whole head, the next piece
 * of body, an answer the client does not take. Answers are queued and written at the end of
 * the loop turn (on_turn_end), after opts.turn_end.
 */
#include "http/httpd.h"

#include <errno.h>
#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/listener.h>
#include <event2/util.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

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
    int draining;          /* no more connections; replies close theirs */
    size_t read_bound;     /* read-ahead per connection */
    struct event *turn_ev; /* the end of a loop turn: queued answers leave (on_turn_end) */
    conn *wq_head, *wq_tail, *wbatch; /* connections with answers to write this turn */
};

/* A client's connection. Its socket is read and written directly: the read event stays
 * registered while below the read-ahead bound, the write event only while an answer is
 * blocked. Per request this saves the epoll_ctl pair of a bufferevent's write enable/disable
 * and the FIONREAD ioctl it makes before every read. */
struct conn {
    al_httpd *s;
    int fd;
    struct event *rev, *wev, *timer;
    char *in; /* read ahead of the current request; kept across requests */
    size_t in_len, in_cap;
    struct evbuffer *out;
    int state;
    int head_started; /* a byte of the current head has arrived */
    size_t scanned;   /* al_http_head_end's memory */
    int keep_alive;
    int reading;       /* rev is registered */
    int no_read;       /* reading stopped for good: a refused request is being answered */
    int queued;        /* on the write queue or the batch on_turn_end writes */
    int write_blocked; /* wev is registered */
    int sent_continue;
    al_httpd_req *req;
    int64_t body_need;  /* Content-Length bytes still to read */
    al_http_chunked ch; /* when chunked */
    int chunked;
    conn *prev, *next;
    conn *wprev, *wnext; /* the write queue */
};

struct al_httpd_req {
    conn *c; /* NULL once the connection is gone */
    al_httpd *s;
    al_http_head head; /* filled by the parser (its header array only up to nheaders) */
    char *raw;         /* the head's bytes (head's slices point here); zeroed from here on */
    char *path;
    char *body;
    size_t body_len, body_cap;
    int head_only;  /* HEAD */
    int http10;     /* HTTP/1.0 */
    int keep_alive; /* of this exchange */
    int chunked;    /* the reply in pieces is chunked */
    struct evbuffer *hdrs; /* extra reply headers */
    int started;    /* the reply's head went out */
    int streaming;  /* send_start: chunks follow */
    int owner_done; /* the owner has finished (send, end, abort) */
    int net_done;   /* the network side is over (written, or the connection gone) */
    int in_done;    /* on_done is running: r is freed by its caller */
    void (*on_done)(al_httpd_req *, void *);
    void *done_ud;
    void (*on_drained)(al_httpd_req *, void *);
    void *drained_ud;
};

static void conn_close(conn *c);
static void conn_process(conn *c);
static void conn_reading(conn *c, int on);

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
        uint64_t w;
        if (n - i >= 8 && (memcpy(&w, s + i, 8), !(w & 0x8080808080808080ull))) {
            i += 8; /* eight ASCII bytes at once: most of a span's text */
            continue;
        }
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

/* Both sides are done with r: free it (not while its on_done runs: the caller frees it). */
static void req_maybe_free(al_httpd_req *r)
{
    if (r->owner_done && r->net_done && !r->in_done) req_free(r);
}

static void req_net_done(al_httpd_req *r)
{
    if (r->net_done) return;
    r->net_done = 1;
    if (r->on_done) {
        r->in_done = 1;
        r->on_done(r, r->done_ud);
        r->in_done = 0;
    }
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

void al_httpd_req_on_drained(al_httpd_req *r, void (*fn)(al_httpd_req *, void *), void *ud)
{
    r->on_drained = fn;
    r->drained_ud = ud;
}

size_t al_httpd_req_pending(const al_httpd_req *r)
{
    return r->c ? evbuffer_get_length(r->c->out) : 0;
}

void al_httpd_req_close_after(al_httpd_req *r)
{
    r->keep_alive = 0;
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

void al_httpd_add_header_lines(al_httpd_req *r, const char *lines)
{
    if (r->started) return;
    if (!r->hdrs && !(r->hdrs = evbuffer_new())) return;
    evbuffer_add(r->hdrs, lines, strlen(lines));
}

/* ------------------------------------------------------------------------------------------
 * Writing: answers are queued and leave at the end of the loop turn
 * ------------------------------------------------------------------------------------------ */

/* The connection's output; the connection is queued to be written at the end of this turn. */
static struct evbuffer *conn_out(conn *c)
{
    al_httpd *s = c->s;
    if (!c->queued) {
        c->queued = 1;
        c->wnext = NULL;
        c->wprev = s->wq_tail;
        if (s->wq_tail)
            s->wq_tail->wnext = c;
        else
            s->wq_head = c;
        s->wq_tail = c;
        if (!c->wprev) event_active(s->turn_ev, EV_TIMEOUT, 1);
    }
    return c->out;
}

/* Takes c off the write queue or off the batch being written. */
static void conn_unqueue(conn *c)
{
    al_httpd *s = c->s;
    if (!c->queued) return;
    if (c->wprev)
        c->wprev->wnext = c->wnext;
    else if (s->wbatch == c)
        s->wbatch = c->wnext;
    else if (s->wq_head == c)
        s->wq_head = c->wnext;
    if (c->wnext)
        c->wnext->wprev = c->wprev;
    else if (s->wq_tail == c)
        s->wq_tail = c->wprev;
    c->wprev = c->wnext = NULL;
    c->queued = 0;
}

/* The reply's head: status line, Content-Type, the framing, Connection and the owner's
 * headers (in the order opts.connection_last says), the blank line. length: the
 * Content-Length, or -1 for a body in pieces. Built with memcpy, not the printf family
 * (which was ~4 % of the proxy's loop thread). */
static void write_head(al_httpd_req *r, int status, const char *ctype, int64_t length)
{
    conn *c = r->c;
    const al_httpd_opts *o = &c->s->o;
    int chunked = length < 0 && (!r->http10 || o->chunked_http10);
    if (c->s->draining) r->keep_alive = 0;
    if (length < 0 && !chunked) r->keep_alive = 0; /* close-delimited */
    const char *reason = o->reason ? o->reason(status) : al_http_reason(status);
    size_t cl = ctype ? strlen(ctype) : 0, rl = strlen(reason);
    char small[1024], *head = cl + rl < sizeof small - 160 ? small : malloc(cl + rl + 160);
    if (!head) return;
    char *p = al_put_mem(head, "HTTP/1.1 ", 9);
    p = al_put_u64(p, (uint64_t)(status < 0 ? 0 : status));
    *p++ = ' ';
    p = al_put_mem(p, reason, rl);
    p = al_put_mem(p, "\r\n", 2);
    if (ctype) {
        p = al_put_mem(p, "Content-Type: ", 14);
        p = al_put_mem(p, ctype, cl);
        p = al_put_mem(p, "\r\n", 2);
    }
    if (length >= 0) {
        p = al_put_mem(p, "Content-Length: ", 16);
        p = al_put_u64(p, (uint64_t)length);
        p = al_put_mem(p, "\r\n", 2);
    } else if (chunked) {
        p = al_put_mem(p, "Transfer-Encoding: chunked\r\n", 28);
    }
    struct evbuffer *out = conn_out(c);
    if (o->connection_last) {
        evbuffer_add(out, head, (size_t)(p - head));
        if (r->hdrs) evbuffer_add_buffer(out, r->hdrs);
        evbuffer_add(out, r->keep_alive ? "\r\n" : "Connection: close\r\n\r\n",
                     r->keep_alive ? 2 : 21);
    } else {
        if (!r->keep_alive)
            p = al_put_mem(p, "Connection: close\r\n", 19);
        else if (r->http10)
            p = al_put_mem(p, "Connection: keep-alive\r\n", 24);
        evbuffer_add(out, head, (size_t)(p - head));
        if (r->hdrs) evbuffer_add_buffer(out, r->hdrs);
        evbuffer_add(out, "\r\n", 2);
    }
    if (head != small) free(head);
    r->started = 1;
    r->chunked = chunked;
}

/* The owner has handed over the whole reply: it leaves at the end of this turn. */
static void reply_queued(al_httpd_req *r)
{
    conn *c = r->c;
    c->state = C_WRITING;
    c->keep_alive = r->keep_alive;
    conn_out(c);
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
    if (len && !r->head_only) evbuffer_add(r->c->out, body, len);
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
            evbuffer_add_buffer(r->c->out, body);
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
    if (!r->chunked) {
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
    if (r->chunked && !r->head_only) evbuffer_add(conn_out(r->c), "0\r\n\r\n", 5);
    reply_queued(r);
}

void al_httpd_req_abort(al_httpd_req *r)
{
    if (r->owner_done) return;
    r->owner_done = 1;
    if (r->c) conn_close(r->c); /* marks net_done and detaches r */
    req_maybe_free(r);
}

/* The JSON body of an error the server answers itself (opts.error_answer or error_body). */
static size_t error_body(al_httpd *s, const al_httpd_error *e, char *out, size_t cap)
{
    if (s->o.error_answer) return s->o.error_answer(s->ud, e, out, cap);
    al_httpd_error_fn fn = s->o.error_body ? s->o.error_body : default_error_body;
    return fn(e->status, e->message, out, cap);
}

/* Writes an error answer (body of n bytes) with Connection: close into out. */
static void error_write(al_httpd *s, struct evbuffer *out, int status, const char *body, size_t n)
{
    const char *reason = s->o.reason ? s->o.reason(status) : al_http_reason(status);
    evbuffer_add_printf(out,
                        "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: "
                        "%zu\r\nConnection: close\r\n\r\n",
                        status, reason, n);
    evbuffer_add(out, body, n);
}

/* An error the server answers itself; the connection closes once it is written. */
static void conn_error(conn *c, const al_httpd_error *e)
{
    char body[1024];
    size_t n = error_body(c->s, e, body, sizeof body);
    error_write(c->s, conn_out(c), e->status, body, n);
    c->state = C_CLOSING;
    c->keep_alive = 0;
    conn_reading(c, 0);
    c->no_read = 1; /* what follows a refused request cannot be trusted */
    evtimer_del(c->timer);
}

static void conn_fail(conn *c, int status, al_httpd_why why, const char *msg)
{
    al_httpd_error e = {.status = status, .why = why, .message = msg, .length = -1};
    conn_error(c, &e);
}

/* ------------------------------------------------------------------------------------------
 * Connections
 * ------------------------------------------------------------------------------------------ */

static void arm(conn *c, int ms)
{
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    evtimer_add(c->timer, &tv);
}

/* Reading on or off (an epoll_ctl each way: only at the read-ahead bound and on errors). */
static void conn_reading(conn *c, int on)
{
    if (on && c->no_read) return;
    if (on == c->reading) return;
    c->reading = on;
    if (on)
        event_add(c->rev, NULL);
    else
        event_del(c->rev);
}

static void conn_gauge(al_httpd *s)
{
    if (s->o.connections) al_gauge_set(s->o.connections, s->nconns);
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
    conn_unqueue(c);
    if (c->prev)
        c->prev->next = c->next;
    else
        s->conns = c->next;
    if (c->next) c->next->prev = c->prev;
    s->nconns--;
    conn_gauge(s);
    event_free(c->rev);
    event_free(c->wev);
    event_free(c->timer);
    evbuffer_free(c->out);
    evutil_closesocket(c->fd);
    free(c->in);
    free(c);
}

/* n bytes at the start of the read-ahead are taken; reading goes on below its bound. */
static void conn_consume(conn *c, size_t n)
{
    c->in_len -= n;
    if (c->in_len) {
        memmove(c->in, c->in + n, c->in_len);
    } else if (c->in_cap > 65536) { /* a large body came through: do not keep its room */
        free(c->in);
        c->in = NULL;
        c->in_cap = 0;
    }
    if (!c->reading && c->in_len < c->s->read_bound) conn_reading(c, 1);
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
    conn_reading(c, 1);
    if (c->in_len) conn_process(c);
}

/* The deadline of the connection's state: a blocked answer (closed), the idle wait (closed),
 * the head or the body (408). */
static void on_timer(evutil_socket_t fd, short what, void *arg)
{
    (void)fd, (void)what;
    conn *c = arg;
    if (c->write_blocked || (c->state == C_HEAD && !c->head_started)) {
        conn_close(c);
    } else if (c->state == C_HEAD || c->state == C_BODY) {
        al_httpd_req *r = c->req;
        c->req = NULL;
        if (r) { /* a request whose body did not come: nobody owns it yet */
            r->c = NULL;
            req_free(r);
        }
        conn_fail(c, 408, AL_HTTPD_WHY_TIMEOUT,
                  c->state == C_HEAD ? "the request head did not arrive in time"
                                     : "the request body did not arrive in time");
    }
}

/* The request is complete: to the handler. */
static void conn_dispatch(conn *c)
{
    al_httpd_req *r = c->req;
    c->state = C_HANDLER;
    evtimer_del(c->timer);
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

/* Moves the head's slices from old to new (same offsets); the literal "/" of an
 * absolute-form target without a path stays. */
static void rebase(al_slice *s, const char *old, char *new_base, size_t oldlen)
{
    if (s->p >= old && s->p <= old + oldlen) s->p = new_base + (s->p - old);
}

/* A client that waits for 100 Continue gets it while its body is incomplete. */
static void conn_continue(conn *c)
{
    al_httpd_req *r = c->req;
    if (r->head.expect_continue && !r->http10 && !c->sent_continue) {
        c->sent_continue = 1;
        evbuffer_add(conn_out(c), "HTTP/1.1 100 Continue\r\n\r\n", 25);
    }
}

static void conn_read_body(conn *c)
{
    al_httpd_req *r = c->req;
    char err[160];
    if (c->chunked) {
        size_t used = 0;
        int rc = al_http_chunked_feed(&c->ch, c->in, c->in_len, &used, c->s->o.max_body,
                                      body_sink, r, err, sizeof err);
        conn_consume(c, used);
        if (rc < 0) {
            c->req = NULL;
            r->c = NULL;
            req_free(r);
            conn_fail(c, -rc, -rc == 413 ? AL_HTTPD_WHY_TOO_LARGE : AL_HTTPD_WHY_MALFORMED, err);
            return;
        }
        if (rc == 1) {
            conn_dispatch(c);
            return;
        }
    } else {
        size_t take = c->in_len < (size_t)c->body_need ? c->in_len : (size_t)c->body_need;
        if (take) {
            memcpy(r->body + r->body_len, c->in, take);
            r->body_len += take;
            c->body_need -= (int64_t)take;
            conn_consume(c, take);
        }
        if (c->body_need == 0) {
            conn_dispatch(c);
            return;
        }
    }
    conn_continue(c);
    arm(c, c->s->o.body_timeout_ms);
}

/* The head's copy for a request that outlives the read-ahead: r->raw, r->path, the slices. */
static int req_take_head(al_httpd_req *r, const char *p, size_t hl)
{
    r->raw = malloc(hl + 1);
    if (!r->raw) return -1;
    memcpy(r->raw, p, hl);
    r->raw[hl] = '\0';
    al_http_head *h = &r->head;
    rebase(&h->method, p, r->raw, hl);
    rebase(&h->target, p, r->raw, hl);
    rebase(&h->path, p, r->raw, hl);
    rebase(&h->query, p, r->raw, hl);
    rebase(&h->host, p, r->raw, hl);
    for (size_t i = 0; i < h->nheaders; i++) {
        rebase(&h->headers[i].name, p, r->raw, hl);
        rebase(&h->headers[i].value, p, r->raw, hl);
    }
    r->path = malloc(h->path.n + 1);
    if (!r->path) return -1;
    memcpy(r->path, h->path.p, h->path.n);
    r->path[h->path.n] = '\0';
    return 0;
}

static void conn_read_head(conn *c)
{
    al_httpd *s = c->s;
    size_t len = c->in_len;
    if (!len) return;
    if (!c->head_started) {
        c->head_started = 1;
        arm(c, s->o.head_timeout_ms); /* a deadline for the whole head, not per byte */
    }
    size_t look = len < s->o.limits.max_head + 2 ? len : s->o.limits.max_head + 2;
    const char *p = c->in;
    size_t end = al_http_head_end(p, look, &c->scanned);
    if (!end) {
        /* only a head past a limit is worth parsing before it ends */
        size_t line_look = look < s->o.limits.max_line + 2 ? look : s->o.limits.max_line + 2;
        int line_over = look > s->o.limits.max_line + 1 && !memchr(p, '\n', line_look);
        if (look < s->o.limits.max_head && !line_over) return;
    }
    /* the head array is filled by the parser up to nheaders: only the rest is zeroed */
    al_httpd_req *r = malloc(sizeof *r);
    char err[160];
    if (!r) {
        conn_close(c);
        return;
    }
    memset(r, 0, offsetof(al_httpd_req, head));
    memset((char *)r + offsetof(al_httpd_req, raw), 0, sizeof *r - offsetof(al_httpd_req, raw));
    int hl = al_http_parse_head(p, look, &s->o.limits, &r->head, err, sizeof err);
    if (hl == 0) { /* cannot be: limits were passed; treat it as a malformed head */
        hl = -400;
        snprintf(err, sizeof err, "malformed request head");
    }
    if (hl < 0) {
        free(r);
        conn_fail(c, -hl, AL_HTTPD_WHY_MALFORMED, err);
        return;
    }
    if (req_take_head(r, p, (size_t)hl) != 0) {
        req_free(r);
        conn_close(c);
        return;
    }
    conn_consume(c, (size_t)hl);
    al_http_head *h = &r->head;
    r->s = s;
    r->c = c;
    r->head_only = al_slice_eq(h->method, "HEAD");
    r->http10 = h->minor_version == 0;
    r->keep_alive = h->keep_alive && !s->draining;
    c->req = r;
    c->state = C_BODY;
    c->chunked = h->chunked;
    c->sent_continue = 0;
    if (!h->chunked) {
        int64_t cl = h->content_length < 0 ? 0 : h->content_length;
        if ((uint64_t)cl > s->o.max_body) {
            char msg[128];
            snprintf(msg, sizeof msg, "request body of %lld bytes is larger than the limit of %zu",
                     (long long)cl, s->o.max_body);
            al_httpd_error e = {413, AL_HTTPD_WHY_TOO_LARGE, msg, cl, s->o.max_body, h};
            c->req = NULL;
            r->c = NULL;
            conn_error(c, &e);
            req_free(r);
            return;
        }
        c->body_need = cl;
        if (cl > 0 && !(r->body = malloc((size_t)cl + 1))) {
            conn_close(c);
            return;
        }
        r->body_cap = (size_t)cl + 1;
    }
    conn_read_body(c);
}

static void conn_process(conn *c)
{
    if (c->state == C_HEAD)
        conn_read_head(c);
    else if (c->state == C_BODY)
        conn_read_body(c);
}

/* Everything queued has left: a paused stream goes on, a finished answer goes back to
 * reading (or closes), an error's connection closes. May free c. */
static void conn_written(conn *c)
{
    if (c->state == C_CLOSING) {
        conn_close(c);
        return;
    }
    al_httpd_req *r = c->req;
    if (c->state == C_HANDLER && r && r->streaming && r->on_drained) {
        r->on_drained(r, r->drained_ud);
        return;
    }
    if (c->state != C_WRITING) return;
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

/* Writes what is queued; what the socket does not take waits for EPOLLOUT, cut after
 * write_timeout without progress. A dead client's connection is closed. May free c. */
static void conn_try_write(conn *c)
{
    while (evbuffer_get_length(c->out)) {
        int n = evbuffer_write(c->out, c->fd);
        if (n > 0) {
            if (c->write_blocked) arm(c, c->s->o.write_timeout_ms); /* progress */
            continue;
        }
        if (n < 0 && errno == EINTR) continue;
        if (n == 0 || errno == EAGAIN || errno == EWOULDBLOCK) {
            if (!c->write_blocked) {
                c->write_blocked = 1;
                event_add(c->wev, NULL);
                arm(c, c->s->o.write_timeout_ms);
            }
            return;
        }
        conn_close(c);
        return;
    }
    if (c->write_blocked) {
        c->write_blocked = 0;
        event_del(c->wev);
        if (c->state == C_BODY)
            arm(c, c->s->o.body_timeout_ms);
        else if (c->state == C_HEAD)
            arm(c, c->head_started ? c->s->o.head_timeout_ms : c->s->o.idle_timeout_ms);
        else
            evtimer_del(c->timer);
    }
    conn_written(c);
}

static void on_write(evutil_socket_t fd, short what, void *arg)
{
    (void)fd, (void)what;
    conn_try_write(arg);
}

/* The end of a loop turn's work: opts.turn_end first, then every queued answer is written,
 * one writev each. Connections queued meanwhile (a pipelined request answered at once) are
 * written by the next run of this event. */
static void on_turn_end(evutil_socket_t fd, short what, void *arg)
{
    (void)fd, (void)what;
    al_httpd *s = arg;
    if (s->o.turn_end) s->o.turn_end(s->ud);
    s->wbatch = s->wq_head;
    s->wq_head = s->wq_tail = NULL;
    conn *c;
    while ((c = s->wbatch)) {
        s->wbatch = c->wnext;
        if (s->wbatch) s->wbatch->wprev = NULL;
        c->wprev = c->wnext = NULL;
        c->queued = 0;
        conn_try_write(c);
    }
}

/* Bytes from the client, into the connection's read-ahead (kept from request to request),
 * which stops growing at the server's bound: reading pauses there until a request takes
 * some. End of stream or a reset closes the connection; a request with its handler is marked
 * closed. */
static void on_read(evutil_socket_t fd, short what, void *arg)
{
    (void)what;
    conn *c = arg;
    size_t bound = c->s->read_bound;
    for (;;) {
        if (c->in_cap - c->in_len < 4096) {
            size_t nc = c->in_cap ? c->in_cap * 2 : 8192;
            if (nc > bound) nc = bound;
            char *nb = nc > c->in_cap ? realloc(c->in, nc) : NULL;
            if (nb) {
                c->in = nb;
                c->in_cap = nc;
            } else if (c->in_len == c->in_cap) {
                if (c->in_cap < bound) { /* out of memory */
                    conn_close(c);
                    return;
                }
                conn_reading(c, 0); /* at the bound */
                break;
            }
        }
        size_t room = c->in_cap - c->in_len;
        ssize_t n = read(fd, c->in + c->in_len, room);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
        if (n <= 0) {
            conn_close(c);
            return;
        }
        c->in_len += (size_t)n;
        if (c->in_len >= bound) {
            conn_reading(c, 0);
            break;
        }
        if ((size_t)n < room) break;
    }
    conn_process(c);
}

/* Past max_connections: the error answer is sent at once (it fits any socket buffer) and the
 * socket closed. */
static void accept_refuse(al_httpd *s, evutil_socket_t fd)
{
    char body[1024];
    al_httpd_error e = {.status = 503,
                        .why = AL_HTTPD_WHY_OVERLOADED,
                        .message = "too many connections; try again later",
                        .length = -1};
    size_t n = error_body(s, &e, body, sizeof body);
    struct evbuffer *b = evbuffer_new();
    if (b) {
        error_write(s, b, 503, body, n);
        size_t len = evbuffer_get_length(b);
        const char *p = (const char *)evbuffer_pullup(b, -1);
        if (p) {
            ssize_t w = send(fd, p, len, MSG_NOSIGNAL | MSG_DONTWAIT);
            (void)w;
        }
        evbuffer_free(b);
    }
    evutil_closesocket(fd);
}

static void on_accept(struct evconnlistener *l, evutil_socket_t fd, struct sockaddr *sa, int salen,
                      void *arg)
{
    (void)l, (void)sa, (void)salen;
    al_httpd *s = arg;
    if (s->nconns >= s->o.max_connections) {
        accept_refuse(s, fd);
        return;
    }
    if (s->o.nodelay) {
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    }
    evutil_make_socket_nonblocking(fd);
    conn *c = calloc(1, sizeof *c);
    if (!c) {
        evutil_closesocket(fd);
        return;
    }
    c->s = s, c->fd = fd, c->state = C_HEAD;
    c->rev = event_new(s->base, fd, EV_READ | EV_PERSIST, on_read, c);
    c->wev = event_new(s->base, fd, EV_WRITE | EV_PERSIST, on_write, c);
    c->timer = evtimer_new(s->base, on_timer, c);
    c->out = evbuffer_new();
    if (!c->rev || !c->wev || !c->timer || !c->out) {
        if (c->rev) event_free(c->rev);
        if (c->wev) event_free(c->wev);
        if (c->timer) event_free(c->timer);
        if (c->out) evbuffer_free(c->out);
        evutil_closesocket(fd);
        free(c);
        return;
    }
    c->next = s->conns;
    if (s->conns) s->conns->prev = c;
    s->conns = c;
    s->nconns++;
    conn_gauge(s);
    arm(c, s->o.idle_timeout_ms);
    conn_reading(c, 1);
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
    /* one head and 64 KiB beyond it read ahead: room for any head, and a hang-up is seen
     * while a request is with its handler */
    s->read_bound = l->max_head + 65536;
    s->turn_ev = event_new(base, -1, 0, on_turn_end, s);
    if (!s->turn_ev) {
        free(s);
        return NULL;
    }
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

int al_httpd_busy(const al_httpd *s)
{
    int n = 0;
    for (const conn *c = s ? s->conns : NULL; c; c = c->next)
        if (c->state != C_HEAD || evbuffer_get_length(c->out) > 0) n++;
    return n;
}

void al_httpd_listen_stop(al_httpd *s)
{
    if (!s || s->draining) return;
    s->draining = 1;
    if (s->listener) {
        evconnlistener_free(s->listener);
        s->listener = NULL;
    }
}

void al_httpd_drain(al_httpd *s)
{
    if (!s) return;
    al_httpd_listen_stop(s);
    for (conn *c = s->conns, *next; c; c = next) {
        next = c->next;
        if (c->state == C_HEAD && !c->head_started && !evbuffer_get_length(c->out)) conn_close(c);
    }
}

void al_httpd_free(al_httpd *s)
{
    if (!s) return;
    if (s->listener) evconnlistener_free(s->listener);
    while (s->conns)
        conn_close(s->conns);
    event_free(s->turn_ev);
    free(s);
}
