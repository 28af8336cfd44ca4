/*
 * internal.h: what the CUDA backend's files share: its context (device, stream, cuBLASLt
 * handle and workspace, temporary buffers, the KV page pool) and the launchers each file
 * provides to backend_cuda.cu's op table.
 *
 * Element types: activations and the forward's weights are bf16 (`act`); gradients, master
 * weights, moments, norms' 1/rms, rotary tables and logits are f32. Every op is queued on
 * the context's one stream; download synchronizes it.
 */
#ifndef ARCLIGHT_MODEL_CUDA_INTERNAL_H
#define ARCLIGHT_MODEL_CUDA_INTERNAL_H

#include "model/cuda/check.h"
#include "model/ops.h"

#include <cuda_bf16.h>
#include <stddef.h>
#include <stdint.h>

typedef __nv_bfloat16 act;

/* Tokens per KV page. */
#define AL_KV_PAGE 16

/* One sequence's pages: page i holds positions i*AL_KV_PAGE .. +AL_KV_PAGE-1 of every
 * layer, keys then values: (2, L, AL_KV_PAGE, kvw) act. */
typedef struct cuda_kv_pages {
    int npages;
    act **page; /* host array of device page pointers */
} cuda_kv_pages;

typedef struct gemm_entry gemm_entry;

typedef struct cuda_ctx {
    int device;
    cudaDeviceProp prop;
    cudaStream_t stream;
    cublasLtHandle_t lt;
    void *lt_ws;
    size_t lt_ws_bytes;
    gemm_entry *gemm_cache; /* fixed-size table, see gemm.cu */
    /* temporaries (grow, never shrink; one op uses them at a time) */
    void *tmp;
    size_t tmp_bytes;
    void *tmp2;
    size_t tmp2_bytes;
    double *dsum; /* (1) device accumulator of sum_squares */
    /* per-step tables of the attention kernels (device), grown as needed */
    int32_t *tiles;
    size_t tiles_cap;
    act **kv_ptrs; /* flattened page pointers of a decode step */
    size_t kv_ptrs_cap;
    int32_t *kv_meta; /* per sequence: first page index in kv_ptrs, past length, first row */
    size_t kv_meta_cap;
    /* KV page pool: pages are cut from chunks of cudaMalloc and recycled on a free list */
    size_t page_bytes; /* 0 until the first cache fixes the shape */
    act **free_pages;
    size_t nfree, free_cap;
    void **chunks;
    size_t nchunks, chunks_cap;
} cuda_ctx;

#ifdef __cplusplus
extern "C" {
#endif

/* Grows ctx->tmp / tmp2 to at least `bytes` and returns it. */
void *cuda_tmp(cuda_ctx *c, size_t bytes);
void *cuda_tmp2(cuda_ctx *c, size_t bytes);
/* Grows a device array (elements of `esize`) to n; returns it. */
void *cuda_grow(void **p, size_t *cap, size_t n, size_t esize);

/* gemm.cu: column-major D (m, n) = alpha op(A) op(B) + beta C(=D) through cuBLASLt, f32
 * compute. A and B have type ab (CUDA_R_16BF), D has type dt (CUDA_R_16BF or CUDA_R_32F);
 * bias (length m, type dt; NULL: none) is added by the epilogue. */
void cuda_gemm(cuda_ctx *c, int trans_a, int trans_b, int m, int n, int k, const void *A, int lda,
               const void *B, int ldb, void *D, int ldd, cudaDataType_t dt, float beta,
               const void *bias);
void cuda_gemm_free(cuda_ctx *c);

/* attention.cu */
size_t cuda_attention_scratch_bytes(const int32_t *cu_seqlens_host, int nseq, int NH, int HD);
void cuda_attention_forward(cuda_ctx *c, act *out, void *scratch, const act *q, const act *k,
                            const act *v, const int32_t *cu_seqlens, const int32_t *cu_host,
                            int nseq, int NH, int NKV, int HD);
void cuda_attention_backward(cuda_ctx *c, act *dq, act *dk, act *dv, void *scratch,
                             const act *dout, const act *out, const act *q, const act *k,
                             const act *v, const int32_t *cu_seqlens, const int32_t *cu_host,
                             int nseq, int NH, int NKV, int HD);
void cuda_attention_kv(cuda_ctx *c, int layer, act *out, const act *q, const act *k_new,
                       const act *v_new, al_kv *const *kvs, int nseq, const int *cu_rows, int NH,
                       int NKV, int HD);

#ifdef __cplusplus
}
#endif

#endif
