/* t0805: each sentence of the README's "How credit's numbers are computed" about groups and
 * options, checked with values worked out from the sentence: group_size when rollouts are
 * dropped, --on-failed keep, --on-timeout keep, --drop-equal-groups, --reward last|sum and
 * --reward-name; and the command line's refusal of --reward with --reward-name. */
#include "testlib.h"

#include "credit.h"
#include "t0849_credit_helpers.h"

#include <sys/wait.h>
#include <unistd.h>

static al_credit_config config(al_credit_estimator e, int32_t gsize)
{
    al_credit_config c;
    al_credit_config_init(&c);
    c.estimator = e;
    c.group_size = gsize;
    return c;
}

/* One call at sequence 0, an optional reward after it, an end of status st. */
static void one_call(al_credit_part *p, const char *task, const char *rid, double reward,
                     al_rollout_status st, int32_t declared, int64_t ts)
{
    feed(p, mk_simple(task, rid, 0, ts));
    int64_t seq = 1; /* numbered like the proxy: every span of the rollout counts */
    if (!isnan(reward)) feed(p, mk_reward(task, rid, seq++, ts, "final", reward, 0));
    feed(p, mk_end(task, rid, seq, ts, st, declared));
}

/* "The group's members are its kept rollouts that have a call, ... every transition's
 * group_size is their number, not the size the end spans declared". The end spans declare
 * 4: a (reward 1) and b (0) train; c failed and is dropped; d succeeded with reward 5 but
 * its only call was dead-lettered (no token ids), so it has no call. group_size is 2 and
 * the statistics are over {1, 0}: grpo gives -+0.5 / (0.5 + 1e-6); d's 5 plays no part. */
TEST(group_size_counts_the_rollouts_that_train)
{
    al_credit_config c = config(AL_CREDIT_ESTIMATOR_GRPO, 8);
    sink_t s;
    al_credit_part *p = mk_part(&c, &s);
    one_call(p, "T", "a", 1, AL_ROLLOUT_STATUS_SUCCEEDED, 4, 1);
    one_call(p, "T", "b", 0, AL_ROLLOUT_STATUS_SUCCEEDED, 4, 2);
    one_call(p, "T", "c", 1, AL_ROLLOUT_STATUS_FAILED, 4, 3);
    CHECK_EQ_INT(feed(p, mk_call("T", "d", 0, 4, P1, 2, NULL, 0, NULL)), 1); /* rejected */
    feed(p, mk_reward("T", "d", 1, 4, "final", 5, 0));
    CHECK_EQ_INT(s.n, 0);
    feed(p, mk_end("T", "d", 2, 4, AL_ROLLOUT_STATUS_SUCCEEDED, 4));
    REQUIRE(s.n == 2); /* the fourth end completed the group */
    for (int i = 0; i < 2; i++) {
        const al_transition *t = tr(&s, i);
        CHECK_EQ_INT(t->group_size, 2);
        CHECK_NEAR(t->advantage, (t->rollout_id[0] == 'a' ? 0.5 : -0.5) / (0.5 + 1e-6), 1e-12);
    }
    CHECK_EQ_INT((int)al_credit_part_stats(p)->rollouts_dropped, 1);
    al_credit_part_free(p);
    sink_free(&s);
}

/* "--failed-reward if it failed or was aborted (kept with --on-failed keep) ... a kept
 * failed or timed-out rollout that has a reward trains with its own reward"; a succeeded
 * one without a reward has 0. Failed f1 with reward 0.5, aborted f2 without (-1), succeeded
 * s1 without (0), succeeded s2 with 1: dr_grpo against the mean (0.5 - 1 + 0 + 1) / 4 =
 * 0.125. With --on-failed drop the group trains s1 and s2 only: mean 0.5, group_size 2. */
