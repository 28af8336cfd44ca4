/*
 * backend_cuda.cu: the CUDA backend's op table (ops.h): memory, the element-wise and
 * row-wise kernels (embedding, RMSNorm, RoPE, SwiGLU, residual, logprob/entropy, AdamW,
 * norms), the matrix products (gemm.cu, cuBLASLt), attention (attention.cu) and the paged KV
 * cache. bf16 activations and forward weights, f32 gradients, masters and moments.
 *
 * The module is loaded with dlopen by lib/model/backend.c; its entry points are
 * al_backend_cuda_new and al_backend_cuda_device_count (extern "C").
 */
#include "model/cuda/internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The backend's context, with its device made current on the calling thread: the serve
 * engine, its policy follower and the trainer call ops from threads of their own, and a
 * thread's current device starts at 0. */
static __thread int tl_device = -1;
static inline cuda_ctx *ctx_of(al_backend *b)
{
    cuda_ctx *c = (cuda_ctx *)b->ctx;
    if (tl_device != c->device) {
        CUDA_CHECK(cudaSetDevice(c->device));
        tl_device = c->device;
    }
    return c;
}
#define CTX(b) ctx_of(b)
#define EW_THREADS 256

static unsigned ew_blocks(size_t n)
{
    size_t b = (n + EW_THREADS - 1) / EW_THREADS;
    return (unsigned)(b < 65535u * 16u ? (b ? b : 1) : 65535u * 16u);
}

void *cuda_grow(void **p, size_t *cap, size_t n, size_t esize)
{
    if (n <= *cap) return *p;
    if (*p) CUDA_CHECK(cudaFree(*p));
    size_t c = *cap ? *cap : 256;
    while (c < n)
        c *= 2;
    CUDA_CHECK(cudaMalloc(p, c * esize));
    *cap = c;
    return *p;
}

void *cuda_tmp(cuda_ctx *c, size_t bytes)
{
    return cuda_grow(&c->tmp, &c->tmp_bytes, bytes, 1);
}
void *cuda_tmp2(cuda_ctx *c, size_t bytes)
{
    return cuda_grow(&c->tmp2, &c->tmp2_bytes, bytes, 1);
}

/* ---- memory ---- */

static void *cu_alloc(al_backend *b, size_t bytes)
{
    void *p = NULL;
    if (cudaMalloc(&p, bytes ? bytes : 1) != cudaSuccess) {
        (void)cudaGetLastError(); /* out of memory is the caller's to report */
        return NULL;
    }
    CUDA_CHECK(cudaMemsetAsync(p, 0, bytes ? bytes : 1, CTX(b)->stream));
    return p;
}
static void cu_free(al_backend *b, void *p)
{
    if (!p) return;
    CUDA_CHECK(cudaStreamSynchronize(CTX(b)->stream)); /* no queued kernel still reads it */
    CUDA_CHECK(cudaFree(p));
}
static void cu_upload(al_backend *b, void *dst, const void *src, size_t bytes)
{
    if (!bytes) return;
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, CTX(b)->stream));
    /* pageable host memory: the caller may reuse src as soon as this returns */
    CUDA_CHECK(cudaStreamSynchronize(CTX(b)->stream));
}
static void cu_download(al_backend *b, void *dst, const void *src, size_t bytes)
{
    if (!bytes) return;
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, CTX(b)->stream));
    CUDA_CHECK(cudaStreamSynchronize(CTX(b)->stream));
}
static void cu_zero(al_backend *b, void *p, size_t bytes)
{
    if (bytes) CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, CTX(b)->stream));
}

__global__ void f32_to_act_kernel(act *dst, const float *src, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        dst[i] = __float2bfloat16(src[i]);
}
__global__ void act_to_f32_kernel(float *dst, const act *src, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        dst[i] = __bfloat162float(src[i]);
}

