/*
 * bench_proxy: what the capture proxy costs, against nginx in the same run. One fast
 * upstream (tests/fake_upstream.c answering a fixed chat completion), then wrk at 64
 * connections on loopback three ways:
 *   direct     wrk -> upstream
 *   nginx      wrk -> nginx proxy_pass (1 worker, keepalive upstream, access log off)
 *   arclight   wrk -> arclight proxy (capture on: token ids + logprobs asked, stripped,
 *              one span per call through the spool to the embedded broker)
 and prints requests/s, p50/p99 and what each proxy adds to the direct p50/p99, with
 * arclight's throughput as a ratio of nginx's, and the CPU each side spent per request
 * (upstream, proxy, broker): on a small machine everything shares the same cores, so a
 * side that costs more CPU per request slows the others. Passes: 64 connections flat out
 * (with the proxy's CPU by thread and how busy the machine's cores were), 4 connections
 * flat out, 64 connections at a fixed rate, one connection.
 *
 * The upstream (--upstream): `fixed` (default) answers every chat completion with the same
 * bytes from one epoll thread: the body tests/fake_upstream.c gives for this request, taken
 * once at start, with token ids and logprobs when the request asks for them (arclight's
 * capture does) and without otherwise, so both answers cost the upstream the same few
 * syscalls. `test` is tests/fake_upstream.c itself, which builds each answer with jansson
 * and so spends ~35 % more CPU on a capture request than on a plain one, CPU that on a
 * 2-core machine comes out of the proxy's share.
 *
 * Last, spans/s into the broker: a flat-out pass through the proxy on the embedded broker and
 * through a second proxy on a one-node Apache Kafka (tests/kafka_fixture.h), each timed until
 * the proxy's spool is empty again (every span acknowledged), spans counted on the broker.
 *
 *   build/bench_proxy [--duration S] [--connections N] [--threads T] [--upstream fixed|test]
 *                     [--kafka on|off] [--instructions N] [--proxy-arg ARG]...
 * --instructions N: instead of the wrk passes, the proxy runs under valgrind's callgrind and
 * the bench prints the instructions it executes per request (all its threads; N requests on
 * one keep-alive connection, the spans published) and its top functions by inclusive cost:
 * a count that, unlike req/s, does not move with the machine's load.
 * Needs wrk and nginx on PATH, curl, the arclight binary ($ARCLIGHT_BIN, else
 * ./build/arclight) and, for the Kafka part, the broker scripts/setup.sh fetches.
 */
#define _GNU_SOURCE
#include "broker_fixture.h"
#include "fake_upstream.h"

#include <netinet/tcp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <dirent.h>

typedef struct wrk_result {
    double rps, p50_ms, p99_ms, requests;
    long non2xx;
    double cpu_up, cpu_px, cpu_bk; /* CPU µs per request: upstream, proxy, broker */
} wrk_result;

static double to_ms(const char *v)
{
    double x = atof(v);
    if (strstr(v, "us")) return x / 1000.0;
    if (strstr(v, "ms")) return x;
    if (strstr(v, "s")) return x * 1000.0;
    return x;
}

static int run_wrk(const char *url, const char *lua, int threads, int conns, int dur, wrk_result *r)
{
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "wrk -t%d -c%d -d%ds --latency -s '%s' '%s' 2>&1", threads, conns,
             dur, lua, url);
    FILE *f = popen(cmd, "r");
    if (!f) return -1;
    char line[512];
    memset(r, 0, sizeof *r);
    while (fgets(line, sizeof line, f)) {
        char a[64], b[64];
        if (sscanf(line, " 50%% %63s", a) == 1)
            r->p50_ms = to_ms(a);
        else if (sscanf(line, " 99%% %63s", a) == 1)
            r->p99_ms = to_ms(a);
        else if (sscanf(line, "Requests/sec: %63s", a) == 1)
            r->rps = atof(a);
        else if (sscanf(line, " Non-2xx or 3xx responses: %63s", b) == 1)
            r->non2xx = atol(b);
        else if (strstr(line, " requests in "))
            r->requests = atof(line);
    }
    return pclose(f) == 0 && r->rps > 0 ? 0 : -1;
}

/* ---- the fixed-answer upstream ---------------------------------------------------------- */

typedef struct fx_conn {
    int fd;
    size_t len;
    char buf[16384];
} fx_conn;

typedef struct fixed_up {
    int lfd, epfd, stopfd, port;
    pthread_t th;
    char *plain, *capture; /* whole HTTP responses */
    size_t plain_len, capture_len;
} fixed_up;

static int write_all(int fd, const char *p, size_t n)
{
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0 && errno == EAGAIN) {
            struct pollfd pf = {fd, POLLOUT, 0};
            poll(&pf, 1, 1000);
            continue;
        }
        if (w <= 0) return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* Answers every whole request in c->buf; -1 when the connection is to close. */
