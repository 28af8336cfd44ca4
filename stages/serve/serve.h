/*
 * serve.h: what the files of `arclight serve` share (main.c, reply.c, responses.c, lifecycle.c,
 * routes.c, auth.c): the server's context, one HTTP call of a generation request, and each
 * file's entry points. Internal to stages/serve.
 *
 * Threads: everything here runs on the event loop's thread, except where a comment says
 * "under r->lock" (the engine's request, shared with the engine thread).
 */
#ifndef ARCLIGHT_SERVE_SERVE_H
#define ARCLIGHT_SERVE_SERVE_H

#include "api/translate.h"
#include "http/httpd.h"
#include "http/metrics.h"
#include "engine.h"
#include "policy.h"
#include "request.h"

#include <event2/event.h>
#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#define COMP "serve"
#define MAX_N AL_SERVE_MAX_N

typedef struct serve_ctx serve_ctx;
typedef struct serve_wapi serve_wapi;

/* One generation request in flight: its HTTP request, its engine request (a reference), what
 * the client asked for and what the stream has sent so far. Made by serve_call_generate,
 * linked in serve_ctx.calls, freed by serve_call_free. */
typedef struct http_call {
    serve_ctx *sc;
    al_httpd_req *req;
    al_serve_req *r;
    struct event *ev;
    struct http_call *prev, *next; /* live calls, for shutdown */
    int chat, stream, include_usage, logprobs, top_logprobs, return_token_ids;
    int parse_tools, parse_reasoning;
    char id[48];
    int64_t created;
    int64_t t0_us;  /* al_mono_us() when the request came in */
    int first_seen; /* time to first token observed */
    /* streaming */
    int started;
    int *sent_tok;
    size_t *sent_text;
    int *finished_sent;
    al_chat_stream *cs;
    /* POST /v1/responses: the translator between the agent's API and the chat path, and
     * whether the agent asked for vLLM's input_messages / output_messages */
    al_xl *xl;
    int response_messages;
} http_call;

/* The server: one per process (cmd_serve's), shared by the loop's callbacks. */
struct serve_ctx {
    struct event_base *base;
    al_httpd *http;
    al_serve_engine *eng;
    al_tokenizer *tok;
    al_model_config cfg;
    const char *name;
    int max_model_len;
    http_call *calls;
    al_metrics *metrics;
    struct al_serve_policy *policy; /* NULL when not following */
    int draining;           /* a first SIGTERM/SIGINT came: finish what is in flight */
    double drain_timeout_s; /* then stop anyway */
    struct event *drain_timer;
    int open_replies; /* generation requests whose reply is not fully written yet */
    char *api_key;    /* --api-key & co.: /v1/, /tokenize and /detokenize need it; NULL: open */
    serve_wapi *wapi; /* --weight-routes: SGLang's and vLLM's weight routes; NULL: off */
    al_counter *req_ok, *req_4xx, *req_429, *req_5xx, *gen_tokens, *prompt_tokens;
    al_gauge *g_running, *g_version, *g_kv;
    al_histogram *h_request, *h_ttft;
};

/* ---- reply.c: JSON helpers and replies ---- */

/* A JSON string of arbitrary bytes (new reference). */
json_t *serve_json_bytes(const char *s, size_t n);
/* A JSON array of token ids (new reference). */
json_t *serve_json_ids(const int32_t *ids, int n);
/* x-arclight-policy-version, when version >= 0. */
void serve_reply_version_header(al_httpd_req *req, int64_t version);
/* Counts a reply's status in arclight_serve_requests_total. */
void serve_reply_count(serve_ctx *sc, int code);
/* Sends body (takes the reference; NULL: {}) as the whole reply. */
void serve_reply_json(serve_ctx *sc, al_httpd_req *req, int code, json_t *body, int64_t version);
/* Sends an OpenAI-style error. */
void serve_reply_error(serve_ctx *sc, al_httpd_req *req, int code, const char *param,
                       const char *fmt, ...) __attribute__((format(printf, 5, 6)));
/* httpd's error_body hook: the errors the HTTP layer answers itself, in the same shape. */
size_t serve_reply_http_error_body(int status, const char *message, char *out, size_t cap);

/* ---- responses.c: the OpenAI answers (all under r->lock; json_t results are new references) ---- */

/* The usage object of r. */
json_t *serve_response_usage(const al_serve_req *r);
/* The whole (non-streaming) chat.completion or text_completion. */
json_t *serve_response_full(http_call *c);
/* vLLM's "input_messages" / "output_messages" for a Response; NULL when the prompt cannot
 * be decoded. */
json_t *serve_response_messages(http_call *c);
/* A chunk object around choices (takes the reference to choices). */
json_t *serve_response_chunk(http_call *c, json_t *choices);
/* Sends one chunk, or on /v1/responses the events it becomes (takes the reference to o). */
void serve_response_emit(http_call *c, json_t *o);
/* The closing events of a /v1/responses stream (error: response.failed). */
void serve_response_emit_end(http_call *c, const char *error);
/* Starts the stream when not yet started and sends what is new; 1 when every choice has
 * sent its end. */
int serve_response_stream_progress(http_call *c);

/* ---- lifecycle.c: a generation call from arrival to its last byte ---- */

/* POST /v1/chat/completions (chat 1), /v1/completions (chat 0), /v1/responses (api). */
void serve_call_generate(serve_ctx *sc, al_httpd_req *req, int chat, al_api api);
/* Unlinks and frees a call (its engine request detached); the reply is the caller's. */
void serve_call_free(http_call *c);

/* ---- auth.c: the API key ---- */

/* 1 when req may use path: no key set, a route that needs none, or the right Bearer token. */
int serve_auth_check(const serve_ctx *sc, al_httpd_req *req, const char *path);

/* ---- routes.c: the HTTP routes ---- */

/* httpd's request callback (ud: the serve_ctx). */
void serve_route_request(al_httpd_req *req, void *ud);

/* ---- weights_api.c: SGLang's and vLLM's weight-update routes (--weight-routes) ---- */

/* The routes' state: paths read only under roots (borrowed; nroots 0: anywhere absolute), the
 * weight version label starting at `version`, model_dir what /model_info names. NULL when out
 * of memory. */
serve_wapi *serve_wapi_new(const char *const *roots, size_t nroots, int64_t version,
                           const char *model_dir);
void serve_wapi_free(serve_wapi *w);
/* Answers req when path is one of the weight routes: 1; else 0 (sc->wapi NULL: always 0). */
int serve_wapi_route(serve_ctx *sc, al_httpd_req *req, const char *path);
/* 1 while generation is paused (/pause_generation, /pause) until /continue_generation,
 * /resume or a weight update without keep_pause. */
int serve_wapi_paused(const serve_wapi *w);

#endif
