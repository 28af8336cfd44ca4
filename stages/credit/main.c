/*
 * arclight credit: the Kafka loop around credit.c. Consumes arclight.spans in a consumer
 * group, feeds each partition's spans to its own al_credit_part, produces the transitions
 * to arclight.transitions (key: group key) and what cannot be used to arclight.deadletter.
 *
 * Offsets: every consumed message's input (al_consumer_input_begin) is held here until the
 * part's safe offset passes it; a group's transitions are outputs of the input of the
 * group's earliest span. So the stored offset never passes the first span of an open
 * rollout or group, nor a group whose transitions are not all acknowledged, and a restart
 * rebuilds open rollouts from the spans after it.
 *
 * Exactly once (--exactly-once: kafka/stage.h's transactions). A transaction commits the
 * transitions produced since the last one together with, per partition, the same offset
 * as above: the oldest span still needed by an open rollout or group, so a restart still
 * rebuilds open rollouts from the spans after it. That offset alone would not make the mode
 * exactly once: the groups that completed after that span are re-formed whole by the
 * restart and would be emitted again. So each committed offset carries, as its metadata,
 * the names of the groups emitted above it (al_credit_part_emitted: "ac1:OFFSET:D1,D2,...",
 * each name the delta from the previous one, the first from OFFSET); a partition resumed at
 * that offset re-forms those groups without emitting them. The broker keeps at most
 * offset.metadata.max.bytes (4096 by default) of it: past CREDIT_META_MAX bytes the newest
 * names are left out, with a warning and arclight_credit_eos_metadata_overflow_total, and
 * their groups can be emitted twice after a crash (at least once, as without the mode).
 *
 * Time: a part's clock is event time (span timestamps). The one wall-clock input: a
 * partition that has received nothing for --quiet-flush seconds has its clock moved on by
 * the wall time that passed since its last span, so that a stream that simply stops still
 * times out its last rollouts. Replays at full speed never hit it mid-stream. A broker
 * outage is not quiet (the spans wait in the proxy's spool): see quiet_flush.
 */
#define _GNU_SOURCE /* RUSAGE_THREAD */
#include "credit.h"

#include "avro/codec.h"
#include "core/cli.h"
#include "core/flags.h"
#include "core/log.h"
#include "core/util.h"
#include "http/metrics.h"
#include "kafka/kafka.h"
#include "kafka/stage.h"

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

/* The most metadata credit commits with an offset (the broker's offset.metadata.max.bytes
 * is 4096 by default). */
#define CREDIT_META_MAX 4000

/* CPU time of one thread (threads_cpu). */
typedef struct {
    int tid;
    char name[16];
    uint64_t ns;
} thread_cpu;

/* One held input: a consumed message whose offset the part still needs. */
typedef struct hold {
    int64_t offset;
    al_input *in;
} hold;

typedef struct cpart {
    char *topic;
    int32_t partition;
    al_credit_part *part;
    al_credit_stats seen; /* stats already added to the metrics */
    hold *holds;          /* ring buffer, in offset order */
    size_t hhead, hcount, hcap;
    int64_t last_msg_mono;
    int64_t clock_at_last_msg;
    int64_t next_offset; /* one past the last message read */
} cpart;

typedef struct credit_metrics {
    al_counter *spans, *transitions, *bytes_out;
    al_counter *r_completed, *r_timed_out, *r_dropped, *r_skipped, *r_retried, *r_incomplete,
        *r_no_reward;
    al_counter *eval_spans;
    al_counter *g_completed, *g_timed_out, *g_equal, *g_empty, *g_replayed;
    al_gauge *open_rollouts, *open_groups, *waiting, *reward_mean, *reward_std;
} credit_metrics;

typedef struct credit_ctx {
    al_credit_config cfg;
    const char *output;
    al_metrics *metrics;
    credit_metrics m;
    cpart **parts;
    size_t nparts, capparts;
    al_buf buf;
    cpart *cur;  /* the part whose sink is running */
    al_stage st; /* failure latch; /healthz gives its reason */
    double *window;
    size_t wcap, wn, wpos;
    /* the run (the worker's hooks) */
    al_span span;                      /* decoded span, reused per message */
    double quiet_s, exit_idle_s, max_spans;
    uint64_t consumed, consumed_bytes;
    int64_t first_msg, last_msg, last_quiet_check, consumed_at;
    int64_t unreachable_mono; /* when the broker last did not answer (0: never) */
    int64_t reachable_mono;   /* when it last did */
    int64_t outage_from;      /* the first unanswered check of the present outage */
    int outage_logged;        /* the present outage was logged */
    double first_cpu, first_cpu_main;
    long first_faults;
    thread_cpu first_threads[64];
    size_t nfirst_threads;
    int exactly_once;
    al_counter *meta_overflow;
    int meta_overflow_warned;
} credit_ctx;

/* ------------------------------------------------------------------------------------------
 * Holds
 * ------------------------------------------------------------------------------------------ */

static int hold_push(cpart *cp, int64_t offset, al_input *in)
{
    if (cp->hcount == cp->hcap) {
        size_t nc = cp->hcap ? cp->hcap * 2 : 256;
        hold *nh = malloc(nc * sizeof *nh);
        if (!nh) return -1;
        for (size_t i = 0; i < cp->hcount; i++)
            nh[i] = cp->holds[(cp->hhead + i) % cp->hcap];
        free(cp->holds);
        cp->holds = nh;
        cp->hcap = nc;
        cp->hhead = 0;
    }
    cp->holds[(cp->hhead + cp->hcount) % cp->hcap] = (hold){offset, in};
    cp->hcount++;
    return 0;
}

/* The held input of `offset`, or of the first held offset after it; NULL when none. */
static al_input *hold_find(cpart *cp, int64_t offset)
{
    size_t lo = 0, hi = cp->hcount;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (cp->holds[(cp->hhead + mid) % cp->hcap].offset < offset)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < cp->hcount ? cp->holds[(cp->hhead + lo) % cp->hcap].in : NULL;
}

/* Ends the holds below the part's safe offset (all of them when `all`). */
static void hold_release(cpart *cp, int all)
{
    int64_t safe = all ? INT64_MAX : al_credit_part_safe_offset(cp->part);
    while (cp->hcount && cp->holds[cp->hhead].offset < safe) {
        al_input_end(cp->holds[cp->hhead].in);
        cp->hhead = (cp->hhead + 1) % cp->hcap;
        cp->hcount--;
    }
}

