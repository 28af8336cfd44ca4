/*
 * t1502: replication and broker faults, Kafka's own way (every acknowledged message is
 * consumed). On three KRaft nodes with arclight's topics at replication 3 and
 * min.insync.replicas=2, agents call through the proxy while credit consumes:
 *   1. the leader of arclight.spans' partition 0 is killed with SIGKILL and started again,
 *      three times, then the node coordinating credit's group: every call an agent saw
 *      succeed is a span, every rollout that ended has a transition per call, and credit
 *      never gives its partitions up as lost (its session outlasts a broker failover);
 *   2. all three nodes are killed for a while: calls go on (the proxy's spool holds their
 *      spans), and everything is delivered once the cluster is back.
 * Real Kafka only (label kafka): the embedded broker does not replicate.
 */
#define _GNU_SOURCE
#include "testlib.h"

#include "broker_fixture.h"
#include "kafka/kafka.h"
#include "t1099_proxy_helpers.h"

#include <pthread.h>
#include <stdatomic.h>

#define MAX_ROLL 12000
#define CALLS 3

static al_test_broker B;
static fake_upstream *U;
static px_child P;
static pid_t credit_pid;
static char TMP[512], UPURL[128];

/* What the agents saw, per rollout: calls answered 200, and whether reward and end were. */
static int calls_ok[MAX_ROLL];
static char ended[MAX_ROLL];
static char posted[MAX_ROLL]; /* reward and end spans the proxy answered 200 for (0..2) */
static atomic_int n_roll;
static atomic_int stop_agents;
static int roll_limit; /* agents stop taking rollouts at this number */
static atomic_long failed_calls;
static int any_failed; /* a check failed: the logs in TMP are kept */

static const char *CHAT = "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}";

__attribute__((constructor)) static void use_real_kafka(void)
{
    setenv("ARCLIGHT_TEST_BROKER", "kafka", 1);
}

/* One agent: rollouts of CALLS calls, a reward and an end, one after the other, until told to
 * stop. Rollout r is task "t1502-task-r" (its own group of one), ids recorded in the arrays. */
static void *agent(void *arg)
{
    (void)arg;
    while (!atomic_load(&stop_agents)) {
        int r = atomic_fetch_add(&n_roll, 1);
        if (r >= roll_limit) break;
        char path[256];
        for (int c = 0; c < CALLS; c++) {
            px_resp resp;
            snprintf(path, sizeof path, "/r/t1502-task-%d/t1502-roll-%d/v1/chat/completions", r, r);
            if (px_post(&P, path, CHAT, &resp) == 0 && resp.status == 200)
                calls_ok[r]++;
            else
                atomic_fetch_add(&failed_calls, 1);
            px_resp_free(&resp);
        }
        px_resp a = {0}, b = {0}; /* b is not posted when a failed */
        snprintf(path, sizeof path, "/r/t1502-task-%d/t1502-roll-%d/reward", r, r);
        int ok = px_post(&P, path, "{\"value\": 1.0}", &a) == 0 && a.status == 200;
        px_resp_free(&a);
        posted[r] = (char)ok;
        snprintf(path, sizeof path, "/r/t1502-task-%d/t1502-roll-%d/end", r, r);
        ok = ok && px_post(&P, path, "{\"status\": \"succeeded\", \"group_size\": 1}", &b) == 0 &&
             b.status == 200;
        if (ok) posted[r]++;
        px_resp_free(&b);
        ended[r] = (char)(ok && calls_ok[r] == CALLS);
        usleep(50000); /* about 35 rollouts a second from two agents */
    }
    return NULL;
}

