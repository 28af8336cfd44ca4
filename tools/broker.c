/*
 * arclight broker: the embedded Kafka broker, librdkafka's mock cluster on a fixed loopback
 * address.
 *
 * librdkafka 2.0.2's mock cluster binds each broker's listener to 127.0.0.1 port 0 (an
 * ephemeral port) and has no way to choose one. So that `--listen 127.0.0.1:9092` means what
 * it says, librdkafka's calls to bind(2) are hooked while the cluster is being created (and
 * only then): tools/broker_bind.c, which says why that is the one place to act.
 *
 * stdout: line 1 is the bootstrap address ("127.0.0.1:9092" or "h:p1,h:p2,..."); with
 * --control, line 2 is "control HOST:PORT". Logs go to stderr. SIGINT/SIGTERM stop it (exit 0).
 *
 * Control protocol (--control, loopback TCP, one command per line, one reply line each):
 *   down ID | up ID        take broker ID (1..N) down (connections closed and refused) / up
 *   rtt ID MS              add MS milliseconds of round-trip delay to broker ID
 *   create NAME PARTITIONS [REPLICATION]   create a topic (the mock has no CreateTopics)
 *   error APIKEY CODE [COUNT]  fail the next COUNT (default 1) requests of Kafka API APIKEY
 *                          (0 Produce, 1 Fetch, 8 OffsetCommit, ...) with error CODE
 *   brokers                "ok N"
 *   ping                   "ok"
 */
#define _GNU_SOURCE
#include "broker_bind.h"
#include "core/cli.h"
#include "core/flags.h"
#include "core/log.h"
#include "core/util.h"
#include "kafka/kafka.h"
#include "kafka/stage.h"

#include <arpa/inet.h>
#include <errno.h>
#include <librdkafka/rdkafka_mock.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* ------------------------------------------------------------------------------------------
 * The broker
 * ------------------------------------------------------------------------------------------ */

static volatile sig_atomic_t broker_stop;

static void broker_on_signal(int sig)
{
    (void)sig;
    broker_stop = 1;
}

typedef struct control_client {
    int fd;
    char buf[512];
    size_t len;
} control_client;

#define CONTROL_MAX_CLIENTS 16

