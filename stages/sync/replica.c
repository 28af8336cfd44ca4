/*
 * replica.c: one serving replica of `arclight sync` and the HTTP calls that bring it to a new
 * version, per back end (see sync.h). Each call is a blocking libcurl request with a timeout;
 * an answer is judged by its status and, where the back end has one, its "success" field.
 */
#include "sync.h"

#include "core/buf.h"
#include "core/util.h"

#include <curl/curl.h>
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *sync_kind_name(sync_kind k)
{
    return k == SYNC_KIND_SGLANG ? "sglang" : k == SYNC_KIND_VLLM ? "vllm" : "arclight";
}

int sync_replica_parse(sync_replica *r, const char *spec, char *err, size_t errlen)
{
    memset(r, 0, sizeof *r);
    r->version = r->failed_for = -1;
    const char *eq = strchr(spec, '=');
    if (!eq) return al_err(err, errlen, "wants KIND=URL (KIND: sglang, vllm or arclight)");
    size_t kl = (size_t)(eq - spec);
    if (kl == 6 && !strncmp(spec, "sglang", 6))
        r->kind = SYNC_KIND_SGLANG;
    else if (kl == 4 && !strncmp(spec, "vllm", 4))
        r->kind = SYNC_KIND_VLLM;
    else if (kl == 8 && !strncmp(spec, "arclight", 8))
        r->kind = SYNC_KIND_ARCLIGHT;
    else
        return al_err(err, errlen, "wants KIND=URL with KIND sglang, vllm or arclight");
    const char *url = eq + 1;
    size_t n = strlen(url);
    while (n > 0 && url[n - 1] == '/') n--;
    if (strncmp(url, "http://", 7) != 0 && strncmp(url, "https://", 8) != 0)
        return al_err(err, errlen, "wants an http:// or https:// URL after KIND=");
    if (n >= sizeof r->url || n <= 8)
        return al_err(err, errlen, "wants a URL of at most %zu bytes after KIND=", sizeof r->url - 1);
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)url[i] <= 0x20 || url[i] == 0x7f)
            return al_err(err, errlen, "wants a URL without spaces or control characters");
    memcpy(r->url, url, n);
    r->url[n] = '\0';
    return 0;
}

static size_t on_body(char *d, size_t sz, size_t n, void *ud)
{
    al_buf *b = ud;
    if (b->len + sz * n > (1u << 20)) return 0; /* an answer this large is not one of these */
    al_buf_append(b, d, sz * n);
    return b->oom ? 0 : sz * n;
}

/* One request: POST body (NULL: GET) to url+path. The status, or -1 when there is none (err
 * says why). The answer's JSON in *out when it is JSON (caller decrefs; may be NULL). */
static long call(const sync_replica *r, const char *path, const char *body, double timeout_s,
                 json_t **out, char *err, size_t errlen)
{
    char url[700];
    snprintf(url, sizeof url, "%s%s", r->url, path);
    al_buf b = {0};
    CURL *c = curl_easy_init();
    if (!c) return al_err(err, errlen, "out of memory");
    struct curl_slist *h = curl_slist_append(NULL, "Content-Type: application/json");
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, (long)(timeout_s * 1000));
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, 5000L);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &b);
    if (body) {
        curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
        curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
    }
    CURLcode rc = curl_easy_perform(c);
    long code = -1;
    if (rc == CURLE_OK)
        curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &code);
    else
        al_err(err, errlen, "%s %s: %s", body ? "POST" : "GET", path, curl_easy_strerror(rc));
    curl_slist_free_all(h);
    curl_easy_cleanup(c);
    *out = b.len ? json_loadb(b.data, b.len, 0, NULL) : NULL;
    if (code >= 0 && (code < 200 || code > 299)) {
        char *s = *out ? json_dumps(*out, JSON_COMPACT) : NULL;
        al_err(err, errlen, "%s %s: %ld %.300s", body ? "POST" : "GET", path, code,
               s ? s : (b.data ? b.data : ""));
        free(s);
    }
    al_buf_free(&b);
    return code;
}

/* A POST that must answer 2xx (and "success": true where the answer has it). 0 or -1. */
static int post_ok(const sync_replica *r, const char *path, const char *body, double timeout_s,
                   char *err, size_t errlen)
{
    json_t *j = NULL;
    long code = call(r, path, body, timeout_s, &j, err, errlen);
    int ok = code >= 200 && code <= 299;
    json_t *s = j ? json_object_get(j, "success") : NULL;
    if (ok && s && !json_is_true(s)) {
        const char *m = json_string_value(json_object_get(j, "message"));
        al_err(err, errlen, "POST %s: success false: %.300s", path, m ? m : "");
        ok = 0;
    }
    json_decref(j);
    return ok ? 0 : -1;
}

