/*
 * httpd.h: the HTTP/1.1 server every arclight server runs on (the capture proxy, serve's API,
 * the trainer's checkpoint server, --metrics), on a libevent loop the caller owns. Requests
 * are read with lib/http/http1.h, so every server refuses the same things with the same
 * answers, within the same limits:
 *
 *   - a request head must arrive whole within head_timeout (a total deadline, as nginx's
 *     client_header_timeout, not re-armed by each byte): 408; a body may pause at most
 *     body_timeout between reads: 408; a kept-alive connection idle for idle_timeout is closed;
 *     an answer that makes no progress for write_timeout is cut
 *   - 414 / 431 / 400 / 501 / 505 as http1.h says; a body over max_body: 413 (from its
 *     Content-Length, before a byte of it is read; a chunked one as it arrives)
 *   - past max_connections a new connection gets 503 and is closed
 *   - Expect: 100-continue is answered before the body is read; chunked bodies are decoded
 *   - every error the server answers itself has a JSON body (opts.error_body) with the right
 *     Content-Length, and closes the connection (the rest of the stream cannot be trusted)
 *   - a HEAD request gets the headers its GET would get, Content-Length included, and no body
 *   - pipelined requests are answered in order, one at a time
 *
 * Answers leave at the end of the loop turn that made them, one writev per connection, after
 * opts.turn_end has run (the proxy puts that turn's spans on disk there: an answer never
 * leaves before its span). The sockets are read and written directly rather than through
 * bufferevents: the read event stays registered for a connection's life (a hang-up is seen
 * also while a request is with its handler), and only an answer the socket cannot take at
 * once waits for EPOLLOUT.
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
#include "http/metrics.h"

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

/* Why the server answers an error itself. */
typedef enum al_httpd_why {
    AL_HTTPD_WHY_MALFORMED,  /* the head or a chunk broke http1.h's rules (4xx/5xx as it says) */
    AL_HTTPD_WHY_TOO_LARGE,  /* 413: the body is over max_body */
    AL_HTTPD_WHY_TIMEOUT,    /* 408: the head or the body did not arrive in time */
    AL_HTTPD_WHY_OVERLOADED, /* 503: a connection past max_connections */
} al_httpd_why;

/* An error the server answers itself, for opts.error_answer. */
typedef struct al_httpd_error {
    int status;
    al_httpd_why why;
    const char *message;   /* the server's own wording (valid UTF-8 or the parser's text) */
    int64_t length;        /* TOO_LARGE from a Content-Length: its value; otherwise -1 */
    size_t limit;          /* TOO_LARGE: max_body */
    const al_http_head *head; /* TOO_LARGE from a Content-Length: the head; otherwise NULL */
} al_httpd_error;

/* The whole JSON body of an error the server answers itself into out (cap bytes); returns
 * its length. Called once per such error (also for the 503 past max_connections), so that
 * the owner may count it. ud: the server's. */
typedef size_t (*al_httpd_error_answer_fn)(void *ud, const al_httpd_error *e, char *out,
                                           size_t cap);

typedef struct al_httpd_opts {
    al_http_limits limits; /* zeros: http1.h's defaults (8 KiB line, 32 KiB head, 100 fields) */
    size_t max_body;       /* 0: 1 MiB */
    int max_connections;   /* 0: 1024 */
    int head_timeout_ms;   /* 0: 60 s */
    int body_timeout_ms;   /* 0: 60 s */
    int idle_timeout_ms;   /* 0: 75 s */
    int write_timeout_ms;  /* a reply that makes no progress for this long is cut (0: 60 s) */
    al_httpd_error_fn error_body; /* NULL: {"error":{"message":..,"type":..,"code":N}} */
    al_httpd_error_answer_fn error_answer; /* set: used instead of error_body */
    const char *(*reason)(int status);     /* the status line's phrase (NULL: al_http_reason) */
    int connection_last; /* the owner's headers before Connection, which is written only to
                            close (no "Connection: keep-alive" for HTTP/1.0) */
    int chunked_http10;  /* a body in pieces is chunked for HTTP/1.0 clients too, not
                            delimited by the connection's close */
    int nodelay;         /* TCP_NODELAY on accepted sockets */
    al_gauge *connections;    /* set to the number of open connections as it changes */
    void (*turn_end)(void *ud); /* runs before a loop turn's answers leave (ud: the server's) */
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

/* Stops accepting connections; every reply from now on says Connection: close and closes
 * its connection once written. Idle connections stay until their next request is answered
 * or their idle timeout (al_httpd_drain closes them at once). */
void al_httpd_listen_stop(al_httpd *s);

/* Open connections. */
int al_httpd_connections(const al_httpd *s);

/* Connections with a request in progress (with its handler, or its reply not yet written
 * out). */
int al_httpd_busy(const al_httpd *s);

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
 * the call, and an owner that will not finish r (its connection gone) may end its hold there
 * with al_httpd_req_abort. */
void al_httpd_req_on_done(al_httpd_req *r, void (*fn)(al_httpd_req *r, void *ud), void *ud);

/* Bytes of r's reply handed over but not yet written to the socket (0 once r is closed). */
size_t al_httpd_req_pending(const al_httpd_req *r);
/* fn(r, ud) runs, on the loop's thread, each time the bytes of r's reply in pieces (after
 * al_httpd_send_start) have all been written, until its owner ends it: a producer that
 * paused at a bound of al_httpd_req_pending goes on there. */
void al_httpd_req_on_drained(al_httpd_req *r, void (*fn)(al_httpd_req *r, void *ud), void *ud);
/* The connection closes once r's reply is written (a stream cut short: the client must not
 * take it for a whole one). */
void al_httpd_req_close_after(al_httpd_req *r);

/* ---- the reply ---------------------------------------------------------------------------- */

/* Adds a header to the reply (before it starts). Name and value are copied; CR, LF and NUL
 * in them are replaced by spaces, so that no header can be split. */
void al_httpd_add_header(al_httpd_req *r, const char *name, const char *value);

/* Adds header lines as they are (each "Name: value" with its CRLF) to the reply (before it
 * starts): for a caller whose values are already checked (ids of a fixed alphabet, numbers),
 * which writes them without a copy per header. */
void al_httpd_add_header_lines(al_httpd_req *r, const char *lines);

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
