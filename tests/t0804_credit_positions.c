/* t0804: advantages under --credit discounted, worked out here from the documented
 * definition (README "Credit assignment", credit.h "Credit, exactly"):
 *   - call position k (0-based) of a rollout is its k-th call; position k's statistics are
 *     over the returns G_k of the group's rollouts that have a call k;
 *   - grpo: (G_k - mean_k) / (std_k + eps), std the population std; dr_grpo: G_k - mean_k;
 *     rloo: G_k - the mean of the others' G_k; none: G_k; reinforce: G_k minus the task's
 *     running baseline of position k;
 *   - a position whose std is at most 1e-9 times its largest |G_k| (no spread; one rollout
 *     only) gives 0 under grpo, dr_grpo and rloo;
 *   - a merged sequence carries call j's advantage on call j's tokens, 0 on the agent's.
 * The two-call case of issue 18 (position 0 without spread) is the first test. */
#include "testlib.h"

#include "credit.h"
#include "t0849_credit_helpers.h"

static al_credit_config config(al_credit_estimator e, double gamma, int32_t gsize)
{
    al_credit_config c;
    al_credit_config_init(&c);
    c.assign = AL_CREDIT_ASSIGN_DISCOUNTED;
    c.estimator = e;
    c.gamma = gamma;
    c.group_size = gsize;
    return c;
}

/* The advantage of the transition whose first call is call k of rollout rid (calls are at
 * sequence 2k when every call has a reward span after it). */
static double adv_of(sink_t *s, const char *rid, int seq)
{
    char id[64];
    snprintf(id, sizeof id, "%s:0:%d", rid, seq);
    const al_transition *t = tr_id(s, id);
    return t ? t->advantage : NAN;
}

/* Four rollouts, two calls each, gamma 0 (each call's return is its own reward): every
 * rollout gets 1 for call 0, and 0, 1, 0, 1 for call 1. Position 0 has no spread: its
 * advantages are exactly 0 (before, each was divided by 0 + eps, and call 1's returns were
 * compared with call 0's mean 1: -1e6 and 0). Position 1: mean 0.5, population std 0.5, so
 * -+0.5 / (0.5 + 1e-6). Nothing exceeds sqrt(n - 1) = sqrt(3). */
TEST(two_calls_one_position_without_spread)
{
    for (int e = AL_CREDIT_ESTIMATOR_GRPO; e <= AL_CREDIT_ESTIMATOR_RLOO; e++) {
        al_credit_config c = config((al_credit_estimator)e, 0, 4);
        sink_t s;
        al_credit_part *p = mk_part(&c, &s);
        const char *rid[4] = {"a", "b", "c", "d"};
        for (int i = 0; i < 4; i++) {
            const double rk[2] = {1, (double)(i % 2)};
            feed_chain(p, "T", rid[i], 2, rk, 0, 1, AL_ROLLOUT_STATUS_SUCCEEDED, 10 * i);
        }
        REQUIRE(s.n == 8);
        /* position 1: grpo z-scores; dr_grpo -+0.5; rloo 0 - 2/3 and 1 - 1/3 */
        double lo = e == AL_CREDIT_ESTIMATOR_GRPO      ? -0.5 / (0.5 + 1e-6)
                    : e == AL_CREDIT_ESTIMATOR_DR_GRPO ? -0.5
                                                       : -2.0 / 3;
        double hi = e == AL_CREDIT_ESTIMATOR_GRPO      ? 0.5 / (0.5 + 1e-6)
                    : e == AL_CREDIT_ESTIMATOR_DR_GRPO ? 0.5
                                                       : 2.0 / 3;
        for (int i = 0; i < 4; i++) {
            CHECKF(adv_of(&s, rid[i], 0) == 0, "%s: call 0 of %s has advantage %g, want 0",
                   al_credit_estimator_name(e), rid[i], adv_of(&s, rid[i], 0));
            CHECK_NEAR(adv_of(&s, rid[i], 2), i % 2 ? hi : lo, 1e-12);
        }
        for (int i = 0; i < s.n; i++)
            CHECK(fabs(tr(&s, i)->advantage) <= sqrt(3.0));
        al_credit_part_free(p);
        sink_free(&s);
    }
}

/* The same with gamma 1: G_0 = 1 + r_1 = 1, 2, 1, 2 now has spread, and position 0 learns
 * too: -+1/2 / (1/2 + eps) (mean 1.5, std 0.5). */
