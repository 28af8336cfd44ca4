/*
 * conn.c: the proxy's inbound connection layer. Owns the agents' sockets: accepting them
 * (within --max-connections), reading each request into the connection's own buffer
 * (lib/http/http1.c parses the head and decodes a chunked body; the header and body limits are
 * enforced here, with their 4xx),
 * the read and write timeouts, and every answer the proxy writes: whole replies, JSON errors
 * and chunked streams. Answers are queued and leave at the end of the loop turn that made
 * them (px_conn_flush_turn), after that turn's spans are on disk. conn.c knows no file above
 * it: it calls up only through px->hooks (main.c sets them): the turn's spans to disk before
 * its answers leave, a complete request to routes.c, a connection that goes away to its call
 * (call.c), which goes on for its span, and a paused stream's answer written.
 */
#include "proxy.h"

#include "core/log.h"
#include "http/httpd.h"

#include <errno.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static const char *status_text(int st)
{
    switch (st) {
    case 200:
        return "OK";
    case 400:
        return "Bad Request";
    case 401:
        return "Unauthorized";
    case 404:
        return "Not Found";
    case 405:
        return "Method Not Allowed";
    case 408:
        return "Request Timeout";
    case 411:
        return "Length Required";
    case 413:
        return "Payload Too Large";
    case 414:
        return "URI Too Long";
    case 415:
        return "Unsupported Media Type";
    case 422:
        return "Unprocessable Entity";
    case 429:
        return "Too Many Requests";
    case 431:
        return "Request Header Fields Too Large";
    case 500:
        return "Internal Server Error";
    case 501:
        return "Not Implemented";
    case 502:
        return "Bad Gateway";
    case 503:
        return "Service Unavailable";
    case 504:
        return "Gateway Timeout";
    case 505:
        return "HTTP Version Not Supported";
    default:
        return st < 300 ? "OK" : st < 500 ? "Client Error" : "Server Error";
    }
}

static void count_request(proxy *px, const px_route *route, int status)
{
    for (size_t i = 0; i < px->nseries; i++)
        if (px->series[i].route == route && px->series[i].status == status) {
            al_counter_inc(px->series[i].c);
            return;
        }
    char st[16];
    snprintf(st, sizeof st, "%d", status);
    al_counter *c = al_metrics_counter(px->metrics, "arclight_proxy_requests_total",
                                       "Requests answered, by route and HTTP status", "route",
                                       route->name, "status", st, NULL);
    if (px->nseries < AL_ARRAY_LEN(px->series))
        px->series[px->nseries++] = (status_series){route, status, c};
    al_counter_inc(c);
}

static void conn_read_cb(conn *c);

static void conn_finish_request(conn *c)
{
    free(c->req);
    c->req = NULL;
    c->req_len = 0;
}

/* Reading on or off (an epoll_ctl each way; only at the read-ahead bound and on errors). */
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

/* Stops reading for good: what follows a malformed request cannot be trusted. */
static void conn_stop_reading(conn *c)
{
    conn_reading(c, 0);
    c->no_read = 1;
}

/* The output buffer; the connection is queued to be written at the end of this turn. */
static struct evbuffer *conn_out(conn *c)
{
    proxy *px = c->px;
    if (!c->queued) {
        c->queued = 1;
        c->wnext = NULL;
        c->wprev = px->wq_tail;
        if (px->wq_tail)
            px->wq_tail->wnext = c;
        else
            px->wq_head = c;
        px->wq_tail = c;
        if (!c->wprev) event_active(px->out_ev, EV_TIMEOUT, 1);
    }
    return c->out;
}

/* Takes c off the write queue or off the batch being written. */
static void conn_unqueue(conn *c)
{
    proxy *px = c->px;
    if (!c->queued) return;
    if (c->wprev)
        c->wprev->wnext = c->wnext;
    else if (px->wbatch == c)
        px->wbatch = c->wnext;
    else if (px->wq_head == c)
        px->wq_head = c->wnext;
    if (c->wnext)
        c->wnext->wprev = c->wprev;
    else if (px->wq_tail == c)
        px->wq_tail = c->wprev;
    c->wprev = c->wnext = NULL;
    c->queued = 0;
}