/* Host f32 weights through a device f32 staging buffer of at most 64 MiB at a time. */
#define STAGE_FLOATS ((size_t)16 << 20)
static void cu_upload_weights(al_backend *b, void *dst, const float *src, size_t n)
{
    cuda_ctx *c = CTX(b);
    for (size_t o = 0; o < n; o += STAGE_FLOATS) {
        size_t k = n - o < STAGE_FLOATS ? n - o : STAGE_FLOATS;
        float *st = (float *)cuda_tmp(c, sizeof(float) * k);
        cu_upload(b, st, src + o, sizeof(float) * k);
        f32_to_act_kernel<<<ew_blocks(k), EW_THREADS, 0, c->stream>>>((act *)dst + o, st, k);
        CUDA_LAUNCH_CHECK();
    }
}
static void cu_download_weights(al_backend *b, float *dst, const void *src, size_t n)
{
    cuda_ctx *c = CTX(b);
    for (size_t o = 0; o < n; o += STAGE_FLOATS) {
        size_t k = n - o < STAGE_FLOATS ? n - o : STAGE_FLOATS;
        float *st = (float *)cuda_tmp(c, sizeof(float) * k);
        act_to_f32_kernel<<<ew_blocks(k), EW_THREADS, 0, c->stream>>>(st, (const act *)src + o, k);
        CUDA_LAUNCH_CHECK();
        cu_download(b, dst + o, st, sizeof(float) * k);
    }
}
static void cu_weights_from_master(al_backend *b, void *dst, const float *src, size_t n)
{
    f32_to_act_kernel<<<ew_blocks(n), EW_THREADS, 0, CTX(b)->stream>>>((act *)dst, src, n);
    CUDA_LAUNCH_CHECK();
}

/* ---- embedding ---- */

__global__ void embedding_fwd_kernel(act *out, const int32_t *tokens, const act *wte, int C)
{
    int t = blockIdx.x;
    const act *row = wte + (size_t)tokens[t] * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x)
        out[(size_t)t * C + c] = row[c];
}
static void cu_embedding_forward(al_backend *b, void *out, const int32_t *tokens, const void *wte,
                                 int T, int C)
{
    if (T <= 0) return;
    embedding_fwd_kernel<<<(unsigned)T, 256, 0, CTX(b)->stream>>>((act *)out, tokens,
                                                                    (const act *)wte, C);
    CUDA_LAUNCH_CHECK();
}
__global__ void embedding_bwd_kernel(float *dwte, const act *dout, const int32_t *tokens, int C)
{
    int t = blockIdx.x;
    float *row = dwte + (size_t)tokens[t] * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x)
        atomicAdd(row + c, __bfloat162float(dout[(size_t)t * C + c]));
}
static void cu_embedding_backward(al_backend *b, float *dwte, const void *dout,
                                  const int32_t *tokens, int T, int C)
{
    if (T <= 0) return;
    embedding_bwd_kernel<<<(unsigned)T, 256, 0, CTX(b)->stream>>>(dwte, (const act *)dout, tokens, C);
    CUDA_LAUNCH_CHECK();
}

/* ---- RMSNorm: one warp per row ---- */

static __device__ __forceinline__ float warp_sum_f(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__global__ void rmsnorm_fwd_kernel(act *out, float *rstd, const act *x, const act *w, int N, int C,
                                   float eps)
{
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= N) return;
    const act *xr = x + (size_t)row * C;
    float ss = 0.0f;
    for (int c = lane; c < C; c += 32) {
        float v = __bfloat162float(xr[c]);
        ss += v * v;
    }
    ss = warp_sum_f(ss);
    float r = rsqrtf(ss / C + eps);
    if (lane == 0) rstd[row] = r;
    act *o = out + (size_t)row * C;
    for (int c = lane; c < C; c += 32)
        o[c] = __float2bfloat16(__bfloat162float(w[c]) * (__bfloat162float(xr[c]) * r));
}
static void cu_rmsnorm_forward(al_backend *b, void *out, float *rstd, const void *x, const void *w,
                               int N, int C, float eps)
{
    if (N <= 0) return;
    rmsnorm_fwd_kernel<<<(unsigned)((N + 7) / 8), 256, 0, CTX(b)->stream>>>(
        (act *)out, rstd, (const act *)x, (const act *)w, N, C, eps);
    CUDA_LAUNCH_CHECK();
}

/* dx += r (w dy - xhat mean(w dy xhat)); dw += sum over rows of dy xhat, first in shared
 * memory per block (RMS_ROWS rows), then once per column into dw. */
