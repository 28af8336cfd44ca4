/*
 * arclight proxy: the capture proxy between an unchanged agent and an OpenAI-compatible
 * model server (issue 3). This file owns the command: its flags and their defaults, the
 * wiring of the loop (event base, HTTP server, the spool and its producer, the state file,
 * metrics and /healthz, signals), the drain on SIGTERM, and the exit path, where calls cut
 * off by the drain timeout still get their span. proxy.h says which file owns the rest.
 *
 * One thread runs one libevent loop: inbound HTTP/1.1 on lib/http/httpd (server.c;
 * answers leave at the end of the loop turn, after the turn's spans are spooled), and the
 * upstream calls through the proxy's own keep-alive client (upstream.c) or libcurl's
 * multi-socket interface driven by the same loop (call.c). Each call's span is encoded and
 * appended to the on-disk spool (spool.c), whose own thread publishes to Kafka: agent
 * traffic never waits for the broker.
 */
#include "proxy.h"

#include "core/cli.h"
#include "core/flags.h"
#include "core/log.h"
#include "http/server.h"
#include "kafka/kafka.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

static void drain_check(evutil_socket_t fd, short what, void *arg)
{
    proxy *px = arg;
    (void)fd;
    (void)what;
    /* done when no call is in flight and every answer has left (a connection still
     * writing closes itself once written, since draining turns keep-alive off) */
    int writing = al_httpd_busy(px->srv);
    if ((px->inflight == 0 && writing == 0) || al_process_drain_over(&px->proc)) {
        if (px->inflight)
            al_log_warn(COMP, "drain timeout: %d calls still in flight are cut off", px->inflight);
        event_base_loopbreak(px->base);
    }
}

/* SIGTERM/SIGINT (the process skeleton's stop): no new connections; the calls in flight
 * finish within --drain-timeout (drain_check). A second signal changes nothing. */
static void on_stop(al_process *p, int sig, void *arg)
{
    proxy *px = arg;
    if (px->draining) return;
    al_log_info(COMP, "signal %d: no new connections; draining %d calls in flight", (int)sig,
                px->inflight);
    px->draining = 1;
    al_process_drain_start(p, px->cfg.drain_timeout_s);
    al_httpd_listen_stop(px->srv);
    struct timeval tv = {0, 20000};
    px->drain_timer = event_new(px->base, -1, EV_PERSIST, drain_check, px);
    evtimer_add(px->drain_timer, &tv);
}

static void collect(al_metrics *m, void *ud)
{
    proxy *px = ud;
    (void)m;
    al_spool_stats st;
    al_spool_get_stats(px->spool, &st);
    al_gauge_set(px->g_spool_bytes, (double)st.bytes);
    al_gauge_set(px->g_spool_records, (double)st.records);
    /* counters from the spool's totals; /metrics renders on the loop thread and on the
     * --metrics server's thread */
    pthread_mutex_lock(&px->collect_mu);
    if (st.published > px->seen_published)
        al_counter_add(px->c_published, (double)(st.published - px->seen_published));
    if (st.dropped > px->seen_dropped)
        al_counter_add(px->c_dropped, (double)(st.dropped - px->seen_dropped));
    if (st.published > px->seen_published) px->seen_published = st.published;
    if (st.dropped > px->seen_dropped) px->seen_dropped = st.dropped;
    pthread_mutex_unlock(&px->collect_mu);
}

static int health(void *ud, char *reason, size_t n)
{
    proxy *px = ud;
    al_spool_stats st;
    al_spool_get_stats(px->spool, &st);
    if (al_spool_full(px->spool, 4096)) {
        snprintf(reason, n, "span spool full (%" PRIu64 " bytes): Kafka unreachable?", st.bytes);
        return 1;
    }
    return 0;
}

static const char proxy_about[] =
    "Capture proxy: forwards an agent's calls to the upstream model server (chat completions\n"
    "and completions as they are; the Responses API and the Anthropic Messages API translated\n"
    "to chat completions) and publishes every call, reward and rollout end as a span on\n"
    "arclight.spans. Point the\n"
    "agent at http://LISTEN/r/{task}/{rollout}/v1 (or /v1 with X-Arclight-Task/-Rollout\n"
    "headers, or a key from POST /v1/sessions as its API key). Held-out evaluation:\n"
    "/e/{task}/{rollout}/v1 (greedy) or /e:T/{task}/{rollout}/v1 (temperature T), or the\n"
    "X-Arclight-Eval: 1 and X-Arclight-Eval-Temperature headers; its spans carry eval.\n";

