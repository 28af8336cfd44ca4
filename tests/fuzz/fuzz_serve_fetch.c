/*
 * fuzz_serve_fetch: libFuzzer target for the checks serve's policy follower makes before it
 * reads a byte a PolicyVersion names (stages/serve/fetch.c): the checkpoint URI, the sha256,
 * the origin of a redirect, the file:// path rules and the safetensors pre-check, and the
 * escaping of a URI for a log line. Nothing here touches the network or the file system.
 *
 * Input: the first byte picks what the rest is; the rest is split at the first '\n' where two
 * strings are needed. Every property checked below is one the follower relies on.
 */
#include "fetch.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char *cstr(const uint8_t *d, size_t n)
{
    char *s = malloc(n + 1);
    memcpy(s, d, n);
    s[n] = '\0';
    return s;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    const uint8_t *d = data + 1;
    size_t n = size - 1;
    char err[512];
    switch (data[0] % 6) {
    case 0: { /* a URI: the parse never reads or writes out of bounds, and what it accepts is
               * an absolute path without dot segments, or an http(s) URL with a host */
        char *s = cstr(d, n);
        al_serve_uri u;
        if (al_serve_uri_parse(s, &u, err, sizeof err) == 0) {
            if (u.kind == 'f') {
                if (u.target[0] != '/' || strstr(u.target, "/../") || strstr(u.target, "/./"))
                    abort();
                if (strpbrk(u.target, "?#")) abort();
            } else if (u.kind != 'h') {
                abort();
            }
            for (const char *p = u.target; *p; p++)
                if ((unsigned char)*p < 0x20 || *p == 0x7f) abort();
        } else if (!err[0]) {
            abort(); /* a refusal always says why */
        }
        free(s);
        break;
    }
    case 1: { /* sha256: accepted means exactly 64 hex digits */
        char *s = cstr(d, n);
        int ok = al_serve_sha256_valid(s);
        int want = strlen(s) == 64 && strspn(s, "0123456789abcdefABCDEF") == 64;
        if (ok != want) abort();
        free(s);
        break;
    }
    case 2: { /* same origin: symmetric, and a URL is of its own origin when it parses */
        const uint8_t *nl = memchr(d, '\n', n);
        size_t la = nl ? (size_t)(nl - d) : n;
        char *a = cstr(d, la), *b = cstr(nl ? nl + 1 : d + n, nl ? n - la - 1 : 0);
        if (al_serve_same_origin(a, b) != al_serve_same_origin(b, a)) abort();
        free(a);
        free(b);
        break;
    }
    case 3: { /* paths: the trainer's layout, and containment in two fixed roots */
        char *s = cstr(d, n);
        if (al_serve_trainer_layout(s)) {
            size_t L = strlen(s);
            if (L < 24 || strcmp(s + L - 18, "/model.safetensors") != 0 || s[0] != '/') abort();
        }
        static const char *const roots[] = {"/data/ckpt", "/srv/x/"};
        if (al_serve_path_under(s, roots, 2) &&
            strncmp(s, "/data/ckpt/", 11) != 0 && strncmp(s, "/srv/x/", 7) != 0)
            abort();
        free(s);
        break;
    }
    case 4: { /* the safetensors pre-check: what it passes has its header inside the bytes */
        if (al_serve_st_precheck(d, n, err, sizeof err) == 0) {
            uint64_t h = 0;
            for (int i = 7; i >= 0; i--)
                h = (h << 8) | d[i];
            if (n < 10 || h > n - 8 || d[8] != '{') abort();
        } else if (strlen(err) > 200) {
            abort();
        }
        break;
    }
    default: { /* a URI for a log line: bounded, printable, no raw control bytes */
        char *s = cstr(d, n);
        char out[64];
        al_serve_log_escape(s, out, sizeof out);
        if (strlen(out) >= sizeof out) abort();
        for (const char *p = out; *p; p++)
            if ((unsigned char)*p < 0x20 || (unsigned char)*p >= 0x7f) abort();
        free(s);
        break;
    }
    }
    return 0;
}
