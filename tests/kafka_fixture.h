/*
 * kafka_fixture.h: real Apache Kafka for tests. Starts a single KRaft node (broker and
 * controller in one JVM) or a cluster of up to AL_TEST_KAFKA_MAX_NODES such nodes with a
 * controller quorum of all of them, on free loopback ports, each with its own log directory
 * under one scratch directory, and stops it leaving nothing behind.
 *
 *     al_test_kafka k;
 *     REQUIRE(al_test_kafka_start(&k, 3, NULL) == 0);    // extra server.properties lines: {"k=v",NULL}
 *     ... k.bootstrap ...
 *     al_test_kafka_kill(&k, i);                         // kill -9 node i (0-based)
 *     al_test_kafka_restart(&k, i, 60);                  // same ports, same log dirs
 *     al_test_kafka_stop(&k);                            // SIGTERM, 60 s, SIGKILL; removes the dirs
 *
 * The broker is the pinned release scripts/setup.sh fetched (tests/kafka/pom.xml) into
 * $ARCLIGHT_TEST_KAFKA_LIBS (set by ctest; default build-kafka/libs), run with `java` from
 * $JAVA_HOME or PATH. Each node is a child of the test that dies with it
 * (PR_SET_PDEATHSIG) in its own process group; an atexit hook stops nodes a failing test
 * left running. Node i's output goes to ROOT/node-i/broker.log, whose tail is printed when
 * a node fails to come up.
 *
 * JVM flags: a small heap (-Xmx256m), the serial collector, and the client JIT only
 * (-XX:TieredStopAtLevel=1), which starts a node in about 4.5 s on two shared cores instead
 * of about 6; $ARCLIGHT_TEST_KAFKA_JVM_OPTS replaces them (benchmarks want the full JIT). The
 * broker settings are a test cluster's: small internal topics (4 partitions, replicated
 * min(N, 3) times), no initial rebalance delay, no automatic topic creation, few threads.
 *
 * Needs librdkafka (metadata and admin requests); header-only, static functions.
 */
#ifndef ARCLIGHT_TEST_KAFKA_FIXTURE_H
#define ARCLIGHT_TEST_KAFKA_FIXTURE_H

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <librdkafka/rdkafka.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define AL_TEST_KAFKA_MAX_NODES 5

typedef struct al_test_kafka_node {
    pid_t pid;          /* 0 while not running */
    int port;           /* the broker listener (clients) */
    int controller_port; /* the controller listener (quorum) */
    char dir[512];      /* ROOT/node-I: server.properties, broker.log, data/ */
} al_test_kafka_node;

typedef struct al_test_kafka {
    int n; /* nodes; 0 when not started */
    al_test_kafka_node node[AL_TEST_KAFKA_MAX_NODES];
    char root[256];
    char bootstrap[500]; /* "127.0.0.1:P1,127.0.0.1:P2,..." */
    char cluster_id[32];
    double start_s; /* seconds the last al_test_kafka_start took */
} al_test_kafka;

/* Every started cluster, for the atexit hook. */
static al_test_kafka *al_test_kafka_live[8];

static inline double al_test_kafka_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static inline const char *al_test_kafka_libs(void)
{
    const char *l = getenv("ARCLIGHT_TEST_KAFKA_LIBS");
    return l && *l ? l : "build-kafka/libs";
}

/* 1 when the broker's jars are where the fixture looks for them. */
static inline int al_test_kafka_available(void)
{
    char path[600];
    struct stat st;
    snprintf(path, sizeof path, "%s/.complete", al_test_kafka_libs());
    return stat(path, &st) == 0;
}

/* A free loopback TCP port (bound to port 0 and released; the kernel does not hand it out
 * again at once). -1 on failure. */
static inline int al_test_kafka_free_port(void)
{
    struct sockaddr_in sin = {.sin_family = AF_INET};
    socklen_t len = sizeof sin;
    int fd = socket(AF_INET, SOCK_STREAM, 0), port = -1;
    if (fd < 0) return -1;
    inet_pton(AF_INET, "127.0.0.1", &sin.sin_addr);
    if (bind(fd, (struct sockaddr *)&sin, sizeof sin) == 0 &&
        getsockname(fd, (struct sockaddr *)&sin, &len) == 0)
        port = ntohs(sin.sin_port);
    close(fd);
    return port;
}