TEST(two_calls_with_gamma_one_both_positions_learn)
{
    al_credit_config c = config(AL_CREDIT_ESTIMATOR_GRPO, 1, 4);
    sink_t s;
    al_credit_part *p = mk_part(&c, &s);
    const char *rid[4] = {"a", "b", "c", "d"};
    for (int i = 0; i < 4; i++) {
        const double rk[2] = {1, (double)(i % 2)};
        feed_chain(p, "T", rid[i], 2, rk, 0, 1, AL_ROLLOUT_STATUS_SUCCEEDED, 10 * i);
    }
    REQUIRE(s.n == 8);
    double z = 0.5 / (0.5 + 1e-6);
    for (int i = 0; i < 4; i++) {
        CHECK_NEAR(adv_of(&s, rid[i], 0), i % 2 ? z : -z, 1e-12);
        CHECK_NEAR(adv_of(&s, rid[i], 2), i % 2 ? z : -z, 1e-12);
    }
    al_credit_part_free(p);
    sink_free(&s);
}

/* Merged, the two-call case: the sequence's tokens are call 0's response (2 tokens), the
 * agent's token, call 1's response (2 tokens); token advantages 0, 0 | 0 | A_1, A_1 with
 * A_1 position 1's -+0.5 / (0.5 + eps); the scalar advantage is call 0's, 0. */
TEST(merged_two_calls_carry_each_positions_advantage)
{
    al_credit_config c = config(AL_CREDIT_ESTIMATOR_GRPO, 0, 4);
    c.merge = 1;
    sink_t s;
    al_credit_part *p = mk_part(&c, &s);
    const char *rid[4] = {"a", "b", "c", "d"};
    for (int i = 0; i < 4; i++) {
        const double rk[2] = {1, (double)(i % 2)};
        feed_chain(p, "T", rid[i], 2, rk, 1, 1, AL_ROLLOUT_STATUS_SUCCEEDED, 10 * i);
    }
    REQUIRE(s.n == 4);
    float z = (float)(0.5 / (0.5 + 1e-6));
    for (int i = 0; i < 4; i++) {
        const al_transition *t = tr(&s, i);
        REQUIRE(t != NULL);
        int up = (t->rollout_id[0] - 'a') % 2;
        CHECK_NEAR(t->advantage, 0, 0);
        CHECK_NEAR(t->reward, 1 + up, 0); /* r_0 + r_1 */
        CHECK_NEAR(t->return_value, 1, 0); /* G_0 with gamma 0 */
        REQUIRE(t->n_token_advantages == 5 && t->n_loss_mask == 5);
        const float want[5] = {0, 0, 0, up ? z : -z, up ? z : -z};
        const uint8_t mask[5] = {1, 1, 0, 1, 1};
        for (int k = 0; k < 5; k++) {
            CHECKF(t->token_advantages[k] == want[k], "%s token %d: %g, want %g", t->id, k,
                   t->token_advantages[k], want[k]);
            CHECK(t->loss_mask[k] == mask[k]);
        }
    }
    al_credit_part_free(p);
    sink_free(&s);
}

/* Rollouts of 1, 2 and 3 calls, gamma 0: a gets [1], b [0, 2], c [2, 4, 7]. Position 0 is
 * {1, 0, 2} (mean 1, population std sqrt(2/3)), position 1 {2, 4} (b, c: mean 3, std 1),
 * position 2 {7} (c alone: 0 but for none). */