/* Runs one control command line; writes the reply (with newline) into reply. */
static void control_exec(rd_kafka_mock_cluster_t *mc, int nbrokers, char *line, char *reply,
                         size_t rlen)
{
    char cmd[32] = "", name[256] = "";
    long id = 0, ms = 0;
    int n = sscanf(line, "%31s %ld %ld", cmd, &id, &ms);
    rd_kafka_resp_err_t err;
    if (n < 1) {
        snprintf(reply, rlen, "error empty command\n");
        return;
    }
    if (!strcmp(cmd, "create")) {
        long parts = 0, repl = 1;
        int k = sscanf(line, "%31s %255s %ld %ld", cmd, name, &parts, &repl);
        if (k < 3 || parts < 1 || parts > 10000 || repl < 1) {
            snprintf(reply, rlen, "error create wants NAME PARTITIONS [REPLICATION]\n");
            return;
        }
        if (repl > nbrokers) repl = nbrokers;
        err = rd_kafka_mock_topic_create(mc, name, (int)parts, (int)repl);
        if (err)
            snprintf(reply, rlen, "error %s\n", rd_kafka_err2str(err));
        else
            snprintf(reply, rlen, "ok\n");
        al_log_info("broker", "control: %s: %s", line, err ? rd_kafka_err2str(err) : "ok");
        return;
    }
    if (!strcmp(cmd, "ping")) {
        snprintf(reply, rlen, "ok\n");
        return;
    }
    if (!strcmp(cmd, "brokers")) {
        snprintf(reply, rlen, "ok %d\n", nbrokers);
        return;
    }
    if (!strcmp(cmd, "error")) {
        long apikey = -1, code = 0, count = 1;
        int k = sscanf(line, "%31s %ld %ld %ld", cmd, &apikey, &code, &count);
        if (k < 3 || apikey < 0 || apikey > 100 || code <= 0 || code > 1000 || count < 1 ||
            count > 1000) {
            snprintf(reply, rlen, "error error wants APIKEY CODE [COUNT] (Kafka numbers)\n");
            return;
        }
        rd_kafka_resp_err_t errs[1000];
        for (long i = 0; i < count; i++)
            errs[i] = (rd_kafka_resp_err_t)code;
        rd_kafka_mock_push_request_errors_array(mc, (int16_t)apikey, (size_t)count, errs);
        al_log_info("broker", "control: %s (%s)", line,
                    rd_kafka_err2str((rd_kafka_resp_err_t)code));
        snprintf(reply, rlen, "ok\n");
        return;
    }
    int is_down = !strcmp(cmd, "down"), is_up = !strcmp(cmd, "up"), is_rtt = !strcmp(cmd, "rtt");
    if (!is_down && !is_up && !is_rtt) {
        snprintf(reply, rlen,
                 "error unknown command '%s' (down ID, up ID, rtt ID MS, create, error, brokers, "
                 "ping)\n",
                 cmd);
        return;
    }
    if (n < 2 || id < 1 || id > nbrokers) {
        snprintf(reply, rlen, "error broker id must be 1..%d\n", nbrokers);
        return;
    }
    if (is_rtt && (n < 3 || ms < 0 || ms > 600000)) {
        snprintf(reply, rlen, "error rtt wants ID MS with MS in 0..600000\n");
        return;
    }
    if (is_down)
        err = rd_kafka_mock_broker_set_down(mc, (int32_t)id);
    else if (is_up)
        err = rd_kafka_mock_broker_set_up(mc, (int32_t)id);
    else
        err = rd_kafka_mock_broker_set_rtt(mc, (int32_t)id, (int)ms);
    if (err) {
        snprintf(reply, rlen, "error %s\n", rd_kafka_err2str(err));
        return;
    }
    al_log_info("broker", "control: %s", line);
    snprintf(reply, rlen, "ok\n");
}

/* Opens a loopback TCP listener; returns the fd (and the bound port), or -1 with errstr. */
static int control_listen(const char *host, int port, int *bound_port, char *errstr, size_t errlen)
{
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    socklen_t sl = sizeof sin;
    int one = 1;
    if (inet_pton(AF_INET, host, &sin.sin_addr) != 1)
        return al_err(errstr, errlen, "--control: '%s' is not an IPv4 address", host);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return al_err(errstr, errlen, "--control: socket: %s", strerror(errno));
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, (struct sockaddr *)&sin, sizeof sin) != 0 || listen(fd, 8) != 0 ||
        getsockname(fd, (struct sockaddr *)&sin, &sl) != 0) {
        al_err(errstr, errlen, "--control %s:%d: %s", host, port, strerror(errno));
        close(fd);
        return -1;
    }
    *bound_port = ntohs(sin.sin_port);
    return fd;
}

