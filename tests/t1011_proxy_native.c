/*
 * t1011_proxy_native: POST /v1/responses passed through `arclight proxy --upstream-native
 * responses` to `arclight serve`, which serves that route itself with token ids the way
 * vLLM's Responses API gives them (enable_response_messages: input_messages and
 * output_messages; include message.output_text.logprobs). Whole and streamed, a text and a
 * function call (the served model is tests/serve/tool-tiny, taught by t1103 to call
 * get_weather for "Weather in Paris?"; greedy, so that the same request gives the same
 * tokens every time):
 *   - the agent's bytes are what serve sends a plain request (no capture additions), byte
 *     for byte once the call's random ids and its creation second are set aside;
 *   - the upstream got the additions (serve's own answer to the request with them is what
 *     the span's token ids and logprobs are checked against);
 *   - each call is one span: prompt and response token ids equal to serve's input_messages
 *     and output_messages, logprobs equal to its output_text logprobs (none for a function
 *     call, as vLLM), the agent's request byte for byte and the answer it got;
 *   - an agent that asks for the additions itself gets them; an upstream error passes
 *     through as it was;
 *   - POST /v1/messages passed through (--upstream-native messages) to the test upstream,
 *     which serves it the way vLLM's Messages API does, without token ids: the agent gets
 *     its bytes as they were (nothing is added there), the span has the usage, the finish
 *     and the message the agent got but no token ids, and the log says so.
 */
#define _GNU_SOURCE
#include "testlib.h"
#include "broker_fixture.h"
#include "t1099_proxy_helpers.h"
#include "t1199_serve_helpers.h"
#include "fake_upstream.h"

#include <ctype.h>
#include <jansson.h>

static al_test_broker B;
static sv_server S;
static px_child P, PM; /* before serve (responses), before the test upstream (messages) */
static fake_upstream *U;
static char TMP[512], LOG[600], MODEL[700];
static const char *SERVED = "arclight-tiny";

#define TOOLS                                                                                     \
    "[{\"type\":\"function\",\"name\":\"get_weather\",\"description\":\"Weather of a city\","     \
    "\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}},"       \
    "\"required\":[\"city\"]}}]"
static const char *const B_TEXT =
    "{\"model\":\"arclight-tiny\",\"input\":\"Hello\",\"temperature\":0,\"max_output_tokens\":6}";
static const char *const B_TOOL = "{\"model\":\"arclight-tiny\",\"input\":\"Weather in Paris?\","
                                  "\"tools\":" TOOLS ",\"temperature\":0}";
static const char *const B_TEXT_S = "{\"model\":\"arclight-tiny\",\"input\":\"Hello\",\"temperature\":"
                                    "0,\"max_output_tokens\":6,\"stream\":true}";
static const char *const B_TOOL_S = "{\"model\":\"arclight-tiny\",\"input\":\"Weather in Paris?\","
                                    "\"tools\":" TOOLS ",\"temperature\":0,\"stream\":true}";
/* what capture adds, written by the agent itself */
static const char *const B_OWN =
    "{\"model\":\"arclight-tiny\",\"input\":\"Hello\",\"temperature\":0,\"max_output_tokens\":6,"
    "\"enable_response_messages\":true,\"include\":[\"message.output_text.logprobs\"]}";

/* body with capture's additions, as the proxy sends it upstream (malloc'd) */
static char *with_additions(const char *body)
{
    json_t *o = json_loads(body, 0, NULL);
    json_object_set_new(o, "enable_response_messages", json_true());
    json_object_set_new(o, "include", json_pack("[s]", "message.output_text.logprobs"));
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    return s;
}

/* The call's own random parts set aside: every run of exactly 24 hex digits holding a
 * letter (the answer's id seed in resp_, msg_ and fc_ ids, serve's tool call ids) becomes x's,
 * and "created_at" values 0. In place. */
static void normalize(char *s)
{
    for (char *p = s; *p;) {
        if (!strncmp(p, "\"created_at\":", 13)) {
            p += 13;
            char *q = p;
            while (isdigit((unsigned char)*q))
                q++;
            if (q > p) {
                *p = '0';
                memmove(p + 1, q, strlen(q) + 1);
            }
            continue;
        }
        if (isxdigit((unsigned char)*p) && (p == s || !isalnum((unsigned char)p[-1]))) {
            char *q = p;
            int letter = 0;
            while (*q && strchr("0123456789abcdef", *q)) {
                letter |= *q >= 'a';
                q++;
            }
            if (q - p == 24 && letter && !isalnum((unsigned char)*q)) memset(p, 'x', 24);
            p = q > p ? q : p + 1;
            continue;
        }
        p++;
    }
}

