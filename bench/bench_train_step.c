/*
 * bench_train_step: one training step of a ~10M-parameter Qwen2-style model on the CPU:
 * forward, per-token logprobs, SFT loss, backward, gradient clipping, AdamW. Prints the
 * median step time; bench/bench_train_step.sh runs PyTorch on the same model and batch in
 * the same run and prints the ratio.
 *
 *   bench_train_step CONFIG.json [--seqlens 256,256] [--steps N] [--warmup N]
 */
#include "model/logprob.h"
#include "model/loss.h"
#include "model/model.h"
#include "model/optim.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(
            stderr,
            "usage: bench_train_step CONFIG.json [--seqlens A,B,..] [--steps N] [--warmup N]\n");
        return 2;
    }
    const char *seqlens = "256,256";
    int steps = 5, warmup = 2;
    for (int i = 2; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--seqlens"))
            seqlens = argv[i + 1];
        else if (!strcmp(argv[i], "--steps"))
            steps = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--warmup"))
            warmup = atoi(argv[i + 1]);
        else {
            fprintf(stderr, "bench_train_step: unknown flag %s\n", argv[i]);
            return 2;
        }
    }
    char err[512];
    al_model_config cfg;
    if (al_model_config_load(&cfg, argv[1], err, sizeof err)) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    al_model *m = al_model_new(&cfg, err, sizeof err);
    if (!m) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    al_model_init_random(m, 1);

    int32_t cu[65] = {0};
    int nseq = 0;
    for (const char *p = seqlens; *p && nseq < 64;) {
        int n = atoi(p);
        cu[nseq + 1] = cu[nseq] + n;
        nseq++;
        p = strchr(p, ',');
        if (!p) break;
        p++;
    }
    int T = cu[nseq], V = cfg.vocab_size;
    int32_t *tok = malloc(sizeof(int32_t) * T), *pos = malloc(sizeof(int32_t) * T);
    int32_t *tgt = malloc(sizeof(int32_t) * T);
    float *mask = malloc(sizeof(float) * T), *logp = malloc(sizeof(float) * T);
    float *dlogp = malloc(sizeof(float) * T);
    float *logits = malloc(sizeof(float) * (size_t)T * V);
    uint64_t s = 7;
    for (int q = 0; q < nseq; q++)
        for (int t = cu[q]; t < cu[q + 1]; t++) {
            s = s * 6364136223846793005ULL + 1442695040888963407ULL;
            tok[t] = (int32_t)((s >> 33) % (uint64_t)V);
            pos[t] = t - cu[q];
        }
    for (int q = 0; q < nseq; q++)
        for (int t = cu[q]; t < cu[q + 1]; t++) {
            tgt[t] = t + 1 < cu[q + 1] ? tok[t + 1] : -1;
            mask[t] = tgt[t] >= 0 ? 1.0f : 0.0f;
        }

    al_optim_config oc;
    al_optim_config_default(&oc);
    oc.lr = 1e-4f, oc.weight_decay = 0.01f, oc.grad_clip = 1.0f;
    al_adamw opt;
    if (al_adamw_init(&opt, &oc, al_model_num_params(m), err, sizeof err)) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    al_loss_config lc;
    al_loss_config_default(&lc);
    lc.kind = AL_LOSS_SFT;
    double *times = malloc(sizeof(double) * (steps > 0 ? steps : 1)), fwd = 0, bwd = 0, upd = 0;
    double loss = 0;
    for (int it = 0; it < warmup + steps; it++) {
        double t0 = now_s();
        al_model_zero_grad(m);
        if (al_model_forward(m, tok, pos, cu, nseq, T, logits)) {
            fprintf(stderr, "%s\n", al_model_error(m));
            return 1;
        }
        al_logprob_forward(logits, tgt, T, V, 1.0f, logp, NULL, err, sizeof err);
        al_loss_input in = {.T = T, .nseq = nseq, .cu_seqlens = cu, .logp = logp, .mask = mask};
        al_loss_compute(&lc, &in, 0, &loss, dlogp, NULL, NULL, err, sizeof err);
        al_logprob_backward(logits, tgt, T, V, 1.0f, dlogp, NULL, logits);
        double t1 = now_s();
        al_model_backward(m, logits);
        double t2 = now_s();
        al_grad_clip(al_model_grads(m), al_model_num_params(m), oc.grad_clip);
        al_adamw_update(&opt, al_model_params(m), al_model_grads(m), al_lr_at(&oc, opt.step));
        double t3 = now_s();
        if (it >= warmup) {
            times[it - warmup] = t3 - t0;
            fwd += t1 - t0, bwd += t2 - t1, upd += t3 - t2;
        }
    }
    qsort(times, (size_t)steps, sizeof(double), cmp_d);
    printf("arclight: %zu params, T=%d (%d sequences), loss %.4f, step %.1f ms "
           "(forward+loss %.1f, backward %.1f, clip+adamw %.1f)\n",
           al_model_num_params(m), T, nseq, loss, 1e3 * times[steps / 2], 1e3 * fwd / steps,
           1e3 * bwd / steps, 1e3 * upd / steps);
    printf("ARCLIGHT_STEP_MS %.3f\n", 1e3 * times[steps / 2]);
    al_adamw_free(&opt);
    free(times), free(tok), free(pos), free(tgt), free(mask), free(logp), free(dlogp), free(logits);
    al_model_free(m);
    return 0;
}
