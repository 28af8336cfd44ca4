/*
 * 1250: `arclight sync` against two `arclight serve --weight-routes` replicas, one driven with
 * SGLang's routes and one with vLLM's, on the embedded broker:
 *   - after each PolicyVersion both replicas answer with the new weights (their logprobs of a
 *     fixed prompt equal the CPU model's on the version's directory) and report its version;
 *   - a version whose directory cannot be loaded yet fails, leaves the old weights serving (the
 *     logprobs unchanged), is retried with backoff, and applied once the directory is there;
 *   - a replica that is down when a version comes is brought to it when it returns, and one
 *     restarted on its first weights after it was brought up to date is brought back;
 *   - an older PolicyVersion published late is never applied; per replica, the versions
 *     recorded on arclight.sync as applied never go down, and every attempt is recorded.
 */
#include "testlib.h"

#include "broker_fixture.h"
#include "t1199_serve_helpers.h"

#include "avro/codec.h"
#include "core/sha256.h"
#include "core/util.h"

#include <librdkafka/rdkafka.h>
#include <math.h>

static char *g_dir;
static al_test_broker g_broker;
static sv_server g_a, g_b;
static int g_b_port;
static pid_t g_sync;
static int g_metrics_port;
static rd_kafka_t *g_prod;
static const int32_t PROMPT[] = {11, 22, 33, 44};

static void start_b(void)
{
    char listen[64], base[300];
    snprintf(listen, sizeof listen, "127.0.0.1:%d", g_b_port);
    snprintf(base, sizeof base, "%s/tiny", g_dir);
    const char *args[] = {"--model", base, "--weight-routes", "--listen", listen, NULL};
    REQUIRE(sv_start(&g_b, args) == 0);
}

static void setup(void)
{
    if (g_dir) return;
    g_dir = sv_tmpdir("t1250");
    REQUIRE(g_dir);
    REQUIRE(sv_make_model(g_dir, "tiny", 1) == 0);
    for (int v = 1; v <= 3; v++) {
        char name[32];
        snprintf(name, sizeof name, "out/step-%d", v);
        REQUIRE(sv_sh("mkdir -p %s/out", g_dir) == 0);
        if (v != 2) REQUIRE(sv_make_model(g_dir, name, 10 + v) == 0);
    }
    REQUIRE(sv_make_model(g_dir, "hold/step-2", 12) == 0); /* moved into place later */
    char topics[300];
    snprintf(topics, sizeof topics, "%s/topics.conf", g_dir);
    FILE *f = fopen(topics, "w");
    REQUIRE(f);
    fputs("arclight.policy 1 1\narclight.sync 1 1\n", f);
    fclose(f);
    const char *extra[] = {"--topics", topics, NULL};
    REQUIRE(al_test_broker_start(&g_broker, extra) == 0);
    char base[300], err[256];
    snprintf(base, sizeof base, "%s/tiny", g_dir);
    const char *args[] = {"--model", base, "--weight-routes", NULL};
    REQUIRE(sv_start(&g_a, args) == 0);
    g_b_port = al_test_free_port();
    start_b();
    rd_kafka_conf_t *c = rd_kafka_conf_new();
    rd_kafka_conf_set(c, "bootstrap.servers", g_broker.bootstrap, err, sizeof err);
    g_prod = rd_kafka_new(RD_KAFKA_PRODUCER, c, err, sizeof err);
    REQUIRE(g_prod);
    char ra[300], rb[300], metrics[64];
    g_metrics_port = al_test_free_port();
    snprintf(metrics, sizeof metrics, "127.0.0.1:%d", g_metrics_port);
    snprintf(ra, sizeof ra, "sglang=%s", g_a.url);
    snprintf(rb, sizeof rb, "vllm=%s", g_b.url);
    const char *argv[] = {al_test_bin(), "sync", "--bootstrap", g_broker.bootstrap, "--model-name",
                          "tiny", "--replica", ra, "--replica", rb, "--retry-min-ms", "100",
                          "--retry-max-ms", "400", "--request-timeout", "10", "--check-every", "0.5",
                          "--metrics", metrics, NULL};
    g_sync = al_test_spawn(argv, NULL, 1);
    REQUIRE(g_sync > 0);
}

/* Publishes version v of tiny naming OUT/step-v/ (sha256 of the file when it exists). */
static void publish(int64_t v)
{
    char uri[400], path[400], sha[65] = "0000000000000000000000000000000000000000000000000000000000000000";
    char err[256];
    snprintf(uri, sizeof uri, "file://%s/out/step-%lld/", g_dir, (long long)v);
    snprintf(path, sizeof path, "%s/out/step-%lld/model.safetensors", g_dir, (long long)v);
    if (access(path, R_OK) == 0) al_sha256_file(path, sha, err, sizeof err);
    al_policy_version pv = {.model = "tiny", .version = v, .step = v, .checkpoint_uri = uri,
                            .sha256 = sha, .created_us = al_now_us()};
    al_buf b = {0};
    REQUIRE(al_policy_version_encode(&pv, &b, err, sizeof err) == 0);
    rd_kafka_resp_err_t e = rd_kafka_producev(
        g_prod, RD_KAFKA_V_TOPIC("arclight.policy"), RD_KAFKA_V_PARTITION(0),
        RD_KAFKA_V_KEY("tiny", 4), RD_KAFKA_V_VALUE(b.data, b.len),
        RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_END);
    CHECKF(e == 0, "produce: %s", rd_kafka_err2str(e));
    rd_kafka_flush(g_prod, 10000);
    al_buf_free(&b);
}

