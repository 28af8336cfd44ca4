/*
 * children.c: the rollout controller's agents, one child process per rollout attempt:
 * `/bin/sh -c AGENT` in a process group of its own, with the rollout's identity in its
 * environment and the task record on stdin; its output read line by line from the loop,
 * its exit reaped (settle.c then decides the outcome), its group killed on a timeout or
 * when the controller stops.
 */
#define _GNU_SOURCE
#include "rollouts/rollouts.h"

#include "rollouts/controller.h"

#include "core/log.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

static void set_nonblock(int fd)
{
    int fl = fcntl(fd, F_GETFL);
    if (fl >= 0) fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

/* The environment of a child: ours with the rollout's variables set over it. The strings
 * live in `store`; the array is malloc'd (NULL when out of memory). */
static char **child_env(const rl_ctl *c, const rl_rollout *r, char *store, size_t storelen)
{
    const rl_task *t = &c->tasks.t[r->task];
    char base[900];
    rl_rollout_base(base, sizeof base, c->o.proxy, r->eval, c->o.eval_temperature, t->key, r->id,
                    r->attempt);
    const char *keys[] = {"OPENAI_BASE_URL",   "ANTHROPIC_BASE_URL", "ARCLIGHT_TASK",
                          "ARCLIGHT_TASK_ID",  "ARCLIGHT_ROLLOUT_ID", "ARCLIGHT_ATTEMPT",
                          "ARCLIGHT_SPLIT",    "ARCLIGHT_REWARD_URL", "ARCLIGHT_PROXY_URL",
                          "ARCLIGHT_MODEL",    "ARCLIGHT_EVAL",       "ARCLIGHT_GROUP_SIZE",
                          "OPENAI_API_KEY",    "ANTHROPIC_API_KEY"};
    size_t nk = AL_ARRAY_LEN(keys), n = 0;
    for (char **e = environ; *e; e++)
        n++;
    char **env = malloc((n + nk + 1) * sizeof *env);
    if (!env) return NULL;
    size_t k = 0, used = 0;
#define PUT(...)                                                                                   \
    do {                                                                                           \
        int w_ = snprintf(store + used, storelen - used, __VA_ARGS__);                             \
        if (w_ < 0 || (size_t)w_ >= storelen - used) {                                             \
            free(env);                                                                             \
            return NULL;                                                                           \
        }                                                                                          \
        env[k++] = store + used;                                                                   \
        used += (size_t)w_ + 1;                                                                    \
    } while (0)
    PUT("OPENAI_BASE_URL=%s/v1", base);
    PUT("ANTHROPIC_BASE_URL=%s", base);
    PUT("ARCLIGHT_TASK=%s", t->record);
    PUT("ARCLIGHT_TASK_ID=%s", t->id);
    PUT("ARCLIGHT_ROLLOUT_ID=%s", r->id);
    PUT("ARCLIGHT_ATTEMPT=%d", r->attempt);
    PUT("ARCLIGHT_SPLIT=%s", t->split == RL_SPLIT_VAL ? "val" : "train");
    PUT("ARCLIGHT_REWARD_URL=%s/reward", base);
    PUT("ARCLIGHT_PROXY_URL=%s", c->o.proxy);
    PUT("ARCLIGHT_MODEL=%s", c->model);
    PUT("ARCLIGHT_EVAL=%d", r->eval);
    PUT("ARCLIGHT_GROUP_SIZE=%d", r->g ? r->g->n : 1);
    /* SDKs refuse to start without a key; the proxy does not need one unless --agent-key */
    const char *ok = getenv("OPENAI_API_KEY"), *ak = getenv("ANTHROPIC_API_KEY");
    PUT("OPENAI_API_KEY=%s", ok && *ok ? ok : "arclight");
    PUT("ANTHROPIC_API_KEY=%s", ak && *ak ? ak : "arclight");
#undef PUT
    for (char **e = environ; *e; e++) {
        int ours = 0;
        for (size_t i = 0; i < nk && !ours; i++) {
            size_t l = strlen(keys[i]);
            ours = !strncmp(*e, keys[i], l) && (*e)[l] == '=';
        }
        if (!ours) env[k++] = *e;
    }
    env[k] = NULL;
    return env;
}

/* Starts rollout r's child. 0, or -1 (logged; the rollout then fails like a crash). */
int rl_child_start(rl_ctl *c, rl_rollout *r)
{
    static char store[1 << 20];
    const rl_task *t = &c->tasks.t[r->task];
    char **env = child_env(c, r, store, sizeof store);
    if (!env) {
        al_log_error(COMP, "rollout %s: the task record is too large for the environment", r->id);
        return -1;
    }
    /* stdin: the task record, from a memory file (a pipe could fill and block us) */
    int in = memfd_create("arclight-task", MFD_CLOEXEC);
    int po[2] = {-1, -1}, pe[2] = {-1, -1};
    size_t len = strlen(t->record);
    if (in < 0 || write(in, t->record, len) != (ssize_t)len || write(in, "\n", 1) != 1 ||
        lseek(in, 0, SEEK_SET) != 0 || pipe2(po, O_CLOEXEC) < 0 || pipe2(pe, O_CLOEXEC) < 0) {
        al_log_error(COMP, "rollout %s: cannot set up the child's stdio: %s", r->id,
                     strerror(errno));
        if (in >= 0) close(in);
        for (int i = 0; i < 2; i++) {
            if (po[i] >= 0) close(po[i]);
            if (pe[i] >= 0) close(pe[i]);
        }
        free(env);
        return -1;
    }
    char *argv[] = {"/bin/sh", "-c", (char *)c->o.agent, NULL};
    pid_t pid = fork();
    if (pid < 0) {
        al_log_error(COMP, "rollout %s: fork: %s", r->id, strerror(errno));
        close(in), close(po[0]), close(po[1]), close(pe[0]), close(pe[1]);
        free(env);
        return -1;
    }
    if (pid == 0) { /* only async-signal-safe calls from here to exec */
        setpgid(0, 0);
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        dup2(in, 0);
        dup2(po[1], 1);
        dup2(pe[1], 2);
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        signal(SIGPIPE, SIG_DFL);
        signal(SIGINT, SIG_DFL);
        signal(SIGTERM, SIG_DFL);
        execve("/bin/sh", argv, env);
        _exit(127);
    }
    setpgid(pid, pid); /* also here: no race with a kill of the group before the child ran */
    free(env);
    close(in);
    close(po[1]);
    close(pe[1]);
    r->fd_out = po[0];
    r->fd_err = pe[0];
    set_nonblock(r->fd_out);
    set_nonblock(r->fd_err);
    r->pid = pid;
    r->on = r->en = 0;
    r->last_line[0] = r->err_tail[0] = '\0';
    r->start_us = al_mono_us();
    r->deadline_us = r->start_us + (int64_t)(c->o.rollout_timeout_s * 1e6);
    r->timed_out = 0;
    r->kill_us = 0;
    c->running++;
    c->n_started++;
    al_log_debug(COMP, "rollout %s (task %s%s, attempt %d) started: pid %d", r->id, t->id,
                 r->eval ? ", eval" : "", r->attempt, (int)pid);
    return 0;
}

/* A complete line of the child's stdout (is_err 0) or stderr (1). */
static void child_line(rl_ctl *c, rl_rollout *r, char *line, int is_err)
{
    size_t n = strlen(line);
    while (n && (line[n - 1] == '\r' || line[n - 1] == ' ')) line[--n] = '\0';
    if (!n) return;
    if (is_err) {
        snprintf(r->err_tail, sizeof r->err_tail, "%s", line);
        if (c->o.quiet_agents)
            al_log_debug(COMP, "%s: %s", r->id, line);
        else
            al_log_info(COMP, "%s: %s", r->id, line);
    } else {
        snprintf(r->last_line, sizeof r->last_line, "%s", line);
        al_log_debug(COMP, "%s> %s", r->id, line);
    }
}

/* Reads what the child wrote; at EOF the fd is closed. */
static void child_read(rl_ctl *c, rl_rollout *r, int is_err)
{
    int *fd = is_err ? &r->fd_err : &r->fd_out;
    char *buf = is_err ? r->ebuf : r->obuf;
    size_t cap = is_err ? sizeof r->ebuf : sizeof r->obuf;
    size_t *n = is_err ? &r->en : &r->on;
    for (;;) {
        if (*n == cap - 1) { /* a line longer than the buffer: keep its end */
            buf[*n] = '\0';
            child_line(c, r, buf, is_err);
            *n = 0;
        }
        ssize_t k = read(*fd, buf + *n, cap - 1 - *n);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
        if (k <= 0) { /* EOF or error: a last unterminated line counts */
            if (*n) {
                buf[*n] = '\0';
                child_line(c, r, buf, is_err);
                *n = 0;
            }
            close(*fd);
            *fd = -1;
            return;
        }
        *n += (size_t)k;
        char *s = buf, *nl;
        while ((nl = memchr(s, '\n', (size_t)(buf + *n - s)))) {
            *nl = '\0';
            child_line(c, r, s, is_err);
            s = nl + 1;
        }
        *n = (size_t)(buf + *n - s);
        memmove(buf, s, *n);
    }
}

/* Reaps exited children; a child counts as finished once its pipes are closed too. */
void rl_children_reap(rl_ctl *c)
{
    for (size_t i = 0; i < c->groups.n; i++) {
        rl_group *g = c->groups.v[i];
        for (int k = 0; k < g->n; k++) {
            rl_rollout *r = g->r[k];
            if (!r->pid) continue;
            int st;
            pid_t w = waitpid(r->pid, &st, WNOHANG);
            if (w != r->pid) continue;
            /* the shell is gone; anything its group left behind goes with it */
            kill(-r->pid, SIGKILL);
            if (r->fd_out >= 0) child_read(c, r, 0);
            if (r->fd_err >= 0) child_read(c, r, 1);
            if (r->fd_out >= 0) close(r->fd_out), r->fd_out = -1;
            if (r->fd_err >= 0) close(r->fd_err), r->fd_err = -1;
            r->pid = 0;
            c->running--;
            rl_rollout_finished(c, r, st);
        }
    }
}

/* Kills the process group of every child past its --rollout-timeout (reaped later). */
void rl_children_check_timeouts(rl_ctl *c)
{
    int64_t now = al_mono_us();
    for (size_t i = 0; i < c->groups.n; i++) {
        rl_group *g = c->groups.v[i];
        for (int k = 0; k < g->n; k++) {
            rl_rollout *r = g->r[k];
            if (r->pid && !r->timed_out && now >= r->deadline_us) {
                r->timed_out = 1;
                kill(-r->pid, SIGKILL);
            }
        }
    }
}

/* Waits for the children's output (read as it comes), a signal (c->sigpipe, drained) or
 * 20 ms. 0, or -1 when out of memory (logged). */
int rl_children_wait(rl_ctl *c)
{
    size_t need = 1 + 2 * (size_t)c->running;
    if (al_vec_grow((void **)&c->pfd, &c->pfd_cap, need, sizeof *c->pfd) ||
        al_vec_grow((void **)&c->pr, &c->pr_cap, need, sizeof *c->pr)) {
        al_log_error(COMP, "out of memory");
        return -1;
    }
    size_t nf = 0;
    c->pfd[nf].fd = c->sigpipe[0];
    c->pfd[nf].events = POLLIN;
    c->pr[nf++] = NULL;
    for (size_t i = 0; i < c->groups.n; i++)
        for (int k = 0; k < c->groups.v[i]->n; k++) {
            rl_rollout *r = c->groups.v[i]->r[k];
            if (!r->pid) continue;
            for (int e = 0; e < 2; e++) {
                int fd = e ? r->fd_err : r->fd_out;
                if (fd < 0 || nf >= c->pfd_cap || nf >= c->pr_cap) continue;
                c->pfd[nf].fd = fd;
                c->pfd[nf].events = POLLIN;
                c->pr[nf++] = r;
            }
        }
    int n = poll(c->pfd, nf, 20);
    if (n > 0) {
        for (size_t i = 1; i < nf; i++)
            if (c->pfd[i].revents) child_read(c, c->pr[i], c->pfd[i].fd == c->pr[i]->fd_err);
        if (c->pfd[0].revents) {
            char buf[64];
            while (read(c->sigpipe[0], buf, sizeof buf) > 0) {
            }
        }
    }
    return 0;
}

/* Stops every running child: SIGTERM to its group, SIGKILL after 3 s; their rollouts end as
 * aborted (posted, best effort: the proxy may be gone too). */
void rl_children_stop(rl_ctl *c)
{
    int any = 0;
    for (size_t i = 0; i < c->groups.n; i++)
        for (int k = 0; k < c->groups.v[i]->n; k++) {
            rl_rollout *r = c->groups.v[i]->r[k];
            if (!r->pid) continue;
            r->killed_for_stop = 1;
            kill(-r->pid, SIGTERM);
            any = 1;
        }
    int64_t until = al_mono_us() + 3000000;
    while (any && c->running > 0 && al_mono_us() < until) {
        rl_children_reap(c);
        usleep(20000);
    }
    for (size_t i = 0; i < c->groups.n; i++)
        for (int k = 0; k < c->groups.v[i]->n; k++)
            if (c->groups.v[i]->r[k]->pid) kill(-c->groups.v[i]->r[k]->pid, SIGKILL);
    while (c->running > 0) {
        rl_children_reap(c);
        if (c->running > 0) usleep(10000);
    }
}
