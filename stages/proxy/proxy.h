/*
 * proxy.h: what the capture proxy's files share (issue 3; split by subsystem in issue 14).
 * Not a library: the px_ names are the proxy's own, for its files only.
 *
 * One thread runs one libevent loop. The files in layers, each calling only the ones below
 * it (a lower one hands errors and answers up as values; the agent's bytes of a stream go
 * through the call's emit hook):
 *   server.c      the proxy on lib/http/httpd (the one HTTP/1.1 server: agents' sockets,
 *                 requests read and refused as every arclight server reads them, answers
 *                 written at the end of the loop turn) with the proxy's options; the answers
 *                 the layers below write (px_conn_reply...). It names no file above it: it
 *                 calls routes.c, call.c and spans.c through px->hooks
 *   routes.c      the routes, a table (px_route: method, paths, API, capture and native
 *                 flags, handler) looked up once per request, and the control endpoints
 *                 (probes, metrics, reward, end, sessions)
 *   call.c        a call's lifecycle over both upstream clients (upstream.c, libcurl); it
 *                 answers the agent with what the files below make
 *   capture.c     what capture does to a call: the request rewrite (fast and tree paths),
 *                 the answer's capture and its stripping for the agent, SSE streams, the span
 *   apis.c        the Responses and Messages APIs on a call: their translation's glue, the
 *                 store behind previous_response_id, Anthropic's model list
 *   native.c      the same APIs passed through to an upstream that serves them itself
 *                 (--upstream-native): capture's additions, their removal, the capture
 *   identity.c    rollouts, sessions and a request's identity (its errors handed up), and the
 *                 state file that keeps sequence numbers and session keys across restarts
 *   spans.c       a span's trace context, encoding and spooling; the turn's flush to disk
 *   lib/api/      the translators themselves (pure code over jansson trees, shared with
 *                 serve's native routes: api/translate.h)
 *   main.c        flags, wiring, metrics and the drain, on the process skeleton
 *                 (lib/http/process.h: signals, --metrics, the drain deadline)
 *   spool.c       the on-disk spool and its publisher thread (spool.h)
 *   json_edit.c   byte-preserving JSON reading and editing over slices (json_edit.h)
 */
#ifndef ARCLIGHT_PROXY_PROXY_H
#define ARCLIGHT_PROXY_PROXY_H

#include "json_edit.h"
#include "spool.h"
#include "api/translate.h"
#include "upstream.h"
#include "fleet.h"

#include "avro/codec.h"
#include "core/map.h"
#include "core/util.h"
#include "core/vec.h"
#include "http/httpd.h"
#include "http/metrics.h"
#include "http/process.h"

#include <curl/curl.h>
#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/util.h>
#include <jansson.h>
#include <pthread.h>
#include <stdint.h>

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
    int curl_only;               /* --upstream-client curl: no own client even for plain http:// */
    int session_ttl_s;        /* a session key lives this long (--session-ttl) */
    int max_sessions_per_key; /* sessions one agent key may hold (--max-sessions-per-key) */
    size_t response_store_bytes; /* --response-store-mib; 0: previous_response_id refused */
    unsigned native; /* --upstream-native: bit 1 << al_api for each route served natively */
    px_fleet_conf fleet; /* versions, staleness, health (fleet.h) */
} pconf;

typedef struct conn conn;
typedef struct ident ident;

/* An error for the agent that a lower layer (identity.c, apis.c, native.c) hands up instead
 * of answering itself: the caller answers it (px_conn_error). message: a static string or
 * one the error's owner keeps. */
typedef struct px_err {
    int status;
    const char *type, *code, *message;
} px_err;

/* What the proxy does with a request of a route (routes.c): answers it there (probes,
 * metrics, rewards, ends, sessions) or starts a call (call.c). */
typedef void (*px_route_fn)(conn *c, ident *id);

/* A route: one row of routes.c's table, found once per request (px_route_find) and read
 * wherever a request, or the call it starts, acts by its route. */
