/*
 * t1001_proxy: the capture proxy end to end over real sockets: the vLLM-like test upstream
 * (tests/fake_upstream.c), `arclight proxy` as a child process, the embedded broker, and
 * spans read back from arclight.spans.
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
static const char *UPKEY = "sk-up-SECRET-1234";
static const char *AGENTKEY = "sk-agent-SECRET-9876";
static al_test_msgs MSGS; /* everything on the topic, read once the calls are done */

#define AL_TEST_LEN(a) (sizeof(a) / sizeof((a)[0]))

static const char *CHAT =
    "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"What is 2+2?\"}]}";

static int dead_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sin = {.sin_family = AF_INET};
    inet_pton(AF_INET, "127.0.0.1", &sin.sin_addr);
    bind(fd, (struct sockaddr *)&sin, sizeof sin);
    socklen_t sl = sizeof sin;
    getsockname(fd, (struct sockaddr *)&sin, &sl);
    close(fd);
    return ntohs(sin.sin_port);
}

/* The same request straight to the upstream, as the agent would have sent it. */
static int direct(const char *path, const char *body, px_resp *r)
{
    char url[256];
    snprintf(url, sizeof url, "%s%s", UPURL, path);
    return px_http("POST", url, PX_JSON, body, r);
}

static int has_header(const px_resp *r, const char *name)
{
    return strcasestr(r->headers, name) != NULL;
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
    char spool[600], key_env[64];
    snprintf(spool, sizeof spool, "%s/spool", TMP);
    snprintf(key_env, sizeof key_env, "ARCLIGHT_UPSTREAM_API_KEY=%s", UPKEY);
    const char *args[] = {
        "--listen",         "127.0.0.1:0", "--upstream",  UPURL,          "--bootstrap",
        B.bootstrap,        "--spool-dir", spool,         "--agent-name", "t1001",
        "--max-body-bytes", "65536",       "--log-level", "info",         NULL};
    const char *env[] = {key_env, NULL};
    REQUIRE(px_start(&P, LOG, args, env) == 0);
}

TEST(nonstreaming_bytes_equal_direct)
{
    const char *bodies[] = {
        CHAT,
        "{\"model\":\"m\",\"logprobs\":true,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}",
        "{\"model\":\"m\",\"return_token_ids\":true,\"messages\":[{\"role\":\"user\",\"content\":"
        "\"x\"}]}",
    };
    for (size_t i = 0; i < 3; i++) {
        px_resp a, d;
        REQUIRE(px_post(&P, "/r/task-a/roll-1/v1/chat/completions", bodies[i], &a) == 0);
        REQUIRE(direct("/v1/chat/completions", bodies[i], &d) == 0);
        CHECK_EQ_INT(a.status, 200);
        CHECKF(a.len == d.len && memcmp(a.body, d.body, a.len) == 0,
               "body %zu differs:\nproxy:  %s\ndirect: %s", i, a.body, d.body);
        CHECK(has_header(&a, "x-arclight-overhead-us:"));
        CHECK(has_header(&a, "content-type: application/json"));
        px_resp_free(&a);
        px_resp_free(&d);
    }
    /* completions, with and without logprobs */
    const char *cb[] = {"{\"model\":\"m\",\"prompt\":\"Once\"}",
                        "{\"model\":\"m\",\"prompt\":\"Once\",\"logprobs\":2}"};
    for (size_t i = 0; i < 2; i++) {
        px_resp a, d;
        REQUIRE(px_post(&P, "/r/task-a/roll-1/v1/completions", cb[i], &a) == 0);
        REQUIRE(direct("/v1/completions", cb[i], &d) == 0);
        CHECK_EQ_INT(a.status, 200);
        CHECKF(a.len == d.len && memcmp(a.body, d.body, a.len) == 0,
               "completions %zu differs:\nproxy:  %s\ndirect: %s", i, a.body, d.body);
        px_resp_free(&a);
        px_resp_free(&d);
    }
}

TEST(unusual_request_shapes_bytes_equal_direct)
{
    /* fields the proxy must replace, an empty object, stream options without usage */
    const char *bodies[] = {
        "{\"model\":\"m\",\"logprobs\":false,\"messages\":[{\"role\":\"user\",\"content\":\"a\"}]}",
        "{\"model\":\"m\",\"return_token_ids\":false,\"messages\":[]}",
        " { } ",
        "{\"model\":\"m\",\"stream\":true,\"stream_options\":{},\"messages\":[{\"role\":\"user\","
        "\"content\":\"s\"}]}",
        "{\"model\":\"m\\u0021\",\"messages\":[{\"role\":\"user\",\"content\":\"e\"}]}",
    };
    for (size_t i = 0; i < AL_TEST_LEN(bodies); i++) {
        px_resp a, d;
        REQUIRE(px_post(&P, "/r/task-u/roll-u/v1/chat/completions", bodies[i], &a) == 0);
        REQUIRE(direct("/v1/chat/completions", bodies[i], &d) == 0);
        CHECK_EQ_INT(a.status, 200);
        CHECKF(a.len == d.len && memcmp(a.body, d.body, a.len) == 0,
               "body %zu differs:\nproxy:  %s\ndirect: %s", i, a.body, d.body);
        px_resp_free(&a);
        px_resp_free(&d);
    }
}

