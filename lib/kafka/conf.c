/*
 * conf.c: layered client configuration, librdkafka logging through al_log, error classes,
 * and the "cannot reach Kafka" diagnosis.
 */
#include "kafka/internal.h"

#include "core/log.h"
#include "core/util.h"

#include <ctype.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#ifndef ARCLIGHT_BROKER_CONFIG_DIR
#define ARCLIGHT_BROKER_CONFIG_DIR "broker-config"
#endif

#define AL_DEFAULT_BOOTSTRAP "127.0.0.1:9092"

struct al_kafka_conf {
    char **keys;
    char **values;
    size_t n, cap;
};

al_kafka_conf *al_kafka_conf_new(void)
{
    return calloc(1, sizeof(al_kafka_conf));
}

void al_kafka_conf_free(al_kafka_conf *c)
{
    if (!c) return;
    for (size_t i = 0; i < c->n; i++) {
        free(c->keys[i]);
        free(c->values[i]);
    }
    free(c->keys);
    free(c->values);
    free(c);
}

al_kafka_conf *al_kafka_conf_dup(const al_kafka_conf *c)
{
    al_kafka_conf *d = al_kafka_conf_new();
    if (!d) return NULL;
    for (size_t i = 0; i < c->n; i++) {
        if (al_kafka_conf_set(d, c->keys[i], c->values[i]) != 0) {
            al_kafka_conf_free(d);
            return NULL;
        }
    }
    return d;
}

int al_kafka_conf_set(al_kafka_conf *c, const char *key, const char *value)
{
    char *v = strdup(value);
    if (!v) return -1;
    for (size_t i = 0; i < c->n; i++) {
        if (strcmp(c->keys[i], key) == 0) {
            free(c->values[i]);
            c->values[i] = v;
            return 0;
        }
    }
    if (c->n == c->cap) {
        size_t cap = c->cap ? c->cap * 2 : 32;
        char **k = realloc(c->keys, cap * sizeof *k);
        if (!k) goto oom;
        c->keys = k;
        char **vv = realloc(c->values, cap * sizeof *vv);
        if (!vv) goto oom;
        c->values = vv;
        c->cap = cap;
    }
    c->keys[c->n] = strdup(key);
    if (!c->keys[c->n]) goto oom;
    c->values[c->n] = v;
    c->n++;
    return 0;
oom:
    free(v);
    return -1;
}

const char *al_kafka_conf_get(const al_kafka_conf *c, const char *key)
{
    for (size_t i = 0; i < c->n; i++)
        if (strcmp(c->keys[i], key) == 0) return c->values[i];
    return NULL;
}

size_t al_kafka_conf_count(const al_kafka_conf *c)
{
    return c->n;
}

void al_kafka_conf_at(const al_kafka_conf *c, size_t i, const char **key, const char **value)
{
    *key = c->keys[i];
    *value = c->values[i];
}

/* Parses the text of a key=value file. Lines are trimmed; a line without '=' or with an
 * empty key is an error naming path:line. */
static int conf_parse_text(al_kafka_conf *c, char *text, const char *path, char *errstr,
                           size_t errlen)
{
    int lineno = 0;
    char *line = text;
    while (line) {
        char *next = strchr(line, '\n');
        if (next) *next++ = '\0';
        lineno++;
        char *s = al_str_trim(line);
        if (*s && *s != '#') {
            char *eq = strchr(s, '=');
            if (!eq)
                return al_err(errstr, errlen, "%s:%d: expected key=value, got '%.80s'", path,
                              lineno, s);
            *eq = '\0';
            char *key = al_str_trim(s);
            char *val = al_str_trim(eq + 1);
            if (!*key) return al_err(errstr, errlen, "%s:%d: empty key before '='", path, lineno);
            for (const char *k = key; *k; k++)
                if (!(isalnum((unsigned char)*k) || *k == '.' || *k == '_' || *k == '-'))
                    return al_err(errstr, errlen, "%s:%d: invalid character '%c' in key '%s'", path,
                                  lineno, *k, key);
            if (al_kafka_conf_set(c, key, val) != 0)
                return al_err(errstr, errlen, "%s: out of memory", path);
        }
        line = next;
    }
    return 0;
}

