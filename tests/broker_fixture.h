/*
 * broker_fixture.h: a real embedded broker for tests. Starts `$ARCLIGHT_BIN broker --listen
 * 127.0.0.1:0 --control 127.0.0.1:0` as a child process (free ports), reads its bootstrap
 * address (stdout line 1) and control address (line 2), and stops it at the end. Tests talk
 * to it over TCP like any Kafka client.
 *
 *     al_test_broker b;
 *     REQUIRE(al_test_broker_start(&b, NULL) == 0);      // or extra args: {"--brokers","3",NULL}
 *     ... use b.bootstrap ...
 *     al_test_broker_control(&b, "down 1", NULL, 0);     // broker 1 away; "up 1" brings it back
 *     al_test_broker_stop(&b);                           // SIGTERM, reaps; returns exit status
 *
 * The child dies with the test process (PR_SET_PDEATHSIG), and an atexit hook stops brokers a
 * failing test left running. Header-only: include it in one test file (static functions).
 * ARCLIGHT_BIN is set by ctest; outside ctest it falls back to ./build/arclight.
 *
 * With ARCLIGHT_TEST_BROKER=kafka (ctest's NAME_kafka runs of tests registered with KAFKA)
 * the same calls run real Apache Kafka (tests/kafka_fixture.h) instead:
 *   - start: a KRaft cluster of --brokers N nodes (default 1), then `arclight topics create
 *     --topics FILE` (--topics, else broker-config/topics.conf), as a user would set one up.
 *     The cluster is started once per test process: a later start with the same node count
 *     deletes every topic and consumer group and creates the topics again (a JVM start costs
 *     seconds; a reset well under one). Other broker flags are refused.
 *   - stop: returns 0 and leaves the cluster to the next start; it stops at exit.
 *   - control: "create NAME PARTITIONS [REPLICATION [key=value...]]" through the Admin API
 *     (waiting for the leaders; the topic settings are real Kafka's alone), "down ID" kill -9s node ID, "up ID" starts it again and waits until it serves,
 *     "ping". "error ..." and "rtt ..." are the mock's alone: -1 with the reply saying so;
 *     al_test_broker_is_kafka() lets a test leave out what needs them.
 */
#ifndef ARCLIGHT_BROKER_FIXTURE_H
#define ARCLIGHT_BROKER_FIXTURE_H

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <fcntl.h>
#include <librdkafka/rdkafka.h>
#include <unistd.h>

#include "kafka_fixture.h"

typedef struct al_test_broker {
    pid_t pid;           /* 0 when not running (real Kafka: node 1's JVM) */
    char bootstrap[512]; /* "127.0.0.1:PORT[,127.0.0.1:PORT...]" */
    char control[64];    /* "127.0.0.1:PORT"; "kafka" for real Kafka */
    int kafka;           /* 1: real Kafka (ARCLIGHT_TEST_BROKER=kafka) */
} al_test_broker;

/* 1 when this test process runs against real Kafka (ARCLIGHT_TEST_BROKER=kafka). */
static inline int al_test_broker_kafka_mode(void)
{
    const char *m = getenv("ARCLIGHT_TEST_BROKER");
    return m && !strcmp(m, "kafka");
}

static inline int al_test_broker_is_kafka(const al_test_broker *b)
{
    return b->kafka;
}

/* The real-Kafka cluster of this test process, kept from one start to the next. */
static al_test_kafka al_test_broker_cluster;

/* What the embedded broker does that the tests lean on: a topic a producer names is created
 * (with the mock's default of 4 partitions). Production clusters have this off
 * (broker-config/server.properties); the stages' own topics come from topics create. */
static const char *const al_test_broker_kafka_props[] = {"auto.create.topics.enable=true",
                                                         "num.partitions=4", NULL};

/* For a test case that needs what only the embedded broker has (injected protocol errors,
 * added latency): on real Kafka it says so and passes without running. */
#define AL_TEST_EMBEDDED_ONLY(why)                                                                 \
    do {                                                                                           \
        if (al_test_broker_kafka_mode()) {                                                         \
            printf("  skipped on real Kafka: %s\n", why);                                          \
            return;                                                                                \
        }                                                                                          \
    } while (0)

