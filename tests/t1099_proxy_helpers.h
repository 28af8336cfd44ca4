/*
 * t1099_proxy_helpers.h: what the proxy tests share: run `arclight proxy` as a child (its
 * stderr to a log file), HTTP requests over real sockets with libcurl, and reading spans
 * back from the broker (topics are read with support.h's al_test_topic_read). Header-only
 * (static functions); include after testlib.h and broker_fixture.h.
 */
#ifndef ARCLIGHT_T1099_PROXY_HELPERS_H
#define ARCLIGHT_T1099_PROXY_HELPERS_H

#include "avro/codec.h"
#include "fake_upstream.h"
#include "support.h"

#include <curl/curl.h>
#include <librdkafka/rdkafka.h>
#include <stdarg.h>
#include <sys/stat.h>

typedef struct px_child {
    pid_t pid;
    int port;
    char base[128]; /* http://127.0.0.1:PORT */
    char log[1024];
} px_child;

/* Starts `arclight proxy` with args (NULL-terminated) and env (NAME=VALUE, NULL-terminated,
 * may be NULL); its stderr appends to log_path. Waits up to 60 s for the port line. */
static int px_start(px_child *p, const char *log_path, const char *const *args,
                    const char *const *env)
{
    const char *argv[64];
    int argc = 0, pfd[2];
    memset(p, 0, sizeof *p);
    snprintf(p->log, sizeof p->log, "%s", log_path);
    argv[argc++] = al_test_bin();
    argv[argc++] = "proxy";
    for (int i = 0; args[i] && argc < 62; i++)
        argv[argc++] = args[i];
    argv[argc] = NULL;
    if (pipe(pfd) != 0) return -1;
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        dup2(pfd[1], STDOUT_FILENO);
        int lfd = open(log_path, O_WRONLY | O_CREAT | O_APPEND, 0600);
        if (lfd >= 0) dup2(lfd, STDERR_FILENO);
        close(pfd[0]);
        close(pfd[1]);
        for (int i = 0; env && env[i]; i++)
            putenv((char *)env[i]);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    close(pfd[1]);
    p->pid = pid;
    al_test_broker_track(pid, 1);
    char line[128];
    if (al_test_broker_readline(pfd[0], line, sizeof line, 60000) != 0) {
        close(pfd[0]);
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        al_test_broker_track(pid, 0);
        p->pid = 0;
        fprintf(stderr, "proxy did not start; its log (%s) says:\n", log_path);
        char cmd[1200];
        snprintf(cmd, sizeof cmd, "tail -20 '%s' >&2", log_path);
        if (system(cmd)) {
        }
        return -1;
    }
    close(pfd[0]);
    const char *colon = strrchr(line, ':');
    p->port = colon ? atoi(colon + 1) : 0;
    snprintf(p->base, sizeof p->base, "http://127.0.0.1:%d", p->port);
    return p->port > 0 ? 0 : -1;
}

/* Starts the proxy as most tests run it: on a free loopback port, in front of upstream,
 * publishing to bootstrap, its spool in DIR/spool-NAME and its stderr in DIR/NAME.log; extra
 * (NULL-terminated, may be NULL) adds flags, env as px_start's. 0, or -1 (the log's tail on
 * stderr). */
static __attribute__((unused)) int px_start_proxy(px_child *p, const char *dir,
                                                  const char *upstream, const char *bootstrap,
                                                  const char *name, const char *const *extra,
                                                  const char *const *env)
{
    char spool[700], log[700];
    snprintf(spool, sizeof spool, "%s/spool-%s", dir, name);
    snprintf(log, sizeof log, "%s/%s.log", dir, name);
    const char *args[40] = {"--listen",  "127.0.0.1:0", "--upstream", upstream,
                            "--bootstrap", bootstrap,   "--spool-dir", spool};
    int n = 8;
    for (int i = 0; extra && extra[i] && n < 38; i++)
        args[n++] = extra[i];
    args[n] = NULL;
    return px_start(p, log, args, env);
}

/* Sends sig and waits up to timeout_s; returns the exit status, or -1 (killed). */
static int px_stop(px_child *p, int sig, int timeout_s)
{
    int status = 0;
    if (p->pid <= 0) return -1;
    kill(p->pid, sig);
    for (int i = 0; i < timeout_s * 20; i++) {
        if (waitpid(p->pid, &status, WNOHANG) == p->pid) {
            al_test_broker_track(p->pid, 0);
            p->pid = 0;
            return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
        }
        usleep(50000);
    }
    kill(p->pid, SIGKILL);
    waitpid(p->pid, NULL, 0);
    al_test_broker_track(p->pid, 0);
    p->pid = 0;
    return -1;
}

typedef struct px_resp {
    long status;
    char *body;
    size_t len;
    char *headers;
    size_t hlen;
    double first_byte_s, total_s;
} px_resp;

static size_t px_collect(char *d, size_t s, size_t n, void *ud)
{
    char **pp = ud;
    size_t *lenp = (size_t *)(pp + 1);
    char *nb = realloc(*pp, *lenp + s * n + 1);
    if (!nb) return 0;
    memcpy(nb + *lenp, d, s * n);
    *lenp += s * n;
    nb[*lenp] = '\0';
    *pp = nb;
    return s * n;
}

/* When nonzero, px_http reads answers at most this many bytes per second (a slow agent). */
static long px_recv_limit;

typedef struct px_sink {
    char *p;
    size_t n;
} px_sink;