/* Lowers the scheduling priority (nice +5) of every thread but the calling one (the event
 * loop): the spool's publisher and librdkafka's threads, and those they start later, which
 * inherit it. The spans they carry are already on disk, so they can wait a little; the
 * agents' calls cannot. On a machine with few cores they otherwise take the loop's core at
 * random moments, which shows in the tail latency of calls. Best effort; the nice value of
 * a thread is per thread on Linux. */
static void background_threads_yield(void)
{
    DIR *d = opendir("/proc/self/task");
    if (!d) return;
    pid_t self = (pid_t)syscall(SYS_gettid);
    struct dirent *e;
    while ((e = readdir(d))) {
        pid_t tid = (pid_t)atoi(e->d_name);
        if (tid <= 0 || tid == self) continue;
        errno = 0;
        int cur = getpriority(PRIO_PROCESS, (id_t)tid);
        if (errno == 0 && cur < 5) setpriority(PRIO_PROCESS, (id_t)tid, cur + 5);
    }
    closedir(d);
}

/* Adds an --upstream URL without its trailing slashes and /v1; -1 when it is no http(s) URL,
 * there are 16 already, or out of memory. */
static int add_upstream(pconf *cf, const char *u)
{
    if (cf->n_upstreams >= AL_ARRAY_LEN(cf->upstreams)) return -1;
    if (strncmp(u, "http://", 7) != 0 && strncmp(u, "https://", 8) != 0) return -1;
    char *d = strdup(u);
    if (!d) return -1;
    size_t n = strlen(d);
    while (n && d[n - 1] == '/')
        d[--n] = '\0';
    if (n >= 3 && strcmp(d + n - 3, "/v1") == 0) d[n - 3] = '\0';
    cf->upstreams[cf->n_upstreams++] = d;
    return 0;
}

/* What the flags give before it becomes the configuration (pconf): the values whose units or
 * types differ from pconf's, the choices by name, and a key flag's error, said after parsing
 * (in its own words, and never with a key in it). */
typedef struct proxy_flags {
    pconf *cf;
    const char *kind, *native, *fsync, *client, *key_env;
    int64_t spool_max, max_body, max_head, max_headers, connect_to_ms, upstream_to_s, store_mib;
    int no_access_log;
    char key_err[600]; /* the first --agent-key or --agent-key-file error */
} proxy_flags;

/* --upstream, repeatable: each adds one. */
static int flag_upstream(void *dest, const char *v, char *err, size_t errlen)
{
    proxy_flags *fl = dest;
    if (add_upstream(fl->cf, v) == 0) return 0;
    snprintf(err, errlen, "wants an http:// or https:// URL (at most 16 upstreams)");
    return -1;
}

