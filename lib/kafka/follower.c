/*
 * follower.c: one topic followed from its beginning (follower.h): the policy follower of the
 * batch and serve stages.
 */
#include "kafka/follower.h"

#include "core/util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct al_follower {
    rd_kafka_t *rk;
    char *topic, *missing_hint;
    int timeout_ms;
    int nparts;    /* 0: not assigned yet */
    int64_t *end;  /* per partition: the high watermark when assigned */
    char *reached; /* per partition: its end was reached */
    int nreached;
};

al_follower *al_follower_new(const al_kafka_conf *conf, const al_follower_opts *o, char *errstr,
                             size_t errlen)
{
    al_follower *f = calloc(1, sizeof *f);
    if (!f || !(f->topic = strdup(o->topic)) ||
        (o->missing_hint && !(f->missing_hint = strdup(o->missing_hint)))) {
        al_err(errstr, errlen, "out of memory");
        al_follower_free(f);
        return NULL;
    }
    f->timeout_ms = o->timeout_ms;
    if (!(f->rk = al_kafka_reader_new(conf, o->client, errstr, errlen))) {
        al_follower_free(f);
        return NULL;
    }
    return f;
}

void al_follower_free(al_follower *f)
{
    if (!f) return;
    if (f->rk) rd_kafka_destroy_flags(f->rk, RD_KAFKA_DESTROY_F_NO_CONSUMER_CLOSE);
    free(f->end);
    free(f->reached);
    free(f->topic);
    free(f->missing_hint);
    free(f);
}

/* Number of partitions of the topic. -1 with errstr: no answer, or no such topic. */
static int follower_partitions(al_follower *f, char *errstr, size_t errlen)
{
    /* every topic rather than this one: naming it would make a broker with auto-creation on
     * create it */
    const struct rd_kafka_metadata *md = NULL;
    rd_kafka_resp_err_t err = rd_kafka_metadata(f->rk, 1, NULL, &md, f->timeout_ms);
    if (err)
        return al_err(errstr, errlen, "cannot read the cluster's metadata: %s",
                      rd_kafka_err2str(err));
    int n = -1;
    for (int i = 0; i < md->topic_cnt; i++)
        if (strcmp(md->topics[i].topic, f->topic) == 0 && !md->topics[i].err)
            n = md->topics[i].partition_cnt;
    rd_kafka_metadata_destroy(md);
    if (n <= 0)
        return al_err(errstr, errlen, "topic %s does not exist%s", f->topic,
                      f->missing_hint ? f->missing_hint : "");
    return n;
}

int al_follower_assign(al_follower *f, char *errstr, size_t errlen)
{
    if (f->nparts) return 0;
    int n = follower_partitions(f, errstr, errlen);
    if (n < 0) return -1;
    int64_t *end = calloc((size_t)n, sizeof *end);
    char *reached = calloc((size_t)n, 1);
    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(n);
    int nreached = 0, rc = -1;
    if (!end || !reached || !l) {
        al_err(errstr, errlen, "out of memory");
        goto out;
    }
    for (int p = 0; p < n; p++) {
        int64_t lo = 0, hi = 0;
        rd_kafka_resp_err_t err = al_kafka_watermarks(f->rk, f->topic, p, &lo, &hi, f->timeout_ms);
        if (err) {
            al_err(errstr, errlen, "cannot read the end offsets of %s [%d]: %s", f->topic, p,
                   rd_kafka_err2str(err));
            goto out;
        }
        end[p] = hi;
        if (hi <= lo) reached[p] = 1, nreached++;
        rd_kafka_topic_partition_list_add(l, f->topic, p)->offset = RD_KAFKA_OFFSET_BEGINNING;
    }
    rd_kafka_resp_err_t err = rd_kafka_assign(f->rk, l);
    if (err) {
        al_err(errstr, errlen, "cannot assign %s: %s", f->topic, rd_kafka_err2str(err));
        goto out;
    }
    f->nparts = n, f->end = end, f->reached = reached, f->nreached = nreached;
    end = NULL, reached = NULL;
    rc = 0;
out:
    if (l) rd_kafka_topic_partition_list_destroy(l);
    free(end);
    free(reached);
    return rc;
}

int al_follower_caught_up(const al_follower *f)
{
    return f->nparts > 0 && f->nreached == f->nparts;
}

static void follower_reached(al_follower *f, int32_t partition)
{
    if (partition < 0 || partition >= f->nparts || f->reached[partition]) return;
    f->reached[partition] = 1;
    f->nreached++;
}

int al_follower_next(al_follower *f, int timeout_ms, rd_kafka_message_t **out)
{
    *out = NULL;
    for (;;) {
        rd_kafka_message_t *m = rd_kafka_consumer_poll(f->rk, timeout_ms);
        if (!m) return 0;
        if (m->err == RD_KAFKA_RESP_ERR__PARTITION_EOF) {
            follower_reached(f, m->partition);
            rd_kafka_message_destroy(m);
            timeout_ms = 0; /* what else is there now, without waiting again */
            continue;
        }
        *out = m;
        if (m->err) return -1;
        if (m->partition >= 0 && m->partition < f->nparts && m->offset + 1 >= f->end[m->partition])
            follower_reached(f, m->partition);
        return 1;
    }
}
