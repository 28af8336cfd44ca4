/* 1202: the batch stage's real output trains: transitions (4 groups of 4 rollouts of the tiny
 * model) go through `arclight batch` (two steps, several micro-batches and chunks each) and
 * `arclight train` consumes them over TCP and publishes one PolicyVersion per step, with no
 * dead letters. */
#include "testlib.h"

#include "broker_fixture.h"
#include "support.h"

#include "avro/codec.h"
#include "core/util.h"

#include <librdkafka/rdkafka.h>
#include <sys/stat.h>

static char workdir[128], model_dir[256], topics_path[256];

static int run(const char *const *argv, double timeout_s)
{
    return al_test_wait(al_test_spawn(argv, NULL, 1), timeout_s);
}

static void encode_transition(al_buf *out, int g, int r)
{
    int32_t toks[40];
    uint8_t mask[40];
    float logp[40];
    int np = 6 + g, nr = 5 + (r * 3) % 7;
    for (int i = 0; i < np + nr; i++) toks[i] = (g * 37 + r * 11 + i * 5) % 500;
    for (int i = 0; i < nr; i++) mask[i] = 1, logp[i] = -1.0f - 0.1f * (float)i;
    char id[64], gid[32], rid[32], task[32];
    snprintf(rid, sizeof rid, "g%d-r%d", g, r);
    snprintf(id, sizeof id, "%s:0:0", rid);
    snprintf(gid, sizeof gid, "group-%d", g);
    snprintf(task, sizeof task, "task-%d", g);
    int32_t calls[1] = {0};
    al_transition t = {
        .id = id, .group_key = task, .group_id = gid, .group_size = 4, .task_id = task,
        .rollout_id = rid, .call_indices = calls, .n_call_indices = 1,
        .prompt_token_ids = toks, .n_prompt_tokens = (size_t)np,
        .response_token_ids = toks + np, .n_response_tokens = (size_t)nr, .loss_mask = mask,
        .n_loss_mask = (size_t)nr, .rollout_logprobs = logp, .n_rollout_logprobs = (size_t)nr,
        .reward = r % 2, .return_value = r % 2, .advantage = (r % 2) - 0.5, .estimator = "grpo",
        .policy_version = 0, .model = "tiny",
    };
    char err[256];
    if (al_transition_encode(&t, out, err, sizeof err) != 0) fprintf(stderr, "encode: %s\n", err);
}

