/*
 * responses.c: the OpenAI answers built from an engine request: the whole chat.completion or
 * text_completion (choices, tool calls and reasoning parsed out of the text, logprobs in
 * OpenAI's shapes, vLLM's token ids, usage, policy_version), and the stream of chunks, one
 * per new token, sent as server-sent events; on /v1/responses both go through lib/api's
 * translator into the Responses API's answer and events. Everything here runs on the loop's
 * thread under r->lock.
 */
#include "serve.h"

#include "core/log.h"
#include "core/util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

static json_t *token_bytes_array(const char *b, size_t n)
{
    json_t *a = json_array();
    for (size_t i = 0; i < n; i++)
        json_array_append_new(a, json_integer((unsigned char)b[i]));
    return a;
}

static const char *finish_name(const al_serve_seq *s, const http_call *c, int has_calls)
{
    if (s->finish == AL_SERVE_FINISH_LENGTH) return "length";
    if (s->finish == AL_SERVE_FINISH_ABORT) return "abort";
    return has_calls ? "tool_calls" : "stop";
}

static json_t *stop_reason_json(const al_serve_seq *s)
{
    if (s->stop_reason) return json_string(s->stop_reason);
    if (s->stop_token >= 0) return json_integer(s->stop_token);
    return json_null();
}

static json_t *token_text_json(serve_ctx *sc, int32_t id)
{
    size_t n = 0;
    const char *b = al_tokenizer_id_bytes(sc->tok, id, &n);
    return serve_json_bytes(b ? b : "", b ? n : 0);
}

/* Chat logprobs entries for tokens [from, to) of s. */
static json_t *chat_logprobs(serve_ctx *sc, const http_call *c, const al_serve_seq *s, int from,
                             int to)
{
    json_t *content = json_array();
    int k = c->top_logprobs;
    for (int t = from; t < to; t++) {
        size_t n = 0;
        const char *b = al_tokenizer_id_bytes(sc->tok, s->ids[t], &n);
        json_t *top = json_array();
        for (int j = 0; j < k; j++) {
            int32_t id = s->top_ids[(size_t)t * k + j];
            size_t n2 = 0;
            const char *b2 = al_tokenizer_id_bytes(sc->tok, id, &n2);
            json_array_append_new(top,
                                  json_pack("{s:o,s:f,s:o}", "token", token_text_json(sc, id),
                                            "logprob", s->top_logps[(size_t)t * k + j], "bytes",
                                            token_bytes_array(b2 ? b2 : "", b2 ? n2 : 0)));
        }
        json_array_append_new(
            content, json_pack("{s:o,s:f,s:o,s:o}", "token", token_text_json(sc, s->ids[t]),
                               "logprob", s->logps[t], "bytes",
                               token_bytes_array(b ? b : "", b ? n : 0), "top_logprobs", top));
    }
    return json_pack("{s:o}", "content", content);
}

/* Completions (legacy) logprobs for tokens [from, to); text_offset counts from base. */
static json_t *completion_logprobs(serve_ctx *sc, const http_call *c, const al_serve_seq *s,
                                   int from, int to, size_t base)
{
    json_t *tokens = json_array(), *lps = json_array(), *tops = json_array(), *offs = json_array();
    int k = c->top_logprobs;
    size_t off = base;
    for (int t = from; t < to; t++) {
        size_t n = 0;
        al_tokenizer_id_bytes(sc->tok, s->ids[t], &n);
        json_array_append_new(tokens, token_text_json(sc, s->ids[t]));
        json_array_append_new(lps, json_real(s->logps[t]));
        json_array_append_new(offs, json_integer((json_int_t)off));
        off += al_tokenizer_id_is_special(sc->tok, s->ids[t]) ? 0 : n;
        json_t *top = json_object();
        for (int j = 0; j < k; j++) {
            int32_t id = s->top_ids[(size_t)t * k + j];
            json_t *key = token_text_json(sc, id);
            if (!json_object_get(top, json_string_value(key)))
                json_object_set_new(top, json_string_value(key),
                                    json_real(s->top_logps[(size_t)t * k + j]));
            json_decref(key);
        }
        json_array_append_new(tops, k ? top : (json_decref(top), json_null()));
    }
    return json_pack("{s:o,s:o,s:o,s:o}", "tokens", tokens, "token_logprobs", lps, "top_logprobs",
                     tops, "text_offset", offs);
}

