/*
 * testlib.h: arclight's test runner. One test executable per file; every TEST() in it
 * registers itself and runs in file order. A CHECK records a failure and continues, a
 * REQUIRE records it and leaves the test. The run ends with "N passed, N failed" and exits
 * non-zero when anything failed. `./test NAME...` runs only the tests whose names contain
 * one of the given substrings.
 *
 * Include it in exactly one translation unit per test executable.
 */
#ifndef ARCLIGHT_TESTLIB_H
#define ARCLIGHT_TESTLIB_H

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef void (*testlib_fn)(void);

#define TESTLIB_MAX 512
static struct {
    const char *name;
    testlib_fn fn;
} testlib_tests[TESTLIB_MAX];
static int testlib_ntests;
static int testlib_cur_failed;
static const char *testlib_cur_name;

static inline void testlib_register(const char *name, testlib_fn fn)
{
    if (testlib_ntests >= TESTLIB_MAX) {
        fprintf(stderr, "testlib: more than %d tests in one file\n", TESTLIB_MAX);
        abort();
    }
    testlib_tests[testlib_ntests].name = name;
    testlib_tests[testlib_ntests].fn = fn;
    testlib_ntests++;
}

#define TEST(name)                                                                                 \
    static void name(void);                                                                        \
    __attribute__((constructor)) static void testlib_reg_##name(void)                              \
    {                                                                                              \
        testlib_register(#name, name);                                                             \
    }                                                                                              \
    static void name(void)

static inline void testlib_fail(const char *file, int line, const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "  %s:%d: [%s] ", file, line, testlib_cur_name ? testlib_cur_name : "?");
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    testlib_cur_failed++;
}

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond)) testlib_fail(__FILE__, __LINE__, "CHECK(%s) failed", #cond);                 \
    } while (0)

#define REQUIRE(cond)                                                                              \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            testlib_fail(__FILE__, __LINE__, "REQUIRE(%s) failed", #cond);                        \
            return;                                                                                \
        }                                                                                          \
    } while (0)

/* CHECKF(cond, fmt, ...): CHECK with a message that explains the values. */
#define CHECKF(cond, ...)                                                                          \
    do {                                                                                           \
        if (!(cond)) testlib_fail(__FILE__, __LINE__, __VA_ARGS__);                                \
    } while (0)

#define REQUIREF(cond, ...)                                                                        \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            testlib_fail(__FILE__, __LINE__, __VA_ARGS__);                                         \
            return;                                                                                \
        }                                                                                          \
    } while (0)

#define CHECK_EQ_INT(a, b)                                                                         \
    do {                                                                                           \
        long long testlib_a = (long long)(a), testlib_b = (long long)(b);                          \
        if (testlib_a != testlib_b)                                                                \
            testlib_fail(__FILE__, __LINE__, "%s == %s: %lld != %lld", #a, #b, testlib_a,          \
                         testlib_b);                                                               \
    } while (0)

#define CHECK_EQ_STR(a, b)                                                                         \
    do {                                                                                           \
        const char *testlib_a = (a), *testlib_b = (b);                                             \
        if (!testlib_a || !testlib_b || strcmp(testlib_a, testlib_b) != 0)                         \
            testlib_fail(__FILE__, __LINE__, "%s == %s: \"%s\" != \"%s\"", #a, #b,                 \
                         testlib_a ? testlib_a : "(null)", testlib_b ? testlib_b : "(null)");      \
    } while (0)

#define CHECK_NEAR(a, b, tol)                                                                      \
    do {                                                                                           \
        double testlib_a = (double)(a), testlib_b = (double)(b);                                   \
        if (!(fabs(testlib_a - testlib_b) <= (tol)))                                               \
            testlib_fail(__FILE__, __LINE__, "%s ~= %s: %.9g vs %.9g (tol %g)", #a, #b,            \
                         testlib_a, testlib_b, (double)(tol));                                     \
    } while (0)

static inline double testlib_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static inline int testlib_selected(const char *name, int argc, char **argv)
{
    if (argc <= 1) return 1;
    for (int i = 1; i < argc; i++)
        if (strstr(name, argv[i])) return 1;
    return 0;
}

/* The runner. A test file that needs its own main defines TESTLIB_NO_MAIN and calls
 * testlib_run(argc, argv) itself. */
static inline int testlib_run(int argc, char **argv)
{
    int passed = 0, failed = 0;
    setvbuf(stdout, NULL, _IOLBF, 0);
    for (int i = 0; i < testlib_ntests; i++) {
        if (!testlib_selected(testlib_tests[i].name, argc, argv)) continue;
        testlib_cur_name = testlib_tests[i].name;
        testlib_cur_failed = 0;
        double t0 = testlib_now();
        testlib_tests[i].fn();
        double dt = testlib_now() - t0;
        if (testlib_cur_failed) {
            failed++;
            printf("FAIL %s (%.2fs, %d failed checks)\n", testlib_tests[i].name, dt,
                   testlib_cur_failed);
        } else {
            passed++;
            printf("ok   %s (%.2fs)\n", testlib_tests[i].name, dt);
        }
        fflush(stdout);
    }
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}

#ifndef TESTLIB_NO_MAIN
int main(int argc, char **argv)
{
    return testlib_run(argc, argv);
}
#endif

#endif
