/*
 * request.c: from the bytes of a request body to a checked generation request (request.h).
 * Everything here faces the network: fuzzed by tests/fuzz/fuzz_serve_request.c.
 */
#include "request.h"

#include "api/translate.h"
#include "core/vec.h"
#include "model/infer.h"

#include <inttypes.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void al_serve_request_free(al_serve_request *p)
{
    al_token_ids_free(&p->prompt);
    for (int i = 0; i < p->nstop; i++)
        free(p->stop[i]);
    free(p->stop);
    free(p->stop_ids);
    memset(p, 0, sizeof *p);
}

/* A number field: 1 and *out when present, 0 when absent or null, -1 when the wrong type. */
static int get_num(json_t *o, const char *k, double *out)
{
    json_t *v = json_object_get(o, k);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_number(v)) return -1;
    *out = json_number_value(v);
    return 1;
}
static int get_int(json_t *o, const char *k, int64_t *out)
{
    json_t *v = json_object_get(o, k);
    if (!v || json_is_null(v)) return 0;
    if (json_is_integer(v)) {
        *out = json_integer_value(v);
        return 1;
    }
    /* a whole real within the int64 range (casting one outside it is undefined) */
    double d = json_real_value(v); /* 0 when v is not a real */
    if (!json_is_real(v) || !(d >= -0x1p63 && d < 0x1p63 && d == floor(d))) return -1;
    *out = (int64_t)d;
    return 1;
}
static int get_bool(json_t *o, const char *k, int *out)
{
    json_t *v = json_object_get(o, k);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_boolean(v)) return -1;
    *out = json_is_true(v);
    return 1;
}

/* How many bytes of s to quote in a message, at most max, without cutting a UTF-8 sequence. */
static int utf8_prefix(const char *s, size_t max)
{
    size_t n = strlen(s);
    if (n <= max) return (int)n;
    size_t k = max;
    while (k > 0 && k + 3 > max && ((unsigned char)s[k] & 0xc0) == 0x80)
        k--;
    return (int)k;
}

/* The value of a string that must not hold NUL bytes (a name, a role, a stop string), or
 * NULL when v is not a string or holds one. NUL is text only in what a model generated and
 * gets back (content, reasoning, prompts): there it keeps its length. */
static const char *str_value(json_t *v)
{
    const char *s = json_string_value(v);
    return s && strlen(s) == json_string_length(v) ? s : NULL;
}

#define BAD(param, ...)                                                                            \
    do {                                                                                           \
        snprintf(err, errlen, __VA_ARGS__);                                                        \
        *bad_param = param;                                                                        \
        return -1;                                                                                 \
    } while (0)

