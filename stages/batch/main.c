/*
 * main.c: `arclight batch`, the batching stage's worker. Consumes arclight.transitions (a
 * consumer-group member) and follows arclight.policy (assign-based, from the beginning);
 * hands transitions to the batcher (batcher.h) and writes each step's chunks to
 * arclight.batches keyed by model.
 *
 * Delivery. A transition's input stays open while the batcher holds it; once every chunk of
 * the step it went into is acknowledged, the step's inputs are ended, so a stored offset never
 * passes a transition whose step is not on the broker. Duplicates, dead letters and stale
 * drops end their input at once (a dead letter once it is acknowledged).
 *
 * Restart. Before consuming, the worker reads back the tail of the output topic (the last
 * --recover-chunks messages of each partition): per model, the last step whose chunks are all
 * there sets the next step number, and the transition ids of complete steps enter the
 * duplicate window, so that inputs re-read after a crash are not emitted twice. A step cut
 * short by the crash (some chunks on the broker, not all) is rebuilt under the same number;
 * its chunks are sent again from chunk 0, so a reader keeps, for each step, the chunks that
 * follow the last chunk 0 it saw.
 *
 * Exactly once (--exactly-once: kafka/stage.h's transactions). A step is sent whole within
 * one turn of the loop, so its chunks always share one transaction, committed with the
 * offsets its transitions freed; the read-back at start is read_committed, so a step cut
 * short by a crash was aborted and is simply made again, and a committed one's transitions
 * are duplicates when re-read. An aborted transaction (a chunk not delivered through a broker
 * outage, partitions lost) is undone in the worker as a restart would: the steps in flight and
 * the batcher's state are dropped, the consumer is rewound to the committed offsets, and
 * before the next input the committed chunks are read back (step numbers, ids) and the policy
 * topic read again, so the same steps are built again under the same numbers.
 *
 * One worker per consumer group: step numbers of a model come from one writer. When the group
 * takes partitions away from this worker (a second worker joined), it stops with an error
 * rather than number steps concurrently; the other worker carries on from the stored offsets.
 */
#include "batch.h"

#include "core/cli.h"
#include "core/fault.h"
#include "core/flags.h"
#include "core/log.h"
#include "core/util.h"

#include <inttypes.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define COMP "batch"

/* ---- the worker's hooks (kafka/stage.h) ------------------------------------------------------- */

/* A chunk acknowledged: a step whose chunks all are is retired at once (logged, its inputs
 * released), not at the next turn of the loop, which may be a whole poll later. */
static void on_delivery(al_stage *s, const al_delivery *d, void *ctx)
{
    (void)s;
    batch_worker *w = ctx;
    batch_flight *f = d->opaque;
    if (!f) return; /* a dead letter: the consumer's tracker handles it */
    if (d->err) {
        f->failed++;
        al_stage_fail(&w->st,
                      "chunk of %s step %" PRId64 " not delivered: %s; stopping without "
                      "storing its inputs' offsets (a restart rebuilds the step)",
                      f->step->model, f->step->step, d->reason);
        return;
    }
    f->acked++;
    if (AL_FAULT_POINTS && w->o->kill_step >= 0 && f->step->step == w->o->kill_step &&
        (w->o->kill_chunk < 0 ? f->acked == f->step->n_chunks
                              : (int64_t)f->acked == w->o->kill_chunk + 1))
        al_fault_kill(COMP, "after chunk %" PRId64 " of step %" PRId64 " was acknowledged",
                      w->o->kill_chunk, w->o->kill_step);
    batch_flights_retire(w);
}

/* The batcher dropped a transition it had taken (a stale group): counted, its input ended. */
static void on_drop(void *ctx, void *opaque, const char *reason)
{
    batch_worker *w = ctx;
    if (strcmp(reason, "stale") == 0) al_counter_inc(w->met.stale_dropped);
    al_input_end(opaque);
}

/* Exactly once, inside the abort (kafka/stage.h's rewind: every partition dropped as lost):
 * what was made since the last commit is gone from the output, so the steps in flight and
 * every group are dropped (their inputs were dropped by the consumer: ending them stores
 * nothing), and the batcher starts empty; the read-back follows before the next input
 * (recover_again), once the abort is through. */
