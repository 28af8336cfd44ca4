/*
 * 1700: every op of the CUDA backend against the CPU backend, op by op (ops.h). Inputs are
 * random, rounded to bf16 on the host, so that both backends start from the same numbers;
 * results are compared by relative L2 error (‖cuda - cpu‖ / ‖cpu‖) with a tolerance per op:
 *   bf16 outputs (one rounding, ~2^-9 relative)                    1e-2
 *   attention outputs and gradients (bf16 inputs, f32 sums)        2e-2 / 3e-2
 *   f32 results of f32 sums (weight gradients, logits, logprobs)   1e-3 .. 1e-5
 * Skipped (exit 77) without a CUDA device.
 */
#include "t1799_gpu_util.h"

#include "model/layers.h"

static al_backend *cpu;

static void *g_act(const float *h, size_t n)
{
    void *d = gpu_be->ops->alloc(gpu_be, 2 * (n ? n : 1));
    gpu_be->ops->upload_weights(gpu_be, d, h, n);
    return d;
}
static float *g_f32(const float *h, size_t n)
{
    float *d = gpu_be->ops->alloc(gpu_be, sizeof(float) * (n ? n : 1));
    if (h) gpu_be->ops->upload(gpu_be, d, h, sizeof(float) * n);
    return d;
}
static int32_t *g_i32(const int32_t *h, size_t n)
{
    int32_t *d = gpu_be->ops->alloc(gpu_be, sizeof(int32_t) * (n ? n : 1));
    gpu_be->ops->upload(gpu_be, d, h, sizeof(int32_t) * n);
    return d;
}
static float *down_act(const void *d, size_t n)
{
    float *h = malloc(sizeof(float) * (n ? n : 1));
    gpu_be->ops->download_weights(gpu_be, h, d, n);
    return h;
}
static float *down_f32(const float *d, size_t n)
{
    float *h = malloc(sizeof(float) * (n ? n : 1));
    gpu_be->ops->download(gpu_be, h, d, sizeof(float) * n);
    return h;
}
static void gfree(void *d)
{
    gpu_be->ops->free(gpu_be, d);
}
static float *hdup(const float *x, size_t n)
{
    float *y = malloc(sizeof(float) * (n ? n : 1));
    memcpy(y, x, sizeof(float) * n);
    return y;
}

#define CMP(name, got, want, n, tol)                                                               \
    do {                                                                                           \
        double e_ = rel_l2(got, want, n);                                                          \
        printf("    %-28s rel L2 %.3g (tol %.0e)\n", name, e_, (double)(tol));                    \
        CHECKF(e_ <= (tol), "%s: relative L2 error %.3g above %.0e", name, e_, (double)(tol));   \
    } while (0)

TEST(embedding)
{
    enum { V = 50, C = 96, T = 37 };
    float *wte = malloc(sizeof(float) * V * C), *dout = malloc(sizeof(float) * T * C);
    fill_rand(wte, V * C, 1, 1), fill_rand(dout, T * C, 1, 2);
    int32_t tok[T];
    for (int t = 0; t < T; t++)
        tok[t] = (t * 7 + 3) % V;
    tok[5] = tok[9] = tok[30]; /* repeats: the backward adds them up */
    float out[T * C], *dw = calloc(V * C, sizeof(float));
    cpu->ops->embedding_forward(cpu, out, tok, wte, T, C);
    cpu->ops->embedding_backward(cpu, dw, dout, tok, T, C);
    void *gw = g_act(wte, V * C), *go = g_act(out, T * C), *gd = g_act(dout, T * C);
    int32_t *gt = g_i32(tok, T);
    float *gdw = g_f32(NULL, V * C);
    gpu_be->ops->embedding_forward(gpu_be, go, gt, gw, T, C);
    gpu_be->ops->embedding_backward(gpu_be, gdw, gd, gt, T, C);
    float *ho = down_act(go, T * C), *hdw = down_f32(gdw, V * C);
    CMP("embedding forward", ho, out, T * C, 0);
    CMP("embedding backward", hdw, dw, V * C, 1e-6);
    free(ho), free(hdw), gfree(gw), gfree(go), gfree(gd), gfree(gt), gfree(gdw);
    free(wte), free(dout), free(dw);
}

