/*
 * main.c: `arclight serve`, the OpenAI-compatible policy server (HTTP on lib/http's
 * httpd, the parser and limits every arclight server shares; the engine on its own thread,
 * see engine.h; weight follower in policy.h).
 *
 *   POST /v1/chat/completions  ChatML from the tokenizer's template, tools, tool calls parsed
 *   POST /v1/completions       text or token-id prompts
 *   POST /v1/responses         the OpenAI Responses API, whole and streamed, served natively
 *                              by lib/api's translator over the chat completions path, with
 *                              vLLM's capture fields (below)
 *   GET  /v1/models, /health, /healthz, /metrics (Prometheus)
 *   POST /tokenize, /detokenize (vLLM's)
 *   with --weight-routes: SGLang's and vLLM's routes for new weights (weights_api.c)
 *
 * Responses carry what vLLM's carry for training: logprobs / top_logprobs in OpenAI's shapes
 * (raw logprobs, see model/infer.h), and with "return_token_ids": true the prompt's ids
 * ("prompt_token_ids": top level for chat, per choice for completions, as vLLM does) and
 * each choice's "token_ids". Every response names the weights that produced it: header
 * x-arclight-policy-version and "policy_version" in the JSON (each chunk when streaming).
 * On /v1/responses the token ids come back the way vLLM's Responses API gives them: with
 * "enable_response_messages": true the Response (whole, or that of response.completed) has
 * "input_messages" and "output_messages", each [{"type": "raw_message_tokens", "message":
 * the text, "tokens": the ids}] (the rendered prompt, and what was generated); logprobs with
 * "include": ["message.output_text.logprobs"] on the output_text parts and text deltas.
 *
 * Threads: the event loop never waits on the engine. The engine calls call_notify
 * (lifecycle.c) after each step, which only activates the call's event; the loop's callback
 * then reads the progress under the request's lock and writes the reply.
 *
 * Files: this page (the flags; start, run, stop), routes.c (the routes), auth.c (the API key),
 * lifecycle.c (a generation call from arrival to its last byte), responses.c (the OpenAI
 * answers), reply.c (JSON helpers and replies); serve.h is what they share. The engine
 * (engine.h), the request parser (request.h) and the weight follower (policy.h) stand apart.
 */
#include "core/cli.h"
#include "core/flags.h"
#include "core/log.h"
#include "core/util.h"
#include "http/process.h"
#include "http/server.h"
#include "model/safetensors.h"
#include "serve.h"

#include <event2/event.h>
#include <event2/thread.h>
#include <inttypes.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define MAX_BODY (64u << 20)

static void collect(al_metrics *m, void *ud)
{
    (void)m;
    serve_ctx *sc = ud;
    al_serve_engine_stats st;
    al_serve_engine_stats_get(sc->eng, &st);
    al_gauge_set(sc->g_running, st.running + st.queued);
    al_gauge_set(sc->g_kv, (double)st.kv_bytes);
    al_gauge_set(sc->g_version, (double)al_serve_engine_version(sc->eng));
    /* renders run on the API loop and on the --metrics thread: hand each new token to the
     * counter exactly once */
    static uint64_t last;
    uint64_t prev = __atomic_load_n(&last, __ATOMIC_RELAXED);
    while (st.tokens_generated > prev &&
           !__atomic_compare_exchange_n(&last, &prev, st.tokens_generated, 0, __ATOMIC_RELAXED,
                                        __ATOMIC_RELAXED)) {
    }
    if (st.tokens_generated > prev)
        al_counter_add(sc->gen_tokens, (double)(st.tokens_generated - prev));
}

static void on_drain_timeout(evutil_socket_t fd, short what, void *ud)
{
    (void)fd, (void)what;
    serve_ctx *sc = ud;
    al_log_warn(COMP, "drain timeout: cutting off the requests still in flight");
    event_base_loopbreak(sc->base);
}

/* First SIGTERM/SIGINT: stop accepting connections and let the requests in flight finish
 * (up to --drain-timeout); a second one stops at once. */
