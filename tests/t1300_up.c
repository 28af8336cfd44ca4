/*
 * t1300: `arclight up --steps 2` runs the whole loop with the demo agent against a broker
 * the test owns (--bootstrap: the embedded broker, and as t1300_up_kafka real Kafka), so that after up has exited the test can read what flowed:
 * spans, transitions, batches and two PolicyVersions on their topics, checkpoints on disk,
 * serve swapping in the new policy, the agent's per-version rewards, exit 0, and no child
 * of up left running.
 */
#include "t1349_up_common.h"
#include "testlib.h"
#include "support.h"

static char workdir[256];

/* Runs `arclight tail TOPIC --from-beginning` on the broker; returns its stdout. */
static char *tail_topic(const char *bootstrap, const char *topic)
{
    char out[512], err[512];
    snprintf(out, sizeof out, "%s/tail-%s.out", workdir, topic);
    snprintf(err, sizeof err, "%s/tail-%s.err", workdir, topic);
    char *argv[] = {(char *)up_bin(),   "tail", (char *)topic, "--bootstrap", (char *)bootstrap,
                    "--from-beginning", NULL};
    pid_t p = up_start(argv, out, err);
    int st = up_wait(p, 60);
    CHECKF(st == 0, "tail %s: status %d", topic, st);
    return al_test_slurp_text(out);
}

