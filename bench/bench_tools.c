/*
 * bench_tools: the topic tools against kcat on the same embedded broker, in the same run.
 *   tail    `arclight tail T --from-beginning` (decodes every value to JSON) against
 *           `kcat -C -J` (JSON envelope, value printed as it is)
 *   record  `arclight record T -o F --codec null|deflate` against `kcat -C` writing the raw
 *           values to a file
 *   replay  `arclight replay F --rate max` against `kcat -P` producing the same number of
 *           messages of the same size from a file
 * Messages are framed DeadLetter values (real arclight messages) with a 200-byte payload.
 * Prints messages/s for each and the ratio arclight / kcat.
 *
 *   build/bench_tools [messages] [payload-bytes]   (default 100000, 200)
 */
#include "broker_fixture.h"

#include "avro/codec.h"

#include <librdkafka/rdkafka.h>
#include <stdint.h>

#ifndef ARCLIGHT_BIN_DEFAULT
#define ARCLIGHT_BIN_DEFAULT "./build/arclight"
#endif

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Runs a shell command; its wall time in seconds, or -1 when it failed. */
static double timed(const char *cmd)
{
    double t0 = now_s();
    int st = system(cmd);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        fprintf(stderr, "bench_tools: failed: %s\n", cmd);
        return -1;
    }
    return now_s() - t0;
}

static int produce(const char *bootstrap, const char *topic, long n, size_t payload,
                   size_t *value_len)
{
    char err[512];
    rd_kafka_conf_t *c = rd_kafka_conf_new();
    rd_kafka_conf_set(c, "bootstrap.servers", bootstrap, err, sizeof err);
    rd_kafka_conf_set(c, "linger.ms", "5", err, sizeof err);
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_PRODUCER, c, err, sizeof err);
    if (!rk) return -1;
    uint8_t *bytes = malloc(payload);
    for (size_t i = 0; i < payload; i++)
        bytes[i] = (uint8_t)(i * 7);
    al_buf b = {0};
    char key[32];
    for (long i = 0; i < n; i++) {
        al_deadletter d;
        memset(&d, 0, sizeof d);
        d.source_topic = "arclight.spans";
        d.partition = (int32_t)(i % 16);
        d.offset = i;
        snprintf(key, sizeof key, "task-%ld", i % 97);
        d.key = (const uint8_t *)key;
        d.key_len = strlen(key);
        d.value = bytes;
        d.value_len = payload;
        d.reason = "bench: a span without a rollout id";
        d.stage = "credit";
        d.source_timestamp_us = -1;
        d.timestamp_us = 1764441000000000 + i;
        if (al_deadletter_encode(&d, &b, err, sizeof err) != 0) return -1;
        while (rd_kafka_producev(rk, RD_KAFKA_V_TOPIC(topic), RD_KAFKA_V_KEY(key, strlen(key)),
                                 RD_KAFKA_V_VALUE(b.data, b.len),
                                 RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
                                 RD_KAFKA_V_END) == RD_KAFKA_RESP_ERR__QUEUE_FULL)
            rd_kafka_poll(rk, 10);
    }
    *value_len = b.len;
    al_buf_free(&b);
    free(bytes);
    int rc = rd_kafka_flush(rk, 60000) == 0 ? 0 : -1;
    rd_kafka_destroy(rk);
    return rc;
}

