/*
 * t1598_loop_audit.h: the whole-loop auditor (header-only, static). Reads every topic of a
 * run from the beginning to its end (spans, transitions, batches, policy, dead letters) and
 * checks them against what the agents saw (the load generator's record of each rollout):
 *
 *   - every call an agent saw answered 200 has exactly one span (matched by the answer's
 *     "id", which the span's response_json carries), and copies of a span (same rollout and
 *     sequence) are byte-identical;
 *   - every completed rollout (its calls, reward and end all answered 200) has each of its
 *     calls in exactly one transition after dedupe by transition id, and copies of a
 *     transition are byte-identical;
 *   - every transition is in exactly one trainer step, where a step is what a reader keeps
 *     of arclight.batches: per step the chunks after the last chunk 0 (batch rebuilds a step
 *     cut short by a crash from chunk 0), complete when chunks 0..count-1 are there; a step
 *     names only transitions that are on the transitions topic; transitions in no step yet
 *     are "pending", counted by group (batch closes a step at whole groups);
 *   - policy versions run 1..max with no gap, and a version seen twice names the same step
 *     and sha256 (train --resume publishes its newest version again: that copy is allowed,
 *     a different one is a repeat);
 *   - no dead letter holds a span or transition of a completed rollout.
 *
 *     la_rollout *rs = ...;                       // what the agents saw, rollout by rollout
 *     la_result r;
 *     la_audit(bootstrap, "prefix-", rs, n, &r);  // 0, or -1 when a topic could not be read
 *     la_print(&r, stdout);
 *     if (la_failures(&r, require_no_dups, why, sizeof why)) ...
 *
 * Duplicates before dedupe (the same span, transition or chunk more than once on its topic)
 * are counted; at-least-once delivery allows them, `require_no_dups` (exactly-once runs)
 * makes them a failure. Only messages whose rollout id starts with the prefix count, so the
 * auditor can read a cluster other tests share.
 *
 * Needs librdkafka, jansson and arclight_avro.
 */
#ifndef ARCLIGHT_TESTS_LOOP_AUDIT_H
#define ARCLIGHT_TESTS_LOOP_AUDIT_H

#include "avro/codec.h"
#include "kafka/kafka.h"

#include <inttypes.h>
#include <stdarg.h>
#include <jansson.h>
#include <librdkafka/rdkafka.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define LA_MAX_CALLS 8

/* What one rollout's agent saw. */
typedef struct la_rollout {
    char task[64], rollout[64];
    int calls;                          /* calls made */
    int ok;                             /* calls answered 200 */
    char resp_id[LA_MAX_CALLS][80];     /* the answer's "id" of each call answered 200 */
    int completed;                      /* every call, the reward and the end answered 200 */
} la_rollout;

typedef struct la_result {
    long rollouts, completed;
    long calls;                       /* calls an agent saw succeed */
    long spans, span_msgs;            /* distinct LLM-call spans of the run; messages */
    long transitions, transition_msgs; /* distinct transitions; messages */
    long steps, chunk_msgs, step_rebuilds, in_steps, pending, pending_groups;
    long versions, policy_msgs;
    int64_t max_version;
    long deadletters;
    /* failures */
    long lost_spans;        /* calls an agent saw succeed without a span */
    long spans_twice;       /* calls with more than one distinct span */
    long span_conflicts;    /* copies of a span that differ */
    long lost_calls;        /* calls of completed rollouts in no transition */
    long calls_twice;       /* calls of completed rollouts in two distinct transitions */
    long tr_conflicts;      /* copies of a transition that differ */
    long tr_twice_in_steps; /* transitions in more than one step, or twice in one */
    long phantom;           /* step entries that are not on the transitions topic */
    long incomplete_steps;  /* steps with a chunk missing (not the newest) */
    long version_gaps, version_repeats;
    long dead_completed; /* dead letters of completed rollouts: late copies of spans */
    /* duplicates before dedupe: allowed at least once, not with exactly-once */
    long dup_spans, dup_transitions, dup_chunks;
    char first_problem[512];
} la_result;

/* ---- a string-keyed table ---------------------------------------------------------------- */

typedef struct la_entry {
    char *key;   /* NULL: empty slot */
    uint64_t fp; /* fingerprint of the value bytes */
    long n;      /* messages */
    int a, b;    /* per-table uses */
    int64_t x;
} la_entry;

