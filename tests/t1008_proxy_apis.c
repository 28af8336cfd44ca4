/*
 * t1008_proxy_apis: the Responses API and the Anthropic Messages API through `arclight
 * proxy` to the vLLM-like test upstream (tests/fake_upstream.c), end to end over real
 * sockets: text, tool calls and tool results, reasoning, whole and streamed; the upstream
 * gets chat completions asking for token ids; previous_response_id from the proxy's store;
 * errors in each API's shape; --agent-key through Bearer and x-api-key; a client's probe of
 * its base URL; /v1/models in Anthropic's shape; request bodies of 150 KB with 60 tools;
 * eval routes; and each call one span with the token ids and logprobs of its answer, the
 * agent's request byte for byte and the answer the agent got.
 */
#define _GNU_SOURCE
#include "testlib.h"
#include "broker_fixture.h"
#include "t1099_proxy_helpers.h"

#include <jansson.h>

static al_test_broker B;
static fake_upstream *U;
static px_child P;
static char TMP[512], LOG[600], UPURL[128];
static const char *KEY = "sk-agent-apis-5150";

static const char *const OAI[] = {"Content-Type: application/json",
                                  "Authorization: Bearer sk-agent-apis-5150", NULL};
static const char *const ANT[] = {"Content-Type: application/json", "x-api-key: sk-agent-apis-5150",
                                  "anthropic-version: 2023-06-01", NULL};

/* What the agents sent, by rollout, for the span checks at the end. */
typedef struct sent {
    char rollout[32];
    char *body;
    char *answer; /* the whole answer's bytes (NULL for streams) */
    int stream;
} sent;
static sent SENT[64];
static int NSENT;

static long call(const char *rollout, const char *path, const char *const *h, const char *body,
                 px_resp *r, int keep)
{
    char url[512];
    snprintf(url, sizeof url, "%s/r/task-x/%s%s", P.base, rollout, path);
    if (px_http("POST", url, h, body, r) != 0) return -1;
    if (keep && NSENT < 64) {
        sent *s = &SENT[NSENT++];
        snprintf(s->rollout, sizeof s->rollout, "%s", rollout);
        s->body = strdup(body);
        s->stream = strstr(body, "\"stream\":true") != NULL;
        s->answer = s->stream ? NULL : strdup(r->body);
    }
    return r->status;
}

/* The SSE events of a body: [[type, data], ...]. */
static json_t *events(const char *p)
{
    json_t *evs = json_array();
    while (p && *p) {
        const char *end = strstr(p, "\n\n");
        const char *nl = end ? memchr(p, '\n', (size_t)(end - p)) : NULL;
        if (!end || !nl || strncmp(p, "event: ", 7) || strncmp(nl + 1, "data: ", 6)) break;
        json_t *d = json_loadb(nl + 7, (size_t)(end - nl - 7), 0, NULL);
        json_array_append_new(evs,
                              json_pack("[s#,o]", p + 7, (int)(nl - p - 7), d ? d : json_null()));
        p = end + 2;
    }
    return evs;
}

static const char *ev_type(json_t *evs, size_t i)
{
    return json_string_value(json_array_get(json_array_get(evs, i), 0));
}

static json_t *ev_data(json_t *evs, size_t i)
{
    return json_array_get(json_array_get(evs, i), 1);
}

/* The concatenated text of every event of this type's member k (deltas). */
static char *joined(json_t *evs, const char *type, const char *k, const char *k2)
{
    static char buf[4096];
    buf[0] = '\0';
    for (size_t i = 0; i < json_array_size(evs); i++) {
        if (strcmp(ev_type(evs, i), type)) continue;
        json_t *d = ev_data(evs, i);
        if (k2) d = json_object_get(d, k2);
        const char *s = json_string_value(json_object_get(d, k));
        if (s) strncat(buf, s, sizeof buf - strlen(buf) - 1);
    }
    return buf;
}

static json_t *upstream_request(void)
{
    char *b = fake_upstream_last_body(U);
    json_t *o = b ? json_loads(b, 0, NULL) : NULL;
    free(b);
    return o;
}

