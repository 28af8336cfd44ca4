/*
 * fuzz_tokenizer: libFuzzer target for the tokenizer's untrusted inputs. The first byte
 * picks what the rest is:
 *   0: a tokenizer.json (load; when it loads, encode and decode a fixed text);
 *   1: text for the tiny tokenizer (tests/tokenizer/tiny): encode with and without special
 *      tokens, decode, stream-decode; byte-level BPE must give the exact bytes back;
 *   2: model output for the tool-call parser (whole and streamed: the same calls), and
 *      JSON for the Python-style re-serializer;
 *   3: text for NFC, which must be idempotent.
 * Any crash, sanitizer report or broken invariant (abort) is a finding.
 */
#include "text/json.h"
#include "text/tokenizer.h"
#include "text/unicode.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static al_tokenizer *tiny;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    const char *root = getenv("ARCLIGHT_SOURCE_DIR");
    char path[4096], err[256];
    snprintf(path, sizeof path, "%s/tests/tokenizer/tiny", root ? root : ".");
    tiny = al_tokenizer_load_dir(path, err, sizeof err);
    if (!tiny) {
        fprintf(stderr, "fuzz_tokenizer: %s (set ARCLIGHT_SOURCE_DIR)\n", err);
        abort();
    }
    return 0;
}

static void fuzz_load(const char *s, size_t n)
{
    char err[256];
    al_tokenizer *t = al_tokenizer_from_json(s, n, NULL, 0, err, sizeof err);
    if (!t) {
        if (!err[0]) abort(); /* a failure must say why */
        return;
    }
    al_token_ids ids = {0};
    static const char text[] = "Hello, world! <|im_end|> caf\xC3\xA9 \xE4\xB8\xAD 123";
    if (al_tokenizer_encode(t, text, sizeof text - 1, AL_TOKENIZER_ALLOW_SPECIAL, &ids) == 0) {
        char *out = NULL;
        size_t len = 0;
        if (al_tokenizer_decode(t, ids.ids, ids.len, AL_TOKENIZER_LOSSY, &out, &len) == 0)
            free(out);
    }
    al_token_ids_free(&ids);
    al_tokenizer_free(t);
}

static void fuzz_encode(const char *s, size_t n)
{
    for (unsigned flags = 0; flags <= AL_TOKENIZER_ALLOW_SPECIAL; flags++) {
        al_token_ids ids = {0};
        if (al_tokenizer_encode(tiny, s, n, flags, &ids) != 0) abort();
        char *out = NULL;
        size_t len = 0;
        if (al_tokenizer_decode(tiny, ids.ids, ids.len, 0, &out, &len) != 0) abort();
        if (len != n || memcmp(out, s, n) != 0) abort(); /* byte-level BPE is lossless */
        free(out);
        al_tokenizer_stream st = {0};
        for (size_t i = 0; i < ids.len; i++) {
            size_t k = 0;
            if (!al_tokenizer_stream_push(tiny, &st, ids.ids[i],
                                          flags ? AL_TOKENIZER_SKIP_SPECIAL : 0, &k))
                abort();
        }
        size_t k = 0;
        al_tokenizer_stream_flush(&st, &k);
        al_tokenizer_stream_free(&st);
        al_token_ids_free(&ids);
    }
}

static void fuzz_parse(const char *s, size_t n)
{
    for (unsigned flags = 0; flags <= AL_CHAT_PARSE_REASONING; flags++) {
        al_chat_parsed p;
        if (al_chat_parse(s, n, flags, &p) != 0) abort();
        for (size_t i = 0; i < p.n_calls; i++) {
            /* arguments are always valid JSON */
            al_json *j = al_json_parse(p.calls[i].arguments, strlen(p.calls[i].arguments), NULL, 0);
            if (!j && p.calls[i].arguments[0] == '{') abort();
            al_json_free(j);
        }
        al_chat_parsed_free(&p);
    }
    /* streamed in 3-byte pieces, the tool calls are those of the whole-text parse */
    al_chat_parsed whole, rest;
    if (al_chat_parse(s, n, 0, &whole) != 0) abort();
    al_chat_stream st = {.flags = 0};
    for (size_t at = 0; at < n; at += 3) {
        al_chat_delta d;
        if (al_chat_stream_push(&st, s + at, n - at < 3 ? n - at : 3, &d) != 0) abort();
    }
    if (al_chat_stream_finish(&st, &rest) != 0) abort();
    if (rest.n_calls != whole.n_calls) abort();
    for (size_t i = 0; i < rest.n_calls; i++)
        if (strcmp(rest.calls[i].name, whole.calls[i].name) ||
            strcmp(rest.calls[i].arguments, whole.calls[i].arguments))
            abort();
    al_chat_parsed_free(&whole);
    al_chat_parsed_free(&rest);
    al_chat_stream_free(&st);
    al_buf b = {0};
    al_chat_json_pyformat(s, n, &b);
    free(b.data);
}

static void fuzz_nfc(const char *s, size_t n)
{
    char *a = NULL, *b = NULL;
    size_t alen = n, blen = 0;
    int r = al_unicode_nfc(s, n, &a, &alen);
    if (r < 0) abort();
    const char *once = r ? a : s;
    int r2 = al_unicode_nfc(once, alen, &b, &blen);
    if (r2 < 0) abort();
    if (r2 == 1 && (blen != alen || memcmp(b, once, alen) != 0))
        abort(); /* NFC(NFC(x)) == NFC(x) */
    free(a);
    free(b);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    const char *s = (const char *)data + 1;
    size_t n = size - 1;
    switch (data[0] % 4) {
    case 0:
        fuzz_load(s, n);
        break;
    case 1:
        fuzz_encode(s, n);
        break;
    case 2:
        fuzz_parse(s, n);
        break;
    case 3:
        fuzz_nfc(s, n);
        break;
    }
    return 0;
}
