/*
 * metrics.c: the registry behind metrics.h. Families and series are linked lists guarded
 * by one mutex, touched only when a series is created or the registry rendered; values are
 * atomics (doubles stored as their bit patterns, updated by compare-and-swap), so the hot
 * path never takes a lock.
 */
#include "http/metrics.h"

#include "core/buf.h"
#include "core/log.h"

#include <dirent.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

const double al_metrics_latency_buckets[] = {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005,
                                             0.01,   0.025,   0.05,   0.1,   0.25,   0.5,
                                             1,      2.5,     5,      10,    30,     60};
const size_t al_metrics_latency_buckets_len =
    sizeof al_metrics_latency_buckets / sizeof al_metrics_latency_buckets[0];

enum metric_type { METRIC_COUNTER, METRIC_GAUGE, METRIC_HISTOGRAM };
static const char *type_names[] = {"counter", "gauge", "histogram"};

typedef struct series {
    struct series *next;
    char *labels;                /* rendered and escaped: k="v",k2="v2"; "" for none */
    _Atomic uint64_t value_bits; /* counter, gauge: the value; histogram: the sum */
    _Atomic uint64_t count;      /* histogram: number of observations */
    _Atomic uint64_t *buckets;   /* histogram: (nbounds + 1) per-bucket, not cumulative */
    const double *bounds;        /* histogram: the family's bounds */
    size_t nbounds;
} series;

struct al_counter {
    series s;
};
struct al_gauge {
    series s;
};
struct al_histogram {
    series s;
};

typedef struct family {
    struct family *next;
    char *name;
    char *help;
    enum metric_type type;
    double *bounds; /* histogram only */
    size_t nbounds;
    series *first, *last;
} family;

#define MAX_COLLECT 16

struct al_metrics {
    pthread_mutex_t lock;
    family *first, *last;
    struct {
        al_metrics_collect_fn fn;
        void *ud;
    } collect[MAX_COLLECT];
    int ncollect;
    double process_start; /* seconds since the epoch, set by al_metrics_add_process_metrics */
};

static inline double bits_to_double(uint64_t b)
{
    double d;
    memcpy(&d, &b, sizeof d);
    return d;
}

static inline uint64_t double_to_bits(double d)
{
    uint64_t b;
    memcpy(&b, &d, sizeof b);
    return b;
}

static void atomic_add_double(_Atomic uint64_t *p, double v)
{
    uint64_t old = atomic_load_explicit(p, memory_order_relaxed);
    while (!atomic_compare_exchange_weak_explicit(p, &old, double_to_bits(bits_to_double(old) + v),
                                                  memory_order_relaxed, memory_order_relaxed)) {
    }
}

al_metrics *al_metrics_new(void)
{
    al_metrics *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    pthread_mutex_init(&m->lock, NULL);
    return m;
}

static al_metrics *global_registry;
static pthread_once_t global_once = PTHREAD_ONCE_INIT;

static void global_create(void)
{
    global_registry = al_metrics_new();
}

al_metrics *al_metrics_global(void)
{
    pthread_once(&global_once, global_create);
    return global_registry;
}

void al_metrics_free(al_metrics *m)
{
    if (!m || m == global_registry) return; /* the global one lives as long as the process */
    family *f = m->first;
    while (f) {
        family *fn = f->next;
        series *s = f->first;
        while (s) {
            series *sn = s->next;
            free(s->labels);
            free((void *)s->buckets);
            free(s);
            s = sn;
        }
        free(f->name);
        free(f->help);
        free(f->bounds);
        free(f);
        f = fn;
    }
    pthread_mutex_destroy(&m->lock);
    free(m);
}

/* Prometheus metric names: [a-zA-Z_:][a-zA-Z0-9_:]*; label names: [a-zA-Z_][a-zA-Z0-9_]*
 * and not starting with "__" (reserved). */
static int valid_name(const char *s, int is_label)
{
    if (!s || !*s) return 0;
    for (const char *p = s; *p; p++) {
        char c = *p;
        int ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' ||
                 (!is_label && c == ':') || (p != s && c >= '0' && c <= '9');
        if (!ok) return 0;
    }
    if (is_label && s[0] == '_' && s[1] == '_') return 0;
    return 1;
}

