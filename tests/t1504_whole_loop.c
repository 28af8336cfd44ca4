/*
 * t1504: the whole loop under faults, on real Apache Kafka (issue 16, item 4). proxy,
 * credit, batch, train and serve (the upstream, following arclight.policy) run as processes
 * on a one-node KRaft cluster; a load generator drives agents' multi-call rollouts through
 * the proxy (3 calls, a reward and an end each) while a chaos driver, from a seed it prints
 * (T1504_SEED=N repeats a run), kill -9s and restarts each stage (train with --resume) at
 * random moments, kills and restarts the broker, and stalls the upstream (SIGSTOP). Killing
 * serve is the upstream failing. Then the auditor (t1598_loop_audit.h) reads every topic and
 * checks what the agents saw: nothing lost, nothing duplicated after dedupe, every
 * transition in one trainer step, policy versions without gap or repeat, and serve answering
 * from the newest version.
 *
 * Built three times from this file: t1504_whole_loop (CI, label kafka, about 75 s of chaos),
 * with WL_EMBEDDED t1504_whole_loop_embedded (CI: the same chaos on the embedded broker, less
 * the broker kills, since it keeps nothing across one; issue 24: restarted consumer stages
 * have their partitions back within seconds there too), and,
 * with WL_SOAK, t1505_whole_loop_soak (label soak, left out of scripts/test.sh): no chaos,
 * $T1505_SOAK_S seconds (600) at a fixed rate, every stage's RSS sampled every 10 s; its
 * growth from the first minute's sample to the end must stay under WL_RSS_BOUND_MIB, and no
 * stage may log an ERROR.
 *
 * T1504_EXACTLY_ONCE=1 also requires no transition and no chunk twice before dedupe (for
 * credit and batch running with --exactly-once: add their flags with T1504_CREDIT_ARGS /
 * T1504_BATCH_ARGS; the proxy stays at least once, so spans may come twice).
 */
#define _GNU_SOURCE
#include "testlib.h"

#include "broker_fixture.h"
#include "support.h"
#include "t1099_proxy_helpers.h"
#include "t1598_loop_audit.h"

#include <pthread.h>
#include <stdatomic.h>

#if defined(WL_SOAK)
#define WL_NAME "t1505"
#elif defined(WL_EMBEDDED)
#define WL_NAME "t1504e"
#else
#define WL_NAME "t1504"
#endif
#define MAX_ROLL 20000
#define CALLS 3
#define STEP_GROUPS 4
#define WL_RSS_BOUND_MIB 48

static al_test_broker B;
static char TMP[512], MODEL[700], CKPT[700], SPOOL[700], PREFIX[40];
static int SERVE_PORT, PROXY_PORT;
static unsigned SEED;
static px_child P; /* the proxy's address, for px_post */

/* ---- the stages -------------------------------------------------------------------------- */

enum { ST_SERVE, ST_PROXY, ST_CREDIT, ST_BATCH, ST_TRAIN, ST_N };
static const char *const ST_NAME[ST_N] = {"serve", "proxy", "credit", "batch", "train"};

typedef struct stage {
    pid_t pid;
    int kills, starts;
    int stopped; /* SIGSTOPped */
} stage;

static stage S[ST_N];
static pthread_mutex_t st_mu = PTHREAD_MUTEX_INITIALIZER;

/* Extra flags from the environment (space-separated), appended to argv at n. */
static int add_env_args(const char **argv, int n, int max, const char *var)
{
    static char buf[ST_N][1024];
    static int used;
    const char *v = getenv(var);
    if (!v || !*v || used >= ST_N) return n;
    char *b = buf[used++];
    snprintf(b, sizeof buf[0], "%s", v);
    for (char *tok = strtok(b, " "); tok && n < max; tok = strtok(NULL, " ")) argv[n++] = tok;
    return n;
}

