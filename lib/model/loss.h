/*
 * loss.h: policy-gradient losses on per-token logprobs (PPO, GSPO, CISPO, SFT), with
 * truncated importance sampling, KL to a reference policy and an entropy bonus.
 *
 * The losses work on per-token values of one chunk (a packed micro-batch of T tokens holding
 * nseq sequences, cu_seqlens[0] = 0 ... cu_seqlens[nseq] = T). Only tokens with mask > 0 count
 * (the response tokens). Every function writes the gradient of the loss with respect to the
 * trainer's logprobs (and entropies); lib/model/logprob.h turns those into d loss / d logits.
 *
 * Per-token loss l_t (r_t = exp(clamp(logp - old_logp, -20, 20)), A_t the advantage):
 *   ppo:   max(-A r, -A clip(r, 1-eps_low, 1+eps_high)); with dual_clip c > 1 and A < 0 the
 *          result is capped at -A c. A bound is "hit" only when r lies strictly beyond it: at
 *          r exactly on a bound the gradient flows.
 *   gspo:  as ppo, with r replaced by the sequence ratio s_i = exp(mean over the sequence's
 *          masked tokens of (logp - old_logp)) in the GSPO-token form: the value is s_i, and
 *          d s / d logp_t = s_i for each token (verl's implementation; with seq-mean-token-mean
 *          it equals the sequence-level GSPO gradient).
 *   cispo: -sg(clip(r, 1-eps_low, 1+eps_high)) * A * logp  (MiniMax-M1; sg = stop-gradient).
 *   sft:   -logp (cross-entropy of the target tokens).
 * Truncated importance sampling (tis_cap C > 0 and rollout_logp given): each policy loss is
 * multiplied by w_t = min(exp(old_logp - rollout_logp), C), a constant (no gradient).
 * KL (kl_beta > 0, ref_logp given), d = logp - ref_logp:
 *   k1: d     k2: d^2 / 2     k3: exp(-d) + d - 1  (d clamped to [-20, 20] inside exp)
 * Total per token: w_t l_t + beta kl_t - entropy_coef H_t.
 *
 * Aggregation over the masked tokens (m_t = mask):
 *   token-mean:           sum_t m_t L_t / N_tokens
 *   seq-mean-token-sum:   sum_i sum_{t in i} m_t L_t / N_seqs
 *   seq-mean-token-mean:  sum_i (sum_{t in i} m_t L_t / sum_{t in i} m_t) / N_seqs
 * where N_tokens = sum of masks, N_seqs = sequences with at least one masked token, both over
 * the whole (mini-)batch: pass the batch's total as `norm` so that the losses of the chunks of a
 * step add up to the loss of the step (gradient accumulation); al_loss_local_norm gives one
 * chunk's share.
 */
#ifndef ARCLIGHT_MODEL_LOSS_H
#define ARCLIGHT_MODEL_LOSS_H

#include <stddef.h>
#include <stdint.h>

typedef enum al_loss_kind {
    AL_LOSS_PPO,
    AL_LOSS_GSPO,
    AL_LOSS_CISPO,
    AL_LOSS_SFT,
} al_loss_kind;

typedef enum al_loss_agg {
    AL_LOSS_AGG_TOKEN_MEAN,
    AL_LOSS_AGG_SEQ_MEAN_TOKEN_SUM,
    AL_LOSS_AGG_SEQ_MEAN_TOKEN_MEAN,
} al_loss_agg;

typedef enum al_kl_kind {
    AL_KL_K1,
    AL_KL_K2,
    AL_KL_K3,
} al_kl_kind;

typedef struct al_loss_config {
    al_loss_kind kind;
    al_loss_agg agg;
    float eps_low;      /* lower clip: ratio >= 1 - eps_low (ppo, gspo, cispo) */
    float eps_high;     /* upper clip: ratio <= 1 + eps_high (clip-higher when > eps_low) */
    float dual_clip;    /* c > 1 caps the loss of negative advantages at -A c; 0 = off */
    float tis_cap;      /* truncated IS cap C on exp(old - rollout); 0 = off */
    al_kl_kind kl;      /* estimator of KL(policy || reference) */
    float kl_beta;      /* 0 = no KL term */
    float entropy_coef; /* 0 = no entropy bonus */
} al_loss_config;

/* Defaults: ppo, token-mean, eps 0.2/0.2, no dual clip, no TIS, k3 with beta 0, no entropy. */
void al_loss_config_default(al_loss_config *cfg);

