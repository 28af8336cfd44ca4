/*
 * topic_reader.c: the assign-based reader behind tail, record and the rollout controller (see topic_reader.h).
 * The end of a partition is detected from librdkafka's partition-EOF events rather than
 * from offsets alone: compacted topics (arclight.policy) and transaction markers leave
 * gaps, so the last message before the high watermark may not exist.
 */
#define _GNU_SOURCE /* strptime, timegm */
#include "kafka/topic_reader.h"

#include "core/log.h"
#include "core/util.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define METADATA_TIMEOUT_MS 10000

typedef struct part {
    char *topic;
    int32_t partition;
    int64_t pos; /* next offset we expect */
    int64_t end; /* exclusive; INT64_MAX: none */
    int done;
} part;

struct al_topic_reader {
    rd_kafka_t *rk;
    part *parts;
    size_t nparts, ndone;
    int64_t start_time_ms; /* -1: none */
    int64_t end_time_ms;   /* -1: none */
    char bootstrap[512];
};

int al_topic_parse_partition(const char *s, int32_t *out)
{
    char *end;
    errno = 0;
    long p = strtol(s, &end, 10);
    if (errno || *end || end == s || p < 0 || p > INT32_MAX) return -1;
    *out = (int32_t)p;
    return 0;
}

int al_topic_parse_time(const char *s, int64_t *ms_out)
{
    if (!s || !*s) return -1;
    const char *p = s;
    while (isdigit((unsigned char)*p))
        p++;
    if (!*p) {
        *ms_out = strtoll(s, NULL, 10);
        return 0;
    }
    struct tm tm;
    memset(&tm, 0, sizeof tm);
    const char *rest = strptime(s, "%Y-%m-%dT%H:%M:%S", &tm);
    if (!rest) return -1;
    int64_t ms = 0;
    if (*rest == '.') {
        int digits = 0;
        rest++;
        while (isdigit((unsigned char)*rest)) {
            if (digits < 3) ms = ms * 10 + (*rest - '0');
            digits++;
            rest++;
        }
        if (digits == 0) return -1;
        for (; digits < 3; digits++)
            ms *= 10;
    }
    if (strcmp(rest, "Z") != 0 && strcmp(rest, "+00:00") != 0) return -1;
    time_t t = timegm(&tm);
    if (t == (time_t)-1) return -1;
    *ms_out = (int64_t)t * 1000 + ms;
    return 0;
}

void al_topic_reader_free(al_topic_reader *r)
{
    if (!r) return;
    if (r->rk) {
        rd_kafka_consumer_close(r->rk);
        rd_kafka_destroy(r->rk);
    }
    for (size_t i = 0; i < r->nparts; i++)
        free(r->parts[i].topic);
    free(r->parts);
    free(r);
}

/* Adds the selected partitions of one topic with their start and end offsets. 0, or -1
 * with errstr. */
