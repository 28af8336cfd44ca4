/*
 * fake_upstream.c: the vLLM-like test upstream (see fake_upstream.h).
 */
#include "fake_upstream.h"

#include <arpa/inet.h>
#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <event2/thread.h>
#include <jansson.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define FU_MAX_THREADS 16

typedef struct fu_loop {
    fake_upstream *u;
    struct event_base *base;
    struct evhttp *http;
    pthread_t th;
} fu_loop;

struct fake_upstream {
    int port, nthreads;
    fu_loop loops[FU_MAX_THREADS];
    pthread_mutex_t mu;
    char *last_auth, *last_body;
    long requests;
};

static const char *const ANSWER[4] = {"The", " answer", " is", " 4."};
static const int ANSWER_IDS[4] = {100, 101, 102, 103};
static const double ANSWER_LP[4] = {-0.25, -0.5, -0.75, -1.0};
static const char REASONING[] = "Two and two make four.";

typedef struct fu_req {
    int chat, stream, ids, lp, usage, tools, slow;
    const char *model;
    json_t *prompt_ids;
} fu_req;

static void send_json(struct evhttp_request *r, int code, json_t *o)
{
    char *s = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
    struct evbuffer *b = evbuffer_new();
    evbuffer_add(b, s, strlen(s));
    evhttp_add_header(evhttp_request_get_output_headers(r), "Content-Type", "application/json");
    evhttp_add_header(evhttp_request_get_output_headers(r), "x-arclight-policy-version", "7");
    evhttp_send_reply(r, code, code == 200 ? "OK" : "Error", b);
    evbuffer_free(b);
    free(s);
}

static json_t *chat_logprobs(int from, int to)
{
    json_t *content = json_array();
    for (int i = from; i < to; i++)
        json_array_append_new(content, json_pack("{s:s,s:f,s:[]}", "token", ANSWER[i], "logprob",
                                                 ANSWER_LP[i], "top_logprobs"));
    return json_pack("{s:o}", "content", content);
}

static json_t *compl_logprobs(int from, int to)
{
    json_t *toks = json_array(), *lps = json_array();
    for (int i = from; i < to; i++) {
        json_array_append_new(toks, json_string(ANSWER[i]));
        json_array_append_new(lps, json_real(ANSWER_LP[i]));
    }
    return json_pack("{s:[],s:o,s:o,s:[]}", "text_offset", "token_logprobs", lps, "tokens", toks,
                     "top_logprobs");
}

static json_t *ids_range(int from, int to)
{
    json_t *a = json_array();
    for (int i = from; i < to; i++)
        json_array_append_new(a, json_integer(ANSWER_IDS[i]));
    return a;
}

static json_t *usage_obj(const fu_req *q, int completion)
{
    int p = (int)json_array_size(q->prompt_ids);
    return json_pack("{s:i,s:i,s:i,s:n}", "prompt_tokens", p, "total_tokens", p + completion,
                     "completion_tokens", completion, "prompt_tokens_details");
}

static const char *finish_of(const fu_req *q)
{
    return q->tools ? "tool_calls" : !strcmp(q->model, "length") ? "length" : "stop";
}

