/*
 * t0652_trainer: the training step over a tiny Qwen2 model: chunking does not change an
 * update, PPO epochs use old logprobs from before the step, training moves the policy the way
 * the advantages say, a checkpoint resumes with bitwise the same losses as an uninterrupted
 * run (6 steps vs 3 + resume + 3), and bad chunks / damaged checkpoints give clear errors.
 */
#include "testlib.h"
#include "support.h"

#include "model/checkpoint.h"
#include "model/logprob.h"
#include "model/safetensors.h"
#include "core/sha256.h"
#include "model/trainer.h"

#include <sys/stat.h>
#include <unistd.h>

enum { V = 64 };

static al_model *tiny_model(uint64_t seed, char *err, size_t errlen)
{
    al_model_config c = {0};
    al_model_config_set_arch(&c, AL_MODEL_ARCH_QWEN2);
    c.vocab_size = V, c.hidden_size = 32, c.intermediate_size = 48, c.num_layers = 2;
    c.num_heads = 4, c.num_kv_heads = 2, c.head_dim = 8;
    c.rms_norm_eps = 1e-6, c.rope_theta = 1e6, c.tie_word_embeddings = 1;
    c.max_position_embeddings = 512, c.bos_token_id = c.eos_token_id = -1;
    al_model *m = al_model_new(&c, err, errlen);
    if (m) {
        al_model_init_random(m, seed);
        /* Larger than HF's 0.02 so that the distribution is not uniform. */
        float *p = al_model_params(m);
        for (size_t i = 0; i < al_model_num_params(m); i++) p[i] *= 5.0f;
        for (size_t i = 0; i < al_model_num_tensors(m); i++) {
            const al_model_tensor *t = &al_model_tensors(m)[i];
            if (t->ndim == 1 && strstr(t->name, "norm"))
                for (size_t j = 0; j < t->numel; j++) p[t->offset + j] = 1.0f;
        }
    }
    return m;
}

/* A batch of 6 sequences (prompt + response), as one set of per-token arrays. */
#define NSEQ 6
#define TMAX 128
typedef struct batch {
    int T;
    int32_t tokens[TMAX], cu[NSEQ + 1];
    float mask[TMAX], adv[TMAX], rollout[TMAX];
} batch;

static void make_batch(batch *b, uint32_t seed)
{
    static const int lens[NSEQ] = {14, 9, 21, 12, 17, 11};
    static const int prompt[NSEQ] = {5, 4, 8, 3, 6, 5};
    uint32_t s = seed;
    int t = 0;
    b->cu[0] = 0;
    for (int i = 0; i < NSEQ; i++) {
        float a = (i % 3 == 0) ? -1.0f : 0.5f + 0.25f * (float)i;
        for (int k = 0; k < lens[i]; k++, t++) {
            s = s * 1664525u + 1013904223u;
            b->tokens[t] = (int32_t)((s >> 10) % V);
            b->mask[t] = k >= prompt[i] ? 1.0f : 0.0f;
            b->adv[t] = a;
            b->rollout[t] = -3.0f - 0.5f * (float)((s >> 20) % 100) / 100.0f;
        }
        b->cu[i + 1] = t;
    }
    b->T = t;
}

/* Splits the batch into `n` chunks along sequence boundaries (n divides NSEQ). */
static int make_chunks(const batch *b, int n, int32_t cus[][NSEQ + 1], al_train_chunk *out)
{
    int per = NSEQ / n;
    for (int c = 0; c < n; c++) {
        int s0 = c * per, t0 = b->cu[s0];
        for (int i = 0; i <= per; i++) cus[c][i] = b->cu[s0 + i] - t0;
        out[c] = (al_train_chunk){.T = b->cu[s0 + per] - t0,
                                  .nseq = per,
                                  .tokens = b->tokens + t0,
                                  .cu_seqlens = cus[c],
                                  .mask = b->mask + t0,
                                  .adv = b->adv + t0,
                                  .rollout_logp = b->rollout + t0};
    }
    return n;
}

