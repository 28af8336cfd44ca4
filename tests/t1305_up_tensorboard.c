/*
 * t1305: TensorBoard event files from a real run. `arclight up --steps 3` (the letters demo
 * through the rollout controller, no warm start, groups of 2, an evaluation every version)
 * writes WORKDIR/tensorboard/rollouts and WORKDIR/tensorboard/train by default; TensorBoard's
 * own reader (tests/tb_read.py, scripts/setup.sh's venv; skipped without it) reads them
 * back, and they say what metrics.csv says: per policy version the train and val reward,
 * the rollouts' counts and the trainer's loss, KL, entropy and clip fraction, at wall times
 * in the run's span; train's own file has versions 1 to 3 with the same loss as the CSV,
 * and the policy lag of the batches that named their sampling version.
 */
#include "t1349_up_common.h"
#include "testlib.h"
#include "support.h"
#include "venv.h"

#include <jansson.h>
#include <math.h>
#include <time.h>

/* The value of tag at step in run (NAN when absent), and its wall time in *wall. */
static double tb_at(json_t *run, const char *tag, long long step, double *wall)
{
    json_t *e;
    size_t i;
    json_array_foreach(json_object_get(run, tag), i, e)
    {
        if (json_integer_value(json_array_get(e, 0)) != step) continue;
        if (wall) *wall = json_number_value(json_array_get(e, 1));
        return json_number_value(json_array_get(e, 2));
    }
    return NAN;
}

/* Compares a CSV cell with the event's value; an empty cell must have no event. The CSV has
 * six decimals (rewards) or six digits (the trainer's numbers), the event a float. */
static void same(json_t *run, const char *tag, long long version, const char *cell)
{
    double v = tb_at(run, tag, version, NULL);
    if (!*cell) {
        CHECKF(isnan(v), "v%lld %s: no value in metrics.csv, %g in the events", version, tag, v);
        return;
    }
    double want = strtod(cell, NULL);
    CHECKF(fabs(v - want) <= 1e-6 + 1e-5 * fabs(want),
           "v%lld %s: %s in metrics.csv, %g in the events", version, tag, cell, v);
}

TEST(up_writes_the_metrics_as_tensorboard_events)
{
    char py[1024];
    al_test_venv_python(py, sizeof py, "tensorboard");
    char dir[256], out[512], err[512], wd[512], cmd[4096];
    REQUIRE(al_test_tmpdir(dir, sizeof dir, "t1305"));
    snprintf(out, sizeof out, "%s/up.out", dir);
    snprintf(err, sizeof err, "%s/up.err", dir);
    snprintf(wd, sizeof wd, "%s/work", dir);
    double t0 = (double)time(NULL);
    /* clang-format off */
    char *argv[] = {(char *)up_bin(), "up", "--workdir", wd, "--listen-broker", "127.0.0.1:0",
                    "--listen-serve", "127.0.0.1:0", "--listen-proxy", "127.0.0.1:0",
                    "--steps", "3", "--group-size", "2", "--step-groups", "2", "--warm-start", "",
                    "--stop-timeout", "15",
                    "--rollouts-args", "--eval-every 1 --eval-tasks 4", NULL};
    /* clang-format on */
    pid_t up = up_start(argv, out, err);
    int st = up_wait(up, 400);
    char *o = al_test_slurp_text(out), *e = al_test_slurp_text(err);
    REQUIREF(st == 0, "up: wait status %d\n--- stdout\n%s\n--- stderr\n%.6000s", st, o, e);
    double t1 = (double)time(NULL) + 1;
    CHECKF(strstr(o, "tensorboard --logdir"), "%s", o);

    char tb[600], js[700];
    snprintf(tb, sizeof tb, "%s/tensorboard", wd);
    snprintf(js, sizeof js, "%s/events.json", dir);
    snprintf(cmd, sizeof cmd, "'%s' tests/tb_read.py '%s' > '%s'", py, tb, js);
    REQUIRE(system(cmd) == 0);
    json_error_t je;
    json_t *j = json_load_file(js, 0, &je);
    REQUIREF(j, "%s: %s", js, je.text);
    json_t *ro = json_object_get(j, "rollouts"), *tr = json_object_get(j, "train");
    REQUIREF(ro && tr, "runs: %s", json_dumps(j, 0));

    /* every row of metrics.csv, cell by cell */
    char csvp[600];
    snprintf(csvp, sizeof csvp, "%s/metrics.csv", wd);
    char *csv = al_test_slurp_text(csvp);
    REQUIRE(csv);
    int rows = 0, vals = 0;
    char *save = NULL;
    for (char *line = strtok_r(csv, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        if (!strncmp(line, "version,", 8)) continue;
        char *cell[12] = {0};
        int n = 0;
        for (char *p = line; n < 12; n++) { /* strsep keeps empty cells */
            cell[n] = strsep(&p, ",");
            if (!p) {
                n++;
                break;
            }
        }
        REQUIREF(n == 12, "a row of %d cells: %s", n, line);
        long long v = atoll(cell[0]);
        rows++;
        vals += *cell[5] != 0;
        same(ro, "reward/train", v, cell[3]);
        same(ro, "reward/train_std", v, cell[4]);
        same(ro, "reward/val", v, cell[5]);
        same(ro, "train/loss", v, cell[8]);
        same(ro, "train/kl", v, cell[9]);
        same(ro, "train/entropy", v, cell[10]);
        same(ro, "train/clip_frac", v, cell[11]);
        if (atoll(cell[2])) same(ro, "rollouts/train", v, cell[2]);
        if (*cell[8]) same(tr, "train/loss", v, cell[8]); /* train's own file */
        double wall = 0;
        if (!isnan(tb_at(ro, *cell[3] ? "reward/train" : "reward/val", v, &wall)))
            CHECKF(wall >= t0 && wall <= t1, "v%lld at wall time %.0f, the run was %.0f-%.0f", v,
                   wall, t0, t1);
    }
    CHECKF(rows >= 4 && vals >= 2, "%d rows, %d with a val reward:\n%s", rows, vals,
           al_test_slurp_text(csvp));
    int lags = 0;
    for (long long v = 1; v <= 3; v++) {
        double wall = 0;
        CHECKF(!isnan(tb_at(tr, "train/loss", v, &wall)) && wall >= t0 && wall <= t1 &&
                   !isnan(tb_at(tr, "train/entropy", v, NULL)) &&
                   !isnan(tb_at(tr, "train/tokens_per_s", v, NULL)),
               "train's events lack version %lld", v);
        double lag = tb_at(tr, "train/lag", v, NULL); /* when the batch named its policy */
        if (!isnan(lag)) lags++;
        CHECKF(isnan(lag) || (lag >= 0 && lag <= 2), "v%lld: lag %g", v, lag);
    }
    CHECKF(lags >= 1, "no train/lag in train's events");
    fprintf(stderr, "%d versions in metrics.csv, %d evaluated, all as the events say\n", rows,
            vals);
    free(csv);
    json_decref(j);
    free(o), free(e);
    if (!testlib_cur_failed) al_test_rmtree(dir);
}
