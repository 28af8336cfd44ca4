/*
 * t1009_proxy_clients: real agent harnesses, unchanged but for their base URL, through
 * `arclight proxy`: the OpenAI Agents SDK for JavaScript (@openai/agents, its default
 * Responses model, a function tool; tests/agents/agents_sdk_agent.js), the Codex CLI
 * (`codex exec` with a custom provider at the proxy, wire_api responses) and Claude Code
 * (`claude -p` with ANTHROPIC_BASE_URL at the proxy), the versions pinned in
 * tests/node/package.json. Each finishes a run, first against the vLLM-like test upstream
 * (which answers with a tool call when given tools: the harness runs its tool and goes on),
 * then against `arclight serve` with a random Qwen3-shaped model of 32k context and the
 * Qwen3 tokenizer, since their prompts run to 10k tokens and more. Every call of theirs is a
 * span with the prompt's token ids, the answer's token ids and their logprobs.
 *
 * The model is random but for one planted trait: every token's embedding has the same
 * large first coordinate and the end token's output row reads it, so each answer ends
 * after a token or two (Codex asks for no max_output_tokens: a plainly random model would
 * decode until the 32k context is full).
 */
#define _GNU_SOURCE
#include "testlib.h"
#include "broker_fixture.h"
#include "t1099_proxy_helpers.h"
#include "t1199_serve_helpers.h"

#include <jansson.h>

static al_test_broker B;
static fake_upstream *U;
static sv_server S;
static px_child PF, PS; /* the proxy before the fake upstream, and before serve */
static char TMP[512], MODEL[700];
static const char *SERVED = "arclight-qwen3-test";

static const char *src(void)
{
    const char *s = getenv("ARCLIGHT_SOURCE_DIR");
    return s && *s ? s : ".";
}

static const char *build(void)
{
    const char *b = getenv("ARCLIGHT_BUILD_DIR");
    return b && *b ? b : "build";
}

/* Plants the end token in DIR/model.safetensors (see the top). 0 or -1. */
static int plant_end_token(const char *path, int eos, float lift)
{
    FILE *f = fopen(path, "r+b");
    if (!f) return -1;
    uint64_t hl = 0;
    if (fread(&hl, 8, 1, f) != 1 || hl > (1u << 24)) {
        fclose(f);
        return -1;
    }
    char *h = malloc(hl + 1);
    if (!h || fread(h, 1, hl, f) != hl) {
        free(h);
        fclose(f);
        return -1;
    }
    h[hl] = '\0';
    json_t *hdr = json_loads(h, 0, NULL);
    free(h);
    json_t *emb = json_object_get(hdr, "model.embed_tokens.weight");
    json_t *lm = json_object_get(hdr, "lm_head.weight");
    int rc = -1;
    if (emb && lm && !strcmp(json_string_value(json_object_get(emb, "dtype")), "F32")) {
        long vocab = (long)json_integer_value(json_array_get(json_object_get(emb, "shape"), 0));
        long c = (long)json_integer_value(json_array_get(json_object_get(emb, "shape"), 1));
        long e0 = (long)json_integer_value(json_array_get(json_object_get(emb, "data_offsets"), 0));
        long l0 = (long)json_integer_value(json_array_get(json_object_get(lm, "data_offsets"), 0));
        long base = 8 + (long)hl;
        float v = 8.0f;
        rc = 0;
        for (long t = 0; t < vocab && !rc; t++)
            rc = fseek(f, base + e0 + t * c * 4, SEEK_SET) || fwrite(&v, 4, 1, f) != 1;
        float *row = calloc((size_t)c, sizeof *row);
        row[0] = lift;
        if (!rc)
            rc = fseek(f, base + l0 + (long)eos * c * 4, SEEK_SET) ||
                 fwrite(row, 4, (size_t)c, f) != (size_t)c;
        free(row);
    }
    json_decref(hdr);
    return fclose(f) || rc ? -1 : 0;
}

TEST(setup)
{
    curl_global_init(CURL_GLOBAL_DEFAULT);
    REQUIRE(al_test_broker_start(&B, NULL) == 0);
    U = fake_upstream_start(0, 1);
    REQUIRE(U);
    al_test_tmpdir(TMP, sizeof TMP, "proxy");
    REQUIRE(TMP[0]);
    char up[128];
    snprintf(up, sizeof up, "http://127.0.0.1:%d", fake_upstream_port(U));
    REQUIRE(px_start_proxy(&PF, TMP, up, B.bootstrap, "fake", NULL, NULL) == 0);
    /* the model for serve: random, Qwen3-shaped, 32k context, the Qwen3 tokenizer */
    snprintf(MODEL, sizeof MODEL, "%s/qwen3", TMP);
    REQUIRE(sv_sh("%s model init --config %s/tests/proxy/qwen3-32k.json --out %s --seed 11 "
                  ">/dev/null && cp %s/tokenizer/qwen3/tokenizer.json "
                  "%s/tokenizer/qwen3/tokenizer_config.json %s/",
                  sv_bin(), src(), MODEL, build(), build(), MODEL) == 0);
    char st[800];
    snprintf(st, sizeof st, "%s/model.safetensors", MODEL);
    REQUIRE(plant_end_token(st, 151645, 1.6f) == 0);
    const char *sb = getenv("ARCLIGHT_SERVE_BIN");
    if (sb && access(sb, X_OK) != 0) unsetenv("ARCLIGHT_SERVE_BIN"); /* no release build */
    fprintf(stderr, "  serve runs from %s\n", sv_serve_bin());
    const char *sargs[] = {"--model", MODEL, "--served-model-name", SERVED, "--max-model-len",
                           "32768",   NULL};
    REQUIRE(sv_start(&S, sargs) == 0);
    REQUIRE(px_start_proxy(&PS, TMP, S.url, B.bootstrap, "serve", NULL, NULL) == 0);
}