#define RMS_ROWS 64
__global__ void rmsnorm_bwd_kernel(act *dx, float *dw, const act *dout, const act *x, const act *w,
                                   const float *rstd, int N, int C)
{
    extern __shared__ float dws[]; /* (C) */
    for (int c = threadIdx.x; c < C; c += blockDim.x)
        dws[c] = 0.0f;
    __syncthreads();
    int warps = blockDim.x / 32, lane = threadIdx.x % 32;
    int r0 = blockIdx.x * RMS_ROWS;
    for (int row = r0 + threadIdx.x / 32; row < min(N, r0 + RMS_ROWS); row += warps) {
        const act *xr = x + (size_t)row * C, *gr = dout + (size_t)row * C;
        act *dxr = dx + (size_t)row * C;
        float r = rstd[row], dot = 0.0f;
        for (int c = lane; c < C; c += 32)
            dot += __bfloat162float(w[c]) * __bfloat162float(gr[c]) * (__bfloat162float(xr[c]) * r);
        float m = warp_sum_f(dot) / C;
        for (int c = lane; c < C; c += 32) {
            float xh = __bfloat162float(xr[c]) * r, g = __bfloat162float(gr[c]);
            float d = __bfloat162float(dxr[c]) + r * (__bfloat162float(w[c]) * g - xh * m);
            dxr[c] = __float2bfloat16(d);
            atomicAdd(&dws[c], g * xh);
        }
    }
    __syncthreads();
    for (int c = threadIdx.x; c < C; c += blockDim.x)
        atomicAdd(&dw[c], dws[c]);
}
static void cu_rmsnorm_backward(al_backend *b, void *dx, float *dw, const void *dout, const void *x,
                                const void *w, const float *rstd, int N, int C)
{
    if (N <= 0) return;
    rmsnorm_bwd_kernel<<<(unsigned)((N + RMS_ROWS - 1) / RMS_ROWS), 256, sizeof(float) * (size_t)C,
                         CTX(b)->stream>>>((act *)dx, dw, (const act *)dout, (const act *)x,
                                           (const act *)w, rstd, N, C);
    CUDA_LAUNCH_CHECK();
}

/* ---- linear layers and the LM head (column-major views of row-major arrays) ---- */

static void cu_linear_forward(al_backend *b, void *out, const void *x, const void *w,
                              const void *bias, int T, int IC, int OC)
{
    /* out^T (OC, T) = w (as IC x OC)^T . x^T (IC x T) */
    cuda_gemm(CTX(b), 1, 0, OC, T, IC, w, IC, x, IC, out, OC, CUDA_R_16BF, 0.0f, bias);
}

__global__ void bias_grad_kernel(float *db, const act *dout, int T, int OC)
{
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= OC) return;
    float s = 0.0f;
    for (int t = 0; t < T; t++)
        s += __bfloat162float(dout[(size_t)t * OC + j]);
    db[j] += s;
}

static void cu_linear_backward(al_backend *b, void *dx, float *dw, float *db, const void *dout,
                               const void *x, const void *w, int T, int IC, int OC)
{
    cuda_ctx *c = CTX(b);
    /* dx^T (IC, T) += w (IC x OC) . dout^T (OC x T) */
    if (dx) cuda_gemm(c, 0, 0, IC, T, OC, w, IC, dout, OC, dx, IC, CUDA_R_16BF, 1.0f, NULL);
    /* dw (as IC x OC) += x^T (IC x T) . dout (T x OC) */
    cuda_gemm(c, 0, 1, IC, OC, T, x, IC, dout, OC, dw, IC, CUDA_R_32F, 1.0f, NULL);
    if (db) {
        bias_grad_kernel<<<(unsigned)((OC + 255) / 256), 256, 0, c->stream>>>(db, (const act *)dout, T, OC);
        CUDA_LAUNCH_CHECK();
    }
}

static void cu_lm_head_forward(al_backend *b, float *logits, const void *x, const void *w, int T,
                               int C, int V)
{
    cuda_gemm(CTX(b), 1, 0, V, T, C, w, C, x, C, logits, V, CUDA_R_32F, 0.0f, NULL);
}
static void cu_lm_head_backward(al_backend *b, void *dx, float *dw, const float *dlogits,
                                const void *x, const void *w, int T, int C, int V)
{
    cuda_ctx *c = CTX(b);
    /* cuBLASLt takes both operands in one type: dlogits to bf16 first */
    size_t n = (size_t)T * V;
    act *dl = (act *)cuda_tmp2(c, sizeof(act) * n);
    f32_to_act_kernel<<<ew_blocks(n), EW_THREADS, 0, c->stream>>>(dl, dlogits, n);
    CUDA_LAUNCH_CHECK();
    cuda_gemm(c, 0, 0, C, T, V, w, C, dl, V, dx, C, CUDA_R_16BF, 1.0f, NULL);
    cuda_gemm(c, 0, 1, C, V, T, x, C, dl, V, dw, C, CUDA_R_32F, 1.0f, NULL);
}

/* ---- RoPE (rotate_half), SwiGLU, residual, gather ---- */

