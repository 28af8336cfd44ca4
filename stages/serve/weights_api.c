/*
 * weights_api.c: `arclight serve --weight-routes`: SGLang's and vLLM's HTTP routes for new
 * weights, so that `arclight sync` (and any RL framework written for those servers) drives
 * arclight serve exactly as it drives them, and so that arclight serve is sync's test server.
 *
 * SGLang (python/sglang/srt/entrypoints/http_server.py, managers/io_struct.py):
 *   POST /update_weights_from_disk {"model_path" (required), "load_format", "weight_version",
 *        "flush_cache", "abort_all_requests", "keep_pause", ...}
 *        -> 200 {"success": true, "message", "num_paused_requests": 0}
 *        -> 400 {"success": false, "message", "num_paused_requests": 0} (the old weights stay)
 *   POST /pause_generation, /continue_generation -> {"message", "status": "ok"}
 *   GET  /get_weight_version, /weight_version -> {"weight_version"}; GET /model_info
 *   POST /update_weight_version {"new_version"} -> {"success", "message", "new_version"}
 *   a body that does not parse as the request: 400 {"object": "error", "message",
 *        "type": "Bad Request", "param": null, "code": 400}
 * vLLM's dev-mode routes (vllm/entrypoints/serve/dev/rlhf/api_router.py, dev/rpc/api_router.py;
 * the "disk" weight-transfer backend, vllm/distributed/weight_transfer/disk_engine.py):
 *   POST /pause?mode=abort|wait|keep -> {"status": "paused"}; POST /resume -> {"status":
 *        "resumed"}; GET /is_paused -> {"is_paused"}
 *   POST /init_weight_transfer_engine {"init_info": {...}} -> {"message"}
 *   POST /start_weight_update -> {"message"}; POST /update_weights {"update_info": {"path":
 *        ABSOLUTE_DIR}} -> {"message"}; POST /finish_weight_update {"weight_version"} ->
 *        {"message"}; GET /weight_info -> {"weight_version"}
 *   POST /update_weight_version {"new_version"}
 *   POST /collective_rpc {"method": "reload_weights", "kwargs": {"weights_path": DIR}}
 *        -> {"results": [null]}
 *   errors: {"error": {"message", "type": "Bad Request", "param": null, "code": 400}}
 *
 * Loading is all-or-nothing: the new weights are read, checked against the served shape and
 * for finite values into a model of their own, and only then handed to the engine (sequences
 * already running keep the weights they started on, see engine.h); any failure leaves the old
 * weights serving. A vLLM update is staged by /update_weights and swapped in by
 * /finish_weight_update. A load runs on the event loop's thread (requests already generating go
 * on, on the engine's thread); a model is read in the time its file takes to read.
 *
 * The weight version is a string (both servers' contract); when it is a decimal integer it is
 * also the policy version the engine reports (x-arclight-policy-version, /health), else that
 * number goes up by one. While paused, new generation requests get 503 with Retry-After: 1.
 * Paths are read only under --checkpoint-root when one is given; with --api-key these routes
 * need the key too.
 */
#include "serve.h"

#include "core/log.h"
#include "core/util.h"
#include "policy.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

struct serve_wapi {
    const char *const *roots; /* borrowed (the command's) */
    size_t nroots;
    int paused;
    char version[128];     /* the weight version label */
    char model_path[PATH_MAX];
    int session;           /* vLLM: between /start_weight_update and /finish_weight_update */
    al_model *staged;      /* vLLM: what /update_weights loaded, for /finish_weight_update */
    char staged_path[PATH_MAX];
};

serve_wapi *serve_wapi_new(const char *const *roots, size_t nroots, int64_t version,
                           const char *model_dir)
{
    serve_wapi *w = calloc(1, sizeof *w);
    if (!w) return NULL;
    w->roots = roots, w->nroots = nroots;
    snprintf(w->version, sizeof w->version, "%" PRId64, version);
    snprintf(w->model_path, sizeof w->model_path, "%s", model_dir);
    return w;
}

void serve_wapi_free(serve_wapi *w)
{
    if (!w) return;
    al_model_free(w->staged);
    free(w);
}

