/*
 * translate.h: the OpenAI Responses API and the Anthropic Messages API in terms of chat
 * completions, both ways (issue 14). The proxy serves POST /v1/responses and POST
 * /v1/messages on any upstream that speaks chat completions (which returns token ids): the
 * agent's request becomes a chat completions request, the upstream's answer (whole, or a
 * stream chunk by chunk) becomes what a server of the agent's API sends, event for event.
 *
 * Pure code over jansson trees and byte buffers: no proxy state, no I/O, no allocation
 * beyond what the caller frees. It faces untrusted bytes from both sides (the agent's
 * request, the upstream's answer): fuzzed by tests/fuzz/fuzz_proxy_translate.c.
 *
 * Lifecycle of one call:
 *   x = al_xl_request(api, body, n, &env, &chat, &err)   the agent's request; chat to send
 *   whole answer:  ans = al_xl_answer(x, completion, &err)
 *   stream:        al_xl_chunk(x, chunk, &out) per upstream chunk, al_xl_end(x, err, &out)
 *                  (out: SSE bytes for the agent), then al_xl_final(x)
 *   al_xl_conversation(x) for the response store, al_xl_free(x).
 */
#ifndef ARCLIGHT_API_TRANSLATE_H
#define ARCLIGHT_API_TRANSLATE_H

#include "core/buf.h"

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

typedef enum al_api { AL_API_CHAT = 0, AL_API_RESPONSES, AL_API_MESSAGES } al_api;

/* The text of a message's content: a string (copied whole: a NUL inside is text), null or
 * absent (*out NULL), or an array of parts whose "type" is one of types (NULL-terminated),
 * their "text" strings joined ("" for an empty array); with types NULL, the chat API's rule:
 * parts of type "text" or of none. 0 with *out malloc'd and NUL-terminated and *len (when
 * given) its length; -1 for any other content or when out of memory (*out NULL). The one
 * reading of content parts: lib/api's translators, serve's requests, model sft's data. */
int al_api_content_text(json_t *c, const char *const *types, char **out, size_t *len);

/* What to answer the agent when a translation fails: an HTTP status and an error in the
 * agent's API's terms. */
typedef struct al_xl_err {
    int status;        /* 400 for the agent's request, 502 for the upstream's answer */
    char type[48];     /* invalid_request_error, ... */
    char code[48];     /* responses: the error code (may be empty) */
    char param[64];    /* responses: the offending parameter (may be empty) */
    char message[600]; /* what was wrong, for a person */
} al_xl_err;

/* previous_response_id: the stored conversation of that response (a new reference to a
 * JSON array of chat messages, ending with that response's answer), or NULL when unknown. */
typedef json_t *(*al_xl_lookup_fn)(void *ud, const char *response_id);

typedef struct al_xl_env {
    const char *seed;       /* unique [0-9a-f] text for this call's ids (resp_, msg_, fc_, ...) */
    int64_t created;        /* unix seconds of the call */
    al_xl_lookup_fn lookup; /* NULL: previous_response_id is refused */
    void *lookup_ud;
    int count_tokens; /* messages: a count_tokens request (no max_tokens; nothing generated) */
} al_xl_env;

typedef struct al_xl al_xl;

/* Parses the agent's request body (api: RESPONSES or MESSAGES) and translates it. Returns
 * the call's translation state and the chat completions request in *chat (a new reference
 * the caller owns), or NULL with *err filled (status 400, or 500 when out of memory). */
al_xl *al_xl_request(al_api api, const char *body, size_t n, const al_xl_env *env, json_t **chat,
                     al_xl_err *err);
void al_xl_free(al_xl *x);

int al_xl_stream(const al_xl *x);        /* the agent asked for a stream */
const char *al_xl_model(const al_xl *x); /* the agent's model, or "" */
const char *al_xl_id(const al_xl *x);    /* this answer's id (resp_... / msg_...) */
json_t *al_xl_agent_request(const al_xl *x); /* the agent's request as parsed (borrowed) */

/* The agent's answer to a whole chat completion (a new reference), or NULL with *err
 * (status 502: the upstream's answer is not a chat completion). */
json_t *al_xl_answer(al_xl *x, json_t *completion, al_xl_err *err);

/* One upstream stream chunk (a chat.completion.chunk object); appends the agent's SSE
 * events to out. The first call also sends the stream's opening events. 0, or -1 when out
 * of memory. */
int al_xl_chunk(al_xl *x, json_t *chunk, al_buf *out);
/* The end of the upstream's stream: closes what is open and sends the final events, or,
 * with error set, the API's failure event carrying it. Idempotent. 0 or -1 (memory). */
int al_xl_end(al_xl *x, const char *error, al_buf *out);
/* The answer as the agent has it after al_xl_end (borrowed; NULL before the end). */
json_t *al_xl_final(const al_xl *x);

/* Members a server of the API adds to the final answer object (the whole answer, and the
 * Response of response.completed / incomplete / failed or Anthropic's message object in a
 * stream): arclight serve's vLLM-shaped "input_messages" and "output_messages". Call before
 * al_xl_answer or al_xl_end; takes the reference to members (an object). */
void al_xl_set_final_members(al_xl *x, json_t *members);

/* Responses: whether this answer is to be stored (store is not false), and the chat
 * messages a later previous_response_id continues from (a new reference: the conversation
 * without the instructions, then the answer), or NULL. */
int al_xl_store(const al_xl *x);
json_t *al_xl_conversation(const al_xl *x);

/* An error body in the API's terms (malloc'd): responses/chat {"error": {...}}, messages
 * {"type": "error", "error": {"type", "message"}} (its type from status). type NULL:
 * derived from status. NULL when out of memory. */
char *al_xl_error_body(al_api api, int status, const char *type, const char *code,
                       const char *message);

#endif
