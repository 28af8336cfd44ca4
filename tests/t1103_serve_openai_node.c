/*
 * 1103: the official `openai` npm client (tests/agents/serve_openai.js) against `arclight
 * serve`: models, chat with logprobs, streaming, tools, completions, a 400.
 *
 * A random model never emits a tool call, so the served model (fixture tests/serve/tool-tiny)
 * is the tiny model taught one by this test: it asks the server for the exact prompt ids of
 * the client's tool conversations (return_token_ids) and checks that greedy decoding gives
 * the wanted answers (a <tool_call> for get_weather, then "Sunny in Paris." after the tool
 * result; with Qwen3's template on the same weights, a <think> block before "Hi.", which
 * comes back as reasoning_content); when it does not (the fixture predates a change of the
 * prompt rendering), it
 * fine-tunes the model with lib/model's trainer (SFT) until it does and serves that.
 */
#include "testlib.h"
#include "t1199_serve_helpers.h"

#include "text/tokenizer.h"
#include "model/trainer.h"

#define TOOLS                                                                                      \
    "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"description\":\"Weather of " \
    "a "                                                                                           \
    "city\",\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}},"  \
    "\"required\":[\"city\"]}}}]"

static const char *const k_prompts[4] = {
    "{\"messages\":[{\"role\":\"user\",\"content\":\"Weather in Paris?\"}],\"tools\":" TOOLS,
    "{\"messages\":[{\"role\":\"user\",\"content\":\"Weather in Paris?\"},{\"role\":\"assistant\","
    "\"content\":null,\"tool_calls\":[{\"id\":\"chatcmpl-tool-1\",\"type\":\"function\","
    "\"function\":"
    "{\"name\":\"get_weather\",\"arguments\":\"{\\\"city\\\": "
    "\\\"Paris\\\"}\"}}]},{\"role\":\"tool\","
    "\"tool_call_id\":\"chatcmpl-tool-1\",\"content\":\"{\\\"temp_c\\\": 21}\"}],\"tools\":" TOOLS,
    "{\"messages\":[{\"role\":\"user\",\"content\":\"Weather again?\"}],\"tools\":" TOOLS,
    /* served with Qwen3's template (a second server on the same weights) */
    "{\"messages\":[{\"role\":\"user\",\"content\":\"Think first.\"}]",
};
static const char *const k_answers[4] = {
    "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
    "\"Paris\"}}\n</tool_call><|im_end|>",
    "Sunny in Paris.<|im_end|>",
    "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
    "\"Paris\"}}\n</tool_call><|im_end|>",
    "<think>\nok\n</think>\n\nHi.<|im_end|>",
};

typedef struct example {
    int32_t *ids;
    int n, np;
} example;

/* Loads src (a model dir) and fine-tunes it on the examples until greedy decoding gives
 * each answer (no step at all when it already does). Saves the result as out_dir. Returns
 * the number of training steps taken, or -1. */
