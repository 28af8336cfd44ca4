/*
 * recovery.c: the batch worker reads back its own output (main.c's delivery contract,
 * "Restart"). Before consuming, and after an aborted transaction, the last --recover-chunks
 * messages of each partition of the output topic are read with an assign-based reader: per
 * model, the last step whose chunks are all there sets the next step number (a step cut short
 * is rebuilt under its own number), and the transition ids of complete steps enter the
 * batcher's duplicate window.
 */
#include "batch.h"

#include "core/log.h"
#include "core/util.h"
#include "core/vec.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define COMP "batch"

/* One model's chunks as read back. */
typedef struct recover_model {
    char *name;
    int64_t step, count, next_index; /* the attempt being read */
    int complete_seen;               /* its last chunk was seen, in sequence */
    int64_t last_complete;           /* -1: none */
    char **ids;
    size_t n_ids, cap_ids;
} recover_model;

/* One read-back: the reader, the partitions still to read, the models seen. */
typedef struct recovery {
    batch_worker *w;
    const char *topic;
    rd_kafka_t *rk;
    int nparts, active; /* active: partitions not read to their end yet */
    int64_t *high;      /* per partition: the end to read to; -1 once reached */
    recover_model *models;
    size_t n_models;
    int64_t chunks_read;
    al_batch_chunk ch; /* decoded chunk, reused */
} recovery;

/* Number of partitions of topic (which must exist). -1 with errstr. */
static int topic_partitions(rd_kafka_t *rk, const char *topic, char *errstr, size_t errlen)
{
    const struct rd_kafka_metadata *md = NULL;
    rd_kafka_resp_err_t err = rd_kafka_metadata(rk, 1, NULL, &md, 10000);
    if (err) return al_err(errstr, errlen, "cannot read the cluster's metadata: %s", rd_kafka_err2str(err));
    int n = -1;
    for (int i = 0; i < md->topic_cnt; i++)
        if (strcmp(md->topics[i].topic, topic) == 0 && !md->topics[i].err) n = md->topics[i].partition_cnt;
    rd_kafka_metadata_destroy(md);
    if (n <= 0) return al_err(errstr, errlen, "topic %s does not exist (create it: arclight topics create)", topic);
    return n;
}

static int remember_model(batch_worker *w, const char *name)
{
    char **k = realloc(w->known_models, (w->n_known + 1) * sizeof *k);
    if (!k) return -1;
    w->known_models = k;
    if (!(k[w->n_known] = strdup(name))) return -1;
    w->n_known++;
    return 0;
}

void batch_recovery_check_model(batch_worker *w, const char *name)
{
    for (size_t i = 0; i < w->n_known; i++)
        if (!strcmp(w->known_models[i], name)) return;
    if (w->recover_truncated)
        al_log_warn(COMP, "model %s has no step in the last %" PRId64 " chunks of %s, so its steps "
                          "start at 0; if it had steps before those, restart with a larger "
                          "--recover-chunks",
                    name, w->o->recover_chunks, w->o->output_topic);
    remember_model(w, name);
}

void batch_recovery_forget(batch_worker *w)
{
    for (size_t i = 0; i < w->n_known; i++) free(w->known_models[i]);
    w->n_known = 0;
    w->recover_truncated = 0;
}

/* Learns the output topic's partitions and assigns each from --recover-chunks before its
 * end (empty ones not at all). 0, or -1 with errstr. */
static int recovery_assign(recovery *r, char *errstr, size_t errlen)
{
    r->nparts = topic_partitions(r->rk, r->topic, errstr, errlen);
    if (r->nparts < 0) return -1;
    r->high = calloc((size_t)r->nparts, sizeof *r->high);
    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(r->nparts);
    for (int p = 0; p < r->nparts; p++) {
        int64_t lo = 0, hi = 0;
        rd_kafka_resp_err_t err = al_kafka_watermarks(r->rk, r->topic, p, &lo, &hi, 10000);
        if (err) {
            al_err(errstr, errlen, "cannot read the offsets of %s [%d]: %s", r->topic, p, rd_kafka_err2str(err));
            rd_kafka_topic_partition_list_destroy(l);
            return -1;
        }
        r->high[p] = hi;
        if (hi <= lo) continue;
        int64_t from = hi - r->w->o->recover_chunks > lo ? hi - r->w->o->recover_chunks : lo;
        if (from > lo) r->w->recover_truncated = 1;
        rd_kafka_topic_partition_list_add(l, r->topic, p)->offset = from;
        r->active++;
    }
    if (r->active) rd_kafka_assign(r->rk, l);
    rd_kafka_topic_partition_list_destroy(l);
    return 0;
}

/* Ends the attempt at a step being read: a complete one marks its ids seen and may be the
 * model's last complete step. */
static void recover_finish_attempt(al_batcher *b, recover_model *m)
{
    if (m->step >= 0 && m->complete_seen) {
        for (size_t i = 0; i < m->n_ids; i++) al_batcher_mark_seen(b, m->ids[i]);
        if (m->step > m->last_complete) m->last_complete = m->step;
    }
    for (size_t i = 0; i < m->n_ids; i++) free(m->ids[i]);
    m->n_ids = 0;
    m->step = -1;
    m->complete_seen = 0;
}

/* The model of that name as read back so far, added when new. NULL when out of memory. */
static recover_model *recovery_model(recovery *r, const char *name)
{
    for (size_t i = 0; i < r->n_models; i++)
        if (strcmp(r->models[i].name, name) == 0) return &r->models[i];
    recover_model *nm = realloc(r->models, (r->n_models + 1) * sizeof *nm);
    if (!nm) return NULL;
    r->models = nm;
    recover_model *m = &r->models[r->n_models++];
    memset(m, 0, sizeof *m);
    m->step = -1;
    m->last_complete = -1;
    if (!(m->name = strdup(name))) return NULL;
    return m;
}

