/*
 * 1109: every HTTP server of the project reads requests with the one parser (lib/http/http1.h)
 * and answers bad ones alike (issue 15, items 15-17): serve's API port, a stage's --metrics
 * server and the trainer's checkpoint server, probed with raw bytes over TCP
 * (t1699_http_raw.h). For each: a 40 KB request line is 414, a 40 KB header section 431, a NUL
 * or obs-fold or a second Content-Length or "+2" 400, no Host 400 (HTTP/1.0 needs none), a body
 * over the limit 413 before it is sent, Expect: 100-continue answered, absolute-form targets
 * and chunked bodies accepted, HEAD answered with headers only (so a pipelined GET after it
 * gets its own intact reply), every error a JSON body of its declared length. serve also: a
 * head that trickles in is cut at --client-timeout in total (408), sixteen 16 MiB heads leave
 * its memory as it was, and an error message cut to fit stays UTF-8.
 */
#include "testlib.h"
#include "t1199_serve_helpers.h"
#include "t1699_http_raw.h"

#include "http/server.h"
#include "train/ckpt_http.h"

#include <pthread.h>

static char *g_dir;
static sv_server g_srv;
static al_http_server *g_metrics;
static al_ckpt_http *g_ckpt;

typedef struct target {
    const char *name;
    int port;
    const char *get_path;   /* a GET that answers 200 with a body */
    const char *post_path;  /* where a POST goes */
    int post_ok;            /* the POST of a small JSON body answers 200 (else 405) */
    const char *post_body;  /* that body */
} target;
static target g_t[3];

static int url_port(const char *url)
{
    const char *c = strrchr(url, ':');
    return c ? atoi(c + 1) : -1;
}

static int health(void *ud, char *reason, size_t len)
{
    (void)ud, (void)reason, (void)len;
    return 0;
}

TEST(setup)
{
    curl_global_init(CURL_GLOBAL_ALL);
    g_dir = sv_tmpdir("t1109");
    REQUIRE(g_dir);
    REQUIRE(sv_make_model(g_dir, "tiny", 3) == 0);
    char model[400], err[512];
    snprintf(model, sizeof model, "%s/tiny", g_dir);
    const char *args[] = {"--model", model, "--client-timeout", "2", "--log-level", "warn", NULL};
    REQUIRE(sv_start(&g_srv, args) == 0);
    g_metrics = al_http_server_start("127.0.0.1:0", NULL, health, NULL, err, sizeof err);
    REQUIREF(g_metrics, "%s", err);
    REQUIRE(sv_sh("mkdir -p %s/ckpt/step-1 && cp %s/tiny/config.json %s/ckpt/step-1/", g_dir,
                  g_dir, g_dir) == 0);
    char root[400];
    snprintf(root, sizeof root, "%s/ckpt", g_dir);
    g_ckpt = al_ckpt_http_start("127.0.0.1:0", root, err, sizeof err);
    REQUIREF(g_ckpt, "%s", err);
    g_t[0] = (target){"serve", url_port(g_srv.url), "/v1/models", "/v1/completions", 1,
                      "{\"prompt\":[1,2],\"max_tokens\":1}"};
    g_t[1] = (target){"metrics", al_http_server_port(g_metrics), "/healthz", "/metrics", 0, "{}"};
    g_t[2] = (target){"checkpoints", al_ckpt_http_port(g_ckpt), "/checkpoints/step-1/config.json",
                      "/checkpoints/", 0, "{}"};
}

/* Sends req to t and checks the status, that the error body is JSON of its declared length,
 * and (for errors) that the connection is closed after it. */
static void expect(const target *t, const char *what, const char *req, size_t n, int status)
{
    hr_resp r;
    hr_conn c = {.fd = hr_connect(t->port)};
    REQUIREF(c.fd >= 0, "%s: cannot connect", t->name);
    hr_send(c.fd, req, n);
    hr_read(&c, &r, 0, 20);
    CHECKF(r.status == status, "%s, %s: status %d, want %d (%s)", t->name, what, r.status, status,
           r.body ? r.body : "");
    if (status >= 400) {
        json_t *j = r.body ? json_loadb(r.body, r.body_len, 0, NULL) : NULL;
        CHECKF(j != NULL, "%s, %s: the error body is not JSON: %s", t->name, what,
               r.body ? r.body : "");
        CHECKF(r.content_length == (long long)r.body_len, "%s, %s: Content-Length %lld, body %zu",
               t->name, what, r.content_length, r.body_len);
        json_decref(j);
        /* what the HTTP layer refuses ends the connection; a handler's 4xx does not */
        int layer = status == 400 || status == 408 || status == 413 || status == 414 ||
                    status == 431 || status == 501 || status == 505;
        if (layer)
            CHECKF(hr_closed(&c, 5), "%s, %s: the connection stays open after the error",
                   t->name, what);
    }
    hr_resp_free(&r);
    close(c.fd);
    free(c.buf);
}

