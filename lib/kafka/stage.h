/*
 * stage.h: the one worker every consuming stage (credit, batch, train) runs on. The stage
 * brings its flags, its metrics and its callbacks; the worker does the rest, in this order:
 *
 *   1. client settings: the shared layering (kafka.h) from --bootstrap/--config, plus the
 *      stage's own defaults where nothing configured them;
 *   2. the --metrics server, whose /healthz answers from the stage's failure latch;
 *   3. SIGINT/SIGTERM as a stop request;
 *   4. the producer (delivery reports to the stage), its output topics' metadata learnt;
 *   5. the stage's prepare: what it must know before its first input (batch reads back its
 *      output and the policy topic, train loads its checkpoint and publishes its version);
 *   6. the consumer in the stage's group, linked to the producer, subscribed to the input;
 *   7. the loop: poll, the stage's message callback for each message, its tick after every
 *      poll; until a stop request, a failure, or the tick says the work is done;
 *   8. the drain, within --drain-timeout: the stage's stopping callback (train's exit
 *      checkpoint), the producer flushed, the stage's drained callback, the stored offsets
 *      committed, the group left;
 *   9. the stage's release callback (inputs still held are ended once nothing can be stored
 *      for them), the producer and the metrics server freed.
 *
 *   static const al_stage_hooks hooks = {.message = on_message, .tick = on_tick, ...};
 *   al_stage_init(&x.st, "credit", NULL, 0);
 *   al_stage_spec spec = {.common = &common, .group = "arclight-credit", .input = in,
 *                         .outputs = outs, .metrics = reg, .drain_s = 15, .poll_ms = 100,
 *                         .hooks = &hooks, .ud = &x};
 *   return al_stage_run(&x.st, &spec);
 *
 * Callbacks run on the worker's thread (the loop, and inside polls, flushes and the close);
 * an error that must stop the worker is latched with al_stage_fail, and the loop ends at the
 * next turn. The latch is read from the metrics server's thread too; the first reason wins
 * and is never rewritten.
 *
 * The process part of the worker (signals, the stop request, the metrics server, the failure
 * latch, the drain budget) is lib/http/process.h's, which the servers (proxy, serve,
 * rollouts) run on too; the al_stage_ names below are that skeleton's, on the stage's
 * al_process. The pieces are also usable alone (the latch, the drain budget, the signal
 * flag, the rebalance guard).
 *
 * Exactly once (spec.exactly_once, a stage's --exactly-once). The outputs and the input
 * offsets go to Kafka in transactions instead of being produced and committed apart:
 *
 *   - transactional.id is the worker's static membership id, INSTANCE.GROUP.SLOT (member.c),
 *     which the consumer joins the group under too: the same worker restarted after kill -9
 *     takes the same id, and its InitProducerId fences the dead one's producer and aborts
 *     the transaction it left open before the new one reads anything. A worker without such
 *     an id (ARCLIGHT_INSTANCE_ID=none, group.instance.id=none) refuses to start.
 *   - every auto.commit.interval.ms (client.conf: 1 s), after a poll: the producer flushed,
 *     the consumer's committable offsets (al_consumer_committable: per partition the first
 *     input whose outputs are not all acknowledged, so what the stage still holds open is
 *     read again after a restart, as in at-least-once mode) sent to the transaction with the
 *     consumer's group metadata, with the stage's offset_metadata next to each, then the
 *     commit; so a partition's committed offset moves exactly when the outputs made from
 *     the inputs before it become visible, and never otherwise. The same commit runs where
 *     the consumer would commit (a revoke, the drain, the close).
 *   - an abortable error (a failed delivery in the transaction: the stage's delivery hook is
 *     not told of it, nor does the consumer stop on it; a refused commit; a commit still
 *     retriable after three tries; outputs not acknowledged once the transaction is past its
 *     transaction.timeout.ms), or partitions lost (a session timeout, a fencing of the static
 *     member): the transaction is aborted, every assigned partition is dropped as lost (the
 *     rebalance hook drops the stage's state for it) and sought back to its committed
 *     offset, and the work since the last commit is done again. An abort that finds no
 *     coordinator (the broker down) is tried again until it is back, or until a stop request.
 *   - transaction.timeout.ms (60 s unless configured; message.timeout.ms is cut to it) bounds
 *     an open transaction: past it the coordinator aborts it and bumps the producer epoch,
 *     which librdkafka 2.0.2 reports as a fatal fencing. A fencing of a transaction open past
 *     its timeout is that (a broker outage longer than the timeout), and the worker carries
 *     on with a new producer under the same transactional.id, from the committed offsets.
 *   - any other fatal error (the producer fenced: another worker took this transactional.id)
 *     stops the worker with that reason; a failed run aborts its open transaction.
 *   - every reader in the worker reads with isolation.level=read_committed (librdkafka's
 *     default, enforced here), so aborted outputs of an upstream transactional stage are
 *     never inputs.
 */
