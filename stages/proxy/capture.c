/*
 * capture.c: what capture does to a call. Owns the rewrite of the agent's request (ask the
 * upstream for token ids and logprobs per upstream kind, and for usage in streams; a fast
 * path on the text itself, the jansson tree for the rest), the reading of the answer (token
 * ids, logprobs, finish reason, usage: fast path for whole answers, tree for stream chunks),
 * the removal of what the proxy asked for so the agent gets the bytes it would have had
 * directly, the SSE event loop over a streamed answer, and the span of a finished call.
 */
#include "proxy.h"

#include "core/log.h"

#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Appends x (dropped when out of memory, as the span then is short of it). */
static void ivec_push(ivec *a, int32_t x)
{
    (void)al_vec_push(a, x);
}

static void fvec_push(fvec *a, float x)
{
    (void)al_vec_push(a, x);
}

/* A logprob as a float: beyond the float range it becomes an infinity (converting it would
 * be undefined), which the batch stage refuses as not finite. */
static float lp_float(double d)
{
    return d > FLT_MAX ? INFINITY : d < -FLT_MAX ? -INFINITY : (float)d;
}

static void capture_ids(json_t *arr, ivec *out)
{
    size_t i;
    json_t *v;
    if (!json_is_array(arr)) return;
    json_array_foreach(arr, i, v) if (json_is_integer(v))
        ivec_push(out, (int32_t)json_integer_value(v));
}

/* Reads what training needs from one response object or stream chunk: token ids, logprobs,
 * finish reason, usage, and for streams the text / tool-call deltas to merge. */
static void capture_object(call *k, json_t *o, int streamed)
{
    json_t *ch = json_object_get(o, "choices"), *c0 = json_array_get(ch, 0);
    capture_ids(json_object_get(o, "prompt_token_ids"), &k->prompt);
    json_t *u = json_object_get(o, "usage");
    if (json_is_object(u)) {
        k->have_usage = 1;
        k->usage.prompt_tokens = json_integer_value(json_object_get(u, "prompt_tokens"));
        k->usage.completion_tokens = json_integer_value(json_object_get(u, "completion_tokens"));
        k->usage.total_tokens = json_integer_value(json_object_get(u, "total_tokens"));
        k->usage.cached_tokens = json_integer_value(
            json_object_get(json_object_get(u, "prompt_tokens_details"), "cached_tokens"));
    }
    if (streamed) {
        const char *id = json_string_value(json_object_get(o, "id"));
        const char *m = json_string_value(json_object_get(o, "model"));
        if (id && !k->s_id) k->s_id = strdup(id);
        if (m && !k->s_model) k->s_model = strdup(m);
        if (json_is_integer(json_object_get(o, "created")))
            k->s_created = json_integer_value(json_object_get(o, "created"));
    }
    if (!json_is_object(c0)) return;
    if (!k->prompt.n) capture_ids(json_object_get(c0, "prompt_token_ids"), &k->prompt);
    size_t before = k->resp_ids.n;
    capture_ids(json_object_get(c0, "token_ids"), &k->resp_ids);
    json_t *lp = json_object_get(c0, "logprobs"), *v;
    size_t i;
    if (json_is_object(lp)) {
        json_t *content = json_object_get(lp, "content");
        json_t *tl = json_object_get(lp, "token_logprobs");
        if (json_is_array(content)) {
            json_array_foreach(content, i, v)
                fvec_push(&k->lps, lp_float(json_number_value(json_object_get(v, "logprob"))));
        } else if (json_is_array(tl)) {
            json_array_foreach(tl, i, v) fvec_push(&k->lps, lp_float(json_number_value(v)));
        }
    }
    const char *fr = json_string_value(json_object_get(c0, "finish_reason"));
    if (fr) {
        free(k->finish);
        k->finish = strdup(fr);
    }
    if (!streamed) return;
    json_t *delta = json_object_get(c0, "delta");
    const char *text =
        json_string_value(json_object_get(delta ? delta : c0, delta ? "content" : "text"));
    int got = k->resp_ids.n > before;
    if (text && *text) {
        al_buf_append(&k->content, text, strlen(text));
        got = 1;
    }
    json_t *tcs = json_object_get(delta, "tool_calls"), *tc;
    if (json_is_array(tcs)) {
        if (!k->tools) k->tools = json_array();
        json_array_foreach(tcs, i, tc)
        {
            size_t idx = (size_t)json_integer_value(json_object_get(tc, "index"));
            if (idx > 128) continue;
            while (json_array_size(k->tools) <= idx)
                json_array_append_new(k->tools, json_pack("{s:s,s:s,s:{s:s,s:s}}", "id", "", "type",
                                                          "function", "function", "name", "",
                                                          "arguments", ""));
            json_t *dst = json_array_get(k->tools, idx), *fn = json_object_get(dst, "function");
            const char *s;
            if ((s = json_string_value(json_object_get(tc, "id"))))
                json_object_set_new(dst, "id", json_string(s));
            json_t *sf = json_object_get(tc, "function");
            const char *keys[2] = {"name", "arguments"};
            for (int q = 0; q < 2; q++)
                if ((s = json_string_value(json_object_get(sf, keys[q])))) {
                    const char *old = json_string_value(json_object_get(fn, keys[q]));
                    size_t ol = old ? strlen(old) : 0, nl = strlen(s);
                    char *cat = malloc(ol + nl + 1);
                    if (!cat) continue;
                    memcpy(cat, old ? old : "", ol);
                    memcpy(cat + ol, s, nl + 1);
                    json_object_set_new(fn, keys[q], json_string(cat));
                    free(cat);
                }
        }
        got = 1;
    }
    if (got && !k->first_token_us) k->first_token_us = al_now_us();
}