__global__ void rope_kernel(act *x, const float *cos_t, const float *sin_t, int T, int H, int HD,
                            float sign)
{
    int half = HD / 2;
    size_t n = (size_t)T * H * half;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x) {
        int i = (int)(e % half);
        size_t th = e / half;
        int t = (int)(th / H);
        act *v = x + th * HD;
        float c = cos_t[(size_t)t * half + i], s = sign * sin_t[(size_t)t * half + i];
        float a = __bfloat162float(v[i]), bb = __bfloat162float(v[i + half]);
        v[i] = __float2bfloat16(a * c - bb * s);
        v[i + half] = __float2bfloat16(bb * c + a * s);
    }
}
static void cu_rope_forward(al_backend *b, void *x, const float *cos_t, const float *sin_t, int T,
                            int H, int HD)
{
    size_t n = (size_t)T * H * (HD / 2);
    if (!n) return;
    rope_kernel<<<ew_blocks(n), EW_THREADS, 0, CTX(b)->stream>>>((act *)x, cos_t, sin_t, T, H, HD, 1.0f);
    CUDA_LAUNCH_CHECK();
}
static void cu_rope_backward(al_backend *b, void *dx, const float *cos_t, const float *sin_t, int T,
                             int H, int HD)
{
    size_t n = (size_t)T * H * (HD / 2);
    if (!n) return;
    rope_kernel<<<ew_blocks(n), EW_THREADS, 0, CTX(b)->stream>>>((act *)dx, cos_t, sin_t, T, H, HD, -1.0f);
    CUDA_LAUNCH_CHECK();
}

__global__ void swiglu_fwd_kernel(act *h, const act *gate, const act *up, size_t N)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < N; i += (size_t)gridDim.x * blockDim.x) {
        float g = __bfloat162float(gate[i]);
        h[i] = __float2bfloat16(g / (1.0f + __expf(-g)) * __bfloat162float(up[i]));
    }
}
static void cu_swiglu_forward(al_backend *b, void *h, const void *gate, const void *up, size_t N)
{
    if (!N) return;
    swiglu_fwd_kernel<<<ew_blocks(N), EW_THREADS, 0, CTX(b)->stream>>>((act *)h, (const act *)gate,
                                                                         (const act *)up, N);
    CUDA_LAUNCH_CHECK();
}
__global__ void swiglu_bwd_kernel(act *dgate, act *dup, const act *dh, const act *gate,
                                  const act *up, size_t N)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < N; i += (size_t)gridDim.x * blockDim.x) {
        float g = __bfloat162float(gate[i]), u = __bfloat162float(up[i]), d = __bfloat162float(dh[i]);
        float sg = 1.0f / (1.0f + __expf(-g));
        dup[i] = __float2bfloat16(d * g * sg);
        dgate[i] = __float2bfloat16(d * u * sg * (1.0f + g * (1.0f - sg)));
    }
}
static void cu_swiglu_backward(al_backend *b, void *dgate, void *dup, const void *dh,
                               const void *gate, const void *up, size_t N)
{
    if (!N) return;
    swiglu_bwd_kernel<<<ew_blocks(N), EW_THREADS, 0, CTX(b)->stream>>>(
        (act *)dgate, (act *)dup, (const act *)dh, (const act *)gate, (const act *)up, N);
    CUDA_LAUNCH_CHECK();
}
__global__ void residual_kernel(act *out, const act *a, const act *x, size_t N)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < N; i += (size_t)gridDim.x * blockDim.x)
        out[i] = __float2bfloat16(__bfloat162float(a[i]) + __bfloat162float(x[i]));
}
static void cu_residual_forward(al_backend *b, void *out, const void *a, const void *x, size_t N)
{
    if (!N) return;
    residual_kernel<<<ew_blocks(N), EW_THREADS, 0, CTX(b)->stream>>>((act *)out, (const act *)a,
                                                                       (const act *)x, N);
    CUDA_LAUNCH_CHECK();
}
__global__ void gather_kernel(act *out, const act *x, const int32_t *rows, int C)
{
    int i = blockIdx.x;
    for (int c = threadIdx.x; c < C; c += blockDim.x)
        out[(size_t)i * C + c] = x[(size_t)rows[i] * C + c];
}
static void cu_gather_rows(al_backend *b, void *out, const void *x, const int32_t *rows, int n, int C)
{
    if (n <= 0) return;
    gather_kernel<<<(unsigned)n, 256, 0, CTX(b)->stream>>>((act *)out, (const act *)x, rows, C);
    CUDA_LAUNCH_CHECK();
}

/* ---- attention (attention.cu) ---- */

