/*
 * 0601: every layer's backward against central finite differences of its forward, and the
 * built-in GEMM against the BLAS one.
 *
 * Each check takes L = sum(y * r) for a fixed random r, so dL/dy = r is what the backward
 * gets; a handful of input and weight entries are nudged by +-h and (L+ - L-) / 2h is
 * compared with the analytic gradient: |fd - an| <= 1e-2 * max(|an|, 0.05 * max|an|) + 1e-4
 * (float forward passes, h = 1e-2 on O(1) values). A wrong sign, a missing term or a
 * transposed index is off by far more than that.
 */
#include "testlib.h"

#include "model/gemm.h"
#include "model/layers.h"
#include "model/model.h"

static uint64_t rng_state = 12345;
static float frand(void) /* uniform in [-1, 1) */
{
    rng_state = rng_state * 6364136223846793005ULL + 1442695040888963407ULL;
    return (float)((rng_state >> 40) * (1.0 / 8388608.0)) - 1.0f;
}
static void fill(float *x, size_t n, float scale)
{
    for (size_t i = 0; i < n; i++)
        x[i] = scale * frand();
}
static float *alloc_rand(size_t n, float scale)
{
    float *x = malloc(sizeof(float) * n);
    fill(x, n, scale);
    return x;
}
static double dot(const float *a, const float *b, size_t n)
{
    double s = 0;
    for (size_t i = 0; i < n; i++)
        s += (double)a[i] * b[i];
    return s;
}
static double maxabs(const float *a, size_t n)
{
    double m = 0;
    for (size_t i = 0; i < n; i++)
        m = fmax(m, fabs(a[i]));
    return m;
}

/* A forward pass as a closure: computes L = sum(y * r) from the current inputs. */
typedef double (*loss_fn)(void *ctx);

/* Nudges `n_probe` entries of x (spread over its length) and compares with grad. */
static int fd_check(const char *what, loss_fn f, void *ctx, float *x, const float *grad, size_t n,
                    int n_probe)
{
    const float h = 1e-2f;
    double gmax = maxabs(grad, n);
    int bad = 0;
    for (int p = 0; p < n_probe; p++) {
        size_t i = (size_t)((p * 2654435761u) % n);
        float keep = x[i];
        x[i] = keep + h;
        double lp = f(ctx);
        x[i] = keep - h;
        double lm = f(ctx);
        x[i] = keep;
        double fd = (lp - lm) / (2.0 * h), an = grad[i];
        double tol = 1e-2 * fmax(fabs(an), 0.05 * gmax) + 1e-4;
        if (!(fabs(fd - an) <= tol)) {
            if (bad < 3)
                printf("    %s[%zu]: finite difference %.6g, backward %.6g\n", what, i, fd, an);
            bad++;
        }
    }
    CHECKF(bad == 0, "%s: %d of %d gradient entries disagree with finite differences", what, bad,
           n_probe);
    return bad == 0;
}

/* ---- rmsnorm ---- */
typedef struct {
    int N, C;
    float *x, *w, *y, *rstd, *r;
} rms_ctx;
static double rms_loss(void *p)
{
    rms_ctx *c = p;
    al_rmsnorm_forward(c->y, c->rstd, c->x, c->w, c->N, c->C, 1e-6f);
    return dot(c->y, c->r, (size_t)c->N * c->C);
}
TEST(rmsnorm_backward_matches_finite_differences)
{
    rms_ctx c = {.N = 5, .C = 24};
    size_t n = (size_t)c.N * c.C;
    c.x = alloc_rand(n, 1.5f), c.w = alloc_rand(c.C, 1.0f), c.r = alloc_rand(n, 1.0f);
    c.y = malloc(sizeof(float) * n), c.rstd = malloc(sizeof(float) * c.N);
    float *dx = calloc(n, sizeof(float)), *dw = calloc(c.C, sizeof(float));
    rms_loss(&c);
    al_rmsnorm_backward(dx, dw, c.r, c.x, c.w, c.rstd, c.N, c.C);
    fd_check("rmsnorm dx", rms_loss, &c, c.x, dx, n, 40);
    fd_check("rmsnorm dw", rms_loss, &c, c.w, dw, c.C, 24);
    /* backward accumulates: a second call doubles the gradient */
    float dw0 = dw[3];
    al_rmsnorm_backward(dx, dw, c.r, c.x, c.w, c.rstd, c.N, c.C);
    CHECK_NEAR(dw[3], 2 * dw0, 1e-5 * fabs(dw0) + 1e-7);
    free(c.x), free(c.w), free(c.r), free(c.y), free(c.rstd), free(dx), free(dw);
}

