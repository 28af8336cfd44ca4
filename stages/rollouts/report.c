/*
 * report.c: per-version metrics, metrics.csv and reward.svg (see report.h).
 */
#include "rollouts/report.h"

#include "core/buf.h"
#include "core/util.h"
#include "core/vec.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

rl_version_row *rl_report_row(rl_report *r, int64_t version)
{
    size_t lo = 0, hi = r->n;
    while (lo < hi) { /* first row with version >= the one asked for */
        size_t mid = (lo + hi) / 2;
        if (r->rows[mid].version < version)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo < r->n && r->rows[lo].version == version) return &r->rows[lo];
    if (al_vec_grow((void **)&r->rows, &r->cap, r->n + 1, sizeof *r->rows)) return NULL;
    memmove(&r->rows[lo + 1], &r->rows[lo], (r->n - lo) * sizeof *r->rows);
    r->n++;
    rl_version_row *row = &r->rows[lo];
    memset(row, 0, sizeof *row);
    row->version = version;
    row->time_s = -1;
    return row;
}

const rl_version_row *rl_report_find(const rl_report *r, int64_t version)
{
    for (size_t i = 0; i < r->n; i++)
        if (r->rows[i].version == version) return &r->rows[i];
    return NULL;
}

void rl_report_add_train(rl_report *r, int64_t version, double reward)
{
    rl_version_row *row = rl_report_row(r, version);
    if (!row) return;
    row->n_train++;
    row->sum_train += reward;
    row->sumsq_train += reward * reward;
}

void rl_report_add_val(rl_report *r, int64_t version, double reward)
{
    rl_version_row *row = rl_report_row(r, version);
    if (!row) return;
    row->n_val++;
    row->sum_val += reward;
}

void rl_report_free(rl_report *r)
{
    free(r->rows);
    memset(r, 0, sizeof *r);
}

double rl_row_train_mean(const rl_version_row *row)
{
    return row->n_train ? row->sum_train / (double)row->n_train : 0;
}

double rl_row_train_std(const rl_version_row *row)
{
    if (!row->n_train) return 0;
    double m = rl_row_train_mean(row);
    double v = row->sumsq_train / (double)row->n_train - m * m;
    return v > 0 ? sqrt(v) : 0;
}

double rl_row_val_mean(const rl_version_row *row)
{
    return row->n_val ? row->sum_val / (double)row->n_val : 0;
}

/* The text of b (the caller frees it), or NULL when an append ran out of memory. */
static char *buf_take(al_buf *b)
{
    if (b->oom) {
        al_buf_free(b);
        return NULL;
    }
    return al_buf_detach(b, NULL);
}

char *rl_report_csv(const rl_report *r)
{
    al_buf b = {0};
    al_buf_printf(&b, "version,time_s,rollouts,train_reward_mean,train_reward_std,val_reward,"
                      "val_rollouts,tokens_per_s,loss,kl,entropy,clip_frac\n");
    for (size_t i = 0; i < r->n; i++) {
        const rl_version_row *w = &r->rows[i];
        al_buf_printf(&b, "%lld,", (long long)w->version);
        if (w->time_s >= 0)
            al_buf_printf(&b, "%.3f,", w->time_s);
        else
            al_buf_puts(&b, ",");
        al_buf_printf(&b, "%lld,", (long long)w->n_train);
        if (w->n_train)
            al_buf_printf(&b, "%.6f,%.6f,", rl_row_train_mean(w), rl_row_train_std(w));
        else
            al_buf_puts(&b, ",,");
        if (w->n_val)
            al_buf_printf(&b, "%.6f,%lld,", rl_row_val_mean(w), (long long)w->n_val);
        else
            al_buf_puts(&b, ",0,");
        if (w->have_train_metrics)
            al_buf_printf(&b, "%.1f,%.6g,%.6g,%.6g,%.6g\n", w->tokens_per_s, w->loss, w->kl,
                          w->entropy, w->clip_frac);
        else
            al_buf_puts(&b, ",,,,\n");
    }
    return buf_take(&b);
}

