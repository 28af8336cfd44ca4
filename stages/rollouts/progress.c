/*
 * progress.c: what the user of the rollout controller sees: the progress line (redrawn on
 * a terminal, a log line per policy version otherwise), metrics.csv and reward.svg
 * rewritten in --workdir (report.h), the --metrics series, and the closing summary.
 */
#include "rollouts/rollouts.h"

#include "core/log.h"

#include <inttypes.h>
#include <stdio.h>

/* retried: an attempt that failed or timed out and runs again as the next attempt */
static const char *const metric_ends[5] = {"succeeded", "failed", "timeout", "aborted",
                                           "retried"};

/* Creates the series --metrics serves (the registry is the controller's own). 0, or -1
 * when out of memory. */
int rl_metrics_init(rl_ctl *c)
{
    if (!(c->metrics = al_metrics_new())) return -1;
    al_metrics_add_process_metrics(c->metrics);
    c->c_started = al_metrics_counter(c->metrics, "arclight_rollouts_started_total",
                                      "Rollouts started (attempts, evaluation ones included)", NULL);
    for (int i = 0; i < 5; i++)
        c->g_ends[i] = al_metrics_gauge(c->metrics, "arclight_rollouts_ended",
                                        "Rollout attempts ended so far (evaluation ones included), "
                                        "by outcome",
                                        "outcome", metric_ends[i], NULL);
    c->g_running = al_metrics_gauge(c->metrics, "arclight_rollouts_running",
                                    "Rollouts whose agent is running", NULL);
    c->g_version = al_metrics_gauge(c->metrics, "arclight_rollouts_policy_version",
                                    "The newest policy version the controller has seen", NULL);
    return 0;
}

/* Copies the counts into the series; called from the controller's loop. */
void rl_metrics_publish(rl_ctl *c, size_t running)
{
    if (!c->metrics) return;
    const int64_t ends[5] = {c->n_succeeded, c->n_failed, c->n_timeout, c->n_aborted,
                             c->n_retried};
    for (int i = 0; i < 5; i++)
        al_gauge_set(c->g_ends[i], (double)ends[i]);
    al_gauge_set(c->g_running, (double)running);
    al_gauge_set(c->g_version, (double)c->v);
    al_counter_add(c->c_started, (double)(c->n_started - c->started_published));
    c->started_published = c->n_started;
}

static void fmt_elapsed(char *b, size_t n, double s)
{
    int t = (int)s;
    if (t >= 3600)
        snprintf(b, n, "%dh%02dm%02ds", t / 3600, t / 60 % 60, t % 60);
    else
        snprintf(b, n, "%dm%02ds", t / 60, t % 60);
}

/* The newest version with training rollouts reported, and the newest with a val reward. */
static const rl_version_row *last_row(const rl_ctl *c, int val)
{
    for (size_t i = c->rep.n; i-- > 0;)
        if (val ? c->rep.rows[i].n_val : c->rep.rows[i].n_train) return &c->rep.rows[i];
    return NULL;
}

/* The progress line: on a terminal redrawn at most every 0.5 s, else logged once per policy
 * version; force: now. */
void rl_progress(rl_ctl *c, int force)
{
    int64_t now = al_mono_us();
    char el[32], val[64] = "-", tr[64] = "-";
    fmt_elapsed(el, sizeof el, rl_now_s(c));
    const rl_version_row *t = last_row(c, 0), *v = last_row(c, 1);
    if (t) snprintf(tr, sizeof tr, "%.3f (v%" PRId64 ")", rl_row_train_mean(t), t->version);
    if (v) snprintf(val, sizeof val, "%.3f (v%" PRId64 ")", rl_row_val_mean(v), v->version);
    double rate = c->n_reported / (rl_now_s(c) > 0 ? rl_now_s(c) : 1);
    int64_t ahead = c->o.step_groups
                        ? (c->started_groups - c->lost_groups) / c->o.step_groups - (c->v - c->v0)
                        : 0;
    if (c->tty) {
        if (!force && now - c->last_progress_us < 500000) return;
        c->last_progress_us = now;
        fprintf(stderr,
                "\r\033[Krollouts: %.1f/s, %d running | policy v%" PRId64 " (rollouts %+" PRId64
                " ahead) | train %s | val %s | %s",
                rate, c->running, c->v, ahead, tr, val, el);
        fflush(stderr);
        return;
    }
    if (!force && c->report_version == c->v) return;
    c->report_version = c->v;
    al_log_info(COMP,
                "policy v%" PRId64 ": train reward %s, val reward %s; %" PRId64
                " rollouts done (%.1f/s), %d running; %s",
                c->v, tr, val, c->n_reported, rate, c->running, el);
}

/* Rewrites metrics.csv and reward.svg in --workdir; a failure is logged, the run goes on. */
void rl_progress_write_report(rl_ctl *c)
{
    char err[512], title[512];
    snprintf(title, sizeof title, "arclight: %s on %s", c->model, c->o.tasks);
    if (rl_report_write(&c->rep, c->o.workdir, title, err, sizeof err))
        al_log_warn(COMP, "cannot write the report: %s", err);
    rl_tb_write(c, 0);
}

/* The closing line: the val reward's change when two evaluations have one, the counts. */
void rl_progress_summary(const rl_ctl *c)
{
    const rl_version_row *first = NULL, *last = NULL;
    for (size_t i = 0; i < c->rep.n; i++)
        if (c->rep.rows[i].n_val) {
            if (!first) first = &c->rep.rows[i];
            last = &c->rep.rows[i];
        }
    char el[32];
    fmt_elapsed(el, sizeof el, rl_now_s(c));
    if (first && last && first != last)
        al_log_info(COMP,
                    "done: val reward %.3f at v%" PRId64 " -> %.3f at v%" PRId64
                    " (%+.3f) in %.1f minutes; %" PRId64 " rollouts (%" PRId64 " failed, %" PRId64
                    " timed out, %" PRId64 " retried); %s/metrics.csv, %s/reward.svg",
                    rl_row_val_mean(first), first->version, rl_row_val_mean(last), last->version,
                    rl_row_val_mean(last) - rl_row_val_mean(first), rl_now_s(c) / 60,
                    c->n_succeeded + c->n_failed + c->n_timeout, c->n_failed, c->n_timeout,
                    c->n_retried, c->o.workdir, c->o.workdir);
    else
        al_log_info(COMP,
                    "done at policy v%" PRId64 " in %s; %" PRId64 " rollouts (%" PRId64
                    " failed, %" PRId64 " timed out, %" PRId64 " retried); %s/metrics.csv",
                    c->v, el, c->n_succeeded + c->n_failed + c->n_timeout, c->n_failed,
                    c->n_timeout, c->n_retried, c->o.workdir);
}