static void rmsnorm_case(int N, int C)
{
    size_t n = (size_t)N * C;
    float *x = malloc(sizeof(float) * n), *w = malloc(sizeof(float) * C);
    float *dout = malloc(sizeof(float) * n), *dx = malloc(sizeof(float) * n);
    fill_rand(x, n, 2, 3), fill_rand(w, C, 1.5f, 4), fill_rand(dout, n, 1, 5), fill_rand(dx, n, 0.5f, 6);
    float *out = malloc(sizeof(float) * n), *rstd = malloc(sizeof(float) * N);
    float *dw = calloc(C, sizeof(float)), *dx_cpu = hdup(dx, n);
    cpu->ops->rmsnorm_forward(cpu, out, rstd, x, w, N, C, 1e-6f);
    cpu->ops->rmsnorm_backward(cpu, dx_cpu, dw, dout, x, w, rstd, N, C);
    void *gx = g_act(x, n), *gw = g_act(w, C), *go = g_act(out, n), *gd = g_act(dout, n);
    void *gdx = g_act(dx, n);
    float *gr = g_f32(NULL, N), *gdw = g_f32(NULL, C);
    gpu_be->ops->rmsnorm_forward(gpu_be, go, gr, gx, gw, N, C, 1e-6f);
    gpu_be->ops->rmsnorm_backward(gpu_be, gdx, gdw, gd, gx, gw, gr, N, C);
    float *ho = down_act(go, n), *hr = down_f32(gr, N), *hdx = down_act(gdx, n), *hdw = down_f32(gdw, C);
    CMP("rmsnorm forward", ho, out, n, 1e-2);
    CMP("rmsnorm rstd", hr, rstd, N, 1e-5);
    CMP("rmsnorm backward dx", hdx, dx_cpu, n, 1e-2);
    CMP("rmsnorm backward dw", hdw, dw, C, 1e-3);
    free(ho), free(hr), free(hdx), free(hdw);
    gfree(gx), gfree(gw), gfree(go), gfree(gd), gfree(gdx), gfree(gr), gfree(gdw);
    free(x), free(w), free(dout), free(dx), free(out), free(rstd), free(dw), free(dx_cpu);
}

TEST(rmsnorm)
{
    rmsnorm_case(33, 200);  /* hidden-size rows */
    rmsnorm_case(448, 64);  /* Qwen3's per-head q/k norms: many short rows */
}

