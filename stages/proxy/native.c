/*
 * native.c: the Responses and Messages APIs passed through to an upstream that serves them
 * itself (--upstream-native). Owns what capture adds to the agent's request there, the
 * reading of token ids, logprobs, usage and the finish off the upstream's native answer
 * (whole, or the events of a stream), and the removal of the additions from what the agent
 * gets, so that it sees what a plain server of its API sends.
 *
 * The token ids come the way vLLM's Responses API returns them (arclight serve does the
 * same): "enable_response_messages": true makes the Response carry "input_messages" and
 * "output_messages", lists of {"type": "raw_message_tokens", "message", "tokens"} (the
 * rendered prompt and the generated text, as text and ids); "include":
 * ["message.output_text.logprobs"] puts each output_text's logprobs on it (and on its
 * deltas). vLLM gives logprobs on output_text only: an answer that is only a function call
 * has token ids but no logprobs. vLLM's Messages API (/v1/messages) returns no token ids at
 * all: such a span records none, and says so in the log (credit dead-letters it).
 */
#include "proxy.h"

#include "core/log.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#define COMP "proxy"

static const char k_lp_include[] = "message.output_text.logprobs";

static void ids_into(json_t *msgs, ivec *out)
{
    size_t i, j;
    json_t *m, *t;
    out->n = 0;
    json_array_foreach(msgs, i, m)
    {
        json_array_foreach(json_object_get(m, "tokens"), j, t)
        {
            if (!json_is_integer(t)) continue;
            json_int_t v = json_integer_value(t);
            if (v < 0 || v > INT32_MAX) continue;
            if (al_vec_push(out, (int32_t)v) != 0) return;
        }
    }
}

static void lp_push(fvec *a, double d)
{
    (void)al_vec_push(a, d > 3.0e38 ? 3.0e38f : d < -3.0e38 ? -3.0e38f : (float)d);
}

static int64_t count_of(json_t *o, const char *k)
{
    json_t *v = json_object_get(o, k);
    return json_is_integer(v) && json_integer_value(v) >= 0 ? (int64_t)json_integer_value(v) : 0;
}

static void set_finish(call *k, const char *f)
{
    free(k->finish);
    k->finish = f ? strdup(f) : NULL;
}

/* Reads what training needs off a Response object (the whole answer, or that of
 * response.completed / incomplete / failed). */
static void capture_response(call *k, json_t *r)
{
    ids_into(json_object_get(r, "input_messages"), &k->prompt);
    ids_into(json_object_get(r, "output_messages"), &k->resp_ids);
    k->lps.n = 0;
    int calls = 0;
    size_t i, j, l;
    json_t *it, *p, *e;
    json_array_foreach(json_object_get(r, "output"), i, it)
    {
        const char *ty = json_string_value(json_object_get(it, "type"));
        if (ty && (!strcmp(ty, "function_call") || !strcmp(ty, "custom_tool_call"))) calls = 1;
        json_array_foreach(json_object_get(it, "content"), j, p)
        {
            json_array_foreach(json_object_get(p, "logprobs"), l, e)
            {
                json_t *v = json_object_get(e, "logprob");
                if (json_is_number(v)) lp_push(&k->lps, json_number_value(v));
            }
        }
    }
    json_t *u = json_object_get(r, "usage");
    if (json_is_object(u)) {
        k->usage.prompt_tokens = count_of(u, "input_tokens");
        k->usage.completion_tokens = count_of(u, "output_tokens");
        k->usage.total_tokens = count_of(u, "total_tokens");
        k->usage.cached_tokens = count_of(json_object_get(u, "input_tokens_details"),
                                          "cached_tokens");
        k->have_usage = 1;
    }
    const char *st = json_string_value(json_object_get(r, "status"));
    set_finish(k, !st                           ? NULL
                  : !strcmp(st, "incomplete")   ? "length"
                  : !strcmp(st, "completed")    ? (calls ? "tool_calls" : "stop")
                                                : st);
    if (st && !strcmp(st, "failed") && !k->error) {
        const char *m = json_string_value(json_object_get(json_object_get(r, "error"), "message"));
        k->error = strdup(m ? m : "the upstream's response failed");
    }
}