int serve_wapi_paused(const serve_wapi *w) { return w && w->paused; }

/* ---- loading -------------------------------------------------------------------------- */

/* Reads the weights at `path` (an absolute directory holding model.safetensors, or such a
 * file) into a new model of the served shape on the engine's backend. NULL with the reason in
 * err: a relative path, a path outside --checkpoint-root, a missing or unreadable file, a
 * shape, name or dtype the served model does not have, a non-finite weight. */
static al_model *wapi_load(serve_ctx *sc, const char *path, char *err, size_t errlen)
{
    serve_wapi *w = sc->wapi;
    char real[PATH_MAX], file[PATH_MAX + 32];
    struct stat sb;
    if (path[0] != '/') {
        al_err(err, errlen, "model_path must be an absolute path, got '%s'", path);
        return NULL;
    }
    if (!realpath(path, real) || stat(real, &sb) != 0) {
        al_err(err, errlen, "cannot read %s: %s", path, strerror(errno));
        return NULL;
    }
    if (S_ISDIR(sb.st_mode)) {
        snprintf(file, sizeof file, "%s/model.safetensors", real);
        if (stat(file, &sb) != 0) {
            al_err(err, errlen, "%s holds no model.safetensors (sharded checkpoints are not read)",
                   path);
            return NULL;
        }
    } else {
        snprintf(file, sizeof file, "%s", real);
    }
    if (w->nroots && !al_serve_path_under(file, w->roots, w->nroots)) {
        al_err(err, errlen, "%s is not under a --checkpoint-root", path);
        return NULL;
    }
    /* no larger than the served shape's weights as F32 (plus an lm_head a tied model's file
     * may carry, headers and headroom), as the follower bounds a download (policy.h) */
    size_t max = al_model_config_num_params(&sc->cfg) * 4 +
                 (size_t)sc->cfg.vocab_size * (size_t)sc->cfg.hidden_size * 4;
    max += max / 16 + (2u << 20);
    if (stat(file, &sb) != 0 || !S_ISREG(sb.st_mode) || (size_t)sb.st_size > max) {
        al_err(err, errlen, "%s is not a regular file of at most %zu bytes (the served model's "
                            "weights as F32)", file, max);
        return NULL;
    }
    size_t len = 0;
    char *bytes = al_file_read(file, &len, err, errlen);
    if (!bytes) return NULL;
    al_model *m = al_serve_model_from_bytes(&sc->cfg, (uint8_t *)bytes, len, file, err, errlen);
    if (m && al_model_set_backend(m, al_serve_engine_backend(sc->eng), err, errlen) != 0) {
        al_model_free(m);
        m = NULL;
    }
    return m;
}

/* The policy version a weight version label stands for: the number itself when the label is
 * a decimal integer, else one past the version served now. */
static int64_t wapi_version_number(serve_ctx *sc, const char *label)
{
    char *end;
    errno = 0;
    long long v = label && *label ? strtoll(label, &end, 10) : -1;
    if (label && *label && !errno && *end == '\0' && v >= 0) return (int64_t)v;
    return al_serve_engine_version(sc->eng) + 1;
}

/* Hands m (owned) to the engine under the label (NULL: one past the current version). 0, or
 * -1 when out of memory (the old weights stay). */
static int wapi_swap(serve_ctx *sc, al_model *m, const char *label, const char *path)
{
    serve_wapi *w = sc->wapi;
    char next[128];
    if (label)
        snprintf(next, sizeof next, "%s", label);
    else
        snprintf(next, sizeof next, "%" PRId64, al_serve_engine_version(sc->eng) + 1);
    int64_t v = wapi_version_number(sc, next);
    al_serve_weights *ws = al_serve_weights_new(m, v);
    if (!ws) return -1;
    al_serve_engine_set_weights(sc->eng, ws);
    snprintf(w->version, sizeof w->version, "%s", next);
    snprintf(w->model_path, sizeof w->model_path, "%s", path);
    al_log_info(COMP, "now serving weight version %s (policy version %" PRId64 ") from %s", next,
                v, path);
    return 0;
}