static int fx_serve(fixed_up *u, fx_conn *c)
{
    size_t off = 0;
    for (;;) {
        char *p = c->buf + off;
        size_t n = c->len - off;
        char *e = memmem(p, n, "\r\n\r\n", 4);
        if (!e) break;
        size_t hl = (size_t)(e - p) + 4, cl = 0;
        for (char *h = p; h < e; h++)
            if ((*h == 'C' || *h == 'c') && !strncasecmp(h, "content-length:", 15)) {
                cl = strtoul(h + 15, NULL, 10);
                break;
            }
        if (hl + cl > sizeof c->buf) return -1;
        if (n < hl + cl) break;
        int cap = memmem(p + hl, cl, "\"return_token_ids\"", 18) != NULL;
        if (write_all(c->fd, cap ? u->capture : u->plain, cap ? u->capture_len : u->plain_len))
            return -1;
        off += hl + cl;
    }
    memmove(c->buf, c->buf + off, c->len - off);
    c->len -= off;
    return 0;
}

static void *fx_main(void *arg)
{
    fixed_up *u = arg;
    struct epoll_event evs[64];
    for (;;) {
        int n = epoll_wait(u->epfd, evs, 64, -1);
        for (int i = 0; i < n; i++) {
            if (evs[i].data.ptr == NULL) { /* the listener */
                int fd = accept4(u->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
                if (fd < 0) continue;
                int one = 1;
                setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                fx_conn *c = calloc(1, sizeof *c);
                c->fd = fd;
                struct epoll_event ev = {.events = EPOLLIN, .data.ptr = c};
                epoll_ctl(u->epfd, EPOLL_CTL_ADD, fd, &ev);
                continue;
            }
            if (evs[i].data.ptr == (void *)u) return NULL; /* stop */
            fx_conn *c = evs[i].data.ptr;
            ssize_t r = read(c->fd, c->buf + c->len, sizeof c->buf - c->len);
            if (r < 0 && (errno == EAGAIN || errno == EINTR)) continue;
            if (r <= 0 || (c->len += (size_t)r, fx_serve(u, c) != 0)) {
                epoll_ctl(u->epfd, EPOLL_CTL_DEL, c->fd, NULL);
                close(c->fd);
                free(c);
            }
        }
    }
}

/* One HTTP exchange with the test upstream; the response body (malloc'ed) or NULL. */
static char *fetch_body(int port, const char *body)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, "127.0.0.1", &sin.sin_addr);
    if (connect(fd, (struct sockaddr *)&sin, sizeof sin) != 0) {
        close(fd);
        return NULL;
    }
    char req[1024];
    int n = snprintf(req, sizeof req,
                     "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                     "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n%s",
                     strlen(body), body);
    if (write_all(fd, req, (size_t)n)) {
        close(fd);
        return NULL;
    }
    size_t cap = 65536, len = 0;
    char *buf = malloc(cap);
    ssize_t r;
    while (len + 1 < cap && (r = read(fd, buf + len, cap - 1 - len)) > 0)
        len += (size_t)r;
    close(fd);
    buf[len] = '\0';
    char *b = strstr(buf, "\r\n\r\n");
    if (strncmp(buf, "HTTP/1.1 200", 12) || !b) {
        free(buf);
        return NULL;
    }
    char *out = strdup(b + 4);
    free(buf);
    return out;
}

static char *http_answer(const char *body, size_t *len)
{
    size_t bl = strlen(body), cap = bl + 128;
    char *r = malloc(cap);
    *len = (size_t)snprintf(r, cap,
                            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                            "Content-Length: %zu\r\n\r\n%s",
                            bl, body);
    return r;
}

/* Starts the fixed-answer upstream with the answers the test upstream on test_port gives
 * to the bench's request, plain and with capture's additions. NULL on failure. */
static fixed_up *fixed_up_start(int test_port)
{
    static const char plain_req[] =
        "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"What is 2+2?\"}]}";
    static const char capture_req[] =
        "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"What is "
        "2+2?\"}],\"return_token_ids\":true,\"logprobs\":true}";
    char *pb = fetch_body(test_port, plain_req), *cb = fetch_body(test_port, capture_req);
    if (!pb || !cb || !strstr(cb, "\"token_ids\"")) {
        fprintf(stderr, "bench_proxy: no answers from the test upstream\n");
        free(pb);
        free(cb);
        return NULL;
    }
    fixed_up *u = calloc(1, sizeof *u);
    u->plain = http_answer(pb, &u->plain_len);
    u->capture = http_answer(cb, &u->capture_len);
    free(pb);
    free(cb);
    u->lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    int one = 1;
    setsockopt(u->lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in sin = {.sin_family = AF_INET};
    inet_pton(AF_INET, "127.0.0.1", &sin.sin_addr);
    socklen_t sl = sizeof sin;
    if (bind(u->lfd, (struct sockaddr *)&sin, sizeof sin) || listen(u->lfd, 1024) ||
        getsockname(u->lfd, (struct sockaddr *)&sin, &sl)) {
        perror("bench_proxy: fixed upstream");
        return NULL;
    }
    u->port = ntohs(sin.sin_port);
    u->epfd = epoll_create1(EPOLL_CLOEXEC);
    u->stopfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = NULL};
    epoll_ctl(u->epfd, EPOLL_CTL_ADD, u->lfd, &ev);
    ev.data.ptr = u;
    epoll_ctl(u->epfd, EPOLL_CTL_ADD, u->stopfd, &ev);
    pthread_create(&u->th, NULL, fx_main, u);
    return u;
}

/* Stops the thread; its connections' memory goes with the process. */
static void fixed_up_stop(fixed_up *u)
{
    if (!u) return;
    uint64_t one = 1;
    if (write(u->stopfd, &one, sizeof one)) {
    }
    pthread_join(u->th, NULL);
    close(u->lfd);
    close(u->epfd);
    close(u->stopfd);
    free(u->plain);
    free(u->capture);
    free(u);
}

