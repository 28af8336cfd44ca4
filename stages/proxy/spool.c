/*
 * spool.c: write-ahead spool segments and the publisher thread (see spool.h).
 */
#define _GNU_SOURCE /* pthread_setname_np */
#include "spool.h"

#include "core/log.h"
#include "core/util.h"
#include "core/vec.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>
#include <zlib.h>

#define SPOOL_MAGIC 0x5350414cu
#define SPOOL_FILE_MAGIC "ALSPOOL1"
#define SPOOL_REC_HDR 16
#define SPOOL_SEG_MAX (8u << 20)
#define SPOOL_MAX_INFLIGHT 20000
#define SPOOL_MAX_RECORD (16u << 20)

enum { REC_UNSENT = 0, REC_INFLIGHT = 1, REC_ACKED = 2 };

typedef struct srec {
    uint64_t off; /* of the record header */
    uint32_t klen, vlen;
    uint8_t state;
} srec;

typedef struct sseg {
    uint64_t id;
    int fd;
    uint64_t size;
    srec *recs;
    size_t n, cap, acked, scan; /* scan: no unsent record before it */
    int sealed;
    int64_t created_mono;
    struct sseg *next;
} sseg;

typedef struct sref {
    al_spool *s;
    sseg *seg;
    size_t idx;
} sref;

struct al_spool {
    char *dir;
    int lockfd;
    uint64_t max_bytes;
    al_spool_fsync fsync_mode;
    al_producer *p;
    char *topic;
    pthread_mutex_t mu;
    pthread_t th;
    int started, stop;
    int64_t deadline_mono;
    sseg *head, *tail;
    uint64_t next_id;
    uint64_t bytes, unacked, published, failed, recovered, dropped;
    size_t inflight;
    int broker_ok, dirty, closing;
    int64_t last_fsync_mono, backoff_until_mono, last_warn_mono;
    uint8_t *rbuf;
    size_t rcap;
    /* appended, not yet written (loop thread only): whole records, and their sizes */
    uint8_t *pend;
    size_t plen, pcap;
    uint32_t *psz; /* key length, value length per record */
    size_t pn, pszcap;
};

/* CRC-32 (zlib's, table-driven with SIMD where the CPU has it) */
static uint32_t crc32_update(uint32_t crc, const void *data, size_t n)
{
    return (uint32_t)crc32(crc, data, (uInt)n);
}

static void put32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
    p[2] = (uint8_t)(v >> 16);
    p[3] = (uint8_t)(v >> 24);
}

static uint32_t get32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void seg_path(const al_spool *s, uint64_t id, char *buf, size_t n)
{
    snprintf(buf, n, "%s/%016" PRIx64 ".seg", s->dir, id);
}

static int seg_push(sseg *g, uint64_t off, uint32_t klen, uint32_t vlen)
{
    if (al_vec_grow((void **)&g->recs, &g->cap, g->n + 1, sizeof *g->recs) != 0) return -1;
    g->recs[g->n++] = (srec){off, klen, vlen, REC_UNSENT};
    return 0;
}

static void seg_free(sseg *g)
{
    if (g->fd >= 0) close(g->fd);
    free(g->recs);
    free(g);
}

/* Indexes one segment left by an earlier run; truncates a torn tail. NULL when it holds no
 * record (the caller unlinks it). */
