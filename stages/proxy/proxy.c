/*
 * arclight proxy: the capture proxy between an unchanged agent and an OpenAI-compatible
 * model server (issue 3).
 *
 * One thread runs one libevent loop: inbound HTTP/1.1 on plain socket events (http1.c parses
 * the head; answers leave at the end of the loop turn, after the turn's spans are spooled),
 * and the upstream calls through the proxy's own keep-alive client (upstream.c) or libcurl's
 * multi-socket interface driven by the same loop (curl's hiperfifo wiring; per-transfer state
 * in CURLOPT_PRIVATE). Each call's span is encoded and appended to the on-disk spool
 * (spool.c), whose own thread publishes to Kafka: agent traffic never waits for the broker.
 *
 * Routes (every path also under /r/{task}/{rollout}):
 *   POST /v1/chat/completions, POST /v1/completions   forwarded and captured
 *   GET  /v1/models                                   forwarded
 *   POST /reward, POST /end                           reward and rollout-end spans
 *   POST /v1/sessions                                 a session key standing for an identity
 *   GET  /healthz, GET /metrics                       on the proxy's port too
 */
#include "http1.h"
#include "spool.h"
#include "upstream.h"

#include "avro/codec.h"
#include "core/cli.h"
#include "core/log.h"
#include "core/util.h"
#include "http/metrics.h"
#include "http/server.h"
#include "kafka/kafka.h"

#include <arpa/inet.h>
#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/listener.h>
#include <event2/util.h>
#include <inttypes.h>
#include <jansson.h>
#include <float.h>
#include <math.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/socket.h>
#include <unistd.h>

#define COMP "proxy"

/* ------------------------------------------------------------------------------------------
 * Configuration and state
 * ------------------------------------------------------------------------------------------ */

typedef enum upkind { UP_ARCLIGHT, UP_VLLM, UP_SGLANG, UP_OPENAI } upkind;

typedef struct pconf {
    const char *listen;
    char *upstreams[16];
    size_t n_upstreams;
    upkind kind;
    char *upstream_key; /* injected as Authorization: Bearer; never logged */
    int forward_agent_auth;
    char *agent_keys[16];
    size_t n_agent_keys;
    size_t max_body;
    size_t max_head;
    size_t max_headers;
    int max_conns;
    int client_timeout_s;
    long connect_timeout_ms;
    long upstream_timeout_ms;
    const char *spool_dir;
    uint64_t spool_max;
    al_spool_fsync fsync_mode;
    const char *topic;
    const char *agent_name;
    int drain_timeout_s;
    int access_log;
    int curl_only; /* --upstream-client curl: no own client even for plain http:// */
} pconf;

enum {
    R_CHAT = 0,
    R_COMPL,
    R_MODELS,
    R_REWARD,
    R_END,
    R_SESSIONS,
    R_HEALTH,
    R_METRICS,
    R_OTHER,
    R_COUNT
};
static const char *route_names[R_COUNT] = {"chat_completions", "completions", "models",
                                           "reward",           "end",         "sessions",
                                           "healthz",          "metrics",     "unknown"};

typedef struct rollout_ent {
    char *key; /* task \x1f rollout \x1f attempt */
    int64_t next_seq, last_call_seq, last_used_mono;
    int dirty; /* its sequence numbers changed since the state file last had them */
    struct rollout_ent *next;
} rollout_ent;

typedef struct session_ent {
    char key[80];
    char *task, *rollout;
    int attempt;
    struct session_ent *next;
} session_ent;

typedef struct status_series {
    int route, status;
    al_counter *c;
} status_series;

typedef struct call call;
typedef struct conn conn;
static int call_resume(call *k);

typedef struct proxy {
    pconf cfg;
    struct event_base *base;
    struct evconnlistener *listener;
    CURLM *multi;
    struct event *curl_timer, *sig_term, *sig_int, *drain_timer, *sweep_timer;
    int running;
    al_spool *spool;
    al_metrics *metrics;
    al_counter *spans_spooled, *spans_failed, *rejected_spool_full;
    al_gauge *g_conns, *g_inflight, *g_spool_bytes, *g_spool_records;
    al_counter *c_published, *c_dropped;
    uint64_t seen_published, seen_dropped; /* already added to the counters */
    pthread_mutex_t collect_mu;            /* renders come from two threads */
    al_histogram *h_overhead, *h_upstream;
    status_series series[128];
    size_t nseries;
    rollout_ent **rtab;
    size_t rtab_size, rtab_count;
    session_ent *sessions[1024];
    size_t nsessions;
    conn *conns;
    call *calls; /* every call in flight, attached to a connection or not */
    int nconns;
    int inflight;
    int draining;
    int64_t drain_deadline_mono;
    uint64_t rng;
    al_buf enc;
    al_buf strip; /* the agent's copy of an answer (strip_for_agent), used at once: shared */
    CURL *easy_pool[256];             /* finished handles, reset and reused (saves their setup) */
    al_upc_pool *upc;                 /* own keep-alive client for plain http:// upstreams */
    char up_public[16][512];          /* each upstream's URL without credentials (url_public) */
    struct event *flush_ev;           /* the spool's write of this loop turn's spans */
    struct event *out_ev;             /* the turn's answers (conn_flush_turn), after its spans */
    conn *wq_head, *wq_tail, *wbatch; /* connections with answers to write this turn */
    /* the state file: sequence numbers and session keys that outlive a restart */
    char state_path[4200];
    int state_fd;
    uint64_t state_bytes;
    int state_warned;
    al_buf state_pend;
    rollout_ent **dirty;
    size_t ndirty, dirty_cap;
    size_t spool_pending; /* spans appended since the last flush */
    size_t n_easy_pool;
    int port;
} proxy;

/* ------------------------------------------------------------------------------------------
 * Small helpers
 * ------------------------------------------------------------------------------------------ */

static uint64_t rng_next(proxy *px)
{
    /* xorshift64*, seeded from getrandom: ids need to be unique, not secret */
    uint64_t x = px->rng;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    px->rng = x;
    return x * 0x2545F4914F6CDD1DULL;
}

static void rand_hex(proxy *px, char *out, size_t nhex)
{
    static const char hx[] = "0123456789abcdef";
    for (size_t i = 0; i < nhex; i += 16) {
        uint64_t r = rng_next(px);
        for (size_t k = 0; k < 16 && i + k < nhex; k++)
            out[i + k] = hx[(r >> (4 * k)) & 15];
    }
    out[nhex] = '\0';
}

/* Secret-grade random hex for session keys. */
static int secret_hex(char *out, size_t nbytes)
{
    uint8_t b[32];
    if (nbytes > sizeof b || getrandom(b, nbytes, 0) != (ssize_t)nbytes) return -1;
    al_hex(b, nbytes, out);
    return 0;
}

static char *slice_dup(al_slice s)
{
    char *r = malloc(s.n + 1);
    if (!r) return NULL;
    memcpy(r, s.p, s.n);
    r[s.n] = '\0';
    return r;
}

/* Identity values: 1..128 of [A-Za-z0-9._:@-]. */
static int id_valid(const char *p, size_t n)
{
    if (n == 0 || n > 128) return 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)p[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == ':' || c == '@' || c == '-'))
            return 0;
    }
    return 1;
}

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

static void count_request(proxy *px, int route, int status)
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
                                       route_names[route], "status", st, NULL);
    if (px->nseries < AL_ARRAY_LEN(px->series))
        px->series[px->nseries++] = (status_series){route, status, c};
    al_counter_inc(c);
}

/* ------------------------------------------------------------------------------------------
 * Inbound connections
 * ------------------------------------------------------------------------------------------ */

enum { C_READ, C_BUSY, C_STREAM, C_WRITING };

/* An agent's connection. Its socket is read and written directly rather than through a
 * bufferevent: the read event stays registered for the connection's whole life, and an
 * answer is written at the end of the loop turn that produced it (conn_flush_turn), after
 * that turn's spans are on disk; only an answer the socket cannot take at once waits for
 * EPOLLOUT. Per call this saves the epoll_ctl pair of a bufferevent's write enable/disable
 * and the FIONREAD ioctl it makes before every read. */
struct conn {
    proxy *px;
    int fd;
    struct event *rev; /* readable; registered while `reading` */
    struct event *wev; /* writable; registered only while an answer is blocked */
    struct event *tev; /* the read timeout (C_READ) or the write timeout (blocked answer) */
    char *in;          /* bytes read ahead of the current request (kept across requests) */
    size_t in_len, in_cap;
    struct evbuffer *out;
    int state;
    int keep_alive;
    int sent_continue;
    int reading;       /* rev is registered */
    int no_read;       /* reading stopped for good: a malformed request is being answered */
    int queued;        /* on px->wq or the batch conn_flush_turn is writing */
    int write_blocked; /* wev is registered */
    char *req;         /* head + body of the current request (owned) */
    size_t req_len;
    al_http1_head head;
    al_slice body;
    int route;
    int64_t t0_mono, start_us;
    call *call;
    conn *prev, *next;
    conn *wprev, *wnext; /* the write queue */
};

static void conn_read_cb(conn *c);
static void conn_free(conn *c);

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
static void conn_reply(conn *c, int status, const char *ctype, const char *extra, const char *body,
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
    conn_finish_request(c);
}

static void conn_error(conn *c, int status, const char *type, const char *code, const char *fmt,
                       ...) __attribute__((format(printf, 5, 6)));

/* An OpenAI-style error body: {"error":{"message","type","param","code"}}. */
static void conn_error(conn *c, int status, const char *type, const char *code, const char *fmt,
                       ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    json_t *j = json_pack("{s:{s:s,s:s,s:n,s:s}}", "error", "message", msg, "type", type, "param",
                          "code", code);
    char *body = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    const char *b = body ? body : "{\"error\":{\"message\":\"error\"}}";
    conn_reply(c, status, "application/json", NULL, b, strlen(b));
    free(body);
}

static void conn_stream_begin(conn *c, int status, const char *ctype, const char *extra)
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

static void conn_stream_write(conn *c, const char *data, size_t len)
{
    if (!len) return;
    struct evbuffer *out = conn_out(c);
    evbuffer_add_printf(out, "%zx\r\n", len);
    evbuffer_add(out, data, len);
    evbuffer_add(out, "\r\n", 2);
}

static void conn_stream_end(conn *c)
{
    evbuffer_add(conn_out(c), "0\r\n\r\n", 5);
    c->state = C_WRITING;
    conn_finish_request(c);
}

/* Reading stays enabled for the connection's whole life (no epoll_ctl per request, and an
 * agent that hangs up mid-call is noticed); the read timeout runs only while a request is
 * awaited, since a call with the upstream may take minutes. A blocked answer has its own
 * (write) timeout. */
static void conn_timeouts(conn *c, int reading)
{
    struct timeval to = {c->px->cfg.client_timeout_s, 0};
    if (reading || c->write_blocked)
        evtimer_add(c->tev, &to);
    else
        evtimer_del(c->tev);
}

/* Everything queued has left: a paused stream goes on, a finished answer goes back to
 * reading (or closes). May free c. */
