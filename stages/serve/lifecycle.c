/*
 * lifecycle.c: one generation call from arrival to its last byte: admission (draining, the
 * /v1/responses translation, parsing), the hand-off to the engine (the call's event, which the
 * engine thread activates after each step), the reply written as the engine makes progress
 * (streamed or whole), and the end (done, aborted, or the client gone).
 */
#include "serve.h"

#include "core/log.h"
#include "core/util.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

/* Unlinks c from the live calls, detaches its engine request (the engine drops it) and frees
 * c. The httpd request is not touched: the caller has answered it, or it is gone. */
void serve_call_free(http_call *c)
{
    serve_ctx *sc = c->sc;
    if (c->prev)
        c->prev->next = c->next;
    else
        sc->calls = c->next;
    if (c->next) c->next->prev = c->prev;
    if (c->r) {
        al_serve_req_detach(c->r);
        al_serve_req_unref(c->r);
    }
    if (c->ev) event_free(c->ev);
    if (c->cs)
        for (int i = 0; i < MAX_N; i++)
            al_chat_stream_free(&c->cs[i]);
    free(c->cs);
    free(c->sent_tok);
    free(c->sent_text);
    free(c->finished_sent);
    al_xl_free(c->xl);
    free(c);
}

/* Engine thread, under r->lock: wake the loop. */
static void call_notify(al_serve_req *r, void *ud)
{
    (void)r;
    http_call *c = ud;
    event_active(c->ev, EV_READ, 0);
}

/* Loop thread: the engine made progress on c. */
static void call_progress(evutil_socket_t fd, short what, void *ud)
{
    (void)fd, (void)what;
    http_call *c = ud;
    serve_ctx *sc = c->sc;
    al_serve_req *r = c->r;
    if (al_httpd_req_closed(c->req)) {
        /* the client went away (counted out by reply_done already): stop generating */
        al_httpd_req_abort(c->req);
        serve_call_free(c);
        return;
    }
    pthread_mutex_lock(&r->lock);
    int done = r->done_seqs == r->nseq;
    if (!r->admitted) {
        pthread_mutex_unlock(&r->lock);
        return;
    }
    int aborted = 0, any_token = 0;
    for (int i = 0; i < r->nseq; i++) {
        aborted |= r->seqs[i].finish == AL_SERVE_FINISH_ABORT;
        any_token |= r->seqs[i].n > 0;
    }
    if (any_token && !c->first_seen) {
        c->first_seen = 1;
        al_histogram_observe(sc->h_ttft, (al_mono_us() - c->t0_us) / 1e6);
    }
    if (done && !aborted) al_histogram_observe(sc->h_request, (al_mono_us() - c->t0_us) / 1e6);
    if (c->stream) {
        if (aborted && !c->started && done) {
            char msg[300];
            snprintf(msg, sizeof msg, "%s", r->error);
            pthread_mutex_unlock(&r->lock);
            serve_reply_error(sc, c->req, 500, NULL, "generation failed: %s", msg);
            serve_call_free(c);
            return;
        }
        int all = serve_response_stream_progress(c);
        if (done && all) {
            if (c->include_usage) {
                json_t *o = serve_response_chunk(c, json_array());
                json_object_set_new(o, "usage", serve_response_usage(r));
                serve_response_emit(c, o);
            }
            if (c->xl) { /* the Responses API's stream ends with its last event */
                serve_response_emit_end(c, aborted ? "generation failed" : NULL);
                pthread_mutex_unlock(&r->lock);
                al_httpd_send_end(c->req);
                serve_call_free(c);
                return;
            }
            pthread_mutex_unlock(&r->lock);
            al_httpd_send_chunk(c->req, "data: [DONE]\n\n", 14);
            al_httpd_send_end(c->req);
            serve_call_free(c);
            return;
        }
        pthread_mutex_unlock(&r->lock);
        return;
    }
    if (!done) {
        pthread_mutex_unlock(&r->lock);
        return;
    }
    if (aborted) {
        char msg[300];
        snprintf(msg, sizeof msg, "%s", r->error);
        pthread_mutex_unlock(&r->lock);
        serve_reply_error(sc, c->req, 500, NULL, "generation failed: %s", msg);
        serve_call_free(c);
        return;
    }
    json_t *o = serve_response_full(c);
    int64_t v = r->policy_version;
    if (c->xl) { /* the chat completion becomes the agent's API's answer */
        if (c->response_messages) al_xl_set_final_members(c->xl, serve_response_messages(c));
        al_xl_err xe;
        json_t *ans = o ? al_xl_answer(c->xl, o, &xe) : NULL;
        json_decref(o);
        pthread_mutex_unlock(&r->lock);
        if (!ans) {
            serve_reply_error(sc, c->req, 500, NULL, "cannot build the answer: out of memory");
        } else {
            serve_reply_json(sc, c->req, 200, ans, v);
        }
        serve_call_free(c);
        return;
    }
    pthread_mutex_unlock(&r->lock);
    serve_reply_json(sc, c->req, 200, o, v);
    serve_call_free(c);
}

