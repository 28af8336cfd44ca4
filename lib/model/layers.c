/*
 * layers.c: the decoder's layers on the CPU. GEMMs go through al_gemm (OpenBLAS threads
 * them); the element-wise and row-wise loops use OpenMP across rows when they are large
 * enough to pay for the threads.
 */
#include "model/layers.h"

#include "model/gemm.h"

#include <math.h>
#include <string.h>

/* Below this many floats a loop stays on one thread. */
#define PAR_MIN 16384

void al_embedding_forward(float *out, const int32_t *tokens, const float *wte, int T, int C)
{
#pragma omp parallel for schedule(static) if ((size_t)T * C > PAR_MIN)
    for (int t = 0; t < T; t++)
        memcpy(out + (size_t)t * C, wte + (size_t)tokens[t] * C, sizeof(float) * (size_t)C);
}

void al_embedding_backward(float *dwte, const float *dout, const int32_t *tokens, int T, int C)
{
    /* Tokens repeat, so rows are summed in token order on one thread per column block;
     * this keeps the result independent of the thread count. */
#pragma omp parallel for schedule(static) if ((size_t)T * C > PAR_MIN)
    for (int c0 = 0; c0 < C; c0 += 64) {
        int c1 = c0 + 64 < C ? c0 + 64 : C;
        for (int t = 0; t < T; t++) {
            float *d = dwte + (size_t)tokens[t] * C;
            const float *g = dout + (size_t)t * C;
            for (int c = c0; c < c1; c++)
                d[c] += g[c];
        }
    }
}

void al_rmsnorm_forward(float *out, float *rstd, const float *x, const float *w, int N, int C,
                        float eps)
{
#pragma omp parallel for schedule(static) if ((size_t)N * C > PAR_MIN)
    for (int i = 0; i < N; i++) {
        const float *xi = x + (size_t)i * C;
        float *oi = out + (size_t)i * C;
        double ss = 0.0;
        for (int c = 0; c < C; c++)
            ss += (double)xi[c] * xi[c];
        float r = 1.0f / sqrtf((float)(ss / C) + eps);
        rstd[i] = r;
        for (int c = 0; c < C; c++)
            oi[c] = w[c] * (xi[c] * r);
    }
}

void al_rmsnorm_backward(float *dx, float *dw, const float *dout, const float *x, const float *w,
                         const float *rstd, int N, int C)
{
    /* y = w * xhat, xhat = x r, r = (mean(x^2) + eps)^-1/2:
     * dx = r (w dy - xhat mean(w dy xhat)), dw = sum over rows of dy xhat. */
#pragma omp parallel for schedule(static) if ((size_t)N * C > PAR_MIN)
    for (int i = 0; i < N; i++) {
        const float *xi = x + (size_t)i * C, *gi = dout + (size_t)i * C;
        float *dxi = dx + (size_t)i * C;
        float r = rstd[i];
        double dot = 0.0;
        for (int c = 0; c < C; c++)
            dot += (double)w[c] * gi[c] * (xi[c] * r);
        float m = (float)(dot / C);
        for (int c = 0; c < C; c++)
            dxi[c] += r * (w[c] * gi[c] - xi[c] * r * m);
    }
#pragma omp parallel for schedule(static) if ((size_t)N * C > PAR_MIN)
    for (int c0 = 0; c0 < C; c0 += 16) {
        int c1 = c0 + 16 < C ? c0 + 16 : C;
        double acc[16] = {0};
        for (int i = 0; i < N; i++) {
            const float *xi = x + (size_t)i * C, *gi = dout + (size_t)i * C;
            float r = rstd[i];
            for (int c = c0; c < c1; c++)
                acc[c - c0] += (double)gi[c] * (xi[c] * r);
        }
        for (int c = c0; c < c1; c++)
            dw[c] += (float)acc[c - c0];
    }
}

void al_linear_forward(float *out, const float *x, const float *w, const float *b, int T, int IC,
                       int OC)
{
    al_gemm(0, 1, T, OC, IC, 1.0f, x, IC, w, IC, 0.0f, out, OC);
    if (!b) return;
#pragma omp parallel for schedule(static) if ((size_t)T * OC > PAR_MIN)
    for (int t = 0; t < T; t++) {
        float *o = out + (size_t)t * OC;
        for (int j = 0; j < OC; j++)
            o[j] += b[j];
    }
}

