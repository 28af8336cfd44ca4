/* t1506: exactly once (--exactly-once: lib/kafka/stage.h's transactions), on real Apache Kafka
 * only: librdkafka's mock cluster takes transactions but does not simulate their aborts, so
 * it cannot show what the mode is for. The first cases kill a worker with SIGKILL at a fault point
 * (ARCLIGHT_STAGE_TEST_KILL_AT, ARCLIGHT_BATCH_TEST_KILL_AT) where its outputs are on the
 * broker and their input offsets are not committed, restarts it, and reads the output twice:
 *   - credit --exactly-once: spans in three parts, the first committed, the worker killed in
 *     the middle of the second, restarted, joined by a second worker (a rebalance) before the
 *     third: a read_committed reader sees every transition exactly once, no duplicate before
 *     dedupe, and a read_uncommitted one sees the aborted ones too;
 *   - the same without the flag: duplicates reach the read_committed reader (the contrast);
 *   - batch --exactly-once with steps committed, killed after a step's first chunk, then
 *     (restarted from the committed steps) right after a whole step: every step's chunks
 *     once, none sent again, on a read_committed reader;
 *   - credit and batch --exactly-once through a broker outage (kill -9, down longer than their
 *     transaction and message timeouts, restarted on the same ports and log directories): the
 *     same workers carry on, everything once on read_committed, every partition readable to
 *     its end.
 * docs/RELIABILITY.md has the figures. */
#include "testlib.h"
#include "support.h"

#include "broker_fixture.h"
#include "support.h"

#include "avro/codec.h"
#include "t0898_credit_stream.h"

#include <librdkafka/rdkafka.h>
#include <math.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>

static al_test_broker broker;
static char dir[128], topics_path[200];
static int keep_logs; /* a case failed: the teardown leaves the logs */

/* ---- Kafka ----------------------------------------------------------------------------------- */

static rd_kafka_t *producer(void)
{
    char err[512];
    rd_kafka_conf_t *c = rd_kafka_conf_new();
    rd_kafka_conf_set(c, "bootstrap.servers", broker.bootstrap, err, sizeof err);
    rd_kafka_conf_set(c, "linger.ms", "2", err, sizeof err);
    rd_kafka_conf_set(c, "enable.idempotence", "true", err, sizeof err); /* order kept */
    rd_kafka_conf_set(c, "message.max.bytes", "10485760", err, sizeof err);
    return rd_kafka_new(RD_KAFKA_PRODUCER, c, err, sizeof err);
}

/* Messages [from, to) of s to topic, by key (murmur2, as credit's producers); 0 once all are
 * acknowledged. */
static int produce_range(const char *topic, const stream *s, size_t from, size_t to)
{
    rd_kafka_t *rk = producer();
    if (!rk) return -1;
    int rc = 0;
    for (size_t i = from; i < to && !rc; i++)
        if (rd_kafka_producev(rk, RD_KAFKA_V_TOPIC(topic),
                              RD_KAFKA_V_KEY(s->m[i].key, strlen(s->m[i].key)),
                              RD_KAFKA_V_VALUE(s->m[i].val, s->m[i].len),
                              RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_END))
            rc = -1;
    if (rd_kafka_flush(rk, 30000)) rc = -1;
    rd_kafka_destroy(rk);
    return rc;
}

typedef struct rec {
    int32_t partition;
    int64_t offset;
    uint8_t *val;
    size_t len;
} rec;

typedef struct recs {
    rec *r;
    size_t n;
} recs;

static void recs_free(recs *s)
{
    for (size_t i = 0; i < s->n; i++)
        free(s->r[i].val);
    free(s->r);
    memset(s, 0, sizeof *s);
}

/* Every message of topic's nparts partitions from the beginning to the end a reader with
 * this isolation.level sees (read_committed: the last stable offset), in partition and
 * offset order. 0, or -1 when a partition did not reach its end within 30 s. */
static int read_all(const char *topic, int nparts, const char *isolation, recs *out)
{
    char err[512];
    memset(out, 0, sizeof *out);
    rd_kafka_conf_t *c = rd_kafka_conf_new();
    rd_kafka_conf_set(c, "bootstrap.servers", broker.bootstrap, err, sizeof err);
    rd_kafka_conf_set(c, "group.id", "t1506-reader", err, sizeof err);
    rd_kafka_conf_set(c, "enable.partition.eof", "true", err, sizeof err);
    rd_kafka_conf_set(c, "enable.auto.commit", "false", err, sizeof err);
    rd_kafka_conf_set(c, "isolation.level", isolation, err, sizeof err);
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_CONSUMER, c, err, sizeof err);
    if (!rk) return -1;
    rd_kafka_poll_set_consumer(rk);
    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(nparts);
    for (int p = 0; p < nparts; p++)
        rd_kafka_topic_partition_list_add(l, topic, p)->offset = RD_KAFKA_OFFSET_BEGINNING;
    rd_kafka_assign(rk, l);
    rd_kafka_topic_partition_list_destroy(l);
    int eof = 0;
    char *at_end = calloc((size_t)nparts, 1);
    double t0 = testlib_now();
    while (eof < nparts && testlib_now() - t0 < 30) {
        rd_kafka_message_t *m = rd_kafka_consumer_poll(rk, 200);
        if (!m) continue;
        if (m->err == RD_KAFKA_RESP_ERR__PARTITION_EOF) {
            if (m->partition >= 0 && m->partition < nparts && !at_end[m->partition]++) eof++;
        } else if (!m->err) {
            out->r = realloc(out->r, (out->n + 1) * sizeof *out->r);
            rec *x = &out->r[out->n++];
            x->partition = m->partition;
            x->offset = m->offset;
            x->len = m->len;
            x->val = malloc(m->len ? m->len : 1);
            memcpy(x->val, m->payload, m->len);
        }
        rd_kafka_message_destroy(m);
    }
    free(at_end);
    rd_kafka_consumer_close(rk);
    rd_kafka_destroy(rk);
    for (size_t i = 1; i < out->n; i++) /* partition, then offset */
        for (size_t j = i; j > 0 && (out->r[j - 1].partition > out->r[j].partition ||
                                     (out->r[j - 1].partition == out->r[j].partition &&
                                      out->r[j - 1].offset > out->r[j].offset));
             j--) {
            rec t = out->r[j];
            out->r[j] = out->r[j - 1];
            out->r[j - 1] = t;
        }
    return eof == nparts ? 0 : -1;
}

