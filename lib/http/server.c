/*
 * server.c: /metrics and /healthz, and other small servers, on lib/http/httpd.h: one event
 * loop on one thread. libevent is put in pthreads mode once per process so that
 * al_http_server_stop can wake the loop from another thread.
 */
#include "http/server.h"

#include "core/cli.h"
#include "core/log.h"
#include "core/util.h"

#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/thread.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct al_http_server {
    struct event_base *base;
    al_httpd *httpd;
    struct event *stop_ev; /* activated by al_http_server_stop from any thread */
    pthread_t thread;
    int thread_started;
    al_metrics *metrics;
    al_http_health_fn health;
    void *health_ud;
    al_httpd_handler_fn handler; /* NULL: the built-in /metrics and /healthz */
    void *ud;
};

static pthread_once_t evthread_once = PTHREAD_ONCE_INIT;
static int evthread_ok;

static void evthread_setup(void)
{
    evthread_ok = evthread_use_pthreads() == 0;
}

/* A JSON reply: the body, then a newline. */
static void reply_json(al_httpd_req *req, int code, const char *body)
{
    al_httpd_add_header(req, "Cache-Control", "no-store");
    size_t n = strlen(body);
    char *b = malloc(n + 2);
    if (!b) {
        al_httpd_send(req, 500, "application/json", "{}\n", 3);
        return;
    }
    memcpy(b, body, n);
    b[n] = '\n';
    al_httpd_send(req, code, "application/json", b, n + 1);
    free(b);
}

static void handle_metrics(al_http_server *s, al_httpd_req *req)
{
    size_t len = 0;
    char *text = s->metrics ? al_metrics_render(s->metrics, &len) : strdup("");
    if (!text) {
        reply_json(req, 500, "{\"error\":\"out of memory rendering metrics\"}");
        return;
    }
    al_httpd_send(req, 200, "text/plain; version=0.0.4; charset=utf-8", text, len);
    free(text);
}

static void handle_healthz(al_http_server *s, al_httpd_req *req)
{
    char reason[512] = "";
    int bad = s->health ? s->health(s->health_ud, reason, sizeof reason) : 0;
    if (!bad) {
        reply_json(req, 200, "{\"status\":\"ok\"}");
        return;
    }
    reason[sizeof reason - 1] = '\0';
    char esc[1600], body[1700];
    const char *r = reason[0] ? reason : "unhealthy (no reason given)";
    al_json_escape(r, strlen(r), esc, sizeof esc);
    snprintf(body, sizeof body, "{\"status\":\"unhealthy\",\"reason\":\"%s\"}", esc);
    reply_json(req, 503, body);
}

static void on_request(al_httpd_req *req, void *arg)
{
    al_http_server *s = arg;
    if (s->handler) {
        s->handler(req, s->ud);
        return;
    }
    const char *path = al_httpd_req_path(req);
    char esc[600], body[800];
    al_json_escape(path, strlen(path), esc, sizeof esc);
    if (!al_httpd_req_method_is(req, "GET") && !al_httpd_req_method_is(req, "HEAD")) {
        snprintf(body, sizeof body,
                 "{\"error\":\"method not allowed\",\"allowed\":[\"GET\",\"HEAD\"],\"path\":\"%s\"}",
                 esc);
        al_httpd_add_header(req, "Allow", "GET, HEAD");
        reply_json(req, 405, body);
    } else if (strcmp(path, "/metrics") == 0) {
        handle_metrics(s, req);
    } else if (strcmp(path, "/healthz") == 0) {
        handle_healthz(s, req);
    } else {
        snprintf(body, sizeof body,
                 "{\"error\":\"not found\",\"path\":\"%s\",\"endpoints\":[\"/metrics\",\"/healthz\"]}",
                 esc);
        reply_json(req, 404, body);
    }
}

/* Errors the server answers itself, in the shape of its other errors. */
static size_t error_body(int status, const char *message, char *out, size_t cap)
{
    char esc[700];
    al_json_escape(message, strlen(message), esc, sizeof esc);
    int n = snprintf(out, cap, "{\"error\":\"%s\",\"status\":%d}\n", esc, status);
    return n < 0 ? 0 : (size_t)n < cap ? (size_t)n : cap - 1;
}

static void *server_thread(void *arg)
{
    al_http_server *s = arg;
    event_base_dispatch(s->base);
    return NULL;
}

