/*
 * parse.c: number parsers (parse.h).
 */
#include "core/parse.h"

#include <errno.h>
#include <stdlib.h>

int al_parse_i64(const char *s, int64_t lo, int64_t hi, int64_t *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) return -1;
    *out = v;
    return 0;
}

int al_parse_int(const char *s, int lo, int hi, int *out)
{
    int64_t v;
    if (al_parse_i64(s, lo, hi, &v)) return -1;
    *out = (int)v;
    return 0;
}

int al_parse_double(const char *s, double lo, double hi, double *out)
{
    char *end;
    double v = strtod(s, &end);
    if (end == s || *end || !(v >= lo && v <= hi)) return -1;
    *out = v;
    return 0;
}
