/* t0202: producer delivery reports, the consumer's offset contract, and the errors a user
 * sees when Kafka is away, against the embedded broker over TCP. */
#include "testlib.h"

#include "broker_fixture.h"
#include "kafka/kafka.h"

static al_test_broker broker;
static int broker_ok;

static void ensure_broker(void)
{
    if (!broker_ok) broker_ok = al_test_broker_start(&broker, NULL) == 0;
}

static al_kafka_conf *conf_for(const char *bootstrap)
{
    char errstr[512];
    al_kafka_conf *c = al_kafka_conf_load(NULL, bootstrap, errstr, sizeof errstr);
    if (!c) fprintf(stderr, "conf: %s\n", errstr);
    return c;
}

/* A producer with the defaults for bootstrap (NULL, with the reason on stderr, on error). */
static al_producer *producer_for(const char *bootstrap)
{
    char errstr[512];
    al_kafka_conf *c = conf_for(bootstrap);
    al_producer *p = c ? al_producer_new(c, errstr, sizeof errstr) : NULL;
    if (c && !p) fprintf(stderr, "producer: %s\n", errstr);
    al_kafka_conf_free(c);
    return p;
}

typedef struct dr_log {
    int n, failed;
    int64_t offset[1000];
    int32_t partition[1000];
    char reason[512];
} dr_log;

static void on_delivery(const al_delivery *d, void *ctx)
{
    dr_log *l = ctx;
    intptr_t i = (intptr_t)d->opaque;
    l->n++;
    if (d->err) {
        l->failed++;
        snprintf(l->reason, sizeof l->reason, "%s", d->reason);
        return;
    }
    if (i >= 0 && i < 1000) {
        l->offset[i] = d->offset;
        l->partition[i] = d->partition;
    }
}

/* Committed offset of topic[partition] for group, as the broker has it (-1001: none). */
static int64_t committed_offset(const char *bootstrap, const char *group, const char *topic,
                                int32_t partition)
{
    char errstr[512];
    al_kafka_conf *c = conf_for(bootstrap);
    al_kafka_conf_set(c, "group.id", group);
    rd_kafka_conf_t *rc = al_kafka_conf_build(c, errstr, sizeof errstr);
    al_kafka_conf_free(c);
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_CONSUMER, rc, errstr, sizeof errstr);
    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(1);
    rd_kafka_topic_partition_list_add(l, topic, partition);
    int64_t off = -2;
    if (!rd_kafka_committed(rk, l, 10000)) off = l->elems[0].offset;
    rd_kafka_topic_partition_list_destroy(l);
    rd_kafka_destroy(rk);
    return off;
}

