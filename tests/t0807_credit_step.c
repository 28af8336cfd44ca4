/* t0807: --credit step (credit.h "Step credit"), each expected value worked out by hand from
 * the documented formula: call k's advantage = A_E + w A_S, A_E its return G_k
 * (gamma^(T-1-k) R with one final reward) against position k's G across the group, A_S
 * G_k against the G of the group's calls with the same prompt token ids; 0 without a twin
 * or without spread.
 *
 * The group of the first tests: four rollouts of one task, two calls, one final reward.
 * Call 0's prompt is {1, 2} for all four; a and b answer {5}, c and d {6}; call 1's prompt
 * is call 0's, its answer and the agent's token 9, so a and b share one call-1 state and c
 * and d another. Rewards 1, 0, 0.5, 0.5. */
#include "testlib.h"

#include "credit.h"
#include "t0849_credit_helpers.h"

static al_credit_config config(al_credit_estimator e, double gamma, double w)
{
    al_credit_config c;
    al_credit_config_init(&c);
    c.assign = AL_CREDIT_ASSIGN_STEP;
    c.estimator = e;
    c.gamma = gamma;
    c.step_weight = w;
    c.step_state = AL_CREDIT_STATE_PROMPT; /* the observed state is the last test's */
    c.group_size = 4;
    return c;
}

/* A rollout: call 0 answers a0, call 1 (prompt: call 0's, a0, 9) answers 7; reward R after
 * call 1; end. */
static void feed_two(al_credit_part *p, const char *rid, int32_t a0, double R, int64_t ts)
{
    const int32_t p0[] = {1, 2}, r0[] = {a0}, p1[] = {1, 2, a0, 9}, r1[] = {7};
    feed(p, mk_call("T", rid, 0, ts, p0, 2, r0, 1, NULL));
    feed(p, mk_call("T", rid, 1, ts + 1, p1, 4, r1, 1, NULL));
    feed(p, mk_reward("T", rid, 2, ts + 2, "reward", R, 1));
    feed(p, mk_end("T", rid, 3, ts + 3, AL_ROLLOUT_STATUS_SUCCEEDED, 0));
}

static double adv_of(sink_t *s, const char *rid, int seq)
{
    char id[64];
    snprintf(id, sizeof id, "%s:0:%d", rid, seq);
    const al_transition *t = tr_id(s, id);
    return t ? t->advantage : NAN;
}

static void feed_group(al_credit_part *p, const int32_t *a0, const double *R)
{
    const char *rid[4] = {"a", "b", "c", "d"};
    for (int i = 0; i < 4; i++)
        feed_two(p, rid[i], a0[i], R[i], 10 * i);
}

/* grpo, gamma 1, w 1. S = 1, 0, .5, .5: mean .5, population std sqrt(.125); A_E = +-.5 /
 * (sqrt(.125) + eps) for a and b, 0 for c and d. Call 0: one step group of all four, G_0 =
 * S, so A_S = A_E and the advantage is 2 A_E. Call 1: {a, b} with G 1, 0: A_S = +-.5 / (.5
 * + eps); {c, d} has no spread: A_S = 0. */
TEST(final_reward_grpo_step_groups_by_prompt)
{
    al_credit_config c = config(AL_CREDIT_ESTIMATOR_GRPO, 1, 1);
    sink_t s;
    al_credit_part *p = mk_part(&c, &s);
    REQUIRE(p != NULL);
    const int32_t a0[4] = {5, 5, 6, 6};
    const double R[4] = {1, 0, 0.5, 0.5};
    feed_group(p, a0, R);
    REQUIRE(s.n == 8);
    double ae = 0.5 / (sqrt(0.125) + 1e-6), as1 = 0.5 / (0.5 + 1e-6);
    CHECK_NEAR(adv_of(&s, "a", 0), 2 * ae, 1e-12);
    CHECK_NEAR(adv_of(&s, "b", 0), -2 * ae, 1e-12);
    CHECK_NEAR(adv_of(&s, "c", 0), 0, 0);
    CHECK_NEAR(adv_of(&s, "a", 1), ae + as1, 1e-12);
    CHECK_NEAR(adv_of(&s, "b", 1), -ae - as1, 1e-12);
    CHECK_NEAR(adv_of(&s, "c", 1), 0, 0);
    CHECK_NEAR(adv_of(&s, "d", 1), 0, 0);
    /* the transitions carry the per-call reward and return, as under discounted credit */
    const al_transition *t = tr_id(&s, "a:0:0");
    REQUIRE(t != NULL);
    CHECK_NEAR(t->reward, 0, 0);
    CHECK_NEAR(t->return_value, 1, 0);
    al_credit_part_free(p);
    sink_free(&s);
}

