/*
 * server.c: the proxy's side of lib/http/httpd, the HTTP/1.1 server every arclight server
 * runs on. It makes the server with the proxy's options (its limits, one --client-timeout for
 * the idle wait, the head, the body and a blocked answer, --max-connections, TCP_NODELAY,
 * the connections gauge, its reason phrases and header order, chunked streams also for
 * HTTP/1.0 clients), and writes every answer of the layers below: whole replies, JSON errors
 * (also those the server answers itself, counted under route="unknown") and chunked streams,
 * with the requests counter and the access log. Answers leave at the end of the loop turn
 * that made them, after that turn's spans are on disk (httpd's turn_end). server.c knows no
 * file above it: it calls up only through px->hooks (main.c sets them): the turn's spans to
 * disk, a complete request to routes.c, a connection that goes away to its call (call.c),
 * which goes on for its span, and a paused stream's answer written.
 */
#include "proxy.h"

#include "core/log.h"
#include "http/httpd.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The status line's phrase: the proxy's own wording (413 "Payload Too Large", others by
 * class), as agents have always seen it; lib/http's (al_http_reason) is serve's. */
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

/* Counts an answer in arclight_proxy_requests_total{route, status}; a series is made on first
 * use and kept in px->series. */
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

/* The access-log line of an answer that is not a call's (a call writes its own, with what
 * it captured): unknown routes, refused requests, rewards, ends, sessions. Probes of
 * /healthz, /metrics and base URLs that succeed are not logged. */
static const char *reply_why; /* the error being answered, for its access-log line */

static void access_log_request(const conn *c, int status)
{
    if (!c->px->cfg.access_log || c->call) return;
    if (status == 200 && c->route->quiet) return;
    size_t ml = c->head->method.n > 32 ? 32 : c->head->method.n;
    size_t tl = c->head->target.n > 400 ? 400 : c->head->target.n;
    al_log_info("proxy.access", "method=%.*s path=%.*s status=%d route=%s ms=%.3f%s%.300s", (int)ml,
                c->head->method.p, (int)tl, c->head->target.p, status, c->route->name,
                (double)(al_mono_us() - c->t0_mono) / 1000.0, reply_why ? " error=" : "",
                reply_why ? reply_why : "");
}

void px_conn_reply(conn *c, int status, const char *ctype, const char *extra, const char *body,
                   size_t len)
{
    if (extra && *extra) al_httpd_add_header_lines(c->r, extra);
    c->answered = 1;
    count_request(c->px, c->route, status);
    access_log_request(c, status);
    al_httpd_send(c->r, status, ctype, body, len);
}

/* msg[0..n) (n may be past cap: vsnprintf's want) cut at a character when it is long, and
 * bytes that are not UTF-8 written as U+FFFD, into clean (cap bytes). */
static void message_clean(const char *msg, int n, size_t cap, char *clean, size_t clean_cap)
{
    size_t len = n < 0 ? 0 : (size_t)n < cap ? (size_t)n : cap - 1;
    if (n > 0 && (size_t)n >= cap) len = al_utf8_cut(msg, (size_t)n, len);
    al_utf8_clean(msg, len, clean, clean_cap);
}

/* An OpenAI-style error body: {"error":{"message","type","param","code"}}. The message may
 * quote what the agent sent: cut at a character when it is long, and bytes that are not
 * UTF-8 written as U+FFFD, so that the body is always the JSON it says it is. */
void px_conn_error(conn *c, int status, const char *type, const char *code, const char *fmt, ...)
{
    char msg[1024], clean[3100];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    message_clean(msg, n, sizeof msg, clean, sizeof clean);
    /* on the Messages route, Anthropic's {"type":"error","error":{...}} */
    char *body = al_xl_error_body(c->route->error_api, status, type, code, clean);
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
    al_httpd_add_header_lines(c->r, "Cache-Control: no-cache\r\n");
    if (extra && *extra) al_httpd_add_header_lines(c->r, extra);
    al_httpd_send_start(c->r, status, ctype);
    count_request(c->px, c->route, status);
}

void px_conn_stream_write(conn *c, const char *data, size_t len)
{
    al_httpd_send_chunk(c->r, data, len);
}

void px_conn_stream_end(conn *c)
{
    c->answered = 1;
    al_httpd_send_end(c->r);
}

size_t px_conn_pending(const conn *c)
{
    return al_httpd_req_pending(c->r);
}

void px_conn_close_after(conn *c)
{
    al_httpd_req_close_after(c->r);
}

/* ------------------------------------------------------------------------------------------
 * The server's callbacks
 * ------------------------------------------------------------------------------------------ */

/* An error lib/http answers itself (a malformed or oversized request, a timeout, a connection
 * past --max-connections): the proxy's JSON body, counted under route="unknown". */
