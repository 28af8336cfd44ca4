/*
 * 1106: what a PolicyVersion can make `arclight serve --follow-policy` do, probed the way a
 * careless or hostile writer of arclight.policy would (issue 15, items 1-7 and 20). Each case
 * publishes a version and checks what an operator sees: the log line saying why it was not
 * loaded (naming the URI and the reason, never bytes of what was read), the version /health
 * reports, the server's memory, and how long things take.
 *
 *   file_uris_*        file:// only under --checkpoint-root, regular files, within the size a
 *                      checkpoint of this model can have, sha256 always 64 hex digits,
 *                      finite weights only
 *   http_*             downloads capped (with and without Content-Length), redirects within
 *                      the origin, a trickling server abandoned (python3 tests/serve/policy_http.py)
 *   newer_version_*    a newer version cuts a stalled download short; --policy-redirects off;
 *                      without --checkpoint-root only the trainer's step-N layout is read
 *   restart_*          a restarted server answers with the newest version from its first
 *                      request and never tries the older ones
 *   stop_*             SIGTERM finishes within --drain-timeout with the broker frozen, killed,
 *                      or never reachable
 */
#include "testlib.h"
#include "broker_fixture.h"
#include "t1199_serve_helpers.h"

#include "avro/codec.h"
#include "core/util.h"

#include <librdkafka/rdkafka.h>
#include <math.h>

static char *g_dir;
static char g_root[300], g_log[300];
static al_test_broker g_broker;
static rd_kafka_t *g_prod;
static sv_server g_srv; /* server A: --checkpoint-root, fast low-speed limit */
static pid_t g_http;
static int g_hport;

static void publish_to(const char *topic, const char *model, int64_t version, const char *uri,
                       const char *sha)
{
    al_policy_version pv = {.model = model,
                            .version = version,
                            .step = version,
                            .checkpoint_uri = uri,
                            .sha256 = sha,
                            .created_us = al_now_us()};
    al_buf b = {0};
    char err[256];
    if (al_policy_version_encode(&pv, &b, err, sizeof err) != 0) {
        CHECKF(0, "encode: %s", err);
        return;
    }
    rd_kafka_resp_err_t e = rd_kafka_producev(
        g_prod, RD_KAFKA_V_TOPIC(topic), RD_KAFKA_V_KEY(model, strlen(model)),
        RD_KAFKA_V_VALUE(b.data, b.len), RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_END);
    CHECKF(e == 0, "produce: %s", rd_kafka_err2str(e));
    rd_kafka_flush(g_prod, 10000);
    al_buf_free(&b);
}

static void publish(int64_t version, const char *uri, const char *sha)
{
    publish_to("arclight.policy", "tiny", version, uri, sha);
}

static int64_t health_int(const sv_server *s, const char *key)
{
    json_t *h = sv_get_json(s->url, "/health");
    int64_t v = h ? json_integer_value(json_object_get(h, key)) : -999;
    json_decref(h);
    return v;
}

static int wait_version(const sv_server *s, int64_t want, double secs)
{
    double t0 = testlib_now();
    while (testlib_now() - t0 < secs) {
        if (health_int(s, "policy_version") == want) return 0;
        usleep(50000);
    }
    return -1;
}

static void sha_of(const char *path, char hex[65])
{
    size_t n;
    char err[256];
    char *d = al_file_read(path, &n, err, sizeof err);
    al_sha256_hex(d ? d : "", d ? n : 0, hex);
    free(d);
}

/* ROOT/step-N/ with the weights of model directory src: fills uri (file://.../step-N/) and
 * sha. */
static void make_step(const char *root, int n, const char *src, char *uri, size_t ul, char sha[65])
{
    char p[600];
    snprintf(p, sizeof p, "%s/step-%d", root, n);
    mkdir(p, 0755);
    sv_sh("cp %s/model.safetensors %s/step-%d/model.safetensors", src, root, n);
    snprintf(p, sizeof p, "%s/step-%d/model.safetensors", root, n);
    sha_of(p, sha);
    snprintf(uri, ul, "file://%s/step-%d/", root, n);
}

