/*
 * upstream.c: the proxy's keep-alive HTTP/1.1 client for plain http:// upstreams (see
 * upstream.h for why and for the contract).
 */
#define _GNU_SOURCE
#include "upstream.h"

#include "http/http1.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#define UPC_MAX_UPSTREAMS 16
#define UPC_MAX_HEAD (64u << 10)
#define UPC_MAX_IDLE 512 /* per upstream; more are closed when they finish */

typedef enum { B_NONE, B_LENGTH, B_CHUNKED, B_CLOSE } body_mode;
typedef enum { C_SIZE, C_DATA, C_DATA_CRLF, C_TRAILER, C_DONE } chunk_state;

typedef struct upstream {
    int served;
    struct sockaddr_storage addr;
    socklen_t addrlen;
    char host[300];   /* Host header value, as in the URL */
    char prefix[600]; /* path before /v1/..., "" for none */
    char name[320];   /* host:port for messages */
    al_upc *idle;     /* idle connections, most recently used first */
    int nidle;
} upstream;

struct al_upc_pool {
    struct event_base *base;
    al_upc_handler h;
    upstream ups[UPC_MAX_UPSTREAMS];
    al_upc *busy; /* connections carrying an exchange */
};

struct al_upc {
    al_upc_pool *pool;
    int idx, fd;
    struct event *rev, *wev, *timer;
    al_upc *prev, *next; /* in the idle list of its upstream, or the pool's busy list */
    int busy, connecting, reused, resent, paused;
    int eof, eof_err;       /* the upstream closed (with this errno, or 0) */
    int in_start;           /* inside al_upc_start: on_done must wait for the loop */
    al_upc_err pending_err; /* a failure found inside al_upc_start */
    char pending_msg[512];
    /* the exchange */
    void *ud;
    char *head;
    size_t head_len;
    const char *body;
    size_t body_len, sent;
    int64_t deadline_ms; /* whole exchange; 0 none */
    long total_ms;
    /* the answer: read(2) straight into the free room (64 KiB first, then doubling; the
     * consumed front moved out before growing), which al_buf's append does not do */
    char *in;
    size_t in_len, in_pos, in_cap;
    int got_bytes, head_done, keep_alive;
    body_mode mode;
    chunk_state cst;
    uint64_t left; /* B_LENGTH: bytes to come; B_CHUNKED: of this chunk */
};

#define NM(u) ((u)->pool->ups[(u)->idx].name)

static int64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ---- lists ------------------------------------------------------------------------------ */

static al_upc **list_of(al_upc *u)
{
    return u->busy ? &u->pool->busy : &u->pool->ups[u->idx].idle;
}

static void list_unlink(al_upc *u)
{
    al_upc **head = list_of(u);
    if (u->prev)
        u->prev->next = u->next;
    else if (*head == u)
        *head = u->next;
    if (u->next) u->next->prev = u->prev;
    u->prev = u->next = NULL;
    if (!u->busy) u->pool->ups[u->idx].nidle--;
}

static void list_push(al_upc *u)
{
    al_upc **head = list_of(u);
    u->prev = NULL;
    u->next = *head;
    if (*head) (*head)->prev = u;
    *head = u;
    if (!u->busy) u->pool->ups[u->idx].nidle++;
}

/* ---- pool and URLs ---------------------------------------------------------------------- */

al_upc_pool *al_upc_pool_new(struct event_base *base, const al_upc_handler *h)
{
    al_upc_pool *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->base = base;
    p->h = *h;
    return p;
}

