/*
 * t1199_serve_helpers.h: what the serve tests share (header-only, static): a tiny model
 * directory made by `arclight model init` plus the tiny tokenizer, `arclight serve` as a
 * child process on a free port, and HTTP over libcurl with jansson bodies.
 */
#ifndef ARCLIGHT_T1199_SERVE_HELPERS_H
#define ARCLIGHT_T1199_SERVE_HELPERS_H

#include <curl/curl.h>
#include <fcntl.h>
#include <jansson.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "model/logprob.h"
#include "model/model.h"
#include "model/safetensors.h"
#include "support.h"

static inline const char *sv_bin(void)
{
    const char *b = getenv("ARCLIGHT_BIN");
    return b && *b ? b : "./build/arclight";
}

/* The binary `serve` runs from: $ARCLIGHT_SERVE_BIN when set (e.g. a ThreadSanitizer build
 * of the server while the broker runs from a plain one), else sv_bin(). */
static inline const char *sv_serve_bin(void)
{
    const char *b = getenv("ARCLIGHT_SERVE_BIN");
    return b && *b ? b : sv_bin();
}

/* Runs a shell command; 0 when it exits 0. */
static inline int sv_sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static inline int sv_sh(const char *fmt, ...)
{
    char cmd[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    int rc = system(cmd);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

/* A fresh temporary directory (caller frees the string). */
static inline char *sv_tmpdir(const char *tag)
{
    char *d = malloc(256);
    if (!al_test_tmpdir(d, 256, tag)) {
        free(d);
        return NULL;
    }
    return d;
}

/* DIR/NAME: tiny Qwen2 (random, seed) + the tiny tokenizer. 0 or -1. */
static inline int sv_make_model(const char *dir, const char *name, int seed)
{
    return sv_sh(
        "%s model init --config tests/model/tiny-qwen2.json --out %s/%s --seed %d >/dev/null && "
        "cp tests/tokenizer/tiny/tokenizer.json tests/tokenizer/tiny/tokenizer_config.json %s/%s/",
        sv_bin(), dir, name, seed, dir, name);
}

typedef struct sv_server {
    pid_t pid;
    char url[160]; /* http://127.0.0.1:PORT */
} sv_server;

/* Starts `arclight serve ARGS... --listen 127.0.0.1:0` and reads its address. 0 or -1.
 * With log (a path) the server's stderr goes to that file (appended). */
static inline int sv_start_log(sv_server *s, const char *const *args, const char *log);
static inline int sv_start(sv_server *s, const char *const *args)
{
    return sv_start_log(s, args, NULL);
}

static inline int sv_start_log(sv_server *s, const char *const *args, const char *log)
{
    int fds[2];
    if (pipe(fds) != 0) return -1;
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        dup2(fds[1], 1);
        if (log) {
            int lf = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
            if (lf >= 0) dup2(lf, 2);
        }
        close(fds[0]);
        close(fds[1]);
        const char *argv[40] = {sv_serve_bin(), "serve", "--listen", "127.0.0.1:0"};
        int n = 4;
        for (int i = 0; args[i] && n < 38; i++)
            argv[n++] = args[i];
        argv[n] = NULL;
        execv(argv[0], (char **)argv);
        _exit(127);
    }
    close(fds[1]);
    char line[128];
    size_t k = 0;
    char ch;
    while (k + 1 < sizeof line && read(fds[0], &ch, 1) == 1 && ch != '\n')
        line[k++] = ch;
    line[k] = 0;
    close(fds[0]);
    if (k == 0) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        return -1;
    }
    s->pid = pid;
    snprintf(s->url, sizeof s->url, "http://%s", line);
    return 0;
}

/* SIGTERM and wait; returns the exit status (or -1). */
static inline int sv_stop(sv_server *s)
{
    if (s->pid <= 0) return -1;
    kill(s->pid, SIGTERM);
    int st;
    waitpid(s->pid, &st, 0);
    s->pid = 0;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* Waits up to secs for the file at path to contain needle: 0, or -1. */
static inline int sv_wait_log(const char *path, const char *needle, double secs)
{
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        char *d = al_test_slurp_text(path);
        int found = strstr(d, needle) != NULL;
        free(d);
        if (found) return 0;
        clock_gettime(CLOCK_MONOTONIC, &t);
        if ((t.tv_sec - t0.tv_sec) + (t.tv_nsec - t0.tv_nsec) * 1e-9 > secs) return -1;
        usleep(50000);
    }
}

/* Occurrences of needle in the file at path. */
static inline int sv_log_count(const char *path, const char *needle)
{
    char *d = al_test_slurp_text(path);
    int n = 0;
    for (const char *p = d; (p = strstr(p, needle)) != NULL; p += strlen(needle))
        n++;
    free(d);
    return n;
}

typedef struct sv_buf {
    char *p;
    size_t n;
} sv_buf;

static inline size_t sv_write(char *d, size_t sz, size_t n, void *ud)
{
    sv_buf *b = ud;
    b->p = realloc(b->p, b->n + sz * n + 1);
    memcpy(b->p + b->n, d, sz * n);
    b->n += sz * n;
    b->p[b->n] = 0;
    return sz * n;
}

typedef struct sv_resp {
    long code;
    sv_buf body, headers;
} sv_resp;

static inline void sv_resp_free(sv_resp *r)
{
    free(r->body.p);
    free(r->headers.p);
    memset(r, 0, sizeof *r);
}

