/*
 * t1000_proxy_parsers: the HTTP/1.1 head parser the proxy reads requests with (lib/http/http1.c,
 * under the proxy's limits) and its byte-preserving JSON editor (stages/proxy/json_edit.c), case
 * by case.
 */
#include "testlib.h"

#include "http/http1.h"
#include "../stages/proxy/json_edit.h"

#include <string.h>

static int parse(const char *s, al_http_head *h)
{
    char err[128];
    al_http_limits lim = {.max_line = 2048, .max_head = 2048, .max_headers = 8};
    return al_http_parse_head(s, strlen(s), &lim, h, err, sizeof err);
}

TEST(head_complete_and_fields)
{
    al_http_head h;
    const char *req = "POST /r/t/r/v1/chat/completions?x=1 HTTP/1.1\r\nHost: a\r\n"
                      "Content-Type:  application/json \r\nContent-Length: 12\r\n\r\n{\"a\":1}";
    int n = parse(req, &h);
    CHECK_EQ_INT(n, (int)(strstr(req, "{") - req));
    CHECK(al_slice_eq(h.method, "POST"));
    CHECK(al_slice_eq(h.target, "/r/t/r/v1/chat/completions?x=1"));
    CHECK_EQ_INT(h.minor_version, 1);
    CHECK_EQ_INT(h.nheaders, 3);
    CHECK_EQ_INT(h.content_length, 12);
    CHECK_EQ_INT(h.keep_alive, 1);
    const al_slice *ct = al_http_header_get(&h, "content-type");
    REQUIRE(ct);
    CHECK(al_slice_eq(*ct, "application/json"));
    CHECK(al_http_header_get(&h, "x-missing") == NULL);
}

TEST(head_incomplete_needs_more)
{
    al_http_head h;
    CHECK_EQ_INT(parse("POST / HTTP/1.1\r\nHost: a\r\n", &h), 0);
    CHECK_EQ_INT(parse("", &h), 0);
    CHECK_EQ_INT(parse("GE", &h), 0);
}

TEST(head_keep_alive_rules)
{
    al_http_head h;
    CHECK(parse("GET / HTTP/1.0\r\n\r\n", &h) > 0 && h.keep_alive == 0);
    CHECK(parse("GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n", &h) > 0 && h.keep_alive == 1);
    CHECK(parse("GET / HTTP/1.1\r\nHost: a\r\nConnection: foo, close\r\n\r\n", &h) > 0 &&
          h.keep_alive == 0);
    CHECK(parse("GET / HTTP/1.1\nHost: a\n\n", &h) > 0 && h.keep_alive == 1); /* bare LF, like nginx */
}

TEST(head_errors_have_statuses)
{
    al_http_head h;
    CHECK_EQ_INT(parse("POST / HTTP/2.0\r\n\r\n", &h), -505);
    CHECK_EQ_INT(parse("POST  / HTTP/1.1\r\n\r\n", &h), -400);
    CHECK_EQ_INT(parse("PO(ST / HTTP/1.1\r\n\r\n", &h), -400);
    CHECK_EQ_INT(parse("POST / HTTP/1.1\r\nHost: a\r\nBad Name: x\r\n\r\n", &h), -400);
    CHECK_EQ_INT(parse("POST / HTTP/1.1\r\nHost: a\r\nA: b\r\n  folded\r\n\r\n", &h), -400);
    CHECK_EQ_INT(parse("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: -1\r\n\r\n", &h), -400);
    CHECK_EQ_INT(parse("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n", &h),
                 -400);
    CHECK_EQ_INT(parse("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 99999999999999999\r\n\r\n", &h), -400);
    CHECK_EQ_INT(parse("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip\r\n\r\n", &h), -501);
    CHECK_EQ_INT(
        parse("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n", &h),
        -400);
    CHECK_EQ_INT(parse("POST / HTTP/1.1\r\nHost: a\r\nA: x\001y\r\n\r\n", &h), -400);
    /* 9 headers > limit 8 */
    CHECK_EQ_INT(
        parse(
            "GET / HTTP/1.1\r\na:1\r\nb:1\r\nc:1\r\nd:1\r\ne:1\r\nf:1\r\ng:1\r\nh:1\r\ni:1\r\n\r\n",
            &h),
        -431);
    /* head over 2048 bytes, complete or not */
    char big[4096];
    memset(big, 'a', sizeof big);
    memcpy(big, "GET / HTTP/1.1\r\nX: ", 19);
    big[sizeof big - 1] = '\0';
    CHECK_EQ_INT(parse(big, &h), -431);
    memcpy(big + sizeof big - 5, "\r\n\r\n", 5);
    CHECK_EQ_INT(parse(big, &h), -431);
    h.chunked = 0;
    CHECK(parse("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n", &h) > 0 &&
          h.chunked);
}