static void base_config(al_trainer_config *tc)
{
    al_trainer_config_default(tc);
    tc->loss.kind = AL_LOSS_PPO;
    tc->loss.eps_low = 0.2f;
    tc->loss.eps_high = 0.28f;
    tc->optim.lr = 1e-3f;
    tc->optim.weight_decay = 0.01f;
    tc->optim.grad_clip = 1.0f;
}

static double max_abs_diff(const float *a, const float *b, size_t n)
{
    double e = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (d > e) e = d;
    }
    return e;
}

TEST(chunking_does_not_change_the_update)
{
    char err[512];
    batch b;
    make_batch(&b, 7);
    const al_loss_agg aggs[3] = {AL_LOSS_AGG_TOKEN_MEAN, AL_LOSS_AGG_SEQ_MEAN_TOKEN_SUM,
                                 AL_LOSS_AGG_SEQ_MEAN_TOKEN_MEAN};
    for (int a = 0; a < 3; a++) {
        al_model *m1 = tiny_model(1, err, sizeof err), *m3 = tiny_model(1, err, sizeof err);
        REQUIREF(m1 && m3, "%s", err);
        al_trainer_config tc;
        base_config(&tc);
        tc.loss.agg = aggs[a];
        al_trainer *t1 = al_trainer_new(m1, NULL, &tc, err, sizeof err);
        al_trainer *t3 = al_trainer_new(m3, NULL, &tc, err, sizeof err);
        REQUIREF(t1 && t3, "%s", err);
        int32_t cus1[1][NSEQ + 1], cus3[3][NSEQ + 1];
        al_train_chunk c1[1], c3[3];
        make_chunks(&b, 1, cus1, c1);
        make_chunks(&b, 3, cus3, c3);
        al_train_stats s1, s3;
        REQUIREF(al_trainer_step(t1, c1, 1, &s1, err, sizeof err) == 0, "%s", err);
        REQUIREF(al_trainer_step(t3, c3, 3, &s3, err, sizeof err) == 0, "%s", err);
        CHECKF(fabs(s1.loss - s3.loss) < 1e-6, "%s: loss one chunk %.9g vs three %.9g",
               al_loss_agg_name(aggs[a]), s1.loss, s3.loss);
        CHECK_NEAR(s1.grad_norm, s3.grad_norm, 1e-5 * s1.grad_norm);
        /* The accumulated gradients agree to float rounding. (Parameters are not compared:
         * AdamW's first step moves every weight by about lr sign(g), so rounding noise in a
         * near-zero gradient shows up as a full lr-sized difference.) */
        size_t n = al_model_num_params(m1);
        const float *g1 = al_model_grads(m1), *g3 = al_model_grads(m3);
        double gmax = 0;
        for (size_t i = 0; i < n; i++) gmax = fmax(gmax, fabs(g1[i]));
        double d = max_abs_diff(g1, g3, n);
        CHECKF(gmax > 0 && d <= 1e-5 * gmax, "%s: gradients differ by %g (largest %g)",
               al_loss_agg_name(aggs[a]), d, gmax);
        CHECK_EQ_INT((int64_t)s1.tokens, (int64_t)s3.tokens);
        CHECK_EQ_INT(s1.step_tokens, b.T);
        /* A single update is on-policy: every ratio is exactly 1. */
        CHECK(s1.ratio_max == 1.0 && s1.clip_frac == 0.0);
        CHECK(s1.tokens_per_s > 0.0);
        al_trainer_free(t1);
        al_trainer_free(t3);
        al_model_free(m1);
        al_model_free(m3);
    }
}

TEST(ppo_epochs_use_old_logprobs_from_before_the_step)
{
    char err[512];
    batch b;
    make_batch(&b, 11);
    al_model *m = tiny_model(2, err, sizeof err);
    REQUIREF(m, "%s", err);
    al_trainer_config tc;
    base_config(&tc);
    tc.ppo_epochs = 3;
    tc.mini_batches = 2;
    tc.optim.lr = 2e-2f;
    al_trainer *tr = al_trainer_new(m, NULL, &tc, err, sizeof err);
    REQUIREF(tr, "%s", err);
    int32_t cus[2][NSEQ + 1];
    al_train_chunk ch[2];
    make_chunks(&b, 2, cus, ch);
    al_train_stats st;
    REQUIREF(al_trainer_step(tr, ch, 2, &st, err, sizeof err) == 0, "%s", err);
    CHECK_EQ_INT(st.updates, 6);
    CHECK_EQ_INT(st.step, 6);
    /* Later passes see moved weights against fixed old logprobs: ratios leave 1 and some
     * get clipped at this learning rate. */
    CHECKF(st.ratio_max > 1.0 + 1e-4, "ratio_max %g", st.ratio_max);
    CHECKF(st.clip_frac > 0.0, "clip_frac %g", st.clip_frac);
    CHECK(st.grad_norm > 0.0 && st.grad_norm_max >= st.grad_norm);
    al_trainer_free(tr);
    al_model_free(m);
}