static inline CURL *sv_easy(const char *url, const char *body, sv_resp *out)
{
    CURL *c = curl_easy_init();
    curl_easy_setopt(c, CURLOPT_URL, url);
    if (body) {
        curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
        static struct curl_slist *h;
        if (!h) h = curl_slist_append(NULL, "Content-Type: application/json");
        curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
    }
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, sv_write);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &out->body);
    curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, sv_write);
    curl_easy_setopt(c, CURLOPT_HEADERDATA, &out->headers);
    curl_easy_setopt(c, CURLOPT_TIMEOUT, 120L);
    return c;
}

/* POST (body != NULL) or GET base+path. Fills *out. */
static inline void sv_http(const char *base, const char *path, const char *body, sv_resp *out)
{
    char url[512];
    snprintf(url, sizeof url, "%s%s", base, path);
    memset(out, 0, sizeof *out);
    CURL *c = sv_easy(url, body, out);
    if (curl_easy_perform(c) == CURLE_OK) curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &out->code);
    curl_easy_cleanup(c);
}

/* POSTs and parses the JSON reply (NULL when not JSON). *code gets the status. */
static inline json_t *sv_post_json(const char *base, const char *path, const char *body, long *code)
{
    sv_resp r;
    sv_http(base, path, body, &r);
    json_t *j = r.body.p ? json_loads(r.body.p, JSON_ALLOW_NUL, NULL) : NULL;
    if (getenv("SV_DEBUG"))
        fprintf(stderr, "  POST %s %s -> %ld %.300s\n", path, body, r.code,
                r.body.p ? r.body.p : "");
    if (code) *code = r.code;
    sv_resp_free(&r);
    return j;
}

static inline json_t *sv_get_json(const char *base, const char *path)
{
    sv_resp r;
    sv_http(base, path, NULL, &r);
    json_t *j = r.body.p ? json_loads(r.body.p, JSON_ALLOW_NUL, NULL) : NULL;
    sv_resp_free(&r);
    return j;
}

/* Runs n POSTs at once (curl multi); out[i] gets each reply. */
static inline void sv_post_many(const char *base, const char *path, char *const *bodies, int n,
                                sv_resp *out)
{
    char url[512];
    snprintf(url, sizeof url, "%s%s", base, path);
    CURLM *m = curl_multi_init();
    CURL **h = calloc((size_t)n, sizeof *h);
    for (int i = 0; i < n; i++) {
        memset(&out[i], 0, sizeof out[i]);
        h[i] = sv_easy(url, bodies[i], &out[i]);
        curl_multi_add_handle(m, h[i]);
    }
    int running = 1;
    while (running) {
        curl_multi_perform(m, &running);
        if (running) curl_multi_poll(m, NULL, 0, 100, NULL);
    }
    for (int i = 0; i < n; i++) {
        curl_easy_getinfo(h[i], CURLINFO_RESPONSE_CODE, &out[i].code);
        curl_multi_remove_handle(m, h[i]);
        curl_easy_cleanup(h[i]);
    }
    free(h);
    curl_multi_cleanup(m);
}

/* Reads a JSON integer array into ids (malloc'd); returns the count. */
static inline int sv_ids(json_t *a, int32_t **ids)
{
    int n = (int)json_array_size(a);
    *ids = malloc(sizeof(int32_t) * (size_t)(n + 1));
    for (int i = 0; i < n; i++)
        (*ids)[i] = (int32_t)json_integer_value(json_array_get(a, (size_t)i));
    return n;
}

/* The trainer's logprob of each generated token: one packed forward over prompt+gen with the
 * weights in model_dir, al_logprob_forward at `temperature`. out (ngen) floats. 0 or -1. */
static inline int sv_trainer_logprobs_t(const char *model_dir, const int32_t *prompt, int np,
                                        const int32_t *gen, int ng, float temperature, float *out)
{
    char err[512];
    al_model *m = al_model_load_dir(model_dir, err, sizeof err);
    if (!m) {
        fprintf(stderr, "  %s\n", err);
        return -1;
    }
    int T = np + ng, V = al_model_config_of(m)->vocab_size;
    int32_t *tok = malloc(sizeof(int32_t) * T), *pos = malloc(sizeof(int32_t) * T),
            *tgt = malloc(sizeof(int32_t) * T);
    float *logits = malloc(sizeof(float) * (size_t)T * V), *lp = malloc(sizeof(float) * T);
    memcpy(tok, prompt, sizeof(int32_t) * np);
    memcpy(tok + np, gen, sizeof(int32_t) * ng);
    for (int t = 0; t < T; t++)
        pos[t] = t, tgt[t] = t + 1 < T ? tok[t + 1] : -1;
    int32_t cu[2] = {0, T};
    int rc =
        al_model_forward(m, tok, pos, cu, 1, T, logits) == 0 &&
                al_logprob_forward(logits, tgt, T, V, temperature, lp, NULL, err, sizeof err) == 0
            ? 0
            : -1;
    if (!rc)
        for (int g = 0; g < ng; g++)
            out[g] = lp[np - 1 + g];
    free(tok), free(pos), free(tgt), free(logits), free(lp);
    al_model_free(m);
    return rc;
}

static inline int sv_trainer_logprobs(const char *model_dir, const int32_t *prompt, int np,
                                      const int32_t *gen, int ng, float *out)
{
    return sv_trainer_logprobs_t(model_dir, prompt, np, gen, ng, 1.0f, out);
}

#endif
