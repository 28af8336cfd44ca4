/*
 * gemm.cu: every matrix product of the CUDA backend through cuBLASLt: bf16 operands, f32
 * accumulation, bf16 or f32 results, the bias added by the epilogue. A product's
 * descriptors, layouts and the algorithm cuBLASLt's heuristic picks are made once per shape
 * and kept in a small table: a decode step runs ~7 products per layer, and asking the
 * heuristic each time would cost more than the products of a small batch.
 */
#include "model/cuda/internal.h"

#include <string.h>

#define GEMM_CACHE 512

struct gemm_entry {
    int used;
    int ta, tb, m, n, k, lda, ldb, ldd, has_bias;
    uint32_t align; /* the pointers' alignments, packed (see alignment) */
    cudaDataType_t dt;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, ld;
    cublasLtMatmulAlgo_t algo;
};

/* The largest power of two up to 256 dividing p: cuBLASLt's heuristic assumes 256-byte aligned
 * operands unless told otherwise, and row offsets into a matrix (a chunk of rows, one layer of
 * a stacked tensor) can be less aligned. */
static uint32_t alignment(const void *p)
{
    uintptr_t a = (uintptr_t)p;
    uint32_t r = 256;
    while (r > 1 && (a % r)) r >>= 1;
    return r;
}

static unsigned gemm_hash(int ta, int tb, int m, int n, int k, int lda, int ldb, int ldd, int bias,
                          cudaDataType_t dt, uint32_t align)
{
    unsigned h = 2166136261u;
    int v[11] = {ta, tb, m, n, k, lda, ldb, ldd, bias, (int)dt, (int)align};
    for (int i = 0; i < 11; i++)
        h = (h ^ (unsigned)v[i]) * 16777619u;
    return h;
}

static gemm_entry *gemm_plan(cuda_ctx *c, int ta, int tb, int m, int n, int k, int lda, int ldb,
                             int ldd, cudaDataType_t dt, int has_bias, const uint32_t al[3])
{
    uint32_t align = al[0] | al[1] << 9 | al[2] << 18;
    if (!c->gemm_cache) {
        c->gemm_cache = (gemm_entry *)calloc(GEMM_CACHE, sizeof(gemm_entry));
        if (!c->gemm_cache) al_cuda_fail("calloc", "out of memory for the GEMM table", 0, __FILE__, __LINE__);
    }
    unsigned h = gemm_hash(ta, tb, m, n, k, lda, ldb, ldd, has_bias, dt, align) % GEMM_CACHE;
    gemm_entry *e = NULL;
    for (unsigned i = 0; i < GEMM_CACHE; i++) {
        gemm_entry *x = &c->gemm_cache[(h + i) % GEMM_CACHE];
        if (!x->used) {
            e = x;
            break;
        }
        if (x->ta == ta && x->tb == tb && x->m == m && x->n == n && x->k == k && x->lda == lda &&
            x->ldb == ldb && x->ldd == ldd && x->dt == dt && x->has_bias == has_bias &&
            x->align == align)
            return x;
    }
    if (!e) { /* full: drop everything (shapes of a run are few; this is a safety valve) */
        cuda_gemm_free(c);
        c->gemm_cache = (gemm_entry *)calloc(GEMM_CACHE, sizeof(gemm_entry));
        if (!c->gemm_cache) al_cuda_fail("calloc", "out of memory for the GEMM table", 0, __FILE__, __LINE__);
        e = &c->gemm_cache[h];
    }
    memset(e, 0, sizeof *e);
    e->ta = ta, e->tb = tb, e->m = m, e->n = n, e->k = k, e->lda = lda, e->ldb = ldb;
    e->ldd = ldd, e->dt = dt, e->has_bias = has_bias, e->align = align;
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&e->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, opb = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(e->desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(e->desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb));
    if (has_bias) {
        cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(e->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(e->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &dt, sizeof dt));
    }
    /* stored shapes: A is (ta ? k : m) x (ta ? m : k), B is (tb ? n : k) x (tb ? k : n) */
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&e->la, CUDA_R_16BF, ta ? k : m, ta ? m : k, lda));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&e->lb, CUDA_R_16BF, tb ? n : k, tb ? k : n, ldb));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&e->ld, dt, m, n, ldd));
    cublasLtMatmulPreference_t pref;
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                      &c->lt_ws_bytes, sizeof c->lt_ws_bytes));
    cublasLtMatmulPreferenceAttributes_t which[4] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    uint32_t vals[4] = {al[0], al[1], al[2], al[2]};
    for (int i = 0; i < 4; i++)
        CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, which[i], &vals[i], sizeof vals[i]));
    cublasLtMatmulHeuristicResult_t res;
    int found = 0;
    CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(c->lt, e->desc, e->la, e->lb, e->ld, e->ld, pref, 1,
                                                &res, &found));
    CUBLAS_CHECK(cublasLtMatmulPreferenceDestroy(pref));
    if (found < 1)
        al_cuda_fail("cublasLtMatmulAlgoGetHeuristic", "no algorithm for this product", 0, __FILE__,
                     __LINE__);
    e->algo = res.algo;
    e->used = 1;
    return e;
}

void cuda_gemm(cuda_ctx *c, int trans_a, int trans_b, int m, int n, int k, const void *A, int lda,
               const void *B, int ldb, void *D, int ldd, cudaDataType_t dt, float beta,
               const void *bias)
{
    if (m <= 0 || n <= 0) return;
    uint32_t al[3] = {alignment(A), alignment(B), alignment(D)};
    if (bias && alignment(bias) < al[2]) al[2] = alignment(bias);
    gemm_entry *e = gemm_plan(c, trans_a, trans_b, m, n, k, lda, ldb, ldd, dt, bias != NULL, al);
    if (bias)
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(e->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                    &bias, sizeof bias));
    float alpha = 1.0f;
    CUBLAS_CHECK(cublasLtMatmul(c->lt, e->desc, &alpha, A, e->la, B, e->lb, &beta, D, e->ld, D,
                                e->ld, &e->algo, c->lt_ws, c->lt_ws_bytes, c->stream));
}

void cuda_gemm_free(cuda_ctx *c)
{
    if (!c->gemm_cache) return;
    for (int i = 0; i < GEMM_CACHE; i++) {
        gemm_entry *e = &c->gemm_cache[i];
        if (!e->used) continue;
        CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(e->la));
        CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(e->lb));
        CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(e->ld));
        CUBLAS_CHECK(cublasLtMatmulDescDestroy(e->desc));
    }
    free(c->gemm_cache);
    c->gemm_cache = NULL;
}
