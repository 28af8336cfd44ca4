/* 0301: `arclight record` and `arclight replay` against a real embedded broker over TCP:
 * record -> replay into an empty topic -> record again gives identical records; avrocat
 * reads recordings in every codec; offset and time ranges; pacing; a topic with fewer
 * partitions; delivery failures give a nonzero exit; bad usage exits 2. */
#include "testlib.h"
#include "support.h"

#include "t0399_tools_helpers.h"

#include "avro/codec.h"

#include <avro.h>
#include <jansson.h>

static al_test_broker broker;
static int broker_up;
static char dir[512];

static const char *bs(void)
{
    if (!broker_up && tools_broker_start(&broker) == 0) broker_up = 1;
    return broker_up ? broker.bootstrap : "127.0.0.1:1";
}

static const char *path_in_dir(char *buf, size_t n, const char *name)
{
    if (!dir[0]) al_test_tmpdir(dir, sizeof dir, "t0301");
    snprintf(buf, n, "%s/%s", dir, name);
    return buf;
}

/* One recorded message, as loaded back from a recording with avro-c. */
typedef struct rec {
    char topic[64];
    int32_t partition;
    int64_t offset, timestamp;
    int has_key, has_value;
    unsigned char key[64];
    size_t key_len;
    unsigned char value[512];
    size_t value_len;
    char headers[256]; /* name=value;... with "(null)" for null values */
} rec;

static void copy_nullable(avro_value_t *u, int *has, unsigned char *dst, size_t cap, size_t *len)
{
    avro_value_t b;
    const void *p = NULL;
    size_t n = 0;
    avro_value_get_current_branch(u, &b);
    *has = avro_value_get_type(&b) == AVRO_BYTES;
    if (*has) avro_value_get_bytes(&b, &p, &n);
    *len = n < cap ? n : cap;
    if (p && *len) memcpy(dst, p, *len);
}

/* Loads up to max records; returns how many, or -1 when the file is unreadable. */
static int load_recording(const char *path, rec *out, int max)
{
    avro_file_reader_t rd;
    if (avro_file_reader(path, &rd) != 0) return -1;
    avro_schema_t ws = avro_file_reader_get_writer_schema(rd);
    avro_value_iface_t *iface = avro_generic_class_from_schema(ws);
    avro_value_t v, f, arr, h, hf;
    avro_generic_value_new(iface, &v);
    int n = 0;
    while (n < max && avro_file_reader_read_value(rd, &v) == 0) {
        rec *r = &out[n++];
        memset(r, 0, sizeof *r);
        const char *s;
        size_t sl;
        avro_value_get_by_name(&v, "topic", &f, NULL);
        avro_value_get_string(&f, &s, &sl);
        snprintf(r->topic, sizeof r->topic, "%s", s);
        avro_value_get_by_name(&v, "partition", &f, NULL);
        avro_value_get_int(&f, &r->partition);
        avro_value_get_by_name(&v, "offset", &f, NULL);
        avro_value_get_long(&f, &r->offset);
        avro_value_get_by_name(&v, "timestamp", &f, NULL);
        avro_value_get_long(&f, &r->timestamp);
        avro_value_get_by_name(&v, "key", &f, NULL);
        copy_nullable(&f, &r->has_key, r->key, sizeof r->key, &r->key_len);
        avro_value_get_by_name(&v, "value", &f, NULL);
        copy_nullable(&f, &r->has_value, r->value, sizeof r->value, &r->value_len);
        avro_value_get_by_name(&v, "headers", &arr, NULL);
        size_t nh = 0;
        avro_value_get_size(&arr, &nh);
        for (size_t i = 0; i < nh; i++) {
            const char *name;
            size_t nl;
            avro_value_get_by_index(&arr, i, &h, NULL);
            avro_value_get_by_name(&h, "name", &hf, NULL);
            avro_value_get_string(&hf, &name, &nl);
            avro_value_get_by_name(&h, "value", &hf, NULL);
            int has;
            unsigned char hv[64];
            size_t hl;
            copy_nullable(&hf, &has, hv, sizeof hv - 1, &hl);
            hv[hl] = '\0';
            size_t used = strlen(r->headers);
            snprintf(r->headers + used, sizeof r->headers - used, "%s=%s;", name,
                     has ? (char *)hv : "(null)");
        }
    }
    avro_value_decref(&v);
    avro_value_iface_decref(iface);
    avro_schema_decref(ws); /* get_writer_schema hands out a reference */
    avro_file_reader_close(rd);
    return n;
}

