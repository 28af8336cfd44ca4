/*
 * 1013: the proxy in front of a fleet (issue 23): two plain `arclight serve` replicas (they name
 * no policy version themselves) behind one `arclight proxy`, on the embedded broker.
 *   - versions: the proxy follows arclight.sync (records as `arclight sync` writes them) and
 *     each span carries the version its replica served; calls while a swap is under way on
 *     their replica (its beginning recorded, its end not yet) are tagged -1, the other
 *     replica's calls keep their version, and calls after the swap's end get the new one;
 *   - --max-staleness 1: with the trainer at version 6 and a replica at 4, a new rollout's call
 *     gets 429 with Retry-After and a JSON error, a rollout already under way goes on; once
 *     the replicas are within 1 version, new rollouts are let in again;
 *   - health: with --health-interval-ms, a replica killed mid-run costs no call (its rollouts
 *     go to the other one), is reported unhealthy, and gets its rollouts back once it answers
 *     again;
 *   - with a real `arclight sync` driving two `arclight serve --weight-routes` replicas (SGLang's
 *     and vLLM's routes): before sync recorded anything the spans carry what the replicas say
 *     (0, their first weights); after a PolicyVersion, sync's records (beginnings included)
 *     reach the proxy and every span carries 1, as the replicas now say too.
 */
#define _GNU_SOURCE
#include "testlib.h"
#include "broker_fixture.h"
#include "t1099_proxy_helpers.h"
#include "t1199_serve_helpers.h"

#include "avro/codec.h"
#include "core/sha256.h"
#include "core/util.h"

#define NROLL 12

static al_test_broker g_b;
static rd_kafka_t *g_prod;
static sv_server g_s[2];
static px_child g_p;
static int g_mport;

static void produce(const char *topic, const char *key, const void *v, size_t n)
{
    rd_kafka_resp_err_t e = rd_kafka_producev(
        g_prod, RD_KAFKA_V_TOPIC(topic), RD_KAFKA_V_PARTITION(0), RD_KAFKA_V_KEY(key, strlen(key)),
        RD_KAFKA_V_VALUE((void *)v, n), RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_END);
    CHECKF(e == 0, "produce: %s", rd_kafka_err2str(e));
    rd_kafka_flush(g_prod, 10000);
}

/* A record as `arclight sync` writes it: fin 0 is an attempt's beginning. */
static void sync_rec(int replica, int64_t version, int64_t start_us, int64_t fin_us)
{
    char rec[1024];
    const char *url = g_s[replica].url;
    char fin[32];
    if (fin_us)
        snprintf(fin, sizeof fin, "%lld", (long long)fin_us);
    snprintf(rec, sizeof rec,
             "{\"model\":\"tiny\",\"replica\":\"%s\",\"kind\":\"vllm\",\"version\":%lld,"
             "\"checkpoint_uri\":\"file:///x/step-%lld/\",\"path\":\"/x/step-%lld\",\"ok\":%s,"
             "\"error\":null,\"attempt\":1,\"started_us\":%lld,\"finished_us\":%s}",
             url, (long long)version, (long long)version, (long long)version,
             fin_us ? "true" : "null", (long long)start_us, fin_us ? fin : "null");
    produce("arclight.sync", url, rec, strlen(rec));
}

/* Waits up to 20 s for the proxy's metric series to equal want. */
static int wait_metric(const char *series, double want)
{
    for (int i = 0; i < 200; i++) {
        if (al_test_metric_at(g_mport, series) == want) return 0;
        usleep(100000);
    }
    fprintf(stderr, "  %s stayed %g (want %g)\n", series, al_test_metric_at(g_mport, series),
            want);
    return -1;
}

static int wait_up_metric(const char *name, int replica, double want)
{
    char series[400];
    snprintf(series, sizeof series, "%s{upstream=\"%s\"}", name, g_s[replica].url);
    return wait_metric(series, want);
}

