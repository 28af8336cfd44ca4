/*
 * 1101: `arclight serve` over HTTP with the tiny model. The logprobs it returns equal the
 * trainer's (lib/model packed forward + al_logprob_forward) for the same tokens and weights
 * within 1e-4 nats, on /v1/completions and /v1/chat/completions; vLLM's field names for
 * token ids; seeded determinism; concurrent requests (continuous batching) give the tokens
 * each gives alone; streaming gives the tokens of the same seeded non-streaming request and
 * ends with [DONE]; stop strings; OpenAI-style 4xx errors; 429 + Retry-After at the
 * sequence limit; the policy version in the header and the JSON.
 */
#include "testlib.h"
#include "t1199_serve_helpers.h"

#include <pthread.h>

static char *g_dir, g_model[300];
static sv_server g_srv;

static int setup(void)
{
    if (g_srv.pid) return 0;
    curl_global_init(CURL_GLOBAL_ALL);
    g_dir = sv_tmpdir("t1101");
    if (!g_dir || sv_make_model(g_dir, "tiny", 5) != 0) return -1;
    snprintf(g_model, sizeof g_model, "%s/tiny", g_dir);
    const char *args[] = {"--model", g_model, "--max-model-len", "512", "--policy-version",
                          "3",       NULL};
    return sv_start(&g_srv, args);
}

/* Checks a response's tokens against the trainer; returns the worst difference. */
static double compare_with_trainer(const int32_t *prompt, int np, const int32_t *gen, int ng,
                                   const double *served)
{
    float *lp = malloc(sizeof(float) * (size_t)(ng + 1));
    if (sv_trainer_logprobs(g_model, prompt, np, gen, ng, lp) != 0) {
        free(lp);
        return 1e9;
    }
    double worst = 0;
    for (int i = 0; i < ng; i++)
        worst = fmax(worst, fabs(served[i] - lp[i]));
    free(lp);
    return worst;
}

TEST(completions_logprobs_equal_trainer)
{
    REQUIRE(setup() == 0);
    sv_resp r;
    sv_http(g_srv.url, "/v1/completions",
            "{\"model\":\"tiny\",\"prompt\":[1,2,3,40,50,60,70],\"max_tokens\":32,\"logprobs\":2,"
            "\"return_token_ids\":true,\"seed\":11,\"temperature\":1.0,\"ignore_eos\":true}",
            &r);
    REQUIRE(r.code == 200);
    CHECK(strstr(r.headers.p, "x-arclight-policy-version: 3") != NULL);
    json_t *j = json_loads(r.body.p, JSON_ALLOW_NUL, NULL);
    REQUIRE(j);
    CHECK_EQ_INT(json_integer_value(json_object_get(j, "policy_version")), 3);
    CHECK_EQ_STR(json_string_value(json_object_get(j, "object")), "text_completion");
    json_t *c0 = json_array_get(json_object_get(j, "choices"), 0);
    int32_t *prompt, *gen;
    int np = sv_ids(json_object_get(c0, "prompt_token_ids"), &prompt);
    int ng = sv_ids(json_object_get(c0, "token_ids"), &gen);
    CHECK_EQ_INT(np, 7);
    CHECK_EQ_INT(ng, 32);
    CHECK_EQ_STR(json_string_value(json_object_get(c0, "finish_reason")), "length");
    json_t *lp = json_object_get(c0, "logprobs");
    json_t *tl = json_object_get(lp, "token_logprobs");
    REQUIRE(json_array_size(tl) == (size_t)ng);
    CHECK_EQ_INT((int)json_array_size(json_object_get(lp, "tokens")), ng);
    CHECK_EQ_INT((int)json_array_size(json_object_get(lp, "top_logprobs")), ng);
    double served[64], spread = 0;
    for (int i = 0; i < ng; i++) {
        served[i] = json_real_value(json_array_get(tl, (size_t)i));
        spread = fmax(spread, fabs(served[i]));
    }
    double worst = compare_with_trainer(prompt, np, gen, ng, served);
    printf("  completions: max |served - trainer| = %.2e over %d tokens\n", worst, ng);
    CHECKF(worst < 1e-4, "served logprobs differ from the trainer's by %g", worst);
    CHECK(spread > 1); /* random weights: logprobs are far from 0, the check bites */
    json_t *u = json_object_get(j, "usage");
    CHECK_EQ_INT(json_integer_value(json_object_get(u, "completion_tokens")), 32);
    CHECK_EQ_INT(json_integer_value(json_object_get(u, "prompt_tokens")), 7);
    free(prompt), free(gen);
    json_decref(j);
    sv_resp_free(&r);
}

