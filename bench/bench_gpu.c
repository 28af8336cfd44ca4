/*
 * bench_gpu: the GPU benchmark of lib/model (tests/gpu/run.sh runs it against PyTorch in the
 * same script; results in docs/BENCHMARKS.md).
 *
 *   bench_gpu train  [--device cuda] [--layers N] [--tokens T] [--seqs S] [--steps N]
 *       fwd + bwd + AdamW of a Qwen2.5-0.5B-shaped model (hidden 896, 24 layers, 14 heads,
 *       2 kv heads, intermediate 4864, vocab 151936, tied) on packed micro-batches of T
 *       tokens in S equal sequences (PPO loss through the trainer: the path `arclight train`
 *       runs). Prints tokens/s and MFU against the H200's dense bf16 peak (989 TFLOP/s).
 *   bench_gpu decode [--device cuda] [--batch B[,B...]] [--prompt P] [--new N]
 *       for each B: prefill B prompts of P tokens, then N greedy decode steps of all B
 *       together (the serve engine's al_infer_forward over paged KV caches, logits to the
 *       host and the argmax there, as the engine samples). Prints decode tokens/s.
 *   bench_gpu save DIR
 *       writes the benchmark's random weights (seed 1) as DIR/model.safetensors + config.json,
 *       so that transformers runs the same weights.
 *
 * Output: one line "result KEY=VALUE ..." per measurement, read by tests/gpu/run.sh.
 * FLOPs counted: 6 x (matrix parameters + LM head) per token, plus causal attention
 * (QK^T and PV: 4 x HD x NH x (ts+1)/2 per token per layer forward, 3x that forward +
 * backward), the convention llm.c and PaLM use.
 */
#include "model/config.h"
#include "model/infer.h"
#include "model/model.h"
#include "model/ops.h"
#include "model/safetensors.h"
#include "model/trainer.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define PEAK_BF16 989e12

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static al_model_config qwen05b(int layers)
{
    al_model_config c = {0};
    al_model_config_set_arch(&c, AL_MODEL_ARCH_QWEN2);
    c.vocab_size = 151936, c.hidden_size = 896, c.intermediate_size = 4864;
    c.num_layers = layers, c.num_heads = 14, c.num_kv_heads = 2, c.head_dim = 64;
    c.rms_norm_eps = 1e-6, c.rope_theta = 1e6, c.tie_word_embeddings = 1;
    c.max_position_embeddings = 32768, c.bos_token_id = -1, c.eos_token_id = 151643;
    return c;
}

static const char *arg(int argc, char **argv, const char *name, const char *def)
{
    for (int i = 2; i + 1 < argc; i++)
        if (!strcmp(argv[i], name)) return argv[i + 1];
    return def;
}

static al_model *make_model(const al_model_config *c, const char *device, al_backend **be)
{
    char err[512];
    al_model *m = al_model_new(c, err, sizeof err);
    if (!m) {
        fprintf(stderr, "bench_gpu: %s\n", err);
        exit(1);
    }
    al_model_init_random(m, 1);
    *be = al_backend_open(device, err, sizeof err);
    if (!*be || al_model_set_backend(m, *be, err, sizeof err) != 0) {
        fprintf(stderr, "bench_gpu: --device %s: %s\n", device, err);
        exit(1);
    }
    return m;
}

static double matrix_params(const al_model_config *c)
{
    double C = c->hidden_size, I = c->intermediate_size, Q = (double)c->num_heads * c->head_dim;
    double KV = (double)c->num_kv_heads * c->head_dim;
    return c->num_layers * (C * Q + 2 * C * KV + Q * C + 3 * C * I) + (double)c->vocab_size * C;
}

