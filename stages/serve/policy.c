/*
 * policy.c: following arclight.policy and swapping weights (policy.h).
 */
#include "policy.h"

#include "avro/codec.h"
#include "core/log.h"
#include "core/util.h"
#include "kafka/kafka.h"
#include "model/safetensors.h"

#include <curl/curl.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define COMP "serve"

struct al_serve_policy {
    pthread_t thread;
    atomic_int stop;
    al_kafka_conf *kc;
    al_consumer *consumer;
    char *topic, *model;
    al_model_config cfg;
    al_serve_engine *eng;
    atomic_int failed;
    char reason[512]; /* written once, before failed is set */
};

typedef struct grow {
    uint8_t *p;
    size_t len, cap;
} grow;

static size_t curl_write(char *data, size_t sz, size_t n, void *ud)
{
    grow *g = ud;
    size_t add = sz * n;
    if (g->len + add + 1 > g->cap) {
        size_t cap = g->cap ? g->cap * 2 : 1 << 16;
        while (cap < g->len + add + 1)
            cap *= 2;
        uint8_t *p = realloc(g->p, cap);
        if (!p) return 0;
        g->p = p, g->cap = cap;
    }
    memcpy(g->p + g->len, data, add);
    g->len += add;
    return add;
}

int al_serve_fetch_weights(const char *uri, const char *sha256_hex, uint8_t **out, size_t *len,
                           char *errstr, size_t errlen)
{
    char url[4096];
    size_t ul = strlen(uri);
    if (ul == 0 || ul + 32 > sizeof url)
        return al_err(errstr, errlen, "checkpoint URI '%s' is empty or too long", uri);
    snprintf(url, sizeof url, "%s%s", uri, uri[ul - 1] == '/' ? "model.safetensors" : "");
    grow g = {0};
    if (!strncmp(url, "file://", 7)) {
        char e2[512];
        g.p = (uint8_t *)al_file_read(url + 7, &g.len, e2, sizeof e2);
        if (!g.p) return al_err(errstr, errlen, "fetching %s: %s", url, e2);
    } else if (!strncmp(url, "http://", 7) || !strncmp(url, "https://", 8)) {
        CURL *c = curl_easy_init();
        if (!c) return al_err(errstr, errlen, "fetching %s: curl_easy_init failed", url);
        char cerr[CURL_ERROR_SIZE] = "";
        curl_easy_setopt(c, CURLOPT_URL, url);
        curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, curl_write);
        curl_easy_setopt(c, CURLOPT_WRITEDATA, &g);
        curl_easy_setopt(c, CURLOPT_ERRORBUFFER, cerr);
        curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 1L);
        curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
        curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT, 10L);
        curl_easy_setopt(c, CURLOPT_TIMEOUT, 600L);
        CURLcode rc = curl_easy_perform(c);
        long code = 0;
        curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &code);
        curl_easy_cleanup(c);
        if (rc != CURLE_OK || code != 200) {
            free(g.p);
            if (rc != CURLE_OK)
                return al_err(errstr, errlen, "fetching %s: %s", url,
                              *cerr ? cerr : curl_easy_strerror(rc));
            return al_err(errstr, errlen, "fetching %s: HTTP status %ld", url, code);
        }
    } else {
        return al_err(errstr, errlen,
                      "checkpoint URI '%s': only file://, http:// and https:// are supported", uri);
    }
    if (sha256_hex && *sha256_hex) {
        char hex[65];
        al_sha256_hex(g.p, g.len, hex);
        if (strcasecmp(hex, sha256_hex) != 0) {
            free(g.p);
            return al_err(errstr, errlen, "%s: sha256 is %s, the PolicyVersion says %s", url, hex,
                          sha256_hex);
        }
    }
    *out = g.p, *len = g.len;
    return 0;
}

al_model *al_serve_model_from_bytes(const al_model_config *cfg, uint8_t *bytes, size_t len,
                                    const char *what, char *errstr, size_t errlen)
{
    al_st_file f = {0};
    if (al_st_parse(&f, bytes, len, what, errstr, errlen) != 0) return NULL;
    al_model *m = al_model_new(cfg, errstr, errlen);
    if (m && al_model_load_st(m, &f, what, errstr, errlen) != 0) {
        al_model_free(m);
        m = NULL;
    }
    al_st_close(&f);
    return m;
}

