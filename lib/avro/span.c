/*
 * span.c: the Span codec (schemas/span.avsc), the proxy's output and credit's input.
 * Hand-written for speed: the packed token arrays are one memcpy each; every length is
 * checked against the bytes left before it is used.
 */
#include "avro/binary.h"
#include "avro/codec.h"

#include <stdlib.h>
#include <string.h>

#define SPAN_NAME "ai.arclight.Span"

static const char *const status_names[] = {"succeeded", "failed", "timeout", "aborted",
                                           "unknown"};

const char *al_rollout_status_name(al_rollout_status s)
{
    if ((unsigned)s >= AL_ARRAY_LEN(status_names)) return "unknown";
    return status_names[s];
}

int al_rollout_status_parse(const char *name)
{
    for (size_t i = 0; name && i < AL_ARRAY_LEN(status_names); i++)
        if (strcmp(name, status_names[i]) == 0) return (int)i;
    return -1;
}

static int check_count(const char *field, size_t n, size_t want, int optional, char *errstr,
                       size_t errlen)
{
    if (n == want || (optional && n == 0)) return 0;
    return al_err(errstr, errlen, "%s has %zu entries, expected %s%zu", field, n,
                  optional ? "0 or " : "", want);
}

int al_span_encode(const al_span *s, al_buf *out, char *errstr, size_t errlen)
{
    uint64_t fp = AL_CODEC_FP(SPAN_NAME);
    if ((unsigned)s->kind > AL_SPAN_KIND_ROLLOUT_END)
        return al_err(errstr, errlen, "Span: kind %d is not a known payload", (int)s->kind);
    int bad = al_wr_header(out, fp);
    if (!bad && al_buf_reserve(out, 64 + (s->kind == AL_SPAN_KIND_LLM_CALL
                                              ? 4 * (s->llm_call.n_prompt_tokens +
                                                     s->llm_call.n_response_tokens * 2)
                                              : 0)))
        bad = 1;
    bad = bad || al_wr_string(out, s->trace_id) || al_wr_string(out, s->span_id) ||
          al_wr_opt_string(out, s->parent_span_id) || al_wr_string(out, s->task_id) ||
          al_wr_string(out, s->rollout_id) || al_wr_long(out, s->attempt) ||
          al_wr_long(out, s->sequence) || al_wr_long(out, s->timestamp_us) ||
          al_wr_long(out, (int64_t)s->kind);
    if (bad) return al_codec_oom(errstr, errlen, "encoding a Span");
    switch (s->kind) {
    case AL_SPAN_KIND_LLM_CALL: {
        const al_llm_call *c = &s->llm_call;
        if (check_count("Span: response_logprobs", c->n_response_logprobs, c->n_response_tokens, 1,
                        errstr, errlen))
            return -1;
        if ((c->n_prompt_tokens && !c->prompt_token_ids) ||
            (c->n_response_tokens && !c->response_token_ids) ||
            (c->n_response_logprobs && !c->response_logprobs))
            return al_err(errstr, errlen, "Span: a token array has a count but no data");
        bad = al_wr_string(out, c->agent) || al_wr_string(out, c->model) ||
              al_wr_string(out, c->upstream) || al_wr_long(out, c->policy_version) ||
              al_wr_string(out, c->request_json) || al_wr_string(out, c->response_json) ||
              al_wr_byte(out, c->stream ? 1 : 0) ||
              al_wr_packed32(out, c->prompt_token_ids, c->n_prompt_tokens) ||
              al_wr_packed32(out, c->response_token_ids, c->n_response_tokens) ||
              al_wr_packed32(out, c->response_logprobs, c->n_response_logprobs) ||
              al_wr_opt_string(out, c->finish_reason) || al_wr_long(out, c->http_status) ||
              al_wr_opt_string(out, c->error) || al_wr_long(out, c->start_us) ||
              al_wr_long(out, c->first_byte_us) || al_wr_long(out, c->first_token_us) ||
              al_wr_long(out, c->end_us) || al_wr_long(out, c->usage.prompt_tokens) ||
              al_wr_long(out, c->usage.completion_tokens) ||
              al_wr_long(out, c->usage.total_tokens) || al_wr_long(out, c->usage.cached_tokens);
        break;
    }
    case AL_SPAN_KIND_REWARD:
        bad = al_wr_string(out, s->reward.name) || al_wr_double(out, s->reward.value) ||
              al_wr_long(out, s->reward.after_sequence);
        break;
    case AL_SPAN_KIND_ROLLOUT_END: {
        const al_rollout_end *e = &s->rollout_end;
        if ((unsigned)e->status > AL_ROLLOUT_STATUS_UNKNOWN)
            return al_err(errstr, errlen, "Span: rollout status %d is not a known status",
                          (int)e->status);
        if (e->group_size < 0)
            return al_err(errstr, errlen, "Span: group_size %d is negative", e->group_size);
        bad = al_wr_long(out, e->status) ||
              (e->group_size ? al_wr_long(out, 1) || al_wr_long(out, e->group_size)
                             : al_wr_long(out, 0)) ||
              al_wr_opt_string(out, e->reason) || al_wr_byte(out, e->retried ? 1 : 0);
        break;
    }
    }
    bad = bad || al_wr_byte(out, s->eval ? 1 : 0);
    if (bad) return al_codec_oom(errstr, errlen, "encoding a Span");
    return 0;
}