TEST(on_failed_keep_and_drop)
{
    for (int keep = 0; keep < 2; keep++) {
        al_credit_config c = config(AL_CREDIT_ESTIMATOR_DR_GRPO, 4);
        c.failed_policy = keep ? AL_CREDIT_POLICY_KEEP : AL_CREDIT_POLICY_DROP;
        c.failed_reward = -1;
        sink_t s;
        al_credit_part *p = mk_part(&c, &s);
        one_call(p, "T", "f1", 0.5, AL_ROLLOUT_STATUS_FAILED, 0, 1);
        one_call(p, "T", "f2", NAN, AL_ROLLOUT_STATUS_ABORTED, 0, 2);
        one_call(p, "T", "s1", NAN, AL_ROLLOUT_STATUS_SUCCEEDED, 0, 3);
        one_call(p, "T", "s2", 1, AL_ROLLOUT_STATUS_SUCCEEDED, 0, 4);
        REQUIRE(s.n == (keep ? 4 : 2));
        const char *rid[4] = {"f1", "f2", "s1", "s2"};
        const double R[4] = {0.5, -1, 0, 1};
        double mean = keep ? 0.125 : 0.5;
        for (int i = keep ? 0 : 2; i < 4; i++) {
            char id[16];
            snprintf(id, sizeof id, "%s:0:0", rid[i]);
            const al_transition *t = tr_id(&s, id);
            REQUIREF(t != NULL, "%s missing (keep %d)", id, keep);
            CHECK_NEAR(t->reward, R[i], 0);
            CHECK_NEAR(t->advantage, R[i] - mean, 1e-15);
            CHECK_EQ_INT(t->group_size, keep ? 4 : 2);
        }
        al_credit_part_free(p);
        sink_free(&s);
    }
}

/* "--timeout-reward if it timed out (idle timeout, or an end span with status timeout; kept
 * with --on-timeout keep)". t1 goes idle with its own reward 1; t2 ends with status timeout
 * and no reward (-2); s succeeds with 0.5. dr_grpo against (1 - 2 + 0.5) / 3 = -1/6. With
 * --on-timeout drop only s trains: a group of one member, advantage 0. */
TEST(on_timeout_keep_and_drop)
{
    for (int keep = 0; keep < 2; keep++) {
        al_credit_config c = config(AL_CREDIT_ESTIMATOR_DR_GRPO, 3);
        c.idle_timeout_us = 10;
        c.timeout_policy = keep ? AL_CREDIT_POLICY_KEEP : AL_CREDIT_POLICY_DROP;
        c.timeout_reward = -2;
        sink_t s;
        al_credit_part *p = mk_part(&c, &s);
        feed(p, mk_simple("T", "t1", 0, 0));
        feed(p, mk_reward("T", "t1", 1, 1, "final", 1, 0)); /* and then nothing */
        feed(p, mk_simple("T", "t2", 0, 20));               /* 20 > 1 + 10: t1 times out */
        CHECK_EQ_INT((int)al_credit_part_stats(p)->rollouts_timed_out, 1);
        feed(p, mk_end("T", "t2", 1, 21, AL_ROLLOUT_STATUS_TIMEOUT, 0));
        one_call(p, "T", "s", 0.5, AL_ROLLOUT_STATUS_SUCCEEDED, 0, 22);
        REQUIRE(s.n == (keep ? 3 : 1));
        if (keep) {
            CHECK_NEAR(tr_id(&s, "t1:0:0")->advantage, 1 + 1.0 / 6, 1e-15);
            CHECK_NEAR(tr_id(&s, "t2:0:0")->advantage, -2 + 1.0 / 6, 1e-15);
            CHECK_NEAR(tr_id(&s, "t2:0:0")->reward, -2, 0);
            CHECK_NEAR(tr_id(&s, "s:0:0")->advantage, 0.5 + 1.0 / 6, 1e-15);
        } else {
            CHECK_NEAR(tr_id(&s, "s:0:0")->advantage, 0, 0);
            CHECK_EQ_INT(tr_id(&s, "s:0:0")->group_size, 1);
            CHECK_EQ_INT((int)al_credit_part_stats(p)->rollouts_dropped, 2);
        }
        al_credit_part_free(p);
        sink_free(&s);
    }
}

/* "--drop-equal-groups drops a group in which no set has spread ... whatever the estimator
 * ...; a group of one member is always such a group." */
