/*
 * fetch.c: fetching checkpoint weights and the checks around it (fetch.h).
 */
#include "fetch.h"

#include "core/buf.h"
#include "core/util.h"

#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_REDIRECTS 5
#define ST_HEADER_MAX (100u << 20) /* safetensors' own bound on the header */

/* ------------------------------------------------------------------------------------------
 * Pure checks
 * ------------------------------------------------------------------------------------------ */

int al_serve_sha256_valid(const char *s)
{
    if (!s) return 0;
    size_t i = 0;
    for (; s[i]; i++) {
        char c = s[i];
        if (i >= 64 || !((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F')))
            return 0;
    }
    return i == 64;
}

char *al_serve_log_escape(const char *s, char *out, size_t cap)
{
    static const char hex[] = "0123456789abcdef";
    size_t o = 0;
    if (cap == 0) return out;
    for (const unsigned char *p = (const unsigned char *)(s ? s : ""); *p; p++) {
        int esc = *p < 0x20 || *p >= 0x7f || *p == '\\';
        size_t need = esc ? 4 : 1;
        if (o + need + 4 > cap) { /* room for "..." and the NUL */
            memcpy(out + o, "...", 3);
            o += 3;
            break;
        }
        if (esc) {
            out[o++] = '\\', out[o++] = 'x', out[o++] = hex[*p >> 4], out[o++] = hex[*p & 15];
        } else {
            out[o++] = (char)*p;
        }
    }
    out[o] = '\0';
    return out;
}

int al_serve_uri_parse(const char *uri, al_serve_uri *out, char *errstr, size_t errlen)
{
    static const char file_name[] = "model.safetensors";
    size_t n = uri ? strlen(uri) : 0;
    out->kind = 0;
    out->target[0] = '\0';
    if (n == 0) return al_err(errstr, errlen, "the checkpoint URI is empty");
    if (n + sizeof file_name >= sizeof out->target)
        return al_err(errstr, errlen, "the checkpoint URI is longer than %zu bytes",
                      sizeof out->target - sizeof file_name - 1);
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)uri[i] < 0x20 || uri[i] == 0x7f)
            return al_err(errstr, errlen, "the checkpoint URI holds control characters");
    const char *append = uri[n - 1] == '/' ? file_name : "";
    if (!strncasecmp(uri, "file://", 7)) {
        const char *path = uri + 7;
        if (!strncasecmp(path, "localhost/", 10)) path += 9;
        if (*path != '/')
            return al_err(errstr, errlen,
                          "a file:// URI must name an absolute local path (file:///...)");
        if (strpbrk(path, "?#"))
            return al_err(errstr, errlen, "a file:// URI has no query or fragment");
        for (const char *s = path; *s;) {
            while (*s == '/')
                s++;
            size_t sl = strcspn(s, "/");
            if ((sl == 1 && s[0] == '.') || (sl == 2 && s[0] == '.' && s[1] == '.'))
                return al_err(errstr, errlen, "a file:// path has no '.' or '..' segments");
            s += sl;
        }
        out->kind = 'f';
        snprintf(out->target, sizeof out->target, "%s%s", path, append);
        return 0;
    }
    size_t sl = !strncasecmp(uri, "http://", 7) ? 7 : !strncasecmp(uri, "https://", 8) ? 8 : 0;
    if (!sl)
        return al_err(errstr, errlen, "only file://, http:// and https:// checkpoint URIs are "
                                      "supported");
    if (uri[sl] == '\0' || uri[sl] == '/' || uri[sl] == '?' || uri[sl] == '#')
        return al_err(errstr, errlen, "the URI names no host");
    out->kind = 'h';
    snprintf(out->target, sizeof out->target, "%s%s", uri, append);
    return 0;
}

int al_serve_same_origin(const char *a, const char *b)
{
    if (!a || !b) return 0;
    CURLU *x = curl_url(), *y = curl_url();
    int same = 0;
    char *xs = NULL, *xh = NULL, *xp = NULL, *ys = NULL, *yh = NULL, *yp = NULL;
    if (x && y && curl_url_set(x, CURLUPART_URL, a, 0) == CURLUE_OK &&
        curl_url_set(y, CURLUPART_URL, b, 0) == CURLUE_OK &&
        curl_url_get(x, CURLUPART_SCHEME, &xs, 0) == CURLUE_OK &&
        curl_url_get(y, CURLUPART_SCHEME, &ys, 0) == CURLUE_OK &&
        curl_url_get(x, CURLUPART_HOST, &xh, 0) == CURLUE_OK &&
        curl_url_get(y, CURLUPART_HOST, &yh, 0) == CURLUE_OK &&
        curl_url_get(x, CURLUPART_PORT, &xp, CURLU_DEFAULT_PORT) == CURLUE_OK &&
        curl_url_get(y, CURLUPART_PORT, &yp, CURLU_DEFAULT_PORT) == CURLUE_OK)
        same = !strcasecmp(xs, ys) && !strcasecmp(xh, yh) && !strcmp(xp, yp);
    curl_free(xs), curl_free(xh), curl_free(xp), curl_free(ys), curl_free(yh), curl_free(yp);
    curl_url_cleanup(x);
    curl_url_cleanup(y);
    return same;
}

int al_serve_trainer_layout(const char *path)
{
    static const char tail[] = "/model.safetensors";
    size_t n = path ? strlen(path) : 0, tl = sizeof tail - 1;
    if (n <= tl || path[0] != '/' || strcmp(path + n - tl, tail) != 0) return 0;
    size_t e = n - tl, s = e;
    while (s > 0 && path[s - 1] != '/')
        s--;
    /* path[s..e) is the directory's name: step-N */
    if (e - s < 6 || strncmp(path + s, "step-", 5) != 0) return 0;
    for (size_t i = s + 5; i < e; i++)
        if (path[i] < '0' || path[i] > '9') return 0;
    return 1;
}

int al_serve_path_under(const char *path, const char *const *roots, size_t nroots)
{
    for (size_t i = 0; i < nroots; i++) {
        const char *r = roots[i];
        size_t rl = strlen(r);
        while (rl > 1 && r[rl - 1] == '/')
            rl--;
        if (rl == 1 && r[0] == '/') return path[0] == '/';
        if (rl && strncmp(path, r, rl) == 0 && path[rl] == '/' && path[rl + 1] != '\0') return 1;
    }
    return 0;
}

int al_serve_st_precheck(const uint8_t *b, size_t len, char *errstr, size_t errlen)
{
    if (len < 10) return al_err(errstr, errlen, "not a safetensors file (too short)");
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = (hlen << 8) | b[i];
    if (hlen < 2 || hlen > len - 8 || hlen > ST_HEADER_MAX || b[8] != '{')
        return al_err(errstr, errlen,
                      "not a safetensors file (no header length and JSON header at its start)");
    return 0;
}

/* ------------------------------------------------------------------------------------------
 * Fetching
 * ------------------------------------------------------------------------------------------ */

static int fetch_aborted(const al_serve_fetch_opts *o, const char **why)
{
    *why = "";
    return o->abort && o->abort(o->abort_ud, why);
}

/* Reads a file:// checkpoint into g: only a regular file under a root (or, without roots,
 * the trainer's layout), both before and after resolving links; at most max_bytes. */
static int fetch_file(const char *path, const al_serve_fetch_opts *o, al_buf *g, char *errstr,
                      size_t errlen)
{
    /* the path as written first, so that nothing outside is even resolved */
    int where_ok = o->nroots ? al_serve_path_under(path, o->roots, o->nroots)
                             : al_serve_trainer_layout(path);
    if (!where_ok)
        return al_err(errstr, errlen,
                      o->nroots ? "the path is not under a --checkpoint-root"
                                : "the path is not the trainer's .../step-N/model.safetensors "
                                  "(give --checkpoint-root DIR to read other paths)");
    char real[PATH_MAX];
    if (!realpath(path, real))
        return al_err(errstr, errlen, "cannot resolve the path: %s", strerror(errno));
    where_ok = o->nroots ? al_serve_path_under(real, o->roots, o->nroots)
                         : al_serve_trainer_layout(real);
    if (!where_ok)
        return al_err(errstr, errlen,
                      "the path leads outside the checkpoint roots through a symbolic link");
    int fd = open(real, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0) return al_err(errstr, errlen, "cannot open the file: %s", strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return al_err(errstr, errlen, "not a regular file");
    }
    if (o->max_bytes && (uint64_t)sb.st_size > o->max_bytes) {
        close(fd);
        return al_err(errstr, errlen,
                      "larger than the %zu bytes the served model's weights can take; refused",
                      o->max_bytes);
    }
    size_t want = (size_t)sb.st_size;
    al_buf_reset(g);
    if (al_buf_reserve(g, want) != 0) {
        close(fd);
        return al_err(errstr, errlen, "out of memory");
    }
    while (g->len < want) {
        const char *why;
        if (fetch_aborted(o, &why)) {
            close(fd);
            return al_err(errstr, errlen, "%s", why);
        }
        size_t chunk = want - g->len < (4u << 20) ? want - g->len : (4u << 20);
        ssize_t r = read(fd, g->data + g->len, chunk);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            int e = errno;
            close(fd);
            return al_err(errstr, errlen, r < 0 ? "read failed: %s" : "%s",
                          r < 0 ? strerror(e) : "the file shrank while it was read");
        }
        g->len += (size_t)r;
    }
    close(fd);
    return 0;
}

