/*
 * t1303: the README's main command, shortened: `arclight up --steps 40` with its defaults
 * (the letters demo of examples/letters: the warm start, then the unchanged `openai`-client
 * agent run by the rollout controller over the task set, two LLM calls per rollout) must
 * raise the reward on the held-out val tasks, which it never trains on.
 *
 * The statistic: every val task is evaluated (greedy) at the first and at the last
 * evaluation (WORKDIR/eval.jsonl). A one-sided sign test over the tasks whose reward
 * changed must reject "no improvement" at p < 0.01 (exact binomial tail: the chance that a
 * fair coin gives at least that many improvements), and the mean val reward must rise by at
 * least 0.2. A loop that loses the signal anywhere (the controller's rewards, the eval
 * marking, credit, batch's groups, the update, the weight swap) leaves the val tasks where
 * they started.
 */
#include "t1349_up_common.h"
#include "testlib.h"
#include "support.h"

#include <jansson.h>

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

TEST(held_out_reward_rises_under_the_defaults)
{
    char dir[512], out[600], err[600], wd[600], path[700];
    REQUIRE(al_test_tmpdir(dir, sizeof dir, "t1303"));
    snprintf(out, sizeof out, "%s/up.out", dir);
    snprintf(err, sizeof err, "%s/up.err", dir);
    snprintf(wd, sizeof wd, "%s/work", dir);
    double t0 = testlib_now();
    char *argv[] = {(char *)up_bin(),   "up",           "--workdir",     wd,
                    "--listen-broker",  "127.0.0.1:0",  "--listen-serve", "127.0.0.1:0",
                    "--listen-proxy",   "127.0.0.1:0",  "--steps",       "40",
                    "--rollouts-args",  "--eval-every 40 --quiet-agents", NULL};
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
    CHECKF(after - before >= 0.2, "val reward %.3f -> %.3f", before, after);

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