static long post(const char *base, const char *path, const char *body, px_resp *r)
{
    char url[512];
    snprintf(url, sizeof url, "%s%s", base, path);
    if (px_http("POST", url, PX_JSON, body, r) != 0) return -1;
    return r->status;
}

/* The Response of a body: the whole answer, or that of a stream's last event. New ref. */
static json_t *response_of(const char *body)
{
    const char *last = NULL;
    for (const char *p = body; (p = strstr(p, "data: ")); p += 6)
        last = p;
    if (!last) return json_loads(body, 0, NULL);
    const char *e = strchr(last, '\n');
    json_t *o = json_loadb(last + 6, e ? (size_t)(e - last - 6) : strlen(last + 6), 0, NULL);
    json_t *r = json_incref(json_object_get(o, "response"));
    json_decref(o);
    return r;
}

typedef struct expect {
    const char *rollout, *body;
    char *agent_got;   /* what the agent got from the proxy */
    json_t *upstream;  /* serve's Response to the body with the additions */
    int stream, tool;
} expect;
static expect E[8];
static int NE;

/* One call through the proxy, checked against serve's answers to the same request, plain
 * and with capture's additions. */
static void pass_through(const char *rollout, const char *body, int stream, int tool)
{
    px_resp a, d, u;
    char path[200];
    snprintf(path, sizeof path, "/r/task-n/%s/v1/responses", rollout);
    REQUIRE(post(P.base, path, body, &a) == 200);
    REQUIRE(post(S.url, "/v1/responses", body, &d) == 200);
    char *plus = with_additions(body);
    REQUIRE(post(S.url, "/v1/responses", plus, &u) == 200);
    free(plus);
    if (stream) CHECK(strstr(a.headers, "text/event-stream") != NULL);
    /* the agent sees what a plain server of the API sends */
    char *an = strdup(a.body), *dn = strdup(d.body);
    normalize(an);
    normalize(dn);
    CHECKF(!strcmp(an, dn), "%s: the agent got\n%.2000s\n  serve sends\n%.2000s", rollout, an,
           dn);
    CHECK(!strstr(a.body, "input_messages") && !strstr(a.body, "output_messages"));
    CHECK(!strstr(a.body, "\"logprob\":"));
    /* and serve did send the additions the proxy asked for */
    CHECK(strstr(u.body, "\"input_messages\"") && strstr(u.body, "raw_message_tokens"));
    json_t *ur = response_of(u.body);
    REQUIRE(ur);
    const char *first = json_string_value(
        json_object_get(json_array_get(json_object_get(ur, "output"), 0), "type"));
    CHECK_EQ_STR(first ? first : "", tool ? "function_call" : "message");
    free(an), free(dn);
    expect *e = &E[NE++];
    e->rollout = rollout, e->body = body, e->stream = stream, e->tool = tool;
    e->agent_got = strdup(a.body);
    e->upstream = ur;
    px_resp_free(&a), px_resp_free(&d), px_resp_free(&u);
}

TEST(setup)
{
    curl_global_init(CURL_GLOBAL_DEFAULT);
    REQUIRE(al_test_broker_start(&B, NULL) == 0);
    al_test_tmpdir(TMP, sizeof TMP, "proxy");
    REQUIRE(TMP[0]);
    snprintf(MODEL, sizeof MODEL, "%s/tool-tiny", TMP);
    REQUIRE(sv_sh("mkdir -p %s && cp tests/serve/tool-tiny/config.json "
                  "tests/serve/tool-tiny/model.safetensors tests/tokenizer/tiny/tokenizer.json "
                  "tests/tokenizer/tiny/tokenizer_config.json %s/",
                  MODEL, MODEL) == 0);
    char slog[700];
    snprintf(slog, sizeof slog, "%s/serve.log", TMP);
    const char *sargs[] = {"--model", MODEL, "--served-model-name", SERVED, "--policy-version",
                           "3",       NULL};
    REQUIRE(sv_start_log(&S, sargs, slog) == 0);
    snprintf(LOG, sizeof LOG, "%s/proxy.log", TMP);
    char spool[600];
    snprintf(spool, sizeof spool, "%s/spool", TMP);
    const char *args[] = {"--listen",        "127.0.0.1:0", "--upstream",  S.url,
                          "--upstream-native", "responses", "--bootstrap", B.bootstrap,
                          "--spool-dir",     spool,         NULL};
    REQUIRE(px_start(&P, LOG, args, NULL) == 0);
    U = fake_upstream_start(0, 1);
    REQUIRE(U);
    char up[128], mlog[700], mspool[700];
    snprintf(up, sizeof up, "http://127.0.0.1:%d", fake_upstream_port(U));
    snprintf(mlog, sizeof mlog, "%s/proxy-messages.log", TMP);
    snprintf(mspool, sizeof mspool, "%s/spool-messages", TMP);
    const char *margs[] = {"--listen",          "127.0.0.1:0", "--upstream",  up,
                           "--upstream-native", "messages",    "--bootstrap", B.bootstrap,
                           "--spool-dir",       mspool,        NULL};
    REQUIRE(px_start(&PM, mlog, margs, NULL) == 0);
}

