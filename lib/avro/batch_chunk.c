/*
 * batch_chunk.c: the BatchChunk codec (schemas/batch_chunk.avsc), the batcher's output
 * and the trainer's input. Packed per-token arrays are one memcpy each; the sequence
 * boundaries and per-token array lengths are checked so that the trainer can index
 * without further checks.
 */
#include "avro/binary.h"
#include "avro/codec.h"

#include <stdlib.h>
#include <string.h>

#define BC_NAME "ai.arclight.BatchChunk"

/* cu_seqlens must be 0, non-decreasing, ending at n_tokens. */
static const char *bad_cu_seqlens(const int32_t *cu, size_t n_cu, size_t n_tokens)
{
    if (n_cu == 0) return "is empty (it needs at least the leading 0)";
    if (cu[0] != 0) return "does not start at 0";
    for (size_t i = 1; i < n_cu; i++)
        if (cu[i] < cu[i - 1]) return "decreases";
    if ((size_t)cu[n_cu - 1] != n_tokens) return "does not end at the token count";
    return NULL;
}

int al_batch_chunk_encode(const al_batch_chunk *c, al_buf *out, char *errstr, size_t errlen)
{
    uint64_t fp = AL_CODEC_FP(BC_NAME);
    if (c->n_micro_batches && !c->micro_batches)
        return al_err(errstr, errlen, "BatchChunk: n_micro_batches is %zu but micro_batches is NULL",
                      c->n_micro_batches);
    size_t total = 128;
    for (size_t i = 0; i < c->n_micro_batches; i++) {
        const al_micro_batch *m = &c->micro_batches[i];
        static const int32_t zero = 0;
        if (m->n_tokens && (!m->token_ids || !m->loss_mask || !m->position_ids ||
                            !m->rollout_logprobs || !m->advantages))
            return al_err(errstr, errlen, "BatchChunk: micro-batch %zu has %zu tokens but a per-token array is NULL",
                          i, m->n_tokens);
        if ((m->n_rewards && m->n_rewards != m->n_sequences) || (m->n_rewards && !m->rewards))
            return al_err(errstr, errlen, "BatchChunk: micro-batch %zu has %zu rewards for %zu sequences (give 0 or one per sequence)",
                          i, m->n_rewards, m->n_sequences);
        if (m->n_sequences && (!m->cu_seqlens || !m->transition_ids || !m->policy_versions))
            return al_err(errstr, errlen, "BatchChunk: micro-batch %zu has %zu sequences but cu_seqlens, transition_ids or policy_versions is NULL",
                          i, m->n_sequences);
        const char *why = bad_cu_seqlens(m->n_sequences ? m->cu_seqlens : &zero,
                                         m->n_sequences + 1, m->n_tokens);
        if (why)
            return al_err(errstr, errlen, "BatchChunk: micro-batch %zu: cu_seqlens %s", i, why);
        total += 17 * m->n_tokens + 4 * m->n_sequences + 32;
    }
    int bad = al_wr_header(out, fp) || al_buf_reserve(out, total) ||
              al_wr_string(out, c->model) || al_wr_long(out, c->step) ||
              al_wr_long(out, c->policy_version) || al_wr_long(out, c->chunk_index) ||
              al_wr_long(out, c->chunk_count) || al_wr_long(out, c->step_micro_batches) ||
              al_wr_long(out, c->step_sequences) || al_wr_long(out, c->step_tokens) ||
              al_wr_long(out, c->step_loss_tokens);
    if (!bad && c->n_micro_batches) bad = al_wr_long(out, (int64_t)c->n_micro_batches);
    for (size_t i = 0; !bad && i < c->n_micro_batches; i++) {
        const al_micro_batch *m = &c->micro_batches[i];
        static const int32_t zero = 0;
        bad = al_wr_long(out, m->index) || al_wr_packed32(out, m->token_ids, m->n_tokens) ||
              al_wr_bytes(out, m->loss_mask, m->n_tokens) ||
              al_wr_packed32(out, m->position_ids, m->n_tokens) ||
              al_wr_packed32(out, m->n_sequences ? m->cu_seqlens : &zero, m->n_sequences + 1) ||
              al_wr_packed32(out, m->rollout_logprobs, m->n_tokens) ||
              al_wr_packed32(out, m->advantages, m->n_tokens);
        if (!bad && m->n_sequences) {
            bad = al_wr_long(out, (int64_t)m->n_sequences);
            for (size_t k = 0; !bad && k < m->n_sequences; k++)
                bad = al_wr_string(out, m->transition_ids[k]);
        }
        bad = bad || al_wr_long(out, 0);
        if (!bad && m->n_sequences) {
            bad = al_wr_long(out, (int64_t)m->n_sequences);
            for (size_t k = 0; !bad && k < m->n_sequences; k++)
                bad = al_wr_long(out, m->policy_versions[k]);
        }
        bad = bad || al_wr_long(out, 0) || al_wr_packed32(out, m->rewards, m->n_rewards);
    }
    if (bad || al_wr_long(out, 0)) return al_codec_oom(errstr, errlen, "encoding a BatchChunk");
    return 0;
}

