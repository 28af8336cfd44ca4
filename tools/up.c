/*
 * arclight up: the whole loop on one machine. One supervisor starts, as its children, the
 * embedded broker, serve (the policy), proxy (upstream = serve), credit, batch, train (which
 * publishes to arclight.policy, followed by serve) and finally the agent with OPENAI_BASE_URL
 * pointing at the proxy. Every child's output line is repeated on ours, prefixed with the
 * child's name (its stdout on our stdout, its stderr on our stderr).
 *
 * Lifetime: SIGINT/SIGTERM stop every child, downstream of the agent first (agent, proxy,
 * credit, batch, train, sync, serve, broker), each with SIGTERM then SIGKILL after
 * --stop-timeout.
 * A child that exits on its own is a failure (named on stderr; the rest are stopped; exit 1),
 * except train reaching --steps N and the agent finishing with status 0: both end the run
 * with exit 0, and, with --weight-sync, a serve replica or sync: those are started again.
 * Each child runs in its own process group (so that a terminal's Ctrl-C reaches the
 * supervisor alone and the stop order holds) and gets SIGTERM if the supervisor dies.
 *
 * --weight-sync vllm|sglang serves the policy as a vLLM or SGLang fleet is served:
 * --serve-replicas N `serve --weight-routes` without --follow-policy, `arclight sync` bringing
 * them to each new version over that back end's routes, the proxy in front of all of them
 * with that upstream kind and the versions sync records (docs/SERVING.md).
 *
 * This file is the command: its flags (up_config), what it starts in which order, and what a
 * child's ending means. Running the children is tools/up_children.c.
 */
#define _GNU_SOURCE /* strsignal */
#include "core/cli.h"
#include "core/flags.h"
#include "core/log.h"
#include "core/parse.h"
#include "core/util.h"
#include "up_children.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define COMP "up"
#define UP_WARM_BATCH 16      /* conversations per warm-start update (model sft --batch) */
#define UP_WARM_MIN_STEPS 160 /* the fewest warm-start updates by default */
#define UP_WARM_MAX_STEPS 500 /* and the most: a few minutes on 2 cores */
#define UP_MAX_REPLICAS 8     /* --serve-replicas */
#define UP_RESTART_DELAY_MS 2500 /* a dead replica or sync starts again after this: the
                                  * proxy's health checks (every 1000 ms) see it down first */
#define UP_MAX_RESTARTS 10       /* restarts of one child in a run before up gives up */

static const char *const up_sync_kinds[] = {"vllm", "sglang", NULL};

static int up_mkdirs(const char *path)
{
    char tmp[PATH_MAX];
    snprintf(tmp, sizeof tmp, "%s", path);
    for (char *p = tmp + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        if (mkdir(tmp, 0755) < 0 && errno != EEXIST) return -1;
        *p = '/';
    }
    return mkdir(tmp, 0755) < 0 && errno != EEXIST ? -1 : 0;
}

static int up_exists(const char *dir, const char *file)
{
    char p[3 * PATH_MAX];
    snprintf(p, sizeof p, "%s/%s", dir, file);
    return access(p, F_OK) == 0;
}

/* The newest full checkpoint in DIR (step-N/ with weights and optimizer state: what
 * `train --resume` continues from): its version N, or -1 when there is none. */
static long up_newest_checkpoint(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return -1;
    long best = -1;
    for (struct dirent *e; (e = readdir(d));) {
        char *end;
        if (strncmp(e->d_name, "step-", 5) != 0) continue;
        long v = strtol(e->d_name + 5, &end, 10);
        if (*end || end == e->d_name + 5 || v <= best) continue;
        char sub[PATH_MAX];
        snprintf(sub, sizeof sub, "%.*s/%.255s", PATH_MAX - 300, dir, e->d_name);
        if (up_exists(sub, "model.safetensors") && up_exists(sub, "optimizer.safetensors"))
            best = v;
    }
    closedir(d);
    return best;
}

/* The source tree: where tests/model, tests/tokenizer and examples/ are found. The build
 * records it (ARCLIGHT_SCHEMA_DIR is SOURCE/schemas); $ARCLIGHT_SOURCE_DIR overrides. */
static void up_source_dir(char *out, size_t len)
{
    const char *env = getenv("ARCLIGHT_SOURCE_DIR");
    if (env && *env) {
        snprintf(out, len, "%s", env);
        return;
    }
#ifdef ARCLIGHT_SCHEMA_DIR
    snprintf(out, len, "%s", ARCLIGHT_SCHEMA_DIR);
    char *slash = strrchr(out, '/');
    if (slash) *slash = '\0';
    if (access(out, F_OK) == 0) return;
#endif
    snprintf(out, len, ".");
}

/* An argument vector for up_spawn: v[0] NULL (the arclight binary), then the arguments. */
typedef struct up_argv {
    char *v[96];
    int n;
    char extra[4096]; /* --STAGE-args, split in place */
} up_argv;

/* Sets the arguments (NULL-terminated list); a first argument "+" appends instead. */
static void up_argv_set(up_argv *a, const char *first, ...)
{
    va_list ap;
    va_start(ap, first);
    if (strcmp(first, "+") != 0) {
        a->n = 0;
        a->v[a->n++] = NULL;
        a->v[a->n++] = (char *)first;
    }
    for (const char *s; (s = va_arg(ap, const char *)) && a->n < 62;)
        a->v[a->n++] = (char *)s;
    va_end(ap);
    a->v[a->n] = NULL;
}

/* Appends the shared Kafka flags every stage gets, then the user's extra flags for it
 * (whitespace-separated; later flags override earlier ones in every stage's parser). */
static void up_argv_common(up_argv *a, const char *bootstrap, const al_cli_common *common,
                           const char *extra)
{
    up_argv_set(a, "+", "--bootstrap", bootstrap, (char *)NULL);
    if (common->config) up_argv_set(a, "+", "--config", common->config, (char *)NULL);
    if (!extra) return;
    snprintf(a->extra, sizeof a->extra, "%s", extra);
    char *save = NULL;
    for (char *t = strtok_r(a->extra, " \t\n", &save); t && a->n < 94;
         t = strtok_r(NULL, " \t\n", &save))
        a->v[a->n++] = t;
    a->v[a->n] = NULL;
}

/* Stages whose command lines take --STAGE-args. */
enum {
    UP_STAGE_serve,
    UP_STAGE_proxy,
    UP_STAGE_credit,
    UP_STAGE_batch,
    UP_STAGE_train,
    UP_STAGE_rollouts,
    UP_STAGE_sync,
    UP_NSTAGES
};

/* --listen-*: HOST:PORT with a port up to 65535 (0: any free). */
static int up_parse_listen(void *dest, const char *v, char *err, size_t errlen)
{
    char host[256];
    int port;
    if (al_cli_parse_hostport(v, host, sizeof host, &port) < 0 || port < 0 || port > 65535) {
        snprintf(err, errlen, "wants HOST:PORT");
        return -1;
    }
    *(const char **)dest = v;
    return 0;
}

/* A number flag kept as text for the children: its value must parse and lie in (lo, hi]
 * (lo_open) or [lo, hi]. */