static int decode_llm_call(al_rd *r, al_arena *a, al_llm_call *c)
{
    const void *p;
    if (al_rd_string_a(r, a, "agent", &c->agent) || al_rd_string_a(r, a, "model", &c->model) ||
        al_rd_string_a(r, a, "upstream", &c->upstream) ||
        al_rd_long(r, "policy_version", &c->policy_version) ||
        al_rd_string_a(r, a, "request_json", &c->request_json) ||
        al_rd_string_a(r, a, "response_json", &c->response_json) ||
        al_rd_bool(r, "stream", &c->stream))
        return -1;
    if (al_rd_packed_a(r, a, "prompt_token_ids", 4, &p, &c->n_prompt_tokens)) return -1;
    c->prompt_token_ids = p;
    if (al_rd_packed_a(r, a, "response_token_ids", 4, &p, &c->n_response_tokens)) return -1;
    c->response_token_ids = p;
    size_t off = al_rd_off(r);
    if (al_rd_packed_a(r, a, "response_logprobs", 4, &p, &c->n_response_logprobs)) return -1;
    c->response_logprobs = p;
    if (c->n_response_logprobs && c->n_response_logprobs != c->n_response_tokens)
        return al_err(r->errstr, r->errlen,
                      "bad length: field response_logprobs has %zu entries for %zu response tokens at offset %zu",
                      c->n_response_logprobs, c->n_response_tokens, off);
    int32_t status;
    if (al_rd_opt_string_a(r, a, "finish_reason", &c->finish_reason) ||
        al_rd_int(r, "http_status", &status) || al_rd_opt_string_a(r, a, "error", &c->error) ||
        al_rd_long(r, "start_us", &c->start_us) ||
        al_rd_long(r, "first_byte_us", &c->first_byte_us) ||
        al_rd_long(r, "first_token_us", &c->first_token_us) ||
        al_rd_long(r, "end_us", &c->end_us) ||
        al_rd_long(r, "usage.prompt_tokens", &c->usage.prompt_tokens) ||
        al_rd_long(r, "usage.completion_tokens", &c->usage.completion_tokens) ||
        al_rd_long(r, "usage.total_tokens", &c->usage.total_tokens) ||
        al_rd_long(r, "usage.cached_tokens", &c->usage.cached_tokens))
        return -1;
    c->http_status = status;
    return 0;
}

static int decode_body(al_rd *r, al_span *s)
{
    al_arena *a = &s->arena;
    int64_t kind;
    if (al_rd_string_a(r, a, "trace_id", &s->trace_id) ||
        al_rd_string_a(r, a, "span_id", &s->span_id) ||
        al_rd_opt_string_a(r, a, "parent_span_id", &s->parent_span_id) ||
        al_rd_string_a(r, a, "task_id", &s->task_id) ||
        al_rd_string_a(r, a, "rollout_id", &s->rollout_id) ||
        al_rd_int(r, "attempt", &s->attempt) || al_rd_long(r, "sequence", &s->sequence) ||
        al_rd_long(r, "timestamp_us", &s->timestamp_us) ||
        al_rd_index(r, "payload", "union", 3, &kind))
        return -1;
    s->kind = (al_span_kind)kind;
    if (kind == AL_SPAN_KIND_LLM_CALL) {
        if (decode_llm_call(r, a, &s->llm_call)) return -1;
    } else if (kind == AL_SPAN_KIND_REWARD) {
        if (al_rd_string_a(r, a, "name", &s->reward.name) ||
            al_rd_double(r, "value", &s->reward.value) ||
            al_rd_long(r, "after_sequence", &s->reward.after_sequence))
            return -1;
    } else {
        int64_t st, branch;
        al_rollout_end *e = &s->rollout_end;
        if (al_rd_index(r, "status", "enum", 5, &st) ||
            al_rd_index(r, "group_size", "union", 2, &branch))
            return -1;
        e->status = (al_rollout_status)st;
        e->group_size = 0;
        if (branch == 1) {
            size_t off = al_rd_off(r);
            if (al_rd_int(r, "group_size", &e->group_size)) return -1;
            if (e->group_size <= 0)
                return al_err(r->errstr, r->errlen,
                              "bad value: field group_size is %d, must be positive, at offset %zu",
                              e->group_size, off);
        }
        if (al_rd_opt_string_a(r, a, "reason", &e->reason) ||
            al_rd_bool(r, "retried", &e->retried))
            return -1;
    }
    if (al_rd_bool(r, "eval", &s->eval)) return -1;
    return al_codec_finish(r, "Span");
}

int al_span_decode(const void *buf, size_t len, al_span *s, char *errstr, size_t errlen)
{
    al_rd r;
    al_buf resolved = {0};
    al_arena keep = s->arena;
    memset(s, 0, sizeof *s);
    s->arena = keep;
    al_arena_reset(&s->arena);
    int rc = al_codec_open(buf, len, SPAN_NAME, AL_CODEC_FP(SPAN_NAME), &r, &resolved,
                           errstr, errlen);
    if (rc == 1) {
        rc = al_span_decode(resolved.data, resolved.len, s, errstr, errlen);
        al_buf_free(&resolved);
        return rc;
    }
    if (rc < 0) return -1;
    return decode_body(&r, s);
}

void al_span_clear(al_span *s)
{
    al_arena_free(&s->arena);
    memset(s, 0, sizeof *s);
}