/* dr_grpo, gamma .5, w 2. Call 0: G_0 = .5 S = .5, 0, .25, .25, mean .25: A_E = A_S = .25,
 * -.25, 0, 0 (all four share the prompt): advantage .25 + 2 (.25) = .75, -.75, 0, 0. Call 1:
 * G_1 = S: A_E = S - .5 = .5, -.5, 0, 0; {a, b}: A_S = +-.5, so +-(.5 + 1) = +-1.5; {c, d}: 0. */
TEST(final_reward_dr_grpo_discount_and_weight)
{
    al_credit_config c = config(AL_CREDIT_ESTIMATOR_DR_GRPO, 0.5, 2);
    sink_t s;
    al_credit_part *p = mk_part(&c, &s);
    REQUIRE(p != NULL);
    const int32_t a0[4] = {5, 5, 6, 6};
    const double R[4] = {1, 0, 0.5, 0.5};
    feed_group(p, a0, R);
    REQUIRE(s.n == 8);
    CHECK_NEAR(adv_of(&s, "a", 0), 0.75, 1e-15);
    CHECK_NEAR(adv_of(&s, "b", 0), -0.75, 1e-15);
    CHECK_NEAR(adv_of(&s, "d", 0), 0, 0);
    CHECK_NEAR(adv_of(&s, "a", 1), 1.5, 1e-15);
    CHECK_NEAR(adv_of(&s, "b", 1), -1.5, 1e-15);
    CHECK_NEAR(adv_of(&s, "c", 1), 0, 0);
    CHECK_NEAR(tr_id(&s, "a:0:0")->return_value, 0.5, 0);
    al_credit_part_free(p);
    sink_free(&s);
}

/* Every call 1 from its own state (four different answers to call 0): no twins, so call 1
 * has the episode's advantage alone (dr_grpo: S - .5), and call 0 (all twins) A_E + A_S =
 * 2 (S - .5). With w 0 the estimator is identical credit: every call A_E. */
TEST(no_twin_falls_back_to_the_episode)
{
    for (int w = 0; w <= 1; w++) {
        al_credit_config c = config(AL_CREDIT_ESTIMATOR_DR_GRPO, 1, w);
        sink_t s;
        al_credit_part *p = mk_part(&c, &s);
        REQUIRE(p != NULL);
        const int32_t a0[4] = {5, 6, 7, 8};
        const double R[4] = {1, 0, 0.5, 0.25};
        feed_group(p, a0, R);
        REQUIRE(s.n == 8);
        const char *rid[4] = {"a", "b", "c", "d"};
        double mean = (1 + 0 + 0.5 + 0.25) / 4;
        for (int i = 0; i < 4; i++) {
            CHECK_NEAR(adv_of(&s, rid[i], 1), R[i] - mean, 1e-15);
            CHECK_NEAR(adv_of(&s, rid[i], 0), (1 + w) * (R[i] - mean), 1e-15);
        }
        al_credit_part_free(p);
        sink_free(&s);
    }
}

/* Per-call rewards under step credit: a gets 0 after call 0 and 1 after call 1, b 1 and 0.
 * Call 0: G_0 = 1, 1 (gamma 1), no spread at position 0 nor in its step group: 0. Call 1:
 * G_1 = 1, 0: A_E = +-.5 (position 1), A_S = +-.5 (one step group): +-1. A reward after
 * each call keeps its use: call 1 is not credited with call 0's reward. */
