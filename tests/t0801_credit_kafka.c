/* t0801: `arclight credit` against the embedded broker over TCP: many interleaved rollouts of
 * many tasks across partitions (every transition once, advantages as computed by hand),
 * malformed spans in the dead-letter topic with their reasons, a worker killed with SIGKILL
 * mid-stream, restarted, and joined by a second worker (every transition present exactly
 * once after dedupe by id, duplicates byte-identical), and determinism on a recording
 * replayed into a topic with another partition count. */
#include "testlib.h"

#include "broker_fixture.h"
#include "support.h"
#include "avro/codec.h"
#include "t0898_credit_stream.h"

#include <librdkafka/rdkafka.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>

static al_test_broker broker;
static char topics_path[160], tmpdir[100];

/* ---- Kafka helpers ---------------------------------------------------------------------- */

static int produce(const char *topic, const msg *m, size_t n)
{
    char err[512];
    rd_kafka_conf_t *c = rd_kafka_conf_new();
    rd_kafka_conf_set(c, "bootstrap.servers", broker.bootstrap, err, sizeof err);
    rd_kafka_conf_set(c, "linger.ms", "5", err, sizeof err);
    /* a retried batch must not land after the next one: the order within a partition is the
     * contract credit reads (an end before its calls makes the calls late dead letters) */
    rd_kafka_conf_set(c, "enable.idempotence", "true", err, sizeof err);
    rd_kafka_conf_set(c, "partitioner", "murmur2_random", err, sizeof err);
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_PRODUCER, c, err, sizeof err);
    if (!rk) return -1;
    int rc = 0;
    for (size_t i = 0; i < n && !rc; i++)
        if (rd_kafka_producev(rk, RD_KAFKA_V_TOPIC(topic),
                              RD_KAFKA_V_KEY(m[i].key, strlen(m[i].key)),
                              RD_KAFKA_V_VALUE(m[i].val, m[i].len),
                              RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_END))
            rc = -1;
    if (rd_kafka_flush(rk, 30000)) rc = -1;
    rd_kafka_destroy(rk);
    return rc;
}

typedef struct rec {
    char *key;
    uint8_t *val;
    size_t len;
    int64_t ts_ms; /* the message's timestamp */
} rec;

typedef struct recs {
    rec *r;
    size_t n, cap;
} recs;

static void recs_free(recs *s)
{
    for (size_t i = 0; i < s->n; i++) {
        free(s->r[i].key);
        free(s->r[i].val);
    }
    free(s->r);
    memset(s, 0, sizeof *s);
}

