/*
 * 1601: the capture proxy probed as an attacker and as a careless client would probe it
 * (issue 15, items 8-14), over real sockets, with the fake upstream (tests/fake_upstream.c)
 * and the embedded broker:
 *   state_file_*    the state file is created 0600 and is not rewritten on every change once
 *                   it is large (it was past 16 MiB: 350-580 ms a call)
 *   sessions_*      session keys expire (--session-ttl), one agent key holds at most
 *                   --max-sessions-per-key, agent keys come from a file (out of ps)
 *   slow_*          a head trickling in is cut at --client-timeout in total (408); the 503 of
 *                   a full proxy has the length it declares
 *   duplicate_*     a key given twice: the last wins on every path (the agent, the span and
 *                   the upstream agree)
 *   utf8_*          what is not UTF-8 is refused at the door, or (from the upstream) escaped,
 *                   so that every span decodes
 *   upstream_key_*  an upstream that echoes the key puts it in no answer, span or log line
 *   log_*           a newline from an upstream cannot forge a log line
 *   serve_api_key   serve's --api-key-file guards /v1 (and stays out of ps)
 */
#define _GNU_SOURCE
#include "testlib.h"
#include "broker_fixture.h"
#include "t1099_proxy_helpers.h"
#include "t1699_http_raw.h"

#include "core/util.h"

#include <jansson.h>
#include <sys/stat.h>

static al_test_broker g_broker;
static fake_upstream *g_up;
static char g_dir[512], g_upurl[128];

static int cmdline_has(pid_t pid, const char *needle)
{
    char p[64];
    snprintf(p, sizeof p, "/proc/%d/cmdline", (int)pid);
    FILE *f = fopen(p, "rb");
    if (!f) return 0;
    char buf[8192];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    for (size_t i = 0; i < n; i++)
        if (!buf[i]) buf[i] = ' ';
    buf[n] = 0;
    return strstr(buf, needle) != NULL;
}

TEST(setup)
{
    curl_global_init(CURL_GLOBAL_ALL);
    al_test_tmpdir(g_dir, sizeof g_dir, "proxy");
    REQUIRE(g_dir[0]);
    REQUIRE(al_test_broker_start(&g_broker, NULL) == 0);
    g_up = fake_upstream_start(0, 1);
    REQUIRE(g_up);
    snprintf(g_upurl, sizeof g_upurl, "http://127.0.0.1:%d", fake_upstream_port(g_up));
}

static const char *chat_body(const char *model)
{
    static char b[400];
    snprintf(b, sizeof b,
             "{\"model\":\"%s\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":4}",
             model);
    return b;
}

/* Item 8: 230 000 sessions left by an earlier run (18 MB: past the old 16 MiB mark, where
 * every state change rewrote and fsynced the whole file). */
TEST(state_file_is_private_and_not_rewritten_on_every_change)
{
    char spool[700], state[800];
    snprintf(spool, sizeof spool, "%s/spool-state", g_dir);
    mkdir(spool, 0755);
    snprintf(state, sizeof state, "%s/proxy-state", spool);
    FILE *f = fopen(state, "w");
    REQUIRE(f);
    /* in the format of the version before expiry (5 fields): read as made now */
    for (int i = 0; i < 230000; i++)
        fprintf(f, "S\tsk-arclight-%048x\tt\troll-%d\t0\n", i, i);
    fclose(f);
    chmod(state, 0644); /* as an earlier version made it */
    px_child p;
    REQUIRE(px_start_proxy(&p, g_dir, g_upurl, g_broker.bootstrap, "state", NULL, NULL) == 0);
    struct stat sb;
    REQUIRE(stat(state, &sb) == 0);
    CHECKF((sb.st_mode & 0777) == 0600, "the state file is %o", sb.st_mode & 0777);
    printf("  state file: %lld bytes after start\n", (long long)sb.st_size);
    CHECK(sb.st_size > 16 << 20);
    ino_t ino = sb.st_ino;
    double worst = 0, t0 = testlib_now();
    for (int i = 0; i < 40; i++) {
        char path[128];
        snprintf(path, sizeof path, "/r/t/state-roll-%d/v1/chat/completions", i);
        px_resp r;
        REQUIRE(px_post(&p, path, chat_body("m"), &r) == 0);
        CHECK_EQ_INT(r.status, 200);
        if (r.total_s > worst) worst = r.total_s;
        px_resp_free(&r);
    }
    printf("  40 calls in %.2f s, the slowest %.1f ms\n", testlib_now() - t0, worst * 1000);
    usleep(200000); /* the last turn's state lines */
    REQUIRE(stat(state, &sb) == 0);
    /* appended to, never rewritten: the same file (a rewrite renames a new one into place) */
    CHECKF(sb.st_ino == ino, "the state file was rewritten during 40 calls");
    char *st = al_test_slurp_text(state);
    CHECK(strstr(st, "state-roll-39") != NULL);
    free(st);
    CHECK_EQ_INT(px_stop(&p, SIGTERM, 30), 0);
}