/* rm -rf dir (no symlinks are followed: lstat). */
static inline void al_test_kafka_rmtree(const char *dir)
{
    struct stat st;
    if (!dir[0] || lstat(dir, &st) != 0) return;
    if (S_ISDIR(st.st_mode)) {
        DIR *d = opendir(dir);
        if (d) {
            struct dirent *e;
            char path[1280];
            while ((e = readdir(d))) {
                if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
                snprintf(path, sizeof path, "%.1000s/%.255s", dir, e->d_name);
                al_test_kafka_rmtree(path);
            }
            closedir(d);
        }
        rmdir(dir);
    } else {
        unlink(dir);
    }
}

/* Prints the last lines of node i's log to stderr (why it did not come up). */
static inline void al_test_kafka_log_tail(const al_test_kafka *k, int i)
{
    char path[600], buf[4096];
    snprintf(path, sizeof path, "%s/broker.log", k->node[i].dir);
    FILE *f = fopen(path, "r");
    if (!f) return;
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, sz > (long)sizeof buf - 1 ? sz - (long)sizeof buf + 1 : 0, SEEK_SET);
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = '\0';
    fclose(f);
    fprintf(stderr, "kafka fixture: last lines of %s:\n%s\n", path, buf);
}

/* Runs the JVM with the broker's class path (every jar of the libs directory): argv_tail
 * after the class path. Returns the
 * child's pid (stdout/stderr to log_path), -1 on failure. The child dies with the test. */