/* ---- CPU accounting -------------------------------------------------------------------- */

static double self_cpu(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 + (double)ru.ru_stime.tv_sec +
           ru.ru_stime.tv_usec / 1e6;
}

/* nginx's worker: the master's child. */
static pid_t child_of(pid_t pid)
{
    char path[96];
    snprintf(path, sizeof path, "/proc/%d/task/%d/children", (int)pid, (int)pid);
    FILE *f = fopen(path, "r");
    int c = 0;
    if (f) {
        if (fscanf(f, "%d", &c) != 1) c = 0;
        fclose(f);
    }
    return (pid_t)c;
}

typedef struct cpu_probe {
    pid_t proxy, broker; /* 0: none */
    double t_up, t_proxy, t_broker;
} cpu_probe;

static void probe_start(cpu_probe *p)
{
    p->t_up = self_cpu();
    p->t_proxy = p->proxy ? al_test_proc_cpu_s(p->proxy) : 0;
    p->t_broker = p->broker ? al_test_proc_cpu_s(p->broker) : 0;
}

/* Microseconds of CPU per request since probe_start, into r. */
static void probe_end(const cpu_probe *p, double requests, double *up, double *px, double *bk)
{
    double k = requests > 0 ? 1e6 / requests : 0;
    *up = (self_cpu() - p->t_up) * k;
    *px = p->proxy ? (al_test_proc_cpu_s(p->proxy) - p->t_proxy) * k : 0;
    *bk = p->broker ? (al_test_proc_cpu_s(p->broker) - p->t_broker) * k : 0;
}

/* Per-thread CPU of a process (/proc/PID/task/TID/stat) and the machine's busy time
 * (/proc/stat): where the time goes when the cores are full. */
typedef struct thread_cpu {
    int tid;
    char name[32];
    double s; /* user + system seconds */
} thread_cpu;

static int threads_of(pid_t pid, thread_cpu *out, int max)
{
    char dir[64];
    snprintf(dir, sizeof dir, "/proc/%d/task", (int)pid);
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *e;
    long hz = sysconf(_SC_CLK_TCK);
    while (d && (e = readdir(d)) && n < max) {
        int tid = atoi(e->d_name);
        if (tid <= 0) continue;
        char path[128], buf[1024];
        snprintf(path, sizeof path, "/proc/%d/task/%d/stat", (int)pid, tid);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        size_t k = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        buf[k] = '\0';
        char *lp = strchr(buf, '('), *rp = strrchr(buf, ')');
        if (!lp || !rp) continue;
        unsigned long ut = 0, st = 0;
        /* after ") ": state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime
         * stime */
        if (sscanf(rp + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st) != 2)
            continue;
        out[n].tid = tid;
        snprintf(out[n].name, sizeof out[n].name, "%.*s", (int)(rp - lp - 1), lp + 1);
        out[n].s = (double)(ut + st) / (double)hz;
        n++;
    }
    if (d) closedir(d);
    return n;
}

/* A thread's time on a CPU and waiting for one (ns, /proc/PID/task/TID/schedstat): a
 * thread that is runnable but waits is short of cores, not of work. */
static void sched_ns(pid_t pid, int tid, double *run, double *wait)
{
    char path[96];
    snprintf(path, sizeof path, "/proc/%d/task/%d/schedstat", (int)pid, tid);
    FILE *f = fopen(path, "r");
    unsigned long long r = 0, w = 0;
    if (f) {
        if (fscanf(f, "%llu %llu", &r, &w) != 2) r = w = 0;
        fclose(f);
    }
    *run = (double)r;
    *wait = (double)w;
}

/* Busy and total jiffies of the whole machine. */
static void machine_jiffies(double *busy, double *total)
{
    FILE *f = fopen("/proc/stat", "r");
    unsigned long long v[10] = {0};
    if (f) {
        if (fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3],
                   &v[4], &v[5], &v[6], &v[7]) != 8) {
        }
        fclose(f);
    }
    double t = 0;
    for (int i = 0; i < 8; i++)
        t += (double)v[i];
    *total = t;
    *busy = t - (double)v[3] - (double)v[4]; /* less idle and iowait */
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static pid_t spawn(const char *const *argv, const char *out_path, int *out_fd)
{
    int pfd[2] = {-1, -1};
    if (out_fd && pipe(pfd) != 0) return -1;
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (out_fd) dup2(pfd[1], 1);
        int lfd = open(out_path, O_WRONLY | O_CREAT | O_APPEND, 0600);
        if (lfd >= 0) dup2(lfd, 2);
        if (!out_fd && lfd >= 0) dup2(lfd, 1);
        /* nothing else is inherited: an nginx worker left behind by a crashed run must not
         * hold the caller's benchmark lock (flock) or the upstream's sockets */
        close_range(3, ~0U, 0);
        execvp(argv[0], (char *const *)argv);
        _exit(127);
    }
    if (out_fd) {
        close(pfd[1]);
        *out_fd = pfd[0];
    }
    return pid;
}

static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sin = {.sin_family = AF_INET};
    inet_pton(AF_INET, "127.0.0.1", &sin.sin_addr);
    bind(fd, (struct sockaddr *)&sin, sizeof sin);
    socklen_t sl = sizeof sin;
    getsockname(fd, (struct sockaddr *)&sin, &sl);
    close(fd);
    return ntohs(sin.sin_port);
}