/* Anthropic's message object, or the usage and stop of its stream's events. */
static void capture_message(call *k, json_t *m)
{
    json_t *u = json_object_get(m, "usage");
    if (json_is_object(u)) {
        if (json_object_get(u, "input_tokens"))
            k->usage.prompt_tokens = count_of(u, "input_tokens");
        if (json_object_get(u, "output_tokens"))
            k->usage.completion_tokens = count_of(u, "output_tokens");
        k->usage.total_tokens = k->usage.prompt_tokens + k->usage.completion_tokens;
        k->have_usage = 1;
    }
    const char *sr = json_string_value(json_object_get(m, "stop_reason"));
    if (sr)
        set_finish(k, !strcmp(sr, "max_tokens") ? "length"
                      : !strcmp(sr, "tool_use") ? "tool_calls"
                                                : "stop");
}

/* Appends the string b to dst's string member k (made when absent). */
static void append_str(json_t *dst, const char *k, json_t *b)
{
    json_t *a = json_object_get(dst, k);
    if (!json_is_string(b)) return;
    size_t al = json_is_string(a) ? json_string_length(a) : 0, bl = json_string_length(b);
    char *t = malloc(al + bl + 1);
    if (!t) return;
    if (al) memcpy(t, json_string_value(a), al);
    memcpy(t + al, json_string_value(b), bl);
    json_object_set_new(dst, k, json_stringn(t, al + bl));
    free(t);
}

/* One event of a Messages stream into the message the agent has at its end (k->nat_msg),
 * which the span keeps: message_start's message, each block as it starts, its deltas
 * added, message_delta's stop and usage. */
static void message_event(call *k, const char *ty, json_t *o)
{
    if (!strcmp(ty, "message_start")) {
        json_decref(k->nat_msg);
        k->nat_msg = json_deep_copy(json_object_get(o, "message"));
        if (k->nat_msg && !json_is_array(json_object_get(k->nat_msg, "content")))
            json_object_set_new(k->nat_msg, "content", json_array());
        return;
    }
    if (!json_is_object(k->nat_msg)) return;
    json_t *content = json_object_get(k->nat_msg, "content");
    json_t *i = json_object_get(o, "index");
    json_t *blk = json_is_integer(i) ? json_array_get(content, (size_t)json_integer_value(i)) : NULL;
    if (!strcmp(ty, "content_block_start")) {
        json_t *cb = json_object_get(o, "content_block");
        if (json_is_object(cb)) json_array_append_new(content, json_deep_copy(cb));
    } else if (!strcmp(ty, "content_block_delta") && json_is_object(blk)) {
        json_t *d = json_object_get(o, "delta");
        const char *dt = json_string_value(json_object_get(d, "type"));
        if (!dt) return;
        if (!strcmp(dt, "text_delta")) append_str(blk, "text", json_object_get(d, "text"));
        if (!strcmp(dt, "thinking_delta"))
            append_str(blk, "thinking", json_object_get(d, "thinking"));
        if (!strcmp(dt, "signature_delta"))
            append_str(blk, "signature", json_object_get(d, "signature"));
        /* a tool call's input comes as pieces of JSON text, parsed at the block's end */
        if (!strcmp(dt, "input_json_delta"))
            append_str(blk, "input_json", json_object_get(d, "partial_json"));
    } else if (!strcmp(ty, "content_block_stop") && json_is_object(blk)) {
        json_t *acc = json_object_get(blk, "input_json");
        if (json_is_string(acc)) { /* a tool call's input, whole */
            json_t *in = json_loadb(json_string_value(acc), json_string_length(acc), JSON_ALLOW_NUL,
                                    NULL);
            if (json_is_object(in)) json_object_set_new(blk, "input", in);
            else json_decref(in);
            json_object_del(blk, "input_json");
        }
    } else if (!strcmp(ty, "message_delta")) {
        json_t *d = json_object_get(o, "delta"), *u = json_object_get(o, "usage");
        if (json_is_object(d)) json_object_update(k->nat_msg, d);
        json_t *mu = json_object_get(k->nat_msg, "usage");
        if (json_is_object(u) && json_is_object(mu)) json_object_update(mu, u);
    } else if (!strcmp(ty, "message_stop")) {
        free(k->agent_answer);
        k->agent_answer = json_dumps(k->nat_msg, JSON_COMPACT | JSON_PRESERVE_ORDER);
    }
}