static int rec_cmp(const void *a, const void *b)
{
    const rec *x = a, *y = b;
    if (x->partition != y->partition) return x->partition < y->partition ? -1 : 1;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

#define NMSG 40
static rec first[NMSG + 8], second[NMSG + 8];
static int64_t base_ts;

TEST(record_then_replay_then_record_gives_identical_records)
{
    REQUIRE(bs() && broker_up);
    tools_msg msgs[NMSG];
    char keys[NMSG][16];
    unsigned char values[NMSG][40];
    al_buf dl = {0};
    al_deadletter d;
    memset(&d, 0, sizeof d);
    d.source_topic = "arclight.spans";
    d.reason = "recorded";
    d.stage = "test";
    d.source_timestamp_us = -1;
    char err[256];
    REQUIRE(al_deadletter_encode(&d, &dl, err, sizeof err) == 0);
    base_ts = (int64_t)time(NULL) * 1000 - 60000;
    for (int i = 0; i < NMSG; i++) {
        snprintf(keys[i], sizeof keys[i], "task-%d", i % 7);
        for (int j = 0; j < 40; j++)
            values[i][j] = (unsigned char)(i * 31 + j * 7); /* binary */
        msgs[i] = (tools_msg){.topic = "t.src",
                              .partition = i % 4,
                              .key = keys[i],
                              .keylen = strlen(keys[i]),
                              .value = values[i],
                              .len = 40,
                              .timestamp_ms = base_ts + i,
                              .with_headers = i % 3 == 0};
    }
    msgs[5].value = dl.data; /* a real arclight message */
    msgs[5].len = dl.len;
    msgs[6].value = NULL; /* tombstone */
    msgs[6].len = 0;
    msgs[7].key = NULL; /* no key */
    msgs[7].keylen = 0;
    REQUIRE(tools_produce(bs(), msgs, NMSG) == 0);
    al_buf_free(&dl);

    char a[128], b[128];
    path_in_dir(a, sizeof a, "a.avro");
    path_in_dir(b, sizeof b, "b.avro");
    tools_run r;
    tools_arclight(&r, "record t.src -o %s --bootstrap %s", a, bs());
    CHECKF(r.status == 0, "record: exit %d: %s", r.status, r.err);
    tools_run_free(&r);
    int n1 = load_recording(a, first, NMSG + 8);
    REQUIRE(n1 == NMSG);

    tools_arclight(&r, "replay %s --topic-map t.src=t.dst --bootstrap %s", a, bs());
    CHECKF(r.status == 0, "replay: exit %d: %s", r.status, r.err);
    CHECKF(strstr(r.err, "40 of 40 messages") != NULL, "replay said: %s", r.err);
    tools_run_free(&r);

    tools_arclight(&r, "record t.dst -o %s --bootstrap %s", b, bs());
    CHECKF(r.status == 0, "record again: exit %d: %s", r.status, r.err);
    tools_run_free(&r);
    int n2 = load_recording(b, second, NMSG + 8);
    REQUIRE(n2 == NMSG);

    qsort(first, NMSG, sizeof(rec), rec_cmp);
    qsort(second, NMSG, sizeof(rec), rec_cmp);
    int64_t base1[4] = {-1, -1, -1, -1}, base2[4] = {-1, -1, -1, -1};
    int headers_seen = 0, tombstones = 0, nullkeys = 0;
    for (int i = 0; i < NMSG; i++) {
        rec *x = &first[i], *y = &second[i];
        CHECK_EQ_STR(x->topic, "t.src");
        CHECK_EQ_STR(y->topic, "t.dst");
        CHECK_EQ_INT(x->partition, y->partition);
        if (base1[x->partition] < 0) base1[x->partition] = x->offset;
        if (base2[y->partition] < 0) base2[y->partition] = y->offset;
        CHECK_EQ_INT(x->offset - base1[x->partition], y->offset - base2[y->partition]);
        CHECK_EQ_INT(x->timestamp, y->timestamp);
        CHECK_EQ_INT(x->has_key, y->has_key);
        CHECK(x->key_len == y->key_len && memcmp(x->key, y->key, x->key_len) == 0);
        CHECK_EQ_INT(x->has_value, y->has_value);
        CHECK(x->value_len == y->value_len && memcmp(x->value, y->value, x->value_len) == 0);
        CHECK_EQ_STR(x->headers, y->headers);
        if (strcmp(x->headers, "h1=a;h2=(null);h1=b;") == 0) headers_seen++;
        if (!x->has_value) tombstones++;
        if (!x->has_key) nullkeys++;
    }
    CHECK_EQ_INT(headers_seen, 14);
    CHECK_EQ_INT(tombstones, 1);
    CHECK_EQ_INT(nullkeys, 1);
}

TEST(avrocat_reads_recordings_in_every_codec)
{
    REQUIRE(broker_up);
    const char *codecs[] = {"deflate", "snappy", "null"};
    for (int c = 0; c < 3; c++) {
        char p[128], cmd[512];
        char name[32];
        snprintf(name, sizeof name, "%s.avro", codecs[c]);
        path_in_dir(p, sizeof p, name);
        tools_run r;
        tools_arclight(&r, "record t.src -o %s --codec %s --bootstrap %s", p, codecs[c], bs());
        CHECKF(r.status == 0, "record --codec %s: %s", codecs[c], r.err);
        tools_run_free(&r);
        snprintf(cmd, sizeof cmd, "avrocat '%s'", p);
        FILE *f = popen(cmd, "r");
        REQUIRE(f);
        char line[8192];
        int lines = 0, parsed = 0, src = 0;
        while (fgets(line, sizeof line, f)) {
            lines++;
            json_t *j = json_loads(line, 0, NULL);
            if (j) {
                parsed++;
                if (strcmp(json_string_value(json_object_get(j, "topic")) ?: "", "t.src") == 0)
                    src++;
                CHECK(json_object_get(j, "headers") && json_object_get(j, "offset"));
                json_decref(j);
            }
        }
        int st = pclose(f);
        CHECKF(WIFEXITED(st) && WEXITSTATUS(st) == 0, "avrocat failed on %s", codecs[c]);
        CHECKF(lines == NMSG && parsed == NMSG && src == NMSG, "%s: %d lines, %d JSON, %d t.src",
               codecs[c], lines, parsed, src);
    }
}

TEST(record_offset_ranges_and_fewer_partitions)
{
    REQUIRE(broker_up);
    char p[128];
    path_in_dir(p, sizeof p, "range.avro");
    tools_run r;
    tools_arclight(&r,
                   "record t.src --partition 1 --start-offset 2 --end-offset 5 -o %s "
                   "--bootstrap %s",
                   p, bs());
    CHECKF(r.status == 0, "%s", r.err);
    tools_run_free(&r);
    int n = load_recording(p, first, NMSG);
    REQUIRE(n == 3);
    for (int i = 0; i < 3; i++) {
        CHECK_EQ_INT(first[i].partition, 1);
        CHECK_EQ_INT(first[i].offset, 2 + i);
    }
    /* a start beyond the end records nothing and still writes a valid, empty file */
    tools_arclight(&r, "record t.src --start-offset 1000 -o %s --bootstrap %s", p, bs());
    CHECK_EQ_INT(r.status, 0);
    tools_run_free(&r);
    CHECK_EQ_INT(load_recording(p, first, NMSG), 0);

    /* t.one has one partition: everything lands there, in recorded order per key */
    char a[128];
    path_in_dir(a, sizeof a, "a.avro");
    tools_arclight(&r, "replay %s --topic-map t.src=t.one --bootstrap %s", a, bs());
    CHECKF(r.status == 0, "%s", r.err);
    CHECKF(strstr(r.err, "partitioned by key") != NULL, "no warning about partitions: %s", r.err);
    tools_run_free(&r);
    tools_arclight(&r, "record t.one -o %s --bootstrap %s", p, bs());
    CHECK_EQ_INT(r.status, 0);
    tools_run_free(&r);
    n = load_recording(p, second, NMSG + 8);
    CHECK_EQ_INT(n, NMSG);
    for (int i = 0; i < n; i++)
        CHECK_EQ_INT(second[i].partition, 0);
}

TEST(record_time_ranges_and_replay_pacing)
{
    REQUIRE(broker_up);
    int64_t t0 = (int64_t)time(NULL) * 1000 - 10000;
    tools_msg msgs[4];
    for (int i = 0; i < 4; i++)
        msgs[i] = (tools_msg){"t.time", 0, "k", 1, "v", 1, t0 + i * 300, 0};
    REQUIRE(tools_produce(bs(), msgs, 4) == 0);
    char p[128], q[128];
    path_in_dir(p, sizeof p, "time.avro");
    path_in_dir(q, sizeof q, "window.avro");
    tools_run r;
    tools_arclight(&r, "record t.time --start-time %lld --end-time %lld -o %s --bootstrap %s",
                   (long long)(t0 + 300), (long long)(t0 + 600), q, bs());
    CHECKF(r.status == 0, "%s", r.err);
    tools_run_free(&r);
    int n = load_recording(q, first, 8);
    CHECK_EQ_INT(n, 2);
    if (n == 2) {
        CHECK_EQ_INT(first[0].timestamp, t0 + 300);
        CHECK_EQ_INT(first[1].timestamp, t0 + 600);
    }
    /* ISO 8601 works too: everything is after 2001-09-09T01:46:40Z */
    tools_arclight(&r, "record t.time --start-time 2001-09-09T01:46:40Z -o %s --bootstrap %s", p,
                   bs());
    CHECKF(r.status == 0, "%s", r.err);
    tools_run_free(&r);
    CHECK_EQ_INT(load_recording(p, first, 8), 4);

    /* recorded pace: the gaps (3 x 300 ms) are kept */
    double s = testlib_now();
    tools_arclight(&r, "replay %s --rate recorded --topic-map t.time=t.one --bootstrap %s", p,
                   bs());
    double took = testlib_now() - s;
    CHECKF(r.status == 0, "%s", r.err);
    CHECKF(took >= 0.85, "recorded pace took only %.2fs for 900 ms of gaps", took);
    tools_run_free(&r);
    /* N per second: 4 messages at 10/s take at least 0.3 s */
    s = testlib_now();
    tools_arclight(&r, "replay %s --rate 10 --topic-map t.time=t.one --bootstrap %s", p, bs());
    took = testlib_now() - s;
    CHECKF(r.status == 0, "%s", r.err);
    CHECKF(took >= 0.29, "--rate 10 took only %.2fs for 4 messages", took);
    tools_run_free(&r);
}

/* Records in a file that may still be being written, counted by avrocat (avro-c leaks when
 * it meets a half-written header; in a child process that does not matter). */
static int count_with_avrocat(const char *path)
{
    char cmd[256];
    snprintf(cmd, sizeof cmd, "avrocat '%s' 2>/dev/null | wc -l", path);
    FILE *f = popen(cmd, "r");
    int n = -1;
    if (f) {
        if (fscanf(f, "%d", &n) != 1) n = -1;
        pclose(f);
    }
    return n;
}

TEST(record_follow_is_readable_while_running_and_closes_cleanly_on_sigint)
{
    REQUIRE(broker_up);
    char p[128], cmd[1024];
    path_in_dir(p, sizeof p, "follow.avro");
    snprintf(cmd, sizeof cmd,
             "exec '%s' record t.follow --follow -o '%s' --codec snappy "
             "--bootstrap %s >/dev/null 2>&1",
             al_test_bin(), p, bs());
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    usleep(1000000);
    tools_msg msgs[3];
    for (int i = 0; i < 3; i++)
        msgs[i] = (tools_msg){"t.follow", 0, "late", 4, "x", 1, 0, 0};
    CHECK(tools_produce(bs(), msgs, 3) == 0);
    /* flushed every second: the new messages show up while record still runs */
    int during = -1;
    for (int i = 0; i < 50 && during < 3; i++) {
        usleep(100000);
        during = count_with_avrocat(p);
    }
    CHECKF(during == 3, "while following: %d records, want 3", during);
    kill(pid, SIGINT);
    int st = -1;
    waitpid(pid, &st, 0);
    CHECKF(WIFEXITED(st) && WEXITSTATUS(st) == 0, "record --follow did not stop cleanly (%d)", st);
    CHECK_EQ_INT(load_recording(p, first, NMSG + 8), 3);
}

TEST(replay_exits_nonzero_when_deliveries_fail)
{
    REQUIRE(broker_up);
    char p[128];
    path_in_dir(p, sizeof p, "time.avro");
    char cmd[1024], errp[160];
    path_in_dir(errp, sizeof errp, "fail.err");
    /* 4 messages at 2/s: the broker goes away after the first; with a 1 s message timeout
     * the rest cannot be delivered */
    snprintf(cmd, sizeof cmd,
             "ARCLIGHT_KAFKA_MESSAGE_TIMEOUT_MS=1000 '%s' replay '%s' --rate 2 --bootstrap %s "
             "--topic-map t.time=t.one </dev/null >/dev/null 2>'%s'",
             al_test_bin(), p, bs(), errp);
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    usleep(700000);
    char reply[128];
    CHECKF(al_test_broker_control(&broker, "down 1", reply, sizeof reply) == 0, "down: %s", reply);
    int st = -1;
    for (int i = 0; i < 600 && waitpid(pid, &st, WNOHANG) != pid; i++)
        usleep(50000);
    if (!WIFEXITED(st)) {
        kill(pid, SIGKILL);
        waitpid(pid, &st, 0);
    }
    CHECK(al_test_broker_control(&broker, "up 1", reply, sizeof reply) == 0);
    char *err = al_test_slurp_text(errp);
    CHECKF(WIFEXITED(st) && WEXITSTATUS(st) == 1, "replay exit %d; stderr: %s",
           WIFEXITED(st) ? WEXITSTATUS(st) : -1, err);
    /* normally deliveries time out; on a very slow machine replay may not have connected
     * before the broker went away, which is a failure too */
    CHECKF(strstr(err, "failed") != NULL || strstr(err, "cannot reach"), "stderr: %s", err);
    free(err);
    unlink(errp);

    /* deterministic: a message bigger than the producer's message.max.bytes cannot be sent */
    static unsigned char big[5000];
    memset(big, 'b', sizeof big);
    tools_msg m = {"t.follow", 0, "big", 3, big, sizeof big, 0, 0};
    REQUIRE(tools_produce(bs(), &m, 1) == 0);
    char q[128];
    path_in_dir(q, sizeof q, "big.avro");
    tools_run r;
    tools_arclight(&r, "record t.follow -o %s --bootstrap %s", q, bs());
    CHECKF(r.status == 0, "%s", r.err);
    tools_run_free(&r);
    tools_arclight(&r, "replay %s --topic-map t.follow=t.one --bootstrap %s", q, bs());
    CHECKF(r.status == 0, "the big message replays with default settings: %s", r.err);
    tools_run_free(&r);
    setenv("ARCLIGHT_KAFKA_MESSAGE_MAX_BYTES", "2000", 1);
    tools_arclight(&r, "replay %s --topic-map t.follow=t.one --bootstrap %s", q, bs());
    unsetenv("ARCLIGHT_KAFKA_MESSAGE_MAX_BYTES");
    CHECKF(r.status == 1, "replay exit %d with a message over message.max.bytes: %s", r.status,
           r.err);
    CHECKF(strstr(r.err, "1 failed") != NULL, "stderr: %s", r.err);
    tools_run_free(&r);
}

TEST(bad_usage_and_bad_files)
{
    const char *bad[] = {
        "record t.src",
        "record -o x.avro",
        "record t.src -o x.avro --codec lz4",
        "record t.src -o x.avro --start-offset -1",
        "record t.src -o x.avro --start-time yesterday",
        "record t.src -o x.avro --end-time 2026-13-45T99:00:00Z",
        "record t.src -o x.avro --from-beginning --start-offset 3",
        "record t.src -o x.avro --start-offset 5 --end-offset 2",
        "replay",
        "replay a.avro b.avro",
        "replay a.avro --rate slow",
        "replay a.avro --rate -3",
        "replay a.avro --topic-map a",
        "replay a.avro --topic-map =b",
        "replay a.avro --timestamps later",
    };
    tools_run r;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        tools_arclight(&r, "%s", bad[i]);
        CHECKF(r.status == 2, "'%s' exited %d", bad[i], r.status);
        CHECKF(strstr(r.err, "arclight ") && strlen(r.err) > 20, "'%s' gave no reason: %s", bad[i],
               r.err);
        tools_run_free(&r);
    }
    CHECK_EQ_INT(access("x.avro", F_OK), -1);

    char p[128];
    path_in_dir(p, sizeof p, "not-avro.txt");
    FILE *f = fopen(p, "w");
    REQUIRE(f);
    fputs("hello\n", f);
    fclose(f);
    tools_arclight(&r, "replay %s --bootstrap %s", p, bs());
    CHECK_EQ_INT(r.status, 1);
    CHECKF(strstr(r.err, "not an Avro container"), "stderr: %s", r.err);
    tools_run_free(&r);

    /* an Avro container of something else */
    path_in_dir(p, sizeof p, "other.avro");
    avro_schema_t sch;
    const char *js = "{\"type\":\"record\",\"name\":\"Other\",\"fields\":[{\"name\":\"x\","
                     "\"type\":\"int\"}]}";
    REQUIRE(avro_schema_from_json_length(js, strlen(js), &sch) == 0);
    avro_file_writer_t w;
    REQUIRE(avro_file_writer_create(p, sch, &w) == 0);
    avro_file_writer_close(w);
    avro_schema_decref(sch);
    tools_arclight(&r, "replay %s --bootstrap %s", p, bs());
    CHECK_EQ_INT(r.status, 1);
    CHECKF(strstr(r.err, "Other") && strstr(r.err, "not arclight recordings"), "stderr: %s", r.err);
    tools_run_free(&r);

    tools_arclight(&r, "record --help");
    CHECK(r.status == 0 && strstr(r.out, "--end-offset"));
    tools_run_free(&r);
    tools_arclight(&r, "replay --help");
    CHECK(r.status == 0 && strstr(r.out, "--topic-map"));
    tools_run_free(&r);

    if (broker_up) CHECK_EQ_INT(tools_broker_stop(&broker), 0);
    broker_up = 0;
    if (dir[0] && al_test_rmtree(dir) != 0) fprintf(stderr, "could not remove %s\n", dir);
}