/* Takes http://host[:port][/prefix] apart; only literal addresses are served (see header). */
int al_upc_pool_add(al_upc_pool *p, int idx, const char *url)
{
    if (idx < 0 || idx >= UPC_MAX_UPSTREAMS) return -1;
    upstream *up = &p->ups[idx];
    memset(up, 0, sizeof *up);
    if (strncmp(url, "http://", 7) != 0) return 0;
    const char *h = url + 7;
    const char *slash = strchr(h, '/');
    size_t hl = slash ? (size_t)(slash - h) : strlen(h);
    if (memchr(h, '@', hl)) return 0;
    if (hl == 0 || hl >= sizeof up->host) return -1;
    if (slash && strlen(slash) >= sizeof up->prefix) return -1;
    char host[300];
    memcpy(host, h, hl);
    host[hl] = '\0';
    char *name = host, *port = NULL;
    if (host[0] == '[') {
        char *e = strchr(host, ']');
        if (!e) return -1;
        *e = '\0';
        name = host + 1;
        if (e[1] == ':')
            port = e + 2;
        else if (e[1])
            return -1;
    } else {
        char *c = strchr(host, ':');
        if (c) {
            *c = '\0';
            port = c + 1;
        }
    }
    long pn = 80;
    if (port) {
        char *e;
        errno = 0;
        pn = strtol(port, &e, 10);
        if (errno || e == port || *e || pn < 1 || pn > 65535) return -1;
    }
    struct sockaddr_in *s4 = (struct sockaddr_in *)&up->addr;
    struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)&up->addr;
    const char *lit = strcasecmp(name, "localhost") == 0 ? "127.0.0.1" : name;
    if (inet_pton(AF_INET, lit, &s4->sin_addr) == 1) {
        s4->sin_family = AF_INET;
        s4->sin_port = htons((uint16_t)pn);
        up->addrlen = sizeof *s4;
    } else if (inet_pton(AF_INET6, lit, &s6->sin6_addr) == 1) {
        s6->sin6_family = AF_INET6;
        s6->sin6_port = htons((uint16_t)pn);
        up->addrlen = sizeof *s6;
    } else {
        return 0; /* a host name: curl resolves it off the loop */
    }
    memcpy(up->host, h, hl);
    up->host[hl] = '\0';
    snprintf(up->prefix, sizeof up->prefix, "%s", slash ? slash : "");
    memcpy(up->name, up->host, hl + 1);
    up->served = 1;
    return 1;
}

int al_upc_pool_serves(const al_upc_pool *p, int idx)
{
    return idx >= 0 && idx < UPC_MAX_UPSTREAMS && p->ups[idx].served;
}

/* ---- connections ------------------------------------------------------------------------ */

static void conn_close(al_upc *u)
{
    list_unlink(u);
    if (u->rev) event_free(u->rev);
    if (u->wev) event_free(u->wev);
    if (u->timer) event_free(u->timer);
    if (u->fd >= 0) close(u->fd);
    free(u->head);
    free(u->in);
    free(u);
}

static void read_cb(evutil_socket_t fd, short what, void *arg);
static void write_cb(evutil_socket_t fd, short what, void *arg);
static void timer_cb(evutil_socket_t fd, short what, void *arg);