typedef struct la_table {
    la_entry *e;
    size_t cap, used;
} la_table;

static inline uint64_t la_fnv(const void *p, size_t n)
{
    const unsigned char *s = p;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ s[i]) * 1099511628211ull;
    return h;
}

static inline la_entry *la_get(la_table *t, const char *key, int create)
{
    if (create && (t->used + 1) * 2 > t->cap) {
        la_table n = {calloc(t->cap ? t->cap * 2 : 1024, sizeof(la_entry)), t->cap ? t->cap * 2 : 1024, 0};
        for (size_t i = 0; i < t->cap; i++)
            if (t->e[i].key) {
                size_t j = la_fnv(t->e[i].key, strlen(t->e[i].key)) & (n.cap - 1);
                while (n.e[j].key) j = (j + 1) & (n.cap - 1);
                n.e[j] = t->e[i];
                n.used++;
            }
        free(t->e);
        *t = n;
    }
    if (!t->cap) return NULL;
    size_t j = la_fnv(key, strlen(key)) & (t->cap - 1);
    while (t->e[j].key) {
        if (!strcmp(t->e[j].key, key)) return &t->e[j];
        j = (j + 1) & (t->cap - 1);
    }
    if (!create) return NULL;
    t->e[j].key = strdup(key);
    t->used++;
    return &t->e[j];
}

static inline void la_table_free(la_table *t)
{
    for (size_t i = 0; i < t->cap; i++) free(t->e[i].key);
    free(t->e);
    memset(t, 0, sizeof *t);
}

static inline void la_problem(la_result *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static inline void la_problem(la_result *r, const char *fmt, ...)
{
    if (r->first_problem[0]) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->first_problem, sizeof r->first_problem, fmt, ap);
    va_end(ap);
}

/* ---- reading a topic to its end ---------------------------------------------------------- */

typedef void (*la_msg_fn)(const rd_kafka_message_t *m, void *ud);

/* Calls fn for every message of topic, from the beginning of each partition to the end it
 * had when the read began (its high watermark then). 0, or -1 with the reason on stderr
 * (no metadata, no watermark, or not at the end within timeout_s). */