TEST(upstream_gets_capture_fields_and_key)
{
    px_resp a;
    REQUIRE(px_post(&P, "/r/task-a/roll-1/v1/chat/completions", CHAT, &a) == 0);
    px_resp_free(&a);
    char *body = fake_upstream_last_body(U), *auth = fake_upstream_last_auth(U);
    REQUIRE(body && auth);
    json_t *o = json_loads(body, 0, NULL);
    CHECK(json_is_true(json_object_get(o, "return_token_ids")));
    CHECK(json_is_true(json_object_get(o, "logprobs")));
    json_decref(o);
    char want[128];
    snprintf(want, sizeof want, "Bearer %s", UPKEY);
    CHECK_EQ_STR(auth, want);
    free(body);
    free(auth);
}

TEST(streaming_bytes_equal_direct_and_chunked)
{
    const char *bodies[] = {
        "{\"model\":\"m\",\"stream\":true,\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}]}",
        "{\"model\":\"m\",\"stream\":true,\"stream_options\":{\"include_usage\":true},\"logprobs\":"
        "true,"
        "\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}]}",
        "{\"model\":\"m\",\"stream\":true,\"tools\":[{\"type\":\"function\",\"function\":{\"name\":"
        "\"get_weather\",\"parameters\":{}}}],\"messages\":[{\"role\":\"user\",\"content\":\"w\"}]"
        "}",
    };
    for (size_t i = 0; i < 3; i++) {
        px_resp a, d;
        REQUIRE(px_post(&P, "/r/task-a/roll-2/v1/chat/completions", bodies[i], &a) == 0);
        REQUIRE(direct("/v1/chat/completions", bodies[i], &d) == 0);
        CHECK_EQ_INT(a.status, 200);
        CHECK(has_header(&a, "content-type: text/event-stream"));
        CHECK(has_header(&a, "transfer-encoding: chunked"));
        CHECKF(a.len == d.len && memcmp(a.body, d.body, a.len) == 0,
               "stream %zu differs:\nproxy:\n%s\ndirect:\n%s", i, a.body, d.body);
        px_resp_free(&a);
        px_resp_free(&d);
    }
    /* completions stream */
    const char *cb = "{\"model\":\"m\",\"prompt\":\"Once\",\"stream\":true}";
    px_resp a, d;
    REQUIRE(px_post(&P, "/r/task-a/roll-2/v1/completions", cb, &a) == 0);
    REQUIRE(direct("/v1/completions", cb, &d) == 0);
    CHECKF(a.len == d.len && memcmp(a.body, d.body, a.len) == 0,
           "completions stream differs:\nproxy:\n%s\ndirect:\n%s", a.body, d.body);
    px_resp_free(&a);
    px_resp_free(&d);
    /* a slow agent: 3 MB of stream read at 4 MB/s; the proxy pauses the upstream instead of
     * buffering it all, and the agent still gets every byte */
    const char *big = "{\"model\":\"big-stream\",\"stream\":true,\"messages\":[{\"role\":\"user\","
                      "\"content\":\"b\"}]}";
    px_recv_limit = 4 << 20;
    REQUIRE(px_post(&P, "/r/task-a/roll-big2/v1/chat/completions", big, &a) == 0);
    px_recv_limit = 0;
    REQUIRE(direct("/v1/chat/completions", big, &d) == 0);
    CHECK_EQ_INT(a.status, 200);
    CHECKF(a.len == d.len && a.len > 3000000 && memcmp(a.body, d.body, a.len) == 0,
           "big stream differs: %zu vs %zu bytes", a.len, d.len);
    px_resp_free(&a);
    px_resp_free(&d);
    /* chunks pass through as they arrive: 100 ms between upstream chunks, the first byte
     * reaches the agent long before the end */
    const char *slow =
        "{\"model\":\"slow-stream\",\"stream\":true,\"messages\":[{\"role\":\"user\","
        "\"content\":\"s\"}]}";
    REQUIRE(px_post(&P, "/r/task-a/roll-2/v1/chat/completions", slow, &a) == 0);
    CHECK_EQ_INT(a.status, 200);
    CHECKF(a.total_s - a.first_byte_s > 0.3, "first byte %.3f s, end %.3f s: buffered?",
           a.first_byte_s, a.total_s);
    px_resp_free(&a);
}