static void undo_since_commit(batch_worker *w)
{
    char err[1024];
    batch_flights_drop(w);
    al_batcher *b = al_batcher_new(&w->o->cfg, err, sizeof err);
    if (!b) {
        al_stage_fail(&w->st, "exactly-once: after an abort: %s", err);
        return;
    }
    al_batcher_free(w->batcher);
    w->batcher = b;
    if (w->next_offset) memset(w->next_offset, 0, w->n_next_offset * sizeof *w->next_offset);
    batch_recovery_forget(w);
    batch_policy_stop(w);
    w->recover_pending = 1;
}

static void on_rebalance(al_stage *s, al_rebalance_event ev,
                         const rd_kafka_topic_partition_list_t *parts, void *ctx)
{
    batch_worker *w = ctx;
    int n;
    if (!al_stage_partitions_taken(s, ev, parts, &n)) return;
    if (s->spec->exactly_once && ev == AL_REBALANCE_LOST) {
        /* partitions lost (a session that timed out through a broker outage): the worker
         * aborts at the next turn of its loop, and its rewind calls this again */
        if (s->rewinding) undo_since_commit(w);
        return;
    }
    al_stage_fail(&w->st,
                  "the consumer group took %d partition%s of %s away from this worker (another "
                  "batch worker joined?); steps of a model must come from one worker, so this "
                  "one stops and the other continues from the stored offsets",
                  n, n == 1 ? "" : "s", w->o->input_topic);
}

/* A lane (input partition) is quiet when everything the broker had on it at the last fetch
 * has been consumed; an unknown watermark counts as quiet (the idle time alone decides).
 * Consumed is the consumer's position (al_consumer_read_to_end): input written in
 * transactions (credit --exactly-once) ends each partition with a marker, and judged by the
 * last transition the last group of such a lane never closed (t1504 with --exactly-once: 19
 * groups in no step). */
static int lane_quiet(void *ctx, int32_t lane)
{
    batch_worker *w = ctx;
    al_consumer *cons = al_stage_consumer(&w->st);
    if (lane < 0 || (size_t)lane >= w->n_next_offset || !cons) return 1;
    return al_consumer_read_to_end(cons, w->o->input_topic, lane, w->next_offset[lane]);
}

/* Where each input lane stands, for lane_quiet. */
static void note_consumed(batch_worker *w, int32_t partition, int64_t offset)
{
    if (partition < 0 || partition > 65535) return;
    if ((size_t)partition >= w->n_next_offset) {
        size_t n = (size_t)partition + 1;
        int64_t *a = realloc(w->next_offset, n * sizeof *a);
        if (!a) return;
        memset(a + w->n_next_offset, 0, (n - w->n_next_offset) * sizeof *a);
        w->next_offset = a;
        w->n_next_offset = n;
    }
    w->next_offset[partition] = offset + 1;
}

/* Before consuming: where the output stands (step numbers and ids already emitted), then the
 * latest policy version of every model, before any step is built. */
static int on_prepare(al_stage *s, void *ctx, char *errstr, size_t errlen)
{
    batch_worker *w = ctx;
    batch_opts *o = w->o;
    if (batch_recover(w, al_stage_conf(s), errstr, errlen) != 0) return -1;
    for (size_t i = 0; o->stop_after_step >= 0 && i < w->n_known; i++)
        if (al_batcher_next_step_number(w->batcher, w->known_models[i]) >= o->stop_after_step) {
            al_log_info(COMP, "%s is at step %" PRId64 " already: nothing to do (--steps %" PRId64 ")",
                        w->known_models[i], al_batcher_next_step_number(w->batcher, w->known_models[i]),
                        o->stop_after_step);
            return 1;
        }
    return batch_policy_read_to_end(w, al_stage_conf(s), errstr, errlen);
}

/* After an aborted transaction (undo_since_commit): where the committed output stands, and
 * the policy versions, as at a start. 0, or -1 (the worker is failed). */
static int recover_again(al_stage *s, batch_worker *w)
{
    char err[1024];
    w->recover_pending = 0;
    al_log_info(COMP, "exactly-once: reading back the committed chunks of %s after the abort",
                w->o->output_topic);
    if (batch_recover(w, al_stage_conf(s), err, sizeof err) != 0 ||
        batch_policy_read_to_end(w, al_stage_conf(s), err, sizeof err) != 0) {
        al_stage_fail(&w->st, "exactly-once: after an abort: %s", err);
        return -1;
    }
    return 0;
}

