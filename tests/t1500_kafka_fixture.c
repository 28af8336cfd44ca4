/* t1500: real Apache Kafka for the tests (tests/kafka_fixture.h) and `arclight topics create`
 * on it: a single KRaft node and a three-node cluster start on free ports, serve produce and
 * consume, lose and regain a node, and stop leaving no process and no directory behind, also
 * when the test process dies without cleaning up. Label `kafka`. */
#include "testlib.h"

#include "broker_fixture.h"
#include "kafka/kafka.h"

#include <sys/stat.h>

/* This file is about real Kafka alone: broker_fixture.h's calls start it, whatever ctest says. */
__attribute__((constructor)) static void use_real_kafka(void)
{
    setenv("ARCLIGHT_TEST_BROKER", "kafka", 1);
}

/* Runs `$ARCLIGHT_BIN args...`; its exit status, stdout+stderr in out. */
static int run_cmd(const char *const *args, char *out, size_t outlen)
{
    char cmd[4096];
    size_t off = (size_t)snprintf(cmd, sizeof cmd, "'%s'", al_test_bin());
    for (int i = 0; args[i]; i++)
        off += (size_t)snprintf(cmd + off, sizeof cmd - off, " '%s'", args[i]);
    snprintf(cmd + off, sizeof cmd - off, " 2>&1");
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    size_t n = fread(out, 1, outlen - 1, p);
    out[n] = '\0';
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static int process_gone(pid_t pid, double timeout_s)
{
    double t0 = testlib_now();
    char buf[512];
    while (testlib_now() - t0 < timeout_s) {
        /* a zombie (not yet reaped by a dead parent's reaper) counts as gone */
        const char *st = al_test_proc_stat(pid, buf, sizeof buf);
        if (!st || st[0] == 'Z') return 1;
        usleep(50000);
    }
    return 0;
}

/* Produces n messages with arclight's producer (idempotent, acks=all) and reads them back
 * with a reader. Returns how many came back. */
static int produce_consume(const char *bootstrap, const char *topic, int n)
{
    char err[512];
    al_kafka_conf *kc = al_kafka_conf_load(NULL, bootstrap, err, sizeof err);
    if (!kc) return -1;
    al_producer *p = al_producer_new(kc, err, sizeof err);
    if (!p) {
        al_kafka_conf_free(kc);
        return -1;
    }
    for (int i = 0; i < n; i++) {
        char v[32];
        int len = snprintf(v, sizeof v, "m%d", i);
        if (al_producer_send(p, topic, v, (size_t)len, v, (size_t)len, NULL, NULL)) break;
    }
    int flushed = al_producer_flush(p, 30000, err, sizeof err);
    al_producer_free(p);
    if (flushed != 0) {
        fprintf(stderr, "flush: %s\n", err);
        al_kafka_conf_free(kc);
        return -1;
    }
    rd_kafka_t *r = al_kafka_reader_new(kc, "t1500", err, sizeof err);
    al_kafka_conf_free(kc);
    if (!r) return -1;
    const struct rd_kafka_metadata *md;
    rd_kafka_topic_t *rkt = rd_kafka_topic_new(r, topic, NULL);
    int parts = 0;
    if (!rd_kafka_metadata(r, 0, rkt, &md, 10000)) {
        parts = md->topics[0].partition_cnt;
        rd_kafka_metadata_destroy(md);
    }
    rd_kafka_topic_destroy(rkt);
    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(parts);
    for (int i = 0; i < parts; i++)
        rd_kafka_topic_partition_list_add(l, topic, i)->offset = RD_KAFKA_OFFSET_BEGINNING;
    rd_kafka_assign(r, l);
    rd_kafka_topic_partition_list_destroy(l);
    int got = 0, eofs = 0;
    double t0 = testlib_now();
    while (eofs < parts && testlib_now() - t0 < 30) {
        rd_kafka_message_t *m = rd_kafka_consumer_poll(r, 200);
        if (!m) continue;
        if (!m->err) got++;
        if (m->err == RD_KAFKA_RESP_ERR__PARTITION_EOF) eofs++;
        rd_kafka_message_destroy(m);
    }
    rd_kafka_consumer_close(r);
    rd_kafka_destroy(r);
    return got;
}

/* The value of a topic's config entry, via DescribeConfigs; "" when not found. */
static void topic_config(const char *bootstrap, const char *topic, const char *key, char *out,
                         size_t outlen)
{
    out[0] = '\0';
    rd_kafka_t *rk = al_test_kafka_client(bootstrap);
    if (!rk) return;
    rd_kafka_queue_t *q = rd_kafka_queue_new(rk);
    rd_kafka_ConfigResource_t *cr = rd_kafka_ConfigResource_new(RD_KAFKA_RESOURCE_TOPIC, topic);
    rd_kafka_DescribeConfigs(rk, &cr, 1, NULL, q);
    rd_kafka_event_t *ev = rd_kafka_queue_poll(q, 15000);
    if (ev && !rd_kafka_event_error(ev)) {
        size_t cnt, ce;
        const rd_kafka_ConfigResource_t **rs = rd_kafka_DescribeConfigs_result_resources(
            rd_kafka_event_DescribeConfigs_result(ev), &cnt);
        if (cnt == 1) {
            const rd_kafka_ConfigEntry_t **e = rd_kafka_ConfigResource_configs(rs[0], &ce);
            for (size_t i = 0; i < ce; i++)
                if (!strcmp(rd_kafka_ConfigEntry_name(e[i]), key) && rd_kafka_ConfigEntry_value(e[i]))
                    snprintf(out, outlen, "%s", rd_kafka_ConfigEntry_value(e[i]));
        }
    }
    if (ev) rd_kafka_event_destroy(ev);
    rd_kafka_ConfigResource_destroy(cr);
    rd_kafka_queue_destroy(q);
    rd_kafka_destroy(rk);
}

/* Replicas of partition 0 of topic, -1 when unknown. */
static int topic_replicas(const char *bootstrap, const char *topic, int *partitions)
{
    rd_kafka_t *rk = al_test_kafka_client(bootstrap);
    rd_kafka_topic_t *rkt = rd_kafka_topic_new(rk, topic, NULL);
    const struct rd_kafka_metadata *md;
    int r = -1;
    if (!rd_kafka_metadata(rk, 0, rkt, &md, 10000)) {
        if (!md->topics[0].err && md->topics[0].partition_cnt > 0) {
            r = md->topics[0].partitions[0].replica_cnt;
            if (partitions) *partitions = md->topics[0].partition_cnt;
        }
        rd_kafka_metadata_destroy(md);
    }
    rd_kafka_topic_destroy(rkt);
    rd_kafka_destroy(rk);
    return r;
}

TEST(single_node_serves_and_stops_cleanly)
{
    al_test_kafka k;
    REQUIRE(al_test_kafka_start(&k, 1, NULL) == 0);
    printf("  one node up in %.1f s at %s\n", k.start_s, k.bootstrap);
    CHECKF(k.start_s < 60, "start took %.1f s", k.start_s);
    char err[256];
    REQUIRE(al_test_kafka_create_topic(&k, "t1500.one", 3, 1, NULL, err, sizeof err) == 0);
    CHECK_EQ_INT(produce_consume(k.bootstrap, "t1500.one", 500), 500);
    /* node loss and restart with the same ports and log directory: nothing acknowledged is lost */
    al_test_kafka_kill(&k, 0);
    REQUIRE(al_test_kafka_restart(&k, 0, 120) == 0);
    CHECK_EQ_INT(produce_consume(k.bootstrap, "t1500.one", 100), 600);
    pid_t pid = k.node[0].pid;
    char root[256];
    snprintf(root, sizeof root, "%s", k.root);
    CHECK_EQ_INT(al_test_kafka_stop(&k), 0);
    CHECK(process_gone(pid, 5));
    struct stat st;
    CHECKF(stat(root, &st) != 0, "%s is still there", root);
}

TEST(topics_create_applies_topics_conf_idempotently)
{
    al_test_broker b;
    REQUIRE(al_test_broker_start(&b, NULL) == 0); /* runs `arclight topics create` once */
    char out[8192], v[128];
    const char *args[] = {"topics", "create", "--bootstrap", b.bootstrap, NULL};
    CHECK_EQ_INT(run_cmd(args, out, sizeof out), 0);
    CHECKF(strstr(out, "arclight.spans: exists (16 partitions)") != NULL, "second run: %s", out);
    CHECKF(strstr(out, "created") == NULL, "second run created something: %s", out);
    int parts = 0;
    CHECK_EQ_INT(topic_replicas(b.bootstrap, AL_TOPIC_SPANS, &parts), 1);
    CHECK_EQ_INT(parts, 16);
    topic_replicas(b.bootstrap, AL_TOPIC_BATCHES, &parts);
    CHECK_EQ_INT(parts, 8);
    topic_config(b.bootstrap, AL_TOPIC_POLICY, "cleanup.policy", v, sizeof v);
    CHECK_EQ_STR(v, "compact");
    topic_config(b.bootstrap, AL_TOPIC_POLICY, "min.compaction.lag.ms", v, sizeof v);
    CHECK_EQ_STR(v, "60000");
    topic_config(b.bootstrap, AL_TOPIC_SPANS, "cleanup.policy", v, sizeof v);
    CHECK_EQ_STR(v, "delete");
    topic_config(b.bootstrap, AL_TOPIC_SPANS, "max.message.bytes", v, sizeof v);
    CHECK_EQ_STR(v, "4194304");
    topic_config(b.bootstrap, AL_TOPIC_SPANS, "retention.ms", v, sizeof v);
    CHECK_EQ_STR(v, "604800000");
    topic_config(b.bootstrap, AL_TOPIC_BATCHES, "max.message.bytes", v, sizeof v);
    CHECK_EQ_STR(v, "10485760");
    topic_config(b.bootstrap, AL_TOPIC_DEADLETTER, "retention.ms", v, sizeof v);
    CHECK_EQ_STR(v, "2592000000");
    /* capped at the one node */
    topic_config(b.bootstrap, AL_TOPIC_SPANS, "min.insync.replicas", v, sizeof v);
    CHECK_EQ_STR(v, "1");
    /* the fixture's reset: a second start finds the topics empty again */
    CHECK_EQ_INT(produce_consume(b.bootstrap, AL_TOPIC_DEADLETTER, 10), 10);
    CHECK_EQ_INT(al_test_broker_stop(&b), 0);
    REQUIRE(al_test_broker_start(&b, NULL) == 0);
    CHECK_EQ_INT(produce_consume(b.bootstrap, AL_TOPIC_DEADLETTER, 3), 3);
    /* the embedded broker's own controls are refused in so many words */
    char reply[256];
    CHECK_EQ_INT(al_test_broker_control(&b, "error 0 10 1", reply, sizeof reply), -1);
    CHECKF(strstr(reply, "real Kafka") != NULL, "reply: %s", reply);
    CHECK_EQ_INT(al_test_broker_control(&b, "create t1500.made 3", reply, sizeof reply), 0);
    CHECK_EQ_INT(topic_replicas(b.bootstrap, "t1500.made", &parts), 1);
    CHECK_EQ_INT(parts, 3);
    CHECK_EQ_INT(al_test_broker_stop(&b), 0);
    CHECK_EQ_INT(al_test_kafka_stop(&al_test_broker_cluster), 0);
}

TEST(three_nodes_replicate_and_survive_a_leader_kill)
{
    al_test_broker b;
    const char *extra[] = {"--brokers", "3", NULL};
    REQUIRE(al_test_broker_start(&b, extra) == 0);
    al_test_kafka *k = &al_test_broker_cluster;
    printf("  three nodes up in %.1f s at %s\n", k->start_s, k->bootstrap);
    char v[64];
    int parts = 0;
    CHECK_EQ_INT(topic_replicas(b.bootstrap, AL_TOPIC_SPANS, &parts), 3);
    topic_config(b.bootstrap, AL_TOPIC_SPANS, "min.insync.replicas", v, sizeof v);
    CHECK_EQ_STR(v, "2");
    CHECK_EQ_INT(produce_consume(b.bootstrap, AL_TOPIC_SPANS, 300), 300);
    int leader = al_test_kafka_leader(k, AL_TOPIC_SPANS, 0);
    REQUIRE(leader >= 0 && leader < 3);
    al_test_kafka_kill(k, leader);
    int moved = -1;
    for (double t0 = testlib_now(); testlib_now() - t0 < 30; usleep(200000)) {
        moved = al_test_kafka_leader(k, AL_TOPIC_SPANS, 0);
        if (moved >= 0 && moved != leader) break;
    }
    CHECKF(moved >= 0 && moved != leader, "leader %d, after the kill %d", leader, moved);
    /* two of three in sync: acks=all still succeeds, and nothing acknowledged is lost */
    CHECK_EQ_INT(produce_consume(b.bootstrap, AL_TOPIC_SPANS, 200), 500);
    char reply[128];
    snprintf(v, sizeof v, "up %d", leader + 1);
    CHECK_EQ_INT(al_test_broker_control(&b, v, reply, sizeof reply), 0);
    CHECK_EQ_INT(produce_consume(b.bootstrap, AL_TOPIC_SPANS, 1), 501);
    CHECK_EQ_INT(al_test_broker_stop(&b), 0);
    pid_t pids[3];
    for (int i = 0; i < 3; i++) pids[i] = k->node[i].pid;
    CHECK_EQ_INT(al_test_kafka_stop(k), 0);
    for (int i = 0; i < 3; i++) CHECK(process_gone(pids[i], 5));
}

TEST(a_test_that_dies_leaves_no_broker_running)
{
    int pfd[2];
    REQUIRE(pipe(pfd) == 0);
    pid_t child = fork();
    REQUIRE(child >= 0);
    if (child == 0) {
        close(pfd[0]);
        al_test_kafka k;
        if (al_test_kafka_start(&k, 1, NULL) != 0) _exit(2);
        pid_t jvm = k.node[0].pid;
        if (write(pfd[1], &jvm, sizeof jvm) != (ssize_t)sizeof jvm) _exit(3);
        close(pfd[1]);
        /* a crash: no atexit hook, no stop */
        signal(SIGKILL, SIG_DFL);
        kill(getpid(), SIGKILL);
        _exit(4);
    }
    close(pfd[1]);
    pid_t jvm = 0;
    ssize_t got = read(pfd[0], &jvm, sizeof jvm);
    close(pfd[0]);
    int st;
    waitpid(child, &st, 0);
    REQUIREF(got == (ssize_t)sizeof jvm && jvm > 0, "the child did not start a broker (status %d)",
             st);
    CHECKF(WIFSIGNALED(st), "child status %d", st);
    CHECKF(process_gone(jvm, 10), "broker %d outlived the test process that started it", (int)jvm);
    /* its scratch directory goes with the next start's sweep */
    char path[128];
    snprintf(path, sizeof path, "/tmp");
    al_test_kafka_sweep(getenv("TMPDIR") && *getenv("TMPDIR") ? getenv("TMPDIR") : path);
    DIR *d = opendir(getenv("TMPDIR") && *getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    REQUIRE(d);
    struct dirent *e;
    char prefix[64];
    snprintf(prefix, sizeof prefix, "arclight-kafka-%d-", (int)child);
    int left = 0;
    while ((e = readdir(d)))
        if (!strncmp(e->d_name, prefix, strlen(prefix))) left++;
    closedir(d);
    CHECK_EQ_INT(left, 0);
}