static json_t *tool_calls_json(const al_chat_parsed *pp, int streaming)
{
    json_t *a = json_array();
    for (size_t i = 0; i < pp->n_calls; i++) {
        uint8_t rnd[12];
        char id[40], hex[25];
        if (getrandom(rnd, sizeof rnd, 0) != (ssize_t)sizeof rnd) memset(rnd, (int)i, sizeof rnd);
        al_hex(rnd, sizeof rnd, hex);
        snprintf(id, sizeof id, "chatcmpl-tool-%s", hex);
        json_t *call = json_pack("{s:s,s:s,s:{s:s,s:s}}", "id", id, "type", "function", "function",
                                 "name", pp->calls[i].name, "arguments", pp->calls[i].arguments);
        if (streaming) json_object_set_new(call, "index", json_integer((json_int_t)i));
        json_array_append_new(a, call);
    }
    return a;
}

json_t *serve_response_usage(const al_serve_req *r)
{
    int gen = 0;
    for (int i = 0; i < r->nseq; i++)
        gen += r->seqs[i].n;
    return json_pack("{s:i,s:i,s:i}", "prompt_tokens", r->nprompt, "completion_tokens", gen,
                     "total_tokens", r->nprompt + gen);
}

/* The whole (non-streaming) response. Under r->lock. */
json_t *serve_response_full(http_call *c)
{
    serve_ctx *sc = c->sc;
    al_serve_req *r = c->r;
    json_t *choices = json_array();
    for (int i = 0; i < r->nseq; i++) {
        al_serve_seq *s = &r->seqs[i];
        const char *text = s->text.data ? s->text.data : "";
        json_t *ch;
        if (c->chat) {
            al_chat_parsed pp = {0};
            unsigned fl = c->parse_reasoning ? AL_CHAT_PARSE_REASONING : 0;
            json_t *msg = json_object();
            json_object_set_new(msg, "role", json_string("assistant"));
            size_t ncalls = 0;
            if ((c->parse_tools || c->parse_reasoning) &&
                al_chat_parse(text, s->text.len, fl, &pp) == 0) {
                if (!c->parse_tools &&
                    pp.n_calls) { /* no tools asked for: the text stays as it is */
                    json_object_set_new(msg, "content", serve_json_bytes(text, s->text.len));
                } else {
                    ncalls = pp.n_calls;
                    json_object_set_new(msg, "content",
                                        ncalls && pp.content_len == 0
                                            ? json_null()
                                            : serve_json_bytes(pp.content, pp.content_len));
                    if (ncalls) json_object_set_new(msg, "tool_calls", tool_calls_json(&pp, 0));
                }
                if (pp.reasoning)
                    json_object_set_new(msg, "reasoning_content",
                                        serve_json_bytes(pp.reasoning, strlen(pp.reasoning)));
                al_chat_parsed_free(&pp);
            } else {
                json_object_set_new(msg, "content", serve_json_bytes(text, s->text.len));
            }
            if (!json_object_get(msg, "tool_calls"))
                json_object_set_new(msg, "tool_calls", json_array());
            ch = json_pack("{s:i,s:o,s:o,s:s,s:o}", "index", i, "message", msg, "logprobs",
                           c->logprobs ? chat_logprobs(sc, c, s, 0, s->n) : json_null(),
                           "finish_reason", finish_name(s, c, ncalls > 0), "stop_reason",
                           stop_reason_json(s));
        } else {
            ch = json_pack("{s:i,s:o,s:o,s:s,s:o}", "index", i, "text",
                           serve_json_bytes(text, s->text.len), "logprobs",
                           c->logprobs ? completion_logprobs(sc, c, s, 0, s->n, 0) : json_null(),
                           "finish_reason", finish_name(s, c, 0), "stop_reason",
                           stop_reason_json(s));
            if (c->return_token_ids)
                json_object_set_new(ch, "prompt_token_ids", serve_json_ids(r->prompt, r->nprompt));
        }
        if (c->return_token_ids) json_object_set_new(ch, "token_ids", serve_json_ids(s->ids, s->n));
        json_array_append_new(choices, ch);
    }
    json_t *o = json_pack("{s:s,s:s,s:I,s:s,s:o,s:o,s:I}", "id", c->id, "object",
                          c->chat ? "chat.completion" : "text_completion", "created",
                          (json_int_t)c->created, "model", sc->name, "choices", choices, "usage",
                          serve_response_usage(r), "policy_version", (json_int_t)r->policy_version);
    if (c->chat && c->return_token_ids)
        json_object_set_new(o, "prompt_token_ids", serve_json_ids(r->prompt, r->nprompt));
    return o;
}