TEST(linear)
{
    enum { T = 45, IC = 96, OC = 80 };
    float *x = malloc(sizeof(float) * T * IC), *w = malloc(sizeof(float) * OC * IC);
    float *b = malloc(sizeof(float) * OC), *dout = malloc(sizeof(float) * T * OC);
    float *dx = malloc(sizeof(float) * T * IC);
    fill_rand(x, T * IC, 1, 7), fill_rand(w, OC * IC, 0.2f, 8), fill_rand(b, OC, 0.5f, 9);
    fill_rand(dout, T * OC, 1, 10), fill_rand(dx, T * IC, 0.3f, 11);
    float *out = malloc(sizeof(float) * T * OC), *dw = calloc(OC * IC, sizeof(float));
    float *db = calloc(OC, sizeof(float)), *dx_cpu = hdup(dx, T * IC);
    cpu->ops->linear_forward(cpu, out, x, w, b, T, IC, OC);
    cpu->ops->linear_backward(cpu, dx_cpu, dw, db, dout, x, w, T, IC, OC);
    void *gx = g_act(x, T * IC), *gw = g_act(w, OC * IC), *gb = g_act(b, OC), *go = g_act(out, T * OC);
    void *gd = g_act(dout, T * OC), *gdx = g_act(dx, T * IC);
    float *gdw = g_f32(NULL, OC * IC), *gdb = g_f32(NULL, OC);
    gpu_be->ops->linear_forward(gpu_be, go, gx, gw, gb, T, IC, OC);
    gpu_be->ops->linear_backward(gpu_be, gdx, gdw, gdb, gd, gx, gw, T, IC, OC);
    float *ho = down_act(go, T * OC), *hdx = down_act(gdx, T * IC);
    float *hdw = down_f32(gdw, OC * IC), *hdb = down_f32(gdb, OC);
    CMP("linear forward (+bias)", ho, out, T * OC, 1e-2);
    CMP("linear backward dx", hdx, dx_cpu, T * IC, 1e-2);
    CMP("linear backward dw", hdw, dw, OC * IC, 1e-3);
    CMP("linear backward db", hdb, db, OC, 1e-4);
    /* no bias, and the lm head's f32 logits */
    float *logits = malloc(sizeof(float) * T * OC), *dl = malloc(sizeof(float) * T * OC);
    cpu->ops->lm_head_forward(cpu, logits, x, w, T, IC, OC);
    float *glog = g_f32(NULL, T * OC);
    gpu_be->ops->lm_head_forward(gpu_be, glog, gx, gw, T, IC, OC);
    float *hl = down_f32(glog, T * OC);
    CMP("lm head forward (f32)", hl, logits, T * OC, 1e-3);
    fill_rand(dl, T * OC, 1, 12);
    float *dx2 = calloc(T * IC, sizeof(float)), *dw2 = calloc(OC * IC, sizeof(float));
    cpu->ops->lm_head_backward(cpu, dx2, dw2, dl, x, w, T, IC, OC);
    float *zero = calloc(T * IC, sizeof(float));
    void *gdx2 = g_act(zero, T * IC);
    float *gdw2 = g_f32(NULL, OC * IC), *gdl = g_f32(dl, T * OC);
    gpu_be->ops->lm_head_backward(gpu_be, gdx2, gdw2, gdl, gx, gw, T, IC, OC);
    float *hdx2 = down_act(gdx2, T * IC), *hdw2 = down_f32(gdw2, OC * IC);
    CMP("lm head backward dx", hdx2, dx2, T * IC, 1e-2);
    CMP("lm head backward dw", hdw2, dw2, OC * IC, 1e-2);
    free(ho), free(hdx), free(hdw), free(hdb), free(hl), free(hdx2), free(hdw2);
    gfree(gx), gfree(gw), gfree(gb), gfree(go), gfree(gd), gfree(gdx), gfree(gdw), gfree(gdb);
    gfree(glog), gfree(gdx2), gfree(gdw2), gfree(gdl);
    free(x), free(w), free(b), free(dout), free(dx), free(out), free(dw), free(db), free(dx_cpu);
    free(logits), free(dl), free(dx2), free(dw2), free(zero);
}

