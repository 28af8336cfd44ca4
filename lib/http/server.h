/*
 * server.h: the small HTTP server behind `--metrics HOST:PORT` (lib/http/httpd.h on a libevent
 * loop of its own, on a thread of its own, so that a stage's main loop never serves scrapes).
 *
 *   GET /metrics  200, the registry in the Prometheus text format (version 0.0.4)
 *   GET /healthz  200 {"status":"ok"}, or 503 {"status":"unhealthy","reason":"..."} when
 *                 the health callback reports a problem
 *   anything else 404 {"error":"not found","path":"..."}; methods other than GET and HEAD
 *                 405 {"error":"method not allowed",...}
 *
 * A stage does, after parsing its flags:
 *
 *   al_http_server *srv = NULL;
 *   if (common.metrics &&
 *       !(srv = al_http_server_start(common.metrics, metrics, my_health, me, err, sizeof err)))
 *       { al_log_error("credit", "%s", err); return AL_EXIT_FAILURE; }
 *   ...
 *   al_http_server_stop(srv);   // before al_metrics_free(metrics)
 */
#ifndef ARCLIGHT_HTTP_SERVER_H
#define ARCLIGHT_HTTP_SERVER_H

#include "http/httpd.h"
#include "http/metrics.h"

#include <stddef.h>

typedef struct al_http_server al_http_server;

/* Health callback, called on the server's thread for each GET /healthz (so it must be safe
 * to call from there; reading atomics or taking the stage's own lock is fine). Returns 0
 * when healthy; nonzero when not, with a one-line reason written into `reason`. */
typedef int (*al_http_health_fn)(void *ud, char *reason, size_t reasonlen);

/* Binds `hostport` ("127.0.0.1:9100", "[::1]:0", "localhost:9100"; port 0 picks a free
 * one) and starts serving on a new thread. `metrics` (borrowed; must outlive the server)
 * may be NULL for an empty /metrics; `health` may be NULL for "always ok".
 * Returns NULL with the reason in errstr (naming the address) when the address is invalid
 * or cannot be bound, or when out of memory. */
al_http_server *al_http_server_start(const char *hostport, al_metrics *metrics,
                                     al_http_health_fn health, void *health_ud, char *errstr,
                                     size_t errlen);

/* ---- other servers on the same machinery ------------------------------------------------ */

/* Settings of a server started with al_http_server_start_handler. */
typedef struct al_http_server_opts {
    const char *addr_name; /* in "<addr_name> 'ADDR' is not HOST:PORT", e.g. "--listen" */
    const char *name;      /* in "cannot start the <name> server thread", e.g. "checkpoint" */
    const char *serves;    /* in "cannot listen on ADDR for <serves>", e.g. "checkpoints" */
    al_httpd_opts http;    /* limits and timeouts (httpd.h; zeros: its defaults) */
} al_http_server_opts;

/* Binds hostport and serves every request with `handler` (ud borrowed; must outlive the
 * server) on a new thread, as al_http_server_start does for /metrics and /healthz; stop it
 * with al_http_server_stop. The handler runs on that thread and answers each request before
 * it returns (httpd.h). NULL with the reason in errstr, worded with opts' names. */
al_http_server *al_http_server_start_handler(const char *hostport, const al_http_server_opts *opts,
                                             al_httpd_handler_fn handler, void *ud, char *errstr,
                                             size_t errlen);

/* The port actually bound (useful after binding port 0). */
int al_http_server_port(const al_http_server *s);

/* Stops serving, joins the thread, closes the socket and frees the server. NULL is a
 * no-op. Requests in flight are cut off. */
void al_http_server_stop(al_http_server *s);

#endif
