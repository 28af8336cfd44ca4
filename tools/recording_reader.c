/*
 * recording_reader.c: a bounded reader for Avro object container files of
 * ai.arclight.Recording records (see recording_reader.h). Container layout (Avro spec):
 *   "Obj" 1 | metadata map<bytes> (avro.schema, avro.codec) | 16-byte sync marker
 *   then blocks: record count (long) | byte size (long) | data | the sync marker
 */
#include "recording_reader.h"

#include "avro/registry.h"
#include "core/util.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <zlib.h>

/* A decoded block may not exceed this (record writes 4 MiB blocks, more only for a message
 * bigger than that; Kafka messages stay far below). */
#define MAX_BLOCK_BYTES ((size_t)512 << 20)
#define MAX_META_BYTES ((int64_t)16 << 20)

enum { CODEC_NULL, CODEC_DEFLATE, CODEC_SNAPPY };
static const char *codec_names[] = {"null", "deflate", "snappy"};

struct al_recording_reader {
    FILE *f;
    char *path;
    int64_t file_size;
    uint8_t sync[16];
    int codec;
    uint8_t *raw; /* the block as stored */
    size_t raw_cap;
    uint8_t *data; /* the block decoded */
    size_t data_cap, data_len, pos;
    int64_t left_in_block; /* records still to decode in the current block */
    long long index;       /* records returned so far */
    uint8_t *topic;
    size_t topic_cap;
    al_recording_header *hdrs;
    size_t hdrs_cap;
};

/* ---- reading the file ---- */

/* A zigzag varint long from the file. 0, 1 at a clean end of file before its first byte,
 * -1 on a truncated or overlong varint. */
static int file_long(FILE *f, int64_t *out)
{
    uint64_t v = 0;
    for (int shift = 0; shift < 70; shift += 7) {
        int c = fgetc(f);
        if (c == EOF) return shift == 0 ? 1 : -1;
        v |= (uint64_t)(c & 0x7f) << shift;
        if (!(c & 0x80)) {
            *out = (int64_t)(v >> 1) ^ -(int64_t)(v & 1);
            return 0;
        }
    }
    return -1;
}

static int64_t file_left(al_recording_reader *r)
{
    long at = ftell(r->f);
    return at < 0 ? 0 : r->file_size - at;
}

/* Reads a length-prefixed byte string of at most max bytes into a malloc'd buffer with a
 * NUL after it. NULL with errstr. */
static char *file_bytes(al_recording_reader *r, int64_t max, size_t *len_out, char *errstr,
                        size_t errlen)
{
    int64_t n;
    if (file_long(r->f, &n) != 0) {
        al_err(errstr, errlen, "%s: truncated container header", r->path);
        return NULL;
    }
    if (n < 0 || n > max || n > file_left(r)) {
        al_err(errstr, errlen, "%s: container header holds a string of %lld bytes", r->path,
               (long long)n);
        return NULL;
    }
    char *s = malloc((size_t)n + 1);
    if (!s) {
        al_err(errstr, errlen, "out of memory");
        return NULL;
    }
    if (n && fread(s, 1, (size_t)n, r->f) != (size_t)n) {
        free(s);
        al_err(errstr, errlen, "%s: truncated container header", r->path);
        return NULL;
    }
    s[n] = '\0';
    if (len_out) *len_out = (size_t)n;
    return s;
}

/* The writer schema must be the Recording schema this build reads. 0, or -1 with errstr
 * naming what the file holds instead. */
static int check_schema(al_recording_reader *r, const char *schema_json, char *errstr,
                        size_t errlen)
{
    const al_schema_info *want = al_schema_by_name("ai.arclight.Recording");
    uint64_t fp = 0;
    char err[256];
    if (!want)
        return al_err(errstr, errlen,
                      "the Recording schema is not built in "
                      "(schemas/Recording.avsc missing at build time)");
    if (al_avro_fingerprint(schema_json, &fp, err, sizeof err) == 0 && fp == want->fingerprint)
        return 0;
    json_t *j = json_loads(schema_json, 0, NULL);
    if (!j) return al_err(errstr, errlen, "%s: the container's schema is not valid JSON", r->path);
    const char *name = json_is_object(j) ? json_string_value(json_object_get(j, "name")) : NULL;
    if (name && (strcmp(name, "Recording") == 0 || strcmp(name, "ai.arclight.Recording") == 0))
        al_err(errstr, errlen,
               "%s holds Recording records of a schema version this build does "
               "not read (fingerprint %016llx)",
               r->path, (unsigned long long)fp);
    else
        al_err(errstr, errlen,
               "%s holds %s records, not arclight recordings "
               "(ai.arclight.Recording)",
               r->path, name ? name : "non-record");
    json_decref(j);
    return -1;
}