static int reader_add_topic(al_topic_reader *r, const char *topic, const al_topic_reader_opts *o,
                            char *errstr, size_t errlen)
{
    /* Ask for every topic rather than this one: a metadata request naming a topic makes
     * brokers with auto-creation on (the embedded one) create it, and a typo would then
     * tail an empty new topic instead of failing. */
    const struct rd_kafka_metadata *md = NULL;
    rd_kafka_resp_err_t err = rd_kafka_metadata(r->rk, 1, NULL, &md, METADATA_TIMEOUT_MS);
    if (err)
        return al_err(errstr, errlen, "cannot reach Kafka at %s: %s", r->bootstrap,
                      rd_kafka_err2str(err));
    int cnt = -1;
    rd_kafka_resp_err_t terr = 0;
    for (int i = 0; i < md->topic_cnt; i++)
        if (strcmp(md->topics[i].topic, topic) == 0) {
            cnt = md->topics[i].partition_cnt;
            terr = md->topics[i].err;
        }
    rd_kafka_metadata_destroy(md);
    if (cnt <= 0 || terr)
        return al_err(errstr, errlen, "topic '%s' does not exist on %s%s%s", topic, r->bootstrap,
                      terr ? ": " : "", terr ? rd_kafka_err2str(terr) : "");
    if (o->partition >= cnt)
        return al_err(errstr, errlen, "topic '%s' has %d partition%s; there is no partition %d",
                      topic, cnt, cnt == 1 ? "" : "s", (int)o->partition);

    for (int p = 0; p < cnt; p++) {
        if (o->partition >= 0 && p != o->partition) continue;
        int64_t lo = 0, hi = 0;
        err = al_kafka_watermarks(r->rk, topic, p, &lo, &hi, METADATA_TIMEOUT_MS);
        if (err)
            return al_err(errstr, errlen, "%s [%d]: cannot read watermarks from %s: %s", topic, p,
                          r->bootstrap, rd_kafka_err2str(err));
        int64_t start = hi;
        switch (o->start) {
        case AL_TOPIC_START_END:
            start = hi;
            break;
        case AL_TOPIC_START_BEGINNING:
            start = lo;
            break;
        case AL_TOPIC_START_OFFSET:
            if (o->start_offset < lo)
                return al_err(errstr, errlen,
                              "%s [%d]: offset %lld is no longer on the broker (earliest is "
                              "%lld)",
                              topic, p, (long long)o->start_offset, (long long)lo);
            start = o->start_offset;
            break;
        case AL_TOPIC_START_TIME: {
            /* The broker's time index is used when it names a message; otherwise (no
             * answer, or the end, which the embedded broker says for any time) the
             * partition is scanned from its start. Either way messages are filtered by
             * timestamp as they are read, so the index only saves reading. */
            rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(1);
            rd_kafka_topic_partition_list_add(l, topic, p)->offset = o->start_time_ms;
            start = lo;
            if (rd_kafka_offsets_for_times(r->rk, l, METADATA_TIMEOUT_MS) == 0 &&
                l->elems[0].err == 0 && l->elems[0].offset > lo && l->elems[0].offset < hi)
                start = l->elems[0].offset;
            rd_kafka_topic_partition_list_destroy(l);
            break;
        }
        }
        int64_t end = o->follow ? INT64_MAX : hi;
        if (o->end_offset >= 0 && o->end_offset < end) end = o->end_offset;
        part *np = realloc(r->parts, (r->nparts + 1) * sizeof *np);
        if (!np) return al_err(errstr, errlen, "out of memory");
        r->parts = np;
        part *pp = &r->parts[r->nparts];
        pp->topic = strdup(topic);
        if (!pp->topic) return al_err(errstr, errlen, "out of memory");
        pp->partition = p;
        pp->pos = start;
        pp->end = end;
        pp->done = start >= end;
        r->nparts++;
        if (pp->done) r->ndone++;
        al_log_debug("tail", "%s [%d]: watermarks %lld..%lld, reading %lld..%s", topic, p,
                     (long long)lo, (long long)hi, (long long)start,
                     end == INT64_MAX ? "follow" : "end");
    }
    return 0;
}

al_topic_reader *al_topic_reader_new(const al_kafka_conf *conf, const al_topic_reader_opts *o,
                                     char *errstr, size_t errlen)
{
    al_topic_reader *r = calloc(1, sizeof *r);
    if (!r) {
        al_err(errstr, errlen, "out of memory");
        return NULL;
    }
    r->start_time_ms = o->start == AL_TOPIC_START_TIME ? o->start_time_ms : -1;
    r->end_time_ms = o->end_time_ms;
    const char *bs = al_kafka_conf_get(conf, "bootstrap.servers");
    snprintf(r->bootstrap, sizeof r->bootstrap, "%s", bs ? bs : "(unset)");
    r->rk = al_kafka_reader_new(conf, "arclight-reader", errstr, errlen);
    if (!r->rk) goto fail;
    for (size_t i = 0; i < o->ntopics; i++)
        if (reader_add_topic(r, o->topics[i], o, errstr, errlen) != 0) goto fail;

    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new((int)r->nparts + 1);
    for (size_t i = 0; i < r->nparts; i++)
        if (!r->parts[i].done)
            rd_kafka_topic_partition_list_add(l, r->parts[i].topic, r->parts[i].partition)->offset =
                r->parts[i].pos;
    rd_kafka_resp_err_t err = l->cnt ? rd_kafka_assign(r->rk, l) : 0;
    rd_kafka_topic_partition_list_destroy(l);
    if (err) {
        al_err(errstr, errlen, "cannot assign partitions: %s", rd_kafka_err2str(err));
        goto fail;
    }
    return r;
fail:
    al_topic_reader_free(r);
    return NULL;
}

