/*
 * infer.c: sampling and raw logprobs (see infer.h); the batched forward over KV caches is
 * the model's one forward, in model.c.
 */
#include "model/infer.h"

#include "core/hash.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void al_infer_rng_seed(al_infer_rng *r, uint64_t seed, uint64_t stream)
{
    uint64_t x = seed;
    uint64_t mix = al_splitmix64(&x);
    x = mix ^ (stream * 0xd1b54a32d192ed03ull + 0x8cb92ba72f3d8dd7ull);
    for (int i = 0; i < 4; i++)
        r->s[i] = al_splitmix64(&x);
}

static inline uint64_t rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

uint64_t al_infer_rng_next(al_infer_rng *r)
{
    uint64_t *s = r->s;
    uint64_t out = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return out;
}

double al_infer_rng_uniform(al_infer_rng *r)
{
    return (double)(al_infer_rng_next(r) >> 11) * 0x1.0p-53;
}

int al_infer_sampling_check(const al_infer_sampling *p, char *errstr, size_t errlen)
{
    if (!(p->temperature >= 0 && p->temperature <= 2)) {
        snprintf(errstr, errlen, "temperature must be between 0 and 2, got %g", p->temperature);
        return -1;
    }
    if (!(p->top_p > 0 && p->top_p <= 1)) {
        snprintf(errstr, errlen, "top_p must be in (0, 1], got %g", p->top_p);
        return -1;
    }
    if (p->top_k < -1) {
        snprintf(errstr, errlen, "top_k must be -1 (disable) or at least 1, got %d", p->top_k);
        return -1;
    }
    return 0;
}

int al_infer_sampler_init(al_infer_sampler *s, int V)
{
    s->V = V;
    s->w = V > 0 ? malloc(sizeof(double) * (size_t)V) : NULL;
    s->idx = V > 0 ? malloc(sizeof(int32_t) * (size_t)V) : NULL;
    if (!s->w || !s->idx) {
        al_infer_sampler_free(s);
        return -1;
    }
    return 0;
}

void al_infer_sampler_free(al_infer_sampler *s)
{
    free(s->w);
    free(s->idx);
    s->w = NULL, s->idx = NULL, s->V = 0;
}

double al_infer_logsumexp_t(const float *logits, int V, double T)
{
    double mx = -INFINITY, sum = 0, inv = 1.0 / T;
    for (int j = 0; j < V; j++)
        if (logits[j] > mx) mx = logits[j];
    for (int j = 0; j < V; j++)
        sum += exp(((double)logits[j] - mx) * inv);
    return mx * inv + log(sum);
}

double al_infer_logsumexp(const float *logits, int V)
{
    double mx = -INFINITY, sum = 0;
    for (int j = 0; j < V; j++)
        if (logits[j] > mx) mx = logits[j];
    for (int j = 0; j < V; j++)
        sum += exp((double)logits[j] - mx);
    return mx + log(sum);
}

/* Order for candidate ids: larger logit first, then lower id (a total order, so qsort's
 * instability cannot change a result). */
static int cmp_logit_desc_with(const float *l, int32_t a, int32_t b)
{
    if (l[a] > l[b]) return -1;
    if (l[a] < l[b]) return 1;
    return a < b ? -1 : a > b;
}

/* Heap sift for a min-heap of the k best (worst at the root) under cmp_logit_desc_with. */
static void heap_sift(const float *l, int32_t *h, int n, int i)
{
    for (;;) {
        int w = i, a = 2 * i + 1, b = a + 1;
        if (a < n && cmp_logit_desc_with(l, h[a], h[w]) > 0) w = a;
        if (b < n && cmp_logit_desc_with(l, h[b], h[w]) > 0) w = b;
        if (w == i) return;
        int32_t t = h[i];
        h[i] = h[w], h[w] = t;
        i = w;
    }
}

