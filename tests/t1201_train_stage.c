/* 1201: `arclight train` against the embedded broker over TCP, on the tiny Qwen2 model
 * (`arclight model init --config tests/model/tiny-qwen2.json`):
 *   - a PolicyVersion per update whose sha256 is that of the checkpoint's weights file, both
 *     on disk and as served over HTTP from the trainer's --listen address;
 *   - the SFT loss goes down over four steps of one fixed batch;
 *   - bad chunks (undecodable, a token outside the vocabulary) dead-lettered with the reason,
 *     chunks of another model ignored, duplicates dropped;
 *   - kill -9 right after a PolicyVersion is acknowledged and right after a checkpoint is
 *     written (before its PolicyVersion), then --resume: every version published, and the
 *     final weights bitwise those of an uninterrupted run (no step lost or applied twice). */
#include "testlib.h"

#include "broker_fixture.h"
#include "support.h"
#include "t1249_train_fixtures.h"

#include "avro/codec.h"
#include "core/util.h"

#include <librdkafka/rdkafka.h>
#include <sys/stat.h>

static char workdir[128], model_dir[256], topics_path[256];

static int start_broker(al_test_broker *b)
{
    snprintf(topics_path, sizeof topics_path, "%s/topics.conf", workdir);
    FILE *f = fopen(topics_path, "w");
    if (!f) return -1;
    fputs("arclight.deadletter 1 1\nsft.batches 1 1\nsft.policy 1 1\nsft2.policy 1 1\n"
          "ka.batches 1 1\nka.policy 1 1\nkb.batches 1 1\nkb.policy 1 1\n",
          f);
    fclose(f);
    const char *extra[] = {"--topics", topics_path, NULL};
    return al_test_broker_start(b, extra);
}

static rd_kafka_t *producer(const char *bootstrap)
{
    char err[512];
    rd_kafka_conf_t *c = rd_kafka_conf_new();
    rd_kafka_conf_set(c, "bootstrap.servers", bootstrap, err, sizeof err);
    rd_kafka_conf_set(c, "linger.ms", "1", err, sizeof err);
    rd_kafka_conf_set(c, "enable.idempotence", "true", err, sizeof err);
    return rd_kafka_new(RD_KAFKA_PRODUCER, c, err, sizeof err);
}

static void produce(rd_kafka_t *p, const char *topic, const char *key, const void *v, size_t len)
{
    rd_kafka_resp_err_t e = rd_kafka_producev(
        p, RD_KAFKA_V_TOPIC(topic), RD_KAFKA_V_PARTITION(0), RD_KAFKA_V_KEY(key, strlen(key)),
        RD_KAFKA_V_VALUE((void *)v, len), RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_END);
    CHECKF(e == 0, "produce to %s: %s", topic, rd_kafka_err2str(e));
}

/* Produces chunk idx of count of a step (fixture contents; see t1249_train_fixtures.h). */
static void produce_chunk(rd_kafka_t *p, const char *topic, const char *model, int64_t step,
                          int idx, int count, int seed, int bad_token)
{
    al_buf b = {0};
    if (fx_encode_chunk(&b, model, step, idx, count, 2, seed, bad_token, 0) == 0)
        produce(p, topic, model, b.data, b.len);
    al_buf_free(&b);
}

typedef struct msg {
    uint8_t *value;
    size_t len;
} msg;

/* Every message of a one-partition topic, waiting up to wait_s for at least `want`. */
static msg *read_topic(const char *bootstrap, const char *topic, size_t want, double wait_s,
                       size_t *n_out)
{
    char err[512];
    msg *out = NULL;
    size_t n = 0;
    double t0 = testlib_now();
    for (;;) {
        rd_kafka_conf_t *c = rd_kafka_conf_new();
        rd_kafka_conf_set(c, "bootstrap.servers", bootstrap, err, sizeof err);
        rd_kafka_conf_set(c, "group.id", "t1201-reader", err, sizeof err);
        rd_kafka_conf_set(c, "enable.partition.eof", "true", err, sizeof err);
        rd_kafka_conf_set(c, "enable.auto.commit", "false", err, sizeof err);
        rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_CONSUMER, c, err, sizeof err);
        rd_kafka_poll_set_consumer(rk);
        rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(1);
        rd_kafka_topic_partition_list_add(l, topic, 0)->offset = RD_KAFKA_OFFSET_BEGINNING;
        rd_kafka_assign(rk, l);
        rd_kafka_topic_partition_list_destroy(l);
        for (size_t i = 0; i < n; i++) free(out[i].value);
        n = 0;
        double t1 = testlib_now();
        while (testlib_now() - t1 < 20) {
            rd_kafka_message_t *m = rd_kafka_consumer_poll(rk, 200);
            if (!m) continue;
            int eof = m->err == RD_KAFKA_RESP_ERR__PARTITION_EOF;
            if (!m->err) {
                out = realloc(out, (n + 1) * sizeof *out);
                out[n].len = m->len;
                out[n].value = malloc(m->len ? m->len : 1);
                memcpy(out[n].value, m->payload, m->len);
                n++;
            }
            rd_kafka_message_destroy(m);
            if (eof) break;
        }
        rd_kafka_consumer_close(rk);
        rd_kafka_destroy(rk);
        if (n >= want || testlib_now() - t0 > wait_s) break;
        usleep(300000);
    }
    *n_out = n;
    return out;
}

