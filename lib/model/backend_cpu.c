/*
 * backend_cpu.c: the CPU backend, the reference every other backend is tested against.
 * Each op is the plain C of layers.c, logprob.c and optim.c (OpenBLAS for the GEMMs, OpenMP
 * across rows); activations, weights and gradients are host f32, so every pointer the table
 * hands over is a float *.
 */
#include "model/ops.h"

#include "model/layers.h"
#include "model/logprob.h"
#include "model/optim.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void *cpu_alloc(al_backend *b, size_t bytes)
{
    (void)b;
    return calloc(1, bytes ? bytes : 1);
}
static void cpu_free(al_backend *b, void *p)
{
    (void)b;
    free(p);
}
static void cpu_copy(al_backend *b, void *dst, const void *src, size_t bytes)
{
    (void)b;
    if (dst != src && bytes) memcpy(dst, src, bytes);
}
static void cpu_zero(al_backend *b, void *p, size_t bytes)
{
    (void)b;
    if (bytes) memset(p, 0, bytes);
}
static void cpu_upload_weights(al_backend *b, void *dst, const float *src, size_t n)
{
    cpu_copy(b, dst, src, n * sizeof(float));
}
static void cpu_download_weights(al_backend *b, float *dst, const void *src, size_t n)
{
    cpu_copy(b, dst, src, n * sizeof(float));
}
static void cpu_weights_from_master(al_backend *b, void *dst, const float *src, size_t n)
{
    cpu_copy(b, dst, src, n * sizeof(float));
}

static void cpu_embedding_forward(al_backend *b, void *out, const int32_t *tokens,
                                  const void *wte, int T, int C)
{
    (void)b;
    al_embedding_forward(out, tokens, wte, T, C);
}
static void cpu_embedding_backward(al_backend *b, float *dwte, const void *dout,
                                   const int32_t *tokens, int T, int C)
{
    (void)b;
    al_embedding_backward(dwte, dout, tokens, T, C);
}
static void cpu_rmsnorm_forward(al_backend *b, void *out, float *rstd, const void *x,
                                const void *w, int N, int C, float eps)
{
    (void)b;
    al_rmsnorm_forward(out, rstd, x, w, N, C, eps);
}
static void cpu_rmsnorm_backward(al_backend *b, void *dx, float *dw, const void *dout,
                                 const void *x, const void *w, const float *rstd, int N, int C)
{
    (void)b;
    al_rmsnorm_backward(dx, dw, dout, x, w, rstd, N, C);
}
static void cpu_linear_forward(al_backend *b, void *out, const void *x, const void *w,
                               const void *bias, int T, int IC, int OC)
{
    (void)b;
    al_linear_forward(out, x, w, bias, T, IC, OC);
}
static void cpu_linear_backward(al_backend *b, void *dx, float *dw, float *db, const void *dout,
                                const void *x, const void *w, int T, int IC, int OC)
{
    (void)b;
    al_linear_backward(dx, dw, db, dout, x, w, T, IC, OC);
}
static void cpu_rope_forward(al_backend *b, void *x, const float *cos_t, const float *sin_t,
                             int T, int H, int HD)
{
    (void)b;
    al_rope_forward(x, cos_t, sin_t, T, H, HD);
}
static void cpu_rope_backward(al_backend *b, void *dx, const float *cos_t, const float *sin_t,
                              int T, int H, int HD)
{
    (void)b;
    al_rope_backward(dx, cos_t, sin_t, T, H, HD);
}
static size_t cpu_attention_scratch_bytes(al_backend *b, const int32_t *cu_seqlens_host,
                                          int nseq, int NH, int HD)
{
    (void)b;
    return sizeof(float) * al_attention_scratch_size(cu_seqlens_host, nseq, NH, HD);
}
static void cpu_attention_forward(al_backend *b, void *out, void *scratch, const void *q,
                                  const void *k, const void *v, const int32_t *cu_seqlens,
                                  const int32_t *cu_seqlens_host, int nseq, int NH, int NKV,
                                  int HD)
{
    (void)b, (void)cu_seqlens_host;
    al_attention_forward(out, scratch, q, k, v, cu_seqlens, nseq, NH, NKV, HD);
}
static void cpu_attention_backward(al_backend *b, void *dq, void *dk, void *dv, void *scratch,
                                   const void *dout, const void *out, const void *q, const void *k,
                                   const void *v, const int32_t *cu_seqlens,
                                   const int32_t *cu_seqlens_host, int nseq, int NH, int NKV,
                                   int HD)
{
    (void)b, (void)cu_seqlens_host, (void)out;
    al_attention_backward(dq, dk, dv, scratch, dout, q, k, v, cu_seqlens, nseq, NH, NKV, HD);
}