TEST(rope_swiglu_residual_gather)
{
    enum { T = 20, H = 3, HD = 16, N = T * H * HD };
    int32_t pos[T];
    for (int t = 0; t < T; t++)
        pos[t] = (t * 5) % 13 + t;
    float cs[T * HD / 2], sn[T * HD / 2];
    al_rope_tables(cs, sn, pos, T, HD, 1e6);
    float *x = malloc(sizeof(float) * N), *y = malloc(sizeof(float) * N);
    fill_rand(x, N, 1, 13);
    memcpy(y, x, sizeof(float) * N);
    cpu->ops->rope_forward(cpu, y, cs, sn, T, H, HD);
    void *gx = g_act(x, N);
    float *gc = g_f32(cs, T * HD / 2), *gs = g_f32(sn, T * HD / 2);
    gpu_be->ops->rope_forward(gpu_be, gx, gc, gs, T, H, HD);
    float *hy = down_act(gx, N);
    CMP("rope forward", hy, y, N, 1e-2);
    cpu->ops->rope_backward(cpu, y, cs, sn, T, H, HD);
    gpu_be->ops->rope_backward(gpu_be, gx, gc, gs, T, H, HD);
    free(hy);
    hy = down_act(gx, N);
    CMP("rope backward", hy, y, N, 1e-2);

    float *g = malloc(sizeof(float) * N), *u = malloc(sizeof(float) * N), *dh = malloc(sizeof(float) * N);
    fill_rand(g, N, 4, 14), fill_rand(u, N, 2, 15), fill_rand(dh, N, 1, 16);
    float *h = malloc(sizeof(float) * N), *dg = malloc(sizeof(float) * N), *du = malloc(sizeof(float) * N);
    cpu->ops->swiglu_forward(cpu, h, g, u, N);
    cpu->ops->swiglu_backward(cpu, dg, du, dh, g, u, N);
    void *gg = g_act(g, N), *gu = g_act(u, N), *gdh = g_act(dh, N), *gh = g_act(h, N);
    void *gdg = g_act(h, N), *gdu = g_act(h, N);
    gpu_be->ops->swiglu_forward(gpu_be, gh, gg, gu, N);
    gpu_be->ops->swiglu_backward(gpu_be, gdg, gdu, gdh, gg, gu, N);
    float *hh = down_act(gh, N), *hdg = down_act(gdg, N), *hdu = down_act(gdu, N);
    CMP("swiglu forward", hh, h, N, 1e-2);
    CMP("swiglu backward dgate", hdg, dg, N, 1e-2);
    CMP("swiglu backward dup", hdu, du, N, 1e-2);

    float *r = malloc(sizeof(float) * N);
    cpu->ops->residual_forward(cpu, r, g, u, N);
    gpu_be->ops->residual_forward(gpu_be, gh, gg, gu, N);
    free(hh);
    hh = down_act(gh, N);
    CMP("residual", hh, r, N, 1e-2);

    int32_t rows[4] = {7, 0, 19, 3};
    float gat[4 * H * HD];
    cpu->ops->gather_rows(cpu, gat, g, rows, 4, H * HD);
    int32_t *grows = g_i32(rows, 4);
    void *gout = g_act(gat, 4 * H * HD);
    gpu_be->ops->gather_rows(gpu_be, gout, gg, grows, 4, H * HD);
    float *hg = down_act(gout, 4 * H * HD);
    CMP("gather rows", hg, gat, 4 * H * HD, 0);
    free(hy), free(hh), free(hdg), free(hdu), free(hg);
    gfree(gx), gfree(gc), gfree(gs), gfree(gg), gfree(gu), gfree(gdh), gfree(gh), gfree(gdg);
    gfree(gdu), gfree(grows), gfree(gout);
    free(x), free(y), free(g), free(u), free(dh), free(h), free(dg), free(du), free(r);
}