static void expect_s(const target *t, const char *what, const char *req, int status)
{
    expect(t, what, req, strlen(req), status);
}

TEST(every_server_refuses_bad_heads_alike)
{
    for (int i = 0; i < 3; i++) {
        const target *t = &g_t[i];
        char *big = malloc(50000);
        REQUIRE(big);
        /* item 17: a 40 KB request line is 414, not 431 */
        int n = snprintf(big, 50000, "GET /%040000d HTTP/1.1\r\nHost: x\r\n\r\n", 0);
        expect(t, "40 KB request line", big, (size_t)n, 414);
        n = snprintf(big, 50000, "GET %s HTTP/1.1\r\nHost: x\r\nX-Big: %040000d\r\n\r\n",
                     t->get_path, 0);
        expect(t, "40 KB header", big, (size_t)n, 431);
        free(big);
        char req[600];
        /* item 15: NUL, obs-fold, Content-Length twice or "+2", no Host */
        /* (snprintf stops at a NUL in its format: the NUL goes in by hand) */
        n = snprintf(req, sizeof req, "GET %s HTTP/1.1\r\nHost: x\r\nX-A: a@b\r\n\r\n", t->get_path);
        *strchr(req, '@') = '\0';
        expect(t, "NUL in a header", req, (size_t)n, 400);
        n = snprintf(req, sizeof req, "GET %s@x HTTP/1.1\r\nHost: x\r\n\r\n", t->get_path);
        *strchr(req, '@') = '\0';
        expect(t, "NUL in the target", req, (size_t)n, 400);
        snprintf(req, sizeof req, "GET %s HTTP/1.1\r\nHost: x\r\nX-A: a\r\n b\r\n\r\n",
                 t->get_path);
        expect_s(t, "obs-fold", req, 400);
        snprintf(req, sizeof req,
                 "POST %s HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\n{}",
                 t->post_path);
        expect_s(t, "two Content-Length", req, 400);
        snprintf(req, sizeof req, "POST %s HTTP/1.1\r\nHost: x\r\nContent-Length: +2\r\n\r\n{}",
                 t->post_path);
        expect_s(t, "Content-Length +2", req, 400);
        snprintf(req, sizeof req, "GET %s HTTP/1.1\r\n\r\n", t->get_path);
        expect_s(t, "no Host", req, 400);
        snprintf(req, sizeof req, "GET %s HTTP/1.0\r\n\r\n", t->get_path);
        expect_s(t, "HTTP/1.0 without Host", req, 200);
        snprintf(req, sizeof req, "GET %s HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n",
                 t->get_path);
        expect_s(t, "Transfer-Encoding gzip", req, 501);
        snprintf(req, sizeof req, "GET %s HTTP/2.0\r\nHost: x\r\n\r\n", t->get_path);
        expect_s(t, "HTTP/2.0", req, 505);
        /* a body over the limit is refused before it is sent */
        snprintf(req, sizeof req, "POST %s HTTP/1.1\r\nHost: x\r\nContent-Length: 999999999\r\n\r\n",
                 t->post_path);
        expect_s(t, "a 1 GB body", req, 413);
        /* item 17: absolute-form targets */
        snprintf(req, sizeof req, "GET http://127.0.0.1:%d%s HTTP/1.1\r\nHost: elsewhere\r\n\r\n",
                 t->port, t->get_path);
        expect_s(t, "absolute-form target", req, 200);
    }
}

/* Item 16: a HEAD reply has the headers of its GET, Content-Length included, and no body: a
 * GET pipelined behind it gets its own reply, whole. */
