/*
 * call.c: a call's lifecycle over both upstream clients. Owns a call from its admission
 * (draining, spool room, the rewritten request from capture.c, its sequence number, the
 * upstream headers and the sticky choice of upstream) through the transfer on the proxy's
 * own keep-alive client (upstream.c) or on libcurl's multi-socket interface driven by the
 * same loop (curl's hiperfifo wiring; per-transfer state in CURLOPT_PRIVATE), the failover
 * to the next upstream on a connection error before any byte, back-pressure on a stream the
 * agent reads slowly, to the answer, the access-log line and the span. A call outlives its
 * agent's connection: it goes on for its span.
 */
#include "proxy.h"

#include "http/httpd.h"

#include "core/hash.h"
#include "core/log.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* s copied into dst[0..n) and cut to fit (n > 0), as snprintf("%s") did, without the printf
 * machinery: it runs twice per call. */
static void copy_cut(char *dst, size_t n, const char *s)
{
    size_t l = strnlen(s, n - 1);
    memcpy(dst, s, l);
    dst[l] = '\0';
}

static char *slice_dup(al_slice s)
{
    char *r = malloc(s.n + 1);
    if (!r) return NULL;
    memcpy(r, s.p, s.n);
    r[s.n] = '\0';
    return r;
}

static void call_free(call *k)
{
    if (k->cprev)
        k->cprev->cnext = k->cnext;
    else if (k->px->calls == k)
        k->px->calls = k->cnext;
    if (k->cnext) k->cnext->cprev = k->cprev;
    if (k->easy) {
        proxy *px = k->px;
        curl_multi_remove_handle(px->multi, k->easy);
        if (px->n_easy_pool < AL_ARRAY_LEN(px->easy_pool))
            px->easy_pool[px->n_easy_pool++] = k->easy;
        else
            curl_easy_cleanup(k->easy);
    }
    al_upc_cancel(k->uc);
    curl_slist_free_all(k->hdrs);
    free(k->agent);
    free(k->method_path);
    free(k->req_json);
    free(k->up_body);
    free(k->model);
    al_buf_free(&k->body);
    if (k->px->strip.cap > (4u << 20)) al_buf_free(&k->px->strip); /* one huge answer */
    free(k->prompt.v);
    free(k->resp_ids.v);
    free(k->lps.v);
    free(k->finish);
    al_buf_free(&k->content);
    json_decref(k->tools);
    free(k->s_id);
    free(k->s_model);
    free(k->error);
    al_xl_free(k->xl);
    al_buf_free(&k->xout);
    free(k->agent_answer);
    json_decref(k->nat_msg);
    free(k);
}

/* The agent went away: the call goes on for the span, its answer is dropped. */
void px_call_detach(call *k)
{
    k->c = NULL;
    px_call_resume(k);
}

/* Resumes a paused stream once the agent has taken what was waiting. Returns 1 when the
 * transfer was paused (the caller's connection may have changed state meanwhile). */
int px_call_resume(call *k)
{
    if (!k->paused || (!k->easy && !k->uc)) return 0;
    k->paused = 0;
    if (k->uc)
        al_upc_resume(k->uc);
    else
        curl_easy_pause(k->easy, CURLPAUSE_CONT);
    return 1;
}

static void extra_headers(call *k, char *buf, size_t n)
{
    int64_t now = al_mono_us();
    int64_t overhead = k->pre_us + (k->done_mono ? now - k->done_mono : 0);
    if (overhead < 0) overhead = 0;
    size_t rl = strlen(k->id.rollout);
    if (n < rl + 80) {
        buf[0] = '\0';
    } else {
        char *o = al_put_mem(buf, "x-arclight-overhead-us: ", 24);
        o = al_put_u64(o, (uint64_t)overhead);
        o = al_put_mem(o, "\r\nx-arclight-rollout: ", 22);
        o = al_put_mem(o, k->id.rollout, rl);
        o = al_put_mem(o, "\r\n", 3); /* with its NUL */
    }
    al_histogram_observe(k->px->h_overhead, (double)overhead / 1e6);
}

void px_redact(const proxy *px, char *p, size_t n)
{
    const char *key = px->cfg.upstream_key;
    size_t kl = key ? strlen(key) : 0;
    if (kl < 8 || n < kl) return;
    for (size_t i = 0; i + kl <= n; i++)
        if (p[i] == key[0] && memcmp(p + i, key, kl) == 0) {
            memset(p + i, '*', kl);
            i += kl - 1;
        }
}