/* Mean logprob of the masked tokens of sequence s under m. */
static double seq_mean_logp(al_model *m, const batch *b, int s)
{
    int b0 = b->cu[s], T = b->cu[s + 1] - b0;
    int32_t pos[TMAX], cu[2] = {0, T}, tg[TMAX];
    float *logits = malloc(sizeof(float) * T * V), lp[TMAX];
    for (int t = 0; t < T; t++) {
        pos[t] = t;
        tg[t] = t + 1 < T ? b->tokens[b0 + t + 1] : -1;
    }
    char err[256];
    double sum = 0, n = 0;
    if (al_model_forward(m, b->tokens + b0, pos, cu, 1, T, logits) == 0 &&
        al_logprob_forward(logits, tg, T, V, 1.0f, lp, NULL, err, sizeof err) == 0) {
        for (int t = 0; t + 1 < T; t++)
            if (b->mask[b0 + t + 1] > 0) sum += lp[t], n += 1;
    }
    free(logits);
    return n > 0 ? sum / n : NAN;
}

TEST(training_follows_the_advantages)
{
    char err[512];
    batch b;
    make_batch(&b, 3);
    al_model *m = tiny_model(3, err, sizeof err);
    REQUIREF(m, "%s", err);
    double before[NSEQ];
    for (int s = 0; s < NSEQ; s++) before[s] = seq_mean_logp(m, &b, s);
    al_trainer_config tc;
    base_config(&tc);
    tc.optim.lr = 1e-2f;
    tc.optim.schedule = AL_LR_COSINE;
    tc.optim.warmup_steps = 2;
    tc.optim.total_steps = 8;
    al_trainer *tr = al_trainer_new(m, NULL, &tc, err, sizeof err);
    REQUIREF(tr, "%s", err);
    int32_t cus[2][NSEQ + 1];
    al_train_chunk ch[2];
    make_chunks(&b, 2, cus, ch);
    al_train_stats st;
    for (int i = 0; i < 8; i++) REQUIREF(al_trainer_step(tr, ch, 2, &st, err, sizeof err) == 0, "%s", err);
    for (int s = 0; s < NSEQ; s++) {
        double after = seq_mean_logp(m, &b, s);
        if (b.adv[b.cu[s]] > 0)
            CHECKF(after > before[s] + 0.05, "sequence %d (A > 0): mean logp %.4f -> %.4f", s,
                   before[s], after);
        else
            CHECKF(after < before[s] - 0.05, "sequence %d (A < 0): mean logp %.4f -> %.4f", s,
                   before[s], after);
    }
    al_trainer_free(tr);
    al_model_free(m);
}

/* The resume test's configuration: every feature that carries state across steps. */
static void resume_config(al_trainer_config *tc)
{
    base_config(tc);
    tc->loss.dual_clip = 3.0f;
    tc->loss.tis_cap = 2.0f;
    tc->loss.kl_beta = 0.05f;
    tc->loss.kl = AL_KL_K3;
    tc->loss.entropy_coef = 0.001f;
    tc->loss.agg = AL_LOSS_AGG_SEQ_MEAN_TOKEN_MEAN;
    tc->ppo_epochs = 2;
    tc->mini_batches = 2;
    tc->optim.lr = 5e-3f;
    tc->optim.schedule = AL_LR_COSINE;
    tc->optim.warmup_steps = 3;
    tc->optim.total_steps = 24;
    tc->optim.min_lr_ratio = 0.1f;
}