TEST(head_replies_have_no_body_and_pipelining_holds)
{
    for (int i = 0; i < 3; i++) {
        const target *t = &g_t[i];
        char req[600];
        snprintf(req, sizeof req,
                 "HEAD %s HTTP/1.1\r\nHost: x\r\n\r\nGET %s HTTP/1.1\r\nHost: x\r\n\r\n",
                 t->get_path, t->get_path);
        hr_conn c = {.fd = hr_connect(t->port)};
        REQUIRE(c.fd >= 0);
        hr_send(c.fd, req, strlen(req));
        hr_resp h, g;
        hr_read(&c, &h, 1, 20);
        hr_read(&c, &g, 0, 20);
        CHECKF(h.status == 200 && g.status == 200, "%s: HEAD %d, GET %d", t->name, h.status,
               g.status);
        CHECKF(h.content_length > 0 && h.content_length == g.content_length,
               "%s: HEAD says %lld bytes, GET %lld", t->name, h.content_length, g.content_length);
        CHECKF(g.body_len == (size_t)g.content_length && g.body && (g.body[0] == '{'),
               "%s: the GET after a HEAD got %zu bytes: %.60s", t->name, g.body_len,
               g.body ? g.body : "");
        hr_resp_free(&h);
        hr_resp_free(&g);
        close(c.fd);
        free(c.buf);
    }
}

/* Item 17: chunked request bodies are read (411 before), Expect: 100-continue is answered. */
TEST(chunked_bodies_and_expect_continue)
{
    for (int i = 0; i < 3; i++) {
        const target *t = &g_t[i];
        int want = t->post_ok ? 200 : 405;
        char req[1200];
        size_t bl = strlen(t->post_body), half = bl / 2;
        snprintf(req, sizeof req,
                 "POST %s HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                 "%zx;ext=1\r\n%.*s\r\n%zx\r\n%s\r\n0\r\nX-Trailer: t\r\n\r\n",
                 t->post_path, half, (int)half, t->post_body, bl - half, t->post_body + half);
        expect_s(t, "chunked body", req, want);
        snprintf(req, sizeof req,
                 "POST %s HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n",
                 t->post_path);
        expect_s(t, "a chunk size that is not hex", req, 400);
        /* 100 Continue comes before the body is sent, then the answer */
        snprintf(req, sizeof req,
                 "POST %s HTTP/1.1\r\nHost: x\r\nContent-Length: %zu\r\nExpect: 100-continue\r\n\r\n",
                 t->post_path, bl);
        hr_conn c = {.fd = hr_connect(t->port)};
        REQUIRE(c.fd >= 0);
        hr_send(c.fd, req, strlen(req));
        hr_resp r;
        hr_read(&c, &r, 0, 10);
        CHECKF(r.status == 100, "%s: Expect: 100-continue got %d", t->name, r.status);
        hr_resp_free(&r);
        hr_send(c.fd, t->post_body, bl);
        hr_read(&c, &r, 0, 20);
        CHECKF(r.status == want, "%s: the POST after 100 Continue got %d", t->name, r.status);
        hr_resp_free(&r);
        close(c.fd);
        free(c.buf);
    }
}

/* Item 9's slowloris for serve: --client-timeout 2 is a deadline for the whole head, not
 * re-armed by each byte. */
TEST(serve_cuts_a_trickling_head_at_its_deadline)
{
    const target *t = &g_t[0];
    hr_conn c = {.fd = hr_connect(t->port)};
    REQUIRE(c.fd >= 0);
    const char *head = "GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    double t0 = hr_now();
    int status = 0;
    for (size_t i = 0; head[i] && hr_now() - t0 < 15; i++) {
        if (hr_send(c.fd, head + i, 1) != 0) break;
        struct pollfd p = {.fd = c.fd, .events = POLLIN};
        if (poll(&p, 1, 300) > 0) break; /* an answer came */
    }
    hr_resp r;
    hr_read(&c, &r, 0, 10);
    status = r.status;
    double dt = hr_now() - t0;
    printf("  trickled head answered %d after %.1f s\n", status, dt);
    CHECK_EQ_INT(status, 408);
    CHECKF(dt >= 1.5 && dt < 6, "the 408 came after %.1f s (--client-timeout 2)", dt);
    hr_resp_free(&r);
    close(c.fd);
    free(c.buf);
}

