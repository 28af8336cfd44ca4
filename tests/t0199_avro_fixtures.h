/*
 * t0199_avro_fixtures.h: messages of every arclight schema with every field set, shared
 * by the codec tests, the fuzz corpus writer and the codec benchmark. Header-only
 * (static functions); include it once per executable.
 */
#ifndef ARCLIGHT_T0199_AVRO_FIXTURES_H
#define ARCLIGHT_T0199_AVRO_FIXTURES_H

#include "avro/codec.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FX_FN static __attribute__((unused))

/* An LLM call span with n_prompt/n_resp tokens and about json_bytes of request+response
 * JSON; the arrays and strings are owned by the fixture. */
typedef struct fx_span {
    al_span s;
    int32_t *prompt, *resp;
    float *lp;
    char *req, *resp_json;
} fx_span;

FX_FN char *fx_json_text(const char *role, size_t bytes, unsigned seed)
{
    char *t = malloc(bytes + 128);
    size_t n = (size_t)snprintf(t, bytes + 128, "{\"model\":\"tiny\",\"messages\":[{\"role\":\"%s\",\"content\":\"", role);
    static const char words[] = "the agent calls a tool and reads its output; ";
    while (n < bytes) {
        t[n] = words[(n + seed) % (sizeof words - 1)];
        n++;
    }
    strcpy(t + n, "\"}],\"logprobs\":true}");
    return t;
}

FX_FN void fx_span_llm(fx_span *f, size_t n_prompt, size_t n_resp, size_t json_bytes)
{
    memset(f, 0, sizeof *f);
    f->prompt = malloc((n_prompt + 1) * sizeof(int32_t));
    f->resp = malloc((n_resp + 1) * sizeof(int32_t));
    f->lp = malloc((n_resp + 1) * sizeof(float));
    for (size_t i = 0; i < n_prompt; i++) f->prompt[i] = (int32_t)((i * 2654435761u) % 151936);
    for (size_t i = 0; i < n_resp; i++) {
        f->resp[i] = (int32_t)((i * 40503u + 7) % 151936);
        f->lp[i] = -0.001f * (float)(i % 997) - 1e-6f;
    }
    f->req = fx_json_text("user", json_bytes / 2, 1);
    f->resp_json = fx_json_text("assistant", json_bytes / 2, 5);
    al_span *s = &f->s;
    s->trace_id = "4bf92f3577b34da6a3ce929d0e0e4736";
    s->span_id = "00f067aa0ba902b7";
    s->parent_span_id = "a3ce929d0e0e4736";
    s->task_id = "task-42";
    s->rollout_id = "rollout-7";
    s->attempt = 2;
    s->sequence = 5;
    s->timestamp_us = 1764442149123456LL;
    s->kind = AL_SPAN_KIND_LLM_CALL;
    al_llm_call *c = &s->llm_call;
    c->agent = "swe-agent";
    c->model = "Qwen/Qwen3-0.6B";
    c->upstream = "http://127.0.0.1:8000";
    c->policy_version = 17;
    c->request_json = f->req;
    c->response_json = f->resp_json;
    c->stream = 1;
    c->prompt_token_ids = f->prompt;
    c->n_prompt_tokens = n_prompt;
    c->response_token_ids = f->resp;
    c->n_response_tokens = n_resp;
    c->response_logprobs = f->lp;
    c->n_response_logprobs = n_resp;
    c->finish_reason = "stop";
    c->http_status = 200;
    c->error = "partial: upstream closed after the last chunk";
    c->start_us = 1764442149000000LL;
    c->first_byte_us = 1764442149010000LL;
    c->first_token_us = 1764442149020000LL;
    c->end_us = 1764442149123000LL;
    c->usage.prompt_tokens = (int64_t)n_prompt;
    c->usage.completion_tokens = (int64_t)n_resp;
    c->usage.total_tokens = (int64_t)(n_prompt + n_resp);
    c->usage.cached_tokens = 64;
}

FX_FN void fx_span_free(fx_span *f)
{
    free(f->prompt);
    free(f->resp);
    free(f->lp);
    free(f->req);
    free(f->resp_json);
    memset(f, 0, sizeof *f);
}

