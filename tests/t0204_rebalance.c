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
    int unowned;         /* messages handed out for a partition not owned at the time */
    unsigned char *seen; /* optional: seen[partition * per_part + offset] counts */
    int per_part;
    int poll_ms; /* 0: 50 */
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

static int member_init_in(member *m, const char *bootstrap, const char *group, const char *topic,
                          char *errstr, size_t errlen)
{
    memset(m, 0, sizeof *m);
    al_kafka_conf *c = al_kafka_conf_load(NULL, bootstrap, errstr, errlen);
    if (!c) return -1;
    /* The embedded broker waits up to a session timeout for members to rejoin. */
    al_kafka_conf_set(c, "session.timeout.ms", "3000");
    m->p = al_producer_new(c, errstr, errlen);
    m->c = m->p ? al_consumer_new(c, group, m->p, errstr, errlen) : NULL;
    al_kafka_conf_free(c);
    if (!m->c) return -1;
    al_consumer_set_rebalance_cb(m->c, on_rebalance, m);
    const char *topics[] = {topic};
    return al_consumer_subscribe(m->c, topics, 1, errstr, errlen);
}

static int member_init(member *m, const char *bootstrap, char *errstr, size_t errlen)
{
    return member_init_in(m, bootstrap, "t0204-group", "t0204.in", errstr, errlen);
}

/* One poll: a message becomes an input with one tracked output. */
static int member_step(member *m, int after_join, char *errstr, size_t errlen)
{
    rd_kafka_message_t *msg;
    int r = al_consumer_poll(m->c, m->poll_ms ? m->poll_ms : 50, &msg, errstr, errlen);
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
    if (msg->partition < PARTS) {
        if (!m->owned[msg->partition]) m->unowned++;
        if (m->seen && msg->offset >= 0 && msg->offset < m->per_part)
            m->seen[msg->partition * m->per_part + msg->offset]++;
    }
    if (after_join && msg->partition < PARTS) m->late[msg->partition]++;
    rd_kafka_message_destroy(msg);
    return 1;
}

static void member_free(member *m)
{
    al_consumer_free(m->c);
    al_producer_free(m->p);
}

/* Starts a broker with topics `in` and t0204.out (6 partitions each) and a producer to feed
 * it; 0, or -1 with the reason in errstr. */
static int start_with_topics(al_test_broker *b, const char *in, al_producer **feed, char *errstr,
                             size_t errlen)
{
    char cmd[128], reply[128];
    snprintf(cmd, sizeof cmd, "create %s 6", in);
    if (al_test_broker_start(b, NULL) != 0 ||
        al_test_broker_control(b, cmd, reply, sizeof reply) != 0 ||
        al_test_broker_control(b, "create t0204.out 6", reply, sizeof reply) != 0) {
        snprintf(errstr, errlen, "broker or topics did not start");
        return -1;
    }
    al_kafka_conf *c = al_kafka_conf_load(NULL, b->bootstrap, errstr, errlen);
    *feed = c ? al_producer_new(c, errstr, errlen) : NULL;
    al_kafka_conf_free(c);
    return *feed ? 0 : -1;
}