/* The weight version a replica reports (SGLang's route on a, vLLM's on b); -1: no answer. */
static long long reported(const sv_server *s, int vllm)
{
    json_t *j = sv_get_json(s->url, vllm ? "/weight_info" : "/get_weight_version");
    const char *v = j ? json_string_value(json_object_get(j, "weight_version")) : NULL;
    long long n = v ? atoll(v) : -1;
    json_decref(j);
    return n;
}

static int wait_reported(const sv_server *s, int vllm, long long want, double secs)
{
    double t0 = testlib_now();
    while (testlib_now() - t0 < secs) {
        if (reported(s, vllm) == want) return 0;
        usleep(100000);
    }
    return -1;
}

/* The replica's logprobs of 8 tokens after PROMPT equal those of the model in dir (1e-4), and
 * the JSON names version v. */
static void check_served(const sv_server *s, const char *dir, int64_t v)
{
    long code = 0;
    json_t *j = NULL;
    /* 503 + Retry-After while sync holds generation paused for a retry: ask again, as a
     * client does */
    for (int tries = 0; tries < 50; tries++) {
        json_decref(j);
        j = sv_post_json(s->url, "/v1/completions",
                         "{\"prompt\":[11,22,33,44],\"max_tokens\":8,\"logprobs\":0,"
                         "\"return_token_ids\":true,\"ignore_eos\":true,\"seed\":5}",
                         &code);
        if (code != 503) break;
        usleep(100000);
    }
    REQUIREF(j && code == 200, "completion: %ld", code);
    CHECK_EQ_INT((int)json_integer_value(json_object_get(j, "policy_version")), (int)v);
    json_t *c0 = json_array_get(json_object_get(j, "choices"), 0);
    int32_t *gen = NULL;
    int ng = sv_ids(json_object_get(c0, "token_ids"), &gen);
    json_t *lps = json_object_get(json_object_get(c0, "logprobs"), "token_logprobs");
    float want[8];
    CHECK(ng == 8 && sv_trainer_logprobs(dir, PROMPT, 4, gen, ng, want) == 0);
    double d = 0;
    for (int i = 0; i < ng && i < 8; i++)
        d = fmax(d, fabs(json_real_value(json_array_get(lps, (size_t)i)) - want[i]));
    CHECKF(d < 1e-4, "%s serves logprobs %g away from %s", s->url, d, dir);
    free(gen);
    json_decref(j);
}

static void step_dir(char *out, size_t n, int v)
{
    snprintf(out, n, "%s/out/step-%d", g_dir, v);
}