static void stage_argv(int i, const char **argv, char *ports, size_t plen)
{
    int n = 0;
    argv[n++] = al_test_bin();
    argv[n++] = ST_NAME[i];
    argv[n++] = "--bootstrap";
    argv[n++] = B.bootstrap;
    switch (i) {
    case ST_SERVE:
        snprintf(ports, plen, "127.0.0.1:%d", SERVE_PORT);
        argv[n++] = "--listen", argv[n++] = ports;
        argv[n++] = "--model", argv[n++] = MODEL;
        argv[n++] = "--served-model-name", argv[n++] = "tiny";
        argv[n++] = "--follow-policy";
        argv[n++] = "--checkpoint-root", argv[n++] = CKPT;
        argv[n++] = "--threads", argv[n++] = "1";
        break;
    case ST_PROXY: {
        static char up[64];
        snprintf(ports, plen, "127.0.0.1:%d", PROXY_PORT);
        snprintf(up, sizeof up, "http://127.0.0.1:%d", SERVE_PORT);
        argv[n++] = "--listen", argv[n++] = ports;
        argv[n++] = "--upstream", argv[n++] = up;
        argv[n++] = "--upstream-kind", argv[n++] = "arclight";
        argv[n++] = "--spool-dir", argv[n++] = SPOOL;
        argv[n++] = "--drain-timeout", argv[n++] = "5";
        argv[n++] = "--upstream-timeout", argv[n++] = "20";
        argv[n++] = "--connect-timeout-ms", argv[n++] = "1000";
        argv[n++] = "--no-access-log";
        break;
    }
    case ST_CREDIT:
        argv[n++] = "--estimator", argv[n++] = "none";
        argv[n++] = "--group-size", argv[n++] = "1";
        argv[n++] = "--idle-timeout", argv[n++] = "30";
        n = add_env_args(argv, n, 60, "T1504_CREDIT_ARGS");
        break;
    case ST_BATCH:
        argv[n++] = "--step-groups", argv[n++] = "4"; /* STEP_GROUPS */
        argv[n++] = "--max-staleness", argv[n++] = "-1";
        argv[n++] = "--group-idle-ms", argv[n++] = "200";
        n = add_env_args(argv, n, 60, "T1504_BATCH_ARGS");
        break;
    case ST_TRAIN:
        argv[n++] = "--model", argv[n++] = MODEL;
        argv[n++] = "--out", argv[n++] = CKPT;
        argv[n++] = "--model-name", argv[n++] = "tiny";
        argv[n++] = "--lr", argv[n++] = "0.001";
        argv[n++] = "--keep", argv[n++] = "0";
        argv[n++] = "--resume"; /* after kill -9: the newest full checkpoint; at first: none */
        break;
    }
    argv[n] = NULL;
}

/* Starts stage i, its stderr appended to TMP/NAME.log. Caller holds st_mu. */
static void stage_start(int i)
{
    const char *argv[64];
    char ports[64], log[700];
    stage_argv(i, argv, ports, sizeof ports);
    snprintf(log, sizeof log, "%s/%s.log", TMP, ST_NAME[i]);
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0600);
        int nul = open("/dev/null", O_WRONLY);
        if (fd >= 0) dup2(fd, STDERR_FILENO);
        if (nul >= 0) dup2(nul, STDOUT_FILENO);
        setenv("TMPDIR", TMP, 1);
#ifdef WL_SOAK
        /* a small quarantine: the sanitizer's own 256 MiB would read as growth */
        setenv("ASAN_OPTIONS", "detect_leaks=1:abort_on_error=1:quarantine_size_mb=16", 1);
#endif
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    S[i].pid = pid;
    S[i].starts++;
    S[i].stopped = 0;
    al_test_broker_track(pid, 1);
}

static void stage_kill(int i)
{
    if (S[i].pid <= 0) return;
    kill(S[i].pid, SIGKILL);
    waitpid(S[i].pid, NULL, 0);
    al_test_broker_track(S[i].pid, 0);
    S[i].pid = 0;
    S[i].kills++;
}

/* A stage that exited on its own (not killed by the chaos driver): its name, else NULL. */
static const char *stage_died(int *status)
{
    for (int i = 0; i < ST_N; i++)
        if (S[i].pid > 0 && waitpid(S[i].pid, status, WNOHANG) == S[i].pid) {
            al_test_broker_track(S[i].pid, 0);
            S[i].pid = 0;
            return ST_NAME[i];
        }
    return NULL;
}

static int port_open(int port)
{
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, "127.0.0.1", &sin.sin_addr);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    int ok = fd >= 0 && connect(fd, (struct sockaddr *)&sin, sizeof sin) == 0;
    if (fd >= 0) close(fd);
    return ok;
}

static int wait_port(int port, double secs)
{
    double t0 = testlib_now();
    while (testlib_now() - t0 < secs) {
        if (port_open(port)) return 0;
        usleep(100000);
    }
    return -1;
}