TEST(long_prompt_prefilled_in_chunks_matches_the_trainer)
{
    REQUIRE(setup() == 0);
    /* 500 prompt tokens: two prefill chunks of the engine (256 per step) */
    char *body = malloc(8192);
    int k = snprintf(body, 8192, "{\"prompt\":[");
    for (int i = 0; i < 500; i++)
        k += snprintf(body + k, 8192 - k, "%s%d", i ? "," : "", (i * 37 + 11) % 500);
    snprintf(body + k, 8192 - k,
             "],\"max_tokens\":8,\"logprobs\":0,\"return_token_ids\":true,\"seed\":2}");
    long code;
    json_t *j = sv_post_json(g_srv.url, "/v1/completions", body, &code);
    free(body);
    REQUIRE(code == 200 && j);
    json_t *c0 = json_array_get(json_object_get(j, "choices"), 0);
    int32_t *prompt, *gen;
    int np = sv_ids(json_object_get(c0, "prompt_token_ids"), &prompt);
    int ng = sv_ids(json_object_get(c0, "token_ids"), &gen);
    CHECK_EQ_INT(np, 500);
    REQUIRE(ng == 8);
    json_t *tl = json_object_get(json_object_get(c0, "logprobs"), "token_logprobs");
    double served[8];
    for (int i = 0; i < ng; i++)
        served[i] = json_real_value(json_array_get(tl, (size_t)i));
    double worst = compare_with_trainer(prompt, np, gen, ng, served);
    printf("  500-token prompt: max |served - trainer| = %.2e\n", worst);
    CHECKF(worst < 1e-4, "served logprobs differ from the trainer's by %g", worst);
    free(prompt), free(gen);
    json_decref(j);
}

TEST(logprobs_mode_temperature_matches_the_trainer_at_that_temperature)
{
    REQUIRE(setup() == 0);
    sv_server s4;
    const char *args[] = {"--model", g_model, "--logprobs-mode", "temperature", NULL};
    REQUIRE(sv_start(&s4, args) == 0);
    long code;
    json_t *j =
        sv_post_json(s4.url, "/v1/completions",
                     "{\"prompt\":[5,6,7,8],\"max_tokens\":16,\"temperature\":0.7,\"logprobs\":2,"
                     "\"seed\":4,\"ignore_eos\":true,\"return_token_ids\":true}",
                     &code);
    REQUIRE(code == 200 && j);
    json_t *c0 = json_array_get(json_object_get(j, "choices"), 0);
    int32_t *prompt, *gen;
    int np = sv_ids(json_object_get(c0, "prompt_token_ids"), &prompt);
    int ng = sv_ids(json_object_get(c0, "token_ids"), &gen);
    REQUIRE(ng == 16);
    json_t *tl = json_object_get(json_object_get(c0, "logprobs"), "token_logprobs");
    float at07[16], at1[16];
    REQUIRE(sv_trainer_logprobs_t(g_model, prompt, np, gen, ng, 0.7f, at07) == 0);
    REQUIRE(sv_trainer_logprobs(g_model, prompt, np, gen, ng, at1) == 0);
    double worst = 0, apart = 0;
    for (int i = 0; i < ng; i++) {
        double v = json_real_value(json_array_get(tl, (size_t)i));
        worst = fmax(worst, fabs(v - at07[i]));
        apart = fmax(apart, fabs(v - at1[i]));
    }
    printf("  --logprobs-mode temperature, T=0.7: max |served - trainer(T=0.7)| = %.2e (vs T=1: "
           "%.2f)\n",
           worst, apart);
    CHECKF(worst < 1e-4, "served logprobs differ from the trainer's at T=0.7 by %g", worst);
    CHECK(apart > 1e-2);
    free(prompt), free(gen);
    json_decref(j);
    CHECK_EQ_INT(sv_stop(&s4), 0);
}

