/*
 * t1002_proxy_faults: never block, never lose. The broker goes away while agents keep
 * calling (no call fails, every span arrives once it is back), the proxy is restarted with
 * spans still in its spool (they arrive from the next run), the spool fills up (503 with a
 * JSON reason, then calls resume), and SIGTERM lets a call in flight finish first.
 */
#define _GNU_SOURCE
#include "testlib.h"
#include "broker_fixture.h"
#include "t1099_proxy_helpers.h"

#include "core/util.h"

#include <dirent.h>
#include <jansson.h>
#include <netinet/tcp.h>
#include <pthread.h>

static al_test_broker B;
static fake_upstream *U;
static char TMP[512], UPURL[128];

static const char *CHAT = "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}";

/* Every proxy here drains for at most 2 s (a test's own --drain-timeout comes after). */
static const char *const DRAIN2[] = {"--drain-timeout", "2", NULL};

static int calls(const px_child *p, const char *rollout, int n, int *n503)
{
    char path[256];
    snprintf(path, sizeof path, "/r/task-x/%s/v1/chat/completions", rollout);
    int ok = 0;
    for (int i = 0; i < n; i++) {
        px_resp r;
        if (px_post(p, path, CHAT, &r) != 0) continue;
        if (r.status == 200)
            ok++;
        else if (r.status == 503 && n503 && strstr(r.body, "\"spool_full\""))
            (*n503)++;
        px_resp_free(&r);
    }
    return ok;
}

/* Reads the topic until every sequence 0..n-1 of rollout is there; how many distinct. */
static int arrived(const char *rollout, int n, int timeout_ms)
{
    al_test_msgs m;
    al_test_topic_read(B.bootstrap, "arclight.spans", rollout, (size_t)n, timeout_ms, &m);
    al_span *s = calloc((size_t)m.n + 1, sizeof *s);
    size_t k = px_spans_of(&m, rollout, s, m.n + 1);
    char seen[1024] = {0};
    int distinct = 0;
    for (size_t i = 0; i < k; i++) {
        if (s[i].sequence >= 0 && s[i].sequence < 1024 && !seen[s[i].sequence]++) distinct++;
        al_span_clear(&s[i]);
    }
    free(s);
    al_test_msgs_free(&m);
    return distinct;
}

static int count_segments(const char *spool_name)
{
    char dir[700];
    snprintf(dir, sizeof dir, "%s/%s", TMP, spool_name);
    DIR *d = opendir(dir);
    if (!d) return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strstr(e->d_name, ".seg")) n++;
    closedir(d);
    return n;
}

TEST(setup)
{
    curl_global_init(CURL_GLOBAL_DEFAULT);
    REQUIRE(al_test_broker_start(&B, NULL) == 0);
    U = fake_upstream_start(0, 1);
    REQUIRE(U);
    snprintf(UPURL, sizeof UPURL, "http://127.0.0.1:%d", fake_upstream_port(U));
    al_test_tmpdir(TMP, sizeof TMP, "proxy");
    REQUIRE(TMP[0]);
}

TEST(broker_down_agents_unaffected_spans_arrive_later)
{
    px_child p;
    REQUIRE(px_start_proxy(&p, TMP, UPURL, B.bootstrap, "a", DRAIN2, NULL) == 0);
    CHECK_EQ_INT(calls(&p, "roll-a", 3, NULL), 3);
    REQUIRE(al_test_broker_control(&B, "down 1", NULL, 0) == 0);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    CHECK_EQ_INT(calls(&p, "roll-a", 20, NULL), 20);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double el = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
    CHECKF(el < 5.0, "20 calls took %.2f s with the broker down", el);
    char url[300];
    snprintf(url, sizeof url, "%s/metrics", p.base);
    px_resp r;
    REQUIRE(px_http("GET", url, NULL, NULL, &r) == 0);
    CHECK(strstr(r.body, "arclight_proxy_spool_spans") != NULL);
    CHECK(strstr(r.body, "arclight_proxy_spool_spans 0\n") == NULL); /* some are waiting */
    px_resp_free(&r);
    usleep(500000);
    REQUIRE(al_test_broker_control(&B, "up 1", NULL, 0) == 0);
    CHECK_EQ_INT(arrived("roll-a", 23, 40000), 23);
    CHECK_EQ_INT(px_stop(&p, SIGTERM, 30), 0);
    CHECK_EQ_INT(count_segments("spool-a"), 0);
}