TEST(rollouts_of_different_lengths)
{
    struct {
        al_credit_estimator e;
        double a0, b0, b1, c0, c1, c2;
    } want[] = {
        {AL_CREDIT_ESTIMATOR_GRPO, 0, -1 / (sqrt(2.0 / 3) + 1e-6), -1 / (1 + 1e-6),
         1 / (sqrt(2.0 / 3) + 1e-6), 1 / (1 + 1e-6), 0},
        {AL_CREDIT_ESTIMATOR_DR_GRPO, 0, -1, -1, 1, 1, 0},
        /* leave one out: 1 - (0 + 2) / 2, 0 - (1 + 2) / 2, 2 - 4, 2 - (1 + 0) / 2, 4 - 2 */
        {AL_CREDIT_ESTIMATOR_RLOO, 0, -1.5, -2, 1.5, 2, 0},
        {AL_CREDIT_ESTIMATOR_NONE, 1, 0, 2, 2, 4, 7},
    };
    for (size_t w = 0; w < sizeof want / sizeof *want; w++) {
        al_credit_config c = config(want[w].e, 0, 3);
        sink_t s;
        al_credit_part *p = mk_part(&c, &s);
        const double ra[1] = {1}, rb[2] = {0, 2}, rc[3] = {2, 4, 7};
        feed_chain(p, "T", "a", 1, ra, 0, 1, AL_ROLLOUT_STATUS_SUCCEEDED, 1);
        feed_chain(p, "T", "b", 2, rb, 0, 1, AL_ROLLOUT_STATUS_SUCCEEDED, 10);
        feed_chain(p, "T", "c", 3, rc, 0, 1, AL_ROLLOUT_STATUS_SUCCEEDED, 20);
        REQUIRE(s.n == 6);
        const char *e = al_credit_estimator_name(want[w].e);
        CHECKF(fabs(adv_of(&s, "a", 0) - want[w].a0) < 1e-12, "%s a0 %g", e, adv_of(&s, "a", 0));
        CHECKF(fabs(adv_of(&s, "b", 0) - want[w].b0) < 1e-12, "%s b0 %g", e, adv_of(&s, "b", 0));
        CHECKF(fabs(adv_of(&s, "b", 2) - want[w].b1) < 1e-12, "%s b1 %g", e, adv_of(&s, "b", 2));
        CHECKF(fabs(adv_of(&s, "c", 0) - want[w].c0) < 1e-12, "%s c0 %g", e, adv_of(&s, "c", 0));
        CHECKF(fabs(adv_of(&s, "c", 2) - want[w].c1) < 1e-12, "%s c1 %g", e, adv_of(&s, "c", 2));
        CHECKF(fabs(adv_of(&s, "c", 4) - want[w].c2) < 1e-12, "%s c2 %g", e, adv_of(&s, "c", 4));
        for (int i = 0; i < s.n; i++)
            CHECK_EQ_INT(tr(&s, i)->group_size, 3);
        al_credit_part_free(p);
        sink_free(&s);
    }
}

/* reinforce keeps one running baseline per task and position (alpha 0.5; a baseline starts
 * at the mean of the first group that reaches its position). Two calls, gamma 0.
 *   group 1: position 0 {1, 3}, position 1 {0, 2}: baselines 2 and 1 -> -1, 1 | -1, 1;
 *            then b0 = 2 + 0.5 (2 - 2) = 2, b1 = 1
 *   group 2: {4, 4}, {1, 1}: 2, 2 | 0, 0; then b0 = 2 + 0.5 (4 - 2) = 3, b1 = 1
 *   group 3: {3, 5}, {0, 0} and a third call {6} of the second rollout only: 0, 2 | -1, -1
 *            | 0 (position 2's baseline starts at 6) */
TEST(reinforce_has_a_baseline_per_task_and_position)
{
    al_credit_config c = config(AL_CREDIT_ESTIMATOR_REINFORCE, 0, 2);
    c.reinforce_alpha = 0.5;
    sink_t s;
    al_credit_part *p = mk_part(&c, &s);
    const double g1[2][2] = {{1, 0}, {3, 2}}, g2[2][2] = {{4, 1}, {4, 1}};
    const double g3a[2] = {3, 0}, g3b[3] = {5, 0, 6};
    feed_chain(p, "T", "a1", 2, g1[0], 0, 1, AL_ROLLOUT_STATUS_SUCCEEDED, 1);
    feed_chain(p, "T", "b1", 2, g1[1], 0, 1, AL_ROLLOUT_STATUS_SUCCEEDED, 10);
    feed_chain(p, "T", "a2", 2, g2[0], 0, 1, AL_ROLLOUT_STATUS_SUCCEEDED, 20);
    feed_chain(p, "T", "b2", 2, g2[1], 0, 1, AL_ROLLOUT_STATUS_SUCCEEDED, 30);
    feed_chain(p, "T", "a3", 2, g3a, 0, 1, AL_ROLLOUT_STATUS_SUCCEEDED, 40);
    feed_chain(p, "T", "b3", 3, g3b, 0, 1, AL_ROLLOUT_STATUS_SUCCEEDED, 50);
    REQUIRE(s.n == 13);
    struct {
        const char *rid;
        int seq;
        double a;
    } want[] = {{"a1", 0, -1}, {"b1", 0, 1}, {"a1", 2, -1}, {"b1", 2, 1}, {"a2", 0, 2},
                {"b2", 0, 2},  {"a2", 2, 0}, {"b2", 2, 0},  {"a3", 0, 0}, {"b3", 0, 2},
                {"a3", 2, -1}, {"b3", 2, -1}, {"b3", 4, 0}};
    for (size_t i = 0; i < sizeof want / sizeof *want; i++)
        CHECKF(adv_of(&s, want[i].rid, want[i].seq) == want[i].a, "%s call at %d: %g, want %g",
               want[i].rid, want[i].seq, adv_of(&s, want[i].rid, want[i].seq), want[i].a);
    al_credit_part_free(p);
    sink_free(&s);
}

