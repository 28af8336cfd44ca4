/*
 * consumer.c: the consumer-group wrapper. It owns one al_part_state (offset tracker) per
 * assigned partition, stores each partition's committable offset once the outputs of its
 * inputs are acknowledged, flushes the linked producer and commits before partitions go, and
 * stops with an error (never skips) when a committed offset is gone from the broker.
 */
#include "kafka/internal.h"

#include "core/log.h"
#include "core/parse.h"
#include "core/util.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define AL_CONSUMER_BATCH 128

struct al_consumer {
    rd_kafka_t *rk;
    al_producer *linked;
    al_rebalance_fn rb_fn;
    void *rb_ctx;
    al_part_state **parts; /* assigned partitions */
    size_t nparts, capparts;
    int start_at_end; /* partitions without a committed offset start at the end */
    int failed;
    char fail_reason[1024];
    int64_t last_down_log_us;
    int wake_fetchers;     /* librdkafka < 2.2: see wake_stalled_fetchers */
    int64_t last_wake_us, wake_every_us;
    uint64_t handed_since_wake;
    /* wake_before_empty: the prefetch limit, the mean message size handed out, the queue's
     * length after the last batch was taken */
    double queue_max_bytes, mean_len;
    size_t queue_after_batch;
    /* Messages taken from librdkafka in one call and handed out one per al_consumer_poll:
     * the per-poll work (the linked producer's reports, offset stores, librdkafka's queue
     * lock and clock reads) is then done once per batch instead of once per message. */
    rd_kafka_queue_t *queue;
    rd_kafka_message_t *batch[AL_CONSUMER_BATCH];
    size_t nbatch, ibatch;
    unsigned rebalances; /* counts rebalance callbacks: a batch taken across one is checked */
    int assigned;        /* this handle has had its first assignment (al_consumer_free_within) */
    uint64_t commit_failures; /* commits on a rebalance or a close the broker refused */
    int64_t close_deadline_us; /* al_mono_us() by which a close must be done; 0: none */
    char instance_id[256];    /* group.instance.id ("" : dynamic membership; member.c) */
    int member_lock_fd;       /* the member slot's lock file, -1: none */
    /* what a rejoin after a fencing needs (consumer_rejoin) */
    al_kafka_conf *conf;
    char *group;
    char **topics;
    size_t ntopics;
    int fenced;          /* set by the error callback: rejoin at the next poll */
    int64_t fence_us[3]; /* the last fencings not caused by this consumer's own rejoin */
    unsigned fence_n;
    int64_t lost_us; /* when this handle last gave its assignment up as lost; 0: never */
    /* a commit written by the owner (a transaction: kafka/stage.c); NULL: librdkafka's */
    al_commit_fn commit_fn;
    void *commit_ctx;
};

/* ------------------------------------------------------------------------------------------
 * Partition states and inputs
 * ------------------------------------------------------------------------------------------ */

static void ps_unref(al_part_state *ps)
{
    if (--ps->refs > 0) return;
    al_offset_tracker_free(ps->tracker);
    free(ps->meta);
    free(ps->topic);
    free(ps);
}

static al_part_state *ps_find(al_consumer *c, const char *topic, int32_t partition)
{
    for (size_t i = 0; i < c->nparts; i++)
        if (c->parts[i]->partition == partition && !strcmp(c->parts[i]->topic, topic))
            return c->parts[i];
    return NULL;
}

static al_part_state *ps_add(al_consumer *c, const char *topic, int32_t partition)
{
    al_part_state *ps = ps_find(c, topic, partition);
    if (ps) return ps;
    if (c->nparts == c->capparts) {
        size_t cap = c->capparts ? c->capparts * 2 : 16;
        al_part_state **np = realloc(c->parts, cap * sizeof *np);
        if (!np) return NULL;
        c->parts = np;
        c->capparts = cap;
    }
    ps = calloc(1, sizeof *ps);
    if (!ps) return NULL;
    ps->topic = strdup(topic);
    ps->tracker = al_offset_tracker_new();
    if (!ps->topic || !ps->tracker) {
        free(ps->topic);
        al_offset_tracker_free(ps->tracker);
        free(ps);
        return NULL;
    }
    ps->consumer = c;
    ps->partition = partition;
    ps->stored = -1;
    ps->refs = 1;
    c->parts[c->nparts++] = ps;
    return ps;
}

/* Detaches a partition from the consumer: its inputs become orphans. */
static void ps_remove(al_consumer *c, const char *topic, int32_t partition)
{
    for (size_t i = 0; i < c->nparts; i++) {
        al_part_state *ps = c->parts[i];
        if (ps->partition != partition || strcmp(ps->topic, topic)) continue;
        c->parts[i] = c->parts[--c->nparts];
        if (al_offset_tracker_pending(ps->tracker))
            al_log_info("kafka",
                        "%s [%d] revoked with %zu inputs unfinished; the next owner "
                        "re-reads them from offset %lld",
                        ps->topic, (int)ps->partition, al_offset_tracker_pending(ps->tracker),
                        (long long)ps->stored);
        ps->consumer = NULL;
        ps_unref(ps);
        return;
    }
}

static void consumer_fail(al_consumer *c, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void consumer_fail(al_consumer *c, const char *fmt, ...)
{
    if (c->failed) return; /* the first reason is the one that matters */
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->fail_reason, sizeof c->fail_reason, fmt, ap);
    va_end(ap);
    c->failed = 1;
    al_log_error("kafka", "%s", c->fail_reason);
}

/* Hands every partition's advanced committable offset to librdkafka in one call; the
 * auto-committer (and rebalance/close) commits them. */
static void consumer_store_offsets(al_consumer *c)
{
    if (c->commit_fn) return; /* the owner commits the tracked offsets itself */
    rd_kafka_topic_partition_list_t *l = NULL;
    for (size_t i = 0; i < c->nparts; i++) {
        al_part_state *ps = c->parts[i];
        int64_t off = al_offset_tracker_committable(ps->tracker);
        if (off < 0 || off <= ps->stored) continue;
        if (!l) l = rd_kafka_topic_partition_list_new((int)c->nparts);
        rd_kafka_topic_partition_list_add(l, ps->topic, ps->partition)->offset = off;
        ps->stored = off;
    }
    if (!l) return;
    rd_kafka_resp_err_t err = rd_kafka_offsets_store(c->rk, l);
    if (err)
        for (int i = 0; i < l->cnt; i++)
            if (l->elems[i].err)
                al_log_warn("kafka", "storing offset %lld of %s [%d]: %s",
                            (long long)l->elems[i].offset, l->elems[i].topic,
                            (int)l->elems[i].partition, rd_kafka_err2str(l->elems[i].err));
    rd_kafka_topic_partition_list_destroy(l);
}

static void input_unref(al_input *in)
{
    if (--in->refs > 0) return;
    if (in->ps) ps_unref(in->ps);
    free(in);
}