typedef struct xfer {
    al_buf g;
    const al_serve_fetch_opts *o;
    int too_large;
    const char *why; /* set when the progress callback abandons the transfer */
} xfer;

static size_t curl_write(char *data, size_t sz, size_t n, void *ud)
{
    xfer *x = ud;
    size_t add = sz * n;
    if (x->o->max_bytes && x->g.len + add > x->o->max_bytes) {
        x->too_large = 1;
        return 0;
    }
    return al_buf_append(&x->g, data, add) == 0 ? add : 0;
}

static int curl_progress(void *ud, curl_off_t dlt, curl_off_t dln, curl_off_t ult, curl_off_t uln)
{
    (void)dlt, (void)dln, (void)ult, (void)uln;
    xfer *x = ud;
    return fetch_aborted(x->o, &x->why);
}

static int is_redirect(long code)
{
    return code == 301 || code == 302 || code == 303 || code == 307 || code == 308;
}

static int fetch_http(const char *url0, const al_serve_fetch_opts *o, al_buf *out, char *errstr,
                      size_t errlen)
{
    CURL *c = curl_easy_init();
    if (!c) return al_err(errstr, errlen, "curl_easy_init failed");
    char url[4200], cerr[CURL_ERROR_SIZE];
    snprintf(url, sizeof url, "%s", url0);
    xfer x = {.o = o};
    int rc = -1;
    for (int hop = 0;; hop++) {
        al_buf_reset(&x.g);
        x.too_large = 0;
        x.why = NULL;
        cerr[0] = '\0';
        curl_easy_setopt(c, CURLOPT_URL, url);
        curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
        curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 0L);
        curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
        curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, curl_write);
        curl_easy_setopt(c, CURLOPT_WRITEDATA, &x);
        curl_easy_setopt(c, CURLOPT_XFERINFOFUNCTION, curl_progress);
        curl_easy_setopt(c, CURLOPT_XFERINFODATA, &x);
        curl_easy_setopt(c, CURLOPT_NOPROGRESS, 0L);
        curl_easy_setopt(c, CURLOPT_ERRORBUFFER, cerr);
        curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT, o->connect_timeout > 0 ? o->connect_timeout : 10L);
        if (o->low_speed_limit > 0 && o->low_speed_time > 0) {
            curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, o->low_speed_limit);
            curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME, o->low_speed_time);
        }
        if (o->max_bytes) curl_easy_setopt(c, CURLOPT_MAXFILESIZE_LARGE, (curl_off_t)o->max_bytes);
        CURLcode cr = curl_easy_perform(c);
        long code = 0;
        curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &code);
        if (cr != CURLE_OK) {
            if (x.too_large || cr == CURLE_FILESIZE_EXCEEDED)
                al_err(errstr, errlen,
                       "larger than the %zu bytes the served model's weights can take; refused",
                       o->max_bytes);
            else if (cr == CURLE_ABORTED_BY_CALLBACK && x.why)
                al_err(errstr, errlen, "%s", x.why);
            else if (cr == CURLE_OPERATION_TIMEDOUT && o->low_speed_limit > 0 &&
                     code == 200)
                al_err(errstr, errlen,
                       "slower than %ld bytes/s for %ld s (--policy-low-speed-limit, "
                       "--policy-low-speed-time): abandoned",
                       o->low_speed_limit, o->low_speed_time);
            else
                al_err(errstr, errlen, "%s", *cerr ? cerr : curl_easy_strerror(cr));
            break;
        }
        if (is_redirect(code)) {
            char *loc = NULL, esc[300];
            curl_easy_getinfo(c, CURLINFO_REDIRECT_URL, &loc);
            if (o->redirects == AL_SERVE_REDIRECTS_OFF) {
                al_err(errstr, errlen, "redirected (HTTP %ld), and --policy-redirects is off", code);
                break;
            }
            if (!loc) {
                al_err(errstr, errlen, "HTTP %ld without a Location", code);
                break;
            }
            if (!al_serve_same_origin(url0, loc)) {
                al_err(errstr, errlen, "redirected to another origin (%s): refused",
                       al_serve_log_escape(loc, esc, sizeof esc));
                break;
            }
            if (hop >= MAX_REDIRECTS) {
                al_err(errstr, errlen, "more than %d redirects", MAX_REDIRECTS);
                break;
            }
            snprintf(url, sizeof url, "%s", loc);
            continue;
        }
        if (code != 200) {
            al_err(errstr, errlen, "HTTP status %ld", code);
            break;
        }
        rc = 0;
        break;
    }
    curl_easy_cleanup(c);
    if (rc == 0)
        *out = x.g;
    else
        al_buf_free(&x.g);
    return rc;
}

