/*
 * apis.c: the agent APIs the proxy serves by translation (issue 14): POST /v1/responses
 * (OpenAI Responses API) and POST /v1/messages (Anthropic Messages API) on an upstream that
 * speaks chat completions. Owns the glue between a call (call.c, capture.c) and its
 * translator (translate.c, responses.c, messages.c): the request's translation before the
 * capture rewrite, the whole answer's translation, a stream's events chunk by chunk, the
 * answer the span keeps (what the agent got), errors in the agent's API's shape, the models
 * list in Anthropic's shape, and the bounded in-memory store that serves
 * previous_response_id (--response-store-mib; oldest first out).
 */
#include "proxy.h"

#include "core/log.h"
#include "core/map.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ------------------------------------------------------------------------------------------
 * The response store: id -> the conversation a later previous_response_id continues from
 * ------------------------------------------------------------------------------------------ */

typedef struct rs_ent {
    char id[96];
    json_t *conv;
    size_t bytes;
    struct rs_ent *newer, *older;
} rs_ent;

struct px_store {
    al_map tab; /* id -> rs_ent */
    size_t bytes, max_bytes;
    rs_ent *newest, *oldest;
};

px_store *px_store_new(size_t max_bytes)
{
    px_store *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->max_bytes = max_bytes;
    return s;
}

static void rs_unlink(px_store *s, rs_ent *e)
{
    if (e->newer)
        e->newer->older = e->older;
    else
        s->newest = e->older;
    if (e->older)
        e->older->newer = e->newer;
    else
        s->oldest = e->newer;
    e->newer = e->older = NULL;
}

static void rs_drop(px_store *s, rs_ent *e)
{
    al_map_remove(&s->tab, e->id);
    rs_unlink(s, e);
    s->bytes -= e->bytes;
    json_decref(e->conv);
    free(e);
}

/* Keeps conv (takes the reference) under id; the oldest go when past the byte bound. */
static void px_store_put(px_store *s, const char *id, json_t *conv, size_t bytes)
{
    if (!s || !conv || bytes > s->max_bytes || strlen(id) >= sizeof((rs_ent *)0)->id) {
        json_decref(conv);
        return;
    }
    rs_ent *old = al_map_get(&s->tab, id);
    if (old) rs_drop(s, old);
    while (s->oldest && s->bytes + bytes > s->max_bytes)
        rs_drop(s, s->oldest);
    rs_ent *e = calloc(1, sizeof *e);
    if (!e || al_map_put(&s->tab, id, e) != 0) {
        free(e);
        json_decref(conv);
        return;
    }
    snprintf(e->id, sizeof e->id, "%s", id);
    e->conv = conv;
    e->bytes = bytes;
    e->older = s->newest;
    if (s->newest) s->newest->newer = e;
    s->newest = e;
    if (!s->oldest) s->oldest = e;
    s->bytes += bytes;
}

/* al_xl_lookup_fn over the store: a new reference, and the entry becomes the newest. */
static json_t *store_lookup(void *ud, const char *id)
{
    px_store *s = ud;
    rs_ent *e = al_map_get(&s->tab, id);
    if (!e) return NULL;
    rs_unlink(s, e);
    e->older = s->newest;
    if (s->newest) s->newest->newer = e;
    s->newest = e;
    if (!s->oldest) s->oldest = e;
    return json_incref(e->conv);
}

void px_store_free(px_store *s)
{
    if (!s) return;
    while (s->oldest)
        rs_drop(s, s->oldest);
    al_map_free(&s->tab, NULL);
    free(s);
}

/* ------------------------------------------------------------------------------------------
 * A translated call
 * ------------------------------------------------------------------------------------------ */

int px_xl_prepare(call *k, al_slice body, char **up, size_t *up_len, al_xl_err *err)
{
    proxy *px = k->px;
    char seed[25];
    px_rand_hex(px, seed, 24);
    al_xl_env env = {seed, (int64_t)time(NULL), px->store ? store_lookup : NULL, px->store, 0};
    json_t *chat = NULL;
    k->xl = al_xl_request(k->api, body.p, body.n, &env, &chat, err);
    if (!k->xl) return -1;
    *up = px_rewrite_request(k, chat);
    json_decref(chat);
    if (!*up) return -2;
    *up_len = strlen(*up);
    return 0;
}

