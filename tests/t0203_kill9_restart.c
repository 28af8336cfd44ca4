/* t0203: a consumer-producer stage killed with SIGKILL mid-stream and restarted loses
 * nothing: every input of topic A is found processed (at least once) in topic B. The stage is
 * this executable itself, re-run as `t0203_kill9_restart --worker BOOTSTRAP`. */
#define TESTLIB_NO_MAIN
#include "testlib.h"

#include "broker_fixture.h"
#include "kafka/kafka.h"

#define N_INPUTS 3000
#define TOPIC_IN "t0203.in"
#define TOPIC_OUT "t0203.out"

static volatile sig_atomic_t worker_stop;
static void worker_on_term(int sig)
{
    (void)sig;
    worker_stop = 1;
}

/* The stage: A -> B, one output per input, offsets stored per the contract. Slow on purpose
 * (about 1 ms per input) so that the kill lands mid-stream. */
static int worker_main(const char *bootstrap)
{
    char errstr[512];
    signal(SIGTERM, worker_on_term);
    al_kafka_conf *c = al_kafka_conf_load(NULL, bootstrap, errstr, sizeof errstr);
    if (!c) return 1;
    al_kafka_conf_set(c, "auto.commit.interval.ms", "200");
    /* The killed member's partitions come back after its session times out. */
    al_kafka_conf_set(c, "session.timeout.ms", "3000");
    al_producer *p = al_producer_new(c, errstr, sizeof errstr);
    al_consumer *cons = p ? al_consumer_new(c, "t0203-stage", p, errstr, sizeof errstr) : NULL;
    al_kafka_conf_free(c);
    if (!cons) {
        fprintf(stderr, "worker: %s\n", errstr);
        al_producer_free(p);
        return 1;
    }
    const char *topics[] = {TOPIC_IN};
    int rc = 0;
    if (al_consumer_subscribe(cons, topics, 1, errstr, sizeof errstr) != 0) rc = 1;
    while (!rc && !worker_stop) {
        rd_kafka_message_t *m;
        int r = al_consumer_poll(cons, 100, &m, errstr, sizeof errstr);
        if (r < 0) {
            fprintf(stderr, "worker: %s\n", errstr);
            rc = 1;
            break;
        }
        if (r == 0) continue;
        al_input *in = al_consumer_input_begin(cons, m);
        char out[64];
        int n = snprintf(out, sizeof out, "done:%.*s", (int)m->len, (const char *)m->payload);
        al_kafka_out o = {.topic = TOPIC_OUT,
                          .partition = AL_KAFKA_PARTITION_ANY,
                          .key = m->key,
                          .keylen = m->key_len,
                          .value = out,
                          .len = (size_t)n,
                          .input = in};
        if (al_producer_produce(p, &o) != 0) rc = 1;
        al_input_end(in);
        rd_kafka_message_destroy(m);
        usleep(1000);
    }
    al_consumer_free(cons);
    al_producer_free(p);
    return rc;
}

static pid_t spawn_worker(const char *bootstrap)
{
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        execl("/proc/self/exe", "t0203_kill9_restart", "--worker", bootstrap, (char *)NULL);
        _exit(127);
    }
    return pid;
}

/* Reads B from the beginning with a fresh group; marks seen[i] for each "done:i". Returns
 * the number of distinct inputs seen and the total count of outputs in *total. */
static int read_outputs(const char *bootstrap, const char *group, char *seen, int want, int *total,
                        double max_s)
{
    char errstr[512];
    al_kafka_conf *c = al_kafka_conf_load(NULL, bootstrap, errstr, sizeof errstr);
    al_consumer *cons = al_consumer_new(c, group, NULL, errstr, sizeof errstr);
    al_kafka_conf_free(c);
    if (!cons) return -1;
    const char *topics[] = {TOPIC_OUT};
    al_consumer_subscribe(cons, topics, 1, errstr, sizeof errstr);
    int distinct = 0;
    *total = 0;
    double t0 = testlib_now();
    while (distinct < want && testlib_now() - t0 < max_s) {
        rd_kafka_message_t *m;
        int r = al_consumer_poll(cons, 200, &m, errstr, sizeof errstr);
        if (r < 0) break;
        if (r == 0) continue;
        int i;
        char buf[64];
        snprintf(buf, sizeof buf, "%.*s", (int)(m->len < 60 ? m->len : 60),
                 (const char *)m->payload);
        if (sscanf(buf, "done:%d", &i) == 1 && i >= 0 && i < N_INPUTS) {
            (*total)++;
            if (!seen[i]) {
                seen[i] = 1;
                distinct++;
            }
        }
        al_consumer_input_skip(cons, m);
        rd_kafka_message_destroy(m);
    }
    al_consumer_free(cons);
    return distinct;
}

static int64_t topic_messages(rd_kafka_t *rk, const char *topic, int partitions)
{
    int64_t sum = 0;
    for (int p = 0; p < partitions; p++) {
        int64_t lo, hi;
        if (rd_kafka_query_watermark_offsets(rk, topic, p, &lo, &hi, 5000)) return -1;
        sum += hi - lo;
    }
    return sum;
}

/* Sum of the offsets the stage's group has committed on the input topic (OffsetFetch from a
 * handle that never joins the group), or -1 on error. */