static int tune(const char *src, const char *out_dir, example *ex, int nex)
{
    char err[512];
    al_model *m = al_model_load_dir(src, err, sizeof err);
    if (!m) {
        fprintf(stderr, "  %s\n", err);
        return -1;
    }
    al_trainer_config cfg;
    al_trainer_config_default(&cfg);
    al_trainer_config_set(&cfg, "loss", "sft", err, sizeof err);
    al_trainer_config_set(&cfg, "lr", "1e-2", err, sizeof err);
    al_trainer *tr = al_trainer_new(m, NULL, &cfg, err, sizeof err);
    if (!tr) {
        fprintf(stderr, "  %s\n", err);
        al_model_free(m);
        return -1;
    }
    int T = 0;
    for (int i = 0; i < nex; i++)
        T += ex[i].n;
    int V = al_model_config_of(m)->vocab_size;
    int32_t *tok = malloc(sizeof(int32_t) * T), *pos = malloc(sizeof(int32_t) * T), cu[8] = {0};
    float *mask = calloc((size_t)T, sizeof(float)), *logits = malloc(sizeof(float) * (size_t)T * V);
    for (int i = 0, o = 0; i < nex; i++) {
        for (int t = 0; t < ex[i].n; t++) {
            tok[o + t] = ex[i].ids[t], pos[o + t] = t;
            mask[o + t] = t >= ex[i].np;
        }
        o += ex[i].n;
        cu[i + 1] = o;
    }
    al_train_chunk ch = {
        .T = T, .nseq = nex, .tokens = tok, .positions = pos, .cu_seqlens = cu, .mask = mask};
    int steps = 0, rc = -1;
    for (;;) {
        if (steps % 10 == 0) {
            if (al_model_forward(m, tok, pos, cu, nex, T, logits) != 0) break;
            int wrong = 0;
            for (int t = 1; t < T; t++) {
                if (!mask[t]) continue;
                const float *row = logits + (size_t)(t - 1) * V;
                int best = 0;
                for (int j = 1; j < V; j++)
                    if (row[j] > row[best]) best = j;
                wrong += best != tok[t];
            }
            if (!wrong) {
                rc = 0;
                break;
            }
        }
        if (steps == 400) break;
        al_train_stats st;
        if (al_trainer_step(tr, &ch, 1, &st, err, sizeof err) != 0) {
            fprintf(stderr, "  train: %s\n", err);
            break;
        }
        steps++;
    }
    printf("  %s: greedy gives the answers after %d fine-tuning steps (%d tokens per step)\n", src,
           steps, T);
    if (rc == 0 && steps > 0) rc = al_model_save_dir(m, out_dir, AL_ST_DTYPE_F32, err, sizeof err);
    free(tok), free(pos), free(mask), free(logits);
    al_trainer_free(tr);
    al_model_free(m);
    return rc == 0 ? steps : -1;
}