void al_recording_close(al_recording_reader *r)
{
    if (!r) return;
    if (r->f) fclose(r->f);
    free(r->path);
    free(r->raw);
    free(r->data);
    free(r->topic);
    free(r->hdrs);
    free(r);
}

al_recording_reader *al_recording_open(const char *path, char *errstr, size_t errlen)
{
    al_recording_reader *r = calloc(1, sizeof *r);
    char *schema = NULL;
    if (!r || !(r->path = strdup(path))) {
        al_err(errstr, errlen, "out of memory");
        free(r);
        return NULL;
    }
    r->f = fopen(path, "rb");
    struct stat st;
    if (!r->f || fstat(fileno(r->f), &st) != 0) {
        al_err(errstr, errlen, "cannot open %s: %s", path, strerror(errno));
        goto fail;
    }
    r->file_size = st.st_size;
    unsigned char magic[4];
    if (fread(magic, 1, 4, r->f) != 4 || memcmp(magic, "Obj\x01", 4) != 0) {
        al_err(errstr, errlen, "%s is not an Avro container file (no 'Obj\\x01' magic)", path);
        goto fail;
    }
    int have_codec = 0;
    int64_t meta = 0;
    for (;;) {
        int64_t count;
        if (file_long(r->f, &count) != 0) {
            al_err(errstr, errlen, "%s: truncated container header", path);
            goto fail;
        }
        if (count == 0) break;
        if (count < 0) { /* a block with its byte size: skip the size */
            int64_t bytes;
            if (count == INT64_MIN || file_long(r->f, &bytes) != 0) {
                al_err(errstr, errlen, "%s: bad container header", path);
                goto fail;
            }
            count = -count;
        }
        for (int64_t i = 0; i < count; i++) {
            size_t vlen;
            char *k = file_bytes(r, 4096, NULL, errstr, errlen);
            if (!k) goto fail;
            char *v = file_bytes(r, MAX_META_BYTES, &vlen, errstr, errlen);
            if (!v) {
                free(k);
                goto fail;
            }
            meta += (int64_t)vlen;
            if (strcmp(k, "avro.schema") == 0) {
                free(schema);
                schema = v;
                v = NULL;
            } else if (strcmp(k, "avro.codec") == 0) {
                have_codec = 1;
                if (strcmp(v, "null") == 0)
                    r->codec = CODEC_NULL;
                else if (strcmp(v, "deflate") == 0)
                    r->codec = CODEC_DEFLATE;
                else if (strcmp(v, "snappy") == 0)
                    r->codec = CODEC_SNAPPY;
                else {
                    al_err(errstr, errlen,
                           "%s uses codec '%.40s'; replay reads null, deflate "
                           "and snappy",
                           path, v);
                    free(k);
                    free(v);
                    goto fail;
                }
            }
            free(k);
            free(v);
            if (meta > MAX_META_BYTES) {
                al_err(errstr, errlen, "%s: container header is too large", path);
                goto fail;
            }
        }
    }
    (void)have_codec; /* absent means null */
    if (!schema) {
        al_err(errstr, errlen, "%s: container header has no avro.schema", path);
        goto fail;
    }
    if (fread(r->sync, 1, 16, r->f) != 16) {
        al_err(errstr, errlen, "%s: truncated container header (sync marker)", path);
        goto fail;
    }
    if (check_schema(r, schema, errstr, errlen) != 0) goto fail;
    free(schema);
    return r;
fail:
    free(schema);
    al_recording_close(r);
    return NULL;
}

const char *al_recording_codec(const al_recording_reader *r)
{
    return codec_names[r->codec];
}