static inline pid_t al_test_kafka_java(const char *log_path, const char *const *argv_tail)
{
    const char *argv[64];
    char java[600], cp[600], opts_buf[1024];
    int argc = 0;
    const char *jh = getenv("JAVA_HOME");
    if (jh && *jh)
        snprintf(java, sizeof java, "%s/bin/java", jh);
    else
        snprintf(java, sizeof java, "java");
    snprintf(cp, sizeof cp, "%s/*", al_test_kafka_libs());
    argv[argc++] = java;
    const char *opts = getenv("ARCLIGHT_TEST_KAFKA_JVM_OPTS");
    if (!opts || !*opts)
        opts = "-Xms64m -Xmx256m -XX:+UseSerialGC -XX:TieredStopAtLevel=1 -XX:-UsePerfData "
               "-Djava.awt.headless=true";
    snprintf(opts_buf, sizeof opts_buf, "%s", opts);
    for (char *save = NULL, *t = strtok_r(opts_buf, " ", &save); t && argc < 40;
         t = strtok_r(NULL, " ", &save))
        argv[argc++] = t;
    char log4j[700];
    const char *src = getenv("ARCLIGHT_SOURCE_DIR");
    snprintf(log4j, sizeof log4j, "-Dlog4j2.configurationFile=%s/tests/kafka/log4j2.properties",
             src && *src ? src : ".");
    argv[argc++] = log4j;
    argv[argc++] = "-cp";
    argv[argc++] = cp;
    for (int i = 0; argv_tail[i] && argc < 63; i++)
        argv[argc++] = argv_tail[i];
    argv[argc] = NULL;
    fflush(stdout);
    fflush(stderr);
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent) _exit(127);
        setpgid(0, 0);
        int fd = open(log_path, O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (fd >= 0) {
            dup2(fd, STDOUT_FILENO);
            dup2(fd, STDERR_FILENO);
            close(fd);
        }
        int devnull = open("/dev/null", O_RDONLY);
        if (devnull >= 0) dup2(devnull, STDIN_FILENO);
        execvp(argv[0], (char *const *)argv);
        fprintf(stderr, "kafka fixture: cannot run %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    return pid;
}

/* At exit: every node still running gets SIGTERM, up to 10 s together, then SIGKILL. */
static inline void al_test_kafka_atexit(void)
{
    for (size_t c = 0; c < sizeof al_test_kafka_live / sizeof al_test_kafka_live[0]; c++) {
        al_test_kafka *k = al_test_kafka_live[c];
        if (!k) continue;
        for (int i = 0; i < k->n; i++)
            if (k->node[i].pid > 0) kill(k->node[i].pid, SIGTERM);
        double t0 = al_test_kafka_now();
        for (int i = 0; i < k->n; i++) {
            while (k->node[i].pid > 0 && waitpid(k->node[i].pid, NULL, WNOHANG) != k->node[i].pid &&
                   al_test_kafka_now() - t0 < 10)
                usleep(20000);
            if (k->node[i].pid > 0 && waitpid(k->node[i].pid, NULL, WNOHANG) == 0) {
                kill(k->node[i].pid, SIGKILL);
                waitpid(k->node[i].pid, NULL, 0);
            }
            k->node[i].pid = 0;
        }
        al_test_kafka_rmtree(k->root);
        al_test_kafka_live[c] = NULL;
    }
}

static inline void al_test_kafka_track(al_test_kafka *k, int add)
{
    static int registered;
    if (!registered) {
        atexit(al_test_kafka_atexit);
        registered = 1;
    }
    for (size_t c = 0; c < sizeof al_test_kafka_live / sizeof al_test_kafka_live[0]; c++) {
        if (add && !al_test_kafka_live[c]) {
            al_test_kafka_live[c] = k;
            return;
        }
        if (!add && al_test_kafka_live[c] == k) {
            al_test_kafka_live[c] = NULL;
            return;
        }
    }
}

/* A Kafka Uuid (16 random bytes, base64url without padding) for the cluster id. */
static inline void al_test_kafka_uuid(char out[32])
{
    static const char b64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    unsigned char r[18] = {0};
    if (getrandom(r, 16, 0) != 16)
        for (int i = 0; i < 16; i++) r[i] = (unsigned char)(rand() & 0xff);
    r[6] = (unsigned char)((r[6] & 0x0f) | 0x40); /* a version-4 UUID, as Kafka makes them */
    r[8] = (unsigned char)((r[8] & 0x3f) | 0x80);
    int o = 0;
    for (int i = 0; i < 18 && o < 22; i += 3) {
        unsigned v = ((unsigned)r[i] << 16) | ((unsigned)r[i + 1] << 8) | r[i + 2];
        for (int s = 18; s >= 0 && o < 22; s -= 6) out[o++] = b64[(v >> s) & 63];
    }
    out[o] = '\0';
}

/* Writes node i's server.properties. */
static inline int al_test_kafka_write_props(const al_test_kafka *k, int i, const char *const *extra)
{
    char path[600], voters[512] = "";
    size_t off = 0;
    for (int j = 0; j < k->n; j++)
        off += (size_t)snprintf(voters + off, sizeof voters - off, "%s%d@127.0.0.1:%d",
                                j ? "," : "", j + 1, k->node[j].controller_port);
    snprintf(path, sizeof path, "%s/server.properties", k->node[i].dir);
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    int rf = k->n < 3 ? k->n : 3, isr = k->n < 2 ? 1 : 2;
    fprintf(f,
            "process.roles=broker,controller\n"
            "node.id=%d\n"
            "controller.quorum.voters=%s\n"
            "listeners=PLAINTEXT://127.0.0.1:%d,CONTROLLER://127.0.0.1:%d\n"
            "advertised.listeners=PLAINTEXT://127.0.0.1:%d\n"
            "controller.listener.names=CONTROLLER\n"
            "inter.broker.listener.name=PLAINTEXT\n"
            "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT\n"
            "log.dirs=%s/data\n"
            "auto.create.topics.enable=false\n"
            "unclean.leader.election.enable=false\n"
            "offsets.topic.replication.factor=%d\n"
            "offsets.topic.num.partitions=4\n"
            "transaction.state.log.replication.factor=%d\n"
            "transaction.state.log.min.isr=%d\n"
            "transaction.state.log.num.partitions=4\n"
            "group.initial.rebalance.delay.ms=0\n"
            "group.min.session.timeout.ms=1000\n"
            "message.max.bytes=10485760\n"
            "replica.fetch.max.bytes=10485760\n"
            "num.network.threads=2\n"
            "num.io.threads=2\n"
            "num.recovery.threads.per.data.dir=1\n"
            "background.threads=2\n"
            "log.cleaner.threads=1\n"
            "log.cleaner.dedupe.buffer.size=8388608\n"
            "log.index.size.max.bytes=1048576\n"
            "log.segment.bytes=67108864\n"
            "controlled.shutdown.enable=true\n"
            "broker.heartbeat.interval.ms=500\n"
            "share.coordinator.state.topic.replication.factor=%d\n"
            "share.coordinator.state.topic.min.isr=%d\n",
            i + 1, voters, k->node[i].port, k->node[i].controller_port, k->node[i].port,
            k->node[i].dir, rf, rf, isr, rf, isr);
    for (int e = 0; extra && extra[e]; e++)
        fprintf(f, "%s\n", extra[e]);
    return fclose(f) == 0 ? 0 : -1;
}

/* A metadata-only client (no idempotence, quiet logs). NULL on failure. */
static inline rd_kafka_t *al_test_kafka_client(const char *bootstrap)
{
    char err[512];
    rd_kafka_conf_t *c = rd_kafka_conf_new();
    if (rd_kafka_conf_set(c, "bootstrap.servers", bootstrap, err, sizeof err) ||
        rd_kafka_conf_set(c, "log_level", "0", err, sizeof err) ||
        rd_kafka_conf_set(c, "reconnect.backoff.max.ms", "200", err, sizeof err) ||
        rd_kafka_conf_set(c, "client.id", "kafka-fixture", err, sizeof err)) {
        rd_kafka_conf_destroy(c);
        return NULL;
    }
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_PRODUCER, c, err, sizeof err);
    if (!rk) rd_kafka_conf_destroy(c);
    return rk;
}

