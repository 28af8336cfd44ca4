/*
 * arclight record: writes topics into an Avro object container file, one
 * ai.arclight.Recording record (schemas/Recording.avsc) per message: topic, partition,
 * offset, timestamp and its type, key, value and headers, byte for byte. Any Avro tool reads
 * the file (avrocat, avro-tools tojson, fastavro); `arclight replay` publishes it back.
 *
 * The reader is assign-based (topic_reader.h): recording never joins a consumer group.
 */
#include "avro/registry.h"
#include "core/cli.h"
#include "core/flags.h"
#include "core/log.h"
#include "core/util.h"
#include "http/server.h"
#include "kafka/kafka.h"
#include "kafka/topic_reader.h"

#include <avro.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static volatile sig_atomic_t record_stop;

static void record_on_signal(int sig)
{
    record_stop = 1;
}

#define RECORD_BLOCK_SIZE (4u << 20)

typedef struct recorder {
    const char *path;
    const char *codec;
    avro_schema_t schema;
    avro_value_iface_t *iface;
    avro_value_t rec;
    int rec_ok;
    avro_file_writer_t writer;
    size_t block_size;
} recorder;

static void recorder_close(recorder *w)
{
    if (w->writer) avro_file_writer_close(w->writer);
    w->writer = NULL;
    if (w->rec_ok) avro_value_decref(&w->rec);
    w->rec_ok = 0;
    if (w->iface) avro_value_iface_decref(w->iface);
    w->iface = NULL;
    if (w->schema) avro_schema_decref(w->schema);
    w->schema = NULL;
}

/* Creates (truncates) the file and writes the container header. 0, or -1 with errstr. */
static int recorder_open(recorder *w, char *errstr, size_t errlen)
{
    const al_schema_info *si = al_schema_by_name("ai.arclight.Recording");
    if (!si)
        return al_err(errstr, errlen,
                      "the Recording schema is not built in "
                      "(schemas/Recording.avsc missing at build time)");
    if (avro_schema_from_json_length(si->json, strlen(si->json), &w->schema) != 0)
        return al_err(errstr, errlen, "schemas/Recording.avsc: %s", avro_strerror());
    w->iface = avro_generic_class_from_schema(w->schema);
    if (!w->iface || avro_generic_value_new(w->iface, &w->rec) != 0)
        return al_err(errstr, errlen, "cannot build a Recording value: %s", avro_strerror());
    w->rec_ok = 1;
    FILE *fp = fopen(w->path, "wb");
    if (!fp) return al_err(errstr, errlen, "cannot create %s: %s", w->path, strerror(errno));
    w->block_size = RECORD_BLOCK_SIZE;
    if (avro_file_writer_create_with_codec_fp(fp, w->path, 1, w->schema, &w->writer, w->codec,
                                              w->block_size) != 0) {
        w->writer = NULL;
        return al_err(errstr, errlen, "cannot write an Avro container to %s: %s", w->path,
                      avro_strerror());
    }
    return 0;
}

/* Sets a ["null","bytes"] union to the bytes, or to null when p is NULL. */
static int set_nullable_bytes(avro_value_t *u, const void *p, size_t n)
{
    avro_value_t branch;
    if (!p) return avro_value_set_branch(u, 0, &branch) || avro_value_set_null(&branch);
    /* avro-c copies the bytes; a zero-length value still needs a non-NULL pointer */
    return avro_value_set_branch(u, 1, &branch) ||
           avro_value_set_bytes(&branch, (void *)(n ? p : ""), n);
}

