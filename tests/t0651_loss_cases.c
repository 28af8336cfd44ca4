/*
 * t0651_loss_cases: hand-computed cases of the policy losses (ratios exactly on the clip
 * bounds, dual clip, truncated IS, KL estimators, aggregations, chunked accumulation),
 * finite differences of d loss / d logits through logprob + loss, numerical stability of the
 * logprobs, the parsers and bad inputs, the optimizer's schedule and first steps, and SHA-256
 * on the FIPS 180-2 vectors.
 */
#include "testlib.h"

#include "model/logprob.h"
#include "model/loss.h"
#include "model/optim.h"
#include "core/sha256.h"

#include <unistd.h>

/* One-token, one-sequence chunk for the hand cases. */
typedef struct one_tok {
    float logp, old, adv, mask;
    int32_t cu[2];
    al_loss_input in;
} one_tok;

static void one_tok_set(one_tok *o, float logp, float old, float adv)
{
    o->logp = logp;
    o->old = old;
    o->adv = adv;
    o->mask = 1.0f;
    o->cu[0] = 0;
    o->cu[1] = 1;
    memset(&o->in, 0, sizeof o->in);
    o->in.T = 1;
    o->in.nseq = 1;
    o->in.cu_seqlens = o->cu;
    o->in.logp = &o->logp;
    o->in.old_logp = &o->old;
    o->in.adv = &o->adv;
    o->in.mask = &o->mask;
}

/* Runs the loss on o; returns the loss and stores dlogp and stats. */
static double run_one(const al_loss_config *cfg, one_tok *o, float *dlogp, al_loss_stats *st)
{
    char err[256] = "";
    double loss = NAN;
    al_loss_stats_init(st);
    int rc = al_loss_compute(cfg, &o->in, 0.0, &loss, dlogp, NULL, st, err, sizeof err);
    CHECKF(rc == 0, "al_loss_compute: %s", err);
    al_loss_stats_finish(st);
    return loss;
}

TEST(ppo_ratio_exactly_on_upper_bound_is_not_clipped)
{
    al_loss_config cfg;
    al_loss_config_default(&cfg);
    one_tok o;
    one_tok_set(&o, -0.875f, -1.0f, 2.0f); /* logp - old = 0.125 exactly */
    float r = expf(0.125f);
    cfg.eps_high = r - 1.0f; /* exact: r is in [1, 2] */
    REQUIRE(1.0f + cfg.eps_high == r);
    float d;
    al_loss_stats st;
    double loss = run_one(&cfg, &o, &d, &st);
    CHECK_NEAR(loss, -2.0 * r, 1e-6);
    CHECK_NEAR(d, -2.0 * r, 1e-6); /* d(-A r)/dlogp = -A r */
    CHECK_EQ_INT((int)st.sum_clipped, 0);
    /* One ulp beyond the bound: clipped, constant loss, no gradient. */
    o.logp = nextafterf(-0.875f, 0.0f);
    loss = run_one(&cfg, &o, &d, &st);
    CHECK_NEAR(loss, -2.0 * (1.0 + cfg.eps_high), 1e-6);
    CHECK(d == 0.0f);
    CHECK_EQ_INT((int)st.sum_clipped, 1);
    CHECK_NEAR(st.clip_frac, 1.0, 0);
}

TEST(ppo_ratio_exactly_on_lower_bound_with_negative_advantage)
{
    al_loss_config cfg;
    al_loss_config_default(&cfg);
    one_tok o;
    one_tok_set(&o, -1.125f, -1.0f, -0.5f); /* logp - old = -0.125 */
    float r = expf(-0.125f);
    cfg.eps_low = 1.0f - r;
    REQUIRE(1.0f - cfg.eps_low == r);
    float d;
    al_loss_stats st;
    double loss = run_one(&cfg, &o, &d, &st);
    CHECK_NEAR(loss, 0.5 * r, 1e-6);
    CHECK_NEAR(d, 0.5 * r, 1e-6);
    CHECK_EQ_INT((int)st.sum_clipped, 0);
    o.logp = nextafterf(-1.125f, -2.0f);
    loss = run_one(&cfg, &o, &d, &st);
    CHECK_NEAR(loss, 0.5 * r, 1e-6);
    CHECK(d == 0.0f);
    CHECK_EQ_INT((int)st.sum_clipped, 1);
    /* A positive advantage below the lower bound is not clipped: the gradient pushes up. */
    o.adv = 0.5f;
    loss = run_one(&cfg, &o, &d, &st);
    CHECK(d < 0.0f);
    CHECK_EQ_INT((int)st.sum_clipped, 0);
}