static void attention_case(const int32_t *cu, int nseq, int NH, int NKV, int HD)
{
    int T = cu[nseq], Q = NH * HD, KV = NKV * HD;
    size_t nq = (size_t)T * Q, nk = (size_t)T * KV;
    float *q = malloc(sizeof(float) * nq), *k = malloc(sizeof(float) * nk), *v = malloc(sizeof(float) * nk);
    float *dout = malloc(sizeof(float) * nq);
    fill_rand(q, nq, 2, 21), fill_rand(k, nk, 2, 22), fill_rand(v, nk, 1, 23), fill_rand(dout, nq, 1, 24);
    float *out = malloc(sizeof(float) * nq), *dq = malloc(sizeof(float) * nq);
    float *dk = malloc(sizeof(float) * nk), *dv = malloc(sizeof(float) * nk);
    size_t sb = cpu->ops->attention_scratch_bytes(cpu, cu, nseq, NH, HD);
    float *scr = malloc(sb ? sb : 1);
    cpu->ops->attention_forward(cpu, out, scr, q, k, v, cu, cu, nseq, NH, NKV, HD);
    cpu->ops->attention_backward(cpu, dq, dk, dv, scr, dout, out, q, k, v, cu, cu, nseq, NH, NKV, HD);
    void *gq = g_act(q, nq), *gk = g_act(k, nk), *gv = g_act(v, nk), *gd = g_act(dout, nq);
    void *go = g_act(out, nq), *gdq = g_act(out, nq), *gdk = g_act(k, nk), *gdv = g_act(k, nk);
    int32_t *gcu = g_i32(cu, nseq + 1);
    size_t gsb = gpu_be->ops->attention_scratch_bytes(gpu_be, cu, nseq, NH, HD);
    void *gscr = gpu_be->ops->alloc(gpu_be, gsb ? gsb : 1);
    gpu_be->ops->attention_forward(gpu_be, go, gscr, gq, gk, gv, gcu, cu, nseq, NH, NKV, HD);
    float *ho = down_act(go, nq);
    printf("    T=%d, %d sequences, NH=%d NKV=%d HD=%d\n", T, nseq, NH, NKV, HD);
    CMP("attention forward", ho, out, nq, 2e-2);
    /* the backward reads the forward's output as the device computed it */
    gpu_be->ops->attention_backward(gpu_be, gdq, gdk, gdv, gscr, gd, go, gq, gk, gv, gcu, cu, nseq,
                                    NH, NKV, HD);
    float *hdq = down_act(gdq, nq), *hdk = down_act(gdk, nk), *hdv = down_act(gdv, nk);
    CMP("attention backward dq", hdq, dq, nq, 3e-2);
    CMP("attention backward dk", hdk, dk, nk, 3e-2);
    CMP("attention backward dv", hdv, dv, nk, 3e-2);
    free(ho), free(hdq), free(hdk), free(hdv), free(scr);
    gfree(gq), gfree(gk), gfree(gv), gfree(gd), gfree(go), gfree(gdq), gfree(gdk), gfree(gdv);
    gfree(gcu), gfree(gscr);
    free(q), free(k), free(v), free(dout), free(out), free(dq), free(dk), free(dv);
}

TEST(attention_packed)
{
    int32_t cu1[] = {0, 5, 45, 46, 116};
    attention_case(cu1, 4, 4, 2, 64);
    int32_t cu2[] = {0, 33, 100};
    attention_case(cu2, 2, 2, 1, 128);
    int32_t cu3[] = {0, 300};
    attention_case(cu3, 1, 6, 6, 16);
}

/* Serving: three sequences with different history lengths prefill a chunk each, then decode
 * two steps together; a fourth cache copies the second's prefix and decodes the same row. */
