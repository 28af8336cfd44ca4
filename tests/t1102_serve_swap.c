/*
 * 1102: hot weight swaps under load. `arclight serve --follow-policy` against the embedded
 * broker serves the tiny model (version 0) while four clients keep requests in flight;
 * PolicyVersions arrive on arclight.policy: version 1 (file://, right sha256), version 2
 * (wrong sha256: refused, version 1 keeps serving; so does a version of another model), version 3
 * (http://, fetched with libcurl from a plain HTTP file server). No request fails; every response
 * names its version in the header and the JSON; its logprobs equal the trainer's with THAT
 * version's weights (so no request changed weights midway); the old weight sets are freed once
 * their last request ends.
 */
#include "testlib.h"
#include "broker_fixture.h"
#include "t1199_serve_helpers.h"

#include "avro/codec.h"
#include "core/util.h"

#include <librdkafka/rdkafka.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sys/socket.h>

static char *g_dir;
static sv_server g_srv;
static al_test_broker g_broker;

typedef struct sample {
    int64_t version;
    int32_t prompt[16], gen[40];
    int np, ng;
    double lp[40];
} sample;

typedef struct load {
    volatile int stop;
    int requests, failures, header_mismatch;
    int per_version[4];
    sample samples[4][3]; /* up to 3 per version, the latest */
    int nsamples[4];
    pthread_mutex_t lock;
} load;

static void record(load *L, const sv_resp *r)
{
    pthread_mutex_lock(&L->lock);
    L->requests++;
    json_t *j = r->code == 200 && r->body.p ? json_loads(r->body.p, JSON_ALLOW_NUL, NULL) : NULL;
    if (!j) {
        L->failures++;
        fprintf(stderr, "  failed request: %ld %.200s\n", r->code, r->body.p ? r->body.p : "");
        pthread_mutex_unlock(&L->lock);
        return;
    }
    int64_t v = json_integer_value(json_object_get(j, "policy_version"));
    char hdr[64];
    snprintf(hdr, sizeof hdr, "x-arclight-policy-version: %lld", (long long)v);
    if (!strstr(r->headers.p, hdr)) L->header_mismatch++;
    if (v >= 0 && v < 4) {
        L->per_version[v]++;
        sample *s = &L->samples[v][L->nsamples[v] % 3];
        L->nsamples[v]++;
        json_t *c0 = json_array_get(json_object_get(j, "choices"), 0);
        json_t *p = json_object_get(c0, "prompt_token_ids"), *g = json_object_get(c0, "token_ids");
        json_t *lp = json_object_get(json_object_get(c0, "logprobs"), "token_logprobs");
        s->version = v;
        s->np = (int)json_array_size(p) < 16 ? (int)json_array_size(p) : 16;
        s->ng = (int)json_array_size(g) < 40 ? (int)json_array_size(g) : 40;
        for (int i = 0; i < s->np; i++)
            s->prompt[i] = (int32_t)json_integer_value(json_array_get(p, i));
        for (int i = 0; i < s->ng; i++) {
            s->gen[i] = (int32_t)json_integer_value(json_array_get(g, i));
            s->lp[i] = json_real_value(json_array_get(lp, i));
        }
    }
    json_decref(j);
    pthread_mutex_unlock(&L->lock);
}

static void *load_main(void *arg)
{
    load *L = arg;
    enum { C = 4 };
    char *bodies[C];
    int round = 0;
    while (!L->stop) {
        for (int i = 0; i < C; i++) {
            bodies[i] = malloc(256);
            snprintf(
                bodies[i], 256,
                "{\"model\":\"tiny\",\"prompt\":[%d,20,30,40],\"max_tokens\":%d,\"logprobs\":0,"
                "\"return_token_ids\":true,\"ignore_eos\":true,\"seed\":%d}",
                10 + i, 24 + 4 * i, round * C + i);
        }
        sv_resp out[C];
        sv_post_many(g_srv.url, "/v1/completions", bodies, C, out);
        for (int i = 0; i < C; i++) {
            record(L, &out[i]);
            sv_resp_free(&out[i]);
            free(bodies[i]);
        }
        round++;
    }
    return NULL;
}