TEST(setup)
{
    curl_global_init(CURL_GLOBAL_DEFAULT);
    REQUIRE(al_test_broker_start(&B, NULL) == 0);
    U = fake_upstream_start(0, 1);
    REQUIRE(U);
    snprintf(UPURL, sizeof UPURL, "http://127.0.0.1:%d", fake_upstream_port(U));
    al_test_tmpdir(TMP, sizeof TMP, "proxy");
    REQUIRE(TMP[0]);
    snprintf(LOG, sizeof LOG, "%s/proxy.log", TMP);
    char spool[600];
    snprintf(spool, sizeof spool, "%s/spool", TMP);
    const char *args[] = {"--listen",    "127.0.0.1:0", "--upstream", UPURL,         "--bootstrap",
                          B.bootstrap,   "--spool-dir", spool,        "--agent-key", KEY,
                          "--log-level", "info",        NULL};
    REQUIRE(px_start(&P, LOG, args, NULL) == 0);
}

TEST(responses_whole_text)
{
    px_resp r;
    const char *b = "{\"model\":\"m\",\"instructions\":\"Be exact.\",\"input\":\"What is 2+2?\"}";
    REQUIRE(call("roll-rt", "/v1/responses", OAI, b, &r, 1) == 200);
    json_t *o = json_loads(r.body, 0, NULL);
    REQUIRE(o);
    CHECK_EQ_STR(json_string_value(json_object_get(o, "object")), "response");
    CHECK_EQ_STR(json_string_value(json_object_get(o, "status")), "completed");
    json_t *item = json_array_get(json_object_get(o, "output"), 0);
    CHECK_EQ_STR(json_string_value(json_object_get(item, "type")), "message");
    CHECK_EQ_STR(json_string_value(
                     json_object_get(json_array_get(json_object_get(item, "content"), 0), "text")),
                 "The answer is 4.");
    CHECK_EQ_INT(json_integer_value(json_object_get(json_object_get(o, "usage"), "output_tokens")),
                 4);
    CHECK(strcasestr(r.headers, "x-arclight-overhead-us:") != NULL);
    CHECK(strcasestr(r.headers, "content-type: application/json") != NULL);
    json_decref(o);
    px_resp_free(&r);
    /* the upstream got chat completions, asked for token ids and logprobs */
    json_t *u = upstream_request();
    REQUIRE(u);
    CHECK(json_is_true(json_object_get(u, "return_token_ids")));
    CHECK(json_is_true(json_object_get(u, "logprobs")));
    json_t *m0 = json_array_get(json_object_get(u, "messages"), 0);
    CHECK_EQ_STR(json_string_value(json_object_get(m0, "role")), "system");
    CHECK_EQ_STR(json_string_value(json_object_get(m0, "content")), "Be exact.");
    json_decref(u);
}

TEST(responses_stream_text)
{
    px_resp r;
    const char *b = "{\"model\":\"m\",\"input\":\"What is 2+2?\",\"stream\":true}";
    REQUIRE(call("roll-rs", "/v1/responses", OAI, b, &r, 1) == 200);
    CHECK(strcasestr(r.headers, "content-type: text/event-stream") != NULL);
    json_t *evs = events(r.body);
    size_t n = json_array_size(evs);
    REQUIRE(n >= 8);
    CHECK_EQ_STR(ev_type(evs, 0), "response.created");
    CHECK_EQ_STR(ev_type(evs, 1), "response.in_progress");
    CHECK_EQ_STR(ev_type(evs, n - 1), "response.completed");
    CHECK_EQ_STR(joined(evs, "response.output_text.delta", "delta", NULL), "The answer is 4.");
    for (size_t i = 0; i < n; i++)
        CHECK_EQ_INT(json_integer_value(json_object_get(ev_data(evs, i), "sequence_number")),
                     (json_int_t)i);
    CHECK(!strstr(r.body, "[DONE]")); /* the Responses stream has no [DONE] */
    json_decref(evs);
    px_resp_free(&r);
}