int al_serve_fetch_weights(const char *uri, const char *sha256_hex, const al_serve_fetch_opts *o,
                           uint8_t **out, size_t *len, char *errstr, size_t errlen)
{
    char ulog[400], e2[700];
    al_serve_log_escape(uri, ulog, sizeof ulog);
    if (!al_serve_sha256_valid(sha256_hex))
        return al_err(errstr, errlen,
                      "%s: the PolicyVersion's sha256 is not 64 hex digits, so the bytes cannot "
                      "be checked: refused",
                      ulog);
    al_serve_uri u;
    if (al_serve_uri_parse(uri, &u, e2, sizeof e2) != 0)
        return al_err(errstr, errlen, "%s: %s", ulog, e2);
    al_buf g = {0};
    int rc = u.kind == 'f' ? fetch_file(u.target, o, &g, e2, sizeof e2)
                           : fetch_http(u.target, o, &g, e2, sizeof e2);
    if (rc != 0) {
        al_buf_free(&g);
        return al_err(errstr, errlen, "fetching %s: %s", ulog, e2);
    }
    char hex[65];
    al_sha256_hex(g.data ? g.data : "", g.len, hex);
    if (strcasecmp(hex, sha256_hex) != 0) {
        al_buf_free(&g);
        return al_err(errstr, errlen, "%s: the bytes fetched do not have the PolicyVersion's sha256 %s",
                      ulog, sha256_hex);
    }
    *out = (uint8_t *)al_buf_detach(&g, len);
    if (!*out) return al_err(errstr, errlen, "out of memory");
    return 0;
}