static void conn_written(conn *c)
{
    if (c->state == C_STREAM && c->call && call_resume(c->call)) return;
    if (c->state != C_WRITING) return;
    if (!c->keep_alive) {
        conn_free(c);
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
        conn_free(c);
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
static void spool_flush_cb(evutil_socket_t fd, short what, void *arg);
static void conn_flush_turn(evutil_socket_t fd, short what, void *arg)
{
    proxy *px = arg;
    spool_flush_cb(fd, what, px);
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

static void call_detach(call *k);

/* The read timeout (a request that never completed gets a 408, like nginx's) or the write
 * timeout (an agent that does not read its answer). */
static void conn_on_timeout(evutil_socket_t fd, short what, void *arg)
{
    conn *c = arg;
    (void)fd;
    (void)what;
    if (!c->write_blocked && c->state == C_READ && c->req_len == 0 && c->in_len > 0) {
        c->keep_alive = 0;
        c->route = R_OTHER;
        conn_error(c, 408, "invalid_request_error", "request_timeout",
                   "the request was not received in time");
        conn_stop_reading(c);
        return;
    }
    if (!c->write_blocked && c->state != C_READ) return; /* with the upstream: no timeout */
    conn_free(c);
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
                conn_free(c);
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
            conn_free(c);
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

static void conn_free(conn *c)
{
    proxy *px = c->px;
    if (c->call) call_detach(c->call);
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
    evbuffer_free(c->out);
    evutil_closesocket(c->fd);
    free(c->req);
    free(c);
}

static void dispatch(conn *c);

/* Reads one request: the head (within the header limits), then Content-Length bytes of body
 * (within the body limit). Anything malformed is answered with its 4xx and the connection
 * is closed, since the rest of the stream cannot be trusted. */
static void conn_read_cb(conn *c)
{
    proxy *px = c->px;
    if (c->state != C_READ || c->no_read) return;
    size_t len = c->in_len;
    if (!len) return;
    size_t look = len < px->cfg.max_head ? len : px->cfg.max_head;
    const char *p = c->in;
    al_http1_limits lim = {px->cfg.max_head, px->cfg.max_headers};
    char err[128];
    int hl = al_http1_parse_head(p, look, &lim, &c->head, err, sizeof err);
    if (hl == 0) return;
    c->route = R_OTHER;
    if (hl < 0) {
        c->keep_alive = 0;
        conn_stop_reading(c);
        conn_error(c, -hl, "invalid_request_error",
                   -hl == 431 ? "headers_too_large" : "bad_request", "%s", err);
        return;
    }
    c->keep_alive = c->head.keep_alive;
    if (c->head.chunked) {
        c->keep_alive = 0;
        conn_stop_reading(c);
        conn_error(c, 411, "invalid_request_error", "length_required",
                   "chunked request bodies are not accepted; send Content-Length");
        return;
    }
    int64_t cl = c->head.content_length < 0 ? 0 : c->head.content_length;
    if ((uint64_t)cl > px->cfg.max_body) {
        c->keep_alive = 0;
        conn_stop_reading(c);
        conn_error(c, 413, "invalid_request_error", "request_too_large",
                   "request body of %" PRId64 " bytes is larger than the limit of %zu bytes", cl,
                   px->cfg.max_body);
        return;
    }
    if (len < (size_t)hl + (size_t)cl) {
        /* curl and others wait up to a second for this before sending a large body */
        const al_slice *ex = al_http1_header_get(&c->head, "expect");
        if (ex && al_slice_caseeq(*ex, "100-continue") && !c->sent_continue) {
            c->sent_continue = 1;
            evbuffer_add(conn_out(c), "HTTP/1.1 100 Continue\r\n\r\n", 25);
        }
        return;
    }
    c->sent_continue = 0;
    c->req_len = (size_t)hl + (size_t)cl;
    c->req = malloc(c->req_len + 1);
    if (!c->req) {
        conn_free(c);
        return;
    }
    memcpy(c->req, c->in, c->req_len);
    c->req[c->req_len] = '\0';
    /* the slices point into the input buffer: move them to our copy (same offsets) */
    al_http1_head *h = &c->head;
    h->method.p = c->req + (h->method.p - p);
    h->target.p = c->req + (h->target.p - p);
    for (size_t i = 0; i < h->nheaders; i++) {
        h->headers[i].name.p = c->req + (h->headers[i].name.p - p);
        h->headers[i].value.p = c->req + (h->headers[i].value.p - p);
    }
    c->in_len -= c->req_len;
    if (c->in_len) {
        memmove(c->in, c->in + c->req_len, c->in_len);
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
    dispatch(c);
}

static void accept_cb(struct evconnlistener *l, evutil_socket_t fd, struct sockaddr *sa, int salen,
                      void *arg)
{
    proxy *px = arg;
    (void)l;
    (void)sa;
    (void)salen;
    if (px->nconns >= px->cfg.max_conns) {
        static const char busy[] =
            "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
            "Content-Length: 113\r\nConnection: close\r\n\r\n"
            "{\"error\":{\"message\":\"too many connections to the "
            "proxy\",\"type\":\"server_error\","
            "\"param\":null,\"code\":\"overloaded\"}}";
        ssize_t w = send(fd, busy, sizeof busy - 1, MSG_NOSIGNAL | MSG_DONTWAIT);
        (void)w;
        evutil_closesocket(fd);
        count_request(px, R_OTHER, 503);
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

/* ------------------------------------------------------------------------------------------
 * Rollouts and sessions
 * ------------------------------------------------------------------------------------------ */

static uint64_t fnv1a(const char *s)
{
    uint64_t h = 1469598103934665603ULL;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ULL;
    return h;
}

/* ------------------------------------------------------------------------------------------
 * State file (spool_dir/proxy-state): what must outlive a restart besides the spans, so
 * that a rollout going on after a restart does not start again at sequence 0 and its
 * session key still works. Append-only lines, written with the spool's write at the end of
 * the loop turn that changed them:
 *   Q \t task\x1frollout\x1fattempt \t next_seq \t last_call_seq     (latest line wins)
 *   S \t session key \t task \t rollout \t attempt
 * Rewritten whole (temp file + rename) at start and when it passes 16 MiB; a torn last
 * line (a crash mid-write) is skipped with a warning.
 * ------------------------------------------------------------------------------------------ */

#define STATE_MAX_BYTES (16u << 20)

static void state_mark(proxy *px, rollout_ent *e)
{
    if (e->dirty || px->state_fd < 0) return;
    if (px->ndirty == px->dirty_cap) {
        size_t nc = px->dirty_cap ? px->dirty_cap * 2 : 256;
        rollout_ent **nd = realloc(px->dirty, nc * sizeof *nd);
        if (!nd) return; /* not recorded: after a restart this rollout restarts at 0 */
        px->dirty = nd;
        px->dirty_cap = nc;
    }
    e->dirty = 1;
    px->dirty[px->ndirty++] = e;
    if (px->flush_ev) event_active(px->flush_ev, EV_TIMEOUT, 1);
}

static void state_line(al_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void state_line(al_buf *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0 || al_buf_reserve(b, (size_t)n + 1)) return;
    va_start(ap, fmt);
    vsnprintf((char *)b->data + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

static void session_line(al_buf *b, const session_ent *s)
{
    state_line(b, "S\t%s\t%s\t%s\t%d\n", s->key, s->task, s->rollout, s->attempt);
}

/* Rewrites the state file from memory and opens it for appending. */
static void state_compact(proxy *px)
{
    al_buf b = {0};
    for (size_t i = 0; i < px->rtab_size; i++)
        for (rollout_ent *e = px->rtab[i]; e; e = e->next)
            state_line(&b, "Q\t%s\t%" PRId64 "\t%" PRId64 "\n", e->key, e->next_seq,
                       e->last_call_seq);
    for (size_t i = 0; i < 1024; i++)
        for (session_ent *s = px->sessions[i]; s; s = s->next)
            session_line(&b, s);
    char err[512];
    if (px->state_fd >= 0) close(px->state_fd);
    px->state_fd = -1;
    if (al_file_write_atomic(px->state_path, b.len ? (const char *)b.data : "", b.len, err,
                             sizeof err) != 0) {
        al_log_warn(COMP, "state file: %s; sequence numbers restart at 0 after a restart", err);
    } else {
        px->state_fd = open(px->state_path, O_WRONLY | O_APPEND | O_CLOEXEC);
        if (px->state_fd < 0)
            al_log_warn(COMP, "state file %s: %s", px->state_path, strerror(errno));
    }
    px->state_bytes = b.len;
    al_buf_free(&b);
}

/* Appends this turn's changes: the dirty rollouts' numbers after the session lines already
 * queued in state_pend. */
static void state_flush(proxy *px)
{
    for (size_t i = 0; i < px->ndirty; i++) {
        rollout_ent *e = px->dirty[i];
        state_line(&px->state_pend, "Q\t%s\t%" PRId64 "\t%" PRId64 "\n", e->key, e->next_seq,
                   e->last_call_seq);
        e->dirty = 0;
    }
    px->ndirty = 0;
    if (!px->state_pend.len || px->state_fd < 0) {
        px->state_pend.len = 0;
        return;
    }
    ssize_t w = write(px->state_fd, px->state_pend.data, px->state_pend.len);
    if (w != (ssize_t)px->state_pend.len && !px->state_warned) {
        px->state_warned = 1;
        al_log_warn(COMP, "state file %s: %s; sequence numbers may restart after a restart",
                    px->state_path, w < 0 ? strerror(errno) : "short write");
    }
    px->state_bytes += px->state_pend.len;
    px->state_pend.len = 0;
    if (px->state_bytes > STATE_MAX_BYTES) state_compact(px);
}

static rollout_ent *rollout_get(proxy *px, const char *task, const char *rollout, int attempt);

/* Reads the state file left by an earlier run (absent: a first start). */
static void state_load(proxy *px)
{
    char err[512];
    size_t len = 0;
    char *buf = al_file_read(px->state_path, &len, err, sizeof err);
    if (!buf) return;
    size_t nq = 0, ns = 0, bad = 0;
    for (char *line = buf, *nl; line < buf + len; line = nl + 1) {
        nl = memchr(line, '\n', (size_t)(buf + len - line));
        if (!nl) {
            bad++; /* torn last line */
            break;
        }
        *nl = '\0';
        char *f[6];
        int nf = 0;
        for (char *p = line; nf < 6;) {
            f[nf++] = p;
            char *t = strchr(p, '\t');
            if (!t) break;
            *t = '\0';
            p = t + 1;
        }
        char *end;
        if (nf == 4 && !strcmp(f[0], "Q")) {
            char *a = strchr(f[1], '\x1f'), *b = a ? strchr(a + 1, '\x1f') : NULL;
            if (!b) {
                bad++;
                continue;
            }
            *a = *b = '\0';
            long at = strtol(b + 1, &end, 10);
            long long nx = strtoll(f[2], NULL, 10), lc = strtoll(f[3], NULL, 10);
            if (*end || at < 0 || at > 999999 || !id_valid(a + 1, strlen(a + 1)) ||
                (*f[1] && !id_valid(f[1], strlen(f[1]))) || nx < 0 || lc < -1) {
                bad++;
                continue;
            }
            rollout_ent *e = rollout_get(px, f[1], a + 1, (int)at);
            if (!e) break;
            if (nx > e->next_seq) e->next_seq = nx;
            if (lc > e->last_call_seq) e->last_call_seq = lc;
            nq++;
        } else if (nf == 5 && !strcmp(f[0], "S")) {
            long at = strtol(f[4], &end, 10);
            if (*end || at < 0 || at > 999999 || strncmp(f[1], "sk-arclight-", 12) != 0 ||
                strlen(f[1]) >= sizeof((session_ent *)0)->key || !id_valid(f[3], strlen(f[3])) ||
                (*f[2] && !id_valid(f[2], strlen(f[2])))) {
                bad++;
                continue;
            }
            session_ent *s = calloc(1, sizeof *s);
            if (!s) break;
            snprintf(s->key, sizeof s->key, "%s", f[1]);
            s->task = strdup(f[2]);
            s->rollout = strdup(f[3]);
            s->attempt = (int)at;
            size_t h = fnv1a(s->key) & 1023;
            s->next = px->sessions[h];
            px->sessions[h] = s;
            px->nsessions++;
            ns++;
        } else {
            bad++;
        }
    }
    free(buf);
    px->ndirty = 0; /* what was just read is on disk already */
    for (size_t i = 0; i < px->rtab_size; i++)
        for (rollout_ent *e = px->rtab[i]; e; e = e->next)
            e->dirty = 0;
    if (nq || ns)
        al_log_info(COMP, "state: %zu rollouts' sequence numbers and %zu session keys from %s", nq,
                    ns, px->state_path);
    if (bad)
        al_log_warn(COMP, "state file %s: %zu lines not understood, skipped", px->state_path, bad);
}

static rollout_ent *rollout_get(proxy *px, const char *task, const char *rollout, int attempt)
{
    char key[512];
    snprintf(key, sizeof key, "%s\x1f%s\x1f%d", task, rollout, attempt);
    if (px->rtab_count >= px->rtab_size) {
        size_t ns = px->rtab_size ? px->rtab_size * 2 : 1024;
        rollout_ent **nt = calloc(ns, sizeof *nt);
        if (!nt) return NULL;
        for (size_t i = 0; i < px->rtab_size; i++)
            for (rollout_ent *e = px->rtab[i], *nx; e; e = nx) {
                nx = e->next;
                size_t b = fnv1a(e->key) & (ns - 1);
                e->next = nt[b];
                nt[b] = e;
            }
        free(px->rtab);
        px->rtab = nt;
        px->rtab_size = ns;
    }
    size_t b = fnv1a(key) & (px->rtab_size - 1);
    for (rollout_ent *e = px->rtab[b]; e; e = e->next)
        if (strcmp(e->key, key) == 0) {
            e->last_used_mono = al_mono_us();
            state_mark(px, e);
            return e;
        }
    rollout_ent *e = calloc(1, sizeof *e);
    if (!e || !(e->key = strdup(key))) {
        free(e);
        return NULL;
    }
    e->last_call_seq = -1;
    e->last_used_mono = al_mono_us();
    e->next = px->rtab[b];
    px->rtab[b] = e;
    px->rtab_count++;
    state_mark(px, e);
    return e;
}

/* Forgets rollouts idle for an hour (their sequence numbers restart only if the agent comes
 * back after that, which a rollout does not). */
static void sweep_cb(evutil_socket_t fd, short what, void *arg)
{
    proxy *px = arg;
    (void)fd;
    (void)what;
    int64_t cutoff = al_mono_us() - 3600LL * 1000000;
    state_flush(px); /* no dirty entry may be freed below */
    for (size_t i = 0; i < px->rtab_size; i++) {
        rollout_ent **pp = &px->rtab[i];
        while (*pp) {
            rollout_ent *e = *pp;
            if (e->last_used_mono < cutoff) {
                *pp = e->next;
                free(e->key);
                free(e);
                px->rtab_count--;
            } else {
                pp = &e->next;
            }
        }
    }
}

static session_ent *session_find(proxy *px, const char *key, size_t n)
{
    if (n >= 80) return NULL;
    char k[80];
    memcpy(k, key, n);
    k[n] = '\0';
    for (session_ent *s = px->sessions[fnv1a(k) & 1023]; s; s = s->next)
        if (strcmp(s->key, k) == 0) return s;
    return NULL;
}

/* ------------------------------------------------------------------------------------------
 * Identity of a request
 * ------------------------------------------------------------------------------------------ */

typedef struct ident {
    char task[130], rollout[140];
    int attempt;
    int untracked;
    int from_session;
} ident;

/* The bearer token of the request, if any. */
static int bearer(const conn *c, al_slice *tok)
{
    const al_slice *a = al_http1_header_get(&c->head, "authorization");
    if (!a || a->n < 7 || strncasecmp(a->p, "Bearer ", 7) != 0) return 0;
    tok->p = a->p + 7;
    tok->n = a->n - 7;
    while (tok->n && tok->p[0] == ' ')
        tok->p++, tok->n--;
    return 1;
}

/* Resolves identity from the URL prefix (already in id), else headers, else the session
 * key; none at all gives an untracked rollout with a fresh id. -1 after answering 400. */
static int resolve_identity(conn *c, ident *id, int have_prefix)
{
    proxy *px = c->px;
    const al_slice *h;
    if (!have_prefix) {
        const al_slice *ht = al_http1_header_get(&c->head, "x-arclight-task");
        const al_slice *hr = al_http1_header_get(&c->head, "x-arclight-rollout");
        al_slice tok;
        session_ent *s;
        if (ht || hr) {
            if (!hr || !id_valid(hr->p, hr->n) || (ht && ht->n && !id_valid(ht->p, ht->n))) {
                conn_error(c, 400, "invalid_request_error", "invalid_identity",
                           "X-Arclight-Task and X-Arclight-Rollout must be 1-128 characters of "
                           "A-Z a-z 0-9 . _ : @ - (X-Arclight-Rollout is required with them)");
                return -1;
            }
            snprintf(id->task, sizeof id->task, "%.*s", ht ? (int)ht->n : 0, ht ? ht->p : "");
            snprintf(id->rollout, sizeof id->rollout, "%.*s", (int)hr->n, hr->p);
        } else if (bearer(c, &tok) && (s = session_find(px, tok.p, tok.n))) {
            snprintf(id->task, sizeof id->task, "%s", s->task);
            snprintf(id->rollout, sizeof id->rollout, "%s", s->rollout);
            id->attempt = s->attempt;
            id->from_session = 1;
        } else {
            id->task[0] = '\0';
            memcpy(id->rollout, "untracked-", 10);
            rand_hex(px, id->rollout + 10, 32);
            id->untracked = 1;
        }
    }
    if ((h = al_http1_header_get(&c->head, "x-arclight-attempt"))) {
        int a = 0;
        if (h->n == 0 || h->n > 6) a = -1;
        for (size_t i = 0; i < h->n && a >= 0; i++)
            a = h->p[i] >= '0' && h->p[i] <= '9' ? a * 10 + (h->p[i] - '0') : -1;
        if (a < 0) {
            conn_error(c, 400, "invalid_request_error", "invalid_identity",
                       "X-Arclight-Attempt must be an integer from 0 to 999999");
            return -1;
        }
        id->attempt = a;
    }
    return 0;
}

/* With --agent-key configured, a request must carry one of the keys or a session key. */
static int authorized(conn *c)
{
    proxy *px = c->px;
    if (!px->cfg.n_agent_keys) return 1;
    al_slice tok;
    if (!bearer(c, &tok)) return 0;
    for (size_t i = 0; i < px->cfg.n_agent_keys; i++)
        if (al_slice_eq(tok, px->cfg.agent_keys[i])) return 1;
    return session_find(px, tok.p, tok.n) != NULL;
}

/* ------------------------------------------------------------------------------------------
 * Spans
 * ------------------------------------------------------------------------------------------ */

static void span_init(proxy *px, al_span *s, const ident *id, int64_t seq, const conn *c,
                      char *trace, char *span_id, char *parent)
{
    memset(s, 0, sizeof *s);
    const al_slice *tp = c ? al_http1_header_get(&c->head, "traceparent") : NULL;
    /* 00-<32 hex trace>-<16 hex parent>-<2 hex flags> */
    if (tp && tp->n == 55 && tp->p[2] == '-' && tp->p[35] == '-' && tp->p[52] == '-') {
        int ok = 1;
        for (size_t i = 3; i < 52 && ok; i++)
            if (i != 35 &&
                !((tp->p[i] >= '0' && tp->p[i] <= '9') || (tp->p[i] >= 'a' && tp->p[i] <= 'f')))
                ok = 0;
        if (ok) {
            memcpy(trace, tp->p + 3, 32);
            trace[32] = '\0';
            memcpy(parent, tp->p + 36, 16);
            parent[16] = '\0';
            s->parent_span_id = parent;
        } else {
            rand_hex(px, trace, 32);
        }
    } else {
        rand_hex(px, trace, 32);
    }
    rand_hex(px, span_id, 16);
    s->trace_id = trace;
    s->span_id = span_id;
    s->task_id = id->task;
    s->rollout_id = id->rollout;
    s->attempt = id->attempt;
    s->sequence = seq;
    s->timestamp_us = al_now_us();
}

/* Writes the spans this loop turn appended as one write (it runs after the turn's other
 * callbacks, and before their answers leave: conn_flush_turn calls it first). Spans the disk did
 * not take are logged and counted as failed. */
static void spool_flush(proxy *px)
{
    if (!px->spool_pending) return;
    size_t written = 0;
    char err[512];
    if (al_spool_flush(px->spool, &written, err, sizeof err) != 0) {
        al_log_error(COMP, "%zu spans lost: %s", px->spool_pending - written, err);
        al_counter_add(px->spans_failed, (double)(px->spool_pending - written));
    }
    al_counter_add(px->spans_spooled, (double)written);
    px->spool_pending = 0;
}

static void state_flush(proxy *px);

static void spool_flush_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    spool_flush(arg);
    state_flush(arg);
}

/* Encodes and spools a span, keyed by task (else rollout) so that a task's rollouts share a
 * partition; it reaches the disk at the end of this loop turn (spool_flush). 0, or -1
 * (logged and counted). */
static int span_publish(proxy *px, const al_span *s)
{
    char err[512];
    if (al_span_encode(s, &px->enc, err, sizeof err) != 0) {
        al_log_error(COMP, "cannot encode span of rollout %s: %s", s->rollout_id, err);
        al_counter_inc(px->spans_failed);
        return -1;
    }
    const char *key = s->task_id && *s->task_id ? s->task_id : s->rollout_id;
    if (al_spool_append(px->spool, key, strlen(key), px->enc.data, px->enc.len, err, sizeof err) !=
        0) {
        al_log_error(COMP, "span of rollout %s sequence %" PRId64 " lost: %s", s->rollout_id,
                     s->sequence, err);
        al_counter_inc(px->spans_failed);
        return -1;
    }
    if (!px->spool_pending++ && px->flush_ev) event_active(px->flush_ev, EV_TIMEOUT, 1);
    return 0;
}

/* ------------------------------------------------------------------------------------------
 * Upstream calls
 * ------------------------------------------------------------------------------------------ */

typedef struct ivec {
    int32_t *v;
    size_t n, cap;
} ivec;

typedef struct fvec {
    float *v;
    size_t n, cap;
} fvec;

static void ivec_push(ivec *a, int32_t x)
{
    if (a->n == a->cap) {
        size_t nc = a->cap ? a->cap * 2 : 64;
        int32_t *nv = realloc(a->v, nc * sizeof *nv);
        if (!nv) return;
        a->v = nv;
        a->cap = nc;
    }
    a->v[a->n++] = x;
}

static void fvec_push(fvec *a, float x)
{
    if (a->n == a->cap) {
        size_t nc = a->cap ? a->cap * 2 : 64;
        float *nv = realloc(a->v, nc * sizeof *nv);
        if (!nv) return;
        a->v = nv;
        a->cap = nc;
    }
    a->v[a->n++] = x;
}

struct call {
    proxy *px;
    conn *c;
    CURL *easy;
    al_upc *uc; /* the exchange on the own client, instead of easy */
    struct curl_slist *hdrs;
    int route;
    ident id;
    int64_t seq;
    char *agent;
    char *method_path; /* for the access log */
    char *req_json;    /* as the agent sent it */
    char *up_body;
    size_t up_len;
    char *model;
    int stream, want_logprobs, want_token_ids, injected_usage, is_chat, capture;
    int up_idx, tries;
    char url[1100];
    al_buf body; /* non-streamed response, or the pending SSE bytes */
    long status;
    char ctype[128];
    int64_t policy_version;
    int64_t start_us, first_byte_us, first_token_us, end_us;
    int64_t t0_mono, sent_mono, done_mono, pre_us;
    int headers_sent;
    int paused; /* the agent reads slower than the upstream writes */
    ivec prompt, resp_ids;
    fvec lps;
    char *finish;
    al_usage usage;
    int have_usage;
    /* stream merge */
    al_buf content;
    json_t *tools;
    char *s_id, *s_model;
    json_int_t s_created;
    char *error;
    char errbuf[CURL_ERROR_SIZE];
    char trace[33], span_id[17], parent[17];
    char parent_set;
    call *cprev, *cnext;
};

static void call_free(call *k)
{
    if (k->cprev)
        k->cprev->cnext = k->cnext;
    else if (k->px->calls == k)
        k->px->calls = k->cnext;
    if (k->cnext) k->cnext->cprev = k->cprev;
    if (k->easy) {
        proxy *px = k->px;
        curl_multi_remove_handle(px->multi, k->easy);
        if (px->n_easy_pool < AL_ARRAY_LEN(px->easy_pool))
            px->easy_pool[px->n_easy_pool++] = k->easy;
        else
            curl_easy_cleanup(k->easy);
    }
    al_upc_cancel(k->uc);
    curl_slist_free_all(k->hdrs);
    free(k->agent);
    free(k->method_path);
    free(k->req_json);
    free(k->up_body);
    free(k->model);
    al_buf_free(&k->body);
    if (k->px->strip.cap > (4u << 20)) al_buf_free(&k->px->strip); /* one huge answer */
    free(k->prompt.v);
    free(k->resp_ids.v);
    free(k->lps.v);
    free(k->finish);
    al_buf_free(&k->content);
    json_decref(k->tools);
    free(k->s_id);
    free(k->s_model);
    free(k->error);
    free(k);
}

/* The agent went away: the call goes on for the span, its answer is dropped. */
static void call_detach(call *k)
{
    k->c = NULL;
    call_resume(k);
}

/* Resumes a paused stream once the agent has taken what was waiting. Returns 1 when the
 * transfer was paused (the caller's connection may have changed state meanwhile). */
static int call_resume(call *k)
{
    if (!k->paused || (!k->easy && !k->uc)) return 0;
    k->paused = 0;
    if (k->uc)
        al_upc_resume(k->uc);
    else
        curl_easy_pause(k->easy, CURLPAUSE_CONT);
    return 1;
}

/* A logprob as a float: beyond the float range it becomes an infinity (converting it would
 * be undefined), which the batch stage refuses as not finite. */
static float lp_float(double d)
{
    return d > FLT_MAX ? INFINITY : d < -FLT_MAX ? -INFINITY : (float)d;
}

static void capture_ids(json_t *arr, ivec *out)
{
    size_t i;
    json_t *v;
    if (!json_is_array(arr)) return;
    json_array_foreach(arr, i, v) if (json_is_integer(v))
        ivec_push(out, (int32_t)json_integer_value(v));
}

/* Reads what training needs from one response object or stream chunk: token ids, logprobs,
 * finish reason, usage, and for streams the text / tool-call deltas to merge. */
static void capture_object(call *k, json_t *o, int streamed)
{
    json_t *ch = json_object_get(o, "choices"), *c0 = json_array_get(ch, 0);
    capture_ids(json_object_get(o, "prompt_token_ids"), &k->prompt);
    json_t *u = json_object_get(o, "usage");
    if (json_is_object(u)) {
        k->have_usage = 1;
        k->usage.prompt_tokens = json_integer_value(json_object_get(u, "prompt_tokens"));
        k->usage.completion_tokens = json_integer_value(json_object_get(u, "completion_tokens"));
        k->usage.total_tokens = json_integer_value(json_object_get(u, "total_tokens"));
        k->usage.cached_tokens = json_integer_value(
            json_object_get(json_object_get(u, "prompt_tokens_details"), "cached_tokens"));
    }
    if (streamed) {
        const char *id = json_string_value(json_object_get(o, "id"));
        const char *m = json_string_value(json_object_get(o, "model"));
        if (id && !k->s_id) k->s_id = strdup(id);
        if (m && !k->s_model) k->s_model = strdup(m);
        if (json_is_integer(json_object_get(o, "created")))
            k->s_created = json_integer_value(json_object_get(o, "created"));
    }
    if (!json_is_object(c0)) return;
    if (!k->prompt.n) capture_ids(json_object_get(c0, "prompt_token_ids"), &k->prompt);
    size_t before = k->resp_ids.n;
    capture_ids(json_object_get(c0, "token_ids"), &k->resp_ids);
    json_t *lp = json_object_get(c0, "logprobs"), *v;
    size_t i;
    if (json_is_object(lp)) {
        json_t *content = json_object_get(lp, "content");
        json_t *tl = json_object_get(lp, "token_logprobs");
        if (json_is_array(content)) {
            json_array_foreach(content, i, v)
                fvec_push(&k->lps, lp_float(json_number_value(json_object_get(v, "logprob"))));
        } else if (json_is_array(tl)) {
            json_array_foreach(tl, i, v) fvec_push(&k->lps, lp_float(json_number_value(v)));
        }
    }
    const char *fr = json_string_value(json_object_get(c0, "finish_reason"));
    if (fr) {
        free(k->finish);
        k->finish = strdup(fr);
    }
    if (!streamed) return;
    json_t *delta = json_object_get(c0, "delta");
    const char *text =
        json_string_value(json_object_get(delta ? delta : c0, delta ? "content" : "text"));
    int got = k->resp_ids.n > before;
    if (text && *text) {
        al_buf_append(&k->content, text, strlen(text));
        got = 1;
    }
    json_t *tcs = json_object_get(delta, "tool_calls"), *tc;
    if (json_is_array(tcs)) {
        if (!k->tools) k->tools = json_array();
        json_array_foreach(tcs, i, tc)
        {
            size_t idx = (size_t)json_integer_value(json_object_get(tc, "index"));
            if (idx > 128) continue;
            while (json_array_size(k->tools) <= idx)
                json_array_append_new(k->tools, json_pack("{s:s,s:s,s:{s:s,s:s}}", "id", "", "type",
                                                          "function", "function", "name", "",
                                                          "arguments", ""));
            json_t *dst = json_array_get(k->tools, idx), *fn = json_object_get(dst, "function");
            const char *s;
            if ((s = json_string_value(json_object_get(tc, "id"))))
                json_object_set_new(dst, "id", json_string(s));
            json_t *sf = json_object_get(tc, "function");
            const char *keys[2] = {"name", "arguments"};
            for (int q = 0; q < 2; q++)
                if ((s = json_string_value(json_object_get(sf, keys[q])))) {
                    const char *old = json_string_value(json_object_get(fn, keys[q]));
                    size_t ol = old ? strlen(old) : 0, nl = strlen(s);
                    char *cat = malloc(ol + nl + 1);
                    if (!cat) continue;
                    memcpy(cat, old ? old : "", ol);
                    memcpy(cat + ol, s, nl + 1);
                    json_object_set_new(fn, keys[q], json_string(cat));
                    free(cat);
                }
        }
        got = 1;
    }
    if (got && !k->first_token_us) k->first_token_us = al_now_us();
}

/* ------------------------------------------------------------------------------------------
 * Fast paths: the common request and whole response read and rewritten on the text itself
 * (al_json_* in http1.c); jansson stays for streams, errors and unusual requests.
 * ------------------------------------------------------------------------------------------ */

static int slice_is(al_slice v, const char *lit)
{
    return al_slice_eq(v, lit);
}

/* Appends the integers of a JSON array; stops at the first element that is not one. */
static void fast_ids(al_slice arr, ivec *out)
{
    al_json_iter it;
    al_slice v;
    if (al_json_iter_init(&it, arr.p, arr.n) != 0) return;
    while (al_json_iter_next(&it, &v) == 1) {
        long long x = 0;
        size_t i = 0;
        int neg = v.n && v.p[0] == '-';
        if (neg) i++;
        if (i >= v.n) return;
        for (; i < v.n; i++) {
            if (v.p[i] < '0' || v.p[i] > '9' || x > 100000000000LL) return;
            x = x * 10 + (v.p[i] - '0');
        }
        ivec_push(out, (int32_t)(neg ? -x : x));
    }
}

static double slice_num(al_slice v)
{
    char buf[64];
    if (!v.n || v.n >= sizeof buf || !(v.p[0] == '-' || (v.p[0] >= '0' && v.p[0] <= '9')))
        return 0.0;
    memcpy(buf, v.p, v.n);
    buf[v.n] = '\0';
    return strtod(buf, NULL);
}

/* A count from the upstream's usage: 0 unless a number in [0, 2^62] (converting one beyond
 * int64 would be undefined). */
static int64_t member_int(al_slice obj, const char *key)
{
    al_slice v;
    double d = al_json_member(obj.p, obj.n, key, &v) == 1 ? slice_num(v) : 0.0;
    return d >= 0 && d <= 0x1p62 ? (int64_t)d : 0;
}

/* capture_object for a whole (validated) response, without a tree. */
static void capture_fast(call *k, const char *body, size_t n)
{
    /* one pass per object: the choices, with their logprobs, are most of the bytes */
    static const char *const top_keys[] = {"prompt_token_ids", "usage", "choices"};
    static const char *const ch_keys[] = {"prompt_token_ids", "token_ids", "logprobs",
                                          "finish_reason"};
    al_slice top[3], cv[4], v, ch, c0, lp, arr, el, u, d;
    if (al_json_members(body, n, top_keys, top, 3) < 0) return;
    if (top[0].p) fast_ids(top[0], &k->prompt);
    u = top[1];
    if (u.n && u.p[0] == '{') {
        k->have_usage = 1;
        k->usage.prompt_tokens = member_int(u, "prompt_tokens");
        k->usage.completion_tokens = member_int(u, "completion_tokens");
        k->usage.total_tokens = member_int(u, "total_tokens");
        if (al_json_member(u.p, u.n, "prompt_tokens_details", &d) == 1 && d.n && d.p[0] == '{')
            k->usage.cached_tokens = member_int(d, "cached_tokens");
    }
    ch = top[2];
    if (!ch.p || al_json_element(ch.p, ch.n, 0, &c0) != 1 || !c0.n || c0.p[0] != '{' ||
        al_json_members(c0.p, c0.n, ch_keys, cv, 4) < 0)
        return;
    if (!k->prompt.n && cv[0].p) fast_ids(cv[0], &k->prompt);
    if (cv[1].p) fast_ids(cv[1], &k->resp_ids);
    lp = cv[2];
    if (lp.n && lp.p[0] == '{') {
        al_json_iter it;
        if (al_json_member(lp.p, lp.n, "content", &arr) == 1 &&
            al_json_iter_init(&it, arr.p, arr.n) == 0) {
            while (al_json_iter_next(&it, &el) == 1)
                fvec_push(&k->lps, al_json_member(el.p, el.n, "logprob", &v) == 1
                                       ? lp_float(slice_num(v))
                                       : 0.0f);
        } else if (al_json_member(lp.p, lp.n, "token_logprobs", &arr) == 1 &&
                   al_json_iter_init(&it, arr.p, arr.n) == 0) {
            while (al_json_iter_next(&it, &el) == 1)
                fvec_push(&k->lps, lp_float(slice_num(el)));
        }
    }
    v = cv[3];
    if (v.n >= 2 && v.p[0] == '"' && !memchr(v.p, '\\', v.n)) {
        free(k->finish);
        k->finish = strndup(v.p + 1, v.n - 2);
    }
}

/* rewrite_request without a tree, for requests that only need fields added. NULL when the
 * request needs the general path (invalid JSON, for the error message; a field to replace;
 * escapes in the model name). */
static char *rewrite_fast(call *k, const char *in, size_t n, size_t *outlen)
{
    upkind kind = k->px->cfg.kind;
    al_slice v, so;
    if (!al_json_valid(in, n)) return NULL;
    size_t e = n;
    while (e && (in[e - 1] == ' ' || in[e - 1] == '\t' || in[e - 1] == '\n' || in[e - 1] == '\r'))
        e--;
    size_t b = 0;
    while (b < e && (in[b] == ' ' || in[b] == '\t' || in[b] == '\n' || in[b] == '\r'))
        b++;
    if (e - b < 2 || in[b] != '{' || in[e - 1] != '}') return NULL;
    static const char *const keys[] = {"stream", "logprobs", "return_token_ids", "stream_options",
                                       "model"};
    al_slice f[5];
    if (al_json_members(in, n, keys, f, 5) < 0) return NULL;
    k->stream = f[0].p && slice_is(f[0], "true");
    v = f[1];
    if (v.p) {
        if (k->is_chat)
            k->want_logprobs = slice_is(v, "true");
        else
            k->want_logprobs = v.n && v.p[0] >= '1' && v.p[0] <= '9' && !memchr(v.p, '.', v.n);
        if (!k->want_logprobs) return NULL; /* false/null/0: to be replaced */
    }
    v = f[2];
    if (v.p) {
        if (!slice_is(v, "true")) return NULL;
        k->want_token_ids = 1;
    }
    int need_usage = 0;
    if (k->stream) {
        so = f[3];
        if (so.p) {
            if (so.n && so.p[0] == '{' && al_json_member(so.p, so.n, "include_usage", &v) == 1 &&
                slice_is(v, "true"))
                need_usage = 0;
            else
                return NULL;
        } else {
            need_usage = 1;
        }
    }
    v = f[4];
    if (v.n >= 2 && v.p[0] == '"') {
        if (memchr(v.p, '\\', v.n)) return NULL;
        k->model = strndup(v.p + 1, v.n - 2);
    }
    char add[160];
    size_t al = 0;
    add[0] = '\0';
    if (kind != UP_OPENAI && !k->want_token_ids)
        al += (size_t)snprintf(add + al, sizeof add - al, ",\"return_token_ids\":true");
    if (kind != UP_OPENAI && !k->want_logprobs)
        al += (size_t)snprintf(add + al, sizeof add - al, ",\"logprobs\":%s",
                               k->is_chat ? "true" : "1");
    if (need_usage) {
        k->injected_usage = 1;
        al += (size_t)snprintf(add + al, sizeof add - al,
                               ",\"stream_options\":{\"include_usage\":true}");
    }
    /* an empty object takes the additions without their leading comma */
    size_t inner = b + 1;
    while (inner < e - 1 &&
           (in[inner] == ' ' || in[inner] == '\t' || in[inner] == '\n' || in[inner] == '\r'))
        inner++;
    int empty = inner == e - 1;
    const char *ad = add + (empty && al ? 1 : 0);
    size_t adl = al - (empty && al ? 1 : 0);
    char *out = malloc((e - b) + adl + 1);
    if (!out) return NULL;
    size_t o = 0;
    memcpy(out, in + b, e - b - 1);
    o = e - b - 1;
    memcpy(out + o, ad, adl);
    o += adl;
    out[o++] = '}';
    out[o] = '\0';
    *outlen = o;
    return out;
}

/* The fields the proxy asked for, taken out of the answer the way the upstream would have
 * left them out: vLLM's whole responses carry unrequested fields as null (pydantic
 * model_dump), its stream chunks omit them (exclude_unset); logprobs is null in both. */
static long strip_for_agent(call *k, const char *in, size_t len, int chunk)
{
    static const char *const top_ids[] = {"prompt_token_ids", NULL};
    static const char *const top_ids_usage[] = {"prompt_token_ids", "usage", NULL};
    static const char *const top_usage[] = {"usage", NULL};
    static const char *const ch_ids[] = {"token_ids", "prompt_token_ids", NULL};
    static const char *const ch_ids_lp[] = {"token_ids", "prompt_token_ids", "logprobs", NULL};
    static const char *const ch_lp[] = {"logprobs", NULL};
    al_json_strip spec = {0};
    if (chunk) {
        if (!k->want_token_ids)
            spec.top_remove = k->injected_usage ? top_ids_usage : top_ids;
        else if (k->injected_usage)
            spec.top_remove = top_usage;
        if (!k->want_token_ids) spec.choice_remove = ch_ids;
        if (!k->want_logprobs) spec.choice_null = ch_lp;
    } else {
        if (!k->want_token_ids) spec.top_null = top_ids;
        if (!k->want_token_ids)
            spec.choice_null = k->want_logprobs ? ch_ids : ch_ids_lp;
        else if (!k->want_logprobs)
            spec.choice_null = ch_lp;
    }
    al_buf *st = &k->px->strip;
    st->len = 0;
    if (al_buf_reserve(st, len + 4096)) return -1;
    return al_json_strip_apply(in, len, &spec, (char *)st->data, len + 4096);
}

static void extra_headers(call *k, char *buf, size_t n)
{
    int64_t now = al_mono_us();
    int64_t overhead = k->pre_us + (k->done_mono ? now - k->done_mono : 0);
    if (overhead < 0) overhead = 0;
    size_t rl = strlen(k->id.rollout);
    if (n < rl + 80) {
        buf[0] = '\0';
    } else {
        char *o = al_put_mem(buf, "x-arclight-overhead-us: ", 24);
        o = al_put_u64(o, (uint64_t)overhead);
        o = al_put_mem(o, "\r\nx-arclight-rollout: ", 22);
        o = al_put_mem(o, k->id.rollout, rl);
        o = al_put_mem(o, "\r\n", 3); /* with its NUL */
    }
    al_histogram_observe(k->px->h_overhead, (double)overhead / 1e6);
}

/* Handles the complete SSE events in k->body: captures each data chunk, forwards it to the
 * agent stripped of what the proxy asked for, drops the usage-only chunk the proxy asked
 * for, and keeps a trailing partial event for the next write. */
static void stream_process(call *k, int final)
{
    size_t pos = 0;
    char *b = (char *)k->body.data;
    for (;;) {
        size_t evend = 0, sep = 0;
        for (size_t i = pos; i + 1 < k->body.len; i++) {
            if (b[i] == '\n' && b[i + 1] == '\n') {
                evend = i;
                sep = 2;
                break;
            }
            if (b[i] == '\r' && i + 3 < k->body.len && b[i + 1] == '\n' && b[i + 2] == '\r' &&
                b[i + 3] == '\n') {
                evend = i;
                sep = 4;
                break;
            }
        }
        if (!sep) {
            if (final && pos < k->body.len && k->c)
                conn_stream_write(k->c, b + pos, k->body.len - pos);
            if (final) pos = k->body.len;
            break;
        }
        const char *ev = b + pos;
        size_t evlen = evend - pos;
        int forwarded = 0;
        if (evlen > 5 && memcmp(ev, "data:", 5) == 0 && !memchr(ev, '\n', evlen)) {
            const char *d = ev + 5;
            size_t dl = evlen - 5;
            if (dl && *d == ' ') d++, dl--;
            if (!(dl == 6 && memcmp(d, "[DONE]", 6) == 0)) {
                json_t *o = json_loadb(d, dl, JSON_ALLOW_NUL, NULL);
                if (o) {
                    capture_object(k, o, 1);
                    json_t *ch = json_object_get(o, "choices");
                    int usage_only = json_is_array(ch) && json_array_size(ch) == 0 &&
                                     json_is_object(json_object_get(o, "usage"));
                    json_decref(o);
                    if (usage_only && k->injected_usage) {
                        forwarded = 1; /* the agent did not ask for it */
                    } else {
                        long sl = strip_for_agent(k, d, dl, 1);
                        if (sl >= 0 && k->c) {
                            size_t pre = (size_t)(d - ev);
                            char *tmp = malloc(pre + (size_t)sl + sep);
                            if (tmp) {
                                memcpy(tmp, ev, pre);
                                memcpy(tmp + pre, k->px->strip.data, (size_t)sl);
                                memcpy(tmp + pre + sl, b + evend, sep);
                                conn_stream_write(k->c, tmp, pre + (size_t)sl + sep);
                                free(tmp);
                            }
                            forwarded = 1;
                        } else if (sl >= 0) {
                            forwarded = 1;
                        }
                    }
                }
            }
        }
        if (!forwarded && k->c) conn_stream_write(k->c, ev, evlen + sep);
        pos = evend + sep;
    }
    if (pos) {
        memmove(k->body.data, k->body.data + pos, k->body.len - pos);
        k->body.len -= pos;
    }
}

static size_t write_cb(char *ptr, size_t size, size_t nmemb, void *ud)
{
    call *k = ud;
    size_t n = size * nmemb;
    /* back-pressure: with 1 MiB of a stream waiting for the agent, pause the upstream
     * transfer (curl hands the same bytes again on resume, from conn_write_cb) */
    if (k->headers_sent && k->c && evbuffer_get_length(k->c->out) > (1u << 20)) {
        if (!k->paused)
            al_log_debug(COMP,
                         "rollout %s: the agent reads slower than the upstream writes; "
                         "upstream paused",
                         k->id.rollout);
        k->paused = 1;
        return CURL_WRITEFUNC_PAUSE;
    }
    if (!k->first_byte_us) k->first_byte_us = al_now_us();
    if (k->status == 0 && k->easy) curl_easy_getinfo(k->easy, CURLINFO_RESPONSE_CODE, &k->status);
    if (al_buf_append(&k->body, ptr, n)) return 0;
    if (k->stream && k->status == 200 && strncasecmp(k->ctype, "text/event-stream", 17) == 0) {
        if (!k->headers_sent) {
            k->headers_sent = 1;
            k->done_mono = al_mono_us(); /* overhead: request side + this write */
            if (k->c) {
                char extra[512];
                extra_headers(k, extra, sizeof extra);
                conn_stream_begin(k->c, 200, k->ctype, extra);
            }
            k->done_mono = 0;
        }
        stream_process(k, 0);
    }
    if (k->body.len > (256u << 20)) return 0; /* an upstream gone mad */
    return n;
}

static size_t header_cb(char *buf, size_t size, size_t nitems, void *ud)
{
    call *k = ud;
    size_t n = size * nitems;
    if (!k->first_byte_us) k->first_byte_us = al_now_us();
    if (n > 5 && strncmp(buf, "HTTP/", 5) == 0) { /* a new response (after a 100) */
        k->ctype[0] = '\0';
        k->status = 0;
    } else if (n > 13 && strncasecmp(buf, "content-type:", 13) == 0) {
        size_t s = 13, e = n;
        while (s < e && buf[s] == ' ')
            s++;
        while (e > s && (buf[e - 1] == '\r' || buf[e - 1] == '\n' || buf[e - 1] == ' '))
            e--;
        snprintf(k->ctype, sizeof k->ctype, "%.*s", (int)(e - s), buf + s);
    } else if (n > 25 && strncasecmp(buf, "x-arclight-policy-version:", 26) == 0) {
        k->policy_version = strtoll(buf + 26, NULL, 10);
    }
    return n;
}

static int call_start(call *k);

/* The upstream base URL without any user:password@ part, for spans and logs. */
static void url_public(const char *url, char *out, size_t n)
{
    const char *s = strstr(url, "://"), *at;
    const char *host = s ? s + 3 : url;
    const char *slash = strchr(host, '/');
    at = strchr(host, '@');
    if (at && (!slash || at < slash))
        snprintf(out, n, "%.*s%s", (int)(host - url), url, at + 1);
    else
        snprintf(out, n, "%s", url);
}

static void access_log(call *k, int status)
{
    if (!k->px->cfg.access_log) return;
    const char *up = k->px->up_public[k->up_idx];
    al_log_info("proxy.access",
                "%s status=%d upstream_status=%ld task=%s rollout=%s attempt=%d seq=%" PRId64
                " stream=%d upstream=%s ms=%.3f overhead_us=%" PRId64 " prompt_tokens=%zu "
                "response_tokens=%zu policy_version=%" PRId64 "%s%s",
                k->method_path, status, k->status, k->id.task, k->id.rollout, k->id.attempt, k->seq,
                k->stream, up, (double)(k->end_us - k->start_us) / 1000.0, k->pre_us, k->prompt.n,
                k->resp_ids.n, k->policy_version, k->error ? " error=" : "",
                k->error ? k->error : "");
}

/* Builds the span of a finished call (merged response for streams) and spools it. */
static void call_span(call *k)
{
    proxy *px = k->px;
    al_span s;
    char tmp_trace[33], tmp_parent[17];
    span_init(px, &s, &k->id, k->seq, NULL, tmp_trace, k->span_id, tmp_parent);
    s.trace_id = k->trace;
    if (k->parent_set) s.parent_span_id = k->parent;
    s.kind = AL_SPAN_KIND_LLM_CALL;
    al_llm_call *l = &s.llm_call;
    const char *up = px->up_public[k->up_idx];
    l->agent = k->agent ? k->agent : "";
    l->model = k->model ? k->model : "";
    l->upstream = up;
    l->policy_version = k->policy_version;
    l->request_json = k->req_json;
    char *merged = NULL;
    if (k->stream && k->headers_sent) {
        json_t *choice;
        const char *content = k->content.len ? (const char *)k->content.data : NULL;
        json_t *jc = content ? json_stringn(content, k->content.len) : json_null();
        if (k->is_chat) {
            json_t *msg = json_pack("{s:s,s:o}", "role", "assistant", "content", jc);
            if (k->tools) json_object_set(msg, "tool_calls", k->tools);
            choice = json_pack("{s:i,s:o}", "index", 0, "message", msg);
        } else {
            choice = json_pack("{s:i,s:o}", "index", 0, "text", content ? jc : json_string(""));
            if (!content) json_decref(jc);
        }
        json_object_set_new(choice, "finish_reason",
                            k->finish ? json_string(k->finish) : json_null());
        json_t *o = json_pack("{s:s,s:s,s:I,s:s,s:[o]}", "id", k->s_id ? k->s_id : "", "object",
                              k->is_chat ? "chat.completion" : "text_completion", "created",
                              (json_int_t)k->s_created, "model", k->s_model ? k->s_model : "",
                              "choices", choice);
        if (k->have_usage && o)
            json_object_set_new(o, "usage",
                                json_pack("{s:I,s:I,s:I}", "prompt_tokens",
                                          (json_int_t)k->usage.prompt_tokens, "completion_tokens",
                                          (json_int_t)k->usage.completion_tokens, "total_tokens",
                                          (json_int_t)k->usage.total_tokens));
        merged = o ? json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
        json_decref(o);
        l->response_json = merged ? merged : "";
    } else {
        if (al_buf_reserve(&k->body, 1) == 0) k->body.data[k->body.len] = '\0';
        l->response_json = k->body.data ? (const char *)k->body.data : "";
    }
    l->stream = k->stream;
    l->prompt_token_ids = k->prompt.v;
    l->n_prompt_tokens = k->prompt.n;
    l->response_token_ids = k->resp_ids.v;
    l->n_response_tokens = k->resp_ids.n;
    if (k->lps.n == k->resp_ids.n) {
        l->response_logprobs = k->lps.v;
        l->n_response_logprobs = k->lps.n;
    } else if (k->lps.n && k->resp_ids.n) {
        al_log_warn(COMP,
                    "rollout %s call %" PRId64 ": %zu logprobs for %zu tokens; logprobs "
                    "not recorded",
                    k->id.rollout, k->seq, k->lps.n, k->resp_ids.n);
    }
    l->finish_reason = k->finish;
    l->http_status = (int32_t)k->status;
    l->error = k->error;
    l->start_us = k->start_us;
    l->first_byte_us = k->first_byte_us;
    l->first_token_us = k->first_token_us;
    l->end_us = k->end_us;
    l->usage = k->usage;
    span_publish(px, &s);
    free(merged);
}

static void upstream_error_message(call *k)
{
    json_t *o = json_loadb((const char *)k->body.data, k->body.len, JSON_ALLOW_NUL, NULL);
    const char *m = json_string_value(json_object_get(json_object_get(o, "error"), "message"));
    if (!m) m = json_string_value(json_object_get(o, "message"));
    char buf[600];
    snprintf(buf, sizeof buf, "upstream answered %ld%s%.500s", k->status, m ? ": " : "",
             m ? m : "");
    k->error = strdup(buf);
    json_decref(o);
}

/* A transfer ended: fail over on a connection error before any byte, else answer the agent
 * (whole response, or the end of the stream), publish the span, free the call. */
static void call_done(call *k, CURLcode rc)
{
    proxy *px = k->px;
    k->done_mono = al_mono_us();
    if (k->status == 0 && k->easy) curl_easy_getinfo(k->easy, CURLINFO_RESPONSE_CODE, &k->status);
    double up_s = (double)(k->done_mono - k->sent_mono) / 1e6;
    al_histogram_observe(px->h_upstream, up_s);
    if (rc != CURLE_OK && !k->first_byte_us &&
        (rc == CURLE_COULDNT_CONNECT || rc == CURLE_COULDNT_RESOLVE_HOST ||
         rc == CURLE_GOT_NOTHING || rc == CURLE_SEND_ERROR) &&
        k->tries < (int)px->cfg.n_upstreams && !px->draining) {
        char up[512];
        url_public(px->cfg.upstreams[k->up_idx], up, sizeof up);
        al_log_warn(COMP, "upstream %s failed (%s); trying the next one", up,
                    k->errbuf[0] ? k->errbuf : curl_easy_strerror(rc));
        if (k->easy) {
            curl_multi_remove_handle(px->multi, k->easy);
            curl_easy_cleanup(k->easy);
            k->easy = NULL;
        }
        k->up_idx = (k->up_idx + 1) % (int)px->cfg.n_upstreams;
        if (call_start(k) == 0) return;
    }
    k->end_us = al_now_us();
    int agent_status;
    conn *c = k->c;
    if (rc != CURLE_OK) {
        char up[512];
        url_public(px->cfg.upstreams[k->up_idx], up, sizeof up);
        char msg[900];
        snprintf(msg, sizeof msg, "upstream %s: %s", up,
                 k->errbuf[0] ? k->errbuf : curl_easy_strerror(rc));
        k->error = strdup(msg);
        if (k->headers_sent) {
            /* mid-stream: all we can do is end the stream */
            stream_process(k, 1);
            agent_status = 200;
            if (c) {
                c->keep_alive = 0; /* the agent sees a stream that ended early */
                conn_stream_end(c);
            }
        } else {
            agent_status = rc == CURLE_OPERATION_TIMEDOUT ? 504 : 502;
            if (c)
                conn_error(c, agent_status, "upstream_error",
                           agent_status == 504 ? "upstream_timeout" : "upstream_unavailable", "%s",
                           msg);
        }
        if (!k->status) k->status = 0;
    } else if (k->headers_sent) {
        stream_process(k, 1);
        agent_status = 200;
        if (c) conn_stream_end(c);
    } else {
        agent_status = (int)k->status;
        const char *ct = k->ctype[0] ? k->ctype : "application/json";
        long sl = -1;
        if (k->status >= 200 && k->status < 300 && k->capture) {
            /* the strip pass validates the whole answer; then the fields are read off it */
            sl = strip_for_agent(k, (const char *)k->body.data, k->body.len, 0);
            if (sl >= 0) {
                capture_fast(k, (const char *)k->body.data, k->body.len);
                k->first_token_us = k->end_us;
            } else {
                k->error = strdup("upstream answered with a body that is not JSON");
            }
        } else if (k->status >= 400) {
            upstream_error_message(k);
        }
        if (c) {
            char extra[512];
            extra_headers(k, extra, sizeof extra);
            if (sl >= 0)
                conn_reply(c, agent_status, ct, extra, (char *)px->strip.data, (size_t)sl);
            else
                conn_reply(c, agent_status, ct, extra, (char *)k->body.data, k->body.len);
        }
    }
    if (c) c->call = NULL;
    if (k->capture) {
        access_log(k, agent_status);
        call_span(k);
    }
    px->inflight--;
    al_gauge_set(px->g_inflight, px->inflight);
    call_free(k);
}

static void check_multi_info(proxy *px)
{
    CURLMsg *msg;
    int left;
    while ((msg = curl_multi_info_read(px->multi, &left))) {
        if (msg->msg != CURLMSG_DONE) continue;
        call *k = NULL;
        CURLcode rc = msg->data.result;
        curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **)&k);
        if (k) call_done(k, rc);
    }
}

/* Configures an easy handle for k's current upstream and adds it to the multi. */
static int call_start(call *k)
{
    proxy *px = k->px;
    k->tries++;
    const char *base = px->cfg.upstreams[k->up_idx];
    const char *path = k->route == R_CHAT    ? "/v1/chat/completions"
                       : k->route == R_COMPL ? "/v1/completions"
                                             : "/v1/models";
    k->body.len = 0;
    k->status = 0;
    k->errbuf[0] = '\0';
    if (px->upc && al_upc_pool_serves(px->upc, k->up_idx)) {
        /* the curl header list, less curl's "Name:" removals, as header lines */
        char hdrs[2400];
        size_t hl = 0;
        hdrs[0] = '\0';
        for (struct curl_slist *h = k->hdrs; h; h = h->next) {
            size_t n = strlen(h->data);
            if (!n || h->data[n - 1] == ':' || hl + n + 3 > sizeof hdrs) continue;
            memcpy(hdrs + hl, h->data, n);
            memcpy(hdrs + hl + n, "\r\n", 3);
            hl += n + 2;
        }
        k->sent_mono = al_mono_us();
        if (k->tries == 1) k->pre_us = k->sent_mono - k->t0_mono;
        long total_ms = px->cfg.upstream_timeout_ms;
        k->uc = al_upc_start(px->upc, k->up_idx, k->route == R_MODELS ? "GET" : "POST", path, hdrs,
                             k->route == R_MODELS ? NULL : k->up_body,
                             k->route == R_MODELS ? 0 : k->up_len, px->cfg.connect_timeout_ms,
                             total_ms, k);
        return k->uc ? 0 : -1;
    }
    if (px->n_easy_pool) {
        k->easy = px->easy_pool[--px->n_easy_pool];
        curl_easy_reset(k->easy);
    } else {
        k->easy = curl_easy_init();
    }
    if (!k->easy) return -1;
    snprintf(k->url, sizeof k->url, "%s%s", base, path);
    k->body.len = 0;
    k->status = 0;
    k->errbuf[0] = '\0';
    CURL *e = k->easy;
    curl_easy_setopt(e, CURLOPT_URL, k->url);
    curl_easy_setopt(e, CURLOPT_PRIVATE, k);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, write_cb);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, k);
    curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, header_cb);
    curl_easy_setopt(e, CURLOPT_HEADERDATA, k);
    curl_easy_setopt(e, CURLOPT_ERRORBUFFER, k->errbuf);
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_TCP_NODELAY, 1L);
    curl_easy_setopt(e, CURLOPT_HTTP_VERSION, CURL_HTTP_VERSION_1_1);
    curl_easy_setopt(e, CURLOPT_FOLLOWLOCATION, 0L);
#if LIBCURL_VERSION_NUM >= 0x075500
    curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https");
#endif
    curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, px->cfg.connect_timeout_ms);
    curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, px->cfg.upstream_timeout_ms);
    if (k->route != R_MODELS) {
        curl_easy_setopt(e, CURLOPT_POST, 1L);
        curl_easy_setopt(e, CURLOPT_POSTFIELDS, k->up_body);
        curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)k->up_len);
    }
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, k->hdrs);
    k->sent_mono = al_mono_us();
    if (k->tries == 1) k->pre_us = k->sent_mono - k->t0_mono;
    if (curl_multi_add_handle(px->multi, e) != CURLM_OK) {
        curl_easy_cleanup(e);
        k->easy = NULL;
        return -1;
    }
    return 0;
}

