/*
 * fleet.c: the proxy's upstreams as a fleet (fleet.h): replicas' versions from sync's
 * records, the trainer's newest version, --max-staleness, active health checks, per-upstream
 * metrics and the rollout-sticky choice.
 *
 * The follower thread reads arclight.sync (JSON, one record per update attempt, keyed by the
 * replica's URL; docs/SERVING.md) and arclight.policy (PolicyVersion); the health thread GETs
 * each upstream's --health-path every --health-interval-ms. Both write under fl->mu; the loop
 * thread reads under it (a few comparisons per call).
 */
#include "fleet.h"

#include "proxy.h"

#include "core/hash.h"
#include "core/log.h"
#include "kafka/follower.h"
#include "kafka/kafka.h"

#include <inttypes.h>
#include <stdatomic.h>
#include <string.h>
#include <unistd.h>

#define FLEET_SWAPS 16 /* swaps kept per upstream: a call older than the oldest is unknown */

/* One successful update of a replica: it served `version` from `finished_us` on, and either
 * version between `started_us` and `finished_us`. */
typedef struct fleet_swap {
    int64_t version, started_us, finished_us;
} fleet_swap;

typedef struct fleet_up {
    fleet_swap swaps[FLEET_SWAPS]; /* a ring, oldest first from `first` */
    int nswaps, first;
    int64_t version;   /* the newest swap's version; -1 before any */
    int64_t open_since; /* a swap in progress began then (a record without finished_us); 0 */
    int64_t lost_us;    /* when it was last seen down (wall clock µs; 0: never): it may have
                           come back with other weights, so until a swap that began after
                           this, its version is unknown */
    atomic_int healthy;
    al_counter *c_req, *c_err;
    al_gauge *g_healthy, *g_version, *g_swapping;
} fleet_up;

struct px_fleet {
    proxy *px;
    px_fleet_conf cf;
    pthread_mutex_t mu;
    fleet_up ups[16];
    size_t n;
    atomic_llong trainer; /* the trainer's newest version; -1 unknown */
    atomic_int stop;
    al_kafka_conf *kc;
    al_follower *f_sync, *f_policy;
    pthread_t follow_th, health_th;
    int follow_started, health_started;
    int64_t next_complaint_us; /* the follower thread's: when it may say again why it waits */
    al_counter *c_refused, *c_disagree;
    al_gauge *g_trainer, *g_fleet;
};

/* A URL compared without trailing slashes and a trailing /v1 (sync names the server, the proxy
 * may name its API root). Writes into out (n bytes). */
static void url_norm(const char *url, char *out, size_t n)
{
    snprintf(out, n, "%s", url);
    size_t l = strlen(out);
    while (l && out[l - 1] == '/')
        out[--l] = '\0';
    if (l >= 3 && !strcmp(out + l - 3, "/v1")) out[l -= 3] = '\0';
    while (l && out[l - 1] == '/')
        out[--l] = '\0';
}

/* The index of the upstream whose URL is url, or -1. */
static int fleet_find(const struct px_fleet *fl, const char *url)
{
    char want[1100], have[1100];
    url_norm(url, want, sizeof want);
    for (size_t i = 0; i < fl->n; i++) {
        url_norm(fl->px->up_public[i], have, sizeof have);
        if (!strcmp(want, have)) return (int)i;
        url_norm(fl->px->cfg.upstreams[i], have, sizeof have);
        if (!strcmp(want, have)) return (int)i;
    }
    return -1;
}

/* The smallest version the healthy upstreams with a known version serve; -1 when none is
 * known. Called under mu. */
static int64_t fleet_min_version(const struct px_fleet *fl)
{
    int64_t v = -1;
    for (size_t i = 0; i < fl->n; i++) {
        const fleet_up *u = &fl->ups[i];
        if (u->version < 0 || !atomic_load(&u->healthy)) continue;
        if (v < 0 || u->version < v) v = u->version;
    }
    return v;
}

/* Files swap s of upstream idx (under mu). */
static void fleet_add_swap(struct px_fleet *fl, int idx, fleet_swap s)
{
    fleet_up *u = &fl->ups[idx];
    int slot;
    if (u->nswaps < FLEET_SWAPS) {
        slot = (u->first + u->nswaps++) % FLEET_SWAPS;
    } else {
        slot = u->first;
        u->first = (u->first + 1) % FLEET_SWAPS;
    }
    u->swaps[slot] = s;
    u->version = s.version;
    al_gauge_set(u->g_version, (double)s.version);
    al_gauge_set(fl->g_fleet, (double)fleet_min_version(fl));
}

