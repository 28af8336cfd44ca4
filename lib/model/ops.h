/*
 * ops.h: every op of the model, declared once, and the backend table that runs them
 * (ggml style: a backend is a table of function pointers; the CPU backend runs every op and
 * is the reference the others are tested against, op by op).
 *
 * Memory. Each backend owns its memory (alloc/free/upload/download). Pointers handed to an
 * op are the backend's: host memory on the CPU, device memory on CUDA. Three element types
 * travel through the ops:
 *   - activations and the weights the forward reads: `act` elements of act_bytes each (f32
 *     on the CPU, bf16 on CUDA);
 *   - gradients, master weights, optimizer moments, norms' saved 1/rms, rotary tables,
 *     logits and per-token logprobs: always f32 (`float *`);
 *   - token ids, positions and sequence offsets: int32 (device copies, uploaded by the model).
 * The CPU backend's act is float, so on the CPU every `void *` below is a `float *`.
 *
 * Shapes follow layers.h (row-major (T, width) activations, Linear weights (out, in)).
 * Backward ops ACCUMULATE into gradients (+=) unless they say OVERWRITTEN, as in layers.h.
 * Ops are asynchronous on a device: results are visible to download (which synchronizes).
 */
#ifndef ARCLIGHT_MODEL_OPS_H
#define ARCLIGHT_MODEL_OPS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct al_backend al_backend;

/* One sequence's keys and values in a backend's KV cache: L layers, up to `max` positions
 * of kvw = NKV*HD keys and values each. len is the number of positions filled. The layout
 * behind k/v/impl is the backend's (the CPU: (L, max, kvw) f32 each; CUDA: pages of a
 * shared pool, impl holding the page table). */
typedef struct al_kv {
    al_backend *be;
    int L, max, len, kvw;
    void *k, *v;
    void *impl;
} al_kv;

/* Hyper-parameters of one AdamW update (see optim.h for the formula). */
typedef struct al_adamw_args {
    double lr;
    float beta1, beta2, eps, weight_decay;
    int64_t t; /* 1-based update count (bias correction) */
} al_adamw_args;

