/*
 * kafka.h: the Kafka plumbing every arclight stage uses (librdkafka underneath).
 *
 *   al_kafka_conf     client settings, layered: built-in defaults < broker-config/client.conf
 *                     < ARCLIGHT_KAFKA_* environment < --config FILE < flags (--bootstrap)
 *   al_producer       idempotent producer (acks=all, lz4); a delivery report per message,
 *                     routed to the opaque given at send time
 *   al_consumer       consumer-group member (cooperative-sticky, enable.auto.offset.store=false)
 *                     with an offset tracker per partition: an input offset is stored only after
 *                     every message produced from it has been acknowledged by the broker
 *   al_offset_tracker the tracker itself (pure logic, usable on its own)
 *   al_deadletter_publish  the original bytes and the reason, to arclight.deadletter
 *
 * The stage loop (one thread drives the consumer and the producer linked to it), which the
 * stages do not write themselves: kafka/stage.h's worker (al_stage_run) runs it for them:
 *
 *     al_kafka_conf *kc = al_kafka_conf_from_cli(&common, errstr, sizeof errstr);
 *     al_producer *p = al_producer_new(kc, errstr, sizeof errstr);
 *     al_consumer *c = al_consumer_new(kc, "arclight-credit", p, errstr, sizeof errstr);
 *     al_consumer_subscribe(c, topics, 1, errstr, sizeof errstr);
 *     for (;;) {
 *         rd_kafka_message_t *m;
 *         int r = al_consumer_poll(c, 100, &m, errstr, sizeof errstr);
 *         if (r < 0) { al_log_error("credit", "%s", errstr); exit 1; }   // never skip ahead
 *         if (r == 0) continue;
 *         al_input *in = al_consumer_input_begin(c, m);       // holds m's offset
 *         al_kafka_out o = {.topic = "arclight.transitions", .key = .., .input = in, ...};
 *         al_producer_produce(p, &o);                          // input counts one more output
 *         al_input_end(in);  // drops the hold; the offset is stored once all outputs are acked
 *         rd_kafka_message_destroy(m);
 *     }
 *
 * An input may stay open across polls (a stage that waits for the end of a rollout keeps its
 * spans' inputs open): the stored offset then stays at the first open input of its partition.
 * Partitions taken away by a rebalance: the linked producer is flushed and the stored offsets
 * committed first; inputs still open then are orphaned (their offsets are never stored; the
 * next owner re-reads them) and the rebalance callback tells the stage to drop its state.
 *
 * Threading: a producer may be shared by threads for sending; delivery reports, offset
 * tracking and the consumer run on the thread that calls al_consumer_poll / al_producer_poll.
 */
#ifndef ARCLIGHT_KAFKA_H
#define ARCLIGHT_KAFKA_H

#include <librdkafka/rdkafka.h>
#include <stddef.h>
#include <stdint.h>

#include "core/cli.h"

#define AL_TOPIC_SPANS "arclight.spans"
#define AL_TOPIC_TRANSITIONS "arclight.transitions"
#define AL_TOPIC_BATCHES "arclight.batches"
#define AL_TOPIC_POLICY "arclight.policy"
#define AL_TOPIC_DEADLETTER "arclight.deadletter"

/* Client settings named arclight.* are arclight's own, never handed to librdkafka. This one
 * is the session a consumer joins with on the embedded broker (which keeps no static members:
 * lib/kafka/member.c), in ms, default 4000: how long a worker killed with SIGKILL holds its
 * partitions, and how long a live one may go unheard before they are taken from it. Stages
 * that stop when they lose their partitions (batch, train: one worker per model) ask for a
 * longer one. */
#define AL_KAFKA_EMBEDDED_SESSION "arclight.embedded.session.timeout.ms"

/* ------------------------------------------------------------------------------------------
 * Configuration
 * ------------------------------------------------------------------------------------------ */

typedef struct al_kafka_conf al_kafka_conf;

/* Empty configuration (no defaults). NULL only when out of memory. */
al_kafka_conf *al_kafka_conf_new(void);
void al_kafka_conf_free(al_kafka_conf *c);
al_kafka_conf *al_kafka_conf_dup(const al_kafka_conf *c);

