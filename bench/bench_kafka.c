/*
 * bench_kafka: produce + consume N MB with arclight's wrapper (al_producer: idempotent,
 * acks=all, lz4; al_consumer: group member with offset tracking), against kcat producing and
 * consuming the same bytes with the same client settings, in the same run, against the same
 * broker: first the embedded broker, then a one-node Apache Kafka (tests/kafka_fixture.h).
 * Prints MB/s for both and the ratio wrapper / kcat for each broker.
 *
 *   bench_kafka [MB] [message-bytes] [repetitions] [brokers]
 *     default 32 MB of 1000-byte messages, 3 repetitions, brokers "embedded,kafka"
 *
 * Needs the arclight binary (ARCLIGHT_BIN, else the one built with this benchmark), kcat and,
 * for the Kafka part, the broker scripts/setup.sh fetches (ARCLIGHT_TEST_KAFKA_LIBS, else
 * build-kafka/libs under the working directory).
 */
#include "broker_fixture.h"
#include "core/log.h"
#include "kafka/kafka.h"

#include <stdint.h>

#ifndef ARCLIGHT_BIN_DEFAULT
#define ARCLIGHT_BIN_DEFAULT "./build/arclight"
#endif

#define PARTITIONS 16

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Text lines (kcat splits its input on newlines): message i is a decimal counter padded with
 * pseudo-random lowercase letters; lz4 squeezes them a little, like JSON would be. */
static void make_message(char *buf, size_t len, long i, uint64_t *rng)
{
    int n = snprintf(buf, len, "%010ld:", i);
    for (size_t k = (size_t)n; k < len; k++) {
        *rng ^= *rng << 13;
        *rng ^= *rng >> 7;
        *rng ^= *rng << 17;
        buf[k] = (char)('a' + (*rng % 20));
    }
}

/* The settings both clients run with (kcat gets them as -X key=value). Keys (the message's
 * first 10 bytes) spread messages evenly over the partitions: the embedded broker keeps only
 * ~5 MiB per partition. */
static const char *const common_settings[][2] = {
    {"enable.idempotence", "true"},  {"acks", "all"},
    {"compression.type", "lz4"},     {"linger.ms", "5"},
    {"batch.num.messages", "10000"}, {"partitioner", "murmur2_random"},
};

static int run_wrapper(const char *bootstrap, const char *topic, const char *group, long n,
                       size_t msglen, double *t_prod, double *t_cons)
{
    char errstr[512];
    al_kafka_conf *c = al_kafka_conf_load(NULL, bootstrap, errstr, sizeof errstr);
    if (!c) return -1;
    for (size_t i = 0; i < sizeof common_settings / sizeof common_settings[0]; i++)
        al_kafka_conf_set(c, common_settings[i][0], common_settings[i][1]);
    al_kafka_conf_set(c, "session.timeout.ms", "3000");
    al_producer *p = al_producer_new(c, errstr, sizeof errstr);
    if (!p) {
        fprintf(stderr, "bench: %s\n", errstr);
        al_kafka_conf_free(c);
        return -1;
    }
    char *buf = malloc(msglen);
    uint64_t rng = 0x9E3779B97F4A7C15ULL;
    double t0 = now_s();
    for (long i = 0; i < n; i++) {
        make_message(buf, msglen, i, &rng);
        if (al_producer_send(p, topic, buf, 10, buf + 11, msglen - 11, NULL, NULL) != 0) {
            fprintf(stderr, "bench: send failed\n");
            return -1;
        }
    }
    if (al_producer_flush(p, 120000, errstr, sizeof errstr) != 0) {
        fprintf(stderr, "bench: %s\n", errstr);
        return -1;
    }
    *t_prod = now_s() - t0;
    free(buf);

    /* Consume as a stage would: group member, every message an input whose offset is stored. */
    al_consumer *cons = al_consumer_new(c, group, NULL, errstr, sizeof errstr);
    al_kafka_conf_free(c);
    if (!cons) return -1;
    const char *topics[] = {topic};
    al_consumer_subscribe(cons, topics, 1, errstr, sizeof errstr);
    long got = 0, gap_at = 0;
    double first = 0, last = 0, maxgap = 0;
    t0 = now_s();
    while (got < n && now_s() - t0 < 300) {
        rd_kafka_message_t *m;
        int r = al_consumer_poll(cons, 100, &m, errstr, sizeof errstr);
        if (r < 0) {
            fprintf(stderr, "bench: %s\n", errstr);
            break;
        }
        if (r == 0) continue;
        double tn = now_s();
        if (!got) first = tn;
        if (got && tn - last > maxgap) {
            maxgap = tn - last;
            gap_at = got;
        }
        last = tn;
        got++;
        al_consumer_input_skip(cons, m);
        rd_kafka_message_destroy(m);
    }
    /* From the first message on: the group join (same for any client) is not throughput. */
    *t_cons = now_s() - first;
    if (getenv("BENCH_KAFKA_DEBUG"))
        fprintf(stderr, "consume: longest gap %.3f s before message %ld\n", maxgap, gap_at);
    al_consumer_free(cons);
    al_producer_free(p);
    return got == n ? 0 : -1;
}