static size_t write_cb(char *ptr, size_t size, size_t nmemb, void *ud)
{
    call *k = ud;
    size_t n = size * nmemb;
    /* back-pressure: with 1 MiB of a stream waiting for the agent, pause the upstream
     * transfer (curl hands the same bytes again on resume, px_call_resume) */
    if (k->headers_sent && k->c && px_conn_pending(k->c) > (1u << 20)) {
        if (!k->paused)
            al_log_debug(COMP,
                         "rollout %s: the agent reads slower than the upstream writes; "
                         "upstream paused",
                         k->id.rollout);
        k->paused = 1;
        return CURL_WRITEFUNC_PAUSE;
    }
    if (!k->first_byte_us) k->first_byte_us = al_now_us();
    if (k->status == 0 && k->easy) curl_easy_getinfo(k->easy, CURLINFO_RESPONSE_CODE, &k->status);
    size_t before = k->body.len;
    if (al_buf_append(&k->body, ptr, n)) return 0;
    /* the key is masked before anything reads these bytes (the agent's answer, the span, the
     * log); from a key's length back, so that one split across two writes is caught too */
    {
        size_t kl = k->px->cfg.upstream_key ? strlen(k->px->cfg.upstream_key) : 0;
        size_t from = before > kl ? before - kl : 0;
        px_redact(k->px, (char *)k->body.data + from, k->body.len - from);
    }
    if (k->stream && k->status == 200 && strncasecmp(k->ctype, "text/event-stream", 17) == 0) {
        if (!k->headers_sent) {
            k->headers_sent = 1;
            k->done_mono = al_mono_us(); /* overhead: request side + this write */
            if (k->c) {
                char extra[512];
                extra_headers(k, extra, sizeof extra);
                px_conn_stream_begin(k->c, 200, k->ctype, extra);
            }
            k->done_mono = 0;
        }
        px_stream_process(k, 0);
    }
    if (k->body.len > (256u << 20)) return 0; /* an upstream gone mad */
    return n;
}

static size_t header_cb(char *buf, size_t size, size_t nitems, void *ud)
{
    call *k = ud;
    size_t n = size * nitems;
    if (!k->first_byte_us) k->first_byte_us = al_now_us();
    if (n > 5 && strncmp(buf, "HTTP/", 5) == 0) { /* a new response (after a 100) */
        k->ctype[0] = '\0';
        k->status = 0;
    } else if (n > 13 && strncasecmp(buf, "content-type:", 13) == 0) {
        size_t s = 13, e = n;
        while (s < e && buf[s] == ' ')
            s++;
        while (e > s && (buf[e - 1] == '\r' || buf[e - 1] == '\n' || buf[e - 1] == ' '))
            e--;
        snprintf(k->ctype, sizeof k->ctype, "%.*s", (int)(e - s), buf + s);
    } else if (n > 25 && strncasecmp(buf, "x-arclight-policy-version:", 26) == 0) {
        k->policy_version = strtoll(buf + 26, NULL, 10);
    }
    return n;
}

static int call_start(call *k);

/* The upstream base URL without any user:password@ part, for spans and logs. */
void px_url_public(const char *url, char *out, size_t n)
{
    const char *s = strstr(url, "://"), *at;
    const char *host = s ? s + 3 : url;
    const char *slash = strchr(host, '/');
    at = strchr(host, '@');
    if (at && (!slash || at < slash))
        snprintf(out, n, "%.*s%s", (int)(host - url), url, at + 1);
    else
        snprintf(out, n, "%s", url);
}

static void access_log(call *k, int status)
{
    if (!k->px->cfg.access_log) return;
    const char *up = k->px->up_public[k->up_idx];
    al_log_info("proxy.access",
                "%s status=%d upstream_status=%ld task=%s rollout=%s attempt=%d seq=%" PRId64
                " stream=%d upstream=%s ms=%.3f overhead_us=%" PRId64 " prompt_tokens=%zu "
                "response_tokens=%zu policy_version=%" PRId64 "%s%s%s",
                k->method_path, status, k->status, k->id.task, k->id.rollout, k->id.attempt, k->seq,
                k->stream, up, (double)(k->end_us - k->start_us) / 1000.0, k->pre_us, k->prompt.n,
                k->resp_ids.n, k->policy_version, k->id.eval ? " eval=1" : "",
                k->error ? " error=" : "", k->error ? k->error : "");
}