static size_t server_error_answer(void *ud, const al_httpd_error *e, char *out, size_t cap)
{
    proxy *px = ud;
    count_request(px, &px_route_unknown, e->status);
    if (e->why == AL_HTTPD_WHY_OVERLOADED) {
        static const char body[] = "{\"error\":{\"message\":\"too many connections to the "
                                   "proxy\",\"type\":\"server_error\",\"param\":null,\"code\":"
                                   "\"overloaded\"}}";
        size_t n = sizeof body - 1 < cap ? sizeof body - 1 : cap - 1;
        memcpy(out, body, n);
        out[n] = '\0';
        return n;
    }
    char msg[1024], clean[3100];
    int n;
    if (e->why == AL_HTTPD_WHY_TIMEOUT)
        n = snprintf(msg, sizeof msg, "the request was not received in time");
    else if (e->why == AL_HTTPD_WHY_TOO_LARGE && e->length >= 0)
        n = snprintf(msg, sizeof msg,
                     "request body of %" PRId64 " bytes is larger than the limit of %zu bytes",
                     e->length, e->limit);
    else
        n = snprintf(msg, sizeof msg, "%s", e->message);
    message_clean(msg, n, sizeof msg, clean, sizeof clean);
    const char *code = e->status == 431   ? "headers_too_large"
                       : e->status == 414 ? "uri_too_long"
                       : e->status == 413 ? "request_too_large"
                       : e->status == 408 ? "request_timeout"
                                          : "bad_request";
    char *body = al_xl_error_body(px_route_unknown.error_api, e->status, "invalid_request_error",
                                  code, clean);
    const char *b = body ? body : "{\"error\":{\"message\":\"error\"}}";
    size_t bl = strlen(b) < cap ? strlen(b) : cap - 1;
    memcpy(out, b, bl);
    out[bl] = '\0';
    free(body);
    return bl;
}

/* The request is over for the network: its answer written, or its agent gone (then its call
 * goes on for its span, and the request is given up). Frees c. */
static void server_request_done(al_httpd_req *r, void *ud)
{
    conn *c = ud;
    proxy *px = c->px;
    if (c->call) px->hooks.gone(c->call);
    if (!c->answered) al_httpd_req_abort(r);
    if (c->prev)
        c->prev->next = c->next;
    else
        px->conns = c->next;
    if (c->next) c->next->prev = c->prev;
    free(c);
}

/* A stream's queued bytes have all left: a paused call goes on. */
static void server_request_drained(al_httpd_req *r, void *ud)
{
    (void)r;
    conn *c = ud;
    if (c->call) c->px->hooks.written(c->call);
}

/* A complete request: its state (c, freed when the request is over), then routes.c. */
static void server_request(al_httpd_req *r, void *ud)
{
    proxy *px = ud;
    conn *c = calloc(1, sizeof *c);
    if (!c) {
        al_httpd_req_abort(r);
        return;
    }
    size_t bl;
    const char *body = al_httpd_req_body(r, &bl);
    c->px = px;
    c->r = r;
    c->head = al_httpd_req_head(r);
    c->body = (al_slice){body, bl};
    c->route = &px_route_unknown;
    c->t0_mono = al_mono_us();
    c->start_us = al_now_us();
    c->next = px->conns;
    if (px->conns) px->conns->prev = c;
    px->conns = c;
    al_httpd_req_on_done(r, server_request_done, c);
    al_httpd_req_on_drained(r, server_request_drained, c);
    px->hooks.request(c);
}

static void server_turn_end(void *ud)
{
    proxy *px = ud;
    px->hooks.turn_end(-1, 0, px);
}

int px_server_open(proxy *px, const char *host, int port, char *err, size_t errlen)
{
    const pconf *cf = &px->cfg;
    int to = cf->client_timeout_s * 1000;
    /* the request line may take the whole head: a longer one is 414, a longer head 431 */
    al_httpd_opts o = {
        .limits = {.max_line = cf->max_head, .max_head = cf->max_head,
                   .max_headers = cf->max_headers},
        .max_body = cf->max_body,
        .max_connections = cf->max_conns,
        .head_timeout_ms = to,
        .body_timeout_ms = to,
        .idle_timeout_ms = to,
        .write_timeout_ms = to,
        .error_answer = server_error_answer,
        .reason = status_text,
        .connection_last = 1,
        .chunked_http10 = 1,
        .nodelay = 1,
        .connections = px->g_conns,
        .turn_end = server_turn_end,
    };
    px->srv = al_httpd_new(px->base, &o, server_request, px);
    if (!px->srv) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    if (al_httpd_bind(px->srv, host, port, err, errlen) != 0) return -1;
    px->port = al_httpd_port(px->srv);
    return 0;
}

int px_conn_is_json(const conn *c)
{
    const al_slice *ct = al_http_header_get(c->head, "content-type");
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
    /* \u0000 is JSON: an answer's NUL token the agent sends back in its next request */
    json_t *o = json_loadb(c->body.p, c->body.n, JSON_ALLOW_NUL, &je);
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
