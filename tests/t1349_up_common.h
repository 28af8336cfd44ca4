/*
 * Helpers of the `arclight up` tests (1300-1349): run a command with its stdout and stderr
 * in files, wait for it with a deadline, read the pids `up` reports for its children.
 */
#ifndef ARCLIGHT_T1349_UP_COMMON_H
#define ARCLIGHT_T1349_UP_COMMON_H

#include "broker_fixture.h"
#include "support.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static inline const char *up_bin(void)
{
    const char *b = getenv("ARCLIGHT_BIN");
    return b && *b ? b : "build/arclight";
}

/* Starts argv with stdout/stderr appended to the two files; returns the pid. */
static inline pid_t up_start(char *const argv[], const char *out_path, const char *err_path)
{
    pid_t pid = fork();
    if (pid == 0) {
        int o = open(out_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        int e = open(err_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (o < 0 || e < 0) _exit(126);
        dup2(o, 1), dup2(e, 2);
        execv(argv[0], argv);
        _exit(127);
    }
    return pid;
}

/* Waits for pid up to timeout_s; returns its wait status, or -1 after killing it (SIGKILL)
 * when the deadline passed. */
static inline int up_wait(pid_t pid, double timeout_s)
{
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        int st;
        pid_t r = waitpid(pid, &st, WNOHANG);
        if (r == pid) return st;
        clock_gettime(CLOCK_MONOTONIC, &t);
        if ((double)(t.tv_sec - t0.tv_sec) + (double)(t.tv_nsec - t0.tv_nsec) / 1e9 > timeout_s) {
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
            return -1;
        }
        usleep(50000);
    }
}

/* Polls the file until it contains needle or timeout_s passes (or pid, if > 0, exits).
 * 1 when found. */
static inline int up_wait_for_text(const char *path, const char *needle, double timeout_s,
                                   pid_t pid)
{
    for (double waited = 0; waited < timeout_s; waited += 0.1) {
        char *s = al_test_slurp_text(path);
        int found = strstr(s, needle) != NULL;
        free(s);
        if (found) return 1;
        if (pid > 0 && waitpid(pid, NULL, WNOHANG) == pid) return 0;
        usleep(100000);
    }
    return 0;
}

/* The pid up reported as "started NAME (pid N)" in its log, or 0. */
static inline pid_t up_child_pid(const char *log, const char *name)
{
    char pat[64];
    snprintf(pat, sizeof pat, "started %s (pid ", name);
    const char *p = strstr(log, pat);
    return p ? (pid_t)atoi(p + strlen(pat)) : 0;
}

/* 1 when no process with this pid exists any more (reaped, not a zombie of anyone). */
static inline int up_pid_gone(pid_t pid)
{
    if (pid <= 0) return 0;
    if (kill(pid, 0) == 0) {
        char buf[512];
        const char *fields = al_test_proc_stat(pid, buf, sizeof buf);
        return !fields || fields[0] == 'Z'; /* a zombie no longer runs */
    }
    return errno == ESRCH;
}

/* Counts lines of a string that contain needle. */
static inline int up_count_lines(const char *s, const char *needle)
{
    int n = 0;
    for (const char *line = s; line && *line;) {
        const char *nl = strchr(line, '\n');
        size_t len = nl ? (size_t)(nl - line) : strlen(line);
        const char *hit = strstr(line, needle);
        if (hit && hit < line + len) n++;
        line = nl ? nl + 1 : NULL;
    }
    return n;
}

#endif
