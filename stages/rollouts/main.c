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
 *     at every version (report.h); eval.jsonl gets a line per evaluation rollout;
 *     with --tensorboard DIR the same numbers go to TensorBoard event files (tboard.c).
 *   - Stopping: --steps N stops once version N is published and evaluated; --epochs E after
 *     E passes over the training tasks; SIGINT/SIGTERM at once: running children's process
 *     groups get SIGTERM (then SIGKILL after 3 s) and their rollouts end as aborted.
 *   Nothing is retried silently: every failed post to the proxy is retried with backoff,
 *   and a rollout's outcome is logged when it is not a success.
 */
#include "rollouts/rollouts.h"

#include "core/cli.h"
#include "core/flags.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* --shard i/N into the rl_opts at dest. */
static int shard_parse(void *dest, const char *value, char *err, size_t errlen)
{
    rl_opts *o = dest;
    if (rl_parse_shard(value, &o->shard_index, &o->shard_count) == 0) return 0;
    snprintf(err, errlen, "wants i/N with 0 <= i < N");
    return -1;
}

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
    const al_flag flags[] = {
        {"tasks", 0, AL_FLAG_STRING, &o->tasks, .arg = "FILE", .help = "the dataset"},
        {"agent", 0, AL_FLAG_STRING, &o->agent, .arg = "CMD",
         .help = "run by /bin/sh -c once per rollout; it gets\n"
                 "OPENAI_BASE_URL, ANTHROPIC_BASE_URL, ARCLIGHT_TASK (the task\n"
                 "record, also on stdin), ARCLIGHT_TASK_ID, ARCLIGHT_ROLLOUT_ID,\n"
                 "ARCLIGHT_ATTEMPT, ARCLIGHT_SPLIT, ARCLIGHT_REWARD_URL,\n"
                 "ARCLIGHT_PROXY_URL, ARCLIGHT_MODEL; its reward: posted to\n"
                 "ARCLIGHT_REWARD_URL, or a last stdout line {\"reward\": R}"},
        {"proxy", 0, AL_FLAG_STRING, &o->proxy, .arg = "URL",
         .help = "the capture proxy (default http://127.0.0.1:8080)"},
        {"model", 0, AL_FLAG_STRING, &o->model, .arg = "NAME",
         .help = "the model whose versions pace the run (default: the first\n"
                 "one on the policy topic)"},
        {"group-size", 0, AL_FLAG_I64, &o->group_size, .lo = 1, .hi = 4096, .arg = "G",
         .help = "rollouts per training task (default 8)"},
        {"step-groups", 0, AL_FLAG_I64, &o->step_groups, .lo = 1, .hi = 65536, .arg = "K",
         .help = "groups per trainer step, as batch's --step-groups\n(default 4)"},
        {"max-staleness", 0, AL_FLAG_I64, &o->max_staleness, .lo = 0, .hi = 1000, .arg = "S",
         .help = "run at most S versions ahead of the trainer (default 0:\non-policy)"},
        {"concurrency", 0, AL_FLAG_I64, &o->concurrency, .lo = 1, .hi = 4096, .arg = "N",
         .help = "rollouts running at once (default: G * K)"},
        {"rollout-timeout", 0, AL_FLAG_DOUBLE, &o->rollout_timeout_s, .dlo = 0.1, .dhi = 1e6,
         .arg = "S", .help = "seconds before a rollout's process group is killed\n(default 300)"},
        {"max-attempts", 0, AL_FLAG_I64, &o->max_attempts, .lo = 1, .hi = 100, .arg = "N",
         .help = "attempts per rollout (default 2)"},
        {"eval-every", 0, AL_FLAG_I64, &o->eval_every, .lo = 0, .hi = INT32_MAX, .arg = "K",
         .help = "evaluate the val split every K versions (default 10; 0:\n"
                 "at the start and the end only)"},
        {"eval-tasks", 0, AL_FLAG_I64, &o->eval_tasks, .lo = 1, .hi = INT32_MAX, .arg = "N",
         .help = "at most N val tasks per evaluation (default: all)"},
        {"eval-temperature", 0, AL_FLAG_DOUBLE, &o->eval_temperature, .dlo = 0, .dhi = 2,
         .arg = "T", .help = "sampling temperature of evaluation calls (default 0:\ngreedy)"},
        {"split-ratio", 0, AL_FLAG_DOUBLE, &o->split_ratio, .dlo = 0, .dhi = 1, .arg = "R",
         .help = "share of tasks without a split that go to val (default 0.2)"},
        {"shard", 0, AL_FLAG_FUNC, o, .arg = "i/N", .parse = shard_parse,
         .help = "run only the tasks of shard i of N"},
        {"seed", 0, AL_FLAG_I64, &o->seed, .lo = 0, .hi = INT64_MAX, .arg = "S",
         .help = "order of the tasks (default 1)"},
        {"steps", 0, AL_FLAG_I64, &o->steps, .lo = 1, .hi = INT64_MAX / 2, .arg = "N",
         .help = "stop once policy version N is published and evaluated"},
        {"epochs", 0, AL_FLAG_I64, &o->epochs, .lo = 1, .hi = INT32_MAX, .arg = "E",
         .help = "stop after E passes over the training tasks"},
        {"workdir", 0, AL_FLAG_STRING, &o->workdir, .arg = "DIR",
         .help = "metrics.csv and reward.svg go there (default .)"},
        {"tensorboard", 0, AL_FLAG_STRING, &o->tensorboard, .arg = "DIR",
         .help = "write the metrics as TensorBoard event files there, a\n"
                 "step per policy version (made if missing; default: none)"},
        {"reward-name", 0, AL_FLAG_STRING, &o->reward_name, .arg = "NAME",
         .help = "only reward spans of this name count in the metrics\n"
                 "(default: all; a rollout's reward is their sum)"},
        {"pace-timeout", 0, AL_FLAG_DOUBLE, &o->pace_timeout_s, .dlo = 1, .dhi = 1e6, .arg = "S",
         .help = "start one more group when the trainer has not moved for\n"
                 "S seconds and nothing runs (default 300)"},
        {"quiet-agents", 0, AL_FLAG_SWITCH, &o->quiet_agents,
         .help = "log the agents' stderr at debug level only"},
        {"policy-topic", 0, AL_FLAG_STRING, &o->policy_topic, .arg = "T",
         .help = "default arclight.policy"},
        {"spans-topic", 0, AL_FLAG_STRING, &o->spans_topic, .arg = "T",
         .help = "default arclight.spans"},
    };
    const al_cmd_spec spec = {
        "rollouts", "--tasks FILE --agent CMD [flags]",
        "Runs an unchanged agent once per rollout over a task dataset (JSONL: one\n"
        "{\"id\": ..., \"input\": ..., \"split\": \"train\"|\"val\"} per line), in GRPO groups paced\n"
        "on the trainer's policy versions, and evaluates the val split as training goes.\n",
        flags, AL_ARRAY_LEN(flags), .common = 1};
    int first;
    int rc = al_flags_parse(&spec, common, argc, argv, &first);
    if (rc != AL_FLAGS_GO) return rc;
    if (first < argc)
        return al_cli_usage_error("rollouts", "unexpected argument '%s'", argv[first]);
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
