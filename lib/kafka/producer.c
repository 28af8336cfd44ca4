/*
 * producer.c: the idempotent producer wrapper. Every message carries a small send context
 * (the caller's opaque and the input it was produced from) so that its delivery report can
 * reach both the caller and the consumer's offset tracker.
 */
#include "kafka/internal.h"

#include "core/log.h"
#include "core/util.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct al_producer {
    rd_kafka_t *rk;
    al_delivery_fn dr_fn;
    void *dr_ctx;
    int block_ms;
    char bootstrap[512];
    pthread_mutex_t lock; /* guards last_error (written from librdkafka's threads) and the
                           * filling of topics[] */
    char last_error[1024];
    int fatal;
    /* Topic handles by name, so that a send does not look its topic up under the client's
     * write lock (what librdkafka does for a topic given by name). Slots are filled under
     * `lock` and published by `ntopics`; a stage writes to a few topics, and a send past
     * the slots makes a handle for itself. */
    struct {
        char *name;
        rd_kafka_topic_t *rkt;
    } topics[16];
    atomic_int ntopics;
    atomic_ullong sent; /* messages queued (al_producer_sent) */
};

typedef struct send_ctx {
    void *opaque;
    al_input *input;
} send_ctx;

/* Delivery report: runs on the thread that polls the producer. */
static void producer_dr_cb(rd_kafka_t *rk, const rd_kafka_message_t *m, void *opaque)
{
    al_producer *p = opaque;
    send_ctx *sc = m->_private;
    char reason[1024] = "";
    const char *topic = rd_kafka_topic_name(m->rkt);

    if (m->err) {
        char last[512];
        al_producer_last_error(p, last, sizeof last);
        snprintf(reason, sizeof reason, "delivery to %s [%d] failed: %s (%s)%s%s", topic,
                 (int)m->partition, rd_kafka_err2str(m->err),
                 al_kafka_errclass_name(al_kafka_error_classify(m->err)), last[0] ? "; " : "",
                 last);
    }
    if (p->dr_fn) {
        al_delivery d = {
            .opaque = sc ? sc->opaque : NULL,
            .err = m->err,
            .reason = reason,
            .topic = topic,
            .partition = m->partition,
            .offset = m->err ? -1 : m->offset,
        };
        p->dr_fn(&d, p->dr_ctx);
    }
    if (sc) {
        if (sc->input) al_input__delivered(sc->input, m->err, reason);
        free(sc);
    }
}

static void producer_error_cb(rd_kafka_t *rk, int err, const char *reason, void *opaque)
{
    al_producer *p = opaque;
    al_kafka__error_common(rk, err, reason);
    pthread_mutex_lock(&p->lock);
    if (err == RD_KAFKA_RESP_ERR__FATAL) {
        char fbuf[400];
        rd_kafka_resp_err_t ferr = rd_kafka_fatal_error(rk, fbuf, sizeof fbuf);
        p->fatal = 1;
        snprintf(p->last_error, sizeof p->last_error, "fatal producer error (%s): %s",
                 rd_kafka_err2name(ferr), fbuf);
    } else if (err == RD_KAFKA_RESP_ERR__ALL_BROKERS_DOWN || err == RD_KAFKA_RESP_ERR__TRANSPORT ||
               err == RD_KAFKA_RESP_ERR__RESOLVE) {
        char r[256];
        if (!al_kafka__reason_get(rk, r, sizeof r)) snprintf(r, sizeof r, "%s", reason);
        snprintf(p->last_error, sizeof p->last_error, "cannot reach Kafka at %s: %s%s",
                 p->bootstrap, r,
                 err == RD_KAFKA_RESP_ERR__ALL_BROKERS_DOWN ? " (all brokers down)" : "");
    } else {
        snprintf(p->last_error, sizeof p->last_error, "Kafka at %s: %s", p->bootstrap, reason);
    }
    pthread_mutex_unlock(&p->lock);
}

