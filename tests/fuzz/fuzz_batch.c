/*
 * fuzz_batch: libFuzzer target for the batching stage's logic (stages/batch/batcher.c) fed
 * transitions that the Transition decoder would accept but whose values are whatever a
 * producer wrote: group sizes from INT32_MIN to INT32_MAX, policy versions anywhere,
 * advantages and rewards that are huge, tiny or not numbers, loss masks with any byte,
 * negative token ids, repeated ids, the same group from several lanes, and calls of every
 * other operation (idle closes, policy versions, step numbers, flushes) in between.
 *
 * The first 8 bytes pick the configuration (step target in sequences or tokens, micro-batch
 * budget, message limit, staleness and its policy, whitening, duplicate window); every
 * following 8 bytes are one operation.
 *
 * What must hold, besides no crash and no undefined behaviour:
 *   - every chunk of every step decodes, and its micro-batches hold finite advantages,
 *     logprobs and rewards;
 *   - every opaque of an added transition comes back exactly once: in a step, through
 *     on_drop, or from al_batcher_release_all at the end.
 *
 * Build: tests/batch.cmake (clang-14 -fsanitize=fuzzer,address,undefined).
 * Run:   build-asan/fuzz_batch -max_total_time=60 /tmp/fuzz-new tests/fuzz/batch_corpus
 */
#include "batch/batcher.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_OPS 512

static uint8_t returned[MAX_OPS]; /* per added transition (its opaque is its index + 1) */
static int n_added;
static al_batch_chunk chunk;

static void give_back(void *opaque, const char *how)
{
    intptr_t i = (intptr_t)opaque - 1;
    if (i < 0 || i >= n_added) {
        fprintf(stderr, "fuzz_batch: unknown opaque %ld (%s)\n", (long)i, how);
        abort();
    }
    if (returned[i]++) {
        fprintf(stderr, "fuzz_batch: opaque %ld returned twice (%s)\n", (long)i, how);
        abort();
    }
}

static void on_drop(void *ctx, void *opaque, const char *reason)
{
    (void)ctx;
    give_back(opaque, reason);
}

static int finite_all(const float *v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!isfinite(v[i])) return 0;
    return 1;
}

static void check_step(al_batch_step *st)
{
    char err[512];
    for (size_t c = 0; c < st->n_chunks; c++) {
        if (al_batch_chunk_decode(st->chunks[c].data, st->chunks[c].len, &chunk, err, sizeof err) !=
            0) {
            fprintf(stderr, "fuzz_batch: chunk %zu of step %lld: %s\n", c, (long long)st->step,
                    err);
            abort();
        }
        for (size_t m = 0; m < chunk.n_micro_batches; m++) {
            const al_micro_batch *mb = &chunk.micro_batches[m];
            if (!finite_all(mb->advantages, mb->n_tokens) ||
                !finite_all(mb->rollout_logprobs, mb->n_tokens) ||
                !finite_all(mb->rewards, mb->n_rewards)) {
                fprintf(stderr, "fuzz_batch: step %lld holds a value that is not finite\n",
                        (long long)st->step);
                abort();
            }
        }
    }
    for (size_t i = 0; i < st->n_opaques; i++)
        give_back(st->opaques[i], "step");
    al_batch_step_free(st);
}

static const double values[16] = {0,     1,   -1,       0.5, 1e30,   -1e38, 3.4e38, 1e39,
                                  1e300, NAN, INFINITY, 2,   -0.125, 1e-45, -3e38,  7};
static const int32_t gsizes[8] = {1, 2, 3, 8, 0, -1, INT32_MAX, INT32_MIN};
static const int64_t versions[8] = {-1, 0, 1, 5, -2, INT64_MAX, INT64_MIN, AL_STEP_MAX};