/* The sampling fields shared by both endpoints. 0, or -1 with err and the field. */
static int parse_sampling(const al_serve_parse_ctx *sc, json_t *body, al_serve_request *p, int chat,
                          char *err, size_t errlen, const char **bad_param)
{
    int64_t iv;
    double dv;
    int r;
    p->max_tokens = -1, p->temperature = 1, p->top_p = 1, p->top_k = -1, p->n = 1;
    const char *mt = chat && json_object_get(body, "max_completion_tokens")
                         ? "max_completion_tokens"
                         : "max_tokens";
    if ((r = get_int(body, mt, &iv)) < 0) BAD(mt, "%s must be an integer", mt);
    if (r && iv < 1) BAD(mt, "%s must be at least 1, got %" PRId64, mt, iv);
    if (r) p->max_tokens = iv > INT_MAX / 2 ? INT_MAX / 2 : (int)iv;
    if ((r = get_num(body, "temperature", &dv)) < 0)
        BAD("temperature", "temperature must be a number");
    if (r) p->temperature = dv;
    if ((r = get_num(body, "top_p", &dv)) < 0) BAD("top_p", "top_p must be a number");
    if (r) p->top_p = dv;
    if ((r = get_int(body, "top_k", &iv)) < 0) BAD("top_k", "top_k must be an integer");
    if (r) {
        if (iv == 0) iv = -1; /* vLLM: 0 disables too */
        if (iv < -1 || iv > INT_MAX)
            BAD("top_k", "top_k must be -1 (disable) or at least 1, got %" PRId64, iv);
        p->top_k = (int)iv;
    }
    al_infer_sampling s = {p->temperature, p->top_p, p->top_k};
    if (al_infer_sampling_check(&s, err, errlen) != 0) {
        *bad_param = !(p->temperature >= 0 && p->temperature <= 2) ? "temperature"
                     : !(p->top_p > 0 && p->top_p <= 1)            ? "top_p"
                                                                   : "top_k";
        return -1;
    }
    /* What would change the sampling distribution without showing in the logprobs is
     * refused rather than ignored: the trainer's importance ratios rely on the sampler
     * being exactly softmax(logits / T) restricted by top_k / top_p. */
    static const char *const neutral0[] = {"presence_penalty", "frequency_penalty", "min_p",
                                           "min_tokens", NULL};
    for (int i = 0; neutral0[i]; i++)
        if ((r = get_num(body, neutral0[i], &dv)) != 0 && (r < 0 || dv != 0))
            BAD(neutral0[i], "%s is not supported by this server (only 0)", neutral0[i]);
    if ((r = get_num(body, "repetition_penalty", &dv)) != 0 && (r < 0 || dv != 1))
        BAD("repetition_penalty", "repetition_penalty is not supported by this server (only 1)");
    json_t *lb = json_object_get(body, "logit_bias");
    if (lb && !json_is_null(lb) && !(json_is_object(lb) && json_object_size(lb) == 0))
        BAD("logit_bias", "logit_bias is not supported by this server");
    if ((r = get_int(body, "best_of", &iv)) != 0 && (r < 0 || iv != 1))
        BAD("best_of", "best_of is not supported by this server (only 1)");
    int echo = 0;
    if (get_bool(body, "echo", &echo) < 0 || echo)
        BAD("echo", "echo is not supported by this server");
    json_t *rf = json_object_get(body, "response_format");
    if (rf && !json_is_null(rf) &&
        strcmp(str_value(json_object_get(rf, "type")) ?: "", "text") != 0)
        BAD("response_format", "response_format other than {\"type\": \"text\"} is not supported");
    if ((r = get_int(body, "n", &iv)) < 0) BAD("n", "n must be an integer");
    if (r && (iv < 1 || iv > AL_SERVE_MAX_N))
        BAD("n", "n must be between 1 and %d, got %" PRId64, AL_SERVE_MAX_N, iv);
    if (r) p->n = (int)iv;
    if ((r = get_int(body, "seed", &iv)) < 0) BAD("seed", "seed must be an integer");
    if (r) p->has_seed = 1, p->seed = (uint64_t)iv;
    if (get_bool(body, "ignore_eos", &p->ignore_eos) < 0)
        BAD("ignore_eos", "ignore_eos must be a boolean");
    json_t *st = json_object_get(body, "stop");
    if (st && !json_is_null(st)) {
        if (json_is_string(st)) {
            if (!str_value(st)) BAD("stop", "stop strings must not hold NUL bytes");
            p->stop = calloc(1, sizeof *p->stop);
            p->stop[0] = strdup(json_string_value(st));
            p->nstop = 1;
        } else if (json_is_array(st)) {
            size_t n = json_array_size(st);
            if (n > 16) BAD("stop", "at most 16 stop strings, got %zu", n);
            p->stop = calloc(n + 1, sizeof *p->stop);
            for (size_t i = 0; i < n; i++) {
                json_t *e = json_array_get(st, i);
                if (!json_is_string(e)) BAD("stop", "stop must be a string or an array of strings");
                if (!str_value(e)) BAD("stop", "stop strings must not hold NUL bytes");
                p->stop[p->nstop++] = strdup(json_string_value(e));
            }
        } else {
            BAD("stop", "stop must be a string or an array of strings");
        }
        for (int i = 0; i < p->nstop; i++)
            if (!*p->stop[i]) BAD("stop", "stop strings must not be empty");
    }
    json_t *sti = json_object_get(body, "stop_token_ids");
    if (sti && !json_is_null(sti)) {
        if (!json_is_array(sti))
            BAD("stop_token_ids", "stop_token_ids must be an array of token ids");
        size_t n = json_array_size(sti);
        p->stop_ids = malloc(sizeof(int32_t) * (n + 1));
        for (size_t i = 0; i < n; i++) {
            json_t *e = json_array_get(sti, i);
            if (!json_is_integer(e) || json_integer_value(e) < 0 ||
                json_integer_value(e) >= sc->vocab_size)
                BAD("stop_token_ids", "stop_token_ids[%zu] is not a token id of this model", i);
            p->stop_ids[p->nstop_ids++] = (int32_t)json_integer_value(e);
        }
    }
    /* logprobs: chat has a boolean and top_logprobs; completions an integer (top count) */
    if (chat) {
        if (get_bool(body, "logprobs", &p->logprobs) < 0)
            BAD("logprobs", "logprobs must be a boolean");
        if ((r = get_int(body, "top_logprobs", &iv)) < 0)
            BAD("top_logprobs", "top_logprobs must be an integer");
        if (r) {
            if (iv < 0 || iv > AL_SERVE_MAX_TOP_LOGPROBS)
                BAD("top_logprobs", "top_logprobs must be between 0 and %d, got %" PRId64,
                    AL_SERVE_MAX_TOP_LOGPROBS, iv);
            if (!p->logprobs && iv > 0)
                BAD("top_logprobs", "top_logprobs needs logprobs set to true");
            p->top_logprobs = (int)iv;
        }
    } else {
        if ((r = get_int(body, "logprobs", &iv)) < 0)
            BAD("logprobs", "logprobs must be an integer");
        if (r) {
            if (iv < 0 || iv > AL_SERVE_MAX_TOP_LOGPROBS)
                BAD("logprobs", "logprobs must be between 0 and %d, got %" PRId64,
                    AL_SERVE_MAX_TOP_LOGPROBS, iv);
            p->logprobs = 1, p->top_logprobs = (int)iv;
        }
    }
    return 0;
}