/* Writes a whole response (head + body). The connection goes back to reading when it is
 * written (keep-alive) or closes. */
/* The access-log line of an answer that is not a call's (a call writes its own, with what
 * it captured): unknown routes, refused requests, rewards, ends, sessions. Probes of
 * /healthz, /metrics and base URLs that succeed are not logged. */
static const char *reply_why; /* the error being answered, for its access-log line */

static void access_log_request(const conn *c, int status)
{
    if (!c->px->cfg.access_log || !c->req || c->call) return;
    if (status == 200 && c->route->quiet)
        return;
    size_t ml = c->head.method.n > 32 ? 32 : c->head.method.n;
    size_t tl = c->head.target.n > 400 ? 400 : c->head.target.n;
    al_log_info("proxy.access", "method=%.*s path=%.*s status=%d route=%s ms=%.3f%s%.300s", (int)ml,
                c->head.method.p, (int)tl, c->head.target.p, status, c->route->name,
                (double)(al_mono_us() - c->t0_mono) / 1000.0, reply_why ? " error=" : "",
                reply_why ? reply_why : "");
}

void px_conn_reply(conn *c, int status, const char *ctype, const char *extra, const char *body,
                   size_t len)
{
    proxy *px = c->px;
    if (px->draining) c->keep_alive = 0;
    struct evbuffer *out = conn_out(c);
    size_t cl = strlen(ctype), el = extra ? strlen(extra) : 0;
    char small[1024], *head = cl + el < sizeof small - 160 ? small : malloc(cl + el + 160);
    if (head) {
        char *o = al_put_mem(head, "HTTP/1.1 ", 9);
        o = al_put_u64(o, (uint64_t)(status < 0 ? 0 : status));
        *o++ = ' ';
        o = al_put_str(o, status_text(status));
        o = al_put_mem(o, "\r\nContent-Type: ", 16);
        o = al_put_mem(o, ctype, cl);
        o = al_put_mem(o, "\r\nContent-Length: ", 18);
        o = al_put_u64(o, len);
        o = al_put_mem(o, "\r\n", 2);
        if (el) o = al_put_mem(o, extra, el);
        if (!c->keep_alive) o = al_put_mem(o, "Connection: close\r\n", 19);
        o = al_put_mem(o, "\r\n", 2);
        evbuffer_add(out, head, (size_t)(o - head));
        if (head != small) free(head);
    }
    if (len && !(c->req && al_slice_eq(c->head.method, "HEAD"))) evbuffer_add(out, body, len);
    c->state = C_WRITING;
    count_request(px, c->route, status);
    access_log_request(c, status);
    conn_finish_request(c);
}

/* An OpenAI-style error body: {"error":{"message","type","param","code"}}. The message may quote what the agent sent: cut at a character when it is long, and bytes
 * that are not UTF-8 written as U+FFFD, so that the body is always the JSON it says it is. */
void px_conn_error(conn *c, int status, const char *type, const char *code, const char *fmt, ...)
{
    char msg[1024], clean[3100];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    size_t len = n < 0 ? 0 : (size_t)n < sizeof msg ? (size_t)n : sizeof msg - 1;
    if (n > 0 && (size_t)n >= sizeof msg) len = al_utf8_cut(msg, (size_t)n, len);
    al_utf8_clean(msg, len, clean, sizeof clean);
    /* on the Messages route, Anthropic's {"type":"error","error":{...}} */
    char *body = al_xl_error_body(c->route->error_api, status,
                                  type, code, clean);
    const char *b = body ? body : "{\"error\":{\"message\":\"error\"}}";
    px_conn_reply_error(c, status, b, clean);
    free(body);
}

void px_conn_reply_error(conn *c, int status, const char *body, const char *why)
{
    reply_why = why;
    px_conn_reply(c, status, "application/json", NULL, body, strlen(body));
    reply_why = NULL;
}