/* Records a key flag's usage error (the first one) for after parsing. */
static void key_error(proxy_flags *fl, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void key_error(proxy_flags *fl, const char *fmt, ...)
{
    if (fl->key_err[0]) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(fl->key_err, sizeof fl->key_err, fmt, ap);
    va_end(ap);
}

/* --agent-key, repeatable. The keys keep their order with --agent-key-file's: a session's
 * owner is a key's index, kept in the state file. */
static int flag_agent_key(void *dest, const char *v, char *err, size_t errlen)
{
    proxy_flags *fl = dest;
    pconf *cf = fl->cf;
    (void)err, (void)errlen;
    if (cf->n_agent_keys >= AL_ARRAY_LEN(cf->agent_keys) || !*v)
        key_error(fl, "--agent-key: empty, or more than 16 keys");
    else
        cf->agent_keys[cf->n_agent_keys++] = strdup(v);
    return 0;
}

/* --agent-key-file: its keys, one a line ('#' comments). */
static int flag_agent_key_file(void *dest, const char *v, char *err, size_t errlen)
{
    proxy_flags *fl = dest;
    pconf *cf = fl->cf;
    (void)err, (void)errlen;
    char kerr[512];
    size_t kl = 0;
    char *kf = al_file_read(v, &kl, kerr, sizeof kerr);
    if (!kf) {
        key_error(fl, "--agent-key-file: %s", kerr);
        return 0;
    }
    char *save = NULL;
    for (char *ln = strtok_r(kf, "\r\n", &save); ln; ln = strtok_r(NULL, "\r\n", &save)) {
        al_str_trim(ln);
        if (!*ln || *ln == '#') continue;
        if (cf->n_agent_keys >= AL_ARRAY_LEN(cf->agent_keys)) {
            key_error(fl, "--agent-key-file %s: more than 16 keys", v);
            break;
        }
        cf->agent_keys[cf->n_agent_keys++] = strdup(ln);
    }
    free(kf);
    return 0;
}

/* --upstream-native ROUTES into cf->native; -1 for a route it does not know. */
static int native_routes(pconf *cf, const char *routes)
{
    char list[200];
    snprintf(list, sizeof list, "%s", routes);
    cf->native = 0;
    for (char *sv = NULL, *t = strtok_r(list, ",", &sv); t; t = strtok_r(NULL, ",", &sv)) {
        if (!strcmp(t, "responses"))
            cf->native |= 1u << AL_API_RESPONSES;
        else if (!strcmp(t, "messages"))
            cf->native |= 1u << AL_API_MESSAGES;
        else if (strcmp(t, "none") != 0)
            return -1;
    }
    return 0;
}

static const char *const kinds[] = {"arclight", "vllm", "sglang", "openai", NULL};
static const upkind kind_of[] = {UP_ARCLIGHT, UP_VLLM, UP_SGLANG, UP_OPENAI};
static const char *const fsyncs[] = {"never", "interval", "always", NULL};
static const al_spool_fsync fsync_of[] = {AL_SPOOL_FSYNC_NEVER, AL_SPOOL_FSYNC_INTERVAL,
                                          AL_SPOOL_FSYNC_ALWAYS};
static const char *const clients[] = {"auto", "curl", NULL};

/* The parsed flags into the configuration, and the environment's keys: the upstream's
 * ($ARCLIGHT_UPSTREAM_API_KEY or --upstream-key-env's) and $ARCLIGHT_PROXY_AGENT_KEYS after
 * the flags' agent keys. */
static void proxy_flags_apply(const proxy_flags *fl)
{
    pconf *cf = fl->cf;
    for (size_t i = 0; kinds[i]; i++)
        if (!strcmp(fl->kind, kinds[i])) cf->kind = kind_of[i];
    for (size_t i = 0; fsyncs[i]; i++)
        if (!strcmp(fl->fsync, fsyncs[i])) cf->fsync_mode = fsync_of[i];
    cf->curl_only = !strcmp(fl->client, "curl");
    cf->access_log = !fl->no_access_log;
    cf->spool_max = (uint64_t)fl->spool_max;
    cf->max_body = (size_t)fl->max_body;
    cf->max_head = (size_t)fl->max_head;
    cf->max_headers = (size_t)fl->max_headers;
    cf->connect_timeout_ms = (long)fl->connect_to_ms;
    cf->upstream_timeout_ms = (long)fl->upstream_to_s * 1000;
    cf->response_store_bytes = (size_t)fl->store_mib << 20;

    const char *kv = getenv(fl->key_env);
    if (kv && *kv) cf->upstream_key = strdup(kv);
    const char *ak = getenv("ARCLIGHT_PROXY_AGENT_KEYS");
    if (ak && *ak) {
        char *dup = strdup(ak), *save = NULL;
        for (char *t = strtok_r(dup, ",", &save); t && cf->n_agent_keys < 16;
             t = strtok_r(NULL, ",", &save))
            if (*t) cf->agent_keys[cf->n_agent_keys++] = strdup(t);
        free(dup);
    }
}

/* Fills px->cfg (defaults, then the flags, then the environment: the upstream key and
 * $ARCLIGHT_PROXY_AGENT_KEYS) and common. AL_FLAGS_GO, or the exit status (0 after --help, 2
 * after a usage error, said on stderr). */
static int proxy_flags_parse(proxy *px, al_cli_common *common, int argc, char **argv)
{
    pconf *cf = &px->cfg;
    *cf = (pconf){
        .listen = "127.0.0.1:8080",
        .max_conns = 1024,
        .client_timeout_s = 60,
        .spool_dir = "./arclight-spool",
        .topic = AL_TOPIC_SPANS,
        .drain_timeout_s = 30,
        .session_ttl_s = 86400,
        .max_sessions_per_key = 10000,
        .fleet = {.policy_topic = AL_TOPIC_POLICY, .max_staleness = -1, .health_path = "/health"},
    };
    proxy_flags fl = {
        .cf = cf,
        .kind = "vllm",
        .fsync = "interval",
        .client = "auto",
        .key_env = "ARCLIGHT_UPSTREAM_API_KEY",
        .spool_max = 1LL << 30,
        .max_body = 1 << 20,
        .max_head = 32768,
        .max_headers = 100,
        .connect_to_ms = 5000,
        .upstream_to_s = 600,
        .store_mib = 256,
    };
    const int64_t big = 1LL << 50;
    const al_flag flags[] = {
        {"listen", 0, AL_FLAG_STRING, &cf->listen, .arg = "HOST:PORT",
         .help = "where agents connect (default 127.0.0.1:8080; port 0: any;\n"
                 "the bound address is printed on stdout)"},
        {"upstream", 0, AL_FLAG_FUNC, &fl, .arg = "URL", .parse = flag_upstream,
         .help = "model server base URL, e.g. http://127.0.0.1:8000; repeat for\n"
                 "several (sticky per rollout, failover on connection errors)"},
        {"upstream-kind", 0, AL_FLAG_STRING, &fl.kind, .arg = "KIND", .choices = kinds,
         .help = "arclight, vllm (default), sglang or openai: what to ask for\n"
                 "(vLLM-style return_token_ids + logprobs; openai: nothing,\n"
                 "text and usage only)"},
        {"upstream-native", 0, AL_FLAG_STRING, &fl.native, .arg = "ROUTES",
         .help = "responses and/or messages (comma-separated): the upstream\n"
                 "serves those routes itself; the proxy passes the agent's\n"
                 "request through, asking for token ids the way vLLM's\n"
                 "Responses API gives them (enable_response_messages, include\n"
                 "message.output_text.logprobs), and gives the agent the answer\n"
                 "without them (default: none, both translated to chat\n"
                 "completions)"},
        {"upstream-key-env", 0, AL_FLAG_STRING, &fl.key_env, .arg = "NAME",
         .help = "environment variable holding the upstream API key (default\n"
                 "ARCLIGHT_UPSTREAM_API_KEY); sent as Authorization: Bearer"},
        {"forward-agent-auth", 0, AL_FLAG_SWITCH, &cf->forward_agent_auth,
         .help = "send the agent's own Authorization upstream (when no key is\n"
                 "configured)"},
        {"agent-key", 0, AL_FLAG_FUNC, &fl, .arg = "KEY", .parse = flag_agent_key,
         .help = "accept only agents with this Bearer key (repeatable; session\n"
                 "keys are accepted too); also $ARCLIGHT_PROXY_AGENT_KEYS\n"
                 "(comma-separated) and --agent-key-file, which keep the keys\n"
                 "out of ps"},
        {"agent-key-file", 0, AL_FLAG_FUNC, &fl, .arg = "FILE", .parse = flag_agent_key_file,
         .help = "agent keys, one a line ('#' comments)"},
        {"session-ttl", 0, AL_FLAG_INT, &cf->session_ttl_s, .lo = 1, .hi = 365LL * 86400,
         .arg = "S",
         .help = "a key from POST /v1/sessions expires S seconds after it was\n"
                 "made (default 86400)"},
        {"max-sessions-per-key", 0, AL_FLAG_INT, &cf->max_sessions_per_key, .lo = 1,
         .hi = 1000000, .arg = "N",
         .help = "session keys one agent key (or, without --agent-key, all\n"
                 "agents) may hold; beyond it POST /v1/sessions is 429\n"
                 "(default 10000)"},
        {"agent-name", 0, AL_FLAG_STRING, &cf->agent_name, .arg = "NAME",
         .help = "agent name recorded in spans (X-Arclight-Agent overrides)"},
        {"topic", 0, AL_FLAG_STRING, &cf->topic, .arg = "TOPIC",
         .help = "spans topic (default arclight.spans)"},
        {"spool-dir", 0, AL_FLAG_STRING, &cf->spool_dir, .arg = "DIR",
         .help = "on-disk spool of spans (default ./arclight-spool)"},
        {"spool-max-bytes", 0, AL_FLAG_I64, &fl.spool_max, .lo = 4096, .hi = big, .arg = "N",
         .help = "spool bound; beyond it new calls get 503 (default 1 GiB)"},
        {"spool-fsync", 0, AL_FLAG_STRING, &fl.fsync, .arg = "MODE", .choices = fsyncs,
         .help = "never, interval (default: every second) or always"},
        {"max-body-bytes", 0, AL_FLAG_I64, &fl.max_body, .lo = 1, .hi = 256LL << 20, .arg = "N",
         .help = "request body limit (default 1 MiB, as nginx)"},
        {"max-header-bytes", 0, AL_FLAG_I64, &fl.max_head, .lo = 256, .hi = 1 << 20, .arg = "N",
         .help = "request head limit (default 32 KiB, as nginx's 4 x 8k)"},
        {"max-headers", 0, AL_FLAG_I64, &fl.max_headers, .lo = 1, .hi = AL_HTTP_HEADERS_CAP,
         .arg = "N", .help = "header count limit (default 100)"},
        {"max-connections", 0, AL_FLAG_INT, &cf->max_conns, .lo = 1, .hi = 1000000, .arg = "N",
         .help = "concurrent agent connections (default 1024)"},
        {"client-timeout", 0, AL_FLAG_INT, &cf->client_timeout_s, .lo = 1, .hi = 86400,
         .arg = "S", .help = "reading a request / idle keep-alive (default 60, as nginx)"},
        {"connect-timeout-ms", 0, AL_FLAG_I64, &fl.connect_to_ms, .lo = 1, .hi = big,
         .arg = "N", .help = "upstream connect timeout (default 5000)"},
        {"upstream-timeout", 0, AL_FLAG_I64, &fl.upstream_to_s, .lo = 1, .hi = 86400,
         .arg = "S", .help = "whole upstream call (default 600)"},
        {"drain-timeout", 0, AL_FLAG_INT, &cf->drain_timeout_s, .lo = 0, .hi = 86400,
         .arg = "S", .help = "on SIGTERM, wait this long for calls and spans (default 30)"},
        {"no-access-log", 0, AL_FLAG_SWITCH, &fl.no_access_log,
         .help = "no per-call access log line"},
        {"response-store-mib", 0, AL_FLAG_I64, &fl.store_mib, .lo = 0, .hi = 1 << 20,
         .arg = "N",
         .help = "memory for Responses API answers kept for previous_response_id\n"
                 "(default 256; oldest first out; 0: previous_response_id is\n"
                 "refused with 400)"},
        {"sync-topic", 0, AL_FLAG_STRING, &cf->fleet.sync_topic, .arg = "TOPIC",
         .help = "follow arclight sync's records (arclight.sync): each span\n"
                 "carries the version sync says its replica served (-1 when\n"
                 "the call straddled a swap; the upstream's own word for a\n"
                 "replica sync never recorded)"},
        {"policy-topic", 0, AL_FLAG_STRING, &cf->fleet.policy_topic, .arg = "TOPIC",
         .help = "the trainer's PolicyVersions (default arclight.policy)"},
        {"policy-model", 0, AL_FLAG_STRING, &cf->fleet.model, .arg = "NAME",
         .help = "only this model's versions count (default: any)"},
        {"max-staleness", 0, AL_FLAG_I64, &cf->fleet.max_staleness, .lo = 0, .hi = big,
         .arg = "N",
         .help = "refuse new rollouts' calls with 429 while the replicas are\n"
                 "more than N versions behind the trainer (needs --sync-topic)"},
        {"health-interval-ms", 0, AL_FLAG_I64, &cf->fleet.health_ms, .lo = 0, .hi = 3600000,
         .arg = "MS",
         .help = "check each upstream's --health-path this often; an unhealthy\n"
                 "one gets no rollouts until it answers again (default 0: off)"},
        {"health-path", 0, AL_FLAG_STRING, &cf->fleet.health_path, .arg = "PATH",
         .help = "what the health check GETs (default /health; vLLM and SGLang\n"
                 "serve it, so does arclight serve)"},
        {"upstream-client", 0, AL_FLAG_STRING, &fl.client, .arg = "C", .choices = clients,
         .help = "auto (default: the proxy's own keep-alive HTTP/1.1 client for\n"
                 "http:// upstreams at an IP address or localhost, curl for the\n"
                 "rest) or curl (curl for every upstream)"},
    };
    const al_cmd_spec spec = {"proxy", "--upstream URL [options]", proxy_about, flags,
                              AL_ARRAY_LEN(flags), 1, NULL};
    int first;
    int rc = al_flags_parse(&spec, common, argc, argv, &first);
    if (rc != AL_FLAGS_GO) return rc;
    if (fl.key_err[0]) return al_cli_usage_error("proxy", "%s", fl.key_err);
    if (fl.native && native_routes(cf, fl.native) != 0)
        return al_cli_usage_error("proxy",
                                  "--upstream-native %s: use responses, messages, "
                                  "both comma-separated, or none",
                                  fl.native);
    if (first < argc) return al_cli_usage_error("proxy", "unexpected argument '%s'", argv[first]);
    if (!cf->n_upstreams)
        return al_cli_usage_error("proxy", "--upstream URL is required (the model server)");
    if (cf->fleet.max_staleness >= 0 && !cf->fleet.sync_topic)
        return al_cli_usage_error("proxy", "--max-staleness needs --sync-topic (the replicas' "
                                           "versions come from arclight sync)");
    proxy_flags_apply(&fl);
    return AL_FLAGS_GO;
}

/* Opens the Kafka producer and the spool it publishes from (the spool owns the producer from
 * then on), lowers the background threads' priority, and reads and rewrites the state file.
 * *kc gets the Kafka configuration (the caller frees it, also after a failure). 0, or -1
 * after logging why. */
static int proxy_spool_open(proxy *px, const al_cli_common *common, al_kafka_conf **kc)
{
    pconf *cf = &px->cfg;
    char err[1024];
    *kc = al_kafka_conf_from_cli(common, err, sizeof err);
    if (!*kc) {
        al_log_error(COMP, "%s", err);
        return -1;
    }
    al_producer *producer = al_producer_new(*kc, err, sizeof err);
    if (!producer) {
        al_log_error(COMP, "%s", err);
        return -1;
    }
    /* the first spans should not wait a second for librdkafka to notice the topic; a broker
     * that is down only costs this second here (spans spool meanwhile) */
    const char *outs[] = {cf->topic, NULL};
    if (al_producer_prepare(producer, outs, 1000, err, sizeof err) != 0)
        al_log_warn(COMP, "%s (spans spool until Kafka answers)", err);
    px->spool = al_spool_open(cf->spool_dir, cf->spool_max, cf->fsync_mode, producer, cf->topic,
                              err, sizeof err);
    if (!px->spool) {
        al_log_error(COMP, "%s", err);
        al_producer_free(producer);
        return -1;
    }
    background_threads_yield();
    snprintf(px->state_path, sizeof px->state_path, "%s/proxy-state", cf->spool_dir);
    px_state_load(px);
    px_state_compact(px);
    return 0;
}

/* The proxy's own series (the routes' request counters are made as they are first used). */
static void proxy_metrics_init(proxy *px)
{
    px->metrics = al_metrics_new();
    al_metrics_add_process_metrics(px->metrics);
    px->spans_spooled = al_metrics_counter(px->metrics, "arclight_proxy_spans_spooled_total",
                                           "Spans written to the spool (then published)", NULL);
    px->spans_failed = al_metrics_counter(px->metrics, "arclight_proxy_spans_failed_total",
                                          "Spans that could not be encoded or spooled", NULL);
    px->rejected_spool_full =
        al_metrics_counter(px->metrics, "arclight_proxy_rejected_spool_full_total",
                           "Calls refused with 503: spool full", NULL);
    px->c_published = al_metrics_counter(px->metrics, "arclight_proxy_spans_published_total",
                                         "Spans acknowledged by Kafka", NULL);
    px->c_dropped =
        al_metrics_counter(px->metrics, "arclight_proxy_spans_dropped_total",
                           "Spans Kafka refused for good (larger than the broker takes)", NULL);
    px->g_spool_bytes = al_metrics_gauge(px->metrics, "arclight_proxy_spool_bytes",
                                         "Bytes in the spool (not yet acknowledged)", NULL);
    px->g_spool_records = al_metrics_gauge(px->metrics, "arclight_proxy_spool_spans",
                                           "Spans in the spool not yet acknowledged", NULL);
    px->g_conns =
        al_metrics_gauge(px->metrics, "arclight_proxy_connections", "Open agent connections", NULL);
    px->g_inflight = al_metrics_gauge(px->metrics, "arclight_proxy_calls_in_flight",
                                      "Upstream calls in flight", NULL);
    px->h_overhead =
        al_metrics_histogram(px->metrics, "arclight_proxy_overhead_seconds",
                             "The proxy's own time per call (not the upstream's)",
                             al_metrics_latency_buckets, al_metrics_latency_buckets_len, NULL);
    px->h_upstream = al_metrics_histogram(px->metrics, "arclight_proxy_upstream_seconds",
                                          "Upstream call latency", al_metrics_latency_buckets,
                                          al_metrics_latency_buckets_len, NULL);
    al_metrics_on_collect(px->metrics, collect, px);
}

/* host:port as a socket address (localhost: 127.0.0.1); its length, or 0 when host is not
 * numeric (the check of --listen before the server binds it). */
static int listen_addr(const char *host, int port, struct sockaddr_storage *ss)
{
    memset(ss, 0, sizeof *ss);
    const char *h4 = strcmp(host, "localhost") ? host : "127.0.0.1";
    struct sockaddr_in *s4 = (struct sockaddr_in *)ss;
    struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)ss;
    if (inet_pton(AF_INET, h4, &s4->sin_addr) == 1) {
        s4->sin_family = AF_INET;
        s4->sin_port = htons((uint16_t)port);
        return (int)sizeof *s4;
    }
    if (inet_pton(AF_INET6, host, &s6->sin6_addr) == 1) {
        s6->sin6_family = AF_INET6;
        s6->sin6_port = htons((uint16_t)port);
        return (int)sizeof *s6;
    }
    return 0;
}