/* Waits for "policy version N not loaded" with `why` in the log, and checks the server still
 * answers with version `still`. */
static void expect_refused(const char *log, const sv_server *s, int64_t n, const char *why,
                           int64_t still)
{
    char line[64];
    snprintf(line, sizeof line, "policy version %lld not loaded", (long long)n);
    CHECKF(sv_wait_log(log, line, 30) == 0, "no '%s' in the log", line);
    CHECKF(sv_wait_log(log, why, 5) == 0, "version %lld: the log does not say '%s'", (long long)n,
           why);
    CHECK_EQ_INT(health_int(s, "policy_version"), still);
}

static long status_kib(pid_t pid, const char *field)
{
    char p[64], line[256];
    snprintf(p, sizeof p, "/proc/%d/status", (int)pid);
    FILE *f = fopen(p, "r");
    long v = -1;
    size_t fl = strlen(field);
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, field, fl) && line[fl] == ':') v = atol(line + fl + 1);
    if (f) fclose(f);
    return v;
}

static int free_port(void)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t l = sizeof a;
    int fd = socket(AF_INET, SOCK_STREAM, 0), port = -1;
    if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &l) == 0)
        port = ntohs(a.sin_port);
    if (fd >= 0) close(fd);
    return port;
}

static pid_t start_http(const char *dir, int *port)
{
    int fds[2];
    if (pipe(fds) != 0) return -1;
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        dup2(fds[1], 1);
        close(fds[0]);
        close(fds[1]);
        execl("/usr/bin/python3", "python3", "tests/serve/policy_http.py", dir, (char *)NULL);
        _exit(127);
    }
    close(fds[1]);
    char line[32];
    size_t k = 0;
    char ch;
    while (k + 1 < sizeof line && read(fds[0], &ch, 1) == 1 && ch != '\n')
        line[k++] = ch;
    line[k] = 0;
    close(fds[0]);
    *port = atoi(line);
    return *port > 0 ? pid : -1;
}

TEST(setup)
{
    curl_global_init(CURL_GLOBAL_ALL);
    g_dir = sv_tmpdir("t1106");
    REQUIRE(g_dir);
    REQUIRE(sv_make_model(g_dir, "tiny", 5) == 0);
    REQUIRE(sv_sh("%s model init --config tests/model/tiny-qwen2.json --out %s/w1 --seed 6 "
                  ">/dev/null",
                  sv_bin(), g_dir) == 0);
    snprintf(g_root, sizeof g_root, "%s/ckpt", g_dir);
    snprintf(g_log, sizeof g_log, "%s/serve-a.log", g_dir);
    REQUIRE(mkdir(g_root, 0755) == 0);
    char topics[400];
    snprintf(topics, sizeof topics, "%s/topics.conf", g_dir);
    FILE *f = fopen(topics, "w");
    REQUIRE(f);
    fputs("arclight.policy 1 1\nt1106.policy 2 1\n", f);
    fclose(f);
    const char *bargs[] = {"--topics", topics, NULL};
    REQUIRE(al_test_broker_start(&g_broker, bargs) == 0);
    char err[512];
    rd_kafka_conf_t *pc = rd_kafka_conf_new();
    rd_kafka_conf_set(pc, "bootstrap.servers", g_broker.bootstrap, err, sizeof err);
    rd_kafka_conf_set(pc, "enable.idempotence", "true", err, sizeof err); /* keeps the order */
    g_prod = rd_kafka_new(RD_KAFKA_PRODUCER, pc, err, sizeof err);
    REQUIRE(g_prod);
    g_http = start_http(g_root, &g_hport);
    REQUIRE(g_http > 0);
    /* a marker in the server's environment: no log line may ever show it */
    setenv("T1106_SECRET", "zq7-environ-secret", 1);
    char model[400];
    snprintf(model, sizeof model, "%s/tiny", g_dir);
    const char *args[] = {"--model", model, "--follow-policy", "--bootstrap", g_broker.bootstrap,
                          "--checkpoint-root", g_root, "--policy-low-speed-limit", "100",
                          "--policy-low-speed-time", "2", "--log-level", "info", NULL};
    REQUIRE(sv_start_log(&g_srv, args, g_log) == 0);
    unsetenv("T1106_SECRET");
    CHECK_EQ_INT(health_int(&g_srv, "policy_version"), 0);
}