int al_kafka_conf_load_file(al_kafka_conf *c, const char *path, char *errstr, size_t errlen)
{
    char err[512];
    size_t len;
    char *text = al_file_read(path, &len, err, sizeof err);
    if (!text) return al_err(errstr, errlen, "client config: %s", err);
    if (memchr(text, '\0', len)) {
        free(text);
        return al_err(errstr, errlen, "client config %s: contains a NUL byte (not a text file)",
                      path);
    }
    int r = conf_parse_text(c, text, path, errstr, errlen);
    free(text);
    return r;
}

int al_kafka_conf_load_env(al_kafka_conf *c)
{
    extern char **environ;
    static const char prefix[] = "ARCLIGHT_KAFKA_";
    int n = 0;
    for (char **e = environ; e && *e; e++) {
        if (strncmp(*e, prefix, sizeof prefix - 1) != 0) continue;
        const char *name = *e + sizeof prefix - 1;
        const char *eq = strchr(name, '=');
        if (!eq || eq == name) continue;
        char key[256];
        size_t kl = (size_t)(eq - name);
        if (kl >= sizeof key) continue;
        for (size_t i = 0; i < kl; i++)
            key[i] = name[i] == '_' ? '.' : (char)tolower((unsigned char)name[i]);
        key[kl] = '\0';
        if (al_kafka_conf_set(c, key, eq + 1) == 0) n++;
    }
    return n;
}

const char *al_kafka_conf_default_path(char *buf, size_t buflen)
{
    const char *env = getenv("ARCLIGHT_BROKER_CONFIG");
    struct stat st;
    if (env && *env) {
        if (stat(env, &st) == 0 && S_ISDIR(st.st_mode))
            snprintf(buf, buflen, "%s/client.conf", env);
        else
            snprintf(buf, buflen, "%s", env);
    } else {
        snprintf(buf, buflen, "%s/client.conf", ARCLIGHT_BROKER_CONFIG_DIR);
    }
    return buf;
}

const char *al_kafka_config_file_path(const char *name, char *buf, size_t buflen)
{
    const char *env = getenv("ARCLIGHT_BROKER_CONFIG");
    struct stat st;
    if (env && *env) {
        if (stat(env, &st) == 0 && S_ISDIR(st.st_mode)) {
            snprintf(buf, buflen, "%s/%s", env, name);
        } else {
            const char *slash = strrchr(env, '/');
            if (slash)
                snprintf(buf, buflen, "%.*s/%s", (int)(slash - env), env, name);
            else
                snprintf(buf, buflen, "%s", name);
        }
    } else {
        snprintf(buf, buflen, "%s/%s", ARCLIGHT_BROKER_CONFIG_DIR, name);
    }
    return buf;
}

/* Settings arclight needs even without any file: the at-least-once contract. */
static const char *const builtin_defaults[][2] = {
    {"enable.idempotence", "true"},
    {"acks", "all"},
    {"compression.type", "lz4"},
    {"linger.ms", "5"},
    {"partitioner", "murmur2_random"},
    {"partition.assignment.strategy", "cooperative-sticky"},
    {"enable.auto.offset.store", "false"},
    {"enable.auto.commit", "true"},
    {"auto.commit.interval.ms", "1000"},
    {"auto.offset.reset", "error"},
    {"client.id", "arclight"},
};

al_kafka_conf *al_kafka_conf_load(const char *config_file, const char *bootstrap_flag, char *errstr,
                                  size_t errlen)
{
    al_kafka_conf *c = al_kafka_conf_new();
    char path[4096];
    struct stat st;
    if (!c) {
        al_err(errstr, errlen, "out of memory");
        return NULL;
    }
    for (size_t i = 0; i < AL_ARRAY_LEN(builtin_defaults); i++)
        if (al_kafka_conf_set(c, builtin_defaults[i][0], builtin_defaults[i][1]) != 0) goto oom;

    al_kafka_conf_default_path(path, sizeof path);
    if (stat(path, &st) == 0) {
        if (al_kafka_conf_load_file(c, path, errstr, errlen) != 0) goto fail;
        al_log_debug("kafka", "client defaults from %s", path);
    } else if (getenv("ARCLIGHT_BROKER_CONFIG") && *getenv("ARCLIGHT_BROKER_CONFIG")) {
        /* Explicitly named but absent: worth a warning, still not an error. */
        al_log_warn("kafka", "ARCLIGHT_BROKER_CONFIG: %s not found, using built-in defaults", path);
    }
    al_kafka_conf_load_env(c);
    if (config_file && al_kafka_conf_load_file(c, config_file, errstr, errlen) != 0) goto fail;
    if (bootstrap_flag) {
        if (al_kafka_conf_set(c, "bootstrap.servers", bootstrap_flag) != 0) goto oom;
    } else if (!al_kafka_conf_get(c, "bootstrap.servers")) {
        const char *env = getenv("ARCLIGHT_BOOTSTRAP");
        if (al_kafka_conf_set(c, "bootstrap.servers", env && *env ? env : AL_DEFAULT_BOOTSTRAP))
            goto oom;
    }
    return c;
oom:
    al_err(errstr, errlen, "out of memory");
fail:
    al_kafka_conf_free(c);
    return NULL;
}