static __attribute__((unused)) long rss_kib(pid_t pid)
{
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    long kib = -1;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "VmRSS:", 6)) kib = strtol(line + 6, NULL, 10);
    if (f) fclose(f);
    return kib;
}

static __attribute__((unused)) int log_count(const char *name, const char *re)
{
    char cmd[900];
    snprintf(cmd, sizeof cmd, "grep -cE '%s' '%s/%s.log'", re, TMP, name);
    FILE *f = popen(cmd, "r");
    int n = 0;
    if (!f || fscanf(f, "%d", &n) != 1) n = -1;
    if (f) pclose(f);
    return n;
}

static void log_tail(const char *name)
{
    char cmd[900];
    snprintf(cmd, sizeof cmd, "grep -v 'WARN  rdkafka' '%s/%s.log' | tail -15 >&2", TMP, name);
    if (system(cmd)) {
    }
}

/* ---- the load generator ------------------------------------------------------------------ */

static la_rollout *R; /* what the agents saw */
static atomic_int n_roll, stop_agents;
static atomic_long failed_calls, ok_calls, unreadable;
static int agent_pause_us = 100000;

/* The answer's "id" of a chat completion body into out ("" when none). The tiny random
 * model writes any token, "\u0000" too (hence JSON_ALLOW_NUL); should jansson still refuse
 * the body, the first "id" member (the answer's own comes first) is read as it stands. */
static void answer_id(const char *body, char *out, size_t n)
{
    out[0] = 0;
    json_t *j = json_loads(body, JSON_ALLOW_NUL, NULL);
    json_t *id = j ? json_object_get(j, "id") : NULL;
    if (json_is_string(id)) snprintf(out, n, "%s", json_string_value(id));
    json_decref(j);
    const char *p = j ? NULL : strstr(body, "\"id\":");
    if (p) {
        p += 5;
        p += strspn(p, " ");
    }
    if (p && *p++ == '"') {
        size_t len = strcspn(p, "\"\\");
        if (p[len] == '"' && len < n) snprintf(out, n, "%.*s", (int)len, p);
    }
}

/* One rollout: CALLS chat calls (each sending the conversation so far), a reward, an end
 * (failed when a call failed). Records what the agent saw in R[r]. 1 when completed. */
static int rollout(int r)
{
    la_rollout *x = &R[r];
    snprintf(x->task, sizeof x->task, "%.40s%d", PREFIX, r);
    snprintf(x->rollout, sizeof x->rollout, "%.40s%d", PREFIX, r);
    char path[256], body[2048], convo[1400] = "";
    int ok = 1;
    for (int c = 0; c < CALLS; c++) {
        char turn[160];
        snprintf(turn, sizeof turn, "%s{\"role\":\"user\",\"content\":\"rollout %d call %d\"}",
                 c ? "," : "", r, c);
        strncat(convo, turn, sizeof convo - strlen(convo) - 1);
        snprintf(body, sizeof body,
                 "{\"model\":\"tiny\",\"max_tokens\":4,\"messages\":[%s]}", convo);
        snprintf(path, sizeof path, "/r/%s/%s/v1/chat/completions", x->task, x->rollout);
        px_resp resp;
        x->calls++;
        if (px_post(&P, path, body, &resp) == 0 && resp.status == 200) {
            answer_id(resp.body, x->resp_id[x->ok], sizeof x->resp_id[0]);
            if (x->resp_id[x->ok][0]) {
                x->ok++;
                atomic_fetch_add(&ok_calls, 1);
            } else {
                ok = 0; /* a 200 without an id: not what serve answers */
                atomic_fetch_add(&unreadable, 1);
            }
            px_resp_free(&resp);
        } else {
            if (resp.body) px_resp_free(&resp);
            atomic_fetch_add(&failed_calls, 1);
            ok = 0;
            break;
        }
    }
    px_resp a = {0};
    snprintf(path, sizeof path, "/r/%s/%s/reward", x->task, x->rollout);
    if (ok) {
        snprintf(body, sizeof body, "{\"value\": %d}", r % 2);
        ok = px_post(&P, path, body, &a) == 0 && a.status == 200;
        if (a.body) px_resp_free(&a);
    }
    snprintf(path, sizeof path, "/r/%s/%s/end", x->task, x->rollout);
    int end_ok = px_post(&P, path,
                         ok ? "{\"status\": \"succeeded\", \"group_size\": 1}"
                            : "{\"status\": \"failed\", \"group_size\": 1}",
                         &a) == 0 &&
                 a.status == 200;
    if (a.body) px_resp_free(&a);
    x->completed = ok && end_ok;
    return x->completed;
}

