/*
 * optim.c: AdamW, learning-rate schedule, gradient clipping (see optim.h).
 */
#include "model/optim.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int optim_err(char *errstr, size_t errlen, const char *msg, double v)
{
    if (errstr && errlen) snprintf(errstr, errlen, "optimizer: %s (got %g)", msg, v);
    return -1;
}

void al_optim_config_default(al_optim_config *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->lr = 1e-6f;
    cfg->beta1 = 0.9f;
    cfg->beta2 = 0.999f;
    cfg->eps = 1e-8f;
    cfg->weight_decay = 0.01f;
    cfg->grad_clip = 1.0f;
    cfg->schedule = AL_LR_CONSTANT;
    cfg->warmup_steps = 0;
    cfg->total_steps = 0;
    cfg->min_lr_ratio = 0.0f;
}

int al_lr_schedule_parse(const char *s, al_lr_schedule *out, char *errstr, size_t errlen)
{
    if (s && strcmp(s, "constant") == 0) {
        *out = AL_LR_CONSTANT;
        return 0;
    }
    if (s && strcmp(s, "cosine") == 0) {
        *out = AL_LR_COSINE;
        return 0;
    }
    if (errstr && errlen)
        snprintf(errstr, errlen, "unknown learning-rate schedule '%s' (expected constant or cosine)",
                 s ? s : "(null)");
    return -1;
}

const char *al_lr_schedule_name(al_lr_schedule s)
{
    switch (s) {
    case AL_LR_CONSTANT: return "constant";
    case AL_LR_COSINE: return "cosine";
    }
    return "?";
}

int al_optim_config_check(const al_optim_config *c, char *errstr, size_t errlen)
{
    if (!(c->lr >= 0.0f) || !isfinite(c->lr)) return optim_err(errstr, errlen, "lr must be >= 0", c->lr);
    if (!(c->beta1 >= 0.0f && c->beta1 < 1.0f))
        return optim_err(errstr, errlen, "beta1 must be in [0, 1)", c->beta1);
    if (!(c->beta2 >= 0.0f && c->beta2 < 1.0f))
        return optim_err(errstr, errlen, "beta2 must be in [0, 1)", c->beta2);
    if (!(c->eps > 0.0f) || !isfinite(c->eps)) return optim_err(errstr, errlen, "eps must be > 0", c->eps);
    if (!(c->weight_decay >= 0.0f) || !isfinite(c->weight_decay))
        return optim_err(errstr, errlen, "weight_decay must be >= 0", c->weight_decay);
    if (!(c->grad_clip >= 0.0f) || !isfinite(c->grad_clip))
        return optim_err(errstr, errlen, "grad_clip must be >= 0 (0 = off)", c->grad_clip);
    if (c->schedule != AL_LR_CONSTANT && c->schedule != AL_LR_COSINE)
        return optim_err(errstr, errlen, "unknown schedule", (double)c->schedule);
    if (c->warmup_steps < 0)
        return optim_err(errstr, errlen, "warmup_steps must be >= 0", (double)c->warmup_steps);
    if (c->schedule == AL_LR_COSINE && c->total_steps <= 0)
        return optim_err(errstr, errlen, "the cosine schedule needs total_steps > 0",
                         (double)c->total_steps);
    if (!(c->min_lr_ratio >= 0.0f && c->min_lr_ratio <= 1.0f))
        return optim_err(errstr, errlen, "min_lr_ratio must be in [0, 1]", c->min_lr_ratio);
    return 0;
}

double al_lr_at(const al_optim_config *c, int64_t step)
{
    if (step < 0) step = 0;
    if (step < c->warmup_steps) return (double)c->lr * (double)(step + 1) / (double)c->warmup_steps;
    if (c->schedule == AL_LR_CONSTANT) return c->lr;
    int64_t span = c->total_steps - c->warmup_steps;
    double p = span > 0 ? (double)(step - c->warmup_steps) / (double)span : 1.0;
    if (p > 1.0) p = 1.0;
    double r = c->min_lr_ratio;
    return (double)c->lr * (r + (1.0 - r) * 0.5 * (1.0 + cos(M_PI * p)));
}