TEST(resume_gives_bitwise_the_same_losses)
{
    char err[1024];
    char root[512];
    REQUIRE(al_test_tmpdir(root, sizeof root, "t0652") != NULL);
    char init_dir[600], ck_root[600];
    snprintf(init_dir, sizeof init_dir, "%s/init", root);
    snprintf(ck_root, sizeof ck_root, "%s/ckpt", root);
    batch b[6];
    for (int i = 0; i < 6; i++) make_batch(&b[i], 100 + i);
    al_trainer_config tc;
    resume_config(&tc);

    /* The initial model, saved the way a run starts from a model directory. */
    al_model *m0 = tiny_model(5, err, sizeof err);
    REQUIREF(m0, "%s", err);
    REQUIREF(al_model_save_dir(m0, init_dir, AL_ST_DTYPE_F32, err, sizeof err) == 0, "%s", err);
    al_model_free(m0);

    /* Uninterrupted: 6 steps. */
    double straight[6];
    al_model *pa = al_model_load_dir(init_dir, err, sizeof err);
    al_model *ra = al_model_load_dir(init_dir, err, sizeof err);
    REQUIREF(pa && ra, "%s", err);
    al_trainer *ta = al_trainer_new(pa, ra, &tc, err, sizeof err);
    REQUIREF(ta, "%s", err);
    for (int s = 0; s < 6; s++) {
        int32_t cus[2][NSEQ + 1];
        al_train_chunk ch[2];
        make_chunks(&b[s], 2, cus, ch);
        al_train_stats st;
        REQUIREF(al_trainer_step(ta, ch, 2, &st, err, sizeof err) == 0, "%s", err);
        straight[s] = st.loss;
    }

    /* Interrupted: 3 steps, checkpoint, everything freed. */
    al_checkpoint_info info;
    {
        al_model *p = al_model_load_dir(init_dir, err, sizeof err);
        al_model *r = al_model_load_dir(init_dir, err, sizeof err);
        REQUIREF(p && r, "%s", err);
        al_trainer *t = al_trainer_new(p, r, &tc, err, sizeof err);
        REQUIREF(t, "%s", err);
        for (int s = 0; s < 3; s++) {
            int32_t cus[2][NSEQ + 1];
            al_train_chunk ch[2];
            make_chunks(&b[s], 2, cus, ch);
            al_train_stats st;
            REQUIREF(al_trainer_step(t, ch, 2, &st, err, sizeof err) == 0, "%s", err);
            CHECKF(st.loss == straight[s], "step %d before the checkpoint: %.17g vs %.17g", s,
                   st.loss, straight[s]);
            /* An older checkpoint too, so that "latest" has a choice. */
            if (s == 1)
                REQUIREF(al_checkpoint_save(t, ck_root, s + 1, NULL, NULL, err, sizeof err) == 0, "%s", err);
        }
        REQUIREF(al_checkpoint_save(t, ck_root, 3, "{\"loss\": 0.5}", &info, err, sizeof err) == 0,
                 "%s", err);
        CHECK_EQ_INT(info.step, 3);
        CHECK_EQ_INT(info.optimizer_step, 3 * 4);
        char sha[65];
        REQUIRE(al_sha256_file(info.weights_path, sha, err, sizeof err) == 0);
        CHECK_EQ_STR(sha, info.weights_sha256);
        al_trainer_free(t);
        al_model_free(p);
        al_model_free(r);
    }

    /* Resume from the latest checkpoint into fresh objects and run steps 4-6. */
    char latest[1024];
    int64_t latest_step = -1;
    REQUIRE(al_checkpoint_latest(ck_root, latest, sizeof latest, &latest_step, err, sizeof err) == 1);
    CHECK_EQ_INT(latest_step, 3);
    CHECK_EQ_STR(latest, info.dir);
    al_model *pb = al_model_load_dir(init_dir, err, sizeof err);
    al_model *rb = al_model_load_dir(init_dir, err, sizeof err);
    REQUIREF(pb && rb, "%s", err);
    al_trainer *tb = al_trainer_new(pb, rb, &tc, err, sizeof err);
    REQUIREF(tb, "%s", err);
    al_checkpoint_info li;
    REQUIREF(al_checkpoint_load(tb, latest, &li, err, sizeof err) == 0, "%s", err);
    CHECK_EQ_INT(li.step, 3);
    CHECK_EQ_INT(al_trainer_optimizer(tb)->step, 12);
    for (int s = 3; s < 6; s++) {
        int32_t cus[2][NSEQ + 1];
        al_train_chunk ch[2];
        make_chunks(&b[s], 2, cus, ch);
        al_train_stats st;
        REQUIREF(al_trainer_step(tb, ch, 2, &st, err, sizeof err) == 0, "%s", err);
        CHECKF(st.loss == straight[s], "step %d after resume: %.17g vs uninterrupted %.17g", s + 1,
               st.loss, straight[s]);
    }
    size_t n = al_model_num_params(pa);
    CHECK(memcmp(al_model_params(pa), al_model_params(pb), n * sizeof(float)) == 0);
    CHECK(memcmp(al_trainer_optimizer(ta)->state, al_trainer_optimizer(tb)->state,
                 2 * n * sizeof(float)) == 0);

    /* Damaged checkpoints are refused with the reason. */
    char path[1200];
    snprintf(path, sizeof path, "%s/model.safetensors", info.dir);
    FILE *f = fopen(path, "r+b");
    REQUIRE(f != NULL);
    fseek(f, -4, SEEK_END);
    fputc(0x7f, f);
    fclose(f);
    CHECK(al_checkpoint_load(tb, info.dir, NULL, err, sizeof err) == -1);
    CHECKF(strstr(err, "sha256") != NULL, "error: %s", err);
    snprintf(path, sizeof path, "%s/step-2/optimizer.safetensors", ck_root);
    REQUIRE(truncate(path, 100) == 0);
    snprintf(path, sizeof path, "%s/step-2", ck_root);
    CHECK(al_checkpoint_load(tb, path, NULL, err, sizeof err) == -1);
    CHECKF(strstr(err, "optimizer.safetensors") != NULL, "error: %s", err);
    snprintf(path, sizeof path, "%s/step-99", ck_root);
    CHECK(al_checkpoint_load(tb, path, NULL, err, sizeof err) == -1);
    CHECKF(strstr(err, "step-99") != NULL, "error: %s", err);

    al_trainer_free(ta);
    al_trainer_free(tb);
    al_model_free(pa);
    al_model_free(ra);
    al_model_free(pb);
    al_model_free(rb);
    al_test_rmtree(root);
}