TEST(file_uris_only_under_the_root_and_errors_never_show_the_bytes)
{
    REQUIRE(g_srv.pid > 0);
    char uri[700], sha[65], p[700];
    const char *zeros = "0000000000000000000000000000000000000000000000000000000000000000";

    /* item 2: any readable file was read; its first 8 bytes came back as a header length */
    publish(1, "file:///proc/self/environ", zeros);
    expect_refused(g_log, &g_srv, 1, "not under a --checkpoint-root", 0);

    /* a file under the root that is not safetensors: the reason, not its bytes, size or hash */
    snprintf(p, sizeof p, "%s/step-2", g_root);
    mkdir(p, 0755);
    snprintf(p, sizeof p, "%s/step-2/model.safetensors", g_root);
    FILE *f = fopen(p, "w");
    REQUIRE(f);
    fputs("SECRETXYsecret-body-of-the-file", f);
    fclose(f);
    sha_of(p, sha);
    snprintf(uri, sizeof uri, "file://%s/step-2/", g_root);
    publish(2, uri, sha);
    expect_refused(g_log, &g_srv, 2, "not a safetensors file", 0);
    uint64_t le = 0;
    for (int i = 7; i >= 0; i--)
        le = (le << 8) | (unsigned char)"SECRETXY"[i];
    char num[32];
    snprintf(num, sizeof num, "%llu", (unsigned long long)le);
    /* the wrong sha256: the log names the expected one, not the file's */
    publish(3, uri, zeros);
    expect_refused(g_log, &g_srv, 3, "do not have the PolicyVersion's sha256", 0);

    /* a link from inside the root to valid weights outside it */
    char w1sha[65];
    snprintf(p, sizeof p, "%s/w1/model.safetensors", g_dir);
    sha_of(p, w1sha);
    snprintf(p, sizeof p, "%s/step-4", g_root);
    mkdir(p, 0755);
    REQUIRE(sv_sh("ln -s %s/w1/model.safetensors %s/step-4/model.safetensors", g_dir, g_root) ==
            0);
    snprintf(uri, sizeof uri, "file://%s/step-4/", g_root);
    publish(4, uri, w1sha);
    expect_refused(g_log, &g_srv, 4, "outside the checkpoint roots through a symbolic link", 0);

    /* '..' out of the root */
    snprintf(uri, sizeof uri, "file://%s/../w1/model.safetensors", g_root);
    publish(5, uri, w1sha);
    expect_refused(g_log, &g_srv, 5, "no '.' or '..' segments", 0);

    /* a FIFO: reading it would block the follower forever */
    snprintf(p, sizeof p, "%s/step-6", g_root);
    mkdir(p, 0755);
    REQUIRE(sv_sh("mkfifo %s/step-6/model.safetensors", g_root) == 0);
    snprintf(uri, sizeof uri, "file://%s/step-6/", g_root);
    publish(6, uri, zeros);
    expect_refused(g_log, &g_srv, 6, "not a regular file", 0);

    /* item 1: an 8 GiB (sparse) file is refused by its size, before a byte is read */
    snprintf(p, sizeof p, "%s/step-7", g_root);
    mkdir(p, 0755);
    REQUIRE(sv_sh("truncate -s 8G %s/step-7/model.safetensors", g_root) == 0);
    snprintf(uri, sizeof uri, "file://%s/step-7/", g_root);
    double t0 = testlib_now();
    publish(7, uri, zeros);
    expect_refused(g_log, &g_srv, 7, "larger than the", 0);
    CHECKF(testlib_now() - t0 < 10, "refusing the 8 GiB file took %.1f s", testlib_now() - t0);

    /* item 4: an empty sha256 used to skip the check */
    snprintf(p, sizeof p, "%s/w1", g_dir);
    make_step(g_root, 8, p, uri, sizeof uri, sha);
    publish(8, uri, "");
    expect_refused(g_log, &g_srv, 8, "sha256 is not 64 hex digits", 0);
    publish(9, uri, "abc");
    expect_refused(g_log, &g_srv, 9, "sha256 is not 64 hex digits", 0);

    /* item 6: weights that decode to NaN were swapped in */
    char md[400], nanpath[600], err[512];
    snprintf(md, sizeof md, "%s/w1", g_dir);
    al_model *m = al_model_load_dir(md, err, sizeof err);
    REQUIRE(m);
    al_model_params(m)[1234] = NAN;
    snprintf(p, sizeof p, "%s/step-10", g_root);
    mkdir(p, 0755);
    snprintf(nanpath, sizeof nanpath, "%s/step-10/model.safetensors", g_root);
    REQUIRE(al_model_save_safetensors(m, nanpath, AL_ST_DTYPE_F32, err, sizeof err) == 0);
    al_model_free(m);
    sha_of(nanpath, sha);
    snprintf(uri, sizeof uri, "file://%s/step-10/", g_root);
    publish(10, uri, sha);
    expect_refused(g_log, &g_srv, 10, "weights are not finite", 0);

    /* and real weights under the root are still served */
    make_step(g_root, 11, md, uri, sizeof uri, sha);
    publish(11, uri, sha);
    CHECK(wait_version(&g_srv, 11, 30) == 0);

    char *log = al_test_slurp_text(g_log);
    CHECKF(!strstr(log, "zq7-environ-secret"), "the log shows the server's environment");
    CHECKF(!strstr(log, "SECRETXY") && !strstr(log, num),
           "the log shows the first bytes of a file");
    snprintf(p, sizeof p, "%s/step-2/model.safetensors", g_root);
    sha_of(p, sha);
    CHECKF(!strstr(log, sha), "the log shows the sha256 of a file it refused");
    free(log);
}