#define AL_TEST_BROKER_MAX 8
static pid_t al_test_broker_pids[AL_TEST_BROKER_MAX];

static inline const char *al_test_bin(void)
{
    const char *b = getenv("ARCLIGHT_BIN");
    return b && *b ? b : "./build/arclight";
}

static inline void al_test_broker_atexit(void)
{
    for (int i = 0; i < AL_TEST_BROKER_MAX; i++)
        if (al_test_broker_pids[i] > 0) {
            kill(al_test_broker_pids[i], SIGKILL);
            waitpid(al_test_broker_pids[i], NULL, 0);
            al_test_broker_pids[i] = 0;
        }
}

static inline void al_test_broker_track(pid_t pid, int add)
{
    static int registered;
    if (!registered) {
        atexit(al_test_broker_atexit);
        registered = 1;
    }
    for (int i = 0; i < AL_TEST_BROKER_MAX; i++) {
        if (add && al_test_broker_pids[i] == 0) {
            al_test_broker_pids[i] = pid;
            return;
        }
        if (!add && al_test_broker_pids[i] == pid) {
            al_test_broker_pids[i] = 0;
            return;
        }
    }
}

/* Reads one line from fd within the deadline (ms since epoch-ish clock). 0 or -1. */
static inline int al_test_broker_readline(int fd, char *buf, size_t buflen, int timeout_ms)
{
    size_t n = 0;
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    while (n + 1 < buflen) {
        clock_gettime(CLOCK_MONOTONIC, &t);
        long el = (t.tv_sec - t0.tv_sec) * 1000 + (t.tv_nsec - t0.tv_nsec) / 1000000;
        if (el >= timeout_ms) return -1;
        struct pollfd pf = {.fd = fd, .events = POLLIN};
        int r = poll(&pf, 1, (int)(timeout_ms - el));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return -1;
        char c;
        ssize_t got = read(fd, &c, 1);
        if (got <= 0) return -1;
        if (c == '\n') break;
        buf[n++] = c;
    }
    buf[n] = '\0';
    return 0;
}

/* Starts a broker with `--listen 127.0.0.1:0 --control 127.0.0.1:0 --log-level warn` plus
 * extra (NULL-terminated, may be NULL; later flags override earlier ones). Waits up to 60 s
 * for its addresses. 0, or -1 with the reason on stderr. */
static inline int al_test_broker_start_kafka(al_test_broker *b, const char *const *extra);

static inline int al_test_broker_start(al_test_broker *b, const char *const *extra)
{
    const char *argv[64];
    int argc = 0, pfd[2];
    memset(b, 0, sizeof *b);
    if (al_test_broker_kafka_mode()) return al_test_broker_start_kafka(b, extra);
    argv[argc++] = al_test_bin();
    argv[argc++] = "broker";
    argv[argc++] = "--listen";
    argv[argc++] = "127.0.0.1:0";
    argv[argc++] = "--control";
    argv[argc++] = "127.0.0.1:0";
    argv[argc++] = "--log-level";
    argv[argc++] = "warn";
    for (int i = 0; extra && extra[i] && argc < 63; i++)
        argv[argc++] = extra[i];
    argv[argc] = NULL;
    if (pipe(pfd) != 0) {
        perror("broker fixture: pipe");
        return -1;
    }
    fflush(stdout);
    fflush(stderr);
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) {
        perror("broker fixture: fork");
        close(pfd[0]);
        close(pfd[1]);
        return -1;
    }
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent) _exit(127);
        dup2(pfd[1], STDOUT_FILENO);
        close(pfd[0]);
        close(pfd[1]);
        execv(argv[0], (char *const *)argv);
        fprintf(stderr, "broker fixture: cannot run %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    close(pfd[1]);
    b->pid = pid;
    al_test_broker_track(pid, 1);
    char line[600];
    if (al_test_broker_readline(pfd[0], b->bootstrap, sizeof b->bootstrap, 60000) != 0 ||
        al_test_broker_readline(pfd[0], line, sizeof line, 10000) != 0 ||
        strncmp(line, "control ", 8) != 0) {
        fprintf(stderr, "broker fixture: %s broker printed no bootstrap/control address\n",
                argv[0]);
        close(pfd[0]);
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        al_test_broker_track(pid, 0);
        b->pid = 0;
        return -1;
    }
    snprintf(b->control, sizeof b->control, "%.63s", line + 8);
    close(pfd[0]);
    return 0;
}

