/* t0800: credit assignment's pure logic (stages/credit/credit.c) against hand-computed
 * values: every estimator, identical vs discounted credit, merge and its masks, idle and
 * group timeouts, failed/timeout policies, dropped groups, rejected spans, the safe offset
 * rule and the skipping of resumed remnants, and split-independence. */
#include "testlib.h"

#include "credit.h"
#include "t0849_credit_helpers.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* One span given to a part and what the part must answer: a row of the tables below. A
 * field left at ANY is not checked. */
#define ANY INT64_MIN
typedef struct add_row {
    int64_t offset;        /* the span's offset; ANY: the next of off_counter */
    al_span span;
    int64_t rc;            /* al_credit_part_add's result */
    const char *code;      /* the rejection code it names (NULL: not checked) */
    const char *reason[4]; /* phrases its reason holds (up to a NULL) */
    int64_t safe;          /* al_credit_part_safe_offset after it */
} add_row;

/* The configuration every test starts from: the defaults, groups of group_size. */
static al_credit_config config_of(int group_size)
{
    al_credit_config c;
    al_credit_config_init(&c);
    c.group_size = group_size;
    return c;
}

/* Frees a part and empties the sink it fed (mk_part's pair). */
static void part_close(al_credit_part *p, sink_t *s)
{
    al_credit_part_free(p);
    sink_free(s);
}

/* Adds the rows' spans to p in order and checks each answer. */
static void add_rows(al_credit_part *p, add_row *rows, size_t n)
{
    char reason[256], err[256];
    for (size_t i = 0; i < n; i++) {
        add_row *r = &rows[i];
        const char *code = NULL;
        int64_t off = r->offset == ANY ? off_counter++ : r->offset;
        int rc = al_credit_part_add(p, off, &r->span, &code, reason, sizeof reason, err,
                                    sizeof err);
        CHECKF(r->rc == ANY || rc == r->rc, "row %zu (offset %lld): add gave %d, want %lld", i,
               (long long)off, rc, (long long)r->rc);
        if (r->code)
            CHECKF(code && !strcmp(code, r->code), "row %zu: code %s, want %s", i,
                   code ? code : "(null)", r->code);
        for (int k = 0; k < 4 && r->reason[k]; k++)
            CHECKF(strstr(reason, r->reason[k]) != NULL, "row %zu: reason: %s", i, reason);
        if (r->safe != ANY) {
            int64_t safe = al_credit_part_safe_offset(p);
            CHECKF(safe == r->safe, "row %zu: safe offset %lld, want %lld", i, (long long)safe,
                   (long long)r->safe);
        }
    }
}

/* Advantages of the four one-call rollouts r0..r3 with rewards 1, 2, 3, 6. */
static void run_estimator(al_credit_estimator e, double *adv)
{
    al_credit_config c;
    al_credit_config_init(&c);
    c.estimator = e;
    c.group_size = 4;
    sink_t s;
    al_credit_part *p = mk_part(&c, &s);
    static const double rw[] = {1, 2, 3, 6};
    char rid[8];
    for (int i = 0; i < 4; i++) {
        snprintf(rid, sizeof rid, "r%d", i);
        feed_rollout(p, "T", rid, rw[i], 1000 + i);
    }
    for (int i = 0; i < 4; i++)
        adv[i] = NAN;
    for (int i = 0; i < s.n && i < 4; i++) {
        const al_transition *t = tr(&s, i);
        if (t) adv[t->rollout_id[1] - '0'] = t->advantage;
    }
    CHECK_EQ_INT(s.n, 4);
    part_close(p, &s);
}

TEST(estimators_match_hand_computed_values)
{
    double a[4];
    /* mean 3, population variance (4 + 1 + 0 + 9) / 4 = 3.5, std 1.8708287 */
    run_estimator(AL_CREDIT_ESTIMATOR_GRPO, a);
    CHECK_NEAR(a[0], -2 / (1.8708287 + 1e-6), 1e-6);
    CHECK_NEAR(a[3], 3 / (1.8708287 + 1e-6), 1e-6);
    CHECK_NEAR(a[2], 0, 1e-12);
    run_estimator(AL_CREDIT_ESTIMATOR_DR_GRPO, a);
    CHECK_NEAR(a[0], -2, 1e-12);
    CHECK_NEAR(a[1], -1, 1e-12);
    CHECK_NEAR(a[3], 3, 1e-12);
    /* leave-one-out: 1 - 11/3, 2 - 10/3, 3 - 9/3, 6 - 6/3 */
    run_estimator(AL_CREDIT_ESTIMATOR_RLOO, a);
    CHECK_NEAR(a[0], 1 - 11.0 / 3, 1e-12);
    CHECK_NEAR(a[1], 2 - 10.0 / 3, 1e-12);
    CHECK_NEAR(a[2], 0, 1e-12);
    CHECK_NEAR(a[3], 4, 1e-12);
    run_estimator(AL_CREDIT_ESTIMATOR_NONE, a);
    CHECK_NEAR(a[0], 1, 1e-12);
    CHECK_NEAR(a[3], 6, 1e-12);
}

/* grpo with eps 0: a group without spread has nothing to normalize by, and gets 0 (not
 * 0/0); with spread the advantage is the plain z-score. */
TEST(grpo_with_eps_zero_on_a_group_without_spread)
{
    al_credit_config c = config_of(2);
    c.eps = 0;
    sink_t s;
    al_credit_part *p = mk_part(&c, &s);
    feed_rollout(p, "T", "a", 0.5, 1);
    feed_rollout(p, "T", "b", 0.5, 2);
    feed_rollout(p, "U", "c", 0, 3);
    feed_rollout(p, "U", "d", 2, 4);
    REQUIRE(s.n == 4);
    CHECK_NEAR(tr_id(&s, "a:0:0")->advantage, 0, 0);
    CHECK_NEAR(tr_id(&s, "b:0:0")->advantage, 0, 0);
    CHECK_NEAR(tr_id(&s, "c:0:0")->advantage, -1, 1e-15);
    CHECK_NEAR(tr_id(&s, "d:0:0")->advantage, 1, 1e-15);
    double eq[3] = {7, 7, 7};
    CHECK_NEAR(al_credit_advantage(AL_CREDIT_ESTIMATOR_GRPO, eq, 3, 0, 7, 0), 0, 0);
    part_close(p, &s);
}

/* Timestamps are a producer's int64s: a clock at INT64_MAX, a rollout last seen at
 * INT64_MIN and the largest timeouts neither overflow (UBSan) nor stop timeouts firing. */
