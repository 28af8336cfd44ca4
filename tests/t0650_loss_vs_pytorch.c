/*
 * t0650_loss_vs_pytorch: logprobs, entropy, every policy-loss variant and aggregation, and
 * 10 AdamW steps, against the dump that tests/model/ref_losses.py writes with PyTorch
 * (tests/model/ref_losses.bin). Any value outside its stated tolerance fails the test.
 *
 * Tolerances (float32 on both sides; sums in double here, in float32 in torch):
 *   logp, entropy               1e-5 abs + 1e-5 rel
 *   losses, stats               1e-5 abs + 1e-5 rel
 *   dlogp, dentropy, dlogits    1e-6 abs + 1e-4 rel   (values are ~1/tokens)
 *   AdamW parameters            1e-6 abs + 1e-5 rel after each step; lr 1e-9 rel; norm 1e-5 rel
 */
#include "testlib.h"

#include <unistd.h>

#include "model/logprob.h"
#include "model/loss.h"
#include "model/optim.h"
#include "model/tensor_dump.h"

static tdump dump;
static int dump_ok;

static const char *dump_path(void)
{
    static char path[1024];
    const char *src = getenv("ARCLIGHT_SOURCE_DIR");
    snprintf(path, sizeof path, "%s/tests/model/ref_losses.bin", src ? src : ".");
    return path;
}

/* Compares n values; reports the worst element. Returns the number of mismatches. */
static int compare(const char *what, const float *got, const float *want, int64_t n, double atol,
                   double rtol)
{
    int bad = 0;
    double worst = 0.0;
    int64_t worst_i = -1;
    for (int64_t i = 0; i < n; i++) {
        double err = fabs((double)got[i] - (double)want[i]);
        double tol = atol + rtol * fabs((double)want[i]);
        if (!(err <= tol)) {
            bad++;
            if (worst_i < 0 || err > worst) {
                worst = err;
                worst_i = i;
            }
        }
    }
    CHECKF(bad == 0, "%s: %d of %lld values differ; worst [%lld] %.9g vs torch %.9g", what, bad,
           (long long)n, (long long)worst_i, worst_i >= 0 ? got[worst_i] : 0.0,
           worst_i >= 0 ? want[worst_i] : 0.0);
    return bad;
}

static void compare_scalar(const char *what, double got, double want, double atol, double rtol)
{
    CHECKF(fabs(got - want) <= atol + rtol * fabs(want), "%s: %.9g vs torch %.9g", what, got,
           want);
}

TEST(dump_loads)
{
    char err[1200];
    int rc = tdump_load(&dump, dump_path(), "ALSS", "/usr/bin/python3 tests/model/ref_losses.py",
                        err, sizeof err);
    REQUIREF(rc == 0, "%s", err);
    dump_ok = 1;
    CHECK(tdump_find(&dump, "in/logits") != NULL);
    CHECK(tdump_find(&dump, "adamw/params") != NULL);
}

