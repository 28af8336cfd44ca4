/*
 * arclight up: the whole loop on one machine. One supervisor starts, as its children, the
 * embedded broker, serve (the policy), proxy (upstream = serve), credit, batch, train (which
 * publishes to arclight.policy, followed by serve) and finally the agent with OPENAI_BASE_URL
 * pointing at the proxy. Every child's output line is repeated on ours, prefixed with the
 * child's name (its stdout on our stdout, its stderr on our stderr).
 *
 * Lifetime: SIGINT/SIGTERM stop every child, downstream of the agent first (agent, proxy,
 * credit, batch, train, serve, broker), each with SIGTERM then SIGKILL after --stop-timeout.
 * A child that exits on its own is a failure (named on stderr; the rest are stopped; exit 1),
 * except train reaching --steps N and the agent finishing with status 0: both end the run
 * with exit 0. Each child runs in its own process group (so that a terminal's Ctrl-C reaches
 * the supervisor alone and the stop order holds) and gets SIGTERM if the supervisor dies.
 */
#define _GNU_SOURCE /* pipe2 */
#include "core/cli.h"
#include "core/log.h"
#include "core/util.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define COMP "up"
#define UP_WARM_BATCH 16      /* conversations per warm-start update (model sft --batch) */
#define UP_WARM_MIN_STEPS 160 /* the fewest warm-start updates by default */
#define UP_WARM_MAX_STEPS 500 /* and the most: a few minutes on 2 cores */

enum { UP_MAX_CHILDREN = 10, UP_LINE_MAX = 8192 };

typedef struct up_stream {
    int fd;   /* -1 once at EOF */
    FILE *to; /* stdout or stderr */
    char buf[UP_LINE_MAX];
    size_t len;
} up_stream;

typedef struct up_child {
    char name[16];
    pid_t pid;            /* 0: never started */
    int running;          /* not yet reaped */
    int status;           /* waitpid status once reaped */
    up_stream out, err;   /* its stdout and stderr */
    char first_line[256]; /* first stdout line (a server's bound address) */
    int got_first_line;
} up_child;

typedef struct up_state {
    up_child kids[UP_MAX_CHILDREN];
    int nkids;
    char self_exe[PATH_MAX];
    int stop_requested; /* SIGINT/SIGTERM seen */
    int stop_signal;
} up_state;

static int up_sigpipe[2] = {-1, -1};
static volatile sig_atomic_t up_got_signal;

static void up_on_signal(int sig)
{
    int saved = errno;
    if (sig == SIGINT || sig == SIGTERM) up_got_signal = sig;
    char c = (char)sig;
    if (write(up_sigpipe[1], &c, 1) < 0) { /* full pipe: a wakeup is already pending */
    }
    errno = saved;
}

/* Prints one child line with the child's name in front; one fprintf so that lines of
 * different children never interleave. */
static void up_emit(const up_child *k, FILE *to, const char *line, size_t n)
{
    fprintf(to, "%-6s| %.*s\n", k->name, (int)n, line);
    fflush(to);
}

/* Reads what is available on one stream and prints complete lines; at EOF prints the rest
 * and closes the descriptor. The first stdout line is kept (servers print their address). */
static void up_stream_read(up_child *k, up_stream *s)
{
    ssize_t r = read(s->fd, s->buf + s->len, sizeof s->buf - s->len);
    if (r < 0 && (errno == EAGAIN || errno == EINTR)) return;
    if (r <= 0) {
        if (s->len) up_emit(k, s->to, s->buf, s->len);
        s->len = 0;
        close(s->fd);
        s->fd = -1;
        return;
    }
    s->len += (size_t)r;
    size_t start = 0;
    for (size_t i = 0; i < s->len; i++) {
        if (s->buf[i] != '\n') continue;
        size_t n = i - start;
        if (n && s->buf[start + n - 1] == '\r') n--;
        if (s == &k->out && !k->got_first_line) {
            snprintf(k->first_line, sizeof k->first_line, "%.*s", (int)n, s->buf + start);
            k->got_first_line = 1;
        }
        up_emit(k, s->to, s->buf + start, n);
        start = i + 1;
    }
    if (start == 0 && s->len == sizeof s->buf) { /* a line longer than the buffer: cut it */
        up_emit(k, s->to, s->buf, s->len);
        s->len = 0;
    } else if (start) {
        memmove(s->buf, s->buf + start, s->len - start);
        s->len -= start;
    }
}

/* Reaps every exited child (without blocking) and records its status. */
static void up_reap(up_state *st)
{
    for (;;) {
        int status;
        pid_t p = waitpid(-1, &status, WNOHANG);
        if (p <= 0) return;
        for (int i = 0; i < st->nkids; i++) {
            if (st->kids[i].pid != p) continue;
            st->kids[i].running = 0;
            st->kids[i].status = status;
        }
    }
}

/* Waits up to timeout_ms for output or a signal, prints child lines, reaps children. */
static void up_pump(up_state *st, int timeout_ms)
{
    struct pollfd pfd[1 + 2 * UP_MAX_CHILDREN];
    up_stream *who[1 + 2 * UP_MAX_CHILDREN];
    up_child *owner[1 + 2 * UP_MAX_CHILDREN];
    int n = 0;
    pfd[n].fd = up_sigpipe[0];
    pfd[n].events = POLLIN;
    who[n] = NULL, owner[n] = NULL;
    n++;
    for (int i = 0; i < st->nkids; i++) {
        up_child *k = &st->kids[i];
        up_stream *ss[2] = {&k->out, &k->err};
        for (int j = 0; j < 2; j++) {
            if (ss[j]->fd < 0) continue;
            pfd[n].fd = ss[j]->fd;
            pfd[n].events = POLLIN;
            who[n] = ss[j], owner[n] = k;
            n++;
        }
    }
    int r = poll(pfd, (nfds_t)n, timeout_ms);
    if (r > 0) {
        if (pfd[0].revents) {
            char drain[64];
            while (read(up_sigpipe[0], drain, sizeof drain) > 0) {
            }
        }
        for (int i = 1; i < n; i++)
            if (pfd[i].revents) up_stream_read(owner[i], who[i]);
    }
    if (up_got_signal && !st->stop_requested) {
        st->stop_requested = 1;
        st->stop_signal = up_got_signal;
    }
    up_reap(st);
}