TEST(rewards_ends_sessions_headers_untracked)
{
    px_resp r;
    REQUIRE(px_post(&P, "/r/task-a/roll-1/reward", "{\"value\":1.0,\"name\":\"accuracy\"}", &r) ==
            0);
    CHECK_EQ_INT(r.status, 200);
    px_resp_free(&r);
    REQUIRE(px_post(&P, "/r/task-a/roll-1/reward", "{\"rewards\":{\"format\":0.5,\"tests\":2}}",
                    &r) == 0);
    CHECK_EQ_INT(r.status, 200);
    px_resp_free(&r);
    REQUIRE(px_post(&P, "/r/task-a/roll-1/end", "{\"status\":\"succeeded\",\"group_size\":8}",
                    &r) == 0);
    CHECK_EQ_INT(r.status, 200);
    px_resp_free(&r);

    /* session key */
    REQUIRE(px_post(&P, "/v1/sessions", "{\"task_id\":\"task-s\",\"rollout_id\":\"roll-s\"}", &r) ==
            0);
    CHECK_EQ_INT(r.status, 200);
    json_t *o = json_loads(r.body, 0, NULL);
    const char *key = json_string_value(json_object_get(o, "session_key"));
    REQUIRE(key);
    char auth[200], url[300];
    snprintf(auth, sizeof auth, "Authorization: Bearer %s", key);
    const char *h[] = {"Content-Type: application/json", auth, NULL};
    snprintf(url, sizeof url, "%s/v1/chat/completions", P.base);
    px_resp c;
    REQUIRE(px_http("POST", url, h, CHAT, &c) == 0);
    CHECK_EQ_INT(c.status, 200);
    CHECK(strcasestr(c.headers, "x-arclight-rollout: roll-s") != NULL);
    px_resp_free(&c);
    json_decref(o);
    px_resp_free(&r);

    /* identity in headers */
    const char *hh[] = {"Content-Type: application/json", "X-Arclight-Task: task-h",
                        "X-Arclight-Rollout: roll-h", "X-Arclight-Attempt: 2", NULL};
    REQUIRE(px_http("POST", url, hh, CHAT, &c) == 0);
    CHECK_EQ_INT(c.status, 200);
    px_resp_free(&c);

    /* no identity: captured under a fresh untracked rollout */
    REQUIRE(px_http("POST", url, PX_JSON, CHAT, &c) == 0);
    CHECK_EQ_INT(c.status, 200);
    CHECK(strcasestr(c.headers, "x-arclight-rollout: untracked-") != NULL);
    px_resp_free(&c);
}

TEST(concurrent_calls_get_distinct_sequences)
{
    enum { N = 24 };
    CURLM *m = curl_multi_init();
    CURL *e[N];
    struct curl_slist *h = curl_slist_append(NULL, "Content-Type: application/json");
    char url[300];
    snprintf(url, sizeof url, "%s/r/task-c/roll-c/v1/chat/completions", P.base);
    px_sink sinks[N];
    memset(sinks, 0, sizeof sinks);
    for (int i = 0; i < N; i++) {
        e[i] = curl_easy_init();
        curl_easy_setopt(e[i], CURLOPT_URL, url);
        curl_easy_setopt(e[i], CURLOPT_POSTFIELDS, CHAT);
        curl_easy_setopt(e[i], CURLOPT_HTTPHEADER, h);
        curl_easy_setopt(e[i], CURLOPT_WRITEFUNCTION, px_collect);
        curl_easy_setopt(e[i], CURLOPT_WRITEDATA, &sinks[i]);
        curl_multi_add_handle(m, e[i]);
    }
    int running = 1;
    while (running) {
        curl_multi_perform(m, &running);
        curl_multi_poll(m, NULL, 0, 100, NULL);
    }
    int ok = 0;
    for (int i = 0; i < N; i++) {
        long st = 0;
        curl_easy_getinfo(e[i], CURLINFO_RESPONSE_CODE, &st);
        ok += st == 200;
        curl_multi_remove_handle(m, e[i]);
        curl_easy_cleanup(e[i]);
        free(sinks[i].p);
    }
    curl_slist_free_all(h);
    curl_multi_cleanup(m);
    CHECK_EQ_INT(ok, N);
}

TEST(upstream_errors_pass_through)
{
    const char *b = "{\"model\":\"fail-500\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}";
    px_resp a, d;
    REQUIRE(px_post(&P, "/r/task-e/roll-e/v1/chat/completions", b, &a) == 0);
    REQUIRE(direct("/v1/chat/completions", b, &d) == 0);
    CHECK_EQ_INT(a.status, 500);
    CHECKF(a.len == d.len && memcmp(a.body, d.body, a.len) == 0, "error body differs: %s vs %s",
           a.body, d.body);
    px_resp_free(&a);
    px_resp_free(&d);
}