static void *agent(void *arg)
{
    (void)arg;
    while (!atomic_load(&stop_agents)) {
        int r = atomic_fetch_add(&n_roll, 1);
        if (r >= MAX_ROLL) break;
        rollout(r);
        usleep((useconds_t)agent_pause_us);
    }
    return NULL;
}

/* ---- setup ------------------------------------------------------------------------------- */

static int any_failed;

#ifndef WL_EMBEDDED
__attribute__((constructor)) static void use_real_kafka(void)
{
    setenv("ARCLIGHT_TEST_BROKER", "kafka", 1);
}
#endif

TEST(setup)
{
    (void)px_spans_of, (void)px_file_contains, (void)px_start, (void)px_stop;
    curl_global_init(CURL_GLOBAL_DEFAULT);
    R = calloc(MAX_ROLL, sizeof *R);
    REQUIRE(R);
    const char *s = getenv("T1504_SEED");
    SEED = s && *s ? (unsigned)strtoul(s, NULL, 10) : (unsigned)time(NULL) ^ (unsigned)getpid();
    printf("  seed %u (T1504_SEED=%u repeats this run's chaos)\n", SEED, SEED);
    snprintf(PREFIX, sizeof PREFIX, "%s-%u-", WL_NAME, SEED);
    const char *extra[] = {"--brokers", "1", NULL};
    REQUIRE(al_test_broker_start(&B, extra) == 0);
    if (B.kafka)
        printf("  Kafka up in %.1f s at %s\n", al_test_broker_cluster.start_s, B.bootstrap);
    else
        printf("  the embedded broker at %s\n", B.bootstrap);
    al_test_tmpdir(TMP, sizeof TMP, "proxy");
    REQUIRE(TMP[0]);
    snprintf(MODEL, sizeof MODEL, "%s/tiny", TMP);
    snprintf(CKPT, sizeof CKPT, "%s/ckpt", TMP);
    snprintf(SPOOL, sizeof SPOOL, "%s/spool", TMP);
    char cmd[2400];
    snprintf(cmd, sizeof cmd,
             "'%s' model init --config tests/model/tiny-qwen2.json --out '%s' --seed 3 "
             ">/dev/null && cp tests/tokenizer/tiny/tokenizer.json "
             "tests/tokenizer/tiny/tokenizer_config.json '%s/' && mkdir -p '%s'",
             al_test_bin(), MODEL, MODEL, CKPT);
    REQUIRE(system(cmd) == 0);
    SERVE_PORT = al_test_free_port();
    PROXY_PORT = al_test_free_port();
    REQUIRE(SERVE_PORT > 0 && PROXY_PORT > 0 && SERVE_PORT != PROXY_PORT);
    P.port = PROXY_PORT;
    snprintf(P.base, sizeof P.base, "http://127.0.0.1:%d", PROXY_PORT);
    pthread_mutex_lock(&st_mu);
    for (int i = 0; i < ST_N; i++) stage_start(i);
    pthread_mutex_unlock(&st_mu);
    REQUIREF(wait_port(SERVE_PORT, 120) == 0, "serve does not listen");
    REQUIREF(wait_port(PROXY_PORT, 60) == 0, "the proxy does not listen");
}

/* ---- the chaos driver -------------------------------------------------------------------- */

enum { CH_KILL_SERVE, CH_KILL_PROXY, CH_KILL_CREDIT, CH_KILL_BATCH, CH_KILL_TRAIN, CH_STALL,
       CH_BROKER, CH_N };
static const char *const CH_NAME[CH_N] = {"kill -9 serve (upstream fails)", "kill -9 proxy",
                                          "kill -9 credit", "kill -9 batch",
                                          "kill -9 train", "upstream stalls (SIGSTOP serve)",
                                          "kill -9 the broker"};
static int kills, outages, stalls;

static double urand(unsigned *st, double lo, double hi)
{
    return lo + (hi - lo) * ((double)rand_r(st) / RAND_MAX);
}

