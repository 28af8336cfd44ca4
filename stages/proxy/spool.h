/*
 * spool.h: the proxy's write-ahead spool and span publisher.
 *
 * Every span is appended to an on-disk segment first (spool_dir/NNNNNNNNNNNNNNNN.seg), then
 * a publisher thread produces the segment's records to Kafka in append order and deletes a
 * segment once every record in it is acknowledged. So a span is never only in memory: while
 * the broker is away records pile up on disk (bounded by max_bytes) and go out in order
 * when it returns; after a crash or restart the next proxy on the same directory publishes
 * what is left (at-least-once: a record acknowledged just before a crash may go twice;
 * consumers drop duplicates by span id).
 *
 * Segment format: "ALSPOOL1", then records: u32 magic 0x5350414c, u32 key length,
 * u32 value length, u32 CRC-32 of key+value (little-endian), key, value. A torn record at the
 * end of a segment (crash during write) is ignored with a warning.
 *
 * Threading: al_spool_append and the stats are called from the proxy's loop thread; the
 * publisher thread owns the producer (delivery reports are served there), never the loop.
 */
#ifndef ARCLIGHT_PROXY_SPOOL_H
#define ARCLIGHT_PROXY_SPOOL_H

#include "kafka/kafka.h"

#include <stddef.h>
#include <stdint.h>

typedef enum al_spool_fsync {
    AL_SPOOL_FSYNC_NEVER = 0,    /* leave it to the kernel */
    AL_SPOOL_FSYNC_INTERVAL = 1, /* once a second at most (redis' everysec) */
    AL_SPOOL_FSYNC_ALWAYS = 2,   /* before append returns */
} al_spool_fsync;

typedef struct al_spool al_spool;

typedef struct al_spool_stats {
    uint64_t bytes;     /* on disk, all live segments */
    uint64_t records;   /* not yet acknowledged */
    uint64_t published; /* acknowledged since start */
    uint64_t failed;    /* delivery failures since start (each retried) */
    uint64_t recovered; /* records found on disk at start */
    uint64_t dropped;   /* refused by Kafka for good (too large), logged; never retried */
    int broker_ok;      /* last delivery succeeded */
} al_spool_stats;

/* Opens (creating) dir, takes its lock (one proxy per directory), indexes the segments left
 * there and starts the publisher thread, which takes ownership of producer (freed by
 * al_spool_close). NULL with errstr (dir not writable, locked by another process, ...);
 * producer is then not taken. */
al_spool *al_spool_open(const char *dir, uint64_t max_bytes, al_spool_fsync fsync_mode,
                        al_producer *producer, const char *topic, char *errstr, size_t errlen);

/* Appends one record, even past max_bytes: the bound is enforced where calls are admitted
 * (al_spool_full), so the spans of calls already accepted are never refused. The record is
 * kept in memory until al_spool_flush, so that a loop turn's spans cost one write: the
 * caller flushes once per loop turn, before the answers of that turn leave (al_spool_close
 * flushes too). 0, or -1 with errstr (too large, out of memory). Copies key and value. */
int al_spool_append(al_spool *s, const void *key, size_t keylen, const void *value, size_t vlen,
                    char *errstr, size_t errlen);

/* Writes every pending record to the tail segment(s) and hands them to the publisher.
 * *written: how many are now on disk. 0, or -1 with errstr on an I/O error: the records
 * not written are lost (the caller logs and counts them). Loop thread only. */
int al_spool_flush(al_spool *s, size_t *written, char *errstr, size_t errlen);

/* Whether another `need` bytes would exceed max_bytes. */
int al_spool_full(al_spool *s, size_t need);

void al_spool_get_stats(al_spool *s, al_spool_stats *st);

/* Waits up to timeout_ms for every record to be acknowledged, stops the publisher, fsyncs,
 * frees the producer and the spool. Records still unacknowledged stay on disk for the next
 * start. Returns how many remain (0: everything published). NULL-safe. */
long al_spool_close(al_spool *s, int timeout_ms);

#endif