static pid_t start_credit(void)
{
    char log[700];
    snprintf(log, sizeof log, "%s/credit.log", TMP);
    /* T1502_DEBUG=1: credit logs librdkafka's group and consumer trace (debug=cgrp,consumer) */
    int debug = getenv("T1502_DEBUG") && *getenv("T1502_DEBUG") == '1';
    const char *argv[] = {al_test_bin(), "credit",      "--bootstrap", B.bootstrap,
                          "--estimator", "none",        "--log-level", debug ? "debug" : "info",
                          NULL};
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        FILE *f = freopen(log, "a", stderr);
        (void)f;
        setenv("TMPDIR", TMP, 1);
        if (debug) setenv("ARCLIGHT_KAFKA_DEBUG", "cgrp,consumer", 1);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    return pid;
}

/* What a read of a topic found: per rollout, the distinct call spans (by sequence) or the
 * distinct call indices in transitions, and where the first of them was. */
typedef struct {
    int per_roll[MAX_ROLL];
    unsigned char seen[MAX_ROLL][8];
    int32_t part[MAX_ROLL];
    int64_t off[MAX_ROLL];
    int distinct;  /* distinct entries of this test's rollouts */
    long messages; /* entries of this test's rollouts, duplicates included */
} tally;

static void tally_add(tally *t, int r, int idx, int32_t part, int64_t off)
{
    if (r < 0 || r >= MAX_ROLL || idx < 0 || idx >= 8) return;
    if (!t->per_roll[r] && !t->seen[r][0] && !t->seen[r][1] && !t->seen[r][2]) {
        t->part[r] = part;
        t->off[r] = off;
    }
    t->messages++;
    if (!t->seen[r][idx]++) {
        t->per_roll[r]++;
        t->distinct++;
    }
}

/* One message of the topic into t: LLM-call spans count by sequence, transitions by their
 * call indices. */
static void tally_message(tally *t, int transitions, const rd_kafka_message_t *m)
{
    char err[256];
    int r;
    if (transitions) {
        al_transition tr;
        memset(&tr, 0, sizeof tr);
        if (al_transition_decode(m->payload, m->len, &tr, err, sizeof err) == 0 &&
            sscanf(tr.rollout_id, "t1502-roll-%d", &r) == 1)
            for (size_t k = 0; k < tr.n_call_indices; k++)
                tally_add(t, r, tr.call_indices[k], m->partition, m->offset);
        al_transition_clear(&tr);
    } else {
        al_span sp;
        memset(&sp, 0, sizeof sp);
        if (al_span_decode(m->payload, m->len, &sp, err, sizeof err) == 0 &&
            sp.kind == AL_SPAN_KIND_LLM_CALL && sscanf(sp.rollout_id, "t1502-roll-%d", &r) == 1)
            tally_add(t, r, (int)sp.sequence, m->partition, m->offset);
        al_span_clear(&sp);
    }
}

/* Reads topic from the beginning (an assign-only reader) until `want` distinct entries are
 * there or timeout_ms passes. Counting distinct entries matters: a consumer that lost its
 * partitions re-emits what it had produced, and a read that stopped at `want` messages
 * stopped short of the newest ones by as many duplicates. */
static void read_tally(const char *topic, int transitions, int want, int timeout_ms, tally *t)
{
    char err[512];
    memset(t, 0, sizeof *t);
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    rd_kafka_conf_set(conf, "bootstrap.servers", B.bootstrap, err, sizeof err);
    rd_kafka_conf_set(conf, "group.id", "t1502-reader", err, sizeof err);
    rd_kafka_conf_set(conf, "enable.auto.commit", "false", err, sizeof err);
    rd_kafka_conf_set(conf, "log_level", "0", err, sizeof err);
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_CONSUMER, conf, err, sizeof err);
    if (!rk) return;
    int nparts = 0;
    for (int i = 0; i < 50 && !nparts; i++) {
        const rd_kafka_metadata_t *md = NULL;
        rd_kafka_topic_t *rkt = rd_kafka_topic_new(rk, topic, NULL);
        if (rd_kafka_metadata(rk, 0, rkt, &md, 5000) == RD_KAFKA_RESP_ERR_NO_ERROR) {
            if (md->topic_cnt == 1) nparts = md->topics[0].partition_cnt;
            rd_kafka_metadata_destroy(md);
        }
        rd_kafka_topic_destroy(rkt);
        if (!nparts) usleep(100000);
    }
    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(nparts);
    for (int i = 0; i < nparts; i++)
        rd_kafka_topic_partition_list_add(l, topic, i)->offset = RD_KAFKA_OFFSET_BEGINNING;
    rd_kafka_assign(rk, l);
    rd_kafka_topic_partition_list_destroy(l);
    double t0 = testlib_now();
    while (t->distinct < want && (testlib_now() - t0) * 1000 < timeout_ms) {
        rd_kafka_message_t *m = rd_kafka_consumer_poll(rk, 100);
        if (!m) continue;
        if (!m->err && m->len && memmem(m->payload, m->len, "t1502-roll-", 11))
            tally_message(t, transitions, m);
        rd_kafka_message_destroy(m);
    }
    rd_kafka_destroy_flags(rk, RD_KAFKA_DESTROY_F_NO_CONSUMER_CLOSE);
}

