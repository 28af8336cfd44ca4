/*
 * rollouts.h: what the rollout controller's files share (issue 22 split them out of
 * main.c). Not a library: the rl_ names declared here are the controller's own, for
 * stages/rollouts only; the pure logic that tests drive is in controller.h, tasks.h and
 * report.h.
 *
 * One thread runs the controller's loop over one rl_ctl. Who does what:
 *   main.c      the delivery contract, the flags (usage, parsing into rl_opts), the command
 *   run.c       a run: start (tasks, Kafka, --metrics, signals), the loop, stop, free
 *   rtab.c      rollouts by id (the open ones, until their outcome is in the report)
 *   posts.c     posts to the proxy (rewards, ends), in order, retried with backoff
 *   children.c  an agent's child process: environment, start, its output, reaping,
 *               timeouts, stopping them all
 *   sched.c     what to start: training groups as pacing allows, evaluations
 *   settle.c    a rollout's outcome (its end posted, the next attempt) and settling it
 *               into the report
 *   feeds.c     the Kafka readers: policy versions and spans
 *   progress.c  what the user sees: the progress line, metrics.csv and reward.svg, the
 *               --metrics series, the closing summary
 *   tboard.c    the same numbers as TensorBoard event files (--tensorboard)
 */
#ifndef ARCLIGHT_ROLLOUTS_ROLLOUTS_H
#define ARCLIGHT_ROLLOUTS_ROLLOUTS_H

#include "rollouts/report.h"
#include "rollouts/tasks.h"

#include "avro/codec.h"
#include "core/cli.h"
#include "core/map.h"
#include "core/tbevent.h"
#include "core/util.h"
#include "core/vec.h"
#include "http/metrics.h"
#include "http/process.h"
#include "http/server.h"
#include "kafka/follower.h"
#include "kafka/kafka.h"
#include "kafka/topic_reader.h"

#include <curl/curl.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#define COMP "rollouts"

/* The flags (main.c parses them; defaults there). */
typedef struct rl_opts {
    const char *tasks, *agent, *proxy, *model, *workdir, *reward_name, *tensorboard;
    const char *policy_topic, *spans_topic;
    int64_t group_size, step_groups, max_staleness, concurrency, max_attempts;
    int64_t eval_every, eval_tasks, steps, epochs, seed;
    double rollout_timeout_s, eval_temperature, split_ratio, pace_timeout_s;
    int shard_index, shard_count;
    int quiet_agents; /* 0: the children's stderr lines are logged at info */
} rl_opts;

typedef struct rl_group rl_group;

/* One rollout: its attempts run one after the other as the same rollout id. Owned by its
 * group (which frees it); listed in c->open while open. */
typedef struct rl_rollout {
    rl_group *g;
    size_t task;
    int eval;
    char id[64];
    int attempt;
    /* the child */
    pid_t pid; /* also its process group; 0: not running */
    int fd_out, fd_err;
    char obuf[8192], ebuf[2048];
    size_t on, en;
    char last_line[8192];
    char err_tail[600];
    int64_t start_us, deadline_us, kill_us;
    int timed_out, killed_for_stop;
    /* what the spans say (the final attempt's) */
    int64_t min_version;
    double reward;
    int n_rewards, n_calls, end_seen;
    /* outcome */
    al_rollout_status status;
    int done;           /* no attempt follows; its end is posted */
    int64_t posted_us;  /* when its final end was queued */
    int64_t launch_version;
} rl_rollout;

/* A GRPO group of one task's rollouts (an evaluation rollout is a group of one). */
struct rl_group {
    size_t task;
    int eval;
    int n, n_final, n_failed;
    int64_t serial;
    rl_rollout **r;
};

/* A post to the proxy waiting to be delivered (posts.c owns the queue). */
typedef struct rl_post {
    char url[1024];
    char *body;
    int64_t next_us;
    int tries;
    struct rl_post *next;
} rl_post;