static int cmd_train(int argc, char **argv)
{
    const char *device = arg(argc, argv, "--device", "cuda");
    int layers = atoi(arg(argc, argv, "--layers", "24"));
    int T = atoi(arg(argc, argv, "--tokens", "4096")), S = atoi(arg(argc, argv, "--seqs", "8"));
    int steps = atoi(arg(argc, argv, "--steps", "10"));
    if (T <= 0 || S <= 0 || T % S || steps <= 0 || layers <= 0) {
        fprintf(stderr, "bench_gpu train: --tokens must be a multiple of --seqs, all positive\n");
        return 2;
    }
    al_model_config c = qwen05b(layers);
    al_backend *be;
    al_model *m = make_model(&c, device, &be);
    int32_t *tok = malloc(sizeof(int32_t) * T), *cu = malloc(sizeof(int32_t) * (S + 1));
    float *mask = malloc(sizeof(float) * T), *adv = malloc(sizeof(float) * T);
    uint32_t s = 7;
    int ts = T / S;
    for (int i = 0; i <= S; i++)
        cu[i] = i * ts;
    for (int t = 0; t < T; t++) {
        s = s * 1664525u + 1013904223u;
        tok[t] = (int32_t)((s >> 8) % (uint32_t)c.vocab_size);
        mask[t] = (t % ts) >= ts / 4;
        adv[t] = ((t / ts) % 2) ? 1.0f : -0.5f;
    }
    al_train_chunk ch = {.T = T, .nseq = S, .tokens = tok, .cu_seqlens = cu, .mask = mask, .adv = adv};
    al_trainer_config tc;
    al_trainer_config_default(&tc);
    tc.optim.lr = 1e-5f;
    char err[512];
    al_trainer *tr = al_trainer_new(m, NULL, &tc, err, sizeof err);
    if (!tr) {
        fprintf(stderr, "bench_gpu: %s\n", err);
        return 1;
    }
    al_train_stats st;
    for (int i = 0; i < 2; i++) /* warm-up: plans, pools, clocks */
        if (al_trainer_step(tr, &ch, 1, &st, err, sizeof err)) {
            fprintf(stderr, "bench_gpu: %s\n", err);
            return 1;
        }
    be->ops->sync(be);
    double t0 = now_s();
    for (int i = 0; i < steps; i++)
        if (al_trainer_step(tr, &ch, 1, &st, err, sizeof err)) {
            fprintf(stderr, "bench_gpu: %s\n", err);
            return 1;
        }
    be->ops->sync(be);
    double dt = (now_s() - t0) / steps;
    double attn = 3.0 * c.num_layers * 4.0 * c.head_dim * c.num_heads * (ts + 1) / 2.0;
    double flops = (6.0 * matrix_params(&c) + attn) * T;
    printf("result bench=train device=%s params=%zu layers=%d tokens=%d seqs=%d step_s=%.4f "
           "tokens_per_s=%.0f tflops=%.1f mfu=%.4f loss=%.5f\n",
           be->ops->name, al_model_num_params(m), c.num_layers, T, S, dt, T / dt, flops / dt / 1e12,
           flops / dt / PEAK_BF16, st.loss);
    al_trainer_free(tr);
    al_model_free(m);
    al_backend_free(be);
    free(tok), free(cu), free(mask), free(adv);
    return 0;
}

