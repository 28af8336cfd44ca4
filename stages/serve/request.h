/*
 * request.h: parsing and checking the body of POST /v1/chat/completions and /v1/completions
 * into what the engine needs (prompt ids, sampling, stops, what to return). Errors come back
 * as the HTTP status, the offending field and an OpenAI-style message, never as a crash:
 * the body is untrusted bytes.
 */
#ifndef ARCLIGHT_SERVE_REQUEST_H
#define ARCLIGHT_SERVE_REQUEST_H

#include "text/tokenizer.h"

#include <stddef.h>
#include <stdint.h>

#define AL_SERVE_MAX_N 16            /* choices per request */
#define AL_SERVE_MAX_TOP_LOGPROBS 20 /* as OpenAI */

typedef struct al_serve_parse_ctx {
    const al_tokenizer *tok; /* borrowed */
    const char *name;        /* the served model id ("model" must equal it when given) */
    int vocab_size;          /* of the model (token ids are checked against it) */
    int max_model_len;       /* prompt + completion */
} al_serve_parse_ctx;

typedef struct al_serve_request {
    int chat, stream, include_usage, return_token_ids;
    int has_tools;       /* chat: tools given and tool_choice is not "none" */
    al_token_ids prompt; /* rendered (chat) or encoded / given (completions) */
    int max_tokens;      /* >= 1; prompt + max_tokens <= max_model_len */
    double temperature, top_p;
    int top_k, n, has_seed;
    uint64_t seed;
    int logprobs, top_logprobs; /* logprobs 0/1; top_logprobs 0..AL_SERVE_MAX_TOP_LOGPROBS */
    int ignore_eos;
    char **stop; /* owned */
    int nstop;
    int32_t *stop_ids; /* owned */
    int nstop_ids;
} al_serve_request;

typedef struct al_serve_error {
    int status;        /* 400, or 404 for an unknown model */
    const char *param; /* the field at fault (static string) or NULL */
    char message[1024];
} al_serve_error;

/* Parses len bytes of body for the chat (chat = 1) or completions endpoint. 0 and *out
 * (release with al_serve_request_free), or -1 with *e filled and nothing to release. */
int al_serve_request_parse(const al_serve_parse_ctx *ctx, int chat, const char *body, size_t len,
                           al_serve_request *out, al_serve_error *e);
void al_serve_request_free(al_serve_request *r);

#endif