static void sse_send(al_httpd_req *req, json_t *o)
{
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    if (!s) return;
    size_t n = strlen(s);
    char *b = malloc(n + 9);
    if (b) {
        memcpy(b, "data: ", 6);
        memcpy(b + 6, s, n);
        memcpy(b + 6 + n, "\n\n", 2);
        al_httpd_send_chunk(req, b, n + 8);
        free(b);
    }
    free(s);
}

/* The members vLLM adds to a Response with "enable_response_messages": the rendered prompt
 * and what was generated, each as text and token ids. Under r->lock. */
json_t *serve_response_messages(http_call *c)
{
    al_serve_req *r = c->r;
    al_serve_seq *s = &r->seqs[0];
    char *pt = NULL;
    size_t pl = 0;
    if (al_tokenizer_decode(c->sc->tok, r->prompt, (size_t)r->nprompt, 0, &pt, &pl) != 0)
        return NULL;
    json_t *o = json_pack(
        "{s:[{s:s,s:o,s:o}],s:[{s:s,s:o,s:o}]}", "input_messages", "type", "raw_message_tokens",
        "message", serve_json_bytes(pt, pl), "tokens", serve_json_ids(r->prompt, r->nprompt),
        "output_messages", "type", "raw_message_tokens", "message",
        serve_json_bytes(s->text.data ? s->text.data : "", s->text.len), "tokens",
        serve_json_ids(s->ids, s->n));
    free(pt);
    return o;
}

/* Sends one chat completion chunk, or on /v1/responses the agent's events it becomes
 * (takes the reference to o). */
void serve_response_emit(http_call *c, json_t *o)
{
    if (!c->xl) {
        sse_send(c->req, o);
        return;
    }
    al_buf out = {0};
    if (al_xl_chunk(c->xl, o, &out) != 0) al_log_warn(COMP, "out of memory translating a stream");
    json_decref(o);
    if (out.len) al_httpd_send_chunk(c->req, out.data, out.len);
    al_buf_free(&out);
}

/* The end of a /v1/responses stream: the closing events (error: response.failed). Under
 * r->lock. */
void serve_response_emit_end(http_call *c, const char *error)
{
    if (c->response_messages && !error) al_xl_set_final_members(c->xl, serve_response_messages(c));
    al_buf out = {0};
    if (al_xl_end(c->xl, error, &out) != 0) al_log_warn(COMP, "out of memory translating a stream");
    if (out.len) al_httpd_send_chunk(c->req, out.data, out.len);
    al_buf_free(&out);
}

json_t *serve_response_chunk(http_call *c, json_t *choices)
{
    return json_pack("{s:s,s:s,s:I,s:s,s:o,s:I}", "id", c->id, "object",
                     c->chat ? "chat.completion.chunk" : "text_completion", "created",
                     (json_int_t)c->created, "model", c->sc->name, "choices", choices,
                     "policy_version", (json_int_t)c->r->policy_version);
}

/* Sends one chunk for choice i: tokens [from, to), text up to byte tto of the choice's text,
 * and the finish when `ending`. Under r->lock. */
