/*
 * transition.c: the Transition codec (schemas/transition.avsc), credit's output and the
 * batcher's input.
 */
#include "avro/binary.h"
#include "avro/codec.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TR_NAME "ai.arclight.Transition"

int al_transition_id(char *buf, size_t buflen, const char *rollout_id, int32_t attempt,
                     int32_t call_index)
{
    return snprintf(buf, buflen, "%s:%d:%d", rollout_id ? rollout_id : "", attempt, call_index);
}

static int per_token(const char *field, size_t n, size_t n_response, const void *data,
                     char *errstr, size_t errlen)
{
    if (n && !data) return al_err(errstr, errlen, "Transition: %s has a count but no data", field);
    if (n == 0 || n == n_response) return 0;
    return al_err(errstr, errlen, "Transition: %s has %zu entries, expected 0 or %zu (one per response token)",
                  field, n, n_response);
}

int al_transition_encode(const al_transition *t, al_buf *out, char *errstr, size_t errlen)
{
    uint64_t fp = AL_CODEC_FP(TR_NAME);
    if (per_token("loss_mask", t->n_loss_mask, t->n_response_tokens, t->loss_mask, errstr, errlen) ||
        per_token("rollout_logprobs", t->n_rollout_logprobs, t->n_response_tokens,
                  t->rollout_logprobs, errstr, errlen) ||
        per_token("token_advantages", t->n_token_advantages, t->n_response_tokens,
                  t->token_advantages, errstr, errlen))
        return -1;
    if ((t->n_prompt_tokens && !t->prompt_token_ids) ||
        (t->n_response_tokens && !t->response_token_ids) ||
        (t->n_call_indices && !t->call_indices))
        return al_err(errstr, errlen, "Transition: an array has a count but no data");
    int bad = al_wr_header(out, fp) ||
              al_buf_reserve(out, 128 + 4 * t->n_prompt_tokens + 13 * t->n_response_tokens) ||
              al_wr_string(out, t->id) || al_wr_string(out, t->group_key) ||
              al_wr_string(out, t->group_id) || al_wr_long(out, t->group_size) ||
              al_wr_string(out, t->task_id) || al_wr_string(out, t->rollout_id) ||
              al_wr_long(out, t->attempt);
    if (!bad && t->n_call_indices) {
        bad = al_wr_long(out, (int64_t)t->n_call_indices);
        for (size_t i = 0; !bad && i < t->n_call_indices; i++)
            bad = al_wr_long(out, t->call_indices[i]);
    }
    bad = bad || al_wr_long(out, 0) ||
          al_wr_packed32(out, t->prompt_token_ids, t->n_prompt_tokens) ||
          al_wr_packed32(out, t->response_token_ids, t->n_response_tokens) ||
          al_wr_bytes(out, t->loss_mask, t->n_loss_mask) ||
          al_wr_packed32(out, t->rollout_logprobs, t->n_rollout_logprobs) ||
          al_wr_double(out, t->reward) || al_wr_double(out, t->return_value) ||
          al_wr_double(out, t->advantage) ||
          al_wr_packed32(out, t->token_advantages, t->n_token_advantages) ||
          al_wr_string(out, t->estimator) || al_wr_long(out, t->policy_version) ||
          al_wr_string(out, t->model) || al_wr_long(out, t->timestamp_us);
    if (bad) return al_codec_oom(errstr, errlen, "encoding a Transition");
    return 0;
}

/* An Avro array of int into the arena (any number of blocks). */
static int rd_int_array(al_rd *r, al_arena *a, const char *field, const int32_t **out, size_t *n)
{
    int32_t *arr = NULL;
    size_t count = 0, block;
    for (;;) {
        if (al_rd_block(r, field, 1, &block)) return -1;
        if (!block) break;
        int32_t *grown = al_arena_alloc(a, (count + block) * sizeof *grown);
        if (!grown) return al_codec_oom(r->errstr, r->errlen, "decoding");
        if (count) memcpy(grown, arr, count * sizeof *arr);
        arr = grown;
        for (size_t i = 0; i < block; i++)
            if (al_rd_int(r, field, &arr[count++])) return -1;
    }
    *out = arr;
    *n = count;
    return 0;
}

