/*
 * layers.h: every layer of the decoder as a *_forward / *_backward pair over explicit
 * pointers and sizes (llm.c style). Activations are row-major (T, width) with T the number
 * of tokens of a packed micro-batch. Weights are in Hugging Face's layout (a Linear weight
 * is (out, in)).
 *
 * Backward functions ACCUMULATE into every gradient they are given (dx, dw, db: +=), so
 * residual branches and tied weights add up without copies; the caller zeroes what must
 * start from zero. The exceptions say so (attention overwrites dq/dk/dv, rope works in
 * place). Pointers do not alias unless a function says it allows it.
 */
#ifndef ARCLIGHT_MODEL_LAYERS_H
#define ARCLIGHT_MODEL_LAYERS_H

#include <stddef.h>
#include <stdint.h>

/* out (T, C) = wte[tokens[t]]. Token ids must already be checked against V. */
void al_embedding_forward(float *out, const int32_t *tokens, const float *wte, int T, int C);
/* dwte[tokens[t]] += dout[t]. */
void al_embedding_backward(float *dwte, const float *dout, const int32_t *tokens, int T, int C);

/* RMSNorm over rows of C (as Hugging Face, in f32): out = w * x / sqrt(mean(x^2) + eps)
 * (out may be x itself);
 * rstd (N) keeps 1/sqrt(mean(x^2) + eps) for backward. Also serves Qwen3's per-head q/k
 * norms with N = T*heads and C = head_dim. */
void al_rmsnorm_forward(float *out, float *rstd, const float *x, const float *w, int N, int C,
                        float eps);
/* dx += d/dx, dw += d/dw. dx may not alias dout. */
void al_rmsnorm_backward(float *dx, float *dw, const float *dout, const float *x, const float *w,
                         const float *rstd, int N, int C);

/* out (T, OC) = x (T, IC) @ w^T (w: (OC, IC)) + b (OC; NULL: no bias). */
void al_linear_forward(float *out, const float *x, const float *w, const float *b, int T, int IC,
                       int OC);
/* dx (T, IC) += dout @ w (skipped when dx is NULL); dw (OC, IC) += dout^T @ x;
 * db (OC) += column sums of dout (skipped when NULL). */
void al_linear_backward(float *dx, float *dw, float *db, const float *dout, const float *x,
                        const float *w, int T, int IC, int OC);

/* Rotary tables (T, HD/2): cos/sin of positions[t] * theta^(-2i/HD), as Hugging Face's
 * default rotary embedding computes them (inverse frequencies in f32). */
void al_rope_tables(float *cos_t, float *sin_t, const int32_t *positions, int T, int HD,
                    double theta);
/* In place on x (T, H, HD), rotate_half convention: for i < HD/2,
 * x[i], x[i+HD/2] <- x[i] cos - x[i+HD/2] sin, x[i+HD/2] cos + x[i] sin. */
void al_rope_forward(float *x, const float *cos_t, const float *sin_t, int T, int H, int HD);
/* In place on the gradient dx (T, H, HD): the transpose rotation. */
void al_rope_backward(float *dx, const float *cos_t, const float *sin_t, int T, int H, int HD);

/* Floats of scratch the attention of a packed batch needs (forward and backward alike):
 * NH * (2 * AL_ATTENTION_BLOCK + 2 * HD) * (longest sequence). Linear in the length. */
#define AL_ATTENTION_BLOCK 64
size_t al_attention_scratch_size(const int32_t *cu_seqlens, int nseq, int NH, int HD);
/* Causal grouped-query attention inside each packed sequence, scale 1/sqrt(HD).
 * q (T, NH*HD), k and v (T, NKV*HD); query head h reads kv head h / (NH/NKV). out (T, NH*HD).
 * Heads run in parallel; each goes through blocks of AL_ATTENTION_BLOCK queries against the
 * keys up to the block's end (causal: later keys are never computed). Probabilities are not
 * kept: the backward recomputes them from q and k. */
void al_attention_forward(float *out, float *scratch, const float *q, const float *k,
                          const float *v, const int32_t *cu_seqlens, int nseq, int NH, int NKV,
                          int HD);
/* dq (T, NH*HD), dk and dv (T, NKV*HD) are OVERWRITTEN. */
void al_attention_backward(float *dq, float *dk, float *dv, float *scratch, const float *dout,
                           const float *q, const float *k, const float *v,
                           const int32_t *cu_seqlens, int nseq, int NH, int NKV, int HD);

/* Attention of rows against KV caches (serving). Sequence i owns rows cu_rows[i] ..
 * cu_rows[i+1] of q (rows, NH*HD) and of k_new, v_new (rows, NKV*HD); row j of it sits at
 * position past[i] + j. The new keys and values go into the sequence's cache first:
 * kc[i], vc[i] point at its layer's (max, NKV*HD) block. Each (row, head) then attends to
 * positions 0..its own in one pass with a running maximum (no score buffer), so a prompt
 * chunk and a decode step run the same loop. out (rows, NH*HD). */
void al_attention_kv_forward(float *out, const float *q, const float *k_new, const float *v_new,
                             float *const *kc, float *const *vc, const int *past, int nseq,
                             const int *cu_rows, int NH, int NKV, int HD);

/* h = silu(gate) * up over N elements. */
void al_swiglu_forward(float *h, const float *gate, const float *up, size_t N);
/* dgate, dup OVERWRITTEN from dh. */
void al_swiglu_backward(float *dgate, float *dup, const float *dh, const float *gate,
                        const float *up, size_t N);

/* out = a + b (out may alias a or b). */
void al_residual_forward(float *out, const float *a, const float *b, size_t N);
/* da += dout, db += dout (either may be NULL). */
void al_residual_backward(float *da, float *db, const float *dout, size_t N);

/* The LM head: logits (T, V) = x (T, C) @ w^T, w (V, C) being lm_head.weight or, tied, the
 * embedding. Backward: dx += dlogits @ w, dw += dlogits^T @ x. */
void al_lm_head_forward(float *logits, const float *x, const float *w, int T, int C, int V);
void al_lm_head_backward(float *dx, float *dw, const float *dlogits, const float *x, const float *w,
                         int T, int C, int V);

#endif
