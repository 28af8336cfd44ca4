/*
 * safetensors.c: reading and writing safetensors files, and a model's weights through them.
 */
#include "model/safetensors.h"

#include "core/util.h"
#include "text/json.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* The header of a real checkpoint is a few hundred KiB; anything above this is refused
 * before it is parsed (the format's own reference implementation caps it at 100 MB). */
#define ST_MAX_HEADER (100u << 20)

/* Opens PATH.tmp.PID for writing; the caller renames it with finish_atomic. */
static FILE *open_tmp(const char *path, char *tmp, size_t tmplen, char *errstr, size_t errlen)
{
    snprintf(tmp, tmplen, "%s.tmp.%ld", path, (long)getpid());
    FILE *f = fopen(tmp, "wb");
    if (!f) al_err(errstr, errlen, "%s: %s", tmp, strerror(errno));
    return f;
}

static int finish_atomic(FILE *f, const char *tmp, const char *path, int ok, char *errstr,
                         size_t errlen)
{
    if (ok && (fflush(f) != 0 || fsync(fileno(f)) != 0)) ok = 0;
    if (fclose(f) != 0) ok = 0;
    if (ok && rename(tmp, path) != 0) ok = 0;
    if (!ok) {
        int e = errno;
        unlink(tmp);
        return al_err(errstr, errlen, "%s: write failed: %s", path, strerror(e));
    }
    return 0;
}

uint16_t al_f32_to_bf16(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu)) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

float al_bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float x;
    memcpy(&x, &u, 4);
    return x;
}

static float f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, u;
    if (exp == 0) {
        if (man == 0)
            u = sign;
        else { /* subnormal: normalize */
            exp = 127 - 15 + 1;
            while (!(man & 0x400)) {
                man <<= 1;
                exp--;
            }
            u = sign | (exp << 23) | ((man & 0x3ff) << 13);
        }
    } else if (exp == 31) {
        u = sign | 0x7f800000u | (man << 13);
    } else {
        u = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float x;
    memcpy(&x, &u, 4);
    return x;
}

static size_t dtype_size(al_st_dtype d)
{
    return d == AL_ST_DTYPE_F32 ? 4 : 2;
}
static const char *dtype_name(al_st_dtype d)
{
    return d == AL_ST_DTYPE_F32 ? "F32" : d == AL_ST_DTYPE_BF16 ? "BF16" : "F16";
}

void al_st_tensor_to_f32(const al_st_tensor *t, float *out)
{
    if (t->dtype == AL_ST_DTYPE_F32) {
        memcpy(out, t->data, t->numel * 4);
        return;
    }
    for (size_t i = 0; i < t->numel; i++) {
        uint16_t h;
        memcpy(&h, t->data + 2 * i, 2);
        out[i] = t->dtype == AL_ST_DTYPE_BF16 ? al_bf16_to_f32(h) : f16_to_f32(h);
    }
}

void al_st_close(al_st_file *f)
{
    if (!f) return;
    if (f->tensors)
        for (size_t i = 0; i < f->ntensors; i++)
            free(f->tensors[i].name);
    free(f->tensors);
    if (f->mapped) {
        if (f->bytes && f->len) munmap(f->bytes, f->len);
    } else {
        free(f->bytes);
    }
    memset(f, 0, sizeof *f);
}

static int cmp_by_begin(const void *a, const void *b)
{
    const al_st_tensor *x = *(al_st_tensor *const *)a, *y = *(al_st_tensor *const *)b;
    return x->data < y->data   ? -1
           : x->data > y->data ? 1
                               : (x->nbytes > y->nbytes) - (x->nbytes < y->nbytes);
}

static int cmp_by_name(const void *a, const void *b)
{
    return strcmp((*(al_st_tensor *const *)a)->name, (*(al_st_tensor *const *)b)->name);
}