/* Message i of a chat request (o) into *mi: its role, its content (malloc'd, appended to
 * owned), its reasoning and its tool calls (appended to calls, their arguments written out
 * appended to args_owned; *nown and *ncalls count what the caller frees). 0, or -1 with err. */
static int parse_chat_message(json_t *o, size_t i, al_chat_message *mi, char **owned, size_t *nown,
                              al_chat_tool_call *calls, char **args_owned, size_t *ncalls,
                              char *err, size_t errlen)
{
    if (!json_is_object(o)) {
        snprintf(err, errlen, "messages[%zu] must be an object", i);
        return -1;
    }
    const char *role = str_value(json_object_get(o, "role"));
    if (!role) {
        snprintf(err, errlen,
                 json_is_string(json_object_get(o, "role"))
                     ? "messages[%zu].role holds a NUL byte"
                     : "messages[%zu].role is missing",
                 i);
        return -1;
    }
    if (!strcmp(role, "system") || !strcmp(role, "developer"))
        mi->role = AL_CHAT_SYSTEM;
    else if (!strcmp(role, "user"))
        mi->role = AL_CHAT_USER;
    else if (!strcmp(role, "assistant"))
        mi->role = AL_CHAT_ASSISTANT;
    else if (!strcmp(role, "tool"))
        mi->role = AL_CHAT_TOOL;
    else {
        snprintf(err, errlen,
                 "messages[%zu].role '%s' is not one of system, user, assistant, tool", i,
                 role);
        return -1;
    }
    char *text;
    size_t text_len;
    if (al_api_content_text(json_object_get(o, "content"), NULL, &text, &text_len) != 0) {
        snprintf(err, errlen,
                 "messages[%zu].content must be a string or an array of text parts", i);
        return -1;
    }
    owned[(*nown)++] = text;
    mi->content = text, mi->content_len = text_len;
    json_t *rc_ = json_object_get(o, "reasoning_content");
    if (json_is_string(rc_)) {
        mi->reasoning_content = json_string_value(rc_);
        mi->reasoning_len = json_string_length(rc_);
    }
    json_t *tc = json_object_get(o, "tool_calls");
    if (tc && !json_is_null(tc)) {
        if (!json_is_array(tc)) {
            snprintf(err, errlen, "messages[%zu].tool_calls must be an array", i);
            return -1;
        }
        mi->tool_calls = calls + *ncalls;
        size_t j;
        json_t *c;
        json_array_foreach(tc, j, c)
        {
            json_t *fn = json_object_get(c, "function");
            const char *name = str_value(json_object_get(fn, "name"));
            json_t *args = json_object_get(fn, "arguments");
            if (!name || !(str_value(args) || json_is_object(args))) {
                snprintf(
                    err, errlen,
                    "messages[%zu].tool_calls[%zu] needs function.name and function.arguments",
                    i, j);
                return -1;
            }
            calls[*ncalls].name = name;
            if (json_is_string(args)) {
                calls[*ncalls].arguments = json_string_value(args);
            } else {
                args_owned[*ncalls] = json_dumps(args, JSON_COMPACT | JSON_ENSURE_ASCII);
                calls[*ncalls].arguments = args_owned[*ncalls];
            }
            (*ncalls)++;
            mi->n_tool_calls++;
        }
    }
    return 0;
}

