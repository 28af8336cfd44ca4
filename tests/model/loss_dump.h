/*
 * loss_dump.h: reader of the reference dumps written by tests/model/ref_losses.py (magic
 * "ALSS", version 1): named f32 / i32 tensors. Header-only, for tests.
 *
 * Format (little-endian): magic u32, version u32, count u32, then per record: name_len u32,
 * name, dtype u32 (0 = f32, 1 = i32), ndim u32, dims u32 * ndim, data (4 bytes per element).
 */
#ifndef ARCLIGHT_TESTS_LOSS_DUMP_H
#define ARCLIGHT_TESTS_LOSS_DUMP_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MODEL_DUMP_MAGIC 0x53534C41u
#define MODEL_DUMP_VERSION 1u

typedef struct model_dump_tensor {
    char name[128];
    int dtype; /* 0 f32, 1 i32 */
    int ndim;
    int64_t dims[4];
    int64_t numel;
    void *data; /* points into model_dump.buf */
} model_dump_tensor;

typedef struct model_dump {
    uint8_t *buf;
    size_t len;
    int count;
    model_dump_tensor *t;
} model_dump;

static inline uint32_t model_dump_u32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static inline void model_dump_free(model_dump *d)
{
    free(d->buf);
    free(d->t);
    memset(d, 0, sizeof *d);
}

/* Loads `path`; 0, or -1 with the reason in errstr (missing file, bad magic or version,
 * truncated record). */
static inline int model_dump_load(model_dump *d, const char *path, char *errstr, size_t errlen)
{
    memset(d, 0, sizeof *d);
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(errstr, errlen, "cannot open %s (regenerate with /usr/bin/python3 "
                                 "tests/model/ref_losses.py)",
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
        model_dump_free(d);
        snprintf(errstr, errlen, "cannot read %s", path);
        return -1;
    }
    fclose(f);
    if (d->len < 12 || model_dump_u32(d->buf) != MODEL_DUMP_MAGIC ||
        model_dump_u32(d->buf + 4) != MODEL_DUMP_VERSION) {
        model_dump_free(d);
        snprintf(errstr, errlen, "%s: not a version-%u dump", path, MODEL_DUMP_VERSION);
        return -1;
    }
    uint32_t count = model_dump_u32(d->buf + 8);
    d->t = calloc(count ? count : 1, sizeof *d->t);
    size_t off = 12;
    for (uint32_t i = 0; i < count; i++) {
        model_dump_tensor *t = &d->t[i];
        if (off + 4 > d->len) goto truncated;
        uint32_t nl = model_dump_u32(d->buf + off);
        off += 4;
        if (nl >= sizeof t->name || off + nl + 8 > d->len) goto truncated;
        memcpy(t->name, d->buf + off, nl);
        off += nl;
        t->dtype = (int)model_dump_u32(d->buf + off);
        t->ndim = (int)model_dump_u32(d->buf + off + 4);
        off += 8;
        if (t->ndim > 4 || off + 4u * t->ndim > d->len) goto truncated;
        t->numel = 1;
        for (int k = 0; k < t->ndim; k++) {
            t->dims[k] = model_dump_u32(d->buf + off);
            t->numel *= t->dims[k];
            off += 4;
        }
        if (off + 4 * (size_t)t->numel > d->len) goto truncated;
        t->data = d->buf + off;
        off += 4 * (size_t)t->numel;
        d->count++;
    }
    return 0;
truncated:
    snprintf(errstr, errlen, "%s: truncated at record %d", path, d->count);
    model_dump_free(d);
    return -1;
}

/* The tensor called `name`, or NULL. Its data may be unaligned: read it through
 * model_dump_f32 / model_dump_i32. */
static inline const model_dump_tensor *model_dump_find(const model_dump *d, const char *name)
{
    for (int i = 0; i < d->count; i++)
        if (strcmp(d->t[i].name, name) == 0) return &d->t[i];
    return NULL;
}

/* A malloc'd copy of tensor `name` as floats (i32 converted), or NULL when absent. */
static inline float *model_dump_f32(const model_dump *d, const char *name, int64_t *numel)
{
    const model_dump_tensor *t = model_dump_find(d, name);
    if (!t) return NULL;
    float *out = malloc(sizeof(float) * (t->numel ? t->numel : 1));
    for (int64_t i = 0; i < t->numel; i++) {
        uint32_t u = model_dump_u32((const uint8_t *)t->data + 4 * i);
        if (t->dtype == 0)
            memcpy(&out[i], &u, 4);
        else
            out[i] = (float)(int32_t)u;
    }
    if (numel) *numel = t->numel;
    return out;
}

/* A malloc'd copy of tensor `name` as int32 (f32 truncated), or NULL when absent. */
static inline int32_t *model_dump_i32(const model_dump *d, const char *name, int64_t *numel)
{
    const model_dump_tensor *t = model_dump_find(d, name);
    if (!t) return NULL;
    int32_t *out = malloc(sizeof(int32_t) * (t->numel ? t->numel : 1));
    for (int64_t i = 0; i < t->numel; i++) {
        uint32_t u = model_dump_u32((const uint8_t *)t->data + 4 * i);
        if (t->dtype == 1) {
            out[i] = (int32_t)u;
        } else {
            float x;
            memcpy(&x, &u, 4);
            out[i] = (int32_t)x;
        }
    }
    if (numel) *numel = t->numel;
    return out;
}

#endif
