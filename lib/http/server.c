/*
 * server.c: /metrics and /healthz on evhttp, one event loop on one thread. libevent is put
 * in pthreads mode once per process so that al_http_server_stop can break the loop from
 * another thread.
 */
#include "http/server.h"

#include "core/cli.h"
#include "core/log.h"
#include "core/util.h"

#include <errno.h>
#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <event2/thread.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

struct al_http_server {
    struct event_base *base;
    struct evhttp *http;
    struct event *stop_ev; /* activated by al_http_server_stop from any thread */
    pthread_t thread;
    int thread_started;
    int port;
    al_metrics *metrics;
    al_http_health_fn health;
    void *health_ud;
};

static pthread_once_t evthread_once = PTHREAD_ONCE_INIT;
static int evthread_ok;

static void evthread_setup(void)
{
    evthread_ok = evthread_use_pthreads() == 0;
}

/* Appends s to the buffer as the inside of a JSON string (quotes, backslashes and control
 * bytes escaped; other bytes passed through). */
static void json_escape_into(struct evbuffer *out, const char *s)
{
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\')
            evbuffer_add_printf(out, "\\%c", *p);
        else if (*p == '\n')
            evbuffer_add(out, "\\n", 2);
        else if (*p < 0x20)
            evbuffer_add_printf(out, "\\u%04x", *p);
        else
            evbuffer_add(out, p, 1);
    }
}

static void reply_json(struct evhttp_request *req, int code, const char *reason,
                       struct evbuffer *body)
{
    struct evkeyvalq *h = evhttp_request_get_output_headers(req);
    evhttp_add_header(h, "Content-Type", "application/json");
    evhttp_add_header(h, "Cache-Control", "no-store");
    evbuffer_add(body, "\n", 1);
    evhttp_send_reply(req, code, reason, body);
}

static void free_rendered(const void *data, size_t len, void *extra)
{
    free((void *)data);
}

static void handle_metrics(al_http_server *s, struct evhttp_request *req, struct evbuffer *body)
{
    size_t len = 0;
    char *text = s->metrics ? al_metrics_render(s->metrics, &len) : strdup("");
    if (!text) {
        evbuffer_add_printf(body, "{\"error\":\"out of memory rendering metrics\"}");
        reply_json(req, 500, "Internal Server Error", body);
        return;
    }
    if (evbuffer_add_reference(body, text, len, free_rendered, NULL) != 0) free(text);
    evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type",
                      "text/plain; version=0.0.4; charset=utf-8");
    evhttp_send_reply(req, 200, "OK", body);
}

static void handle_healthz(al_http_server *s, struct evhttp_request *req, struct evbuffer *body)
{
    char reason[512] = "";
    int bad = s->health ? s->health(s->health_ud, reason, sizeof reason) : 0;
    if (!bad) {
        evbuffer_add_printf(body, "{\"status\":\"ok\"}");
        reply_json(req, 200, "OK", body);
        return;
    }
    reason[sizeof reason - 1] = '\0';
    evbuffer_add_printf(body, "{\"status\":\"unhealthy\",\"reason\":\"");
    json_escape_into(body, reason[0] ? reason : "unhealthy (no reason given)");
    evbuffer_add_printf(body, "\"}");
    reply_json(req, 503, "Service Unavailable", body);
}

static void on_request(struct evhttp_request *req, void *arg)
{
    al_http_server *s = arg;
    struct evbuffer *body = evbuffer_new();
    if (!body) {
        evhttp_send_error(req, 500, "out of memory");
        return;
    }
    const struct evhttp_uri *uri = evhttp_request_get_evhttp_uri(req);
    const char *path = uri ? evhttp_uri_get_path(uri) : NULL;
    if (!path || !*path) path = "/";
    enum evhttp_cmd_type cmd = evhttp_request_get_command(req);

    if (cmd != EVHTTP_REQ_GET && cmd != EVHTTP_REQ_HEAD) {
        evbuffer_add_printf(body, "{\"error\":\"method not allowed\",\"allowed\":[\"GET\","
                                  "\"HEAD\"],\"path\":\"");
        json_escape_into(body, path);
        evbuffer_add_printf(body, "\"}");
        evhttp_add_header(evhttp_request_get_output_headers(req), "Allow", "GET, HEAD");
        reply_json(req, 405, "Method Not Allowed", body);
    } else if (strcmp(path, "/metrics") == 0) {
        handle_metrics(s, req, body);
    } else if (strcmp(path, "/healthz") == 0) {
        handle_healthz(s, req, body);
    } else {
        evbuffer_add_printf(body, "{\"error\":\"not found\",\"path\":\"");
        json_escape_into(body, path);
        evbuffer_add_printf(body, "\",\"endpoints\":[\"/metrics\",\"/healthz\"]}");
        reply_json(req, 404, "Not Found", body);
    }
    evbuffer_free(body);
}