/* A new non-blocking connection to upstream idx, connecting; NULL with errno. */
static al_upc *conn_new(al_upc_pool *p, int idx)
{
    upstream *up = &p->ups[idx];
    al_upc *u = calloc(1, sizeof *u);
    if (!u) return NULL;
    u->pool = p;
    u->idx = idx;
    u->fd = socket(up->addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (u->fd < 0) {
        free(u);
        return NULL;
    }
    int one = 1;
    setsockopt(u->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    u->rev = event_new(p->base, u->fd, EV_READ | EV_PERSIST, read_cb, u);
    u->wev = event_new(p->base, u->fd, EV_WRITE, write_cb, u);
    u->timer = evtimer_new(p->base, timer_cb, u);
    if (!u->rev || !u->wev || !u->timer) {
        int e = errno ? errno : ENOMEM;
        if (u->rev) event_free(u->rev);
        if (u->wev) event_free(u->wev);
        if (u->timer) event_free(u->timer);
        close(u->fd);
        free(u);
        errno = e;
        return NULL;
    }
    u->connecting = 1;
    if (connect(u->fd, (struct sockaddr *)&up->addr, up->addrlen) == 0)
        u->connecting = 0;
    else if (errno != EINPROGRESS)
        u->connecting = -errno; /* reported on the first write */
    return u;
}

static void arm_timer(al_upc *u, long ms)
{
    if (ms <= 0) {
        evtimer_del(u->timer);
        return;
    }
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    evtimer_add(u->timer, &tv);
}

/* Ends the exchange: back to the idle list when the connection can carry another one, else
 * closed; then on_done. */
static void finish(al_upc *u, al_upc_err err, const char *msg)
{
    al_upc_pool *p = u->pool;
    void *ud = u->ud;
    int reuse = err == AL_UPC_OK && u->keep_alive && u->in_pos == u->in_len &&
                p->ups[u->idx].nidle < UPC_MAX_IDLE;
    if (reuse) {
        list_unlink(u);
        u->busy = 0;
        u->ud = NULL;
        u->paused = 0;
        u->reused = 1;
        u->in_len = u->in_pos = 0;
        free(u->head);
        u->head = NULL;
        u->body = NULL;
        evtimer_del(u->timer);
        event_del(u->wev);
        if (!event_pending(u->rev, EV_READ, NULL)) event_add(u->rev, NULL);
        list_push(u);
    } else {
        conn_close(u);
    }
    p->h.on_done(ud, err, msg ? msg : "");
}

/* Fails the exchange with a message naming the upstream; inside al_upc_start the failure
 * waits for the loop (the caller has no handle yet to be told about). */
__attribute__((format(printf, 3, 4))) static void fail(al_upc *u, al_upc_err err, const char *fmt,
                                                       ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (u->in_start) {
        u->pending_err = err;
        snprintf(u->pending_msg, sizeof u->pending_msg, "%s", msg);
        event_active(u->wev, EV_WRITE, 1);
        return;
    }
    finish(u, err, msg);
}

/* Sends what is left of the request; arms the write event on a full socket buffer. */
static void send_more(al_upc *u);

/* The reused connection was closed under the request before any answer: again once, on a
 * fresh socket in the same al_upc (the caller's handle stays valid). */
static void resend_fresh(al_upc *u)
{
    upstream *up = &u->pool->ups[u->idx];
    int fd = socket(up->addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        fail(u, AL_UPC_CONNECT, "Failed to connect to %s: %s", NM(u), strerror(errno));
        return;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    event_del(u->rev);
    event_del(u->wev);
    close(u->fd);
    u->fd = fd;
    event_assign(u->rev, u->pool->base, fd, EV_READ | EV_PERSIST, read_cb, u);
    event_assign(u->wev, u->pool->base, fd, EV_WRITE, write_cb, u);
    u->resent = 1;
    u->reused = 0;
    u->sent = 0;
    u->in_pos = u->in_len = 0;
    u->eof = u->eof_err = 0;
    u->connecting = 1;
    if (connect(fd, (struct sockaddr *)&up->addr, up->addrlen) == 0)
        u->connecting = 0;
    else if (errno != EINPROGRESS)
        u->connecting = -errno;
    send_more(u);
}

static void send_more(al_upc *u)
{
    if (u->connecting < 0) {
        errno = -u->connecting;
        fail(u, AL_UPC_CONNECT, "Failed to connect to %s: %s", NM(u), strerror(errno));
        return;
    }
    if (u->connecting) {
        event_add(u->wev, NULL);
        return;
    }
    size_t total = u->head_len + u->body_len;
    while (u->sent < total) {
        struct iovec iov[2];
        int n = 0;
        if (u->sent < u->head_len) {
            iov[n].iov_base = u->head + u->sent;
            iov[n++].iov_len = u->head_len - u->sent;
            if (u->body_len) {
                iov[n].iov_base = (void *)u->body;
                iov[n++].iov_len = u->body_len;
            }
        } else {
            iov[n].iov_base = (void *)(u->body + (u->sent - u->head_len));
            iov[n++].iov_len = total - u->sent;
        }
        struct msghdr mh = {.msg_iov = iov, .msg_iovlen = (size_t)n};
        ssize_t w = sendmsg(u->fd, &mh, MSG_NOSIGNAL);
        if (w < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                event_add(u->wev, NULL);
                return;
            }
            if (u->reused && !u->resent && !u->got_bytes) {
                resend_fresh(u);
                return;
            }
            fail(u, AL_UPC_SEND, "Send failure to %s: %s", NM(u), strerror(errno));
            return;
        }
        u->sent += (size_t)w;
    }
    if (!event_pending(u->rev, EV_READ, NULL)) event_add(u->rev, NULL);
}

static void write_cb(evutil_socket_t fd, short what, void *arg)
{
    al_upc *u = arg;
    (void)what;
    if (u->pending_err) {
        finish(u, u->pending_err, u->pending_msg);
        return;
    }
    if (u->connecting > 0) {
        int err = 0;
        socklen_t el = sizeof err;
        if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) != 0) err = errno;
        if (err) {
            fail(u, AL_UPC_CONNECT, "Failed to connect to %s: %s", NM(u), strerror(err));
            return;
        }
        u->connecting = 0;
        /* the connect timeout ends here; the whole-exchange one goes on */
        arm_timer(u, u->deadline_ms ? (long)(u->deadline_ms - mono_ms()) : 0);
        if (u->deadline_ms && u->deadline_ms <= mono_ms()) {
            fail(u, AL_UPC_TIMEOUT, "Operation timed out talking to %s", NM(u));
            return;
        }
    }
    send_more(u);
}

