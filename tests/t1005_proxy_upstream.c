/*
 * t1005_proxy_upstream: the proxy's own HTTP/1.1 upstream client (stages/proxy/upstream.c)
 * against a scripted server on a real loopback socket: framing (Content-Length, chunked with
 * extensions and trailers, close-delimited, 1xx, 204), keep-alive reuse, a reused connection
 * closed by the upstream (sent again once on a fresh one), pause/resume, and each failure
 * (refused, timeout, not HTTP, cut short) with the request bytes checked on the server side.
 */
#define _GNU_SOURCE
#define TESTLIB_NO_MAIN
#include "testlib.h"

#include "../stages/proxy/upstream.h"

#include <arpa/inet.h>
#include <errno.h>
#include <event2/event.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* ---- scripted server: one connection at a time; per request, a reply and what follows -- */

enum { AFTER_KEEP = 0, AFTER_CLOSE = 1 };

typedef struct reply {
    const char *bytes; /* NULL: answer nothing, wait for the client to go */
    int after;
} reply;

typedef struct server {
    int lfd, port;
    const reply *replies;
    int nreplies;
    int accepts, requests;
    char last_req[4096];
    pthread_t th;
} server;

/* Reads one request (head + Content-Length body); 0 when the client closed first. */
static int read_request(int fd, char *buf, size_t cap)
{
    size_t n = 0;
    for (;;) {
        char *e = n ? memmem(buf, n, "\r\n\r\n", 4) : NULL;
        if (e) {
            size_t hl = (size_t)(e - buf) + 4;
            const char *cl = strcasestr(buf, "content-length:");
            size_t blen = cl && cl < e ? strtoul(cl + 15, NULL, 10) : 0;
            if (n >= hl + blen) {
                buf[n < cap ? n : cap - 1] = '\0';
                return 1;
            }
        }
        if (n + 1 >= cap) return 0;
        ssize_t r = read(fd, buf + n, cap - 1 - n);
        if (r <= 0) return 0;
        n += (size_t)r;
        buf[n] = '\0';
    }
}

static void *server_main(void *arg)
{
    server *s = arg;
    int i = 0;
    while (i < s->nreplies) {
        int fd = accept(s->lfd, NULL, NULL);
        if (fd < 0) break;
        s->accepts++;
        char req[4096];
        while (i < s->nreplies && read_request(fd, req, sizeof req)) {
            s->requests++;
            memcpy(s->last_req, req, sizeof req);
            const reply *r = &s->replies[i++];
            if (!r->bytes) {
                char tmp[256];
                while (read(fd, tmp, sizeof tmp) > 0) {
                }
                break;
            }
            size_t len = strlen(r->bytes);
            /* in two writes, so the client sees a split head or body */
            size_t half = len / 2;
            if (write(fd, r->bytes, half) < 0 || (usleep(2000), 0) ||
                write(fd, r->bytes + half, len - half) < 0)
                break;
            if (r->after == AFTER_CLOSE) {
                usleep(20000); /* the client has finished with this answer by then */
                break;
            }
        }
        close(fd);
    }
    return NULL;
}

