/*
 * stage.c: the stage worker (stage.h): the run, and the pieces it is made of (failure latch,
 * health answer, stop request, drain budget).
 */
#include "kafka/stage.h"

#include "kafka/internal.h"

#include "core/cli.h"
#include "core/fault.h"
#include "core/log.h"
#include "core/util.h"
#include "http/metrics.h"
#include "http/server.h"

#include <errno.h>
#include <malloc.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void al_stage_keep_freed_memory(void)
{
#ifdef M_MMAP_THRESHOLD
    /* 32 MB is the largest mmap threshold glibc accepts on 64-bit systems */
    if (!mallopt(M_MMAP_THRESHOLD, 32 << 20) || !mallopt(M_TRIM_THRESHOLD, 256 << 20) ||
        !mallopt(M_TOP_PAD, 16 << 20))
        al_log_debug("stage", "malloc settings refused; keeping the defaults");
#endif
}

void al_stage_drain_start(al_stage *s, double seconds)
{
    al_process_drain_start(&s->proc, seconds);
}

int al_stage_drain_left_ms(const al_stage *s, int cap)
{
    return al_process_drain_left_ms(&s->proc, cap);
}

void al_stage_init(al_stage *s, const char *comp, const char *health_text, int log_failures)
{
    al_process_init(&s->proc, comp, health_text, log_failures);
    s->spec = NULL;
    s->group = NULL;
    s->conf = NULL;
    s->producer = NULL;
    s->consumer = NULL;
    s->closing = 0;
    s->member_lock_fd = -1;
    s->txn_id[0] = '\0';
    s->txn_open = s->txn_abort = s->rewinding = s->txn_renew = 0;
    s->txn_renewals = 0;
    s->txn_next_us = s->txn_every_us = 0;
    s->txn_begun_us = s->txn_timeout_us = 0;
    s->txn_sent = 0;
    s->txn_offsets = NULL;
    s->txn_commits = s->txn_aborts = 0;
}

void al_stage_fail(al_stage *s, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    al_process_vfail(&s->proc, fmt, ap);
    va_end(ap);
}

int al_stage_failed(const al_stage *s)
{
    return al_process_failed(&s->proc);
}

const char *al_stage_reason(const al_stage *s)
{
    return al_process_reason(&s->proc);
}

int al_stage_health(void *ud, char *reason, size_t reasonlen)
{
    al_stage *s = ud;
    return al_process_health(&s->proc, reason, reasonlen);
}

void al_stage_catch_signals(void)
{
    al_process_catch_signals(-1);
}

int al_stage_stop_requested(void)
{
    return al_process_stop_requested();
}

int al_stage_partitions_taken(const al_stage *s, al_rebalance_event ev,
                              const rd_kafka_topic_partition_list_t *parts, int *count)
{
    *count = 0;
    if (ev == AL_REBALANCE_ASSIGNED || al_process_stop_requested() || s->closing) return 0;
    if (parts && parts->cnt == 0) return 0;
    *count = parts ? parts->cnt : 0;
    return 1;
}

/* ------------------------------------------------------------------------------------------
 * The worker
 * ------------------------------------------------------------------------------------------ */

al_producer *al_stage_producer(const al_stage *s)
{
    return s->producer;
}

al_consumer *al_stage_consumer(const al_stage *s)
{
    return s->consumer;
}

const al_kafka_conf *al_stage_conf(const al_stage *s)
{
    return s->conf;
}

const char *al_stage_group(const al_stage *s)
{
    return s->group;
}

void al_stage_set_group(al_stage *s, const char *group)
{
    s->group = group;
}

static void stage_on_rebalance(al_consumer *c, al_rebalance_event ev,
                               const rd_kafka_topic_partition_list_t *parts, void *ctx)
{
    (void)c;
    al_stage *s = ctx;
    /* Lost partitions were never committed: the open transaction holds outputs of their
     * inputs, which their next owner makes again. Abort it (at the next turn of the loop:
     * not from inside the consumer's callback) and redo the rest from the commit. */
    if (s->spec->exactly_once && ev == AL_REBALANCE_LOST && !s->rewinding) s->txn_abort = 1;
    if (s->spec->hooks->rebalance) s->spec->hooks->rebalance(s, ev, parts, s->spec->ud);
}