int LLVMFuzzerTestOneInput(const uint8_t *d, size_t size)
{
    static int32_t prompt[64], response[64];
    static uint8_t mask[64];
    static float logp[64], tadv[64];
    char err[512], id[32], gid[16], rid[16];
    if (size < 8) return 0;

    al_batch_config c;
    al_batch_config_default(&c);
    if (d[0] & 1) {
        c.step_sequences = 0;
        c.step_tokens = 1 + d[1] % 200;
    } else {
        c.step_sequences = 1 + d[1] % 12;
    }
    c.micro_batch_tokens = 2 + d[2] % 128;
    c.max_message_bytes = d[3] & 1 ? 1048576 - 65536 : 400 + d[3] * 16;
    c.max_staleness = (int64_t)(d[4] % 6) - 1;
    c.stale_policy = (al_batch_stale_policy)(d[4] >> 4 & 1);
    c.whiten = d[5] & 1;
    c.dedup_window = d[5] & 2 ? 4 : 4096;
    c.on_drop = on_drop;
    al_batcher *b = al_batcher_new(&c, err, sizeof err);
    if (!b) return 0;
    memset(returned, 0, sizeof returned);
    n_added = 0;
    for (int k = 0; k < 64; k++) {
        prompt[k] = k * 11;
        response[k] = 1000 + k;
        logp[k] = -0.01f * (float)k;
        tadv[k] = 0.5f - 0.01f * (float)k;
    }
    int64_t now = 0;
    for (size_t i = 8; i + 8 <= size && n_added < MAX_OPS; i += 8) {
        const uint8_t *o = d + i;
        now += o[7];
        int op = o[0] % 12;
        if (op <= 6) {
            al_transition t;
            memset(&t, 0, sizeof t);
            int g = o[1] % 5, r = o[2] % 4;
            snprintf(gid, sizeof gid, "g%d", g);
            snprintf(rid, sizeof rid, "g%d-r%d", g, r);
            snprintf(id, sizeof id, "%s:0:%d", rid, o[3] % 3);
            t.id = o[6] == 255 ? "" : id;
            t.group_key = "k";
            t.group_id = o[6] == 254 ? "" : gid;
            t.group_size = gsizes[o[3] >> 2 & 7];
            t.task_id = "task";
            t.rollout_id = rid;
            t.model = o[6] == 253 ? "" : o[6] & 1 ? "m1" : "m0";
            size_t np = o[4] % 40, nr = o[5] % 24;
            t.prompt_token_ids = prompt;
            t.n_prompt_tokens = np;
            t.response_token_ids = response;
            t.n_response_tokens = nr;
            for (size_t k = 0; k < nr; k++)
                mask[k] = (uint8_t)(k % 3 != 1);
            if (o[6] == 252 && nr) mask[0] = 2;
            if (o[6] == 251 && np) prompt[0] = -1;
            t.loss_mask = o[3] & 32 ? mask : NULL;
            t.n_loss_mask = t.loss_mask ? (o[6] == 250 ? nr + 1 : nr) : 0;
            t.rollout_logprobs = o[3] & 64 ? logp : NULL;
            t.n_rollout_logprobs = t.rollout_logprobs ? nr : 0;
            if (o[6] == 249 && nr) tadv[0] = NAN;
            t.token_advantages = o[3] & 128 ? tadv : NULL;
            t.n_token_advantages = t.token_advantages ? nr : 0;
            t.reward = values[o[7] & 15];
            t.advantage = values[o[7] >> 4];
            t.return_value = t.reward;
            t.estimator = "grpo";
            t.policy_version = versions[o[1] >> 4 & 7];
            int32_t lane = o[2] >> 4 & 3;
            intptr_t opaque = n_added + 1;
            al_batch_add_result res =
                al_batcher_add(b, &t, lane, now, (void *)opaque, err, sizeof err);
            if (res == AL_BATCH_ADDED) n_added++;
            prompt[0] = 0;
            mask[0] = 1;
            tadv[0] = 0.5f;
        } else if (op == 7) {
            al_batcher_close_idle(b, now, o[1], NULL, NULL);
        } else if (op == 8) {
            al_batcher_set_policy_version(b, o[1] & 1 ? "m1" : "m0", versions[o[2] & 7]);
        } else if (op == 9) {
            al_batcher_set_next_step(b, o[1] & 1 ? "m1" : "m0", versions[o[2] & 7]);
        } else {
            al_batch_step *st;
            int rc;
            if (op == 11) al_batcher_close_all(b);
            while ((rc = op == 11 ? al_batcher_flush_step(b, &st, err, sizeof err)
                                  : al_batcher_next_step(b, &st, err, sizeof err)) == 1)
                check_step(st);
            if (rc < 0) {
                fprintf(stderr, "fuzz_batch: building a step failed: %s\n", err);
                abort();
            }
        }
    }
    al_batcher_close_all(b);
    al_batch_step *st;
    int rc;
    while ((rc = al_batcher_flush_step(b, &st, err, sizeof err)) == 1)
        check_step(st);
    if (rc < 0) {
        fprintf(stderr, "fuzz_batch: the last step failed: %s\n", err);
        abort();
    }
    al_batcher_release_all(b, on_drop, NULL);
    for (int k = 0; k < n_added; k++)
        if (returned[k] != 1) {
            fprintf(stderr, "fuzz_batch: opaque %d came back %d times\n", k, returned[k]);
            abort();
        }
    al_batcher_free(b);
    return 0;
}