/* Reads one header entry into t; errors name the tensor. */
static int parse_entry(al_st_tensor *t, const char *name, const al_json *e, const uint8_t *data,
                       size_t data_len, const char *what, char *errstr, size_t errlen)
{
    if (e->type != AL_JSON_OBJECT)
        return al_err(errstr, errlen, "%s: tensor \"%s\": header entry is not an object",
                            what, name);
    const char *dt = al_json_get_string(e, "dtype", NULL);
    if (!dt) return al_err(errstr, errlen, "%s: tensor \"%s\": no dtype", what, name);
    if (!strcmp(dt, "F32"))
        t->dtype = AL_ST_DTYPE_F32;
    else if (!strcmp(dt, "BF16"))
        t->dtype = AL_ST_DTYPE_BF16;
    else if (!strcmp(dt, "F16"))
        t->dtype = AL_ST_DTYPE_F16;
    else
        return al_err(errstr, errlen,
                            "%s: tensor \"%s\": unsupported dtype \"%s\" (F32, BF16 or F16)", what,
                            name, dt);
    const al_json *shape = al_json_get(e, "shape");
    if (!shape || shape->type != AL_JSON_ARRAY || shape->count > 8)
        return al_err(errstr, errlen,
                            "%s: tensor \"%s\": shape is not a list of at most 8 sizes", what,
                            name);
    t->ndim = (int)shape->count;
    size_t numel = 1;
    for (size_t i = 0; i < shape->count; i++) {
        const al_json *d = shape->items[i];
        if (d->type != AL_JSON_NUMBER || !d->is_integer || d->integer < 0 ||
            d->integer > (int64_t)1 << 40)
            return al_err(errstr, errlen, "%s: tensor \"%s\": bad dimension in shape", what,
                                name);
        t->shape[i] = d->integer;
        if (d->integer && numel > SIZE_MAX / 8 / (size_t)d->integer)
            return al_err(errstr, errlen, "%s: tensor \"%s\": shape overflows", what, name);
        numel *= (size_t)d->integer;
    }
    t->numel = numel;
    const al_json *off = al_json_get(e, "data_offsets");
    if (!off || off->type != AL_JSON_ARRAY || off->count != 2 ||
        off->items[0]->type != AL_JSON_NUMBER || !off->items[0]->is_integer ||
        off->items[1]->type != AL_JSON_NUMBER || !off->items[1]->is_integer)
        return al_err(errstr, errlen, "%s: tensor \"%s\": data_offsets is not [begin, end]",
                            what, name);
    int64_t b = off->items[0]->integer, en = off->items[1]->integer;
    if (b < 0 || en < b || (uint64_t)en > data_len)
        return al_err(
            errstr, errlen,
            "%s: tensor \"%s\": data_offsets [%lld, %lld] out of range (data is %zu "
            "bytes; file truncated?)",
            what, name, (long long)b, (long long)en, data_len);
    t->nbytes = (size_t)(en - b);
    if (t->nbytes != numel * dtype_size(t->dtype))
        return al_err(errstr, errlen,
                            "%s: tensor \"%s\": %zu bytes do not hold shape of %zu %s values", what,
                            name, t->nbytes, numel, dtype_name(t->dtype));
    t->data = data + b;
    return 0;
}

/* al_st_parse for malloc'd (mapped = 0) or mmap'd (mapped = 1) bytes; on failure the bytes
 * are released the way they were obtained. */