/* ---- block decoding ---- */

static int ensure(uint8_t **buf, size_t *cap, size_t need)
{
    if (need <= *cap) return 0;
    size_t c = *cap ? *cap : 65536;
    while (c < need)
        c *= 2;
    uint8_t *nb = realloc(*buf, c);
    if (!nb) return -1;
    *buf = nb;
    *cap = c;
    return 0;
}

/* Raw deflate (RFC 1951), as Avro's deflate codec stores it. */
static int inflate_block(al_recording_reader *r, size_t n, char *errstr, size_t errlen)
{
    z_stream z;
    memset(&z, 0, sizeof z);
    if (inflateInit2(&z, -15) != Z_OK) return al_err(errstr, errlen, "zlib: cannot initialise");
    z.next_in = r->raw;
    z.avail_in = (uInt)n;
    size_t out = 0;
    int rc;
    do {
        if (out == r->data_cap &&
            (out >= MAX_BLOCK_BYTES || ensure(&r->data, &r->data_cap, out + 1) != 0)) {
            inflateEnd(&z);
            return al_err(errstr, errlen, "%s: a block inflates beyond %zu MiB", r->path,
                          MAX_BLOCK_BYTES >> 20);
        }
        z.next_out = r->data + out;
        z.avail_out = (uInt)(r->data_cap - out);
        rc = inflate(&z, Z_NO_FLUSH);
        out = r->data_cap - z.avail_out;
    } while (rc == Z_OK);
    inflateEnd(&z);
    if (rc != Z_STREAM_END)
        return al_err(errstr, errlen, "%s: corrupt deflate block (%s)", r->path,
                      z.msg ? z.msg : "truncated");
    r->data_len = out;
    return 0;
}

/* Snappy's raw format: a varint length, then literals and back-references. Every length
 * and offset is checked against the input and the declared output size. */
static int snappy_block(al_recording_reader *r, size_t n, char *errstr, size_t errlen)
{
    if (n < 4) return al_err(errstr, errlen, "%s: snappy block too short", r->path);
    const uint8_t *ip = r->raw, *end = r->raw + n - 4; /* a CRC-32 follows the data */
    uint64_t ulen = 0;
    int shift = 0;
    for (;;) {
        if (ip >= end || shift > 28)
            return al_err(errstr, errlen, "%s: bad snappy length", r->path);
        ulen |= (uint64_t)(*ip & 0x7f) << shift;
        shift += 7;
        if (!(*ip++ & 0x80)) break;
    }
    if (ulen > MAX_BLOCK_BYTES || ensure(&r->data, &r->data_cap, ulen ? ulen : 1) != 0)
        return al_err(errstr, errlen, "%s: snappy block of %llu bytes is too large", r->path,
                      (unsigned long long)ulen);
    uint8_t *out = r->data;
    size_t op = 0;
    while (ip < end) {
        uint8_t tag = *ip++;
        size_t len, off = 0;
        if ((tag & 3) == 0) {
            len = tag >> 2;
            if (len >= 60) {
                size_t nb = len - 59;
                if ((size_t)(end - ip) < nb) goto bad;
                len = 0;
                for (size_t i = 0; i < nb; i++)
                    len |= (size_t)ip[i] << (8 * i);
                ip += nb;
            }
            len += 1;
            if ((size_t)(end - ip) < len || ulen - op < len) goto bad;
            memcpy(out + op, ip, len);
            ip += len;
            op += len;
            continue;
        }
        if ((tag & 3) == 1) {
            if (end - ip < 1) goto bad;
            len = ((tag >> 2) & 7) + 4;
            off = ((size_t)(tag >> 5) << 8) | *ip++;
        } else if ((tag & 3) == 2) {
            if (end - ip < 2) goto bad;
            len = (tag >> 2) + 1;
            off = ip[0] | (size_t)ip[1] << 8;
            ip += 2;
        } else {
            if (end - ip < 4) goto bad;
            len = (tag >> 2) + 1;
            off = ip[0] | (size_t)ip[1] << 8 | (size_t)ip[2] << 16 | (size_t)ip[3] << 24;
            ip += 4;
        }
        if (off == 0 || off > op || ulen - op < len) goto bad;
        for (size_t i = 0; i < len; i++, op++)
            out[op] = out[op - off]; /* may overlap */
    }
    if (op != ulen) goto bad;
    uint32_t want =
        (uint32_t)end[0] << 24 | (uint32_t)end[1] << 16 | (uint32_t)end[2] << 8 | end[3];
    if ((uint32_t)crc32(0L, out, (uInt)ulen) != want)
        return al_err(errstr, errlen, "%s: snappy block fails its CRC-32", r->path);
    r->data_len = ulen;
    return 0;
bad:
    return al_err(errstr, errlen, "%s: corrupt snappy block", r->path);
}