TEST(drop_equal_groups_by_the_spread_rule)
{
    for (int e = AL_CREDIT_ESTIMATOR_GRPO; e <= AL_CREDIT_ESTIMATOR_NONE; e++) {
        al_credit_config c = config((al_credit_estimator)e, 2);
        c.drop_equal_groups = 1;
        c.reward_mode = AL_CREDIT_REWARD_SUM;
        sink_t s;
        al_credit_part *p = mk_part(&c, &s);
        one_call(p, "A", "a1", 1, AL_ROLLOUT_STATUS_SUCCEEDED, 0, 1); /* {1, 1}: dropped */
        one_call(p, "A", "a2", 1, AL_ROLLOUT_STATUS_SUCCEEDED, 0, 2);
        one_call(p, "B", "b1", 1, AL_ROLLOUT_STATUS_SUCCEEDED, 0, 3); /* {1, 0}: kept */
        one_call(p, "B", "b2", 0, AL_ROLLOUT_STATUS_SUCCEEDED, 0, 4);
        /* {0.1 + 0.2, 0.3}: within 1e-9 of each other, dropped */
        feed(p, mk_simple("C", "c1", 0, 5));
        feed(p, mk_reward("C", "c1", 1, 5, "x", 0.1, 0));
        feed(p, mk_reward("C", "c1", 2, 5, "y", 0.2, 0));
        feed(p, mk_end("C", "c1", 3, 5, AL_ROLLOUT_STATUS_SUCCEEDED, 0));
        one_call(p, "C", "c2", 0.3, AL_ROLLOUT_STATUS_SUCCEEDED, 0, 6);
        one_call(p, "", "solo", 7, AL_ROLLOUT_STATUS_SUCCEEDED, 0, 7); /* a group of one */
        CHECKF(s.n == 2 && tr_id(&s, "b1:0:0") && tr_id(&s, "b2:0:0"), "%s: %d transitions",
               al_credit_estimator_name(e), s.n);
        CHECK_EQ_INT((int)al_credit_part_stats(p)->groups_dropped_equal, 3);
        al_credit_part_free(p);
        sink_free(&s);
    }
    /* discounted, two calls, gamma 0: {[1, 0], [1, 1]} has spread at call 1 (kept, although
     * every first call has the same return); {[1, 1], [1, 1]} has none anywhere (dropped) */
    al_credit_config c = config(AL_CREDIT_ESTIMATOR_GRPO, 2);
    c.drop_equal_groups = 1;
    c.assign = AL_CREDIT_ASSIGN_DISCOUNTED;
    c.gamma = 0;
    sink_t s;
    al_credit_part *p = mk_part(&c, &s);
    const double r10[2] = {1, 0}, r11[2] = {1, 1};
    feed_chain(p, "A", "a1", 2, r10, 0, 1, AL_ROLLOUT_STATUS_SUCCEEDED, 1);
    feed_chain(p, "A", "a2", 2, r11, 0, 1, AL_ROLLOUT_STATUS_SUCCEEDED, 10);
    feed_chain(p, "B", "b1", 2, r11, 0, 1, AL_ROLLOUT_STATUS_SUCCEEDED, 20);
    feed_chain(p, "B", "b2", 2, r11, 0, 1, AL_ROLLOUT_STATUS_SUCCEEDED, 30);
    CHECK_EQ_INT(s.n, 4);
    CHECK_EQ_INT((int)al_credit_part_stats(p)->groups_dropped_equal, 1);
    CHECK_NEAR(tr_id(&s, "a2:0:2")->advantage, 0.5 / (0.5 + 1e-6), 1e-12);
    al_credit_part_free(p);
    sink_free(&s);
}

/* A rollout with calls at sequences 0 and 2 and reward spans (sequence: name value, after)
 * 1: a 1 (after 0), 3: b 3 (after 2), 4: a 2 (after 2), arriving in the order 1, 4, 3. */
static void feed_rewarded(al_credit_part *p, const char *rid, al_rollout_status st)
{
    static const int32_t p0[] = {1, 2}, r0[] = {3, 4}, p2[] = {8}, r2[] = {9};
    feed(p, mk_call("T", rid, 0, 1, p0, 2, r0, 2, NULL));
    feed(p, mk_reward("T", rid, 1, 2, "a", 1, 0));
    feed(p, mk_call("T", rid, 2, 3, p2, 1, r2, 1, NULL));
    feed(p, mk_reward("T", rid, 4, 4, "a", 2, 2));
    feed(p, mk_reward("T", rid, 3, 5, "b", 3, 2));
    feed(p, mk_end("T", rid, 5, 6, st, 0));
}

/* "--reward last (default): the value of its reward span with the highest sequence number
 * (whatever order they arrived in); --reward-name NAME: the same among the spans called
 * NAME, the others ignored; --reward sum: the sum of all its reward spans", and a kept
 * rollout without one has 0 (succeeded) or its default (failed). Discounted: "every reward
 * span counts (only --reward-name filters; --reward last|sum make no difference)". */