/* A broker away for longer than message.timeout.ms (1 s here): librdkafka gives the queued
 * spans up ("Local: Message timed out"), the spool keeps them and sends them again, and they
 * must still reach the topic in the order the proxy numbered them (credit waits for spans an
 * end overtook only --end-wait seconds). */
TEST(spans_keep_their_order_through_an_outage_longer_than_the_message_timeout)
{
    px_child p;
    static const char *const env[] = {"ARCLIGHT_KAFKA_MESSAGE_TIMEOUT_MS=1000", NULL};
    REQUIRE(px_start_proxy(&p, TMP, UPURL, B.bootstrap, "o", DRAIN2, env) == 0);
    CHECK_EQ_INT(calls(&p, "roll-o", 2, NULL), 2);
    REQUIRE(arrived("roll-o", 2, 20000) == 2);
    REQUIRE(al_test_broker_control(&B, "down 1", NULL, 0) == 0);
    for (int i = 0; i < 12; i++) { /* spread over 3 s: their timeouts would fall apart */
        CHECK_EQ_INT(calls(&p, "roll-o", 1, NULL), 1);
        usleep(250000);
    }
    sleep(2);
    REQUIRE(al_test_broker_control(&B, "up 1", NULL, 0) == 0);
    CHECK_EQ_INT(arrived("roll-o", 14, 40000), 14);
    al_test_msgs m;
    al_test_topic_read(B.bootstrap, "arclight.spans", "roll-o", 14, 20000, &m);
    int64_t last = -1;
    int out_of_order = 0, n = 0;
    char err[256];
    for (size_t i = 0; i < m.n; i++) { /* in offset order: one partition */
        al_span sp;
        memset(&sp, 0, sizeof sp);
        if (al_span_decode(m.val[i], m.len[i], &sp, err, sizeof err) == 0 &&
            !strcmp(sp.rollout_id, "roll-o")) {
            n++;
            if (sp.sequence <= last) {
                if (!out_of_order)
                    fprintf(stderr, "  sequence %lld after %lld\n", (long long)sp.sequence,
                            (long long)last);
                out_of_order++;
            }
            if (sp.sequence > last) last = sp.sequence;
        }
        al_span_clear(&sp);
    }
    al_test_msgs_free(&m);
    CHECK_EQ_INT(n, 14);
    CHECKF(out_of_order == 0, "%d of %d spans of roll-o came after a later one", out_of_order, n);
    CHECK_EQ_INT(px_stop(&p, SIGTERM, 30), 0);
}

TEST(restart_with_spooled_spans)
{
    px_child p;
    REQUIRE(px_start_proxy(&p, TMP, UPURL, B.bootstrap, "b", DRAIN2, NULL) == 0);
    REQUIRE(al_test_broker_control(&B, "down 1", NULL, 0) == 0);
    CHECK_EQ_INT(calls(&p, "roll-b", 10, NULL), 10);
    CHECK_EQ_INT(px_stop(&p, SIGTERM, 30), 0); /* drain timeout 2 s: spans stay on disk */
    CHECK(count_segments("spool-b") >= 1);
    REQUIRE(al_test_broker_control(&B, "up 1", NULL, 0) == 0);
    REQUIRE(px_start_proxy(&p, TMP, UPURL, B.bootstrap, "b", DRAIN2, NULL) == 0);
    CHECK_EQ_INT(arrived("roll-b", 10, 40000), 10);
    CHECK_EQ_INT(px_stop(&p, SIGTERM, 30), 0);
    CHECK_EQ_INT(count_segments("spool-b"), 0);
}

/* A rollout going on across a restart keeps counting (3, 4 after 0, 1, 2; a reward after
 * the restart points at call 2's successor), and a session key made before the restart
 * still names its rollout; a torn last line in the state file is skipped. */