/* ---- linear ---- */
typedef struct {
    int T, IC, OC;
    float *x, *w, *b, *y, *r;
} lin_ctx;
static double lin_loss(void *p)
{
    lin_ctx *c = p;
    al_linear_forward(c->y, c->x, c->w, c->b, c->T, c->IC, c->OC);
    return dot(c->y, c->r, (size_t)c->T * c->OC);
}
TEST(linear_backward_matches_finite_differences)
{
    lin_ctx c = {.T = 7, .IC = 19, .OC = 13};
    c.x = alloc_rand((size_t)c.T * c.IC, 1), c.w = alloc_rand((size_t)c.OC * c.IC, 0.5f);
    c.b = alloc_rand(c.OC, 0.5f), c.r = alloc_rand((size_t)c.T * c.OC, 1);
    c.y = malloc(sizeof(float) * c.T * c.OC);
    float *dx = calloc((size_t)c.T * c.IC, 4), *dw = calloc((size_t)c.OC * c.IC, 4),
          *db = calloc(c.OC, 4);
    lin_loss(&c);
    al_linear_backward(dx, dw, db, c.r, c.x, c.w, c.T, c.IC, c.OC);
    fd_check("linear dx", lin_loss, &c, c.x, dx, (size_t)c.T * c.IC, 30);
    fd_check("linear dw", lin_loss, &c, c.w, dw, (size_t)c.OC * c.IC, 30);
    fd_check("linear db", lin_loss, &c, c.b, db, c.OC, 13);
    free(c.x), free(c.w), free(c.b), free(c.r), free(c.y), free(dx), free(dw), free(db);
}

/* ---- rope ---- */
typedef struct {
    int T, H, HD;
    float *x, *y, *cs, *sn, *r;
} rope_ctx;
static double rope_loss(void *p)
{
    rope_ctx *c = p;
    size_t n = (size_t)c->T * c->H * c->HD;
    memcpy(c->y, c->x, sizeof(float) * n);
    al_rope_forward(c->y, c->cs, c->sn, c->T, c->H, c->HD);
    return dot(c->y, c->r, n);
}
TEST(rope_backward_matches_finite_differences)
{
    rope_ctx c = {.T = 6, .H = 3, .HD = 8};
    size_t n = (size_t)c.T * c.H * c.HD;
    int32_t pos[6] = {0, 1, 2, 0, 5, 17};
    c.cs = malloc(sizeof(float) * c.T * c.HD / 2), c.sn = malloc(sizeof(float) * c.T * c.HD / 2);
    al_rope_tables(c.cs, c.sn, pos, c.T, c.HD, 10000.0);
    CHECK_NEAR(c.cs[0], 1.0, 0);                /* position 0 is the identity */
    CHECK_NEAR(c.sn[c.HD / 2], sin(1.0), 1e-6); /* position 1, frequency 1 */
    c.x = alloc_rand(n, 1), c.r = alloc_rand(n, 1), c.y = malloc(sizeof(float) * n);
    float *dx = malloc(sizeof(float) * n);
    memcpy(dx, c.r, sizeof(float) * n);
    al_rope_backward(dx, c.cs, c.sn, c.T, c.H, c.HD);
    fd_check("rope dx", rope_loss, &c, c.x, dx, n, 40);
    /* a rotation keeps norms */
    rope_loss(&c);
    CHECK_NEAR(dot(c.y, c.y, n), dot(c.x, c.x, n), 1e-4 * dot(c.x, c.x, n));
    free(c.cs), free(c.sn), free(c.x), free(c.r), free(c.y), free(dx);
}

