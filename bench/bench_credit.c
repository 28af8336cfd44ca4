/* bench_credit: spans/s and MB/s through one `arclight credit` worker from a pre-filled
 * topic, against kcat consuming the same topic in the same run, first on the embedded broker,
 * then on a one-node Apache Kafka (tests/kafka_fixture.h; the broker scripts/setup.sh fetches).
 *
 *   cmake --build build --target bench_credit arclight && ./build/bench_credit [embedded,kafka]
 *
 * The topic: 64 partitions, 1,024 tasks (16 per partition, chosen explicitly so that every
 * partition stays under the embedded broker's ~5 MiB cap), 8 rollouts per task (groups of
 * 8), each rollout 3 LLM calls of 2,000 prompt + 256 response tokens with logprobs, a
 * reward and an end: 40,960 spans, about 250 MB before compression. The tokens are
 * pseudo-random, but shaped like an agent's: the 8 rollouts of a task start from the same
 * prompt and each call's context is the previous one plus its response and a tool result,
 * so that lz4 (the project's producer default) finds what it would find in real traffic. Both
 * readers are timed from their first message to their last (credit: until its transitions are
 * acknowledged).
 *
 * kcat runs two ways: as a user would run it, and with fetch.wait.max.ms=10. The embedded
 * broker answers a fetch that finds no data only after fetch.wait.max.ms (500 ms by
 * default), and kcat starts its partitions one by one, so its default run spends most of its
 * time waiting on the first partitions' empty fetches; the second way is kcat's raw consume
 * rate. Both are reported; the second is the one the target is read against. kcat (both
 * ways) runs before and after each of three credit runs; the best run of each counts.
 * Last, kcat produces one credit run's transitions again (from a file, lz4, acks=all,
 * idempotent, as credit's producer does): the part of credit's work that is only its output.
 * Its CPU and the broker's during those runs are printed too.
 * BENCH_KEEP=1 keeps the last credit log, BENCH_LOG_LEVEL sets credit's log level (with
 * ARCLIGHT_KAFKA_DEBUG=... for librdkafka's debug contexts). BENCH_EOS=1 follows each credit
 * run with one of `credit --exactly-once` (its own group and output topic) and prints what the
 * mode costs, best run against best run (on Kafka: the embedded broker simulates no aborts). */
#include "avro/codec.h"
#include "broker_fixture.h"

#include <librdkafka/rdkafka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>

#define PARTS 64
#define TASKS_PER_PART 16
#define GROUP 8
#define CALLS 3
#define PROMPT 2000
#define RESPONSE 256
#define TOOL 64
#define CREDIT_RUNS 3

