/*
 * 0600: the model against PyTorch. tests/model/ref_model.py built the same tiny Qwen2
 * (biases, tied head) and Qwen3 (q/k norms, head_dim != hidden/heads, untied head) models
 * from the safetensors committed next to its dumps, ran one packed micro-batch of three
 * sequences and recorded logits, logprobs, entropies, a PPO loss (clip-higher + entropy
 * bonus), every parameter's gradient, and the losses of 10 AdamW updates. Each tensor is
 * compared with the tolerance stated next to it; any mismatch fails the test (exit 1).
 *
 * Tolerances: float32 on both sides, different summation orders (OpenBLAS vs MKL-DNN /
 * ATen), so errors are measured relative to the largest magnitude of the reference tensor:
 *   logits, logp, entropy      max |c - ref| <= 2e-5 * max(1, max|ref|)     (seen ~2e-6)
 *   loss                       |c - ref| <= 1e-5 * max(1, |ref|)            (seen ~1e-6)
 *   dlogits, each gradient     max |c - ref| <= 1e-4 * max|ref|  (+1e-9)    (seen <= 4e-6)
 *   AdamW losses (11 values)   |c - ref| <= 5e-4 * max(0.01, |ref|)
 *   AdamW grad norms           |c - ref| <= 1e-4 * |ref|
 * The errors seen are printed, so a drift shows long before it fails.
 */
#include "testlib.h"
#include "support.h"

#include "model/logprob.h"
#include "model/loss.h"
#include "model/model.h"
#include "model/optim.h"
#include "model/safetensors.h"
#include "model/tensor_dump.h"

static double max_abs(const float *a, size_t n)
{
    double m = 0;
    for (size_t i = 0; i < n; i++)
        if (fabs(a[i]) > m) m = fabs(a[i]);
    return m;
}

static double max_diff(const float *a, const float *b, size_t n)
{
    double m = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (!(d <= m)) m = d; /* NaN propagates */
    }
    return m;
}

/* Compares n floats; returns 1 when within rel * scale (+abs). */
static int compare(const char *what, const float *got, const float *ref, size_t n, double rel,
                   double scale_floor, int verbose)
{
    double scale = max_abs(ref, n);
    if (scale < scale_floor) scale = scale_floor;
    double err = max_diff(got, ref, n), tol = rel * scale + 1e-9;
    if (verbose || !(err <= tol))
        printf("    %-48s max err %.3g (tol %.3g, scale %.3g)%s\n", what, err, tol, scale,
               err <= tol ? "" : "  MISMATCH");
    return err <= tol;
}

typedef struct batch {
    int32_t *tokens, *positions, *cu, *targets;
    float *mask, *old_logp, *adv;
    int T, nseq;
} batch;

static void batch_free(batch *b)
{
    free(b->tokens), free(b->positions), free(b->cu), free(b->targets);
    free(b->mask), free(b->old_logp), free(b->adv);
}

/* Runs the forward pass and the PPO loss of ref_model.py; fills logits, logp, entropy and
 * dlogits (all caller-allocated) and returns the loss. */
static double ppo_step(al_model *m, const batch *b, const float *hp, float *logits, float *logp,
                       float *ent, float *dlogits, int *ok)
{
    const al_model_config *c = al_model_config_of(m);
    char err[256];
    *ok = 0;
    if (al_model_forward(m, b->tokens, b->positions, b->cu, b->nseq, b->T, logits)) {
        printf("    forward: %s\n", al_model_error(m));
        return 0;
    }
    if (al_logprob_forward(logits, b->targets, b->T, c->vocab_size, 1.0f, logp, ent, err,
                           sizeof err)) {
        printf("    logprob: %s\n", err);
        return 0;
    }
    al_loss_config lc;
    al_loss_config_default(&lc);
    lc.kind = AL_LOSS_PPO;
    lc.agg = AL_LOSS_AGG_TOKEN_MEAN;
    lc.eps_low = hp[0], lc.eps_high = hp[1], lc.entropy_coef = hp[2];
    al_loss_input in = {.T = b->T,
                        .nseq = b->nseq,
                        .cu_seqlens = b->cu,
                        .logp = logp,
                        .old_logp = b->old_logp,
                        .entropy = ent,
                        .adv = b->adv,
                        .mask = b->mask};
    double loss = 0;
    float *dlogp = calloc((size_t)b->T, sizeof(float)), *dent = calloc((size_t)b->T, sizeof(float));
    if (al_loss_compute(&lc, &in, 0, &loss, dlogp, dent, NULL, err, sizeof err)) {
        printf("    loss: %s\n", err);
    } else {
        al_logprob_backward(logits, b->targets, b->T, c->vocab_size, 1.0f, dlogp, dent, dlogits);
        *ok = 1;
    }
    free(dlogp);
    free(dent);
    return loss;
}