static void stage_on_delivery(const al_delivery *d, void *ctx)
{
    al_stage *s = ctx;
    if (s->rewinding &&
        (d->err == RD_KAFKA_RESP_ERR__PURGE_QUEUE || d->err == RD_KAFKA_RESP_ERR__PURGE_INFLIGHT))
        return; /* an output of the aborted transaction: the stage has dropped its input */
    if (s->spec->exactly_once && d->err) {
        /* A lost output (timed out through a broker outage, refused) fails its transaction:
         * librdkafka lets it only abort. That is undone at the next turn of the loop (abort,
         * rewind, the inputs read again), not a failure of the stage, whose hook is not told:
         * it would stop on it. */
        if (!s->txn_abort && !s->rewinding)
            al_log_warn(s->proc.comp, "exactly-once: %s; the transaction is to be aborted and its "
                                 "inputs read again", d->reason);
        if (!s->rewinding) s->txn_abort = 1;
        return;
    }
    if (s->spec->hooks->delivery) s->spec->hooks->delivery(s, d, s->spec->ud);
}

/* ------------------------------------------------------------------------------------------
 * Exactly once (the top of stage.h)
 * ------------------------------------------------------------------------------------------ */

static void txn_count(al_stage *s, const char *outcome)
{
    if (s->spec->metrics)
        al_counter_inc(al_metrics_counter(s->spec->metrics, "arclight_stage_transactions_total",
                                          "Transactions of --exactly-once, by outcome", "outcome",
                                          outcome, NULL));
}

/* Latches a fatal error of the transactional producer (code: its error code) with what it
 * means; or, for a fencing of a transaction open past its transaction.timeout.ms, asks for a
 * new producer (txn_renew). */
static void txn_fatal(al_stage *s, rd_kafka_resp_err_t code, const char *what)
{
    int fenced = code == RD_KAFKA_RESP_ERR__FENCED ||
                 code == RD_KAFKA_RESP_ERR_INVALID_PRODUCER_EPOCH ||
                 code == RD_KAFKA_RESP_ERR_PRODUCER_FENCED;
    int64_t open_us = s->txn_open ? al_mono_us() - s->txn_begun_us : 0;
    /* The coordinator aborts a transaction open past its timeout (a broker outage kept it
     * from committing) and bumps the producer epoch, which librdkafka 2.0.2 reports as a
     * fencing, fatal to the producer (a commit that races that abort on a coordinator with
     * Kafka's second transaction protocol gets INVALID_TXN_STATE, fatal too). No other worker
     * is involved: a new producer with the same transactional.id carries on from the
     * committed offsets. */
    int timed_out_abort = (fenced || code == RD_KAFKA_RESP_ERR_INVALID_TXN_STATE) &&
                          s->txn_timeout_us > 0 && open_us > s->txn_timeout_us;
    if (timed_out_abort) {
        al_log_warn(s->proc.comp,
                    "exactly-once: the transaction was open %.1f s, past transaction.timeout.ms "
                    "(%.0f ms), and the coordinator aborted it (%s); making a new producer and "
                    "doing the work since the last commit again",
                    (double)open_us / 1e6, (double)s->txn_timeout_us / 1000, what);
        s->txn_renew = 1;
    } else if (fenced)
        al_stage_fail(s,
                      "exactly-once: fenced: another worker started with transactional.id %s "
                      "(this worker was restarted while still running, or two workers share "
                      "ARCLIGHT_INSTANCE_ID); stopping without committing (%s)",
                      s->txn_id, what);
    else
        al_stage_fail(s, "exactly-once: fatal transaction error, stopping: %s", what);
}

/* A transactional call's error: 0 when there is none; otherwise logs nothing, latches a
 * fatal one (with what to do), and returns 1 for an abortable one, 2 for a retriable one,
 * 3 for anything else (the caller decides). Destroys e. */
static int txn_error(al_stage *s, rd_kafka_error_t *e, const char *what, char *errstr,
                     size_t errlen)
{
    if (!e) return 0;
    int kind = rd_kafka_error_is_fatal(e)             ? 0
               : rd_kafka_error_txn_requires_abort(e) ? 1
               : rd_kafka_error_is_retriable(e)       ? 2
                                                      : 3;
    snprintf(errstr, errlen, "%s: %s (%s)", what, rd_kafka_error_string(e),
             rd_kafka_error_name(e));
    if (kind == 0) txn_fatal(s, rd_kafka_error_code(e), errstr);
    rd_kafka_error_destroy(e);
    return kind == 0 ? -1 : kind;
}