void px_conn_stream_begin(conn *c, int status, const char *ctype, const char *extra)
{
    if (c->px->draining) c->keep_alive = 0;
    evbuffer_add_printf(conn_out(c),
                        "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nTransfer-Encoding: chunked\r\n"
                        "Cache-Control: no-cache\r\n%s%s\r\n",
                        status, status_text(status), ctype, extra ? extra : "",
                        c->keep_alive ? "" : "Connection: close\r\n");
    c->state = C_STREAM;
    count_request(c->px, c->route, status);
}

void px_conn_stream_write(conn *c, const char *data, size_t len)
{
    if (!len) return;
    struct evbuffer *out = conn_out(c);
    evbuffer_add_printf(out, "%zx\r\n", len);
    evbuffer_add(out, data, len);
    evbuffer_add(out, "\r\n", 2);
}

void px_conn_stream_end(conn *c)
{
    evbuffer_add(conn_out(c), "0\r\n\r\n", 5);
    c->state = C_WRITING;
    conn_finish_request(c);
}

/* Reading stays enabled for the connection's whole life (no epoll_ctl per request, and an
 * agent that hangs up mid-call is noticed); the read timeout runs only while a request is
 * awaited, since a call with the upstream may take minutes. --client-timeout is, as nginx's
 * timeouts are: the idle wait for a request; a deadline for the whole head from its first
 * byte (client_header_timeout: a head trickling in a byte at a time cannot hold a
 * connection); the wait between two reads of a body (client_body_timeout). A blocked answer
 * has its own (write) timeout. */
static void conn_timeouts(conn *c, int reading)
{
    struct timeval to = {c->px->cfg.client_timeout_s, 0};
    if (c->write_blocked) {
        evtimer_add(c->tev, &to);
        return;
    }
    if (!reading) {
        evtimer_del(c->tev);
        c->head_armed = c->in_body = 0;
        return;
    }
    if (c->in_body || (c->in_len == 0 && !c->in_chunked)) {
        c->head_armed = 0;
        evtimer_add(c->tev, &to);
    } else if (!c->head_armed) {
        c->head_armed = 1;
        evtimer_add(c->tev, &to);
    }
}

/* Everything queued has left: a paused stream goes on, a finished answer goes back to
 * reading (or closes). May free c. */
static void conn_written(conn *c)
{
    if (c->state == C_STREAM && c->call && c->px->hooks.written(c->call)) return;
    if (c->state != C_WRITING) return;
    if (!c->keep_alive) {
        px_conn_free(c);
        return;
    }
    c->state = C_READ;
    conn_timeouts(c, 1);
    if (c->in_len) conn_read_cb(c);
}

/* Writes what is queued; what the socket does not take waits for EPOLLOUT (with the write
 * timeout). A dead agent's connection is freed. May free c. */
static void conn_try_write(conn *c)
{
    while (evbuffer_get_length(c->out)) {
        int n = evbuffer_write(c->out, c->fd);
        if (n > 0) continue;
        if (n < 0 && errno == EINTR) continue;
        if (n == 0 || errno == EAGAIN || errno == EWOULDBLOCK) {
            if (!c->write_blocked) {
                c->write_blocked = 1;
                event_add(c->wev, NULL);
                conn_timeouts(c, 0);
            }
            return;
        }
        px_conn_free(c);
        return;
    }
    if (c->write_blocked) {
        c->write_blocked = 0;
        event_del(c->wev);
        conn_timeouts(c, c->state == C_READ);
    }
    conn_written(c);
}

static void conn_on_write(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    conn_try_write(arg);
}

/* The end of a loop turn's work: this turn's spans go to disk first (an answer never
 * leaves before its span is in the spool), then every queued answer is written, one
 * writev each. Connections queued meanwhile (a pipelined request answered at once) are
 * written by the next run of this event, after their spans. */
void px_conn_flush_turn(evutil_socket_t fd, short what, void *arg)
{
    proxy *px = arg;
    px->hooks.turn_end(fd, what, px);
    px->wbatch = px->wq_head;
    px->wq_head = px->wq_tail = NULL;
    conn *c;
    while ((c = px->wbatch)) {
        px->wbatch = c->wnext;
        if (px->wbatch) px->wbatch->wprev = NULL;
        c->wprev = c->wnext = NULL;
        c->queued = 0;
        conn_try_write(c);
    }
}