/* ---- answers -------------------------------------------------------------------------- */

/* SGLang's answer to a body it cannot take (its RequestValidationError handler). */
static void sglang_bad_request(serve_ctx *sc, al_httpd_req *req, const char *msg)
{
    serve_reply_json(sc, req, 400,
                     json_pack("{s:s,s:s,s:s,s:n,s:i}", "object", "error", "message", msg, "type",
                               "Bad Request", "param", "code", 400),
                     -1);
}

/* vLLM's answer for an HTTPException (status, detail): "type" is the status phrase. */
static void vllm_error(serve_ctx *sc, al_httpd_req *req, int code, const char *msg)
{
    serve_reply_json(sc, req, code,
                     json_pack("{s:{s:s,s:s,s:n,s:i}}", "error", "message", msg, "type",
                               code == 400 ? "Bad Request" : "Internal Server Error", "param",
                               "code", code),
                     -1);
}

static void reply_message(serve_ctx *sc, al_httpd_req *req, const char *msg)
{
    serve_reply_json(sc, req, 200, json_pack("{s:s}", "message", msg), -1);
}

/* The body as a JSON object; an empty body is {} when empty_ok. NULL when it is not one. */
static json_t *wapi_body(al_httpd_req *req, int empty_ok)
{
    size_t len = 0;
    const char *body = al_httpd_req_body(req, &len);
    if (len == 0) return empty_ok ? json_object() : NULL;
    json_t *j = json_loadb(body, len, 0, NULL);
    if (j && !json_is_object(j)) {
        json_decref(j);
        return NULL;
    }
    return j;
}

/* A member that must be a string or null/absent when present: 0, or -1 (wrong type). */
static int opt_string(json_t *j, const char *key, const char **out)
{
    json_t *v = json_object_get(j, key);
    *out = NULL;
    if (!v || json_is_null(v)) return 0;
    if (!json_is_string(v)) return -1;
    *out = json_string_value(v);
    return 0;
}

/* ---- SGLang --------------------------------------------------------------------------- */

static void sglang_update_from_disk(serve_ctx *sc, al_httpd_req *req)
{
    json_t *j = wapi_body(req, 0);
    const char *path = NULL, *fmt = NULL, *label = NULL;
    char msg[1200];
    if (!j) {
        sglang_bad_request(sc, req, "the body must be a JSON object");
        return;
    }
    static const char *const bools[] = {"abort_all_requests", "is_async", "torch_empty_cache",
                                        "keep_pause", "recapture_cuda_graph", "flush_cache"};
    for (size_t i = 0; i < sizeof bools / sizeof bools[0]; i++) {
        json_t *b = json_object_get(j, bools[i]);
        if (b && !json_is_boolean(b)) {
            snprintf(msg, sizeof msg, "%s must be a boolean", bools[i]);
            sglang_bad_request(sc, req, msg);
            json_decref(j);
            return;
        }
    }
    json_t *ts = json_object_get(j, "token_step");
    if (!json_is_string(json_object_get(j, "model_path")) ||
        opt_string(j, "load_format", &fmt) != 0 || opt_string(j, "weight_version", &label) != 0 ||
        (ts && !json_is_integer(ts))) {
        sglang_bad_request(sc, req,
                           "model_path (a string) is required; load_format and weight_version "
                           "are strings or null, token_step an integer");
        json_decref(j);
        return;
    }
    path = json_string_value(json_object_get(j, "model_path"));
    int ok = 0;
    if (fmt && strcmp(fmt, "auto") != 0 && strcmp(fmt, "safetensors") != 0) {
        snprintf(msg, sizeof msg, "Failed to update weights: load_format '%s' is not supported "
                                  "(auto or safetensors)", fmt);
    } else {
        char err[1024];
        al_model *m = wapi_load(sc, path, err, sizeof err);
        if (!m) {
            snprintf(msg, sizeof msg, "Failed to update weights: %s. Rolling back to the weights "
                                      "served before.", err);
        } else if (wapi_swap(sc, m, label, path) != 0) {
            snprintf(msg, sizeof msg, "Failed to update weights: out of memory");
        } else {
            ok = 1;
            snprintf(msg, sizeof msg, "Succeeded to update model weights.");
            if (label)
                snprintf(msg + strlen(msg), sizeof msg - strlen(msg),
                         " Weight version updated to %s.", label);
            json_t *kp = json_object_get(j, "keep_pause");
            if (!json_is_true(kp)) sc->wapi->paused = 0;
        }
    }
    if (!ok) al_log_warn(COMP, "update_weights_from_disk: %s", msg);
    serve_reply_json(sc, req, ok ? 200 : 400,
                     json_pack("{s:b,s:s,s:i}", "success", ok, "message", msg,
                               "num_paused_requests", 0),
                     -1);
    json_decref(j);
}

