/* t0204: a second consumer joins the group: partitions move incrementally (cooperative-sticky),
 * the first consumer flushes its producer and commits before it gives partitions up, and each
 * message afterwards goes to exactly the partition's new owner. */
#include "testlib.h"

#include "broker_fixture.h"
#include "kafka/kafka.h"

#define PARTS 6
#define N_FIRST 600

typedef struct member {
    al_consumer *c;
    al_producer *p;
    int owned[PARTS];
    int revoked_events, max_revoked, assigned_events;
    int consumed, late[PARTS];
} member;

static void on_rebalance(al_consumer *c, al_rebalance_event ev,
                         const rd_kafka_topic_partition_list_t *parts, void *ctx)
{
    member *m = ctx;
    for (int i = 0; i < parts->cnt; i++)
        if (parts->elems[i].partition < PARTS)
            m->owned[parts->elems[i].partition] = ev == AL_REBALANCE_ASSIGNED;
    if (ev == AL_REBALANCE_ASSIGNED) m->assigned_events++;
    if (ev == AL_REBALANCE_REVOKED) {
        m->revoked_events++;
        if (parts->cnt > m->max_revoked) m->max_revoked = parts->cnt;
    }
}

static int owned_count(const member *m)
{
    int n = 0;
    for (int i = 0; i < PARTS; i++)
        n += m->owned[i];
    return n;
}

static int member_init(member *m, const char *bootstrap, char *errstr, size_t errlen)
{
    memset(m, 0, sizeof *m);
    al_kafka_conf *c = al_kafka_conf_load(NULL, bootstrap, errstr, errlen);
    if (!c) return -1;
    /* The embedded broker waits up to a session timeout for members to rejoin. */
    al_kafka_conf_set(c, "session.timeout.ms", "3000");
    m->p = al_producer_new(c, errstr, errlen);
    m->c = m->p ? al_consumer_new(c, "t0204-group", m->p, errstr, errlen) : NULL;
    al_kafka_conf_free(c);
    if (!m->c) return -1;
    al_consumer_set_rebalance_cb(m->c, on_rebalance, m);
    const char *topics[] = {"t0204.in"};
    return al_consumer_subscribe(m->c, topics, 1, errstr, errlen);
}

/* One poll: a message becomes an input with one tracked output. */
static int member_step(member *m, int after_join, char *errstr, size_t errlen)
{
    rd_kafka_message_t *msg;
    int r = al_consumer_poll(m->c, 50, &msg, errstr, errlen);
    if (r <= 0) return r;
    al_input *in = al_consumer_input_begin(m->c, msg);
    al_kafka_out o = {.topic = "t0204.out",
                      .partition = AL_KAFKA_PARTITION_ANY,
                      .key = msg->key,
                      .keylen = msg->key_len,
                      .value = msg->payload,
                      .len = msg->len,
                      .input = in};
    al_producer_produce(m->p, &o);
    al_input_end(in);
    m->consumed++;
    if (after_join && msg->partition < PARTS) m->late[msg->partition]++;
    rd_kafka_message_destroy(msg);
    return 1;
}

static void member_free(member *m)
{
    al_consumer_free(m->c);
    al_producer_free(m->p);
}

TEST(second_consumer_joins_partitions_move_with_their_offsets)
{
    char errstr[512], reply[128];
    al_test_broker b;
    REQUIRE(al_test_broker_start(&b, NULL) == 0);
    REQUIRE(al_test_broker_control(&b, "create t0204.in 6", reply, sizeof reply) == 0);
    REQUIRE(al_test_broker_control(&b, "create t0204.out 6", reply, sizeof reply) == 0);

    al_kafka_conf *c = al_kafka_conf_load(NULL, b.bootstrap, errstr, sizeof errstr);
    al_producer *feed = al_producer_new(c, errstr, sizeof errstr);
    al_kafka_conf_free(c);
    REQUIREF(feed, "%s", errstr);
    for (int i = 0; i < N_FIRST; i++) {
        char key[16];
        snprintf(key, sizeof key, "k%d", i);
        al_producer_send(feed, "t0204.in", key, strlen(key), "first", 5, NULL, NULL);
    }
    REQUIRE(al_producer_flush(feed, 20000, errstr, sizeof errstr) == 0);

    static member m1, m2;
    REQUIREF(member_init(&m1, b.bootstrap, errstr, sizeof errstr) == 0, "%s", errstr);
    double t0 = testlib_now();
    while (m1.consumed < N_FIRST && testlib_now() - t0 < 30)
        REQUIREF(member_step(&m1, 0, errstr, sizeof errstr) >= 0, "%s", errstr);
    CHECK_EQ_INT(m1.consumed, N_FIRST);
    CHECK_EQ_INT(owned_count(&m1), PARTS);

    /* The second member joins; both keep polling until the partitions are split. */
    REQUIREF(member_init(&m2, b.bootstrap, errstr, sizeof errstr) == 0, "%s", errstr);
    t0 = testlib_now();
    while (testlib_now() - t0 < 45) {
        REQUIREF(member_step(&m1, 1, errstr, sizeof errstr) >= 0, "%s", errstr);
        REQUIREF(member_step(&m2, 1, errstr, sizeof errstr) >= 0, "%s", errstr);
        if (owned_count(&m2) > 0 && owned_count(&m1) + owned_count(&m2) == PARTS) break;
    }
    CHECKF(owned_count(&m2) > 0 && owned_count(&m1) > 0, "split: m1 %d, m2 %d", owned_count(&m1),
           owned_count(&m2));
    CHECK_EQ_INT(owned_count(&m1) + owned_count(&m2), PARTS);
    /* Incremental: m1 gave up only what moved, never its whole assignment. */
    CHECK(m1.revoked_events >= 1);
    CHECKF(m1.max_revoked < PARTS, "m1 revoked %d partitions at once", m1.max_revoked);
    /* m2 got the moved partitions with m1's committed offsets: it re-reads none of the
     * first N_FIRST messages. */
    CHECK_EQ_INT(m2.consumed, 0);

    /* New messages go to the new owners only. */
    for (int i = 0; i < 120; i++) {
        char key[16];
        snprintf(key, sizeof key, "n%d", i);
        al_producer_send(feed, "t0204.in", key, strlen(key), "second", 6, NULL, NULL);
    }
    REQUIRE(al_producer_flush(feed, 20000, errstr, sizeof errstr) == 0);
    t0 = testlib_now();
    while (m1.consumed + m2.consumed < N_FIRST + 120 && testlib_now() - t0 < 30) {
        REQUIREF(member_step(&m1, 1, errstr, sizeof errstr) >= 0, "%s", errstr);
        REQUIREF(member_step(&m2, 1, errstr, sizeof errstr) >= 0, "%s", errstr);
    }
    CHECK_EQ_INT(m1.consumed + m2.consumed, N_FIRST + 120);
    for (int p = 0; p < PARTS; p++) {
        CHECKF(!(m1.late[p] && !m1.owned[p]), "m1 got partition %d it does not own", p);
        CHECKF(!(m2.late[p] && !m2.owned[p]), "m2 got partition %d it does not own", p);
    }
    member_free(&m2);
    member_free(&m1);
    al_producer_free(feed);
    CHECK_EQ_INT(al_test_broker_stop(&b), 0);
}