/* A cut-short, stale or foreign dump is refused with a message, not read past its end. */
TEST(truncated_or_stale_dump_is_an_error)
{
    REQUIRE(dump_ok);
    char path[] = "/tmp/arclight-t0650-XXXXXX", err[1200];
    int fd = mkstemp(path);
    REQUIRE(fd >= 0);
    close(fd);
    size_t cuts[] = {0, 3, 11, 12, 13, 15, 40, dump.len / 2, dump.len - 1};
    for (size_t i = 0; i <= sizeof cuts / sizeof cuts[0]; i++) {
        size_t len = i < sizeof cuts / sizeof cuts[0] ? cuts[i] : dump.len;
        uint8_t saved = dump.buf[4];
        if (i == sizeof cuts / sizeof cuts[0]) dump.buf[4] = 2; /* whole file, version 2 */
        FILE *f = fopen(path, "wb");
        REQUIRE(f);
        CHECK(fwrite(dump.buf, 1, len, f) == len);
        fclose(f);
        dump.buf[4] = saved;
        tdump d;
        CHECKF(tdump_load(&d, path, "ALSS", "regen", err, sizeof err) == -1 && d.buf == NULL,
               "%zu of %zu bytes loaded", len, dump.len);
        CHECKF(strstr(err, path) && strstr(err, "regen"), "message: %s", err);
    }
    /* the intact copy loads, but not as another script's dump */
    FILE *f = fopen(path, "wb");
    REQUIRE(f);
    CHECK(fwrite(dump.buf, 1, dump.len, f) == dump.len);
    fclose(f);
    tdump d;
    CHECK(tdump_load(&d, path, "ALMD", "regen", err, sizeof err) == -1);
    CHECKF(strstr(err, "not a version-1 ALMD dump"), "message: %s", err);
    REQUIREF(tdump_load(&d, path, "ALSS", "regen", err, sizeof err) == 0, "%s", err);
    CHECK_EQ_INT(d.count, dump.count);
    tdump_free(&d);
    unlink(path);
}

TEST(logprob_entropy_and_backward)
{
    REQUIRE(dump_ok);
    float *logits = tdump_f32(&dump, "in/logits", NULL);
    int32_t *targets = tdump_i32(&dump, "in/targets", NULL);
    const tdump_tensor *lt = tdump_find(&dump, "in/logits");
    REQUIRE(logits && targets && lt->ndim == 2);
    int T = (int)lt->dims[0], V = (int)lt->dims[1];
    const char *tags[] = {"t1", "t07"};
    for (int k = 0; k < 2; k++) {
        char name[128];
        snprintf(name, sizeof name, "logprob/%s/tau", tags[k]);
        float *tau = tdump_f32(&dump, name, NULL);
        float *logp = malloc(sizeof(float) * T), *ent = malloc(sizeof(float) * T);
        float *dl = malloc(sizeof(float) * T * V);
        char err[256];
        CHECK_EQ_INT(al_logprob_forward(logits, targets, T, V, tau[0], logp, ent, err, sizeof err), 0);
#define GET(field) (snprintf(name, sizeof name, "logprob/%s/" field, tags[k]), tdump_f32(&dump, name, NULL))
        float *w_logp = GET("logp"), *w_ent = GET("entropy"), *dlogp = GET("dlogp"),
              *dent = GET("dentropy"), *w_dl = GET("dlogits");
#undef GET
        snprintf(name, sizeof name, "logp (tau %s)", tags[k]);
        compare(name, logp, w_logp, T, 1e-5, 1e-5);
        snprintf(name, sizeof name, "entropy (tau %s)", tags[k]);
        compare(name, ent, w_ent, T, 1e-5, 1e-5);
        al_logprob_backward(logits, targets, T, V, tau[0], dlogp, dent, dl);
        snprintf(name, sizeof name, "dlogits (tau %s)", tags[k]);
        compare(name, dl, w_dl, (int64_t)T * V, 1e-6, 1e-4);
        /* In place: the gradient overwrites a copy of the logits. */
        memcpy(dl, logits, sizeof(float) * T * V);
        al_logprob_backward(dl, targets, T, V, tau[0], dlogp, dent, dl);
        snprintf(name, sizeof name, "dlogits in place (tau %s)", tags[k]);
        compare(name, dl, w_dl, (int64_t)T * V, 1e-6, 1e-4);
        free(tau), free(logp), free(ent), free(dl), free(w_logp), free(w_ent), free(dlogp);
        free(dent), free(w_dl);
    }
    free(logits);
    free(targets);
}

