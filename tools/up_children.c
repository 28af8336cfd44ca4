/*
 * up_children.c: arclight up's children (see up_children.h). Each child runs in its own
 * process group (so that a terminal's Ctrl-C reaches the supervisor alone and the stop order
 * holds) and gets SIGTERM if the supervisor dies. Its stdout and stderr come back through
 * pipes and are repeated line by line on ours, prefixed with its name; signals wake the one
 * poll through a self-pipe.
 */
#define _GNU_SOURCE /* pipe2 */
#include "up_children.h"

#include "core/log.h"
#include "core/util.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#define COMP "up"

static int up_sigpipe[2] = {-1, -1};
static volatile sig_atomic_t up_got_signal;

static void up_on_signal(int sig)
{
    int saved = errno;
    if (sig == SIGINT || sig == SIGTERM) up_got_signal = sig;
    char c = (char)sig;
    if (write(up_sigpipe[1], &c, 1) < 0) { /* full pipe: a wakeup is already pending */
    }
    errno = saved;
}

/* Prints one child line with the child's name in front; one fprintf so that lines of
 * different children never interleave. */
static void up_emit(const up_child *k, FILE *to, const char *line, size_t n)
{
    fprintf(to, "%-6s| %.*s\n", k->name, (int)n, line);
    fflush(to);
}

/* Reads what is available on one stream and prints complete lines; at EOF prints the rest
 * and closes the descriptor. The first stdout line is kept (servers print their address). */
static void up_stream_read(up_child *k, up_stream *s)
{
    ssize_t r = read(s->fd, s->buf + s->len, sizeof s->buf - s->len);
    if (r < 0 && (errno == EAGAIN || errno == EINTR)) return;
    if (r <= 0) {
        if (s->len) up_emit(k, s->to, s->buf, s->len);
        s->len = 0;
        close(s->fd);
        s->fd = -1;
        return;
    }
    s->len += (size_t)r;
    size_t start = 0;
    for (size_t i = 0; i < s->len; i++) {
        if (s->buf[i] != '\n') continue;
        size_t n = i - start;
        if (n && s->buf[start + n - 1] == '\r') n--;
        if (s == &k->out && !k->got_first_line) {
            snprintf(k->first_line, sizeof k->first_line, "%.*s", (int)n, s->buf + start);
            k->got_first_line = 1;
        }
        up_emit(k, s->to, s->buf + start, n);
        start = i + 1;
    }
    if (start == 0 && s->len == sizeof s->buf) { /* a line longer than the buffer: cut it */
        up_emit(k, s->to, s->buf, s->len);
        s->len = 0;
    } else if (start) {
        memmove(s->buf, s->buf + start, s->len - start);
        s->len -= start;
    }
}

/* Reaps every exited child (without blocking) and records its status. */
static void up_reap(up_state *st)
{
    for (;;) {
        int status;
        pid_t p = waitpid(-1, &status, WNOHANG);
        if (p <= 0) return;
        for (int i = 0; i < st->nkids; i++) {
            if (st->kids[i].pid != p) continue;
            st->kids[i].running = 0;
            st->kids[i].status = status;
        }
    }
}

/* Waits up to timeout_ms for output or a signal, prints child lines, reaps children. */
void up_pump(up_state *st, int timeout_ms)
{
    struct pollfd pfd[1 + 2 * UP_MAX_CHILDREN];
    up_stream *who[1 + 2 * UP_MAX_CHILDREN];
    up_child *owner[1 + 2 * UP_MAX_CHILDREN];
    int n = 0;
    pfd[n].fd = up_sigpipe[0];
    pfd[n].events = POLLIN;
    who[n] = NULL, owner[n] = NULL;
    n++;
    for (int i = 0; i < st->nkids; i++) {
        up_child *k = &st->kids[i];
        up_stream *ss[2] = {&k->out, &k->err};
        for (int j = 0; j < 2; j++) {
            if (ss[j]->fd < 0) continue;
            pfd[n].fd = ss[j]->fd;
            pfd[n].events = POLLIN;
            who[n] = ss[j], owner[n] = k;
            n++;
        }
    }
    int r = poll(pfd, (nfds_t)n, timeout_ms);
    if (r > 0) {
        if (pfd[0].revents) {
            char drain[64];
            while (read(up_sigpipe[0], drain, sizeof drain) > 0) {
            }
        }
        for (int i = 1; i < n; i++)
            if (pfd[i].revents) up_stream_read(owner[i], who[i]);
    }
    if (up_got_signal && !st->stop_requested) {
        st->stop_requested = 1;
        st->stop_signal = up_got_signal;
    }
    up_reap(st);
}

