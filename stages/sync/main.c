/*
 * arclight sync: brings a fleet of serving replicas (SGLang, vLLM or arclight serve) to each
 * new policy version the trainer publishes, and records what it did.
 *
 * Delivery contract. sync follows arclight.policy (kafka/follower.h: every partition from its
 * beginning, no consumer group, nothing committed): a restart reads the topic again and starts
 * from the newest PolicyVersion of --model-name, so nothing is lost by a crash. Until the topic is
 * read to the end it had at start, nothing is applied (an old version is never pushed first).
 * Versions only go up: a PolicyVersion not newer than the newest seen is ignored, and a replica
 * is only ever moved to the newest version, never back (one that was down skips the versions
 * it missed and goes straight to the newest). At start each replica is asked which version it
 * serves (a decimal weight_version), so a restarted sync does not reload what is loaded; and
 * every --check-every seconds the replicas it believes up to date are asked again, so that one
 * restarted on older weights (or reloaded by someone else) is brought back to the target.
 *
 * Per replica: the update runs with its back end's routes (replica.c), the replicas that are
 * behind all at once (a thread each; the next round starts when the slowest is done); a
 * failure (the replica
 * down, a refused load: the replica keeps its old weights) is retried after --retry-min-ms,
 * doubling up to --retry-max-ms, until it succeeds or a newer version replaces the target.
 *
 * The record (--sync-topic, default arclight.sync; key: the replica's URL), one JSON object per
 * attempt, so that the proxy can learn which version each replica serves and since when:
 *   {"model", "replica": URL, "kind": "sglang"|"vllm"|"arclight", "version": N,
 *    "checkpoint_uri", "path": the directory handed to the replica, "ok": true|false,
 *    "error": null|reason, "attempt": 1.., "started_us", "finished_us" (wall clock, µs)}
 * With "ok": true the replica serves version N from finished_us on (requests that began before
 * started_us ran on the older weights; between the two, either). Before each attempt starts, a
 * record of its beginning ("ok" and "finished_us" null) is sent and waited for, so that a
 * reader never believes the old version served a call that ended after the swap began.
 *
 * Metrics (--metrics): arclight_sync_target_version, and per replica (label replica=URL)
 * arclight_sync_replica_version (-1: unknown) and arclight_sync_updates_total{result=ok|failed};
 * /healthz is always ok (a replica that fails is retried, not a failure of sync).
 *
 * Checkpoint URIs: file:///DIR/ (the trainer without --listen) name the directory; replicas
 * read it from a shared filesystem, at the same path or as --path-map FROM=TO rewrites its
 * prefix. http:// URIs (the trainer's --listen) are refused with that reason: SGLang's and
 * vLLM's disk loads take a path; unless --stage-dir DIR is given: sync then copies each such
 * version into DIR/step-N (fetch.c; a volume it shares with the replicas) and hands them that.
 */
#include "sync.h"

#include "avro/codec.h"
#include "core/cli.h"
#include "core/flags.h"
#include "core/log.h"
#include "core/util.h"
#include "kafka/follower.h"
#include "kafka/kafka.h"
#include "kafka/stage.h"
#include "http/metrics.h"
#include "http/server.h"

#include <inttypes.h>
#include <jansson.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { SYNC_MAX_REPLICAS = 64 };

typedef struct sync_replicas {
    sync_replica r[SYNC_MAX_REPLICAS];
    size_t n; /* all given, also past the maximum (a usage error after parsing) */
    char err[512];
} sync_replicas;

typedef struct sync_opts {
    al_cli_common common;
    const char *topic, *sync_topic, *model, *path_map, *stage_dir;
    double timeout_s, check_every_s;
    int64_t retry_min_ms, retry_max_ms;
    int64_t stage_max_bytes; /* --stage-max-bytes; 0: from each version's config.json */
    sync_replicas reps;
    char map_from[PATH_MAX], map_to[PATH_MAX];
} sync_opts;

/* The newest version to bring every replica to. */
typedef struct sync_target {
    int64_t version; /* -1: none yet */
    char uri[PATH_MAX + 64];
    char dir[PATH_MAX];
    char sha256[65];
    int staging;           /* an http:// version still to copy into --stage-dir */
    int stage_fails;
    int64_t stage_next_us; /* al_mono_us() of the next try */
} sync_target;