static void whole(struct evhttp_request *r, const fu_req *q)
{
    json_t *choice;
    if (q->chat) {
        json_t *msg;
        if (q->tools)
            msg = json_pack("{s:s,s:n,s:[{s:s,s:s,s:{s:s,s:s}}]}", "role", "assistant", "content",
                            "tool_calls", "id", "call_1", "type", "function", "function", "name",
                            "get_weather", "arguments", "{\"city\":\"Paris\"}");
        else
            msg = json_pack("{s:s,s:s,s:[]}", "role", "assistant", "content", "The answer is 4.",
                            "tool_calls");
        if (!strcmp(q->model, "reasoning"))
            json_object_set_new(msg, "reasoning_content", json_string(REASONING));
        if (!strcmp(q->model, "nul-content")) /* token 0 of a random policy: \u0000 */
            json_object_set_new(msg, "content", json_stringn("The a\0nswer is 4.", 17));
        choice = json_pack("{s:i,s:o,s:o,s:s,s:n,s:o}", "index", 0, "message", msg, "logprobs",
                           q->lp ? chat_logprobs(0, 4) : json_null(), "finish_reason", finish_of(q),
                           "stop_reason", "token_ids", q->ids ? ids_range(0, 4) : json_null());
    } else {
        choice = json_pack("{s:i,s:s,s:o,s:s,s:n,s:o,s:o}", "index", 0, "text", "The answer is 4.",
                           "logprobs", q->lp ? compl_logprobs(0, 4) : json_null(), "finish_reason",
                           "stop", "stop_reason", "prompt_token_ids",
                           q->ids ? json_incref(q->prompt_ids) : json_null(), "token_ids",
                           q->ids ? ids_range(0, 4) : json_null());
    }
    json_t *o = json_pack("{s:s,s:s,s:i,s:s,s:[o],s:n,s:o,s:n,s:o,s:n}", "id", "cmpl-fake-1",
                          "object", q->chat ? "chat.completion" : "text_completion", "created",
                          1764400000, "model", q->model, "choices", choice, "service_tier", "usage",
                          usage_obj(q, 4), "prompt_logprobs", "prompt_token_ids",
                          q->ids && q->chat ? json_incref(q->prompt_ids) : json_null(),
                          "kv_transfer_params");
    if (!strcmp(q->model, "bad-utf8")) {
        /* text that is not UTF-8 (jansson will not write it: the bytes go in by hand) */
        char *s = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
        char *at = s ? strstr(s, "The answer is 4.") : NULL;
        if (at) memcpy(at + 4, "\xff\xfe", 2);
        struct evbuffer *b = evbuffer_new();
        evbuffer_add(b, s ? s : "{}", s ? strlen(s) : 2);
        evhttp_add_header(evhttp_request_get_output_headers(r), "Content-Type", "application/json");
        evhttp_send_reply(r, 200, "OK", b);
        evbuffer_free(b);
        free(s);
        json_decref(o);
        return;
    }
    if (!strcmp(q->model, "huge-numbers")) {
        /* numbers beyond the int64 and float ranges where a count and a logprob go */
        json_object_set_new(json_object_get(o, "usage"), "prompt_tokens", json_real(1e300));
        json_t *lp = json_object_get(choice, "logprobs");
        json_t *first = json_array_get(json_object_get(lp, "content"), 0);
        if (first) json_object_set_new(first, "logprob", json_real(-1e300));
    }
    send_json(r, 200, o);
    json_decref(o);
}

typedef struct fu_stream {
    struct evhttp_request *r;
    fu_req q;
    int step;
    struct event *timer;
} fu_stream;

static void chunk_send(fu_stream *s, json_t *o)
{
    char *t = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
    struct evbuffer *b = evbuffer_new();
    evbuffer_add_printf(b, "data: %s\n\n", t);
    evhttp_send_reply_chunk(s->r, b);
    evbuffer_free(b);
    free(t);
}

static json_t *chunk_base(const fu_stream *s)
{
    return json_pack("{s:s,s:s,s:i,s:s}", "id", "cmpl-fake-1", "object",
                     s->q.chat ? "chat.completion.chunk" : "text_completion", "created", 1764400000,
                     "model", s->q.model);
}

/* One step of a stream: role chunk, 4 token chunks (or 2 tool-call chunks), the finish
 * chunk, the usage chunk when asked, [DONE]. */
