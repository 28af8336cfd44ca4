/*
 * infer.h: the inference path of the model library, for the serve stage.
 *
 * Batched forward with KV caches (al_infer_kv, al_infer_forward): several sequences advance
 * together in one pass, each by its own number of tokens (a prompt chunk being prefilled,
 * or one token being decoded), so that every Linear layer is one matrix product over all
 * their rows (what makes 16 sequences cost far less than 16 passes). Attention stays per
 * sequence, against its own cache (the backend's attention_kv op). It is the model's one
 * forward (model.c) in its serving form: results equal al_model_forward on each whole
 * sequence up to float rounding (test 1100). al_model_kv_* in model.h is the one-sequence
 * form.
 *
 *   - Log-probabilities are "raw": log softmax of the model's logits at temperature 1,
 *     before temperature, top-k or top-p (vLLM V1's default logprobs mode). They are
 *     computed in double with the row maximum subtracted, as al_logprob_forward does, so a
 *     served logprob equals the trainer's for the same token and weights up to the float
 *     rounding of the logits themselves.
 *   - Sampling is deterministic for a given seed and stream: xoshiro256** seeded through
 *     splitmix64. temperature 0 is greedy (lowest id on ties). top_k keeps the k largest
 *     logits, top_p then keeps the smallest prefix (by probability, descending; ties by
 *     lower id) whose mass reaches top_p; one draw picks within what is kept.
 *   - A sampler holds scratch for one vocabulary; one sampler per thread.
 *
 * libc and libm only (the sampler); the forward runs on the model's backend.
 */
#ifndef ARCLIGHT_MODEL_INFER_H
#define ARCLIGHT_MODEL_INFER_H

#include "model/config.h"
#include "model/model.h"

#include <stddef.h>
#include <stdint.h>

/* Pseudo-random stream: xoshiro256**. */
typedef struct al_infer_rng {
    uint64_t s[4];
} al_infer_rng;

/* Seeds from (seed, stream): different streams of one seed are independent (choice i of an
 * n > 1 request is stream i). */
void al_infer_rng_seed(al_infer_rng *r, uint64_t seed, uint64_t stream);
uint64_t al_infer_rng_next(al_infer_rng *r);
/* Uniform in [0, 1), 53 bits. */
double al_infer_rng_uniform(al_infer_rng *r);

typedef struct al_infer_sampling {
    double temperature; /* 0: greedy; > 0 */
    double top_p;       /* (0, 1]; 1: off */
    int top_k;          /* 0 or -1: off; else >= 1 */
} al_infer_sampling;

/* 0 when the values are usable, else -1 with errstr naming the field (as an OpenAI-style
 * error message: "temperature must be between 0 and 2, got 3"). */
int al_infer_sampling_check(const al_infer_sampling *p, char *errstr, size_t errlen);

typedef struct al_infer_sampler {
    int V;
    double *w;    /* (V) */
    int32_t *idx; /* (V) */
} al_infer_sampler;

/* Scratch for vocabulary V. 0, or -1 when out of memory or V <= 0. */
int al_infer_sampler_init(al_infer_sampler *s, int V);
void al_infer_sampler_free(al_infer_sampler *s);

/* Draws the next token from logits (V) with p (checked by the caller) and rng (advanced by
 * exactly one draw unless greedy). Returns the token id. */
int32_t al_infer_sample(al_infer_sampler *s, const float *logits, const al_infer_sampling *p,
                        al_infer_rng *rng);

/* log(sum_j exp(logits[j])) in double, max subtracted. */
double al_infer_logsumexp(const float *logits, int V);
/* Raw log-probability of `token` given lse = al_infer_logsumexp(logits, V). */
static inline double al_infer_logprob(const float *logits, double lse, int32_t token)
{
    return (double)logits[token] - lse;
}
/* The same at temperature T > 0: log softmax(logits / T), what the trainer computes with its
 * `temperature` setting (al_logprob_forward). lse_t = al_infer_logsumexp_t(logits, V, T). */
double al_infer_logsumexp_t(const float *logits, int V, double T);
static inline double al_infer_logprob_t(const float *logits, double lse_t, int32_t token, double T)
{
    return (double)logits[token] / T - lse_t;
}

/* ---- KV caches and the batched forward ---- */

/* Keys and values of one sequence on the model's backend (ops.h: len and max are read by
 * callers; the rest is the backend's). */
typedef al_kv al_infer_kv;

/* A cache for up to max_tokens tokens of model m's shape, on m's backend. NULL with errstr.
 * A cache serves any weights of that shape on the same backend. */
al_infer_kv *al_infer_kv_new(const al_model *m, int max_tokens, char *errstr, size_t errlen);
void al_infer_kv_free(al_infer_kv *kv);
/* Makes dst hold the first len tokens of src (same model shape and backend; len <= src's
 * length and dst's capacity): n > 1 samples of one prompt prefill it once. 0, or -1 when it
 * does not fit or the shapes differ. */
int al_infer_kv_copy_prefix(al_infer_kv *dst, const al_infer_kv *src, int len);
/* Bytes a cache of max_tokens takes. */
size_t al_infer_kv_bytes(const al_model_config *c, int max_tokens);

/* Scratch of the batched forward (grows to the most rows seen). One per thread. */
typedef struct al_infer_scratch al_infer_scratch;
al_infer_scratch *al_infer_scratch_new(void);
void al_infer_scratch_free(al_infer_scratch *s);

/* Advances n sequences of model m: sequence i appends ntok[i] >= 1 tokens (tokens[i]) to
 * kvs[i] and gets the logits of its last new token in row i of logits (n, V). m is only
 * read (any number of threads may run it with their own scratch and caches). Returns 0, or
 * -1 with errstr (a cache would overflow, a token outside the vocabulary, out of memory);
 * on failure no cache has changed length. */
int al_infer_forward(const al_model *m, al_infer_scratch *s, al_infer_kv *const *kvs,
                     const int32_t *const *tokens, const int *ntok, int n, float *logits,
                     char *errstr, size_t errlen);

/* The k most likely tokens (k <= V), most likely first (ties: lower id first): ids (k)
 * and their raw logprobs (k). Returns k, or -1 when k is out of range. */
int al_infer_top_logprobs(const float *logits, int V, double lse, int k, int32_t *ids,
                          double *logps);
/* The same at temperature T (lse_t from al_infer_logsumexp_t); the order does not change. */
int al_infer_top_logprobs_t(const float *logits, int V, double lse_t, double T, int k, int32_t *ids,
                            double *logps);

#endif