TEST(timeouts_at_the_ends_of_the_clock)
{
    al_credit_config c = config_of(2);
    c.idle_timeout_us = INT64_MAX;
    c.group_timeout_us = INT64_MAX;
    c.timeout_policy = AL_CREDIT_POLICY_KEEP;
    sink_t s;
    al_credit_part *p = mk_part(&c, &s);
    feed(p, mk_simple("T", "b", 0, INT64_MAX - 1));
    /* 1 us idle: (INT64_MAX - 1) + INT64_MAX wrapped around once, and timed b out */
    CHECK_EQ_INT(al_credit_part_advance(p, INT64_MAX, NULL, 0), 0);
    CHECK_EQ_INT((int)al_credit_part_stats(p)->rollouts_timed_out, 0);
    feed(p, mk_simple("T", "a", 0, INT64_MIN)); /* a clock that never goes back */
    CHECK_EQ_INT((int)al_credit_part_stats(p)->rollouts_timed_out, 0);
    CHECK_EQ_INT(al_credit_part_clock(p) == INT64_MAX, 1);
    part_close(p, &s);

    c.idle_timeout_us = 10;
    c.group_timeout_us = 10;
    p = mk_part(&c, &s);
    feed(p, mk_simple("T", "a", 0, -5));
    feed(p, mk_simple("T", "b", 0, INT64_MAX - 3));
    /* a (last active at clock 0) is long idle once the clock is near INT64_MAX */
    CHECK_EQ_INT((int)al_credit_part_stats(p)->rollouts_timed_out, 1);
    CHECK_EQ_INT(al_credit_part_advance(p, INT64_MAX, NULL, 0), 0);
    CHECK_EQ_INT((int)al_credit_part_stats(p)->rollouts_timed_out, 1); /* b: 3 us idle */
    feed(p, mk_end("T", "b", 1, INT64_MAX, AL_ROLLOUT_STATUS_SUCCEEDED, 0));
    REQUIRE(s.n == 2);
    part_close(p, &s);
}

TEST(transition_fields_of_a_group)
{
    al_credit_config c = config_of(2);
    sink_t s;
    al_credit_part *p = mk_part(&c, &s);
    off_counter = 100;
    feed_rollout(p, "task-a", "ra", 1, 5000);
    CHECK_EQ_INT(s.n, 0); /* the group waits for its second rollout */
    feed_rollout(p, "task-a", "rb", 0, 7000);
    REQUIRE(s.n == 2);
    const al_transition *t = tr(&s, 0);
    REQUIRE(t != NULL);
    CHECK_EQ_STR(t->id, "ra:0:0");
    CHECK_EQ_STR(t->group_key, "task-a");
    CHECK_EQ_STR(t->group_id, "task-a/ra:0");
    CHECK_EQ_INT(t->group_size, 2);
    CHECK_EQ_STR(t->task_id, "task-a");
    CHECK_EQ_STR(t->estimator, "grpo");
    CHECK_EQ_STR(t->model, "m");
    CHECK_EQ_INT((int)t->policy_version, 3);
    CHECK_EQ_INT((int)t->timestamp_us, 7000); /* event time: the group's latest span */
    CHECK_EQ_INT((int)t->n_prompt_tokens, 2);
    CHECK_EQ_INT((int)t->n_response_tokens, 2);
    CHECK_EQ_INT((int)t->n_loss_mask, 0); /* all ones */
    CHECK_EQ_INT((int)t->n_rollout_logprobs, 2);
    CHECK_NEAR(t->rollout_logprobs[1], -0.25, 1e-7);
    CHECK_NEAR(t->reward, 1, 0);
    CHECK_NEAR(t->advantage, 0.5 / (0.5 + 1e-6), 1e-9); /* (1 - 0.5) / (0.5 + eps) */
    CHECK_EQ_INT((int)s.anchor[0], 100);                /* the group's earliest span */
    const al_credit_stats *st = al_credit_part_stats(p);
    CHECK_EQ_INT((int)st->groups_completed, 1);
    CHECK_EQ_INT((int)st->transitions, 2);
    CHECK_EQ_INT((int)st->open_rollouts, 0);
    CHECK_EQ_INT((int)st->open_groups, 0);
    part_close(p, &s);
}

TEST(reinforce_running_baseline_per_task)
{
    al_credit_config c;
    al_credit_config_init(&c);
    c.estimator = AL_CREDIT_ESTIMATOR_REINFORCE;
    c.group_size = 2;
    c.reinforce_alpha = 0.5;
    sink_t s;
    al_credit_part *p = mk_part(&c, &s);
    /* group 1 of T: rewards 1, 3: the baseline starts at their mean 2 -> advantages -1, 1;
     * then b = 2 + 0.5 (2 - 2) = 2 */
    feed_rollout(p, "T", "a", 1, 1);
    feed_rollout(p, "T", "b", 3, 2);
    /* group of U: its own baseline (mean 10) */
    feed_rollout(p, "U", "u1", 10, 3);
    feed_rollout(p, "U", "u2", 10, 4);
    /* group 2 of T: rewards 6, 6: advantages 6 - 2 = 4; then b = 2 + 0.5 (6 - 2) = 4 */
    feed_rollout(p, "T", "c", 6, 5);
    feed_rollout(p, "T", "d", 6, 6);
    /* group 3 of T: rewards 0, 2: advantages -4, -2 */
    feed_rollout(p, "T", "e", 0, 7);
    feed_rollout(p, "T", "f", 2, 8);
    REQUIRE(s.n == 8);
    const double want[] = {-1, 1, 0, 0, 4, 4, -4, -2};
    for (int i = 0; i < 8; i++) {
        const al_transition *t = tr(&s, i);
        REQUIRE(t != NULL);
        CHECKF(fabs(t->advantage - want[i]) < 1e-12, "transition %d (%s): advantage %g, want %g", i,
               t->id, t->advantage, want[i]);
        CHECK_EQ_STR(t->estimator, "reinforce");
    }
    part_close(p, &s);
}

/* A three-call rollout without task: call 0, reward 1 after it, call 1, call 2, reward 2
 * after call 2, end. */
static void feed_three_calls(al_credit_part *p)
{
    feed(p, mk_simple("", "r", 0, 1));
    feed(p, mk_reward("", "r", 1, 2, "step", 1, 0));
    feed(p, mk_simple("", "r", 2, 3));
    feed(p, mk_simple("", "r", 3, 4));
    feed(p, mk_reward("", "r", 4, 5, "final", 2, 3));
    feed(p, mk_end("", "r", 5, 6, AL_ROLLOUT_STATUS_SUCCEEDED, 0));
}