static int up_parse_real(void *dest, const char *v, double lo, int lo_open, double hi, char *err,
                         size_t errlen)
{
    double x;
    if (al_parse_double(v, lo, hi, &x) != 0 || (lo_open && !(x > lo))) {
        snprintf(err, errlen, "wants a number in %c%g, %g]", lo_open ? '(' : '[', lo, hi);
        return -1;
    }
    *(const char **)dest = v;
    return 0;
}

/* --lr, --warm-start-lr: a learning rate in (0, 1]. */
static int up_parse_lr(void *dest, const char *v, char *err, size_t errlen)
{
    return up_parse_real(dest, v, 0, 1, 1, err, errlen);
}

/* --kl-beta: a penalty in [0, 100]. */
static int up_parse_kl(void *dest, const char *v, char *err, size_t errlen)
{
    return up_parse_real(dest, v, 0, 0, 100, err, errlen);
}

/* What the flags ask for, and what follows from them (up_config_resolve). */
typedef struct up_config {
    al_cli_common common;
    int bootstrap_given;
    const char *workdir_arg, *model_arg, *model_config, *tokenizer_arg;
    const char *agent_arg, *tasks_arg, *listen_broker;
    const char *warm_arg, *warm_lr, *kl_arg;
    const char *tb_arg; /* --tensorboard: NULL (the default, WORKDIR/tensorboard) or '' */
    int64_t warm_steps; /* 0: two passes over the file, within UP_WARM_MIN/MAX_STEPS */
    const char *listen_serve, *listen_proxy;
    const char *lr;
    const char *stage_args[UP_NSTAGES];
    int64_t seed, steps, group_size, step_groups, max_tokens, stop_timeout;
    int64_t train_replicas; /* data-parallel trainer processes (gloo on the CPU) */
    int64_t serve_replicas; /* policy servers (more than one: --weight-sync) */
    const char *weight_sync; /* vllm or sglang: replicas driven by `arclight sync`; NULL */
    /* resolved */
    char src[PATH_MAX];
    char model_dir[2 * PATH_MAX], tokenizer_dir[2 * PATH_MAX], config_path[2 * PATH_MAX];
    char agent_default[PATH_MAX + 64], tasks_default[PATH_MAX + 64], tasks_abs[PATH_MAX];
    char warm_default[PATH_MAX + 64], warm_abs[PATH_MAX];
    const char *agent_cmd, *tasks, *warm_start;
    int controlled; /* the agent runs under the rollout controller, over tasks */
    char workdir[PATH_MAX];
} up_config;

static void up_config_init(up_config *c)
{
    memset(c, 0, sizeof *c);
    al_cli_common_init(&c->common);
    c->listen_broker = "127.0.0.1:9092";
    c->warm_lr = "1e-2";
    c->listen_serve = "127.0.0.1:8000";
    c->listen_proxy = "127.0.0.1:8080";
    c->lr = "2e-3";
    c->seed = 1;
    c->group_size = 8;
    c->step_groups = 4;
    c->max_tokens = 12;
    c->stop_timeout = 20;
    c->train_replicas = 1;
    c->serve_replicas = 1;
}

#define UP_STAGE_ARGS_HELP(stage) "more flags for " stage " (see below)"

/* The command line into cfg (initialised here). -1: go on; otherwise the exit code to return
 * at once (a usage error, or 0 after --help). The shared flags go to the children too:
 * --bootstrap names the cluster (no embedded broker), --log-level their level; --metrics
 * belongs to a stage, not to up. */