/* Reads the next block: 1 with records to decode, 0 at the end of the file, -1. */
static int next_block(al_recording_reader *r, char *errstr, size_t errlen)
{
    for (;;) {
        int64_t count, size;
        int e = file_long(r->f, &count);
        if (e == 1) return 0;
        if (e != 0 || file_long(r->f, &size) != 0)
            return al_err(errstr, errlen, "%s: truncated block header after record %lld", r->path,
                          r->index);
        if (count < 0 || size < 0 || size > file_left(r) - 16 || (size_t)size > MAX_BLOCK_BYTES)
            return al_err(errstr, errlen,
                          "%s: bad block header after record %lld (%lld "
                          "records in %lld bytes, %lld bytes left in the file)",
                          r->path, r->index, (long long)count, (long long)size,
                          (long long)file_left(r));
        if (ensure(&r->raw, &r->raw_cap, (size_t)size + 1) != 0)
            return al_err(errstr, errlen, "out of memory");
        uint8_t sync[16];
        if (fread(r->raw, 1, (size_t)size, r->f) != (size_t)size || fread(sync, 1, 16, r->f) != 16)
            return al_err(errstr, errlen, "%s: truncated block after record %lld", r->path,
                          r->index);
        if (memcmp(sync, r->sync, 16) != 0)
            return al_err(errstr, errlen, "%s: bad sync marker after record %lld", r->path,
                          r->index);
        if (r->codec == CODEC_NULL) {
            uint8_t *t = r->data;
            size_t tc = r->data_cap;
            r->data = r->raw;
            r->data_cap = r->raw_cap;
            r->raw = t;
            r->raw_cap = tc;
            r->data_len = (size_t)size;
        } else if (r->codec == CODEC_DEFLATE) {
            if (inflate_block(r, (size_t)size, errstr, errlen) != 0) return -1;
        } else if (snappy_block(r, (size_t)size, errstr, errlen) != 0) {
            return -1;
        }
        /* every record takes at least one byte */
        if ((uint64_t)count > r->data_len)
            return al_err(errstr, errlen, "%s: block claims %lld records in %zu bytes", r->path,
                          (long long)count, r->data_len);
        r->pos = 0;
        r->left_in_block = count;
        if (count > 0) return 1;
        if (r->data_len != 0)
            return al_err(errstr, errlen, "%s: empty block with %zu bytes", r->path, r->data_len);
    }
}

/* ---- record decoding, bounded by the block ---- */

static int cur_long(al_recording_reader *r, int64_t *out)
{
    uint64_t v = 0;
    for (int shift = 0; shift < 70; shift += 7) {
        if (r->pos >= r->data_len) return -1;
        uint8_t c = r->data[r->pos++];
        v |= (uint64_t)(c & 0x7f) << shift;
        if (!(c & 0x80)) {
            *out = (int64_t)(v >> 1) ^ -(int64_t)(v & 1);
            return 0;
        }
    }
    return -1;
}

static int cur_bytes(al_recording_reader *r, const uint8_t **p, size_t *n)
{
    int64_t len;
    if (cur_long(r, &len) != 0 || len < 0 || (uint64_t)len > r->data_len - r->pos) return -1;
    *p = r->data + r->pos;
    *n = (size_t)len;
    r->pos += (size_t)len;
    return 0;
}

/* ["null","bytes"]: *p NULL for null. */
static int cur_nullable_bytes(al_recording_reader *r, const uint8_t **p, size_t *n)
{
    int64_t branch;
    if (cur_long(r, &branch) != 0) return -1;
    if (branch == 0) {
        *p = NULL;
        *n = 0;
        return 0;
    }
    if (branch != 1) return -1;
    return cur_bytes(r, p, n);
}