/* The own client's callbacks: the same handling as curl's header, write and done. */
static void upc_on_head(void *ud, int status, const char *ctype, int64_t policy_version)
{
    call *k = ud;
    if (!k->first_byte_us) k->first_byte_us = al_now_us();
    k->status = status;
    snprintf(k->ctype, sizeof k->ctype, "%s", ctype);
    if (policy_version >= 0) k->policy_version = policy_version;
}

static size_t upc_on_body(void *ud, const char *p, size_t n)
{
    size_t r = write_cb((char *)p, 1, n, ud);
    return r == CURL_WRITEFUNC_PAUSE ? AL_UPC_PAUSE : r;
}

static void upc_on_done(void *ud, al_upc_err err, const char *msg)
{
    call *k = ud;
    k->uc = NULL;
    snprintf(k->errbuf, sizeof k->errbuf, "%s", msg);
    static const CURLcode map[] = {
        [AL_UPC_OK] = CURLE_OK,
        [AL_UPC_CONNECT] = CURLE_COULDNT_CONNECT,
        [AL_UPC_NOTHING] = CURLE_GOT_NOTHING,
        [AL_UPC_SEND] = CURLE_SEND_ERROR,
        [AL_UPC_RECV] = CURLE_RECV_ERROR,
        [AL_UPC_PARTIAL] = CURLE_PARTIAL_FILE,
        [AL_UPC_TIMEOUT] = CURLE_OPERATION_TIMEDOUT,
        [AL_UPC_PROTOCOL] = CURLE_WEIRD_SERVER_REPLY,
        [AL_UPC_ABORTED] = CURLE_WRITE_ERROR,
    };
    call_done(k, (unsigned)err < AL_ARRAY_LEN(map) ? map[err] : CURLE_RECV_ERROR);
}