static void stop(pid_t pid)
{
    if (pid <= 0) return;
    kill(pid, SIGTERM);
    for (int i = 0; i < 200; i++) {
        if (waitpid(pid, NULL, WNOHANG) == pid) return;
        usleep(50000);
    }
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
}

/* Spans on arclight.spans (the sum of its partitions' high watermarks), -1 on error. */
static long spans_on(const char *bootstrap)
{
    char err[256];
    rd_kafka_conf_t *c = rd_kafka_conf_new();
    rd_kafka_conf_set(c, "bootstrap.servers", bootstrap, err, sizeof err);
    rd_kafka_conf_set(c, "log_level", "0", err, sizeof err);
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_PRODUCER, c, err, sizeof err);
    if (!rk) return -1;
    long total = -1;
    rd_kafka_topic_t *rkt = rd_kafka_topic_new(rk, "arclight.spans", NULL);
    const struct rd_kafka_metadata *md = NULL;
    if (rd_kafka_metadata(rk, 0, rkt, &md, 10000) == RD_KAFKA_RESP_ERR_NO_ERROR &&
        md->topic_cnt == 1) {
        total = 0;
        for (int i = 0; i < md->topics[0].partition_cnt && total >= 0; i++) {
            int64_t lo, hi;
            if (rd_kafka_query_watermark_offsets(rk, "arclight.spans",
                                                 md->topics[0].partitions[i].id, &lo, &hi,
                                                 10000) != RD_KAFKA_RESP_ERR_NO_ERROR)
                total = -1;
            else
                total += (long)hi;
        }
    }
    if (md) rd_kafka_metadata_destroy(md);
    rd_kafka_topic_destroy(rkt);
    rd_kafka_destroy(rk);
    return total;
}

/* The proxy's arclight_proxy_spool_spans (spans not yet acknowledged by the broker), -1 when
 * its /metrics does not answer. */
static long spool_spans(int port)
{
    char cmd[256], line[256];
    snprintf(cmd, sizeof cmd, "curl -s http://127.0.0.1:%d/metrics", port);
    FILE *p = popen(cmd, "r");
    long n = -1;
    while (p && fgets(line, sizeof line, p))
        if (!strncmp(line, "arclight_proxy_spool_spans ", 27)) n = atol(line + 27);
    if (p) pclose(p);
    return n;
}

/* A flat-out pass into the proxy on port, timed from its start until the proxy's spool is
 * empty again; spans/s = the spans the broker got over that time (0 on error). */
static double spans_pass(int port, const char *bootstrap, const char *lua, int threads, int conns,
                         int dur, const char *rollout, wrk_result *r, long *spans, double *drain_s)
{
    char url[160];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/r/bench/%s/v1/chat/completions", port,
             rollout);
    long s0 = spans_on(bootstrap);
    double t0 = now_s();
    run_wrk(url, lua, threads, conns, dur, r);
    double t_wrk = now_s();
    while (now_s() - t_wrk < 120 && spool_spans(port) != 0)
        usleep(100000);
    double t1 = now_s();
    long s1 = spans_on(bootstrap);
    *drain_s = t1 - t_wrk;
    *spans = s0 >= 0 && s1 >= 0 ? s1 - s0 : -1;
    return *spans > 0 ? (double)*spans / (t1 - t0) : 0;
}

/* ---- instructions per request (--instructions N) ----------------------------------------- */

/* Sends n chat completions on one keep-alive connection to the proxy on port, each waited
 * for; 0 when every answer was a 200, -1 otherwise (with what went wrong on stderr). */
static int ka_requests(int port, const char *rollout, int n)
{
    static const char body[] =
        "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"What is 2+2?\"}]}";
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, "127.0.0.1", &sin.sin_addr);
    if (connect(fd, (struct sockaddr *)&sin, sizeof sin) != 0) {
        perror("bench_proxy: connect to the proxy");
        close(fd);
        return -1;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    char req[512], buf[65536];
    int rl = snprintf(req, sizeof req,
                      "POST /r/bench/%s/v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                      "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n%s",
                      rollout, strlen(body), body);
    for (int i = 0; i < n; i++) {
        if (write_all(fd, req, (size_t)rl)) break;
        size_t len = 0, want = 0;
        for (;;) {
            ssize_t r = read(fd, buf + len, sizeof buf - 1 - len);
            if (r <= 0) break;
            len += (size_t)r;
            buf[len] = '\0';
            char *e = strstr(buf, "\r\n\r\n");
            if (!want && e) {
                char *cl = strcasestr(buf, "\r\ncontent-length:");
                want = (size_t)(e + 4 - buf) + (cl && cl < e ? strtoul(cl + 17, NULL, 10) : 0);
            }
            if (want && len >= want) break;
        }
        if (!want || len < want || strncmp(buf, "HTTP/1.1 200", 12)) {
            fprintf(stderr, "bench_proxy: request %d: no whole 200 answer: %.200s\n", i, buf);
            close(fd);
            return -1;
        }
    }
    close(fd);
    return 0;
}

/* Runs `callgrind_control ARG PID`; 0 on success. */
static int cg_control(const char *arg, pid_t pid)
{
    char cmd[128];
    snprintf(cmd, sizeof cmd, "callgrind_control %s %d >/dev/null", arg, (int)pid);
    return system(cmd);
}