static size_t cu_attention_scratch_bytes(al_backend *b, const int32_t *cu_host, int nseq, int NH,
                                         int HD)
{
    return cuda_attention_scratch_bytes(cu_host, nseq, NH, HD);
}
static void cu_attention_forward(al_backend *b, void *out, void *scratch, const void *q,
                                 const void *k, const void *v, const int32_t *cu_seqlens,
                                 const int32_t *cu_host, int nseq, int NH, int NKV, int HD)
{
    cuda_attention_forward(CTX(b), (act *)out, scratch, (const act *)q, (const act *)k,
                           (const act *)v, cu_seqlens, cu_host, nseq, NH, NKV, HD);
}
static void cu_attention_backward(al_backend *b, void *dq, void *dk, void *dv, void *scratch,
                                  const void *dout, const void *out, const void *q, const void *k,
                                  const void *v, const int32_t *cu_seqlens, const int32_t *cu_host,
                                  int nseq, int NH, int NKV, int HD)
{
    cuda_attention_backward(CTX(b), (act *)dq, (act *)dk, (act *)dv, scratch, (const act *)dout,
                            (const act *)out, (const act *)q, (const act *)k, (const act *)v,
                            cu_seqlens, cu_host, nseq, NH, NKV, HD);
}
static void cu_attention_kv(al_backend *b, int layer, void *out, const void *q, const void *k_new,
                            const void *v_new, al_kv *const *kvs, int nseq, const int *cu_rows,
                            int NH, int NKV, int HD)
{
    cuda_attention_kv(CTX(b), layer, (act *)out, (const act *)q, (const act *)k_new,
                      (const act *)v_new, kvs, nseq, cu_rows, NH, NKV, HD);
}

/* ---- logprob and entropy: one block per row, sums in double ---- */

#define LP_THREADS 256

struct row_stat {
    float mx;
    double sum, sum_ez; /* sum e^(z-mx), sum e^(z-mx) (z-mx) */
};

static __device__ row_stat row_stats(const float *row, int V, float inv_tau, double *sh)
{
    __shared__ float smx[LP_THREADS / 32];
    float mx = -INFINITY;
    for (int j = threadIdx.x; j < V; j += blockDim.x)
        mx = fmaxf(mx, row[j] * inv_tau);
    for (int o = 16; o > 0; o >>= 1)
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    if (threadIdx.x % 32 == 0) smx[threadIdx.x / 32] = mx;
    __syncthreads();
    mx = smx[0];
    for (int i = 1; i < (int)blockDim.x / 32; i++)
        mx = fmaxf(mx, smx[i]);
    double s = 0.0, sez = 0.0;
    for (int j = threadIdx.x; j < V; j += blockDim.x) {
        float zm = row[j] * inv_tau - mx, e = __expf(zm);
        s += e;
        if (e > 0.0f) sez += (double)(e * zm);
    }
    for (int o = 16; o > 0; o >>= 1) {
        s += __shfl_xor_sync(0xffffffffu, s, o);
        sez += __shfl_xor_sync(0xffffffffu, sez, o);
    }
    int nw = blockDim.x / 32;
    if (threadIdx.x % 32 == 0) sh[threadIdx.x / 32] = s, sh[nw + threadIdx.x / 32] = sez;
    __syncthreads();
    row_stat r;
    r.mx = mx, r.sum = 0.0, r.sum_ez = 0.0;
    for (int i = 0; i < nw; i++)
        r.sum += sh[i], r.sum_ez += sh[nw + i];
    __syncthreads();
    return r;
}

__global__ void logprob_fwd_kernel(const float *logits, const int32_t *targets, int V, float inv_tau,
                                   float *logp, float *entropy)
{
    __shared__ double sh[2 * LP_THREADS / 32];
    int t = blockIdx.x;
    const float *row = logits + (size_t)t * V;
    row_stat s = row_stats(row, V, inv_tau, sh);
    if (threadIdx.x != 0) return;
    double lse = s.mx + log(s.sum), pz = s.mx + s.sum_ez / s.sum;
    int32_t y = targets[t];
    logp[t] = y >= 0 ? (float)((double)(row[y] * inv_tau) - lse) : 0.0f;
    if (entropy) entropy[t] = (float)(lse - pz);
}
static void cu_logprob_forward(al_backend *b, const float *logits, const int32_t *targets, int T,
                               int V, float temperature, float *logp, float *entropy)
{
    if (T <= 0) return;
    logprob_fwd_kernel<<<(unsigned)T, LP_THREADS, 0, CTX(b)->stream>>>(logits, targets, V,
                                                                         1.0f / temperature, logp, entropy);
    CUDA_LAUNCH_CHECK();
}
/* dlogits may be logits: each thread reads row[j] before it writes drow[j]; the row's
 * statistics are complete (barriers inside row_stats) before any write. */
