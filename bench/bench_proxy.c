/*
 * bench_proxy: what the capture proxy costs, against nginx in the same run. One fast
 * upstream (tests/fake_upstream.c answering a fixed chat completion), then wrk at 64
 * connections on loopback three ways:
 *   direct     wrk -> upstream
 *   nginx      wrk -> nginx proxy_pass (1 worker, keepalive upstream, access log off)
 *   arclight   wrk -> arclight proxy (capture on: token ids + logprobs asked, stripped,
 *              one span per call through the spool to the embedded broker)
 * and prints requests/s, p50/p99 and what each proxy adds to the direct p50/p99, with
 * arclight's throughput as a ratio of nginx's.
 *
 *   build/bench_proxy [--duration S] [--connections N] [--threads T] [--proxy-arg ARG]...
 * Needs wrk and nginx on PATH and the arclight binary ($ARCLIGHT_BIN, else
 * ./build/arclight).
 */
#define _GNU_SOURCE
#include "broker_fixture.h"
#include "fake_upstream.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

typedef struct wrk_result {
    double rps, p50_ms, p99_ms;
    long non2xx;
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
    }
    return pclose(f) == 0 && r->rps > 0 ? 0 : -1;
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

static void report(const char *name, const wrk_result *r, const wrk_result *direct)
{
    printf("%-10s %10.0f req/s   p50 %7.3f ms   p99 %7.3f ms", name, r->rps, r->p50_ms, r->p99_ms);
    if (direct != r)
        printf("   added p50 %+7.3f ms   added p99 %+7.3f ms", r->p50_ms - direct->p50_ms,
               r->p99_ms - direct->p99_ms);
    if (r->non2xx) printf("   (%ld non-2xx!)", r->non2xx);
    printf("\n");
}

int main(int argc, char **argv)
{
    int dur = 10, conns = 64, threads = 2;
    const char *proxy_extra[8] = {0};
    int n_extra = 0;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--duration"))
            dur = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--proxy-arg") && n_extra < 7)
            proxy_extra[n_extra++] = argv[i + 1];
        else if (!strcmp(argv[i], "--connections"))
            conns = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--threads"))
            threads = atoi(argv[i + 1]);
        else {
            fprintf(stderr, "usage: bench_proxy [--duration S] [--connections N] [--threads T] "
                            "[--proxy-arg ARG]...\n");
            return 2;
        }
    }
    signal(SIGPIPE, SIG_IGN);
    char tmp[256];
    snprintf(tmp, sizeof tmp, "/tmp/arclight-bench-proxy-XXXXXX");
    if (!mkdtemp(tmp)) return 1;
    chmod(tmp, 0755);

    fake_upstream *u = fake_upstream_start(0, 1);
    if (!u) return 1;
    int up = fake_upstream_port(u);
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

    char url[128];
    wrk_result direct, ngx, arc;
    printf("bench_proxy: wrk -t%d -c%d -d%ds, POST /v1/chat/completions (fixed answer), loopback\n",
           threads, conns, dur);
    snprintf(url, sizeof url, "http://127.0.0.1:%d/v1/chat/completions", up);
    run_wrk(url, lua, threads, conns, 2, &direct); /* warm-up */
    if (run_wrk(url, lua, threads, conns, dur, &direct)) fprintf(stderr, "wrk direct failed\n");
    snprintf(url, sizeof url, "http://127.0.0.1:%d/v1/chat/completions", nport);
    run_wrk(url, lua, threads, conns, 2, &ngx);
    if (run_wrk(url, lua, threads, conns, dur, &ngx))
        fprintf(stderr, "wrk nginx failed (see %s)\n", tmp);
    snprintf(url, sizeof url, "http://127.0.0.1:%d/r/bench/rollout-1/v1/chat/completions", pport);
    run_wrk(url, lua, threads, conns, 2, &arc);
    if (run_wrk(url, lua, threads, conns, dur, &arc)) fprintf(stderr, "wrk arclight failed\n");
    report("direct", &direct, &direct);
    report("nginx", &ngx, &direct);
    report("arclight", &arc, &direct);

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
    snprintf(url, sizeof url, "http://127.0.0.1:%d/v1/chat/completions", up);
    run_wrk(url, lua_rate, threads, conns, dur, &dr);
    snprintf(url, sizeof url, "http://127.0.0.1:%d/v1/chat/completions", nport);
    run_wrk(url, lua_rate, threads, conns, dur, &nr);
    snprintf(url, sizeof url, "http://127.0.0.1:%d/r/bench/rollout-3/v1/chat/completions", pport);
    run_wrk(url, lua_rate, threads, conns, dur, &ar);
    printf("%d connections at a fixed rate (16 ms between requests per connection):\n", conns);
    report("direct", &dr, &dr);
    report("nginx", &nr, &dr);
    report("arclight", &ar, &dr);

    /* one connection: no queueing, so the added latency is each proxy's own path */
    wrk_result d1, n1, a1;
    int d1s = dur < 5 ? dur : 5;
    snprintf(url, sizeof url, "http://127.0.0.1:%d/v1/chat/completions", up);
    run_wrk(url, lua, 1, 1, d1s, &d1);
    snprintf(url, sizeof url, "http://127.0.0.1:%d/v1/chat/completions", nport);
    run_wrk(url, lua, 1, 1, d1s, &n1);
    snprintf(url, sizeof url, "http://127.0.0.1:%d/r/bench/rollout-2/v1/chat/completions", pport);
    run_wrk(url, lua, 1, 1, d1s, &a1);
    printf("one connection (wrk -t1 -c1 -d%ds):\n", d1s);
    report("direct", &d1, &d1);
    report("nginx", &n1, &d1);
    report("arclight", &a1, &d1);
    printf("ratio: arclight / nginx throughput at %d connections = %.2f (target >= 0.80); "
           "arclight added p99: %.3f ms saturated, %.3f ms at %.0f req/s, %.3f ms on one "
           "connection (target <= 1 ms)\n",
           conns, ngx.rps > 0 ? arc.rps / ngx.rps : 0.0, arc.p99_ms - direct.p99_ms,
           ar.p99_ms - dr.p99_ms, ar.rps, a1.p99_ms - d1.p99_ms);

    stop(proxy);
    stop(nginx);
    al_test_broker_stop(&b);
    fake_upstream_stop(u);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
    if (system(cmd)) {
    }
    return 0;
}