static int check_per_token(al_rd *r, const char *field, size_t n, size_t n_response, size_t off)
{
    if (n == 0 || n == n_response) return 0;
    return al_err(r->errstr, r->errlen,
                  "bad length: field %s has %zu entries for %zu response tokens at offset %zu",
                  field, n, n_response, off);
}

static int decode_body(al_rd *r, al_transition *t)
{
    al_arena *a = &t->arena;
    const void *p;
    size_t off;
    if (al_rd_string_a(r, a, "id", &t->id) || al_rd_string_a(r, a, "group_key", &t->group_key) ||
        al_rd_string_a(r, a, "group_id", &t->group_id) ||
        al_rd_int(r, "group_size", &t->group_size) ||
        al_rd_string_a(r, a, "task_id", &t->task_id) ||
        al_rd_string_a(r, a, "rollout_id", &t->rollout_id) ||
        al_rd_int(r, "attempt", &t->attempt) ||
        rd_int_array(r, a, "call_indices", &t->call_indices, &t->n_call_indices))
        return -1;
    if (al_rd_packed_a(r, a, "prompt_token_ids", 4, &p, &t->n_prompt_tokens)) return -1;
    t->prompt_token_ids = p;
    if (al_rd_packed_a(r, a, "response_token_ids", 4, &p, &t->n_response_tokens)) return -1;
    t->response_token_ids = p;
    off = al_rd_off(r);
    if (al_rd_packed_a(r, a, "loss_mask", 1, &p, &t->n_loss_mask) ||
        check_per_token(r, "loss_mask", t->n_loss_mask, t->n_response_tokens, off))
        return -1;
    t->loss_mask = p;
    off = al_rd_off(r);
    if (al_rd_packed_a(r, a, "rollout_logprobs", 4, &p, &t->n_rollout_logprobs) ||
        check_per_token(r, "rollout_logprobs", t->n_rollout_logprobs, t->n_response_tokens, off))
        return -1;
    t->rollout_logprobs = p;
    if (al_rd_double(r, "reward", &t->reward) ||
        al_rd_double(r, "return_value", &t->return_value) ||
        al_rd_double(r, "advantage", &t->advantage))
        return -1;
    off = al_rd_off(r);
    if (al_rd_packed_a(r, a, "token_advantages", 4, &p, &t->n_token_advantages) ||
        check_per_token(r, "token_advantages", t->n_token_advantages, t->n_response_tokens, off))
        return -1;
    t->token_advantages = p;
    if (al_rd_string_a(r, a, "estimator", &t->estimator) ||
        al_rd_long(r, "policy_version", &t->policy_version) ||
        al_rd_string_a(r, a, "model", &t->model) ||
        al_rd_long(r, "timestamp_us", &t->timestamp_us))
        return -1;
    return al_codec_finish(r, "Transition");
}

int al_transition_decode(const void *buf, size_t len, al_transition *t, char *errstr,
                         size_t errlen)
{
    al_rd r;
    al_buf resolved = {0};
    al_arena keep = t->arena;
    memset(t, 0, sizeof *t);
    t->arena = keep;
    al_arena_reset(&t->arena);
    int rc = al_codec_open(buf, len, TR_NAME, AL_CODEC_FP(TR_NAME), &r, &resolved, errstr,
                           errlen);
    if (rc == 1) {
        rc = al_transition_decode(resolved.data, resolved.len, t, errstr, errlen);
        al_buf_free(&resolved);
        return rc;
    }
    if (rc < 0) return -1;
    return decode_body(&r, t);
}

void al_transition_clear(al_transition *t)
{
    al_arena_free(&t->arena);
    memset(t, 0, sizeof *t);
}