__global__ void logprob_bwd_kernel(const float *logits, const int32_t *targets, int V, float inv_tau,
                                   const float *dlogp, const float *dentropy, float *dlogits)
{
    __shared__ double sh[2 * LP_THREADS / 32];
    int t = blockIdx.x;
    const float *row = logits + (size_t)t * V;
    float *drow = dlogits + (size_t)t * V;
    int32_t y = targets[t];
    float gl = (dlogp && y >= 0) ? dlogp[t] : 0.0f, gh = dentropy ? dentropy[t] : 0.0f;
    if (gl == 0.0f && gh == 0.0f) {
        for (int j = threadIdx.x; j < V; j += blockDim.x)
            drow[j] = 0.0f;
        return;
    }
    row_stat s = row_stats(row, V, inv_tau, sh);
    double lse = s.mx + log(s.sum), pz = s.mx + s.sum_ez / s.sum;
    float mx = s.mx, log_sum = (float)(lse - s.mx), H = (float)(lse - pz);
    for (int j = threadIdx.x; j < V; j += blockDim.x) {
        float lpj = (row[j] * inv_tau - mx) - log_sum, pj = __expf(lpj);
        float dz = j == y ? gl * (1.0f - pj) : -gl * pj;
        if (pj > 0.0f) dz -= gh * pj * (lpj + H);
        drow[j] = dz * inv_tau;
    }
}
static void cu_logprob_backward(al_backend *b, const float *logits, const int32_t *targets, int T,
                                int V, float temperature, const float *dlogp, const float *dentropy,
                                float *dlogits)
{
    if (T <= 0) return;
    logprob_bwd_kernel<<<(unsigned)T, LP_THREADS, 0, CTX(b)->stream>>>(
        logits, targets, V, 1.0f / temperature, dlogp, dentropy, dlogits);
    CUDA_LAUNCH_CHECK();
}

/* ---- optimizer ---- */

__global__ void sum_squares_kernel(double *out, const float *g, size_t n)
{
    __shared__ double sh[EW_THREADS / 32];
    double s = 0.0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        s += (double)g[i] * g[i];
    for (int o = 16; o > 0; o >>= 1)
        s += __shfl_xor_sync(0xffffffffu, s, o);
    if (threadIdx.x % 32 == 0) sh[threadIdx.x / 32] = s;
    __syncthreads();
    if (threadIdx.x == 0) {
        double t = 0.0;
        for (int i = 0; i < EW_THREADS / 32; i++)
            t += sh[i];
        atomicAdd(out, t);
    }
}
static double cu_sum_squares(al_backend *b, const float *g, size_t n)
{
    cuda_ctx *c = CTX(b);
    CUDA_CHECK(cudaMemsetAsync(c->dsum, 0, sizeof(double), c->stream));
    unsigned blocks = ew_blocks(n) < 4096 ? ew_blocks(n) : 4096;
    sum_squares_kernel<<<blocks, EW_THREADS, 0, c->stream>>>(c->dsum, g, n);
    CUDA_LAUNCH_CHECK();
    double s = 0.0;
    cu_download(b, &s, c->dsum, sizeof s);
    return s;
}
__global__ void scale_kernel(float *g, size_t n, float coef)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        g[i] *= coef;
}
static void cu_scale(al_backend *b, float *g, size_t n, float coef)
{
    if (!n) return;
    scale_kernel<<<ew_blocks(n), EW_THREADS, 0, CTX(b)->stream>>>(g, n, coef);
    CUDA_LAUNCH_CHECK();
}
/* torch.optim.AdamW's arithmetic in f32; the bf16 copy of the weights written alongside. */
__global__ void adamw_kernel(float *p, act *work, const float *grads, float *m, float *v, size_t off,
                             size_t count, float b1, float b2, float eps, float step_size,
                             float bc2_sqrt, float decay)
{
    for (size_t k = blockIdx.x * (size_t)blockDim.x + threadIdx.x; k < count; k += (size_t)gridDim.x * blockDim.x) {
        size_t i = off + k;
        float g = grads[i], pi = p[i] * decay;
        float mi = m[i] * b1 + (1.0f - b1) * g;
        float vi = v[i] * b2 + (1.0f - b2) * g * g;
        m[i] = mi, v[i] = vi;
        float np = pi - step_size * (mi / (sqrtf(vi) / bc2_sqrt + eps));
        p[i] = np;
        if (work) work[i] = __float2bfloat16(np);
    }
}
static void cu_adamw_update(al_backend *b, float *master, void *work, const float *grads, float *m,
                            float *v, size_t off, size_t count, const al_adamw_args *a)
{
    if (!count) return;
    double bc1 = 1.0 - pow((double)a->beta1, (double)a->t);
    double bc2 = 1.0 - pow((double)a->beta2, (double)a->t);
    float step_size = (float)(a->lr / bc1), bc2_sqrt = (float)sqrt(bc2);
    float decay = (float)(1.0 - a->lr * (double)a->weight_decay);
    adamw_kernel<<<ew_blocks(count), EW_THREADS, 0, CTX(b)->stream>>>(
        master, (act *)work, grads, m, v, off, count, a->beta1, a->beta2, a->eps, step_size,
        bc2_sqrt, decay);
    CUDA_LAUNCH_CHECK();
}