/* ------------------------------------------------------------------------------------------
 * Fast paths: the common request and whole response read and rewritten on the text itself
 * (al_json_* in json_edit.c); jansson stays for streams, errors and unusual requests.
 * ------------------------------------------------------------------------------------------ */

static int slice_is(al_slice v, const char *lit)
{
    return al_slice_eq(v, lit);
}

static const char *skip_ws(const char *p, const char *e)
{
    while (p < e && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r'))
        p++;
    return p;
}

/* Appends the integers of the JSON array arr (already scanned whole by the lookup that
 * found it), read off its text in one pass; stops at the first element that is not an
 * integer (a fraction, an exponent, a string...) or is beyond 10^11. */
static void fast_ids(al_slice arr, ivec *out)
{
    const char *p = arr.p, *e = arr.p + arr.n;
    p = skip_ws(p, e);
    if (p >= e || *p++ != '[') return;
    for (;;) {
        p = skip_ws(p, e);
        if (p >= e || *p == ']') return;
        int neg = *p == '-';
        if (neg) p++;
        const char *d = p;
        long long x = 0;
        for (; p < e && *p >= '0' && *p <= '9'; p++) {
            if (x > 100000000000LL) return;
            x = x * 10 + (*p - '0');
        }
        if (p == d) return;
        const char *t = skip_ws(p, e);
        if (t >= e || (*t != ',' && *t != ']')) return;
        ivec_push(out, (int32_t)(neg ? -x : x));
        p = t;
        if (*p == ',') p++;
    }
}

/* A plain decimal ("-0.25", "103": at most 15 digits, no exponent) exactly: an integer of
 * at most 15 digits and 10^k for k <= 22 are exact doubles, and one IEEE division rounds
 * correctly, so the result is strtod's (Clinger's fast path). 0 when v is not such a number. */
static int plain_decimal(al_slice v, double *out)
{
    static const double p10[] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,
                                 1e8,  1e9,  1e10, 1e11, 1e12, 1e13, 1e14, 1e15};
    size_t i = v.p[0] == '-', nd = 0, frac = 0;
    int dot = 0;
    uint64_t m = 0;
    for (; i < v.n; i++) {
        char c = v.p[i];
        if (c == '.' && !dot) {
            dot = 1;
            continue;
        }
        if (c < '0' || c > '9' || ++nd > 15) return 0;
        m = m * 10 + (uint64_t)(c - '0');
        frac += dot;
    }
    if (!nd || (dot && !frac)) return 0;
    double d = (double)m / p10[frac];
    *out = v.p[0] == '-' ? -d : d;
    return 1;
}

static double slice_num(al_slice v)
{
    char buf[64];
    double d;
    if (!v.n || v.n >= sizeof buf || !(v.p[0] == '-' || (v.p[0] >= '0' && v.p[0] <= '9')))
        return 0.0;
    if (plain_decimal(v, &d)) return d;
    memcpy(buf, v.p, v.n);
    buf[v.n] = '\0';
    return strtod(buf, NULL);
}

