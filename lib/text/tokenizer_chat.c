/*
 * tokenizer_chat.c: ChatML prompts as Qwen2.5's and Qwen3's Jinja chat templates render
 * them, and <tool_call> parsing of generated text, for the serve stage.
 *
 * What is reproduced (checked against @huggingface/jinja rendering the real templates, see
 * tests/tokenizer/gen_expected.mjs and tests/t0703_tokenizer_chat.c):
 *   - system / user / assistant / tool messages; a first system message goes into the
 *     system block; a later one renders as its own turn;
 *   - tools: each tool's JSON re-serialized like the templates' `tojson` (Python's
 *     json.dumps: ", " and ": " separators, key order kept, non-ASCII kept) inside the
 *     <tools> block of the system message, with the templates' exact instructions text;
 *     Qwen2.5 adds its default system prompt when there is no system message;
 *   - assistant tool calls as <tool_call>\n{"name": ..., "arguments": ...}\n</tool_call>,
 *     arguments given as JSON text and rendered as the parsed object (what vLLM does
 *     after parsing OpenAI's arguments string); text that is not JSON renders as a JSON
 *     string (Qwen2.5) or verbatim (Qwen3), as the templates do with a string;
 *   - consecutive tool messages grouped in one user turn of <tool_response> blocks;
 *   - add_generation_prompt; Qwen3's enable_thinking=false (empty think block);
 *   - Qwen3's reasoning: reasoning_content, or <think>...</think> split out of the
 *     content, kept only for assistant turns after the last real user query;
 *     last_query_index skips user messages that are wrapped tool responses.
 * Not reproduced: arbitrary Jinja; multimodal content lists; tool calls given with
 * "function" wrappers is the caller's job (the struct holds name and arguments).
 * A NULL content renders as "" and NULL arguments as {}.
 */
#include "text/json.h"
#include "text/tokenizer.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------------------ */
/* JSON in Python's json.dumps layout                                                   */

static void py_quote(al_buf *b, const char *s, size_t len)
{
    al_buf_append(b, "\"", 1);
    size_t run = 0;
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c != '"' && c != '\\') continue;
        al_buf_append(b, s + run, i - run);
        run = i + 1;
        switch (c) {
        case '"':
            al_buf_append(b, "\\\"", 2);
            break;
        case '\\':
            al_buf_append(b, "\\\\", 2);
            break;
        case '\n':
            al_buf_append(b, "\\n", 2);
            break;
        case '\r':
            al_buf_append(b, "\\r", 2);
            break;
        case '\t':
            al_buf_append(b, "\\t", 2);
            break;
        case '\b':
            al_buf_append(b, "\\b", 2);
            break;
        case '\f':
            al_buf_append(b, "\\f", 2);
            break;
        default:
            al_buf_printf(b, "\\u%04x", c);
            break;
        }
    }
    al_buf_append(b, s + run, len - run);
    al_buf_append(b, "\"", 1);
}

/* The shortest text that reads back as the same double, as Python's repr picks it. */
static void py_number(al_buf *b, const al_json *v)
{
    if (v->is_integer) {
        al_buf_printf(b, "%lld", (long long)v->integer);
        return;
    }
    if (!isfinite(v->number)) {
        al_buf_append(b,
                           v->number != v->number ? "NaN"
                           : v->number > 0        ? "Infinity"
                                                  : "-Infinity",
                           v->number != v->number ? 3
                           : v->number > 0        ? 8
                                                  : 9);
        return;
    }
    char tmp[40];
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(tmp, sizeof tmp, "%.*g", prec, v->number);
        if (strtod(tmp, NULL) == v->number) break;
    }
    al_buf_append(b, tmp, strlen(tmp));
    if (!strpbrk(tmp, ".e")) al_buf_append(b, ".0", 2);
}

