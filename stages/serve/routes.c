/*
 * routes.c: serve's HTTP routes (see main.c for the list): the generation routes go to the
 * call lifecycle (lifecycle.c); vLLM's /tokenize and /detokenize, /v1/models, /health and
 * /metrics are answered here at once.
 */
#include "serve.h"

#include "core/util.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* vLLM's POST /tokenize: {"prompt": TEXT} or {"messages": [...]} (rendered with the chat
 * template, as a chat request would be) -> {"tokens": [...], "count", "max_model_len"}. */
static void handle_tokenize(serve_ctx *sc, al_httpd_req *req)
{
    size_t len = 0;
    const char *body = al_httpd_req_body(req, &len);
    json_t *j = json_loadb(body, len, JSON_ALLOW_NUL, NULL);
    int chat = json_is_object(j) && json_object_get(j, "messages");
    json_decref(j);
    /* the generation parser renders and checks it; one token of room is all it needs here */
    al_serve_parse_ctx pc = {sc->tok, sc->name, sc->cfg.vocab_size, INT_MAX / 2};
    al_serve_request p;
    al_serve_error pe;
    if (al_serve_request_parse(&pc, chat, body, len, &p, &pe) != 0) {
        serve_reply_error(sc, req, pe.status, pe.param, "%s", pe.message);
        return;
    }
    serve_reply_json(sc, req, 200,
              json_pack("{s:o,s:i,s:i}", "tokens", serve_json_ids(p.prompt.ids, (int)p.prompt.len),
                        "count", (int)p.prompt.len, "max_model_len", sc->max_model_len),
              -1);
    al_serve_request_free(&p);
}

/* vLLM's POST /detokenize: {"tokens": [...]} -> {"prompt": TEXT}. */
static void handle_detokenize(serve_ctx *sc, al_httpd_req *req)
{
    size_t len = 0;
    const char *body = al_httpd_req_body(req, &len);
    json_t *j = len ? json_loadb(body, len, 0, NULL) : NULL;
    json_t *t = json_object_get(j, "tokens");
    if (!json_is_array(t)) {
        json_decref(j);
        serve_reply_error(sc, req, 400, "tokens", "send {\"tokens\": [ids...]}");
        return;
    }
    size_t n = json_array_size(t);
    int32_t *ids = malloc(sizeof(int32_t) * (n + 1));
    for (size_t i = 0; i < n; i++) {
        json_t *e = json_array_get(t, i);
        if (!json_is_integer(e) || json_integer_value(e) < 0 ||
            json_integer_value(e) >= sc->cfg.vocab_size) {
            free(ids);
            json_decref(j);
            serve_reply_error(sc, req, 400, "tokens", "tokens[%zu] is not a token id of this model", i);
            return;
        }
        ids[i] = (int32_t)json_integer_value(e);
    }
    json_decref(j);
    char *text = NULL;
    size_t tl = 0;
    if (al_tokenizer_decode(sc->tok, ids, n, AL_TOKENIZER_LOSSY, &text, &tl) != 0) {
        free(ids);
        serve_reply_error(sc, req, 500, NULL, "out of memory");
        return;
    }
    free(ids);
    serve_reply_json(sc, req, 200, json_pack("{s:o}", "prompt", serve_json_bytes(text, tl)), -1);
    free(text);
}

/* GET /v1/models: the one model served, with its current policy version. */
static void handle_models(serve_ctx *sc, al_httpd_req *req)
{
    json_t *m = json_pack("{s:s,s:s,s:I,s:s,s:s,s:i,s:I}", "id", sc->name, "object", "model",
                          "created", (json_int_t)(al_now_us() / 1000000), "owned_by", "arclight",
                          "root", sc->name, "max_model_len", sc->max_model_len, "policy_version",
                          (json_int_t)al_serve_engine_version(sc->eng));
    serve_reply_json(sc, req, 200, json_pack("{s:s,s:[o]}", "object", "list", "data", m),
              al_serve_engine_version(sc->eng));
}

/* httpd's request callback: the API key, then the route; an unknown one is 404. */
void serve_route_request(al_httpd_req *req, void *ud)
{
    serve_ctx *sc = ud;
    const char *path = al_httpd_req_path(req);
    if (!serve_auth_check(sc, req, path)) {
        al_httpd_add_header(req, "WWW-Authenticate", "Bearer");
        serve_reply_error(sc, req, 401, NULL, "a valid API key is required (Authorization: Bearer)");
        return;
    }
    int is_post = al_httpd_req_method_is(req, "POST");
    int is_get = al_httpd_req_method_is(req, "GET") || al_httpd_req_method_is(req, "HEAD");
    if (serve_wapi_route(sc, req, path)) return; /* weights_api.c, with --weight-routes */
    if (serve_wapi_paused(sc->wapi) && is_post && !strncmp(path, "/v1/", 4)) {
        al_httpd_add_header(req, "Retry-After", "1");
        serve_reply_error(sc, req, 503, NULL, "generation is paused for a weight update");
        return;
    }
    if (!strcmp(path, "/v1/chat/completions") || !strcmp(path, "/v1/completions")) {
        if (!is_post) {
            serve_reply_error(sc, req, 405, NULL, "use POST for %s", path);
            return;
        }
        serve_call_generate(sc, req, path[4] == 'c' && path[5] == 'h', AL_API_CHAT);
    } else if (!strcmp(path, "/v1/responses")) {
        if (!is_post) {
            serve_reply_error(sc, req, 405, NULL, "use POST for %s", path);
            return;
        }
        serve_call_generate(sc, req, 1, AL_API_RESPONSES);
    } else if (!strcmp(path, "/tokenize") && is_post) {
        handle_tokenize(sc, req);
    } else if (!strcmp(path, "/detokenize") && is_post) {
        handle_detokenize(sc, req);
    } else if (!strcmp(path, "/metrics") && is_get) {
        /* also on the API port, where vLLM serves it (and on --metrics when given) */
        size_t n = 0;
        char *text = al_metrics_render(sc->metrics, &n);
        al_httpd_send(req, 200, "text/plain; version=0.0.4", text ? text : "", text ? n : 0);
        free(text);
    } else if (!strcmp(path, "/v1/models") && is_get) {
        handle_models(sc, req);
    } else if ((!strcmp(path, "/health") || !strcmp(path, "/healthz")) && is_get) {
        char why[600];
        if (al_serve_policy_failed(sc->policy, why, sizeof why)) {
            serve_reply_json(sc, req, 503, json_pack("{s:s,s:s}", "status", "unhealthy", "reason", why),
                      -1);
            return;
        }
        al_serve_engine_stats st;
        al_serve_engine_stats_get(sc->eng, &st);
        serve_reply_json(sc, req, 200,
                  json_pack("{s:s,s:I,s:i,s:i,s:I,s:I,s:I,s:i}", "status", "ok", "policy_version",
                            (json_int_t)al_serve_engine_version(sc->eng), "running", st.running,
                            "queued", st.queued, "decode_steps", (json_int_t)st.steps,
                            "generated_tokens", (json_int_t)st.tokens_generated, "weight_swaps",
                            (json_int_t)st.swaps, "weight_sets", st.weight_sets),
                  -1);
    } else {
        const al_http_head *h = al_httpd_req_head(req);
        serve_reply_error(sc, req, 404, NULL, "no route %.*s %s", (int)h->method.n, h->method.p, path);
    }
}

