/*
 * report.h: what the rollout controller records per policy version, and the two files it
 * keeps in its work directory (pure logic and file writing; no processes, no Kafka):
 *
 *   metrics.csv  one row per policy version:
 *                version,time_s,rollouts,train_reward_mean,train_reward_std,val_reward,
 *                val_rollouts,tokens_per_s,loss,kl,entropy,clip_frac
 *                (time_s: seconds since the controller started, when the version was
 *                published; an empty cell: not measured at that version)
 *   reward.svg   train and val reward against policy version and against wall time, two
 *                panels side by side, a plain SVG any browser opens
 *
 * Train rewards are those of training rollouts whose calls were answered by that version
 * (the oldest version among a rollout's calls); val rewards those of the held-out
 * evaluation run at that version. Both files are rewritten whole (temp file + rename) so a
 * reader never sees half of one.
 */
#ifndef ARCLIGHT_ROLLOUTS_REPORT_H
#define ARCLIGHT_ROLLOUTS_REPORT_H

#include <stddef.h>
#include <stdint.h>

typedef struct rl_version_row {
    int64_t version;
    double time_s;        /* when the version was published (-1: before the controller) */
    int have_train_metrics; /* the PolicyVersion's numbers below are known */
    double tokens_per_s, loss, kl, entropy, clip_frac;
    /* training rollouts sampled with this version */
    int64_t n_train;
    double sum_train, sumsq_train;
    /* held-out evaluation at this version */
    int64_t n_val;
    double sum_val;
} rl_version_row;

typedef struct rl_report {
    rl_version_row *rows; /* sorted by version */
    size_t n, cap;
} rl_report;

/* The row of a version (created in version order). NULL only when out of memory. */
rl_version_row *rl_report_row(rl_report *r, int64_t version);
/* The row, or NULL when the version has none. */
const rl_version_row *rl_report_find(const rl_report *r, int64_t version);
void rl_report_add_train(rl_report *r, int64_t version, double reward);
void rl_report_add_val(rl_report *r, int64_t version, double reward);
void rl_report_free(rl_report *r);

/* Mean and (population) std of a row's training rewards; 0 when none. */
double rl_row_train_mean(const rl_version_row *row);
double rl_row_train_std(const rl_version_row *row);
double rl_row_val_mean(const rl_version_row *row);

/* The CSV text (malloc'd, NUL-terminated; the caller frees). NULL when out of memory. */
char *rl_report_csv(const rl_report *r);
/* The SVG text (malloc'd). title goes above the plots (escaped). NULL when out of memory. */
char *rl_report_svg(const rl_report *r, const char *title);

/* Writes metrics.csv and reward.svg into dir. 0, or -1 with errstr. */
int rl_report_write(const rl_report *r, const char *dir, const char *title, char *errstr,
                    size_t errlen);

#endif