/* One fault: what it does, then the stage (or broker) back. */
static void chaos_one(int what, unsigned *st)
{
    double t0 = testlib_now();
    al_test_kafka *k = &al_test_broker_cluster;
    if (what <= CH_KILL_TRAIN) {
        int i = what; /* CH_KILL_x == ST_x */
        pthread_mutex_lock(&st_mu);
        stage_kill(i);
        pthread_mutex_unlock(&st_mu);
        kills++;
        usleep((useconds_t)(urand(st, 0.2, 2.0) * 1e6));
        pthread_mutex_lock(&st_mu);
        stage_start(i);
        pthread_mutex_unlock(&st_mu);
    } else if (what == CH_STALL) {
        kill(S[ST_SERVE].pid, SIGSTOP);
        usleep((useconds_t)(urand(st, 1.0, 4.0) * 1e6));
        kill(S[ST_SERVE].pid, SIGCONT);
        stalls++;
    } else {
        al_test_kafka_kill(k, 0);
        usleep((useconds_t)(urand(st, 1.0, 4.0) * 1e6));
        int rc = al_test_kafka_restart(k, 0, 120);
        CHECKF(rc == 0, "the broker did not come back");
        outages++;
    }
    printf("  %6.1f s  %s (%.1f s)\n", testlib_now() - t0, CH_NAME[what], testlib_now() - t0);
}

/* Faults for secs seconds, 2-5 s apart: first each kind once in a seeded order, then at
 * random (the broker at most max_broker times: a JVM start is the slowest thing here). */
