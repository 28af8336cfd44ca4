/*
 * trainer.h: one policy-gradient training step over the model (lib/model/model.h): forward,
 * per-token logprobs, loss, backward per chunk with gradient accumulation, then gradient
 * clipping and AdamW; several PPO epochs and mini-batches per step.
 *
 * A step is a list of chunks (packed micro-batches, as arclight.batches carries them). Per-
 * token arrays of a chunk are aligned with its TOKENS: mask[t] says whether token t is
 * trained on (a response token), adv[t] and rollout_logp[t] belong to token t (the sampler's
 * logprob of emitting it). The trainer shifts them onto the logits rows that predict each
 * token (row t-1 predicts token t; the first token of a sequence is never predicted, so its
 * mask is ignored).
 *
 * Within a step:
 *   - "old" logprobs are computed once, with the weights before the step's first update
 *     (skipped when the step makes a single update: the ratio is then exactly 1);
 *   - reference logprobs come from the frozen reference model when kl_beta > 0;
 *   - the chunks are split, in order, into `mini_batches` groups; each group is one optimizer
 *     update whose loss is aggregated over the whole group (al_loss_local_norm summed over
 *     its chunks), so chunking never changes the result beyond float rounding;
 *   - the whole thing repeats `ppo_epochs` times.
 * There is no randomness: the same weights, optimizer state and chunks give the same result,
 * which is what exact resume from a checkpoint relies on.
 */
#ifndef ARCLIGHT_MODEL_TRAINER_H
#define ARCLIGHT_MODEL_TRAINER_H

#include "model/loss.h"
#include "model/model.h"
#include "model/optim.h"

#include <stddef.h>
#include <stdint.h>

typedef struct al_trainer_config {
    al_loss_config loss;
    al_optim_config optim;
    int ppo_epochs;        /* passes over a step's chunks (>= 1) */
    int mini_batches;      /* optimizer updates per epoch (>= 1; at most the chunk count) */
    float temperature;     /* the sampler's temperature: logprobs of softmax(logits / tau) */
    int decay_1d;          /* 1: weight decay on 1-D tensors (norms, biases) too; 0: only on
                              matrices and embeddings (Hugging Face Trainer's choice) */
} al_trainer_config;

/* Loss defaults (al_loss_config_default), optimizer defaults (al_optim_config_default),
 * 1 epoch, 1 mini-batch, temperature 1, no decay on 1-D tensors. */
void al_trainer_config_default(al_trainer_config *cfg);

/* Sets one setting by name from its text, the way a command line or config file gives it.
 * Names (values):
 *   loss (ppo|gspo|cispo|sft)  loss_agg (token-mean|seq-mean-token-sum|seq-mean-token-mean)
 *   eps_low, eps_high, dual_clip, tis_cap, kl (k1|k2|k3), kl_beta, entropy_coef
 *   ppo_epochs, mini_batches, temperature, decay_1d (0|1|true|false)
 *   lr, beta1, beta2, adam_eps, weight_decay, grad_clip, lr_schedule (constant|cosine),
 *   warmup_steps, total_steps, min_lr_ratio
 * Ranges are checked by al_trainer_new, not here. 0, or -1 with errstr naming the key and
 * the problem (unknown key, not a number, unknown choice). */
int al_trainer_config_set(al_trainer_config *cfg, const char *key, const char *value,
                          char *errstr, size_t errlen);

/* Applies every member of a JSON object (text of len bytes) with al_trainer_config_set;
 * values may be strings, numbers or booleans. Members not in the list above are an error
 * unless `ignore_unknown` (so that one config file can hold other stages' settings). */
int al_trainer_config_from_json(al_trainer_config *cfg, const char *text, size_t len,
                                int ignore_unknown, char *errstr, size_t errlen);