/* Status and OpenAI-style error body of one bad request. */
static void expect_error(const char *method, const char *path, const char *const *h,
                         const char *body, long status, const char *code)
{
    char url[400];
    snprintf(url, sizeof url, "%s%s", P.base, path);
    px_resp r;
    if (px_http(method, url, h, body, &r) != 0) {
        CHECKF(0, "%s %s: no answer", method, path);
        px_resp_free(&r);
        return;
    }
    CHECKF(r.status == status, "%s %s: status %ld, want %ld (%s)", method, path, r.status, status,
           r.body);
    json_t *o = json_loads(r.body, 0, NULL);
    const char *c = json_string_value(json_object_get(json_object_get(o, "error"), "code"));
    const char *msg = json_string_value(json_object_get(json_object_get(o, "error"), "message"));
    CHECKF(c && !strcmp(c, code) && msg && *msg, "%s %s: error body %s, want code %s", method, path,
           r.body, code);
    json_decref(o);
    px_resp_free(&r);
}

TEST(bad_input_gets_right_4xx)
{
    const char *chat = "/r/task-b/roll-b/v1/chat/completions";
    expect_error("POST", chat, PX_JSON, "{\"model\": \"m\", \"messages\": [", 400, "invalid_json");
    expect_error("POST", chat, PX_JSON, "[1,2]", 400, "invalid_json");
    const char *txt[] = {"Content-Type: text/plain", NULL};
    expect_error("POST", chat, txt, CHAT, 415, "unsupported_media_type");
    expect_error("POST", "/v2/engines", PX_JSON, CHAT, 404, "unknown_route");
    expect_error("POST", "/r/task-b/roll-b/v1/embeddings", PX_JSON, CHAT, 404, "unknown_route");
    expect_error("GET", chat, NULL, NULL, 405, "method_not_allowed");
    expect_error("POST", "/r/task%20b/roll-b/v1/chat/completions", PX_JSON, CHAT, 400,
                 "invalid_identity");
    const char *att[] = {"Content-Type: application/json", "X-Arclight-Rollout: r1",
                         "X-Arclight-Attempt: -1", NULL};
    expect_error("POST", "/v1/chat/completions", att, CHAT, 400, "invalid_identity");
    const char *badrol[] = {"Content-Type: application/json", "X-Arclight-Rollout: a/b", NULL};
    expect_error("POST", "/v1/chat/completions", badrol, CHAT, 400, "invalid_identity");
    expect_error("POST", "/r/task-b/roll-b/reward", PX_JSON, "{\"value\":\"high\"}", 400,
                 "invalid_reward");
    /* finite, but beyond what credit can add up without overflowing */
    expect_error("POST", "/r/task-b/roll-b/reward", PX_JSON, "{\"value\":-2e15}", 400,
                 "invalid_reward");
    expect_error("POST", "/r/task-b/roll-b/reward", PX_JSON, "{\"rewards\":{\"a\":1e300}}", 400,
                 "invalid_reward");
    expect_error("POST", "/r/task-b/roll-b/end", PX_JSON, "{\"status\":\"great\"}", 400,
                 "invalid_end");
    expect_error("POST", "/v1/reward", PX_JSON, "{\"value\":1}", 400, "invalid_identity");
    /* oversized body (limit 64 KiB here) */
    size_t n = 70000;
    char *big = malloc(n + 64);
    int k = snprintf(big, n + 64, "{\"model\":\"m\",\"messages\":[],\"x\":\"");
    memset(big + k, 'a', n);
    strcpy(big + k + n, "\"}");
    expect_error("POST", chat, PX_JSON, big, 413, "request_too_large");
    free(big);
    /* too many header fields (default 100) */
    const char *many[120];
    static char lines[110][32];
    for (int i = 0; i < 110; i++) {
        snprintf(lines[i], sizeof lines[i], "X-Filler-%d: %d", i, i);
        many[i] = lines[i];
    }
    many[110] = "Content-Type: application/json";
    many[111] = NULL;
    expect_error("POST", chat, many, CHAT, 431, "headers_too_large");
}

TEST(large_body_and_expect_continue)
{
    /* libcurl sends "Expect: 100-continue" for a body this size and waits up to 1 s for
     * the interim answer before sending it */
    size_t n = 40000;
    char *big = malloc(n + 128);
    int k =
        snprintf(big, n + 128, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"");
    memset(big + k, 'b', n);
    strcpy(big + k + n, "\"}]}");
    px_resp r;
    REQUIRE(px_post(&P, "/r/task-g/roll-big/v1/chat/completions", big, &r) == 0);
    CHECK_EQ_INT(r.status, 200);
    CHECKF(r.total_s < 0.8, "a 40 kB request took %.3f s", r.total_s);
    px_resp_free(&r);
    free(big);
    char url[300];
    snprintf(url, sizeof url, "%s/healthz", P.base);
    REQUIRE(px_http("HEAD", url, NULL, NULL, &r) == 0);
    CHECK_EQ_INT(r.status, 200);
    px_resp_free(&r);
}