/* Writes the k best ids (by logit, ties lower id) into out, best first. O(V log k). */
static void top_k_ids(const float *l, int V, int k, int32_t *out)
{
    int n = 0;
    for (int32_t j = 0; j < V; j++) {
        if (n < k) {
            out[n++] = j;
            if (n == k)
                for (int i = k / 2 - 1; i >= 0; i--)
                    heap_sift(l, out, k, i);
        } else if (cmp_logit_desc_with(l, j, out[0]) < 0) {
            out[0] = j;
            heap_sift(l, out, k, 0);
        }
    }
    if (n < k) /* V < k cannot happen (callers check); keep the heap valid anyway */
        for (int i = n / 2 - 1; i >= 0; i--)
            heap_sift(l, out, n, i);
    /* heap sort: repeatedly move the worst to the end */
    for (int end = n - 1; end > 0; end--) {
        int32_t t = out[0];
        out[0] = out[end], out[end] = t;
        heap_sift(l, out, end, 0);
    }
}

int32_t al_infer_sample(al_infer_sampler *s, const float *logits, const al_infer_sampling *p,
                        al_infer_rng *rng)
{
    int V = s->V;
    if (p->temperature <= 0) {
        int32_t best = 0;
        for (int32_t j = 1; j < V; j++)
            if (logits[j] > logits[best]) best = j;
        return best;
    }
    int k = (p->top_k > 0 && p->top_k < V) ? p->top_k : V;
    int use_p = p->top_p < 1;
    int n;
    double mass = -1; /* top_p's reference mass when not all candidates are listed */
    if (k < V) {
        top_k_ids(logits, V, k, s->idx);
        n = k;
    } else if (use_p) {
        /* top_p alone: the prefix it keeps is usually short (a peaked distribution), so it is
         * looked for among the kk largest logits, kk growing until their mass reaches top_p,
         * instead of sorting the whole vocabulary for every token. The prefix found is the
         * one a full sort gives (same order, ties by lower id). */
        double inv_t = 1.0 / p->temperature, mx = -INFINITY;
        for (int32_t j = 0; j < V; j++)
            if (logits[j] > mx) mx = logits[j];
        mass = 0;
        for (int32_t j = 0; j < V; j++)
            mass += exp(((double)logits[j] - mx) * inv_t);
        int kk = V < 64 ? V : 64;
        for (;;) {
            top_k_ids(logits, V, kk, s->idx);
            double acc = 0;
            for (int i = 0; i < kk; i++)
                acc += exp(((double)logits[s->idx[i]] - mx) * inv_t);
            if (acc >= p->top_p * mass || kk == V) break;
            kk = kk > V / 16 ? V : kk * 16;
        }
        n = kk;
    } else {
        for (int32_t j = 0; j < V; j++)
            s->idx[j] = j;
        n = V;
    }
    double inv_t = 1.0 / p->temperature, mx = -INFINITY, sum = 0;
    for (int i = 0; i < n; i++)
        if (logits[s->idx[i]] > mx) mx = logits[s->idx[i]];
    for (int i = 0; i < n; i++)
        sum += s->w[i] = exp(((double)logits[s->idx[i]] - mx) * inv_t);
    if (use_p) { /* candidates are sorted here: keep the prefix reaching top_p */
        double acc = 0, target = p->top_p * (mass >= 0 ? mass : sum);
        int keep = n;
        for (int i = 0; i < n; i++) {
            acc += s->w[i];
            if (acc >= target) {
                keep = i + 1;
                break;
            }
        }
        n = keep;
        sum = 0;
        for (int i = 0; i < n; i++)
            sum += s->w[i];
    }
    double u = al_infer_rng_uniform(rng) * sum, acc = 0;
    for (int i = 0; i < n; i++) {
        acc += s->w[i];
        if (u < acc) return s->idx[i];
    }
    /* rounding left u at the very top: the last candidate with weight */
    for (int i = n - 1; i >= 0; i--)
        if (s->w[i] > 0) return s->idx[i];
    return s->idx[0];
}

int al_infer_top_logprobs_t(const float *logits, int V, double lse_t, double T, int k, int32_t *ids,
                            double *logps)
{
    if (k < 0 || k > V) return -1;
    if (k == 0) return 0;
    top_k_ids(logits, V, k, ids);
    for (int i = 0; i < k; i++)
        logps[i] = al_infer_logprob_t(logits, lse_t, ids[i], T);
    return k;
}

int al_infer_top_logprobs(const float *logits, int V, double lse, int k, int32_t *ids,
                          double *logps)
{
    if (k < 0 || k > V) return -1;
    if (k == 0) return 0;
    top_k_ids(logits, V, k, ids);
    for (int i = 0; i < k; i++)
        logps[i] = al_infer_logprob(logits, lse, ids[i]);
    return k;
}
