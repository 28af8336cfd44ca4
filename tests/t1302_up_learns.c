/*
 * t1302: the demo learns. `arclight up --steps 16` with the demo agent (reward: the share of
 * 'a' in the answer) on the tiny random model; the per-version mean rewards the agent prints
 * must go up: the last three rounds' mean beats the first three's by a clear margin. A
 * loop where any stage loses the signal (rewards, advantages, the update, the weight swap)
 * stays near the random model's ~0.03.
 */
#include "t1349_up_common.h"
#include "testlib.h"
#include "support.h"

TEST(up_demo_reward_goes_up)
{
    char dir[512], out[600], err[600], wd[600];
    REQUIRE(al_test_tmpdir(dir, sizeof dir, "t1302"));
    snprintf(out, sizeof out, "%s/up.out", dir);
    snprintf(err, sizeof err, "%s/up.err", dir);
    snprintf(wd, sizeof wd, "%s/work", dir);
    double t0 = testlib_now();
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
                    "--steps",
                    "16",
                    "--group-size",
                    "4",
                    "--step-groups",
                    "4",
                    "--lr",
                    "2e-2",
                    "--max-tokens",
                    "8",
                    "--seed",
                    "3",
                    "--agent",
                    "node examples/demo-agent/agent.js",
                    NULL};
    pid_t up = up_start(argv, out, err);
    int st = up_wait(up, 200);
    char *o = al_test_slurp_text(out), *e = al_test_slurp_text(err);
    CHECKF(st == 0, "up: wait status %d\n--- stdout\n%s\n--- stderr\n%.4000s", st, o, e);

    double r[64];
    int n = 0;
    for (const char *p = o; (p = strstr(p, "mean reward ")) && n < 64; p++)
        r[n++] = atof(p + strlen("mean reward "));
    REQUIREF(n >= 8, "only %d rounds:\n%s", n, o);
    double first = (r[0] + r[1] + r[2]) / 3, last = (r[n - 1] + r[n - 2] + r[n - 3]) / 3;
    fprintf(stderr, "%d rounds in %.1f s: mean reward %.3f (first 3) -> %.3f (last 3)\n", n,
            testlib_now() - t0, first, last);
    CHECKF(last > first + 0.15, "no learning: %.3f -> %.3f\n%s", first, last, o);
    free(o), free(e);
    if (!testlib_cur_failed && al_test_rmtree(dir) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
}