/* Sends one control line ("down 1", "up 1", "rtt 1 200", "ping") and reads the reply.
 * Returns 0 when the broker answered "ok...", -1 otherwise (reply holds what it said). */
static inline int al_test_broker_control_kafka(al_test_broker *b, const char *cmd, char *reply,
                                               size_t rlen);

static inline int al_test_broker_control(al_test_broker *b, const char *cmd, char *reply,
                                         size_t rlen)
{
    char buf[256] = "";
    if (b->kafka) return al_test_broker_control_kafka(b, cmd, reply, rlen);
    struct sockaddr_in sin = {.sin_family = AF_INET};
    const char *colon = strrchr(b->control, ':');
    if (!colon) return -1;
    sin.sin_port = htons((uint16_t)atoi(colon + 1));
    inet_pton(AF_INET, "127.0.0.1", &sin.sin_addr);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return -1;
    int rc = -1;
    if (connect(fd, (struct sockaddr *)&sin, sizeof sin) == 0) {
        char line[256];
        snprintf(line, sizeof line, "%s\n", cmd);
        if (write(fd, line, strlen(line)) == (ssize_t)strlen(line) &&
            al_test_broker_readline(fd, buf, sizeof buf, 10000) == 0)
            rc = strncmp(buf, "ok", 2) == 0 ? 0 : -1;
    }
    close(fd);
    if (reply && rlen) snprintf(reply, rlen, "%s", buf);
    return rc;
}

/* Stops the broker: SIGTERM, up to 20 s to exit, then SIGKILL. Returns its exit status
 * (0 for a clean stop), or -1 if it had to be killed or was not running. */
static inline int al_test_broker_stop(al_test_broker *b)
{
    int status = 0;
    if (b->kafka) {
        b->pid = 0;
        return 0;
    }
    if (b->pid <= 0) return -1;
    kill(b->pid, SIGTERM);
    for (int i = 0; i < 400; i++) {
        pid_t r = waitpid(b->pid, &status, WNOHANG);
        if (r == b->pid) {
            al_test_broker_track(b->pid, 0);
            b->pid = 0;
            return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
        }
        usleep(50000);
    }
    kill(b->pid, SIGKILL);
    waitpid(b->pid, NULL, 0);
    al_test_broker_track(b->pid, 0);
    b->pid = 0;
    return -1;
}

/* al_test_broker_start for real Kafka: see the top of this file. */
static inline int al_test_broker_start_kafka(al_test_broker *b, const char *const *extra)
{
    char topics[4096] = "", out[8192];
    int nodes = 1;
    for (int i = 0; extra && extra[i]; i++) {
        if (!strcmp(extra[i], "--brokers") && extra[i + 1]) {
            nodes = atoi(extra[++i]);
        } else if (!strcmp(extra[i], "--topics") && extra[i + 1]) {
            snprintf(topics, sizeof topics, "%s", extra[++i]);
        } else {
            fprintf(stderr, "broker fixture: %s is a flag of the embedded broker; real Kafka "
                            "(ARCLIGHT_TEST_BROKER=kafka) takes --brokers and --topics only\n",
                    extra[i]);
            return -1;
        }
    }
    al_test_kafka *k = &al_test_broker_cluster;
    if (k->n && k->n != nodes) al_test_kafka_stop(k);
    if (k->n) {
        for (int i = 0; i < k->n; i++)
            if (k->node[i].pid <= 0 && al_test_kafka_restart(k, i, 120) != 0) return -1;
        if (al_test_kafka_reset(k) != 0) return -1;
    } else if (al_test_kafka_start(k, nodes, al_test_broker_kafka_props) != 0) {
        return -1;
    } else {
        fprintf(stderr, "broker fixture: Apache Kafka, %d node%s, up in %.1f s at %s\n", nodes,
                nodes == 1 ? "" : "s", k->start_s, k->bootstrap);
    }
    /* the topics, as a user creates them */
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "'%s' topics create --bootstrap '%s'%s%s%s --log-level warn 2>&1",
             al_test_bin(), k->bootstrap, topics[0] ? " --topics '" : "", topics,
             topics[0] ? "'" : "");
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    size_t n = fread(out, 1, sizeof out - 1, p);
    out[n] = '\0';
    int st = pclose(p);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        fprintf(stderr, "broker fixture: %s failed:\n%s\n", cmd, out);
        return -1;
    }
    /* every topic it created has leaders before the test produces to it */
    const char *names[256];
    int nn = 0;
    for (char *save = NULL, *line = strtok_r(out, "\n", &save); line && nn < 255;
         line = strtok_r(NULL, "\n", &save)) {
        char *c = strstr(line, ": created");
        if (!c) c = strstr(line, ": exists");
        if (!c) continue;
        *c = '\0';
        names[nn++] = line;
    }
    names[nn] = NULL;
    if (al_test_kafka_wait_leaders(k->bootstrap, names, 60) != 0) {
        fprintf(stderr, "broker fixture: the topics have no leaders after 60 s\n");
        return -1;
    }
    b->kafka = 1;
    b->pid = k->node[0].pid;
    snprintf(b->bootstrap, sizeof b->bootstrap, "%.511s", k->bootstrap);
    snprintf(b->control, sizeof b->control, "kafka");
    return 0;
}