TEST(reward_modes_and_names)
{
    struct {
        al_credit_reward_mode mode;
        const char *name;
        al_credit_assign assign;
        al_rollout_status st;
        double g0, g1; /* the returns of the two calls */
    } cases[] = {
        {AL_CREDIT_REWARD_LAST, NULL, AL_CREDIT_ASSIGN_IDENTICAL, AL_ROLLOUT_STATUS_SUCCEEDED, 2, 2},
        {AL_CREDIT_REWARD_SUM, NULL, AL_CREDIT_ASSIGN_IDENTICAL, AL_ROLLOUT_STATUS_SUCCEEDED, 6, 6},
        {AL_CREDIT_REWARD_NAMED, "a", AL_CREDIT_ASSIGN_IDENTICAL, AL_ROLLOUT_STATUS_SUCCEEDED, 2,
         2},
        {AL_CREDIT_REWARD_NAMED, "b", AL_CREDIT_ASSIGN_IDENTICAL, AL_ROLLOUT_STATUS_SUCCEEDED, 3,
         3},
        {AL_CREDIT_REWARD_NAMED, "c", AL_CREDIT_ASSIGN_IDENTICAL, AL_ROLLOUT_STATUS_SUCCEEDED, 0,
         0},
        {AL_CREDIT_REWARD_NAMED, "c", AL_CREDIT_ASSIGN_IDENTICAL, AL_ROLLOUT_STATUS_FAILED, -4, -4},
        /* discounted, gamma 1: r = [1, 3 + 2], G = [6, 5]; named a: r = [1, 2], G = [3, 2] */
        {AL_CREDIT_REWARD_LAST, NULL, AL_CREDIT_ASSIGN_DISCOUNTED, AL_ROLLOUT_STATUS_SUCCEEDED, 6,
         5},
        {AL_CREDIT_REWARD_SUM, NULL, AL_CREDIT_ASSIGN_DISCOUNTED, AL_ROLLOUT_STATUS_SUCCEEDED, 6, 5},
        {AL_CREDIT_REWARD_NAMED, "a", AL_CREDIT_ASSIGN_DISCOUNTED, AL_ROLLOUT_STATUS_SUCCEEDED, 3,
         2},
        /* no reward named c on a kept failed rollout: -4 at the last call */
        {AL_CREDIT_REWARD_NAMED, "c", AL_CREDIT_ASSIGN_DISCOUNTED, AL_ROLLOUT_STATUS_FAILED, -4,
         -4},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        al_credit_config c = config(AL_CREDIT_ESTIMATOR_NONE, 1);
        c.reward_mode = cases[i].mode;
        c.reward_name = cases[i].name;
        c.assign = cases[i].assign;
        c.failed_policy = AL_CREDIT_POLICY_KEEP;
        c.failed_reward = -4;
        sink_t s;
        al_credit_part *p = mk_part(&c, &s);
        feed_rewarded(p, "r", cases[i].st);
        REQUIRE(s.n == 2);
        const al_transition *t0 = tr_id(&s, "r:0:0");
        double g0 = t0 ? t0->return_value : NAN, a0 = t0 ? t0->advantage : NAN;
        const al_transition *t1 = tr_id(&s, "r:0:2");
        double g1 = t1 ? t1->return_value : NAN;
        CHECKF(g0 == cases[i].g0 && a0 == cases[i].g0 && g1 == cases[i].g1,
               "case %zu: returns %g, %g (advantage %g); want %g, %g", i, g0, g1, a0, cases[i].g0,
               cases[i].g1);
        al_credit_part_free(p);
        sink_free(&s);
    }
}

static int run(const char *args, char *out, size_t outlen)
{
    char cmd[1024], path[256];
    const char *tmp = getenv("TMPDIR");
    snprintf(path, sizeof path, "%s/t0805-%d.out", tmp && *tmp ? tmp : "/tmp", (int)getpid());
    const char *bin = getenv("ARCLIGHT_BIN");
    snprintf(cmd, sizeof cmd, "'%s' credit %s >'%s' 2>&1", bin ? bin : "build/arclight", args,
             path);
    int st = system(cmd);
    out[0] = '\0';
    FILE *f = fopen(path, "r");
    if (f) {
        size_t n = fread(out, 1, outlen - 1, f);
        out[n] = '\0';
        fclose(f);
    }
    unlink(path);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* --reward and --reward-name do not combine, in either order (before, the later flag won
 * silently); --help states the choices the numbers depend on. */
TEST(command_line_reward_flags_and_help)
{
    static char out[16384];
    CHECK_EQ_INT(run("--reward sum --reward-name x", out, sizeof out), 2);
    CHECKF(strstr(out, "--reward and --reward-name do not combine") != NULL, "%s", out);
    CHECK_EQ_INT(run("--reward-name x --reward last", out, sizeof out), 2);
    CHECK_EQ_INT(run("--help", out, sizeof out), 0);
    static const char *const said[] = {"population", "std + eps", "1e-9",   "after_sequence",
                                       "k-th call", "group_size", "agent's tokens"};
    for (size_t i = 0; i < sizeof said / sizeof *said; i++)
        CHECKF(strstr(out, said[i]) != NULL, "--help does not say \"%s\"", said[i]);
}
