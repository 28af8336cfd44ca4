/*
 * t1348_up_learn.h: the learning check of t1303 and t1304: `arclight up --steps 40` over the
 * letters demo, then the val tasks' rewards at the first and the last evaluation
 * (WORKDIR/eval.jsonl): a one-sided sign test over the tasks whose reward changed must
 * reject "no improvement" at p < 0.01 (exact binomial tail), and the mean val reward must
 * rise by at least min_gain. Header-only; include after testlib.h and support.h.
 */
#ifndef ARCLIGHT_T1348_UP_LEARN_H
#define ARCLIGHT_T1348_UP_LEARN_H

#include "t1349_up_common.h"

#include <jansson.h>
#include <math.h>

/* P(X >= k) for X ~ Binomial(n, 1/2). */
static double sign_test_p(int k, int n)
{
    double p = 0, c = 1; /* C(n, 0) */
    for (int i = 0; i <= n; i++) {
        if (i >= k) p += c;
        c = c * (n - i) / (i + 1);
    }
    return p / pow(2, n);
}

typedef struct eval_row {
    char task[128];
    long version;
    double reward;
} eval_row;

/* Runs up to version 40 with its defaults, or with `node SRC/agent` (a path under the
 * source tree, with its arguments) over the demo's tasks and warm start, and checks the
 * held-out reward as the top of this file says. */
static void up_learn_check(const char *tag, const char *agent, double min_gain)
{
    char dir[512], out[600], err[600], wd[600], path[700];
    REQUIRE(al_test_tmpdir(dir, sizeof dir, tag));
    snprintf(out, sizeof out, "%s/up.out", dir);
    snprintf(err, sizeof err, "%s/up.err", dir);
    snprintf(wd, sizeof wd, "%s/work", dir);
    double t0 = testlib_now();
    char *argv[] = {(char *)up_bin(),   "up",           "--workdir",     wd,
                    "--listen-broker",  "127.0.0.1:0",  "--listen-serve", "127.0.0.1:0",
                    "--listen-proxy",   "127.0.0.1:0",  "--steps",       "40",
                    "--rollouts-args",  "--eval-every 40 --quiet-agents",
                    NULL, NULL, NULL, NULL, NULL, NULL, NULL};
    /* another agent over the demo's tasks and warm start (up's defaults only come with its
     * own agent) */
    const char *src = getenv("ARCLIGHT_SOURCE_DIR") ? getenv("ARCLIGHT_SOURCE_DIR") : ".";
    char cmd[1200], tasks[1100], warm[1100];
    snprintf(cmd, sizeof cmd, "node %s/%s", src, agent ? agent : ""); /* no spaces in src */
    snprintf(tasks, sizeof tasks, "%s/examples/letters/tasks.jsonl", src);
    snprintf(warm, sizeof warm, "%s/examples/letters/sft.jsonl", src);
    if (agent) {
        char *more[] = {"--agent", cmd, "--tasks", tasks, "--warm-start", warm};
        memcpy(&argv[14], more, sizeof more);
    }
    pid_t up = up_start(argv, out, err);
    int st = up_wait(up, 1500);
    double took = testlib_now() - t0;
    char *o = al_test_slurp_text(out), *e = al_test_slurp_text(err);
    REQUIREF(st == 0, "up: wait status %d after %.0f s\n--- stdout\n%s\n--- stderr\n%.6000s", st,
             took, o, e);
    CHECKF(strstr(e, "the rollout controller finished: done"), "%.4000s", e);
    CHECKF(strstr(o, "sft: wrote"), "no warm start:\n%.4000s", o);

    snprintf(path, sizeof path, "%s/eval.jsonl", wd);
    char *ev = al_test_slurp_text(path);
    REQUIREF(ev, "no %s", path);
    eval_row rows[512];
    int n = 0;
    long vmin = -1, vmax = -1;
    for (char *line = strtok(ev, "\n"); line && n < 512; line = strtok(NULL, "\n")) {
        json_error_t je;
        json_t *j = json_loads(line, 0, &je);
        REQUIREF(j, "eval.jsonl: %s: %s", je.text, line);
        snprintf(rows[n].task, sizeof rows[n].task, "%s",
                 json_string_value(json_object_get(j, "task")));
        rows[n].version = (long)json_integer_value(json_object_get(j, "version"));
        rows[n].reward = json_number_value(json_object_get(j, "reward"));
        CHECK(!strcmp(json_string_value(json_object_get(j, "status")), "succeeded"));
        if (vmin < 0 || rows[n].version < vmin) vmin = rows[n].version;
        if (rows[n].version > vmax) vmax = rows[n].version;
        json_decref(j);
        n++;
    }
    free(ev);
    REQUIREF(vmin == 0 && vmax >= 40, "evaluations from v%ld to v%ld", vmin, vmax);
    int up_n = 0, down_n = 0, pairs = 0;
    double before = 0, after = 0;
    for (int i = 0; i < n; i++) {
        if (rows[i].version != vmin) continue;
        for (int k = 0; k < n; k++) {
            if (rows[k].version != vmax || strcmp(rows[k].task, rows[i].task)) continue;
            pairs++;
            before += rows[i].reward;
            after += rows[k].reward;
            if (rows[k].reward > rows[i].reward + 1e-9) up_n++;
            if (rows[k].reward < rows[i].reward - 1e-9) down_n++;
        }
    }
    REQUIREF(pairs >= 20, "%d val tasks evaluated at both ends", pairs);
    before /= pairs;
    after /= pairs;
    double p = sign_test_p(up_n, up_n + down_n);
    fprintf(stderr,
            "%.0f s: val reward %.3f (v%ld) -> %.3f (v%ld) over %d tasks; %d better, %d worse: "
            "one-sided sign test p = %.2g\n",
            took, before, vmin, after, vmax, pairs, up_n, down_n, p);
    CHECKF(p < 0.01, "no clear improvement: %d better, %d worse (p = %.3g)", up_n, down_n, p);
    CHECKF(after - before >= min_gain, "val reward %.3f -> %.3f", before, after);

    snprintf(path, sizeof path, "%s/metrics.csv", wd);
    char *csv = al_test_slurp_text(path);
    CHECKF(csv && !strncmp(csv, "version,time_s,rollouts,train_reward_mean", 41), "%s",
           csv ? csv : "no metrics.csv");
    free(csv);
    snprintf(path, sizeof path, "%s/reward.svg", wd);
    char *svg = al_test_slurp_text(path);
    CHECK(svg && strstr(svg, "<svg") && strstr(svg, "</svg>"));
    free(svg);
    free(o), free(e);
    if (!testlib_cur_failed && al_test_rmtree(dir) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
}

#endif