static char *new_session(const px_child *p, const char *key, long *status)
{
    char auth[200];
    snprintf(auth, sizeof auth, "Authorization: Bearer %s", key);
    const char *h[] = {"Content-Type: application/json", auth, NULL};
    char url[300];
    snprintf(url, sizeof url, "%s/v1/sessions", p->base);
    px_resp r;
    if (px_http("POST", url, h, "{}", &r) != 0) return NULL;
    *status = r.status;
    json_t *j = json_loads(r.body, 0, NULL);
    const char *k = json_string_value(json_object_get(j, "session_key"));
    char *out = k ? strdup(k) : NULL;
    json_decref(j);
    px_resp_free(&r);
    return out;
}

static long call_with(const px_child *p, const char *key)
{
    char auth[200], url[300];
    snprintf(auth, sizeof auth, "Authorization: Bearer %s", key);
    const char *h[] = {"Content-Type: application/json", auth, NULL};
    snprintf(url, sizeof url, "%s/v1/chat/completions", p->base);
    px_resp r;
    if (px_http("POST", url, h, chat_body("m"), &r) != 0) return -1;
    long s = r.status;
    px_resp_free(&r);
    return s;
}

/* Item 8 (sessions) and 14 (keys out of ps). */
TEST(sessions_expire_and_are_limited_per_agent_key)
{
    char keyfile[700];
    snprintf(keyfile, sizeof keyfile, "%s/agent-keys", g_dir);
    FILE *f = fopen(keyfile, "w");
    REQUIRE(f);
    fputs("# agent keys\nkey-from-the-file-b\n", f);
    fclose(f);
    px_child p;
    const char *extra[] = {"--agent-key", "key-a", "--agent-key-file", keyfile, "--session-ttl",
                           "6", "--max-sessions-per-key", "3", NULL};
    REQUIRE(px_start_proxy(&p, g_dir, g_upurl, g_broker.bootstrap, "sessions", extra, NULL) == 0);
    CHECK(!cmdline_has(p.pid, "key-from-the-file-b"));
    long st = 0;
    char *s[4] = {0};
    for (int i = 0; i < 3; i++) {
        s[i] = new_session(&p, "key-a", &st);
        CHECKF(s[i] && st == 200, "session %d: %ld", i, st);
    }
    s[3] = new_session(&p, "key-a", &st);
    CHECK_EQ_INT(st, 429);
    CHECK(s[3] == NULL);
    /* another key has room of its own; the key from the file works */
    char *b = new_session(&p, "key-from-the-file-b", &st);
    CHECK_EQ_INT(st, 200);
    CHECK_EQ_INT(call_with(&p, "wrong-key"), 401);
    if (s[0]) CHECK_EQ_INT(call_with(&p, s[0]), 200);
    /* past --session-ttl the key no longer works, and key-a has room again */
    sleep(7);
    if (s[0]) CHECK_EQ_INT(call_with(&p, s[0]), 401);
    char *again = new_session(&p, "key-a", &st);
    CHECK_EQ_INT(st, 200);
    CHECK_EQ_INT(px_stop(&p, SIGTERM, 30), 0);
    /* a restart forgets the expired ones: only `again` (and b, made before) may be loaded */
    REQUIRE(px_start_proxy(&p, g_dir, g_upurl, g_broker.bootstrap, "sessions", extra, NULL) == 0);
    if (s[1]) CHECK_EQ_INT(call_with(&p, s[1]), 401);
    if (again) CHECK_EQ_INT(call_with(&p, again), 200);
    CHECK_EQ_INT(px_stop(&p, SIGTERM, 30), 0);
    for (int i = 0; i < 4; i++)
        free(s[i]);
    free(b);
    free(again);
}

