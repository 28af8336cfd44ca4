/*
 * policy.c: following arclight.policy and swapping weights (policy.h).
 *
 * Two threads: the reader follows the topic (kafka/follower.h) and records the newest version
 * of the model (under the lock); the loader fetches and loads that version whenever it is
 * newer than the last one it tried. The fetch polls abort_fetch, which sees a newer version recorded by the reader, so
 * a download never holds the next version up.
 */
#include "policy.h"

#include "avro/codec.h"
#include "core/log.h"
#include "core/util.h"
#include "kafka/follower.h"
#include "kafka/kafka.h"
#include "model/safetensors.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define COMP "serve"

size_t al_serve_weights_max_bytes(const al_model *m)
{
    const al_model_config *c = al_model_config_of(m);
    size_t floats = al_model_num_params(m);
    if (c->tie_word_embeddings) floats += (size_t)c->vocab_size * (size_t)c->hidden_size;
    size_t bytes = floats * 4 + 65536 + 1024 * al_model_num_tensors(m);
    return bytes + bytes / 16 + (1u << 20);
}

al_model *al_serve_model_from_bytes(const al_model_config *cfg, uint8_t *bytes, size_t len,
                                    const char *what, char *errstr, size_t errlen)
{
    char wlog[400], e2[700];
    al_serve_log_escape(what, wlog, sizeof wlog);
    if (al_serve_st_precheck(bytes, len, e2, sizeof e2) != 0) {
        free(bytes);
        al_err(errstr, errlen, "%s: %s", wlog, e2);
        return NULL;
    }
    al_st_file f = {0};
    if (al_st_parse(&f, bytes, len, wlog, errstr, errlen) != 0) return NULL;
    al_model *m = al_model_new(cfg, errstr, errlen);
    if (m && al_model_load_st(m, &f, wlog, errstr, errlen) != 0) {
        al_model_free(m);
        m = NULL;
    }
    al_st_close(&f);
    if (!m) return NULL;
    /* NaN or Inf anywhere makes every logprob NaN: refuse before the swap, naming the tensor */
    const float *w = al_model_params(m);
    size_t n = al_model_num_params(m), bad = 0, first = 0;
    for (size_t i = 0; i < n; i++)
        if (!isfinite(w[i]) && bad++ == 0) first = i;
    if (bad) {
        const char *tname = "?";
        const al_model_tensor *t = al_model_tensors(m);
        for (size_t i = 0; i < al_model_num_tensors(m); i++)
            if (first >= t[i].offset && first < t[i].offset + t[i].numel) tname = t[i].name;
        al_err(errstr, errlen, "%s: %zu weights are not finite (the first in %s)", wlog, bad,
               tname);
        al_model_free(m);
        return NULL;
    }
    return m;
}

/* ------------------------------------------------------------------------------------------
 * The follower
 * ------------------------------------------------------------------------------------------ */

struct al_serve_policy {
    char *topic, *model;
    al_model_config cfg;
    al_serve_fetch_opts fetch;
    char **roots;
    al_serve_engine *eng;
    al_kafka_conf *kc;
    al_follower *follower;
    pthread_t reader, loader;
    int reader_started, loader_started;
    atomic_int stop;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    /* under lock */
    int64_t want_version; /* the newest version of the model seen (-1: none) */
    int64_t want_step;
    char *want_uri, *want_sha;
    int64_t tried_version; /* the newest the loader took up (-1: none) */
    int loading;
    int caught_up; /* the reader reached the end the topic had when it was assigned */
    char waiting_for[256];
    /* read by the fetch's abort check without the lock */
    atomic_llong newest;
    atomic_int failed;
    char reason[512]; /* written once, before failed is set */
};

static int abort_fetch(void *ud, const char **why)
{
    al_serve_policy *p = ud;
    if (atomic_load(&p->stop)) {
        *why = "the server is stopping";
        return 1;
    }
    return 0;
}

/* The loader's own abort: stopping, or a newer version than the one being fetched. */
typedef struct load_ctx {
    al_serve_policy *p;
    int64_t version;
} load_ctx;