static int64_t group_committed(const char *bootstrap)
{
    char errstr[512];
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    if (rd_kafka_conf_set(conf, "bootstrap.servers", bootstrap, errstr, sizeof errstr) ||
        rd_kafka_conf_set(conf, "group.id", "t0203-stage", errstr, sizeof errstr)) {
        rd_kafka_conf_destroy(conf);
        return -1;
    }
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_CONSUMER, conf, errstr, sizeof errstr);
    if (!rk) return -1;
    rd_kafka_topic_partition_list_t *parts = rd_kafka_topic_partition_list_new(4);
    for (int i = 0; i < 4; i++)
        rd_kafka_topic_partition_list_add(parts, TOPIC_IN, i);
    int64_t sum = -1;
    if (rd_kafka_committed(rk, parts, 5000) == RD_KAFKA_RESP_ERR_NO_ERROR) {
        sum = 0;
        for (int i = 0; i < parts->cnt; i++)
            if (parts->elems[i].offset > 0) sum += parts->elems[i].offset;
    }
    rd_kafka_topic_partition_list_destroy(parts);
    rd_kafka_destroy(rk);
    return sum;
}

TEST(kill9_mid_stream_then_restart_loses_nothing)
{
    char errstr[512], reply[128];
    al_test_broker b;
    REQUIRE(al_test_broker_start(&b, NULL) == 0);
    REQUIRE(al_test_broker_control(&b, "create " TOPIC_IN " 4", reply, sizeof reply) == 0);
    REQUIRE(al_test_broker_control(&b, "create " TOPIC_OUT " 4", reply, sizeof reply) == 0);

    al_kafka_conf *c = al_kafka_conf_load(NULL, b.bootstrap, errstr, sizeof errstr);
    al_producer *p = al_producer_new(c, errstr, sizeof errstr);
    al_kafka_conf_free(c);
    REQUIREF(p, "%s", errstr);
    for (int i = 0; i < N_INPUTS; i++) {
        char key[16], val[16];
        snprintf(key, sizeof key, "r%d", i % 50);
        snprintf(val, sizeof val, "%d", i);
        REQUIRE(al_producer_send(p, TOPIC_IN, key, strlen(key), val, strlen(val), NULL, NULL) == 0);
    }
    REQUIRE(al_producer_flush(p, 30000, errstr, sizeof errstr) == 0);
    rd_kafka_t *rk = al_producer_handle(p);

    /* First run: killed with SIGKILL once a third of the outputs exist and the group has
     * committed something (on a loaded machine the worker can get that far before its first
     * auto-commit, and then the restart rightly re-does everything). Outputs counted after
     * the kill. */
    pid_t w = spawn_worker(b.bootstrap);
    REQUIRE(w > 0);
    double t0 = testlib_now();
    int64_t at_kill = 0, committed = 0;
    while (testlib_now() - t0 < 60) {
        at_kill = topic_messages(rk, TOPIC_OUT, 4);
        if (at_kill >= N_INPUTS / 3 && (committed = group_committed(b.bootstrap)) > 0) break;
        usleep(20000);
    }
    kill(w, SIGKILL);
    CHECKF(committed > 0, "the stage committed nothing within 60 s");
    CHECKF(at_kill < N_INPUTS, "the worker finished before it was killed (%lld outputs)",
           (long long)at_kill);
    int st;
    waitpid(w, &st, 0);
    at_kill = topic_messages(rk, TOPIC_OUT, 4);
    CHECKF(at_kill >= N_INPUTS / 3, "outputs at kill: %lld",
           (long long)at_kill);
    CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);

    /* Second run: resumes from the committed offsets and finishes. */
    w = spawn_worker(b.bootstrap);
    REQUIRE(w > 0);
    t0 = testlib_now();
    while (testlib_now() - t0 < 90 && topic_messages(rk, TOPIC_OUT, 4) < N_INPUTS)
        usleep(50000);
    static char seen[N_INPUTS];
    int total = 0;
    int distinct = read_outputs(b.bootstrap, "t0203-verify", seen, N_INPUTS, &total, 60);
    kill(w, SIGTERM);
    waitpid(w, &st, 0);
    CHECKF(WIFEXITED(st) && WEXITSTATUS(st) == 0, "worker exit status %d", st);
    CHECK_EQ_INT(distinct, N_INPUTS);
    int missing = -1;
    for (int i = 0; i < N_INPUTS && missing < 0; i++)
        if (!seen[i]) missing = i;
    CHECKF(missing < 0, "input %d never processed", missing);
    /* Offsets were stored and committed while the first run went: the restart re-did only
     * part of it. */
    CHECKF(total - N_INPUTS < at_kill, "re-processed %d of the %lld done before the kill",
           total - N_INPUTS, (long long)at_kill);
    printf("   outputs: %d for %d inputs (%d re-processed after the kill), %lld at the kill\n",
           total, N_INPUTS, total - N_INPUTS, (long long)at_kill);
    al_producer_free(p);
    CHECK_EQ_INT(al_test_broker_stop(&b), 0);
}

int main(int argc, char **argv)
{
    if (argc == 3 && !strcmp(argv[1], "--worker")) return worker_main(argv[2]);
    return testlib_run(argc, argv);
}