TEST(chat_logprobs_and_token_ids_like_vllm)
{
    REQUIRE(setup() == 0);
    long code;
    json_t *j = sv_post_json(
        g_srv.url, "/v1/chat/completions",
        "{\"model\":\"tiny\",\"messages\":[{\"role\":\"system\",\"content\":\"be brief\"},"
        "{\"role\":\"user\",\"content\":\"hello there\"}],\"max_tokens\":20,\"logprobs\":true,"
        "\"top_logprobs\":3,\"return_token_ids\":true,\"seed\":5}",
        &code);
    REQUIRE(code == 200 && j);
    CHECK_EQ_STR(json_string_value(json_object_get(j, "object")), "chat.completion");
    int32_t *prompt, *gen;
    int np = sv_ids(json_object_get(j, "prompt_token_ids"), &prompt); /* top level, as vLLM */
    json_t *c0 = json_array_get(json_object_get(j, "choices"), 0);
    int ng = sv_ids(json_object_get(c0, "token_ids"), &gen);
    CHECK(np > 10);
    CHECK(ng >= 1 && ng <= 20);
    CHECK_EQ_STR(json_string_value(json_object_get(json_object_get(c0, "message"), "role")),
                 "assistant");
    json_t *content = json_object_get(json_object_get(c0, "logprobs"), "content");
    REQUIRE(json_array_size(content) == (size_t)ng);
    double served[32];
    for (int i = 0; i < ng; i++) {
        json_t *e = json_array_get(content, (size_t)i);
        served[i] = json_real_value(json_object_get(e, "logprob"));
        json_t *top = json_object_get(e, "top_logprobs");
        CHECK_EQ_INT((int)json_array_size(top), 3);
        CHECK(json_is_array(json_object_get(e, "bytes")));
        double t0 = json_real_value(json_object_get(json_array_get(top, 0), "logprob"));
        CHECKF(served[i] <= t0 + 1e-12, "token %d: logprob %g above the top-1 %g", i, served[i],
               t0);
    }
    double worst = compare_with_trainer(prompt, np, gen, ng, served);
    printf("  chat: max |served - trainer| = %.2e over %d tokens\n", worst, ng);
    CHECKF(worst < 1e-4, "served logprobs differ from the trainer's by %g", worst);
    free(prompt), free(gen);
    json_decref(j);
}

/* Token ids of a seeded completion request. */
static int gen_ids(const char *base, int seed, int max_tokens, int32_t **ids)
{
    char body[256];
    snprintf(body, sizeof body,
             "{\"prompt\":\"abc "
             "def\",\"max_tokens\":%d,\"seed\":%d,\"return_token_ids\":true,\"ignore_eos\":true,"
             "\"top_p\":0.9,\"top_k\":50}",
             max_tokens, seed);
    long code;
    json_t *j = sv_post_json(base, "/v1/completions", body, &code);
    if (code != 200 || !j) {
        json_decref(j);
        *ids = NULL;
        return -1;
    }
    int n =
        sv_ids(json_object_get(json_array_get(json_object_get(j, "choices"), 0), "token_ids"), ids);
    json_decref(j);
    return n;
}

TEST(seeded_sampling_is_deterministic)
{
    REQUIRE(setup() == 0);
    int32_t *a, *b, *c;
    int na = gen_ids(g_srv.url, 123, 24, &a), nb = gen_ids(g_srv.url, 123, 24, &b),
        nc = gen_ids(g_srv.url, 124, 24, &c);
    REQUIRE(na == 24 && nb == 24 && nc == 24);
    CHECK(memcmp(a, b, sizeof(int32_t) * 24) == 0);
    CHECK(memcmp(a, c, sizeof(int32_t) * 24) != 0);
    free(a), free(b), free(c);
}