/* Appends s with the exposition format's escapes: backslash and newline always, double
 * quote inside label values. */
static void put_escaped(al_buf *b, const char *s, int quote)
{
    for (const char *p = s; *p; p++) {
        if (*p == '\\')
            al_buf_append(b, "\\\\", 2);
        else if (*p == '\n')
            al_buf_append(b, "\\n", 2);
        else if (quote && *p == '"')
            al_buf_append(b, "\\\"", 2);
        else
            al_buf_append(b, p, 1);
    }
}

/* Formats a sample value the way Prometheus reads it back exactly: NaN, +Inf, -Inf,
 * integers without a fraction, otherwise the shortest of %.15g/%.17g that round-trips. */
static void format_double(char *out, size_t outlen, double v)
{
    if (isnan(v)) {
        snprintf(out, outlen, "NaN");
    } else if (isinf(v)) {
        snprintf(out, outlen, v > 0 ? "+Inf" : "-Inf");
    } else if (v == floor(v) && fabs(v) < 1e15) {
        snprintf(out, outlen, "%.0f", v);
    } else {
        snprintf(out, outlen, "%.15g", v);
        if (strtod(out, NULL) != v) snprintf(out, outlen, "%.17g", v);
    }
}

/* Renders the NULL-ended name/value pairs of `ap` as k="v",... into a malloc'd string.
 * NULL (with the reason logged) on an invalid label name, a missing value, a reserved
 * "le" on a histogram, or out of memory. */
static char *labels_render(const char *metric, enum metric_type type, va_list ap)
{
    al_buf b = {0};
    al_buf_puts(&b, "");
    for (;;) {
        const char *k = va_arg(ap, const char *);
        if (!k) break;
        const char *v = va_arg(ap, const char *);
        if (!valid_name(k, 1) || (type == METRIC_HISTOGRAM && strcmp(k, "le") == 0)) {
            al_log_error("metrics", "metric %s: invalid label name '%s'", metric, k);
            free(b.data);
            return NULL;
        }
        if (!v) {
            al_log_error("metrics", "metric %s: label '%s' has no value (NULL)", metric, k);
            free(b.data);
            return NULL;
        }
        if (b.len) al_buf_append(&b, ",", 1);
        al_buf_puts(&b, k);
        al_buf_append(&b, "=\"", 2);
        put_escaped(&b, v, 1);
        al_buf_append(&b, "\"", 1);
    }
    if (b.oom) {
        free(b.data);
        return NULL;
    }
    return b.data;
}

/* Finds or creates family `name` of `type` and, in it, the series for `labels` (which it
 * takes ownership of). NULL with the reason logged on a type or bucket mismatch, a bad
 * name, or out of memory. */
static series *series_get(al_metrics *m, const char *name, const char *help, enum metric_type type,
                          const double *bounds, size_t nbounds, char *labels)
{
    series *s = NULL;
    if (!m || !labels) {
        free(labels);
        return NULL;
    }
    if (!valid_name(name, 0)) {
        al_log_error("metrics", "invalid metric name '%s'", name ? name : "(null)");
        free(labels);
        return NULL;
    }
    pthread_mutex_lock(&m->lock);
    family *f;
    for (f = m->first; f; f = f->next)
        if (strcmp(f->name, name) == 0) break;
    if (f && f->type != type) {
        al_log_error("metrics", "metric %s is a %s, not a %s", name, type_names[f->type],
                     type_names[type]);
        goto out;
    }
    if (f && type == METRIC_HISTOGRAM &&
        (f->nbounds != nbounds || memcmp(f->bounds, bounds, nbounds * sizeof *bounds) != 0)) {
        al_log_error("metrics", "histogram %s already exists with other buckets", name);
        goto out;
    }
    if (!f) {
        f = calloc(1, sizeof *f);
        if (!f) goto out;
        f->name = strdup(name);
        f->help = strdup(help ? help : "");
        f->type = type;
        if (type == METRIC_HISTOGRAM) {
            f->bounds = malloc((nbounds ? nbounds : 1) * sizeof *bounds);
            if (f->bounds) memcpy(f->bounds, bounds, nbounds * sizeof *bounds);
            f->nbounds = nbounds;
        }
        if (!f->name || !f->help || (type == METRIC_HISTOGRAM && !f->bounds)) {
            free(f->name);
            free(f->help);
            free(f->bounds);
            free(f);
            goto out;
        }
        if (m->last)
            m->last->next = f;
        else
            m->first = f;
        m->last = f;
    }
    for (s = f->first; s; s = s->next)
        if (strcmp(s->labels, labels) == 0) goto out;
    /* Each public type wraps `series` as its only member, so one allocation size fits all. */
    s = calloc(1, sizeof(struct al_histogram));
    if (!s) goto out;
    if (type == METRIC_HISTOGRAM) {
        s->buckets = calloc(nbounds + 1, sizeof *s->buckets);
        if (!s->buckets) {
            free(s);
            s = NULL;
            goto out;
        }
        s->bounds = f->bounds;
        s->nbounds = f->nbounds;
    }
    atomic_init(&s->value_bits, double_to_bits(0.0));
    s->labels = labels;
    labels = NULL;
    if (f->last)
        f->last->next = s;
    else
        f->first = s;
    f->last = s;
out:
    pthread_mutex_unlock(&m->lock);
    free(labels);
    return s;
}