static double sft_loss(al_model *m, const batch *b, float *logits, float *logp, float *dlogits)
{
    const al_model_config *c = al_model_config_of(m);
    char err[256];
    if (al_model_forward(m, b->tokens, b->positions, b->cu, b->nseq, b->T, logits)) return NAN;
    if (al_logprob_forward(logits, b->targets, b->T, c->vocab_size, 1.0f, logp, NULL, err,
                           sizeof err))
        return NAN;
    al_loss_config lc;
    al_loss_config_default(&lc);
    lc.kind = AL_LOSS_SFT;
    al_loss_input in = {
        .T = b->T, .nseq = b->nseq, .cu_seqlens = b->cu, .logp = logp, .mask = b->mask};
    double loss = NAN;
    float *dlogp = calloc((size_t)b->T, sizeof(float));
    if (!al_loss_compute(&lc, &in, 0, &loss, dlogp, NULL, NULL, err, sizeof err))
        al_logprob_backward(logits, b->targets, b->T, c->vocab_size, 1.0f, dlogp, NULL, dlogits);
    free(dlogp);
    return loss;
}

static void check_reference(const char *name)
{
    char path[512], err[1024];
    snprintf(path, sizeof path, "tests/model/ref-%s", name);
    al_model *m = al_model_load_dir(path, err, sizeof err);
    REQUIREF(m, "%s", err);
    tdump d;
    snprintf(path, sizeof path, "tests/model/ref-%s.bin", name);
    if (tdump_load(&d, path, "ALMD", "/usr/bin/python3 tests/model/ref_model.py --regenerate",
                   err, sizeof err)) {
        al_model_free(m);
        REQUIREF(0, "%s", err);
    }
    const al_model_config *c = al_model_config_of(m);
    size_t n = 0;
    int32_t *cfgv = tdump_i32(&d, "config", &n);
    REQUIRE(cfgv && n == 9);
    int32_t want[9] = {c->vocab_size, c->hidden_size,         c->intermediate_size,
                       c->num_layers, c->num_heads,           c->num_kv_heads,
                       c->head_dim,   c->tie_word_embeddings, c->qk_norm};
    for (int i = 0; i < 9; i++)
        CHECKF(cfgv[i] == want[i], "config field %d: dump %d, model %d", i, cfgv[i], want[i]);
    free(cfgv);

    batch b = {0};
    size_t nt = 0, nc = 0;
    b.tokens = tdump_i32(&d, "in/tokens", &nt);
    b.positions = tdump_i32(&d, "in/positions", NULL);
    b.cu = tdump_i32(&d, "in/cu_seqlens", &nc);
    b.targets = tdump_i32(&d, "in/targets", NULL);
    b.mask = tdump_f32(&d, "in/mask", NULL);
    b.old_logp = tdump_f32(&d, "in/old_logp", NULL);
    b.adv = tdump_f32(&d, "in/adv", NULL);
    float *hp = tdump_f32(&d, "ppo/hparams", NULL);
    REQUIRE(b.tokens && b.positions && b.cu && b.targets && b.mask && b.old_logp && b.adv && hp);
    b.T = (int)nt, b.nseq = (int)nc - 1;
    size_t TV = (size_t)b.T * c->vocab_size;
    float *logits = malloc(sizeof(float) * TV), *dlogits = malloc(sizeof(float) * TV);
    float *logp = malloc(sizeof(float) * b.T), *ent = malloc(sizeof(float) * b.T);

    int ok;
    al_model_zero_grad(m);
    double loss = ppo_step(m, &b, hp, logits, logp, ent, dlogits, &ok);
    CHECK(ok);
    float *r = tdump_f32(&d, "out/logits", NULL);
    CHECK(r && compare("logits", logits, r, TV, 2e-5, 1.0, 1));
    free(r);
    r = tdump_f32(&d, "out/logp", NULL);
    CHECK(r && compare("logp", logp, r, (size_t)b.T, 2e-5, 1.0, 1));
    free(r);
    r = tdump_f32(&d, "out/entropy", NULL);
    CHECK(r && compare("entropy", ent, r, (size_t)b.T, 2e-5, 1.0, 1));
    free(r);
    r = tdump_f32(&d, "out/loss", NULL);
    REQUIRE(r);
    printf("    loss %.7f vs %.7f\n", loss, r[0]);
    CHECK_NEAR(loss, r[0], 1e-5 * fmax(1.0, fabs(r[0])));
    free(r);
    r = tdump_f32(&d, "out/dlogits", NULL);
    CHECK(r && compare("dlogits", dlogits, r, TV, 1e-4, 0, 1));
    free(r);

    REQUIRE(al_model_backward(m, dlogits) == 0);
    int32_t *cnt = tdump_i32(&d, "grad/count", NULL);
    REQUIRE(cnt);
    CHECK_EQ_INT(cnt[0], (int)al_model_num_tensors(m));
    free(cnt);
    const float *grads = al_model_grads(m);
    int worst_ok = 1;
    double worst = 0;
    const char *worst_name = "";
    for (size_t i = 0; i < al_model_num_tensors(m); i++) {
        const al_model_tensor *t = &al_model_tensors(m)[i];
        char rn[200];
        snprintf(rn, sizeof rn, "grad/%s", t->name);
        size_t rnum = 0;
        r = tdump_f32(&d, rn, &rnum);
        CHECKF(r != NULL, "dump has no %s", rn);
        if (!r) continue;
        CHECK_EQ_INT(rnum, t->numel);
        if (rnum == t->numel) {
            int good = compare(t->name, grads + t->offset, r, t->numel, 1e-4, 0, 0);
            double rel = max_diff(grads + t->offset, r, t->numel) / (max_abs(r, t->numel) + 1e-30);
            if (rel > worst) worst = rel, worst_name = t->name;
            CHECKF(good, "gradient of %s differs from PyTorch", t->name);
            worst_ok &= good;
        }
        free(r);
    }
    printf("    %zu parameter gradients %s (worst relative error %.3g, %s)\n",
           al_model_num_tensors(m), worst_ok ? "match" : "DIFFER", worst, worst_name);

    /* 10 AdamW updates on the SFT loss, reloading the stored weights first. */
    float *ah = tdump_f32(&d, "adamw/hparams", NULL);
    size_t nl = 0;
    float *rl = tdump_f32(&d, "adamw/losses", &nl), *rn = tdump_f32(&d, "adamw/grad_norms", NULL);
    REQUIRE(ah && rl && rn);
    snprintf(path, sizeof path, "tests/model/ref-%s", name);
    REQUIREF(al_model_load_safetensors(m, path, err, sizeof err) == 0, "%s", err);
    al_optim_config oc;
    al_optim_config_default(&oc);
    oc.lr = ah[0], oc.beta1 = ah[1], oc.beta2 = ah[2], oc.eps = ah[3], oc.weight_decay = ah[4];
    oc.grad_clip = ah[5], oc.warmup_steps = (int64_t)ah[6], oc.total_steps = (int64_t)ah[7];
    oc.min_lr_ratio = ah[8], oc.schedule = AL_LR_COSINE;
    int steps = (int)ah[9];
    al_adamw opt;
    REQUIREF(al_adamw_init(&opt, &oc, al_model_num_params(m), err, sizeof err) == 0, "%s", err);
    printf("    adamw losses:");
    for (int s = 0; s <= steps && (size_t)s < nl; s++) {
        al_model_zero_grad(m);
        double l = sft_loss(m, &b, logits, logp, dlogits);
        printf(" %.5f/%.5f", l, rl[s]);
        CHECKF(fabs(l - rl[s]) <= 5e-4 * fmax(0.01, fabs(rl[s])),
               "AdamW step %d: loss %.7f, PyTorch %.7f", s, l, rl[s]);
        if (s == steps) break;
        REQUIRE(al_model_backward(m, dlogits) == 0);
        double gn = al_grad_clip(al_model_grads(m), al_model_num_params(m), oc.grad_clip);
        CHECKF(fabs(gn - rn[s]) <= 1e-4 * fabs(rn[s]),
               "AdamW step %d: grad norm %.7f, PyTorch %.7f", s, gn, rn[s]);
        al_adamw_update(&opt, al_model_params(m), al_model_grads(m), al_lr_at(&oc, s));
    }
    printf("\n");
    al_adamw_free(&opt);
    free(ah), free(rl), free(rn);

    free(logits), free(dlogits), free(logp), free(ent), free(hp);
    batch_free(&b);
    tdump_free(&d);
    al_model_free(m);
}