static void timer_cb(evutil_socket_t fd, short what, void *arg)
{
    al_upc *u = arg;
    (void)fd;
    (void)what;
    if (!u->busy) return;
    if (u->connecting > 0)
        fail(u, AL_UPC_TIMEOUT, "Connection to %s timed out", NM(u));
    else {
        char d[64];
        snprintf(d, sizeof d, " after %ld milliseconds", u->total_ms);
        fail(u, AL_UPC_TIMEOUT, "Operation timed out talking to %s%s", NM(u), d);
    }
}

/* ---- the answer ------------------------------------------------------------------------- */

static int hdr_is(const char *line, size_t n, const char *name, const char **val, size_t *vl)
{
    size_t k = strlen(name);
    if (n <= k || line[k] != ':' || strncasecmp(line, name, k) != 0) return 0;
    const char *v = line + k + 1, *e = line + n;
    while (v < e && (*v == ' ' || *v == '\t'))
        v++;
    while (e > v && (e[-1] == ' ' || e[-1] == '\t'))
        e--;
    *val = v;
    *vl = (size_t)(e - v);
    return 1;
}

static int has_token(const char *v, size_t n, const char *tok)
{
    size_t k = strlen(tok);
    for (size_t i = 0; i + k <= n; i++)
        if (strncasecmp(v + i, tok, k) == 0) return 1;
    return 0;
}

/* Parses one head at in[in_pos..]. 1 parsed (a 1xx is skipped and 1 returned too), 0 needs
 * more bytes, -1 not HTTP (u is then finished). */