TEST(attention_kv_paged)
{
    enum { L = 2, NH = 4, NKV = 2, HD = 32, KV = NKV * HD, Q = NH * HD, NS = 3 };
    int pre[NS] = {1, 17, 40};
    al_kv ck[NS + 1], gk[NS + 1];
    al_kv *cp[NS + 1], *gp[NS + 1];
    for (int i = 0; i <= NS; i++) {
        memset(&ck[i], 0, sizeof ck[i]);
        ck[i].be = cpu, ck[i].L = L, ck[i].max = 64, ck[i].kvw = KV;
        gk[i] = ck[i], gk[i].be = gpu_be;
        REQUIRE(cpu->ops->kv_alloc(cpu, &ck[i]) == 0);
        REQUIRE(gpu_be->ops->kv_alloc(gpu_be, &gk[i]) == 0);
        cp[i] = &ck[i], gp[i] = &gk[i];
    }
    for (int step = 0; step < 3; step++) {
        int cu[NS + 1] = {0};
        for (int i = 0; i < NS; i++)
            cu[i + 1] = cu[i] + (step == 0 ? pre[i] : 1);
        int T = cu[NS];
        float *q = malloc(sizeof(float) * T * Q), *kn = malloc(sizeof(float) * T * KV);
        float *vn = malloc(sizeof(float) * T * KV), *out = malloc(sizeof(float) * T * Q);
        void *gq = NULL, *gkn = NULL, *gvn = NULL, *go = NULL;
        for (int l = 0; l < L; l++) {
            fill_rand(q, (size_t)T * Q, 2, 100 + step * 10 + l);
            fill_rand(kn, (size_t)T * KV, 2, 200 + step * 10 + l);
            fill_rand(vn, (size_t)T * KV, 1, 300 + step * 10 + l);
            cpu->ops->attention_kv(cpu, l, out, q, kn, vn, cp, NS, cu, NH, NKV, HD);
            gfree(gq), gfree(gkn), gfree(gvn), gfree(go);
            gq = g_act(q, (size_t)T * Q), gkn = g_act(kn, (size_t)T * KV);
            gvn = g_act(vn, (size_t)T * KV), go = g_act(out, (size_t)T * Q);
            gpu_be->ops->attention_kv(gpu_be, l, go, gq, gkn, gvn, gp, NS, cu, NH, NKV, HD);
            float *ho = down_act(go, (size_t)T * Q);
            char name[64];
            snprintf(name, sizeof name, "kv attention step %d layer %d", step, l);
            CMP(name, ho, out, (size_t)T * Q, 2e-2);
            free(ho);
        }
        for (int i = 0; i < NS; i++)
            ck[i].len += cu[i + 1] - cu[i], gk[i].len += cu[i + 1] - cu[i];
        free(q), free(kn), free(vn), free(out);
        gfree(gq), gfree(gkn), gfree(gvn), gfree(go);
    }
    /* copy the prefix of sequence 1 into cache 3; one decode row on each must agree */
    int len = ck[1].len;
    cpu->ops->kv_copy_prefix(cpu, &ck[NS], &ck[1], len);
    gpu_be->ops->kv_copy_prefix(gpu_be, &gk[NS], &gk[1], len);
    ck[NS].len = gk[NS].len = len;
    int cu1[2] = {0, 1};
    float q[Q], kn[KV], vn[KV], o1[Q], o2[Q];
    fill_rand(q, Q, 2, 400), fill_rand(kn, KV, 2, 401), fill_rand(vn, KV, 1, 402);
    al_kv *a = &gk[1], *b = &gk[NS];
    void *gq = g_act(q, Q), *gkn = g_act(kn, KV), *gvn = g_act(vn, KV), *go = g_act(q, Q);
    gpu_be->ops->attention_kv(gpu_be, 0, go, gq, gkn, gvn, &a, 1, cu1, NH, NKV, HD);
    gpu_be->ops->download_weights(gpu_be, o1, go, Q);
    gpu_be->ops->attention_kv(gpu_be, 0, go, gq, gkn, gvn, &b, 1, cu1, NH, NKV, HD);
    gpu_be->ops->download_weights(gpu_be, o2, go, Q);
    CMP("kv copy_prefix", o2, o1, Q, 0);
    gfree(gq), gfree(gkn), gfree(gvn), gfree(go);
    for (int i = 0; i <= NS; i++) {
        cpu->ops->kv_free(cpu, &ck[i]);
        gpu_be->ops->kv_free(gpu_be, &gk[i]);
    }
}