static void upstream_error_message(call *k)
{
    json_t *o = json_loadb((const char *)k->body.data, k->body.len, JSON_ALLOW_NUL, NULL);
    const char *m = json_string_value(json_object_get(json_object_get(o, "error"), "message"));
    if (!m) m = json_string_value(json_object_get(o, "message"));
    char buf[600];
    snprintf(buf, sizeof buf, "upstream answered %ld%s%.*s", k->status, m ? ": " : "",
             m ? (int)al_utf8_cut(m, strlen(m), 500) : 0, m ? m : "");
    k->error = strdup(buf);
    json_decref(o);
}

/* A transfer ended: fail over on a connection error before any byte, else answer the agent
 * (whole response, or the end of the stream), publish the span, free the call. */
void px_call_done(call *k, CURLcode rc)
{
    proxy *px = k->px;
    k->done_mono = al_mono_us();
    if (k->status == 0 && k->easy) curl_easy_getinfo(k->easy, CURLINFO_RESPONSE_CODE, &k->status);
    double up_s = (double)(k->done_mono - k->sent_mono) / 1e6;
    al_histogram_observe(px->h_upstream, up_s);
    if (rc != CURLE_OK && !k->first_byte_us &&
        (rc == CURLE_COULDNT_CONNECT || rc == CURLE_COULDNT_RESOLVE_HOST ||
         rc == CURLE_GOT_NOTHING || rc == CURLE_SEND_ERROR) &&
        k->tries < (int)px->cfg.n_upstreams && !px->draining) {
        char up[512];
        px_url_public(px->cfg.upstreams[k->up_idx], up, sizeof up);
        al_log_warn(COMP, "upstream %s failed (%s); trying the next one", up,
                    k->errbuf[0] ? k->errbuf : curl_easy_strerror(rc));
        if (k->easy) {
            curl_multi_remove_handle(px->multi, k->easy);
            curl_easy_cleanup(k->easy);
            k->easy = NULL;
        }
        px_fleet_count(px, k->up_idx, 0, 1);
        k->up_idx = px_fleet_pick(px, k->id.rollout, k->up_idx);
        if (call_start(k) == 0) return;
    }
    k->end_us = al_now_us();
    px_fleet_count(px, k->up_idx, rc == CURLE_OK && k->status < 500, 0);
    int agent_status;
    conn *c = k->c;
    if (rc != CURLE_OK) {
        char up[512];
        px_url_public(px->cfg.upstreams[k->up_idx], up, sizeof up);
        char msg[900];
        snprintf(msg, sizeof msg, "upstream %s: %s", up,
                 k->errbuf[0] ? k->errbuf : curl_easy_strerror(rc));
        k->error = strdup(msg);
        if (k->headers_sent) {
            /* mid-stream: all we can do is end the stream (a translated one with its API's
             * failure event) */
            px_stream_process(k, 1);
            if (k->xl) px_xl_stream_end(k, msg);
            agent_status = 200;
            if (c) {
                px_conn_close_after(c); /* the agent sees a stream that ended early */
                px_conn_stream_end(c);
            }
        } else {
            agent_status = rc == CURLE_OPERATION_TIMEDOUT ? 504 : 502;
            if (k->xl) {
                free(k->agent_answer);
                k->agent_answer =
                    al_xl_error_body(k->api, agent_status, "upstream_error", NULL, msg);
            }
            if (c)
                px_conn_error(c, agent_status, "upstream_error",
                              agent_status == 504 ? "upstream_timeout" : "upstream_unavailable",
                              "%s", msg);
        }
        if (!k->status) k->status = 0;
    } else if (k->headers_sent) {
        px_stream_process(k, 1);
        if (k->xl) px_xl_stream_end(k, NULL); /* a stream without its [DONE]: ended here */
        agent_status = 200;
        if (c) px_conn_stream_end(c);
    } else if (k->native && k->capture && k->status >= 200 && k->status < 300) {
        k->first_token_us = k->end_us;
        char extra[512];
        extra_headers(k, extra, sizeof extra);
        al_slice agent;
        agent_status = px_native_answer(k, &agent);
        if (c)
            px_conn_reply(c, agent_status, k->ctype[0] ? k->ctype : "application/json", extra,
                          agent.p, agent.n);
    } else if (k->route->count && !k->native) {
        char *b = NULL;
        agent_status = px_xl_count_answer(k, &b);
        if (c) px_conn_reply(c, agent_status, "application/json", NULL, b ? b : "{}", b ? strlen(b) : 2);
        free(b);
    } else if (k->xl) {
        if (k->status >= 200 && k->status < 300) {
            px_capture_fast(k, (const char *)k->body.data, k->body.len, NULL);
            k->first_token_us = k->end_us;
        } else if (k->status >= 400) {
            upstream_error_message(k);
        }
        char extra[512];
        extra_headers(k, extra, sizeof extra);
        const char *b = "";
        agent_status = px_xl_answer(k, &b);
        if (c) px_conn_reply(c, agent_status, "application/json", extra, b, strlen(b));
    } else {
        agent_status = (int)k->status;
        const char *ct = k->ctype[0] ? k->ctype : "application/json";
        long sl = -1;
        if (k->status >= 200 && k->status < 300 && k->capture) {
            /* the strip pass validates the whole answer; then the fields are read off it */
            px_answer_parts parts;
            sl = px_strip_for_agent(k, (const char *)k->body.data, k->body.len, 0, &parts);
            if (sl >= 0) {
                px_capture_fast(k, (const char *)k->body.data, k->body.len, &parts);
                k->first_token_us = k->end_us;
            } else {
                k->error = strdup("upstream answered with a body that is not JSON");
            }
        } else if (k->status >= 400) {
            upstream_error_message(k);
        }
        char *am = NULL; /* the models list in Anthropic's shape */
        if (k->route->models && k->api == AL_API_MESSAGES && k->status == 200)
            am = px_models_anthropic((const char *)k->body.data, k->body.len);
        if (c && am) {
            px_conn_reply(c, agent_status, "application/json", NULL, am, strlen(am));
        } else if (c) {
            char extra[512];
            extra_headers(k, extra, sizeof extra);
            if (sl >= 0)
                px_conn_reply(c, agent_status, ct, extra, (char *)px->strip.data, (size_t)sl);
            else
                px_conn_reply(c, agent_status, ct, extra, (char *)k->body.data, k->body.len);
        }
        free(am);
    }
    if (c) c->call = NULL;
    if (k->capture) {
        access_log(k, agent_status);
        px_call_span(k);
    }
    px->inflight--;
    al_gauge_set(px->g_inflight, px->inflight);
    call_free(k);
}