static int per_token(al_rd *r, al_arena *a, const char *field, size_t elem, size_t n_tokens,
                     const void **out)
{
    size_t off = al_rd_off(r), n;
    if (al_rd_packed_a(r, a, field, elem, out, &n)) return -1;
    if (n != n_tokens)
        return al_err(r->errstr, r->errlen,
                      "bad length: field %s has %zu entries for %zu tokens at offset %zu", field, n,
                      n_tokens, off);
    return 0;
}

static int decode_micro_batch(al_rd *r, al_arena *a, al_micro_batch *m)
{
    const void *p;
    size_t off, n_cu;
    if (al_rd_int(r, "micro_batches.index", &m->index) ||
        al_rd_packed_a(r, a, "micro_batches.token_ids", 4, &p, &m->n_tokens))
        return -1;
    m->token_ids = p;
    if (per_token(r, a, "micro_batches.loss_mask", 1, m->n_tokens, &p)) return -1;
    m->loss_mask = p;
    if (per_token(r, a, "micro_batches.position_ids", 4, m->n_tokens, &p)) return -1;
    m->position_ids = p;
    off = al_rd_off(r);
    if (al_rd_packed_a(r, a, "micro_batches.cu_seqlens", 4, &p, &n_cu)) return -1;
    m->cu_seqlens = p;
    const char *why = bad_cu_seqlens(m->cu_seqlens, n_cu, m->n_tokens);
    if (why)
        return al_err(r->errstr, r->errlen, "bad value: field micro_batches.cu_seqlens %s at offset %zu",
                      why, off);
    m->n_sequences = n_cu - 1;
    if (per_token(r, a, "micro_batches.rollout_logprobs", 4, m->n_tokens, &p)) return -1;
    m->rollout_logprobs = p;
    if (per_token(r, a, "micro_batches.advantages", 4, m->n_tokens, &p)) return -1;
    m->advantages = p;

    const char **ids = NULL;
    size_t n = 0, block;
    off = al_rd_off(r);
    for (;;) {
        if (al_rd_block(r, "micro_batches.transition_ids", 1, &block)) return -1;
        if (!block) break;
        const char **grown = al_arena_alloc(a, (n + block) * sizeof *grown);
        if (!grown) return al_codec_oom(r->errstr, r->errlen, "decoding");
        if (n) memcpy(grown, ids, n * sizeof *ids);
        ids = grown;
        for (size_t i = 0; i < block; i++, n++)
            if (al_rd_string_a(r, a, "micro_batches.transition_ids", &ids[n])) return -1;
    }
    if (n != m->n_sequences)
        return al_err(r->errstr, r->errlen,
                      "bad length: field micro_batches.transition_ids has %zu entries for %zu sequences at offset %zu",
                      n, m->n_sequences, off);
    m->transition_ids = ids;

    int64_t *versions = NULL;
    n = 0;
    off = al_rd_off(r);
    for (;;) {
        if (al_rd_block(r, "micro_batches.policy_versions", 1, &block)) return -1;
        if (!block) break;
        int64_t *grown = al_arena_alloc(a, (n + block) * sizeof *grown);
        if (!grown) return al_codec_oom(r->errstr, r->errlen, "decoding");
        if (n) memcpy(grown, versions, n * sizeof *versions);
        versions = grown;
        for (size_t i = 0; i < block; i++, n++)
            if (al_rd_long(r, "micro_batches.policy_versions", &versions[n])) return -1;
    }
    if (n != m->n_sequences)
        return al_err(r->errstr, r->errlen,
                      "bad length: field micro_batches.policy_versions has %zu entries for %zu sequences at offset %zu",
                      n, m->n_sequences, off);
    m->policy_versions = versions;
    off = al_rd_off(r);
    if (al_rd_packed_a(r, a, "micro_batches.rewards", 4, &p, &m->n_rewards)) return -1;
    m->rewards = p;
    if (m->n_rewards && m->n_rewards != m->n_sequences)
        return al_err(r->errstr, r->errlen,
                      "bad length: field micro_batches.rewards has %zu entries for %zu sequences at offset %zu",
                      m->n_rewards, m->n_sequences, off);
    return 0;
}