/* Makes the event loop and everything on it: the calls' multi handle, the response store,
 * the HTTP server on host:port (px->port gets the bound port), the signals, the sweep timer
 * and the spool's flush event. AL_FLAGS_GO, or the exit status after saying why (2 for a --listen
 * address that is not numeric). */
static int proxy_loop_open(proxy *px, const char *host, int port)
{
    pconf *cf = &px->cfg;
    /* the changelist folds curl's remove/re-add of pooled upstream sockets within one loop
     * turn into at most one epoll_ctl */
    struct event_config *ecfg = event_config_new();
    if (ecfg) event_config_set_flag(ecfg, EVENT_BASE_FLAG_EPOLL_USE_CHANGELIST);
    px->base = ecfg ? event_base_new_with_config(ecfg) : NULL;
    if (ecfg) event_config_free(ecfg);
    if (!px->base) px->base = event_base_new();
    if (!px->base) {
        al_log_error(COMP, "cannot create the event loop");
        return AL_EXIT_FAILURE;
    }
    if (px_calls_init(px) != 0) return AL_EXIT_FAILURE;
    if (cf->response_store_bytes && !(px->store = px_store_new(cf->response_store_bytes))) {
        al_log_error(COMP, "out of memory");
        return AL_EXIT_FAILURE;
    }
    struct sockaddr_storage ss;
    int sl = listen_addr(host, port, &ss);
    if (!sl)
        return al_cli_usage_error("proxy", "--listen %s: need a numeric address HOST:PORT",
                                  cf->listen);
    px->hooks = (px_conn_hooks){px_spool_flush_cb, px_dispatch, px_call_detach, px_call_resume};
    char err[1024];
    if (px_server_open(px, strcmp(host, "localhost") ? host : "127.0.0.1", port, err,
                       sizeof err) != 0) {
        al_log_error(COMP, "%s", err);
        return AL_EXIT_FAILURE;
    }
    if (al_process_signals_on_loop(&px->proc, px->base, on_stop, px) != 0)
        return AL_EXIT_FAILURE;
    struct timeval sweep = {300, 0};
    px->sweep_timer = event_new(px->base, -1, EV_PERSIST, px_sweep_cb, px);
    event_add(px->sweep_timer, &sweep);
    px->flush_ev = event_new(px->base, -1, 0, px_spool_flush_cb, px);
    if (!px->sweep_timer || !px->flush_ev) {
        al_log_error(COMP, "out of memory");
        return AL_EXIT_FAILURE;
    }
    return AL_FLAGS_GO;
}