static int stream_step(fu_stream *s)
{
    const fu_req *q = &s->q;
    int ntok = q->tools ? 2 : 4;
    json_t *o = chunk_base(s), *choice = NULL;
    if (s->step == 0 && q->chat) {
        choice = json_pack("{s:i,s:{s:s,s:s},s:n,s:n}", "index", 0, "delta", "role", "assistant",
                           "content", "", "logprobs", "finish_reason");
        if (!strcmp(q->model, "reasoning"))
            json_object_set_new(json_object_get(choice, "delta"), "reasoning_content",
                                json_string(REASONING));
        json_object_set_new(o, "choices", json_pack("[o]", choice));
        if (q->ids) json_object_set(o, "prompt_token_ids", q->prompt_ids);
    } else if (s->step >= 1 && s->step <= ntok) {
        int i = s->step - 1;
        if (q->tools) {
            const char *piece = i == 0 ? "{\"city\":" : "\"Paris\"}";
            json_t *tc =
                i == 0
                    ? json_pack("{s:i,s:s,s:s,s:{s:s,s:s}}", "index", 0, "id", "call_1", "type",
                                "function", "function", "name", "get_weather", "arguments", piece)
                    : json_pack("{s:i,s:{s:s}}", "index", 0, "function", "arguments", piece);
            choice = json_pack("{s:i,s:{s:[o]},s:o,s:n}", "index", 0, "delta", "tool_calls", tc,
                               "logprobs", q->lp ? chat_logprobs(i * 2, i * 2 + 2) : json_null(),
                               "finish_reason");
            if (q->ids) json_object_set_new(choice, "token_ids", ids_range(i * 2, i * 2 + 2));
        } else if (q->chat) {
            /* model "nul-content": the second piece holds a NUL character, which a random
             * policy can sample (token 0) and JSON carries as \u0000 */
            json_t *piece = (!strcmp(q->model, "nul-content") && i == 1) ? json_stringn(" a\0b", 4)
                                                                         : json_string(ANSWER[i]);
            choice = json_pack("{s:i,s:{s:o},s:o,s:n}", "index", 0, "delta", "content", piece,
                               "logprobs", q->lp ? chat_logprobs(i, i + 1) : json_null(),
                               "finish_reason");
            if (q->ids) json_object_set_new(choice, "token_ids", ids_range(i, i + 1));
        } else {
            choice = json_pack("{s:i,s:s,s:o,s:n}", "index", 0, "text", ANSWER[i], "logprobs",
                               q->lp ? compl_logprobs(i, i + 1) : json_null(), "finish_reason");
            if (q->ids) {
                if (i == 0) json_object_set(choice, "prompt_token_ids", q->prompt_ids);
                json_object_set_new(choice, "token_ids", ids_range(i, i + 1));
            }
        }
        json_object_set_new(o, "choices", json_pack("[o]", choice));
    } else if (s->step == ntok + 1) {
        if (q->chat)
            choice = json_pack("{s:i,s:{},s:n,s:s,s:n}", "index", 0, "delta", "logprobs",
                               "finish_reason", finish_of(q), "stop_reason");
        else
            choice = json_pack("{s:i,s:s,s:n,s:s,s:n}", "index", 0, "text", "", "logprobs",
                               "finish_reason", "stop", "stop_reason");
        json_object_set_new(o, "choices", json_pack("[o]", choice));
    } else if (s->step == ntok + 2 && q->usage) {
        json_object_set_new(o, "choices", json_array());
        json_object_set_new(o, "usage", usage_obj(q, q->tools ? 4 : 4));
    } else {
        json_decref(o);
        struct evbuffer *b = evbuffer_new();
        evbuffer_add_printf(b, "data: [DONE]\n\n");
        evhttp_send_reply_chunk(s->r, b);
        evbuffer_free(b);
        evhttp_send_reply_end(s->r);
        return 1;
    }
    chunk_send(s, o);
    json_decref(o);
    s->step++;
    if (s->step == ntok + 2 && !q->usage) s->step++;
    return 0;
}

static void stream_free(fu_stream *s)
{
    if (s->timer) event_free(s->timer);
    json_decref(s->q.prompt_ids);
    free((char *)s->q.model);
    free(s);
}

static void stream_timer(evutil_socket_t fd, short what, void *arg)
{
    fu_stream *s = arg;
    (void)fd;
    (void)what;
    if (stream_step(s)) {
        stream_free(s);
        return;
    }
    struct timeval tv = {0, 100000};
    evtimer_add(s->timer, &tv);
}

static void error_reply(struct evhttp_request *r, int code, const char *msg)
{
    json_t *o =
        json_pack("{s:{s:s,s:s,s:n,s:i}}", "error", "message", msg, "type",
                  code == 400 ? "BadRequestError" : "InternalServerError", "param", "code", code);
    send_json(r, code, o);
    json_decref(o);
}

/* POST /v1/messages served natively, as vLLM's Messages API: Anthropic's message (whole, or
 * its event stream all at once), "The answer is 4." as 4 output tokens, and no token ids. */