/* Begins the next transaction. 0, or -1 (latched). */
static int txn_begin(al_stage *s)
{
    char err[512];
    int k = txn_error(s, rd_kafka_begin_transaction(al_producer_handle(s->producer)),
                      "beginning a transaction", err, sizeof err);
    if (k > 0) al_stage_fail(s, "exactly-once: %s", err);
    if (k) return -1;
    s->txn_open = 1;
    s->txn_begun_us = al_mono_us();
    return 0;
}

/* Aborts the open transaction and rewinds the consumer to its committed offsets (the stage's
 * state of every partition dropped as lost), then begins the next one. 0, or -1 (latched;
 * what is not committed is read again after a restart). */
static int txn_rewind(al_stage *s, const char *why)
{
    char err[512];
    rd_kafka_t *rk = al_producer_handle(s->producer);
    s->txn_abort = 0;
    s->rewinding = 1;
    al_log_warn(s->proc.comp, "exactly-once: aborting the transaction (%s); the work since the last "
                         "commit is done again from the committed offsets", why);
    /* the inputs first, so that the purged outputs' failed deliveries stop nothing */
    if (s->consumer) al_consumer_drop_all(s->consumer);
    /* A retriable failure (no coordinator: the broker is down) is tried again until the
     * broker is back; a stop request ends the wait (the coordinator aborts the transaction
     * after transaction.timeout.ms, or the restart's init_transactions does). */
    int k = 2;
    for (int tries = 0; k == 2; tries++) {
        if (tries && al_stage_stop_requested()) break;
        k = txn_error(s, rd_kafka_abort_transaction(rk, al_stage_drain_left_ms(s, 30000)),
                      "aborting the transaction", err, sizeof err);
        if (k == 2)
            al_log_warn(s->proc.comp, "exactly-once: %s; trying again (attempt %d)", err, tries + 1);
    }
    s->txn_open = 0;
    s->rewinding = 0;
    if (k > 0) al_stage_fail(s, "exactly-once: %s", err);
    if (k) return -1;
    s->txn_aborts++;
    txn_count(s, "aborted");
    if (s->consumer && al_consumer_seek_committed(s->consumer, err, sizeof err) != 0) {
        al_stage_fail(s, "exactly-once: after an abort: %s", err);
        return -1;
    }
    s->txn_sent = al_producer_sent(s->producer);
    return txn_begin(s);
}

/* 1 when offsets l would commit nothing new over the last commit's. */
static int txn_offsets_same(const al_stage *s, const rd_kafka_topic_partition_list_t *l)
{
    if (!s->txn_offsets) return l->cnt == 0;
    for (int i = 0; i < l->cnt; i++) {
        const rd_kafka_topic_partition_t *o = rd_kafka_topic_partition_list_find(
            s->txn_offsets, l->elems[i].topic, l->elems[i].partition);
        if (!o || o->offset != l->elems[i].offset) return 0;
    }
    return 1;
}

/* Commits the open transaction: the outputs flushed, the consumer's committable offsets (and
 * the stage's metadata for them) sent to it, the commit; then the next one begins. Nothing
 * is sent when nothing was produced and no offset moved. 0; -1 with errstr when it did not
 * commit: an abortable error leaves txn_abort set (the loop rewinds), a fatal one is latched. */
