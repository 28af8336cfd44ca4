/*
 * main.c: `arclight rollouts`, the rollout controller: a task dataset in, the user's agent
 * command run once per rollout as a child process, held-out evaluation as training goes.
 *
 * What it does, and what it promises:
 *   - Training tasks run in GRPO groups of --group-size rollouts, epoch after epoch in a
 *     seeded shuffled order, at most --concurrency children at once; a task never has two
 *     groups in flight (credit groups rollouts by task id).
 *   - Each child is `/bin/sh -c CMD` in a process group of its own, with its identity in its
 *     base URL (OPENAI_BASE_URL=PROXY/r/{task}/{rollout}/v1, ANTHROPIC_BASE_URL likewise),
 *     the task record on stdin and in ARCLIGHT_TASK, and where to post its reward in
 *     ARCLIGHT_REWARD_URL. An agent either posts its reward to the proxy itself or prints
 *     a last line {"reward": R} that the controller posts for it.
 *   - The controller posts every rollout's end: succeeded on exit 0, failed (with the exit
 *     status or signal) otherwise or on a malformed reward line, timeout after
 *     --rollout-timeout (the child's whole process group is killed). A failed or timed-out
 *     attempt is run again as attempt N+1 (up to --max-attempts); its end then says
 *     "retried", so that credit neither trains on it nor counts it in its group.
 *   - Pacing: at most --max-staleness policy versions ahead of the trainer
 *     (rl_pace_may_start): with 0, every group of a step is sampled by the policy the step
 *     updates.
 *   - Held-out evaluation: at the start, every --eval-every versions and at the end, each
 *     val task runs once through the proxy's /e/ route (greedy unless --eval-temperature),
 *     so that its spans carry eval=true and credit trains on none of them; no training group
 *     starts while an evaluation runs.
 *   - What it knows of each rollout (its reward, the policy versions that answered it) it
 *     reads back from arclight.spans, whoever posted the reward; policy versions and the
 *     trainer's numbers come from arclight.policy. Both are read with assign-based readers
 *     (no consumer group, no commits). metrics.csv and reward.svg in --workdir are rewritten
 *     at every version (report.h); eval.jsonl gets a line per evaluation rollout.
 *   - Stopping: --steps N stops once version N is published and evaluated; --epochs E after
 *     E passes over the training tasks; SIGINT/SIGTERM at once: running children's process
 *     groups get SIGTERM (then SIGKILL after 3 s) and their rollouts end as aborted.
 *   Nothing is retried silently: every failed post to the proxy is retried with backoff,
 *   and a rollout's outcome is logged when it is not a success.
 */
#define _GNU_SOURCE
#include "rollouts/rollouts.h"
#include "rollouts/controller.h"

#include "avro/codec.h"
#include "core/cli.h"
#include "core/log.h"
#include "core/util.h"
#include "http/metrics.h"
#include "http/server.h"
#include "kafka/kafka.h"
#include "kafka/topic_reader.h"

#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>


