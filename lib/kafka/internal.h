/*
 * internal.h: what the files of lib/kafka share and nothing else should use.
 */
#ifndef ARCLIGHT_KAFKA_INTERNAL_H
#define ARCLIGHT_KAFKA_INTERNAL_H

#include "kafka/kafka.h"

/* librdkafka configuration from c, leaving out the keys in skip (NULL-terminated, may be
 * NULL), with arclight's log and error callbacks set. */
rd_kafka_conf_t *al_kafka__conf_build(const al_kafka_conf *c, const char *const *skip, char *errstr,
                                      size_t errlen);
/* What every error callback does first: logs and remembers connection failure reasons. */
void al_kafka__error_common(rd_kafka_t *rk, int err, const char *reason);
/* Last connection failure reason seen for rk; 1 if there is one. */
int al_kafka__reason_get(const rd_kafka_t *rk, char *buf, size_t buflen);
void al_kafka__reason_forget(const rd_kafka_t *rk);
/* "cannot reach Kafka at <bootstrap>: <reason or what> (all brokers down)" */
void al_kafka__unreachable_message(rd_kafka_t *rk, const char *what, char *errstr, size_t errlen);

/* The consumer's static group membership id for group (member.c): written to id ("" for
 * dynamic membership). *lock_fd is the slot's lock file, held while the consumer lives (-1:
 * none). Always 0. */
int al_kafka__member_id(const al_kafka_conf *conf, const char *group, char *id, size_t idlen,
                        int *lock_fd);

/* Whether the cluster rk talks to keeps static group members: 0 on the embedded broker
 * (librdkafka's mock cluster, which keeps none), 1 otherwise, also when it does not answer
 * within 2 s (member.c). */
int al_kafka__keeps_static_members(rd_kafka_t *rk);

/* The longest session a consumer keeps on the embedded broker (member.c): a worker killed
 * with SIGKILL hands its partitions on after this. */
#define AL_MEMBER_EMBEDDED_SESSION_MS 4000

/* Per-partition state of a consumer, shared by the al_input handles that point into it. It
 * outlives a revocation while inputs still refer to it. */
typedef struct al_part_state {
    struct al_consumer *consumer; /* NULL once revoked */
    char *topic;
    int32_t partition;
    al_offset_tracker *tracker;
    int64_t stored; /* last offset handed to rd_kafka_offsets_store, -1 none */
    /* the metadata of the partition's committed offset when it was assigned (or rewound):
     * what the stage wrote with it (al_consumer_committed_metadata); NULL: none */
    char *meta;
    int64_t meta_offset;
    int refs;       /* the consumer's map entry + live inputs */
} al_part_state;

struct al_input {
    al_part_state *ps;
    int64_t offset;
    int refs; /* the begin/end hold + outputs not yet acknowledged */
};

/* Called by the producer for each delivery report of an output of `in`. */
void al_input__delivered(al_input *in, rd_kafka_resp_err_t err, const char *reason);
/* Adds one output to in (before producing it); -1 if the input is already finished. */
int al_input__add_output(al_input *in);
/* Undoes al_input__add_output when the produce call failed. */
void al_input__drop_output(al_input *in);

#endif