typedef struct px_route {
    const char *name;     /* the metrics label (route="chat_completions") and access logs */
    const char *method;   /* "POST", or "GET" (HEAD answered as GET) */
    const char *paths[5]; /* after any identity prefix; NULL-terminated */
    int prefixed;         /* also under /r/{task}/{rollout}/ and /e/... */
    int open;             /* answered without --agent-key's check (probes, metrics) */
    int quiet;            /* a 200 writes no access-log line (probes, metrics) */
    int identity;         /* whose request: the identity is resolved (calls, rewards, ends) */
    int tracked;          /* needs a rollout (rewards, ends: not an untracked one) */
    al_api api;           /* the agent's API */
    al_api error_api;     /* the shape of the errors the proxy answers on this route */
    int chat;             /* the exchange is chat-shaped (messages in, a message out) */
    int capture;          /* a captured call: a span */
    int native;           /* passed through with --upstream-native when it covers api */
    int count;            /* count_tokens: the translated call answers {"input_tokens": N} */
    int models;           /* the models list (Anthropic's shape with anthropic-version) */
    const char *upstream;        /* the upstream path of the call (translated or forwarded) */
    const char *upstream_native; /* the same when passed through */
    const char *upstream_method; /* "POST" or "GET" (no body) */
    px_route_fn handler;
} px_route;

/* The route of a request for path (after any identity prefix; prefixed: there was one), or
 * px_route_unknown. */
const px_route *px_route_find(al_slice path, int prefixed);
extern const px_route px_route_unknown; /* an unknown route, or a request refused before one */

/* A rollout's entry, the value of px->rtab under its key. */
typedef struct rollout_ent {
    const char *key; /* task \x1f rollout \x1f attempt: its map entry's copy */
    int64_t next_seq, last_call_seq, last_used_mono;
    int dirty; /* its sequence numbers changed since the state file last had them */
    int eval;  /* a held-out evaluation rollout: every span of it carries eval */
    size_t line_len; /* of its latest line in the state file (0: none yet) */
} rollout_ent;

/* A session, the value of px->sessions under its key. */
typedef struct session_ent {
    char key[80];
    char *task, *rollout;
    int attempt;
    int64_t created_us; /* wall clock; the session expires --session-ttl after it */
    int owner;          /* the --agent-key that made it (index), or -1 */
    size_t line_len;    /* of its line in the state file */
} session_ent;

typedef struct status_series {
    const px_route *route;
    int status;
    al_counter *c;
} status_series;

typedef struct call call;
typedef struct px_store px_store; /* apis.c: responses kept for previous_response_id */

/* What server.c calls when the network acts (main.c sets them, so that server.c names no
 * file above it). */
typedef struct px_conn_hooks {
    event_callback_fn turn_end; /* before the turn's answers leave (spans.c: its spans to disk) */
    void (*request)(conn *c);   /* a complete request (routes.c: px_dispatch) */
    void (*gone)(call *k);      /* its agent's connection went away (call.c: px_call_detach) */
    int (*written)(call *k);    /* a stream's queued bytes left; 1 when it had been paused and
                                   goes on (call.c: px_call_resume) */
} px_conn_hooks;

typedef struct proxy {
    pconf cfg;
    px_conn_hooks hooks;
    struct event_base *base;
    al_httpd *srv; /* the agents' HTTP server (server.c) */
    CURLM *multi;
    struct event *curl_timer, *drain_timer, *sweep_timer;
    al_process proc; /* signals, --metrics, the drain deadline (lib/http/process.h) */
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
    al_map rtab;     /* "task\x1frollout\x1fattempt" -> rollout_ent (identity.c) */
    al_map sessions; /* session key -> session_ent (identity.c) */
    conn *conns; /* requests in progress (server.c) */
    call *calls; /* every call in flight, attached to a connection or not */
    int inflight;
    int draining;
    uint64_t rng;
    al_buf enc;
    al_buf strip; /* the agent's copy of an answer (px_strip_for_agent), used at once: shared */
    CURL *easy_pool[256];             /* finished handles, reset and reused (saves their setup) */
    al_upc_pool *upc;                 /* own keep-alive client for plain http:// upstreams */
    px_store *store;                  /* NULL: --response-store-mib 0 */
    char up_public[16][512];          /* each upstream's URL without credentials (px_url_public) */
    struct event *flush_ev;           /* the spool's write of this loop turn's spans */
    /* the state file: sequence numbers and session keys that outlive a restart */
    char state_path[4200];
    int state_fd;
    uint64_t state_bytes;
    uint64_t state_live; /* bytes a rewrite would write now; compacted at about twice this */
    int state_warned;
    int session_count[17]; /* live sessions per owner (agent key index + 1; 0: no key) */
    al_buf state_pend;
    AL_VEC(rollout_ent *) dirty; /* rollouts whose numbers the state file lacks */
    size_t spool_pending; /* spans appended since the last flush */
    size_t n_easy_pool;
    int port;
    struct px_fleet *fleet; /* fleet.c */
} proxy;