TEST(sequences_and_sessions_survive_restart)
{
    px_child p;
    REQUIRE(px_start_proxy(&p, TMP, UPURL, B.bootstrap, "st", DRAIN2, NULL) == 0);
    CHECK_EQ_INT(calls(&p, "roll-st", 3, NULL), 3);
    char url[300];
    snprintf(url, sizeof url, "%s/v1/sessions", p.base);
    px_resp r;
    REQUIRE(px_http("POST", url, PX_JSON, "{\"task_id\":\"task-x\",\"rollout_id\":\"roll-sk\"}",
                    &r) == 0);
    CHECK_EQ_INT(r.status, 200);
    char key[128] = "";
    const char *k = strstr(r.body, "\"session_key\":\"");
    if (k) sscanf(k + 15, "%100[^\"]", key);
    px_resp_free(&r);
    REQUIRE(key[0]);
    CHECK_EQ_INT(px_stop(&p, SIGTERM, 30), 0);
    /* a crash in the middle of a line */
    char path[800];
    snprintf(path, sizeof path, "%s/spool-st/proxy-state", TMP);
    FILE *f = fopen(path, "a");
    REQUIRE(f);
    fputs("Q\ttask-x\x1f"
          "roll-st\x1f"
          "0\t99",
          f);
    fclose(f);

    REQUIRE(px_start_proxy(&p, TMP, UPURL, B.bootstrap, "st", DRAIN2, NULL) == 0);
    CHECK_EQ_INT(calls(&p, "roll-st", 2, NULL), 2);
    snprintf(url, sizeof url, "%s/r/task-x/roll-st/reward", p.base);
    REQUIRE(px_http("POST", url, PX_JSON, "{\"value\":1}", &r) == 0);
    CHECK_EQ_INT(r.status, 200);
    px_resp_free(&r);
    char auth[200];
    snprintf(auth, sizeof auth, "Authorization: Bearer %s", key);
    const char *h[] = {"Content-Type: application/json", auth, NULL};
    snprintf(url, sizeof url, "%s/v1/chat/completions", p.base);
    REQUIRE(px_http("POST", url, h, CHAT, &r) == 0);
    CHECK_EQ_INT(r.status, 200);
    CHECK(strstr(r.headers, "x-arclight-rollout: roll-sk") != NULL);
    px_resp_free(&r);
    CHECK_EQ_INT(px_stop(&p, SIGTERM, 30), 0);
    char log[800], *lt, err[256];
    snprintf(log, sizeof log, "%s/st.log", TMP);
    size_t ll = 0;
    lt = al_file_read(log, &ll, err, sizeof err);
    CHECK(lt && strstr(lt, "lines not understood"));
    free(lt);

    al_test_msgs m;
    REQUIRE(al_test_topic_read(B.bootstrap, "arclight.spans", "roll-st", 6, 30000, &m) == 0);
    al_span s[8];
    size_t n = px_spans_of(&m, "roll-st", s, 8);
    CHECK_EQ_INT(n, 6);
    int seen[8] = {0};
    for (size_t i = 0; i < n; i++) {
        if (s[i].sequence >= 0 && s[i].sequence < 8) seen[s[i].sequence]++;
        if (s[i].kind == AL_SPAN_KIND_REWARD) {
            CHECK(s[i].sequence == 5);
            CHECK(s[i].reward.after_sequence == 4);
        }
        al_span_clear(&s[i]);
    }
    for (int i = 0; i < 6; i++)
        CHECKF(seen[i] == 1, "sequence %d seen %d times", i, seen[i]);
    al_test_msgs_free(&m);
    REQUIRE(al_test_topic_read(B.bootstrap, "arclight.spans", "roll-sk", 1, 30000, &m) == 0);
    n = px_spans_of(&m, "roll-sk", s, 8);
    CHECK_EQ_INT(n, 1);
    for (size_t i = 0; i < n; i++)
        al_span_clear(&s[i]);
    al_test_msgs_free(&m);
}

TEST(spool_full_503_then_resumes)
{
    px_child p;
    const char *extra[] = {"--drain-timeout", "2", "--spool-max-bytes", "12000", NULL};
    REQUIRE(px_start_proxy(&p, TMP, UPURL, B.bootstrap, "c", extra, NULL) == 0);
    REQUIRE(al_test_broker_control(&B, "down 1", NULL, 0) == 0);
    int n503 = 0;
    int ok = calls(&p, "roll-c", 30, &n503);
    CHECKF(ok >= 2 && n503 >= 1 && ok + n503 == 30, "%d ok, %d spool-full 503s", ok, n503);
    char url[300];
    snprintf(url, sizeof url, "%s/r/task-x/roll-c/v1/chat/completions", p.base);
    px_resp r;
    REQUIRE(px_http("POST", url, PX_JSON, CHAT, &r) == 0);
    CHECK_EQ_INT(r.status, 503);
    json_t *o = json_loads(r.body, 0, NULL);
    const char *msg = json_string_value(json_object_get(json_object_get(o, "error"), "message"));
    CHECK(msg && strstr(msg, "spool is full"));
    json_decref(o);
    px_resp_free(&r);
    REQUIRE(al_test_broker_control(&B, "up 1", NULL, 0) == 0);
    CHECK_EQ_INT(arrived("roll-c", ok, 40000), ok);
    /* drained: calls are taken again */
    int again = 0;
    for (int i = 0; i < 50 && !again; i++) {
        px_resp q;
        if (px_http("POST", url, PX_JSON, CHAT, &q) == 0 && q.status == 200) again = 1;
        if (q.body) px_resp_free(&q);
        if (!again) usleep(100000);
    }
    CHECK(again);
    CHECK_EQ_INT(px_stop(&p, SIGTERM, 30), 0);
}

