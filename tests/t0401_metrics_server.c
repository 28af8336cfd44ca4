/* 0401: lib/http server — /metrics, /healthz, 404/405 over real TCP sockets (libcurl and a
 * raw socket client). */
#include "testlib.h"

#include "http/server.h"

#include <arpa/inet.h>
#include <curl/curl.h>
#include <jansson.h>
#include <netinet/in.h>
#include <stdatomic.h>
#include <sys/socket.h>
#include <unistd.h>

typedef struct response {
    long code;
    char *body;
    size_t len;
    char content_type[128];
} response;

static size_t on_body(char *p, size_t sz, size_t n, void *ud)
{
    response *r = ud;
    char *nb = realloc(r->body, r->len + sz * n + 1);
    if (!nb) return 0;
    memcpy(nb + r->len, p, sz * n);
    r->body = nb;
    r->len += sz * n;
    r->body[r->len] = '\0';
    return sz * n;
}

/* Performs one request; returns 0 and fills r (the caller frees r->body). */
static int http_do(int port, const char *method, const char *path, response *r)
{
    char url[256];
    memset(r, 0, sizeof *r);
    snprintf(url, sizeof url, "http://127.0.0.1:%d%s", port, path);
    CURL *c = curl_easy_init();
    if (!c) return -1;
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
    if (strcmp(method, "HEAD") == 0) curl_easy_setopt(c, CURLOPT_NOBODY, 1L);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, r);
    curl_easy_setopt(c, CURLOPT_TIMEOUT, 10L);
    CURLcode rc = curl_easy_perform(c);
    char *ct = NULL;
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &r->code);
    curl_easy_getinfo(c, CURLINFO_CONTENT_TYPE, &ct);
    if (ct) snprintf(r->content_type, sizeof r->content_type, "%s", ct);
    curl_easy_cleanup(c);
    if (!r->body) r->body = strdup("");
    return rc == CURLE_OK ? 0 : -1;
}

static atomic_int healthy = 1;

static int health_cb(void *ud, char *reason, size_t reasonlen)
{
    if (atomic_load(&healthy)) return 0;
    snprintf(reason, reasonlen, "broker %s unreachable for 12s \"quoted\"", (const char *)ud);
    return 1;
}

TEST(metrics_endpoint_serves_the_registry)
{
    curl_global_init(CURL_GLOBAL_DEFAULT);
    al_metrics *m = al_metrics_new();
    al_counter *c =
        al_metrics_counter(m, "arclight_spans_total", "Spans published.", "stage", "proxy", NULL);
    al_counter_add(c, 41);
    char err[256];
    al_http_server *s = al_http_server_start("127.0.0.1:0", m, NULL, NULL, err, sizeof err);
    REQUIREF(s, "start: %s", err);
    int port = al_http_server_port(s);
    CHECK(port > 0);
    response r;
    REQUIRE(http_do(port, "GET", "/metrics", &r) == 0);
    CHECK_EQ_INT(r.code, 200);
    CHECK_EQ_STR(r.content_type, "text/plain; version=0.0.4; charset=utf-8");
    CHECKF(strstr(r.body, "arclight_spans_total{stage=\"proxy\"} 41\n"), "body: %s", r.body);
    free(r.body);
    /* updates show up on the next scrape */
    al_counter_inc(c);
    REQUIRE(http_do(port, "GET", "/metrics", &r) == 0);
    CHECK(strstr(r.body, "arclight_spans_total{stage=\"proxy\"} 42\n") != NULL);
    free(r.body);
    REQUIRE(http_do(port, "HEAD", "/metrics", &r) == 0);
    CHECK_EQ_INT(r.code, 200);
    CHECK_EQ_INT(r.len, 0);
    free(r.body);
    al_http_server_stop(s);
    al_metrics_free(m);
}

TEST(healthz_follows_the_health_callback)
{
    char err[256];
    al_http_server *s =
        al_http_server_start("localhost:0", NULL, health_cb, "127.0.0.1:9092", err, sizeof err);
    REQUIREF(s, "start: %s", err);
    int port = al_http_server_port(s);
    response r;
    atomic_store(&healthy, 1);
    REQUIRE(http_do(port, "GET", "/healthz", &r) == 0);
    CHECK_EQ_INT(r.code, 200);
    CHECK_EQ_STR(r.content_type, "application/json");
    CHECK_EQ_STR(r.body, "{\"status\":\"ok\"}\n");
    free(r.body);

    atomic_store(&healthy, 0);
    REQUIRE(http_do(port, "GET", "/healthz", &r) == 0);
    CHECK_EQ_INT(r.code, 503);
    json_error_t je;
    json_t *j = json_loads(r.body, 0, &je);
    REQUIREF(j, "503 body is not JSON (%s): %s", je.text, r.body);
    CHECK_EQ_STR(json_string_value(json_object_get(j, "status")), "unhealthy");
    CHECK_EQ_STR(json_string_value(json_object_get(j, "reason")),
                 "broker 127.0.0.1:9092 unreachable for 12s \"quoted\"");
    json_decref(j);
    free(r.body);

    atomic_store(&healthy, 1);
    REQUIRE(http_do(port, "GET", "/healthz", &r) == 0);
    CHECK_EQ_INT(r.code, 200);
    free(r.body);
    al_http_server_stop(s);
}

