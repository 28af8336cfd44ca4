/* t0201: the embedded broker (`arclight broker`) and `arclight topics create`, over TCP. */
#include "testlib.h"

#include "broker_fixture.h"
#include "kafka/kafka.h"

#include <dirent.h>
#include <netinet/tcp.h>
#include <sys/pidfd.h>

/* Runs `$ARCLIGHT_BIN args...` and returns its exit status; its stdout+stderr go to out. */
static int run_cmd(const char *const *args, char *out, size_t outlen)
{
    char cmd[2048];
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

static rd_kafka_t *metadata_client(const char *bootstrap)
{
    char errstr[512];
    al_kafka_conf *kc = al_kafka_conf_load(NULL, bootstrap, errstr, sizeof errstr);
    if (!kc) return NULL;
    rd_kafka_conf_t *rc = al_kafka_conf_build(kc, errstr, sizeof errstr);
    al_kafka_conf_free(kc);
    if (!rc) return NULL;
    rd_kafka_conf_set(rc, "auto.offset.reset", "earliest", NULL, 0);
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_PRODUCER, rc, errstr, sizeof errstr);
    if (!rk) rd_kafka_conf_destroy(rc);
    return rk;
}

/* Partition count of topic, or -1 when the cluster does not know it. */
static int topic_partitions(rd_kafka_t *rk, const char *topic)
{
    const struct rd_kafka_metadata *md;
    if (rd_kafka_metadata(rk, 1, NULL, &md, 10000)) return -1;
    int n = -1;
    for (int i = 0; i < md->topic_cnt; i++)
        if (!strcmp(md->topics[i].topic, topic) && !md->topics[i].err)
            n = md->topics[i].partition_cnt;
    rd_kafka_metadata_destroy(md);
    return n;
}

TEST(broker_help_and_bad_usage)
{
    char out[4096];
    const char *help[] = {"broker", "--help", NULL};
    CHECK_EQ_INT(run_cmd(help, out, sizeof out), 0);
    CHECKF(strstr(out, "--listen") != NULL, "help: %s", out);
    const char *bad[] = {"broker", "--listen", "10.1.2.3:9092", NULL};
    CHECK_EQ_INT(run_cmd(bad, out, sizeof out), 2);
    CHECKF(strstr(out, "loopback") != NULL, "bad listen: %s", out);
    const char *bad2[] = {"broker", "--brokers", "0", NULL};
    CHECK_EQ_INT(run_cmd(bad2, out, sizeof out), 2);
    const char *bad3[] = {"broker",   "--topics",    "/nonexistent/topics.conf",
                          "--listen", "127.0.0.1:0", NULL};
    CHECK_EQ_INT(run_cmd(bad3, out, sizeof out), 1);
    CHECKF(strstr(out, "/nonexistent/topics.conf") != NULL, "missing topics file: %s", out);
}

TEST(broker_creates_topics_and_serves_produce_consume)
{
    al_test_broker b;
    REQUIRE(al_test_broker_start(&b, NULL) == 0);
    CHECKF(strncmp(b.bootstrap, "127.0.0.1:", 10) == 0, "bootstrap '%s'", b.bootstrap);
    rd_kafka_t *rk = metadata_client(b.bootstrap);
    REQUIRE(rk);
    CHECK_EQ_INT(topic_partitions(rk, AL_TOPIC_SPANS), 16);
    CHECK_EQ_INT(topic_partitions(rk, AL_TOPIC_POLICY), 1);
    CHECK_EQ_INT(topic_partitions(rk, AL_TOPIC_DEADLETTER), 4);
    rd_kafka_destroy(rk);
    CHECK_EQ_INT(al_test_broker_stop(&b), 0);
}

/* The connections the broker accepts have Nagle's algorithm off (tools/broker.c sets
 * TCP_NODELAY on the mock cluster's listeners). Looked at from inside: each of the broker's
 * sockets is copied into this process with pidfd_getfd (the broker is this test's child). */
