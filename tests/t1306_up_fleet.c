/*
 * t1306: `arclight up --serve-replicas 2 --weight-sync vllm`: two `arclight serve
 * --weight-routes` replicas behind the proxy (--upstream-kind vllm), brought to each policy
 * version by `arclight sync`, not by --follow-policy. A short run (4 versions, no warm start) on
 * a broker the test owns, with one replica killed (SIGKILL) once both serve version 1:
 *   - each replica's /weight_info reports a trained version, also the restarted one (sync
 *     caught it up), and arclight.sync holds every replica's update to the last version;
 *   - every LlmCall span's policy_version is -1 or the version sync recorded as served by its
 *     replica over the whole call (no swap, no kill in between), and both replicas have spans
 *     tagged with trained versions;
 *   - the kill costs no rollout: up starts the replica again, the controller reports 0 failed.
 */
#include "t1349_up_common.h"
#include "testlib.h"
#include "support.h"

#include "avro/codec.h"

#include <jansson.h>
#include <stdint.h>
#include <sys/time.h>

#define NREP 2
#define NRECS 256
#define STEPS 4

/* One successful update sync recorded: the replica served version from finished_us on. */
typedef struct rec {
    int64_t version, started_us, finished_us;
} rec;

typedef struct replica {
    int port;
    char url[64];
    rec recs[NRECS];
    int n;
} replica;

static replica g_rep[NREP];

static int64_t wall_us(void)
{
    struct timeval tv;
    gettimeofday(&tv, NULL);
    return (int64_t)tv.tv_sec * 1000000 + tv.tv_usec;
}

/* The replica whose URL url is (the proxy may add a path), or -1. */
static int replica_of(const char *url)
{
    for (int i = 0; url && i < NREP; i++) {
        size_t l = strlen(g_rep[i].url);
        if (!strncmp(url, g_rep[i].url, l) && (!url[l] || url[l] == '/')) return i;
    }
    return -1;
}

/* The weight version replica port reports on /weight_info (vLLM's route), or -1. */
static long weight_info(int port)
{
    char buf[2048];
    if (al_test_http_get(port, "/weight_info", buf, sizeof buf) != 0) return -1;
    const char *p = strstr(buf, "\"weight_version\"");
    p = p ? strchr(p + 16, '"') : NULL;
    return p ? strtol(p + 1, NULL, 10) : -1;
}

/* Polls until replica port reports a version >= want (up to timeout_s). The version or -1. */
static long wait_weight_info(int port, long want, double timeout_s)
{
    long v = -1;
    for (double t = 0; t < timeout_s; t += 0.2) {
        if ((v = weight_info(port)) >= want) return v;
        usleep(200000);
    }
    return v;
}

/* Files arclight.sync's successful records per replica. Returns how many were read. */
static int read_sync_records(const char *bootstrap)
{
    al_test_msgs m;
    al_test_topic_read(bootstrap, "arclight.sync", NULL, SIZE_MAX, 3000, &m);
    int n = 0;
    for (size_t i = 0; i < m.n; i++) {
        json_t *o = json_loadb(m.val[i], m.len[i], 0, NULL);
        int r = replica_of(json_string_value(json_object_get(o, "replica")));
        json_t *fin = json_object_get(o, "finished_us");
        if (r >= 0 && json_is_true(json_object_get(o, "ok")) && json_is_integer(fin) &&
            g_rep[r].n < NRECS) {
            rec *x = &g_rep[r].recs[g_rep[r].n++];
            x->version = json_integer_value(json_object_get(o, "version"));
            x->started_us = json_integer_value(json_object_get(o, "started_us"));
            x->finished_us = json_integer_value(fin);
            n++;
        }
        json_decref(o);
    }
    al_test_msgs_free(&m);
    return n;
}

/* The version replica r served over a call from start_us to end_us, the replica's answer
 * beginning at answer_us, by sync's records (version 0, the start's, before any): -2 when it
 * is not one version (a swap overlaps the call, or the replica was killed at kill_us after its
 * last swap and before it answered: it came back on the start's weights). */