TEST(responses_tool_call_round_trip)
{
    px_resp r;
    const char *b = "{\"model\":\"m\",\"input\":\"Weather in Paris?\",\"tools\":[{\"type\":"
                    "\"function\",\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\","
                    "\"properties\":{\"city\":{\"type\":\"string\"}}}}]}";
    REQUIRE(call("roll-rtool", "/v1/responses", OAI, b, &r, 1) == 200);
    json_t *o = json_loads(r.body, 0, NULL);
    json_t *fc = json_array_get(json_object_get(o, "output"), 0);
    CHECK_EQ_STR(json_string_value(json_object_get(fc, "type")), "function_call");
    CHECK_EQ_STR(json_string_value(json_object_get(fc, "name")), "get_weather");
    CHECK_EQ_STR(json_string_value(json_object_get(fc, "call_id")), "call_1");
    CHECK_EQ_STR(json_string_value(json_object_get(fc, "arguments")), "{\"city\":\"Paris\"}");
    const char *rid = json_string_value(json_object_get(o, "id"));
    REQUIRE(rid && !strncmp(rid, "resp_", 5));
    /* the tool's result, continuing from the stored response */
    char b2[1024];
    snprintf(b2, sizeof b2,
             "{\"model\":\"m\",\"previous_response_id\":\"%s\",\"input\":[{\"type\":"
             "\"function_call_output\",\"call_id\":\"call_1\",\"output\":\"sunny\"}],\"tools\":"
             "[{\"type\":\"function\",\"name\":\"get_weather\"}],\"stream\":true}",
             rid);
    json_decref(o);
    px_resp_free(&r);
    REQUIRE(call("roll-rtool", "/v1/responses", OAI, b2, &r, 1) == 200);
    json_t *evs = events(r.body);
    CHECK_EQ_STR(joined(evs, "response.output_text.delta", "delta", NULL), "The answer is 4.");
    json_decref(evs);
    px_resp_free(&r);
    json_t *u = upstream_request();
    json_t *msgs = json_object_get(u, "messages");
    CHECK_EQ_INT(json_array_size(msgs), 3); /* user, assistant's call (stored), tool */
    CHECK_EQ_STR(json_string_value(json_object_get(json_array_get(msgs, 1), "role")), "assistant");
    CHECK_EQ_STR(json_string_value(json_object_get(json_array_get(msgs, 2), "content")), "sunny");
    json_decref(u);
    /* a streamed tool call */
    char b3[1024];
    snprintf(b3, sizeof b3, "%.*s,\"stream\":true}", (int)strlen(b) - 1, b);
    REQUIRE(call("roll-rtool", "/v1/responses", OAI, b3, &r, 1) == 200);
    evs = events(r.body);
    CHECK_EQ_STR(joined(evs, "response.function_call_arguments.delta", "delta", NULL),
                 "{\"city\":\"Paris\"}");
    size_t n = json_array_size(evs);
    int done = 0;
    for (size_t i = 0; i < n; i++)
        if (!strcmp(ev_type(evs, i), "response.output_item.done")) {
            json_t *it = json_object_get(ev_data(evs, i), "item");
            CHECK_EQ_STR(json_string_value(json_object_get(it, "type")), "function_call");
            CHECK_EQ_STR(json_string_value(json_object_get(it, "arguments")),
                         "{\"city\":\"Paris\"}");
            done++;
        }
    CHECK_EQ_INT(done, 1);
    json_decref(evs);
    px_resp_free(&r);
    /* an unknown previous_response_id, and store: false answers are not kept */
    const char *b4 = "{\"model\":\"m\",\"previous_response_id\":\"resp_nope\",\"input\":\"x\"}";
    REQUIRE(call("roll-rerr", "/v1/responses", OAI, b4, &r, 0) == 400);
    CHECK(strstr(r.body, "\"code\":\"previous_response_not_found\"") != NULL);
    CHECK(strstr(r.body, "resp_nope") != NULL);
    px_resp_free(&r);
    REQUIRE(call("roll-rerr", "/v1/responses", OAI,
                 "{\"model\":\"m\",\"input\":\"x\",\"store\":false}", &r, 0) == 200);
    o = json_loads(r.body, 0, NULL);
    snprintf(b2, sizeof b2, "{\"model\":\"m\",\"previous_response_id\":\"%s\",\"input\":\"y\"}",
             json_string_value(json_object_get(o, "id")));
    json_decref(o);
    px_resp_free(&r);
    REQUIRE(call("roll-rerr", "/v1/responses", OAI, b2, &r, 0) == 400);
    px_resp_free(&r);
}