/* al_test_broker_control for real Kafka: see the top of this file. */
static inline int al_test_broker_control_kafka(al_test_broker *b, const char *cmd, char *reply,
                                               size_t rlen)
{
    char buf[256] = "", verb[32] = "", name[250] = "", confs[8][128];
    const char *conf[9] = {NULL};
    int a = 0, c = 0, rc = -1, used = 0;
    al_test_kafka *k = &al_test_broker_cluster;
    int nf = sscanf(cmd, "%31s %249s %d %d %n", verb, name, &a, &c, &used);
    /* create's topic settings after the replication: "key=value ..." (real Kafka only) */
    for (int i = 0, off = 0; nf >= 4 && used > 0 && i < 8; i++) {
        int len = 0;
        if (sscanf(cmd + used + off, "%127s%n", confs[i], &len) != 1) break;
        conf[i] = confs[i];
        off += len;
    }
    if (!strcmp(verb, "ping")) {
        snprintf(buf, sizeof buf, "ok");
        rc = 0;
    } else if (!strcmp(verb, "brokers")) {
        snprintf(buf, sizeof buf, "ok %d", k->n);
        rc = 0;
    } else if (!strcmp(verb, "create") && nf >= 3 && a > 0) {
        char err[512];
        rc = al_test_kafka_create_topic(k, name, a, nf >= 4 ? c : 3, conf, err, sizeof err);
        snprintf(buf, sizeof buf, rc == 0 ? "ok" : "error %s", err);
    } else if ((!strcmp(verb, "down") || !strcmp(verb, "up")) && nf >= 2 && atoi(name) >= 1 &&
               atoi(name) <= k->n) {
        int i = atoi(name) - 1;
        if (verb[0] == 'd') {
            al_test_kafka_kill(k, i);
            rc = 0;
        } else {
            rc = al_test_kafka_restart(k, i, 120);
        }
        if (i == 0) b->pid = k->node[0].pid;
        snprintf(buf, sizeof buf, rc == 0 ? "ok" : "error node %d did not come back", i + 1);
    } else {
        snprintf(buf, sizeof buf, "error '%s' is not available on real Kafka", cmd);
    }
    if (reply && rlen) snprintf(reply, rlen, "%s", buf);
    return rc;
}

/* The fields of /proc/PID/stat after the command name (state first), read into buf; NULL
 * when the process is gone. */
static inline const char *al_test_proc_stat(pid_t pid, char *buf, size_t buflen)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f) return NULL;
    size_t n = fread(buf, 1, buflen - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *p = strrchr(buf, ')'); /* the command name may hold spaces */
    return p && p[1] == ' ' ? p + 2 : NULL;
}

/* CPU seconds (user + system) a process has used so far; 0 when it is gone. The benchmarks
 * read the broker's (and the proxy's) around their runs. */