void al_linear_backward(float *dx, float *dw, float *db, const float *dout, const float *x,
                        const float *w, int T, int IC, int OC)
{
    if (dx) al_gemm(0, 0, T, IC, OC, 1.0f, dout, OC, w, IC, 1.0f, dx, IC);
    al_gemm(1, 0, OC, IC, T, 1.0f, dout, OC, x, IC, 1.0f, dw, IC);
    if (!db) return;
#pragma omp parallel for schedule(static) if ((size_t)T * OC > PAR_MIN)
    for (int j0 = 0; j0 < OC; j0 += 64) {
        int j1 = j0 + 64 < OC ? j0 + 64 : OC;
        float acc[64] = {0};
        for (int t = 0; t < T; t++) {
            const float *g = dout + (size_t)t * OC;
            for (int j = j0; j < j1; j++)
                acc[j - j0] += g[j];
        }
        for (int j = j0; j < j1; j++)
            db[j] += acc[j - j0];
    }
}

void al_rope_tables(float *cos_t, float *sin_t, const int32_t *positions, int T, int HD,
                    double theta)
{
    int half = HD / 2;
    float inv[half > 0 ? half : 1];
    for (int i = 0; i < half; i++)
        inv[i] = 1.0f / powf((float)theta, (float)(2 * i) / (float)HD);
    for (int t = 0; t < T; t++)
        for (int i = 0; i < half; i++) {
            float f = (float)positions[t] * inv[i];
            cos_t[(size_t)t * half + i] = cosf(f);
            sin_t[(size_t)t * half + i] = sinf(f);
        }
}

static void rope_apply(float *x, const float *cos_t, const float *sin_t, int T, int H, int HD,
                       float sign)
{
    int half = HD / 2;
#pragma omp parallel for schedule(static) if ((size_t)T * H * HD > PAR_MIN)
    for (int t = 0; t < T; t++) {
        const float *c = cos_t + (size_t)t * half, *s = sin_t + (size_t)t * half;
        for (int h = 0; h < H; h++) {
            float *v = x + ((size_t)t * H + h) * HD;
            for (int i = 0; i < half; i++) {
                float a = v[i], b = v[i + half], si = sign * s[i];
                v[i] = a * c[i] - b * si;
                v[i + half] = b * c[i] + a * si;
            }
        }
    }
}

void al_rope_forward(float *x, const float *cos_t, const float *sin_t, int T, int H, int HD)
{
    rope_apply(x, cos_t, sin_t, T, H, HD, 1.0f);
}

void al_rope_backward(float *dx, const float *cos_t, const float *sin_t, int T, int H, int HD)
{
    /* The rotation is orthogonal: its transpose is the rotation by the opposite angle. */
    rope_apply(dx, cos_t, sin_t, T, H, HD, -1.0f);
}

size_t al_attention_scratch_size(const int32_t *cu_seqlens, int nseq, int NH, int HD)
{
    size_t longest = 0;
    for (int s = 0; s < nseq; s++) {
        size_t ts = (size_t)(cu_seqlens[s + 1] - cu_seqlens[s]);
        if (ts > longest) longest = ts;
    }
    return (size_t)NH * (2 * AL_ATTENTION_BLOCK + 2 * (size_t)HD) * longest;
}

/* Probabilities of queries i0..i0+bq-1 of head h against keys 0..kn-1 (kn = i0 + bq) of the
 * sequence starting at t0: p (bq, kn), scaled scores by one GEMM, then a causal softmax of
 * each row (entries right of the diagonal exactly 0). */
static void block_probs(float *p, const float *q, const float *k, int t0, int i0, int bq, int h,
                        int NH, int NKV, int HD)
{
    int rep = NH / NKV, qw = NH * HD, kw = NKV * HD, kn = i0 + bq;
    al_gemm(0, 1, bq, kn, HD, 1.0f / sqrtf((float)HD), q + (size_t)(t0 + i0) * qw + (size_t)h * HD,
            qw, k + (size_t)t0 * kw + (size_t)(h / rep) * HD, kw, 0.0f, p, kn);
    for (int r = 0; r < bq; r++) {
        int last = i0 + r;
        float *row = p + (size_t)r * kn;
        float mx = row[0];
        for (int j = 1; j <= last; j++)
            mx = row[j] > mx ? row[j] : mx;
        float sum = 0.0f;
        for (int j = 0; j <= last; j++) {
            row[j] = expf(row[j] - mx);
            sum += row[j];
        }
        float inv = 1.0f / sum;
        for (int j = 0; j <= last; j++)
            row[j] *= inv;
        for (int j = last + 1; j < kn; j++)
            row[j] = 0.0f;
    }
}

/* Threads split the heads; a head's GEMMs then run on its thread (al_gemm sees it is inside
 * a parallel region), which for the short sequences of RL batches beats splitting each
 * small GEMM. */