TEST(broker_connections_have_nagle_off)
{
    al_test_broker b;
    REQUIRE(al_test_broker_start(&b, NULL) == 0);
    int port = atoi(strrchr(b.bootstrap, ':') + 1);
    rd_kafka_t *rk = metadata_client(b.bootstrap);
    REQUIRE(rk);
    REQUIRE(topic_partitions(rk, AL_TOPIC_SPANS) == 16); /* connected and answered */
    int pfd = (int)pidfd_open(b.pid, 0);
    REQUIREF(pfd >= 0, "pidfd_open: %s", strerror(errno));
    char dir[64];
    snprintf(dir, sizeof dir, "/proc/%d/fd", (int)b.pid);
    DIR *d = opendir(dir);
    REQUIRE(d);
    int accepted = 0, nodelay = 0, copy_errors = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        int fd = atoi(e->d_name);
        if (e->d_name[0] == '.') continue;
        int mine = pidfd_getfd(pfd, fd, 0);
        if (mine < 0) {
            copy_errors++;
            continue;
        }
        int type = 0, listening = 1, v = 0;
        socklen_t l = sizeof type;
        struct sockaddr_in local, peer;
        socklen_t ll = sizeof local, pl = sizeof peer;
        if (getsockopt(mine, SOL_SOCKET, SO_TYPE, &type, &l) == 0 && type == SOCK_STREAM &&
            getsockopt(mine, SOL_SOCKET, SO_ACCEPTCONN, &listening, &(socklen_t){sizeof(int)}) ==
                0 &&
            !listening && getsockname(mine, (struct sockaddr *)&local, &ll) == 0 &&
            local.sin_family == AF_INET && ntohs(local.sin_port) == port &&
            getpeername(mine, (struct sockaddr *)&peer, &pl) == 0) {
            accepted++;
            l = sizeof v;
            if (getsockopt(mine, IPPROTO_TCP, TCP_NODELAY, &v, &l) == 0 && v) nodelay++;
        }
        close(mine);
    }
    closedir(d);
    close(pfd);
    CHECKF(copy_errors == 0, "%d of the broker's fds could not be copied (pidfd_getfd: %s)",
           copy_errors, strerror(errno));
    CHECKF(accepted >= 1, "no accepted connection on port %d found", port);
    CHECK_EQ_INT(nodelay, accepted);
    rd_kafka_destroy(rk);
    CHECK_EQ_INT(al_test_broker_stop(&b), 0);
}

TEST(broker_fixed_port_and_n_brokers)
{
    /* Find a free pair of ports, then ask for exactly them. */
    int port = 0;
    for (int attempt = 0; attempt < 20 && !port; attempt++) {
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in sin = {.sin_family = AF_INET};
        socklen_t sl = sizeof sin;
        inet_pton(AF_INET, "127.0.0.1", &sin.sin_addr);
        bind(fd, (struct sockaddr *)&sin, sizeof sin);
        getsockname(fd, (struct sockaddr *)&sin, &sl);
        int p = ntohs(sin.sin_port);
        close(fd);
        fd = socket(AF_INET, SOCK_STREAM, 0);
        sin.sin_port = htons((uint16_t)(p + 1));
        if (p < 65000 && bind(fd, (struct sockaddr *)&sin, sizeof sin) == 0) port = p;
        close(fd);
    }
    REQUIRE(port);
    char listen[64], want[128];
    snprintf(listen, sizeof listen, "127.0.0.1:%d", port);
    snprintf(want, sizeof want, "127.0.0.1:%d,127.0.0.1:%d", port, port + 1);
    const char *args[] = {"--listen", listen, "--brokers", "2", NULL};
    al_test_broker b;
    REQUIRE(al_test_broker_start(&b, args) == 0);
    CHECK_EQ_STR(b.bootstrap, want);
    /* Each advertised address answers by itself. */
    char one[64];
    snprintf(one, sizeof one, "127.0.0.1:%d", port + 1);
    rd_kafka_t *rk = metadata_client(one);
    REQUIRE(rk);
    CHECK_EQ_INT(topic_partitions(rk, AL_TOPIC_TRANSITIONS), 16);
    rd_kafka_destroy(rk);

    /* A second broker on the same port fails with a clear error and exit 1. */
    char out[4096];
    const char *again[] = {"broker", "--listen", listen, NULL};
    CHECK_EQ_INT(run_cmd(again, out, sizeof out), 1);
    CHECKF(strstr(out, "in use") != NULL, "second broker on a busy port: %s", out);
    CHECK_EQ_INT(al_test_broker_stop(&b), 0);
}