typedef struct slow_call {
    const px_child *p;
    px_resp r;
    int rc;
} slow_call;

static void *slow_thread(void *arg)
{
    slow_call *s = arg;
    s->rc = px_post(s->p, "/r/task-x/roll-d/v1/chat/completions",
                    "{\"model\":\"slow-stream\",\"stream\":true,\"messages\":[{\"role\":\"user\","
                    "\"content\":\"s\"}]}",
                    &s->r);
    return NULL;
}

TEST(sigterm_finishes_calls_in_flight)
{
    px_child p;
    const char *extra[] = {"--drain-timeout", "2", "--drain-timeout", "20", NULL};
    REQUIRE(px_start_proxy(&p, TMP, UPURL, B.bootstrap, "d", extra, NULL) == 0);
    slow_call s = {.p = &p};
    pthread_t th;
    pthread_create(&th, NULL, slow_thread, &s);
    usleep(200000);
    kill(p.pid, SIGTERM);
    pthread_join(th, NULL);
    CHECK_EQ_INT(s.rc, 0);
    CHECK_EQ_INT(s.r.status, 200);
    CHECK(s.r.body && strstr(s.r.body, "data: [DONE]"));
    if (s.rc == 0) px_resp_free(&s.r);
    CHECK_EQ_INT(px_stop(&p, SIGTERM, 30), 0);
    CHECK_EQ_INT(arrived("roll-d", 1, 20000), 1);
}

TEST(span_too_large_for_kafka_is_dropped_loudly_not_blocking)
{
    /* the broker takes at most 4 kB per message here: a span over it can never be
     * delivered; it must not hold back the spans after it */
    char conf[700];
    snprintf(conf, sizeof conf, "%s/small.conf", TMP);
    FILE *f = fopen(conf, "w");
    REQUIRE(f);
    fputs("message.max.bytes=4096\n", f);
    fclose(f);
    px_child p;
    const char *extra[] = {"--drain-timeout", "2", "--config", conf, NULL};
    REQUIRE(px_start_proxy(&p, TMP, UPURL, B.bootstrap, "e", extra, NULL) == 0);
    size_t n = 6000;
    char *big = malloc(n + 128);
    int k =
        snprintf(big, n + 128, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"");
    memset(big + k, 'q', n);
    strcpy(big + k + n, "\"}]}");
    px_resp r;
    REQUIRE(px_post(&p, "/r/task-x/roll-e/v1/chat/completions", big, &r) == 0);
    CHECK_EQ_INT(r.status, 200);
    px_resp_free(&r);
    free(big);
    CHECK_EQ_INT(calls(&p, "roll-e", 2, NULL), 2);
    /* sequences 1 and 2 arrive; 0 was too large */
    al_test_msgs m;
    al_test_topic_read(B.bootstrap, "arclight.spans", "roll-e", 2, 30000, &m);
    al_span s[8];
    size_t got = px_spans_of(&m, "roll-e", s, 8);
    CHECK_EQ_INT(got, 2);
    for (size_t i = 0; i < got; i++) {
        CHECK_EQ_INT(s[i].sequence, (int64_t)i + 1);
        al_span_clear(&s[i]);
    }
    al_test_msgs_free(&m);
    char url[300];
    snprintf(url, sizeof url, "%s/metrics", p.base);
    REQUIRE(px_http("GET", url, NULL, NULL, &r) == 0);
    CHECK(strstr(r.body, "arclight_proxy_spans_dropped_total 1\n") != NULL);
    px_resp_free(&r);
    CHECK_EQ_INT(px_stop(&p, SIGTERM, 30), 0);
    char log[700];
    snprintf(log, sizeof log, "%s/e.log", TMP);
    CHECK(px_file_contains(log, "dropped: "));
    CHECK_EQ_INT(count_segments("spool-e"), 0);
}