TEST(concurrent_requests_give_the_tokens_of_one_at_a_time)
{
    REQUIRE(setup() == 0);
    enum { N = 6, L = 200 }; /* long enough that the requests overlap in the engine */
    int32_t *alone[N];
    for (int i = 0; i < N; i++)
        REQUIRE(gen_ids(g_srv.url, 1000 + i, L + i, &alone[i]) == L + i);
    char *bodies[N];
    for (int i = 0; i < N; i++) {
        bodies[i] = malloc(256);
        snprintf(bodies[i], 256,
                 "{\"prompt\":\"abc def\",\"max_tokens\":%d,\"seed\":%d,\"return_token_ids\":true,"
                 "\"ignore_eos\":true,\"top_p\":0.9,\"top_k\":50}",
                 L + i, 1000 + i);
    }
    sv_resp out[N];
    json_t *h0 = sv_get_json(g_srv.url, "/health");
    sv_post_many(g_srv.url, "/v1/completions", bodies, N, out);
    json_t *h1 = sv_get_json(g_srv.url, "/health");
    /* continuous batching: more tokens than engine steps while the requests ran together */
    double steps = (double)(json_integer_value(json_object_get(h1, "decode_steps")) -
                            json_integer_value(json_object_get(h0, "decode_steps")));
    double toks = (double)(json_integer_value(json_object_get(h1, "generated_tokens")) -
                           json_integer_value(json_object_get(h0, "generated_tokens")));
    printf("  %d concurrent requests: %.0f tokens in %.0f engine steps\n", N, toks, steps);
    CHECK_EQ_INT((int)toks, N * L + N * (N - 1) / 2);
    CHECKF(toks > 1.5 * steps, "requests did not decode together (%g tokens, %g steps)", toks,
           steps);
    json_decref(h0), json_decref(h1);
    for (int i = 0; i < N; i++) {
        CHECK_EQ_INT((int)out[i].code, 200);
        json_t *j = out[i].body.p ? json_loads(out[i].body.p, JSON_ALLOW_NUL, NULL) : NULL;
        int32_t *ids = NULL;
        int n = j ? sv_ids(json_object_get(json_array_get(json_object_get(j, "choices"), 0),
                                           "token_ids"),
                           &ids)
                  : -1;
        CHECK_EQ_INT(n, L + i);
        if (n == L + i)
            CHECKF(memcmp(ids, alone[i], sizeof(int32_t) * n) == 0, "request %d: tokens differ", i);
        free(ids);
        json_decref(j);
        sv_resp_free(&out[i]);
        free(bodies[i]);
        free(alone[i]);
    }
    /* n = 2 streamed: chunks of both choices, each ending with its own finish */
    sv_resp rs;
    sv_http(g_srv.url, "/v1/completions",
            "{\"prompt\":\"abc "
            "def\",\"max_tokens\":6,\"seed\":9,\"n\":2,\"stream\":true,\"ignore_eos\":true,"
            "\"return_token_ids\":true}",
            &rs);
    REQUIRE(rs.code == 200 && rs.body.p);
    int ntk[2] = {0, 0}, fins[2] = {0, 0};
    for (char *line = strtok(rs.body.p, "\n"); line; line = strtok(NULL, "\n")) {
        if (strncmp(line, "data: {", 7)) continue;
        json_t *cj = json_loads(line + 6, JSON_ALLOW_NUL, NULL);
        json_t *ch = json_array_get(json_object_get(cj, "choices"), 0);
        int idx = (int)json_integer_value(json_object_get(ch, "index"));
        if (idx >= 0 && idx < 2) {
            ntk[idx] += (int)json_array_size(json_object_get(ch, "token_ids"));
            fins[idx] += json_is_string(json_object_get(ch, "finish_reason"));
        }
        json_decref(cj);
    }
    CHECKF(ntk[0] == 6 && ntk[1] == 6 && fins[0] == 1 && fins[1] == 1,
           "n=2 stream: %d/%d tokens, %d/%d finishes", ntk[0], ntk[1], fins[0], fins[1]);
    sv_resp_free(&rs);
    /* n = 3 in one request: three sequences decoding side by side, each its own stream; the
     * prompt is prefilled once and its cache copied, and every choice's logprobs still equal
     * the trainer's */
    long code;
    json_t *j = sv_post_json(
        g_srv.url, "/v1/completions",
        "{\"prompt\":\"abc def\",\"max_tokens\":12,\"seed\":9,\"n\":3,\"return_token_ids\":true,"
        "\"ignore_eos\":true,\"logprobs\":0}",
        &code);
    REQUIRE(code == 200 && j);
    json_t *ch = json_object_get(j, "choices");
    REQUIRE(json_array_size(ch) == 3);
    int32_t *x[3], *prompt;
    for (int i = 0; i < 3; i++) {
        json_t *ci = json_array_get(ch, (size_t)i);
        CHECK_EQ_INT(json_integer_value(json_object_get(ci, "index")), i);
        int np = sv_ids(json_object_get(ci, "prompt_token_ids"), &prompt);
        int ng = sv_ids(json_object_get(ci, "token_ids"), &x[i]);
        REQUIRE(ng == 12);
        json_t *tl = json_object_get(json_object_get(ci, "logprobs"), "token_logprobs");
        double served[12];
        for (int t = 0; t < 12; t++)
            served[t] = json_real_value(json_array_get(tl, (size_t)t));
        double worst = compare_with_trainer(prompt, np, x[i], ng, served);
        CHECKF(worst < 1e-4, "choice %d: logprobs differ from the trainer's by %g", i, worst);
        free(prompt);
    }
    CHECK(memcmp(x[0], x[1], sizeof(int32_t) * 12) != 0);
    CHECK(memcmp(x[1], x[2], sizeof(int32_t) * 12) != 0);
    for (int i = 0; i < 3; i++)
        free(x[i]);
    json_decref(j);
}

