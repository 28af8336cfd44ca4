/*
 * settle.c: a rollout's outcome and its settling. When its child is gone the controller
 * posts the agent's reward line (if it printed one) and the attempt's end to the proxy,
 * then either runs the next attempt or makes the outcome final; a final rollout is settled
 * into the report once its end span was read back (or 30 s later), and a group whose
 * rollouts are all settled frees its task.
 */
#include "rollouts/rollouts.h"

#include "rollouts/controller.h"

#include "core/log.h"

#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

/* Queues the post of the end of r's current attempt (retried: another attempt follows). */
static void post_end(rl_ctl *c, rl_rollout *r, const char *status, const char *reason, int retried)
{
    char base[900], url[1000];
    rl_rollout_base(base, sizeof base, c->o.proxy, r->eval, c->o.eval_temperature,
                    c->tasks.t[r->task].key, r->id, r->attempt);
    snprintf(url, sizeof url, "%s/end", base);
    json_t *o = json_pack("{s:s,s:i}", "status", status, "group_size", r->g ? r->g->n : 1);
    if (reason && *reason) json_object_set_new(o, "reason", json_string(reason));
    if (retried) json_object_set_new(o, "retried", json_true());
    char *b = o ? json_dumps(o, JSON_COMPACT) : NULL;
    if (b) rl_posts_queue(c, url, b);
    free(b);
    json_decref(o);
}

/* The child of r is gone (reaped) and its pipes are drained: post its reward line, its end,
 * and either start the next attempt or settle the rollout. */
void rl_rollout_finished(rl_ctl *c, rl_rollout *r, int wstatus)
{
    char reason[800] = "";
    const char *status = "succeeded";
    double reward;
    char body[8192], err[300];
    int bad_line = 0;
    int64_t secs = (al_mono_us() - r->start_us) / 1000000;
    if (r->killed_for_stop) {
        status = "aborted";
        snprintf(reason, sizeof reason, "the controller stopped");
    } else if (r->timed_out) {
        status = "timeout";
        snprintf(reason, sizeof reason, "no exit after %g s; its process group was killed",
                 c->o.rollout_timeout_s);
    } else if (WIFSIGNALED(wstatus)) {
        status = "failed";
        snprintf(reason, sizeof reason, "killed by signal %d (%s)%s%s", WTERMSIG(wstatus),
                 strsignal(WTERMSIG(wstatus)), r->err_tail[0] ? "; last error: " : "",
                 r->err_tail);
    } else if (WEXITSTATUS(wstatus) > 128 && WEXITSTATUS(wstatus) < 128 + 65) {
        /* the shell's way of saying that the agent it ran died of a signal */
        status = "failed";
        int sig = WEXITSTATUS(wstatus) - 128;
        snprintf(reason, sizeof reason, "exit status %d: killed by signal %d (%s)%s%.300s",
                 WEXITSTATUS(wstatus), sig, strsignal(sig), r->err_tail[0] ? "; last error: " : "",
                 r->err_tail);
    } else if (WEXITSTATUS(wstatus) != 0) {
        status = "failed";
        snprintf(reason, sizeof reason, "exit status %d%s%.300s", WEXITSTATUS(wstatus),
                 r->err_tail[0] ? "; last error: " : "", r->err_tail);
    }
    if (!strcmp(status, "succeeded") && r->last_line[0]) {
        int k = rl_parse_reward_line(r->last_line, &reward, body, sizeof body, err, sizeof err);
        if (k < 0) {
            status = "failed";
            bad_line = 1;
            snprintf(reason, sizeof reason, "%s: %.200s", err, r->last_line);
        } else if (k > 0) {
            char base[900], url[1000];
            rl_rollout_base(base, sizeof base, c->o.proxy, r->eval, c->o.eval_temperature,
                            c->tasks.t[r->task].key, r->id, r->attempt);
            snprintf(url, sizeof url, "%s/reward", base);
            rl_posts_queue(c, url, body);
        }
    }
    int ok = !strcmp(status, "succeeded");
    int retry = !ok && !r->killed_for_stop && r->attempt + 1 < c->o.max_attempts;
    if (!ok)
        al_log_warn(COMP, "rollout %s (task %s%s, attempt %d) %s after %" PRId64 " s: %s%s", r->id,
                    c->tasks.t[r->task].id, r->eval ? ", eval" : "", r->attempt, status, secs,
                    reason, retry ? "; running it again" : "");
    (void)bad_line;
    post_end(c, r, status, reason, retry);
    if (retry) {
        c->n_retried++;
        r->attempt++;
        r->n_rewards = r->n_calls = 0;
        r->reward = 0;
        r->min_version = -1;
        r->end_seen = 0;
        r->start_us = 0; /* start_pending starts it again */
        return;
    }
    r->done = 1;
    r->posted_us = al_mono_us();
    r->status = (al_rollout_status)al_rollout_status_parse(status);
    if (ok)
        c->n_succeeded++;
    else if (!strcmp(status, "timeout"))
        c->n_timeout++;
    else if (!strcmp(status, "aborted"))
        c->n_aborted++;
    else
        c->n_failed++;
    rl_group *g = r->g;
    g->n_final++;
    if (!ok) g->n_failed++;
}

/* Rollouts whose outcome is settled go into the report: once their end span was read back
 * (their reward is then whole), or 30 s after their end was posted (the spans are late or
 * the broker away: reported with what is known). Groups whose rollouts are all settled
 * free their task. */
void rl_settle(rl_ctl *c)
{
    int64_t now = al_mono_us();
    for (size_t i = 0; i < c->live.n;) {
        rl_rollout *r = c->live.v[i];
        int ready = r->done && !c->phead && (r->end_seen || now - r->posted_us > 30000000LL);
        if (!ready) {
            i++;
            continue;
        }
        int64_t ver = r->min_version >= 0 ? r->min_version : r->launch_version;
        if (r->status == AL_ROLLOUT_STATUS_SUCCEEDED) {
            if (!r->n_rewards) c->n_no_reward++;
            if (r->eval)
                rl_report_add_val(&c->rep, ver, r->reward);
            else
                rl_report_add_train(&c->rep, ver, r->reward);
        }
        if (r->eval && c->eval_log) { /* every evaluation rollout, for a user's own statistics */
            json_t *o = json_pack("{s:I,s:s,s:s,s:i,s:s,s:f,s:i}", "version", (json_int_t)ver,
                                  "task", c->tasks.t[r->task].id, "rollout", r->id, "attempt",
                                  r->attempt, "status", al_rollout_status_name(r->status),
                                  "reward", r->reward, "rewards", r->n_rewards);
            char *line = o ? json_dumps(o, JSON_COMPACT) : NULL;
            if (line) fprintf(c->eval_log, "%s\n", line);
            fflush(c->eval_log);
            free(line);
            json_decref(o);
        }
        c->n_reported++;
        rl_rtab_remove(c, r); /* moves the last live one into slot i; the group frees r */
    }
    for (size_t i = 0; i < c->groups.n;) {
        rl_group *g = c->groups.v[i];
        int all = g->n_final == g->n;
        for (int k = 0; all && k < g->n; k++)
            if (rl_rtab_find(c, g->r[k]->id)) all = 0;
        if (!all) {
            i++;
            continue;
        }
        if (g->eval) {
            c->eval_running--;
        } else {
            c->busy[g->task] = 0;
            if (g->n_failed == g->n) c->lost_groups++;
        }
        for (int k = 0; k < g->n; k++)
            free(g->r[k]);
        free(g->r);
        free(g);
        c->groups.v[i] = c->groups.v[--c->groups.n];
    }
}
