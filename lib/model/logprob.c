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

/* Row statistics in double: the maximum of z, lse, and sum p z (for the entropy). */
typedef struct row_stats {
    double max, lse, pz;
} row_stats;

static row_stats row_stats_compute(const float *row, int V, double inv_tau)
{
    row_stats s;
    double mx = -INFINITY;
    for (int j = 0; j < V; j++) {
        double z = row[j] * inv_tau;
        if (z > mx) mx = z;
    }
    /* A row of -inf logits (or all NaN) has no distribution; let NaN show it. */
    double sum = 0.0, sum_ez = 0.0;
    for (int j = 0; j < V; j++) {
        double z = row[j] * inv_tau;
        double e = exp(z - mx);
        sum += e;
        /* 0 * -inf would be NaN for masked-out logits: they contribute nothing. */
        if (e > 0.0) sum_ez += e * (z - mx);
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
    double inv_tau = 1.0 / (double)temperature;
#pragma omp parallel for schedule(static) if (T > 1 && (long)T * V > 65536)
    for (int t = 0; t < T; t++) {
        const float *row = logits + (size_t)t * V;
        row_stats s = row_stats_compute(row, V, inv_tau);
        int32_t y = targets[t];
        logp[t] = y >= 0 ? (float)(row[y] * inv_tau - s.lse) : 0.0f;
        if (entropy) entropy[t] = (float)(s.lse - s.pz);
    }
    return 0;
}

void al_logprob_backward(const float *logits, const int32_t *targets, int T, int V,
                         float temperature, const float *dlogp, const float *dentropy,
                         float *dlogits)
{
    double inv_tau = 1.0 / (double)temperature;
#pragma omp parallel for schedule(static) if (T > 1 && (long)T * V > 65536)
    for (int t = 0; t < T; t++) {
        const float *row = logits + (size_t)t * V;
        float *drow = dlogits + (size_t)t * V;
        int32_t y = targets[t];
        double gl = (dlogp && y >= 0) ? dlogp[t] : 0.0;
        double gh = dentropy ? dentropy[t] : 0.0;
        if (gl == 0.0 && gh == 0.0) {
            for (int j = 0; j < V; j++) drow[j] = 0.0f;
            continue;
        }
        row_stats s = row_stats_compute(row, V, inv_tau);
        double H = s.lse - s.pz;
        /* Written element by element from row[j] and the row's statistics, so that
         * dlogits == logits works: row[j] is read before drow[j] is written. */
        for (int j = 0; j < V; j++) {
            double logpj = row[j] * inv_tau - s.lse;
            double pj = exp(logpj);
            double dz = j == y ? gl * (1.0 - pj) : -gl * pj;
            if (gh != 0.0 && pj > 0.0) dz -= gh * pj * (logpj + H);
            drow[j] = (float)(dz * inv_tau);
        }
    }
}