/* ------------------------------------------------------------------------------------------
 * Metrics
 * ------------------------------------------------------------------------------------------ */

static void metrics_init(credit_ctx *x)
{
    al_metrics *r = x->metrics;
    credit_metrics *m = &x->m;
    const char *rh = "Rollouts finished, by outcome";
    const char *gh = "Groups finished, by outcome";
    m->spans = al_metrics_counter(r, "arclight_credit_spans_total", "Span messages consumed", NULL);
    m->transitions =
        al_metrics_counter(r, "arclight_credit_transitions_total", "Transitions produced", NULL);
    m->bytes_out = al_metrics_counter(r, "arclight_credit_transition_bytes_total",
                                      "Bytes of transitions produced", NULL);
    m->r_completed =
        al_metrics_counter(r, "arclight_credit_rollouts_total", rh, "outcome", "completed", NULL);
    m->r_timed_out =
        al_metrics_counter(r, "arclight_credit_rollouts_total", rh, "outcome", "timed_out", NULL);
    m->r_dropped =
        al_metrics_counter(r, "arclight_credit_rollouts_total", rh, "outcome", "dropped", NULL);
    m->r_skipped = al_metrics_counter(r, "arclight_credit_rollouts_total", rh, "outcome",
                                      "skipped_resumed", NULL);
    m->r_retried = al_metrics_counter(r, "arclight_credit_rollouts_total", rh, "outcome",
                                      "retried", NULL);
    m->r_incomplete = al_metrics_counter(r, "arclight_credit_rollouts_total", rh, "outcome",
                                         "incomplete_after_end_wait", NULL);
    m->eval_spans = al_metrics_counter(r, "arclight_credit_eval_spans_total",
                                       "Spans of held-out evaluation rollouts (not trained on)",
                                       NULL);
    m->r_no_reward = al_metrics_counter(r, "arclight_credit_rollouts_no_reward_total",
                                        "Kept rollouts without a reward span", NULL);
    m->g_completed =
        al_metrics_counter(r, "arclight_credit_groups_total", gh, "outcome", "completed", NULL);
    m->g_timed_out =
        al_metrics_counter(r, "arclight_credit_groups_total", gh, "outcome", "timed_out", NULL);
    m->g_equal =
        al_metrics_counter(r, "arclight_credit_groups_total", gh, "outcome", "dropped_equal", NULL);
    m->g_empty =
        al_metrics_counter(r, "arclight_credit_groups_total", gh, "outcome", "dropped_empty", NULL);
    m->g_replayed = al_metrics_counter(r, "arclight_credit_groups_total", gh, "outcome",
                                       "replayed_not_emitted", NULL);
    m->open_rollouts =
        al_metrics_gauge(r, "arclight_credit_open_rollouts", "Rollouts not ended yet", NULL);
    m->waiting = al_metrics_gauge(r, "arclight_credit_waiting_rollouts",
                                  "Ended rollouts waiting for spans their end overtook", NULL);
    m->open_groups = al_metrics_gauge(r, "arclight_credit_open_groups",
                                      "Groups waiting for more rollouts", NULL);
    m->reward_mean = al_metrics_gauge(r, "arclight_credit_reward_mean",
                                      "Mean reward of the last --reward-window rollouts", NULL);
    m->reward_std =
        al_metrics_gauge(r, "arclight_credit_reward_std",
                         "Std of the reward of the last --reward-window rollouts", NULL);
    x->meta_overflow = al_metrics_counter(
        r, "arclight_credit_eos_metadata_overflow_total",
        "Commits whose emitted-group names did not all fit in the offset metadata", NULL);
    al_metrics_add_process_metrics(r);
}

static void deadletter_count(credit_ctx *x, const char *reason)
{
    al_counter_inc(al_metrics_counter(x->metrics, "arclight_credit_deadletter_total",
                                      "Spans sent to the dead-letter topic, by reason", "reason",
                                      reason, NULL));
}

/* Adds what the part counted since the last call to the process-wide metrics. */
static void metrics_sync(credit_ctx *x, cpart *cp)
{
    const al_credit_stats *s = al_credit_part_stats(cp->part);
    credit_metrics *m = &x->m;
    if (s->rollouts_incomplete > cp->seen.rollouts_incomplete)
        al_log_warn("credit",
                    "%s [%d]: %llu rollout%s settled without spans their end said were coming "
                    "(%.0f s of span time passed: --end-wait); a span of theirs that comes now "
                    "is dead-lettered as late",
                    cp->topic, (int)cp->partition,
                    (unsigned long long)(s->rollouts_incomplete - cp->seen.rollouts_incomplete),
                    s->rollouts_incomplete - cp->seen.rollouts_incomplete == 1 ? "" : "s",
                    (double)x->cfg.end_wait_us / 1e6);
#define DELTA(field, ctr) al_counter_add(m->ctr, (double)(s->field - cp->seen.field))
    DELTA(rollouts_completed, r_completed);
    DELTA(rollouts_timed_out, r_timed_out);
    DELTA(rollouts_dropped, r_dropped);
    DELTA(rollouts_skipped, r_skipped);
    DELTA(rollouts_retried, r_retried);
    DELTA(rollouts_incomplete, r_incomplete);
    DELTA(eval_spans, eval_spans);
    DELTA(rollouts_no_reward, r_no_reward);
    DELTA(groups_completed, g_completed);
    DELTA(groups_timed_out, g_timed_out);
    DELTA(groups_dropped_equal, g_equal);
    DELTA(groups_dropped_empty, g_empty);
    DELTA(groups_replayed, g_replayed);
#undef DELTA
    al_gauge_add(m->open_rollouts, (double)s->open_rollouts - (double)cp->seen.open_rollouts);
    al_gauge_add(m->open_groups, (double)s->open_groups - (double)cp->seen.open_groups);
    al_gauge_add(m->waiting, (double)s->rollouts_waiting - (double)cp->seen.rollouts_waiting);
    cp->seen = *s;
}

