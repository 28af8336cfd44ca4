/*
 * translate.c: the shared half of the API translators (see translate.h). Owns a call's
 * translation state, the reading of chat completions (a whole answer's message, or a
 * stream's deltas: reasoning, text, tool calls, finish reason, usage) and the building of
 * the agent's answer item by item: one item is open at a time (a text, a reasoning or a
 * tool call), a piece of another kind closes it and opens the next. What each item looks
 * like, and which events announce it, is each API's: the xl_ops of responses.c and
 * messages.c, through which every call here dispatches.
 */
#include "translate_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define XL_MAX_TOOLS 128 /* tool calls in one answer */

/* The translator of an API, or NULL (chat completions need none). */
static const xl_ops *ops_of(al_api api)
{
    switch (api) {
    case AL_API_RESPONSES:
        return &xl_responses_ops;
    case AL_API_MESSAGES:
        return &xl_messages_ops;
    default:
        return NULL;
    }
}

al_xl *al_xl_request(al_api api, const char *body, size_t n, const al_xl_env *env, json_t **chat,
                     al_xl_err *err)
{
    *chat = NULL;
    const xl_ops *ops = ops_of(api);
    if (!ops) {
        xl_fail(err, 500, "server_error", "internal_error", NULL, "no translator for this API");
        return NULL;
    }
    al_xl *x = calloc(1, sizeof *x);
    if (!x) {
        xl_fail(err, 500, "server_error", "out_of_memory", NULL, "out of memory");
        return NULL;
    }
    x->ops = ops;
    x->open_tool = (size_t)-1;
    x->store = 1;
    x->created = env ? env->created : 0;
    x->count_only = env && env->count_tokens;
    snprintf(x->seed, sizeof x->seed, "%s", env && env->seed ? env->seed : "0");
    snprintf(x->id, sizeof x->id, "%s_%s", ops->id_prefix, x->seed);
    json_error_t je;
    x->req = json_loadb(body, n, JSON_ALLOW_NUL, &je); /* \u0000: a token a policy sampled */
    x->output = json_array();
    int rc;
    if (!x->req)
        rc = xl_fail(err, 400, "invalid_request_error", "invalid_json", NULL,
                     "request body is not valid JSON: %s (line %d, column %d)", je.text, je.line,
                     je.column);
    else if (!json_is_object(x->req))
        rc = xl_fail(err, 400, "invalid_request_error", "invalid_json", NULL,
                     "request body must be a JSON object");
    else if (!x->output)
        rc = xl_fail(err, 500, "server_error", "out_of_memory", NULL, "out of memory");
    else
        rc = ops->request(x, env, chat, err);
    if (rc != 0) {
        json_decref(*chat);
        *chat = NULL;
        al_xl_free(x);
        return NULL;
    }
    return x;
}

void al_xl_free(al_xl *x)
{
    if (!x) return;
    json_decref(x->req);
    json_decref(x->conv);
    free(x->model);
    free(x->up_model);
    al_buf_free(&x->text);
    al_buf_free(&x->reasoning);
    json_decref(x->text_lps);
    for (size_t i = 0; i < x->ntools; i++) {
        free(x->tools[i].call_id);
        free(x->tools[i].name);
        al_buf_free(&x->tools[i].args);
    }
    free(x->tools);
    json_decref(x->output);
    free(x->finish);
    free(x->stop_str);
    json_decref(x->final);
    json_decref(x->final_members);
    free(x);
}

void al_xl_set_final_members(al_xl *x, json_t *members)
{
    json_decref(x->final_members);
    x->final_members = json_is_object(members) ? members : NULL;
    if (!x->final_members) json_decref(members);
}

int al_xl_stream(const al_xl *x)
{
    return x->stream;
}

const char *al_xl_model(const al_xl *x)
{
    return x->model ? x->model : "";
}

const char *al_xl_id(const al_xl *x)
{
    return x->id;
}

json_t *al_xl_agent_request(const al_xl *x)
{
    return x->req;
}

json_t *al_xl_final(const al_xl *x)
{
    return x->final;
}

int al_xl_store(const al_xl *x)
{
    return x->ops->conversation && x->store;
}

json_t *al_xl_conversation(const al_xl *x)
{
    return x->ops->conversation ? x->ops->conversation(x) : NULL;
}

/* ------------------------------------------------------------------------------------------
 * Building the answer
 * ------------------------------------------------------------------------------------------ */

static int item_close(al_xl *x, al_buf *out, int emit)
{
    if (!x->open) return 0;
    int rc = x->ops->item_close(x, out, emit);
    if (x->open == XK_TOOL) x->tools[x->open_tool].closed = 1;
    x->open = XK_NONE;
    x->open_tool = (size_t)-1;
    json_decref(x->text_lps);
    x->text_lps = NULL;
    return rc;
}