static void usage(FILE *f)
{
    fputs(
        "usage: arclight rollouts --tasks FILE --agent CMD [flags]\n"
        "Runs an unchanged agent once per rollout over a task dataset (JSONL: one\n"
        "{\"id\": ..., \"input\": ..., \"split\": \"train\"|\"val\"} per line), in GRPO groups paced\n"
        "on the trainer's policy versions, and evaluates the val split as training goes.\n"
        "\n"
        "  --tasks FILE              the dataset\n"
        "  --agent CMD               run by /bin/sh -c once per rollout; it gets\n"
        "                            OPENAI_BASE_URL, ANTHROPIC_BASE_URL, ARCLIGHT_TASK (the task\n"
        "                            record, also on stdin), ARCLIGHT_TASK_ID, ARCLIGHT_ROLLOUT_ID,\n"
        "                            ARCLIGHT_ATTEMPT, ARCLIGHT_SPLIT, ARCLIGHT_REWARD_URL,\n"
        "                            ARCLIGHT_PROXY_URL, ARCLIGHT_MODEL; its reward: posted to\n"
        "                            ARCLIGHT_REWARD_URL, or a last stdout line {\"reward\": R}\n"
        "  --proxy URL               the capture proxy (default http://127.0.0.1:8080)\n"
        "  --model NAME              the model whose versions pace the run (default: the first\n"
        "                            one on the policy topic)\n"
        "  --group-size G            rollouts per training task (default 8)\n"
        "  --step-groups K           groups per trainer step, as batch's --step-groups\n"
        "                            (default 4)\n"
        "  --max-staleness S         run at most S versions ahead of the trainer (default 0:\n"
        "                            on-policy)\n"
        "  --concurrency N           rollouts running at once (default: G * K)\n"
        "  --rollout-timeout S       seconds before a rollout's process group is killed\n"
        "                            (default 300)\n"
        "  --max-attempts N          attempts per rollout (default 2)\n"
        "  --eval-every K            evaluate the val split every K versions (default 10; 0:\n"
        "                            at the start and the end only)\n"
        "  --eval-tasks N            at most N val tasks per evaluation (default: all)\n"
        "  --eval-temperature T      sampling temperature of evaluation calls (default 0:\n"
        "                            greedy)\n"
        "  --split-ratio R           share of tasks without a split that go to val (default 0.2)\n"
        "  --shard i/N               run only the tasks of shard i of N\n"
        "  --seed S                  order of the tasks (default 1)\n"
        "  --steps N                 stop once policy version N is published and evaluated\n"
        "  --epochs E                stop after E passes over the training tasks\n"
        "  --workdir DIR             metrics.csv and reward.svg go there (default .)\n"
        "  --reward-name NAME        only reward spans of this name count in the metrics\n"
        "                            (default: all; a rollout's reward is their sum)\n"
        "  --pace-timeout S          start one more group when the trainer has not moved for\n"
        "                            S seconds and nothing runs (default 300)\n"
        "  --quiet-agents            log the agents' stderr at debug level only\n"
        "  --policy-topic T          default arclight.policy\n"
        "  --spans-topic T           default arclight.spans\n"
        "  --help\n" AL_CLI_COMMON_HELP,
        f);
}

volatile sig_atomic_t rl_stop_signal;
static int sig_fd = -1;

static void on_signal(int sig)
{
    int e = errno;
    if (sig == SIGINT || sig == SIGTERM) rl_stop_signal = sig;
    if (sig_fd >= 0) {
        char c = 1;
        if (write(sig_fd, &c, 1) < 0) { /* the loop wakes up anyway */
        }
    }
    errno = e;
}

/* ------------------------------------------------------------------------------------------
 * The command
 * ------------------------------------------------------------------------------------------ */

enum {
    O_TASKS = AL_CLI_OPT_USER,
    O_AGENT,
    O_PROXY,
    O_MODEL,
    O_GROUP_SIZE,
    O_STEP_GROUPS,
    O_MAX_STALENESS,
    O_CONCURRENCY,
    O_TIMEOUT,
    O_MAX_ATTEMPTS,
    O_EVAL_EVERY,
    O_EVAL_TASKS,
    O_EVAL_TEMP,
    O_SPLIT_RATIO,
    O_SHARD,
    O_SEED,
    O_STEPS,
    O_EPOCHS,
    O_WORKDIR,
    O_REWARD_NAME,
    O_PACE_TIMEOUT,
    O_QUIET_AGENTS,
    O_POLICY_TOPIC,
    O_SPANS_TOPIC,
    O_HELP,
};

static int parse_i64(const char *flag, const char *s, int64_t lo, int64_t hi, int64_t *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi)
        return al_cli_usage_error("rollouts", "%s wants an integer from %lld to %lld, got '%s'",
                                  flag, (long long)lo, (long long)hi, s);
    *out = v;
    return 0;
}

static int parse_dbl(const char *flag, const char *s, double lo, double hi, double *out)
{
    char *end;
    double v = strtod(s, &end);
    if (end == s || *end || !(v >= lo && v <= hi))
        return al_cli_usage_error("rollouts", "%s wants a number from %g to %g, got '%s'", flag,
                                  lo, hi, s);
    *out = v;
    return 0;
}