/* --replica KIND=URL: one more replica (AL_FLAG_FUNC). */
static int replica_add(void *dest, const char *value, char *err, size_t errlen)
{
    sync_replicas *rs = dest;
    if (rs->n < SYNC_MAX_REPLICAS &&
        sync_replica_parse(&rs->r[rs->n], value, err, errlen) != 0)
        return -1;
    rs->n++;
    return 0;
}

/* Parses argv into o. -1: go on; otherwise the exit code. */
static int sync_parse(sync_opts *o, int argc, char **argv)
{
    memset(o, 0, sizeof *o);
    al_cli_common_init(&o->common);
    o->topic = "arclight.policy", o->sync_topic = "arclight.sync";
    o->timeout_s = 600, o->check_every_s = 10, o->retry_min_ms = 500, o->retry_max_ms = 30000;
    const al_flag flags[] = {
        {"replica", 0, AL_FLAG_FUNC, &o->reps, .arg = "KIND=URL", .parse = replica_add,
         .help = "a serving replica (repeat): sglang=http://h:p, vllm=http://h:p\n"
                 "(VLLM_SERVER_DEV_MODE=1, disk weight transfer) or\n"
                 "arclight=http://h:p (arclight serve --weight-routes)"},
        {"model-name", 0, AL_FLAG_STRING, &o->model, .arg = "NAME",
         .help = "the model whose PolicyVersions to follow (the trainer's\n--model-name)"},
        {"policy-topic", 0, AL_FLAG_STRING, &o->topic, .arg = "TOPIC",
         .help = "default arclight.policy"},
        {"sync-topic", 0, AL_FLAG_STRING, &o->sync_topic, .arg = "TOPIC",
         .help = "where each update is recorded (default arclight.sync)"},
        {"path-map", 0, AL_FLAG_STRING, &o->path_map, .arg = "FROM=TO",
         .help = "a checkpoint directory under FROM is under TO on the\nreplicas"},
        {"stage-dir", 0, AL_FLAG_STRING, &o->stage_dir, .arg = "DIR",
         .help = "copy versions with http:// URIs (the trainer's --listen) into\n"
                 "DIR/step-N first: a volume sync and the replicas share\n"
                 "(--path-map applies to it)"},
        {"stage-max-bytes", 0, AL_FLAG_I64, &o->stage_max_bytes, .lo = 1, .hi = 1LL << 50,
         .arg = "N",
         .help = "the most bytes one staged version may take (default: its\n"
                 "config.json's weights as f32, plus 256 MiB for the rest); a\n"
                 "larger one is refused"},
        {"request-timeout", 0, AL_FLAG_DOUBLE, &o->timeout_s, .dlo = 0.1, .dhi = 86400,
         .arg = "S", .help = "each HTTP call to a replica (default 600: a load is slow)"},
        {"check-every", 0, AL_FLAG_DOUBLE, &o->check_every_s, .dlo = 0.1, .dhi = 86400,
         .arg = "S", .help = "ask each replica up to date which version it serves every S\n"
                             "seconds (default 10): one restarted on older weights is\n"
                             "brought back"},
        {"retry-min-ms", 0, AL_FLAG_I64, &o->retry_min_ms, .lo = 1, .hi = 3600000, .arg = "MS",
         .help = "first wait after a failed update (default 500), doubled\nafter each failure"},
        {"retry-max-ms", 0, AL_FLAG_I64, &o->retry_max_ms, .lo = 1, .hi = 86400000, .arg = "MS",
         .help = "the longest wait between tries (default 30000)"},
    };
    const al_cmd_spec spec = {
        "sync", "--model-name NAME --replica KIND=URL [--replica ...] [flags]",
        "Follows arclight.policy and brings every serving replica (SGLang, vLLM or arclight\n"
        "serve) to each new policy version with its own weight-update routes; records each\n"
        "update on arclight.sync.\n",
        flags, AL_ARRAY_LEN(flags), .common = 1};
    int first;
    int rc = al_flags_parse(&spec, &o->common, argc, argv, &first);
    if (rc != AL_FLAGS_GO) return rc;
    if (first < argc) return al_cli_usage_error("sync", "unexpected argument '%s'", argv[first]);
    if (!o->model) return al_cli_usage_error("sync", "--model-name NAME is required");
    if (o->reps.n == 0) return al_cli_usage_error("sync", "give at least one --replica KIND=URL");
    if (o->reps.n > SYNC_MAX_REPLICAS)
        return al_cli_usage_error("sync", "at most %d --replica flags", SYNC_MAX_REPLICAS);
    if (o->retry_max_ms < o->retry_min_ms)
        return al_cli_usage_error("sync", "--retry-max-ms is below --retry-min-ms");
    if (o->path_map) {
        const char *eq = strchr(o->path_map, '=');
        if (!eq || eq == o->path_map || o->path_map[0] != '/' || eq[1] != '/' ||
            (size_t)(eq - o->path_map) >= sizeof o->map_from || strlen(eq + 1) >= sizeof o->map_to)
            return al_cli_usage_error("sync", "--path-map wants /FROM=/TO, got '%s'", o->path_map);
        memcpy(o->map_from, o->path_map, (size_t)(eq - o->path_map));
        snprintf(o->map_to, sizeof o->map_to, "%s", eq + 1);
    }
    return -1;
}

