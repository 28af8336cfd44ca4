/*
 * 1701: a whole training step on the CUDA backend against the same step on the CPU backend:
 * a Qwen2-shaped model (biases, tied head) and a Qwen3-shaped one (q/k norms, untied head),
 * a packed batch of six sequences in three chunks, PPO with clip-higher, KL to a reference
 * and an entropy bonus, two mini-batches and two epochs (old logprobs, gradient clipping,
 * AdamW). bf16 activations against f32: the step's loss and grad norm within 3e-2 relative,
 * the weights after the step within 1e-2 relative L2 (their change is what the step did:
 * also compared, within 1e-1). Skipped without a CUDA device.
 */
#include "t1799_gpu_util.h"

#include "model/trainer.h"

enum { NSEQ = 6 };

static al_model *model(al_model_arch arch, char *err, size_t errlen)
{
    al_model_config c = {0};
    al_model_config_set_arch(&c, arch);
    c.vocab_size = 160, c.hidden_size = 64, c.intermediate_size = 96, c.num_layers = 2;
    c.num_heads = 4, c.num_kv_heads = 2, c.head_dim = arch == AL_MODEL_ARCH_QWEN3 ? 32 : 16;
    c.rms_norm_eps = 1e-6, c.rope_theta = 1e6, c.tie_word_embeddings = arch == AL_MODEL_ARCH_QWEN2;
    c.max_position_embeddings = 512, c.bos_token_id = c.eos_token_id = -1;
    al_model *m = al_model_new(&c, err, errlen);
    if (!m) return NULL;
    al_model_init_random(m, 3);
    float *p = al_model_params(m);
    for (size_t i = 0; i < al_model_num_tensors(m); i++) {
        const al_model_tensor *t = &al_model_tensors(m)[i];
        if (strstr(t->name, "norm")) continue;
        for (size_t j = 0; j < t->numel; j++)
            p[t->offset + j] = bf16_round(p[t->offset + j] * 4.0f);
    }
    return m;
}

static void step_matches(al_model_arch arch)
{
    char err[512];
    al_model *mc = model(arch, err, sizeof err), *mg = model(arch, err, sizeof err);
    REQUIREF(mc && mg, "%s", err);
    al_model *rc = al_trainer_clone_model(mc, err, sizeof err), *rg = al_trainer_clone_model(mg, err, sizeof err);
    REQUIREF(rc && rg, "%s", err);
    REQUIREF(al_model_set_backend(mg, gpu_be, err, sizeof err) == 0, "%s", err);
    REQUIREF(al_model_set_backend(rg, gpu_be, err, sizeof err) == 0, "%s", err);
    size_t np = al_model_num_params(mc);
    float *before = malloc(sizeof(float) * np);
    memcpy(before, al_model_params(mc), sizeof(float) * np);

    /* the batch: six sequences, three chunks of two */
    static const int lens[NSEQ] = {40, 9, 71, 12, 33, 20}, prompt[NSEQ] = {5, 4, 8, 3, 6, 5};
    int32_t tok[256], cu[3][3];
    float mask[256], adv[256], roll[256];
    al_train_chunk ch[3];
    int t = 0;
    uint32_t s = 11;
    for (int c = 0; c < 3; c++) {
        int t0 = t;
        cu[c][0] = 0;
        for (int i = 2 * c; i < 2 * c + 2; i++) {
            for (int k = 0; k < lens[i]; k++, t++) {
                s = s * 1664525u + 1013904223u;
                tok[t] = (int32_t)((s >> 10) % 160);
                mask[t] = k >= prompt[i];
                adv[t] = i % 3 == 0 ? -1.0f : 0.4f * i;
                roll[t] = -4.0f - (float)((s >> 20) % 100) / 100.0f;
            }
            cu[c][i - 2 * c + 1] = t - t0;
        }
        ch[c] = (al_train_chunk){.T = t - t0, .nseq = 2, .tokens = tok + t0, .cu_seqlens = cu[c],
                                 .mask = mask + t0, .adv = adv + t0, .rollout_logp = roll + t0};
    }
    al_trainer_config tc;
    al_trainer_config_default(&tc);
    tc.loss.eps_high = 0.28f, tc.loss.kl_beta = 0.05f, tc.loss.entropy_coef = 0.01f;
    tc.loss.tis_cap = 2.0f;
    tc.ppo_epochs = 2, tc.mini_batches = 2;
    tc.optim.lr = 1e-3f, tc.optim.grad_clip = 1.0f;
    al_trainer *tcpu = al_trainer_new(mc, rc, &tc, err, sizeof err);
    al_trainer *tgpu = al_trainer_new(mg, rg, &tc, err, sizeof err);
    REQUIREF(tcpu && tgpu, "%s", err);
    al_train_stats sc, sg;
    REQUIREF(al_trainer_step(tcpu, ch, 3, &sc, err, sizeof err) == 0, "cpu: %s", err);
    REQUIREF(al_trainer_step(tgpu, ch, 3, &sg, err, sizeof err) == 0, "cuda: %s", err);
    printf("    loss %.6f vs %.6f, grad norm %.5f vs %.5f, kl %.3g vs %.3g, entropy %.4f vs %.4f\n",
           sg.loss, sc.loss, sg.grad_norm, sc.grad_norm, sg.kl, sc.kl, sg.entropy, sc.entropy);
    CHECKF(fabs(sg.loss - sc.loss) <= 3e-2 * fmax(fabs(sc.loss), 1e-2), "loss %.6f vs %.6f",
           sg.loss, sc.loss);
    CHECKF(fabs(sg.grad_norm - sc.grad_norm) <= 3e-2 * sc.grad_norm, "grad norm %.6f vs %.6f",
           sg.grad_norm, sc.grad_norm);
    CHECKF(fabs(sg.entropy - sc.entropy) <= 1e-2 * sc.entropy, "entropy %.6f vs %.6f", sg.entropy,
           sc.entropy);
    CHECK_EQ_INT(sg.step, sc.step);
    const float *pc = al_model_params(mc), *pg = al_model_params(mg);
    double e = rel_l2(pg, pc, np);
    float *dc = malloc(sizeof(float) * np), *dg = malloc(sizeof(float) * np);
    for (size_t i = 0; i < np; i++)
        dc[i] = pc[i] - before[i], dg[i] = pg[i] - before[i];
    double ed = rel_l2(dg, dc, np);
    printf("    weights after the step: rel L2 %.3g; their change: %.3g\n", e, ed);
    CHECKF(e <= 1e-2, "weights after the step differ by %.3g", e);
    CHECKF(ed <= 1e-1, "the step's change of the weights differs by %.3g", ed);
    /* the optimizer's moments come back to the host for checkpoints */
    const al_adamw *oc = al_trainer_optimizer(tcpu), *og = al_trainer_optimizer(tgpu);
    double em = rel_l2(og->m, oc->m, np);
    printf("    exp_avg rel L2 %.3g\n", em);
    CHECKF(em <= 5e-2, "exp_avg differs by %.3g", em);
    free(dc), free(dg), free(before);
    al_trainer_free(tcpu), al_trainer_free(tgpu);
    al_model_free(mc), al_model_free(mg), al_model_free(rc), al_model_free(rg);
}

TEST(train_step_qwen2)
{
    step_matches(AL_MODEL_ARCH_QWEN2);
}
TEST(train_step_qwen3)
{
    step_matches(AL_MODEL_ARCH_QWEN3);
}

int main(int argc, char **argv)
{
    return gpu_test_main(argc, argv);
}