static __attribute__((unused)) void chaos(double secs, int max_broker)
{
    unsigned st = SEED;
    int order[CH_N];
    for (int i = 0; i < CH_N; i++) order[i] = i;
    for (int i = CH_N - 1; i > 0; i--) {
        int j = rand_r(&st) % (i + 1), t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
    double t0 = testlib_now();
    int n = 0, broker = 0;
    while (testlib_now() - t0 < secs) {
        usleep((useconds_t)(urand(&st, 2.0, 5.0) * 1e6));
        int what = n < CH_N ? order[n] : rand_r(&st) % CH_N;
        if (what == CH_BROKER && broker >= max_broker) what = rand_r(&st) % CH_BROKER;
        if (what == CH_BROKER) broker++;
        printf("  at %5.1f s:", testlib_now() - t0);
        chaos_one(what, &st);
        n++;
        int status;
        const char *gone = stage_died(&status);
        if (gone) {
            CHECKF(0, "%s exited on its own (status %d) during the faults", gone, status);
            log_tail(gone);
            any_failed = 1;
            pthread_mutex_lock(&st_mu);
            for (int i = 0; i < ST_N; i++)
                if (S[i].pid <= 0) stage_start(i);
            pthread_mutex_unlock(&st_mu);
        }
    }
}

/* ---- the end: drain, top up to whole steps, audit --------------------------------------- */

/* The policy version serve answers from (its JSON's "policy_version"), -1 when no answer. */
static long serve_version(void)
{
    char url[128];
    px_resp r;
    snprintf(url, sizeof url, "http://127.0.0.1:%d/v1/chat/completions", SERVE_PORT);
    if (px_http("POST", url, PX_JSON,
                "{\"model\":\"tiny\",\"max_tokens\":1,\"messages\":[{\"role\":\"user\","
                "\"content\":\"version?\"}]}",
                &r) != 0)
        return -1;
    long v = -1;
    json_t *j = r.status == 200 ? json_loads(r.body, 0, NULL) : NULL;
    json_t *pv = j ? json_object_get(j, "policy_version") : NULL;
    if (json_is_integer(pv)) v = (long)json_integer_value(pv);
    json_decref(j);
    px_resp_free(&r);
    return v;
}

/* Audits until everything is where it belongs or secs pass: each round reads every topic;
 * when only a last step is short of whole groups, top-up rollouts fill it. Returns the last
 * audit; *served: the version serve answers from. */
static void settle(double secs, la_result *res, long *served, int *topups)
{
    double t0 = testlib_now();
    int stable = 0;
    long last_pending = -1;
    *served = -1;
    for (;;) {
        int n = atomic_load(&n_roll);
        if (n > MAX_ROLL) n = MAX_ROLL;
        if (la_audit(B.bootstrap, PREFIX, "tiny", R, n, res) == 0) {
            *served = serve_version();
            int done = la_lost(res) == 0 && res->pending == 0 &&
                       res->max_version == res->steps && *served == res->max_version;
            if (done || testlib_now() - t0 > secs) return;
            /* a last step short of whole groups stays open: fill it once nothing moves */
            stable = res->pending == last_pending ? stable + 1 : 0;
            last_pending = res->pending;
            if (stable >= 2 && res->pending_groups > 0 && res->pending_groups < STEP_GROUPS &&
                res->lost_calls == 0) {
                int want = STEP_GROUPS - (int)res->pending_groups;
                for (int k = 0; k < want && testlib_now() - t0 < secs;) {
                    int r = atomic_fetch_add(&n_roll, 1);
                    if (r >= MAX_ROLL) return;
                    k += rollout(r);
                    (*topups)++;
                }
                stable = 0;
            }
        } else if (testlib_now() - t0 > secs) {
            return;
        }
        sleep(3);
    }
}

static void report_and_check(la_result *res, long served, int topups, double settle_s)
{
    la_print(res, kills, outages, stdout);
    printf("  stalls %d, failed calls %ld, ok calls %ld, answers without an id %ld, top-up "
           "rollouts %d, serve answers from version %ld, settled in %.1f s\n",
           stalls, atomic_load(&failed_calls), atomic_load(&ok_calls), atomic_load(&unreadable),
           topups, served, settle_s);
    CHECKF(atomic_load(&unreadable) == 0, "%ld answers (200) without an id",
           atomic_load(&unreadable));
    const char *eo = getenv("T1504_EXACTLY_ONCE");
    int exactly_once = eo && *eo == '1';
    CHECKF(la_lost(res) == 0, "lost %ld (%s)", la_lost(res), res->first_problem);
    CHECKF(la_dup_after(res) == 0, "duplicated after dedupe %ld (%s)", la_dup_after(res),
           res->first_problem);
    /* --exactly-once is credit's and batch's: what they write reaches the next stage once.
     * The proxy stays at least once (a proxy killed with kill -9 publishes again what its
     * spool held unacknowledged; credit drops those copies by sequence number), so copies of
     * spans are allowed here, copies of transitions and chunks are not. */
    if (exactly_once)
        CHECKF(res->dup_transitions == 0 && res->dup_chunks == 0,
               "exactly-once: %ld transitions and %ld chunks twice before dedupe",
               res->dup_transitions, res->dup_chunks);
    CHECKF(res->pending == 0, "%ld transitions (%ld groups) in no trainer step", res->pending,
           res->pending_groups);
    CHECKF(res->completed > 0 && res->steps > 0, "no rollout completed or no step trained");
    CHECKF(res->max_version == res->steps, "newest policy version %" PRId64 ", %ld steps",
           res->max_version, res->steps);
    CHECKF(served == res->max_version, "serve answers from version %ld, newest %" PRId64, served,
           res->max_version);
    if (la_lost(res) || la_dup_after(res) || res->pending) any_failed = 1;
}

static void count_msg(const rd_kafka_message_t *m, void *ud)
{
    (void)m;
    (*(int *)ud)++;
}

/* The auditor reads read_committed to each partition's end. A partition whose last offsets
 * are an aborted transaction and its marker sends the reader no message at its end (what
 * --exactly-once leaves after an outage); the reader stopped short of it until its timeout
 * (a whole-loop run with --exactly-once failed so: "partitions not read to their end"). */
TEST(audit_reads_to_the_end_past_an_aborted_transaction)
{
    if (!B.kafka) return; /* the embedded broker does not simulate transaction aborts */
    char err[512], topic[64];
    snprintf(topic, sizeof topic, "%saborted-tail", PREFIX);
    char cmd[128], reply[256];
    snprintf(cmd, sizeof cmd, "create %s 1 1", topic);
    REQUIRE(al_test_broker_control(&B, cmd, reply, sizeof reply) == 0);
    rd_kafka_conf_t *c = rd_kafka_conf_new();
    rd_kafka_conf_set(c, "bootstrap.servers", B.bootstrap, err, sizeof err);
    rd_kafka_conf_set(c, "transactional.id", topic, err, sizeof err);
    rd_kafka_conf_set(c, "log_level", "0", err, sizeof err);
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_PRODUCER, c, err, sizeof err);
    REQUIRE(rk);
    rd_kafka_error_t *e = rd_kafka_init_transactions(rk, 30000);
    REQUIRE(!e);
    for (int abort = 0; abort < 2; abort++) {
        REQUIRE(!(e = rd_kafka_begin_transaction(rk)));
        REQUIRE(rd_kafka_producev(rk, RD_KAFKA_V_TOPIC(topic), RD_KAFKA_V_PARTITION(0),
                                  RD_KAFKA_V_VALUE("v", 1), RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
                                  RD_KAFKA_V_END) == 0);
        /* on the broker before the abort (an abort purges what is still queued) */
        CHECK_EQ_INT(rd_kafka_flush(rk, 30000), 0);
        e = abort ? rd_kafka_abort_transaction(rk, 30000) : rd_kafka_commit_transaction(rk, 30000);
        CHECKF(!e, "%s: %s", abort ? "abort" : "commit", e ? rd_kafka_error_string(e) : "");
        if (e) rd_kafka_error_destroy(e);
    }
    rd_kafka_destroy(rk);
    /* a commit or an abort returns before the coordinator has written its markers: wait
     * until the last-stable offset is past both (message, marker, message, marker) */
    c = rd_kafka_conf_new();
    rd_kafka_conf_set(c, "bootstrap.servers", B.bootstrap, err, sizeof err);
    rd_kafka_conf_set(c, "isolation.level", "read_committed", err, sizeof err);
    rd_kafka_conf_set(c, "log_level", "0", err, sizeof err);
    rk = rd_kafka_new(RD_KAFKA_CONSUMER, c, err, sizeof err);
    REQUIRE(rk);
    int64_t lo = 0, lso = 0;
    double tw = testlib_now();
    while (lso < 4 && testlib_now() - tw < 20) {
        if (rd_kafka_query_watermark_offsets(rk, topic, 0, &lo, &lso, 5000)) lso = 0;
        if (lso < 4) usleep(100000);
    }
    rd_kafka_destroy(rk);
    REQUIRE(lso == 4);
    int n = 0;
    double t0 = testlib_now();
    CHECK_EQ_INT(la_read_topic(B.bootstrap, topic, 20, count_msg, &n), 0);
    CHECK_EQ_INT(n, 1); /* the committed one */
    CHECKF(testlib_now() - t0 < 15, "read took %.1f s", testlib_now() - t0);
}