/* One packed micro-batch. Arrays are read during al_trainer_step only (not kept). */
typedef struct al_train_chunk {
    int T;                     /* tokens */
    int nseq;                  /* sequences packed in it */
    const int32_t *tokens;     /* (T) */
    const int32_t *positions;  /* (T) RoPE positions; NULL = 0, 1, ... within each sequence */
    const int32_t *cu_seqlens; /* (nseq + 1) 0 ... T */
    const float *mask;         /* (T) 1 on tokens to train on */
    const float *adv;          /* (T) advantage of each token; NULL only for sft */
    const float *rollout_logp; /* (T) sampler's logprob of each token; NULL = none (no TIS) */
} al_train_chunk;

typedef struct al_train_stats {
    int64_t step;         /* optimizer updates done in total after this step */
    int updates;          /* optimizer updates in this step (epochs x mini-batches) */
    double loss;          /* mean over the step's updates of the aggregated loss */
    double pg_loss;       /* masked-token means over every pass of the step */
    double kl;            /* vs the reference (estimator of the loss config), if any */
    double entropy;
    double clip_frac, dual_clip_frac, ratio_mean, ratio_max, tis_mean;
    double grad_norm;     /* mean over updates of the global norm before clipping */
    double grad_norm_max;
    double lr;            /* learning rate of the last update */
    double tokens;        /* masked (trained) tokens in the step, counted once */
    double seqs;          /* sequences with a trained token, counted once */
    int64_t step_tokens;  /* all tokens of the step's chunks, counted once */
    double seconds;       /* wall time of the step */
    double tokens_per_s;  /* step_tokens x epochs / seconds: tokens through forward+backward */
} al_train_stats;

typedef struct al_trainer al_trainer;

/* A trainer updating `policy` (borrowed: it must outlive the trainer) with AdamW state for
 * all its parameters. `reference` (borrowed, may be NULL) is the frozen model for the KL
 * term; it is required when cfg->loss.kl_beta > 0 and must have the policy's config.
 * NULL with errstr on a bad config, a missing or mismatched reference, out of memory. */
al_trainer *al_trainer_new(al_model *policy, al_model *reference, const al_trainer_config *cfg,
                           char *errstr, size_t errlen);
void al_trainer_free(al_trainer *tr);

/* A new model with m's config and a copy of its parameters (e.g. the reference model from
 * the initial weights). NULL with errstr. Free with al_model_free. */
al_model *al_trainer_clone_model(al_model *m, char *errstr, size_t errlen);

/* Runs one training step over `nchunks` chunks (see the top of this file) and fills *out.
 * Returns 0, or -1 with errstr (bad chunk: shape, cu_seqlens, token out of vocabulary,
 * missing advantages; a non-finite loss or gradient norm, in which case no update is
 * applied for that mini-batch and the step stops; out of memory). The model's gradients are
 * left holding the last mini-batch's (clipped) gradients. */
int al_trainer_step(al_trainer *tr, const al_train_chunk *chunks, int nchunks,
                    al_train_stats *out, char *errstr, size_t errlen);

/* Data parallelism (dist.h): the trainer runs its replica's share of each mini-batch and
 * sums gradients and statistics over d (borrowed; NULL or world 1: alone). Every replica
 * takes rank 0's weights, moments and optimizer step first (call after loading or resuming
 * on every rank). 0, or -1 with errstr. */
typedef struct al_dist al_dist;
int al_trainer_set_dist(al_trainer *tr, al_dist *d, char *errstr, size_t errlen);

/* Accessors for checkpoints. On a device backend the optimizer's moments come back to the
 * host first; al_trainer_optimizer lets the caller change them (a checkpoint being loaded:
 * the device's copies are refreshed before the next update), _read only reads them. */
al_model *al_trainer_policy(al_trainer *tr);
al_adamw *al_trainer_optimizer(al_trainer *tr);
const al_adamw *al_trainer_optimizer_read(al_trainer *tr);
const al_trainer_config *al_trainer_config_of(const al_trainer *tr);

#endif