/* Runs a shell command line; 0 on exit status 0. */
static int sh(const char *cmd)
{
    int st = system(cmd);
    return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : -1;
}

static int run_kcat(const char *bootstrap, const char *topic, long n, size_t msglen, double *t_prod,
                    double *t_cons)
{
    char path[] = "/tmp/bench_kafka.XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) return -1;
    FILE *f = fdopen(fd, "w");
    char *buf = malloc(msglen + 1);
    uint64_t rng = 0x9E3779B97F4A7C15ULL;
    for (long i = 0; i < n; i++) {
        make_message(buf, msglen, i, &rng);
        buf[msglen] = '\n';
        fwrite(buf, 1, msglen + 1, f);
    }
    fclose(f);
    free(buf);
    char xs[512] = "";
    size_t off = 0;
    for (size_t i = 0; i < sizeof common_settings / sizeof common_settings[0]; i++)
        off += (size_t)snprintf(xs + off, sizeof xs - off, " -X %s=%s", common_settings[i][0],
                                common_settings[i][1]);
    char cmd[2048];
    /* -l: one message per line of the file, exits when all are delivered; -K: the key is
     * what comes before the first ':' (the 10-digit counter), as the wrapper sends it. */
    snprintf(cmd, sizeof cmd, "kcat -q -P -b %s -t %s%s -K: -l %s", bootstrap, topic, xs, path);
    double t0 = now_s();
    int rc = sh(cmd);
    *t_prod = now_s() - t0;
    unlink(path);
    if (rc) return -1;
    /* Simple (assign-based) consumer from the beginning until n messages; it prints only each
     * offset (no payload copying to a pipe), wc counts them. */
    snprintf(cmd, sizeof cmd,
             "test \"$(kcat -q -C -b %s -t %s -o beginning -c %ld -f '%%o\\n' | wc -l)\" -eq %ld",
             bootstrap, topic, n, n);
    t0 = now_s();
    rc = sh(cmd);
    *t_cons = now_s() - t0;
    /* kcat's fixed cost (process start, connect, metadata, first fetch), measured with one
     * message, is taken off: the wrapper's clock starts at its first message too. */
    snprintf(cmd, sizeof cmd, "kcat -q -C -b %s -t %s -o beginning -c 1 >/dev/null", bootstrap,
             topic);
    t0 = now_s();
    if (rc == 0 && sh(cmd) == 0) {
        double fixed = now_s() - t0;
        if (*t_cons - fixed > 0.001) *t_cons -= fixed;
    }
    return rc;
}

/* Alternating repetitions on one broker, each on fresh topics; prints the best of each (the
 * machine is shared, so the best run is the least disturbed one). 0, or -1 when a run failed
 * or the broker did not start. */