#ifndef WL_SOAK
TEST(whole_loop_under_faults_loses_nothing)
{
    const char *cs = getenv("T1504_CHAOS_S");
    double chaos_s = cs && *cs ? atof(cs) : 75;
    pthread_t th[6];
    agent_pause_us = 100000;
    for (int i = 0; i < 6; i++) REQUIRE(pthread_create(&th[i], NULL, agent, NULL) == 0);
    chaos(chaos_s, B.kafka ? 2 : 0); /* the embedded broker keeps nothing across a kill */
    /* every stage up, the agents a few seconds more on a quiet loop, then stop */
    pthread_mutex_lock(&st_mu);
    for (int i = 0; i < ST_N; i++)
        if (S[i].pid <= 0) stage_start(i);
    pthread_mutex_unlock(&st_mu);
    sleep(3);
    atomic_store(&stop_agents, 1);
    for (int i = 0; i < 6; i++) pthread_join(th[i], NULL);
    CHECKF(atomic_load(&ok_calls) > 0, "no call succeeded");
    double t0 = testlib_now();
    la_result res;
    long served;
    int topups = 0;
    settle(150, &res, &served, &topups);
    report_and_check(&res, served, topups, testlib_now() - t0);
    int status;
    const char *gone = stage_died(&status);
    CHECKF(!gone, "%s exited on its own (status %d)", gone ? gone : "", status);
    if (gone) log_tail(gone), any_failed = 1;
    printf("  kills: serve %d, proxy %d, credit %d, batch %d, train %d; broker restarts %d\n",
           S[ST_SERVE].kills, S[ST_PROXY].kills, S[ST_CREDIT].kills, S[ST_BATCH].kills,
           S[ST_TRAIN].kills, outages);
}
#else
TEST(soak_fixed_rate_rss_bounded)
{
    const char *ss = getenv("T1505_SOAK_S");
    double soak_s = ss && *ss ? atof(ss) : 600;
    pthread_t th[4];
    agent_pause_us = 250000; /* 4 agents: about 12 calls a second */
    double t0 = testlib_now();
    for (int i = 0; i < 4; i++) REQUIRE(pthread_create(&th[i], NULL, agent, NULL) == 0);
    char csv[700];
    snprintf(csv, sizeof csv, "%s/rss.csv", TMP);
    FILE *f = fopen(csv, "w");
    REQUIRE(f);
    fprintf(f, "t_s,serve_kib,proxy_kib,credit_kib,batch_kib,train_kib,calls\n");
    long first[ST_N] = {0}, last[ST_N] = {0}, peak[ST_N] = {0};
    int died = 0;
    while (testlib_now() - t0 < soak_s && !died) {
        sleep(10);
        double t = testlib_now() - t0;
        fprintf(f, "%.0f", t);
        for (int i = 0; i < ST_N; i++) {
            long kib = rss_kib(S[i].pid);
            fprintf(f, ",%ld", kib);
            if (t >= 60 && !first[i]) first[i] = kib;
            last[i] = kib;
            if (kib > peak[i]) peak[i] = kib;
        }
        fprintf(f, ",%ld\n", atomic_load(&ok_calls));
        fflush(f);
        int status;
        const char *gone = stage_died(&status);
        if (gone) {
            CHECKF(0, "%s exited (status %d) during the soak", gone, status);
            log_tail(gone);
            died = 1;
        }
    }
    fclose(f);
    atomic_store(&stop_agents, 1);
    for (int i = 0; i < 4; i++) pthread_join(th[i], NULL);
    double ran = testlib_now() - t0;
    printf("  %.0f s at a fixed rate: %ld calls (%.1f/s), %ld failed\n", ran,
           atomic_load(&ok_calls), atomic_load(&ok_calls) / ran, atomic_load(&failed_calls));
    for (int i = 0; i < ST_N; i++) {
        long growth = last[i] - first[i];
        printf("  %-6s RSS at 60 s %ld KiB, at the end %ld KiB (growth %+ld KiB), peak %ld KiB\n",
               ST_NAME[i], first[i], last[i], growth, peak[i]);
        CHECKF(first[i] > 0 && growth <= WL_RSS_BOUND_MIB * 1024,
               "%s grew %ld KiB (bound %d MiB)", ST_NAME[i], growth, WL_RSS_BOUND_MIB);
        int errors = log_count(ST_NAME[i], " ERROR ");
        CHECKF(errors == 0, "%s logged %d ERROR lines", ST_NAME[i], errors);
        if (errors) log_tail(ST_NAME[i]);
    }
    CHECK_EQ_INT(atomic_load(&failed_calls), 0);
    la_result res;
    long served;
    int topups = 0;
    double t1 = testlib_now();
    settle(180, &res, &served, &topups);
    report_and_check(&res, served, topups, testlib_now() - t1);
    CHECKF(la_dup_before(&res) == 0, "%ld duplicates before dedupe without a fault",
           la_dup_before(&res));
    printf("  RSS samples in %s\n", csv);
}
#endif