/* An output_text part the agent did not ask logprobs for: an empty list, as a server sends
 * without the include. 1 when changed. */
static int strip_part(call *k, json_t *p)
{
    json_t *lp = json_object_get(p, "logprobs");
    if (k->nat_lps || !json_is_array(lp) || !json_array_size(lp)) return 0;
    json_object_set_new(p, "logprobs", json_array());
    return 1;
}

static int strip_item(call *k, json_t *it)
{
    int ch = 0;
    size_t i;
    json_t *p;
    json_array_foreach(json_object_get(it, "content"), i, p) ch |= strip_part(k, p);
    return ch;
}

static int strip_response(call *k, json_t *r)
{
    int ch = 0;
    if (!k->nat_msgs) {
        ch |= json_object_del(r, "input_messages") == 0;
        ch |= json_object_del(r, "output_messages") == 0;
    }
    size_t i;
    json_t *it;
    json_array_foreach(json_object_get(r, "output"), i, it) ch |= strip_item(k, it);
    return ch;
}

/* One event of a Responses stream as the agent gets it. 1 when changed. */
static int strip_event(call *k, json_t *ev)
{
    int ch = 0;
    json_t *r = json_object_get(ev, "response"), *it = json_object_get(ev, "item"),
           *p = json_object_get(ev, "part");
    if (json_is_object(r)) ch |= strip_response(k, r);
    if (json_is_object(it)) ch |= strip_item(k, it);
    if (json_is_object(p)) ch |= strip_part(k, p);
    const char *ty = json_string_value(json_object_get(ev, "type"));
    if (ty && (!strcmp(ty, "response.output_text.delta") ||
               !strcmp(ty, "response.output_text.done")))
        ch |= strip_part(k, ev);
    return ch;
}

char *px_native_request(call *k, json_t *req)
{
    k->stream = json_is_true(json_object_get(req, "stream"));
    const char *m = json_string_value(json_object_get(req, "model"));
    if (m) k->model = strdup(m);
    if (k->api == AL_API_RESPONSES) {
        k->nat_msgs = json_is_true(json_object_get(req, "enable_response_messages"));
        if (!k->nat_msgs) json_object_set_new(req, "enable_response_messages", json_true());
        json_t *inc = json_object_get(req, "include"), *v;
        if (!inc || json_is_null(inc)) {
            inc = json_array();
            json_object_set_new(req, "include", inc);
        }
        /* an include of the wrong type goes upstream as the agent wrote it (its 400) */
        size_t i;
        json_array_foreach(inc, i, v)
        {
            const char *s = json_string_value(v);
            if (s && !strcmp(s, k_lp_include)) k->nat_lps = 1;
        }
        if (!k->nat_lps && json_is_array(inc)) json_array_append_new(inc, json_string(k_lp_include));
    }
    /* a held-out evaluation samples the way the evaluator says, whatever the agent asked */
    if (k->id.eval) json_object_set_new(req, "temperature", json_real(k->id.eval_temperature));
    return json_dumps(req, JSON_COMPACT | JSON_PRESERVE_ORDER);
}

int px_native_answer(call *k, al_slice *agent)
{
    const char *body = (const char *)k->body.data;
    size_t n = k->body.len;
    json_t *o = json_loadb(body ? body : "", n, JSON_ALLOW_NUL, NULL);
    char *mine = NULL;
    if (!json_is_object(o)) {
        k->error = strdup("the upstream answered with a body that is not a JSON object");
    } else if (k->api == AL_API_RESPONSES) {
        capture_response(k, o);
        if (strip_response(k, o)) mine = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
    } else {
        capture_message(k, o);
    }
    json_decref(o);
    free(k->agent_answer);
    k->agent_answer = mine ? mine : malloc(n + 1);
    if (!mine && k->agent_answer) {
        if (n) memcpy(k->agent_answer, body, n);
        k->agent_answer[n] = '\0';
    }
    *agent = mine ? (al_slice){mine, strlen(mine)} : (al_slice){body ? body : "", n};
    return (int)k->status;
}

