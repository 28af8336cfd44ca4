/*
 * run.c: a run of the rollout controller: its start (the dataset indexed, the work
 * directory, Kafka, --metrics, the signals), the loop that drives every other file, its
 * stop (children stopped, what is left delivered and reported) and freeing it all.
 */
#define _GNU_SOURCE
#include "rollouts/rollouts.h"

#include "rollouts/controller.h"

#include "core/log.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int sig_fd = -1;

/* SIGCHLD: wakes the loop (SIGINT and SIGTERM are the process skeleton's, which wakes it
 * through the same pipe). */
static void on_signal(int sig)
{
    int e = errno;
    (void)sig;
    if (sig_fd >= 0) {
        char c = 1;
        if (write(sig_fd, &c, 1) < 0) { /* the loop wakes up anyway */
        }
    }
    errno = e;
}

/* Loads the dataset and indexes it: the training and val tasks, the first epoch's order,
 * the set of the tasks' keys. 0, or the exit code (logged). */
static int run_tasks_load(rl_ctl *c)
{
    const rl_opts *o = &c->o;
    char err[1024];
    rl_tasks_opts to = {o->split_ratio, o->shard_index, o->shard_count};
    if (rl_tasks_load(o->tasks, &to, &c->tasks, err, sizeof err)) {
        al_log_error(COMP, "%s", err);
        return AL_EXIT_USAGE;
    }
    c->train_idx = calloc(c->tasks.n + 1, sizeof *c->train_idx);
    c->val_idx = calloc(c->tasks.n + 1, sizeof *c->val_idx);
    c->order = calloc(c->tasks.n + 1, sizeof *c->order);
    c->busy = calloc(c->tasks.n + 1, 1);
    if (!c->train_idx || !c->val_idx || !c->order || !c->busy || rl_feeds_keyset_build(c))
        return AL_EXIT_FAILURE;
    for (size_t i = 0; i < c->tasks.n; i++) {
        if (c->tasks.t[i].split == RL_SPLIT_VAL)
            c->val_idx[c->n_val++] = i;
        else
            c->train_idx[c->n_train++] = i;
    }
    if (!c->n_train) {
        al_log_error(COMP, "%s%s: no training tasks%s", o->tasks,
                     o->shard_count > 1 ? " (this shard)" : "",
                     c->n_val ? " (every task is in the val split)" : "");
        return AL_EXIT_USAGE;
    }
    rl_shuffle(c->order, c->n_train, (uint64_t)o->seed, 0);
    return 0;
}

/* The pacing, evaluation and report state at the start (the versions so far are read),
 * said in one log line. */
static void run_state_init(rl_ctl *c)
{
    const rl_opts *o = &c->o;
    c->tty = isatty(2);
    c->t0_us = al_mono_us();
    c->v_seen_us = c->t0_us;
    if (!c->have_v) {
        /* no version yet: the policy server answers with its initial weights, version 0 */
        c->v = 0;
        c->have_v = 1;
    }
    c->v0 = c->v;
    c->eval_pending = c->n_val > 0;
    c->next_eval_at = c->v0 + (o->eval_every ? o->eval_every : INT64_MAX / 4);
    c->report_version = -1;
    rl_report_row(&c->rep, c->v)->time_s = 0;
    al_log_info(COMP,
                "%zu training and %zu val tasks from %s%s; groups of %" PRId64 ", %" PRId64
                " per step, staleness %" PRId64 ", %" PRId64 " at once; starting at policy v%" PRId64
                "%s%s; agent: %s",
                c->n_train, c->n_val, o->tasks, o->shard_count > 1 ? " (this shard)" : "",
                o->group_size, o->step_groups, o->max_staleness, o->concurrency, c->v,
                c->model[0] ? " of " : "", c->model, o->agent);
}

/* SIGINT and SIGTERM are the stop request (lib/http/process.h: rl_stop_signal); they and
 * SIGCHLD wake the loop through c->sigpipe (closed by rl_run_stop). 0, or -1 when the pipe
 * cannot be made. */