TEST(streaming_gives_the_same_tokens_and_done)
{
    REQUIRE(setup() == 0);
    const char *msg = "\"messages\":[{\"role\":\"user\",\"content\":\"count to "
                      "ten\"}],\"max_tokens\":16,\"seed\":77,"
                      "\"return_token_ids\":true,\"logprobs\":true,\"ignore_eos\":true";
    char body[512];
    snprintf(body, sizeof body, "{%s}", msg);
    long code;
    json_t *whole = sv_post_json(g_srv.url, "/v1/chat/completions", body, &code);
    REQUIRE(code == 200 && whole);
    snprintf(body, sizeof body, "{%s,\"stream\":true,\"stream_options\":{\"include_usage\":true}}",
             msg);
    sv_resp r;
    sv_http(g_srv.url, "/v1/chat/completions", body, &r);
    REQUIRE(r.code == 200);
    CHECK(strstr(r.headers.p, "text/event-stream") != NULL);
    CHECK(strstr(r.headers.p, "x-arclight-policy-version: 3") != NULL);
    int32_t ids[64];
    int n = 0, nlp = 0, done = 0, usage = 0, have_prompt = 0;
    char *text = calloc(1, 4096);
    for (char *line = strtok(r.body.p, "\n"); line; line = strtok(NULL, "\n")) {
        REQUIRE(strncmp(line, "data: ", 6) == 0);
        if (!strcmp(line + 6, "[DONE]")) {
            done++;
            continue;
        }
        CHECK(!done);
        json_t *j = json_loads(line + 6, JSON_ALLOW_NUL, NULL);
        REQUIRE(j);
        CHECK_EQ_STR(json_string_value(json_object_get(j, "object")), "chat.completion.chunk");
        have_prompt |= json_is_array(json_object_get(j, "prompt_token_ids"));
        usage |= json_is_object(json_object_get(j, "usage"));
        json_t *c0 = json_array_get(json_object_get(j, "choices"), 0);
        json_t *t = json_object_get(c0, "token_ids");
        for (size_t i = 0; i < json_array_size(t) && n < 64; i++)
            ids[n++] = (int32_t)json_integer_value(json_array_get(t, i));
        const char *d = json_string_value(json_object_get(json_object_get(c0, "delta"), "content"));
        if (d) strncat(text, d, 4095 - strlen(text));
        nlp += (int)json_array_size(json_object_get(json_object_get(c0, "logprobs"), "content"));
        json_decref(j);
    }
    CHECK_EQ_INT(done, 1);
    CHECK(usage && have_prompt);
    json_t *c0 = json_array_get(json_object_get(whole, "choices"), 0);
    int32_t *wid;
    int wn = sv_ids(json_object_get(c0, "token_ids"), &wid);
    CHECK_EQ_INT(n, wn);
    CHECK_EQ_INT(nlp, wn);
    CHECK(n == wn && memcmp(ids, wid, sizeof(int32_t) * n) == 0);
    CHECK_EQ_STR(text,
                 json_string_value(json_object_get(json_object_get(c0, "message"), "content")));
    free(wid);
    free(text);
    sv_resp_free(&r);
    json_decref(whole);
}

TEST(stop_strings_cut_the_text)
{
    REQUIRE(setup() == 0);
    long code;
    json_t *j = sv_post_json(
        g_srv.url, "/v1/completions",
        "{\"prompt\":\"hello\",\"max_tokens\":40,\"temperature\":0,\"ignore_eos\":true}", &code);
    REQUIRE(code == 200 && j);
    const char *full = json_string_value(
        json_object_get(json_array_get(json_object_get(j, "choices"), 0), "text"));
    REQUIRE(full && strlen(full) > 12);
    /* a 3-byte piece from the middle of the greedy text as the stop string */
    char stop[8] = {0}, body[256];
    size_t at = strlen(full) / 2;
    while (at > 0 && ((unsigned char)full[at] & 0xC0) == 0x80)
        at--;
    memcpy(stop, full + at, 3);
    json_t *sj = json_stringn(stop, 3);
    if (!sj) { /* not valid UTF-8 on its own: take one byte */
        stop[1] = 0;
        sj = json_string(stop);
    }
    REQUIRE(sj);
    char *sjs = json_dumps(sj, JSON_ENCODE_ANY);
    snprintf(body, sizeof body,
             "{\"prompt\":\"hello\",\"max_tokens\":40,\"temperature\":0,\"ignore_eos\":true,"
             "\"stop\":[%s]}",
             sjs);
    json_t *k = sv_post_json(g_srv.url, "/v1/completions", body, &code);
    REQUIRE(code == 200 && k);
    json_t *c0 = json_array_get(json_object_get(k, "choices"), 0);
    const char *cut = json_string_value(json_object_get(c0, "text"));
    size_t first = (size_t)(strstr(full, json_string_value(sj)) - full);
    CHECK_EQ_INT((int)strlen(cut), (int)first);
    CHECK(strncmp(cut, full, first) == 0);
    CHECK_EQ_STR(json_string_value(json_object_get(c0, "finish_reason")), "stop");
    CHECK_EQ_STR(json_string_value(json_object_get(c0, "stop_reason")), json_string_value(sj));
    /* streamed: the same cut text, nothing of the stop string leaked in a chunk */
    snprintf(body, sizeof body,
             "{\"prompt\":\"hello\",\"max_tokens\":40,\"temperature\":0,\"ignore_eos\":true,"
             "\"stop\":[%s],"
             "\"stream\":true}",
             sjs);
    sv_resp r;
    sv_http(g_srv.url, "/v1/completions", body, &r);
    REQUIRE(r.code == 200 && r.body.p);
    char streamed[4096] = "";
    int stopped = 0;
    for (char *line = strtok(r.body.p, "\n"); line; line = strtok(NULL, "\n")) {
        if (strncmp(line, "data: {", 7)) continue;
        json_t *cj = json_loads(line + 6, JSON_ALLOW_NUL, NULL);
        json_t *ch = json_array_get(json_object_get(cj, "choices"), 0);
        const char *t = json_string_value(json_object_get(ch, "text"));
        if (t) strncat(streamed, t, sizeof streamed - strlen(streamed) - 1);
        const char *f = json_string_value(json_object_get(ch, "finish_reason"));
        if (f && !strcmp(f, "stop")) stopped++;
        json_decref(cj);
    }
    CHECK_EQ_STR(streamed, cut);
    CHECK_EQ_INT(stopped, 1);
    sv_resp_free(&r);
    free(sjs);
    json_decref(sj);
    json_decref(j);
    json_decref(k);
}