/* Sets (replaces) one librdkafka property. 0, or -1 when out of memory. */
int al_kafka_conf_set(al_kafka_conf *c, const char *key, const char *value);
/* The value of a property, or NULL when unset. Valid until the next set/free. */
const char *al_kafka_conf_get(const al_kafka_conf *c, const char *key);
/* Number of properties and the i-th one, in insertion order. */
size_t al_kafka_conf_count(const al_kafka_conf *c);
void al_kafka_conf_at(const al_kafka_conf *c, size_t i, const char **key, const char **value);

/* Reads `key=value` lines ('#' comments, blank lines, whitespace around key and value
 * ignored) over the current settings. -1 with errstr naming the file and line on a
 * missing/unreadable file or a malformed line. */
int al_kafka_conf_load_file(al_kafka_conf *c, const char *path, char *errstr, size_t errlen);
/* Applies ARCLIGHT_KAFKA_* variables: ARCLIGHT_KAFKA_LINGER_MS=5 -> linger.ms=5
 * (lower-case, '_' -> '.'). Returns how many were applied. */
int al_kafka_conf_load_env(al_kafka_conf *c);

/* Path of the default client.conf: $ARCLIGHT_BROKER_CONFIG (a directory holding client.conf,
 * or the file itself) if set, else broker-config/client.conf of the source tree the library
 * was built from. The file may not exist. */
const char *al_kafka_conf_default_path(char *buf, size_t buflen);

/* Path of another file of the broker-config directory (e.g. "topics.conf"): in
 * $ARCLIGHT_BROKER_CONFIG when set (a directory, or a file whose directory is used), else in
 * the source tree's broker-config/. */
const char *al_kafka_config_file_path(const char *name, char *buf, size_t buflen);

/* The full layering: built-in defaults, then the default client.conf (missing: fine), then
 * ARCLIGHT_KAFKA_* variables, then config_file (NULL: none; missing: error), then
 * bootstrap_flag (NULL: not given). When no layer sets bootstrap.servers it becomes
 * $ARCLIGHT_BOOTSTRAP, else 127.0.0.1:9092. NULL with errstr on failure; caller frees. */
al_kafka_conf *al_kafka_conf_load(const char *config_file, const char *bootstrap_flag, char *errstr,
                                  size_t errlen);

/* al_kafka_conf_load from the shared CLI flags. c->bootstrap counts as a flag only when it
 * differs from what al_cli_common_init would default to (so a bootstrap.servers in --config
 * wins over the built-in default). */
al_kafka_conf *al_kafka_conf_from_cli(const al_cli_common *c, char *errstr, size_t errlen);

/* A librdkafka configuration holding every property of c plus arclight's log and error
 * callbacks (so that librdkafka's log lines go through al_log). NULL with errstr naming the
 * offending property. The caller owns the result (rd_kafka_new takes it over). For tools
 * that need a raw handle (admin clients, tail without a group). */
rd_kafka_conf_t *al_kafka_conf_build(const al_kafka_conf *c, char *errstr, size_t errlen);

/* ------------------------------------------------------------------------------------------
 * Topic definitions (broker-config/topics.conf): NAME PARTITIONS REPLICATION [key=value ...]
 * ------------------------------------------------------------------------------------------ */

typedef struct al_topic_spec {
    char *name;
    int partitions;
    int replication;
    al_kafka_conf *settings; /* topic-level settings, in file order */
} al_topic_spec;

/* Reads a topics file. 0 with *out (an array of *n, free with al_topics_free), or -1 with
 * errstr naming the file and line (bad name, count or setting, duplicate topic). */
int al_topics_load(const char *path, al_topic_spec **out, size_t *n, char *errstr, size_t errlen);
void al_topics_free(al_topic_spec *t, size_t n);

/* ------------------------------------------------------------------------------------------
 * Errors
 * ------------------------------------------------------------------------------------------ */

typedef enum al_kafka_errclass {
    AL_KAFKA_ERRCLASS_NONE = 0,
    /* transient: the broker is away, a queue is full, a leader moves; try again later */
    AL_KAFKA_ERRCLASS_RETRIABLE = 1,
    /* this message or unit of work cannot succeed (too large, unknown topic, invalid):
     * dead-letter or abort it; the client itself is fine */
    AL_KAFKA_ERRCLASS_ABORTABLE = 2,
    /* the client is unusable (fatal idempotent-producer error, lost offsets, auth):
     * stop the process with an error */
    AL_KAFKA_ERRCLASS_FATAL = 3,
} al_kafka_errclass;

al_kafka_errclass al_kafka_error_classify(rd_kafka_resp_err_t err);
const char *al_kafka_errclass_name(al_kafka_errclass c);

