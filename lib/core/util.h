/*
 * util.h: small helpers every subsystem shares: clocks, files, formatted errors.
 */
#ifndef ARCLIGHT_UTIL_H
#define ARCLIGHT_UTIL_H

#include <stddef.h>
#include <stdint.h>

#include "core/sha256.h" /* al_sha256*, al_hex */

#define AL_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

/* Wall-clock microseconds since the Unix epoch. */
int64_t al_now_us(void);
/* Monotonic microseconds, for durations. */
int64_t al_mono_us(void);

/* snprintf into an errstr buffer (NULL-safe); always returns -1 so that callers can write
 * `return al_err(errstr, errlen, "...", ...)`. */
int al_err(char *errstr, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Reads a whole file (a regular file or a pipe) into a malloc'd, NUL-terminated buffer (the
 * caller frees it). Returns NULL with the reason in errstr (naming the path) on failure. */
char *al_file_read(const char *path, size_t *len_out, char *errstr, size_t errlen);

/* The non-empty lines of a file (the records of a JSONL file), or -1 if it cannot be read. */
long al_file_count_lines(const char *path);

/* Writes a whole file atomically (temp file + fsync + rename). 0 or -1 with errstr. */
int al_file_write_atomic(const char *path, const void *buf, size_t len, char *errstr,
                         size_t errlen);
/* The same with the file's bytes in two pieces (a header and a body), a then b. */
int al_file_write_atomic2(const char *path, const void *a, size_t alen, const void *b,
                          size_t blen, char *errstr, size_t errlen);

/* Removes leading and trailing whitespace in place; returns s. */
char *al_str_trim(char *s);

/* Whether a[0..n) equals the NUL-terminated secret, in time that depends on the lengths
 * only: a timing attack learns nothing of an API key from how long a wrong guess took. */
int al_secret_eq(const char *a, size_t n, const char *secret);


#endif
