/* 0300: `arclight tail` against a real embedded broker over TCP: JSON lines that parse,
 * decoded arclight values, an error object for an undecodable value, --max, --partition,
 * --follow, stopping at the end, and bad usage. */
#include "testlib.h"

#include "t0399_tools_helpers.h"

#include "avro/codec.h"

#include <arpa/inet.h>
#include <jansson.h>
#include <netinet/in.h>
#include <sys/socket.h>

static al_test_broker broker;
static int broker_up;

static const char *bs(void)
{
    if (!broker_up && tools_broker_start(&broker) == 0) broker_up = 1;
    return broker_up ? broker.bootstrap : "127.0.0.1:1";
}

/* A framed DeadLetter (an arclight message) with the given reason; the caller frees. */
static al_buf deadletter_value(const char *reason)
{
    al_buf b = {0};
    al_deadletter d;
    memset(&d, 0, sizeof d);
    d.source_topic = "arclight.spans";
    d.partition = 3;
    d.offset = 77;
    d.key = (const uint8_t *)"task-1";
    d.key_len = 6;
    d.value = (const uint8_t *)"\x01\x02";
    d.value_len = 2;
    d.reason = reason;
    d.stage = "credit";
    d.source_timestamp_us = -1;
    d.timestamp_us = 1764441000000000;
    char err[256];
    if (al_deadletter_encode(&d, &b, err, sizeof err) != 0) fprintf(stderr, "encode: %s\n", err);
    return b;
}

static const unsigned char garbage[] = {0xC3, 0x01, 0xde, 0xad, 0xbe, 0xef,
                                        0x00, 0x11, 0x22, 0x33, 0x44, 0xff};