/* One chunk read back (r->ch): it continues its model's attempt at a step or starts the next
 * one; its transition ids join the attempt's. 0, or -1 when out of memory. */
static int recovery_take_chunk(recovery *r)
{
    const al_batch_chunk *ch = &r->ch;
    r->chunks_read++;
    recover_model *m = recovery_model(r, ch->model);
    if (!m) return -1;
    if (ch->chunk_index == 0 || ch->step != m->step) {
        recover_finish_attempt(r->w->batcher, m);
        m->step = ch->step;
        m->count = ch->chunk_count;
        m->next_index = ch->chunk_index; /* the window may start inside a step */
    }
    if (ch->chunk_index == m->next_index) {
        m->next_index++;
        if (m->next_index == m->count) m->complete_seen = 1;
    }
    for (size_t i = 0; i < ch->n_micro_batches; i++)
        for (size_t s = 0; s < ch->micro_batches[i].n_sequences; s++) {
            if (al_vec_grow((void **)&m->ids, &m->cap_ids, m->n_ids + 1, sizeof *m->ids))
                return -1;
            if (!(m->ids[m->n_ids] = strdup(ch->micro_batches[i].transition_ids[s]))) return -1;
            m->n_ids++;
        }
    return 0;
}

/* Reads the assigned partitions to their ends (at most 60 s), taking every usable chunk;
 * others are logged and ignored. 0, or -1 with errstr (1: out of memory). */
static int recovery_read(recovery *r, char *errstr, size_t errlen)
{
    int64_t deadline = al_mono_us() + 60 * 1000000LL;
    while (r->active > 0) {
        if (al_mono_us() > deadline)
            return al_err(errstr, errlen, "reading back %s took over 60 s", r->topic);
        rd_kafka_message_t *m = rd_kafka_consumer_poll(r->rk, 200);
        if (!m) continue;
        if (m->err == RD_KAFKA_RESP_ERR__PARTITION_EOF) {
            /* each partition once; high[] < 0 marks it done */
            if (m->partition >= 0 && m->partition < r->nparts && r->high[m->partition] >= 0 &&
                m->offset >= r->high[m->partition]) {
                r->high[m->partition] = -1;
                r->active--;
            }
            rd_kafka_message_destroy(m);
            continue;
        }
        if (m->err) {
            al_err(errstr, errlen, "reading back %s: %s", r->topic, rd_kafka_message_errstr(m));
            rd_kafka_message_destroy(m);
            return -1;
        }
        char e[256];
        int ok = al_batch_chunk_decode(m->payload, m->len, &r->ch, e, sizeof e) == 0;
        if (ok && (r->ch.step < 0 || r->ch.step >= AL_STEP_MAX)) {
            snprintf(e, sizeof e, "its step number %" PRId64 " is out of range", r->ch.step);
            ok = 0;
        }
        if (ok && recovery_take_chunk(r) != 0) {
            rd_kafka_message_destroy(m);
            return 1;
        }
        if (!ok)
            al_log_warn(COMP, "%s [%d] offset %" PRId64 " is not a usable BatchChunk (%s); ignored while recovering",
                        r->topic, (int)m->partition, m->offset, e);
        rd_kafka_message_destroy(m);
    }
    return 0;
}

/* What was read back, to the batcher: each model's next step number (a step cut short is
 * made again under its number), logged. 0, or -1 when out of memory. */
static int recovery_conclude(recovery *r)
{
    for (size_t i = 0; i < r->n_models; i++) {
        recover_model *m = &r->models[i];
        int64_t partial = m->step >= 0 && !m->complete_seen ? m->step : -1;
        recover_finish_attempt(r->w->batcher, m);
        int64_t next = partial >= 0 ? partial : m->last_complete + 1;
        if (al_batcher_set_next_step(r->w->batcher, m->name, next) != 0 ||
            remember_model(r->w, m->name) != 0)
            return -1;
        if (partial >= 0)
            al_log_warn(COMP, "%s: step %" PRId64 " on %s is incomplete (a crash while sending); "
                              "rebuilding it under the same number", m->name, partial, r->topic);
        else
            al_log_info(COMP, "%s: continuing at step %" PRId64, m->name, next);
    }
    al_log_info(COMP, "read back %" PRId64 " chunks of %s for %zu model%s", r->chunks_read,
                r->topic, r->n_models, r->n_models == 1 ? "" : "s");
    return 0;
}

int batch_recover(batch_worker *w, const al_kafka_conf *kc, char *errstr, size_t errlen)
{
    recovery r = {.w = w, .topic = w->o->output_topic};
    r.rk = al_kafka_reader_new(kc, "arclight-batch-recover", errstr, errlen);
    if (!r.rk) return -1;
    int rc = recovery_assign(&r, errstr, errlen);
    if (rc == 0) rc = recovery_read(&r, errstr, errlen);
    if (rc == 0 && recovery_conclude(&r) != 0) rc = 1;
    if (rc > 0) al_err(errstr, errlen, "out of memory while reading back %s", r.topic);
    al_batch_chunk_clear(&r.ch);
    for (size_t i = 0; i < r.n_models; i++) {
        for (size_t k = 0; k < r.models[i].n_ids; k++) free(r.models[i].ids[k]);
        free(r.models[i].ids);
        free(r.models[i].name);
    }
    free(r.models);
    free(r.high);
    rd_kafka_consumer_close(r.rk);
    rd_kafka_destroy(r.rk);
    return rc ? -1 : 0;
}
