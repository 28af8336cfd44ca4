/*
 * t1007_proxy_translate: the Responses API and Anthropic Messages translators
 * (lib/api/translate.c, responses.c, messages.c) against fixtures written from each
 * API's published reference (the JSON files in tests/proxy; the values are ours). For each fixture:
 * the agent's request becomes the expected chat completions request; a whole chat answer
 * becomes the expected answer object; a chat stream becomes the expected events, in order,
 * each with its own type in its data (and, for the Responses API, consecutive
 * sequence_numbers), and ends as the expected final answer. Expected objects are matched as
 * subsets: every key they name must be there with that value; arrays must have the same
 * length. Then what fixtures cannot say: previous_response_id over the store's
 * conversation, a stream that fails, error bodies, and requests each API refuses.
 */
#include "testlib.h"

#include "api/translate.h"

#include <jansson.h>
#include <stdio.h>
#include <string.h>

static const char *src_dir(void)
{
    const char *s = getenv("ARCLIGHT_SOURCE_DIR");
    return s && *s ? s : ".";
}

static json_t *fixture(const char *name)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/tests/proxy/%s", src_dir(), name);
    json_error_t je;
    json_t *f = json_load_file(path, 0, &je);
    if (!f) fprintf(stderr, "%s: %s (line %d)\n", path, je.text, je.line);
    return f;
}

/* Whether actual has everything expected has (see the top); where not, *why says where. */
static int subset(json_t *exp, json_t *act, const char *at, char *why, size_t n)
{
    if (json_is_object(exp)) {
        if (!json_is_object(act)) {
            snprintf(why, n, "%s: not an object", at);
            return 0;
        }
        const char *k;
        json_t *v;
        json_object_foreach(exp, k, v)
        {
            char sub[512];
            snprintf(sub, sizeof sub, "%s.%s", at, k);
            json_t *a = json_object_get(act, k);
            if (!a) {
                snprintf(why, n, "%s: missing", sub);
                return 0;
            }
            if (!subset(v, a, sub, why, n)) return 0;
        }
        return 1;
    }
    if (json_is_array(exp)) {
        if (!json_is_array(act) || json_array_size(act) != json_array_size(exp)) {
            snprintf(why, n, "%s: array of %zu expected, got %zu", at, json_array_size(exp),
                     json_is_array(act) ? json_array_size(act) : 0);
            return 0;
        }
        for (size_t i = 0; i < json_array_size(exp); i++) {
            char sub[512];
            snprintf(sub, sizeof sub, "%s[%zu]", at, i);
            if (!subset(json_array_get(exp, i), json_array_get(act, i), sub, why, n)) return 0;
        }
        return 1;
    }
    if (json_is_number(exp) && json_is_number(act) &&
        json_number_value(exp) == json_number_value(act))
        return 1;
    if (json_equal(exp, act)) return 1;
    char *e = json_dumps(exp, JSON_ENCODE_ANY), *a = json_dumps(act, JSON_ENCODE_ANY);
    snprintf(why, n, "%s: expected %s, got %s", at, e ? e : "?", a ? a : "(absent)");
    free(e);
    free(a);
    return 0;
}

#define CHECK_SUBSET(exp, act, what)                                                               \
    do {                                                                                           \
        char why_[1024] = "";                                                                      \
        int ok_ = subset((exp), (act), what, why_, sizeof why_);                                   \
        CHECKF(ok_, "%s", why_);                                                                   \
    } while (0)

/* A store of one conversation, for previous_response_id. */
static char STORED_ID[96];
static json_t *STORED;
static json_t *lookup(void *ud, const char *id)
{
    (void)ud;
    return STORED && !strcmp(id, STORED_ID) ? json_incref(STORED) : NULL;
}

static al_api api_of(json_t *f)
{
    const char *a = json_string_value(json_object_get(f, "api"));
    return a && !strcmp(a, "messages") ? AL_API_MESSAGES : AL_API_RESPONSES;
}

static al_xl *translate(al_api api, json_t *req, json_t **chat, al_xl_err *err)
{
    char *body = json_dumps(req, JSON_COMPACT);
    al_xl_env env = {"s0", 1762000000, lookup, NULL, 0};
    al_xl *x = al_xl_request(api, body, strlen(body), &env, chat, err);
    free(body);
    return x;
}