TEST(producer_delivery_reports_reach_each_opaque)
{
    char errstr[512];
    ensure_broker();
    REQUIRE(broker_ok);
    al_producer *p = producer_for(broker.bootstrap);
    REQUIRE(p);
    static dr_log log;
    memset(&log, 0, sizeof log);
    al_producer_set_delivery_cb(p, on_delivery, &log);
    rd_kafka_headers_t *h = rd_kafka_headers_new(1);
    rd_kafka_header_add(h, "trace", -1, "abc", 3);
    for (int i = 0; i < 300; i++) {
        char key[32], val[64];
        snprintf(key, sizeof key, "task-%d", i % 7);
        snprintf(val, sizeof val, "value-%d", i);
        CHECK_EQ_INT(al_producer_send(p, "t0202.acks", key, strlen(key), val, strlen(val), h,
                                      (void *)(intptr_t)i),
                     0);
    }
    rd_kafka_headers_destroy(h);
    CHECKF(al_producer_flush(p, 30000, errstr, sizeof errstr) == 0, "%s", errstr);
    CHECK_EQ_INT(log.n, 300);
    CHECK_EQ_INT(log.failed, 0);
    /* Same key, same partition; offsets within a partition strictly increase in send order. */
    int bad = 0;
    for (int i = 7; i < 300; i++) {
        if (log.partition[i] != log.partition[i - 7]) bad++;
        if (log.offset[i] <= log.offset[i - 7]) bad++;
    }
    CHECK_EQ_INT(bad, 0);
    CHECK_EQ_INT(al_producer_outq_len(p), 0);
    CHECK(al_producer_fatal(p, errstr, sizeof errstr) == 0);

    /* Read them back through the consumer wrapper: every value, with its header. */
    al_kafka_conf *c = conf_for(broker.bootstrap);
    al_consumer *cons = al_consumer_new(c, "t0202-readback", NULL, errstr, sizeof errstr);
    al_kafka_conf_free(c);
    REQUIREF(cons, "%s", errstr);
    const char *topics[] = {"t0202.acks"};
    REQUIRE(al_consumer_subscribe(cons, topics, 1, errstr, sizeof errstr) == 0);
    static char seen[300];
    memset(seen, 0, sizeof seen);
    int got = 0, with_header = 0;
    double t0 = testlib_now();
    while (got < 300 && testlib_now() - t0 < 30) {
        rd_kafka_message_t *m;
        int r = al_consumer_poll(cons, 200, &m, errstr, sizeof errstr);
        REQUIREF(r >= 0, "poll: %s", errstr);
        if (r == 0) continue;
        int i;
        if (m->len < 64 && sscanf((const char *)m->payload, "value-%d", &i) == 1 && i >= 0 &&
            i < 300 && !seen[i]) {
            seen[i] = 1;
            got++;
        }
        rd_kafka_headers_t *mh;
        const void *hv;
        size_t hl;
        if (!rd_kafka_message_headers(m, &mh) && !rd_kafka_header_get_last(mh, "trace", &hv, &hl) &&
            hl == 3 && !memcmp(hv, "abc", 3))
            with_header++;
        al_consumer_input_skip(cons, m);
        rd_kafka_message_destroy(m);
    }
    CHECK_EQ_INT(got, 300);
    CHECK_EQ_INT(with_header, 300);
    al_consumer_free(cons);
    al_producer_free(p);
}

/* Each send's opaque is topic * 100 + i: the report must name that topic. */
typedef struct topic_log {
    int n, failed, wrong_topic;
} topic_log;

static void on_topic_delivery(const al_delivery *d, void *ctx)
{
    topic_log *l = ctx;
    char want[64];
    snprintf(want, sizeof want, "t0202.many.%d", (int)((intptr_t)d->opaque / 100));
    l->n++;
    if (d->err) l->failed++;
    if (strcmp(d->topic, want)) l->wrong_topic++;
}

/* The producer keeps handles for 16 topics; sends to more go through a handle of their own. */
TEST(producer_sends_to_more_topics_than_it_keeps_handles_for)
{
    char errstr[512];
    ensure_broker();
    REQUIRE(broker_ok);
    al_producer *p = producer_for(broker.bootstrap);
    REQUIRE(p);
    topic_log log = {0};
    al_producer_set_delivery_cb(p, on_topic_delivery, &log);
    for (int round = 0; round < 3; round++)
        for (int t = 0; t < 24; t++) {
            char topic[64], val[32];
            snprintf(topic, sizeof topic, "t0202.many.%d", t);
            snprintf(val, sizeof val, "v%d", round);
            CHECK_EQ_INT(al_producer_send(p, topic, NULL, 0, val, strlen(val), NULL,
                                          (void *)(intptr_t)(t * 100 + round)),
                         0);
        }
    CHECKF(al_producer_flush(p, 30000, errstr, sizeof errstr) == 0, "%s", errstr);
    CHECK_EQ_INT(log.n, 72);
    CHECK_EQ_INT(log.failed, 0);
    CHECK_EQ_INT(log.wrong_topic, 0);
    al_producer_free(p);
}