static void update_weight_version(serve_ctx *sc, al_httpd_req *req, int vllm)
{
    json_t *j = wapi_body(req, 0);
    json_t *nv = j ? json_object_get(j, "new_version") : NULL;
    if (!json_is_string(nv)) {
        if (vllm)
            vllm_error(sc, req, 400, "new_version (a string) is required");
        else
            sglang_bad_request(sc, req, "new_version (a string) is required");
        json_decref(j);
        return;
    }
    snprintf(sc->wapi->version, sizeof sc->wapi->version, "%s", json_string_value(nv));
    char msg[200];
    snprintf(msg, sizeof msg, "Weight version updated to %s", sc->wapi->version);
    if (vllm)
        serve_reply_json(sc, req, 200, json_pack("{s:b,s:s}", "success", 1, "new_version",
                                                 sc->wapi->version), -1);
    else
        serve_reply_json(sc, req, 200, json_pack("{s:b,s:s,s:s}", "success", 1, "message", msg,
                                                 "new_version", sc->wapi->version), -1);
    json_decref(j);
}

/* ---- vLLM ----------------------------------------------------------------------------- */

static void vllm_pause(serve_ctx *sc, al_httpd_req *req)
{
    const al_slice *q = &al_httpd_req_head(req)->query;
    /* mode=abort|wait|keep: arclight finishes running sequences on the weights they began with
     * in every mode; new ones wait (503, Retry-After) until /resume */
    for (size_t i = 0; i < q->n;) {
        size_t n = 0;
        while (i + n < q->n && q->p[i + n] != '&') n++;
        const char *kv = q->p + i;
        if (n >= 5 && !memcmp(kv, "mode=", 5) &&
            !((n == 10 && !memcmp(kv + 5, "abort", 5)) || (n == 9 && !memcmp(kv + 5, "wait", 4)) ||
              (n == 9 && !memcmp(kv + 5, "keep", 4)))) {
            vllm_error(sc, req, 400, "mode must be one of abort, wait, keep");
            return;
        }
        i += n + 1;
    }
    sc->wapi->paused = 1;
    serve_reply_json(sc, req, 200, json_pack("{s:s}", "status", "paused"), -1);
}

static void vllm_update_weights(serve_ctx *sc, al_httpd_req *req)
{
    json_t *j = wapi_body(req, 0);
    json_t *ui = j ? json_object_get(j, "update_info") : NULL;
    if (!j) {
        vllm_error(sc, req, 400, "Invalid JSON format");
        return;
    }
    if (!ui || json_is_null(ui)) {
        vllm_error(sc, req, 400, "Missing 'update_info' in request body");
        json_decref(j);
        return;
    }
    json_t *p = json_object_get(ui, "path");
    char err[1100];
    if (!sc->wapi->session) {
        vllm_error(sc, req, 400, "start_weight_update must be called before loading a checkpoint");
    } else if (sc->wapi->staged) {
        vllm_error(sc, req, 400, "The disk backend accepts exactly one checkpoint per update session");
    } else if (!json_is_string(p) || json_string_length(p) == 0) {
        vllm_error(sc, req, 400, "`path` must be a non-empty absolute local directory");
    } else if (!(sc->wapi->staged = wapi_load(sc, json_string_value(p), err, sizeof err))) {
        sc->wapi->session = 0; /* a failed load ends the session, as vLLM's disk backend does */
        vllm_error(sc, req, 400, err);
    } else {
        snprintf(sc->wapi->staged_path, sizeof sc->wapi->staged_path, "%s", json_string_value(p));
        reply_message(sc, req, "Weights updated");
    }
    json_decref(j);
}