static long vm_kib(pid_t pid, const char *field)
{
    char p[64], line[256];
    snprintf(p, sizeof p, "/proc/%d/status", (int)pid);
    FILE *f = fopen(p, "r");
    long v = -1;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, field, strlen(field))) v = atol(line + strlen(field) + 1);
    if (f) fclose(f);
    return v;
}

typedef struct flood {
    int port;
    int status;
} flood;

static void *flood_main(void *arg)
{
    flood *f = arg;
    size_t n = 16u << 20;
    char *h = malloc(n);
    memset(h, 'a', n);
    memcpy(h, "GET / HTTP/1.1\r\nHost: x\r\nX-A: ", 30);
    hr_conn c = {.fd = hr_connect(f->port)};
    if (c.fd >= 0) {
        hr_send(c.fd, h, n); /* the server stops reading early: the rest is refused */
        hr_resp r;
        hr_read(&c, &r, 0, 20);
        f->status = r.status;
        hr_resp_free(&r);
        close(c.fd);
        free(c.buf);
    }
    free(h);
    return NULL;
}

/* Item 15: sixteen 16 MiB heads took serve from 60 to 204 MiB with its loop at 100 % (an
 * unbounded head, scanned again on each read). */
TEST(sixteen_huge_heads_leave_serve_as_it_was)
{
    const target *t = &g_t[0];
    long before = vm_kib(g_srv.pid, "VmRSS");
    pthread_t th[16];
    flood f[16];
    double t0 = hr_now();
    for (int i = 0; i < 16; i++) {
        f[i] = (flood){t->port, 0};
        pthread_create(&th[i], NULL, flood_main, &f[i]);
    }
    for (int i = 0; i < 16; i++)
        pthread_join(th[i], NULL);
    double dt = hr_now() - t0;
    long after = vm_kib(g_srv.pid, "VmHWM");
    int n431 = 0;
    for (int i = 0; i < 16; i++)
        n431 += f[i].status == 431;
    printf("  16 x 16 MiB heads: %d answered 431 in %.2f s; RSS %ld KiB before, peak %ld KiB\n",
           n431, dt, before, after);
    CHECK_EQ_INT(n431, 16);
    CHECKF(after - before < 32 * 1024, "serve grew by %ld KiB", after - before);
    json_t *h = sv_get_json(g_srv.url, "/health");
    CHECK(h && !strcmp(json_string_value(json_object_get(h, "status")) ?: "", "ok"));
    json_decref(h);
}

/* Item 17: an error message cut to fit its buffer (a long name quoted back) comes out as
 * JSON, cut at a character, not as an empty body. */
TEST(serve_error_messages_cut_to_fit_stay_utf8)
{
    char body[4000];
    int k = snprintf(body, sizeof body, "{\"model\":\"a");
    for (int i = 0; i < 150; i++)
        k += snprintf(body + k, sizeof body - k, "\xc3\xa9"); /* é */
    snprintf(body + k, sizeof body - k, "\",\"prompt\":\"x\"}");
    long code = 0;
    json_t *j = sv_post_json(g_srv.url, "/v1/completions", body, &code);
    CHECK_EQ_INT(code, 404);
    const char *msg = json_string_value(json_object_get(json_object_get(j, "error"), "message"));
    CHECKF(msg && strlen(msg) > 100, "the message: %s", msg ? msg : "(none)");
    json_decref(j);
    /* and one past the 1 KiB message buffer */
    k = snprintf(body, sizeof body, "{\"messages\":[{\"role\":\"x");
    for (int i = 0; i < 700; i++)
        k += snprintf(body + k, sizeof body - k, "\xe2\x82\xac"); /* € */
    snprintf(body + k, sizeof body - k, "\",\"content\":\"a\"}]}");
    j = sv_post_json(g_srv.url, "/v1/chat/completions", body, &code);
    CHECK_EQ_INT(code, 400);
    msg = json_string_value(json_object_get(json_object_get(j, "error"), "message"));
    CHECKF(msg && strlen(msg) > 900, "the message: %s", msg ? msg : "(none)");
    json_decref(j);
}

TEST(teardown)
{
    if (g_srv.pid > 0) CHECK_EQ_INT(sv_stop(&g_srv), 0);
    al_http_server_stop(g_metrics);
    al_ckpt_http_stop(g_ckpt);
    if (g_dir) al_test_rmtree(g_dir);
    free(g_dir);
    curl_global_cleanup();
}