TEST(tail_prints_every_message_as_json_including_undecodable_ones)
{
    REQUIRE(bs() && broker_up);
    al_buf v = deadletter_value("bad span: missing rollout id");
    REQUIRE(v.len > 10);
    tools_msg msgs[] = {
        {"t.src", 0, "task-1", 6, v.data, v.len, 0, 1},
        {"t.src", 0, "task-1", 6, garbage, sizeof garbage, 0, 0},
        {"t.src", 1, "\xff\xfe", 2, v.data, v.len, 0, 0}, /* a key that is not UTF-8 */
        {"t.src", 2, NULL, 0, NULL, 0, 0, 0},             /* no key, tombstone */
    };
    REQUIRE(tools_produce(bs(), msgs, 4) == 0);
    al_buf_free(&v);

    tools_run r;
    tools_arclight(&r, "tail t.src --from-beginning --bootstrap %s", bs());
    CHECKF(r.status == 0, "exit %d, stderr: %s", r.status, r.err);
    CHECKF(tools_count_lines(r.out) == 4, "want 4 lines, got:\n%s\nstderr: %s", r.out, r.err);
    int seen_decoded = 0, seen_error = 0, seen_binary_key = 0, seen_tombstone = 0;
    char *save = NULL;
    for (char *line = strtok_r(r.out, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        json_error_t je;
        json_t *j = json_loads(line, 0, &je);
        CHECKF(j != NULL, "not JSON (%s): %s", je.text, line);
        if (!j) continue;
        CHECK_EQ_STR(json_string_value(json_object_get(j, "topic")), "t.src");
        CHECK(json_is_integer(json_object_get(j, "partition")));
        CHECK(json_is_integer(json_object_get(j, "offset")));
        CHECK(json_integer_value(json_object_get(j, "timestamp")) > 1600000000000LL);
        CHECK(json_is_array(json_object_get(j, "headers")));
        int part = (int)json_integer_value(json_object_get(j, "partition"));
        int off = (int)json_integer_value(json_object_get(j, "offset"));
        json_t *val = json_object_get(j, "value");
        if (part == 0 && off == 0) {
            seen_decoded = 1;
            CHECK_EQ_STR(json_string_value(json_object_get(j, "key")), "task-1");
            CHECKF(json_is_object(val), "value: %s", line);
            CHECK_EQ_STR(json_string_value(json_object_get(val, "reason")),
                         "bad span: missing rollout id");
            CHECK_EQ_STR(json_string_value(json_object_get(val, "stage")), "credit");
            json_t *hs = json_object_get(j, "headers");
            CHECK_EQ_INT(json_array_size(hs), 3);
            CHECK_EQ_STR(json_string_value(json_object_get(json_array_get(hs, 0), "name")), "h1");
            CHECK_EQ_STR(json_string_value(json_object_get(json_array_get(hs, 0), "value")), "a");
            CHECK(json_is_null(json_object_get(json_array_get(hs, 1), "value")));
            CHECK_EQ_STR(json_string_value(json_object_get(json_array_get(hs, 2), "value")), "b");
        } else if (part == 0 && off == 1) {
            seen_error = 1;
            CHECK(val == NULL);
            const char *e = json_string_value(json_object_get(j, "error"));
            CHECKF(e && *e, "no error member: %s", line);
            /* base64 of the 12 garbage bytes */
            CHECK_EQ_STR(json_string_value(json_object_get(j, "value_base64")), "wwHerb7vABEiM0T/");
        } else if (part == 1) {
            seen_binary_key = 1;
            CHECK(json_object_get(j, "key") == NULL);
            CHECK_EQ_STR(json_string_value(json_object_get(j, "key_base64")), "//4=");
            CHECK(json_is_object(val));
        } else if (part == 2) {
            seen_tombstone = 1;
            CHECK(json_is_null(json_object_get(j, "key")));
            CHECK(val != NULL && json_is_null(val));
        }
        json_decref(j);
    }
    CHECK(seen_decoded && seen_error && seen_binary_key && seen_tombstone);
    tools_run_free(&r);
}

TEST(tail_max_and_partition_select_messages)
{
    REQUIRE(broker_up);
    tools_run r;
    tools_arclight(&r, "tail t.src --from-beginning --max 1 --bootstrap %s", bs());
    CHECK_EQ_INT(r.status, 0);
    CHECK_EQ_INT(tools_count_lines(r.out), 1);
    tools_run_free(&r);

    tools_arclight(&r, "tail t.src --from-beginning --partition 0 --bootstrap %s", bs());
    CHECK_EQ_INT(r.status, 0);
    CHECKF(tools_count_lines(r.out) == 2, "partition 0 has 2 messages, got:\n%s", r.out);
    CHECK(strstr(r.out, "\"partition\":1") == NULL);
    tools_run_free(&r);

    /* without --from-beginning and --follow there is nothing new to print: it just ends */
    tools_arclight(&r, "tail t.src --bootstrap %s", bs());
    CHECK_EQ_INT(r.status, 0);
    CHECK_EQ_STR(r.out, "");
    tools_run_free(&r);
}

TEST(tail_follow_prints_messages_produced_after_it_started)
{
    REQUIRE(broker_up);
    char cmd[1024], outp[64];
    snprintf(outp, sizeof outp, "/tmp/arclight-t0300-follow-%d", (int)getpid());
    snprintf(cmd, sizeof cmd, "'%s' tail t.one --follow --max 2 --bootstrap %s >%s 2>&1",
             al_test_bin(), bs(), outp);
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    /* give tail time to read the (empty) partition's end before producing */
    usleep(1500000);
    al_buf v = deadletter_value("late");
    tools_msg msgs[] = {{"t.one", 0, "k", 1, v.data, v.len, 0, 0},
                        {"t.one", 0, "k", 1, v.data, v.len, 0, 0}};
    CHECK(tools_produce(bs(), msgs, 2) == 0);
    al_buf_free(&v);
    int st = -1;
    for (int i = 0; i < 300; i++) {
        if (waitpid(pid, &st, WNOHANG) == pid) break;
        usleep(50000);
        if (i == 299) {
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
        }
    }
    char *out = al_test_slurp_text(outp);
    unlink(outp);
    CHECKF(WIFEXITED(st) && WEXITSTATUS(st) == 0, "tail --follow did not stop after --max 2: %s",
           out);
    CHECKF(tools_count_lines(out) == 2 && strstr(out, "\"reason\":\"late\""), "output: %s", out);
    free(out);
}

/* A free loopback port (bound and released: a small race, fine for a test). */
static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t l = sizeof a;
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) != 0 ||
        getsockname(fd, (struct sockaddr *)&a, &l) != 0) {
        if (fd >= 0) close(fd);
        return -1;
    }
    close(fd);
    return ntohs(a.sin_port);
}