/* A count from the upstream's usage: 0 unless a number in [0, 2^62] (converting one beyond
 * int64 would be undefined); v is the member's value ({NULL, 0}: absent). */
static int64_t usage_int(al_slice v)
{
    double d = v.p ? slice_num(v) : 0.0;
    return d >= 0 && d <= 0x1p62 ? (int64_t)d : 0;
}

/* al_json_members, or its faster form where the text was validated before. */
static int members(int valid, al_slice obj, const char *const *keys, al_slice *vals, size_t n)
{
    return valid ? al_json_members_valid(obj.p, obj.n, keys, vals, n)
                 : al_json_members(obj.p, obj.n, keys, vals, n);
}

static int iter_init(int valid, al_json_iter *it, al_slice arr)
{
    return valid ? al_json_iter_init_valid(it, arr.p, arr.n) : al_json_iter_init(it, arr.p, arr.n);
}

/* The usage object u, read in one pass (its details object in a second). */
static void capture_usage(call *k, al_slice u, int valid)
{
    static const char *const keys[] = {"prompt_tokens", "completion_tokens", "total_tokens",
                                       "prompt_tokens_details"};
    static const char *const cached[] = {"cached_tokens"};
    al_slice v[4], c;
    k->have_usage = 1;
    if (members(valid, u, keys, v, 4) < 0) return;
    k->usage.prompt_tokens = usage_int(v[0]);
    k->usage.completion_tokens = usage_int(v[1]);
    k->usage.total_tokens = usage_int(v[2]);
    if (v[3].n && v[3].p[0] == '{' && members(valid, v[3], cached, &c, 1) >= 0)
        k->usage.cached_tokens = usage_int(c);
}

/* The logprobs of the choice's "logprobs" object lp: chat's content[].logprob, or the
 * completions' token_logprobs[]; each element read in the pass that finds its end. */
static void capture_logprobs(call *k, al_slice lp, int valid)
{
    static const char *const lp_keys[] = {"content", "token_logprobs"};
    static const char *const el_keys[] = {"logprob"};
    al_slice arrs[2], el, v;
    al_json_iter it;
    if (members(valid, lp, lp_keys, arrs, 2) < 0) return;
    if (arrs[0].p && iter_init(valid, &it, arrs[0]) == 0) {
        int rc;
        while ((rc = al_json_iter_next_members(&it, el_keys, &v, 1, &el)) > 0)
            fvec_push(&k->lps, rc == 1 && v.p ? lp_float(slice_num(v)) : 0.0f);
    } else if (arrs[1].p && iter_init(valid, &it, arrs[1]) == 0) {
        while (al_json_iter_next(&it, &el) == 1)
            fvec_push(&k->lps, lp_float(slice_num(el)));
    }
}

/* The top-level members capture reads, in px_answer_parts.top's order. */
static const char *const answer_top_keys[] = {"prompt_token_ids", "usage", "choices", NULL};

void px_capture_fast(call *k, const char *body, size_t n, const px_answer_parts *parts)
{
    /* the top object's members and the first choice: found by the strip pass that validated
     * the text (parts), else in one pass here; then one pass over the first choice (read
     * where the choices array starts, so that finding its end is the same pass), the
     * logprobs and the usage */
    static const char *const ch_keys[] = {"prompt_token_ids", "token_ids", "logprobs",
                                          "finish_reason"};
    al_slice top[3], cv[4], v, c0;
    al_json_iter it;
    int valid = parts != NULL;
    if (parts)
        memcpy(top, parts->top, sizeof top);
    else if (al_json_members(body, n, answer_top_keys, top, 3) < 0)
        return;
    if (top[0].p) fast_ids(top[0], &k->prompt);
    if (top[1].n && top[1].p[0] == '{') capture_usage(k, top[1], valid);
    if (!top[2].p) return;
    if (parts && parts->c0.p && parts->c0.p > top[2].p &&
        parts->c0.p + parts->c0.n < top[2].p + top[2].n) {
        if (al_json_members_valid(parts->c0.p, parts->c0.n, ch_keys, cv, 4) < 0) return;
    } else if (iter_init(valid, &it, top[2]) != 0 ||
               al_json_iter_next_members(&it, ch_keys, cv, 4, &c0) != 1) {
        return;
    }
    if (!k->prompt.n && cv[0].p) fast_ids(cv[0], &k->prompt);
    if (cv[1].p) fast_ids(cv[1], &k->resp_ids);
    if (cv[2].n && cv[2].p[0] == '{') capture_logprobs(k, cv[2], valid);
    v = cv[3];
    if (v.n >= 2 && v.p[0] == '"' && !memchr(v.p, '\\', v.n)) {
        free(k->finish);
        k->finish = strndup(v.p + 1, v.n - 2);
    }
}