static void stream_chunk(http_call *c, int i, int from, int to, size_t tto, int ending)
{
    serve_ctx *sc = c->sc;
    al_serve_req *r = c->r;
    al_serve_seq *s = &r->seqs[i];
    size_t tfrom = c->sent_text[i];
    if (tto < tfrom) tto = tfrom;
    const char *txt = s->text.data ? s->text.data + tfrom : "";
    size_t tl = tto - tfrom;
    json_t *ch;
    if (c->chat) {
        json_t *delta = json_object();
        if (c->parse_tools || c->parse_reasoning) {
            al_chat_delta d = {0};
            if (al_chat_stream_push(&c->cs[i], txt, tl, &d) == 0) {
                if (d.content_len)
                    json_object_set_new(delta, "content", serve_json_bytes(d.content, d.content_len));
                if (d.reasoning_len)
                    json_object_set_new(delta, "reasoning_content",
                                        serve_json_bytes(d.reasoning, d.reasoning_len));
            }
        } else if (tl) {
            json_object_set_new(delta, "content", serve_json_bytes(txt, tl));
        }
        int ncalls = 0;
        if (ending && (c->parse_tools || c->parse_reasoning)) {
            al_chat_parsed pp = {0};
            if (al_chat_stream_finish(&c->cs[i], &pp) == 0) {
                if (pp.content_len) {
                    json_t *prev = json_object_get(delta, "content");
                    char *cat = NULL;
                    size_t pl = prev ? json_string_length(prev) : 0;
                    cat = malloc(pl + pp.content_len + 1);
                    if (prev) memcpy(cat, json_string_value(prev), pl);
                    memcpy(cat + pl, pp.content, pp.content_len);
                    json_object_set_new(delta, "content", serve_json_bytes(cat, pl + pp.content_len));
                    free(cat);
                }
                if (pp.reasoning && *pp.reasoning)
                    json_object_set_new(delta, "reasoning_content",
                                        serve_json_bytes(pp.reasoning, strlen(pp.reasoning)));
                if (pp.n_calls && c->parse_tools) {
                    json_object_set_new(delta, "tool_calls", tool_calls_json(&pp, 1));
                    ncalls = (int)pp.n_calls;
                }
                al_chat_parsed_free(&pp);
            }
        }
        ch = json_pack("{s:i,s:o,s:o}", "index", i, "delta", delta, "logprobs",
                       c->logprobs && to > from ? chat_logprobs(sc, c, s, from, to) : json_null());
        json_object_set_new(ch, "finish_reason",
                            ending ? json_string(finish_name(s, c, ncalls > 0)) : json_null());
        if (ending) json_object_set_new(ch, "stop_reason", stop_reason_json(s));
    } else {
        ch = json_pack("{s:i,s:o,s:o}", "index", i, "text", serve_json_bytes(txt, tl), "logprobs",
                       c->logprobs && to > from ? completion_logprobs(sc, c, s, from, to, tfrom)
                                                : json_null());
        json_object_set_new(ch, "finish_reason",
                            ending ? json_string(finish_name(s, c, 0)) : json_null());
        json_object_set_new(ch, "stop_reason", ending ? stop_reason_json(s) : json_null());
        if (c->return_token_ids && from == 0)
            json_object_set_new(ch, "prompt_token_ids", serve_json_ids(r->prompt, r->nprompt));
    }
    if (c->return_token_ids)
        json_object_set_new(ch, "token_ids", serve_json_ids(s->ids + from, to - from));
    serve_response_emit(c, serve_response_chunk(c, json_pack("[o]", ch)));
    c->sent_tok[i] = to, c->sent_text[i] = tto;
}

/* Sends what is new since the last call for every choice. Under r->lock. Returns 1 when
 * every choice has sent its end. */
int serve_response_stream_progress(http_call *c)
{
    serve_ctx *sc = c->sc;
    al_serve_req *r = c->r;
    if (!c->started) {
        serve_reply_version_header(c->req, r->policy_version);
        al_httpd_add_header(c->req, "Cache-Control", "no-cache");
        al_httpd_send_start(c->req, 200, "text/event-stream");
        c->started = 1;
        serve_reply_count(sc, 200);
        if (c->chat) {
            for (int i = 0; i < r->nseq; i++) {
                json_t *ch = json_pack("{s:i,s:{s:s,s:s},s:n,s:n}", "index", i, "delta", "role",
                                       "assistant", "content", "", "logprobs", "finish_reason");
                json_t *o = serve_response_chunk(c, json_pack("[o]", ch));
                if (c->return_token_ids && i == 0)
                    json_object_set_new(o, "prompt_token_ids", serve_json_ids(r->prompt, r->nprompt));
                serve_response_emit(c, o);
            }
        }
    }
    int all = 1;
    for (int i = 0; i < r->nseq; i++) {
        al_serve_seq *s = &r->seqs[i];
        if (c->finished_sent[i]) continue;
        int ending = s->finish != AL_SERVE_RUNNING;
        /* one chunk per new token (as vLLM streams), the last one carrying the finish */
        int to = s->n;
        while (c->sent_tok[i] < to || (ending && !c->finished_sent[i])) {
            int t = c->sent_tok[i];
            int last = t + 1 >= to;
            size_t tend = t < to ? s->text_end[t] : s->text.len;
            if (last || tend > s->safe_len) tend = s->safe_len;
            stream_chunk(c, i, t, t < to ? t + 1 : t, tend, ending && last);
            if (ending && last) c->finished_sent[i] = 1;
        }
        if (!c->finished_sent[i]) all = 0;
    }
    return all;
}