/* Expects status `code` and an OpenAI-style error whose message contains `needle`. */
static void expect_error(const char *path, const char *body, long want, const char *needle)
{
    long code;
    json_t *j = sv_post_json(g_srv.url, path, body, &code);
    CHECKF(code == want, "%s: status %ld, want %ld", body, code, want);
    json_t *e = json_object_get(j, "error");
    const char *m = json_string_value(json_object_get(e, "message"));
    CHECKF(m && strstr(m, needle), "%s: message '%s' lacks '%s'", body, m ? m : "(none)", needle);
    CHECK(json_is_integer(json_object_get(e, "code")) &&
          json_is_string(json_object_get(e, "type")));
    json_decref(j);
}

TEST(bad_input_gets_4xx)
{
    REQUIRE(setup() == 0);
    long code;
    expect_error("/v1/completions", "{not json", 400, "not valid JSON");
    expect_error("/v1/completions", "[1,2]", 400, "JSON object");
    expect_error("/v1/completions", "{\"model\":\"gpt-9\",\"prompt\":\"x\"}", 404, "gpt-9");
    expect_error("/v1/completions", "{\"prompt\":\"x\",\"temperature\":5}", 400, "temperature");
    expect_error("/v1/completions", "{\"prompt\":\"x\",\"top_p\":0}", 400, "top_p");
    expect_error("/v1/completions", "{\"prompt\":\"x\",\"n\":0}", 400, "n must be");
    expect_error("/v1/completions", "{\"prompt\":\"x\",\"max_tokens\":0}", 400, "max_tokens");
    expect_error("/v1/completions", "{\"prompt\":\"x\",\"max_tokens\":\"ten\"}", 400, "max_tokens");
    /* whole reals beyond int64 (converting one was undefined behaviour) */
    expect_error("/v1/completions", "{\"prompt\":\"x\",\"max_tokens\":2e31}", 400, "max_tokens");
    expect_error("/v1/completions", "{\"prompt\":\"x\",\"seed\":-1e300}", 400, "seed");
    expect_error("/v1/completions", "{\"prompt\":[1,2,99999]}", 400, "prompt[2]");
    expect_error("/v1/completions", "{\"prompt\":\"x\",\"max_tokens\":600}", 400,
                 "maximum context length is 512");
    expect_error("/v1/completions", "{\"prompt\":\"x\",\"logprobs\":50}", 400, "logprobs");
    expect_error("/v1/completions", "{}", 400, "prompt");
    expect_error("/v1/completions", "{\"prompt\":\"x\",\"presence_penalty\":0.5}", 400,
                 "presence_penalty");
    expect_error("/v1/completions", "{\"prompt\":\"x\",\"logit_bias\":{\"5\":10}}", 400,
                 "logit_bias");
    expect_error("/v1/completions", "{\"prompt\":\"x\",\"echo\":true}", 400, "echo");
    expect_error("/v1/chat/completions", "{\"messages\":[]}", 400, "messages");
    expect_error("/v1/chat/completions", "{\"messages\":[{\"content\":\"hi\"}]}", 400, "role");
    expect_error("/v1/chat/completions",
                 "{\"messages\":[{\"role\":\"wizard\",\"content\":\"hi\"}]}", 400, "wizard");
    expect_error("/v1/chat/completions", "{\"messages\":[{\"role\":\"user\",\"content\":5}]}", 400,
                 "content");
    expect_error("/v1/chat/completions",
                 "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"stop\":7}", 400, "stop");
    sv_resp r;
    sv_http(g_srv.url, "/v1/nothing", NULL, &r);
    CHECK_EQ_INT((int)r.code, 404);
    sv_resp_free(&r);
    /* vLLM's tokenize / detokenize agree with what generation uses */
    json_t *tk = sv_post_json(g_srv.url, "/tokenize", "{\"prompt\":\"abc def\"}", &code);
    CHECK_EQ_INT((int)code, 200);
    int32_t *tids;
    int ntk = sv_ids(json_object_get(tk, "tokens"), &tids);
    CHECK(ntk > 0 && json_integer_value(json_object_get(tk, "count")) == ntk);
    char body[256];
    int k = snprintf(body, sizeof body, "{\"tokens\":[");
    for (int i = 0; i < ntk; i++)
        k += snprintf(body + k, sizeof body - k, "%s%d", i ? "," : "", tids[i]);
    snprintf(body + k, sizeof body - k, "]}");
    json_t *dt = sv_post_json(g_srv.url, "/detokenize", body, &code);
    CHECK_EQ_STR(json_string_value(json_object_get(dt, "prompt")), "abc def");
    json_decref(tk), json_decref(dt), free(tids);
    json_t *tc = sv_post_json(g_srv.url, "/tokenize",
                              "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}", &code);
    CHECK(code == 200 && json_integer_value(json_object_get(tc, "count")) > 5);
    json_decref(tc);
    tc = sv_post_json(g_srv.url, "/detokenize", "{\"tokens\":[1,99999]}", &code);
    CHECK_EQ_INT((int)code, 400);
    json_decref(tc);
    sv_http(g_srv.url, "/metrics", NULL, &r);
    CHECK_EQ_INT((int)r.code, 200);
    CHECK(r.body.p && strstr(r.body.p, "arclight_serve_requests_total{status=\"4xx\"}"));
    CHECK(r.body.p && strstr(r.body.p, "arclight_serve_generated_tokens_total"));
    CHECK(r.body.p && strstr(r.body.p, "arclight_serve_time_to_first_token_seconds_count"));
    sv_resp_free(&r);
    sv_http(g_srv.url, "/v1/models", NULL, &r);
    CHECK_EQ_INT((int)r.code, 200);
    CHECK(r.body.p && strstr(r.body.p, "\"id\":\"tiny\""));
    sv_resp_free(&r);
}