static int parse_head(al_upc *u)
{
    const char *s = u->in + u->in_pos;
    size_t avail = u->in_len - u->in_pos;
    const char *end = memmem(s, avail, "\r\n\r\n", 4);
    if (!end) {
        if (avail > UPC_MAX_HEAD) {
            fail(u, AL_UPC_PROTOCOL, "%s answered a head over 64 KiB", NM(u));
            return -1;
        }
        return 0;
    }
    size_t hlen = (size_t)(end - s) + 4;
    if (hlen < 12 || memcmp(s, "HTTP/1.", 7) != 0 || s[8] != ' ' || s[9] < '1' || s[9] > '5' ||
        s[10] < '0' || s[10] > '9' || s[11] < '0' || s[11] > '9') {
        fail(u, AL_UPC_PROTOCOL, "%s did not answer HTTP/1.x", NM(u));
        return -1;
    }
    int status = (s[9] - '0') * 100 + (s[10] - '0') * 10 + (s[11] - '0');
    int minor = s[7] - '0';
    u->in_pos += hlen;
    if (status >= 100 && status < 200) return 1;
    char ctype[128] = "";
    int64_t pv = -1, clen = -1;
    int chunked = 0, close_tok = 0, ka_tok = 0;
    const char *line = memchr(s, '\n', hlen);
    while (line && line + 1 < s + hlen) {
        line++;
        const char *le = memchr(line, '\n', (size_t)(s + hlen - line));
        if (!le) break;
        size_t ln = (size_t)(le - line);
        if (ln && line[ln - 1] == '\r') ln--;
        const char *v;
        size_t vl;
        if (hdr_is(line, ln, "content-type", &v, &vl)) {
            size_t cn = vl < 127 ? vl : 127;
            memcpy(ctype, v, cn);
            ctype[cn] = '\0';
        } else if (hdr_is(line, ln, "content-length", &v, &vl)) {
            int64_t x = 0;
            size_t i = 0;
            for (; i < vl && v[i] >= '0' && v[i] <= '9' && x < ((int64_t)1 << 50); i++)
                x = x * 10 + (v[i] - '0');
            if (i != vl || !vl) {
                fail(u, AL_UPC_PROTOCOL, "%s answered a bad Content-Length", NM(u));
                return -1;
            }
            clen = x;
        } else if (hdr_is(line, ln, "transfer-encoding", &v, &vl))
            chunked = has_token(v, vl, "chunked");
        else if (hdr_is(line, ln, "connection", &v, &vl)) {
            close_tok = has_token(v, vl, "close");
            ka_tok = has_token(v, vl, "keep-alive");
        } else if (hdr_is(line, ln, "x-arclight-policy-version", &v, &vl))
            pv = strtoll(v, NULL, 10);
        line = le;
    }
    u->keep_alive = !u->eof && (minor >= 1 ? !close_tok : ka_tok);
    if (status == 204 || status == 304)
        u->mode = B_NONE;
    else if (chunked) {
        u->mode = B_CHUNKED;
        u->cst = C_SIZE;
    } else if (clen >= 0) {
        u->mode = clen ? B_LENGTH : B_NONE;
        u->left = (uint64_t)clen;
    } else {
        u->mode = B_CLOSE;
        u->keep_alive = 0;
    }
    u->head_done = 1;
    u->pool->h.on_head(u->ud, status, ctype, pv);
    return 1;
}

/* Hands up to n bytes at p to on_body. 1 taken, 0 paused, -1 finished (aborted). */
static int deliver(al_upc *u, const char *p, size_t n)
{
    size_t r = u->pool->h.on_body(u->ud, p, n);
    if (r == n) return 1;
    if (r == AL_UPC_PAUSE) {
        u->paused = 1;
        event_del(u->rev);
        return 0;
    }
    fail(u, AL_UPC_ABORTED, "the answer of %s was refused", NM(u));
    return -1;
}

