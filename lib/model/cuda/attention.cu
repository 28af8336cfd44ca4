/*
 * attention.cu: causal grouped-query attention of the CUDA backend, FlashAttention-2 style:
 * scores are never materialised; each query row keeps a running maximum, sum and output
 * while key tiles stream through shared memory, and the backward recomputes probabilities
 * from q, k and each row's log-sum-exp. Variable-length packed sequences come as a list of
 * tiles (sequence start, length, first row) built on the host from cu_seqlens, so no T x T
 * mask exists anywhere.
 *
 * Work split: a block is AT_ROWS warps; in the forward and the dq pass warp w owns query
 * row q0 + w, in the dk/dv pass key row j0 + w. Within a 32-key (or 32-query) tile lane j
 * computes the full dot product of its key with the warp's query (rows padded by one float
 * in shared memory: no bank conflicts), then lanes own head dimensions d = lane + 32 r for
 * the weighted sums. Plain f32 FMAs on bf16 inputs: the reference-quality path. cuDNN's
 * fused SDPA (tensor cores) is the faster one the issue asks for; see docs/GPU.md.
 *
 * Serving: attention over paged KV caches (pages of AL_KV_PAGE positions; see internal.h),
 * one warp per (row, head), the same loop over the keys of the row's sequence.
 */
#include "model/cuda/internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define AT_ROWS 8   /* warps (rows) per block */
#define AT_TILE 32  /* keys (or queries) per shared-memory tile */
#define AT_MAXR 4   /* head dims per lane: HD <= 128 */
#define AT_MAXHD (32 * AT_MAXR)