static inline int la_read_topic(const char *bootstrap, const char *topic, double timeout_s,
                                la_msg_fn fn, void *ud)
{
    char err[512];
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    rd_kafka_conf_set(conf, "bootstrap.servers", bootstrap, err, sizeof err);
    rd_kafka_conf_set(conf, "group.id", "arclight-loop-audit", err, sizeof err);
    rd_kafka_conf_set(conf, "enable.auto.commit", "false", err, sizeof err);
    rd_kafka_conf_set(conf, "isolation.level", "read_committed", err, sizeof err);
    /* the end of a partition whose last offsets are an aborted transaction and its marker
     * shows only as an end-of-partition event: no message comes from it */
    rd_kafka_conf_set(conf, "enable.partition.eof", "true", err, sizeof err);
    rd_kafka_conf_set(conf, "log_level", "0", err, sizeof err);
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_CONSUMER, conf, err, sizeof err);
    if (!rk) {
        fprintf(stderr, "audit: %s: %s\n", topic, err);
        return -1;
    }
    int nparts = 0, rc = -1;
    int64_t *hi = NULL, *at = NULL;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    double t0 = ts.tv_sec + ts.tv_nsec * 1e-9, now = t0;
    while (!nparts && now - t0 < timeout_s) {
        const rd_kafka_metadata_t *md = NULL;
        rd_kafka_topic_t *rkt = rd_kafka_topic_new(rk, topic, NULL);
        if (rd_kafka_metadata(rk, 0, rkt, &md, 5000) == RD_KAFKA_RESP_ERR_NO_ERROR) {
            if (md->topic_cnt == 1 && !md->topics[0].err) nparts = md->topics[0].partition_cnt;
            rd_kafka_metadata_destroy(md);
        }
        rd_kafka_topic_destroy(rkt);
        clock_gettime(CLOCK_MONOTONIC, &ts);
        now = ts.tv_sec + ts.tv_nsec * 1e-9;
    }
    if (!nparts) {
        fprintf(stderr, "audit: %s: no metadata within %.0f s\n", topic, timeout_s);
        goto out;
    }
    hi = calloc((size_t)nparts, sizeof *hi);
    at = calloc((size_t)nparts, sizeof *at);
    int left = 0;
    for (int p = 0; p < nparts; p++) {
        int64_t lo = 0;
        rd_kafka_resp_err_t e = RD_KAFKA_RESP_ERR__TIMED_OUT;
        for (int i = 0; i < 10 && e; i++)
            e = rd_kafka_query_watermark_offsets(rk, topic, p, &lo, &hi[p], 5000);
        if (e) {
            fprintf(stderr, "audit: %s [%d]: no watermarks: %s\n", topic, p, rd_kafka_err2str(e));
            goto out;
        }
        at[p] = lo;
        if (hi[p] > lo) left++;
    }
    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(nparts);
    for (int p = 0; p < nparts; p++)
        rd_kafka_topic_partition_list_add(l, topic, p)->offset = RD_KAFKA_OFFSET_BEGINNING;
    rd_kafka_assign(rk, l);
    rd_kafka_topic_partition_list_destroy(l);
    while (left > 0 && now - t0 < timeout_s) {
        rd_kafka_message_t *m = rd_kafka_consumer_poll(rk, 200);
        clock_gettime(CLOCK_MONOTONIC, &ts);
        now = ts.tv_sec + ts.tv_nsec * 1e-9;
        int p = m ? m->partition : -1;
        if (m && m->err == RD_KAFKA_RESP_ERR__PARTITION_EOF && p >= 0 && p < nparts) {
            /* its offset is where the reader stands, past markers and aborted records */
            if (at[p] < hi[p] && m->offset >= hi[p]) {
                at[p] = hi[p];
                left--;
            }
        } else if (m && !m->err && p >= 0 && p < nparts && at[p] < hi[p]) {
            if (m->offset < hi[p]) fn(m, ud);
            /* transaction markers take offsets a reader never sees: the next offset counts */
            at[p] = m->offset + 1;
            if (at[p] >= hi[p]) left--;
        } else if (m && !m->err && p >= 0 && p < nparts) {
            at[p] = m->offset + 1;
        }
        if (m) rd_kafka_message_destroy(m);
        if (left > 0) { /* checked after a quiet poll too: the last partition may send nothing */
            /* a partition whose last offsets are transaction markers ends at its position */
            rd_kafka_topic_partition_list_t *pos = rd_kafka_topic_partition_list_new(nparts);
            for (int q = 0; q < nparts; q++)
                if (at[q] < hi[q]) rd_kafka_topic_partition_list_add(pos, topic, q);
            if (pos->cnt && rd_kafka_position(rk, pos) == RD_KAFKA_RESP_ERR_NO_ERROR)
                for (int i = 0; i < pos->cnt; i++) {
                    int q = pos->elems[i].partition;
                    if (pos->elems[i].offset >= hi[q] && at[q] < hi[q]) {
                        at[q] = hi[q];
                        left--;
                    }
                }
            rd_kafka_topic_partition_list_destroy(pos);
        }
    }
    if (left > 0) {
        fprintf(stderr, "audit: %s: %d partitions not read to their end within %.0f s\n", topic,
                left, timeout_s);
        goto out;
    }
    rc = 0;
out:
    free(hi);
    free(at);
    rd_kafka_destroy_flags(rk, RD_KAFKA_DESTROY_F_NO_CONSUMER_CLOSE);
    return rc;
}

/* ---- the audit --------------------------------------------------------------------------- */

typedef struct la_ctx {
    const char *prefix;
    size_t prefix_len;
    la_result *r;
    la_table spans;     /* "rollout#sequence" -> fp; a = sequence */
    la_table resp_ids;  /* answer id -> a = distinct spans naming it */
    la_table trans;     /* transition id -> fp; a = steps it is in; x = its group */
    la_table calls;     /* "rollout#call_index" -> a = distinct transitions holding it */
    la_table chunks;    /* "step#chunk" -> fp, x = generation */
    la_table steps;     /* "step" -> a = chunk_count, b = chunks of the generation, x = gen */
    la_table versions;  /* "version" -> fp of (step, sha256), x = step */
    la_table completed; /* rollout id -> a = index */
    int64_t gen;
} la_ctx;

static inline int la_ours(const la_ctx *c, const char *rollout)
{
    return rollout && !strncmp(rollout, c->prefix, c->prefix_len);
}