TEST(flag_is_checked)
{
    char cmd[800];
    snprintf(cmd, sizeof cmd, "%s proxy --upstream-native chat --upstream http://127.0.0.1:1 "
             ">/dev/null 2>%s/flag.err", al_test_bin(), TMP);
    CHECK(system(cmd) != 0);
    char err[700];
    snprintf(err, sizeof err, "%s/flag.err", TMP);
    CHECK(px_file_contains(err, "--upstream-native chat: use responses, messages"));
}

TEST(whole_text)
{
    pass_through("roll-nt", B_TEXT, 0, 0);
}

TEST(whole_function_call)
{
    pass_through("roll-nf", B_TOOL, 0, 1);
}

TEST(streamed_text)
{
    pass_through("roll-nts", B_TEXT_S, 1, 0);
}

TEST(streamed_function_call)
{
    pass_through("roll-nfs", B_TOOL_S, 1, 1);
}

/* An agent that asks for token ids and logprobs itself gets them. */
TEST(agent_asks_for_the_additions_itself)
{
    px_resp a, d;
    REQUIRE(post(P.base, "/r/task-n/roll-own/v1/responses", B_OWN, &a) == 200);
    REQUIRE(post(S.url, "/v1/responses", B_OWN, &d) == 200);
    normalize(a.body);
    normalize(d.body);
    CHECKF(!strcmp(a.body, d.body), "agent got %.600s\n  serve sends %.600s", a.body, d.body);
    CHECK(strstr(a.body, "\"output_messages\"") && strstr(a.body, "\"logprob\":"));
    px_resp_free(&a), px_resp_free(&d);
}

/* serve's refusal reaches the agent as serve sent it, and is a span with its status. */
TEST(upstream_error_passes_through)
{
    const char *bad = "{\"model\":\"no-such-model\",\"input\":\"Hello\"}";
    px_resp a, d;
    long st = post(P.base, "/r/task-n/roll-nerr/v1/responses", bad, &a);
    REQUIRE(post(S.url, "/v1/responses", bad, &d) == st);
    CHECK(st == 404);
    CHECK_EQ_STR(a.body, d.body);
    px_resp_free(&a), px_resp_free(&d);
}

/* serve's Responses route refuses what it cannot serve in the Responses API's shape, and the
 * agent behind the proxy gets that refusal as serve sent it. */
TEST(serve_refuses_in_the_apis_shape)
{
    const char *prev = "{\"model\":\"arclight-tiny\",\"input\":\"Hi\",\"previous_response_id\":"
                       "\"resp_abc\"}";
    const char *noinput = "{\"model\":\"arclight-tiny\"}";
    const char *bodies[2] = {prev, noinput};
    const char *params[2] = {"previous_response_id", "input"};
    for (int i = 0; i < 2; i++) {
        px_resp a, d;
        REQUIRE(post(S.url, "/v1/responses", bodies[i], &d) == 400);
        REQUIRE(post(P.base, "/r/task-n/roll-nref/v1/responses", bodies[i], &a) == 400);
        json_t *o = json_loads(d.body, 0, NULL);
        json_t *e = json_object_get(o, "error");
        CHECK_EQ_STR(json_string_value(json_object_get(e, "param")), params[i]);
        CHECK_EQ_STR(json_string_value(json_object_get(e, "type")), "invalid_request_error");
        if (!i)
            CHECK(strstr(json_string_value(json_object_get(e, "message")),
                         "arclight serve keeps no responses") != NULL);
        CHECK_EQ_STR(a.body, d.body);
        json_decref(o);
        px_resp_free(&a), px_resp_free(&d);
    }
}

static const char *const ANT[] = {"Content-Type: application/json",
                                  "anthropic-version: 2023-06-01", NULL};