/* Parsers from the names used on the command line and in config files: "ppo", "gspo",
 * "cispo", "sft"; "token-mean", "seq-mean-token-sum", "seq-mean-token-mean"; "k1", "k2",
 * "k3" (also "kl", "mse", "low_var_kl"). 0, or -1 with an error that lists the valid names. */
int al_loss_kind_parse(const char *s, al_loss_kind *out, char *errstr, size_t errlen);
int al_loss_agg_parse(const char *s, al_loss_agg *out, char *errstr, size_t errlen);
int al_kl_kind_parse(const char *s, al_kl_kind *out, char *errstr, size_t errlen);
const char *al_loss_kind_name(al_loss_kind k);
const char *al_loss_agg_name(al_loss_agg a);
const char *al_kl_kind_name(al_kl_kind k);

/* Checks ranges (eps >= 0, dual_clip 0 or > 1, caps and coefficients >= 0, enums known).
 * 0, or -1 with the offending field named in errstr. */
int al_loss_config_check(const al_loss_config *cfg, char *errstr, size_t errlen);

/* One chunk's per-token inputs; every array has T entries unless said otherwise. */
typedef struct al_loss_input {
    int T;
    int nseq;
    const int32_t *cu_seqlens;  /* (nseq + 1) offsets, 0 ... T, non-decreasing */
    const float *logp;          /* trainer's logprobs of the targets (the differentiated ones) */
    const float *old_logp;      /* logprobs before this step's update; NULL = logp (ratio 1) */
    const float *rollout_logp;  /* sampler's logprobs; NULL = no truncated IS */
    const float *ref_logp;      /* reference policy's logprobs; required when kl_beta > 0 */
    const float *entropy;       /* per-token entropy; required when entropy_coef != 0 */
    const float *adv;           /* advantages; required except for sft */
    const float *mask;          /* weights, 1 on response tokens and 0 elsewhere */
} al_loss_input;

/* Statistics over masked tokens. al_loss_compute adds the sums of a chunk; call
 * al_loss_stats_finish once after the last chunk to fill the means. */
typedef struct al_loss_stats {
    /* sums (accumulated over chunks) */
    double loss;        /* aggregated loss (sum of the chunks' contributions) */
    double tokens;      /* sum of masks */
    double seqs;        /* sequences with a masked token */
    double sum_pg;      /* sum of m * policy loss (before TIS weighting) */
    double sum_kl;      /* sum of m * kl (0 when no reference) */
    double sum_entropy; /* sum of m * entropy (0 when not given) */
    double sum_ratio;   /* sum of m * ratio (token ratio; sequence ratio for gspo) */
    double sum_clipped; /* sum of m over tokens whose ratio hit a clip bound */
    double sum_dual_clipped; /* sum of m over tokens capped by the dual clip */
    double sum_tis;     /* sum of m * truncated IS weight (1 when off) */
    double ratio_max;   /* largest ratio seen */
    /* means, filled by al_loss_stats_finish */
    double pg_loss, kl, entropy, ratio_mean, clip_frac, dual_clip_frac, tis_mean;
} al_loss_stats;

void al_loss_stats_init(al_loss_stats *s);
void al_loss_stats_finish(al_loss_stats *s);

/* The chunk's share of the aggregation normalizer: its masked-token count (token-mean) or
 * its number of sequences with a masked token (seq-mean-*). Sum it over a step's chunks and
 * pass the total as `norm` to al_loss_compute. */
double al_loss_local_norm(const al_loss_config *cfg, const al_loss_input *in);

/* Computes the chunk's contribution to the aggregated loss (*loss_out), and writes
 * dlogp (T) = d loss / d logp and, when dentropy is not NULL, dentropy (T) = d loss / d H
 * (tokens outside the mask get 0). norm <= 0 means "this chunk is the whole batch"
 * (al_loss_local_norm). stats may be NULL; otherwise the chunk's sums are added to it.
 * dentropy may be NULL only when entropy_coef is 0.
 * Returns 0, or -1 with the reason in errstr (missing input, bad cu_seqlens, a sequence
 * table that does not cover 0..T); outputs are then unspecified. Allocates nothing. */
int al_loss_compute(const al_loss_config *cfg, const al_loss_input *in, double norm,
                    double *loss_out, float *dlogp, float *dentropy, al_loss_stats *stats,
                    char *errstr, size_t errlen);

#endif
