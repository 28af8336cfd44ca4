/*
 * fetch.c: `arclight sync --stage-dir DIR`: a version published with an http:// URI (the
 * trainer's checkpoint server, --listen) is copied into DIR/step-N/ before the replicas are
 * told to load it, so that replicas that load from a path (SGLang, vLLM) can follow a trainer
 * they share no filesystem with: DIR is a volume sync and the replicas share.
 *
 * The file list is the checkpoint server's GET URI ({"files": [...]}, ckpt_http.h); each name
 * must be a plain file name (no '/', not hidden); all but the optimizer state and
 * trainer_state.json (a full checkpoint's, for resuming the trainer) are fetched into
 * DIR/.step-N.tmp-PID, model.safetensors checked against the PolicyVersion's sha256, then
 * renamed to DIR/step-N: a replica never sees half a directory. Older staged versions than the
 * newest `keep` are removed.
 */
#include "sync.h"

#include "core/buf.h"
#include "core/sha256.h"
#include "core/util.h"

#include <curl/curl.h>
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

static size_t to_buf(char *d, size_t sz, size_t n, void *ud)
{
    al_buf *b = ud;
    if (b->len + sz * n > (1u << 20)) return 0;
    al_buf_append(b, d, sz * n);
    return b->oom ? 0 : sz * n;
}

/* GET url into the open file f (when f) or the buffer b. 0, or -1 with err. */
static int get(const char *url, FILE *f, al_buf *b, double timeout_s, char *err, size_t errlen)
{
    CURL *c = curl_easy_init();
    if (!c) return al_err(err, errlen, "out of memory");
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, (long)(timeout_s * 1000));
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, 10000L);
    curl_easy_setopt(c, CURLOPT_FAILONERROR, 1L);
    if (f) {
        curl_easy_setopt(c, CURLOPT_WRITEDATA, f);
    } else {
        curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, to_buf);
        curl_easy_setopt(c, CURLOPT_WRITEDATA, b);
    }
    CURLcode rc = curl_easy_perform(c);
    curl_easy_cleanup(c);
    if (rc != CURLE_OK) return al_err(err, errlen, "GET %.300s: %s", url, curl_easy_strerror(rc));
    return 0;
}

/* Removes a staged directory: its plain files, then itself. */
static void remove_dir(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    char p[PATH_MAX + 256];
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.') continue;
        if ((size_t)snprintf(p, sizeof p, "%s/%s", dir, e->d_name) >= sizeof p) continue;
        unlink(p);
    }
    closedir(d);
    rmdir(dir);
}

/* Removes DIR/step-M for M <= newest - keep. */
static void prune(const char *root, int64_t newest, int keep)
{
    DIR *d = opendir(root);
    if (!d) return;
    struct dirent *e;
    char p[PATH_MAX + 256];
    while ((e = readdir(d)) != NULL) {
        char *end;
        if (strncmp(e->d_name, "step-", 5) != 0) continue;
        long long v = strtoll(e->d_name + 5, &end, 10);
        if (*end || end == e->d_name + 5 || v > newest - keep) continue;
        snprintf(p, sizeof p, "%s/%s", root, e->d_name);
        remove_dir(p);
    }
    closedir(d);
}

/* 1 when name is a plain file name the checkpoint server may list. */
static int plain_name(const char *name)
{
    if (!*name || name[0] == '.' || strlen(name) > 200) return 0;
    for (const char *c = name; *c; c++)
        if (*c == '/' || *c == '\\' || (unsigned char)*c < 0x20) return 0;
    return 1;
}

/* Fetches every listed file of uri into tmp. 0 or -1 with err. */
static int fetch_files(const char *uri, const char *tmp, double timeout_s, char *err,
                       size_t errlen)
{
    al_buf b = {0};
    if (get(uri, NULL, &b, timeout_s, err, errlen) != 0) {
        al_buf_free(&b);
        return -1;
    }
    json_t *j = json_loadb(b.data ? b.data : "", b.len, 0, NULL);
    al_buf_free(&b);
    json_t *files = json_object_get(j, "files");
    int rc = json_is_array(files) && json_array_size(files) > 0
                 ? 0
                 : al_err(err, errlen, "GET %.300s: no {\"files\": [...]} listing", uri);
    for (size_t i = 0; rc == 0 && i < json_array_size(files); i++) {
        const char *name = json_string_value(json_array_get(files, i));
        if (!name || !plain_name(name)) {
            rc = al_err(err, errlen, "GET %.300s: listed a name that is no plain file name", uri);
            break;
        }
        /* what only resuming the trainer needs stays behind (the moments are twice the
         * weights' size) */
        if (!strcmp(name, "optimizer.safetensors") || !strcmp(name, "trainer_state.json")) continue;
        char url[PATH_MAX + 512], path[PATH_MAX + 256];
        snprintf(url, sizeof url, "%s%s", uri, name);
        snprintf(path, sizeof path, "%s/%s", tmp, name);
        FILE *f = fopen(path, "wb");
        if (!f) {
            rc = al_err(err, errlen, "cannot write %s: %s", path, strerror(errno));
            break;
        }
        rc = get(url, f, NULL, timeout_s, err, errlen);
        if (fclose(f) != 0 && rc == 0) rc = al_err(err, errlen, "cannot write %s", path);
    }
    json_decref(j);
    return rc;
}

int sync_stage_fetch(const char *uri, const char *sha256, const char *root, int64_t version,
                     int keep, double timeout_s, char *dir, size_t dirlen, char *err,
                     size_t errlen)
{
    size_t ul = strlen(uri);
    if (ul == 0 || uri[ul - 1] != '/')
        return al_err(err, errlen, "checkpoint URI %.300s does not name a directory", uri);
    if (snprintf(dir, dirlen, "%s/step-%" PRId64, root, version) >= (int)dirlen)
        return al_err(err, errlen, "--stage-dir path too long");
    struct stat sb;
    char file[PATH_MAX + 128], hex[65];
    snprintf(file, sizeof file, "%s/model.safetensors", dir);
    if (stat(dir, &sb) == 0 && al_sha256_file(file, hex, err, errlen) == 0 && !strcasecmp(hex, sha256))
        return 0; /* staged before (a restarted sync) */
    char tmp[PATH_MAX];
    if (strlen(root) > PATH_MAX - 64) return al_err(err, errlen, "--stage-dir path too long");
    snprintf(tmp, sizeof tmp, "%s/.step-%" PRId64 ".tmp-%ld", root, version, (long)getpid());
    remove_dir(tmp);
    if (mkdir(tmp, 0755) != 0) return al_err(err, errlen, "cannot create %s: %s", tmp, strerror(errno));
    int rc = fetch_files(uri, tmp, timeout_s, err, errlen);
    if (rc == 0) {
        snprintf(file, sizeof file, "%s/model.safetensors", tmp);
        if (al_sha256_file(file, hex, err, errlen) != 0)
            rc = -1;
        else if (strcasecmp(hex, sha256))
            rc = al_err(err, errlen, "%.300smodel.safetensors: sha256 %s, the PolicyVersion says %.64s",
                        uri, hex, sha256);
    }
    if (rc == 0) {
        remove_dir(dir);
        if (rename(tmp, dir) != 0) rc = al_err(err, errlen, "cannot rename %s: %s", tmp, strerror(errno));
    }
    if (rc != 0) {
        remove_dir(tmp);
        return -1;
    }
    prune(root, version, keep);
    return 0;
}