/* The directory a replica loads for checkpoint URI uri (file:// only), --path-map applied.
 * 0, or -1 with the reason. */
static int sync_dir_of(const sync_opts *o, const char *uri, char *dir, size_t dirlen, char *err,
                       size_t errlen)
{
    const char *p = NULL;
    if (!strncmp(uri, "file://localhost/", 17))
        p = uri + 16;
    else if (!strncmp(uri, "file:///", 8))
        p = uri + 7;
    if (!p)
        return al_err(err, errlen,
                      "checkpoint URI %.200s: replicas load from a path; run the trainer "
                      "without --listen (file:// URIs) on a filesystem they share, or give "
                      "--stage-dir", uri);
    for (const char *c = p; *c; c++)
        if ((unsigned char)*c < 0x20 || *c == '?' || *c == '#')
            return al_err(err, errlen, "checkpoint URI %.200s: not a plain path", uri);
    char path[PATH_MAX];
    size_t n = strlen(p);
    while (n > 1 && p[n - 1] == '/') n--;
    if (n >= sizeof path) return al_err(err, errlen, "checkpoint URI too long");
    memcpy(path, p, n);
    path[n] = '\0';
    size_t fl = strlen(o->map_from);
    if (fl && !strncmp(path, o->map_from, fl) && (path[fl] == '/' || path[fl] == '\0')) {
        if (snprintf(dir, dirlen, "%s%s", o->map_to, path + fl) >= (int)dirlen)
            return al_err(err, errlen, "mapped path too long");
    } else {
        snprintf(dir, dirlen, "%s", path);
    }
    return 0;
}

/* Sends one record of an attempt (see the top of this file): its beginning when t1 is 0 ("ok"
 * and "finished_us" null), else its outcome. */
static void sync_record(al_producer *p, const sync_opts *o, const sync_replica *r,
                        const sync_target *t, const char *error, int64_t t0, int64_t t1)
{
    json_t *ok = t1 ? json_boolean(error == NULL) : json_null();
    json_t *fin = t1 ? json_integer((json_int_t)t1) : json_null();
    int attempt = t1 && error ? r->attempts : r->attempts + 1;
    if (!t1) attempt = (r->failed_for == t->version ? r->attempts : 0) + 1;
    json_t *j = json_pack("{s:s,s:s,s:s,s:I,s:s,s:s,s:o,s:o,s:i,s:I,s:o}", "model", o->model,
                          "replica", r->url, "kind", sync_kind_name(r->kind), "version",
                          (json_int_t)t->version, "checkpoint_uri", t->uri, "path", t->dir, "ok",
                          ok, "error", error ? json_string(error) : json_null(), "attempt",
                          attempt, "started_us", (json_int_t)t0, "finished_us", fin);
    char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    if (!s) return;
    rd_kafka_resp_err_t e =
        al_producer_send(p, o->sync_topic, r->url, strlen(r->url), s, strlen(s), NULL, NULL);
    if (e) al_log_warn(COMP, "cannot record on %s: %s", o->sync_topic, rd_kafka_err2str(e));
    free(s);
}

/* One replica's update in a round: run on a thread of its own (HTTP only, nothing shared). */
typedef struct sync_job {
    const sync_replica *r;
    const sync_target *t;
    double timeout_s;
    int rc;
    char err[1024];
    int64_t t0, t1; /* wall clock, µs */
    pthread_t th;
    int threaded;
} sync_job;