TEST(zz_teardown)
{
    pthread_mutex_lock(&st_mu);
    /* in the order arclight up stops them: the agents' side first */
    const int order[ST_N] = {ST_PROXY, ST_CREDIT, ST_BATCH, ST_TRAIN, ST_SERVE};
    for (int k = 0; k < ST_N; k++) {
        int i = order[k];
        if (S[i].pid <= 0) continue;
        kill(S[i].pid, SIGTERM);
        int st = 0;
        double t0 = testlib_now();
        while (waitpid(S[i].pid, &st, WNOHANG) != S[i].pid && testlib_now() - t0 < 40)
            usleep(50000);
        if (testlib_now() - t0 >= 40) {
            kill(S[i].pid, SIGKILL);
            waitpid(S[i].pid, &st, 0);
        }
        al_test_broker_track(S[i].pid, 0);
        S[i].pid = 0;
        CHECKF(WIFEXITED(st) && WEXITSTATUS(st) == 0, "%s: exit status %d on SIGTERM",
               ST_NAME[i], st);
        if (!(WIFEXITED(st) && WEXITSTATUS(st) == 0)) log_tail(ST_NAME[i]), any_failed = 1;
    }
    pthread_mutex_unlock(&st_mu);
    CHECK_EQ_INT(al_test_broker_stop(&B), 0);
    free(R);
    if (any_failed || testlib_cur_failed || getenv("T1504_KEEP")) {
        printf("  logs kept in %s\n", TMP);
        return;
    }
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", TMP);
    CHECK(system(cmd) == 0);
}