static void free_msgs(msg *m, size_t n)
{
    for (size_t i = 0; i < n; i++) free(m[i].value);
    free(m);
}

/* Starts `arclight train --bootstrap B --model MODEL ARGS...`; kill_at sets the test hook. */
static pid_t spawn_train(const char *bootstrap, const char *kill_at, const char *const *args)
{
    const char *argv[64];
    int argc = 0;
    argv[argc++] = al_test_bin();
    argv[argc++] = "train";
    argv[argc++] = "--bootstrap";
    argv[argc++] = bootstrap;
    argv[argc++] = "--model";
    argv[argc++] = model_dir;
    argv[argc++] = "--log-level";
    argv[argc++] = getenv("T1201_LOG_LEVEL") ? getenv("T1201_LOG_LEVEL") : "warn";
    for (int i = 0; args[i] && argc < 63; i++) argv[argc++] = args[i];
    argv[argc] = NULL;
    char hook[128];
    snprintf(hook, sizeof hook, "ARCLIGHT_TRAIN_TEST_KILL_AT%s%s", kill_at ? "=" : "",
             kill_at ? kill_at : "");
    const char *env[] = {hook, "ARCLIGHT_KAFKA_SESSION_TIMEOUT_MS=3000", NULL};
    return al_test_spawn(argv, env, 1);
}

static int run_train(const char *bootstrap, const char *kill_at, const char *const *args)
{
    return al_test_wait(spawn_train(bootstrap, kill_at, args), 120);
}

static int file_sha(const char *path, char hex[65])
{
    char err[256];
    size_t len = 0;
    char *d = al_file_read(path, &len, err, sizeof err);
    if (!d) {
        fprintf(stderr, "%s\n", err);
        hex[0] = '\0';
        return -1;
    }
    al_sha256_hex(d, len, hex);
    free(d);
    return 0;
}

/* GET url (http://127.0.0.1:PORT/path) with HTTP/1.0: status code, body in *body (malloc'd). */
static int http_get(const char *url, char **body, size_t *blen)
{
    int port = 0;
    char path[512];
    *body = NULL;
    *blen = 0;
    if (sscanf(url, "http://127.0.0.1:%d%511s", &port, path) != 2) return -1;
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, "127.0.0.1", &sin.sin_addr);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0 || connect(fd, (struct sockaddr *)&sin, sizeof sin) != 0) {
        if (fd >= 0) close(fd);
        return -1;
    }
    char req[700];
    int rl = snprintf(req, sizeof req, "GET %s HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n", path);
    if (write(fd, req, (size_t)rl) != rl) {
        close(fd);
        return -1;
    }
    size_t n = 0, cap = 1 << 16;
    char *buf = malloc(cap);
    ssize_t got;
    while ((got = read(fd, buf + n, cap - n)) > 0) {
        n += (size_t)got;
        if (n == cap) buf = realloc(buf, cap *= 2);
    }
    close(fd);
    int code = -1;
    char *sep = NULL;
    for (size_t i = 0; i + 3 < n; i++)
        if (!memcmp(buf + i, "\r\n\r\n", 4)) {
            sep = buf + i;
            break;
        }
    if (sep && sscanf(buf, "HTTP/1.%*d %d", &code) == 1) {
        *blen = n - (size_t)(sep + 4 - buf);
        *body = malloc(*blen + 1);
        memcpy(*body, sep + 4, *blen);
        (*body)[*blen] = '\0';
    }
    free(buf);
    return code;
}