/* Starts a child: argv[0] NULL means the arclight binary itself with argv[1..] as its
 * arguments; otherwise argv is run as given (execvp). env_extra: NULL-terminated
 * "NAME=value" strings added to the child's environment. Returns the child or NULL with
 * the reason logged. */
static up_child *up_spawn(up_state *st, const char *name, char **argv, char **env_extra)
{
    if (st->nkids == UP_MAX_CHILDREN) return NULL;
    int po[2], pe[2];
    if (pipe2(po, O_CLOEXEC) < 0) {
        al_log_error(COMP, "%s: pipe: %s", name, strerror(errno));
        return NULL;
    }
    if (pipe2(pe, O_CLOEXEC) < 0) {
        al_log_error(COMP, "%s: pipe: %s", name, strerror(errno));
        close(po[0]), close(po[1]);
        return NULL;
    }
    pid_t parent = getpid();
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) {
        al_log_error(COMP, "%s: fork: %s", name, strerror(errno));
        close(po[0]), close(po[1]), close(pe[0]), close(pe[1]);
        return NULL;
    }
    if (pid == 0) {
        setpgid(0, 0);
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        if (getppid() != parent) _exit(1); /* the supervisor died before prctl */
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        signal(SIGINT, SIG_DFL), signal(SIGTERM, SIG_DFL), signal(SIGCHLD, SIG_DFL);
        signal(SIGPIPE, SIG_DFL);
        dup2(po[1], 1);
        dup2(pe[1], 2);
        for (char **e = env_extra; e && *e; e++)
            putenv(*e);
        if (argv[0]) {
            execvp(argv[0], argv);
        } else {
            argv[0] = (char *)"arclight";
            execv(st->self_exe, argv);
        }
        dprintf(2, "cannot run %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    setpgid(pid, pid); /* both sides set it: no race with an early kill(-pid) */
    close(po[1]);
    close(pe[1]);
    fcntl(po[0], F_SETFL, O_NONBLOCK);
    fcntl(pe[0], F_SETFL, O_NONBLOCK);
    up_child *k = &st->kids[st->nkids++];
    memset(k, 0, sizeof *k);
    snprintf(k->name, sizeof k->name, "%s", name);
    k->pid = pid;
    k->running = 1;
    k->out.fd = po[0], k->out.to = stdout;
    k->err.fd = pe[0], k->err.to = stderr;
    al_log_info(COMP, "started %s (pid %d)", name, (int)pid);
    return k;
}

/* Describes how a reaped child ended ("exited with status 1", "killed by signal 9"). */
static const char *up_describe(const up_child *k, char *buf, size_t len)
{
    if (WIFEXITED(k->status))
        snprintf(buf, len, "exited with status %d", WEXITSTATUS(k->status));
    else if (WIFSIGNALED(k->status))
        snprintf(buf, len, "was killed by signal %d (%s)", WTERMSIG(k->status),
                 strsignal(WTERMSIG(k->status)));
    else
        snprintf(buf, len, "ended (status 0x%x)", k->status);
    return buf;
}

/* Waits until the child printed its first stdout line. 0 when it did; -1 when it died,
 * a stop was requested or timeout_s passed (the reason logged). */
static int up_wait_first_line(up_state *st, up_child *k, int timeout_s)
{
    int64_t deadline = al_mono_us() + (int64_t)timeout_s * 1000000;
    while (!k->got_first_line) {
        if (st->stop_requested) return -1;
        if (!k->running && k->out.fd < 0) {
            char why[96];
            al_log_error(COMP, "%s %s before it was ready", k->name,
                         up_describe(k, why, sizeof why));
            return -1;
        }
        for (int i = 0; i < st->nkids; i++) {
            up_child *o = &st->kids[i];
            if (o == k || o->running || !strcmp(o->name, "model")) continue;
            char why[96];
            al_log_error(COMP, "%s (pid %d) %s while %s was starting", o->name, (int)o->pid,
                         up_describe(o, why, sizeof why), k->name);
            return -1;
        }
        if (al_mono_us() > deadline) {
            al_log_error(COMP, "%s printed no address within %d s", k->name, timeout_s);
            return -1;
        }
        up_pump(st, 100);
    }
    return 0;
}

/* Runs a child to completion (model init). 0 when it exited 0. */
static int up_run_to_end(up_state *st, up_child *k)
{
    while (k->running || k->out.fd >= 0 || k->err.fd >= 0) {
        if (st->stop_requested) return -1;
        up_pump(st, 100);
    }
    if (WIFEXITED(k->status) && WEXITSTATUS(k->status) == 0) return 0;
    char why[96];
    al_log_error(COMP, "%s %s", k->name, up_describe(k, why, sizeof why));
    return -1;
}

/* Stops one child: SIGTERM to its process group, SIGKILL after timeout_s, and waits until
 * it is reaped and its output drained. */
static void up_stop_child(up_state *st, up_child *k, int timeout_s)
{
    if (!k->pid) return;
    if (k->running) {
        kill(-k->pid, SIGTERM);
        int64_t deadline = al_mono_us() + (int64_t)timeout_s * 1000000;
        while (k->running && al_mono_us() < deadline)
            up_pump(st, 50);
        if (k->running) {
            al_log_warn(COMP, "%s did not stop within %d s of SIGTERM; killing it", k->name,
                        timeout_s);
            kill(-k->pid, SIGKILL);
            while (k->running)
                up_pump(st, 50);
        }
    }
    /* What is left in the group (the agent's own children) goes too. */
    kill(-k->pid, SIGKILL);
    int64_t drain_until = al_mono_us() + 2000000;
    while ((k->out.fd >= 0 || k->err.fd >= 0) && al_mono_us() < drain_until)
        up_pump(st, 50);
    if (k->out.fd >= 0) close(k->out.fd), k->out.fd = -1;
    if (k->err.fd >= 0) close(k->err.fd), k->err.fd = -1;
}

/* Stops every child, downstream of the agent first so that in-flight work drains towards a
 * broker that is still there. */
static void up_stop_all(up_state *st, int timeout_s)
{
    static const char *order[] = {"rollouts", "agent", "proxy", "credit", "batch",
                                  "train",    "serve", "model", "broker"};
    for (size_t o = 0; o < sizeof order / sizeof order[0]; o++)
        for (int i = 0; i < st->nkids; i++)
            if (!strcmp(st->kids[i].name, order[o])) up_stop_child(st, &st->kids[i], timeout_s);
    for (int i = 0; i < st->nkids; i++)
        up_stop_child(st, &st->kids[i], timeout_s);
}

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

static const char up_usage[] =
    "usage: arclight up [options]\n"
    "\n"
    "Runs the whole loop on this machine: an embedded broker, serve (the policy), proxy,\n"
    "credit, batch and train, then the agent with OPENAI_BASE_URL=http://PROXY/v1. Each\n"
    "child's output lines carry its name. Ctrl-C (SIGINT/SIGTERM) stops everything; if a\n"
    "child dies, up names it, stops the rest and exits 1.\n"
    "\n"
    "  --workdir DIR           model, checkpoints and spool (default: a new /tmp/arclight-up.*)\n"
    "  --model DIR             the policy's initial weights (config.json + model.safetensors;\n"
    "                          tokenizer files too unless --tokenizer)\n"
    "  --model-config FILE     without --model: a random model from this config.json\n"
    "                          (default tests/model/tiny-qwen2.json) in WORKDIR/tiny\n"
    "  --tokenizer DIR         tokenizer.json dir (default: --model, or tests/tokenizer/tiny)\n"
    "  --seed S                seed of the random model (default 1)\n"
    "  --agent CMD             the agent, run by /bin/sh; with --tasks (and by default) once\n"
    "                          per rollout by `arclight rollouts`, the rollout controller;\n"
    "                          without --tasks once, driving itself; '' runs none\n"
    "                          (default: the letters demo, examples/letters, over its tasks)\n"
    "  --tasks FILE            the task dataset (JSONL) the controller runs the agent over\n"
    "                          (default with the demo: examples/letters/tasks.jsonl)\n"
    "  --warm-start FILE       supervised steps (`arclight model sft`) on these conversations\n"
    "                          before RL (default with the demo: examples/letters/sft.jsonl;\n"
    "                          '' for none)\n"
    "  --warm-start-steps N    its updates of 16 conversations (default: two passes over the\n"
    "                          file, 160 to 500); --warm-start-lr LR (default 1e-2)\n"
    "  --kl-beta B             the trainer's KL penalty to its starting model, the warm start\n"
    "                          (default 0.05 with a warm start, 0 without; docs/LEARNING.md)\n"
    "  --listen-broker H:P     embedded broker (default 127.0.0.1:9092; port 0: any free);\n"
    "                          with --bootstrap no broker is started and that cluster is used\n"
    "  --listen-serve H:P      policy server (default 127.0.0.1:8000; port 0: any free)\n"
    "  --listen-proxy H:P      capture proxy, where the agent connects (default\n"
    "                          127.0.0.1:8080; port 0: any free)\n"
    "  --steps N               exit 0 once policy version N is published (and, with the\n"
    "                          controller, evaluated on the val tasks; default: run until\n"
    "                          stopped)\n"
    "  --group-size G          rollouts per task (GRPO group; default 8)\n"
    "  --step-groups K         groups per trainer step (default 4)\n"
    "  --lr LR                 trainer learning rate (default 2e-3, for the tiny model)\n"
    "  --max-tokens N          demo agent's completion length (default 12)\n"
    "  --stop-timeout S        seconds each child gets to stop before SIGKILL (default 20)\n"
    "  --serve-args, --proxy-args, --credit-args, --batch-args, --train-args,\n"
    "  --rollouts-args 'FLAGS'\n"
    "                          more flags for that stage (whitespace-separated; they come\n"
    "                          after up's own, so they override them), e.g.\n"
    "                          --credit-args '--estimator rloo' --train-args '--loss gspo'\n"
    "  --help\n" AL_CLI_COMMON_HELP;

enum {
    UP_OPT_WORKDIR = AL_CLI_OPT_USER,
    UP_OPT_MODEL,
    UP_OPT_MODEL_CONFIG,
    UP_OPT_TOKENIZER,
    UP_OPT_SEED,
    UP_OPT_AGENT,
    UP_OPT_LISTEN_BROKER,
    UP_OPT_LISTEN_SERVE,
    UP_OPT_LISTEN_PROXY,
    UP_OPT_STEPS,
    UP_OPT_GROUP_SIZE,
    UP_OPT_STEP_GROUPS,
    UP_OPT_LR,
    UP_OPT_MAX_TOKENS,
    UP_OPT_TASKS,
    UP_OPT_WARM_START,
    UP_OPT_WARM_STEPS,
    UP_OPT_WARM_LR,
    UP_OPT_KL_BETA,
    UP_OPT_STOP_TIMEOUT,
    UP_OPT_HELP,
    UP_OPT_STAGE_ARGS, /* + UP_STAGE_* */
};

/* Stages whose command lines take --STAGE-args. */
enum {
    UP_STAGE_serve,
    UP_STAGE_proxy,
    UP_STAGE_credit,
    UP_STAGE_batch,
    UP_STAGE_train,
    UP_STAGE_rollouts,
    UP_NSTAGES
};

static int up_parse_long(const char *flag, const char *s, long lo, long hi, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) {
        al_cli_usage_error("up", "%s wants an integer from %ld to %ld, got '%s'", flag, lo, hi, s);
        return -1;
    }
    *out = v;
    return 0;
}