TEST(broker_control_down_and_up)
{
    char errstr[512], reply[256];
    al_test_broker b;
    REQUIRE(al_test_broker_start(&b, NULL) == 0);
    CHECK_EQ_INT(al_test_broker_control(&b, "ping", reply, sizeof reply), 0);
    CHECK_EQ_INT(al_test_broker_control(&b, "down 7", reply, sizeof reply), -1);
    CHECKF(strstr(reply, "1..1") != NULL, "reply: %s", reply);
    CHECK_EQ_INT(al_test_broker_control(&b, "bogus", reply, sizeof reply), -1);

    al_kafka_conf *kc = al_kafka_conf_load(NULL, b.bootstrap, errstr, sizeof errstr);
    REQUIRE(kc);
    al_producer *p = al_producer_new(kc, errstr, sizeof errstr);
    al_kafka_conf_free(kc);
    REQUIREF(p, "%s", errstr);
    CHECKF(al_producer_check(p, 10000, errstr, sizeof errstr) == 0, "%s", errstr);

    /* Broker away: a message waits; broker back: it is delivered. */
    REQUIRE(al_test_broker_control(&b, "down 1", reply, sizeof reply) == 0);
    CHECK_EQ_INT(al_producer_send(p, AL_TOPIC_SPANS, "k", 1, "v", 1, NULL, NULL), 0);
    CHECK(al_producer_flush(p, 1500, errstr, sizeof errstr) == -1);
    CHECKF(strstr(errstr, "1 messages still in flight") != NULL, "flush: %s", errstr);
    REQUIRE(al_test_broker_control(&b, "up 1", reply, sizeof reply) == 0);
    CHECKF(al_producer_flush(p, 20000, errstr, sizeof errstr) == 0, "%s", errstr);
    al_producer_free(p);
    CHECK_EQ_INT(al_test_broker_stop(&b), 0);
}

TEST(topics_create_reports_existing_and_new_topics)
{
    /* librdkafka 2.0.2's mock cluster has no CreateTopics (ApiKey 19): topics the cluster has
     * are reported as existing (exit 0); new ones fail with an error saying so (exit 1). */
    char path[] = "/tmp/t0201_topics.XXXXXX";
    int fd = mkstemp(path);
    REQUIRE(fd >= 0);
    const char *text = "# test topics\n"
                       "arclight.spans 16 3  retention.ms=1000\n"
                       "t0201.made    3  1   # created through the control port below\n";
    REQUIRE(write(fd, text, strlen(text)) == (ssize_t)strlen(text));
    close(fd);
    al_test_broker b;
    REQUIRE(al_test_broker_start(&b, NULL) == 0);
    char out[8192], reply[256];
    const char *args[] = {"topics", "create", "--bootstrap", b.bootstrap, "--topics", path, NULL};
    CHECK_EQ_INT(run_cmd(args, out, sizeof out), 1);
    CHECKF(strstr(out, "arclight.spans: exists (16 partitions)") != NULL, "output: %s", out);
    CHECKF(strstr(out, "does not support CreateTopics") != NULL, "output: %s", out);
    CHECKF(strstr(out, "t0201.made: failed") != NULL, "output: %s", out);

    /* The embedded broker's own way: its control port creates the topic. */
    CHECK_EQ_INT(al_test_broker_control(&b, "create t0201.made 3", reply, sizeof reply), 0);
    CHECK_EQ_INT(run_cmd(args, out, sizeof out), 0);
    CHECKF(strstr(out, "t0201.made: exists (3 partitions)") != NULL, "output: %s", out);
    rd_kafka_t *rk = metadata_client(b.bootstrap);
    REQUIRE(rk);
    CHECK_EQ_INT(topic_partitions(rk, "t0201.made"), 3);
    rd_kafka_destroy(rk);
    const char *list[] = {"topics", "list", "--bootstrap", b.bootstrap, NULL};
    CHECK_EQ_INT(run_cmd(list, out, sizeof out), 0);
    CHECKF(strstr(out, "arclight.deadletter 4\n") != NULL, "list: %s", out);
    CHECK_EQ_INT(al_test_broker_stop(&b), 0);

    /* A malformed file: exit 1 naming file and line, before any connection attempt. */
    fd = open(path, O_WRONLY | O_TRUNC);
    const char *bad = "ok.topic 1 1\nbad.topic many 1\n";
    REQUIRE(write(fd, bad, strlen(bad)) == (ssize_t)strlen(bad));
    close(fd);
    const char *args2[] = {"topics",   "create", "--bootstrap", "127.0.0.1:1",
                           "--topics", path,     NULL};
    CHECK_EQ_INT(run_cmd(args2, out, sizeof out), 1);
    CHECKF(strstr(out, ":2:") != NULL && strstr(out, "many") != NULL, "output: %s", out);
    unlink(path);

    /* Unreachable cluster: exit 1, the error names the bootstrap servers and the reason. */
    const char *args3[] = {"topics", "list", "--bootstrap", "127.0.0.1:1", "--timeout", "2", NULL};
    CHECK_EQ_INT(run_cmd(args3, out, sizeof out), 1);
    CHECKF(
        strstr(out, "cannot reach Kafka at 127.0.0.1:1: Connection refused (all brokers down)") !=
            NULL,
        "output: %s", out);
    const char *args4[] = {"topics", "frobnicate", NULL};
    CHECK_EQ_INT(run_cmd(args4, out, sizeof out), 2);
}