static part *find_part(al_topic_reader *r, const char *topic, int32_t partition)
{
    for (size_t i = 0; i < r->nparts; i++)
        if (r->parts[i].partition == partition && strcmp(r->parts[i].topic, topic) == 0)
            return &r->parts[i];
    return NULL;
}

/* Marks a partition finished and stops fetching it. */
static void part_finish(al_topic_reader *r, part *p)
{
    if (p->done) return;
    p->done = 1;
    r->ndone++;
    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(1);
    rd_kafka_topic_partition_list_add(l, p->topic, p->partition);
    rd_kafka_pause_partitions(r->rk, l);
    rd_kafka_topic_partition_list_destroy(l);
}

int al_topic_reader_next(al_topic_reader *r, int timeout_ms, rd_kafka_message_t **out, char *errstr,
                         size_t errlen)
{
    *out = NULL;
    if (r->ndone == r->nparts) return 2;
    rd_kafka_message_t *m = rd_kafka_consumer_poll(r->rk, timeout_ms);
    if (!m) return 0;
    const char *topic = m->rkt ? rd_kafka_topic_name(m->rkt) : "";
    part *p = find_part(r, topic, m->partition);
    if (m->err) {
        rd_kafka_resp_err_t e = m->err;
        if (e == RD_KAFKA_RESP_ERR__PARTITION_EOF) {
            if (p && m->offset >= p->end) part_finish(r, p);
            rd_kafka_message_destroy(m);
            return r->ndone == r->nparts ? 2 : 0;
        }
        if (e == RD_KAFKA_RESP_ERR__AUTO_OFFSET_RESET ||
            e == RD_KAFKA_RESP_ERR_OFFSET_OUT_OF_RANGE) {
            al_err(errstr, errlen,
                   "%s [%d]: offset %lld is no longer on the broker (%s); refusing to skip "
                   "ahead",
                   topic, (int)m->partition, p ? (long long)p->pos : -1LL,
                   rd_kafka_message_errstr(m));
            rd_kafka_message_destroy(m);
            return -1;
        }
        if (e == RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART || e == RD_KAFKA_RESP_ERR__UNKNOWN_TOPIC ||
            e == RD_KAFKA_RESP_ERR__UNKNOWN_PARTITION || e == RD_KAFKA_RESP_ERR__FATAL) {
            al_err(errstr, errlen, "%s [%d]: %s", topic, (int)m->partition,
                   rd_kafka_message_errstr(m));
            rd_kafka_message_destroy(m);
            return -1;
        }
        al_log_warn("tail", "%s: %s (retrying)", r->bootstrap, rd_kafka_message_errstr(m));
        rd_kafka_message_destroy(m);
        return 0;
    }
    if (!p || p->done || m->offset >= p->end) {
        if (p && m->offset >= p->end) part_finish(r, p);
        rd_kafka_message_destroy(m);
        return r->ndone == r->nparts ? 2 : 0;
    }
    p->pos = m->offset + 1;
    rd_kafka_timestamp_type_t tstype;
    int64_t ts = rd_kafka_message_timestamp(m, &tstype);
    if (r->end_time_ms >= 0 && ts > r->end_time_ms) {
        part_finish(r, p);
        rd_kafka_message_destroy(m);
        return r->ndone == r->nparts ? 2 : 0;
    }
    if (p->pos >= p->end) part_finish(r, p);
    if (r->start_time_ms >= 0 && ts < r->start_time_ms) {
        rd_kafka_message_destroy(m);
        return r->ndone == r->nparts ? 2 : 0;
    }
    *out = m;
    return 1;
}