static void check_multi_info(proxy *px)
{
    CURLMsg *msg;
    int left;
    while ((msg = curl_multi_info_read(px->multi, &left))) {
        if (msg->msg != CURLMSG_DONE) continue;
        call *k = NULL;
        CURLcode rc = msg->data.result;
        curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **)&k);
        if (k) px_call_done(k, rc);
    }
}

/* Configures an easy handle for k's current upstream and adds it to the multi. */
static int call_start(call *k)
{
    proxy *px = k->px;
    k->tries++;
    const char *base = px->cfg.upstreams[k->up_idx];
    const px_route *rt = k->route;
    const char *path = k->native ? rt->upstream_native : rt->upstream;
    int get = rt->upstream_method[0] == 'G'; /* no body */
    k->body.len = 0;
    k->status = 0;
    k->errbuf[0] = '\0';
    if (px->upc && al_upc_pool_serves(px->upc, k->up_idx)) {
        /* the curl header list, less curl's "Name:" removals, as header lines */
        char hdrs[2400];
        size_t hl = 0;
        hdrs[0] = '\0';
        for (struct curl_slist *h = k->hdrs; h; h = h->next) {
            size_t n = strlen(h->data);
            if (!n || h->data[n - 1] == ':' || hl + n + 3 > sizeof hdrs) continue;
            memcpy(hdrs + hl, h->data, n);
            memcpy(hdrs + hl + n, "\r\n", 3);
            hl += n + 2;
        }
        k->sent_mono = al_mono_us();
        if (k->tries == 1) k->pre_us = k->sent_mono - k->t0_mono;
        long total_ms = px->cfg.upstream_timeout_ms;
        k->uc = al_upc_start(px->upc, k->up_idx, rt->upstream_method, path, hdrs,
                             get ? NULL : k->up_body, get ? 0 : k->up_len,
                             px->cfg.connect_timeout_ms, total_ms, k);
        return k->uc ? 0 : -1;
    }
    if (px->n_easy_pool) {
        k->easy = px->easy_pool[--px->n_easy_pool];
        curl_easy_reset(k->easy);
    } else {
        k->easy = curl_easy_init();
    }
    if (!k->easy) return -1;
    snprintf(k->url, sizeof k->url, "%s%s", base, path);
    k->body.len = 0;
    k->status = 0;
    k->errbuf[0] = '\0';
    CURL *e = k->easy;
    curl_easy_setopt(e, CURLOPT_URL, k->url);
    curl_easy_setopt(e, CURLOPT_PRIVATE, k);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, write_cb);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, k);
    curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, header_cb);
    curl_easy_setopt(e, CURLOPT_HEADERDATA, k);
    curl_easy_setopt(e, CURLOPT_ERRORBUFFER, k->errbuf);
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_TCP_NODELAY, 1L);
    curl_easy_setopt(e, CURLOPT_HTTP_VERSION, CURL_HTTP_VERSION_1_1);
    curl_easy_setopt(e, CURLOPT_FOLLOWLOCATION, 0L);
