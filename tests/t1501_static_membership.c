/* t1501: group membership across restarts (lib/kafka/member.c).
 *
 * On real Kafka (t1501_static_membership_kafka) membership is static: a credit worker killed
 * with SIGKILL and started again takes the same group.instance.id (host name, group, slot)
 * and gets its partitions back without waiting for the dead member's session to time out
 * (the same restart with dynamic membership, ARCLIGHT_INSTANCE_ID=none, must wait for it); a
 * second worker on the same host takes the next slot and does not fence the first.
 *
 * On the embedded broker (librdkafka's mock cluster, whose JoinGroup takes an instance id
 * but keeps no static members, so that a static restart there used to wait out the dead
 * member's whole 45 s session, and two restarts in a row two minutes) a worker joins as a
 * dynamic member with a short session: with the default client settings, a worker killed
 * twice, ten seconds apart, has its partitions back within 10 s each time. */
#include "testlib.h"
#include "support.h"

#include "broker_fixture.h"

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>

#define SESSION_MS 6000
#define AL_TEST_EMBEDDED_SESSION_S 4 /* AL_MEMBER_EMBEDDED_SESSION_MS */

static al_test_broker broker;
static char dir[128];

/* `arclight credit` on t1501.in as group t1501 with its stderr in log; env: extra
 * "NAME=VALUE" (may be NULL). */
static pid_t credit_start(const char *log, const char *env)
{
    const char *argv[] = {al_test_bin(), "credit",     "--bootstrap", broker.bootstrap,
                          "--input",     "t1501.in",   "--output",    "t1501.out",
                          "--group",     "t1501",      "--log-level", "info",
                          NULL};
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        FILE *f = freopen(log, "w", stderr);
        (void)f;
        if (broker.kafka) { /* the embedded broker runs on the default client settings */
            char sess[16];
            snprintf(sess, sizeof sess, "%d", SESSION_MS);
            setenv("ARCLIGHT_KAFKA_SESSION_TIMEOUT_MS", sess, 1);
            setenv("ARCLIGHT_KAFKA_HEARTBEAT_INTERVAL_MS", "500", 1);
        }
        setenv("TMPDIR", dir, 1); /* the member slots' lock files: this test's own */
        if (env) putenv((char *)env);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    return pid;
}

/* Partitions the worker holds now by its log ("assigned N partitions (M now)", "revoked N
 * partitions (M left)": the last M), -1 before its first assignment. */
static int held_now(const char *log)
{
    FILE *f = fopen(log, "r");
    if (!f) return -1;
    char line[2048];
    int held = -1;
    while (fgets(line, sizeof line, f)) {
        const char *p;
        int a, m;
        if ((p = strstr(line, "kafka: assigned ")) && sscanf(p, "kafka: assigned %d partitions (%d now)", &a, &m) == 2)
            held = m;
        if (((p = strstr(line, "kafka: revoked ")) && sscanf(p, "kafka: revoked %d partitions (%d left)", &a, &m) == 2) ||
            ((p = strstr(line, "kafka: lost ")) && sscanf(p, "kafka: lost %d partitions (%d left)", &a, &m) == 2))
            held = m;
    }
    fclose(f);
    return held;
}

/* Seconds until the worker's log says it holds `want` partitions; -1 after timeout_s. */
static double wait_held(const char *log, int want, double timeout_s)
{
    double t0 = testlib_now();
    while (testlib_now() - t0 < timeout_s) {
        if (held_now(log) == want) return testlib_now() - t0;
        usleep(50000);
    }
    return -1;
}

static int file_has(const char *log, const char *text)
{
    FILE *f = fopen(log, "r");
    if (!f) return 0;
    char line[2048];
    int found = 0;
    while (!found && fgets(line, sizeof line, f))
        found = strstr(line, text) != NULL;
    fclose(f);
    return found;
}

static void kill9(pid_t pid)
{
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
}

TEST(setup)
{
    REQUIRE(al_test_tmpdir(dir, sizeof dir, "t1501"));
    REQUIRE(al_test_broker_start(&broker, NULL) == 0);
    char reply[128];
    REQUIRE(al_test_broker_control(&broker, "create t1501.in 4", reply, sizeof reply) == 0);
    REQUIRE(al_test_broker_control(&broker, "create t1501.out 4", reply, sizeof reply) == 0);
}

/* Starts a worker, waits for its 4 partitions, kills it, starts it again: the seconds the
 * second one took to hold all 4 (-1: never, within 3 session timeouts). */