void al_attention_forward(float *out, float *scratch, const float *q, const float *k,
                          const float *v, const int32_t *cu_seqlens, int nseq, int NH, int NKV,
                          int HD)
{
    int rep = NH / NKV, qw = NH * HD, kw = NKV * HD;
    for (int s = 0; s < nseq; s++) {
        int t0 = cu_seqlens[s], ts = cu_seqlens[s + 1] - t0;
        if (ts <= 0) continue;
#pragma omp parallel for schedule(static) if ((size_t)NH * ts * ts * HD > PAR_MIN)
        for (int h = 0; h < NH; h++) {
            float *p = scratch + (size_t)h * AL_ATTENTION_BLOCK * ts;
            for (int i0 = 0; i0 < ts; i0 += AL_ATTENTION_BLOCK) {
                int bq = ts - i0 < AL_ATTENTION_BLOCK ? ts - i0 : AL_ATTENTION_BLOCK;
                int kn = i0 + bq;
                block_probs(p, q, k, t0, i0, bq, h, NH, NKV, HD);
                al_gemm(0, 0, bq, HD, kn, 1.0f, p, kn, v + (size_t)t0 * kw + (size_t)(h / rep) * HD,
                        kw, 0.0f, out + (size_t)(t0 + i0) * qw + (size_t)h * HD, qw);
            }
        }
    }
}

void al_attention_backward(float *dq, float *dk, float *dv, float *scratch, const float *dout,
                           const float *q, const float *k, const float *v,
                           const int32_t *cu_seqlens, int nseq, int NH, int NKV, int HD)
{
    int rep = NH / NKV, qw = NH * HD, kw = NKV * HD;
    float scale = 1.0f / sqrtf((float)HD);
    for (int s = 0; s < nseq; s++) {
        int t0 = cu_seqlens[s], ts = cu_seqlens[s + 1] - t0;
        if (ts <= 0) continue;
        size_t per_head = (2 * AL_ATTENTION_BLOCK + 2 * (size_t)HD) * ts;
        /* Each head accumulates its own dK and dV (ts, HD): heads sharing a kv head are
         * summed afterwards, so the threads never write the same memory. */
#pragma omp parallel for schedule(static) if ((size_t)NH * ts * ts * HD > PAR_MIN)
        for (int h = 0; h < NH; h++) {
            float *p = scratch + (size_t)h * per_head, *ds = p + (size_t)AL_ATTENTION_BLOCK * ts;
            float *dkh = ds + (size_t)AL_ATTENTION_BLOCK * ts, *dvh = dkh + (size_t)ts * HD;
            const float *kh = k + (size_t)t0 * kw + (size_t)(h / rep) * HD;
            const float *vh = v + (size_t)t0 * kw + (size_t)(h / rep) * HD;
            memset(dkh, 0, sizeof(float) * 2 * (size_t)ts * HD);
            for (int i0 = 0; i0 < ts; i0 += AL_ATTENTION_BLOCK) {
                int bq = ts - i0 < AL_ATTENTION_BLOCK ? ts - i0 : AL_ATTENTION_BLOCK;
                int kn = i0 + bq;
                const float *dob = dout + (size_t)(t0 + i0) * qw + (size_t)h * HD;
                const float *qb = q + (size_t)(t0 + i0) * qw + (size_t)h * HD;
                block_probs(p, q, k, t0, i0, bq, h, NH, NKV, HD);
                /* dP = dO V^T; dV += P^T dO */
                al_gemm(0, 1, bq, kn, HD, 1.0f, dob, qw, vh, kw, 0.0f, ds, kn);
                al_gemm(1, 0, kn, HD, bq, 1.0f, p, kn, dob, qw, 1.0f, dvh, HD);
                /* dS = P (dP - rowsum(P dP)) scale; masked entries have P = 0 */
                for (int r = 0; r < bq; r++) {
                    const float *pr = p + (size_t)r * kn;
                    float *dr = ds + (size_t)r * kn, dot = 0.0f;
                    int last = i0 + r;
                    for (int j = 0; j <= last; j++)
                        dot += pr[j] * dr[j];
                    for (int j = 0; j <= last; j++)
                        dr[j] = pr[j] * (dr[j] - dot) * scale;
                    for (int j = last + 1; j < kn; j++)
                        dr[j] = 0.0f;
                }
                /* dQ = dS K; dK += dS^T Q */
                al_gemm(0, 0, bq, HD, kn, 1.0f, ds, kn, kh, kw, 0.0f,
                        dq + (size_t)(t0 + i0) * qw + (size_t)h * HD, qw);
                al_gemm(1, 0, kn, HD, bq, 1.0f, ds, kn, qb, qw, 1.0f, dkh, HD);
            }
        }
#pragma omp parallel for schedule(static) if ((size_t)ts * kw > PAR_MIN)
        for (int t = 0; t < ts; t++)
            for (int g = 0; g < NKV; g++) {
                float *dkt = dk + (size_t)(t0 + t) * kw + (size_t)g * HD;
                float *dvt = dv + (size_t)(t0 + t) * kw + (size_t)g * HD;
                for (int d = 0; d < HD; d++)
                    dkt[d] = dvt[d] = 0.0f;
                for (int h = g * rep; h < (g + 1) * rep; h++) {
                    const float *dkh =
                        scratch + (size_t)h * per_head + 2 * (size_t)AL_ATTENTION_BLOCK * ts;
                    const float *dvh = dkh + (size_t)ts * HD;
                    for (int d = 0; d < HD; d++) {
                        dkt[d] += dkh[(size_t)t * HD + d];
                        dvt[d] += dvh[(size_t)t * HD + d];
                    }
                }
            }
    }
}

