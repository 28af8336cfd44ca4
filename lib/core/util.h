/*
 * util.h: small helpers every subsystem shares: clocks, files, formatted errors.
 */
#ifndef ARCLIGHT_UTIL_H
#define ARCLIGHT_UTIL_H

#include <stddef.h>
#include <stdint.h>

#define AL_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

/* Wall-clock microseconds since the Unix epoch. */
int64_t al_now_us(void);
/* Monotonic microseconds, for durations. */
int64_t al_mono_us(void);

/* snprintf into an errstr buffer (NULL-safe); always returns -1 so that callers can write
 * `return al_err(errstr, errlen, "...", ...)`. */
int al_err(char *errstr, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Reads a whole file into a malloc'd, NUL-terminated buffer (the caller frees it).
 * Returns NULL with the reason in errstr (naming the path) on failure. */
char *al_file_read(const char *path, size_t *len_out, char *errstr, size_t errlen);

/* Writes a whole file atomically (temp file + fsync + rename). 0 or -1 with errstr. */
int al_file_write_atomic(const char *path, const void *buf, size_t len, char *errstr,
                         size_t errlen);

/* Removes leading and trailing whitespace in place; returns s. */
char *al_str_trim(char *s);

/* SHA-256 of a buffer, as 32 bytes and as 64 lowercase hex chars + NUL. */
void al_sha256(const void *data, size_t len, uint8_t out[32]);
void al_sha256_hex(const void *data, size_t len, char out[65]);

/* Incremental SHA-256, for files too big to hold. */
/* Incremental SHA-256 (OpenSSL underneath); init returns NULL only when out of memory,
 * final frees the context. */
typedef struct al_sha256_ctx al_sha256_ctx;
al_sha256_ctx *al_sha256_init(void);
void al_sha256_update(al_sha256_ctx *c, const void *data, size_t len);
void al_sha256_final(al_sha256_ctx *c, uint8_t out[32]);
void al_hex(const uint8_t *bytes, size_t n, char *out /* 2n+1 */);

#endif