/* Appends the text t at add[al] (the caller's buffer holds it); the new length. */
static size_t add_text(char *add, size_t al, const char *t)
{
    size_t n = strlen(t);
    memcpy(add + al, t, n + 1);
    return al + n;
}

/* px_rewrite_request without a tree, for requests that only need fields added. NULL when the
 * request needs the general path (invalid JSON, for the error message; a field to replace,
 * an eval call's temperature among them; escapes in the model name). */
char *px_rewrite_fast(call *k, const char *in, size_t n, size_t *outlen)
{
    upkind kind = k->px->cfg.kind;
    al_slice v, so;
    if (k->id.eval || !al_json_valid(in, n)) return NULL;
    size_t e = n;
    while (e && (in[e - 1] == ' ' || in[e - 1] == '\t' || in[e - 1] == '\n' || in[e - 1] == '\r'))
        e--;
    size_t b = 0;
    while (b < e && (in[b] == ' ' || in[b] == '\t' || in[b] == '\n' || in[b] == '\r'))
        b++;
    if (e - b < 2 || in[b] != '{' || in[e - 1] != '}') return NULL;
    static const char *const keys[] = {"stream", "logprobs", "return_token_ids", "stream_options",
                                       "model"};
    al_slice f[5];
    if (al_json_members(in, n, keys, f, 5) < 0) return NULL;
    k->stream = f[0].p && slice_is(f[0], "true");
    v = f[1];
    if (v.p) {
        if (k->is_chat)
            k->want_logprobs = slice_is(v, "true");
        else
            k->want_logprobs = v.n && v.p[0] >= '1' && v.p[0] <= '9' && !memchr(v.p, '.', v.n);
        if (!k->want_logprobs) return NULL; /* false/null/0: to be replaced */
    }
    v = f[2];
    if (v.p) {
        if (!slice_is(v, "true")) return NULL;
        k->want_token_ids = 1;
    }
    int need_usage = 0;
    if (k->stream) {
        so = f[3];
        if (so.p) {
            if (so.n && so.p[0] == '{' && al_json_member(so.p, so.n, "include_usage", &v) == 1 &&
                slice_is(v, "true"))
                need_usage = 0;
            else
                return NULL;
        } else {
            need_usage = 1;
        }
    }
    v = f[4];
    if (v.n >= 2 && v.p[0] == '"') {
        if (memchr(v.p, '\\', v.n)) return NULL;
        k->model = strndup(v.p + 1, v.n - 2);
    }
    char add[160];
    size_t al = 0;
    add[0] = '\0';
    /* at most 81 bytes of fixed text: copied, not printed */
    if (kind != UP_OPENAI && !k->want_token_ids) al = add_text(add, al, ",\"return_token_ids\":true");
    if (kind != UP_OPENAI && !k->want_logprobs)
        al = add_text(add, al, k->is_chat ? ",\"logprobs\":true" : ",\"logprobs\":1");
    if (need_usage) {
        k->injected_usage = 1;
        al = add_text(add, al, ",\"stream_options\":{\"include_usage\":true}");
    }
    /* an empty object takes the additions without their leading comma */
    size_t inner = b + 1;
    while (inner < e - 1 &&
           (in[inner] == ' ' || in[inner] == '\t' || in[inner] == '\n' || in[inner] == '\r'))
        inner++;
    int empty = inner == e - 1;
    const char *ad = add + (empty && al ? 1 : 0);
    size_t adl = al - (empty && al ? 1 : 0);
    char *out = malloc((e - b) + adl + 1);
    if (!out) return NULL;
    size_t o = 0;
    memcpy(out, in + b, e - b - 1);
    o = e - b - 1;
    memcpy(out + o, ad, adl);
    o += adl;
    out[o++] = '}';
    out[o] = '\0';
    *outlen = o;
    return out;
}