TEST(logprob_entropy)
{
    enum { T = 23, V = 1000 };
    float *lg = malloc(sizeof(float) * T * V);
    fill_rand(lg, T * V, 8, 31);
    int32_t tg[T];
    float dlp[T], dent[T];
    for (int t = 0; t < T; t++)
        tg[t] = t == 4 ? -1 : (t * 97 + 5) % V, dlp[t] = 0.1f * (t % 5) - 0.2f, dent[t] = 0.03f * (t % 3);
    float lp[T], en[T], *dl = malloc(sizeof(float) * T * V);
    cpu->ops->logprob_forward(cpu, lg, tg, T, V, 0.7f, lp, en);
    cpu->ops->logprob_backward(cpu, lg, tg, T, V, 0.7f, dlp, dent, dl);
    float *glg = g_f32(lg, T * V), *glp = g_f32(NULL, T), *gen = g_f32(NULL, T);
    float *gdlp = g_f32(dlp, T), *gdent = g_f32(dent, T);
    int32_t *gtg = g_i32(tg, T);
    gpu_be->ops->logprob_forward(gpu_be, glg, gtg, T, V, 0.7f, glp, gen);
    gpu_be->ops->logprob_backward(gpu_be, glg, gtg, T, V, 0.7f, gdlp, gdent, glg); /* in place */
    float *hlp = down_f32(glp, T), *hen = down_f32(gen, T), *hdl = down_f32(glg, T * V);
    double elp = 0, een = 0;
    for (int t = 0; t < T; t++)
        elp = fmax(elp, fabs(hlp[t] - lp[t])), een = fmax(een, fabs(hen[t] - en[t]));
    printf("    logp max abs err %.3g, entropy %.3g\n", elp, een);
    CHECKF(elp <= 1e-4 && een <= 1e-4, "logprob/entropy differ by %.3g / %.3g", elp, een);
    CMP("logprob backward (in place)", hdl, dl, T * V, 1e-4);
    free(hlp), free(hen), free(hdl);
    gfree(glg), gfree(glp), gfree(gen), gfree(gdlp), gfree(gdent), gfree(gtg);
    free(lg), free(dl);
}

TEST(optimizer_ops)
{
    enum { N = 100003 };
    float *p = malloc(sizeof(float) * N), *g = malloc(sizeof(float) * N);
    float *m = malloc(sizeof(float) * N), *v = malloc(sizeof(float) * N);
    fill_rand(p, N, 0.1f, 41), fill_rand(g, N, 0.01f, 42), fill_rand(m, N, 0.001f, 43);
    for (int i = 0; i < N; i++)
        v[i] = m[i] * m[i] * 3;
    float *gp = g_f32(p, N), *gg = g_f32(g, N), *gm = g_f32(m, N), *gv = g_f32(v, N);
    double s_cpu = cpu->ops->sum_squares(cpu, g, N), s_gpu = gpu_be->ops->sum_squares(gpu_be, gg, N);
    printf("    sum of squares %.12g vs %.12g\n", s_gpu, s_cpu);
    CHECKF(fabs(s_gpu - s_cpu) <= 1e-9 * s_cpu, "sum of squares %.12g vs %.12g", s_gpu, s_cpu);
    cpu->ops->scale(cpu, g, N, 0.37f);
    gpu_be->ops->scale(gpu_be, gg, N, 0.37f);
    al_adamw_args a = {.lr = 3e-4, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f, .t = 7};
    void *work = gpu_be->ops->alloc(gpu_be, 2 * N);
    cpu->ops->adamw_update(cpu, p, NULL, g, m, v, 10, N - 20, &a);
    gpu_be->ops->adamw_update(gpu_be, gp, work, gg, gm, gv, 10, N - 20, &a);
    float *hp = down_f32(gp, N), *hm = down_f32(gm, N), *hv = down_f32(gv, N), *hw = down_act(work, N);
    CMP("adamw params", hp, p, N, 1e-6);
    CMP("adamw exp_avg", hm, m, N, 1e-6);
    CMP("adamw exp_avg_sq", hv, v, N, 1e-6);
    int bad = 0;
    for (int i = 10; i < N - 10; i++)
        bad += hw[i] != bf16_round(hp[i]);
    CHECKF(bad == 0, "%d bf16 working weights differ from the rounded masters", bad);
    free(hp), free(hm), free(hv), free(hw);
    gfree(gp), gfree(gg), gfree(gm), gfree(gv), gfree(work);
    free(p), free(g), free(m), free(v);
}

int main(int argc, char **argv)
{
    cpu = al_backend_cpu();
    return gpu_test_main(argc, argv);
}