TEST(responses_reasoning_and_errors)
{
    px_resp r;
    REQUIRE(call("roll-rr", "/v1/responses", OAI, "{\"model\":\"reasoning\",\"input\":\"2+2?\"}",
                 &r, 1) == 200);
    json_t *o = json_loads(r.body, 0, NULL);
    json_t *rs = json_array_get(json_object_get(o, "output"), 0);
    CHECK_EQ_STR(json_string_value(json_object_get(rs, "type")), "reasoning");
    CHECK_EQ_STR(json_string_value(
                     json_object_get(json_array_get(json_object_get(rs, "content"), 0), "text")),
                 "Two and two make four.");
    json_decref(o);
    px_resp_free(&r);
    /* the upstream's error in the Responses API's shape, its status kept */
    REQUIRE(call("roll-rfail", "/v1/responses", OAI, "{\"model\":\"fail-400\",\"input\":\"x\"}", &r,
                 0) == 400);
    o = json_loads(r.body, 0, NULL);
    CHECK(strstr(json_string_value(json_object_get(json_object_get(o, "error"), "message")),
                 "maximum context length") != NULL);
    json_decref(o);
    px_resp_free(&r);
    /* the agent's own mistakes */
    REQUIRE(call("roll-rr", "/v1/responses", OAI, "{\"input\":\"x\"}", &r, 0) == 400);
    CHECK(strstr(r.body, "\"param\":null") || strstr(r.body, "'model'"));
    px_resp_free(&r);
    const char *text[] = {"Authorization: Bearer sk-agent-apis-5150", "Content-Type: text/plain",
                          NULL};
    REQUIRE(call("roll-rr", "/v1/responses", text, "{}", &r, 0) == 415);
    px_resp_free(&r);
}

TEST(messages_whole_and_streamed)
{
    px_resp r;
    const char *b = "{\"model\":\"m\",\"max_tokens\":100,\"system\":\"Be exact.\",\"messages\":[{"
                    "\"role\":\"user\",\"content\":\"What is 2+2?\"}]}";
    REQUIRE(call("roll-mt", "/v1/messages?beta=true", ANT, b, &r, 1) == 200);
    json_t *o = json_loads(r.body, 0, NULL);
    CHECK_EQ_STR(json_string_value(json_object_get(o, "type")), "message");
    CHECK_EQ_STR(json_string_value(json_object_get(o, "stop_reason")), "end_turn");
    CHECK_EQ_STR(json_string_value(
                     json_object_get(json_array_get(json_object_get(o, "content"), 0), "text")),
                 "The answer is 4.");
    CHECK_EQ_INT(json_integer_value(json_object_get(json_object_get(o, "usage"), "output_tokens")),
                 4);
    json_decref(o);
    px_resp_free(&r);
    const char *bs = "{\"model\":\"m\",\"max_tokens\":100,\"stream\":true,\"messages\":[{\"role\":"
                     "\"user\",\"content\":\"What is 2+2?\"}]}";
    REQUIRE(call("roll-mt", "/v1/messages", ANT, bs, &r, 1) == 200);
    json_t *evs = events(r.body);
    size_t n = json_array_size(evs);
    REQUIRE(n >= 6);
    CHECK_EQ_STR(ev_type(evs, 0), "message_start");
    CHECK_EQ_STR(ev_type(evs, n - 2), "message_delta");
    CHECK_EQ_STR(ev_type(evs, n - 1), "message_stop");
    CHECK_EQ_STR(joined(evs, "content_block_delta", "text", "delta"), "The answer is 4.");
    CHECK_EQ_STR(json_string_value(
                     json_object_get(json_object_get(ev_data(evs, n - 2), "delta"), "stop_reason")),
                 "end_turn");
    json_decref(evs);
    px_resp_free(&r);
}

/* A random policy can sample token 0, a NUL that JSON carries as \u0000: the upstream's answer
 * is still JSON, and the agent gets it translated (it was a 502, "not JSON"), and may send it
 * back in its next request. */