static int abort_load(void *ud, const char **why)
{
    load_ctx *lc = ud;
    if (abort_fetch(lc->p, why)) return 1;
    if (atomic_load(&lc->p->newest) > lc->version) {
        *why = "superseded by a newer version while it was fetched";
        return 1;
    }
    return 0;
}

static void load_version(al_serve_policy *p, int64_t version, int64_t step, const char *uri,
                         const char *sha)
{
    int64_t cur = al_serve_engine_version(p->eng);
    if (version <= cur) return;
    char err[1500];
    load_ctx lc = {p, version};
    al_serve_fetch_opts fo = p->fetch;
    fo.abort = abort_load, fo.abort_ud = &lc;
    int64_t t0 = al_mono_us();
    uint8_t *bytes = NULL;
    size_t len = 0;
    al_model *m = NULL;
    if (al_serve_fetch_weights(uri, sha, &fo, &bytes, &len, err, sizeof err) == 0)
        m = al_serve_model_from_bytes(&p->cfg, bytes, len, uri, err, sizeof err);
    /* to the engine's device before the handover, checked on the host first */
    if (m && al_model_set_backend(m, al_serve_engine_backend(p->eng), err, sizeof err) != 0) {
        al_model_free(m);
        m = NULL;
    }
    if (!m) {
        if (atomic_load(&p->stop)) return;
        if (atomic_load(&p->newest) > version)
            al_log_info(COMP, "policy version %" PRId64 " not loaded: %s", version, err);
        else
            al_log_error(COMP,
                         "policy version %" PRId64 " not loaded, still serving version %" PRId64
                         ": %s",
                         version, cur, err);
        return;
    }
    al_serve_weights *w = al_serve_weights_new(m, version);
    if (!w) {
        al_log_error(COMP, "policy version %" PRId64 " not loaded: out of memory", version);
        return;
    }
    al_serve_engine_set_weights(p->eng, w);
    char ulog[400];
    al_log_info(COMP,
                "now serving policy version %" PRId64 " (step %" PRId64 ", %s, %.1f MB in %.0f ms)",
                version, step, al_serve_log_escape(uri, ulog, sizeof ulog), len / 1e6,
                (al_mono_us() - t0) / 1000.0);
}

static void *loader_main(void *arg)
{
    al_serve_policy *p = arg;
    pthread_mutex_lock(&p->lock);
    for (;;) {
        /* nothing before the reader has caught up: only the newest version is loaded */
        while (!atomic_load(&p->stop) && (!p->caught_up || p->want_version <= p->tried_version))
            pthread_cond_wait(&p->cond, &p->lock);
        if (atomic_load(&p->stop)) break;
        int64_t v = p->want_version, step = p->want_step;
        char *uri = strdup(p->want_uri ? p->want_uri : ""), *sha = strdup(p->want_sha ? p->want_sha : "");
        p->tried_version = v;
        p->loading = 1;
        pthread_mutex_unlock(&p->lock);
        if (uri && sha) load_version(p, v, step, uri, sha);
        free(uri);
        free(sha);
        pthread_mutex_lock(&p->lock);
        p->loading = 0;
        pthread_cond_broadcast(&p->cond);
    }
    pthread_mutex_unlock(&p->lock);
    return NULL;
}

/* Records a PolicyVersion message when it is a newer version of our model. */
static void reader_handle(al_serve_policy *p, const rd_kafka_message_t *msg)
{
    al_policy_version pv = {0};
    char err[1024];
    if (al_policy_version_decode(msg->payload, msg->len, &pv, err, sizeof err) != 0) {
        al_log_warn(COMP, "%s [%" PRId32 "] offset %" PRId64 ": not a PolicyVersion (%s); skipped",
                    p->topic, msg->partition, msg->offset, err);
        return;
    }
    if (strcmp(pv.model ? pv.model : "", p->model) == 0) {
        pthread_mutex_lock(&p->lock);
        if (pv.version > p->want_version) {
            char *u = strdup(pv.checkpoint_uri ? pv.checkpoint_uri : "");
            char *s = strdup(pv.sha256 ? pv.sha256 : "");
            if (u && s) {
                free(p->want_uri), free(p->want_sha);
                p->want_uri = u, p->want_sha = s;
                p->want_version = pv.version, p->want_step = pv.step;
                atomic_store(&p->newest, pv.version);
                pthread_cond_broadcast(&p->cond);
                u = s = NULL;
            }
            free(u), free(s);
        }
        pthread_mutex_unlock(&p->lock);
    }
    al_policy_version_clear(&pv);
}