TEST(identical_assignment_against_discounted_returns)
{
    al_credit_config c;
    al_credit_config_init(&c);
    c.estimator = AL_CREDIT_ESTIMATOR_NONE;
    sink_t s;
    /* identical, last reward: every call gets R = 2 */
    al_credit_part *p = mk_part(&c, &s);
    feed_three_calls(p);
    REQUIRE(s.n == 3);
    for (int i = 0; i < 3; i++) {
        const al_transition *t = tr(&s, i);
        REQUIRE(t != NULL);
        CHECK_NEAR(t->reward, 2, 0);
        CHECK_NEAR(t->return_value, 2, 0);
        CHECK_NEAR(t->advantage, 2, 0);
        CHECK_EQ_INT(t->group_size, 1); /* no task: a group of its own */
        CHECK_EQ_STR(t->group_key, "r");
    }
    part_close(p, &s);
    /* identical, sum: R = 3; named "step": R = 1 */
    c.reward_mode = AL_CREDIT_REWARD_SUM;
    p = mk_part(&c, &s);
    feed_three_calls(p);
    REQUIRE(s.n == 3);
    CHECK_NEAR(tr(&s, 2)->reward, 3, 0);
    part_close(p, &s);
    c.reward_mode = AL_CREDIT_REWARD_NAMED;
    c.reward_name = "step";
    p = mk_part(&c, &s);
    feed_three_calls(p);
    REQUIRE(s.n == 3);
    CHECK_NEAR(tr(&s, 1)->reward, 1, 0);
    part_close(p, &s);
    /* discounted, gamma 0.5: r = [1, 0, 2], G = [1 + 0.5 * (0 + 0.5 * 2), 0 + 0.5 * 2, 2] */
    c.reward_mode = AL_CREDIT_REWARD_LAST;
    c.assign = AL_CREDIT_ASSIGN_DISCOUNTED;
    c.gamma = 0.5;
    p = mk_part(&c, &s);
    feed_three_calls(p);
    REQUIRE(s.n == 3);
    const double r[] = {1, 0, 2}, g[] = {1.5, 1, 2};
    for (int i = 0; i < 3; i++) {
        const al_transition *t = tr(&s, i);
        REQUIRE(t != NULL);
        CHECKF(t->reward == r[i] && t->return_value == g[i] && t->advantage == g[i],
               "call %d: reward %g return %g advantage %g; want %g %g %g", i, t->reward,
               t->return_value, t->advantage, r[i], g[i], g[i]);
    }
    part_close(p, &s);
    /* gamma 1 gives every call the sum of the rewards after it: [3, 2, 2] */
    c.gamma = 1;
    p = mk_part(&c, &s);
    feed_three_calls(p);
    REQUIRE(s.n == 3);
    CHECK_NEAR(tr(&s, 0)->return_value, 3, 0);
    CHECK_NEAR(tr(&s, 1)->return_value, 2, 0);
    part_close(p, &s);
}

TEST(merge_builds_multi_turn_sequences_with_masks)
{
    static const int32_t p0[] = {1, 2}, r0[] = {3, 4};
    static const int32_t p1[] = {1, 2, 3, 4, 5, 6}, r1[] = {7};
    static const int32_t p2[] = {9}, r2[] = {10, 11};
    static const float l0[] = {-0.1f, -0.2f}, l1[] = {-0.3f}, l2[] = {-1, -2};
    al_credit_config c;
    al_credit_config_init(&c);
    c.estimator = AL_CREDIT_ESTIMATOR_NONE;
    c.merge = 1;
    sink_t s;
    al_credit_part *p = mk_part(&c, &s);
    feed(p, mk_call("", "m", 0, 1, p0, 2, r0, 2, l0));
    feed(p, mk_call("", "m", 1, 2, p1, 6, r1, 1, l1));
    feed(p, mk_call("", "m", 2, 3, p2, 1, r2, 2, l2)); /* a new context: not merged */
    feed(p, mk_reward("", "m", 3, 4, "final", 1, 2));
    feed(p, mk_end("", "m", 4, 5, AL_ROLLOUT_STATUS_SUCCEEDED, 0));
    REQUIRE(s.n == 2);
    const al_transition *t = tr(&s, 0);
    REQUIRE(t != NULL);
    CHECK_EQ_STR(t->id, "m:0:0");
    REQUIRE(t->n_call_indices == 2);
    CHECK(t->call_indices[0] == 0 && t->call_indices[1] == 1);
    REQUIRE(t->n_prompt_tokens == 2);
    CHECK(t->prompt_token_ids[0] == 1 && t->prompt_token_ids[1] == 2);
    static const int32_t want_resp[] = {3, 4, 5, 6, 7};
    static const uint8_t want_mask[] = {1, 1, 0, 0, 1};
    static const float want_lp[] = {-0.1f, -0.2f, 0, 0, -0.3f};
    REQUIRE(t->n_response_tokens == 5 && t->n_loss_mask == 5 && t->n_rollout_logprobs == 5);
    for (int i = 0; i < 5; i++) {
        CHECKF(t->response_token_ids[i] == want_resp[i], "token %d: %d", i,
               t->response_token_ids[i]);
        CHECKF(t->loss_mask[i] == want_mask[i], "mask %d: %d", i, t->loss_mask[i]);
        CHECKF(t->rollout_logprobs[i] == want_lp[i], "logprob %d: %g", i, t->rollout_logprobs[i]);
    }
    t = tr(&s, 1);
    REQUIRE(t != NULL);
    CHECK_EQ_STR(t->id, "m:0:2");
    CHECK_EQ_INT((int)t->n_call_indices, 1);
    CHECK_EQ_INT((int)t->n_loss_mask, 0);
    CHECK_EQ_INT((int)t->n_response_tokens, 2);
    part_close(p, &s);

    /* without --merge: three transitions; with a call lacking logprobs: none in the merge */
    c.merge = 0;
    p = mk_part(&c, &s);
    feed(p, mk_call("", "m", 0, 1, p0, 2, r0, 2, l0));
    feed(p, mk_call("", "m", 1, 2, p1, 6, r1, 1, l1));
    feed(p, mk_call("", "m", 2, 3, p2, 1, r2, 2, l2));
    feed(p, mk_end("", "m", 3, 5, AL_ROLLOUT_STATUS_SUCCEEDED, 0));
    CHECK_EQ_INT(s.n, 3);
    CHECK(tr_id(&s, "m:0:1") != NULL);
    part_close(p, &s);
    c.merge = 1;
    p = mk_part(&c, &s);
    feed(p, mk_call("", "m", 0, 1, p0, 2, r0, 2, l0));
    feed(p, mk_call("", "m", 1, 2, p1, 6, r1, 1, NULL));
    feed(p, mk_end("", "m", 2, 5, AL_ROLLOUT_STATUS_SUCCEEDED, 0));
    REQUIRE(s.n == 1);
    CHECK_EQ_INT((int)tr(&s, 0)->n_rollout_logprobs, 0);
    CHECK_EQ_INT((int)tr(&s, 0)->n_loss_mask, 5);
    part_close(p, &s);
}

TEST(merged_sequences_under_discounting_carry_per_token_advantages)
{
    /* two merged calls, reward 1 after call 0 and 3 after call 1, gamma 0.5, estimator
     * none: G = [1 + 0.5 * 3, 3] = [2.5, 3] */
    static const int32_t p0[] = {1, 2}, r0[] = {3, 4};
    static const int32_t p1[] = {1, 2, 3, 4, 5}, r1[] = {6, 7};
    al_credit_config c;
    al_credit_config_init(&c);
    c.estimator = AL_CREDIT_ESTIMATOR_NONE;
    c.merge = 1;
    c.assign = AL_CREDIT_ASSIGN_DISCOUNTED;
    c.gamma = 0.5;
    sink_t s;
    al_credit_part *p = mk_part(&c, &s);
    feed(p, mk_call("", "d", 0, 1, p0, 2, r0, 2, NULL));
    feed(p, mk_reward("", "d", 1, 2, "step", 1, 0));
    feed(p, mk_call("", "d", 2, 3, p1, 5, r1, 2, NULL));
    feed(p, mk_reward("", "d", 3, 4, "final", 3, 2));
    feed(p, mk_end("", "d", 4, 5, AL_ROLLOUT_STATUS_SUCCEEDED, 0));
    REQUIRE(s.n == 1);
    const al_transition *t = tr(&s, 0);
    REQUIRE(t != NULL);
    CHECK_NEAR(t->return_value, 2.5, 0);
    CHECK_NEAR(t->advantage, 2.5, 0);
    CHECK_NEAR(t->reward, 4, 0); /* the rewards of both calls */
    REQUIRE(t->n_token_advantages == 5);
    static const float want[] = {2.5f, 2.5f, 0, 3, 3};
    for (int i = 0; i < 5; i++)
        CHECKF(t->token_advantages[i] == want[i], "token %d: %g, want %g", i,
               t->token_advantages[i], want[i]);
    part_close(p, &s);
}

