/*
 * t0898_credit_stream.h: the span stream t0801 and t1506 feed credit through Kafka: N_ROLL
 * rollouts of N_TASKS tasks (groups of PER_TASK), one to three calls each, a reward and an
 * end, interleaved by a fixed PRNG so that groups complete all along the stream and every
 * partition holds several at once; and the transition ids it must give, one per call.
 * Header-only; include after testlib.h and avro/codec.h.
 */
#ifndef ARCLIGHT_T0898_CREDIT_STREAM_H
#define ARCLIGHT_T0898_CREDIT_STREAM_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CS_FN static __attribute__((unused))

#define N_TASKS 12
#define PER_TASK 4
#define N_ROLL (N_TASKS * PER_TASK)

typedef struct msg {
    char key[32];
    uint8_t *val; /* NULL: tombstone */
    size_t len;
} msg;

typedef struct stream {
    msg *m;
    size_t n, cap;
} stream;

CS_FN void stream_add(stream *s, const char *key, const void *val, size_t len)
{
    if (s->n == s->cap) {
        s->cap = s->cap ? s->cap * 2 : 256;
        s->m = realloc(s->m, s->cap * sizeof *s->m);
    }
    msg *m = &s->m[s->n++];
    snprintf(m->key, sizeof m->key, "%s", key);
    m->val = val ? malloc(len) : NULL;
    if (val) memcpy(m->val, val, len);
    m->len = len;
}

CS_FN void stream_free(stream *s)
{
    for (size_t i = 0; i < s->n; i++)
        free(s->m[i].val);
    free(s->m);
    memset(s, 0, sizeof *s);
}

CS_FN int ncalls_of(int r)
{
    return 1 + (r * 7 + 3) % 3;
}

CS_FN double reward_of(int r)
{
    return (double)((r * 5 + r / PER_TASK) % 4);
}

/* The whole stream: N_ROLL rollouts of N_TASKS tasks, spans interleaved by a fixed PRNG.
 * Rollout r: calls 0..n-1, a reward after the last call, the end (group size 4). With
 * late_roll >= 0, that rollout's reward and end come last instead (t1506: its group stays
 * open through the whole stream, so the groups of its partition that complete meanwhile are
 * emitted above the offset credit commits, its first span, which a restart re-forms). */
CS_FN void build_stream(stream *s, int late_roll)
{
    stream late = {0};
    int next[N_ROLL] = {0};
    uint32_t rng = 12345;
    int left = 0;
    for (int r = 0; r < N_ROLL; r++)
        left += ncalls_of(r) + 2;
    int64_t ts = 1764400000000000LL;
    al_buf b = {0};
    char err[256];
    while (left > 0) {
        rng = rng * 1103515245u + 12345u;
        /* a window of 12 rollouts from the first unfinished one: about three tasks at once,
         * so that groups complete all along the stream */
        int base = 0;
        while (base < N_ROLL && next[base] > ncalls_of(base) + 1)
            base++;
        int r = base + (int)((rng >> 8) % 12);
        if (r >= N_ROLL) continue;
        int nc = ncalls_of(r);
        if (next[r] > nc + 1) continue;
        char task[16], rid[16];
        snprintf(task, sizeof task, "task-%02d", r / PER_TASK);
        snprintf(rid, sizeof rid, "roll-%03d", r);
        int32_t prompt[16], resp[8];
        float lp[8];
        for (int i = 0; i < 16; i++)
            prompt[i] = r * 100 + next[r] * 10 + i;
        for (int i = 0; i < 8; i++) {
            resp[i] = 50000 + r * 10 + i;
            lp[i] = -0.01f * (float)(i + 1);
        }
        al_span sp;
        memset(&sp, 0, sizeof sp);
        sp.trace_id = "0123456789abcdef0123456789abcdef";
        sp.span_id = "0123456789abcdef";
        sp.task_id = task;
        sp.rollout_id = rid;
        sp.sequence = next[r];
        sp.timestamp_us = ts += 1000;
        if (next[r] < nc) {
            sp.kind = AL_SPAN_KIND_LLM_CALL;
            sp.llm_call.model = "tiny";
            sp.llm_call.policy_version = 7;
            sp.llm_call.prompt_token_ids = prompt;
            sp.llm_call.n_prompt_tokens = 16;
            sp.llm_call.response_token_ids = resp;
            sp.llm_call.n_response_tokens = 8;
            sp.llm_call.response_logprobs = lp;
            sp.llm_call.n_response_logprobs = 8;
            sp.llm_call.http_status = 200;
        } else if (next[r] == nc) {
            sp.kind = AL_SPAN_KIND_REWARD;
            sp.reward.name = "final";
            sp.reward.value = reward_of(r);
            sp.reward.after_sequence = nc - 1;
        } else {
            sp.kind = AL_SPAN_KIND_ROLLOUT_END;
            sp.rollout_end.status = AL_ROLLOUT_STATUS_SUCCEEDED;
            sp.rollout_end.group_size = PER_TASK;
        }
        if (al_span_encode(&sp, &b, err, sizeof err) != 0) {
            fprintf(stderr, "encode: %s\n", err);
            abort();
        }
        stream_add(r == late_roll && next[r] >= nc ? &late : s, task, b.data, b.len);
        next[r]++;
        left--;
    }
    for (size_t i = 0; i < late.n; i++)
        stream_add(s, late.m[i].key, late.m[i].val, late.m[i].len);
    stream_free(&late);
    al_buf_free(&b);
}

/* Index of transition id "roll-RRR:0:S" in the expected list, -1 if unexpected. */
CS_FN int expected_index(const char *id)
{
    int r, a, sq, idx = 0;
    if (sscanf(id, "roll-%d:%d:%d", &r, &a, &sq) != 3 || r < 0 || r >= N_ROLL || a || sq < 0 ||
        sq >= ncalls_of(r))
        return -1;
    for (int k = 0; k < r; k++)
        idx += ncalls_of(k);
    return idx + sq;
}

CS_FN int n_expected(void)
{
    int n = 0;
    for (int r = 0; r < N_ROLL; r++)
        n += ncalls_of(r);
    return n;
}

#endif
