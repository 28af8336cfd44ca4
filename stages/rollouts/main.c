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
#include "rollouts/rollouts.h"

#include "core/cli.h"

#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

static const struct option rollouts_options[] = {
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

/* Parses the flags into o (the common ones into common), the defaults first. -1 when the
 * command is to run; else the exit code to leave with: AL_EXIT_OK after --help, the usage
 * error's (said on stderr) otherwise. o keeps pointers into argv. */
static int opts_parse(rl_opts *o, al_cli_common *common, int argc, char **argv)
{
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
    int ch;
    optind = 1;
    while ((ch = getopt_long(argc, argv, "", rollouts_options, NULL)) != -1) {
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
            return AL_EXIT_OK;
        default: {
            int r = al_cli_common_option(common, ch, optarg);
            if (r < 0) bad = 1;
            if (r == 0) bad = al_cli_usage_error("rollouts", "unknown flag (see --help)");
        }
        }
        if (bad) return AL_EXIT_USAGE;
    }
    if (optind < argc)
        return al_cli_usage_error("rollouts", "unexpected argument '%s'", argv[optind]);
    if (!o->tasks || !o->agent)
        return al_cli_usage_error("rollouts", "--tasks and --agent are required");
    if (strncmp(o->proxy, "http://", 7) && strncmp(o->proxy, "https://", 8)) {
        al_cli_usage_error("rollouts", "--proxy wants an http:// or https:// URL, got '%s'",
                           o->proxy);
        return AL_EXIT_USAGE;
    }
    static char proxy_buf[600];
    snprintf(proxy_buf, sizeof proxy_buf, "%s", o->proxy);
    size_t pl = strlen(proxy_buf);
    while (pl && proxy_buf[pl - 1] == '/')
        proxy_buf[--pl] = '\0';
    o->proxy = proxy_buf;
    if (!o->concurrency) o->concurrency = o->group_size * o->step_groups;
    return -1;
}

/* `arclight rollouts`: the flags, then a run (run.c) from start to stop. */
int cmd_rollouts(int argc, char **argv)
{
    al_cli_common common;
    al_cli_common_init(&common);
    rl_ctl *c = calloc(1, sizeof *c);
    if (!c) return AL_EXIT_FAILURE;
    int rc = opts_parse(&c->o, &common, argc, argv);
    if (rc >= 0) {
        free(c);
        return rc;
    }
    if (c->o.model) snprintf(c->model, sizeof c->model, "%s", c->o.model);
    rc = rl_run_start(c, &common);
    if (!rc) {
        int failed = rl_run_loop(c);
        rl_run_stop(c);
        rc = failed ? AL_EXIT_FAILURE : AL_EXIT_OK;
    }
    rl_run_free(c);
    return rc;
}