static void messages_native(struct evhttp_request *r, const char *body)
{
    json_t *req = json_loads(body, JSON_ALLOW_NUL, NULL); /* as vLLM's parser: \u0000 is JSON */
    json_t *msgs = json_object_get(req, "messages");
    if (!json_is_array(msgs) || !json_is_integer(json_object_get(req, "max_tokens"))) {
        json_t *o = json_pack("{s:s,s:{s:s,s:s}}", "type", "error", "error", "type",
                              "invalid_request_error", "message", "messages and max_tokens are required");
        send_json(r, 400, o);
        json_decref(o);
        json_decref(req);
        return;
    }
    const char *model = json_string_value(json_object_get(req, "model"));
    json_t *usage = json_pack("{s:i,s:i}", "input_tokens", 9, "output_tokens", 4);
    json_t *msg = json_pack("{s:s,s:s,s:s,s:[{s:s,s:s}],s:s,s:s,s:n,s:o}", "id", "msg_fake_1",
                            "type", "message", "role", "assistant", "content", "type", "text",
                            "text", "The answer is 4.", "model", model ? model : "", "stop_reason",
                            "end_turn", "stop_sequence", "usage", usage);
    if (!json_is_true(json_object_get(req, "stream"))) {
        send_json(r, 200, msg);
    } else {
        struct evkeyvalq *oh = evhttp_request_get_output_headers(r);
        evhttp_add_header(oh, "Content-Type", "text/event-stream; charset=utf-8");
        evhttp_add_header(oh, "x-arclight-policy-version", "7");
        evhttp_send_reply_start(r, 200, "OK");
        json_object_set_new(msg, "content", json_array());
        json_object_set_new(msg, "stop_reason", json_null());
        json_object_set_new(json_object_get(msg, "usage"), "output_tokens", json_integer(0));
        json_t *evs = json_pack("[{s:s,s:O},{s:s,s:i,s:{s:s,s:s}}]", "type", "message_start",
                                "message", msg, "type", "content_block_start", "index", 0,
                                "content_block", "type", "text", "text", "");
        for (int i = 0; i < 4; i++)
            json_array_append_new(evs, json_pack("{s:s,s:i,s:{s:s,s:s}}", "type",
                                                 "content_block_delta", "index", 0, "delta", "type",
                                                 "text_delta", "text", ANSWER[i]));
        json_array_append_new(evs, json_pack("{s:s,s:i}", "type", "content_block_stop", "index", 0));
        json_array_append_new(evs, json_pack("{s:s,s:{s:s,s:n},s:{s:i}}", "type", "message_delta",
                                             "delta", "stop_reason", "end_turn", "stop_sequence",
                                             "usage", "output_tokens", 4));
        json_array_append_new(evs, json_pack("{s:s}", "type", "message_stop"));
        struct evbuffer *b = evbuffer_new();
        size_t i;
        json_t *e;
        json_array_foreach(evs, i, e)
        {
            char *t = json_dumps(e, JSON_COMPACT | JSON_PRESERVE_ORDER);
            evbuffer_add_printf(b, "event: %s\ndata: %s\n\n",
                                json_string_value(json_object_get(e, "type")), t);
            free(t);
        }
        evhttp_send_reply_chunk(r, b);
        evbuffer_free(b);
        evhttp_send_reply_end(r);
        json_decref(evs);
    }
    json_decref(msg);
    json_decref(req);
}

