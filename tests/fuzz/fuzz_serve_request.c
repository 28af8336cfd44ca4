/*
 * fuzz_serve_request: libFuzzer target for the serve stage's request parsing
 * (stages/serve/request.c): any bytes as the body of /v1/chat/completions (first input byte
 * odd) or /v1/completions (even), with the tiny tokenizer. Every input must come back as a
 * request or an error with a 4xx status and a message, without a crash or a leak, and a
 * parsed request must hold what the engine relies on.
 */
#include "request.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static al_tokenizer *g_tok;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    const char *src = getenv("ARCLIGHT_SOURCE_DIR");
    char dir[1024], err[512];
    snprintf(dir, sizeof dir, "%s/tests/tokenizer/tiny", src && *src ? src : ".");
    g_tok = al_tokenizer_load_dir(dir, err, sizeof err);
    if (!g_tok) {
        fprintf(stderr, "fuzz_serve_request: %s (set ARCLIGHT_SOURCE_DIR)\n", err);
        abort();
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    al_serve_parse_ctx ctx = {g_tok, "tiny", 512, 256};
    al_serve_request r;
    al_serve_error e;
    if (al_serve_request_parse(&ctx, data[0] & 1, (const char *)data + 1, size - 1, &r, &e) == 0) {
        if (r.max_tokens < 1 || (int)r.prompt.len + r.max_tokens > 256 || r.n < 1 ||
            r.n > AL_SERVE_MAX_N || r.top_logprobs < 0 ||
            r.top_logprobs > AL_SERVE_MAX_TOP_LOGPROBS)
            abort();
        for (size_t i = 0; i < r.prompt.len; i++)
            if (r.prompt.ids[i] < 0 || r.prompt.ids[i] >= 512) abort();
        for (int i = 0; i < r.nstop_ids; i++)
            if (r.stop_ids[i] < 0 || r.stop_ids[i] >= 512) abort();
        al_serve_request_free(&r);
    } else if (e.status < 400 || e.status > 499 || !e.message[0]) {
        abort();
    }
    return 0;
}