static void *server_thread(void *arg)
{
    al_http_server *s = arg;
    event_base_dispatch(s->base);
    return NULL;
}

static void on_stop(evutil_socket_t fd, short what, void *arg)
{
    al_http_server *s = arg;
    event_base_loopbreak(s->base);
}

static void server_free(al_http_server *s)
{
    if (s->stop_ev) event_free(s->stop_ev);
    if (s->http) evhttp_free(s->http);
    if (s->base) event_base_free(s->base);
    free(s);
}

/* Shared by every server: binds, learns the port, starts the loop thread. handler NULL means
 * the built-in /metrics and /healthz (on_request with the server itself). NULL with errstr. */
static al_http_server *server_start(const char *hostport, const al_http_server_opts *o,
                                    al_http_handler_fn handler, void *ud, al_metrics *metrics,
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
    s->metrics = metrics;
    s->health = health;
    s->health_ud = health_ud;
    s->base = event_base_new();
    s->http = s->base ? evhttp_new(s->base) : NULL;
    s->stop_ev = s->base ? event_new(s->base, -1, 0, on_stop, s) : NULL;
    if (!s->http || !s->stop_ev) {
        server_free(s);
        al_err(errstr, errlen, "cannot create the %s server's event loop", o->name);
        return NULL;
    }
    if (o->methods) evhttp_set_allowed_methods(s->http, (ev_uint16_t)o->methods);
    evhttp_set_timeout(s->http, o->timeout_s);
    evhttp_set_max_headers_size(s->http, 16384);
    evhttp_set_max_body_size(s->http, (ev_ssize_t)o->max_body);
    if (handler)
        evhttp_set_gencb(s->http, handler, ud);
    else
        evhttp_set_gencb(s->http, on_request, s);
    errno = 0;
    struct evhttp_bound_socket *bs =
        evhttp_bind_socket_with_handle(s->http, host, (ev_uint16_t)port);
    if (!bs) {
        al_err(errstr, errlen, "cannot listen on %s for %s: %s", hostport, o->serves,
               errno ? strerror(errno) : "bind failed");
        server_free(s);
        return NULL;
    }
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    s->port = port;
    if (getsockname(evhttp_bound_socket_get_fd(bs), (struct sockaddr *)&ss, &sl) == 0) {
        if (ss.ss_family == AF_INET) s->port = ntohs(((struct sockaddr_in *)&ss)->sin_port);
        if (ss.ss_family == AF_INET6) s->port = ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
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
    .timeout_s = 30,
    .max_body = 65536,
    .methods = EVHTTP_REQ_GET | EVHTTP_REQ_HEAD | EVHTTP_REQ_POST | EVHTTP_REQ_PUT |
               EVHTTP_REQ_DELETE | EVHTTP_REQ_OPTIONS | EVHTTP_REQ_PATCH,
};

al_http_server *al_http_server_start(const char *hostport, al_metrics *metrics,
                                     al_http_health_fn health, void *health_ud, char *errstr,
                                     size_t errlen)
{
    al_http_server *s = server_start(hostport, &metrics_opts, NULL, NULL, metrics, health,
                                     health_ud, errstr, errlen);
    if (!s) return NULL;
    al_log_debug("http", "serving /metrics and /healthz on %s (port %d)", hostport, s->port);
    return s;
}

al_http_server *al_http_server_start_handler(const char *hostport, const al_http_server_opts *opts,
                                             al_http_handler_fn handler, void *ud, char *errstr,
                                             size_t errlen)
{
    return server_start(hostport, opts, handler, ud, NULL, NULL, NULL, errstr, errlen);
}

int al_http_server_port(const al_http_server *s)
{
    return s ? s->port : -1;
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