TEST(stored_offset_waits_for_acknowledged_outputs)
{
    char errstr[512], reply[128];
    ensure_broker();
    REQUIRE(broker_ok);
    REQUIRE(al_test_broker_control(&broker, "create t0202.in 1", reply, sizeof reply) == 0);
    al_kafka_conf *c = conf_for(broker.bootstrap);
    al_producer *p = al_producer_new(c, errstr, sizeof errstr);
    REQUIREF(p, "%s", errstr);
    for (int i = 0; i < 20; i++)
        al_producer_send(p, "t0202.in", "k", 1, "in", 2, NULL, NULL);
    REQUIRE(al_producer_flush(p, 20000, errstr, sizeof errstr) == 0);

    al_consumer *cons = al_consumer_new(c, "t0202-contract", p, errstr, sizeof errstr);
    al_kafka_conf_free(c);
    REQUIREF(cons, "%s", errstr);
    const char *topics[] = {"t0202.in"};
    REQUIRE(al_consumer_subscribe(cons, topics, 1, errstr, sizeof errstr) == 0);

    /* Consume the 20 inputs; each produces 2 outputs; input 12 stays open (a stage still
     * waiting for the rest of its rollout). Delivery reports are not served yet: the
     * consumer is not polled again until the check below. */
    al_input *held = NULL;
    int got = 0;
    double t0 = testlib_now();
    rd_kafka_message_t *ms[20];
    while (got < 20 && testlib_now() - t0 < 30) {
        rd_kafka_message_t *m;
        int r = al_consumer_poll(cons, 200, &m, errstr, sizeof errstr);
        REQUIREF(r >= 0, "poll: %s", errstr);
        if (r == 1) ms[got++] = m;
    }
    REQUIRE(got == 20);
    for (int i = 0; i < 20; i++) {
        al_input *in = al_consumer_input_begin(cons, ms[i]);
        REQUIRE(in);
        for (int k = 0; k < 2; k++) {
            al_kafka_out o = {.topic = "t0202.out",
                              .partition = AL_KAFKA_PARTITION_ANY,
                              .key = "k",
                              .keylen = 1,
                              .value = "out",
                              .len = 3,
                              .input = in};
            CHECK_EQ_INT(al_producer_produce(p, &o), 0);
        }
        if (ms[i]->offset == 12)
            held = in;
        else
            al_input_end(in);
        rd_kafka_message_destroy(ms[i]);
    }
    REQUIRE(held);
    /* Nothing acknowledged yet as far as the stage knows: the committed offset stays at the
     * first input (a restart re-reads all 20). */
    CHECK(al_consumer_commit(cons, errstr, sizeof errstr) == 0);
    CHECK_EQ_INT(committed_offset(broker.bootstrap, "t0202-contract", "t0202.in", 0), 0);
    /* Serve the delivery reports: the stored offset moves up to the held input (12). */
    REQUIRE(al_producer_flush(p, 20000, errstr, sizeof errstr) == 0);
    CHECK(al_consumer_commit(cons, errstr, sizeof errstr) == 0);
    CHECK_EQ_INT(committed_offset(broker.bootstrap, "t0202-contract", "t0202.in", 0), 12);
    /* The held input finishes: everything is committed. */
    al_input_end(held);
    CHECK(al_consumer_commit(cons, errstr, sizeof errstr) == 0);
    CHECK_EQ_INT(committed_offset(broker.bootstrap, "t0202-contract", "t0202.in", 0), 20);
    al_consumer_free(cons);
    al_producer_free(p);
}