static void handle(struct evhttp_request *r, void *arg)
{
    fu_loop *l = arg;
    fake_upstream *u = l->u;
    const char *uri = evhttp_request_get_uri(r);
    struct evbuffer *in = evhttp_request_get_input_buffer(r);
    size_t n = evbuffer_get_length(in);
    char *body = malloc(n + 1);
    evbuffer_copyout(in, body, n);
    body[n] = '\0';
    const char *auth = evhttp_find_header(evhttp_request_get_input_headers(r), "Authorization");
    pthread_mutex_lock(&u->mu);
    u->requests++;
    if (evhttp_request_get_command(r) == EVHTTP_REQ_POST) {
        free(u->last_auth);
        free(u->last_body);
        u->last_auth = auth ? strdup(auth) : NULL;
        u->last_body = strdup(body);
    }
    pthread_mutex_unlock(&u->mu);
    if (strncmp(uri, "/v1/models", 10) == 0) {
        json_t *o =
            json_pack("{s:s,s:[{s:s,s:s,s:i,s:s}]}", "object", "list", "data", "id", "fake-model",
                      "object", "model", "created", 1764400000, "owned_by", "vllm");
        send_json(r, 200, o);
        json_decref(o);
        free(body);
        return;
    }
    if (!strcmp(uri, "/tokenize")) { /* vLLM's: the prompt's tokens, as a chat call counts them */
        json_t *req = json_loads(body, JSON_ALLOW_NUL, NULL); /* as vLLM's parser: \u0000 is JSON */
        json_t *msgs = json_object_get(req, "messages");
        json_t *last = json_array_get(msgs, json_array_size(msgs) ? json_array_size(msgs) - 1 : 0);
        const char *text = json_string_value(json_object_get(last, "content"));
        size_t tl = text ? strlen(text) : 0;
        json_t *o = json_pack("{s:[],s:i,s:i}", "tokens", "count", (int)(tl > 32 ? 32 : tl),
                              "max_model_len", 4096);
        send_json(r, json_is_array(msgs) ? 200 : 400, o);
        json_decref(o);
        json_decref(req);
        free(body);
        return;
    }
    if (!strcmp(uri, "/v1/messages")) {
        messages_native(r, body);
        free(body);
        return;
    }
    fu_req q = {0};
    q.chat = strcmp(uri, "/v1/chat/completions") == 0;
    if (!q.chat && strcmp(uri, "/v1/completions") != 0) {
        error_reply(r, 404, "not found");
        free(body);
        return;
    }
    json_t *req = json_loads(body, JSON_ALLOW_NUL, NULL); /* as vLLM's parser: \u0000 is JSON */
    free(body);
    if (!json_is_object(req)) {
        error_reply(r, 400, "invalid JSON");
        json_decref(req);
        return;
    }
    q.model = json_string_value(json_object_get(req, "model"));
    if (!q.model) q.model = "fake-model";
    if (!strcmp(q.model, "echo-auth")) { /* an upstream that quotes the key it refused */
        const char *got = evhttp_find_header(evhttp_request_get_input_headers(r), "Authorization");
        char msg[600];
        snprintf(msg, sizeof msg, "bad key %s (check your key)", got ? got : "(none)");
        json_t *o = json_pack("{s:{s:s,s:s,s:n,s:i}}", "error", "message", msg, "type",
                              "AuthenticationError", "param", "code", 401);
        send_json(r, 401, o);
        json_decref(o);
        json_decref(req);
        return;
    }
    if (!strcmp(q.model, "fail-newline")) { /* a message that would forge a log line */
        error_reply(r, 400,
                    "bad request\n2026-01-01T00:00:00.000Z INFO  proxy.access: forged status=200");
        json_decref(req);
        return;
    }
    if (!strcmp(q.model, "fail-400") || !strcmp(q.model, "fail-500")) {
        int code = q.model[5] == '4' ? 400 : 500;
        error_reply(r, code,
                    code == 400 ? "This model's maximum context length is 8 tokens"
                                : "engine crashed");
        json_decref(req);
        return;
    }
    q.stream = json_is_true(json_object_get(req, "stream"));
    q.ids = json_is_true(json_object_get(req, "return_token_ids"));
    json_t *lp = json_object_get(req, "logprobs");
    q.lp = q.chat ? json_is_true(lp) : json_is_integer(lp);
    q.usage =
        json_is_true(json_object_get(json_object_get(req, "stream_options"), "include_usage"));
    q.tools = json_array_size(json_object_get(req, "tools")) > 0;
    if (q.chat) { /* after a tool result the model answers in text */
        json_t *msgs = json_object_get(req, "messages");
        json_t *lastm = json_array_get(msgs, json_array_size(msgs) ? json_array_size(msgs) - 1 : 0);
        const char *role = json_string_value(json_object_get(lastm, "role"));
        if (role && !strcmp(role, "tool")) q.tools = 0;
    }
    q.slow = !strcmp(q.model, "slow-stream");
    const char *text = NULL;
    if (q.chat) {
        json_t *msgs = json_object_get(req, "messages");
        json_t *last = json_array_get(msgs, json_array_size(msgs) ? json_array_size(msgs) - 1 : 0);
        text = json_string_value(json_object_get(last, "content"));
    } else {
        text = json_string_value(json_object_get(req, "prompt"));
    }
    q.prompt_ids = json_array();
    for (size_t i = 0; text && text[i] && i < 32; i++)
        json_array_append_new(q.prompt_ids, json_integer((unsigned char)text[i]));
    if (!q.stream) {
        whole(r, &q);
        json_decref(q.prompt_ids);
        json_decref(req);
        return;
    }
    if (!strcmp(q.model, "big-stream")) { /* 1500 chunks of 2000 characters, at once */
        json_decref(req);
        json_decref(q.prompt_ids);
        struct evkeyvalq *bh = evhttp_request_get_output_headers(r);
        evhttp_add_header(bh, "Content-Type", "text/event-stream; charset=utf-8");
        evhttp_send_reply_start(r, 200, "OK");
        static char big[2001];
        memset(big, 'x', 2000);
        struct evbuffer *b = evbuffer_new();
        for (int i = 0; i < 1500; i++)
            evbuffer_add_printf(b,
                                "data: {\"id\":\"big\",\"object\":\"chat.completion.chunk\","
                                "\"choices\":[{\"index\":0,\"delta\":{\"content\":\"%s\"},"
                                "\"logprobs\":null,\"finish_reason\":null}]}\n\n",
                                big);
        evbuffer_add_printf(b, "data: [DONE]\n\n");
        evhttp_send_reply_chunk(r, b);
        evbuffer_free(b);
        evhttp_send_reply_end(r);
        return;
    }
    fu_stream *s = calloc(1, sizeof *s);
    s->r = r;
    s->q = q;
    s->step = q.chat ? 0 : 1; /* completions streams have no role chunk */
    s->q.model = strdup(q.model);
    json_decref(req);
    struct evkeyvalq *oh = evhttp_request_get_output_headers(r);
    evhttp_add_header(oh, "Content-Type", "text/event-stream; charset=utf-8");
    evhttp_add_header(oh, "x-arclight-policy-version", "7");
    evhttp_send_reply_start(r, 200, "OK");
    if (s->q.slow) {
        s->timer = evtimer_new(l->base, stream_timer, s);
        stream_timer(-1, 0, s);
        return;
    }
    while (!stream_step(s)) {
    }
    stream_free(s);
}