/* Waits until every running node is in the cluster's metadata and a controller is known.
 * 0, or -1 after timeout_s (with the reason on stderr). */
static inline int al_test_kafka_wait_ready(al_test_kafka *k, double timeout_s)
{
    int want = 0;
    for (int i = 0; i < k->n; i++)
        if (k->node[i].pid > 0) want++;
    rd_kafka_t *rk = al_test_kafka_client(k->bootstrap);
    if (!rk) return -1;
    double t0 = al_test_kafka_now();
    int seen = -1;
    while (al_test_kafka_now() - t0 < timeout_s) {
        for (int i = 0; i < k->n; i++) {
            int st;
            if (k->node[i].pid > 0 && waitpid(k->node[i].pid, &st, WNOHANG) == k->node[i].pid) {
                fprintf(stderr, "kafka fixture: node %d exited during start (status %d)\n", i,
                        st);
                k->node[i].pid = 0;
                al_test_kafka_log_tail(k, i);
                rd_kafka_destroy(rk);
                return -1;
            }
        }
        const struct rd_kafka_metadata *md;
        if (rd_kafka_metadata(rk, 0, NULL, &md, 1000) == RD_KAFKA_RESP_ERR_NO_ERROR) {
            seen = md->broker_cnt;
            rd_kafka_metadata_destroy(md);
            if (seen >= want && rd_kafka_controllerid(rk, 1000) >= 0) {
                rd_kafka_destroy(rk);
                return 0;
            }
        }
        usleep(100000);
    }
    rd_kafka_destroy(rk);
    fprintf(stderr, "kafka fixture: %d of %d nodes serve metadata after %.0f s\n",
            seen < 0 ? 0 : seen, want, timeout_s);
    for (int i = 0; i < k->n; i++) al_test_kafka_log_tail(k, i);
    return -1;
}

/* Starts node i (already formatted). 0 or -1. */
static inline int al_test_kafka_spawn(al_test_kafka *k, int i)
{
    char props[600], log[600];
    snprintf(props, sizeof props, "%s/server.properties", k->node[i].dir);
    snprintf(log, sizeof log, "%s/broker.log", k->node[i].dir);
    const char *tail[] = {"kafka.Kafka", props, NULL};
    k->node[i].pid = al_test_kafka_java(log, tail);
    return k->node[i].pid > 0 ? 0 : -1;
}

/* Removes scratch directories of earlier test processes that are gone (a test killed before
 * its atexit hook ran): arclight-kafka-PID-* whose PID no longer exists. Their nodes died
 * with them (PR_SET_PDEATHSIG). */
static inline void al_test_kafka_sweep(const char *tmp)
{
    DIR *d = opendir(tmp);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        int pid;
        char path[700];
        if (sscanf(e->d_name, "arclight-kafka-%d-", &pid) != 1 || pid <= 0) continue;
        if (kill(pid, 0) == 0 || errno != ESRCH) continue;
        snprintf(path, sizeof path, "%s/%s", tmp, e->d_name);
        al_test_kafka_rmtree(path);
    }
    closedir(d);
}

/* Starts n nodes (1..AL_TEST_KAFKA_MAX_NODES) and waits until all of them serve metadata.
 * extra: more server.properties lines ("key=value", NULL-terminated, may be NULL), written
 * after the fixture's own (so they win). 0, or -1 with the reason on stderr (nothing is
 * left running then). */