al_input *al_consumer_input_begin(al_consumer *c, const rd_kafka_message_t *m)
{
    al_input *in = calloc(1, sizeof *in);
    if (!in) return NULL;
    in->offset = m->offset;
    in->refs = 1;
    if (m->err || !m->rkt) return in; /* an event (end of partition), not an input */
    const char *topic = rd_kafka_topic_name(m->rkt);
    al_part_state *ps = ps_find(c, topic, m->partition);
    if (!ps) {
        /* A message of a partition we no longer own (revoked between fetch and delivery):
         * its offset is not ours to store. */
        al_log_debug("kafka", "%s [%d] offset %lld: partition not assigned; not tracked", topic,
                     (int)m->partition, (long long)m->offset);
        return in;
    }
    if (al_offset_tracker_add(ps->tracker, m->offset, 1) != 0) {
        consumer_fail(c, "%s [%d]: offset %lld arrived out of order (tracking cannot continue)",
                      topic, (int)m->partition, (long long)m->offset);
        return in;
    }
    in->ps = ps;
    ps->refs++;
    return in;
}

/* One reference of `in` is finished (its hold or one acknowledged output). */
static void input_finish_one(al_input *in)
{
    al_part_state *ps = in->ps;
    if (ps) {
        /* The store itself happens in the next al_consumer_poll (or commit, rebalance). */
        al_offset_tracker_ack(ps->tracker, in->offset);
    }
    input_unref(in);
}

void al_input_end(al_input *in)
{
    if (in) input_finish_one(in);
}

void al_consumer_input_skip(al_consumer *c, const rd_kafka_message_t *m)
{
    al_input_end(al_consumer_input_begin(c, m));
}

int al_input__add_output(al_input *in)
{
    if (in->refs <= 0) return -1;
    if (in->ps && al_offset_tracker_inc(in->ps->tracker, in->offset) != 0) return -1;
    in->refs++;
    return 0;
}

void al_input__drop_output(al_input *in)
{
    /* The output never left: count it as done without it (the hold keeps the input open). */
    input_finish_one(in);
}

void al_input__delivered(al_input *in, rd_kafka_resp_err_t err, const char *reason)
{
    if (err) {
        /* Never store past an input whose output was lost: keep it pending forever and stop
         * the consumer, so that a restart re-reads the input. With owner-written commits
         * (transactions) the owner undoes the loss itself: the failed delivery fails its
         * transaction, which is aborted, and the consumer rewound to the committed offsets
         * reads the input again; the pending input only keeps its offset from a commit. */
        if (in->ps && in->ps->consumer && !in->ps->consumer->commit_fn)
            consumer_fail(in->ps->consumer,
                          "an output of %s [%d] offset %lld was not delivered: %s; stopping "
                          "without storing that offset (it is re-processed after a restart)",
                          in->ps->topic, (int)in->ps->partition, (long long)in->offset, reason);
        input_unref(in);
        return;
    }
    input_finish_one(in);
}

/* ------------------------------------------------------------------------------------------
 * Rebalances
 * ------------------------------------------------------------------------------------------ */

/* Turns BEGINNING/END into the partitions' actual offsets with one ListOffsets request per
 * leader, before the assignment. Left to librdkafka, each partition resolves its own
 * logical offset and starts fetching when its answer comes back; the first one to start then
 * has the broker connection's single fetch to itself, and once it is drained that fetch waits
 * out fetch.wait.max.ms on the mock broker while the others wait behind it (about a second
 * of nothing, seen in bench_credit). Partitions whose lookup fails keep their logical offset. */
static void resolve_logical_offsets(al_consumer *c, rd_kafka_topic_partition_list_t *parts)
{
    rd_kafka_topic_partition_list_t *q = rd_kafka_topic_partition_list_new(parts->cnt);
    for (int i = 0; i < parts->cnt; i++) {
        int64_t o = parts->elems[i].offset;
        /* ListOffsets reads -2 as "earliest" and -1 as "latest" in the timestamp field */
        if (o == RD_KAFKA_OFFSET_BEGINNING || o == RD_KAFKA_OFFSET_END)
            rd_kafka_topic_partition_list_add(q, parts->elems[i].topic,
                                              parts->elems[i].partition)->offset = o;
    }
    if (q->cnt && rd_kafka_offsets_for_times(c->rk, q, 10000) == RD_KAFKA_RESP_ERR_NO_ERROR) {
        for (int i = 0; i < q->cnt; i++) {
            const rd_kafka_topic_partition_t *r = &q->elems[i];
            if (r->err || r->offset < 0) continue;
            rd_kafka_topic_partition_t *p =
                rd_kafka_topic_partition_list_find(parts, r->topic, r->partition);
            if (p) p->offset = r->offset;
        }
    }
    rd_kafka_topic_partition_list_destroy(q);
}

/* Gives partitions without a committed offset an explicit start (librdkafka runs with
 * auto.offset.reset=error, which would otherwise refuse them), and leaves the committed ones
 * to librdkafka, so that a committed offset that is gone raises __AUTO_OFFSET_RESET. */
static rd_kafka_topic_partition_list_t *assign_start_offsets(al_consumer *c,
                                                             rd_kafka_topic_partition_list_t *parts)
{
    rd_kafka_topic_partition_list_t *committed = rd_kafka_topic_partition_list_copy(parts);
    rd_kafka_resp_err_t err = rd_kafka_committed(c->rk, committed, 10000);
    for (int i = 0; i < parts->cnt; i++) {
        rd_kafka_topic_partition_t *p = &parts->elems[i];
        int64_t off = RD_KAFKA_OFFSET_INVALID;
        if (!err && !committed->elems[i].err) off = committed->elems[i].offset;
        if (err || committed->elems[i].err) {
            /* Unknown: let librdkafka fetch the committed offset itself; a missing one then
             * surfaces as an error instead of silently starting somewhere. */
            p->offset = RD_KAFKA_OFFSET_INVALID;
        } else if (off < 0) {
            p->offset = c->start_at_end ? RD_KAFKA_OFFSET_END : RD_KAFKA_OFFSET_BEGINNING;
            al_log_debug("kafka", "%s [%d]: no committed offset, starting at the %s", p->topic,
                         (int)p->partition, c->start_at_end ? "end" : "beginning");
        } else {
            p->offset = off;
            al_log_debug("kafka", "%s [%d]: resuming at committed offset %lld", p->topic,
                         (int)p->partition, (long long)off);
        }
    }
    if (err)
        al_log_warn("kafka", "fetching committed offsets failed (%s); librdkafka retries",
                    rd_kafka_err2str(err));
    resolve_logical_offsets(c, parts);
    if (err) {
        rd_kafka_topic_partition_list_destroy(committed);
        return NULL;
    }
    return committed;
}

/* Keeps the metadata of each partition's committed offset (committed: rd_kafka_committed's
 * answer, NULL: none) in its state. */