static int decode_body(al_rd *r, al_batch_chunk *c)
{
    al_arena *a = &c->arena;
    if (al_rd_string_a(r, a, "model", &c->model) || al_rd_long(r, "step", &c->step) ||
        al_rd_long(r, "policy_version", &c->policy_version) ||
        al_rd_int(r, "chunk_index", &c->chunk_index) ||
        al_rd_int(r, "chunk_count", &c->chunk_count) ||
        al_rd_int(r, "step_micro_batches", &c->step_micro_batches) ||
        al_rd_int(r, "step_sequences", &c->step_sequences) ||
        al_rd_long(r, "step_tokens", &c->step_tokens) ||
        al_rd_long(r, "step_loss_tokens", &c->step_loss_tokens))
        return -1;
    al_micro_batch *mbs = NULL;
    size_t n = 0, block;
    for (;;) {
        /* a micro-batch takes at least 10 bytes (index, seven lengths, two array ends) */
        if (al_rd_block(r, "micro_batches", 10, &block)) return -1;
        if (!block) break;
        al_micro_batch *grown = al_arena_alloc(a, (n + block) * sizeof *grown);
        if (!grown) return al_codec_oom(r->errstr, r->errlen, "decoding");
        if (n) memcpy(grown, mbs, n * sizeof *mbs);
        mbs = grown;
        for (size_t i = 0; i < block; i++, n++) {
            memset(&mbs[n], 0, sizeof mbs[n]);
            if (decode_micro_batch(r, a, &mbs[n])) return -1;
        }
    }
    c->micro_batches = mbs;
    c->n_micro_batches = n;
    return al_codec_finish(r, "BatchChunk");
}

int al_batch_chunk_decode(const void *buf, size_t len, al_batch_chunk *c, char *errstr,
                          size_t errlen)
{
    al_rd r;
    al_buf resolved = {0};
    al_arena keep = c->arena;
    memset(c, 0, sizeof *c);
    c->arena = keep;
    al_arena_reset(&c->arena);
    int rc = al_codec_open(buf, len, BC_NAME, AL_CODEC_FP(BC_NAME), &r, &resolved, errstr,
                           errlen);
    if (rc == 1) {
        rc = al_batch_chunk_decode(resolved.data, resolved.len, c, errstr, errlen);
        al_buf_free(&resolved);
        return rc;
    }
    if (rc < 0) return -1;
    return decode_body(&r, c);
}

void al_batch_chunk_clear(al_batch_chunk *c)
{
    al_arena_free(&c->arena);
    memset(c, 0, sizeof *c);
}