TEST(http_downloads_are_capped_redirects_stay_in_their_origin_and_trickles_are_dropped)
{
    REQUIRE(g_srv.pid > 0 && g_http > 0);
    const char *zeros = "0000000000000000000000000000000000000000000000000000000000000000";
    char uri[600], sha[65], md[400];
    long rss0 = status_kib(g_srv.pid, "VmRSS");

    /* item 1: a body without Content-Length that never ends */
    snprintf(uri, sizeof uri, "http://127.0.0.1:%d/endless", g_hport);
    publish(12, uri, zeros);
    expect_refused(g_log, &g_srv, 12, "larger than the", 11);
    long hwm = status_kib(g_srv.pid, "VmHWM");
    printf("  endless download: RSS %ld KiB before, peak %ld KiB\n", rss0, hwm);
    CHECKF(hwm - rss0 < 256 * 1024, "the endless download took %ld KiB", hwm - rss0);

    /* and one that says it is 10 GiB */
    snprintf(uri, sizeof uri, "http://127.0.0.1:%d/huge-cl", g_hport);
    publish(13, uri, zeros);
    expect_refused(g_log, &g_srv, 13, "larger than the", 11);

    /* item 3: a redirect to another origin is refused, within the origin it is followed */
    snprintf(md, sizeof md, "%s/w1", g_dir);
    char furi[600];
    make_step(g_root, 14, md, furi, sizeof furi, sha);
    snprintf(uri, sizeof uri, "http://127.0.0.1:%d/redirect-other/step-14/model.safetensors",
             g_hport);
    publish(14, uri, sha);
    expect_refused(g_log, &g_srv, 14, "redirected to another origin", 11);
    make_step(g_root, 15, md, furi, sizeof furi, sha);
    snprintf(uri, sizeof uri, "http://127.0.0.1:%d/redirect-same/step-15/model.safetensors",
             g_hport);
    publish(15, uri, sha);
    CHECK(wait_version(&g_srv, 15, 30) == 0);

    /* item 5: one byte a second is abandoned after --policy-low-speed-time (2 s here) */
    snprintf(uri, sizeof uri, "http://127.0.0.1:%d/trickle", g_hport);
    double t0 = testlib_now();
    publish(16, uri, zeros);
    expect_refused(g_log, &g_srv, 16, "slower than 100 bytes/s for 2 s", 15);
    printf("  trickle abandoned after %.1f s\n", testlib_now() - t0);
    CHECK(testlib_now() - t0 < 20);
}