al_counter *al_metrics_counter(al_metrics *m, const char *name, const char *help, ...)
{
    va_list ap;
    va_start(ap, help);
    char *labels = labels_render(name, METRIC_COUNTER, ap);
    va_end(ap);
    return (al_counter *)series_get(m, name, help, METRIC_COUNTER, NULL, 0, labels);
}

al_gauge *al_metrics_gauge(al_metrics *m, const char *name, const char *help, ...)
{
    va_list ap;
    va_start(ap, help);
    char *labels = labels_render(name, METRIC_GAUGE, ap);
    va_end(ap);
    return (al_gauge *)series_get(m, name, help, METRIC_GAUGE, NULL, 0, labels);
}

al_histogram *al_metrics_histogram(al_metrics *m, const char *name, const char *help,
                                   const double *bounds, size_t nbounds, ...)
{
    va_list ap;
    if (!bounds && nbounds) return NULL;
    for (size_t i = 0; i < nbounds; i++) {
        if (!isfinite(bounds[i]) || (i > 0 && !(bounds[i] > bounds[i - 1]))) {
            al_log_error("metrics",
                         "histogram %s: bucket bounds must be finite and strictly "
                         "increasing (bound %zu is %g)",
                         name ? name : "(null)", i, bounds[i]);
            return NULL;
        }
    }
    va_start(ap, nbounds);
    char *labels = labels_render(name, METRIC_HISTOGRAM, ap);
    va_end(ap);
    return (al_histogram *)series_get(m, name, help, METRIC_HISTOGRAM, bounds, nbounds, labels);
}

void al_counter_inc(al_counter *c)
{
    al_counter_add(c, 1.0);
}

void al_counter_add(al_counter *c, double v)
{
    if (!c || !(v >= 0)) return;
    atomic_add_double(&c->s.value_bits, v);
}

double al_counter_value(const al_counter *c)
{
    if (!c) return 0;
    return bits_to_double(
        atomic_load_explicit(&((al_counter *)c)->s.value_bits, memory_order_relaxed));
}

void al_gauge_set(al_gauge *g, double v)
{
    if (!g) return;
    atomic_store_explicit(&g->s.value_bits, double_to_bits(v), memory_order_relaxed);
}

void al_gauge_add(al_gauge *g, double v)
{
    if (!g) return;
    atomic_add_double(&g->s.value_bits, v);
}

double al_gauge_value(const al_gauge *g)
{
    if (!g) return 0;
    return bits_to_double(
        atomic_load_explicit(&((al_gauge *)g)->s.value_bits, memory_order_relaxed));
}

void al_histogram_observe(al_histogram *h, double v)
{
    if (!h || isnan(v)) return;
    /* First bucket whose upper bound is >= v (Prometheus buckets are "le"). */
    size_t lo = 0, hi = h->s.nbounds;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (v <= h->s.bounds[mid])
            hi = mid;
        else
            lo = mid + 1;
    }
    atomic_fetch_add_explicit(&h->s.buckets[lo], 1, memory_order_relaxed);
    atomic_add_double(&h->s.value_bits, v);
    atomic_fetch_add_explicit(&h->s.count, 1, memory_order_relaxed);
}

