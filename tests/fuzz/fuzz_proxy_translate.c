/*
 * fuzz_proxy_translate: libFuzzer target for the proxy's API translators (lib/api/
 * translate.c, responses.c, messages.c), which face the agent's request and the upstream's
 * answer. The first input byte picks the API (bit 0: Responses or Messages) and what the
 * rest is (bits 1-2):
 *   0  the agent's request body
 *   1  a whole upstream answer, to a fixed valid request
 *   2  an upstream stream, one chunk per line, to a fixed valid streaming request
 *   3  a request body, then after the first NUL byte a stream for it
 * Beyond "no crash": every chat request and answer built is a JSON object; a stream's output
 * is SSE events whose data are JSON objects carrying their event's type; after the end a
 * final answer exists; a refusal has a 4xx/5xx status and a message.
 *
 * The seed corpus (tests/fuzz/translate_corpus) holds each fixture of tests/proxy in all
 * four forms. To explore beyond the test's fixed seed, in the sanitizer build:
 *   mkdir -p /tmp/xl && build-asan/fuzz_proxy_translate -max_len=4096 /tmp/xl \
 *       tests/fuzz/translate_corpus
 * and add what it finds to the corpus.
 */
#include "../../lib/api/translate.h"

#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static json_t *lookup(void *ud, const char *id)
{
    (void)ud;
    /* one stored conversation, so that previous_response_id takes both paths */
    if (strcmp(id, "resp_known")) return NULL;
    return json_loads("[{\"role\":\"user\",\"content\":\"hi\"},{\"role\":\"assistant\","
                      "\"content\":null,\"tool_calls\":[{\"id\":\"c1\",\"type\":\"function\","
                      "\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}}]}]",
                      0, NULL);
}

static void check_sse(const al_buf *out)
{
    const char *p = out->data;
    while (p && *p) {
        const char *end = strstr(p, "\n\n");
        const char *nl = end ? memchr(p, '\n', (size_t)(end - p)) : NULL;
        if (!end || !nl || strncmp(p, "event: ", 7) || strncmp(nl + 1, "data: ", 6)) abort();
        json_t *d = json_loadb(nl + 7, (size_t)(end - nl - 7), 0, NULL);
        const char *t = json_string_value(json_object_get(d, "type"));
        if (!json_is_object(d) || !t || strlen(t) != (size_t)(nl - p - 7) ||
            memcmp(t, p + 7, strlen(t)))
            abort();
        json_decref(d);
        p = end + 2;
    }
}

static al_xl *request(al_api api, const char *body, size_t n, json_t **chat)
{
    al_xl_env env = {"f0", 1, lookup, NULL, 0};
    al_xl_err err;
    al_xl *x = al_xl_request(api, body, n, &env, chat, &err);
    if (!x) {
        if (*chat || err.status < 400 || err.status > 599 || !err.message[0]) abort();
        return NULL;
    }
    if (!json_is_object(*chat) || !json_is_array(json_object_get(*chat, "messages"))) abort();
    char *s = json_dumps(*chat, JSON_COMPACT);
    if (!s) abort();
    free(s);
    return x;
}

static void stream(al_xl *x, const char *p, size_t n)
{
    al_buf out = {0};
    while (n) {
        const char *nl = memchr(p, '\n', n);
        size_t len = nl ? (size_t)(nl - p) : n;
        json_t *c = json_loadb(p, len, JSON_ALLOW_NUL, NULL);
        if (c && al_xl_chunk(x, c, &out) != 0) abort();
        json_decref(c);
        p += len + (nl ? 1 : 0);
        n -= len + (nl ? 1 : 0);
    }
    if (al_xl_end(x, n % 2 ? "cut" : NULL, &out) != 0) abort();
    check_sse(&out);
    json_t *f = al_xl_final(x);
    char *s = f ? json_dumps(f, JSON_COMPACT) : NULL;
    if (!s) abort();
    free(s);
    json_decref(al_xl_conversation(x));
    al_buf_free(&out);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    al_api api = data[0] & 1 ? AL_API_MESSAGES : AL_API_RESPONSES;
    int mode = (data[0] >> 1) & 3;
    const char *in = (const char *)data + 1;
    size_t n = size - 1;
    static const char *const fixed[2][2] = {
        {"{\"model\":\"m\",\"input\":\"q\",\"tools\":[{\"type\":\"function\",\"name\":\"f\"},{"
         "\"type\":\"custom\",\"name\":\"g\"},{\"type\":\"namespace\",\"name\":\"ns\",\"tools\":[{"
         "\"type\":\"function\",\"name\":\"h\"}]}],\"include\":[\"message.output_text.logprobs\","
         "\"reasoning.encrypted_content\"],\"top_logprobs\":2}",
         "{\"model\":\"m\",\"input\":\"q\",\"stream\":true,\"tools\":[{\"type\":\"custom\","
         "\"name\":\"g\"},{\"type\":\"namespace\",\"name\":\"ns\",\"tools\":[{\"type\":"
         "\"function\",\"name\":\"h\"}]}],\"include\":[\"message.output_text.logprobs\"]}"},
        {"{\"model\":\"m\",\"max_tokens\":5,\"stop_sequences\":[\"X\"],\"messages\":[{\"role\":"
         "\"user\",\"content\":\"q\"}],\"tools\":[{\"name\":\"f\",\"input_schema\":{}}]}",
         "{\"model\":\"m\",\"max_tokens\":5,\"stream\":true,\"messages\":[{\"role\":\"user\","
         "\"content\":\"q\"}]}"}};
    json_t *chat = NULL;
    al_xl *x;
    if (mode == 0) {
        x = request(api, in, n, &chat);
    } else if (mode == 1) {
        const char *b = fixed[api == AL_API_MESSAGES][0];
        x = request(api, b, strlen(b), &chat);
        if (!x) abort();
        json_t *ans = json_loadb(in, n, JSON_ALLOW_NUL, NULL);
        al_xl_err err;
        json_t *a = ans ? al_xl_answer(x, ans, &err) : NULL;
        if (a) {
            char *s = json_dumps(a, JSON_COMPACT);
            if (!json_is_object(a) || !s) abort();
            free(s);
            json_decref(al_xl_conversation(x));
        }
        json_decref(a);
        json_decref(ans);
    } else if (mode == 2) {
        const char *b = fixed[api == AL_API_MESSAGES][1];
        x = request(api, b, strlen(b), &chat);
        if (!x) abort();
        stream(x, in, n);
    } else {
        const char *z = memchr(in, '\0', n);
        size_t rl = z ? (size_t)(z - in) : n;
        x = request(api, in, rl, &chat);
        if (x && z) stream(x, z + 1, n - rl - 1);
    }
    json_decref(chat);
    al_xl_free(x);
    return 0;
}
