/* t0803: what a transition's reward and return_value are, with and without --merge, under
 * identical and discounted credit. Every expected value is worked out here from the
 * definitions in schemas/transition.avsc and the README's "Credit assignment":
 *   identical:  reward = return_value = R, the rollout's reward, for every sequence, merged
 *               or not;
 *   discounted: r_k = the rewards that followed call k, G_k = r_k + gamma G_{k+1}; a
 *               sequence of calls k..e-1 has reward r_k + ... + r_{e-1} and return G_k. */
#include "testlib.h"

#include "credit.h"
#include "t0849_credit_helpers.h"

static al_credit_config config(al_credit_assign assign, int merge, double gamma)
{
    al_credit_config c;
    al_credit_config_init(&c);
    c.assign = assign;
    c.merge = merge;
    c.gamma = gamma;
    c.group_size = 2;
    c.estimator = AL_CREDIT_ESTIMATOR_DR_GRPO; /* advantage = return - the group's mean */
    return c;
}

/* The examples: a rollout with reward 1.0 and two merged calls has reward 1.0 (not
 * 2.0); three merged calls with 0.5 have 0.5 (not 1.5). */
TEST(identical_credit_a_merged_sequence_has_the_rollouts_reward)
{
    const double two[2] = {NAN, 1.0}, three[3] = {NAN, NAN, 0.5};
    for (int merge = 0; merge < 2; merge++) {
        al_credit_config c = config(AL_CREDIT_ASSIGN_IDENTICAL, merge, 1);
        sink_t s;
        al_credit_part *p = mk_part(&c, &s);
        feed_chain(p, "T", "a", 2, two, 1, 1, AL_ROLLOUT_STATUS_SUCCEEDED, 1);
        feed_chain(p, "T", "b", 3, three, 1, 1, AL_ROLLOUT_STATUS_SUCCEEDED, 10);
        REQUIRE(s.n == (merge ? 2 : 5));
        for (int i = 0; i < s.n; i++) {
            const al_transition *t = tr(&s, i);
            REQUIRE(t != NULL);
            double R = t->rollout_id[0] == 'a' ? 1.0 : 0.5;
            size_t calls = t->rollout_id[0] == 'a' ? 2 : 3;
            CHECK_EQ_INT((int)t->n_call_indices, merge ? (int)calls : 1);
            CHECKF(t->reward == R && t->return_value == R,
                   "merge %d, %s: reward %g, return %g; want %g for both", merge, t->id, t->reward,
                   t->return_value, R);
            /* the group's mean is (1.0 + 0.5) / 2 */
            CHECK_NEAR(t->advantage, R - 0.75, 0);
            CHECK_EQ_INT((int)t->n_token_advantages, 0);
        }
        al_credit_part_free(p);
        sink_free(&s);
    }
}

/* --reward sum under identical credit: R is the sum of all reward spans, and that is every
 * sequence's reward however many calls it merges. */
TEST(identical_credit_sum_of_rewards_is_not_counted_per_call)
{
    const double rk[3] = {0.25, NAN, 0.5}; /* R = 0.75 */
    for (int merge = 0; merge < 2; merge++) {
        al_credit_config c = config(AL_CREDIT_ASSIGN_IDENTICAL, merge, 1);
        c.reward_mode = AL_CREDIT_REWARD_SUM;
        c.group_size = 1;
        sink_t s;
        al_credit_part *p = mk_part(&c, &s);
        feed_chain(p, "T", "a", 3, rk, 1, 1, AL_ROLLOUT_STATUS_SUCCEEDED, 1);
        REQUIRE(s.n == (merge ? 1 : 3));
        for (int i = 0; i < s.n; i++) {
            CHECK_NEAR(tr(&s, i)->reward, 0.75, 0);
            CHECK_NEAR(tr(&s, i)->return_value, 0.75, 0);
        }
        al_credit_part_free(p);
        sink_free(&s);
    }
}

/* Discounted, one transition per call: reward r_k, return G_k. Rewards 1 after call 0,
 * none after call 1, 2 and 0.5 after call 2 (two spans add up): r = [1, 0, 2.5];
 * gamma 0.5: G_2 = 2.5, G_1 = 0 + 0.5 * 2.5 = 1.25, G_0 = 1 + 0.5 * 1.25 = 1.625. */
TEST(discounted_credit_each_call_has_its_reward_and_return)
{
    al_credit_config c = config(AL_CREDIT_ASSIGN_DISCOUNTED, 0, 0.5);
    c.group_size = 1;
    c.estimator = AL_CREDIT_ESTIMATOR_NONE;
    sink_t s;
    al_credit_part *p = mk_part(&c, &s);
    const double rk[3] = {1, NAN, 2};
    int64_t seq = feed_chain(p, "T", "a", 3, rk, 1, 0, AL_ROLLOUT_STATUS_SUCCEEDED, 1);
    feed(p, mk_reward("T", "a", seq, 20, "other", 0.5, 3)); /* after call 2 (sequence 3) */
    feed(p, mk_end("T", "a", seq + 1, 21, AL_ROLLOUT_STATUS_SUCCEEDED, 0));
    REQUIRE(s.n == 3);
    const double r[3] = {1, 0, 2.5}, g[3] = {1.625, 1.25, 2.5};
    for (int i = 0; i < 3; i++) {
        const al_transition *t = tr(&s, i);
        REQUIRE(t != NULL);
        CHECKF(t->reward == r[i] && t->return_value == g[i] && t->advantage == g[i],
               "call %d: reward %g return %g advantage %g; want %g %g %g", i, t->reward,
               t->return_value, t->advantage, r[i], g[i], g[i]);
    }
    al_credit_part_free(p);
    sink_free(&s);
}

