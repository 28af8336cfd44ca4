/*
 * sha256.h: SHA-256 (FIPS 180-4) for the model library, which cannot use OpenSSL: the sha256
 * of a checkpoint's weights travels in each PolicyVersion so that a server can check what it
 * loads. The names carry the model_ prefix because lib/core's al_sha256* (OpenSSL) are linked
 * into the same binary.
 */
#ifndef ARCLIGHT_MODEL_SHA256_H
#define ARCLIGHT_MODEL_SHA256_H

#include <stddef.h>
#include <stdint.h>

typedef struct al_model_sha256_ctx {
    uint32_t h[8];
    uint64_t bytes; /* message length so far */
    uint8_t block[64];
    size_t fill; /* bytes waiting in block */
} al_model_sha256_ctx;

void al_model_sha256_init(al_model_sha256_ctx *c);
void al_model_sha256_update(al_model_sha256_ctx *c, const void *data, size_t len);
/* Writes the digest; the context must be initialized again before reuse. */
void al_model_sha256_final(al_model_sha256_ctx *c, uint8_t out[32]);

/* One-shot digest, and its 64 lowercase hex characters + NUL. */
void al_model_sha256(const void *data, size_t len, uint8_t out[32]);
void al_model_sha256_hex(const uint8_t digest[32], char out[65]);

/* Digest of the file at `path` as hex, read in 1 MiB pieces. 0, or -1 with errstr naming the
 * path and the reason. */
int al_model_sha256_file(const char *path, char out_hex[65], char *errstr, size_t errlen);

#endif