TEST(idle_timeout_by_event_time_with_drop_and_keep)
{
    al_credit_config c = config_of(2);
    c.idle_timeout_us = 10;
    c.eps = 0;
    sink_t s;
    for (int keep = 0; keep < 2; keep++) {
        c.timeout_policy = keep ? AL_CREDIT_POLICY_KEEP : AL_CREDIT_POLICY_DROP;
        c.timeout_reward = -1;
        al_credit_part *p = mk_part(&c, &s);
        feed(p, mk_simple("T", "a", 0, 0)); /* never ends */
        feed(p, mk_simple("T", "b", 0, 5));
        feed(p, mk_reward("T", "b", 1, 9, "final", 1, 0));
        CHECK_EQ_INT((int)al_credit_part_stats(p)->rollouts_timed_out, 0);
        feed(p, mk_simple("X", "x", 0, 11)); /* 11 > 0 + 10: a times out */
        CHECK_EQ_INT((int)al_credit_part_stats(p)->rollouts_timed_out, 1);
        CHECK_EQ_INT((int)al_credit_part_stats(p)->rollouts_dropped, keep ? 0 : 1);
        feed(p, mk_end("T", "b", 2, 12, AL_ROLLOUT_STATUS_SUCCEEDED, 0));
        if (!keep) {
            /* the group is {a (dropped), b}: b alone trains, advantage 0 */
            REQUIRE(s.n == 1);
            CHECK_EQ_STR(tr(&s, 0)->id, "b:0:0");
            CHECK_EQ_INT(tr(&s, 0)->group_size, 1);
            CHECK_NEAR(tr(&s, 0)->advantage, 0, 0);
        } else {
            /* a keeps reward -1, b has 1: mean 0, std 1 */
            REQUIRE(s.n == 2);
            CHECK_NEAR(tr_id(&s, "a:0:0")->advantage, -1, 0);
            CHECK_NEAR(tr_id(&s, "b:0:0")->advantage, 1, 0);
            CHECK_EQ_INT((int)al_credit_part_stats(p)->rollouts_no_reward, 1);
        }
        /* a span of the timed-out rollout that comes late is rejected as such */
        CHECK_EQ_INT(feed(p, mk_reward("T", "a", 1, 13, "final", 5, 0)), 1);
        CHECK_EQ_INT((int)al_credit_part_stats(p)->open_rollouts, 1); /* x only */
        CHECK_EQ_INT(al_credit_part_advance(p, 100, NULL, 0), 0);
        CHECK_EQ_INT((int)al_credit_part_stats(p)->rollouts_skipped, 0);
        al_credit_part_free(p);
        sink_free(&s);
    }
}

TEST(group_timeout_and_group_size_from_end_spans)
{
    al_credit_config c = config_of(3);
    c.group_timeout_us = 20;
    c.idle_timeout_us = 0;
    c.estimator = AL_CREDIT_ESTIMATOR_DR_GRPO;
    sink_t s;
    al_credit_part *p = mk_part(&c, &s);
    feed_rollout(p, "T", "a", 1, 1);
    feed_rollout(p, "T", "b", 3, 2);
    CHECK_EQ_INT(s.n, 0);
    feed(p, mk_simple("U", "u", 0, 21)); /* 21 = opened (1) + 20: not yet */
    CHECK_EQ_INT(s.n, 0);
    CHECK_EQ_INT(al_credit_part_advance(p, 22, NULL, 0), 0);
    REQUIRE(s.n == 2);
    CHECK_NEAR(tr(&s, 0)->advantage, -1, 0);
    CHECK_EQ_INT(tr(&s, 0)->group_size, 2);
    CHECK_EQ_INT((int)al_credit_part_stats(p)->groups_timed_out, 1);
    part_close(p, &s);

    /* group size 8 configured, the end spans say 2 */
    c.group_size = 8;
    p = mk_part(&c, &s);
    feed(p, mk_simple("T", "a", 0, 1));
    feed(p, mk_end("T", "a", 1, 1, AL_ROLLOUT_STATUS_SUCCEEDED, 2));
    feed(p, mk_simple("T", "b", 0, 1));
    feed(p, mk_end("T", "b", 1, 1, AL_ROLLOUT_STATUS_SUCCEEDED, 2));
    CHECK_EQ_INT(s.n, 2);
    part_close(p, &s);
}

TEST(failed_rollouts_and_dropped_groups)
{
    al_credit_config c = config_of(2);
    sink_t s;
    /* failed, dropped: its group trains on the other rollout only */
    al_credit_part *p = mk_part(&c, &s);
    feed(p, mk_simple("T", "a", 0, 1));
    feed(p, mk_end("T", "a", 1, 1, AL_ROLLOUT_STATUS_FAILED, 0));
    feed_rollout(p, "T", "b", 1, 2);
    REQUIRE(s.n == 1);
    CHECK_EQ_STR(tr(&s, 0)->id, "b:0:0");
    CHECK_EQ_INT((int)al_credit_part_stats(p)->rollouts_dropped, 1);
    part_close(p, &s);
    /* failed, kept with reward -2: dr_grpo gives -1.5 and 1.5 */
    c.failed_policy = AL_CREDIT_POLICY_KEEP;
    c.failed_reward = -2;
    c.estimator = AL_CREDIT_ESTIMATOR_DR_GRPO;
    p = mk_part(&c, &s);
    feed(p, mk_simple("T", "a", 0, 1));
    feed(p, mk_end("T", "a", 1, 1, AL_ROLLOUT_STATUS_ABORTED, 0));
    feed_rollout(p, "T", "b", 1, 2);
    REQUIRE(s.n == 2);
    CHECK_NEAR(tr_id(&s, "a:0:0")->advantage, -1.5, 0);
    CHECK_NEAR(tr_id(&s, "b:0:0")->advantage, 1.5, 0);
    part_close(p, &s);
    /* all-equal groups dropped when asked, counted; empty groups counted */
    c.drop_equal_groups = 1;
    c.failed_policy = AL_CREDIT_POLICY_DROP;
    p = mk_part(&c, &s);
    feed_rollout(p, "T", "a", 1, 1);
    feed_rollout(p, "T", "b", 1, 2);
    feed(p, mk_simple("U", "u", 0, 1));
    feed(p, mk_end("U", "u", 1, 1, AL_ROLLOUT_STATUS_FAILED, 0));
    feed(p, mk_simple("U", "v", 0, 1));
    feed(p, mk_end("U", "v", 1, 1, AL_ROLLOUT_STATUS_FAILED, 0));
    CHECK_EQ_INT(s.n, 0);
    CHECK_EQ_INT((int)al_credit_part_stats(p)->groups_dropped_equal, 1);
    CHECK_EQ_INT((int)al_credit_part_stats(p)->groups_dropped_empty, 1);
    part_close(p, &s);
}