/* One request. headers: NULL-terminated "Name: value" lines (may be NULL); body NULL for
 * GET. Returns 0 when an HTTP answer came (any status). */
static int px_http(const char *method, const char *url, const char *const *headers,
                   const char *body, px_resp *r)
{
    memset(r, 0, sizeof *r);
    CURL *e = curl_easy_init();
    struct curl_slist *h = NULL;
    for (int i = 0; headers && headers[i]; i++)
        h = curl_slist_append(h, headers[i]);
    px_sink b = {0}, hd = {0};
    curl_easy_setopt(e, CURLOPT_URL, url);
    if (!strcmp(method, "HEAD"))
        curl_easy_setopt(e, CURLOPT_NOBODY, 1L);
    else
        curl_easy_setopt(e, CURLOPT_CUSTOMREQUEST, method);
    if (body) {
        curl_easy_setopt(e, CURLOPT_POSTFIELDS, body);
        curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE, (long)strlen(body));
    }
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, px_collect);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, &b);
    curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, px_collect);
    curl_easy_setopt(e, CURLOPT_HEADERDATA, &hd);
    curl_easy_setopt(e, CURLOPT_TIMEOUT, 30L);
    if (px_recv_limit) curl_easy_setopt(e, CURLOPT_MAX_RECV_SPEED_LARGE, (curl_off_t)px_recv_limit);
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    CURLcode rc = curl_easy_perform(e);
    curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &r->status);
    curl_easy_getinfo(e, CURLINFO_STARTTRANSFER_TIME, &r->first_byte_s);
    curl_easy_getinfo(e, CURLINFO_TOTAL_TIME, &r->total_s);
    r->body = b.p ? b.p : strdup("");
    r->len = b.n;
    r->headers = hd.p ? hd.p : strdup("");
    r->hlen = hd.n;
    curl_slist_free_all(h);
    curl_easy_cleanup(e);
    if (rc != CURLE_OK) { /* callers REQUIRE success: nothing to free on failure */
        free(r->body);
        free(r->headers);
        r->body = r->headers = NULL;
        return -1;
    }
    return 0;
}

static __attribute__((unused)) void px_resp_free(px_resp *r)
{
    free(r->body);
    free(r->headers);
    memset(r, 0, sizeof *r);
}

static const char *const PX_JSON[] = {"Content-Type: application/json", NULL};

/* POSTs JSON to base + path. */
static __attribute__((unused)) int px_post(const px_child *p, const char *path, const char *body,
                                           px_resp *r)
{
    char url[512];
    snprintf(url, sizeof url, "%s%s", p->base, path);
    return px_http("POST", url, PX_JSON, body, r);
}

/* ------------------------------------------------------------------------------------------
 * Reading spans back
 * ------------------------------------------------------------------------------------------ */

/* Reads arclight.spans until want_ends rollout ends have arrived (they come last), trying at
 * most `tries` reads of 1.5 s, and decodes every span into *out (calloc'd; the caller
 * al_span_clear's each and frees it), *n of them. Returns the number of ends seen. */
static __attribute__((unused)) size_t px_read_spans(const char *bootstrap, size_t want_ends,
                                                    int tries, al_span **out, size_t *n)
{
    al_test_msgs m = {0};
    size_t ends = 0;
    char err[256];
    for (int t = 0; t < tries && (t == 0 || ends < want_ends); t++) {
        al_test_msgs_free(&m);
        al_test_topic_read(bootstrap, "arclight.spans", NULL, 100000, 1500, &m);
        ends = 0;
        for (size_t i = 0; i < m.n; i++) {
            al_span s = {0};
            if (al_span_decode(m.val[i], m.len[i], &s, err, sizeof err) == 0 &&
                s.kind == AL_SPAN_KIND_ROLLOUT_END)
                ends++;
            al_span_clear(&s);
        }
    }
    *out = calloc(m.n + 1, sizeof **out);
    *n = 0;
    for (size_t i = 0; i < m.n; i++) {
        if (al_span_decode(m.val[i], m.len[i], &(*out)[*n], err, sizeof err) == 0)
            (*n)++;
        else
            fprintf(stderr, "  undecodable span %zu: %s\n", i, err);
    }
    al_test_msgs_free(&m);
    return ends;
}

/* Decodes the spans of one rollout from msgs into out (caller al_span_clear's each), in
 * sequence order. Returns how many. */
static __attribute__((unused)) size_t px_spans_of(const al_test_msgs *m, const char *rollout,
                                                  al_span *out, size_t max)
{
    size_t n = 0;
    char err[256];
    for (size_t i = 0; i < m->n && n < max; i++) {
        al_span s;
        memset(&s, 0, sizeof s);
        if (al_span_decode(m->val[i], m->len[i], &s, err, sizeof err) != 0) {
            al_span_clear(&s);
            continue;
        }
        if (strcmp(s.rollout_id, rollout) == 0)
            out[n++] = s;
        else
            al_span_clear(&s);
    }
    for (size_t a = 1; a < n; a++)
        for (size_t b = a; b > 0 && out[b - 1].sequence > out[b].sequence; b--) {
            al_span t = out[b];
            out[b] = out[b - 1];
            out[b - 1] = t;
        }
    return n;
}

/* Whether needle occurs in the file at path. */
static __attribute__((unused)) int px_file_contains(const char *path, const char *needle)
{
    size_t got;
    char *b = al_test_slurp(path, &got);
    if (!b) return 0;
    int r = memmem(b, got, needle, strlen(needle)) != NULL;
    free(b);
    return r;
}

#endif
