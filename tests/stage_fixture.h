/*
 * stage_fixture.h: what the stage tests (0901 batch, 1201/1202 train) share to drive the
 * `arclight` binary as a child process: start it with a few environment changes, and wait
 * for it with a deadline. Header-only, like broker_fixture.h; include testlib.h first.
 */
#ifndef ARCLIGHT_TEST_STAGE_FIXTURE_H
#define ARCLIGHT_TEST_STAGE_FIXTURE_H

#include "testlib.h"

#include <arpa/inet.h>
#include <math.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

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

#endif