int cmd_rollouts(int argc, char **argv)
{
    static const struct option lopts[] = {
        {"tasks", required_argument, 0, O_TASKS},
        {"agent", required_argument, 0, O_AGENT},
        {"proxy", required_argument, 0, O_PROXY},
        {"model", required_argument, 0, O_MODEL},
        {"group-size", required_argument, 0, O_GROUP_SIZE},
        {"step-groups", required_argument, 0, O_STEP_GROUPS},
        {"max-staleness", required_argument, 0, O_MAX_STALENESS},
        {"concurrency", required_argument, 0, O_CONCURRENCY},
        {"rollout-timeout", required_argument, 0, O_TIMEOUT},
        {"max-attempts", required_argument, 0, O_MAX_ATTEMPTS},
        {"eval-every", required_argument, 0, O_EVAL_EVERY},
        {"eval-tasks", required_argument, 0, O_EVAL_TASKS},
        {"eval-temperature", required_argument, 0, O_EVAL_TEMP},
        {"split-ratio", required_argument, 0, O_SPLIT_RATIO},
        {"shard", required_argument, 0, O_SHARD},
        {"seed", required_argument, 0, O_SEED},
        {"steps", required_argument, 0, O_STEPS},
        {"epochs", required_argument, 0, O_EPOCHS},
        {"workdir", required_argument, 0, O_WORKDIR},
        {"reward-name", required_argument, 0, O_REWARD_NAME},
        {"pace-timeout", required_argument, 0, O_PACE_TIMEOUT},
        {"quiet-agents", no_argument, 0, O_QUIET_AGENTS},
        {"policy-topic", required_argument, 0, O_POLICY_TOPIC},
        {"spans-topic", required_argument, 0, O_SPANS_TOPIC},
        {"help", no_argument, 0, O_HELP},
        AL_CLI_COMMON_OPTIONS,
        {0, 0, 0, 0},
    };
    al_cli_common common;
    al_cli_common_init(&common);
    al_http_server *srv = NULL;
    rl_ctl *c = calloc(1, sizeof *c);
    if (!c) return AL_EXIT_FAILURE;
    rl_opts *o = &c->o;
    o->proxy = "http://127.0.0.1:8080";
    o->workdir = ".";
    o->policy_topic = "arclight.policy";
    o->spans_topic = "arclight.spans";
    o->group_size = 8;
    o->step_groups = 4;
    o->max_staleness = 0;
    o->concurrency = 0;
    o->max_attempts = 2;
    o->eval_every = 10;
    o->rollout_timeout_s = 300;
    o->split_ratio = 0.2;
    o->pace_timeout_s = 300;
    o->seed = 1;
    o->shard_count = 1;
    int rc = AL_EXIT_USAGE, ch;
    optind = 1;
    while ((ch = getopt_long(argc, argv, "", lopts, NULL)) != -1) {
        int bad = 0;
        switch (ch) {
        case O_TASKS: o->tasks = optarg; break;
        case O_AGENT: o->agent = optarg; break;
        case O_PROXY: o->proxy = optarg; break;
        case O_MODEL: o->model = optarg; break;
        case O_GROUP_SIZE: bad = parse_i64("--group-size", optarg, 1, 4096, &o->group_size); break;
        case O_STEP_GROUPS: bad = parse_i64("--step-groups", optarg, 1, 65536, &o->step_groups); break;
        case O_MAX_STALENESS: bad = parse_i64("--max-staleness", optarg, 0, 1000, &o->max_staleness); break;
        case O_CONCURRENCY: bad = parse_i64("--concurrency", optarg, 1, 4096, &o->concurrency); break;
        case O_TIMEOUT: bad = parse_dbl("--rollout-timeout", optarg, 0.1, 1e6, &o->rollout_timeout_s); break;
        case O_MAX_ATTEMPTS: bad = parse_i64("--max-attempts", optarg, 1, 100, &o->max_attempts); break;
        case O_EVAL_EVERY: bad = parse_i64("--eval-every", optarg, 0, INT32_MAX, &o->eval_every); break;
        case O_EVAL_TASKS: bad = parse_i64("--eval-tasks", optarg, 1, INT32_MAX, &o->eval_tasks); break;
        case O_EVAL_TEMP: bad = parse_dbl("--eval-temperature", optarg, 0, 2, &o->eval_temperature); break;
        case O_SPLIT_RATIO: bad = parse_dbl("--split-ratio", optarg, 0, 1, &o->split_ratio); break;
        case O_SHARD:
            if (rl_parse_shard(optarg, &o->shard_index, &o->shard_count))
                bad = al_cli_usage_error("rollouts", "--shard wants i/N with 0 <= i < N, got '%s'", optarg);
            break;
        case O_SEED: bad = parse_i64("--seed", optarg, 0, INT64_MAX, &o->seed); break;
        case O_STEPS: bad = parse_i64("--steps", optarg, 1, INT64_MAX / 2, &o->steps); break;
        case O_EPOCHS: bad = parse_i64("--epochs", optarg, 1, INT32_MAX, &o->epochs); break;
        case O_WORKDIR: o->workdir = optarg; break;
        case O_REWARD_NAME: o->reward_name = optarg; break;
        case O_PACE_TIMEOUT: bad = parse_dbl("--pace-timeout", optarg, 1, 1e6, &o->pace_timeout_s); break;
        case O_QUIET_AGENTS: o->quiet_agents = 1; break;
        case O_POLICY_TOPIC: o->policy_topic = optarg; break;
        case O_SPANS_TOPIC: o->spans_topic = optarg; break;
        case O_HELP:
            usage(stdout);
            free(c);
            return AL_EXIT_OK;
        default: {
            int r = al_cli_common_option(&common, ch, optarg);
            if (r < 0) bad = 1;
            if (r == 0) bad = al_cli_usage_error("rollouts", "unknown flag (see --help)");
        }
        }
        if (bad) {
            free(c);
            return AL_EXIT_USAGE;
        }
    }
    if (optind < argc) {
        free(c);
        return al_cli_usage_error("rollouts", "unexpected argument '%s'", argv[optind]);
    }
    if (!o->tasks || !o->agent) {
        free(c);
        return al_cli_usage_error("rollouts", "--tasks and --agent are required");
    }
    if (strncmp(o->proxy, "http://", 7) && strncmp(o->proxy, "https://", 8)) {
        al_cli_usage_error("rollouts", "--proxy wants an http:// or https:// URL, got '%s'",
                           o->proxy);
        free(c);
        return AL_EXIT_USAGE;
    }
    static char proxy_buf[600];
    snprintf(proxy_buf, sizeof proxy_buf, "%s", o->proxy);
    size_t pl = strlen(proxy_buf);
    while (pl && proxy_buf[pl - 1] == '/')
        proxy_buf[--pl] = '\0';
    o->proxy = proxy_buf;
    if (!o->concurrency) o->concurrency = o->group_size * o->step_groups;
    if (o->model) snprintf(c->model, sizeof c->model, "%s", o->model);

    char err[1024];
    rl_tasks_opts to = {o->split_ratio, o->shard_index, o->shard_count};
    if (rl_tasks_load(o->tasks, &to, &c->tasks, err, sizeof err)) {
        al_log_error(COMP, "%s", err);
        free(c);
        return AL_EXIT_USAGE;
    }
    rc = AL_EXIT_FAILURE;
    c->train_idx = calloc(c->tasks.n + 1, sizeof *c->train_idx);
    c->val_idx = calloc(c->tasks.n + 1, sizeof *c->val_idx);
    c->order = calloc(c->tasks.n + 1, sizeof *c->order);
    c->busy = calloc(c->tasks.n + 1, 1);
    if (!c->train_idx || !c->val_idx || !c->order || !c->busy || rl_feeds_keyset_build(c)) goto out_tasks;
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
        rc = AL_EXIT_USAGE;
        goto out_tasks;
    }
    rl_shuffle(c->order, c->n_train, (uint64_t)o->seed, 0);
    if (mkdir(o->workdir, 0755) < 0 && errno != EEXIST) {
        al_log_error(COMP, "--workdir %s: %s", o->workdir, strerror(errno));
        goto out_tasks;
    }
    snprintf(c->run, sizeof c->run, "ro%" PRIx64 "s%d", (uint64_t)((al_now_us() / 1000) & 0xffffffffffLL),
             o->shard_index);

    c->kc = al_kafka_conf_from_cli(&common, err, sizeof err);
    if (!c->kc) {
        al_log_error(COMP, "%s", err);
        goto out_tasks;
    }
    /* --metrics: /metrics and /healthz (healthy while the controller runs) */
    if (common.metrics) {
        if (rl_metrics_init(c) < 0) goto out_kafka;
        if (!(srv = al_http_server_start(common.metrics, c->metrics, NULL, NULL, err, sizeof err))) {
            al_log_error(COMP, "%s", err);
            goto out_kafka;
        }
    }
    if (rl_feeds_open(c)) goto out_kafka;
    if (!(c->curl = curl_easy_init())) {
        al_log_error(COMP, "cannot initialise libcurl");
        goto out_kafka;
    }
    {
        char p[4200];
        snprintf(p, sizeof p, "%s/eval.jsonl", o->workdir);
        if (!(c->eval_log = fopen(p, "a")))
            al_log_warn(COMP, "cannot write %s: %s (evaluations stay in metrics.csv only)", p,
                        strerror(errno));
    }
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

    if (pipe2(c->sigpipe, O_CLOEXEC | O_NONBLOCK) < 0) goto out_kafka;
    sig_fd = c->sigpipe[1];
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGCHLD, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);

    int64_t last_v = c->v, failed = 0;
    for (;;) {
        rl_metrics_publish(c, c->nlive);
        if (rl_feeds_poll(c, 0)) {
            failed = 1;
            break;
        }
        if (c->v != last_v) {
            /* rows of versions seen while running get their time when first seen */
            rl_version_row *row = rl_report_row(&c->rep, c->v);
            if (row && row->time_s < 0) row->time_s = rl_now_s(c);
            last_v = c->v;
            if (c->n_val && c->v >= c->next_eval_at) {
                c->eval_pending = 1;
                while (c->next_eval_at <= c->v)
                    c->next_eval_at += o->eval_every ? o->eval_every : INT64_MAX / 4;
            }
            rl_progress_write_report(c);
        }
        if (rl_stop_signal) break;
        /* done? */
        int trained_enough = o->steps > 0 && c->v >= o->steps;
        int epochs_over = c->training_done && !c->ngroups;
        if ((trained_enough || epochs_over) && !c->eval_running && !c->eval_pending) {
            if (!c->final_eval_started && c->n_val &&
                !(c->evals_done && c->eval_version == c->v)) {
                c->final_eval_started = 1;
                c->eval_pending = 1;
            } else if (!c->ngroups && !c->phead) {
                break;
            }
        }
        if (trained_enough) c->training_done = 1;
        rl_sched_pace_timeout(c);
        rl_schedule(c);
        rl_posts_run(c, 200000);
        rl_settle(c);
        rl_progress(c, 0);

        if (rl_children_wait(c)) {
            failed = 1;
            break;
        }
        rl_children_reap(c);
        rl_children_check_timeouts(c);
    }
    if (rl_stop_signal) al_log_info(COMP, "%s: stopping the running rollouts", strsignal(rl_stop_signal));
    rl_children_stop(c);
    rl_posts_run(c, 5000000);
    rl_feeds_poll(c, 0);
    for (size_t i = 0; i < c->nlive; i++)
        c->live[i]->end_seen = 1;
    rl_settle(c);
    rl_progress_write_report(c);
    if (c->tty) fputc('\n', stderr);
    rl_progress_summary(c);
    rc = failed ? AL_EXIT_FAILURE : AL_EXIT_OK;
    sig_fd = -1;
    close(c->sigpipe[0]);
    close(c->sigpipe[1]);
out_kafka:
    al_http_server_stop(srv);
    al_metrics_free(c->metrics);
    if (c->eval_log) fclose(c->eval_log);
    if (c->curl) curl_easy_cleanup(c->curl);
    al_topic_reader_free(c->policy_rd);
    al_topic_reader_free(c->spans_rd);
    al_span_clear(&c->span);
    al_policy_version_clear(&c->pv);
    al_kafka_conf_free(c->kc);
    rl_posts_drop(c);
    for (size_t i = 0; i < c->ngroups; i++) {
        for (int k = 0; k < c->groups[i]->n; k++)
            free(c->groups[i]->r[k]);
        free(c->groups[i]->r);
        free(c->groups[i]);
    }
    free(c->groups);
    free(c->rtab);
    free(c->live);
    free(c->pfd);
    free(c->pr);
    rl_report_free(&c->rep);
out_tasks:
    free(c->train_idx);
    free(c->val_idx);
    free(c->order);
    free(c->busy);
    free(c->keyset);
    rl_tasks_free(&c->tasks);
    free(c);
    return rc;
}