TEST(every_loss_variant_and_aggregation)
{
    REQUIRE(dump_ok);
    float *logits = tdump_f32(&dump, "in/logits", NULL);
    int32_t *targets = tdump_i32(&dump, "in/targets", NULL);
    size_t ncu = 0;
    int32_t *cu = tdump_i32(&dump, "in/cu", &ncu);
    float *mask = tdump_f32(&dump, "in/mask", NULL);
    float *old = tdump_f32(&dump, "in/old", NULL);
    float *rollout = tdump_f32(&dump, "in/rollout", NULL);
    float *ref = tdump_f32(&dump, "in/ref", NULL);
    float *adv = tdump_f32(&dump, "in/adv", NULL);
    int32_t *count = tdump_i32(&dump, "loss/count", NULL);
    REQUIRE(logits && targets && cu && mask && old && rollout && ref && adv && count);
    const tdump_tensor *lt = tdump_find(&dump, "in/logits");
    int T = (int)lt->dims[0], V = (int)lt->dims[1];
    float *logp = malloc(sizeof(float) * T), *ent = malloc(sizeof(float) * T);
    float *dlogp = malloc(sizeof(float) * T), *dent = malloc(sizeof(float) * T);
    float *dl = malloc(sizeof(float) * T * V);
    char err[256];
    REQUIRE(al_logprob_forward(logits, targets, T, V, 1.0f, logp, ent, err, sizeof err) == 0);
    CHECK(count[0] >= 27);

    for (int v = 0; v < count[0]; v++) {
        char key[160], vname[128] = {0};
        size_t nl;
        snprintf(key, sizeof key, "loss/name/%d", v);
        int32_t *chars = tdump_i32(&dump, key, &nl);
        REQUIRE(chars && nl < sizeof vname);
        for (size_t i = 0; i < nl; i++) vname[i] = (char)chars[i];
        free(chars);
#define GET(field) (snprintf(key, sizeof key, "loss/%s/" field, vname), tdump_f32(&dump, key, NULL))
        float *cfgv = GET("config"), *w_loss = GET("loss"), *w_dlogp = GET("dlogp"),
              *w_dent = GET("dentropy"), *w_dl = GET("dlogits"), *w_stats = GET("stats");
#undef GET
        REQUIRE(cfgv && w_loss && w_dlogp && w_dent && w_dl && w_stats);
        al_loss_config cfg;
        al_loss_config_default(&cfg);
        cfg.kind = (al_loss_kind)(int)cfgv[0];
        cfg.agg = (al_loss_agg)(int)cfgv[1];
        cfg.eps_low = cfgv[2];
        cfg.eps_high = cfgv[3];
        cfg.dual_clip = cfgv[4];
        cfg.tis_cap = cfgv[5];
        cfg.kl = (al_kl_kind)(int)cfgv[6];
        cfg.kl_beta = cfgv[7];
        cfg.entropy_coef = cfgv[8];
        al_loss_input in = {.T = T, .nseq = (int)ncu - 1, .cu_seqlens = cu, .logp = logp,
                            .old_logp = old, .rollout_logp = rollout, .ref_logp = ref,
                            .entropy = ent, .adv = adv, .mask = mask};
        al_loss_stats st;
        al_loss_stats_init(&st);
        double loss = 0.0;
        int rc = al_loss_compute(&cfg, &in, 0.0, &loss, dlogp, dent, &st, err, sizeof err);
        CHECKF(rc == 0, "%s: %s", vname, err);
        char what[200];
        snprintf(what, sizeof what, "%s loss", vname);
        compare_scalar(what, loss, w_loss[0], 1e-5, 1e-5);
        snprintf(what, sizeof what, "%s dloss/dlogp", vname);
        compare(what, dlogp, w_dlogp, T, 1e-6, 1e-4);
        snprintf(what, sizeof what, "%s dloss/dentropy", vname);
        compare(what, dent, w_dent, T, 1e-6, 1e-4);
        al_logprob_backward(logits, targets, T, V, 1.0f, dlogp, dent, dl);
        snprintf(what, sizeof what, "%s dloss/dlogits", vname);
        compare(what, dl, w_dl, (int64_t)T * V, 1e-6, 1e-4);
        double got_stats[9] = {st.tokens,      st.sum_pg,  st.sum_kl,
                               st.sum_entropy, st.sum_ratio, st.sum_clipped,
                               st.sum_dual_clipped, st.sum_tis, st.ratio_max};
        const char *stat_names[9] = {"tokens",  "sum_pg",      "sum_kl",
                                     "sum_entropy", "sum_ratio", "sum_clipped",
                                     "sum_dual_clipped", "sum_tis", "ratio_max"};
        for (int k = 0; k < 9; k++) {
            snprintf(what, sizeof what, "%s stats.%s", vname, stat_names[k]);
            compare_scalar(what, got_stats[k], w_stats[k], 2e-5, 1e-5);
        }
        al_loss_stats_finish(&st);
        CHECKF(st.loss == loss, "%s: stats.loss %.9g != loss %.9g", vname, st.loss, loss);
        free(cfgv), free(w_loss), free(w_dlogp), free(w_dent), free(w_dl), free(w_stats);
    }
    free(logp), free(ent), free(dlogp), free(dent), free(dl);
    free(logits), free(targets), free(cu), free(mask), free(old), free(rollout), free(ref);
    free(adv), free(count);
}