/* Rewrites the agent's request for capture: token ids and logprobs per upstream kind, usage
 * in streams. Records what the agent itself asked for so the answer can be put back. */
static char *rewrite_request(call *k, json_t *req)
{
    upkind kind = k->px->cfg.kind;
    json_t *lp = json_object_get(req, "logprobs");
    k->want_logprobs =
        k->is_chat ? json_is_true(lp) : (json_is_integer(lp) && json_integer_value(lp) > 0);
    k->want_token_ids = json_is_true(json_object_get(req, "return_token_ids"));
    k->stream = json_is_true(json_object_get(req, "stream"));
    const char *m = json_string_value(json_object_get(req, "model"));
    if (m) k->model = strdup(m);
    /* OpenAI's API has no token ids, and some of its models refuse logprobs: the call must
     * not fail because of capture, so only text and usage are captured there */
    if (kind != UP_OPENAI) json_object_set_new(req, "return_token_ids", json_true());
    if (!k->want_logprobs && kind != UP_OPENAI) {
        if (k->is_chat)
            json_object_set_new(req, "logprobs", json_true());
        else
            json_object_set_new(req, "logprobs", json_integer(1));
    }
    if (k->stream) {
        json_t *so = json_object_get(req, "stream_options");
        if (!json_is_true(json_object_get(so, "include_usage"))) {
            k->injected_usage = 1;
            if (!json_is_object(so)) {
                so = json_object();
                json_object_set_new(req, "stream_options", so);
            }
            json_object_set_new(so, "include_usage", json_true());
        }
    }
    return json_dumps(req, JSON_COMPACT | JSON_PRESERVE_ORDER);
}