static void keep_committed_metadata(al_consumer *c, const rd_kafka_topic_partition_list_t *committed)
{
    for (int i = 0; committed && i < committed->cnt; i++) {
        const rd_kafka_topic_partition_t *e = &committed->elems[i];
        al_part_state *ps = ps_find(c, e->topic, e->partition);
        if (!ps) continue;
        free(ps->meta);
        ps->meta = NULL;
        ps->meta_offset = e->offset;
        if (!e->err && e->metadata && e->metadata_size && (ps->meta = malloc(e->metadata_size + 1))) {
            memcpy(ps->meta, e->metadata, e->metadata_size);
            ps->meta[e->metadata_size] = '\0';
        }
    }
}

/* Milliseconds left of a close's budget (at most cap), or cap when there is none. */
static int close_budget_ms(const al_consumer *c, int cap)
{
    if (!c->close_deadline_us) return cap;
    int64_t left = (c->close_deadline_us - al_mono_us()) / 1000;
    return left <= 0 ? 0 : left < cap ? (int)left : cap;
}

static void consumer_flush_and_commit(al_consumer *c, const char *why)
{
    char err[512];
    if (c->linked && al_producer_flush(c->linked, close_budget_ms(c, 30000), err, sizeof err) != 0)
        al_log_warn("kafka", "%s: producer flush: %s", why, err);
    if (c->commit_fn) {
        if (c->commit_fn(c, why, close_budget_ms(c, 30000), err, sizeof err, c->commit_ctx) != 0) {
            c->commit_failures++;
            al_log_warn("kafka", "%s: %s (the next owner reads again from the last committed "
                        "offset)", why, err);
        }
        return;
    }
    consumer_store_offsets(c);
    /* A close with a budget commits asynchronously: a synchronous commit to a broker that
     * does not answer waits for the request timeout, whatever the budget says. The close
     * itself waits for the commit while its budget lasts. */
    rd_kafka_resp_err_t e = rd_kafka_commit(c->rk, NULL, c->close_deadline_us ? 1 : 0);
    if (e && e != RD_KAFKA_RESP_ERR__NO_OFFSET) {
        c->commit_failures++;
        al_log_warn("kafka", "%s: commit failed: %s (the next owner reads again from the last "
                    "committed offset)", why, rd_kafka_err2str(e));
    }
}

uint64_t al_consumer_commit_failures(const al_consumer *c)
{
    return c->commit_failures;
}

static void consumer_rebalance_cb(rd_kafka_t *rk, rd_kafka_resp_err_t err,
                                  rd_kafka_topic_partition_list_t *parts, void *opaque)
{
    al_consumer *c = opaque;
    int cooperative = !strcmp(rd_kafka_rebalance_protocol(rk), "COOPERATIVE");
    c->rebalances++;
    rd_kafka_error_t *error = NULL;
    rd_kafka_resp_err_t aerr = 0;

    if (err == RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS) {
        c->assigned = 1;
        rd_kafka_topic_partition_list_t *committed = assign_start_offsets(c, parts);
        for (int i = 0; i < parts->cnt; i++)
            if (!ps_add(c, parts->elems[i].topic, parts->elems[i].partition))
                consumer_fail(c, "out of memory tracking %s [%d]", parts->elems[i].topic,
                              (int)parts->elems[i].partition);
        keep_committed_metadata(c, committed);
        if (committed) rd_kafka_topic_partition_list_destroy(committed);
        if (cooperative)
            error = rd_kafka_incremental_assign(rk, parts);
        else
            aerr = rd_kafka_assign(rk, parts);
        al_log_info("kafka", "assigned %d partitions (%d now)", parts->cnt, (int)c->nparts);
        if (c->rb_fn) c->rb_fn(c, AL_REBALANCE_ASSIGNED, parts, c->rb_ctx);
    } else {
        int lost = rd_kafka_assignment_lost(rk);
        if (lost) c->lost_us = al_mono_us();
        if (!lost) consumer_flush_and_commit(c, "rebalance");
        for (int i = 0; i < parts->cnt; i++)
            ps_remove(c, parts->elems[i].topic, parts->elems[i].partition);
        al_log_info("kafka", "%s %d partitions (%d left)", lost ? "lost" : "revoked", parts->cnt,
                    (int)c->nparts);
        if (c->rb_fn)
            c->rb_fn(c, lost ? AL_REBALANCE_LOST : AL_REBALANCE_REVOKED, parts, c->rb_ctx);
        if (cooperative)
            error = rd_kafka_incremental_unassign(rk, parts);
        else
            aerr = rd_kafka_assign(rk, NULL);
    }
    if (error) {
        consumer_fail(c, "partition assignment failed: %s", rd_kafka_error_string(error));
        rd_kafka_error_destroy(error);
    } else if (aerr) {
        consumer_fail(c, "partition assignment failed: %s", rd_kafka_err2str(aerr));
    }
}

/* Results of commits; only those of a close count (its commit is asynchronous, see
 * consumer_flush_and_commit); the periodic automatic commits retry by themselves. */
static void consumer_commit_cb(rd_kafka_t *rk, rd_kafka_resp_err_t err,
                               rd_kafka_topic_partition_list_t *offsets, void *opaque)
{
    (void)rk, (void)offsets;
    al_consumer *c = opaque;
    if (!c->close_deadline_us || !err || err == RD_KAFKA_RESP_ERR__NO_OFFSET) return;
    c->commit_failures++;
    al_log_warn("kafka", "close: commit failed: %s (the next owner reads again from the last "
                "committed offset)", rd_kafka_err2str(err));
}

static void consumer_error_cb(rd_kafka_t *rk, int err, const char *reason, void *opaque)
{
    al_consumer *c = opaque;
    al_kafka__error_common(rk, err, reason);
    if (err == RD_KAFKA_RESP_ERR__FATAL) {
        char buf[400];
        rd_kafka_resp_err_t ferr = rd_kafka_fatal_error(rk, buf, sizeof buf);
        if (ferr == RD_KAFKA_RESP_ERR_FENCED_INSTANCE_ID && c->instance_id[0])
            c->fenced = 1; /* consumer_rejoin, at the next poll */
        else
            consumer_fail(c, "fatal consumer error (%s): %s", rd_kafka_err2name(ferr), buf);
    }
}

/* ------------------------------------------------------------------------------------------
 * Lifecycle
 * ------------------------------------------------------------------------------------------ */

/* Keys arclight reads itself (auto.offset.reset: start of a new group) or sets itself. */
static const char *const consumer_skip[] = {"auto.offset.reset", "enable.auto.offset.store",
                                            "group.id", "group.instance.id", NULL};

/* Creates c's librdkafka handle from c->conf, c->group and c->instance_id (also again after
 * a fencing: consumer_rejoin). 0, or -1 with errstr. */