/* The read timeout (a request that never completed gets a 408, like nginx's) or the write
 * timeout (an agent that does not read its answer). */
static void conn_on_timeout(evutil_socket_t fd, short what, void *arg)
{
    conn *c = arg;
    (void)fd;
    (void)what;
    if (!c->write_blocked && c->state == C_READ && c->req_len == 0 &&
        (c->in_len > 0 || c->in_chunked)) {
        c->keep_alive = 0;
        c->route = &px_route_unknown;
        px_conn_error(c, 408, "invalid_request_error", "request_timeout",
                      "the request was not received in time");
        conn_stop_reading(c);
        return;
    }
    if (!c->write_blocked && c->state != C_READ) return; /* with the upstream: no timeout */
    px_conn_free(c);
}

/* Bytes from the agent (at most one request's worth ahead: beyond max_head + max_body +
 * 64 KiB reading pauses until a request is taken), into the connection's own buffer, which
 * is kept from request to request (an evbuffer allocated and freed a chain per request).
 * End of stream or a reset frees the connection; a call in flight goes on for its span. */
static void conn_on_read(evutil_socket_t fd, short what, void *arg)
{
    conn *c = arg;
    proxy *px = c->px;
    (void)what;
    size_t hiwat = px->cfg.max_head + px->cfg.max_body + 65536;
    for (;;) {
        if (c->in_cap - c->in_len < 4096) {
            size_t nc = c->in_cap ? c->in_cap * 2 : 8192;
            if (nc > hiwat) nc = hiwat;
            char *nb = nc > c->in_cap ? realloc(c->in, nc) : NULL;
            if (!nb) {
                if (c->in_len < c->in_cap) goto have_room; /* at the bound: fill what is left */
                px_conn_free(c);
                return;
            }
            c->in = nb;
            c->in_cap = nc;
        }
    have_room:;
        size_t room = c->in_cap - c->in_len;
        ssize_t n = read(fd, c->in + c->in_len, room);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
        if (n <= 0) {
            px_conn_free(c);
            return;
        }
        c->in_len += (size_t)n;
        if (c->in_len >= hiwat) {
            conn_reading(c, 0);
            break;
        }
        if ((size_t)n < room) break;
    }
    if (c->state == C_READ) conn_timeouts(c, 1);
    conn_read_cb(c);
}

void px_conn_free(conn *c)
{
    proxy *px = c->px;
    if (c->call) px->hooks.gone(c->call);
    conn_unqueue(c);
    if (c->prev)
        c->prev->next = c->next;
    else
        px->conns = c->next;
    if (c->next) c->next->prev = c->prev;
    px->nconns--;
    al_gauge_set(px->g_conns, px->nconns);
    event_free(c->rev);
    event_free(c->wev);
    event_free(c->tev);
    free(c->in);
    al_buf_free(&c->cbody);
    evbuffer_free(c->out);
    evutil_closesocket(c->fd);
    free(c->req);
    free(c);
}

static int chunk_sink(void *ud, const char *data, size_t n)
{
    conn *c = ud;
    return al_buf_append(&c->cbody, data, n);
}

/* A slice of the head moves from the input buffer to the request's copy (same offset); the
 * literal "/" of an absolute-form target without a path stays. */
static void rebase(al_slice *s, const char *from, size_t len, char *to)
{
    if (s->p >= from && s->p <= from + len) s->p = to + (s->p - from);
}

/* Reads one request: the head (within the header limits), then its body: Content-Length bytes
 * or a chunked body (decoded as it arrives), within the body limit. Anything malformed is
 * answered with its 4xx and the connection is closed, since the rest of the stream cannot be
 * trusted. */
