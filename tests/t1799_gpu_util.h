/*
 * t1799_gpu_util.h: what the GPU tests (1700-1799) share. Each compares a device backend
 * with the CPU backend (the reference) or with the PyTorch dumps, within tolerances stated
 * per op. Without a CUDA device (or without the CUDA module in this build) a test prints
 * "skipped: no CUDA device" and exits 77, which ctest reports as skipped (SKIP_RETURN_CODE),
 * never as passed.
 */
#ifndef ARCLIGHT_TESTS_GPU_UTIL_H
#define ARCLIGHT_TESTS_GPU_UTIL_H

#define TESTLIB_NO_MAIN
#include "testlib.h"

#include "model/ops.h"

#define GPU_SKIP 77

static al_backend *gpu_be;

/* The main of a GPU test: opens the CUDA backend or skips. */
static inline int gpu_test_main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (!al_backend_cuda_built()) {
        printf("skipped: no CUDA device (this build has no CUDA backend)\n");
        printf("0 passed, 0 failed, %d skipped\n", testlib_ntests);
        return GPU_SKIP;
    }
    const char *load_err = al_backend_cuda_load_error();
    if (load_err) { /* built but broken: a failure, never a skip */
        printf("the CUDA module does not load: %s\n", load_err);
        printf("0 passed, 1 failed\n");
        return 1;
    }
    if (!al_backend_cuda_available()) {
        printf("skipped: no CUDA device\n");
        printf("0 passed, 0 failed, %d skipped\n", testlib_ntests);
        return GPU_SKIP;
    }
    char err[512];
    gpu_be = al_backend_open("cuda", err, sizeof err);
    if (!gpu_be) {
        printf("cannot open the CUDA backend: %s\n", err);
        printf("0 passed, 1 failed\n");
        return 1;
    }
    typedef void (*describe_fn)(al_backend *, char *, size_t);
    describe_fn d = (describe_fn)al_backend_cuda_symbol("al_backend_cuda_describe");
    if (d) {
        d(gpu_be, err, sizeof err);
        printf("device: %s\n", err);
    }
    int rc = testlib_run(argc, argv);
    al_backend_free(gpu_be);
    return rc;
}

/* ‖a - b‖ / ‖b‖ over n values (NaN anywhere gives NaN, which fails every comparison). */
static inline double rel_l2(const float *a, const float *b, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - b[i];
        num += d * d;
        den += (double)b[i] * b[i];
    }
    return sqrt(num) / (sqrt(den) + 1e-30);
}

/* max |a - b| / max |b|. */
static inline double rel_max(const float *a, const float *b, size_t n)
{
    double e = 0, s = 1e-30;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (!(d <= e)) e = d;
        if (fabs(b[i]) > s) s = fabs(b[i]);
    }
    return e / s;
}

/* The nearest bf16 value (round to nearest even), as a float: inputs are rounded on the host
 * so that both backends see the same numbers. */
static inline float bf16_round(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7f800000u) == 0x7f800000u) return x;
    u += 0x7fffu + ((u >> 16) & 1u);
    u &= 0xffff0000u;
    memcpy(&x, &u, 4);
    return x;
}

/* xorshift floats in [-a, a), rounded to bf16. */
static inline void fill_rand(float *x, size_t n, float a, uint64_t seed)
{
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
    for (size_t i = 0; i < n; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        x[i] = bf16_round((float)(((s >> 11) * (1.0 / 9007199254740992.0)) * 2 - 1) * a);
    }
}

#endif