static const char *const M_WHOLE = "{\"model\":\"claude-x\",\"max_tokens\":64,\"messages\":"
                                   "[{\"role\":\"user\",\"content\":\"What is 2+2?\"}]}";
static const char *const M_STREAM = "{\"model\":\"claude-x\",\"max_tokens\":64,\"stream\":true,"
                                    "\"messages\":[{\"role\":\"user\",\"content\":\"2+2?\"}]}";
static char *M_GOT[2];

/* The Messages API passed through: the agent's bytes are the upstream's, and the upstream
 * got the agent's request as it was sent. */
TEST(messages_pass_through_without_token_ids)
{
    const char *bodies[2] = {M_WHOLE, M_STREAM};
    for (int i = 0; i < 2; i++) {
        px_resp a, d;
        char url[300];
        snprintf(url, sizeof url, "%s/r/task-n/roll-m%d/v1/messages", PM.base, i);
        REQUIRE(px_http("POST", url, ANT, bodies[i], &a) == 0);
        char *up = fake_upstream_last_body(U);
        CHECKF(up && !strcmp(up, bodies[i]), "the upstream got %s", up ? up : "(nothing)");
        free(up);
        snprintf(url, sizeof url, "http://127.0.0.1:%d/v1/messages", fake_upstream_port(U));
        REQUIRE(px_http("POST", url, ANT, bodies[i], &d) == 0);
        CHECK_EQ_INT(a.status, 200);
        CHECKF(!strcmp(a.body, d.body), "agent got %.500s\n  upstream sends %.500s", a.body,
               d.body);
        if (i) CHECK(strstr(a.body, "event: message_stop") != NULL);
        M_GOT[i] = strdup(a.body);
        px_resp_free(&a), px_resp_free(&d);
    }
}

static void check_span(const al_span *sp, const expect *e)
{
    const al_llm_call *c = &sp->llm_call;
    json_t *ur = e->upstream;
    json_t *in = json_object_get(json_array_get(json_object_get(ur, "input_messages"), 0), "tokens");
    json_t *out =
        json_object_get(json_array_get(json_object_get(ur, "output_messages"), 0), "tokens");
    REQUIRE(json_array_size(in) > 0 && json_array_size(out) > 0);
    CHECK_EQ_INT(c->n_prompt_tokens, (int64_t)json_array_size(in));
    CHECK_EQ_INT(c->n_response_tokens, (int64_t)json_array_size(out));
    int same = c->n_prompt_tokens == (int64_t)json_array_size(in) &&
               c->n_response_tokens == (int64_t)json_array_size(out);
    for (size_t i = 0; same && i < json_array_size(in); i++)
        same = (json_int_t)c->prompt_token_ids[i] == json_integer_value(json_array_get(in, i));
    for (size_t i = 0; same && i < json_array_size(out); i++)
        same = (json_int_t)c->response_token_ids[i] == json_integer_value(json_array_get(out, i));
    CHECKF(same, "%s: the span's token ids are not serve's", e->rollout);
    /* logprobs: serve's output_text logprobs, one per response token; none for a call */
    json_t *lps = json_object_get(
        json_array_get(json_object_get(json_array_get(json_object_get(ur, "output"), 0), "content"),
                       0),
        "logprobs");
    if (e->tool) {
        CHECK_EQ_INT(c->n_response_logprobs, 0);
        CHECK_EQ_STR(c->finish_reason ? c->finish_reason : "", "tool_calls");
    } else {
        CHECK_EQ_INT(json_array_size(lps), json_array_size(out));
        CHECK_EQ_INT(c->n_response_logprobs, (int64_t)json_array_size(lps));
        for (size_t i = 0; i < c->n_response_logprobs && i < json_array_size(lps); i++) {
            double want = json_number_value(json_object_get(json_array_get(lps, i), "logprob"));
            CHECKF(c->response_logprobs[i] == (float)want, "%s: logprob %zu %g, serve %g",
                   e->rollout, i, c->response_logprobs[i], want);
        }
        CHECK_EQ_STR(c->finish_reason ? c->finish_reason : "", "length");
    }
    CHECK_EQ_INT(c->http_status, 200);
    CHECK_EQ_INT(c->stream, e->stream);
    CHECK_EQ_INT(c->policy_version, 3);
    CHECK_EQ_INT(c->usage.prompt_tokens, c->n_prompt_tokens);
    CHECK_EQ_INT(c->usage.completion_tokens, c->n_response_tokens);
    CHECKF(!strcmp(c->request_json, e->body), "%s: request_json %s", e->rollout, c->request_json);
    if (!e->stream) {
        CHECKF(!strcmp(c->response_json, e->agent_got), "%s: response_json %.300s", e->rollout,
               c->response_json);
    } else { /* the Response of the last event, as the agent got it */
        json_t *got = response_of(e->agent_got);
        char *g = json_dumps(got, JSON_COMPACT | JSON_PRESERVE_ORDER);
        CHECKF(g && !strcmp(c->response_json, g), "%s: response_json %.300s", e->rollout,
               c->response_json);
        free(g);
        json_decref(got);
    }
}