TEST(messages_answer_with_a_nul_character)
{
    px_resp r;
    const char *b = "{\"model\":\"nul-content\",\"max_tokens\":100,\"messages\":[{\"role\":"
                    "\"user\",\"content\":\"What is 2+2?\"}]}";
    REQUIRE(call("roll-nul", "/v1/messages", ANT, b, &r, 0) == 200);
    CHECKF(strstr(r.body, "The a\\u0000nswer is 4.") != NULL, "%s", r.body);
    px_resp_free(&r);
    const char *again = "{\"model\":\"m\",\"max_tokens\":100,\"messages\":[{\"role\":\"user\","
                        "\"content\":\"What is 2+2?\"},{\"role\":\"assistant\",\"content\":"
                        "\"The a\\u0000nswer is 4.\"},{\"role\":\"user\",\"content\":\"Sure?\"}]}";
    long st = call("roll-nul", "/v1/messages", ANT, again, &r, 0);
    CHECKF(st == 200, "%ld: %s", st, r.body);
    px_resp_free(&r);
}

/* The same on the Responses API, whole and streamed: the text is kept past the NUL. */
TEST(responses_answer_with_a_nul_character)
{
    px_resp r;
    const char *b = "{\"model\":\"nul-content\",\"input\":\"What is 2+2?\"}";
    REQUIRE(call("roll-rnul", "/v1/responses", OAI, b, &r, 0) == 200);
    CHECKF(strstr(r.body, "The a\\u0000nswer is 4.") != NULL, "%s", r.body);
    px_resp_free(&r);
    const char *bs = "{\"model\":\"nul-content\",\"stream\":true,\"input\":\"What is 2+2?\"}";
    REQUIRE(call("roll-rnul", "/v1/responses", OAI, bs, &r, 0) == 200);
    /* the done event's whole text (the deltas carry the NUL either way) */
    const char *done = strstr(r.body, "\"type\":\"response.output_text.done\"");
    const char *eol = done ? strchr(done, '\n') : NULL;
    const char *nul = done ? strstr(done, "\\u0000b") : NULL;
    CHECKF(done && nul && (!eol || nul < eol), "%s", r.body);
    px_resp_free(&r);
}

TEST(messages_tool_use_round_trip_and_thinking)
{
    px_resp r;
    const char *b = "{\"model\":\"m\",\"max_tokens\":100,\"stream\":true,\"tools\":[{\"name\":"
                    "\"get_weather\",\"input_schema\":{\"type\":\"object\"}}],\"messages\":[{"
                    "\"role\":\"user\",\"content\":\"Weather?\"}]}";
    REQUIRE(call("roll-mtool", "/v1/messages", ANT, b, &r, 1) == 200);
    json_t *evs = events(r.body);
    CHECK_EQ_STR(joined(evs, "content_block_delta", "partial_json", "delta"),
                 "{\"city\":\"Paris\"}");
    int starts = 0;
    for (size_t i = 0; i < json_array_size(evs); i++)
        if (!strcmp(ev_type(evs, i), "content_block_start")) {
            json_t *cb = json_object_get(ev_data(evs, i), "content_block");
            CHECK_EQ_STR(json_string_value(json_object_get(cb, "type")), "tool_use");
            CHECK_EQ_STR(json_string_value(json_object_get(cb, "id")), "call_1");
            starts++;
        }
    CHECK_EQ_INT(starts, 1);
    json_decref(evs);
    px_resp_free(&r);
    const char *b2 =
        "{\"model\":\"m\",\"max_tokens\":100,\"tools\":[{\"name\":\"get_weather\",\"input_schema\":"
        "{\"type\":\"object\"}}],\"messages\":[{\"role\":\"user\",\"content\":\"Weather?\"},{"
        "\"role\":\"assistant\",\"content\":[{\"type\":\"tool_use\",\"id\":\"call_1\",\"name\":"
        "\"get_weather\",\"input\":{\"city\":\"Paris\"}}]},{\"role\":\"user\",\"content\":[{"
        "\"type\":\"tool_result\",\"tool_use_id\":\"call_1\",\"content\":\"sunny\"}]}]}";
    REQUIRE(call("roll-mtool", "/v1/messages", ANT, b2, &r, 1) == 200);
    json_t *o = json_loads(r.body, 0, NULL);
    CHECK_EQ_STR(json_string_value(json_object_get(o, "stop_reason")), "end_turn");
    json_decref(o);
    px_resp_free(&r);
    json_t *u = upstream_request();
    json_t *msgs = json_object_get(u, "messages");
    CHECK_EQ_INT(json_array_size(msgs), 3);
    CHECK_EQ_STR(json_string_value(json_object_get(json_array_get(msgs, 2), "role")), "tool");
    json_decref(u);
    /* a reasoning model's thinking block */
    REQUIRE(call("roll-mtool", "/v1/messages", ANT,
                 "{\"model\":\"reasoning\",\"max_tokens\":9,\"messages\":[{\"role\":\"user\","
                 "\"content\":\"2+2?\"}]}",
                 &r, 1) == 200);
    o = json_loads(r.body, 0, NULL);
    json_t *t0 = json_array_get(json_object_get(o, "content"), 0);
    CHECK_EQ_STR(json_string_value(json_object_get(t0, "type")), "thinking");
    CHECK_EQ_STR(json_string_value(json_object_get(t0, "thinking")), "Two and two make four.");
    json_decref(o);
    px_resp_free(&r);
}