static int up_config_parse(up_config *cfg, int argc, char **argv)
{
    up_config_init(cfg);
    const al_flag flags[] = {
        {"tensorboard", 0, AL_FLAG_STRING, &cfg->tb_arg, .arg = "DIR",
         .help = "TensorBoard event files: DIR/train (each update) and\n"
                 "DIR/rollouts (rewards per version; default\n"
                 "WORKDIR/tensorboard; '' for none)"},
        {"workdir", 0, AL_FLAG_STRING, &cfg->workdir_arg, .arg = "DIR",
         .help = "model, checkpoints and spool (default: a new /tmp/arclight-up.*)"},
        {"model", 0, AL_FLAG_STRING, &cfg->model_arg, .arg = "DIR",
         .help = "the policy's initial weights (config.json + model.safetensors;\n"
                 "tokenizer files too unless --tokenizer)"},
        {"model-config", 0, AL_FLAG_STRING, &cfg->model_config, .arg = "FILE",
         .help = "without --model: a random model from this config.json\n"
                 "(default tests/model/tiny-qwen2.json) in WORKDIR/tiny"},
        {"tokenizer", 0, AL_FLAG_STRING, &cfg->tokenizer_arg, .arg = "DIR",
         .help = "tokenizer.json dir (default: --model, or tests/tokenizer/tiny)"},
        {"seed", 0, AL_FLAG_I64, &cfg->seed, .lo = 0, .hi = INT64_MAX, .arg = "S",
         .help = "seed of the random model (default 1)"},
        {"agent", 0, AL_FLAG_STRING, &cfg->agent_arg, .arg = "CMD",
         .help = "the agent, run by /bin/sh; with --tasks (and by default) once\n"
                 "per rollout by `arclight rollouts`, the rollout controller;\n"
                 "without --tasks once, driving itself; '' runs none\n"
                 "(default: the letters demo, examples/letters, over its tasks)"},
        {"tasks", 0, AL_FLAG_STRING, &cfg->tasks_arg, .arg = "FILE",
         .help = "the task dataset (JSONL) the controller runs the agent over\n"
                 "(default with the demo: examples/letters/tasks.jsonl)"},
        {"warm-start", 0, AL_FLAG_STRING, &cfg->warm_arg, .arg = "FILE",
         .help = "supervised steps (`arclight model sft`) on these conversations\n"
                 "before RL (default with the demo: examples/letters/sft.jsonl;\n"
                 "'' for none)"},
        {"warm-start-steps", 0, AL_FLAG_I64, &cfg->warm_steps, .lo = 1, .hi = 1000000,
         .arg = "N",
         .help = "its updates of 16 conversations (default: two passes over the\n"
                 "file, 160 to 500)"},
        {"warm-start-lr", 0, AL_FLAG_FUNC, &cfg->warm_lr, .arg = "LR",
         .help = "its learning rate (default 1e-2)", .parse = up_parse_lr},
        {"kl-beta", 0, AL_FLAG_FUNC, &cfg->kl_arg, .arg = "B",
         .help = "the trainer's KL penalty to its starting model, the warm start\n"
                 "(default 0.05 with a warm start, 0 without; docs/LEARNING.md)",
         .parse = up_parse_kl},
        {"listen-broker", 0, AL_FLAG_FUNC, &cfg->listen_broker, .arg = "H:P",
         .help = "embedded broker (default 127.0.0.1:9092; port 0: any free);\n"
                 "with --bootstrap no broker is started and that cluster is used",
         .parse = up_parse_listen},
        {"listen-serve", 0, AL_FLAG_FUNC, &cfg->listen_serve, .arg = "H:P",
         .help = "policy server (default 127.0.0.1:8000; port 0: any free)",
         .parse = up_parse_listen},
        {"listen-proxy", 0, AL_FLAG_FUNC, &cfg->listen_proxy, .arg = "H:P",
         .help = "capture proxy, where the agent connects (default\n"
                 "127.0.0.1:8080; port 0: any free)",
         .parse = up_parse_listen},
        {"steps", 0, AL_FLAG_I64, &cfg->steps, .lo = 1, .hi = INT32_MAX, .arg = "N",
         .help = "exit 0 once policy version N is published (and, with the\n"
                 "controller, evaluated on the val tasks; default: run until\n"
                 "stopped)"},
        {"group-size", 0, AL_FLAG_I64, &cfg->group_size, .lo = 1, .hi = 4096, .arg = "G",
         .help = "rollouts per task (GRPO group; default 8)"},
        {"step-groups", 0, AL_FLAG_I64, &cfg->step_groups, .lo = 1, .hi = 4096, .arg = "K",
         .help = "groups per trainer step (default 4)"},
        {"train-replicas", 0, AL_FLAG_I64, &cfg->train_replicas, .lo = 1, .hi = 16, .arg = "N",
         .help = "trainer processes as one data-parallel group (default 1; on the\n"
                 "CPU over gloo: rank 0 checkpoints and publishes, docs/GPU.md)"},
        {"serve-replicas", 0, AL_FLAG_I64, &cfg->serve_replicas, .lo = 1, .hi = UP_MAX_REPLICAS,
         .arg = "N",
         .help = "policy servers behind the proxy (default 1; more need\n"
                 "--weight-sync); each on the next port after --listen-serve's"},
        {"weight-sync", 0, AL_FLAG_STRING, &cfg->weight_sync, .arg = "KIND",
         .choices = up_sync_kinds,
         .help = "vllm or sglang: serve with --weight-routes, not\n"
                 "--follow-policy; `arclight sync` brings each replica to each\n"
                 "new version over that back end's routes, the proxy (that\n"
                 "--upstream-kind) tags spans with the versions sync recorded;\n"
                 "a replica or sync that dies is restarted (docs/SERVING.md)"},
        {"lr", 0, AL_FLAG_FUNC, &cfg->lr, .arg = "LR",
         .help = "trainer learning rate (default 2e-3, for the tiny model)",
         .parse = up_parse_lr},
        {"max-tokens", 0, AL_FLAG_I64, &cfg->max_tokens, .lo = 1, .hi = 4096, .arg = "N",
         .help = "demo agent's completion length (default 12)"},
        {"stop-timeout", 0, AL_FLAG_I64, &cfg->stop_timeout, .lo = 1, .hi = 3600, .arg = "S",
         .help = "seconds each child gets to stop before SIGKILL (default 20)"},
        {"serve-args", 0, AL_FLAG_STRING, &cfg->stage_args[UP_STAGE_serve], .arg = "'FLAGS'",
         .help = UP_STAGE_ARGS_HELP("serve")},
        {"proxy-args", 0, AL_FLAG_STRING, &cfg->stage_args[UP_STAGE_proxy], .arg = "'FLAGS'",
         .help = UP_STAGE_ARGS_HELP("proxy")},
        {"credit-args", 0, AL_FLAG_STRING, &cfg->stage_args[UP_STAGE_credit], .arg = "'FLAGS'",
         .help = UP_STAGE_ARGS_HELP("credit")},
        {"batch-args", 0, AL_FLAG_STRING, &cfg->stage_args[UP_STAGE_batch], .arg = "'FLAGS'",
         .help = UP_STAGE_ARGS_HELP("batch")},
        {"train-args", 0, AL_FLAG_STRING, &cfg->stage_args[UP_STAGE_train], .arg = "'FLAGS'",
         .help = UP_STAGE_ARGS_HELP("train")},
        {"rollouts-args", 0, AL_FLAG_STRING, &cfg->stage_args[UP_STAGE_rollouts],
         .arg = "'FLAGS'", .help = UP_STAGE_ARGS_HELP("rollouts")},
        {"sync-args", 0, AL_FLAG_STRING, &cfg->stage_args[UP_STAGE_sync], .arg = "'FLAGS'",
         .help = UP_STAGE_ARGS_HELP("sync (with --weight-sync)")},
    };
    const al_cmd_spec spec = {
        "up", "[options]",
        "Runs the whole loop on this machine: an embedded broker, serve (the policy), proxy,\n"
        "credit, batch and train, then the agent with OPENAI_BASE_URL=http://PROXY/v1. Each\n"
        "child's output lines carry its name. Ctrl-C (SIGINT/SIGTERM) stops everything; if a\n"
        "child dies, up names it, stops the rest and exits 1 (with --weight-sync a serve\n"
        "replica or sync is started again instead).\n",
        flags, AL_ARRAY_LEN(flags), .common = 1,
        .epilog = "--STAGE-args 'FLAGS': more flags for that stage (whitespace-separated; they\n"
                  "come after up's own, so they override them), e.g.\n"
                  "  --credit-args '--estimator rloo' --train-args '--loss gspo'\n"};
    const char *default_bootstrap = cfg->common.bootstrap;
    int level = al_log_level_current;
    int first;
    int rc = al_flags_parse(&spec, &cfg->common, argc, argv, &first);
    if (rc != AL_FLAGS_GO) return rc;
    if (cfg->common.metrics)
        return al_cli_usage_error("up", "up serves no metrics itself; give a stage its "
                                        "own: --credit-args '--metrics HOST:PORT'");
    cfg->bootstrap_given = cfg->common.bootstrap != default_bootstrap;
    if (al_log_level_current != level) { /* --log-level: the children's too */
        static const char *const names[] = {"error", "warn", "info", "debug"};
        setenv("ARCLIGHT_LOG_LEVEL", names[al_log_level_current], 1);
    }
    for (int i = 0; i < UP_NSTAGES; i++)
        if (cfg->stage_args[i] && strlen(cfg->stage_args[i]) >= sizeof((up_argv *)0)->extra)
            return al_cli_usage_error("up", "--*-args: at most 4095 characters");
    if (first < argc) return al_cli_usage_error("up", "unexpected argument '%s'", argv[first]);
    if (cfg->model_arg && cfg->model_config)
        return al_cli_usage_error("up", "give --model or --model-config, not both");
    if (cfg->serve_replicas > 1 && !cfg->weight_sync)
        return al_cli_usage_error("up", "--serve-replicas %ld: several replicas need "
                                        "--weight-sync vllm|sglang (arclight sync)",
                                  (long)cfg->serve_replicas);
    if (cfg->stage_args[UP_STAGE_sync] && !cfg->weight_sync)
        return al_cli_usage_error("up", "--sync-args: no sync runs without --weight-sync");
    return -1;
}

/* What the flags leave to find: the model (or its config), the tokenizer, the agent and its
 * tasks, the warm start, all as absolute paths, and the work directory (made). -1: go on;
 * otherwise the exit code to return (usage error, or failure to make the work directory). */
