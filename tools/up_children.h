/*
 * up_children.h: arclight up's children (tools/up_children.c): starting them, repeating their
 * output lines under their names, noticing who ended, stopping them in order. The supervisor
 * (tools/up.c) decides what to start and what an ending means.
 */
#ifndef ARCLIGHT_TOOLS_UP_CHILDREN_H
#define ARCLIGHT_TOOLS_UP_CHILDREN_H

#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <sys/types.h>

enum { UP_MAX_CHILDREN = 32, UP_LINE_MAX = 8192 };

typedef struct up_stream {
    int fd;   /* -1 once at EOF */
    FILE *to; /* stdout or stderr */
    char buf[UP_LINE_MAX];
    size_t len;
} up_stream;

typedef struct up_child {
    char name[16];
    pid_t pid;            /* 0: never started */
    int running;          /* not yet reaped */
    int status;           /* waitpid status once reaped */
    up_stream out, err;   /* its stdout and stderr */
    char first_line[256]; /* first stdout line (a server's bound address) */
    int got_first_line;
} up_child;

typedef struct up_state {
    up_child kids[UP_MAX_CHILDREN];
    int nkids;
    char self_exe[PATH_MAX];
    int stop_requested; /* SIGINT/SIGTERM seen */
    int stop_signal;
    struct sigaction old_int, old_term, old_chld; /* restored by up_state_end */
} up_state;

/* Readies a zeroed st: the arclight binary's path (children run it), the signal pipe and
 * SIGINT/SIGTERM/SIGCHLD handlers (the old ones kept). 0, or -1 with the reason logged. */
int up_state_begin(up_state *st);
/* Restores the signal handlers up_state_begin replaced and closes its pipe. */
void up_state_end(up_state *st);

/* Starts a child: argv[0] NULL means the arclight binary itself with argv[1..] as its
 * arguments; otherwise argv is run as given (execvp). env_extra: NULL-terminated
 * "NAME=value" strings added to the child's environment. Returns the child or NULL with
 * the reason logged. */
up_child *up_spawn(up_state *st, const char *name, char **argv, char **env_extra);
/* Starts a reaped child again in its own slot (same name), as up_spawn does; what is left of
 * its output is printed first. 0, or -1 with the reason logged (the slot keeps the old
 * ending). */
int up_respawn(up_state *st, up_child *k, char **argv, char **env_extra);
/* Waits up to timeout_ms for output or a signal, prints child lines, reaps children. */
void up_pump(up_state *st, int timeout_ms);
/* Describes how a reaped child ended ("exited with status 1", "killed by signal 9"). */
const char *up_describe(const up_child *k, char *buf, size_t len);
/* Waits until the child printed its first stdout line. 0 when it did; -1 when it died,
 * a stop was requested or timeout_s passed (the reason logged). */
int up_wait_first_line(up_state *st, up_child *k, int timeout_s);
/* Runs a child to completion (model init). 0 when it exited 0. */
int up_run_to_end(up_state *st, up_child *k);
/* Stops every child, downstream of the agent first so that in-flight work drains towards a
 * broker that is still there. */
void up_stop_all(up_state *st, int timeout_s);

#endif