/* What issue 15 (item 15, 17) made the parser refuse or accept. */
TEST(head_one_content_length_host_nul_and_target_forms)
{
    al_http_head h;
    /* a second Content-Length is a 400 even when it repeats the first; "+2" is no length */
    CHECK_EQ_INT(parse("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\n",
                       &h),
                 -400);
    CHECK_EQ_INT(parse("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: +2\r\n\r\n", &h), -400);
    CHECK_EQ_INT(parse("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1, 1\r\n\r\n", &h), -400);
    /* Host: required in HTTP/1.1, once */
    CHECK_EQ_INT(parse("GET / HTTP/1.1\r\n\r\n", &h), -400);
    CHECK_EQ_INT(parse("GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", &h), -400);
    CHECK(parse("GET / HTTP/1.0\r\n\r\n", &h) > 0);
    /* whitespace before the colon */
    CHECK_EQ_INT(parse("GET / HTTP/1.1\r\nHost : a\r\n\r\n", &h), -400);
    /* absolute-form: the path routes, the authority is the host */
    CHECK(parse("GET http://example.com:8080/r/t/r/v1/models?x=1 HTTP/1.1\r\nHost: other\r\n\r\n",
                &h) > 0);
    CHECK(al_slice_eq(h.path, "/r/t/r/v1/models"));
    CHECK(al_slice_eq(h.query, "x=1"));
    CHECK(al_slice_eq(h.host, "example.com:8080"));
    CHECK(parse("GET http://example.com HTTP/1.1\r\nHost: a\r\n\r\n", &h) > 0 &&
          al_slice_eq(h.path, "/"));
    CHECK_EQ_INT(parse("GET example.com/x HTTP/1.1\r\nHost: a\r\n\r\n", &h), -400);
    CHECK_EQ_INT(parse("GET http://user@example.com/ HTTP/1.1\r\nHost: a\r\n\r\n", &h), -400);
    /* Expect: 100-continue is noted */
    CHECK(parse("POST / HTTP/1.1\r\nHost: a\r\nExpect: 100-Continue\r\nContent-Length: 1\r\n\r\n",
                &h) > 0 &&
          h.expect_continue);
    /* a request line longer than the line limit is 414, before it even ends */
    char big[4096];
    memset(big, 'a', sizeof big);
    memcpy(big, "GET /", 5);
    big[sizeof big - 1] = '\0';
    CHECK_EQ_INT(parse(big, &h), -414);
}

/* Chunked bodies: sizes, extensions, trailers, split anywhere. */
static int sink(void *ud, const char *d, size_t n)
{
    char *o = ud;
    size_t l = strlen(o);
    if (l + n >= 256) return -1;
    memcpy(o + l, d, n);
    o[l + n] = '\0';
    return 0;
}

