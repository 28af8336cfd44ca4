/*
 * batch.h: what the files of `arclight batch` share: its options, its metrics and the worker.
 *
 *   main.c      the command: delivery contract, flags, the worker's hooks (kafka/stage.h)
 *   flights.c   steps in flight: sent chunk by chunk, retired in order once acknowledged
 *   recovery.c  the read-back of the output topic at start (step numbers, ids already out)
 *   policy.c    arclight.policy followed: the latest version of each model, for staleness
 *   batcher.c   the batching itself, no Kafka in it (batcher.h)
 */
#ifndef ARCLIGHT_STAGES_BATCH_BATCH_H
#define ARCLIGHT_STAGES_BATCH_BATCH_H

#include "batcher.h"

#include "avro/codec.h"
#include "http/metrics.h"
#include "kafka/follower.h"
#include "kafka/kafka.h"
#include "kafka/stage.h"

#include <stddef.h>
#include <stdint.h>

typedef struct batch_opts {
    const char *input_topic, *output_topic, *policy_topic, *group;
    al_batch_config cfg;
    int64_t group_idle_ms;
    int64_t recover_chunks;
    int64_t stop_after_step; /* -1: run until a signal */
    int64_t kill_step, kill_chunk; /* fault point: SIGKILL self after this chunk is acked */
} batch_opts;

typedef struct batch_metrics {
    al_metrics *reg;
    al_counter *added, *duplicate, *invalid, *undecodable, *stale_dropped, *stale_kept;
    al_counter *steps, *chunks, *tokens, *capacity;
    al_histogram *step_tokens, *step_seqs, *lag, *efficiency_h;
    al_gauge *efficiency, *open_groups, *queued_groups, *queued_seqs, *policy_version,
        *lag_unknown;
} batch_metrics;

/* A step sent and not yet acknowledged whole; each chunk's delivery opaque. */
typedef struct batch_flight {
    al_batch_step *step;
    size_t acked, failed;
    struct batch_flight *next;
} batch_flight;

typedef struct batch_worker {
    batch_opts *o;
    al_batcher *batcher;
    al_follower *policy;  /* arclight.policy, from its beginning (policy.c) */
    al_policy_version pv; /* decoded policy version, reused per record */
    batch_metrics met;
    batch_flight *flights; /* oldest first */
    int64_t steps_done, last_step_acked;
    int64_t n_consumed, bytes_consumed, first_msg_us, last_step_us;
    int64_t *next_offset; /* per input partition: one past the last offset consumed */
    size_t n_next_offset;
    /* models whose step number came from the read-back (or were warned about), and whether
     * the read-back window left older chunks unread on some partition (recovery.c) */
    char **known_models;
    size_t n_known;
    int recover_truncated;
    al_stage st; /* the worker (kafka/stage.h): failure latch, /healthz, producer, consumer */
    al_transition t; /* decoded input, reused per message */
    int64_t last_house;
    int recover_pending; /* exactly-once: a transaction was aborted; read back before going on */
} batch_worker;

/* ---- flights.c ---------------------------------------------------------------------------- */

/* Registers the stage's metrics in m->reg (which the caller made). */
void batch_metrics_init(batch_metrics *m);

/* Sends every chunk of a step (takes ownership of st): the step is in flight from then on, a
 * chunk's delivery report names it. 0, or -1 with the worker failed. */
int batch_step_send(batch_worker *w, al_batch_step *st);

/* Retires the steps at the head of the flights whose chunks are all acknowledged: logged,
 * counted, their inputs ended (their offsets may be stored), and the offsets committed. */
void batch_flights_retire(batch_worker *w);

/* Drops the steps in flight and every group the batcher holds, ending their inputs (a revoke,
 * an aborted transaction, the end). */
void batch_flights_drop(batch_worker *w);

/* ---- recovery.c --------------------------------------------------------------------------- */

/* Reads back the last --recover-chunks messages of each partition of the output topic: sets
 * each model's next step number and marks the ids of complete steps seen in the batcher. 0, or
 * -1 with errstr. */
int batch_recover(batch_worker *w, const al_kafka_conf *kc, char *errstr, size_t errlen);

/* A model met in the input: warns once when its steps start at 0 although the read-back window
 * may have missed its earlier steps. */
void batch_recovery_check_model(batch_worker *w, const char *model);

/* Forgets the models the read-back knew (an abort, before reading back again; the end). */
void batch_recovery_forget(batch_worker *w);

/* ---- policy.c ----------------------------------------------------------------------------- */

/* Follows the policy topic afresh and reads it from its beginning to its end (the latest
 * version of every model). 0, or -1 with errstr. */
int batch_policy_read_to_end(batch_worker *w, const al_kafka_conf *kc, char *errstr,
                             size_t errlen);

/* Applies every policy version available now (waiting up to timeout_ms for the first). */
void batch_policy_poll(batch_worker *w, int timeout_ms);

/* Stops following (freed; read_to_end follows again). */
void batch_policy_stop(batch_worker *w);

#endif