/* Up to this many sequences' cache pointers live on the stack; more go to the heap. */
#define KV_STACK 64

static void cpu_attention_kv(al_backend *b, int layer, void *out, const void *q,
                             const void *k_new, const void *v_new, al_kv *const *kvs, int nseq,
                             const int *cu_rows, int NH, int NKV, int HD)
{
    (void)b;
    float *kc_s[KV_STACK], *vc_s[KV_STACK];
    int past_s[KV_STACK];
    float **kc = kc_s, **vc = vc_s;
    int *past = past_s;
    void *heap = NULL;
    if (nseq > KV_STACK) {
        heap = malloc((sizeof(float *) * 2 + sizeof(int)) * (size_t)nseq);
        if (!heap) abort(); /* a few bytes per sequence; the caller checked far larger sizes */
        kc = heap, vc = kc + nseq, past = (int *)(vc + nseq);
    }
    for (int i = 0; i < nseq; i++) {
        const al_kv *kv = kvs[i];
        size_t off = (size_t)layer * (size_t)kv->max * (size_t)kv->kvw;
        kc[i] = (float *)kv->k + off, vc[i] = (float *)kv->v + off, past[i] = kv->len;
    }
    al_attention_kv_forward(out, q, k_new, v_new, kc, vc, past, nseq, cu_rows, NH, NKV, HD);
    free(heap);
}
static void cpu_swiglu_forward(al_backend *b, void *h, const void *gate, const void *up,
                               size_t N)
{
    (void)b;
    al_swiglu_forward(h, gate, up, N);
}
static void cpu_swiglu_backward(al_backend *b, void *dgate, void *dup, const void *dh,
                                const void *gate, const void *up, size_t N)
{
    (void)b;
    al_swiglu_backward(dgate, dup, dh, gate, up, N);
}
static void cpu_residual_forward(al_backend *b, void *out, const void *a, const void *x,
                                 size_t N)
{
    (void)b;
    al_residual_forward(out, a, x, N);
}
static void cpu_gather_rows(al_backend *b, void *out, const void *x, const int32_t *rows, int n,
                            int C)
{
    (void)b;
    for (int i = 0; i < n; i++)
        memcpy((float *)out + (size_t)i * C, (const float *)x + (size_t)rows[i] * C,
               sizeof(float) * (size_t)C);
}
static void cpu_lm_head_forward(al_backend *b, float *logits, const void *x, const void *w,
                                int T, int C, int V)
{
    (void)b;
    al_lm_head_forward(logits, x, w, T, C, V);
}
static void cpu_lm_head_backward(al_backend *b, void *dx, float *dw, const float *dlogits,
                                 const void *x, const void *w, int T, int C, int V)
{
    (void)b;
    al_lm_head_backward(dx, dw, dlogits, x, w, T, C, V);
}
static void cpu_logprob_forward(al_backend *b, const float *logits, const int32_t *targets,
                                int T, int V, float temperature, float *logp, float *entropy)
{
    (void)b;
    /* shapes, temperature and targets are checked by the caller */
    al_logprob_forward(logits, targets, T, V, temperature, logp, entropy, NULL, 0);
}
static void cpu_logprob_backward(al_backend *b, const float *logits, const int32_t *targets,
                                 int T, int V, float temperature, const float *dlogp,
                                 const float *dentropy, float *dlogits)
{
    (void)b;
    al_logprob_backward(logits, targets, T, V, temperature, dlogp, dentropy, dlogits);
}
static double cpu_sum_squares(al_backend *b, const float *g, size_t n)
{
    (void)b;
    /* the loop of al_grad_norm, whose square root is the norm the trainer reports */
    double ss = 0.0;
#pragma omp parallel for reduction(+ : ss) schedule(static) if (n > 65536)
    for (size_t i = 0; i < n; i++)
        ss += (double)g[i] * g[i];
    return ss;
}
static void cpu_scale(al_backend *b, float *g, size_t n, float coef)
{
    (void)b;
#pragma omp parallel for schedule(static) if (n > 65536)
    for (size_t i = 0; i < n; i++)
        g[i] *= coef;
}
static void cpu_adamw_update(al_backend *b, float *master, void *work, const float *grads,
                             float *m, float *v, size_t off, size_t count, const al_adamw_args *a)
{
    (void)b;
    al_adamw_range(master, grads, m, v, off, count, a);
    if (work && work != (void *)master)
        memcpy((float *)work + off, master + off, sizeof(float) * count);
}
static int cpu_kv_alloc(al_backend *b, al_kv *kv)
{
    (void)b;
    size_t n = (size_t)kv->L * (size_t)kv->max * (size_t)kv->kvw;
    kv->k = malloc(sizeof(float) * (n ? n : 1));
    kv->v = malloc(sizeof(float) * (n ? n : 1));
    if (!kv->k || !kv->v) {
        free(kv->k), free(kv->v);
        kv->k = kv->v = NULL;
        return -1;
    }
    return 0;
}
static void cpu_kv_free(al_backend *b, al_kv *kv)
{
    (void)b;
    free(kv->k), free(kv->v);
    kv->k = kv->v = NULL;
}
static void cpu_kv_copy_prefix(al_backend *b, al_kv *dst, const al_kv *src, int len)
{
    (void)b;
    size_t row = (size_t)src->kvw;
    for (int l = 0; l < src->L; l++) {
        memcpy((float *)dst->k + (size_t)l * dst->max * row,
               (const float *)src->k + (size_t)l * src->max * row, sizeof(float) * row * len);
        memcpy((float *)dst->v + (size_t)l * dst->max * row,
               (const float *)src->v + (size_t)l * src->max * row, sizeof(float) * row * len);
    }
}
static void cpu_sync(al_backend *b)
{
    (void)b;
}