#if LIBCURL_VERSION_NUM >= 0x075500
    curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https");
#endif
    curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, px->cfg.connect_timeout_ms);
    curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, px->cfg.upstream_timeout_ms);
    if (!get) {
        curl_easy_setopt(e, CURLOPT_POST, 1L);
        curl_easy_setopt(e, CURLOPT_POSTFIELDS, k->up_body);
        curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)k->up_len);
    }
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, k->hdrs);
    k->sent_mono = al_mono_us();
    if (k->tries == 1) k->pre_us = k->sent_mono - k->t0_mono;
    if (curl_multi_add_handle(px->multi, e) != CURLM_OK) {
        curl_easy_cleanup(e);
        k->easy = NULL;
        return -1;
    }
    return 0;
}

/* The own client's callbacks: the same handling as curl's header, write and done. */
static void upc_on_head(void *ud, int status, const char *ctype, int64_t policy_version)
{
    call *k = ud;
    if (!k->first_byte_us) k->first_byte_us = al_now_us();
    k->status = status;
    copy_cut(k->ctype, sizeof k->ctype, ctype);
    if (policy_version >= 0) k->policy_version = policy_version;
}

static size_t upc_on_body(void *ud, const char *p, size_t n)
{
    size_t r = write_cb((char *)p, 1, n, ud);
    return r == CURL_WRITEFUNC_PAUSE ? AL_UPC_PAUSE : r;
}

static void upc_on_done(void *ud, al_upc_err err, const char *msg)
{
    call *k = ud;
    k->uc = NULL;
    copy_cut(k->errbuf, sizeof k->errbuf, msg ? msg : "");
    static const CURLcode map[] = {
        [AL_UPC_OK] = CURLE_OK,
        [AL_UPC_CONNECT] = CURLE_COULDNT_CONNECT,
        [AL_UPC_NOTHING] = CURLE_GOT_NOTHING,
        [AL_UPC_SEND] = CURLE_SEND_ERROR,
        [AL_UPC_RECV] = CURLE_RECV_ERROR,
        [AL_UPC_PARTIAL] = CURLE_PARTIAL_FILE,
        [AL_UPC_TIMEOUT] = CURLE_OPERATION_TIMEDOUT,
        [AL_UPC_PROTOCOL] = CURLE_WEIRD_SERVER_REPLY,
        [AL_UPC_ABORTED] = CURLE_WRITE_ERROR,
    };
    px_call_done(k, (unsigned)err < AL_ARRAY_LEN(map) ? map[err] : CURLE_RECV_ERROR);
}

/* Keeps the agent's request (the span's copy) and takes the upstream body up (up_len bytes,
 * NULL: none could be made). -1 after answering 500 and freeing k (and up). */
static int keep_bodies(call *k, conn *c, char *up, size_t up_len)
{
    k->req_json = slice_dup(c->body);
    if (!up || !k->req_json) {
        free(up);
        call_free(k);
        px_conn_error(c, 500, "server_error", "out_of_memory", "out of memory");
        return -1;
    }
    k->up_body = up;
    k->up_len = up_len;
    return 0;
}

/* A translated call's request (apis.c: prepare is px_xl_prepare or px_xl_prepare_count):
 * 0 with *up, or -1 after answering c (415, the API's refusal in its shape, 500). */