/* Fills the reusable record from a message. 0, or -1 (out of memory inside avro-c). */
static int recorder_fill(recorder *w, const rd_kafka_message_t *m)
{
    avro_value_t f, h, hf;
    rd_kafka_timestamp_type_t tstype;
    int64_t ts = rd_kafka_message_timestamp(m, &tstype);
    int e = 0;
    avro_value_reset(&w->rec);
    e |= avro_value_get_by_name(&w->rec, "topic", &f, NULL) ||
         avro_value_set_string(&f, rd_kafka_topic_name(m->rkt));
    e |= avro_value_get_by_name(&w->rec, "partition", &f, NULL) ||
         avro_value_set_int(&f, m->partition);
    e |= avro_value_get_by_name(&w->rec, "offset", &f, NULL) || avro_value_set_long(&f, m->offset);
    e |= avro_value_get_by_name(&w->rec, "timestamp", &f, NULL) || avro_value_set_long(&f, ts);
    e |= avro_value_get_by_name(&w->rec, "timestamp_type", &f, NULL) ||
         avro_value_set_enum(&f, tstype == RD_KAFKA_TIMESTAMP_CREATE_TIME       ? 1
                                 : tstype == RD_KAFKA_TIMESTAMP_LOG_APPEND_TIME ? 2
                                                                                : 0);
    e |= avro_value_get_by_name(&w->rec, "key", &f, NULL) ||
         set_nullable_bytes(&f, m->key, m->key_len);
    e |= avro_value_get_by_name(&w->rec, "value", &f, NULL) ||
         set_nullable_bytes(&f, m->payload, m->len);
    e |= avro_value_get_by_name(&w->rec, "headers", &f, NULL);
    rd_kafka_headers_t *hdrs = NULL;
    if (!e && rd_kafka_message_headers(m, &hdrs) == 0 && hdrs) {
        const char *name;
        const void *val;
        size_t vlen;
        for (size_t i = 0; !e && rd_kafka_header_get_all(hdrs, i, &name, &val, &vlen) == 0; i++) {
            e |= avro_value_append(&f, &h, NULL);
            e |= e || avro_value_get_by_name(&h, "name", &hf, NULL) ||
                 avro_value_set_string(&hf, name);
            e |= e || avro_value_get_by_name(&h, "value", &hf, NULL) ||
                 set_nullable_bytes(&hf, val, vlen);
        }
    }
    return e ? -1 : 0;
}

/* Appends the filled record. A record larger than the block size gets the file reopened
 * with blocks big enough for it (avro-c cannot split a record over blocks). 0, or -1. */
static int recorder_append(recorder *w, size_t approx_size, char *errstr, size_t errlen)
{
    if (avro_file_writer_append_value(w->writer, &w->rec) == 0) return 0;
    size_t need = approx_size * 2 + (64u << 10);
    if (need <= w->block_size)
        return al_err(errstr, errlen, "cannot append to %s: %s", w->path, avro_strerror());
    if (avro_file_writer_close(w->writer) != 0) {
        w->writer = NULL;
        return al_err(errstr, errlen, "cannot write %s: %s", w->path, avro_strerror());
    }
    w->writer = NULL;
    if (avro_file_writer_open_bs(w->path, &w->writer, need) != 0) {
        w->writer = NULL;
        return al_err(errstr, errlen, "cannot reopen %s for a %zu-byte message: %s", w->path,
                      approx_size, avro_strerror());
    }
    w->block_size = need;
    if (avro_file_writer_append_value(w->writer, &w->rec) != 0)
        return al_err(errstr, errlen, "cannot append a %zu-byte message to %s: %s", approx_size,
                      w->path, avro_strerror());
    return 0;
}

/* --start-time, --end-time: milliseconds since the epoch or an ISO time (topic_reader.h). */
static int record_parse_time(void *dest, const char *v, char *err, size_t errlen)
{
    if (al_topic_parse_time(v, dest) == 0) return 0;
    snprintf(err, errlen, "wants milliseconds since the epoch or YYYY-MM-DDTHH:MM:SSZ");
    return -1;
}

/* --partition: a partition number (topic_reader.h's rule). */
static int record_parse_partition(void *dest, const char *v, char *err, size_t errlen)
{
    if (al_topic_parse_partition(v, dest) == 0) return 0;
    snprintf(err, errlen, "wants a partition number");
    return -1;
}

static const char *const record_codecs[] = {"deflate", "snappy", "null", NULL};

/* Copies messages from r into w until the end (or a stop signal), the file closed at the
 * end; *count gets how many. AL_EXIT_OK, or AL_EXIT_FAILURE (logged). */
