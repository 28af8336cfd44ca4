/*
 * ckpt_http.c: the trainer's checkpoint server (see ckpt_http.h).
 */
#include "ckpt_http.h"

#include "core/util.h"
#include "core/vec.h"
#include "http/server.h"

#include <dirent.h>
#include <event2/buffer.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* The loop, its thread and the socket are lib/http's (al_http_server_start_handler); this
 * file is the request handler. */
struct al_ckpt_http {
    char *root;
    al_http_server *srv;
};

static void reply_json(al_httpd_req *req, int code, const char *body)
{
    al_httpd_send(req, code, "application/json", body, strlen(body));
}

/* A plain name: letters, digits, '.', '_', '-', not starting with '.'. */
static int name_ok(const char *s, size_t n)
{
    if (n == 0 || n > 200 || s[0] == '.') return 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '-'))
            return 0;
    }
    return 1;
}

static int step_name_ok(const char *s, size_t n)
{
    if (n < 6 || strncmp(s, "step-", 5) != 0) return 0;
    for (size_t i = 5; i < n; i++)
        if (s[i] < '0' || s[i] > '9') return 0;
    return 1;
}

/* Lists dir's entries that pass `ok` as a JSON array member: {"<key>": [..]}. */
static void reply_listing(al_httpd_req *req, const char *dir, const char *key,
                          int (*ok)(const char *, size_t), int want_dirs)
{
    DIR *d = opendir(dir);
    if (!d) {
        reply_json(req, 404, "{\"error\":\"no such checkpoint\"}");
        return;
    }
    AL_VEC(char *) names = {0};
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (!ok(e->d_name, strlen(e->d_name))) continue;
        char p[2600];
        struct stat sb;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        if (stat(p, &sb) != 0 || (want_dirs ? !S_ISDIR(sb.st_mode) : !S_ISREG(sb.st_mode))) continue;
        char *name = strdup(e->d_name);
        if (!name || al_vec_push(&names, name) != 0) {
            free(name);
            break;
        }
    }
    closedir(d);
    /* step-N by N, files by name */
    for (size_t i = 1; i < names.n; i++)
        for (size_t j = i; j > 0; j--) {
            int swap = want_dirs ? atoll(names.v[j - 1] + 5) > atoll(names.v[j] + 5)
                                 : strcmp(names.v[j - 1], names.v[j]) > 0;
            if (!swap) break;
            char *t = names.v[j];
            names.v[j] = names.v[j - 1];
            names.v[j - 1] = t;
        }
    struct evbuffer *b = evbuffer_new();
    if (b) {
        evbuffer_add_printf(b, "{\"%s\":[", key);
        for (size_t i = 0; i < names.n; i++)
            evbuffer_add_printf(b, "%s\"%s\"", i ? "," : "", names.v[i]);
        evbuffer_add_printf(b, "]}");
        al_httpd_send_buffer(req, 200, "application/json", b);
        evbuffer_free(b);
    } else {
        reply_json(req, 500, "{\"error\":\"out of memory\"}");
    }
    for (size_t i = 0; i < names.n; i++) free(names.v[i]);
    al_vec_free(&names);
}

static void on_request(al_httpd_req *req, void *arg)
{
    al_ckpt_http *s = arg;
    if (!al_httpd_req_method_is(req, "GET") && !al_httpd_req_method_is(req, "HEAD")) {
        al_httpd_add_header(req, "Allow", "GET, HEAD");
        reply_json(req, 405, "{\"error\":\"method not allowed\"}");
        return;
    }
    const char *path = al_httpd_req_path(req);
    const char *pre = "/checkpoints";
    if (strncmp(path, pre, strlen(pre)) != 0) {
        reply_json(req, 404, "{\"error\":\"not found; try /checkpoints/\"}");
        return;
    }
    const char *rest = path + strlen(pre);
    if (*rest == '\0' || strcmp(rest, "/") == 0) {
        reply_listing(req, s->root, "checkpoints", step_name_ok, 1);
        return;
    }
    if (*rest != '/') {
        reply_json(req, 404, "{\"error\":\"not found\"}");
        return;
    }
    rest++;
    const char *slash = strchr(rest, '/');
    size_t dn = slash ? (size_t)(slash - rest) : strlen(rest);
    if (!step_name_ok(rest, dn)) {
        reply_json(req, 404, "{\"error\":\"not a checkpoint name (step-N)\"}");
        return;
    }
    char dir[2048], file[2300];
    snprintf(dir, sizeof dir, "%s/%.*s", s->root, (int)dn, rest);
    const char *fname = slash ? slash + 1 : "";
    if (*fname == '\0') {
        reply_listing(req, dir, "files", name_ok, 0);
        return;
    }
    if (!name_ok(fname, strlen(fname))) {
        reply_json(req, 404, "{\"error\":\"not a file name\"}");
        return;
    }
    snprintf(file, sizeof file, "%s/%s", dir, fname);
    int fd = open(file, O_RDONLY | O_CLOEXEC);
    struct stat sb;
    if (fd < 0 || fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        if (fd >= 0) close(fd);
        reply_json(req, 404, "{\"error\":\"no such file\"}");
        return;
    }
    struct evbuffer *b = evbuffer_new();
    if (!b) {
        close(fd);
        reply_json(req, 500, "{\"error\":\"out of memory\"}");
        return;
    }
    /* the buffer takes the descriptor and sends it without copying through user space; a
     * checkpoint replaced meanwhile is renamed over, so the open file stays whole */
    if (sb.st_size > 0 && evbuffer_add_file(b, fd, 0, sb.st_size) != 0) {
        close(fd);
        evbuffer_free(b);
        reply_json(req, 500, "{\"error\":\"cannot read the file\"}");
        return;
    }
    if (sb.st_size == 0) close(fd);
    const char *ctype = strstr(fname, ".json") ? "application/json" : "application/octet-stream";
    al_httpd_send_buffer(req, 200, ctype, b);
    evbuffer_free(b);
}

/* Checkpoints are large and fetched by servers on slow links: a long idle timeout; no
 * request has a body worth reading. */
static const al_http_server_opts ckpt_opts = {
    .addr_name = "--listen",
    .name = "checkpoint",
    .serves = "checkpoints",
    .http = {.max_body = 4096, .idle_timeout_ms = 120000, .write_timeout_ms = 120000},
};

al_ckpt_http *al_ckpt_http_start(const char *hostport, const char *root, char *errstr,
                                 size_t errlen)
{
    al_ckpt_http *s = calloc(1, sizeof *s);
    if (!s || !(s->root = strdup(root))) {
        free(s);
        al_err(errstr, errlen, "out of memory");
        return NULL;
    }
    if (!(s->srv = al_http_server_start_handler(hostport, &ckpt_opts, on_request, s, errstr,
                                                errlen))) {
        free(s->root);
        free(s);
        return NULL;
    }
    return s;
}

int al_ckpt_http_port(const al_ckpt_http *s)
{
    return s ? al_http_server_port(s->srv) : -1;
}

void al_ckpt_http_stop(al_ckpt_http *s)
{
    if (!s) return;
    al_http_server_stop(s->srv); /* joins the thread: no request reads root after this */
    free(s->root);
    free(s);
}