/* Every message of topic (all partitions, oldest to the current end), appended to out. */
static int read_topic(const char *topic, recs *out)
{
    char err[512];
    rd_kafka_conf_t *c = rd_kafka_conf_new();
    rd_kafka_conf_set(c, "bootstrap.servers", broker.bootstrap, err, sizeof err);
    rd_kafka_conf_set(c, "group.id", "t0801-reader", err, sizeof err);
    rd_kafka_conf_set(c, "enable.auto.commit", "false", err, sizeof err);
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_CONSUMER, c, err, sizeof err);
    if (!rk) return -1;
    rd_kafka_poll_set_consumer(rk);
    const rd_kafka_metadata_t *md;
    rd_kafka_topic_t *t = rd_kafka_topic_new(rk, topic, NULL);
    int rc = -1;
    if (rd_kafka_metadata(rk, 0, t, &md, 10000) == 0) {
        int np = md->topic_cnt ? md->topics[0].partition_cnt : 0;
        rd_kafka_metadata_destroy(md);
        rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(np);
        int64_t *hi = calloc((size_t)np + 1, sizeof *hi);
        int64_t remaining = 0;
        for (int p = 0; p < np; p++) {
            int64_t lo;
            rd_kafka_query_watermark_offsets(rk, topic, p, &lo, &hi[p], 10000);
            remaining += hi[p] - lo;
            rd_kafka_topic_partition_list_add(l, topic, p)->offset = RD_KAFKA_OFFSET_BEGINNING;
        }
        rd_kafka_assign(rk, l);
        rd_kafka_topic_partition_list_destroy(l);
        double t0 = testlib_now();
        while (remaining > 0 && testlib_now() - t0 < 30) {
            rd_kafka_message_t *m = rd_kafka_consumer_poll(rk, 200);
            if (!m) continue;
            if (!m->err && m->offset < hi[m->partition]) {
                if (out->n == out->cap) {
                    out->cap = out->cap ? out->cap * 2 : 256;
                    out->r = realloc(out->r, out->cap * sizeof *out->r);
                }
                rec *x = &out->r[out->n++];
                x->key = strndup(m->key ? (const char *)m->key : "", m->key_len);
                x->val = malloc(m->len ? m->len : 1);
                if (m->len) memcpy(x->val, m->payload, m->len);
                x->len = m->len;
                x->ts_ms = rd_kafka_message_timestamp(m, NULL);
                remaining--;
            }
            rd_kafka_message_destroy(m);
        }
        rc = remaining == 0 ? 0 : -1;
        free(hi);
    }
    rd_kafka_topic_destroy(t);
    rd_kafka_consumer_close(rk);
    rd_kafka_destroy(rk);
    return rc;
}

/* How often workers commit; the kill test commits rarely so that the restart re-reads a lot. */
static const char *commit_interval_ms = "200";

/* Starts `arclight credit` with the given extra args (NULL-terminated); output to log. */
static pid_t credit_start(const char *log, const char *const *extra)
{
    const char *argv[48];
    int argc = 0;
    argv[argc++] = al_test_bin();
    argv[argc++] = "credit";
    argv[argc++] = "--bootstrap";
    argv[argc++] = broker.bootstrap;
    argv[argc++] = "--log-level";
    argv[argc++] = "warn";
    for (int i = 0; extra[i] && argc < 46; i++)
        argv[argc++] = extra[i];
    argv[argc] = NULL;
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        FILE *f = freopen(log, "a", stderr);
        (void)f;
        setenv("ARCLIGHT_KAFKA_SESSION_TIMEOUT_MS", "6000", 1);
        setenv("ARCLIGHT_KAFKA_AUTO_COMMIT_INTERVAL_MS", commit_interval_ms, 1);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    return pid;
}

static int wait_exit(pid_t pid, int timeout_s)
{
    int st;
    for (int i = 0; i < timeout_s * 20; i++) {
        if (waitpid(pid, &st, WNOHANG) == pid) return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
        usleep(50000);
    }
    kill(pid, SIGKILL);
    waitpid(pid, &st, 0);
    return -2;
}

static void dump_log(const char *log)
{
    FILE *f = fopen(log, "r");
    char line[1024];
    if (!f) return;
    while (fgets(line, sizeof line, f))
        fprintf(stderr, "    | %s", line);
    fclose(f);
}

/* A free loopback port (bound and released; good enough for a test). */
static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    socklen_t len = sizeof a;
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) ||
        getsockname(fd, (struct sockaddr *)&a, &len)) {
        if (fd >= 0) close(fd);
        return -1;
    }
    close(fd);
    return ntohs(a.sin_port);
}

/* GET path from 127.0.0.1:port; the whole response (headers and body) in buf. */
/* ---- checking transitions ----------------------------------------------------------------- */

typedef struct seen {
    int count;
    uint8_t *val;
    size_t len;
    int mismatch;
} seen;

/* Dedupe by id: seen[] gets a count per expected id; returns the number of unexpected or
 * undecodable messages. Duplicates must be byte-identical. */
