/*
 * routes.c: what each request is. Owns the routes (every path also under
 * /r/{task}/{rollout}, and under /e/{task}/{rollout} or /e:T/{task}/{rollout} for a held-out
 * evaluation: eval spans, sampled at temperature 0 or T):
 *   POST /v1/chat/completions, POST /v1/completions   forwarded and captured (call.c)
 *   POST /v1/responses, POST /v1/messages             translated to chat completions and
 *                                                     captured (apis.c)
 *   POST /v1/messages/count_tokens                    the upstream's /tokenize (not a span)
 *   GET  /v1/models                                   forwarded (Anthropic's shape for a
 *                                                     request with anthropic-version)
 *   GET/HEAD / (and /v1, and /r/{task}/{rollout})     200: clients probe their base URL
 *   POST /reward, POST /end                           reward and rollout-end spans
 *   POST /v1/sessions                                 a session key standing for an identity
 *   GET  /healthz, GET /metrics                       on the proxy's port too
 * as a table (px_route_find: one lookup per request; call.c reads the row's API, capture,
 * native and upstream fields), and the control endpoints themselves: rewards, rollout ends
 * and sessions, with the checks that keep what credit cannot use out of the span stream.
 */
#include "proxy.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Admission of a reward or end span: the spool must have room and the rollout an entry.
 * Returns the rollout, or NULL after answering the agent (503 spool full, 500 no memory). */
static rollout_ent *control_span_admit(proxy *px, conn *c, ident *id)
{
    if (al_spool_full(px->spool, 4096)) {
        al_counter_inc(px->rejected_spool_full);
        px_conn_error(c, 503, "server_error", "spool_full",
                      "the proxy's span spool is full; retry when the broker is back");
        return NULL;
    }
    rollout_ent *r = px_rollout_of(px, id);
    if (!r) px_conn_error(c, 500, "server_error", "out_of_memory", "out of memory");
    return r;
}

/* POST .../reward: {"value": 1.0, "name": "accuracy"} or {"rewards": {"a": 1, "b": 0.5}} */
static void handle_reward(conn *c, ident *id)
{
    proxy *px = c->px;
    json_t *o = px_conn_body_json(c, 1);
    if (!o) return;
    json_t *v = json_object_get(o, "value"), *rs = json_object_get(o, "rewards");
    const char *name = json_string_value(json_object_get(o, "name"));
    if ((v && !json_is_number(v)) || (rs && !json_is_object(rs)) || (!v && !rs) ||
        (json_object_get(o, "name") && !name)) {
        json_decref(o);
        px_conn_error(c, 400, "invalid_request_error", "invalid_reward",
                      "a reward is {\"value\": number, \"name\": string (optional)} or "
                      "{\"rewards\": {name: number, ...}}");
        return;
    }
    const char *k;
    json_t *x;
    json_object_foreach(rs, k,
                        x) if (!json_is_number(x) || !(fabs(json_number_value(x)) <= AL_REWARD_MAX))
    {
        /* k belongs to o: the answer is written before o goes */
        px_conn_error(c, 400, "invalid_request_error", "invalid_reward",
                      "reward \"%.100s\" is not a finite number within +-%g", k, AL_REWARD_MAX);
        json_decref(o);
        return;
    }
    if (v && !(fabs(json_number_value(v)) <= AL_REWARD_MAX)) {
        json_decref(o);
        px_conn_error(c, 400, "invalid_request_error", "invalid_reward",
                      "value must be a finite number within +-%g", AL_REWARD_MAX);
        return;
    }
    rollout_ent *r = control_span_admit(px, c, id);
    if (!r) {
        json_decref(o);
        return;
    }
    json_t *seqs = json_array();
    al_span s;
    char trace[33], sid[17], parent[17];
    if (v) {
        px_span_init(px, &s, id, r->next_seq++, c->head, trace, sid, parent);
        s.kind = AL_SPAN_KIND_REWARD;
        s.reward.name = name ? name : "final";
        s.reward.value = json_number_value(v);
        s.reward.after_sequence = r->last_call_seq;
        px_span_publish(px, &s);
        json_array_append_new(seqs, json_integer(s.sequence));
    }
    json_object_foreach(rs, k, x)
    {
        px_span_init(px, &s, id, r->next_seq++, c->head, trace, sid, parent);
        s.kind = AL_SPAN_KIND_REWARD;
        s.reward.name = k;
        s.reward.value = json_number_value(x);
        s.reward.after_sequence = r->last_call_seq;
        px_span_publish(px, &s);
        json_array_append_new(seqs, json_integer(s.sequence));
    }
    json_t *resp = json_pack("{s:s,s:s,s:s,s:o}", "status", "recorded", "task_id", id->task,
                             "rollout_id", id->rollout, "sequences", seqs);
    char *b = json_dumps(resp, JSON_COMPACT | JSON_PRESERVE_ORDER);
    px_conn_reply(c, 200, "application/json", NULL, b, strlen(b));
    free(b);
    json_decref(resp);
    json_decref(o);
}