static int consumer_open(al_consumer *c, char *errstr, size_t errlen)
{
    char err[512];
    rd_kafka_conf_t *rc = al_kafka__conf_build(c->conf, consumer_skip, errstr, errlen);
    if (!rc) return -1;
    if ((c->instance_id[0] &&
         rd_kafka_conf_set(rc, "group.instance.id", c->instance_id, err, sizeof err)) ||
        rd_kafka_conf_set(rc, "group.id", c->group, err, sizeof err) ||
        rd_kafka_conf_set(rc, "enable.auto.offset.store", "false", err, sizeof err) ||
        rd_kafka_conf_set(rc, "auto.offset.reset", "error", err, sizeof err)) {
        al_err(errstr, errlen, "consumer settings: %s", err);
        rd_kafka_conf_destroy(rc);
        return -1;
    }
    rd_kafka_conf_set_opaque(rc, c);
    rd_kafka_conf_set_rebalance_cb(rc, consumer_rebalance_cb);
    rd_kafka_conf_set_offset_commit_cb(rc, consumer_commit_cb);
    rd_kafka_conf_set_error_cb(rc, consumer_error_cb);
    /* A full queue must not idle the fetcher for a second (wake_stalled_fetchers): from
     * librdkafka 2.2 a setting says how long it waits (default 1000 ms), before that the
     * wrapper wakes it. */
    c->wake_fetchers = rd_kafka_version() < 0x020200ff;
    c->wake_every_us = 10000;
    {
        char v[64];
        size_t vl = sizeof v;
        c->queue_max_bytes = 65536.0 * 1024; /* librdkafka's default */
        if (rd_kafka_conf_get(rc, "queued.max.messages.kbytes", v, &vl) == RD_KAFKA_CONF_OK)
            c->queue_max_bytes = atof(v) * 1024;
    }
    if (!c->wake_fetchers && !al_kafka_conf_get(c->conf, "fetch.queue.backoff.ms") &&
        rd_kafka_conf_set(rc, "fetch.queue.backoff.ms", "10", err, sizeof err) !=
            RD_KAFKA_CONF_OK)
        al_log_warn("kafka", "fetch.queue.backoff.ms: %s", err);
    c->rk = rd_kafka_new(RD_KAFKA_CONSUMER, rc, err, sizeof err);
    if (!c->rk) {
        al_err(errstr, errlen, "cannot create Kafka consumer: %s", err);
        rd_kafka_conf_destroy(rc);
        return -1;
    }
    rd_kafka_poll_set_consumer(c->rk);
    c->queue = rd_kafka_queue_get_consumer(c->rk);
    return 0;
}

/* On the embedded broker, which keeps no static members (member.c): the handle made again
 * as a dynamic member with a session of at most AL_KAFKA_EMBEDDED_SESSION (kafka.h; default
 * AL_MEMBER_EMBEDDED_SESSION_MS). Elsewhere nothing changes. 0, or -1 with errstr (c->rk is
 * then NULL). */
static int consumer_embedded_dynamic(al_consumer *c, char *errstr, size_t errlen)
{
    if (al_kafka__keeps_static_members(c->rk)) return 0;
    int cap = AL_MEMBER_EMBEDDED_SESSION_MS;
    const char *want = al_kafka_conf_get(c->conf, AL_KAFKA_EMBEDDED_SESSION);
    int bad = want && al_parse_int(want, 1000, 300000, &cap) != 0;
    const char *given = al_kafka_conf_get(c->conf, "session.timeout.ms");
    long ms = given ? atol(given) : 45000;
    if (ms <= 0 || ms > cap) ms = cap;
    char v[32];
    snprintf(v, sizeof v, "%ld", ms);
    rd_kafka_queue_destroy(c->queue);
    rd_kafka_destroy_flags(c->rk, RD_KAFKA_DESTROY_F_NO_CONSUMER_CLOSE);
    c->rk = NULL;
    c->queue = NULL;
    if (bad)
        return al_err(errstr, errlen, "Kafka client setting %s=%s: want 1000 to 300000 (ms)",
                      AL_KAFKA_EMBEDDED_SESSION, want);
    if (al_kafka_conf_set(c->conf, "session.timeout.ms", v) != 0)
        return al_err(errstr, errlen, "out of memory");
    al_log_info("kafka",
                "group %s: the embedded broker keeps no static members: joining as a dynamic "
                "member with a %ld ms session (a restarted worker has its partitions back "
                "within seconds)",
                c->group, ms);
    c->instance_id[0] = '\0';
    if (c->member_lock_fd >= 0) close(c->member_lock_fd); /* no slot held for nothing */
    c->member_lock_fd = -1;
    return consumer_open(c, errstr, errlen);
}

static void consumer_release(al_consumer *c)
{
    if (c->member_lock_fd >= 0) close(c->member_lock_fd); /* the slot is free again */
    al_kafka_conf_free(c->conf);
    free(c->group);
    for (size_t i = 0; i < c->ntopics; i++)
        free(c->topics[i]);
    free(c->topics);
    free(c->parts);
    free(c);
}

al_consumer *al_consumer_new(const al_kafka_conf *conf, const char *group, al_producer *linked,
                             char *errstr, size_t errlen)
{
    al_consumer *c = calloc(1, sizeof *c);
    if (!c) {
        al_err(errstr, errlen, "out of memory");
        return NULL;
    }
    c->member_lock_fd = -1;
    if (!group) group = al_kafka_conf_get(conf, "group.id");
    if (!group || !*group) {
        al_err(errstr, errlen, "consumer: no consumer group given (group.id)");
        free(c);
        return NULL;
    }
    const char *reset = al_kafka_conf_get(conf, "auto.offset.reset");
    if (reset) {
        if (!strcmp(reset, "latest") || !strcmp(reset, "largest") || !strcmp(reset, "end"))
            c->start_at_end = 1;
        else if (strcmp(reset, "earliest") && strcmp(reset, "smallest") &&
                 strcmp(reset, "beginning") && strcmp(reset, "error")) {
            al_err(errstr, errlen,
                   "consumer: auto.offset.reset=%s: want earliest, latest or error (where a "
                   "group without committed offsets starts; a lost offset always stops)",
                   reset);
            free(c);
            return NULL;
        }
    }
    c->conf = al_kafka_conf_dup(conf);
    c->group = strdup(group);
    if (!c->conf || !c->group) {
        al_err(errstr, errlen, "out of memory");
        consumer_release(c);
        return NULL;
    }
    al_kafka__member_id(conf, group, c->instance_id, sizeof c->instance_id, &c->member_lock_fd);
    if (consumer_open(c, errstr, errlen) != 0 ||
        (c->instance_id[0] && consumer_embedded_dynamic(c, errstr, errlen) != 0)) {
        consumer_release(c);
        return NULL;
    }
    if (c->instance_id[0])
        al_log_info("kafka", "group %s: static member %s", group, c->instance_id);
    c->linked = linked;
    return c;
}