TEST(ppo_clip_higher_bounds_are_asymmetric)
{
    al_loss_config cfg;
    al_loss_config_default(&cfg);
    cfg.eps_low = 0.2f;
    cfg.eps_high = 0.28f;
    one_tok o;
    float d;
    al_loss_stats st;
    /* r = 1.25: inside [0.8, 1.28], gradient flows for A > 0. */
    one_tok_set(&o, logf(1.25f), 0.0f, 1.0f);
    double loss = run_one(&cfg, &o, &d, &st);
    CHECK_NEAR(loss, -1.25, 1e-6);
    CHECK_NEAR(d, -1.25, 1e-6);
    /* r = 1.3 > 1.28: clipped at 1.28. */
    one_tok_set(&o, logf(1.3f), 0.0f, 1.0f);
    loss = run_one(&cfg, &o, &d, &st);
    CHECK_NEAR(loss, -1.28, 1e-6);
    CHECK(d == 0.0f);
    /* With eps_high 0.2 the same ratio 1.25 is clipped. */
    cfg.eps_high = 0.2f;
    one_tok_set(&o, logf(1.25f), 0.0f, 1.0f);
    loss = run_one(&cfg, &o, &d, &st);
    CHECK_NEAR(loss, -1.2, 1e-6);
    CHECK(d == 0.0f);
}

TEST(ppo_dual_clip_caps_negative_advantages)
{
    al_loss_config cfg;
    al_loss_config_default(&cfg);
    cfg.dual_clip = 3.0f;
    one_tok o;
    float d;
    al_loss_stats st;
    /* A = -1, r = 5: plain PPO gives 5 (max(5, 1.2)); dual clip caps it at 3, no gradient. */
    one_tok_set(&o, logf(5.0f), 0.0f, -1.0f);
    double loss = run_one(&cfg, &o, &d, &st);
    CHECK_NEAR(loss, 3.0, 1e-6);
    CHECK(d == 0.0f);
    CHECK_EQ_INT((int)st.sum_dual_clipped, 1);
    CHECK_EQ_INT((int)st.sum_clipped, 0);
    /* r = 2 (between 1 + eps and c): unclipped, -A r with gradient -A r = 2. */
    one_tok_set(&o, logf(2.0f), 0.0f, -1.0f);
    loss = run_one(&cfg, &o, &d, &st);
    CHECK_NEAR(loss, 2.0, 1e-6);
    CHECK_NEAR(d, 2.0, 1e-6);
    CHECK_EQ_INT((int)st.sum_dual_clipped, 0);
    /* r exactly c: not capped (the bound is hit only strictly beyond it). */
    cfg.dual_clip = expf(1.0f);
    one_tok_set(&o, 1.0f, 0.0f, -1.0f);
    loss = run_one(&cfg, &o, &d, &st);
    CHECK_NEAR(loss, cfg.dual_clip, 1e-6);
    CHECK_NEAR(d, cfg.dual_clip, 1e-6);
    CHECK_EQ_INT((int)st.sum_dual_clipped, 0);
    /* Positive advantages are never dual-clipped: A = 1, r = 5 is clipped at 1.2 only. */
    cfg.dual_clip = 3.0f;
    one_tok_set(&o, logf(5.0f), 0.0f, 1.0f);
    loss = run_one(&cfg, &o, &d, &st);
    CHECK_NEAR(loss, -1.2, 1e-6);
    CHECK_EQ_INT((int)st.sum_dual_clipped, 0);
    /* Without dual clip the same negative-advantage token costs 5. */
    cfg.dual_clip = 0.0f;
    one_tok_set(&o, logf(5.0f), 0.0f, -1.0f);
    loss = run_one(&cfg, &o, &d, &st);
    CHECK_NEAR(loss, 5.0, 1e-5);
    CHECK_NEAR(d, 5.0, 1e-5);
}

TEST(truncated_importance_sampling_weight)
{
    al_loss_config cfg;
    al_loss_config_default(&cfg);
    cfg.tis_cap = 2.0f;
    one_tok o;
    float d, rollout;
    al_loss_stats st;
    one_tok_set(&o, -1.0f, -1.0f, 1.0f); /* ratio 1 */
    o.in.rollout_logp = &rollout;
    rollout = -1.5f; /* exp(0.5) = 1.6487 < 2 */
    double loss = run_one(&cfg, &o, &d, &st);
    CHECK_NEAR(loss, -expf(0.5f), 1e-6);
    CHECK_NEAR(d, -expf(0.5f), 1e-6);
    CHECK_NEAR(st.tis_mean, expf(0.5f), 1e-6);
    rollout = -3.0f; /* exp(2) capped at 2 */
    loss = run_one(&cfg, &o, &d, &st);
    CHECK_NEAR(loss, -2.0, 1e-6);
    CHECK_NEAR(d, -2.0, 1e-6);
    /* No cap: no weighting even with rollout logprobs. */
    cfg.tis_cap = 0.0f;
    loss = run_one(&cfg, &o, &d, &st);
    CHECK_NEAR(loss, -1.0, 1e-6);
}