TEST(rejected_spans_name_their_reason)
{
    al_credit_config c = config_of(1);
    sink_t s;
    al_credit_part *p = mk_part(&c, &s);
    add_row rows[] = {
        /* a call without token ids at sequence 0: rejected, the rest of its rollout trains */
        {0, mk_call("T", "r", 0, 1, P1, 2, NULL, 0, NULL), 1, "no_token_ids",
         {"rollout r", "response token ids", "upstream gave no logprobs"}, ANY},
        {1, mk_simple("T", "r", 1, 2), 1, "logprobs_mismatch", {NULL}, ANY},
        {2, mk_simple("T", "", 0, 2), 1, "bad_span", {NULL}, ANY},
        {3, mk_simple("T", "r", 2, 3), 0, NULL, {NULL}, ANY},
        {4, mk_simple("T", "r", 2, 3), 1, "duplicate_sequence", {NULL}, ANY},
        {5, mk_reward("T", "r", 3, 3, "final", NAN, 2), 1, "bad_span", {NULL}, ANY},
        /* finite but beyond the bound: sums and squares of such would overflow */
        {5, mk_reward("T", "r", 4, 3, "final", -1e300, 2), 1, "bad_span", {"-1e+300", "beyond"},
         ANY},
        /* a refused span keeps its sequence number: a second one is a duplicate */
        {5, mk_reward("T", "r", 4, 3, "final", -1e300, 2), 1, "duplicate_sequence", {NULL}, ANY},
        /* sequences 0-4 were all there, refused ones included: the end does not wait */
        {6, mk_end("T", "r", 5, 4, AL_ROLLOUT_STATUS_SUCCEEDED, 0), 0, NULL, {NULL}, ANY},
        {7, mk_reward("T", "r", 6, 5, "final", 1, 2), 1, "late_span", {"after the rollout ended"},
         ANY},
    };
    rows[0].span.llm_call.error = "upstream gave no logprobs";
    rows[1].span.llm_call.n_response_logprobs = 1;
    add_rows(p, rows, 9);
    CHECK_EQ_INT((int)al_credit_part_stats(p)->rollouts_waiting, 0);
    add_rows(p, rows + 9, 1);
    REQUIRE(s.n == 1);
    CHECK_EQ_STR(tr(&s, 0)->id, "r:0:2");
    CHECK_EQ_INT((int)s.anchor[0], 0); /* the rejected first call still anchors the group */
    part_close(p, &s);
}

static int count_fn(void *ud, const al_transition *t, int64_t anchor)
{
    (void)t;
    (void)anchor;
    ++*(int *)ud;
    return 0;
}

/* The memory of ended rollouts grows with use (from 64 entries) and keeps the newest 65,536
 * per partition: a span of any of them is late; one of a rollout forgotten long ago starts
 * a remnant instead. */
TEST(ended_rollouts_are_remembered_across_growth_and_forgotten_oldest_first)
{
    al_credit_config c = config_of(1);
    int emitted = 0;
    al_credit_sink k = {.transition = count_fn, .ud = &emitted};
    char err[256];
    al_credit_part *p = al_credit_part_new(&c, &k, err, sizeof err);
    REQUIREF(p, "%s", err);
    enum { N = 65536 + 300 };
    char rid[32], reason[256];
    const char *code;
    for (int i = 0; i < N; i++) {
        snprintf(rid, sizeof rid, "r%d", i);
        feed_rollout(p, "T", rid, 1, 10 + i);
    }
    CHECK_EQ_INT(emitted, N);
    static const int late[] = {300, 301, 1000, 40000, N - 64, N - 1};
    for (size_t j = 0; j < sizeof late / sizeof *late; j++) {
        snprintf(rid, sizeof rid, "r%d", late[j]);
        al_span sp = mk_reward("T", rid, 3, 10 + N, "final", 1, 0);
        CHECK_EQ_INT(al_credit_part_add(p, off_counter++, &sp, &code, reason, sizeof reason, err,
                                        sizeof err),
                     1);
        CHECKF(code && !strcmp(code, "late_span"), "r%d: %s", late[j], code ? code : "(none)");
    }
    /* r0 .. r299 are forgotten: a span of r0 is taken as a new (remnant) rollout */
    al_span old = mk_reward("T", "r0", 3, 10 + N, "final", 1, 0);
    CHECK_EQ_INT(
        al_credit_part_add(p, off_counter++, &old, &code, reason, sizeof reason, err, sizeof err),
        0);
    al_credit_part_free(p);
}

TEST(safe_offset_never_splits_an_emitted_group)
{
    al_credit_config c = config_of(2);
    sink_t s;
    al_credit_part *p = mk_part(&c, &s);
    CHECK_EQ_INT((int)al_credit_part_safe_offset(p), -1);
    add_row rows[] = {
        {10, mk_simple("T", "r1", 0, 1), ANY, NULL, {NULL}, 10},
        {11, mk_simple("", "x", 0, 1), ANY, NULL, {NULL}, ANY}, /* open for a while */
        {12, mk_simple("T", "r2", 0, 1), ANY, NULL, {NULL}, ANY},
        {13, mk_end("T", "r1", 1, 1, AL_ROLLOUT_STATUS_SUCCEEDED, 0), ANY, NULL, {NULL}, 10},
        /* group {r1 at 10, r2 at 12} is out; x (11) is open: stopping at 11 would re-read r2
         * but not r1, so the safe offset stays at 10 */
        {14, mk_end("T", "r2", 1, 1, AL_ROLLOUT_STATUS_SUCCEEDED, 0), ANY, NULL, {NULL}, 10},
        {15, mk_end("", "x", 1, 1, AL_ROLLOUT_STATUS_SUCCEEDED, 0), ANY, NULL, {NULL}, 16},
    };
    add_rows(p, rows, 5);
    CHECK_EQ_INT(s.n, 2);
    add_rows(p, rows + 5, 1);
    al_credit_part_note_offset(p, 16); /* an undecodable message */
    CHECK_EQ_INT((int)al_credit_part_safe_offset(p), 17);
    part_close(p, &s);
}

/* An end span's sequence number counts the spans of its rollout before it. When some of
 * them come after the end (the proxy's spool retried a span after a broker error while later
 * ones got through; t1504 lost calls that way), the end waits for them: the rollout settles
 * when the last one comes, or after --end-wait (event time) with what it has. */
