/*
 * 1251: `arclight sync --stage-dir DIR` with a trainer that publishes http:// URIs (its
 * checkpoint server, stages/train/ckpt_http.c, the one `arclight train --listen` runs): each
 * version's directory is copied whole into DIR/step-N, its weights checked against the
 * PolicyVersion's sha256, and the replica (arclight serve --weight-routes, SGLang's routes) is
 * told to load that copy; a version whose sha256 does not match is never staged nor applied.
 * The download is bounded: a version larger than --stage-max-bytes, or by default than its
 * config.json's weights allow, is refused with that reason and leaves nothing behind.
 */
#include "testlib.h"

#include "broker_fixture.h"
#include "t1199_serve_helpers.h"
#include "train/ckpt_http.h"
#include "sync/sync.h"

#include "avro/codec.h"
#include "core/sha256.h"
#include "core/util.h"

#include <dirent.h>
#include <librdkafka/rdkafka.h>
#include <math.h>

static const int32_t PROMPT[] = {11, 22, 33, 44};

static void publish(rd_kafka_t *p, int64_t v, const char *uri, const char *sha)
{
    char err[256];
    al_policy_version pv = {.model = "tiny", .version = v, .step = v, .checkpoint_uri = uri,
                            .sha256 = sha, .created_us = al_now_us()};
    al_buf b = {0};
    REQUIRE(al_policy_version_encode(&pv, &b, err, sizeof err) == 0);
    rd_kafka_producev(p, RD_KAFKA_V_TOPIC("arclight.policy"), RD_KAFKA_V_PARTITION(0),
                      RD_KAFKA_V_KEY("tiny", 4), RD_KAFKA_V_VALUE(b.data, b.len),
                      RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_END);
    rd_kafka_flush(p, 10000);
    al_buf_free(&b);
}

static long long reported(const sv_server *s)
{
    json_t *j = sv_get_json(s->url, "/get_weight_version");
    const char *v = j ? json_string_value(json_object_get(j, "weight_version")) : NULL;
    long long n = v ? atoll(v) : -1;
    json_decref(j);
    return n;
}

static int wait_reported(const sv_server *s, long long want, double secs)
{
    double t0 = testlib_now();
    while (testlib_now() - t0 < secs) {
        if (reported(s) == want) return 0;
        usleep(100000);
    }
    return -1;
}

/* The replica's logprobs after PROMPT are those of the model in dir. */
static void check_served(const sv_server *s, const char *dir)
{
    long code = 0;
    json_t *j = NULL;
    for (int tries = 0; tries < 50; tries++) {
        json_decref(j);
        j = sv_post_json(s->url, "/v1/completions",
                         "{\"prompt\":[11,22,33,44],\"max_tokens\":6,\"logprobs\":0,"
                         "\"return_token_ids\":true,\"ignore_eos\":true,\"seed\":5}",
                         &code);
        if (code != 503) break;
        usleep(100000);
    }
    REQUIREF(j && code == 200, "completion: %ld", code);
    json_t *c0 = json_array_get(json_object_get(j, "choices"), 0);
    int32_t *gen = NULL;
    int ng = sv_ids(json_object_get(c0, "token_ids"), &gen);
    json_t *lps = json_object_get(json_object_get(c0, "logprobs"), "token_logprobs");
    float want[6];
    CHECK(ng == 6 && sv_trainer_logprobs(dir, PROMPT, 4, gen, ng, want) == 0);
    double d = 0;
    for (int i = 0; i < ng && i < 6; i++)
        d = fmax(d, fabs(json_real_value(json_array_get(lps, (size_t)i)) - want[i]));
    CHECKF(d < 1e-4, "served logprobs %g away from %s", d, dir);
    free(gen);
    json_decref(j);
}