int px_xl_prepare_count(call *k, al_slice body, char **up, size_t *up_len, al_xl_err *err)
{
    (void)k;
    al_xl_env env = {"count", 0, NULL, NULL, 1};
    json_t *chat = NULL;
    al_xl *x = al_xl_request(AL_API_MESSAGES, body.p, body.n, &env, &chat, err);
    if (!x) return -1;
    al_xl_free(x);
    *up = json_dumps(chat, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(chat);
    if (!*up) return -2;
    *up_len = strlen(*up);
    return 0;
}

int px_xl_count_answer(call *k, char **agent)
{
    json_t *o = json_loadb((const char *)k->body.data, k->body.len, JSON_ALLOW_NUL, NULL);
    json_t *n = json_object_get(o, "count");
    int status = (int)k->status;
    char *b;
    if (status == 200 && json_is_integer(n)) {
        json_t *a = json_pack("{s:I}", "input_tokens", json_integer_value(n));
        b = a ? json_dumps(a, JSON_COMPACT) : NULL;
        json_decref(a);
    } else {
        const char *m = json_string_value(json_object_get(json_object_get(o, "error"), "message"));
        if (!m) m = json_string_value(json_object_get(o, "message"));
        if (status == 200) status = 502;
        if (status == 404) /* an upstream without /tokenize */
            m = "the upstream counts no tokens (it has no POST /tokenize, as vLLM and arclight "
                "serve do)";
        b = al_xl_error_body(AL_API_MESSAGES, status, NULL, NULL, m ? m : "the upstream failed");
    }
    json_decref(o);
    *agent = b;
    return status;
}

/* What the span keeps as the answer: the agent's answer object. */
static void keep_answer(call *k, json_t *ans)
{
    free(k->agent_answer);
    k->agent_answer = ans ? json_dumps(ans, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
}

static void store_answer(call *k)
{
    proxy *px = k->px;
    if (!px->store || !al_xl_store(k->xl)) return;
    json_t *conv = al_xl_conversation(k->xl);
    size_t bytes = k->up_len + (k->agent_answer ? strlen(k->agent_answer) : 0) + 256;
    px_store_put(px->store, al_xl_id(k->xl), conv, bytes);
}

int px_xl_answer(call *k, const char **agent)
{
    int status = (int)k->status;
    if (k->status >= 200 && k->status < 300) {
        json_t *o = json_loadb((const char *)k->body.data, k->body.len, JSON_ALLOW_NUL, NULL);
        al_xl_err err;
        json_t *ans = o ? al_xl_answer(k->xl, o, &err) : NULL;
        json_decref(o);
        if (!o)
            snprintf(err.message, sizeof err.message,
                     "the upstream answered with a body that is not JSON");
        if (!ans) {
            k->error = strdup(err.message);
            status = 502;
            char *b = al_xl_error_body(k->api, status, "upstream_error", "bad_upstream_answer",
                                       err.message);
            free(k->agent_answer);
            k->agent_answer = b;
            *agent = b ? b : "";
            return status;
        }
        keep_answer(k, ans);
        json_decref(ans);
        store_answer(k);
        *agent = k->agent_answer ? k->agent_answer : "{}";
        return status;
    }
    /* an error of the upstream's, in the agent's API's terms (its message kept) */
    json_t *o = json_loadb((const char *)k->body.data, k->body.len, JSON_ALLOW_NUL, NULL);
    json_t *e = json_object_get(o, "error");
    const char *m = json_string_value(json_object_get(e, "message"));
    if (!m) m = json_string_value(json_object_get(o, "message"));
    if (!m) m = k->error ? k->error : "the upstream failed";
    const char *type = json_string_value(json_object_get(e, "type"));
    char *b = al_xl_error_body(k->api, status, type, NULL, m);
    json_decref(o);
    free(k->agent_answer);
    k->agent_answer = b;
    *agent = b ? b : "";
    return status;
}

static void stream_out(call *k)
{
    if (k->c && k->xout.len) k->emit(k, k->xout.data, k->xout.len);
    al_buf_reset(&k->xout);
}

void px_xl_chunk(call *k, json_t *chunk)
{
    if (al_xl_chunk(k->xl, chunk, &k->xout) != 0 && !k->error)
        k->error = strdup("out of memory translating the stream");
    stream_out(k);
}

void px_xl_stream_end(call *k, const char *error)
{
    int ended = al_xl_final(k->xl) != NULL;
    if (!ended && al_xl_end(k->xl, error, &k->xout) != 0 && !k->error)
        k->error = strdup("out of memory translating the stream");
    stream_out(k);
    if (ended) return;
    keep_answer(k, al_xl_final(k->xl));
    if (!error) store_answer(k);
}

/* ------------------------------------------------------------------------------------------
 * Models in Anthropic's shape
 * ------------------------------------------------------------------------------------------ */

char *px_models_anthropic(const char *body, size_t n)
{
    json_t *o = json_loadb(body, n, 0, NULL), *m;
    json_t *data = json_object_get(o, "data");
    if (!json_is_array(data)) {
        json_decref(o);
        return NULL;
    }
    json_t *out = json_array();
    size_t i;
    json_array_foreach(data, i, m)
    {
        const char *id = json_string_value(json_object_get(m, "id"));
        if (!id) continue;
        json_t *cr = json_object_get(m, "created");
        time_t t = json_is_integer(cr) ? (time_t)json_integer_value(cr) : 0;
        struct tm tm;
        char when[40] = "1970-01-01T00:00:00Z";
        if (gmtime_r(&t, &tm)) strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tm);
        json_array_append_new(out, json_pack("{s:s,s:s,s:s,s:s}", "type", "model", "id", id,
                                             "display_name", id, "created_at", when));
    }
    size_t nm = json_array_size(out);
    json_t *first = nm ? json_object_get(json_array_get(out, 0), "id") : NULL;
    json_t *last = nm ? json_object_get(json_array_get(out, nm - 1), "id") : NULL;
    json_t *r = json_pack("{s:o,s:b,s:O,s:O}", "data", out, "has_more", 0, "first_id",
                          first ? first : json_null(), "last_id", last ? last : json_null());
    char *s = r ? json_dumps(r, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    json_decref(r);
    json_decref(o);
    return s;
}
