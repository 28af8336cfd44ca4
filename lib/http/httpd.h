/*
 * httpd.h: the HTTP/1.1 server every arclight server runs on (serve's API, the trainer's
 * checkpoint server, --metrics), on a libevent loop the caller owns. Requests are read with
 * lib/http/http1.h, so every server refuses the same things with the same answers, within the
 * same limits:
 *
 *   - a request head must arrive whole within head_timeout (a total deadline, as nginx's
 *     client_header_timeout, not re-armed by each byte): 408; a body may pause at most
 *     body_timeout between reads: 408; a kept-alive connection idle for idle_timeout is closed
 *   - 414 / 431 / 400 / 501 / 505 as http1.h says; a body over max_body: 413 (from its
 *     Content-Length, before a byte of it is read; a chunked one as it arrives)
 *   - past max_connections a new connection gets 503 and is closed
 *   - Expect: 100-continue is answered before the body is read; chunked bodies are decoded
 *   - every error the server answers itself has a JSON body (opts.error_body) with the right
 *     Content-Length, and closes the connection (the rest of the stream cannot be trusted)
 *   - a HEAD request gets the headers its GET would get, Content-Length included, and no body
 *   - pipelined requests are answered in order, one at a time
 *
 * A request is handed to the handler once its body is complete. The handler answers at once
 * or later (from the loop's thread: another thread wakes the loop first) with exactly one of
 * al_httpd_send / al_httpd_send_buffer, or al_httpd_send_start + al_httpd_send_chunk... +
 * al_httpd_send_end, or gives up with al_httpd_req_abort. The request stays valid until then,
 * also when the client goes away meanwhile (al_httpd_req_closed says so; what is sent then is
 * dropped).
 */
#ifndef ARCLIGHT_HTTP_HTTPD_H
#define ARCLIGHT_HTTP_HTTPD_H

#include "http/http1.h"

#include <stddef.h>
#include <stdint.h>

struct event_base;
struct evbuffer;

typedef struct al_httpd al_httpd;
typedef struct al_httpd_req al_httpd_req;

typedef void (*al_httpd_handler_fn)(al_httpd_req *req, void *ud);

/* Writes the JSON body of an error the server answers itself into out (at most cap bytes,
 * NUL-terminated); returns its length. message is valid UTF-8 without control bytes. */
typedef size_t (*al_httpd_error_fn)(int status, const char *message, char *out, size_t cap);

typedef struct al_httpd_opts {
    al_http_limits limits; /* zeros: http1.h's defaults (8 KiB line, 32 KiB head, 100 fields) */
    size_t max_body;       /* 0: 1 MiB */
    int max_connections;   /* 0: 1024 */
    int head_timeout_ms;   /* 0: 60 s */
    int body_timeout_ms;   /* 0: 60 s */
    int idle_timeout_ms;   /* 0: 75 s */
    int write_timeout_ms;  /* a reply that makes no progress for this long is cut (0: 60 s) */
    al_httpd_error_fn error_body; /* NULL: {"error":{"message":..,"type":..,"code":N}} */
} al_httpd_opts;

/* A server on base (borrowed; it must outlive the server). Nothing is bound yet. NULL only
 * when out of memory. */
al_httpd *al_httpd_new(struct event_base *base, const al_httpd_opts *opts,
                       al_httpd_handler_fn handler, void *ud);

/* Binds host:port (IPv4, IPv6 or a name; port 0 picks a free one) and listens. 0, or -1 with
 * errstr naming the address and the reason. */
int al_httpd_bind(al_httpd *s, const char *host, int port, char *errstr, size_t errlen);

/* The port bound, or -1. */
int al_httpd_port(const al_httpd *s);

/* Stops accepting connections (a drain): idle connections are closed now, the others after
 * the reply in progress (which says Connection: close). */
void al_httpd_drain(al_httpd *s);

/* Open connections. */
int al_httpd_connections(const al_httpd *s);