/* The controller: everything a run holds. */
typedef struct rl_ctl {
    rl_opts o;
    rl_tasks tasks;
    size_t *train_idx, n_train, *val_idx, n_val;
    size_t *order, order_pos;
    int64_t epoch;
    unsigned char *busy; /* per task: a group in flight */
    al_map keyset; /* the tasks' keys (values: their rl_task): spans of other tasks are not
                      decoded (a span's Kafka key is its task key) */
    char run[32];
    int64_t next_rollout;
    al_map open;               /* rollouts by id, until their outcome is in the report */
    AL_VEC(rl_rollout *) live; /* every rollout not yet reported */
    AL_VEC(rl_group *) groups; /* unfinished groups */
    int running;
    /* pacing */
    int64_t v, v0, v_seen_us;
    int have_v;
    int64_t started_groups, lost_groups, group_serial;
    /* evaluation */
    int eval_running; /* rollouts of the current evaluation not yet final */
    int64_t eval_version, next_eval_at, evals_done;
    int eval_pending;    /* an evaluation is due and waits for its version */
    int final_eval_done, final_eval_started;
    /* stopping */
    int training_done; /* no more training groups will start */
    /* posts to the proxy, in order */
    rl_post *phead, *ptail;
    CURL *curl;
    /* Kafka */
    al_kafka_conf *kc;
    al_follower *policy; /* arclight.policy, from its beginning */
    al_topic_reader *spans_rd;
    al_span span;
    al_policy_version pv;
    char model[256];
    /* the report */
    rl_report rep;
    FILE *eval_log; /* WORKDIR/eval.jsonl */
    al_tb_writer tb; /* --tensorboard (tboard.c) */
    int tb_failed;
    int64_t tb_next; /* versions below it are written */
    double tb_t0;    /* the wall time the controller started */
    int64_t t0_us;
    int64_t last_progress_us, report_version;
    int tty;
    /* counts */
    int64_t n_started, n_succeeded, n_failed, n_timeout, n_retried, n_aborted, n_eval;
    int64_t n_no_reward, n_reported;
    int sigpipe[2];
    /* the loop's poll set: the signal pipe and the running children's pipes */
    struct pollfd *pfd;
    rl_rollout **pr;
    size_t pfd_cap, pr_cap;
    /* --metrics: the counts above as Prometheus series, set from the loop (atomics) */
    al_metrics *metrics;
    al_process proc; /* SIGINT/SIGTERM and --metrics (lib/http/process.h) */
    al_gauge *g_version, *g_running, *g_ends[5];
    al_counter *c_started;
    int64_t started_published;
} rl_ctl;

/* SIGINT or SIGTERM once received (the process skeleton's stop request): stop at once. */
#define rl_stop_signal al_process_stop_signal()

/* Seconds since the controller started. */
static inline double rl_now_s(const rl_ctl *c)
{
    return (double)(al_mono_us() - c->t0_us) / 1e6;
}

/* run.c: a run of the controller. rl_run_start returns 0, or the exit code to leave with
 * (logged); rl_run_loop returns 1 when it stopped because something failed for good;
 * rl_run_stop stops the children, delivers what it can and says how the run went;
 * rl_run_free frees whatever start got to, c included. */
int rl_run_start(rl_ctl *c, const al_cli_common *common);
int rl_run_loop(rl_ctl *c);
void rl_run_stop(rl_ctl *c);
void rl_run_free(rl_ctl *c);

/* rtab.c: rollouts by id. insert also lists r as live; 0, or -1 when out of memory. */
int rl_rtab_insert(rl_ctl *c, rl_rollout *r);
rl_rollout *rl_rtab_find(const rl_ctl *c, const char *id);
void rl_rtab_remove(rl_ctl *c, rl_rollout *r);

/* posts.c: queues a POST of body (copied) to url; sends what is due within budget_us;
 * drops (and logs) what was never delivered. */
void rl_posts_queue(rl_ctl *c, const char *url, const char *body);
void rl_posts_run(rl_ctl *c, int64_t budget_us);
void rl_posts_drop(rl_ctl *c);

/* children.c */
int rl_child_start(rl_ctl *c, rl_rollout *r);
void rl_children_reap(rl_ctl *c);
void rl_children_check_timeouts(rl_ctl *c);
int rl_children_wait(rl_ctl *c);
void rl_children_stop(rl_ctl *c);

/* sched.c */
void rl_schedule(rl_ctl *c);
void rl_sched_pace_timeout(rl_ctl *c);

/* settle.c */
void rl_rollout_finished(rl_ctl *c, rl_rollout *r, int wstatus);
void rl_settle(rl_ctl *c);

/* feeds.c */
int rl_feeds_keyset_build(rl_ctl *c);
int rl_feeds_open(rl_ctl *c);
int rl_feeds_poll(rl_ctl *c, int wait_ms);

/* tboard.c: --tensorboard's events: the versions no rollout can count for any more, or
 * (final) every one left; closing the file. */
void rl_tb_write(rl_ctl *c, int final);
void rl_tb_close(rl_ctl *c);

/* progress.c */
int rl_metrics_init(rl_ctl *c);
void rl_metrics_publish(rl_ctl *c, size_t running);
void rl_progress(rl_ctl *c, int force);
void rl_progress_write_report(rl_ctl *c);
void rl_progress_summary(const rl_ctl *c);

#endif