/* Checks that the cluster answers a metadata request within timeout_ms. 0, or -1 with e.g.
 * "cannot reach Kafka at 127.0.0.1:9999: Connection refused (all brokers down)". */
int al_kafka_check_reachable(rd_kafka_t *rk, int timeout_ms, char *errstr, size_t errlen);

/* ------------------------------------------------------------------------------------------
 * Offset tracker: one per consumed partition, pure bookkeeping.
 * ------------------------------------------------------------------------------------------ */

typedef struct al_offset_tracker al_offset_tracker;

al_offset_tracker *al_offset_tracker_new(void);
void al_offset_tracker_free(al_offset_tracker *t);
/* Records input `offset` with `pending` outputs not yet acknowledged (0: done already).
 * Offsets must increase from call to call. -1 if offset does not increase or out of memory. */
int al_offset_tracker_add(al_offset_tracker *t, int64_t offset, int pending);
/* One more output for a tracked, still pending input. -1 if offset is not pending. */
int al_offset_tracker_inc(al_offset_tracker *t, int64_t offset);
/* One output of input `offset` acknowledged. -1 if offset is not tracked or not pending. */
int al_offset_tracker_ack(al_offset_tracker *t, int64_t offset);
/* The offset to store (the next one to read after a restart): the first still-pending input,
 * or one past the last finished input when none is pending; -1 before the first add. Never
 * moves past a pending input. */
int64_t al_offset_tracker_committable(const al_offset_tracker *t);
/* Inputs still pending. */
size_t al_offset_tracker_pending(const al_offset_tracker *t);

/* ------------------------------------------------------------------------------------------
 * Producer
 * ------------------------------------------------------------------------------------------ */

typedef struct al_producer al_producer;
typedef struct al_consumer al_consumer;
typedef struct al_input al_input;

typedef struct al_delivery {
    void *opaque;            /* as given to al_producer_produce / al_producer_send */
    rd_kafka_resp_err_t err; /* 0: acknowledged by the broker (acks=all) */
    const char *reason;      /* why it failed (names topic and bootstrap); "" on success */
    const char *topic;
    int32_t partition;
    int64_t offset; /* the message's offset in the topic, -1 when it failed */
} al_delivery;

/* Called once per produced message from al_producer_poll/al_producer_flush/al_consumer_poll,
 * on the thread that polls. `d` is valid during the call only. */
typedef void (*al_delivery_fn)(const al_delivery *d, void *ctx);

/* Creates an idempotent producer (enable.idempotence=true, acks=all are enforced: a conf
 * that says otherwise is refused). Does not connect yet (see al_producer_check). Does not
 * take ownership of conf. NULL with errstr on failure. */
al_producer *al_producer_new(const al_kafka_conf *conf, char *errstr, size_t errlen);
/* Flushes for up to 10 s (messages still queued after that are reported lost in the log)
 * and frees. NULL-safe. */
void al_producer_free(al_producer *p);
/* The same with the flush bounded by timeout_ms (a stage's drain budget): what is not
 * acknowledged by then gets a failed delivery report. */
void al_producer_free_within(al_producer *p, int timeout_ms);

/* Routes delivery reports to fn(ctx). Set it before the first send. */
void al_producer_set_delivery_cb(al_producer *p, al_delivery_fn fn, void *ctx);
/* How long a send waits (polling for delivery reports) while the local queue is full before
 * it gives up with RD_KAFKA_RESP_ERR__QUEUE_FULL. Default 30000; 0: never wait. */
void al_producer_set_block_ms(al_producer *p, int block_ms);

#define AL_KAFKA_PARTITION_ANY (-1)

typedef struct al_kafka_out {
    const char *topic;
    int32_t partition; /* AL_KAFKA_PARTITION_ANY: by key (murmur2, like Java clients) */
    const void *key;
    size_t keylen;
    const void *value;
    size_t len;
    const rd_kafka_headers_t *headers; /* copied; NULL: none */
    int64_t timestamp_ms;              /* 0: now */
    al_input *input; /* the consumed input this output comes from (NULL: none): it counts one
                        more output, acknowledged by this message's delivery report */
    void *opaque;    /* handed to the delivery callback */
} al_kafka_out;