TEST(kl_estimators_and_entropy_bonus)
{
    al_loss_config cfg;
    al_loss_config_default(&cfg);
    cfg.kind = AL_LOSS_SFT;
    cfg.kl_beta = 0.5f;
    one_tok o;
    float d, ref = -1.5f, ent = 2.0f, dent;
    al_loss_stats st;
    one_tok_set(&o, -1.0f, -1.0f, 0.0f);
    o.in.ref_logp = &ref;
    float x = 0.5f; /* logp - ref */
    struct {
        al_kl_kind k;
        double kl, dkl;
    } cases[3] = {{AL_KL_K1, x, 1.0},
                  {AL_KL_K2, 0.5 * x * x, x},
                  {AL_KL_K3, exp(-x) + x - 1.0, 1.0 - exp(-x)}};
    for (int i = 0; i < 3; i++) {
        cfg.kl = cases[i].k;
        double loss = run_one(&cfg, &o, &d, &st);
        CHECKF(fabs(loss - (1.0 + 0.5 * cases[i].kl)) < 1e-6, "%s: loss %g",
               al_kl_kind_name(cases[i].k), loss);
        CHECKF(fabs(d - (-1.0 + 0.5 * cases[i].dkl)) < 1e-6, "%s: dlogp %g",
               al_kl_kind_name(cases[i].k), d);
        CHECK_NEAR(st.kl, cases[i].kl, 1e-6);
    }
    /* Entropy bonus: -coef H in the loss, dloss/dH = -coef. */
    cfg.kl_beta = 0.0f;
    cfg.entropy_coef = 0.01f;
    o.in.entropy = &ent;
    char err[256];
    double loss;
    al_loss_stats_init(&st);
    REQUIRE(al_loss_compute(&cfg, &o.in, 0.0, &loss, &d, &dent, &st, err, sizeof err) == 0);
    CHECK_NEAR(loss, 1.0 - 0.02, 1e-6);
    CHECK_NEAR(dent, -0.01, 1e-9);
    /* ...and it needs somewhere to put dloss/dH. */
    CHECK(al_loss_compute(&cfg, &o.in, 0.0, &loss, &d, NULL, NULL, err, sizeof err) == -1);
    CHECK(strstr(err, "dentropy") != NULL);
}

TEST(cispo_is_weight_is_clipped_and_stop_gradient)
{
    al_loss_config cfg;
    al_loss_config_default(&cfg);
    cfg.kind = AL_LOSS_CISPO;
    cfg.eps_low = 1.0f; /* MiniMax-M1: no lower clip */
    cfg.eps_high = 0.28f;
    one_tok o;
    float d;
    al_loss_stats st;
    one_tok_set(&o, logf(2.0f) - 1.0f, -1.0f, 1.5f); /* r = 2, clipped to 1.28 */
    double loss = run_one(&cfg, &o, &d, &st);
    CHECK_NEAR(loss, -1.28 * 1.5 * (logf(2.0f) - 1.0f), 1e-5);
    CHECK_NEAR(d, -1.28 * 1.5, 1e-5); /* the weight is a constant: d = -w A */
    CHECK_EQ_INT((int)st.sum_clipped, 1);
    one_tok_set(&o, logf(0.1f) - 1.0f, -1.0f, 1.5f); /* r = 0.1, kept */
    loss = run_one(&cfg, &o, &d, &st);
    CHECK_NEAR(d, -0.1 * 1.5, 1e-5);
    CHECK_EQ_INT((int)st.sum_clipped, 0);
}

TEST(gspo_uses_the_sequence_geometric_mean_ratio)
{
    al_loss_config cfg;
    al_loss_config_default(&cfg);
    cfg.kind = AL_LOSS_GSPO;
    cfg.agg = AL_LOSS_AGG_SEQ_MEAN_TOKEN_MEAN;
    cfg.eps_low = 0.5f;
    cfg.eps_high = 0.5f;
    /* One sequence of 3 tokens, the middle one masked out; log ratios 0.1 and 0.3. */
    float logp[3] = {-0.9f, -5.0f, -0.7f}, old[3] = {-1.0f, -1.0f, -1.0f};
    float adv[3] = {1.0f, 1.0f, 1.0f}, mask[3] = {1, 0, 1}, d[3];
    int32_t cu[2] = {0, 3};
    al_loss_input in = {.T = 3, .nseq = 1, .cu_seqlens = cu, .logp = logp, .old_logp = old,
                        .adv = adv, .mask = mask};
    double loss;
    char err[256];
    al_loss_stats st;
    al_loss_stats_init(&st);
    REQUIRE(al_loss_compute(&cfg, &in, 0.0, &loss, d, NULL, &st, err, sizeof err) == 0);
    double s = exp(0.2);
    CHECK_NEAR(loss, -s, 1e-5);
    /* GSPO-token gradient: d/dlogp_t of mean_t(-A s) = -A s / |y| per masked token. */
    CHECK_NEAR(d[0], -s / 2, 1e-5);
    CHECK(d[1] == 0.0f);
    CHECK_NEAR(d[2], -s / 2, 1e-5);
    al_loss_stats_finish(&st);
    CHECK_NEAR(st.ratio_mean, s, 1e-5);
    /* Sequence ratio beyond 1 + eps with A > 0: every token of the sequence is clipped. */
    logp[0] = 0.0f, logp[2] = 0.0f; /* mean log ratio 1: s = e > 1.5 */
    al_loss_stats_init(&st);
    REQUIRE(al_loss_compute(&cfg, &in, 0.0, &loss, d, NULL, &st, err, sizeof err) == 0);
    CHECK_NEAR(loss, -1.5, 1e-6);
    CHECK(d[0] == 0.0f && d[2] == 0.0f);
    CHECK_NEAR(st.sum_clipped, 2.0, 0);
}