/* The "summary:"/"totals:" Ir of one callgrind dump file, -1 when it has none. */
static double cg_file_total(const char *path)
{
    FILE *f = fopen(path, "r");
    char line[512];
    double ir = -1;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "summary:", 8) || !strncmp(line, "totals:", 7))
            ir = atof(strchr(line, ':') + 1);
    if (f) fclose(f);
    return ir;
}

/* The Ir of the first dump (callgrind_control -d) in dir, one file per thread
 * (cg.out.PID.1-TT): *loop is thread 01's (the event loop: main runs it), the result all
 * threads' together (-1 when there is no dump yet); loop_path names thread 01's file. */
static double cg_total(const char *dir, double *loop, char *loop_path, size_t n)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    double all = -1;
    *loop = -1;
    loop_path[0] = '\0';
    while (d && (e = readdir(d))) {
        const char *part = strncmp(e->d_name, "cg.out.", 7) ? NULL : strchr(e->d_name + 7, '.');
        if (!part || strncmp(part, ".1-", 3)) continue;
        char p[1024];
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        double ir = cg_file_total(p);
        if (ir < 0) continue;
        all = (all < 0 ? 0 : all) + ir;
        if (!strcmp(part + 3, "01")) {
            *loop = ir;
            snprintf(loop_path, n, "%s", p);
        }
    }
    if (d) closedir(d);
    return all;
}

/* The proxy (argv) under callgrind, on the fixed upstream and the embedded broker: warm
 * requests, counters zeroed, n requests on one keep-alive connection, the spool drained to
 * the broker (so the span's encoding, spooling and publishing are counted), a dump. Prints
 * the instructions (Ir) per request over every thread of the proxy, and the top functions by
 * inclusive cost (callgrind_annotate). 0 on success. */
static int instructions_mode(const char **pargv, const char *tmp, int n)
{
    const char *vargv[48] = {"valgrind", "--tool=callgrind", "--separate-threads=yes", NULL};
    char outopt[700], plog[600];
    snprintf(outopt, sizeof outopt, "--callgrind-out-file=%s/cg.out.%%p", tmp);
    vargv[3] = outopt;
    int k = 4;
    for (int i = 0; pargv[i] && k < 46; i++)
        vargv[k++] = pargv[i];
    vargv[k] = NULL;
    snprintf(plog, sizeof plog, "%s/proxy-callgrind.log", tmp);
    int pfd;
    pid_t proxy = spawn(vargv, plog, &pfd);
    char line[128];
    if (al_test_broker_readline(pfd, line, sizeof line, 120000) != 0) {
        fprintf(stderr, "bench_proxy: the proxy under valgrind did not start (see %s)\n", plog);
        return 1;
    }
    close(pfd);
    int port = atoi(strrchr(line, ':') + 1);
    int warm = n / 10 > 50 ? n / 10 : 50;
    if (ka_requests(port, "rollout-cg", warm)) return 1;
    while (spool_spans(port) > 0)
        usleep(200000);
    if (cg_control("-z", proxy)) {
        fprintf(stderr, "bench_proxy: callgrind_control -z failed\n");
        return 1;
    }
    if (ka_requests(port, "rollout-cg", n)) return 1;
    while (spool_spans(port) > 0)
        usleep(200000);
    if (cg_control("-d", proxy)) {
        fprintf(stderr, "bench_proxy: callgrind_control -d failed\n");
        return 1;
    }
    char path[1024];
    double ir = -1, loop = -1;
    sleep(1); /* the dump is written thread by thread */
    for (int i = 0; i < 100 && loop < 0; i++, usleep(100000))
        ir = cg_total(tmp, &loop, path, sizeof path);
    stop(proxy);
    if (ir < 0 || loop < 0) {
        fprintf(stderr, "bench_proxy: no callgrind dump in %s\n", tmp);
        return 1;
    }
    printf("bench_proxy --instructions: %d requests on one keep-alive connection (after %d "
           "warm), capture on, fixed upstream, embedded broker, spool drained\n",
           n, warm);
    printf("proxy instructions per request (Ir): %.0f all threads; %.0f the event loop, %.0f "
           "the others (spool publisher, librdkafka: their batches depend on timing)\n",
           ir / n, loop / n, (ir - loop) / n);
    printf("the loop's top functions by inclusive cost (%s):\n", path);
    char cmd[1400];
    snprintf(cmd, sizeof cmd,
             "callgrind_annotate --inclusive=yes --threshold=99 '%s' 2>/dev/null | "
             "grep -E '^ *[0-9,]+ \\(' | head -40",
             path);
    fflush(stdout);
    if (system(cmd)) {
    }
    return 0;
}

static void report(const char *name, const wrk_result *r, const wrk_result *direct)
{
    printf("%-10s %10.0f req/s   p50 %7.3f ms   p99 %7.3f ms", name, r->rps, r->p50_ms, r->p99_ms);
    if (direct != r)
        printf("   added p50 %+7.3f ms   added p99 %+7.3f ms", r->p50_ms - direct->p50_ms,
               r->p99_ms - direct->p99_ms);
    if (r->non2xx) printf("   (%ld non-2xx!)", r->non2xx);
    printf("\n");
}