static void on_signal(al_process *p, int sig, void *ud)
{
    (void)sig;
    serve_ctx *sc = ud;
    if (sc->draining || sc->open_replies == 0 || sc->drain_timeout_s <= 0) {
        event_base_loopbreak(sc->base);
        return;
    }
    sc->draining = 1;
    al_log_info(COMP, "draining: %d request(s) in flight, %.0f s at most", sc->open_replies,
                sc->drain_timeout_s);
    al_httpd_drain(sc->http);
    /* the deadline is the process skeleton's (lib/http/process.h); the loop's timer fires
     * when it passes */
    al_process_drain_start(p, sc->drain_timeout_s);
    int left_ms = al_process_drain_left_ms(p, INT_MAX);
    struct timeval tv = {left_ms / 1000, (suseconds_t)(left_ms % 1000) * 1000};
    sc->drain_timer = evtimer_new(sc->base, on_drain_timeout, sc);
    if (sc->drain_timer) evtimer_add(sc->drain_timer, &tv);
}

enum { SERVE_MAX_ROOTS = 16 };

/* The --checkpoint-root flags in their order (only the first SERVE_MAX_ROOTS kept; n counts
 * them all, so that too many is a usage error after parsing). */
typedef struct serve_roots {
    const char *given[SERVE_MAX_ROOTS];
    size_t n;
} serve_roots;

/* The command line: the flags as given (serve_config_parse), then what they resolve to
 * (serve_config_resolve). */
typedef struct serve_config {
    al_cli_common common;
    const char *model_dir, *tok_dir, *listen, *name, *topic, *device, *lp_mode, *redirect_mode;
    int64_t version, low_speed;
    int max_seqs, max_kv, max_len, threads, drain;
    int low_speed_time, policy_wait, client_timeout, max_conns, model_wait;
    const char *api_key_arg, *api_key_file;
    int follow, weight_routes;
    serve_roots roots_given;
    /* resolved */
    int lp_temperature, redirects;
    char key[1024]; /* the API key; "" when the API is open */
    char host[256];
    int port;
    size_t nroots;
    char roots_buf[SERVE_MAX_ROOTS][PATH_MAX]; /* the roots as the follower compares them */
    const char *roots[SERVE_MAX_ROOTS];
    char namebuf[256]; /* the default --served-model-name */
} serve_config;

/* --checkpoint-root: one more root (AL_FLAG_FUNC). */
static int serve_root_add(void *dest, const char *value, char *err, size_t errlen)
{
    (void)err, (void)errlen;
    serve_roots *r = dest;
    if (r->n < SERVE_MAX_ROOTS) r->given[r->n] = value;
    r->n++;
    return 0;
}

static const char *const device_choices[] = {"cuda", "cpu", "auto", NULL};
static const char *const lp_mode_choices[] = {"raw", "temperature", NULL};
static const char *const redirect_choices[] = {"same-origin", "off", NULL};

/* Parses argv into cf (which it initializes): the flag table, then what the flags say
 * together. -1: go on; otherwise the exit code (--help, or a usage error already printed). */