/* Three sequences: [2 masked tokens of loss 1, 3], [1 masked of loss 5], [no mask]. */
TEST(aggregations_by_hand)
{
    float logp[7] = {-1.0f, -3.0f, 0.0f, -5.0f, 0.0f, -2.0f, -2.0f};
    float mask[7] = {1, 1, 0, 1, 0, 0, 0}, d[7];
    int32_t cu[4] = {0, 3, 5, 7};
    al_loss_input in = {.T = 7, .nseq = 3, .cu_seqlens = cu, .logp = logp, .mask = mask};
    al_loss_config cfg;
    al_loss_config_default(&cfg);
    cfg.kind = AL_LOSS_SFT;
    char err[256];
    double loss;
    struct {
        al_loss_agg agg;
        double loss, d0, d3;
    } cases[3] = {
        {AL_LOSS_AGG_TOKEN_MEAN, 9.0 / 3, -1.0 / 3, -1.0 / 3},
        {AL_LOSS_AGG_SEQ_MEAN_TOKEN_SUM, (4.0 + 5.0) / 2, -0.5, -0.5},
        {AL_LOSS_AGG_SEQ_MEAN_TOKEN_MEAN, (2.0 + 5.0) / 2, -0.25, -0.5},
    };
    for (int i = 0; i < 3; i++) {
        cfg.agg = cases[i].agg;
        REQUIRE(al_loss_compute(&cfg, &in, 0.0, &loss, d, NULL, NULL, err, sizeof err) == 0);
        CHECKF(fabs(loss - cases[i].loss) < 1e-6, "%s: %g", al_loss_agg_name(cfg.agg), loss);
        CHECK_NEAR(d[0], cases[i].d0, 1e-7);
        CHECK_NEAR(d[3], cases[i].d3, 1e-7);
        CHECK(d[2] == 0.0f && d[5] == 0.0f);
        CHECK_NEAR(al_loss_local_norm(&cfg, &in), i == 0 ? 3.0 : 2.0, 0);
    }
}

/* Splitting a batch into chunks with the batch's normalizer gives the same loss and
 * gradients as one chunk: the property gradient accumulation relies on. */
TEST(chunked_accumulation_matches_whole_batch)
{
    enum { T = 12 };
    float logp[T], old[T], adv[T], mask[T], d_whole[T], d_chunk[T];
    int32_t cu[5] = {0, 3, 7, 9, 12};
    for (int t = 0; t < T; t++) {
        logp[t] = -0.5f - 0.1f * (float)(t % 5);
        old[t] = logp[t] + 0.05f * (float)((t * 7) % 5 - 2);
        adv[t] = (float)((t * 3) % 7 - 3) * 0.5f;
        mask[t] = (t % 4) != 0;
    }
    char err[256];
    for (int agg = 0; agg < 3; agg++) {
        for (int kind = 0; kind < 4; kind++) {
            al_loss_config cfg;
            al_loss_config_default(&cfg);
            cfg.kind = (al_loss_kind)kind;
            cfg.agg = (al_loss_agg)agg;
            al_loss_input whole = {.T = T, .nseq = 4, .cu_seqlens = cu, .logp = logp,
                                   .old_logp = old, .adv = adv, .mask = mask};
            double lw;
            REQUIRE(al_loss_compute(&cfg, &whole, 0.0, &lw, d_whole, NULL, NULL, err, sizeof err) == 0);
            /* Chunks: sequences {0,1} and {2,3}. */
            int32_t cu_a[3] = {0, 3, 7}, cu_b[3] = {0, 2, 5};
            al_loss_input a = whole, b = whole;
            a.T = 7, a.nseq = 2, a.cu_seqlens = cu_a;
            b.T = 5, b.nseq = 2, b.cu_seqlens = cu_b;
            b.logp = logp + 7, b.old_logp = old + 7, b.adv = adv + 7, b.mask = mask + 7;
            double norm = al_loss_local_norm(&cfg, &a) + al_loss_local_norm(&cfg, &b);
            CHECK_NEAR(norm, al_loss_local_norm(&cfg, &whole), 0);
            double la, lb;
            REQUIRE(al_loss_compute(&cfg, &a, norm, &la, d_chunk, NULL, NULL, err, sizeof err) == 0);
            REQUIRE(al_loss_compute(&cfg, &b, norm, &lb, d_chunk + 7, NULL, NULL, err, sizeof err) == 0);
            CHECKF(fabs(la + lb - lw) < 1e-6, "%s/%s: chunks %g + %g vs whole %g",
                   al_loss_kind_name(cfg.kind), al_loss_agg_name(cfg.agg), la, lb, lw);
            for (int t = 0; t < T; t++)
                CHECKF(fabs(d_chunk[t] - d_whole[t]) < 1e-7, "%s/%s: d[%d] %g vs %g",
                       al_loss_kind_name(cfg.kind), al_loss_agg_name(cfg.agg), t, d_chunk[t],
                       d_whole[t]);
        }
    }
}

