/*
 * model.h: a decoder of the Qwen2 / Qwen3 / Llama family on the CPU, llm.c style.
 *
 * Parameters are one float allocation with every tensor pointing into it; gradients are a
 * second allocation with the same layout (grad[i] belongs to param[i]), so an optimizer
 * works on two flat arrays of al_model_num_params() floats and keeps its own state (one
 * allocation of the same length per moment). Per-layer tensors are stored stacked over
 * layers, (L, ...), as llm.c does; al_model_tensors() maps every Hugging Face tensor name
 * to its (offset, shape) in the flat arrays, which is what safetensors load/save, weight
 * decay masks and checkpoints use.
 *
 * A forward pass runs one packed micro-batch: `nseq` sequences concatenated into T tokens,
 * cu_seqlens[0..nseq] their boundaries (cu_seqlens[0] = 0, cu_seqlens[nseq] = T),
 * positions restarting at 0 in each sequence (any non-negative values are accepted: they
 * only feed RoPE). Attention is causal and never crosses a sequence boundary. Activations
 * are kept for al_model_backward, which must follow the forward it belongs to; buffers
 * grow to the largest T seen and stay.
 *
 * Not thread-safe: one model per thread. Inside, work is split over OpenMP threads
 * (OMP_NUM_THREADS); OpenBLAS is switched to one thread per call so the two pools never
 * compete for cores (see gemm.h).
 *
 * One forward (model.c) serves training (a packed micro-batch, activations kept), prefill
 * chunks and decode steps (rows of several sequences against their KV caches, infer.h and
 * al_model_kv below); every op in it goes through the model's backend table (ops.h): the
 * CPU backend unless al_model_set_backend moved the model to CUDA.
 */
#ifndef ARCLIGHT_MODEL_MODEL_H
#define ARCLIGHT_MODEL_MODEL_H

#include "model/config.h"
#include "model/ops.h"

#include <stddef.h>
#include <stdint.h>

/* The parameters, each a pointer into one allocation. Shapes in Hugging Face's layout:
 * a Linear weight is (out, in). C hidden, V vocab, I intermediate, L layers, NH heads,
 * NKV kv heads, HD head dim. Absent tensors (no bias, no qk norm, tied head) are NULL. */
typedef struct al_model_weights {
    float *embed;   /* (V, C)          model.embed_tokens.weight */
    float *ln1;     /* (L, C)          model.layers.N.input_layernorm.weight */
    float *wq;      /* (L, NH*HD, C)   ...self_attn.q_proj.weight */
    float *bq;      /* (L, NH*HD)      ...self_attn.q_proj.bias      (qkv_bias) */
    float *wk;      /* (L, NKV*HD, C)  ...self_attn.k_proj.weight */
    float *bk;      /* (L, NKV*HD)     ...self_attn.k_proj.bias      (qkv_bias) */
    float *wv;      /* (L, NKV*HD, C)  ...self_attn.v_proj.weight */
    float *bv;      /* (L, NKV*HD)     ...self_attn.v_proj.bias      (qkv_bias) */
    float *wo;      /* (L, C, NH*HD)   ...self_attn.o_proj.weight */
    float *bo;      /* (L, C)          ...self_attn.o_proj.bias      (o_bias) */
    float *q_norm;  /* (L, HD)         ...self_attn.q_norm.weight    (qk_norm) */
    float *k_norm;  /* (L, HD)         ...self_attn.k_norm.weight    (qk_norm) */
    float *ln2;     /* (L, C)          ...post_attention_layernorm.weight */
    float *w_gate;  /* (L, I, C)       ...mlp.gate_proj.weight */
    float *w_up;    /* (L, I, C)       ...mlp.up_proj.weight */
    float *w_down;  /* (L, C, I)       ...mlp.down_proj.weight */
    float *ln_f;    /* (C)             model.norm.weight */
    float *lm_head; /* (V, C)          lm_head.weight; == embed when tied */
} al_model_weights;

/* One Hugging Face tensor inside the flat parameter (and gradient) array. */
typedef struct al_model_tensor {
    char name[96]; /* e.g. "model.layers.3.self_attn.q_proj.weight" */
    size_t offset; /* in floats from al_model_params(m) */
    size_t numel;
    int ndim; /* 1 or 2 */
    int64_t shape[2];
} al_model_tensor;

typedef struct al_model al_model;

/* A model of shape `cfg` (copied) with zeroed parameters and gradients. NULL with errstr
 * on an invalid config or when out of memory. Free with al_model_free. */
al_model *al_model_new(const al_model_config *cfg, char *errstr, size_t errlen);
void al_model_free(al_model *m);

const al_model_config *al_model_config_of(const al_model *m);

/* Deterministic initialization from `seed` (the same on every machine and thread count):
 * Linear weights and embeddings N(0, 0.02) as Hugging Face's initializer_range, biases 0,
 * norm weights 1. */
void al_model_init_random(al_model *m, uint64_t seed);

/* The flat arrays (al_model_num_params() floats each), owned by the model, on the host.
 * On a device backend they are brought up to date from the device first, and the device's
 * copy counts as stale afterwards (the caller may write through the pointer): the next
 * forward uploads them again. */
size_t al_model_num_params(const al_model *m);
float *al_model_params(al_model *m);
float *al_model_grads(al_model *m);
/* The same, for reading only: the device's copy stays current (checkpoints, hashing). */
const float *al_model_params_read(al_model *m);
/* Tells the model its host parameters changed behind a pointer taken earlier. */
void al_model_params_changed(al_model *m);