al_kafka_conf *al_kafka_conf_from_cli(const al_cli_common *cc, char *errstr, size_t errlen)
{
    const char *env = getenv("ARCLIGHT_BOOTSTRAP");
    const char *dflt = env && *env ? env : AL_DEFAULT_BOOTSTRAP;
    const char *flag = cc->bootstrap && strcmp(cc->bootstrap, dflt) != 0 ? cc->bootstrap : NULL;
    return al_kafka_conf_load(cc->config, flag, errstr, errlen);
}

/* ------------------------------------------------------------------------------------------
 * librdkafka's log lines and connection errors
 * ------------------------------------------------------------------------------------------ */

/* The last connection failure reason seen per client handle, for "cannot reach Kafka"
 * messages. A handful of slots: a process holds few clients. */
#define REASON_SLOTS 64
static pthread_mutex_t reason_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
    const rd_kafka_t *rk;
    char reason[256];
} reasons[REASON_SLOTS];
static unsigned reason_next;

static void reason_record(const rd_kafka_t *rk, const char *reason)
{
    pthread_mutex_lock(&reason_lock);
    int slot = -1;
    for (int i = 0; i < REASON_SLOTS; i++)
        if (reasons[i].rk == rk) slot = i;
    if (slot < 0) slot = (int)(reason_next++ % REASON_SLOTS);
    reasons[slot].rk = rk;
    snprintf(reasons[slot].reason, sizeof reasons[slot].reason, "%s", reason);
    pthread_mutex_unlock(&reason_lock);
}

int al_kafka__reason_get(const rd_kafka_t *rk, char *buf, size_t buflen)
{
    int found = 0;
    pthread_mutex_lock(&reason_lock);
    for (int i = 0; i < REASON_SLOTS; i++) {
        if (reasons[i].rk == rk && reasons[i].reason[0]) {
            snprintf(buf, buflen, "%s", reasons[i].reason);
            found = 1;
        }
    }
    pthread_mutex_unlock(&reason_lock);
    if (!found && buflen) buf[0] = '\0';
    return found;
}

void al_kafka__reason_forget(const rd_kafka_t *rk)
{
    pthread_mutex_lock(&reason_lock);
    for (int i = 0; i < REASON_SLOTS; i++)
        if (reasons[i].rk == rk) {
            reasons[i].rk = NULL;
            reasons[i].reason[0] = '\0';
        }
    pthread_mutex_unlock(&reason_lock);
}

/* Pulls the reason out of librdkafka's "…: Connect to ipv4#127.0.0.1:9999 failed: Connection
 * refused (after 0ms in state CONNECT)" or "Failed to resolve 'x:9092': Name or service not
 * known (after …)" lines. Returns 0 when the line is not a connection failure. */
static int connection_reason(const char *msg, char *out, size_t outlen)
{
    const char *p = strstr(msg, "Connect to ");
    const char *start = NULL;
    if (p && (p = strstr(p, " failed: "))) start = p + 9;
    if (!start && (p = strstr(msg, "Failed to resolve "))) start = p;
    if (!start && (p = strstr(msg, "Disconnected"))) start = p;
    if (!start && (p = strstr(msg, "Connection setup timed out"))) start = p;
    if (!start) return 0;
    const char *end = strstr(start, " (after ");
    size_t n = end ? (size_t)(end - start) : strlen(start);
    if (n >= outlen) n = outlen - 1;
    memcpy(out, start, n);
    out[n] = '\0';
    return 1;
}