TEST(failed_output_stops_the_consumer_without_storing_its_input)
{
    char errstr[1024], reply[128];
    ensure_broker();
    REQUIRE(broker_ok);
    REQUIRE(al_test_broker_control(&broker, "create t0202.in2 1", reply, sizeof reply) == 0);
    al_kafka_conf *c = conf_for(broker.bootstrap);
    al_kafka_conf_set(c, "session.timeout.ms", "3000");
    al_producer *p = al_producer_new(c, errstr, sizeof errstr);
    REQUIREF(p, "%s", errstr);
    for (int i = 0; i < 3; i++)
        al_producer_send(p, "t0202.in2", "k", 1, "in", 2, NULL, NULL);
    REQUIRE(al_producer_flush(p, 20000, errstr, sizeof errstr) == 0);
    al_consumer *cons = al_consumer_new(c, "t0202-failing", p, errstr, sizeof errstr);
    al_kafka_conf_free(c);
    REQUIREF(cons, "%s", errstr);
    const char *topics[] = {"t0202.in2"};
    REQUIRE(al_consumer_subscribe(cons, topics, 1, errstr, sizeof errstr) == 0);

    /* The broker refuses the next Produce request (MESSAGE_TOO_LARGE): the first input's
     * output is lost, so the consumer must stop and never store past offset 0. The embedded
     * broker is told to; real Kafka refuses an output over its topic's max.message.bytes. */
    static unsigned char big[4000];
    size_t outlen = 3;
    if (broker.kafka) {
        REQUIRE(al_test_broker_control(&broker, "create t0202.out2 1 1 max.message.bytes=1000",
                                       reply, sizeof reply) == 0);
        uint64_t x = 88172645463325252ULL; /* incompressible */
        for (size_t i = 0; i < sizeof big; i++) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            big[i] = (unsigned char)x;
        }
        outlen = sizeof big;
    } else {
        memcpy(big, "out", 3);
        REQUIRE(al_test_broker_control(&broker, "error 0 10 1", reply, sizeof reply) == 0);
    }
    int r = 0, inputs = 0;
    double t0 = testlib_now();
    while (testlib_now() - t0 < 30) {
        rd_kafka_message_t *m;
        r = al_consumer_poll(cons, 100, &m, errstr, sizeof errstr);
        if (r < 0) break;
        if (r == 0) continue;
        al_input *in = al_consumer_input_begin(cons, m);
        al_kafka_out o = {
            .topic = "t0202.out2", .partition = 0, .value = big, .len = outlen, .input = in};
        CHECK_EQ_INT(al_producer_produce(p, &o), 0);
        al_input_end(in);
        rd_kafka_message_destroy(m);
        inputs++;
        if (inputs == 1) al_producer_flush(p, 10000, errstr, sizeof errstr);
    }
    CHECK_EQ_INT(r, -1);
    CHECKF(strstr(errstr, "an output of t0202.in2 [0] offset 0 was not delivered") &&
               strstr(errstr, "too large"),
           "error: %s", errstr);
    al_consumer_free(cons); /* close commits what is stored: nothing past offset 0 */
    CHECK_EQ_INT(committed_offset(broker.bootstrap, "t0202-failing", "t0202.in2", 0), 0);
    al_producer_free(p);
}

TEST(unreachable_broker_errors_name_the_servers_and_the_reason)
{
    char errstr[512];
    /* A port nothing listens on. */
    al_kafka_conf *c = conf_for("127.0.0.1:1");
    al_kafka_conf_set(c, "message.timeout.ms", "1500");
    al_producer *p = al_producer_new(c, errstr, sizeof errstr);
    REQUIREF(p, "%s", errstr);
    CHECK(al_producer_check(p, 2000, errstr, sizeof errstr) == -1);
    CHECKF(
        strstr(errstr, "cannot reach Kafka at 127.0.0.1:1: Connection refused (all brokers down)"),
        "check: %s", errstr);
    static dr_log log;
    memset(&log, 0, sizeof log);
    al_producer_set_delivery_cb(p, on_delivery, &log);
    CHECK_EQ_INT(al_producer_send(p, "t0202.x", "k", 1, "v", 1, NULL, (void *)1), 0);
    al_producer_flush(p, 5000, errstr, sizeof errstr);
    CHECK_EQ_INT(log.failed, 1);
    CHECKF(strstr(log.reason, "Message timed out") && strstr(log.reason, "127.0.0.1:1") &&
               strstr(log.reason, "Connection refused"),
           "delivery reason: %s", log.reason);
    al_producer_free(p);

    al_consumer *cons = al_consumer_new(c, "t0202-nobody", NULL, errstr, sizeof errstr);
    REQUIREF(cons, "%s", errstr);
    CHECK(al_consumer_check(cons, 1500, errstr, sizeof errstr) == -1);
    CHECKF(strstr(errstr, "cannot reach Kafka at 127.0.0.1:1: Connection refused"), "check: %s",
           errstr);
    al_consumer_free(cons);
    al_kafka_conf_free(c);

    /* A name that does not resolve. */
    c = conf_for("no-such-host.invalid:9092");
    p = al_producer_new(c, errstr, sizeof errstr);
    REQUIREF(p, "%s", errstr);
    CHECK(al_producer_check(p, 2000, errstr, sizeof errstr) == -1);
    CHECKF(strstr(errstr, "cannot reach Kafka at no-such-host.invalid:9092: ") != NULL, "check: %s",
           errstr);
    al_producer_free(p);
    al_kafka_conf_free(c);
}