/* One call of rollout r of task; the HTTP status (0: no answer); *hdrs the answer's head. */
static long call(const char *task, int r, char **hdrs, char **body)
{
    char url[400];
    snprintf(url, sizeof url, "%s/r/%s/roll-%d/v1/chat/completions", g_p.base, task, r);
    px_resp resp;
    const char *req = "{\"model\":\"tiny\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],"
                      "\"max_tokens\":3,\"seed\":1}";
    if (px_http("POST", url, PX_JSON, req, &resp) != 0) return 0;
    long st = resp.status;
    if (hdrs) *hdrs = strdup(resp.headers);
    if (body) *body = strdup(resp.body);
    px_resp_free(&resp);
    return st;
}

/* Every rollout of task calls once; each must answer 200. */
static void call_all(const char *task)
{
    for (int r = 0; r < NROLL; r++) {
        long st = call(task, r, NULL, NULL);
        CHECKF(st == 200, "%s roll-%d: %ld", task, r, st);
    }
}

typedef struct seen {
    int n;
    int64_t version[NROLL];
    int replica[NROLL]; /* which replica answered rollout r */
} seen;

/* The spans of task: per rollout, its version and replica. */
static void spans_of_task(const al_test_msgs *m, const char *task, seen *out)
{
    memset(out, 0, sizeof *out);
    for (int r = 0; r < NROLL; r++)
        out->replica[r] = -1;
    for (size_t i = 0; i < m->n; i++) {
        al_span s = {0};
        char err[256];
        if (al_span_decode(m->val[i], m->len[i], &s, err, sizeof err) != 0) continue;
        if (s.kind == AL_SPAN_KIND_LLM_CALL && !strcmp(s.task_id, task)) {
            int r = atoi(s.rollout_id + 5);
            if (r >= 0 && r < NROLL) {
                out->version[r] = s.llm_call.policy_version;
                out->replica[r] = strcmp(s.llm_call.upstream, g_s[0].url) == 0   ? 0
                                  : strcmp(s.llm_call.upstream, g_s[1].url) == 0 ? 1
                                                                                 : -1;
                out->n++;
            }
        }
        al_span_clear(&s);
    }
}