TEST(openai_npm_client_against_arclight_serve)
{
    if (system("node --version >/dev/null 2>&1") != 0 ||
        access("tests/node/node_modules/openai", F_OK) != 0) {
        printf("  node or tests/node/node_modules/openai missing: run scripts/setup.sh\n");
        CHECK(0);
        return;
    }
    curl_global_init(CURL_GLOBAL_ALL);
    char *dir = sv_tmpdir("t1103");
    REQUIRE(dir);
    /* The fixture tests/serve/tool-tiny is tiny-qwen2 (seed 5) fine-tuned by this test; when
     * the prompt rendering changed since it was made, the test tunes it again (slow) and
     * ARCLIGHT_REGEN_FIXTURES=1 writes the result back. */
    const char *fixture = "tests/serve/tool-tiny";
    char model[300];
    snprintf(model, sizeof model, "%s/tool-tiny", dir);
    REQUIRE(sv_sh("mkdir -p %s && cp %s/config.json %s/model.safetensors "
                  "tests/tokenizer/tiny/tokenizer.json "
                  "tests/tokenizer/tiny/tokenizer_config.json %s/",
                  model, fixture, fixture, model) == 0);
    sv_server s;
    const char *args[] = {
        "--model", model, "--served-model-name", "arclight-tiny", "--policy-version", "4", NULL};
    REQUIRE(sv_start(&s, args) == 0);
    /* the same weights behind Qwen3's chat template (reasoning parsed out of <think>) */
    char model3[300], q3path[1024];
    snprintf(model3, sizeof model3, "%s/think-tiny", dir);
    const char *bdir = getenv("ARCLIGHT_BUILD_DIR");
    snprintf(q3path, sizeof q3path, "%s/tokenizer/qwen3/tokenizer_config.json",
             bdir && *bdir ? bdir : "build");
    json_t *tc = json_load_file("tests/tokenizer/tiny/tokenizer_config.json", 0, NULL);
    json_t *q3 = json_load_file(q3path, 0, NULL);
    REQUIRE(tc && q3 && json_is_string(json_object_get(q3, "chat_template")));
    json_object_set(tc, "chat_template", json_object_get(q3, "chat_template"));
    REQUIRE(sv_sh("mkdir -p %s && cp %s/config.json %s/model.safetensors "
                  "tests/tokenizer/tiny/tokenizer.json %s/",
                  model3, fixture, fixture, model3) == 0);
    char tcpath[400];
    snprintf(tcpath, sizeof tcpath, "%s/tokenizer_config.json", model3);
    REQUIRE(json_dump_file(tc, tcpath, 0) == 0);
    json_decref(tc), json_decref(q3);
    sv_server s3;
    const char *args3[] = {"--model", model3, "--served-model-name", "arclight-tiny", NULL};
    REQUIRE(sv_start(&s3, args3) == 0);
    char err[256];
    al_tokenizer *tok = al_tokenizer_load_dir("tests/tokenizer/tiny", err, sizeof err);
    REQUIRE(tok);
    example ex[4];
    for (int i = 0; i < 4; i++) {
        char body[2048];
        snprintf(body, sizeof body, "%s,\"max_tokens\":1,\"return_token_ids\":true}", k_prompts[i]);
        long code;
        json_t *j = sv_post_json(i < 3 ? s.url : s3.url, "/v1/chat/completions", body, &code);
        REQUIRE(code == 200 && j);
        int32_t *p;
        ex[i].np = sv_ids(json_object_get(j, "prompt_token_ids"), &p);
        json_decref(j);
        al_token_ids ans = {0};
        REQUIRE(al_tokenizer_encode(tok, k_answers[i], strlen(k_answers[i]),
                                    AL_TOKENIZER_ALLOW_SPECIAL, &ans) == 0);
        ex[i].n = ex[i].np + (int)ans.len;
        ex[i].ids = malloc(sizeof(int32_t) * ex[i].n);
        memcpy(ex[i].ids, p, sizeof(int32_t) * ex[i].np);
        memcpy(ex[i].ids + ex[i].np, ans.ids, sizeof(int32_t) * ans.len);
        free(p);
        al_token_ids_free(&ans);
    }
    al_tokenizer_free(tok);
    char tuned[400];
    snprintf(tuned, sizeof tuned, "%s/tuned", dir);
    int steps = tune(model, tuned, ex, 4);
    for (int i = 0; i < 4; i++)
        free(ex[i].ids);
    REQUIRE(steps >= 0);
    if (steps > 0) {
        printf("  the fixture %s is stale; ARCLIGHT_REGEN_FIXTURES=1 rewrites it\n", fixture);
        if (getenv("ARCLIGHT_REGEN_FIXTURES"))
            REQUIRE(sv_sh("mkdir -p %s && cp %s/config.json %s/model.safetensors %s/", fixture,
                          tuned, tuned, fixture) == 0);
        CHECK_EQ_INT(sv_stop(&s), 0);
        CHECK_EQ_INT(sv_stop(&s3), 0);
        REQUIRE(sv_sh("cp %s/config.json %s/model.safetensors %s/ && cp %s/config.json "
                      "%s/model.safetensors %s/",
                      tuned, tuned, model, tuned, tuned, model3) == 0);
        REQUIRE(sv_start(&s, args) == 0);
        REQUIRE(sv_start(&s3, args3) == 0);
    }
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "OPENAI_BASE_URL='%s/v1' node tests/agents/serve_openai.js", s.url);
    FILE *f = popen(cmd, "r");
    REQUIRE(f);
    char line[8192] = "";
    char *got = fgets(line, sizeof line, f);
    int st = pclose(f);
    CHECK_EQ_INT(st, 0);
    json_t *o = got ? json_loads(line, 0, NULL) : NULL;
    REQUIRE(o);
    printf("  client saw: %.600s\n", line);
    CHECK_EQ_STR(json_string_value(json_array_get(json_object_get(o, "models"), 0)),
                 "arclight-tiny");
    CHECK_EQ_INT(json_integer_value(json_object_get(o, "chat_logprobs")),
                 json_integer_value(json_object_get(o, "usage")));
    CHECK_EQ_INT(json_integer_value(json_object_get(o, "chat_top")), 2);
    CHECK_EQ_STR(json_string_value(json_object_get(o, "header_version")), "4");
    CHECK_EQ_INT(json_integer_value(json_object_get(o, "json_version")), 4);
    CHECK_EQ_STR(json_string_value(json_object_get(o, "stream")),
                 json_string_value(json_object_get(o, "chat")));
    CHECK(json_integer_value(json_object_get(o, "stream_chunks")) >= 3);
    CHECK_EQ_STR(json_string_value(json_object_get(o, "tool_finish")), "tool_calls");
    json_t *tool = json_object_get(o, "tool");
    CHECK_EQ_STR(json_string_value(json_object_get(tool, "name")), "get_weather");
    CHECK_EQ_STR(json_string_value(json_object_get(json_object_get(tool, "args"), "city")),
                 "Paris");
    CHECK(!strncmp(json_string_value(json_object_get(tool, "id")) ?: "", "chatcmpl-tool-", 14));
    CHECK_EQ_STR(json_string_value(json_object_get(o, "final")), "Sunny in Paris.");
    json_t *stool = json_object_get(o, "stream_tool");
    CHECK_EQ_STR(json_string_value(json_object_get(stool, "name")), "get_weather");
    CHECK_EQ_STR(json_string_value(json_object_get(json_object_get(stool, "args"), "city")),
                 "Paris");
    CHECK_EQ_STR(json_string_value(json_object_get(stool, "finish")), "tool_calls");
    CHECK_EQ_INT(json_integer_value(json_object_get(o, "completion_tokens")), 5);
    json_t *bad = json_object_get(o, "bad");
    CHECK_EQ_INT(json_integer_value(json_object_get(bad, "status")), 400);
    CHECK_EQ_STR(json_string_value(json_object_get(bad, "param")), "temperature");
    json_decref(o);

    /* Qwen3 template: the <think> block comes back as reasoning_content, whole and streamed */
    long code;
    json_t *rj = sv_post_json(
        s3.url, "/v1/chat/completions",
        "{\"messages\":[{\"role\":\"user\",\"content\":\"Think first.\"}],\"temperature\":0}",
        &code);
    REQUIRE(code == 200 && rj);
    json_t *msg = json_object_get(json_array_get(json_object_get(rj, "choices"), 0), "message");
    const char *reasoning = json_string_value(json_object_get(msg, "reasoning_content"));
    const char *content = json_string_value(json_object_get(msg, "content"));
    printf("  qwen3 template: reasoning %s, content %s\n", reasoning ? reasoning : "(none)",
           content ? content : "(none)");
    CHECK(reasoning && strstr(reasoning, "ok") && !strstr(reasoning, "think>"));
    CHECK(content && strstr(content, "Hi.") && !strstr(content, "ok") &&
          !strstr(content, "think>"));
    sv_resp sr;
    sv_http(s3.url, "/v1/chat/completions",
            "{\"messages\":[{\"role\":\"user\",\"content\":\"Think "
            "first.\"}],\"temperature\":0,\"stream\":true}",
            &sr);
    REQUIRE(sr.code == 200 && sr.body.p);
    char sreason[256] = "", scontent[256] = "";
    for (char *ln = strtok(sr.body.p, "\n"); ln; ln = strtok(NULL, "\n")) {
        if (strncmp(ln, "data: {", 7)) continue;
        json_t *cj = json_loads(ln + 6, JSON_ALLOW_NUL, NULL);
        json_t *d = json_object_get(json_array_get(json_object_get(cj, "choices"), 0), "delta");
        const char *x = json_string_value(json_object_get(d, "reasoning_content"));
        if (x) strncat(sreason, x, sizeof sreason - strlen(sreason) - 1);
        x = json_string_value(json_object_get(d, "content"));
        if (x) strncat(scontent, x, sizeof scontent - strlen(scontent) - 1);
        json_decref(cj);
    }
    CHECK_EQ_STR(sreason, reasoning ? reasoning : "");
    CHECK_EQ_STR(scontent, content ? content : "");
    sv_resp_free(&sr);
    json_decref(rj);
    CHECK_EQ_INT(sv_stop(&s3), 0);
    CHECK_EQ_INT(sv_stop(&s), 0);
    al_test_rmtree(dir);
    free(dir);
    curl_global_cleanup();
}