static void vllm_finish(serve_ctx *sc, al_httpd_req *req)
{
    serve_wapi *w = sc->wapi;
    json_t *j = wapi_body(req, 1);
    const char *label = NULL;
    if (!j || opt_string(j, "weight_version", &label) != 0) {
        vllm_error(sc, req, 400, "weight_version must be a string or null");
        json_decref(j);
        return;
    }
    if (!w->session) {
        vllm_error(sc, req, 400, "No weight update is active");
    } else if (!w->staged) {
        w->session = 0;
        vllm_error(sc, req, 400, "No checkpoint was loaded during the weight update session");
    } else {
        al_model *m = w->staged;
        w->staged = NULL, w->session = 0;
        if (wapi_swap(sc, m, label, w->staged_path) != 0)
            vllm_error(sc, req, 500, "out of memory");
        else
            reply_message(sc, req, "Weight update finished");
    }
    json_decref(j);
}

/* POST /collective_rpc: only reload_weights (kwargs.weights_path, or none: the path loaded
 * last) is a method arclight has. */
static void vllm_collective_rpc(serve_ctx *sc, al_httpd_req *req)
{
    json_t *j = wapi_body(req, 0);
    if (!j) {
        vllm_error(sc, req, 400, "JSON decode error: the body must be a JSON object");
        return;
    }
    json_t *method = json_object_get(j, "method");
    if (!method || json_is_null(method)) {
        vllm_error(sc, req, 400, "Missing 'method' in request body");
    } else if (!json_is_string(method) || strcmp(json_string_value(method), "reload_weights")) {
        vllm_error(sc, req, 400, "only the method reload_weights is available on arclight serve");
    } else {
        json_t *kw = json_object_get(j, "kwargs");
        json_t *wp = json_is_object(kw) ? json_object_get(kw, "weights_path") : NULL;
        const char *path = json_is_string(wp) ? json_string_value(wp) : sc->wapi->model_path;
        char err[1100], pathcopy[PATH_MAX];
        snprintf(pathcopy, sizeof pathcopy, "%s", path);
        al_model *m = (kw && !json_is_object(kw)) || (wp && !json_is_string(wp))
                          ? (al_err(err, sizeof err, "kwargs.weights_path must be a string"), NULL)
                          : wapi_load(sc, pathcopy, err, sizeof err);
        if (!m)
            vllm_error(sc, req, 400, err);
        else if (wapi_swap(sc, m, NULL, pathcopy) != 0)
            vllm_error(sc, req, 500, "out of memory");
        else
            serve_reply_json(sc, req, 200, json_pack("{s:[n]}", "results"), -1);
    }
    json_decref(j);
}

/* ---- the routes ----------------------------------------------------------------------- */

typedef struct wapi_route {
    const char *path;
    int post; /* 1: POST; 0: GET */
    void (*fn)(serve_ctx *sc, al_httpd_req *req);
} wapi_route;

static void sg_pause(serve_ctx *sc, al_httpd_req *req)
{
    sc->wapi->paused = 1;
    serve_reply_json(sc, req, 200, json_pack("{s:s,s:s}", "message",
                                             "Generation paused successfully.", "status", "ok"), -1);
}

static void sg_continue(serve_ctx *sc, al_httpd_req *req)
{
    sc->wapi->paused = 0;
    serve_reply_json(sc, req, 200, json_pack("{s:s,s:s}", "message",
                                             "Generation continued successfully.", "status", "ok"), -1);
}

static void get_version(serve_ctx *sc, al_httpd_req *req)
{
    serve_reply_json(sc, req, 200, json_pack("{s:s}", "weight_version", sc->wapi->version), -1);
}