static void conn_read_cb(conn *c)
{
    proxy *px = c->px;
    if (c->state != C_READ || c->no_read) return;
    size_t len = c->in_len;
    if (!len) return;
    /* two bytes past the limit: a request line that long is 414, a head 431 */
    size_t look = len < px->cfg.max_head + 2 ? len : px->cfg.max_head + 2;
    const char *p = c->in;
    /* the request line may take the whole head: a longer one is 414, a longer head 431 */
    al_http_limits lim = {.max_line = px->cfg.max_head, .max_head = px->cfg.max_head,
                          .max_headers = px->cfg.max_headers};
    char err[128];
    int hl = al_http_parse_head(p, look, &lim, &c->head, err, sizeof err);
    if (hl == 0) return;
    c->route = &px_route_unknown;
    if (hl < 0) {
        c->keep_alive = 0;
        conn_stop_reading(c);
        px_conn_error(c, -hl, "invalid_request_error",
                      -hl == 431   ? "headers_too_large"
                      : -hl == 414 ? "uri_too_long"
                                   : "bad_request",
                      "%s", err);
        return;
    }
    c->keep_alive = c->head.keep_alive;
    int64_t cl = c->head.content_length < 0 ? 0 : c->head.content_length;
    if (!c->head.chunked && (uint64_t)cl > px->cfg.max_body) {
        c->keep_alive = 0;
        conn_stop_reading(c);
        px_conn_error(c, 413, "invalid_request_error", "request_too_large",
                      "request body of %" PRId64 " bytes is larger than the limit of %zu bytes", cl,
                      px->cfg.max_body);
        return;
    }
    size_t consumed; /* the bytes of `in` this request takes */
    if (c->head.chunked) {
        /* decoded as it comes; the encoded bytes leave `in` behind the head, so that a body
         * near the limit never fills the read-ahead bound */
        if (!c->in_chunked) {
            memset(&c->chunk, 0, sizeof c->chunk);
            al_buf_reset(&c->cbody);
            c->in_chunked = 1;
        }
        size_t used = 0;
        int rc = al_http_chunked_feed(&c->chunk, c->in + hl, len - (size_t)hl, &used,
                                      px->cfg.max_body, chunk_sink, c, err, sizeof err);
        if (rc < 0) {
            c->in_chunked = 0;
            c->keep_alive = 0;
            conn_stop_reading(c);
            px_conn_error(c, -rc, "invalid_request_error",
                          -rc == 413 ? "request_too_large" : "bad_request", "%s", err);
            return;
        }
        if (rc == 0) {
            memmove(c->in + hl, c->in + hl + used, len - (size_t)hl - used);
            c->in_len -= used;
            c->in_body = 1;
            if (c->head.expect_continue && !c->sent_continue) {
                c->sent_continue = 1;
                evbuffer_add(conn_out(c), "HTTP/1.1 100 Continue\r\n\r\n", 25);
            }
            return;
        }
        c->in_chunked = 0;
        consumed = (size_t)hl + used;
        cl = (int64_t)c->cbody.len;
    } else {
        if (len < (size_t)hl + (size_t)cl) {
            c->in_body = 1;
            /* curl and others wait up to a second for this before sending a large body */
            if (c->head.expect_continue && !c->sent_continue) {
                c->sent_continue = 1;
                evbuffer_add(conn_out(c), "HTTP/1.1 100 Continue\r\n\r\n", 25);
            }
            return;
        }
        consumed = (size_t)hl + (size_t)cl;
    }
    c->sent_continue = 0;
    c->req_len = (size_t)hl + (size_t)cl;
    c->req = malloc(c->req_len + 1);
    if (!c->req) {
        px_conn_free(c);
        return;
    }
    memcpy(c->req, c->in, (size_t)hl);
    memcpy(c->req + hl, c->head.chunked ? c->cbody.data : c->in + hl, (size_t)cl);
    c->req[c->req_len] = '\0';
    /* the slices point into the input buffer: move them to our copy (same offsets) */
    al_http_head *h = &c->head;
    rebase(&h->method, p, (size_t)hl, c->req);
    rebase(&h->target, p, (size_t)hl, c->req);
    rebase(&h->path, p, (size_t)hl, c->req);
    rebase(&h->query, p, (size_t)hl, c->req);
    rebase(&h->host, p, (size_t)hl, c->req);
    for (size_t i = 0; i < h->nheaders; i++) {
        rebase(&h->headers[i].name, p, (size_t)hl, c->req);
        rebase(&h->headers[i].value, p, (size_t)hl, c->req);
    }
    if (c->cbody.cap > 65536) /* a large chunked body came through: do not keep its room */
        al_buf_free(&c->cbody);
    c->in_len -= consumed;
    if (c->in_len) {
        memmove(c->in, c->in + consumed, c->in_len);
    } else if (c->in_cap > 65536) { /* a large body came through: do not keep its room */
        free(c->in);
        c->in = NULL;
        c->in_cap = 0;
    }
    if (!c->reading) conn_reading(c, 1); /* below the read-ahead bound again */
    c->body = (al_slice){c->req + hl, (size_t)cl};
    c->t0_mono = al_mono_us();
    c->start_us = al_now_us();
    c->state = C_BUSY;
    conn_timeouts(c, 0);
    px->hooks.request(c);
}