static void *sync_job_main(void *arg)
{
    sync_job *j = arg;
    j->t0 = al_now_us();
    j->rc = sync_replica_apply(j->r, j->t->dir, j->t->version, j->timeout_s, j->err, sizeof j->err);
    j->t1 = al_now_us();
    return NULL;
}

/* What an update came to: records the attempt, and after a failure sets when to try again. */
static void sync_job_done(al_producer *p, const sync_opts *o, sync_replica *r, const sync_job *j)
{
    const sync_target *t = j->t;
    if (r->failed_for != t->version) r->failed_for = t->version, r->attempts = 0;
    if (j->rc == 0) {
        sync_record(p, o, r, t, NULL, j->t0, j->t1);
        al_log_info(COMP, "%s %s now serves version %" PRId64 " (%.0f ms)",
                    sync_kind_name(r->kind), r->url, t->version, (j->t1 - j->t0) / 1e3);
        r->version = t->version, r->failed_for = -1, r->attempts = 0;
        if (r->c_ok) al_counter_inc(r->c_ok);
        return;
    }
    r->attempts++;
    if (r->c_failed) al_counter_inc(r->c_failed);
    sync_record(p, o, r, t, j->err, j->t0, j->t1);
    int64_t wait = o->retry_min_ms;
    for (int i = 1; i < r->attempts && wait < o->retry_max_ms; i++) wait *= 2;
    if (wait > o->retry_max_ms) wait = o->retry_max_ms;
    r->next_try_us = al_mono_us() + wait * 1000;
    al_log_warn(COMP, "%s %s: version %" PRId64 " not applied (attempt %d, next in %" PRId64
                      " ms): %s", sync_kind_name(r->kind), r->url, t->version, r->attempts, wait,
                j->err);
}

/* Updates every replica that is behind the target and due, all at once (a thread each; the
 * round ends when the slowest is done), then records each. */
static void sync_round(al_producer *p, const sync_opts *o, sync_replica *reps, size_t n,
                       const sync_target *t)
{
    sync_job *jobs = calloc(n, sizeof *jobs);
    if (!jobs) return;
    int64_t now = al_mono_us(), begun = 0;
    /* each attempt's beginning is on the broker before it starts: the proxy tags no call that
     * ends after it with the old version (docs/SERVING.md) */
    for (size_t i = 0; i < n; i++) {
        if (reps[i].version >= t->version || now < reps[i].next_try_us) continue;
        sync_record(p, o, &reps[i], t, NULL, al_now_us(), 0);
        begun++;
    }
    char err[512];
    if (begun && al_producer_flush(p, 5000, err, sizeof err) != 0)
        al_log_warn(COMP, "the attempts' beginnings are not on %s yet: %s", o->sync_topic, err);
    for (size_t i = 0; i < n; i++) {
        if (reps[i].version >= t->version || now < reps[i].next_try_us) continue;
        jobs[i] = (sync_job){.r = &reps[i], .t = t, .timeout_s = o->timeout_s};
        jobs[i].threaded = pthread_create(&jobs[i].th, NULL, sync_job_main, &jobs[i]) == 0;
        if (!jobs[i].threaded) sync_job_main(&jobs[i]);
    }
    for (size_t i = 0; i < n; i++) {
        if (!jobs[i].r) continue;
        if (jobs[i].threaded) pthread_join(jobs[i].th, NULL);
        sync_job_done(p, o, &reps[i], &jobs[i]);
    }
    free(jobs);
}

/* One record of the policy topic: a newer PolicyVersion of --model-name becomes the target. */
static void sync_on_policy(const sync_opts *o, rd_kafka_message_t *m, sync_target *t)
{
    al_policy_version pv = {0};
    char err[512];
    if (!m->payload || al_policy_version_decode(m->payload, m->len, &pv, err, sizeof err) != 0) {
        if (m->payload) al_log_warn(COMP, "%s: a record that is no PolicyVersion: %s", o->topic, err);
        return;
    }
    if (!strcmp(pv.model, o->model) && pv.version > t->version) {
        char dir[PATH_MAX];
        int http = !strncmp(pv.checkpoint_uri, "http://", 7) || !strncmp(pv.checkpoint_uri, "https://", 8);
        if (http && o->stage_dir) {
            t->version = pv.version, t->staging = 1, t->stage_fails = 0, t->stage_next_us = 0;
            snprintf(t->uri, sizeof t->uri, "%s", pv.checkpoint_uri);
            snprintf(t->sha256, sizeof t->sha256, "%s", pv.sha256);
            t->dir[0] = '\0';
        } else if (sync_dir_of(o, pv.checkpoint_uri, dir, sizeof dir, err, sizeof err) != 0) {
            al_log_warn(COMP, "version %" PRId64 " skipped: %s", pv.version, err);
        } else {
            t->version = pv.version, t->staging = 0;
            snprintf(t->uri, sizeof t->uri, "%s", pv.checkpoint_uri);
            snprintf(t->dir, sizeof t->dir, "%s", dir);
        }
    }
    al_policy_version_clear(&pv);
}