static int xl_prepare(call *k, conn *c,
                      int (*prepare)(call *, al_slice, char **, size_t *, al_xl_err *), al_api api,
                      char **up, size_t *up_len)
{
    if (!px_conn_is_json(c)) {
        px_conn_error(c, 415, "invalid_request_error", "unsupported_media_type",
                      "Content-Type must be application/json");
        return -1;
    }
    al_xl_err err;
    int rc = prepare(k, c->body, up, up_len, &err);
    if (rc == -1) {
        char *b = al_xl_error_body(api, err.status, err.type, err.code, err.message);
        px_conn_reply_error(c, err.status, b ? b : "{\"error\":{\"message\":\"error\"}}",
                            err.message);
        free(b);
    } else if (rc != 0) {
        px_conn_error(c, 500, "server_error", "out_of_memory", "out of memory");
    }
    return rc ? -1 : 0;
}

/* The agent's bytes of a stream (capture.c, apis.c): to its connection. */
static void call_emit(call *k, const char *data, size_t len)
{
    if (k->c) px_conn_stream_write(k->c, data, len);
}

/* Whether c's request may become a call: not while draining, with room in the spool, and
 * with what the span takes from the agent in UTF-8. 0, or -1 after answering c. */
static int call_admit(conn *c)
{
    proxy *px = c->px;
    if (px->draining) {
        px_conn_error(c, 503, "server_error", "shutting_down", "the proxy is shutting down");
        return -1;
    }
    if (al_spool_full(px->spool, c->body.n * 2 + 4096)) {
        al_counter_inc(px->rejected_spool_full);
        al_spool_stats st;
        al_spool_get_stats(px->spool, &st);
        px_conn_error(c, 503, "server_error", "spool_full",
                      "the proxy's span spool is full (%" PRIu64 " bytes, %" PRIu64
                      " spans waiting for Kafka at %s); calls resume when the broker takes them",
                      st.bytes, st.records, px->cfg.spool_dir);
        return -1;
    }
    /* what the span takes from the agent must be UTF-8 (an Avro string that is not makes a
     * span no reader decodes), and JSON is UTF-8 anyway (RFC 8259): refused at the door */
    const al_slice *ag = al_http_header_get(c->head, "x-arclight-agent");
    if (ag && px_utf8_invalid(ag->p, ag->n)) {
        px_conn_error(c, 400, "invalid_request_error", "invalid_header",
                      "X-Arclight-Agent is not valid UTF-8");
        return -1;
    }
    if (px_utf8_invalid(c->body.p, c->body.n)) {
        px_conn_error(c, 400, "invalid_request_error", "invalid_json",
                      "the request body is not valid UTF-8 (JSON is UTF-8)");
        return -1;
    }
    return 0;
}

/* The body to send upstream (k->up_body) for c's request by k's route: passed through
 * (native), translated (count_tokens, Responses, Messages) or rewritten for capture; the
 * agent's own request kept for the span. 0, or -1 after answering c and freeing k. */
static int call_request_body(call *k, conn *c)
{
    if (k->native) {
        size_t up_len = 0;
        char *up = NULL;
        json_t *req = NULL;
        if (k->capture && !(req = px_conn_body_json(c, 1))) {
            call_free(k); /* answered: 415 or 400 */
            return -1;
        }
        up = req ? px_native_request(k, req) : slice_dup(c->body);
        up_len = up && req ? strlen(up) : c->body.n;
        json_decref(req);
        if (!up) {
            px_conn_error(c, 500, "server_error", "out_of_memory", "out of memory");
            call_free(k);
            return -1;
        }
        if (keep_bodies(k, c, up, up_len)) return -1;
    } else if (k->route->count) {
        size_t up_len = 0;
        char *up = NULL;
        if (xl_prepare(k, c, px_xl_prepare_count, AL_API_MESSAGES, &up, &up_len) != 0) {
            call_free(k); /* answered */
            return -1;
        }
        k->up_body = up;
        k->up_len = up_len;
    } else if (k->capture && k->api) {
        size_t up_len = 0;
        char *up = NULL;
        if (xl_prepare(k, c, px_xl_prepare, k->api, &up, &up_len) != 0) {
            call_free(k); /* answered */
            return -1;
        }
        if (keep_bodies(k, c, up, up_len)) return -1;
    } else if (k->capture) {
        size_t up_len = 0;
        char *up = px_conn_is_json(c) ? px_rewrite_fast(k, c->body.p, c->body.n, &up_len) : NULL;
        if (!up) {
            free(k->model);
            k->model = NULL;
            k->stream = k->want_logprobs = k->want_token_ids = k->injected_usage = 0;
            json_t *req = px_conn_body_json(c, 1);
            if (!req) {
                call_free(k);
                return -1;
            }
            up = px_rewrite_request(k, req);
            json_decref(req);
            up_len = up ? strlen(up) : 0;
        }
        if (keep_bodies(k, c, up, up_len)) return -1;
    }
    return 0;
}