static __device__ __forceinline__ float warp_max(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
static __device__ __forceinline__ float warp_sum(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* Tile list: for each sequence, rows t0 .. t0+ts-1 in steps of AT_ROWS: (t0, ts, r0). */
static int build_tiles(cuda_ctx *c, const int32_t *cu_host, int nseq)
{
    int n = 0;
    for (int s = 0; s < nseq; s++) {
        int ts = cu_host[s + 1] - cu_host[s];
        n += (ts + AT_ROWS - 1) / AT_ROWS;
    }
    if (n == 0) return 0;
    int32_t *h = (int32_t *)malloc(sizeof(int32_t) * 3 * (size_t)n);
    if (!h) al_cuda_fail("malloc", "out of memory for the attention tiles", 0, __FILE__, __LINE__);
    int k = 0;
    for (int s = 0; s < nseq; s++) {
        int t0 = cu_host[s], ts = cu_host[s + 1] - t0;
        for (int r0 = 0; r0 < ts; r0 += AT_ROWS)
            h[3 * k] = t0, h[3 * k + 1] = ts, h[3 * k + 2] = r0, k++;
    }
    cuda_grow((void **)&c->tiles, &c->tiles_cap, 3 * (size_t)n, sizeof(int32_t));
    CUDA_CHECK(cudaMemcpyAsync(c->tiles, h, sizeof(int32_t) * 3 * (size_t)n, cudaMemcpyHostToDevice,
                               c->stream));
    CUDA_CHECK(cudaStreamSynchronize(c->stream)); /* h is freed next */
    free(h);
    return n;
}

size_t cuda_attention_scratch_bytes(const int32_t *cu_seqlens_host, int nseq, int NH, int HD)
{
    /* the backward's per-(row, head) log-sum-exp and rowsum(dout * out) */
    return 2 * sizeof(float) * (size_t)cu_seqlens_host[nseq] * (size_t)NH;
}

/* Loads rows [base, base + AT_TILE) of x (width ld, head offset off, HD dims) into
 * sh (AT_TILE, HD + 1) as f32; rows at or past `end` become 0. */
static __device__ void load_tile(float *sh, const act *x, int base, int end, int ld, int off,
                                 int HD)
{
    for (int e = threadIdx.x; e < AT_TILE * HD; e += blockDim.x) {
        int r = e / HD, d = e % HD, row = base + r;
        sh[r * (HD + 1) + d] = row < end ? __bfloat162float(x[(size_t)row * ld + off + d]) : 0.0f;
    }
}

/* out (T, NH*HD) for the rows of each tile; lse (T, NH) when not NULL. */
__global__ void attn_fwd_kernel(act *out, float *lse, const act *q, const act *k, const act *v,
                                const int32_t *tiles, int NH, int NKV, int HD, float scale)
{
    extern __shared__ float sm[];
    float *qs = sm;                        /* (AT_ROWS, HD) */
    float *ks = qs + AT_ROWS * HD;         /* (AT_TILE, HD + 1) */
    float *vs = ks + AT_TILE * (HD + 1);   /* (AT_TILE, HD + 1) */
    int t0 = tiles[3 * blockIdx.x], ts = tiles[3 * blockIdx.x + 1], r0 = tiles[3 * blockIdx.x + 2];
    int h = blockIdx.y, g = h / (NH / NKV), qw = NH * HD, kw = NKV * HD;
    int w = threadIdx.x / 32, lane = threadIdx.x % 32;
    int row = r0 + w; /* within the sequence */
    int live = row < ts;
    for (int d = lane; d < HD; d += 32)
        qs[w * HD + d] = live ? __bfloat162float(q[(size_t)(t0 + row) * qw + h * HD + d]) : 0.0f;
    float mx = -INFINITY, l = 0.0f, acc[AT_MAXR];
    for (int r = 0; r < AT_MAXR; r++)
        acc[r] = 0.0f;
    int last = min(ts, r0 + AT_ROWS) - 1; /* the block's last row: keys 0..last */
    for (int j0 = 0; j0 <= last; j0 += AT_TILE) {
        __syncthreads();
        load_tile(ks, k, t0 + j0, t0 + ts, kw, g * HD, HD);
        load_tile(vs, v, t0 + j0, t0 + ts, kw, g * HD, HD);
        __syncthreads();
        if (!live) continue;
        int j = j0 + lane;
        float s = -INFINITY;
        if (j <= row) {
            float dot = 0.0f;
            for (int d = 0; d < HD; d++)
                dot += qs[w * HD + d] * ks[lane * (HD + 1) + d];
            s = dot * scale;
        }
        float mnew = fmaxf(mx, warp_max(s));
        float p = j <= row ? __expf(s - mnew) : 0.0f;
        float corr = __expf(mx - mnew); /* 0 on the first tile (mx = -inf) */
        l = l * corr + warp_sum(p);
        for (int r = 0; r < AT_MAXR; r++)
            acc[r] *= corr;
        int nj = min(AT_TILE, row - j0 + 1);
        for (int jj = 0; jj < nj; jj++) {
            float pj = __shfl_sync(0xffffffffu, p, jj);
            for (int r = 0; r < AT_MAXR; r++) {
                int d = lane + 32 * r;
                if (d < HD) acc[r] += pj * vs[jj * (HD + 1) + d];
            }
        }
        mx = mnew;
    }
    if (!live) return;
    float inv = 1.0f / l;
    for (int r = 0; r < AT_MAXR; r++) {
        int d = lane + 32 * r;
        if (d < HD) out[(size_t)(t0 + row) * qw + h * HD + d] = __float2bfloat16(acc[r] * inv);
    }
    if (lse && lane == 0) lse[(size_t)(t0 + row) * NH + h] = mx + logf(l);
}

static size_t fwd_smem(int HD)
{
    return sizeof(float) * ((size_t)AT_ROWS * HD + 2 * (size_t)AT_TILE * (HD + 1));
}

void cuda_attention_forward(cuda_ctx *c, act *out, void *scratch, const act *q, const act *k,
                            const act *v, const int32_t *cu_seqlens, const int32_t *cu_host,
                            int nseq, int NH, int NKV, int HD)
{
    (void)scratch, (void)cu_seqlens;
    if (HD > AT_MAXHD) al_cuda_fail("attention", "head_dim above 128 is not supported", HD, __FILE__, __LINE__);
    int n = build_tiles(c, cu_host, nseq);
    if (!n) return;
    dim3 grid((unsigned)n, (unsigned)NH);
    attn_fwd_kernel<<<grid, AT_ROWS * 32, fwd_smem(HD), c->stream>>>(
        out, NULL, q, k, v, c->tiles, NH, NKV, HD, 1.0f / sqrtf((float)HD));
    CUDA_LAUNCH_CHECK();
}

/* Per (row, head): lse and dsum = rowsum(dout * out). Recomputes the forward's statistics. */
__global__ void attn_bwd_stats_kernel(float *lse, float *dsum, const act *q, const act *k,
                                      const act *dout, const act *out, const int32_t *tiles,
                                      int NH, int NKV, int HD, float scale)
{
    extern __shared__ float sm[];
    float *qs = sm;
    float *ks = qs + AT_ROWS * HD;
    int t0 = tiles[3 * blockIdx.x], ts = tiles[3 * blockIdx.x + 1], r0 = tiles[3 * blockIdx.x + 2];
    int h = blockIdx.y, g = h / (NH / NKV), qw = NH * HD, kw = NKV * HD;
    int w = threadIdx.x / 32, lane = threadIdx.x % 32, row = r0 + w, live = row < ts;
    float dd = 0.0f;
    for (int d = lane; d < HD; d += 32) {
        size_t at = (size_t)(t0 + row) * qw + h * HD + d;
        qs[w * HD + d] = live ? __bfloat162float(q[at]) : 0.0f;
        if (live) dd += __bfloat162float(dout[at]) * __bfloat162float(out[at]);
    }
    dd = warp_sum(dd);
    float mx = -INFINITY, l = 0.0f;
    int last = min(ts, r0 + AT_ROWS) - 1;
    for (int j0 = 0; j0 <= last; j0 += AT_TILE) {
        __syncthreads();
        load_tile(ks, k, t0 + j0, t0 + ts, kw, g * HD, HD);
        __syncthreads();
        if (!live) continue;
        int j = j0 + lane;
        float s = -INFINITY;
        if (j <= row) {
            float dot = 0.0f;
            for (int d = 0; d < HD; d++)
                dot += qs[w * HD + d] * ks[lane * (HD + 1) + d];
            s = dot * scale;
        }
        float mnew = fmaxf(mx, warp_max(s));
        float p = j <= row ? __expf(s - mnew) : 0.0f;
        l = l * __expf(mx - mnew) + warp_sum(p);
        mx = mnew;
    }
    if (live && lane == 0) {
        lse[(size_t)(t0 + row) * NH + h] = mx + logf(l);
        dsum[(size_t)(t0 + row) * NH + h] = dd;
    }
}

/* dq of each row: sum over keys j <= row of ds_j k_j scale, ds = p (dO.v_j - dsum). */
__global__ void attn_bwd_dq_kernel(act *dq, const float *lse, const float *dsum, const act *q,
                                   const act *k, const act *v, const act *dout,
                                   const int32_t *tiles, int NH, int NKV, int HD, float scale)
{
    extern __shared__ float sm[];
    float *qs = sm;                      /* (AT_ROWS, HD) */
    float *os = qs + AT_ROWS * HD;       /* (AT_ROWS, HD) dout rows */
    float *ks = os + AT_ROWS * HD;       /* (AT_TILE, HD + 1) */
    float *vs = ks + AT_TILE * (HD + 1); /* (AT_TILE, HD + 1) */
    int t0 = tiles[3 * blockIdx.x], ts = tiles[3 * blockIdx.x + 1], r0 = tiles[3 * blockIdx.x + 2];
    int h = blockIdx.y, g = h / (NH / NKV), qw = NH * HD, kw = NKV * HD;
    int w = threadIdx.x / 32, lane = threadIdx.x % 32, row = r0 + w, live = row < ts;
    for (int d = lane; d < HD; d += 32) {
        size_t at = (size_t)(t0 + row) * qw + h * HD + d;
        qs[w * HD + d] = live ? __bfloat162float(q[at]) : 0.0f;
        os[w * HD + d] = live ? __bfloat162float(dout[at]) : 0.0f;
    }
    float L = live ? lse[(size_t)(t0 + row) * NH + h] : 0.0f;
    float D = live ? dsum[(size_t)(t0 + row) * NH + h] : 0.0f;
    float acc[AT_MAXR];
    for (int r = 0; r < AT_MAXR; r++)
        acc[r] = 0.0f;
    int last = min(ts, r0 + AT_ROWS) - 1;
    for (int j0 = 0; j0 <= last; j0 += AT_TILE) {
        __syncthreads();
        load_tile(ks, k, t0 + j0, t0 + ts, kw, g * HD, HD);
        load_tile(vs, v, t0 + j0, t0 + ts, kw, g * HD, HD);
        __syncthreads();
        if (!live) continue;
        int j = j0 + lane;
        float ds = 0.0f;
        if (j <= row) {
            float s = 0.0f, dp = 0.0f;
            for (int d = 0; d < HD; d++) {
                s += qs[w * HD + d] * ks[lane * (HD + 1) + d];
                dp += os[w * HD + d] * vs[lane * (HD + 1) + d];
            }
            float p = __expf(s * scale - L);
            ds = p * (dp - D) * scale;
        }
        int nj = min(AT_TILE, row - j0 + 1);
        for (int jj = 0; jj < nj; jj++) {
            float dj = __shfl_sync(0xffffffffu, ds, jj);
            for (int r = 0; r < AT_MAXR; r++) {
                int d = lane + 32 * r;
                if (d < HD) acc[r] += dj * ks[jj * (HD + 1) + d];
            }
        }
    }
    if (!live) return;
    for (int r = 0; r < AT_MAXR; r++) {
        int d = lane + 32 * r;
        if (d < HD) dq[(size_t)(t0 + row) * qw + h * HD + d] = __float2bfloat16(acc[r]);
    }
}

/* dk, dv of each key row j of kv head g: sums over the heads of the group and the query
 * rows i >= j of its sequence. */
__global__ void attn_bwd_dkv_kernel(act *dk, act *dv, const float *lse, const float *dsum,
                                    const act *q, const act *k, const act *v, const act *dout,
                                    const int32_t *tiles, int NH, int NKV, int HD, float scale)
{
    extern __shared__ float sm[];
    float *kself = sm;                    /* (AT_ROWS, HD) this warp's key */
    float *vself = kself + AT_ROWS * HD;  /* (AT_ROWS, HD) */
    float *qs = vself + AT_ROWS * HD;     /* (AT_TILE, HD + 1) query rows */
    float *os = qs + AT_TILE * (HD + 1);  /* (AT_TILE, HD + 1) their dout */
    float *ls = os + AT_TILE * (HD + 1);  /* (AT_TILE) lse */
    float *dsm = ls + AT_TILE;            /* (AT_TILE) dsum */
    int t0 = tiles[3 * blockIdx.x], ts = tiles[3 * blockIdx.x + 1], j0 = tiles[3 * blockIdx.x + 2];
    int g = blockIdx.y, rep = NH / NKV, qw = NH * HD, kw = NKV * HD;
    int w = threadIdx.x / 32, lane = threadIdx.x % 32, key = j0 + w, live = key < ts;
    for (int d = lane; d < HD; d += 32) {
        size_t at = (size_t)(t0 + key) * kw + g * HD + d;
        kself[w * HD + d] = live ? __bfloat162float(k[at]) : 0.0f;
        vself[w * HD + d] = live ? __bfloat162float(v[at]) : 0.0f;
    }
    float ak[AT_MAXR], av[AT_MAXR];
    for (int r = 0; r < AT_MAXR; r++)
        ak[r] = av[r] = 0.0f;
    for (int h = g * rep; h < (g + 1) * rep; h++) {
        for (int i0 = j0 - j0 % AT_TILE; i0 < ts; i0 += AT_TILE) {
            __syncthreads();
            load_tile(qs, q, t0 + i0, t0 + ts, qw, h * HD, HD);
            load_tile(os, dout, t0 + i0, t0 + ts, qw, h * HD, HD);
            for (int e = threadIdx.x; e < AT_TILE; e += blockDim.x) {
                int row = i0 + e;
                ls[e] = row < ts ? lse[(size_t)(t0 + row) * NH + h] : 0.0f;
                dsm[e] = row < ts ? dsum[(size_t)(t0 + row) * NH + h] : 0.0f;
            }
            __syncthreads();
            if (!live) continue;
            int i = i0 + lane;
            float p = 0.0f, ds = 0.0f;
            if (i < ts && i >= key) {
                float s = 0.0f, dp = 0.0f;
                for (int d = 0; d < HD; d++) {
                    s += qs[lane * (HD + 1) + d] * kself[w * HD + d];
                    dp += os[lane * (HD + 1) + d] * vself[w * HD + d];
                }
                p = __expf(s * scale - ls[lane]);
                ds = p * (dp - dsm[lane]) * scale;
            }
            for (int ii = 0; ii < AT_TILE; ii++) {
                float pi = __shfl_sync(0xffffffffu, p, ii), di = __shfl_sync(0xffffffffu, ds, ii);
                if (pi == 0.0f && di == 0.0f) continue;
                for (int r = 0; r < AT_MAXR; r++) {
                    int d = lane + 32 * r;
                    if (d < HD) {
                        av[r] += pi * os[ii * (HD + 1) + d];
                        ak[r] += di * qs[ii * (HD + 1) + d];
                    }
                }
            }
        }
    }
    if (!live) return;
    for (int r = 0; r < AT_MAXR; r++) {
        int d = lane + 32 * r;
        if (d < HD) {
            size_t at = (size_t)(t0 + key) * kw + g * HD + d;
            dk[at] = __float2bfloat16(ak[r]);
            dv[at] = __float2bfloat16(av[r]);
        }
    }
}

void cuda_attention_backward(cuda_ctx *c, act *dq, act *dk, act *dv, void *scratch,
                             const act *dout, const act *out, const act *q, const act *k,
                             const act *v, const int32_t *cu_seqlens, const int32_t *cu_host,
                             int nseq, int NH, int NKV, int HD)
{
    (void)cu_seqlens;
    if (HD > AT_MAXHD) al_cuda_fail("attention", "head_dim above 128 is not supported", HD, __FILE__, __LINE__);
    int n = build_tiles(c, cu_host, nseq);
    if (!n) return;
    int T = cu_host[nseq];
    float *lse = (float *)scratch, *dsum = lse + (size_t)T * NH;
    float scale = 1.0f / sqrtf((float)HD);
    size_t sm_stats = sizeof(float) * ((size_t)AT_ROWS * HD + (size_t)AT_TILE * (HD + 1));
    attn_bwd_stats_kernel<<<dim3((unsigned)n, (unsigned)NH), AT_ROWS * 32, sm_stats, c->stream>>>(
        lse, dsum, q, k, dout, out, c->tiles, NH, NKV, HD, scale);
    CUDA_LAUNCH_CHECK();
    size_t sm_dq = sizeof(float) * (2 * (size_t)AT_ROWS * HD + 2 * (size_t)AT_TILE * (HD + 1));
    attn_bwd_dq_kernel<<<dim3((unsigned)n, (unsigned)NH), AT_ROWS * 32, sm_dq, c->stream>>>(
        dq, lse, dsum, q, k, v, dout, c->tiles, NH, NKV, HD, scale);
    CUDA_LAUNCH_CHECK();
    size_t sm_kv = sizeof(float) * (2 * (size_t)AT_ROWS * HD + 2 * (size_t)AT_TILE * (HD + 1) +
                                    2 * (size_t)AT_TILE);
    attn_bwd_dkv_kernel<<<dim3((unsigned)n, (unsigned)NKV), AT_ROWS * 32, sm_kv, c->stream>>>(
        dk, dv, lse, dsum, q, k, v, dout, c->tiles, NH, NKV, HD, scale);
    CUDA_LAUNCH_CHECK();
}

/* ---- serving: paged KV caches ---- */

/* meta per row r: [0] index of its sequence's first page in ptrs, [1] its position. */
__global__ void kv_store_kernel(act *const *ptrs, const int32_t *meta, const act *k_new,
                                const act *v_new, int T, int layer, int L, int kvw)
{
    int r = blockIdx.x;
    if (r >= T) return;
    int first = meta[2 * r], pos = meta[2 * r + 1];
    act *page = ptrs[first + pos / AL_KV_PAGE];
    size_t slot = (size_t)(layer * AL_KV_PAGE + pos % AL_KV_PAGE) * kvw;
    size_t vbase = (size_t)L * AL_KV_PAGE * kvw;
    for (int d = threadIdx.x; d < kvw; d += blockDim.x) {
        page[slot + d] = k_new[(size_t)r * kvw + d];
        page[vbase + slot + d] = v_new[(size_t)r * kvw + d];
    }
}

/* One warp per (row, head): attends to positions 0..pos of the row's sequence. */
__global__ void attn_kv_kernel(act *out, const act *q, act *const *ptrs, const int32_t *meta, int T,
                               int layer, int L, int NH, int NKV, int HD, float scale)
{
    extern __shared__ float sm[];
    int w = threadIdx.x / 32, lane = threadIdx.x % 32;
    int r = blockIdx.x, h = blockIdx.y * AT_ROWS + w;
    float *qs = sm + w * HD;
    if (r >= T || h >= NH) return; /* whole warps leave: no block-wide barrier follows */
    int g = h / (NH / NKV), kvw = NKV * HD, qw = NH * HD;
    int first = meta[2 * r], pos = meta[2 * r + 1];
    for (int d = lane; d < HD; d += 32)
        qs[d] = __bfloat162float(q[(size_t)r * qw + h * HD + d]);
    __syncwarp();
    size_t vbase = (size_t)L * AL_KV_PAGE * kvw;
    float mx = -INFINITY, l = 0.0f, acc[AT_MAXR];
    for (int i = 0; i < AT_MAXR; i++)
        acc[i] = 0.0f;
    for (int j0 = 0; j0 <= pos; j0 += 32) {
        int j = j0 + lane;
        float s = -INFINITY;
        const act *krow = NULL;
        if (j <= pos) {
            const act *page = ptrs[first + j / AL_KV_PAGE];
            krow = page + (size_t)(layer * AL_KV_PAGE + j % AL_KV_PAGE) * kvw + g * HD;
            float dot = 0.0f;
            for (int d = 0; d < HD; d++)
                dot += qs[d] * __bfloat162float(krow[d]);
            s = dot * scale;
        }
        float mnew = fmaxf(mx, warp_max(s));
        float p = j <= pos ? __expf(s - mnew) : 0.0f;
        float corr = __expf(mx - mnew);
        l = l * corr + warp_sum(p);
        for (int i = 0; i < AT_MAXR; i++)
            acc[i] *= corr;
        int nj = min(32, pos - j0 + 1);
        for (int jj = 0; jj < nj; jj++) {
            float pj = __shfl_sync(0xffffffffu, p, jj);
            int jp = j0 + jj;
            const act *vrow = ptrs[first + jp / AL_KV_PAGE] + vbase +
                              (size_t)(layer * AL_KV_PAGE + jp % AL_KV_PAGE) * kvw + g * HD;
            for (int i = 0; i < AT_MAXR; i++) {
                int d = lane + 32 * i;
                if (d < HD) acc[i] += pj * __bfloat162float(vrow[d]);
            }
        }
        mx = mnew;
    }
    float inv = 1.0f / l;
    for (int i = 0; i < AT_MAXR; i++) {
        int d = lane + 32 * i;
        if (d < HD) out[(size_t)r * qw + h * HD + d] = __float2bfloat16(acc[i] * inv);
    }
}

void cuda_attention_kv(cuda_ctx *c, int layer, act *out, const act *q, const act *k_new,
                       const act *v_new, al_kv *const *kvs, int nseq, const int *cu_rows, int NH,
                       int NKV, int HD)
{
    if (HD > AT_MAXHD) al_cuda_fail("attention", "head_dim above 128 is not supported", HD, __FILE__, __LINE__);
    int T = cu_rows[nseq], L = kvs[0]->L, kvw = kvs[0]->kvw;
    if (T <= 0) return;
    if (layer == 0) {
        /* the step's page table and row metadata, the same for every layer */
        size_t np = 0;
        for (int i = 0; i < nseq; i++)
            np += (size_t)((cuda_kv_pages *)kvs[i]->impl)->npages;
        act **ph = (act **)malloc(sizeof(act *) * (np ? np : 1));
        int32_t *mh = (int32_t *)malloc(sizeof(int32_t) * 2 * (size_t)T);
        if (!ph || !mh) al_cuda_fail("malloc", "out of memory for a decode step's tables", 0, __FILE__, __LINE__);
        size_t at = 0;
        for (int i = 0; i < nseq; i++) {
            cuda_kv_pages *pg = (cuda_kv_pages *)kvs[i]->impl;
            memcpy(ph + at, pg->page, sizeof(act *) * (size_t)pg->npages);
            for (int r = cu_rows[i]; r < cu_rows[i + 1]; r++)
                mh[2 * r] = (int32_t)at, mh[2 * r + 1] = kvs[i]->len + r - cu_rows[i];
            at += (size_t)pg->npages;
        }
        cuda_grow((void **)&c->kv_ptrs, &c->kv_ptrs_cap, np ? np : 1, sizeof(act *));
        cuda_grow((void **)&c->kv_meta, &c->kv_meta_cap, 2 * (size_t)T, sizeof(int32_t));
        CUDA_CHECK(cudaMemcpyAsync(c->kv_ptrs, ph, sizeof(act *) * np, cudaMemcpyHostToDevice, c->stream));
        CUDA_CHECK(cudaMemcpyAsync(c->kv_meta, mh, sizeof(int32_t) * 2 * (size_t)T,
                                   cudaMemcpyHostToDevice, c->stream));
        CUDA_CHECK(cudaStreamSynchronize(c->stream));
        free(ph), free(mh);
    }
    kv_store_kernel<<<(unsigned)T, 128, 0, c->stream>>>(c->kv_ptrs, c->kv_meta, k_new, v_new, T,
                                                        layer, L, kvw);
    CUDA_LAUNCH_CHECK();
    dim3 grid((unsigned)T, (unsigned)((NH + AT_ROWS - 1) / AT_ROWS));
    attn_kv_kernel<<<grid, AT_ROWS * 32, sizeof(float) * AT_ROWS * HD, c->stream>>>(
        out, q, c->kv_ptrs, c->kv_meta, T, layer, L, NH, NKV, HD, 1.0f / sqrtf((float)HD));
    CUDA_LAUNCH_CHECK();
}