static inline double al_test_proc_cpu_s(pid_t pid)
{
    char buf[1024];
    const char *p = al_test_proc_stat(pid, buf, sizeof buf);
    unsigned long long ut = 0, st = 0;
    if (!p || sscanf(p, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st) != 2)
        return 0;
    return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

/* ---- reading a topic back ------------------------------------------------------------------- */

/* Whether needle occurs in the n bytes at hay (which may hold NULs: memmem, without
 * asking every includer for _GNU_SOURCE). */
static inline int al_test_mem_has(const char *hay, size_t n, const char *needle)
{
    size_t k = strlen(needle);
    for (size_t i = 0; k <= n && i <= n - k; i++)
        if (!memcmp(hay + i, needle, k)) return 1;
    return 0;
}

/* Messages read from a topic: value (NUL-terminated past len), length and key of each. */
typedef struct al_test_msgs {
    char **val;
    size_t *len;
    char **key;
    size_t n, cap;
} al_test_msgs;

static inline void al_test_msgs_free(al_test_msgs *m)
{
    for (size_t i = 0; i < m->n; i++) {
        free(m->val[i]);
        free(m->key[i]);
    }
    free(m->val);
    free(m->len);
    free(m->key);
    memset(m, 0, sizeof *m);
}

/* Reads topic from the beginning until at least `want` messages with `match` somewhere in
 * their value (NULL: any) have arrived or timeout_ms passes. Keeps every message read (free
 * them with al_test_msgs_free). 0 when `want` matched in time, else -1. */
static inline int al_test_topic_read(const char *bootstrap, const char *topic, const char *match,
                                     size_t want, int timeout_ms, al_test_msgs *out)
{
    char err[512];
    memset(out, 0, sizeof *out);
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    rd_kafka_conf_set(conf, "bootstrap.servers", bootstrap, err, sizeof err);
    rd_kafka_conf_set(conf, "group.id", "px-test-reader", err, sizeof err);
    rd_kafka_conf_set(conf, "enable.auto.commit", "false", err, sizeof err);
    rd_kafka_conf_set(conf, "log_level", "0", err, sizeof err);
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_CONSUMER, conf, err, sizeof err);
    if (!rk) return -1;
    const rd_kafka_metadata_t *md = NULL;
    int nparts = 0;
    for (int t = 0; t < 50 && nparts == 0; t++) {
        rd_kafka_topic_t *rkt = rd_kafka_topic_new(rk, topic, NULL);
        if (rd_kafka_metadata(rk, 0, rkt, &md, 5000) == RD_KAFKA_RESP_ERR_NO_ERROR) {
            if (md->topic_cnt == 1) nparts = md->topics[0].partition_cnt;
            rd_kafka_metadata_destroy(md);
        }
        rd_kafka_topic_destroy(rkt);
        if (!nparts) usleep(100000);
    }
    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(nparts);
    for (int i = 0; i < nparts; i++)
        rd_kafka_topic_partition_list_add(l, topic, i)->offset = RD_KAFKA_OFFSET_BEGINNING;
    rd_kafka_assign(rk, l);
    rd_kafka_topic_partition_list_destroy(l);
    size_t matched = 0;
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        clock_gettime(CLOCK_MONOTONIC, &t);
        long el = (t.tv_sec - t0.tv_sec) * 1000 + (t.tv_nsec - t0.tv_nsec) / 1000000;
        if (matched >= want || el > timeout_ms) break;
        rd_kafka_message_t *m = rd_kafka_consumer_poll(rk, 100);
        if (!m) continue;
        if (!m->err) {
            if (out->n == out->cap) {
                out->cap = out->cap ? out->cap * 2 : 64;
                out->val = realloc(out->val, out->cap * sizeof *out->val);
                out->len = realloc(out->len, out->cap * sizeof *out->len);
                out->key = realloc(out->key, out->cap * sizeof *out->key);
            }
            char *v = malloc(m->len + 1), *k = malloc(m->key_len + 1);
            memcpy(v, m->payload, m->len);
            v[m->len] = '\0';
            memcpy(k, m->key ? m->key : "", m->key_len);
            k[m->key_len] = '\0';
            out->val[out->n] = v;
            out->len[out->n] = m->len;
            out->key[out->n] = k;
            out->n++;
            if (!match || al_test_mem_has(v, m->len, match)) matched++;
        }
        rd_kafka_message_destroy(m);
    }
    rd_kafka_consumer_close(rk);
    rd_kafka_destroy(rk);
    return matched >= want ? 0 : -1;
}


#endif