/* No spread means the std is at most 1e-9 times the largest |return|: rewards 0.1 + 0.2
 * against 0.3 (which differ in the last bit) give exactly 0 under grpo, dr_grpo and rloo
 * (rather than 2.8e-17 / eps). Returns 1 and 1 + 1e-6 do have spread: grpo gives
 * -+5e-7 / (5e-7 + 1e-6) = -+1/3. Identical credit follows the same rule. */
TEST(a_spread_below_the_threshold_is_none)
{
    volatile double a = 0.1, b = 0.2;
    REQUIRE(a + b != 0.3); /* the premise: the sum is not the same double */
    for (int assign = 0; assign < 2; assign++)
        for (int e = AL_CREDIT_ESTIMATOR_GRPO; e <= AL_CREDIT_ESTIMATOR_RLOO; e++) {
            al_credit_config c = config((al_credit_estimator)e, 1, 2);
            c.assign = (al_credit_assign)assign;
            c.reward_mode = AL_CREDIT_REWARD_SUM;
            sink_t s;
            al_credit_part *p = mk_part(&c, &s);
            const double ra[2] = {0.1, 0.2}, rb[2] = {NAN, 0.3};
            feed_chain(p, "T", "a", 2, ra, 1, 1, AL_ROLLOUT_STATUS_SUCCEEDED, 1);
            feed_chain(p, "T", "b", 2, rb, 1, 1, AL_ROLLOUT_STATUS_SUCCEEDED, 10);
            REQUIRE(s.n == 4);
            for (int i = 0; i < 4; i++) {
                const al_transition *t = tr(&s, i);
                /* discounted: position 0 is {0.1 + 0.2, 0.3}, position 1 {0.2, 0.3} */
                int spread = assign && strcmp(t->id, "a:0:0") && strcmp(t->id, "b:0:0");
                if (!spread)
                    CHECKF(t->advantage == 0, "%s %s, %s: %g", assign ? "discounted" : "identical",
                           al_credit_estimator_name(e), t->id, t->advantage);
            }
            al_credit_part_free(p);
            sink_free(&s);
        }
    al_credit_config c = config(AL_CREDIT_ESTIMATOR_GRPO, 1, 2);
    sink_t s;
    al_credit_part *p = mk_part(&c, &s);
    const double ra[1] = {1}, rb[1] = {1 + 1e-6};
    feed_chain(p, "T", "a", 1, ra, 0, 1, AL_ROLLOUT_STATUS_SUCCEEDED, 1);
    feed_chain(p, "T", "b", 1, rb, 0, 1, AL_ROLLOUT_STATUS_SUCCEEDED, 10);
    REQUIRE(s.n == 2);
    CHECK_NEAR(adv_of(&s, "a", 0), -1.0 / 3, 1e-9);
    CHECK_NEAR(adv_of(&s, "b", 0), 1.0 / 3, 1e-9);
    al_credit_part_free(p);
    sink_free(&s);
    /* tiny returns keep their spread: 1e-160 and 3e-160 with eps 0 are a z-score of -+1
     * (their squared deviations, 1e-320, are below the smallest normal double) */
    c.eps = 0;
    p = mk_part(&c, &s);
    const double ta[1] = {1e-160}, tb[1] = {3e-160};
    feed_chain(p, "T", "a", 1, ta, 0, 1, AL_ROLLOUT_STATUS_SUCCEEDED, 1);
    feed_chain(p, "T", "b", 1, tb, 0, 1, AL_ROLLOUT_STATUS_SUCCEEDED, 10);
    REQUIRE(s.n == 2);
    CHECK_NEAR(adv_of(&s, "a", 0), -1, 1e-12);
    CHECK_NEAR(adv_of(&s, "b", 0), 1, 1e-12);
    al_credit_part_free(p);
    sink_free(&s);
}