/* The events in SSE text: [[type, data], ...]; checks each data's type is its event's. */
static json_t *parse_events(const char *p)
{
    json_t *evs = json_array();
    while (p && *p) {
        const char *end = strstr(p, "\n\n");
        if (!end) break;
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        if (strncmp(p, "event: ", 7) != 0 || !nl || strncmp(nl + 1, "data: ", 6) != 0) {
            json_array_append_new(evs, json_pack("[s,n]", "(not an SSE event)"));
            break;
        }
        json_t *data = json_loadb(nl + 7, (size_t)(end - nl - 7), 0, NULL);
        json_array_append_new(
            evs, json_pack("[s#,o]", p + 7, (int)(nl - p - 7), data ? data : json_null()));
        p = end + 2;
    }
    return evs;
}

static void check_events(json_t *f, al_api api, json_t *got)
{
    json_t *want = json_object_get(f, "events");
    size_t n = json_array_size(got);
    CHECKF(n == json_array_size(want), "%zu events, expected %zu", n, json_array_size(want));
    for (size_t i = 0; i < n; i++) {
        json_t *g = json_array_get(got, i);
        const char *type = json_string_value(json_array_get(g, 0));
        json_t *data = json_array_get(g, 1);
        CHECKF(json_is_object(data), "event %zu (%s): data is not a JSON object", i, type);
        const char *dt = json_string_value(json_object_get(data, "type"));
        CHECKF(dt && type && !strcmp(dt, type), "event %zu: event %s carries type %s", i, type,
               dt ? dt : "(none)");
        if (api == AL_API_RESPONSES)
            CHECKF(json_integer_value(json_object_get(data, "sequence_number")) == (json_int_t)i,
                   "event %zu: sequence_number %lld", i,
                   (long long)json_integer_value(json_object_get(data, "sequence_number")));
        if (i >= json_array_size(want)) continue;
        json_t *w = json_array_get(want, i);
        const char *wt = json_string_value(json_array_get(w, 0));
        CHECKF(type && wt && !strcmp(type, wt), "event %zu: %s, expected %s", i, type, wt);
        char at[64];
        snprintf(at, sizeof at, "event[%zu] %s", i, wt ? wt : "");
        CHECK_SUBSET(json_array_get(w, 1), data, at);
    }
}

static void run_fixture(const char *name)
{
    json_t *f = fixture(name);
    REQUIRE(f);
    al_api api = api_of(f);
    json_t *req = json_object_get(f, "request"), *chat = NULL;
    al_xl_err err;
    /* the request */
    al_xl *x = translate(api, req, &chat, &err);
    CHECKF(x != NULL, "%s: refused: %d %s", name, err.status, err.message);
    if (!x) {
        json_decref(f);
        return;
    }
    CHECK_SUBSET(json_object_get(f, "chat_request"), chat, "chat_request");
    size_t i;
    json_t *k;
    json_array_foreach(json_object_get(f, "chat_request_lacks"), i, k) CHECKF(
        !json_object_get(chat, json_string_value(k)), "chat_request has %s", json_string_value(k));
    CHECK(!al_xl_stream(x));
    json_decref(chat);
    /* the whole answer */
    json_t *ans = al_xl_answer(x, json_object_get(f, "chat_answer"), &err);
    CHECKF(ans != NULL, "%s: answer refused: %s", name, err.message);
    if (ans) CHECK_SUBSET(json_object_get(f, "answer"), ans, "answer");
    json_decref(ans);
    al_xl_free(x);
    /* the stream */
    json_t *sreq = json_deep_copy(req);
    json_object_update(sreq, json_object_get(f, "stream_request_extra"));
    x = translate(api, sreq, &chat, &err);
    json_decref(sreq);
    REQUIRE(x);
    CHECK(json_is_true(json_object_get(chat, "stream")));
    CHECK(al_xl_stream(x));
    json_decref(chat);
    al_buf out = {0};
    json_t *c;
    json_array_foreach(json_object_get(f, "chat_stream"), i, c) CHECK(al_xl_chunk(x, c, &out) == 0);
    CHECK(al_xl_final(x) == NULL);
    CHECK(al_xl_end(x, NULL, &out) == 0);
    size_t len = out.len;
    CHECK(al_xl_end(x, NULL, &out) == 0); /* idempotent */
    CHECK(out.len == len);
    json_t *evs = parse_events(out.data);
    check_events(f, api, evs);
    json_decref(evs);
    json_t *final = al_xl_final(x);
    CHECK(final != NULL);
    if (json_object_get(f, "final")) CHECK_SUBSET(json_object_get(f, "final"), final, "final");
    /* the Responses stream's last event carries the final answer whole */
    if (api == AL_API_RESPONSES && final) {
        json_t *evs2 = parse_events(out.data);
        json_t *last = json_array_get(evs2, json_array_size(evs2) - 1);
        CHECK(json_equal(json_object_get(json_array_get(last, 1), "response"), final));
        json_decref(evs2);
    }
    al_buf_free(&out);
    al_xl_free(x);
    /* a follow-up request */
    json_t *next = json_object_get(f, "next_request");
    if (next) {
        x = translate(api, json_object_get(next, "request"), &chat, &err);
        CHECKF(x != NULL, "next request refused: %s", err.message);
        if (x) CHECK_SUBSET(json_object_get(next, "chat_request"), chat, "next chat_request");
        json_decref(chat);
        al_xl_free(x);
    }
    json_decref(f);
}