void px_accept_cb(struct evconnlistener *l, evutil_socket_t fd, struct sockaddr *sa, int salen,
                  void *arg)
{
    proxy *px = arg;
    (void)l;
    (void)sa;
    (void)salen;
    if (px->nconns >= px->cfg.max_conns) {
        /* the length is counted, not typed: it once said 113 for a body of 112 bytes */
        static const char body[] = "{\"error\":{\"message\":\"too many connections to the "
                                   "proxy\",\"type\":\"server_error\",\"param\":null,\"code\":"
                                   "\"overloaded\"}}";
        char busy[400];
        int bl = snprintf(busy, sizeof busy,
                          "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                          "Content-Length: %zu\r\nConnection: close\r\n\r\n%s",
                          sizeof body - 1, body);
        ssize_t w = send(fd, busy, (size_t)bl, MSG_NOSIGNAL | MSG_DONTWAIT);
        (void)w;
        evutil_closesocket(fd);
        count_request(px, &px_route_unknown, 503);
        return;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    evutil_make_socket_nonblocking(fd);
    conn *c = calloc(1, sizeof *c);
    if (!c) {
        evutil_closesocket(fd);
        return;
    }
    c->px = px;
    c->fd = fd;
    c->route = &px_route_unknown;
    c->rev = event_new(px->base, fd, EV_READ | EV_PERSIST, conn_on_read, c);
    c->wev = event_new(px->base, fd, EV_WRITE | EV_PERSIST, conn_on_write, c);
    c->tev = evtimer_new(px->base, conn_on_timeout, c);
    c->out = evbuffer_new();
    if (!c->rev || !c->wev || !c->tev || !c->out) {
        if (c->rev) event_free(c->rev);
        if (c->wev) event_free(c->wev);
        if (c->tev) event_free(c->tev);
        if (c->out) evbuffer_free(c->out);
        evutil_closesocket(fd);
        free(c);
        return;
    }
    c->next = px->conns;
    if (px->conns) px->conns->prev = c;
    px->conns = c;
    px->nconns++;
    al_gauge_set(px->g_conns, px->nconns);
    conn_timeouts(c, 1);
    conn_reading(c, 1);
}

int px_conn_is_json(const conn *c)
{
    const al_slice *ct = al_http_header_get(&c->head, "content-type");
    if (!ct) return 0;
    size_t n = 0;
    while (n < ct->n && ct->p[n] != ';' && ct->p[n] != ' ')
        n++;
    al_slice t = {ct->p, n};
    return al_slice_caseeq(t, "application/json");
}

/* Parses the body as a JSON object; answers 415/400 and returns NULL otherwise. */
json_t *px_conn_body_json(conn *c, int required)
{
    if (c->body.n == 0 && !required) return json_object();
    if (!px_conn_is_json(c)) {
        px_conn_error(c, 415, "invalid_request_error", "unsupported_media_type",
                      "Content-Type must be application/json");
        return NULL;
    }
    json_error_t je;
    json_t *o = json_loadb(c->body.p, c->body.n, 0, &je);
    if (!o) {
        px_conn_error(c, 400, "invalid_request_error", "invalid_json",
                      "request body is not valid JSON: %s (line %d, column %d)", je.text, je.line,
                      je.column);
        return NULL;
    }
    if (!json_is_object(o)) {
        json_decref(o);
        px_conn_error(c, 400, "invalid_request_error", "invalid_json",
                      "request body must be a JSON object");
        return NULL;
    }
    return o;
}