/* After a fencing of this static member (c->fenced). librdkafka 2.0.2 fences itself: when no
 * heartbeat has been answered for session.timeout.ms (a broker failover can hold the answers
 * that long) it gives the assignment up as lost, forgets its member id and joins again under
 * the same group.instance.id; the coordinator then fences the old member id, and the old
 * generation's offset commit still in flight comes back FENCED_INSTANCE_ID, a fatal error for
 * the handle. The consumer gives up its partitions as lost (the stage drops their state; their
 * unstored offsets are read again) and joins again with a new handle. A fencing within 60 s
 * of this handle's own loss of its assignment is that; any other means another worker joined
 * with the id, and three of those within a minute stop the consumer with that reason. */
#define AL_SELF_FENCE_WINDOW_US (60 * 1000000LL)
static void consumer_rejoin(al_consumer *c)
{
    char err[512];
    int64_t now = al_mono_us();
    int own = c->lost_us && now - c->lost_us < AL_SELF_FENCE_WINDOW_US;
    c->fenced = 0;
    if (!own) {
        if (c->fence_n >= 2 && now - c->fence_us[(c->fence_n - 2) % 3] < 60 * 1000000LL) {
            consumer_fail(c,
                          "another consumer joined the group as static member %s: each worker "
                          "needs its own ARCLIGHT_INSTANCE_ID or group.instance.id (fenced three "
                          "times within a minute)",
                          c->instance_id);
            return;
        }
        c->fence_us[c->fence_n % 3] = now;
        c->fence_n++;
    }
    c->lost_us = 0; /* the new handle has lost nothing yet */
    if (own)
        al_log_warn("kafka",
                    "group %s: static member %s was fenced by its own rejoin (its session had "
                    "timed out); joining again, its partitions' unfinished inputs are read again",
                    c->group, c->instance_id);
    else
        al_log_warn("kafka",
                    "group %s: static member %s was fenced (its coordinator moved, or another "
                    "worker has its id); joining again, its partitions' unfinished inputs are "
                    "read again",
                    c->group, c->instance_id);
    while (c->ibatch < c->nbatch)
        rd_kafka_message_destroy(c->batch[c->ibatch++]);
    c->ibatch = c->nbatch = 0;
    c->rebalances++;
    c->assigned = 0; /* the new handle joins from the start */
    if (c->nparts) {
        rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new((int)c->nparts);
        for (size_t i = 0; i < c->nparts; i++)
            rd_kafka_topic_partition_list_add(l, c->parts[i]->topic, c->parts[i]->partition);
        for (int i = 0; i < l->cnt; i++)
            ps_remove(c, l->elems[i].topic, l->elems[i].partition);
        al_log_info("kafka", "lost %d partitions (%d left)", l->cnt, (int)c->nparts);
        if (c->rb_fn) c->rb_fn(c, AL_REBALANCE_LOST, l, c->rb_ctx);
        rd_kafka_topic_partition_list_destroy(l);
    }
    rd_kafka_queue_destroy(c->queue);
    c->queue = NULL;
    al_kafka__reason_forget(c->rk);
    rd_kafka_destroy_flags(c->rk, RD_KAFKA_DESTROY_F_NO_CONSUMER_CLOSE);
    c->rk = NULL;
    if (consumer_open(c, err, sizeof err) != 0) {
        consumer_fail(c, "joining again after a fencing: %s", err);
        return;
    }
    if (c->ntopics &&
        al_consumer_subscribe(c, (const char *const *)c->topics, c->ntopics, err, sizeof err) != 0)
        consumer_fail(c, "joining again after a fencing: %s", err);
}

void al_consumer_free(al_consumer *c)
{
    al_consumer_free_within(c, AL_CONSUMER_CLOSE_MS);
}

void al_consumer_free_within(al_consumer *c, int timeout_ms)
{
    if (!c) return;
    /* Messages taken but not handed out were never tracked: the next owner (or the next
     * run) reads them again from the stored offsets. */
    while (c->ibatch < c->nbatch)
        rd_kafka_message_destroy(c->batch[c->ibatch++]);
    if (timeout_ms < 0) timeout_ms = 0;
    /* librdkafka 2.0.2 aborts the process when a cooperative-sticky member is destroyed after
     * its JoinGroup answer and before its first assignment (an assert on the assignor's state,
     * which only the assignment sets: librdkafka#4312, fixed in 2.3.0). A worker stopping
     * just after it subscribed (train --resume with its --steps already reached; real Kafka
     * holds a new group's first join for a while) is in that window: one whose join is under
     * way (it has a member id) waits for its first assignment, for at most half the budget. */
    char *member = c->assigned || !c->queue ? NULL : rd_kafka_memberid(c->rk);
    if (member && *member) {
        int64_t until = al_mono_us() + (int64_t)timeout_ms * 500;
        while (!c->assigned && al_mono_us() < until) {
            rd_kafka_message_t *m = rd_kafka_consumer_poll(c->rk, 20);
            if (m) rd_kafka_message_destroy(m); /* not handed out: read again, as above */
        }
    }
    if (member) rd_kafka_mem_free(c->rk, member);
    if (c->queue) rd_kafka_queue_destroy(c->queue);
    /* Close runs the revoke callback (flush, store, commit), served here from the close's
     * own queue so that it can be given up when the broker does not answer in time. */
    c->close_deadline_us = al_mono_us() + (int64_t)timeout_ms * 1000;
    if (!c->close_deadline_us) c->close_deadline_us = 1;
    /* A close that has started cannot be cut short (destroying the handle waits for its
     * LeaveGroup, 5 s against a broker that does not answer), so first ask whether the
     * cluster answers at all. */
    int closed = 0, left = close_budget_ms(c, 1000);
    const struct rd_kafka_metadata *md = NULL;
    rd_kafka_resp_err_t merr =
        left > 0 ? rd_kafka_metadata(c->rk, 0, NULL, &md, left) : RD_KAFKA_RESP_ERR__TIMED_OUT;
    if (md) rd_kafka_metadata_destroy(md);
    if (merr) {
        al_log_warn("kafka", "Kafka does not answer (%s): leaving the group without a close; "
                             "what was not committed is read again after a restart",
                    rd_kafka_err2str(merr));
        /* what the close's revoke would have told the stage; nothing was committed */
        rd_kafka_topic_partition_list_t *a = NULL;
        if (rd_kafka_assignment(c->rk, &a) == 0 && a && a->cnt > 0 && c->rb_fn)
            c->rb_fn(c, AL_REBALANCE_LOST, a, c->rb_ctx);
        if (a) rd_kafka_topic_partition_list_destroy(a);
    } else {
        rd_kafka_queue_t *q = rd_kafka_queue_new(c->rk);
        rd_kafka_error_t *e = q ? rd_kafka_consumer_close_queue(c->rk, q) : NULL;
        if (e) {
            al_log_warn("kafka", "consumer close: %s", rd_kafka_error_string(e));
            rd_kafka_error_destroy(e);
        } else if (q) {
            /* the event interface: a revoke comes as an event, handled by the rebalance
             * callback as a consumer_poll would; the rest (messages fetched before the close,
             * errors) is dropped: those messages are read again from the committed offsets */
            while (!(closed = rd_kafka_consumer_closed(c->rk)) &&
                   al_mono_us() < c->close_deadline_us) {
                rd_kafka_event_t *ev = rd_kafka_queue_poll(q, 50);
                if (!ev) continue;
                if (rd_kafka_event_type(ev) == RD_KAFKA_EVENT_REBALANCE)
                    consumer_rebalance_cb(c->rk, rd_kafka_event_error(ev),
                                          (rd_kafka_topic_partition_list_t *)
                                              rd_kafka_event_topic_partition_list(ev),
                                          c);
                rd_kafka_event_destroy(ev);
            }
            if (!closed)
                al_log_warn("kafka", "the consumer did not close within %d ms: leaving without "
                                     "it; what was not committed is read again after a restart",
                            timeout_ms);
        }
        if (q) rd_kafka_queue_destroy(q);
    }
    while (c->nparts)
        ps_remove(c, c->parts[0]->topic, c->parts[0]->partition);
    al_kafka__reason_forget(c->rk);
    rd_kafka_destroy_flags(c->rk, closed ? 0 : RD_KAFKA_DESTROY_F_NO_CONSUMER_CLOSE);
    consumer_release(c);
}