static int txn_commit(al_stage *s, const char *why, int timeout_ms, char *errstr, size_t errlen)
{
    rd_kafka_t *rk = al_producer_handle(s->producer);
    if (!s->txn_open) return al_err(errstr, errlen, "no transaction is open");
    if (al_stage_failed(s))
        return al_err(errstr, errlen, "not committing after a failure: %s", al_stage_reason(s));
    if (s->txn_abort) return al_err(errstr, errlen, "the transaction is to be aborted");
    if (timeout_ms < 1000) timeout_ms = 1000;
    if (al_producer_flush(s->producer, timeout_ms, errstr, errlen) != 0) {
        /* Outputs not acknowledged yet (the broker away): the next commit tries again, unless
         * the transaction is past its transaction.timeout.ms, after which the coordinator
         * aborts it anyway: aborted here, its inputs are read again. Its messages' own
         * message.timeout.ms (no longer than the transaction's) fails them before that. */
        int64_t open_us = al_mono_us() - s->txn_begun_us;
        if (s->txn_timeout_us > 0 && open_us > s->txn_timeout_us) {
            size_t n = strlen(errstr);
            snprintf(errstr + n, errlen - n,
                     "; the transaction has been open %.1f s, past transaction.timeout.ms: "
                     "aborting it",
                     (double)open_us / 1e6);
            s->txn_abort = 1;
        }
        return -1;
    }
    /* the flush served the deliveries: the offsets below are of acknowledged work only */
    rd_kafka_topic_partition_list_t *l = al_consumer_committable(s->consumer);
    if (al_producer_sent(s->producer) == s->txn_sent && txn_offsets_same(s, l)) {
        rd_kafka_topic_partition_list_destroy(l);
        return 0;
    }
    char meta[4096];
    for (int i = 0; s->spec->hooks->offset_metadata && i < l->cnt; i++) {
        rd_kafka_topic_partition_t *e = &l->elems[i];
        size_t n = s->spec->hooks->offset_metadata(s, e->topic, e->partition, e->offset, meta,
                                                   sizeof meta, s->spec->ud);
        if (n > 0 && n < sizeof meta && (e->metadata = malloc(n))) {
            memcpy(e->metadata, meta, n);
            e->metadata_size = n;
        }
    }
    int k = 0;
    if (l->cnt) {
        rd_kafka_consumer_group_metadata_t *g =
            rd_kafka_consumer_group_metadata(al_consumer_handle(s->consumer));
        k = 2;
        for (int tries = 0; k == 2 && tries < 3; tries++)
            k = txn_error(s, rd_kafka_send_offsets_to_transaction(rk, l, g, timeout_ms),
                          "sending the offsets to the transaction", errstr, errlen);
        rd_kafka_consumer_group_metadata_destroy(g);
    }
    if (!k) {
        k = 2;
        for (int tries = 0; k == 2 && tries < 3; tries++)
            k = txn_error(s, rd_kafka_commit_transaction(rk, timeout_ms),
                          "committing the transaction", errstr, errlen);
    }
    if (k) {
        rd_kafka_topic_partition_list_destroy(l);
        if (k > 0) s->txn_abort = 1; /* abortable, or still not done: undo it */
        return -1;
    }
    s->txn_open = 0;
    s->txn_commits++;
    txn_count(s, "committed");
    al_log_debug(s->proc.comp, "exactly-once: committed (%s), %d partitions", why, l->cnt);
    if (s->txn_offsets) rd_kafka_topic_partition_list_destroy(s->txn_offsets);
    s->txn_offsets = l;
    s->txn_sent = al_producer_sent(s->producer);
    if (txn_begin(s) != 0) return al_err(errstr, errlen, "%s", al_stage_reason(s));
    return 0;
}

/* The consumer's commits (al_commit_fn) in exactly-once mode. */
static int stage_commit_fn(al_consumer *c, const char *why, int timeout_ms, char *errstr,
                           size_t errlen, void *ctx)
{
    (void)c;
    return txn_commit(ctx, why, timeout_ms, errstr, errlen);
}

/* Before the producer: the worker's id (its consumer joins under it too) and the settings of
 * the mode. 0, or -1 (logged). */
static int txn_configure(al_stage *s)
{
    char id[256];
    al_kafka__member_id(s->conf, s->group, id, sizeof id, &s->member_lock_fd);
    if (!id[0]) {
        al_log_error(s->proc.comp,
                     "--exactly-once needs a stable worker id for its transactional.id, and "
                     "this worker has none (ARCLIGHT_INSTANCE_ID=none or group.instance.id=none, "
                     "or no member slot free): set ARCLIGHT_INSTANCE_ID (or group.instance.id) "
                     "to a name that stays the same across restarts");
        return -1;
    }
    snprintf(s->txn_id, sizeof s->txn_id, "%s", id);
    const char *iso = al_kafka_conf_get(s->conf, "isolation.level");
    if (iso && strcmp(iso, "read_committed"))
        al_log_warn(s->proc.comp, "--exactly-once reads with isolation.level=read_committed (the "
                             "configured %s is not used)", iso);
    const char *every = al_kafka_conf_get(s->conf, "auto.commit.interval.ms");
    double ms = every ? atof(every) : 5000;
    s->txn_every_us = (int64_t)((ms >= 10 ? ms : 10) * 1000);
    if (al_kafka_conf_set(s->conf, "group.instance.id", id) ||
        al_kafka_conf_set(s->conf, "isolation.level", "read_committed") ||
        al_kafka_conf_set(s->conf, "enable.auto.commit", "false")) {
        al_log_error(s->proc.comp, "out of memory");
        return -1;
    }
    return 0;
}