static int collect(const recs *tr, seen *s)
{
    al_transition t;
    memset(&t, 0, sizeof t);
    char err[256];
    int bad = 0;
    for (size_t i = 0; i < tr->n; i++) {
        if (al_transition_decode(tr->r[i].val, tr->r[i].len, &t, err, sizeof err)) {
            bad++;
            continue;
        }
        int k = expected_index(t.id);
        if (k < 0) {
            fprintf(stderr, "  unexpected transition %s\n", t.id);
            bad++;
            continue;
        }
        if (s[k].count++ == 0) {
            s[k].val = tr->r[i].val;
            s[k].len = tr->r[i].len;
        } else if (s[k].len != tr->r[i].len || memcmp(s[k].val, tr->r[i].val, s[k].len)) {
            s[k].mismatch = 1;
        }
    }
    al_transition_clear(&t);
    return bad;
}

/* ---- tests -------------------------------------------------------------------------------- */

static stream spans;

TEST(start_broker)
{
    snprintf(tmpdir, sizeof tmpdir, "/tmp/arclight-t0801-%d", (int)getpid());
    mkdir(tmpdir, 0700);
    snprintf(topics_path, sizeof topics_path, "%s/topics.conf", tmpdir);
    FILE *f = fopen(topics_path, "w");
    REQUIRE(f != NULL);
    fputs("t8.spans 4 1\nt8.tr 4 1\nt8.spans2 4 1\nt8.tr2 4 1\nt8.one 1 1\nt8.tr3 2 1\n"
          "t8.quiet 1 1\nt8.trq 1 1\nt8.outage 1 1\nt8.tro 1 1\n"
          "arclight.deadletter 2 1\n",
          f);
    fclose(f);
    const char *extra[] = {"--topics", topics_path, NULL};
    REQUIRE(al_test_broker_start(&broker, extra) == 0);
    build_stream(&spans, -1);
}

