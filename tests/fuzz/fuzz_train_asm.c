/*
 * fuzz_train_asm: libFuzzer target for the trainer's step assembler (stages/train/assembler.c)
 * fed BatchChunk messages that the batch stage's encoder accepts but whose values are
 * whatever a producer wrote: step numbers anywhere (INT64_MIN to INT64_MAX), chunk indices and
 * counts that disagree, totals that do not add up, token ids and positions outside the model,
 * masks of any byte, advantages, logprobs and rewards that are not numbers; and, now and then,
 * raw bytes instead of a message.
 *
 * The first byte picks the assembler's last applied step; every following 8 bytes build one
 * message (a few bytes of it decide each field), with a take-out of ready steps after each.
 *
 * What must hold, besides no crash and no undefined behaviour:
 *   - every opaque comes back exactly once: at once (any result but HELD), in a ready step
 *     (current or retired), or when the assembler is freed;
 *   - a good step's micro-batches hold token ids inside the vocabulary, positions below the
 *     model's maximum, cu_seqlens from 0 to T, and finite advantages and logprobs;
 *   - good steps come out with increasing step numbers, above the last applied one and at
 *     most AL_STEP_MAX.
 *
 * Build: tests/train.cmake (clang-14 -fsanitize=fuzzer,address,undefined).
 * Run:   build-asan/fuzz_train_asm -max_total_time=60 /tmp/fuzz-new tests/fuzz/train_corpus
 */
#include "train/assembler.h"

#include "avro/codec.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define VOCAB 50
#define MAX_POS 64
#define MAX_MSGS 256

static uint8_t returned[MAX_MSGS];
static int n_msgs;

static void give_back(void *opaque, const char *how)
{
    intptr_t i = (intptr_t)opaque - 1;
    if (i < 0 || i >= n_msgs) {
        fprintf(stderr, "fuzz_train_asm: unknown opaque %ld (%s)\n", (long)i, how);
        abort();
    }
    if (returned[i]++) {
        fprintf(stderr, "fuzz_train_asm: opaque %ld returned twice (%s)\n", (long)i, how);
        abort();
    }
}

static void release(void *ctx, void *opaque)
{
    (void)ctx;
    give_back(opaque, "free");
}

static void fail(const char *what, int64_t step)
{
    fprintf(stderr, "fuzz_train_asm: step %lld: %s\n", (long long)step, what);
    abort();
}

static int64_t last_good;

static void check_ready(al_train_ready *r)
{
    if (!r->bad) {
        if (r->step <= last_good) fail("a good step not above the last one", r->step);
        if (r->step > AL_STEP_MAX) fail("a good step beyond the largest number", r->step);
        last_good = r->step;
        for (int c = 0; c < r->nchunks; c++) {
            const al_train_chunk *k = &r->chunks[c];
            if (k->T < 1 || k->nseq < 1) fail("an empty chunk", r->step);
            if (k->cu_seqlens[0] != 0 || k->cu_seqlens[k->nseq] != k->T)
                fail("cu_seqlens do not span the chunk", r->step);
            for (int s = 0; s < k->nseq; s++)
                if (k->cu_seqlens[s + 1] < k->cu_seqlens[s]) fail("cu_seqlens go back", r->step);
            for (int t = 0; t < k->T; t++) {
                if (k->tokens[t] < 0 || k->tokens[t] >= VOCAB) fail("token outside", r->step);
                if (k->positions && (k->positions[t] < 0 || k->positions[t] >= MAX_POS))
                    fail("position outside", r->step);
                if (!isfinite(k->mask[t]) || (k->adv && !isfinite(k->adv[t])) ||
                    (k->rollout_logp && !isfinite(k->rollout_logp[t])))
                    fail("a value that is not finite", r->step);
            }
        }
    }
    for (size_t i = 0; i < r->n_current; i++)
        give_back(r->current[i], "current");
    for (size_t i = 0; i < r->n_retired; i++)
        give_back(r->retired[i], "retired");
    al_train_ready_free(r);
}

static const int64_t steps[8] = {0, 1, 2, 3, -1, INT64_MAX, INT64_MIN, 1};
static const float values[8] = {0, 1, -0.5f, 2, NAN, INFINITY, -1e38f, 0.25f};