/* Queues one message (key and value are copied). Returns 0, or the librdkafka error code:
 * __QUEUE_FULL after block_ms, __FATAL after a fatal producer error (al_producer_fatal),
 * __UNKNOWN_TOPIC, MSG_SIZE_TOO_LARGE, ... (al_kafka_error_classify tells them apart). On
 * failure no delivery report will come and m->input is left unchanged. */
rd_kafka_resp_err_t al_producer_produce(al_producer *p, const al_kafka_out *m);
/* Shorthand for al_producer_produce with partition by key, timestamp now, no input. */
rd_kafka_resp_err_t al_producer_send(al_producer *p, const char *topic, const void *key,
                                     size_t keylen, const void *value, size_t vlen,
                                     const rd_kafka_headers_t *headers, void *opaque);

/* Serves delivery reports and errors for up to timeout_ms. Returns the number served. */
int al_producer_poll(al_producer *p, int timeout_ms);
/* Waits until every queued message has its delivery report (served) or timeout_ms passes.
 * 0, or -1 with errstr ("N messages still in flight after T ms: <last broker error>"). */
int al_producer_flush(al_producer *p, int timeout_ms, char *errstr, size_t errlen);
/* Messages queued or in flight without a delivery report yet. */
int al_producer_outq_len(al_producer *p);
/* Messages queued by al_producer_produce since the producer was made. */
unsigned long long al_producer_sent(al_producer *p);
/* Nonzero after a fatal error (idempotent-producer state lost): the reason in errstr. The
 * producer must be freed; a new one may be created. */
int al_producer_fatal(al_producer *p, char *errstr, size_t errlen);
/* Connects and fetches metadata within timeout_ms: 0, or -1 with "cannot reach Kafka at
 * <bootstrap>: <reason>". */
int al_producer_check(al_producer *p, int timeout_ms, char *errstr, size_t errlen);
/* Learns the partitions and leaders of the topics the producer will write, within
 * timeout_ms, so that the first message is not held until librdkafka's once-a-second scan
 * for topics it knows nothing about (up to a second of latency, and of back-pressure on a
 * stage that consumes while it produces). Call it once before the first send. 0 when every
 * topic has partitions; -1 with errstr naming the first topic that is missing or the broker
 * error. The producer stays usable either way: sends still queue and wait for metadata. */
int al_producer_prepare(al_producer *p, const char *const *topics, int timeout_ms, char *errstr,
                        size_t errlen);
/* The most recent broker-level error seen (connection refused, all brokers down...), with
 * the bootstrap servers named; "" when none. Copies into buf and returns buf. */
const char *al_producer_last_error(al_producer *p, char *buf, size_t buflen);
rd_kafka_t *al_producer_handle(al_producer *p);

/* ------------------------------------------------------------------------------------------
 * Consumer
 * ------------------------------------------------------------------------------------------ */

typedef enum al_rebalance_event {
    AL_REBALANCE_ASSIGNED = 1, /* these partitions are now ours (in addition to others) */
    AL_REBALANCE_REVOKED = 2,  /* these partitions go now (offsets were committed already);
                                  inputs still open on them are orphaned: drop their state */
    AL_REBALANCE_LOST = 3,     /* these partitions were lost without a commit (session timeout) */
} al_rebalance_event;

typedef void (*al_rebalance_fn)(al_consumer *c, al_rebalance_event ev,
                                const rd_kafka_topic_partition_list_t *parts, void *ctx);

/* Creates a consumer-group member (group.id = group; cooperative-sticky;
 * enable.auto.offset.store=false; auto.offset.reset=error unless conf says earliest/latest,
 * in which case a lost offset still stops the consumer: see al_consumer_poll). `linked` is
 * the producer its outputs go to (may be NULL): it is polled with the consumer and flushed
 * before partitions are given up. Does not take ownership of conf or linked (free the
 * consumer first). NULL with errstr on failure. */
al_consumer *al_consumer_new(const al_kafka_conf *conf, const char *group, al_producer *linked,
                             char *errstr, size_t errlen);
/* Leaves the group (flushing linked and committing stored offsets) and frees, within
 * AL_CONSUMER_CLOSE_MS. NULL-safe. */
#define AL_CONSUMER_CLOSE_MS 30000
void al_consumer_free(al_consumer *c);
/* The same within timeout_ms: the flush of the linked producer, the commit and the leave are
 * given up when the broker does not answer in time (a warning says so; what was not committed
 * is read again by the next owner), so that a stop never waits on an unreachable broker. */
