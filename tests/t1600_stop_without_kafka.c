/*
 * 1600: every long-running stage stops within its --drain-timeout whether or not Kafka
 * answers (issue 15, item 20), so that a pod's termination or `arclight up`'s Ctrl-C never
 * needs SIGKILL. Each of credit, batch, train, serve and proxy runs against an embedded broker
 * of its own until it has joined (its partitions assigned, or its address printed); then the
 * broker is frozen (SIGSTOP: connections stay open and nothing answers, as with a partitioned
 * network) or killed, the stage gets SIGTERM, and the test measures how long it takes to exit.
 * With the broker frozen, a consumer close used to wait 5-7 s for its LeaveGroup request (and a
 * flush or a synchronous commit up to 30-60 s more).
 */
#include "testlib.h"
#include "support.h"
#include "broker_fixture.h"

#include <fcntl.h>
#include <stdarg.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define DRAIN "2"
#define DRAIN_S 2.0
/* the drain timeout, plus what two shared cores under a sanitizer need to exit a process */
#define LIMIT_S (DRAIN_S + 2.5)

static char g_dir[128], g_topics[256], g_model[256];

static int sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int sh(const char *fmt, ...)
{
    char cmd[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    return system(cmd) == 0 ? 0 : -1;
}

/* Starts argv with stderr to log and stdout to out (both files). */
static pid_t spawn(const char *const *argv, const char *out, const char *log)
{
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid != 0) return pid;
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    int o = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0644), l = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (o >= 0) dup2(o, 1);
    if (l >= 0) dup2(l, 2);
    execv(argv[0], (char *const *)argv);
    _exit(127);
}

static int file_has(const char *path, const char *needle)
{
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    char line[4096];
    int found = 0;
    while (!found && fgets(line, sizeof line, f))
        found = strstr(line, needle) != NULL;
    fclose(f);
    return found;
}

static int wait_for(const char *path, const char *needle, double secs)
{
    double t0 = testlib_now();
    while (testlib_now() - t0 < secs) {
        if (file_has(path, needle)) return 0;
        usleep(50000);
    }
    return -1;
}

/* SIGTERM, then the seconds until pid exits (-1 past 60 s: then SIGKILLed); *status its exit
 * code (-1 when killed). */
static double stop_time(pid_t pid, int *status)
{
    double t0 = testlib_now();
    kill(pid, SIGTERM);
    int st = 0;
    while (waitpid(pid, &st, WNOHANG) != pid) {
        if (testlib_now() - t0 > 60) {
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
            *status = -1;
            return -1;
        }
        usleep(20000);
    }
    *status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    if (WIFSIGNALED(st)) fprintf(stderr, "  (pid %d killed by signal %d)\n", (int)pid, WTERMSIG(st));
    return testlib_now() - t0;
}

typedef struct stage_case {
    const char *name;
    const char *ready; /* in its stderr (NULL: its first stdout line) once it has joined */
} stage_case;