TEST(responses_text)
{
    run_fixture("responses_text.json");
}

TEST(responses_tools)
{
    run_fixture("responses_tools.json");
}

TEST(responses_reasoning_incomplete)
{
    run_fixture("responses_reasoning.json");
}

TEST(responses_custom_and_namespace_tools)
{
    run_fixture("responses_codex_tools.json");
}

TEST(messages_text)
{
    run_fixture("messages_text.json");
}

TEST(messages_tools_and_thinking)
{
    run_fixture("messages_tools.json");
}

TEST(previous_response_id_continues_the_stored_conversation)
{
    json_t *f = fixture("responses_tools.json"), *chat = NULL;
    REQUIRE(f);
    al_xl_err err;
    json_t *req = json_deep_copy(json_object_get(f, "request"));
    json_object_set_new(req, "instructions", json_string("Be brief."));
    al_xl *x = translate(AL_API_RESPONSES, req, &chat, &err);
    json_decref(req);
    REQUIRE(x);
    json_decref(chat);
    json_t *ans = al_xl_answer(x, json_object_get(f, "chat_answer"), &err);
    REQUIRE(ans);
    CHECK(al_xl_store(x));
    json_decref(STORED);
    STORED = al_xl_conversation(x);
    snprintf(STORED_ID, sizeof STORED_ID, "%s", al_xl_id(x));
    CHECK_EQ_STR(STORED_ID, "resp_s0");
    /* the conversation without the instructions, then the answer as one message */
    REQUIRE(json_array_size(STORED) == 5);
    json_t *last = json_array_get(STORED, 4);
    CHECK_EQ_STR(json_string_value(json_object_get(last, "role")), "assistant");
    CHECK(json_array_size(json_object_get(last, "tool_calls")) == 2);
    json_decref(ans);
    al_xl_free(x);

    json_t *r2 =
        json_pack("{s:s,s:s,s:s,s:[{s:s,s:s,s:s},{s:s,s:s,s:s}]}", "model", "policy-1",
                  "instructions", "Now summarise.", "previous_response_id", "resp_s0", "input",
                  "type", "function_call_output", "call_id", "call_b", "output", "55.0", "type",
                  "function_call_output", "call_id", "call_c", "output", "101.5");
    x = translate(AL_API_RESPONSES, r2, &chat, &err);
    CHECKF(x != NULL, "refused: %s", err.message);
    json_t *msgs = json_object_get(chat, "messages");
    CHECK_EQ_INT(json_array_size(msgs), 8); /* new instructions + 5 stored + 2 outputs */
    CHECK_EQ_STR(json_string_value(json_object_get(json_array_get(msgs, 0), "content")),
                 "Now summarise.");
    CHECK_EQ_STR(json_string_value(json_object_get(json_array_get(msgs, 1), "content")),
                 "Use the tools.");
    CHECK_EQ_STR(json_string_value(json_object_get(json_array_get(msgs, 7), "tool_call_id")),
                 "call_c");
    /* the stored conversation itself is unchanged */
    CHECK_EQ_INT(json_array_size(STORED), 5);
    json_decref(chat);
    al_xl_free(x);
    /* store: false, and an unknown id */
    json_object_set_new(r2, "previous_response_id", json_string("resp_other"));
    x = translate(AL_API_RESPONSES, r2, &chat, &err);
    CHECK(x == NULL && err.status == 400 && !strcmp(err.code, "previous_response_not_found"));
    json_decref(r2);
    json_decref(STORED);
    STORED = NULL;
    json_decref(f);
}