void al_consumer_free_within(al_consumer *c, int timeout_ms);
/* Subscribes to n topics. 0, or -1 with errstr. */
int al_consumer_subscribe(al_consumer *c, const char *const *topics, size_t n, char *errstr,
                          size_t errlen);
/* fn runs inside al_consumer_poll (and al_consumer_free, which revokes everything). */
void al_consumer_set_rebalance_cb(al_consumer *c, al_rebalance_fn fn, void *ctx);

/* Waits up to timeout_ms for the next message, serving rebalances, the linked producer's
 * delivery reports and offset stores meanwhile. Messages are taken from librdkafka up to
 * 128 at a time and handed out one per call; the reports and stores are served between
 * such batches. Messages taken before a rebalance that revoked their partition are dropped.
 *   1: *out is a message; the caller owns it (rd_kafka_message_destroy). With
 *      enable.partition.eof=true it may also be an end-of-partition event (m->err ==
 *      RD_KAFKA_RESP_ERR__PARTITION_EOF), which is not an input.
 *   0: nothing yet (timeout); transient errors are logged and retried inside
 *  -1: stop: errstr says why. A committed offset no longer on the broker gives
 *      "arclight.spans [3]: committed offset 120 is gone from the broker (earliest is 4000):
 *       offsets 120..3999 were lost; refusing to skip them"; a failed output of a tracked
 *      input or a fatal client error does the same. */
int al_consumer_poll(al_consumer *c, int timeout_ms, rd_kafka_message_t **out, char *errstr,
                     size_t errlen);

/* Starts tracking message m (from al_consumer_poll) as an input: its offset will not be
 * stored before al_input_end(in) and before every output produced with .input = in is
 * acknowledged. Never NULL except out of memory. The handle stays valid until al_input_end. */
al_input *al_consumer_input_begin(al_consumer *c, const rd_kafka_message_t *m);
/* Releases the hold taken by al_consumer_input_begin; the input is done when its outputs are
 * acknowledged too. The handle must not be used afterwards. */
void al_input_end(al_input *in);
/* Marks a message as done without outputs (e.g. a filtered message): begin + end. */
void al_consumer_input_skip(al_consumer *c, const rd_kafka_message_t *m);

/* Commits stored offsets now (synchronously). 0, or -1 with errstr. Stored offsets are also
 * committed every auto.commit.interval.ms and on rebalance/close. */
int al_consumer_commit(al_consumer *c, char *errstr, size_t errlen);
/* The same, waiting at most timeout_ms for the broker's answer (-1 with "no answer" past it;
 * the commit may still land later). */
int al_consumer_commit_within(al_consumer *c, int timeout_ms, char *errstr, size_t errlen);
/* Stores the committable offsets and asks for their commit without waiting (the answer is
 * librdkafka's to handle; a failure leaves the next periodic commit to do it). Nothing when
 * the owner writes the commits (al_consumer_set_commit_fn: transactions). */
void al_consumer_commit_async(al_consumer *c);
/* Commits written by the consumer's owner instead of librdkafka's (the stage worker's
 * transactions, kafka/stage.h): once set, the consumer stores no offsets, and every commit
 * it would make (al_consumer_commit*, a revoke after its flush, the close) calls fn, which
 * returns 0 or -1 with errstr. The owner reads the tracked offsets with
 * al_consumer_committable. Set it before subscribing, with enable.auto.commit=false. A failed
 * delivery of an input's output then does not stop the consumer (it keeps that input's offset
 * uncommitted): the owner aborts and rewinds (al_consumer_drop_all, al_consumer_seek_committed). */
typedef int (*al_commit_fn)(al_consumer *c, const char *why, int timeout_ms, char *errstr,
                            size_t errlen, void *ctx);
void al_consumer_set_commit_fn(al_consumer *c, al_commit_fn fn, void *ctx);
/* With owner-written commits, a fatal error of the linked producer does not stop the consumer
 * (al_consumer_poll returns nothing instead): the owner replaces the producer (this call, no
 * message of the old one still to be reported) or stops. */
void al_consumer_set_linked(al_consumer *c, al_producer *linked);
/* Each assigned partition's committable offset (the next to read after a restart: see
 * al_offset_tracker_committable), partitions without one left out. The caller destroys it. */