/* ---- random groups against a reference computed from the definition -------------------- */

static uint64_t xs(uint64_t *x)
{
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    return *x;
}

enum { RG = 6, RC = 5 }; /* rollouts per group, calls per rollout at most */

typedef struct ref_rollout {
    int ncalls;
    double rk[RC]; /* reward after call k (NaN: none) */
    double G[RC];
} ref_rollout;

/* The advantage of member i at position k, from the definition (independent of credit.c). */
static double ref_advantage(al_credit_estimator e, const ref_rollout *rs, int n, int i, int k,
                            double eps, const double *baseline)
{
    double v[RG], sum = 0, maxabs = 0, var = 0;
    int m = 0;
    for (int j = 0; j < n; j++)
        if (rs[j].ncalls > k) {
            v[m++] = rs[j].G[k];
            sum += rs[j].G[k];
            maxabs = fmax(maxabs, fabs(rs[j].G[k]));
        }
    double mean = sum / m, g = rs[i].G[k];
    for (int j = 0; j < m; j++)
        var += (v[j] - mean) * (v[j] - mean);
    double sd = sqrt(var / m);
    if (e == AL_CREDIT_ESTIMATOR_NONE) return g;
    if (e == AL_CREDIT_ESTIMATOR_REINFORCE) return g - baseline[k];
    if (m < 2 || sd <= 1e-9 * maxabs) return 0;
    if (e == AL_CREDIT_ESTIMATOR_GRPO) return (g - mean) / (sd + eps);
    if (e == AL_CREDIT_ESTIMATOR_DR_GRPO) return g - mean;
    return g - (sum - g) / (m - 1);
}

/* Random groups (1-5 calls per rollout, rewards from {0, 0.5, 1} after some calls, positions
 * that often have no spread), merged or not, every estimator but reinforce (which is
 * checked above): every transition's reward, return, advantage and token advantages are
 * those of the definition; grpo's never exceed sqrt(n - 1). */
