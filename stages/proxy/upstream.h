/*
 * upstream.h: the proxy's own keep-alive HTTP/1.1 client for plain http:// upstreams at a
 * literal address (IPv4, [IPv6] or localhost), on the proxy's event loop.
 *
 * Why not curl for these: per call, curl's multi-socket interface removed and re-added the
 * pooled socket in epoll, polled it twice and set the transfer up again; here a reused
 * connection costs one sendmsg and one read per call and stays registered for reading while
 * idle (which is also how a close by the upstream is noticed). https, user:password@ URLs
 * and host names (their DNS lookup would block the loop) still go through curl.
 *
 * One exchange at a time per connection (no pipelining). A request that finds its reused
 * connection closed by the upstream before any byte of the answer is sent again once on a
 * fresh connection, as curl does. Everything here runs on the loop thread.
 */
#ifndef ARCLIGHT_PROXY_UPSTREAM_H
#define ARCLIGHT_PROXY_UPSTREAM_H

#include <event2/event.h>
#include <stddef.h>
#include <stdint.h>

typedef struct al_upc_pool al_upc_pool;
typedef struct al_upc al_upc; /* one connection, carrying at most one exchange */

typedef enum al_upc_err {
    AL_UPC_OK = 0,
    AL_UPC_CONNECT,  /* could not connect */
    AL_UPC_NOTHING,  /* the connection closed before any byte of an answer */
    AL_UPC_SEND,     /* the request could not be sent */
    AL_UPC_RECV,     /* read error, or closed inside the head */
    AL_UPC_PARTIAL,  /* closed before the body's announced end */
    AL_UPC_TIMEOUT,  /* connect or whole-exchange timeout */
    AL_UPC_PROTOCOL, /* not an HTTP/1.x answer, or a head over 64 KiB */
    AL_UPC_ABORTED,  /* on_body refused the bytes */
} al_upc_err;

#define AL_UPC_PAUSE ((size_t)-1)

typedef struct al_upc_handler {
    /* The final head (1xx heads are skipped): status, Content-Type ("" if none), the
     * x-arclight-policy-version header (-1 if none). */
    void (*on_head)(void *ud, int status, const char *ctype, int64_t policy_version);
    /* Body bytes (chunked framing removed). Returns n when taken, AL_UPC_PAUSE to take
     * nothing now (the same bytes come again after al_upc_resume), anything else to abort
     * the exchange (AL_UPC_ABORTED). */
    size_t (*on_body)(void *ud, const char *p, size_t n);
    /* Called once when the exchange ends, unless it was cancelled; the al_upc handle is no
     * longer the caller's from then on. msg is a readable reason ("" on success). */
    void (*on_done)(void *ud, al_upc_err err, const char *msg);
} al_upc_handler;

/* A pool on base for the calls' handler. NULL when out of memory. */
al_upc_pool *al_upc_pool_new(struct event_base *base, const al_upc_handler *h);

/* Registers upstream base URL url under index idx (0..15). 1 when this client serves it,
 * 0 when it must go through curl (https, credentials in the URL, a host name), -1 on a URL
 * this client cannot make sense of (it then goes through curl too). */
int al_upc_pool_add(al_upc_pool *p, int idx, const char *url);

/* Whether upstream idx is served here. */
int al_upc_pool_serves(const al_upc_pool *p, int idx);

/* Starts method path (appended to the upstream's own path prefix) on an idle connection to
 * upstream idx or a new one. headers: complete "Name: value\r\n" lines (Host, Content-Length
 * and Connection are added here). body/body_len stay the caller's and must live until
 * on_done or al_upc_cancel. Timeouts in ms (<= 0: none). Returns the handle, or NULL with
 * errno set (no socket); on_done is never called for a NULL start. */
al_upc *al_upc_start(al_upc_pool *p, int idx, const char *method, const char *path,
                     const char *headers, const char *body, size_t body_len,
                     long connect_timeout_ms, long total_timeout_ms, void *ud);

/* Lets a paused exchange go on (from the next loop turn). */
void al_upc_resume(al_upc *u);

/* Ends an exchange without calling on_done; the connection is closed. NULL-safe. */
void al_upc_cancel(al_upc *u);

/* Closes every connection (exchanges still running are cancelled) and frees the pool. */
void al_upc_pool_free(al_upc_pool *p);

#endif