TEST(chunked_bodies_decode_whole_and_in_pieces)
{
    const char *b = "4;a=b\r\nWiki\r\n5\r\npedia\r\nE\r\n in\r\n\r\nchunks.\r\n0\r\nX: y\r\n\r\nNEXT";
    for (size_t step = 1; step <= strlen(b); step++) {
        al_http_chunked c = {0};
        char out[256] = "", err[128];
        size_t off = 0, used = 0;
        int rc = 0;
        while (off < strlen(b) && rc == 0) {
            size_t n = strlen(b) - off < step ? strlen(b) - off : step;
            rc = al_http_chunked_feed(&c, b + off, n, &used, 1000, sink, out, err, sizeof err);
            off += used;
        }
        CHECKF(rc == 1 && !strcmp(out, "Wikipedia in\r\n\r\nchunks.") && !strcmp(b + off, "NEXT"),
               "step %zu: rc %d, body '%s', rest '%s'", step, rc, out, b + off);
    }
    al_http_chunked c = {0};
    char out[256] = "", err[128];
    size_t used;
    CHECK_EQ_INT(al_http_chunked_feed(&c, "zz\r\n", 4, &used, 1000, sink, out, err, sizeof err), -400);
    memset(&c, 0, sizeof c);
    CHECK_EQ_INT(al_http_chunked_feed(&c, "5x\r\n", 4, &used, 1000, sink, out, err, sizeof err), -400);
    memset(&c, 0, sizeof c);
    CHECK_EQ_INT(al_http_chunked_feed(&c, "1000\r\n", 6, &used, 100, sink, out, err, sizeof err), -413);
    memset(&c, 0, sizeof c);
    CHECK_EQ_INT(al_http_chunked_feed(&c, "1\r\nab\r\n", 7, &used, 100, sink, out, err, sizeof err),
                 -400);
    memset(&c, 0, sizeof c);
    CHECK_EQ_INT(al_http_chunked_feed(&c, "1234567890abcdef0\r\n", 19, &used, 100, sink, out, err,
                                      sizeof err),
                 -400);
}

static const char *strip(const char *in, const al_json_strip *spec, char *out, size_t cap)
{
    long n = al_json_strip_apply(in, strlen(in), spec, out, cap);
    if (n < 0) return NULL;
    out[n] = '\0';
    return out;
}

TEST(json_strip_keeps_other_bytes)
{
    static const char *const top[] = {"prompt_token_ids", "usage", NULL};
    static const char *const ch[] = {"token_ids", NULL};
    static const char *const chn[] = {"logprobs", NULL};
    al_json_strip spec = {.top_remove = top, .choice_remove = ch, .choice_null = chn};
    char out[1024];
    const char *r;
    r = strip("{\"id\":\"x\",\"choices\":[{\"index\":0,\"logprobs\":{\"content\":[1]},\"token_"
              "ids\":[1,2]}],"
              "\"prompt_token_ids\":[3]}",
              &spec, out, sizeof out);
    CHECK_EQ_STR(r ? r : "(fail)", "{\"id\":\"x\",\"choices\":[{\"index\":0,\"logprobs\":null}]}");
    /* first member removed, spacing elsewhere kept */
    r = strip("{ \"prompt_token_ids\" : [1] ,  \"a\" : 1, \"usage\": {\"x\": 2} }", &spec, out,
              sizeof out);
    CHECK_EQ_STR(r ? r : "(fail)", "{ \"a\" : 1 }");
    /* every member removed */
    r = strip("{\"usage\":1,\"prompt_token_ids\":2}", &spec, out, sizeof out);
    CHECK_EQ_STR(r ? r : "(fail)", "{}");
    /* nested objects with the same names are left alone */
    r = strip("{\"a\":{\"usage\":1},\"choices\":[{\"m\":{\"token_ids\":[1]}}]}", &spec, out,
              sizeof out);
    CHECK_EQ_STR(r ? r : "(fail)",
                 "{\"a\":{\"usage\":1},\"choices\":[{\"m\":{\"token_ids\":[1]}}]}");
    /* escapes in strings */
    r = strip("{\"s\":\"a\\\"}\\u00e9\",\"usage\":[]}", &spec, out, sizeof out);
    CHECK_EQ_STR(r ? r : "(fail)", "{\"s\":\"a\\\"}\\u00e9\"}");
    /* invalid JSON is refused */
    CHECK(strip("{\"a\":1,}", &spec, out, sizeof out) == NULL);
    CHECK(strip("{\"a\":01}", &spec, out, sizeof out) == NULL);
    CHECK(strip("[1]", &spec, out, sizeof out) == NULL);
    CHECK(strip("{\"a\":1} x", &spec, out, sizeof out) == NULL);
    CHECK(strip("{\"a\":\"\\x\"}", &spec, out, sizeof out) == NULL);
    /* too small an output buffer */
    CHECK(strip("{\"a\":12345}", &spec, out, 4) == NULL);
    /* deep nesting is bounded, not a stack overflow */
    static char deep[4000];
    memset(deep, '[', sizeof deep);
    memcpy(deep, "{\"a\":", 5);
    deep[sizeof deep - 1] = '\0';
    CHECK(strip(deep, &spec, out, sizeof out) == NULL);
}

