/*
 * t0399_tools_helpers.h: what the topic-tool tests (0300-0398) share: a broker with the
 * tests' own topics, a plain librdkafka producer to put exact messages on them, and a runner
 * for `arclight` commands that captures stdout, stderr and the exit status. Header-only
 * (static functions); include after testlib.h and broker_fixture.h.
 */
#ifndef ARCLIGHT_T0399_TOOLS_HELPERS_H
#define ARCLIGHT_T0399_TOOLS_HELPERS_H

#include "broker_fixture.h"
#include "support.h"

#include <librdkafka/rdkafka.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

/* Topics: t.src and t.dst with 4 partitions; t.one, t.time and t.follow with 1. */
static char tools_topics_path[64];

static int tools_broker_start(al_test_broker *b)
{
    snprintf(tools_topics_path, sizeof tools_topics_path, "/tmp/arclight-t03-topics-%d.conf",
             (int)getpid());
    FILE *f = fopen(tools_topics_path, "w");
    if (!f) return -1;
    fputs("t.src 4 1\nt.dst 4 1\nt.one 1 1\nt.time 1 1\nt.follow 1 1\n", f);
    fclose(f);
    const char *extra[] = {"--topics", tools_topics_path, NULL};
    int rc = al_test_broker_start(b, extra);
    return rc;
}

/* Stops the broker; its exit status (0: clean). */
static int tools_broker_stop(al_test_broker *b)
{
    int rc = al_test_broker_stop(b);
    unlink(tools_topics_path);
    return rc;
}

typedef struct tools_msg {
    const char *topic;
    int32_t partition;
    const void *key;
    size_t keylen;
    const void *value; /* NULL: tombstone */
    size_t len;
    int64_t timestamp_ms; /* 0: now */
    int with_headers;     /* adds h1=a, h2=<null>, h1=b (a repeated name) */
} tools_msg;

/* Produces the messages and waits for every acknowledgement. 0, or -1 (reason on stderr). */
static int tools_produce(const char *bootstrap, const tools_msg *msgs, size_t n)
{
    char err[512];
    rd_kafka_conf_t *c = rd_kafka_conf_new();
    rd_kafka_conf_set(c, "bootstrap.servers", bootstrap, err, sizeof err);
    rd_kafka_conf_set(c, "linger.ms", "1", err, sizeof err);
    rd_kafka_conf_set(c, "enable.idempotence", "true", err, sizeof err); /* keeps the order */
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_PRODUCER, c, err, sizeof err);
    if (!rk) {
        fprintf(stderr, "producer: %s\n", err);
        return -1;
    }
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++) {
        const tools_msg *m = &msgs[i];
        rd_kafka_headers_t *h = NULL;
        if (m->with_headers) {
            h = rd_kafka_headers_new(3);
            rd_kafka_header_add(h, "h1", -1, "a", 1);
            rd_kafka_header_add(h, "h2", -1, NULL, 0);
            rd_kafka_header_add(h, "h1", -1, "b", 1);
        }
        rd_kafka_resp_err_t e;
        /* producev takes ownership of the headers when it succeeds */
        if (h)
            e = rd_kafka_producev(
                rk, RD_KAFKA_V_TOPIC(m->topic), RD_KAFKA_V_PARTITION(m->partition),
                RD_KAFKA_V_KEY(m->key, m->keylen), RD_KAFKA_V_VALUE((void *)m->value, m->len),
                RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_TIMESTAMP(m->timestamp_ms),
                RD_KAFKA_V_HEADERS(h), RD_KAFKA_V_END);
        else
            e = rd_kafka_producev(
                rk, RD_KAFKA_V_TOPIC(m->topic), RD_KAFKA_V_PARTITION(m->partition),
                RD_KAFKA_V_KEY(m->key, m->keylen), RD_KAFKA_V_VALUE((void *)m->value, m->len),
                RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_TIMESTAMP(m->timestamp_ms),
                RD_KAFKA_V_END);
        if (e) {
            fprintf(stderr, "produce to %s: %s\n", m->topic, rd_kafka_err2str(e));
            if (h) rd_kafka_headers_destroy(h);
            rc = -1;
        }
    }
    if (rd_kafka_flush(rk, 30000) != 0) {
        fprintf(stderr, "producer: flush timed out\n");
        rc = -1;
    }
    rd_kafka_destroy(rk);
    return rc;
}

typedef struct tools_run {
    int status; /* exit status, -1 when it did not exit normally */
    char *out;  /* stdout, NUL-terminated (caller frees) */
    char *err;  /* stderr */
} tools_run;

/* Runs `$ARCLIGHT_BIN ARGS` through the shell (args are pasted as given: quote them) with
 * stdin from /dev/null; fills r. */
static void tools_arclight(tools_run *r, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void tools_arclight(tools_run *r, const char *fmt, ...)
{
    char args[2048], cmd[4096], outp[64], errp[64];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    snprintf(outp, sizeof outp, "/tmp/arclight-t03-%d.out", (int)getpid());
    snprintf(errp, sizeof errp, "/tmp/arclight-t03-%d.err", (int)getpid());
    snprintf(cmd, sizeof cmd, "'%s' %s </dev/null >%s 2>%s", al_test_bin(), args, outp, errp);
    int st = system(cmd);
    r->status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    r->out = al_test_slurp_text(outp);
    r->err = al_test_slurp_text(errp);
    unlink(outp);
    unlink(errp);
}

static void tools_run_free(tools_run *r)
{
    free(r->out);
    free(r->err);
    r->out = r->err = NULL;
}

/* Number of lines (newline-terminated) in s. */
static __attribute__((unused)) int tools_count_lines(const char *s)
{
    int n = 0;
    for (; *s; s++)
        if (*s == '\n') n++;
    return n;
}

#endif
