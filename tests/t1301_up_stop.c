/*
 * t1301: how `arclight up` ends. Bad flags exit 2 with the reason; a child killed with
 * SIGKILL makes up name it, stop the rest and exit 1; SIGTERM to up stops every child and
 * exits 0. Each time, no child of up is left running.
 */
#include "t1349_up_common.h"
#include "testlib.h"
#include "support.h"

static const char *children[] = {"broker", "serve", "proxy", "credit", "batch", "train", "agent"};

static int run_usage(char *const extra[], char *err_out, size_t errlen)
{
    char *argv[16] = {(char *)up_bin(), "up"};
    int n = 2;
    for (int i = 0; extra[i] && n < 15; i++)
        argv[n++] = extra[i];
    argv[n] = NULL;
    char out[96], err[96]; /* per process: suites of several checkouts may run at once */
    snprintf(out, sizeof out, "/tmp/arclight-t1301-usage-%d.out", (int)getpid());
    snprintf(err, sizeof err, "/tmp/arclight-t1301-usage-%d.err", (int)getpid());
    int st = up_wait(up_start(argv, out, err), 30);
    char *e = al_test_slurp_text(err);
    snprintf(err_out, errlen, "%s", e);
    free(e);
    unlink(out), unlink(err);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

TEST(up_usage)
{
    char e[4096];
    char *steps0[] = {"--steps", "0", NULL};
    CHECK_EQ_INT(run_usage(steps0, e, sizeof e), 2);
    CHECKF(strstr(e, "--steps wants an integer"), "%s", e);
    char *bogus[] = {"--bogus", NULL};
    CHECK_EQ_INT(run_usage(bogus, e, sizeof e), 2);
    char *listen[] = {"--listen-proxy", "nowhere", NULL};
    CHECK_EQ_INT(run_usage(listen, e, sizeof e), 2);
    CHECKF(strstr(e, "--listen-proxy wants HOST:PORT"), "%s", e);
    char *model[] = {"--model", "/nonexistent/model", NULL};
    CHECK_EQ_INT(run_usage(model, e, sizeof e), 2);
    CHECKF(strstr(e, "no config.json"), "%s", e);
    char *extra[] = {"stray", NULL};
    CHECK_EQ_INT(run_usage(extra, e, sizeof e), 2);
    char *metrics[] = {"--metrics", "127.0.0.1:0", NULL};
    CHECK_EQ_INT(run_usage(metrics, e, sizeof e), 2);
    char *help[] = {"--help", NULL};
    CHECK_EQ_INT(run_usage(help, e, sizeof e), 0);
}

/* Starts up (embedded broker, demo agent) in dir and waits until the agent has finished a
 * round through the whole loop. Returns up's pid, or -1 (with a failure recorded). */
static pid_t start_loop(const char *dir, char *out, char *err, size_t len)
{
    char wd[512];
    snprintf(out, len, "%s/up.out", dir);
    snprintf(err, len, "%s/up.err", dir);
    snprintf(wd, sizeof wd, "%s/work", dir);
    char *argv[] = {(char *)up_bin(),
                    "up",
                    "--workdir",
                    wd,
                    "--listen-broker",
                    "127.0.0.1:0",
                    "--listen-serve",
                    "127.0.0.1:0",
                    "--listen-proxy",
                    "127.0.0.1:0",
                    "--group-size",
                    "2",
                    "--step-groups",
                    "1",
                    "--max-tokens",
                    "4",
                    "--stop-timeout",
                    "15",
                    "--agent",
                    "node examples/demo-agent/agent.js",
                    NULL};
    pid_t up = up_start(argv, out, err);
    if (!up_wait_for_text(out, "demo-agent: policy v0: mean reward", 120, up)) {
        char *o = al_test_slurp_text(out), *e = al_test_slurp_text(err);
        CHECKF(0, "the loop did not run a round\n--- stdout\n%s\n--- stderr\n%s", o, e);
        free(o), free(e);
        kill(up, SIGKILL);
        up_wait(up, 10);
        return -1;
    }
    return up;
}

TEST(up_child_killed_stops_the_rest)
{
    char dir[512], out[600], err[600];
    REQUIRE(al_test_tmpdir(dir, sizeof dir, "t1301"));
    pid_t up = start_loop(dir, out, err, sizeof out);
    REQUIRE(up > 0);
    char *e = al_test_slurp_text(err);
    pid_t credit = up_child_pid(e, "credit");
    free(e);
    REQUIRE(credit > 0);
    REQUIRE(kill(credit, SIGKILL) == 0);
    int st = up_wait(up, 90);
    e = al_test_slurp_text(err);
    CHECKF(WIFEXITED(st) && WEXITSTATUS(st) == 1, "up: wait status %d\n%s", st, e);
    char want[96];
    snprintf(want, sizeof want, "up: credit (pid %d) was killed by signal 9", (int)credit);
    CHECKF(strstr(e, want), "no '%s' in\n%s", want, e);
    for (size_t i = 0; i < sizeof children / sizeof children[0]; i++) {
        pid_t p = up_child_pid(e, children[i]);
        CHECKF(p > 0 && up_pid_gone(p), "%s (pid %d) left behind", children[i], (int)p);
    }
    free(e);
    if (!testlib_cur_failed && al_test_rmtree(dir) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
}

TEST(up_sigterm_stops_everything)
{
    char dir[512], out[600], err[600];
    REQUIRE(al_test_tmpdir(dir, sizeof dir, "t1301"));
    pid_t up = start_loop(dir, out, err, sizeof out);
    REQUIRE(up > 0);
    REQUIRE(kill(up, SIGTERM) == 0);
    int st = up_wait(up, 90);
    char *e = al_test_slurp_text(err);
    CHECKF(WIFEXITED(st) && WEXITSTATUS(st) == 0, "up: wait status %d\n%s", st, e);
    CHECKF(strstr(e, "up: Terminated: stopping"), "%s", e);
    CHECKF(strstr(e, "proxy: signal 15"), "the proxy was not asked to drain:\n%s", e);
    CHECKF(!strstr(e, "while stopping"), "a child did not stop cleanly:\n%s", e);
    /* The broker stops last: the proxy's drain and the trainer's stop still reach it. */
    const char *proxy_bye = strstr(e, "proxy: every span published");
    const char *started_broker = strstr(e, "started broker");
    CHECK(proxy_bye && started_broker);
    for (size_t i = 0; i < sizeof children / sizeof children[0]; i++) {
        pid_t p = up_child_pid(e, children[i]);
        CHECKF(p > 0 && up_pid_gone(p), "%s (pid %d) left behind", children[i], (int)p);
    }
    free(e);
    if (!testlib_cur_failed && al_test_rmtree(dir) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
}
