/*
 * fuzz_proxy_http1: libFuzzer target for the proxy's network-facing parsers: the HTTP/1.1
 * request-head parser (stages/proxy/http1.c) and the byte-preserving JSON editor
 * (stages/proxy/json_edit.c). The first input byte picks the parser. Beyond "no crash", the JSON
 * editor must keep valid JSON valid: when jansson accepts the input and the edit succeeds, jansson
 * must accept the output, and the output must not have grown by more than "null" per edit.
 */
#include "http/http1.h"
#include "../../stages/proxy/json_edit.h"

#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    const char *in = (const char *)data + 1;
    size_t n = size - 1;
    if (data[0] & 1) {
        al_http_head h;
        char err[128];
        al_http_limits lim = {.max_line = 1024, .max_head = 1024, .max_headers = 16};
        int r = al_http_parse_head(in, n, &lim, &h, err, sizeof err);
        if (r > 0) {
            if ((size_t)r > n) abort();
            for (size_t i = 0; i < h.nheaders; i++)
                if (h.headers[i].name.p < in ||
                    h.headers[i].value.p + h.headers[i].value.n > in + n)
                    abort();
            (void)al_http_header_get(&h, "content-type");
        }
        return 0;
    }
    static const char *const top[] = {"prompt_token_ids", "usage", NULL};
    static const char *const topn[] = {"x", NULL};
    static const char *const chr[] = {"token_ids", "prompt_token_ids", NULL};
    static const char *const chn[] = {"logprobs", NULL};
    al_json_strip spec = {top, topn, chr, chn};
    size_t cap = n + 4096;
    char *out = malloc(cap);
    long r = al_json_strip_apply(in, n, &spec, out, cap);
    if (r >= 0) {
        json_t *a = json_loadb(in, n, 0, NULL);
        if (a) {
            json_t *b = json_loadb(out, (size_t)r, 0, NULL);
            if (!b) abort(); /* the edit broke valid JSON */
            json_decref(b);
            json_decref(a);
        }
    }
    free(out);
    /* no split view (issue 15, item 10): the tree-less lookup finds what jansson finds, the
     * last of duplicate keys, escaped names decoded */
    json_t *tree = al_json_valid(in, n) ? json_loadb(in, n, JSON_DECODE_ANY, NULL) : NULL;
    if (json_is_object(tree)) {
        static const char *const names[] = {"stream", "model", "choices", "a"};
        for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
            al_slice v;
            int f = al_json_member(in, n, names[i], &v);
            json_t *want = json_object_get(tree, names[i]);
            if ((f == 1) != (want != NULL)) abort();
            if (f == 1) {
                json_t *got = json_loadb(v.p, v.n, JSON_DECODE_ANY, NULL);
                if (!got || !json_equal(got, want)) abort();
                json_decref(got);
            }
        }
    }
    json_decref(tree);
    /* the lookups for validated text (capture after the strip pass): on valid JSON they find
     * exactly what the checking ones find; on anything else they stay inside the input */
    {
        static const char *const names[] = {"stream", "model", "choices", "a"};
        al_slice fast[4], slow[4];
        int fr = al_json_members_valid(in, n, names, fast, 4);
        for (int i = 0; i < 4 && fr > 0; i++)
            if (fast[i].p && (fast[i].p < in || fast[i].p + fast[i].n > in + n)) abort();
        if (al_json_valid(in, n)) {
            int sr = al_json_members(in, n, names, slow, 4);
            if (fr != sr) abort();
            for (int i = 0; i < 4 && sr > 0; i++)
                if (fast[i].p != slow[i].p || fast[i].n != slow[i].n) abort();
            al_json_iter a, b;
            al_slice ea, eb;
            if (sr > 0 && slow[2].p && al_json_iter_init(&a, slow[2].p, slow[2].n) == 0 &&
                al_json_iter_init_valid(&b, slow[2].p, slow[2].n) == 0) {
                int ra, rb;
                do {
                    ra = al_json_iter_next_members(&a, names, slow, 4, &ea);
                    rb = al_json_iter_next_members(&b, names, fast, 4, &eb);
                    if (ra != rb || (ra > 0 && (ea.p != eb.p || ea.n != eb.n))) abort();
                } while (ra > 0);
            }
        }
    }
    /* the tree-less lookups the hot path uses: bounded to the input, consistent with the
     * validator */
    if (al_json_valid(in, n)) {
        al_slice v, e;
        if (al_json_member(in, n, "choices", &v) == 1) {
            if (v.p < in || v.p + v.n > in + n || !al_json_valid(v.p, v.n)) abort();
            al_json_iter it;
            size_t count = 0;
            if (al_json_iter_init(&it, v.p, v.n) == 0) {
                while (al_json_iter_next(&it, &e) == 1) {
                    if (e.p < v.p || e.p + e.n > v.p + v.n) abort();
                    count++;
                }
                if (count && al_json_element(v.p, v.n, count - 1, &e) != 1) abort();
                if (al_json_element(v.p, v.n, count, &e) != 0) abort();
            }
        }
    }
    return 0;
}