static int run_signals_install(rl_ctl *c)
{
    if (pipe2(c->sigpipe, O_CLOEXEC | O_NONBLOCK) < 0) return -1;
    sig_fd = c->sigpipe[1];
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    al_process_catch_signals(c->sigpipe[1]);
    sigaction(SIGCHLD, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    return 0;
}

int rl_run_start(rl_ctl *c, const al_cli_common *common)
{
    const rl_opts *o = &c->o;
    al_process_init(&c->proc, COMP, NULL, 0);
    int rc = run_tasks_load(c);
    if (rc) return rc;
    if (mkdir(o->workdir, 0755) < 0 && errno != EEXIST) {
        al_log_error(COMP, "--workdir %s: %s", o->workdir, strerror(errno));
        return AL_EXIT_FAILURE;
    }
    snprintf(c->run, sizeof c->run, "ro%" PRIx64 "s%d", (uint64_t)((al_now_us() / 1000) & 0xffffffffffLL),
             o->shard_index);

    char err[1024];
    c->kc = al_kafka_conf_from_cli(common, err, sizeof err);
    if (!c->kc) {
        al_log_error(COMP, "%s", err);
        return AL_EXIT_FAILURE;
    }
    /* --metrics: /metrics and /healthz (healthy while the controller runs) */
    if (common->metrics) {
        if (rl_metrics_init(c) < 0) return AL_EXIT_FAILURE;
        if (al_process_metrics_start(&c->proc, common->metrics, c->metrics, NULL, NULL) != 0)
            return AL_EXIT_FAILURE;
    }
    if (rl_feeds_open(c)) return AL_EXIT_FAILURE;
    if (!(c->curl = curl_easy_init())) {
        al_log_error(COMP, "cannot initialise libcurl");
        return AL_EXIT_FAILURE;
    }
    {
        char p[4200];
        snprintf(p, sizeof p, "%s/eval.jsonl", o->workdir);
        if (!(c->eval_log = fopen(p, "a")))
            al_log_warn(COMP, "cannot write %s: %s (evaluations stay in metrics.csv only)", p,
                        strerror(errno));
    }
    run_state_init(c);
    if (run_signals_install(c)) return AL_EXIT_FAILURE;
    return 0;
}

/* A policy version newer than the last one the loop saw: rows of versions seen while
 * running get their time when first seen, an evaluation falls due every --eval-every
 * versions, the report is rewritten. */
static void run_version_new(rl_ctl *c)
{
    rl_version_row *row = rl_report_row(&c->rep, c->v);
    if (row && row->time_s < 0) row->time_s = rl_now_s(c);
    if (c->n_val && c->v >= c->next_eval_at) {
        c->eval_pending = 1;
        while (c->next_eval_at <= c->v)
            c->next_eval_at += c->o.eval_every ? c->o.eval_every : INT64_MAX / 4;
    }
    rl_progress_write_report(c);
}

/* Whether the run is done: once training is over (--steps reached, or the --epochs started
 * and their groups gone) and no evaluation runs or waits, the final evaluation starts
 * (unless one ran at this version); after it, the run ends when every group is settled and
 * every post delivered. 1: done. */
static int run_done(rl_ctl *c, int trained_enough)
{
    int epochs_over = c->training_done && !c->groups.n;
    if ((trained_enough || epochs_over) && !c->eval_running && !c->eval_pending) {
        if (!c->final_eval_started && c->n_val &&
            !(c->evals_done && c->eval_version == c->v)) {
            c->final_eval_started = 1;
            c->eval_pending = 1;
        } else if (!c->groups.n && !c->phead) {
            return 1;
        }
    }
    return 0;
}

int rl_run_loop(rl_ctl *c)
{
    int64_t last_v = c->v;
    for (;;) {
        rl_metrics_publish(c, c->live.n);
        if (rl_feeds_poll(c, 0)) return 1;
        if (c->v != last_v) {
            run_version_new(c);
            last_v = c->v;
        }
        if (rl_stop_signal) return 0;
        int trained_enough = c->o.steps > 0 && c->v >= c->o.steps;
        if (run_done(c, trained_enough)) return 0;
        if (trained_enough) c->training_done = 1;
        rl_sched_pace_timeout(c);
        rl_schedule(c);
        rl_posts_run(c, 200000);
        rl_settle(c);
        rl_progress(c, 0);
        if (rl_children_wait(c)) return 1;
        rl_children_reap(c);
        rl_children_check_timeouts(c);
    }
}

void rl_run_stop(rl_ctl *c)
{
    if (rl_stop_signal)
        al_log_info(COMP, "%s: stopping the running rollouts", strsignal(rl_stop_signal));
    rl_children_stop(c);
    rl_posts_run(c, 5000000);
    rl_feeds_poll(c, 0);
    for (size_t i = 0; i < c->live.n; i++)
        c->live.v[i]->end_seen = 1;
    rl_settle(c);
    rl_progress_write_report(c);
    rl_tb_write(c, 1);
    if (c->tty) fputc('\n', stderr);
    rl_progress_summary(c);
    sig_fd = -1;
    al_process_catch_signals(-1);
    close(c->sigpipe[0]);
    close(c->sigpipe[1]);
}

void rl_run_free(rl_ctl *c)
{
    al_process_metrics_stop(&c->proc);
    al_metrics_free(c->metrics);
    if (c->eval_log) fclose(c->eval_log);
    if (c->curl) curl_easy_cleanup(c->curl);
    al_follower_free(c->policy);
    al_topic_reader_free(c->spans_rd);
    al_span_clear(&c->span);
    al_policy_version_clear(&c->pv);
    al_kafka_conf_free(c->kc);
    rl_posts_drop(c);
    for (size_t i = 0; i < c->groups.n; i++) {
        for (int k = 0; k < c->groups.v[i]->n; k++)
            free(c->groups.v[i]->r[k]);
        free(c->groups.v[i]->r);
        free(c->groups.v[i]);
    }
    al_vec_free(&c->groups);
    al_map_free(&c->open, NULL);
    al_vec_free(&c->live);
    free(c->pfd);
    free(c->pr);
    rl_report_free(&c->rep);
    rl_tb_close(c);
    free(c->train_idx);
    free(c->val_idx);
    free(c->order);
    free(c->busy);
    al_map_free(&c->keyset, NULL);
    rl_tasks_free(&c->tasks);
    free(c);
}