/* Runs the loop until the drain ends it. */
static void proxy_run(proxy *px, const char *host)
{
    pconf *cf = &px->cfg;
    char up[512];
    px_url_public(cf->upstreams[0], up, sizeof up);
    printf("%s:%d\n",
           strchr(host, ':') ? "[::1]" : (strcmp(host, "localhost") ? host : "127.0.0.1"),
           px->port);
    fflush(stdout);
    al_log_info(COMP, "listening on port %d; upstream %s (+%zu more); spans to %s via spool %s",
                px->port, up, cf->n_upstreams - 1, cf->topic, cf->spool_dir);
    event_base_dispatch(px->base);
    /* the final flush is bounded by --drain-timeout; a second SIGTERM must not cut it */
    al_process_signals_off(&px->proc, 1);
}

/* Ends what is left (calls cut off by the drain timeout still get their failed span) and
 * waits up to --drain-timeout for the spool to be published, whatever point the start got
 * to. */
static void proxy_stop(proxy *px, int rc)
{
    pconf *cf = &px->cfg;
    for (conn *c = px->conns; c; c = c->next)
        if (c->call) {
            c->call->c = NULL;
            c->call = NULL;
        }
    while (px->calls)
        px_call_done(px->calls, CURLE_ABORTED_BY_CALLBACK);
    al_httpd_free(px->srv); /* the requests left are given up */
    px->srv = NULL;
    if (px->spool) {
        px_spool_flush(px);
        px_state_flush(px);
        long left = al_spool_close(px->spool, cf->drain_timeout_s * 1000);
        if (left == 0 && rc == AL_EXIT_OK) al_log_info(COMP, "every span published; bye");
    }
}

