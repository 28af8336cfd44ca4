/*
 * 1203: `arclight train` as a data-parallel group of CPU replicas over gloo (issue 24), on
 * the embedded broker. Each case reads its own batches topic of three steps (four chunks of
 * two micro-batches each, t1249's fixtures):
 *
 *   - 2 and 3 replicas (separate processes) train the same steps as one process: exactly one
 *     PolicyVersion per step, from rank 0 alone, and version 3's weights equal to one
 *     process's within float tolerance (only the order of the gradient sums differs); the
 *     replicas compared their weights after every step (steps.c) and agreed.
 *   - replicas that disagree (a fault point changes rank 1's weights after version 2) stop
 *     the group on that version: version 2 is never published.
 *   - a non-zero rank killed with SIGKILL mid-run: rank 0 notices, stops after its last
 *     complete step; the group started again with --resume finishes with the same weights
 *     as the uninterrupted group, every version published, none skipped.
 *
 *   - rank 0 killed with SIGKILL after writing version 2, before publishing it: rank 1
 *     stops; the group resumed publishes version 2 and 3 once each and ends bitwise where
 *     the uninterrupted group did.
 *
 * Skipped (77) in a build without gloo.
 */
#define TESTLIB_NO_MAIN
#include "testlib.h"
#include "support.h"

#include "broker_fixture.h"
#include "t1249_train_fixtures.h"

#include "avro/codec.h"
#include "model/model.h"
#include "model/safetensors.h"

#include <librdkafka/rdkafka.h>
#include <math.h>
#include <signal.h>
#include <sys/wait.h>

static al_test_broker broker;
static char dir[128], model_dir[256];

TEST(setup)
{
    REQUIRE(al_test_tmpdir(dir, sizeof dir, "t1203"));
    snprintf(model_dir, sizeof model_dir, "%s/tiny", dir);
    char cmd[1024], topics[256];
    snprintf(cmd, sizeof cmd,
             "'%s' model init --config tests/model/tiny-qwen2.json --out '%s' --seed 1 >/dev/null",
             al_test_bin(), model_dir);
    REQUIRE(system(cmd) == 0);
    snprintf(topics, sizeof topics, "%s/topics.conf", dir);
    FILE *f = fopen(topics, "w");
    REQUIRE(f);
    fputs("arclight.deadletter 1 1\n", f);
    for (const char *t = "abcdef"; *t; t++) fprintf(f, "r%c.batches 1 1\nr%c.policy 1 1\n", *t, *t);
    fclose(f);
    const char *extra[] = {"--topics", topics, NULL};
    REQUIRE(al_test_broker_start(&broker, extra) == 0);
}

/* Steps [from, to) of the fixture (4 chunks each) to topic. */
static void produce_steps(const char *topic, int from, int to)
{
    char err[512];
    rd_kafka_conf_t *c = rd_kafka_conf_new();
    rd_kafka_conf_set(c, "bootstrap.servers", broker.bootstrap, err, sizeof err);
    rd_kafka_conf_set(c, "linger.ms", "1", err, sizeof err);
    rd_kafka_t *p = rd_kafka_new(RD_KAFKA_PRODUCER, c, err, sizeof err);
    REQUIRE(p);
    for (int s = from; s < to; s++)
        for (int i = 0; i < 4; i++) {
            al_buf b = {0};
            REQUIRE(fx_encode_chunk(&b, "tiny", s, i, 4, 2, 20 + s, -1, 0) == 0);
            CHECK(rd_kafka_producev(p, RD_KAFKA_V_TOPIC(topic), RD_KAFKA_V_PARTITION(0),
                                    RD_KAFKA_V_KEY("tiny", 4), RD_KAFKA_V_VALUE(b.data, b.len),
                                    RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_END) == 0);
            al_buf_free(&b);
        }
    CHECK(rd_kafka_flush(p, 10000) == 0);
    rd_kafka_destroy(p);
}

/* Rank `rank` of `world` (world 1: alone) of `arclight train` on rX.batches -> rX.policy,
 * versions under DIR/rX, its stderr in DIR/rX-RANK.log (appended). extra_env may be NULL. */
static pid_t replica(char x, int rank, int world, int port, int resume, const char *extra_env)
{
    char in[32], pol[32], group[32], out[256], log[256];
    snprintf(in, sizeof in, "r%c.batches", x), snprintf(pol, sizeof pol, "r%c.policy", x);
    snprintf(group, sizeof group, "t1203-%c", x);
    snprintf(out, sizeof out, "%s/r%c", dir, x);
    snprintf(log, sizeof log, "%s/r%c-%d.log", dir, x, rank);
    const char *argv[] = {al_test_bin(), "train", "--bootstrap", broker.bootstrap, "--model",
                          model_dir, "--input-topic", in, "--policy-topic", pol, "--group", group,
                          "--out", out, "--mini-batches", "2", "--lr", "0.003", "--steps", "3",
                          "--log-level", "info", resume ? "--resume" : NULL, NULL};
    char ws[48], rs[48], as[64];
    snprintf(ws, sizeof ws, "ARCLIGHT_DIST_WORLD=%d", world);
    snprintf(rs, sizeof rs, "ARCLIGHT_DIST_RANK=%d", rank);
    snprintf(as, sizeof as, "ARCLIGHT_DIST_ADDR=127.0.0.1:%d", port);
    const char *env[] = {ws, rs, as, extra_env, NULL};
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        if (!freopen(log, "a", stderr)) _exit(127);
        pid_t c = al_test_spawn(argv, env, 1);
        int st = al_test_wait(c, 120);
        _exit(WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0));
    }
    return pid;
}

