/*
 * spans.c: a span's way to the spool. Owns a span's trace context (the agent's W3C
 * traceparent when it sent one, else fresh ids), its encoding and its append to the spool
 * (keyed by task, else rollout, so a task's rollouts share a partition), and the end of the
 * loop turn's write of the turn's spans and state-file lines, which runs before the turn's
 * answers leave (px_conn_flush_turn calls it first).
 */
#include "proxy.h"

#include "core/log.h"
#include "http/httpd.h"

#include <inttypes.h>
#include <string.h>

void px_span_init(proxy *px, al_span *s, const ident *id, int64_t seq, const al_http_head *head,
                  char *trace, char *span_id, char *parent)
{
    memset(s, 0, sizeof *s);
    const al_slice *tp = head ? al_http_header_get(head, "traceparent") : NULL;
    /* 00-<32 hex trace>-<16 hex parent>-<2 hex flags> */
    if (tp && tp->n == 55 && tp->p[2] == '-' && tp->p[35] == '-' && tp->p[52] == '-') {
        int ok = 1;
        for (size_t i = 3; i < 52 && ok; i++)
            if (i != 35 &&
                !((tp->p[i] >= '0' && tp->p[i] <= '9') || (tp->p[i] >= 'a' && tp->p[i] <= 'f')))
                ok = 0;
        if (ok) {
            memcpy(trace, tp->p + 3, 32);
            trace[32] = '\0';
            memcpy(parent, tp->p + 36, 16);
            parent[16] = '\0';
            s->parent_span_id = parent;
        } else {
            px_rand_hex(px, trace, 32);
        }
    } else {
        px_rand_hex(px, trace, 32);
    }
    px_rand_hex(px, span_id, 16);
    s->trace_id = trace;
    s->span_id = span_id;
    s->task_id = id->task;
    s->rollout_id = id->rollout;
    s->attempt = id->attempt;
    s->sequence = seq;
    s->eval = id->eval;
    s->timestamp_us = al_now_us();
}

/* Writes the spans this loop turn appended as one write (it runs after the turn's other
 * callbacks, and before their answers leave: px_conn_flush_turn calls it first). Spans the disk did
 * not take are logged and counted as failed. */
void px_spool_flush(proxy *px)
{
    if (!px->spool_pending) return;
    size_t written = 0;
    char err[512];
    if (al_spool_flush(px->spool, &written, err, sizeof err) != 0) {
        al_log_error(COMP, "%zu spans lost: %s", px->spool_pending - written, err);
        al_counter_add(px->spans_failed, (double)(px->spool_pending - written));
    }
    al_counter_add(px->spans_spooled, (double)written);
    px->spool_pending = 0;
}

void px_spool_flush_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    px_spool_flush(arg);
    px_state_flush(arg);
}

int px_utf8_invalid(const char *p, size_t n)
{
    return !al_utf8_valid(p, n);
}

/* s when it is valid UTF-8; else a copy (in *own, the caller frees it) in which the bytes
 * that are not UTF-8 are U+FFFD. */
static const char *utf8_or_fixed(const char *s, char **own)
{
    *own = NULL;
    if (!s) return s;
    size_t n = strlen(s);
    if (!px_utf8_invalid(s, n)) return s;
    size_t cap = n * 3 + 1;
    if (!(*own = malloc(cap))) return "";
    al_utf8_clean(s, n, *own, cap);
    return *own;
}

/* Encodes and spools a span, keyed by task (else rollout) so that a task's rollouts share a
 * partition; it reaches the disk at the end of this loop turn (px_spool_flush). Every string
 * goes in as valid UTF-8 (Avro strings are UTF-8: one that is not makes a span no reader can
 * decode), whatever the upstream or the agent sent. 0, or -1 (logged and counted). */
int px_span_publish(proxy *px, const al_span *s0)
{
    char err[512];
    al_span fixed = *s0;
    const al_span *s = &fixed;
    char *own[10] = {0};
    al_llm_call *l = &fixed.llm_call;
    l->agent = utf8_or_fixed(l->agent, &own[0]);
    l->model = utf8_or_fixed(l->model, &own[1]);
    l->upstream = utf8_or_fixed(l->upstream, &own[2]);
    l->request_json = utf8_or_fixed(l->request_json, &own[3]);
    l->response_json = utf8_or_fixed(l->response_json, &own[4]);
    l->finish_reason = utf8_or_fixed(l->finish_reason, &own[5]);
    l->error = utf8_or_fixed(l->error, &own[6]);
    fixed.reward.name = utf8_or_fixed(fixed.reward.name, &own[7]);
    fixed.rollout_end.reason = utf8_or_fixed(fixed.rollout_end.reason, &own[8]);
    int rc = al_span_encode(s, &px->enc, err, sizeof err);
    for (size_t i = 0; i < AL_ARRAY_LEN(own); i++)
        free(own[i]);
    if (rc != 0) {
        al_log_error(COMP, "cannot encode span of rollout %s: %s", s->rollout_id, err);
        al_counter_inc(px->spans_failed);
        return -1;
    }
    const char *key = s->task_id && *s->task_id ? s->task_id : s->rollout_id;
    if (al_spool_append(px->spool, key, strlen(key), px->enc.data, px->enc.len, err, sizeof err) !=
        0) {
        al_log_error(COMP, "span of rollout %s sequence %" PRId64 " lost: %s", s->rollout_id,
                     s->sequence, err);
        al_counter_inc(px->spans_failed);
        return -1;
    }
    if (!px->spool_pending++ && px->flush_ev) event_active(px->flush_ev, EV_TIMEOUT, 1);
    return 0;
}