/* Works through the buffered bytes. 1 the exchange goes on, 0 it finished. */
static int process(al_upc *u)
{
    for (;;) {
        if (!u->head_done) {
            int r = parse_head(u);
            if (r < 0) return 0;
            if (r == 0) return 1;
            if (!u->head_done) continue; /* a 1xx */
        }
        if (u->paused) return 1;
        size_t avail = u->in_len - u->in_pos;
        const char *s = u->in + u->in_pos;
        switch (u->mode) {
        case B_NONE:
            finish(u, AL_UPC_OK, NULL);
            return 0;
        case B_LENGTH:
        case B_CLOSE: {
            if (!avail) return 1;
            size_t n = u->mode == B_LENGTH && avail > u->left ? (size_t)u->left : avail;
            int r = deliver(u, s, n);
            if (r <= 0) return r == 0;
            u->in_pos += n;
            if (u->mode == B_LENGTH) {
                u->left -= n;
                if (!u->left) {
                    finish(u, AL_UPC_OK, NULL);
                    return 0;
                }
            }
            return 1;
        }
        case B_CHUNKED:
            break;
        }
        /* chunked */
        if (u->cst == C_DATA) {
            if (!avail) return 1;
            size_t n = avail > u->left ? (size_t)u->left : avail;
            int r = deliver(u, s, n);
            if (r <= 0) return r == 0;
            u->in_pos += n;
            u->left -= n;
            if (!u->left) u->cst = C_DATA_CRLF;
            continue;
        }
        const char *nl = memchr(s, '\n', avail);
        if (!nl) {
            if (avail > 4096) {
                fail(u, AL_UPC_PROTOCOL, "%s sent a bad chunk header", NM(u));
                return 0;
            }
            return 1;
        }
        size_t ln = (size_t)(nl - s);
        u->in_pos += ln + 1;
        if (ln && s[ln - 1] == '\r') ln--;
        if (u->cst == C_DATA_CRLF) {
            if (ln) {
                fail(u, AL_UPC_PROTOCOL, "%s sent a chunk longer than announced", NM(u));
                return 0;
            }
            u->cst = C_SIZE;
        } else if (u->cst == C_SIZE) {
            uint64_t x = 0;
            size_t i = 0;
            for (; i < ln && x < ((uint64_t)1 << 40); i++) {
                char c = s[i];
                int d = c >= '0' && c <= '9'   ? c - '0'
                        : c >= 'a' && c <= 'f' ? c - 'a' + 10
                        : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                               : -1;
                if (d < 0) break;
                x = x * 16 + (uint64_t)d;
            }
            if (i == 0 || (i < ln && s[i] != ';' && s[i] != ' ' && s[i] != '\t')) {
                fail(u, AL_UPC_PROTOCOL, "%s sent a bad chunk size", NM(u));
                return 0;
            }
            u->left = x;
            u->cst = x ? C_DATA : C_TRAILER;
        } else if (u->cst == C_TRAILER) {
            if (!ln) {
                finish(u, AL_UPC_OK, NULL);
                return 0;
            }
        }
    }
}

/* The connection ended (EOF or error err) with the exchange in its current state. */
static void ended(al_upc *u, int err)
{
    if (!u->got_bytes) {
        if (u->reused && !u->resent) {
            resend_fresh(u);
            return;
        }
        fail(u, AL_UPC_NOTHING, "Empty reply from %s%s%s", NM(u), err ? ": " : "",
             err ? strerror(err) : "");
        return;
    }
    if (!u->head_done) {
        fail(u, AL_UPC_RECV, "%s closed the connection inside the answer's head", NM(u));
        return;
    }
    if (u->mode == B_CLOSE && !err) {
        u->keep_alive = 0;
        finish(u, AL_UPC_OK, NULL);
        return;
    }
    fail(u, AL_UPC_PARTIAL, "%s closed the connection before the answer's end", NM(u));
}

static void read_cb(evutil_socket_t fd, short what, void *arg)
{
    al_upc *u = arg;
    (void)what;
    if (!u->busy) { /* idle: the upstream closed it, or sent what nobody asked for */
        conn_close(u);
        return;
    }
    if (u->paused) return;
    if (!u->eof) {
        if (u->in_pos == u->in_len) u->in_pos = u->in_len = 0;
        if (u->in_cap - u->in_len < 16384) {
            if (u->in_pos > 0) {
                memmove(u->in, u->in + u->in_pos, u->in_len - u->in_pos);
                u->in_len -= u->in_pos;
                u->in_pos = 0;
            }
            if (u->in_cap - u->in_len < 16384) {
                size_t nc = u->in_cap ? u->in_cap * 2 : 65536;
                char *ni = realloc(u->in, nc);
                if (!ni) {
                    fail(u, AL_UPC_RECV, "out of memory reading from %s", NM(u));
                    return;
                }
                u->in = ni;
                u->in_cap = nc;
            }
        }
        ssize_t n = read(fd, u->in + u->in_len, u->in_cap - u->in_len);
        if (n > 0) {
            u->got_bytes = 1;
            u->in_len += (size_t)n;
        } else if (n == 0) {
            u->eof = 1;
        } else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
            u->eof = 1;
            u->eof_err = errno;
        }
        if (u->eof) {
            u->keep_alive = 0;
            event_del(u->rev); /* what is buffered is worked through on resumes */
        }
    }
    if (!process(u)) return;
    /* with the stream paused, the end waits for al_upc_resume */
    if (u->eof && !u->paused) ended(u, u->eof_err);
}

