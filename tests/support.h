/*
 * support.h: the test support library, what test files share beside the runner (testlib.h):
 *   temporary directories   al_test_tmpdir makes one, al_test_rmtree removes it again
 *   files                   al_test_slurp / al_test_slurp_text read a whole file
 *   child processes         al_test_spawn starts a stage of the `arclight` binary (or any
 *                           program) that dies with the test, al_test_wait reaps it with a
 *                           deadline; the proxy is started by px_start_proxy
 *                           (t1099_proxy_helpers.h), a broker by broker_fixture.h
 *   topics                  al_test_topic_read (broker_fixture.h: it needs librdkafka, which
 *                           model-only builds lack) reads a topic from the beginning
 *   HTTP and metrics        al_test_free_port, al_test_http_get, al_test_metric (one series
 *                           of a Prometheus text), al_test_metric_at (of a --metrics port)
 * Header-only, like broker_fixture.h; include testlib.h first.
 */
#ifndef ARCLIGHT_TEST_SUPPORT_H
#define ARCLIGHT_TEST_SUPPORT_H

#include "testlib.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <math.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

/* ---- temporary directories and files -------------------------------------------------------- */

/* Makes a fresh directory $TMPDIR/arclight-TAG-XXXXXX (/tmp when TMPDIR is unset or empty)
 * and writes its path into dir (n bytes). dir, or NULL with dir set to "" (like mkdtemp). */
static inline char *al_test_tmpdir(char *dir, size_t n, const char *tag)
{
    const char *t = getenv("TMPDIR");
    snprintf(dir, n, "%s/arclight-%s-XXXXXX", t && *t ? t : "/tmp", tag);
    if (mkdtemp(dir)) return dir;
    dir[0] = '\0';
    return NULL;
}

/* rm -rf path: removes it and everything under it (symbolic links are removed, never
 * followed). 0, or -1 when something could not be removed; "" and a missing path are 0. */
static inline int al_test_rmtree(const char *path)
{
    struct stat st;
    if (!path || !path[0] || lstat(path, &st) != 0) return 0;
    if (!S_ISDIR(st.st_mode)) return unlink(path) == 0 ? 0 : -1;
    int rc = 0;
    DIR *d = opendir(path);
    if (d) {
        struct dirent *e;
        char sub[4096];
        while ((e = readdir(d))) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
            if (snprintf(sub, sizeof sub, "%s/%s", path, e->d_name) >= (int)sizeof sub ||
                al_test_rmtree(sub) != 0)
                rc = -1;
        }
        closedir(d);
    }
    return rmdir(path) == 0 ? rc : -1;
}

/* The whole file at path, NUL-terminated (malloc'd: the caller frees it), its length in
 * *len when len is not NULL. NULL when it cannot be opened or read. */
static inline char *al_test_slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = NULL, chunk[65536];
    size_t n = 0, cap = 0, r;
    int bad = 0;
    while (!bad && (r = fread(chunk, 1, sizeof chunk, f)) > 0) {
        if (n + r + 1 > cap) {
            cap = (n + r + 1) * 2;
            char *nb = realloc(buf, cap);
            if (!nb) {
                bad = 1;
                break;
            }
            buf = nb;
        }
        memcpy(buf + n, chunk, r);
        n += r;
    }
    if (ferror(f)) bad = 1;
    fclose(f);
    if (!bad && !buf) buf = calloc(1, 1);
    if (bad || !buf) {
        free(buf);
        return NULL;
    }
    buf[n] = '\0';
    if (len) *len = n;
    return buf;
}

/* The whole file at path as a string, "" when it is missing (malloc'd either way: free it). */
static inline char *al_test_slurp_text(const char *path)
{
    char *s = al_test_slurp(path, NULL);
    return s ? s : strdup("");
}

/* Rows of a controller's metrics.csv whose version is >= min_version and whose loss column
 * (the 9th) is set, i.e. rows with the trainer's numbers; the highest version into
 * *max_version. -1 when the file cannot be read. */