/* Produces one message to topic and flushes; returns the delivery log. */
static void produce_one(al_producer *p, const char *topic, dr_log *log)
{
    char errstr[512];
    memset(log, 0, sizeof *log);
    al_producer_set_delivery_cb(p, on_delivery, log);
    if (al_producer_send(p, topic, "k", 1, "v", 1, NULL, (void *)0) == 0)
        al_producer_flush(p, 15000, errstr, sizeof errstr);
}

TEST(broker_errors_retriable_abortable_fatal)
{
    char errstr[512], reply[256];
    AL_TEST_EMBEDDED_ONLY("the embedded broker answers chosen requests with chosen errors");
    ensure_broker();
    REQUIRE(broker_ok);
    al_kafka_conf *c = conf_for(broker.bootstrap);
    al_kafka_conf_set(c, "retry.backoff.ms", "50");
    al_producer *p = al_producer_new(c, errstr, sizeof errstr);
    al_kafka_conf_free(c);
    REQUIREF(p, "%s", errstr);
    static dr_log log;
    produce_one(p, "t0202.err", &log); /* connect, get a producer id */
    CHECK_EQ_INT(log.failed, 0);

    /* Retriable: NOT_ENOUGH_REPLICAS (19) twice, then the retry succeeds. */
    REQUIRE(al_test_broker_control(&broker, "error 0 19 2", reply, sizeof reply) == 0);
    produce_one(p, "t0202.err", &log);
    CHECK_EQ_INT(log.n, 1);
    CHECK_EQ_INT(log.failed, 0);

    /* Abortable: MESSAGE_TOO_LARGE (10) fails this message only; the producer goes on. */
    REQUIRE(al_test_broker_control(&broker, "error 0 10 1", reply, sizeof reply) == 0);
    produce_one(p, "t0202.err", &log);
    CHECK_EQ_INT(log.failed, 1);
    CHECKF(strstr(log.reason, "(abortable)") != NULL, "reason: %s", log.reason);
    produce_one(p, "t0202.err", &log);
    CHECK_EQ_INT(log.failed, 0);
    CHECK(al_producer_fatal(p, errstr, sizeof errstr) == 0);

    /* A message-level idempotence error (INVALID_PRODUCER_EPOCH, 47): this message fails,
     * librdkafka bumps the epoch, the producer goes on. */
    REQUIRE(al_test_broker_control(&broker, "error 0 47 1", reply, sizeof reply) == 0);
    produce_one(p, "t0202.err", &log);
    CHECK_EQ_INT(log.failed, 1);
    CHECKF(strstr(log.reason, "(retriable)") != NULL, "reason: %s", log.reason);
    produce_one(p, "t0202.err", &log);
    CHECK_EQ_INT(log.failed, 0);
    CHECK(al_producer_fatal(p, errstr, sizeof errstr) == 0);
    al_producer_free(p);

    /* Fatal: a new producer is refused its producer id (InitProducerId, API 22, answered
     * CLUSTER_AUTHORIZATION_FAILED, 31): the producer is unusable, sends are refused with
     * __FATAL, and the reason is available. */
    REQUIRE(al_test_broker_control(&broker, "error 22 31 1", reply, sizeof reply) == 0);
    c = conf_for(broker.bootstrap);
    p = al_producer_new(c, errstr, sizeof errstr);
    al_kafka_conf_free(c);
    REQUIREF(p, "%s", errstr);
    /* The fatal error may be raised before the send (refused with __FATAL) or while the
     * message waits for its producer id (its delivery fails): either way it is not delivered. */
    memset(&log, 0, sizeof log);
    al_producer_set_delivery_cb(p, on_delivery, &log);
    rd_kafka_resp_err_t sent = al_producer_send(p, "t0202.err", "k", 1, "v", 1, NULL, (void *)0);
    if (sent == RD_KAFKA_RESP_ERR_NO_ERROR) {
        al_producer_flush(p, 15000, errstr, sizeof errstr);
        CHECK_EQ_INT(log.failed, 1);
    } else {
        CHECK_EQ_INT(sent, RD_KAFKA_RESP_ERR__FATAL);
    }
    CHECKF(al_producer_fatal(p, errstr, sizeof errstr) == 1, "no fatal error; last: %s",
           log.reason);
    CHECKF(strstr(errstr, "fatal producer error") && strstr(errstr, "uthoriz"), "fatal: %s",
           errstr);
    CHECK_EQ_INT(al_producer_send(p, "t0202.err", "k", 1, "v", 1, NULL, NULL),
                 RD_KAFKA_RESP_ERR__FATAL);
    CHECK_EQ_INT(al_kafka_error_classify(RD_KAFKA_RESP_ERR__FATAL), AL_KAFKA_ERRCLASS_FATAL);
    al_producer_free(p);
}