/* POST .../end: {"status": "succeeded"|"failed"|..., "group_size": 8, "reason": "...",
 * "retried": false}; retried: a new attempt of the rollout follows (credit then neither
 * trains on this attempt nor counts it in its group) */
static void handle_end(conn *c, ident *id)
{
    proxy *px = c->px;
    json_t *o = px_conn_body_json(c, 1);
    if (!o) return;
    const char *st = json_string_value(json_object_get(o, "status"));
    json_t *gs = json_object_get(o, "group_size"), *rj = json_object_get(o, "reason");
    json_t *rt = json_object_get(o, "retried");
    int status = st ? al_rollout_status_parse(st) : -1;
    if (status < 0 || (rt && !json_is_boolean(rt)) ||
        (gs && !json_is_null(gs) &&
         (!json_is_integer(gs) || json_integer_value(gs) < 1 ||
          json_integer_value(gs) > 1000000)) ||
        (rj && !json_is_null(rj) && !json_is_string(rj))) {
        json_decref(o);
        px_conn_error(
            c, 400, "invalid_request_error", "invalid_end",
            "an end is {\"status\": \"succeeded\"|\"failed\"|\"timeout\"|\"aborted\", "
            "\"group_size\": positive integer (optional), \"reason\": string (optional), "
            "\"retried\": boolean (optional)}");
        return;
    }
    rollout_ent *r = control_span_admit(px, c, id);
    if (!r) {
        json_decref(o);
        return;
    }
    al_span s;
    char trace[33], sid[17], parent[17];
    px_span_init(px, &s, id, r->next_seq++, c->head, trace, sid, parent);
    s.kind = AL_SPAN_KIND_ROLLOUT_END;
    s.rollout_end.status = (al_rollout_status)status;
    s.rollout_end.group_size = json_is_integer(gs) ? (int32_t)json_integer_value(gs) : 0;
    s.rollout_end.reason = json_string_value(rj);
    s.rollout_end.retried = json_is_true(rt);
    px_span_publish(px, &s);
    char b[400];
    int n = snprintf(b, sizeof b, "{\"status\":\"recorded\",\"sequence\":%" PRId64 "}", s.sequence);
    px_conn_reply(c, 200, "application/json", NULL, b, (size_t)n);
    json_decref(o);
}

/* POST /v1/sessions: {"task_id": "...", "rollout_id": "...", "attempt": 0} (all optional)
 * -> {"session_key": "sk-arclight-...", ...}; the agent uses the key as its API key. */