TEST(newer_version_cuts_a_stalled_download_short_and_redirects_can_be_off)
{
    REQUIRE(g_http > 0);
    char log[400], model[400], md[400], uri[600], sha[65];
    snprintf(log, sizeof log, "%s/serve-b.log", g_dir);
    snprintf(model, sizeof model, "%s/tiny", g_dir);
    snprintf(md, sizeof md, "%s/w1", g_dir);
    /* no --checkpoint-root: the trainer's layout only; a long low-speed window */
    const char *args[] = {"--model", model, "--served-model-name", "tinyb", "--follow-policy",
                          "--bootstrap", g_broker.bootstrap, "--policy-low-speed-time", "300",
                          "--policy-redirects", "off", "--log-level", "info", NULL};
    sv_server b;
    REQUIRE(sv_start_log(&b, args, log) == 0);

    /* valid weights, but not where the trainer writes them */
    char p[600], w1sha[65];
    snprintf(p, sizeof p, "%s/w1/model.safetensors", g_dir);
    sha_of(p, w1sha);
    snprintf(uri, sizeof uri, "file://%s/w1/", g_dir);
    publish_to("arclight.policy", "tinyb", 1, uri, w1sha);
    expect_refused(log, &b, 1, "not the trainer's .../step-N/model.safetensors", 0);

    /* version 2 trickles; version 3 arrives a moment later and is served at once */
    snprintf(uri, sizeof uri, "http://127.0.0.1:%d/trickle", g_hport);
    publish_to("arclight.policy", "tinyb", 2, uri, w1sha);
    usleep(1500000);
    make_step(g_root, 103, md, uri, sizeof uri, sha);
    double t0 = testlib_now();
    publish_to("arclight.policy", "tinyb", 3, uri, sha);
    CHECK(wait_version(&b, 3, 30) == 0);
    printf("  version 3 served %.1f s after it was published\n", testlib_now() - t0);
    CHECKF(testlib_now() - t0 < 15, "version 3 waited %.1f s behind a stalled download",
           testlib_now() - t0);
    CHECK(sv_wait_log(log, "superseded by a newer version", 5) == 0);

    /* --policy-redirects off */
    make_step(g_root, 104, md, uri, sizeof uri, sha);
    snprintf(uri, sizeof uri, "http://127.0.0.1:%d/redirect-same/step-104/model.safetensors",
             g_hport);
    publish_to("arclight.policy", "tinyb", 4, uri, sha);
    expect_refused(log, &b, 4, "--policy-redirects is off", 3);
    CHECK_EQ_INT(sv_stop(&b), 0);
}

TEST(restart_answers_with_the_newest_version_from_the_first_request)
{
    char log[400], model[400], md[400], uri[600], sha[65];
    snprintf(log, sizeof log, "%s/serve-c.log", g_dir);
    snprintf(model, sizeof model, "%s/tiny", g_dir);
    snprintf(md, sizeof md, "%s/w1", g_dir);
    /* versions 1 and 2 were pruned by the trainer (--keep); 3 is there */
    for (int v = 1; v <= 2; v++) {
        snprintf(uri, sizeof uri, "file://%s/step-20%d/", g_root, v);
        publish_to("t1106.policy", "tinyc", v,  uri,
                   "1111111111111111111111111111111111111111111111111111111111111111");
    }
    make_step(g_root, 203, md, uri, sizeof uri, sha);
    publish_to("t1106.policy", "tinyc", 3, uri, sha);
    /* another model's newer version is no business of this server */
    publish_to("t1106.policy", "someone-else", 9, uri, sha);

    const char *args[] = {"--model", model, "--served-model-name", "tinyc", "--follow-policy",
                          "--policy-topic", "t1106.policy", "--bootstrap", g_broker.bootstrap,
                          "--log-level", "info", NULL};
    sv_server c;
    REQUIRE(sv_start_log(&c, args, log) == 0);
    /* the first request after the address is printed */
    long code = 0;
    json_t *j = sv_post_json(c.url, "/v1/completions",
                             "{\"prompt\":[1,2,3],\"max_tokens\":2,\"temperature\":0}", &code);
    CHECK_EQ_INT(code, 200);
    CHECK_EQ_INT(json_integer_value(json_object_get(j, "policy_version")), 3);
    json_decref(j);
    CHECK_EQ_INT(health_int(&c, "weight_swaps"), 1);
    CHECK_EQ_INT(sv_log_count(log, "ERROR"), 0);
    CHECK_EQ_INT(sv_log_count(log, "not loaded"), 0);
    CHECK_EQ_INT(sv_stop(&c), 0);
}