/* Closes every connection (requests still held by their owners are marked closed and stay
 * valid until the owner finishes them) and frees the server. Call it on the loop's thread,
 * or once the loop has stopped. NULL-safe. */
void al_httpd_free(al_httpd *s);

/* ---- a request ------------------------------------------------------------------------ */

const al_http_head *al_httpd_req_head(const al_httpd_req *r);
/* 1 when the method is m (exact). */
int al_httpd_req_method_is(const al_httpd_req *r, const char *m);
/* The request's path, NUL-terminated, without the query (valid as long as the request). */
const char *al_httpd_req_path(const al_httpd_req *r);
/* The body (NUL-terminated; "" when there is none) and its length. */
const char *al_httpd_req_body(const al_httpd_req *r, size_t *len);
/* 1 once the client is gone: what is sent is dropped. */
int al_httpd_req_closed(const al_httpd_req *r);
/* fn(r, ud) runs once, on the loop's thread, when the request is over for the network: its
 * reply fully handed to the kernel, or the connection gone before that. r is still valid in
 * the call. */
void al_httpd_req_on_done(al_httpd_req *r, void (*fn)(al_httpd_req *r, void *ud), void *ud);

/* ---- the reply ---------------------------------------------------------------------------- */

/* Adds a header to the reply (before it starts). Name and value are copied; CR, LF and NUL
 * in them are replaced by spaces, so that no header can be split. */
void al_httpd_add_header(al_httpd_req *r, const char *name, const char *value);

/* The whole reply: status, Content-Type (NULL: none), body of len bytes (copied; no body
 * sent for HEAD, its Content-Length is). Ends the owner's hold on r. */
void al_httpd_send(al_httpd_req *r, int status, const char *ctype, const void *body, size_t len);

/* The same with the body in an evbuffer (its contents are moved out, file segments added with
 * evbuffer_add_file included; the caller frees the emptied buffer). */
void al_httpd_send_buffer(al_httpd_req *r, int status, const char *ctype, struct evbuffer *body);

/* A reply whose body comes in pieces: chunked for HTTP/1.1, up to the connection's close for
 * HTTP/1.0. Then any number of al_httpd_send_chunk, then al_httpd_send_end (which ends the
 * owner's hold on r). */
void al_httpd_send_start(al_httpd_req *r, int status, const char *ctype);
void al_httpd_send_chunk(al_httpd_req *r, const void *data, size_t len);
void al_httpd_send_end(al_httpd_req *r);

/* Gives up on r without a reply (or cuts a started one short): the connection is closed. Ends
 * the owner's hold on r. */
void al_httpd_req_abort(al_httpd_req *r);

/* ---- helpers for error bodies --------------------------------------------------------- */

/* The longest prefix of s[0..n) of at most max bytes that does not end inside a UTF-8
 * sequence (a message cut to fit a buffer stays valid UTF-8 where it was). */
size_t al_utf8_cut(const char *s, size_t n, size_t max);

/* 1 when s[0..n) is valid UTF-8 (no overlongs, surrogates or code points past U+10FFFF). */
int al_utf8_valid(const char *s, size_t n);

/* Copies s[0..n) into out (cap bytes, always NUL-terminated) as valid UTF-8: bytes that are
 * not UTF-8 become U+FFFD; cut at a character boundary when out is too small. Returns the
 * length written. */
size_t al_utf8_clean(const char *s, size_t n, char *out, size_t cap);

/* Writes s[0..n) as the inside of a JSON string into out (cap bytes, always NUL-terminated):
 * quotes, backslashes and control bytes escaped, bytes that are not valid UTF-8 as U+FFFD; cut
 * at a character boundary when out is too small. Returns the length written. */
size_t al_json_escape(const char *s, size_t n, char *out, size_t cap);

/* The reason phrase of a status ("Not Found"), "Unknown" for others. */
const char *al_http_reason(int status);

#endif
