/*
 * model_dump.h: reader of the reference dumps of tests/model/ref_model.py (magic "ALMD",
 * version 1): named f32 / i32 tensors. Header-only, for tests. Every length is checked
 * against the file, so a truncated or stale dump is an error, not a crash.
 */
#ifndef ARCLIGHT_TESTS_MODEL_DUMP_H
#define ARCLIGHT_TESTS_MODEL_DUMP_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define REF_DUMP_MAGIC 0x444D4C41u
#define REF_DUMP_VERSION 1u

typedef struct ref_tensor {
    char name[160];
    int dtype; /* 0 f32, 1 i32 */
    int ndim;
    int64_t dims[4];
    size_t numel;
    const void *data; /* into ref_dump.buf; 4-byte elements, possibly unaligned: copy out */
} ref_tensor;

typedef struct ref_dump {
    uint8_t *buf;
    size_t len;
    int count;
    ref_tensor *t;
} ref_dump;

static inline uint32_t ref_u32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static inline void ref_dump_free(ref_dump *d)
{
    free(d->buf);
    free(d->t);
    memset(d, 0, sizeof *d);
}

static inline int ref_dump_load(ref_dump *d, const char *path, char *err, size_t errlen)
{
    memset(d, 0, sizeof *d);
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, errlen,
                 "cannot open %.400s (regenerate: /usr/bin/python3 tests/model/ref_model.py "
                 "--regenerate)",
                 path);
        return -1;
    }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    d->buf = malloc(n > 0 ? (size_t)n : 1);
    d->len = n > 0 ? (size_t)n : 0;
    if (!d->buf || fread(d->buf, 1, d->len, f) != d->len) {
        fclose(f);
        snprintf(err, errlen, "read failed: %.400s", path);
        ref_dump_free(d);
        return -1;
    }
    fclose(f);
    if (d->len < 12 || ref_u32(d->buf) != REF_DUMP_MAGIC ||
        ref_u32(d->buf + 4) != REF_DUMP_VERSION) {
        snprintf(err, errlen, "not an ALMD v%u dump: %.400s", REF_DUMP_VERSION, path);
        ref_dump_free(d);
        return -1;
    }
    uint32_t count = ref_u32(d->buf + 8);
    d->t = calloc(count ? count : 1, sizeof *d->t);
    size_t off = 12;
    for (uint32_t i = 0; d->t && i < count; i++) {
        ref_tensor *t = &d->t[i];
        if (off + 4 > d->len) goto trunc;
        uint32_t nl = ref_u32(d->buf + off);
        off += 4;
        if (nl >= sizeof t->name || off + nl + 8 > d->len) goto trunc;
        memcpy(t->name, d->buf + off, nl);
        off += nl;
        t->dtype = (int)ref_u32(d->buf + off);
        t->ndim = (int)ref_u32(d->buf + off + 4);
        off += 8;
        if (t->ndim > 4 || off + 4 * (size_t)t->ndim > d->len) goto trunc;
        t->numel = 1;
        for (int k = 0; k < t->ndim; k++) {
            t->dims[k] = ref_u32(d->buf + off);
            t->numel *= (size_t)t->dims[k];
            off += 4;
        }
        if (t->numel > (d->len - off) / 4) goto trunc;
        t->data = d->buf + off;
        off += 4 * t->numel;
        d->count++;
    }
    return 0;
trunc:
    snprintf(err, errlen, "truncated dump: %.400s", path);
    ref_dump_free(d);
    return -1;
}

static inline const ref_tensor *ref_get(const ref_dump *d, const char *name)
{
    for (int i = 0; i < d->count; i++)
        if (!strcmp(d->t[i].name, name)) return &d->t[i];
    return NULL;
}

/* Copies a record out as floats / ints (malloc'd; NULL if absent or of the other type). */
static inline float *ref_f32(const ref_dump *d, const char *name, size_t *n)
{
    const ref_tensor *t = ref_get(d, name);
    if (!t || t->dtype != 0) return NULL;
    float *out = malloc(sizeof(float) * (t->numel ? t->numel : 1));
    if (out) memcpy(out, t->data, 4 * t->numel);
    if (n) *n = t->numel;
    return out;
}

static inline int32_t *ref_i32(const ref_dump *d, const char *name, size_t *n)
{
    const ref_tensor *t = ref_get(d, name);
    if (!t || t->dtype != 1) return NULL;
    int32_t *out = malloc(sizeof(int32_t) * (t->numel ? t->numel : 1));
    if (out) memcpy(out, t->data, 4 * t->numel);
    if (n) *n = t->numel;
    return out;
}

#endif