TEST(spans_field_by_field)
{
    /* calls on roll-1: 3 chat + 2 completions + 1 chat (capture check) = sequences 0..5,
     * then rewards 6, 7, 8 and the end 9 */
    /* every span so far: roll-1 10, roll-2 5, roll-s, roll-h, untracked, roll-c 24, roll-e,
     * roll-big, roll-big2, roll-u 5 */
    REQUIRE(al_test_topic_read(B.bootstrap, "arclight.spans", NULL, 50, 30000, &MSGS) == 0);
    al_span s[64];
    size_t n = px_spans_of(&MSGS, "roll-1", s, 64);
    CHECK_EQ_INT(n, 10);
    for (size_t i = 0; i < n; i++)
        CHECK_EQ_INT(s[i].sequence, (int64_t)i);
    if (n == 10) {
        al_span *c = &s[0];
        CHECK_EQ_STR(c->task_id, "task-a");
        CHECK_EQ_INT(c->kind, AL_SPAN_KIND_LLM_CALL);
        CHECK_EQ_INT(c->attempt, 0);
        CHECK_EQ_INT(strlen(c->trace_id), 32);
        CHECK_EQ_INT(strlen(c->span_id), 16);
        const al_llm_call *l = &c->llm_call;
        CHECK_EQ_STR(l->agent, "t1001");
        CHECK_EQ_STR(l->model, "m");
        CHECK_EQ_STR(l->upstream, UPURL);
        CHECK_EQ_INT(l->policy_version, 7);
        CHECK_EQ_STR(l->request_json, CHAT);
        CHECK(strstr(l->response_json, "\"token_ids\":[100,101,102,103]") != NULL);
        CHECK_EQ_INT(l->stream, 0);
        const char *prompt = "What is 2+2?";
        CHECK_EQ_INT(l->n_prompt_tokens, strlen(prompt));
        for (size_t i = 0; i < l->n_prompt_tokens && i < strlen(prompt); i++)
            CHECK_EQ_INT(l->prompt_token_ids[i], (unsigned char)prompt[i]);
        CHECK_EQ_INT(l->n_response_tokens, 4);
        CHECK_EQ_INT(l->n_response_logprobs, 4);
        for (size_t i = 0; i < 4 && l->n_response_tokens == 4 && l->n_response_logprobs == 4; i++) {
            CHECK_EQ_INT(l->response_token_ids[i], 100 + (int)i);
            CHECK_NEAR(l->response_logprobs[i], -0.25 * (double)(i + 1), 1e-6);
        }
        CHECK_EQ_STR(l->finish_reason ? l->finish_reason : "(null)", "stop");
        CHECK_EQ_INT(l->http_status, 200);
        CHECK(l->error == NULL);
        CHECK(l->start_us > 0 && l->first_byte_us >= l->start_us &&
              l->first_token_us >= l->first_byte_us && l->end_us >= l->first_token_us);
        CHECK_EQ_INT(l->usage.prompt_tokens, (int64_t)strlen(prompt));
        CHECK_EQ_INT(l->usage.completion_tokens, 4);
        /* completions call */
        CHECK_EQ_INT(s[3].llm_call.n_response_tokens, 4);
        CHECK_EQ_INT(s[3].llm_call.n_prompt_tokens, 4);
        CHECK_EQ_INT(s[3].llm_call.n_response_logprobs, 4);
        /* rewards follow the last call (sequence 5) */
        CHECK_EQ_INT(s[6].kind, AL_SPAN_KIND_REWARD);
        CHECK_EQ_STR(s[6].reward.name, "accuracy");
        CHECK_NEAR(s[6].reward.value, 1.0, 1e-12);
        CHECK_EQ_INT(s[6].reward.after_sequence, 5);
        CHECK_EQ_INT(s[7].kind, AL_SPAN_KIND_REWARD);
        CHECK_EQ_INT(s[8].kind, AL_SPAN_KIND_REWARD);
        CHECK_EQ_INT(s[9].kind, AL_SPAN_KIND_ROLLOUT_END);
        CHECK_EQ_INT(s[9].rollout_end.status, AL_ROLLOUT_STATUS_SUCCEEDED);
        CHECK_EQ_INT(s[9].rollout_end.group_size, 8);
    }
    for (size_t i = 0; i < n; i++)
        al_span_clear(&s[i]);

    /* streamed calls: merged response, tokens from the chunks */
    n = px_spans_of(&MSGS, "roll-2", s, 64);
    CHECK_EQ_INT(n, 5);
    if (n == 5) {
        const al_llm_call *l = &s[0].llm_call;
        CHECK_EQ_INT(l->stream, 1);
        CHECK_EQ_INT(l->n_prompt_tokens, 2);
        CHECK_EQ_INT(l->n_response_tokens, 4);
        CHECK_EQ_INT(l->n_response_logprobs, 4);
        CHECK_EQ_INT(l->usage.completion_tokens, 4);
        CHECK(strstr(l->response_json, "\"content\":\"The answer is 4.\"") != NULL);
        CHECK(l->first_token_us >= l->first_byte_us && l->first_token_us > 0);
        /* tool calls merged from two argument pieces */
        const al_llm_call *t = &s[2].llm_call;
        CHECK(strstr(t->response_json, "\"arguments\":\"{\\\"city\\\":\\\"Paris\\\"}\"") != NULL);
        CHECK_EQ_STR(t->finish_reason ? t->finish_reason : "(null)", "tool_calls");
        CHECK_EQ_INT(s[3].llm_call.n_response_tokens, 4); /* completions stream */
    }
    for (size_t i = 0; i < n; i++)
        al_span_clear(&s[i]);

    n = px_spans_of(&MSGS, "roll-s", s, 8);
    CHECK_EQ_INT(n, 1);
    if (n) CHECK_EQ_STR(s[0].task_id, "task-s");
    for (size_t i = 0; i < n; i++)
        al_span_clear(&s[i]);
    n = px_spans_of(&MSGS, "roll-h", s, 8);
    CHECK_EQ_INT(n, 1);
    if (n) {
        CHECK_EQ_STR(s[0].task_id, "task-h");
        CHECK_EQ_INT(s[0].attempt, 2);
    }
    for (size_t i = 0; i < n; i++)
        al_span_clear(&s[i]);

    /* concurrent calls: sequences 0..N-1, each once */
    n = px_spans_of(&MSGS, "roll-c", s, 64);
    CHECK_EQ_INT(n, 24);
    for (size_t i = 0; i < n; i++) {
        CHECK_EQ_INT(s[i].sequence, (int64_t)i);
        al_span_clear(&s[i]);
    }
    /* the upstream error is a failed call */
    n = px_spans_of(&MSGS, "roll-e", s, 8);
    CHECK_EQ_INT(n, 1);
    if (n) {
        CHECK_EQ_INT(s[0].llm_call.http_status, 500);
        CHECK(s[0].llm_call.error && strstr(s[0].llm_call.error, "engine crashed"));
        al_span_clear(&s[0]);
    }
    /* an untracked call was captured */
    int untracked = 0;
    for (size_t i = 0; i < MSGS.n; i++)
        if (memmem(MSGS.val[i], MSGS.len[i], "untracked-", 10)) untracked++;
    CHECK(untracked >= 1);
    /* spans of a task share its key */
    for (size_t i = 0; i < MSGS.n; i++)
        if (memmem(MSGS.val[i], MSGS.len[i], "roll-1", 6)) CHECK_EQ_STR(MSGS.key[i], "task-a");
}