static void run_case(const stage_case *sc, int kill_broker)
{
    al_test_broker b;
    const char *bargs[] = {"--topics", g_topics, NULL};
    if (al_test_broker_start(&b, bargs) != 0) {
        CHECKF(0, "%s: no broker", sc->name);
        return;
    }
    char out[300], log[300], ckpt[300], spool[300];
    /* One stdout file per case: the child truncates it only once it runs, so a file shared
     * with the frozen case could show that case's ready line before this child is up and
     * has its SIGTERM handler (it then died of the signal). */
    snprintf(out, sizeof out, "%s/%s-%d.out", g_dir, sc->name, kill_broker);
    snprintf(log, sizeof log, "%s/%s-%d.log", g_dir, sc->name, kill_broker);
    snprintf(ckpt, sizeof ckpt, "%s/ckpt-%s-%d", g_dir, sc->name, kill_broker);
    snprintf(spool, sizeof spool, "%s/spool-%s-%d", g_dir, sc->name, kill_broker);
    const char *bin = al_test_bin();
    const char *argv[32] = {bin, sc->name, "--bootstrap", b.bootstrap, "--drain-timeout", DRAIN};
    int n = 6;
    if (!strcmp(sc->name, "train")) {
        argv[n++] = "--model", argv[n++] = g_model, argv[n++] = "--out", argv[n++] = ckpt;
    } else if (!strcmp(sc->name, "serve")) {
        argv[n++] = "--model", argv[n++] = g_model, argv[n++] = "--follow-policy";
        argv[n++] = "--listen", argv[n++] = "127.0.0.1:0";
    } else if (!strcmp(sc->name, "proxy")) {
        argv[n++] = "--listen", argv[n++] = "127.0.0.1:0", argv[n++] = "--upstream";
        argv[n++] = "http://127.0.0.1:9", argv[n++] = "--spool-dir", argv[n++] = spool;
    }
    argv[n] = NULL;
    pid_t pid = spawn(argv, out, log);
    int ready = sc->ready ? wait_for(log, sc->ready, 60) : wait_for(out, ":", 60);
    CHECKF(ready == 0, "%s never got ready (its log: %s)", sc->name, log);
    usleep(300000);
    if (kill_broker)
        kill(b.pid, SIGKILL);
    else
        kill(b.pid, SIGSTOP);
    usleep(500000);
    int status;
    double dt = stop_time(pid, &status);
    printf("  %-6s broker %s: stopped in %.2f s, exit %d\n", sc->name,
           kill_broker ? "killed" : "frozen", dt, status);
    CHECKF(dt >= 0 && dt < LIMIT_S, "%s (broker %s) took %.2f s to stop with --drain-timeout %s",
           sc->name, kill_broker ? "killed" : "frozen", dt, DRAIN);
    CHECKF(status == 0, "%s (broker %s) exited with %d", sc->name,
           kill_broker ? "killed" : "frozen", status);
    if (status != 0 || !(dt >= 0 && dt < LIMIT_S)) {
        char cmd[400];
        snprintf(cmd, sizeof cmd, "grep -v rdkafka %s | tail -n 8 >&2", log);
        if (system(cmd) != 0) fprintf(stderr, "  (no log)\n");
    }
    if (!kill_broker) kill(b.pid, SIGCONT);
    al_test_broker_stop(&b);
}

static const stage_case g_cases[] = {
    {"credit", "assigned "},
    {"batch", "assigned "},
    {"train", "assigned "},
    {"serve", NULL},
    {"proxy", NULL},
};

TEST(setup)
{
    REQUIRE(al_test_tmpdir(g_dir, sizeof g_dir, "t1600"));
    snprintf(g_topics, sizeof g_topics, "%s/topics.conf", g_dir);
    FILE *f = fopen(g_topics, "w");
    REQUIRE(f);
    fputs("arclight.spans 2 1\narclight.transitions 2 1\narclight.batches 1 1\n"
          "arclight.policy 1 1\narclight.deadletter 1 1\n",
          f);
    fclose(f);
    snprintf(g_model, sizeof g_model, "%s/tiny", g_dir);
    REQUIRE(sh("%s model init --config tests/model/tiny-qwen2.json --out %s --seed 1 >/dev/null",
               al_test_bin(), g_model) == 0);
    REQUIRE(sh("cp tests/tokenizer/tiny/tokenizer.json tests/tokenizer/tiny/tokenizer_config.json "
               "%s/",
               g_model) == 0);
}

TEST(each_stage_stops_within_its_drain_timeout_with_the_broker_frozen)
{
    for (size_t i = 0; i < sizeof g_cases / sizeof g_cases[0]; i++)
        run_case(&g_cases[i], 0);
}

TEST(each_stage_stops_within_its_drain_timeout_with_the_broker_killed)
{
    for (size_t i = 0; i < sizeof g_cases / sizeof g_cases[0]; i++)
        run_case(&g_cases[i], 1);
}

TEST(teardown)
{
    if (g_dir[0]) al_test_rmtree(g_dir);
}