FX_FN void fx_span_reward(al_span *s)
{
    memset(s, 0, sizeof *s);
    s->trace_id = "4bf92f3577b34da6a3ce929d0e0e4736";
    s->span_id = "00f067aa0ba902b8";
    s->task_id = "task-42";
    s->rollout_id = "rollout-7";
    s->attempt = 0;
    s->sequence = 6;
    s->timestamp_us = 1764442150000000LL;
    s->kind = AL_SPAN_KIND_REWARD;
    s->reward.name = "final";
    s->reward.value = 0.75;
    s->reward.after_sequence = 5;
}

FX_FN void fx_span_end(al_span *s)
{
    memset(s, 0, sizeof *s);
    s->trace_id = "4bf92f3577b34da6a3ce929d0e0e4736";
    s->span_id = "00f067aa0ba902b9";
    s->parent_span_id = "a3ce929d0e0e4736";
    s->task_id = "";
    s->rollout_id = "rollout-7";
    s->attempt = 1;
    s->sequence = 7;
    s->timestamp_us = 1764442151000000LL;
    s->kind = AL_SPAN_KIND_ROLLOUT_END;
    s->rollout_end.status = AL_ROLLOUT_STATUS_TIMEOUT;
    s->rollout_end.group_size = 8;
    s->rollout_end.reason = "agent exceeded 600 s";
}

typedef struct fx_transition {
    al_transition t;
    int32_t calls[3];
    int32_t prompt[12];
    int32_t resp[9];
    uint8_t mask[9];
    float lp[9], adv[9];
} fx_transition;

FX_FN void fx_transition_fill(fx_transition *f)
{
    memset(f, 0, sizeof *f);
    for (int i = 0; i < 12; i++) f->prompt[i] = 1000 + i * 37;
    for (int i = 0; i < 9; i++) {
        f->resp[i] = 50000 + i;
        f->mask[i] = (uint8_t)(i < 3 || i > 5);
        f->lp[i] = f->mask[i] ? -0.25f * (float)(i + 1) : 0.0f;
        f->adv[i] = f->mask[i] ? 0.5f : 0.0f;
    }
    f->calls[0] = 2;
    f->calls[1] = 3;
    f->calls[2] = 4;
    al_transition *t = &f->t;
    t->id = "rollout-7:0:2";
    t->group_key = "task-42";
    t->group_id = "task-42#3";
    t->group_size = 8;
    t->task_id = "task-42";
    t->rollout_id = "rollout-7";
    t->attempt = 0;
    t->call_indices = f->calls;
    t->n_call_indices = 3;
    t->prompt_token_ids = f->prompt;
    t->n_prompt_tokens = 12;
    t->response_token_ids = f->resp;
    t->n_response_tokens = 9;
    t->loss_mask = f->mask;
    t->n_loss_mask = 9;
    t->rollout_logprobs = f->lp;
    t->n_rollout_logprobs = 9;
    t->reward = 1.0;
    t->return_value = 0.9801;
    t->advantage = 0.5;
    t->token_advantages = f->adv;
    t->n_token_advantages = 9;
    t->estimator = "grpo";
    t->policy_version = 16;
    t->model = "Qwen/Qwen3-0.6B";
    t->timestamp_us = 1764442152000000LL;
}

typedef struct fx_batch {
    al_batch_chunk c;
    al_micro_batch mb[2];
    int32_t tok[2][10], pos[2][10], cu[2][4];
    uint8_t mask[2][10];
    float lp[2][10], adv[2][10];
    const char *ids[2][3];
    int64_t versions[2][3];
    float rewards[2][3];
} fx_batch;