/* Runs a shell command line with a time limit; its stdout in *out (malloc'd). The exit
 * status, or -1. */
static int run_client(const char *cmdline, int timeout_s, char **out)
{
    char cmd[8192], path[700];
    snprintf(path, sizeof path, "%s/client.out", TMP);
    snprintf(cmd, sizeof cmd, "timeout -k 5 %d sh -c '%s' >'%s' 2>'%s.err' </dev/null", timeout_s,
             cmdline, path, path);
    int rc = system(cmd);
    rc = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
    *out = al_test_slurp(path, NULL);
    if (rc != 0) {
        fprintf(stderr, "  client exit %d: %s\n  its stderr:\n", rc, cmdline);
        snprintf(cmd, sizeof cmd, "tail -30 '%s.err' >&2", path);
        if (system(cmd)) {
        }
    }
    return rc;
}

static int agents_sdk(const px_child *p, const char *rollout, const char *model, char **out)
{
    char cmd[4096];
    snprintf(cmd, sizeof cmd,
             "OPENAI_BASE_URL=%s/r/task-c/%s/v1 OPENAI_API_KEY=sk-agent-test ARCLIGHT_MODEL=%s "
             "ARCLIGHT_MAX_TOKENS=48 node %s/tests/agents/agents_sdk_agent.js",
             p->base, rollout, model, src());
    return run_client(cmd, 600, out);
}

static int codex(const px_child *p, const char *rollout, const char *model, char **out)
{
    char home[700], cfg[800];
    snprintf(home, sizeof home, "%s/codex-%s", TMP, rollout);
    mkdir(home, 0700);
    snprintf(cfg, sizeof cfg, "%s/config.toml", home);
    FILE *f = fopen(cfg, "w");
    if (!f) return -1;
    fprintf(f,
            "model = \"%s\"\nmodel_provider = \"arclight\"\n\n[model_providers.arclight]\n"
            "name = \"arclight proxy\"\nbase_url = \"%s/r/task-c/%s/v1\"\nwire_api = "
            "\"responses\"\nenv_key = \"ARCLIGHT_AGENT_KEY\"\n",
            model, p->base, rollout);
    fclose(f);
    char cmd[4096];
    snprintf(cmd, sizeof cmd,
             "cd %s && CODEX_HOME=%s HOME=%s ARCLIGHT_AGENT_KEY=sk-agent-test "
             "%s/tests/node/node_modules/.bin/codex exec --skip-git-repo-check "
             "\"What is the weather in Paris?\"",
             home, home, home, src());
    return run_client(cmd, 600, out);
}

static int claude(const px_child *p, const char *rollout, const char *model, char **out)
{
    char home[700];
    snprintf(home, sizeof home, "%s/claude-%s", TMP, rollout);
    mkdir(home, 0700);
    char cmd[4096];
    snprintf(cmd, sizeof cmd,
             "cd %s && HOME=%s ANTHROPIC_BASE_URL=%s/r/task-c/%s ANTHROPIC_API_KEY=sk-agent-test "
             "DISABLE_TELEMETRY=1 CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1 "
             "DISABLE_AUTOUPDATER=1 CLAUDE_CODE_MAX_OUTPUT_TOKENS=64 "
             "%s/tests/node/node_modules/.bin/claude -p \"What is the weather in Paris?\" "
             "--model %s",
             home, home, p->base, rollout, src(), model);
    return run_client(cmd, 600, out);
}