TEST(agent_keys_failover_and_upstream_down)
{
    char spool[700], log2[700], up2[160], key_env[80];
    snprintf(spool, sizeof spool, "%s/spool2", TMP);
    snprintf(log2, sizeof log2, "%s/proxy2.log", TMP);
    snprintf(up2, sizeof up2, "http://127.0.0.1:%d", dead_port());
    snprintf(key_env, sizeof key_env, "ARCLIGHT_UPSTREAM_API_KEY=%s", UPKEY);
    /* two upstreams, the first one dead: every rollout still gets an answer */
    const char *args[] = {"--listen",    "127.0.0.1:0", "--upstream",  up2,           "--upstream",
                          UPURL,         "--bootstrap", B.bootstrap,   "--spool-dir", spool,
                          "--agent-key", AGENTKEY,      "--log-level", "info",        NULL};
    const char *env[] = {key_env, NULL};
    px_child q;
    REQUIRE(px_start(&q, log2, args, env) == 0);
    char url[300], auth[200];
    snprintf(auth, sizeof auth, "Authorization: Bearer %s", AGENTKEY);
    const char *h[] = {"Content-Type: application/json", auth, NULL};
    int ok = 0;
    for (int i = 0; i < 6; i++) {
        snprintf(url, sizeof url, "%s/r/task-f/roll-f%d/v1/chat/completions", q.base, i);
        px_resp r;
        REQUIRE(px_http("POST", url, h, CHAT, &r) == 0);
        ok += r.status == 200;
        px_resp_free(&r);
    }
    CHECK_EQ_INT(ok, 6);
    char *a = fake_upstream_last_auth(U);
    CHECK(a && strstr(a, UPKEY) && !strstr(a, AGENTKEY));
    free(a);
    px_resp r;
    REQUIRE(px_http("POST", url, PX_JSON, CHAT, &r) == 0);
    CHECK_EQ_INT(r.status, 401);
    px_resp_free(&r);
    CHECK_EQ_INT(px_stop(&q, SIGTERM, 30), 0);

    /* the only upstream is down: 502 to the agent, a failed span */
    snprintf(spool, sizeof spool, "%s/spool3", TMP);
    const char *args3[] = {"--listen",  "127.0.0.1:0", "--upstream", up2, "--bootstrap",
                           B.bootstrap, "--spool-dir", spool,        NULL};
    REQUIRE(px_start(&q, log2, args3, NULL) == 0);
    snprintf(url, sizeof url, "%s/r/task-d/roll-down/v1/chat/completions", q.base);
    REQUIRE(px_http("POST", url, PX_JSON, CHAT, &r) == 0);
    CHECK_EQ_INT(r.status, 502);
    CHECK(strstr(r.body, "upstream_unavailable") != NULL);
    px_resp_free(&r);
    CHECK_EQ_INT(px_stop(&q, SIGTERM, 30), 0);
    al_test_msgs m;
    REQUIRE(al_test_topic_read(B.bootstrap, "arclight.spans", "roll-down", 1, 30000, &m) == 0);
    al_span s[4];
    size_t n = px_spans_of(&m, "roll-down", s, 4);
    CHECK_EQ_INT(n, 1);
    if (n) {
        CHECK_EQ_INT(s[0].llm_call.http_status, 0);
        CHECK(s[0].llm_call.error && strstr(s[0].llm_call.error, "127.0.0.1"));
        al_span_clear(&s[0]);
    }
    /* no key in the spans or the logs */
    for (size_t i = 0; i < m.n; i++) {
        CHECK(!memmem(m.val[i], m.len[i], UPKEY, strlen(UPKEY)));
        CHECK(!memmem(m.val[i], m.len[i], AGENTKEY, strlen(AGENTKEY)));
    }
    al_test_msgs_free(&m);
    CHECK(!px_file_contains(log2, UPKEY));
    CHECK(!px_file_contains(log2, AGENTKEY));
    CHECK(px_file_contains(log2, "proxy.access"));
}

