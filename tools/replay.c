/*
 * arclight replay: publishes a recording (an Avro container of ai.arclight.Recording
 * records, from `arclight record`) back into a cluster: keys, values and headers as they
 * were; each message into its recorded partition when the target topic has that many
 * partitions, else partitioned by key; at the recorded pace, at N messages/s, or as fast as
 * the broker takes them. Exit status 1 when any message was not acknowledged.
 */
#include "core/cli.h"
#include "core/flags.h"
#include "core/parse.h"
#include "core/log.h"
#include "core/util.h"
#include "http/server.h"
#include "kafka/kafka.h"
#include "recording_reader.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static volatile sig_atomic_t replay_stop;

static void replay_on_signal(int sig)
{
    replay_stop = 1;
}

typedef struct topic_map {
    const char *from, *to;
} topic_map;

typedef struct target {
    char *topic;
    int partitions; /* 0: unknown (the topic does not exist yet) */
    int warned;
} target;

typedef struct replay_state {
    al_producer *producer;
    target *targets;
    size_t ntargets;
    long long sent, acked, failed, produce_errors, total;
    int tty;
    al_counter *m_acked, *m_failed;
} replay_state;

static void on_delivery(const al_delivery *d, void *ctx)
{
    replay_state *s = ctx;
    if (d->err) {
        s->failed++;
        al_counter_inc(s->m_failed);
        if (s->failed <= 5)
            al_log_error("replay", "delivery to %s failed: %s", d->topic ? d->topic : "?",
                         d->reason && *d->reason ? d->reason : rd_kafka_err2str(d->err));
    } else {
        s->acked++;
        al_counter_inc(s->m_acked);
    }
}

/* The target topic's partition count, looked up once. NULL only when out of memory. */
static target *target_get(replay_state *s, const char *topic)
{
    for (size_t i = 0; i < s->ntargets; i++)
        if (strcmp(s->targets[i].topic, topic) == 0) return &s->targets[i];
    target *nt = realloc(s->targets, (s->ntargets + 1) * sizeof *nt);
    if (!nt) return NULL;
    s->targets = nt;
    target *t = &s->targets[s->ntargets];
    memset(t, 0, sizeof *t);
    t->topic = strdup(topic);
    if (!t->topic) return NULL;
    s->ntargets++;
    /* All topics, not this one: naming it would make an auto-creating broker create it. */
    rd_kafka_t *rk = al_producer_handle(s->producer);
    const struct rd_kafka_metadata *md = NULL;
    if (rd_kafka_metadata(rk, 1, NULL, &md, 10000) == 0) {
        for (int i = 0; i < md->topic_cnt; i++)
            if (strcmp(md->topics[i].topic, topic) == 0 && !md->topics[i].err)
                t->partitions = md->topics[i].partition_cnt;
        rd_kafka_metadata_destroy(md);
    }
    if (t->partitions == 0)
        al_log_warn("replay",
                    "topic '%s' does not exist (yet): its messages are partitioned by "
                    "key",
                    topic);
    return t;
}

static void progress(replay_state *s, int final)
{
    if (s->tty) {
        int width = 30, filled = 0;
        double frac = s->total > 0 ? (double)s->acked / (double)s->total : 0;
        if (frac > 1) frac = 1;
        filled = (int)(frac * width);
        char bar[64];
        for (int i = 0; i < width; i++)
            bar[i] = i < filled ? '=' : (i == filled ? '>' : ' ');
        bar[width] = '\0';
        fprintf(stderr, "\r[%s] %lld/%lld acked, %lld failed %3.0f%%%s", bar, s->acked, s->total,
                s->failed, frac * 100, final ? "\n" : "");
    } else {
        al_log_info("replay", "%lld sent, %lld acked, %lld failed", s->sent, s->acked, s->failed);
    }
}

/* The record's headers as librdkafka headers (the caller destroys them); NULL for none. */
static rd_kafka_headers_t *recorded_headers(const al_recorded *m)
{
    if (!m->n_headers) return NULL;
    rd_kafka_headers_t *hdrs = rd_kafka_headers_new(m->n_headers);
    for (size_t i = 0; i < m->n_headers; i++) {
        const al_recording_header *h = &m->headers[i];
        rd_kafka_header_add(hdrs, h->name, (ssize_t)h->name_len, h->value,
                            h->value ? (ssize_t)h->value_len : 0);
    }
    return hdrs;
}

/* Sleeps until the monotonic time `until_us`, serving delivery reports meanwhile. */
static void wait_until(al_producer *p, int64_t until_us)
{
    for (;;) {
        int64_t left = until_us - al_mono_us();
        if (left <= 0 || replay_stop) return;
        al_producer_poll(p, (int)(left > 100000 ? 100 : (left + 999) / 1000));
    }
}

/* The --topic-map flags given so far. */
typedef struct replay_maps {
    topic_map v[64];
    size_t n;
} replay_maps;