TEST(second_consumer_joins_partitions_move_with_their_offsets)
{
    char errstr[512];
    al_test_broker b;
    al_producer *feed;
    REQUIREF(start_with_topics(&b, "t0204.in", &feed, errstr, sizeof errstr) == 0, "%s", errstr);
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
     * first N_FIRST messages (unless the broker refused m1's commit on the revoke). */
    if (al_consumer_commit_failures(m1.c))
        printf("  (m1's commit on the revoke was refused: m2 read %d again)\n", m2.consumed);
    else
        CHECK_EQ_INT(m2.consumed, 0);
    int again = m2.consumed;

    /* New messages go to the new owners only. */
    for (int i = 0; i < 120; i++) {
        char key[16];
        snprintf(key, sizeof key, "n%d", i);
        al_producer_send(feed, "t0204.in", key, strlen(key), "second", 6, NULL, NULL);
    }
    REQUIRE(al_producer_flush(feed, 20000, errstr, sizeof errstr) == 0);
    t0 = testlib_now();
    while (m1.consumed + m2.consumed < N_FIRST + again + 120 && testlib_now() - t0 < 30) {
        REQUIREF(member_step(&m1, 1, errstr, sizeof errstr) >= 0, "%s", errstr);
        REQUIREF(member_step(&m2, 1, errstr, sizeof errstr) >= 0, "%s", errstr);
    }
    if (al_consumer_commit_failures(m1.c))
        CHECK(m1.consumed + m2.consumed >= N_FIRST + again + 120);
    else
        CHECK_EQ_INT(m1.consumed + m2.consumed, N_FIRST + 120);
    for (int p = 0; p < PARTS; p++) {
        CHECKF(!(m1.late[p] && !m1.owned[p]), "m1 got partition %d it does not own", p);
        CHECKF(!(m2.late[p] && !m2.owned[p]), "m2 got partition %d it does not own", p);
    }
    CHECK_EQ_INT(m1.unowned + m2.unowned, 0);
    member_free(&m2);
    member_free(&m1);
    al_producer_free(feed);
    CHECK_EQ_INT(al_test_broker_stop(&b), 0);
}

/* The consumer takes messages from librdkafka in batches (and drops those of partitions a
 * rebalance inside the batch call took away). A member with a backlog taken (its queue and
 * batch full of every partition's messages) when the second member joins hands out none of a
 * partition after its revoke, and the new owner starts where the committed offsets say:
 * every message is handled, by the partition's owner at the time, and once, unless the
 * broker refused the commit made on the revoke (the embedded broker sometimes does while the
 * group rebalances; the next owner then reads again from the last committed offset). */
#define N_BACKLOG 6000

/* Offsets of t0204.b handled by neither member (and, in *twice, by both or one twice). */
static int backlog_missing(al_consumer *c, const unsigned char *seen1, const unsigned char *seen2,
                           int *twice, int *total)
{
    int missing = 0;
    *twice = *total = 0;
    for (int p = 0; p < PARTS; p++) {
        int64_t lo = 0, hi = 0;
        if (rd_kafka_query_watermark_offsets(al_consumer_handle(c), "t0204.b", p, &lo, &hi, 5000) !=
            0)
            return -1;
        for (int64_t o = lo; o < hi && o < N_BACKLOG; o++) {
            int n = seen1[p * N_BACKLOG + o] + seen2[p * N_BACKLOG + o];
            missing += n == 0;
            *twice += n > 1;
            (*total)++;
        }
    }
    return missing;
}
TEST(backlog_taken_in_batches_moves_to_the_new_owner_exactly_once)
{
    char errstr[512];
    al_test_broker b;
    al_producer *feed;
    REQUIREF(start_with_topics(&b, "t0204.b", &feed, errstr, sizeof errstr) == 0, "%s", errstr);
    static char value[400];
    memset(value, 'v', sizeof value);
    for (int i = 0; i < N_BACKLOG; i++) {
        char key[16];
        snprintf(key, sizeof key, "b%d", i);
        al_producer_send(feed, "t0204.b", key, strlen(key), value, sizeof value, NULL, NULL);
    }
    REQUIRE(al_producer_flush(feed, 20000, errstr, sizeof errstr) == 0);

    static member m1, m2;
    static unsigned char seen1[PARTS * N_BACKLOG], seen2[PARTS * N_BACKLOG];
    REQUIREF(member_init_in(&m1, b.bootstrap, "t0204-b", "t0204.b", errstr, sizeof errstr) == 0,
             "%s", errstr);
    m1.seen = seen1;
    m1.per_part = N_BACKLOG;
    m1.poll_ms = 5;
    double t0 = testlib_now();
    while (m1.consumed < 300 && testlib_now() - t0 < 30)
        REQUIREF(member_step(&m1, 0, errstr, sizeof errstr) >= 0, "%s", errstr);
    REQUIRE(m1.consumed >= 300);

    REQUIREF(member_init_in(&m2, b.bootstrap, "t0204-b", "t0204.b", errstr, sizeof errstr) == 0,
             "%s", errstr);
    m2.seen = seen2;
    m2.per_part = N_BACKLOG;
    m2.poll_ms = 5;
    /* m1 handles one message per step, so most of its backlog is still taken but not handed
     * out when the revoke comes */
    t0 = testlib_now();
    int missing = -1, twice = 0, total = 0;
    /* One message a step each: 6000 steps and more (a refused commit makes the new owner read
     * hundreds again) took over 60 s on the sanitizer build with the two cores busy. */
    while (testlib_now() - t0 < 150) {
        REQUIREF(member_step(&m1, 1, errstr, sizeof errstr) >= 0, "%s", errstr);
        REQUIREF(member_step(&m2, 1, errstr, sizeof errstr) >= 0, "%s", errstr);
        if (m1.consumed + m2.consumed >= N_BACKLOG && owned_count(&m2) > 0 &&
            (missing = backlog_missing(m1.c, seen1, seen2, &twice, &total)) == 0)
            break;
    }
    CHECKF(owned_count(&m2) > 0, "m2 got no partition (m1 owns %d)", owned_count(&m1));
    CHECK_EQ_INT(m1.unowned, 0);
    CHECK_EQ_INT(m2.unowned, 0);
    /* every message of the topic was handled, and (the moved partitions starting at the
     * committed offsets) none twice unless a commit on the revoke was refused */
    CHECK_EQ_INT(total, N_BACKLOG);
    CHECK_EQ_INT(missing, 0);
    uint64_t refused = al_consumer_commit_failures(m1.c) + al_consumer_commit_failures(m2.c);
    if (refused)
        printf("  (%llu commits on a revoke refused by the broker: %d messages read twice)\n",
               (unsigned long long)refused, twice);
    else
        CHECK_EQ_INT(twice, 0);
    member_free(&m2);
    member_free(&m1);
    al_producer_free(feed);
    CHECK_EQ_INT(al_test_broker_stop(&b), 0);
}