static int serve_config_parse(serve_config *cf, int argc, char **argv)
{
    memset(cf, 0, sizeof *cf);
    al_cli_common_init(&cf->common);
    cf->listen = "127.0.0.1:8000", cf->topic = "arclight.policy", cf->device = "auto";
    cf->lp_mode = "raw", cf->redirect_mode = "same-origin";
    cf->max_seqs = 64, cf->max_kv = 2048, cf->drain = 30;
    cf->low_speed = 10240, cf->low_speed_time = 30, cf->policy_wait = 30, cf->client_timeout = 60;
    cf->max_conns = 1024;
    const al_flag flags[] = {
        {"model", 0, AL_FLAG_STRING, &cf->model_dir, .arg = "DIR",
         .help = "model directory: config.json, model.safetensors, tokenizer"},
        {"model-wait", 0, AL_FLAG_INT, &cf->model_wait, .lo = 0, .hi = 86400, .arg = "S",
         .help = "wait up to S seconds (default 0) for --model to be written\n"
                 "(config.json + model.safetensors): a job that writes it may\n"
                 "still be running when this starts (docker-compose.yml)"},
        {"tokenizer", 0, AL_FLAG_STRING, &cf->tok_dir, .arg = "DIR",
         .help = "tokenizer.json (+ tokenizer_config.json) dir (default: --model)"},
        {"listen", 0, AL_FLAG_STRING, &cf->listen, .arg = "HOST:PORT",
         .help = "default 127.0.0.1:8000 (port 0: any free port); the bound\n"
                 "address is printed as the first line of stdout"},
        {"served-model-name", 0, AL_FLAG_STRING, &cf->name, .arg = "NAME",
         .help = "model id in the API and the PolicyVersion model to follow\n"
                 "(default: the model directory's base name)"},
        {"policy-version", 0, AL_FLAG_I64, &cf->version, .lo = 0, .hi = INT64_MAX, .arg = "N",
         .help = "version of the weights in --model (default 0)"},
        {"follow-policy", 0, AL_FLAG_SWITCH, &cf->follow,
         .help = "follow arclight.policy on --bootstrap (default off)"},
        {"weight-routes", 0, AL_FLAG_SWITCH, &cf->weight_routes,
         .help = "serve SGLang's and vLLM's weight-update routes\n"
                 "(/update_weights_from_disk, /pause, /update_weights, ...;\n"
                 "paths only under --checkpoint-root when given)"},
        {"policy-topic", 0, AL_FLAG_STRING, &cf->topic, .arg = "TOPIC",
         .help = "default arclight.policy"},
        {"checkpoint-root", 0, AL_FLAG_FUNC, &cf->roots_given, .arg = "DIR",
         .parse = serve_root_add,
         .help = "file:// checkpoint URIs are read only under DIR (repeat for\n"
                 "more); without it only as the trainer writes them:\n"
                 ".../step-N/model.safetensors"},
        {"policy-redirects", 0, AL_FLAG_STRING, &cf->redirect_mode, .arg = "MODE",
         .choices = redirect_choices,
         .help = "same-origin (default: a redirect may change the path only)\n"
                 "or off (a redirect is an error)"},
        {"policy-low-speed-limit", 0, AL_FLAG_I64, &cf->low_speed, .lo = 0, .hi = 1LL << 40,
         .arg = "N", .help = "a weight download slower than N bytes/s (default 10240)"},
        {"policy-low-speed-time", 0, AL_FLAG_INT, &cf->low_speed_time, .lo = 1, .hi = 86400,
         .arg = "S", .help = "for S seconds (default 30) is abandoned"},
        {"policy-wait", 0, AL_FLAG_INT, &cf->policy_wait, .lo = 0, .hi = 86400, .arg = "S",
         .help = "at start, wait up to S seconds (default 30) for the policy\n"
                 "topic to be read to its end and its newest version loaded\n"
                 "before listening; then listen anyway and go on following"},
        {"drain-timeout", 0, AL_FLAG_INT, &cf->drain, .lo = 0, .hi = 86400, .arg = "S",
         .help = "on SIGTERM, let requests in flight finish for up to S\n"
                 "seconds (default 30)"},
        {"logprobs-mode", 0, AL_FLAG_STRING, &cf->lp_mode, .arg = "MODE",
         .choices = lp_mode_choices, .help = "raw (default) or temperature"},
        {"api-key", 0, AL_FLAG_STRING, &cf->api_key_arg, .arg = "KEY",
         .help = "clients must send Authorization: Bearer KEY on /v1/ routes,\n"
                 "/tokenize and /detokenize (as vLLM's --api-key); also\n"
                 "$ARCLIGHT_SERVE_API_KEY or --api-key-file FILE (first line),\n"
                 "which keep it out of ps"},
        {"api-key-file", 0, AL_FLAG_STRING, &cf->api_key_file, .arg = "FILE",
         .help = "the API key, from a file"},
        {"client-timeout", 0, AL_FLAG_INT, &cf->client_timeout, .lo = 1, .hi = 3600, .arg = "S",
         .help = "a request head must arrive whole within S seconds, and a\n"
                 "body may pause at most S between reads (default 60): 408"},
        {"max-connections", 0, AL_FLAG_INT, &cf->max_conns, .lo = 1, .hi = 1 << 20, .arg = "N",
         .help = "client connections at once (default 1024); past it a new one\n"
                 "gets 503"},
        {"max-num-seqs", 0, AL_FLAG_INT, &cf->max_seqs, .lo = 1, .hi = 4096, .arg = "N",
         .help = "sequences running or queued at once (default 64)"},
        {"max-kv-mib", 0, AL_FLAG_INT, &cf->max_kv, .lo = 1, .hi = 1 << 24, .arg = "N",
         .help = "KV cache all sequences may reserve (default 2048)"},
        {"max-model-len", 0, AL_FLAG_INT, &cf->max_len, .lo = 2, .hi = 1 << 24, .arg = "N",
         .help = "prompt + completion tokens (default: the model's\n"
                 "max_position_embeddings)"},
        {"threads", 0, AL_FLAG_INT, &cf->threads, .lo = 1, .hi = 1024, .arg = "N",
         .help = "OpenMP threads of the engine (default: OMP_NUM_THREADS)"},
        {"device", 0, AL_FLAG_STRING, &cf->device, .arg = "cuda|cpu|auto",
         .choices = device_choices,
         .help = "where the model runs (default auto: cuda when this build has\n"
                 "the CUDA backend and a device is visible, else cpu)"},
    };
    const al_cmd_spec spec = {
        "serve", "--model DIR [options]",
        "OpenAI-compatible policy server (vLLM-style token ids and logprobs) that follows\n"
        "arclight.policy and hot-swaps each new version of its model.\n",
        flags, AL_ARRAY_LEN(flags), .common = 1};
    int first;
    int rc = al_flags_parse(&spec, &cf->common, argc, argv, &first);
    if (rc != AL_FLAGS_GO) return rc;
    if (first < argc) return al_cli_usage_error("serve", "unexpected argument '%s'", argv[first]);
    if (cf->roots_given.n > SERVE_MAX_ROOTS)
        return al_cli_usage_error("serve", "at most %d --checkpoint-root flags",
                                  (int)SERVE_MAX_ROOTS);
    if (!cf->model_dir) return al_cli_usage_error("serve", "--model DIR is required");
    cf->lp_temperature = strcmp(cf->lp_mode, "temperature") == 0;
    cf->redirects = strcmp(cf->redirect_mode, "off") == 0 ? AL_SERVE_REDIRECTS_OFF
                                                          : AL_SERVE_REDIRECTS_SAME_ORIGIN;
    return -1;
}