TEST(interleaved_rollouts_across_partitions_and_dead_letters)
{
    REQUIRE(broker.pid > 0);
    /* the stream plus three bad messages: bytes that are no Avro, a tombstone, and a call
     * without response token ids of an extra rollout */
    stream s = {0};
    for (size_t i = 0; i < spans.n; i++) {
        stream_add(&s, spans.m[i].key, spans.m[i].val, spans.m[i].len);
        if (i == 10) stream_add(&s, "task-03", "not avro at all", 15);
        if (i == 20) stream_add(&s, "task-05", NULL, 0);
    }
    al_span bad;
    memset(&bad, 0, sizeof bad);
    int32_t prompt[2] = {1, 2};
    bad.trace_id = "0123456789abcdef0123456789abcdef";
    bad.span_id = "0123456789abcdef";
    bad.task_id = "task-dl";
    bad.rollout_id = "dl-r";
    bad.kind = AL_SPAN_KIND_LLM_CALL;
    bad.llm_call.prompt_token_ids = prompt;
    bad.llm_call.n_prompt_tokens = 2;
    bad.llm_call.error = "upstream returned no token ids";
    al_buf b = {0};
    char err[256];
    REQUIRE(al_span_encode(&bad, &b, err, sizeof err) == 0);
    stream_add(&s, "task-dl", b.data, b.len);
    al_buf_free(&b);
    REQUIRE(produce("t8.spans", s.m, s.n) == 0);
    stream_free(&s);

    char log[256];
    snprintf(log, sizeof log, "%s/run1.log", tmpdir);
    int port = free_port();
    char maddr[64];
    snprintf(maddr, sizeof maddr, "127.0.0.1:%d", port);
    const char *args[] = {"--input",      "t8.spans", "--output",  "t8.tr", "--group", "g1",
                          "--group-size", "3",        "--metrics", maddr,   NULL};
    double t0 = testlib_now();
    int64_t started_ms = (int64_t)time(NULL) * 1000;
    pid_t w = credit_start(log, args);
    int ne = n_expected();
    recs tr = {0};
    while (testlib_now() - t0 < 60) {
        recs_free(&tr);
        if (read_topic("t8.tr", &tr) == 0 && (int)tr.n >= ne) break;
        usleep(200000);
    }
    /* what the worker counted, then a clean stop */
    static char text[65536];
    CHECK_EQ_INT(al_test_http_get(port, "/metrics", text, sizeof text), 0);
    usleep(300000); /* the transitions' counters are updated right after the produce */
    CHECK_EQ_INT(al_test_http_get(port, "/metrics", text, sizeof text), 0);
    CHECK_NEAR(al_test_metric(text, "arclight_credit_spans_total"), (double)spans.n + 3, 0);
    CHECK_NEAR(al_test_metric(text, "arclight_credit_transitions_total"), ne, 0);
    CHECK_NEAR(al_test_metric(text, "arclight_credit_deadletter_total{reason=\"undecodable\"}"), 2, 0);
    CHECK_NEAR(al_test_metric(text, "arclight_credit_deadletter_total{reason=\"no_token_ids\"}"), 1, 0);
    CHECK_NEAR(al_test_metric(text, "arclight_credit_rollouts_total{outcome=\"completed\"}"), N_ROLL, 0);
    CHECK_NEAR(al_test_metric(text, "arclight_credit_groups_total{outcome=\"completed\"}"), N_TASKS, 0);
    CHECK_NEAR(al_test_metric(text, "arclight_credit_open_rollouts"), 1, 0); /* dl-r never ends */
    CHECK(al_test_metric(text, "arclight_credit_reward_mean") >= 0);
    CHECK(al_test_http_get(port, "/healthz", text, sizeof text) == 0 && strstr(text, "\"ok\""));
    kill(w, SIGTERM);
    int st = wait_exit(w, 30);
    CHECKF(st == 0, "credit exited with %d", st);
    if (st != 0) dump_log(log);
    fprintf(stderr, "  (credit run: %.1f s)\n", testlib_now() - t0);

    seen *sn = calloc((size_t)ne, sizeof *sn);
    CHECK_EQ_INT(collect(&tr, sn), 0);
    int missing = 0, dup = 0;
    for (int i = 0; i < ne; i++) {
        if (sn[i].count == 0) missing++;
        if (sn[i].count > 1) dup++;
    }
    CHECKF(missing == 0 && dup == 0, "%d of %d transitions missing, %d duplicated", missing, ne,
           dup);
    CHECK_EQ_INT((int)tr.n, ne);
    /* stamped when produced, not with the spans' 2025 time: a topic's time retention deletes
     * by these (on real Kafka, 30 s after the broker started, all of them) */
    int old = 0;
    for (size_t i = 0; i < tr.n; i++)
        old += tr.r[i].ts_ms < started_ms - 60000;
    CHECKF(old == 0, "%d of %zu transitions are stamped before the run", old, tr.n);

    /* advantages: grpo over the 4 rollouts of each task (the end spans say 4, not 3) */
    al_transition t;
    memset(&t, 0, sizeof t);
    int wrong = 0;
    for (size_t i = 0; i < tr.n; i++) {
        if (al_transition_decode(tr.r[i].val, tr.r[i].len, &t, err, sizeof err)) continue;
        int r = atoi(t.rollout_id + 5), task = r / PER_TASK;
        double mean = 0, var = 0;
        for (int k = 0; k < PER_TASK; k++)
            mean += reward_of(task * PER_TASK + k) / PER_TASK;
        for (int k = 0; k < PER_TASK; k++)
            var +=
                (reward_of(task * PER_TASK + k) - mean) * (reward_of(task * PER_TASK + k) - mean);
        double want = (reward_of(r) - mean) / (sqrt(var / PER_TASK) + 1e-6);
        if (fabs(t.advantage - want) > 1e-9 || t.group_size != PER_TASK ||
            strcmp(tr.r[i].key, t.task_id) || t.reward != reward_of(r)) {
            if (wrong++ < 3)
                fprintf(stderr, "  %s: advantage %g (want %g), group size %d, key %s\n", t.id,
                        t.advantage, want, t.group_size, tr.r[i].key);
        }
    }
    CHECK_EQ_INT(wrong, 0);
    al_transition_clear(&t);
    free(sn);
    recs_free(&tr);

    /* the dead letters, with their reasons */
    recs dl = {0};
    REQUIRE(read_topic("arclight.deadletter", &dl) == 0);
    CHECK_EQ_INT((int)dl.n, 3);
    int undecodable = 0, tomb = 0, notok = 0;
    al_deadletter d;
    memset(&d, 0, sizeof d);
    for (size_t i = 0; i < dl.n; i++) {
        REQUIRE(al_deadletter_decode(dl.r[i].val, dl.r[i].len, &d, err, sizeof err) == 0);
        CHECK_EQ_STR(d.source_topic, "t8.spans");
        CHECK_EQ_STR(d.stage, "credit");
        if (strstr(d.reason, "undecodable span") && d.value && d.value_len == 15 &&
            !memcmp(d.value, "not avro at all", 15))
            undecodable++;
        else if (strstr(d.reason, "tombstone"))
            tomb++;
        else if (strstr(d.reason, "no response token ids") && strstr(d.reason, "dl-r") &&
                 strstr(d.reason, "upstream returned no token ids"))
            notok++;
        else
            fprintf(stderr, "  unexpected dead letter: %s\n", d.reason);
    }
    CHECK(undecodable == 1 && tomb == 1 && notok == 1);
    al_deadletter_clear(&d);
    recs_free(&dl);
}