static void server_start(server *s, const reply *r, int n)
{
    memset(s, 0, sizeof *s);
    s->replies = r;
    s->nreplies = n;
    s->lfd = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(s->lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    bind(s->lfd, (struct sockaddr *)&a, sizeof a);
    listen(s->lfd, 8);
    socklen_t al = sizeof a;
    getsockname(s->lfd, (struct sockaddr *)&a, &al);
    s->port = ntohs(a.sin_port);
    pthread_create(&s->th, NULL, server_main, s);
}

static void server_stop(server *s)
{
    shutdown(s->lfd, SHUT_RDWR);
    pthread_join(s->th, NULL);
    close(s->lfd);
}

/* ---- client side --------------------------------------------------------------------------- */

typedef struct result {
    int done, heads, status, pause_first, paused_once, body_calls;
    int64_t pv;
    char ctype[128];
    char body[8192];
    size_t blen;
    al_upc_err err;
    char msg[512];
    al_upc *u;
} result;

static void on_head(void *ud, int status, const char *ctype, int64_t pv)
{
    result *r = ud;
    r->heads++;
    r->status = status;
    r->pv = pv;
    snprintf(r->ctype, sizeof r->ctype, "%s", ctype);
}

static size_t on_body(void *ud, const char *p, size_t n)
{
    result *r = ud;
    r->body_calls++;
    if (r->pause_first && !r->paused_once) {
        r->paused_once = 1;
        return AL_UPC_PAUSE;
    }
    if (r->blen + n >= sizeof r->body) return 0;
    memcpy(r->body + r->blen, p, n);
    r->blen += n;
    r->body[r->blen] = '\0';
    return n;
}

static void on_done(void *ud, al_upc_err err, const char *msg)
{
    result *r = ud;
    r->done++;
    r->err = err;
    snprintf(r->msg, sizeof r->msg, "%s", msg);
}

static const al_upc_handler H = {on_head, on_body, on_done};

static struct event_base *B;

static void resume_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    result *r = arg;
    al_upc_resume(r->u);
}

/* One exchange to completion (the loop runs until on_done, at most 5 s). */
static void exchange(al_upc_pool *p, result *r, long total_ms)
{
    static const char body[] = "{\"model\":\"m\"}";
    r->done = 0;
    r->u = al_upc_start(p, 0, "POST", "/v1/chat/completions", "Content-Type: application/json\r\n",
                        body, sizeof body - 1, 1000, total_ms, r);
    REQUIREF(r->u != NULL, "start: %s", strerror(errno));
    CHECK_EQ_INT(r->done, 0); /* never from inside start */
    struct event *resume = NULL;
    for (int spins = 0; !r->done && spins < 5000; spins++) {
        event_base_loop(B, EVLOOP_ONCE | EVLOOP_NONBLOCK);
        if (r->paused_once && !resume) {
            resume = evtimer_new(B, resume_cb, r);
            struct timeval tv = {0, 10000};
            evtimer_add(resume, &tv);
        }
        if (!r->done) usleep(1000);
    }
    if (resume) event_free(resume);
    CHECK_EQ_INT(r->done, 1);
}

static al_upc_pool *pool_for(server *s, const char *prefix)
{
    al_upc_pool *p = al_upc_pool_new(B, &H);
    char url[128];
    snprintf(url, sizeof url, "http://127.0.0.1:%d%s", s->port, prefix);
    CHECK_EQ_INT(al_upc_pool_add(p, 0, url), 1);
    return p;
}

TEST(urls_served_or_left_to_curl)
{
    al_upc_pool *p = al_upc_pool_new(B, &H);
    CHECK_EQ_INT(al_upc_pool_add(p, 0, "http://127.0.0.1:8000"), 1);
    CHECK_EQ_INT(al_upc_pool_add(p, 1, "http://localhost:8000/prefix"), 1);
    CHECK_EQ_INT(al_upc_pool_add(p, 2, "http://[::1]:8000"), 1);
    CHECK_EQ_INT(al_upc_pool_add(p, 3, "http://10.0.0.1"), 1);
    CHECK_EQ_INT(al_upc_pool_add(p, 4, "https://127.0.0.1:8000"), 0);
    CHECK_EQ_INT(al_upc_pool_add(p, 5, "http://user:pw@127.0.0.1:8000"), 0);
    CHECK_EQ_INT(al_upc_pool_add(p, 6, "http://models.example.com:8000"), 0);
    CHECK_EQ_INT(al_upc_pool_add(p, 7, "http://127.0.0.1:99999"), -1);
    CHECK_EQ_INT(al_upc_pool_add(p, 8, "http://[::1"), -1);
    CHECK(al_upc_pool_serves(p, 0) && al_upc_pool_serves(p, 3));
    CHECK(!al_upc_pool_serves(p, 4) && !al_upc_pool_serves(p, 6) && !al_upc_pool_serves(p, 7));
    al_upc_pool_free(p);
}