#ifndef ARCLIGHT_KAFKA_STAGE_H
#define ARCLIGHT_KAFKA_STAGE_H

#include "kafka/kafka.h"

#include "http/process.h"

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

typedef struct al_metrics al_metrics;
typedef struct al_http_server al_http_server;
typedef struct al_stage al_stage;

typedef struct al_stage_hooks {
    /* After the producer exists, before the consumer joins: 0 to go on, 1 when there is
     * nothing to do (a clean exit, status 0, without consuming), -1 with errstr (logged; the
     * stage exits 1). NULL: nothing to prepare. */
    int (*prepare)(al_stage *s, void *ud, char *errstr, size_t errlen);
    /* Once subscribed (the stage's "consuming ..." line). NULL: none. */
    void (*started)(al_stage *s, void *ud);
    /* One consumed message (end-of-partition events never come here); the callback owns m
     * and destroys it or keeps it. */
    void (*message)(al_stage *s, rd_kafka_message_t *m, int64_t now_us, void *ud);
    /* After every poll (got: 1 when it brought a message): timers, steps, gauges. Returns 1
     * when the work is done (--steps, --max-spans, --exit-idle: the drain follows as for a
     * stop request), 0 to go on. NULL: none. */
    int (*tick)(al_stage *s, int got, int64_t now_us, void *ud);
    /* Partitions assigned, revoked or lost (kafka.h's al_rebalance_event). NULL: none. */
    void (*rebalance)(al_stage *s, al_rebalance_event ev,
                      const rd_kafka_topic_partition_list_t *parts, void *ud);
    /* The producer's delivery reports (kafka.h's al_delivery). NULL: none. */
    void (*delivery)(al_stage *s, const al_delivery *d, void *ud);
    /* The loop ended without a failure; before the final flush. NULL: none. */
    void (*stopping)(al_stage *s, void *ud);
    /* After the final flush (flushed: 1 when every output was acknowledged), before the last
     * commit: what is acknowledged can be released now. NULL: none. */
    void (*drained)(al_stage *s, int flushed, void *ud);
    /* After the consumer is closed: inputs still held are ended here (their offsets can no
     * longer be stored: a restart reads them again). NULL: none. */
    void (*release)(al_stage *s, void *ud);
    /* Exactly-once mode: the metadata string committed with `offset` of topic [partition]
     * (the consumer hands it back with that offset: al_consumer_committed_metadata), at most
     * len - 1 bytes into buf; returns its length (0: none). NULL: none. */
    size_t (*offset_metadata)(al_stage *s, const char *topic, int32_t partition, int64_t offset,
                              char *buf, size_t len, void *ud);
} al_stage_hooks;