TEST(json_lookups_without_a_tree)
{
    const char *j = "{ \"a\" : [1, {\"b\":\"x\\\"y\"}, [2,3]], \"choices\":[], \"n\": -1.5e3 }";
    size_t n = strlen(j);
    CHECK_EQ_INT(al_json_valid(j, n), 1);
    CHECK_EQ_INT(al_json_valid("{\"a\":1} 2", 9), 0);
    CHECK_EQ_INT(al_json_valid("", 0), 0);
    al_slice v, e;
    REQUIRE(al_json_member(j, n, "a", &v) == 1);
    CHECK(al_slice_eq(v, "[1, {\"b\":\"x\\\"y\"}, [2,3]]"));
    REQUIRE(al_json_element(v.p, v.n, 1, &e) == 1);
    CHECK(al_slice_eq(e, "{\"b\":\"x\\\"y\"}"));
    CHECK_EQ_INT(al_json_element(v.p, v.n, 3, &e), 0);
    CHECK_EQ_INT(al_json_member(j, n, "missing", &e), 0);
    CHECK_EQ_INT(al_json_member("[1]", 3, "a", &e), -1);
    REQUIRE(al_json_member(j, n, "n", &e) == 1);
    CHECK(al_slice_eq(e, "-1.5e3"));
    REQUIRE(al_json_member(j, n, "choices", &e) == 1);
    al_json_iter it;
    REQUIRE(al_json_iter_init(&it, e.p, e.n) == 0);
    CHECK_EQ_INT(al_json_iter_next(&it, &e), 0);
    REQUIRE(al_json_iter_init(&it, v.p, v.n) == 0);
    int count = 0;
    while (al_json_iter_next(&it, &e) == 1)
        count++;
    CHECK_EQ_INT(count, 3);
    CHECK_EQ_INT(al_json_iter_init(&it, "{}", 2), -1);
    REQUIRE(al_json_iter_init(&it, "[1,,2]", 6) == 0);
    CHECK_EQ_INT(al_json_iter_next(&it, &e), 1);
    CHECK_EQ_INT(al_json_iter_next(&it, &e), -1);
}

TEST(json_members_one_pass)
{
    static const char *const keys[] = {"b", "missing", "a", "c"};
    al_slice v[4];
    const char *in = " {\"a\": [1, {\"b\": 2}], \"b\" : \"x\\\"y\", \"c\":null, \"a\":7} ";
    CHECK_EQ_INT(al_json_members(in, strlen(in), keys, v, 4), 3);
    CHECK(v[0].n == 6 && memcmp(v[0].p, "\"x\\\"y\"", 6) == 0);
    CHECK(v[1].p == NULL && v[1].n == 0);
    /* a key given twice: the last one, as jansson, Python and the upstreams take it (issue 15,
     * item 10: the proxy used to read the first) */
    CHECK(v[2].n == 1 && memcmp(v[2].p, "7", 1) == 0);
    CHECK(v[3].n == 4 && memcmp(v[3].p, "null", 4) == 0);
    CHECK_EQ_INT(al_json_members("{}", 2, keys, v, 4), 0);
    CHECK_EQ_INT(al_json_members("[1]", 3, keys, v, 4), -1);
    CHECK_EQ_INT(al_json_members("{\"a\":1,", 7, keys, v, 4), -1);
    /* the whole object is read, also when every key was found early */
    static const char *const one[] = {"a"};
    CHECK_EQ_INT(al_json_members("{\"a\":1,garbage", 14, one, v, 1), -1);
    /* an escaped key is the key it spells */
    const char *esc = "{\"stre\\u0061m\":true,\"\\u0073tream\":false}";
    static const char *const st[] = {"stream"};
    CHECK_EQ_INT(al_json_members(esc, strlen(esc), st, v, 1), 1);
    CHECK(v[0].n == 5 && memcmp(v[0].p, "false", 5) == 0);
}