/* Sleeps up to ms, returning early once stop is set. */
static void nap(al_serve_policy *p, int ms)
{
    for (int t = 0; t < ms && !atomic_load(&p->stop); t += 50)
        usleep(50000);
}

/* Records that the follower has caught up (the loader may start, wait_ready may return). */
static void reader_caught_up(al_serve_policy *p)
{
    pthread_mutex_lock(&p->lock);
    p->caught_up = 1;
    pthread_cond_broadcast(&p->cond);
    pthread_mutex_unlock(&p->lock);
}

/* Assigns the topic until that works, saying why it does not (once in 30 s). 0 once assigned,
 * -1 on a stop. */
static int reader_assign(al_serve_policy *p)
{
    int64_t next_complaint = 0;
    char err[600];
    while (!atomic_load(&p->stop)) {
        if (al_follower_assign(p->follower, err, sizeof err) == 0) {
            if (al_follower_caught_up(p->follower)) reader_caught_up(p);
            return 0;
        }
        pthread_mutex_lock(&p->lock);
        snprintf(p->waiting_for, sizeof p->waiting_for, "%.250s", err);
        pthread_mutex_unlock(&p->lock);
        if (al_mono_us() >= next_complaint && !atomic_load(&p->stop)) {
            al_log_warn(COMP, "policy follower: %s; retrying", err);
            next_complaint = al_mono_us() + 30 * 1000000LL;
        }
        nap(p, 1000);
    }
    return -1;
}

/* The reader thread: assigns, then hands every record to reader_handle until a stop or a
 * fatal client error (which it records for al_serve_policy_failed). */
static void *reader_main(void *arg)
{
    al_serve_policy *p = arg;
    if (reader_assign(p) != 0) return NULL;
    int caught_up = al_follower_caught_up(p->follower);
    while (!atomic_load(&p->stop)) {
        rd_kafka_message_t *m;
        int k = al_follower_next(p->follower, 200, &m);
        if (k < 0) {
            if (al_kafka_error_classify(m->err) == AL_KAFKA_ERRCLASS_FATAL) {
                snprintf(p->reason, sizeof p->reason, "not following %.100s: %.380s", p->topic,
                         rd_kafka_message_errstr(m));
                atomic_store(&p->failed, 1);
                al_log_error(COMP, "policy follower stopped: %s", p->reason);
                rd_kafka_message_destroy(m);
                break;
            }
            al_log_debug(COMP, "policy topic: %s", rd_kafka_message_errstr(m));
        } else if (k > 0) {
            reader_handle(p, m);
        }
        if (m) rd_kafka_message_destroy(m);
        if (!caught_up && al_follower_caught_up(p->follower)) {
            caught_up = 1;
            reader_caught_up(p);
        }
    }
    return NULL;
}

static void policy_free(al_serve_policy *p)
{
    al_follower_free(p->follower); /* without a consumer close: never waits on the broker */
    al_kafka_conf_free(p->kc);
    for (size_t i = 0; i < p->fetch.nroots; i++)
        free(p->roots[i]);
    free(p->roots);
    free(p->want_uri);
    free(p->want_sha);
    free(p->topic);
    free(p->model);
    pthread_mutex_destroy(&p->lock);
    pthread_cond_destroy(&p->cond);
    free(p);
}

