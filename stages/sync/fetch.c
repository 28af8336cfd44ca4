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
 *
 * The download is bounded: the listing and config.json are sizes nobody vouches for, and a
 * server that sends without end must not fill the volume. The bound is --stage-max-bytes for
 * the whole version, or by default what the model config.json describes takes as f32 weights
 * (plus a sixteenth and 1 MiB for the safetensors header) and 256 MiB for the other files
 * (tokenizers run to tens of MiB); a version past it is refused, the partial copy removed.
 */
#include "sync.h"

#include "core/buf.h"
#include "core/sha256.h"
#include "core/util.h"
#include "model/config.h"

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

/* A file being fetched: at most *left more bytes of the version may come. */
typedef struct fetch_sink {
    FILE *f;
    uint64_t *left;
    int over; /* the bound was reached */
} fetch_sink;

static size_t to_file(char *d, size_t sz, size_t n, void *ud)
{
    fetch_sink *k = ud;
    if ((uint64_t)(sz * n) > *k->left) {
        k->over = 1;
        return 0;
    }
    *k->left -= sz * n;
    return fwrite(d, sz, n, k->f) == n ? sz * n : 0;
}

/* GET url into the sink k (when k) or the buffer b (1 MiB at most). 0, or -1 with err. */
static int get(const char *url, fetch_sink *k, al_buf *b, double timeout_s, char *err,
               size_t errlen)
{
    CURL *c = curl_easy_init();
    if (!c) return al_err(err, errlen, "out of memory");
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, (long)(timeout_s * 1000));
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, 10000L);
    curl_easy_setopt(c, CURLOPT_FAILONERROR, 1L);
    if (k) {
        curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, to_file);
        curl_easy_setopt(c, CURLOPT_WRITEDATA, k);
        /* a Content-Length past the bound is refused before any byte */
        curl_easy_setopt(c, CURLOPT_MAXFILESIZE_LARGE, (curl_off_t)*k->left);
    } else {
        curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, to_buf);
        curl_easy_setopt(c, CURLOPT_WRITEDATA, b);
    }
    CURLcode rc = curl_easy_perform(c);
    curl_easy_cleanup(c);
    if (k && (k->over || rc == CURLE_FILESIZE_EXCEEDED)) {
        k->over = 1;
        return al_err(err, errlen, "GET %.300s: the version is larger than the download bound",
                      url);
    }
    if (rc != CURLE_OK) return al_err(err, errlen, "GET %.300s: %s", url, curl_easy_strerror(rc));
    return 0;
}

/* The default bound of a version's download (see the top of this file) from its config.json at
 * uri. 0, or -1 with err (no config.json, or one that describes no model arclight knows). */
static int default_bound(const char *uri, double timeout_s, uint64_t *bound, char *err,
                         size_t errlen)
{
    char url[PATH_MAX + 512], e2[512];
    snprintf(url, sizeof url, "%sconfig.json", uri);
    al_buf b = {0};
    al_model_config cfg;
    int rc = get(url, NULL, &b, timeout_s, e2, sizeof e2);
    if (rc == 0 && al_model_config_parse(&cfg, b.data ? b.data : "", b.len, e2, sizeof e2) != 0)
        rc = -1;
    al_buf_free(&b);
    if (rc != 0)
        return al_err(err, errlen,
                      "cannot bound the download of %.300s (%s); give --stage-max-bytes", uri, e2);
    uint64_t w = (uint64_t)al_model_config_num_params(&cfg) * 4 + (1u << 20);
    *bound = w + w / 16 + (256u << 20);
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

/* Fetches every listed file of uri into tmp, max_bytes in all. 0 or -1 with err. */
static int fetch_files(const char *uri, const char *tmp, uint64_t max_bytes, double timeout_s,
                       char *err, size_t errlen)
{
    uint64_t left = max_bytes;
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
        fetch_sink k = {f, &left, 0};
        rc = get(url, &k, NULL, timeout_s, err, errlen);
        if (fclose(f) != 0 && rc == 0) rc = al_err(err, errlen, "cannot write %s", path);
        if (k.over)
            al_err(err, errlen,
                   "%.300s: larger than the %" PRIu64 " bytes a version may take "
                   "(--stage-max-bytes, by default its config.json's weights as f32 plus 256 "
                   "MiB); refused at %.200s",
                   uri, max_bytes, name);
    }
    json_decref(j);
    return rc;
}

int sync_stage_fetch(const char *uri, const char *sha256, const char *root, int64_t version,
                     int keep, uint64_t max_bytes, double timeout_s, char *dir, size_t dirlen,
                     char *err, size_t errlen)
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
    int rc = max_bytes ? 0 : default_bound(uri, timeout_s, &max_bytes, err, errlen);
    if (rc == 0) rc = fetch_files(uri, tmp, max_bytes, timeout_s, err, errlen);
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