/* The lookups for text validated before (capture after the strip pass) find what the checking
 * ones find; the strip pass hands capture the top-level members and the first choice. */
TEST(json_lookups_on_validated_text)
{
    static const char *const keys[] = {"prompt_token_ids", "usage", "choices", NULL};
    const char *in = "{\"choices\":[{\"a\":\"]}\\\"\",\"lp\":{\"content\":[{\"logprob\":-0.25},"
                     "{\"x\":[1,{\"y\":\"}\"}]},3]}},{\"b\":2}],\"us\\u0061ge\":{\"n\":1},"
                     "\"prompt_token_ids\":[1, 2],\"usage\":{\"n\":4}}";
    size_t n = strlen(in);
    al_slice fast[3], slow[3], c0, v;
    REQUIRE(al_json_valid(in, n));
    CHECK_EQ_INT(al_json_members_valid(in, n, keys, fast, 3), 3);
    CHECK_EQ_INT(al_json_members(in, n, keys, slow, 3), 3);
    for (int i = 0; i < 3; i++)
        CHECK(fast[i].p == slow[i].p && fast[i].n == slow[i].n);
    CHECK(fast[1].n == 7 && memcmp(fast[1].p, "{\"n\":4}", 7) == 0); /* the last usage */
    /* elements read as objects in the pass that delimits them; other values: 2 */
    static const char *const el[] = {"logprob", "x"};
    al_slice ev[2];
    al_json_iter it;
    REQUIRE(al_json_iter_init_valid(&it, fast[2].p, fast[2].n) == 0);
    static const char *const ck[] = {"lp"};
    REQUIRE(al_json_iter_next_members(&it, ck, &v, 1, &c0) == 1);
    CHECK(c0.p == fast[2].p + 1 && c0.p[c0.n - 1] == '}');
    static const char *const content[] = {"content"};
    al_slice arr;
    REQUIRE(al_json_members_valid(v.p, v.n, content, &arr, 1) == 1);
    REQUIRE(al_json_iter_init_valid(&it, arr.p, arr.n) == 0);
    CHECK_EQ_INT(al_json_iter_next_members(&it, el, ev, 2, &v), 1);
    CHECK(ev[0].n == 5 && memcmp(ev[0].p, "-0.25", 5) == 0 && !ev[1].p);
    CHECK_EQ_INT(al_json_iter_next_members(&it, el, ev, 2, &v), 1);
    CHECK(!ev[0].p && ev[1].n == 13);
    CHECK_EQ_INT(al_json_iter_next_members(&it, el, ev, 2, &v), 2);
    CHECK(v.n == 1 && v.p[0] == '3' && !ev[0].p);
    CHECK_EQ_INT(al_json_iter_next_members(&it, el, ev, 2, &v), 0);
    /* the checking iterator refuses what the validated one does not look at */
    REQUIRE(al_json_iter_init(&it, "[{\"a\":01}]", 10) == 0);
    CHECK_EQ_INT(al_json_iter_next_members(&it, el, ev, 2, &v), -1);
    /* truncated text: the validated lookups stay inside it and fail */
    CHECK_EQ_INT(al_json_members_valid(in, 20, keys, fast, 3), -1);
    /* the strip pass finds the same members and the first choice */
    static const char *const chn[] = {"lp", NULL};
    al_slice found[3], first;
    al_json_strip spec = {.choice_null = chn, .top_find = keys, .top_found = found,
                          .first_choice = &first};
    char out[1024];
    REQUIRE(strip(in, &spec, out, sizeof out) != NULL);
    for (int i = 0; i < 3; i++)
        CHECK(found[i].p == slow[i].p && found[i].n == slow[i].n);
    CHECK(first.p == c0.p && first.n == c0.n);
    /* a later "choices" that is not an array: no first choice */
    const char *late = "{\"choices\":[{\"a\":1}],\"choices\":null}";
    REQUIRE(strip(late, &spec, out, sizeof out) != NULL);
    CHECK(first.p == NULL && found[2].n == 4);
}