static int up_config_resolve(up_config *cfg)
{
    up_source_dir(cfg->src, sizeof cfg->src);
    const char *src = cfg->src;
    if (cfg->model_arg) {
        if (!up_exists(cfg->model_arg, "config.json"))
            return al_cli_usage_error("up", "--model %s: no config.json there", cfg->model_arg);
        if (!realpath(cfg->model_arg, cfg->model_dir))
            return al_cli_usage_error("up", "--model %s: %s", cfg->model_arg, strerror(errno));
    } else {
        if (cfg->model_config)
            snprintf(cfg->config_path, sizeof cfg->config_path, "%s", cfg->model_config);
        else
            snprintf(cfg->config_path, sizeof cfg->config_path, "%s/tests/model/tiny-qwen2.json",
                     src);
        if (access(cfg->config_path, R_OK) != 0)
            return al_cli_usage_error("up", "model config %s: %s", cfg->config_path,
                                      strerror(errno));
    }
    if (cfg->tokenizer_arg)
        snprintf(cfg->tokenizer_dir, sizeof cfg->tokenizer_dir, "%s", cfg->tokenizer_arg);
    else if (cfg->model_arg)
        snprintf(cfg->tokenizer_dir, sizeof cfg->tokenizer_dir, "%s", cfg->model_dir);
    else
        snprintf(cfg->tokenizer_dir, sizeof cfg->tokenizer_dir, "%s/tests/tokenizer/tiny", src);
    if (!up_exists(cfg->tokenizer_dir, "tokenizer.json"))
        return al_cli_usage_error("up", "no tokenizer.json in %s (give --tokenizer DIR)",
                                  cfg->tokenizer_dir);
    /* The agent: by default the letters demo over its tasks, through the rollout controller;
     * --agent with --tasks: that agent through the controller; --agent alone: that agent,
     * once, driving itself. */
    snprintf(cfg->agent_default, sizeof cfg->agent_default, "node %s/examples/letters/agent.js",
             src);
    snprintf(cfg->tasks_default, sizeof cfg->tasks_default, "%s/examples/letters/tasks.jsonl",
             src);
    cfg->agent_cmd = cfg->agent_arg ? cfg->agent_arg : cfg->agent_default;
    cfg->tasks = cfg->tasks_arg ? cfg->tasks_arg : cfg->agent_arg ? NULL : cfg->tasks_default;
    if (cfg->tasks && *cfg->agent_cmd) {
        if (!realpath(cfg->tasks, cfg->tasks_abs))
            return al_cli_usage_error("up", "--tasks %s: %s", cfg->tasks, strerror(errno));
        cfg->tasks = cfg->tasks_abs;
    }
    cfg->controlled = cfg->tasks && *cfg->agent_cmd;
    /* the demo's warm start unless told otherwise */
    snprintf(cfg->warm_default, sizeof cfg->warm_default, "%s/examples/letters/sft.jsonl", src);
    cfg->warm_start = cfg->warm_arg                          ? cfg->warm_arg
                      : (!cfg->agent_arg && !cfg->tasks_arg) ? cfg->warm_default
                                                             : NULL;
    if (cfg->warm_start && *cfg->warm_start) {
        if (!realpath(cfg->warm_start, cfg->warm_abs))
            return al_cli_usage_error("up", "--warm-start %s: %s", cfg->warm_start,
                                      strerror(errno));
        cfg->warm_start = cfg->warm_abs;
    }

    /* The work directory holds the model, the checkpoints and the proxy's spool. */
    if (cfg->workdir_arg) {
        if (up_mkdirs(cfg->workdir_arg) < 0 || !realpath(cfg->workdir_arg, cfg->workdir)) {
            al_log_error(COMP, "--workdir %s: %s", cfg->workdir_arg, strerror(errno));
            return AL_EXIT_FAILURE;
        }
    } else {
        const char *tmp = getenv("TMPDIR");
        snprintf(cfg->workdir, sizeof cfg->workdir, "%s/arclight-up.XXXXXX",
                 tmp && *tmp ? tmp : "/tmp");
        if (!mkdtemp(cfg->workdir)) {
            al_log_error(COMP, "cannot create a work directory %s: %s", cfg->workdir,
                         strerror(errno));
            return AL_EXIT_FAILURE;
        }
    }
    return -1;
}

/* A child up starts again when it dies (--weight-sync's replicas and sync): its command line
 * (built in place: v points into the struct) and its pending restart. */
typedef struct up_keep {
    up_child *k;
    up_argv args;
    int64_t restart_us; /* al_mono_us() of the pending restart; 0: none */
    int restarts;
} up_keep;

/* One run of the loop: the children and what the steps learn on the way. */
typedef struct up_run {
    const up_config *cfg;
    up_state *st;
    char bootstrap[512], serve_url[300], proxy_url[300], name[2 * PATH_MAX];
    char model_dir[2 * PATH_MAX]; /* the policy's start: --model, the random one, the warm start */
    char steps_s[32], gs_s[32], sg_s[32], seq_s[32], seed_s[32];
    char ckpt_dir[PATH_MAX + 8], spool_dir[PATH_MAX + 8];
    char tb_dir[PATH_MAX + 16]; /* '' : no events */
    char tb_train[PATH_MAX + 32], tb_rollouts[PATH_MAX + 32];
    up_argv args;
    /* what serve (each replica) starts from; a restarted replica too */
    char serve_model[2 * PATH_MAX + 128], serve_version[32];
    /* --weight-sync: the replicas' addresses (fixed after the first start) and sync's specs */
    char rep_listen[UP_MAX_REPLICAS][300], rep_url[UP_MAX_REPLICAS][300];
    char sync_spec[UP_MAX_REPLICAS][320];
    up_keep keep[UP_MAX_REPLICAS + 1];
    int nkeep;
} up_run;

/* 1. The broker (unless --bootstrap names a cluster): its bootstrap address. 0 or -1. */
static int up_start_broker(up_run *r)
{
    const up_config *cfg = r->cfg;
    if (cfg->bootstrap_given) {
        snprintf(r->bootstrap, sizeof r->bootstrap, "%s", cfg->common.bootstrap);
        return 0;
    }
    char *a[] = {NULL, "broker", "--listen", (char *)cfg->listen_broker, NULL};
    up_child *k = up_spawn(r->st, "broker", a, NULL);
    if (!k || up_wait_first_line(r->st, k, 60) < 0) return -1;
    snprintf(r->bootstrap, sizeof r->bootstrap, "%s", k->first_line);
    /* The embedded broker answers a fetch that finds nothing only when fetch.wait.max.ms
     * runs out, even if data arrives meanwhile (a real broker answers at once). With the
     * default 500 ms every hop of the loop (spans, transitions, steps, policy versions)
     * waited up to that long: 1.5 s per policy version of the demo instead of 0.5 s.
     * The stages' consumers poll it every 20 ms instead, unless the user set it. */
    setenv("ARCLIGHT_KAFKA_FETCH_WAIT_MAX_MS", "20", 0);
    return 0;
}

/* 2. The model: a random tiny one unless --model; then the warm start, if any. Sets name
 * and model_dir. 0 or -1. */