static void on_started(al_stage *s, void *ctx)
{
    batch_worker *w = ctx;
    batch_opts *o = w->o;
    al_log_info(COMP,
                "consuming %s as group %s; steps of %" PRId64 " %s to %s, micro-batches of %" PRId64
                " tokens, chunks under %" PRId64 " bytes",
                o->input_topic, al_stage_group(s),
                o->cfg.step_sequences ? o->cfg.step_sequences
                : o->cfg.step_groups  ? o->cfg.step_groups
                                      : o->cfg.step_tokens,
                o->cfg.step_sequences ? "sequences"
                : o->cfg.step_groups  ? "groups"
                                      : "tokens",
                o->output_topic, o->cfg.micro_batch_tokens, o->cfg.max_message_bytes);
}

static void on_message(al_stage *s, rd_kafka_message_t *m, int64_t now, void *ctx)
{
    batch_worker *w = ctx;
    batch_opts *o = w->o;
    al_producer *prod = al_stage_producer(s);
    char err[1024];
    if (w->recover_pending && recover_again(s, w) != 0) {
        rd_kafka_message_destroy(m); /* not consumed: the restart reads it again */
        return;
    }
    if (!w->n_consumed++) w->first_msg_us = now;
    w->bytes_consumed += (int64_t)m->len;
    note_consumed(w, m->partition, m->offset);
    al_input *in = al_consumer_input_begin(al_stage_consumer(s), m);
    char why[512];
    if (!m->payload || al_transition_decode(m->payload, m->len, &w->t, why, sizeof why) != 0) {
        if (!m->payload) snprintf(why, sizeof why, "empty value (tombstone): not a Transition");
        al_counter_inc(w->met.undecodable);
        if (al_deadletter_message(prod, m, why, "batch", in, err, sizeof err) != 0)
            al_stage_fail(&w->st, "cannot dead-letter %s [%d] offset %" PRId64 ": %s",
                          o->input_topic, (int)m->partition, m->offset, err);
        al_input_end(in);
    } else {
        switch (al_batcher_add(w->batcher, &w->t, m->partition, now, in, why, sizeof why)) {
        case AL_BATCH_ADDED:
            al_counter_inc(w->met.added);
            batch_recovery_check_model(w, w->t.model);
            break;
        case AL_BATCH_DUPLICATE:
            al_counter_inc(w->met.duplicate);
            al_input_end(in);
            break;
        case AL_BATCH_INVALID:
            al_counter_inc(w->met.invalid);
            al_log_warn(COMP, "%s [%d] offset %" PRId64 ": %s", o->input_topic, (int)m->partition,
                        m->offset, why);
            if (al_deadletter_message(prod, m, why, "batch", in, err, sizeof err) != 0)
                al_stage_fail(&w->st, "cannot dead-letter %s [%d] offset %" PRId64 ": %s",
                              o->input_topic, (int)m->partition, m->offset, err);
            al_input_end(in);
            break;
        }
    }
    rd_kafka_message_destroy(m);
}

static int on_tick(al_stage *s, int got, int64_t now, void *ctx)
{
    batch_worker *w = ctx;
    batch_opts *o = w->o;
    char err[1024];
    if (w->recover_pending && recover_again(s, w) != 0) return 0;
    /* Housekeeping every 10 ms, not per message: policy versions, idle groups, gauges. */
    int house = !got || now - w->last_house >= 10000;
    if (house) {
        w->last_house = now;
        batch_policy_poll(w, 0);
        al_batcher_close_idle(w->batcher, now, o->group_idle_ms * 1000, lane_quiet, w);
    }
    al_batch_step *st;
    int r;
    while (!al_stage_failed(&w->st) &&
           (r = al_batcher_next_step(w->batcher, &st, err, sizeof err)) != 0) {
        if (r < 0) {
            al_stage_fail(&w->st, "%s", err);
            break;
        }
        batch_step_send(w, st);
    }
    al_producer_poll(al_stage_producer(s), 0); /* delivery reports retire acknowledged steps */
    if (house) {
        al_batcher_stats bs;
        al_batcher_get_stats(w->batcher, &bs);
        al_gauge_set(w->met.open_groups, (double)bs.open_groups);
        al_gauge_set(w->met.queued_groups, (double)bs.queued_groups);
        al_gauge_set(w->met.queued_seqs, (double)bs.queued_sequences);
    }
    if (o->stop_after_step >= 0 && w->last_step_acked >= o->stop_after_step - 1) {
        al_log_info(COMP, "step %" PRId64 " acknowledged: stopping (--steps)", w->last_step_acked);
        return 1;
    }
    return 0;
}