/* Serves control clients and waits for a stop signal. */
static void broker_run(rd_kafka_mock_cluster_t *mc, int nbrokers, int control_fd)
{
    control_client clients[CONTROL_MAX_CLIENTS];
    int nclients = 0;
    while (!broker_stop) {
        struct pollfd pf[CONTROL_MAX_CLIENTS + 1];
        int n = 0;
        if (control_fd >= 0) pf[n++] = (struct pollfd){.fd = control_fd, .events = POLLIN};
        for (int i = 0; i < nclients; i++)
            pf[n++] = (struct pollfd){.fd = clients[i].fd, .events = POLLIN};
        int r = poll(pf, (nfds_t)n, 200);
        if (r <= 0) continue;
        int base = 0;
        if (control_fd >= 0) {
            base = 1;
            if (pf[0].revents & POLLIN) {
                int fd = accept4(control_fd, NULL, NULL, SOCK_CLOEXEC);
                if (fd >= 0 && nclients < CONTROL_MAX_CLIENTS)
                    clients[nclients++] = (control_client){.fd = fd};
                else if (fd >= 0)
                    close(fd);
            }
        }
        for (int i = nclients - 1; i >= 0; i--) {
            if (!(pf[base + i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
            control_client *cl = &clients[i];
            ssize_t got = read(cl->fd, cl->buf + cl->len, sizeof cl->buf - 1 - cl->len);
            int drop = got <= 0;
            if (got > 0) {
                cl->len += (size_t)got;
                cl->buf[cl->len] = '\0';
                char *nl;
                while ((nl = strchr(cl->buf, '\n'))) {
                    char reply[256];
                    *nl = '\0';
                    if (nl > cl->buf && nl[-1] == '\r') nl[-1] = '\0';
                    control_exec(mc, nbrokers, cl->buf, reply, sizeof reply);
                    if (write(cl->fd, reply, strlen(reply)) < 0) drop = 1;
                    size_t rest = cl->len - (size_t)(nl + 1 - cl->buf);
                    memmove(cl->buf, nl + 1, rest);
                    cl->len = rest;
                    cl->buf[cl->len] = '\0';
                }
                if (cl->len == sizeof cl->buf - 1) drop = 1; /* a line longer than any command */
            }
            if (drop) {
                close(cl->fd);
                clients[i] = clients[--nclients];
            }
        }
    }
    for (int i = 0; i < nclients; i++)
        close(clients[i].fd);
}

/* Creates the topics of the file on the mock cluster; replication capped at the broker count. */
static int broker_create_topics(rd_kafka_mock_cluster_t *mc, int nbrokers, const char *path)
{
    char errstr[512];
    al_topic_spec *t;
    size_t n;
    if (al_topics_load(path, &t, &n, errstr, sizeof errstr) != 0) {
        al_log_error("broker", "%s", errstr);
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        int repl = t[i].replication > nbrokers ? nbrokers : t[i].replication;
        rd_kafka_resp_err_t err = rd_kafka_mock_topic_create(mc, t[i].name, t[i].partitions, repl);
        if (err) {
            al_log_error("broker", "creating topic %s: %s", t[i].name, rd_kafka_err2str(err));
            al_topics_free(t, n);
            return -1;
        }
        char settings[1024] = "";
        size_t off = 0;
        for (size_t k = 0; k < al_kafka_conf_count(t[i].settings) && off < sizeof settings; k++) {
            const char *key, *val;
            al_kafka_conf_at(t[i].settings, k, &key, &val);
            off += (size_t)snprintf(settings + off, sizeof settings - off, " %s=%s", key, val);
        }
        if (off > 0 && off < sizeof settings - 1) strcat(settings, ")");
        al_log_info("broker", "topic %s: %d partitions, replication %d%s%s", t[i].name,
                    t[i].partitions, repl, settings[0] ? " (not enforced here:" : "",
                    settings[0] ? settings : "");
    }
    al_topics_free(t, n);
    return 0;
}

/* Whether ports port..port+n-1 of addr can be bound (librdkafka aborts when a mock listener
 * cannot bind, so a busy one is found here first): 0, or -1 after logging which is taken. */
static int broker_ports_free(struct in_addr addr, const char *host, int port, int n)
{
    for (int i = 0; i < n; i++) {
        struct sockaddr_in sin = {
            .sin_family = AF_INET, .sin_addr = addr, .sin_port = htons((uint16_t)(port + i))};
        int one = 1, fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (fd < 0 || bind(fd, (struct sockaddr *)&sin, sizeof sin) != 0) {
            al_log_error("broker",
                         "cannot listen on %s:%d: %s (port in use by another broker "
                         "or program? pick another with --listen)",
                         host, port + i, strerror(errno));
            if (fd >= 0) close(fd);
            return -1;
        }
        close(fd);
    }
    return 0;
}

int cmd_broker(int argc, char **argv)
{
    /* the mock cluster copies every produced batch and builds every fetch answer in fresh
     * buffers: keeping freed memory makes its first runs as fast as its warm ones */
    al_stage_keep_freed_memory();
    al_cli_common common;
    const char *listen_arg = "127.0.0.1:9092", *control_arg = NULL, *topics_file = NULL;
    char topics_path[4096], host[256], chost[256], errstr[512];
    int port, cport = 0, nbrokers = 1;
    const al_flag flags[] = {
        {"listen", 0, AL_FLAG_STRING, &listen_arg, .arg = "HOST:PORT",
         .help = "loopback address of broker 1 (default 127.0.0.1:9092);\n"
                 "broker i listens on PORT+i-1; port 0 picks free ports"},
        {"brokers", 0, AL_FLAG_INT, &nbrokers, .lo = 1, .hi = 16, .arg = "N",
         .help = "number of brokers (default 1)"},
        {"topics", 0, AL_FLAG_STRING, &topics_file, .arg = "FILE",
         .help = "topics to create (default broker-config/topics.conf)"},
        {"control", 0, AL_FLAG_STRING, &control_arg, .arg = "HOST:PORT",
         .help = "loopback line protocol to take brokers down/up:\n"
                 "'down ID', 'up ID', 'rtt ID MS', 'brokers', 'ping',\n"
                 "'create TOPIC PARTITIONS [REPLICATION]',\n"
                 "'error APIKEY CODE [COUNT]' (fail the next requests)"},
    };
    const al_cmd_spec spec = {
        "broker",
        "[--listen HOST:PORT] [--brokers N] [--topics FILE]\n"
        "                       [--control HOST:PORT]",
        "Runs the embedded Kafka broker (librdkafka's mock cluster) until SIGINT/SIGTERM.\n"
        "Prints the bootstrap address as the first line of stdout. It keeps about 5 MiB\n"
        "per partition in memory and drops the oldest data beyond that: for a first run,\n"
        "demos and tests; anything meant to last runs on Kafka.\n",
        flags, AL_ARRAY_LEN(flags), .common = 1};
    int first;
    al_cli_common_init(&common);
    int prc = al_flags_parse(&spec, &common, argc, argv, &first);
    if (prc != AL_FLAGS_GO) return prc;
    if (topics_file)
        snprintf(topics_path, sizeof topics_path, "%s", topics_file);
    else
        al_kafka_config_file_path("topics.conf", topics_path, sizeof topics_path);
    if (first < argc)
        return al_cli_usage_error("broker", "unexpected argument '%s'", argv[first]);
    struct in_addr addr;
    if (al_cli_parse_hostport(listen_arg, host, sizeof host, &port) != 0 ||
        inet_pton(AF_INET, host, &addr) != 1)
        return al_cli_usage_error("broker", "--listen wants IPV4:PORT, got '%s'", listen_arg);
    if ((ntohl(addr.s_addr) >> 24) != 127)
        return al_cli_usage_error("broker",
                                  "--listen %s: the embedded broker listens on loopback "
                                  "(127.x.x.x) only; use a real Kafka cluster for more",
                                  listen_arg);
    if (port != 0 && port + nbrokers - 1 > 65535)
        return al_cli_usage_error("broker", "--listen port %d + %d brokers exceeds 65535", port,
                                  nbrokers);
    if (control_arg && (al_cli_parse_hostport(control_arg, chost, sizeof chost, &cport) != 0 ||
                        strncmp(chost, "127.", 4) != 0))
        return al_cli_usage_error("broker", "--control wants a loopback 127.x.x.x:PORT, got '%s'",
                                  control_arg);

    /* librdkafka aborts when a mock listener cannot bind: find a busy port first. */
    if (port != 0 && broker_ports_free(addr, host, port, nbrokers) != 0) return AL_EXIT_FAILURE;

    /* The handle the mock cluster lives in; it never connects anywhere itself. */
    al_kafka_conf *kc = al_kafka_conf_new();
    al_kafka_conf_set(kc, "client.id", "arclight-broker");
    rd_kafka_conf_t *rc = al_kafka_conf_build(kc, errstr, sizeof errstr);
    al_kafka_conf_free(kc);
    if (!rc) {
        al_log_error("broker", "%s", errstr);
        return AL_EXIT_FAILURE;
    }
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_PRODUCER, rc, errstr, sizeof errstr);
    if (!rk) {
        al_log_error("broker", "cannot create the mock cluster's handle: %s", errstr);
        rd_kafka_conf_destroy(rc);
        return AL_EXIT_FAILURE;
    }

    int rewrite = port != 0 || addr.s_addr != htonl(INADDR_LOOPBACK);
    int hooked = broker_bind_hook_install(addr, port, rewrite, errstr, sizeof errstr) == 0;
    if (!hooked) al_log_warn("broker", "%s", errstr); /* the check below refuses a rewrite */
    rd_kafka_mock_cluster_t *mc = rd_kafka_mock_cluster_new(rk, nbrokers);
    int nodelay_count = 0, fixed_count = 0;
    if (hooked) broker_bind_hook_remove(&nodelay_count, &fixed_count);
    al_log_debug("broker", "Nagle's algorithm off on %d of %d listeners", nodelay_count,
                 nbrokers);
    if (!mc) {
        al_log_error("broker", "cannot start the embedded broker on %s (ports %d..%d): %s", host,
                     port, port + nbrokers - 1,
                     port ? "a port is in use or not allowed" : "listener setup failed");
        rd_kafka_destroy(rk);
        return AL_EXIT_FAILURE;
    }
    const char *bootstrap = rd_kafka_mock_cluster_bootstraps(mc);
    if (rewrite && fixed_count != nbrokers) {
        /* The mock cluster did not bind the way this file expects (another librdkafka?):
         * refuse rather than advertise an address nobody asked for. */
        al_log_error("broker", "expected %d fixed-port listeners, saw %d; bootstraps are %s",
                     nbrokers, fixed_count, bootstrap);
        rd_kafka_mock_cluster_destroy(mc);
        rd_kafka_destroy(rk);
        return AL_EXIT_FAILURE;
    }

    int rc_exit = AL_EXIT_OK;
    int control_fd = -1;
    if (broker_create_topics(mc, nbrokers, topics_path) != 0) {
        rc_exit = AL_EXIT_FAILURE;
        goto out;
    }
    if (control_arg) {
        control_fd = control_listen(chost, cport, &cport, errstr, sizeof errstr);
        if (control_fd < 0) {
            al_log_error("broker", "%s", errstr);
            rc_exit = AL_EXIT_FAILURE;
            goto out;
        }
    }

    struct sigaction sa = {.sa_handler = broker_on_signal};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);

    printf("%s\n", bootstrap);
    if (control_fd >= 0) printf("control %s:%d\n", chost, cport);
    fflush(stdout);
    if (control_fd >= 0)
        al_log_info("broker", "embedded Kafka (%d broker%s) at %s, control on %s:%d", nbrokers,
                    nbrokers > 1 ? "s" : "", bootstrap, chost, cport);
    else
        al_log_info("broker", "embedded Kafka (%d broker%s) at %s", nbrokers,
                    nbrokers > 1 ? "s" : "", bootstrap);
    broker_run(mc, nbrokers, control_fd);
    al_log_info("broker", "stopping");

out:
    if (control_fd >= 0) close(control_fd);
    rd_kafka_mock_cluster_destroy(mc);
    rd_kafka_destroy(rk);
    return rc_exit;
}