/* The transactional producer: transactional.id set, its transactions initialised (fencing a
 * previous incarnation of this worker and aborting what it left open), the first begun.
 * NULL (logged) on failure. */
static al_producer *txn_producer_new(al_stage *s)
{
    char err[1024];
    al_kafka_conf *pc = al_kafka_conf_dup(s->conf);
    /* A message must be delivered within its transaction's life: a message.timeout.ms past
     * transaction.timeout.ms (librdkafka refuses it; client.conf's is 5 minutes, to ride out
     * an outage) becomes the transaction's timeout, 60 s unless configured. */
    const char *tt = pc ? al_kafka_conf_get(pc, "transaction.timeout.ms") : NULL;
    const char *mt = pc ? al_kafka_conf_get(pc, "message.timeout.ms") : NULL;
    double txn_ms = tt ? atof(tt) : 60000;
    s->txn_timeout_us = (int64_t)(txn_ms * 1000);
    if (pc && mt && atof(mt) > txn_ms) {
        char v[32];
        snprintf(v, sizeof v, "%.0f", txn_ms);
        if (al_kafka_conf_set(pc, "message.timeout.ms", v)) {
            al_kafka_conf_free(pc);
            pc = NULL;
        }
    }
    if (!pc || al_kafka_conf_set(pc, "transactional.id", s->txn_id)) {
        al_kafka_conf_free(pc);
        al_log_error(s->proc.comp, "out of memory");
        return NULL;
    }
    al_producer *p = al_producer_new(pc, err, sizeof err);
    al_kafka_conf_free(pc);
    if (!p) {
        al_log_error(s->proc.comp, "%s", err);
        return NULL;
    }
    rd_kafka_error_t *e = rd_kafka_init_transactions(al_producer_handle(p), 60000);
    if (e) {
        al_log_error(s->proc.comp,
                     "--exactly-once: initialising transactions for transactional.id %s: %s "
                     "(%s)%s",
                     s->txn_id, rd_kafka_error_string(e), rd_kafka_error_name(e),
                     rd_kafka_error_code(e) == RD_KAFKA_RESP_ERR__TIMED_OUT
                         ? "; is the cluster reachable, and does it have a transaction "
                           "coordinator (transaction.state.log.* settings)?"
                         : "");
        rd_kafka_error_destroy(e);
        al_producer_free_within(p, 0);
        return NULL;
    }
    al_log_info(s->proc.comp, "exactly-once: transactional.id %s", s->txn_id);
    return p;
}

/* After txn_fatal asked for it: the consumer's inputs dropped, the old producer freed (what it
 * still held is purged: its outputs were in the aborted transaction), a new one with the same
 * transactional.id (its init_transactions bumps the epoch again and aborts whatever is left
 * open), the consumer rewound to the committed offsets, the next transaction begun. 0, or -1
 * (latched). */
static int txn_renew(al_stage *s)
{
    char err[512];
    s->txn_renew = 0;
    s->txn_abort = 0;
    s->rewinding = 1;
    if (s->consumer) al_consumer_drop_all(s->consumer);
    al_producer_free_within(s->producer, 0);
    s->producer = NULL;
    s->txn_open = 0;
    s->producer = txn_producer_new(s);
    s->rewinding = 0;
    if (!s->producer) {
        al_stage_fail(s, "exactly-once: could not make a new transactional producer after the "
                         "coordinator aborted a timed-out transaction (logged above)");
        return -1;
    }
    al_producer_set_delivery_cb(s->producer, stage_on_delivery, s);
    if (s->consumer) al_consumer_set_linked(s->consumer, s->producer);
    s->txn_renewals++;
    s->txn_aborts++;
    txn_count(s, "aborted");
    if (s->consumer && al_consumer_seek_committed(s->consumer, err, sizeof err) != 0) {
        al_stage_fail(s, "exactly-once: after a new producer: %s", err);
        return -1;
    }
    s->txn_sent = al_producer_sent(s->producer);
    return txn_begin(s);
}