/* The answer's "id" in a span's response_json, copied into out ("" when none). */
static inline void la_response_id(const char *json, char *out, size_t n)
{
    out[0] = 0;
    if (!json) return;
    json_t *j = json_loads(json, JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL);
    json_t *id = j ? json_object_get(j, "id") : NULL;
    if (json_is_string(id)) snprintf(out, n, "%s", json_string_value(id));
    json_decref(j);
}

static inline void la_on_span(const rd_kafka_message_t *m, void *ud)
{
    la_ctx *c = ud;
    al_span s;
    char err[256], key[160], rid[80];
    memset(&s, 0, sizeof s);
    if (al_span_decode(m->payload, m->len, &s, err, sizeof err) != 0) return;
    if (la_ours(c, s.rollout_id) && s.kind == AL_SPAN_KIND_LLM_CALL) {
        snprintf(key, sizeof key, "%s#%" PRId64, s.rollout_id, s.sequence);
        uint64_t fp = la_fnv(m->payload, m->len);
        la_entry *e = la_get(&c->spans, key, 1);
        c->r->span_msgs++;
        if (e->n++ == 0) {
            e->fp = fp;
            c->r->spans++;
            if (s.llm_call.http_status == 200) {
                la_response_id(s.llm_call.response_json, rid, sizeof rid);
                if (rid[0]) la_get(&c->resp_ids, rid, 1)->a++;
            }
        } else {
            c->r->dup_spans++;
            if (e->fp != fp) {
                c->r->span_conflicts++;
                la_problem(c->r, "span %s on %s [%d] @%" PRId64 " differs from its first copy",
                           key, rd_kafka_topic_name(m->rkt), m->partition, m->offset);
            }
        }
    }
    al_span_clear(&s);
}

static inline void la_on_transition(const rd_kafka_message_t *m, void *ud)
{
    la_ctx *c = ud;
    al_transition t;
    char err[256], key[160];
    memset(&t, 0, sizeof t);
    if (al_transition_decode(m->payload, m->len, &t, err, sizeof err) != 0) return;
    if (la_ours(c, t.rollout_id)) {
        uint64_t fp = la_fnv(m->payload, m->len);
        la_entry *e = la_get(&c->trans, t.id, 1);
        c->r->transition_msgs++;
        if (e->n++ == 0) {
            e->fp = fp;
            c->r->transitions++;
            for (size_t k = 0; k < t.n_call_indices; k++) {
                snprintf(key, sizeof key, "%s#%d", t.rollout_id, (int)t.call_indices[k]);
                la_get(&c->calls, key, 1)->a++;
            }
            const char *g = t.group_id ? t.group_id : t.rollout_id;
            e->x = (int64_t)la_fnv(g, strlen(g)); /* its group, for the pending count */
        } else {
            c->r->dup_transitions++;
            if (e->fp != fp) {
                c->r->tr_conflicts++;
                la_problem(c->r, "transition %s at [%d] @%" PRId64 " differs from its first copy",
                           t.id, m->partition, m->offset);
            }
        }
    }
    al_transition_clear(&t);
}

/* Steps: kept as (step, chunk) entries of the generation that began at the step's last
 * chunk 0; the transition ids of a complete step are counted once the whole topic is read. */
typedef struct la_chunk_ids {
    char *step_chunk; /* "step#chunk" */
    char **ids;
    size_t n;
    int64_t gen;
} la_chunk_ids;

typedef struct la_batches {
    la_ctx *c;
    la_chunk_ids *v;
    size_t n, cap;
} la_batches;