static int64_t served_version(int r, int64_t start_us, int64_t end_us, int64_t answer_us,
                              int kill_rep, int64_t kill_us)
{
    const replica *p = &g_rep[r];
    rec best = {0, 0, 0};
    for (int i = 0; i < p->n; i++)
        if (p->recs[i].finished_us <= start_us && p->recs[i].finished_us >= best.finished_us)
            best = p->recs[i];
    for (int i = 0; i < p->n; i++)
        if (p->recs[i].started_us > best.started_us && p->recs[i].started_us < end_us) return -2;
    if (r == kill_rep && kill_us > best.started_us && kill_us < answer_us) return -2;
    return best.version;
}

/* Checks every answered LlmCall span's version against sync's records. */
static void check_span_versions(const char *bootstrap, int kill_rep, int64_t kill_us)
{
    al_test_msgs m;
    al_test_topic_read(bootstrap, "arclight.spans", NULL, SIZE_MAX, 4000, &m);
    int calls = 0, unknown = 0, wrong = 0, trained[NREP] = {0};
    for (size_t i = 0; i < m.n; i++) {
        al_span s = {0};
        char err[256];
        if (al_span_decode(m.val[i], m.len[i], &s, err, sizeof err) != 0) continue;
        const al_llm_call *c = &s.llm_call;
        int r = s.kind == AL_SPAN_KIND_LLM_CALL ? replica_of(c->upstream) : -1;
        if (r >= 0 && c->http_status == 200) {
            calls++;
            int64_t answer = c->first_byte_us ? c->first_byte_us : c->end_us;
            int64_t want = served_version(r, c->start_us, c->end_us, answer, kill_rep, kill_us);
            if (c->policy_version < 0) {
                unknown++;
            } else if (c->policy_version != want) {
                if (wrong++ < 5)
                    fprintf(stderr, "span %s/%s on replica %d: version %" PRId64
                                    ", sync says %" PRId64 " (-2: unknown) over %" PRId64
                                    "..%" PRId64 "\n",
                            s.task_id, s.rollout_id, r, c->policy_version, want, c->start_us,
                            c->end_us);
            } else if (c->policy_version >= 1) {
                trained[r]++;
            }
        }
        al_span_clear(&s);
    }
    al_test_msgs_free(&m);
    fprintf(stderr, "%d calls: %d tagged with trained versions on replica 0, %d on 1; %d unknown\n",
            calls, trained[0], trained[1], unknown);
    CHECKF(calls >= 40, "only %d answered calls on the replicas", calls);
    CHECKF(wrong == 0, "%d spans carry a version their replica did not serve", wrong);
    for (int r = 0; r < NREP; r++)
        CHECKF(trained[r] > 0, "no span of replica %d carries a version learned from sync", r);
}

/* The port of replica i from up's stdout ("serve-I| 127.0.0.1:PORT"), or 0. */
static int replica_port(const char *out, int i)
{
    char pat[32];
    snprintf(pat, sizeof pat, "serve-%d| ", i);
    const char *p = strstr(out, pat);
    p = p ? strchr(p + strlen(pat), ':') : NULL;
    return p ? atoi(p + 1) : 0;
}

