/*
 * gemm.c: row-major SGEMM through OpenBLAS, or a blocked loop without it.
 */
#include "model/gemm.h"

#include <string.h>

#ifdef ARCLIGHT_HAVE_OPENBLAS
#include <cblas.h>
#include <pthread.h>
#endif
#ifdef _OPENMP
#include <omp.h>
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
        if (beta == 0.0f)
            memset(c, 0, sizeof(float) * (size_t)N);
        else if (beta != 1.0f)
            for (int j = 0; j < N; j++)
                c[j] *= beta;
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
                            for (int k = 0; k < kb; k++)
                                at[k] = A[(size_t)(k0 + k) * lda + i];
                            a = at;
                        } else {
                            a = A + (size_t)i * lda + k0;
                        }
                        float *c = C + (size_t)i * ldc + j0;
                        for (int j = 0; j < nb; j++) {
                            const float *b = bt + (size_t)j * kb;
                            float s = 0.0f;
                            for (int k = 0; k < kb; k++)
                                s += a[k] * b[k];
                            c[j] += alpha * s;
                        }
                    }
                }
            }
        }
    }
}

#ifdef ARCLIGHT_HAVE_OPENBLAS
static pthread_once_t blas_once = PTHREAD_ONCE_INIT;
/* One pool of threads for the whole library: OpenBLAS's own pthreads would compete for the
 * cores with OpenMP's (whose idle workers spin after each parallel region), which costs 3-4x
 * on a busy 2-core machine. So OpenBLAS runs single-threaded and al_gemm splits the work
 * across OpenMP threads itself. This sets OpenBLAS's global thread count for the process;
 * the model library is its only BLAS user. */
static void blas_single_threaded(void)
{
#ifdef _OPENMP
    openblas_set_num_threads(1);
#endif
}

static void sgemm(int trans_a, int trans_b, int M, int N, int K, float alpha, const float *A,
                  int lda, const float *B, int ldb, float beta, float *C, int ldc)
{
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                trans_b ? CblasTrans : CblasNoTrans, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}
#endif

void al_gemm(int trans_a, int trans_b, int M, int N, int K, float alpha, const float *A, int lda,
             const float *B, int ldb, float beta, float *C, int ldc)
{
#ifdef ARCLIGHT_HAVE_OPENBLAS
    if (M <= 0 || N <= 0) return;
    if (K <= 0) {
        al_gemm_ref(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
    pthread_once(&blas_once, blas_single_threaded);
#ifdef _OPENMP
    int nt = omp_in_parallel() ? 1 : omp_get_max_threads();
    /* below ~4 MFLOP a split costs more than it saves */
    if (nt > 1 && (double)M * N * K >= (double)(1 << 21)) {
        /* Split the larger of M and N into one block per thread, in multiples of 16. */
        int split_m = M >= N, len = split_m ? M : N;
        int block = ((len + nt - 1) / nt + 15) / 16 * 16;
        int nblocks = (len + block - 1) / block;
#pragma omp parallel for schedule(static) num_threads(nt)
        for (int b = 0; b < nblocks; b++) {
            int o = b * block, n = len - o < block ? len - o : block;
            if (split_m)
                sgemm(trans_a, trans_b, n, N, K, alpha, trans_a ? A + o : A + (size_t)o * lda, lda,
                      B, ldb, beta, C + (size_t)o * ldc, ldc);
            else
                sgemm(trans_a, trans_b, M, n, K, alpha, A, lda,
                      trans_b ? B + (size_t)o * ldb : B + o, ldb, beta, C + o, ldc);
        }
        return;
    }
#endif
    sgemm(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
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