TEST(up_steps_2_end_to_end)
{
    REQUIRE(al_test_tmpdir(workdir, sizeof workdir, "t1300"));
    char out[512], err[512], wd[512], ckpt[600];
    snprintf(out, sizeof out, "%s/up.out", workdir);
    snprintf(err, sizeof err, "%s/up.err", workdir);
    snprintf(wd, sizeof wd, "%s/work", workdir);

    /* the embedded broker, or real Kafka with ARCLIGHT_TEST_BROKER=kafka (broker_fixture.h) */
    al_test_broker broker;
    REQUIRE(al_test_broker_start(&broker, NULL) == 0);
    char bootstrap[512];
    snprintf(bootstrap, sizeof bootstrap, "%s", broker.bootstrap);

    double t0 = testlib_now();
    /* clang-format off */
    char *argv[] = {(char *)up_bin(), "up", "--workdir", wd, "--bootstrap", bootstrap,
                    "--listen-serve", "127.0.0.1:0", "--listen-proxy", "127.0.0.1:0",
                    "--steps", "2", "--group-size", "4", "--step-groups", "2",
                    "--max-tokens", "8", "--stop-timeout", "15",
                    "--credit-args", "--estimator rloo --group-timeout 600",
                    "--agent", "node examples/demo-agent/agent.js", NULL};
    /* clang-format on */
    pid_t up = up_start(argv, out, err);
    int st = up_wait(up, 150);
    char *o = al_test_slurp_text(out), *e = al_test_slurp_text(err);
    CHECKF(st == 0, "up ended with wait status %d after %.1f s\n--- stdout\n%s\n--- stderr\n%s", st,
           testlib_now() - t0, o, e);
    fprintf(stderr, "up --steps 2 took %.1f s\n", testlib_now() - t0);

    /* What a user sees: where everything is, the versions, the agent's rewards. */
    CHECK(strstr(o, "up    | broker     ") && strstr(o, "up    | proxy      http://127.0.0.1:"));
    CHECKF(strstr(e, "up: policy version 2 published: done"), "%s", e);
    CHECKF(strstr(e, "train | ") && strstr(e, " v2 (batch step"), "no train line for v2:\n%s", e);
    CHECKF(strstr(e, "serve | ") && strstr(e, "now serving policy version 1"),
           "serve did not swap in version 1:\n%s", e);
    /* A round that saw a swap names both versions ("policy v0,v1: ..."). */
    CHECKF(strstr(o, "agent | demo-agent: policy v0:") || strstr(o, "agent | demo-agent: policy v0,"),
           "%s", o);
    CHECK(strstr(e, "all stopped; exit 0"));
    CHECKF(strstr(e, "(estimator rloo)"), "--credit-args did not reach credit:\n%s", e);

    /* No child left: every pid up started is gone. */
    const char *names[] = {"serve", "proxy", "credit", "batch", "train", "agent"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        pid_t p = up_child_pid(e, names[i]);
        CHECKF(p > 0, "no pid reported for %s", names[i]);
        CHECKF(up_pid_gone(p), "%s (pid %d) still runs after up exited", names[i], (int)p);
    }
    CHECK(up_child_pid(e, "broker") == 0); /* --bootstrap: no embedded broker */

    snprintf(ckpt, sizeof ckpt, "%s/ckpt/step-2/model.safetensors", wd);
    CHECKF(access(ckpt, F_OK) == 0, "%s missing", ckpt);

    /* What flowed through the topics. */
    char *spans = tail_topic(bootstrap, "arclight.spans");
    char *trans = tail_topic(bootstrap, "arclight.transitions");
    char *batches = tail_topic(bootstrap, "arclight.batches");
    char *policy = tail_topic(bootstrap, "arclight.policy");
    int nspans = up_count_lines(spans, "\"topic\":\"arclight.spans\"");
    int ntrans = up_count_lines(trans, "\"topic\":\"arclight.transitions\"");
    int nbatch = up_count_lines(batches, "\"topic\":\"arclight.batches\"");
    /* Two rounds of 2 tasks x 4 rollouts at least, each a call, a reward and an end. */
    CHECKF(nspans >= 2 * 8 * 3, "%d spans", nspans);
    CHECKF(up_count_lines(spans, "\"_type\":\"Reward\"") >= 16, "rewards missing:\n%.3000s", spans);
    CHECKF(up_count_lines(spans, "\"_type\":\"RolloutEnd\"") >= 16, "ends missing:\n%.3000s",
           spans);
    CHECKF(ntrans >= 10, "%d transitions", ntrans); /* steps close at 5 sequences */
    CHECKF(nbatch >= 2, "%d batch chunks", nbatch);
    CHECKF(up_count_lines(policy, "\"version\":1,") == 1 &&
               up_count_lines(policy, "\"version\":2,") == 1,
           "policy versions:\n%s", policy);
    CHECKF(up_count_lines(policy, "\"checkpoint_uri\":\"file://") == 2, "%s", policy);
    fprintf(stderr, "flowed: %d spans, %d transitions, %d batch chunks\n", nspans, ntrans, nbatch);
    free(spans), free(trans), free(batches), free(policy);
    free(o), free(e);

    /* Again on the same work directory and cluster: train resumes at version 2, serve starts
     * from that checkpoint, and the run goes on to version 3. */
    argv[11] = "3";
    REQUIRE(!strcmp(argv[10], "--steps"));
    up = up_start(argv, out, err);
    st = up_wait(up, 150);
    o = al_test_slurp_text(out), e = al_test_slurp_text(err);
    CHECKF(st == 0, "second up: wait status %d\n--- stdout\n%s\n--- stderr\n%s", st, o, e);
    /* its first round on v2, or already on v3: the first run's transitions left on the topic
     * beyond its last step can make step 3 as soon as train resumes, before a round ends */
    CHECKF(strstr(o, "agent | demo-agent: policy v2:") || strstr(o, "agent | demo-agent: policy v2,") ||
               strstr(o, "agent | demo-agent: policy v3:"),
           "%s", o);
    CHECKF(!strstr(o, "demo-agent: policy v0") && !strstr(o, "demo-agent: policy v1"),
           "the second run served an older version than 2:\n%s", o);
    snprintf(ckpt, sizeof ckpt, "%s/ckpt/step-3/model.safetensors", wd);
    CHECKF(access(ckpt, F_OK) == 0, "%s missing", ckpt);
    policy = tail_topic(bootstrap, "arclight.policy");
    CHECKF(up_count_lines(policy, "\"version\":3,") == 1, "policy versions:\n%s", policy);
    free(policy), free(o), free(e);

    CHECK_EQ_INT(al_test_broker_stop(&broker), 0);
    if (!testlib_cur_failed && al_test_rmtree(workdir) != 0)
        fprintf(stderr, "could not remove %s\n", workdir);
}