uint64_t al_histogram_count(const al_histogram *h)
{
    if (!h) return 0;
    return atomic_load_explicit(&((al_histogram *)h)->s.count, memory_order_relaxed);
}

double al_histogram_sum(const al_histogram *h)
{
    if (!h) return 0;
    return bits_to_double(
        atomic_load_explicit(&((al_histogram *)h)->s.value_bits, memory_order_relaxed));
}

int al_metrics_on_collect(al_metrics *m, al_metrics_collect_fn fn, void *ud)
{
    int rc = -1;
    if (!m || !fn) return -1;
    pthread_mutex_lock(&m->lock);
    if (m->ncollect < MAX_COLLECT) {
        m->collect[m->ncollect].fn = fn;
        m->collect[m->ncollect].ud = ud;
        m->ncollect++;
        rc = 0;
    }
    pthread_mutex_unlock(&m->lock);
    return rc;
}

/* Opens a series line: name[suffix]{labels[,extra]} */
static void put_series_head(al_buf *b, const family *f, const char *suffix, const series *s,
                            const char *extra)
{
    al_buf_puts(b, f->name);
    al_buf_puts(b, suffix);
    if (s->labels[0] || extra) {
        al_buf_append(b, "{", 1);
        al_buf_puts(b, s->labels);
        if (extra) {
            if (s->labels[0]) al_buf_append(b, ",", 1);
            al_buf_puts(b, extra);
        }
        al_buf_append(b, "}", 1);
    }
    al_buf_append(b, " ", 1);
}

char *al_metrics_render(al_metrics *m, size_t *len_out)
{
    struct {
        al_metrics_collect_fn fn;
        void *ud;
    } hooks[MAX_COLLECT];
    int nhooks;
    al_buf b = {0};
    char num[64], le[96];

    if (!m) return NULL;
    pthread_mutex_lock(&m->lock);
    nhooks = m->ncollect;
    memcpy(hooks, m->collect, sizeof hooks[0] * (size_t)nhooks);
    pthread_mutex_unlock(&m->lock);
    for (int i = 0; i < nhooks; i++)
        hooks[i].fn(m, hooks[i].ud);

    al_buf_puts(&b, "");
    pthread_mutex_lock(&m->lock);
    for (const family *f = m->first; f; f = f->next) {
        if (!f->first) continue; /* a family with no series says nothing */
        al_buf_puts(&b, "# HELP ");
        al_buf_puts(&b, f->name);
        al_buf_append(&b, " ", 1);
        put_escaped(&b, f->help, 0);
        al_buf_puts(&b, "\n# TYPE ");
        al_buf_puts(&b, f->name);
        al_buf_append(&b, " ", 1);
        al_buf_puts(&b, type_names[f->type]);
        al_buf_append(&b, "\n", 1);
        for (series *s = f->first; s; s = s->next) {
            if (f->type != METRIC_HISTOGRAM) {
                put_series_head(&b, f, "", s, NULL);
                format_double(
                    num, sizeof num,
                    bits_to_double(atomic_load_explicit(&s->value_bits, memory_order_relaxed)));
                al_buf_puts(&b, num);
                al_buf_append(&b, "\n", 1);
                continue;
            }
            /* Buckets are cumulative on the wire; a scrape racing with observations may
             * see a count a little behind the buckets, which Prometheus tolerates. */
            uint64_t cum = 0;
            for (size_t i = 0; i <= s->nbounds; i++) {
                cum += atomic_load_explicit(&s->buckets[i], memory_order_relaxed);
                if (i < s->nbounds) {
                    format_double(num, sizeof num, s->bounds[i]);
                    snprintf(le, sizeof le, "le=\"%s\"", num);
                } else {
                    snprintf(le, sizeof le, "le=\"+Inf\"");
                }
                put_series_head(&b, f, "_bucket", s, le);
                snprintf(num, sizeof num, "%llu", (unsigned long long)cum);
                al_buf_puts(&b, num);
                al_buf_append(&b, "\n", 1);
            }
            put_series_head(&b, f, "_sum", s, NULL);
            format_double(
                num, sizeof num,
                bits_to_double(atomic_load_explicit(&s->value_bits, memory_order_relaxed)));
            al_buf_puts(&b, num);
            al_buf_append(&b, "\n", 1);
            put_series_head(&b, f, "_count", s, NULL);
            snprintf(num, sizeof num, "%llu", (unsigned long long)cum);
            al_buf_puts(&b, num);
            al_buf_append(&b, "\n", 1);
        }
    }
    pthread_mutex_unlock(&m->lock);
    if (b.oom) {
        free(b.data);
        return NULL;
    }
    if (len_out) *len_out = b.len;
    return b.data;
}