int px_native_event(call *k, const char *ev, size_t evlen, size_t sep, char **out,
                    size_t *outlen)
{
    /* the data line: "data:" at the start of a line */
    const char *d = NULL, *end = ev + evlen;
    for (const char *l = ev; l < end;) {
        const char *nl = memchr(l, '\n', (size_t)(end - l));
        const char *le = nl ? nl : end;
        if (le - l >= 5 && !memcmp(l, "data:", 5)) {
            d = l;
            end = le;
            break;
        }
        l = nl ? nl + 1 : end;
    }
    json_t *o = NULL;
    const char *j = NULL, *jend = NULL;
    if (d) {
        j = d + 5;
        if (j < end && *j == ' ') j++;
        jend = end > j && end[-1] == '\r' ? end - 1 : end;
        o = json_loadb(j, (size_t)(jend - j), JSON_ALLOW_NUL, NULL);
    }
    char *mine = NULL;
    if (json_is_object(o)) {
        const char *ty = json_string_value(json_object_get(o, "type"));
        if (!k->first_token_us && ty &&
            (strstr(ty, ".delta") || !strcmp(ty, "content_block_delta")))
            k->first_token_us = al_now_us();
        if (k->api == AL_API_RESPONSES) {
            json_t *r = json_object_get(o, "response");
            int last = ty && (!strcmp(ty, "response.completed") ||
                              !strcmp(ty, "response.incomplete") ||
                              !strcmp(ty, "response.failed"));
            if (last && json_is_object(r)) capture_response(k, r);
            if (strip_event(k, o)) mine = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
            if (last && json_is_object(r)) {
                free(k->agent_answer);
                k->agent_answer = json_dumps(r, JSON_COMPACT | JSON_PRESERVE_ORDER);
            }
        } else {
            if (ty) message_event(k, ty, o);
            json_t *msg = json_object_get(o, "message");
            if (json_is_object(msg)) capture_message(k, msg);
            json_t *delta = json_object_get(o, "delta");
            if (json_is_object(delta)) capture_message(k, delta);
            if (json_is_object(json_object_get(o, "usage")) && !json_is_object(msg))
                capture_message(k, o);
        }
    }
    json_decref(o);
    if (!mine) return 0;
    /* the event's other lines as they were, its data line with the agent's copy */
    size_t pre = (size_t)(j - ev), ml = strlen(mine), post = (size_t)(ev + evlen - jend) + sep;
    char *o2 = malloc(pre + ml + post);
    if (o2) {
        memcpy(o2, ev, pre);
        memcpy(o2 + pre, mine, ml);
        memcpy(o2 + pre + ml, jend, post);
        *out = o2;
        *outlen = pre + ml + post;
    }
    free(mine);
    return o2 ? 1 : -1;
}

void px_native_check(call *k)
{
    if (k->status < 200 || k->status >= 300 || (k->prompt.n && k->resp_ids.n)) return;
    al_log_warn(COMP,
                "rollout %s call %" PRId64 ": the upstream's native %s answer carries no %s "
                "token ids; the span records none (credit dead-letters it). %s",
                k->id.rollout, k->seq, k->api == AL_API_RESPONSES ? "/v1/responses" : "/v1/messages",
                k->prompt.n ? "response" : k->resp_ids.n ? "prompt" : "prompt or response",
                k->api == AL_API_RESPONSES
                    ? "Does it honour \"enable_response_messages\" (vLLM's and arclight serve's "
                      "input_messages/output_messages)?"
                    : "vLLM's Messages API returns none: leave messages out of "
                      "--upstream-native to have it translated to chat completions.");
}
