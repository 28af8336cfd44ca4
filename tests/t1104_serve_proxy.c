/*
 * 1104: the loop's serving half end to end: an agent's calls go through `arclight proxy`
 * (--upstream-kind vllm, unchanged) to `arclight serve`, and the spans the proxy publishes
 * carry the served token ids, the served logprobs and the policy version. The logprobs in
 * the span equal the trainer's for the span's tokens with the served weights: importance
 * sampling in the trainer sees exactly what the sampler used. The agent, which asked for
 * neither, gets no token ids and no logprobs back.
 */
#define _GNU_SOURCE
#include "testlib.h"
#include "broker_fixture.h"
#include "t1099_proxy_helpers.h"
#include "t1199_serve_helpers.h"

TEST(spans_through_the_proxy_carry_served_tokens_logprobs_and_version)
{
    curl_global_init(CURL_GLOBAL_ALL);
    al_test_broker b;
    REQUIRE(al_test_broker_start(&b, NULL) == 0);
    char *dir = sv_tmpdir("t1104");
    REQUIRE(dir && sv_make_model(dir, "tiny", 5) == 0);
    char model[300], ptmp[512], spool[600], log[600];
    snprintf(model, sizeof model, "%s/tiny", dir);
    al_test_tmpdir(ptmp, sizeof ptmp, "proxy");
    REQUIRE(ptmp[0]);
    snprintf(spool, sizeof spool, "%s/spool", ptmp);
    snprintf(log, sizeof log, "%s/proxy.log", ptmp);
    sv_server s;
    const char *sargs[] = {"--model", model, "--policy-version", "7", NULL};
    REQUIRE(sv_start(&s, sargs) == 0);
    const char *pargs[] = {"--listen",        "127.0.0.1:0", "--upstream",  s.url,
                           "--upstream-kind", "vllm",        "--bootstrap", b.bootstrap,
                           "--spool-dir",     spool,         NULL};
    px_child p;
    REQUIRE(px_start(&p, log, pargs, NULL) == 0);

    /* a plain call and a streamed one, as an agent makes them */
    sv_resp r;
    sv_http(p.base, "/r/task-s/roll-s/v1/chat/completions",
            "{\"model\":\"tiny\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_"
            "tokens\":10,"
            "\"seed\":3}",
            &r);
    CHECK_EQ_INT((int)r.code, 200);
    json_t *j = r.body.p ? json_loads(r.body.p, JSON_ALLOW_NUL, NULL) : NULL;
    REQUIRE(j);
    json_t *c0 = json_array_get(json_object_get(j, "choices"), 0);
    CHECK(json_is_null(json_object_get(c0, "logprobs")));
    CHECK(!json_object_get(j, "prompt_token_ids") ||
          json_is_null(json_object_get(j, "prompt_token_ids")));
    CHECK_EQ_INT(json_integer_value(json_object_get(j, "policy_version")), 7);
    json_decref(j);
    sv_resp_free(&r);
    sv_http(p.base, "/r/task-s/roll-s/v1/chat/completions",
            "{\"model\":\"tiny\",\"messages\":[{\"role\":\"user\",\"content\":\"count\"}],\"max_"
            "tokens\":8,"
            "\"stream\":true,\"seed\":4}",
            &r);
    CHECK_EQ_INT((int)r.code, 200);
    CHECK(r.body.p && strstr(r.body.p, "data: [DONE]"));
    sv_resp_free(&r);

    /* issue 15, item 17: a value serve refuses reaches serve as the agent wrote it, and the
     * agent gets serve's answer (it used to be replaced by the proxy's own true: a 200) */
    const char *bad[] = {
        "{\"model\":\"tiny\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],"
        "\"max_tokens\":2,\"logprobs\":\"yes\"}",
        "{\"model\":\"tiny\",\"prompt\":\"hi\",\"max_tokens\":2,\"logprobs\":\"yes\"}",
        "{\"model\":\"tiny\",\"prompt\":\"hi\",\"max_tokens\":2,\"logprobs\":-1}",
        "{\"model\":\"tiny\",\"prompt\":\"hi\",\"max_tokens\":2,\"return_token_ids\":\"yes\"}",
    };
    const char *bad_path[] = {"/v1/chat/completions", "/v1/completions", "/v1/completions",
                              "/v1/completions"};
    for (int i = 0; i < 4; i++) {
        char via[200];
        snprintf(via, sizeof via, "/r/task-b/roll-b%s", bad_path[i]);
        sv_resp direct, proxied;
        sv_http(s.url, bad_path[i], bad[i], &direct);
        sv_http(p.base, via, bad[i], &proxied);
        CHECKF(direct.code == 400 && proxied.code == direct.code,
               "%s: serve says %ld, through the proxy %ld", bad[i], direct.code, proxied.code);
        json_t *dj = direct.body.p ? json_loads(direct.body.p, 0, NULL) : NULL;
        json_t *pj = proxied.body.p ? json_loads(proxied.body.p, 0, NULL) : NULL;
        const char *dm = json_string_value(json_object_get(json_object_get(dj, "error"), "message"));
        const char *pm = json_string_value(json_object_get(json_object_get(pj, "error"), "message"));
        CHECKF(dm && pm && !strcmp(dm, pm), "%s: serve says '%s', through the proxy '%s'", bad[i],
               dm ? dm : "", pm ? pm : "");
        json_decref(dj);
        json_decref(pj);
        sv_resp_free(&direct);
        sv_resp_free(&proxied);
    }

    al_test_msgs m;
    CHECK(al_test_topic_read(b.bootstrap, "arclight.spans", "roll-s", 2, 30000, &m) == 0);
    al_span sp[4];
    size_t n = px_spans_of(&m, "roll-s", sp, 4);
    CHECK_EQ_INT((int)n, 2);
    for (size_t i = 0; i < n; i++) {
        const al_llm_call *c = &sp[i].llm_call;
        CHECK_EQ_INT(c->policy_version, 7);
        CHECK_EQ_INT(c->stream, (int)i);
        CHECK(c->n_prompt_tokens > 5);
        CHECK(c->n_response_tokens >= 1 && c->n_response_tokens <= 10);
        REQUIRE(c->n_response_logprobs == c->n_response_tokens);
        float lp[16];
        REQUIRE(sv_trainer_logprobs(model, c->prompt_token_ids, (int)c->n_prompt_tokens,
                                    c->response_token_ids, (int)c->n_response_tokens, lp) == 0);
        double worst = 0;
        for (size_t t = 0; t < c->n_response_tokens; t++)
            worst = fmax(worst, fabs((double)lp[t] - c->response_logprobs[t]));
        printf("  span %zu (%s): %zu tokens, max |span - trainer| logprob %.2e\n", i,
               c->stream ? "stream" : "plain", c->n_response_tokens, worst);
        CHECKF(worst < 1e-4, "span %zu: logprobs differ from the trainer's by %g", i, worst);
    }
    for (size_t i = 0; i < n; i++)
        al_span_clear(&sp[i]);
    al_test_msgs_free(&m);
    CHECK_EQ_INT(px_stop(&p, SIGTERM, 20), 0);
    CHECK_EQ_INT(sv_stop(&s), 0);
    al_test_broker_stop(&b);
    al_test_rmtree(dir);
    al_test_rmtree(ptmp);
    free(dir);
    curl_global_cleanup();
}