TEST(determinism_on_a_replayed_recording)
{
    REQUIRE(broker.pid > 0);
    char path[256], cmd[4096], log[256];
    snprintf(path, sizeof path, "%s/spans.avro", tmpdir);
    snprintf(log, sizeof log, "%s/replay.log", tmpdir);
    /* record the spans, replay them into one partition, run credit there */
    snprintf(cmd, sizeof cmd,
             "'%s' record t8.spans -o '%s' --bootstrap %s --log-level warn 2>>%s && "
             "'%s' replay '%s' --topic-map t8.spans=t8.one --rate max --bootstrap %s "
             "--log-level warn >/dev/null 2>>%s",
             al_test_bin(), path, broker.bootstrap, log, al_test_bin(), path, broker.bootstrap,
             log);
    int st = system(cmd);
    CHECKF(st == 0, "record/replay failed (%d)", st);
    if (st) dump_log(log);
    const char *args[] = {"--input",      "t8.one", "--output",    "t8.tr3", "--group", "g3",
                          "--group-size", "3",      "--exit-idle", "2",      NULL};
    st = wait_exit(credit_start(log, args), 90);
    CHECKF(st == 0, "credit exited with %d", st);
    recs a = {0}, b = {0};
    REQUIRE(read_topic("t8.tr", &a) == 0);
    REQUIRE(read_topic("t8.tr3", &b) == 0);
    int ne = n_expected();
    seen *sa = calloc((size_t)ne, sizeof *sa), *sb = calloc((size_t)ne, sizeof *sb);
    CHECK_EQ_INT(collect(&a, sa), 0);
    CHECK_EQ_INT(collect(&b, sb), 0);
    int differ = 0;
    for (int i = 0; i < ne; i++)
        if (sa[i].count != 1 || sb[i].count != 1 || sa[i].len != sb[i].len ||
            memcmp(sa[i].val, sb[i].val, sa[i].len))
            differ++;
    CHECKF(differ == 0, "%d of %d transitions differ between 4 partitions and 1 replayed", differ,
           ne);
    free(sa);
    free(sb);
    recs_free(&a);
    recs_free(&b);
}