static void kafka_log_cb(const rd_kafka_t *rk, int level, const char *fac, const char *buf)
{
    char reason[256];
    if (level <= 4 && connection_reason(buf, reason, sizeof reason)) reason_record(rk, reason);
    /* librdkafka's own warnings about producer settings on a consumer (and the reverse) are
     * expected: one client.conf serves both. */
    if (!strcmp(fac, "CONFWARN")) {
        al_log_debug("rdkafka", "%s: %s", rd_kafka_name(rk), buf);
        return;
    }
    if (level <= 4)
        al_log_warn("rdkafka", "%s: [%s] %s", rd_kafka_name(rk), fac, buf);
    else if (level <= 6)
        al_log_info("rdkafka", "%s: [%s] %s", rd_kafka_name(rk), fac, buf);
    else
        al_log_debug("rdkafka", "%s: [%s] %s", rd_kafka_name(rk), fac, buf);
}

void al_kafka__error_common(rd_kafka_t *rk, int err, const char *reason)
{
    char r[256];
    if (connection_reason(reason, r, sizeof r)) reason_record(rk, r);
    if (err == RD_KAFKA_RESP_ERR__FATAL) {
        char fbuf[512];
        rd_kafka_resp_err_t ferr = rd_kafka_fatal_error(rk, fbuf, sizeof fbuf);
        al_log_error("kafka", "%s: fatal error: %s: %s", rd_kafka_name(rk), rd_kafka_err2name(ferr),
                     fbuf);
    } else if (err == RD_KAFKA_RESP_ERR__ALL_BROKERS_DOWN || err == RD_KAFKA_RESP_ERR__TRANSPORT) {
        al_log_debug("kafka", "%s: %s: %s", rd_kafka_name(rk), rd_kafka_err2name(err), reason);
    } else {
        al_log_warn("kafka", "%s: %s: %s", rd_kafka_name(rk), rd_kafka_err2name(err), reason);
    }
}

static void kafka_error_cb(rd_kafka_t *rk, int err, const char *reason, void *opaque)
{
    al_kafka__error_common(rk, err, reason);
}

rd_kafka_conf_t *al_kafka__conf_build(const al_kafka_conf *c, const char *const *skip, char *errstr,
                                      size_t errlen)
{
    rd_kafka_conf_t *rc = rd_kafka_conf_new();
    char err[512];
    for (size_t i = 0; i < c->n; i++) {
        int skipped = !strncmp(c->keys[i], "arclight.", 9); /* ours (kafka.h) */
        for (const char *const *s = skip; s && *s; s++)
            if (!strcmp(*s, c->keys[i])) skipped = 1;
        if (skipped) continue;
        if (rd_kafka_conf_set(rc, c->keys[i], c->values[i], err, sizeof err) != RD_KAFKA_CONF_OK) {
            al_err(errstr, errlen, "Kafka client setting %s=%s: %s", c->keys[i], c->values[i], err);
            rd_kafka_conf_destroy(rc);
            return NULL;
        }
    }
    rd_kafka_conf_set_log_cb(rc, kafka_log_cb);
    rd_kafka_conf_set_error_cb(rc, kafka_error_cb);
    return rc;
}

rd_kafka_conf_t *al_kafka_conf_build(const al_kafka_conf *c, char *errstr, size_t errlen)
{
    return al_kafka__conf_build(c, NULL, errstr, errlen);
}

/* ------------------------------------------------------------------------------------------
 * Error classes and reachability
 * ------------------------------------------------------------------------------------------ */