TEST(versions_reach_both_back_ends_retried_caught_up_never_reversed)
{
    setup();
    char d1[300], d2[300], d3[300];
    step_dir(d1, sizeof d1, 1), step_dir(d2, sizeof d2, 2), step_dir(d3, sizeof d3, 3);

    publish(1);
    CHECK(wait_reported(&g_a, 0, 1, 30) == 0);
    CHECK(wait_reported(&g_b, 1, 1, 30) == 0);
    check_served(&g_a, d1, 1);
    check_served(&g_b, d1, 1);

    /* a vLLM weight-update session left open (a sync that died mid-update) does not block b */
    json_decref(sv_post_json(g_b.url, "/start_weight_update", "{}", NULL));

    /* version 2's directory is not there yet: refused, old weights kept, retried */
    publish(2);
    usleep(1500000);
    CHECK(reported(&g_a, 0) == 1 && reported(&g_b, 1) == 1);
    check_served(&g_a, d1, 1);
    check_served(&g_b, d1, 1);
    REQUIRE(sv_sh("mv %s/hold/step-2 %s", g_dir, d2) == 0);
    CHECK(wait_reported(&g_a, 0, 2, 30) == 0);
    CHECK(wait_reported(&g_b, 1, 2, 30) == 0);
    check_served(&g_a, d2, 2);
    check_served(&g_b, d2, 2);

    /* b down while version 3 comes; back (on its first weights), it is brought to 3 */
    sv_stop(&g_b);
    publish(3);
    CHECK(wait_reported(&g_a, 0, 3, 30) == 0);
    check_served(&g_a, d3, 3);
    usleep(800000);
    start_b();
    CHECK(wait_reported(&g_b, 1, 3, 30) == 0);
    check_served(&g_b, d3, 3);

    /* b restarted on its first weights while sync thinks it up to date: brought back */
    sv_stop(&g_b);
    start_b();
    CHECK(reported(&g_b, 1) == 0);
    CHECK(wait_reported(&g_b, 1, 3, 30) == 0);
    check_served(&g_b, d3, 3);

    /* an older version published late is not applied */
    publish(1);
    usleep(1500000);
    CHECK(reported(&g_a, 0) == 3 && reported(&g_b, 1) == 3);

    /* its metrics */
    char series[400];
    snprintf(series, sizeof series, "arclight_sync_replica_version{replica=\"%s\"}", g_b.url);
    CHECK(al_test_metric_at(g_metrics_port, series) == 3);
    snprintf(series, sizeof series, "arclight_sync_updates_total{replica=\"%s\",result=\"failed\"}",
             g_a.url);
    CHECK(al_test_metric_at(g_metrics_port, series) >= 1);
    CHECK(al_test_metric_at(g_metrics_port, "arclight_sync_target_version") == 3);

    /* the record: every attempt, applied versions only going up per replica */
    kill(g_sync, SIGTERM);
    int st = al_test_wait(g_sync, 30);
    CHECKF(WIFEXITED(st) && WEXITSTATUS(st) == 0, "sync exited %d", st);
    char err[512];
    rd_kafka_conf_t *c = rd_kafka_conf_new();
    rd_kafka_conf_set(c, "bootstrap.servers", g_broker.bootstrap, err, sizeof err);
    rd_kafka_conf_set(c, "group.id", "t1250-reader", err, sizeof err);
    rd_kafka_conf_set(c, "enable.partition.eof", "true", err, sizeof err);
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_CONSUMER, c, err, sizeof err);
    REQUIRE(rk);
    rd_kafka_poll_set_consumer(rk);
    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(1);
    rd_kafka_topic_partition_list_add(l, "arclight.sync", 0)->offset = RD_KAFKA_OFFSET_BEGINNING;
    rd_kafka_assign(rk, l);
    rd_kafka_topic_partition_list_destroy(l);
    long long last_ok[2] = {-1, -1};
    int oks[2] = {0, 0}, fails[2] = {0, 0}, begins[2] = {0, 0}, reversed = 0, v2_failed_first = 0;
    double t0 = testlib_now();
    while (testlib_now() - t0 < 20) {
        rd_kafka_message_t *m = rd_kafka_consumer_poll(rk, 300);
        if (!m) continue;
        int eof = m->err == RD_KAFKA_RESP_ERR__PARTITION_EOF;
        json_t *j = !m->err ? json_loadb(m->payload, m->len, 0, NULL) : NULL;
        if (j) {
            const char *rep = json_string_value(json_object_get(j, "replica"));
            int i = rep && !strcmp(rep, g_b.url) ? 1 : 0;
            CHECK_EQ_STR(json_string_value(json_object_get(j, "kind")), i ? "vllm" : "sglang");
            CHECK_EQ_STR(json_string_value(json_object_get(j, "model")), "tiny");
            long long v = json_integer_value(json_object_get(j, "version"));
            if (json_is_null(json_object_get(j, "finished_us"))) {
                /* an attempt's beginning, sent before it starts */
                CHECK(json_is_null(json_object_get(j, "ok")));
                begins[i]++;
            } else if (json_is_true(json_object_get(j, "ok"))) {
                CHECK(json_integer_value(json_object_get(j, "finished_us")) >=
                      json_integer_value(json_object_get(j, "started_us")));
                if (v < last_ok[i]) reversed++;
                last_ok[i] = v, oks[i]++;
                CHECK(json_is_null(json_object_get(j, "error")));
            } else {
                CHECK(json_integer_value(json_object_get(j, "finished_us")) >=
                      json_integer_value(json_object_get(j, "started_us")));
                fails[i]++;
                if (v == 2 && last_ok[i] == 1) v2_failed_first++;
                CHECK(json_is_string(json_object_get(j, "error")));
            }
            json_decref(j);
        }
        rd_kafka_message_destroy(m);
        if (eof) break;
    }
    rd_kafka_destroy(rk);
    printf("  records: sglang %d applied, %d failed; vllm %d applied, %d failed\n", oks[0],
           fails[0], oks[1], fails[1]);
    /* b: 1, 2, 3, and 3 again after its restart */
    CHECKF(oks[0] == 3 && oks[1] == 4, "applied: sglang %d (want 3), vllm %d (want 4)", oks[0],
           oks[1]);
    CHECK(reversed == 0);
    /* every attempt's beginning was recorded before it */
    CHECKF(begins[0] == oks[0] + fails[0] && begins[1] == oks[1] + fails[1],
           "beginnings: sglang %d, vllm %d", begins[0], begins[1]);
    CHECK(v2_failed_first >= 2);  /* both replicas failed version 2 before it was there */
    CHECK(fails[1] >= 1 + 1);     /* b: version 2, and at least once while it was down */
    CHECK(last_ok[0] == 3 && last_ok[1] == 3);

    sv_stop(&g_a);
    sv_stop(&g_b);
    rd_kafka_destroy(g_prod);
    al_test_broker_stop(&g_broker);
    al_test_rmtree(g_dir);
    free(g_dir);
}