TEST(per_call_rewards_keep_their_positions)
{
    al_credit_config c = config(AL_CREDIT_ESTIMATOR_DR_GRPO, 1, 1);
    c.group_size = 2;
    c.drop_equal_groups = 1;
    sink_t s;
    al_credit_part *p = mk_part(&c, &s);
    REQUIRE(p != NULL);
    const char *rid[2] = {"a", "b"};
    for (int i = 0; i < 2; i++) {
        const int32_t p0[] = {1, 2}, r0[] = {5}, p1[] = {1, 2, 5, 9}, r1[] = {7};
        feed(p, mk_call("T", rid[i], 0, 10 * i, p0, 2, r0, 1, NULL));
        feed(p, mk_reward("T", rid[i], 1, 10 * i + 1, "r", i ? 1 : 0, 0));
        feed(p, mk_call("T", rid[i], 2, 10 * i + 2, p1, 4, r1, 1, NULL));
        feed(p, mk_reward("T", rid[i], 3, 10 * i + 3, "r", i ? 0 : 1, 2));
        feed(p, mk_end("T", rid[i], 4, 10 * i + 4, AL_ROLLOUT_STATUS_SUCCEEDED, 0));
    }
    REQUIRE(s.n == 4);
    CHECK_NEAR(adv_of(&s, "a", 0), 0, 0);
    CHECK_NEAR(adv_of(&s, "b", 0), 0, 0);
    CHECK_NEAR(adv_of(&s, "a", 2), 1, 0);
    CHECK_NEAR(adv_of(&s, "b", 2), -1, 0);
    CHECK(al_credit_part_stats(p)->groups_dropped_equal == 0);
    al_credit_part_free(p);
    sink_free(&s);
}

/* The observed state (the default): call 1's prompt extends call 0's prompt and answer, so
 * its state is {1, 2} then 9, the same for all four whatever they answered: one step group
 * {a, b, c, d} with G_1 = S. grpo, gamma 1, w 1: call 1's advantage is 2 A_E, as call 0's.
 * A rollout whose call 1 does not extend its call 0 (e: prompt {1, 2, 5, 9} after answering
 * {6}) has its prompt as its state, with no twin. */
TEST(observed_state_leaves_the_models_answers_out)
{
    al_credit_config c = config(AL_CREDIT_ESTIMATOR_GRPO, 1, 1);
    c.step_state = AL_CREDIT_STATE_OBSERVED;
    c.group_size = 5;
    sink_t s;
    al_credit_part *p = mk_part(&c, &s);
    REQUIRE(p != NULL);
    const int32_t a0[4] = {5, 5, 6, 6};
    const double R[4] = {1, 0, 0.5, 0.5};
    feed_group(p, a0, R);
    const int32_t p0[] = {1, 2}, r0[] = {6}, p1[] = {1, 2, 5, 9}, r1[] = {7};
    feed(p, mk_call("T", "e", 0, 50, p0, 2, r0, 1, NULL));
    feed(p, mk_call("T", "e", 1, 51, p1, 4, r1, 1, NULL));
    feed(p, mk_reward("T", "e", 2, 52, "reward", 0.5, 1));
    feed(p, mk_end("T", "e", 3, 53, AL_ROLLOUT_STATUS_SUCCEEDED, 0));
    REQUIRE(s.n == 10);
    /* S = 1, 0, .5, .5, .5: mean .5, std sqrt(.1); e is at the mean */
    double ae = 0.5 / (sqrt(0.1) + 1e-6);
    /* call 1 of a..d: one step group, G 1, 0, .5, .5: mean .5, std sqrt(.125) */
    double as = 0.5 / (sqrt(0.125) + 1e-6);
    CHECK_NEAR(adv_of(&s, "a", 0), 2 * ae, 1e-12);
    CHECK_NEAR(adv_of(&s, "a", 1), ae + as, 1e-12);
    CHECK_NEAR(adv_of(&s, "b", 1), -ae - as, 1e-12);
    CHECK_NEAR(adv_of(&s, "c", 1), 0, 1e-12);
    CHECK_NEAR(adv_of(&s, "e", 1), 0, 1e-12);
    al_credit_part_free(p);
    sink_free(&s);
}

/* What step credit refuses: reinforce (no group to compare a step with), a weight outside
 * [0, 100]. */
TEST(step_config_errors)
{
    sink_t s;
    char err[256];
    al_credit_sink k = {.transition = sink_fn, .ud = &s};
    al_credit_config c = config(AL_CREDIT_ESTIMATOR_REINFORCE, 1, 1);
    CHECK(al_credit_part_new(&c, &k, err, sizeof err) == NULL);
    CHECK(strstr(err, "reinforce") != NULL);
    c = config(AL_CREDIT_ESTIMATOR_GRPO, 1, -1);
    CHECK(al_credit_part_new(&c, &k, err, sizeof err) == NULL);
    CHECK(strstr(err, "step weight") != NULL);
}

