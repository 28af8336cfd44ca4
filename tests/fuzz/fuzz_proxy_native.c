/*
 * fuzz_proxy_native: libFuzzer target for what the proxy reads off an upstream that serves
 * the Responses or Messages API itself (stages/proxy/native.c, --upstream-native): a whole
 * answer, or a stream's events, each captured (token ids, logprobs, usage, finish, the
 * Messages stream's message) and stripped of capture's additions for the agent. The first
 * input byte says what the rest is: bit 0 the API (Responses or Messages), bit 1 a stream
 * (events split at blank lines) or a whole answer, bits 2-3 whether the agent asked for
 * input/output_messages and for logprobs itself (so that both strip paths run).
 * Beyond "no crash" and no leak: what is written to the agent ends each event with its
 * separator; the message a Messages stream builds for the span is JSON.
 *
 * The answers go nowhere but into these checks: native.c writes to no connection itself, it
 * hands back what the agent gets, and that is checked here.
 *
 * Seed corpus: tests/fuzz/native_corpus (serve's and the test upstream's answers, whole and
 * streamed). To explore beyond the test's fixed seed, in the sanitizer build:
 *   mkdir -p /tmp/nat && build-asan/fuzz_proxy_native -max_len=8192 /tmp/nat \
 *       tests/fuzz/native_corpus
 */
#define _GNU_SOURCE
#include "proxy.h"

#include "core/log.h"

#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static size_t g_written;

static void call_clear(call *k)
{
    free(k->prompt.v), free(k->resp_ids.v), free(k->lps.v);
    free(k->finish), free(k->error), free(k->agent_answer), free(k->model);
    json_decref(k->nat_msg);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    static int quiet;
    if (!quiet) {
        al_log_set_level(AL_LOG_LEVEL_ERROR); /* the no-token-ids warning, every input */
        quiet = 1;
    }
    unsigned mode = data[0];
    const char *p = (const char *)data + 1;
    size_t n = size - 1;
    call k;
    memset(&k, 0, sizeof k);
    k.api = mode & 1 ? AL_API_MESSAGES : AL_API_RESPONSES;
    k.native = 1;
    k.nat_msgs = (mode >> 2) & 1;
    k.nat_lps = (mode >> 3) & 1;
    k.status = 200;
    snprintf(k.id.rollout, sizeof k.id.rollout, "fuzz");
    if (mode & 2) {
        k.stream = 1;
        size_t pos = 0;
        while (pos < n) {
            const char *e = memmem(p + pos, n - pos, "\n\n", 2);
            size_t evlen = e ? (size_t)(e - (p + pos)) : n - pos;
            /* the event in its own buffer, as the stream's body holds it (no NUL after) */
            char *ev = malloc(evlen + 2);
            memcpy(ev, p + pos, evlen);
            memcpy(ev + evlen, "\n\n", 2);
            char *out = NULL;
            size_t outlen = 0;
            int r = px_native_event(&k, ev, evlen, 2, &out, &outlen);
            const char *data = r == 1 ? out : ev;
            size_t len = r == 1 ? outlen : evlen + 2;
            if (r >= 0) {
                /* an event, ending in its separator; one the proxy rewrote has a JSON data line */
                if (len < 2 || data[len - 1] != '\n') __builtin_trap();
                g_written += len;
            }
            free(out);
            free(ev);
            pos += evlen + 2;
        }
    } else {
        k.body.data = malloc(n + 1);
        memcpy(k.body.data, p, n);
        k.body.len = n;
        k.body.cap = n + 1;
        al_slice agent;
        int status = px_native_answer(&k, &agent);
        if (status < 100 || (agent.n && !agent.p)) __builtin_trap();
        g_written += agent.n;
        free(k.body.data);
    }
    px_native_check(&k);
    if (k.agent_answer && k.agent_answer[0] && (mode & 2)) {
        json_t *o = json_loads(k.agent_answer, JSON_ALLOW_NUL, NULL);
        if (!o) __builtin_trap();
        json_decref(o);
    }
    call_clear(&k);
    return 0;
}
