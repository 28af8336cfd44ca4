/*
 * gemm.c: row-major SGEMM through OpenBLAS, or a blocked loop without it.
 */
#include "model/gemm.h"

#include <string.h>

#ifdef ARCLIGHT_HAVE_OPENBLAS
#include <cblas.h>
#endif

/* The loop packs a block of op(B) transposed into rows of K so that the inner product runs
 * over contiguous memory for every combination of transposes. */
#define GEMM_NB 64
#define GEMM_KB 256

void al_gemm_ref(int trans_a, int trans_b, int M, int N, int K, float alpha, const float *A,
                 int lda, const float *B, int ldb, float beta, float *C, int ldc)
{
    if (M <= 0 || N <= 0) return;
    for (int i = 0; i < M; i++) {
        float *c = C + (size_t)i * ldc;
        if (beta == 0.0f) memset(c, 0, sizeof(float) * (size_t)N);
        else if (beta != 1.0f)
            for (int j = 0; j < N; j++) c[j] *= beta;
    }
    if (K <= 0 || alpha == 0.0f) return;
#pragma omp parallel
    {
        /* On the stack: a failed malloc in one thread would leave the others waiting at the
         * work-sharing barrier. 65 KiB per thread. */
        float bt[GEMM_NB * GEMM_KB]; /* (nb, kb): block of op(B)^T */
        float at[GEMM_KB];
        {
            for (int j0 = 0; j0 < N; j0 += GEMM_NB) {
                int nb = N - j0 < GEMM_NB ? N - j0 : GEMM_NB;
                for (int k0 = 0; k0 < K; k0 += GEMM_KB) {
                    int kb = K - k0 < GEMM_KB ? K - k0 : GEMM_KB;
                    for (int j = 0; j < nb; j++)
                        for (int k = 0; k < kb; k++)
                            bt[j * kb + k] = trans_b ? B[(size_t)(j0 + j) * ldb + k0 + k]
                                                     : B[(size_t)(k0 + k) * ldb + j0 + j];
#pragma omp for schedule(static)
                    for (int i = 0; i < M; i++) {
                        const float *a;
                        if (trans_a) {
                            for (int k = 0; k < kb; k++) at[k] = A[(size_t)(k0 + k) * lda + i];
                            a = at;
                        } else {
                            a = A + (size_t)i * lda + k0;
                        }
                        float *c = C + (size_t)i * ldc + j0;
                        for (int j = 0; j < nb; j++) {
                            const float *b = bt + (size_t)j * kb;
                            float s = 0.0f;
                            for (int k = 0; k < kb; k++) s += a[k] * b[k];
                            c[j] += alpha * s;
                        }
                    }
                }
            }
        }
    }
}

void al_gemm(int trans_a, int trans_b, int M, int N, int K, float alpha, const float *A, int lda,
             const float *B, int ldb, float beta, float *C, int ldc)
{
#ifdef ARCLIGHT_HAVE_OPENBLAS
    if (M <= 0 || N <= 0) return;
    if (K <= 0) {
        al_gemm_ref(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                trans_b ? CblasTrans : CblasNoTrans, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
#else
    al_gemm_ref(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
#endif
}

const char *al_gemm_backend(void)
{
#ifdef ARCLIGHT_HAVE_OPENBLAS
    return "openblas";
#else
    return "builtin";
#endif
}