/* Item 9: slowloris, and the 503 of a full proxy. */
TEST(slow_heads_get_408_and_a_full_proxy_503_of_its_stated_length)
{
    px_child p;
    const char *extra[] = {"--client-timeout", "2", "--max-connections", "2", NULL};
    REQUIRE(px_start_proxy(&p, g_dir, g_upurl, g_broker.bootstrap, "slow", extra, NULL) == 0);
    hr_conn c = {.fd = hr_connect(p.port)};
    REQUIRE(c.fd >= 0);
    const char *head = "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaa";
    double t0 = hr_now();
    for (size_t i = 0; head[i] && hr_now() - t0 < 15; i++) {
        if (hr_send(c.fd, head + i, 1) != 0) break;
        struct pollfd pf = {.fd = c.fd, .events = POLLIN};
        if (poll(&pf, 1, 300) > 0) break;
    }
    hr_resp r;
    hr_read(&c, &r, 0, 10);
    double dt = hr_now() - t0;
    printf("  trickled head answered %d after %.1f s\n", r.status, dt);
    CHECK_EQ_INT(r.status, 408);
    CHECKF(dt >= 1.5 && dt < 6, "the 408 came after %.1f s (--client-timeout 2)", dt);
    hr_resp_free(&r);
    close(c.fd);
    free(c.buf);
    /* two connections held open fill it; a third is told so, in as many bytes as it says */
    int a = hr_connect(p.port), b2 = hr_connect(p.port);
    usleep(200000);
    hr_conn third = {.fd = hr_connect(p.port)};
    REQUIRE(a >= 0 && b2 >= 0 && third.fd >= 0);
    hr_read(&third, &r, 0, 10);
    CHECK_EQ_INT(r.status, 503);
    CHECKF(r.content_length == (long long)r.body_len && hr_closed(&third, 2),
           "503 says %lld bytes, sent %zu", r.content_length, r.body_len);
    hr_resp_free(&r);
    close(a);
    close(b2);
    close(third.fd);
    free(third.buf);
    CHECK_EQ_INT(px_stop(&p, SIGTERM, 30), 0);
}

static size_t spans_of(const char *rollout, size_t want);
#define spans_of_any(r) spans_of((r), 1)

/* Items 15 and 17 for the proxy, which reads requests with lib/http's parser: a chunked body
 * (411 before), an absolute-form target (404 before), a 40 KB request line (431 before). */
TEST(chunked_bodies_absolute_targets_and_long_lines)
{
    px_child p;
    REQUIRE(px_start_proxy(&p, g_dir, g_upurl, g_broker.bootstrap, "parse", NULL, NULL) == 0);
    const char *body = chat_body("m");
    size_t bl = strlen(body);
    char req[2000];
    snprintf(req, sizeof req,
             "POST /r/p/parse-1/v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
             "application/json\r\nTransfer-Encoding: chunked\r\n\r\n%zx\r\n%.*s\r\n%zx\r\n%s\r\n0\r\n\r\n",
             bl / 2, (int)(bl / 2), body, bl - bl / 2, body + bl / 2);
    hr_resp r;
    hr_exchange(p.port, req, strlen(req), 0, &r);
    CHECKF(r.status == 200 && strstr(r.body ? r.body : "", "The answer is 4."),
           "chunked: %d %.200s", r.status, r.body ? r.body : "");
    hr_resp_free(&r);
    snprintf(req, sizeof req,
             "POST http://example.com/r/p/parse-2/v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
             "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n%s",
             bl, body);
    hr_exchange(p.port, req, strlen(req), 0, &r);
    CHECK_EQ_INT(r.status, 200);
    hr_resp_free(&r);
    char *big = malloc(50000);
    REQUIRE(big);
    int n = snprintf(big, 50000, "GET /%040000d HTTP/1.1\r\nHost: x\r\n\r\n", 0);
    hr_exchange(p.port, big, (size_t)n, 0, &r);
    CHECK_EQ_INT(r.status, 414);
    CHECK(r.content_length == (long long)r.body_len);
    hr_resp_free(&r);
    free(big);
    REQUIRE(spans_of_any("parse-1") == 1);
    CHECK_EQ_INT(px_stop(&p, SIGTERM, 30), 0);
}

static al_span g_spans[16];
static size_t g_nspans;
static al_test_msgs g_msgs;

static size_t spans_of(const char *rollout, size_t want)
{
    for (size_t i = 0; i < g_nspans; i++)
        al_span_clear(&g_spans[i]);
    al_test_msgs_free(&g_msgs);
    if (al_test_topic_read(g_broker.bootstrap, "arclight.spans", rollout, want, 30000,
                           &g_msgs) != 0)
        return 0;
    g_nspans = px_spans_of(&g_msgs, rollout, g_spans, 16);
    return g_nspans;
}

/* Item 10: a key given twice. The upstream (and every JSON parser) takes the last one; so
 * must the proxy's fast path, which read the first. */