/* httpd: the reply of a generation request has been written out (or its connection
 * failed). A drain ends when the last one is out, not merely queued. */
static void reply_done(al_httpd_req *req, void *ud)
{
    (void)req;
    serve_ctx *sc = ud;
    sc->open_replies--;
    if (sc->draining && sc->open_replies == 0) event_base_loopbreak(sc->base);
}

/* POST /v1/responses: the agent's request as a chat completions request for the parser
 * (*chat_body, malloc'd) and its translator (*xl). 0, or -1 after answering the error in
 * the Responses API's shape. */
static int responses_request(serve_ctx *sc, al_httpd_req *req, const char *body, size_t len,
                             al_xl **xl, char **chat_body, int *response_messages)
{
    uint8_t rnd[12];
    char seed[25];
    if (getrandom(rnd, sizeof rnd, 0) != (ssize_t)sizeof rnd) memset(rnd, 7, sizeof rnd);
    al_hex(rnd, sizeof rnd, seed);
    al_xl_env env = {seed, al_now_us() / 1000000, NULL, NULL, 0};
    al_xl_err xe;
    json_t *chat = NULL;
    *xl = al_xl_request(AL_API_RESPONSES, body, len, &env, &chat, &xe);
    if (!*xl) {
        if (!strcmp(xe.param, "previous_response_id")) /* the translator speaks as the proxy */
            snprintf(xe.message, sizeof xe.message,
                     "previous_response_id is not supported: arclight serve keeps no responses; "
                     "send the whole conversation in input");
        char *b = al_xl_error_body(AL_API_RESPONSES, xe.status, xe.type, xe.code, xe.message);
        json_t *eo = b ? json_loads(b, 0, NULL) : NULL;
        free(b);
        if (xe.param[0]) /* the field at fault, as OpenAI names it */
            json_object_set_new(json_object_get(eo, "error"), "param", json_string(xe.param));
        serve_reply_json(sc, req, xe.status, eo, -1);
        return -1;
    }
    *response_messages =
        json_is_true(json_object_get(al_xl_agent_request(*xl), "enable_response_messages"));
    /* the translator reads the usage off the stream's last chunk */
    if (al_xl_stream(*xl))
        json_object_set_new(chat, "stream_options", json_pack("{s:b}", "include_usage", 1));
    *chat_body = json_dumps(chat, JSON_COMPACT);
    json_decref(chat);
    if (!*chat_body) {
        al_xl_free(*xl);
        *xl = NULL;
        serve_reply_error(sc, req, 500, NULL, "out of memory");
        return -1;
    }
    return 0;
}

/* POST /v1/chat/completions, /v1/completions (chat: which) and /v1/responses (api): parses
 * the body, hands the request to the engine and links its call in; the reply is written as
 * the engine makes progress (call_progress). Errors are answered here. */