/* The spans of rollout: at least min_calls, each a whole captured call. */
static void check_spans(const char *rollout, size_t min_calls, size_t min_prompt, const char *api)
{
    al_test_msgs m;
    CHECK(al_test_topic_read(B.bootstrap, "arclight.spans", rollout, min_calls, 60000, &m) == 0);
    al_span s[32];
    size_t n = px_spans_of(&m, rollout, s, 32);
    CHECKF(n >= min_calls, "%s: %zu spans, expected at least %zu", rollout, n, min_calls);
    for (size_t i = 0; i < n; i++) {
        const al_llm_call *c = &s[i].llm_call;
        CHECKF(s[i].kind == AL_SPAN_KIND_LLM_CALL, "%s span %zu: kind %d", rollout, i,
               (int)s[i].kind);
        CHECKF(c->http_status == 200, "%s span %zu: status %d (%s)", rollout, i, c->http_status,
               c->error ? c->error : "");
        CHECKF(c->n_prompt_tokens >= min_prompt, "%s span %zu: %zu prompt tokens", rollout, i,
               c->n_prompt_tokens);
        CHECKF(c->n_response_tokens >= 1, "%s span %zu: no response tokens", rollout, i);
        CHECKF(c->n_response_logprobs == c->n_response_tokens,
               "%s span %zu: %zu logprobs, %zu "
               "tokens",
               rollout, i, c->n_response_logprobs, c->n_response_tokens);
        CHECKF(strstr(c->request_json, api) != NULL, "%s span %zu: request_json lacks %s", rollout,
               i, api);
        CHECK_EQ_INT(s[i].sequence, (int64_t)i);
        al_span_clear(&s[i]);
    }
    al_test_msgs_free(&m);
}

/* Against the test upstream: each harness gets a get_weather call, runs it (or answers
 * that it cannot), and finishes on "The answer is 4." */
TEST(agents_sdk_through_the_proxy)
{
    char *out = NULL;
    CHECK_EQ_INT(agents_sdk(&PF, "roll-sdk", "fake-model", &out), 0);
    json_t *o = out ? json_loads(out, 0, NULL) : NULL;
    CHECKF(o != NULL, "the agent printed: %s", out ? out : "(nothing)");
    CHECK_EQ_STR(json_string_value(json_object_get(o, "final")), "The answer is 4.");
    CHECK_EQ_STR(json_string_value(json_object_get(o, "stream_final")), "The answer is 4.");
    CHECK_EQ_STR(json_string_value(json_object_get(o, "stream_deltas")), "The answer is 4.");
    CHECK_EQ_STR(json_string_value(json_array_get(json_object_get(o, "calls"), 0)), "Paris");
    json_decref(o);
    free(out);
    /* two runs of two calls each: the tool call, then the answer */
    check_spans("roll-sdk", 4, 1, "\"input\"");
}

TEST(codex_through_the_proxy)
{
    char *out = NULL;
    CHECK_EQ_INT(codex(&PF, "roll-codex", "fake-model", &out), 0);
    CHECKF(out && strstr(out, "The answer is 4."), "codex printed: %s", out ? out : "");
    free(out);
    check_spans("roll-codex", 2, 1, "\"input\"");
}

TEST(claude_code_through_the_proxy)
{
    char *out = NULL;
    CHECK_EQ_INT(claude(&PF, "roll-claude", "fake-model", &out), 0);
    CHECKF(out && strstr(out, "The answer is 4."), "claude printed: %s", out ? out : "");
    free(out);
    check_spans("roll-claude", 2, 1, "\"messages\"");
}

/* Against arclight serve: the harnesses' own long prompts, the served tokens captured. */
TEST(agents_sdk_on_arclight_serve)
{
    char *out = NULL;
    CHECK_EQ_INT(agents_sdk(&PS, "roll-sdk-serve", SERVED, &out), 0);
    free(out);
    check_spans("roll-sdk-serve", 2, 20, "\"input\"");
}

TEST(codex_on_arclight_serve)
{
    char *out = NULL;
    CHECK_EQ_INT(codex(&PS, "roll-codex-serve", SERVED, &out), 0);
    free(out);
    check_spans("roll-codex-serve", 1, 4000, "\"input\"");
}

TEST(claude_code_on_arclight_serve)
{
    char *out = NULL;
    CHECK_EQ_INT(claude(&PS, "roll-claude-serve", SERVED, &out), 0);
    free(out);
    check_spans("roll-claude-serve", 1, 4000, "\"messages\"");
}

/* Anthropic's count_tokens, which Claude Code may send: serve's /tokenize counts. */
TEST(count_tokens_on_arclight_serve)
{
    char url[512], body[512];
    snprintf(url, sizeof url, "%s/r/task-c/roll-count/v1/messages/count_tokens", PS.base);
    snprintf(body, sizeof body,
             "{\"model\":\"%s\",\"system\":\"Be brief.\",\"messages\":[{\"role\":\"user\","
             "\"content\":\"How many tokens is this?\"}]}",
             SERVED);
    const char *h[] = {"Content-Type: application/json", "anthropic-version: 2023-06-01", NULL};
    px_resp r;
    REQUIRE(px_http("POST", url, h, body, &r) == 0);
    CHECK_EQ_INT(r.status, 200);
    json_t *o = json_loads(r.body, 0, NULL);
    CHECKF(json_integer_value(json_object_get(o, "input_tokens")) > 10, "answer: %s", r.body);
    json_decref(o);
    px_resp_free(&r);
}

TEST(teardown)
{
    CHECK_EQ_INT(px_stop(&PF, SIGTERM, 30), 0);
    CHECK_EQ_INT(px_stop(&PS, SIGTERM, 30), 0);
    CHECK_EQ_INT(sv_stop(&S), 0);
    fake_upstream_stop(U);
    al_test_broker_stop(&B);
    al_test_rmtree(TMP);
    curl_global_cleanup();
}
