/*
 * stage.h: the skeleton every consuming stage worker (credit, batch, train) shares around
 * its own loop: a fatal-error latch, the /healthz answer built on it, SIGINT/SIGTERM as a
 * stop request, and the guard of a rebalance callback for stages that must own all of
 * their input's partitions.
 *
 *   al_stage st;
 *   al_stage_init(&st, "batch", "the batch worker stopped on an error", 1);
 *   srv = al_http_server_start(common.metrics, reg, al_stage_health, &st, err, sizeof err);
 *   al_stage_catch_signals();
 *   while (!al_stage_stop_requested() && !al_stage_failed(&st)) {
 *       ... al_consumer_poll; on an error that must stop the worker:
 *       al_stage_fail(&st, "cannot dead-letter %s: %s", ..);
 *   }
 *   return al_stage_failed(&st) ? AL_EXIT_FAILURE : AL_EXIT_OK;
 *
 * The latch is set from the worker's thread (its loop, delivery and rebalance callbacks) and
 * read from the metrics server's thread too; the first reason wins and is never rewritten.
 * Nothing here needs freeing. lib/http is not linked in: al_stage_health merely has the
 * shape of al_http_health_fn.
 */
#ifndef ARCLIGHT_KAFKA_STAGE_H
#define ARCLIGHT_KAFKA_STAGE_H

#include "kafka/kafka.h"

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

typedef struct al_stage {
    const char *comp;        /* log component (borrowed, e.g. "batch") */
    const char *health_text; /* /healthz reason once failed; NULL: the failure reason itself */
    int log_failures;        /* 1: al_stage_fail logs the reason as an error when it latches */
    atomic_int failed;
    char reason[512];
    int64_t drain_deadline_us; /* al_mono_us() by which the stop must be done; 0: not stopping */
} al_stage;

/* The stop budget every consuming stage takes as --drain-timeout S: from the moment the loop
 * ends, flushing outputs, the last commit and leaving the group all share S seconds, so that
 * a stop never waits on a broker that is gone (what is not committed by then is read again
 * after a restart: at least once). */
#define AL_STAGE_DRAIN_DEFAULT_S 15
void al_stage_drain_start(al_stage *s, double seconds);
/* Milliseconds left of the budget, at most cap; cap before al_stage_drain_start. */
int al_stage_drain_left_ms(const al_stage *s, int cap);

/* Starts healthy. comp and health_text are borrowed and must outlive the stage. */
void al_stage_init(al_stage *s, const char *comp, const char *health_text, int log_failures);

/* For stages (and the embedded broker) that stream hundreds of MB through librdkafka: glibc
 * keeps freed blocks of up to 32 MB (fetch responses, decompressed message sets) for reuse
 * and returns memory to the system only past 256 MB free, instead of mapping and unmapping
 * each large buffer, which cost the consumer's thread a third of its time in page faults.
 * Process-wide; call it once at the start of the command. Logs (debug) and carries on if
 * glibc refuses. */
void al_stage_keep_freed_memory(void);

/* Latches the first failure: formats its reason (truncated to 511 bytes), logs it when the
 * stage logs failures, and makes al_stage_failed and /healthz report it. Later calls do
 * nothing, so the root cause stays the one reported. */
void al_stage_fail(al_stage *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* 1 once al_stage_fail was called. */
int al_stage_failed(const al_stage *s);

/* The latched reason ("" while healthy). Valid as long as the stage. */
const char *al_stage_reason(const al_stage *s);

/* An al_http_health_fn (ud: the al_stage): 0 while healthy; 1 once failed, with the stage's
 * health_text (or its failure reason) in `reason`. Safe on the metrics server's thread. */
int al_stage_health(void *ud, char *reason, size_t reasonlen);

/* Makes SIGINT and SIGTERM set the process-wide stop request (one worker per process). */
void al_stage_catch_signals(void);

/* 1 once SIGINT or SIGTERM arrived after al_stage_catch_signals. */
int al_stage_stop_requested(void);

/* For a stage that must be the only member of its group (steps and versions of a model come
 * from one writer): 1 when a rebalance event takes partitions from this worker while it is
 * meant to run, with their number in *count (0 when librdkafka gave no list), so that the
 * caller fails in its own words; 0 when the event is an assignment, an empty list, or the
 * worker is stopping (a stop request, or `closing`: its own consumer is being closed). */
int al_stage_partitions_taken(al_rebalance_event ev, const rd_kafka_topic_partition_list_t *parts,
                              int closing, int *count);

/* Sets the rebalance callback (may be NULL) and subscribes c to the one topic `topic`.
 * 0, or -1 with errstr as al_consumer_subscribe gives it. */
int al_stage_subscribe(al_consumer *c, const char *topic, al_rebalance_fn on_rebalance, void *ctx,
                       char *errstr, size_t errlen);

/* A stage flag's whole decimal number, at least lo: 0 with *out set, or -1 (not a number,
 * trailing text, out of range, below lo) leaving *out as it was. */
int al_stage_parse_i64(const char *s, int64_t lo, int64_t *out);

#endif