static int up_prepare_model(up_run *r)
{
    const up_config *cfg = r->cfg;
    if (!cfg->model_arg) {
        const char *base = strrchr(cfg->config_path, '/');
        base = base ? base + 1 : cfg->config_path;
        snprintf(r->name, sizeof r->name, "%.*s", (int)strcspn(base, "."), base);
        if (!strncmp(r->name, "tiny-", 5) || !*r->name) snprintf(r->name, sizeof r->name, "tiny");
        snprintf(r->model_dir, sizeof r->model_dir, "%s/%.255s", cfg->workdir, r->name);
        if (!up_exists(r->model_dir, "model.safetensors")) {
            char *a[] = {NULL,    "model",      "init",   "--config", (char *)cfg->config_path,
                         "--out", r->model_dir, "--seed", r->seed_s,  NULL};
            up_child *k = up_spawn(r->st, "model", a, NULL);
            if (!k || up_run_to_end(r->st, k) < 0) return -1;
        }
    } else {
        snprintf(r->model_dir, sizeof r->model_dir, "%s", cfg->model_dir);
        const char *base = strrchr(r->model_dir, '/');
        snprintf(r->name, sizeof r->name, "%s", base ? base + 1 : r->model_dir);
    }
    /* 2b. The warm start: supervised steps from a file before RL begins (the demo's own by
     * default), into WORKDIR/NAME-sft, which then is the policy's start and the trainer's
     * reference. A work directory that has it already keeps it. */
    const char *warm_start = cfg->warm_start;
    if (!warm_start || !*warm_start) return 0;
    char sft_dir[sizeof r->model_dir], steps_w[32], batch_w[16];
    snprintf(batch_w, sizeof batch_w, "%d", UP_WARM_BATCH);
    snprintf(sft_dir, sizeof sft_dir, "%.3800s/%.255s-sft", cfg->workdir, r->name);
    if (!up_exists(sft_dir, "model.safetensors")) {
        /* Two passes by default: a tiny model that sees a few hundred conversations many
         * times learns them by heart instead of the skill they share (the tool agents'
         * warm starts, docs/LEARNING.md), so bigger files get more steps, not more
         * passes, up to a few minutes' worth; sft.jsonl's 512 keep the 160 they were
         * tuned with, the tool agents' 4,112 get 500. */
        long warm_steps = cfg->warm_steps;
        if (!warm_steps) {
            long lines = al_file_count_lines(warm_start);
            warm_steps = (2 * lines + UP_WARM_BATCH - 1) / UP_WARM_BATCH;
            if (warm_steps > UP_WARM_MAX_STEPS) warm_steps = UP_WARM_MAX_STEPS;
            if (warm_steps < UP_WARM_MIN_STEPS) warm_steps = UP_WARM_MIN_STEPS;
            al_log_info(COMP, "warm start: %ld conversations in %s, %ld steps of %d", lines,
                        warm_start, warm_steps, UP_WARM_BATCH);
        }
        snprintf(steps_w, sizeof steps_w, "%ld", warm_steps);
        char *a[] = {NULL, "model", "sft", "--model", r->model_dir, "--tokenizer",
                     (char *)cfg->tokenizer_dir, "--data", (char *)warm_start, "--out",
                     sft_dir, "--steps", steps_w, "--lr", (char *)cfg->warm_lr, "--batch",
                     batch_w, NULL};
        up_child *k = up_spawn(r->st, "model", a, NULL);
        if (!k || up_run_to_end(r->st, k) < 0) return -1;
    }
    snprintf(r->model_dir, sizeof r->model_dir, "%s", sft_dir);
    return 0;
}

/* Starts stage kname (its --kname-args appended) with the NULL-terminated arguments. */
#define UP_START(r, kname, ...)                                                                    \
    (up_argv_set(&(r)->args, __VA_ARGS__, (char *)NULL),                                           \
     up_argv_common(&(r)->args, (r)->bootstrap, &(r)->cfg->common,                                 \
                    (r)->cfg->stage_args[UP_STAGE_##kname]),                                       \
     up_spawn((r)->st, #kname, (r)->args.v, NULL))

/* A free loopback port for the trainers' rendezvous (bound and released), or -1. */
static int up_free_port(void)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t l = sizeof a;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), port = -1;
    if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &l) == 0)
        port = ntohs(a.sin_port);
    if (fd >= 0) close(fd);
    return port;
}

/* The trainer: one process, or --train-replicas N as a data-parallel group meeting on a free
 * loopback port (ranks 1.. as "train-1".., without --tensorboard: rank 0 writes and publishes
 * everything). args: train's arguments so far. 0 or -1. */
static int up_start_trainers(up_run *r, up_argv *args)
{
    const up_config *cfg = r->cfg;
    int n = (int)cfg->train_replicas, port = n > 1 ? up_free_port() : 0;
    if (port < 0) {
        al_log_error(COMP, "--train-replicas %d: no free loopback port for the trainers", n);
        return -1;
    }
    char world[48], addr[64], rank[48], name[32];
    snprintf(world, sizeof world, "ARCLIGHT_DIST_WORLD=%d", n);
    snprintf(addr, sizeof addr, "ARCLIGHT_DIST_ADDR=127.0.0.1:%d", port);
    char *env[] = {world, addr, rank, NULL};
    if (n > 1) {
        up_argv follower = *args;
        up_argv_common(&follower, r->bootstrap, &cfg->common, cfg->stage_args[UP_STAGE_train]);
        for (int i = 1; i < n; i++) {
            snprintf(rank, sizeof rank, "ARCLIGHT_DIST_RANK=%d", i);
            snprintf(name, sizeof name, "train-%d", i);
            if (!up_spawn(r->st, name, follower.v, env)) return -1;
        }
        al_log_info(COMP, "trainer: %d data-parallel replicas meeting at 127.0.0.1:%d", n, port);
    }
    snprintf(r->tb_train, sizeof r->tb_train, "%s/train", r->tb_dir);
    if (*r->tb_dir) up_argv_set(args, "+", "--tensorboard", r->tb_train, (char *)NULL);
    up_argv_common(args, r->bootstrap, &cfg->common, cfg->stage_args[UP_STAGE_train]);
    snprintf(rank, sizeof rank, "ARCLIGHT_DIST_RANK=0");
    return up_spawn(r->st, "train", args->v, n > 1 ? env : NULL) ? 0 : -1;
}

/* 3. serve, following arclight.policy for this model (the default: one server). 0 or -1. */
static int up_start_serve(up_run *r)
{
    const up_config *cfg = r->cfg;
    up_child *k = UP_START(r, serve, "serve", "--model", r->serve_model, "--tokenizer",
                           cfg->tokenizer_dir, "--listen", cfg->listen_serve,
                           "--served-model-name", r->name, "--policy-version", r->serve_version,
                           "--follow-policy", "--threads", "1");
    if (!k || up_wait_first_line(r->st, k, 120) < 0) return -1;
    const char *addr = k->first_line;
    snprintf(r->serve_url, sizeof r->serve_url, "%s%s", strstr(addr, "://") ? "" : "http://",
             addr);
    return 0;
}

/* 3 with --weight-sync: --serve-replicas servers with the weight routes and no follower, on
 * consecutive ports from --listen-serve's (each on any free port for port 0), then
 * `arclight sync` bringing them to each new version over --weight-sync's routes. Each is an
 * up_keep: started again at the same address when it dies. 0 or -1. */