/* SIGTERM, then the seconds until the server has exited (-1 past limit_s: then killed). */
static double stop_time(sv_server *s, double limit_s, int *status)
{
    double t0 = testlib_now();
    kill(s->pid, SIGTERM);
    int st = 0;
    while (waitpid(s->pid, &st, WNOHANG) != s->pid) {
        if (testlib_now() - t0 > limit_s) {
            kill(s->pid, SIGKILL);
            waitpid(s->pid, &st, 0);
            s->pid = 0;
            *status = -1;
            return -1;
        }
        usleep(20000);
    }
    s->pid = 0;
    *status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    return testlib_now() - t0;
}

TEST(stop_finishes_within_the_drain_timeout_whatever_the_broker_does)
{
    char model[400], topics[400];
    snprintf(model, sizeof model, "%s/tiny", g_dir);
    snprintf(topics, sizeof topics, "%s/topics.conf", g_dir);
    const char *how[] = {"frozen", "killed"};
    for (int k = 0; k < 2; k++) {
        al_test_broker b2;
        const char *bargs[] = {"--topics", topics, NULL};
        REQUIRE(al_test_broker_start(&b2, bargs) == 0);
        const char *args[] = {"--model", model, "--follow-policy", "--bootstrap", b2.bootstrap,
                              "--drain-timeout", "2", "--log-level", "warn", NULL};
        sv_server s;
        REQUIRE(sv_start(&s, args) == 0);
        usleep(500000);
        if (k == 0)
            kill(b2.pid, SIGSTOP); /* connections stay open, nothing answers */
        else
            kill(b2.pid, SIGKILL);
        usleep(500000);
        int status;
        double dt = stop_time(&s, 30, &status);
        printf("  broker %s: serve stopped in %.2f s (exit %d)\n", how[k], dt, status);
        CHECKF(dt >= 0 && dt < 3.5, "broker %s: serve took %.2f s to stop (--drain-timeout 2)",
               how[k], dt);
        CHECK_EQ_INT(status, 0);
        if (k == 0) kill(b2.pid, SIGCONT);
        al_test_broker_stop(&b2);
    }
    /* a broker that was never there: serve listens after --policy-wait and stops at once */
    int port = free_port();
    char bs[64];
    snprintf(bs, sizeof bs, "127.0.0.1:%d", port);
    const char *args[] = {"--model", model, "--follow-policy", "--bootstrap", bs, "--policy-wait",
                          "1", "--drain-timeout", "2", "--log-level", "error", NULL};
    sv_server s;
    double t0 = testlib_now();
    REQUIRE(sv_start(&s, args) == 0);
    printf("  no broker: listening after %.2f s\n", testlib_now() - t0);
    CHECK(testlib_now() - t0 < 10);
    CHECK_EQ_INT(health_int(&s, "policy_version"), 0);
    int status;
    double dt = stop_time(&s, 30, &status);
    printf("  no broker: serve stopped in %.2f s\n", dt);
    CHECK(dt >= 0 && dt < 3.5);
    CHECK_EQ_INT(status, 0);
}

TEST(teardown)
{
    if (g_srv.pid > 0) CHECK_EQ_INT(sv_stop(&g_srv), 0);
    if (g_http > 0) {
        kill(g_http, SIGKILL);
        waitpid(g_http, NULL, 0);
    }
    if (g_prod) rd_kafka_destroy(g_prod);
    al_test_broker_stop(&g_broker);
    if (g_dir) al_test_rmtree(g_dir);
    free(g_dir);
    curl_global_cleanup();
}