/* One record of the sync topic about one of our upstreams: one without finished_us opens a
 * swap (from then on nothing is known of the replica's version), a successful one becomes a
 * swap of the history, a failed one closes the open swap (the old weights stayed). */
static void fleet_on_sync(struct px_fleet *fl, const rd_kafka_message_t *m)
{
    if (!m->payload) return;
    json_error_t je;
    json_t *o = json_loadb(m->payload, m->len, 0, &je);
    const char *model = json_string_value(json_object_get(o, "model"));
    const char *rep = json_string_value(json_object_get(o, "replica"));
    json_t *ver = json_object_get(o, "version"), *st = json_object_get(o, "started_us"),
           *fin = json_object_get(o, "finished_us");
    if (!o || !rep || !json_is_integer(ver) || !json_is_integer(st) ||
        !(json_is_integer(fin) || json_is_null(fin) || !fin)) {
        al_log_warn(COMP, "%s offset %" PRId64 ": not a sync record (%s); skipped",
                    fl->cf.sync_topic, m->offset, o ? "a field is missing or mistyped" : je.text);
        json_decref(o);
        return;
    }
    int idx = fleet_find(fl, rep);
    if (idx < 0 || (fl->cf.model && (!model || strcmp(model, fl->cf.model)))) {
        json_decref(o);
        return;
    }
    int ok = json_is_true(json_object_get(o, "ok"));
    fleet_swap s = {json_integer_value(ver), json_integer_value(st), json_integer_value(fin)};
    pthread_mutex_lock(&fl->mu);
    fleet_up *u = &fl->ups[idx];
    if (!json_is_integer(fin)) {
        u->open_since = s.started_us > 0 ? s.started_us : 1;
    } else {
        u->open_since = 0;
        if (ok) fleet_add_swap(fl, idx, s);
    }
    al_gauge_set(u->g_swapping, u->open_since != 0);
    pthread_mutex_unlock(&fl->mu);
    if (!json_is_integer(fin))
        al_log_info(COMP, "%s is swapping to version %" PRId64, fl->px->up_public[idx], s.version);
    else if (ok)
        al_log_info(COMP, "%s serves version %" PRId64 " (swapped %" PRId64 "..%" PRId64 " us)",
                    fl->px->up_public[idx], s.version, s.started_us, s.finished_us);
    json_decref(o);
}

/* One PolicyVersion: the trainer's newest version of our model. */
static void fleet_on_policy(struct px_fleet *fl, const rd_kafka_message_t *m)
{
    if (!m->payload) return;
    al_policy_version pv = {0};
    char err[512];
    if (al_policy_version_decode(m->payload, m->len, &pv, err, sizeof err) != 0) {
        al_log_warn(COMP, "%s offset %" PRId64 ": not a PolicyVersion (%s); skipped",
                    fl->cf.policy_topic, m->offset, err);
        return;
    }
    if ((!fl->cf.model || !strcmp(pv.model ? pv.model : "", fl->cf.model)) &&
        pv.version > atomic_load(&fl->trainer)) {
        atomic_store(&fl->trainer, pv.version);
        al_gauge_set(fl->g_trainer, (double)pv.version);
    }
    al_policy_version_clear(&pv);
}

/* Sleeps ms unless the stop comes first. */
static void fleet_nap(struct px_fleet *fl, int64_t ms)
{
    for (int64_t t = 0; t < ms && !atomic_load(&fl->stop); t += 20)
        usleep(20000);
}

/* Hands the follower's next record (waiting up to timeout_ms) to on; until the follower is
 * assigned, says why not (once in 30 s) and waits. 1 when it read something. */
static int fleet_poll(struct px_fleet *fl, al_follower *f, int timeout_ms,
                      void (*on)(struct px_fleet *, const rd_kafka_message_t *))
{
    char err[512];
    if (al_follower_assign(f, err, sizeof err) != 0) {
        if (al_mono_us() >= fl->next_complaint_us) {
            al_log_warn(COMP, "fleet follower: %s; retrying", err);
            fl->next_complaint_us = al_mono_us() + 30 * 1000000LL;
        }
        fleet_nap(fl, 500);
        return 0;
    }
    rd_kafka_message_t *m = NULL;
    int k = al_follower_next(f, timeout_ms, &m);
    if (k > 0) on(fl, m);
    else if (k < 0) al_log_debug(COMP, "fleet follower: %s", rd_kafka_message_errstr(m));
    if (m) rd_kafka_message_destroy(m);
    return k > 0;
}