int sync_replica_probe(const sync_replica *r, double timeout_s, int64_t *version, char *err,
                       size_t errlen)
{
    json_t *j = NULL;
    const char *path = r->kind == SYNC_KIND_VLLM ? "/weight_info" : "/get_weight_version";
    long code = call(r, path, NULL, timeout_s, &j, err, errlen);
    const char *label = j ? json_string_value(json_object_get(j, "weight_version")) : NULL;
    int rc = -1;
    if (code == 200) {
        char *end;
        errno = 0;
        long long v = label ? strtoll(label, &end, 10) : -1;
        *version = label && *label && !errno && *end == '\0' && v >= 0 ? (int64_t)v : -1;
        rc = 0;
    }
    json_decref(j);
    return rc;
}

/* The body of a JSON object with one string member (escaped). NULL when out of memory. */
static char *obj1(const char *key, const char *value)
{
    json_t *o = json_pack("{s:s}", key, value);
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    return s;
}

/* SGLang's order (as slime drives it): pause, load from disk with the version, continue. */
static int apply_sglang(const sync_replica *r, const char *dir, const char *label, double t,
                        char *err, size_t errlen)
{
    if (post_ok(r, "/pause_generation", "{}", t, err, errlen) != 0) return -1;
    json_t *o = json_pack("{s:s,s:s,s:b}", "model_path", dir, "weight_version", label,
                          "flush_cache", 1);
    char *body = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    int rc = body ? post_ok(r, "/update_weights_from_disk", body, t, err, errlen)
                  : al_err(err, errlen, "out of memory");
    free(body);
    char e2[256];
    if (post_ok(r, "/continue_generation", "{}", t, e2, sizeof e2) != 0 && rc == 0)
        return al_err(err, errlen, "%s", e2);
    return rc;
}

/* vLLM's weight-transfer session with the disk backend: pause (requests kept), start, the
 * directory, finish with the version, resume. */
static int apply_vllm(const sync_replica *r, const char *dir, const char *label, double t,
                      char *err, size_t errlen)
{
    if (post_ok(r, "/pause?mode=keep", "", t, err, errlen) != 0) return -1;
    int rc = post_ok(r, "/start_weight_update", "{}", t, err, errlen);
    if (rc != 0) {
        /* a session left open (by a sync that died mid-update): finishing it without a
         * checkpoint closes it, so that the next try can start one */
        char e2[256];
        post_ok(r, "/finish_weight_update", "{}", t, e2, sizeof e2);
    } else {
        json_t *o = json_pack("{s:{s:s}}", "update_info", "path", dir);
        char *body = o ? json_dumps(o, JSON_COMPACT) : NULL;
        json_decref(o);
        rc = body ? post_ok(r, "/update_weights", body, t, err, errlen)
                  : al_err(err, errlen, "out of memory");
        free(body);
        char *fin = obj1("weight_version", label);
        char e2[256];
        /* finish also when the load failed: it closes the session (the old weights stay) */
        int frc = fin ? post_ok(r, "/finish_weight_update", fin, t, e2, sizeof e2) : -1;
        free(fin);
        if (rc == 0 && frc != 0) rc = al_err(err, errlen, "%s", e2);
    }
    char e3[256];
    if (post_ok(r, "/resume", "", t, e3, sizeof e3) != 0 && rc == 0)
        return al_err(err, errlen, "%s", e3);
    return rc;
}

int sync_replica_apply(const sync_replica *r, const char *dir, int64_t version, double timeout_s,
                       char *err, size_t errlen)
{
    char label[32];
    snprintf(label, sizeof label, "%" PRId64, version);
    int rc = r->kind == SYNC_KIND_VLLM ? apply_vllm(r, dir, label, timeout_s, err, errlen)
                                       : apply_sglang(r, dir, label, timeout_s, err, errlen);
    if (rc != 0) return -1;
    /* what it says it serves now: the version asked for, or the update did not take */
    int64_t now = -1;
    if (sync_replica_probe(r, timeout_s, &now, err, errlen) != 0) return -1;
    if (now != version)
        return al_err(err, errlen, "after the update the replica says it serves version %" PRId64
                                   ", not %" PRId64, now, version);
    return 0;
}