TEST(unknown_paths_404_and_other_methods_405_with_json)
{
    char err[256];
    al_http_server *s = al_http_server_start("127.0.0.1:0", NULL, NULL, NULL, err, sizeof err);
    REQUIREF(s, "start: %s", err);
    int port = al_http_server_port(s);
    response r;
    REQUIRE(http_do(port, "GET", "/nope?x=1", &r) == 0);
    CHECK_EQ_INT(r.code, 404);
    json_t *j = json_loads(r.body, 0, NULL);
    REQUIREF(j, "404 body is not JSON: %s", r.body);
    CHECK_EQ_STR(json_string_value(json_object_get(j, "error")), "not found");
    CHECK_EQ_STR(json_string_value(json_object_get(j, "path")), "/nope");
    json_decref(j);
    free(r.body);

    REQUIRE(http_do(port, "POST", "/metrics", &r) == 0);
    CHECK_EQ_INT(r.code, 405);
    j = json_loads(r.body, 0, NULL);
    REQUIREF(j, "405 body is not JSON: %s", r.body);
    CHECK_EQ_STR(json_string_value(json_object_get(j, "error")), "method not allowed");
    json_decref(j);
    free(r.body);

    /* an empty registry is an empty, valid exposition */
    REQUIRE(http_do(port, "GET", "/metrics", &r) == 0);
    CHECK_EQ_INT(r.code, 200);
    CHECK_EQ_INT(r.len, 0);
    free(r.body);
    al_http_server_stop(s);
}

/* Sends raw bytes, returns what the server answered before closing (malloc'd). */
static char *raw_exchange(int port, const char *req)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        if (fd >= 0) close(fd);
        return NULL;
    }
    struct timeval tv = {.tv_sec = 5};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    if (write(fd, req, strlen(req)) < 0) {
        close(fd);
        return NULL;
    }
    shutdown(fd, SHUT_WR);
    char *out = calloc(1, 65536);
    size_t n = 0;
    ssize_t k;
    while (out && n < 65535 && (k = read(fd, out + n, 65535 - n)) > 0)
        n += (size_t)k;
    close(fd);
    return out;
}

TEST(garbage_requests_do_not_hurt_the_server)
{
    char err[256];
    al_metrics *m = al_metrics_new();
    al_gauge_set(al_metrics_gauge(m, "up_gauge", "h", NULL), 1);
    al_http_server *s = al_http_server_start("127.0.0.1:0", m, NULL, NULL, err, sizeof err);
    REQUIREF(s, "start: %s", err);
    int port = al_http_server_port(s);
    char *out = raw_exchange(port, "\x01\x02 garbage \xff\r\n\r\n");
    CHECK(out != NULL);
    free(out);
    out = raw_exchange(port, "GET /metrics HTTP/1.1\r\nHost: x\r\nBad header line\r\n\r\n");
    free(out);
    /* still serving */
    out = raw_exchange(port, "GET /metrics HTTP/1.0\r\n\r\n");
    REQUIRE(out);
    CHECKF(strncmp(out, "HTTP/1.0 200", 12) == 0 || strncmp(out, "HTTP/1.1 200", 12) == 0,
           "answer: %s", out);
    CHECK(strstr(out, "\r\n\r\n# HELP up_gauge h\n# TYPE up_gauge gauge\nup_gauge 1\n") != NULL);
    free(out);
    al_http_server_stop(s);
    al_metrics_free(m);
}

TEST(bad_or_busy_addresses_fail_with_a_reason)
{
    char err[256] = "";
    CHECK(al_http_server_start("no-port", NULL, NULL, NULL, err, sizeof err) == NULL);
    CHECKF(strstr(err, "no-port") != NULL, "err: %s", err);
    al_http_server *a = al_http_server_start("127.0.0.1:0", NULL, NULL, NULL, err, sizeof err);
    REQUIRE(a);
    char busy[64];
    snprintf(busy, sizeof busy, "127.0.0.1:%d", al_http_server_port(a));
    err[0] = '\0';
    CHECK(al_http_server_start(busy, NULL, NULL, NULL, err, sizeof err) == NULL);
    CHECKF(strstr(err, busy) != NULL, "err: %s", err);
    al_http_server_stop(a);
    /* start + immediate stop never hangs */
    for (int i = 0; i < 20; i++)
        al_http_server_stop(al_http_server_start("127.0.0.1:0", NULL, NULL, NULL, err, sizeof err));
    al_http_server_stop(NULL);
    curl_global_cleanup();
}