TEST(messages_errors_are_anthropic_shaped)
{
    px_resp r;
    REQUIRE(call("roll-merr", "/v1/messages", ANT,
                 "{\"model\":\"fail-500\",\"max_tokens\":9,\"messages\":[{\"role\":\"user\","
                 "\"content\":\"x\"}]}",
                 &r, 0) == 500);
    json_t *o = json_loads(r.body, 0, NULL);
    CHECK_EQ_STR(json_string_value(json_object_get(o, "type")), "error");
    CHECK_EQ_STR(json_string_value(json_object_get(json_object_get(o, "error"), "type")),
                 "api_error");
    CHECK(strstr(json_string_value(json_object_get(json_object_get(o, "error"), "message")),
                 "engine crashed") != NULL);
    json_decref(o);
    px_resp_free(&r);
    REQUIRE(call("roll-merr", "/v1/messages", ANT, "{\"model\":\"m\",\"messages\":[]}", &r, 0) ==
            400);
    CHECK(strstr(r.body, "\"type\":\"invalid_request_error\"") && strstr(r.body, "max_tokens"));
    px_resp_free(&r);
    /* no key: 401, in Anthropic's shape on its route */
    const char *nokey[] = {"Content-Type: application/json", "x-api-key: wrong", NULL};
    REQUIRE(call("roll-merr", "/v1/messages", nokey, "{}", &r, 0) == 401);
    CHECK(strstr(r.body, "\"type\":\"authentication_error\"") != NULL);
    px_resp_free(&r);
}

TEST(messages_count_tokens)
{
    px_resp r;
    REQUIRE(call("roll-ct", "/v1/messages/count_tokens?beta=true", ANT,
                 "{\"model\":\"m\",\"system\":\"Be exact.\",\"messages\":[{\"role\":\"user\","
                 "\"content\":\"What is 2+2?\"}],\"tools\":[{\"name\":\"get_weather\","
                 "\"input_schema\":{\"type\":\"object\"}}]}",
                 &r, 0) == 200);
    CHECK_EQ_STR(r.body, "{\"input_tokens\":12}");
    px_resp_free(&r);
    json_t *u = upstream_request(); /* the chat request /tokenize renders, nothing to generate */
    CHECK_EQ_INT(json_array_size(json_object_get(u, "messages")), 2);
    CHECK_EQ_INT(json_array_size(json_object_get(u, "tools")), 1);
    CHECK(!json_object_get(u, "max_tokens") && !json_object_get(u, "return_token_ids"));
    json_decref(u);
    REQUIRE(call("roll-ct", "/v1/messages/count_tokens", ANT, "{\"messages\":[]}", &r, 0) == 400);
    CHECK(strstr(r.body, "\"type\":\"error\"") && strstr(r.body, "model"));
    px_resp_free(&r);
}

