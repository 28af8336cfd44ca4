/*
 * bench_batch: the batching stage on a realistic length distribution: sequence lengths
 * (prompt + response) lognormal with median 1,000 tokens (sigma 1.0), clipped to 100..8,000,
 * groups of 8, a step of 256 sequences, 16,384-token micro-batches.
 *
 *   1. In process: decode + batcher (grouping, FFD packing, chunk encoding) on framed
 *      Transition messages, against decoding the same messages alone (the floor any
 *      consumer pays), as a ratio; packing efficiency (real tokens / capacity) per step size.
 *   2. Over TCP: `arclight batch` consuming a topic of the same transitions on the embedded
 *      broker, against kcat consuming the same topic, as a ratio of transitions/s. The stage's
 *      time runs from its first message to its last step acknowledged (it logs it; start-up
 *      and the group join are left out); kcat's is `kcat -C -c N` less `kcat -C -c 1` (its
 *      start-up and first fetch). Skipped when kcat or the arclight binary is missing.
 *
 *   cmake --build build --target bench && build/bench_batch [transitions]
 */
#include "batch/batcher.h"
#include "broker_fixture.h"

#include <librdkafka/rdkafka.h>
#include <malloc.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static uint64_t rng = 0x2545F4914F6CDD1DULL;
static double unif(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return ((double)(rng >> 11) + 0.5) / 9007199254740992.0;
}

static int lognormal_len(void)
{
    for (;;) {
        double z = sqrt(-2 * log(unif())) * cos(2 * M_PI * unif());
        double L = exp(log(1000.0) + 1.0 * z);
        if (L >= 100 && L <= 8000) return (int)L;
    }
}

typedef struct msgs {
    al_buf *m;
    size_t n;
    int64_t tokens;
} msgs;

/* n transitions, groups of 8 in order, prompt 60% of each sequence. */
static void make_messages(msgs *out, size_t n)
{
    static int32_t toks[8000];
    static uint8_t mask[8000];
    static float lp[8000];
    for (int i = 0; i < 8000; i++) {
        toks[i] = (i * 7919) % 151000;
        mask[i] = 1;
        lp[i] = -0.25f;
    }
    out->m = calloc(n, sizeof *out->m);
    out->n = n;
    out->tokens = 0;
    for (size_t i = 0; i < n; i++) {
        int L = lognormal_len(), np = L * 6 / 10, nr = L - np;
        char id[64], gid[32], rid[32], task[32];
        snprintf(rid, sizeof rid, "rollout-%zu", i);
        snprintf(id, sizeof id, "%s:0:0", rid);
        snprintf(gid, sizeof gid, "group-%zu", i / 8);
        snprintf(task, sizeof task, "task-%zu", i / 8);
        al_transition t = {
            .id = id, .group_key = task, .group_id = gid, .group_size = 8, .task_id = task,
            .rollout_id = rid, .prompt_token_ids = toks, .n_prompt_tokens = (size_t)np,
            .response_token_ids = toks + np, .n_response_tokens = (size_t)nr,
            .loss_mask = mask, .n_loss_mask = (size_t)nr, .rollout_logprobs = lp,
            .n_rollout_logprobs = (size_t)nr, .advantage = (double)(i % 8) - 3.5,
            .estimator = "grpo", .policy_version = 0, .model = "bench",
        };
        char err[256];
        if (al_transition_encode(&t, &out->m[i], err, sizeof err)) {
            fprintf(stderr, "bench_batch: %s\n", err);
            exit(1);
        }
        out->tokens += L;
    }
}

typedef struct run_result {
    double seconds;
    int64_t steps, tokens, capacity, bytes_out;
} run_result;

/* Decode + batcher over every message; steps are taken as they become ready. */
static run_result run_batcher(const msgs *in, int64_t step_seqs, int64_t budget)
{
    al_batch_config c;
    al_batch_config_default(&c);
    c.step_sequences = step_seqs;
    c.micro_batch_tokens = budget;
    c.max_message_bytes = 10485760 - 65536;
    c.max_staleness = -1;
    char err[256];
    al_batcher *b = al_batcher_new(&c, err, sizeof err);
    if (!b) {
        fprintf(stderr, "bench_batch: %s\n", err);
        exit(1);
    }
    al_transition t = {0};
    run_result r = {0};
    double t0 = now_s();
    for (size_t i = 0; i < in->n; i++) {
        if (al_transition_decode(in->m[i].data, in->m[i].len, &t, err, sizeof err) ||
            al_batcher_add(b, &t, 0, 0, NULL, err, sizeof err) != AL_BATCH_ADDED) {
            fprintf(stderr, "bench_batch: %s\n", err);
            exit(1);
        }
        al_batch_step *st;
        while (al_batcher_next_step(b, &st, err, sizeof err) == 1) {
            r.steps++;
            r.tokens += st->n_tokens;
            r.capacity += st->capacity_tokens;
            for (size_t k = 0; k < st->n_chunks; k++) r.bytes_out += (int64_t)st->chunks[k].len;
            al_batch_step_free(st);
        }
    }
    r.seconds = now_s() - t0;
    al_transition_clear(&t);
    al_batcher_free(b);
    return r;
}