/* The follower thread: both topics until the stop. */
static void *fleet_follow_main(void *arg)
{
    struct px_fleet *fl = arg;
    while (!atomic_load(&fl->stop)) {
        int got = 0;
        if (fl->f_sync) got |= fleet_poll(fl, fl->f_sync, 20, fleet_on_sync);
        if (fl->f_policy) got |= fleet_poll(fl, fl->f_policy, 20, fleet_on_policy);
        if (!got && !fl->f_sync && !fl->f_policy) break;
    }
    return NULL;
}

static size_t fleet_discard(char *p, size_t s, size_t n, void *ud)
{
    (void)p, (void)ud;
    return s * n;
}

/* Notes that upstream u was seen down now (fleet_up.lost_us). */
static void fleet_mark_lost(struct px_fleet *fl, fleet_up *u)
{
    pthread_mutex_lock(&fl->mu);
    u->lost_us = al_now_us();
    pthread_mutex_unlock(&fl->mu);
}

/* The health thread: each upstream's --health-path must answer 2xx within the interval (at
 * most 2 s); the verdict changes the healthy gauge and the routing at once. */
static void *fleet_health_main(void *arg)
{
    struct px_fleet *fl = arg;
    CURL *e = curl_easy_init();
    if (!e) return NULL;
    long to = fl->cf.health_ms < 2000 ? (long)fl->cf.health_ms : 2000;
    while (!atomic_load(&fl->stop)) {
        for (size_t i = 0; i < fl->n && !atomic_load(&fl->stop); i++) {
            char url[1200];
            char base[1100];
            url_norm(fl->px->cfg.upstreams[i], base, sizeof base);
            snprintf(url, sizeof url, "%s%s", base, fl->cf.health_path);
            curl_easy_reset(e);
            curl_easy_setopt(e, CURLOPT_URL, url);
            curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, to);
            curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
            curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, fleet_discard);
            long code = 0;
            int good = curl_easy_perform(e) == CURLE_OK &&
                       curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &code) == CURLE_OK &&
                       code >= 200 && code < 300;
            fleet_up *u = &fl->ups[i];
            if (!good) fleet_mark_lost(fl, u);
            if (atomic_exchange(&u->healthy, good) != good)
                al_log_warn(COMP, "upstream %s is %s", fl->px->up_public[i],
                            good ? "healthy again" : "unhealthy (its health check failed)");
            al_gauge_set(u->g_healthy, good);
        }
        pthread_mutex_lock(&fl->mu);
        al_gauge_set(fl->g_fleet, (double)fleet_min_version(fl));
        pthread_mutex_unlock(&fl->mu);
        fleet_nap(fl, fl->cf.health_ms);
    }
    curl_easy_cleanup(e);
    return NULL;
}

/* A follower of topic from its beginning; NULL with errstr. */
static al_follower *fleet_follower(struct px_fleet *fl, const char *topic, char *errstr,
                                   size_t errlen)
{
    al_follower_opts fo = {.topic = topic, .client = "arclight-proxy-fleet", .timeout_ms = 1000};
    return al_follower_new(fl->kc, &fo, errstr, errlen);
}