static int record_loop(recorder *w, al_topic_reader *r, int follow, al_counter *recorded,
                       al_counter *bytes, long long *count_out)
{
    char err[1024];
    int rc = AL_EXIT_OK;
    struct sigaction sa = {.sa_handler = record_on_signal}, old_int, old_term;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_int);
    sigaction(SIGTERM, &sa, &old_term);
    long long count = 0;
    int64_t last_flush = al_mono_us(), last_report = last_flush;
    while (!record_stop) {
        rd_kafka_message_t *m;
        int n = al_topic_reader_next(r, 200, &m, err, sizeof err);
        if (n < 0) {
            al_log_error("record", "%s", err);
            rc = AL_EXIT_FAILURE;
            break;
        }
        if (n == 2) break;
        if (n == 1) {
            size_t size = m->len + m->key_len + 256;
            int bad = recorder_fill(w, m) != 0;
            if (bad) al_err(err, sizeof err, "cannot fill a record: %s", avro_strerror());
            if (!bad) bad = recorder_append(w, size, err, sizeof err) != 0;
            rd_kafka_message_destroy(m);
            if (bad) {
                al_log_error("record", "%s", err);
                rc = AL_EXIT_FAILURE;
                break;
            }
            count++;
            al_counter_inc(recorded);
            al_counter_add(bytes, (double)(size - 256));
        }
        /* A follower flushes every second so that the file is readable while it grows. */
        int64_t now = al_mono_us();
        if (follow && now - last_flush >= 1000000) {
            avro_file_writer_flush(w->writer);
            last_flush = now;
        }
        if (now - last_report >= 10000000) {
            al_log_info("record", "%lld messages recorded into %s", count, w->path);
            last_report = now;
        }
    }
    sigaction(SIGINT, &old_int, NULL);
    sigaction(SIGTERM, &old_term, NULL);
    if (w->writer && avro_file_writer_close(w->writer) != 0) {
        al_log_error("record", "cannot finish %s: %s", w->path, avro_strerror());
        rc = AL_EXIT_FAILURE;
    }
    w->writer = NULL;
    *count_out = count;
    return rc;
}

