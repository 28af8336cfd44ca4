/*
 * follower.h: follows one topic from its beginning, as the stages follow arclight.policy
 * (compacted, the latest PolicyVersion per model): every partition is read from its oldest
 * message, the follower says when each has reached the end it had when it was assigned
 * (caught up: the latest record of every key seen so far is the latest there was at start),
 * and it keeps following after that. Assign-based (al_kafka_reader_new): no group to join or
 * leave, no offsets to commit, so freeing it never waits on the broker.
 *
 * A partition has reached its end when a record at or past the end offset seen at assign time
 * arrives, or at librdkafka's partition-EOF event: a compacted topic leaves gaps, so the record
 * just before the end may be gone. Records are handed to the caller as they come, tombstones
 * included; decoding them, and keeping the latest per key, is the caller's.
 *
 *     al_follower *f = al_follower_new(conf, &opts, errstr, errlen);
 *     al_follower_assign(f, errstr, errlen);          // retry while it fails, if that suits
 *     while (!al_follower_caught_up(f)) { al_follower_next(f, 200, &m); ... }
 *     ... al_follower_next(f, 0, &m) from the caller's loop ...
 *     al_follower_free(f);
 */
#ifndef ARCLIGHT_KAFKA_FOLLOWER_H
#define ARCLIGHT_KAFKA_FOLLOWER_H

#include "kafka/kafka.h"

#include <librdkafka/rdkafka.h>
#include <stddef.h>

typedef struct al_follower_opts {
    const char *topic;        /* copied */
    const char *client;       /* group_prefix of the reader (al_kafka_reader_new) */
    int timeout_ms;           /* each metadata or watermark request: a stop may wait that long */
    const char *missing_hint; /* appended to "topic T does not exist"; NULL: nothing */
} al_follower_opts;

typedef struct al_follower al_follower;

/* Creates the reader (no request to the broker yet). Does not take ownership of conf. NULL with
 * errstr (settings librdkafka refuses, out of memory). */
al_follower *al_follower_new(const al_kafka_conf *conf, const al_follower_opts *o, char *errstr,
                             size_t errlen);

/* Destroys the reader without a consumer close (nothing to commit, no group to leave).
 * NULL-safe. */
void al_follower_free(al_follower *f);

/* Learns the topic's partitions and their end offsets and assigns them all from their
 * beginning. 0, or -1 with errstr (the cluster not answering, the topic missing): nothing is
 * assigned then and it may be called again. Once it succeeded, it does nothing. */
int al_follower_assign(al_follower *f, char *errstr, size_t errlen);

/* 1 once every partition has reached the end it had when assign succeeded; 0 before, and
 * before assign. */
int al_follower_caught_up(const al_follower *f);

/* Waits up to timeout_ms for the next record (partition-EOF events are taken in passing).
 *   1: *out is a record, tombstones included (the caller owns it: rd_kafka_message_destroy)
 *   0: nothing came
 *  -1: *out is an error event (its err set; the caller owns it) for the caller to judge:
 *      al_kafka_error_classify says whether following can go on */
int al_follower_next(al_follower *f, int timeout_ms, rd_kafka_message_t **out);

#endif