/* xorshift64*: the next pseudo-random token id. */
static int32_t token(uint64_t *x)
{
    *x ^= *x >> 12;
    *x ^= *x << 25;
    *x ^= *x >> 27;
    return (int32_t)((*x * 0x2545F4914F6CDD1DULL >> 33) % 151000);
}

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* Fills the topic; returns the number of spans (and their bytes in *bytes), -1 on error. */
static long fill(const char *bootstrap, const char *topic, double *bytes)
{
    char err[512];
    rd_kafka_conf_t *c = rd_kafka_conf_new();
    rd_kafka_conf_set(c, "bootstrap.servers", bootstrap, err, sizeof err);
    rd_kafka_conf_set(c, "linger.ms", "20", err, sizeof err);
    rd_kafka_conf_set(c, "compression.type", "lz4", err, sizeof err);
    rd_kafka_conf_set(c, "queue.buffering.max.kbytes", "1048576", err, sizeof err);
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_PRODUCER, c, err, sizeof err);
    if (!rk) return -1;
    static int32_t prompt[PROMPT], resp[RESPONSE];
    static float lp[RESPONSE];
    al_buf b = {0};
    long n = 0;
    *bytes = 0;
    int64_t ts = 1764400000000000LL;
    for (int task = 0; task < PARTS * TASKS_PER_PART; task++) {
        char tid[32], rid[48];
        snprintf(tid, sizeof tid, "task-%04d", task);
        for (int r = 0; r < GROUP; r++) {
            snprintf(rid, sizeof rid, "%s-r%d", tid, r);
            for (int seq = 0; seq < CALLS + 2; seq++) {
                al_span s;
                memset(&s, 0, sizeof s);
                s.trace_id = "0123456789abcdef0123456789abcdef";
                s.span_id = "0123456789abcdef";
                s.task_id = tid;
                s.rollout_id = rid;
                s.sequence = seq;
                s.timestamp_us = ts += 1000;
                if (seq < CALLS) {
                    /* Like an agent's: the group's rollouts share the task's prompt; call k's
                     * context is the previous context + response + a tool result, cut to
                     * its last PROMPT tokens. Tokens are pseudo-random ids < 151,000. */
                    if (seq == 0) {
                        uint64_t x = 0x9E3779B97F4A7C15ULL * (uint64_t)(task + 1);
                        for (int i = 0; i < PROMPT; i++)
                            prompt[i] = token(&x);
                    } else {
                        uint64_t x =
                            0xD1B54A32D192ED03ULL * (uint64_t)(task * 64 + r * 8 + seq + 1);
                        static int32_t ctx[PROMPT + RESPONSE + TOOL];
                        memcpy(ctx, prompt, sizeof prompt);
                        memcpy(ctx + PROMPT, resp, sizeof resp);
                        for (int i = 0; i < TOOL; i++)
                            ctx[PROMPT + RESPONSE + i] = token(&x);
                        memcpy(prompt, ctx + RESPONSE + TOOL, sizeof prompt);
                    }
                    uint64_t y = 0xA0761D6478BD642FULL * (uint64_t)(task * 64 + r * 8 + seq + 1);
                    for (int i = 0; i < RESPONSE; i++) {
                        resp[i] = token(&y);
                        lp[i] = -0.001f * (float)(token(&y) % 3000);
                    }
                    s.kind = AL_SPAN_KIND_LLM_CALL;
                    s.llm_call.model = "bench";
                    s.llm_call.policy_version = 1;
                    s.llm_call.prompt_token_ids = prompt;
                    s.llm_call.n_prompt_tokens = PROMPT;
                    s.llm_call.response_token_ids = resp;
                    s.llm_call.n_response_tokens = RESPONSE;
                    s.llm_call.response_logprobs = lp;
                    s.llm_call.n_response_logprobs = RESPONSE;
                    s.llm_call.http_status = 200;
                } else if (seq == CALLS) {
                    s.kind = AL_SPAN_KIND_REWARD;
                    s.reward.name = "final";
                    s.reward.value = (double)((task + r) % 3);
                    s.reward.after_sequence = CALLS - 1;
                } else {
                    s.kind = AL_SPAN_KIND_ROLLOUT_END;
                    s.rollout_end.status = AL_ROLLOUT_STATUS_SUCCEEDED;
                    s.rollout_end.group_size = GROUP;
                }
                if (al_span_encode(&s, &b, err, sizeof err) != 0) {
                    fprintf(stderr, "encode: %s\n", err);
                    return -1;
                }
                while (rd_kafka_producev(
                           rk, RD_KAFKA_V_TOPIC(topic), RD_KAFKA_V_PARTITION(task % PARTS),
                           RD_KAFKA_V_KEY(tid, strlen(tid)), RD_KAFKA_V_VALUE(b.data, b.len),
                           RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
                           RD_KAFKA_V_END) == RD_KAFKA_RESP_ERR__QUEUE_FULL)
                    rd_kafka_poll(rk, 10);
                n++;
                *bytes += (double)b.len;
            }
        }
        rd_kafka_poll(rk, 0);
    }
    int rc = rd_kafka_flush(rk, 120000);
    rd_kafka_destroy(rk);
    al_buf_free(&b);
    return rc ? -1 : n;
}