/* ---- process metrics, read from /proc on each scrape ---- */

/* Fields of /proc/self/stat after the command name: utime (14), stime (15), starttime
 * (22), rss in pages (24), counted from 1. 0, or -1 when unreadable. */
static int read_proc_stat(unsigned long long *utime, unsigned long long *stime,
                          unsigned long long *starttime, long long *rss_pages)
{
    char buf[1024];
    FILE *f = fopen("/proc/self/stat", "r");
    if (!f) return -1;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    char *p = strrchr(buf, ')'); /* the command name may hold spaces */
    if (!p) return -1;
    /* After ") " comes field 3 (state). */
    int field = 2;
    char *save = NULL;
    for (char *tok = strtok_r(p + 1, " ", &save); tok; tok = strtok_r(NULL, " ", &save)) {
        field++;
        if (field == 14) *utime = strtoull(tok, NULL, 10);
        if (field == 15) *stime = strtoull(tok, NULL, 10);
        if (field == 22) *starttime = strtoull(tok, NULL, 10);
        if (field == 24) {
            *rss_pages = strtoll(tok, NULL, 10);
            return 0;
        }
    }
    return -1;
}

static void process_collect(al_metrics *m, void *ud)
{
    unsigned long long ut = 0, st = 0, start = 0;
    long long rss = 0;
    long hz = sysconf(_SC_CLK_TCK), page = sysconf(_SC_PAGESIZE);
    (void)ud;
    if (hz <= 0) hz = 100;
    if (read_proc_stat(&ut, &st, &start, &rss) == 0) {
        al_gauge_set(al_metrics_gauge(m, "process_resident_memory_bytes",
                                      "Resident memory size in bytes.", NULL),
                     (double)rss * (double)page);
        al_counter *cpu =
            al_metrics_counter(m, "process_cpu_seconds_total",
                               "Total user and system CPU time spent in seconds.", NULL);
        double now = (double)(ut + st) / (double)hz;
        double cur = al_counter_value(cpu);
        if (now > cur) al_counter_add(cpu, now - cur);
    }
    int fds = 0;
    DIR *d = opendir("/proc/self/fd");
    if (d) {
        struct dirent *e;
        while ((e = readdir(d)))
            if (e->d_name[0] != '.') fds++;
        closedir(d);
        al_gauge_set(
            al_metrics_gauge(m, "process_open_fds", "Number of open file descriptors.", NULL),
            fds - 1); /* the directory stream itself */
    }
}

/* Process start from /proc: boot time (btime in /proc/stat) + starttime ticks. Falls back
 * to "now" when /proc is not there. */
static double process_start_seconds(void)
{
    unsigned long long ut, st, start = 0;
    long long rss;
    long hz = sysconf(_SC_CLK_TCK);
    char line[256];
    double btime = -1;
    FILE *f = fopen("/proc/stat", "r");
    if (f) {
        while (fgets(line, sizeof line, f))
            if (strncmp(line, "btime ", 6) == 0) btime = strtod(line + 6, NULL);
        fclose(f);
    }
    if (hz > 0 && btime >= 0 && read_proc_stat(&ut, &st, &start, &rss) == 0)
        return btime + (double)start / (double)hz;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec;
}

int al_metrics_add_process_metrics(al_metrics *m)
{
    if (!m) return -1;
    al_gauge *g = al_metrics_gauge(m, "process_start_time_seconds",
                                   "Start time of the process since unix epoch in seconds.", NULL);
    if (!g) return -1;
    m->process_start = process_start_seconds();
    al_gauge_set(g, m->process_start);
    return al_metrics_on_collect(m, process_collect, NULL);
}