int cmd_record(int argc, char **argv)
{
    al_cli_common common;
    al_topic_reader_opts ro = {
        .partition = -1, .start = AL_TOPIC_START_BEGINNING, .end_offset = -1, .end_time_ms = -1};
    recorder w = {.codec = "deflate"};
    int from_beginning = 0;
    int64_t start_offset = -1, start_time = -1;
    const al_flag flags[] = {
        {"output", 'o', AL_FLAG_STRING, &w.path, .arg = "FILE",
         .help = "the recording (replaced if it exists)"},
        {"from-beginning", 0, AL_FLAG_SWITCH, &from_beginning,
         .help = "start at the oldest message on the broker (the default)"},
        {"start-offset", 0, AL_FLAG_I64, &start_offset, .lo = 0, .hi = INT64_MAX, .arg = "N",
         .help = "start at offset N in every partition"},
        {"start-time", 0, AL_FLAG_FUNC, &start_time, .arg = "T",
         .help = "start at the first message with timestamp >= T", .parse = record_parse_time},
        {"end-offset", 0, AL_FLAG_I64, &ro.end_offset, .lo = 0, .hi = INT64_MAX, .arg = "N",
         .help = "stop before offset N in every partition"},
        {"end-time", 0, AL_FLAG_FUNC, &ro.end_time_ms, .arg = "T",
         .help = "stop at the first message with timestamp > T\n"
                 "(T: milliseconds since the epoch or 2026-11-29T18:00:00Z)",
         .parse = record_parse_time},
        {"codec", 0, AL_FLAG_STRING, &w.codec, .arg = "C", .choices = record_codecs,
         .help = "block compression: deflate (default), snappy or null"},
        {"follow", 'f', AL_FLAG_SWITCH, &ro.follow,
         .help = "keep recording new messages until interrupted (Ctrl-C closes\n"
                 "the file cleanly); default: stop at the end of each partition\n"
                 "as it was when record started"},
        {"partition", 'p', AL_FLAG_FUNC, &ro.partition, .arg = "P",
         .help = "record only partition P", .parse = record_parse_partition},
    };
    const al_cmd_spec spec = {
        "record",
        "TOPIC... -o FILE [--from-beginning | --start-offset N |\n"
        "                       --start-time T] [--end-offset N | --end-time T]\n"
        "                       [--codec deflate|snappy|null] [--follow] [--partition P]",
        "Writes the topics' messages (keys, values, headers, timestamps, partitions, offsets)\n"
        "into an Avro object container file of ai.arclight.Recording records\n"
        "(schemas/Recording.avsc). Never joins a consumer group.\n",
        flags, AL_ARRAY_LEN(flags), .common = 1};
    int first;

    al_cli_common_init(&common);
    int rc = al_flags_parse(&spec, &common, argc, argv, &first);
    if (rc != AL_FLAGS_GO) return rc;
    int nstart = from_beginning + (start_offset >= 0) + (start_time >= 0);
    if (start_offset >= 0) ro.start = AL_TOPIC_START_OFFSET, ro.start_offset = start_offset;
    if (start_time >= 0) ro.start = AL_TOPIC_START_TIME, ro.start_time_ms = start_time;
    if (first >= argc) return al_cli_usage_error("record", "name at least one TOPIC");
    if (!w.path || !*w.path) return al_cli_usage_error("record", "-o FILE is required");
    if (nstart > 1)
        return al_cli_usage_error("record", "give at most one of --from-beginning, "
                                            "--start-offset and --start-time");
    if (ro.start == AL_TOPIC_START_OFFSET && ro.end_offset >= 0 && ro.end_offset < ro.start_offset)
        return al_cli_usage_error("record", "--end-offset %lld is before --start-offset %lld",
                                  (long long)ro.end_offset, (long long)ro.start_offset);
    if (ro.start == AL_TOPIC_START_TIME && ro.end_time_ms >= 0 && ro.end_time_ms < ro.start_time_ms)
        return al_cli_usage_error("record", "--end-time is before --start-time");
    ro.topics = (const char *const *)argv + first;
    ro.ntopics = (size_t)(argc - first);

    char err[1024];
    al_kafka_conf *kc = al_kafka_conf_from_cli(&common, err, sizeof err);
    if (!kc) {
        al_log_error("record", "%s", err);
        return AL_EXIT_FAILURE;
    }
    rc = AL_EXIT_OK;
    al_topic_reader *r = NULL;
    al_http_server *srv = NULL;
    al_metrics *metrics = al_metrics_new();
    al_counter *recorded = al_metrics_counter(metrics, "arclight_record_messages_total",
                                              "Messages written to the recording.", NULL);
    al_counter *bytes = al_metrics_counter(metrics, "arclight_record_value_bytes_total",
                                           "Key and value bytes written to the recording.", NULL);
    if (common.metrics &&
        !(srv = al_http_server_start(common.metrics, metrics, NULL, NULL, err, sizeof err))) {
        al_log_error("record", "%s", err);
        rc = AL_EXIT_FAILURE;
        goto out;
    }
    r = al_topic_reader_new(kc, &ro, err, sizeof err);
    if (!r) {
        al_log_error("record", "%s", err);
        rc = AL_EXIT_FAILURE;
        goto out;
    }
    if (recorder_open(&w, err, sizeof err) != 0) {
        al_log_error("record", "%s", err);
        rc = AL_EXIT_FAILURE;
        goto out;
    }

    long long count = 0;
    rc = record_loop(&w, r, ro.follow, recorded, bytes, &count);
    if (rc == AL_EXIT_OK)
        al_log_info("record", "recorded %lld messages from %zu topic%s into %s (%s)", count,
                    ro.ntopics, ro.ntopics == 1 ? "" : "s", w.path, w.codec);
out:
    recorder_close(&w);
    al_topic_reader_free(r);
    al_http_server_stop(srv);
    al_metrics_free(metrics);
    al_kafka_conf_free(kc);
    return rc;
}