/* The upstream request's headers (k->hdrs): JSON, no Expect, the agent's API's own headers
 * when passed through, and the upstream key or the agent's own when forwarded. */
static void call_upstream_headers(call *k, const conn *c)
{
    proxy *px = k->px;
    k->hdrs = curl_slist_append(NULL, "Content-Type: application/json");
    k->hdrs = curl_slist_append(k->hdrs, "Expect:");
    if (k->native && k->api == AL_API_MESSAGES) { /* the agent's API's own headers */
        static const char *const fwd[] = {"anthropic-version", "anthropic-beta"};
        for (size_t i = 0; i < AL_ARRAY_LEN(fwd); i++) {
            const al_slice *v = al_http_header_get(c->head, fwd[i]);
            char h[600];
            if (v && v->n < 500 && !memchr(v->p, '\r', v->n) && !memchr(v->p, '\n', v->n)) {
                snprintf(h, sizeof h, "%s: %.*s", fwd[i], (int)v->n, v->p);
                k->hdrs = curl_slist_append(k->hdrs, h);
            }
        }
    }
    al_slice tok;
    if (px->cfg.upstream_key) {
        char h[1100];
        snprintf(h, sizeof h, "Authorization: Bearer %s", px->cfg.upstream_key);
        k->hdrs = curl_slist_append(k->hdrs, h);
    } else if (px->cfg.forward_agent_auth && px_api_key(c->head, &tok) && tok.n < 1000 &&
               !px_session_find(px, tok.p, tok.n)) {
        char h[1100];
        snprintf(h, sizeof h, "Authorization: Bearer %.*s", (int)tok.n, tok.p);
        k->hdrs = curl_slist_append(k->hdrs, h);
    }
}

void px_start_llm_call(conn *c, ident *id)
{
    proxy *px = c->px;
    if (call_admit(c) != 0 || px_fleet_admit(px, c, id) != 0) return;
    const al_slice *ag = al_http_header_get(c->head, "x-arclight-agent");
    call *k = calloc(1, sizeof *k);
    if (!k) {
        px_conn_error(c, 500, "server_error", "out_of_memory", "out of memory");
        return;
    }
    k->px = px;
    k->emit = call_emit;
    const px_route *rt = c->route;
    k->route = rt;
    k->api = rt->api;
    if (rt->models && al_http_header_get(c->head, "anthropic-version"))
        k->api = AL_API_MESSAGES; /* the list in Anthropic's shape */
    k->is_chat = rt->chat;
    k->capture = rt->capture;
    k->native = rt->native && (px->cfg.native >> k->api & 1u);
    k->policy_version = -1;
    k->id = *id;
    k->start_us = c->start_us;
    k->t0_mono = c->t0_mono;
    size_t ml = c->head->method.n > 32 ? 32 : c->head->method.n;
    size_t tl = c->head->target.n > 400 ? 400 : c->head->target.n;
    k->method_path = malloc(ml + tl + 14);
    if (k->method_path) {
        char *o = al_put_mem(k->method_path, "method=", 7);
        o = al_put_mem(o, c->head->method.p, ml);
        o = al_put_mem(o, " path=", 6);
        o = al_put_mem(o, c->head->target.p, tl);
        *o = '\0';
    }
    k->agent = ag ? slice_dup((al_slice){ag->p, al_utf8_cut(ag->p, ag->n, 128)})
                  : strdup(px->cfg.agent_name ? px->cfg.agent_name : "");
    const al_slice *tp = al_http_header_get(c->head, "traceparent");
    if (tp && tp->n == 55) {
        al_span tmp;
        px_span_init(px, &tmp, id, 0, c->head, k->trace, k->span_id, k->parent);
        k->parent_set = tmp.parent_span_id != NULL;
    } else {
        px_rand_hex(px, k->trace, 32);
    }
    if (call_request_body(k, c) != 0) return;
    if (k->capture) {
        rollout_ent *r = px_rollout_of(px, &k->id);
        if (!r) {
            call_free(k);
            px_conn_error(c, 500, "server_error", "out_of_memory", "out of memory");
            return;
        }
        k->seq = r->next_seq++;
        r->last_call_seq = k->seq;
    }
    call_upstream_headers(k, c);
    /* sticky routing: a rollout's calls go to one upstream (prefix-cache reuse) */
    k->up_idx = px_fleet_pick(px, id->rollout, -1);
    k->c = c;
    c->call = k;
    k->cnext = px->calls;
    if (px->calls) px->calls->cprev = k;
    px->calls = k;
    px->inflight++;
    al_gauge_set(px->g_inflight, px->inflight);
    if (call_start(k) != 0) {
        c->call = NULL;
        px->inflight--;
        px_conn_error(c, 500, "server_error", "internal_error", "cannot start the upstream call");
        call_free(k);
    }
}