static al_test_broker broker;
static int broker_ok;

static void setup(void)
{
    if (broker_ok) return;
    snprintf(workdir, sizeof workdir, "/tmp/arclight-t1201-%d", (int)getpid());
    snprintf(model_dir, sizeof model_dir, "%s/tiny", workdir);
    mkdir(workdir, 0755);
    char cmd[1024];
    const char *src = getenv("ARCLIGHT_SOURCE_DIR");
    snprintf(cmd, sizeof cmd, "%s model init --config %s/tests/model/tiny-qwen2.json --out %s --seed 1 >/dev/null",
             al_test_bin(), src ? src : ".", model_dir);
    if (system(cmd) != 0) {
        fprintf(stderr, "cannot run: %s\n", cmd);
        return;
    }
    broker_ok = start_broker(&broker) == 0;
}

TEST(cli_usage)
{
    setup();
    REQUIRE(broker_ok);
    const char *help[] = {"--help", NULL};
    int st = run_train(broker.bootstrap, NULL, help);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    const char *noout[] = {NULL};
    st = run_train(broker.bootstrap, NULL, noout);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 2);
    char out[256];
    snprintf(out, sizeof out, "%s/cli", workdir);
    const char *badloss[] = {"--out", out, "--loss", "bogus", NULL};
    st = run_train(broker.bootstrap, NULL, badloss);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 2);
    const char *badrange[] = {"--out", out, "--eps-low", "-1", NULL};
    st = run_train(broker.bootstrap, NULL, badrange);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 2);
    const char *badnum[] = {"--out", out, "--checkpoint-every", "x", NULL};
    st = run_train(broker.bootstrap, NULL, badnum);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 2);
    /* settings from a JSON file: a bad value there is a usage error too */
    char conf[300];
    snprintf(conf, sizeof conf, "%s/train.json", workdir);
    FILE *f = fopen(conf, "w");
    REQUIRE(f);
    fputs("{\"loss\": \"gspo\", \"lr_schedule\": \"sometimes\", \"batch_size\": 3}\n", f);
    fclose(f);
    const char *badconf[] = {"--out", out, "--train-config", conf, NULL};
    st = run_train(broker.bootstrap, NULL, badconf);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 2);
}

