/*
 * stage.c: the stage worker (stage.h): the run, and the pieces it is made of (failure latch,
 * health answer, stop request, drain budget).
 */
#include "kafka/stage.h"

#include "core/cli.h"
#include "core/log.h"
#include "core/util.h"
#include "http/server.h"

#include <errno.h>
#include <malloc.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

/* One worker per process: the flag is the process's, as the signal disposition is. */
static volatile sig_atomic_t stage_stop;

static void stage_on_signal(int sig)
{
    (void)sig;
    stage_stop = 1;
}

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
    if (s->drain_deadline_us) return;
    s->drain_deadline_us = al_mono_us() + (int64_t)(seconds * 1e6);
    if (!s->drain_deadline_us) s->drain_deadline_us = 1;
}

int al_stage_drain_left_ms(const al_stage *s, int cap)
{
    if (!s->drain_deadline_us) return cap;
    int64_t left = (s->drain_deadline_us - al_mono_us()) / 1000;
    return left <= 0 ? 0 : left < cap ? (int)left : cap;
}

void al_stage_init(al_stage *s, const char *comp, const char *health_text, int log_failures)
{
    s->drain_deadline_us = 0;
    s->comp = comp;
    s->health_text = health_text;
    s->log_failures = log_failures;
    s->reason[0] = '\0';
    atomic_init(&s->failed, 0);
    s->spec = NULL;
    s->group = NULL;
    s->conf = NULL;
    s->producer = NULL;
    s->consumer = NULL;
    s->http = NULL;
    s->closing = 0;
}

/* The reason is written before the flag is published, and never again, so a reader on
 * another thread that sees the flag sees the whole reason. */
void al_stage_fail(al_stage *s, const char *fmt, ...)
{
    if (atomic_load(&s->failed)) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->reason, sizeof s->reason, fmt, ap);
    va_end(ap);
    atomic_store(&s->failed, 1);
    if (s->log_failures) al_log_error(s->comp, "%s", s->reason);
}

int al_stage_failed(const al_stage *s)
{
    return atomic_load(&s->failed);
}

const char *al_stage_reason(const al_stage *s)
{
    return s->reason;
}

int al_stage_health(void *ud, char *reason, size_t reasonlen)
{
    const al_stage *s = ud;
    if (!atomic_load(&s->failed)) return 0;
    snprintf(reason, reasonlen, "%s", s->health_text ? s->health_text : s->reason);
    return 1;
}

void al_stage_catch_signals(void)
{
    signal(SIGINT, stage_on_signal);
    signal(SIGTERM, stage_on_signal);
}

int al_stage_stop_requested(void)
{
    return stage_stop;
}

int al_stage_partitions_taken(const al_stage *s, al_rebalance_event ev,
                              const rd_kafka_topic_partition_list_t *parts, int *count)
{
    *count = 0;
    if (ev == AL_REBALANCE_ASSIGNED || stage_stop || s->closing) return 0;
    if (parts && parts->cnt == 0) return 0;
    *count = parts ? parts->cnt : 0;
    return 1;
}

int al_stage_parse_i64(const char *s, int64_t lo, int64_t *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < lo) return -1;
    *out = v;
    return 0;
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
    if (s->spec->hooks->rebalance) s->spec->hooks->rebalance(s, ev, parts, s->spec->ud);
}

static void stage_on_delivery(const al_delivery *d, void *ctx)
{
    al_stage *s = ctx;
    if (s->spec->hooks->delivery) s->spec->hooks->delivery(s, d, s->spec->ud);
}

/* Steps 1-6 of stage.h: 0 ready to consume, 1 nothing to do, -1 failed (logged). */
static int stage_start(al_stage *s)
{
    const al_stage_spec *spec = s->spec;
    char err[1024];
    if (!(s->conf = al_kafka_conf_from_cli(spec->common, err, sizeof err))) {
        al_log_error(s->comp, "%s", err);
        return -1;
    }
    for (const char *const *d = spec->conf_defaults; d && d[0] && d[1]; d += 2)
        if (!al_kafka_conf_get(s->conf, d[0]) && al_kafka_conf_set(s->conf, d[0], d[1]) != 0) {
            al_log_error(s->comp, "out of memory");
            return -1;
        }
    if (spec->common->metrics &&
        !(s->http = al_http_server_start(spec->common->metrics, spec->metrics, al_stage_health, s,
                                         err, sizeof err))) {
        al_log_error(s->comp, "%s", err);
        return -1;
    }
    al_stage_catch_signals();
    if (!(s->producer = al_producer_new(s->conf, err, sizeof err))) {
        al_log_error(s->comp, "%s", err);
        return -1;
    }
    al_producer_set_delivery_cb(s->producer, stage_on_delivery, s);
    /* The outputs' partitions and leaders now: otherwise the first message waits up to a
     * second for librdkafka's scan of unknown topics (and consumption backs up behind it),
     * and an unreachable cluster shows here rather than at the first output. */
    if (spec->outputs && spec->outputs[0] &&
        al_producer_prepare(s->producer, spec->outputs, 10000, err, sizeof err) != 0)
        al_log_warn(s->comp, "%s (sending anyway; messages wait for it)", err);
    if (spec->hooks->prepare) {
        int r = spec->hooks->prepare(s, spec->ud, err, sizeof err);
        if (r < 0) {
            al_log_error(s->comp, "%s", err);
            return -1;
        }
        if (r > 0) return 1;
    }
    if (!(s->consumer = al_consumer_new(s->conf, s->group, s->producer, err, sizeof err))) {
        al_log_error(s->comp, "%s", err);
        return -1;
    }
    al_consumer_set_rebalance_cb(s->consumer, stage_on_rebalance, s);
    const char *topics[] = {spec->input};
    if (al_consumer_subscribe(s->consumer, topics, 1, err, sizeof err) != 0) {
        al_log_error(s->comp, "%s", err);
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
    while (!al_stage_stop_requested() && !al_stage_failed(s)) {
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
        al_log_warn(s->comp, "%s (what was not committed is read again after a restart)", err);
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
    if (al_stage_failed(s) && !s->log_failures)
        al_log_error(s->comp, "stopping: %s", al_stage_reason(s));
    /* The close revokes every partition (the stage's rebalance callback drops their state);
     * inputs still held are ended only after it, when ending them can store nothing: a
     * failed run must not commit what it had not finished. */
    s->closing = 1;
    al_stage_drain_start(s, spec->drain_s);
    al_consumer_free_within(s->consumer, al_stage_drain_left_ms(s, AL_CONSUMER_CLOSE_MS));
    s->consumer = NULL;
    if (spec->hooks->release) spec->hooks->release(s, spec->ud);
    al_producer_free_within(s->producer, al_stage_drain_left_ms(s, 10000));
    s->producer = NULL;
    al_http_server_stop(s->http);
    s->http = NULL;
    al_kafka_conf_free(s->conf);
    s->conf = NULL;
    return rc;
}