/* Renders the chat request's messages and tools to prompt ids. 0, or -1 with err. */
static int parse_chat_prompt(const al_serve_parse_ctx *sc, json_t *body, al_serve_request *p,
                             int *has_tools, char *err, size_t errlen, const char **bad_param)
{
    json_t *msgs = json_object_get(body, "messages");
    if (!json_is_array(msgs) || json_array_size(msgs) == 0)
        BAD("messages", "messages must be a non-empty array");
    size_t nm = json_array_size(msgs);
    al_chat_message *m = calloc(nm, sizeof *m);
    char **owned = calloc(nm * 2, sizeof *owned);
    size_t nown = 0, ntc_total = 0;
    for (size_t i = 0; i < nm; i++) {
        json_t *tc = json_object_get(json_array_get(msgs, i), "tool_calls");
        if (json_is_array(tc)) ntc_total += json_array_size(tc);
    }
    al_chat_tool_call *calls = calloc(ntc_total + 1, sizeof *calls);
    char **args_owned = calloc(ntc_total + 1, sizeof *args_owned);
    size_t ncalls = 0;
    const char **tools = NULL;
    char **tools_owned = NULL;
    size_t ntools = 0;
    int rc = -1;
    for (size_t i = 0; i < nm; i++)
        if (parse_chat_message(json_array_get(msgs, i), i, &m[i], owned, &nown, calls, args_owned,
                               &ncalls, err, errlen) != 0)
            goto out;
    json_t *tl = json_object_get(body, "tools");
    const char *tool_choice = str_value(json_object_get(body, "tool_choice"));
    if (tl && !json_is_null(tl)) {
        if (!json_is_array(tl)) {
            snprintf(err, errlen, "tools must be an array");
            *bad_param = "tools";
            goto out;
        }
        ntools = json_array_size(tl);
        tools = calloc(ntools + 1, sizeof *tools);
        tools_owned = calloc(ntools + 1, sizeof *tools_owned);
        for (size_t i = 0; i < ntools; i++) {
            json_t *t = json_array_get(tl, i);
            if (!json_is_object(t) ||
                !json_is_string(json_object_get(json_object_get(t, "function"), "name"))) {
                snprintf(
                    err, errlen,
                    "tools[%zu] must be {\"type\": \"function\", \"function\": {\"name\": ...}}",
                    i);
                *bad_param = "tools";
                goto out;
            }
            tools_owned[i] = json_dumps(t, JSON_COMPACT | JSON_PRESERVE_ORDER);
            tools[i] = tools_owned[i];
        }
        *has_tools = ntools > 0 && !(tool_choice && !strcmp(tool_choice, "none"));
    }
    int thinking = 1;
    json_t *kw = json_object_get(body, "chat_template_kwargs");
    if (json_is_object(kw) && json_is_boolean(json_object_get(kw, "enable_thinking")))
        thinking = json_is_true(json_object_get(kw, "enable_thinking"));
    int agp = 1;
    if (json_is_boolean(json_object_get(body, "add_generation_prompt")))
        agp = json_is_true(json_object_get(body, "add_generation_prompt"));
    al_chat_request cr = {.messages = m,
                          .n_messages = nm,
                          .tools = tools,
                          .n_tools = tools ? ntools : 0,
                          .add_generation_prompt = agp,
                          .enable_thinking = thinking};
    if (al_chat_encode(sc->tok, &cr, &p->prompt, err, errlen) != 0) {
        *bad_param = "messages";
        goto out;
    }
    rc = 0;
out:
    if (rc && !*bad_param) *bad_param = "messages";
    for (size_t i = 0; i < nown; i++)
        free(owned[i]);
    for (size_t i = 0; i < ncalls; i++)
        free(args_owned[i]);
    for (size_t i = 0; i < ntools && tools_owned; i++)
        free(tools_owned[i]);
    free(tools_owned);
    free(tools);
    free(args_owned);
    free(calls);
    free(owned);
    free(m);
    return rc;
}

