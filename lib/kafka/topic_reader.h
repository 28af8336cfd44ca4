/*
 * topic_reader.h: reads topics with an assign-based consumer (`arclight tail`, `arclight
 * record`, the rollout controller): no group.id, no commits, so it never disturbs a stage's
 * group.
 *
 * At start it looks up every partition of the topics, and reads each partition's
 * watermarks. A partition's range is [start, end):
 *   start   the high watermark (new messages only), the low watermark (from beginning), an
 *           explicit offset, or the first message at or after a time
 *   end     without follow: the high watermark seen at start; with follow: none; an
 *           explicit end offset (exclusive) or end time (inclusive) narrows it further
 * The reader is done when every partition has reached its end; with follow and no end
 * bound, never. To read one topic from its beginning and keep following it after its end
 * (arclight.policy), see follower.h.
 */
#ifndef ARCLIGHT_KAFKA_TOPIC_READER_H
#define ARCLIGHT_KAFKA_TOPIC_READER_H

#include "kafka/kafka.h"

#include <librdkafka/rdkafka.h>
#include <stddef.h>
#include <stdint.h>

typedef enum al_topic_start {
    AL_TOPIC_START_END = 0,       /* only messages produced after the start */
    AL_TOPIC_START_BEGINNING = 1, /* the oldest message still on the broker */
    AL_TOPIC_START_OFFSET = 2,    /* start_offset in every partition */
    AL_TOPIC_START_TIME = 3,      /* first message with timestamp >= start_time_ms */
} al_topic_start;

typedef struct al_topic_reader_opts {
    const char *const *topics;
    size_t ntopics;
    int32_t partition; /* -1: every partition */
    al_topic_start start;
    int64_t start_offset;  /* AL_TOPIC_START_OFFSET */
    int64_t start_time_ms; /* AL_TOPIC_START_TIME */
    int64_t end_offset;    /* exclusive; -1: none */
    int64_t end_time_ms;   /* inclusive; -1: none */
    int follow;            /* 0: stop at the high watermarks seen at start */
} al_topic_reader_opts;

typedef struct al_topic_reader al_topic_reader;

/* Connects, looks the topics up and assigns their partitions. Does not take ownership of
 * conf. NULL with errstr (an unknown topic, a partition out of range, an unreachable
 * cluster, a start offset no longer on the broker). */
al_topic_reader *al_topic_reader_new(const al_kafka_conf *conf, const al_topic_reader_opts *o,
                                     char *errstr, size_t errlen);
void al_topic_reader_free(al_topic_reader *r);

/* Waits up to timeout_ms for the next message within range.
 *   1: *out is a message (the caller owns it: rd_kafka_message_destroy)
 *   0: nothing yet
 *   2: done: every partition reached its end
 *  -1: failed: errstr says why (offsets gone from the broker, topic deleted) */
int al_topic_reader_next(al_topic_reader *r, int timeout_ms, rd_kafka_message_t **out, char *errstr,
                         size_t errlen);

/* Parses a --partition value: a partition number, 0 to INT32_MAX. 0, or -1 when it is not
 * one (*out untouched). */
int al_topic_parse_partition(const char *s, int32_t *out);

/* Parses a time flag: milliseconds since the epoch, or ISO 8601 UTC
 * (2026-11-29T18:00:00Z, optional .fff). 0, or -1 when it is neither. */
int al_topic_parse_time(const char *s, int64_t *ms_out);

#endif