/* What the flags name: the API key (a file or the environment keep it out of ps), the listen
 * address, the checkpoint roots (absolute, links resolved) and the engine's threads. -1: go
 * on; otherwise the exit code of a usage error. */
static int serve_config_resolve(serve_config *cf)
{
    const char *key_env = getenv("ARCLIGHT_SERVE_API_KEY");
    if (cf->api_key_file) {
        char kerr[512];
        size_t kl = 0;
        char *kf = al_file_read(cf->api_key_file, &kl, kerr, sizeof kerr);
        if (!kf) return al_cli_usage_error("serve", "--api-key-file: %s", kerr);
        kf[strcspn(kf, "\r\n")] = '\0';
        snprintf(cf->key, sizeof cf->key, "%s", al_str_trim(kf));
        free(kf);
        if (!cf->key[0])
            return al_cli_usage_error("serve", "--api-key-file %s is empty", cf->api_key_file);
    } else if (cf->api_key_arg || (key_env && *key_env)) {
        snprintf(cf->key, sizeof cf->key, "%s", cf->api_key_arg ? cf->api_key_arg : key_env);
        if (!cf->key[0]) return al_cli_usage_error("serve", "--api-key is empty");
    }
    if (al_cli_parse_hostport(cf->listen, cf->host, sizeof cf->host, &cf->port) != 0 ||
        cf->port < 0 || cf->port > 65535)
        return al_cli_usage_error("serve", "--listen wants HOST:PORT, got '%s'", cf->listen);
    for (size_t i = 0; i < cf->roots_given.n; i++) {
        struct stat sb;
        const char *given = cf->roots_given.given[i];
        if (!realpath(given, cf->roots_buf[i]) || stat(cf->roots_buf[i], &sb) != 0 ||
            !S_ISDIR(sb.st_mode))
            return al_cli_usage_error("serve", "--checkpoint-root '%s' is not a directory", given);
        cf->roots[cf->nroots++] = cf->roots_buf[i];
    }
    if (cf->threads > 0) {
        char t[24];
        snprintf(t, sizeof t, "%d", cf->threads);
        setenv("OMP_NUM_THREADS", t, 1);
    }
    return -1;
}