/* --topic-map OLD=NEW, repeatable: split in place (argv strings are ours to edit). */
static int replay_parse_topic_map(void *dest, const char *v, char *err, size_t errlen)
{
    replay_maps *maps = dest;
    const char *eq = strchr(v, '=');
    if (!eq || eq == v || !eq[1] || strchr(eq + 1, '=')) {
        snprintf(err, errlen, "wants OLD=NEW");
        return -1;
    }
    if (maps->n == AL_ARRAY_LEN(maps->v)) {
        snprintf(err, errlen, "is given more than %zu times", AL_ARRAY_LEN(maps->v));
        return -1;
    }
    ((char *)eq)[0] = '\0';
    maps->v[maps->n].from = v;
    maps->v[maps->n].to = eq + 1;
    maps->n++;
    return 0;
}

/* --rate: the recorded gaps, as fast as the broker takes them, or N messages per second. */
typedef struct replay_rate {
    double per_s; /* messages/s; 0: max */
    int recorded; /* the recorded gaps */
} replay_rate;

static int replay_parse_rate(void *dest, const char *v, char *err, size_t errlen)
{
    replay_rate *r = dest;
    double x;
    r->recorded = strcmp(v, "recorded") == 0;
    r->per_s = 0;
    if (r->recorded || strcmp(v, "max") == 0) return 0;
    if (al_parse_double(v, 0, 1e9, &x) != 0 || !(x > 0)) {
        snprintf(err, errlen, "wants recorded, max or a number of messages per second");
        return -1;
    }
    r->per_s = x;
    return 0;
}

static const char *const replay_timestamp_modes[] = {"original", "now", NULL};

/* Publishes one recorded message: to its mapped topic, its recorded partition where the
 * target has it, at the pace --rate asks for (ts0: the first recorded timestamp, -1 until
 * seen). 0 to go on, 1 when a stop was asked for while waiting, -1 on a failure that ends the
 * replay (out of memory, a fatal producer error); other publish errors are counted. */
static int replay_publish(replay_state *s, const al_recorded *rp, const replay_maps *maps,
                          const replay_rate *rate, int keep_timestamps, int64_t t0, int64_t *ts0,
                          long long index)
{
    al_recorded r = *rp;
    const char *topic = r.topic;
    for (size_t i = 0; i < maps->n; i++)
        if (strcmp(maps->v[i].from, topic) == 0) topic = maps->v[i].to;
    target *t = target_get(s, topic);
    if (!t) {
        al_log_error("replay", "out of memory");
        return -1;
    }
    int32_t partition = AL_KAFKA_PARTITION_ANY;
    if (r.partition >= 0 && r.partition < t->partitions) {
        partition = r.partition;
    } else if (t->partitions > 0 && !t->warned) {
        al_log_warn("replay",
                    "topic '%s' has %d partitions, the recording names partition "
                    "%d: such messages are partitioned by key",
                    topic, t->partitions, (int)r.partition);
        t->warned = 1;
    }

    if (rate->recorded && r.timestamp >= 0) {
        if (*ts0 < 0) *ts0 = r.timestamp;
        if (r.timestamp > *ts0) wait_until(s->producer, t0 + (r.timestamp - *ts0) * 1000);
    } else if (rate->per_s > 0) {
        wait_until(s->producer, t0 + (int64_t)((double)index * 1e6 / rate->per_s));
    }
    if (replay_stop) return 1;

    rd_kafka_headers_t *hdrs = recorded_headers(&r);
    al_kafka_out o = {
        .topic = topic,
        .partition = partition,
        .key = r.key,
        .keylen = r.key_len,
        .value = r.value,
        .len = r.value_len,
        .headers = hdrs,
        .timestamp_ms = keep_timestamps && r.timestamp > 0 ? r.timestamp : 0,
    };
    rd_kafka_resp_err_t perr = al_producer_produce(s->producer, &o);
    if (hdrs) rd_kafka_headers_destroy(hdrs);
    if (perr) {
        s->produce_errors++;
        if (s->produce_errors <= 5)
            al_log_error("replay", "cannot publish %s [%d] offset %lld to %s: %s", r.topic,
                         (int)r.partition, (long long)r.offset, topic, rd_kafka_err2str(perr));
        if (al_kafka_error_classify(perr) == AL_KAFKA_ERRCLASS_FATAL) return -1;
    } else {
        s->sent++;
    }
    return 0;
}