/* What is in flight was flushed so that its inputs' offsets can be stored and committed. */
static void on_drained(al_stage *s, int flushed, void *ctx)
{
    (void)s, (void)flushed;
    batch_worker *w = ctx;
    if (w->steps_done && w->last_step_us > w->first_msg_us) {
        double sec = (double)(w->last_step_us - w->first_msg_us) / 1e6;
        al_log_info(COMP,
                    "consumed %" PRId64 " transitions (%.1f MB) and sent %" PRId64
                    " steps in %.3f s from the first message to the last step: %.0f "
                    "transitions/s",
                    w->n_consumed, (double)w->bytes_consumed / 1e6, w->steps_done, sec,
                    (double)w->n_consumed / sec);
    }
}

/* Inputs of transitions not in an acknowledged step stay unfinished: the consumer committed
 * only what was stored, and a restart re-reads them. Their handles are released now that the
 * consumer is gone, when releasing them can no longer store anything. */
static void on_release(al_stage *s, void *ctx)
{
    (void)s;
    batch_flights_drop(ctx);
}

static const al_stage_hooks batch_hooks = {
    .prepare = on_prepare,
    .started = on_started,
    .message = on_message,
    .tick = on_tick,
    .rebalance = on_rebalance,
    .delivery = on_delivery,
    .drained = on_drained,
    .release = on_release,
};

/* ---- flags ----------------------------------------------------------------------------------- */

/* What the flags set (batch_flags); cmd_batch puts the defaults in first. */
static struct batch_args {
    batch_opts o;
    const char *stale;                    /* NULL: not given */
    int64_t step_seq, step_tok, step_grp; /* -1: not given */
    int64_t max_msg;                      /* -1: the output topic's limit */
    int64_t dedup, drain_s;
    int exactly_once;
} arg;

static const char *const stale_policies[] = {"drop", "keep", NULL};

static const al_flag batch_flags[] = {
    {"step-sequences", 0, AL_FLAG_I64, &arg.step_seq, .lo = 1, .hi = INT64_MAX, .arg = "N",
     .help = "close a step at >= N sequences of whole groups (default 64)"},
    {"step-tokens", 0, AL_FLAG_I64, &arg.step_tok, .lo = 1, .hi = INT64_MAX, .arg = "N",
     .help = "close a step at >= N tokens instead"},
    {"step-groups", 0, AL_FLAG_I64, &arg.step_grp, .lo = 1, .hi = INT64_MAX, .arg = "N",
     .help = "close a step at N whole groups instead (what\n"
             "`arclight rollouts --step-groups N` paces on)"},
    {"micro-batch-tokens", 0, AL_FLAG_I64, &arg.o.cfg.micro_batch_tokens, .lo = 2,
     .hi = INT64_MAX, .arg = "N", .help = "token budget of one micro-batch (default 16384)"},
    {"max-message-bytes", 0, AL_FLAG_I64, &arg.max_msg, .lo = 1024, .hi = INT64_MAX, .arg = "N",
     .help = "BatchChunk size limit (default: the output topic's\n"
             "max.message.bytes in topics.conf minus 64 KiB)"},
    {"max-staleness", 0, AL_FLAG_I64, &arg.o.cfg.max_staleness, .lo = -1, .hi = INT64_MAX,
     .arg = "N",
     .help = "versions a sample may lag the latest policy (default 4;\n"
             "-1: no bound)"},
    {"stale", 0, AL_FLAG_STRING, &arg.stale, .arg = "drop|keep", .choices = stale_policies,
     .help = "a group with a stale sample: dropped and counted\n"
             "(default), or kept and counted"},
    {"whiten", 0, AL_FLAG_SWITCH, &arg.o.cfg.whiten,
     .help = "whiten advantages over each step's loss tokens"},
    {"group-idle-ms", 0, AL_FLAG_I64, &arg.o.group_idle_ms, .lo = 1, .hi = INT64_MAX,
     .arg = "MS",
     .help = "close a group after MS without a transition, once its\n"
             "partition is read to its end (default 2000)"},
    {"dedup-window", 0, AL_FLAG_I64, &arg.dedup, .lo = 0, .hi = INT64_MAX, .arg = "N",
     .help = "transition ids remembered for duplicates (default 1000000)"},
    {"recover-chunks", 0, AL_FLAG_I64, &arg.o.recover_chunks, .lo = 0, .hi = INT64_MAX,
     .arg = "N", .help = "chunks per output partition read back at start (default 64)"},
    {"input-topic", 0, AL_FLAG_STRING, &arg.o.input_topic, .arg = "T",
     .help = "default arclight.transitions"},
    {"output-topic", 0, AL_FLAG_STRING, &arg.o.output_topic, .arg = "T",
     .help = "default arclight.batches"},
    {"policy-topic", 0, AL_FLAG_STRING, &arg.o.policy_topic, .arg = "T",
     .help = "default arclight.policy"},
    {"group", 0, AL_FLAG_STRING, &arg.o.group, .arg = "ID",
     .help = "consumer group (default arclight-batch); one worker per group"},
    {"steps", 0, AL_FLAG_I64, &arg.o.stop_after_step, .lo = 1, .hi = INT64_MAX, .arg = "N",
     .help = "exit 0 once step N-1 of a model is acknowledged"},
    {"drain-timeout", 0, AL_FLAG_I64, &arg.drain_s, .lo = 0, .hi = INT64_MAX, .arg = "S",
     .help = "on SIGTERM, at most S seconds (default 15) to flush\n"
             "steps, commit and leave the group, whether or not\n"
             "Kafka answers"},
    {"exactly-once", 0, AL_FLAG_SWITCH, &arg.exactly_once,
     .help = "Kafka transactions: each step's chunks and the offsets\n"
             "of its transitions are committed together, and the\n"
             "read-back at start sees committed chunks only, so no\n"
             "chunk reaches a read_committed reader twice, also\n"
             "across kill -9 (transactional.id: the worker's static\n"
             "member id; real Kafka, see docs/RELIABILITY.md)"},
};