void serve_call_generate(serve_ctx *sc, al_httpd_req *req, int chat, al_api api)
{
    char err[1024] = "";
    sc->open_replies++;
    al_httpd_req_on_done(req, reply_done, sc);
    if (sc->draining) {
        serve_reply_error(sc, req, 503, NULL, "the server is shutting down");
        return;
    }
    size_t len = 0;
    const char *body = al_httpd_req_body(req, &len);
    al_xl *xl = NULL;
    char *chat_body = NULL;
    int resp_msgs = 0;
    if (api == AL_API_RESPONSES) {
        if (responses_request(sc, req, body, len, &xl, &chat_body, &resp_msgs) != 0) return;
        body = chat_body, len = strlen(chat_body);
    }
    al_serve_parse_ctx pc = {sc->tok, sc->name, sc->cfg.vocab_size, sc->max_model_len};
    al_serve_request p;
    al_serve_error pe;
    int prc = al_serve_request_parse(&pc, chat, body, len, &p, &pe);
    free(chat_body);
    if (prc != 0) {
        al_xl_free(xl);
        serve_reply_error(sc, req, pe.status, pe.param, "%s", pe.message);
        return;
    }
    int np = (int)p.prompt.len, stream = p.stream, include_usage = p.include_usage;
    int rti = p.return_token_ids, has_tools = p.has_tools;
    al_serve_req *r = al_serve_req_new(p.prompt.ids, np, p.n);
    http_call *c = calloc(1, sizeof *c);
    if (!r || !c) {
        al_serve_req_unref(r);
        free(c);
        al_xl_free(xl);
        al_serve_request_free(&p);
        serve_reply_error(sc, req, 500, NULL, "out of memory");
        return;
    }
    r->max_tokens = p.max_tokens, r->ignore_eos = p.ignore_eos;
    r->stop = p.stop, r->nstop = p.nstop, p.stop = NULL, p.nstop = 0;
    r->stop_ids = p.stop_ids, r->nstop_ids = p.nstop_ids, p.stop_ids = NULL, p.nstop_ids = 0;
    uint64_t seed = p.seed;
    if (!p.has_seed && getrandom(&seed, sizeof seed, 0) != (ssize_t)sizeof seed)
        seed = (uint64_t)al_now_us();
    for (int i = 0; i < p.n; i++) {
        al_serve_seq *s = &r->seqs[i];
        s->sampling = (al_infer_sampling){p.temperature, p.top_p, p.top_k};
        s->seed = seed;
        s->top_logprobs = p.logprobs ? p.top_logprobs : -1;
    }
    al_serve_request_free(&p);
    c->sc = sc, c->req = req, c->r = r, c->chat = chat, c->stream = stream;
    c->xl = xl, c->response_messages = resp_msgs;
    c->include_usage = include_usage, c->logprobs = r->seqs[0].top_logprobs >= 0;
    c->top_logprobs = c->logprobs ? r->seqs[0].top_logprobs : 0, c->return_token_ids = rti;
    c->parse_tools = chat && has_tools;
    c->parse_reasoning = chat && al_tokenizer_chat_template(sc->tok) == AL_CHAT_TEMPLATE_QWEN3;
    c->created = al_now_us() / 1000000;
    c->t0_us = al_mono_us();
    uint8_t rnd[8];
    char hex[17];
    if (getrandom(rnd, sizeof rnd, 0) != (ssize_t)sizeof rnd) memset(rnd, 7, sizeof rnd);
    al_hex(rnd, sizeof rnd, hex);
    snprintf(c->id, sizeof c->id, "%s-%s", chat ? "chatcmpl" : "cmpl", hex);
    c->sent_tok = calloc((size_t)r->nseq, sizeof *c->sent_tok);
    c->sent_text = calloc((size_t)r->nseq, sizeof *c->sent_text);
    c->finished_sent = calloc((size_t)r->nseq, sizeof *c->finished_sent);
    c->cs = calloc(MAX_N, sizeof *c->cs);
    for (int i = 0; i < MAX_N; i++)
        c->cs[i].flags = c->parse_reasoning ? AL_CHAT_PARSE_REASONING : 0;
    c->ev = event_new(sc->base, -1, 0, call_progress, c);
    c->next = sc->calls;
    if (sc->calls) sc->calls->prev = c;
    sc->calls = c;
    r->notify = call_notify, r->notify_ud = c;
    al_counter_add(sc->prompt_tokens, np);
    int sr = al_serve_engine_submit(sc->eng, r, err, sizeof err);
    if (sr != AL_SERVE_OK) {
        serve_reply_error(sc, req, sr == AL_SERVE_BUSY ? 429 : 400, NULL, "%s", err);
        serve_call_free(c);
    }
}