/* Prefill B prompts of P tokens, then N greedy decode steps of all B together. */
static int decode_once(al_model *m, al_backend *be, const al_model_config *cp, int B, int P, int N)
{
    al_model_config c = *cp;
    char err[512];
    al_infer_kv **kv = calloc((size_t)B, sizeof *kv);
    int32_t *prompt = malloc(sizeof(int32_t) * (size_t)B * P), *next = malloc(sizeof(int32_t) * B);
    const int32_t **in = malloc(sizeof(int32_t *) * B);
    int *n = malloc(sizeof(int) * B);
    float *logits = malloc(sizeof(float) * (size_t)B * c.vocab_size);
    for (int i = 0; i < B; i++) {
        if (!(kv[i] = al_infer_kv_new(m, P + N + 1, err, sizeof err))) {
            fprintf(stderr, "bench_gpu: %s\n", err);
            return 1;
        }
        for (int t = 0; t < P; t++)
            prompt[(size_t)i * P + t] = (int32_t)((t * 131 + i * 7919) % c.vocab_size);
        in[i] = prompt + (size_t)i * P, n[i] = P;
    }
    al_infer_scratch *sc = al_infer_scratch_new();
    if (al_infer_forward(m, sc, kv, in, n, B, logits, err, sizeof err)) {
        fprintf(stderr, "bench_gpu: %s\n", err);
        return 1;
    }
    double t0 = 0;
    for (int step = 0; step < N; step++) {
        if (step == 2) be->ops->sync(be), t0 = now_s(); /* two warm-up steps */
        for (int i = 0; i < B; i++) {
            const float *l = logits + (size_t)i * c.vocab_size;
            int best = 0;
            for (int j = 1; j < c.vocab_size; j++)
                if (l[j] > l[best]) best = j;
            next[i] = best, in[i] = &next[i], n[i] = 1;
        }
        if (al_infer_forward(m, sc, kv, in, n, B, logits, err, sizeof err)) {
            fprintf(stderr, "bench_gpu: %s\n", err);
            return 1;
        }
    }
    double dt = now_s() - t0;
    printf("result bench=decode device=%s batch=%d prompt=%d new=%d tokens_per_s=%.1f "
           "step_ms=%.3f\n",
           be->ops->name, B, P, N, (double)B * (N - 2) / dt, dt / (N - 2) * 1e3);
    for (int i = 0; i < B; i++)
        al_infer_kv_free(kv[i]);
    al_infer_scratch_free(sc);
    free(kv), free(prompt), free(next), free(in), free(n), free(logits);
    return 0;
}

/* --batch takes a comma-separated list: one model, one measurement per batch size. */
static int cmd_decode(int argc, char **argv)
{
    const char *device = arg(argc, argv, "--device", "cuda");
    int layers = atoi(arg(argc, argv, "--layers", "24"));
    const char *batches = arg(argc, argv, "--batch", "1,64");
    int P = atoi(arg(argc, argv, "--prompt", "128")), N = atoi(arg(argc, argv, "--new", "128"));
    if (P <= 0 || N <= 2 || layers <= 0) {
        fprintf(stderr, "bench_gpu decode: --prompt, --new (> 2), --layers must be positive\n");
        return 2;
    }
    al_model_config c = qwen05b(layers);
    al_backend *be;
    al_model *m = make_model(&c, device, &be);
    int rc = 0;
    for (const char *b = batches; *b && rc == 0;) {
        int B = atoi(b);
        if (B <= 0) {
            fprintf(stderr, "bench_gpu decode: bad --batch '%s'\n", batches);
            rc = 2;
            break;
        }
        rc = decode_once(m, be, &c, B, P, N);
        b = strchr(b, ',');
        if (!b) break;
        b++;
    }
    al_model_free(m);
    al_backend_free(be);
    return rc;
}

static int cmd_save(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: bench_gpu save DIR [--layers N]\n");
        return 2;
    }
    al_model_config c = qwen05b(atoi(arg(argc, argv, "--layers", "24")));
    char err[512], path[4096];
    al_model *m = al_model_new(&c, err, sizeof err);
    if (!m) {
        fprintf(stderr, "bench_gpu: %s\n", err);
        return 1;
    }
    al_model_init_random(m, 1);
    snprintf(path, sizeof path, "%s/model.safetensors", argv[2]);
    if (al_model_save_safetensors(m, path, AL_ST_DTYPE_BF16, err, sizeof err) != 0) {
        fprintf(stderr, "bench_gpu: %s\n", err);
        return 1;
    }
    snprintf(path, sizeof path, "%s/config.json", argv[2]);
    if (al_model_config_save(&c, "bfloat16", path, err, sizeof err) != 0) {
        fprintf(stderr, "bench_gpu: %s\n", err);
        return 1;
    }
    printf("result bench=save dir=%s params=%zu\n", argv[2], al_model_num_params(m));
    al_model_free(m);
    return 0;
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc >= 2 && !strcmp(argv[1], "train")) return cmd_train(argc, argv);
    if (argc >= 2 && !strcmp(argv[1], "decode")) return cmd_decode(argc, argv);
    if (argc >= 2 && !strcmp(argv[1], "save")) return cmd_save(argc, argv);
    fprintf(stderr, "usage: bench_gpu train|decode|save ... (see the top of bench/bench_gpu.c)\n");
    return 2;
}