static void handle_session(conn *c, ident *id)
{
    (void)id;
    proxy *px = c->px;
    json_t *o = px_conn_body_json(c, 0);
    if (!o) return;
    const char *t = json_string_value(json_object_get(o, "task_id"));
    const char *r = json_string_value(json_object_get(o, "rollout_id"));
    json_t *a = json_object_get(o, "attempt");
    if ((json_object_get(o, "task_id") && (!t || (*t && !px_id_valid(t, strlen(t))))) ||
        (json_object_get(o, "rollout_id") && (!r || !px_id_valid(r, strlen(r)))) ||
        (a &&
         (!json_is_integer(a) || json_integer_value(a) < 0 || json_integer_value(a) > 999999))) {
        json_decref(o);
        px_conn_error(c, 400, "invalid_request_error", "invalid_identity",
                      "task_id and rollout_id must be 1-128 characters of A-Z a-z 0-9 . _ : @ -; "
                      "attempt an integer from 0 to 999999");
        return;
    }
    /* a session made with a session key belongs to that session's agent key */
    int owner = px_agent_key_index(px, c->head);
    al_slice tok;
    session_ent *by = owner < 0 && px_api_key(c->head, &tok) ? px_session_find(px, tok.p, tok.n) : NULL;
    if (by) owner = by->owner;
    if (!px_session_room(px, owner)) px_session_expire(px); /* expired ones make room */
    if (!px_session_room(px, owner)) {
        json_decref(o);
        px_conn_error(c, 429, "rate_limit_error", "too_many_sessions",
                      "this API key holds %d session keys already (--max-sessions-per-key); each "
                      "expires %d s after it was made (--session-ttl)",
                      px->cfg.max_sessions_per_key, px->cfg.session_ttl_s);
        return;
    }
    if (px->sessions.count >= 1000000) {
        json_decref(o);
        px_conn_error(c, 503, "server_error", "too_many_sessions",
                      "the proxy holds 1000000 sessions already; restart it or use "
                      "/r/{task}/{rollout}/v1 URLs");
        return;
    }
    session_ent *s = px_session_new(px, t, r, a ? (int)json_integer_value(a) : 0, owner);
    if (!s) {
        json_decref(o);
        px_conn_error(c, 500, "server_error", "internal_error", "cannot create a session key");
        return;
    }
    json_t *resp = json_pack("{s:s,s:s,s:s,s:i}", "session_key", s->key, "task_id", s->task,
                             "rollout_id", s->rollout, "attempt", s->attempt);
    char *body = json_dumps(resp, JSON_COMPACT | JSON_PRESERVE_ORDER);
    px_conn_reply(c, 200, "application/json", NULL, body, strlen(body));
    free(body);
    json_decref(resp);
    json_decref(o);
}

/* GET/HEAD /healthz, and a client's probe of its base URL: 200. */
static void handle_probe(conn *c, ident *id)
{
    (void)id;
    static const char ok[] = "{\"status\":\"ok\"}";
    px_conn_reply(c, 200, "application/json", NULL, ok, sizeof ok - 1);
}

/* GET /metrics on the proxy's port: the registry in the Prometheus text format. */
static void handle_metrics(conn *c, ident *id)
{
    (void)id;
    size_t n;
    char *text = al_metrics_render(c->px->metrics, &n);
    px_conn_reply(c, 200, "text/plain; version=0.0.4", NULL, text ? text : "", text ? n : 0);
    free(text);
}

/* The routes. A request's path (after any identity prefix) is looked up here once; its row
 * is what the rest of the proxy reads (call.c: the API, capture, the upstream path). */
