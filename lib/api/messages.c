/*
 * messages.c: the Anthropic Messages API (POST /v1/messages) over chat completions. Owns
 * the request's translation (system, messages with text, image, tool_use, tool_result and
 * thinking blocks, tools, tool_choice, stop_sequences, sampling), the Message object with
 * its stop_reason (end_turn, max_tokens, stop_sequence, tool_use) and usage, and the event
 * stream: message_start, ping, content_block_start / content_block_delta (text_delta,
 * thinking_delta, input_json_delta) / content_block_stop, message_delta, message_stop, and
 * error for a stream that fails.
 *
 * Server tools (web search, code execution, ...) run on Anthropic's servers: tools with a
 * type other than "custom" are left out of the model's tools.
 */
#include "translate_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const TEXT_BLOCKS[] = {"text", NULL};

/* ------------------------------------------------------------------------------------------
 * The request
 * ------------------------------------------------------------------------------------------ */

static json_t *image_part(json_t *src)
{
    const char *ty = json_string_value(json_object_get(src, "type"));
    if (ty && !strcmp(ty, "url") && json_is_string(json_object_get(src, "url")))
        return json_pack("{s:s,s:{s:O}}", "type", "image_url", "image_url", "url",
                         json_object_get(src, "url"));
    const char *mt = json_string_value(json_object_get(src, "media_type"));
    const char *data = json_string_value(json_object_get(src, "data"));
    if (!ty || strcmp(ty, "base64") || !mt || !data) return NULL;
    size_t ml = strlen(mt), dl = strlen(data);
    char *url = malloc(ml + dl + 14);
    if (!url) return NULL;
    snprintf(url, ml + dl + 14, "data:%s;base64,%s", mt, data);
    json_t *p = json_pack("{s:s,s:{s:s}}", "type", "image_url", "image_url", "url", url);
    free(url);
    return p;
}

/* Adds one message of the agent's to msgs: a user message's tool results become tool
 * messages (first, as chat wants them right after the calls), its text and images one user
 * message; an assistant message's text, thinking and tool_use blocks one assistant message. */