int LLVMFuzzerTestOneInput(const uint8_t *d, size_t size)
{
    static int32_t tokens[32], pos[32], cu[9];
    static uint8_t mask[32];
    static float logp[32], adv[32], rewards[8];
    static const char *ids[8] = {"a:0:0", "b:0:0", "c:0:0", "d:0:0",
                                 "e:0:0", "f:0:0", "g:0:0", "h:0:0"};
    static int64_t versions[8];
    char why[512], err[256];
    if (size < 1) return 0;
    int64_t last_applied = (int64_t)(d[0] % 4) - 1;
    al_train_asm *a = al_train_asm_new("m", VOCAB, MAX_POS, last_applied, err, sizeof err);
    if (!a) abort();
    memset(returned, 0, sizeof returned);
    n_msgs = 0;
    last_good = last_applied;
    al_buf buf;
    al_buf_init(&buf);
    for (size_t i = 1; i + 8 <= size && n_msgs < MAX_MSGS; i += 8) {
        const uint8_t *o = d + i;
        buf.len = 0;
        if (o[0] == 255) { /* raw bytes */
            if (al_buf_append(&buf, o + 1, 7)) abort();
        } else {
            size_t T = 1 + o[3] % 24, nseq = 1 + o[4] % 4;
            if (nseq > T) nseq = T;
            cu[0] = 0;
            for (size_t s = 1; s < nseq; s++)
                cu[s] = (int32_t)(s * T / nseq);
            cu[nseq] = (int32_t)T;
            if (o[4] & 0x80 && nseq > 1) cu[1] = cu[nseq] + 1; /* goes back */
            for (size_t t = 0, s = 0; t < T; t++) {
                while (s + 1 < nseq && (size_t)cu[s + 1] <= t)
                    s++;
                tokens[t] = (int32_t)((t * 7 + o[5]) % VOCAB);
                pos[t] = (int32_t)(t - (size_t)cu[s]);
                mask[t] = t > 0;
                logp[t] = -0.1f;
                adv[t] = 0.5f;
            }
            if (o[5] == 250) tokens[0] = VOCAB;
            if (o[5] == 251) tokens[T - 1] = -3;
            if (o[5] == 252) pos[0] = MAX_POS;
            if (o[5] == 253) mask[0] = 7;
            if (o[5] == 254) adv[T / 2] = values[o[6] & 7];
            if (o[5] == 249) logp[0] = values[o[6] & 7];
            for (size_t s = 0; s < nseq; s++) {
                rewards[s] = values[(o[6] >> 3) & 7];
                versions[s] = (int64_t)(o[6] >> 6) - 1;
            }
            al_micro_batch mb = {
                .index = (int32_t)(o[2] >> 4 & 3),
                .n_tokens = T,
                .token_ids = tokens,
                .loss_mask = mask,
                .position_ids = pos,
                .rollout_logprobs = logp,
                .advantages = adv,
                .n_sequences = nseq,
                .cu_seqlens = cu,
                .transition_ids = ids,
                .policy_versions = versions,
                .rewards = rewards,
                .n_rewards = o[6] & 4 ? nseq : 0,
            };
            int32_t count = 1 + (o[2] & 3);
            al_batch_chunk ch = {
                .model = o[7] & 1 ? "other" : "m",
                .step = steps[o[1] & 7],
                .policy_version = (int64_t)(o[1] >> 6) - 1,
                .chunk_index = (int32_t)(o[1] >> 3 & 3),
                .chunk_count = o[7] & 2 ? count + 1 : count,
                .step_micro_batches = 1 + (o[7] >> 2 & 3),
                .step_sequences = (int32_t)(nseq * (1 + (o[7] >> 4 & 1))),
                .step_tokens = (int64_t)T * (1 + (o[7] >> 5 & 1)),
                .step_loss_tokens = (int64_t)(T - 1) * (1 + (o[7] >> 6 & 1)),
                .micro_batches = &mb,
                .n_micro_batches = 1,
            };
            if (al_batch_chunk_encode(&ch, &buf, err, sizeof err) != 0) continue;
        }
        intptr_t opaque = ++n_msgs;
        al_train_asm_result res =
            al_train_asm_add(a, buf.data, buf.len, (void *)opaque, why, sizeof why);
        if (res != AL_TRAIN_ASM_HELD) give_back((void *)opaque, "at once");
        al_train_ready *r;
        while (al_train_asm_next(a, &r) == 1)
            check_ready(r);
    }
    al_train_asm_free(a, release, NULL);
    al_buf_free(&buf);
    for (int k = 0; k < n_msgs; k++)
        if (returned[k] != 1) {
            fprintf(stderr, "fuzz_train_asm: opaque %d came back %d times\n", k, returned[k]);
            abort();
        }
    return 0;
}