/* ---- attention (packed, causal, GQA) ---- */
typedef struct {
    int NH, NKV, HD, nseq;
    int32_t cu[4];
    float *q, *k, *v, *out, *scratch, *r;
} att_ctx;
static double att_loss(void *p)
{
    att_ctx *c = p;
    al_attention_forward(c->out, c->scratch, c->q, c->k, c->v, c->cu, c->nseq, c->NH, c->NKV,
                         c->HD);
    return dot(c->out, c->r, (size_t)c->cu[c->nseq] * c->NH * c->HD);
}
TEST(attention_backward_matches_finite_differences)
{
    att_ctx c = {.NH = 4, .NKV = 2, .HD = 8, .nseq = 3, .cu = {0, 5, 6, 11}};
    int T = c.cu[c.nseq];
    size_t nq = (size_t)T * c.NH * c.HD, nk = (size_t)T * c.NKV * c.HD;
    c.q = alloc_rand(nq, 1.5f), c.k = alloc_rand(nk, 1.5f), c.v = alloc_rand(nk, 1),
    c.r = alloc_rand(nq, 1);
    c.out = malloc(sizeof(float) * nq);
    size_t np = al_attention_scratch_size(c.cu, c.nseq, c.NH, c.HD);
    CHECK_EQ_INT(np, 4 * (2 * AL_ATTENTION_BLOCK + 2 * 8) * 5);
    c.scratch = malloc(sizeof(float) * np);
    float *dq = malloc(sizeof(float) * nq), *dk = malloc(sizeof(float) * nk),
          *dv = malloc(sizeof(float) * nk);
    float *scratch = malloc(sizeof(float) * np);
    att_loss(&c);
    /* the first token of a sequence attends to itself only: its output is its v */
    for (int d = 0; d < c.HD; d++)
        CHECK_NEAR(c.out[d], c.v[d], 1e-6);
    /* a one-token sequence attends to itself only: its output is its own v (kv head 0) */
    for (int d = 0; d < c.HD; d++)
        CHECK_NEAR(c.out[(size_t)5 * c.NH * c.HD + d], c.v[(size_t)5 * c.NKV * c.HD + d], 1e-6);
    al_attention_backward(dq, dk, dv, scratch, c.r, c.q, c.k, c.v, c.cu, c.nseq, c.NH, c.NKV, c.HD);
    fd_check("attention dq", att_loss, &c, c.q, dq, nq, 50);
    fd_check("attention dk", att_loss, &c, c.k, dk, nk, 50);
    fd_check("attention dv", att_loss, &c, c.v, dv, nk, 50);
    free(c.q), free(c.k), free(c.v), free(c.r), free(c.out), free(c.scratch);
    free(dq), free(dk), free(dv), free(scratch);
}

TEST(attention_backward_over_several_query_blocks)
{
    /* sequences longer than AL_ATTENTION_BLOCK: blocks, causal key ranges, the kv-head sum */
    att_ctx c = {.NH = 6, .NKV = 2, .HD = 4, .nseq = 2, .cu = {0, 150, 170}};
    int T = c.cu[c.nseq];
    size_t nq = (size_t)T * c.NH * c.HD, nk = (size_t)T * c.NKV * c.HD;
    c.q = alloc_rand(nq, 1.5f), c.k = alloc_rand(nk, 1.5f), c.v = alloc_rand(nk, 1),
    c.r = alloc_rand(nq, 1);
    c.out = malloc(sizeof(float) * nq);
    size_t np = al_attention_scratch_size(c.cu, c.nseq, c.NH, c.HD);
    c.scratch = malloc(sizeof(float) * np);
    float *dq = malloc(sizeof(float) * nq), *dk = malloc(sizeof(float) * nk),
          *dv = malloc(sizeof(float) * nk);
    float *scratch = malloc(sizeof(float) * np);
    att_loss(&c);
    al_attention_backward(dq, dk, dv, scratch, c.r, c.q, c.k, c.v, c.cu, c.nseq, c.NH, c.NKV, c.HD);
    fd_check("long attention dq", att_loss, &c, c.q, dq, nq, 40);
    fd_check("long attention dk", att_loss, &c, c.k, dk, nk, 40);
    fd_check("long attention dv", att_loss, &c, c.v, dv, nk, 40);
    free(c.q), free(c.k), free(c.v), free(c.r), free(c.out), free(c.scratch);
    free(dq), free(dk), free(dv), free(scratch);
}