/* Transitions of tr per expected id (count[], of n_expected()); returns the number of
 * unexpected or undecodable messages. *total gets the number of messages. */
static int count_transitions(const recs *tr, int *count, int *total)
{
    al_transition t;
    memset(&t, 0, sizeof t);
    char err[256];
    int bad = 0;
    memset(count, 0, (size_t)n_expected() * sizeof *count);
    for (size_t i = 0; i < tr->n; i++) {
        int k = al_transition_decode(tr->r[i].val, tr->r[i].len, &t, err, sizeof err) ? -1
                                                                                       : expected_index(t.id);
        if (k < 0)
            bad++;
        else
            count[k]++;
    }
    al_transition_clear(&t);
    *total = (int)tr->n;
    return bad;
}

/* ---- workers --------------------------------------------------------------------------------- */

/* Waits until the series reaches at least want; 0, or -1 after timeout_s or once the
 * worker pid has exited. */
static int wait_metric(pid_t pid, int port, const char *series, double want, double timeout_s)
{
    double t0 = testlib_now();
    while (testlib_now() - t0 < timeout_s) {
        siginfo_t si = {0};
        if (waitid(P_PID, (id_t)pid, &si, WEXITED | WNOHANG | WNOWAIT) == 0 && si.si_pid == pid)
            return -1; /* exited (left for the caller to reap) */
        double v = al_test_metric_at(port, series);
        if (v >= want) return 0;
        usleep(100000);
    }
    return -1;
}

static int file_has(const char *path, const char *text)
{
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    char line[4096];
    int found = 0;
    while (!found && fgets(line, sizeof line, f))
        found = strstr(line, text) != NULL;
    fclose(f);
    return found;
}

static void dump_log(const char *path)
{
    FILE *f = fopen(path, "r");
    char line[2048];
    if (!f) return;
    while (fgets(line, sizeof line, f))
        fprintf(stderr, "    | %s", line);
    fclose(f);
}

/* Starts `arclight CMD ARGS...` with its stderr in log, the test's member slots (TMPDIR) and
 * instance id, short group timings, and ARCLIGHT_STAGE_TEST_KILL_AT / ARCLIGHT_BATCH_TEST_KILL_AT
 * set to kill_at when it is given (var names which); env: more NAME, VALUE pairs (or NULL). */
static pid_t worker_start_env(const char *log, const char *kill_var, const char *kill_at,
                              const char *const *args, const char *const *env)
{
    const char *argv[48];
    int argc = 0;
    argv[argc++] = al_test_bin();
    for (int i = 0; args[i] && argc < 45; i++)
        argv[argc++] = args[i];
    argv[argc++] = "--bootstrap";
    argv[argc++] = broker.bootstrap;
    argv[argc] = NULL;
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        FILE *f = freopen(log, "a", stderr);
        (void)f;
        setenv("TMPDIR", dir, 1);
        setenv("ARCLIGHT_INSTANCE_ID", "t1506", 1);
        setenv("ARCLIGHT_KAFKA_SESSION_TIMEOUT_MS", "6000", 1);
        setenv("ARCLIGHT_KAFKA_HEARTBEAT_INTERVAL_MS", "500", 1);
        setenv("ARCLIGHT_KAFKA_AUTO_COMMIT_INTERVAL_MS", "500", 1);
        unsetenv("ARCLIGHT_STAGE_TEST_KILL_AT");
        unsetenv("ARCLIGHT_BATCH_TEST_KILL_AT");
        if (kill_at) setenv(kill_var, kill_at, 1);
        for (int i = 0; env && env[i] && env[i + 1]; i += 2)
            setenv(env[i], env[i + 1], 1);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    return pid;
}

static pid_t worker_start(const char *log, const char *kill_var, const char *kill_at,
                          const char *const *args)
{
    return worker_start_env(log, kill_var, kill_at, args, NULL);
}