TEST(qwen2_biases_tied_matches_pytorch)
{
    check_reference("qwen2");
}
TEST(qwen3_qk_norm_untied_matches_pytorch)
{
    check_reference("qwen3");
}

/* The other direction: checkpoints arclight writes (f32 and bf16, tied and untied) load in
 * the PyTorch model strictly by Hugging Face names and give the same logits. */
static void check_written_checkpoint(al_model_arch arch, int tied, al_st_dtype dtype)
{
    char dir[128], err[1024], cmd[1400], path[400];
    REQUIRE(al_test_tmpdir(dir, sizeof dir, "t0600"));
    al_model_config c = {0};
    al_model_config_set_arch(&c, arch);
    c.vocab_size = 96, c.hidden_size = 32, c.intermediate_size = 48, c.num_layers = 2;
    c.num_heads = 4, c.num_kv_heads = 2, c.head_dim = arch == AL_MODEL_ARCH_QWEN3 ? 16 : 8;
    c.rms_norm_eps = 1e-6, c.rope_theta = 1e6, c.tie_word_embeddings = tied;
    c.max_position_embeddings = 128, c.bos_token_id = c.eos_token_id = -1;
    al_model *m = al_model_new(&c, err, sizeof err);
    REQUIREF(m, "%s", err);
    al_model_init_random(m, 3);
    float *p = al_model_params(m);
    for (size_t i = 0; i < al_model_num_params(m); i++)
        p[i] = p[i] * 6.0f + (p[i] == 0.0f ? 0.05f : 0.0f);
    REQUIREF(al_model_save_dir(m, dir, dtype, err, sizeof err) == 0, "%s", err);
    al_model_free(m);
    /* what PyTorch sees is what a reload sees (bf16 rounding included) */
    m = al_model_load_dir(dir, err, sizeof err);
    REQUIREF(m, "%s", err);
    snprintf(cmd, sizeof cmd,
             "/usr/bin/python3 tests/model/ref_model.py --forward %s --out %s/logits.bin", dir,
             dir);
    int rc = system(cmd);
    CHECKF(rc == 0, "%s failed (%d)", cmd, rc);
    tdump d;
    snprintf(path, sizeof path, "%s/logits.bin", dir);
    int loaded = rc == 0 && tdump_load(&d, path, "ALMD", "the command above", err, sizeof err) == 0;
    CHECKF(rc != 0 || loaded, "%s", err);
    if (loaded) {
        size_t nt = 0, nc = 0, nl = 0;
        int32_t *tok = tdump_i32(&d, "in/tokens", &nt), *pos = tdump_i32(&d, "in/positions", NULL);
        int32_t *cu = tdump_i32(&d, "in/cu_seqlens", &nc);
        float *ref = tdump_f32(&d, "out/logits", &nl);
        if (tok && pos && cu && ref && nl == nt * (size_t)c.vocab_size) {
            float *logits = malloc(sizeof(float) * nl);
            CHECK(al_model_forward(m, tok, pos, cu, (int)nc - 1, (int)nt, logits) == 0);
            char what[64];
            snprintf(what, sizeof what, "logits of a %s checkpoint",
                     dtype == AL_ST_DTYPE_BF16 ? "bf16" : "f32");
            CHECK(compare(what, logits, ref, nl, 2e-5, 1.0, 1));
            free(logits);
        } else {
            CHECKF(0, "incomplete dump %s", path);
        }
        free(tok), free(pos), free(cu), free(ref);
        tdump_free(&d);
    }
    al_model_free(m);
    if (al_test_rmtree(dir) != 0) printf("    could not remove %s\n", dir);
}

TEST(written_checkpoints_load_in_pytorch_qwen2_tied_bf16)
{
    check_written_checkpoint(AL_MODEL_ARCH_QWEN2, 1, AL_ST_DTYPE_BF16);
}
TEST(written_checkpoints_load_in_pytorch_qwen3_untied_f32)
{
    check_written_checkpoint(AL_MODEL_ARCH_QWEN3, 0, AL_ST_DTYPE_F32);
}