al_kafka_errclass al_kafka_error_classify(rd_kafka_resp_err_t err)
{
    switch (err) {
    case RD_KAFKA_RESP_ERR_NO_ERROR:
        return AL_KAFKA_ERRCLASS_NONE;
    case RD_KAFKA_RESP_ERR__FATAL:
    case RD_KAFKA_RESP_ERR__AUTO_OFFSET_RESET:
    case RD_KAFKA_RESP_ERR__AUTHENTICATION:
    case RD_KAFKA_RESP_ERR_SASL_AUTHENTICATION_FAILED:
    case RD_KAFKA_RESP_ERR_CLUSTER_AUTHORIZATION_FAILED:
    case RD_KAFKA_RESP_ERR_GROUP_AUTHORIZATION_FAILED:
    case RD_KAFKA_RESP_ERR_TRANSACTIONAL_ID_AUTHORIZATION_FAILED:
    case RD_KAFKA_RESP_ERR__INVALID_ARG:
    case RD_KAFKA_RESP_ERR__FENCED:
        return AL_KAFKA_ERRCLASS_FATAL;
    case RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE:
    case RD_KAFKA_RESP_ERR__UNKNOWN_TOPIC:
    case RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART:
    case RD_KAFKA_RESP_ERR__UNKNOWN_PARTITION:
    case RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED:
    case RD_KAFKA_RESP_ERR_INVALID_MSG:
    case RD_KAFKA_RESP_ERR_INVALID_RECORD:
    case RD_KAFKA_RESP_ERR_TOPIC_EXCEPTION:
    case RD_KAFKA_RESP_ERR_RECORD_LIST_TOO_LARGE:
    case RD_KAFKA_RESP_ERR__PURGE_QUEUE:
    case RD_KAFKA_RESP_ERR__PURGE_INFLIGHT:
        return AL_KAFKA_ERRCLASS_ABORTABLE;
    default:
        /* Includes the idempotence errors of a single message (OUT_OF_ORDER_SEQUENCE_NUMBER,
         * INVALID_PRODUCER_EPOCH, UNKNOWN_PRODUCER_ID): librdkafka bumps the producer epoch and
         * carries on, so sending the message again works. When the producer itself cannot go
         * on, librdkafka raises __FATAL (al_producer_fatal). */
        return AL_KAFKA_ERRCLASS_RETRIABLE;
    }
}

const char *al_kafka_errclass_name(al_kafka_errclass c)
{
    switch (c) {
    case AL_KAFKA_ERRCLASS_NONE:
        return "none";
    case AL_KAFKA_ERRCLASS_RETRIABLE:
        return "retriable";
    case AL_KAFKA_ERRCLASS_ABORTABLE:
        return "abortable";
    case AL_KAFKA_ERRCLASS_FATAL:
        return "fatal";
    }
    return "?";
}

/* The bootstrap.servers of a client handle, for messages. */
static void handle_bootstrap(rd_kafka_t *rk, char *buf, size_t buflen)
{
    size_t sz = buflen;
    if (rd_kafka_conf_get(rd_kafka_conf(rk), "bootstrap.servers", buf, &sz) != RD_KAFKA_CONF_OK ||
        !buf[0])
        snprintf(buf, buflen, "(no bootstrap.servers)");
}

void al_kafka__unreachable_message(rd_kafka_t *rk, const char *what, char *errstr, size_t errlen)
{
    char bs[512], reason[256];
    handle_bootstrap(rk, bs, sizeof bs);
    if (!al_kafka__reason_get(rk, reason, sizeof reason))
        snprintf(reason, sizeof reason, "%s", what);
    al_err(errstr, errlen, "cannot reach Kafka at %s: %s (all brokers down)", bs, reason);
}

int al_kafka_check_reachable(rd_kafka_t *rk, int timeout_ms, char *errstr, size_t errlen)
{
    int64_t deadline = al_mono_us() + (int64_t)timeout_ms * 1000;
    rd_kafka_resp_err_t err = RD_KAFKA_RESP_ERR__TIMED_OUT;
    for (;;) {
        const struct rd_kafka_metadata *md = NULL;
        int64_t left_ms = (deadline - al_mono_us()) / 1000;
        if (left_ms <= 0) break;
        err = rd_kafka_metadata(rk, 0, NULL, &md, (int)(left_ms < 500 ? left_ms : 500));
        if (md) rd_kafka_metadata_destroy(md);
        if (!err) return 0;
        if (err != RD_KAFKA_RESP_ERR__TIMED_OUT && err != RD_KAFKA_RESP_ERR__TRANSPORT) break;
    }
    char what[128];
    snprintf(what, sizeof what, "no answer within %d ms (%s)", timeout_ms, rd_kafka_err2str(err));
    al_kafka__unreachable_message(rk, what, errstr, errlen);
    return -1;
}