/* acks and idempotence are part of the at-least-once contract: refuse a weaker setting. */
static int producer_conf_check(al_kafka_conf *c, char *errstr, size_t errlen)
{
    const char *acks = al_kafka_conf_get(c, "acks");
    const char *rq = al_kafka_conf_get(c, "request.required.acks");
    const char *idem = al_kafka_conf_get(c, "enable.idempotence");
    if ((acks && strcmp(acks, "all") && strcmp(acks, "-1")) ||
        (rq && strcmp(rq, "all") && strcmp(rq, "-1")))
        return al_err(errstr, errlen,
                      "producer: acks=%s is not allowed; arclight needs acks=all so that an "
                      "input offset is stored only after its outputs are fully replicated",
                      acks ? acks : rq);
    if (idem && strcmp(idem, "true"))
        return al_err(errstr, errlen,
                      "producer: enable.idempotence=%s is not allowed; arclight needs it so that "
                      "retries neither duplicate nor reorder messages",
                      idem);
    if (al_kafka_conf_set(c, "enable.idempotence", "true") || al_kafka_conf_set(c, "acks", "all"))
        return al_err(errstr, errlen, "out of memory");
    return 0;
}

/* Keys that are arclight's own (consumer start position) and not librdkafka producer keys. */
static const char *const producer_skip[] = {"auto.offset.reset", NULL};

al_producer *al_producer_new(const al_kafka_conf *conf, char *errstr, size_t errlen)
{
    char err[512];
    al_kafka_conf *c = al_kafka_conf_dup(conf);
    al_producer *p = calloc(1, sizeof *p);
    rd_kafka_conf_t *rc = NULL;
    if (!c || !p) {
        al_err(errstr, errlen, "out of memory");
        goto fail;
    }
    if (producer_conf_check(c, errstr, errlen) != 0) goto fail;
    rc = al_kafka__conf_build(c, producer_skip, errstr, errlen);
    if (!rc) goto fail;
    const char *bs = al_kafka_conf_get(c, "bootstrap.servers");
    snprintf(p->bootstrap, sizeof p->bootstrap, "%s", bs ? bs : "(no bootstrap.servers)");
    pthread_mutex_init(&p->lock, NULL);
    p->block_ms = 30000;
    rd_kafka_conf_set_opaque(rc, p);
    rd_kafka_conf_set_dr_msg_cb(rc, producer_dr_cb);
    rd_kafka_conf_set_error_cb(rc, producer_error_cb);
    p->rk = rd_kafka_new(RD_KAFKA_PRODUCER, rc, err, sizeof err);
    if (!p->rk) {
        al_err(errstr, errlen, "cannot create Kafka producer: %s", err);
        rd_kafka_conf_destroy(rc);
        pthread_mutex_destroy(&p->lock);
        goto fail;
    }
    al_kafka_conf_free(c);
    return p;
fail:
    al_kafka_conf_free(c);
    free(p);
    return NULL;
}

/* The handle of topic `name`, created on its first use; NULL when the slots are full. */
static rd_kafka_topic_t *topic_handle(al_producer *p, const char *name)
{
    int n = atomic_load_explicit(&p->ntopics, memory_order_acquire);
    for (int i = 0; i < n; i++)
        if (!strcmp(p->topics[i].name, name)) return p->topics[i].rkt;
    rd_kafka_topic_t *rkt = NULL;
    pthread_mutex_lock(&p->lock);
    n = atomic_load_explicit(&p->ntopics, memory_order_relaxed);
    for (int i = 0; i < n && !rkt; i++)
        if (!strcmp(p->topics[i].name, name)) rkt = p->topics[i].rkt;
    if (!rkt && n < (int)AL_ARRAY_LEN(p->topics)) {
        char *copy = strdup(name);
        rkt = copy ? rd_kafka_topic_new(p->rk, name, NULL) : NULL;
        if (rkt) {
            p->topics[n].name = copy;
            p->topics[n].rkt = rkt;
            atomic_store_explicit(&p->ntopics, n + 1, memory_order_release);
        } else {
            free(copy);
        }
    }
    pthread_mutex_unlock(&p->lock);
    return rkt;
}

void al_producer_free(al_producer *p)
{
    al_producer_free_within(p, 10000);
}