/* The fields the proxy asked for, taken out of the answer the way the upstream would have
 * left them out: vLLM's whole responses carry unrequested fields as null (pydantic
 * model_dump), its stream chunks omit them (exclude_unset); logprobs is null in both. */
long px_strip_for_agent(call *k, const char *in, size_t len, int chunk, px_answer_parts *parts)
{
    static const char *const top_ids[] = {"prompt_token_ids", NULL};
    static const char *const top_ids_usage[] = {"prompt_token_ids", "usage", NULL};
    static const char *const top_usage[] = {"usage", NULL};
    static const char *const ch_ids[] = {"token_ids", "prompt_token_ids", NULL};
    static const char *const ch_ids_lp[] = {"token_ids", "prompt_token_ids", "logprobs", NULL};
    static const char *const ch_lp[] = {"logprobs", NULL};
    al_json_strip spec = {0};
    if (chunk) {
        if (!k->want_token_ids)
            spec.top_remove = k->injected_usage ? top_ids_usage : top_ids;
        else if (k->injected_usage)
            spec.top_remove = top_usage;
        if (!k->want_token_ids) spec.choice_remove = ch_ids;
        if (!k->want_logprobs) spec.choice_null = ch_lp;
    } else {
        if (!k->want_token_ids) spec.top_null = top_ids;
        if (!k->want_token_ids)
            spec.choice_null = k->want_logprobs ? ch_ids : ch_ids_lp;
        else if (!k->want_logprobs)
            spec.choice_null = ch_lp;
    }
    if (parts) {
        spec.top_find = answer_top_keys;
        spec.top_found = parts->top;
        spec.first_choice = &parts->c0;
    }
    al_buf *st = &k->px->strip;
    st->len = 0;
    if (al_buf_reserve(st, len + 4096)) return -1;
    return al_json_strip_apply(in, len, &spec, (char *)st->data, len + 4096);
}

/* A passed-through stream's event (native.c), captured; the agent gets its copy. */
static void native_event(call *k, const char *ev, size_t evlen, size_t sep)
{
    char *out = NULL;
    size_t outlen = 0;
    int r = px_native_event(k, ev, evlen, sep, &out, &outlen);
    if (r == 0 && k->c) k->emit(k, ev, evlen + sep);
    if (r == 1 && k->c) k->emit(k, out, outlen);
    free(out);
}

/* Handles the complete SSE events in k->body: captures each data chunk, forwards it to the
 * agent stripped of what the proxy asked for, drops the usage-only chunk the proxy asked
 * for, and keeps a trailing partial event for the next write. */
