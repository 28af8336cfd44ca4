/*
 * tensor_dump.h: reader of the reference dumps the Python scripts under tests/model/ write:
 * ref_model.py (magic "ALMD"), ref_losses.py and ref_trainer.py (magic "ALSS"). All of them
 * are named f32 / i32 tensors in one record format, version 1. Header-only, for tests.
 *
 * Format (little-endian): magic u32, version u32, count u32, then per record: name_len u32,
 * name (not NUL-terminated), dtype u32 (0 = f32, 1 = i32), ndim u32 (<= 4), dims u32 * ndim,
 * data (4 bytes per element, at whatever alignment the record leaves it).
 *
 * Every length is checked against the file, so a truncated, stale or corrupt dump is an
 * error naming the file and how to regenerate it, never a crash or an out-of-bounds read.
 */
#ifndef ARCLIGHT_TESTS_TENSOR_DUMP_H
#define ARCLIGHT_TESTS_TENSOR_DUMP_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TDUMP_VERSION 1u
#define TDUMP_F32 0
#define TDUMP_I32 1

typedef struct tdump_tensor {
    char name[192];
    int dtype; /* TDUMP_F32 or TDUMP_I32 */
    int ndim;
    int64_t dims[4];
    size_t numel;
    const uint8_t *data; /* into tdump.buf, possibly unaligned: read via tdump_f32/_i32 */
} tdump_tensor;

typedef struct tdump {
    uint8_t *buf;
    size_t len;
    int count;
    tdump_tensor *t;
} tdump;

static inline uint32_t tdump_u32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static inline void tdump_free(tdump *d)
{
    free(d->buf);
    free(d->t);
    memset(d, 0, sizeof *d);
}

/* Loads the dump at `path`, whose first four bytes must be `magic` (e.g. "ALMD"). Returns 0,
 * or -1 with *d empty and the reason in err (cannot open or read, wrong magic or version,
 * truncated or corrupt record); `regen` is the command that rewrites the dump, quoted in
 * the message. On success the caller owns *d and releases it with tdump_free. */
static inline int tdump_load(tdump *d, const char *path, const char magic[4], const char *regen,
                             char *err, size_t errlen)
{
    memset(d, 0, sizeof *d);
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, errlen, "cannot open %.400s (regenerate: %.300s)", path, regen);
        return -1;
    }
    long n = -1;
    if (fseek(f, 0, SEEK_END) == 0) n = ftell(f);
    if (n < 0 || fseek(f, 0, SEEK_SET) != 0) {
        fclose(f);
        snprintf(err, errlen, "cannot size %.400s", path);
        return -1;
    }
    d->len = (size_t)n;
    d->buf = malloc(d->len ? d->len : 1);
    if (!d->buf || fread(d->buf, 1, d->len, f) != d->len) {
        fclose(f);
        tdump_free(d);
        snprintf(err, errlen, "cannot read %.400s", path);
        return -1;
    }
    fclose(f);
    if (d->len < 12 || memcmp(d->buf, magic, 4) != 0 || tdump_u32(d->buf + 4) != TDUMP_VERSION) {
        tdump_free(d);
        snprintf(err, errlen, "%.400s: not a version-%u %.4s dump (regenerate: %.300s)", path,
                 TDUMP_VERSION, magic, regen);
        return -1;
    }
    uint32_t count = tdump_u32(d->buf + 8);
    size_t off = 12;
    /* a record is at least 12 bytes, so a larger count cannot fit: refuse it before the
     * allocation it would size */
    if (count > (d->len - off) / 12) goto bad;
    d->t = calloc(count ? count : 1, sizeof *d->t);
    if (!d->t) goto bad;
    for (uint32_t i = 0; i < count; i++) {
        tdump_tensor *t = &d->t[i];
        if (4 > d->len - off) goto bad;
        uint32_t nl = tdump_u32(d->buf + off);
        off += 4;
        if (nl >= sizeof t->name || (size_t)nl + 8 > d->len - off) goto bad;
        memcpy(t->name, d->buf + off, nl);
        off += nl;
        uint32_t dtype = tdump_u32(d->buf + off), ndim = tdump_u32(d->buf + off + 4);
        off += 8;
        if ((dtype != TDUMP_F32 && dtype != TDUMP_I32) || ndim > 4 || 4 * ndim > d->len - off)
            goto bad;
        t->dtype = (int)dtype;
        t->ndim = (int)ndim;
        /* four u32 dims can overflow size_t: a product that would wrap is corrupt unless
         * another dim is 0 */
        int zero = 0, wraps = 0;
        t->numel = 1;
        for (uint32_t k = 0; k < ndim; k++) {
            uint32_t dim = tdump_u32(d->buf + off);
            off += 4;
            t->dims[k] = dim;
            if (dim == 0)
                zero = 1;
            else if (t->numel > SIZE_MAX / dim)
                wraps = 1;
            else
                t->numel *= dim;
        }
        if (zero)
            t->numel = 0;
        else if (wraps)
            goto bad;
        if (t->numel > (d->len - off) / 4) goto bad;
        t->data = d->buf + off;
        off += 4 * t->numel;
        d->count++;
    }
    return 0;
bad:
    snprintf(err, errlen, "%.400s: truncated or corrupt at record %d (regenerate: %.300s)", path,
             d->count, regen);
    tdump_free(d);
    return -1;
}

/* The tensor called `name`, or NULL. */
static inline const tdump_tensor *tdump_find(const tdump *d, const char *name)
{
    for (int i = 0; i < d->count; i++)
        if (strcmp(d->t[i].name, name) == 0) return &d->t[i];
    return NULL;
}

/* Tensor `name` copied out as 4-byte values of dtype `as` (TDUMP_F32 or TDUMP_I32) into a
 * malloc'd array the caller frees; NULL when absent or out of memory. Elements are read
 * through a little-endian u32, so unaligned data is fine. A tensor of the other dtype is
 * converted value by value: i32 -> f32 as C converts (exact up to 2^24); f32 -> i32
 * truncating toward zero, saturating at the int32 range, NaN as 0 (so a corrupt value
 * cannot make the conversion undefined). *numel, when given, receives the element count. */
static inline void *tdump_copy(const tdump *d, const char *name, int as, size_t *numel)
{
    const tdump_tensor *t = tdump_find(d, name);
    if (!t) return NULL;
    uint32_t *out = malloc(4 * (t->numel ? t->numel : 1));
    if (!out) return NULL;
    for (size_t i = 0; i < t->numel; i++) {
        uint32_t u = tdump_u32(t->data + 4 * i);
        float x;
        int32_t v;
        if (t->dtype == as) {
            out[i] = u;
        } else if (as == TDUMP_F32) {
            x = (float)(int32_t)u;
            memcpy(&out[i], &x, 4);
        } else {
            memcpy(&x, &u, 4);
            v = x != x                ? 0
                : x >= 2147483648.0f  ? INT32_MAX
                : x <= -2147483648.0f ? INT32_MIN
                                      : (int32_t)x;
            memcpy(&out[i], &v, 4);
        }
    }
    if (numel) *numel = t->numel;
    return out;
}

static inline float *tdump_f32(const tdump *d, const char *name, size_t *numel)
{
    return (float *)tdump_copy(d, name, TDUMP_F32, numel);
}

static inline int32_t *tdump_i32(const tdump *d, const char *name, size_t *numel)
{
    return (int32_t *)tdump_copy(d, name, TDUMP_I32, numel);
}

#endif