TEST(content_length_and_keep_alive_reuse)
{
    static const reply R[] = {
        {"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nx-arclight-policy-version: 7\r\n"
         "Content-Length: 11\r\n\r\n{\"a\":\"xyz\"}",
         AFTER_KEEP},
        {"HTTP/1.1 201 Created\r\ncontent-length: 2\r\n\r\nok", AFTER_KEEP},
    };
    server s;
    server_start(&s, R, 2);
    al_upc_pool *p = pool_for(&s, "/pfx");
    result r = {0};
    exchange(p, &r, 2000);
    CHECK_EQ_INT(r.err, AL_UPC_OK);
    CHECK_EQ_INT(r.status, 200);
    CHECK_EQ_STR(r.ctype, "application/json");
    CHECK(r.pv == 7);
    CHECK_EQ_STR(r.body, "{\"a\":\"xyz\"}");
    CHECKF(strncmp(s.last_req, "POST /pfx/v1/chat/completions HTTP/1.1\r\n", 40) == 0, "got %s",
           s.last_req);
    CHECK(strstr(s.last_req, "\r\nHost: 127.0.0.1:") != NULL);
    CHECK(strstr(s.last_req, "\r\nContent-Length: 13\r\n") != NULL);
    CHECK(strstr(s.last_req, "\r\n\r\n{\"model\":\"m\"}") != NULL);
    result r2 = {0};
    exchange(p, &r2, 2000);
    CHECK_EQ_INT(r2.err, AL_UPC_OK);
    CHECK_EQ_INT(r2.status, 201);
    CHECK(r2.pv == -1);
    CHECK_EQ_STR(r2.body, "ok");
    al_upc_pool_free(p);
    server_stop(&s);
    CHECK_EQ_INT(s.accepts, 1); /* the second call rode the first one's connection */
}

TEST(chunked_1xx_close_delimited_and_no_body)
{
    static const reply R[] = {
        {"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
         "5;ext=1\r\nhello\r\n1A\r\n, abcdefghijklmnopqrstuvwx\r\n0\r\nX-Trailer: t\r\n\r\n",
         AFTER_KEEP},
        {"HTTP/1.1 204 No Content\r\n\r\n", AFTER_KEEP},
        {"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\nuntil the end", AFTER_CLOSE},
    };
    server s;
    server_start(&s, R, 3);
    al_upc_pool *p = pool_for(&s, "");
    result r = {0};
    exchange(p, &r, 2000);
    CHECK_EQ_INT(r.err, AL_UPC_OK);
    CHECK_EQ_INT(r.heads, 1); /* the 100 is not an answer */
    CHECK_EQ_STR(r.body, "hello, abcdefghijklmnopqrstuvwx");
    result r2 = {0};
    exchange(p, &r2, 2000);
    CHECK_EQ_INT(r2.err, AL_UPC_OK);
    CHECK_EQ_INT(r2.status, 204);
    CHECK_EQ_INT((int)r2.blen, 0);
    result r3 = {0};
    exchange(p, &r3, 2000);
    CHECK_EQ_INT(r3.err, AL_UPC_OK);
    CHECK_EQ_STR(r3.body, "until the end");
    al_upc_pool_free(p);
    server_stop(&s);
    CHECK_EQ_INT(s.accepts, 1);
}

TEST(reused_connection_closed_by_upstream_is_sent_again)
{
    static const reply R[] = {
        {"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\none", AFTER_CLOSE},
        {"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\ntwo", AFTER_KEEP},
    };
    server s;
    server_start(&s, R, 2);
    al_upc_pool *p = pool_for(&s, "");
    result r = {0};
    exchange(p, &r, 2000);
    CHECK_EQ_STR(r.body, "one");
    usleep(50000); /* the upstream has closed the idle connection */
    result r2 = {0};
    exchange(p, &r2, 2000);
    CHECKF(r2.err == AL_UPC_OK, "err %d: %s", r2.err, r2.msg);
    CHECK_EQ_STR(r2.body, "two");
    al_upc_pool_free(p);
    server_stop(&s);
    CHECK_EQ_INT(s.accepts, 2);
    CHECK_EQ_INT(s.requests, 2);
}