/* An upstream's numbers beyond the ranges they are kept in (a count beyond int64, a logprob
 * beyond float): the answer passes unchanged, the count is recorded as 0 and the logprob as
 * -inf (which the batch stage refuses), with no undefined conversion. */
TEST(upstream_numbers_beyond_their_ranges)
{
    const char *body = "{\"model\":\"huge-numbers\",\"logprobs\":true,\"messages\":[{\"role\":"
                       "\"user\",\"content\":\"Hi\"}]}";
    px_resp a, d;
    REQUIRE(px_post(&P, "/r/task-h/roll-huge/v1/chat/completions", body, &a) == 0);
    REQUIRE(direct("/v1/chat/completions", body, &d) == 0);
    CHECK_EQ_INT(a.status, 200);
    CHECKF(a.len == d.len && memcmp(a.body, d.body, a.len) == 0, "answer differs:\n%s\n%s",
           a.body, d.body);
    px_resp_free(&a);
    px_resp_free(&d);
    al_test_msgs m;
    REQUIRE(al_test_topic_read(B.bootstrap, "arclight.spans", "roll-huge", 1, 30000, &m) == 0);
    al_span s[4];
    size_t n = px_spans_of(&m, "roll-huge", s, 4);
    CHECK_EQ_INT(n, 1);
    if (n == 1) {
        const al_llm_call *l = &s[0].llm_call;
        CHECK_EQ_INT(l->usage.prompt_tokens, 0);
        CHECK_EQ_INT(l->n_response_logprobs, 4);
        if (l->n_response_logprobs == 4) {
            CHECK(isinf(l->response_logprobs[0]) && l->response_logprobs[0] < 0);
            CHECK_NEAR(l->response_logprobs[1], -0.5, 1e-6);
        }
    }
    for (size_t i = 0; i < n; i++)
        al_span_clear(&s[i]);
    al_test_msgs_free(&m);
}

TEST(streamed_nul_character_is_still_captured)
{
    /* A random policy can sample token 0, a NUL character that JSON carries as \u0000: the
     * chunk is still valid JSON and its tokens belong to the span. */
    const char *body = "{\"model\":\"nul-content\",\"stream\":true,\"messages\":[{\"role\":"
                       "\"user\",\"content\":\"Hi\"}]}";
    px_resp a, d;
    REQUIRE(px_post(&P, "/r/task-n/roll-nul/v1/chat/completions", body, &a) == 0);
    REQUIRE(direct("/v1/chat/completions", body, &d) == 0);
    CHECK_EQ_INT(a.status, 200);
    CHECK(strstr(d.body, "\\u0000") != NULL);
    CHECKF(a.len == d.len && memcmp(a.body, d.body, a.len) == 0, "stream differs:\n%s\n%s", a.body,
           d.body);
    px_resp_free(&a);
    px_resp_free(&d);
    al_test_msgs m;
    REQUIRE(al_test_topic_read(B.bootstrap, "arclight.spans", "roll-nul", 1, 30000, &m) == 0);
    al_span s[4];
    size_t n = px_spans_of(&m, "roll-nul", s, 4);
    CHECK_EQ_INT(n, 1);
    if (n == 1) {
        CHECK_EQ_INT(s[0].llm_call.n_response_tokens, 4);
        CHECK_EQ_INT(s[0].llm_call.n_prompt_tokens, 2);
        CHECK(s[0].llm_call.error == NULL);
    }
    for (size_t i = 0; i < n; i++)
        al_span_clear(&s[i]);
    al_test_msgs_free(&m);
}

