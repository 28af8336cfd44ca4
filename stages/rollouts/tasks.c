/*
 * tasks.c: the task dataset (see tasks.h).
 */
#include "rollouts/tasks.h"

#include "core/hash.h"
#include "core/util.h"
#include "core/vec.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int key_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           c == '.' || c == '_' || c == ':' || c == '@' || c == '-';
}

void rl_task_key(const char *id, char *key, size_t keylen)
{
    size_t n = strlen(id);
    int plain = n > 0 && n <= 100;
    for (size_t i = 0; plain && i < n; i++)
        plain = key_char(id[i]);
    if (plain) {
        snprintf(key, keylen, "%s", id);
        return;
    }
    char hex[65];
    al_sha256_hex(id, n, hex);
    size_t k = 0;
    for (size_t i = 0; i < n && k < 80 && k + 1 < keylen; i++)
        key[k++] = key_char(id[i]) ? id[i] : '_';
    snprintf(key + k, keylen - k, "-%.12s", hex);
}

void rl_shuffle(size_t *idx, size_t n, uint64_t seed, uint64_t epoch)
{
    uint64_t st = seed * 0x9e3779b97f4a7c15ULL ^ (epoch + 1) * 0xd1b54a32d192ed03ULL;
    for (size_t i = 0; i < n; i++)
        idx[i] = i;
    for (size_t i = n; i > 1; i--) {
        size_t j = (size_t)(al_splitmix64(&st) % i);
        size_t t = idx[i - 1];
        idx[i - 1] = idx[j];
        idx[j] = t;
    }
}

int rl_parse_shard(const char *s, int *index, int *count)
{
    char *end;
    errno = 0;
    long i = strtol(s, &end, 10);
    if (errno || end == s || *end != '/') return -1;
    const char *p = end + 1;
    long n = strtol(p, &end, 10);
    if (errno || end == p || *end || n < 1 || n > 65536 || i < 0 || i >= n) return -1;
    *index = (int)i;
    *count = (int)n;
    return 0;
}

void rl_tasks_free(rl_tasks *ts)
{
    if (!ts) return;
    for (size_t i = 0; i < ts->n; i++) {
        free(ts->t[i].id);
        free(ts->t[i].key);
        free(ts->t[i].record);
    }
    free(ts->t);
    ts->t = NULL;
    ts->n = 0;
}

/* Parses one line into a task; 0, 1 (not this shard: skipped), or -1 with errstr. */
static int parse_line(const char *line, size_t len, const char *name, int lineno,
                      const rl_tasks_opts *o, rl_task *t, char *errstr, size_t errlen)
{
    json_error_t je;
    json_t *j = json_loadb(line, len, JSON_REJECT_DUPLICATES, &je);
    if (!j)
        return al_err(errstr, errlen, "%s:%d: not a JSON object: %s (column %d)", name, lineno,
                      je.text, je.column);
    int rc = -1;
    char idbuf[32];
    const char *id = NULL;
    json_t *jid = json_object_get(j, "id"), *split = json_object_get(j, "split");
    if (!json_is_object(j)) {
        al_err(errstr, errlen, "%s:%d: a task is a JSON object, not %s", name, lineno,
               json_is_array(j) ? "an array" : "a scalar");
        goto out;
    }
    if (!jid) {
        al_err(errstr, errlen, "%s:%d: 'id' is missing", name, lineno);
        goto out;
    }
    if (json_is_string(jid)) {
        id = json_string_value(jid);
        if (!*id || strlen(id) > 1024 || strlen(id) != json_string_length(jid)) {
            al_err(errstr, errlen, "%s:%d: 'id' must be 1-1024 bytes without NUL", name, lineno);
            goto out;
        }
    } else if (json_is_integer(jid)) {
        snprintf(idbuf, sizeof idbuf, "%" JSON_INTEGER_FORMAT, json_integer_value(jid));
        id = idbuf;
    } else {
        al_err(errstr, errlen, "%s:%d: 'id' must be a string or an integer", name, lineno);
        goto out;
    }
    if (!json_object_get(j, "input")) {
        al_err(errstr, errlen, "%s:%d: task %s has no 'input'", name, lineno, id);
        goto out;
    }
    uint64_t h = al_hash_str(id); /* stable across versions: a user's split must not move */
    if (split && !json_is_string(split)) {
        al_err(errstr, errlen, "%s:%d: 'split' must be \"train\" or \"val\"", name, lineno);
        goto out;
    }
    rl_split sp;
    if (split && !strcmp(json_string_value(split), "train")) {
        sp = RL_SPLIT_TRAIN;
    } else if (split && (!strcmp(json_string_value(split), "val") ||
                         !strcmp(json_string_value(split), "validation"))) {
        sp = RL_SPLIT_VAL;
    } else if (split) {
        al_err(errstr, errlen, "%s:%d: 'split' is \"%.40s\"; it must be \"train\" or \"val\"",
               name, lineno, json_string_value(split));
        goto out;
    } else {
        uint64_t x = h;
        double u = (double)(al_splitmix64(&x) >> 11) * (1.0 / 9007199254740992.0);
        sp = u < o->split_ratio ? RL_SPLIT_VAL : RL_SPLIT_TRAIN;
    }
    if ((int)(h % (uint64_t)o->shard_count) != o->shard_index) {
        rc = 1;
        goto out;
    }
    char key[160];
    rl_task_key(id, key, sizeof key);
    memset(t, 0, sizeof *t);
    t->id = strdup(id);
    t->key = strdup(key);
    t->record = json_dumps(j, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_ENCODE_ANY);
    t->split = sp;
    t->hash = h;
    t->line = lineno;
    if (!t->id || !t->key || !t->record) {
        free(t->id), free(t->key), free(t->record);
        al_err(errstr, errlen, "out of memory");
        goto out;
    }
    rc = 0;
out:
    json_decref(j);
    return rc;
}