static inline int al_test_kafka_start_once(al_test_kafka *k, int n, const char *const *extra)
{
    memset(k, 0, sizeof *k);
    if (n < 1 || n > AL_TEST_KAFKA_MAX_NODES) {
        fprintf(stderr, "kafka fixture: %d nodes: want 1..%d\n", n, AL_TEST_KAFKA_MAX_NODES);
        return -1;
    }
    if (!al_test_kafka_available()) {
        fprintf(stderr,
                "kafka fixture: no Kafka broker in %s (ARCLIGHT_TEST_KAFKA_LIBS); run "
                "`bash scripts/setup.sh`, which fetches it with Maven (tests/kafka/pom.xml)\n",
                al_test_kafka_libs());
        return -1;
    }
    double t0 = al_test_kafka_now();
    const char *tmp = getenv("TMPDIR");
    al_test_kafka_sweep(tmp && *tmp ? tmp : "/tmp");
    snprintf(k->root, sizeof k->root, "%s/arclight-kafka-%d-XXXXXX", tmp && *tmp ? tmp : "/tmp",
             (int)getpid());
    if (!mkdtemp(k->root)) {
        fprintf(stderr, "kafka fixture: mkdtemp %s: %s\n", k->root, strerror(errno));
        k->root[0] = '\0';
        return -1;
    }
    k->n = n;
    al_test_kafka_track(k, 1);
    do /* one that starts with '-' reads as an option to the storage tool */
        al_test_kafka_uuid(k->cluster_id);
    while (k->cluster_id[0] == '-');
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        al_test_kafka_node *nd = &k->node[i];
        nd->port = al_test_kafka_free_port();
        nd->controller_port = al_test_kafka_free_port();
        snprintf(nd->dir, sizeof nd->dir, "%s/node-%d", k->root, i);
        if (nd->port < 0 || nd->controller_port < 0 || mkdir(nd->dir, 0755) != 0) goto fail;
        off += (size_t)snprintf(k->bootstrap + off, sizeof k->bootstrap - off, "%s127.0.0.1:%d",
                                i ? "," : "", nd->port);
    }
    /* Format every node's storage (one JVM each, side by side), then start them. */
    pid_t fmt[AL_TEST_KAFKA_MAX_NODES];
    for (int i = 0; i < n; i++) {
        char props[600], log[600];
        if (al_test_kafka_write_props(k, i, extra) != 0) goto fail;
        snprintf(props, sizeof props, "%s/server.properties", k->node[i].dir);
        snprintf(log, sizeof log, "%s/broker.log", k->node[i].dir);
        const char *tail[] = {"kafka.tools.StorageTool", "format", "-t", k->cluster_id, "-c",
                              props, NULL};
        fmt[i] = al_test_kafka_java(log, tail);
        if (fmt[i] < 0) goto fail;
    }
    for (int i = 0; i < n; i++) {
        int st = 0;
        waitpid(fmt[i], &st, 0);
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
            fprintf(stderr, "kafka fixture: formatting node %d's storage failed\n", i);
            al_test_kafka_log_tail(k, i);
            goto fail;
        }
    }
    for (int i = 0; i < n; i++)
        if (al_test_kafka_spawn(k, i) != 0) goto fail;
    if (al_test_kafka_wait_ready(k, 120) != 0) goto fail;
    k->start_s = al_test_kafka_now() - t0;
    return 0;
fail:
    for (int i = 0; i < k->n; i++)
        if (k->node[i].pid > 0) {
            kill(k->node[i].pid, SIGKILL);
            waitpid(k->node[i].pid, NULL, 0);
            k->node[i].pid = 0;
        }
    al_test_kafka_rmtree(k->root);
    al_test_kafka_track(k, 0);
    k->n = 0;
    return -1;
}

/* A port the fixture picked (bound to 0 and released) may be taken by another process's
 * connection before the node binds it; the node then exits at start. So a start that fails
 * after the broker was found is tried again, with new ports, up to three times. */
static inline int al_test_kafka_start(al_test_kafka *k, int n, const char *const *extra)
{
    int rc = -1;
    for (int attempt = 0; attempt < 3 && rc != 0; attempt++) {
        rc = al_test_kafka_start_once(k, n, extra);
        if (rc != 0 && (n < 1 || n > AL_TEST_KAFKA_MAX_NODES || !al_test_kafka_available()))
            break;
        if (rc != 0 && attempt < 2) fprintf(stderr, "kafka fixture: starting again\n");
    }
    return rc;
}