/* The per-upstream series and the fleet's own. */
static void fleet_metrics(struct px_fleet *fl)
{
    al_metrics *m = fl->px->metrics;
    for (size_t i = 0; i < fl->n; i++) {
        fleet_up *u = &fl->ups[i];
        const char *up = fl->px->up_public[i];
        u->c_req = al_metrics_counter(m, "arclight_proxy_upstream_requests_total",
                                      "calls that ended on each upstream", "upstream", up, NULL);
        u->c_err = al_metrics_counter(m, "arclight_proxy_upstream_errors_total",
                                      "calls of each upstream that failed (no answer or a 5xx)",
                                      "upstream", up, NULL);
        u->g_healthy = al_metrics_gauge(m, "arclight_proxy_upstream_healthy",
                                        "1 while the upstream's health check passes", "upstream",
                                        up, NULL);
        u->g_version = al_metrics_gauge(m, "arclight_proxy_upstream_policy_version",
                                        "the policy version the upstream serves (sync; -1 unknown)",
                                        "upstream", up, NULL);
        u->g_swapping = al_metrics_gauge(m, "arclight_proxy_upstream_swapping",
                                         "1 while sync says a swap of the upstream is under way",
                                         "upstream", up, NULL);
        al_gauge_set(u->g_healthy, 1);
        al_gauge_set(u->g_version, -1);
    }
    fl->c_refused = al_metrics_counter(m, "arclight_proxy_staleness_refused_total",
                                       "new rollouts' calls refused by --max-staleness", NULL);
    fl->c_disagree = al_metrics_counter(m, "arclight_proxy_version_disagreements_total",
                                        "spans whose upstream named another version than sync's "
                                        "records (sync's is kept)",
                                        NULL);
    fl->g_trainer = al_metrics_gauge(m, "arclight_proxy_trainer_version",
                                     "the trainer's newest policy version (-1 unknown)", NULL);
    fl->g_fleet = al_metrics_gauge(m, "arclight_proxy_fleet_version",
                                   "the oldest version a healthy upstream serves (-1 unknown)",
                                   NULL);
    al_gauge_set(fl->g_trainer, -1);
    al_gauge_set(fl->g_fleet, -1);
}

int px_fleet_start(proxy *px, const al_cli_common *common, char *errstr, size_t errlen)
{
    struct px_fleet *fl = calloc(1, sizeof *fl);
    if (!fl) {
        snprintf(errstr, errlen, "out of memory");
        return -1;
    }
    px->fleet = fl;
    fl->px = px;
    fl->cf = px->cfg.fleet;
    fl->n = px->cfg.n_upstreams;
    pthread_mutex_init(&fl->mu, NULL);
    atomic_init(&fl->trainer, -1);
    for (size_t i = 0; i < fl->n; i++) {
        fl->ups[i].version = -1;
        atomic_init(&fl->ups[i].healthy, 1);
    }
    fleet_metrics(fl);
    if (fl->cf.sync_topic || fl->cf.max_staleness >= 0) {
        if (!(fl->kc = al_kafka_conf_from_cli(common, errstr, errlen))) return -1;
        /* a swap's beginning must reach the tags soon: the embedded broker answers an empty
         * fetch only when this runs out (a real one at once), 500 ms by default */
        if (!al_kafka_conf_get(fl->kc, "fetch.wait.max.ms") &&
            al_kafka_conf_set(fl->kc, "fetch.wait.max.ms", "50") != 0) {
            snprintf(errstr, errlen, "out of memory");
            return -1;
        }
        if (fl->cf.sync_topic &&
            !(fl->f_sync = fleet_follower(fl, fl->cf.sync_topic, errstr, errlen)))
            return -1;
        if (fl->cf.max_staleness >= 0 &&
            !(fl->f_policy = fleet_follower(fl, fl->cf.policy_topic, errstr, errlen)))
            return -1;
        if (pthread_create(&fl->follow_th, NULL, fleet_follow_main, fl) != 0) {
            snprintf(errstr, errlen, "cannot start the fleet's follower thread");
            return -1;
        }
        fl->follow_started = 1;
    }
    if (fl->cf.health_ms > 0) {
        if (pthread_create(&fl->health_th, NULL, fleet_health_main, fl) != 0) {
            snprintf(errstr, errlen, "cannot start the health-check thread");
            return -1;
        }
        fl->health_started = 1;
    }
    return 0;
}

void px_fleet_stop(proxy *px)
{
    struct px_fleet *fl = px->fleet;
    if (!fl) return;
    atomic_store(&fl->stop, 1);
    if (fl->follow_started) pthread_join(fl->follow_th, NULL);
    if (fl->health_started) pthread_join(fl->health_th, NULL);
    al_follower_free(fl->f_sync);
    al_follower_free(fl->f_policy);
    al_kafka_conf_free(fl->kc);
    pthread_mutex_destroy(&fl->mu);
    free(fl);
    px->fleet = NULL;
}