static void py_dump(al_buf *b, const al_json *v)
{
    switch (v->type) {
    case AL_JSON_NULL:
        al_buf_append(b, "null", 4);
        break;
    case AL_JSON_TRUE:
        al_buf_append(b, "true", 4);
        break;
    case AL_JSON_FALSE:
        al_buf_append(b, "false", 5);
        break;
    case AL_JSON_NUMBER:
        py_number(b, v);
        break;
    case AL_JSON_STRING:
        py_quote(b, v->string, v->string_len);
        break;
    case AL_JSON_ARRAY:
        al_buf_append(b, "[", 1);
        for (size_t i = 0; i < v->count; i++) {
            if (i) al_buf_append(b, ", ", 2);
            py_dump(b, v->items[i]);
        }
        al_buf_append(b, "]", 1);
        break;
    case AL_JSON_OBJECT:
        al_buf_append(b, "{", 1);
        for (size_t i = 0; i < v->count; i++) {
            if (i) al_buf_append(b, ", ", 2);
            py_quote(b, v->keys[i], v->key_lens[i]);
            al_buf_append(b, ": ", 2);
            py_dump(b, v->items[i]);
        }
        al_buf_append(b, "}", 1);
        break;
    }
}

int al_chat_json_pyformat(const char *json, size_t len, al_buf *out)
{
    al_json *v = al_json_parse(json, len, NULL, 0);
    if (!v) return -1;
    py_dump(out, v);
    al_json_free(v);
    return 0;
}

/* ------------------------------------------------------------------------------------ */
/* Rendering                                                                            */

static const char TOOLS_INTRO[] =
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>";
static const char TOOLS_OUTRO[] =
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments "
    "within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
    "<args-json-object>}\n</tool_call><|im_end|>\n";
static const char QWEN_DEFAULT_SYSTEM[] =
    "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.";

static const char *role_name(al_chat_role r)
{
    switch (r) {
    case AL_CHAT_SYSTEM:
        return "system";
    case AL_CHAT_USER:
        return "user";
    case AL_CHAT_ASSISTANT:
        return "assistant";
    case AL_CHAT_TOOL:
        return "tool";
    }
    return NULL;
}

static void put(al_buf *b, const char *s)
{
    al_buf_append(b, s ? s : "", s ? strlen(s) : 0);
}
static void putn(al_buf *b, const char *s, size_t n)
{
    al_buf_append(b, s, n);
}

/* A message's content and reasoning as (pointer, length): NUL bytes inside are text. */
static const char *msg_content(const al_chat_message *m, size_t *len)
{
    const char *c = m->content ? m->content : "";
    *len = m->content && m->content_len ? m->content_len : strlen(c);
    return c;
}

static void put_content(al_buf *b, const al_chat_message *m)
{
    size_t n;
    const char *c = msg_content(m, &n);
    putn(b, c, n);
}

static void render_tool_call(al_buf *b, const al_chat_tool_call *tc,
                             al_chat_template_kind kind)
{
    put(b, "<tool_call>\n{\"name\": \"");
    put(b, tc->name);
    put(b, "\", \"arguments\": ");
    const char *args = tc->arguments ? tc->arguments : "{}";
    if (al_chat_json_pyformat(args, strlen(args), b) != 0) {
        if (kind == AL_CHAT_TEMPLATE_QWEN3)
            put(b, args); /* `arguments is string` → verbatim */
        else
            py_quote(b, args, strlen(args)); /* `arguments | tojson` of a string */
    }
    put(b, "}\n</tool_call>");
}

static int render_tools(al_buf *b, const al_chat_request *req, al_chat_template_kind kind,
                        char *errstr, size_t errlen)
{
    const al_chat_message *first = &req->messages[0];
    put(b, "<|im_start|>system\n");
    if (kind == AL_CHAT_TEMPLATE_QWEN2_5) {
        if (first->role == AL_CHAT_SYSTEM)
            put_content(b, first);
        else
            put(b, QWEN_DEFAULT_SYSTEM);
        put(b, "\n\n");
    } else if (first->role == AL_CHAT_SYSTEM) {
        put_content(b, first);
        put(b, "\n\n");
    }
    put(b, TOOLS_INTRO);
    for (size_t i = 0; i < req->n_tools; i++) {
        put(b, "\n");
        const char *t = req->tools[i] ? req->tools[i] : "";
        if (al_chat_json_pyformat(t, strlen(t), b) != 0) {
            snprintf(errstr, errlen, "tools[%zu] is not valid JSON", i);
            return -1;
        }
    }
    put(b, TOOLS_OUTRO);
    return 0;
}

static int has_prefix(const char *s, size_t n, const char *p)
{
    size_t k = strlen(p);
    return n >= k && memcmp(s, p, k) == 0;
}

static int has_suffix(const char *s, size_t n, const char *p)
{
    size_t k = strlen(p);
    return n >= k && memcmp(s + n - k, p, k) == 0;
}

