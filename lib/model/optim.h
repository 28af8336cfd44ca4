/*
 * optim.h: AdamW with decoupled weight decay and bias correction, the learning-rate
 * schedule (linear warmup, then cosine or constant), and gradient clipping by global norm.
 *
 * The optimizer state (first and second moments) is one allocation of 2 n floats: m is its
 * first half, v its second, in the same order as the parameter vector it updates, so that a
 * checkpoint saves it as two flat tensors. The update matches torch.optim.AdamW (one
 * parameter group, amsgrad off):
 *   p -= lr wd p;  m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;
 *   p -= (lr / (1 - b1^t)) m / (sqrt(v) / sqrt(1 - b2^t) + eps)
 */
#ifndef ARCLIGHT_MODEL_OPTIM_H
#define ARCLIGHT_MODEL_OPTIM_H

#include "model/ops.h"

#include <stddef.h>
#include <stdint.h>

typedef enum al_lr_schedule {
    AL_LR_CONSTANT, /* warmup, then lr */
    AL_LR_COSINE,   /* warmup, then cosine from lr down to lr * min_lr_ratio at total_steps */
} al_lr_schedule;

typedef struct al_optim_config {
    float lr;           /* peak learning rate */
    float beta1, beta2; /* moment decay rates */
    float eps;          /* added to sqrt(v hat) */
    float weight_decay; /* decoupled (AdamW), multiplied by lr */
    float grad_clip;    /* max global gradient norm; 0 = no clipping */
    al_lr_schedule schedule;
    int64_t warmup_steps; /* updates 0..warmup-1 use lr * (s+1) / warmup */
    int64_t total_steps;  /* end of the cosine; later updates stay at the floor */
    float min_lr_ratio;   /* cosine floor as a fraction of lr */
} al_optim_config;

/* lr 1e-6, betas (0.9, 0.999), eps 1e-8, weight decay 0.01, clip 1.0, constant, no warmup,
 * total 0, floor 0. */
void al_optim_config_default(al_optim_config *cfg);

/* "constant" or "cosine"; 0, or -1 with the valid names in errstr. */
int al_lr_schedule_parse(const char *s, al_lr_schedule *out, char *errstr, size_t errlen);
const char *al_lr_schedule_name(al_lr_schedule s);

/* Checks ranges (lr >= 0, betas in [0,1), eps > 0, ...). 0, or -1 naming the field. */
int al_optim_config_check(const al_optim_config *cfg, char *errstr, size_t errlen);

/* Learning rate of update number `step` (0-based): warmup (s+1)/warmup * lr, then constant,
 * or lr * (r + (1-r) (1 + cos(pi p)) / 2) with p = (s - warmup) / (total - warmup) clamped
 * to [0, 1] and r = min_lr_ratio. */
double al_lr_at(const al_optim_config *cfg, int64_t step);

/* Global L2 norm of g (n floats), accumulated in double. */
double al_grad_norm(const float *g, size_t n);

/* Scales g in place so that its global norm is at most max_norm, as
 * torch.nn.utils.clip_grad_norm_ does (coefficient max_norm / (norm + 1e-6), applied only
 * when below 1). max_norm <= 0 leaves g alone. Returns the norm before clipping (non-finite
 * when g holds NaN/Inf; g is then left alone). */
double al_grad_clip(float *g, size_t n, float max_norm);

typedef struct al_adamw {
    al_optim_config cfg;
    size_t n;     /* parameters */
    float *state; /* (2, n): one allocation, owned */
    float *m;     /* (n) = state */
    float *v;     /* (n) = state + n */
    int64_t step; /* updates done so far (t - 1 of the next update) */
} al_adamw;

/* Allocates zeroed moments for n parameters and copies cfg. 0, or -1 with errstr (bad config,
 * out of memory). Free with al_adamw_free. */
int al_adamw_init(al_adamw *opt, const al_optim_config *cfg, size_t n, char *errstr,
                  size_t errlen);
void al_adamw_free(al_adamw *opt);

/* One AdamW update of params (n) with grads (n) at learning rate lr (usually
 * al_lr_at(&opt->cfg, opt->step)); increments opt->step. OpenMP-parallel over elements.
 * Weight decay applies to every element; use al_adamw_update_range for per-tensor decay. */
void al_adamw_update(al_adamw *opt, float *params, const float *grads, double lr);

/* The same update restricted to elements [off, off+count) with its own weight decay; the
 * caller increments opt->step itself once all ranges of the step are done
 * (al_adamw_step_done). params and grads point at the whole vectors. */
void al_adamw_update_range(al_adamw *opt, float *params, const float *grads, double lr,
                           size_t off, size_t count, float weight_decay);
void al_adamw_step_done(al_adamw *opt);

/* The arguments of update number opt->step + 1 at learning rate lr with weight decay wd. */
al_adamw_args al_adamw_args_at(const al_adamw *opt, double lr, float weight_decay);

/* The update itself on raw arrays, elements [off, off+count): the CPU backend's op. */
void al_adamw_range(float *params, const float *grads, float *m, float *v, size_t off,
                    size_t count, const al_adamw_args *a);

#endif