double al_grad_norm(const float *g, size_t n)
{
    double ss = 0.0;
#pragma omp parallel for reduction(+ : ss) schedule(static) if (n > 65536)
    for (size_t i = 0; i < n; i++) ss += (double)g[i] * g[i];
    return sqrt(ss);
}

double al_grad_clip(float *g, size_t n, float max_norm)
{
    double norm = al_grad_norm(g, n);
    if (!(max_norm > 0.0f) || !isfinite(norm)) return norm;
    /* torch computes the coefficient in float32 and multiplies the gradients by it. */
    float coef = (float)max_norm / ((float)norm + 1e-6f);
    if (coef < 1.0f) {
#pragma omp parallel for schedule(static) if (n > 65536)
        for (size_t i = 0; i < n; i++) g[i] *= coef;
    }
    return norm;
}

int al_adamw_init(al_adamw *opt, const al_optim_config *cfg, size_t n, char *errstr,
                  size_t errlen)
{
    memset(opt, 0, sizeof *opt);
    if (al_optim_config_check(cfg, errstr, errlen) != 0) return -1;
    opt->cfg = *cfg;
    opt->n = n;
    opt->state = calloc(n ? 2 * n : 1, sizeof(float));
    if (!opt->state) {
        if (errstr && errlen)
            snprintf(errstr, errlen, "optimizer: out of memory for %zu parameters' state", n);
        return -1;
    }
    opt->m = opt->state;
    opt->v = opt->state + n;
    return 0;
}

void al_adamw_free(al_adamw *opt)
{
    if (!opt) return;
    free(opt->state);
    memset(opt, 0, sizeof *opt);
}

al_adamw_args al_adamw_args_at(const al_adamw *opt, double lr, float weight_decay)
{
    al_adamw_args a = {.lr = lr,
                       .beta1 = opt->cfg.beta1,
                       .beta2 = opt->cfg.beta2,
                       .eps = opt->cfg.eps,
                       .weight_decay = weight_decay,
                       .t = opt->step + 1};
    return a;
}

void al_adamw_range(float *params, const float *grads, float *m, float *v, size_t off,
                    size_t count, const al_adamw_args *a)
{
    /* Same float32 arithmetic order as torch.optim.AdamW's single-tensor path. */
    float b1 = a->beta1, b2 = a->beta2;
    double bc1 = 1.0 - pow((double)b1, (double)a->t);
    double bc2 = 1.0 - pow((double)b2, (double)a->t);
    float step_size = (float)(a->lr / bc1);
    float bc2_sqrt = (float)sqrt(bc2);
    float decay = (float)(1.0 - a->lr * (double)a->weight_decay);
    float eps = a->eps;
    size_t end = off + count;
#pragma omp parallel for schedule(static) if (count > 65536)
    for (size_t i = off; i < end; i++) {
        float g = grads[i];
        float p = params[i] * decay;
        float mi = m[i] * b1 + (1.0f - b1) * g;
        float vi = v[i] * b2 + (1.0f - b2) * g * g;
        m[i] = mi;
        v[i] = vi;
        float denom = sqrtf(vi) / bc2_sqrt + eps;
        params[i] = p - step_size * (mi / denom);
    }
}

void al_adamw_update_range(al_adamw *opt, float *params, const float *grads, double lr,
                           size_t off, size_t count, float weight_decay)
{
    al_adamw_args a = al_adamw_args_at(opt, lr, weight_decay);
    al_adamw_range(params, grads, opt->m, opt->v, off, count, &a);
}

void al_adamw_step_done(al_adamw *opt)
{
    opt->step++;
}

void al_adamw_update(al_adamw *opt, float *params, const float *grads, double lr)
{
    al_adamw_update_range(opt, params, grads, lr, 0, opt->n, opt->cfg.weight_decay);
    al_adamw_step_done(opt);
}