/* Loss as a function of the logits, through logprob + loss, in float. */
typedef struct fd_case {
    int T, V, nseq;
    const int32_t *cu, *targets;
    const float *old, *rollout, *ref, *adv, *mask;
    float tau;
    al_loss_config cfg;
    /* CISPO's IS weight is a stop-gradient: with logp0 (the logprobs at the unperturbed
     * logits) set, old_logp moves with logp so that the weight stays frozen under a probe. */
    const float *logp0;
} fd_case;

static double fd_loss(const fd_case *c, const float *logits, float *dlogits, double *clipped)
{
    float logp[16], ent[16], dlogp[16], dent[16];
    char err[256];
    if (al_logprob_forward(logits, c->targets, c->T, c->V, c->tau, logp, ent, err, sizeof err))
        return NAN;
    float old[16];
    for (int t = 0; t < c->T; t++) old[t] = c->logp0 ? c->old[t] + (logp[t] - c->logp0[t]) : c->old[t];
    al_loss_input in = {.T = c->T, .nseq = c->nseq, .cu_seqlens = c->cu, .logp = logp,
                        .old_logp = old, .rollout_logp = c->rollout, .ref_logp = c->ref,
                        .entropy = ent, .adv = c->adv, .mask = c->mask};
    double loss;
    al_loss_stats st;
    al_loss_stats_init(&st);
    if (al_loss_compute(&c->cfg, &in, 0.0, &loss, dlogp, dent, &st, err, sizeof err)) return NAN;
    if (clipped) *clipped = st.sum_clipped + st.sum_dual_clipped;
    if (dlogits) al_logprob_backward(logits, c->targets, c->T, c->V, c->tau, dlogp, dent, dlogits);
    return loss;
}