int main(int argc, char **argv)
{
    long n = argc > 1 ? atol(argv[1]) : 100000;
    size_t payload = argc > 2 ? (size_t)atol(argv[2]) : 200;
    if (n <= 0) n = 100000;
    if (!getenv("ARCLIGHT_BIN")) setenv("ARCLIGHT_BIN", ARCLIGHT_BIN_DEFAULT, 1);
    const char *bin = getenv("ARCLIGHT_BIN");
    if (system("command -v kcat >/dev/null") != 0) {
        fprintf(stderr, "bench_tools: kcat not found (apt-get install kcat)\n");
        return 1;
    }
    al_test_broker b;
    if (al_test_broker_start(&b, NULL) != 0) return 1;
    char reply[256], cmd[2048], dir[] = "/tmp/arclight-bench-tools-XXXXXX";
    if (!mkdtemp(dir)) return 1;
    al_test_broker_control(&b, "create bench.src 16", reply, sizeof reply);
    al_test_broker_control(&b, "create bench.dst 16", reply, sizeof reply);
    al_test_broker_control(&b, "create bench.kcat 16", reply, sizeof reply);
    size_t vlen = 0;
    if (produce(b.bootstrap, "bench.src", n, payload, &vlen) != 0) {
        fprintf(stderr, "bench_tools: producing the input failed\n");
        return 1;
    }
    printf("%ld DeadLetter messages of %zu bytes on 16 partitions of the embedded broker\n", n,
           vlen);

    /* tail */
    snprintf(cmd, sizeof cmd, "kcat -q -C -b %s -t bench.src -o beginning -e -J >/dev/null",
             b.bootstrap);
    double k_tail = timed(cmd);
    snprintf(cmd, sizeof cmd,
             "'%s' tail bench.src --from-beginning --bootstrap %s --log-level warn | wc -l | "
             "grep -qx %ld",
             bin, b.bootstrap, n);
    double a_tail = timed(cmd);

    /* record */
    snprintf(cmd, sizeof cmd, "kcat -q -C -b %s -t bench.src -o beginning -e -D '' >%s/kcat.bin",
             b.bootstrap, dir);
    double k_rec = timed(cmd);
    snprintf(cmd, sizeof cmd,
             "'%s' record bench.src -o %s/null.avro --codec null --bootstrap %s --log-level warn",
             bin, dir, b.bootstrap);
    double a_rec_null = timed(cmd);
    snprintf(cmd, sizeof cmd,
             "'%s' record bench.src -o %s/deflate.avro --codec deflate --bootstrap %s "
             "--log-level warn",
             bin, dir, b.bootstrap);
    double a_rec_deflate = timed(cmd);

    /* replay; kcat's input: n lines of vlen - 1 printable bytes */
    snprintf(cmd, sizeof cmd, "%s/lines.txt", dir);
    FILE *f = fopen(cmd, "w");
    if (!f) return 1;
    for (long i = 0; i < n; i++) {
        for (size_t k = 0; k + 1 < vlen; k++)
            fputc('a' + (int)((i + k) % 26), f);
        fputc('\n', f);
    }
    fclose(f);
    /* the settings arclight's producer runs with (broker-config/client.conf) */
    snprintf(cmd, sizeof cmd,
             "kcat -q -P -b %s -t bench.kcat -X enable.idempotence=true -X acks=all "
             "-X linger.ms=5 -X compression.type=lz4 -l %s/lines.txt",
             b.bootstrap, dir);
    double k_rep = timed(cmd);
    snprintf(cmd, sizeof cmd,
             "'%s' replay %s/deflate.avro --topic-map bench.src=bench.dst --rate max "
             "--bootstrap %s --log-level warn 2>/dev/null",
             bin, dir, b.bootstrap);
    double a_rep = timed(cmd);

    if (k_tail < 0 || a_tail < 0 || k_rec < 0 || a_rec_null < 0 || a_rec_deflate < 0 || k_rep < 0 ||
        a_rep < 0)
        return 1;
    printf("  tail    kcat -C -J (reference)   %9.0f msg/s   arclight tail (decoded JSON) "
           "%9.0f msg/s   ratio %.2f\n",
           n / k_tail, n / a_tail, k_tail / a_tail);
    printf("  record  kcat -C > file (reference) %7.0f msg/s   arclight record, null    "
           "%9.0f msg/s   ratio %.2f\n",
           n / k_rec, n / a_rec_null, k_rec / a_rec_null);
    printf("                                                   arclight record, deflate "
           "%9.0f msg/s   ratio %.2f\n",
           n / a_rec_deflate, k_rec / a_rec_deflate);
    printf("  replay  kcat -P (reference)      %9.0f msg/s   arclight replay --rate max   "
           "%9.0f msg/s   ratio %.2f\n",
           n / k_rep, n / a_rep, k_rep / a_rep);
    printf("  (each time includes process start and connecting; ratio = arclight msg/s over "
           "kcat msg/s)\n");
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "bench_tools: could not remove %s\n", dir);
    al_test_broker_stop(&b);
    return 0;
}
