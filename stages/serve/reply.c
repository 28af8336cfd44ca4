/*
 * reply.c: how serve answers a request: JSON helpers (bytes as a JSON string whatever they
 * hold, token ids), the policy-version header, whole JSON replies, OpenAI-style error bodies
 * (also those the HTTP layer answers itself) and the per-status request counters.
 */
#include "serve.h"

#include "core/util.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A JSON string of arbitrary bytes: malformed UTF-8 becomes U+FFFD (as vLLM's detokenizer
 * shows a partial character). */
json_t *serve_json_bytes(const char *s, size_t n)
{
    json_t *j = json_stringn(s, n); /* NULL when not valid UTF-8 */
    if (j) return j;
    char *o = malloc(n * 3 + 1);
    if (!o) return json_string("");
    size_t k = 0;
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)s[i];
        size_t L = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        int ok = L && i + L <= n;
        for (size_t q = 1; ok && q < L; q++)
            ok = ((unsigned char)s[i + q] >> 6) == 2;
        if (ok && L > 1) {
            char tmp[5] = {0};
            memcpy(tmp, s + i, L);
            json_t *t = json_string(tmp); /* rejects overlongs and surrogates */
            ok = t != NULL;
            json_decref(t);
        }
        if (ok) {
            memcpy(o + k, s + i, L);
            k += L, i += L;
        } else {
            memcpy(o + k, "\xEF\xBF\xBD", 3);
            k += 3, i += 1;
        }
    }
    json_t *r = json_stringn(o, k);
    free(o);
    return r ? r : json_string("");
}

json_t *serve_json_ids(const int32_t *ids, int n)
{
    json_t *a = json_array();
    for (int i = 0; i < n; i++)
        json_array_append_new(a, json_integer(ids[i]));
    return a;
}

void serve_reply_version_header(al_httpd_req *req, int64_t version)
{
    if (version >= 0) {
        char v[32];
        snprintf(v, sizeof v, "%" PRId64, version);
        al_httpd_add_header(req, "x-arclight-policy-version", v);
    }
}

void serve_reply_count(serve_ctx *sc, int code)
{
    if (code < 300)
        al_counter_inc(sc->req_ok);
    else if (code == 429)
        al_counter_inc(sc->req_429);
    else if (code < 500)
        al_counter_inc(sc->req_4xx);
    else
        al_counter_inc(sc->req_5xx);
}

void serve_reply_json(serve_ctx *sc, al_httpd_req *req, int code, json_t *body, int64_t version)
{
    char *s = body ? json_dumps(body, JSON_COMPACT) : NULL;
    json_decref(body);
    serve_reply_version_header(req, version);
    al_httpd_send(req, code, "application/json", s ? s : "{}", s ? strlen(s) : 2);
    free(s);
    serve_reply_count(sc, code);
}

/* OpenAI-style error body, as vLLM sends it. The message may quote the request: cut at a
 * character boundary when it is long, and bytes that are not UTF-8 become U+FFFD, so that the
 * body is always the JSON it says it is. */
void serve_reply_error(serve_ctx *sc, al_httpd_req *req, int code, const char *param,
                       const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    size_t len = n < 0 ? 0 : (size_t)n < sizeof msg ? (size_t)n : sizeof msg - 1;
    if ((size_t)n >= sizeof msg) len = al_utf8_cut(msg, (size_t)n, len);
    const char *type = code == 404   ? "NotFoundError"
                       : code == 429 ? "RateLimitError"
                       : code >= 500 ? "InternalServerError"
                                     : "BadRequestError";
    json_t *e = json_pack("{s:{s:o,s:s,s:o,s:i}}", "error", "message", serve_json_bytes(msg, len),
                          "type", type, "param", param ? json_string(param) : json_null(), "code",
                          code);
    if (code == 429) al_httpd_add_header(req, "Retry-After", "1");
    serve_reply_json(sc, req, code, e, -1);
}

/* Errors the HTTP layer answers itself (malformed or oversized requests), in the same shape. */
size_t serve_reply_http_error_body(int status, const char *message, char *out, size_t cap)
{
    json_t *e = json_pack("{s:{s:s,s:s,s:n,s:i}}", "error", "message", message, "type",
                          status >= 500 ? "InternalServerError" : "BadRequestError", "param",
                          "code", status);
    char *t = e ? json_dumps(e, JSON_COMPACT) : NULL;
    json_decref(e);
    size_t n = t ? strlen(t) : 0;
    if (n >= cap) n = 0;
    memcpy(out, t ? t : "", n);
    out[n] = '\0';
    free(t);
    return n;
}