static int up_start_replicas(up_run *r)
{
    const up_config *cfg = r->cfg;
    char host[256];
    int port = 0;
    al_cli_parse_hostport(cfg->listen_serve, host, sizeof host, &port);
    for (int i = 0; i < (int)cfg->serve_replicas; i++) {
        up_keep *kp = &r->keep[r->nkeep];
        char name[32];
        snprintf(name, sizeof name, "serve-%d", i);
        snprintf(r->rep_listen[i], sizeof r->rep_listen[i],
                 strchr(host, ':') ? "[%s]:%d" : "%s:%d", host, port ? port + i : 0);
        up_argv_set(&kp->args, "serve", "--model", r->serve_model, "--tokenizer",
                    cfg->tokenizer_dir, "--listen", r->rep_listen[i], "--served-model-name",
                    r->name, "--policy-version", r->serve_version, "--weight-routes",
                    "--threads", "1", (char *)NULL);
        up_argv_common(&kp->args, r->bootstrap, &cfg->common, cfg->stage_args[UP_STAGE_serve]);
        kp->k = up_spawn(r->st, name, kp->args.v, NULL);
        if (!kp->k || up_wait_first_line(r->st, kp->k, 120) < 0) return -1;
        r->nkeep++;
        const char *addr = kp->k->first_line, *sep = strstr(addr, "://");
        snprintf(r->rep_url[i], sizeof r->rep_url[i], "%s%s", sep ? "" : "http://", addr);
        /* a restart binds the port the first start got (the proxy and sync know it) */
        const char *hostport = sep ? sep + 3 : addr;
        snprintf(r->rep_listen[i], sizeof r->rep_listen[i], "%.*s", (int)strcspn(hostport, "/"),
                 hostport);
        snprintf(r->sync_spec[i], sizeof r->sync_spec[i], "%s=%s", cfg->weight_sync,
                 r->rep_url[i]);
    }
    snprintf(r->serve_url, sizeof r->serve_url, "%s", r->rep_url[0]);
    /* sync: every second it asks the replicas it believes current which version they serve,
     * so that a restarted one (back on serve_model) is caught up within about a second */
    up_keep *kp = &r->keep[r->nkeep];
    up_argv_set(&kp->args, "sync", "--model-name", r->name, "--check-every", "1",
                "--retry-min-ms", "200", "--retry-max-ms", "2000", (char *)NULL);
    for (int i = 0; i < (int)cfg->serve_replicas; i++)
        up_argv_set(&kp->args, "+", "--replica", r->sync_spec[i], (char *)NULL);
    up_argv_common(&kp->args, r->bootstrap, &cfg->common, cfg->stage_args[UP_STAGE_sync]);
    kp->k = up_spawn(r->st, "sync", kp->args.v, NULL);
    if (!kp->k) return -1;
    r->nkeep++;
    return 0;
}

/* 4. The proxy in front of serve, or of the replicas (--weight-sync: that upstream kind, the
 * versions from sync's records, health checks that take a dead replica out of the rotation
 * at once). 0 or -1. */
static int up_start_proxy(up_run *r)
{
    const up_config *cfg = r->cfg;
    up_argv *a = &r->args;
    up_argv_set(a, "proxy", "--listen", cfg->listen_proxy, (char *)NULL);
    if (!cfg->weight_sync) {
        up_argv_set(a, "+", "--upstream", r->serve_url, "--upstream-kind", "arclight",
                    (char *)NULL);
    } else {
        for (int i = 0; i < (int)cfg->serve_replicas; i++)
            up_argv_set(a, "+", "--upstream", r->rep_url[i], (char *)NULL);
        up_argv_set(a, "+", "--upstream-kind", cfg->weight_sync, "--sync-topic", "arclight.sync",
                    "--policy-model", r->name, "--health-interval-ms", "1000", (char *)NULL);
    }
    up_argv_set(a, "+", "--spool-dir", r->spool_dir, "--drain-timeout", "5", "--no-access-log",
                (char *)NULL);
    up_argv_common(a, r->bootstrap, &cfg->common, cfg->stage_args[UP_STAGE_proxy]);
    up_child *k = up_spawn(r->st, "proxy", a->v, NULL);
    if (!k || up_wait_first_line(r->st, k, 60) < 0) return -1;
    const char *addr = k->first_line;
    snprintf(r->proxy_url, sizeof r->proxy_url, "%s%s", strstr(addr, "://") ? "" : "http://",
             addr);
    return 0;
}

/* 3-5. serve, proxy in front of it, credit, batch and train. 0 or -1. */
static int up_start_stages(up_run *r)
{
    const up_config *cfg = r->cfg;
    /* 3. serve, following arclight.policy for this model. A work directory from an earlier
     * run: on a cluster that kept its topics (--bootstrap), train resumes from its newest
     * full checkpoint and serve starts from it. The embedded broker starts empty, so batch
     * numbers its steps from 0 again and a resumed trainer would skip them as done: there the
     * earlier checkpoints move to ckpt.N/ and the new run starts from their newest weights,
     * with versions counted from 1 again. */
    long resume_version = up_newest_checkpoint(r->ckpt_dir);
    char init_model[sizeof r->model_dir + 64], serve_version[32];
    snprintf(init_model, sizeof init_model, "%s", r->model_dir);
    snprintf(serve_version, sizeof serve_version, "0");
    if (resume_version >= 0 && cfg->bootstrap_given) {
        snprintf(serve_version, sizeof serve_version, "%ld", resume_version);
    } else if (resume_version >= 0) {
        char moved[sizeof r->ckpt_dir + 32];
        for (int i = 1;; i++) {
            snprintf(moved, sizeof moved, "%s.%d", r->ckpt_dir, i);
            if (access(moved, F_OK) != 0) break;
        }
        if (rename(r->ckpt_dir, moved) < 0) {
            al_log_error(COMP, "cannot move %s aside: %s", r->ckpt_dir, strerror(errno));
            return -1;
        }
        snprintf(init_model, sizeof init_model, "%s/step-%ld", moved, resume_version);
        al_log_info(COMP, "starting from %s (version %ld of the earlier run)", init_model,
                    resume_version);
        resume_version = -1;
    }
    if (resume_version >= 0)
        snprintf(r->serve_model, sizeof r->serve_model, "%s/step-%ld", r->ckpt_dir,
                 resume_version);
    else
        snprintf(r->serve_model, sizeof r->serve_model, "%s", init_model);
    snprintf(r->serve_version, sizeof r->serve_version, "%s", serve_version);
    if ((cfg->weight_sync ? up_start_replicas(r) : up_start_serve(r)) < 0) return -1;
    if (up_start_proxy(r) < 0) return -1;
    /* 5. credit, batch, train. */
    /* Step credit (gamma 1, step weight 3): each call's return is the rewards from it to
     * the end, normalised over the group at its call position (discounted credit: with a
     * reward after each call, as the letters demo's agent posts, a call is not credited
     * with a later call's mistake), plus three times its normalised return among the
     * group's calls made from the same state. That second term is what lets an agent that
     * reports one final reward learn a multi-call task: calls from the same state are told
     * apart by what followed them alone; weighted 1 it was outweighed by the episode's
     * term while a later call collapsed (a seed stalled at 0.500; docs/LEARNING.md, issue
     * 25). */
    if (!UP_START(r, credit, "credit", "--group-size", r->gs_s, "--estimator", "grpo", "--credit",
                  "step", "--gamma", "1", "--step-weight", "3", "--idle-timeout", "120",
                  "--quiet-flush", "5"))
        return -1;
    /* With the controller a step is --step-groups groups, whatever number of calls
     * their rollouts make: what the controller paces on. */
    const char *ba = cfg->stage_args[UP_STAGE_batch];
    int own_target = !(ba && strstr(ba, "--step-")); /* the user's wins */
    if (!UP_START(r, batch, "batch", "--group-idle-ms", "200", "--max-staleness", "2",
                  !own_target       ? NULL
                  : cfg->controlled ? "--step-groups"
                                    : "--step-sequences",
                  cfg->controlled ? r->sg_s : r->seq_s))
        return -1;
    up_argv *args = &r->args;
    /* Clip-higher (DAPO's 0.28 above, 0.2 below): a token the sampler found unlikely can
     * gain more per step than a likely one can lose, which keeps a call that got no signal
     * yet from collapsing onto one answer (the sampler's entropy of the letters demo's
     * second call at v10: 0.07-0.25 with 0.2, 0.52 with 0.28; docs/LEARNING.md). */
    up_argv_set(args, "train", "--model", init_model, "--out", r->ckpt_dir, "--model-name",
                r->name, "--lr", cfg->lr, "--keep", "3", "--eps-high", "0.28", (char *)NULL);
    /* A KL penalty to the starting model (the warm start: train's --model is its
     * reference) keeps the policy near what the warm start taught (the second call's
     * copying) while RL sharpens the first call: the letters demo's hardest seed went
     * from 0.54-0.87 at version 40 without it to 0.79-0.94 with it (docs/LEARNING.md). */
    const char *kl = cfg->kl_arg                                  ? cfg->kl_arg
                     : (cfg->warm_start && *cfg->warm_start) ? "0.05"
                                                             : NULL;
    if (kl && strtod(kl, NULL) > 0) up_argv_set(args, "+", "--kl-beta", kl, (char *)NULL);
    /* the versions' directories must load in vLLM and SGLang: with their tokenizer files */
    if (cfg->weight_sync)
        up_argv_set(args, "+", "--tokenizer", cfg->tokenizer_dir, (char *)NULL);
    /* the controller stops the run once version N is evaluated: train goes on until then */
    if (cfg->steps && !cfg->controlled)
        up_argv_set(args, "+", "--steps", r->steps_s, (char *)NULL);
    if (resume_version >= 0) up_argv_set(args, "+", "--resume", (char *)NULL);
    return up_start_trainers(r, args);
}

