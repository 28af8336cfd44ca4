/*
 * bench_codec: throughput of the Span codec on a realistic LLM call (2,000 prompt and
 * 256 response tokens with logprobs, ~4 KB of request/response JSON), and of the packed
 * token/logprob arrays alone (a Transition with 128K response tokens), each printed as a
 * ratio against memcpy of the same bytes measured in the same run. avro-c's generic
 * reader on the same message is printed as a second reference.
 *
 *   cmake --build build --target bench && build/bench_codec [seconds-per-case]
 */
#include "avro/codec.h"
#include "t0199_avro_fixtures.h"

#include <avro.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static volatile uint64_t sink;
static char err[512];

typedef int (*bench_fn)(void *ctx);

/* Runs fn until `seconds` have passed; returns calls per second. */
static double rate(bench_fn fn, void *ctx, double seconds)
{
    long n = 0;
    double t0 = now_s(), t;
    do {
        for (int i = 0; i < 16; i++) {
            if (fn(ctx)) {
                fprintf(stderr, "bench_codec: %s\n", err);
                exit(1);
            }
        }
        n += 16;
        t = now_s();
    } while (t - t0 < seconds);
    return (double)n / (t - t0);
}

typedef struct ctx {
    const al_buf *msg;
    al_buf out;
    uint8_t *copy;
    size_t copy_len;
    al_span span;
    const al_span *src;
    al_transition tr;
    avro_value_t value;
    avro_reader_t reader;
} ctx;

static int do_memcpy(void *p)
{
    ctx *c = p;
    memcpy(c->copy, c->msg->data, c->copy_len);
    sink += c->copy[c->copy_len / 2];
    return 0;
}

static int do_span_encode(void *p)
{
    ctx *c = p;
    return al_span_encode(c->src, &c->out, err, sizeof err);
}

static int do_span_decode(void *p)
{
    ctx *c = p;
    int rc = al_span_decode(c->msg->data, c->msg->len, &c->span, err, sizeof err);
    sink += (uint64_t)c->span.llm_call.prompt_token_ids[7];
    return rc;
}

static int do_transition_decode(void *p)
{
    ctx *c = p;
    int rc = al_transition_decode(c->msg->data, c->msg->len, &c->tr, err, sizeof err);
    sink += (uint64_t)c->tr.response_token_ids[3];
    return rc;
}