/* ---- exchanges -------------------------------------------------------------------------- */

al_upc *al_upc_start(al_upc_pool *p, int idx, const char *method, const char *path,
                     const char *headers, const char *body, size_t body_len,
                     long connect_timeout_ms, long total_timeout_ms, void *ud)
{
    upstream *up = &p->ups[idx];
    /* the head, assembled by hand: snprintf was ~1 % of the proxy's loop */
    size_t ml = strlen(method), fl = strlen(up->prefix), pl = strlen(path), hsl = strlen(up->host),
           xl = strlen(headers);
    char *head = malloc(ml + fl + pl + hsl + xl + 80);
    if (!head) return NULL;
    char *o = al_put_mem(head, method, ml);
    *o++ = ' ';
    o = al_put_mem(o, up->prefix, fl);
    o = al_put_mem(o, path, pl);
    o = al_put_mem(o, " HTTP/1.1\r\nHost: ", 17);
    o = al_put_mem(o, up->host, hsl);
    o = al_put_mem(o, "\r\n", 2);
    o = al_put_mem(o, headers, xl);
    o = al_put_mem(o, "Content-Length: ", 16);
    o = al_put_u64(o, body_len);
    o = al_put_mem(o, "\r\n\r\n", 4);
    size_t hl = (size_t)(o - head);
    al_upc *u = up->idle;
    if (u) {
        list_unlink(u);
    } else {
        u = conn_new(p, idx);
        if (!u) {
            int e = errno;
            free(head);
            errno = e;
            return NULL;
        }
    }
    u->busy = 1;
    list_push(u);
    u->ud = ud;
    u->head = head;
    u->head_len = hl;
    u->body = body;
    u->body_len = body_len;
    u->sent = 0;
    u->got_bytes = u->head_done = u->paused = u->resent = 0;
    u->pending_err = AL_UPC_OK;
    u->eof = u->eof_err = 0;
    u->in_pos = u->in_len = 0;
    u->total_ms = total_timeout_ms;
    u->deadline_ms = total_timeout_ms > 0 ? mono_ms() + total_timeout_ms : 0;
    long first = u->connecting > 0 && connect_timeout_ms > 0 &&
                         (total_timeout_ms <= 0 || connect_timeout_ms < total_timeout_ms)
                     ? connect_timeout_ms
                     : total_timeout_ms;
    arm_timer(u, first);
    u->in_start = 1; /* a refused connect or a failed send is reported from the loop */
    send_more(u);
    u->in_start = 0;
    return u;
}

void al_upc_resume(al_upc *u)
{
    if (!u || !u->paused) return;
    u->paused = 0;
    event_add(u->rev, NULL);
    event_active(u->rev, EV_READ, 1);
}

void al_upc_cancel(al_upc *u)
{
    if (u) conn_close(u);
}

void al_upc_pool_free(al_upc_pool *p)
{
    if (!p) return;
    while (p->busy)
        conn_close(p->busy);
    for (int i = 0; i < UPC_MAX_UPSTREAMS; i++)
        while (p->ups[i].idle)
            conn_close(p->ups[i].idle);
    free(p);
}