static int parse_completion_prompt(const al_serve_parse_ctx *sc, json_t *body, al_serve_request *p,
                                   char *err, size_t errlen, const char **bad_param)
{
    json_t *pr = json_object_get(body, "prompt");
    if (json_is_array(pr) && json_array_size(pr) == 1 && json_is_string(json_array_get(pr, 0)))
        pr = json_array_get(pr, 0);
    if (json_is_string(pr)) {
        if (al_tokenizer_encode(sc->tok, json_string_value(pr), json_string_length(pr), 0,
                                &p->prompt))
            BAD("prompt", "out of memory");
    } else if (json_is_array(pr) && json_array_size(pr) > 0 &&
               json_is_integer(json_array_get(pr, 0))) {
        size_t i;
        json_t *e;
        json_array_foreach(pr, i, e)
        {
            if (!json_is_integer(e) || json_integer_value(e) < 0 ||
                json_integer_value(e) >= sc->vocab_size)
                BAD("prompt", "prompt[%zu] is not a token id of this model (0..%d)", i,
                    sc->vocab_size - 1);
            int32_t id = (int32_t)json_integer_value(e);
            if (al_vec_grow((void **)&p->prompt.ids, &p->prompt.cap, p->prompt.len + 1,
                            sizeof *p->prompt.ids) != 0)
                BAD("prompt", "out of memory");
            p->prompt.ids[p->prompt.len++] = id;
        }
    } else if (json_is_array(pr) && json_array_size(pr) > 1) {
        BAD("prompt", "one prompt per request: send a string or an array of token ids");
    } else {
        BAD("prompt", "prompt must be a non-empty string or array of token ids");
    }
    if (p->prompt.len == 0) BAD("prompt", "the prompt is empty");
    return 0;
}

int al_serve_request_parse(const al_serve_parse_ctx *sc, int chat, const char *body, size_t len,
                           al_serve_request *p, al_serve_error *e)
{
    memset(p, 0, sizeof *p);
    e->status = 400, e->param = NULL, e->message[0] = 0;
    char *err = e->message;
    size_t errlen = sizeof e->message;
    const char *bad = NULL;
    p->chat = chat;
    if (len == 0) {
        snprintf(err, errlen, "the request body is empty; send a JSON object");
        return -1;
    }
    json_error_t je;
    /* NUL is allowed: serve writes the text of a NUL token as \u0000 and must read it back */
    json_t *j = json_loadb(body, len, JSON_ALLOW_NUL, &je);
    if (!j) {
        snprintf(err, errlen, "the body is not valid JSON: %s (line %d, column %d)", je.text,
                 je.line, je.column);
        return -1;
    }
    if (!json_is_object(j)) {
        json_decref(j);
        snprintf(err, errlen, "the body must be a JSON object");
        return -1;
    }
    json_t *mj = json_object_get(j, "model");
    const char *model = str_value(mj);
    if (mj && !json_is_null(mj) && (!model || strcmp(model, sc->name) != 0)) {
        e->status = 404, e->param = "model";
        const char *shown = model                ? model
                            : json_is_string(mj) ? "(a name holding a NUL byte)"
                                                 : "(not a string)";
        snprintf(err, errlen, "The model `%.*s` does not exist.", utf8_prefix(shown, 200), shown);
        json_decref(j);
        return -1;
    }
    int rc = parse_sampling(sc, j, p, chat, err, errlen, &bad);
    if (!rc && get_bool(j, "stream", &p->stream) < 0)
        rc = -1, bad = "stream", snprintf(err, errlen, "stream must be a boolean");
    if (!rc && get_bool(j, "return_token_ids", &p->return_token_ids) < 0)
        rc = -1, bad = "return_token_ids",
        snprintf(err, errlen, "return_token_ids must be a boolean");
    json_t *so = json_object_get(j, "stream_options");
    if (!rc && json_is_object(so))
        p->include_usage = json_is_true(json_object_get(so, "include_usage"));
    if (!rc)
        rc = chat ? parse_chat_prompt(sc, j, p, &p->has_tools, err, errlen, &bad)
                  : parse_completion_prompt(sc, j, p, err, errlen, &bad);
    json_decref(j);
    if (rc) {
        e->param = bad;
        al_serve_request_free(p);
        return -1;
    }
    int np = (int)p->prompt.len;
    if (p->max_tokens < 0) p->max_tokens = chat ? sc->max_model_len - np : 16;
    if (p->max_tokens < 1 || np > sc->max_model_len - p->max_tokens) {
        const char *what = chat ? "messages" : "prompt";
        e->param = what;
        snprintf(err, errlen,
                 "This model's maximum context length is %d tokens. However, you requested %lld "
                 "tokens (%d in the %s, %d in the completion). Please reduce the length of the %s "
                 "or completion.",
                 sc->max_model_len, (long long)np + (p->max_tokens > 0 ? p->max_tokens : 1), np,
                 what, p->max_tokens, what);
        al_serve_request_free(p);
        return -1;
    }
    return 0;
}
