/*
 * arclight tail: prints topics' messages as JSON lines, one object per message:
 *
 *   {"topic":"arclight.spans","partition":0,"offset":12,"timestamp":1764441000123,
 *    "timestamp_type":"create","key":"task-7","headers":[{"name":"h","value":"v"}],
 *    "value":{...decoded Avro...}}
 *
 * A value that does not decode gives {"...","error":"why","value_base64":"..."} instead of
 * "value"; a tombstone gives "value":null. Keys and header values that are not UTF-8 come as
 * "key_base64" / "value_base64". Reads with an assign-based consumer (topic_reader.h), so
 * tailing never joins or commits for a consumer group.
 */
#include "avro/codec.h"
#include "core/cli.h"
#include "core/flags.h"
#include "core/log.h"
#include "core/util.h"
#include "http/server.h"
#include "kafka/kafka.h"
#include "kafka/topic_reader.h"

#include <errno.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static volatile sig_atomic_t tail_stop;

static void tail_on_signal(int sig)
{
    tail_stop = 1;
}

/* Standard base64 of n bytes, malloc'd; NULL when out of memory. */
static char *base64_encode(const unsigned char *p, size_t n)
{
    static const char tbl[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    char *out = malloc((n + 2) / 3 * 4 + 1), *o = out;
    if (!out) return NULL;
    for (size_t i = 0; i < n; i += 3) {
        unsigned v = (unsigned)p[i] << 16;
        if (i + 1 < n) v |= (unsigned)p[i + 1] << 8;
        if (i + 2 < n) v |= p[i + 2];
        *o++ = tbl[(v >> 18) & 63];
        *o++ = tbl[(v >> 12) & 63];
        *o++ = i + 1 < n ? tbl[(v >> 6) & 63] : '=';
        *o++ = i + 2 < n ? tbl[v & 63] : '=';
    }
    *o = '\0';
    return out;
}

/* Sets obj[name] to the bytes as a JSON string when they are UTF-8, else
 * obj[name + "_base64"]; NULL bytes give null. */
static void set_bytes(json_t *obj, const char *name, const void *p, size_t n)
{
    if (!p) {
        json_object_set_new(obj, name, json_null());
        return;
    }
    json_t *s = json_stringn((const char *)p, n);
    if (s) {
        json_object_set_new(obj, name, s);
        return;
    }
    char key[64];
    snprintf(key, sizeof key, "%s_base64", name);
    char *b = base64_encode(p, n);
    json_object_set_new(obj, key, b ? json_string(b) : json_null());
    free(b);
}

/* One message as a JSON line (malloc'd, without the newline); NULL when out of memory.
 * *decode_failed is set when the value did not decode. */
static char *tail_format(const rd_kafka_message_t *m, int *decode_failed)
{
    json_t *o = json_object();
    rd_kafka_timestamp_type_t tstype;
    int64_t ts = rd_kafka_message_timestamp(m, &tstype);
    *decode_failed = 0;
    json_object_set_new(o, "topic", json_string(rd_kafka_topic_name(m->rkt)));
    json_object_set_new(o, "partition", json_integer(m->partition));
    json_object_set_new(o, "offset", json_integer(m->offset));
    json_object_set_new(o, "timestamp", ts >= 0 ? json_integer(ts) : json_null());
    json_object_set_new(o, "timestamp_type",
                        json_string(tstype == RD_KAFKA_TIMESTAMP_CREATE_TIME       ? "create"
                                    : tstype == RD_KAFKA_TIMESTAMP_LOG_APPEND_TIME ? "log_append"
                                                                                   : "none"));
    set_bytes(o, "key", m->key, m->key_len);
    json_t *hs = json_array();
    rd_kafka_headers_t *hdrs = NULL;
    if (rd_kafka_message_headers(m, &hdrs) == 0 && hdrs) {
        const char *name;
        const void *val;
        size_t vlen;
        for (size_t i = 0; rd_kafka_header_get_all(hdrs, i, &name, &val, &vlen) == 0; i++) {
            json_t *h = json_object();
            set_bytes(h, "name", name, strlen(name));
            set_bytes(h, "value", val, vlen);
            json_array_append_new(hs, h);
        }
    }
    json_object_set_new(o, "headers", hs);

    char *value_json = NULL;
    char err[512];
    if (!m->payload) {
        json_object_set_new(o, "value", json_null());
    } else if (al_avro_to_json(m->payload, m->len, &value_json, err, sizeof err) != 0) {
        *decode_failed = 1;
        free(value_json);
        value_json = NULL;
        json_object_set_new(o, "error", json_string(err));
        char *b = base64_encode(m->payload, m->len);
        json_object_set_new(o, "value_base64", b ? json_string(b) : json_null());
        free(b);
    }
    char *head = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(o);
    if (!head || !value_json) {
        free(value_json);
        return head;
    }
    /* Splice the decoder's JSON in as it is (no re-parse): {...} -> {...,"value":<json>} */
    size_t hl = strlen(head), vl = strlen(value_json);
    char *line = malloc(hl + vl + 16);
    if (line) {
        memcpy(line, head, hl - 1);
        memcpy(line + hl - 1, ",\"value\":", 9);
        memcpy(line + hl + 8, value_json, vl);
        memcpy(line + hl + 8 + vl, "}", 2);
    }
    free(head);
    free(value_json);
    return line;
}

/* --partition: a partition number (topic_reader.h's rule). */
static int tail_parse_partition(void *dest, const char *v, char *err, size_t errlen)
{
    if (al_topic_parse_partition(v, dest) == 0) return 0;
    snprintf(err, errlen, "wants a partition number");
    return -1;
}

int cmd_tail(int argc, char **argv)
{
    al_cli_common common;
    al_topic_reader_opts ro = {.partition = -1, .end_offset = -1, .end_time_ms = -1};
    int64_t max = -1;
    int from_beginning = 0;
    const al_flag flags[] = {
        {"from-beginning", 0, AL_FLAG_SWITCH, &from_beginning,
         .help = "start at the oldest message (default: only new messages)"},
        {"follow", 'f', AL_FLAG_SWITCH, &ro.follow,
         .help = "keep waiting for new messages (default: stop at the end of each\n"
                 "partition as it was when tail started)"},
        {"max", 'n', AL_FLAG_I64, &max, .lo = 1, .hi = INT64_MAX, .arg = "N",
         .help = "stop after N messages"},
        {"partition", 'p', AL_FLAG_FUNC, &ro.partition, .arg = "P",
         .help = "read only partition P", .parse = tail_parse_partition},
    };
    const al_cmd_spec spec = {
        "tail", "TOPIC... [--from-beginning] [--follow] [--max N] [--partition P]",
        "Prints each message of the topics as one JSON object per line: topic, partition,\n"
        "offset, timestamp, key, headers and the decoded Avro value. A value that does not\n"
        "decode prints {\"error\":...,\"value_base64\":...} instead. Never joins a consumer group.\n",
        flags, AL_ARRAY_LEN(flags), .common = 1};
    int first;

    al_cli_common_init(&common);
    int rc = al_flags_parse(&spec, &common, argc, argv, &first);
    if (rc != AL_FLAGS_GO) return rc;
    if (first >= argc) return al_cli_usage_error("tail", "name at least one TOPIC");
    if (from_beginning) ro.start = AL_TOPIC_START_BEGINNING;
    ro.topics = (const char *const *)argv + first;
    ro.ntopics = (size_t)(argc - first);

    char err[1024];
    al_kafka_conf *kc = al_kafka_conf_from_cli(&common, err, sizeof err);
    if (!kc) {
        al_log_error("tail", "%s", err);
        return AL_EXIT_FAILURE;
    }
    al_metrics *metrics = al_metrics_new();
    al_counter *printed =
        al_metrics_counter(metrics, "arclight_tail_messages_total", "Messages printed.", NULL);
    al_counter *undecodable = al_metrics_counter(metrics, "arclight_tail_decode_errors_total",
                                                 "Messages whose value did not decode.", NULL);
    al_http_server *srv = NULL;
    rc = AL_EXIT_OK;
    al_topic_reader *r = NULL;
    /* The reader first: it fixes where each partition starts (the end, unless told
     * otherwise), so that once /healthz answers, every message produced after is shown. The
     * other way round a message sent meanwhile was missed (real Kafka takes a while to
     * answer the offset lookups). */
    r = al_topic_reader_new(kc, &ro, err, sizeof err);
    if (!r) {
        al_log_error("tail", "%s", err);
        rc = AL_EXIT_FAILURE;
        goto out;
    }
    if (common.metrics &&
        !(srv = al_http_server_start(common.metrics, metrics, NULL, NULL, err, sizeof err))) {
        al_log_error("tail", "%s", err);
        rc = AL_EXIT_FAILURE;
        goto out;
    }

    struct sigaction sa = {.sa_handler = tail_on_signal}, old_int, old_term;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_int);
    sigaction(SIGTERM, &sa, &old_term);
    /* Followers usually sit behind a pipe (jq, grep): show each line as it comes. */
    if (ro.follow) setvbuf(stdout, NULL, _IOLBF, 0);

    int64_t count = 0;
    while (!tail_stop && (max < 0 || count < max)) {
        rd_kafka_message_t *m;
        int n = al_topic_reader_next(r, 200, &m, err, sizeof err);
        if (n < 0) {
            al_log_error("tail", "%s", err);
            rc = AL_EXIT_FAILURE;
            break;
        }
        if (n == 2) break;
        if (n == 0) continue;
        int bad;
        char *line = tail_format(m, &bad);
        rd_kafka_message_destroy(m);
        if (!line) {
            al_log_error("tail", "out of memory formatting a message");
            rc = AL_EXIT_FAILURE;
            break;
        }
        size_t len = strlen(line);
        line[len] = '\n';
        size_t w = fwrite(line, 1, len + 1, stdout);
        free(line);
        if (w != len + 1) {
            /* A reader that went away (head, a closed pipe) ends tail quietly. */
            if (errno != EPIPE) {
                al_log_error("tail", "cannot write to stdout: %s", strerror(errno));
                rc = AL_EXIT_FAILURE;
            }
            break;
        }
        count++;
        al_counter_inc(printed);
        if (bad) al_counter_inc(undecodable);
    }
    if (fflush(stdout) != 0 && errno != EPIPE && rc == AL_EXIT_OK) {
        al_log_error("tail", "cannot write to stdout: %s", strerror(errno));
        rc = AL_EXIT_FAILURE;
    }
    sigaction(SIGINT, &old_int, NULL);
    sigaction(SIGTERM, &old_term, NULL);
out:
    al_topic_reader_free(r);
    al_http_server_stop(srv);
    al_metrics_free(metrics);
    al_kafka_conf_free(kc);
    return rc;
}