/* kill -9 of node i; returns once it is reaped. */
static inline void al_test_kafka_kill(al_test_kafka *k, int i)
{
    if (i < 0 || i >= k->n || k->node[i].pid <= 0) return;
    kill(k->node[i].pid, SIGKILL);
    waitpid(k->node[i].pid, NULL, 0);
    k->node[i].pid = 0;
}

/* SIGTERM to node i (a controlled shutdown); waits up to 30 s, then SIGKILL. */
static inline void al_test_kafka_terminate(al_test_kafka *k, int i)
{
    if (i < 0 || i >= k->n || k->node[i].pid <= 0) return;
    kill(k->node[i].pid, SIGTERM);
    for (int w = 0; w < 600; w++) {
        if (waitpid(k->node[i].pid, NULL, WNOHANG) == k->node[i].pid) {
            k->node[i].pid = 0;
            return;
        }
        usleep(50000);
    }
    al_test_kafka_kill(k, i);
}

/* Starts node i again (same ports and log directory) and waits up to timeout_s until every
 * running node serves metadata. 0 or -1. */
static inline int al_test_kafka_restart(al_test_kafka *k, int i, double timeout_s)
{
    if (i < 0 || i >= k->n) return -1;
    if (k->node[i].pid <= 0 && al_test_kafka_spawn(k, i) != 0) return -1;
    return al_test_kafka_wait_ready(k, timeout_s);
}

/* A node's controlled shutdown waits for the quorum to move its leaderships away, a few
 * heartbeat rounds (every 500 ms here); on two cores shared with the rest of the suite a
 * 3-node stop can outlast 20 s. */
#define AL_TEST_KAFKA_STOP_S 60

/* Stops every node (SIGTERM together, up to AL_TEST_KAFKA_STOP_S, then SIGKILL) and removes
 * the scratch directory. Returns 0 when every node exited on its own with status 0 (SIGTERM is a clean
 * stop for Kafka: 143 counts as clean too), -1 otherwise. */
static inline int al_test_kafka_stop(al_test_kafka *k)
{
    int rc = 0;
    if (k->n == 0) return -1;
    for (int i = 0; i < k->n; i++)
        if (k->node[i].pid > 0) kill(k->node[i].pid, SIGTERM);
    double t0 = al_test_kafka_now();
    for (;;) {
        int left = 0;
        for (int i = 0; i < k->n; i++) {
            int st;
            if (k->node[i].pid <= 0) continue;
            if (waitpid(k->node[i].pid, &st, WNOHANG) == k->node[i].pid) {
                k->node[i].pid = 0;
                if (!(WIFEXITED(st) && (WEXITSTATUS(st) == 0 || WEXITSTATUS(st) == 143)) &&
                    !(WIFSIGNALED(st) && WTERMSIG(st) == SIGTERM)) {
                    fprintf(stderr, "kafka fixture: node %d stopped unclean (%s %d) after %.1f s\n",
                            i + 1, WIFEXITED(st) ? "exit" : "signal",
                            WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st),
                            al_test_kafka_now() - t0);
                    rc = -1;
                }
            } else {
                left++;
            }
        }
        if (!left) break;
        if (al_test_kafka_now() - t0 > AL_TEST_KAFKA_STOP_S) {
            fprintf(stderr, "kafka fixture: %d of %d nodes still up %d s after SIGTERM\n", left,
                    k->n, AL_TEST_KAFKA_STOP_S);
            for (int i = 0; i < k->n; i++) al_test_kafka_kill(k, i);
            rc = -1;
            break;
        }
        usleep(50000);
    }
    al_test_kafka_rmtree(k->root);
    al_test_kafka_track(k, 0);
    k->n = 0;
    return rc;
}

/* Node index (0-based) leading topic/partition, -1 when unknown (no leader, or no such
 * topic). */
