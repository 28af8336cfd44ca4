/*
 * process.c: the process part of the skeleton (process.h): the stop request and its signals,
 * the --metrics server, the failure latch, the drain deadline.
 */
#include "http/process.h"

#include "core/log.h"
#include "core/util.h"

#include <errno.h>
#include <event2/event.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* One skeleton per process: the request is the process's, as the signal disposition is. */
static volatile sig_atomic_t process_stop;
static volatile sig_atomic_t process_wake_fd = -1;

static void process_on_signal(int sig)
{
    int e = errno;
    process_stop = sig;
    if (process_wake_fd >= 0) {
        char c = 1;
        if (write(process_wake_fd, &c, 1) < 0) { /* the loop wakes up anyway */
        }
    }
    errno = e;
}

void al_process_init(al_process *p, const char *comp, const char *health_text, int log_failures)
{
    memset(p, 0, sizeof *p);
    p->comp = comp;
    p->health_text = health_text;
    p->log_failures = log_failures;
    atomic_init(&p->failed, 0);
}

int al_process_metrics_start(al_process *p, const char *hostport, al_metrics *metrics,
                             al_http_health_fn health, void *health_ud)
{
    if (!hostport) return 0;
    char err[1024];
    if (!health) health = al_process_health, health_ud = p;
    p->http = al_http_server_start(hostport, metrics, health, health_ud, err, sizeof err);
    if (!p->http) {
        al_log_error(p->comp, "%s", err);
        return -1;
    }
    return 0;
}

void al_process_metrics_stop(al_process *p)
{
    al_http_server_stop(p->http);
    p->http = NULL;
}

void al_process_catch_signals(int wake_fd)
{
    process_wake_fd = wake_fd;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = process_on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
}

int al_process_stop_requested(void)
{
    return process_stop != 0;
}

int al_process_stop_signal(void)
{
    return process_stop;
}

static void process_on_loop_signal(evutil_socket_t sig, short what, void *arg)
{
    (void)what;
    al_process *p = arg;
    process_stop = (int)sig;
    if (p->on_stop) p->on_stop(p, (int)sig, p->stop_ud);
}

int al_process_signals_on_loop(al_process *p, struct event_base *base, al_process_stop_fn fn,
                               void *ud)
{
    p->on_stop = fn;
    p->stop_ud = ud;
    signal(SIGPIPE, SIG_IGN);
    p->sig[0] = evsignal_new(base, SIGINT, process_on_loop_signal, p);
    p->sig[1] = evsignal_new(base, SIGTERM, process_on_loop_signal, p);
    if (!p->sig[0] || !p->sig[1] || event_add(p->sig[0], NULL) != 0 ||
        event_add(p->sig[1], NULL) != 0) {
        al_log_error(p->comp, "cannot watch SIGINT and SIGTERM on the event loop");
        return -1;
    }
    return 0;
}

void al_process_signals_off(al_process *p, int ignore)
{
    for (int i = 0; i < 2; i++)
        if (p->sig[i]) {
            event_free(p->sig[i]);
            p->sig[i] = NULL;
        }
    if (!ignore) return;
    signal(SIGTERM, SIG_IGN);
    signal(SIGINT, SIG_IGN);
}

void al_process_drain_start(al_process *p, double seconds)
{
    if (p->drain_deadline_us) return;
    p->drain_deadline_us = al_mono_us() + (int64_t)(seconds * 1e6);
    if (!p->drain_deadline_us) p->drain_deadline_us = 1;
}

int al_process_drain_left_ms(const al_process *p, int cap)
{
    if (!p->drain_deadline_us) return cap;
    int64_t left = (p->drain_deadline_us - al_mono_us()) / 1000;
    return left <= 0 ? 0 : left < cap ? (int)left : cap;
}

int al_process_drain_over(const al_process *p)
{
    return p->drain_deadline_us && al_mono_us() >= p->drain_deadline_us;
}

/* The reason is written before the flag is published, and never again, so a reader on
 * another thread that sees the flag sees the whole reason. */
void al_process_vfail(al_process *p, const char *fmt, va_list ap)
{
    if (atomic_load(&p->failed)) return;
    vsnprintf(p->reason, sizeof p->reason, fmt, ap);
    atomic_store(&p->failed, 1);
    if (p->log_failures) al_log_error(p->comp, "%s", p->reason);
}

void al_process_fail(al_process *p, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    al_process_vfail(p, fmt, ap);
    va_end(ap);
}

int al_process_failed(const al_process *p)
{
    return atomic_load(&p->failed);
}

const char *al_process_reason(const al_process *p)
{
    return p->reason;
}

int al_process_health(void *ud, char *reason, size_t reasonlen)
{
    const al_process *p = ud;
    if (!atomic_load(&p->failed)) return 0;
    snprintf(reason, reasonlen, "%s", p->health_text ? p->health_text : p->reason);
    return 1;
}