void al_producer_free_within(al_producer *p, int timeout_ms)
{
    char err[512];
    if (!p) return;
    if (timeout_ms < 0) timeout_ms = 0;
    if (al_producer_flush(p, timeout_ms, err, sizeof err) != 0)
        al_log_error("kafka", "producer closing with undelivered messages: %s", err);
    /* Whatever is left gets a failed delivery report now, so that nothing waits forever. */
    rd_kafka_purge(p->rk, RD_KAFKA_PURGE_F_QUEUE | RD_KAFKA_PURGE_F_INFLIGHT);
    rd_kafka_flush(p->rk, timeout_ms < 1000 ? 100 : 1000);
    al_kafka__reason_forget(p->rk);
    for (int i = 0; i < atomic_load(&p->ntopics); i++) {
        rd_kafka_topic_destroy(p->topics[i].rkt);
        free(p->topics[i].name);
    }
    rd_kafka_destroy(p->rk);
    pthread_mutex_destroy(&p->lock);
    free(p);
}

void al_producer_set_delivery_cb(al_producer *p, al_delivery_fn fn, void *ctx)
{
    p->dr_fn = fn;
    p->dr_ctx = ctx;
}

void al_producer_set_block_ms(al_producer *p, int block_ms)
{
    p->block_ms = block_ms < 0 ? 0 : block_ms;
}

rd_kafka_resp_err_t al_producer_produce(al_producer *p, const al_kafka_out *m)
{
    rd_kafka_resp_err_t err;
    int64_t deadline = 0;
    if (!m->topic || !*m->topic) return RD_KAFKA_RESP_ERR__INVALID_ARG;
    if (p->fatal || rd_kafka_fatal_error(p->rk, NULL, 0)) return RD_KAFKA_RESP_ERR__FATAL;
    send_ctx *sc = malloc(sizeof *sc);
    if (!sc) return RD_KAFKA_RESP_ERR__FAIL;
    sc->opaque = m->opaque;
    sc->input = NULL;
    if (m->input) {
        if (al_input__add_output(m->input) != 0) {
            free(sc);
            return RD_KAFKA_RESP_ERR__STATE;
        }
        sc->input = m->input;
    }
    /* past the cached handles: a handle for this send only */
    rd_kafka_topic_t *rkt = topic_handle(p, m->topic), *once = NULL;
    if (!rkt && !(rkt = once = rd_kafka_topic_new(p->rk, m->topic, NULL))) {
        err = rd_kafka_last_error();
        goto fail;
    }
    for (;;) {
        rd_kafka_headers_t *hdrs = m->headers ? rd_kafka_headers_copy(m->headers) : NULL;
        err = rd_kafka_producev(
            p->rk, RD_KAFKA_V_RKT(rkt), RD_KAFKA_V_PARTITION(m->partition),
            RD_KAFKA_V_KEY(m->key, m->keylen), RD_KAFKA_V_VALUE((void *)m->value, m->len),
            RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_TIMESTAMP(m->timestamp_ms),
            RD_KAFKA_V_HEADERS(hdrs), RD_KAFKA_V_OPAQUE(sc), RD_KAFKA_V_END);
        if (!err) break;
        if (hdrs) rd_kafka_headers_destroy(hdrs);
        if (err != RD_KAFKA_RESP_ERR__QUEUE_FULL || p->block_ms == 0) break;
        if (!deadline) deadline = al_mono_us() + (int64_t)p->block_ms * 1000;
        if (al_mono_us() >= deadline) break;
        rd_kafka_poll(p->rk, 10); /* serves delivery reports, which frees queue space */
    }
    if (once) rd_kafka_topic_destroy(once); /* the message holds its own reference */
    if (!err) {
        atomic_fetch_add_explicit(&p->sent, 1, memory_order_relaxed);
        return 0;
    }
fail:
    if (sc->input) al_input__drop_output(sc->input);
    free(sc);
    return err;
}

rd_kafka_resp_err_t al_producer_send(al_producer *p, const char *topic, const void *key,
                                     size_t keylen, const void *value, size_t vlen,
                                     const rd_kafka_headers_t *headers, void *opaque)
{
    al_kafka_out m = {
        .topic = topic,
        .partition = AL_KAFKA_PARTITION_ANY,
        .key = key,
        .keylen = keylen,
        .value = value,
        .len = vlen,
        .headers = headers,
        .opaque = opaque,
    };
    return al_producer_produce(p, &m);
}