static const al_cmd_spec batch_spec = {
    "batch",
    "[flags]",
    "Packs transitions into trainer steps: whole groups adding up to a target, cut into\n"
    "token-budgeted micro-batches (sequence packing), sent as BatchChunk messages.\n",
    batch_flags,
    AL_ARRAY_LEN(batch_flags),
    .common = 1,
};

/* The defaults of every flag. */
static void batch_args_init(void)
{
    memset(&arg, 0, sizeof arg);
    arg.o = (batch_opts){
        .input_topic = AL_TOPIC_TRANSITIONS,
        .output_topic = AL_TOPIC_BATCHES,
        .policy_topic = AL_TOPIC_POLICY,
        .group = "arclight-batch",
        .group_idle_ms = 2000,
        .recover_chunks = 64,
        .stop_after_step = -1,
        .kill_step = -1,
        .kill_chunk = -1,
    };
    al_batch_config_default(&arg.o.cfg);
    arg.step_seq = arg.step_tok = arg.step_grp = arg.max_msg = -1;
    arg.dedup = (int64_t)arg.o.cfg.dedup_window;
    arg.drain_s = AL_STAGE_DRAIN_DEFAULT_S;
}

/* Default chunk limit: the output topic's max.message.bytes (topics.conf) less 64 KiB for
 * Kafka's record-batch framing; 1 MiB less that when the file does not say. */
static int64_t default_max_message_bytes(const char *topic)
{
    char path[1024], err[512];
    al_topic_spec *t = NULL;
    size_t n = 0;
    int64_t limit = 1048576;
    al_kafka_config_file_path("topics.conf", path, sizeof path);
    if (al_topics_load(path, &t, &n, err, sizeof err) == 0) {
        for (size_t i = 0; i < n; i++) {
            if (strcmp(t[i].name, topic) != 0) continue;
            const char *v = al_kafka_conf_get(t[i].settings, "max.message.bytes");
            if (v && atoll(v) > 65536 * 2) limit = atoll(v);
        }
        al_topics_free(t, n);
    }
    return limit - 65536;
}

/* Runs the worker on the stage skeleton (kafka/stage.h) until --steps, a signal or a failure:
 * the exit status. */