static int up_check_listen(const char *flag, const char *s)
{
    char host[256];
    int port;
    if (al_cli_parse_hostport(s, host, sizeof host, &port) < 0 || port < 0 || port > 65535)
        return al_cli_usage_error("up", "%s wants HOST:PORT, got '%s'", flag, s);
    return 0;
}

int cmd_up(int argc, char **argv)
{
    static const struct option opts[] = {
        {"workdir", required_argument, 0, UP_OPT_WORKDIR},
        {"model", required_argument, 0, UP_OPT_MODEL},
        {"model-config", required_argument, 0, UP_OPT_MODEL_CONFIG},
        {"tokenizer", required_argument, 0, UP_OPT_TOKENIZER},
        {"seed", required_argument, 0, UP_OPT_SEED},
        {"agent", required_argument, 0, UP_OPT_AGENT},
        {"listen-broker", required_argument, 0, UP_OPT_LISTEN_BROKER},
        {"listen-serve", required_argument, 0, UP_OPT_LISTEN_SERVE},
        {"listen-proxy", required_argument, 0, UP_OPT_LISTEN_PROXY},
        {"steps", required_argument, 0, UP_OPT_STEPS},
        {"group-size", required_argument, 0, UP_OPT_GROUP_SIZE},
        {"step-groups", required_argument, 0, UP_OPT_STEP_GROUPS},
        {"lr", required_argument, 0, UP_OPT_LR},
        {"max-tokens", required_argument, 0, UP_OPT_MAX_TOKENS},
        {"stop-timeout", required_argument, 0, UP_OPT_STOP_TIMEOUT},
        {"help", no_argument, 0, UP_OPT_HELP},
        {"serve-args", required_argument, 0, UP_OPT_STAGE_ARGS + UP_STAGE_serve},
        {"proxy-args", required_argument, 0, UP_OPT_STAGE_ARGS + UP_STAGE_proxy},
        {"credit-args", required_argument, 0, UP_OPT_STAGE_ARGS + UP_STAGE_credit},
        {"batch-args", required_argument, 0, UP_OPT_STAGE_ARGS + UP_STAGE_batch},
        {"train-args", required_argument, 0, UP_OPT_STAGE_ARGS + UP_STAGE_train},
        {"rollouts-args", required_argument, 0, UP_OPT_STAGE_ARGS + UP_STAGE_rollouts},
        {"tasks", required_argument, 0, UP_OPT_TASKS},
        {"warm-start", required_argument, 0, UP_OPT_WARM_START},
        {"warm-start-steps", required_argument, 0, UP_OPT_WARM_STEPS},
        {"warm-start-lr", required_argument, 0, UP_OPT_WARM_LR},
        {"kl-beta", required_argument, 0, UP_OPT_KL_BETA},
        AL_CLI_COMMON_OPTIONS,
        {0, 0, 0, 0},
    };
    al_cli_common common;
    al_cli_common_init(&common);
    int bootstrap_given = 0;
    const char *workdir_arg = NULL, *model_arg = NULL, *model_config = NULL, *tokenizer_arg = NULL;
    const char *agent_arg = NULL, *tasks_arg = NULL, *listen_broker = "127.0.0.1:9092";
    const char *warm_arg = NULL, *warm_lr = "1e-2", *kl_arg = NULL;
    long warm_steps = 0; /* 0: two passes over the file, within UP_WARM_MIN/MAX_STEPS */
    const char *listen_serve = "127.0.0.1:8000", *listen_proxy = "127.0.0.1:8080";
    const char *lr = "2e-3";
    const char *stage_args[UP_NSTAGES] = {0};
    long seed = 1, steps = 0, group_size = 8, step_groups = 4, max_tokens = 12, stop_timeout = 20;

    optind = 1;
    int c;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case UP_OPT_WORKDIR:
            workdir_arg = optarg;
            break;
        case UP_OPT_MODEL:
            model_arg = optarg;
            break;
        case UP_OPT_MODEL_CONFIG:
            model_config = optarg;
            break;
        case UP_OPT_TOKENIZER:
            tokenizer_arg = optarg;
            break;
        case UP_OPT_SEED:
            if (up_parse_long("--seed", optarg, 0, LONG_MAX, &seed)) return AL_EXIT_USAGE;
            break;
        case UP_OPT_AGENT:
            agent_arg = optarg;
            break;
        case UP_OPT_TASKS:
            tasks_arg = optarg;
            break;
        case UP_OPT_WARM_START:
            warm_arg = optarg;
            break;
        case UP_OPT_WARM_STEPS:
            if (up_parse_long("--warm-start-steps", optarg, 1, 1000000, &warm_steps))
                return AL_EXIT_USAGE;
            break;
        case UP_OPT_WARM_LR: {
            char *end;
            double v = strtod(optarg, &end);
            if (end == optarg || *end || !(v > 0) || v > 1)
                return al_cli_usage_error("up", "--warm-start-lr wants a number in (0, 1], got '%s'",
                                          optarg);
            warm_lr = optarg;
            break;
        }
        case UP_OPT_KL_BETA: {
            char *end;
            double v = strtod(optarg, &end);
            if (end == optarg || *end || !(v >= 0) || v > 100)
                return al_cli_usage_error("up", "--kl-beta wants a number in [0, 100], got '%s'",
                                          optarg);
            kl_arg = optarg;
            break;
        }
        case UP_OPT_LISTEN_BROKER:
            if (up_check_listen("--listen-broker", optarg)) return AL_EXIT_USAGE;
            listen_broker = optarg;
            break;
        case UP_OPT_LISTEN_SERVE:
            if (up_check_listen("--listen-serve", optarg)) return AL_EXIT_USAGE;
            listen_serve = optarg;
            break;
        case UP_OPT_LISTEN_PROXY:
            if (up_check_listen("--listen-proxy", optarg)) return AL_EXIT_USAGE;
            listen_proxy = optarg;
            break;
        case UP_OPT_STEPS:
            if (up_parse_long("--steps", optarg, 1, INT32_MAX, &steps)) return AL_EXIT_USAGE;
            break;
        case UP_OPT_GROUP_SIZE:
            if (up_parse_long("--group-size", optarg, 1, 4096, &group_size)) return AL_EXIT_USAGE;
            break;
        case UP_OPT_STEP_GROUPS:
            if (up_parse_long("--step-groups", optarg, 1, 4096, &step_groups)) return AL_EXIT_USAGE;
            break;
        case UP_OPT_LR: {
            char *end;
            double v = strtod(optarg, &end);
            if (end == optarg || *end || !(v > 0) || v > 1)
                return al_cli_usage_error("up", "--lr wants a number in (0, 1], got '%s'", optarg);
            lr = optarg;
            break;
        }
        case UP_OPT_MAX_TOKENS:
            if (up_parse_long("--max-tokens", optarg, 1, 4096, &max_tokens)) return AL_EXIT_USAGE;
            break;
        case UP_OPT_STOP_TIMEOUT:
            if (up_parse_long("--stop-timeout", optarg, 1, 3600, &stop_timeout))
                return AL_EXIT_USAGE;
            break;
        case UP_OPT_HELP:
            fputs(up_usage, stdout);
            return AL_EXIT_OK;
        case UP_OPT_STAGE_ARGS + UP_STAGE_serve:
        case UP_OPT_STAGE_ARGS + UP_STAGE_proxy:
        case UP_OPT_STAGE_ARGS + UP_STAGE_credit:
        case UP_OPT_STAGE_ARGS + UP_STAGE_batch:
        case UP_OPT_STAGE_ARGS + UP_STAGE_train:
        case UP_OPT_STAGE_ARGS + UP_STAGE_rollouts:
            if (strlen(optarg) >= sizeof((up_argv *)0)->extra)
                return al_cli_usage_error("up", "--*-args: at most 4095 characters");
            stage_args[c - UP_OPT_STAGE_ARGS] = optarg;
            break;
        default: {
            if (c == AL_CLI_OPT_BOOTSTRAP) bootstrap_given = 1;
            if (c == AL_CLI_OPT_METRICS)
                return al_cli_usage_error("up", "up serves no metrics itself; give a stage its "
                                                "own: --credit-args '--metrics HOST:PORT'");
            int r = al_cli_common_option(&common, c, optarg);
            if (r < 0) return AL_EXIT_USAGE;
            if (c == AL_CLI_OPT_LOG_LEVEL) setenv("ARCLIGHT_LOG_LEVEL", optarg, 1); /* children */
            if (r == 0) return al_cli_usage_error("up", "unknown option (see --help)");
        }
        }
    }
    if (optind < argc) return al_cli_usage_error("up", "unexpected argument '%s'", argv[optind]);
    if (model_arg && model_config)
        return al_cli_usage_error("up", "give --model or --model-config, not both");

    char src[PATH_MAX];
    up_source_dir(src, sizeof src);
    char model_dir[2 * PATH_MAX], tokenizer_dir[2 * PATH_MAX], config_path[2 * PATH_MAX];
    if (model_arg) {
        if (!up_exists(model_arg, "config.json"))
            return al_cli_usage_error("up", "--model %s: no config.json there", model_arg);
        if (!realpath(model_arg, model_dir))
            return al_cli_usage_error("up", "--model %s: %s", model_arg, strerror(errno));
    } else {
        if (model_config)
            snprintf(config_path, sizeof config_path, "%s", model_config);
        else
            snprintf(config_path, sizeof config_path, "%s/tests/model/tiny-qwen2.json", src);
        if (access(config_path, R_OK) != 0)
            return al_cli_usage_error("up", "model config %s: %s", config_path, strerror(errno));
    }
    if (tokenizer_arg)
        snprintf(tokenizer_dir, sizeof tokenizer_dir, "%s", tokenizer_arg);
    else if (model_arg)
        snprintf(tokenizer_dir, sizeof tokenizer_dir, "%s", model_dir);
    else
        snprintf(tokenizer_dir, sizeof tokenizer_dir, "%s/tests/tokenizer/tiny", src);
    if (!up_exists(tokenizer_dir, "tokenizer.json"))
        return al_cli_usage_error("up", "no tokenizer.json in %s (give --tokenizer DIR)",
                                  tokenizer_dir);
    /* The agent: by default the letters demo over its tasks, through the rollout controller;
     * --agent with --tasks: that agent through the controller; --agent alone: that agent,
     * once, driving itself. */
    char agent_default[PATH_MAX + 64], tasks_default[PATH_MAX + 64];
    snprintf(agent_default, sizeof agent_default, "node %s/examples/letters/agent.js", src);
    snprintf(tasks_default, sizeof tasks_default, "%s/examples/letters/tasks.jsonl", src);
    const char *agent_cmd = agent_arg ? agent_arg : agent_default;
    const char *tasks = tasks_arg ? tasks_arg : agent_arg ? NULL : tasks_default;
    char tasks_abs[PATH_MAX];
    if (tasks && *agent_cmd) {
        if (!realpath(tasks, tasks_abs))
            return al_cli_usage_error("up", "--tasks %s: %s", tasks, strerror(errno));
        tasks = tasks_abs;
    }
    int controlled = tasks && *agent_cmd;
    /* the demo's warm start unless told otherwise */
    char warm_default[PATH_MAX + 64];
    snprintf(warm_default, sizeof warm_default, "%s/examples/letters/sft.jsonl", src);
    const char *warm_start = warm_arg ? warm_arg : (!agent_arg && !tasks_arg) ? warm_default : NULL;
    char warm_abs[PATH_MAX];
    if (warm_start && *warm_start) {
        if (!realpath(warm_start, warm_abs))
            return al_cli_usage_error("up", "--warm-start %s: %s", warm_start, strerror(errno));
        warm_start = warm_abs;
    }

    /* The work directory holds the model, the checkpoints and the proxy's spool. */
    char workdir[PATH_MAX];
    if (workdir_arg) {
        if (up_mkdirs(workdir_arg) < 0 || !realpath(workdir_arg, workdir)) {
            al_log_error(COMP, "--workdir %s: %s", workdir_arg, strerror(errno));
            return AL_EXIT_FAILURE;
        }
    } else {
        const char *tmp = getenv("TMPDIR");
        snprintf(workdir, sizeof workdir, "%s/arclight-up.XXXXXX", tmp && *tmp ? tmp : "/tmp");
        if (!mkdtemp(workdir)) {
            al_log_error(COMP, "cannot create a work directory %s: %s", workdir, strerror(errno));
            return AL_EXIT_FAILURE;
        }
    }

    up_state *st = calloc(1, sizeof *st);
    if (!st) return AL_EXIT_FAILURE;
    ssize_t n = readlink("/proc/self/exe", st->self_exe, sizeof st->self_exe - 1);
    if (n <= 0) {
        al_log_error(COMP, "cannot find the arclight binary (/proc/self/exe): %s", strerror(errno));
        free(st);
        return AL_EXIT_FAILURE;
    }
    st->self_exe[n] = '\0';

    if (pipe2(up_sigpipe, O_CLOEXEC | O_NONBLOCK) < 0) {
        al_log_error(COMP, "pipe: %s", strerror(errno));
        free(st);
        return AL_EXIT_FAILURE;
    }
    struct sigaction sa, old_int, old_term, old_chld;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = up_on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGINT, &sa, &old_int);
    sigaction(SIGTERM, &sa, &old_term);
    sigaction(SIGCHLD, &sa, &old_chld);
    /* One core per child unless told otherwise: the loop's processes share the machine. */
    setenv("OMP_NUM_THREADS", getenv("OMP_NUM_THREADS") ? getenv("OMP_NUM_THREADS") : "1", 1);

    int rc = AL_EXIT_FAILURE, done_ok = 0;
    char bootstrap[512], serve_url[300], proxy_url[300], name[2 * PATH_MAX], buf[96];
    char steps_s[32], gs_s[32], sg_s[32], seq_s[32], mt_s[32], seed_s[32], ckpt_dir[PATH_MAX + 8];
    char spool_dir[PATH_MAX + 8];
    snprintf(steps_s, sizeof steps_s, "%ld", steps);
    snprintf(gs_s, sizeof gs_s, "%ld", group_size);
    snprintf(sg_s, sizeof sg_s, "%ld", step_groups);
    /* A step closes one sequence past K-1 groups: a group cut short (a rollout dead-lettered)
     * must not leave a round one sequence short of its step. */
    snprintf(seq_s, sizeof seq_s, "%ld", group_size * (step_groups - 1) + 1);
    snprintf(mt_s, sizeof mt_s, "%ld", max_tokens);
    snprintf(seed_s, sizeof seed_s, "%ld", seed);
    snprintf(ckpt_dir, sizeof ckpt_dir, "%s/ckpt", workdir);
    snprintf(spool_dir, sizeof spool_dir, "%s/spool", workdir);
    al_log_info(COMP, "work directory %s", workdir);

    /* 1. The broker (unless --bootstrap names a cluster). */
    if (bootstrap_given) {
        snprintf(bootstrap, sizeof bootstrap, "%s", common.bootstrap);
    } else {
        char *a[] = {NULL, "broker", "--listen", (char *)listen_broker, NULL};
        up_child *k = up_spawn(st, "broker", a, NULL);
        if (!k || up_wait_first_line(st, k, 60) < 0) goto out;
        snprintf(bootstrap, sizeof bootstrap, "%s", k->first_line);
        /* The embedded broker answers a fetch that finds nothing only when fetch.wait.max.ms
         * runs out, even if data arrives meanwhile (a real broker answers at once). With the
         * default 500 ms every hop of the loop (spans, transitions, steps, policy versions)
         * waited up to that long: 1.5 s per policy version of the demo instead of 0.5 s.
         * The stages' consumers poll it every 20 ms instead, unless the user set it. */
        setenv("ARCLIGHT_KAFKA_FETCH_WAIT_MAX_MS", "20", 0);
    }

    /* 2. The model: a random tiny one unless --model. */
    if (!model_arg) {
        const char *base = strrchr(config_path, '/');
        base = base ? base + 1 : config_path;
        snprintf(name, sizeof name, "%.*s", (int)strcspn(base, "."), base);
        if (!strncmp(name, "tiny-", 5) || !*name) snprintf(name, sizeof name, "tiny");
        snprintf(model_dir, sizeof model_dir, "%s/%.255s", workdir, name);
        if (!up_exists(model_dir, "model.safetensors")) {
            char *a[] = {NULL,    "model",   "init",   "--config", config_path,
                         "--out", model_dir, "--seed", seed_s,     NULL};
            up_child *k = up_spawn(st, "model", a, NULL);
            if (!k || up_run_to_end(st, k) < 0) goto out;
        }
    } else {
        const char *base = strrchr(model_dir, '/');
        snprintf(name, sizeof name, "%s", base ? base + 1 : model_dir);
    }
    /* 2b. The warm start: supervised steps from a file before RL begins (the demo's own by
     * default), into WORKDIR/NAME-sft, which then is the policy's start and the trainer's
     * reference. A work directory that has it already keeps it. */
    if (warm_start && *warm_start) {
        char sft_dir[sizeof model_dir], steps_w[32], batch_w[16];
        snprintf(batch_w, sizeof batch_w, "%d", UP_WARM_BATCH);
        snprintf(sft_dir, sizeof sft_dir, "%.3800s/%.255s-sft", workdir, name);
        if (!up_exists(sft_dir, "model.safetensors")) {
            /* Two passes by default: a tiny model that sees a few hundred conversations many
             * times learns them by heart instead of the skill they share (the tool agents'
             * warm starts, docs/LEARNING.md), so bigger files get more steps, not more
             * passes, up to a few minutes' worth; sft.jsonl's 512 keep the 160 they were
             * tuned with, the tool agents' 4,112 get 500. */
            if (!warm_steps) {
                long lines = al_file_count_lines(warm_start);
                warm_steps = (2 * lines + UP_WARM_BATCH - 1) / UP_WARM_BATCH;
                if (warm_steps > UP_WARM_MAX_STEPS) warm_steps = UP_WARM_MAX_STEPS;
                if (warm_steps < UP_WARM_MIN_STEPS) warm_steps = UP_WARM_MIN_STEPS;
                al_log_info(COMP, "warm start: %ld conversations in %s, %ld steps of %d", lines,
                            warm_start, warm_steps, UP_WARM_BATCH);
            }
            snprintf(steps_w, sizeof steps_w, "%ld", warm_steps);
            char *a[] = {NULL,        "model",    "sft",   "--model",    model_dir,
                         "--tokenizer", tokenizer_dir, "--data", (char *)warm_start, "--out",
                         sft_dir,     "--steps",  steps_w, "--lr",       (char *)warm_lr,
                         "--batch",   batch_w,    NULL};
            up_child *k = up_spawn(st, "model", a, NULL);
            if (!k || up_run_to_end(st, k) < 0) goto out;
        }
        snprintf(model_dir, sizeof model_dir, "%s", sft_dir);
    }
    up_argv args;
