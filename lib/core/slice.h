/*
 * slice.h: a (pointer, length) view of bytes someone else owns, and its comparisons. Parsers
 * that face the network (lib/http, the proxy's JSON editor) hand these out instead of copies.
 */
#ifndef ARCLIGHT_CORE_SLICE_H
#define ARCLIGHT_CORE_SLICE_H

#include <stddef.h>
#include <string.h>

typedef struct al_slice {
    const char *p;
    size_t n;
} al_slice;

/* Exact. */
static inline int al_slice_eq(al_slice s, const char *lit)
{
    size_t n = strlen(lit);
    return s.n == n && memcmp(s.p, lit, n) == 0;
}

/* ASCII case-insensitive. */
static inline int al_slice_caseeq(al_slice s, const char *lit)
{
    size_t n = strlen(lit);
    if (s.n != n) return 0;
    for (size_t i = 0; i < n; i++) {
        int a = (unsigned char)s.p[i], b = (unsigned char)lit[i];
        if ((a >= 'A' && a <= 'Z' ? a + 32 : a) != (b >= 'A' && b <= 'Z' ? b + 32 : b)) return 0;
    }
    return 1;
}

#endif