/* Makes an item of kind (tool: x->tools[tool]) the open one. */
static int switch_to(al_xl *x, int kind, size_t tool, al_buf *out, int emit)
{
    if (x->open == kind && (kind != XK_TOOL || x->open_tool == tool)) return 0;
    if (item_close(x, out, emit)) return -1;
    x->open = kind;
    x->open_tool = tool;
    x->open_index = x->nout++;
    al_buf_reset(&x->text);
    al_buf_reset(&x->reasoning);
    if (kind == XK_TOOL) {
        x->tools[tool].out_index = x->open_index;
        snprintf(x->open_id, sizeof x->open_id, "%s", x->tools[tool].item_id);
    } else {
        snprintf(x->open_id, sizeof x->open_id, "%s_%s_%d", kind == XK_TEXT ? "msg" : "rs", x->seed,
                 x->open_index);
    }
    return x->ops->item_open(x, out, emit);
}

static int piece(al_xl *x, const char *s, size_t n, json_t *lps, al_buf *out, int emit)
{
    al_buf *b = x->open == XK_TEXT        ? &x->text
                 : x->open == XK_REASONING ? &x->reasoning
                                           : &x->tools[x->open_tool].args;
    if (al_buf_append(b, s, n)) return -1;
    return x->ops->piece(x, s, n, lps, out, emit);
}

/* The answer's tool call at the upstream's index (made on first sight), or NULL past the
 * bound or out of memory. */
static xl_tool *tool_at(al_xl *x, int chat_index, size_t *pos)
{
    for (size_t i = 0; i < x->ntools; i++)
        if (x->tools[i].chat_index == chat_index) {
            *pos = i;
            return &x->tools[i];
        }
    if (x->ntools >= XL_MAX_TOOLS) return NULL;
    if (x->ntools == x->tools_cap) {
        size_t nc = x->tools_cap ? x->tools_cap * 2 : 4;
        xl_tool *nt = realloc(x->tools, nc * sizeof *nt);
        if (!nt) return NULL;
        x->tools = nt;
        x->tools_cap = nc;
    }
    xl_tool *t = &x->tools[x->ntools];
    memset(t, 0, sizeof *t);
    t->chat_index = chat_index;
    snprintf(t->item_id, sizeof t->item_id, "%s_%s_%zu",
             x->ops->tool_prefix, x->seed, x->ntools);
    *pos = x->ntools++;
    return t;
}

static const char *str_member(json_t *o, const char *k)
{
    return json_string_value(json_object_get(o, k));
}

/* One delta (stream) or message (whole answer): its reasoning, its text, its tool calls,
 * in that order. lps: the chat logprobs.content of this piece of text (may be NULL). */
static int feed(al_xl *x, json_t *d, json_t *lps, al_buf *out, int emit)
{
    if (!json_is_object(d)) return 0;
    json_t *r = json_object_get(d, "reasoning_content");
    if (!json_is_string(r)) r = json_object_get(d, "reasoning");
    if (json_is_string(r) && json_string_length(r)) {
        if (switch_to(x, XK_REASONING, 0, out, emit) ||
            piece(x, json_string_value(r), json_string_length(r), NULL, out, emit))
            return -1;
    }
    json_t *c = json_object_get(d, "content");
    if (json_is_string(c) && json_string_length(c)) {
        if (switch_to(x, XK_TEXT, 0, out, emit) ||
            piece(x, json_string_value(c), json_string_length(c), lps, out, emit))
            return -1;
    }
    json_t *tcs = json_object_get(d, "tool_calls"), *tc;
    size_t i;
    if (!json_is_array(tcs)) return 0;
    json_array_foreach(tcs, i, tc)
    {
        if (!json_is_object(tc)) continue;
        json_t *ji = json_object_get(tc, "index");
        int idx =
            json_is_integer(ji) && json_integer_value(ji) >= 0 && json_integer_value(ji) < 1000000
                ? (int)json_integer_value(ji)
                : (int)i;
        size_t pos;
        xl_tool *t = tool_at(x, idx, &pos);
        if (!t) continue; /* beyond XL_MAX_TOOLS: not answered */
        json_t *fn = json_object_get(tc, "function");
        const char *id = str_member(tc, "id"), *name = str_member(fn, "name");
        if (id && *id && !t->call_id && !(t->call_id = strdup(id))) return -1;
        if (name && !t->name && !(t->name = strdup(name))) return -1;
        json_t *args = json_object_get(fn, "arguments");
        char *argtext = NULL;
        if (json_is_object(args)) /* some servers send arguments as an object */
            argtext = json_dumps(args, JSON_COMPACT | JSON_PRESERVE_ORDER);
        const char *a = argtext ? argtext : json_string_value(args);
        if (t->closed) { /* a late piece of a call already closed: kept in the answer only */
            int rc = a ? al_buf_puts(&t->args, a) : 0;
            if (!rc && a && t->item)
                json_object_set_new(t->item, "arguments", json_string(t->args.data));
            free(argtext);
            if (rc) return -1;
            continue;
        }
        if (!t->call_id) {
            char made[96];
            snprintf(made, sizeof made, "call_%s_%zu", x->seed, pos);
            if (!(t->call_id = strdup(made))) {
                free(argtext);
                return -1;
            }
        }
        if (switch_to(x, XK_TOOL, pos, out, emit) ||
            (a && *a && piece(x, a, strlen(a), NULL, out, emit))) {
            free(argtext);
            return -1;
        }
        free(argtext);
    }
    return 0;
}