static double restart_time(const char *env, const char *name)
{
    char log1[256], log2[256];
    snprintf(log1, sizeof log1, "%s/%s-1.log", dir, name);
    snprintf(log2, sizeof log2, "%s/%s-2.log", dir, name);
    pid_t a = credit_start(log1, env);
    double first = wait_held(log1, 4, 60);
    if (first < 0) {
        fprintf(stderr, "  the first worker never held the 4 partitions\n");
        kill9(a);
        return -1;
    }
    usleep(1500000); /* a few heartbeats: the group is stable */
    kill9(a);
    pid_t b = credit_start(log2, env);
    double again = wait_held(log2, 4, 3.0 * SESSION_MS / 1000 + 10);
    printf("  %s: first assignment %.2f s, after kill -9 and restart %.2f s (session timeout "
           "%.1f s)\n",
           name, first, again, SESSION_MS / 1000.0);
    kill9(b);
    return again;
}

TEST(a_restarted_worker_gets_its_partitions_back_at_once)
{
    if (!broker.kafka) return; /* embedded: the next test */
    double st = restart_time(NULL, "static");
    REQUIRE(st >= 0);
    char log[256];
    snprintf(log, sizeof log, "%s/static-2.log", dir);
    CHECKF(file_has(log, "static member") && file_has(log, ".t1501.0"),
           "the worker did not join as static member <host>.t1501.0");
    CHECKF(st < SESSION_MS / 1000.0 / 2, "the restart took %.2f s to get its partitions back", st);
    /* the same with dynamic membership waits for the dead member's session timeout */
    double dyn = restart_time("ARCLIGHT_INSTANCE_ID=none", "dynamic");
    CHECKF(dyn > SESSION_MS / 1000.0 / 2, "a dynamic restart took only %.2f s", dyn);
    CHECK(st < dyn);
    /* the next test's group starts empty */
    usleep((SESSION_MS + 1000) * 1000);
}

/* The embedded broker: killed twice, ten seconds apart, each successor holds the 4 partitions
 * within 10 s, on the default session settings (45 s in broker-config/client.conf). */
TEST(a_worker_killed_twice_on_the_embedded_broker_is_back_within_10s)
{
    if (broker.kafka) return;
    char log[3][256];
    for (int i = 0; i < 3; i++)
        snprintf(log[i], sizeof log[i], "%s/embedded-%d.log", dir, i + 1);
    pid_t w = credit_start(log[0], NULL);
    REQUIRE(wait_held(log[0], 4, 60) >= 0);
    CHECKF(file_has(log[0], "keeps no static members"),
           "the worker did not say it joins as a dynamic member on the embedded broker");
    usleep(1500000); /* a few heartbeats: the group is stable */
    for (int i = 1; i < 3; i++) {
        double t0 = testlib_now();
        kill9(w);
        w = credit_start(log[i], NULL);
        double back = wait_held(log[i], 4, 60);
        printf("  kill -9 number %d: the next worker held the 4 partitions after %.2f s\n", i,
               back);
        CHECKF(back >= 0 && back < 10, "after kill -9 number %d the partitions took %.2f s", i,
               back);
        double left = 10 - (testlib_now() - t0);
        if (i == 1 && left > 0) usleep((useconds_t)(left * 1e6)); /* ten seconds apart */
    }
    kill9(w);
    usleep((AL_TEST_EMBEDDED_SESSION_S + 1) * 1000000); /* the next test's group starts empty */
}

TEST(two_workers_on_one_host_take_two_slots)
{
    char log1[256], log2[256];
    snprintf(log1, sizeof log1, "%s/two-1.log", dir);
    snprintf(log2, sizeof log2, "%s/two-2.log", dir);
    pid_t a = credit_start(log1, NULL);
    REQUIRE(wait_held(log1, 4, 60) >= 0);
    pid_t b = credit_start(log2, NULL);
    /* cooperative-sticky hands the second worker half of the partitions */
    double t0 = testlib_now();
    int ha = -1, hb = -1;
    while (testlib_now() - t0 < 60) {
        ha = held_now(log1);
        hb = held_now(log2);
        if (ha == 2 && hb == 2) break;
        usleep(100000);
    }
    CHECKF(ha == 2 && hb == 2, "partitions held: %d and %d", ha, hb);
    if (broker.kafka) { /* the embedded broker: dynamic members, no slots */
        CHECK(file_has(log1, ".t1501.0"));
        CHECK(file_has(log2, ".t1501.1"));
    }
    CHECK(!file_has(log1, "another consumer joined") && !file_has(log2, "another consumer"));
    int st;
    CHECK(waitpid(a, &st, WNOHANG) == 0); /* neither was fenced */
    CHECK(waitpid(b, &st, WNOHANG) == 0);
    kill9(a);
    kill9(b);
}

TEST(zz_teardown)
{
    CHECK_EQ_INT(al_test_broker_stop(&broker), 0);
    char cmd[200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    CHECK(system(cmd) == 0);
}