static int batch_run(batch_opts *o, const al_cli_common *common, int64_t drain_s,
                     int exactly_once)
{
    /* A step's sequences (tens of MB at large steps) are freed and the next step's allocated
     * right after: without this, glibc trims the heap and maps it again each step, and page
     * faults take most of the time (bench_batch: 3x at 1024-sequence steps). */
    mallopt(M_TRIM_THRESHOLD, 512 << 20);
    mallopt(M_MMAP_THRESHOLD, 64 << 20);

    char err[1024];
    batch_worker w = {.o = o, .last_step_acked = -1};
    al_stage_init(&w.st, COMP, "the batch worker stopped on an error", 1);
    al_stage_keep_freed_memory();
    o->cfg.on_drop = on_drop;
    o->cfg.on_drop_ctx = &w;
    w.batcher = al_batcher_new(&o->cfg, err, sizeof err);
    if (!w.batcher)
        return al_cli_usage_error("batch", "%s", err + (strncmp(err, "batch: ", 7) ? 0 : 7));

    int rc = AL_EXIT_FAILURE;
    w.met.reg = al_metrics_new();
    if (!w.met.reg) goto out;
    batch_metrics_init(&w.met);
    al_metrics_add_process_metrics(w.met.reg);
    const char *outs[] = {o->output_topic, NULL};
    /* A worker that loses its partitions stops (on_rebalance), so it keeps a longer session
     * on the embedded broker than the 4 s the stages that hand partitions on have. */
    static const char *const conf_defaults[] = {AL_KAFKA_EMBEDDED_SESSION, "10000", NULL};
    al_stage_spec spec = {
        .common = common,
        .group = o->group,
        .input = o->input_topic,
        .outputs = outs,
        .conf_defaults = conf_defaults,
        .metrics = w.met.reg,
        .poll_ms = 50,
        .drain_s = (double)drain_s,
        .hooks = &batch_hooks,
        .ud = &w,
        .exactly_once = exactly_once,
    };
    rc = al_stage_run(&w.st, &spec);
out:
    al_transition_clear(&w.t);
    batch_policy_stop(&w);
    al_policy_version_clear(&w.pv);
    al_batcher_free(w.batcher);
    free(w.next_offset);
    batch_recovery_forget(&w);
    free(w.known_models);
    al_metrics_free(w.met.reg);
    return rc;
}

int cmd_batch(int argc, char **argv)
{
    al_cli_common common;
    al_cli_common_init(&common);
    batch_args_init();
    int first;
    int rc = al_flags_parse(&batch_spec, &common, argc, argv, &first);
    if (rc != AL_FLAGS_GO) return rc;
    if (first < argc) return al_cli_usage_error("batch", "unexpected argument '%s'", argv[first]);
    if ((arg.step_seq > 0) + (arg.step_tok > 0) + (arg.step_grp > 0) > 1)
        return al_cli_usage_error(
            "batch", "give one of --step-sequences, --step-tokens and --step-groups");
    batch_opts *o = &arg.o;
    if (arg.stale)
        o->cfg.stale_policy =
            strcmp(arg.stale, "keep") ? AL_BATCH_STALE_DROP : AL_BATCH_STALE_KEEP;
    o->cfg.dedup_window = (size_t)arg.dedup;
    if (arg.step_tok > 0) {
        o->cfg.step_tokens = arg.step_tok;
        o->cfg.step_sequences = 0;
    } else if (arg.step_grp > 0) {
        o->cfg.step_groups = arg.step_grp;
        o->cfg.step_sequences = 0;
    } else if (arg.step_seq > 0) {
        o->cfg.step_sequences = arg.step_seq;
    }
    o->cfg.max_message_bytes =
        arg.max_msg > 0 ? arg.max_msg : default_max_message_bytes(o->output_topic);
    /* A fault point (core/fault.h): "STEP:CHUNK" SIGKILLs the worker once that chunk of that
     * step is acknowledged (CHUNK -1: the step's last chunk), before its inputs are released. */
    const char *kill_at = al_fault_spec("ARCLIGHT_BATCH_TEST_KILL_AT");
    if (kill_at && sscanf(kill_at, "%" SCNd64 ":%" SCNd64, &o->kill_step, &o->kill_chunk) != 2)
        o->kill_step = -1;

    return batch_run(o, &common, arg.drain_s, arg.exactly_once);
}