int al_recording_next(al_recording_reader *r, al_recorded *m, char *errstr, size_t errlen)
{
    const char *what;
    int64_t v;
    const uint8_t *p;
    size_t n;
    if (r->left_in_block == 0) {
        int b = next_block(r, errstr, errlen);
        if (b <= 0) return b;
    }
    memset(m, 0, sizeof *m);
    what = "topic";
    if (cur_bytes(r, &p, &n) != 0) goto bad;
    if (ensure(&r->topic, &r->topic_cap, n + 1) != 0)
        return al_err(errstr, errlen, "out of memory");
    memcpy(r->topic, p, n);
    r->topic[n] = '\0';
    what = "topic (holds a NUL byte)";
    if (n == 0 || memchr(r->topic, '\0', n)) goto bad;
    m->topic = (const char *)r->topic;
    what = "partition";
    if (cur_long(r, &v) != 0 || v < -1 || v > INT32_MAX) goto bad;
    m->partition = (int32_t)v;
    what = "offset";
    if (cur_long(r, &m->offset) != 0) goto bad;
    what = "timestamp";
    if (cur_long(r, &m->timestamp) != 0) goto bad;
    what = "timestamp_type";
    if (cur_long(r, &v) != 0 || v < 0 || v > 2) goto bad;
    m->timestamp_type = (int)v;
    what = "key";
    if (cur_nullable_bytes(r, &m->key, &m->key_len) != 0) goto bad;
    what = "value";
    if (cur_nullable_bytes(r, &m->value, &m->value_len) != 0) goto bad;
    what = "headers";
    size_t nh = 0;
    for (;;) {
        int64_t count;
        if (cur_long(r, &count) != 0) goto bad;
        if (count == 0) break;
        if (count < 0) {
            int64_t bytes;
            if (count == INT64_MIN || cur_long(r, &bytes) != 0) goto bad;
            count = -count;
        }
        /* a header takes at least two bytes */
        if ((uint64_t)count > (r->data_len - r->pos) / 2) goto bad;
        if (nh + (size_t)count > r->hdrs_cap) {
            size_t cap = (nh + (size_t)count) * 2;
            al_recording_header *nhd = realloc(r->hdrs, cap * sizeof *nhd);
            if (!nhd) return al_err(errstr, errlen, "out of memory");
            r->hdrs = nhd;
            r->hdrs_cap = cap;
        }
        for (int64_t i = 0; i < count; i++, nh++) {
            if (cur_bytes(r, &p, &n) != 0) goto bad;
            r->hdrs[nh].name = (const char *)p;
            r->hdrs[nh].name_len = n;
            if (cur_nullable_bytes(r, &r->hdrs[nh].value, &r->hdrs[nh].value_len) != 0) goto bad;
        }
    }
    m->headers = r->hdrs;
    m->n_headers = nh;
    r->left_in_block--;
    if (r->left_in_block == 0 && r->pos != r->data_len)
        return al_err(errstr, errlen, "%s: %zu stray bytes after record %lld", r->path,
                      r->data_len - r->pos, r->index);
    r->index++;
    return 1;
bad:
    return al_err(errstr, errlen, "%s: record %lld: bad or truncated %s", r->path, r->index, what);
}

long long al_recording_count(al_recording_reader *r, char *errstr, size_t errlen)
{
    long at = ftell(r->f);
    long long total = 0;
    if (at < 0) return al_err(errstr, errlen, "%s: cannot tell position", r->path);
    for (;;) {
        int64_t count, size;
        int e = file_long(r->f, &count);
        if (e == 1) break;
        if (e != 0 || file_long(r->f, &size) != 0 || count < 0 || size < 0 ||
            size > file_left(r) - 16 || fseek(r->f, (long)size + 16, SEEK_CUR) != 0) {
            fseek(r->f, at, SEEK_SET);
            return al_err(errstr, errlen, "%s: bad block framing after %lld records", r->path,
                          total);
        }
        total += count;
    }
    fseek(r->f, at, SEEK_SET);
    return total;
}