static int st_parse(al_st_file *f, uint8_t *bytes, size_t len, int mapped, const char *what,
                    char *errstr, size_t errlen)
{
    memset(f, 0, sizeof *f);
    f->bytes = bytes, f->len = len, f->mapped = mapped;
    if (len < 8) {
        al_err(errstr, errlen, "%s: truncated: %zu bytes, no header length", what, len);
        goto fail;
    }
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = (hlen << 8) | bytes[i];
    if (hlen > len - 8) {
        al_err(errstr, errlen,
                     "%s: header length %llu runs past the end of the file (%zu bytes)", what,
                     (unsigned long long)hlen, len);
        goto fail;
    }
    if (hlen > ST_MAX_HEADER || hlen < 2) {
        al_err(errstr, errlen, "%s: implausible header length %llu", what,
                     (unsigned long long)hlen);
        goto fail;
    }
    char jerr[200];
    al_json *root = al_json_parse((const char *)bytes + 8, (size_t)hlen, jerr, sizeof jerr);
    if (!root) {
        al_err(errstr, errlen, "%s: header is not valid JSON: %s", what, jerr);
        goto fail;
    }
    if (root->type != AL_JSON_OBJECT) {
        al_err(errstr, errlen, "%s: header is not a JSON object", what);
        al_json_free(root);
        goto fail;
    }
    const uint8_t *data = bytes + 8 + hlen;
    size_t data_len = len - 8 - (size_t)hlen;
    f->tensors = calloc(root->count ? root->count : 1, sizeof *f->tensors);
    if (!f->tensors) {
        al_err(errstr, errlen, "%s: out of memory", what);
        al_json_free(root);
        goto fail;
    }
    for (size_t i = 0; i < root->count; i++) {
        const char *name = root->keys[i];
        if (!strcmp(name, "__metadata__")) continue;
        if (root->key_lens[i] != strlen(name)) {
            al_err(errstr, errlen, "%s: tensor name with a NUL byte", what);
            al_json_free(root);
            goto fail;
        }
        al_st_tensor *t = &f->tensors[f->ntensors];
        if (parse_entry(t, name, root->items[i], data, data_len, what, errstr, errlen)) {
            al_json_free(root);
            goto fail;
        }
        t->name = strdup(name);
        if (!t->name) {
            al_err(errstr, errlen, "%s: out of memory", what);
            al_json_free(root);
            goto fail;
        }
        f->ntensors++;
    }
    al_json_free(root);

    if (f->ntensors > 1) {
        al_st_tensor **v = malloc(sizeof *v * f->ntensors);
        if (!v) {
            al_err(errstr, errlen, "%s: out of memory", what);
            goto fail;
        }
        for (size_t i = 0; i < f->ntensors; i++)
            v[i] = &f->tensors[i];
        qsort(v, f->ntensors, sizeof *v, cmp_by_name);
        for (size_t i = 1; i < f->ntensors; i++)
            if (!strcmp(v[i - 1]->name, v[i]->name)) {
                al_err(errstr, errlen, "%s: tensor \"%s\" appears twice", what, v[i]->name);
                free(v);
                goto fail;
            }
        qsort(v, f->ntensors, sizeof *v, cmp_by_begin);
        for (size_t i = 1; i < f->ntensors; i++)
            if (v[i]->data < v[i - 1]->data + v[i - 1]->nbytes && v[i]->nbytes &&
                v[i - 1]->nbytes) {
                al_err(errstr, errlen, "%s: tensors \"%s\" and \"%s\" overlap", what,
                             v[i - 1]->name, v[i]->name);
                free(v);
                goto fail;
            }
        free(v);
    }
    return 0;
fail:
    al_st_close(f);
    return -1;
}

int al_st_parse(al_st_file *f, uint8_t *bytes, size_t len, const char *what, char *errstr,
                size_t errlen)
{
    return st_parse(f, bytes, len, 0, what, errstr, errlen);
}

int al_st_open(al_st_file *f, const char *path, char *errstr, size_t errlen)
{
    memset(f, 0, sizeof *f);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return al_err(errstr, errlen, "%s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return al_err(errstr, errlen, "%s: not a regular file", path);
    }
    size_t len = (size_t)st.st_size;
    uint8_t *bytes = NULL;
    if (len > 0) {
        void *p = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            close(fd);
            return al_err(errstr, errlen, "%s: mmap: %s", path, strerror(errno));
        }
        bytes = p;
    }
    close(fd);
    return st_parse(f, bytes, len, len > 0, path, errstr, errlen);
}

const al_st_tensor *al_st_find(const al_st_file *f, const char *name)
{
    for (size_t i = 0; i < f->ntensors; i++)
        if (!strcmp(f->tensors[i].name, name)) return &f->tensors[i];
    return NULL;
}

