/*
 * gemm.h: the one matrix multiply of the model library, row-major.
 *
 *   C (M, N) = alpha * op(A) (M, K) @ op(B) (K, N) + beta * C
 *
 * op(X) is X or its transpose; lda/ldb/ldc are the row strides of A, B and C as stored.
 * cblas_sgemm when ARCLIGHT_HAVE_OPENBLAS is defined, else a blocked C loop with OpenMP
 * across rows. beta == 0 overwrites C without reading it (NaNs in C do not leak through).
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