static int bench_broker(int kafka, long n, size_t msglen, int reps, double ratio[2])
{
    al_test_broker b;
    const char *quiet[] = {"--log-level", "error", NULL};
    if (kafka)
        setenv("ARCLIGHT_TEST_BROKER", "kafka", 1);
    else
        unsetenv("ARCLIGHT_TEST_BROKER");
    if (al_test_broker_start(&b, kafka ? NULL : quiet) != 0) return -1;
    al_log_set_level(AL_LOG_LEVEL_WARN);
    double best[4] = {1e9, 1e9, 1e9, 1e9}; /* kcat prod, kcat cons, wrapper prod, cons */
    int failed = 0;
    for (int r = 0; r < reps && !failed; r++) {
        char reply[256], cmd[128], tk[64], tw[64], group[64];
        double t[4];
        snprintf(tk, sizeof tk, "bench.kcat.%d", r);
        snprintf(tw, sizeof tw, "bench.wrapper.%d", r);
        snprintf(group, sizeof group, "bench-wrapper-%d", r);
        snprintf(cmd, sizeof cmd, "create %s %d", tk, PARTITIONS);
        al_test_broker_control(&b, cmd, reply, sizeof reply);
        snprintf(cmd, sizeof cmd, "create %s %d", tw, PARTITIONS);
        al_test_broker_control(&b, cmd, reply, sizeof reply);
        if (run_kcat(b.bootstrap, tk, n, msglen, &t[0], &t[1]) != 0 ||
            run_wrapper(b.bootstrap, tw, group, n, msglen, &t[2], &t[3]) != 0) {
            fprintf(stderr, "bench_kafka: repetition %d failed\n", r + 1);
            failed = 1;
        }
        for (int k = 0; k < 4 && !failed; k++)
            if (t[k] < best[k]) best[k] = t[k];
    }
    al_test_broker_stop(&b);
    if (failed) return -1;
    double bytes = (double)n * (double)msglen / 1e6;
    printf("%s, %d partitions, %ld messages of %zu bytes (%.1f MB), lz4, acks=all, "
           "idempotent, best of %d\n",
           kafka ? "Apache Kafka 4.1.1, one node" : "embedded broker", PARTITIONS, n, msglen,
           bytes, reps);
    ratio[0] = best[0] / best[2];
    ratio[1] = best[1] / best[3];
    printf(
        "  produce  kcat (reference) %7.1f MB/s   arclight al_producer %7.1f MB/s   ratio %.2f\n",
        bytes / best[0], bytes / best[2], ratio[0]);
    printf(
        "  consume  kcat (reference) %7.1f MB/s   arclight al_consumer %7.1f MB/s   ratio %.2f\n",
        bytes / best[1], bytes / best[3], ratio[1]);
    fflush(stdout);
    return 0;
}

int main(int argc, char **argv)
{
    double mb = argc > 1 ? atof(argv[1]) : 32;
    size_t msglen = argc > 2 ? (size_t)atol(argv[2]) : 1000;
    int reps = argc > 3 ? atoi(argv[3]) : 3;
    const char *which = argc > 4 ? argv[4] : "embedded,kafka";
    int on_embedded = strstr(which, "embedded") != NULL, on_kafka = strstr(which, "kafka") != NULL;
    if (mb <= 0 || mb > 60 || msglen < 16 || msglen > 100000 || reps < 1 || reps > 20 ||
        (!on_embedded && !on_kafka)) {
        fprintf(stderr, "usage: bench_kafka [MB (<= 60: the embedded broker keeps ~5 MiB per "
                        "partition)] [message-bytes 16..100000] [repetitions 1..20] "
                        "[embedded,kafka]\n");
        return 2;
    }
    if (!getenv("ARCLIGHT_BIN")) setenv("ARCLIGHT_BIN", ARCLIGHT_BIN_DEFAULT, 1);
    if (sh("command -v kcat >/dev/null") != 0) {
        fprintf(stderr, "bench_kafka: kcat not found (apt-get install kcat)\n");
        return 1;
    }
    long n = (long)(mb * 1e6 / (double)msglen);
    double re[2] = {0, 0}, rk[2] = {0, 0};
    if (on_embedded && bench_broker(0, n, msglen, reps, re) != 0) return 1;
    if (on_kafka && bench_broker(1, n, msglen, reps, rk) != 0) return 1;
    printf("  (ratio = arclight throughput / kcat throughput. Consume: arclight's clock starts at\n"
           "   its first message, after the group join; kcat's time less the time kcat takes to\n"
           "   start and read one message; kcat assigns partitions without a group)\n");
    if (on_kafka)
        printf("Apache Kafka: produce %.2f, consume %.2f of kcat (target 0.90 both ways: %s)\n",
               rk[0], rk[1], rk[0] >= 0.9 && rk[1] >= 0.9 ? "met" : "NOT met");
    return 0;
}