/* Asks each replica what it serves (those that do not answer stay unknown: -1). */
static void sync_probe_all(sync_opts *o)
{
    for (size_t i = 0; i < o->reps.n; i++) {
        sync_replica *r = &o->reps.r[i];
        char err[512];
        if (sync_replica_probe(r, 5, &r->version, err, sizeof err) != 0) {
            al_log_warn(COMP, "%s %s does not answer yet: %s", sync_kind_name(r->kind), r->url, err);
            r->version = -1;
        }
    }
}

/* --stage-dir: copies the target's directory from the trainer's checkpoint server when it is
 * due; 1 once it is there (t->dir set, --path-map applied), 0 while it is not (retried after
 * 1 s, doubling up to --retry-max-ms). */
static int sync_stage(const sync_opts *o, sync_target *t)
{
    if (al_mono_us() < t->stage_next_us) return 0;
    char staged[PATH_MAX], uri[PATH_MAX + 64], err[1024];
    if (sync_stage_fetch(t->uri, t->sha256, o->stage_dir, t->version, 3,
                         (uint64_t)o->stage_max_bytes, o->timeout_s, staged,
                         sizeof staged, err, sizeof err) != 0) {
        int64_t wait = 1000;
        for (int i = 0; i < t->stage_fails && wait < o->retry_max_ms; i++) wait *= 2;
        if (wait > o->retry_max_ms) wait = o->retry_max_ms;
        t->stage_fails++;
        t->stage_next_us = al_mono_us() + wait * 1000;
        al_log_warn(COMP, "version %" PRId64 " not staged (next try in %" PRId64 " ms): %s",
                    t->version, wait, err);
        return 0;
    }
    snprintf(uri, sizeof uri, "file://%s/", staged);
    if (sync_dir_of(o, uri, t->dir, sizeof t->dir, err, sizeof err) != 0) {
        al_log_warn(COMP, "version %" PRId64 ": %s", t->version, err);
        t->stage_next_us = al_mono_us() + (int64_t)o->retry_max_ms * 1000;
        return 0;
    }
    al_log_info(COMP, "version %" PRId64 " staged in %s", t->version, staged);
    t->staging = 0;
    return 1;
}

/* Asks the replicas sync believes up to date which version they serve; one that answers with
 * another version is behind again (the next turn brings it to the target). */
static void sync_check(sync_opts *o, int64_t target)
{
    for (size_t i = 0; i < o->reps.n; i++) {
        sync_replica *r = &o->reps.r[i];
        int64_t v = -1;
        char err[512];
        if (r->version < target || sync_replica_probe(r, 5, &v, err, sizeof err) != 0) continue;
        if (v != r->version) {
            al_log_warn(COMP, "%s %s serves version %" PRId64 ", not %" PRId64
                              " (restarted?): bringing it back", sync_kind_name(r->kind), r->url,
                        v, r->version);
            r->version = v;
        }
    }
}

/* The metrics of each replica, in reg. */
static void sync_metrics_init(sync_opts *o, al_metrics *reg)
{
    for (size_t i = 0; i < o->reps.n; i++) {
        sync_replica *r = &o->reps.r[i];
        r->g_version = al_metrics_gauge(reg, "arclight_sync_replica_version",
                                        "Policy version each replica serves (-1: unknown)",
                                        "replica", r->url, NULL);
        r->c_ok = al_metrics_counter(reg, "arclight_sync_updates_total",
                                     "Updates tried, by replica and result", "replica", r->url,
                                     "result", "ok", NULL);
        r->c_failed = al_metrics_counter(reg, "arclight_sync_updates_total",
                                         "Updates tried, by replica and result", "replica",
                                         r->url, "result", "failed", NULL);
    }
}