/* ---- paged KV caches ---- */

/* Pages are cut from 64-page chunks and recycled; all caches of one backend share a shape
 * (a server serves one model). */
#define PAGES_PER_CHUNK 64

static act *page_take(cuda_ctx *c)
{
    if (c->nfree == 0) {
        void *chunk = NULL;
        if (cudaMalloc(&chunk, c->page_bytes * PAGES_PER_CHUNK) != cudaSuccess) {
            (void)cudaGetLastError();
            return NULL;
        }
        if (c->nchunks == c->chunks_cap) {
            size_t cap = c->chunks_cap ? 2 * c->chunks_cap : 16;
            void **p = (void **)realloc(c->chunks, sizeof(void *) * cap);
            if (!p) {
                CUDA_CHECK(cudaFree(chunk));
                return NULL;
            }
            c->chunks = p, c->chunks_cap = cap;
        }
        if (c->free_cap < PAGES_PER_CHUNK) {
            act **f = (act **)realloc(c->free_pages, sizeof(act *) * (c->free_cap + PAGES_PER_CHUNK));
            if (!f) {
                CUDA_CHECK(cudaFree(chunk));
                return NULL;
            }
            c->free_pages = f, c->free_cap += PAGES_PER_CHUNK;
        }
        c->chunks[c->nchunks++] = chunk;
        for (int i = PAGES_PER_CHUNK - 1; i >= 0; i--)
            c->free_pages[c->nfree++] = (act *)((char *)chunk + (size_t)i * c->page_bytes);
    }
    return c->free_pages[--c->nfree];
}
static int page_give(cuda_ctx *c, act *p)
{
    if (c->nfree == c->free_cap) {
        size_t cap = c->free_cap ? 2 * c->free_cap : 64;
        act **f = (act **)realloc(c->free_pages, sizeof(act *) * cap);
        if (!f) return -1;
        c->free_pages = f, c->free_cap = cap;
    }
    c->free_pages[c->nfree++] = p;
    return 0;
}

static void cu_kv_free(al_backend *b, al_kv *kv)
{
    cuda_ctx *c = CTX(b);
    cuda_kv_pages *pg = (cuda_kv_pages *)kv->impl;
    if (!pg) return;
    CUDA_CHECK(cudaStreamSynchronize(c->stream));
    for (int i = 0; i < pg->npages; i++)
        if (pg->page[i] && page_give(c, pg->page[i]) != 0) break; /* lost to the pool: tiny */
    free(pg->page);
    free(pg);
    kv->impl = NULL;
}
static int cu_kv_alloc(al_backend *b, al_kv *kv)
{
    cuda_ctx *c = CTX(b);
    size_t bytes = 2 * (size_t)kv->L * AL_KV_PAGE * (size_t)kv->kvw * sizeof(act);
    if (c->page_bytes == 0) c->page_bytes = bytes;
    if (c->page_bytes != bytes) return -1; /* another shape on the same backend */
    cuda_kv_pages *pg = (cuda_kv_pages *)calloc(1, sizeof *pg);
    if (!pg) return -1;
    int n = (kv->max + AL_KV_PAGE - 1) / AL_KV_PAGE;
    pg->page = (act **)calloc((size_t)n, sizeof(act *));
    kv->impl = pg;
    if (!pg->page) {
        free(pg);
        kv->impl = NULL;
        return -1;
    }
    for (int i = 0; i < n; i++, pg->npages++)
        if (!(pg->page[i] = page_take(c))) {
            cu_kv_free(b, kv);
            return -1;
        }
    kv->k = kv->v = NULL;
    return 0;
}
static void cu_kv_copy_prefix(al_backend *b, al_kv *dst, const al_kv *src, int len)
{
    cuda_ctx *c = CTX(b);
    const cuda_kv_pages *s = (const cuda_kv_pages *)src->impl;
    cuda_kv_pages *d = (cuda_kv_pages *)dst->impl;
    int n = (len + AL_KV_PAGE - 1) / AL_KV_PAGE;
    for (int i = 0; i < n && i < d->npages && i < s->npages; i++)
        CUDA_CHECK(cudaMemcpyAsync(d->page[i], s->page[i], c->page_bytes, cudaMemcpyDeviceToDevice,
                                   c->stream));
}