TEST(sigkill_restart_and_a_second_worker)
{
    REQUIRE(broker.pid > 0);
    char loga[256], logb[256];
    snprintf(loga, sizeof loga, "%s/kill-a.log", tmpdir);
    snprintf(logb, sizeof logb, "%s/kill-b.log", tmpdir);
    const char *args[] = {"--input", "t8.spans2",    "--output", "t8.tr2", "--group",
                          "g2",      "--group-size", "3",        NULL};
    size_t half = spans.n / 2, third = spans.n / 3;
    REQUIRE(produce("t8.spans2", spans.m, third) == 0);
    commit_interval_ms = "60000"; /* the kill lands before any commit */
    pid_t a = credit_start(loga, args);
    /* wait for its first transitions, then feed more and kill it mid-stream */
    double t0 = testlib_now();
    recs tr = {0};
    while (testlib_now() - t0 < 40) {
        recs_free(&tr);
        if (read_topic("t8.tr2", &tr) == 0 && tr.n > 0) break;
        usleep(200000);
    }
    CHECKF(tr.n > 0, "no transitions from the first worker");
    REQUIRE(produce("t8.spans2", spans.m + third, half - third) == 0);
    usleep(300000);
    kill(a, SIGKILL);
    waitpid(a, NULL, 0);
    REQUIRE(produce("t8.spans2", spans.m + half, spans.n - half) == 0);
    /* restart it, and a second worker joins */
    commit_interval_ms = "200";
    a = credit_start(loga, args);
    usleep(500000);
    pid_t b = credit_start(logb, args);
    int ne = n_expected(), missing = ne;
    seen *sn = NULL;
    t0 = testlib_now();
    while (testlib_now() - t0 < 60 && missing) {
        usleep(500000);
        recs_free(&tr);
        if (read_topic("t8.tr2", &tr) != 0) continue;
        free(sn);
        sn = calloc((size_t)ne, sizeof *sn);
        CHECK_EQ_INT(collect(&tr, sn), 0);
        missing = 0;
        for (int i = 0; i < ne; i++)
            missing += sn[i].count == 0;
    }
    int dups = 0, mismatched = 0;
    for (int i = 0; sn && i < ne; i++) {
        dups += sn[i].count > 1;
        mismatched += sn[i].mismatch;
    }
    fprintf(stderr, "  (%zu messages for %d transitions; %d ids duplicated; %.1f s)\n", tr.n, ne,
            dups, testlib_now() - t0);
    CHECKF(missing == 0, "%d of %d transitions missing after the restart", missing, ne);
    CHECKF(mismatched == 0, "%d duplicated ids with different content", mismatched);
    CHECKF(dups > 0, "the restart re-read nothing (the kill came after a commit?)");
    /* and the same bytes as the single worker's uninterrupted run of the same spans */
    recs one = {0};
    seen *so = calloc((size_t)ne, sizeof *so);
    int differ = 0;
    if (read_topic("t8.tr", &one) == 0 && collect(&one, so) == 0 && sn)
        for (int i = 0; i < ne; i++)
            differ += !so[i].count || !sn[i].count || so[i].len != sn[i].len ||
                      memcmp(so[i].val, sn[i].val, so[i].len) != 0;
    else
        differ = -1;
    CHECKF(differ == 0, "%d transitions differ from the uninterrupted run", differ);
    free(so);
    recs_free(&one);
    kill(a, SIGTERM);
    kill(b, SIGTERM);
    int sa = wait_exit(a, 30), sb = wait_exit(b, 30);
    CHECKF(sa == 0 && sb == 0, "workers exited with %d and %d", sa, sb);
    if (missing || mismatched || sa || sb) {
        dump_log(loga);
        dump_log(logb);
    }
    free(sn);
    recs_free(&tr);
}

