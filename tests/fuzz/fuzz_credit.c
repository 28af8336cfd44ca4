/*
 * fuzz_credit: libFuzzer target for credit's logic (stages/credit/credit.c) fed spans that
 * the Span decoder would accept but whose values are whatever a producer wrote: extreme
 * sequences, timestamps and attempts, rewards that are huge, tiny or not numbers, group
 * sizes from 1 to INT32_MAX, calls without tokens or with mismatched logprobs, spans out of
 * order, repeated or after their rollout ended, and clock moves.
 *
 * The first 8 bytes pick the configuration (estimator, reward mode, assignment, gamma,
 * merge, group size, timeouts, policies, equal-group dropping, eps, alpha, step credit and
 * its weight); every following 8 bytes are one operation on a part. A few rollouts of a
 * few tasks share a token sequence each, so that calls of a rollout often extend each
 * other (merge has something to merge, step credit twins to group).
 *
 * What must hold, besides no crash and no undefined behaviour:
 *   - every transition encodes, decodes, and decodes to what was emitted;
 *   - its return is finite, its reward and advantage finite as 32-bit floats (what the
 *     batcher takes), and so are its token advantages;
 *   - a grpo advantage (scalar or per token) is at most sqrt(group_size - 1): a z-score
 *     over at most that many returns (issue 18: per-position statistics); under step
 *     credit, a sum of two z-scores, whose step groups may hold more calls, is only
 *     checked to be finite;
 *   - its anchor offset is not below the safe offset reported before it;
 *   - the safe offset never decreases.
 *
 * Build: tests/credit.cmake (clang-14 -fsanitize=fuzzer,address,undefined).
 * Run:   build-asan/fuzz_credit -max_total_time=60 /tmp/fuzz-new tests/fuzz/credit_corpus
 */
#include "credit.h"

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ROLLOUTS 6
#define BASE 64

static al_transition back;
static al_buf enc;
static int64_t last_safe;
static al_credit_part *cur;
static int step_credit;

static void fail(const char *what, const al_transition *t)
{
    fprintf(stderr, "fuzz_credit: %s (transition %s)\n", what, t ? t->id : "-");
    abort();
}

static int finite_all(const float *v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!isfinite(v[i])) return 0;
    return 1;
}

static int on_transition(void *ud, const al_transition *t, int64_t anchor)
{
    (void)ud;
    char err[512];
    if (anchor < last_safe) fail("anchor offset below the safe offset", t);
    if (!(fabs(t->reward) <= FLT_MAX) || !isfinite(t->return_value) ||
        !(fabs(t->advantage) <= FLT_MAX)) {
        fprintf(stderr, "reward %g, return %g, advantage %g (%s)\n", t->reward, t->return_value,
                t->advantage, t->estimator);
        fail("reward, return or advantage is not finite", t);
    }
    if (!finite_all(t->token_advantages, t->n_token_advantages))
        fail("a token advantage is not finite", t);
    if (!strcmp(t->estimator, "grpo") && !step_credit) {
        /* a z-score over at most group_size returns is at most sqrt(group_size - 1) */
        double bound = sqrt(t->group_size > 1 ? (double)t->group_size - 1 : 0) * (1 + 1e-9);
        if (fabs(t->advantage) > bound) {
            fprintf(stderr, "advantage %g, group_size %d\n", t->advantage, t->group_size);
            fail("a grpo advantage beyond sqrt(group_size - 1)", t);
        }
        for (size_t k = 0; k < t->n_token_advantages; k++)
            if (fabs(t->token_advantages[k]) > bound * (1 + 1e-6))
                fail("a grpo token advantage beyond sqrt(group_size - 1)", t);
    }
    if (!t->n_prompt_tokens || !t->n_response_tokens) fail("no prompt or response tokens", t);
    enc.len = 0;
    if (al_transition_encode(t, &enc, err, sizeof err) != 0) {
        fprintf(stderr, "encode: %s\n", err);
        fail("the transition does not encode", t);
    }
    if (al_transition_decode(enc.data, enc.len, &back, err, sizeof err) != 0) {
        fprintf(stderr, "decode: %s\n", err);
        fail("the transition does not decode", t);
    }
    if (strcmp(back.id, t->id) || back.n_prompt_tokens != t->n_prompt_tokens ||
        back.n_response_tokens != t->n_response_tokens || back.advantage != t->advantage ||
        back.group_size != t->group_size ||
        memcmp(back.prompt_token_ids, t->prompt_token_ids, t->n_prompt_tokens * sizeof(int32_t)) ||
        memcmp(back.response_token_ids, t->response_token_ids,
               t->n_response_tokens * sizeof(int32_t)))
        fail("the transition decodes to something else", t);
    return 0;
}

static void on_rollout(void *ud, double score)
{
    (void)ud;
    if (!isfinite(score)) {
        fprintf(stderr, "fuzz_credit: rollout score %g\n", score);
        abort();
    }
}

static const double rewards[16] = {0,    1,     -1,  0.5,      1e300, -1e300, 1e-300, 3,
                                   1e15, -1e15, NAN, INFINITY, 2,     -0.25,  1e308,  0.75};
static const int64_t seqs[16] = {
    0, 1, 2, 3, 4, 5, 6, 7, -1, INT32_MAX, (int64_t)INT32_MAX + 1, INT64_MAX, INT64_MIN, 2, 1, 0};
static const int64_t times[8] = {
    INT64_MIN, -1, 0, INT64_MAX, INT64_MAX - 5, INT64_MAX / 2, 1000000000000000000LL, -1000000};
static const int64_t timeouts[4] = {0, 50, 100000, INT64_MAX};
static const int32_t gsizes[8] = {0, 1, 2, 3, 8, 1000, INT32_MAX, 2};