int al_consumer_subscribe(al_consumer *c, const char *const *topics, size_t n, char *errstr,
                          size_t errlen)
{
    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new((int)n);
    for (size_t i = 0; i < n; i++)
        rd_kafka_topic_partition_list_add(l, topics[i], RD_KAFKA_PARTITION_UA);
    rd_kafka_resp_err_t err = rd_kafka_subscribe(c->rk, l);
    rd_kafka_topic_partition_list_destroy(l);
    if (err) return al_err(errstr, errlen, "subscribe: %s", rd_kafka_err2str(err));
    if (topics != (const char *const *)c->topics) { /* kept for a rejoin */
        for (size_t i = 0; i < c->ntopics; i++)
            free(c->topics[i]);
        free(c->topics);
        c->ntopics = 0;
        c->topics = calloc(n ? n : 1, sizeof *c->topics);
        for (size_t i = 0; c->topics && i < n; i++)
            if ((c->topics[i] = strdup(topics[i]))) c->ntopics++;
    }
    return 0;
}

void al_consumer_set_rebalance_cb(al_consumer *c, al_rebalance_fn fn, void *ctx)
{
    c->rb_fn = fn;
    c->rb_ctx = ctx;
}

/* Builds the "offsets were lost" message for a partition whose committed offset is gone. */
static void consumer_offset_gone(al_consumer *c, const rd_kafka_message_t *m)
{
    const char *topic = m->rkt ? rd_kafka_topic_name(m->rkt) : "?";
    int32_t part = m->partition;
    int64_t want = m->offset;
    int64_t lo = -1, hi = -1;
    if (want < 0 && m->rkt) {
        rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(1);
        rd_kafka_topic_partition_list_add(l, topic, part);
        if (!rd_kafka_committed(c->rk, l, 5000)) want = l->elems[0].offset;
        rd_kafka_topic_partition_list_destroy(l);
    }
    rd_kafka_resp_err_t e =
        m->rkt ? al_kafka_watermarks(c->rk, topic, part, &lo, &hi, 5000)
               : RD_KAFKA_RESP_ERR__UNKNOWN_TOPIC;
    if (!e && want >= 0 && lo > want)
        consumer_fail(c,
                      "%s [%d]: committed offset %lld is gone from the broker (earliest is "
                      "%lld): offsets %lld..%lld were lost before this consumer read them; "
                      "refusing to skip them (%s)",
                      topic, (int)part, (long long)want, (long long)lo, (long long)want,
                      (long long)(lo - 1), rd_kafka_message_errstr(m));
    else if (!e && want >= 0)
        consumer_fail(c,
                      "%s [%d]: offset %lld is not available on the broker (it holds %lld..%lld); "
                      "refusing to skip (%s)",
                      topic, (int)part, (long long)want, (long long)lo, (long long)(hi - 1),
                      rd_kafka_message_errstr(m));
    else
        consumer_fail(c,
                      "%s [%d]: committed offset %lld is not available on the broker; "
                      "refusing to skip (%s)",
                      topic, (int)part, (long long)want, rd_kafka_message_errstr(m));
}

/* librdkafka before 2.2 stops fetching a partition while the consumer queue is over
 * queued.max.messages.kbytes and only looks again when its broker thread wakes up, which
 * with nothing else to do is after a second (librdkafka issue #2879; 2.2 added
 * fetch.queue.backoff.ms). A consumer that drains its queue faster than that then sits idle
 * for the rest of the second with the backlog still on the broker: bench_credit lost about
 * a second per 64 MB to it, and t0202 (16 MB behind a 32 KB queue) took 49 s instead of under
 * one. So the wrapper asks the leaders of the partitions known to have more (position below
 * the high watermark of the last fetch) for their offsets: the requests wake their broker
 * threads, which then see the queue has room and fetch. rd_kafka_offsets_for_times sends one
 * request per leader and, with no time to wait, returns at once: the answers are not needed
 * (rd_kafka_query_watermark_offsets waits for its answer whatever its timeout, and one queued
 * behind a fetch the broker holds kept the stage waiting up to fetch.wait.max.ms). A
 * caught-up consumer never asks; one whose wakes bring nothing (the leaders are away) asks
 * ever less often, down to once a second. */
static void wake_stalled_fetchers(al_consumer *c)
{
    int64_t now = al_mono_us();
    if (!c->wake_fetchers || !c->nparts || now - c->last_wake_us < c->wake_every_us) return;
    /* nothing handed out since the last wake: back off (10 ms doubling to 1 s) */
    if (c->last_wake_us && !c->handed_since_wake)
        c->wake_every_us = c->wake_every_us * 2 > 1000000 ? 1000000 : c->wake_every_us * 2;
    else
        c->wake_every_us = 10000;
    c->last_wake_us = now;
    c->handed_since_wake = 0;
    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new((int)c->nparts);
    for (size_t i = 0; i < c->nparts; i++)
        rd_kafka_topic_partition_list_add(l, c->parts[i]->topic, c->parts[i]->partition);
    rd_kafka_topic_partition_list_t *behind = NULL;
    if (rd_kafka_position(c->rk, l) == RD_KAFKA_RESP_ERR_NO_ERROR)
        for (int i = 0; i < l->cnt; i++) {
            const rd_kafka_topic_partition_t *p = &l->elems[i];
            int64_t lo, hi;
            if (p->offset < 0 ||
                rd_kafka_get_watermark_offsets(c->rk, p->topic, p->partition, &lo, &hi) ||
                hi <= p->offset)
                continue;
            if (!behind) behind = rd_kafka_topic_partition_list_new(l->cnt);
            /* a timestamp of -1 asks for the end offset */
            rd_kafka_topic_partition_list_add(behind, p->topic, p->partition)->offset = -1;
        }
    if (behind) {
        (void)rd_kafka_offsets_for_times(c->rk, behind, 0);
        rd_kafka_topic_partition_list_destroy(behind);
    }
    rd_kafka_topic_partition_list_destroy(l);
}