FX_FN void fx_batch_fill(fx_batch *f)
{
    memset(f, 0, sizeof *f);
    /* micro-batch 0: sequences of 4, 3, 3 tokens; micro-batch 1: 6 and 4 */
    static const int32_t cu0[4] = {0, 4, 7, 10}, cu1[3] = {0, 6, 10};
    static const char *const ids0[3] = {"r1:0:0", "r2:0:1", "r3:1:0"}, *const ids1[2] = {"r4:0:0", "r5:0:3"};
    memcpy(f->cu[0], cu0, sizeof cu0);
    memcpy(f->cu[1], cu1, sizeof cu1);
    for (int m = 0; m < 2; m++) {
        const int32_t *cu = f->cu[m];
        int nseq = m == 0 ? 3 : 2;
        for (int s = 0; s < nseq; s++)
            for (int k = cu[s]; k < cu[s + 1]; k++) {
                f->tok[m][k] = 300 + 10 * m + k;
                f->pos[m][k] = k - cu[s];
                f->mask[m][k] = (uint8_t)(k - cu[s] >= 2);
                f->lp[m][k] = f->mask[m][k] ? -0.125f * (float)k : 0.0f;
                f->adv[m][k] = f->mask[m][k] ? (m ? -1.0f : 1.0f) : 0.0f;
            }
        for (int s = 0; s < nseq; s++) {
            f->ids[m][s] = m == 0 ? ids0[s] : ids1[s];
            f->versions[m][s] = 10 + s + m;
            f->rewards[m][s] = 0.25f * (float)(s + 2 * m);
        }
        al_micro_batch *mb = &f->mb[m];
        mb->index = 4 + m;
        mb->n_tokens = 10;
        mb->token_ids = f->tok[m];
        mb->loss_mask = f->mask[m];
        mb->position_ids = f->pos[m];
        mb->rollout_logprobs = f->lp[m];
        mb->advantages = f->adv[m];
        mb->n_sequences = (size_t)nseq;
        mb->cu_seqlens = f->cu[m];
        mb->transition_ids = f->ids[m];
        mb->policy_versions = f->versions[m];
        mb->rewards = f->rewards[m];
        mb->n_rewards = (size_t)nseq;
    }
    al_batch_chunk *c = &f->c;
    c->model = "Qwen/Qwen3-0.6B";
    c->step = 12;
    c->policy_version = 12;
    c->chunk_index = 1;
    c->chunk_count = 3;
    c->step_micro_batches = 6;
    c->step_sequences = 15;
    c->step_tokens = 60;
    c->step_loss_tokens = 30;
    c->micro_batches = f->mb;
    c->n_micro_batches = 2;
}

FX_FN void fx_policy_fill(al_policy_version *p)
{
    static const al_metric extra[3] = {{"lr", 1e-6}, {"reward_mean", 0.4375}, {"staleness", 1}};
    memset(p, 0, sizeof *p);
    p->model = "Qwen/Qwen3-0.6B";
    p->version = 13;
    p->step = 12;
    p->checkpoint_uri = "file:///var/lib/arclight/ckpt/step-12/model.safetensors";
    p->sha256 = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";
    p->created_us = 1764442153000000LL;
    p->metrics.loss = -0.0123;
    p->metrics.kl = 0.0031;
    p->metrics.entropy = 1.25;
    p->metrics.clip_fraction = 0.0625;
    p->metrics.grad_norm = 0.875;
    p->metrics.tokens_per_s = 12345.5;
    p->metrics.extra = extra;
    p->metrics.n_extra = 3;
}

FX_FN void fx_deadletter_fill(al_deadletter *d)
{
    static const uint8_t key[] = {'t', 'a', 's', 'k', 0, 0xff};
    static const uint8_t value[] = {0xc3, 0x01, 1, 2, 3, 4, 5, 6, 7, 8, 0x09};
    static const uint8_t hv[] = {'v', '1'};
    static const al_header headers[3] = {
        {"traceparent", hv, 2}, {"x-empty", (const uint8_t *)"", 0}, {"x-null", NULL, 0}};
    memset(d, 0, sizeof *d);
    d->source_topic = "arclight.spans";
    d->partition = 3;
    d->offset = 123456789012LL;
    d->key = key;
    d->key_len = sizeof key;
    d->value = value;
    d->value_len = sizeof value;
    d->headers = headers;
    d->n_headers = 3;
    d->reason = "unknown schema fingerprint 0807060504030201";
    d->stage = "credit";
    d->source_timestamp_us = 1764442154000000LL;
    d->timestamp_us = 1764442155000000LL;
}

#endif