/* 6. The agent, last: everything it talks to is up. Under the rollout controller with
 * tasks, else alone; none for --agent ''. 0 or -1. */
static int up_start_agent(up_run *r)
{
    const up_config *cfg = r->cfg;
    if (!*cfg->agent_cmd) return 0;
    static char env_base[400], env_key[64], env_proxy[400], env_gs[64], env_sg[64],
        env_model[2 * PATH_MAX + 32], env_mt[64];
    snprintf(env_base, sizeof env_base, "OPENAI_BASE_URL=%s/v1", r->proxy_url);
    snprintf(env_key, sizeof env_key, "OPENAI_API_KEY=%s",
             getenv("OPENAI_API_KEY") ? "unused-by-arclight" : "arclight");
    snprintf(env_proxy, sizeof env_proxy, "ARCLIGHT_PROXY_URL=%s", r->proxy_url);
    snprintf(env_gs, sizeof env_gs, "ARCLIGHT_GROUP_SIZE=%ld", cfg->group_size);
    snprintf(env_sg, sizeof env_sg, "ARCLIGHT_STEP_GROUPS=%ld", cfg->step_groups);
    snprintf(env_model, sizeof env_model, "ARCLIGHT_MODEL=%s", r->name);
    snprintf(env_mt, sizeof env_mt, "ARCLIGHT_MAX_TOKENS=%ld", cfg->max_tokens);
    char *env[] = {env_base, env_key, env_proxy, env_gs, env_sg, env_model, env_mt, NULL};
    if (cfg->controlled) {
        /* each rollout's child gets its own OPENAI_BASE_URL from the controller */
        up_argv *args = &r->args;
        up_argv_set(args, "rollouts", "--tasks", cfg->tasks, "--agent", cfg->agent_cmd, "--proxy",
                    r->proxy_url, "--model", r->name, "--group-size", r->gs_s, "--step-groups",
                    r->sg_s, "--workdir", cfg->workdir, (char *)NULL);
        if (cfg->steps) up_argv_set(args, "+", "--steps", r->steps_s, (char *)NULL);
        snprintf(r->tb_rollouts, sizeof r->tb_rollouts, "%s/rollouts", r->tb_dir);
        if (*r->tb_dir) up_argv_set(args, "+", "--tensorboard", r->tb_rollouts, (char *)NULL);
        up_argv_common(args, r->bootstrap, &cfg->common, cfg->stage_args[UP_STAGE_rollouts]);
        if (!up_spawn(r->st, "rollouts", args->v, env + 1)) return -1;
    } else {
        char *a[] = {"/bin/sh", "-c", (char *)cfg->agent_cmd, NULL};
        if (!up_spawn(r->st, "agent", a, env)) return -1;
    }
    return 0;
}

/* The up_keep of child k (a restartable one), or NULL. */
static up_keep *up_keep_of(up_run *r, const up_child *k)
{
    for (int i = 0; i < r->nkeep; i++)
        if (r->keep[i].k == k) return &r->keep[i];
    return NULL;
}

/* Child k ended on its own: when it is an up_keep, its restart is due in UP_RESTART_DELAY_MS.
 * 0 when a restart is scheduled (or already was); -1 when k is not restartable or ended too
 * often (said why). */
static int up_keep_schedule(up_run *r, up_child *k)
{
    up_keep *kp = up_keep_of(r, k);
    if (!kp) return -1;
    if (kp->restart_us) return 0;
    char why[96];
    up_describe(k, why, sizeof why);
    if (kp->restarts >= UP_MAX_RESTARTS) {
        al_log_error(COMP, "%s (pid %d) %s, restarted %d times already; stopping the rest",
                     k->name, (int)k->pid, why, kp->restarts);
        return -1;
    }
    al_log_warn(COMP, "%s (pid %d) %s; starting it again in %d ms", k->name, (int)k->pid, why,
                UP_RESTART_DELAY_MS);
    kp->restart_us = al_mono_us() + UP_RESTART_DELAY_MS * 1000LL;
    return 0;
}

/* Starts again the up_keeps whose restart is due. 0, or -1 when one could not be started. */
static int up_keep_restart_due(up_run *r)
{
    int64_t now = al_mono_us();
    for (int i = 0; i < r->nkeep; i++) {
        up_keep *kp = &r->keep[i];
        if (!kp->restart_us || now < kp->restart_us) continue;
        kp->restart_us = 0;
        kp->restarts++;
        if (up_respawn(r->st, kp->k, kp->args.v, NULL) < 0) return -1;
    }
    return 0;
}