static int content_type_json(const conn *c)
{
    const al_slice *ct = al_http1_header_get(&c->head, "content-type");
    if (!ct) return 0;
    size_t n = 0;
    while (n < ct->n && ct->p[n] != ';' && ct->p[n] != ' ')
        n++;
    al_slice t = {ct->p, n};
    return al_slice_caseeq(t, "application/json");
}

/* Parses the body as a JSON object; answers 415/400 and returns NULL otherwise. */
static json_t *body_json(conn *c, int required)
{
    if (c->body.n == 0 && !required) return json_object();
    if (!content_type_json(c)) {
        conn_error(c, 415, "invalid_request_error", "unsupported_media_type",
                   "Content-Type must be application/json");
        return NULL;
    }
    json_error_t je;
    json_t *o = json_loadb(c->body.p, c->body.n, 0, &je);
    if (!o) {
        conn_error(c, 400, "invalid_request_error", "invalid_json",
                   "request body is not valid JSON: %s (line %d, column %d)", je.text, je.line,
                   je.column);
        return NULL;
    }
    if (!json_is_object(o)) {
        json_decref(o);
        conn_error(c, 400, "invalid_request_error", "invalid_json",
                   "request body must be a JSON object");
        return NULL;
    }
    return o;
}

static void start_llm_call(conn *c, ident *id)
{
    proxy *px = c->px;
    if (px->draining) {
        conn_error(c, 503, "server_error", "shutting_down", "the proxy is shutting down");
        return;
    }
    if (al_spool_full(px->spool, c->body.n * 2 + 4096)) {
        al_counter_inc(px->rejected_spool_full);
        al_spool_stats st;
        al_spool_get_stats(px->spool, &st);
        conn_error(c, 503, "server_error", "spool_full",
                   "the proxy's span spool is full (%" PRIu64 " bytes, %" PRIu64
                   " spans waiting for Kafka at %s); calls resume when the broker takes them",
                   st.bytes, st.records, px->cfg.spool_dir);
        return;
    }
    call *k = calloc(1, sizeof *k);
    if (!k) {
        conn_error(c, 500, "server_error", "out_of_memory", "out of memory");
        return;
    }
    k->px = px;
    k->route = c->route;
    k->is_chat = c->route == R_CHAT;
    k->capture = c->route != R_MODELS;
    k->policy_version = -1;
    k->id = *id;
    k->start_us = c->start_us;
    k->t0_mono = c->t0_mono;
    size_t ml = c->head.method.n > 32 ? 32 : c->head.method.n;
    size_t tl = c->head.target.n > 400 ? 400 : c->head.target.n;
    k->method_path = malloc(ml + tl + 14);
    if (k->method_path) {
        char *o = al_put_mem(k->method_path, "method=", 7);
        o = al_put_mem(o, c->head.method.p, ml);
        o = al_put_mem(o, " path=", 6);
        o = al_put_mem(o, c->head.target.p, tl);
        *o = '\0';
    }
    const al_slice *ag = al_http1_header_get(&c->head, "x-arclight-agent");
    k->agent = ag ? slice_dup(ag->n > 128 ? (al_slice){ag->p, 128} : *ag)
                  : strdup(px->cfg.agent_name ? px->cfg.agent_name : "");
    const al_slice *tp = al_http1_header_get(&c->head, "traceparent");
    if (tp && tp->n == 55) {
        al_span tmp;
        span_init(px, &tmp, id, 0, c, k->trace, k->span_id, k->parent);
        k->parent_set = tmp.parent_span_id != NULL;
    } else {
        rand_hex(px, k->trace, 32);
    }
    if (k->capture) {
        size_t up_len = 0;
        char *up = content_type_json(c) ? rewrite_fast(k, c->body.p, c->body.n, &up_len) : NULL;
        if (!up) {
            free(k->model);
            k->model = NULL;
            k->stream = k->want_logprobs = k->want_token_ids = k->injected_usage = 0;
            json_t *req = body_json(c, 1);
            if (!req) {
                call_free(k);
                return;
            }
            up = rewrite_request(k, req);
            json_decref(req);
            up_len = up ? strlen(up) : 0;
        }
        k->req_json = slice_dup(c->body);
        if (!up || !k->req_json) {
            free(up);
            call_free(k);
            conn_error(c, 500, "server_error", "out_of_memory", "out of memory");
            return;
        }
        k->up_body = up;
        k->up_len = up_len;
        rollout_ent *r = rollout_get(px, id->task, id->rollout, id->attempt);
        if (!r) {
            call_free(k);
            conn_error(c, 500, "server_error", "out_of_memory", "out of memory");
            return;
        }
        k->seq = r->next_seq++;
        r->last_call_seq = k->seq;
    }
    k->hdrs = curl_slist_append(NULL, "Content-Type: application/json");
    k->hdrs = curl_slist_append(k->hdrs, "Expect:");
    al_slice tok;
    if (px->cfg.upstream_key) {
        char h[1100];
        snprintf(h, sizeof h, "Authorization: Bearer %s", px->cfg.upstream_key);
        k->hdrs = curl_slist_append(k->hdrs, h);
    } else if (px->cfg.forward_agent_auth && bearer(c, &tok) && tok.n < 1000 &&
               !session_find(px, tok.p, tok.n)) {
        char h[1100];
        snprintf(h, sizeof h, "Authorization: Bearer %.*s", (int)tok.n, tok.p);
        k->hdrs = curl_slist_append(k->hdrs, h);
    }
    /* sticky routing: a rollout's calls go to one upstream (prefix-cache reuse) */
    k->up_idx = (int)(fnv1a(id->rollout) % px->cfg.n_upstreams);
    k->c = c;
    c->call = k;
    k->cnext = px->calls;
    if (px->calls) px->calls->cprev = k;
    px->calls = k;
    px->inflight++;
    al_gauge_set(px->g_inflight, px->inflight);
    if (call_start(k) != 0) {
        c->call = NULL;
        px->inflight--;
        conn_error(c, 500, "server_error", "internal_error", "cannot start the upstream call");
        call_free(k);
    }
}