static void on_stop(evutil_socket_t fd, short what, void *arg)
{
    (void)fd, (void)what;
    al_http_server *s = arg;
    event_base_loopbreak(s->base);
}

static void server_free(al_http_server *s)
{
    al_httpd_free(s->httpd);
    if (s->stop_ev) event_free(s->stop_ev);
    if (s->base) event_base_free(s->base);
    free(s);
}

/* Shared by every server: binds, learns the port, starts the loop thread. handler NULL means
 * the built-in /metrics and /healthz. NULL with errstr. */
static al_http_server *server_start(const char *hostport, const al_http_server_opts *o,
                                    al_httpd_handler_fn handler, void *ud, al_metrics *metrics,
                                    al_http_health_fn health, void *health_ud, char *errstr,
                                    size_t errlen)
{
    char host[256];
    int port;
    if (al_cli_parse_hostport(hostport, host, sizeof host, &port) != 0) {
        al_err(errstr, errlen, "%s '%s' is not HOST:PORT", o->addr_name, hostport ? hostport : "");
        return NULL;
    }
    pthread_once(&evthread_once, evthread_setup);
    if (!evthread_ok) {
        al_err(errstr, errlen, "libevent has no pthreads support (evthread_use_pthreads failed)");
        return NULL;
    }
    al_http_server *s = calloc(1, sizeof *s);
    if (!s) {
        al_err(errstr, errlen, "out of memory starting the %s server", o->name);
        return NULL;
    }
    s->metrics = metrics, s->health = health, s->health_ud = health_ud;
    s->handler = handler, s->ud = ud;
    s->base = event_base_new();
    al_httpd_opts ho = o->http;
    if (!ho.error_body) ho.error_body = error_body;
    s->httpd = s->base ? al_httpd_new(s->base, &ho, on_request, s) : NULL;
    s->stop_ev = s->base ? event_new(s->base, -1, 0, on_stop, s) : NULL;
    if (!s->httpd || !s->stop_ev) {
        server_free(s);
        al_err(errstr, errlen, "cannot create the %s server's event loop", o->name);
        return NULL;
    }
    char e2[300];
    if (al_httpd_bind(s->httpd, host, port, e2, sizeof e2) != 0) {
        al_err(errstr, errlen, "cannot listen on %s for %s: %s", hostport, o->serves, e2);
        server_free(s);
        return NULL;
    }
    if (pthread_create(&s->thread, NULL, server_thread, s) != 0) {
        al_err(errstr, errlen, "cannot start the %s server thread", o->name);
        server_free(s);
        return NULL;
    }
    s->thread_started = 1;
    return s;
}

/* The metrics server's settings: scrapes are small and quick. */
static const al_http_server_opts metrics_opts = {
    .addr_name = "metrics address",
    .name = "metrics",
    .serves = "metrics",
    .http = {.max_body = 65536, .head_timeout_ms = 30000, .body_timeout_ms = 30000,
             .idle_timeout_ms = 30000, .write_timeout_ms = 30000, .max_connections = 256},
};

al_http_server *al_http_server_start(const char *hostport, al_metrics *metrics,
                                     al_http_health_fn health, void *health_ud, char *errstr,
                                     size_t errlen)
{
    al_http_server *s = server_start(hostport, &metrics_opts, NULL, NULL, metrics, health,
                                     health_ud, errstr, errlen);
    if (!s) return NULL;
    al_log_debug("http", "serving /metrics and /healthz on %s (port %d)", hostport,
                 al_httpd_port(s->httpd));
    return s;
}

al_http_server *al_http_server_start_handler(const char *hostport, const al_http_server_opts *opts,
                                             al_httpd_handler_fn handler, void *ud, char *errstr,
                                             size_t errlen)
{
    return server_start(hostport, opts, handler, ud, NULL, NULL, NULL, errstr, errlen);
}

int al_http_server_port(const al_http_server *s)
{
    return s ? al_httpd_port(s->httpd) : -1;
}

void al_http_server_stop(al_http_server *s)
{
    if (!s) return;
    if (s->thread_started) {
        /* An activated event, unlike a bare loopbreak, also stops a loop that has not
         * started dispatching yet. */
        event_active(s->stop_ev, EV_READ, 0);
        pthread_join(s->thread, NULL);
    }
    server_free(s);
}
