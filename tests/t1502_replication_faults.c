/*
 * t1502: replication and broker faults, Kafka's own way (every acknowledged message is
 * consumed). On three KRaft nodes with arclight's topics at replication 3 and
 * min.insync.replicas=2, agents call through the proxy while credit consumes:
 *   1. the leader of arclight.spans' partition 0 is killed with SIGKILL and started again,
 *      three times: every call an agent saw succeed is a span, and every rollout that ended
 *      has a transition per call;
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

#define MAX_ROLL 6000
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
        px_resp a, b;
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
        usleep(20000);
    }
    return NULL;
}

static pid_t start_credit(void)
{
    char log[700];
    snprintf(log, sizeof log, "%s/credit.log", TMP);
    const char *argv[] = {al_test_bin(), "credit",      "--bootstrap", B.bootstrap,
                          "--estimator", "none",        "--log-level", "info",
                          NULL};
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        FILE *f = freopen(log, "a", stderr);
        (void)f;
        setenv("TMPDIR", TMP, 1);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    return pid;
}

/* Distinct (rollout, sequence) pairs of LLM-call spans per rollout, read from the beginning
 * until `want` spans of this test (calls, rewards, ends) are there or timeout_ms passes. Returns the number of distinct
 * call spans; per_roll[r] gets each rollout's. */
static int spans_per_rollout(int want, int timeout_ms, int *per_roll, int nroll)
{
    px_msgs m;
    px_read_topic(B.bootstrap, AL_TOPIC_SPANS, "t1502-roll-", (size_t)want, timeout_ms, &m);
    static unsigned char seen[MAX_ROLL][8];
    memset(seen, 0, sizeof seen);
    memset(per_roll, 0, sizeof(int) * (size_t)nroll);
    int distinct = 0;
    char err[256];
    for (size_t i = 0; i < m.n; i++) {
        al_span s;
        memset(&s, 0, sizeof s);
        int r;
        if (al_span_decode(m.val[i], m.len[i], &s, err, sizeof err) == 0 &&
            s.kind == AL_SPAN_KIND_LLM_CALL && sscanf(s.rollout_id, "t1502-roll-%d", &r) == 1 && r >= 0 &&
            r < nroll && s.sequence >= 0 && s.sequence < 8 && !seen[r][s.sequence]++) {
            per_roll[r]++;
            distinct++;
        }
        al_span_clear(&s);
    }
    px_msgs_free(&m);
    return distinct;
}

/* Transitions per rollout (distinct call indices), read until `want` or timeout_ms. */
static int transitions_per_rollout(int want, int timeout_ms, int *per_roll, int nroll)
{
    px_msgs m;
    px_read_topic(B.bootstrap, AL_TOPIC_TRANSITIONS, "t1502-roll-", (size_t)want, timeout_ms, &m);
    static unsigned char seen[MAX_ROLL][8];
    memset(seen, 0, sizeof seen);
    memset(per_roll, 0, sizeof(int) * (size_t)nroll);
    int distinct = 0;
    char err[256];
    for (size_t i = 0; i < m.n; i++) {
        al_transition t;
        memset(&t, 0, sizeof t);
        int r;
        if (al_transition_decode(m.val[i], m.len[i], &t, err, sizeof err) == 0 &&
            sscanf(t.rollout_id, "t1502-roll-%d", &r) == 1 && r >= 0 && r < nroll)
            for (size_t k = 0; k < t.n_call_indices; k++) {
                int ci = t.call_indices[k];
                if (ci >= 0 && ci < 8 && !seen[r][ci]++) {
                    per_roll[r]++;
                    distinct++;
                }
            }
        al_transition_clear(&t);
    }
    px_msgs_free(&m);
    return distinct;
}