TEST(finite_differences_of_dloss_dlogits)
{
    enum { T = 9, V = 7 };
    int32_t cu[4] = {0, 4, 6, 9};
    int32_t targets[T] = {1, 4, 6, -1, 0, 2, 5, 3, 3};
    float logits[T * V], old[T], rollout[T], ref[T], adv[T], mask[T] = {0, 1, 1, 0, 1, 0, 1, 1, 1};
    float grad[T * V], probe[T * V], logp0[T], seq_adv[T];
    uint32_t s = 12345;
    for (int i = 0; i < T * V; i++) {
        s = s * 1664525u + 1013904223u;
        logits[i] = ((float)(s >> 8) / 16777216.0f - 0.5f) * 4.0f;
    }
    for (int t = 0; t < T; t++) {
        s = s * 1664525u + 1013904223u;
        float u = (float)(s >> 8) / 16777216.0f - 0.5f;
        old[t] = -2.0f + u * 0.6f;
        rollout[t] = old[t] - u * 0.4f;
        ref[t] = -1.8f - u;
        adv[t] = (t % 3 == 0 ? -1.0f : 0.7f) + u;
    }
    /* GSPO is checked where its token form equals the sequence-level objective:
     * seq-mean-token-mean with one advantage per sequence. */
    for (int i = 0; i < 3; i++)
        for (int t = cu[i]; t < cu[i + 1]; t++) seq_adv[t] = i == 1 ? -0.8f : 0.6f + 0.3f * i;
    char err[256];
    REQUIRE(al_logprob_forward(logits, targets, T, V, 1.0f, logp0, NULL, err, sizeof err) == 0);
    const struct {
        al_loss_kind kind;
        float eps_low, eps_high, dual, tis, beta, ent, tau;
        al_kl_kind kl;
    } variants[] = {
        {AL_LOSS_PPO, 0.2f, 0.28f, 3.0f, 2.0f, 0.1f, 0.01f, 1.0f, AL_KL_K3},
        {AL_LOSS_PPO, 0.2f, 0.2f, 0.0f, 0.0f, 0.2f, 0.0f, 0.7f, AL_KL_K2},
        {AL_LOSS_GSPO, 0.3f, 0.4f, 0.0f, 1.5f, 0.1f, 0.0f, 1.0f, AL_KL_K1},
        {AL_LOSS_CISPO, 1.0f, 0.28f, 0.0f, 0.0f, 0.0f, 0.05f, 1.0f, AL_KL_K3},
        {AL_LOSS_SFT, 0.2f, 0.2f, 0.0f, 0.0f, 0.0f, -0.02f, 1.3f, AL_KL_K3},
    };
    int checked = 0;
    for (size_t v = 0; v < sizeof variants / sizeof variants[0]; v++) {
        for (int agg = 0; agg < 3; agg++) {
            int gspo = variants[v].kind == AL_LOSS_GSPO;
            if (gspo && agg != AL_LOSS_AGG_SEQ_MEAN_TOKEN_MEAN) continue;
            fd_case c = {.T = T, .V = V, .nseq = 3, .cu = cu, .targets = targets, .old = old,
                         .rollout = rollout, .ref = ref, .adv = gspo ? seq_adv : adv,
                         .mask = mask, .tau = variants[v].tau,
                         .logp0 = variants[v].kind == AL_LOSS_CISPO ? logp0 : NULL};
            al_loss_config_default(&c.cfg);
            c.cfg.kind = variants[v].kind;
            c.cfg.agg = (al_loss_agg)agg;
            c.cfg.eps_low = variants[v].eps_low;
            c.cfg.eps_high = variants[v].eps_high;
            c.cfg.dual_clip = variants[v].dual;
            c.cfg.tis_cap = variants[v].tis;
            c.cfg.kl_beta = variants[v].beta;
            c.cfg.kl = variants[v].kl;
            c.cfg.entropy_coef = variants[v].ent;
            double clipped0;
            REQUIRE(isfinite(fd_loss(&c, logits, grad, &clipped0)));
            const float h = 1e-2f;
            for (int i = 0; i < T * V; i++) {
                memcpy(probe, logits, sizeof probe);
                double cp, cm;
                probe[i] = logits[i] + h;
                double lp = fd_loss(&c, probe, NULL, &cp);
                probe[i] = logits[i] - h;
                double lm = fd_loss(&c, probe, NULL, &cm);
                /* Skip probes that move a ratio across a clip bound (a kink). */
                if (cp != clipped0 || cm != clipped0) continue;
                double fd = (lp - lm) / (2.0 * h);
                CHECKF(fabs(fd - grad[i]) <= 2e-4 + 2e-3 * fabs(fd),
                       "%s/%s logit %d: analytic %.7g vs finite difference %.7g",
                       al_loss_kind_name(c.cfg.kind), al_loss_agg_name(c.cfg.agg), i,
                       (double)grad[i], fd);
                checked++;
            }
        }
    }
    CHECKF(checked > 600, "only %d logits checked", checked);
}

TEST(logprobs_are_stable_for_extreme_logits)
{
    enum { V = 5 };
    float logits[2 * V] = {1e4f, -1e4f, 0.0f, 9999.0f, 5.0f, -INFINITY, 0.0f, 0.0f, -INFINITY, 0.0f};
    int32_t targets[2] = {3, 1};
    float logp[2], ent[2], d[2 * V];
    char err[256];
    REQUIRE(al_logprob_forward(logits, targets, 2, V, 1.0f, logp, ent, err, sizeof err) == 0);
    CHECK_NEAR(logp[0], -1.0 - log1p(exp(-1.0)), 1e-5); /* 9999 vs 10000 */
    CHECK(isfinite(ent[0]) && ent[0] > 0.0f);
    CHECK_NEAR(logp[1], -log(3.0), 1e-6); /* three equal finite logits, two at -inf */
    CHECK_NEAR(ent[1], log(3.0), 1e-6);
    float dlogp[2] = {1.0f, 1.0f}, dent[2] = {1.0f, 1.0f};
    al_logprob_backward(logits, targets, 2, V, 1.0f, dlogp, dent, d);
    for (int i = 0; i < 2 * V; i++) CHECKF(isfinite(d[i]), "dlogits[%d] = %g", i, d[i]);
    CHECK(d[5] == 0.0f && d[8] == 0.0f);
    /* Rows of the gradient of logp sum to zero (softmax invariance). */
    dent[0] = dent[1] = 0.0f;
    al_logprob_backward(logits, targets, 2, V, 1.0f, dlogp, dent, d);
    for (int r = 0; r < 2; r++) {
        double sum = 0;
        for (int j = 0; j < V; j++) sum += d[r * V + j];
        CHECK_NEAR(sum, 0.0, 1e-6);
    }
}