/* Steps 1-6 of stage.h: 0 ready to consume, 1 nothing to do, -1 failed (logged). */
static int stage_start(al_stage *s)
{
    const al_stage_spec *spec = s->spec;
    char err[1024];
    if (!(s->conf = al_kafka_conf_from_cli(spec->common, err, sizeof err))) {
        al_log_error(s->proc.comp, "%s", err);
        return -1;
    }
    for (const char *const *d = spec->conf_defaults; d && d[0] && d[1]; d += 2)
        if (!al_kafka_conf_get(s->conf, d[0]) && al_kafka_conf_set(s->conf, d[0], d[1]) != 0) {
            al_log_error(s->proc.comp, "out of memory");
            return -1;
        }
    if (al_process_metrics_start(&s->proc, spec->common->metrics, spec->metrics, NULL, NULL) != 0)
        return -1;
    al_stage_catch_signals();
    if (spec->exactly_once) {
        if (txn_configure(s) != 0 || !(s->producer = txn_producer_new(s))) return -1;
    } else if (!(s->producer = al_producer_new(s->conf, err, sizeof err))) {
        al_log_error(s->proc.comp, "%s", err);
        return -1;
    }
    al_producer_set_delivery_cb(s->producer, stage_on_delivery, s);
    if (spec->exactly_once && txn_begin(s) != 0) return -1;
    /* The outputs' partitions and leaders now: otherwise the first message waits up to a
     * second for librdkafka's scan of unknown topics (and consumption backs up behind it),
     * and an unreachable cluster shows here rather than at the first output. */
    if (spec->outputs && spec->outputs[0] &&
        al_producer_prepare(s->producer, spec->outputs, 10000, err, sizeof err) != 0)
        al_log_warn(s->proc.comp, "%s (sending anyway; messages wait for it)", err);
    if (spec->hooks->prepare) {
        int r = spec->hooks->prepare(s, spec->ud, err, sizeof err);
        if (r < 0) {
            al_log_error(s->proc.comp, "%s", err);
            return -1;
        }
        if (r > 0) return 1;
    }
    if (!(s->consumer = al_consumer_new(s->conf, s->group, s->producer, err, sizeof err))) {
        al_log_error(s->proc.comp, "%s", err);
        return -1;
    }
    al_consumer_set_rebalance_cb(s->consumer, stage_on_rebalance, s);
    if (spec->exactly_once) {
        al_consumer_set_commit_fn(s->consumer, stage_commit_fn, s);
        s->txn_next_us = al_mono_us() + s->txn_every_us;
    }
    const char *topics[] = {spec->input};
    if (al_consumer_subscribe(s->consumer, topics, 1, err, sizeof err) != 0) {
        al_log_error(s->proc.comp, "%s", err);
        return -1;
    }
    if (spec->hooks->started) spec->hooks->started(s, spec->ud);
    return 0;
}

/* Step 7: until a stop request, a failure or a done tick. */
static void stage_loop(al_stage *s)
{
    const al_stage_spec *spec = s->spec;
    const al_stage_hooks *h = spec->hooks;
    char err[1024];
    /* test fault point ARCLIGHT_STAGE_TEST_KILL_AT=N: SIGKILL once the Nth input has been
     * handled and its outputs are acknowledged, before any commit can include them (in
     * exactly-once mode they are in the open transaction); =stop:N: SIGSTOP there instead
     * (the test sends SIGCONT: a worker that was frozen past its session) */
    long long kill_at = -1, stop_at = -1, handed = 0;
    const char *at = al_fault_spec("ARCLIGHT_STAGE_TEST_KILL_AT");
    if (at && sscanf(at, "stop:%lld", &stop_at) != 1 && sscanf(at, "%lld", &kill_at) != 1)
        kill_at = -1;
    while (!al_stage_stop_requested() && !al_stage_failed(s)) {
        if (spec->exactly_once) {
            if (s->txn_renew && txn_renew(s) != 0) break;
            if (s->txn_abort && txn_rewind(s, "partitions lost, or a commit refused") != 0) {
                if (s->txn_renew && !al_stage_failed(s)) continue;
                break;
            }
            if (al_producer_fatal(s->producer, err, sizeof err)) {
                txn_fatal(s, rd_kafka_fatal_error(al_producer_handle(s->producer), NULL, 0), err);
                if (s->txn_renew) continue;
                break;
            }
            if (al_mono_us() >= s->txn_next_us) {
                if (txn_commit(s, "interval", al_stage_drain_left_ms(s, 30000), err,
                               sizeof err) != 0 &&
                    !al_stage_failed(s))
                    al_log_warn(s->proc.comp, "exactly-once: %s", err);
                s->txn_next_us = al_mono_us() + s->txn_every_us;
                continue;
            }
        }
        rd_kafka_message_t *m = NULL;
        int r = al_consumer_poll(s->consumer, spec->poll_ms, &m, err, sizeof err);
        if (r < 0) {
            al_stage_fail(s, "%s", err);
            break;
        }
        if (r == 1 && m->err) { /* an end-of-partition event: not an input */
            rd_kafka_message_destroy(m);
            r = 0;
        }
        int64_t now = al_mono_us();
        if (r == 1) h->message(s, m, now, spec->ud);
        if (AL_FAULT_POINTS && r == 1 && (++handed == kill_at || handed == stop_at)) {
            al_producer_flush(s->producer, 30000, err, sizeof err);
            if (handed == kill_at)
                al_fault_kill(s->proc.comp, "after input %lld, its outputs acknowledged, uncommitted",
                              handed);
            al_log_warn(s->proc.comp, "test fault point: SIGSTOP after input %lld, its outputs "
                                 "acknowledged, uncommitted", handed);
            raise(SIGSTOP);
        }
        if (h->tick && h->tick(s, r, now, spec->ud)) break;
    }
}