TEST(pause_gives_the_same_bytes_again)
{
    static const reply R[] = {{"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nabcdef", AFTER_KEEP}};
    server s;
    server_start(&s, R, 1);
    al_upc_pool *p = pool_for(&s, "");
    result r = {0};
    r.pause_first = 1;
    exchange(p, &r, 2000);
    CHECK_EQ_INT(r.err, AL_UPC_OK);
    CHECK(r.paused_once);
    CHECK_EQ_STR(r.body, "abcdef");
    al_upc_pool_free(p);
    server_stop(&s);
}

TEST(failures_are_named)
{
    static const reply R[] = {
        {"garbage that is no answer\r\n\r\n", AFTER_CLOSE},
        {"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nshort", AFTER_CLOSE},
        {"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", AFTER_CLOSE},
        {NULL, AFTER_CLOSE},
        {"", AFTER_CLOSE},
    };
    server s;
    server_start(&s, R, 5);
    al_upc_pool *p = pool_for(&s, "");
    result r = {0};
    exchange(p, &r, 2000);
    CHECK_EQ_INT(r.err, AL_UPC_PROTOCOL);
    CHECK(strstr(r.msg, "127.0.0.1") != NULL);
    result r2 = {0};
    exchange(p, &r2, 2000);
    CHECK_EQ_INT(r2.err, AL_UPC_PARTIAL);
    CHECK_EQ_STR(r2.body, "short");
    result r3 = {0};
    exchange(p, &r3, 2000);
    CHECK_EQ_INT(r3.err, AL_UPC_PROTOCOL);
    result r4 = {0};
    exchange(p, &r4, 200); /* answers nothing: the whole-exchange timeout */
    CHECK_EQ_INT(r4.err, AL_UPC_TIMEOUT);
    CHECK(strstr(r4.msg, "timed out") != NULL);
    result r5 = {0};
    exchange(p, &r5, 2000); /* closes without a byte on a fresh connection */
    CHECK_EQ_INT(r5.err, AL_UPC_NOTHING);
    al_upc_pool_free(p);
    server_stop(&s);
    /* nothing listens there any more: refused, reported from the loop */
    al_upc_pool *q = pool_for(&s, "");
    result r6 = {0};
    exchange(q, &r6, 2000);
    CHECK_EQ_INT(r6.err, AL_UPC_CONNECT);
    CHECK(strstr(r6.msg, "Failed to connect") != NULL);
    al_upc_pool_free(q);
}

TEST(cancel_and_free_with_exchanges_running)
{
    static const reply R[] = {{NULL, AFTER_CLOSE}, {NULL, AFTER_CLOSE}};
    server s;
    server_start(&s, R, 2);
    al_upc_pool *p = pool_for(&s, "");
    result r = {0}, r2 = {0};
    r.u = al_upc_start(p, 0, "GET", "/v1/models", "", NULL, 0, 1000, 0, &r);
    REQUIRE(r.u != NULL);
    for (int i = 0; i < 20; i++)
        event_base_loop(B, EVLOOP_ONCE | EVLOOP_NONBLOCK), usleep(1000);
    al_upc_cancel(r.u);
    r2.u = al_upc_start(p, 0, "GET", "/v1/models", "", NULL, 0, 1000, 0, &r2);
    REQUIRE(r2.u != NULL);
    for (int i = 0; i < 20; i++)
        event_base_loop(B, EVLOOP_ONCE | EVLOOP_NONBLOCK), usleep(1000);
    al_upc_pool_free(p); /* r2 still running: closed, no callback */
    CHECK_EQ_INT(r.done + r2.done, 0);
    server_stop(&s);
    CHECK_EQ_INT(s.requests, 2);
    CHECK(strncmp(s.last_req, "GET /v1/models HTTP/1.1\r\n", 25) == 0);
}

int main(int argc, char **argv)
{
    B = event_base_new();
    int rc = testlib_run(argc, argv);
    event_base_free(B);
    return rc;
}