TEST(quiet_partition_times_out_its_last_rollout)
{
    REQUIRE(broker.pid > 0);
    /* a rollout that never ends, alone on its topic: only the quiet flush (wall time) can
     * time it out; kept with reward 0.5 */
    stream one = {0};
    for (size_t i = 0; i < spans.n && one.n < 1; i++) {
        al_span sp;
        memset(&sp, 0, sizeof sp);
        char err[256];
        if (al_span_decode(spans.m[i].val, spans.m[i].len, &sp, err, sizeof err) == 0 &&
            sp.kind == AL_SPAN_KIND_LLM_CALL && sp.sequence == 0) {
            sp.task_id = "";
            al_buf b = {0};
            if (al_span_encode(&sp, &b, err, sizeof err) == 0)
                stream_add(&one, sp.rollout_id, b.data, b.len);
            al_buf_free(&b);
        }
        al_span_clear(&sp);
    }
    REQUIRE(one.n == 1);
    REQUIRE(produce("t8.quiet", one.m, 1) == 0);
    stream_free(&one);
    char log[256];
    snprintf(log, sizeof log, "%s/quiet.log", tmpdir);
    const char *args[] = {"--input",
                          "t8.quiet",
                          "--output",
                          "t8.trq",
                          "--group",
                          "gq",
                          "--idle-timeout",
                          "1",
                          "--quiet-flush",
                          "1",
                          "--on-timeout",
                          "keep",
                          "--timeout-reward",
                          "0.5",
                          "--estimator",
                          "none",
                          "--exit-idle",
                          "4",
                          NULL};
    int st = wait_exit(credit_start(log, args), 60);
    CHECKF(st == 0, "credit exited with %d", st);
    recs tr = {0};
    REQUIRE(read_topic("t8.trq", &tr) == 0);
    REQUIRE(tr.n == 1);
    al_transition t;
    memset(&t, 0, sizeof t);
    char err[256];
    REQUIRE(al_transition_decode(tr.r[0].val, tr.r[0].len, &t, err, sizeof err) == 0);
    CHECK_NEAR(t.reward, 0.5, 0);
    CHECK_NEAR(t.advantage, 0.5, 0);
    CHECK_EQ_INT(t.group_size, 1);
    al_transition_clear(&t);
    recs_free(&tr);
}

/* Wall time stands for span time only while Kafka answers. A rollout whose first call is
 * read, then a broker outage longer than --idle-timeout and --quiet-flush: the proxy's spool
 * holds the rest of the rollout meanwhile, so the outage must not time the rollout out (it
 * did: its end then came late and it trained nothing). After the broker is back the rest
 * arrives and the rollout trains whole. */