/* The running server: its context and what the command started around it. */
typedef struct serve_server {
    serve_ctx sc;
    al_backend *be;
    al_serve_policy *pol;
    al_process proc; /* signals and --metrics (lib/http/process.h) */
    size_t max_weight_bytes; /* the largest weights file the follower may fetch */
} serve_server;

/* Loads the model, the tokenizer and the backend, and starts the engine on them. 0, or -1
 * with the error logged and what was loaded freed. */
static int serve_load(serve_server *sv, serve_config *cf)
{
    serve_ctx *sc = &sv->sc;
    char err[1024];
    if (!al_model_dir_ready(cf->model_dir) && cf->model_wait > 0) {
        al_log_info(COMP, "waiting up to %d s for the model in %s", cf->model_wait, cf->model_dir);
        if (al_model_dir_wait(cf->model_dir, cf->model_wait, err, sizeof err) != 0) {
            al_log_error(COMP, "%s", err);
            return -1;
        }
    }
    al_model *m = al_model_load_dir(cf->model_dir, err, sizeof err);
    if (!m) {
        al_log_error(COMP, "cannot load the model: %s", err);
        return -1;
    }
    sc->cfg = *al_model_config_of(m);
    sc->tok = al_tokenizer_load_dir(cf->tok_dir ? cf->tok_dir : cf->model_dir, err, sizeof err);
    if (!sc->tok) {
        al_log_error(COMP, "cannot load the tokenizer: %s (give --tokenizer DIR)", err);
        al_model_free(m);
        return -1;
    }
    if (al_tokenizer_vocab_size(sc->tok) > sc->cfg.vocab_size) {
        al_log_error(COMP, "the tokenizer has %d ids but the model only %d",
                     al_tokenizer_vocab_size(sc->tok), sc->cfg.vocab_size);
        al_model_free(m);
        al_tokenizer_free(sc->tok);
        return -1;
    }
    if (!cf->name) {
        const char *dir = cf->model_dir;
        size_t L = strlen(dir);
        while (L > 1 && dir[L - 1] == '/')
            L--;
        const char *b = dir + L;
        while (b > dir && b[-1] != '/')
            b--;
        snprintf(cf->namebuf, sizeof cf->namebuf, "%.*s", (int)(dir + L - b), b);
        cf->name = cf->namebuf;
    }
    sc->name = cf->name;
    sc->api_key = cf->key[0] ? cf->key : NULL;
    sc->drain_timeout_s = (double)cf->drain;
    sc->max_model_len = cf->max_len ? cf->max_len : sc->cfg.max_position_embeddings;
    sv->be = al_backend_open(cf->device, err, sizeof err);
    if (!sv->be) {
        al_log_error(COMP, "--device %s: %s", cf->device, err);
        al_model_free(m);
        al_tokenizer_free(sc->tok);
        return -1;
    }
    al_serve_engine_opts eo = {cf->max_seqs, (size_t)cf->max_kv << 20, sc->max_model_len,
                               cf->lp_temperature, sv->be};
    sv->max_weight_bytes = al_serve_weights_max_bytes(m);
    al_serve_weights *w = al_serve_weights_new(m, cf->version);
    sc->eng = w ? al_serve_engine_start(w, sc->tok, &eo, err, sizeof err) : NULL;
    if (!sc->eng) {
        al_log_error(COMP, "%s", w ? err : "out of memory");
        al_tokenizer_free(sc->tok);
        return -1;
    }
    return 0;
}