TEST(adamw_warmup_cosine_clipping_10_steps)
{
    REQUIRE(dump_ok);
    size_t n = 0, ng = 0;
    float *hp = tdump_f32(&dump, "adamw/hparams", NULL);
    float *p = tdump_f32(&dump, "adamw/p0", &n);
    float *grads = tdump_f32(&dump, "adamw/grads", &ng);
    float *norms = tdump_f32(&dump, "adamw/norms", NULL);
    float *lrs = tdump_f32(&dump, "adamw/lrs", NULL);
    float *want = tdump_f32(&dump, "adamw/params", NULL);
    REQUIRE(hp && p && grads && norms && lrs && want);
    int steps = (int)(ng / n);
    CHECK_EQ_INT(steps, 10);
    al_optim_config cfg;
    al_optim_config_default(&cfg);
    cfg.lr = hp[0];
    cfg.beta1 = hp[1];
    cfg.beta2 = hp[2];
    cfg.eps = hp[3];
    cfg.weight_decay = hp[4];
    cfg.grad_clip = hp[5];
    cfg.warmup_steps = (int64_t)hp[6];
    cfg.total_steps = (int64_t)hp[7];
    cfg.min_lr_ratio = hp[8];
    cfg.schedule = AL_LR_COSINE;
    al_adamw opt;
    char err[256];
    REQUIREF(al_adamw_init(&opt, &cfg, (size_t)n, err, sizeof err) == 0, "%s", err);
    float *g = malloc(sizeof(float) * n);
    int clipped = 0, unclipped = 0;
    for (int s = 0; s < steps; s++) {
        memcpy(g, grads + (size_t)s * n, sizeof(float) * n);
        double norm = al_grad_clip(g, (size_t)n, cfg.grad_clip);
        if (norm > cfg.grad_clip) clipped++;
        else unclipped++;
        char what[64];
        snprintf(what, sizeof what, "step %d grad norm", s);
        compare_scalar(what, norm, norms[s], 0.0, 1e-5);
        double lr = al_lr_at(&cfg, opt.step);
        snprintf(what, sizeof what, "step %d lr", s);
        compare_scalar(what, lr, lrs[s], 0.0, 1e-6);
        al_adamw_update(&opt, p, g, lr);
        snprintf(what, sizeof what, "params after step %d", s);
        compare(what, p, want + (size_t)s * n, n, 1e-6, 1e-5);
    }
    /* The data must exercise both sides of the clipping threshold. */
    CHECK(clipped > 0 && unclipped > 0);
    CHECK_EQ_INT(opt.step, steps);
    al_adamw_free(&opt);
    free(g), free(hp), free(p), free(grads), free(norms), free(lrs), free(want);
}

TEST(release_dump)
{
    tdump_free(&dump);
}