TEST(openai_kind_asks_for_nothing_extra)
{
    char spool[700], log3[700];
    snprintf(spool, sizeof spool, "%s/spool4", TMP);
    snprintf(log3, sizeof log3, "%s/proxy4.log", TMP);
    const char *args[] = {"--listen",        "127.0.0.1:0", "--upstream",  UPURL,
                          "--upstream-kind", "openai",      "--bootstrap", B.bootstrap,
                          "--spool-dir",     spool,         NULL};
    px_child q;
    REQUIRE(px_start(&q, log3, args, NULL) == 0);
    char url[300];
    snprintf(url, sizeof url, "%s/r/task-o/roll-o/v1/chat/completions", q.base);
    px_resp a, d;
    REQUIRE(px_http("POST", url, PX_JSON, CHAT, &a) == 0);
    REQUIRE(direct("/v1/chat/completions", CHAT, &d) == 0);
    CHECK_EQ_INT(a.status, 200);
    CHECK(a.len == d.len && memcmp(a.body, d.body, a.len) == 0);
    px_resp_free(&a);
    px_resp_free(&d);
    char *body = fake_upstream_last_body(U);
    CHECK(body && !strstr(body, "return_token_ids") && !strstr(body, "logprobs"));
    free(body);
    CHECK_EQ_INT(px_stop(&q, SIGTERM, 30), 0);
}

/* The same answers through curl (--upstream-client curl), the path of https upstreams and
 * host names: whole and streamed bytes equal direct, and a bad --upstream-client is usage. */
TEST(curl_client_bytes_equal_direct)
{
    char spool[700], log2[700];
    snprintf(spool, sizeof spool, "%s/spool-curl", TMP);
    snprintf(log2, sizeof log2, "%s/proxy-curl.log", TMP);
    const char *args[] = {"--listen",          "127.0.0.1:0", "--upstream",  UPURL,
                          "--bootstrap",       B.bootstrap,   "--spool-dir", spool,
                          "--upstream-client", "curl",        NULL};
    px_child q;
    REQUIRE(px_start(&q, log2, args, NULL) == 0);
    const char *bodies[] = {
        CHAT,
        "{\"model\":\"m\",\"stream\":true,\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}]}",
        "{\"model\":\"fail-500\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}",
    };
    char url[300];
    snprintf(url, sizeof url, "%s/r/task-c/roll-curl/v1/chat/completions", q.base);
    for (size_t i = 0; i < AL_TEST_LEN(bodies); i++) {
        px_resp a, d;
        REQUIRE(px_http("POST", url, PX_JSON, bodies[i], &a) == 0);
        REQUIRE(direct("/v1/chat/completions", bodies[i], &d) == 0);
        CHECK_EQ_INT(a.status, d.status);
        CHECKF(a.len == d.len && memcmp(a.body, d.body, a.len) == 0,
               "curl path, body %zu differs:\nproxy:  %s\ndirect: %s", i, a.body, d.body);
        px_resp_free(&a);
        px_resp_free(&d);
    }
    CHECK_EQ_INT(px_stop(&q, SIGTERM, 30), 0);
    al_test_msgs m;
    REQUIRE(al_test_topic_read(B.bootstrap, "arclight.spans", "roll-curl", 3, 30000, &m) == 0);
    al_span s[4];
    size_t n = px_spans_of(&m, "roll-curl", s, 4);
    CHECK_EQ_INT(n, 3);
    for (size_t i = 0; i < n; i++) {
        if (i < 2) CHECK(s[i].llm_call.n_response_tokens > 0);
        al_span_clear(&s[i]);
    }
    al_test_msgs_free(&m);
    const char *bad[] = {"--upstream", UPURL, "--upstream-client", "nghttp", NULL};
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "'%s' proxy %s %s %s %s 2>/dev/null", al_test_bin(), bad[0], bad[1],
             bad[2], bad[3]);
    int st = system(cmd);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 2);
}

TEST(metrics_and_clean_shutdown)
{
    char url[300];
    snprintf(url, sizeof url, "%s/metrics", P.base);
    px_resp r;
    REQUIRE(px_http("GET", url, NULL, NULL, &r) == 0);
    CHECK_EQ_INT(r.status, 200);
    CHECK(
        strstr(r.body, "arclight_proxy_requests_total{route=\"chat_completions\",status=\"200\"}"));
    CHECK(strstr(r.body, "arclight_proxy_overhead_seconds_bucket"));
    CHECK(strstr(r.body, "arclight_proxy_spool_bytes"));
    px_resp_free(&r);
    CHECK_EQ_INT(px_stop(&P, SIGTERM, 30), 0);
    CHECK(!px_file_contains(LOG, UPKEY));
    CHECK(px_file_contains(LOG, "every span published"));
    al_test_msgs_free(&MSGS);
    fake_upstream_stop(U);
    al_test_broker_stop(&B);
    al_test_rmtree(TMP);
    curl_global_cleanup();
}
