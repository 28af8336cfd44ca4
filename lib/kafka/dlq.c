/*
 * dlq.c: dead letters. A message a stage cannot process goes to arclight.deadletter, keyed
 * by its original key, as an Avro DeadLetter record (lib/avro/codec.h) that carries the
 * original bytes, headers, source topic/partition/offset/timestamp, the reason and the stage.
 * The original Kafka headers are kept on the dead letter too, so tools can route on them.
 */
#include "kafka/internal.h"

#include "avro/codec.h"
#include "core/util.h"

#include <stdlib.h>
#include <string.h>

/* Shared by both entry points; source_ts_us is -1 when unknown. */
static int deadletter_publish(al_producer *p, const char *src_topic, int32_t partition,
                              int64_t offset, int64_t source_ts_us, const void *key, size_t keylen,
                              const void *value, size_t vlen, const rd_kafka_headers_t *headers,
                              const char *reason, const char *stage, al_input *in, void *opaque,
                              char *errstr, size_t errlen)
{
    al_deadletter d;
    al_buf buf;
    al_header *hv = NULL;
    size_t nh = headers ? rd_kafka_header_cnt(headers) : 0;
    int rc = -1;
    memset(&d, 0, sizeof d);
    al_buf_init(&buf);
    if (nh) {
        hv = calloc(nh, sizeof *hv);
        if (!hv) return al_err(errstr, errlen, "dead letter: out of memory");
        for (size_t i = 0; i < nh; i++) {
            const char *name;
            const void *val;
            size_t sz;
            if (rd_kafka_header_get_all(headers, i, &name, &val, &sz)) break;
            hv[i].key = name;
            hv[i].value = val;
            hv[i].value_len = val ? sz : 0;
        }
    }
    d.source_topic = src_topic ? src_topic : "";
    d.partition = partition;
    d.offset = offset;
    d.key = key;
    d.key_len = key ? keylen : 0;
    d.value = value;
    d.value_len = value ? vlen : 0;
    d.headers = hv;
    d.n_headers = nh;
    d.reason = reason ? reason : "";
    d.stage = stage ? stage : "";
    d.source_timestamp_us = source_ts_us;
    d.timestamp_us = al_now_us();
    char cerr[256];
    if (al_deadletter_encode(&d, &buf, cerr, sizeof cerr) != 0) {
        al_err(errstr, errlen, "dead letter for %s [%d] offset %lld: encoding failed: %s",
               d.source_topic, (int)partition, (long long)offset, cerr);
        goto out;
    }
    al_kafka_out o = {
        .topic = AL_TOPIC_DEADLETTER,
        .partition = AL_KAFKA_PARTITION_ANY,
        .key = key,
        .keylen = key ? keylen : 0,
        .value = buf.data,
        .len = buf.len,
        .headers = headers,
        .input = in,
        .opaque = opaque,
    };
    rd_kafka_resp_err_t err = al_producer_produce(p, &o);
    if (err) {
        al_err(errstr, errlen, "dead letter for %s [%d] offset %lld: produce failed: %s (%s)",
               d.source_topic, (int)partition, (long long)offset, rd_kafka_err2str(err),
               al_kafka_errclass_name(al_kafka_error_classify(err)));
        goto out;
    }
    rc = 0;
out:
    free(hv);
    al_buf_free(&buf);
    return rc;
}

int al_deadletter_publish(al_producer *p, const char *src_topic, int32_t partition, int64_t offset,
                          const void *key, size_t keylen, const void *value, size_t vlen,
                          const rd_kafka_headers_t *headers, const char *reason, const char *stage,
                          al_input *in, void *opaque, char *errstr, size_t errlen)
{
    return deadletter_publish(p, src_topic, partition, offset, -1, key, keylen, value, vlen,
                              headers, reason, stage, in, opaque, errstr, errlen);
}

int al_deadletter_message(al_producer *p, const rd_kafka_message_t *m, const char *reason,
                          const char *stage, al_input *in, char *errstr, size_t errlen)
{
    rd_kafka_headers_t *h = NULL;
    rd_kafka_timestamp_type_t tt;
    int64_t ts_ms = rd_kafka_message_timestamp(m, &tt);
    if (rd_kafka_message_headers(m, &h) != RD_KAFKA_RESP_ERR_NO_ERROR) h = NULL;
    return deadletter_publish(p, m->rkt ? rd_kafka_topic_name(m->rkt) : "", m->partition, m->offset,
                              ts_ms >= 0 ? ts_ms * 1000 : -1, m->key, m->key_len, m->payload,
                              m->len, h, reason, stage, in, NULL, errstr, errlen);
}