TEST(checkpoint_of_another_shape_is_refused)
{
    char err[1024];
    char root[512];
    REQUIRE(al_test_tmpdir(root, sizeof root, "t0652s") != NULL);
    al_model *m = tiny_model(9, err, sizeof err);
    REQUIREF(m, "%s", err);
    al_trainer_config tc;
    base_config(&tc);
    al_trainer *t = al_trainer_new(m, NULL, &tc, err, sizeof err);
    REQUIREF(t, "%s", err);
    al_checkpoint_info info;
    REQUIREF(al_checkpoint_save(t, root, 1, NULL, &info, err, sizeof err) == 0, "%s", err);
    struct stat sb;
    char p[1200];
    snprintf(p, sizeof p, "%s/config.json", info.dir);
    CHECK(stat(p, &sb) == 0);
    /* Re-saving the same step replaces it. */
    REQUIREF(al_checkpoint_save(t, root, 1, NULL, &info, err, sizeof err) == 0, "%s", err);
    CHECK(al_checkpoint_save(t, root, 2, "{not json", NULL, err, sizeof err) == -1);
    CHECKF(strstr(err, "metrics") != NULL, "error: %s", err);

    al_model_config c = *al_model_config_of(m);
    c.intermediate_size = 40;
    al_model *m2 = al_model_new(&c, err, sizeof err);
    REQUIREF(m2, "%s", err);
    al_trainer *t2 = al_trainer_new(m2, NULL, &tc, err, sizeof err);
    REQUIREF(t2, "%s", err);
    CHECK(al_checkpoint_load(t2, info.dir, NULL, err, sizeof err) == -1);
    CHECKF(strstr(err, "parameters") != NULL, "error: %s", err);
    char latest[1024];
    int64_t ls;
    CHECK(al_checkpoint_latest(root, latest, sizeof latest, &ls, err, sizeof err) == 1 && ls == 1);
    snprintf(p, sizeof p, "%s/none", root);
    CHECK(al_checkpoint_latest(p, latest, sizeof latest, &ls, err, sizeof err) == 0);

    /* Retention: keep the newest two of steps 1-4; a crashed save's leftovers go too. */
    for (int s = 2; s <= 4; s++)
        REQUIREF(al_checkpoint_save(t, root, s, NULL, NULL, err, sizeof err) == 0, "%s", err);
    snprintf(p, sizeof p, "%s/step-9.tmp-1", root);
    REQUIRE(mkdir(p, 0755) == 0);
    snprintf(p, sizeof p, "%s/step-9.tmp-1/config.json", root);
    FILE *f = fopen(p, "w");
    REQUIRE(f != NULL);
    fclose(f);
    CHECK_EQ_INT(al_checkpoint_prune(root, 2, err, sizeof err), 2);
    int present[5] = {0};
    for (int s = 1; s <= 4; s++) {
        snprintf(p, sizeof p, "%s/step-%d", root, s);
        present[s] = stat(p, &sb) == 0;
    }
    CHECK(!present[1] && !present[2] && present[3] && present[4]);
    snprintf(p, sizeof p, "%s/step-9.tmp-1", root);
    CHECK(stat(p, &sb) != 0);
    CHECK(al_checkpoint_latest(root, latest, sizeof latest, &ls, err, sizeof err) == 1 && ls == 4);
    CHECK(al_checkpoint_prune(root, 0, err, sizeof err) == -1);
    al_trainer_free(t2);
    al_model_free(m2);
    al_trainer_free(t);
    al_model_free(m);
    al_test_rmtree(root);
}