TEST(up_two_replicas_driven_by_sync_survive_a_kill)
{
    char dir[256], out[400], err[400], wd[400], needle[200], steps[16];
    REQUIRE(al_test_tmpdir(dir, sizeof dir, "t1306"));
    snprintf(out, sizeof out, "%s/up.out", dir);
    snprintf(err, sizeof err, "%s/up.err", dir);
    snprintf(wd, sizeof wd, "%s/work", dir);
    snprintf(steps, sizeof steps, "%d", STEPS);
    al_test_broker broker;
    REQUIRE(al_test_broker_start(&broker, NULL) == 0);

    double t0 = testlib_now();
    /* clang-format off */
    char *argv[] = {(char *)up_bin(), "up", "--workdir", wd, "--bootstrap", broker.bootstrap,
                    "--listen-serve", "127.0.0.1:0", "--listen-proxy", "127.0.0.1:0",
                    "--serve-replicas", "2", "--weight-sync", "vllm",
                    "--steps", steps, "--group-size", "4", "--step-groups", "2",
                    "--max-tokens", "8", "--warm-start", "", "--stop-timeout", "15",
                    "--rollouts-args", "--eval-tasks 4", NULL};
    /* clang-format on */
    pid_t up = up_start(argv, out, err);
    REQUIRE(up_wait_for_text(out, "up    | sync ", 120, up));
    char *o = al_test_slurp_text(out);
    for (int i = 0; i < NREP; i++) {
        g_rep[i].port = replica_port(o, i);
        snprintf(g_rep[i].url, sizeof g_rep[i].url, "http://127.0.0.1:%d", g_rep[i].port);
    }
    free(o);
    REQUIREF(g_rep[0].port > 0 && g_rep[1].port > 0, "replica ports %d %d", g_rep[0].port,
             g_rep[1].port);

    /* Both serve version 1 (the proxy learned it from sync): their routes say so too. */
    for (int i = 0; i < NREP; i++) {
        snprintf(needle, sizeof needle, "proxy: %s serves version 1 ", g_rep[i].url);
        REQUIREF(up_wait_for_text(err, needle, 150, up), "no '%s'", needle);
        long v = weight_info(g_rep[i].port);
        CHECKF(v >= 1, "replica %d reports weight version %ld", i, v);
    }

    /* Kill replica 1 mid-run: up starts it again on its port, sync brings it back. */
    char *e = al_test_slurp_text(err);
    pid_t victim = up_child_pid(e, "serve-1");
    free(e);
    REQUIRE(victim > 0);
    int64_t kill_us = wall_us();
    REQUIRE(kill(victim, SIGKILL) == 0);
    snprintf(needle, sizeof needle, "serve-1 (pid %d) was killed by signal 9", (int)victim);
    CHECKF(up_wait_for_text(err, needle, 30, up), "up did not notice the kill");
    CHECKF(up_wait_for_text(err, "starting it again", 5, up), "no restart announced");
    long back = wait_weight_info(g_rep[1].port, 1, 60);
    CHECKF(back >= 1, "the restarted replica reports weight version %ld", back);

    int st = up_wait(up, 240);
    o = al_test_slurp_text(out), e = al_test_slurp_text(err);
    CHECKF(st == 0, "up: wait status %d\n--- stdout\n%.3000s\n--- stderr\n%.6000s", st, o, e);
    fprintf(stderr, "up --steps %d with a replica killed took %.1f s\n", STEPS,
            testlib_now() - t0);
    CHECKF(up_count_lines(e, "up: started serve-1 (pid ") == 2, "serve-1 not started twice");
    CHECKF(strstr(e, " rollouts (0 failed, 0 timed out"), "rollouts failed:\n%.6000s", e);
    CHECKF(strstr(e, "up: all stopped; exit 0"), "%.3000s", e);
    CHECKF(!strstr(e, "follow-policy"), "a replica follows the policy itself");
    const char *names[] = {"serve-0", "serve-1", "sync", "proxy", "train", "rollouts"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        pid_t p = up_child_pid(e, names[i]);
        CHECKF(p > 0 && up_pid_gone(p), "%s (pid %d) not reported or still running", names[i],
               (int)p);
    }
    free(o), free(e);

    /* sync's records: each replica reached the last version, replica 1 again after the kill,
     * and a replica's versions never went back. */
    REQUIRE(read_sync_records(broker.bootstrap) > 0);
    for (int r = 0; r < NREP; r++) {
        int last = 0, after_kill = 0, back_in_time = 0;
        for (int i = 0; i < g_rep[r].n; i++) {
            const rec *x = &g_rep[r].recs[i];
            last |= x->version == STEPS;
            after_kill |= x->started_us > kill_us && x->version >= 1;
            back_in_time |= i && x->version < g_rep[r].recs[i - 1].version;
        }
        CHECKF(last, "replica %d: no sync record of version %d", r, STEPS);
        CHECKF(!back_in_time, "replica %d: sync moved it to an older version", r);
        if (r == 1) CHECKF(after_kill, "the restarted replica was not caught up by sync");
    }
    check_span_versions(broker.bootstrap, 1, kill_us);

    CHECK_EQ_INT(al_test_broker_stop(&broker), 0);
    if (!testlib_cur_failed && al_test_rmtree(dir) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
}