int64_t px_fleet_version(proxy *px, int up, int64_t start_us, int64_t end_us, int64_t said)
{
    struct px_fleet *fl = px->fleet;
    if (!fl || !fl->f_sync || up < 0 || (size_t)up >= fl->n) return said;
    int64_t v = -1, v_began = 0;
    pthread_mutex_lock(&fl->mu);
    const fleet_up *u = &fl->ups[up];
    int known = u->nswaps > 0 || u->open_since;
    if (u->open_since && end_us > u->open_since) known = 2; /* a swap under way at the end */
    for (int j = 0; known == 1 && j < u->nswaps; j++) {
        const fleet_swap *s = &u->swaps[(u->first + j) % FLEET_SWAPS];
        if (s->started_us < end_us && s->finished_us > start_us) {
            v = -1; /* the call straddles this swap: either version may have answered */
            break;
        }
        if (s->finished_us <= start_us) v = s->version, v_began = s->started_us;
    }
    /* the replica was down after that swap and before the call ended: a restarted server
     * answers with the weights it started on until sync swaps it again */
    if (v >= 0 && u->lost_us && end_us > u->lost_us && v_began < u->lost_us) v = -1;
    pthread_mutex_unlock(&fl->mu);
    if (!known) return said; /* a replica sync does not manage: its own word */
    if (said >= 0 && v >= 0 && said != v) {
        al_counter_inc(fl->c_disagree);
        al_log_debug(COMP, "%s says version %" PRId64 ", sync %" PRId64 "; sync's is kept",
                     px->up_public[up], said, v);
    }
    return v;
}

int px_fleet_pick(proxy *px, const char *rollout, int after)
{
    struct px_fleet *fl = px->fleet;
    size_t n = px->cfg.n_upstreams;
    if (n <= 1) return 0;
    /* rank by the rendezvous score of (rollout, upstream); healthy ones before the others */
    uint64_t h = al_hash_str(rollout);
    int order[16];
    uint64_t score[16];
    for (size_t i = 0; i < n; i++) {
        uint64_t s = al_hash_mix(h ^ al_hash_str(px->cfg.upstreams[i]));
        int healthy = !fl || atomic_load(&fl->ups[i].healthy);
        score[i] = (s >> 1) | ((uint64_t)healthy << 63);
        size_t j = i;
        while (j > 0 && score[order[j - 1]] < score[i]) {
            order[j] = order[j - 1];
            j--;
        }
        order[j] = (int)i;
    }
    if (after < 0) return order[0];
    for (size_t j = 0; j < n; j++)
        if (order[j] == after) return order[(j + 1) % n];
    return order[0];
}

void px_fleet_count(proxy *px, int up, int ok, int conn_failed)
{
    struct px_fleet *fl = px->fleet;
    if (!fl || up < 0 || (size_t)up >= fl->n) return;
    fleet_up *u = &fl->ups[up];
    al_counter_inc(u->c_req);
    if (!ok) al_counter_inc(u->c_err);
    if (conn_failed) fleet_mark_lost(fl, u);
    if (conn_failed && fl->health_started && atomic_exchange(&u->healthy, 0)) {
        al_log_warn(COMP, "upstream %s is unhealthy (a call could not reach it)",
                    px->up_public[up]);
        al_gauge_set(u->g_healthy, 0);
    }
}

int px_fleet_admit(proxy *px, conn *c, const ident *id)
{
    struct px_fleet *fl = px->fleet;
    if (!fl || fl->cf.max_staleness < 0 || id->eval || !c->route->capture) return 0;
    int64_t trainer = atomic_load(&fl->trainer);
    if (trainer < 0) return 0;
    pthread_mutex_lock(&fl->mu);
    int64_t served = fleet_min_version(fl);
    pthread_mutex_unlock(&fl->mu);
    if (served < 0 || trainer - served <= fl->cf.max_staleness) return 0;
    if (!id->untracked) {
        char key[512];
        snprintf(key, sizeof key, "%s\x1f%s\x1f%d", id->task, id->rollout, id->attempt);
        if (al_map_find(&px->rtab, key)) return 0; /* a rollout already under way goes on */
    }
    al_counter_inc(fl->c_refused);
    char body[600];
    snprintf(body, sizeof body,
             "{\"error\":{\"message\":\"the policy servers are %" PRId64
             " versions behind the trainer (served %" PRId64 ", newest %" PRId64
             ", --max-staleness %" PRId64 "): new rollouts wait for arclight sync to catch "
             "them up\",\"type\":\"rate_limit_error\",\"param\":null,\"code\":\"policy_too_stale\"}}",
             trainer - served, served, trainer, fl->cf.max_staleness);
    px_conn_reply(c, 429, "application/json", "Retry-After: 2\r\n", body, strlen(body));
    return -1;
}