/* Admission of a reward or end span: the spool must have room and the rollout an entry.
 * Returns the rollout, or NULL after answering the agent (503 spool full, 500 no memory). */
static rollout_ent *control_span_admit(proxy *px, conn *c, const ident *id)
{
    if (al_spool_full(px->spool, 4096)) {
        al_counter_inc(px->rejected_spool_full);
        conn_error(c, 503, "server_error", "spool_full",
                   "the proxy's span spool is full; retry when the broker is back");
        return NULL;
    }
    rollout_ent *r = rollout_get(px, id->task, id->rollout, id->attempt);
    if (!r) conn_error(c, 500, "server_error", "out_of_memory", "out of memory");
    return r;
}

/* POST .../reward: {"value": 1.0, "name": "accuracy"} or {"rewards": {"a": 1, "b": 0.5}} */
static void handle_reward(conn *c, ident *id)
{
    proxy *px = c->px;
    json_t *o = body_json(c, 1);
    if (!o) return;
    json_t *v = json_object_get(o, "value"), *rs = json_object_get(o, "rewards");
    const char *name = json_string_value(json_object_get(o, "name"));
    if ((v && !json_is_number(v)) || (rs && !json_is_object(rs)) || (!v && !rs) ||
        (json_object_get(o, "name") && !name)) {
        json_decref(o);
        conn_error(c, 400, "invalid_request_error", "invalid_reward",
                   "a reward is {\"value\": number, \"name\": string (optional)} or "
                   "{\"rewards\": {name: number, ...}}");
        return;
    }
    const char *k;
    json_t *x;
    json_object_foreach(rs, k, x) if (!json_is_number(x) ||
                                      !(fabs(json_number_value(x)) <= AL_REWARD_MAX))
    {
        /* k belongs to o: the answer is written before o goes */
        conn_error(c, 400, "invalid_request_error", "invalid_reward",
                   "reward \"%.100s\" is not a finite number within +-%g", k, AL_REWARD_MAX);
        json_decref(o);
        return;
    }
    if (v && !(fabs(json_number_value(v)) <= AL_REWARD_MAX)) {
        json_decref(o);
        conn_error(c, 400, "invalid_request_error", "invalid_reward",
                   "value must be a finite number within +-%g", AL_REWARD_MAX);
        return;
    }
    rollout_ent *r = control_span_admit(px, c, id);
    if (!r) {
        json_decref(o);
        return;
    }
    json_t *seqs = json_array();
    al_span s;
    char trace[33], sid[17], parent[17];
    if (v) {
        span_init(px, &s, id, r->next_seq++, c, trace, sid, parent);
        s.kind = AL_SPAN_KIND_REWARD;
        s.reward.name = name ? name : "final";
        s.reward.value = json_number_value(v);
        s.reward.after_sequence = r->last_call_seq;
        span_publish(px, &s);
        json_array_append_new(seqs, json_integer(s.sequence));
    }
    json_object_foreach(rs, k, x)
    {
        span_init(px, &s, id, r->next_seq++, c, trace, sid, parent);
        s.kind = AL_SPAN_KIND_REWARD;
        s.reward.name = k;
        s.reward.value = json_number_value(x);
        s.reward.after_sequence = r->last_call_seq;
        span_publish(px, &s);
        json_array_append_new(seqs, json_integer(s.sequence));
    }
    json_t *resp = json_pack("{s:s,s:s,s:s,s:o}", "status", "recorded", "task_id", id->task,
                             "rollout_id", id->rollout, "sequences", seqs);
    char *b = json_dumps(resp, JSON_COMPACT | JSON_PRESERVE_ORDER);
    conn_reply(c, 200, "application/json", NULL, b, strlen(b));
    free(b);
    json_decref(resp);
    json_decref(o);
}

/* POST .../end: {"status": "succeeded"|"failed"|..., "group_size": 8, "reason": "..."} */
static void handle_end(conn *c, ident *id)
{
    proxy *px = c->px;
    json_t *o = body_json(c, 1);
    if (!o) return;
    const char *st = json_string_value(json_object_get(o, "status"));
    json_t *gs = json_object_get(o, "group_size"), *rj = json_object_get(o, "reason");
    int status = st ? al_rollout_status_parse(st) : -1;
    if (status < 0 ||
        (gs && !json_is_null(gs) &&
         (!json_is_integer(gs) || json_integer_value(gs) < 1 ||
          json_integer_value(gs) > 1000000)) ||
        (rj && !json_is_null(rj) && !json_is_string(rj))) {
        json_decref(o);
        conn_error(c, 400, "invalid_request_error", "invalid_end",
                   "an end is {\"status\": \"succeeded\"|\"failed\"|\"timeout\"|\"aborted\", "
                   "\"group_size\": positive integer (optional), \"reason\": string (optional)}");
        return;
    }
    rollout_ent *r = control_span_admit(px, c, id);
    if (!r) {
        json_decref(o);
        return;
    }
    al_span s;
    char trace[33], sid[17], parent[17];
    span_init(px, &s, id, r->next_seq++, c, trace, sid, parent);
    s.kind = AL_SPAN_KIND_ROLLOUT_END;
    s.rollout_end.status = (al_rollout_status)status;
    s.rollout_end.group_size = json_is_integer(gs) ? (int32_t)json_integer_value(gs) : 0;
    s.rollout_end.reason = json_string_value(rj);
    span_publish(px, &s);
    char b[400];
    int n = snprintf(b, sizeof b, "{\"status\":\"recorded\",\"sequence\":%" PRId64 "}", s.sequence);
    conn_reply(c, 200, "application/json", NULL, b, (size_t)n);
    json_decref(o);
}

/* POST /v1/sessions: {"task_id": "...", "rollout_id": "...", "attempt": 0} (all optional)
 * -> {"session_key": "sk-arclight-...", ...}; the agent uses the key as its API key. */
static void handle_session(conn *c)
{
    proxy *px = c->px;
    json_t *o = body_json(c, 0);
    if (!o) return;
    const char *t = json_string_value(json_object_get(o, "task_id"));
    const char *r = json_string_value(json_object_get(o, "rollout_id"));
    json_t *a = json_object_get(o, "attempt");
    if ((json_object_get(o, "task_id") && (!t || (*t && !id_valid(t, strlen(t))))) ||
        (json_object_get(o, "rollout_id") && (!r || !id_valid(r, strlen(r)))) ||
        (a &&
         (!json_is_integer(a) || json_integer_value(a) < 0 || json_integer_value(a) > 999999))) {
        json_decref(o);
        conn_error(c, 400, "invalid_request_error", "invalid_identity",
                   "task_id and rollout_id must be 1-128 characters of A-Z a-z 0-9 . _ : @ -; "
                   "attempt an integer from 0 to 999999");
        return;
    }
    if (px->nsessions >= 1000000) {
        json_decref(o);
        conn_error(c, 503, "server_error", "too_many_sessions",
                   "the proxy holds 1000000 sessions already; restart it or use "
                   "/r/{task}/{rollout}/v1 URLs");
        return;
    }
    session_ent *s = calloc(1, sizeof *s);
    char gen[40];
    if (!r) {
        rand_hex(px, gen, 32);
        r = gen;
    }
    char hex[65];
    if (!s || secret_hex(hex, 24) != 0) {
        free(s);
        json_decref(o);
        conn_error(c, 500, "server_error", "internal_error", "cannot create a session key");
        return;
    }
    snprintf(s->key, sizeof s->key, "sk-arclight-%s", hex);
    s->task = strdup(t ? t : "");
    s->rollout = strdup(r);
    s->attempt = a ? (int)json_integer_value(a) : 0;
    size_t b = fnv1a(s->key) & 1023;
    s->next = px->sessions[b];
    px->sessions[b] = s;
    px->nsessions++;
    if (px->state_fd >= 0) {
        session_line(&px->state_pend, s);
        event_active(px->flush_ev, EV_TIMEOUT, 1);
    }
    json_t *resp = json_pack("{s:s,s:s,s:s,s:i}", "session_key", s->key, "task_id", s->task,
                             "rollout_id", s->rollout, "attempt", s->attempt);
    char *body = json_dumps(resp, JSON_COMPACT | JSON_PRESERVE_ORDER);
    conn_reply(c, 200, "application/json", NULL, body, strlen(body));
    free(body);
    json_decref(resp);
    json_decref(o);
}

/* Routes one complete request. */
static void dispatch(conn *c)
{
    proxy *px = c->px;
    al_slice path = c->head.target;
    const char *q = memchr(path.p, '?', path.n);
    if (q) path.n = (size_t)(q - path.p);
    ident id;
    memset(&id, 0, sizeof id);
    int prefix = 0;
    if (path.n > 3 && memcmp(path.p, "/r/", 3) == 0) {
        const char *t = path.p + 3, *end = path.p + path.n;
        const char *s1 = memchr(t, '/', (size_t)(end - t));
        const char *s2 = s1 ? memchr(s1 + 1, '/', (size_t)(end - s1 - 1)) : NULL;
        if (!s2) {
            c->route = R_OTHER;
            conn_error(c, 404, "invalid_request_error", "unknown_route",
                       "unknown route %.*s; use /r/{task}/{rollout}/v1/...",
                       (int)(path.n > 200 ? 200 : path.n), path.p);
            return;
        }
        if (!id_valid(t, (size_t)(s1 - t)) || !id_valid(s1 + 1, (size_t)(s2 - s1 - 1))) {
            c->route = R_OTHER;
            conn_error(c, 400, "invalid_request_error", "invalid_identity",
                       "task and rollout in /r/{task}/{rollout}/ must be 1-128 characters of "
                       "A-Z a-z 0-9 . _ : @ -");
            return;
        }
        *al_put_mem(id.task, t, (size_t)(s1 - t)) = '\0'; /* id_valid: at most 128 */
        *al_put_mem(id.rollout, s1 + 1, (size_t)(s2 - s1 - 1)) = '\0';
        prefix = 1;
        path = (al_slice){s2, (size_t)(end - s2)};
    }
    int route = R_OTHER, want_post = 1;
    if (al_slice_eq(path, "/v1/chat/completions") || al_slice_eq(path, "/chat/completions"))
        route = R_CHAT;
    else if (al_slice_eq(path, "/v1/completions") || al_slice_eq(path, "/completions"))
        route = R_COMPL;
    else if (al_slice_eq(path, "/v1/models") || al_slice_eq(path, "/models"))
        route = R_MODELS, want_post = 0;
    else if (al_slice_eq(path, "/reward") || al_slice_eq(path, "/v1/reward"))
        route = R_REWARD;
    else if (al_slice_eq(path, "/end") || al_slice_eq(path, "/v1/end"))
        route = R_END;
    else if (!prefix && al_slice_eq(path, "/v1/sessions"))
        route = R_SESSIONS;
    else if (!prefix && al_slice_eq(path, "/healthz"))
        route = R_HEALTH, want_post = 0;
    else if (!prefix && al_slice_eq(path, "/metrics"))
        route = R_METRICS, want_post = 0;
    c->route = route;
    if (route == R_OTHER) {
        conn_error(c, 404, "invalid_request_error", "unknown_route", "unknown route %.*s %.*s",
                   (int)c->head.method.n, c->head.method.p, (int)(path.n > 200 ? 200 : path.n),
                   path.p);
        return;
    }
    if (want_post ? !al_slice_eq(c->head.method, "POST")
                  : !(al_slice_eq(c->head.method, "GET") || al_slice_eq(c->head.method, "HEAD"))) {
        conn_error(c, 405, "invalid_request_error", "method_not_allowed",
                   "%.*s is not allowed here; use %s", (int)c->head.method.n, c->head.method.p,
                   want_post ? "POST" : "GET");
        return;
    }
    if (route == R_HEALTH) {
        static const char ok[] = "{\"status\":\"ok\"}";
        conn_reply(c, 200, "application/json", NULL, ok, sizeof ok - 1);
        return;
    }
    if (route == R_METRICS) {
        size_t n;
        char *text = al_metrics_render(px->metrics, &n);
        conn_reply(c, 200, "text/plain; version=0.0.4", NULL, text ? text : "", text ? n : 0);
        free(text);
        return;
    }
    if (!authorized(c)) {
        conn_error(c, 401, "invalid_request_error", "invalid_api_key",
                   "missing or unknown API key for this proxy");
        return;
    }
    if (route == R_SESSIONS) {
        handle_session(c);
        return;
    }
    if (resolve_identity(c, &id, prefix) != 0) return;
    if (route == R_REWARD || route == R_END) {
        if (id.untracked) {
            conn_error(c, 400, "invalid_request_error", "invalid_identity",
                       "a reward or end needs a rollout: use /r/{task}/{rollout}/%s, the "
                       "X-Arclight-Rollout header or a session key",
                       route == R_REWARD ? "reward" : "end");
            return;
        }
        if (route == R_REWARD)
            handle_reward(c, &id);
        else
            handle_end(c, &id);
        return;
    }
    start_llm_call(c, &id);
}