static double run_decode_only(const msgs *in)
{
    al_transition t = {0};
    char err[256];
    volatile int64_t sink = 0;
    double t0 = now_s();
    for (size_t i = 0; i < in->n; i++) {
        if (al_transition_decode(in->m[i].data, in->m[i].len, &t, err, sizeof err)) exit(1);
        sink += (int64_t)t.n_response_tokens;
    }
    double s = now_s() - t0;
    al_transition_clear(&t);
    return s;
}

/* ---- over TCP ------------------------------------------------------------------------- */

static double run_cmd(const char *cmd, char *out, size_t outlen)
{
    double t0 = now_s();
    FILE *f = popen(cmd, "r");
    if (!f) return -1;
    size_t n = fread(out, 1, outlen - 1, f);
    out[n] = '\0';
    int st = pclose(f);
    double s = now_s() - t0;
    return st == 0 ? s : -1;
}

static void over_tcp(const msgs *in, size_t n, int64_t step_seqs)
{
    if (system("command -v kcat >/dev/null 2>&1") != 0 || access(al_test_bin(), X_OK) != 0) {
        printf("over TCP: skipped (kcat or %s missing)\n", al_test_bin());
        return;
    }
    char topics[96];
    snprintf(topics, sizeof topics, "/tmp/arclight-bench-batch-%d.conf", (int)getpid());
    FILE *f = fopen(topics, "w");
    fputs("bench.transitions 16 1\narclight.batches 8 1\narclight.policy 1 1\narclight.deadletter 1 1\n", f);
    fclose(f);
    al_test_broker b;
    const char *extra[] = {"--topics", topics, NULL};
    if (al_test_broker_start(&b, extra) != 0) {
        unlink(topics);
        return;
    }
    char err[512];
    rd_kafka_conf_t *c = rd_kafka_conf_new();
    rd_kafka_conf_set(c, "bootstrap.servers", b.bootstrap, err, sizeof err);
    rd_kafka_conf_set(c, "linger.ms", "5", err, sizeof err);
    rd_kafka_t *p = rd_kafka_new(RD_KAFKA_PRODUCER, c, err, sizeof err);
    int64_t bytes = 0;
    for (size_t i = 0; i < n; i++) {
        char key[32];
        snprintf(key, sizeof key, "task-%zu", i / 8);
        while (rd_kafka_producev(p, RD_KAFKA_V_TOPIC("bench.transitions"),
                                 RD_KAFKA_V_KEY(key, strlen(key)),
                                 RD_KAFKA_V_VALUE(in->m[i].data, in->m[i].len),
                                 RD_KAFKA_V_END) == RD_KAFKA_RESP_ERR__QUEUE_FULL)
            rd_kafka_poll(p, 10);
        bytes += (int64_t)in->m[i].len;
    }
    rd_kafka_flush(p, 30000);
    rd_kafka_destroy(p);

    static char out[1 << 16];
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "kcat -C -b %s -t bench.transitions -o beginning -c %zu -q -f '%%o\\n' | wc -l",
             b.bootstrap, n);
    /* the mock cluster sometimes stalls a fetch for ~0.5-1 s: best of three */
    double kcat_wall = 1e9;
    long kcat_n = 0;
    for (int rep = 0; rep < 3; rep++) {
        double t = run_cmd(cmd, out, sizeof out);
        if (t >= 0 && t < kcat_wall) kcat_wall = t;
        kcat_n = atol(out);
    }
    /* kcat's fixed cost (start, connect, metadata, offsets, first fetch): the same run stopped
     * after its first message, taken off its time; what is left is consuming */
    snprintf(cmd, sizeof cmd,
             "kcat -C -b %s -t bench.transitions -o beginning -c 1 -q -f '%%o\\n' | wc -l",
             b.bootstrap);
    double kcat_fixed = 1e9;
    for (int rep = 0; rep < 3; rep++) {
        double t = run_cmd(cmd, out, sizeof out);
        if (t >= 0 && t < kcat_fixed) kcat_fixed = t;
    }
    double kcat_s = kcat_wall - kcat_fixed;
    snprintf(cmd, sizeof cmd,
             "%s batch --bootstrap %s --input-topic bench.transitions --step-sequences %lld "
             "--micro-batch-tokens 16384 --max-staleness -1 --group-idle-ms 50 --steps %lld "
             "--log-level %s 2>/tmp/arclight-bench-batch.log; grep 'transitions/s' "
             "/tmp/arclight-bench-batch.log",
             al_test_bin(), b.bootstrap, (long long)step_seqs, (long long)(n / (size_t)step_seqs),
             getenv("BENCH_BATCH_LOG") ? getenv("BENCH_BATCH_LOG") : "info");
    double wall = run_cmd(cmd, out, sizeof out); /* the stage's log stays in /tmp */
    const char *k = strstr(out, "consumed ");
    long got = 0;
    double sec = 0;
    const char *in_s = k ? strstr(k, " in ") : NULL;
    if (k) got = atol(k + 9);
    if (in_s) sec = atof(in_s + 4);
    if (kcat_s > 0.01 && sec > 0 && kcat_n == (long)n) {
        double kr = (double)kcat_n / kcat_s, br = (double)got / sec;
        printf("over TCP (%zu transitions, %.1f MB, 16 partitions):\n", n, (double)bytes / 1e6);
        printf("  kcat -C (reference)   %9.0f transitions/s  %7.1f MB/s  (%.3f s: %.3f s run less "
               "%.3f s to its first message)\n",
               kr, (double)bytes / 1e6 / kcat_s, kcat_s, kcat_wall, kcat_fixed);
        printf("  arclight batch        %9.0f transitions/s  %7.1f MB/s  (%.3f s, first message to "
               "last step; %.1f s with start-up and group join)\n",
               br, (double)bytes / 1e6 / sec, sec, wall);
        printf("  ratio batch / kcat    %9.2f\n", br / kr);
    } else {
        printf("over TCP: no result (kcat %.3f s, %ld messages; batch said: %s)\n", kcat_s, kcat_n, out);
    }
    al_test_broker_stop(&b);
    unlink(topics);
}