/* Step 8, after a clean loop: 1 when every output is acknowledged and the offsets are
 * committed. */
static int stage_drain(al_stage *s)
{
    const al_stage_spec *spec = s->spec;
    char err[1024];
    if (!al_stage_failed(s) && spec->hooks->stopping) spec->hooks->stopping(s, spec->ud);
    al_stage_drain_start(s, spec->drain_s);
    int flushed = al_producer_flush(s->producer, al_stage_drain_left_ms(s, 30000), err,
                                    sizeof err) == 0;
    if (!flushed) al_stage_fail(s, "at exit: %s", err);
    if (spec->hooks->drained) spec->hooks->drained(s, flushed, spec->ud);
    if (al_stage_failed(s)) return 0;
    if (al_consumer_commit_within(s->consumer, al_stage_drain_left_ms(s, 30000), err,
                                  sizeof err) != 0) {
        al_log_warn(s->proc.comp, "%s (what was not committed is read again after a restart)", err);
        return 0;
    }
    return 1;
}

int al_stage_run(al_stage *s, const al_stage_spec *spec)
{
    s->spec = spec;
    s->group = spec->group;
    int rc = AL_EXIT_FAILURE;
    int r = stage_start(s);
    if (r > 0) {
        rc = AL_EXIT_OK;
    } else if (r == 0) {
        stage_loop(s);
        if (stage_drain(s)) rc = AL_EXIT_OK;
    }
    if (al_stage_failed(s) && !s->proc.log_failures)
        al_log_error(s->proc.comp, "stopping: %s", al_stage_reason(s));
    /* The close revokes every partition (the stage's rebalance callback drops their state);
     * inputs still held are ended only after it, when ending them can store nothing: a
     * failed run must not commit what it had not finished. */
    s->closing = 1;
    al_stage_drain_start(s, spec->drain_s);
    /* a failed (or undone) run's open transaction goes now: nothing of it becomes visible,
     * and the close's revoke then has nothing to commit */
    if (spec->exactly_once && s->producer && s->txn_open && (al_stage_failed(s) || s->txn_abort)) {
        rd_kafka_error_t *e = rd_kafka_abort_transaction(al_producer_handle(s->producer),
                                                         al_stage_drain_left_ms(s, 10000));
        if (e) rd_kafka_error_destroy(e);
        s->txn_open = 0;
        s->txn_abort = 1; /* nothing more is committed */
    }
    al_consumer_free_within(s->consumer, al_stage_drain_left_ms(s, AL_CONSUMER_CLOSE_MS));
    s->consumer = NULL;
    if (spec->hooks->release) spec->hooks->release(s, spec->ud);
    al_producer_free_within(s->producer, al_stage_drain_left_ms(s, 10000));
    s->producer = NULL;
    al_process_metrics_stop(&s->proc);
    al_kafka_conf_free(s->conf);
    s->conf = NULL;
    if (s->txn_offsets) rd_kafka_topic_partition_list_destroy(s->txn_offsets);
    s->txn_offsets = NULL;
    if (s->member_lock_fd >= 0) close(s->member_lock_fd);
    s->member_lock_fd = -1;
    return rc;
}