static void publish_for(rd_kafka_t *p, const char *model, int64_t version, const char *uri,
                        const char *sha)
{
    al_policy_version pv = {.model = model,
                            .version = version,
                            .step = version * 10,
                            .checkpoint_uri = uri,
                            .sha256 = sha,
                            .created_us = al_now_us()};
    al_buf b = {0};
    char err[256];
    REQUIRE(al_policy_version_encode(&pv, &b, err, sizeof err) == 0);
    rd_kafka_resp_err_t e = rd_kafka_producev(
        p, RD_KAFKA_V_TOPIC("arclight.policy"), RD_KAFKA_V_KEY("tiny", 4),
        RD_KAFKA_V_VALUE(b.data, b.len), RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_END);
    CHECKF(e == 0, "produce: %s", rd_kafka_err2str(e));
    rd_kafka_flush(p, 10000);
    al_buf_free(&b);
}

static void publish(rd_kafka_t *p, int64_t version, const char *uri, const char *sha)
{
    publish_for(p, "tiny", version, uri, sha);
}

static int64_t health_int(const char *key)
{
    json_t *h = sv_get_json(g_srv.url, "/health");
    int64_t v = json_integer_value(json_object_get(h, key));
    json_decref(h);
    return v;
}

static int wait_version(int64_t want, double secs)
{
    double t0 = testlib_now();
    while (testlib_now() - t0 < secs) {
        if (health_int("policy_version") == want) return 0;
        usleep(50000);
    }
    return -1;
}

static void sha_of(const char *path, char hex[65])
{
    size_t n;
    char err[256];
    char *d = al_file_read(path, &n, err, sizeof err);
    al_sha256_hex(d ? d : "", d ? n : 0, hex);
    free(d);
}

static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t l = sizeof a;
    bind(fd, (struct sockaddr *)&a, sizeof a);
    getsockname(fd, (struct sockaddr *)&a, &l);
    close(fd);
    return ntohs(a.sin_port);
}

