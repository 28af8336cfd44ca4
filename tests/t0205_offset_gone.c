/* t0205: a consumer whose committed offset is no longer on the broker (the embedded broker
 * keeps ~5 MiB per partition; on real Kafka the records are deleted) stops with an error
 * naming the lost range; it never skips. */
#include "testlib.h"

#include "broker_fixture.h"
#include "kafka/kafka.h"

TEST(committed_offset_gone_stops_with_the_lost_range)
{
    char errstr[1024], reply[128];
    al_test_broker b;
    REQUIRE(al_test_broker_start(&b, NULL) == 0);
    REQUIRE(al_test_broker_control(&b, "create t0205.in 1", reply, sizeof reply) == 0);
    al_kafka_conf *c = al_kafka_conf_load(NULL, b.bootstrap, errstr, sizeof errstr);
    REQUIRE(c);
    al_kafka_conf_set(c, "session.timeout.ms", "3000"); /* quicker group joins */
    al_producer *p = al_producer_new(c, errstr, sizeof errstr);
    REQUIREF(p, "%s", errstr);
    REQUIRE(al_producer_send(p, "t0205.in", "k", 1, "first", 5, NULL, NULL) == 0);
    REQUIRE(al_producer_flush(p, 20000, errstr, sizeof errstr) == 0);

    /* The group reads the first message and commits offset 1. */
    al_consumer *cons = al_consumer_new(c, "t0205-group", NULL, errstr, sizeof errstr);
    REQUIREF(cons, "%s", errstr);
    const char *topics[] = {"t0205.in"};
    REQUIRE(al_consumer_subscribe(cons, topics, 1, errstr, sizeof errstr) == 0);
    int got = 0;
    double t0 = testlib_now();
    while (!got && testlib_now() - t0 < 30) {
        rd_kafka_message_t *m;
        int r = al_consumer_poll(cons, 200, &m, errstr, sizeof errstr);
        REQUIREF(r >= 0, "%s", errstr);
        if (r == 1) {
            al_consumer_input_skip(cons, m);
            rd_kafka_message_destroy(m);
            got = 1;
        }
    }
    REQUIRE(got);
    CHECK(al_consumer_commit(cons, errstr, sizeof errstr) == 0);
    al_consumer_free(cons);

    /* While it is away, 8 MiB of incompressible data push offset 1 out of the broker. */
    static unsigned char blob[100 * 1024];
    uint64_t x = 88172645463325252ULL;
    for (size_t i = 0; i < sizeof blob; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        blob[i] = (unsigned char)x;
    }
    for (int i = 0; i < 80; i++) {
        blob[0] = (unsigned char)i;
        REQUIRE(al_producer_send(p, "t0205.in", "k", 1, blob, sizeof blob, NULL, NULL) == 0);
    }
    REQUIRE(al_producer_flush(p, 30000, errstr, sizeof errstr) == 0);
    /* Real Kafka keeps what retention allows (days here): the records before offset 41 are
     * deleted through the Admin API instead, as an operator or retention would. */
    if (b.kafka) {
        rd_kafka_t *rk = al_producer_handle(p);
        rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(1);
        rd_kafka_topic_partition_list_add(l, "t0205.in", 0)->offset = 41;
        rd_kafka_DeleteRecords_t *dr = rd_kafka_DeleteRecords_new(l);
        rd_kafka_topic_partition_list_destroy(l);
        rd_kafka_queue_t *q = rd_kafka_queue_new(rk);
        rd_kafka_DeleteRecords(rk, &dr, 1, NULL, q);
        rd_kafka_event_t *ev = rd_kafka_queue_poll(q, 30000);
        REQUIREF(ev && !rd_kafka_event_error(ev), "DeleteRecords: %s",
                 ev ? rd_kafka_event_error_string(ev) : "no answer");
        rd_kafka_event_destroy(ev);
        rd_kafka_DeleteRecords_destroy(dr);
        rd_kafka_queue_destroy(q);
    }
    int64_t lo = -1, hi = -1;
    REQUIRE(rd_kafka_query_watermark_offsets(al_producer_handle(p), "t0205.in", 0, &lo, &hi,
                                             10000) == 0);
    REQUIREF(lo > 1, "the broker still holds offset 1 (low watermark %lld)", (long long)lo);
    CHECK_EQ_INT(hi, 81);

    /* Back again: the consumer stops, naming the range, and keeps refusing. */
    cons = al_consumer_new(c, "t0205-group", NULL, errstr, sizeof errstr);
    REQUIREF(cons, "%s", errstr);
    REQUIRE(al_consumer_subscribe(cons, topics, 1, errstr, sizeof errstr) == 0);
    int r = 0, delivered = 0;
    t0 = testlib_now();
    while (testlib_now() - t0 < 30) {
        rd_kafka_message_t *m;
        r = al_consumer_poll(cons, 200, &m, errstr, sizeof errstr);
        if (r < 0) break;
        if (r == 1) {
            delivered++;
            rd_kafka_message_destroy(m);
        }
    }
    CHECK_EQ_INT(r, -1);
    CHECK_EQ_INT(delivered, 0);
    char want[128];
    snprintf(want, sizeof want, "offsets 1..%lld were lost", (long long)(lo - 1));
    CHECKF(strstr(errstr, want) && strstr(errstr, "t0205.in [0]") &&
               strstr(errstr, "committed offset 1 is gone"),
           "error: %s (want '%s')", errstr, want);
    rd_kafka_message_t *m;
    CHECK_EQ_INT(al_consumer_poll(cons, 100, &m, errstr, sizeof errstr), -1);
    al_consumer_free(cons);
    al_kafka_conf_free(c);
    al_producer_free(p);
    CHECK_EQ_INT(al_test_broker_stop(&b), 0);
}
