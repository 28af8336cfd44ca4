/*
 * t0653_trainer_vs_pytorch: three training steps of the reference Qwen2 model
 * (tests/model/ref-qwen2) through al_trainer_step against tests/model/ref_trainer.py, the same
 * driver written in PyTorch: 4 chunks per step, 2 mini-batches, 2 PPO epochs, old logprobs
 * once per step, a frozen reference for k3 KL, truncated IS, dual clip, entropy bonus,
 * seq-mean-token-mean, AdamW with warmup + cosine, clipping, no decay on 1-D tensors.
 *
 * Tolerances: the step's statistics 2e-4 relative + 1e-5 absolute (float32 on both sides
 * over 12 AdamW updates of a 100k-parameter model); the final weights of four tensors within
 * 2e-5 absolute: AdamW moves a weight by about lr sign(g) whatever |g|, so rounding noise in a
 * near-zero gradient can move it by up to lr = 3e-4 in either direction, but only a few such
 * weights should exist, so at most 0.5 % of the elements may be off by more than that.
 */
#include "testlib.h"

#include "model/tensor_dump.h"
#include "model/safetensors.h"
#include "model/trainer.h"

static const char *const stat_names[] = {"loss", "grad_norm", "grad_norm_max", "pg_loss", "kl",
                                         "entropy", "clip_frac", "dual_clip_frac", "ratio_mean",
                                         "ratio_max", "tis_mean", "tokens", "updates"};

static double stat_of(const al_train_stats *s, int k)
{
    switch (k) {
    case 0: return s->loss;
    case 1: return s->grad_norm;
    case 2: return s->grad_norm_max;
    case 3: return s->pg_loss;
    case 4: return s->kl;
    case 5: return s->entropy;
    case 6: return s->clip_frac;
    case 7: return s->dual_clip_frac;
    case 8: return s->ratio_mean;
    case 9: return s->ratio_max;
    case 10: return s->tis_mean;
    case 11: return s->tokens;
    default: return s->updates;
    }
}

TEST(three_steps_match_pytorch)
{
    char err[1200];
    char path[1024];
    const char *src = getenv("ARCLIGHT_SOURCE_DIR");
    snprintf(path, sizeof path, "%s/tests/model/ref_trainer.bin", src ? src : ".");
    tdump d;
    REQUIREF(tdump_load(&d, path, "ALSS", "/usr/bin/python3 tests/model/ref_trainer.py", err,
                        sizeof err) == 0,
             "%s", err);
    snprintf(path, sizeof path, "%s/tests/model/ref-qwen2", src ? src : ".");
    al_model *policy = al_model_load_dir(path, err, sizeof err);
    al_model *ref = al_model_load_dir(path, err, sizeof err);
    REQUIREF(policy && ref, "%s", err);

    float *c = tdump_f32(&d, "config", NULL);
    int32_t *shape = tdump_i32(&d, "shape", NULL);
    REQUIRE(c && shape);
    al_trainer_config tc;
    al_trainer_config_default(&tc);
    tc.loss.kind = (al_loss_kind)(int)c[0];
    tc.loss.agg = (al_loss_agg)(int)c[1];
    tc.loss.eps_low = c[2], tc.loss.eps_high = c[3], tc.loss.dual_clip = c[4];
    tc.loss.tis_cap = c[5], tc.loss.kl = (al_kl_kind)(int)c[6], tc.loss.kl_beta = c[7];
    tc.loss.entropy_coef = c[8];
    tc.ppo_epochs = (int)c[9], tc.mini_batches = (int)c[10], tc.temperature = c[11];
    tc.optim.lr = c[12], tc.optim.beta1 = c[13], tc.optim.beta2 = c[14], tc.optim.eps = c[15];
    tc.optim.weight_decay = c[16], tc.optim.grad_clip = c[17];
    tc.optim.warmup_steps = (int64_t)c[18], tc.optim.total_steps = (int64_t)c[19];
    tc.optim.min_lr_ratio = c[20];
    tc.optim.schedule = AL_LR_COSINE;
    tc.decay_1d = 0;
    al_trainer *tr = al_trainer_new(policy, ref, &tc, err, sizeof err);
    REQUIREF(tr, "%s", err);

    int steps = shape[0], nch = shape[1];
    for (int s = 0; s < steps; s++) {
        al_train_chunk *ch = calloc((size_t)nch, sizeof *ch);
        void *owned[64];
        int no = 0;
        for (int k = 0; k < nch; k++) {
            char key[128];
            size_t T = 0, ncu = 0;
#define GET(type, field, nout)                                                                     \
    (snprintf(key, sizeof key, "step/%d/chunk/%d/" field, s, k), owned[no++] = tdump_##type(&d, key, nout))
            ch[k].tokens = GET(i32, "tokens", &T);
            ch[k].cu_seqlens = GET(i32, "cu", &ncu);
            ch[k].mask = GET(f32, "mask", NULL);
            ch[k].adv = GET(f32, "adv", NULL);
            ch[k].rollout_logp = GET(f32, "rollout", NULL);
#undef GET
            REQUIRE(ch[k].tokens && ch[k].cu_seqlens && ch[k].mask && ch[k].adv && ch[k].rollout_logp);
            ch[k].T = (int)T;
            ch[k].nseq = (int)ncu - 1;
        }
        al_train_stats st;
        int rc = al_trainer_step(tr, ch, nch, &st, err, sizeof err);
        CHECKF(rc == 0, "step %d: %s", s, err);
        char key[64];
        snprintf(key, sizeof key, "step/%d/stats", s);
        float *want = tdump_f32(&d, key, NULL);
        REQUIRE(want);
        for (int k = 0; k < (int)(sizeof stat_names / sizeof stat_names[0]); k++) {
            double got = stat_of(&st, k), w = want[k];
            CHECKF(fabs(got - w) <= 1e-5 + 2e-4 * fabs(w), "step %d %s: %.9g vs torch %.9g", s,
                   stat_names[k], got, w);
        }
        printf("  step %d: loss %.6f (torch %.6f) grad norm %.4f clip %.3f kl %.5f\n", s, st.loss,
               want[0], st.grad_norm, st.clip_frac, st.kl);
        free(want);
        for (int i = 0; i < no; i++) free(owned[i]);
        free(ch);
    }

    const float *p = al_model_params(policy);
    for (int i = 0; i < d.count; i++) {
        if (strncmp(d.t[i].name, "final/", 6) != 0) continue;
        const char *name = d.t[i].name + 6;
        const al_model_tensor *t = al_model_tensor_find(policy, name);
        REQUIREF(t, "no tensor %s", name);
        size_t n;
        float *want = tdump_f32(&d, d.t[i].name, &n);
        REQUIRE(want && n == t->numel);
        size_t off_lr = 0, off_far = 0;
        double worst = 0;
        for (size_t j = 0; j < n; j++) {
            double e = fabs((double)p[t->offset + j] - want[j]);
            if (e > worst) worst = e;
            if (e > 2e-5) off_lr++;
            if (e > 2.5 * tc.optim.lr) off_far++;
        }
        CHECKF(off_lr <= n / 200 && off_far == 0,
               "%s: %lld of %lld weights differ by > 2e-5, %lld by > 2.5 lr (worst %.3g)", name,
               (long long)off_lr, (long long)n, (long long)off_far, worst);
        free(want);
    }
    free(c);
    free(shape);
    al_trainer_free(tr);
    al_model_free(policy);
    al_model_free(ref);
    tdump_free(&d);
}