TEST(versions_sha256_http_loss_down_and_dead_letters)
{
    setup();
    REQUIRE(broker_ok);
    rd_kafka_t *p = producer(broker.bootstrap);
    REQUIRE(p);
    static const uint8_t junk[] = "not avro at all";
    produce(p, "sft.batches", "tiny", junk, sizeof junk);
    for (int s = 0; s < 4; s++) {
        if (s == 1) produce_chunk(p, "sft.batches", "tiny", 1, 0, 2, 1, 600); /* token 600 >= 512 */
        if (s == 2) produce_chunk(p, "sft.batches", "other", 2, 0, 1, 1, -1);  /* another model */
        produce_chunk(p, "sft.batches", "tiny", s, 0, 2, 1, -1);
        if (s == 2) produce_chunk(p, "sft.batches", "tiny", s, 0, 2, 1, -1); /* duplicate */
        produce_chunk(p, "sft.batches", "tiny", s, 1, 2, 1, -1);
    }
    rd_kafka_flush(p, 10000);
    rd_kafka_destroy(p);

    char out[256];
    snprintf(out, sizeof out, "%s/sft", workdir);
    const char *args[] = {"--input-topic", "sft.batches", "--policy-topic", "sft.policy", "--group",
                          "t1201-sft", "--out", out, "--loss", "sft", "--lr", "0.01", "--listen",
                          "127.0.0.1:0", "--checkpoint-every", "2", NULL};
    pid_t pid = spawn_train(broker.bootstrap, NULL, args);
    size_t n = 0;
    msg *m = read_topic(broker.bootstrap, "sft.policy", 4, 90, &n);
    CHECK_EQ_INT((int)n, 4);
    double prev_loss = 1e30;
    for (size_t i = 0; i < n; i++) {
        al_policy_version pv = {0};
        char err[256];
        if (al_policy_version_decode(m[i].value, m[i].len, &pv, err, sizeof err) != 0) {
            CHECKF(0, "PolicyVersion %zu: %s", i, err);
            continue;
        }
        CHECK_EQ_STR(pv.model, "tiny");
        CHECK_EQ_INT((int)pv.version, (int)i + 1);
        CHECK_EQ_INT((int)pv.step, (int)i);
        CHECKF(pv.metrics.loss < prev_loss, "loss %g after %g", pv.metrics.loss, prev_loss);
        prev_loss = pv.metrics.loss;
        CHECK(pv.metrics.grad_norm > 0 && pv.metrics.tokens_per_s > 0);
        CHECKF(strncmp(pv.checkpoint_uri, "http://127.0.0.1:", 17) == 0, "%s", pv.checkpoint_uri);
        char path[512], hex[65];
        snprintf(path, sizeof path, "%s/step-%d/model.safetensors", out, (int)pv.version);
        file_sha(path, hex);
        CHECKF(strcmp(hex, pv.sha256) == 0, "v%d: file %s, PolicyVersion %s", (int)pv.version, hex,
               pv.sha256);
        /* the same bytes over HTTP from the trainer */
        char url[700], *body = NULL;
        size_t blen = 0;
        snprintf(url, sizeof url, "%smodel.safetensors", pv.checkpoint_uri);
        int code = http_get(url, &body, &blen);
        CHECKF(code == 200, "GET %s: %d", url, code);
        if (body) {
            al_sha256_hex(body, blen, hex);
            CHECKF(strcmp(hex, pv.sha256) == 0, "served v%d differs", (int)pv.version);
            free(body);
        }
        if (i == n - 1) {
            char root[700];
            snprintf(root, sizeof root, "%s", pv.checkpoint_uri);
            char *cut = strstr(root, "/checkpoints/");
            if (cut) cut[strlen("/checkpoints/")] = '\0';
            CHECK_EQ_INT(http_get(root, &body, &blen), 200);
            CHECKF(body && strstr(body, "\"step-4\"") && strstr(body, "\"step-1\""), "%s", body ? body : "");
            free(body);
            snprintf(url, sizeof url, "%s../../etc/passwd", pv.checkpoint_uri);
            CHECK_EQ_INT(http_get(url, &body, &blen), 404);
            free(body);
            snprintf(url, sizeof url, "%sconfig.json", pv.checkpoint_uri);
            CHECK_EQ_INT(http_get(url, &body, &blen), 200);
            CHECK(body && strstr(body, "vocab_size"));
            free(body);
        }
        al_policy_version_clear(&pv);
    }
    CHECKF(prev_loss < 6.0, "final loss %g", prev_loss);
    free_msgs(m, n);
    /* a clean stop exits 0 */
    kill(pid, SIGTERM);
    int st = al_test_wait(pid, 60);
    CHECKF(WIFEXITED(st) && WEXITSTATUS(st) == 0, "trainer status %d", st);
    /* version 4 is a full checkpoint (every 2), version 3 weights only */
    char path[512];
    struct stat sb;
    snprintf(path, sizeof path, "%s/step-4/optimizer.safetensors", out);
    CHECK(stat(path, &sb) == 0);
    snprintf(path, sizeof path, "%s/step-3/optimizer.safetensors", out);
    CHECK(stat(path, &sb) != 0);
    /* the same --out without --resume is refused */
    const char *again[] = {"--input-topic", "sft.batches", "--out", out, NULL};
    st = run_train(broker.bootstrap, NULL, again);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 2);

    /* two dead letters, each with its reason */
    m = read_topic(broker.bootstrap, "arclight.deadletter", 2, 30, &n);
    CHECK_EQ_INT((int)n, 2);
    int undecodable = 0, vocab = 0;
    for (size_t i = 0; i < n; i++) {
        al_deadletter d = {0};
        char err[256];
        if (al_deadletter_decode(m[i].value, m[i].len, &d, err, sizeof err) != 0) {
            CHECKF(0, "dead letter: %s", err);
            continue;
        }
        CHECK_EQ_STR(d.source_topic, "sft.batches");
        CHECK_EQ_STR(d.stage, "train");
        if (strstr(d.reason, "not a BatchChunk")) undecodable++;
        if (strstr(d.reason, "outside the vocabulary")) vocab++;
        al_deadletter_clear(&d);
    }
    CHECK_EQ_INT(undecodable, 1);
    CHECK_EQ_INT(vocab, 1);
    free_msgs(m, n);
}

/* The same topic again (it holds the four steps of the test above) with full checkpoints
 * every 3 versions: /metrics counts what happened, SIGTERM checkpoints version 4 fully before
 * exiting, and --resume then starts from it and publishes version 4 again. */
