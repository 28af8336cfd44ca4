/*
 * process.h: the process part of every arclight command's skeleton, the same for the Kafka
 * stages (lib/kafka/stage.h builds its worker on it: credit, batch, train) and for the
 * servers (proxy, serve, rollouts):
 *
 *   - the stop request: SIGINT and SIGTERM, caught once per process, either as a flag a
 *     polling loop reads (al_process_stop_requested), with a byte written to a wake-up fd
 *     for a loop that sleeps in poll(2), or as events on a libevent loop whose callback runs
 *     on the loop's thread (al_process_signals_on_loop);
 *   - the --metrics server (/metrics, and /healthz answering from the failure latch unless
 *     the command brings its own health);
 *   - the failure latch: the first reason wins, is logged (when the command wants it) and is
 *     what /healthz reports;
 *   - the drain deadline: a stop's budget (--drain-timeout), shared by everything the stop
 *     waits for, so that it never waits on a peer that is gone.
 *
 *   al_process_init(&p, "proxy", NULL, 1);
 *   if (al_process_metrics_start(&p, common.metrics, metrics, health, ud) != 0) goto out;
 *   al_process_signals_on_loop(&p, base, on_stop, ud);   // or al_process_catch_signals(-1)
 *   ... on_stop: al_process_drain_start(&p, drain_s); ... al_process_drain_left_ms(&p, cap)
 *   al_process_signals_off(&p, 1);                       // the final flush is not cut short
 *   al_process_metrics_stop(&p);
 */
#ifndef ARCLIGHT_HTTP_PROCESS_H
#define ARCLIGHT_HTTP_PROCESS_H

#include "http/server.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

struct event;
struct event_base;

typedef struct al_process al_process;

/* A stop signal on a libevent loop: runs on the loop's thread, for every SIGINT/SIGTERM (a
 * second one may mean "now"). */
typedef void (*al_process_stop_fn)(al_process *p, int sig, void *ud);

struct al_process {
    const char *comp;        /* log component (borrowed, e.g. "batch") */
    const char *health_text; /* /healthz reason once failed; NULL: the failure reason itself */
    int log_failures;        /* 1: al_process_fail logs the reason as an error when it latches */
    atomic_int failed;
    char reason[512];
    int64_t drain_deadline_us; /* al_mono_us() by which the stop must be done; 0: not stopping */
    al_http_server *http;      /* --metrics; NULL: none */
    struct event *sig[2];      /* SIGINT, SIGTERM on a loop (al_process_signals_on_loop) */
    al_process_stop_fn on_stop;
    void *stop_ud;
};

/* Starts healthy, not stopping, without a metrics server. comp and health_text are borrowed
 * and must outlive p. */
void al_process_init(al_process *p, const char *comp, const char *health_text, int log_failures);

/* Serves metrics at hostport (NULL: nothing to start) on the server's own thread, /healthz
 * from health (NULL: al_process_health on p). 0, or -1 with the error logged. */
int al_process_metrics_start(al_process *p, const char *hostport, al_metrics *metrics,
                             al_http_health_fn health, void *health_ud);
/* Stops the metrics server (before what it renders is freed). Idempotent. */
void al_process_metrics_stop(al_process *p);

/* Makes SIGINT and SIGTERM set the process-wide stop request (one skeleton per process); with
 * wake_fd >= 0 each also writes a byte to it (a pipe a poll(2) loop watches). */
void al_process_catch_signals(int wake_fd);
/* 1 once SIGINT or SIGTERM arrived after al_process_catch_signals or on a loop. */
int al_process_stop_requested(void);
/* The signal that asked for the stop (SIGINT or SIGTERM), 0 while none did. */
int al_process_stop_signal(void);

/* SIGINT and SIGTERM as events on base: each sets the stop request and calls fn(p, sig, ud) on
 * the loop's thread. SIGPIPE is ignored. 0, or -1 with the error logged. */
int al_process_signals_on_loop(al_process *p, struct event_base *base, al_process_stop_fn fn,
                               void *ud);
/* After the loop: the signal events are freed; with ignore, later SIGINT/SIGTERM are
 * ignored, so that a final flush (bounded by the drain deadline) is not cut short (without,
 * they act as by default). Idempotent. */
void al_process_signals_off(al_process *p, int ignore);

/* Starts the stop's budget of seconds (once: a second call keeps the first deadline). */
void al_process_drain_start(al_process *p, double seconds);
/* Milliseconds left of the budget, at most cap; cap before al_process_drain_start. */
int al_process_drain_left_ms(const al_process *p, int cap);
/* 1 once the drain started and its deadline passed. */
int al_process_drain_over(const al_process *p);

/* Latches the first failure: formats its reason (truncated to 511 bytes), logs it when p logs
 * failures, and makes al_process_failed and /healthz report it. Later calls do nothing, so
 * the root cause stays the one reported. */
void al_process_fail(al_process *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void al_process_vfail(al_process *p, const char *fmt, va_list ap);
/* 1 once al_process_fail was called (safe from any thread). */
int al_process_failed(const al_process *p);
/* The latched reason ("" while healthy). Valid as long as p. */
const char *al_process_reason(const al_process *p);
/* An al_http_health_fn (ud: the al_process): 0 while healthy; 1 once failed, with the
 * health_text (or the failure reason) in `reason`. Safe on the metrics server's thread. */
int al_process_health(void *ud, char *reason, size_t reasonlen);

#endif