TEST(each_call_is_a_span_with_serves_token_ids)
{
    al_test_msgs m;
    /* the calls above, the agent's own additions and the error */
    REQUIRE(NE == 4);
    CHECK(al_test_topic_read(B.bootstrap, "arclight.spans", NULL, (size_t)NE + 2, 30000, &m) == 0);
    for (int i = 0; i < NE; i++) {
        al_span s[2];
        size_t n = px_spans_of(&m, E[i].rollout, s, 2);
        CHECKF(n == 1, "%s: %zu spans", E[i].rollout, n);
        if (n >= 1) check_span(&s[0], &E[i]);
        for (size_t k = 0; k < n; k++)
            al_span_clear(&s[k]);
    }
    al_span f[2];
    size_t nf = px_spans_of(&m, "roll-nerr", f, 2);
    CHECK_EQ_INT(nf, 1);
    if (nf) {
        CHECK_EQ_INT(f[0].llm_call.http_status, 404);
        CHECK(f[0].llm_call.error && strstr(f[0].llm_call.error, "upstream answered 404"));
        al_span_clear(&f[0]);
    }
    al_test_msgs_free(&m);
    CHECK(!px_file_contains(LOG, "carries no"));
    /* the messages calls: spans without token ids, and the log says why */
    REQUIRE(al_test_topic_read(B.bootstrap, "arclight.spans", NULL, (size_t)NE + 6, 30000, &m) ==
            0);
    for (int i = 0; i < 2; i++) {
        char roll[32];
        snprintf(roll, sizeof roll, "roll-m%d", i);
        al_span s[2];
        size_t n = px_spans_of(&m, roll, s, 2);
        CHECKF(n == 1, "%s: %zu spans", roll, n);
        if (!n) continue;
        const al_llm_call *c = &s[0].llm_call;
        CHECK_EQ_INT(c->n_prompt_tokens, 0);
        CHECK_EQ_INT(c->n_response_tokens, 0);
        CHECK_EQ_INT(c->usage.prompt_tokens, 9);
        CHECK_EQ_INT(c->usage.completion_tokens, 4);
        CHECK_EQ_STR(c->finish_reason ? c->finish_reason : "", "stop");
        CHECK_EQ_INT(c->policy_version, 7);
        CHECK_EQ_INT(c->stream, i);
        CHECK_EQ_STR(c->request_json, i ? M_STREAM : M_WHOLE);
        if (!i) {
            CHECK_EQ_STR(c->response_json, M_GOT[0]);
        } else { /* the message the stream built, as a whole answer has it */
            json_t *r = json_loads(c->response_json, 0, NULL);
            const char *t = json_string_value(
                json_object_get(json_array_get(json_object_get(r, "content"), 0), "text"));
            CHECK_EQ_STR(t ? t : "", "The answer is 4.");
            CHECK_EQ_STR(json_string_value(json_object_get(r, "stop_reason")), "end_turn");
            CHECK_EQ_INT(json_integer_value(json_object_get(json_object_get(r, "usage"),
                                                            "output_tokens")),
                         4);
            json_decref(r);
        }
        al_span_clear(&s[0]);
    }
    al_test_msgs_free(&m);
    CHECK(px_file_contains(PM.log, "native /v1/messages answer carries no prompt or response "
                                   "token ids"));
}

TEST(teardown)
{
    CHECK_EQ_INT(px_stop(&P, SIGTERM, 30), 0);
    CHECK_EQ_INT(px_stop(&PM, SIGTERM, 30), 0);
    fake_upstream_stop(U);
    free(M_GOT[0]), free(M_GOT[1]);
    CHECK_EQ_INT(sv_stop(&S), 0);
    al_test_broker_stop(&B);
    for (int i = 0; i < NE; i++) {
        free(E[i].agent_got);
        json_decref(E[i].upstream);
    }
    al_test_rmtree(TMP);
    curl_global_cleanup();
}