/* ------------------------------------------------------------------------------------------
 * curl multi-socket wiring (hiperfifo)
 * ------------------------------------------------------------------------------------------ */

static void curl_event_cb(evutil_socket_t fd, short kind, void *arg)
{
    proxy *px = arg;
    int action = (kind & EV_READ ? CURL_CSELECT_IN : 0) | (kind & EV_WRITE ? CURL_CSELECT_OUT : 0);
    curl_multi_socket_action(px->multi, fd, action, &px->running);
    check_multi_info(px);
}

static void curl_timer_event(evutil_socket_t fd, short kind, void *arg)
{
    proxy *px = arg;
    (void)fd;
    (void)kind;
    curl_multi_socket_action(px->multi, CURL_SOCKET_TIMEOUT, 0, &px->running);
    check_multi_info(px);
}

static int curl_timer_cb(CURLM *m, long timeout_ms, void *arg)
{
    proxy *px = arg;
    (void)m;
    if (timeout_ms < 0) {
        evtimer_del(px->curl_timer);
    } else {
        struct timeval tv = {timeout_ms / 1000, (timeout_ms % 1000) * 1000};
        evtimer_add(px->curl_timer, &tv);
    }
    return 0;
}

static int curl_socket_cb(CURL *e, curl_socket_t s, int what, void *arg, void *sockp)
{
    proxy *px = arg;
    struct event *ev = sockp;
    (void)e;
    if (what == CURL_POLL_REMOVE) {
        if (ev) event_free(ev);
        curl_multi_assign(px->multi, s, NULL);
        return 0;
    }
    short kind = (short)((what & CURL_POLL_IN ? EV_READ : 0) |
                         (what & CURL_POLL_OUT ? EV_WRITE : 0) | EV_PERSIST);
    if (!ev) {
        ev = event_new(px->base, s, kind, curl_event_cb, px);
        if (!ev) return -1;
        curl_multi_assign(px->multi, s, ev);
    } else {
        event_del(ev);
        event_assign(ev, px->base, s, kind, curl_event_cb, px);
    }
    event_add(ev, NULL);
    return 0;
}

/* ------------------------------------------------------------------------------------------
 * Shutdown, metrics, main
 * ------------------------------------------------------------------------------------------ */

static void drain_check(evutil_socket_t fd, short what, void *arg)
{
    proxy *px = arg;
    (void)fd;
    (void)what;
    /* done when no call is in flight and every answer has left (a connection still
     * writing closes itself once written, since draining turns keep-alive off) */
    int writing = 0;
    for (conn *c = px->conns; c; c = c->next)
        if (c->state != C_READ || evbuffer_get_length(c->out) > 0) writing++;
    if ((px->inflight == 0 && writing == 0) || al_mono_us() >= px->drain_deadline_mono) {
        if (px->inflight)
            al_log_warn(COMP, "drain timeout: %d calls still in flight are cut off", px->inflight);
        event_base_loopbreak(px->base);
    }
}

static void on_signal(evutil_socket_t sig, short what, void *arg)
{
    proxy *px = arg;
    (void)what;
    if (px->draining) return;
    al_log_info(COMP, "signal %d: no new connections; draining %d calls in flight", (int)sig,
                px->inflight);
    px->draining = 1;
    px->drain_deadline_mono = al_mono_us() + (int64_t)px->cfg.drain_timeout_s * 1000000;
    if (px->listener) {
        evconnlistener_free(px->listener);
        px->listener = NULL;
    }
    struct timeval tv = {0, 20000};
    px->drain_timer = event_new(px->base, -1, EV_PERSIST, drain_check, px);
    evtimer_add(px->drain_timer, &tv);
}

static void collect(al_metrics *m, void *ud)
{
    proxy *px = ud;
    (void)m;
    al_spool_stats st;
    al_spool_get_stats(px->spool, &st);
    al_gauge_set(px->g_spool_bytes, (double)st.bytes);
    al_gauge_set(px->g_spool_records, (double)st.records);
    /* counters from the spool's totals; /metrics renders on the loop thread and on the
     * --metrics server's thread */
    pthread_mutex_lock(&px->collect_mu);
    if (st.published > px->seen_published)
        al_counter_add(px->c_published, (double)(st.published - px->seen_published));
    if (st.dropped > px->seen_dropped)
        al_counter_add(px->c_dropped, (double)(st.dropped - px->seen_dropped));
    if (st.published > px->seen_published) px->seen_published = st.published;
    if (st.dropped > px->seen_dropped) px->seen_dropped = st.dropped;
    pthread_mutex_unlock(&px->collect_mu);
}

static int health(void *ud, char *reason, size_t n)
{
    proxy *px = ud;
    al_spool_stats st;
    al_spool_get_stats(px->spool, &st);
    if (al_spool_full(px->spool, 4096)) {
        snprintf(reason, n, "span spool full (%" PRIu64 " bytes): Kafka unreachable?", st.bytes);
        return 1;
    }
    return 0;
}

static const char proxy_usage[] =
    "usage: arclight proxy --upstream URL [options]\n"
    "\n"
    "Capture proxy: forwards an agent's OpenAI-compatible calls to the upstream model server\n"
    "and publishes every call, reward and rollout end as a span on arclight.spans. Point the\n"
    "agent at http://LISTEN/r/{task}/{rollout}/v1 (or /v1 with X-Arclight-Task/-Rollout\n"
    "headers, or a key from POST /v1/sessions as its API key).\n"
    "\n"
    "  --listen HOST:PORT        where agents connect (default 127.0.0.1:8080; port 0: any;\n"
    "                            the bound address is printed on stdout)\n"
    "  --upstream URL            model server base URL, e.g. http://127.0.0.1:8000; repeat for\n"
    "                            several (sticky per rollout, failover on connection errors)\n"
    "  --upstream-kind KIND      arclight, vllm (default), sglang or openai: what to ask for\n"
    "                            (vLLM-style return_token_ids + logprobs; openai: nothing,\n"
    "                            text and usage only)\n"
    "  --upstream-key-env NAME   environment variable holding the upstream API key (default\n"
    "                            ARCLIGHT_UPSTREAM_API_KEY); sent as Authorization: Bearer\n"
    "  --forward-agent-auth      send the agent's own Authorization upstream (when no key is\n"
    "                            configured)\n"
    "  --agent-key KEY           accept only agents with this Bearer key (repeatable; session\n"
    "                            keys are accepted too); also $ARCLIGHT_PROXY_AGENT_KEYS\n"
    "                            (comma-separated)\n"
    "  --agent-name NAME         agent name recorded in spans (X-Arclight-Agent overrides)\n"
    "  --topic TOPIC             spans topic (default arclight.spans)\n"
    "  --spool-dir DIR           on-disk spool of spans (default ./arclight-spool)\n"
    "  --spool-max-bytes N       spool bound; beyond it new calls get 503 (default 1 GiB)\n"
    "  --spool-fsync MODE        never, interval (default: every second) or always\n"
    "  --max-body-bytes N        request body limit (default 1 MiB, as nginx)\n"
    "  --max-header-bytes N      request head limit (default 32 KiB, as nginx's 4 x 8k)\n"
    "  --max-headers N           header count limit (default 100)\n"
    "  --max-connections N       concurrent agent connections (default 1024)\n"
    "  --client-timeout S        reading a request / idle keep-alive (default 60, as nginx)\n"
    "  --connect-timeout-ms N    upstream connect timeout (default 5000)\n"
    "  --upstream-timeout S      whole upstream call (default 600)\n"
    "  --drain-timeout S         on SIGTERM, wait this long for calls and spans (default 30)\n"
    "  --no-access-log           no per-call access log line\n"
    "  --upstream-client C       auto (default: the proxy's own keep-alive HTTP/1.1 client for\n"
    "                            http:// upstreams at an IP address or localhost, curl for the\n"
    "                            rest) or curl (curl for every upstream)\n"
    "  --help\n" AL_CLI_COMMON_HELP;

enum {
    OPT_LISTEN = AL_CLI_OPT_USER,
    OPT_UPSTREAM,
    OPT_KIND,
    OPT_KEY_ENV,
    OPT_FWD_AUTH,
    OPT_AGENT_KEY,
    OPT_AGENT_NAME,
    OPT_TOPIC,
    OPT_SPOOL_DIR,
    OPT_SPOOL_MAX,
    OPT_SPOOL_FSYNC,
    OPT_MAX_BODY,
    OPT_MAX_HEAD,
    OPT_MAX_HEADERS,
    OPT_MAX_CONNS,
    OPT_CLIENT_TO,
    OPT_CONNECT_TO,
    OPT_UPSTREAM_TO,
    OPT_DRAIN_TO,
    OPT_NO_ACCESS,
    OPT_UP_CLIENT,
    OPT_HELP,
};

/* Lowers the scheduling priority (nice +5) of every thread but the calling one (the event
 * loop): the spool's publisher and librdkafka's threads, and those they start later, which
 * inherit it. The spans they carry are already on disk, so they can wait a little; the
 * agents' calls cannot. On a machine with few cores they otherwise take the loop's core at
 * random moments, which shows in the tail latency of calls. Best effort; the nice value of
 * a thread is per thread on Linux. */
static void background_threads_yield(void)
{
    DIR *d = opendir("/proc/self/task");
    if (!d) return;
    pid_t self = (pid_t)syscall(SYS_gettid);
    struct dirent *e;
    while ((e = readdir(d))) {
        pid_t tid = (pid_t)atoi(e->d_name);
        if (tid <= 0 || tid == self) continue;
        errno = 0;
        int cur = getpriority(PRIO_PROCESS, (id_t)tid);
        if (errno == 0 && cur < 5) setpriority(PRIO_PROCESS, (id_t)tid, cur + 5);
    }
    closedir(d);
}

static int parse_num(const char *s, long long lo, long long hi, long long *out)
{
    char *e;
    errno = 0;
    long long v = strtoll(s, &e, 10);
    if (errno || e == s || *e || v < lo || v > hi) return -1;
    *out = v;
    return 0;
}

static int add_upstream(pconf *cf, const char *u)
{
    if (cf->n_upstreams >= AL_ARRAY_LEN(cf->upstreams)) return -1;
    if (strncmp(u, "http://", 7) != 0 && strncmp(u, "https://", 8) != 0) return -1;
    char *d = strdup(u);
    if (!d) return -1;
    size_t n = strlen(d);
    while (n && d[n - 1] == '/')
        d[--n] = '\0';
    if (n >= 3 && strcmp(d + n - 3, "/v1") == 0) d[n - 3] = '\0';
    cf->upstreams[cf->n_upstreams++] = d;
    return 0;
}