TEST(bad_chunks_and_configs_give_clear_errors)
{
    char err[512];
    al_model *m = tiny_model(4, err, sizeof err);
    REQUIREF(m, "%s", err);
    al_trainer_config tc;
    base_config(&tc);
    tc.loss.kl_beta = 0.1f;
    CHECK(al_trainer_new(m, NULL, &tc, err, sizeof err) == NULL);
    CHECKF(strstr(err, "reference") != NULL, "error: %s", err);
    tc.loss.kl_beta = 0.0f;
    tc.ppo_epochs = 0;
    CHECK(al_trainer_new(m, NULL, &tc, err, sizeof err) == NULL);
    CHECKF(strstr(err, "ppo_epochs") != NULL, "error: %s", err);
    tc.ppo_epochs = 1;
    al_trainer *t = al_trainer_new(m, NULL, &tc, err, sizeof err);
    REQUIREF(t, "%s", err);
    batch b;
    make_batch(&b, 1);
    int32_t cus[1][NSEQ + 1];
    al_train_chunk ch[1];
    make_chunks(&b, 1, cus, ch);
    al_train_stats st;
    b.tokens[5] = V;
    CHECK(al_trainer_step(t, ch, 1, &st, err, sizeof err) == -1);
    CHECKF(strstr(err, "vocabulary") && strstr(err, "position 5"), "error: %s", err);
    b.tokens[5] = 1;
    ch[0].adv = NULL;
    CHECK(al_trainer_step(t, ch, 1, &st, err, sizeof err) == -1);
    CHECKF(strstr(err, "advantages") != NULL, "error: %s", err);
    ch[0].adv = b.adv;
    cus[0][NSEQ] = b.T - 1;
    CHECK(al_trainer_step(t, ch, 1, &st, err, sizeof err) == -1);
    CHECKF(strstr(err, "cu_seqlens") != NULL, "error: %s", err);
    cus[0][NSEQ] = b.T;
    b.adv[3] = NAN;
    CHECK(al_trainer_step(t, ch, 1, &st, err, sizeof err) == -1);
    CHECKF(strstr(err, "non-finite") != NULL, "error: %s", err);
    b.adv[3] = 1.0f;
    CHECK(al_trainer_step(t, ch, 0, &st, err, sizeof err) == -1);
    /* Nothing was updated by the refused steps. */
    CHECK_EQ_INT(al_trainer_optimizer(t)->step, 0);
    CHECKF(al_trainer_step(t, ch, 1, &st, err, sizeof err) == 0, "%s", err);
    CHECK_EQ_INT(al_trainer_optimizer(t)->step, 1);
    al_trainer_free(t);
    al_model_free(m);
}