TEST(a_broker_outage_does_not_count_as_quiet)
{
    REQUIRE(broker.pid > 0);
    /* the first rollout of the stream, as a group of its own */
    stream one = {0};
    const char *rid = NULL;
    char ridbuf[64] = "";
    int ncalls = 0;
    for (size_t i = 0; i < spans.n; i++) {
        al_span sp;
        memset(&sp, 0, sizeof sp);
        char err[256];
        if (al_span_decode(spans.m[i].val, spans.m[i].len, &sp, err, sizeof err) == 0) {
            if (!rid) {
                snprintf(ridbuf, sizeof ridbuf, "%s", sp.rollout_id);
                rid = ridbuf;
            }
            if (!strcmp(sp.rollout_id, rid)) {
                sp.task_id = "";
                ncalls += sp.kind == AL_SPAN_KIND_LLM_CALL;
                al_buf b = {0};
                if (al_span_encode(&sp, &b, err, sizeof err) == 0)
                    stream_add(&one, sp.rollout_id, b.data, b.len);
                al_buf_free(&b);
            }
        }
        al_span_clear(&sp);
    }
    REQUIRE(one.n >= 3 && ncalls >= 1);
    REQUIRE(produce("t8.outage", one.m, 1) == 0); /* its first call */
    int port = free_port();
    REQUIRE(port > 0);
    char hostport[32], log[256];
    snprintf(hostport, sizeof hostport, "127.0.0.1:%d", port);
    snprintf(log, sizeof log, "%s/outage.log", tmpdir);
    const char *args[] = {"--input", "t8.outage", "--output", "t8.tro", "--group", "go",
                          "--idle-timeout", "2", "--quiet-flush", "2", "--estimator", "none",
                          "--metrics", hostport, NULL};
    pid_t pid = credit_start(log, args);
    REQUIRE(pid > 0);
    static char page[1 << 16];
    double t0 = testlib_now();
    int read = 0;
    while (!read && testlib_now() - t0 < 60) {
        usleep(200000);
        read = al_test_http_get(port, "/metrics", page, sizeof page) == 0 &&
               al_test_metric(page, "arclight_credit_spans_total") == 1;
    }
    REQUIRE(read);
    REQUIRE(al_test_broker_control(&broker, "down 1", NULL, 0) == 0);
    /* longer than the idle timeout and the quiet flush (2 s), shorter than the session
     * timeout (6 s), so that the group keeps the partition and re-reading it from the
     * committed offset cannot hide a wrong timeout */
    sleep(4);
    REQUIRE(al_test_broker_control(&broker, "up 1", NULL, 0) == 0);
    REQUIRE(produce("t8.outage", one.m + 1, one.n - 1) == 0); /* the rest, end included */
    recs tr = {0};
    t0 = testlib_now();
    while (testlib_now() - t0 < 60) {
        recs_free(&tr);
        memset(&tr, 0, sizeof tr);
        if (read_topic("t8.tro", &tr) == 0 && (int)tr.n >= ncalls) break;
        sleep(1);
    }
    CHECKF((int)tr.n == ncalls, "%zu transitions of rollout %s, want %d (one per call)", tr.n,
           rid, ncalls);
    CHECK(al_test_http_get(port, "/metrics", page, sizeof page) == 0);
    CHECK_EQ_INT(
        (int)al_test_metric(page, "arclight_credit_rollouts_total{outcome=\"timed_out\"}"), 0);
    CHECK_EQ_INT(
        (int)al_test_metric(page, "arclight_credit_rollouts_total{outcome=\"completed\"}"), 1);
    kill(pid, SIGTERM);
    int st = wait_exit(pid, 30);
    CHECKF(st == 0, "credit exited with %d", st);
    if (st != 0 || (int)tr.n != ncalls) dump_log(log);
    recs_free(&tr);
    stream_free(&one);
}

TEST(command_line)
{
    char cmd[1024], out[256];
    snprintf(out, sizeof out, "%s/cli.out", tmpdir);
    snprintf(cmd, sizeof cmd, "'%s' credit --help >%s 2>&1", al_test_bin(), out);
    CHECK_EQ_INT(WEXITSTATUS(system(cmd)), 0);
    snprintf(cmd, sizeof cmd, "'%s' credit --estimator ppo >%s 2>&1", al_test_bin(), out);
    CHECK_EQ_INT(WEXITSTATUS(system(cmd)), 2);
    FILE *f = fopen(out, "r");
    char line[512] = "";
    if (f) {
        if (!fgets(line, sizeof line, f)) line[0] = '\0';
        fclose(f);
    }
    CHECKF(strstr(line, "--estimator ppo") != NULL, "stderr: %s", line);
    snprintf(cmd, sizeof cmd, "'%s' credit --gamma 2 >%s 2>&1", al_test_bin(), out);
    CHECK_EQ_INT(WEXITSTATUS(system(cmd)), 2);
    snprintf(cmd, sizeof cmd, "'%s' credit --group-size 0 >%s 2>&1", al_test_bin(), out);
    CHECK_EQ_INT(WEXITSTATUS(system(cmd)), 2);
}

TEST(stop_broker)
{
    stream_free(&spans);
    CHECK_EQ_INT(al_test_broker_stop(&broker), 0);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    CHECK_EQ_INT(system(cmd), 0);
}
