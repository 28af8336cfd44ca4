/*
 * bench_logprob: per-token logprobs + entropy, the PPO loss, and d loss / d logits for one
 * micro-batch of T tokens over a vocabulary of V (the part of a training step after the LM
 * head), arclight against PyTorch 1.13 doing the same in the same run (both on OMP_NUM_THREADS
 * threads, 2 by default). Prints both times and the ratio (PyTorch / arclight: > 1 means
 * arclight is faster).
 *
 *   bench_logprob [T V iters]      (defaults 512 32768 5)
 */
#include "model/logprob.h"
#include "model/loss.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
    int T = argc > 1 ? atoi(argv[1]) : 512, V = argc > 2 ? atoi(argv[2]) : 32768;
    int iters = argc > 3 ? atoi(argv[3]) : 5;
    if (T <= 0 || V <= 0 || iters <= 0) {
        fprintf(stderr, "usage: bench_logprob [T V iters]\n");
        return 2;
    }
    if (!getenv("OMP_NUM_THREADS")) setenv("OMP_NUM_THREADS", "2", 1);
    float *logits = malloc(sizeof(float) * (size_t)T * V);
    float *dlogits = malloc(sizeof(float) * (size_t)T * V);
    int32_t *targets = malloc(sizeof(int32_t) * T), cu[2] = {0, T};
    float *logp = malloc(sizeof(float) * T), *ent = malloc(sizeof(float) * T);
    float *old = malloc(sizeof(float) * T), *adv = malloc(sizeof(float) * T);
    float *mask = malloc(sizeof(float) * T), *dlogp = malloc(sizeof(float) * T);
    float *dent = malloc(sizeof(float) * T);
    if (!logits || !dlogits) {
        fprintf(stderr, "bench_logprob: out of memory\n");
        return 1;
    }
    uint32_t s = 1;
    for (size_t i = 0; i < (size_t)T * V; i++) {
        s = s * 1664525u + 1013904223u;
        logits[i] = ((float)(s >> 8) / 16777216.0f - 0.5f) * 8.0f;
    }
    for (int t = 0; t < T; t++) {
        targets[t] = (int32_t)((t * 7919u) % (unsigned)V);
        adv[t] = (t % 3) ? 0.5f : -1.0f;
        mask[t] = 1.0f;
    }
    char err[256];
    al_logprob_forward(logits, targets, T, V, 1.0f, old, NULL, err, sizeof err);
    for (int t = 0; t < T; t++) old[t] += 0.1f * (float)((t % 5) - 2);
    al_loss_config cfg;
    al_loss_config_default(&cfg);
    cfg.entropy_coef = 0.001f;
    al_loss_input in = {.T = T, .nseq = 1, .cu_seqlens = cu, .logp = logp, .old_logp = old,
                        .entropy = ent, .adv = adv, .mask = mask};
    double best = 1e30, loss = 0;
    for (int it = 0; it < iters + 1; it++) {
        double t0 = now_s();
        if (al_logprob_forward(logits, targets, T, V, 1.0f, logp, ent, err, sizeof err) ||
            al_loss_compute(&cfg, &in, 0.0, &loss, dlogp, dent, NULL, err, sizeof err)) {
            fprintf(stderr, "bench_logprob: %s\n", err);
            return 1;
        }
        al_logprob_backward(logits, targets, T, V, 1.0f, dlogp, dent, dlogits);
        double dt = now_s() - t0;
        if (it > 0 && dt < best) best = dt; /* the first run warms caches and threads */
    }

    /* PyTorch, same sizes, same math, best of the same number of runs. */
    char cmd[4096];
    snprintf(cmd, sizeof cmd,
             "/usr/bin/python3 - <<'PY'\n"
             "import time, torch\n"
             "torch.set_num_threads(int(%s))\n"
             "T, V, iters = %d, %d, %d\n"
             "g = torch.Generator().manual_seed(1)\n"
             "logits0 = (torch.rand(T, V, generator=g) - 0.5) * 8\n"
             "tg = (torch.arange(T) * 7919) %% V\n"
             "adv = torch.where(torch.arange(T) %% 3 == 0, -1.0, 0.5)\n"
             "with torch.no_grad():\n"
             "    old = torch.log_softmax(logits0, -1).gather(-1, tg[:, None])[:, 0]\n"
             "old = old + 0.1 * ((torch.arange(T) %% 5) - 2).float()\n"
             "best = 1e30\n"
             "for it in range(iters + 1):\n"
             "    x = logits0.clone().requires_grad_(True)\n"
             "    t0 = time.perf_counter()\n"
             "    ls = torch.log_softmax(x, -1)\n"
             "    lp = ls.gather(-1, tg[:, None])[:, 0]\n"
             "    ent = -(ls.exp() * ls).sum(-1)\n"
             "    r = torch.exp(lp - old)\n"
             "    pg = torch.maximum(-adv * r, -adv * r.clamp(0.8, 1.2))\n"
             "    loss = (pg - 0.001 * ent).mean()\n"
             "    loss.backward()\n"
             "    dt = time.perf_counter() - t0\n"
             "    if it > 0: best = min(best, dt)\n"
             "print(best)\n"
             "PY",
             getenv("OMP_NUM_THREADS"), T, V, iters);
    FILE *p = popen(cmd, "r");
    double ref = NAN;
    if (!p || fscanf(p, "%lf", &ref) != 1) ref = NAN;
    if (p) pclose(p);
    printf("logprob+entropy+ppo loss+backward, T=%d V=%d, %s threads\n", T, V,
           getenv("OMP_NUM_THREADS"));
    printf("  arclight %.2f ms   pytorch %.2f ms   ratio pytorch/arclight %.2f\n", best * 1e3,
           ref * 1e3, ref / best);
    free(logits), free(dlogits), free(targets), free(logp), free(ent), free(old), free(adv);
    free(mask), free(dlogp), free(dent);
    return isfinite(ref) ? 0 : 1;
}