static const px_route routes[] = {
    {.name = "chat_completions", .method = "POST",
     .paths = {"/v1/chat/completions", "/chat/completions"}, .prefixed = 1, .identity = 1,
     .api = AL_API_CHAT, .chat = 1, .capture = 1, .upstream = "/v1/chat/completions",
     .upstream_method = "POST", .handler = px_start_llm_call},
    {.name = "completions", .method = "POST", .paths = {"/v1/completions", "/completions"},
     .prefixed = 1, .identity = 1, .api = AL_API_CHAT, .capture = 1,
     .upstream = "/v1/completions", .upstream_method = "POST", .handler = px_start_llm_call},
    {.name = "responses", .method = "POST", .paths = {"/v1/responses", "/responses"},
     .prefixed = 1, .identity = 1, .api = AL_API_RESPONSES, .chat = 1, .capture = 1,
     .native = 1, .upstream = "/v1/chat/completions", .upstream_native = "/v1/responses",
     .upstream_method = "POST", .handler = px_start_llm_call},
    {.name = "messages", .method = "POST", .paths = {"/v1/messages", "/messages"}, .prefixed = 1,
     .identity = 1, .api = AL_API_MESSAGES, .error_api = AL_API_MESSAGES, .chat = 1,
     .capture = 1, .native = 1, .upstream = "/v1/chat/completions",
     .upstream_native = "/v1/messages", .upstream_method = "POST", .handler = px_start_llm_call},
    {.name = "count_tokens", .method = "POST", .paths = {"/v1/messages/count_tokens"},
     .prefixed = 1, .identity = 1, .api = AL_API_MESSAGES, .native = 1, .count = 1,
     .upstream = "/tokenize", .upstream_native = "/v1/messages/count_tokens",
     .upstream_method = "POST", .handler = px_start_llm_call},
    {.name = "models", .method = "GET", .paths = {"/v1/models", "/models"}, .prefixed = 1,
     .identity = 1, .api = AL_API_CHAT, .models = 1, .upstream = "/v1/models",
     .upstream_method = "GET", .handler = px_start_llm_call},
    {.name = "root", .method = "GET", .paths = {"", "/", "/v1", "/v1/"}, .prefixed = 1,
     .open = 1, .quiet = 1, .handler = handle_probe},
    {.name = "reward", .method = "POST", .paths = {"/reward", "/v1/reward"}, .prefixed = 1,
     .identity = 1, .tracked = 1, .handler = handle_reward},
    {.name = "end", .method = "POST", .paths = {"/end", "/v1/end"}, .prefixed = 1,
     .identity = 1, .tracked = 1, .handler = handle_end},
    {.name = "sessions", .method = "POST", .paths = {"/v1/sessions"}, .handler = handle_session},
    {.name = "healthz", .method = "GET", .paths = {"/healthz"}, .open = 1, .quiet = 1,
     .handler = handle_probe},
    {.name = "metrics", .method = "GET", .paths = {"/metrics"}, .open = 1, .quiet = 1,
     .handler = handle_metrics},
};

const px_route px_route_unknown = {.name = "unknown", .method = "POST"};

const px_route *px_route_find(al_slice path, int prefixed)
{
    for (size_t i = 0; i < AL_ARRAY_LEN(routes); i++) {
        if (prefixed && !routes[i].prefixed) continue;
        for (const char *const *p = routes[i].paths; *p; p++)
            if (al_slice_eq(path, *p)) return &routes[i];
    }
    return &px_route_unknown;
}

/* The length of an identity prefix "/r/", "/e/" or "/e:T/" at the start of path (0: none;
 * -1: "/e:T/" with T not a temperature). */
static size_t prefix_len(al_slice path)
{
    if (path.n > 3 && (path.p[1] == 'r' || path.p[1] == 'e') && path.p[0] == '/' &&
        path.p[2] == '/')
        return 3;
    if (path.n > 4 && memcmp(path.p, "/e:", 3) == 0) {
        const char *s = memchr(path.p + 3, '/', path.n - 3);
        double t;
        if (!s || px_parse_temperature(path.p + 3, (size_t)(s - path.p - 3), &t) != 0)
            return (size_t)-1;
        return (size_t)(s - path.p) + 1;
    }
    return 0;
}