/* Forks and execs the child into slot k (filled on success). 0 or -1 (logged). */
static int up_spawn_into(up_state *st, up_child *k, const char *name, char **argv,
                         char **env_extra)
{
    int po[2], pe[2];
    if (pipe2(po, O_CLOEXEC) < 0) {
        al_log_error(COMP, "%s: pipe: %s", name, strerror(errno));
        return -1;
    }
    if (pipe2(pe, O_CLOEXEC) < 0) {
        al_log_error(COMP, "%s: pipe: %s", name, strerror(errno));
        close(po[0]), close(po[1]);
        return -1;
    }
    pid_t parent = getpid();
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) {
        al_log_error(COMP, "%s: fork: %s", name, strerror(errno));
        close(po[0]), close(po[1]), close(pe[0]), close(pe[1]);
        return -1;
    }
    if (pid == 0) {
        setpgid(0, 0);
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        if (getppid() != parent) _exit(1); /* the supervisor died before prctl */
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        signal(SIGINT, SIG_DFL), signal(SIGTERM, SIG_DFL), signal(SIGCHLD, SIG_DFL);
        signal(SIGPIPE, SIG_DFL);
        dup2(po[1], 1);
        dup2(pe[1], 2);
        for (char **e = env_extra; e && *e; e++)
            putenv(*e);
        if (argv[0]) {
            execvp(argv[0], argv);
        } else {
            argv[0] = (char *)"arclight";
            execv(st->self_exe, argv);
        }
        dprintf(2, "cannot run %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    setpgid(pid, pid); /* both sides set it: no race with an early kill(-pid) */
    close(po[1]);
    close(pe[1]);
    fcntl(po[0], F_SETFL, O_NONBLOCK);
    fcntl(pe[0], F_SETFL, O_NONBLOCK);
    char keep[sizeof k->name];
    snprintf(keep, sizeof keep, "%s", name);
    memset(k, 0, sizeof *k);
    snprintf(k->name, sizeof k->name, "%s", keep);
    k->pid = pid;
    k->running = 1;
    k->out.fd = po[0], k->out.to = stdout;
    k->err.fd = pe[0], k->err.to = stderr;
    al_log_info(COMP, "started %s (pid %d)", keep, (int)pid);
    return 0;
}

/* Starts a child: argv[0] NULL means the arclight binary itself with argv[1..] as its
 * arguments; otherwise argv is run as given (execvp). env_extra: NULL-terminated
 * "NAME=value" strings added to the child's environment. Returns the child or NULL with
 * the reason logged. */
up_child *up_spawn(up_state *st, const char *name, char **argv, char **env_extra)
{
    if (st->nkids == UP_MAX_CHILDREN) {
        al_log_error(COMP, "%s: more than %d children", name, UP_MAX_CHILDREN);
        return NULL;
    }
    up_child *k = &st->kids[st->nkids];
    if (up_spawn_into(st, k, name, argv, env_extra) < 0) return NULL;
    st->nkids++;
    return k;
}

/* Starts a reaped child again in its slot, after printing what its pipes still held. 0 or -1
 * (logged). */
int up_respawn(up_state *st, up_child *k, char **argv, char **env_extra)
{
    if (k->running) return -1;
    if (k->out.fd >= 0) up_stream_read(k, &k->out);
    if (k->err.fd >= 0) up_stream_read(k, &k->err);
    if (k->out.fd >= 0) close(k->out.fd), k->out.fd = -1;
    if (k->err.fd >= 0) close(k->err.fd), k->err.fd = -1;
    return up_spawn_into(st, k, k->name, argv, env_extra);
}

/* Describes how a reaped child ended ("exited with status 1", "killed by signal 9"). */
const char *up_describe(const up_child *k, char *buf, size_t len)
{
    if (WIFEXITED(k->status))
        snprintf(buf, len, "exited with status %d", WEXITSTATUS(k->status));
    else if (WIFSIGNALED(k->status))
        snprintf(buf, len, "was killed by signal %d (%s)", WTERMSIG(k->status),
                 strsignal(WTERMSIG(k->status)));
    else
        snprintf(buf, len, "ended (status 0x%x)", k->status);
    return buf;
}

/* Waits until the child printed its first stdout line. 0 when it did; -1 when it died,
 * a stop was requested or timeout_s passed (the reason logged). */
int up_wait_first_line(up_state *st, up_child *k, int timeout_s)
{
    int64_t deadline = al_mono_us() + (int64_t)timeout_s * 1000000;
    while (!k->got_first_line) {
        if (st->stop_requested) return -1;
        if (!k->running && k->out.fd < 0) {
            char why[96];
            al_log_error(COMP, "%s %s before it was ready", k->name,
                         up_describe(k, why, sizeof why));
            return -1;
        }
        for (int i = 0; i < st->nkids; i++) {
            up_child *o = &st->kids[i];
            if (o == k || o->running || !strcmp(o->name, "model")) continue;
            char why[96];
            al_log_error(COMP, "%s (pid %d) %s while %s was starting", o->name, (int)o->pid,
                         up_describe(o, why, sizeof why), k->name);
            return -1;
        }
        if (al_mono_us() > deadline) {
            al_log_error(COMP, "%s printed no address within %d s", k->name, timeout_s);
            return -1;
        }
        up_pump(st, 100);
    }
    return 0;
}

/* Runs a child to completion (model init). 0 when it exited 0. */
int up_run_to_end(up_state *st, up_child *k)
{
    while (k->running || k->out.fd >= 0 || k->err.fd >= 0) {
        if (st->stop_requested) return -1;
        up_pump(st, 100);
    }
    if (WIFEXITED(k->status) && WEXITSTATUS(k->status) == 0) return 0;
    char why[96];
    al_log_error(COMP, "%s %s", k->name, up_describe(k, why, sizeof why));
    return -1;
}

/* Stops one child: SIGTERM to its process group, SIGKILL after timeout_s, and waits until
 * it is reaped and its output drained. */
static void up_stop_child(up_state *st, up_child *k, int timeout_s)
{
    if (!k->pid) return;
    if (k->running) {
        kill(-k->pid, SIGTERM);
        int64_t deadline = al_mono_us() + (int64_t)timeout_s * 1000000;
        while (k->running && al_mono_us() < deadline)
            up_pump(st, 50);
        if (k->running) {
            al_log_warn(COMP, "%s did not stop within %d s of SIGTERM; killing it", k->name,
                        timeout_s);
            kill(-k->pid, SIGKILL);
            while (k->running)
                up_pump(st, 50);
        }
    }
    /* What is left in the group (the agent's own children) goes too. */
    kill(-k->pid, SIGKILL);
    int64_t drain_until = al_mono_us() + 2000000;
    while ((k->out.fd >= 0 || k->err.fd >= 0) && al_mono_us() < drain_until)
        up_pump(st, 50);
    if (k->out.fd >= 0) close(k->out.fd), k->out.fd = -1;
    if (k->err.fd >= 0) close(k->err.fd), k->err.fd = -1;
}

/* Stops every child, downstream of the agent first so that in-flight work drains towards a
 * broker that is still there. */
void up_stop_all(up_state *st, int timeout_s)
{
    static const char *order[] = {"rollouts", "agent", "proxy", "credit", "batch",
                                  "train",    "sync",  "serve", "model", "broker"};
    for (size_t o = 0; o < sizeof order / sizeof order[0]; o++)
        for (int i = 0; i < st->nkids; i++) {
            /* "train-1", "serve-0": a replica, stopped with its kind */
            size_t len = strlen(order[o]);
            const char *name = st->kids[i].name;
            if (!strncmp(name, order[o], len) && (!name[len] || name[len] == '-'))
                up_stop_child(st, &st->kids[i], timeout_s);
        }
    for (int i = 0; i < st->nkids; i++)
        up_stop_child(st, &st->kids[i], timeout_s);
}

int up_state_begin(up_state *st)
{
    ssize_t n = readlink("/proc/self/exe", st->self_exe, sizeof st->self_exe - 1);
    if (n <= 0) {
        al_log_error(COMP, "cannot find the arclight binary (/proc/self/exe): %s", strerror(errno));
        return -1;
    }
    st->self_exe[n] = '\0';

    if (pipe2(up_sigpipe, O_CLOEXEC | O_NONBLOCK) < 0) {
        al_log_error(COMP, "pipe: %s", strerror(errno));
        return -1;
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = up_on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGINT, &sa, &st->old_int);
    sigaction(SIGTERM, &sa, &st->old_term);
    sigaction(SIGCHLD, &sa, &st->old_chld);
    return 0;
}

void up_state_end(up_state *st)
{
    sigaction(SIGINT, &st->old_int, NULL);
    sigaction(SIGTERM, &st->old_term, NULL);
    sigaction(SIGCHLD, &st->old_chld, NULL);
    close(up_sigpipe[0]), close(up_sigpipe[1]);
    up_sigpipe[0] = up_sigpipe[1] = -1;
}