static const al_backend_ops cpu_ops = {
    .name = "cpu",
    .act_bytes = sizeof(float),
    .host_memory = 1,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .upload = cpu_copy,
    .download = cpu_copy,
    .zero = cpu_zero,
    .upload_weights = cpu_upload_weights,
    .download_weights = cpu_download_weights,
    .weights_from_master = cpu_weights_from_master,
    .embedding_forward = cpu_embedding_forward,
    .embedding_backward = cpu_embedding_backward,
    .rmsnorm_forward = cpu_rmsnorm_forward,
    .rmsnorm_backward = cpu_rmsnorm_backward,
    .linear_forward = cpu_linear_forward,
    .linear_backward = cpu_linear_backward,
    .rope_forward = cpu_rope_forward,
    .rope_backward = cpu_rope_backward,
    .attention_scratch_bytes = cpu_attention_scratch_bytes,
    .attention_forward = cpu_attention_forward,
    .attention_backward = cpu_attention_backward,
    .attention_kv = cpu_attention_kv,
    .swiglu_forward = cpu_swiglu_forward,
    .swiglu_backward = cpu_swiglu_backward,
    .residual_forward = cpu_residual_forward,
    .gather_rows = cpu_gather_rows,
    .lm_head_forward = cpu_lm_head_forward,
    .lm_head_backward = cpu_lm_head_backward,
    .logprob_forward = cpu_logprob_forward,
    .logprob_backward = cpu_logprob_backward,
    .sum_squares = cpu_sum_squares,
    .scale = cpu_scale,
    .adamw_update = cpu_adamw_update,
    .kv_alloc = cpu_kv_alloc,
    .kv_free = cpu_kv_free,
    .kv_copy_prefix = cpu_kv_copy_prefix,
    .sync = cpu_sync,
    .destroy = NULL,
};

static al_backend cpu_backend = {&cpu_ops, NULL};

al_backend *al_backend_cpu(void)
{
    return &cpu_backend;
}
