/*
 * stage.c: the stage worker skeleton (stage.h): failure latch, health answer, stop request.
 */
#include "kafka/stage.h"

#include "core/log.h"
#include "core/util.h"

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

int al_stage_partitions_taken(al_rebalance_event ev, const rd_kafka_topic_partition_list_t *parts,
                              int closing, int *count)
{
    *count = 0;
    if (ev == AL_REBALANCE_ASSIGNED || stage_stop || closing) return 0;
    if (parts && parts->cnt == 0) return 0;
    *count = parts ? parts->cnt : 0;
    return 1;
}

int al_stage_subscribe(al_consumer *c, const char *topic, al_rebalance_fn on_rebalance, void *ctx,
                       char *errstr, size_t errlen)
{
    if (on_rebalance) al_consumer_set_rebalance_cb(c, on_rebalance, ctx);
    const char *topics[] = {topic};
    return al_consumer_subscribe(c, topics, 1, errstr, errlen);
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