TEST(http_versions_are_staged_whole_and_checked)
{
    char *dir = sv_tmpdir("t1251");
    REQUIRE(dir);
    REQUIRE(sv_make_model(dir, "tiny", 1) == 0);
    REQUIRE(sv_make_model(dir, "out/step-1", 21) == 0);
    REQUIRE(sv_make_model(dir, "out/step-2", 22) == 0);
    REQUIRE(sv_make_model(dir, "out/step-3", 23) == 0);
    REQUIRE(sv_sh("mkdir -p %s/stage", dir) == 0);
    char err[512], root[300], topics[300];
    snprintf(root, sizeof root, "%s/out", dir);
    al_ckpt_http *ck = al_ckpt_http_start("127.0.0.1:0", root, err, sizeof err);
    REQUIREF(ck, "%s", err);
    snprintf(topics, sizeof topics, "%s/topics.conf", dir);
    FILE *f = fopen(topics, "w");
    REQUIRE(f);
    fputs("arclight.policy 1 1\narclight.sync 1 1\n", f);
    fclose(f);
    al_test_broker broker;
    const char *extra[] = {"--topics", topics, NULL};
    REQUIRE(al_test_broker_start(&broker, extra) == 0);
    char base[300], stage[300], rep[300];
    snprintf(base, sizeof base, "%s/tiny", dir);
    snprintf(stage, sizeof stage, "%s/stage", dir);
    sv_server s;
    const char *sargs[] = {"--model", base, "--weight-routes", NULL};
    REQUIRE(sv_start(&s, sargs) == 0);
    snprintf(rep, sizeof rep, "arclight=%s", s.url);
    const char *argv[] = {al_test_bin(), "sync", "--bootstrap", broker.bootstrap, "--model-name",
                          "tiny", "--replica", rep, "--stage-dir", stage, "--retry-min-ms", "100",
                          "--retry-max-ms", "400", NULL};
    pid_t sync = al_test_spawn(argv, NULL, 1);
    REQUIRE(sync > 0);
    char conf[256];
    rd_kafka_conf_t *c = rd_kafka_conf_new();
    rd_kafka_conf_set(c, "bootstrap.servers", broker.bootstrap, conf, sizeof conf);
    rd_kafka_t *p = rd_kafka_new(RD_KAFKA_PRODUCER, c, conf, sizeof conf);
    REQUIRE(p);

    char uri[300], file[600], sha[65], d1[400], d3[400];
    for (int v = 1; v <= 3; v++) {
        snprintf(uri, sizeof uri, "http://127.0.0.1:%d/checkpoints/step-%d/", al_ckpt_http_port(ck), v);
        snprintf(file, sizeof file, "%s/step-%d/model.safetensors", root, v);
        REQUIRE(al_sha256_file(file, sha, err, sizeof err) == 0);
        if (v == 2) sha[0] = sha[0] == 'a' ? 'b' : 'a'; /* not the file's */
        publish(p, v, uri, sha);
        if (v == 1) {
            CHECK(wait_reported(&s, 1, 30) == 0);
            snprintf(d1, sizeof d1, "%s/step-1", stage);
            check_served(&s, d1);
            snprintf(file, sizeof file, "%s/tokenizer.json", d1);
            CHECKF(access(file, R_OK) == 0, "%s was not staged", file);
        }
        if (v == 2) {
            usleep(1500000);
            CHECK(reported(&s) == 1);
            snprintf(file, sizeof file, "%s/step-2", stage);
            CHECKF(access(file, F_OK) != 0, "%s was staged with a wrong sha256", file);
        }
    }
    CHECK(wait_reported(&s, 3, 30) == 0);
    snprintf(d3, sizeof d3, "%s/step-3", stage);
    check_served(&s, d3);

    kill(sync, SIGTERM);
    int st = al_test_wait(sync, 30);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    rd_kafka_destroy(p);
    sv_stop(&s);
    al_test_broker_stop(&broker);
    al_ckpt_http_stop(ck);
    al_test_rmtree(dir);
    free(dir);
}

/* Whether root holds an entry whose name starts with prefix. */
static int has_entry(const char *root, const char *prefix)
{
    DIR *d = opendir(root);
    if (!d) return 0;
    struct dirent *e;
    int found = 0;
    while ((e = readdir(d)) != NULL)
        if (!strncmp(e->d_name, prefix, strlen(prefix))) found = 1;
    closedir(d);
    return found;
}

TEST(an_oversized_version_is_refused)
{
    char *dir = sv_tmpdir("t1251b");
    REQUIRE(dir);
    REQUIRE(sv_make_model(dir, "out/step-1", 21) == 0);
    REQUIRE(sv_make_model(dir, "out/step-2", 22) == 0);
    /* step-2's weights file grows to 2 GiB (sparse): far past what its config.json allows */
    REQUIRE(sv_sh("truncate -s 2G %s/out/step-2/model.safetensors && mkdir -p %s/stage", dir,
                  dir) == 0);
    char err[1024], root[300], stage[300], uri[300], got[600], sha[65];
    snprintf(root, sizeof root, "%s/out", dir);
    snprintf(stage, sizeof stage, "%s/stage", dir);
    al_ckpt_http *ck = al_ckpt_http_start("127.0.0.1:0", root, err, sizeof err);
    REQUIREF(ck, "%s", err);
    int port = al_ckpt_http_port(ck);

    /* the default bound: from config.json */
    snprintf(uri, sizeof uri, "http://127.0.0.1:%d/checkpoints/step-2/", port);
    double t0 = testlib_now();
    int rc = sync_stage_fetch(uri, "00", stage, 2, 3, 0, 30, got, sizeof got, err, sizeof err);
    printf("  2 GiB weights: %s (%.2f s)\n", rc ? err : "staged", testlib_now() - t0);
    CHECK(rc == -1 && strstr(err, "larger than the") && strstr(err, "--stage-max-bytes") &&
          strstr(err, "model.safetensors"));
    CHECK(!has_entry(stage, "step-2") && !has_entry(stage, ".step-2"));

    /* an explicit bound below a normal version's size */
    snprintf(uri, sizeof uri, "http://127.0.0.1:%d/checkpoints/step-1/", port);
    char file[600];
    snprintf(file, sizeof file, "%s/step-1/model.safetensors", root);
    REQUIRE(al_sha256_file(file, sha, err, sizeof err) == 0);
    rc = sync_stage_fetch(uri, sha, stage, 1, 3, 10000, 30, got, sizeof got, err, sizeof err);
    printf("  a 10000-byte bound: %s\n", rc ? err : "staged");
    CHECK(rc == -1 && strstr(err, "10000 bytes"));
    CHECK(!has_entry(stage, "step-1") && !has_entry(stage, ".step-1"));
    /* and the same version within the default bound */
    CHECK(sync_stage_fetch(uri, sha, stage, 1, 3, 0, 30, got, sizeof got, err, sizeof err) == 0);
    CHECK(has_entry(stage, "step-1"));

    al_ckpt_http_stop(ck);
    al_test_rmtree(dir);
    free(dir);
}