/* serve's metrics: requests by status, tokens, sequences, KV bytes, the policy version and
 * the latencies (the gauges and the generated tokens are read from the engine at render). */
static void serve_metrics_init(serve_ctx *sc)
{
    sc->metrics = al_metrics_new();
    sc->req_ok = al_metrics_counter(sc->metrics, "arclight_serve_requests_total",
                                    "HTTP requests by status", "status", "2xx", NULL);
    sc->req_4xx = al_metrics_counter(sc->metrics, "arclight_serve_requests_total",
                                     "HTTP requests by status", "status", "4xx", NULL);
    sc->req_429 = al_metrics_counter(sc->metrics, "arclight_serve_requests_total",
                                     "HTTP requests by status", "status", "429", NULL);
    sc->req_5xx = al_metrics_counter(sc->metrics, "arclight_serve_requests_total",
                                     "HTTP requests by status", "status", "5xx", NULL);
    sc->gen_tokens = al_metrics_counter(sc->metrics, "arclight_serve_generated_tokens_total",
                                        "Tokens generated", NULL);
    sc->prompt_tokens = al_metrics_counter(sc->metrics, "arclight_serve_prompt_tokens_total",
                                           "Prompt tokens received", NULL);
    sc->g_running = al_metrics_gauge(sc->metrics, "arclight_serve_sequences",
                                     "Sequences running or queued", NULL);
    sc->g_kv =
        al_metrics_gauge(sc->metrics, "arclight_serve_kv_bytes", "KV cache bytes reserved", NULL);
    sc->g_version = al_metrics_gauge(sc->metrics, "arclight_serve_policy_version",
                                     "Policy version new requests get", NULL);
    sc->h_request = al_metrics_histogram(
        sc->metrics, "arclight_serve_request_seconds", "Generation requests, arrival to last token",
        al_metrics_latency_buckets, al_metrics_latency_buckets_len, NULL);
    sc->h_ttft =
        al_metrics_histogram(sc->metrics, "arclight_serve_time_to_first_token_seconds",
                             "Generation requests, arrival to first token",
                             al_metrics_latency_buckets, al_metrics_latency_buckets_len, NULL);
    al_metrics_on_collect(sc->metrics, collect, sc);
}

/* With --follow-policy: starts the follower and waits (--policy-wait) for the newest version,
 * so that a restarted server answers with it rather than its initial weights. 0, or -1 with
 * the error logged. */
static int serve_follow(serve_server *sv, const serve_config *cf)
{
    char err[1024];
    al_serve_policy_opts po = {
        .topic = cf->topic,
        .model = cf->name,
        .cfg = &sv->sc.cfg,
        .fetch = {.max_bytes = sv->max_weight_bytes,
                  .roots = cf->roots,
                  .nroots = cf->nroots,
                  .redirects = (al_serve_redirects)cf->redirects,
                  .low_speed_limit = (long)cf->low_speed,
                  .low_speed_time = (long)cf->low_speed_time,
                  .connect_timeout = 10},
    };
    if (!(sv->pol = al_serve_policy_start(&cf->common, &po, sv->sc.eng, err, sizeof err))) {
        al_log_error(COMP, "cannot follow %s: %s", cf->topic, err);
        return -1;
    }
    if (al_serve_policy_wait_ready(sv->pol, (double)cf->policy_wait, err, sizeof err) != 0)
        al_log_warn(COMP,
                    "listening before the policy is known (--policy-wait %d s passed): "
                    "%s; serving version %" PRId64 " meanwhile",
                    cf->policy_wait, err, al_serve_engine_version(sv->sc.eng));
    return 0;
}