TEST(batch_stage_output_trains)
{
    snprintf(workdir, sizeof workdir, "/tmp/arclight-t1202-%d", (int)getpid());
    snprintf(model_dir, sizeof model_dir, "%s/tiny", workdir);
    mkdir(workdir, 0755);
    char cmd[1024];
    const char *src = getenv("ARCLIGHT_SOURCE_DIR");
    snprintf(cmd, sizeof cmd, "%s model init --config %s/tests/model/tiny-qwen2.json --out %s --seed 2 >/dev/null",
             al_test_bin(), src ? src : ".", model_dir);
    REQUIRE(system(cmd) == 0);
    snprintf(topics_path, sizeof topics_path, "%s/topics.conf", workdir);
    FILE *f = fopen(topics_path, "w");
    REQUIRE(f);
    fputs("arclight.transitions 2 1\narclight.batches 2 1\narclight.policy 1 1\narclight.deadletter 1 1\n", f);
    fclose(f);
    al_test_broker b;
    const char *extra[] = {"--topics", topics_path, NULL};
    REQUIRE(al_test_broker_start(&b, extra) == 0);

    char err[512];
    rd_kafka_conf_t *c = rd_kafka_conf_new();
    rd_kafka_conf_set(c, "bootstrap.servers", b.bootstrap, err, sizeof err);
    rd_kafka_conf_set(c, "enable.idempotence", "true", err, sizeof err); /* keeps the order */
    rd_kafka_t *p = rd_kafka_new(RD_KAFKA_PRODUCER, c, err, sizeof err);
    REQUIRE(p);
    al_buf buf = {0};
    for (int g = 0; g < 4; g++)
        for (int r = 0; r < 4; r++) {
            encode_transition(&buf, g, r);
            char key[16];
            snprintf(key, sizeof key, "task-%d", g);
            rd_kafka_producev(p, RD_KAFKA_V_TOPIC("arclight.transitions"),
                              RD_KAFKA_V_KEY(key, strlen(key)), RD_KAFKA_V_VALUE(buf.data, buf.len),
                              RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_END);
        }
    al_buf_free(&buf);
    rd_kafka_flush(p, 10000);
    rd_kafka_destroy(p);

    const char *batch[] = {al_test_bin(), "batch", "--bootstrap", b.bootstrap, "--log-level", "warn",
                           "--step-sequences", "8", "--micro-batch-tokens", "32",
                           "--max-message-bytes", "4096", "--max-staleness", "-1",
                           "--group-idle-ms", "300", "--steps", "2", NULL};
    int st = run(batch, 90);
    CHECKF(WIFEXITED(st) && WEXITSTATUS(st) == 0, "batch: status %d", st);
    char out[256];
    snprintf(out, sizeof out, "%s/ckpt", workdir);
    const char *train[] = {al_test_bin(), "train", "--bootstrap", b.bootstrap, "--log-level", "warn",
                           "--model", model_dir, "--out", out, "--loss", "ppo", "--lr", "0.001",
                           "--mini-batches", "2", "--tis-cap", "2", "--steps", "2", NULL};
    st = run(train, 60);
    CHECKF(WIFEXITED(st) && WEXITSTATUS(st) == 0, "train: status %d", st);

    /* the policy topic: the two versions (the batch stage's follower reads it too) */
    c = rd_kafka_conf_new();
    rd_kafka_conf_set(c, "bootstrap.servers", b.bootstrap, err, sizeof err);
    rd_kafka_conf_set(c, "group.id", "t1202-reader", err, sizeof err);
    rd_kafka_conf_set(c, "enable.partition.eof", "true", err, sizeof err);
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_CONSUMER, c, err, sizeof err);
    REQUIRE(rk);
    rd_kafka_poll_set_consumer(rk);
    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(2);
    rd_kafka_topic_partition_list_add(l, "arclight.policy", 0)->offset = RD_KAFKA_OFFSET_BEGINNING;
    rd_kafka_topic_partition_list_add(l, "arclight.deadletter", 0)->offset = RD_KAFKA_OFFSET_BEGINNING;
    rd_kafka_assign(rk, l);
    rd_kafka_topic_partition_list_destroy(l);
    int eof = 0, versions = 0, deadletters = 0;
    double t0 = testlib_now();
    while (eof < 2 && testlib_now() - t0 < 30) {
        rd_kafka_message_t *m = rd_kafka_consumer_poll(rk, 200);
        if (!m) continue;
        if (m->err == RD_KAFKA_RESP_ERR__PARTITION_EOF) {
            eof++;
        } else if (!m->err && !strcmp(rd_kafka_topic_name(m->rkt), "arclight.deadletter")) {
            deadletters++;
        } else if (!m->err) {
            al_policy_version pv = {0};
            if (al_policy_version_decode(m->payload, m->len, &pv, err, sizeof err) == 0) {
                versions++;
                CHECK_EQ_STR(pv.model, "tiny");
                CHECK_EQ_INT((int)pv.version, versions);
                CHECK_EQ_INT((int)pv.step, versions - 1);
                CHECK(isfinite(pv.metrics.loss) && pv.metrics.grad_norm > 0);
                char path[512], hex[65];
                snprintf(path, sizeof path, "%s/step-%d/model.safetensors", out, versions);
                size_t len = 0;
                char *d = al_file_read(path, &len, err, sizeof err);
                CHECKF(d != NULL, "%s", err);
                if (d) {
                    al_sha256_hex(d, len, hex);
                    CHECK_EQ_STR(hex, pv.sha256);
                    free(d);
                }
                for (size_t i = 0; i < pv.metrics.n_extra; i++)
                    if (!strcmp(pv.metrics.extra[i].name, "sequences"))
                        CHECK_NEAR(pv.metrics.extra[i].value, 8, 0);
                al_policy_version_clear(&pv);
            } else {
                CHECKF(0, "PolicyVersion: %s", err);
            }
        }
        rd_kafka_message_destroy(m);
    }
    rd_kafka_consumer_close(rk);
    rd_kafka_destroy(rk);
    CHECK_EQ_INT(versions, 2);
    CHECK_EQ_INT(deadletters, 0);
    al_test_broker_stop(&b);
    if (al_test_rmtree(workdir) != 0) fprintf(stderr, "cannot remove %s\n", workdir);
}