TEST(duplicate_keys_last_wins_everywhere)
{
    px_child p;
    REQUIRE(px_start_proxy(&p, g_dir, g_upurl, g_broker.bootstrap, "dup", NULL, NULL) == 0);
    px_resp r;
    /* "stream": false, "stream": true is a stream, for the agent as for the upstream */
    REQUIRE(px_post(&p, "/r/dup/dup-1/v1/chat/completions",
                    "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],"
                    "\"stream\":false,\"stream\":true}",
                    &r) == 0);
    CHECK_EQ_INT(r.status, 200);
    CHECKF(strstr(r.headers, "text/event-stream") && strstr(r.body, "data: [DONE]"),
           "not a stream: %.200s", r.body);
    px_resp_free(&r);
    /* an escaped name is the same name */
    REQUIRE(px_post(&p, "/r/dup/dup-2/v1/chat/completions",
                    "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],"
                    "\"stre\\u0061m\":true}",
                    &r) == 0);
    CHECK(strstr(r.headers, "text/event-stream") != NULL);
    px_resp_free(&r);
    /* "return_token_ids": true, then false: the agent asked for none, the span has them */
    REQUIRE(px_post(&p, "/r/dup/dup-3/v1/chat/completions",
                    "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],"
                    "\"return_token_ids\":true,\"return_token_ids\":false}",
                    &r) == 0);
    CHECK_EQ_INT(r.status, 200);
    json_t *j = json_loads(r.body, 0, NULL);
    json_t *c0 = json_array_get(json_object_get(j, "choices"), 0);
    CHECKF(!json_object_get(c0, "token_ids") || json_is_null(json_object_get(c0, "token_ids")),
           "the agent got token ids it turned off: %.300s", r.body);
    json_decref(j);
    px_resp_free(&r);
    REQUIRE(spans_of("dup-3", 1) == 1);
    CHECK(g_spans[0].llm_call.n_response_tokens == 4);
    CHECK_EQ_INT(px_stop(&p, SIGTERM, 30), 0);
}

/* Item 11: every span must decode; what is not UTF-8 is refused at the door or escaped. */
TEST(utf8_refused_at_the_door_or_escaped_in_spans)
{
    px_child p;
    REQUIRE(px_start_proxy(&p, g_dir, g_upurl, g_broker.bootstrap, "utf8", NULL, NULL) == 0);
    char url[300];
    px_resp r;
    snprintf(url, sizeof url, "%s/r/u/utf-1/v1/chat/completions", p.base);
    const char *h[] = {"Content-Type: application/json", "X-Arclight-Agent: bad\xff\xfe", NULL};
    REQUIRE(px_http("POST", url, h, chat_body("m"), &r) == 0);
    CHECK_EQ_INT(r.status, 400);
    px_resp_free(&r);
    REQUIRE(px_post(&p, "/r/u/utf-2/v1/chat/completions",
                    "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"h\xff\"}]}",
                    &r) == 0);
    CHECK_EQ_INT(r.status, 400);
    px_resp_free(&r);
    /* an agent name cut at 128 bytes is cut at a character */
    char agent[400] = "X-Arclight-Agent: ";
    for (int i = 0; i < 100; i++)
        strcat(agent, "\xc3\xa9");
    const char *h2[] = {"Content-Type: application/json", agent, NULL};
    snprintf(url, sizeof url, "%s/r/u/utf-3/v1/chat/completions", p.base);
    REQUIRE(px_http("POST", url, h2, chat_body("m"), &r) == 0);
    CHECK_EQ_INT(r.status, 200);
    px_resp_free(&r);
    /* an upstream answering bytes that are not UTF-8: the agent gets them, the span decodes */
    REQUIRE(px_post(&p, "/r/u/utf-4/v1/chat/completions", chat_body("bad-utf8"), &r) == 0);
    CHECK_EQ_INT(r.status, 200);
    px_resp_free(&r);
    REQUIRE(spans_of("utf-3", 1) == 1);
    CHECK(strlen(g_spans[0].llm_call.agent) == 128);
    REQUIRE(spans_of("utf-4", 1) == 1);
    CHECK(strstr(g_spans[0].llm_call.response_json, "\xef\xbf\xbd") != NULL);
    CHECK_EQ_INT(px_stop(&p, SIGTERM, 30), 0);
}

/* Item 12: the configured upstream key, echoed by the upstream, is in no answer, span or log;
 * item 13: a newline from the upstream does not start a log line. */
