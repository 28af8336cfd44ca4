/*
 * loss.c: PPO-family policy losses on per-token logprobs (see loss.h for the definitions).
 *
 * Per-token arithmetic is float32 like the PyTorch reference (so that a ratio lands on a clip
 * bound exactly when it does there); sums over tokens and sequences run in double.
 */
#include "model/loss.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#define LOG_RATIO_CLAMP 20.0f

static int loss_err(char *errstr, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int loss_err(char *errstr, size_t errlen, const char *fmt, ...)
{
    if (errstr && errlen) {
        char msg[256];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
        snprintf(errstr, errlen, "loss: %s", msg);
    }
    return -1;
}

void al_loss_config_default(al_loss_config *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->kind = AL_LOSS_PPO;
    cfg->agg = AL_LOSS_AGG_TOKEN_MEAN;
    cfg->eps_low = 0.2f;
    cfg->eps_high = 0.2f;
    cfg->dual_clip = 0.0f;
    cfg->tis_cap = 0.0f;
    cfg->kl = AL_KL_K3;
    cfg->kl_beta = 0.0f;
    cfg->entropy_coef = 0.0f;
}

static const char *const kind_names[] = {"ppo", "gspo", "cispo", "sft"};
static const char *const agg_names[] = {"token-mean", "seq-mean-token-sum", "seq-mean-token-mean"};
static const char *const kl_names[] = {"k1", "k2", "k3"};

int al_loss_kind_parse(const char *s, al_loss_kind *out, char *errstr, size_t errlen)
{
    for (int i = 0; s && i < 4; i++)
        if (strcmp(s, kind_names[i]) == 0) {
            *out = (al_loss_kind)i;
            return 0;
        }
    return loss_err(errstr, errlen, "unknown policy loss '%s' (expected ppo, gspo, cispo or sft)",
                    s ? s : "(null)");
}

int al_loss_agg_parse(const char *s, al_loss_agg *out, char *errstr, size_t errlen)
{
    for (int i = 0; s && i < 3; i++)
        if (strcmp(s, agg_names[i]) == 0) {
            *out = (al_loss_agg)i;
            return 0;
        }
    return loss_err(errstr, errlen,
                    "unknown loss aggregation '%s' (expected token-mean, seq-mean-token-sum or "
                    "seq-mean-token-mean)",
                    s ? s : "(null)");
}

int al_kl_kind_parse(const char *s, al_kl_kind *out, char *errstr, size_t errlen)
{
    /* verl's names for the same estimators are accepted too. */
    static const struct {
        const char *name;
        al_kl_kind kind;
    } names[] = {{"k1", AL_KL_K1}, {"kl", AL_KL_K1},         {"k2", AL_KL_K2},
                 {"mse", AL_KL_K2}, {"k3", AL_KL_K3}, {"low_var_kl", AL_KL_K3}};
    for (size_t i = 0; s && i < sizeof names / sizeof names[0]; i++)
        if (strcmp(s, names[i].name) == 0) {
            *out = names[i].kind;
            return 0;
        }
    return loss_err(errstr, errlen,
                    "unknown KL estimator '%s' (expected k1, k2 or k3; kl, mse, low_var_kl)",
                    s ? s : "(null)");
}

const char *al_loss_kind_name(al_loss_kind k)
{
    return (unsigned)k < 4 ? kind_names[k] : "?";
}

const char *al_loss_agg_name(al_loss_agg a)
{
    return (unsigned)a < 3 ? agg_names[a] : "?";
}

const char *al_kl_kind_name(al_kl_kind k)
{
    return (unsigned)k < 3 ? kl_names[k] : "?";
}

int al_loss_config_check(const al_loss_config *c, char *errstr, size_t errlen)
{
    if ((unsigned)c->kind > AL_LOSS_SFT)
        return loss_err(errstr, errlen, "unknown loss kind %d", (int)c->kind);
    if ((unsigned)c->agg > AL_LOSS_AGG_SEQ_MEAN_TOKEN_MEAN)
        return loss_err(errstr, errlen, "unknown aggregation %d", (int)c->agg);
    if ((unsigned)c->kl > AL_KL_K3)
        return loss_err(errstr, errlen, "unknown KL estimator %d", (int)c->kl);
    if (!(c->eps_low >= 0.0f) || !isfinite(c->eps_low))
        return loss_err(errstr, errlen, "eps_low must be >= 0 (got %g)", c->eps_low);
    if (c->kind != AL_LOSS_CISPO && c->kind != AL_LOSS_SFT && !(c->eps_low < 1.0f))
        return loss_err(errstr, errlen, "eps_low must be < 1 (got %g)", c->eps_low);
    if (!(c->eps_high >= 0.0f) || !isfinite(c->eps_high))
        return loss_err(errstr, errlen, "eps_high must be >= 0 (got %g)", c->eps_high);
    if (!(c->dual_clip == 0.0f || c->dual_clip > 1.0f) || !isfinite(c->dual_clip))
        return loss_err(errstr, errlen, "dual_clip must be 0 (off) or > 1 (got %g)",
                        c->dual_clip);
    if (!(c->tis_cap >= 0.0f) || !isfinite(c->tis_cap))
        return loss_err(errstr, errlen, "tis_cap must be >= 0 (0 = off; got %g)", c->tis_cap);
    if (!(c->kl_beta >= 0.0f) || !isfinite(c->kl_beta))
        return loss_err(errstr, errlen, "kl_beta must be >= 0 (got %g)", c->kl_beta);
    if (!isfinite(c->entropy_coef))
        return loss_err(errstr, errlen, "entropy_coef must be finite (got %g)",
                        c->entropy_coef);
    return 0;
}

void al_loss_stats_init(al_loss_stats *s)
{
    memset(s, 0, sizeof *s);
    s->ratio_max = -INFINITY;
}

void al_loss_stats_finish(al_loss_stats *s)
{
    double n = s->tokens > 0 ? s->tokens : 1.0;
    s->pg_loss = s->sum_pg / n;
    s->kl = s->sum_kl / n;
    s->entropy = s->sum_entropy / n;
    s->ratio_mean = s->tokens > 0 ? s->sum_ratio / n : 1.0;
    s->clip_frac = s->sum_clipped / n;
    s->dual_clip_frac = s->sum_dual_clipped / n;
    s->tis_mean = s->tokens > 0 ? s->sum_tis / n : 1.0;
    if (s->ratio_max == -INFINITY) s->ratio_max = 1.0;
}

/* Checks the sequence table and the inputs the configuration needs. */
static int loss_input_check(const al_loss_config *c, const al_loss_input *in, int need_dentropy,
                            char *errstr, size_t errlen)
{
    if (in->T < 0 || in->nseq < 0)
        return loss_err(errstr, errlen, "bad chunk shape (T=%d, nseq=%d)", in->T, in->nseq);
    if (!in->cu_seqlens) return loss_err(errstr, errlen, "cu_seqlens is missing");
    if (in->T > 0 && (!in->logp || !in->mask))
        return loss_err(errstr, errlen, "%s is missing", in->logp ? "mask" : "logp");
    if (in->cu_seqlens[0] != 0)
        return loss_err(errstr, errlen, "cu_seqlens must start at 0 (got %d)", (int)in->cu_seqlens[0]);
    for (int i = 0; i < in->nseq; i++)
        if (in->cu_seqlens[i + 1] < in->cu_seqlens[i])
            return loss_err(errstr, errlen, "cu_seqlens must not decrease (at sequence %d)", i);
    if (in->cu_seqlens[in->nseq] != in->T)
        return loss_err(errstr, errlen,
                        "cu_seqlens must end at T=%d (ends at %d): every token belongs to a sequence",
                        in->T, (int)in->cu_seqlens[in->nseq]);
    if (in->T == 0) return 0;
    if (c->kind != AL_LOSS_SFT && !in->adv)
        return loss_err(errstr, errlen, "advantages are missing for the %s loss",
                        al_loss_kind_name(c->kind));
    if (c->kl_beta > 0.0f && !in->ref_logp)
        return loss_err(errstr, errlen, "kl_beta > 0 needs the reference logprobs");
    if (c->entropy_coef != 0.0f && (!in->entropy || !need_dentropy))
        return loss_err(errstr, errlen, "entropy_coef != 0 needs %s",
                        in->entropy ? "a dentropy output" : "the per-token entropy");
    return 0;
}

double al_loss_local_norm(const al_loss_config *c, const al_loss_input *in)
{
    if (c->agg == AL_LOSS_AGG_TOKEN_MEAN) {
        double n = 0.0;
        for (int t = 0; t < in->T; t++) n += in->mask[t];
        return n;
    }
    double n = 0.0;
    for (int i = 0; i < in->nseq; i++) {
        for (int t = in->cu_seqlens[i]; t < in->cu_seqlens[i + 1]; t++)
            if (in->mask[t] > 0.0f) {
                n += 1.0;
                break;
            }
    }
    return n;
}

/* Clipped surrogate of one token: the loss value and its derivative with respect to the
 * ratio r (0 where a bound is hit), plus whether the clip / dual clip was active. A bound is
 * hit only when r is strictly beyond it. */
typedef struct clip_result {
    float loss;
    float dloss_dr;
    int clipped, dual_clipped;
} clip_result;

static clip_result clipped_surrogate(float r, float A, float lo, float hi, float dual_clip)
{
    clip_result c = {-A * r, -A, 0, 0};
    if ((A > 0.0f && r > hi) || (A < 0.0f && r < lo)) {
        c.loss = -A * (A > 0.0f ? hi : lo);
        c.dloss_dr = 0.0f;
        c.clipped = 1;
    }
    if (dual_clip > 0.0f && A < 0.0f && c.loss > -A * dual_clip) {
        c.loss = -A * dual_clip;
        c.dloss_dr = 0.0f;
        c.dual_clipped = 1;
    }
    return c;
}

static float clampf(float x, float lo, float hi)
{
    return x < lo ? lo : (x > hi ? hi : x);
}

/* Longer than this project's functions usually are, on purpose: it is the loss's kernel, one
 * pass over a chunk's tokens that computes every loss kind's value, its gradient and the
 * statistics together, term for term as the PyTorch reference does (t0650, t0651); split up,
 * the per-token state would travel through a struct in the hot loop. */
int al_loss_compute(const al_loss_config *c, const al_loss_input *in, double norm,
                    double *loss_out, float *dlogp, float *dentropy, al_loss_stats *stats,
                    char *errstr, size_t errlen)
{
    if (al_loss_config_check(c, errstr, errlen) != 0) return -1;
    if (loss_input_check(c, in, dentropy != NULL, errstr, errlen) != 0) return -1;
    if (norm <= 0.0) norm = al_loss_local_norm(c, in);
    double inv_norm = norm > 0.0 ? 1.0 / norm : 0.0;

    const float lo = 1.0f - c->eps_low, hi = 1.0f + c->eps_high;
    const int use_tis = c->tis_cap > 0.0f && in->rollout_logp != NULL && c->kind != AL_LOSS_SFT;
    const int use_kl = c->kl_beta > 0.0f;
    const int use_ent = c->entropy_coef != 0.0f;

    double total = 0.0;
    al_loss_stats st;
    al_loss_stats_init(&st);

    for (int i = 0; i < in->nseq; i++) {
        int b = in->cu_seqlens[i], e = in->cu_seqlens[i + 1];
        double seq_mask = 0.0;
        double seq_dlr = 0.0; /* sum of m (logp - old) for gspo */
        for (int t = b; t < e; t++) {
            seq_mask += in->mask[t];
            if (c->kind == AL_LOSS_GSPO && in->mask[t] > 0.0f) {
                float d = in->old_logp ? in->logp[t] - in->old_logp[t] : 0.0f;
                seq_dlr += (double)in->mask[t] * d;
            }
        }
        /* Weight of one masked token's loss in the aggregate. */
        double w;
        if (seq_mask <= 0.0) {
            w = 0.0;
        } else if (c->agg == AL_LOSS_AGG_SEQ_MEAN_TOKEN_MEAN) {
            w = inv_norm / seq_mask;
            st.seqs += 1.0;
        } else {
            w = inv_norm;
            st.seqs += 1.0;
        }
        float seq_ratio = 1.0f;
        if (c->kind == AL_LOSS_GSPO && seq_mask > 0.0)
            seq_ratio = expf(clampf((float)(seq_dlr / seq_mask), -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP));

        for (int t = b; t < e; t++) {
            float m = in->mask[t];
            if (!(m > 0.0f)) {
                if (dlogp) dlogp[t] = 0.0f;
                if (dentropy) dentropy[t] = 0.0f;
                continue;
            }
            float lp = in->logp[t];
            float old = in->old_logp ? in->old_logp[t] : lp;
            float A = in->adv ? in->adv[t] : 0.0f;
            float tis = 1.0f;
            if (use_tis) {
                float x = clampf(old - in->rollout_logp[t], -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP);
                tis = fminf(expf(x), c->tis_cap);
            }
            float pg = 0.0f, dpg = 0.0f, ratio = 1.0f;
            int clipped = 0, dual = 0;
            switch (c->kind) {
            case AL_LOSS_PPO: {
                float x = lp - old;
                float xc = clampf(x, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP);
                ratio = expf(xc);
                clip_result cr = clipped_surrogate(ratio, A, lo, hi, c->dual_clip);
                pg = cr.loss;
                /* d r / d logp = r, and 0 where the log-ratio clamp is active. */
                dpg = xc == x ? cr.dloss_dr * ratio : 0.0f;
                clipped = cr.clipped;
                dual = cr.dual_clipped;
                break;
            }
            case AL_LOSS_GSPO: {
                ratio = seq_ratio;
                clip_result cr = clipped_surrogate(ratio, A, lo, hi, c->dual_clip);
                pg = cr.loss;
                dpg = cr.dloss_dr * ratio; /* GSPO-token: d s_t / d logp_t = s */
                clipped = cr.clipped;
                dual = cr.dual_clipped;
                break;
            }
            case AL_LOSS_CISPO: {
                float x = clampf(lp - old, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP);
                ratio = expf(x);
                float wis = clampf(ratio, lo, hi);
                clipped = ratio < lo || ratio > hi;
                pg = -wis * A * lp;
                dpg = -wis * A;
                break;
            }
            case AL_LOSS_SFT:
                pg = -lp;
                dpg = -1.0f;
                break;
            }
            float kl = 0.0f, dkl = 0.0f;
            if (use_kl) {
                float d = lp - in->ref_logp[t];
                switch (c->kl) {
                case AL_KL_K1:
                    kl = d;
                    dkl = 1.0f;
                    break;
                case AL_KL_K2:
                    kl = 0.5f * d * d;
                    dkl = d;
                    break;
                case AL_KL_K3: {
                    float dc = clampf(d, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP);
                    float ex = expf(-dc);
                    kl = ex + dc - 1.0f;
                    dkl = dc == d ? 1.0f - ex : 0.0f;
                    break;
                }
                }
            }
            float ent = in->entropy ? in->entropy[t] : 0.0f;
            float tok = tis * pg + c->kl_beta * kl - (use_ent ? c->entropy_coef * ent : 0.0f);
            double wm = w * m;
            total += wm * tok;
            if (dlogp) dlogp[t] = (float)(wm * (tis * dpg + c->kl_beta * dkl));
            if (dentropy) dentropy[t] = use_ent ? (float)(-wm * c->entropy_coef) : 0.0f;

            st.tokens += m;
            st.sum_pg += (double)m * pg;
            st.sum_kl += (double)m * kl;
            st.sum_entropy += (double)m * ent;
            st.sum_ratio += (double)m * ratio;
            st.sum_clipped += clipped ? m : 0.0f;
            st.sum_dual_clipped += dual ? m : 0.0f;
            st.sum_tis += (double)m * tis;
            if (ratio > st.ratio_max) st.ratio_max = ratio;
        }
    }

    if (!use_kl && in->ref_logp) {
        /* KL is still worth reporting when a reference is given without a penalty. */
        st.sum_kl = 0.0;
        for (int t = 0; t < in->T; t++) {
            if (!(in->mask[t] > 0.0f)) continue;
            float d = in->logp[t] - in->ref_logp[t];
            float dc = clampf(d, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP);
            float kl = c->kl == AL_KL_K1 ? d : c->kl == AL_KL_K2 ? 0.5f * d * d : expf(-dc) + dc - 1.0f;
            st.sum_kl += (double)in->mask[t] * kl;
        }
    }
    st.loss = total;
    *loss_out = total;
    if (stats) {
        stats->loss += st.loss;
        stats->tokens += st.tokens;
        stats->seqs += st.seqs;
        stats->sum_pg += st.sum_pg;
        stats->sum_kl += st.sum_kl;
        stats->sum_entropy += st.sum_entropy;
        stats->sum_ratio += st.sum_ratio;
        stats->sum_clipped += st.sum_clipped;
        stats->sum_dual_clipped += st.sum_dual_clipped;
        stats->sum_tis += st.sum_tis;
        if (st.ratio_max > stats->ratio_max) stats->ratio_max = st.ratio_max;
    }
    return 0;
}