static int key_cmp(const void *a, const void *b)
{
    const rl_task *x = *(rl_task *const *)a, *y = *(rl_task *const *)b;
    return strcmp(x->key, y->key);
}

int rl_tasks_parse(const char *text, size_t len, const char *name, const rl_tasks_opts *o,
                   rl_tasks *out, char *errstr, size_t errlen)
{
    memset(out, 0, sizeof *out);
    if (!(o->split_ratio >= 0 && o->split_ratio <= 1) || o->shard_count < 1 ||
        o->shard_index < 0 || o->shard_index >= o->shard_count)
        return al_err(errstr, errlen, "tasks: bad options (split ratio in [0, 1], shard i/N)");
    size_t cap = 0, seen = 0;
    int lineno = 0;
    for (size_t pos = 0; pos < len;) {
        const char *nl = memchr(text + pos, '\n', len - pos);
        size_t end = nl ? (size_t)(nl - text) : len;
        const char *line = text + pos;
        size_t n = end - pos;
        pos = end + 1;
        lineno++;
        while (n && (line[n - 1] == '\r' || line[n - 1] == ' ' || line[n - 1] == '\t'))
            n--;
        while (n && (*line == ' ' || *line == '\t'))
            line++, n--;
        if (!n || *line == '#') continue;
        if (al_vec_grow((void **)&out->t, &cap, out->n + 1, sizeof *out->t)) {
            rl_tasks_free(out);
            return al_err(errstr, errlen, "out of memory");
        }
        int r = parse_line(line, n, name, lineno, o, &out->t[out->n], errstr, errlen);
        if (r < 0) {
            rl_tasks_free(out);
            return -1;
        }
        seen++;
        if (r == 0) out->n++;
    }
    if (!seen) {
        rl_tasks_free(out);
        return al_err(errstr, errlen, "%s: no tasks in the file", name);
    }
    /* Ids (as keys: two ids may not share one) must be unique. */
    rl_task **sorted = malloc((out->n ? out->n : 1) * sizeof *sorted);
    if (!sorted) {
        rl_tasks_free(out);
        return al_err(errstr, errlen, "out of memory");
    }
    for (size_t i = 0; i < out->n; i++)
        sorted[i] = &out->t[i];
    qsort(sorted, out->n, sizeof *sorted, key_cmp);
    for (size_t i = 1; i < out->n; i++)
        if (!strcmp(sorted[i]->key, sorted[i - 1]->key)) {
            const rl_task *a = sorted[i - 1], *b = sorted[i];
            if (a->line > b->line) a = sorted[i], b = sorted[i - 1];
            al_err(errstr, errlen, "%s:%d: task id '%.100s' is already used on line %d", name,
                   b->line, b->id, a->line);
            free(sorted);
            rl_tasks_free(out);
            return -1;
        }
    free(sorted);
    return 0;
}

int rl_tasks_load(const char *path, const rl_tasks_opts *o, rl_tasks *out, char *errstr,
                  size_t errlen)
{
    size_t len;
    char *text = al_file_read(path, &len, errstr, errlen);
    if (!text) return -1;
    int rc = rl_tasks_parse(text, len, path, o, out, errstr, errlen);
    free(text);
    return rc;
}