static void buf_escaped(al_buf *b, const char *s)
{
    for (; *s; s++) {
        switch (*s) {
        case '<': al_buf_puts(b, "&lt;"); break;
        case '>': al_buf_puts(b, "&gt;"); break;
        case '&': al_buf_puts(b, "&amp;"); break;
        case '"': al_buf_puts(b, "&quot;"); break;
        default:
            if ((unsigned char)*s >= 0x20) al_buf_append(b, s, 1);
        }
    }
}

/* A "nice" tick step for a range: 1, 2 or 5 times a power of ten, about n ticks. */
static double tick_step(double range, int n)
{
    if (!(range > 0)) return 1;
    double raw = range / n, p = pow(10, floor(log10(raw))), f = raw / p;
    return (f < 1.5 ? 1 : f < 3.5 ? 2 : f < 7.5 ? 5 : 10) * p;
}

typedef struct panel {
    double x0, y0, w, h;       /* plot area in SVG pixels */
    double xmin, xmax, ymin, ymax;
} panel;

static double px(const panel *p, double x)
{
    return p->x0 + (p->xmax > p->xmin ? (x - p->xmin) / (p->xmax - p->xmin) : 0.5) * p->w;
}

static double py(const panel *p, double y)
{
    return p->y0 + p->h - (p->ymax > p->ymin ? (y - p->ymin) / (p->ymax - p->ymin) : 0.5) * p->h;
}

static void draw_axes(al_buf *b, const panel *p, const char *xlabel)
{
    al_buf_printf(b, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" "
                     "stroke=\"#888\"/>\n",
                  p->x0, p->y0, p->w, p->h);
    double ys = tick_step(p->ymax - p->ymin, 5);
    for (double y = ceil(p->ymin / ys) * ys; y <= p->ymax + 1e-9; y += ys) {
        al_buf_printf(b, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>"
                         "<text x=\"%.1f\" y=\"%.1f\" font-size=\"11\" "
                         "text-anchor=\"end\">%g</text>\n",
                      p->x0, py(p, y), p->x0 + p->w, py(p, y), p->x0 - 4, py(p, y) + 4,
                      fabs(y) < 1e-12 ? 0 : y);
    }
    double xs = tick_step(p->xmax - p->xmin, 6);
    for (double x = ceil(p->xmin / xs) * xs; x <= p->xmax + 1e-9; x += xs)
        al_buf_printf(b, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"11\" "
                         "text-anchor=\"middle\">%g</text>\n",
                      px(p, x), p->y0 + p->h + 14, fabs(x) < 1e-12 ? 0 : x);
    al_buf_printf(b, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"12\" "
                     "text-anchor=\"middle\">%s</text>\n",
                  p->x0 + p->w / 2, p->y0 + p->h + 30, xlabel);
    al_buf_printf(b, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"12\" text-anchor=\"middle\" "
                     "transform=\"rotate(-90 %.1f %.1f)\">reward</text>\n",
                  p->x0 - 36, p->y0 + p->h / 2, p->x0 - 36, p->y0 + p->h / 2);
}

/* One series: a polyline through (x, y) of the rows that have it, with a dot per point. */
static void draw_series(al_buf *b, const panel *p, const rl_report *r, int by_time, int val,
                        const char *color)
{
    int started = 0;
    for (size_t i = 0; i < r->n; i++) {
        const rl_version_row *w = &r->rows[i];
        if (val ? !w->n_val : !w->n_train) continue;
        if (by_time && w->time_s < 0) continue;
        double x = by_time ? w->time_s : (double)w->version;
        double y = val ? rl_row_val_mean(w) : rl_row_train_mean(w);
        if (!started)
            al_buf_printf(b, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"%s\" "
                             "points=\"",
                          color, val ? "2" : "1.5");
        al_buf_printf(b, "%.1f,%.1f ", px(p, x), py(p, y));
        started = 1;
    }
    if (started) al_buf_puts(b, "\"/>\n");
    if (!val) return;
    for (size_t i = 0; i < r->n; i++) {
        const rl_version_row *w = &r->rows[i];
        if (!w->n_val || (by_time && w->time_s < 0)) continue;
        double x = by_time ? w->time_s : (double)w->version;
        al_buf_printf(b, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"%s\"/>\n", px(p, x),
                      py(p, rl_row_val_mean(w)), color);
    }
}