/* Starts the follower (--follow-policy), the event loop, the API server on --listen, the
 * --metrics server and the signal handlers, then prints the bound address as stdout's first
 * line. 0, or -1 with the error logged (serve_stop frees what was started). */
static int serve_start(serve_server *sv, serve_config *cf)
{
    serve_ctx *sc = &sv->sc;
    char err[1024];
    if (cf->follow && serve_follow(sv, cf) != 0) return -1;
    sc->policy = sv->pol;
    if (cf->weight_routes &&
        !(sc->wapi = serve_wapi_new(cf->roots, cf->nroots, cf->version, cf->model_dir))) {
        al_log_error(COMP, "out of memory");
        return -1;
    }
    evthread_use_pthreads();
    sc->base = event_base_new();
    /* No deadline while a generation runs (the reply may take minutes); the head, the body
     * and a reply that makes no progress each have one. */
    al_httpd_opts ho = {.max_body = MAX_BODY,
                        .max_connections = cf->max_conns,
                        .head_timeout_ms = cf->client_timeout * 1000,
                        .body_timeout_ms = cf->client_timeout * 1000,
                        .idle_timeout_ms = 75000,
                        .write_timeout_ms = 600000,
                        .error_body = serve_reply_http_error_body};
    sc->http = sc->base ? al_httpd_new(sc->base, &ho, serve_route_request, sc) : NULL;
    if (!sc->http) {
        al_log_error(COMP, "libevent: cannot create the HTTP server");
        return -1;
    }
    const char *bind_host = cf->host[0] ? cf->host : "127.0.0.1";
    if (al_httpd_bind(sc->http, bind_host, cf->port, err, sizeof err) != 0) {
        al_log_error(COMP, "%s", err);
        return -1;
    }
    int port = al_httpd_port(sc->http);
    if (al_process_metrics_start(&sv->proc, cf->common.metrics, sc->metrics, NULL, NULL) != 0 ||
        al_process_signals_on_loop(&sv->proc, sc->base, on_signal, sc) != 0)
        return -1;
    printf("%s:%d\n", strchr(bind_host, ':') ? "[::1]" : bind_host, port);
    fflush(stdout);
    al_log_info(COMP, "serving '%s' (policy version %" PRId64 ", %s) on http://%s:%d%s%s", cf->name,
                cf->version, cf->model_dir, bind_host, port, cf->follow ? ", following " : "",
                cf->follow ? cf->topic : "");
    return 0;
}

/* Stops and frees everything serve_load and serve_start made; calls still open get 503. */
static void serve_stop(serve_server *sv)
{
    serve_ctx *sc = &sv->sc;
    sc->policy = NULL;
    al_serve_policy_stop(sv->pol);
    al_process_metrics_stop(&sv->proc);
    while (sc->calls) {
        http_call *c = sc->calls;
        serve_reply_error(sc, c->req, 503, NULL, "the server stopped before the reply was done");
        serve_call_free(c);
    }
    if (sc->drain_timer) event_free(sc->drain_timer);
    al_process_signals_off(&sv->proc, 0);
    al_httpd_free(sc->http);
    serve_wapi_free(sc->wapi);
    al_serve_engine_stop(sc->eng);
    al_backend_free(sv->be);
    if (sc->base) event_base_free(sc->base);
    al_metrics_free(sc->metrics);
    al_tokenizer_free(sc->tok);
}

int cmd_serve(int argc, char **argv)
{
    serve_config cf;
    int rc = serve_config_parse(&cf, argc, argv);
    if (rc < 0) rc = serve_config_resolve(&cf);
    if (rc >= 0) return rc;
    serve_server sv = {0};
    al_process_init(&sv.proc, COMP, NULL, 0);
    if (serve_load(&sv, &cf) != 0) return AL_EXIT_FAILURE;
    serve_metrics_init(&sv.sc);
    rc = AL_EXIT_FAILURE;
    if (serve_start(&sv, &cf) == 0) {
        event_base_dispatch(sv.sc.base);
        al_log_info(COMP, "stopping");
        rc = AL_EXIT_OK;
    }
    serve_stop(&sv);
    return rc;
}