/* Returns the last occurrence of needle in s[0..n), or NULL. */
static const char *find_last(const char *s, size_t n, const char *needle)
{
    size_t k = strlen(needle);
    if (k > n) return NULL;
    for (size_t i = n - k + 1; i-- > 0;)
        if (memcmp(s + i, needle, k) == 0) return s + i;
    return NULL;
}

static const char *find_first(const char *s, size_t n, const char *needle)
{
    size_t k = strlen(needle);
    if (k > n) return NULL;
    for (size_t i = 0; i + k <= n; i++)
        if (memcmp(s + i, needle, k) == 0) return s + i;
    return NULL;
}

/* Qwen3's assistant turn: the think split and the last_query_index rule. */
static void render_qwen3_assistant(al_buf *b, const al_chat_message *m, int after_last_query,
                                   int is_last)
{
    size_t clen;
    const char *content = msg_content(m, &clen);
    const char *reasoning = "";
    size_t rlen = 0;
    if (m->reasoning_content) {
        reasoning = m->reasoning_content;
        rlen = m->reasoning_len ? m->reasoning_len : strlen(reasoning);
    } else if (find_first(content, clen, "</think>")) {
        /* content.split('</think>')[-1].lstrip('\n') */
        const char *last_end = find_last(content, clen, "</think>");
        const char *after = last_end + 8;
        size_t alen = clen - (size_t)(after - content);
        /* content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') */
        const char *first_end = find_first(content, clen, "</think>");
        size_t blen = (size_t)(first_end - content);
        while (blen && content[blen - 1] == '\n')
            blen--;
        const char *open = find_last(content, blen, "<think>");
        const char *r = open ? open + 7 : content;
        size_t r_len = blen - (size_t)(r - content);
        while (r_len && *r == '\n') {
            r++;
            r_len--;
        }
        while (alen && *after == '\n') {
            after++;
            alen--;
        }
        reasoning = r;
        rlen = r_len;
        content = after;
        clen = alen;
    }
    put(b, "<|im_start|>assistant\n");
    if (after_last_query && (is_last || rlen)) {
        /* reasoning_content.strip('\n') and content.lstrip('\n') */
        while (rlen && *reasoning == '\n') {
            reasoning++;
            rlen--;
        }
        while (rlen && reasoning[rlen - 1] == '\n')
            rlen--;
        const char *c = content;
        size_t cl = clen;
        while (cl && *c == '\n') {
            c++;
            cl--;
        }
        put(b, "<think>\n");
        putn(b, reasoning, rlen);
        put(b, "\n</think>\n\n");
        putn(b, c, cl);
    } else {
        putn(b, content, clen);
    }
    for (size_t j = 0; j < m->n_tool_calls; j++) {
        if ((j == 0 && clen) || j > 0) put(b, "\n");
        render_tool_call(b, &m->tool_calls[j], AL_CHAT_TEMPLATE_QWEN3);
    }
    put(b, "<|im_end|>\n");
}