static inline void la_on_chunk(const rd_kafka_message_t *m, void *ud)
{
    la_batches *b = ud;
    la_ctx *c = b->c;
    al_batch_chunk ch;
    char err[256], key[64], skey[32];
    memset(&ch, 0, sizeof ch);
    if (al_batch_chunk_decode(m->payload, m->len, &ch, err, sizeof err) != 0) return;
    int ours = 0;
    for (size_t i = 0; i < ch.n_micro_batches && !ours; i++)
        for (size_t k = 0; k < ch.micro_batches[i].n_sequences && !ours; k++)
            ours = !strncmp(ch.micro_batches[i].transition_ids[k], c->prefix, c->prefix_len);
    if (ours) {
        c->r->chunk_msgs++;
        snprintf(skey, sizeof skey, "%" PRId64, ch.step);
        la_entry *s = la_get(&c->steps, skey, 1);
        if (ch.chunk_index == 0) {
            if (s->n++) c->r->step_rebuilds++;
            s->x = ++c->gen; /* a new generation of this step */
            s->a = ch.chunk_count;
        }
        snprintf(key, sizeof key, "%" PRId64 "#%d", ch.step, (int)ch.chunk_index);
        uint64_t fp = la_fnv(m->payload, m->len);
        la_entry *e = la_get(&c->chunks, key, 1);
        if (e->n++ && e->fp == fp) c->r->dup_chunks++;
        e->fp = fp;
        e->x = s->x;
        if (b->n == b->cap) {
            b->cap = b->cap ? b->cap * 2 : 256;
            b->v = realloc(b->v, b->cap * sizeof *b->v);
        }
        la_chunk_ids *ci = &b->v[b->n++];
        ci->step_chunk = strdup(key);
        ci->gen = s->x;
        ci->n = 0;
        size_t total = 0;
        for (size_t i = 0; i < ch.n_micro_batches; i++) total += ch.micro_batches[i].n_sequences;
        ci->ids = calloc(total ? total : 1, sizeof *ci->ids);
        for (size_t i = 0; i < ch.n_micro_batches; i++)
            for (size_t k = 0; k < ch.micro_batches[i].n_sequences; k++)
                ci->ids[ci->n++] = strdup(ch.micro_batches[i].transition_ids[k]);
    }
    al_batch_chunk_clear(&ch);
}

typedef struct la_policy {
    la_ctx *c;
    const char *model;
} la_policy;

static inline void la_on_policy(const rd_kafka_message_t *m, void *ud)
{
    la_policy *p = ud;
    la_ctx *c = p->c;
    al_policy_version v;
    char err[256], key[32], what[128];
    memset(&v, 0, sizeof v);
    if (al_policy_version_decode(m->payload, m->len, &v, err, sizeof err) != 0) return;
    if (!p->model || (v.model && !strcmp(v.model, p->model))) {
        c->r->policy_msgs++;
        snprintf(key, sizeof key, "%" PRId64, v.version);
        snprintf(what, sizeof what, "%" PRId64 ":%s", v.step, v.sha256 ? v.sha256 : "");
        uint64_t fp = la_fnv(what, strlen(what));
        la_entry *e = la_get(&c->versions, key, 1);
        if (e->n++ == 0) {
            e->fp = fp;
            e->x = v.version;
            c->r->versions++;
            if (v.version > c->r->max_version) c->r->max_version = v.version;
        } else if (e->fp != fp) {
            c->r->version_repeats++;
            la_problem(c->r, "policy version %" PRId64 " published twice with different weights or "
                       "step (%s)", v.version, what);
        }
    }
    al_policy_version_clear(&v);
}

static inline void la_on_deadletter(const rd_kafka_message_t *m, void *ud)
{
    la_ctx *c = ud;
    al_deadletter d;
    char err[256];
    memset(&d, 0, sizeof d);
    if (al_deadletter_decode(m->payload, m->len, &d, err, sizeof err) != 0) return;
    const char *rollout = NULL;
    al_span s;
    al_transition t;
    memset(&s, 0, sizeof s);
    memset(&t, 0, sizeof t);
    if (d.value && al_span_decode(d.value, d.value_len, &s, err, sizeof err) == 0)
        rollout = s.rollout_id;
    else if (d.value && al_transition_decode(d.value, d.value_len, &t, err, sizeof err) == 0)
        rollout = t.rollout_id;
    if (la_ours(c, rollout)) {
        c->r->deadletters++;
        /* A span of a completed rollout that credit refused: a proxy restarted after kill -9
         * publishes again what its spool held unacknowledged, and a copy that arrives after
         * the rollout's end is refused as late. A duplicate, not a loss: had the first copy
         * been the late one, its call would be missing from the transitions (lost_calls). */
        if (la_get(&c->completed, rollout, 0)) c->r->dead_completed++;
    }
    al_span_clear(&s);
    al_transition_clear(&t);
    al_deadletter_clear(&d);
}

/* Reads every topic of the cluster at bootstrap and checks it against rs[0..n) (rollout
 * ids starting with prefix). model: the PolicyVersion model to check (NULL: any). Fills r;
 * returns 0, or -1 when a topic could not be read to its end (r then undecided). */