/* Starts `world` replicas on rX and waits for all: the number that exited 0. */
static int run_group(char x, int world, int resume, const char *extra_env, int status[])
{
    int port = al_test_free_port(), ok = 0;
    pid_t pid[4];
    for (int r = 0; r < world; r++) pid[r] = replica(x, r, world, port, resume, extra_env);
    for (int r = 0; r < world; r++) {
        int st = al_test_wait(pid[r], 150);
        status[r] = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
        ok += status[r] == 0;
    }
    return ok;
}

/* PolicyVersions of rX.policy: how many of each version 1..3 (others counted in [0]). */
static void versions(char x, int want, int counts[4])
{
    char topic[32], err[256];
    snprintf(topic, sizeof topic, "r%c.policy", x);
    al_test_msgs m;
    al_test_topic_read(broker.bootstrap, topic, NULL, (size_t)want, 8000, &m);
    memset(counts, 0, 4 * sizeof *counts);
    for (size_t i = 0; i < m.n; i++) {
        al_policy_version pv = {0};
        if (al_policy_version_decode((const uint8_t *)m.val[i], m.len[i], &pv, err, sizeof err))
            continue;
        counts[pv.version >= 1 && pv.version <= 3 ? pv.version : 0]++;
        al_policy_version_clear(&pv);
    }
    al_test_msgs_free(&m);
}

/* rel L2 distance of rX's version-3 weights from rY's; -1 when either cannot be read. */
static double weights_rel_l2(char x, char y)
{
    char a[256], b[256], err[256];
    snprintf(a, sizeof a, "%s/r%c/step-3", dir, x);
    snprintf(b, sizeof b, "%s/r%c/step-3", dir, y);
    al_model *ma = al_model_load_dir(a, err, sizeof err), *mb = al_model_load_dir(b, err, sizeof err);
    double e = -1;
    if (ma && mb && al_model_num_params(ma) == al_model_num_params(mb)) {
        const float *pa = al_model_params(ma), *pb = al_model_params(mb);
        double num = 0, den = 0;
        for (size_t i = 0; i < al_model_num_params(ma); i++) {
            double d = (double)pa[i] - pb[i];
            num += d * d, den += (double)pb[i] * pb[i];
        }
        e = sqrt(num) / (sqrt(den) + 1e-30);
    } else {
        fprintf(stderr, "  cannot load %s or %s: %s\n", a, b, err);
    }
    al_model_free(ma);
    al_model_free(mb);
    return e;
}

static int log_has(char x, int rank, const char *text)
{
    char path[256];
    snprintf(path, sizeof path, "%s/r%c-%d.log", dir, x, rank);
    char *t = al_test_slurp(path, NULL);
    int has = t && strstr(t, text);
    free(t);
    return has;
}

TEST(two_and_three_replicas_train_as_one_process)
{
    REQUIRE(broker.bootstrap[0]);
    int st[4], c[4];
    for (const char *x = "abc"; *x; x++) {
        char topic[32];
        snprintf(topic, sizeof topic, "r%c.batches", *x);
        produce_steps(topic, 0, 3);
    }
    CHECK_EQ_INT(run_group('a', 1, 0, NULL, st), 1);
    CHECKF(run_group('b', 2, 0, NULL, st) == 2, "2 replicas: exits %d %d", st[0], st[1]);
    CHECKF(run_group('c', 3, 0, NULL, st) == 3, "3 replicas: exits %d %d %d", st[0], st[1], st[2]);
    for (const char *x = "abc"; *x; x++) {
        versions(*x, 3, c);
        CHECKF(c[1] == 1 && c[2] == 1 && c[3] == 1 && c[0] == 0,
               "r%c: v1 x%d, v2 x%d, v3 x%d, others %d", *x, c[1], c[2], c[3], c[0]);
    }
    double e2 = weights_rel_l2('b', 'a'), e3 = weights_rel_l2('c', 'a');
    printf("  version 3's weights against one process: 2 replicas rel L2 %.3g, 3 replicas %.3g\n",
           e2, e3);
    CHECKF(e2 >= 0 && e2 <= 1e-5, "2 replicas: rel L2 %.3g", e2);
    CHECKF(e3 >= 0 && e3 <= 1e-5, "3 replicas: rel L2 %.3g", e3);
    for (int r = 1; r < 3; r++) {
        CHECKF(log_has('c', r, "v3 (batch step 2, rank"), "rank %d did not train version 3", r);
        CHECK(!log_has('c', r, "disagree"));
    }
}