TEST(weights_swap_under_load_without_a_failed_request)
{
    curl_global_init(CURL_GLOBAL_ALL);
    g_dir = sv_tmpdir("t1102");
    REQUIRE(g_dir);
    REQUIRE(sv_make_model(g_dir, "tiny", 5) == 0);
    REQUIRE(
        sv_sh("%s model init --config tests/model/tiny-qwen2.json --out %s/v1 --seed 6 >/dev/null",
              sv_bin(), g_dir) == 0);
    REQUIRE(
        sv_sh("%s model init --config tests/model/tiny-qwen2.json --out %s/v3 --seed 7 >/dev/null",
              sv_bin(), g_dir) == 0);
    char topics[300];
    snprintf(topics, sizeof topics, "%s/topics.conf", g_dir);
    FILE *f = fopen(topics, "w");
    REQUIRE(f);
    fputs("arclight.policy 1 1\n", f);
    fclose(f);
    const char *bargs[] = {"--topics", topics, NULL};
    REQUIRE(al_test_broker_start(&g_broker, bargs) == 0);

    char model[300];
    snprintf(model, sizeof model, "%s/tiny", g_dir);
    const char *args[] = {
        "--model", model, "--follow-policy", "--bootstrap", g_broker.bootstrap,
        "--checkpoint-root", g_dir, "--log-level", "warn", NULL};
    REQUIRE(sv_start(&g_srv, args) == 0);

    /* an HTTP file server for version 3 */
    int hport = free_port();
    pid_t http = fork();
    if (http == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        char port[16];
        snprintf(port, sizeof port, "%d", hport);
        int devnull = open("/dev/null", O_WRONLY);
        dup2(devnull, 1), dup2(devnull, 2);
        execl("/usr/bin/python3", "python3", "-m", "http.server", "--bind", "127.0.0.1",
              "--directory", g_dir, port, (char *)NULL);
        _exit(127);
    }

    char err[512];
    rd_kafka_conf_t *pc = rd_kafka_conf_new();
    rd_kafka_conf_set(pc, "bootstrap.servers", g_broker.bootstrap, err, sizeof err);
    rd_kafka_conf_set(pc, "enable.idempotence", "true", err, sizeof err); /* keeps the order */
    rd_kafka_t *prod = rd_kafka_new(RD_KAFKA_PRODUCER, pc, err, sizeof err);
    REQUIRE(prod);

    load L = {0};
    pthread_mutex_init(&L.lock, NULL);
    pthread_t th;
    REQUIRE(pthread_create(&th, NULL, load_main, &L) == 0);
    usleep(300000);

    char uri[400], path[400], sha[65];
    snprintf(path, sizeof path, "%s/v1/model.safetensors", g_dir);
    sha_of(path, sha);
    snprintf(uri, sizeof uri, "file://%s/v1/", g_dir);
    publish(prod, 1, uri, sha);
    CHECK(wait_version(1, 30) == 0);
    usleep(300000);

    /* a version of another model is not ours; version 2: the bytes do not match the sha256;
     * version 1 stays through both */
    publish_for(prod, "other-model", 50, uri, sha);
    publish(prod, 2, uri, "0000000000000000000000000000000000000000000000000000000000000000");
    usleep(800000);
    CHECK_EQ_INT((int)health_int("policy_version"), 1);

    snprintf(path, sizeof path, "%s/v3/model.safetensors", g_dir);
    sha_of(path, sha);
    snprintf(uri, sizeof uri, "http://127.0.0.1:%d/v3/model.safetensors", hport);
    publish(prod, 3, uri, sha);
    CHECK(wait_version(3, 30) == 0);
    usleep(300000);
    L.stop = 1;
    pthread_join(th, NULL);

    printf("  %d requests: %d on v0, %d on v1, %d on v3; %d failed\n", L.requests, L.per_version[0],
           L.per_version[1], L.per_version[3], L.failures);
    CHECK_EQ_INT(L.failures, 0);
    CHECK_EQ_INT(L.header_mismatch, 0);
    CHECK(L.per_version[0] > 0 && L.per_version[1] > 0 && L.per_version[3] > 0);
    CHECK_EQ_INT(L.per_version[2], 0);
    CHECK_EQ_INT((int)health_int("weight_swaps"), 2);
    CHECK_EQ_INT((int)health_int("weight_sets"), 1);

    /* each response's logprobs are those of the weights it names */
    const char *dirs[4] = {"tiny", "v1", NULL, "v3"};
    for (int v = 0; v < 4; v++) {
        if (!dirs[v]) continue;
        char md[400];
        snprintf(md, sizeof md, "%s/%s", g_dir, dirs[v]);
        int n = L.nsamples[v] < 3 ? L.nsamples[v] : 3;
        for (int k = 0; k < n; k++) {
            sample *s = &L.samples[v][k];
            float lp[40];
            REQUIRE(sv_trainer_logprobs(md, s->prompt, s->np, s->gen, s->ng, lp) == 0);
            double worst = 0;
            for (int i = 0; i < s->ng; i++)
                worst = fmax(worst, fabs(lp[i] - s->lp[i]));
            CHECKF(worst < 1e-4, "a version %d response differs from version %d's weights by %g", v,
                   v, worst);
        }
    }
    rd_kafka_destroy(prod);
    CHECK_EQ_INT(sv_stop(&g_srv), 0);
    kill(http, SIGTERM);
    waitpid(http, NULL, 0);
    al_test_broker_stop(&g_broker);
    al_test_rmtree(g_dir);
    free(g_dir);
    pthread_mutex_destroy(&L.lock);
    curl_global_cleanup();
}