/* Discounted and merged: the sequence's reward is the sum of its calls' r_k, its return
 * the first call's G_k. The same rewards as above (r = [1, 0, 2.5], G = [1.625, 1.25,
 * 2.5]): all three calls merged give reward 3.5 and return 1.625; with call 2 in a new
 * context, calls 0-1 give reward 1 + 0 and return 1.625, call 2 reward 2.5, return 2.5. */
TEST(discounted_credit_a_merged_sequence_sums_its_calls_rewards)
{
    for (int split = 0; split < 2; split++) {
        al_credit_config c = config(AL_CREDIT_ASSIGN_DISCOUNTED, 1, 0.5);
        c.group_size = 1;
        c.estimator = AL_CREDIT_ESTIMATOR_NONE;
        sink_t s;
        al_credit_part *p = mk_part(&c, &s);
        const int32_t p0[] = {1, 2}, r0[] = {3, 4}, p1[] = {1, 2, 3, 4, 9}, r1[] = {5};
        const int32_t p2a[] = {1, 2, 3, 4, 9, 5, 8}, p2b[] = {7}, r2[] = {6, 6};
        feed(p, mk_call("T", "a", 0, 1, p0, 2, r0, 2, NULL));
        feed(p, mk_reward("T", "a", 1, 2, "r", 1, 0));
        feed(p, mk_call("T", "a", 2, 3, p1, 5, r1, 1, NULL));
        if (split)
            feed(p, mk_call("T", "a", 3, 4, p2b, 1, r2, 2, NULL));
        else
            feed(p, mk_call("T", "a", 3, 4, p2a, 7, r2, 2, NULL));
        feed(p, mk_reward("T", "a", 4, 5, "r", 2, 3));
        feed(p, mk_reward("T", "a", 5, 6, "r", 0.5, 3));
        feed(p, mk_end("T", "a", 6, 7, AL_ROLLOUT_STATUS_SUCCEEDED, 0));
        REQUIRE(s.n == (split ? 2 : 1));
        const al_transition *t = tr(&s, 0);
        REQUIRE(t != NULL);
        CHECK_EQ_INT((int)t->n_call_indices, split ? 2 : 3);
        CHECK_NEAR(t->reward, split ? 1 : 3.5, 0);
        CHECK_NEAR(t->return_value, 1.625, 0);
        CHECK_NEAR(t->advantage, 1.625, 0); /* estimator none: advantage = return */
        if (split) {
            t = tr(&s, 1);
            REQUIRE(t != NULL);
            CHECK_EQ_STR(t->id, "a:0:3");
            CHECK_NEAR(t->reward, 2.5, 0);
            CHECK_NEAR(t->return_value, 2.5, 0);
        }
        al_credit_part_free(p);
        sink_free(&s);
    }
}

/* Discounted: a kept failed rollout without a reward has the failed reward at its last call
 * (r = [0, 0, d]), so G_k = gamma^(2-k) d; merged, its reward is d. */
TEST(discounted_credit_the_default_reward_belongs_to_the_last_call)
{
    for (int merge = 0; merge < 2; merge++) {
        al_credit_config c = config(AL_CREDIT_ASSIGN_DISCOUNTED, merge, 0.5);
        c.group_size = 1;
        c.estimator = AL_CREDIT_ESTIMATOR_NONE;
        c.failed_policy = AL_CREDIT_POLICY_KEEP;
        c.failed_reward = -2;
        sink_t s;
        al_credit_part *p = mk_part(&c, &s);
        feed_chain(p, "T", "a", 3, NULL, 1, 1, AL_ROLLOUT_STATUS_FAILED, 1);
        REQUIRE(s.n == (merge ? 1 : 3));
        if (merge) {
            CHECK_NEAR(tr(&s, 0)->reward, -2, 0);
            CHECK_NEAR(tr(&s, 0)->return_value, -0.5, 0); /* 0.25 * -2 */
            static const float want[] = {-0.5f, -0.5f, 0, -1, -1, 0, -2, -2};
            REQUIRE(tr(&s, 0)->n_token_advantages == 8);
            for (int i = 0; i < 8; i++)
                CHECKF(tr(&s, 0)->token_advantages[i] == want[i], "token %d: %g, want %g", i,
                       tr(&s, 0)->token_advantages[i], want[i]);
        } else {
            const double r[3] = {0, 0, -2}, g[3] = {-0.5, -1, -2};
            for (int i = 0; i < 3; i++) {
                CHECK_NEAR(tr(&s, i)->reward, r[i], 0);
                CHECK_NEAR(tr(&s, i)->return_value, g[i], 0);
            }
        }
        CHECK_EQ_INT((int)al_credit_part_stats(p)->rollouts_no_reward, 1);
        al_credit_part_free(p);
        sink_free(&s);
    }
}
