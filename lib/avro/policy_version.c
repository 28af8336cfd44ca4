/*
 * policy_version.c: the PolicyVersion codec (schemas/policy_version.avsc), the trainer's
 * output and the servers' and batcher's input.
 */
#include "avro/binary.h"
#include "avro/codec.h"

#include <stdlib.h>
#include <string.h>

#define PV_NAME "ai.arclight.PolicyVersion"

static int cmp_name(const void *a, const void *b)
{
    const char *x = *(const char *const *)a, *y = *(const char *const *)b;
    return strcmp(x ? x : "", y ? y : "");
}

/* An Avro map has unique keys: 1 with *which set when a name appears twice, 0 when none
 * does, -1 when out of memory. O(n log n), so a crafted map cannot make it slow. */
static int duplicate_name(const al_metric *m, size_t n, const char **which)
{
    if (n < 2) return 0;
    const char **names = malloc(n * sizeof *names);
    if (!names) return -1;
    for (size_t i = 0; i < n; i++) names[i] = m[i].name ? m[i].name : "";
    qsort(names, n, sizeof *names, cmp_name);
    int found = 0;
    for (size_t i = 1; i < n && !found; i++)
        if (strcmp(names[i - 1], names[i]) == 0) {
            *which = names[i];
            found = 1;
        }
    free(names);
    return found;
}

int al_policy_version_encode(const al_policy_version *p, al_buf *out, char *errstr,
                             size_t errlen)
{
    uint64_t fp = AL_CODEC_FP(PV_NAME);
    const al_train_metrics *m = &p->metrics;
    if (m->n_extra && !m->extra)
        return al_err(errstr, errlen, "PolicyVersion: n_extra is %zu but extra is NULL", m->n_extra);
    const char *dup = NULL;
    int rc = duplicate_name(m->extra, m->n_extra, &dup);
    if (rc < 0) return al_codec_oom(errstr, errlen, "encoding a PolicyVersion");
    if (rc) return al_err(errstr, errlen, "PolicyVersion: metric %s appears twice in extra", dup);
    int bad = al_wr_header(out, fp) || al_wr_string(out, p->model) ||
              al_wr_long(out, p->version) || al_wr_long(out, p->step) ||
              al_wr_string(out, p->checkpoint_uri) || al_wr_string(out, p->sha256) ||
              al_wr_long(out, p->created_us) || al_wr_double(out, m->loss) ||
              al_wr_double(out, m->kl) || al_wr_double(out, m->entropy) ||
              al_wr_double(out, m->clip_fraction) || al_wr_double(out, m->grad_norm) ||
              al_wr_double(out, m->tokens_per_s);
    if (!bad && m->n_extra) {
        bad = al_wr_long(out, (int64_t)m->n_extra);
        for (size_t i = 0; !bad && i < m->n_extra; i++)
            bad = al_wr_string(out, m->extra[i].name) || al_wr_double(out, m->extra[i].value);
    }
    if (bad || al_wr_long(out, 0)) return al_codec_oom(errstr, errlen, "encoding a PolicyVersion");
    return 0;
}

static int decode_body(al_rd *r, al_policy_version *p)
{
    al_arena *a = &p->arena;
    al_train_metrics *m = &p->metrics;
    if (al_rd_string_a(r, a, "model", &p->model) || al_rd_long(r, "version", &p->version) ||
        al_rd_long(r, "step", &p->step) ||
        al_rd_string_a(r, a, "checkpoint_uri", &p->checkpoint_uri) ||
        al_rd_string_a(r, a, "sha256", &p->sha256) ||
        al_rd_long(r, "created_us", &p->created_us) || al_rd_double(r, "metrics.loss", &m->loss) ||
        al_rd_double(r, "metrics.kl", &m->kl) || al_rd_double(r, "metrics.entropy", &m->entropy) ||
        al_rd_double(r, "metrics.clip_fraction", &m->clip_fraction) ||
        al_rd_double(r, "metrics.grad_norm", &m->grad_norm) ||
        al_rd_double(r, "metrics.tokens_per_s", &m->tokens_per_s))
        return -1;
    al_metric *extra = NULL;
    size_t n = 0, block;
    for (;;) {
        /* an entry takes at least 9 bytes: key length + 8-byte double */
        if (al_rd_block(r, "metrics.extra", 9, &block)) return -1;
        if (!block) break;
        al_metric *grown = al_arena_alloc(a, (n + block) * sizeof *grown);
        if (!grown) return al_codec_oom(r->errstr, r->errlen, "decoding");
        if (n) memcpy(grown, extra, n * sizeof *extra);
        extra = grown;
        for (size_t i = 0; i < block; i++, n++)
            if (al_rd_string_a(r, a, "metrics.extra", &extra[n].name) ||
                al_rd_double(r, "metrics.extra", &extra[n].value))
                return -1;
    }
    m->extra = extra;
    m->n_extra = n;
    const char *dup = NULL;
    int rc = duplicate_name(extra, n, &dup);
    if (rc < 0) return al_codec_oom(r->errstr, r->errlen, "decoding");
    if (rc)
        return al_err(r->errstr, r->errlen, "bad map: field metrics.extra has the key \"%s\" twice",
                      dup);
    return al_codec_finish(r, "PolicyVersion");
}

int al_policy_version_decode(const void *buf, size_t len, al_policy_version *p, char *errstr,
                             size_t errlen)
{
    al_rd r;
    al_buf resolved = {0};
    al_arena keep = p->arena;
    memset(p, 0, sizeof *p);
    p->arena = keep;
    al_arena_reset(&p->arena);
    int rc = al_codec_open(buf, len, PV_NAME, AL_CODEC_FP(PV_NAME), &r, &resolved, errstr,
                           errlen);
    if (rc == 1) {
        rc = al_policy_version_decode(resolved.data, resolved.len, p, errstr, errlen);
        al_buf_free(&resolved);
        return rc;
    }
    if (rc < 0) return -1;
    return decode_body(&r, p);
}

void al_policy_version_clear(al_policy_version *p)
{
    al_arena_free(&p->arena);
    memset(p, 0, sizeof *p);
}