/* Handles one PolicyVersion message: swaps when it is a newer version of our model. */
static void handle(al_serve_policy *p, const rd_kafka_message_t *msg)
{
    al_policy_version pv = {0};
    char err[1024];
    if (al_policy_version_decode(msg->payload, msg->len, &pv, err, sizeof err) != 0) {
        al_log_warn(COMP, "%s [%" PRId32 "] offset %" PRId64 ": not a PolicyVersion (%s); skipped",
                    p->topic, msg->partition, msg->offset, err);
        return;
    }
    int64_t cur = al_serve_engine_version(p->eng);
    if (strcmp(pv.model ? pv.model : "", p->model) != 0 || pv.version <= cur) {
        al_log_debug(
            COMP, "policy version %" PRId64 " of '%s' skipped (serving '%s' version %" PRId64 ")",
            pv.version, pv.model ? pv.model : "", p->model, cur);
        al_policy_version_clear(&pv);
        return;
    }
    int64_t t0 = al_mono_us();
    uint8_t *bytes = NULL;
    size_t len = 0;
    al_model *m = NULL;
    if (al_serve_fetch_weights(pv.checkpoint_uri ? pv.checkpoint_uri : "", pv.sha256, &bytes, &len,
                               err, sizeof err) == 0)
        m = al_serve_model_from_bytes(&p->cfg, bytes, len, pv.checkpoint_uri, err, sizeof err);
    if (m && al_model_set_backend(m, al_serve_engine_backend(p->eng), err, sizeof err) != 0) {
        al_model_free(m);
        m = NULL;
    }
    if (!m) {
        al_log_error(COMP,
                     "policy version %" PRId64 " not loaded, still serving version %" PRId64 ": %s",
                     pv.version, cur, err);
        al_policy_version_clear(&pv);
        return;
    }
    al_serve_weights *w = al_serve_weights_new(m, pv.version);
    if (w) {
        al_serve_engine_set_weights(p->eng, w);
        al_log_info(
            COMP,
            "now serving policy version %" PRId64 " (step %" PRId64 ", %s, %.1f MB in %.0f ms)",
            pv.version, pv.step, pv.checkpoint_uri, len / 1e6, (al_mono_us() - t0) / 1000.0);
    }
    al_policy_version_clear(&pv);
}

static void *policy_main(void *arg)
{
    al_serve_policy *p = arg;
    char err[1024];
    while (!atomic_load(&p->stop)) {
        rd_kafka_message_t *m = NULL;
        int r = al_consumer_poll(p->consumer, 200, &m, err, sizeof err);
        if (r < 0) {
            al_log_error(COMP, "policy follower stopped: %s", err);
            snprintf(p->reason, sizeof p->reason, "not following %.100s: %.380s", p->topic, err);
            atomic_store(&p->failed, 1);
            return NULL;
        }
        if (r == 0) continue;
        handle(p, m);
        al_consumer_input_skip(p->consumer, m);
        rd_kafka_message_destroy(m);
    }
    return NULL;
}

al_serve_policy *al_serve_policy_start(const al_cli_common *common, const char *topic,
                                       const char *model, const al_model_config *cfg,
                                       al_serve_engine *eng, char *errstr, size_t errlen)
{
    al_serve_policy *p = calloc(1, sizeof *p);
    if (!p) {
        al_err(errstr, errlen, "out of memory");
        return NULL;
    }
    p->topic = strdup(topic), p->model = strdup(model), p->cfg = *cfg, p->eng = eng;
    p->kc = al_kafka_conf_from_cli(common, errstr, errlen);
    if (!p->kc) goto fail;
    /* Every server reads the whole compacted topic: its own group, from the beginning. */
    char group[256], host[128] = "host";
    gethostname(host, sizeof host - 1);
    snprintf(group, sizeof group, "arclight-serve-%s-%d-%" PRId64, host, (int)getpid(),
             al_now_us());
    if (!al_kafka_conf_get(p->kc, "auto.offset.reset"))
        al_kafka_conf_set(p->kc, "auto.offset.reset", "earliest");
    p->consumer = al_consumer_new(p->kc, group, NULL, errstr, errlen);
    if (!p->consumer) goto fail;
    const char *topics[1] = {p->topic};
    if (al_consumer_subscribe(p->consumer, topics, 1, errstr, errlen) != 0) goto fail;
    if (pthread_create(&p->thread, NULL, policy_main, p) != 0) {
        al_err(errstr, errlen, "cannot start the policy follower thread");
        goto fail;
    }
    return p;
fail:
    al_consumer_free(p->consumer);
    al_kafka_conf_free(p->kc);
    free(p->topic);
    free(p->model);
    free(p);
    return NULL;
}

void al_serve_policy_stop(al_serve_policy *p)
{
    if (!p) return;
    atomic_store(&p->stop, 1);
    pthread_join(p->thread, NULL);
    al_consumer_free(p->consumer);
    al_kafka_conf_free(p->kc);
    free(p->topic);
    free(p->model);
    free(p);
}

int al_serve_policy_failed(al_serve_policy *p, char *reason, size_t reasonlen)
{
    if (!p || !atomic_load(&p->failed)) return 0;
    snprintf(reason, reasonlen, "%s", p->reason);
    return 1;
}