static int add_message(json_t *msgs, json_t *m, size_t i, al_xl_err *err)
{
    if (!json_is_object(m))
        return xl_fail(err, 400, "invalid_request_error", NULL, NULL,
                       "messages.%zu: must be an object", i);
    const char *role = json_string_value(json_object_get(m, "role"));
    if (!role || (strcmp(role, "user") && strcmp(role, "assistant") && strcmp(role, "system")))
        return xl_fail(err, 400, "invalid_request_error", NULL, NULL,
                       "messages.%zu.role: Input should be 'user', 'assistant' or 'system'", i);
    int user = role[0] == 'u';
    json_t *content = json_object_get(m, "content");
    if (role[0] == 's') { /* a system message within the conversation: text only */
        char *s = xl_text_of(content, TEXT_BLOCKS);
        if (!s)
            return xl_fail(err, 400, "invalid_request_error", NULL, NULL,
                           "messages.%zu.content: a system message holds text (a string or text "
                           "blocks)",
                           i);
        int rc =
            json_array_append_new(msgs, json_pack("{s:s,s:s}", "role", "system", "content", s));
        free(s);
        return rc;
    }
    if (json_is_string(content))
        return json_array_append_new(msgs,
                                     json_pack("{s:s,s:O}", "role", role, "content", content));
    if (!json_is_array(content))
        return xl_fail(err, 400, "invalid_request_error", NULL, NULL,
                       "messages.%zu.content: must be a string or an array of content blocks", i);
    al_buf text = {0}, thinking = {0};
    json_t *parts = json_array(), *calls = json_array(), *b;
    int has_image = 0, rc = 0;
    size_t k;
    json_array_foreach(content, k, b)
    {
        const char *ty = json_string_value(json_object_get(b, "type"));
        json_t *tx = json_object_get(b, "text");
        if (!ty) {
            rc = xl_fail(err, 400, "invalid_request_error", NULL, NULL,
                         "messages.%zu.content.%zu.type: Field required", i, k);
        } else if (!strcmp(ty, "text") && json_is_string(tx)) {
            al_buf_append(&text, json_string_value(tx), json_string_length(tx));
            json_array_append_new(parts, json_pack("{s:s,s:O}", "type", "text", "text", tx));
        } else if (!strcmp(ty, "image") && user) {
            json_t *p = image_part(json_object_get(b, "source"));
            if (!p)
                rc = xl_fail(err, 400, "invalid_request_error", NULL, NULL,
                             "messages.%zu.content.%zu.source: an image needs a base64 source "
                             "(media_type, data) or a url source",
                             i, k);
            json_array_append_new(parts, p);
            has_image = 1;
        } else if (!strcmp(ty, "tool_result") && user) {
            const char *id = json_string_value(json_object_get(b, "tool_use_id"));
            json_t *c = json_object_get(b, "content");
            char *out = c ? xl_text_of(c, TEXT_BLOCKS) : strdup("");
            if (!id || !out) {
                rc = xl_fail(err, 400, "invalid_request_error", NULL, NULL,
                             "messages.%zu.content.%zu: a tool_result needs tool_use_id and a "
                             "content of text (a string or text blocks)",
                             i, k);
            } else {
                json_array_append_new(msgs, json_pack("{s:s,s:s,s:s}", "role", "tool",
                                                      "tool_call_id", id, "content", out));
            }
            free(out);
        } else if (!strcmp(ty, "tool_use") && !user) {
            const char *id = json_string_value(json_object_get(b, "id"));
            const char *name = json_string_value(json_object_get(b, "name"));
            json_t *in = json_object_get(b, "input");
            char *args =
                json_is_object(in) ? json_dumps(in, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
            if (!id || !name || !args)
                rc = xl_fail(err, 400, "invalid_request_error", NULL, NULL,
                             "messages.%zu.content.%zu: a tool_use needs id, name and an input "
                             "object",
                             i, k);
            else
                json_array_append_new(calls, json_pack("{s:s,s:s,s:{s:s,s:s}}", "id", id, "type",
                                                       "function", "function", "name", name,
                                                       "arguments", args));
            free(args);
        } else if (!strcmp(ty, "thinking") && !user) {
            const char *t = json_string_value(json_object_get(b, "thinking"));
            if (t) al_buf_puts(&thinking, t);
        } else if (!strcmp(ty, "redacted_thinking") && !user) {
            /* encrypted by another server: nothing a model here can read */
        } else {
            rc = xl_fail(err, 400, "invalid_request_error", NULL, NULL,
                         "messages.%zu.content.%zu: %s blocks are not supported in %s messages "
                         "by this proxy",
                         i, k, ty, role);
        }
        if (rc) break;
    }
    if (!rc && user && json_array_size(parts))
        rc = json_array_append_new(
            msgs, json_pack("{s:s,s:o}", "role", "user", "content",
                            has_image ? json_incref(parts) : json_stringn(text.data ? text.data : "", text.len)));
    if (!rc && !user) {
        json_t *a = json_pack("{s:s}", "role", "assistant");
        json_object_set_new(a, "content", text.data ? json_stringn(text.data, text.len) : json_null());
        if (thinking.data)
            json_object_set_new(a, "reasoning_content", json_stringn(thinking.data, thinking.len));
        if (json_array_size(calls)) json_object_set(a, "tool_calls", calls);
        rc = json_array_append_new(msgs, a);
    }
    json_decref(parts);
    json_decref(calls);
    al_buf_free(&text);
    al_buf_free(&thinking);
    return rc;
}

static json_t *chat_tools(json_t *tools, al_xl_err *err)
{
    json_t *out = json_array(), *t;
    size_t i;
    json_array_foreach(tools, i, t)
    {
        const char *ty = json_string_value(json_object_get(t, "type"));
        if (ty && strcmp(ty, "custom")) continue; /* a server tool: it runs at Anthropic */
        const char *name = json_string_value(json_object_get(t, "name"));
        json_t *schema = json_object_get(t, "input_schema"),
               *desc = json_object_get(t, "description");
        if (!name || !json_is_object(schema)) {
            json_decref(out);
            xl_fail(err, 400, "invalid_request_error", NULL, NULL,
                    "tools.%zu: a tool needs a name and an input_schema object", i);
            return NULL;
        }
        json_t *fn = json_pack("{s:s,s:O}", "name", name, "parameters", schema);
        if (json_is_string(desc)) json_object_set(fn, "description", desc);
        json_array_append_new(out, json_pack("{s:s,s:o}", "type", "function", "function", fn));
    }
    return out;
}

static int messages_request(al_xl *x, const al_xl_env *env, json_t **chat, al_xl_err *err)
{
    (void)env;
    json_t *r = x->req;
    const char *model = json_string_value(json_object_get(r, "model"));
    json_t *mt = json_object_get(r, "max_tokens"), *msgs_in = json_object_get(r, "messages");
    if (!model)
        return xl_fail(err, 400, "invalid_request_error", NULL, NULL, "model: Field required");
    if (!x->count_only && (!json_is_integer(mt) || json_integer_value(mt) < 1))
        return xl_fail(err, 400, "invalid_request_error", NULL, NULL,
                       "max_tokens: Field required (a positive integer)");
    if (!json_is_array(msgs_in))
        return xl_fail(err, 400, "invalid_request_error", NULL, NULL,
                       "messages: Field required (an array)");
    json_t *st = json_object_get(r, "stream");
    if (st && !json_is_boolean(st))
        return xl_fail(err, 400, "invalid_request_error", NULL, NULL, "stream: must be a boolean");
    if (!(x->model = strdup(model)))
        return xl_fail(err, 500, "api_error", NULL, NULL, "out of memory");
    x->stream = json_is_true(st) && !x->count_only;
    json_t *c = *chat = json_pack("{s:s}", "model", model);
    if (c && !x->count_only) json_object_set(c, "max_tokens", mt);
    json_t *msgs = json_array();
    if (!c || !msgs || json_object_set_new(c, "messages", msgs)) {
        json_decref(msgs);
        return xl_fail(err, 500, "api_error", NULL, NULL, "out of memory");
    }
    json_t *sys = json_object_get(r, "system");
    if (sys && !json_is_null(sys)) {
        char *s = NULL;
        if (json_is_string(sys)) {
            s = strdup(json_string_value(sys));
        } else if (json_is_array(sys)) {
            /* text blocks, one after the other */
            al_buf b = {0};
            size_t i;
            json_t *blk;
            json_array_foreach(sys, i, blk)
            {
                const char *t = json_string_value(json_object_get(blk, "text"));
                if (!t) {
                    al_buf_free(&b);
                    return xl_fail(err, 400, "invalid_request_error", NULL, NULL,
                                   "system.%zu: must be a text block", i);
                }
                if (i) al_buf_puts(&b, "\n");
                al_buf_puts(&b, t);
            }
            s = b.data ? b.data : strdup("");
        }
        if (!s)
            return xl_fail(err, 400, "invalid_request_error", NULL, NULL,
                           "system: must be a string or an array of text blocks");
        json_array_append_new(msgs, json_pack("{s:s,s:s}", "role", "system", "content", s));
        free(s);
    }
    size_t i;
    json_t *m;
    json_array_foreach(msgs_in, i, m) if (add_message(msgs, m, i, err)) return -1;
    json_t *tools = json_object_get(r, "tools");
    if (tools && !json_is_array(tools))
        return xl_fail(err, 400, "invalid_request_error", NULL, NULL, "tools: must be an array");
    json_t *tc = json_object_get(r, "tool_choice");
    const char *tct = json_string_value(json_object_get(tc, "type"));
    if (json_array_size(tools)) {
        json_t *ct = chat_tools(tools, err);
        if (!ct) return -1;
        if (json_array_size(ct)) {
            json_object_set_new(c, "tools", ct);
            if (tct && !strcmp(tct, "any")) {
                json_object_set_new(c, "tool_choice", json_string("required"));
            } else if (tct && !strcmp(tct, "none")) {
                json_object_set_new(c, "tool_choice", json_string("none"));
            } else if (tct && !strcmp(tct, "tool")) {
                const char *n = json_string_value(json_object_get(tc, "name"));
                if (!n)
                    return xl_fail(err, 400, "invalid_request_error", NULL, NULL,
                                   "tool_choice.name: Field required");
                json_object_set_new(
                    c, "tool_choice",
                    json_pack("{s:s,s:{s:s}}", "type", "function", "function", "name", n));
            }
            if (json_is_true(json_object_get(tc, "disable_parallel_tool_use")))
                json_object_set_new(c, "parallel_tool_calls", json_false());
        } else {
            json_decref(ct);
        }
    }
    static const char *const same[] = {"temperature", "top_p", "top_k", NULL};
    for (size_t k = 0; same[k]; k++) {
        json_t *v = json_object_get(r, same[k]);
        if (v && !json_is_null(v) && !json_is_number(v))
            return xl_fail(err, 400, "invalid_request_error", NULL, NULL, "%s: must be a number",
                           same[k]);
        if (v && !json_is_null(v)) json_object_set(c, same[k], v);
    }
    json_t *ss = json_object_get(r, "stop_sequences");
    if (json_array_size(ss)) json_object_set(c, "stop", ss);
    if (x->stream) json_object_set_new(c, "stream", json_true());
    if (x->count_only) { /* what /tokenize takes of it: the prompt */
        static const char *const gen[] = {"temperature", "top_p", "top_k", "stop",
                                          "parallel_tool_calls"};
        for (size_t k = 0; k < sizeof gen / sizeof *gen; k++)
            json_object_del(c, gen[k]);
    }
    return 0;
}

/* ------------------------------------------------------------------------------------------
 * The answer
 * ------------------------------------------------------------------------------------------ */

static const char *stop_reason(const al_xl *x, const char **seq)
{
    *seq = NULL;
    const char *f = x->finish ? x->finish : "";
    if (!strcmp(f, "length")) return "max_tokens";
    if (!strcmp(f, "tool_calls") || x->ntools) return "tool_use";
    json_t *ss = json_object_get(x->req, "stop_sequences"), *s;
    size_t i;
    if (x->stop_str)
        json_array_foreach(ss, i,
                           s) if (json_is_string(s) && !strcmp(json_string_value(s), x->stop_str))
        {
            *seq = json_string_value(s);
            return "stop_sequence";
        }
    return "end_turn";
}

static json_t *usage_object(const al_xl *x, int64_t in)
{
    int64_t cached = x->cached_tok < in ? x->cached_tok : 0;
    return json_pack("{s:I,s:I,s:I,s:I}", "input_tokens", (json_int_t)(in - cached),
                     "cache_creation_input_tokens", (json_int_t)0, "cache_read_input_tokens",
                     (json_int_t)cached, "output_tokens", (json_int_t)x->out_tok);
}

static json_t *message_object(const al_xl *x, const char *stop, const char *seq, int64_t in)
{
    json_t *o = json_pack("{s:s,s:s,s:s,s:s}", "id", x->id, "type", "message", "role", "assistant",
                          "model", x->up_model ? x->up_model : x->model);
    if (!o) return NULL;
    json_object_set(o, "content", x->output);
    json_object_set_new(o, "stop_reason", stop ? json_string(stop) : json_null());
    json_object_set_new(o, "stop_sequence", seq ? json_string(seq) : json_null());
    json_object_set_new(o, "usage", usage_object(x, in));
    return o;
}

static int messages_open_stream(al_xl *x, al_buf *out)
{
    json_t *m = message_object(x, NULL, NULL, x->prompt_ids);
    if (m) json_object_set_new(m, "content", json_array());
    return xl_sse(out, "message_start",
                  json_pack("{s:s,s:o}", "type", "message_start", "message", m)) ||
                   xl_sse(out, "ping", json_pack("{s:s}", "type", "ping"))
               ? -1
               : 0;
}

static xl_tool *open_tool(al_xl *x)
{
    return &x->tools[x->open_tool];
}

static int messages_item_open(al_xl *x, al_buf *out, int emit)
{
    if (!emit) return 0;
    json_t *b;
    if (x->open == XK_TEXT)
        b = json_pack("{s:s,s:s}", "type", "text", "text", "");
    else if (x->open == XK_REASONING)
        b = json_pack("{s:s,s:s,s:s}", "type", "thinking", "thinking", "", "signature", "");
    else
        b = json_pack("{s:s,s:s,s:s,s:{}}", "type", "tool_use", "id", open_tool(x)->call_id, "name",
                      open_tool(x)->name ? open_tool(x)->name : "", "input");
    return xl_sse(out, "content_block_start",
                  json_pack("{s:s,s:i,s:o}", "type", "content_block_start", "index", x->open_index,
                            "content_block", b));
}

static int messages_piece(al_xl *x, const char *s, size_t n, json_t *lps, al_buf *out,
                          int emit)
{
    (void)lps; /* the Messages API has no logprobs */
    if (!emit) return 0;
    json_t *d = json_stringn(s, n), *delta;
    if (x->open == XK_TEXT)
        delta = json_pack("{s:s,s:o}", "type", "text_delta", "text", d);
    else if (x->open == XK_REASONING)
        delta = json_pack("{s:s,s:o}", "type", "thinking_delta", "thinking", d);
    else
        delta = json_pack("{s:s,s:o}", "type", "input_json_delta", "partial_json", d);
    return xl_sse(out, "content_block_delta",
                  json_pack("{s:s,s:i,s:o}", "type", "content_block_delta", "index", x->open_index,
                            "delta", delta));
}

static int messages_item_close(al_xl *x, al_buf *out, int emit)
{
    json_t *b;
    if (x->open == XK_TEXT) {
        /* by length: a NUL token (\u0000) is text too */
        b = json_pack("{s:s,s:o}", "type", "text", "text",
                      json_stringn(x->text.data ? x->text.data : "", x->text.len));
    } else if (x->open == XK_REASONING) {
        b = json_pack("{s:s,s:s,s:s}", "type", "thinking", "thinking",
                      x->reasoning.data ? x->reasoning.data : "", "signature", "");
    } else {
        xl_tool *t = open_tool(x);
        b = json_pack("{s:s,s:s,s:s,s:o}", "type", "tool_use", "id", t->call_id, "name",
                      t->name ? t->name : "", "input", xl_args_object(t->args.data));
    }
    if (!b || json_array_append_new(x->output, b)) return -1;
    if (!emit) return 0;
    return xl_sse(out, "content_block_stop",
                  json_pack("{s:s,s:i}", "type", "content_block_stop", "index", x->open_index));
}

static int messages_end(al_xl *x, const char *error, al_buf *out, int emit)
{
    const char *seq, *stop = stop_reason(x, &seq);
    int64_t in = x->have_usage ? x->in_tok : x->prompt_ids;
    x->final = message_object(x, stop, seq, in);
    if (!x->final) return -1;
    if (x->final_members && json_object_update(x->final, x->final_members)) return -1;
    if (!emit) return 0;
    if (error)
        return xl_sse(out, "error",
                      json_pack("{s:s,s:{s:s,s:s}}", "type", "error", "error", "type", "api_error",
                                "message", error));
    json_t *u = json_pack("{s:I}", "output_tokens", (json_int_t)x->out_tok);
    if (x->have_usage) json_object_set_new(u, "input_tokens", json_integer(in));
    return xl_sse(out, "message_delta",
                  json_pack("{s:s,s:{s:s,s:o},s:o}", "type", "message_delta", "delta",
                            "stop_reason", stop, "stop_sequence",
                            seq ? json_string(seq) : json_null(), "usage", u)) ||
                   xl_sse(out, "message_stop", json_pack("{s:s}", "type", "message_stop"))
               ? -1
               : 0;
}

/* ------------------------------------------------------------------------------------------
 * Errors
 * ------------------------------------------------------------------------------------------ */

/* Anthropic's error type for an HTTP status. */
static const char *anthropic_type(int status)
{
    switch (status) {
    case 400:
    case 405:
    case 411:
    case 415:
    case 422:
        return "invalid_request_error";
    case 401:
        return "authentication_error";
    case 403:
        return "permission_error";
    case 404:
        return "not_found_error";
    case 408:
    case 504:
        return "timeout_error";
    case 413:
    case 431:
        return "request_too_large";
    case 429:
        return "rate_limit_error";
    case 503:
    case 529:
        return "overloaded_error";
    default:
        return status < 500 ? "invalid_request_error" : "api_error";
    }
}

/* {"type": "error", "error": {"type", "message"}}, its type from status (type and code are
 * the OpenAI APIs'). Malloc'd, or NULL when out of memory. */
static char *messages_error_body(int status, const char *type, const char *code,
                                 const char *message)
{
    (void)type;
    (void)code;
    json_t *o = json_pack("{s:s,s:{s:s,s:s}}", "type", "error", "error", "type",
                          anthropic_type(status), "message", message ? message : "");
    char *s = o ? json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    json_decref(o);
    return s;
}

const xl_ops xl_messages_ops = {
    .id_prefix = "msg",
    .tool_prefix = "toolu",
    .empty_message = 0,
    .request = messages_request,
    .open_stream = messages_open_stream,
    .item_open = messages_item_open,
    .piece = messages_piece,
    .item_close = messages_item_close,
    .end = messages_end,
    .conversation = NULL,
    .error_body = messages_error_body,
};