TEST(no_store_refuses_previous_response_id_saying_so)
{
    const char *b = "{\"model\":\"m\",\"input\":\"x\",\"previous_response_id\":\"resp_1\"}";
    al_xl_env env = {"s0", 0, NULL, NULL, 0};
    json_t *chat;
    al_xl_err err;
    al_xl *x = al_xl_request(AL_API_RESPONSES, b, strlen(b), &env, &chat, &err);
    CHECK(x == NULL);
    CHECK_EQ_INT(err.status, 400);
    CHECK(strstr(err.message, "keeps no responses") != NULL);
}

TEST(a_failed_stream_ends_with_the_apis_failure_event)
{
    for (int a = 0; a < 2; a++) {
        al_api api = a ? AL_API_MESSAGES : AL_API_RESPONSES;
        const char *b = a ? "{\"model\":\"m\",\"max_tokens\":9,\"stream\":true,\"messages\":[{"
                            "\"role\":\"user\",\"content\":\"x\"}]}"
                          : "{\"model\":\"m\",\"stream\":true,\"input\":\"x\"}";
        al_xl_env env = {"s1", 0, NULL, NULL, 0};
        json_t *chat;
        al_xl_err err;
        al_xl *x = al_xl_request(api, b, strlen(b), &env, &chat, &err);
        REQUIRE(x);
        json_decref(chat);
        json_t *c =
            json_loads("{\"choices\":[{\"index\":0,\"delta\":{\"content\":\"par\"}}]}", 0, NULL);
        al_buf out = {0};
        CHECK(al_xl_chunk(x, c, &out) == 0);
        CHECK(al_xl_end(x, "upstream went away", &out) == 0);
        json_t *evs = parse_events(out.data);
        json_t *last = json_array_get(evs, json_array_size(evs) - 1);
        const char *type = json_string_value(json_array_get(last, 0));
        json_t *data = json_array_get(last, 1);
        if (a) {
            CHECK_EQ_STR(type, "error");
            CHECK_EQ_STR(json_string_value(json_object_get(json_object_get(data, "error"), "type")),
                         "api_error");
        } else {
            CHECK_EQ_STR(type, "response.failed");
            json_t *r = json_object_get(data, "response");
            CHECK_EQ_STR(json_string_value(json_object_get(r, "status")), "failed");
            CHECK_EQ_STR(json_string_value(json_object_get(json_object_get(r, "error"), "message")),
                         "upstream went away");
            /* what was said before the failure is in the output, closed */
            CHECK_EQ_INT(json_array_size(json_object_get(r, "output")), 1);
        }
        json_decref(evs);
        json_decref(c);
        al_buf_free(&out);
        al_xl_free(x);
    }
}

TEST(an_empty_answer_is_an_empty_message)
{
    const char *b = "{\"model\":\"m\",\"input\":\"x\"}";
    al_xl_env env = {"s4", 0, NULL, NULL, 0};
    json_t *chat;
    al_xl_err err;
    al_xl *x = al_xl_request(AL_API_RESPONSES, b, strlen(b), &env, &chat, &err);
    REQUIRE(x);
    json_decref(chat);
    json_t *c = json_loads("{\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\","
                           "\"content\":\"\"},\"finish_reason\":\"stop\"}]}",
                           0, NULL);
    json_t *ans = al_xl_answer(x, c, &err);
    REQUIRE(ans);
    json_t *item = json_array_get(json_object_get(ans, "output"), 0);
    CHECK_EQ_INT(json_array_size(json_object_get(ans, "output")), 1);
    CHECK_EQ_STR(json_string_value(json_object_get(item, "type")), "message");
    CHECK_EQ_STR(json_string_value(
                     json_object_get(json_array_get(json_object_get(item, "content"), 0), "text")),
                 "");
    json_decref(ans);
    json_decref(c);
    al_xl_free(x);
    /* streamed: the message's events come before response.completed */
    b = "{\"model\":\"m\",\"input\":\"x\",\"stream\":true}";
    x = al_xl_request(AL_API_RESPONSES, b, strlen(b), &env, &chat, &err);
    REQUIRE(x);
    json_decref(chat);
    al_buf out = {0};
    CHECK(al_xl_end(x, NULL, &out) == 0);
    json_t *evs = parse_events(out.data);
    CHECK_EQ_INT(json_array_size(evs), 8);
    CHECK_EQ_STR(json_string_value(json_array_get(json_array_get(evs, 2), 0)),
                 "response.output_item.added");
    CHECK_EQ_STR(json_string_value(json_array_get(json_array_get(evs, 7), 0)),
                 "response.completed");
    json_decref(evs);
    al_buf_free(&out);
    al_xl_free(x);
}