static void cu_sync(al_backend *b)
{
    CUDA_CHECK(cudaStreamSynchronize(CTX(b)->stream));
}

static void cu_destroy(al_backend *b);

static const al_backend_ops cuda_ops = {
    /* .name */ "cuda",
    /* .act_bytes */ sizeof(act),
    /* .host_memory */ 0,
    cu_alloc,
    cu_free,
    cu_upload,
    cu_download,
    cu_zero,
    cu_upload_weights,
    cu_download_weights,
    cu_weights_from_master,
    cu_embedding_forward,
    cu_embedding_backward,
    cu_rmsnorm_forward,
    cu_rmsnorm_backward,
    cu_linear_forward,
    cu_linear_backward,
    cu_rope_forward,
    cu_rope_backward,
    cu_attention_scratch_bytes,
    cu_attention_forward,
    cu_attention_backward,
    cu_attention_kv,
    cu_swiglu_forward,
    cu_swiglu_backward,
    cu_residual_forward,
    cu_gather_rows,
    cu_lm_head_forward,
    cu_lm_head_backward,
    cu_logprob_forward,
    cu_logprob_backward,
    cu_sum_squares,
    cu_scale,
    cu_adamw_update,
    cu_kv_alloc,
    cu_kv_free,
    cu_kv_copy_prefix,
    cu_sync,
    cu_destroy,
};

static void cu_destroy(al_backend *b)
{
    cuda_ctx *c = CTX(b);
    CUDA_CHECK(cudaStreamSynchronize(c->stream));
    cuda_gemm_free(c);
    for (size_t i = 0; i < c->nchunks; i++)
        CUDA_CHECK(cudaFree(c->chunks[i]));
    free(c->chunks);
    free(c->free_pages);
    void *bufs[] = {c->lt_ws, c->tmp, c->tmp2, c->dsum, c->tiles, c->kv_ptrs, c->kv_meta};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i]) CUDA_CHECK(cudaFree(bufs[i]));
    CUBLAS_CHECK(cublasLtDestroy(c->lt));
    CUDA_CHECK(cudaStreamDestroy(c->stream));
    free(c);
    free(b);
}

extern "C" int al_backend_cuda_device_count(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError(); /* no driver or no device: simply none */
        return 0;
    }
    return n;
}

/* The device is $ARCLIGHT_CUDA_DEVICE, else $LOCAL_RANK (one process per GPU), else 0. */
extern "C" al_backend *al_backend_cuda_new(char *errstr, size_t errlen)
{
    int n = al_backend_cuda_device_count();
    if (n <= 0) {
        snprintf(errstr, errlen, "device cuda: no CUDA device is visible");
        return NULL;
    }
    const char *ev = getenv("ARCLIGHT_CUDA_DEVICE");
    if (!ev || !*ev) ev = getenv("LOCAL_RANK");
    int dev = ev && *ev ? atoi(ev) : 0;
    if (dev < 0 || dev >= n) {
        snprintf(errstr, errlen, "device cuda: device %d asked for, %d visible", dev, n);
        return NULL;
    }
    al_backend *b = (al_backend *)calloc(1, sizeof *b);
    cuda_ctx *c = (cuda_ctx *)calloc(1, sizeof *c);
    if (!b || !c) {
        free(b), free(c);
        snprintf(errstr, errlen, "device cuda: out of memory");
        return NULL;
    }
    c->device = dev;
    CUDA_CHECK(cudaSetDevice(dev));
    tl_device = dev;
    CUDA_CHECK(cudaGetDeviceProperties(&c->prop, dev));
    CUDA_CHECK(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking));
    CUBLAS_CHECK(cublasLtCreate(&c->lt));
    c->lt_ws_bytes = (size_t)32 << 20;
    CUDA_CHECK(cudaMalloc(&c->lt_ws, c->lt_ws_bytes));
    CUDA_CHECK(cudaMalloc((void **)&c->dsum, sizeof(double)));
    b->ops = &cuda_ops;
    b->ctx = c;
    return b;
}

/* For the benchmark and the tests: the device's name, multiprocessor count and memory. */
extern "C" void al_backend_cuda_describe(al_backend *b, char *out, size_t len)
{
    cuda_ctx *c = CTX(b);
    snprintf(out, len, "%s (sm_%d%d, %d SMs, %.0f GiB)", c->prop.name, c->prop.major,
             c->prop.minor, c->prop.multiProcessorCount, c->prop.totalGlobalMem / 1073741824.0);
}