void px_stream_process(call *k, int final)
{
    size_t pos = 0;
    char *b = (char *)k->body.data;
    for (;;) {
        size_t evend = 0, sep = 0;
        for (size_t i = pos; i + 1 < k->body.len; i++) {
            if (b[i] == '\n' && b[i + 1] == '\n') {
                evend = i;
                sep = 2;
                break;
            }
            if (b[i] == '\r' && i + 3 < k->body.len && b[i + 1] == '\n' && b[i + 2] == '\r' &&
                b[i + 3] == '\n') {
                evend = i;
                sep = 4;
                break;
            }
        }
        if (!sep) {
            if (final && pos < k->body.len && k->native) /* a last event without its blank line */
                native_event(k, b + pos, k->body.len - pos, 0);
            else if (final && pos < k->body.len && k->c && !k->xl)
                k->emit(k, b + pos, k->body.len - pos);
            if (final) pos = k->body.len;
            break;
        }
        const char *ev = b + pos;
        size_t evlen = evend - pos;
        int forwarded = 0;
        if (k->native) { /* passed through, less what the proxy asked for */
            native_event(k, ev, evlen, sep);
            pos = evend + sep;
            continue;
        }
        if (k->xl) { /* a translated stream: each chunk becomes the agent's API's events */
            if (evlen > 5 && memcmp(ev, "data:", 5) == 0 && !memchr(ev, '\n', evlen)) {
                const char *d = ev + 5;
                size_t dl = evlen - 5;
                if (dl && *d == ' ') d++, dl--;
                json_t *o = dl == 6 && memcmp(d, "[DONE]", 6) == 0
                                ? NULL
                                : json_loadb(d, dl, JSON_ALLOW_NUL, NULL);
                if (o) {
                    capture_object(k, o, 1);
                    px_xl_chunk(k, o);
                    json_decref(o);
                } else if (dl == 6 && memcmp(d, "[DONE]", 6) == 0) {
                    px_xl_stream_end(k, NULL);
                }
            }
            pos = evend + sep;
            continue;
        }
        if (evlen > 5 && memcmp(ev, "data:", 5) == 0 && !memchr(ev, '\n', evlen)) {
            const char *d = ev + 5;
            size_t dl = evlen - 5;
            if (dl && *d == ' ') d++, dl--;
            if (!(dl == 6 && memcmp(d, "[DONE]", 6) == 0)) {
                json_t *o = json_loadb(d, dl, JSON_ALLOW_NUL, NULL);
                if (o) {
                    capture_object(k, o, 1);
                    json_t *ch = json_object_get(o, "choices");
                    int usage_only = json_is_array(ch) && json_array_size(ch) == 0 &&
                                     json_is_object(json_object_get(o, "usage"));
                    json_decref(o);
                    if (usage_only && k->injected_usage) {
                        forwarded = 1; /* the agent did not ask for it */
                    } else {
                        long sl = px_strip_for_agent(k, d, dl, 1, NULL);
                        if (sl >= 0 && k->c) {
                            size_t pre = (size_t)(d - ev);
                            char *tmp = malloc(pre + (size_t)sl + sep);
                            if (tmp) {
                                memcpy(tmp, ev, pre);
                                memcpy(tmp + pre, k->px->strip.data, (size_t)sl);
                                memcpy(tmp + pre + sl, b + evend, sep);
                                k->emit(k, tmp, pre + (size_t)sl + sep);
                                free(tmp);
                            }
                            forwarded = 1;
                        } else if (sl >= 0) {
                            forwarded = 1;
                        }
                    }
                }
            }
        }
        if (!forwarded && k->c) k->emit(k, ev, evlen + sep);
        pos = evend + sep;
    }
    if (pos) {
        memmove(k->body.data, k->body.data + pos, k->body.len - pos);
        k->body.len -= pos;
    }
}

/* Builds the span of a finished call (merged response for streams) and spools it. */
void px_call_span(call *k)
{
    proxy *px = k->px;
    al_span s;
    char tmp_trace[33], tmp_parent[17];
    px_span_init(px, &s, &k->id, k->seq, NULL, tmp_trace, k->span_id, tmp_parent);
    s.trace_id = k->trace;
    if (k->parent_set) s.parent_span_id = k->parent;
    s.kind = AL_SPAN_KIND_LLM_CALL;
    al_llm_call *l = &s.llm_call;
    const char *up = px->up_public[k->up_idx];
    l->agent = k->agent ? k->agent : "";
    l->model = k->model ? k->model : "";
    l->upstream = up;
    /* with --sync-topic, what sync says the replica served then (fleet.h) */
    l->policy_version = px_fleet_version(px, k->up_idx, k->start_us, k->end_us, k->policy_version);
    l->request_json = k->req_json;
    char *merged = NULL;
    if (k->native) px_native_check(k);
    if (k->xl || (k->native && (k->agent_answer || k->headers_sent))) {
        l->response_json = k->agent_answer ? k->agent_answer : "";
    } else if (k->stream && k->headers_sent) {
        json_t *choice;
        const char *content = k->content.len ? (const char *)k->content.data : NULL;
        json_t *jc = content ? json_stringn(content, k->content.len) : json_null();
        if (k->is_chat) {
            json_t *msg = json_pack("{s:s,s:o}", "role", "assistant", "content", jc);
            if (k->tools) json_object_set(msg, "tool_calls", k->tools);
            choice = json_pack("{s:i,s:o}", "index", 0, "message", msg);
        } else {
            choice = json_pack("{s:i,s:o}", "index", 0, "text", content ? jc : json_string(""));
            if (!content) json_decref(jc);
        }
        json_object_set_new(choice, "finish_reason",
                            k->finish ? json_string(k->finish) : json_null());
        json_t *o = json_pack("{s:s,s:s,s:I,s:s,s:[o]}", "id", k->s_id ? k->s_id : "", "object",
                              k->is_chat ? "chat.completion" : "text_completion", "created",
                              (json_int_t)k->s_created, "model", k->s_model ? k->s_model : "",
                              "choices", choice);
        if (k->have_usage && o)
            json_object_set_new(o, "usage",
                                json_pack("{s:I,s:I,s:I}", "prompt_tokens",
                                          (json_int_t)k->usage.prompt_tokens, "completion_tokens",
                                          (json_int_t)k->usage.completion_tokens, "total_tokens",
                                          (json_int_t)k->usage.total_tokens));
        merged = o ? json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
        json_decref(o);
        l->response_json = merged ? merged : "";
    } else {
        if (al_buf_reserve(&k->body, 1) == 0) k->body.data[k->body.len] = '\0';
        l->response_json = k->body.data ? (const char *)k->body.data : "";
    }
    l->stream = k->stream;
    l->prompt_token_ids = k->prompt.v;
    l->n_prompt_tokens = k->prompt.n;
    l->response_token_ids = k->resp_ids.v;
    l->n_response_tokens = k->resp_ids.n;
    if (k->lps.n == k->resp_ids.n) {
        l->response_logprobs = k->lps.v;
        l->n_response_logprobs = k->lps.n;
    } else if (k->lps.n && k->resp_ids.n) {
        al_log_warn(COMP,
                    "rollout %s call %" PRId64 ": %zu logprobs for %zu tokens; logprobs "
                    "not recorded",
                    k->id.rollout, k->seq, k->lps.n, k->resp_ids.n);
    }
    l->finish_reason = k->finish;
    l->http_status = (int32_t)k->status;
    l->error = k->error;
    l->start_us = k->start_us;
    l->first_byte_us = k->first_byte_us;
    l->first_token_us = k->first_token_us;
    l->end_us = k->end_us;
    l->usage = k->usage;
    px_span_publish(px, &s);
    free(merged);
}