TEST(parsers_and_bad_inputs_give_clear_errors)
{
    char err[256];
    al_loss_kind k;
    al_loss_agg a;
    al_kl_kind kl;
    const char *kinds[] = {"ppo", "gspo", "cispo", "sft"};
    for (int i = 0; i < 4; i++) {
        CHECK(al_loss_kind_parse(kinds[i], &k, err, sizeof err) == 0 && (int)k == i);
        CHECK_EQ_STR(al_loss_kind_name(k), kinds[i]);
    }
    CHECK(al_loss_kind_parse("grpo", &k, err, sizeof err) == -1);
    CHECK(strstr(err, "'grpo'") && strstr(err, "cispo"));
    CHECK(al_loss_agg_parse("seq-mean-token-mean", &a, err, sizeof err) == 0 &&
          a == AL_LOSS_AGG_SEQ_MEAN_TOKEN_MEAN);
    CHECK(al_loss_agg_parse("token-sum", &a, err, sizeof err) == -1);
    CHECK(strstr(err, "token-sum") && strstr(err, "seq-mean-token-sum"));
    CHECK(al_kl_kind_parse("low_var_kl", &kl, err, sizeof err) == 0 && kl == AL_KL_K3);
    CHECK(al_kl_kind_parse("k4", &kl, err, sizeof err) == -1 && strstr(err, "k4"));
    al_lr_schedule sch;
    CHECK(al_lr_schedule_parse("cosine", &sch, err, sizeof err) == 0 && sch == AL_LR_COSINE);
    CHECK(al_lr_schedule_parse("linear", &sch, err, sizeof err) == -1 && strstr(err, "linear"));

    al_loss_config cfg;
    al_loss_config_default(&cfg);
    CHECK(al_loss_config_check(&cfg, err, sizeof err) == 0);
    cfg.dual_clip = 0.5f;
    CHECK(al_loss_config_check(&cfg, err, sizeof err) == -1 && strstr(err, "dual_clip"));
    cfg.dual_clip = 0.0f;
    cfg.eps_low = -0.1f;
    CHECK(al_loss_config_check(&cfg, err, sizeof err) == -1 && strstr(err, "eps_low"));
    cfg.eps_low = 0.2f;

    float logp[3] = {-1, -1, -1}, mask[3] = {1, 1, 1}, d[3];
    int32_t cu_short[2] = {0, 2}, cu_down[3] = {0, 2, 1}, cu_ok[2] = {0, 3};
    al_loss_input in = {.T = 3, .nseq = 1, .cu_seqlens = cu_short, .logp = logp, .mask = mask};
    double loss;
    cfg.kind = AL_LOSS_SFT;
    CHECK(al_loss_compute(&cfg, &in, 0.0, &loss, d, NULL, NULL, err, sizeof err) == -1);
    CHECK(strstr(err, "cu_seqlens") != NULL);
    in.nseq = 2, in.cu_seqlens = cu_down;
    CHECK(al_loss_compute(&cfg, &in, 0.0, &loss, d, NULL, NULL, err, sizeof err) == -1);
    CHECK(strstr(err, "decrease") != NULL);
    in.nseq = 1, in.cu_seqlens = cu_ok;
    cfg.kind = AL_LOSS_PPO;
    CHECK(al_loss_compute(&cfg, &in, 0.0, &loss, d, NULL, NULL, err, sizeof err) == -1);
    CHECK(strstr(err, "advantages") != NULL);
    in.adv = logp;
    cfg.kl_beta = 0.1f;
    CHECK(al_loss_compute(&cfg, &in, 0.0, &loss, d, NULL, NULL, err, sizeof err) == -1);
    CHECK(strstr(err, "reference") != NULL);
    cfg.kl_beta = 0.0f;
    CHECK(al_loss_compute(&cfg, &in, 0.0, &loss, d, NULL, NULL, err, sizeof err) == 0);

    float logits[6] = {0};
    int32_t targets[2] = {1, 3};
    float lp[2];
    CHECK(al_logprob_forward(logits, targets, 2, 3, 1.0f, lp, NULL, err, sizeof err) == -1);
    CHECK(strstr(err, "token 3") && strstr(err, "position 1"));
    targets[1] = 2;
    CHECK(al_logprob_forward(logits, targets, 2, 3, 0.0f, lp, NULL, err, sizeof err) == -1);
    CHECK(strstr(err, "temperature") != NULL);
    CHECK(al_logprob_forward(logits, targets, 2, 3, 1.0f, lp, NULL, err, sizeof err) == 0);
    CHECK_NEAR(lp[0], -log(3.0), 1e-6);
}