static inline int la_audit(const char *bootstrap, const char *prefix, const char *model,
                           const la_rollout *rs, int n, la_result *r)
{
    memset(r, 0, sizeof *r);
    la_ctx c;
    memset(&c, 0, sizeof c);
    c.prefix = prefix;
    c.prefix_len = strlen(prefix);
    c.r = r;
    const double T = 120;
    for (int i = 0; i < n; i++)
        if (rs[i].completed) la_get(&c.completed, rs[i].rollout, 1)->a = i;
    la_batches b = {&c, NULL, 0, 0};
    la_policy p = {&c, model};
    int rc = -1;
    if (la_read_topic(bootstrap, AL_TOPIC_SPANS, T, la_on_span, &c) ||
        la_read_topic(bootstrap, AL_TOPIC_TRANSITIONS, T, la_on_transition, &c) ||
        la_read_topic(bootstrap, AL_TOPIC_BATCHES, T, la_on_chunk, &b) ||
        la_read_topic(bootstrap, AL_TOPIC_POLICY, T, la_on_policy, &p) ||
        la_read_topic(bootstrap, AL_TOPIC_DEADLETTER, T, la_on_deadletter, &c))
        goto out;
    rc = 0;

    /* calls the agents saw succeed: one span each */
    char key[200];
    for (int i = 0; i < n; i++) {
        const la_rollout *x = &rs[i];
        r->rollouts++;
        r->completed += x->completed;
        r->calls += x->ok;
        for (int k = 0; k < x->ok && k < LA_MAX_CALLS; k++) {
            la_entry *e = la_get(&c.resp_ids, x->resp_id[k], 0);
            if (!e) {
                r->lost_spans++;
                la_problem(r, "rollout %s: the call answered %s has no span", x->rollout,
                           x->resp_id[k]);
            } else if (e->a > 1) {
                r->spans_twice++;
                la_problem(r, "rollout %s: the call answered %s has %d different spans",
                           x->rollout, x->resp_id[k], e->a);
            }
        }
        if (!x->completed) continue;
        for (int k = 0; k < x->ok; k++) {
            snprintf(key, sizeof key, "%s#%d", x->rollout, k);
            la_entry *e = la_get(&c.calls, key, 0);
            if (!e) {
                r->lost_calls++;
                la_problem(r, "completed rollout %s: call %d is in no transition", x->rollout, k);
            } else if (e->a > 1) {
                r->calls_twice++;
                la_problem(r, "completed rollout %s: call %d is in %d distinct transitions",
                           x->rollout, k, e->a);
            }
        }
    }

    /* steps: the chunks of each step's last generation; complete ones count */
    int64_t max_step = -1;
    for (size_t i = 0; i < c.steps.cap; i++)
        if (c.steps.e[i].key) {
            la_entry *s = &c.steps.e[i];
            int64_t step = strtoll(s->key, NULL, 10);
            if (step > max_step) max_step = step;
            s->b = 0;
        }
    for (size_t i = 0; i < b.n; i++) {
        char skey[32];
        snprintf(skey, sizeof skey, "%.*s", (int)strcspn(b.v[i].step_chunk, "#"), b.v[i].step_chunk);
        la_entry *s = la_get(&c.steps, skey, 0);
        la_entry *ch = la_get(&c.chunks, b.v[i].step_chunk, 0);
        /* the last copy of a chunk of the step's last generation */
        if (s && ch && b.v[i].gen == s->x && ch->x == s->x) {
            ch->x = -1; /* counted */
            s->b++;
        } else {
            b.v[i].gen = -1; /* not kept */
        }
    }
    for (size_t i = 0; i < c.steps.cap; i++)
        if (c.steps.e[i].key) {
            la_entry *s = &c.steps.e[i];
            if (s->a > 0 && s->b >= s->a) {
                r->steps++;
            } else {
                s->x = -2; /* incomplete: its chunks are not counted */
                if (strtoll(s->key, NULL, 10) != max_step) {
                    r->incomplete_steps++;
                    la_problem(r, "step %s has %d of %d chunks", s->key, s->b, s->a);
                }
            }
        }
    for (size_t i = 0; i < b.n; i++) {
        if (b.v[i].gen < 0) continue;
        char skey[32];
        snprintf(skey, sizeof skey, "%.*s", (int)strcspn(b.v[i].step_chunk, "#"), b.v[i].step_chunk);
        la_entry *s = la_get(&c.steps, skey, 0);
        if (!s || s->x == -2) continue;
        for (size_t k = 0; k < b.v[i].n; k++) {
            la_entry *t = la_get(&c.trans, b.v[i].ids[k], 0);
            if (!t) {
                r->phantom++;
                la_problem(r, "step %s names transition %s, which is not on %s", skey,
                           b.v[i].ids[k], AL_TOPIC_TRANSITIONS);
                continue;
            }
            if (t->a++) {
                r->tr_twice_in_steps++;
                la_problem(r, "transition %s is in more than one step (again in step %s)",
                           b.v[i].ids[k], skey);
            } else {
                r->in_steps++;
            }
        }
    }
    /* transitions in no step yet, by group */
    la_table pend = {0};
    for (size_t i = 0; i < c.trans.cap; i++)
        if (c.trans.e[i].key && !c.trans.e[i].a) {
            r->pending++;
            char g[32];
            snprintf(g, sizeof g, "%016" PRIx64, (uint64_t)c.trans.e[i].x);
            if (la_get(&pend, g, 1)->n++ == 0) r->pending_groups++;
        }
    la_table_free(&pend);

    /* policy versions: 1..max, no gap */
    for (int64_t v = 1; v <= r->max_version; v++) {
        char vk[32];
        snprintf(vk, sizeof vk, "%" PRId64, v);
        if (!la_get(&c.versions, vk, 0)) {
            r->version_gaps++;
            la_problem(r, "policy version %" PRId64 " is missing (newest %" PRId64 ")", v,
                       r->max_version);
        }
    }
out:
    for (size_t i = 0; i < b.n; i++) {
        for (size_t k = 0; k < b.v[i].n; k++) free(b.v[i].ids[k]);
        free(b.v[i].ids);
        free(b.v[i].step_chunk);
    }
    free(b.v);
    la_table_free(&c.spans);
    la_table_free(&c.resp_ids);
    la_table_free(&c.trans);
    la_table_free(&c.calls);
    la_table_free(&c.chunks);
    la_table_free(&c.steps);
    la_table_free(&c.versions);
    la_table_free(&c.completed);
    return rc;
}