/* ------------------------------------------------------------------------------------------
 * An agent's request (server.c)
 * ------------------------------------------------------------------------------------------ */

/* An agent's request on its connection, from its arrival until it is over for the network
 * (its answer written, or the agent gone): then server.c frees it, and a call still
 * attached (call) is detached first and goes on for its span. */
struct conn {
    proxy *px;
    al_httpd_req *r;
    const al_http_head *head; /* the request's (lib/http's copy) */
    al_slice body;
    const px_route *route;
    int64_t t0_mono, start_us;
    call *call;
    int answered; /* its answer was handed to the server (whole, or a stream's end) */
    conn *prev, *next;
};

/* Who a request belongs to (identity.c). */
struct ident {
    char task[130], rollout[140];
    int attempt;
    int untracked;
    int from_session;
    int eval;                /* /e/ prefix or X-Arclight-Eval: a held-out evaluation call */
    double eval_temperature; /* the sampling temperature of an eval call (0: greedy) */
};

/* ------------------------------------------------------------------------------------------
 * A call in flight (call.c), with what capture gathers from it (capture.c)
 * ------------------------------------------------------------------------------------------ */

typedef AL_VEC(int32_t) ivec;
typedef AL_VEC(float) fvec;

struct call {
    proxy *px;
    conn *c;
    CURL *easy;
    al_upc *uc; /* the exchange on the own client, instead of easy */
    struct curl_slist *hdrs;
    const px_route *route;
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
    /* a translated call (apis.c): the agent's API, its translator, the events for the
     * agent, and the answer the agent got (for the span) */
    al_api api;
    al_xl *xl;
    al_buf xout;
    char *agent_answer;
    /* a passed-through call (native.c): the agent's API served by the upstream itself, and
     * whether the agent asked for input/output_messages and output_text logprobs itself */
    int native, nat_msgs, nat_lps;
    json_t *nat_msg; /* messages streamed: the message as the agent has it so far */
    /* where capture.c and apis.c send a stream's bytes for the agent (call.c: to the agent's
     * connection); called only while one is attached (c) */
    void (*emit)(call *k, const char *data, size_t len);
    call *cprev, *cnext;
};

/* ------------------------------------------------------------------------------------------
 * server.c: the proxy on lib/http/httpd; its answers
 * ------------------------------------------------------------------------------------------ */

/* Makes px->srv with the proxy's options and listens on host:port (px->port gets the port
 * bound). 0, or -1 with err saying why. */
int px_server_open(proxy *px, const char *host, int port, char *err, size_t errlen);
/* Queues a whole answer (head + body; no body for HEAD); the connection goes back to
 * reading when it is written (keep-alive) or closes. extra: header lines, each with CRLF. */
void px_conn_reply(conn *c, int status, const char *ctype, const char *extra, const char *body,
                   size_t len);
/* An OpenAI-style error answer: {"error":{"message","type","param","code"}} (Anthropic's
 * {"type":"error","error":{"type","message"}} on the Messages route). */