static sseg *seg_recover(al_spool *s, uint64_t id)
{
    char path[4096];
    seg_path(s, id, path, sizeof path);
    int fd = open(path, O_RDWR | O_APPEND | O_CLOEXEC);
    if (fd < 0) {
        al_log_warn("proxy", "spool: cannot open %s: %s", path, strerror(errno));
        return NULL;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || st.st_size < 8) {
        close(fd);
        return NULL;
    }
    sseg *g = calloc(1, sizeof *g);
    if (!g) {
        close(fd);
        return NULL;
    }
    g->id = id;
    g->fd = fd;
    g->sealed = 1;
    char fm[8];
    if (pread(fd, fm, 8, 0) != 8 || memcmp(fm, SPOOL_FILE_MAGIC, 8) != 0) {
        al_log_warn("proxy", "spool: %s is not a spool segment; left alone", path);
        seg_free(g);
        return NULL;
    }
    uint64_t off = 8, end = (uint64_t)st.st_size;
    uint8_t *buf = NULL;
    size_t bcap = 0;
    while (off + SPOOL_REC_HDR <= end) {
        uint8_t h[SPOOL_REC_HDR];
        if (pread(fd, h, SPOOL_REC_HDR, (off_t)off) != SPOOL_REC_HDR) break;
        uint32_t klen = get32(h + 4), vlen = get32(h + 8), crc = get32(h + 12);
        if (get32(h) != SPOOL_MAGIC || klen > SPOOL_MAX_RECORD || vlen > SPOOL_MAX_RECORD ||
            off + SPOOL_REC_HDR + klen + vlen > end)
            break;
        size_t need = (size_t)klen + vlen;
        if (al_vec_grow((void **)&buf, &bcap, need ? need : 1, 1) != 0) break;
        if (pread(fd, buf, need, (off_t)(off + SPOOL_REC_HDR)) != (ssize_t)need) break;
        if (crc32_update(0, buf, need) != crc) break;
        if (seg_push(g, off, klen, vlen)) break;
        off += SPOOL_REC_HDR + need;
    }
    free(buf);
    if (off < end) {
        al_log_warn("proxy", "spool: %s: ignoring %" PRIu64 " torn bytes at its end", path,
                    end - off);
        if (ftruncate(fd, (off_t)off) != 0) { /* the index ignores them anyway */
        }
    }
    g->size = off;
    if (g->n == 0) {
        seg_free(g);
        return NULL;
    }
    return g;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static void seg_link(al_spool *s, sseg *g)
{
    if (s->tail)
        s->tail->next = g;
    else
        s->head = g;
    s->tail = g;
}

/* Removes g (the first segment, fully acknowledged) from the list and the disk. */
static void seg_drop_head(al_spool *s)
{
    sseg *g = s->head;
    char path[4096];
    seg_path(s, g->id, path, sizeof path);
    if (unlink(path) != 0 && errno != ENOENT)
        al_log_warn("proxy", "spool: cannot remove %s: %s", path, strerror(errno));
    s->bytes -= g->size;
    s->head = g->next;
    if (s->tail == g) s->tail = NULL;
    seg_free(g);
}

/* A record that Kafka can never take: retrying it would hold back every later span forever,
 * so it is counted, logged with its size, and given up. Lock held. */
static void drop_record(al_spool *s, sseg *g, size_t idx, const char *why)
{
    srec *rec = &g->recs[idx];
    if (rec->state == REC_ACKED) return;
    rec->state = REC_ACKED;
    g->acked++;
    s->unacked--;
    s->dropped++;
    al_log_error("proxy",
                 "spool: span of %u bytes (segment %016" PRIx64 " record %zu) dropped: "
                 "%s; raise the topic's max.message.bytes and message.max.bytes to keep such spans",
                 rec->vlen, g->id, idx, why);
}

static int err_permanent(rd_kafka_resp_err_t err)
{
    return err == RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE;
}

static void on_delivery(const al_delivery *d, void *ctx)
{
    sref *r = d->opaque;
    al_spool *s = ctx;
    if (!r) return;
    pthread_mutex_lock(&s->mu);
    srec *rec = &r->seg->recs[r->idx];
    s->inflight--;
    if (d->err && err_permanent(d->err)) {
        drop_record(s, r->seg, r->idx,
                    d->reason && *d->reason ? d->reason : rd_kafka_err2str(d->err));
    } else if (d->err == 0) {
        rec->state = REC_ACKED;
        r->seg->acked++;
        s->unacked--;
        s->published++;
        s->broker_ok = 1;
    } else {
        rec->state = REC_UNSENT;
        if (r->idx < r->seg->scan) r->seg->scan = r->idx;
        s->broker_ok = 0;
        if (!s->closing) {
            s->failed++;
            s->backoff_until_mono = al_mono_us() + 500000;
            if (al_mono_us() - s->last_warn_mono > 5000000) {
                s->last_warn_mono = al_mono_us();
                al_log_warn("proxy", "spool: span not delivered (%s); kept on disk, retrying",
                            d->reason && *d->reason ? d->reason : rd_kafka_err2str(d->err));
            }
        }
    }
    pthread_mutex_unlock(&s->mu);
    free(r);
}

/* fdatasync of every live segment. Called with the lock held; the lock is released during
 * the syncs (only this thread closes segment fds), so appends never wait for the disk. */
static void do_fsync(al_spool *s)
{
    int fds[64];
    size_t n = 0;
    for (sseg *g = s->head; g && n < AL_ARRAY_LEN(fds); g = g->next)
        if (g->fd >= 0) fds[n++] = g->fd;
    s->dirty = 0;
    s->last_fsync_mono = al_mono_us();
    pthread_mutex_unlock(&s->mu);
    for (size_t i = 0; i < n; i++)
        fdatasync(fds[i]);
    pthread_mutex_lock(&s->mu);
}

typedef struct pick {
    sseg *g;
    size_t idx;
    uint64_t off;
    uint32_t klen, vlen;
    int drop; /* can never be delivered (too large for the broker) */
} pick;

#define PICK_BATCH 256

/* Produces unsent records in order, up to the in-flight window. Called with the lock held;
 * records are picked (marked in flight) under the lock, then read and handed to librdkafka
 * without it, so the loop thread's appends never wait on this. Only this thread frees
 * segments, so the picked segments stay valid. */
static void produce_some(al_spool *s)
{
    pick *batch = malloc(PICK_BATCH * sizeof *batch);
    if (!batch) return;
    for (;;) {
        size_t nb = 0;
        for (sseg *g = s->head; g && nb < PICK_BATCH; g = g->next) {
            while (g->scan < g->n && nb < PICK_BATCH && s->inflight + nb < SPOOL_MAX_INFLIGHT) {
                srec *rec = &g->recs[g->scan];
                if (rec->state == REC_UNSENT) {
                    rec->state = REC_INFLIGHT;
                    batch[nb++] = (pick){g, g->scan, rec->off, rec->klen, rec->vlen, 0};
                }
                g->scan++;
            }
            if (g->scan < g->n) break; /* keep order: never run ahead into the next segment */
        }
        if (!nb) break;
        s->inflight += nb;
        pthread_mutex_unlock(&s->mu);
        size_t i;
        for (i = 0; i < nb; i++) {
            pick *k = &batch[i];
            size_t need = (size_t)k->klen + k->vlen;
            if (al_vec_grow((void **)&s->rbuf, &s->rcap, need, 1) != 0) break;
            if (pread(k->g->fd, s->rbuf, need, (off_t)(k->off + SPOOL_REC_HDR)) != (ssize_t)need) {
                al_log_error("proxy", "spool: cannot read segment %016" PRIx64 ": %s", k->g->id,
                             strerror(errno));
                break;
            }
            sref *r = malloc(sizeof *r);
            if (!r) break;
            *r = (sref){s, k->g, k->idx};
            rd_kafka_resp_err_t err = al_producer_send(s->p, s->topic, s->rbuf, k->klen,
                                                       s->rbuf + k->klen, k->vlen, NULL, r);
            if (err && err_permanent(err)) {
                free(r);
                k->drop = 1;
                continue;
            }
            if (err) {
                free(r);
                /* a full local queue is back-pressure; anything else is retried later too,
                 * the record stays on disk */
                if (err != RD_KAFKA_RESP_ERR__QUEUE_FULL &&
                    al_mono_us() - s->last_warn_mono > 5000000) {
                    s->last_warn_mono = al_mono_us();
                    al_log_warn("proxy", "spool: cannot queue span: %s", rd_kafka_err2str(err));
                }
                break;
            }
        }
        pthread_mutex_lock(&s->mu);
        for (size_t k = 0; k < i; k++)
            if (batch[k].drop) {
                s->inflight--;
                drop_record(s, batch[k].g, batch[k].idx,
                            rd_kafka_err2str(RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE));
            }
        if (i < nb) { /* the rest goes again later, from the first one not queued */
            for (size_t k = i; k < nb; k++) {
                batch[k].g->recs[batch[k].idx].state = REC_UNSENT;
                if (batch[k].idx < batch[k].g->scan) batch[k].g->scan = batch[k].idx;
            }
            s->inflight -= nb - i;
            s->backoff_until_mono = al_mono_us() + 50000;
            break;
        }
        if (nb < PICK_BATCH) break;
    }
    free(batch);
}

static void *publisher_main(void *arg)
{
    al_spool *s = arg;
    pthread_setname_np(pthread_self(), "spool-publish"); /* for top -H and per-thread CPU */
    for (;;) {
        pthread_mutex_lock(&s->mu);
        int64_t now = al_mono_us();
        if (s->stop && (s->unacked == 0 || now >= s->deadline_mono)) {
            pthread_mutex_unlock(&s->mu);
            break;
        }
        /* drop fully acknowledged segments from the front; the tail too once it is done
         * and not brand new (saves re-creating a file per span under light load) */
        sseg *dropped = NULL, **dtail = &dropped;
        while (s->head && s->head->acked == s->head->n &&
               (s->head != s->tail || s->head->sealed ||
                (s->head->n > 0 && now - s->head->created_mono > 200000))) {
            sseg *g = s->head; /* unlinked from the list now, from the disk below */
            s->bytes -= g->size;
            s->head = g->next;
            if (s->tail == g) s->tail = NULL;
            g->next = NULL;
            *dtail = g;
            dtail = &g->next;
        }
        if (dropped) { /* unlink can take a while (freeing the pages): not under the lock */
            pthread_mutex_unlock(&s->mu);
            while (dropped) {
                sseg *g = dropped;
                dropped = g->next;
                char path[4096];
                seg_path(s, g->id, path, sizeof path);
                if (unlink(path) != 0 && errno != ENOENT)
                    al_log_warn("proxy", "spool: cannot remove %s: %s", path, strerror(errno));
                seg_free(g);
            }
            pthread_mutex_lock(&s->mu);
            now = al_mono_us();
        }
        if (s->fsync_mode == AL_SPOOL_FSYNC_INTERVAL && s->dirty &&
            now - s->last_fsync_mono >= 1000000)
            do_fsync(s);
        if (now >= s->backoff_until_mono) produce_some(s);
        pthread_mutex_unlock(&s->mu);
        al_producer_poll(s->p, 5);
    }
    return NULL;
}

al_spool *al_spool_open(const char *dir, uint64_t max_bytes, al_spool_fsync fsync_mode,
                        al_producer *producer, const char *topic, char *errstr, size_t errlen)
{
    if (mkdir(dir, 0700) != 0 && errno != EEXIST) {
        al_err(errstr, errlen, "cannot create spool directory %s: %s", dir, strerror(errno));
        return NULL;
    }
    al_spool *s = calloc(1, sizeof *s);
    if (!s) {
        al_err(errstr, errlen, "out of memory");
        return NULL;
    }
    s->dir = strdup(dir);
    s->topic = strdup(topic);
    s->max_bytes = max_bytes;
    s->fsync_mode = fsync_mode;
    s->lockfd = -1;
    s->broker_ok = 1;
    pthread_mutex_init(&s->mu, NULL);
    char path[4096];
    snprintf(path, sizeof path, "%s/LOCK", dir);
    s->lockfd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (s->lockfd < 0) {
        al_err(errstr, errlen, "cannot open %s: %s", path, strerror(errno));
        goto fail;
    }
    if (flock(s->lockfd, LOCK_EX | LOCK_NB) != 0) {
        al_err(errstr, errlen,
               "spool directory %s is in use by another arclight proxy (lock %s held); give "
               "each proxy its own --spool-dir",
               dir, path);
        goto fail;
    }
    DIR *d = opendir(dir);
    if (!d) {
        al_err(errstr, errlen, "cannot read spool directory %s: %s", dir, strerror(errno));
        goto fail;
    }
    AL_VEC(uint64_t) ids = {0};
    struct dirent *de;
    while ((de = readdir(d))) {
        size_t l = strlen(de->d_name);
        if (l != 20 || strcmp(de->d_name + 16, ".seg") != 0) continue;
        char *endp;
        uint64_t id = strtoull(de->d_name, &endp, 16);
        if (endp != de->d_name + 16) continue;
        if (al_vec_push(&ids, id) != 0) break;
    }
    closedir(d);
    if (ids.n) qsort(ids.v, ids.n, sizeof *ids.v, cmp_u64);
    for (size_t i = 0; i < ids.n; i++) {
        sseg *g = seg_recover(s, ids.v[i]);
        if (!g) {
            char p2[4096];
            seg_path(s, ids.v[i], p2, sizeof p2);
            unlink(p2);
            continue;
        }
        seg_link(s, g);
        s->bytes += g->size;
        s->unacked += g->n;
        s->recovered += g->n;
        if (ids.v[i] >= s->next_id) s->next_id = ids.v[i] + 1;
    }
    al_vec_free(&ids);
    if (s->recovered)
        al_log_info("proxy", "spool: %" PRIu64 " spans left by an earlier run in %s; publishing",
                    s->recovered, dir);
    s->p = producer;
    al_producer_set_block_ms(producer, 0);
    al_producer_set_delivery_cb(producer, on_delivery, s);
    s->last_fsync_mono = al_mono_us();
    if (pthread_create(&s->th, NULL, publisher_main, s) != 0) {
        al_err(errstr, errlen, "cannot start the span publisher thread");
        s->p = NULL;
        goto fail;
    }
    s->started = 1;
    return s;
fail:
    while (s->head) {
        sseg *g = s->head;
        s->head = g->next;
        seg_free(g);
    }
    if (s->lockfd >= 0) close(s->lockfd);
    pthread_mutex_destroy(&s->mu);
    free(s->dir);
    free(s->topic);
    free(s);
    return NULL;
}

int al_spool_full(al_spool *s, size_t need)
{
    pthread_mutex_lock(&s->mu);
    int full = s->bytes + s->plen + need + SPOOL_REC_HDR > s->max_bytes;
    pthread_mutex_unlock(&s->mu);
    return full;
}

/* Starts a new tail segment. Lock held. */
static int seg_new(al_spool *s, char *errstr, size_t errlen)
{
    char path[4096];
    uint64_t id = s->next_id++;
    seg_path(s, id, path, sizeof path);
    int fd = open(path, O_RDWR | O_APPEND | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) return al_err(errstr, errlen, "cannot create %s: %s", path, strerror(errno));
    if (write(fd, SPOOL_FILE_MAGIC, 8) != 8) {
        close(fd);
        unlink(path);
        return al_err(errstr, errlen, "cannot write %s: %s", path, strerror(errno));
    }
    sseg *g = calloc(1, sizeof *g);
    if (!g) {
        close(fd);
        unlink(path);
        return al_err(errstr, errlen, "out of memory");
    }
    g->id = id;
    g->fd = fd;
    g->size = 8;
    g->created_mono = al_mono_us();
    if (s->tail) s->tail->sealed = 1;
    seg_link(s, g);
    s->bytes += 8;
    return 0;
}

int al_spool_append(al_spool *s, const void *key, size_t keylen, const void *value, size_t vlen,
                    char *errstr, size_t errlen)
{
    if (keylen > SPOOL_MAX_RECORD || vlen > SPOOL_MAX_RECORD)
        return al_err(errstr, errlen,
                      "span of %zu bytes is larger than the spool's %u-byte "
                      "record limit",
                      vlen, SPOOL_MAX_RECORD);
    size_t need = SPOOL_REC_HDR + keylen + vlen;
    if (al_vec_grow((void **)&s->pend, &s->pcap, s->plen + need, 1) != 0 ||
        al_vec_grow((void **)&s->psz, &s->pszcap, s->pn * 2 + 2, sizeof *s->psz) != 0)
        return al_err(errstr, errlen, "out of memory");
    uint8_t *h = s->pend + s->plen;
    put32(h, SPOOL_MAGIC);
    put32(h + 4, (uint32_t)keylen);
    put32(h + 8, (uint32_t)vlen);
    put32(h + 12, crc32_update(crc32_update(0, key, keylen), value, vlen));
    memcpy(h + SPOOL_REC_HDR, key, keylen);
    memcpy(h + SPOOL_REC_HDR + keylen, value, vlen);
    s->plen += need;
    s->psz[s->pn * 2] = (uint32_t)keylen;
    s->psz[s->pn * 2 + 1] = (uint32_t)vlen;
    s->pn++;
    return 0;
}

/* Writes the pending records as one write per segment they land in, then indexes them for
 * the publisher (which only reads what is indexed, so never a record still in memory). */
int al_spool_flush(al_spool *s, size_t *written, char *errstr, size_t errlen)
{
    *written = 0;
    if (!s->pn) return 0;
    int rc = 0;
    size_t i = 0, off = 0;
    pthread_mutex_lock(&s->mu);
    while (i < s->pn) {
        uint64_t first = SPOOL_REC_HDR + (uint64_t)s->psz[i * 2] + s->psz[i * 2 + 1];
        if ((!s->tail || s->tail->sealed || s->tail->size + first > SPOOL_SEG_MAX) &&
            seg_new(s, errstr, errlen)) {
            rc = -1;
            break;
        }
        sseg *g = s->tail;
        size_t j = i + 1;
        uint64_t bytes = first;
        while (j < s->pn) {
            uint64_t r = SPOOL_REC_HDR + (uint64_t)s->psz[j * 2] + s->psz[j * 2 + 1];
            if (g->size + bytes + r > SPOOL_SEG_MAX) break;
            bytes += r;
            j++;
        }
        ssize_t w = write(g->fd, s->pend + off, (size_t)bytes);
        if (w != (ssize_t)bytes) {
            int e = errno;
            /* cut a partial write off so the segment stays readable */
            if (w > 0 && ftruncate(g->fd, (off_t)g->size) != 0) g->sealed = 1;
            rc = al_err(errstr, errlen, "cannot write to the spool in %s: %s", s->dir,
                        w < 0 ? strerror(e) : "short write");
            break;
        }
        for (size_t k = i; k < j; k++) {
            uint32_t kl = s->psz[k * 2], vl = s->psz[k * 2 + 1];
            if (seg_push(g, g->size, kl, vl)) {
                g->sealed = 1; /* on disk but unindexed: the next start publishes it */
                rc = al_err(errstr, errlen, "out of memory");
                break;
            }
            g->size += SPOOL_REC_HDR + (uint64_t)kl + vl;
            s->bytes += SPOOL_REC_HDR + (uint64_t)kl + vl;
            s->unacked++;
            (*written)++;
        }
        if (rc) break;
        if (s->fsync_mode == AL_SPOOL_FSYNC_ALWAYS)
            fdatasync(g->fd);
        else
            s->dirty = 1;
        off += (size_t)bytes;
        i = j;
    }
    pthread_mutex_unlock(&s->mu);
    s->plen = 0;
    s->pn = 0;
    return rc;
}

void al_spool_get_stats(al_spool *s, al_spool_stats *st)
{
    pthread_mutex_lock(&s->mu);
    st->bytes = s->bytes;
    st->records = s->unacked;
    st->published = s->published;
    st->failed = s->failed;
    st->recovered = s->recovered;
    st->dropped = s->dropped;
    st->broker_ok = s->broker_ok;
    pthread_mutex_unlock(&s->mu);
}

long al_spool_close(al_spool *s, int timeout_ms)
{
    if (!s) return 0;
    size_t written;
    char err[512];
    if (al_spool_flush(s, &written, err, sizeof err) != 0)
        al_log_error("proxy", "spool: spans lost at close: %s", err);
    pthread_mutex_lock(&s->mu);
    s->stop = 1;
    s->deadline_mono = al_mono_us() + (int64_t)timeout_ms * 1000;
    pthread_mutex_unlock(&s->mu);
    if (s->started) pthread_join(s->th, NULL);
    /* what is still queued in librdkafka stays on disk: purge it so that freeing the
     * producer does not wait for a broker that is away */
    pthread_mutex_lock(&s->mu);
    s->closing = 1;
    pthread_mutex_unlock(&s->mu);
    rd_kafka_purge(al_producer_handle(s->p), RD_KAFKA_PURGE_F_QUEUE | RD_KAFKA_PURGE_F_INFLIGHT);
    for (int i = 0; i < 200 && s->inflight > 0; i++)
        al_producer_poll(s->p, 10);
    al_producer_free(s->p);
    long left = (long)s->unacked;
    while (s->head && s->head->acked == s->head->n)
        seg_drop_head(s);
    pthread_mutex_lock(&s->mu);
    do_fsync(s);
    pthread_mutex_unlock(&s->mu);
    if (left)
        al_log_warn("proxy", "spool: %ld spans not yet acknowledged stay in %s for the next start",
                    left, s->dir);
    while (s->head) {
        sseg *g = s->head;
        s->head = g->next;
        seg_free(g);
    }
    if (s->lockfd >= 0) close(s->lockfd);
    pthread_mutex_destroy(&s->mu);
    free(s->rbuf);
    free(s->pend);
    free(s->psz);
    free(s->dir);
    free(s->topic);
    free(s);
    return left;
}