TEST(setup)
{
    (void)px_spans_of, (void)al_test_topic_read, (void)al_test_msgs_free;
    curl_global_init(CURL_GLOBAL_DEFAULT);
    const char *extra[] = {"--brokers", "3", NULL};
    REQUIRE(al_test_broker_start(&B, extra) == 0);
    printf("  three nodes up in %.1f s\n", al_test_broker_cluster.start_s);
    U = fake_upstream_start(0, 1);
    REQUIRE(U);
    snprintf(UPURL, sizeof UPURL, "http://127.0.0.1:%d", fake_upstream_port(U));
    al_test_tmpdir(TMP, sizeof TMP, "proxy");
    REQUIRE(TMP[0]);
    char spool[700], log[700];
    snprintf(spool, sizeof spool, "%s/spool", TMP);
    snprintf(log, sizeof log, "%s/proxy.log", TMP);
    const char *args[] = {"--listen",    "127.0.0.1:0", "--upstream",      UPURL,
                          "--bootstrap", B.bootstrap,   "--spool-dir",     spool,
                          "--drain-timeout", "20",      NULL};
    REQUIRE(px_start(&P, log, args, NULL) == 0);
    credit_pid = start_credit();
    REQUIRE(credit_pid > 0);
}

/* Waits until the spans of rollouts [0, nroll) that agents saw succeed are all on the topic
 * and the ended rollouts' calls all in transitions; checks both. */
static void audit(const char *phase, int nroll, int timeout_ms)
{
    int want_spans = 0, want_tr = 0, ended_n = 0;
    for (int r = 0; r < nroll; r++) {
        want_spans += calls_ok[r];
        if (ended[r]) {
            want_tr += CALLS;
            ended_n++;
        }
    }
    static tally sp, tr;
    double t0 = testlib_now();
    read_tally(AL_TOPIC_SPANS, 0, want_spans, timeout_ms, &sp);
    read_tally(AL_TOPIC_TRANSITIONS, 1, want_tr, timeout_ms, &tr);
    double found_s = testlib_now() - t0;
    int got_spans = sp.distinct, got_tr = tr.distinct;
    int lost_spans = 0, lost_tr = 0, shown = 0;
    for (int r = 0; r < nroll; r++) {
        if (sp.per_roll[r] < calls_ok[r]) lost_spans += calls_ok[r] - sp.per_roll[r];
        if (ended[r] && tr.per_roll[r] < CALLS) {
            lost_tr += CALLS - tr.per_roll[r];
            if (shown++ < 8)
                printf("    t1502-roll-%d: %d of %d calls in transitions; its first span: %s [%d] "
                       "offset %lld\n",
                       r, tr.per_roll[r], CALLS, AL_TOPIC_SPANS, (int)sp.part[r],
                       (long long)sp.off[r]);
        }
    }
    printf("  %s: %d rollouts (%d ended), %d calls succeeded, %ld failed; spans %d (%ld "
           "messages), transitions %d (%ld messages); lost: %d spans, %d transitions (read "
           "in %.1f s)\n",
           phase, nroll, ended_n, want_spans, atomic_load(&failed_calls), got_spans, sp.messages,
           got_tr, tr.messages, lost_spans, lost_tr, found_s);
    if (lost_spans || lost_tr || !ended_n) any_failed = 1;
    CHECKF(lost_spans == 0, "%s: %d calls an agent saw succeed have no span", phase, lost_spans);
    CHECKF(lost_tr == 0, "%s: %d calls of ended rollouts have no transition", phase, lost_tr);
    CHECKF(ended_n > 0, "%s: no rollout ended", phase);
}