char *al_chat_render(al_chat_template_kind kind, const al_chat_request *req, size_t *out_len,
                     char *errstr, size_t errlen)
{
    char dummy[8];
    if (!errstr || !errlen) {
        errstr = dummy;
        errlen = sizeof dummy;
    }
    if (kind != AL_CHAT_TEMPLATE_CHATML && kind != AL_CHAT_TEMPLATE_QWEN2_5 &&
        kind != AL_CHAT_TEMPLATE_QWEN3) {
        snprintf(errstr, errlen, "the tokenizer has no ChatML chat template to render");
        return NULL;
    }
    if (!req || req->n_messages == 0) {
        snprintf(errstr, errlen, "a conversation needs at least one message");
        return NULL;
    }
    for (size_t i = 0; i < req->n_messages; i++)
        if (!role_name(req->messages[i].role)) {
            snprintf(errstr, errlen, "messages[%zu]: unknown role %d", i,
                     (int)req->messages[i].role);
            return NULL;
        }
    const al_chat_message *msgs = req->messages;
    size_t n = req->n_messages;
    al_buf b = {0};
    put(&b, "");
    if (req->n_tools) {
        if (render_tools(&b, req, kind, errstr, errlen)) {
            free(b.data);
            return NULL;
        }
    } else if (msgs[0].role == AL_CHAT_SYSTEM) {
        put(&b, "<|im_start|>system\n");
        put_content(&b, &msgs[0]);
        put(&b, "<|im_end|>\n");
    } else if (kind == AL_CHAT_TEMPLATE_QWEN2_5) {
        put(&b, "<|im_start|>system\n");
        put(&b, QWEN_DEFAULT_SYSTEM);
        put(&b, "<|im_end|>\n");
    }
    /* Qwen3: the last user message that is not a wrapped tool response. */
    size_t last_query = n - 1;
    for (size_t i = n; i-- > 0;) {
        size_t cl;
        const char *c = msg_content(&msgs[i], &cl);
        if (msgs[i].role == AL_CHAT_USER &&
            !(has_prefix(c, cl, "<tool_response>") && has_suffix(c, cl, "</tool_response>"))) {
            last_query = i;
            break;
        }
    }
    for (size_t i = 0; i < n; i++) {
        const al_chat_message *m = &msgs[i];
        int plain = m->role == AL_CHAT_USER || (m->role == AL_CHAT_SYSTEM && i > 0) ||
                    (kind != AL_CHAT_TEMPLATE_QWEN3 && m->role == AL_CHAT_ASSISTANT &&
                     m->n_tool_calls == 0);
        if (plain) {
            put(&b, "<|im_start|>");
            put(&b, role_name(m->role));
            put(&b, "\n");
            put_content(&b, m);
            put(&b, "<|im_end|>\n");
        } else if (m->role == AL_CHAT_ASSISTANT && kind == AL_CHAT_TEMPLATE_QWEN3) {
            render_qwen3_assistant(&b, m, i > last_query, i == n - 1);
        } else if (m->role == AL_CHAT_ASSISTANT) {
            put(&b, "<|im_start|>assistant");
            size_t cl;
            const char *c = msg_content(m, &cl);
            if (cl) {
                put(&b, "\n");
                putn(&b, c, cl);
            }
            for (size_t j = 0; j < m->n_tool_calls; j++) {
                put(&b, "\n");
                render_tool_call(&b, &m->tool_calls[j], kind);
            }
            put(&b, "<|im_end|>\n");
        } else if (m->role == AL_CHAT_TOOL) {
            if (i == 0 || msgs[i - 1].role != AL_CHAT_TOOL) put(&b, "<|im_start|>user");
            put(&b, "\n<tool_response>\n");
            put_content(&b, m);
            put(&b, "\n</tool_response>");
            if (i == n - 1 || msgs[i + 1].role != AL_CHAT_TOOL) put(&b, "<|im_end|>\n");
        }
    }
    if (req->add_generation_prompt) {
        put(&b, "<|im_start|>assistant\n");
        if (kind == AL_CHAT_TEMPLATE_QWEN3 && req->enable_thinking == 0)
            put(&b, "<think>\n\n</think>\n\n");
    }
    if (b.oom) {
        free(b.data);
        snprintf(errstr, errlen, "out of memory rendering the chat template");
        return NULL;
    }
    if (out_len) *out_len = b.len;
    return b.data;
}

const char *al_chat_template_name(al_chat_template_kind kind)
{
    switch (kind) {
    case AL_CHAT_TEMPLATE_NONE:
        return "none";
    case AL_CHAT_TEMPLATE_CHATML:
        return "chatml";
    case AL_CHAT_TEMPLATE_QWEN2_5:
        return "qwen2.5";
    case AL_CHAT_TEMPLATE_QWEN3:
        return "qwen3";
    }
    return "none";
}

int al_chat_encode(const al_tokenizer *tok, const al_chat_request *req, al_token_ids *out,
                   char *errstr, size_t errlen)
{
    size_t len = 0;
    char *text = al_chat_render(al_tokenizer_chat_template(tok), req, &len, errstr, errlen);
    if (!text) return -1;
    int rc = al_tokenizer_encode(tok, text, len, AL_TOKENIZER_ALLOW_SPECIAL, out);
    free(text);
    if (rc && errstr && errlen) snprintf(errstr, errlen, "out of memory encoding the prompt");
    return rc;
}

/* ------------------------------------------------------------------------------------ */
/* Parsing generated text                                                               */

static int is_ws(char c)
{
    return c == ' ' || c == '\n' || c == '\r' || c == '\t';
}

static char *dup_n(const char *s, size_t n)
{
    char *d = malloc(n + 1);
    if (!d) return NULL;
    memcpy(d, s, n);
    d[n] = 0;
    return d;
}