int main(int argc, char **argv)
{
    /* the allocator settings `arclight batch` runs with (stages/batch/main.c) */
    mallopt(M_TRIM_THRESHOLD, 512 << 20);
    mallopt(M_MMAP_THRESHOLD, 64 << 20);
    size_t n = argc > 1 ? (size_t)atol(argv[1]) : 8192;
    if (n < 512) n = 512;
    n -= n % 256;
    msgs in;
    make_messages(&in, n);
    printf("bench_batch: %zu transitions, %lld tokens (mean %.0f), lognormal median 1000, "
           "clipped 100..8000, groups of 8, 16384-token micro-batches\n",
           n, (long long)in.tokens, (double)in.tokens / (double)n);
    int64_t bytes = 0;
    for (size_t i = 0; i < n; i++) bytes += (int64_t)in.m[i].len;

    double dec = 1e9;
    for (int rep = 0; rep < 3; rep++) {
        double s = run_decode_only(&in);
        if (s < dec) dec = s;
    }
    printf("in process:\n  decode only (reference)        %9.0f transitions/s  %7.1f MB/s\n",
           (double)n / dec, (double)bytes / 1e6 / dec);
    const int64_t steps[] = {64, 256, 1024};
    int64_t only = argc > 2 ? atol(argv[2]) : 0; /* profiling one step size */
    for (size_t k = 0; k < 3; k++) {
        if (only && steps[k] != only) continue;
        run_result best = {0};
        for (int rep = 0; rep < 3; rep++) {
            run_result r = run_batcher(&in, steps[k], 16384);
            if (!best.seconds || r.seconds < best.seconds) best = r;
        }
        printf("  decode + batch, step %4lld seqs %9.0f transitions/s  %7.1f MB/s  ratio %.2f  "
               "packing %.2f%% (%lld steps)\n",
               (long long)steps[k], (double)n / best.seconds, (double)bytes / 1e6 / best.seconds,
               dec / best.seconds, 100.0 * (double)best.tokens / (double)best.capacity,
               (long long)best.steps);
    }
    /* The embedded broker keeps ~5 MiB per partition: stay well under it. */
    size_t tcp_n = n < 2048 ? n : 2048;
    if (!only) over_tcp(&in, tcp_n, getenv("BENCH_BATCH_TCP_STEP") ? atol(getenv("BENCH_BATCH_TCP_STEP")) : 256);
    for (size_t i = 0; i < n; i++) al_buf_free(&in.m[i]);
    free(in.m);
    return 0;
}