/* GET path over a raw socket; the whole answer (malloc'd) or NULL. */
static char *http_get(int port, const char *path)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        if (fd >= 0) close(fd);
        return NULL;
    }
    char req[256];
    snprintf(req, sizeof req, "GET %s HTTP/1.0\r\n\r\n", path);
    if (write(fd, req, strlen(req)) < 0) {
        close(fd);
        return NULL;
    }
    char *out = calloc(1, 1 << 16);
    size_t n = 0;
    ssize_t k;
    while (out && n < (1 << 16) - 1 && (k = read(fd, out + n, (1 << 16) - 1 - n)) > 0)
        n += (size_t)k;
    close(fd);
    return out;
}

TEST(tail_serves_metrics_and_health_while_following)
{
    REQUIRE(broker_up);
    int port = free_port();
    REQUIRE(port > 0);
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "exec '%s' tail t.one --follow --metrics 127.0.0.1:%d "
             "--bootstrap %s >/dev/null 2>&1",
             al_test_bin(), port, bs());
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    char *health = NULL;
    for (int i = 0; i < 100 && !health; i++) {
        usleep(100000);
        health = http_get(port, "/healthz");
    }
    CHECKF(health && strstr(health, " 200 ") && strstr(health, "{\"status\":\"ok\"}"),
           "healthz: %s", health ? health : "(no answer)");
    free(health);
    al_buf v = deadletter_value("metered");
    tools_msg msgs[] = {{"t.one", 0, "k", 1, v.data, v.len, 0, 0}};
    CHECK(tools_produce(bs(), msgs, 1) == 0);
    al_buf_free(&v);
    int seen = 0;
    for (int i = 0; i < 100 && !seen; i++) {
        char *m = http_get(port, "/metrics");
        seen = m && strstr(m, "\narclight_tail_messages_total 1\n") != NULL;
        if (!seen) usleep(100000);
        if (seen) CHECK(strstr(m, "# TYPE arclight_tail_messages_total counter") != NULL);
        free(m);
    }
    CHECKF(seen, "the printed message never showed in /metrics");
    kill(pid, SIGTERM);
    int st = -1;
    waitpid(pid, &st, 0);
    CHECKF(WIFEXITED(st) && WEXITSTATUS(st) == 0, "tail did not stop cleanly on SIGTERM (%d)", st);
}

TEST(tail_reports_unknown_topics_and_bad_usage)
{
    REQUIRE(broker_up);
    tools_run r;
    tools_arclight(&r, "tail no.such.topic --from-beginning --bootstrap %s", bs());
    CHECK_EQ_INT(r.status, 1);
    CHECKF(strstr(r.err, "no.such.topic") && strstr(r.err, "does not exist"), "stderr: %s", r.err);
    tools_run_free(&r);

    tools_arclight(&r, "tail t.src --partition 9 --bootstrap %s", bs());
    CHECK_EQ_INT(r.status, 1);
    CHECKF(strstr(r.err, "4 partitions"), "stderr: %s", r.err);
    tools_run_free(&r);

    const char *bad[] = {"tail",
                         "tail --max 0 t.src",
                         "tail --max x t.src",
                         "tail --partition -1 t.src",
                         "tail --bogus t.src",
                         "tail t.src --max",
                         "tail t.src --metrics nohostport",
                         "tail t.src --log-level loud"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        tools_arclight(&r, "%s", bad[i]);
        CHECKF(r.status == 2, "'%s' exited %d", bad[i], r.status);
        CHECKF(strlen(r.err) > 10, "'%s' gave no reason", bad[i]);
        tools_run_free(&r);
    }
    tools_arclight(&r, "tail --help");
    CHECK_EQ_INT(r.status, 0);
    CHECK(strstr(r.out, "--from-beginning") != NULL);
    tools_run_free(&r);
    CHECK_EQ_INT(tools_broker_stop(&broker), 0);
    broker_up = 0;
}