/* Frees px and everything it holds (after proxy_stop, and after the metrics server, which
 * renders px's series, has stopped). */
static void proxy_free(proxy *px)
{
    pconf *cf = &px->cfg;
    al_httpd_free(px->srv);
    if (px->curl_timer) event_free(px->curl_timer);
    al_process_signals_off(&px->proc, 0);
    if (px->drain_timer) event_free(px->drain_timer);
    if (px->sweep_timer) event_free(px->sweep_timer);
    if (px->flush_ev) event_free(px->flush_ev);
    if (px->state_fd >= 0) close(px->state_fd);
    al_buf_free(&px->state_pend);
    while (px->n_easy_pool)
        curl_easy_cleanup(px->easy_pool[--px->n_easy_pool]);
    if (px->multi) curl_multi_cleanup(px->multi);
    al_upc_pool_free(px->upc);
    px_store_free(px->store);
    if (px->base) event_base_free(px->base);
    al_metrics_free(px->metrics);
    px_identity_free(px);
    for (size_t i = 0; i < cf->n_upstreams; i++)
        free(cf->upstreams[i]);
    for (size_t i = 0; i < cf->n_agent_keys; i++)
        free(cf->agent_keys[i]);
    free(cf->upstream_key);
    al_buf_free(&px->enc);
    al_buf_free(&px->strip);
    pthread_mutex_destroy(&px->collect_mu);
    free(px);
}

