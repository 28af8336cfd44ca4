/*
 * t1006_proxy_eval: held-out evaluation through the proxy (issue 17). A call under
 * /e/{task}/{rollout}/ is sampled greedily (the upstream gets temperature 0 whatever the
 * agent asked), under /e:T/ at temperature T, and every span of that rollout carries
 * eval: true, its reward and end too, also when they are posted under /r/. The header form
 * (X-Arclight-Eval, X-Arclight-Eval-Temperature) does the same on the bare /v1 routes. Bad
 * temperatures are 400s; /r/ spans stay eval: false; an eval rollout stays one after a
 * restart (the state file keeps the mark).
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

/* The temperature of the last request the upstream got (NAN when none, -1 when absent). */
static double upstream_temperature(void)
{
    char *b = fake_upstream_last_body(U);
    json_t *o = b ? json_loads(b, 0, NULL) : NULL;
    free(b);
    if (!o) return NAN;
    json_t *t = json_object_get(o, "temperature");
    double v = t ? json_number_value(t) : -1;
    json_decref(o);
    return v;
}

static long post(const char *path, const char *const *headers, const char *body, char **out)
{
    char url[512];
    snprintf(url, sizeof url, "%s%s", P.base, path);
    px_resp r;
    if (px_http("POST", url, headers ? headers : PX_JSON, body, &r) != 0) return -1;
    long st = r.status;
    if (out) *out = strdup(r.body);
    px_resp_free(&r);
    return st;
}

static const char *CHAT_HOT = "{\"model\":\"m\",\"temperature\":1.3,\"messages\":[{\"role\":"
                              "\"user\",\"content\":\"What is 2+2?\"}]}";
static const char *CHAT_PLAIN =
    "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"What is 2+2?\"}]}";

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
    REQUIRE(px_start_proxy(&P, TMP, UPURL, B.bootstrap, "proxy", NULL, NULL) == 0);
}

TEST(eval_prefix_is_greedy_and_marks_every_span)
{
    char *body = NULL;
    CHECK_EQ_INT(post("/e/task-e/roll-e/v1/chat/completions", NULL, CHAT_HOT, &body), 200);
    CHECK(body && strstr(body, "The answer is 4."));
    free(body);
    CHECK(upstream_temperature() == 0.0);
    /* a stream too, and completions */
    const char *stream = "{\"model\":\"m\",\"stream\":true,\"temperature\":0.9,\"messages\":[{"
                         "\"role\":\"user\",\"content\":\"s\"}]}";
    CHECK_EQ_INT(post("/e/task-e/roll-e/v1/chat/completions", NULL, stream, &body), 200);
    CHECK(body && strstr(body, "data: [DONE]"));
    free(body);
    CHECK(upstream_temperature() == 0.0);
    CHECK_EQ_INT(
        post("/e/task-e/roll-e/v1/completions", NULL, "{\"model\":\"m\",\"prompt\":\"x\"}", NULL),
        200);
    CHECK(upstream_temperature() == 0.0);
    /* the reward under /e/, the end under /r/: both of an eval rollout */
    CHECK_EQ_INT(post("/e/task-e/roll-e/reward", NULL, "{\"value\":0.5}", NULL), 200);
    CHECK_EQ_INT(post("/r/task-e/roll-e/end", NULL, "{\"status\":\"succeeded\"}", NULL), 200);
}

TEST(eval_prefix_with_temperature)
{
    CHECK_EQ_INT(post("/e:0.7/task-t/roll-t/v1/chat/completions", NULL, CHAT_PLAIN, NULL), 200);
    CHECK(fabs(upstream_temperature() - 0.7) < 1e-12);
    CHECK_EQ_INT(post("/e:2/task-t/roll-t/v1/chat/completions", NULL, CHAT_HOT, NULL), 200);
    CHECK(upstream_temperature() == 2.0);
    const char *bad[] = {
        "/e:3/task-t/roll-t/v1/chat/completions", "/e:-1/task-t/roll-t/v1/chat/completions",
        "/e:/task-t/roll-t/v1/chat/completions", "/e:nan/task-t/roll-t/v1/chat/completions",
        "/e:0.5x/task-t/roll-t/v1/chat/completions"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char *b = NULL;
        CHECK_EQ_INT(post(bad[i], NULL, CHAT_PLAIN, &b), 400);
        CHECKF(b && strstr(b, "invalid_eval_temperature"), "%s: %s", bad[i], b ? b : "");
        free(b);
    }
}