typedef struct al_stage_spec {
    const al_cli_common *common; /* --bootstrap, --config, --metrics */
    const char *group;           /* consumer group (al_stage_set_group may change it) */
    const char *input;           /* the topic consumed */
    const char *const *outputs;  /* topics produced to (NULL-terminated; NULL: none) */
    /* client settings the stage wants unless configured: key, value, ..., NULL (may be NULL) */
    const char *const *conf_defaults;
    al_metrics *metrics; /* served at common->metrics (borrowed: outlives al_stage_run) */
    int poll_ms;         /* the longest one poll waits */
    double drain_s;      /* --drain-timeout: AL_STAGE_DRAIN_DEFAULT_S */
    const al_stage_hooks *hooks;
    void *ud; /* handed to every hook */
    int exactly_once; /* 1: transactions (see the top of this file) */
} al_stage_spec;

struct al_stage {
    al_process proc; /* log component, failure latch, drain deadline, --metrics server */
    /* the worker (al_stage_run) */
    const al_stage_spec *spec;
    const char *group;
    al_kafka_conf *conf;
    al_producer *producer;
    al_consumer *consumer;
    int closing; /* the consumer is being closed: its revokes are the stage's own doing */
    /* exactly-once mode (stage.c) */
    int member_lock_fd;      /* the member slot's lock (member.c), -1: none */
    char txn_id[256];        /* transactional.id = group.instance.id */
    int txn_open;            /* a transaction is begun */
    int txn_abort;           /* abort and rewind at the next turn of the loop */
    int rewinding;           /* inside an abort: purged deliveries are not the stage's */
    int txn_renew;           /* the coordinator timed the transaction out: a new producer */
    uint64_t txn_renewals;
    int64_t txn_next_us, txn_every_us;
    int64_t txn_begun_us;    /* when the open transaction began */
    int64_t txn_timeout_us;  /* its transaction.timeout.ms: the coordinator aborts it after */
    unsigned long long txn_sent; /* the producer's al_producer_sent at the last commit */
    rd_kafka_topic_partition_list_t *txn_offsets; /* what the last commit committed */
    uint64_t txn_commits, txn_aborts;
};

/* Starts healthy. comp and health_text are borrowed and must outlive the stage. */
void al_stage_init(al_stage *s, const char *comp, const char *health_text, int log_failures);

/* Runs the worker as described at the top of this file. Returns the exit status:
 * AL_EXIT_OK after a stop request or a done tick with every output acknowledged and the
 * offsets committed, AL_EXIT_FAILURE after a failure (the reason latched and logged) or a
 * drain that did not finish. Everything the worker made is freed when it returns; the
 * stage's own state (and spec's metrics) is the caller's. */
int al_stage_run(al_stage *s, const al_stage_spec *spec);

/* What the worker made, for the hooks (NULL before it exists and after it is freed). */
al_producer *al_stage_producer(const al_stage *s);
al_consumer *al_stage_consumer(const al_stage *s);
const al_kafka_conf *al_stage_conf(const al_stage *s);
/* The group the consumer joins; in prepare, before it does, the stage may change it
 * (borrowed: must outlive the run). */
const char *al_stage_group(const al_stage *s);
void al_stage_set_group(al_stage *s, const char *group);

/* The stop budget every consuming stage takes as --drain-timeout S: from the moment the loop
 * ends, flushing outputs, the last commit and leaving the group all share S seconds, so that
 * a stop never waits on a broker that is gone (what is not committed by then is read again
 * after a restart: at least once). */
#define AL_STAGE_DRAIN_DEFAULT_S 15
void al_stage_drain_start(al_stage *s, double seconds);
/* Milliseconds left of the budget, at most cap; cap before al_stage_drain_start. */
int al_stage_drain_left_ms(const al_stage *s, int cap);

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
 * worker is stopping (a stop request, or its own consumer being closed). */
int al_stage_partitions_taken(const al_stage *s, al_rebalance_event ev,
                              const rd_kafka_topic_partition_list_t *parts, int *count);

#endif