/* 7. Supervise: until a signal, or until a child ends. A replica or sync of --weight-sync is
 * started again instead (up_keep). The exit code: 0 for a stop, train reaching --steps or the
 * controller or agent finishing with 0; 1 for any other ending. */
static int up_supervise(up_run *r)
{
    up_state *st = r->st;
    char buf[96];
    for (;;) {
        up_pump(st, 500);
        if (st->stop_requested) {
            al_log_info(COMP, "%s: stopping", strsignal(st->stop_signal));
            return AL_EXIT_OK;
        }
        if (up_keep_restart_due(r) < 0) return AL_EXIT_FAILURE;
        up_child *gone = NULL;
        for (int i = 0; i < st->nkids && !gone; i++) {
            up_child *k = &st->kids[i];
            up_keep *kp = up_keep_of(r, k);
            if (!k->running && strcmp(k->name, "model") != 0 && !(kp && kp->restart_us)) gone = k;
        }
        if (!gone) continue;
        if (!strcmp(gone->name, "sync") || !strncmp(gone->name, "serve-", 6)) {
            if (up_keep_schedule(r, gone) == 0) continue;
            return AL_EXIT_FAILURE;
        }
        int exit0 = WIFEXITED(gone->status) && WEXITSTATUS(gone->status) == 0;
        if (exit0 && r->cfg->steps && !strcmp(gone->name, "train")) {
            al_log_info(COMP, "policy version %ld published: done", r->cfg->steps);
            return AL_EXIT_OK;
        } else if (exit0 && !strcmp(gone->name, "rollouts")) {
            al_log_info(COMP, "the rollout controller finished: done");
            return AL_EXIT_OK;
        } else if (exit0 && !strcmp(gone->name, "agent")) {
            al_log_info(COMP, "the agent finished: done");
            return AL_EXIT_OK;
        }
        al_log_error(COMP, "%s (pid %d) %s; stopping the rest", gone->name, (int)gone->pid,
                     up_describe(gone, buf, sizeof buf));
        return AL_EXIT_FAILURE;
    }
}

/* Stops every child; after a clean stop, says who did not stop cleanly (SIGKILL, crash,
 * error). */
static void up_stop(up_run *r, int done_ok)
{
    up_state *st = r->st;
    char buf[96];
    up_stop_all(st, (int)r->cfg->stop_timeout);
    for (int i = 0; i < st->nkids; i++) {
        up_child *k = &st->kids[i];
        const up_keep *kp = up_keep_of(r, k);
        if (!done_ok || !strcmp(k->name, "model") || (kp && kp->restart_us)) continue;
        int clean = (WIFEXITED(k->status) &&
                     (WEXITSTATUS(k->status) == 0 || WEXITSTATUS(k->status) == 130 ||
                      WEXITSTATUS(k->status) == 143)) ||
                    (WIFSIGNALED(k->status) &&
                     (WTERMSIG(k->status) == SIGTERM || WTERMSIG(k->status) == SIGINT));
        if (!clean)
            al_log_warn(COMP, "%s %s while stopping", k->name, up_describe(k, buf, sizeof buf));
    }
}

int cmd_up(int argc, char **argv)
{
    up_config *cfg = calloc(1, sizeof *cfg);
    if (!cfg) return AL_EXIT_FAILURE;
    int rc = up_config_parse(cfg, argc, argv);
    if (rc < 0) rc = up_config_resolve(cfg);
    if (rc >= 0) {
        free(cfg);
        return rc;
    }
    up_run *r = calloc(1, sizeof *r);
    up_state *st = calloc(1, sizeof *st);
    if (!r || !st) {
        free(r), free(st), free(cfg);
        return AL_EXIT_FAILURE;
    }
    if (up_state_begin(st) < 0) {
        free(r), free(st), free(cfg);
        return AL_EXIT_FAILURE;
    }
    r->cfg = cfg;
    r->st = st;
    /* One core per child unless told otherwise: the loop's processes share the machine. */
    setenv("OMP_NUM_THREADS", getenv("OMP_NUM_THREADS") ? getenv("OMP_NUM_THREADS") : "1", 1);

    snprintf(r->steps_s, sizeof r->steps_s, "%ld", cfg->steps);
    snprintf(r->gs_s, sizeof r->gs_s, "%ld", cfg->group_size);
    snprintf(r->sg_s, sizeof r->sg_s, "%ld", cfg->step_groups);
    /* A step closes one sequence past K-1 groups: a group cut short (a rollout dead-lettered)
     * must not leave a round one sequence short of its step. */
    snprintf(r->seq_s, sizeof r->seq_s, "%ld", cfg->group_size * (cfg->step_groups - 1) + 1);
    snprintf(r->seed_s, sizeof r->seed_s, "%ld", cfg->seed);
    snprintf(r->ckpt_dir, sizeof r->ckpt_dir, "%s/ckpt", cfg->workdir);
    snprintf(r->spool_dir, sizeof r->spool_dir, "%s/spool", cfg->workdir);
    if (cfg->tb_arg)
        snprintf(r->tb_dir, sizeof r->tb_dir, "%s", cfg->tb_arg);
    else
        snprintf(r->tb_dir, sizeof r->tb_dir, "%s/tensorboard", cfg->workdir);
    al_log_info(COMP, "work directory %s", cfg->workdir);

    rc = AL_EXIT_FAILURE;
    int done_ok = 0;
    if (up_start_broker(r) == 0 && up_prepare_model(r) == 0 && up_start_stages(r) == 0) {
        fprintf(stdout,
                "up    | broker     %s%s\n"
                "up    | serve      %s  (model %s: %s)\n"
                "up    | proxy      %s  (agents: OPENAI_BASE_URL=%s/v1)\n"
                "up    | train      checkpoints in %s\n",
                r->bootstrap, cfg->bootstrap_given ? "" : "  (embedded)", r->serve_url, r->name,
                r->model_dir, r->proxy_url, r->proxy_url, r->ckpt_dir);
        for (int i = 1; i < (int)cfg->serve_replicas; i++)
            fprintf(stdout, "up    | serve      %s  (replica %d)\n", r->rep_url[i], i);
        if (cfg->weight_sync)
            fprintf(stdout, "up    | sync       %s weight routes, recorded on arclight.sync\n",
                    cfg->weight_sync);
        if (*r->tb_dir) fprintf(stdout, "up    | curves     tensorboard --logdir %s\n", r->tb_dir);
        fflush(stdout);
        if (up_start_agent(r) == 0) {
            al_log_info(COMP, "running%s; Ctrl-C stops everything",
                        cfg->steps ? "" : " until stopped");
            if (cfg->steps) al_log_info(COMP, "stopping after policy version %ld", cfg->steps);
            rc = up_supervise(r);
            done_ok = rc == AL_EXIT_OK;
        }
    }
    if (!done_ok && st->stop_requested) { /* Ctrl-C while starting: a clean stop too */
        al_log_info(COMP, "%s: stopping", strsignal(st->stop_signal));
        rc = AL_EXIT_OK, done_ok = 1;
    }
    up_stop(r, done_ok);
    al_log_info(COMP, "all stopped; exit %d (work directory %s)", rc, cfg->workdir);
    up_state_end(st);
    free(st);
    free(r);
    free(cfg);
    return rc;
}