/* Parses the JSON of one <tool_call> block into a call; 0 on success, 1 when the block is
 * not a tool call (stays text), -1 when memory ran out. */
static int parse_call(const char *s, size_t n, al_chat_parsed_call *call)
{
    while (n && is_ws(*s)) {
        s++;
        n--;
    }
    while (n && is_ws(s[n - 1]))
        n--;
    al_json *v = al_json_parse(s, n, NULL, 0);
    if (!v) return 1;
    const al_json *name = al_json_get(v, "name");
    if (v->type != AL_JSON_OBJECT || !name || name->type != AL_JSON_STRING) {
        al_json_free(v);
        return 1;
    }
    const al_json *args = al_json_get(v, "arguments");
    al_buf b = {0};
    put(&b, "");
    if (!args || args->type == AL_JSON_NULL) {
        put(&b, "{}");
    } else if (args->type == AL_JSON_STRING) {
        /* a model that wrote the arguments as a string of JSON */
        if (al_chat_json_pyformat(args->string, args->string_len, &b) != 0) {
            b.len = 0;
            putn(&b, args->string, args->string_len);
        }
    } else {
        py_dump(&b, args);
    }
    call->name = dup_n(name->string, name->string_len);
    call->arguments = b.data;
    al_json_free(v);
    if (!call->name || b.oom) {
        free(call->name);
        free(call->arguments);
        call->name = call->arguments = NULL;
        return -1;
    }
    return 0;
}

int al_chat_parse(const char *text, size_t len, unsigned flags, al_chat_parsed *out)
{
    memset(out, 0, sizeof *out);
    const char *s = text;
    size_t n = len;
    if (flags & AL_CHAT_PARSE_REASONING) {
        const char *end = find_first(s, n, "</think>");
        if (!end && has_prefix(s, n, "<think>")) {
            /* generation stopped while thinking: all of it is reasoning */
            out->reasoning = dup_n(s + 7, n - 7);
            if (!out->reasoning) return -1;
            s += n;
            n = 0;
        } else if (end) {
            const char *r = s;
            const char *open = find_first(s, (size_t)(end - s), "<think>");
            if (open) r = open + 7;
            out->reasoning = dup_n(r, (size_t)(end - r));
            if (!out->reasoning) return -1;
            n -= (size_t)(end + 8 - s);
            s = end + 8;
        }
    }
    al_buf content = {0};
    put(&content, "");
    size_t cap = 0;
    size_t pos = 0;
    while (pos < n) {
        const char *open = find_first(s + pos, n - pos, "<tool_call>");
        if (!open) break;
        size_t body = (size_t)(open - s) + 11;
        const char *close = find_first(s + body, n - body, "</tool_call>");
        size_t body_end = close ? (size_t)(close - s) : n;
        size_t block_end = close ? body_end + 12 : n;
        al_chat_parsed_call call = {0};
        int rc = parse_call(s + body, body_end - body, &call);
        if (rc < 0) goto oom;
        if (rc == 1) {
            /* not a tool call: keep the text, look for the next block after this tag */
            putn(&content, s + pos, body - pos);
            pos = body;
            continue;
        }
        putn(&content, s + pos, (size_t)(open - s) - pos);
        if (out->n_calls == cap) {
            cap = cap ? cap * 2 : 4;
            al_chat_parsed_call *c = realloc(out->calls, cap * sizeof *c);
            if (!c) {
                free(call.name);
                free(call.arguments);
                goto oom;
            }
            out->calls = c;
        }
        out->calls[out->n_calls++] = call;
        pos = block_end;
    }
    putn(&content, s + pos, n - pos);
    if (content.oom) goto oom;
    if (out->n_calls) {
        /* the newlines around the blocks are layout, not content */
        size_t a = 0, e = content.len;
        while (a < e && is_ws(content.data[a]))
            a++;
        while (e > a && is_ws(content.data[e - 1]))
            e--;
        memmove(content.data, content.data + a, e - a);
        content.len = e - a;
        content.data[content.len] = 0;
    }
    out->content = content.data;
    out->content_len = content.len;
    return 0;
oom:
    free(content.data);
    al_chat_parsed_free(out);
    return -1;
}