/* ------------------------------------------------------------------------------------------
 * curl multi-socket wiring (hiperfifo)
 * ------------------------------------------------------------------------------------------ */

static void curl_event_cb(evutil_socket_t fd, short kind, void *arg)
{
    proxy *px = arg;
    int action = (kind & EV_READ ? CURL_CSELECT_IN : 0) | (kind & EV_WRITE ? CURL_CSELECT_OUT : 0);
    curl_multi_socket_action(px->multi, fd, action, &px->running);
    check_multi_info(px);
}

static void curl_timer_event(evutil_socket_t fd, short kind, void *arg)
{
    proxy *px = arg;
    (void)fd;
    (void)kind;
    curl_multi_socket_action(px->multi, CURL_SOCKET_TIMEOUT, 0, &px->running);
    check_multi_info(px);
}

static int curl_timer_cb(CURLM *m, long timeout_ms, void *arg)
{
    proxy *px = arg;
    (void)m;
    if (timeout_ms < 0) {
        evtimer_del(px->curl_timer);
    } else {
        struct timeval tv = {timeout_ms / 1000, (timeout_ms % 1000) * 1000};
        evtimer_add(px->curl_timer, &tv);
    }
    return 0;
}

static int curl_socket_cb(CURL *e, curl_socket_t s, int what, void *arg, void *sockp)
{
    proxy *px = arg;
    struct event *ev = sockp;
    (void)e;
    if (what == CURL_POLL_REMOVE) {
        if (ev) event_free(ev);
        curl_multi_assign(px->multi, s, NULL);
        return 0;
    }
    short kind = (short)((what & CURL_POLL_IN ? EV_READ : 0) |
                         (what & CURL_POLL_OUT ? EV_WRITE : 0) | EV_PERSIST);
    if (!ev) {
        ev = event_new(px->base, s, kind, curl_event_cb, px);
        if (!ev) return -1;
        curl_multi_assign(px->multi, s, ev);
    } else {
        event_del(ev);
        event_assign(ev, px->base, s, kind, curl_event_cb, px);
    }
    event_add(ev, NULL);
    return 0;
}

/* The call machinery on px->base: curl's multi handle driven by the loop, each upstream's
 * public URL, and the own client's pool (unless --upstream-client curl). 0, or -1 after
 * logging why. */
int px_calls_init(proxy *px)
{
    pconf *cf = &px->cfg;
    px->multi = curl_multi_init();
    if (!px->multi) {
        al_log_error(COMP, "cannot create the event loop");
        return -1;
    }
    px->curl_timer = evtimer_new(px->base, curl_timer_event, px);
    curl_multi_setopt(px->multi, CURLMOPT_SOCKETFUNCTION, curl_socket_cb);
    curl_multi_setopt(px->multi, CURLMOPT_SOCKETDATA, px);
    curl_multi_setopt(px->multi, CURLMOPT_TIMERFUNCTION, curl_timer_cb);
    curl_multi_setopt(px->multi, CURLMOPT_TIMERDATA, px);
    curl_multi_setopt(px->multi, CURLMOPT_MAXCONNECTS, 1024L);
    for (size_t i = 0; i < cf->n_upstreams; i++)
        px_url_public(cf->upstreams[i], px->up_public[i], sizeof px->up_public[i]);
    static const al_upc_handler upc_handler = {upc_on_head, upc_on_body, upc_on_done};
    if (!cf->curl_only) {
        px->upc = al_upc_pool_new(px->base, &upc_handler);
        if (!px->upc) {
            al_log_error(COMP, "out of memory");
            return -1;
        }
        for (size_t i = 0; i < cf->n_upstreams; i++)
            al_upc_pool_add(px->upc, (int)i, cf->upstreams[i]);
    }
    return 0;
}