TEST(spans_carry_the_version_sync_says_staleness_and_failover)
{
    curl_global_init(CURL_GLOBAL_ALL);
    REQUIRE(al_test_broker_start(&g_b, NULL) == 0);
    char *dir = sv_tmpdir("t1013");
    REQUIRE(dir && sv_make_model(dir, "tiny", 5) == 0);
    char model[300], ptmp[512], spool[600], log[600], metrics[64], err[256];
    snprintf(model, sizeof model, "%s/tiny", dir);
    al_test_tmpdir(ptmp, sizeof ptmp, "proxy");
    REQUIRE(ptmp[0]);
    snprintf(spool, sizeof spool, "%s/spool", ptmp);
    snprintf(log, sizeof log, "%s/proxy.log", ptmp);
    const char *sargs[] = {"--model", model, NULL};
    REQUIRE(sv_start(&g_s[0], sargs) == 0);
    REQUIRE(sv_start(&g_s[1], sargs) == 0);
    rd_kafka_conf_t *kc = rd_kafka_conf_new();
    rd_kafka_conf_set(kc, "bootstrap.servers", g_b.bootstrap, err, sizeof err);
    g_prod = rd_kafka_new(RD_KAFKA_PRODUCER, kc, err, sizeof err);
    REQUIRE(g_prod);

    /* what sync recorded before the proxy started: a at 3, b at 5 */
    int64_t t0 = al_now_us();
    sync_rec(0, 3, t0 - 2000000, t0 - 1000000);
    sync_rec(1, 5, t0 - 2000000, t0 - 1500000);
    g_mport = al_test_free_port();
    snprintf(metrics, sizeof metrics, "127.0.0.1:%d", g_mport);
    const char *pargs[] = {"--listen", "127.0.0.1:0", "--upstream", g_s[0].url, "--upstream",
                           g_s[1].url, "--upstream-kind", "vllm", "--bootstrap", g_b.bootstrap,
                           "--spool-dir", spool, "--metrics", metrics, "--sync-topic",
                           "arclight.sync", "--policy-model", "tiny", "--max-staleness", "1",
                           "--health-interval-ms", "200", NULL};
    REQUIRE(px_start(&g_p, log, pargs, NULL) == 0);
    REQUIRE(wait_up_metric("arclight_proxy_upstream_policy_version", 0, 3) == 0);
    REQUIRE(wait_up_metric("arclight_proxy_upstream_policy_version", 1, 5) == 0);

    /* phase 1: every rollout's span carries its replica's version */
    call_all("t1");
    /* phase 2: a's swap to 4 has begun (recorded), not ended: a's calls are unknown */
    int64_t s4 = al_now_us();
    sync_rec(0, 4, s4, 0);
    REQUIRE(wait_up_metric("arclight_proxy_upstream_swapping", 0, 1) == 0);
    call_all("t2");
    /* phase 3: the swap ended; a's calls from now on are 4's */
    sync_rec(0, 4, s4, al_now_us());
    REQUIRE(wait_up_metric("arclight_proxy_upstream_policy_version", 0, 4) == 0);
    REQUIRE(wait_up_metric("arclight_proxy_upstream_swapping", 0, 0) == 0);
    call_all("t3");

    al_test_msgs m;
    CHECK(al_test_topic_read(g_b.bootstrap, "arclight.spans", "roll-", 3 * NROLL, 30000, &m) == 0);
    seen p1, p2, p3;
    spans_of_task(&m, "t1", &p1);
    spans_of_task(&m, "t2", &p2);
    spans_of_task(&m, "t3", &p3);
    al_test_msgs_free(&m);
    CHECK_EQ_INT(p1.n, NROLL);
    CHECK_EQ_INT(p2.n, NROLL);
    CHECK_EQ_INT(p3.n, NROLL);
    int on[2] = {0, 0};
    for (int r = 0; r < NROLL; r++) {
        int a = p1.replica[r];
        REQUIRE(a == 0 || a == 1);
        on[a]++;
        CHECKF(p2.replica[r] == a && p3.replica[r] == a, "roll-%d moved replicas", r);
        CHECKF(p1.version[r] == (a ? 5 : 3), "t1 roll-%d on %c: version %lld", r, "ab"[a],
               (long long)p1.version[r]);
        CHECKF(p2.version[r] == (a ? 5 : -1), "t2 roll-%d on %c: version %lld", r, "ab"[a],
               (long long)p2.version[r]);
        CHECKF(p3.version[r] == (a ? 5 : 4), "t3 roll-%d on %c: version %lld", r, "ab"[a],
               (long long)p3.version[r]);
    }
    printf("  rollouts: %d on a, %d on b\n", on[0], on[1]);
    CHECK(on[0] > 0 && on[1] > 0);

    /* --max-staleness 1: the trainer publishes 6; a serves 4 */
    al_policy_version pv = {.model = "tiny", .version = 6, .step = 6,
                            .checkpoint_uri = "file:///x/step-6/", .sha256 = "00",
                            .created_us = al_now_us()};
    al_buf pb = {0};
    REQUIRE(al_policy_version_encode(&pv, &pb, err, sizeof err) == 0);
    produce("arclight.policy", "tiny", pb.data, pb.len);
    al_buf_free(&pb);
    REQUIRE(wait_metric("arclight_proxy_trainer_version", 6) == 0);
    char *hd = NULL, *body = NULL;
    CHECK_EQ_INT((int)call("t4", 0, &hd, &body), 429);
    CHECKF(hd && strcasestr(hd, "\nRetry-After: "), "429 without Retry-After: %s", hd ? hd : "");
    json_t *j = body ? json_loads(body, 0, NULL) : NULL;
    CHECK_EQ_STR(json_string_value(json_object_get(json_object_get(j, "error"), "code")),
                 "policy_too_stale");
    printf("  429: %s\n", body ? body : "");
    json_decref(j);
    free(hd), free(body);
    CHECK_EQ_INT((int)call("t3", 1, NULL, NULL), 200); /* under way: goes on */
    CHECK(al_test_metric_at(g_mport, "arclight_proxy_staleness_refused_total") == 1);
    sync_rec(0, 5, al_now_us() - 1000, al_now_us());
    REQUIRE(wait_metric("arclight_proxy_fleet_version", 5) == 0);
    CHECK_EQ_INT((int)call("t4", 0, NULL, NULL), 200);

    /* health: b dies mid-run; its rollouts go to a, none fails */
    char bport[16];
    snprintf(bport, sizeof bport, "%s", strrchr(g_s[1].url, ':') + 1);
    kill(g_s[1].pid, SIGKILL);
    waitpid(g_s[1].pid, NULL, 0);
    call_all("t5"); /* a call that finds b dead fails over at once, later ones skip b */
    CHECK(wait_up_metric("arclight_proxy_upstream_healthy", 1, 0) == 0);
    call_all("t6");
    char listen[64];
    snprintf(listen, sizeof listen, "127.0.0.1:%s", bport);
    const char *bargs[] = {"--model", model, "--listen", listen, NULL};
    REQUIRE(sv_start(&g_s[1], bargs) == 0);
    CHECK(wait_up_metric("arclight_proxy_upstream_healthy", 1, 1) == 0);
    call_all("t7");
    CHECK(al_test_topic_read(g_b.bootstrap, "arclight.spans", "roll-", 6 * NROLL + 2, 30000, &m) ==
          0);
    seen p5, p6, p7;
    spans_of_task(&m, "t5", &p5);
    spans_of_task(&m, "t6", &p6);
    spans_of_task(&m, "t7", &p7);
    al_test_msgs_free(&m);
    CHECK_EQ_INT(p5.n, NROLL);
    CHECK_EQ_INT(p6.n, NROLL);
    for (int r = 0; r < NROLL; r++) {
        CHECKF(p5.replica[r] == 0 && p6.replica[r] == 0, "roll-%d answered by %d/%d with b down",
               r, p5.replica[r], p6.replica[r]);
        CHECKF(p7.replica[r] == p1.replica[r], "roll-%d not back on its replica", r);
    }
    char series[400];
    snprintf(series, sizeof series, "arclight_proxy_upstream_errors_total{upstream=\"%s\"}",
             g_s[1].url);
    double berr = al_test_metric_at(g_mport, series);
    snprintf(series, sizeof series, "arclight_proxy_upstream_requests_total{upstream=\"%s\"}",
             g_s[0].url);
    double areq = al_test_metric_at(g_mport, series);
    printf("  b's failed calls (failed over): %g; a's calls: %g\n", berr, areq);
    /* at most one failed call per rollout of b's, none when a health check saw b die first */
    CHECK(berr >= 0 && berr <= on[1]);
    CHECK(areq >= 3 * on[0] + 2 * NROLL);

    CHECK_EQ_INT(px_stop(&g_p, SIGTERM, 20), 0);
    sv_stop(&g_s[0]);
    sv_stop(&g_s[1]);
    rd_kafka_destroy(g_prod);
    al_test_broker_stop(&g_b);
    al_test_rmtree(dir);
    al_test_rmtree(ptmp);
    free(dir);
    curl_global_cleanup();
}