/* kcat from the oldest message to the end of every partition; seconds from its first
 * message to its last (-1 on error), messages counted in *count. */
static double run_kcat(const char *bootstrap, const char *topic, const char *args, long *count)
{
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "kcat -C -b %s -t %s -o beginning -e -q -f '%%o\\n' %s", bootstrap,
             topic, args);
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    char line[64];
    double first = 0, last = 0;
    *count = 0;
    while (fgets(line, sizeof line, p)) {
        last = now_s();
        if (!*count) first = last;
        (*count)++;
    }
    int st = pclose(p);
    return st == 0 && *count ? last - first : -1;
}

/* Seconds a shell command takes from launch to exit, -1 if it fails. */
static double run_timed(const char *cmd)
{
    double t = now_s();
    int st = system(cmd);
    return st == 0 ? now_s() - t : -1;
}

/* Messages on topic (the sum of its partitions' high watermarks), -1 on error. */
static long topic_messages(const char *bootstrap, const char *topic)
{
    char err[256];
    rd_kafka_conf_t *c = rd_kafka_conf_new();
    rd_kafka_conf_set(c, "bootstrap.servers", bootstrap, err, sizeof err);
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_PRODUCER, c, err, sizeof err);
    if (!rk) return -1;
    long total = -1;
    rd_kafka_topic_t *rkt = rd_kafka_topic_new(rk, topic, NULL);
    const struct rd_kafka_metadata *md = NULL;
    if (rd_kafka_metadata(rk, 0, rkt, &md, 10000) == RD_KAFKA_RESP_ERR_NO_ERROR &&
        md->topic_cnt == 1) {
        total = 0;
        for (int i = 0; i < md->topics[0].partition_cnt && total >= 0; i++) {
            int64_t lo, hi;
            if (rd_kafka_query_watermark_offsets(rk, topic, md->topics[0].partitions[i].id, &lo,
                                                 &hi, 10000) != RD_KAFKA_RESP_ERR_NO_ERROR)
                total = -1;
            else
                total += (long)hi;
        }
    }
    if (md) rd_kafka_metadata_destroy(md);
    rd_kafka_topic_destroy(rkt);
    rd_kafka_destroy(rk);
    return total;
}

/* The produce reference: kcat producing credit's output again from a file (as many
 * transitions as one credit run wrote, read back from bc.tr), with credit's producer settings
 * (lz4, acks=all, idempotent), timed from launch to exit. Each message ends with a delimiter
 * no transition holds. kcat piped into kcat is not used: the producing kcat, started with
 * nothing known, waited 0.5-1 s for its partitions' producer ids in two runs of three.
 * *out_bytes gets the bytes of those transitions. */
#define PRODUCE_RUNS 3
static double children_cpu_s(void)
{
    struct rusage ru;
    getrusage(RUSAGE_CHILDREN, &ru);
    return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6 +
           (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec / 1e6;
}

static int run_produce(const char *bootstrap, pid_t broker, const char *dir,
                       double produce[PRODUCE_RUNS], long *out_n, double *out_bytes)
{
    static const char delim[] = "#~arclight-transition~#";
    char cmd[2048], file[128];
    long per_run = topic_messages(bootstrap, "bc.tr");
    if (per_run < CREDIT_RUNS) return -1;
    per_run /= CREDIT_RUNS; /* each run wrote the same transitions */
    snprintf(file, sizeof file, "%s/transitions.bin", dir);
    snprintf(cmd, sizeof cmd,
             "kcat -C -b %s -t bc.tr -o beginning -c %ld -e -q -X fetch.wait.max.ms=10 -D '%s' "
             "> %s",
             bootstrap, per_run, delim, file);
    if (run_timed(cmd) < 0) return -1;
    struct stat st;
    if (stat(file, &st) != 0) return -1;
    *out_n = per_run;
    *out_bytes = (double)st.st_size - (double)per_run * (double)(sizeof delim - 1);
    for (int i = 0; i < PRODUCE_RUNS; i++) {
        snprintf(cmd, sizeof cmd,
                 "kcat -P -b %s -t bc.copy -q -z lz4 -X acks=all -X enable.idempotence=true "
                 "-D '%s' < %s",
                 bootstrap, delim, file);
        double cpu = children_cpu_s(), bcpu = al_test_proc_cpu_s(broker);
        if ((produce[i] = run_timed(cmd)) < 0) return -1;
        printf("kcat -P run %d: %.3f s, %.3f s of CPU (kcat and its shell), broker %.3f s\n", i + 1,
               produce[i], children_cpu_s() - cpu, al_test_proc_cpu_s(broker) - bcpu);
    }
    return 0;
}

static double best_of(const double *v, int n)
{
    double b = v[0];
    for (int i = 1; i < n; i++)
        if (v[i] < b) b = v[i];
    return b;
}

static void print_runs(const double *v, int n)
{
    for (int i = 0; i < n; i++)
        printf(" %.3f s", v[i]);
    printf(")\n");
}

/* Prints the end of a credit log (librdkafka's lines left out) to stderr. */
static void log_tail(const char *log)
{
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "grep -v ' rdkafka: ' '%s' | tail -n 15 >&2", log);
    if (system(cmd) != 0) fprintf(stderr, "  (no log)\n");
}

