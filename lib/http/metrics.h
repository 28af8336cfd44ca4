/*
 * metrics.h: a Prometheus metrics registry every stage shares.
 *
 * A registry holds metric families (counter, gauge, histogram), each with a name, a help
 * line and, for histograms, fixed bucket bounds. A family holds one series per label set.
 * Getting a series (al_metrics_counter & co.) takes the registry's lock and may allocate:
 * do it once at start-up and keep the pointer. Updating a series (al_counter_add,
 * al_gauge_set, al_histogram_observe) is lock-free (C11 atomics) and safe from any
 * thread. Series live as long as the registry; al_metrics_free releases everything.
 *
 * Every update function accepts NULL and does nothing, so that a series that could not be
 * created (bad name; the reason is logged) never crashes a stage.
 *
 *   al_metrics *m = al_metrics_new();
 *   al_counter *msgs = al_metrics_counter(m, "arclight_credit_messages_total",
 *                                         "Spans consumed", "topic", "arclight.spans", NULL);
 *   al_counter_inc(msgs);
 *   char *text = al_metrics_render(m, NULL);   // Prometheus text format 0.0.4
 */
#ifndef ARCLIGHT_HTTP_METRICS_H
#define ARCLIGHT_HTTP_METRICS_H

#include <stddef.h>
#include <stdint.h>

typedef struct al_metrics al_metrics;
typedef struct al_counter al_counter;
typedef struct al_gauge al_gauge;
typedef struct al_histogram al_histogram;

/* Bucket bounds (seconds) for request and step latencies: 100 us .. 60 s. */
extern const double al_metrics_latency_buckets[];
extern const size_t al_metrics_latency_buckets_len;

/* The process-wide registry, created on first use (thread-safe) and never freed: the one
 * to use from library code (lib/kafka, lib/avro) that has no registry handed to it, and
 * the one a stage serves unless it has reasons to keep several. NULL only when out of
 * memory. */
al_metrics *al_metrics_global(void);

/* A new, empty registry, or NULL when out of memory. Free with al_metrics_free. */
al_metrics *al_metrics_new(void);
/* Frees the registry and every series in it; pointers handed out become invalid. The
 * caller makes sure no thread still updates or renders it (stop the HTTP server first). */
void al_metrics_free(al_metrics *m);

/* The series of family `name` for a label set, created on first use; later calls with the
 * same name and labels return the same pointer. The labels are name/value pairs ended by
 * NULL: ("topic", "arclight.spans", "partition", "3", NULL), or just NULL for none. Label
 * values may hold any bytes but NUL; they are escaped on output.
 *
 * Returns NULL (and logs why) when the metric or a label name is not a valid Prometheus
 * name, when `name` already exists with another type, or when out of memory. `help` is
 * taken from the first call that creates the family; the registry copies every string. */
al_counter *al_metrics_counter(al_metrics *m, const char *name, const char *help, ...)
    __attribute__((sentinel));
al_gauge *al_metrics_gauge(al_metrics *m, const char *name, const char *help, ...)
    __attribute__((sentinel));
/* `bounds` are the buckets' upper bounds, finite and strictly increasing (the +Inf bucket
 * is implicit); they are fixed by the first call for `name`, later calls' bounds must be
 * equal or the call returns NULL. */
al_histogram *al_metrics_histogram(al_metrics *m, const char *name, const char *help,
                                   const double *bounds, size_t nbounds, ...)
    __attribute__((sentinel));

/* Counters only go up: a negative or NaN amount is ignored. */
void al_counter_inc(al_counter *c);
void al_counter_add(al_counter *c, double v);
double al_counter_value(const al_counter *c);

void al_gauge_set(al_gauge *g, double v);
void al_gauge_add(al_gauge *g, double v);
double al_gauge_value(const al_gauge *g);

void al_histogram_observe(al_histogram *h, double v);
/* Total number of observations and their sum, for tests and progress lines. */
uint64_t al_histogram_count(const al_histogram *h);
double al_histogram_sum(const al_histogram *h);

/* A function the registry calls at the start of every render, on the rendering thread,
 * without the registry's lock held: the place to set gauges whose value is read on demand
 * (consumer lag, queue depth). At most 16 per registry; returns 0, or -1 when full. */
typedef void (*al_metrics_collect_fn)(al_metrics *m, void *ud);
int al_metrics_on_collect(al_metrics *m, al_metrics_collect_fn fn, void *ud);

/* Registers process_start_time_seconds, process_cpu_seconds_total,
 * process_resident_memory_bytes and process_open_fds (read from /proc at render time).
 * 0, or -1 when the registry is full or out of memory. */
int al_metrics_add_process_metrics(al_metrics *m);

/* The whole registry in the Prometheus text exposition format (version 0.0.4): families
 * in registration order, each with its # HELP and # TYPE lines, series in creation order.
 * Returns a malloc'd NUL-terminated string (the caller frees it) and its length in
 * *len_out when len_out is not NULL; NULL only when out of memory. */
char *al_metrics_render(al_metrics *m, size_t *len_out);

#endif