TEST(setup)
{
    (void)px_spans_of;
    curl_global_init(CURL_GLOBAL_DEFAULT);
    const char *extra[] = {"--brokers", "3", NULL};
    REQUIRE(al_test_broker_start(&B, extra) == 0);
    printf("  three nodes up in %.1f s\n", al_test_broker_cluster.start_s);
    U = fake_upstream_start(0, 1);
    REQUIRE(U);
    snprintf(UPURL, sizeof UPURL, "http://127.0.0.1:%d", fake_upstream_port(U));
    px_tmpdir(TMP, sizeof TMP);
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
    int want_spans = 0, want_all = 0, want_tr = 0, ended_n = 0;
    for (int r = 0; r < nroll; r++) {
        want_spans += calls_ok[r];
        want_all += calls_ok[r] + posted[r];
        if (ended[r]) {
            want_tr += CALLS;
            ended_n++;
        }
    }
    static int per_span[MAX_ROLL], per_tr[MAX_ROLL];
    int got_spans = spans_per_rollout(want_all, timeout_ms, per_span, nroll);
    int got_tr = transitions_per_rollout(want_tr, timeout_ms, per_tr, nroll);
    int lost_spans = 0, lost_tr = 0;
    for (int r = 0; r < nroll; r++) {
        if (per_span[r] < calls_ok[r]) lost_spans += calls_ok[r] - per_span[r];
        if (ended[r] && per_tr[r] < CALLS) lost_tr += CALLS - per_tr[r];
    }
    printf("  %s: %d rollouts (%d ended), %d calls succeeded, %ld failed; spans %d, "
           "transitions %d; lost: %d spans, %d transitions\n",
           phase, nroll, ended_n, want_spans, atomic_load(&failed_calls), got_spans, got_tr,
           lost_spans, lost_tr);
    CHECKF(lost_spans == 0, "%s: %d calls an agent saw succeed have no span", phase, lost_spans);
    CHECKF(lost_tr == 0, "%s: %d calls of ended rollouts have no transition", phase, lost_tr);
    CHECKF(ended_n > 0, "%s: no rollout ended", phase);
}

TEST(leader_killed_repeatedly_nothing_acknowledged_is_lost)
{
    al_test_kafka *k = &al_test_broker_cluster;
    pthread_t th[2];
    roll_limit = MAX_ROLL / 2;
    for (int i = 0; i < 2; i++) REQUIRE(pthread_create(&th[i], NULL, agent, NULL) == 0);
    usleep(2000000);
    for (int round = 0; round < 3; round++) {
        int leader = al_test_kafka_leader(k, AL_TOPIC_SPANS, 0);
        REQUIREF(leader >= 0, "no leader for %s [0]", AL_TOPIC_SPANS);
        double t0 = testlib_now();
        al_test_kafka_kill(k, leader);
        int moved = -1;
        while (testlib_now() - t0 < 60) {
            moved = al_test_kafka_leader(k, AL_TOPIC_SPANS, 0);
            if (moved >= 0 && moved != leader) break;
            usleep(200000);
        }
        printf("  round %d: killed node %d (leader of %s [0]); node %d leads after %.1f s\n",
               round + 1, leader, AL_TOPIC_SPANS, moved, testlib_now() - t0);
        CHECK(moved >= 0 && moved != leader);
        usleep(2000000);
        REQUIRE(al_test_kafka_restart(k, leader, 120) == 0);
        usleep(3000000);
    }
    atomic_store(&stop_agents, 1);
    for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
    CHECK(waitpid(credit_pid, NULL, WNOHANG) == 0); /* credit rode it out */
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
    for (int i = 0; i < k->n; i++)
        if (k->node[i].pid <= 0) al_test_kafka_spawn(k, i);
    REQUIRE(al_test_kafka_wait_ready(k, 120) == 0);
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
    char cmd0[900];
    snprintf(cmd0, sizeof cmd0,
             "printf '  credit rejoined after a fencing %%s times\\n' $(grep -c 'was fenced' '%s/credit.log')",
             TMP);
    if (system(cmd0)) {
    }
    CHECK_EQ_INT(px_stop(&P, SIGTERM, 30), 0);
    kill(credit_pid, SIGTERM);
    int st = 0;
    for (int i = 0; i < 600 && waitpid(credit_pid, &st, WNOHANG) != credit_pid; i++) usleep(50000);
    CHECKF(WIFEXITED(st) && WEXITSTATUS(st) == 0, "credit exit status %d", st);
    fake_upstream_stop(U);
    CHECK_EQ_INT(al_test_broker_stop(&B), 0);
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", TMP);
    CHECK(system(cmd) == 0);
}