TEST(an_end_waits_for_the_spans_it_overtook)
{
    al_credit_config c = config_of(1);
    c.end_wait_us = 1000;
    sink_t s;
    al_credit_part *p = mk_part(&c, &s);
    int64_t first = off_counter;
    /* a: call 1, the end (sequence 3), the reward (2), then call 0 */
    CHECK_EQ_INT(feed(p, mk_simple("", "a", 1, 10)), 0);
    CHECK_EQ_INT(feed(p, mk_end("", "a", 3, 11, AL_ROLLOUT_STATUS_SUCCEEDED, 0)), 0);
    CHECK_EQ_INT((int)al_credit_part_stats(p)->rollouts_waiting, 1);
    CHECK_EQ_INT((int)al_credit_part_stats(p)->open_rollouts, 1);
    CHECK_EQ_INT(feed(p, mk_reward("", "a", 2, 12, "final", 1, 1)), 0);
    CHECK_EQ_INT(s.n, 0);
    /* a second end is refused; the first one still waits */
    add_row end2 = {ANY, mk_end("", "a", 0, 12, AL_ROLLOUT_STATUS_FAILED, 0), 1, "late_span",
                    {"has a second end"}, ANY};
    add_rows(p, &end2, 1);
    CHECK_EQ_INT((int)al_credit_part_stats(p)->rollouts_waiting, 1);
    CHECK_EQ_INT((int)al_credit_part_stats(p)->rollouts_completed, 1); /* the first end */
    CHECK_EQ_INT((int)al_credit_part_safe_offset(p), (int)first); /* a is still held */
    /* a span numbered after the end is late, waiting or not */
    add_row after = {ANY, mk_simple("", "a", 4, 13), 1, "late_span",
                     {"after the rollout's end (sequence 3)"}, ANY};
    add_rows(p, &after, 1);
    CHECK_EQ_INT(feed(p, mk_simple("", "a", 0, 14)), 0);
    REQUIRE(s.n == 2);
    CHECK_EQ_STR(tr(&s, 0)->id, "a:0:0");
    CHECK_EQ_STR(tr(&s, 1)->id, "a:0:1");
    CHECK_NEAR(tr(&s, 0)->reward, 1, 0);
    CHECK_EQ_INT((int)al_credit_part_stats(p)->rollouts_waiting, 0);
    CHECK_EQ_INT((int)al_credit_part_stats(p)->rollouts_incomplete, 0);
    CHECK_EQ_INT((int)al_credit_part_stats(p)->rollouts_completed, 1);
    CHECK_EQ_INT((int)al_credit_part_stats(p)->open_rollouts, 0);

    /* b: sequence 1 never comes in time; another rollout's span moves the clock past the end
     * wait (1000 us after b's end at 21), so b settles with call 0 alone */
    CHECK_EQ_INT(feed(p, mk_simple("", "b", 0, 20)), 0);
    CHECK_EQ_INT(feed(p, mk_end("", "b", 2, 21, AL_ROLLOUT_STATUS_SUCCEEDED, 0)), 0);
    CHECK_EQ_INT(feed(p, mk_simple("", "c", 0, 1021)), 0);
    CHECK_EQ_INT(s.n, 2); /* 1000 us exactly: not past it */
    CHECK_EQ_INT(feed(p, mk_simple("", "c", 1, 1022)), 0);
    REQUIRE(s.n == 3);
    CHECK_EQ_STR(tr(&s, 2)->id, "b:0:0");
    CHECK_EQ_INT((int)al_credit_part_stats(p)->rollouts_incomplete, 1);
    add_row b1 = {ANY, mk_simple("", "b", 1, 22), 1, "late_span", {"after the rollout ended"},
                  ANY};
    add_rows(p, &b1, 1);

    /* a retried attempt's end does not wait: nothing of it trains */
    CHECK_EQ_INT(feed(p, mk_simple("", "d", 1, 1030)), 0);
    al_span dend = mk_end("", "d", 3, 1031, AL_ROLLOUT_STATUS_FAILED, 0);
    dend.rollout_end.retried = 1;
    CHECK_EQ_INT(feed(p, dend), 0);
    CHECK_EQ_INT((int)al_credit_part_stats(p)->rollouts_waiting, 0);
    CHECK_EQ_INT((int)al_credit_part_stats(p)->rollouts_retried, 1);
    part_close(p, &s);

    /* --end-wait 0: an end settles at once (before this, always): the call that comes after
     * it is late and its rollout trains without it */
    c.end_wait_us = 0;
    p = mk_part(&c, &s);
    CHECK_EQ_INT(feed(p, mk_simple("", "e", 0, 10)), 0);
    CHECK_EQ_INT(feed(p, mk_end("", "e", 2, 11, AL_ROLLOUT_STATUS_SUCCEEDED, 0)), 0);
    REQUIRE(s.n == 1);
    CHECK_EQ_INT(feed(p, mk_simple("", "e", 1, 12)), 1);
    CHECK_EQ_INT(s.n, 1);
    part_close(p, &s);
}

TEST(resumed_remnants_are_skipped)
{
    al_credit_config c = config_of(1);
    sink_t s;
    al_credit_part *p = mk_part(&c, &s);
    /* a restart re-reads the tail of a rollout whose first spans were committed */
    feed(p, mk_reward("T", "old", 3, 1, "final", 1, 2));
    feed(p, mk_end("T", "old", 4, 1, AL_ROLLOUT_STATUS_SUCCEEDED, 0));
    CHECK_EQ_INT(s.n, 0);
    /* its end says sequences 0-2 are missing: it waits for them for the end wait (30 s) */
    CHECK_EQ_INT((int)al_credit_part_stats(p)->rollouts_waiting, 1);
    char err[256];
    CHECK_EQ_INT(al_credit_part_advance(p, 1 + 30000000, err, sizeof err), 0);
    CHECK_EQ_INT((int)al_credit_part_stats(p)->rollouts_waiting, 1);
    CHECK_EQ_INT(al_credit_part_advance(p, 2 + 30000000, err, sizeof err), 0);
    CHECK_EQ_INT((int)al_credit_part_stats(p)->rollouts_waiting, 0);
    CHECK_EQ_INT((int)al_credit_part_stats(p)->rollouts_incomplete, 1);
    CHECK_EQ_INT((int)al_credit_part_stats(p)->rollouts_skipped, 1);
    CHECK_EQ_INT((int)al_credit_part_stats(p)->open_rollouts, 0);
    feed_rollout(p, "T", "new", 1, 3 + 30000000);
    CHECK_EQ_INT(s.n, 1);
    part_close(p, &s);
}

TEST(output_does_not_depend_on_how_tasks_share_partitions)
{
    /* tasks A and B interleaved in one part vs each in a part of its own: the same bytes */
    al_credit_config c = config_of(3);
    c.merge = 1;
    sink_t one, a, b;
    al_credit_part *p1 = mk_part(&c, &one);
    al_credit_part *pa = mk_part(&c, &a);
    al_credit_part *pb = mk_part(&c, &b);
    char rid[16];
    for (int step = 0; step < 3; step++)
        for (int i = 0; i < 3; i++)
            for (int task = 0; task < 2; task++) {
                al_credit_part *own = task ? pb : pa;
                snprintf(rid, sizeof rid, "%c%d", task ? 'B' : 'A', i);
                const char *t = task ? "B" : "A";
                al_span sp;
                if (step == 0)
                    sp = mk_simple(t, rid, 0, 10 * i + task);
                else if (step == 1)
                    sp = mk_reward(t, rid, 1, 100 + i, "final", i * (task + 1), 0);
                else
                    sp = mk_end(t, rid, 2, 200 + i, AL_ROLLOUT_STATUS_SUCCEEDED, 0);
                feed(p1, sp);
                feed(own, sp);
            }
    REQUIRE(one.n == 6 && a.n == 3 && b.n == 3);
    int ia = 0, ib = 0;
    for (int i = 0; i < one.n; i++) {
        const al_transition *t = tr(&one, i);
        REQUIRE(t != NULL);
        sink_t *o = t->task_id[0] == 'A' ? &a : &b;
        int *k = t->task_id[0] == 'A' ? &ia : &ib;
        CHECKF(one.bytes[i].len == o->bytes[*k].len &&
                   !memcmp(one.bytes[i].data, o->bytes[*k].data, one.bytes[i].len),
               "transition %d differs between the shared and the own part", i);
        (*k)++;
    }
    al_credit_part_free(p1);
    al_credit_part_free(pa);
    al_credit_part_free(pb);
    sink_free(&one);
    sink_free(&a);
    sink_free(&b);
}