static int64_t count(json_t *o, const char *k)
{
    json_t *v = json_object_get(o, k);
    double d = json_is_integer(v) ? (double)json_integer_value(v) : json_number_value(v);
    return d >= 0 && d <= 0x1p53 ? (int64_t)d : 0;
}

static void read_usage(al_xl *x, json_t *u)
{
    if (!json_is_object(u)) return;
    x->have_usage = 1;
    x->in_tok = count(u, "prompt_tokens");
    x->out_tok = count(u, "completion_tokens");
    x->cached_tok = count(json_object_get(u, "prompt_tokens_details"), "cached_tokens");
    x->reasoning_tok = count(json_object_get(u, "completion_tokens_details"), "reasoning_tokens");
}

static int read_finish(al_xl *x, json_t *c0)
{
    const char *f = str_member(c0, "finish_reason");
    if (f && *f) {
        free(x->finish);
        if (!(x->finish = strdup(f))) return -1;
    }
    const char *s = str_member(c0, "stop_reason"); /* vLLM: the stop string that ended it */
    if (s) {
        free(x->stop_str);
        if (!(x->stop_str = strdup(s))) return -1;
    }
    return 0;
}

static int set_up_model(al_xl *x, json_t *o)
{
    const char *m = str_member(o, "model");
    if (m && !x->up_model && !(x->up_model = strdup(m))) return -1;
    return 0;
}

static int finish(al_xl *x, const char *error, al_buf *out, int emit)
{
    if (x->ended) return 0;
    /* a model that said nothing (an end token first) still answers with a message, empty,
     * as the Responses API's models do: agents look for one to end their turn */
    if (x->ops->empty_message && !error && x->nout == 0 && switch_to(x, XK_TEXT, 0, out, emit))
        return -1;
    if (item_close(x, out, emit)) return -1;
    x->ended = 1;
    return x->ops->end(x, error, out, emit);
}

json_t *al_xl_answer(al_xl *x, json_t *completion, al_xl_err *err)
{
    json_t *c0 = json_array_get(json_object_get(completion, "choices"), 0);
    json_t *msg = json_object_get(c0, "message");
    if (!json_is_object(completion) || !json_is_object(msg)) {
        xl_fail(err, 502, "upstream_error", "bad_upstream_answer", NULL,
                "the upstream's answer is not a chat completion (no choices[0].message)");
        return NULL;
    }
    json_t *lps = json_object_get(json_object_get(c0, "logprobs"), "content");
    read_usage(x, json_object_get(completion, "usage"));
    if (set_up_model(x, completion) || read_finish(x, c0) ||
        feed(x, msg, json_is_array(lps) ? lps : NULL, NULL, 0) || finish(x, NULL, NULL, 0) ||
        !x->final) {
        xl_fail(err, 500, "server_error", "out_of_memory", NULL, "out of memory");
        return NULL;
    }
    return json_incref(x->final);
}

int al_xl_chunk(al_xl *x, json_t *chunk, al_buf *out)
{
    if (x->ended || !json_is_object(chunk)) return 0;
    json_t *pids = json_object_get(chunk, "prompt_token_ids");
    json_t *c0 = json_array_get(json_object_get(chunk, "choices"), 0);
    if (!json_is_array(pids)) pids = json_object_get(c0, "prompt_token_ids");
    if (json_is_array(pids) && !x->prompt_ids) x->prompt_ids = (int64_t)json_array_size(pids);
    if (set_up_model(x, chunk)) return -1;
    if (!x->started) {
        x->started = 1;
        if (x->ops->open_stream(x, out)) return -1;
    }
    read_usage(x, json_object_get(chunk, "usage"));
    if (!json_is_object(c0)) return 0;
    json_t *lps = json_object_get(json_object_get(c0, "logprobs"), "content");
    if (feed(x, json_object_get(c0, "delta"), json_is_array(lps) ? lps : NULL, out, 1)) return -1;
    return read_finish(x, c0);
}

int al_xl_end(al_xl *x, const char *error, al_buf *out)
{
    if (x->ended) return 0;
    if (!x->started) {
        x->started = 1;
        if (x->ops->open_stream(x, out)) return -1;
    }
    return finish(x, error, out, 1);
}

/* Chat completions errors have the OpenAI shape, the Responses API's. */
char *al_xl_error_body(al_api api, int status, const char *type, const char *code,
                       const char *message)
{
    const xl_ops *ops = ops_of(api);
    return (ops ? ops : &xl_responses_ops)->error_body(status, type, code, message);
}
