/*
 * bench_metrics: the cost of updating lib/http's metrics from a stage's hot path, against a
 * bare relaxed atomic add on a plain counter measured in the same run, with 1 thread and with
 * 4 threads hammering the same series; plus the cost of one /metrics render of a registry
 * of a realistic size.
 *
 *   build/bench_metrics [seconds-per-case]   (default 0.5)
 */
#include "http/metrics.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

typedef enum { CASE_ATOMIC, CASE_COUNTER, CASE_GAUGE, CASE_HISTOGRAM } bench_case;

static _Atomic uint64_t plain;
static al_counter *counter;
static al_gauge *gauge;
static al_histogram *histogram;
static double seconds = 0.5;

typedef struct worker {
    bench_case what;
    uint64_t ops;
} worker;

static void *run(void *arg)
{
    worker *w = arg;
    uint64_t ops = 0;
    double end = now() + seconds;
    while (now() < end) {
        for (int i = 0; i < 4096; i++) {
            switch (w->what) {
            case CASE_ATOMIC:
                atomic_fetch_add_explicit(&plain, 1, memory_order_relaxed);
                break;
            case CASE_COUNTER:
                al_counter_inc(counter);
                break;
            case CASE_GAUGE:
                al_gauge_add(gauge, 1);
                break;
            case CASE_HISTOGRAM:
                al_histogram_observe(histogram, (double)(i & 1023) * 1e-4);
                break;
            }
        }
        ops += 4096;
    }
    w->ops = ops;
    return NULL;
}

/* Million operations per second summed over `threads` threads. */
static double measure(bench_case what, int threads)
{
    pthread_t t[16];
    worker w[16];
    for (int i = 0; i < threads; i++) {
        w[i].what = what;
        pthread_create(&t[i], NULL, run, &w[i]);
    }
    uint64_t ops = 0;
    for (int i = 0; i < threads; i++) {
        pthread_join(t[i], NULL);
        ops += w[i].ops;
    }
    return (double)ops / seconds / 1e6;
}

int main(int argc, char **argv)
{
    if (argc > 1) seconds = atof(argv[1]);
    if (!(seconds > 0)) seconds = 0.5;
    al_metrics *m = al_metrics_new();
    counter = al_metrics_counter(m, "bench_total", "h", "stage", "credit", NULL);
    gauge = al_metrics_gauge(m, "bench_level", "h", NULL);
    histogram = al_metrics_histogram(m, "bench_seconds", "h", al_metrics_latency_buckets,
                                     al_metrics_latency_buckets_len, NULL);
    static const char *names[] = {"relaxed atomic add (reference)", "al_counter_inc",
                                  "al_gauge_add", "al_histogram_observe (18 buckets)"};
    int thread_counts[] = {1, 4};
    for (int ti = 0; ti < 2; ti++) {
        int th = thread_counts[ti];
        double ref = measure(CASE_ATOMIC, th);
        printf("%d thread%s, one shared series:\n", th, th == 1 ? "" : "s");
        printf("  %-36s %8.1f M ops/s\n", names[0], ref);
        for (int c = CASE_COUNTER; c <= CASE_HISTOGRAM; c++) {
            double v = measure((bench_case)c, th);
            printf("  %-36s %8.1f M ops/s   ratio to reference %.2f\n", names[c], v, v / ref);
        }
    }

    /* A registry the size of a busy stage: 40 families x 16 series, 8 of them histograms. */
    al_metrics *big = al_metrics_new();
    char name[64], part[16];
    for (int f = 0; f < 40; f++) {
        snprintf(name, sizeof name, "arclight_stage_metric_%d%s", f, f < 8 ? "_seconds" : "_total");
        for (int p = 0; p < 16; p++) {
            snprintf(part, sizeof part, "%d", p);
            if (f < 8)
                al_histogram_observe(
                    al_metrics_histogram(big, name, "A histogram.", al_metrics_latency_buckets,
                                         al_metrics_latency_buckets_len, "topic", "arclight.spans",
                                         "partition", part, NULL),
                    0.01 * p);
            else
                al_counter_add(al_metrics_counter(big, name, "A counter.", "topic",
                                                  "arclight.spans", "partition", part, NULL),
                               p * 1000.0);
        }
    }
    size_t len = 0;
    int renders = 0;
    double t0 = now(), end = t0 + seconds;
    while (now() < end) {
        free(al_metrics_render(big, &len));
        renders++;
    }
    double per = (now() - t0) / renders;
    /* reference: copying the same number of bytes */
    char *src = al_metrics_render(big, NULL), *dst = malloc(len + 1);
    int copies = 0;
    t0 = now();
    end = t0 + seconds;
    while (now() < end) {
        for (int i = 0; i < 64; i++) {
            memcpy(dst, src, len);
            __asm__ volatile("" : : "r"(dst) : "memory");
        }
        copies += 64;
    }
    double copy = (now() - t0) / copies;
    printf("render of 640 series (%zu bytes): %.1f us per scrape   ratio to memcpy of the "
           "text %.0f\n",
           len, per * 1e6, per / copy);
    free(src);
    free(dst);
    al_metrics_free(big);
    al_metrics_free(m);
    return 0;
}
