/*
 * topics.c: the topics file shared by the embedded broker and `arclight topics create`.
 */
#include "kafka/kafka.h"

#include "core/util.h"

#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

void al_topics_free(al_topic_spec *t, size_t n)
{
    if (!t) return;
    for (size_t i = 0; i < n; i++) {
        free(t[i].name);
        al_kafka_conf_free(t[i].settings);
    }
    free(t);
}

/* Kafka's rule: 1..249 characters of [a-zA-Z0-9._-], not "." or "..". */
static int topic_name_valid(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > 249 || !strcmp(s, ".") || !strcmp(s, "..")) return 0;
    for (; *s; s++)
        if (!(isalnum((unsigned char)*s) || *s == '.' || *s == '_' || *s == '-')) return 0;
    return 1;
}

static int parse_count(const char *s, int max, int *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end || end == s || v < 1 || v > max) return -1;
    *out = (int)v;
    return 0;
}

/* Parses one non-empty, non-comment line into t. */
static int topics_parse_line(char *line, al_topic_spec *t, const char *path, int lineno,
                             char *errstr, size_t errlen)
{
    char *save = NULL;
    char *name = strtok_r(line, " \t", &save);
    char *parts = strtok_r(NULL, " \t", &save);
    char *repl = strtok_r(NULL, " \t", &save);
    if (!name || !parts || !repl)
        return al_err(errstr, errlen, "%s:%d: want NAME PARTITIONS REPLICATION [key=value ...]",
                      path, lineno);
    if (!topic_name_valid(name))
        return al_err(errstr, errlen,
                      "%s:%d: invalid topic name '%.60s' (1-249 of a-z A-Z 0-9 . _ -)", path,
                      lineno, name);
    if (parse_count(parts, 100000, &t->partitions) != 0)
        return al_err(errstr, errlen, "%s:%d: %s: partitions '%s' is not a number in 1..100000",
                      path, lineno, name, parts);
    if (parse_count(repl, 1000, &t->replication) != 0)
        return al_err(errstr, errlen, "%s:%d: %s: replication '%s' is not a number in 1..1000",
                      path, lineno, name, repl);
    t->name = strdup(name);
    t->settings = al_kafka_conf_new();
    if (!t->name || !t->settings) return al_err(errstr, errlen, "out of memory");
    for (char *kv; (kv = strtok_r(NULL, " \t", &save));) {
        char *eq = strchr(kv, '=');
        if (!eq || eq == kv || !eq[1])
            return al_err(errstr, errlen, "%s:%d: %s: setting '%.60s' is not key=value", path,
                          lineno, name, kv);
        *eq = '\0';
        if (al_kafka_conf_set(t->settings, kv, eq + 1) != 0)
            return al_err(errstr, errlen, "out of memory");
    }
    return 0;
}

int al_topics_load(const char *path, al_topic_spec **out, size_t *n, char *errstr, size_t errlen)
{
    char err[512];
    size_t len, cap = 0, cnt = 0;
    al_topic_spec *t = NULL;
    int lineno = 0;
    *out = NULL;
    *n = 0;
    char *text = al_file_read(path, &len, err, sizeof err);
    if (!text) return al_err(errstr, errlen, "topics file: %s", err);
    if (memchr(text, '\0', len)) {
        free(text);
        return al_err(errstr, errlen, "topics file %s: contains a NUL byte", path);
    }
    for (char *line = text, *next; line; line = next) {
        next = strchr(line, '\n');
        if (next) *next++ = '\0';
        lineno++;
        char *hash = strchr(line, '#');
        if (hash) *hash = '\0';
        char *s = al_str_trim(line);
        if (!*s) continue;
        if (cnt == cap) {
            size_t nc = cap ? cap * 2 : 8;
            al_topic_spec *nt = realloc(t, nc * sizeof *nt);
            if (!nt) {
                al_err(errstr, errlen, "out of memory");
                goto fail;
            }
            t = nt;
            cap = nc;
        }
        memset(&t[cnt], 0, sizeof t[cnt]);
        cnt++;
        if (topics_parse_line(s, &t[cnt - 1], path, lineno, errstr, errlen) != 0) goto fail;
        for (size_t i = 0; i + 1 < cnt; i++)
            if (!strcmp(t[i].name, t[cnt - 1].name)) {
                al_err(errstr, errlen, "%s:%d: topic %s is defined twice", path, lineno, t[i].name);
                goto fail;
            }
    }
    free(text);
    if (cnt == 0) {
        al_topics_free(t, cnt);
        return al_err(errstr, errlen, "topics file %s defines no topics", path);
    }
    *out = t;
    *n = cnt;
    return 0;
fail:
    free(text);
    al_topics_free(t, cnt);
    return -1;
}