TEST(sft_warm_start_lowers_the_loss)
{
    char err[512];
    batch b;
    make_batch(&b, 21);
    al_model *m = tiny_model(6, err, sizeof err);
    REQUIREF(m, "%s", err);
    al_trainer_config tc;
    base_config(&tc);
    tc.loss.kind = AL_LOSS_SFT;
    tc.optim.lr = 1e-2f;
    al_trainer *t = al_trainer_new(m, NULL, &tc, err, sizeof err);
    REQUIREF(t, "%s", err);
    int32_t cus[3][NSEQ + 1];
    al_train_chunk ch[3];
    make_chunks(&b, 3, cus, ch);
    for (int c = 0; c < 3; c++) ch[c].adv = NULL; /* sft needs no advantages */
    al_train_stats st;
    double first = 0;
    for (int i = 0; i < 10; i++) {
        REQUIREF(al_trainer_step(t, ch, 3, &st, err, sizeof err) == 0, "%s", err);
        if (i == 0) first = st.loss;
    }
    /* The first loss is about the uniform distribution's log V. */
    CHECKF(first > 0.5 * log((double)V) && first < 3.0 * log((double)V), "first sft loss %.4f",
           first);
    CHECKF(isfinite(first) && st.loss < 0.8 * first, "sft loss %.4f -> %.4f", first, st.loss);
    al_trainer_free(t);
    al_model_free(m);
}

/* With every mask at 0 the gradients are 0 and AdamW moves nothing: only the decoupled weight
 * decay acts, which shows which tensors it applies to. */
TEST(weight_decay_skips_norms_and_biases_by_default)
{
    char err[512];
    batch b;
    make_batch(&b, 5);
    for (int t = 0; t < b.T; t++) b.mask[t] = 0.0f;
    for (int decay_1d = 0; decay_1d < 2; decay_1d++) {
        al_model *m = tiny_model(8, err, sizeof err);
        REQUIREF(m, "%s", err);
        size_t n = al_model_num_params(m);
        float *before = malloc(sizeof(float) * n);
        memcpy(before, al_model_params(m), sizeof(float) * n);
        al_trainer_config tc;
        base_config(&tc);
        tc.optim.lr = 0.1f;
        tc.optim.weight_decay = 0.5f;
        tc.decay_1d = decay_1d;
        al_trainer *t = al_trainer_new(m, NULL, &tc, err, sizeof err);
        REQUIREF(t, "%s", err);
        int32_t cus[1][NSEQ + 1];
        al_train_chunk ch[1];
        make_chunks(&b, 1, cus, ch);
        al_train_stats st;
        REQUIREF(al_trainer_step(t, ch, 1, &st, err, sizeof err) == 0, "%s", err);
        CHECK(st.loss == 0.0 && st.grad_norm == 0.0);
        const float *p = al_model_params(m);
        float decay = (float)(1.0 - 0.1 * 0.5);
        int checked_1d = 0, checked_2d = 0;
        for (size_t i = 0; i < al_model_num_tensors(m); i++) {
            const al_model_tensor *tt = &al_model_tensors(m)[i];
            int decayed = tt->ndim == 2 || decay_1d;
            for (size_t j = 0; j < tt->numel; j += 7) {
                float want = decayed ? before[tt->offset + j] * decay : before[tt->offset + j];
                CHECKF(p[tt->offset + j] == want, "%s[%zu] (decay_1d %d): %g, expected %g",
                       tt->name, j, decay_1d, p[tt->offset + j], want);
            }
            if (tt->ndim == 1) checked_1d++;
            else checked_2d++;
        }
        CHECK(checked_1d > 0 && checked_2d > 0);
        free(before);
        al_trainer_free(t);
        al_model_free(m);
    }
}