static size_t abort_after_first(char *d, size_t sz, size_t n, void *ud)
{
    (void)d;
    *(size_t *)ud += sz * n;
    return 0; /* makes curl close the connection */
}

TEST(a_client_that_goes_away_stops_its_generation)
{
    REQUIRE(setup() == 0);
    json_t *h0 = sv_get_json(g_srv.url, "/health");
    CURL *c = curl_easy_init();
    char url[256];
    size_t got = 0;
    snprintf(url, sizeof url, "%s/v1/completions", g_srv.url);
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(
        c, CURLOPT_POSTFIELDS,
        "{\"prompt\":\"abc\",\"max_tokens\":480,\"n\":16,\"ignore_eos\":true,\"stream\":true}");
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, abort_after_first);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &got);
    CHECK_EQ_INT(curl_easy_perform(c), CURLE_WRITE_ERROR);
    curl_easy_cleanup(c);
    CHECK(got > 0);
    double t0 = testlib_now();
    json_t *h1 = NULL;
    while (testlib_now() - t0 < 30) {
        json_decref(h1);
        h1 = sv_get_json(g_srv.url, "/health");
        if (json_integer_value(json_object_get(h1, "running")) == 0) break;
        usleep(2000);
    }
    CHECK_EQ_INT(json_integer_value(json_object_get(h1, "running")), 0);
    int64_t made = json_integer_value(json_object_get(h1, "generated_tokens")) -
                   json_integer_value(json_object_get(h0, "generated_tokens"));
    printf("  the client left after its first chunk: %lld of %d tokens generated\n",
           (long long)made, 16 * 480);
    CHECKF(made < 16 * 480, "generation went on to the end (%lld tokens)", (long long)made);
    json_decref(h0), json_decref(h1);
    /* the server still answers */
    int32_t *ids;
    CHECK_EQ_INT(gen_ids(g_srv.url, 1, 4, &ids), 4);
    free(ids);
}