/* SIGTERM, then the exit status (-1: killed by a signal or not gone within 60 s). */
static int stop_worker(pid_t pid)
{
    kill(pid, SIGTERM);
    int st = al_test_wait(pid, 60);
    return st >= 0 && WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* ---- credit ---------------------------------------------------------------------------------- */

static stream spans;

typedef struct credit_result {
    int killed;           /* the first worker died of the fault point's SIGKILL */
    int exits_ok;         /* every later worker exited 0 on SIGTERM */
    int missing, dups, bad, committed_total, uncommitted_total;
    double replayed;      /* groups re-formed after the restart and not emitted again */
    double second_spans;  /* spans the second worker consumed (-1: none started) */
    int froze, took_back; /* the second worker stopped; the first then held all 4 partitions */
    int aborted;          /* the second worker aborted its transaction once let go */
} credit_result;

/* Partitions a worker holds now by its log ("assigned N partitions (M now)", "revoked N
 * partitions (M left)", "lost N partitions (M left)": the last M), -1 before any. */
static int held_now(const char *log)
{
    FILE *f = fopen(log, "r");
    if (!f) return -1;
    char line[4096];
    int held = -1;
    while (fgets(line, sizeof line, f)) {
        const char *p;
        int a, m;
        if ((p = strstr(line, "kafka: assigned ")) &&
            sscanf(p, "kafka: assigned %d partitions (%d now)", &a, &m) == 2)
            held = m;
        if (((p = strstr(line, "kafka: revoked ")) &&
             sscanf(p, "kafka: revoked %d partitions (%d left)", &a, &m) == 2) ||
            ((p = strstr(line, "kafka: lost ")) &&
             sscanf(p, "kafka: lost %d partitions (%d left)", &a, &m) == 2))
            held = m;
    }
    fclose(f);
    return held;
}

/* Credit on the spans in three parts: the first consumed and committed; the second produced
 * and the worker killed at its middle (its outputs acknowledged, uncommitted), restarted
 * (the same member slot: the same group.instance.id and transactional.id); with `second`,
 * another worker joins; the third part; then every expected transition is awaited on a
 * read_committed reader, the workers stopped, and the output read both ways. */
static void credit_phases(const char *name, int eos, int second, credit_result *res)
{
    char in[64], out[64], group[64], cmd[128], reply[256];
    char loga[256], loga2[256], logb[256], kill_at[32], ma[32], mb[32];
    memset(res, 0, sizeof *res);
    res->second_spans = -1;
    snprintf(in, sizeof in, "t1506.%s.spans", name);
    snprintf(out, sizeof out, "t1506.%s.tr", name);
    snprintf(group, sizeof group, "t1506-%s", name);
    snprintf(cmd, sizeof cmd, "create %s 4", in);
    REQUIRE(al_test_broker_control(&broker, cmd, reply, sizeof reply) == 0);
    snprintf(cmd, sizeof cmd, "create %s 4", out);
    REQUIRE(al_test_broker_control(&broker, cmd, reply, sizeof reply) == 0);
    snprintf(loga, sizeof loga, "%s/%s-a.log", dir, name);
    snprintf(loga2, sizeof loga2, "%s/%s-a2.log", dir, name);
    snprintf(logb, sizeof logb, "%s/%s-b.log", dir, name);
    size_t p1 = spans.n / 3, p2 = 2 * spans.n / 3;
    snprintf(kill_at, sizeof kill_at, "%zu", p1 + (p2 - p1) / 2);
    int pa = al_test_free_port(), pb = al_test_free_port();
    snprintf(ma, sizeof ma, "127.0.0.1:%d", pa);
    snprintf(mb, sizeof mb, "127.0.0.1:%d", pb);
    const char *args_a[] = {"credit", "--input", in, "--output", out, "--group", group,
                            "--log-level", "info", "--metrics", ma,
                            eos ? "--exactly-once" : NULL, NULL};
    const char *args_b[] = {"credit", "--input", in, "--output", out, "--group", group,
                            "--log-level", "info", "--metrics", mb,
                            eos ? "--exactly-once" : NULL, NULL};

    pid_t a = worker_start(loga, "ARCLIGHT_STAGE_TEST_KILL_AT", kill_at, args_a);
    REQUIRE(produce_range(in, &spans, 0, p1) == 0);
    int ok = wait_metric(a, pa, "arclight_credit_spans_total", (double)p1, 90) == 0;
    if (ok && eos) {
        /* the commit after the whole first part */
        double c0 = al_test_metric_at(pa, "arclight_stage_transactions_total{outcome=\"committed\"}");
        ok = wait_metric(a, pa, "arclight_stage_transactions_total{outcome=\"committed\"}",
                         (isnan(c0) ? 0 : c0) + 1, 30) == 0;
    } else if (ok) {
        usleep(2000000); /* four automatic commits */
    }
    CHECKF(ok, "%s: the first worker did not consume and commit the first part", name);
    if (!ok) dump_log(loga);
    REQUIRE(produce_range(in, &spans, p1, p2) == 0);
    int st = al_test_wait(a, 90);
    res->killed = st >= 0 && WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL;
    CHECKF(res->killed, "%s: the first worker was not killed at its fault point (status %d)",
           name, st);
    if (!res->killed) dump_log(loga);

    pid_t a2 = worker_start(loga2, NULL, NULL, args_a);
    double t0 = testlib_now();
    while (!file_has(loga2, "kafka: assigned") && testlib_now() - t0 < 60)
        usleep(100000);
    CHECKF(file_has(loga2, "kafka: assigned"), "%s: the restarted worker got no partitions", name);
    pid_t b = -1;
    if (second) {
        /* the second worker freezes in the middle of its share of the third part, its
         * outputs in an open transaction, past its session: the first takes its partitions
         * back and does that work again; the frozen one, let go, must abort */
        char stop_at[32];
        snprintf(stop_at, sizeof stop_at, "stop:%zu", (spans.n - p2) / 6);
        b = worker_start(logb, "ARCLIGHT_STAGE_TEST_KILL_AT", stop_at, args_b);
        t0 = testlib_now();
        while (!file_has(logb, "kafka: assigned") && testlib_now() - t0 < 60)
            usleep(100000);
        CHECKF(file_has(logb, "kafka: assigned"), "%s: the second worker got no partitions", name);
    }
    REQUIRE(produce_range(in, &spans, p2, spans.n) == 0);
    if (second) {
        t0 = testlib_now();
        while (!file_has(logb, "test fault point: SIGSTOP") && testlib_now() - t0 < 60)
            usleep(100000);
        res->froze = file_has(logb, "test fault point: SIGSTOP");
        while (res->froze && held_now(loga2) != 4 && testlib_now() - t0 < 60)
            usleep(100000);
        res->took_back = held_now(loga2) == 4;
        kill(b, SIGCONT);
    }

    int n = n_expected(), total = 0, *count = calloc((size_t)n, sizeof *count);
    recs r = {0};
    t0 = testlib_now();
    for (;;) {
        recs_free(&r);
        read_all(out, 4, "read_committed", &r);
        count_transitions(&r, count, &total);
        int have = 0;
        for (int i = 0; i < n; i++)
            have += count[i] > 0;
        if (have == n || testlib_now() - t0 > 150) break; /* slow only on a loaded machine */
        usleep(300000);
    }
    res->replayed = al_test_metric_at(pa, "arclight_credit_groups_total{outcome=\"replayed_not_emitted\"}");
    if (second) {
        double rb =
            al_test_metric_at(pb, "arclight_credit_groups_total{outcome=\"replayed_not_emitted\"}");
        if (!isnan(rb)) res->replayed += rb;
        res->second_spans = al_test_metric_at(pb, "arclight_credit_spans_total");
    }
    if (second) res->aborted = file_has(logb, "exactly-once: aborting the transaction");
    res->exits_ok = stop_worker(a2) == 0;
    if (!res->exits_ok) dump_log(loga2);
    if (second && stop_worker(b) != 0) {
        res->exits_ok = 0;
        dump_log(logb);
    }

    recs_free(&r);
    CHECK(read_all(out, 4, "read_committed", &r) == 0);
    res->bad = count_transitions(&r, count, &res->committed_total);
    for (int i = 0; i < n; i++) {
        res->missing += count[i] == 0;
        res->dups += count[i] > 1 ? count[i] - 1 : 0;
    }
    recs_free(&r);
    CHECK(read_all(out, 4, "read_uncommitted", &r) == 0);
    res->uncommitted_total = (int)r.n;
    recs_free(&r);
    free(count);
    if (res->missing || (eos && res->dups)) keep_logs = 1;
    printf("  credit %s: %d transitions expected; read_committed %d (%d missing, %d duplicates), "
           "read_uncommitted %d; groups not emitted again after the restart: %.0f\n",
           eos ? "--exactly-once" : "(at least once)", n, res->committed_total, res->missing,
           res->dups, res->uncommitted_total, isnan(res->replayed) ? 0 : res->replayed);
}

TEST(setup)
{
#ifndef ARCLIGHT_FAULT_POINTS
    printf("  skipped: this build has no test fault points (ARCLIGHT_FAULT_POINTS)\n");
    exit(0);
#endif
    if (!al_test_kafka_available()) {
        printf("  skipped: no Apache Kafka (scripts/setup.sh fetches it into %s)\n",
               al_test_kafka_libs());
        printf("0 passed, 0 failed\n");
        exit(0);
    }
    setenv("ARCLIGHT_TEST_BROKER", "kafka", 1); /* real Kafka only: see the top */
    REQUIRE(al_test_tmpdir(dir, sizeof dir, "t1506"));
    snprintf(topics_path, sizeof topics_path, "%s/topics.conf", dir);
    FILE *f = fopen(topics_path, "w");
    REQUIRE(f);
    fputs("arclight.transitions 4 1\narclight.batches 2 1\narclight.policy 1 1\n"
          "arclight.deadletter 1 1\n",
          f);
    fclose(f);
    const char *extra[] = {"--topics", topics_path, NULL};
    REQUIRE(al_test_broker_start(&broker, extra) == 0);
    build_stream(&spans, 0);
}

TEST(credit_exactly_once_through_kill9_restart_and_a_rebalance)
{
    credit_result r;
    credit_phases("eos", 1, 1, &r);
    CHECK(r.killed);
    CHECK(r.exits_ok);
    CHECKF(r.missing == 0 && r.bad == 0, "%d transitions missing, %d unexpected", r.missing, r.bad);
    CHECKF(r.dups == 0 && r.committed_total == n_expected(),
           "a read_committed reader saw %d duplicates (%d transitions for %d expected)", r.dups,
           r.committed_total, n_expected());
    /* the kill left outputs on the broker: an aborted transaction's, which only a
     * read_uncommitted reader sees */
    CHECKF(r.uncommitted_total > r.committed_total,
           "read_uncommitted saw %d transitions, no more than read_committed's %d",
           r.uncommitted_total, r.committed_total);
    /* the committed offset's metadata named groups emitted above it, which the restart
     * re-formed from the same spans and did not emit again */
    CHECKF(r.replayed > 0, "no group was re-formed and held back after the restart (%g)",
           r.replayed);
    CHECKF(r.second_spans > 0, "the second worker consumed %g spans", r.second_spans);
    CHECKF(r.froze && r.took_back, "the second worker froze: %d; the first took its partitions "
           "back: %d", r.froze, r.took_back);
    CHECKF(r.aborted, "the second worker, let go after its session, did not abort");
}

TEST(credit_without_the_flag_duplicates_after_the_same_kill)
{
    credit_result r;
    credit_phases("alo", 0, 0, &r);
    CHECK(r.killed);
    CHECK(r.exits_ok);
    CHECKF(r.missing == 0 && r.bad == 0, "%d transitions missing, %d unexpected", r.missing, r.bad);
    CHECKF(r.dups > 0, "at least once: the kill left no duplicate (%d transitions for %d)",
           r.committed_total, n_expected());
}

/* ---- batch ----------------------------------------------------------------------------------- */

static int32_t toks[4096];
static uint8_t tmask[4096];
static float tlogp[4096];

/* A transition of group g's rollout r (groups of 4, one call each), np + nr tokens. */
static void encode_transition(al_buf *out, int g, int r, int np, int nr)
{
    char id[64], gid[32], rid[32], task[32];
    snprintf(rid, sizeof rid, "g%d-r%d", g, r);
    snprintf(id, sizeof id, "%s:0:0", rid);
    snprintf(gid, sizeof gid, "group-%d", g);
    snprintf(task, sizeof task, "task-%d", g);
    for (int i = 0; i < np + nr; i++)
        toks[i] = g * 1000 + i % 1000;
    for (int i = 0; i < nr; i++) {
        tmask[i] = 1;
        tlogp[i] = -0.5f;
    }
    al_transition t = {
        .id = id, .group_key = task, .group_id = gid, .group_size = 4, .task_id = task,
        .rollout_id = rid, .prompt_token_ids = toks, .n_prompt_tokens = (size_t)np,
        .response_token_ids = toks + np, .n_response_tokens = (size_t)nr, .loss_mask = tmask,
        .n_loss_mask = (size_t)nr, .rollout_logprobs = tlogp, .n_rollout_logprobs = (size_t)nr,
        .reward = r, .return_value = r, .advantage = r - 1.5, .estimator = "grpo",
        .policy_version = -1, .model = "m",
    };
    char err[256];
    if (al_transition_encode(&t, out, err, sizeof err) != 0) fprintf(stderr, "encode: %s\n", err);
}

#define N_GROUPS 24
#define N_STEPS 6 /* 16 sequences a step */

/* What the chunks on the batches topic say: per step, how many chunks were seen in all,
 * how many attempts began (chunk 0 seen), how many were complete, and per transition id
 * how many complete attempts hold it. */
typedef struct steps_seen {
    int chunks[N_STEPS + 1], attempts[N_STEPS + 1], complete[N_STEPS + 1];
    int per_id[N_GROUPS][4];
    int others; /* chunks of steps past the last, or undecodable */
} steps_seen;

static void view_steps(const recs *m, steps_seen *v)
{
    memset(v, 0, sizeof *v);
    int got[N_STEPS + 1] = {0};
    char ids[N_STEPS + 1][64][24];
    int nids[N_STEPS + 1] = {0};
    for (size_t i = 0; i < m->n; i++) {
        al_batch_chunk ch = {0};
        char err[256];
        if (al_batch_chunk_decode(m->r[i].val, m->r[i].len, &ch, err, sizeof err) != 0 ||
            ch.step < 0 || ch.step >= N_STEPS) {
            v->others++;
            al_batch_chunk_clear(&ch);
            continue;
        }
        int s = (int)ch.step;
        v->chunks[s]++;
        if (ch.chunk_index == 0) {
            v->attempts[s]++;
            got[s] = 0;
            nids[s] = 0;
        }
        if (ch.chunk_index == got[s]) got[s]++;
        for (size_t k = 0; k < ch.n_micro_batches; k++)
            for (size_t q = 0; q < ch.micro_batches[k].n_sequences && nids[s] < 64; q++)
                snprintf(ids[s][nids[s]++], sizeof ids[0][0], "%s",
                         ch.micro_batches[k].transition_ids[q]);
        if (got[s] == ch.chunk_count) {
            v->complete[s]++;
            for (int k = 0; k < nids[s]; k++) {
                int g, r;
                if (sscanf(ids[s][k], "g%d-r%d", &g, &r) == 2 && g >= 0 && g < N_GROUPS && r >= 0 &&
                    r < 4)
                    v->per_id[g][r]++;
            }
        }
        al_batch_chunk_clear(&ch);
    }
}

/* Transitions of groups [g0, g1) to topic (group g on partition g % 4). */
static int produce_groups_to(const char *topic, int g0, int g1)
{
    rd_kafka_t *p = producer();
    if (!p) return -1;
    al_buf buf = {0};
    int rc = 0;
    for (int g = g0; g < g1 && !rc; g++) {
        char key[32];
        snprintf(key, sizeof key, "task-%d", g);
        uint32_t rng = 99u + (uint32_t)g;
        for (int r = 0; r < 4 && !rc; r++) {
            rng = rng * 1103515245u + 12345u;
            encode_transition(&buf, g, r, 200 + (int)(rng >> 8) % 1300,
                              200 + (int)(rng >> 12) % 1300);
            rc = rd_kafka_producev(p, RD_KAFKA_V_TOPIC(topic),
                                   RD_KAFKA_V_PARTITION(g % 4), RD_KAFKA_V_KEY(key, strlen(key)),
                                   RD_KAFKA_V_VALUE(buf.data, buf.len),
                                   RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_END)
                     ? -1
                     : 0;
        }
    }
    if (rd_kafka_flush(p, 10000)) rc = -1;
    rd_kafka_destroy(p);
    al_buf_free(&buf);
    return rc;
}

static int produce_groups(int g0, int g1)
{
    return produce_groups_to("arclight.transitions", g0, g1);
}

/* Whether steps [0, n) are each complete at least once on a read_committed reader of topic
 * (2 partitions). */
static int steps_done_in(const char *topic, int n, steps_seen *v)
{
    recs m = {0};
    read_all(topic, 2, "read_committed", &m);
    view_steps(&m, v);
    recs_free(&m);
    for (int s = 0; s < n; s++)
        if (v->complete[s] < 1) return 0;
    return 1;
}

static int steps_done(int n, steps_seen *v)
{
    return steps_done_in("arclight.batches", n, v);
}

TEST(batch_exactly_once_through_kills_mid_step_and_after_a_step)
{
    const char *args[] = {"batch", "--exactly-once", "--step-sequences", "16",
                          "--micro-batch-tokens", "4096", "--max-message-bytes", "150000",
                          "--group-idle-ms", "300", "--log-level", "info", NULL};
    char log[3][256];
    for (int i = 0; i < 3; i++)
        snprintf(log[i], sizeof log[i], "%s/batch-%d.log", dir, i);
    steps_seen v;
    /* the first half (steps 0-2) consumed and committed; the second half produced, and the
     * worker killed after step 4's first chunk is acknowledged (step 3 whole and step 4 cut
     * short in its open transaction) */
    REQUIRE(produce_groups(0, N_GROUPS / 2) == 0);
    pid_t pid = worker_start(log[0], "ARCLIGHT_BATCH_TEST_KILL_AT", "4:0", args);
    double t0 = testlib_now();
    while (!steps_done(3, &v) && testlib_now() - t0 < 60)
        usleep(300000);
    CHECKF(steps_done(3, &v), "steps 0-2 were not committed");
    REQUIRE(produce_groups(N_GROUPS / 2, N_GROUPS) == 0);
    int st = al_test_wait(pid, 90);
    CHECKF(st >= 0 && WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL, "first run: status %d", st);
    if (!(st >= 0 && WIFSIGNALED(st))) dump_log(log[0]);
    /* the restart reads the committed steps back (next step 3) and is killed right after a
     * whole step 5 is acknowledged */
    st = al_test_wait(worker_start(log[1], "ARCLIGHT_BATCH_TEST_KILL_AT", "5:-1", args), 90);
    CHECKF(st >= 0 && WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL, "second run: status %d", st);
    if (!(st >= 0 && WIFSIGNALED(st))) dump_log(log[1]);
    /* at step 3, or at 4 when a commit interval passed between steps 3 and 4 (a loaded
     * machine) and step 3's transaction was committed before the kill */
    int at3 = file_has(log[1], "continuing at step 3");
    CHECKF(at3 || file_has(log[1], "continuing at step 4"),
           "the restart did not continue at step 3 or 4");
    pid = worker_start(log[2], NULL, NULL, args);
    t0 = testlib_now();
    while (!steps_done(N_STEPS, &v) && testlib_now() - t0 < 60)
        usleep(300000);
    usleep(500000); /* anything it would wrongly send again */
    int rc = stop_worker(pid);
    CHECKF(rc == 0, "third run: exit %d", rc);
    if (rc) dump_log(log[2]);

    recs m = {0};
    CHECK(read_all("arclight.batches", 2, "read_committed", &m) == 0);
    view_steps(&m, &v);
    int chunks = 0, twice = 0, missing = 0;
    for (int s = 0; s < N_STEPS; s++) {
        CHECKF(v.complete[s] == 1 && v.attempts[s] == 1, "step %d: %d attempts, %d complete", s,
               v.attempts[s], v.complete[s]);
        chunks += v.chunks[s];
    }
    CHECKF(v.chunks[N_STEPS] == 0 && v.others == 0, "%d chunks past step %d, %d unusable",
           v.chunks[N_STEPS], N_STEPS - 1, v.others);
    for (int g = 0; g < N_GROUPS; g++)
        for (int r = 0; r < 4; r++) {
            missing += v.per_id[g][r] == 0;
            twice += v.per_id[g][r] > 1;
        }
    CHECKF(missing == 0 && twice == 0, "%d transitions missing, %d in two steps", missing, twice);
    int committed_chunks = (int)m.n;
    recs_free(&m);
    CHECK(read_all("arclight.batches", 2, "read_uncommitted", &m) == 0);
    view_steps(&m, &v);
    int restarts = 0;
    for (int s = 0; s < N_STEPS; s++)
        restarts += v.attempts[s] - 1;
    /* both kills left chunks of aborted transactions on the broker: steps 3 (unless it was
     * committed before the first kill) and 4, then the steps from the restart's to 5 */
    CHECKF((v.attempts[3] >= 2 || !at3) && v.attempts[4] >= 2 && (int)m.n > committed_chunks,
           "read_uncommitted: %zu chunks, step 3 begun %d times, step 4 %d (read_committed: %d "
           "chunks)",
           m.n, v.attempts[3], v.attempts[4], committed_chunks);
    printf("  batch --exactly-once: %d steps, read_committed %d chunks (%d in steps: none "
           "twice), read_uncommitted %zu chunks, %d steps begun again\n",
           N_STEPS, committed_chunks, chunks, m.n, restarts);
    recs_free(&m);
}

/* ---- a broker outage ------------------------------------------------------------------------ */

/* 1 while pid has not exited (it is left for the caller to reap). */
static int running(pid_t pid)
{
    siginfo_t si = {0};
    return !(waitid(P_PID, (id_t)pid, &si, WEXITED | WNOHANG | WNOWAIT) == 0 && si.si_pid == pid);
}

/* Credit and batch with --exactly-once, each with a transaction open (outputs sent, offsets
 * not committed), when the broker is killed with SIGKILL; it stays down longer than their
 * transaction.timeout.ms and message.timeout.ms (15 s here), so the open transactions cannot
 * commit: the message deliveries time out and the coordinator aborts them when it is back.
 * Restarted on the same ports and log directories, the same two workers (no restart of
 * theirs) carry on: every transition and every step reaches a read_committed reader once, and
 * that reader reads each partition to its end (no transaction left open). */
TEST(credit_and_batch_exactly_once_through_a_broker_outage)
{
    const char *spans_t = "t1506.outage.spans", *tr_t = "t1506.outage.tr";
    const char *in_t = "t1506.outage.in", *out_t = "t1506.outage.batches";
    char cmd[128], reply[256], logc[256], logb[256], mc[32], mb[32];
    snprintf(cmd, sizeof cmd, "create %s 4", spans_t);
    REQUIRE(al_test_broker_control(&broker, cmd, reply, sizeof reply) == 0);
    snprintf(cmd, sizeof cmd, "create %s 4", tr_t);
    REQUIRE(al_test_broker_control(&broker, cmd, reply, sizeof reply) == 0);
    snprintf(cmd, sizeof cmd, "create %s 4", in_t);
    REQUIRE(al_test_broker_control(&broker, cmd, reply, sizeof reply) == 0);
    snprintf(cmd, sizeof cmd, "create %s 2", out_t);
    REQUIRE(al_test_broker_control(&broker, cmd, reply, sizeof reply) == 0);
    snprintf(logc, sizeof logc, "%s/outage-credit.log", dir);
    snprintf(logb, sizeof logb, "%s/outage-batch.log", dir);
    int pc = al_test_free_port(), pb = al_test_free_port();
    snprintf(mc, sizeof mc, "127.0.0.1:%d", pc);
    snprintf(mb, sizeof mb, "127.0.0.1:%d", pb);
    const char *cargs[] = {"credit", "--exactly-once", "--input", spans_t, "--output", tr_t,
                           "--group", "t1506-outage-credit", "--log-level", "info", "--metrics",
                           mc, NULL};
    const char *bargs[] = {"batch", "--exactly-once", "--input-topic", in_t, "--output-topic",
                           out_t, "--group", "t1506-outage-batch", "--step-sequences", "16",
                           "--micro-batch-tokens", "4096", "--max-message-bytes", "150000",
                           "--group-idle-ms", "300", "--log-level", "info", "--metrics", mb, NULL};
    /* commits every 2 s: the kill lands inside a transaction */
    const char *env[] = {"ARCLIGHT_KAFKA_TRANSACTION_TIMEOUT_MS", "15000",
                         "ARCLIGHT_KAFKA_AUTO_COMMIT_INTERVAL_MS", "2000", NULL};
    const char *committed = "arclight_stage_transactions_total{outcome=\"committed\"}";
    pid_t c = worker_start_env(logc, NULL, NULL, cargs, env);
    pid_t b = worker_start_env(logb, NULL, NULL, bargs, env);
    size_t p1 = spans.n / 3, p2 = 2 * spans.n / 3;
    REQUIRE(produce_range(spans_t, &spans, 0, p1) == 0);
    REQUIRE(produce_groups_to(in_t, 0, N_GROUPS / 2) == 0);
    steps_seen v;
    int ok = wait_metric(c, pc, "arclight_credit_spans_total", (double)p1, 90) == 0 &&
             wait_metric(c, pc, committed, 1, 60) == 0 && wait_metric(b, pb, committed, 1, 60) == 0;
    double t0 = testlib_now();
    while (ok && !steps_done_in(out_t, 3, &v) && testlib_now() - t0 < 60)
        usleep(300000);
    ok = ok && steps_done_in(out_t, 3, &v);
    CHECKF(ok, "the first part was not consumed and committed by both workers");
    if (!ok) {
        keep_logs = 1;
        dump_log(logc);
        dump_log(logb);
    }

    /* the second part, and the kill once credit is into it (batch has step 3 whole and step
     * 4 begun in its open transaction by then, or is sending them) */
    REQUIRE(produce_groups_to(in_t, N_GROUPS / 2, 3 * N_GROUPS / 4) == 0);
    REQUIRE(produce_range(spans_t, &spans, p1, p2) == 0);
    wait_metric(c, pc, "arclight_credit_spans_total", (double)p1 + (p2 - p1) / 2, 30);
    double c_before = al_test_metric_at(pc, committed), b_before = al_test_metric_at(pb, committed);
    REQUIRE(al_test_broker_control(&broker, "down 1", reply, sizeof reply) == 0);
    double down_at = testlib_now();
    while (testlib_now() - down_at < 30 && running(c) && running(b))
        usleep(200000);
    int c_up = running(c), b_up = running(b);
    CHECKF(c_up && b_up, "a worker exited during the outage (credit running: %d, batch: %d)",
           c_up, b_up);
    REQUIRE(al_test_broker_control(&broker, "up 1", reply, sizeof reply) == 0);
    double outage_s = testlib_now() - down_at;

    /* the third part, after the outage */
    REQUIRE(produce_groups_to(in_t, 3 * N_GROUPS / 4, N_GROUPS) == 0);
    REQUIRE(produce_range(spans_t, &spans, p2, spans.n) == 0);
    int n = n_expected(), total = 0, *count = calloc((size_t)n, sizeof *count);
    recs r = {0};
    int have = 0, steps_all = 0;
    t0 = testlib_now();
    while (c_up && b_up) {
        recs_free(&r);
        read_all(tr_t, 4, "read_committed", &r);
        count_transitions(&r, count, &total);
        have = 0;
        for (int i = 0; i < n; i++)
            have += count[i] > 0;
        steps_all = steps_done_in(out_t, N_STEPS, &v);
        if ((have == n && steps_all) || testlib_now() - t0 > 150) break;
        usleep(300000);
    }
    double c_after = al_test_metric_at(pc, committed), b_after = al_test_metric_at(pb, committed);
    double c_aborts = al_test_metric_at(pc, "arclight_stage_transactions_total{outcome=\"aborted\"}");
    double b_aborts = al_test_metric_at(pb, "arclight_stage_transactions_total{outcome=\"aborted\"}");
    int rc_c = stop_worker(c), rc_b = stop_worker(b);
    CHECKF(rc_c == 0 && rc_b == 0, "exit status: credit %d, batch %d", rc_c, rc_b);
    CHECKF(c_after > c_before && b_after > b_before,
           "no commit after the outage: credit %g -> %g, batch %g -> %g", c_before, c_after,
           b_before, b_after);

    /* every partition to its end on read_committed: no transaction was left open */
    recs_free(&r);
    CHECKF(read_all(tr_t, 4, "read_committed", &r) == 0,
           "%s: a partition was not readable to its end on read_committed", tr_t);
    int bad = count_transitions(&r, count, &total), missing = 0, dups = 0;
    for (int i = 0; i < n; i++) {
        missing += count[i] == 0;
        dups += count[i] > 1 ? count[i] - 1 : 0;
    }
    CHECKF(missing == 0 && bad == 0, "credit: %d transitions missing, %d unexpected", missing,
           bad);
    CHECKF(dups == 0 && total == n,
           "credit: a read_committed reader saw %d duplicates (%d transitions for %d expected)",
           dups, total, n);
    recs_free(&r);
    free(count);
    recs m = {0};
    CHECKF(read_all(out_t, 2, "read_committed", &m) == 0,
           "%s: a partition was not readable to its end on read_committed", out_t);
    view_steps(&m, &v);
    int twice = 0, lost = 0, once = 1;
    for (int s = 0; s < N_STEPS; s++)
        if (!(v.complete[s] == 1 && v.attempts[s] == 1)) {
            CHECKF(0, "batch: step %d: %d attempts, %d complete", s, v.attempts[s],
                   v.complete[s]);
            once = 0;
        }
    CHECKF(v.chunks[N_STEPS] == 0 && v.others == 0, "batch: %d chunks past step %d, %d unusable",
           v.chunks[N_STEPS], N_STEPS - 1, v.others);
    for (int g = 0; g < N_GROUPS; g++)
        for (int q = 0; q < 4; q++) {
            lost += v.per_id[g][q] == 0;
            twice += v.per_id[g][q] > 1;
        }
    CHECKF(lost == 0 && twice == 0, "batch: %d transitions missing, %d in two steps", lost, twice);
    if (missing || dups || bad || lost || twice || !once || rc_c || rc_b) {
        keep_logs = 1;
        dump_log(logc);
        dump_log(logb);
    }
    const char *renewed = "making a new producer";
    printf("  broker down %.1f s: credit read_committed %d transitions for %d (%d missing, %d "
           "duplicates), %g aborts%s; batch %d chunks in %d steps (%d transitions missing, %d "
           "in two steps), %g aborts%s\n",
           outage_s, total, n, missing, dups, isnan(c_aborts) ? 0 : c_aborts,
           file_has(logc, renewed) ? " (one a timed-out transaction: a new producer)" : "",
           (int)m.n, N_STEPS, lost, twice, isnan(b_aborts) ? 0 : b_aborts,
           file_has(logb, renewed) ? " (one a timed-out transaction: a new producer)" : "");
    recs_free(&m);
}

TEST(teardown)
{
    al_test_broker_stop(&broker);
    if (keep_logs) {
        printf("  the workers' logs stay in %s\n", dir);
        return;
    }
    al_test_rmtree(dir);
}