TEST(random_groups_match_the_definition)
{
    uint64_t x = 0x9e3779b97f4a7c15ULL;
    int checked = 0, bad = 0;
    for (int round = 0; round < 300; round++) {
        al_credit_estimator e = (al_credit_estimator)(xs(&x) % 5);
        if (e == AL_CREDIT_ESTIMATOR_REINFORCE) e = AL_CREDIT_ESTIMATOR_GRPO;
        static const double gammas[] = {0, 0.5, 0.9, 1};
        al_credit_config c = config(e, gammas[xs(&x) % 4], RG);
        c.merge = (int)(xs(&x) % 2);
        sink_t s;
        al_credit_part *p = mk_part(&c, &s);
        ref_rollout rs[RG];
        char rid[RG][8];
        for (int i = 0; i < RG; i++) {
            rs[i].ncalls = 1 + (int)(xs(&x) % RC);
            for (int k = 0; k < rs[i].ncalls; k++) {
                uint64_t u = xs(&x) % 5;
                rs[i].rk[k] = u < 3 ? 0.5 * (double)u : NAN;
                if (round % 3 == 0 && k == 0) rs[i].rk[k] = 1; /* position 0 converged */
            }
            double acc = 0;
            for (int k = rs[i].ncalls; k-- > 0;) {
                acc = (isnan(rs[i].rk[k]) ? 0 : rs[i].rk[k]) + c.gamma * acc;
                rs[i].G[k] = acc;
            }
            snprintf(rid[i], sizeof rid[i], "r%d", i);
            feed_chain(p, "T", rid[i], (size_t)rs[i].ncalls, rs[i].rk, 1, 1,
                       AL_ROLLOUT_STATUS_SUCCEEDED, 100 * i);
        }
        /* a rollout without any reward trains with 0 everywhere: the reference agrees */
        for (int t = 0; t < s.n; t++) {
            const al_transition *tn = tr(&s, t);
            REQUIRE(tn != NULL);
            int i = tn->rollout_id[1] - '0';
            /* first call index k from the call's sequence: count the calls before it */
            int k = 0;
            int64_t seq = 0;
            while (seq < tn->call_indices[0]) {
                seq += isnan(rs[i].rk[k]) ? 1 : 2;
                k++;
            }
            int e_end = k + (int)tn->n_call_indices;
            double want_reward = 0;
            for (int j = k; j < e_end; j++)
                want_reward += isnan(rs[i].rk[j]) ? 0 : rs[i].rk[j];
            double want_adv = ref_advantage(e, rs, RG, i, k, c.eps, NULL);
            int ok = fabs(tn->reward - want_reward) < 1e-12 &&
                     fabs(tn->return_value - rs[i].G[k]) < 1e-12 &&
                     fabs(tn->advantage - want_adv) < 1e-9 && tn->group_size == RG;
            if (e == AL_CREDIT_ESTIMATOR_GRPO && fabs(tn->advantage) > sqrt(RG - 1.0)) ok = 0;
            if (tn->n_call_indices > 1) {
                /* tokens: 2 per call, 1 agent token between calls */
                size_t pos = 0;
                ok = ok && tn->n_token_advantages == 3 * tn->n_call_indices - 1;
                for (int j = k; ok && j < e_end; j++) {
                    if (j > k) ok = tn->token_advantages[pos++] == 0;
                    float a = (float)ref_advantage(e, rs, RG, i, j, c.eps, NULL);
                    for (int q = 0; q < 2; q++)
                        if (fabs(tn->token_advantages[pos++] - a) > 1e-6 * (1 + fabs(a))) ok = 0;
                }
            } else if (tn->n_token_advantages) {
                ok = 0;
            }
            if (!ok && bad++ < 5)
                fprintf(stderr,
                        "  round %d (%s, gamma %g, merge %d) %s: reward %g (want %g), return %g "
                        "(want %g), advantage %g (want %g)\n",
                        round, al_credit_estimator_name(e), c.gamma, c.merge, tn->id, tn->reward,
                        want_reward, tn->return_value, rs[i].G[k], tn->advantage, want_adv);
            checked++;
        }
        al_credit_part_free(p);
        sink_free(&s);
    }
    CHECKF(bad == 0, "%d of %d transitions differ from the definition", bad, checked);
    CHECKF(checked > 2000, "only %d transitions checked", checked);
}

/* Replays must stay byte-identical: the same discounted, merged stream fed into one part
 * with two tasks interleaved, and into a part per task, gives the same bytes. */
TEST(discounted_output_does_not_depend_on_how_tasks_share_partitions)
{
    al_credit_config c = config(AL_CREDIT_ESTIMATOR_GRPO, 0.9, 3);
    c.merge = 1;
    sink_t one, own[2];
    al_credit_part *p1 = mk_part(&c, &one);
    al_credit_part *pt[2] = {mk_part(&c, &own[0]), mk_part(&c, &own[1])};
    const char *task[2] = {"A", "B"};
    for (int i = 0; i < 3; i++)
        for (int t = 0; t < 2; t++) {
            char rid[8];
            snprintf(rid, sizeof rid, "%s%d", task[t], i);
            const double rk[3] = {0.5 * i, NAN, 1.0 * (t + i)};
            feed_chain(p1, task[t], rid, 1 + (size_t)i, rk, 1, 1, AL_ROLLOUT_STATUS_SUCCEEDED,
                       10 * i);
            feed_chain(pt[t], task[t], rid, 1 + (size_t)i, rk, 1, 1, AL_ROLLOUT_STATUS_SUCCEEDED,
                       10 * i);
        }
    REQUIRE(one.n == 6 && own[0].n == 3 && own[1].n == 3);
    int k[2] = {0, 0};
    for (int i = 0; i < one.n; i++) {
        int t = tr(&one, i)->task_id[0] - 'A';
        const al_buf *b = &own[t].bytes[k[t]++];
        CHECKF(one.bytes[i].len == b->len && !memcmp(one.bytes[i].data, b->data, b->len),
               "transition %d differs between the shared part and its task's own", i);
    }
    al_credit_part_free(p1);
    al_credit_part_free(pt[0]);
    al_credit_part_free(pt[1]);
    sink_free(&one);
    sink_free(&own[0]);
    sink_free(&own[1]);
}
