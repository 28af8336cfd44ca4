/*
 * infer.c: sampling and raw logprobs (see infer.h).
 */
#include "model/infer.h"

#include "model/gemm.h"
#include "model/layers.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void al_infer_rng_seed(al_infer_rng *r, uint64_t seed, uint64_t stream)
{
    uint64_t x = seed;
    uint64_t mix = splitmix64(&x);
    x = mix ^ (stream * 0xd1b54a32d192ed03ull + 0x8cb92ba72f3d8dd7ull);
    for (int i = 0; i < 4; i++)
        r->s[i] = splitmix64(&x);
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

/* ---- KV caches and the batched forward ---- */

size_t al_infer_kv_bytes(const al_model_config *c, int max_tokens)
{
    return 2 * sizeof(float) * (size_t)c->num_layers * (size_t)max_tokens *
           (size_t)c->num_kv_heads * (size_t)c->head_dim;
}

al_infer_kv *al_infer_kv_new(const al_model_config *c, int max_tokens, char *errstr, size_t errlen)
{
    if (max_tokens <= 0) {
        snprintf(errstr, errlen, "kv cache: max_tokens must be positive, got %d", max_tokens);
        return NULL;
    }
    al_infer_kv *kv = calloc(1, sizeof *kv);
    if (!kv) goto oom;
    kv->L = c->num_layers, kv->max = max_tokens, kv->kvw = c->num_kv_heads * c->head_dim;
    size_t n = (size_t)kv->L * (size_t)max_tokens * (size_t)kv->kvw;
    kv->k = malloc(sizeof(float) * n);
    kv->v = malloc(sizeof(float) * n);
    if (!kv->k || !kv->v) goto oom;
    return kv;
oom:
    snprintf(errstr, errlen, "kv cache: out of memory for %d tokens (%.1f MiB)", max_tokens,
             al_infer_kv_bytes(c, max_tokens) / 1048576.0);
    al_infer_kv_free(kv);
    return NULL;
}

void al_infer_kv_free(al_infer_kv *kv)
{
    if (!kv) return;
    free(kv->k);
    free(kv->v);
    free(kv);
}

int al_infer_kv_copy_prefix(al_infer_kv *dst, const al_infer_kv *src, int len)
{
    if (len < 0 || len > src->len || len > dst->max || dst->L != src->L || dst->kvw != src->kvw)
        return -1;
    size_t row = (size_t)src->kvw;
    for (int l = 0; l < src->L; l++) {
        memcpy(dst->k + (size_t)l * dst->max * row, src->k + (size_t)l * src->max * row,
               sizeof(float) * row * (size_t)len);
        memcpy(dst->v + (size_t)l * dst->max * row, src->v + (size_t)l * src->max * row,
               sizeof(float) * row * (size_t)len);
    }
    dst->len = len;
    return 0;
}

struct al_infer_scratch {
    size_t rows; /* capacity in rows */
    float *mem;
    float *x, *ln, *q, *k, *v, *att, *tmp, *gate, *up, *rstd, *hrstd, *cos_t, *sin_t, *last;
    int32_t *pos, *tok;
    int *row_seq; /* (rows) which sequence a row belongs to */
};

al_infer_scratch *al_infer_scratch_new(void)
{
    return calloc(1, sizeof(al_infer_scratch));
}

void al_infer_scratch_free(al_infer_scratch *s)
{
    if (!s) return;
    free(s->mem);
    free(s->pos);
    free(s->tok);
    free(s->row_seq);
    free(s);
}

/* Grows s to R rows (and n sequences' last rows) for config c. 0 or -1. */
static int scratch_ensure(al_infer_scratch *s, const al_model_config *c, size_t R, int n)
{
    size_t need_rows = R > (size_t)n ? R : (size_t)n;
    if (need_rows <= s->rows) return 0;
    size_t rows = s->rows ? s->rows : 16;
    while (rows < need_rows)
        rows *= 2;
    size_t C = c->hidden_size, Q = (size_t)c->num_heads * c->head_dim;
    size_t KV = (size_t)c->num_kv_heads * c->head_dim, I = c->intermediate_size;
    size_t half = c->head_dim / 2, NH = c->num_heads;
    size_t per = C /* x */ + C /* ln */ + Q + KV + KV + Q /* att */ + C /* tmp */ + I + I + 1 +
                 NH /* hrstd */ + half + half + C /* last */;
    float *mem = malloc(sizeof(float) * per * rows);
    int32_t *pos = malloc(sizeof(int32_t) * rows), *tok = malloc(sizeof(int32_t) * rows);
    int *rs = malloc(sizeof(int) * rows);
    if (!mem || !pos || !tok || !rs) {
        free(mem), free(pos), free(tok), free(rs);
        return -1;
    }
    free(s->mem), free(s->pos), free(s->tok), free(s->row_seq);
    s->mem = mem, s->pos = pos, s->tok = tok, s->row_seq = rs, s->rows = rows;
    float *p = mem;
#define CARVE(f, w)                                                                                \
    s->f = p;                                                                                      \
    p += (w)*rows
    CARVE(x, C);
    CARVE(ln, C);
    CARVE(q, Q);
    CARVE(k, KV);
    CARVE(v, KV);
    CARVE(att, Q);
    CARVE(tmp, C);
    CARVE(gate, I);
    CARVE(up, I);
    CARVE(rstd, 1);
    CARVE(hrstd, NH);
    CARVE(cos_t, half);
    CARVE(sin_t, half);
    CARVE(last, C);
#undef CARVE
    return 0;
}

int al_infer_forward(const al_model *m, al_infer_scratch *s, al_infer_kv *const *kvs,
                     const int32_t *const *tokens, const int *ntok, int n, float *logits,
                     char *errstr, size_t errlen)
{
    const al_model_config *c = al_model_config_of(m);
    const al_model_weights *p = al_model_param_tensors(m);
    if (n <= 0) {
        snprintf(errstr, errlen, "infer forward: no sequences");
        return -1;
    }
    size_t R = 0;
    for (int i = 0; i < n; i++) {
        if (ntok[i] <= 0 || ntok[i] > kvs[i]->max - kvs[i]->len) {
            snprintf(errstr, errlen,
                     "infer forward: sequence %d: %d more tokens do not fit its cache (%d of %d "
                     "used)",
                     i, ntok[i], kvs[i]->len, kvs[i]->max);
            return -1;
        }
        for (int t = 0; t < ntok[i]; t++)
            if (tokens[i][t] < 0 || tokens[i][t] >= c->vocab_size) {
                snprintf(errstr, errlen, "infer forward: token %d is outside the vocabulary (%d)",
                         tokens[i][t], c->vocab_size);
                return -1;
            }
        R += (size_t)ntok[i];
    }
    if (scratch_ensure(s, c, R, n) != 0) {
        snprintf(errstr, errlen, "infer forward: out of memory for %zu rows", R);
        return -1;
    }
    int C = c->hidden_size, I = c->intermediate_size, NH = c->num_heads, NKV = c->num_kv_heads;
    int HD = c->head_dim, Q = NH * HD, KV = NKV * HD, rep = NH / NKV, T = (int)R;
    float eps = (float)c->rms_norm_eps, scale = 1.0f / sqrtf((float)HD);
    for (int i = 0, r = 0; i < n; i++)
        for (int t = 0; t < ntok[i]; t++, r++) {
            s->pos[r] = kvs[i]->len + t;
            s->tok[r] = tokens[i][t];
            s->row_seq[r] = i;
        }
    al_rope_tables(s->cos_t, s->sin_t, s->pos, T, HD, c->rope_theta);
    al_embedding_forward(s->x, s->tok, p->embed, T, C);
    for (int l = 0; l < c->num_layers; l++) {
        al_rmsnorm_forward(s->ln, s->rstd, s->x, p->ln1 + (size_t)l * C, T, C, eps);
        al_linear_forward(s->q, s->ln, p->wq + (size_t)l * Q * C,
                          p->bq ? p->bq + (size_t)l * Q : NULL, T, C, Q);
        al_linear_forward(s->k, s->ln, p->wk + (size_t)l * KV * C,
                          p->bk ? p->bk + (size_t)l * KV : NULL, T, C, KV);
        al_linear_forward(s->v, s->ln, p->wv + (size_t)l * KV * C,
                          p->bv ? p->bv + (size_t)l * KV : NULL, T, C, KV);
        if (c->qk_norm) {
            al_rmsnorm_forward(s->q, s->hrstd, s->q, p->q_norm + (size_t)l * HD, T * NH, HD, eps);
            al_rmsnorm_forward(s->k, s->hrstd, s->k, p->k_norm + (size_t)l * HD, T * NKV, HD, eps);
        }
        al_rope_forward(s->q, s->cos_t, s->sin_t, T, NH, HD);
        al_rope_forward(s->k, s->cos_t, s->sin_t, T, NKV, HD);
        /* new keys and values into each sequence's cache, at their positions */
        for (int r = 0; r < T; r++) {
            al_infer_kv *kv = kvs[s->row_seq[r]];
            size_t off = ((size_t)l * kv->max + (size_t)s->pos[r]) * (size_t)KV;
            memcpy(kv->k + off, s->k + (size_t)r * KV, sizeof(float) * KV);
            memcpy(kv->v + off, s->v + (size_t)r * KV, sizeof(float) * KV);
        }
        /* attention of every (row, head) against its cache up to its own position, one pass
         * with a running maximum (no score buffer) */
#pragma omp parallel for schedule(dynamic, 4) if ((size_t)T * NH * (kvs[0]->len + 1) > 8192)
        for (int rh = 0; rh < T * NH; rh++) {
            int r = rh / NH, h = rh % NH;
            const al_infer_kv *kv = kvs[s->row_seq[r]];
            const float *q = s->q + (size_t)r * Q + (size_t)h * HD;
            const float *kc = kv->k + (size_t)l * kv->max * KV + (size_t)(h / rep) * HD;
            const float *vc = kv->v + (size_t)l * kv->max * KV + (size_t)(h / rep) * HD;
            float *out = s->att + (size_t)r * Q + (size_t)h * HD;
            float mx = -INFINITY, sum = 0.0f;
            for (int d = 0; d < HD; d++)
                out[d] = 0.0f;
            for (int j = 0; j <= s->pos[r]; j++) {
                const float *kj = kc + (size_t)j * KV, *vj = vc + (size_t)j * KV;
                float dot = 0.0f;
                for (int d = 0; d < HD; d++)
                    dot += q[d] * kj[d];
                dot *= scale;
                if (dot > mx) {
                    float f = expf(mx - dot);
                    sum *= f;
                    for (int d = 0; d < HD; d++)
                        out[d] *= f;
                    mx = dot;
                }
                float w = expf(dot - mx);
                sum += w;
                for (int d = 0; d < HD; d++)
                    out[d] += w * vj[d];
            }
            float inv = 1.0f / sum;
            for (int d = 0; d < HD; d++)
                out[d] *= inv;
        }
        al_linear_forward(s->tmp, s->att, p->wo + (size_t)l * C * Q,
                          p->bo ? p->bo + (size_t)l * C : NULL, T, Q, C);
        al_residual_forward(s->x, s->x, s->tmp, (size_t)T * C);
        al_rmsnorm_forward(s->ln, s->rstd, s->x, p->ln2 + (size_t)l * C, T, C, eps);
        al_linear_forward(s->gate, s->ln, p->w_gate + (size_t)l * I * C, NULL, T, C, I);
        al_linear_forward(s->up, s->ln, p->w_up + (size_t)l * I * C, NULL, T, C, I);
        al_swiglu_forward(s->gate, s->gate, s->up, (size_t)T * I);
        al_linear_forward(s->tmp, s->gate, p->w_down + (size_t)l * C * I, NULL, T, I, C);
        al_residual_forward(s->x, s->x, s->tmp, (size_t)T * C);
    }
    /* the last row of each sequence through the final norm and the LM head */
    for (int i = 0, r = 0; i < n; i++) {
        r += ntok[i];
        memcpy(s->last + (size_t)i * C, s->x + (size_t)(r - 1) * C, sizeof(float) * C);
        kvs[i]->len += ntok[i];
    }
    al_rmsnorm_forward(s->ln, s->rstd, s->last, p->ln_f, n, C, eps);
    al_lm_head_forward(logits, s->ln, p->lm_head, n, C, c->vocab_size);
    return 0;
}