static int raw_connect(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, "127.0.0.1", &sin.sin_addr);
    if (connect(fd, (struct sockaddr *)&sin, sizeof sin) != 0) {
        close(fd);
        return -1;
    }
    struct timeval tv = {5, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    return fd;
}

/* Everything the server sends until it closes (or 5 s pass). */
static void raw_read_all(int fd, char *buf, size_t n)
{
    size_t got = 0;
    ssize_t r;
    while (got + 1 < n && (r = read(fd, buf + got, n - 1 - got)) > 0)
        got += (size_t)r;
    buf[got] = '\0';
}

TEST(connection_limit_and_request_timeout)
{
    px_child p;
    const char *extra[] = {"--drain-timeout",  "2", "--max-connections", "2",
                           "--client-timeout", "1", NULL};
    REQUIRE(px_start_proxy(&p, TMP, UPURL, B.bootstrap, "f", extra, NULL) == 0);
    int a = raw_connect(p.port), b = raw_connect(p.port);
    REQUIRE(a >= 0 && b >= 0);
    usleep(100000);
    int c = raw_connect(p.port);
    REQUIRE(c >= 0);
    char buf[4096];
    raw_read_all(c, buf, sizeof buf);
    CHECKF(strstr(buf, "HTTP/1.1 503") && strstr(buf, "\"overloaded\""), "third connection got: %s",
           buf);
    close(c);
    /* a request that never completes: 408 with a JSON body after the client timeout */
    const char *partial = "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Le";
    CHECK(write(a, partial, strlen(partial)) == (ssize_t)strlen(partial));
    raw_read_all(a, buf, sizeof buf);
    CHECKF(strstr(buf, "HTTP/1.1 408") && strstr(buf, "\"request_timeout\""),
           "slow request got: %s", buf);
    close(a);
    close(b);
    CHECK_EQ_INT(px_stop(&p, SIGTERM, 30), 0);
}

/* Requests sent back to back in one write (pipelining) are answered in order on the same
 * connection, and a request split across many small writes is still read whole. */
TEST(pipelined_and_trickled_requests)
{
    px_child p;
    REQUIRE(px_start_proxy(&p, TMP, UPURL, B.bootstrap, "g", DRAIN2, NULL) == 0);
    int fd = raw_connect(p.port);
    REQUIRE(fd >= 0);
    char req[1024];
    int n = snprintf(req, sizeof req,
                     "POST /r/task-p/roll-p/v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                     "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n%s"
                     "GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
                     strlen(CHAT), CHAT);
    CHECK(write(fd, req, (size_t)n) == n);
    char buf[8192];
    raw_read_all(fd, buf, sizeof buf);
    close(fd);
    char *first = strstr(buf, "HTTP/1.1 200"), *chat = strstr(buf, "chat.completion");
    char *second = first ? strstr(first + 1, "HTTP/1.1 200") : NULL;
    char *health = strstr(buf, "{\"status\":\"ok\"}");
    CHECKF(first && chat && second && health && chat < second && second < health,
           "pipelined answers: %s", buf);
    CHECKF(!strstr(buf, "logprobs\":{") && !strstr(buf, "token_ids\":["),
           "capture fields reached the agent: %s", buf);

    /* the same call one byte per write */
    fd = raw_connect(p.port);
    REQUIRE(fd >= 0);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    n = snprintf(req, sizeof req,
                 "POST /r/task-p/roll-p/v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                 "Connection: close\r\nContent-Type: application/json\r\n"
                 "Content-Length: %zu\r\n\r\n%s",
                 strlen(CHAT), CHAT);
    for (int i = 0; i < n; i++) {
        CHECK(write(fd, req + i, 1) == 1);
        if (i % 16 == 0) usleep(1000);
    }
    raw_read_all(fd, buf, sizeof buf);
    close(fd);
    CHECKF(strstr(buf, "HTTP/1.1 200") && strstr(buf, "chat.completion"), "trickled call: %s",
           buf);
    CHECK(arrived("roll-p", 2, 20000) == 2);
    CHECK_EQ_INT(px_stop(&p, SIGTERM, 30), 0);
}

TEST(teardown)
{
    fake_upstream_stop(U);
    al_test_broker_stop(&B);
    al_test_rmtree(TMP);
    curl_global_cleanup();
}