TEST(error_classes)
{
    CHECK_EQ_INT(al_kafka_error_classify(RD_KAFKA_RESP_ERR_NO_ERROR), AL_KAFKA_ERRCLASS_NONE);
    CHECK_EQ_INT(al_kafka_error_classify(RD_KAFKA_RESP_ERR__QUEUE_FULL),
                 AL_KAFKA_ERRCLASS_RETRIABLE);
    CHECK_EQ_INT(al_kafka_error_classify(RD_KAFKA_RESP_ERR__MSG_TIMED_OUT),
                 AL_KAFKA_ERRCLASS_RETRIABLE);
    CHECK_EQ_INT(al_kafka_error_classify(RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE),
                 AL_KAFKA_ERRCLASS_ABORTABLE);
    CHECK_EQ_INT(al_kafka_error_classify(RD_KAFKA_RESP_ERR__FATAL), AL_KAFKA_ERRCLASS_FATAL);
    CHECK_EQ_INT(al_kafka_error_classify(RD_KAFKA_RESP_ERR__AUTO_OFFSET_RESET),
                 AL_KAFKA_ERRCLASS_FATAL);
}

TEST(prepare_learns_output_topics_or_names_the_problem)
{
    char errstr[512];
    ensure_broker();
    REQUIRE(broker_ok);
    /* the embedded broker makes a topic a client names; on real Kafka the topics job does */
    char reply[128];
    if (broker.kafka)
        REQUIRE(al_test_broker_control(&broker, "create t0202.prepared 2", reply, sizeof reply) == 0);
    al_producer *p = producer_for(broker.bootstrap);
    REQUIRE(p);
    const char *topics[] = {"t0202.acks", "t0202.prepared", NULL};
    CHECKF(al_producer_prepare(p, topics, 10000, errstr, sizeof errstr) == 0, "%s", errstr);
    static dr_log log;
    memset(&log, 0, sizeof log);
    al_producer_set_delivery_cb(p, on_delivery, &log);
    CHECK_EQ_INT(al_producer_send(p, "t0202.prepared", "k", 1, "v", 1, NULL, (void *)0), 0);
    CHECKF(al_producer_flush(p, 10000, errstr, sizeof errstr) == 0, "%s", errstr);
    CHECK_EQ_INT(log.failed, 0);
    al_producer_free(p);

    p = producer_for("127.0.0.1:1");
    REQUIRE(p);
    double t0 = testlib_now();
    CHECK(al_producer_prepare(p, topics, 1000, errstr, sizeof errstr) == -1);
    CHECKF(strstr(errstr, "metadata for topic t0202.acks") != NULL, "prepare: %s", errstr);
    CHECKF(testlib_now() - t0 < 5, "prepare took %.1f s with a 1 s budget", testlib_now() - t0);
    al_producer_free(p);
}

/* librdkafka 2.0 stops fetching while the consumer queue is over queued.max.messages.kbytes
 * and, left alone, looks again only when its broker thread wakes, up to a second later. Here
 * 16 MB wait behind a 32 KB queue in 64 fetches: left alone that took 49 s on the machine this
 * was written on, with the consumer wrapper waking the fetcher 0.85 s. A liveness check (the
 * consumer never idles with a backlog) with a wide margin either way, not a speed target. */