/* ---- swiglu ---- */
typedef struct {
    size_t n;
    float *g, *u, *h, *r;
} swi_ctx;
static double swi_loss(void *p)
{
    swi_ctx *c = p;
    al_swiglu_forward(c->h, c->g, c->u, c->n);
    return dot(c->h, c->r, c->n);
}
TEST(swiglu_backward_matches_finite_differences)
{
    swi_ctx c = {.n = 50};
    c.g = alloc_rand(c.n, 4), c.u = alloc_rand(c.n, 2), c.r = alloc_rand(c.n, 1),
    c.h = malloc(4 * c.n);
    float *dg = malloc(4 * c.n), *du = malloc(4 * c.n);
    al_swiglu_backward(dg, du, c.r, c.g, c.u, c.n);
    fd_check("swiglu dgate", swi_loss, &c, c.g, dg, c.n, 50);
    fd_check("swiglu dup", swi_loss, &c, c.u, du, c.n, 50);
    free(c.g), free(c.u), free(c.r), free(c.h), free(dg), free(du);
}

TEST(embedding_backward_sums_repeated_tokens)
{
    int32_t tok[5] = {2, 0, 2, 3, 2};
    int V = 4, C = 3;
    float wte[12], out[15], dout[15], dwte[12] = {0};
    fill(wte, 12, 1), fill(dout, 15, 1);
    al_embedding_forward(out, tok, wte, 5, C);
    CHECK(memcmp(out + 3, wte, 12) == 0 && memcmp(out + 12, wte + 6, 12) == 0);
    al_embedding_backward(dwte, dout, tok, 5, C);
    for (int c = 0; c < C; c++) {
        CHECK_NEAR(dwte[2 * C + c], dout[c] + dout[6 + c] + dout[12 + c], 1e-6);
        CHECK_NEAR(dwte[1 * C + c], 0, 0);
    }
    (void)V;
}