TEST(probes_models_and_unknown_routes)
{
    px_resp r;
    char url[512];
    snprintf(url, sizeof url, "%s/r/task-x/roll-p", P.base);
    REQUIRE(px_http("HEAD", url, NULL, NULL, &r) == 0);
    CHECK_EQ_INT(r.status, 200);
    px_resp_free(&r);
    snprintf(url, sizeof url, "%s/r/task-x/roll-p/v1/models", P.base);
    REQUIRE(px_http("GET", url, ANT, NULL, &r) == 0);
    CHECK_EQ_INT(r.status, 200);
    json_t *o = json_loads(r.body, 0, NULL);
    json_t *m0 = json_array_get(json_object_get(o, "data"), 0);
    CHECK_EQ_STR(json_string_value(json_object_get(m0, "type")), "model");
    CHECK_EQ_STR(json_string_value(json_object_get(m0, "id")), "fake-model");
    CHECK(json_is_string(json_object_get(m0, "created_at")));
    CHECK(json_is_false(json_object_get(o, "has_more")));
    json_decref(o);
    px_resp_free(&r);
    REQUIRE(px_http("GET", url, OAI, NULL, &r) == 0); /* OpenAI's shape, as the upstream says */
    CHECK(strstr(r.body, "\"object\":\"list\"") != NULL);
    px_resp_free(&r);
    snprintf(url, sizeof url, "%s/v1/no/such/route?x=1", P.base);
    REQUIRE(px_http("POST", url, OAI, "{}", &r) == 0);
    CHECK_EQ_INT(r.status, 404);
    px_resp_free(&r);
}

/* A request with n tools of about 2.5 KB each, as coding agents send. */
static char *big_request(int messages_api, int n)
{
    char desc[2400];
    memset(desc, 'd', sizeof desc - 1);
    desc[sizeof desc - 1] = '\0';
    size_t cap = (size_t)n * 2600 + 4096, len = 0;
    char *b = malloc(cap);
    len += (size_t)snprintf(b + len, cap - len, "{\"model\":\"m\",%s\"tools\":[",
                            messages_api ? "\"max_tokens\":64," : "");
    for (int i = 0; i < n; i++)
        len += (size_t)snprintf(
            b + len, cap - len,
            messages_api
                ? "%s{\"name\":\"tool_%d\",\"description\":\"%s\",\"input_schema\":{\"type\":"
                  "\"object\",\"properties\":{\"arg\":{\"type\":\"string\"}}}}"
                : "%s{\"type\":\"function\",\"name\":\"tool_%d\",\"description\":\"%s\","
                  "\"parameters\":{\"type\":\"object\",\"properties\":{\"arg\":{\"type\":"
                  "\"string\"}}}}",
            i ? "," : "", i, desc);
    len += (size_t)snprintf(b + len, cap - len, "],%s",
                            messages_api ? "\"messages\":[{\"role\":\"user\",\"content\":\"go\"}]}"
                                         : "\"input\":\"go\"}");
    return b;
}

TEST(large_requests_with_many_tools)
{
    for (int api = 0; api < 2; api++) {
        char *b = big_request(api, 60);
        CHECK(strlen(b) > 150000);
        px_resp r;
        REQUIRE(call("roll-big", api ? "/v1/messages" : "/v1/responses", api ? ANT : OAI, b, &r,
                     0) == 200);
        json_t *u = upstream_request();
        CHECK_EQ_INT(json_array_size(json_object_get(u, "tools")), 60);
        json_decref(u);
        px_resp_free(&r);
        free(b);
    }
}

TEST(eval_route_for_the_new_apis)
{
    px_resp r;
    char url[512];
    snprintf(url, sizeof url, "%s/e/task-x/roll-ev/v1/responses", P.base);
    REQUIRE(px_http("POST", url, OAI, "{\"model\":\"m\",\"input\":\"x\",\"temperature\":0.9}",
                    &r) == 0);
    CHECK_EQ_INT(r.status, 200);
    px_resp_free(&r);
    json_t *u = upstream_request();
    CHECK(json_number_value(json_object_get(u, "temperature")) == 0.0 &&
          json_object_get(u, "temperature"));
    json_decref(u);
    snprintf(url, sizeof url, "%s/e:0.5/task-x/roll-ev/v1/messages", P.base);
    REQUIRE(px_http("POST", url, ANT,
                    "{\"model\":\"m\",\"max_tokens\":5,\"messages\":[{\"role\":\"user\","
                    "\"content\":\"x\"}]}",
                    &r) == 0);
    CHECK_EQ_INT(r.status, 200);
    px_resp_free(&r);
    u = upstream_request();
    CHECK(json_number_value(json_object_get(u, "temperature")) == 0.5);
    json_decref(u);
}

