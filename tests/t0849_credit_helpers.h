/*
 * t0849_credit_helpers.h: what the credit logic tests share: spans built by hand (calls,
 * rewards, ends), a sink that keeps every transition's encoded bytes and decodes them back,
 * and feeding spans at increasing offsets. Header-only; include after testlib.h.
 */
#ifndef ARCLIGHT_T0849_CREDIT_HELPERS_H
#define ARCLIGHT_T0849_CREDIT_HELPERS_H

#include "credit.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define CT_FN static __attribute__((unused))

/* ---- spans ------------------------------------------------------------------------------ */

CT_FN al_span mk_call(const char *task, const char *rollout, int64_t seq, int64_t ts,
                       const int32_t *prompt, size_t np, const int32_t *resp, size_t nr,
                       const float *lp)
{
    al_span s;
    memset(&s, 0, sizeof s);
    s.trace_id = "0123456789abcdef0123456789abcdef";
    s.span_id = "0123456789abcdef";
    s.task_id = task;
    s.rollout_id = rollout;
    s.sequence = seq;
    s.timestamp_us = ts;
    s.kind = AL_SPAN_KIND_LLM_CALL;
    s.llm_call.model = "m";
    s.llm_call.policy_version = 3;
    s.llm_call.prompt_token_ids = prompt;
    s.llm_call.n_prompt_tokens = np;
    s.llm_call.response_token_ids = resp;
    s.llm_call.n_response_tokens = nr;
    s.llm_call.response_logprobs = lp;
    s.llm_call.n_response_logprobs = lp ? nr : 0;
    s.llm_call.http_status = 200;
    return s;
}

static const int32_t P1[] = {1, 2}, R1[] = {3, 4};
static const float L1[] = {-0.5f, -0.25f};

CT_FN al_span mk_simple(const char *task, const char *rollout, int64_t seq, int64_t ts)
{
    return mk_call(task, rollout, seq, ts, P1, 2, R1, 2, L1);
}

CT_FN al_span mk_reward(const char *task, const char *rollout, int64_t seq, int64_t ts,
                         const char *name, double v, int64_t after)
{
    al_span s = mk_simple(task, rollout, seq, ts);
    s.kind = AL_SPAN_KIND_REWARD;
    s.reward.name = name;
    s.reward.value = v;
    s.reward.after_sequence = after;
    return s;
}

CT_FN al_span mk_end(const char *task, const char *rollout, int64_t seq, int64_t ts,
                      al_rollout_status st, int32_t group_size)
{
    al_span s = mk_simple(task, rollout, seq, ts);
    s.kind = AL_SPAN_KIND_ROLLOUT_END;
    s.rollout_end.status = st;
    s.rollout_end.group_size = group_size;
    return s;
}

/* ---- a sink that keeps every transition's bytes ------------------------------------------ */

typedef struct sink_t {
    al_buf bytes[256];
    int64_t anchor[256];
    int n;
    al_transition t; /* scratch decode */
} sink_t;

CT_FN int sink_fn(void *ud, const al_transition *t, int64_t anchor)
{
    sink_t *s = ud;
    char err[256];
    if (s->n >= 256) return -1;
    al_buf_init(&s->bytes[s->n]);
    if (al_transition_encode(t, &s->bytes[s->n], err, sizeof err) != 0) {
        fprintf(stderr, "encode: %s\n", err);
        return -1;
    }
    s->anchor[s->n++] = anchor;
    return 0;
}

CT_FN void sink_free(sink_t *s)
{
    for (int i = 0; i < s->n; i++)
        al_buf_free(&s->bytes[i]);
    al_transition_clear(&s->t);
    s->n = 0;
}

/* The i-th transition, decoded (valid until the next call). */
CT_FN const al_transition *tr(sink_t *s, int i)
{
    char err[256];
    if (i >= s->n ||
        al_transition_decode(s->bytes[i].data, s->bytes[i].len, &s->t, err, sizeof err) != 0)
        return NULL;
    return &s->t;
}

/* The transition with this id, or NULL. */
CT_FN const al_transition *tr_id(sink_t *s, const char *id)
{
    for (int i = 0; i < s->n; i++) {
        const al_transition *t = tr(s, i);
        if (t && !strcmp(t->id, id)) return t;
    }
    return NULL;
}

CT_FN al_credit_part *mk_part(const al_credit_config *c, sink_t *s)
{
    al_credit_sink k = {.transition = sink_fn, .ud = s};
    char err[256];
    memset(s, 0, sizeof *s);
    al_credit_part *p = al_credit_part_new(c, &k, err, sizeof err);
    if (!p) fprintf(stderr, "part: %s\n", err);
    return p;
}

static int64_t off_counter;

/* Adds a span at the next offset; returns add's result. */
CT_FN int feed(al_credit_part *p, al_span s)
{
    char reason[256], err[256];
    const char *code;
    int r = al_credit_part_add(p, off_counter++, &s, &code, reason, sizeof reason, err, sizeof err);
    if (r < 0) fprintf(stderr, "add: %s\n", err);
    return r;
}

/* One-call rollout of task `task` with reward v: call, reward, end (3 offsets). */
CT_FN void feed_rollout(al_credit_part *p, const char *task, const char *rid, double v, int64_t ts)
{
    feed(p, mk_simple(task, rid, 0, ts));
    feed(p, mk_reward(task, rid, 1, ts, "final", v, 0));
    feed(p, mk_end(task, rid, 2, ts, AL_ROLLOUT_STATUS_SUCCEEDED, 0));
}

/* A rollout of n calls (n <= 8) of 2 response tokens each: call k, then, where rk[k] is not
 * NaN, a reward span named "r" of rk[k] after it; then (when end) an end span of status st.
 * Sequence numbers count up from 0 in that order, timestamps from ts. With chain, call k's
 * prompt is call k-1's prompt and response plus one agent token (100 + k), so --merge makes
 * one sequence of them; without, every call starts a new context. Call k's response is
 * {10 + 2k, 11 + 2k}. Returns the next sequence number. */
CT_FN int64_t feed_chain(al_credit_part *p, const char *task, const char *rid, size_t n,
                         const double *rk, int chain, int end, al_rollout_status st, int64_t ts)
{
    int32_t prompt[2 + 3 * 8], resp[2];
    size_t np = 2;
    int64_t seq = 0;
    prompt[0] = 1;
    prompt[1] = 2;
    for (size_t k = 0; k < n && k < 8; k++) {
        if (k && chain) {
            prompt[np++] = 10 + 2 * (int32_t)(k - 1);
            prompt[np++] = 11 + 2 * (int32_t)(k - 1);
            prompt[np++] = 100 + (int32_t)k;
        } else if (k) {
            prompt[0] = 50 + (int32_t)k;
            np = 1;
        }
        resp[0] = 10 + 2 * (int32_t)k;
        resp[1] = 11 + 2 * (int32_t)k;
        int64_t call_seq = seq;
        feed(p, mk_call(task, rid, seq++, ts++, prompt, np, resp, 2, NULL));
        if (rk && !isnan(rk[k])) feed(p, mk_reward(task, rid, seq++, ts++, "r", rk[k], call_seq));
    }
    if (end) feed(p, mk_end(task, rid, seq++, ts++, st, 0));
    return seq;
}

#endif
