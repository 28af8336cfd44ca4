/*
 * codec_common.c: what every typed codec shares: framing checks, and the readers that
 * copy strings, bytes and packed arrays into a message's arena.
 */
#include "avro/binary.h"
#include "avro/codec.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int al_codec_oom(char *errstr, size_t errlen, const char *what)
{
    return al_err(errstr, errlen, "out of memory while %s", what);
}

uint64_t al_codec_current_fp(const char *fullname)
{
    const al_schema_info *in = al_schema_by_name(fullname);
    if (!in) {
        fprintf(stderr, "arclight: schema %s is not embedded in this build\n", fullname);
        abort();
    }
    return in->fingerprint;
}

static uint64_t read_fp(const uint8_t *p)
{
    uint64_t fp = 0;
    for (int i = 7; i >= 0; i--) fp = (fp << 8) | p[2 + i];
    return fp;
}

const al_schema_info *al_avro_peek(const void *buf, size_t len, char *errstr, size_t errlen)
{
    const uint8_t *p = buf;
    if (len < AL_AVRO_HEADER_LEN) {
        al_err(errstr, errlen,
               "truncated: %zu bytes, a single-object encoded message has at least %d", len,
               AL_AVRO_HEADER_LEN);
        return NULL;
    }
    if (p[0] != AL_AVRO_MAGIC0 || p[1] != AL_AVRO_MAGIC1) {
        al_err(errstr, errlen, "bad magic: %02x %02x, expected c3 01 (Avro single-object encoding)",
               p[0], p[1]);
        return NULL;
    }
    uint64_t fp = read_fp(p);
    const al_schema_info *in = al_schema_by_fingerprint(fp);
    if (!in)
        al_err(errstr, errlen, "unknown schema fingerprint %016llx",
               (unsigned long long)fp);
    return in;
}

int al_codec_open(const void *buf, size_t len, const char *fullname, uint64_t fp, al_rd *r,
                  al_buf *resolved, char *errstr, size_t errlen)
{
    const uint8_t *p = buf;
    if (!buf && len) return al_err(errstr, errlen, "no message (NULL buffer)");
    if (len >= AL_AVRO_HEADER_LEN && p[0] == AL_AVRO_MAGIC0 && p[1] == AL_AVRO_MAGIC1 &&
        read_fp(p) == fp) {
        r->base = p;
        r->p = p + AL_AVRO_HEADER_LEN;
        r->end = p + len;
        r->errstr = errstr;
        r->errlen = errlen;
        return 0;
    }
    const al_schema_info *in = al_avro_peek(buf, len, errstr, errlen);
    if (!in) return -1;
    if (strcmp(in->name, fullname) != 0)
        return al_err(errstr, errlen, "wrong schema: the message is a %s, expected a %s",
                      in->name, fullname);
    const al_schema_info *cur = al_schema_by_name(fullname);
    if (al_avro_resolve(buf, len, cur->json, resolved, errstr, errlen)) {
        al_buf_free(resolved);
        return -1;
    }
    return 1;
}

int al_codec_finish(const al_rd *r, const char *schema)
{
    if (r->p != r->end)
        return al_err(r->errstr, r->errlen,
                      "trailing bytes: %zu bytes left after the end of the %s at offset %zu",
                      al_rd_left(r), schema, al_rd_off(r));
    return 0;
}

int al_rd_string_a(al_rd *r, al_arena *a, const char *field, const char **out)
{
    size_t n;
    if (al_rd_len(r, field, &n)) return -1;
    if (n == 0) {
        *out = "";
        return 0;
    }
    if (memchr(r->p, 0, n))
        return al_err(r->errstr, r->errlen, "bad string: field %s contains a NUL byte at offset %zu",
                      field, al_rd_off(r));
    char *s = al_arena_alloc(a, n + 1);
    if (!s) return al_codec_oom(r->errstr, r->errlen, "decoding");
    memcpy(s, r->p, n);
    s[n] = '\0';
    r->p += n;
    *out = s;
    return 0;
}

int al_rd_opt_string_a(al_rd *r, al_arena *a, const char *field, const char **out)
{
    int64_t branch;
    if (al_rd_index(r, field, "union", 2, &branch)) return -1;
    if (branch == 0) {
        *out = NULL;
        return 0;
    }
    return al_rd_string_a(r, a, field, out);
}

int al_rd_bytes_a(al_rd *r, al_arena *a, const char *field, const uint8_t **out, size_t *n)
{
    static const uint8_t empty[1];
    if (al_rd_len(r, field, n)) return -1;
    if (*n == 0) {
        *out = empty;
        return 0;
    }
    uint8_t *d = al_arena_alloc(a, *n);
    if (!d) return al_codec_oom(r->errstr, r->errlen, "decoding");
    memcpy(d, r->p, *n);
    r->p += *n;
    *out = d;
    return 0;
}

int al_rd_opt_bytes_a(al_rd *r, al_arena *a, const char *field, const uint8_t **out,
                      size_t *n)
{
    int64_t branch;
    if (al_rd_index(r, field, "union", 2, &branch)) return -1;
    if (branch == 0) {
        *out = NULL;
        *n = 0;
        return 0;
    }
    return al_rd_bytes_a(r, a, field, out, n);
}

int al_rd_packed_a(al_rd *r, al_arena *a, const char *field, size_t elem, const void **out,
                   size_t *count)
{
    size_t off = al_rd_off(r), n;
    if (al_rd_len(r, field, &n)) return -1;
    if (n % elem)
        return al_err(r->errstr, r->errlen,
                      "bad packed array: field %s has %zu bytes, not a multiple of %zu, at offset %zu",
                      field, n, elem, off);
    *count = n / elem;
    if (n == 0) {
        *out = NULL;
        return 0;
    }
    uint8_t *d = al_arena_alloc(a, n);
    if (!d) return al_codec_oom(r->errstr, r->errlen, "decoding");
#ifndef AL_AVRO_BIG_ENDIAN
    memcpy(d, r->p, n);
#else
    for (size_t i = 0; i < n; i += elem)
        for (size_t k = 0; k < elem; k++) d[i + k] = r->p[i + elem - 1 - k];
#endif
    r->p += n;
    *out = d;
    return 0;
}

int al_wr_opt_string(al_buf *b, const char *s)
{
    if (!s) return al_wr_long(b, 0);
    if (al_wr_long(b, 1)) return -1;
    return al_wr_string(b, s);
}

int al_wr_opt_bytes(al_buf *b, const uint8_t *data, size_t n)
{
    if (!data) return al_wr_long(b, 0);
    if (al_wr_long(b, 1)) return -1;
    return al_wr_bytes(b, data, n);
}