/* Waking only once the queue is empty leaves the stage without messages for a fetch round
 * trip each time the fetcher has stopped at the limit (bench_credit: 20-60 ms gaps per
 * 64 MB). So the wrapper also wakes it when the queue (counted in messages of the mean size
 * handed out) is below half of queued.max.messages.kbytes and has not grown since the last
 * batch was taken. */
static void wake_before_empty(al_consumer *c)
{
    if (!c->wake_fetchers || !c->nparts || c->mean_len <= 0) return;
    size_t qlen = rd_kafka_queue_length(c->queue);
    if (qlen > c->queue_after_batch || (double)qlen * c->mean_len > c->queue_max_bytes / 2)
        return;
    wake_stalled_fetchers(c);
}

/* After a rebalance inside a batch call: drops the batch's messages of partitions no longer
 * assigned (taken before the revoke was served; their offsets are the next owner's). */
static void batch_drop_unowned(al_consumer *c)
{
    size_t keep = c->ibatch;
    for (size_t i = c->ibatch; i < c->nbatch; i++) {
        rd_kafka_message_t *m = c->batch[i];
        if (m->rkt && !ps_find(c, rd_kafka_topic_name(m->rkt), m->partition))
            rd_kafka_message_destroy(m);
        else
            c->batch[keep++] = m;
    }
    c->nbatch = keep;
}

/* The next message or event: from the batch, else from a new batch taken without waiting,
 * else the first one to arrive within wait_ms (NULL if none). */
static rd_kafka_message_t *next_message(al_consumer *c, int wait_ms)
{
    if (c->ibatch < c->nbatch) return c->batch[c->ibatch++];
    c->ibatch = c->nbatch = 0;
    unsigned seen = c->rebalances;
    wake_before_empty(c);
    ssize_t n = rd_kafka_consume_batch_queue(c->queue, 0, c->batch, AL_CONSUMER_BATCH);
    if (n > 0) {
        c->nbatch = (size_t)n;
        c->queue_after_batch = rd_kafka_queue_length(c->queue);
        if (seen != c->rebalances) batch_drop_unowned(c);
        if (c->nbatch) return c->batch[c->ibatch++];
    }
    /* The batch call returns early only when its array is full; waiting is left to the
     * single-message poll, which returns as soon as one arrives. */
    return rd_kafka_consumer_poll(c->rk, wait_ms);
}

int al_consumer_poll(al_consumer *c, int timeout_ms, rd_kafka_message_t **out, char *errstr,
                     size_t errlen)
{
    int64_t deadline = -1;
    *out = NULL;
    for (;;) {
        if (c->fenced && !c->failed) consumer_rejoin(c);
        if (c->ibatch == c->nbatch) {
            /* between batches: the linked producer's reports, then the offsets they freed */
            if (c->linked) {
                char ferr[512];
                rd_kafka_poll(al_producer_handle(c->linked), 0);
                if (al_producer_fatal(c->linked, ferr, sizeof ferr)) {
                    if (!c->commit_fn) consumer_fail(c, "%s", ferr);
                    else return 0; /* a transactional owner deals with its producer's */
                }
            }
            consumer_store_offsets(c);
        }
        if (c->failed) return al_err(errstr, errlen, "%s", c->fail_reason);

        int wait = 0;
        if (c->ibatch == c->nbatch) {
            int64_t now = al_mono_us();
            if (deadline < 0) deadline = now + (int64_t)timeout_ms * 1000;
            int64_t left_ms = (deadline - now) / 1000;
            if (left_ms < 0) left_ms = 0;
            /* Come back often enough to serve the linked producer's delivery reports, and
             * to notice a stalled fetcher soon (wake_stalled_fetchers). */
            int cap = c->wake_fetchers && c->nparts ? 10 : c->linked ? 20 : -1;
            wait = (int)(cap >= 0 && left_ms > cap ? cap : left_ms);
        }
        rd_kafka_message_t *m = next_message(c, wait);
        if (m && !m->err) {
            c->mean_len += ((double)m->len - c->mean_len) / 64;
            c->handed_since_wake++;
            *out = m;
            return 1;
        }
        if (m) {
            switch (m->err) {
            case RD_KAFKA_RESP_ERR__PARTITION_EOF:
                *out = m;
                return 1;
            case RD_KAFKA_RESP_ERR__AUTO_OFFSET_RESET:
            case RD_KAFKA_RESP_ERR_OFFSET_OUT_OF_RANGE:
                consumer_offset_gone(c, m);
                break;
            default:
                if (m->err == RD_KAFKA_RESP_ERR__FATAL && c->instance_id[0] &&
                    rd_kafka_fatal_error(c->rk, NULL, 0) == RD_KAFKA_RESP_ERR_FENCED_INSTANCE_ID) {
                    c->fenced = 1; /* consumer_rejoin, below */
                } else if (al_kafka_error_classify(m->err) == AL_KAFKA_ERRCLASS_FATAL) {
                    consumer_fail(c, "consumer error: %s", rd_kafka_message_errstr(m));
                } else if (m->err == RD_KAFKA_RESP_ERR__TRANSPORT ||
                           m->err == RD_KAFKA_RESP_ERR__ALL_BROKERS_DOWN) {
                    int64_t now = al_mono_us();
                    if (now - c->last_down_log_us > 10 * 1000000) {
                        char msg[768];
                        al_kafka__unreachable_message(c->rk, rd_kafka_message_errstr(m), msg,
                                                      sizeof msg);
                        al_log_warn("kafka", "%s; retrying", msg);
                        c->last_down_log_us = now;
                    }
                } else {
                    al_log_warn("kafka", "consumer: %s (%s, retrying)", rd_kafka_message_errstr(m),
                                rd_kafka_err2name(m->err));
                }
            }
            rd_kafka_message_destroy(m);
            if (c->ibatch < c->nbatch) continue;
            if (!c->failed && deadline >= 0 && al_mono_us() >= deadline) return 0;
            continue;
        }
        wake_stalled_fetchers(c);
        if (al_mono_us() >= deadline) return 0;
    }
}

int al_consumer_commit(al_consumer *c, char *errstr, size_t errlen)
{
    if (c->commit_fn) return c->commit_fn(c, "commit", 30000, errstr, errlen, c->commit_ctx);
    consumer_store_offsets(c);
    rd_kafka_resp_err_t err = rd_kafka_commit(c->rk, NULL, 0);
    if (err && err != RD_KAFKA_RESP_ERR__NO_OFFSET)
        return al_err(errstr, errlen, "commit: %s", rd_kafka_err2str(err));
    return 0;
}