static void sg_model_info(serve_ctx *sc, al_httpd_req *req)
{
    serve_reply_json(sc, req, 200,
                     json_pack("{s:s,s:s,s:b,s:s,s:s}", "model_path", sc->wapi->model_path,
                               "tokenizer_path", sc->wapi->model_path, "is_generation", 1,
                               "weight_version", sc->wapi->version, "model_type",
                               sc->cfg.model_type), -1);
}

/* SGLang's and vLLM's /update_weight_version take the same body; SGLang's answer (with
 * "message") is a superset of vLLM's. */
static void sg_update_version(serve_ctx *sc, al_httpd_req *req) { update_weight_version(sc, req, 0); }

static void vl_resume(serve_ctx *sc, al_httpd_req *req)
{
    sc->wapi->paused = 0;
    serve_reply_json(sc, req, 200, json_pack("{s:s}", "status", "resumed"), -1);
}

static void vl_is_paused(serve_ctx *sc, al_httpd_req *req)
{
    serve_reply_json(sc, req, 200, json_pack("{s:b}", "is_paused", sc->wapi->paused), -1);
}

static void vl_init(serve_ctx *sc, al_httpd_req *req)
{
    json_t *j = wapi_body(req, 0);
    if (!j)
        vllm_error(sc, req, 400, "Invalid JSON format");
    else if (!json_object_get(j, "init_info") || json_is_null(json_object_get(j, "init_info")))
        vllm_error(sc, req, 400, "Missing 'init_info' in request body");
    else
        reply_message(sc, req, "Weight transfer initialized");
    json_decref(j);
}

static void vl_start(serve_ctx *sc, al_httpd_req *req)
{
    json_t *j = wapi_body(req, 1);
    if (!j) {
        vllm_error(sc, req, 400, "Invalid JSON format");
        return;
    }
    json_decref(j);
    if (sc->wapi->session) {
        vllm_error(sc, req, 400, "A weight update is already active");
        return;
    }
    sc->wapi->session = 1;
    reply_message(sc, req, "Weight update started");
}

static const wapi_route wapi_routes[] = {
    {"/update_weights_from_disk", 1, sglang_update_from_disk},
    {"/pause_generation", 1, sg_pause},
    {"/continue_generation", 1, sg_continue},
    {"/get_weight_version", 0, get_version},
    {"/weight_version", 0, get_version},
    {"/model_info", 0, sg_model_info},
    {"/update_weight_version", 1, sg_update_version},
    {"/pause", 1, vllm_pause},
    {"/resume", 1, vl_resume},
    {"/is_paused", 0, vl_is_paused},
    {"/init_weight_transfer_engine", 1, vl_init},
    {"/start_weight_update", 1, vl_start},
    {"/update_weights", 1, vllm_update_weights},
    {"/finish_weight_update", 1, vllm_finish},
    {"/weight_info", 0, get_version},
    {"/collective_rpc", 1, vllm_collective_rpc},
};

int serve_wapi_route(serve_ctx *sc, al_httpd_req *req, const char *path)
{
    if (!sc->wapi) return 0;
    for (size_t i = 0; i < sizeof wapi_routes / sizeof wapi_routes[0]; i++) {
        const wapi_route *r = &wapi_routes[i];
        if (strcmp(path, r->path) != 0) continue;
        if (sc->api_key) {
            const al_slice *a = al_http_header_get(al_httpd_req_head(req), "authorization");
            if (!a || a->n < 7 || strncasecmp(a->p, "Bearer ", 7) != 0 ||
                !al_secret_eq(a->p + 7, a->n - 7, sc->api_key)) {
                al_httpd_add_header(req, "WWW-Authenticate", "Bearer");
                serve_reply_error(sc, req, 401, NULL, "a valid API key is required");
                return 1;
            }
        }
        int ok = r->post ? al_httpd_req_method_is(req, "POST")
                         : al_httpd_req_method_is(req, "GET") || al_httpd_req_method_is(req, "HEAD");
        if (!ok) {
            serve_reply_error(sc, req, 405, NULL, "use %s for %s", r->post ? "POST" : "GET", path);
            return 1;
        }
        r->fn(sc, req);
        return 1;
    }
    return 0;
}