/* 16 MB in PARTS partitions through a 32 KB consumer queue: the fetcher stops at the limit
 * and must be woken (wake_stalled_fetchers), on every leader. */
static void backlog_through_a_small_queue(const char *bootstrap, const char *topic,
                                          const char *group)
{
    char errstr[512];
    al_kafka_conf *c = conf_for(bootstrap);
    /* message sets of 4 messages: the embedded broker answers a fetch with one set per
     * partition, so this makes 64 fetches of 256 KB (4 partitions x 64 KB) */
    al_kafka_conf_set(c, "batch.num.messages", "4");
    al_producer *p = al_producer_new(c, errstr, sizeof errstr);
    REQUIREF(p, "%s", errstr);
    al_kafka_conf_set(c, "batch.num.messages", "10000");
    enum { PARTS = 4, PER_PART = 256, SIZE = 16 * 1024 };
    static char value[SIZE];
    memset(value, 'x', sizeof value);
    for (int part = 0; part < PARTS; part++)
        for (int i = 0; i < PER_PART; i++) {
            snprintf(value, 32, "p%d-%d|", part, i);
            al_kafka_out o = {.topic = topic, .partition = part, .value = value,
                              .len = sizeof value};
            REQUIRE(al_producer_produce(p, &o) == 0);
        }
    CHECKF(al_producer_flush(p, 30000, errstr, sizeof errstr) == 0, "%s", errstr);
    al_producer_free(p);

    al_kafka_conf_set(c, "queued.max.messages.kbytes", "32");
    al_kafka_conf_set(c, "max.partition.fetch.bytes", "65536");
    al_kafka_conf_set(c, "fetch.max.bytes", "1048576");
    al_kafka_conf_set(c, "message.max.bytes", "1048576");
    al_consumer *cons = al_consumer_new(c, group, NULL, errstr, sizeof errstr);
    al_kafka_conf_free(c);
    REQUIREF(cons, "%s", errstr);
    const char *topics[] = {topic};
    REQUIRE(al_consumer_subscribe(cons, topics, 1, errstr, sizeof errstr) == 0);
    int got = 0;
    double first = 0, t0 = testlib_now();
    while (got < PARTS * PER_PART && testlib_now() - t0 < 60) {
        rd_kafka_message_t *m;
        int r = al_consumer_poll(cons, 100, &m, errstr, sizeof errstr);
        REQUIREF(r >= 0, "poll: %s", errstr);
        if (r == 0) continue;
        if (!m->err && m->len == SIZE) {
            if (!got) first = testlib_now();
            got++;
        }
        al_consumer_input_skip(cons, m);
        rd_kafka_message_destroy(m);
    }
    double secs = testlib_now() - first;
    CHECK_EQ_INT(got, PARTS * PER_PART);
    CHECKF(secs < 16, "16 MB through a 32 KB queue took %.1f s: the fetcher idled", secs);
    printf("  (%s: %.2f s from the first message to the last)\n", topic, secs);
    al_consumer_free(cons);
}

TEST(consumer_keeps_fetching_when_its_queue_fills)
{
    ensure_broker();
    REQUIRE(broker_ok);
    backlog_through_a_small_queue(broker.bootstrap, "t0202.backlog", "t0202-backlog");
}

/* The same with the partitions led by three brokers: each leader's fetcher stops on its own
 * and the wakes must reach all of them. */
TEST(consumer_keeps_fetching_from_every_leader)
{
    char reply[128];
    al_test_broker b3;
    const char *extra[] = {"--brokers", "3", NULL};
    REQUIRE(al_test_broker_start(&b3, extra) == 0);
    REQUIRE(al_test_broker_control(&b3, "create t0202.spread 4", reply, sizeof reply) == 0);
    backlog_through_a_small_queue(b3.bootstrap, "t0202.spread", "t0202-spread");
    CHECK_EQ_INT(al_test_broker_stop(&b3), 0);
}

TEST(zz_stop_broker)
{
    if (broker_ok) CHECK_EQ_INT(al_test_broker_stop(&broker), 0);
}