/* Lost (must be 0): what an agent saw or a completed rollout made that is not where it
 * belongs. Duplicated after dedupe (must be 0): the same call in two distinct spans or
 * transitions, a transition in two steps, copies that differ, a version published twice
 * with different weights. */
static inline long la_lost(const la_result *r)
{
    return r->lost_spans + r->lost_calls + r->phantom + r->incomplete_steps + r->version_gaps;
}

static inline long la_dup_after(const la_result *r)
{
    return r->spans_twice + r->span_conflicts + r->calls_twice + r->tr_conflicts +
           r->tr_twice_in_steps + r->version_repeats;
}

static inline long la_dup_before(const la_result *r)
{
    return r->dup_spans + r->dup_transitions + r->dup_chunks + r->dead_completed;
}

static inline void la_print(const la_result *r, long kills, long outages, FILE *f)
{
    fprintf(f,
            "  audit: rollouts %ld (completed %ld), calls %ld, spans %ld (%ld messages), "
            "transitions %ld (%ld messages), steps %ld (%ld chunk messages, %ld rebuilt), "
            "in steps %ld, pending %ld (%ld groups), versions %ld (newest %" PRId64
            ", %ld messages), dead letters %ld, kills %ld, outages %ld\n"
            "  audit: lost %ld, duplicated after dedupe %ld, duplicates before dedupe %ld "
            "(spans %ld, transitions %ld, chunks %ld, late span copies dead-lettered %ld)\n",
            r->rollouts, r->completed, r->calls, r->spans, r->span_msgs, r->transitions,
            r->transition_msgs, r->steps, r->chunk_msgs, r->step_rebuilds, r->in_steps,
            r->pending, r->pending_groups, r->versions, r->max_version, r->policy_msgs,
            r->deadletters, kills, outages, la_lost(r), la_dup_after(r), la_dup_before(r),
            r->dup_spans, r->dup_transitions, r->dup_chunks, r->dead_completed);
    if (r->first_problem[0]) fprintf(f, "  audit: first problem: %s\n", r->first_problem);
}

#endif