static inline int al_test_metrics_trained_rows(const char *path, long min_version,
                                               long *max_version)
{
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    char line[1024];
    int n = 0;
    *max_version = -1;
    if (!fgets(line, sizeof line, f)) {
        fclose(f);
        return -1;
    }
    while (fgets(line, sizeof line, f)) {
        long v = strtol(line, NULL, 10);
        const char *c = line;
        for (int i = 0; i < 8 && c; i++)
            c = strchr(c, ','), c = c ? c + 1 : NULL;
        if (v > *max_version) *max_version = v;
        if (v >= min_version && c && *c && *c != ',') n++;
    }
    fclose(f);
    return n;
}

/* ---- child processes ------------------------------------------------------------------------ */

/* Starts argv (argv[0] a path, NULL-terminated) as a child that dies with the test. env
 * (NULL-terminated, may be NULL) is applied in the child only: "NAME=VALUE" sets NAME,
 * a bare "NAME" unsets it. stdout_null sends the child's stdout (--help texts) to
 * /dev/null; stderr stays the test's. Returns the pid (-1 when fork fails). */
static inline pid_t al_test_spawn(const char *const *argv, const char *const *env, int stdout_null)
{
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid != 0) return pid;
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    for (size_t i = 0; env && env[i]; i++) {
        const char *eq = strchr(env[i], '=');
        if (!eq) {
            unsetenv(env[i]);
            continue;
        }
        char name[128];
        snprintf(name, sizeof name, "%.*s", (int)(eq - env[i]), env[i]);
        setenv(name, eq + 1, 1);
    }
    if (stdout_null) {
        int devnull = open("/dev/null", O_WRONLY);
        if (devnull >= 0) dup2(devnull, STDOUT_FILENO);
    }
    execv(argv[0], (char *const *)argv);
    _exit(127);
}

/* Waits for pid up to timeout_s, then SIGKILLs and reaps it: the wait status, or -1 when
 * the deadline passed. */
static inline int al_test_wait(pid_t pid, double timeout_s)
{
    int st = 0;
    double t0 = testlib_now();
    while (waitpid(pid, &st, WNOHANG) != pid) {
        if (testlib_now() - t0 > timeout_s) {
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
            return -1;
        }
        usleep(20000);
    }
    return st;
}

/* ---- HTTP and metrics ----------------------------------------------------------------------- */

/* A free loopback port (bound and released: the stage binds it right after), or -1. */
static inline int al_test_free_port(void)
{
    struct sockaddr_in sin = {.sin_family = AF_INET};
    inet_pton(AF_INET, "127.0.0.1", &sin.sin_addr);
    socklen_t sl = sizeof sin;
    int fd = socket(AF_INET, SOCK_STREAM, 0), port = -1;
    if (fd >= 0 && bind(fd, (struct sockaddr *)&sin, sizeof sin) == 0 &&
        getsockname(fd, (struct sockaddr *)&sin, &sl) == 0)
        port = ntohs(sin.sin_port);
    if (fd >= 0) close(fd);
    return port;
}

/* GET path from 127.0.0.1:port (HTTP/1.0, the whole answer, head included, into buf,
 * NUL-terminated, cut at buflen - 1). 0, or -1 when it cannot connect or send. */
static inline int al_test_http_get(int port, const char *path, char *buf, size_t buflen)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a)) {
        if (fd >= 0) close(fd);
        return -1;
    }
    char req[256];
    int n = snprintf(req, sizeof req, "GET %s HTTP/1.0\r\nHost: x\r\n\r\n", path);
    if (write(fd, req, (size_t)n) != n) {
        close(fd);
        return -1;
    }
    size_t got = 0;
    ssize_t r;
    while (got + 1 < buflen && (r = read(fd, buf + got, buflen - 1 - got)) > 0)
        got += (size_t)r;
    buf[got] = '\0';
    close(fd);
    return 0;
}

/* The value of the metric line of text that starts with `series ` ("name{labels}"); NAN if
 * absent. */
static inline double al_test_metric(const char *text, const char *series)
{
    size_t n = strlen(series);
    for (const char *p = text; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL)
        if (!strncmp(p, series, n) && p[n] == ' ') return atof(p + n + 1);
    return NAN;
}

/* The value of metric series ("name{labels}") on the /metrics page of 127.0.0.1:port; NAN
 * if absent or when the page cannot be read. */
static inline double al_test_metric_at(int port, const char *series)
{
    static char text[1 << 16];
    if (al_test_http_get(port, "/metrics", text, sizeof text) != 0) return NAN;
    return al_test_metric(text, series);
}

#endif