/* arclight proxy: flags, spool, metrics, loop; runs until SIGTERM's drain ends; 0, 1 or 2. */
int cmd_proxy(int argc, char **argv)
{
    al_cli_common common;
    al_cli_common_init(&common);
    proxy *px = calloc(1, sizeof *px);
    if (!px) return AL_EXIT_FAILURE;
    pthread_mutex_init(&px->collect_mu, NULL);
    al_process_init(&px->proc, COMP, NULL, 0);
    px->state_fd = -1;
    al_kafka_conf *kc = NULL;
    char host[256], err[1024];
    int port;
    int rc = proxy_flags_parse(px, &common, argc, argv);
    if (rc != AL_FLAGS_GO) goto out;
    if (al_cli_parse_hostport(px->cfg.listen, host, sizeof host, &port) != 0) {
        rc = al_cli_usage_error("proxy", "--listen %s: need HOST:PORT", px->cfg.listen);
        goto out;
    }
    rc = AL_EXIT_FAILURE;
    signal(SIGPIPE, SIG_IGN);
    if (getrandom(&px->rng, sizeof px->rng, 0) != sizeof px->rng || !px->rng)
        px->rng = (uint64_t)al_now_us() | 1;
    if (proxy_spool_open(px, &common, &kc) != 0) goto out;
    proxy_metrics_init(px);
    if (al_process_metrics_start(&px->proc, common.metrics, px->metrics, health, px) != 0)
        goto out;
    rc = proxy_loop_open(px, host, port);
    if (rc != AL_FLAGS_GO) goto out;
    rc = AL_EXIT_FAILURE;
    if (px_fleet_start(px, &common, err, sizeof err) != 0) {
        al_log_error(COMP, "%s", err);
        goto out;
    }
    proxy_run(px, host);
    rc = AL_EXIT_OK;
out:
    proxy_stop(px, rc);
    al_process_metrics_stop(&px->proc);
    px_fleet_stop(px);
    proxy_free(px);
    al_kafka_conf_free(kc);
    return rc;
}