TEST(bad_configurations_are_refused)
{
    al_credit_config c;
    char err[256];
    sink_t s;
    al_credit_sink k = {.transition = sink_fn, .ud = &s};
    al_credit_config_init(&c);
    c.group_size = 0;
    CHECK(al_credit_part_new(&c, &k, err, sizeof err) == NULL);
    CHECKF(strstr(err, "group size") != NULL, "%s", err);
    al_credit_config_init(&c);
    c.reward_mode = AL_CREDIT_REWARD_NAMED;
    CHECK(al_credit_part_new(&c, &k, err, sizeof err) == NULL);
    CHECKF(strstr(err, "reward name") != NULL, "%s", err);
    al_credit_config_init(&c);
    c.gamma = 1.5;
    CHECK(al_credit_part_new(&c, &k, err, sizeof err) == NULL);
    al_credit_config_init(&c);
    c.timeout_reward = NAN;
    CHECK(al_credit_part_new(&c, &k, err, sizeof err) == NULL);
    CHECKF(strstr(err, "timeout and failed rewards") != NULL, "%s", err);
    al_credit_config_init(&c);
    c.failed_reward = 2 * AL_REWARD_MAX;
    CHECK(al_credit_part_new(&c, &k, err, sizeof err) == NULL);
    CHECK_EQ_INT(al_credit_estimator_parse("rloo"), AL_CREDIT_ESTIMATOR_RLOO);
    CHECK_EQ_INT(al_credit_estimator_parse("ppo"), -1);
}

/* Random streams (few rollout ids, sequences out of order and repeated, clocks going back,
 * odd group sizes, empty token arrays, every policy): nothing crashes or leaks (ASan), the
 * safe offset never decreases, and no transition is anchored below a safe offset already
 * given out. */
static int64_t random_safe;
static int random_bad_anchor;

static int random_sink(void *ud, const al_transition *t, int64_t anchor)
{
    (void)t;
    if (anchor < random_safe) random_bad_anchor++;
    (*(int *)ud)++;
    return 0;
}

static uint64_t xorshift(uint64_t *x)
{
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    return *x;
}

TEST(random_streams_keep_the_invariants)
{
    uint64_t x = 88172645463325252ULL;
#define RND() xorshift(&x)
    int total = 0;
    static const int32_t toks[] = {1, 2, 3, 4, 5, 6, 7, 8};
    static const float lps[] = {-1, -1, -1, -1, -1, -1, -1, -1};
    for (int round = 0; round < 40; round++) {
        al_credit_config c;
        al_credit_config_init(&c);
        c.estimator = (al_credit_estimator)(RND() % 5);
        c.reward_mode = (al_credit_reward_mode)(RND() % 3);
        c.reward_name = "final";
        c.assign = (al_credit_assign)(RND() % 2);
        c.gamma = (double)(RND() % 11) / 10;
        c.merge = (int)(RND() % 2);
        c.group_size = 1 + (int32_t)(RND() % 5);
        c.idle_timeout_us = (int64_t)(RND() % 3) * 50;
        c.group_timeout_us = (int64_t)(RND() % 3) * 80;
        c.timeout_policy = (al_credit_policy)(RND() % 2);
        c.failed_policy = (al_credit_policy)(RND() % 2);
        c.drop_equal_groups = (int)(RND() % 2);
        c.end_wait_us = (int64_t)(RND() % 3) * 60; /* the streams skip sequences now and then */
        int emitted = 0;
        al_credit_sink k = {.transition = random_sink, .ud = &emitted};
        char err[256], reason[256];
        al_credit_part *p = al_credit_part_new(&c, &k, err, sizeof err);
        REQUIRE(p != NULL);
        random_safe = -1;
        random_bad_anchor = 0;
        int64_t prev_safe = -1, ts = 0;
        int decreased = 0;
        int gen[12] = {0}, seq[12] = {0};
        for (int64_t off = 0; off < 600; off++) {
            char rid[16], task[8];
            int slot = (int)(RND() % 12);
            snprintf(rid, sizeof rid, "r%d-%d", slot, gen[slot]);
            snprintf(task, sizeof task, "t%d", slot % 4);
            ts += (int64_t)(RND() % 20) - 4;
            size_t np = RND() % 10 ? 2 + RND() % 3 : 0, nr = RND() % 10 ? 1 + RND() % 3 : 0;
            /* mostly in order; sometimes a repeated or skipped sequence */
            int64_t sq = RND() % 10 ? seq[slot]++ : (int64_t)(RND() % 7);
            al_span s = mk_call(RND() % 8 ? task : "", rid, sq, ts, toks, np, toks + 2, nr,
                                RND() % 3 ? lps : NULL);
            s.attempt = RND() % 20 ? 0 : 1;
            int kind = (int)(RND() % 8);
            if (kind == 3) {
                s.kind = AL_SPAN_KIND_REWARD;
                s.reward.name = RND() % 2 ? "final" : "step";
                s.reward.value = (double)(RND() % 5) - 2;
                s.reward.after_sequence = (int64_t)(RND() % 8) - 1;
            } else if (kind == 4) {
                s.kind = AL_SPAN_KIND_ROLLOUT_END;
                gen[slot]++;
                seq[slot] = 0;
                s.rollout_end.status = (al_rollout_status)(RND() % 5);
                s.rollout_end.group_size = (int32_t)(RND() % 4);
            }
            const char *code;
            int r = al_credit_part_add(p, off, &s, &code, reason, sizeof reason, err, sizeof err);
            REQUIRE(r >= 0);
            if (RND() % 50 == 0) REQUIRE(al_credit_part_advance(p, ts + 100, err, sizeof err) == 0);
            int64_t safe = al_credit_part_safe_offset(p);
            if (safe < prev_safe) decreased++;
            prev_safe = random_safe = safe;
        }
        CHECKF(!decreased, "round %d: the safe offset went down %d times", round, decreased);
        CHECKF(!random_bad_anchor, "round %d: %d transitions anchored below the safe offset", round,
               random_bad_anchor);
        CHECK_EQ_INT((int)al_credit_part_stats(p)->transitions, emitted);
        total += emitted;
        al_credit_part_free(p);
    }
    fprintf(stderr, "  (%d transitions from 40 random streams)\n", total);
    CHECKF(total > 1000, "only %d transitions in all rounds: the streams test little", total);
#undef RND
}