void al_chat_parsed_free(al_chat_parsed *p)
{
    if (!p) return;
    for (size_t i = 0; i < p->n_calls; i++) {
        free(p->calls[i].name);
        free(p->calls[i].arguments);
    }
    free(p->calls);
    free(p->content);
    free(p->reasoning);
    memset(p, 0, sizeof *p);
}

/* ------------------------------------------------------------------------------------ */
/* Streaming                                                                            */

/* Length of the longest suffix of s[0..n) that is a proper prefix of tag: text that may
 * still turn into the tag and so cannot be released yet. */
static size_t partial_tag_suffix(const char *s, size_t n, const char *tag)
{
    size_t k = strlen(tag) - 1;
    if (k > n) k = n;
    for (; k > 0; k--)
        if (memcmp(s + n - k, tag, k) == 0) return k;
    return 0;
}

/* Moves the first n bytes of held to out (or drops them when out is NULL). */
static void release(al_buf *held, size_t n, al_buf *out)
{
    if (out) al_buf_append(out, held->data, n);
    memmove(held->data, held->data + n, held->len - n + 1);
    held->len -= n;
}

static int stream_ready(al_chat_stream *s)
{
    if (!s->held) s->held = calloc(1, sizeof(al_buf));
    for (int i = 0; i < 2; i++)
        if (!s->out[i]) s->out[i] = calloc(1, sizeof(al_buf));
    if (!s->held || !s->out[0] || !s->out[1]) return -1;
    put(s->held, "");
    for (int i = 0; i < 2; i++) {
        put(s->out[i], "");
        s->out[i]->len = 0;
        s->out[i]->data[0] = 0;
    }
    return 0;
}

int al_chat_stream_push(al_chat_stream *s, const char *text, size_t len, al_chat_delta *delta)
{
    if (stream_ready(s)) return -1;
    al_buf *held = s->held, *content = s->out[0], *reasoning = s->out[1];
    putn(held, text, len);
    for (;;) {
        if (s->phase == 0) {
            if (!(s->flags & AL_CHAT_PARSE_REASONING)) {
                s->phase = 2;
            } else if (held->len < 7 && memcmp(held->data, "<think>", held->len) == 0) {
                break; /* could still be "<think>" */
            } else if (has_prefix(held->data, held->len, "<think>")) {
                release(held, 7, NULL);
                s->phase = 1;
            } else {
                s->phase = 2;
            }
        } else if (s->phase == 1) {
            const char *end = find_first(held->data, held->len, "</think>");
            if (end) {
                release(held, (size_t)(end - held->data), reasoning);
                release(held, 8, NULL);
                s->phase = 2;
                continue;
            }
            release(held, held->len - partial_tag_suffix(held->data, held->len, "</think>"),
                    reasoning);
            break;
        } else if (s->phase == 2) {
            const char *call = find_first(held->data, held->len, "<tool_call>");
            if (call) {
                release(held, (size_t)(call - held->data), content);
                s->phase = 3;
                break;
            }
            release(held, held->len - partial_tag_suffix(held->data, held->len, "<tool_call>"),
                    content);
            break;
        } else {
            break; /* tool calls: hold everything until the end */
        }
    }
    if (held->oom || content->oom || reasoning->oom) return -1;
    delta->content = content->data;
    delta->content_len = content->len;
    delta->reasoning = reasoning->data;
    delta->reasoning_len = reasoning->len;
    return 0;
}

int al_chat_stream_finish(al_chat_stream *s, al_chat_parsed *out)
{
    memset(out, 0, sizeof *out);
    if (stream_ready(s)) return -1;
    al_buf *held = s->held;
    if (s->phase == 3) return al_chat_parse(held->data, held->len, 0, out);
    out->content = dup_n(s->phase == 1 ? "" : held->data, s->phase == 1 ? 0 : held->len);
    out->content_len = s->phase == 1 ? 0 : held->len;
    if (s->phase == 1) out->reasoning = dup_n(held->data, held->len);
    if (!out->content || (s->phase == 1 && !out->reasoning)) {
        al_chat_parsed_free(out);
        return -1;
    }
    held->len = 0;
    held->data[0] = 0;
    return 0;
}

void al_chat_stream_free(al_chat_stream *s)
{
    if (s->held) free(s->held->data);
    free(s->held);
    for (int i = 0; i < 2; i++) {
        if (s->out[i]) free(s->out[i]->data);
        free(s->out[i]);
    }
    memset(s, 0, sizeof *s);
}