/* Routes one complete request. */
void px_dispatch(conn *c)
{
    proxy *px = c->px;
    al_slice path = c->head->path; /* origin-form, or the path of an absolute-form target */
    ident id;
    memset(&id, 0, sizeof id);
    int prefix = 0;
    size_t plen = prefix_len(path);
    if (plen == (size_t)-1) {
        c->route = &px_route_unknown;
        px_conn_error(c, 400, "invalid_request_error", "invalid_eval_temperature",
                      "the temperature T in /e:T/{task}/{rollout}/ must be a number from 0 to 2");
        return;
    }
    if (plen) {
        if (path.p[1] == 'e') {
            id.eval = 1;
            if (plen > 3) px_parse_temperature(path.p + 3, plen - 4, &id.eval_temperature);
        }
        const char *t = path.p + plen, *end = path.p + path.n;
        const char *s1 = memchr(t, '/', (size_t)(end - t));
        const char *s2 = s1 ? memchr(s1 + 1, '/', (size_t)(end - s1 - 1)) : NULL;
        if (s1 && !s2 && s1 + 1 < end) s2 = end; /* the base URL itself: /r/{task}/{rollout} */
        if (!s2) {
            c->route = &px_route_unknown;
            px_conn_error(c, 404, "invalid_request_error", "unknown_route",
                          "unknown route %.*s; use /r/{task}/{rollout}/v1/... (or /e/...)",
                          (int)(path.n > 200 ? 200 : path.n), path.p);
            return;
        }
        if (!px_id_valid(t, (size_t)(s1 - t)) || !px_id_valid(s1 + 1, (size_t)(s2 - s1 - 1))) {
            c->route = &px_route_unknown;
            px_conn_error(
                c, 400, "invalid_request_error", "invalid_identity",
                "task and rollout in /r/{task}/{rollout}/ (or /e/) must be 1-128 characters of "
                "A-Z a-z 0-9 . _ : @ -");
            return;
        }
        *al_put_mem(id.task, t, (size_t)(s1 - t)) = '\0'; /* id_valid: at most 128 */
        *al_put_mem(id.rollout, s1 + 1, (size_t)(s2 - s1 - 1)) = '\0';
        prefix = 1;
        /* /r/{task}/{rollout}/{attempt}/...: a segment of 1-6 digits is the attempt (no
         * route begins with a digit) */
        const char *s3 = memchr(s2 + 1, '/', (size_t)(end - s2 - 1));
        size_t an = s3 ? (size_t)(s3 - s2 - 1) : 0;
        int digits = an >= 1 && an <= 6;
        for (size_t i = 0; digits && i < an; i++)
            digits = s2[1 + i] >= '0' && s2[1 + i] <= '9';
        if (digits) {
            id.attempt = 0;
            for (size_t i = 0; i < an; i++)
                id.attempt = id.attempt * 10 + (s2[1 + i] - '0');
            s2 = s3;
        }
        path = (al_slice){s2, (size_t)(end - s2)};
    }
    const px_route *rt = px_route_find(path, prefix);
    c->route = rt;
    if (rt == &px_route_unknown) {
        px_conn_error(c, 404, "invalid_request_error", "unknown_route", "unknown route %.*s %.*s",
                      (int)c->head->method.n, c->head->method.p, (int)(path.n > 200 ? 200 : path.n),
                      path.p);
        return;
    }
    int want_post = rt->method[0] == 'P';
    if (want_post ? !al_slice_eq(c->head->method, "POST")
                  : !(al_slice_eq(c->head->method, "GET") || al_slice_eq(c->head->method, "HEAD"))) {
        px_conn_error(c, 405, "invalid_request_error", "method_not_allowed",
                      "%.*s is not allowed here; use %s", (int)c->head->method.n, c->head->method.p,
                      rt->method);
        return;
    }
    if (!rt->open && !px_authorized(px, c->head)) {
        px_conn_error(c, 401, "invalid_request_error", "invalid_api_key",
                      "missing or unknown API key for this proxy");
        return;
    }
    px_err err;
    if (rt->identity && px_resolve_identity(px, c->head, &id, prefix, &err) != 0) {
        px_conn_error(c, err.status, err.type, err.code, "%s", err.message);
        return;
    }
    if (rt->tracked && id.untracked) {
        px_conn_error(c, 400, "invalid_request_error", "invalid_identity",
                      "a reward or end needs a rollout: use /r/{task}/{rollout}/%s, the "
                      "X-Arclight-Rollout header or a session key",
                      rt->name);
        return;
    }
    rt->handler(c, &id);
}
