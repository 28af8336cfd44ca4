/*
 * check.h: every CUDA, cuBLAS(Lt), cuDNN and NCCL call of the CUDA backend goes through one of
 * these macros, which name the call, the file and the line, print the library's own message
 * and abort: a failed device call leaves the device's state unknown, and the trainer and the
 * server restart from a checkpoint or a policy version rather than compute on.
 */
#ifndef ARCLIGHT_MODEL_CUDA_CHECK_H
#define ARCLIGHT_MODEL_CUDA_CHECK_H

#include <cublasLt.h>
#include <cuda_runtime.h>
#include <cudnn.h>
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>

static inline void al_cuda_fail(const char *what, const char *msg, long code, const char *file,
                                int line)
{
    fprintf(stderr, "arclight cuda: %s failed at %s:%d: %s (%ld)\n", what, file, line, msg, code);
    fflush(stderr);
    abort();
}

#define CUDA_CHECK(call)                                                                           \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess)                                                                     \
            al_cuda_fail(#call, cudaGetErrorString(e_), (long)e_, __FILE__, __LINE__);             \
    } while (0)

/* After a kernel launch: the launch itself (bad configuration) is checked at once. */
#define CUDA_LAUNCH_CHECK() CUDA_CHECK(cudaGetLastError())

#define CUBLAS_CHECK(call)                                                                         \
    do {                                                                                           \
        cublasStatus_t s_ = (call);                                                                \
        if (s_ != CUBLAS_STATUS_SUCCESS)                                                           \
            al_cuda_fail(#call, cublasLtGetStatusString(s_), (long)s_, __FILE__, __LINE__);          \
    } while (0)

#define CUDNN_CHECK(call)                                                                          \
    do {                                                                                           \
        cudnnStatus_t s_ = (call);                                                                 \
        if (s_ != CUDNN_STATUS_SUCCESS)                                                            \
            al_cuda_fail(#call, cudnnGetErrorString(s_), (long)s_, __FILE__, __LINE__);            \
    } while (0)

#define NCCL_CHECK(call)                                                                           \
    do {                                                                                           \
        ncclResult_t r_ = (call);                                                                  \
        if (r_ != ncclSuccess)                                                                     \
            al_cuda_fail(#call, ncclGetErrorString(r_), (long)r_, __FILE__, __LINE__);             \
    } while (0)

#endif
