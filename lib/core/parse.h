/*
 * parse.h: the one set of number parsers, for flags, environment variables and text files.
 * Each takes the whole string (no leading or trailing junk, base 10 for integers), checks the
 * closed range [lo, hi], and returns 0 with *out set, or -1 with *out untouched: the caller
 * says what was wrong in its own words (a flag's name, a file's line).
 */
#ifndef ARCLIGHT_CORE_PARSE_H
#define ARCLIGHT_CORE_PARSE_H

#include <stdint.h>

int al_parse_i64(const char *s, int64_t lo, int64_t hi, int64_t *out);
int al_parse_int(const char *s, int lo, int hi, int *out);
/* A number strtod reads (decimal, exponent, hex float) within [lo, hi]; NaN never is. */
int al_parse_double(const char *s, double lo, double hi, double *out);

#endif