/* Lines of credit's log matching the extended regular expression re. */
static int credit_log_count(const char *re)
{
    char cmd[900];
    snprintf(cmd, sizeof cmd, "grep -cE '%s' '%s/credit.log'", re, TMP);
    FILE *f = popen(cmd, "r");
    int n = 0;
    if (!f || fscanf(f, "%d", &n) != 1) n = -1;
    if (f) pclose(f);
    return n;
}

/* Node index (0-based) of the coordinator of credit's group, -1 when unknown. */
static int credit_coordinator(al_test_kafka *k)
{
    rd_kafka_t *rk = al_test_kafka_client(k->bootstrap);
    if (!rk) return -1;
    const struct rd_kafka_group_list *gl = NULL;
    int node = -1;
    if (rd_kafka_list_groups(rk, "arclight-credit", &gl, 5000) == RD_KAFKA_RESP_ERR_NO_ERROR &&
        gl->group_cnt == 1 && gl->groups[0].broker.id > 0)
        node = gl->groups[0].broker.id - 1;
    if (gl) rd_kafka_group_list_destroy(gl);
    rd_kafka_destroy(rk);
    return node;
}

/* Rounds 1-3 kill the leader of arclight.spans [0], round 4 the node coordinating credit's
 * group; each node is started again once another has taken over. Credit must keep its
 * assignment through all of them: a session timeout shorter than a broker failover makes it
 * give its partitions up as lost (and re-emit what it had produced). */
TEST(leader_killed_repeatedly_nothing_acknowledged_is_lost)
{
    al_test_kafka *k = &al_test_broker_cluster;
    pthread_t th[2];
    roll_limit = MAX_ROLL / 2;
    for (int i = 0; i < 2; i++) REQUIRE(pthread_create(&th[i], NULL, agent, NULL) == 0);
    usleep(2000000);
    int lost_before = credit_log_count("kafka: lost [0-9]+ partitions");
    for (int round = 0; round < 4; round++) {
        int coordinator = round == 3;
        const char *what =
            coordinator ? "credit's group coordinator" : "leader of arclight.spans [0]";
        int victim =
            coordinator ? credit_coordinator(k) : al_test_kafka_leader(k, AL_TOPIC_SPANS, 0);
        REQUIREF(victim >= 0, "round %d: no %s", round + 1, what);
        int rolls0 = atomic_load(&n_roll);
        double t0 = testlib_now();
        al_test_kafka_kill(k, victim);
        int moved = -1;
        while (testlib_now() - t0 < 60) {
            moved =
                coordinator ? credit_coordinator(k) : al_test_kafka_leader(k, AL_TOPIC_SPANS, 0);
            if (moved >= 0 && moved != victim) break;
            usleep(200000);
        }
        double took = testlib_now() - t0;
        CHECK(moved >= 0 && moved != victim);
        usleep(2000000);
        REQUIRE(al_test_kafka_restart(k, victim, 120) == 0);
        usleep(3000000);
        printf("  round %d: killed node %d (%s); node %d took over after %.1f s; %d rollouts "
               "in the %.0f s of the round\n",
               round + 1, victim, what, moved, took, atomic_load(&n_roll) - rolls0,
               testlib_now() - t0);
    }
    atomic_store(&stop_agents, 1);
    for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
    CHECK(waitpid(credit_pid, NULL, WNOHANG) == 0); /* credit rode it out */
    int lost = credit_log_count("kafka: lost [0-9]+ partitions") - lost_before;
    int fenced = credit_log_count("was fenced");
    printf("  credit lost its assignment %d times, was fenced %d times\n", lost, fenced);
    CHECKF(lost == 0, "credit gave its partitions up as lost %d times while nodes were killed",
           lost);
    if (lost) any_failed = 1;
    audit("leader kills", atomic_load(&n_roll) > roll_limit ? roll_limit : atomic_load(&n_roll),
          90000);
}