TEST(replicas_that_disagree_stop_before_publishing)
{
    REQUIRE(broker.bootstrap[0]);
#ifndef ARCLIGHT_FAULT_POINTS
    printf("  skipped: this build has no test fault points (ARCLIGHT_FAULT_POINTS)\n");
    return;
#endif
    int st[2], c[4];
    produce_steps("rd.batches", 0, 3);
    CHECK_EQ_INT(run_group('d', 2, 0, "ARCLIGHT_TRAIN_TEST_DIVERGE_AT=1:2", st), 0);
    versions('d', 1, c);
    CHECKF(c[1] == 1 && c[2] == 0 && c[3] == 0, "v1 x%d, v2 x%d, v3 x%d", c[1], c[2], c[3]);
    CHECK(log_has('d', 0, "the replicas disagree on the weights after version 2"));
}

TEST(a_killed_replica_costs_no_step)
{
    REQUIRE(broker.bootstrap[0]);
    int st[2], c[4];
    produce_steps("re.batches", 0, 1);
    int port = al_test_free_port();
    pid_t r0 = replica('e', 0, 2, port, 0, NULL), r1 = replica('e', 1, 2, port, 0, NULL);
    versions('e', 1, c);
    REQUIREF(c[1] == 1, "version 1 was not published (v1 x%d)", c[1]);
    usleep(300000);
    kill(r1, SIGKILL); /* the wrapper; its trainer dies with it (PR_SET_PDEATHSIG) */
    waitpid(r1, NULL, 0);
    double t0 = testlib_now();
    int s0 = al_test_wait(r0, 30);
    printf("  rank 0 stopped %.2f s after rank 1's SIGKILL (status %d)\n", testlib_now() - t0, s0);
    CHECKF(s0 >= 0 && testlib_now() - t0 < 10, "rank 0 did not stop (status %d)", s0);
    CHECK(log_has('e', 0, "left the group"));
    produce_steps("re.batches", 1, 3);
    CHECKF(run_group('e', 2, 1, NULL, st) == 2, "after the restart: exits %d %d", st[0], st[1]);
    versions('e', 4, c); /* v1 again: the resume publishes its checkpoint's version */
    CHECKF(c[1] >= 1 && c[2] == 1 && c[3] == 1, "v1 x%d, v2 x%d, v3 x%d", c[1], c[2], c[3]);
    double e = weights_rel_l2('e', 'b');
    printf("  after the kill and restart, version 3 against the uninterrupted 2 replicas: rel L2 "
           "%.3g\n", e);
    CHECKF(e == 0, "rel L2 %.3g", e); /* the same group, the same sums: bitwise */
}

/* Rank 0 killed with SIGKILL once version 2 is on disk, before its PolicyVersion is sent:
 * rank 1 stops on its own; the group started again goes on from version 2's checkpoint and
 * ends bitwise where the uninterrupted group did, version 3 published once. */
TEST(a_killed_rank_0_costs_no_step)
{
    REQUIRE(broker.bootstrap[0]);
#ifndef ARCLIGHT_FAULT_POINTS
    printf("  skipped: this build has no test fault points (ARCLIGHT_FAULT_POINTS)\n");
    return;
#endif
    int st[2], c[4];
    produce_steps("rf.batches", 0, 3);
    run_group('f', 2, 1, "ARCLIGHT_TRAIN_TEST_KILL_AT=2:checkpoint", st);
    /* rank 1 stops after its last step (its link closed: exit 0), or, inside step 3's
     * all-reduce when rank 0 died, exits at once (1): nothing of it is kept either way */
    CHECKF(st[0] == 128 + SIGKILL && (st[1] == 0 || st[1] == 1), "rank 0 ended %d (want %d), "
           "rank 1 %d", st[0], 128 + SIGKILL, st[1]);
    CHECK(log_has('f', 1, "the group is broken"));
    versions('f', 1, c);
    CHECKF(c[1] == 1 && c[2] == 0 && c[3] == 0, "after the kill: v1 x%d, v2 x%d, v3 x%d", c[1],
           c[2], c[3]);
    CHECKF(run_group('f', 2, 1, NULL, st) == 2, "after the restart: exits %d %d", st[0], st[1]);
    versions('f', 3, c);
    CHECKF(c[1] == 1 && c[2] == 1 && c[3] == 1, "v1 x%d, v2 x%d, v3 x%d", c[1], c[2], c[3]);
    double e = weights_rel_l2('f', 'b');
    printf("  rank 0 killed and the group restarted: version 3 against the uninterrupted group: "
           "rel L2 %.3g\n", e);
    CHECKF(e == 0, "rel L2 %.3g", e);
}

TEST(zz_teardown)
{
    CHECK_EQ_INT(al_test_broker_stop(&broker), 0);
    al_test_rmtree(dir);
}

int main(int argc, char **argv)
{
#ifndef ARCLIGHT_HAVE_GLOO
    setvbuf(stdout, NULL, _IOLBF, 0);
    printf("skipped: this build has no gloo (libgloo-dev), so no CPU data parallelism\n");
    printf("0 passed, 0 failed, %d skipped\n", testlib_ntests);
    return 77;
#endif
    return testlib_run(argc, argv);
}