TEST(upstream_key_echoed_back_is_redacted_and_log_lines_stay_whole)
{
    const char *key = "sk-upstream-secret-0123456789";
    char envkey[200];
    snprintf(envkey, sizeof envkey, "ARCLIGHT_UPSTREAM_API_KEY=%s", key);
    const char *env[] = {envkey, NULL};
    px_child p;
    REQUIRE(px_start_proxy(&p, g_dir, g_upurl, g_broker.bootstrap, "redact", NULL, env) == 0);
    px_resp r;
    REQUIRE(px_post(&p, "/r/k/key-1/v1/chat/completions", chat_body("echo-auth"), &r) == 0);
    CHECK_EQ_INT(r.status, 401);
    CHECKF(!strstr(r.body, key) && strstr(r.body, "bad key Bearer ****"),
           "the agent's answer: %s", r.body);
    px_resp_free(&r);
    REQUIRE(px_post(&p, "/r/k/key-2/v1/chat/completions", chat_body("fail-newline"), &r) == 0);
    CHECK_EQ_INT(r.status, 400);
    px_resp_free(&r);
    REQUIRE(spans_of("key-1", 1) == 1);
    const al_llm_call *l = &g_spans[0].llm_call;
    CHECK(!strstr(l->response_json ? l->response_json : "", key));
    CHECK(!strstr(l->error ? l->error : "", key));
    CHECK_EQ_INT(px_stop(&p, SIGTERM, 30), 0);
    char *log = al_test_slurp_text(p.log);
    CHECKF(!strstr(log, key), "the log holds the upstream key");
    CHECKF(!strstr(log, "\n2026-01-01T00:00:00.000Z INFO  proxy.access: forged"),
           "a forged line in the log");
    CHECK(strstr(log, "bad request\\x0A2026-01-01") != NULL);
    free(log);
}

/* Item 14 for serve: its key from a file, not from ps; constant-time compared. */
TEST(serve_api_key_from_a_file)
{
    char dir[600], model[700], keyfile[700];
    snprintf(dir, sizeof dir, "%s/serve", g_dir);
    snprintf(model, sizeof model, "%s/tiny", dir);
    snprintf(keyfile, sizeof keyfile, "%s/key", g_dir);
    char cmd[4096];
    snprintf(cmd, sizeof cmd,
             "mkdir -p %s && %s model init --config tests/model/tiny-qwen2.json --out %s --seed 2 "
             ">/dev/null && cp tests/tokenizer/tiny/tokenizer.json "
             "tests/tokenizer/tiny/tokenizer_config.json %s/ && echo serve-key-42 > %s",
             dir, al_test_bin(), model, model, keyfile);
    REQUIRE(system(cmd) == 0);
    const char *argv[] = {al_test_bin(), "serve",     "--model", model,  "--listen",
                          "127.0.0.1:0", "--api-key-file", keyfile, NULL};
    int fds[2];
    REQUIRE(pipe(fds) == 0);
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        dup2(fds[1], 1);
        close(fds[0]);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    close(fds[1]);
    char line[128];
    REQUIRE(al_test_broker_readline(fds[0], line, sizeof line, 60000) == 0);
    close(fds[0]);
    CHECK(!cmdline_has(pid, "serve-key-42"));
    char url[300];
    snprintf(url, sizeof url, "http://%s/v1/models", line);
    px_resp r;
    REQUIRE(px_http("GET", url, NULL, NULL, &r) == 0);
    CHECK_EQ_INT(r.status, 401);
    px_resp_free(&r);
    const char *wrong[] = {"Authorization: Bearer serve-key-4", NULL};
    REQUIRE(px_http("GET", url, wrong, NULL, &r) == 0);
    CHECK_EQ_INT(r.status, 401);
    px_resp_free(&r);
    const char *right[] = {"Authorization: Bearer serve-key-42", NULL};
    REQUIRE(px_http("GET", url, right, NULL, &r) == 0);
    CHECK_EQ_INT(r.status, 200);
    px_resp_free(&r);
    snprintf(url, sizeof url, "http://%s/health", line);
    REQUIRE(px_http("GET", url, NULL, NULL, &r) == 0);
    CHECK_EQ_INT(r.status, 200);
    px_resp_free(&r);
    kill(pid, SIGTERM);
    waitpid(pid, NULL, 0);
}

TEST(teardown)
{
    for (size_t i = 0; i < g_nspans; i++)
        al_span_clear(&g_spans[i]);
    al_test_msgs_free(&g_msgs);
    fake_upstream_stop(g_up);
    al_test_broker_stop(&g_broker);
    if (g_dir[0] && al_test_rmtree(g_dir) != 0) fprintf(stderr, "  (cannot remove %s)\n", g_dir);
    curl_global_cleanup();
}