rd_kafka_topic_partition_list_t *al_consumer_committable(al_consumer *c);
/* The metadata string committed with the offset a partition resumed from (at its assignment
 * or the last al_consumer_seek_committed), NUL-terminated, NULL when none or the partition is
 * not assigned; *offset (may be NULL) the committed offset it came with (-1: none). Valid
 * until the next poll. */
const char *al_consumer_committed_metadata(al_consumer *c, const char *topic, int32_t partition,
                                           int64_t *offset);
/* Undoing the work since the last commit, in two halves. drop_all orphans every assigned
 * partition's inputs (their offsets are never stored, failed outputs no longer stop the
 * consumer) and tells the rebalance callback they were lost (the stage drops their state),
 * while the partitions stay assigned; seek_committed then starts each assigned partition's
 * tracking afresh at its committed offset (fetched now) and seeks it there. 0, or -1 with
 * errstr (the broker did not answer: the caller stops). */
void al_consumer_drop_all(al_consumer *c);
int al_consumer_seek_committed(al_consumer *c, char *errstr, size_t errlen);
/* Connects and fetches metadata within timeout_ms: 0, or -1 naming the bootstrap servers. */
int al_consumer_check(al_consumer *c, int timeout_ms, char *errstr, size_t errlen);
rd_kafka_t *al_consumer_handle(al_consumer *c);
/* Whether the consumer has read topic [partition] to the high watermark its last fetch saw
 * (1, also when that watermark is unknown) or something is known to be waiting there (0).
 * Read means its position, or next_offset (one past the last message handed out) if that is
 * further: input written in transactions ends with a marker, an offset read_committed never
 * hands out, so one past the last message is short of the end. */
int al_consumer_read_to_end(al_consumer *c, const char *topic, int32_t partition,
                            int64_t next_offset);
/* How many commits made when partitions were given up (a rebalance, a close) the broker
 * refused; a broker may refuse them while the group rebalances. Each leaves the partitions'
 * messages after their last committed offset to be read again by the next owner (at least
 * once: outputs carry ids that make them droppable). */
uint64_t al_consumer_commit_failures(const al_consumer *c);

/* A consumer handle for rd_kafka_assign only (no group membership, no commits), for reading
 * a topic without disturbing any group: the shared settings less producer-only keys and
 * group.id, a group name "<group_prefix>-PID-MICROS" that only assign uses, automatic
 * commits and offset stores off, partition-EOF events on, consumer polling set. The caller
 * owns it (rd_kafka_consumer_close + rd_kafka_destroy). NULL with errstr. */
rd_kafka_t *al_kafka_reader_new(const al_kafka_conf *conf, const char *group_prefix,
                                char *errstr, size_t errlen);

/* The low and high watermarks of topic [partition] as its leader has them, within timeout_ms.
 * Errors that pass (real Kafka answers NOT_LEADER_OR_FOLLOWER, LEADER_NOT_AVAILABLE or
 * OFFSET_NOT_AVAILABLE while a leader is being elected, e.g. just after the topic was
 * created or a broker went away) are retried until the deadline; others return at once.
 * Returns librdkafka's error code (0: *lo and *hi set). */
rd_kafka_resp_err_t al_kafka_watermarks(rd_kafka_t *rk, const char *topic, int32_t partition,
                                        int64_t *lo, int64_t *hi, int timeout_ms);

/* ------------------------------------------------------------------------------------------
 * Dead letters
 * ------------------------------------------------------------------------------------------ */

/* Publishes a message that cannot be processed to arclight.deadletter, keyed by its original
 * key: the value is the Avro DeadLetter record (lib/avro/codec.h) holding the original bytes,
 * source topic/partition/offset, reason and stage; the original headers are kept. `in` (may be
 * NULL) counts the dead letter as one of its outputs, so the input's offset is stored only
 * once the dead letter is acknowledged. 0, or -1 with errstr (encoding or produce error). */
int al_deadletter_publish(al_producer *p, const char *src_topic, int32_t partition, int64_t offset,
                          const void *key, size_t keylen, const void *value, size_t vlen,
                          const rd_kafka_headers_t *headers, const char *reason, const char *stage,
                          al_input *in, void *opaque, char *errstr, size_t errlen);
/* Shorthand: dead-letters a consumed message m (its topic, partition, offset, timestamp,
 * key, value, headers) as an output of input `in` (may be NULL). 0 or -1 with errstr. */
int al_deadletter_message(al_producer *p, const rd_kafka_message_t *m, const char *reason,
                          const char *stage, al_input *in, char *errstr, size_t errlen);

#endif