int cmd_replay(int argc, char **argv)
{
    al_cli_common common;
    replay_maps maps = {.n = 0};
    replay_rate rate = {0, 0};
    const char *timestamps = "original";
    const al_flag flags[] = {
        {"topic-map", 0, AL_FLAG_FUNC, &maps, .arg = "OLD=NEW",
         .help = "publish OLD's messages to NEW (repeatable; others keep their topic)",
         .parse = replay_parse_topic_map},
        {"rate", 0, AL_FLAG_FUNC, &rate, .arg = "R",
         .help = "recorded: the recorded gaps between timestamps; N: N messages\n"
                 "per second; max: as fast as the broker takes them (default)",
         .parse = replay_parse_rate},
        {"timestamps", 0, AL_FLAG_STRING, &timestamps, .arg = "T",
         .choices = replay_timestamp_modes,
         .help = "original: keep the recorded timestamps (default); now: let the\n"
                 "producer stamp them (mind retention.ms on old recordings)"},
    };
    const al_cmd_spec spec = {
        "replay",
        "FILE [--topic-map OLD=NEW ...] [--rate recorded|N|max]\n"
        "                       [--timestamps original|now]",
        "Publishes a recording made by 'arclight record' back into a cluster. Keys, values and\n"
        "headers are kept; a message goes to its recorded partition when the target topic has\n"
        "that many partitions, else it is partitioned by key.\n",
        flags, AL_ARRAY_LEN(flags), .common = 1};
    int first;

    al_cli_common_init(&common);
    int rc = al_flags_parse(&spec, &common, argc, argv, &first);
    if (rc != AL_FLAGS_GO) return rc;
    int keep_timestamps = strcmp(timestamps, "now") != 0;
    if (first >= argc) return al_cli_usage_error("replay", "name the recording FILE");
    if (argc - first > 1)
        return al_cli_usage_error("replay", "one FILE at a time (got '%s' too)", argv[first + 1]);
    const char *path = argv[first];

    char err[1024];
    replay_state s = {.tty = isatty(STDERR_FILENO)};
    al_recording_reader *rd = al_recording_open(path, err, sizeof err);
    if (!rd) {
        al_log_error("replay", "%s", err);
        return AL_EXIT_FAILURE;
    }
    /* The total for the progress bar comes from the block headers: no decoding. */
    if (s.tty && (s.total = al_recording_count(rd, err, sizeof err)) < 0) {
        al_log_error("replay", "%s", err);
        al_recording_close(rd);
        return AL_EXIT_FAILURE;
    }

    rc = AL_EXIT_OK;
    al_http_server *srv = NULL;
    al_metrics *metrics = al_metrics_new();
    s.m_acked =
        al_metrics_counter(metrics, "arclight_replay_messages_total",
                           "Replayed messages by delivery result.", "result", "acked", NULL);
    s.m_failed =
        al_metrics_counter(metrics, "arclight_replay_messages_total",
                           "Replayed messages by delivery result.", "result", "failed", NULL);
    al_kafka_conf *kc = al_kafka_conf_from_cli(&common, err, sizeof err);
    if (!kc) {
        al_log_error("replay", "%s", err);
        rc = AL_EXIT_FAILURE;
        goto out;
    }
    if (common.metrics &&
        !(srv = al_http_server_start(common.metrics, metrics, NULL, NULL, err, sizeof err))) {
        al_log_error("replay", "%s", err);
        rc = AL_EXIT_FAILURE;
        goto out;
    }
    s.producer = al_producer_new(kc, err, sizeof err);
    if (!s.producer || al_producer_check(s.producer, 10000, err, sizeof err) != 0) {
        al_log_error("replay", "%s", err);
        rc = AL_EXIT_FAILURE;
        goto out;
    }
    al_producer_set_delivery_cb(s.producer, on_delivery, &s);

    struct sigaction sa = {.sa_handler = replay_on_signal}, old_int, old_term;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_int);
    sigaction(SIGTERM, &sa, &old_term);

    int64_t t0 = al_mono_us(), ts0 = -1, last_progress = t0;
    long long index = 0;
    int more = 1;
    while (!replay_stop) {
        al_recorded r;
        more = al_recording_next(rd, &r, err, sizeof err);
        if (more < 0) {
            al_log_error("replay", "%s", err);
            rc = AL_EXIT_FAILURE;
        }
        if (more <= 0) break;
        int pr = replay_publish(&s, &r, &maps, &rate, keep_timestamps, t0, &ts0, index);
        if (pr < 0) rc = AL_EXIT_FAILURE;
        if (pr != 0) break;
        index++;
        al_producer_poll(s.producer, 0);
        int64_t now = al_mono_us();
        if (now - last_progress >= (s.tty ? 200000 : 5000000)) {
            progress(&s, 0);
            last_progress = now;
        }
    }
    if (al_producer_flush(s.producer, 60000, err, sizeof err) != 0) {
        al_log_error("replay", "%s", err);
        rc = AL_EXIT_FAILURE;
    }
    sigaction(SIGINT, &old_int, NULL);
    sigaction(SIGTERM, &old_term, NULL);
    if (s.total == 0) s.total = s.sent;
    progress(&s, 1);
    if (s.failed || s.produce_errors) rc = AL_EXIT_FAILURE;
    fprintf(stderr, "replay: %lld of %lld messages from %s acknowledged, %lld failed%s\n", s.acked,
            index, path, s.failed + s.produce_errors, replay_stop ? " (interrupted)" : "");
out:
    al_producer_free(s.producer);
    for (size_t i = 0; i < s.ntargets; i++)
        free(s.targets[i].topic);
    free(s.targets);
    al_http_server_stop(srv);
    al_metrics_free(metrics);
    al_kafka_conf_free(kc);
    al_recording_close(rd);
    return rc;
}