TEST(each_call_is_a_span_with_tokens_and_what_the_agent_sent_and_got)
{
    al_test_msgs m;
    /* every call: those kept in SENT, the store: false one, the two the upstream failed, the
     * two large ones, the four with a NUL and the two eval ones (refused requests make none) */
    CHECK(al_test_topic_read(B.bootstrap, "arclight.spans", NULL, (size_t)NSENT + 11, 30000, &m) ==
          0);
    const char *rollouts[] = {"roll-rt", "roll-rs", "roll-rtool",
                              "roll-rr", "roll-mt", "roll-mtool"};
    int checked = 0;
    for (size_t ri = 0; ri < sizeof rollouts / sizeof *rollouts; ri++) {
        al_span s[16];
        size_t n = px_spans_of(&m, rollouts[ri], s, 16);
        size_t k = 0;
        for (int i = 0; i < NSENT; i++) {
            if (strcmp(SENT[i].rollout, rollouts[ri])) continue;
            CHECKF(k < n, "%s: call %zu has no span", rollouts[ri], k);
            if (k >= n) break;
            const al_llm_call *c = &s[k].llm_call;
            CHECK_EQ_INT(s[k].sequence, (int64_t)k);
            CHECK_EQ_INT(c->n_response_tokens, 4);
            CHECK_EQ_INT(c->n_response_logprobs, 4);
            CHECK(c->n_prompt_tokens > 0);
            CHECK_EQ_INT(c->stream, SENT[i].stream);
            CHECK_EQ_INT(c->policy_version, 7);
            CHECKF(!strcmp(c->request_json, SENT[i].body), "%s call %zu: request_json %s",
                   rollouts[ri], k, c->request_json);
            if (SENT[i].answer)
                CHECKF(!strcmp(c->response_json, SENT[i].answer),
                       "%s call %zu: response_json %.300s\n  agent got %.300s", rollouts[ri], k,
                       c->response_json, SENT[i].answer);
            else
                CHECKF(strstr(c->response_json, "\"status\":\"completed\"") ||
                           strstr(c->response_json, "\"type\":\"message\""),
                       "%s call %zu: stream's response_json %.300s", rollouts[ri], k,
                       c->response_json);
            checked++;
            k++;
        }
        CHECKF(k == n, "%s: %zu spans for %zu calls", rollouts[ri], n, k);
        for (size_t i = 0; i < n; i++)
            al_span_clear(&s[i]);
    }
    CHECK(checked == NSENT && NSENT == 11);
    /* a call the upstream refused: its status, its error, the error the agent got */
    al_span f[2];
    REQUIRE(px_spans_of(&m, "roll-rfail", f, 2) == 1);
    CHECK_EQ_INT(f[0].llm_call.http_status, 400);
    CHECK(f[0].llm_call.error && strstr(f[0].llm_call.error, "upstream answered 400"));
    CHECK(strstr(f[0].llm_call.response_json, "maximum context length") != NULL);
    al_span_clear(&f[0]);
    al_span ev[4];
    size_t ne = px_spans_of(&m, "roll-ev", ev, 4);
    CHECK_EQ_INT(ne, 2);
    for (size_t i = 0; i < ne; i++) {
        CHECK(ev[i].eval);
        al_span_clear(&ev[i]);
    }
    al_test_msgs_free(&m);
    /* an access-log line for every call, and for the unknown route */
    CHECK(px_file_contains(LOG, "path=/r/task-x/roll-mt/v1/messages?beta=true status=200"));
    CHECK(px_file_contains(LOG, "path=/v1/no/such/route?x=1 status=404"));
    CHECK(!px_file_contains(LOG, KEY));
}

TEST(teardown)
{
    CHECK_EQ_INT(px_stop(&P, SIGTERM, 30), 0);
    fake_upstream_stop(U);
    al_test_broker_stop(&B);
    for (int i = 0; i < NSENT; i++) {
        free(SENT[i].body);
        free(SENT[i].answer);
    }
    al_test_rmtree(TMP);
    curl_global_cleanup();
}