static void *loop_main(void *arg)
{
    fu_loop *l = arg;
    event_base_dispatch(l->base);
    return NULL;
}

fake_upstream *fake_upstream_start(int port, int nthreads)
{
    if (nthreads < 1) nthreads = 1;
    if (nthreads > FU_MAX_THREADS) nthreads = FU_MAX_THREADS;
    evthread_use_pthreads(); /* loopbreak from the stopping thread */
    fake_upstream *u = calloc(1, sizeof *u);
    pthread_mutex_init(&u->mu, NULL);
    u->nthreads = nthreads;
    for (int i = 0; i < nthreads; i++) {
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0), one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one);
        struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
        inet_pton(AF_INET, "127.0.0.1", &sin.sin_addr);
        if (bind(fd, (struct sockaddr *)&sin, sizeof sin) != 0 || listen(fd, 1024) != 0) {
            perror("fake_upstream: bind");
            close(fd);
            return NULL;
        }
        if (port == 0) {
            socklen_t sl = sizeof sin;
            getsockname(fd, (struct sockaddr *)&sin, &sl);
            port = ntohs(sin.sin_port);
        }
        fu_loop *l = &u->loops[i];
        l->u = u;
        l->base = event_base_new();
        l->http = evhttp_new(l->base);
        evhttp_set_gencb(l->http, handle, l);
        evhttp_accept_socket(l->http, fd);
    }
    u->port = port;
    for (int i = 0; i < nthreads; i++)
        pthread_create(&u->loops[i].th, NULL, loop_main, &u->loops[i]);
    return u;
}

int fake_upstream_port(const fake_upstream *u)
{
    return u->port;
}

char *fake_upstream_last_auth(fake_upstream *u)
{
    pthread_mutex_lock(&u->mu);
    char *r = u->last_auth ? strdup(u->last_auth) : NULL;
    pthread_mutex_unlock(&u->mu);
    return r;
}

char *fake_upstream_last_body(fake_upstream *u)
{
    pthread_mutex_lock(&u->mu);
    char *r = u->last_body ? strdup(u->last_body) : NULL;
    pthread_mutex_unlock(&u->mu);
    return r;
}

long fake_upstream_requests(fake_upstream *u)
{
    pthread_mutex_lock(&u->mu);
    long r = u->requests;
    pthread_mutex_unlock(&u->mu);
    return r;
}

void fake_upstream_stop(fake_upstream *u)
{
    if (!u) return;
    for (int i = 0; i < u->nthreads; i++)
        event_base_loopbreak(u->loops[i].base);
    for (int i = 0; i < u->nthreads; i++) {
        pthread_join(u->loops[i].th, NULL);
        evhttp_free(u->loops[i].http);
        event_base_free(u->loops[i].base);
    }
    free(u->last_auth);
    free(u->last_body);
    pthread_mutex_destroy(&u->mu);
    free(u);
}
