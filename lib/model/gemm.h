/*
 * gemm.h: the one matrix multiply of the model library, row-major.
 *
 *   C (M, N) = alpha * op(A) (M, K) @ op(B) (K, N) + beta * C
 *
 * op(X) is X or its transpose; lda/ldb/ldc are the row strides of A, B and C as stored.
 * cblas_sgemm when ARCLIGHT_HAVE_OPENBLAS is defined, else a blocked C loop with OpenMP
 * across rows. beta == 0 overwrites C without reading it (NaNs in C do not leak through).
 *
 * Threads: with OpenMP, the first call sets OpenBLAS to one thread (process-wide) and large
 * products are split into row or column blocks across the OpenMP threads, each a
 * single-threaded cblas_sgemm; called from inside a parallel region (attention runs one head
 * per thread) a product stays on the calling thread. One pool of threads, no spinning
 * workers of one pool stealing the cores of the other.
 */
#ifndef ARCLIGHT_MODEL_GEMM_H
#define ARCLIGHT_MODEL_GEMM_H

void al_gemm(int trans_a, int trans_b, int M, int N, int K, float alpha, const float *A, int lda,
             const float *B, int ldb, float beta, float *C, int ldc);

/* The built-in loop, always compiled (tests compare it with the BLAS path). */
void al_gemm_ref(int trans_a, int trans_b, int M, int N, int K, float alpha, const float *A,
                 int lda, const float *B, int ldb, float beta, float *C, int ldc);

/* "openblas" or "builtin". */
const char *al_gemm_backend(void);

#endif