TEST(lr_schedule_by_hand)
{
    al_optim_config c;
    al_optim_config_default(&c);
    c.lr = 1.0f;
    c.warmup_steps = 4;
    c.total_steps = 14;
    c.schedule = AL_LR_CONSTANT;
    CHECK_NEAR(al_lr_at(&c, 0), 0.25, 1e-12);
    CHECK_NEAR(al_lr_at(&c, 3), 1.0, 1e-12);
    CHECK_NEAR(al_lr_at(&c, 100), 1.0, 1e-12);
    c.schedule = AL_LR_COSINE;
    c.min_lr_ratio = 0.1f;
    CHECK_NEAR(al_lr_at(&c, 4), 1.0, 1e-7);
    CHECK_NEAR(al_lr_at(&c, 9), 0.1 + 0.9 * 0.5, 1e-7); /* half way */
    CHECK_NEAR(al_lr_at(&c, 14), 0.1, 1e-7);
    CHECK_NEAR(al_lr_at(&c, 50), 0.1, 1e-7);
    char err[256];
    c.total_steps = 0;
    CHECK(al_optim_config_check(&c, err, sizeof err) == -1 && strstr(err, "total_steps"));
    c.total_steps = 14;
    c.beta2 = 1.0f;
    CHECK(al_optim_config_check(&c, err, sizeof err) == -1 && strstr(err, "beta2"));
}

TEST(adamw_first_step_and_clipping_by_hand)
{
    al_optim_config c;
    al_optim_config_default(&c);
    c.lr = 0.1f;
    c.weight_decay = 0.5f;
    al_adamw opt;
    char err[256];
    REQUIRE(al_adamw_init(&opt, &c, 3, err, sizeof err) == 0);
    CHECK(opt.v == opt.m + 3 && opt.m == opt.state);
    float p[3] = {1.0f, -2.0f, 0.5f}, g[3] = {0.3f, -4.0f, 0.0f};
    al_adamw_update(&opt, p, g, al_lr_at(&c, opt.step));
    /* Step 1: m hat = g, v hat = g^2, so the move is lr g / (|g| + eps) after decay. */
    CHECK_NEAR(p[0], 1.0 * (1 - 0.05) - 0.1, 1e-6);
    CHECK_NEAR(p[1], -2.0 * (1 - 0.05) + 0.1, 1e-6);
    CHECK_NEAR(p[2], 0.5 * (1 - 0.05), 1e-7);
    CHECK_EQ_INT(opt.step, 1);
    al_adamw_free(&opt);

    float gg[4] = {3.0f, 4.0f, 0.0f, 0.0f};
    double norm = al_grad_clip(gg, 4, 1.0f);
    CHECK_NEAR(norm, 5.0, 1e-9);
    CHECK_NEAR(al_grad_norm(gg, 4), 1.0, 1e-6);
    norm = al_grad_clip(gg, 4, 10.0f); /* below the limit: untouched */
    CHECK_NEAR(gg[0], 0.6, 1e-6);
    gg[2] = NAN;
    norm = al_grad_clip(gg, 4, 1.0f);
    CHECK(!isfinite(norm));
}

static void sha_hex(const void *data, size_t len, char out[65])
{
    uint8_t d[32];
    al_sha256(data, len, d);
    al_hex(d, 32, out);
}

TEST(sha256_fips_180_2_vectors)
{
    char hex[65];
    sha_hex("abc", 3, hex);
    CHECK_EQ_STR(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    sha_hex("", 0, hex);
    CHECK_EQ_STR(hex, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    const char *m2 = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
    sha_hex(m2, strlen(m2), hex);
    CHECK_EQ_STR(hex, "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
    /* One million 'a', fed in uneven pieces. */
    char *a = malloc(1000000);
    memset(a, 'a', 1000000);
    al_sha256_ctx c;
    al_sha256_init(&c);
    size_t off = 0, piece = 1;
    while (off < 1000000) {
        size_t n = piece < 1000000 - off ? piece : 1000000 - off;
        al_sha256_update(&c, a + off, n);
        off += n;
        piece = piece * 3 % 997 + 1;
    }
    uint8_t d[32];
    al_sha256_final(&c, d);
    al_hex(d, 32, hex);
    CHECK_EQ_STR(hex, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
    /* The file digest equals the buffer digest. */
    char path[] = "/tmp/arclight-t0651-XXXXXX";
    int fd = mkstemp(path);
    REQUIRE(fd >= 0);
    REQUIRE(write(fd, a, 1000000) == 1000000);
    close(fd);
    char err[256], fhex[65];
    CHECK(al_sha256_file(path, fhex, err, sizeof err) == 0);
    CHECK_EQ_STR(fhex, hex);
    unlink(path);
    CHECK(al_sha256_file(path, fhex, err, sizeof err) == -1 && strstr(err, path));
    free(a);
}