TEST(a_real_sync_run_tags_the_spans)
{
    curl_global_init(CURL_GLOBAL_ALL);
    REQUIRE(al_test_broker_start(&g_b, NULL) == 0);
    char *dir = sv_tmpdir("t1013b");
    REQUIRE(dir && sv_make_model(dir, "tiny", 5) == 0 && sv_make_model(dir, "out/step-1", 11) == 0);
    char model[300], ptmp[512], spool[600], log[600], metrics[64], err[256];
    snprintf(model, sizeof model, "%s/tiny", dir);
    al_test_tmpdir(ptmp, sizeof ptmp, "proxy");
    REQUIRE(ptmp[0]);
    snprintf(spool, sizeof spool, "%s/spool", ptmp);
    snprintf(log, sizeof log, "%s/proxy.log", ptmp);
    const char *sargs[] = {"--model", model, "--weight-routes", NULL};
    REQUIRE(sv_start(&g_s[0], sargs) == 0);
    REQUIRE(sv_start(&g_s[1], sargs) == 0);
    rd_kafka_conf_t *kc = rd_kafka_conf_new();
    rd_kafka_conf_set(kc, "bootstrap.servers", g_b.bootstrap, err, sizeof err);
    g_prod = rd_kafka_new(RD_KAFKA_PRODUCER, kc, err, sizeof err);
    REQUIRE(g_prod);
    /* the topics exist before the followers look for them */
    produce("arclight.sync", "-", "{}", 2);
    char ra[300], rb[300];
    snprintf(ra, sizeof ra, "sglang=%s", g_s[0].url);
    snprintf(rb, sizeof rb, "vllm=%s", g_s[1].url);
    g_mport = al_test_free_port();
    snprintf(metrics, sizeof metrics, "127.0.0.1:%d", g_mport);
    const char *pargs[] = {"--listen", "127.0.0.1:0", "--upstream", g_s[0].url, "--upstream",
                           g_s[1].url, "--upstream-kind", "vllm", "--bootstrap", g_b.bootstrap,
                           "--spool-dir", spool, "--metrics", metrics, "--sync-topic",
                           "arclight.sync", "--policy-model", "tiny", NULL};
    REQUIRE(px_start(&g_p, log, pargs, NULL) == 0);
    call_all("u1"); /* nothing recorded yet: the replicas' own word */

    char uri[400], file[400], sha[65];
    snprintf(uri, sizeof uri, "file://%s/out/step-1/", dir);
    snprintf(file, sizeof file, "%s/out/step-1/model.safetensors", dir);
    REQUIRE(al_sha256_file(file, sha, err, sizeof err) == 0);
    al_policy_version pv = {.model = "tiny", .version = 1, .step = 1, .checkpoint_uri = uri,
                            .sha256 = sha, .created_us = al_now_us()};
    al_buf pb = {0};
    REQUIRE(al_policy_version_encode(&pv, &pb, err, sizeof err) == 0);
    produce("arclight.policy", "tiny", pb.data, pb.len);
    al_buf_free(&pb);
    const char *argv[] = {al_test_bin(), "sync", "--bootstrap", g_b.bootstrap, "--model-name",
                          "tiny", "--replica", ra, "--replica", rb, "--retry-min-ms", "100",
                          "--retry-max-ms", "400", "--request-timeout", "10", NULL};
    pid_t sync = al_test_spawn(argv, NULL, 1);
    REQUIRE(sync > 0);
    REQUIRE(wait_up_metric("arclight_proxy_upstream_policy_version", 0, 1) == 0);
    REQUIRE(wait_up_metric("arclight_proxy_upstream_policy_version", 1, 1) == 0);
    CHECK(wait_up_metric("arclight_proxy_upstream_swapping", 0, 0) == 0);
    CHECK(wait_up_metric("arclight_proxy_upstream_swapping", 1, 0) == 0);
    call_all("u2");

    al_test_msgs m;
    CHECK(al_test_topic_read(g_b.bootstrap, "arclight.spans", "roll-", 2 * NROLL, 30000, &m) == 0);
    seen s1, s2;
    spans_of_task(&m, "u1", &s1);
    spans_of_task(&m, "u2", &s2);
    al_test_msgs_free(&m);
    CHECK_EQ_INT(s1.n, NROLL);
    CHECK_EQ_INT(s2.n, NROLL);
    for (int r = 0; r < NROLL; r++) {
        CHECKF(s1.version[r] == 0, "u1 roll-%d: version %lld", r, (long long)s1.version[r]);
        CHECKF(s2.version[r] == 1, "u2 roll-%d: version %lld", r, (long long)s2.version[r]);
    }
    CHECK(al_test_metric_at(g_mport, "arclight_proxy_version_disagreements_total") == 0);

    kill(sync, SIGTERM);
    CHECK(al_test_wait(sync, 30) == 0);
    CHECK_EQ_INT(px_stop(&g_p, SIGTERM, 20), 0);
    sv_stop(&g_s[0]);
    sv_stop(&g_s[1]);
    rd_kafka_destroy(g_prod);
    al_test_broker_stop(&g_b);
    al_test_rmtree(dir);
    al_test_rmtree(ptmp);
    free(dir);
    curl_global_cleanup();
}