TEST(count_tokens_needs_no_max_tokens)
{
    const char *b = "{\"model\":\"m\",\"temperature\":0.5,\"messages\":[{\"role\":\"user\","
                    "\"content\":\"x\"}]}";
    al_xl_env env = {"c0", 0, NULL, NULL, 1};
    json_t *chat;
    al_xl_err err;
    al_xl *x = al_xl_request(AL_API_MESSAGES, b, strlen(b), &env, &chat, &err);
    CHECKF(x != NULL, "refused: %s", x ? "" : err.message);
    CHECK(!json_object_get(chat, "max_tokens") && !json_object_get(chat, "temperature"));
    CHECK_EQ_INT(json_array_size(json_object_get(chat, "messages")), 1);
    json_decref(chat);
    al_xl_free(x);
}

TEST(the_upstream_answer_must_be_a_chat_completion)
{
    const char *b = "{\"model\":\"m\",\"input\":\"x\"}";
    al_xl_env env = {"s2", 0, NULL, NULL, 0};
    json_t *chat;
    al_xl_err err;
    al_xl *x = al_xl_request(AL_API_RESPONSES, b, strlen(b), &env, &chat, &err);
    REQUIRE(x);
    json_decref(chat);
    json_t *bad = json_loads("{\"choices\":[]}", 0, NULL);
    CHECK(al_xl_answer(x, bad, &err) == NULL);
    CHECK_EQ_INT(err.status, 502);
    json_decref(bad);
    al_xl_free(x);
}

TEST(error_bodies_in_each_apis_shape)
{
    char *m = al_xl_error_body(AL_API_MESSAGES, 429, "rate_limit", NULL, "slow down");
    CHECK_EQ_STR(m, "{\"type\":\"error\",\"error\":{\"type\":\"rate_limit_error\",\"message\":"
                    "\"slow down\"}}");
    free(m);
    m = al_xl_error_body(AL_API_MESSAGES, 503, NULL, NULL, "busy");
    CHECK(strstr(m, "overloaded_error") != NULL);
    free(m);
    m = al_xl_error_body(AL_API_RESPONSES, 400, "invalid_request_error", "bad_thing", "no");
    CHECK_EQ_STR(m, "{\"error\":{\"message\":\"no\",\"type\":\"invalid_request_error\",\"param\":"
                    "null,\"code\":\"bad_thing\"}}");
    free(m);
}

TEST(refused_requests)
{
    json_t *f = fixture("errors.json"), *c;
    REQUIRE(f);
    size_t i;
    json_array_foreach(json_object_get(f, "cases"), i, c)
    {
        al_api api = api_of(c);
        json_t *r = json_object_get(c, "request");
        char *body =
            r ? json_dumps(r, JSON_COMPACT) : strdup(json_string_value(json_object_get(c, "body")));
        al_xl_env env = {"s3", 0, lookup, NULL, 0};
        json_t *chat = NULL;
        al_xl_err err;
        al_xl *x = al_xl_request(api, body, strlen(body), &env, &chat, &err);
        const char *has = json_string_value(json_object_get(c, "has"));
        const char *code = json_string_value(json_object_get(c, "code"));
        CHECKF(!x && !chat, "case %zu (%s) accepted", i, body);
        if (!x) {
            CHECKF(err.status == json_integer_value(json_object_get(c, "status")),
                   "case %zu: status %d", i, err.status);
            CHECKF(strstr(err.message, has) != NULL, "case %zu: message '%s' lacks '%s'", i,
                   err.message, has);
            if (code) CHECKF(!strcmp(err.code, code), "case %zu: code %s", i, err.code);
        }
        al_xl_free(x);
        json_decref(chat);
        free(body);
    }
    json_decref(f);
}
