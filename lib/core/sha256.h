/*
 * sha256.h: the project's one SHA-256 (FIPS 180-4), in plain C so that lib/core, and with it
 * lib/model, builds on a machine with nothing but a C compiler and CUDA: the sha256 of a
 * checkpoint's weights travels in each PolicyVersion so that a server can check what it loads,
 * and the proxy and train stages hash with the same code.
 */
#ifndef ARCLIGHT_CORE_SHA256_H
#define ARCLIGHT_CORE_SHA256_H

#include <stddef.h>
#include <stdint.h>

/* Incremental digest; lives anywhere (no allocation). */
typedef struct al_sha256_ctx {
    uint32_t h[8];
    uint64_t bytes; /* message length so far */
    uint8_t block[64];
    size_t fill; /* bytes waiting in block */
} al_sha256_ctx;

void al_sha256_init(al_sha256_ctx *c);
void al_sha256_update(al_sha256_ctx *c, const void *data, size_t len);
/* Writes the digest; the context must be initialized again before reuse. */
void al_sha256_final(al_sha256_ctx *c, uint8_t out[32]);

/* One-shot digest of a buffer, as 32 bytes and as 64 lowercase hex chars + NUL. */
void al_sha256(const void *data, size_t len, uint8_t out[32]);
void al_sha256_hex(const void *data, size_t len, char out[65]);

/* Digest of the file at `path` as hex, read in 1 MiB pieces. 0, or -1 with errstr naming the
 * path and the reason. */
int al_sha256_file(const char *path, char out_hex[65], char *errstr, size_t errlen);

/* n bytes as 2n lowercase hex chars + NUL. */
void al_hex(const uint8_t *bytes, size_t n, char *out /* 2n+1 */);

#endif