char *rl_report_svg(const rl_report *r, const char *title)
{
    al_buf b = {0};
    double vmin = 0, vmax = 1, tmin = 0, tmax = 1, ymin = 0, ymax = 1;
    int first = 1, tfirst = 1;
    for (size_t i = 0; i < r->n; i++) {
        const rl_version_row *w = &r->rows[i];
        if (!w->n_train && !w->n_val) continue;
        double v = (double)w->version;
        if (first || v < vmin) vmin = v;
        if (first || v > vmax) vmax = v;
        first = 0;
        if (w->time_s >= 0) {
            if (tfirst || w->time_s < tmin) tmin = w->time_s;
            if (tfirst || w->time_s > tmax) tmax = w->time_s;
            tfirst = 0;
        }
        double ys[2] = {rl_row_train_mean(w), rl_row_val_mean(w)};
        for (int k = 0; k < 2; k++) {
            if (k == 0 && !w->n_train) continue;
            if (k == 1 && !w->n_val) continue;
            if (ys[k] < ymin) ymin = ys[k];
            if (ys[k] > ymax) ymax = ys[k];
        }
    }
    if (vmax <= vmin) vmax = vmin + 1;
    if (tmax <= tmin) tmax = tmin + 1;
    const double W = 1000, H = 400;
    al_buf_printf(&b, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
                      "viewBox=\"0 0 %.0f %.0f\" font-family=\"sans-serif\">\n"
                      "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
                  W, H, W, H);
    al_buf_printf(&b, "<text x=\"%.0f\" y=\"22\" font-size=\"15\" text-anchor=\"middle\">", W / 2);
    buf_escaped(&b, title ? title : "");
    al_buf_puts(&b, "</text>\n");
    panel pv = {70, 50, 400, 270, vmin, vmax, ymin, ymax};
    panel pt = {570, 50, 400, 270, tmin, tmax, ymin, ymax};
    draw_axes(&b, &pv, "policy version");
    draw_axes(&b, &pt, "seconds since start");
    draw_series(&b, &pv, r, 0, 0, "#1f77b4");
    draw_series(&b, &pv, r, 0, 1, "#ff7f0e");
    draw_series(&b, &pt, r, 1, 0, "#1f77b4");
    draw_series(&b, &pt, r, 1, 1, "#ff7f0e");
    /* the legend: each entry under a panel of its own, so that neither runs into the other
     * (the train entry's text is about 240 px wide at 12 px) */
    al_buf_printf(&b, "<line x1=\"%.0f\" y1=\"375\" x2=\"%.0f\" y2=\"375\" stroke=\"#1f77b4\" "
                      "stroke-width=\"2\"/><text x=\"%.0f\" y=\"379\" font-size=\"12\">train "
                      "(mean over the version's rollouts)</text>\n"
                      "<line x1=\"%.0f\" y1=\"375\" x2=\"%.0f\" y2=\"375\" stroke=\"#ff7f0e\" "
                      "stroke-width=\"2\"/><text x=\"%.0f\" y=\"379\" font-size=\"12\">val "
                      "(held-out tasks)</text>\n</svg>\n",
                  pv.x0, pv.x0 + 20, pv.x0 + 25, pt.x0, pt.x0 + 20, pt.x0 + 25);
    return buf_take(&b);
}

int rl_report_write(const rl_report *r, const char *dir, const char *title, char *errstr,
                    size_t errlen)
{
    char path[4096];
    char *csv = rl_report_csv(r), *svg = rl_report_svg(r, title);
    int rc = -1;
    if (!csv || !svg) {
        al_err(errstr, errlen, "out of memory");
        goto out;
    }
    snprintf(path, sizeof path, "%s/metrics.csv", dir);
    if (al_file_write_atomic(path, csv, strlen(csv), errstr, errlen)) goto out;
    snprintf(path, sizeof path, "%s/reward.svg", dir);
    if (al_file_write_atomic(path, svg, strlen(svg), errstr, errlen)) goto out;
    rc = 0;
out:
    free(csv);
    free(svg);
    return rc;
}