/* The whole benchmark on one broker (kafka: Apache Kafka, else the embedded one); *r_produce
 * gets credit's rate over kcat -P's. 0, or 1 when a run failed. */
static int bench_on(int kafka, double *r_produce)
{
    al_test_broker b;
    char dir[64], topics[128], log[128], cmd[2048];
    if (kafka)
        setenv("ARCLIGHT_TEST_BROKER", "kafka", 1);
    else
        unsetenv("ARCLIGHT_TEST_BROKER");
    printf("== %s\n", kafka ? "Apache Kafka 4.1.1, one node" : "embedded broker");
    snprintf(dir, sizeof dir, "/tmp/bench-credit-%d-%d", (int)getpid(), kafka);
    mkdir(dir, 0700);
    snprintf(topics, sizeof topics, "%s/topics.conf", dir);
    snprintf(log, sizeof log, "%s/credit.log", dir);
    FILE *f = fopen(topics, "w");
    if (!f) return 1;
    fprintf(f, "bc.spans %d 1\nbc.tr %d 1\nbc.copy %d 1\nbc.tre %d 1\narclight.deadletter 1 1\n",
            PARTS, PARTS, PARTS, PARTS);
    fclose(f);
    const char *extra[] = {"--topics", topics, NULL};
    if (al_test_broker_start(&b, extra) != 0) return 1;

    double bytes;
    double t0 = now_s();
    long n = fill(b.bootstrap, "bc.spans", &bytes);
    if (n < 0) {
        fprintf(stderr, "bench_credit: filling the topic failed\n");
        al_test_broker_stop(&b);
        return 1;
    }
    printf("topic: %ld spans, %.1f MB in %d partitions (filled in %.1f s)\n", n, bytes / 1e6, PARTS,
           now_s() - t0);

    /* kcat (both ways), then credit and kcat in turn: the best run of each counts */
    static const char *const kargs[2] = {"", "-X fetch.wait.max.ms=10"};
    long kn[2][CREDIT_RUNS + 1];
    double k[2][CREDIT_RUNS + 1], cs[CREDIT_RUNS], ce[CREDIT_RUNS];
    int eos = kafka && getenv("BENCH_EOS") && atoi(getenv("BENCH_EOS"));
    long cn[CREDIT_RUNS] = {0};
    unsigned long long cb[CREDIT_RUNS] = {0};
    int st = 0;
    for (int w = 0; w < 2; w++)
        k[w][0] = run_kcat(b.bootstrap, "bc.spans", kargs[w], &kn[w][0]);
    for (int run = 0; run < CREDIT_RUNS; run++) {
        cs[run] = -1;
        snprintf(cmd, sizeof cmd,
                 "'%s' credit --bootstrap %s --input bc.spans --output bc.tr --group bench-%d "
                 "--group-size %d --max-spans %ld --log-level %s 2>%s",
                 al_test_bin(), b.bootstrap, run, GROUP, n,
                 getenv("BENCH_LOG_LEVEL") ? getenv("BENCH_LOG_LEVEL") : "info", log);
        double broker_cpu = al_test_proc_cpu_s(b.pid);
        int rst = system(cmd);
        st |= rst;
        if (rst != 0) { /* say why before the next run overwrites the log */
            fprintf(stderr, "bench_credit: credit run %d exited with status %d; its log ends:\n",
                    run + 1, rst);
            log_tail(log);
        }
        broker_cpu = al_test_proc_cpu_s(b.pid) - broker_cpu;
        FILE *lf = fopen(log, "r");
        char line[1024];
        while (lf && fgets(line, sizeof line, lf)) {
            const char *p = strstr(line, "stopped after ");
            if (!p) continue;
            sscanf(p, "stopped after %ld messages, %llu bytes, %lf s", &cn[run], &cb[run],
                   &cs[run]);
            printf("credit run %d: %s", run + 1, p);
            printf("  broker CPU during the run (whole process, start to exit): %.2f s\n",
                   broker_cpu);
        }
        if (lf) fclose(lf);
        for (int w = 0; w < 2; w++)
            k[w][run + 1] = run_kcat(b.bootstrap, "bc.spans", kargs[w], &kn[w][run + 1]);
        ce[run] = -1;
        if (!eos) continue;
        snprintf(cmd, sizeof cmd,
                 "'%s' credit --bootstrap %s --input bc.spans --output bc.tre --group bench-eos-%d "
                 "--group-size %d --max-spans %ld --exactly-once --log-level %s 2>%s",
                 al_test_bin(), b.bootstrap, run, GROUP, n,
                 getenv("BENCH_LOG_LEVEL") ? getenv("BENCH_LOG_LEVEL") : "info", log);
        rst = system(cmd);
        st |= rst;
        long en = 0;
        unsigned long long eb = 0;
        lf = fopen(log, "r");
        while (lf && fgets(line, sizeof line, lf)) {
            const char *p = strstr(line, "stopped after ");
            if (p && sscanf(p, "stopped after %ld messages, %llu bytes, %lf s", &en, &eb,
                            &ce[run]) == 3)
                printf("credit --exactly-once run %d: %s", run + 1, p);
        }
        if (lf) fclose(lf);
        if (rst != 0 || en != n) {
            fprintf(stderr, "bench_credit: credit --exactly-once run %d: status %d, %ld of %ld "
                            "spans; its log ends:\n", run + 1, rst, en, n);
            log_tail(log);
            st |= 1;
        }
    }
    if (eos) {
        double ebest = best_of(ce, CREDIT_RUNS), abest = best_of(cs, CREDIT_RUNS);
        printf("credit --exactly-once: best %.3f s against %.3f s at least once (runs:", ebest,
               abest);
        for (int i = 0; i < CREDIT_RUNS; i++)
            printf(" %.3f s", ce[i]);
        printf("); its rate is %.2f of the at-least-once rate\n", ebest > 0 ? abest / ebest : 0);
    }
    double produce[PRODUCE_RUNS];
    long tn = 0;
    double tbytes = 0;
    int copies = run_produce(b.bootstrap, b.pid, dir, produce, &tn, &tbytes);
    al_test_broker_stop(&b);
    /* BENCH_KEEP=1 keeps the last credit run's log (for ARCLIGHT_KAFKA_DEBUG=...) */
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (getenv("BENCH_KEEP"))
        fprintf(stderr, "kept %s\n", log);
    else if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);

    int ok = st == 0;
    if (copies != 0) {
        fprintf(stderr, "bench_credit: a kcat produce run failed\n");
        ok = 0;
    }
    for (int w = 0; w < 2; w++)
        for (int i = 0; i <= CREDIT_RUNS; i++)
            if (!(k[w][i] > 0 && kn[w][i] == n)) {
                fprintf(stderr, "bench_credit: kcat run %d (%s) read %ld of %ld spans\n", i + 1,
                        w ? "raw" : "defaults", kn[w][i], n);
                ok = 0;
            }
    double cbest = 0, cworst = 0;
    for (int i = 0; i < CREDIT_RUNS; i++) {
        if (!(cs[i] > 0 && cn[i] == n)) {
            fprintf(stderr, "bench_credit: credit run %d handled %ld of %ld spans\n", i + 1, cn[i],
                    n);
            ok = 0;
        }
        if (!i || cs[i] < cbest) cbest = cs[i];
        if (!i || cs[i] > cworst) cworst = cs[i];
    }
    if (!ok) {
        fprintf(stderr, "bench_credit: a run failed (credit's exit statuses: %d)\n", st);
        return 1;
    }
    double kref[2];
    static const char *const kname[2] = {"kcat (defaults)    ", "kcat (wait.max 10) "};
    for (int w = 0; w < 2; w++) {
        kref[w] = k[w][0];
        printf("%s: ", kname[w]);
        for (int i = 1; i <= CREDIT_RUNS; i++)
            if (k[w][i] < kref[w]) kref[w] = k[w][i];
        printf("%8.0f spans/s %7.1f MB/s  (runs:", (double)n / kref[w], bytes / 1e6 / kref[w]);
        for (int i = 0; i <= CREDIT_RUNS; i++)
            printf(" %.3f s", k[w][i]);
        printf(")\n");
    }
    printf("arclight credit    : %8.0f spans/s %7.1f MB/s  (runs:", (double)n / cbest,
           (double)cb[0] / 1e6 / cbest);
    for (int i = 0; i < CREDIT_RUNS; i++)
        printf(" %.3f s", cs[i]);
    printf("; until the transitions are acknowledged)\n");
    printf("ratio credit/kcat (defaults)  : %.2f  (best runs; worst credit: %.2f)\n",
           kref[0] / cbest, kref[0] / cworst);
    printf("ratio credit/kcat (raw rate)  : %.2f  (best runs; worst credit: %.2f; target >= "
           "0.50)\n",
           kref[1] / cbest, kref[1] / cworst);
    printf("kcat -P (produce credit's %ld transitions, %.1f MB): %.0f transitions/s %.1f MB/s "
           "(runs:",
           tn, tbytes / 1e6, (double)tn / best_of(produce, PRODUCE_RUNS),
           tbytes / 1e6 / best_of(produce, PRODUCE_RUNS));
    print_runs(produce, PRODUCE_RUNS);
    *r_produce = best_of(produce, PRODUCE_RUNS) / cbest;
    printf("ratio credit/kcat -P (produce): %.2f  (best runs: credit's whole job against kcat "
           "only producing its output, from launch to exit; target >= 0.80)\n",
           *r_produce);
    fflush(stdout);
    return 0;
}

int main(int argc, char **argv)
{
    const char *which = argc > 1 ? argv[1] : "embedded,kafka";
    int on_embedded = strstr(which, "embedded") != NULL, on_kafka = strstr(which, "kafka") != NULL;
    if (!on_embedded && !on_kafka) {
        fprintf(stderr, "usage: bench_credit [embedded,kafka]\n");
        return 2;
    }
    double re = 0, rk = 0;
    if (on_embedded && bench_on(0, &re) != 0) return 1;
    if (on_kafka && bench_on(1, &rk) != 0) return 1;
    if (on_embedded)
        printf("embedded broker: credit %.2f of kcat -P (target 0.80: %s)\n", re,
               re >= 0.8 ? "met" : "NOT met");
    if (on_kafka)
        printf("Apache Kafka   : credit %.2f of kcat -P (target 0.80: %s)\n", rk,
               rk >= 0.8 ? "met" : "NOT met");
    return 0;
}
