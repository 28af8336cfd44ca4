/*
 * t1249_train_fixtures.h: BatchChunk messages for the trainer's tests (header-only, static).
 *
 * A step has `count` chunks of `mbs` micro-batches each; a micro-batch packs two sequences
 * (6 and 5 tokens: 3 prompt tokens, then the response, masked for training), with token ids
 * below 500 derived from `seed` (the same seed gives the same bytes), rollout logprobs of
 * -1.5, advantage +1 on the first sequence and -1 on the second, rewards 1 and 0. The step's
 * announced totals (micro-batches, sequences, tokens, loss tokens) match its contents unless
 * `tokens_delta` shifts the announced token count. `bad_token` >= 0 puts that id at the
 * micro-batch's last token.
 */
#ifndef ARCLIGHT_T1249_TRAIN_FIXTURES_H
#define ARCLIGHT_T1249_TRAIN_FIXTURES_H

#include "avro/codec.h"

#include <stdio.h>
#include <string.h>

#define FX_SEQ0 6
#define FX_SEQ1 5
#define FX_MB_TOKENS (FX_SEQ0 + FX_SEQ1)
#define FX_MB_LOSS_TOKENS (FX_MB_TOKENS - 6)
#define FX_MAX_MBS 8

/* Encodes chunk `idx` of `count` of a step into out. 0 or -1 (message on stderr). */
static inline int fx_encode_chunk(al_buf *out, const char *model, int64_t step, int idx, int count,
                                  int mbs, int seed, int bad_token, int64_t tokens_delta)
{
    static int32_t tok[FX_MAX_MBS][FX_MB_TOKENS], pos[FX_MAX_MBS][FX_MB_TOKENS], cu[FX_MAX_MBS][3];
    static uint8_t mask[FX_MAX_MBS][FX_MB_TOKENS];
    static float logp[FX_MAX_MBS][FX_MB_TOKENS], adv[FX_MAX_MBS][FX_MB_TOKENS], rew[FX_MAX_MBS][2];
    static char idbuf[FX_MAX_MBS][2][48];
    static const char *ids[FX_MAX_MBS][2];
    static int64_t pv[FX_MAX_MBS][2];
    al_micro_batch mb[FX_MAX_MBS];
    if (mbs > FX_MAX_MBS) return -1;
    memset(mb, 0, sizeof mb);
    for (int k = 0; k < mbs; k++) {
        int g = idx * mbs + k; /* micro-batch index within the step */
        for (int t = 0; t < FX_MB_TOKENS; t++) {
            int s = t < FX_SEQ0 ? 0 : 1, p = s ? t - FX_SEQ0 : t;
            tok[k][t] = (int32_t)((seed * 131 + g * 29 + t * 17 + s * 7) % 500);
            pos[k][t] = p;
            mask[k][t] = p >= 3;
            logp[k][t] = -1.5f;
            adv[k][t] = s ? -1.0f : 1.0f;
        }
        if (bad_token >= 0) tok[k][FX_MB_TOKENS - 1] = bad_token;
        cu[k][0] = 0, cu[k][1] = FX_SEQ0, cu[k][2] = FX_MB_TOKENS;
        for (int s = 0; s < 2; s++) {
            snprintf(idbuf[k][s], sizeof idbuf[k][s], "r%d-s%lld-m%d-q%d:0:0", seed, (long long)step, g, s);
            ids[k][s] = idbuf[k][s];
            pv[k][s] = 0;
        }
        rew[k][0] = 1, rew[k][1] = 0;
        mb[k] = (al_micro_batch){
            .index = g, .n_tokens = FX_MB_TOKENS, .token_ids = tok[k], .loss_mask = mask[k],
            .position_ids = pos[k], .rollout_logprobs = logp[k], .advantages = adv[k],
            .n_sequences = 2, .cu_seqlens = cu[k], .transition_ids = ids[k],
            .policy_versions = pv[k], .rewards = rew[k], .n_rewards = 2,
        };
    }
    int total_mbs = count * mbs;
    al_batch_chunk c = {
        .model = model, .step = step, .policy_version = 0, .chunk_index = idx,
        .chunk_count = count, .step_micro_batches = total_mbs, .step_sequences = 2 * total_mbs,
        .step_tokens = (int64_t)FX_MB_TOKENS * total_mbs + tokens_delta,
        .step_loss_tokens = (int64_t)FX_MB_LOSS_TOKENS * total_mbs,
        .micro_batches = mb, .n_micro_batches = (size_t)mbs,
    };
    char err[256];
    if (al_batch_chunk_encode(&c, out, err, sizeof err) != 0) {
        fprintf(stderr, "fixture: encoding a chunk: %s\n", err);
        return -1;
    }
    return 0;
}

#endif