#define UP_START(kname, ...)                                                                       \
    (up_argv_set(&args, __VA_ARGS__, (char *)NULL),                                                \
     up_argv_common(&args, bootstrap, &common, stage_args[UP_STAGE_##kname]),                      \
     up_spawn(st, #kname, args.v, NULL))

    /* 3. serve, following arclight.policy for this model. A work directory from an earlier
     * run: on a cluster that kept its topics (--bootstrap), train resumes from its newest
     * full checkpoint and serve starts from it. The embedded broker starts empty, so batch
     * numbers its steps from 0 again and a resumed trainer would skip them as done: there the
     * earlier checkpoints move to ckpt.N/ and the new run starts from their newest weights,
     * with versions counted from 1 again. */
    long resume_version = up_newest_checkpoint(ckpt_dir);
    char init_model[sizeof model_dir + 64], serve_version[32];
    snprintf(init_model, sizeof init_model, "%s", model_dir);
    snprintf(serve_version, sizeof serve_version, "0");
    if (resume_version >= 0 && bootstrap_given) {
        snprintf(serve_version, sizeof serve_version, "%ld", resume_version);
    } else if (resume_version >= 0) {
        char moved[sizeof ckpt_dir + 32];
        for (int i = 1;; i++) {
            snprintf(moved, sizeof moved, "%s.%d", ckpt_dir, i);
            if (access(moved, F_OK) != 0) break;
        }
        if (rename(ckpt_dir, moved) < 0) {
            al_log_error(COMP, "cannot move %s aside: %s", ckpt_dir, strerror(errno));
            goto out;
        }
        snprintf(init_model, sizeof init_model, "%s/step-%ld", moved, resume_version);
        al_log_info(COMP, "starting from %s (version %ld of the earlier run)", init_model,
                    resume_version);
        resume_version = -1;
    }
    char serve_model[sizeof init_model + 64];
    if (resume_version >= 0)
        snprintf(serve_model, sizeof serve_model, "%s/step-%ld", ckpt_dir, resume_version);
    else
        snprintf(serve_model, sizeof serve_model, "%s", init_model);
    {
        up_child *k =
            UP_START(serve, "serve", "--model", serve_model, "--tokenizer", tokenizer_dir,
                     "--listen", listen_serve, "--served-model-name", name, "--policy-version",
                     serve_version, "--follow-policy", "--threads", "1");
        if (!k || up_wait_first_line(st, k, 120) < 0) goto out;
        const char *addr = k->first_line;
        snprintf(serve_url, sizeof serve_url, "%s%s", strstr(addr, "://") ? "" : "http://", addr);
    }
    /* 4. proxy in front of it. */
    {
        up_child *k = UP_START(proxy, "proxy", "--listen", listen_proxy, "--upstream", serve_url,
                               "--upstream-kind", "arclight", "--spool-dir", spool_dir,
                               "--drain-timeout", "5", "--no-access-log");
        if (!k || up_wait_first_line(st, k, 60) < 0) goto out;
        const char *addr = k->first_line;
        snprintf(proxy_url, sizeof proxy_url, "%s%s", strstr(addr, "://") ? "" : "http://", addr);
    }
    /* 5. credit, batch, train. */
    {
        /* Discounted credit (gamma 1): each call's return is the rewards from it to the end,
         * each call position normalised over the group. With one reward at the end it gives
         * every call that reward, as identical credit does; with a reward after each call
         * (the letters demo) a call is no longer credited with a later call's mistake, which
         * under identical credit collapsed the demo's second call onto the first one's
         * answer (docs/LEARNING.md). */
        if (!UP_START(credit, "credit", "--group-size", gs_s, "--estimator", "grpo", "--credit",
                      "discounted", "--gamma", "1", "--idle-timeout", "120", "--quiet-flush", "5"))
            goto out;
        /* With the controller a step is --step-groups groups, whatever number of calls
         * their rollouts make: what the controller paces on. */
        const char *ba = stage_args[UP_STAGE_batch];
        int own_target = !(ba && strstr(ba, "--step-")); /* the user's wins */
        if (!UP_START(batch, "batch", "--group-idle-ms", "200", "--max-staleness", "2",
                      !own_target ? NULL
                      : controlled ? "--step-groups"
                                   : "--step-sequences",
                      controlled ? sg_s : seq_s))
            goto out;
        up_argv_set(&args, "train", "--model", init_model, "--out", ckpt_dir, "--model-name", name,
                    "--lr", lr, "--keep", "3", (char *)NULL);
        /* A KL penalty to the starting model (the warm start: train's --model is its
         * reference) keeps the policy near what the warm start taught (the second call's
         * copying) while RL sharpens the first call: the letters demo's hardest seed went
         * from 0.54-0.87 at version 40 without it to 0.79-0.94 with it (docs/LEARNING.md). */
        const char *kl = kl_arg ? kl_arg : (warm_start && *warm_start) ? "0.05" : NULL;
        if (kl && strtod(kl, NULL) > 0) up_argv_set(&args, "+", "--kl-beta", kl, (char *)NULL);
        /* the controller stops the run once version N is evaluated: train goes on until then */
        if (steps && !controlled) up_argv_set(&args, "+", "--steps", steps_s, (char *)NULL);
        if (resume_version >= 0) up_argv_set(&args, "+", "--resume", (char *)NULL);
        up_argv_common(&args, bootstrap, &common, stage_args[UP_STAGE_train]);
        if (!up_spawn(st, "train", args.v, NULL)) goto out;
    }

    fprintf(stdout,
            "up    | broker     %s%s\n"
            "up    | serve      %s  (model %s: %s)\n"
            "up    | proxy      %s  (agents: OPENAI_BASE_URL=%s/v1)\n"
            "up    | train      checkpoints in %s\n",
            bootstrap, bootstrap_given ? "" : "  (embedded)", serve_url, name, model_dir, proxy_url,
            proxy_url, ckpt_dir);
    fflush(stdout);

    /* 6. The agent, last: everything it talks to is up. */
    if (*agent_cmd) {
        static char env_base[400], env_key[64], env_proxy[400], env_gs[64], env_sg[64],
            env_model[2 * PATH_MAX + 32], env_mt[64];
        snprintf(env_base, sizeof env_base, "OPENAI_BASE_URL=%s/v1", proxy_url);
        snprintf(env_key, sizeof env_key, "OPENAI_API_KEY=%s",
                 getenv("OPENAI_API_KEY") ? "unused-by-arclight" : "arclight");
        snprintf(env_proxy, sizeof env_proxy, "ARCLIGHT_PROXY_URL=%s", proxy_url);
        snprintf(env_gs, sizeof env_gs, "ARCLIGHT_GROUP_SIZE=%ld", group_size);
        snprintf(env_sg, sizeof env_sg, "ARCLIGHT_STEP_GROUPS=%ld", step_groups);
        snprintf(env_model, sizeof env_model, "ARCLIGHT_MODEL=%s", name);
        snprintf(env_mt, sizeof env_mt, "ARCLIGHT_MAX_TOKENS=%ld", max_tokens);
        char *env[] = {env_base, env_key, env_proxy, env_gs, env_sg, env_model, env_mt, NULL};
        if (controlled) {
            /* each rollout's child gets its own OPENAI_BASE_URL from the controller */
            up_argv_set(&args, "rollouts", "--tasks", tasks, "--agent", agent_cmd, "--proxy",
                        proxy_url, "--model", name, "--group-size", gs_s, "--step-groups", sg_s,
                        "--workdir", workdir, (char *)NULL);
            if (steps) up_argv_set(&args, "+", "--steps", steps_s, (char *)NULL);
            up_argv_common(&args, bootstrap, &common, stage_args[UP_STAGE_rollouts]);
            if (!up_spawn(st, "rollouts", args.v, env + 1)) goto out;
        } else {
            char *a[] = {"/bin/sh", "-c", (char *)agent_cmd, NULL};
            if (!up_spawn(st, "agent", a, env)) goto out;
        }
    }
    al_log_info(COMP, "running%s; Ctrl-C stops everything", steps ? "" : " until stopped");
    if (steps) al_log_info(COMP, "stopping after policy version %ld", steps);

    /* 7. Supervise. */
    for (;;) {
        up_pump(st, 500);
        if (st->stop_requested) {
            al_log_info(COMP, "%s: stopping", strsignal(st->stop_signal));
            rc = AL_EXIT_OK;
            done_ok = 1;
            break;
        }
        up_child *gone = NULL;
        for (int i = 0; i < st->nkids && !gone; i++)
            if (!st->kids[i].running && strcmp(st->kids[i].name, "model") != 0) gone = &st->kids[i];
        if (!gone) continue;
        int exit0 = WIFEXITED(gone->status) && WEXITSTATUS(gone->status) == 0;
        if (exit0 && steps && !strcmp(gone->name, "train")) {
            al_log_info(COMP, "policy version %ld published: done", steps);
            rc = AL_EXIT_OK;
        } else if (exit0 && !strcmp(gone->name, "rollouts")) {
            al_log_info(COMP, "the rollout controller finished: done");
            rc = AL_EXIT_OK;
        } else if (exit0 && !strcmp(gone->name, "agent")) {
            al_log_info(COMP, "the agent finished: done");
            rc = AL_EXIT_OK;
        } else {
            al_log_error(COMP, "%s (pid %d) %s; stopping the rest", gone->name, (int)gone->pid,
                         up_describe(gone, buf, sizeof buf));
            rc = AL_EXIT_FAILURE;
        }
        done_ok = rc == AL_EXIT_OK;
        break;
    }

out:
    if (!done_ok && st->stop_requested) { /* Ctrl-C while starting: a clean stop too */
        al_log_info(COMP, "%s: stopping", strsignal(st->stop_signal));
        rc = AL_EXIT_OK, done_ok = 1;
    }
    up_stop_all(st, (int)stop_timeout);
    for (int i = 0; i < st->nkids; i++) {
        up_child *k = &st->kids[i];
        if (!done_ok || !strcmp(k->name, "model")) continue;
        /* After a clean stop, say who did not stop cleanly (SIGKILL, crash, error). */
        int clean = (WIFEXITED(k->status) &&
                     (WEXITSTATUS(k->status) == 0 || WEXITSTATUS(k->status) == 130 ||
                      WEXITSTATUS(k->status) == 143)) ||
                    (WIFSIGNALED(k->status) &&
                     (WTERMSIG(k->status) == SIGTERM || WTERMSIG(k->status) == SIGINT));
        if (!clean)
            al_log_warn(COMP, "%s %s while stopping", k->name, up_describe(k, buf, sizeof buf));
    }
    al_log_info(COMP, "all stopped; exit %d (work directory %s)", rc, workdir);
    sigaction(SIGINT, &old_int, NULL);
    sigaction(SIGTERM, &old_term, NULL);
    sigaction(SIGCHLD, &old_chld, NULL);
    close(up_sigpipe[0]), close(up_sigpipe[1]);
    up_sigpipe[0] = up_sigpipe[1] = -1;
    free(st);
    return rc;
}