/* The backend the model computes on (the CPU backend after al_model_new). Moving copies
 * the weights and gradients there (f32 masters; act-type copies for the forward) and frees
 * the activations of the old one. 0, or -1 with errstr (out of device memory: the model
 * stays on the CPU). The backend is borrowed and must outlive the model's use of it. */
int al_model_set_backend(al_model *m, al_backend *b, char *errstr, size_t errlen);
al_backend *al_model_backend(const al_model *m);
/* Typed views into them (pointers into the arrays above). */
const al_model_weights *al_model_param_tensors(const al_model *m);
const al_model_weights *al_model_grad_tensors(const al_model *m);

/* The tensor table, in Hugging Face's order (embed, layers 0..L-1, norm, lm_head if untied). */
size_t al_model_num_tensors(const al_model *m);
const al_model_tensor *al_model_tensors(const al_model *m);
/* By name, or NULL. */
const al_model_tensor *al_model_tensor_find(const al_model *m, const char *name);

/* Forward pass of a packed micro-batch (see the top of this file); writes logits (T, V),
 * row t being the prediction for the token after tokens[t]. Returns 0, or -1 with the
 * reason in al_model_error(m) (token id out of range, bad cu_seqlens, out of memory). */
int al_model_forward(al_model *m, const int32_t *tokens, const int32_t *positions,
                     const int32_t *cu_seqlens, int nseq, int T, float *logits);

/* Backward pass of the last forward: dlogits (T, V) is dLoss/dlogits. Gradients are
 * ACCUMULATED into al_model_grads (call al_model_zero_grad between steps), so several
 * micro-batches of one step add up. dlogits is only read. 0, or -1 when there was no
 * forward to go back through. */
int al_model_backward(al_model *m, const float *dlogits);

void al_model_zero_grad(al_model *m);

/* The trainer's path, which never hands (T, V) logits to the host: the forward of a packed
 * batch (as al_model_forward), then logp (T) = log softmax(logits / temperature)[targets]
 * and entropy (T, NULL: skipped) as logprob.h defines them (targets < 0: no target, logp 0).
 * A device backend works through the vocabulary in row chunks and keeps no more of the
 * logits than a chunk. 0, or -1 with al_model_error (bad batch or target, temperature <= 0,
 * out of memory). */
int al_model_forward_logprob(al_model *m, const int32_t *tokens, const int32_t *positions,
                             const int32_t *cu_seqlens, int nseq, int T, const int32_t *targets,
                             float temperature, float *logp, float *entropy);
/* Backward of the last al_model_forward_logprob from dlogp (T) and dentropy (T) (either NULL:
 * zeros); gradients accumulate as in al_model_backward. */
int al_model_backward_logprob(al_model *m, const float *dlogp, const float *dentropy);

/* The backend's own arrays (al_model_num_params() f32 each): the master weights and the
 * gradients, for collective operations (dist.h). After writing the masters, call
 * al_model_backend_params_changed (the forward's copies are made from them again). */
float *al_model_backend_params(al_model *m);
float *al_model_backend_grads(al_model *m);
void al_model_backend_params_changed(al_model *m);

/* Clips the gradients by global norm on the backend (al_grad_clip's rule, optim.h) and
 * returns the norm before clipping. */
double al_model_clip_grads(al_model *m, float max_norm);
/* One AdamW update of parameters [off, off+count) on the backend with moments moment1 and
 * moment2 (backend memory, al_model_num_params() floats each; the host ones on the CPU). */
void al_model_adamw_range(al_model *m, float *moment1, float *moment2, size_t off, size_t count,
                          const al_adamw_args *args);

/* The last error message ("" if none). */
const char *al_model_error(const al_model *m);

/* Bytes of activation memory currently held (grows with the largest T seen). */
size_t al_model_activation_bytes(const al_model *m);

/* ---- Inference with a KV cache (serving, sampling) ----
 * One al_model_kv holds the keys and values of one sequence, (L, max_tokens, NKV*HD) each,
 * and its own scratch, so decoding never touches the training activations (a forward/
 * backward pair in between is fine). Results equal al_model_forward on the whole sequence
 * (up to float rounding). */
typedef struct al_model_kv al_model_kv;

/* A cache for up to max_tokens tokens of one sequence (positions 0..max_tokens-1), on m's
 * backend. NULL with errstr when out of memory or max_tokens <= 0. Free with
 * al_model_kv_free. The cache is tied to m's shape, not its weights: after a weight update,
 * reset it. It runs the same forward as al_infer_forward (one sequence). */
al_model_kv *al_model_kv_new(const al_model *m, int max_tokens, char *errstr, size_t errlen);
void al_model_kv_free(al_model_kv *kv);
/* Forgets the sequence (length 0); keeps the memory. */
void al_model_kv_reset(al_model_kv *kv);
/* Tokens cached so far (the position of the next token). */
int al_model_kv_len(const al_model_kv *kv);
/* Drops cached tokens past `len` (e.g. to reuse a shared prompt prefix). len <= kv_len. */
void al_model_kv_truncate(al_model_kv *kv, int len);

/* Appends n tokens to the sequence (a prompt chunk, or one sampled token) and writes the
 * logits of each of them: logits (n, V), or only the last token's (V) when last_only.
 * Returns 0, or -1 with al_model_error(m) (cache full, token out of range). */
int al_model_kv_forward(al_model *m, al_model_kv *kv, const int32_t *tokens, int n, float *logits,
                        int last_only);

#endif
