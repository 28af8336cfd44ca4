/*
 * 1702: the CUDA backend against the PyTorch dumps of tests/model (ref_model.py: Qwen2 with
 * biases and a tied head, Qwen3 with q/k norms and an untied head; one packed batch of three
 * sequences). The same checks as 0600 with bf16 tolerances (the dumps are f32):
 *   logits                max |cuda - ref| <= 3e-2 * max(1, max|ref|)
 *   logp, entropy         max |cuda - ref| <= 5e-2 * max(1, max|ref|)
 *   each gradient         ‖cuda - ref‖ / ‖ref‖ <= 6e-2
 * and the trainer's path (al_model_forward_logprob) gives the same logprobs as logits taken
 * to the host. Skipped without a CUDA device.
 */
#include "t1799_gpu_util.h"

#include "model/logprob.h"
#include "model/loss.h"
#include "model/model.h"
#include "model/safetensors.h"
#include "model/tensor_dump.h"

static double max_abs(const float *a, size_t n)
{
    double m = 0;
    for (size_t i = 0; i < n; i++)
        if (fabs(a[i]) > m) m = fabs(a[i]);
    return m;
}
static int close_max(const char *what, const float *got, const float *ref, size_t n, double rel)
{
    double scale = fmax(1.0, max_abs(ref, n)), e = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - ref[i]);
        if (!(d <= e)) e = d;
    }
    printf("    %-24s max err %.3g (tol %.3g)\n", what, e, rel * scale);
    return e <= rel * scale;
}

static void check_reference(const char *name)
{
    char path[512], err[1024];
    snprintf(path, sizeof path, "tests/model/ref-%s", name);
    al_model *m = al_model_load_dir(path, err, sizeof err);
    REQUIREF(m, "%s", err);
    REQUIREF(al_model_set_backend(m, gpu_be, err, sizeof err) == 0, "%s", err);
    tdump d;
    snprintf(path, sizeof path, "tests/model/ref-%s.bin", name);
    if (tdump_load(&d, path, "ALMD", "/usr/bin/python3 tests/model/ref_model.py --regenerate", err,
                   sizeof err)) {
        al_model_free(m);
        REQUIREF(0, "%s", err);
    }
    const al_model_config *c = al_model_config_of(m);
    size_t nt = 0, nc = 0;
    int32_t *tok = tdump_i32(&d, "in/tokens", &nt), *pos = tdump_i32(&d, "in/positions", NULL);
    int32_t *cu = tdump_i32(&d, "in/cu_seqlens", &nc), *tg = tdump_i32(&d, "in/targets", NULL);
    float *mask = tdump_f32(&d, "in/mask", NULL), *old = tdump_f32(&d, "in/old_logp", NULL);
    float *adv = tdump_f32(&d, "in/adv", NULL), *hp = tdump_f32(&d, "ppo/hparams", NULL);
    REQUIRE(tok && pos && cu && tg && mask && old && adv && hp);
    int T = (int)nt, nseq = (int)nc - 1, V = c->vocab_size;
    size_t TV = (size_t)T * V;
    float *logits = malloc(sizeof(float) * TV), *dlogits = malloc(sizeof(float) * TV);
    float *lp = malloc(sizeof(float) * T), *en = malloc(sizeof(float) * T);
    float *lp2 = malloc(sizeof(float) * T), *en2 = malloc(sizeof(float) * T);
    al_model_zero_grad(m);
    REQUIREF(al_model_forward(m, tok, pos, cu, nseq, T, logits) == 0, "%s", al_model_error(m));
    REQUIRE(al_logprob_forward(logits, tg, T, V, 1.0f, lp, en, err, sizeof err) == 0);
    float *r = tdump_f32(&d, "out/logits", NULL);
    CHECK(r && close_max("logits", logits, r, TV, 3e-2));
    free(r);
    r = tdump_f32(&d, "out/logp", NULL);
    CHECK(r && close_max("logp", lp, r, (size_t)T, 5e-2));
    free(r);
    r = tdump_f32(&d, "out/entropy", NULL);
    CHECK(r && close_max("entropy", en, r, (size_t)T, 5e-2));
    free(r);
    /* the PPO loss's d/dlogits on the host, then the device's backward */
    al_loss_config lc;
    al_loss_config_default(&lc);
    lc.eps_low = hp[0], lc.eps_high = hp[1], lc.entropy_coef = hp[2];
    al_loss_input in = {.T = T, .nseq = nseq, .cu_seqlens = cu, .logp = lp, .old_logp = old,
                        .entropy = en, .adv = adv, .mask = mask};
    float *dlp = calloc((size_t)T, sizeof(float)), *dent = calloc((size_t)T, sizeof(float));
    double loss = 0;
    REQUIRE(al_loss_compute(&lc, &in, 0, &loss, dlp, dent, NULL, err, sizeof err) == 0);
    r = tdump_f32(&d, "out/loss", NULL);
    REQUIRE(r);
    printf("    loss %.6f vs %.6f\n", loss, r[0]);
    CHECK_NEAR(loss, r[0], 3e-2 * fmax(1.0, fabs(r[0])));
    free(r);
    al_logprob_backward(logits, tg, T, V, 1.0f, dlp, dent, dlogits);
    REQUIREF(al_model_backward(m, dlogits) == 0, "%s", al_model_error(m));
    const float *grads = al_model_grads(m);
    double worst = 0;
    const char *wn = "";
    for (size_t i = 0; i < al_model_num_tensors(m); i++) {
        const al_model_tensor *t = &al_model_tensors(m)[i];
        char rn[200];
        snprintf(rn, sizeof rn, "grad/%s", t->name);
        size_t rnum = 0;
        r = tdump_f32(&d, rn, &rnum);
        CHECKF(r && rnum == t->numel, "dump has no %s of %zu values", rn, t->numel);
        if (!r) continue;
        double e = rel_l2(grads + t->offset, r, t->numel);
        if (!(e <= worst)) worst = e, wn = t->name;
        CHECKF(e <= 6e-2, "gradient of %s: relative L2 error %.3g", t->name, e);
        free(r);
    }
    printf("    %zu gradients, worst relative L2 error %.3g (%s)\n", al_model_num_tensors(m), worst, wn);
    /* the trainer's path keeps the logits on the device */
    REQUIREF(al_model_forward_logprob(m, tok, pos, cu, nseq, T, tg, 1.0f, lp2, en2) == 0, "%s",
             al_model_error(m));
    double e1 = 0, e2 = 0;
    for (int t = 0; t < T; t++)
        e1 = fmax(e1, fabs(lp2[t] - lp[t])), e2 = fmax(e2, fabs(en2[t] - en[t]));
    printf("    device logprobs vs host logprobs: %.3g, entropies %.3g\n", e1, e2);
    CHECKF(e1 <= 1e-3 && e2 <= 1e-3, "the device's logprob path differs by %.3g / %.3g", e1, e2);
    free(logits), free(dlogits), free(lp), free(en), free(lp2), free(en2), free(dlp), free(dent);
    free(tok), free(pos), free(cu), free(tg), free(mask), free(old), free(adv), free(hp);
    tdump_free(&d);
    al_model_free(m);
}

TEST(qwen2_vs_pytorch_bf16)
{
    check_reference("qwen2");
}
TEST(qwen3_vs_pytorch_bf16)
{
    check_reference("qwen3");
}

int main(int argc, char **argv)
{
    return gpu_test_main(argc, argv);
}