void al_attention_kv_forward(float *out, const float *q, const float *k_new, const float *v_new,
                             float *const *kc, float *const *vc, const int *past, int nseq,
                             const int *cu_rows, int NH, int NKV, int HD)
{
    int rep = NH / NKV, Q = NH * HD, KV = NKV * HD, T = cu_rows[nseq];
    float scale = 1.0f / sqrtf((float)HD);
    for (int i = 0; i < nseq; i++)
        for (int r = cu_rows[i]; r < cu_rows[i + 1]; r++) {
            size_t off = (size_t)(past[i] + r - cu_rows[i]) * (size_t)KV;
            memcpy(kc[i] + off, k_new + (size_t)r * KV, sizeof(float) * KV);
            memcpy(vc[i] + off, v_new + (size_t)r * KV, sizeof(float) * KV);
        }
    size_t work = 0;
    for (int i = 0; i < nseq; i++)
        work += (size_t)(cu_rows[i + 1] - cu_rows[i]) * NH * (size_t)(past[i] + 1);
#pragma omp parallel for schedule(dynamic, 4) if (work > 8192)
    for (int rh = 0; rh < T * NH; rh++) {
        int r = rh / NH, h = rh % NH, i = 0;
        while (r >= cu_rows[i + 1])
            i++;
        int pos = past[i] + r - cu_rows[i];
        const float *qr = q + (size_t)r * Q + (size_t)h * HD;
        const float *kh = kc[i] + (size_t)(h / rep) * HD, *vh = vc[i] + (size_t)(h / rep) * HD;
        float *o = out + (size_t)r * Q + (size_t)h * HD;
        float mx = -INFINITY, sum = 0.0f;
        for (int d = 0; d < HD; d++)
            o[d] = 0.0f;
        for (int j = 0; j <= pos; j++) {
            const float *kj = kh + (size_t)j * KV, *vj = vh + (size_t)j * KV;
            float dot = 0.0f;
            for (int d = 0; d < HD; d++)
                dot += qr[d] * kj[d];
            dot *= scale;
            if (dot > mx) {
                float f = expf(mx - dot);
                sum *= f;
                for (int d = 0; d < HD; d++)
                    o[d] *= f;
                mx = dot;
            }
            float w = expf(dot - mx);
            sum += w;
            for (int d = 0; d < HD; d++)
                o[d] += w * vj[d];
        }
        float inv = 1.0f / sum;
        for (int d = 0; d < HD; d++)
            o[d] *= inv;
    }
}

void al_swiglu_forward(float *h, const float *gate, const float *up, size_t N)
{
#pragma omp parallel for schedule(static) if (N > PAR_MIN)
    for (size_t i = 0; i < N; i++) {
        float g = gate[i];
        h[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

void al_swiglu_backward(float *dgate, float *dup, const float *dh, const float *gate,
                        const float *up, size_t N)
{
#pragma omp parallel for schedule(static) if (N > PAR_MIN)
    for (size_t i = 0; i < N; i++) {
        float g = gate[i], sg = 1.0f / (1.0f + expf(-g));
        float silu = g * sg;
        dup[i] = dh[i] * silu;
        dgate[i] = dh[i] * up[i] * sg * (1.0f + g * (1.0f - sg));
    }
}

void al_residual_forward(float *out, const float *a, const float *b, size_t N)
{
#pragma omp parallel for schedule(static) if (N > PAR_MIN)
    for (size_t i = 0; i < N; i++)
        out[i] = a[i] + b[i];
}

void al_residual_backward(float *da, float *db, const float *dout, size_t N)
{
#pragma omp parallel for schedule(static) if (N > PAR_MIN)
    for (size_t i = 0; i < N; i++) {
        if (da) da[i] += dout[i];
        if (db) db[i] += dout[i];
    }
}

void al_lm_head_forward(float *logits, const float *x, const float *w, int T, int C, int V)
{
    al_linear_forward(logits, x, w, NULL, T, C, V);
}

void al_lm_head_backward(float *dx, float *dw, const float *dlogits, const float *x, const float *w,
                         int T, int C, int V)
{
    al_linear_backward(dx, dw, NULL, dlogits, x, w, T, C, V);
}
