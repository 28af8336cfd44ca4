/*
 * tboard.c: the trainer's TensorBoard scalars (--tensorboard DIR; lib/core/tbevent.h), one
 * event per update, step = the policy version it made, wall time = when it was published:
 *   train/loss, train/pg_loss, train/kl, train/entropy, train/clip_frac, train/grad_norm,
 *   train/lr, train/tokens_per_s      the update (the numbers of its log line and its
 *                                     PolicyVersion)
 *   train/batch_reward                the batch's mean reward (when the batch carried it)
 *   train/lag                         versions between the batch's sampling policy and the
 *                                     one this update started from (0: on-policy)
 * Rank 0 writes; a follower rank does not. A failure to open or write is logged once and
 * the trainer goes on without events.
 */
#include "train.h"

#include "core/log.h"

#include <math.h>
#include <time.h>

void train_tb_write(train_worker *w, const al_train_stats *st, double reward_mean,
                    int64_t batch_policy)
{
    if (!w->o->tensorboard || w->tb_failed || w->follower) return;
    char err[512];
    if (!w->tb.f) {
        if (al_tb_open(&w->tb, w->o->tensorboard, "train", err, sizeof err)) {
            al_log_warn(COMP, "no TensorBoard events: %s", err);
            w->tb_failed = 1;
            return;
        }
        al_log_info(COMP, "TensorBoard events in %s", w->tb.path);
    }
    al_tb_scalar s[11];
    size_t n = 0;
    s[n++] = (al_tb_scalar){"train/loss", st->loss};
    s[n++] = (al_tb_scalar){"train/pg_loss", st->pg_loss};
    s[n++] = (al_tb_scalar){"train/kl", st->kl};
    s[n++] = (al_tb_scalar){"train/entropy", st->entropy};
    s[n++] = (al_tb_scalar){"train/clip_frac", st->clip_frac};
    s[n++] = (al_tb_scalar){"train/grad_norm", st->grad_norm};
    s[n++] = (al_tb_scalar){"train/lr", st->lr};
    s[n++] = (al_tb_scalar){"train/tokens_per_s", st->tokens_per_s};
    if (isfinite(reward_mean)) s[n++] = (al_tb_scalar){"train/batch_reward", reward_mean};
    if (batch_policy >= 0)
        s[n++] = (al_tb_scalar){"train/lag", (double)(w->version - 1 - batch_policy)};
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    if (al_tb_scalars(&w->tb, w->version, (double)ts.tv_sec + ts.tv_nsec / 1e9, s, n, err,
                      sizeof err)) {
        al_log_warn(COMP, "TensorBoard events: %s", err);
        w->tb_failed = 1;
    }
}