/* The loop: follow, then bring the replicas that are behind to the target. Returns the exit
 * code. */
static int sync_run(sync_opts *o, al_follower *f, al_producer *p, al_gauge *g_target)
{
    sync_target t = {.version = -1};
    int assigned = 0, said_ready = 0;
    int64_t next_assign = 0, next_check = al_mono_us();
    while (!al_stage_stop_requested()) {
        char err[512];
        if (!assigned && al_mono_us() >= next_assign) {
            if (al_follower_assign(f, err, sizeof err) == 0) {
                assigned = 1;
            } else {
                al_log_warn(COMP, "following %s: %s (trying again)", o->topic, err);
                next_assign = al_mono_us() + 1000000;
            }
        }
        rd_kafka_message_t *m = NULL;
        int got = assigned ? al_follower_next(f, 100, &m) : (usleep(100000), 0);
        if (got == 1) {
            sync_on_policy(o, m, &t);
        } else if (got < 0) {
            if (al_kafka_error_classify(m->err) == AL_KAFKA_ERRCLASS_FATAL) {
                al_log_error(COMP, "%s: %s", o->topic, rd_kafka_message_errstr(m));
                rd_kafka_message_destroy(m);
                return AL_EXIT_FAILURE;
            }
        }
        if (m) rd_kafka_message_destroy(m);
        al_producer_poll(p, 0);
        if (g_target) al_gauge_set(g_target, (double)t.version);
        for (size_t i = 0; i < o->reps.n; i++)
            if (o->reps.r[i].g_version) al_gauge_set(o->reps.r[i].g_version, (double)o->reps.r[i].version);
        if (!assigned || !al_follower_caught_up(f)) continue;
        if (!said_ready) {
            said_ready = 1;
            al_log_info(COMP, "%s read to its end: newest version of %s is %" PRId64, o->topic,
                        o->model, t.version);
        }
        if (t.version < 0 || (t.staging && !sync_stage(o, &t))) continue;
        if (al_mono_us() >= next_check) {
            sync_check(o, t.version);
            next_check = al_mono_us() + (int64_t)(o->check_every_s * 1e6);
        }
        sync_round(p, o, o->reps.r, o->reps.n, &t);
    }
    return AL_EXIT_OK;
}

int cmd_sync(int argc, char **argv)
{
    sync_opts *o = calloc(1, sizeof *o);
    if (!o) return AL_EXIT_FAILURE;
    int rc = sync_parse(o, argc, argv);
    if (rc >= 0) {
        free(o);
        return rc;
    }
    char err[1024];
    al_kafka_conf *kc = al_kafka_conf_from_cli(&o->common, err, sizeof err);
    al_follower_opts fo = {.topic = o->topic, .client = "arclight-sync", .timeout_ms = 1000};
    al_follower *f = kc ? al_follower_new(kc, &fo, err, sizeof err) : NULL;
    al_producer *p = f ? al_producer_new(kc, err, sizeof err) : NULL;
    al_metrics *reg = al_metrics_new();
    al_http_server *srv = NULL;
    rc = AL_EXIT_FAILURE;
    if (!reg) snprintf(err, sizeof err, "out of memory");
    int up = p && reg &&
             (!o->common.metrics ||
              (srv = al_http_server_start(o->common.metrics, reg, NULL, NULL, err, sizeof err)));
    if (!up) {
        al_log_error(COMP, "%s", err);
    } else {
        sync_metrics_init(o, reg);
        al_gauge *g_target = al_metrics_gauge(reg, "arclight_sync_target_version",
                                              "Newest policy version of --model-name seen", NULL);
        al_stage_catch_signals();
        const char *outs[] = {o->sync_topic, NULL};
        if (al_producer_prepare(p, outs, 5000, err, sizeof err) != 0)
            al_log_warn(COMP, "%s (records wait for it)", err);
        sync_probe_all(o);
        al_log_info(COMP, "following %s for %s, %zu replica(s), recording on %s", o->topic,
                    o->model, o->reps.n, o->sync_topic);
        rc = sync_run(o, f, p, g_target);
        if (al_producer_flush(p, 5000, err, sizeof err) != 0) al_log_warn(COMP, "%s", err);
    }
    al_producer_free_within(p, 1000);
    al_http_server_stop(srv);
    al_metrics_free(reg);
    al_follower_free(f);
    al_kafka_conf_free(kc);
    free(o);
    return rc;
}