static inline int al_test_kafka_leader(al_test_kafka *k, const char *topic, int32_t partition)
{
    rd_kafka_t *rk = al_test_kafka_client(k->bootstrap);
    if (!rk) return -1;
    rd_kafka_topic_t *rkt = rd_kafka_topic_new(rk, topic, NULL);
    const struct rd_kafka_metadata *md;
    int leader = -1;
    if (rd_kafka_metadata(rk, 0, rkt, &md, 5000) == RD_KAFKA_RESP_ERR_NO_ERROR) {
        if (md->topic_cnt == 1 && !md->topics[0].err)
            for (int p = 0; p < md->topics[0].partition_cnt; p++)
                if (md->topics[0].partitions[p].id == partition &&
                    md->topics[0].partitions[p].leader > 0)
                    leader = md->topics[0].partitions[p].leader - 1;
        rd_kafka_metadata_destroy(md);
    }
    rd_kafka_topic_destroy(rkt);
    rd_kafka_destroy(rk);
    return leader;
}

/* Waits until each of the topics (NULL-terminated) has a leader for every partition, as
 * seen by a fresh client. 0, or -1 after timeout_s. */
static inline int al_test_kafka_wait_leaders(const char *bootstrap, const char *const *topics,
                                             double timeout_s)
{
    rd_kafka_t *rk = al_test_kafka_client(bootstrap);
    if (!rk) return -1;
    double t0 = al_test_kafka_now();
    int ok = 0;
    while (!ok && al_test_kafka_now() - t0 < timeout_s) {
        const struct rd_kafka_metadata *md;
        ok = 1;
        if (rd_kafka_metadata(rk, 1, NULL, &md, 2000) != RD_KAFKA_RESP_ERR_NO_ERROR) {
            ok = 0;
        } else {
            for (int t = 0; topics[t] && ok; t++) {
                int found = 0;
                for (int i = 0; i < md->topic_cnt; i++) {
                    if (strcmp(md->topics[i].topic, topics[t])) continue;
                    found = !md->topics[i].err && md->topics[i].partition_cnt > 0;
                    for (int p = 0; found && p < md->topics[i].partition_cnt; p++)
                        if (md->topics[i].partitions[p].leader < 0 ||
                            md->topics[i].partitions[p].err)
                            found = 0;
                }
                if (!found) ok = 0;
            }
            rd_kafka_metadata_destroy(md);
        }
        if (!ok) usleep(100000);
    }
    rd_kafka_destroy(rk);
    return ok ? 0 : -1;
}

/* Creates topic with partitions and replication (capped at the node count) and topic
 * settings (configs: "key=value" strings, NULL-terminated, may be NULL) through the Admin
 * API, and waits for its leaders. An existing topic is fine. 0 or -1 (reason in err). */
static inline int al_test_kafka_create_topic(al_test_kafka *k, const char *topic, int partitions,
                                             int replication, const char *const *configs,
                                             char *err, size_t errlen)
{
    char es[512];
    if (replication > k->n) replication = k->n;
    rd_kafka_t *rk = al_test_kafka_client(k->bootstrap);
    if (!rk) return snprintf(err, errlen, "no admin client"), -1;
    rd_kafka_NewTopic_t *nt = rd_kafka_NewTopic_new(topic, partitions, replication, es, sizeof es);
    if (!nt) {
        snprintf(err, errlen, "%.200s", es);
        rd_kafka_destroy(rk);
        return -1;
    }
    for (int i = 0; configs && configs[i]; i++) {
        char key[128];
        const char *eq = strchr(configs[i], '=');
        if (!eq || eq - configs[i] >= (int)sizeof key) continue;
        snprintf(key, sizeof key, "%.*s", (int)(eq - configs[i]), configs[i]);
        rd_kafka_NewTopic_set_config(nt, key, eq + 1);
    }
    rd_kafka_queue_t *q = rd_kafka_queue_new(rk);
    rd_kafka_CreateTopics(rk, &nt, 1, NULL, q);
    rd_kafka_event_t *ev = rd_kafka_queue_poll(q, 30000);
    int rc = -1;
    if (!ev) {
        snprintf(err, errlen, "CreateTopics: no answer");
    } else if (rd_kafka_event_error(ev)) {
        snprintf(err, errlen, "CreateTopics: %s", rd_kafka_event_error_string(ev));
    } else {
        size_t cnt;
        const rd_kafka_topic_result_t **res =
            rd_kafka_CreateTopics_result_topics(rd_kafka_event_CreateTopics_result(ev), &cnt);
        rd_kafka_resp_err_t e = cnt ? rd_kafka_topic_result_error(res[0]) : RD_KAFKA_RESP_ERR__FAIL;
        if (e && e != RD_KAFKA_RESP_ERR_TOPIC_ALREADY_EXISTS)
            snprintf(err, errlen, "CreateTopics %.200s: %s", topic, rd_kafka_err2str(e));
        else
            rc = 0;
    }
    if (ev) rd_kafka_event_destroy(ev);
    rd_kafka_queue_destroy(q);
    rd_kafka_NewTopic_destroy(nt);
    rd_kafka_destroy(rk);
    if (rc == 0) {
        const char *one[] = {topic, NULL};
        if (al_test_kafka_wait_leaders(k->bootstrap, one, 30) != 0) {
            snprintf(err, errlen, "%s: no leaders after 30 s", topic);
            rc = -1;
        }
    }
    return rc;
}

