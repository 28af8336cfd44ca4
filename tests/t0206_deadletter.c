/* t0206: a message a stage cannot process goes to arclight.deadletter with its original bytes,
 * key, headers, source position and the reason; read back and decoded with the Avro codec.
 * The input's offset is stored only once the dead letter is acknowledged. */
#include "testlib.h"

#include "avro/codec.h"
#include "broker_fixture.h"
#include "kafka/kafka.h"

TEST(deadletter_round_trip)
{
    char errstr[512], reply[128];
    al_test_broker b;
    REQUIRE(al_test_broker_start(&b, NULL) == 0);
    REQUIRE(al_test_broker_control(&b, "create t0206.in 1", reply, sizeof reply) == 0);
    al_kafka_conf *c = al_kafka_conf_load(NULL, b.bootstrap, errstr, sizeof errstr);
    REQUIRE(c);
    al_kafka_conf_set(c, "session.timeout.ms", "3000");
    al_producer *p = al_producer_new(c, errstr, sizeof errstr);
    REQUIREF(p, "%s", errstr);

    /* An input that is not a valid message: binary garbage with a NUL in the middle. */
    static const unsigned char garbage[] = {0xC3, 0x02, 0x00, 0xFF, 'x', 0x00, 0x7F};
    rd_kafka_headers_t *h = rd_kafka_headers_new(2);
    rd_kafka_header_add(h, "content-type", -1, "avro/binary", -1);
    rd_kafka_header_add(h, "empty", -1, NULL, 0);
    REQUIRE(al_producer_send(p, "t0206.in", "task-42", 7, garbage, sizeof garbage, h, NULL) == 0);
    rd_kafka_headers_destroy(h);
    REQUIRE(al_producer_flush(p, 20000, errstr, sizeof errstr) == 0);

    al_consumer *cons = al_consumer_new(c, "t0206-stage", p, errstr, sizeof errstr);
    REQUIREF(cons, "%s", errstr);
    const char *topics[] = {"t0206.in"};
    REQUIRE(al_consumer_subscribe(cons, topics, 1, errstr, sizeof errstr) == 0);
    rd_kafka_message_t *m = NULL;
    double t0 = testlib_now();
    while (!m && testlib_now() - t0 < 30)
        REQUIREF(al_consumer_poll(cons, 200, &m, errstr, sizeof errstr) >= 0, "%s", errstr);
    REQUIRE(m);
    int64_t src_offset = m->offset;
    al_input *in = al_consumer_input_begin(cons, m);
    CHECKF(al_deadletter_message(p, m, "bad magic byte 0x02 at offset 1", "credit", in, errstr,
                                 sizeof errstr) == 0,
           "%s", errstr);
    al_input_end(in);
    rd_kafka_message_destroy(m);
    /* Acknowledged and committed: the stage will not see this input again. */
    REQUIRE(al_producer_flush(p, 20000, errstr, sizeof errstr) == 0);
    rd_kafka_message_t *none;
    CHECK(al_consumer_poll(cons, 100, &none, errstr, sizeof errstr) == 0);
    CHECK(al_consumer_commit(cons, errstr, sizeof errstr) == 0);
    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(1);
    rd_kafka_topic_partition_list_add(l, "t0206.in", 0);
    CHECK(rd_kafka_committed(al_consumer_handle(cons), l, 10000) == 0);
    CHECK_EQ_INT(l->elems[0].offset, src_offset + 1);
    rd_kafka_topic_partition_list_destroy(l);
    al_consumer_free(cons);

    /* Read the dead letter back and decode it. */
    al_consumer *dl = al_consumer_new(c, "t0206-reader", NULL, errstr, sizeof errstr);
    REQUIREF(dl, "%s", errstr);
    const char *dtopics[] = {AL_TOPIC_DEADLETTER};
    REQUIRE(al_consumer_subscribe(dl, dtopics, 1, errstr, sizeof errstr) == 0);
    m = NULL;
    t0 = testlib_now();
    while (!m && testlib_now() - t0 < 30)
        REQUIREF(al_consumer_poll(dl, 200, &m, errstr, sizeof errstr) >= 0, "%s", errstr);
    REQUIRE(m);
    CHECK(m->key_len == 7 && !memcmp(m->key, "task-42", 7));
    al_deadletter d;
    memset(&d, 0, sizeof d);
    REQUIREF(al_deadletter_decode(m->payload, m->len, &d, errstr, sizeof errstr) == 0, "%s",
             errstr);
    CHECK_EQ_STR(d.source_topic, "t0206.in");
    CHECK_EQ_INT(d.partition, 0);
    CHECK_EQ_INT(d.offset, src_offset);
    CHECK(d.key && d.key_len == 7 && !memcmp(d.key, "task-42", 7));
    CHECK(d.value_len == sizeof garbage && !memcmp(d.value, garbage, sizeof garbage));
    CHECK_EQ_STR(d.reason, "bad magic byte 0x02 at offset 1");
    CHECK_EQ_STR(d.stage, "credit");
    CHECK(d.source_timestamp_us > 0);
    CHECK(d.timestamp_us >= d.source_timestamp_us);
    REQUIRE(d.n_headers == 2);
    CHECK_EQ_STR(d.headers[0].key, "content-type");
    CHECK(d.headers[0].value_len == 11 && !memcmp(d.headers[0].value, "avro/binary", 11));
    CHECK_EQ_STR(d.headers[1].key, "empty");
    CHECK(d.headers[1].value == NULL);
    /* The Kafka headers travel on the dead letter too. */
    rd_kafka_headers_t *mh;
    const void *hv;
    size_t hl;
    CHECK(!rd_kafka_message_headers(m, &mh) &&
          !rd_kafka_header_get_last(mh, "content-type", &hv, &hl) && hl == 11);
    al_deadletter_clear(&d);
    al_consumer_input_skip(dl, m);
    rd_kafka_message_destroy(m);
    al_consumer_free(dl);
    al_producer_free(p);
    al_kafka_conf_free(c);
    CHECK_EQ_INT(al_test_broker_stop(&b), 0);
}