TEST(all_brokers_down_calls_go_on_and_everything_arrives_after)
{
    al_test_kafka *k = &al_test_broker_cluster;
    int before = atomic_load(&n_roll);
    if (before > roll_limit) before = roll_limit;
    atomic_store(&n_roll, before);
    roll_limit = MAX_ROLL;
    atomic_store(&stop_agents, 0);
    long failed_before = atomic_load(&failed_calls);
    for (int i = 0; i < k->n; i++) al_test_kafka_kill(k, i);
    pthread_t th[2];
    for (int i = 0; i < 2; i++) REQUIRE(pthread_create(&th[i], NULL, agent, NULL) == 0);
    usleep(8000000); /* the cluster is away; agents keep calling */
    atomic_store(&stop_agents, 1);
    for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
    int during = atomic_load(&n_roll);
    if (during > roll_limit) during = roll_limit;
    CHECKF(during > before, "no rollout while the cluster was down");
    CHECK_EQ_INT(atomic_load(&failed_calls) - failed_before, 0);
    char url[300];
    px_resp r;
    snprintf(url, sizeof url, "%s/metrics", P.base);
    if (px_http("GET", url, NULL, NULL, &r) == 0) {
        CHECKF(strstr(r.body, "arclight_proxy_spool_spans 0\n") == NULL,
               "the spool holds no spans while every broker is down");
        px_resp_free(&r);
    }
    double t_up = testlib_now();
    for (int i = 0; i < k->n; i++)
        if (k->node[i].pid <= 0) al_test_kafka_spawn(k, i);
    REQUIRE(al_test_kafka_wait_ready(k, 120) == 0);
    printf("  all down: %d rollouts while the cluster was away; it serves again %.1f s after "
           "the restart\n",
           during - before, testlib_now() - t_up);
    audit("all down", during, 120000);
    CHECK(waitpid(credit_pid, NULL, WNOHANG) == 0);
}

/* Prints the last lines of a log of TMP (when a stage died). */
static void log_tail(const char *name)
{
    char cmd[900];
    snprintf(cmd, sizeof cmd, "grep -v 'WARN  rdkafka' '%s/%s' | tail -15 >&2", TMP, name);
    if (system(cmd)) {
    }
}

TEST(zz_teardown)
{
    if (waitpid(credit_pid, NULL, WNOHANG) != 0) log_tail("credit.log");
    printf("  in all: credit lost its assignment %d times, rejoined after a fencing %d times\n",
           credit_log_count("kafka: lost [0-9]+ partitions"), credit_log_count("was fenced"));
    CHECK_EQ_INT(px_stop(&P, SIGTERM, 30), 0);
    kill(credit_pid, SIGTERM);
    int st = 0;
    for (int i = 0; i < 600 && waitpid(credit_pid, &st, WNOHANG) != credit_pid; i++) usleep(50000);
    CHECKF(WIFEXITED(st) && WEXITSTATUS(st) == 0, "credit exit status %d", st);
    fake_upstream_stop(U);
    CHECK_EQ_INT(al_test_broker_stop(&B), 0);
    if (any_failed || getenv("T1502_KEEP")) {
        printf("  logs kept in %s\n", TMP);
        return;
    }
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", TMP);
    CHECK(system(cmd) == 0);
}