/* Deletes every topic that does not start with '_' and every consumer group, and waits
 * until the metadata shows none of those topics: a clean cluster for the next test case
 * without another JVM start. 0, or -1 with the reason on stderr. */
static inline int al_test_kafka_reset(al_test_kafka *k)
{
    rd_kafka_t *rk = al_test_kafka_client(k->bootstrap);
    if (!rk) return -1;
    int rc = 0;
    rd_kafka_queue_t *q = rd_kafka_queue_new(rk);
    /* groups first: a group holds offsets of the topics */
    rd_kafka_ListConsumerGroups(rk, NULL, q);
    rd_kafka_event_t *ev = rd_kafka_queue_poll(q, 15000);
    if (ev && !rd_kafka_event_error(ev)) {
        size_t cnt;
        const rd_kafka_ConsumerGroupListing_t **gl = rd_kafka_ListConsumerGroups_result_valid(
            rd_kafka_event_ListConsumerGroups_result(ev), &cnt);
        if (cnt) {
            rd_kafka_DeleteGroup_t **dg = calloc(cnt, sizeof *dg);
            for (size_t i = 0; i < cnt; i++)
                dg[i] = rd_kafka_DeleteGroup_new(rd_kafka_ConsumerGroupListing_group_id(gl[i]));
            rd_kafka_DeleteGroups(rk, dg, cnt, NULL, q);
            rd_kafka_event_t *dev = rd_kafka_queue_poll(q, 15000);
            if (dev) rd_kafka_event_destroy(dev);
            rd_kafka_DeleteGroup_destroy_array(dg, cnt);
            free(dg);
        }
    }
    if (ev) rd_kafka_event_destroy(ev);
    const struct rd_kafka_metadata *md;
    if (rd_kafka_metadata(rk, 1, NULL, &md, 10000) != RD_KAFKA_RESP_ERR_NO_ERROR) {
        fprintf(stderr, "kafka fixture: reset: no metadata\n");
        rc = -1;
        goto out;
    }
    size_t nt = 0;
    rd_kafka_DeleteTopic_t **dt = calloc((size_t)md->topic_cnt + 1, sizeof *dt);
    for (int i = 0; i < md->topic_cnt; i++)
        if (md->topics[i].topic[0] != '_') dt[nt++] = rd_kafka_DeleteTopic_new(md->topics[i].topic);
    rd_kafka_metadata_destroy(md);
    if (nt) {
        rd_kafka_DeleteTopics(rk, dt, nt, NULL, q);
        ev = rd_kafka_queue_poll(q, 30000);
        if (!ev || rd_kafka_event_error(ev)) {
            fprintf(stderr, "kafka fixture: reset: DeleteTopics: %s\n",
                    ev ? rd_kafka_event_error_string(ev) : "no answer");
            rc = -1;
        }
        if (ev) rd_kafka_event_destroy(ev);
        rd_kafka_DeleteTopic_destroy_array(dt, nt);
    }
    free(dt);
    /* gone from the metadata of every node */
    for (double t0 = al_test_kafka_now(); rc == 0;) {
        int left = 0;
        if (rd_kafka_metadata(rk, 1, NULL, &md, 5000) == RD_KAFKA_RESP_ERR_NO_ERROR) {
            for (int i = 0; i < md->topic_cnt; i++)
                if (md->topics[i].topic[0] != '_' && !md->topics[i].err) left++;
            rd_kafka_metadata_destroy(md);
        } else {
            left = 1;
        }
        if (!left) break;
        if (al_test_kafka_now() - t0 > 30) {
            fprintf(stderr, "kafka fixture: reset: %d topics still there after 30 s\n", left);
            rc = -1;
        }
        usleep(100000);
    }
out:
    rd_kafka_queue_destroy(q);
    rd_kafka_destroy(rk);
    return rc;
}

#endif