TEST(eval_headers_on_the_bare_route)
{
    const char *h[] = {"Content-Type: application/json", "X-Arclight-Task: task-h",
                       "X-Arclight-Rollout: roll-h", "X-Arclight-Eval: 1", NULL};
    CHECK_EQ_INT(post("/v1/chat/completions", h, CHAT_HOT, NULL), 200);
    CHECK(upstream_temperature() == 0.0);
    const char *ht[] = {"Content-Type: application/json",    "X-Arclight-Task: task-h",
                        "X-Arclight-Rollout: roll-h",        "X-Arclight-Eval: true",
                        "X-Arclight-Eval-Temperature: 0.25", NULL};
    CHECK_EQ_INT(post("/v1/chat/completions", ht, CHAT_HOT, NULL), 200);
    CHECK(upstream_temperature() == 0.25);
    const char *bad[] = {"Content-Type: application/json", "X-Arclight-Rollout: roll-h",
                         "X-Arclight-Eval: yes", NULL};
    char *b = NULL;
    CHECK_EQ_INT(post("/v1/chat/completions", bad, CHAT_PLAIN, &b), 400);
    CHECK(b && strstr(b, "invalid_eval"));
    free(b);
    const char *badt[] = {"Content-Type: application/json", "X-Arclight-Rollout: roll-h",
                          "X-Arclight-Eval: 1", "X-Arclight-Eval-Temperature: 9", NULL};
    CHECK_EQ_INT(post("/v1/chat/completions", badt, CHAT_PLAIN, &b), 400);
    CHECK(b && strstr(b, "invalid_eval_temperature"));
    free(b);
    /* X-Arclight-Eval: 0 is a training call */
    const char *h0[] = {"Content-Type: application/json", "X-Arclight-Task: task-z",
                        "X-Arclight-Rollout: roll-z", "X-Arclight-Eval: 0", NULL};
    CHECK_EQ_INT(post("/v1/chat/completions", h0, CHAT_HOT, NULL), 200);
    CHECK(upstream_temperature() == 1.3);
}

TEST(training_rollouts_are_untouched)
{
    CHECK_EQ_INT(post("/r/task-r/roll-r/v1/chat/completions", NULL, CHAT_HOT, NULL), 200);
    CHECK(upstream_temperature() == 1.3);
    CHECK_EQ_INT(post("/r/task-r/roll-r/v1/chat/completions", NULL, CHAT_PLAIN, NULL), 200);
    CHECK(upstream_temperature() == -1);
    CHECK_EQ_INT(post("/r/task-r/roll-r/reward", NULL, "{\"value\":1}", NULL), 200);
}

static void expect_spans(al_test_msgs *m, const char *rollout, size_t n, int eval)
{
    al_span s[8];
    size_t got = px_spans_of(m, rollout, s, 8);
    CHECKF(got == n, "%s: %zu spans, expected %zu", rollout, got, n);
    for (size_t i = 0; i < got; i++) {
        CHECKF(s[i].eval == eval, "%s span %zu (kind %d): eval %d", rollout, i, (int)s[i].kind,
               s[i].eval);
        CHECK_EQ_INT(s[i].sequence, (int64_t)i);
        al_span_clear(&s[i]);
    }
}

TEST(spans_carry_eval)
{
    al_test_msgs m;
    /* 13 spans in all, on several partitions: wait for all of them */
    CHECK(al_test_topic_read(B.bootstrap, "arclight.spans", NULL, 13, 30000, &m) == 0);
    expect_spans(&m, "roll-e", 5, 1);
    expect_spans(&m, "roll-t", 2, 1);
    expect_spans(&m, "roll-h", 2, 1);
    expect_spans(&m, "roll-z", 1, 0);
    expect_spans(&m, "roll-r", 3, 0);
    al_test_msgs_free(&m);
    CHECK(px_file_contains(LOG, "rollout=roll-e attempt=0 seq=0"));
    CHECK(px_file_contains(LOG, "eval=1"));
}

TEST(eval_mark_survives_a_restart)
{
    CHECK_EQ_INT(px_stop(&P, SIGTERM, 30), 0);
    REQUIRE(px_start_proxy(&P, TMP, UPURL, B.bootstrap, "proxy", NULL, NULL) == 0);
    /* the rollout goes on under /r/: its new spans are still eval spans, numbered on */
    CHECK_EQ_INT(post("/r/task-e/roll-e/reward", NULL, "{\"value\":1}", NULL), 200);
    al_test_msgs m;
    CHECK(al_test_topic_read(B.bootstrap, "arclight.spans", NULL, 14, 30000, &m) == 0);
    expect_spans(&m, "roll-e", 6, 1);
    al_test_msgs_free(&m);
}

TEST(teardown)
{
    CHECK_EQ_INT(px_stop(&P, SIGTERM, 30), 0);
    fake_upstream_stop(U);
    al_test_broker_stop(&B);
    al_test_rmtree(TMP);
    curl_global_cleanup();
}