TEST(metrics_and_checkpoint_on_sigterm)
{
    setup();
    REQUIRE(broker_ok);
    char out[256], maddr[64], url[128];
    snprintf(out, sizeof out, "%s/sft2", workdir);
    int port = al_test_free_port();
    REQUIRE(port > 0);
    snprintf(maddr, sizeof maddr, "127.0.0.1:%d", port);
    const char *args[] = {"--input-topic", "sft.batches", "--policy-topic", "sft2.policy", "--group",
                          "t1201-sft2", "--out", out, "--loss", "sft", "--lr", "0.01",
                          "--checkpoint-every", "3", "--metrics", maddr, NULL};
    pid_t pid = spawn_train(broker.bootstrap, NULL, args);
    size_t n = 0;
    msg *m = read_topic(broker.bootstrap, "sft2.policy", 4, 90, &n);
    CHECK_EQ_INT((int)n, 4);
    free_msgs(m, n);
    char *body = NULL;
    size_t blen = 0;
    snprintf(url, sizeof url, "http://%s/metrics", maddr);
    int code = http_get(url, &body, &blen);
    CHECKF(code == 200, "GET %s: %d", url, code);
    CHECKF(body && strstr(body, "arclight_train_steps_total 4"), "%s", body ? body : "");
    CHECKF(body && strstr(body, "arclight_train_chunks_total{result=\"dead_lettered\"} 2"), "%s",
           body ? body : "");
    CHECKF(body && strstr(body, "arclight_train_policy_version 4"), "%s", body ? body : "");
    free(body);
    kill(pid, SIGTERM);
    int st = al_test_wait(pid, 60);
    CHECKF(WIFEXITED(st) && WEXITSTATUS(st) == 0, "trainer status %d", st);
    char path[512];
    struct stat sb;
    snprintf(path, sizeof path, "%s/step-3/optimizer.safetensors", out);
    CHECK(stat(path, &sb) == 0);
    snprintf(path, sizeof path, "%s/step-4/optimizer.safetensors", out); /* written at SIGTERM */
    CHECK(stat(path, &sb) == 0);
    snprintf(path, sizeof path, "%s/step-2/model.safetensors", out); /* weights-only version */
    CHECK(stat(path, &sb) == 0);
    const char *resume[] = {"--input-topic", "sft.batches", "--policy-topic", "sft2.policy", "--group",
                            "t1201-sft2", "--out", out, "--resume", "--loss", "sft", "--steps", "4",
                            NULL};
    st = run_train(broker.bootstrap, NULL, resume);
    CHECKF(WIFEXITED(st) && WEXITSTATUS(st) == 0, "resumed trainer status %d", st);
    m = read_topic(broker.bootstrap, "sft2.policy", 5, 30, &n);
    CHECK_EQ_INT((int)n, 5);
    if (n == 5) {
        al_policy_version a = {0}, b = {0};
        char err[256];
        REQUIRE(al_policy_version_decode(m[3].value, m[3].len, &a, err, sizeof err) == 0);
        REQUIRE(al_policy_version_decode(m[4].value, m[4].len, &b, err, sizeof err) == 0);
        CHECK_EQ_INT((int)b.version, 4);
        CHECK_EQ_STR(a.sha256, b.sha256);
        CHECK_NEAR(a.metrics.loss, b.metrics.loss, 1e-6);
        al_policy_version_clear(&a);
        al_policy_version_clear(&b);
    }
    free_msgs(m, n);
}

/* Versions in a policy topic: counts per version 1..3 and the last one's sha. */
static void policy_versions(const char *topic, size_t want, int counts[4], char last_sha[65])
{
    size_t n = 0;
    msg *m = read_topic(broker.bootstrap, topic, want, 30, &n);
    memset(counts, 0, 4 * sizeof *counts);
    last_sha[0] = '\0';
    for (size_t i = 0; i < n; i++) {
        al_policy_version pv = {0};
        char err[256];
        if (al_policy_version_decode(m[i].value, m[i].len, &pv, err, sizeof err) != 0) continue;
        if (pv.version >= 1 && pv.version <= 3) counts[pv.version]++;
        else CHECKF(0, "%s: version %lld", topic, (long long)pv.version);
        if (i == n - 1) snprintf(last_sha, 65, "%s", pv.sha256);
        al_policy_version_clear(&pv);
    }
    free_msgs(m, n);
}

