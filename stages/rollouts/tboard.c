/*
 * tboard.c: the controller's TensorBoard scalars (--tensorboard DIR; lib/core/tbevent.h),
 * one event per policy version, step = the version, wall time = when the controller saw it
 * published (its start for versions before it), the same numbers as that version's row of
 * metrics.csv:
 *   reward/train, reward/train_std, rollouts/train   training rollouts sampled with it
 *   reward/val, rollouts/val                         its held-out evaluation (when run)
 *   train/loss, train/kl, train/entropy, train/clip_frac, train/tokens_per_s
 *                                                    the trainer's numbers (PolicyVersion)
 * An event file is append-only and TensorBoard takes the first value of a step, so a version
 * is written once, when no more rollouts can count for it: when it is older than every
 * running or unreported rollout's version and than the current one (what a rollout that
 * starts later is sampled with), or at the end of the run. A row still filling is left for
 * later; metrics.csv, rewritten whole, shows it at once.
 */
#include "rollouts/rollouts.h"

#include "core/log.h"

#include <time.h>

/* Opens the writer at the first call when --tensorboard was given; 0, or -1 (logged once,
 * the run goes on without it). */
static int tb_ready(rl_ctl *c)
{
    if (!c->o.tensorboard || c->tb_failed) return -1;
    if (c->tb.f) return 0;
    char err[512];
    if (al_tb_open(&c->tb, c->o.tensorboard, "rollouts", err, sizeof err)) {
        al_log_warn(COMP, "no TensorBoard events: %s", err);
        c->tb_failed = 1;
        return -1;
    }
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    c->tb_t0 = (double)ts.tv_sec + ts.tv_nsec / 1e9 - rl_now_s(c);
    al_log_info(COMP, "TensorBoard events in %s", c->tb.path);
    return 0;
}

/* One row's event; 0 or -1 (logged). */
static int tb_row(rl_ctl *c, const rl_version_row *w)
{
    al_tb_scalar s[10];
    size_t n = 0;
    if (w->n_train) {
        s[n++] = (al_tb_scalar){"reward/train", rl_row_train_mean(w)};
        s[n++] = (al_tb_scalar){"reward/train_std", rl_row_train_std(w)};
        s[n++] = (al_tb_scalar){"rollouts/train", (double)w->n_train};
    }
    if (w->n_val) {
        s[n++] = (al_tb_scalar){"reward/val", rl_row_val_mean(w)};
        s[n++] = (al_tb_scalar){"rollouts/val", (double)w->n_val};
    }
    if (w->have_train_metrics) {
        s[n++] = (al_tb_scalar){"train/loss", w->loss};
        s[n++] = (al_tb_scalar){"train/kl", w->kl};
        s[n++] = (al_tb_scalar){"train/entropy", w->entropy};
        s[n++] = (al_tb_scalar){"train/clip_frac", w->clip_frac};
        s[n++] = (al_tb_scalar){"train/tokens_per_s", w->tokens_per_s};
    }
    if (!n) return 0;
    char err[512];
    if (al_tb_scalars(&c->tb, w->version, c->tb_t0 + (w->time_s > 0 ? w->time_s : 0), s, n, err,
                      sizeof err)) {
        al_log_warn(COMP, "TensorBoard events: %s", err);
        return -1;
    }
    return 0;
}

void rl_tb_write(rl_ctl *c, int final)
{
    if (tb_ready(c)) return;
    int64_t below = c->v; /* versions below this one are complete */
    for (size_t i = 0; !final && i < c->live.n; i++) {
        const rl_rollout *r = c->live.v[i];
        int64_t v = r->min_version >= 0 && r->min_version < r->launch_version ? r->min_version
                                                                               : r->launch_version;
        if (v < below) below = v;
    }
    for (size_t i = 0; i < c->rep.n; i++) {
        const rl_version_row *w = &c->rep.rows[i];
        if (w->version < c->tb_next) continue;
        if (!final && w->version >= below) break;
        if (tb_row(c, w)) return;
        c->tb_next = w->version + 1;
    }
}

void rl_tb_close(rl_ctl *c)
{
    al_tb_close(&c->tb);
}