/* Rewrites the agent's request for capture: token ids and logprobs per upstream kind, usage
 * in streams. Records what the agent itself asked for so the answer can be put back. */
char *px_rewrite_request(call *k, json_t *req)
{
    upkind kind = k->px->cfg.kind;
    json_t *lp = json_object_get(req, "logprobs");
    k->want_logprobs =
        k->is_chat ? json_is_true(lp) : (json_is_integer(lp) && json_integer_value(lp) > 0);
    k->want_token_ids = json_is_true(json_object_get(req, "return_token_ids"));
    k->stream = json_is_true(json_object_get(req, "stream"));
    const char *m = json_string_value(json_object_get(req, "model"));
    if (m) k->model = strdup(m);
    /* Only what the agent left out or turned off is asked for; a value of the wrong type
     * ("logprobs": "yes") goes to the upstream as the agent wrote it, so that the agent gets
     * the answer it would have had without the proxy (a 400 from serve or vLLM), not a 200 for
     * a request the upstream never saw. */
    json_t *rti = json_object_get(req, "return_token_ids");
    int rti_off = !rti || json_is_null(rti) || json_is_false(rti);
    int lp_off = !lp || json_is_null(lp) ||
                 (k->is_chat ? json_is_false(lp)
                             : json_is_integer(lp) && json_integer_value(lp) == 0);
    /* OpenAI's API has no token ids, and some of its models refuse logprobs: the call must
     * not fail because of capture, so only text and usage are captured there */
    if (kind != UP_OPENAI && rti_off) json_object_set_new(req, "return_token_ids", json_true());
    /* a held-out evaluation samples the way the evaluator says, whatever the agent asked */
    if (k->id.eval) json_object_set_new(req, "temperature", json_real(k->id.eval_temperature));
    if (lp_off && kind != UP_OPENAI) {
        if (k->is_chat)
            json_object_set_new(req, "logprobs", json_true());
        else
            json_object_set_new(req, "logprobs", json_integer(1));
    }
    if (k->stream) {
        json_t *so = json_object_get(req, "stream_options");
        if (!json_is_true(json_object_get(so, "include_usage"))) {
            k->injected_usage = 1;
            if (!json_is_object(so)) {
                so = json_object();
                json_object_set_new(req, "stream_options", so);
            }
            json_object_set_new(so, "include_usage", json_true());
        }
    }
    return json_dumps(req, JSON_COMPACT | JSON_PRESERVE_ORDER);
}