TEST(sequence_limit_gives_429_with_retry_after)
{
    REQUIRE(setup() == 0);
    sv_server s2;
    const char *args[] = {"--model", g_model, "--max-num-seqs", "2", NULL};
    REQUIRE(sv_start(&s2, args) == 0);
    enum { N = 5 };
    char *bodies[N];
    for (int i = 0; i < N; i++)
        bodies[i] = strdup("{\"prompt\":\"abc\",\"max_tokens\":300,\"ignore_eos\":true}");
    sv_resp out[N];
    sv_post_many(s2.url, "/v1/completions", bodies, N, out);
    int ok = 0, busy = 0;
    for (int i = 0; i < N; i++) {
        if (out[i].code == 200) ok++;
        if (out[i].code == 429) {
            busy++;
            CHECK(strstr(out[i].headers.p, "Retry-After: 1") != NULL);
            CHECK(strstr(out[i].body.p, "server busy") != NULL);
        }
        sv_resp_free(&out[i]);
        free(bodies[i]);
    }
    CHECKF(ok >= 2 && busy >= 1 && ok + busy == N, "%d ok, %d busy of %d", ok, busy, N);
    /* n over the limit can never fit: 400, not 429 */
    long code;
    json_t *j = sv_post_json(s2.url, "/v1/completions", "{\"prompt\":\"a\",\"n\":3}", &code);
    CHECK_EQ_INT((int)code, 400);
    json_decref(j);
    CHECK_EQ_INT(sv_stop(&s2), 0);
    /* the KV-cache bound: 1 MiB holds 2048 tokens of the tiny model (512 bytes each) */
    sv_server s3;
    const char *args3[] = {"--model", g_model, "--max-kv-mib", "1", NULL};
    REQUIRE(sv_start(&s3, args3) == 0);
    char *kb[2] = {strdup("{\"prompt\":\"abc\",\"max_tokens\":1200,\"ignore_eos\":true}"),
                   strdup("{\"prompt\":\"abc\",\"max_tokens\":1200,\"ignore_eos\":true}")};
    sv_resp ko[2];
    sv_post_many(s3.url, "/v1/completions", kb, 2, ko);
    int k200 = (ko[0].code == 200) + (ko[1].code == 200), k429 = 0;
    for (int i = 0; i < 2; i++) {
        if (ko[i].code == 429) {
            k429++;
            CHECK(strstr(ko[i].body.p, "KV cache") != NULL);
        }
        sv_resp_free(&ko[i]);
        free(kb[i]);
    }
    CHECKF(k200 == 1 && k429 == 1, "%d ok, %d busy", k200, k429);
    j = sv_post_json(s3.url, "/v1/completions", "{\"prompt\":\"a\",\"n\":2,\"max_tokens\":1500}",
                     &code);
    CHECK_EQ_INT((int)code, 400);
    json_decref(j);
    CHECK_EQ_INT(sv_stop(&s3), 0);
}

typedef struct bg_req {
    const char *url;
    sv_resp r;
    volatile size_t seen;
} bg_req;

static size_t bg_write(char *d, size_t sz, size_t n, void *ud)
{
    bg_req *b = ud;
    sv_write(d, sz, n, &b->r.body);
    b->seen = b->r.body.n;
    return sz * n;
}

static void *bg_main(void *arg)
{
    bg_req *b = arg;
    CURL *c = curl_easy_init();
    char url[256];
    snprintf(url, sizeof url, "%s/v1/completions", b->url);
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(
        c, CURLOPT_POSTFIELDS,
        "{\"prompt\":\"abc\",\"max_tokens\":200,\"n\":8,\"ignore_eos\":true,\"stream\":true,"
        "\"return_token_ids\":true}");
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, bg_write);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, b);
    if (curl_easy_perform(c) == CURLE_OK) curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &b->r.code);
    curl_easy_cleanup(c);
    return NULL;
}

TEST(sigterm_lets_requests_in_flight_finish)
{
    REQUIRE(setup() == 0);
    sv_server s2;
    const char *args[] = {"--model", g_model, "--drain-timeout", "60", NULL};
    REQUIRE(sv_start(&s2, args) == 0);
    bg_req b = {.url = s2.url};
    pthread_t th;
    REQUIRE(pthread_create(&th, NULL, bg_main, &b) == 0);
    double t0 = testlib_now();
    while (b.seen == 0 && testlib_now() - t0 < 30)
        usleep(500);
    REQUIRE(b.seen > 0);
    kill(s2.pid, SIGTERM);
    pthread_join(th, NULL);
    int st;
    waitpid(s2.pid, &st, 0);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    CHECK_EQ_INT((int)b.r.code, 200);
    CHECK(strstr(b.r.body.p ? b.r.body.p : "", "data: [DONE]") != NULL);
    int toks = 0;
    for (char *line = strtok(b.r.body.p, "\n"); line; line = strtok(NULL, "\n")) {
        if (strncmp(line, "data: {", 7)) continue;
        json_t *cj = json_loads(line + 6, JSON_ALLOW_NUL, NULL);
        toks += (int)json_array_size(
            json_object_get(json_array_get(json_object_get(cj, "choices"), 0), "token_ids"));
        json_decref(cj);
    }
    CHECK_EQ_INT(toks, 8 * 200);
    free(b.r.body.p);
}

TEST(server_shuts_down_cleanly)
{
    REQUIRE(setup() == 0);
    CHECK_EQ_INT(sv_stop(&g_srv), 0);
    al_test_rmtree(g_dir);
    free(g_dir);
    curl_global_cleanup();
}