typedef struct al_backend_ops {
    const char *name; /* "cpu", "cuda" */
    size_t act_bytes; /* bytes per activation/weight element: 4 (f32) or 2 (bf16) */
    int host_memory;  /* 1: pointers are host memory (no copies needed) */

    /* ---- memory ---- */
    /* Zeroed memory, or NULL when out of memory. */
    void *(*alloc)(al_backend *b, size_t bytes);
    void (*free)(al_backend *b, void *p);
    void (*upload)(al_backend *b, void *dst, const void *src, size_t bytes);
    void (*download)(al_backend *b, void *dst, const void *src, size_t bytes); /* synchronizes */
    void (*zero)(al_backend *b, void *p, size_t bytes);
    /* Weights: n f32 values (host) into n act elements (backend), and back. */
    void (*upload_weights)(al_backend *b, void *dst, const float *src, size_t n);
    void (*download_weights)(al_backend *b, float *dst, const void *src, size_t n);
    /* act elements from f32 backend memory (a master copy): dst[i] = (act)src[i]. */
    void (*weights_from_master)(al_backend *b, void *dst, const float *src, size_t n);

    /* ---- layers ---- */
    void (*embedding_forward)(al_backend *b, void *out, const int32_t *tokens, const void *wte,
                              int T, int C);
    void (*embedding_backward)(al_backend *b, float *dwte, const void *dout,
                               const int32_t *tokens, int T, int C);
    void (*rmsnorm_forward)(al_backend *b, void *out, float *rstd, const void *x, const void *w,
                            int N, int C, float eps);
    /* dx (act) += d/dx, dw (f32) += d/dw. */
    void (*rmsnorm_backward)(al_backend *b, void *dx, float *dw, const void *dout,
                             const void *x, const void *w, const float *rstd, int N, int C);
    /* out (T, OC) = x (T, IC) @ w^T + b (NULL: none). */
    void (*linear_forward)(al_backend *b, void *out, const void *x, const void *w,
                           const void *bias, int T, int IC, int OC);
    /* dx (act, NULL: skipped) += dout @ w; dw (f32) += dout^T @ x; db (f32, NULL) += sums. */
    void (*linear_backward)(al_backend *b, void *dx, float *dw, float *db, const void *dout,
                            const void *x, const void *w, int T, int IC, int OC);
    /* In place on x (T, H, HD) with tables (T, HD/2); backward applies the transpose. */
    void (*rope_forward)(al_backend *b, void *x, const float *cos_t, const float *sin_t, int T,
                         int H, int HD);
    void (*rope_backward)(al_backend *b, void *dx, const float *cos_t, const float *sin_t, int T,
                          int H, int HD);
    /* Bytes of scratch attention_forward/backward need for this batch. */
    size_t (*attention_scratch_bytes)(al_backend *b, const int32_t *cu_seqlens_host, int nseq,
                                      int NH, int HD);
    /* Causal GQA inside each packed sequence (cu_seqlens: backend copy; _host: the same
     * offsets on the host, for backends that plan on the host). out (T, NH*HD). */
    void (*attention_forward)(al_backend *b, void *out, void *scratch, const void *q,
                              const void *k, const void *v, const int32_t *cu_seqlens,
                              const int32_t *cu_seqlens_host, int nseq, int NH, int NKV, int HD);
    /* dq, dk, dv (act) OVERWRITTEN; out is the forward's output (backends that need
     * rowsum(dout * out) read it). */
    void (*attention_backward)(al_backend *b, void *dq, void *dk, void *dv, void *scratch,
                               const void *dout, const void *out, const void *q, const void *k,
                               const void *v,
                               const int32_t *cu_seqlens, const int32_t *cu_seqlens_host,
                               int nseq, int NH, int NKV, int HD);
    /* Attention over KV caches (serving: prefill chunks and decode steps alike). Sequence i
     * owns rows cu_rows[i]..cu_rows[i+1] (host offsets) of q, k_new, v_new; its row j is
     * at position kvs[i]->len + j. The new keys and values of layer `layer` are stored into
     * each cache at their positions, then each row attends to positions 0..its own.
     * kvs[i]->len is not changed (the model does that after the last layer). */
    void (*attention_kv)(al_backend *b, int layer, void *out, const void *q, const void *k_new,
                         const void *v_new, al_kv *const *kvs, int nseq, const int *cu_rows,
                         int NH, int NKV, int HD);
    /* h = silu(gate) * up (h may alias gate); backward OVERWRITES dgate, dup. */
    void (*swiglu_forward)(al_backend *b, void *h, const void *gate, const void *up, size_t N);
    void (*swiglu_backward)(al_backend *b, void *dgate, void *dup, const void *dh,
                            const void *gate, const void *up, size_t N);
    /* out = a + b (out may alias either). */
    void (*residual_forward)(al_backend *b, void *out, const void *a, const void *x, size_t N);
    /* Rows rows[i] of x (T, C) into out (n, C) (the last row of each sequence). */
    void (*gather_rows)(al_backend *b, void *out, const void *x, const int32_t *rows, int n,
                        int C);
    /* logits (T, V) f32 = x (T, C) @ w^T; backward: dx (act) += dlogits @ w,
     * dw (f32) += dlogits^T @ x. dlogits is f32. */
    void (*lm_head_forward)(al_backend *b, float *logits, const void *x, const void *w, int T,
                            int C, int V);
    void (*lm_head_backward)(al_backend *b, void *dx, float *dw, const float *dlogits,
                             const void *x, const void *w, int T, int C, int V);

    /* ---- loss side (logprob.h's formulas) ---- */
    /* logp (T), entropy (T, NULL: skipped) of softmax(logits / temperature); targets < 0
     * give logp 0. Targets are checked by the caller. */
    void (*logprob_forward)(al_backend *b, const float *logits, const int32_t *targets, int T,
                            int V, float temperature, float *logp, float *entropy);
    /* dlogits (T, V) from dlogp / dentropy (either NULL); dlogits may be logits. */
    void (*logprob_backward)(al_backend *b, const float *logits, const int32_t *targets, int T,
                             int V, float temperature, const float *dlogp,
                             const float *dentropy, float *dlogits);

    /* ---- optimizer ---- */
    /* Sum of squares of g (n), in double. */
    double (*sum_squares)(al_backend *b, const float *g, size_t n);
    void (*scale)(al_backend *b, float *g, size_t n, float coef);
    /* AdamW on elements [off, off+count) of master (f32), with moments m and v (f32); when
     * `work` is not NULL the updated master is also written to it as act elements (the
     * weights the forward reads). */
    void (*adamw_update)(al_backend *b, float *master, void *work, const float *grads, float *m,
                         float *v, size_t off, size_t count, const al_adamw_args *a);

    /* ---- KV caches ---- */
    /* Allocates kv->k/v/impl for kv->L, kv->max, kv->kvw. 0, or -1 when out of memory. */
    int (*kv_alloc)(al_backend *b, al_kv *kv);
    void (*kv_free)(al_backend *b, al_kv *kv);
    /* dst's first len positions = src's (same shape). */
    void (*kv_copy_prefix)(al_backend *b, al_kv *dst, const al_kv *src, int len);

    /* Waits for queued work (a no-op on the CPU). */
    void (*sync)(al_backend *b);
    /* Frees the backend itself (NULL for static ones). */
    void (*destroy)(al_backend *b);
} al_backend_ops;

struct al_backend {
    const al_backend_ops *ops;
    void *ctx; /* the backend's own state */
};

/* The CPU backend: always there, one static instance, never freed. */
al_backend *al_backend_cpu(void);

/* A backend by name: "cpu", "cuda" (this build has CUDA and a device is present), or "auto"
 * (cuda when it can be had, else cpu). NULL with errstr saying why (unknown name, no CUDA in
 * this build, no device, out of memory). Free with al_backend_free (no-op for the CPU). */
al_backend *al_backend_open(const char *name, char *errstr, size_t errlen);
void al_backend_free(al_backend *b);

/* Whether this build carries the CUDA backend (the module libarclight_cuda.so, loaded on
 * first use from $ARCLIGHT_CUDA_BACKEND, beside the executable, or the build tree), and
 * whether a CUDA device can be opened now (0 when the module or a device is missing). */
int al_backend_cuda_built(void);
int al_backend_cuda_available(void);
/* A symbol of the CUDA module (NCCL data parallelism lives there too), or NULL. */
void *al_backend_cuda_symbol(const char *name);
/* Why the CUDA module of this build could not be loaded (a missing library, an unresolved
 * symbol), or NULL when it loaded or the build has none. A device being absent is not an
 * error here: al_backend_cuda_available says that. */
const char *al_backend_cuda_load_error(void);

#ifdef __cplusplus
}
#endif

#endif