int cmd_proxy(int argc, char **argv)
{
    static const struct option opts[] = {
        AL_CLI_COMMON_OPTIONS,
        {"listen", required_argument, 0, OPT_LISTEN},
        {"upstream", required_argument, 0, OPT_UPSTREAM},
        {"upstream-kind", required_argument, 0, OPT_KIND},
        {"upstream-key-env", required_argument, 0, OPT_KEY_ENV},
        {"forward-agent-auth", no_argument, 0, OPT_FWD_AUTH},
        {"agent-key", required_argument, 0, OPT_AGENT_KEY},
        {"agent-name", required_argument, 0, OPT_AGENT_NAME},
        {"topic", required_argument, 0, OPT_TOPIC},
        {"spool-dir", required_argument, 0, OPT_SPOOL_DIR},
        {"spool-max-bytes", required_argument, 0, OPT_SPOOL_MAX},
        {"spool-fsync", required_argument, 0, OPT_SPOOL_FSYNC},
        {"max-body-bytes", required_argument, 0, OPT_MAX_BODY},
        {"max-header-bytes", required_argument, 0, OPT_MAX_HEAD},
        {"max-headers", required_argument, 0, OPT_MAX_HEADERS},
        {"max-connections", required_argument, 0, OPT_MAX_CONNS},
        {"client-timeout", required_argument, 0, OPT_CLIENT_TO},
        {"connect-timeout-ms", required_argument, 0, OPT_CONNECT_TO},
        {"upstream-timeout", required_argument, 0, OPT_UPSTREAM_TO},
        {"drain-timeout", required_argument, 0, OPT_DRAIN_TO},
        {"no-access-log", no_argument, 0, OPT_NO_ACCESS},
        {"upstream-client", required_argument, 0, OPT_UP_CLIENT},
        {"help", no_argument, 0, OPT_HELP},
        {0, 0, 0, 0},
    };
    al_cli_common common;
    al_cli_common_init(&common);
    proxy *px = calloc(1, sizeof *px);
    if (!px) return AL_EXIT_FAILURE;
    pthread_mutex_init(&px->collect_mu, NULL);
    px->state_fd = -1;
    pconf *cf = &px->cfg;
    cf->listen = "127.0.0.1:8080";
    cf->kind = UP_VLLM;
    cf->max_body = 1u << 20;
    cf->max_head = 32768;
    cf->max_headers = 100;
    cf->max_conns = 1024;
    cf->client_timeout_s = 60;
    cf->connect_timeout_ms = 5000;
    cf->upstream_timeout_ms = 600000;
    cf->spool_dir = "./arclight-spool";
    cf->spool_max = 1ull << 30;
    cf->fsync_mode = AL_SPOOL_FSYNC_INTERVAL;
    cf->topic = AL_TOPIC_SPANS;
    cf->drain_timeout_s = 30;
    cf->access_log = 1;
    const char *key_env = "ARCLIGHT_UPSTREAM_API_KEY";
    int rc = AL_EXIT_FAILURE, opt;
    long long v;
    al_kafka_conf *kc = NULL;
    al_producer *producer = NULL;
    al_http_server *msrv = NULL;
    optind = 1;
    while ((opt = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (opt) {
        case OPT_LISTEN:
            cf->listen = optarg;
            break;
        case OPT_UPSTREAM:
            if (add_upstream(cf, optarg)) {
                rc = al_cli_usage_error("proxy",
                                        "--upstream %s: need an http:// or https:// URL "
                                        "(at most 16 upstreams)",
                                        optarg);
                goto out;
            }
            break;
        case OPT_KIND:
            if (!strcmp(optarg, "arclight"))
                cf->kind = UP_ARCLIGHT;
            else if (!strcmp(optarg, "vllm"))
                cf->kind = UP_VLLM;
            else if (!strcmp(optarg, "sglang"))
                cf->kind = UP_SGLANG;
            else if (!strcmp(optarg, "openai"))
                cf->kind = UP_OPENAI;
            else {
                rc = al_cli_usage_error("proxy",
                                        "--upstream-kind %s: use arclight, vllm, sglang "
                                        "or openai",
                                        optarg);
                goto out;
            }
            break;
        case OPT_KEY_ENV:
            key_env = optarg;
            break;
        case OPT_FWD_AUTH:
            cf->forward_agent_auth = 1;
            break;
        case OPT_AGENT_KEY:
            if (cf->n_agent_keys >= AL_ARRAY_LEN(cf->agent_keys) || !*optarg) {
                rc = al_cli_usage_error("proxy", "--agent-key: empty, or more than 16 keys");
                goto out;
            }
            cf->agent_keys[cf->n_agent_keys++] = strdup(optarg);
            break;
        case OPT_AGENT_NAME:
            cf->agent_name = optarg;
            break;
        case OPT_TOPIC:
            cf->topic = optarg;
            break;
        case OPT_SPOOL_DIR:
            cf->spool_dir = optarg;
            break;
        case OPT_SPOOL_FSYNC:
            if (!strcmp(optarg, "never"))
                cf->fsync_mode = AL_SPOOL_FSYNC_NEVER;
            else if (!strcmp(optarg, "interval"))
                cf->fsync_mode = AL_SPOOL_FSYNC_INTERVAL;
            else if (!strcmp(optarg, "always"))
                cf->fsync_mode = AL_SPOOL_FSYNC_ALWAYS;
            else {
                rc = al_cli_usage_error("proxy", "--spool-fsync %s: use never, interval or always",
                                        optarg);
                goto out;
            }
            break;
        case OPT_SPOOL_MAX:
        case OPT_MAX_BODY:
        case OPT_MAX_HEAD:
        case OPT_MAX_HEADERS:
        case OPT_MAX_CONNS:
        case OPT_CLIENT_TO:
        case OPT_CONNECT_TO:
        case OPT_UPSTREAM_TO:
        case OPT_DRAIN_TO: {
            long long lo = 1, hi = 1LL << 50;
            if (opt == OPT_MAX_HEADERS) hi = AL_HTTP1_HEADERS_CAP;
            if (opt == OPT_MAX_HEAD) lo = 256, hi = 1 << 20;
            if (opt == OPT_MAX_BODY) hi = 256LL << 20;
            if (opt == OPT_MAX_CONNS) hi = 1000000;
            if (opt == OPT_CLIENT_TO || opt == OPT_UPSTREAM_TO || opt == OPT_DRAIN_TO) hi = 86400;
            if (opt == OPT_DRAIN_TO) lo = 0;
            if (opt == OPT_SPOOL_MAX) lo = 4096;
            if (parse_num(optarg, lo, hi, &v)) {
                rc = al_cli_usage_error("proxy", "--%s %s: need an integer from %lld to %lld",
                                        opts[opt - OPT_LISTEN + 4].name, optarg, lo, hi);
                goto out;
            }
            if (opt == OPT_SPOOL_MAX) cf->spool_max = (uint64_t)v;
            if (opt == OPT_MAX_BODY) cf->max_body = (size_t)v;
            if (opt == OPT_MAX_HEAD) cf->max_head = (size_t)v;
            if (opt == OPT_MAX_HEADERS) cf->max_headers = (size_t)v;
            if (opt == OPT_MAX_CONNS) cf->max_conns = (int)v;
            if (opt == OPT_CLIENT_TO) cf->client_timeout_s = (int)v;
            if (opt == OPT_CONNECT_TO) cf->connect_timeout_ms = (long)v;
            if (opt == OPT_UPSTREAM_TO) cf->upstream_timeout_ms = (long)v * 1000;
            if (opt == OPT_DRAIN_TO) cf->drain_timeout_s = (int)v;
            break;
        }
        case OPT_UP_CLIENT:
            if (!strcmp(optarg, "curl"))
                cf->curl_only = 1;
            else if (strcmp(optarg, "auto") != 0) {
                rc = al_cli_usage_error("proxy", "--upstream-client %s: use auto or curl", optarg);
                goto out;
            }
            break;
        case OPT_NO_ACCESS:
            cf->access_log = 0;
            break;
        case OPT_HELP:
            fputs(proxy_usage, stdout);
            rc = AL_EXIT_OK;
            goto out;
        default: {
            int r = al_cli_common_option(&common, opt, optarg);
            if (r == 1) break;
            if (r == 0) fputs(proxy_usage, stderr);
            rc = AL_EXIT_USAGE;
            goto out;
        }
        }
    }
    if (optind < argc) {
        rc = al_cli_usage_error("proxy", "unexpected argument '%s'", argv[optind]);
        goto out;
    }
    if (!cf->n_upstreams) {
        rc = al_cli_usage_error("proxy", "--upstream URL is required (the model server)");
        goto out;
    }
    char host[256];
    int port;
    if (al_cli_parse_hostport(cf->listen, host, sizeof host, &port) != 0) {
        rc = al_cli_usage_error("proxy", "--listen %s: need HOST:PORT", cf->listen);
        goto out;
    }
    const char *kv = getenv(key_env);
    if (kv && *kv) cf->upstream_key = strdup(kv);
    const char *ak = getenv("ARCLIGHT_PROXY_AGENT_KEYS");
    if (ak && *ak) {
        char *dup = strdup(ak), *save = NULL;
        for (char *t = strtok_r(dup, ",", &save); t && cf->n_agent_keys < 16;
             t = strtok_r(NULL, ",", &save))
            if (*t) cf->agent_keys[cf->n_agent_keys++] = strdup(t);
        free(dup);
    }

    char err[1024];
    signal(SIGPIPE, SIG_IGN);
    if (getrandom(&px->rng, sizeof px->rng, 0) != sizeof px->rng || !px->rng)
        px->rng = (uint64_t)al_now_us() | 1;
    kc = al_kafka_conf_from_cli(&common, err, sizeof err);
    if (!kc) {
        al_log_error(COMP, "%s", err);
        goto out;
    }
    producer = al_producer_new(kc, err, sizeof err);
    if (!producer) {
        al_log_error(COMP, "%s", err);
        goto out;
    }
    {
        /* the first spans should not wait a second for librdkafka to notice the topic; a
         * broker that is down only costs this second here (spans spool meanwhile) */
        const char *outs[] = {cf->topic, NULL};
        if (al_producer_prepare(producer, outs, 1000, err, sizeof err) != 0)
            al_log_warn(COMP, "%s (spans spool until Kafka answers)", err);
    }
    px->spool = al_spool_open(cf->spool_dir, cf->spool_max, cf->fsync_mode, producer, cf->topic,
                              err, sizeof err);
    if (!px->spool) {
        al_log_error(COMP, "%s", err);
        al_producer_free(producer);
        goto out;
    }
    background_threads_yield();
    snprintf(px->state_path, sizeof px->state_path, "%s/proxy-state", cf->spool_dir);
    state_load(px);
    state_compact(px);
    px->metrics = al_metrics_new();
    al_metrics_add_process_metrics(px->metrics);
    px->spans_spooled = al_metrics_counter(px->metrics, "arclight_proxy_spans_spooled_total",
                                           "Spans written to the spool (then published)", NULL);
    px->spans_failed = al_metrics_counter(px->metrics, "arclight_proxy_spans_failed_total",
                                          "Spans that could not be encoded or spooled", NULL);
    px->rejected_spool_full =
        al_metrics_counter(px->metrics, "arclight_proxy_rejected_spool_full_total",
                           "Calls refused with 503: spool full", NULL);
    px->c_published = al_metrics_counter(px->metrics, "arclight_proxy_spans_published_total",
                                         "Spans acknowledged by Kafka", NULL);
    px->c_dropped =
        al_metrics_counter(px->metrics, "arclight_proxy_spans_dropped_total",
                           "Spans Kafka refused for good (larger than the broker takes)", NULL);
    px->g_spool_bytes = al_metrics_gauge(px->metrics, "arclight_proxy_spool_bytes",
                                         "Bytes in the spool (not yet acknowledged)", NULL);
    px->g_spool_records = al_metrics_gauge(px->metrics, "arclight_proxy_spool_spans",
                                           "Spans in the spool not yet acknowledged", NULL);
    px->g_conns =
        al_metrics_gauge(px->metrics, "arclight_proxy_connections", "Open agent connections", NULL);
    px->g_inflight = al_metrics_gauge(px->metrics, "arclight_proxy_calls_in_flight",
                                      "Upstream calls in flight", NULL);
    px->h_overhead =
        al_metrics_histogram(px->metrics, "arclight_proxy_overhead_seconds",
                             "The proxy's own time per call (not the upstream's)",
                             al_metrics_latency_buckets, al_metrics_latency_buckets_len, NULL);
    px->h_upstream = al_metrics_histogram(px->metrics, "arclight_proxy_upstream_seconds",
                                          "Upstream call latency", al_metrics_latency_buckets,
                                          al_metrics_latency_buckets_len, NULL);
    al_metrics_on_collect(px->metrics, collect, px);
    if (common.metrics &&
        !(msrv = al_http_server_start(common.metrics, px->metrics, health, px, err, sizeof err))) {
        al_log_error(COMP, "%s", err);
        goto out;
    }

    /* the changelist folds curl's remove/re-add of pooled upstream sockets within one loop
     * turn into at most one epoll_ctl */
    struct event_config *ecfg = event_config_new();
    if (ecfg) event_config_set_flag(ecfg, EVENT_BASE_FLAG_EPOLL_USE_CHANGELIST);
    px->base = ecfg ? event_base_new_with_config(ecfg) : NULL;
    if (ecfg) event_config_free(ecfg);
    if (!px->base) px->base = event_base_new();
    px->multi = curl_multi_init();
    if (!px->base || !px->multi) {
        al_log_error(COMP, "cannot create the event loop");
        goto out;
    }
    px->curl_timer = evtimer_new(px->base, curl_timer_event, px);
    curl_multi_setopt(px->multi, CURLMOPT_SOCKETFUNCTION, curl_socket_cb);
    curl_multi_setopt(px->multi, CURLMOPT_SOCKETDATA, px);
    curl_multi_setopt(px->multi, CURLMOPT_TIMERFUNCTION, curl_timer_cb);
    curl_multi_setopt(px->multi, CURLMOPT_TIMERDATA, px);
    curl_multi_setopt(px->multi, CURLMOPT_MAXCONNECTS, 1024L);
    for (size_t i = 0; i < cf->n_upstreams; i++)
        url_public(cf->upstreams[i], px->up_public[i], sizeof px->up_public[i]);
    static const al_upc_handler upc_handler = {upc_on_head, upc_on_body, upc_on_done};
    if (!cf->curl_only) {
        px->upc = al_upc_pool_new(px->base, &upc_handler);
        if (!px->upc) {
            al_log_error(COMP, "out of memory");
            goto out;
        }
        for (size_t i = 0; i < cf->n_upstreams; i++)
            al_upc_pool_add(px->upc, (int)i, cf->upstreams[i]);
    }

    struct sockaddr_storage ss;
    memset(&ss, 0, sizeof ss);
    int sl;
    const char *h4 = strcmp(host, "localhost") ? host : "127.0.0.1";
    struct sockaddr_in *s4 = (struct sockaddr_in *)&ss;
    struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)&ss;
    if (inet_pton(AF_INET, h4, &s4->sin_addr) == 1) {
        s4->sin_family = AF_INET;
        s4->sin_port = htons((uint16_t)port);
        sl = (int)sizeof *s4;
    } else if (inet_pton(AF_INET6, host, &s6->sin6_addr) == 1) {
        s6->sin6_family = AF_INET6;
        s6->sin6_port = htons((uint16_t)port);
        sl = (int)sizeof *s6;
    } else {
        rc = al_cli_usage_error("proxy", "--listen %s: need a numeric address HOST:PORT",
                                cf->listen);
        goto out;
    }
    px->listener =
        evconnlistener_new_bind(px->base, accept_cb, px, LEV_OPT_CLOSE_ON_FREE | LEV_OPT_REUSEABLE,
                                1024, (struct sockaddr *)&ss, sl);
    if (!px->listener) {
        al_log_error(COMP, "cannot listen on %s: %s", cf->listen, strerror(errno));
        goto out;
    }
    struct sockaddr_storage bound;
    socklen_t bl = sizeof bound;
    getsockname(evconnlistener_get_fd(px->listener), (struct sockaddr *)&bound, &bl);
    px->port = ntohs(bound.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&bound)->sin6_port
                                                 : ((struct sockaddr_in *)&bound)->sin_port);
    px->sig_term = evsignal_new(px->base, SIGTERM, on_signal, px);
    px->sig_int = evsignal_new(px->base, SIGINT, on_signal, px);
    event_add(px->sig_term, NULL);
    event_add(px->sig_int, NULL);
    struct timeval sweep = {300, 0};
    px->sweep_timer = event_new(px->base, -1, EV_PERSIST, sweep_cb, px);
    event_add(px->sweep_timer, &sweep);
    px->flush_ev = event_new(px->base, -1, 0, spool_flush_cb, px);
    px->out_ev = event_new(px->base, -1, 0, conn_flush_turn, px);
    if (!px->sweep_timer || !px->flush_ev || !px->out_ev) {
        al_log_error(COMP, "out of memory");
        goto out;
    }

    char up[512];
    url_public(cf->upstreams[0], up, sizeof up);
    printf("%s:%d\n",
           strchr(host, ':') ? "[::1]" : (strcmp(host, "localhost") ? host : "127.0.0.1"),
           px->port);
    fflush(stdout);
    al_log_info(COMP, "listening on port %d; upstream %s (+%zu more); spans to %s via spool %s",
                px->port, up, cf->n_upstreams - 1, cf->topic, cf->spool_dir);
    event_base_dispatch(px->base);
    rc = AL_EXIT_OK;
    /* the final flush is bounded by --drain-timeout; a second SIGTERM must not cut it */
    event_free(px->sig_term);
    event_free(px->sig_int);
    px->sig_term = px->sig_int = NULL;
    signal(SIGTERM, SIG_IGN);
    signal(SIGINT, SIG_IGN);

out:
    /* calls cut off by the drain timeout still get their (failed) span */
    for (conn *c = px->conns; c; c = c->next)
        if (c->call) {
            c->call->c = NULL;
            c->call = NULL;
        }
    while (px->calls)
        call_done(px->calls, CURLE_ABORTED_BY_CALLBACK);
    while (px->conns)
        conn_free(px->conns);
    if (px->spool) {
        spool_flush(px);
        state_flush(px);
        long left = al_spool_close(px->spool, cf->drain_timeout_s * 1000);
        if (left == 0 && rc == AL_EXIT_OK) al_log_info(COMP, "every span published; bye");
    }
    al_http_server_stop(msrv);
    if (px->listener) evconnlistener_free(px->listener);
    if (px->curl_timer) event_free(px->curl_timer);
    if (px->sig_term) event_free(px->sig_term);
    if (px->sig_int) event_free(px->sig_int);
    if (px->drain_timer) event_free(px->drain_timer);
    if (px->sweep_timer) event_free(px->sweep_timer);
    if (px->flush_ev) event_free(px->flush_ev);
    if (px->out_ev) event_free(px->out_ev);
    if (px->state_fd >= 0) close(px->state_fd);
    al_buf_free(&px->state_pend);
    free(px->dirty);
    while (px->n_easy_pool)
        curl_easy_cleanup(px->easy_pool[--px->n_easy_pool]);
    if (px->multi) curl_multi_cleanup(px->multi);
    al_upc_pool_free(px->upc);
    if (px->base) event_base_free(px->base);
    al_metrics_free(px->metrics);
    al_kafka_conf_free(kc);
    for (size_t i = 0; i < px->rtab_size; i++)
        for (rollout_ent *e = px->rtab[i], *nx; e; e = nx) {
            nx = e->next;
            free(e->key);
            free(e);
        }
    free(px->rtab);
    for (size_t i = 0; i < 1024; i++)
        for (session_ent *s = px->sessions[i], *nx; s; s = nx) {
            nx = s->next;
            free(s->task);
            free(s->rollout);
            free(s);
        }
    for (size_t i = 0; i < cf->n_upstreams; i++)
        free(cf->upstreams[i]);
    for (size_t i = 0; i < cf->n_agent_keys; i++)
        free(cf->agent_keys[i]);
    free(cf->upstream_key);
    al_buf_free(&px->enc);
    al_buf_free(&px->strip);
    pthread_mutex_destroy(&px->collect_mu);
    free(px);
    return rc;
}
