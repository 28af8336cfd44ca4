/*
 * logprob.c: per-token target logprob and entropy from logits, forward and backward.
 *
 * With z = logits / tau, p = softmax(z), lse = log sum exp z:
 *   logp = z[y] - lse,  H = lse - sum_j p_j z_j
 *   d logp / d z_j = [j = y] - p_j,  d H / d z_j = -p_j (log p_j + H)
 * and d / d logits = (d / d z) / tau.
 */
#include "model/logprob.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* Row statistics in double: the maximum of z, lse, and sum p z (for the entropy). */
typedef struct row_stats {
    double max, lse, pz;
} row_stats;

static row_stats row_stats_compute(const float *row, int V, float inv_tau)
{
    row_stats s;
    float mx = -INFINITY;
    for (int j = 0; j < V; j++) {
        float z = row[j] * inv_tau;
        if (z > mx) mx = z;
    }
    /* Each term in float (expf is several times cheaper than exp, and the terms are only
     * needed to float precision), the sums in double. A row of -inf logits (or all NaN) has
     * no distribution; let NaN show it. */
    double sum = 0.0, sum_ez = 0.0;
#pragma omp simd reduction(+ : sum, sum_ez)
    for (int j = 0; j < V; j++) {
        float zm = row[j] * inv_tau - mx;
        float e = expf(zm);
        sum += e;
        /* 0 * -inf would be NaN for masked-out logits: they contribute nothing. */
        sum_ez += e > 0.0f ? (double)(e * zm) : 0.0;
    }
    s.max = mx;
    s.lse = mx + log(sum);
    s.pz = mx + sum_ez / sum; /* sum p z = max + sum p (z - max) */
    return s;
}

int al_logprob_forward(const float *logits, const int32_t *targets, int T, int V,
                       float temperature, float *logp, float *entropy, char *errstr,
                       size_t errlen)
{
    if (T < 0 || V <= 0) {
        if (errstr && errlen) snprintf(errstr, errlen, "logprob: bad shape T=%d V=%d", T, V);
        return -1;
    }
    if (!(temperature > 0.0f) || !isfinite(temperature)) {
        if (errstr && errlen)
            snprintf(errstr, errlen, "logprob: temperature must be > 0 (got %g)",
                     (double)temperature);
        return -1;
    }
    for (int t = 0; t < T; t++) {
        if (targets[t] >= V) {
            if (errstr && errlen)
                snprintf(errstr, errlen,
                         "logprob: target token %d at position %d is outside the vocabulary "
                         "(size %d)",
                         (int)targets[t], t, V);
            return -1;
        }
    }
    float inv_tau = 1.0f / temperature;
#pragma omp parallel for schedule(static) if (T > 1 && (long)T * V > 65536)
    for (int t = 0; t < T; t++) {
        const float *row = logits + (size_t)t * V;
        row_stats s = row_stats_compute(row, V, inv_tau);
        int32_t y = targets[t];
        logp[t] = y >= 0 ? (float)((double)(row[y] * inv_tau) - s.lse) : 0.0f;
        if (entropy) entropy[t] = (float)(s.lse - s.pz);
    }
    return 0;
}

void al_logprob_backward(const float *logits, const int32_t *targets, int T, int V,
                         float temperature, const float *dlogp, const float *dentropy,
                         float *dlogits)
{
    float inv_tau = 1.0f / temperature;
#pragma omp parallel for schedule(static) if (T > 1 && (long)T * V > 65536)
    for (int t = 0; t < T; t++) {
        const float *row = logits + (size_t)t * V;
        float *drow = dlogits + (size_t)t * V;
        int32_t y = targets[t];
        float gl = (dlogp && y >= 0) ? dlogp[t] : 0.0f;
        float gh = dentropy ? dentropy[t] : 0.0f;
        if (gl == 0.0f && gh == 0.0f) {
            memset(drow, 0, sizeof(float) * (size_t)V);
            continue;
        }
        row_stats s = row_stats_compute(row, V, inv_tau);
        float mx = (float)s.max;
        float log_sum = (float)(s.lse - s.max);
        float H = (float)(s.lse - s.pz);
        /* Written element by element from row[j] and the row's statistics, so that
         * dlogits == logits works: row[j] is read before drow[j] is written. */
#pragma omp simd
        for (int j = 0; j < V; j++) {
            float logpj = (row[j] * inv_tau - mx) - log_sum;
            float pj = expf(logpj);
            float dz = j == y ? gl * (1.0f - pj) : -gl * pj;
            if (pj > 0.0f) dz -= gh * pj * (logpj + H);
            drow[j] = dz * inv_tau;
        }
    }
}