void px_conn_error(conn *c, int status, const char *type, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
/* A JSON error answer (body) whose access-log line says why. */
void px_conn_reply_error(conn *c, int status, const char *body, const char *why);
/* A chunked answer: its head, its chunks, its end. */
void px_conn_stream_begin(conn *c, int status, const char *ctype, const char *extra);
void px_conn_stream_write(conn *c, const char *data, size_t len);
void px_conn_stream_end(conn *c);
/* Bytes of c's answer not yet written to the agent's socket (back-pressure). */
size_t px_conn_pending(const conn *c);
/* The connection closes once the answer is written (a stream cut short). */
void px_conn_close_after(conn *c);
/* Whether the request says Content-Type: application/json. */
int px_conn_is_json(const conn *c);
/* The body as a JSON object (an empty body is {} unless required); NULL after answering
 * 415 or 400. The caller owns the result. */
json_t *px_conn_body_json(conn *c, int required);

/* ------------------------------------------------------------------------------------------
 * identity.c: rollouts, sessions, identity, the state file
 * ------------------------------------------------------------------------------------------ */

void px_rand_hex(proxy *px, char *out, size_t nhex); /* nhex random hex digits and a NUL */
int px_id_valid(const char *p, size_t n);            /* 1..128 of [A-Za-z0-9._:@-] */
/* The rollout's entry, made on first use; NULL when out of memory. */
rollout_ent *px_rollout_get(proxy *px, const char *task, const char *rollout, int attempt);
/* The same for a request's identity, with the rollout's eval mark (see identity.c). */
rollout_ent *px_rollout_of(proxy *px, ident *id);
session_ent *px_session_find(proxy *px, const char *key, size_t n);
/* A new session key made by agent key `owner` (-1: none); NULL when out of memory or
 * randomness. Callers check px_session_room first. */
session_ent *px_session_new(proxy *px, const char *task, const char *rollout, int attempt,
                            int owner);
/* 1 when owner may open another session (fewer than --max-sessions-per-key live). */
int px_session_room(const proxy *px, int owner);
/* Forgets sessions past --session-ttl (the sweep, every 5 minutes; lookups check too). */
void px_session_expire(proxy *px);
/* Masks each occurrence of the upstream key in p[0..n) with '*' (the same length: lengths and
 * JSON stay as they were), so that an upstream echoing it ("bad key Bearer sk-...") puts it
 * in no answer, span or log line. Keys shorter than 8 bytes are not looked for. */
void px_redact(const proxy *px, char *p, size_t n);
/* 1 when p[0..n) is not valid UTF-8 (lib/http's idea of it: no overlongs, surrogates or
 * code points past U+10FFFF). */
int px_utf8_invalid(const char *p, size_t n);
/* The index of the --agent-key the request carries, -1 for none or another token. */
int px_agent_key_index(const proxy *px, const al_http_head *head);
/* An eval temperature (/e:T/, X-Arclight-Eval-Temperature): a plain decimal from 0 to 2.
 * 0 with *t, or -1. */
int px_parse_temperature(const char *p, size_t n, double *t);
/* The request's API key, if any (1 with *tok): its Bearer token, else its x-api-key. */
int px_api_key(const al_http_head *head, al_slice *tok);
/* The request's identity: the URL prefix (already in id when have_prefix), else headers,
 * else a session key, else a fresh untracked rollout; X-Arclight-Attempt, X-Arclight-Eval
 * and X-Arclight-Eval-Temperature on any route. 0, or -1 with the 400 to answer in *err. */
int px_resolve_identity(proxy *px, const al_http_head *head, ident *id, int have_prefix,
                        px_err *err);
/* With --agent-key, whether the request carries one of the keys or a session key (Bearer
 * or x-api-key). */
int px_authorized(proxy *px, const al_http_head *head);
void px_state_load(proxy *px);    /* reads the state file an earlier run left */
void px_state_compact(proxy *px); /* rewrites it from memory and opens it for appending */
void px_state_flush(proxy *px);   /* appends this turn's changes */
void px_sweep_cb(evutil_socket_t fd, short what, void *arg); /* forgets idle rollouts */
void px_identity_free(proxy *px);

/* ------------------------------------------------------------------------------------------
 * spans.c: spans to the spool
 * ------------------------------------------------------------------------------------------ */

/* A span of id's rollout at sequence seq, trace context from the request's traceparent
 * (head may be NULL); trace, span_id and parent are the caller's buffers (33, 17, 17 bytes). */
void px_span_init(proxy *px, al_span *s, const ident *id, int64_t seq, const al_http_head *head,
                  char *trace, char *span_id, char *parent);
/* Encodes and appends s to the spool; on disk at the end of this turn. 0, or -1 (logged
 * and counted). */
int px_span_publish(proxy *px, const al_span *s);
void px_spool_flush(proxy *px);                                    /* this turn's spans */
void px_spool_flush_cb(evutil_socket_t fd, short what, void *arg); /* spans, then state */

/* ------------------------------------------------------------------------------------------
 * capture.c: request rewrite, answer capture, SSE, the call's span
 * ------------------------------------------------------------------------------------------ */

/* The rewritten request without a tree (malloc'd, its length in *outlen), or NULL when the
 * request needs px_rewrite_request. Both record in k what the agent itself asked for. */
char *px_rewrite_fast(call *k, const char *in, size_t n, size_t *outlen);
char *px_rewrite_request(call *k, json_t *req);
/* What the strip pass over a whole answer found for capture (slices into the answer): the
 * top-level prompt_token_ids, usage and choices, and the first choice. */
typedef struct px_answer_parts {
    al_slice top[3];
    al_slice c0;
} px_answer_parts;
/* Reads token ids, logprobs, finish reason and usage off a whole answer. parts: what
 * px_strip_for_agent found in the same text, which it validated as JSON (values are then
 * delimited without being checked again); NULL: the text is read and checked here. */
void px_capture_fast(call *k, const char *body, size_t n, const px_answer_parts *parts);
/* The agent's copy of an answer (chunk: a stream chunk) in px->strip; its length, or -1
 * when in is not one JSON object. parts (NULL: not wanted): what capture reads, found in
 * the same pass. */
long px_strip_for_agent(call *k, const char *in, size_t len, int chunk, px_answer_parts *parts);
/* Handles the complete SSE events waiting in k->body (final: all of it). */
void px_stream_process(call *k, int final);
/* Builds the span of a finished call and spools it. */
void px_call_span(call *k);

/* ------------------------------------------------------------------------------------------
 * call.c: a call's lifecycle over both upstream clients
 * ------------------------------------------------------------------------------------------ */

int px_calls_init(proxy *px);
/* Starts the captured (or forwarded) call of c's request (c->route says which); answers c
 * itself on failure. A route's handler. */
void px_start_llm_call(conn *c, ident *id);
/* A transfer ended: failover, or the answer, the access log, the span; frees k. */
void px_call_done(call *k, CURLcode rc);
void px_call_detach(call *k); /* the agent went away; the call goes on for its span */
int px_call_resume(call *k);  /* a paused stream goes on; 1 when it was paused */
void px_url_public(const char *url, char *out, size_t n); /* url less user:password@ */

/* ------------------------------------------------------------------------------------------
 * apis.c: the Responses and Messages APIs by translation, the response store
 * ------------------------------------------------------------------------------------------ */

px_store *px_store_new(size_t max_bytes);
void px_store_free(px_store *s);
/* The translated request body (JSON) to send upstream (*up, malloc'd, and its length): 0;
 * -1, a request the API refuses (*err: what to answer, in the API's shape); -2, out of
 * memory. k->api says which API. */
int px_xl_prepare(call *k, al_slice body, char **up, size_t *up_len, al_xl_err *err);
/* The whole upstream answer in k->body translated, or the upstream's error in the agent's
 * API's shape: *agent, what the agent gets (k->agent_answer, or a literal). Returns the
 * status to answer with. */
int px_xl_answer(call *k, const char **agent);
/* A stream: one upstream chunk; the end (error NULL: the upstream finished it). The agent's
 * events go out through k->emit. */
void px_xl_chunk(call *k, json_t *chunk);
void px_xl_stream_end(call *k, const char *error);
/* count_tokens: the request for the upstream's POST /tokenize (vLLM's and arclight serve's:
 * chat messages and tools in, "count" out), and the answer {"input_tokens": N} (*agent,
 * malloc'd; NULL when out of memory). As above. */
int px_xl_prepare_count(call *k, al_slice body, char **up, size_t *up_len, al_xl_err *err);
int px_xl_count_answer(call *k, char **agent);
/* An upstream's models list in Anthropic's shape (malloc'd), or NULL when it is not one. */
char *px_models_anthropic(const char *body, size_t n);

/* ------------------------------------------------------------------------------------------
 * native.c: the Responses and Messages APIs passed through (--upstream-native)
 * ------------------------------------------------------------------------------------------ */

/* The agent's request (req, a JSON object, borrowed and edited) with capture's additions,
 * as text (malloc'd), or NULL when out of memory. */
char *px_native_request(call *k, json_t *req);
/* Captures a whole 2xx answer in k->body; *agent is what the agent gets (the answer less what
 * the proxy asked for: k->agent_answer, or k->body itself). Returns the status. */
int px_native_answer(call *k, al_slice *agent);
/* One complete SSE event (evlen bytes, then its sep-byte separator), captured. The agent's
 * copy: 0, the event as it came (evlen + sep bytes); 1, a rewrite less what the proxy asked
 * for in *out (malloc'd, *outlen bytes; the caller frees it); -1, none (out of memory). */
int px_native_event(call *k, const char *ev, size_t evlen, size_t sep, char **out,
                    size_t *outlen);
/* At the span: a 2xx answer without token ids is logged, with what to check. */
void px_native_check(call *k);

/* ------------------------------------------------------------------------------------------
 * routes.c
 * ------------------------------------------------------------------------------------------ */

/* Routes one complete request of c. */
void px_dispatch(conn *c);

#endif