static int do_avro_c_read(void *p)
{
    ctx *c = p;
    avro_reader_memory_set_source(c->reader, (const char *)c->msg->data + AL_AVRO_HEADER_LEN,
                                  (int64_t)(c->msg->len - AL_AVRO_HEADER_LEN));
    avro_value_reset(&c->value);
    if (avro_value_read(c->reader, &c->value)) {
        snprintf(err, sizeof err, "avro-c: %s", avro_strerror());
        return -1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    double secs = argc > 1 ? atof(argv[1]) : 0.5;
    if (secs <= 0) secs = 0.5;

    /* --- a realistic LLM-call span --- */
    fx_span f;
    fx_span_llm(&f, 2000, 256, 4096);
    al_buf msg = {0};
    if (al_span_encode(&f.s, &msg, err, sizeof err)) {
        fprintf(stderr, "bench_codec: %s\n", err);
        return 1;
    }
    ctx c = {.msg = &msg, .src = &f.s, .copy_len = msg.len};
    c.copy = malloc(msg.len);
    double mb = (double)msg.len / 1e6;
    double r_copy = rate(do_memcpy, &c, secs);
    double r_enc = rate(do_span_encode, &c, secs);
    double r_dec = rate(do_span_decode, &c, secs);

    const al_schema_info *in = al_schema_by_name("Span");
    avro_schema_t schema;
    avro_schema_from_json_length(in->json, strlen(in->json), &schema);
    avro_value_iface_t *iface = avro_generic_class_from_schema(schema);
    avro_generic_value_new(iface, &c.value);
    c.reader = avro_reader_memory("", 0);
    double r_avroc = rate(do_avro_c_read, &c, secs);

    size_t array_bytes = 4 * (f.s.llm_call.n_prompt_tokens + 2 * f.s.llm_call.n_response_tokens);
    printf("Span (LlmCall: 2000 prompt + 256 response tokens with logprobs, %zu bytes of JSON), "
           "message %zu bytes, %zu of them token/logprob arrays\n",
           strlen(f.req) + strlen(f.resp_json), msg.len, array_bytes);
    printf("  %-34s %10.0f MB/s\n", "memcpy of the message (reference)", r_copy * mb);
    printf("  %-34s %10.0f MB/s %10.0f msg/s   ratio to memcpy %.3f\n", "al_span_encode",
           r_enc * mb, r_enc, r_enc / r_copy);
    printf("  %-34s %10.0f MB/s %10.0f msg/s   ratio to memcpy %.3f\n", "al_span_decode",
           r_dec * mb, r_dec, r_dec / r_copy);
    printf("  %-34s %10.0f MB/s %10.0f msg/s   ratio to memcpy %.3f  (al_span_decode is %.1fx)\n",
           "avro-c generic read (reference)", r_avroc * mb, r_avroc, r_avroc / r_copy,
           r_dec / r_avroc);

    /* --- the packed arrays alone: a transition with 128K response tokens --- */
    enum { N = 131072 };
    int32_t *tok = malloc(N * sizeof *tok);
    float *lp = malloc(N * sizeof *lp), *adv = malloc(N * sizeof *adv);
    uint8_t *mask = malloc(N);
    for (int i = 0; i < N; i++) {
        tok[i] = i * 7;
        lp[i] = -0.5f;
        adv[i] = 1.0f;
        mask[i] = 1;
    }
    fx_transition ft;
    fx_transition_fill(&ft);
    ft.t.response_token_ids = tok;
    ft.t.n_response_tokens = N;
    ft.t.rollout_logprobs = lp;
    ft.t.n_rollout_logprobs = N;
    ft.t.token_advantages = adv;
    ft.t.n_token_advantages = N;
    ft.t.loss_mask = mask;
    ft.t.n_loss_mask = N;
    al_buf tmsg = {0};
    if (al_transition_encode(&ft.t, &tmsg, err, sizeof err)) {
        fprintf(stderr, "bench_codec: %s\n", err);
        return 1;
    }
    ctx t = {.msg = &tmsg, .copy_len = tmsg.len};
    t.copy = malloc(tmsg.len);
    double tmb = (double)tmsg.len / 1e6;
    double t_copy = rate(do_memcpy, &t, secs);
    double t_dec = rate(do_transition_decode, &t, secs);
    printf("Transition with %d response tokens (ids, loss mask, logprobs, advantages), message %zu bytes\n",
           N, tmsg.len);
    printf("  %-34s %10.0f MB/s\n", "memcpy of the message (reference)", t_copy * tmb);
    printf("  %-34s %10.0f MB/s %10.0f msg/s   ratio to memcpy %.3f\n",
           "token/logprob array decode", t_dec * tmb, t_dec, t_dec / t_copy);
    int ok = t_dec * tmb >= 200 && r_dec * mb >= 200;
    printf("target >= 200 MB/s for the arrays: %s\n", ok ? "met" : "NOT met");

    avro_reader_free(c.reader);
    avro_value_decref(&c.value);
    avro_value_iface_decref(iface);
    avro_schema_decref(schema);
    al_span_clear(&c.span);
    al_transition_clear(&t.tr);
    al_buf_free(&c.out);
    al_buf_free(&msg);
    al_buf_free(&tmsg);
    free(c.copy);
    free(t.copy);
    free(tok);
    free(lp);
    free(adv);
    free(mask);
    fx_span_free(&f);
    return ok ? 0 : 1;
}