al_serve_policy *al_serve_policy_start(const al_cli_common *common,
                                       const al_serve_policy_opts *o, al_serve_engine *eng,
                                       char *errstr, size_t errlen)
{
    al_serve_policy *p = calloc(1, sizeof *p);
    if (!p) {
        al_err(errstr, errlen, "out of memory");
        return NULL;
    }
    pthread_mutex_init(&p->lock, NULL);
    pthread_cond_init(&p->cond, NULL);
    p->want_version = p->tried_version = -1;
    atomic_init(&p->newest, -1);
    p->topic = strdup(o->topic), p->model = strdup(o->model), p->cfg = *o->cfg, p->eng = eng;
    p->fetch = o->fetch;
    p->fetch.abort = NULL, p->fetch.abort_ud = NULL;
    p->roots = calloc(o->fetch.nroots + 1, sizeof *p->roots);
    p->fetch.nroots = 0;
    if (!p->topic || !p->model || !p->roots) {
        al_err(errstr, errlen, "out of memory");
        goto fail;
    }
    for (size_t i = 0; i < o->fetch.nroots; i++) {
        if (!(p->roots[i] = strdup(o->fetch.roots[i]))) {
            al_err(errstr, errlen, "out of memory");
            goto fail;
        }
        p->fetch.nroots++;
    }
    p->fetch.roots = (const char *const *)p->roots;
    p->kc = al_kafka_conf_from_cli(common, errstr, errlen);
    if (!p->kc) goto fail;
    al_follower_opts fo = {.topic = p->topic, .client = "arclight-serve-policy", .timeout_ms = 1000};
    p->follower = al_follower_new(p->kc, &fo, errstr, errlen);
    if (!p->follower) goto fail;
    snprintf(p->waiting_for, sizeof p->waiting_for, "the first answer from the broker");
    if (pthread_create(&p->reader, NULL, reader_main, p) != 0) {
        al_err(errstr, errlen, "cannot start the policy follower thread");
        goto fail;
    }
    p->reader_started = 1;
    if (pthread_create(&p->loader, NULL, loader_main, p) != 0) {
        al_err(errstr, errlen, "cannot start the policy loader thread");
        goto fail;
    }
    p->loader_started = 1;
    return p;
fail:
    al_serve_policy_stop(p);
    return NULL;
}

int al_serve_policy_wait_ready(al_serve_policy *p, double timeout_s, char *errstr, size_t errlen)
{
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += (time_t)timeout_s;
    dl.tv_nsec += (long)((timeout_s - (double)(time_t)timeout_s) * 1e9);
    if (dl.tv_nsec >= 1000000000L) dl.tv_sec++, dl.tv_nsec -= 1000000000L;
    pthread_mutex_lock(&p->lock);
    int rc = 0;
    while (!(p->caught_up && !p->loading && p->tried_version >= p->want_version) &&
           !atomic_load(&p->failed)) {
        if (pthread_cond_timedwait(&p->cond, &p->lock, &dl) == ETIMEDOUT) {
            rc = -1;
            if (!p->caught_up)
                al_err(errstr, errlen, "%s is not read to its end yet (waiting for %s)", p->topic,
                       p->waiting_for);
            else
                al_err(errstr, errlen, "policy version %" PRId64 " is still loading",
                       p->want_version);
            break;
        }
    }
    pthread_mutex_unlock(&p->lock);
    return rc;
}

void al_serve_policy_stop(al_serve_policy *p)
{
    if (!p) return;
    atomic_store(&p->stop, 1);
    pthread_mutex_lock(&p->lock);
    pthread_cond_broadcast(&p->cond);
    pthread_mutex_unlock(&p->lock);
    if (p->reader_started) pthread_join(p->reader, NULL);
    if (p->loader_started) pthread_join(p->loader, NULL);
    policy_free(p);
}

int al_serve_policy_failed(al_serve_policy *p, char *reason, size_t reasonlen)
{
    if (!p || !atomic_load(&p->failed)) return 0;
    snprintf(reason, reasonlen, "%s", p->reason);
    return 1;
}