static void on_rollout(void *ud, double score)
{
    credit_ctx *x = ud;
    if (!x->wcap) return;
    x->window[x->wpos] = score;
    x->wpos = (x->wpos + 1) % x->wcap;
    if (x->wn < x->wcap) x->wn++;
    double sum = 0, var = 0;
    for (size_t i = 0; i < x->wn; i++)
        sum += x->window[i];
    double mean = sum / (double)x->wn;
    for (size_t i = 0; i < x->wn; i++)
        var += (x->window[i] - mean) * (x->window[i] - mean);
    al_gauge_set(x->m.reward_mean, mean);
    al_gauge_set(x->m.reward_std, sqrt(var / (double)x->wn));
}

/* ------------------------------------------------------------------------------------------
 * Partitions
 * ------------------------------------------------------------------------------------------ */

static int on_transition(void *ud, const al_transition *t, int64_t anchor);

/* CPU seconds (user + system) used by this process (RUSAGE_SELF: all threads) or by the
 * calling thread (RUSAGE_THREAD). */
static double cpu_s(int who)
{
    struct rusage u;
    if (getrusage(who, &u) != 0) return 0;
    return (double)(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
           (double)(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

/* Page faults this process has taken (minor ones: first touches of fresh memory). */
static long minor_faults(void)
{
    struct rusage u;
    return getrusage(RUSAGE_SELF, &u) == 0 ? u.ru_minflt : 0;
}

/* Nanoseconds on CPU of each of this process's threads (/proc/self/task/TID/schedstat), for
 * the stop line: where a run's CPU went (librdkafka's threads are the interesting part). */
static size_t threads_cpu(thread_cpu *t, size_t max)
{
    DIR *d = opendir("/proc/self/task");
    size_t n = 0;
    struct dirent *e;
    while (d && n < max && (e = readdir(d))) {
        int tid = atoi(e->d_name);
        char path[64];
        unsigned long long ns;
        if (tid <= 0) continue;
        snprintf(path, sizeof path, "/proc/self/task/%d/schedstat", tid);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        int ok = fscanf(f, "%llu", &ns) == 1;
        fclose(f);
        snprintf(path, sizeof path, "/proc/self/task/%d/comm", tid);
        if (!ok || !(f = fopen(path, "r"))) continue;
        if (!fgets(t[n].name, sizeof t[n].name, f)) t[n].name[0] = '\0';
        fclose(f);
        t[n].name[strcspn(t[n].name, "\n")] = '\0';
        t[n].tid = tid;
        t[n].ns = ns;
        n++;
    }
    if (d) closedir(d);
    return n;
}

/* "main 0.101, rdk:broker1 0.093, ..." in thread id order (the producer's threads start
 * before the consumer's): CPU seconds of each thread since the snapshot `before`, threads
 * under 5 ms left out. */
static void threads_cpu_since(const thread_cpu *before, size_t nb, char *out, size_t outlen)
{
    thread_cpu now[64];
    size_t n = threads_cpu(now, 64), len = 0;
    out[0] = '\0';
    for (size_t done = 0; done < n; done++) {
        size_t k = n; /* the next thread in tid order */
        for (size_t i = 0; i < n; i++)
            if (now[i].tid > 0 && (k == n || now[i].tid < now[k].tid)) k = i;
        uint64_t ns = now[k].ns;
        for (size_t i = 0; i < nb; i++)
            if (before[i].tid == now[k].tid) ns = ns >= before[i].ns ? ns - before[i].ns : 0;
        if (ns >= 5000000 && len < outlen)
            len += (size_t)snprintf(out + len, outlen - len, "%s%s %.3f", len ? ", " : "",
                                    now[k].tid == (int)getpid() ? "main" : now[k].name,
                                    (double)ns / 1e9);
        now[k].tid = -now[k].tid;
    }
}

/* Exactly once: the groups emitted above the offset this partition resumed from, as the
 * last transaction committed them (see the top of this file), go to the new part's skip
 * set. Metadata that does not parse, or names another offset, is ignored with a warning. */
static void restore_emitted(credit_ctx *x, cpart *cp)
{
    int64_t off = -1;
    const char *meta = al_consumer_committed_metadata(al_stage_consumer(&x->st), cp->topic,
                                                      cp->partition, &off);
    if (!meta || strncmp(meta, "ac1:", 4)) return;
    char *end;
    long long base = strtoll(meta + 4, &end, 10);
    if (*end != ':' || base != off) {
        al_log_warn("credit", "%s [%d]: committed metadata '%.60s' does not name offset %lld; "
                    "ignored (groups above it may be emitted again)", cp->topic,
                    (int)cp->partition, meta, (long long)off);
        return;
    }
    int64_t names[1024];
    size_t n = 0;
    int64_t at = base;
    const char *q = end + 1;
    while (*q) {
        long long d = strtoll(q, &end, 10);
        if (end == q || d < 0 || (*end && *end != ',')) break;
        at += d;
        names[n++] = at;
        q = *end ? end + 1 : end;
        if (n == AL_ARRAY_LEN(names)) {
            if (al_credit_part_skip_emitted(cp->part, names, n) != 0) break;
            n = 0;
        }
    }
    if (n && al_credit_part_skip_emitted(cp->part, names, n) != 0)
        al_stage_fail(&x->st, "out of memory restoring %s [%d]", cp->topic, (int)cp->partition);
    al_log_info("credit", "%s [%d]: resuming at offset %lld, %s", cp->topic, (int)cp->partition,
                (long long)off, meta[strlen(meta) - 1] == ':' ? "no group emitted above it"
                                                              : "skipping the groups emitted above it");
}

/* kafka/stage.h's offset_metadata: the groups emitted above `offset` (see the top). */
static size_t on_offset_metadata(al_stage *s, const char *topic, int32_t partition,
                                 int64_t offset, char *buf, size_t len, void *ud)
{
    (void)s;
    credit_ctx *x = ud;
    if (len > CREDIT_META_MAX + 1) len = CREDIT_META_MAX + 1;
    size_t n = (size_t)snprintf(buf, len, "ac1:%lld:", (long long)offset);
    if (n >= len) return 0;
    cpart *cp = NULL;
    for (size_t i = 0; i < x->nparts && !cp; i++)
        if (x->parts[i]->partition == partition && !strcmp(x->parts[i]->topic, topic))
            cp = x->parts[i];
    if (!cp) return n;
    const int64_t *lo;
    size_t k = al_credit_part_emitted(cp->part, offset, &lo), i = 0;
    int64_t prev = offset;
    for (; i < k; i++) {
        char d[32];
        int dl = snprintf(d, sizeof d, "%s%lld", i ? "," : "", (long long)(lo[i] - prev));
        if (n + (size_t)dl >= len) break;
        memcpy(buf + n, d, (size_t)dl + 1);
        n += (size_t)dl;
        prev = lo[i];
    }
    if (i < k) {
        al_counter_inc(x->meta_overflow);
        if (!x->meta_overflow_warned++)
            al_log_warn("credit", "%s [%d]: %zu groups emitted above offset %lld do not fit in "
                        "the offset's metadata (%d bytes): after a crash the newest %zu can be "
                        "emitted twice", topic, (int)partition, k, (long long)offset,
                        CREDIT_META_MAX, k - i);
    }
    return n;
}

static cpart *cpart_get(credit_ctx *x, const char *topic, int32_t partition, int create)
{
    for (size_t i = 0; i < x->nparts; i++)
        if (x->parts[i]->partition == partition && !strcmp(x->parts[i]->topic, topic))
            return x->parts[i];
    if (!create) return NULL;
    char err[256];
    cpart *cp = calloc(1, sizeof *cp);
    if (!cp) return NULL;
    al_credit_sink sink = {.transition = on_transition, .rollout = on_rollout, .ud = x};
    cp->topic = strdup(topic);
    cp->partition = partition;
    cp->part = al_credit_part_new(&x->cfg, &sink, err, sizeof err);
    if (x->nparts == x->capparts) {
        size_t nc = x->capparts ? x->capparts * 2 : 16;
        cpart **np = realloc(x->parts, nc * sizeof *np);
        if (np) {
            x->parts = np;
            x->capparts = nc;
        }
    }
    if (!cp->topic || !cp->part || x->nparts == x->capparts) {
        al_credit_part_free(cp->part);
        free(cp->topic);
        free(cp);
        return NULL;
    }
    x->parts[x->nparts++] = cp;
    if (x->exactly_once) restore_emitted(x, cp);
    return cp;
}

/* Forgets a partition: its open rollouts are dropped (the next owner rebuilds them from the
 * uncommitted spans) and its holds ended (their inputs are orphans by now, or the process
 * is stopping: nothing is stored for them). */
static void cpart_drop(credit_ctx *x, cpart *cp)
{
    for (size_t i = 0; i < x->nparts; i++)
        if (x->parts[i] == cp) {
            x->parts[i] = x->parts[--x->nparts];
            break;
        }
    /* Open rollouts leave the gauges. */
    al_gauge_add(x->m.open_rollouts, -(double)cp->seen.open_rollouts);
    al_gauge_add(x->m.waiting, -(double)cp->seen.rollouts_waiting);
    al_gauge_add(x->m.open_groups, -(double)cp->seen.open_groups);
    hold_release(cp, 1);
    al_credit_part_free(cp->part);
    free(cp->holds);
    free(cp->topic);
    free(cp);
}

static void on_rebalance(al_stage *s, al_rebalance_event ev,
                         const rd_kafka_topic_partition_list_t *parts, void *ud)
{
    (void)s;
    credit_ctx *x = ud;
    if (ev == AL_REBALANCE_ASSIGNED) return; /* parts are created on their first message */
    for (int i = 0; i < parts->cnt; i++) {
        cpart *cp = cpart_get(x, parts->elems[i].topic, parts->elems[i].partition, 0);
        if (!cp) continue;
        al_log_info("credit",
                    "%s [%d] %s: dropping %llu open rollouts (their spans are "
                    "re-read by the next owner)",
                    cp->topic, (int)cp->partition, ev == AL_REBALANCE_LOST ? "lost" : "revoked",
                    (unsigned long long)al_credit_part_stats(cp->part)->open_rollouts);
        cpart_drop(x, cp);
    }
}

/* ------------------------------------------------------------------------------------------
 * Messages
 * ------------------------------------------------------------------------------------------ */

/* The sink: encodes and produces one transition as an output of its group's anchor input. */
static int on_transition(void *ud, const al_transition *t, int64_t anchor)
{
    credit_ctx *x = ud;
    char err[512];
    if (al_transition_encode(t, &x->buf, err, sizeof err) != 0) {
        al_stage_fail(&x->st, "encoding transition %s: %s", t->id, err);
        return -1;
    }
    al_input *in = x->cur ? hold_find(x->cur, anchor) : NULL;
    if (!in) {
        /* Cannot happen (the anchor is never below the safe offset); without an input the
         * offset could be stored before this transition is acknowledged, so stop instead. */
        al_stage_fail(&x->st, "transition %s: no held input at offset %lld", t->id,
                      (long long)anchor);
        return -1;
    }
    al_kafka_out o = {.topic = x->output,
                      .partition = AL_KAFKA_PARTITION_ANY,
                      .key = t->group_key,
                      .keylen = strlen(t->group_key),
                      .value = x->buf.data,
                      .len = x->buf.len,
                      /* the time it is produced, not the span time the record holds: a
                       * topic's time retention deletes messages by these, and the span time
                       * of a replayed recording can be older than that (Kafka's first check,
                       * 30 s after a broker starts, deleted t0801's and t1506's transitions,
                       * whose spans are dated 2025) */
                      .timestamp_ms = 0,
                      .input = in};
    rd_kafka_resp_err_t e = al_producer_produce(al_stage_producer(&x->st), &o);
    if (e) {
        al_stage_fail(&x->st, "producing transition %s to %s: %s", t->id, x->output,
                      rd_kafka_err2str(e));
        return -1;
    }
    al_counter_inc(x->m.transitions);
    al_counter_add(x->m.bytes_out, (double)x->buf.len);
    return 0;
}

static void dead_letter(credit_ctx *x, const rd_kafka_message_t *m, al_input *in, const char *code,
                        const char *reason)
{
    char err[512];
    deadletter_count(x, code);
    al_log_debug("credit", "dead letter (%s): %s", code, reason);
    if (al_deadletter_message(al_stage_producer(&x->st), m, reason, "credit", in, err,
                              sizeof err) != 0)
        al_stage_fail(&x->st, "dead-lettering %s [%d] offset %lld: %s", rd_kafka_topic_name(m->rkt),
                      (int)m->partition, (long long)m->offset, err);
}

/* One consumed message: held, decoded, fed to its partition's part; outputs produced. */
static void handle_message(credit_ctx *x, const rd_kafka_message_t *m, al_span *span, int64_t now)
{
    char err[512], reason[768];
    const char *topic = rd_kafka_topic_name(m->rkt);
    cpart *cp = cpart_get(x, topic, m->partition, 1);
    if (!cp) {
        al_stage_fail(&x->st, "out of memory for %s [%d]", topic, (int)m->partition);
        return;
    }
    al_input *in = al_consumer_input_begin(al_stage_consumer(&x->st), m);
    if (!in || hold_push(cp, m->offset, in) != 0) {
        if (in) al_input_end(in);
        al_stage_fail(&x->st, "out of memory holding %s [%d] offset %lld", topic, (int)m->partition,
                      (long long)m->offset);
        return;
    }
    al_counter_inc(x->m.spans);
    cp->last_msg_mono = now;
    cp->next_offset = m->offset + 1;
    x->cur = cp;
    if (!m->payload || al_span_decode(m->payload, m->len, span, err, sizeof err) != 0) {
        snprintf(reason, sizeof reason, "undecodable span: %s",
                 m->payload ? err : "empty value (tombstone)");
        al_credit_part_note_offset(cp->part, m->offset);
        dead_letter(x, m, in, "undecodable", reason);
    } else {
        const char *code = NULL;
        int r = al_credit_part_add(cp->part, m->offset, span, &code, reason, sizeof reason, err,
                                   sizeof err);
        if (r == 1)
            dead_letter(x, m, in, code, reason);
        else if (r < 0)
            al_stage_fail(&x->st, "%s [%d] offset %lld: %s", topic, (int)m->partition,
                          (long long)m->offset, err);
    }
    cp->clock_at_last_msg = al_credit_part_clock(cp->part);
    x->cur = NULL;
    hold_release(cp, 0);
    metrics_sync(x, cp);
}

static rd_kafka_t *consumer_handle(credit_ctx *x)
{
    al_consumer *c = al_stage_consumer(&x->st);
    return c ? al_consumer_handle(c) : NULL;
}

/* Whether partition cp has been quiet long enough (quiet_us; for a partition with an end
 * waiting for its spans the end wait, if shorter: a span that never comes must not hold the
 * group until quiet_us). Quiet means nothing came and nothing is known to be there: a
 * partition not read to its high watermark (as its last fetch saw it) is not quiet, and time
 * while the broker did not answer does not count. */
static int partition_quiet(credit_ctx *x, cpart *cp, int64_t now, int64_t quiet_us)
{
    int64_t since = cp->last_msg_mono > x->unreachable_mono ? cp->last_msg_mono
                                                            : x->unreachable_mono;
    int64_t q = quiet_us;
    if (al_credit_part_stats(cp->part)->rollouts_waiting && x->cfg.end_wait_us > 0 &&
        x->cfg.end_wait_us < q)
        q = x->cfg.end_wait_us;
    if (now - since < q || cp->clock_at_last_msg <= 0) return 0;
    al_consumer *c = al_stage_consumer(&x->st);
    return !c || al_consumer_read_to_end(c, cp->topic, cp->partition, cp->next_offset);
}

/* Moves the clock of quiet partitions (partition_quiet) by the wall time since their last
 * message. Wall time stands for span time only while the broker answers: during an outage
 * the proxy's spool holds the spans, and timing rollouts out then would drop them (their
 * ends would come late). So before a flush the broker is asked for metadata (at most once
 * a second, 500 ms at most); no answer restarts every partition's quiet time. One slow
 * answer is not an outage worth a log line (a loaded machine, a broker still starting): an
 * outage is logged once it has lasted QUIET_OUTAGE_LOG_US, and its end then too. */
#define QUIET_OUTAGE_LOG_US 5000000
static void quiet_flush(credit_ctx *x, int64_t quiet_us)
{
    int64_t now = al_mono_us();
    char err[512];
    int due = 0;
    for (size_t i = 0; i < x->nparts && !due; i++)
        due = partition_quiet(x, x->parts[i], now, quiet_us);
    if (!due) return;
    if (now - x->reachable_mono > 1000000) {
        rd_kafka_t *rk = consumer_handle(x);
        if (rk && al_kafka_check_reachable(rk, 500, err, sizeof err) != 0) {
            int64_t t = al_mono_us();
            if (x->unreachable_mono <= x->reachable_mono) { /* a new outage */
                x->outage_from = t;
                x->outage_logged = 0;
            } else if (!x->outage_logged && t - x->outage_from >= QUIET_OUTAGE_LOG_US) {
                al_log_info("credit", "no quiet flush while Kafka does not answer (for %.0f s: %s)",
                            (t - x->outage_from) / 1e6, err);
                x->outage_logged = 1;
            }
            x->unreachable_mono = t;
            return;
        }
        int back = x->unreachable_mono > x->reachable_mono;
        if (back && x->outage_logged)
            al_log_info("credit", "Kafka answers again after %.0f s: quiet flushes resume",
                        (al_mono_us() - x->outage_from) / 1e6);
        x->outage_logged = 0;
        x->reachable_mono = now = al_mono_us();
        if (back) { /* the outage ends now: the consumer has yet to fetch what came meanwhile */
            x->unreachable_mono = now;
            return;
        }
    }
    for (size_t i = 0; i < x->nparts; i++) {
        cpart *cp = x->parts[i];
        if (!partition_quiet(x, cp, now, quiet_us)) continue;
        x->cur = cp;
        if (al_credit_part_advance(cp->part, cp->clock_at_last_msg + (now - cp->last_msg_mono),
                                   err, sizeof err))
            al_stage_fail(&x->st, "%s [%d]: %s", cp->topic, (int)cp->partition, err);
        x->cur = NULL;
        hold_release(cp, 0);
        metrics_sync(x, cp);
    }
}

/* ------------------------------------------------------------------------------------------
 * The worker's hooks (kafka/stage.h)
 * ------------------------------------------------------------------------------------------ */

static void on_started(al_stage *s, void *ud)
{
    credit_ctx *x = ud;
    al_log_info("credit", "consuming %s as group %s -> %s (estimator %s)", s->spec->input,
                al_stage_group(s), x->output, al_credit_estimator_name(x->cfg.estimator));
    x->last_msg = al_mono_us(); /* --exit-idle counts from here */
}

static void on_message(al_stage *s, rd_kafka_message_t *m, int64_t now, void *ud)
{
    (void)s;
    credit_ctx *x = ud;
    if (!x->first_msg) {
        x->first_msg = now;
        x->first_cpu = cpu_s(RUSAGE_SELF);
        x->first_cpu_main = cpu_s(RUSAGE_THREAD);
        x->first_faults = minor_faults();
        x->nfirst_threads = threads_cpu(x->first_threads, 64);
    }
    x->consumed_bytes += m->len;
    handle_message(x, m, &x->span, now);
    rd_kafka_message_destroy(m);
    x->consumed++;
    x->last_msg = now;
}

static int on_tick(al_stage *s, int got, int64_t now, void *ud)
{
    (void)s;
    credit_ctx *x = ud;
    if (got && x->max_spans > 0 && (double)x->consumed >= x->max_spans) return 1;
    if (x->quiet_s > 0 && now - x->last_quiet_check > 100000) {
        quiet_flush(x, (int64_t)(x->quiet_s * 1e6));
        x->last_quiet_check = now;
    }
    /* Before the first message the group join counts too: wait at least 30 s. */
    double idle_limit = x->consumed || x->exit_idle_s > 30 ? x->exit_idle_s : 30;
    return x->exit_idle_s > 0 && now - x->last_msg > (int64_t)(idle_limit * 1e6);
}

static void on_stopping(al_stage *s, void *ud)
{
    (void)s;
    credit_ctx *x = ud;
    x->consumed_at = al_mono_us();
}

static void on_drained(al_stage *s, int flushed, void *ud)
{
    (void)s, (void)flushed;
    credit_ctx *x = ud;
    if (!x->consumed_at) return; /* a failed run: no summary */
    double secs = x->first_msg ? (double)(al_mono_us() - x->first_msg) / 1e6 : 0;
    char by_thread[512] = "";
    if (x->first_msg)
        threads_cpu_since(x->first_threads, x->nfirst_threads, by_thread, sizeof by_thread);
    /* benchmarks read this line: messages and bytes from the first message to the end,
     * outputs flushed */
    al_log_info("credit",
                "stopped after %llu messages, %llu bytes, %.3f s since the first "
                "(the last consumed after %.3f s; %.3f s of CPU, %.3f s of it on the "
                "main thread; by thread: %s; %ld page faults)",
                (unsigned long long)x->consumed, (unsigned long long)x->consumed_bytes, secs,
                x->first_msg ? (double)(x->consumed_at - x->first_msg) / 1e6 : 0,
                x->first_msg ? cpu_s(RUSAGE_SELF) - x->first_cpu : 0,
                x->first_msg ? cpu_s(RUSAGE_THREAD) - x->first_cpu_main : 0, by_thread,
                x->first_msg ? minor_faults() - x->first_faults : 0);
}

/* The consumer's close revoked every partition (on_rebalance dropped their state); what is
 * left goes now, holds ended when they can no longer store anything. */
static void on_release(al_stage *s, void *ud)
{
    (void)s;
    credit_ctx *x = ud;
    while (x->nparts)
        cpart_drop(x, x->parts[0]);
}

static const al_stage_hooks credit_hooks = {
    .started = on_started,
    .message = on_message,
    .tick = on_tick,
    .rebalance = on_rebalance,
    .stopping = on_stopping,
    .drained = on_drained,
    .release = on_release,
    .offset_metadata = on_offset_metadata,
};

/* ------------------------------------------------------------------------------------------
 * Command
 * ------------------------------------------------------------------------------------------ */

/* What the flags set (credit_flags); cmd_credit puts the defaults in first. */
static struct credit_opts {
    al_credit_config cfg; /* the flags of its own types go straight in */
    const char *group, *input, *output;
    const char *estimator, *reward, *credit, *step_state, *on_timeout, *on_failed; /* NULL: not given */
    int group_size, window, exactly_once;
    double idle_s, group_timeout_s, end_wait_s, quiet_s; /* -1: not given */
    double exit_idle_s, drain_s;
    int64_t max_spans;
} opt;

static const char *const reward_modes[] = {"last", "sum", NULL};
static const char *const credit_modes[] = {"identical", "discounted", "step", NULL};
static const char *const step_states[] = {"prompt", "observed", NULL};
static const char *const policies[] = {"drop", "keep", NULL};

static const al_flag credit_flags[] = {
    {"group", 0, AL_FLAG_STRING, &opt.group, .arg = "NAME",
     .help = "consumer group (default arclight-credit)"},
    {"input", 0, AL_FLAG_STRING, &opt.input, .arg = "TOPIC",
     .help = "spans topic (default arclight.spans)"},
    {"output", 0, AL_FLAG_STRING, &opt.output, .arg = "TOPIC",
     .help = "transitions topic (default arclight.transitions)"},
    {"estimator", 0, AL_FLAG_STRING, &opt.estimator, .arg = "E",
     .help = "grpo (default): (G - mean) / (std + eps), std the population\n"
             "std; dr_grpo: G - mean; rloo: G - the mean of the others;\n"
             "reinforce: G - the task's running baseline before the group\n"
             "(starts at its first group's mean, moves by alpha (mean - b));\n"
             "none: G. A set of returns whose std is <= 1e-9 * max |G|, or\n"
             "of one rollout, has no spread: grpo, dr_grpo, rloo give 0"},
    {"reward", 0, AL_FLAG_STRING, &opt.reward, .arg = "MODE", .choices = reward_modes,
     .help = "last (default): the rollout's reward span with the highest\n"
             "sequence; sum: the sum of all of them"},
    {"reward-name", 0, AL_FLAG_STRING, &opt.cfg.reward_name, .arg = "NAME",
     .help = "the last reward span called NAME (not with --reward)"},
    {"credit", 0, AL_FLAG_STRING, &opt.credit, .arg = "MODE", .choices = credit_modes,
     .help = "identical (default): every call has reward = return = R, the\n"
             "rollout's reward; the set is the group's R\n"
             "discounted: every reward span (or each called NAME) belongs\n"
             "to the last call at or before its after_sequence; r_k is what\n"
             "call k got, G_k = r_k + gamma G_k+1; call k's set is the G_k\n"
             "of the group's rollouts that have a k-th call (a set per call\n"
             "position). A merged sequence has reward = the sum of its\n"
             "calls' r_k, return and advantage of its first call, and\n"
             "per-token advantages: each call's, 0 on the agent's tokens\n"
             "step: for one reward at the end (GiGPO's group in group):\n"
             "call k's advantage is its discounted one (with one final\n"
             "reward: the rollout's R against the group's) + w times its\n"
             "step group's: G_k against the G of the group's calls whose\n"
             "prompt token ids are the same as call k's (0 when it has no\n"
             "twin or the step group has no spread)"},
    {"gamma", 0, AL_FLAG_DOUBLE, &opt.cfg.gamma, .dlo = 0, .dhi = 1, .arg = "G",
     .help = "discount for --credit discounted and step (default 1)"},
    {"step-weight", 0, AL_FLAG_DOUBLE, &opt.cfg.step_weight, .dlo = 0, .dhi = 100, .arg = "W",
     .help = "w of --credit step: the weight of the step-group advantage\n"
             "(default 1)"},
    {"step-state", 0, AL_FLAG_STRING, &opt.step_state, .arg = "S", .choices = step_states,
     .help = "what makes two calls twins under --credit step: observed\n"
             "(default): the same prompt once the model's own earlier\n"
             "answers are left out (a call extending the previous call's\n"
             "prompt and answer); prompt: the same prompt token ids"},
    {"merge", 0, AL_FLAG_SWITCH, &opt.cfg.merge,
     .help = "merge consecutive calls whose prompt extends the previous\n"
             "prompt + response into one sequence (agent tokens masked)"},
    {"group-size", 0, AL_FLAG_INT, &opt.group_size, .lo = 1, .hi = 1000000, .arg = "N",
     .help = "rollouts per task group when end spans do not say (default 8);\n"
             "a transition's group_size is the group's kept rollouts with\n"
             "a call (dropped ones do not count)"},
    {"idle-timeout", 0, AL_FLAG_DOUBLE, &opt.idle_s, .dlo = 0, .dhi = 1e9, .arg = "S",
     .help = "a rollout silent for S seconds of span time times out\n"
             "(default 600; 0: never)"},
    {"group-timeout", 0, AL_FLAG_DOUBLE, &opt.group_timeout_s, .dlo = 0, .dhi = 1e9, .arg = "S",
     .help = "a group waits S seconds after its first end (default 1800; 0:\n"
             "never)"},
    {"end-wait", 0, AL_FLAG_DOUBLE, &opt.end_wait_s, .dlo = 0, .dhi = 1e9, .arg = "S",
     .help = "an end span whose sequence number says spans of its rollout\n"
             "are still to come (they overtook each other on the way)\n"
             "waits S seconds of span time for them, then the rollout\n"
             "settles without them (default 30; 0: never wait)"},
    {"on-timeout", 0, AL_FLAG_STRING, &opt.on_timeout, .arg = "drop|keep", .choices = policies,
     .help = "timed-out rollouts (default drop: they count towards the\n"
             "group's size but train nothing)"},
    {"timeout-reward", 0, AL_FLAG_DOUBLE, &opt.cfg.timeout_reward, .dlo = -AL_REWARD_MAX,
     .dhi = AL_REWARD_MAX, .arg = "X",
     .help = "reward of a kept timed-out rollout without one (default 0;\n"
             "discounted: at its last call); one with a reward keeps it"},
    {"on-failed", 0, AL_FLAG_STRING, &opt.on_failed, .arg = "drop|keep", .choices = policies,
     .help = "failed and aborted rollouts (default drop, as above)"},
    {"failed-reward", 0, AL_FLAG_DOUBLE, &opt.cfg.failed_reward, .dlo = -AL_REWARD_MAX,
     .dhi = AL_REWARD_MAX, .arg = "X",
     .help = "reward of a kept failed rollout without one (default 0)"},
    {"drop-equal-groups", 0, AL_FLAG_SWITCH, &opt.cfg.drop_equal_groups,
     .help = "drop groups in which no set of returns has spread (see\n"
             "--estimator), whatever the estimator"},
    {"eps", 0, AL_FLAG_DOUBLE, &opt.cfg.eps, .dlo = 0, .dhi = 1, .arg = "X",
     .help = "added to grpo's std, not its variance (default 1e-6)"},
    {"reinforce-alpha", 0, AL_FLAG_DOUBLE, &opt.cfg.reinforce_alpha, .dlo = 1e-9, .dhi = 1,
     .arg = "A", .help = "step of the per-task running baseline (default 0.1)"},
    {"quiet-flush", 0, AL_FLAG_DOUBLE, &opt.quiet_s, .dlo = 0, .dhi = 1e9, .arg = "S",
     .help = "move a partition's clock by wall time after S quiet seconds\n"
             "(default: the idle timeout; 0: never); time while Kafka does\n"
             "not answer is not quiet"},
    {"reward-window", 0, AL_FLAG_INT, &opt.window, .lo = 0, .hi = 10000000, .arg = "N",
     .help = "rollouts in the reward mean/std metrics (default 256)"},
    {"max-spans", 0, AL_FLAG_I64, &opt.max_spans, .lo = 1, .hi = 1000000000000000, .arg = "N",
     .help = "stop after N consumed messages (benchmarks)"},
    {"exit-idle", 0, AL_FLAG_DOUBLE, &opt.exit_idle_s, .dlo = 0.001, .dhi = 1e9, .arg = "S",
     .help = "stop after S seconds without a message (at least 30 s before\n"
             "the first one; tests, benchmarks)"},
    {"drain-timeout", 0, AL_FLAG_DOUBLE, &opt.drain_s, .dlo = 0, .dhi = 3600, .arg = "S",
     .help = "on SIGTERM, at most S seconds (default 15) to flush outputs,\n"
             "commit and leave the group, whether or not Kafka answers"},
    {"exactly-once", 0, AL_FLAG_SWITCH, &opt.exactly_once,
     .help = "Kafka transactions: transitions and span offsets are committed\n"
             "together every auto.commit.interval.ms, so that after kill -9\n"
             "or a rebalance no transition reaches a read_committed reader\n"
             "twice (transactional.id: the worker's static member id;\n"
             "needs a real Kafka cluster, see docs/RELIABILITY.md)"},
};

static const al_cmd_spec credit_spec = {
    "credit",
    "[options]",
    "Turns rollouts (spans on arclight.spans) into transitions with advantages on\n"
    "arclight.transitions. Scale out by running more workers with the same --group.\n",
    credit_flags,
    AL_ARRAY_LEN(credit_flags),
    .common = 1,
};

/* The defaults of every flag. */
static void credit_opts_init(void)
{
    memset(&opt, 0, sizeof opt);
    al_credit_config_init(&opt.cfg);
    opt.group = "arclight-credit";
    opt.input = AL_TOPIC_SPANS;
    opt.output = AL_TOPIC_TRANSITIONS;
    opt.group_size = opt.cfg.group_size;
    opt.window = 256;
    opt.idle_s = opt.group_timeout_s = opt.end_wait_s = opt.quiet_s = -1;
    opt.drain_s = AL_STAGE_DRAIN_DEFAULT_S;
}

/* The configuration the flags make, checked for what the table cannot say (the estimator's
 * name, --reward with --reward-name, operands); 0, or the usage error's exit status. */
static int credit_opts_config(int argc, char **argv, int first, al_credit_config *cfg)
{
    const char *cmd = "credit";
    *cfg = opt.cfg;
    /* a string row, checked here: the message names the value ("--estimator ppo: want ...") */
    if (opt.estimator) {
        int e = al_credit_estimator_parse(opt.estimator);
        if (e < 0)
            return al_cli_usage_error(cmd, "--estimator %s: want grpo, dr_grpo, rloo, reinforce "
                                           "or none",
                                      opt.estimator);
        cfg->estimator = (al_credit_estimator)e;
    }
    if (opt.reward)
        cfg->reward_mode = strcmp(opt.reward, "sum") ? AL_CREDIT_REWARD_LAST
                                                     : AL_CREDIT_REWARD_SUM;
    if (cfg->reward_name) {
        if (!*cfg->reward_name) return al_cli_usage_error(cmd, "--reward-name: empty name");
        cfg->reward_mode = AL_CREDIT_REWARD_NAMED;
    }
    if (opt.credit)
        cfg->assign = !strcmp(opt.credit, "step")         ? AL_CREDIT_ASSIGN_STEP
                      : !strcmp(opt.credit, "discounted") ? AL_CREDIT_ASSIGN_DISCOUNTED
                                                          : AL_CREDIT_ASSIGN_IDENTICAL;
    if (opt.step_state)
        cfg->step_state = strcmp(opt.step_state, "prompt") ? AL_CREDIT_STATE_OBSERVED
                                                           : AL_CREDIT_STATE_PROMPT;
    if (cfg->assign == AL_CREDIT_ASSIGN_STEP && cfg->estimator == AL_CREDIT_ESTIMATOR_REINFORCE)
        return al_cli_usage_error(cmd, "--credit step compares calls within a group: want "
                                       "--estimator grpo, dr_grpo, rloo or none, not reinforce");
    if (opt.on_timeout)
        cfg->timeout_policy = strcmp(opt.on_timeout, "keep") ? AL_CREDIT_POLICY_DROP
                                                             : AL_CREDIT_POLICY_KEEP;
    if (opt.on_failed)
        cfg->failed_policy = strcmp(opt.on_failed, "keep") ? AL_CREDIT_POLICY_DROP
                                                           : AL_CREDIT_POLICY_KEEP;
    cfg->group_size = opt.group_size;
    if (opt.idle_s >= 0) cfg->idle_timeout_us = (int64_t)(opt.idle_s * 1e6);
    if (opt.group_timeout_s >= 0) cfg->group_timeout_us = (int64_t)(opt.group_timeout_s * 1e6);
    if (opt.end_wait_s >= 0) cfg->end_wait_us = (int64_t)(opt.end_wait_s * 1e6);
    if (first < argc) return al_cli_usage_error(cmd, "unexpected argument '%s'", argv[first]);
    if (opt.reward && cfg->reward_name)
        return al_cli_usage_error(cmd, "--reward and --reward-name do not combine (--reward-name "
                                       "NAME takes the last reward span called NAME)");
    return 0;
}

int cmd_credit(int argc, char **argv)
{
    al_cli_common common;
    al_cli_common_init(&common);
    credit_ctx x;
    memset(&x, 0, sizeof x);
    al_stage_init(&x.st, "credit", NULL, 0); /* the worker logs the reason at its end */
    al_stage_keep_freed_memory();
    credit_opts_init();
    int first;
    int rc = al_flags_parse(&credit_spec, &common, argc, argv, &first);
    if (rc != AL_FLAGS_GO) return rc;
    if (credit_opts_config(argc, argv, first, &x.cfg) != 0) return AL_EXIT_USAGE;
    x.output = opt.output;
    x.exactly_once = opt.exactly_once;
    /* the quiet flush waits the idle timeout unless told */
    x.quiet_s = opt.quiet_s < 0 ? (double)x.cfg.idle_timeout_us / 1e6 : opt.quiet_s;
    x.exit_idle_s = opt.exit_idle_s;
    x.max_spans = (double)opt.max_spans;
    x.wcap = (size_t)opt.window;

    char err[1024];
    /* Validate the configuration before touching Kafka. */
    al_credit_sink probe = {.transition = on_transition, .ud = &x};
    al_credit_part *check = al_credit_part_new(&x.cfg, &probe, err, sizeof err);
    if (!check) return al_cli_usage_error("credit", "%s", err);
    al_credit_part_free(check);

    rc = AL_EXIT_FAILURE;
    if (x.wcap && !(x.window = calloc(x.wcap, sizeof *x.window))) goto out;
    if (!(x.metrics = al_metrics_new())) goto out;
    metrics_init(&x);
    /* Transitions are about as many bytes as the spans they come from. librdkafka would
     * buffer up to 1 GB of them ahead of its sends; 32 MB keeps the output in step with the
     * input (and the memory bounded): bench_credit ended with ~80 MB still to compress and
     * send after its last span, 30-80 ms of tail, and with the bound ends within ~20 ms. */
    static const char *const conf_defaults[] = {"queue.buffering.max.kbytes", "32768", NULL};
    const char *outs[] = {x.output, NULL};
    al_stage_spec spec = {
        .common = &common,
        .group = opt.group,
        .input = opt.input,
        .outputs = outs,
        .conf_defaults = conf_defaults,
        .metrics = x.metrics,
        .poll_ms = 100,
        .drain_s = opt.drain_s,
        .hooks = &credit_hooks,
        .ud = &x,
        .exactly_once = x.exactly_once,
    };
    rc = al_stage_run(&x.st, &spec);
out:
    al_span_clear(&x.span);
    al_buf_free(&x.buf);
    free(x.parts);
    free(x.window);
    al_metrics_free(x.metrics);
    return rc;
}