/* The restart contract in pure logic: a worker fed a stream up to a crash point k gives out
 * safe offset S; a fresh worker fed the stream from S to the end must bring every transition
 * of an uninterrupted run that the first worker had not emitted, byte for byte the same, and
 * anything it emits again must be byte-identical too. */
typedef struct idsink {
    char ids[512][48];
    al_buf bytes[512];
    int n;
} idsink;

static int idsink_fn(void *ud, const al_transition *t, int64_t anchor)
{
    idsink *s = ud;
    (void)anchor;
    if (s->n >= 512) return -1;
    snprintf(s->ids[s->n], sizeof s->ids[0], "%s", t->id);
    al_buf_init(&s->bytes[s->n]);
    if (al_transition_encode(t, &s->bytes[s->n], NULL, 0)) return -1;
    s->n++;
    return 0;
}

static void idsink_free(idsink *s)
{
    for (int i = 0; i < s->n; i++)
        al_buf_free(&s->bytes[i]);
    s->n = 0;
}

static int idsink_find(const idsink *s, const char *id)
{
    for (int i = 0; i < s->n; i++)
        if (!strcmp(s->ids[i], id)) return i;
    return -1;
}

TEST(restart_from_the_safe_offset_loses_nothing)
{
    enum { NR = 24, MAXS = 200 };
    static al_span stream[MAXS];
    static char rids[NR][16], tasks[NR][16];
    static const int32_t toks[] = {1, 2, 3, 4, 5, 6};
    uint64_t x = 0x1234567ULL;
    int bad_rounds = 0, crash_points = 0, moved_spans = 0, refused = 0;
    for (int round = 0; round < 30; round++) {
        /* a well-formed stream: NR rollouts of 6 tasks, 1-3 calls, reward, end; interleaved */
        int next[NR] = {0}, ncalls[NR], n = 0;
        for (int r = 0; r < NR; r++) {
            ncalls[r] = 1 + (int)(xorshift(&x) % 3);
            snprintf(rids[r], sizeof rids[r], "r%d", r);
            snprintf(tasks[r], sizeof tasks[r], "t%d", r % 6);
        }
        while (n < MAXS) {
            int r = (int)(xorshift(&x) % NR);
            if (next[r] > ncalls[r] + 1) {
                int left = 0;
                for (int k = 0; k < NR; k++)
                    left += next[k] <= ncalls[k] + 1;
                if (!left) break;
                continue;
            }
            int sq = next[r]++;
            al_span s = mk_call(tasks[r], rids[r], sq, n, toks, 2 + (size_t)sq, toks + 2, 1, NULL);
            if (sq == ncalls[r]) {
                s = mk_reward(tasks[r], rids[r], sq, n, "final", (double)(xorshift(&x) % 3),
                              sq - 1);
            } else if (sq == ncalls[r] + 1) {
                s = mk_end(tasks[r], rids[r], sq, n, AL_ROLLOUT_STATUS_SUCCEEDED, 0);
            }
            stream[n++] = s;
        }
        /* for about a third of the rollouts, a span before the end comes 0-4 spans after it
         * (the end overtook it on the way): the end waits for it */
        for (int r = 0; r < NR; r++) {
            if (xorshift(&x) % 3) continue;
            int e = -1, j = -1;
            for (int i = 0; i < n; i++)
                if (!strcmp(stream[i].rollout_id, rids[r])) {
                    if (stream[i].kind == AL_SPAN_KIND_ROLLOUT_END)
                        e = i;
                    else if (e < 0)
                        j = i;
                }
            if (e < 0 || j < 0) continue;
            int to = e + (int)(xorshift(&x) % 5);
            if (to > n - 1) to = n - 1;
            al_span moved = stream[j];
            memmove(stream + j, stream + j + 1, (size_t)(to - j) * sizeof *stream);
            stream[to] = moved;
            moved_spans++;
        }
        al_credit_config c;
        al_credit_config_init(&c);
        c.group_size = 2; /* two groups per task: a split group would change the next one */
        c.merge = (int)(xorshift(&x) % 2);
        c.idle_timeout_us = c.group_timeout_us = 0;
        idsink full = {0}, before = {0}, after = {0};
        al_credit_sink k = {.transition = idsink_fn, .ud = &full};
        char err[256], reason[256];
        const char *code;
        al_credit_part *p = al_credit_part_new(&c, &k, err, sizeof err);
        for (int i = 0; i < n; i++)
            if (al_credit_part_add(p, i, &stream[i], &code, reason, sizeof reason, err,
                                   sizeof err) != 0 &&
                refused++ < 3)
                fprintf(stderr, "  round %d: %s: %s\n", round, code ? code : "error", reason);
        CHECK_EQ_INT((int)al_credit_part_stats(p)->rollouts_waiting, 0);
        al_credit_part_free(p);
        for (int crash = 1; crash < n; crash += 3) {
            k.ud = &before;
            p = al_credit_part_new(&c, &k, err, sizeof err);
            for (int i = 0; i < crash; i++)
                al_credit_part_add(p, i, &stream[i], &code, reason, sizeof reason, err, sizeof err);
            int64_t safe = al_credit_part_safe_offset(p);
            al_credit_part_free(p);
            k.ud = &after;
            p = al_credit_part_new(&c, &k, err, sizeof err);
            for (int i = (int)safe; i < n; i++)
                al_credit_part_add(p, i, &stream[i], &code, reason, sizeof reason, err, sizeof err);
            al_credit_part_free(p);
            crash_points++;
            int lost = 0, differ = 0, extra = 0;
            for (int i = 0; i < full.n; i++) {
                int b = idsink_find(&before, full.ids[i]), a = idsink_find(&after, full.ids[i]);
                if (b < 0 && a < 0) lost++;
                if (b >= 0 && (before.bytes[b].len != full.bytes[i].len ||
                               memcmp(before.bytes[b].data, full.bytes[i].data, full.bytes[i].len)))
                    differ++;
                if (a >= 0 && (after.bytes[a].len != full.bytes[i].len ||
                               memcmp(after.bytes[a].data, full.bytes[i].data, full.bytes[i].len)))
                    differ++;
            }
            for (int i = 0; i < after.n; i++)
                extra += idsink_find(&full, after.ids[i]) < 0;
            if (lost || differ || extra) {
                if (bad_rounds++ < 3)
                    fprintf(stderr,
                            "  round %d (crash at %d of %d, safe %lld, merge %d): %d lost, "
                            "%d differ, %d unexpected\n",
                            round, crash, n, (long long)safe, c.merge, lost, differ, extra);
            }
            idsink_free(&before);
            idsink_free(&after);
        }
        CHECK(full.n > 0);
        idsink_free(&full);
        idsink_free(&before);
        idsink_free(&after);
    }
    CHECKF(bad_rounds == 0, "%d of %d crash points broke the contract", bad_rounds, crash_points);
    CHECKF(refused == 0, "%d spans refused (every span of these streams belongs)", refused);
    fprintf(stderr, "  (%d crash points, %d spans that came after their end)\n", crash_points,
            moved_spans);
    CHECK(moved_spans > 50);
}
