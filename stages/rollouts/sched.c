/*
 * sched.c: what the rollout controller starts, and when: a due evaluation of the val split
 * first, else training groups (one task, --group-size rollouts) in the epoch's shuffled
 * order as pacing on the trainer allows (rl_pace_may_start), their rollouts' children
 * within --concurrency.
 */
#include "rollouts/rollouts.h"

#include "rollouts/controller.h"

#include "core/log.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

/* A new rollout of group g (NULL: out of memory), listed in the rtab. */
static rl_rollout *rollout_new(rl_ctl *c, rl_group *g, size_t task, int eval)
{
    rl_rollout *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    r->g = g;
    r->task = task;
    r->eval = eval;
    r->fd_out = r->fd_err = -1;
    r->min_version = -1;
    r->launch_version = c->v;
    snprintf(r->id, sizeof r->id, "%s-%" PRId64, c->run, c->next_rollout++);
    if (rl_rtab_insert(c, r)) {
        free(r);
        return NULL;
    }
    return r;
}

/* A new group of n rollouts of task, listed as unfinished. NULL when out of memory. */
static rl_group *group_new(rl_ctl *c, size_t task, int n, int eval)
{
    rl_group *g = calloc(1, sizeof *g);
    if (!g || !(g->r = calloc((size_t)n, sizeof *g->r))) {
        free(g);
        return NULL;
    }
    g->task = task;
    g->eval = eval;
    g->n = n;
    g->serial = c->group_serial++;
    for (int i = 0; i < n; i++)
        if (!(g->r[i] = rollout_new(c, g, task, eval))) {
            for (int k = 0; k < i; k++) {
                rl_rtab_remove(c, g->r[k]);
                free(g->r[k]);
            }
            free(g->r);
            free(g);
            return NULL;
        }
    if (al_vec_push(&c->groups, g)) return NULL; /* leaked on out of memory only */
    return g;
}

/* The next training task of the epoch order that has no group in flight; SIZE_MAX when
 * every remaining one is busy or the epochs are over. Moves to the next epoch at the end. */
static size_t next_train_task(rl_ctl *c)
{
    if (!c->n_train) return SIZE_MAX;
    for (int pass = 0; pass < 2; pass++) {
        for (size_t i = c->order_pos; i < c->n_train; i++) {
            size_t t = c->train_idx[c->order[i]];
            if (c->busy[t]) continue;
            /* take it: swap it to the front of what is left */
            size_t tmp = c->order[i];
            c->order[i] = c->order[c->order_pos];
            c->order[c->order_pos] = tmp;
            c->order_pos++;
            return t;
        }
        if (c->order_pos < c->n_train) return SIZE_MAX; /* the rest are busy */
        if (c->o.epochs && c->epoch + 1 >= c->o.epochs) return SIZE_MAX;
        c->epoch++;
        c->order_pos = 0;
        rl_shuffle(c->order, c->n_train, (uint64_t)c->o.seed, (uint64_t)c->epoch);
        al_log_info(COMP, "epoch %" PRId64 " over the %zu training tasks", c->epoch, c->n_train);
    }
    return SIZE_MAX;
}

/* Rollouts of unfinished groups not yet started. */
static int running_pending(const rl_ctl *c)
{
    int n = 0;
    for (size_t i = 0; i < c->groups.n; i++)
        for (int k = 0; k < c->groups.v[i]->n; k++) {
            const rl_rollout *r = c->groups.v[i]->r[k];
            if (!r->pid && !r->done && !r->start_us) n++;
        }
    return n;
}

/* Starts the not-yet-started rollouts of unfinished groups, eval groups first, within the
 * concurrency limit. */
static void start_pending(rl_ctl *c)
{
    for (int pass = 0; pass < 2; pass++)
        for (size_t i = 0; i < c->groups.n && c->running < c->o.concurrency; i++) {
            rl_group *g = c->groups.v[i];
            if (g->eval != (pass == 0)) continue;
            for (int k = 0; k < g->n && c->running < c->o.concurrency; k++) {
                rl_rollout *r = g->r[k];
                if (r->pid || r->done || r->start_us) continue;
                if (rl_child_start(c, r) != 0) {
                    r->start_us = al_mono_us(); /* counts as started and failed at once */
                    r->status = AL_ROLLOUT_STATUS_FAILED;
                    snprintf(r->err_tail, sizeof r->err_tail, "the controller could not start it");
                    r->done = 1;
                }
            }
        }
}

/* Starts an evaluation of the val split at the current version. */
static void eval_start(rl_ctl *c)
{
    size_t n = c->n_val;
    if (c->o.eval_tasks > 0 && (size_t)c->o.eval_tasks < n) n = (size_t)c->o.eval_tasks;
    c->eval_version = c->v;
    c->eval_running = 0;
    for (size_t i = 0; i < n; i++) {
        rl_group *g = group_new(c, c->val_idx[i], 1, 1);
        if (!g) {
            al_log_error(COMP, "out of memory starting an evaluation");
            break;
        }
        c->eval_running++;
    }
    c->evals_done++;
    al_log_info(COMP, "evaluating %zu val tasks at policy version %" PRId64, n, c->v);
}

/* What to start now: a due evaluation, else training groups as pacing allows. */
void rl_schedule(rl_ctl *c)
{
    if (!c->have_v) return;
    int stopping = rl_stop_signal != 0;
    if (stopping) return;
    /* an evaluation due at this version: once the current one is over */
    if (c->n_val && !c->eval_running && c->eval_pending) {
        c->eval_pending = 0;
        eval_start(c);
    }
    if (!c->eval_running && !c->training_done) {
        for (;;) {
            if (c->o.steps > 0 &&
                c->started_groups - c->lost_groups >= (c->o.steps - c->v0) * c->o.step_groups)
                break; /* enough for the last step */
            if (!rl_pace_may_start(c->v, c->v0, c->o.max_staleness, c->o.step_groups,
                                   c->started_groups, c->lost_groups))
                break;
            if (running_pending(c) >= c->o.concurrency) break;
            size_t t = next_train_task(c);
            if (t == SIZE_MAX) {
                if (c->o.epochs && c->epoch + 1 >= c->o.epochs && c->order_pos >= c->n_train) {
                    c->training_done = 1;
                    al_log_info(COMP, "the %" PRId64 " epochs are started: no more training groups",
                                c->o.epochs);
                }
                break;
            }
            rl_group *g = group_new(c, t, (int)c->o.group_size, 0);
            if (!g) {
                al_log_error(COMP, "out of memory starting a group");
                break;
            }
            c->busy[t] = 1;
            c->started_groups++;
        }
    }
    start_pending(c);
}

/* A trainer that does not move while nothing runs (--pace-timeout): pacing lets one more
 * group start, counted as lost, and says so aloud. */
void rl_sched_pace_timeout(rl_ctl *c)
{
    if (!c->training_done && !c->running && !c->eval_running &&
        al_mono_us() - c->v_seen_us > (int64_t)(c->o.pace_timeout_s * 1e6) &&
        !rl_pace_may_start(c->v, c->v0, c->o.max_staleness, c->o.step_groups, c->started_groups,
                           c->lost_groups)) {
        al_log_warn(COMP,
                    "policy v%" PRId64 " has not moved for %g s with nothing running: "
                    "starting one more group (does batch's --step-groups match %" PRId64 "?)",
                    c->v, c->o.pace_timeout_s, c->o.step_groups);
        c->lost_groups++;
        c->v_seen_us = al_mono_us();
    }
}