static int is_dir(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

static int file_exists(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

/* Copies the model's tensors out of `files` (one or several shards) into m. Every model
 * tensor must be found exactly once with its shape; every file tensor must belong to the
 * model (a tied model tolerates an lm_head.weight). */
static int load_from_files(al_model *m, const al_st_file *files, const char *const *paths,
                           size_t nfiles, char *errstr, size_t errlen)
{
    const al_model_config *cfg = al_model_config_of(m);
    size_t nt = al_model_num_tensors(m);
    const al_model_tensor *tt = al_model_tensors(m);
    float *params = al_model_params(m);
    for (size_t i = 0; i < nt; i++) {
        const al_st_tensor *found = NULL;
        const char *where = NULL;
        for (size_t f = 0; f < nfiles; f++) {
            const al_st_tensor *t = al_st_find(&files[f], tt[i].name);
            if (!t) continue;
            if (found)
                return al_err(errstr, errlen, "tensor \"%s\" is in both %s and %s",
                                    tt[i].name, where, paths[f]);
            found = t, where = paths[f];
        }
        if (!found)
            return al_err(errstr, errlen, "%s: missing tensor \"%s\"",
                                nfiles == 1 ? paths[0] : "checkpoint", tt[i].name);
        int same = found->ndim == tt[i].ndim && found->shape[0] == tt[i].shape[0] &&
                   (tt[i].ndim < 2 || found->shape[1] == tt[i].shape[1]);
        if (!same) {
            char got[128] = "", *g = got;
            for (int d = 0; d < found->ndim && g < got + sizeof got - 24; d++)
                g += snprintf(g, (size_t)(got + sizeof got - g), "%s%lld", d ? ", " : "",
                              (long long)found->shape[d]);
            if (tt[i].ndim == 2)
                return al_err(
                    errstr, errlen,
                    "%s: tensor \"%s\" has shape [%s], the config needs [%lld, %lld]", where,
                    tt[i].name, got, (long long)tt[i].shape[0], (long long)tt[i].shape[1]);
            return al_err(errstr, errlen,
                                "%s: tensor \"%s\" has shape [%s], the config needs [%lld]", where,
                                tt[i].name, got, (long long)tt[i].shape[0]);
        }
        al_st_tensor_to_f32(found, params + tt[i].offset);
    }
    for (size_t f = 0; f < nfiles; f++)
        for (size_t i = 0; i < files[f].ntensors; i++) {
            const char *n = files[f].tensors[i].name;
            if (al_model_tensor_find(m, n)) continue;
            if (cfg->tie_word_embeddings && !strcmp(n, "lm_head.weight")) continue;
            return al_err(errstr, errlen,
                                "%s: tensor \"%s\" is not part of a %s model of this config",
                                paths[f], n, cfg->architecture);
        }
    return 0;
}

int al_model_load_st(al_model *m, const al_st_file *f, const char *what, char *errstr,
                     size_t errlen)
{
    const char *paths[1] = {what ? what : "safetensors"};
    return load_from_files(m, f, paths, 1, errstr, errlen);
}

/* Reads the shard list of a model.safetensors.index.json (the distinct file names of its
 * weight_map, each a plain name in the same directory). */
static int read_index(const char *index_path, char ***names, size_t *n, char *errstr, size_t errlen)
{
    size_t len;
    uint8_t *text = (uint8_t *)al_file_read(index_path, &len, errstr, errlen);
    if (!text) return -1;
    char jerr[200];
    al_json *root = al_json_parse((const char *)text, len, jerr, sizeof jerr);
    free(text);
    if (!root) return al_err(errstr, errlen, "%s: %s", index_path, jerr);
    const al_json *map = al_json_get(root, "weight_map");
    if (!map || map->type != AL_JSON_OBJECT) {
        al_json_free(root);
        return al_err(errstr, errlen, "%s: no weight_map object", index_path);
    }
    *names = calloc(map->count ? map->count : 1, sizeof **names);
    *n = 0;
    int rc = 0;
    for (size_t i = 0; i < map->count && *names; i++) {
        const al_json *v = map->items[i];
        if (v->type != AL_JSON_STRING || !v->string_len || strchr(v->string, '/') ||
            !strcmp(v->string, "..") || v->string_len != strlen(v->string)) {
            rc = al_err(errstr, errlen, "%s: weight_map entry \"%s\" is not a file name",
                              index_path, map->keys[i]);
            break;
        }
        size_t j = 0;
        while (j < *n && strcmp((*names)[j], v->string))
            j++;
        if (j == *n) {
            (*names)[*n] = strdup(v->string);
            if (!(*names)[*n]) {
                rc = al_err(errstr, errlen, "out of memory");
                break;
            }
            (*n)++;
        }
    }
    if (!*names) rc = al_err(errstr, errlen, "out of memory");
    al_json_free(root);
    return rc;
}

int al_model_load_safetensors(al_model *m, const char *path, char *errstr, size_t errlen)
{
    char buf[4096], dir[4096];
    const char *single = NULL, *index = NULL;
    if (is_dir(path)) {
        snprintf(dir, sizeof dir, "%s", path);
        snprintf(buf, sizeof buf, "%s/model.safetensors", path);
        if (file_exists(buf))
            single = buf;
        else {
            snprintf(buf, sizeof buf, "%s/model.safetensors.index.json", path);
            if (!file_exists(buf))
                return al_err(
                    errstr, errlen,
                    "%s: neither model.safetensors nor model.safetensors.index.json", path);
            index = buf;
        }
    } else {
        size_t n = strlen(path);
        if (n > 11 && !strcmp(path + n - 11, ".index.json"))
            index = path;
        else
            single = path;
        snprintf(dir, sizeof dir, "%s", path);
        char *slash = strrchr(dir, '/');
        if (slash)
            *slash = 0;
        else
            snprintf(dir, sizeof dir, ".");
    }
    char **names = NULL;
    size_t nfiles = 0;
    if (single) {
        names = calloc(1, sizeof *names);
        if (!names || !(names[0] = strdup(single))) {
            free(names);
            return al_err(errstr, errlen, "out of memory");
        }
        nfiles = 1;
    } else {
        if (read_index(index, &names, &nfiles, errstr, errlen)) goto free_names_fail;
        for (size_t i = 0; i < nfiles; i++) {
            size_t need = strlen(dir) + strlen(names[i]) + 2;
            char *full = malloc(need);
            if (!full) {
                al_err(errstr, errlen, "out of memory");
                goto free_names_fail;
            }
            snprintf(full, need, "%s/%s", dir, names[i]);
            free(names[i]);
            names[i] = full;
        }
    }
    al_st_file *files = calloc(nfiles ? nfiles : 1, sizeof *files);
    int rc = -1;
    size_t opened = 0;
    if (!files)
        al_err(errstr, errlen, "out of memory");
    else {
        for (; opened < nfiles; opened++)
            if (al_st_open(&files[opened], names[opened], errstr, errlen)) break;
        if (opened == nfiles)
            rc = load_from_files(m, files, (const char *const *)names, nfiles, errstr, errlen);
        for (size_t i = 0; i < opened; i++)
            al_st_close(&files[i]);
        free(files);
    }
    for (size_t i = 0; i < nfiles; i++)
        free(names[i]);
    free(names);
    return rc;
free_names_fail:
    if (names)
        for (size_t i = 0; i < nfiles; i++)
            free(names[i]);
    free(names);
    return -1;
}

int al_model_save_safetensors(const al_model *m, const char *path, al_st_dtype dtype, char *errstr,
                              size_t errlen)
{
    if (dtype != AL_ST_DTYPE_F32 && dtype != AL_ST_DTYPE_BF16)
        return al_err(errstr, errlen, "%s: can only write F32 or BF16", path);
    size_t nt = al_model_num_tensors(m), es = dtype_size(dtype), off = 0;
    const al_model_tensor *tt = al_model_tensors(m);
    al_buf h = {0};
    al_buf_printf(&h, "{\"__metadata__\":{\"format\":\"pt\"}");
    for (size_t i = 0; i < nt; i++) {
        al_buf_printf(&h, ",");
        al_json_quote(&h, tt[i].name, strlen(tt[i].name));
        al_buf_printf(&h, ":{\"dtype\":\"%s\",\"shape\":[%lld", dtype_name(dtype),
                           (long long)tt[i].shape[0]);
        if (tt[i].ndim == 2) al_buf_printf(&h, ",%lld", (long long)tt[i].shape[1]);
        al_buf_printf(&h, "],\"data_offsets\":[%zu,%zu]}", off, off + tt[i].numel * es);
        off += tt[i].numel * es;
    }
    al_buf_printf(&h, "}");
    while (!h.oom && h.len % 8)
        al_buf_printf(&h, " ");
    if (h.oom) {
        free(h.data);
        return al_err(errstr, errlen, "%s: out of memory", path);
    }
    char tmp[4200];
    FILE *f = open_tmp(path, tmp, sizeof tmp, errstr, errlen);
    if (!f) {
        free(h.data);
        return -1;
    }
    uint8_t lenbuf[8];
    for (int i = 0; i < 8; i++)
        lenbuf[i] = (uint8_t)((uint64_t)h.len >> (8 * i));
    int ok = fwrite(lenbuf, 1, 8, f) == 8 && fwrite(h.data, 1, h.len, f) == h.len;
    free(h.data);
    const float *params = al_model_params_read((al_model *)m);
    uint16_t chunk[4096];
    for (size_t i = 0; i < nt && ok; i++) {
        const float *src = params + tt[i].offset;
        if (dtype == AL_ST_DTYPE_F32) {
            ok = fwrite(src, 4, tt[i].numel, f) == tt[i].numel;
            continue;
        }
        for (size_t j = 0; j < tt[i].numel && ok; j += 4096) {
            size_t n = tt[i].numel - j < 4096 ? tt[i].numel - j : 4096;
            for (size_t k = 0; k < n; k++)
                chunk[k] = al_f32_to_bf16(src[j + k]);
            ok = fwrite(chunk, 2, n, f) == n;
        }
    }
    return finish_atomic(f, tmp, path, ok, errstr, errlen);
}

/* mkdir -p */
static int make_dirs(const char *dir, char *errstr, size_t errlen)
{
    char p[4096];
    snprintf(p, sizeof p, "%s", dir);
    for (char *s = p + 1; *s; s++) {
        if (*s != '/') continue;
        *s = 0;
        if (mkdir(p, 0755) != 0 && errno != EEXIST)
            return al_err(errstr, errlen, "%s: %s", p, strerror(errno));
        *s = '/';
    }
    if (mkdir(p, 0755) != 0 && errno != EEXIST)
        return al_err(errstr, errlen, "%s: %s", p, strerror(errno));
    if (!is_dir(p)) return al_err(errstr, errlen, "%s: not a directory", p);
    return 0;
}

int al_model_save_dir(const al_model *m, const char *dir, al_st_dtype dtype, char *errstr,
                      size_t errlen)
{
    if (make_dirs(dir, errstr, errlen)) return -1;
    char path[4200];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if (al_model_save_safetensors(m, path, dtype, errstr, errlen)) return -1;
    snprintf(path, sizeof path, "%s/config.json", dir);
    return al_model_config_save(al_model_config_of(m),
                                dtype == AL_ST_DTYPE_BF16 ? "bfloat16" : "float32", path, errstr,
                                errlen);
}

int al_model_dir_ready(const char *dir)
{
    char path[4200];
    struct stat st;
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (stat(path, &st) != 0) return 0;
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if (stat(path, &st) == 0) return 1;
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    return stat(path, &st) == 0;
}

int al_model_dir_wait(const char *dir, int timeout_s, char *errstr, size_t errlen)
{
    for (int64_t waited_ms = 0;; waited_ms += 200) {
        if (al_model_dir_ready(dir)) return 0;
        if (waited_ms >= (int64_t)timeout_s * 1000) break;
        usleep(200 * 1000);
    }
    snprintf(errstr, errlen, "%s: no config.json and model.safetensors after %d s", dir, timeout_s);
    return -1;
}

al_model *al_model_load_dir(const char *dir, char *errstr, size_t errlen)
{
    al_model_config cfg;
    if (al_model_config_load(&cfg, dir, errstr, errlen)) return NULL;
    al_model *m = al_model_new(&cfg, errstr, errlen);
    if (!m) return NULL;
    if (al_model_load_safetensors(m, dir, errstr, errlen)) {
        al_model_free(m);
        return NULL;
    }
    return m;
}