TEST(kill9_and_resume_match_an_uninterrupted_run)
{
#ifndef ARCLIGHT_FAULT_POINTS
    printf("  skipped: this build has no test fault points (ARCLIGHT_FAULT_POINTS)\n");
    return;
#endif
    setup();
    REQUIRE(broker_ok);
    rd_kafka_t *p = producer(broker.bootstrap);
    REQUIRE(p);
    for (int s = 0; s < 3; s++)
        for (int c = 0; c < 2; c++) {
            produce_chunk(p, "ka.batches", "tiny", s, c, 2, 10 + s, -1);
            produce_chunk(p, "kb.batches", "tiny", s, c, 2, 10 + s, -1);
        }
    rd_kafka_flush(p, 10000);
    rd_kafka_destroy(p);
    char outa[256], outb[256];
    snprintf(outa, sizeof outa, "%s/ka", workdir);
    snprintf(outb, sizeof outb, "%s/kb", workdir);
#define LOSS_FLAGS                                                                                 \
    "--loss", "ppo", "--kl-beta", "0.05", "--tis-cap", "2", "--eps-high", "0.28", "--dual-clip",  \
        "3", "--ppo-epochs", "2", "--mini-batches", "2", "--lr", "0.003", "--entropy-coef",       \
        "0.01", "--steps", "3"
    const char *a[] = {"--input-topic", "ka.batches", "--policy-topic", "ka.policy", "--group", "t1201-a",
                       "--out", outa, LOSS_FLAGS, NULL};
    int st = run_train(broker.bootstrap, NULL, a);
    CHECKF(WIFEXITED(st) && WEXITSTATUS(st) == 0, "uninterrupted run: status %d", st);

    const char *b[] = {"--input-topic", "kb.batches", "--policy-topic", "kb.policy", "--group", "t1201-b",
                       "--out", outb, "--resume", LOSS_FLAGS, NULL};
    /* killed once version 1's PolicyVersion is acknowledged (offsets not yet committed) */
    st = run_train(broker.bootstrap, "1:ack", b);
    CHECKF(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL, "first run: status %d", st);
    /* then killed once version 2 is on disk, before its PolicyVersion is sent */
    st = run_train(broker.bootstrap, "2:checkpoint", b);
    CHECKF(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL, "second run: status %d", st);
    int counts[4];
    char sha[65];
    policy_versions("kb.policy", 2, counts, sha);
    CHECKF(counts[1] >= 1 && counts[2] == 0 && counts[3] == 0, "after the kills: v1 x%d v2 x%d v3 x%d",
           counts[1], counts[2], counts[3]);
    st = run_train(broker.bootstrap, NULL, b);
    CHECKF(WIFEXITED(st) && WEXITSTATUS(st) == 0, "resumed run: status %d", st);

    int ca[4];
    char sha_a[65];
    policy_versions("ka.policy", 3, ca, sha_a);
    CHECK(ca[1] == 1 && ca[2] == 1 && ca[3] == 1);
    policy_versions("kb.policy", 4, counts, sha);
    /* every version published (1 and 2 again on resume), 3 last */
    CHECKF(counts[1] >= 1 && counts[2] >= 1 && counts[3] == 1, "v1 x%d v2 x%d v3 x%d", counts[1],
           counts[2], counts[3]);
    CHECKF(strcmp(sha, sha_a) == 0, "final weights differ: resumed %s, uninterrupted %s", sha, sha_a);
    char pa[512], pb[512], ha[65], hb[65];
    snprintf(pa, sizeof pa, "%s/step-3/model.safetensors", outa);
    snprintf(pb, sizeof pb, "%s/step-3/model.safetensors", outb);
    file_sha(pa, ha);
    file_sha(pb, hb);
    CHECK(ha[0] && strcmp(ha, hb) == 0 && strcmp(ha, sha_a) == 0);
    /* the trainer state records the step count */
    snprintf(pb, sizeof pb, "%s/step-3/trainer_state.json", outb);
    char err[256];
    size_t len;
    char *state = al_file_read(pb, &len, err, sizeof err);
    CHECKF(state && strstr(state, "\"batch_step\": 2"), "%s", state ? state : err);
    free(state);
}

TEST(teardown)
{
    if (broker_ok) al_test_broker_stop(&broker);
    if (workdir[0]) al_test_rmtree(workdir);
}