static void config_from(const uint8_t *d, al_credit_config *c)
{
    static const double gammas[4] = {1, 0.9, 0, 0.5};
    static const double epss[4] = {1e-6, 0, 1, 1e-300};
    static const double alphas[4] = {0.1, 1, 0.5, 1e-300};
    al_credit_config_init(c);
    c->estimator = (al_credit_estimator)(d[0] % 5);
    c->reward_mode = (al_credit_reward_mode)(d[0] / 5 % 3);
    c->reward_name = "r1";
    c->assign = (al_credit_assign)(d[1] & 1);
    c->gamma = gammas[d[1] >> 1 & 3];
    c->merge = d[1] >> 3 & 1;
    c->group_size = 1 + d[2] % 8;
    c->idle_timeout_us = timeouts[d[3] & 3];
    c->group_timeout_us = timeouts[d[3] >> 2 & 3];
    c->timeout_policy = (al_credit_policy)(d[3] >> 4 & 1);
    c->failed_policy = (al_credit_policy)(d[3] >> 5 & 1);
    c->drop_equal_groups = d[3] >> 6 & 1;
    c->timeout_reward = rewards[d[4] & 15];
    c->failed_reward = rewards[d[4] >> 4];
    c->eps = epss[d[5] & 3];
    c->reinforce_alpha = alphas[d[5] >> 2 & 3];
    static const double weights[4] = {1, 0, 0.5, 100};
    if (d[6] & 1) c->assign = AL_CREDIT_ASSIGN_STEP;
    c->step_weight = weights[d[6] >> 1 & 3];
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int32_t base[ROLLOUTS][BASE];
    static float lps[BASE];
    char err[512], reason[768], rid[16], tid[16], sid[16];
    if (size < 8) return 0;
    for (int r = 0; r < ROLLOUTS; r++)
        for (int k = 0; k < BASE; k++)
            base[r][k] = r * 1000 + k * 7;
    for (int k = 0; k < BASE; k++)
        lps[k] = -0.01f * (float)k;

    al_credit_config cfg;
    config_from(data, &cfg);
    al_credit_sink sink = {.transition = on_transition, .rollout = on_rollout};
    step_credit = cfg.assign == AL_CREDIT_ASSIGN_STEP;
    cur = al_credit_part_new(&cfg, &sink, err, sizeof err);
    if (!cur) return 0;
    last_safe = -1;
    int64_t offset = 0, ts = 1000;
    al_span s;
    for (size_t i = 8; i + 8 <= size; i += 8) {
        const uint8_t *o = data + i;
        int r = o[1] % ROLLOUTS;
        memset(&s, 0, sizeof s);
        snprintf(rid, sizeof rid, "r%d", r);
        snprintf(tid, sizeof tid, "t%d", r % 3);
        snprintf(sid, sizeof sid, "s%zu", i);
        s.trace_id = "trace";
        s.span_id = sid;
        s.rollout_id = o[2] == 255 ? "" : rid;
        s.task_id = o[2] == 254 ? "" : tid;
        s.attempt = o[2] % 16 == 15 ? -1 : o[2] % 2;
        s.sequence = seqs[o[3] & 15];
        if (o[3] & 0x80)
            s.timestamp_us = times[o[3] >> 4 & 7];
        else
            s.timestamp_us = ts += o[3] >> 4 & 7;
        int op = o[0] % 11;
        if (op <= 4) {
            al_llm_call *c = &s.llm_call;
            s.kind = AL_SPAN_KIND_LLM_CALL;
            size_t np = o[4] % 24, nr = o[5] % 8;
            if (np + nr > BASE) np = BASE - nr;
            c->prompt_token_ids = base[r];
            c->n_prompt_tokens = np;
            c->response_token_ids = base[r] + np;
            c->n_response_tokens = nr;
            c->response_logprobs = lps;
            c->n_response_logprobs = o[6] % 4 == 0 ? 0 : o[6] % 4 == 1 ? nr + 1 : nr;
            c->policy_version = o[7] % 4 == 3 ? INT64_MAX : (int64_t)(o[7] % 4) - 1;
            c->model = o[7] & 4 ? NULL : "m";
        } else if (op <= 6) {
            s.kind = AL_SPAN_KIND_REWARD;
            s.reward.name = o[4] & 1 ? "r1" : "r0";
            s.reward.value = rewards[o[4] >> 1 & 15];
            s.reward.after_sequence = seqs[o[5] & 15];
        } else if (op <= 8) {
            s.kind = AL_SPAN_KIND_ROLLOUT_END;
            s.rollout_end.status = (al_rollout_status)(o[4] % 5);
            s.rollout_end.group_size = gsizes[o[5] & 7];
        } else if (op == 9) {
            int64_t to = o[4] & 1 ? times[o[5] & 7] : ts + o[5] * 10;
            if (al_credit_part_advance(cur, to, err, sizeof err) != 0) abort();
            continue;
        } else {
            al_credit_part_note_offset(cur, offset++);
            continue;
        }
        const char *code;
        int rc =
            al_credit_part_add(cur, offset++, &s, &code, reason, sizeof reason, err, sizeof err);
        if (rc < 0) {
            fprintf(stderr, "fuzz_credit: add failed: %s\n", err);
            abort();
        }
        int64_t safe = al_credit_part_safe_offset(cur);
        if (safe < last_safe) {
            fprintf(stderr, "fuzz_credit: safe offset went back from %lld to %lld\n",
                    (long long)last_safe, (long long)safe);
            abort();
        }
        last_safe = safe;
    }
    /* the end of time: every timeout fires */
    if (al_credit_part_advance(cur, INT64_MAX, err, sizeof err) != 0) abort();
    al_credit_part_free(cur);
    cur = NULL;
    return 0;
}