void al_consumer_commit_async(al_consumer *c)
{
    if (c->commit_fn) return;
    consumer_store_offsets(c);
    rd_kafka_resp_err_t err = rd_kafka_commit(c->rk, NULL, 1);
    if (err && err != RD_KAFKA_RESP_ERR__NO_OFFSET)
        al_log_debug("kafka", "asynchronous commit not sent: %s", rd_kafka_err2str(err));
}

int al_consumer_commit_within(al_consumer *c, int timeout_ms, char *errstr, size_t errlen)
{
    if (c->commit_fn) return c->commit_fn(c, "commit", timeout_ms, errstr, errlen, c->commit_ctx);
    consumer_store_offsets(c);
    rd_kafka_queue_t *q = rd_kafka_queue_new(c->rk);
    if (!q) return al_err(errstr, errlen, "commit: out of memory");
    rd_kafka_resp_err_t err = rd_kafka_commit_queue(c->rk, NULL, q, NULL, NULL);
    if (!err) {
        /* the result comes as an event on q; a broker that does not answer leaves it to
         * librdkafka (the queue outlives our handle) */
        rd_kafka_event_t *ev = rd_kafka_queue_poll(q, timeout_ms > 0 ? timeout_ms : 0);
        if (!ev) {
            rd_kafka_queue_destroy(q);
            return al_err(errstr, errlen, "commit: no answer from the broker within %d ms",
                          timeout_ms);
        }
        err = rd_kafka_event_error(ev);
        rd_kafka_event_destroy(ev);
    }
    rd_kafka_queue_destroy(q);
    if (err && err != RD_KAFKA_RESP_ERR__NO_OFFSET)
        return al_err(errstr, errlen, "commit: %s", rd_kafka_err2str(err));
    return 0;
}

int al_consumer_check(al_consumer *c, int timeout_ms, char *errstr, size_t errlen)
{
    return al_kafka_check_reachable(c->rk, timeout_ms, errstr, errlen);
}

rd_kafka_t *al_consumer_handle(al_consumer *c)
{
    return c->rk;
}

int al_consumer_read_to_end(al_consumer *c, const char *topic, int32_t partition,
                            int64_t next_offset)
{
    int64_t lo = 0, hi = 0;
    if (rd_kafka_get_watermark_offsets(c->rk, topic, partition, &lo, &hi) !=
            RD_KAFKA_RESP_ERR_NO_ERROR ||
        hi < 0)
        return 1;
    if (next_offset >= hi) return 1;
    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(1);
    if (!l) return 0;
    rd_kafka_topic_partition_list_add(l, topic, partition);
    int64_t pos = -1; /* RD_KAFKA_OFFSET_INVALID (-1001) when it has none */
    if (rd_kafka_position(c->rk, l) == RD_KAFKA_RESP_ERR_NO_ERROR && !l->elems[0].err)
        pos = l->elems[0].offset;
    rd_kafka_topic_partition_list_destroy(l);
    return pos >= hi;
}

/* ------------------------------------------------------------------------------------------
 * Owner-written commits (transactions)
 * ------------------------------------------------------------------------------------------ */

void al_consumer_set_commit_fn(al_consumer *c, al_commit_fn fn, void *ctx)
{
    c->commit_fn = fn;
    c->commit_ctx = ctx;
}

void al_consumer_set_linked(al_consumer *c, al_producer *linked)
{
    c->linked = linked;
}

rd_kafka_topic_partition_list_t *al_consumer_committable(al_consumer *c)
{
    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new((int)c->nparts + 1);
    for (size_t i = 0; i < c->nparts; i++) {
        int64_t off = al_offset_tracker_committable(c->parts[i]->tracker);
        if (off >= 0)
            rd_kafka_topic_partition_list_add(l, c->parts[i]->topic, c->parts[i]->partition)
                ->offset = off;
    }
    return l;
}

const char *al_consumer_committed_metadata(al_consumer *c, const char *topic, int32_t partition,
                                           int64_t *offset)
{
    al_part_state *ps = ps_find(c, topic, partition);
    if (offset) *offset = ps ? ps->meta_offset : -1;
    return ps ? ps->meta : NULL;
}

void al_consumer_drop_all(al_consumer *c)
{
    while (c->ibatch < c->nbatch)
        rd_kafka_message_destroy(c->batch[c->ibatch++]);
    c->ibatch = c->nbatch = 0;
    c->rebalances++;
    if (!c->nparts) return;
    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new((int)c->nparts);
    for (size_t i = 0; i < c->nparts; i++)
        rd_kafka_topic_partition_list_add(l, c->parts[i]->topic, c->parts[i]->partition);
    for (int i = 0; i < l->cnt; i++)
        ps_remove(c, l->elems[i].topic, l->elems[i].partition);
    if (c->rb_fn) c->rb_fn(c, AL_REBALANCE_LOST, l, c->rb_ctx);
    rd_kafka_topic_partition_list_destroy(l);
}

int al_consumer_seek_committed(al_consumer *c, char *errstr, size_t errlen)
{
    rd_kafka_topic_partition_list_t *a = NULL;
    rd_kafka_resp_err_t err = rd_kafka_assignment(c->rk, &a);
    if (err) return al_err(errstr, errlen, "reading the assignment: %s", rd_kafka_err2str(err));
    if (!a->cnt) {
        rd_kafka_topic_partition_list_destroy(a);
        return 0;
    }
    rd_kafka_topic_partition_list_t *committed = assign_start_offsets(c, a);
    int rc = 0;
    for (int i = 0; i < a->cnt && !rc; i++) {
        if (a->elems[i].offset == RD_KAFKA_OFFSET_INVALID)
            rc = al_err(errstr, errlen, "%s [%d]: the committed offset is unknown (the broker did "
                        "not answer)", a->elems[i].topic, (int)a->elems[i].partition);
        else if (!ps_add(c, a->elems[i].topic, a->elems[i].partition))
            rc = al_err(errstr, errlen, "out of memory");
    }
    if (!rc) {
        keep_committed_metadata(c, committed);
        rd_kafka_error_t *e = rd_kafka_seek_partitions(c->rk, a, 10000);
        if (!e) {
            for (int i = 0; i < a->cnt && !rc; i++)
                if (a->elems[i].err)
                    rc = al_err(errstr, errlen, "seeking %s [%d] to %lld: %s", a->elems[i].topic,
                                (int)a->elems[i].partition, (long long)a->elems[i].offset,
                                rd_kafka_err2str(a->elems[i].err));
        } else {
            rc = al_err(errstr, errlen, "seeking back: %s", rd_kafka_error_string(e));
            rd_kafka_error_destroy(e);
        }
        for (int i = 0; i < a->cnt; i++)
            al_log_info("kafka", "%s [%d]: back at offset %lld", a->elems[i].topic,
                        (int)a->elems[i].partition, (long long)a->elems[i].offset);
    }
    if (committed) rd_kafka_topic_partition_list_destroy(committed);
    rd_kafka_topic_partition_list_destroy(a);
    return rc;
}
