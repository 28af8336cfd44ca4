/*
 * deadletter.c: the DeadLetter codec (schemas/deadletter.avsc).
 */
#include "avro/binary.h"
#include "avro/codec.h"

#include <stdlib.h>
#include <string.h>

#define DL_NAME "ai.arclight.DeadLetter"

int al_deadletter_encode(const al_deadletter *d, al_buf *out, char *errstr, size_t errlen)
{
    uint64_t fp = AL_CODEC_FP(DL_NAME);
    if (d->n_headers && !d->headers)
        return al_err(errstr, errlen, "DeadLetter: n_headers is %zu but headers is NULL",
                      d->n_headers);
    int bad = al_wr_header(out, fp) || al_wr_string(out, d->source_topic) ||
              al_wr_long(out, d->partition) || al_wr_long(out, d->offset) ||
              al_wr_opt_bytes(out, d->key, d->key_len) ||
              al_wr_opt_bytes(out, d->value, d->value_len);
    if (!bad && d->n_headers) {
        bad = al_wr_long(out, (int64_t)d->n_headers);
        for (size_t i = 0; !bad && i < d->n_headers; i++)
            bad = al_wr_string(out, d->headers[i].key) ||
                  al_wr_opt_bytes(out, d->headers[i].value, d->headers[i].value_len);
    }
    bad = bad || al_wr_long(out, 0) || al_wr_string(out, d->reason) ||
          al_wr_string(out, d->stage) || al_wr_long(out, d->source_timestamp_us) ||
          al_wr_long(out, d->timestamp_us);
    if (bad) return al_codec_oom(errstr, errlen, "encoding a DeadLetter");
    return 0;
}

static int decode_body(al_rd *r, al_deadletter *d)
{
    al_arena *a = &d->arena;
    if (al_rd_string_a(r, a, "source_topic", &d->source_topic) ||
        al_rd_int(r, "partition", &d->partition) || al_rd_long(r, "offset", &d->offset) ||
        al_rd_opt_bytes_a(r, a, "key", &d->key, &d->key_len) ||
        al_rd_opt_bytes_a(r, a, "value", &d->value, &d->value_len))
        return -1;
    al_header *hs = NULL;
    size_t n = 0, block;
    for (;;) {
        /* a header takes at least 2 bytes: the key's length and the union branch */
        if (al_rd_block(r, "headers", 2, &block)) return -1;
        if (!block) break;
        al_header *grown = al_arena_alloc(a, (n + block) * sizeof *grown);
        if (!grown) return al_codec_oom(r->errstr, r->errlen, "decoding");
        if (n) memcpy(grown, hs, n * sizeof *hs);
        hs = grown;
        for (size_t i = 0; i < block; i++, n++)
            if (al_rd_string_a(r, a, "headers.key", &hs[n].key) ||
                al_rd_opt_bytes_a(r, a, "headers.value", &hs[n].value, &hs[n].value_len))
                return -1;
    }
    d->headers = hs;
    d->n_headers = n;
    if (al_rd_string_a(r, a, "reason", &d->reason) || al_rd_string_a(r, a, "stage", &d->stage) ||
        al_rd_long(r, "source_timestamp_us", &d->source_timestamp_us) ||
        al_rd_long(r, "timestamp_us", &d->timestamp_us))
        return -1;
    return al_codec_finish(r, "DeadLetter");
}

int al_deadletter_decode(const void *buf, size_t len, al_deadletter *d, char *errstr,
                         size_t errlen)
{
    al_rd r;
    al_buf resolved = {0};
    al_arena keep = d->arena;
    memset(d, 0, sizeof *d);
    d->arena = keep;
    al_arena_reset(&d->arena);
    int rc = al_codec_open(buf, len, DL_NAME, AL_CODEC_FP(DL_NAME), &r, &resolved,
                           errstr, errlen);
    if (rc == 1) {
        rc = al_deadletter_decode(resolved.data, resolved.len, d, errstr, errlen);
        al_buf_free(&resolved);
        return rc;
    }
    if (rc < 0) return -1;
    return decode_body(&r, d);
}

void al_deadletter_clear(al_deadletter *d)
{
    al_arena_free(&d->arena);
    memset(d, 0, sizeof *d);
}