/* ---- the whole model, Llama flavour with attention biases (o_proj too) ---- */
typedef struct {
    al_model *m;
    int32_t tok[12], pos[12], cu[3];
    float *logits, *r;
    size_t TV;
} model_ctx;
static double model_loss(void *p)
{
    model_ctx *c = p;
    if (al_model_forward(c->m, c->tok, c->pos, c->cu, 2, 12, c->logits)) return NAN;
    return dot(c->logits, c->r, c->TV);
}
TEST(model_backward_matches_finite_differences)
{
    al_model_config cfg = {0};
    al_model_config_set_arch(&cfg, AL_MODEL_ARCH_LLAMA);
    cfg.vocab_size = 40, cfg.hidden_size = 16, cfg.intermediate_size = 24, cfg.num_layers = 2;
    cfg.num_heads = 4, cfg.num_kv_heads = 2, cfg.head_dim = 6, cfg.rms_norm_eps = 1e-6;
    cfg.rope_theta = 10000, cfg.qkv_bias = 1, cfg.o_bias = 1, cfg.max_position_embeddings = 64;
    cfg.bos_token_id = cfg.eos_token_id = -1;
    char err[256];
    model_ctx c = {0};
    c.m = al_model_new(&cfg, err, sizeof err);
    REQUIREF(c.m, "%s", err);
    /* larger weights than HF's init so every path carries signal */
    fill(al_model_params(c.m), al_model_num_params(c.m), 0.4f);
    for (int t = 0; t < 12; t++)
        c.tok[t] = (t * 7 + 3) % 40, c.pos[t] = t < 7 ? t : t - 7;
    c.cu[0] = 0, c.cu[1] = 7, c.cu[2] = 12;
    c.TV = 12 * 40;
    c.logits = malloc(sizeof(float) * c.TV), c.r = alloc_rand(c.TV, 1);
    REQUIRE(!isnan(model_loss(&c)));
    al_model_zero_grad(c.m);
    REQUIRE(al_model_backward(c.m, c.r) == 0);
    float *g = malloc(sizeof(float) * al_model_num_params(c.m));
    memcpy(g, al_model_grads(c.m), sizeof(float) * al_model_num_params(c.m));
    for (size_t i = 0; i < al_model_num_tensors(c.m); i++) {
        const al_model_tensor *t = &al_model_tensors(c.m)[i];
        if (strstr(t->name, "layers.1.") && !strstr(t->name, "o_proj")) continue; /* keep it lean */
        fd_check(t->name, model_loss, &c, al_model_params(c.m) + t->offset, g + t->offset, t->numel,
                 6);
    }
    free(g), free(c.logits), free(c.r);
    al_model_free(c.m);
}

static void gemm_case(int ta, int tb, int M, int N, int K, float beta)
{
    int lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + 2, ldc = N + 1;
    size_t na = (size_t)(ta ? K : M) * lda, nb = (size_t)(tb ? N : K) * ldb, nc = (size_t)M * ldc;
    float *A = alloc_rand(na, 1), *B = alloc_rand(nb, 1), *C1 = alloc_rand(nc, 1);
    float *C2 = malloc(sizeof(float) * nc);
    memcpy(C2, C1, sizeof(float) * nc);
    if (beta == 0.0f) C1[0] = C2[0] = NAN; /* beta 0 must not read C */
    double C0ij = beta == 0.0f ? 0.0 : C1[(size_t)(M - 1) * ldc + N / 2];
    al_gemm(ta, tb, M, N, K, 0.5f, A, lda, B, ldb, beta, C1, ldc);
    al_gemm_ref(ta, tb, M, N, K, 0.5f, A, lda, B, ldb, beta, C2, ldc);
    double err = 0;
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++)
            err = fmax(err, fabs(C1[(size_t)i * ldc + j] - C2[(size_t)i * ldc + j]));
    CHECKF(err <= 1e-4 * sqrt((double)K), "gemm ta=%d tb=%d %dx%dx%d beta=%g: max diff %g", ta, tb,
           M, N, K, beta, err);
    /* and one entry against a plain loop in double */
    int i = M - 1, j = N / 2;
    double s = 0;
    for (int k = 0; k < K; k++)
        s += (double)(ta ? A[(size_t)k * lda + i] : A[(size_t)i * lda + k]) *
             (tb ? B[(size_t)j * ldb + k] : B[(size_t)k * ldb + j]);
    CHECK_NEAR(C2[(size_t)i * ldc + j], 0.5 * s + beta * C0ij, 1e-4 * sqrt((double)K));
    free(A), free(B), free(C1), free(C2);
}

TEST(builtin_gemm_matches_blas_for_every_transpose)
{
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            gemm_case(ta, tb, 37, 70, 300, 0.0f);
            gemm_case(ta, tb, 5, 3, 9, 1.0f);
            gemm_case(ta, tb, 65, 129, 17, 0.5f);
            gemm_case(ta, tb, 301, 70, 200, 1.0f); /* large enough to be split by rows */
            gemm_case(ta, tb, 40, 403, 200, 0.0f); /* ... and by columns */
        }
    printf("    backend: %s\n", al_gemm_backend());
}