int al_producer_poll(al_producer *p, int timeout_ms)
{
    return rd_kafka_poll(p->rk, timeout_ms);
}

int al_producer_flush(al_producer *p, int timeout_ms, char *errstr, size_t errlen)
{
    rd_kafka_flush(p->rk, timeout_ms);
    int left = rd_kafka_outq_len(p->rk);
    if (left == 0) return 0;
    char last[512];
    al_producer_last_error(p, last, sizeof last);
    return al_err(errstr, errlen, "%d messages still in flight after %d ms%s%s", left, timeout_ms,
                  last[0] ? ": " : "", last);
}

unsigned long long al_producer_sent(al_producer *p)
{
    return atomic_load_explicit(&p->sent, memory_order_relaxed);
}

int al_producer_outq_len(al_producer *p)
{
    return rd_kafka_outq_len(p->rk);
}

int al_producer_fatal(al_producer *p, char *errstr, size_t errlen)
{
    char buf[400];
    rd_kafka_resp_err_t ferr = rd_kafka_fatal_error(p->rk, buf, sizeof buf);
    if (!ferr) return 0;
    al_err(errstr, errlen, "fatal producer error (%s): %s; recreate the producer",
           rd_kafka_err2name(ferr), buf);
    return 1;
}

int al_producer_check(al_producer *p, int timeout_ms, char *errstr, size_t errlen)
{
    return al_kafka_check_reachable(p->rk, timeout_ms, errstr, errlen);
}

int al_producer_prepare(al_producer *p, const char *const *topics, int timeout_ms, char *errstr,
                        size_t errlen)
{
    int64_t deadline = al_mono_us() + (int64_t)timeout_ms * 1000;
    for (const char *const *t = topics; t && *t; t++) {
        rd_kafka_topic_t *rkt = rd_kafka_topic_new(p->rk, *t, NULL);
        if (!rkt) {
            al_err(errstr, errlen, "topic %s: %s", *t, rd_kafka_err2str(rd_kafka_last_error()));
            return -1;
        }
        /* The answer updates the client's own view of the topic: that is the point. Kafka
         * answers LEADER_NOT_AVAILABLE (or partitions without a leader) for a topic just
         * created or whose leader is being elected: asked again until the deadline. */
        rd_kafka_resp_err_t err;
        int parts, leaderless;
        for (;;) {
            const struct rd_kafka_metadata *md = NULL;
            int64_t left_ms = (deadline - al_mono_us()) / 1000;
            err = rd_kafka_metadata(p->rk, 0, rkt, &md, (int)(left_ms > 0 ? left_ms : 1));
            parts = -1;
            leaderless = 0;
            if (!err && md && md->topic_cnt == 1) {
                err = md->topics[0].err;
                parts = md->topics[0].partition_cnt;
                for (int i = 0; i < parts; i++)
                    if (md->topics[0].partitions[i].leader < 0) leaderless++;
            }
            if (md) rd_kafka_metadata_destroy(md);
            int transient = err == RD_KAFKA_RESP_ERR_LEADER_NOT_AVAILABLE ||
                            (!err && parts > 0 && leaderless > 0);
            if (!transient || al_mono_us() + 100000 >= deadline) break;
            usleep(100000);
        }
        rd_kafka_topic_destroy(rkt);
        if (err || parts <= 0) {
            al_err(errstr, errlen, "metadata for topic %s: %s", *t,
                   err ? rd_kafka_err2str(err) : "no partitions");
            return -1;
        }
        if (leaderless) {
            al_err(errstr, errlen, "metadata for topic %s: %d of %d partitions have no leader", *t,
                   leaderless, parts);
            return -1;
        }
    }
    return 0;
}

const char *al_producer_last_error(al_producer *p, char *buf, size_t buflen)
{
    if (!buflen) return buf;
    pthread_mutex_lock(&p->lock);
    size_t n = strlen(p->last_error);
    if (n >= buflen) n = buflen - 1;
    memcpy(buf, p->last_error, n);
    buf[n] = '\0';
    pthread_mutex_unlock(&p->lock);
    return buf;
}

rd_kafka_t *al_producer_handle(al_producer *p)
{
    return p->rk;
}