/* One wrk pass with the CPU each side spent on it. */
static void pass(const char *url, const char *lua, int threads, int conns, int dur, cpu_probe *p,
                 wrk_result *r, const char *name)
{
    probe_start(p);
    if (run_wrk(url, lua, threads, conns, dur, r)) fprintf(stderr, "wrk %s failed\n", name);
    probe_end(p, r->requests, &r->cpu_up, &r->cpu_px, &r->cpu_bk);
}

static void report_cpu(const char *name, const wrk_result *r)
{
    printf("  %-10s upstream %5.1f", name, r->cpu_up);
    if (r->cpu_px > 0) printf("   proxy %5.1f", r->cpu_px);
    if (r->cpu_bk > 0) printf("   broker %5.1f", r->cpu_bk);
    printf("   total (without wrk) %5.1f\n", r->cpu_up + r->cpu_px + r->cpu_bk);
}

int main(int argc, char **argv)
{
    int dur = 10, conns = 64, threads = 2;
    const char *proxy_extra[8] = {0};
    const char *upstream = "fixed";
    int n_extra = 0, with_kafka = 1, instructions = 0;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--duration"))
            dur = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--proxy-arg") && n_extra < 7)
            proxy_extra[n_extra++] = argv[i + 1];
        else if (!strcmp(argv[i], "--connections"))
            conns = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--instructions"))
            instructions = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--threads"))
            threads = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--kafka") &&
                 (!strcmp(argv[i + 1], "on") || !strcmp(argv[i + 1], "off")))
            with_kafka = !strcmp(argv[i + 1], "on");
        else if (!strcmp(argv[i], "--upstream") &&
                 (!strcmp(argv[i + 1], "fixed") || !strcmp(argv[i + 1], "test")))
            upstream = argv[i + 1];
        else {
            fprintf(stderr, "usage: bench_proxy [--duration S] [--connections N] [--threads T] "
                            "[--upstream fixed|test] [--kafka on|off] [--instructions N] "
                            "[--proxy-arg ARG]...\n");
            return 2;
        }
    }
    if (argc % 2 == 0) {
        fprintf(stderr, "bench_proxy: %s needs a value\n", argv[argc - 1]);
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    char tmp[256];
    snprintf(tmp, sizeof tmp, "/tmp/arclight-bench-proxy-XXXXXX");
    if (!mkdtemp(tmp)) return 1;
    chmod(tmp, 0755);

    fake_upstream *tu = fake_upstream_start(0, 1);
    if (!tu) return 1;
    fixed_up *fu = NULL;
    int up = fake_upstream_port(tu);
    if (!strcmp(upstream, "fixed")) {
        if (!(fu = fixed_up_start(up))) return 1;
        fake_upstream_stop(tu); /* its answers are taken; it must not run alongside */
        tu = NULL;
        up = fu->port;
    }
    al_test_broker b;
    if (al_test_broker_start(&b, NULL) != 0) return 1;

    /* wrk's request: a small chat completion */
    char lua[400], path[600];
    snprintf(lua, sizeof lua, "%s/post.lua", tmp);
    FILE *f = fopen(lua, "w");
    fprintf(f, "wrk.method = \"POST\"\n"
               "wrk.body = '{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"What "
               "is 2+2?\"}]}'\n"
               "wrk.headers[\"Content-Type\"] = \"application/json\"\n");
    fclose(f);

    /* nginx, one worker like the one-thread proxy */
    int nport = free_port();
    snprintf(path, sizeof path, "%s/nginx.conf", tmp);
    f = fopen(path, "w");
    fprintf(
        f,
        "%sworker_processes 1;\nerror_log %s/nginx.err warn;\npid %s/nginx.pid;\n"
        "events { worker_connections 4096; }\n"
        "http {\n  access_log off;\n  client_body_temp_path %s/cb;\n  proxy_temp_path %s/pt;\n"
        "  fastcgi_temp_path %s/ft;\n  uwsgi_temp_path %s/ut;\n  scgi_temp_path %s/st;\n"
        "  upstream up { server 127.0.0.1:%d; keepalive 128; }\n"
        "  server {\n    listen 127.0.0.1:%d;\n    location / {\n      proxy_pass http://up;\n"
        "      proxy_http_version 1.1;\n      proxy_set_header Connection \"\";\n    }\n  }\n}\n",
        geteuid() == 0 ? "user root;\n" : "", tmp, tmp, tmp, tmp, tmp, tmp, tmp, up, nport);
    fclose(f);
    char nlog[600];
    snprintf(nlog, sizeof nlog, "%s/nginx.out", tmp);
    const char *nargv[] = {"nginx", "-p", tmp, "-c", path, "-g", "daemon off;", NULL};
    pid_t nginx = spawn(nargv, nlog, NULL);

    /* arclight proxy, capture on */
    char spool[600], plog[600], upurl[64];
    snprintf(spool, sizeof spool, "%s/spool", tmp);
    snprintf(plog, sizeof plog, "%s/proxy.log", tmp);
    snprintf(upurl, sizeof upurl, "http://127.0.0.1:%d", up);
    const char *pargv[32] = {al_test_bin(),
                             "proxy",
                             "--listen",
                             "127.0.0.1:0",
                             "--upstream",
                             upurl,
                             "--bootstrap",
                             b.bootstrap,
                             "--spool-dir",
                             spool,
                             "--no-access-log",
                             "--log-level",
                             "warn",
                             "--max-connections",
                             "4096"};
    for (int i = 0; i < n_extra; i++)
        pargv[15 + i] = proxy_extra[i];
    if (instructions > 0) {
        stop(nginx);
        int rc = instructions_mode(pargv, tmp, instructions);
        al_test_broker_stop(&b);
        fixed_up_stop(fu);
        if (tu) fake_upstream_stop(tu);
        return rc;
    }
    int pfd;
    pid_t proxy = spawn(pargv, plog, &pfd);
    char line[128];
    if (al_test_broker_readline(pfd, line, sizeof line, 30000) != 0) {
        fprintf(stderr, "bench_proxy: arclight proxy did not start (see %s)\n", plog);
        return 1;
    }
    close(pfd);
    int pport = atoi(strrchr(line, ':') + 1);
    usleep(300000); /* nginx up */
    cpu_probe pd = {0}, pn = {child_of(nginx), 0, 0, 0, 0}, pa = {proxy, b.pid, 0, 0, 0};

    char url[128], aurl[128], nurl[128];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/v1/chat/completions", up);
    snprintf(nurl, sizeof nurl, "http://127.0.0.1:%d/v1/chat/completions", nport);
    wrk_result direct, ngx, arc;
    printf("bench_proxy: wrk -t%d -c%d -d%ds, POST /v1/chat/completions (fixed answer), loopback, "
           "upstream: %s\n",
           threads, conns, dur,
           fu ? "fixed (the same bytes per request kind)" : "test (tests/fake_upstream.c)");
    run_wrk(url, lua, threads, conns, 2, &direct); /* warm-up */
    pass(url, lua, threads, conns, dur, &pd, &direct, "direct");
    run_wrk(nurl, lua, threads, conns, 2, &ngx);
    pass(nurl, lua, threads, conns, dur, &pn, &ngx, "nginx");
    snprintf(aurl, sizeof aurl, "http://127.0.0.1:%d/r/bench/rollout-1/v1/chat/completions", pport);
    run_wrk(aurl, lua, threads, conns, 2, &arc);
    /* where the time goes in the saturated pass: the proxy's threads, the machine's cores */
    thread_cpu tb[64], ta[64];
    int ntb = threads_of(proxy, tb, 64);
    double busy0, total0, busy1, total1, run0, wait0, run1, wait1;
    machine_jiffies(&busy0, &total0);
    sched_ns(proxy, (int)proxy, &run0, &wait0);
    double w0 = now_s();
    pass(aurl, lua, threads, conns, dur, &pa, &arc, "arclight");
    double wall = now_s() - w0;
    machine_jiffies(&busy1, &total1);
    sched_ns(proxy, (int)proxy, &run1, &wait1);
    int nta = threads_of(proxy, ta, 64);
    report("direct", &direct, &direct);
    report("nginx", &ngx, &direct);
    report("arclight", &arc, &direct);
    printf("CPU per request (µs, all processes but wrk):\n");
    report_cpu("direct", &direct);
    report_cpu("nginx", &ngx);
    report_cpu("arclight", &arc);
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    printf("arclight pass, %ld cores %.0f %% busy; the proxy's threads (%% of one core):", ncpu,
           total1 > total0 ? 100.0 * (busy1 - busy0) / (total1 - total0) : 0.0);
    for (int i = 0; i < nta; i++) {
        double before = 0;
        for (int j = 0; j < ntb; j++)
            if (tb[j].tid == ta[i].tid) before = tb[j].s;
        double pct = wall > 0 ? 100.0 * (ta[i].s - before) / wall : 0;
        if (pct >= 0.5) printf("  %s %.0f", ta[i].tid == proxy ? "loop" : ta[i].name, pct);
    }
    printf("\n  the loop thread ran %.0f %% of the pass and waited for a CPU %.0f %% (runnable, "
           "not running)\n",
           wall > 0 ? (run1 - run0) / 1e9 / wall * 100 : 0.0,
           wall > 0 ? (wait1 - wait0) / 1e9 / wall * 100 : 0.0);
    printf("  (one loop thread serves every agent connection: its share of a core is the "
           "proxy's ceiling; the rest of the machine runs wrk, the upstream and the broker)\n");

    /* 4 connections flat out: a few agents, each waiting for its answer */
    wrk_result d4, n4, a4;
    pass(url, lua, 2, 4, dur, &pd, &d4, "direct");
    pass(nurl, lua, 2, 4, dur, &pn, &n4, "nginx");
    snprintf(aurl, sizeof aurl, "http://127.0.0.1:%d/r/bench/rollout-4/v1/chat/completions", pport);
    pass(aurl, lua, 2, 4, dur, &pa, &a4, "arclight");
    printf("4 connections (wrk -t2 -c4 -d%ds):\n", dur);
    report("direct", &d4, &d4);
    report("nginx", &n4, &d4);
    report("arclight", &a4, &d4);

    /* 64 connections at a fixed ~4000 req/s (each waits 16 ms between requests), below
     * every path's capacity: latency without queueing in a saturated proxy */
    char lua_rate[400];
    snprintf(lua_rate, sizeof lua_rate, "%s/post_rate.lua", tmp);
    f = fopen(lua_rate, "w");
    fprintf(f, "wrk.method = \"POST\"\n"
               "wrk.body = '{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"What "
               "is 2+2?\"}]}'\n"
               "wrk.headers[\"Content-Type\"] = \"application/json\"\n"
               "function delay() return 16 end\n");
    fclose(f);
    wrk_result dr, nr, ar;
    pass(url, lua_rate, threads, conns, dur, &pd, &dr, "direct");
    pass(nurl, lua_rate, threads, conns, dur, &pn, &nr, "nginx");
    snprintf(aurl, sizeof aurl, "http://127.0.0.1:%d/r/bench/rollout-3/v1/chat/completions", pport);
    pass(aurl, lua_rate, threads, conns, dur, &pa, &ar, "arclight");
    printf("%d connections at a fixed rate (16 ms between requests per connection):\n", conns);
    report("direct", &dr, &dr);
    report("nginx", &nr, &dr);
    report("arclight", &ar, &dr);

    /* one connection: no queueing, so the added latency is each proxy's own path */
    wrk_result d1, n1, a1;
    int d1s = dur < 5 ? dur : 5;
    pass(url, lua, 1, 1, d1s, &pd, &d1, "direct");
    pass(nurl, lua, 1, 1, d1s, &pn, &n1, "nginx");
    snprintf(aurl, sizeof aurl, "http://127.0.0.1:%d/r/bench/rollout-2/v1/chat/completions", pport);
    pass(aurl, lua, 1, 1, d1s, &pa, &a1, "arclight");
    printf("one connection (wrk -t1 -c1 -d%ds):\n", d1s);
    report("direct", &d1, &d1);
    report("nginx", &n1, &d1);
    report("arclight", &a1, &d1);
    printf("ratio: arclight / nginx throughput = %.2f at %d connections (target >= 1.00), %.2f at "
           "4 (target >= 0.80); arclight added p99: %.3f ms at %d connections, %.3f ms at 4, "
           "%.3f ms at %.0f req/s, %.3f ms on one connection (target <= 0.5 ms each; nginx: "
           "%.3f, %.3f, %.3f, %.3f ms)\n",
           ngx.rps > 0 ? arc.rps / ngx.rps : 0.0, conns, n4.rps > 0 ? a4.rps / n4.rps : 0.0,
           arc.p99_ms - direct.p99_ms, conns, a4.p99_ms - d4.p99_ms, ar.p99_ms - dr.p99_ms, ar.rps,
           a1.p99_ms - d1.p99_ms, ngx.p99_ms - direct.p99_ms, n4.p99_ms - d4.p99_ms,
           nr.p99_ms - dr.p99_ms, n1.p99_ms - d1.p99_ms);

    if (with_kafka) {
        /* spans/s into each broker: the embedded one through this proxy, then Apache Kafka
         * through a second proxy with the same flags */
        wrk_result se, sk;
        long ne, nk;
        double de, dk;
        double re = spans_pass(pport, b.bootstrap, lua, threads, conns, dur, "rollout-5", &se,
                               &ne, &de);
        stop(proxy);
        proxy = 0;
        al_test_broker bk;
        setenv("ARCLIGHT_TEST_BROKER", "kafka", 1);
        if (al_test_broker_start(&bk, NULL) != 0) return 1;
        char spool2[700], plog2[700];
        snprintf(spool2, sizeof spool2, "%s/spool-kafka", tmp);
        snprintf(plog2, sizeof plog2, "%s/proxy-kafka.log", tmp);
        pargv[7] = bk.bootstrap;
        pargv[9] = spool2;
        pid_t proxy2 = spawn(pargv, plog2, &pfd);
        if (al_test_broker_readline(pfd, line, sizeof line, 60000) != 0) {
            fprintf(stderr, "bench_proxy: arclight proxy on Kafka did not start (see %s)\n",
                    plog2);
            return 1;
        }
        close(pfd);
        int pport2 = atoi(strrchr(line, ':') + 1);
        snprintf(aurl, sizeof aurl, "http://127.0.0.1:%d/r/bench/rollout-6/v1/chat/completions",
                 pport2);
        run_wrk(aurl, lua, threads, conns, 2, &sk); /* warm-up: connections, producer id */
        while (spool_spans(pport2) > 0)
            usleep(100000);
        double rk = spans_pass(pport2, bk.bootstrap, lua, threads, conns, dur, "rollout-7", &sk,
                               &nk, &dk);
        stop(proxy2);
        al_test_broker_stop(&bk);
        printf("spans/s into the broker (wrk -t%d -c%d -d%ds, until the spool is empty):\n",
               threads, conns, dur);
        printf("  embedded broker  %8.0f spans/s  (%ld spans, %.0f req/s, spool empty %.1f s "
               "after wrk)\n",
               re, ne, se.rps, de);
        printf("  Apache Kafka     %8.0f spans/s  (%ld spans, %.0f req/s, spool empty %.1f s "
               "after wrk)\n",
               rk, nk, sk.rps, dk);
        printf("ratio: spans/s into Kafka / into the embedded broker = %.2f; Kafka pass / nginx "
               "throughput = %.2f\n",
               re > 0 ? rk / re : 0.0, ngx.rps > 0 ? sk.rps / ngx.rps : 0.0);
    }
    stop(proxy);
    stop(nginx);
    al_test_broker_stop(&b);
    if (tu) fake_upstream_stop(tu);
    fixed_up_stop(fu);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
    if (system(cmd)) {
    }
    return 0;
}
