/*
 * reader.c: assign-only consumer handles (kafka.h, al_kafka_reader_new) for those that read
 * a topic without joining a group: tail and record, and a stage reading back its own output
 * or following arclight.policy.
 */
#include "kafka/kafka.h"

#include "core/util.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* Producer-only properties of the shared client settings: a consumer given them logs a
 * warning for each, which would clutter stderr. */
static const char *const producer_only[] = {"acks",
                                            "request.required.acks",
                                            "enable.idempotence",
                                            "compression.type",
                                            "compression.codec",
                                            "linger.ms",
                                            "queue.buffering.max.ms",
                                            "queue.buffering.max.messages",
                                            "queue.buffering.max.kbytes",
                                            "batch.num.messages",
                                            "batch.size",
                                            "message.timeout.ms",
                                            "delivery.timeout.ms",
                                            "partitioner",
                                            "retries",
                                            "message.send.max.retries",
                                            "enable.gapless.guarantee",
                                            "transactional.id",
                                            "transaction.timeout.ms",
                                            "sticky.partitioning.linger.ms",
                                            "request.timeout.ms",
                                            "compression.level",
                                            "queuing.strategy",
                                            "produce.offset.report",
                                            "dr_msg_cb",
                                            "dr_cb"};

static int is_producer_only(const char *key)
{
    for (size_t i = 0; i < AL_ARRAY_LEN(producer_only); i++)
        if (strcmp(key, producer_only[i]) == 0) return 1;
    return 0;
}

rd_kafka_t *al_kafka_reader_new(const al_kafka_conf *conf, const char *group_prefix, char *errstr,
                                size_t errlen)
{
    al_kafka_conf *c = al_kafka_conf_new();
    if (!c) {
        al_err(errstr, errlen, "out of memory");
        return NULL;
    }
    for (size_t i = 0; i < al_kafka_conf_count(conf); i++) {
        const char *k, *v;
        al_kafka_conf_at(conf, i, &k, &v);
        if (is_producer_only(k) || strcmp(k, "group.id") == 0) continue;
        if (al_kafka_conf_set(c, k, v) != 0) {
            al_kafka_conf_free(c);
            al_err(errstr, errlen, "out of memory");
            return NULL;
        }
    }
    /* librdkafka's assign() needs a group.id, but only subscribe() joins the group: a
     * per-process name that no stage uses keeps even that name unshared. */
    char group[256];
    snprintf(group, sizeof group, "%s-%ld-%lld", group_prefix, (long)getpid(),
             (long long)al_now_us());
    if (al_kafka_conf_set(c, "group.id", group) != 0 ||
        al_kafka_conf_set(c, "enable.auto.commit", "false") != 0 ||
        al_kafka_conf_set(c, "enable.auto.offset.store", "false") != 0 ||
        al_kafka_conf_set(c, "enable.partition.eof", "true") != 0) {
        al_kafka_conf_free(c);
        al_err(errstr, errlen, "out of memory");
        return NULL;
    }
    rd_kafka_conf_t *rc = al_kafka_conf_build(c, errstr, errlen);
    al_kafka_conf_free(c);
    if (!rc) return NULL;
    char rkerr[512];
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_CONSUMER, rc, rkerr, sizeof rkerr);
    if (!rk) {
        rd_kafka_conf_destroy(rc);
        al_err(errstr, errlen, "cannot create a Kafka consumer: %s", rkerr);
        return NULL;
    }
    rd_kafka_poll_set_consumer(rk);
    return rk;
}

rd_kafka_resp_err_t al_kafka_watermarks(rd_kafka_t *rk, const char *topic, int32_t partition,
                                        int64_t *lo, int64_t *hi, int timeout_ms)
{
    int64_t deadline = al_mono_us() + (int64_t)timeout_ms * 1000;
    for (;;) {
        int64_t left_ms = (deadline - al_mono_us()) / 1000;
        rd_kafka_resp_err_t err = rd_kafka_query_watermark_offsets(
            rk, topic, partition, lo, hi, (int)(left_ms > 1 ? left_ms : 1));
        switch (err) {
        case RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION:
        case RD_KAFKA_RESP_ERR_LEADER_NOT_AVAILABLE:
        case RD_KAFKA_RESP_ERR_OFFSET_NOT_AVAILABLE:
        case RD_KAFKA_RESP_ERR_UNKNOWN_LEADER_EPOCH:
        case RD_KAFKA_RESP_ERR_FENCED_LEADER_EPOCH:
        case RD_KAFKA_RESP_ERR_REQUEST_TIMED_OUT:
        case RD_KAFKA_RESP_ERR__TRANSPORT:
            if (al_mono_us() + 100000 >= deadline) return err;
            usleep(100000);
            continue;
        default:
            return err;
        }
    }
}
