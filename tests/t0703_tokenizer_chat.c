/*
 * t0703_tokenizer_chat: ChatML rendering against the reference, and tool-call parsing.
 *
 * tests/tokenizer/expected_chat.json holds conversations (system prompts, tools, parallel
 * tool calls, grouped tool responses, reasoning, enable_thinking) and the text that
 * @huggingface/jinja renders for them from Qwen2.5's and Qwen3's real chat templates
 * (tests/tokenizer/gen_expected.mjs). Each is rebuilt here from plain C structs, rendered
 * by al_chat_render and compared byte for byte.
 */
#include "text/tokenizer.h"
#include "t0749_tokenizer_util.h"
#include "testlib.h"

static al_chat_role role_of(const char *r)
{
    if (strcmp(r, "system") == 0) return AL_CHAT_SYSTEM;
    if (strcmp(r, "user") == 0) return AL_CHAT_USER;
    if (strcmp(r, "assistant") == 0) return AL_CHAT_ASSISTANT;
    return AL_CHAT_TOOL;
}

TEST(render_matches_reference)
{
    al_json *fx = tok_load_fixture("tests/tokenizer/expected_chat.json");
    REQUIRE(fx);
    const al_json *cases = al_json_get(fx, "cases");
    REQUIRE(cases && cases->count >= 20);
    for (size_t i = 0; i < cases->count; i++) {
        const al_json *c = cases->items[i];
        const char *tpl = al_json_get_string(c, "template", "");
        const char *name = al_json_get_string(c, "name", "");
        const al_json *msgs = al_json_get(c, "messages"), *tools = al_json_get(c, "tools");
        const al_json *want = al_json_get(c, "text");
        al_chat_message *m = calloc(msgs->count, sizeof *m);
        al_chat_tool_call **calls = calloc(msgs->count, sizeof *calls);
        al_buf *argbufs = calloc(msgs->count * 4 + 1, sizeof *argbufs);
        size_t nargs = 0;
        for (size_t k = 0; k < msgs->count; k++) {
            const al_json *mj = msgs->items[k];
            m[k].role = role_of(al_json_get_string(mj, "role", ""));
            m[k].content = al_json_get_string(mj, "content", NULL);
            m[k].reasoning_content = al_json_get_string(mj, "reasoning_content", NULL);
            const al_json *tc = al_json_get(mj, "tool_calls");
            if (tc && tc->count) {
                calls[k] = calloc(tc->count, sizeof **calls);
                for (size_t j = 0; j < tc->count; j++) {
                    const al_json *fn = al_json_get(tc->items[j], "function");
                    calls[k][j].name = al_json_get_string(fn, "name", NULL);
                    const al_json *args = al_json_get(fn, "arguments");
                    if (args->type == AL_JSON_STRING) {
                        /* free text where JSON should be: handed over as it is */
                        calls[k][j].arguments = args->string;
                    } else {
                        al_buf *ab = &argbufs[nargs++];
                        al_json_write(ab, args);
                        calls[k][j].arguments = ab->data;
                    }
                }
                m[k].tool_calls = calls[k];
                m[k].n_tool_calls = tc->count;
            }
        }
        size_t ntools = tools ? tools->count : 0;
        char **tool_text = calloc(ntools + 1, sizeof *tool_text);
        for (size_t k = 0; k < ntools; k++) {
            al_buf tb = {0};
            al_json_write(&tb, tools->items[k]);
            tool_text[k] = tb.data;
        }
        al_chat_request req = {
            .messages = m,
            .n_messages = msgs->count,
            .tools = (const char *const *)tool_text,
            .n_tools = ntools,
            .add_generation_prompt = al_json_get_bool(c, "add_generation_prompt", 0),
            .enable_thinking = al_json_get_bool(c, "enable_thinking", 1),
        };
        al_chat_template_kind kind =
            strcmp(tpl, "qwen3") == 0 ? AL_CHAT_TEMPLATE_QWEN3 : AL_CHAT_TEMPLATE_QWEN2_5;
        char err[200];
        size_t len = 0;
        char *got = al_chat_render(kind, &req, &len, err, sizeof err);
        CHECKF(got, "%s/%s: %s", tpl, name, err);
        if (got) {
            size_t d = tok_first_diff(got, len, want->string, want->string_len);
            CHECKF(len == want->string_len && d == len,
                   "%s/%s: differs at byte %zu:\n  got  \"%.60s\"\n  want \"%.60s\"", tpl, name, d,
                   got + (d > 20 ? d - 20 : 0), want->string + (d > 20 ? d - 20 : 0));
        }
        free(got);
        for (size_t k = 0; k < ntools; k++)
            free(tool_text[k]);
        free(tool_text);
        for (size_t k = 0; k < nargs; k++)
            free(argbufs[k].data);
        free(argbufs);
        for (size_t k = 0; k < msgs->count; k++)
            free(calls[k]);
        free(calls);
        free(m);
    }
    al_json_free(fx);
}

TEST(render_errors)
{
    char err[200] = "";
    al_chat_message one = {.role = AL_CHAT_USER, .content = "hi"};
    al_chat_request req = {.messages = &one, .n_messages = 1};
    size_t len;
    CHECK(al_chat_render(AL_CHAT_TEMPLATE_NONE, &req, &len, err, sizeof err) == NULL);
    CHECK(strstr(err, "chat template") != NULL);
    al_chat_request empty = {0};
    CHECK(al_chat_render(AL_CHAT_TEMPLATE_QWEN2_5, &empty, &len, err, sizeof err) == NULL);
    CHECK(strstr(err, "at least one message") != NULL);
    al_chat_message badrole = {.role = (al_chat_role)42, .content = "x"};
    al_chat_request r2 = {.messages = &badrole, .n_messages = 1};
    CHECK(al_chat_render(AL_CHAT_TEMPLATE_QWEN3, &r2, &len, err, sizeof err) == NULL);
    CHECK(strstr(err, "unknown role") != NULL);
    const char *tools[] = {"{\"type\": \"function\", oops"};
    al_chat_request r3 = {.messages = &one, .n_messages = 1, .tools = tools, .n_tools = 1};
    CHECK(al_chat_render(AL_CHAT_TEMPLATE_QWEN2_5, &r3, &len, err, sizeof err) == NULL);
    CHECK(strstr(err, "tools[0]") != NULL);
    /* NULL content renders as empty; plain ChatML has no default system prompt */
    al_chat_message nul = {.role = AL_CHAT_USER, .content = NULL};
    al_chat_request r4 = {.messages = &nul, .n_messages = 1, .add_generation_prompt = 1};
    char *s = al_chat_render(AL_CHAT_TEMPLATE_CHATML, &r4, &len, err, sizeof err);
    CHECK_EQ_STR(s, "<|im_start|>user\n<|im_end|>\n<|im_start|>assistant\n");
    free(s);
}

TEST(pyformat_json)
{
    al_buf b = {0};
    const char *in =
        "{\"a\":[1,2.5,-0.125,1e21,true,null],\"b\":{\"c\":\"x\\ny\\u0001\\\"\"},\"d\":\"é😀\"}";
    CHECK(al_chat_json_pyformat(in, strlen(in), &b) == 0);
    CHECK_EQ_STR(b.data, "{\"a\": [1, 2.5, -0.125, 1e+21, true, null], \"b\": {\"c\": "
                         "\"x\\ny\\u0001\\\"\"}, \"d\": \"é😀\"}");
    free(b.data);
    al_buf c = {0};
    CHECK(al_chat_json_pyformat("{oops", 5, &c) == -1);
    free(c.data);
}

static void check_call(const al_chat_parsed *p, size_t i, const char *name, const char *args)
{
    if (i >= p->n_calls) {
        CHECKF(0, "no call %zu (have %zu)", i, p->n_calls);
        return;
    }
    CHECK_EQ_STR(p->calls[i].name, name);
    CHECK_EQ_STR(p->calls[i].arguments, args);
}

TEST(parse_tool_calls)
{
    al_chat_parsed p;
    const char *t1 = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
                     "{\"city\":\"Paris\"}}\n</tool_call>";
    REQUIRE(al_chat_parse(t1, strlen(t1), 0, &p) == 0);
    CHECK_EQ_INT(p.n_calls, 1);
    check_call(&p, 0, "get_weather", "{\"city\": \"Paris\"}");
    CHECK_EQ_STR(p.content, "");
    al_chat_parsed_free(&p);

    const char *t2 =
        "Let me check both.\n<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>\n"
        "<tool_call>\n{\"name\": \"b\", \"arguments\": {\"x\": [1, \"東京\"]}}\n</tool_call>";
    REQUIRE(al_chat_parse(t2, strlen(t2), 0, &p) == 0);
    CHECK_EQ_INT(p.n_calls, 2);
    check_call(&p, 0, "a", "{}");
    check_call(&p, 1, "b", "{\"x\": [1, \"東京\"]}");
    CHECK_EQ_STR(p.content, "Let me check both.");
    al_chat_parsed_free(&p);

    /* malformed JSON stays text; the good block after it is still a call */
    const char *t3 = "<tool_call>\n{\"name\": \"a\", \"arguments\": {\n</tool_call> then "
                     "<tool_call>{\"name\": \"ok\"}</tool_call>";
    REQUIRE(al_chat_parse(t3, strlen(t3), 0, &p) == 0);
    CHECK_EQ_INT(p.n_calls, 1);
    check_call(&p, 0, "ok", "{}");
    CHECK(strstr(p.content, "\"arguments\": {") != NULL);
    al_chat_parsed_free(&p);

    /* generation stopped before </tool_call>: parsed when the JSON is whole */
    const char *t4 = "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"q\": 1}}\n";
    REQUIRE(al_chat_parse(t4, strlen(t4), 0, &p) == 0);
    check_call(&p, 0, "f", "{\"q\": 1}");
    al_chat_parsed_free(&p);
    const char *t5 = "<tool_call>\n{\"name\": \"f\", \"argu";
    REQUIRE(al_chat_parse(t5, strlen(t5), 0, &p) == 0);
    CHECK_EQ_INT(p.n_calls, 0);
    CHECK_EQ_STR(p.content, t5);
    al_chat_parsed_free(&p);

    /* arguments written as a JSON string; a missing name is not a call */
    const char *t6 = "<tool_call>{\"name\": \"s\", \"arguments\": \"{\\\"k\\\":true}\"}</tool_call>"
                     "<tool_call>{\"arguments\": {}}</tool_call>";
    REQUIRE(al_chat_parse(t6, strlen(t6), 0, &p) == 0);
    CHECK_EQ_INT(p.n_calls, 1);
    check_call(&p, 0, "s", "{\"k\": true}");
    CHECK_EQ_STR(p.content, "<tool_call>{\"arguments\": {}}</tool_call>");
    al_chat_parsed_free(&p);

    /* plain text is untouched */
    const char *t7 = "  Just an answer, with <b>tags</b>.\n";
    REQUIRE(al_chat_parse(t7, strlen(t7), 0, &p) == 0);
    CHECK_EQ_INT(p.n_calls, 0);
    CHECK_EQ_STR(p.content, t7);
    CHECK(p.reasoning == NULL);
    al_chat_parsed_free(&p);
}

TEST(parse_reasoning)
{
    al_chat_parsed p;
    const char *t = "<think>\nI should call f.\n</think>\n\n<tool_call>\n{\"name\": \"f\", "
                    "\"arguments\": {}}\n</tool_call>";
    REQUIRE(al_chat_parse(t, strlen(t), AL_CHAT_PARSE_REASONING, &p) == 0);
    CHECK_EQ_STR(p.reasoning, "\nI should call f.\n");
    CHECK_EQ_INT(p.n_calls, 1);
    CHECK_EQ_STR(p.content, "");
    al_chat_parsed_free(&p);
    /* the prompt opened <think> already: the text up to </think> is reasoning */
    const char *u = "thinking...</think>\n\nThe answer is 4.";
    REQUIRE(al_chat_parse(u, strlen(u), AL_CHAT_PARSE_REASONING, &p) == 0);
    CHECK_EQ_STR(p.reasoning, "thinking...");
    CHECK_EQ_STR(p.content, "\n\nThe answer is 4.");
    al_chat_parsed_free(&p);
    /* without the flag, think tags are content */
    REQUIRE(al_chat_parse(u, strlen(u), 0, &p) == 0);
    CHECK(p.reasoning == NULL);
    CHECK_EQ_STR(p.content, u);
    al_chat_parsed_free(&p);
}

TEST(render_then_parse_roundtrip)
{
    /* What the serve stage does: a rendered assistant turn parses back to its calls. */
    al_chat_tool_call calls[] = {{"get_weather", "{\"city\":\"Zürich\",\"days\":3}"},
                                 {"search", "{\"q\":\"a \\\"b\\\"\"}"}};
    al_chat_message m[] = {
        {.role = AL_CHAT_USER, .content = "go"},
        {.role = AL_CHAT_ASSISTANT, .content = "Sure.", .tool_calls = calls, .n_tool_calls = 2}};
    al_chat_request req = {.messages = m, .n_messages = 2};
    size_t len;
    char err[100];
    char *s = al_chat_render(AL_CHAT_TEMPLATE_QWEN2_5, &req, &len, err, sizeof err);
    REQUIRE(s);
    const char *turn = strstr(s, "<|im_start|>assistant\n");
    REQUIRE(turn);
    turn += strlen("<|im_start|>assistant\n");
    const char *end = strstr(turn, "<|im_end|>");
    REQUIRE(end);
    al_chat_parsed p;
    REQUIRE(al_chat_parse(turn, (size_t)(end - turn), 0, &p) == 0);
    CHECK_EQ_INT(p.n_calls, 2);
    check_call(&p, 0, "get_weather", "{\"city\": \"Zürich\", \"days\": 3}");
    check_call(&p, 1, "search", "{\"q\": \"a \\\"b\\\"\"}");
    CHECK_EQ_STR(p.content, "Sure.");
    al_chat_parsed_free(&p);
    free(s);
}

TEST(chat_encode_with_the_tokenizers_template)
{
    char *dir = tok_source_path("tests/tokenizer/tiny");
    char err[200];
    al_tokenizer *tok = al_tokenizer_load_dir(dir, err, sizeof err);
    free(dir);
    REQUIREF(tok, "%s", err);
    CHECK_EQ_STR(al_chat_template_name(al_tokenizer_chat_template(tok)), "qwen2.5");
    CHECK_EQ_STR(al_chat_template_name(AL_CHAT_TEMPLATE_QWEN3), "qwen3");
    al_chat_message m[] = {{.role = AL_CHAT_USER, .content = "Hi there"}};
    al_chat_request req = {.messages = m, .n_messages = 1, .add_generation_prompt = 1};
    al_token_ids ids = {0};
    REQUIREF(al_chat_encode(tok, &req, &ids, err, sizeof err) == 0, "%s", err);
    /* <|im_start|>system\n...<|im_end|>\n<|im_start|>user\nHi
     * there<|im_end|>\n<|im_start|>assistant\n */
    int starts = 0, ends = 0;
    for (size_t i = 0; i < ids.len; i++) {
        starts += ids.ids[i] == 506;
        ends += ids.ids[i] == 507;
    }
    CHECK_EQ_INT(starts, 3);
    CHECK_EQ_INT(ends, 2);
    CHECK_EQ_INT(ids.ids[0], 506);
    char *text = NULL;
    size_t len = 0;
    REQUIRE(al_tokenizer_decode(tok, ids.ids, ids.len, 0, &text, &len) == 0);
    char *want = al_chat_render(AL_CHAT_TEMPLATE_QWEN2_5, &req, &len, err, sizeof err);
    CHECK_EQ_STR(text, want);
    free(want);
    free(text);
    al_token_ids_free(&ids);
    al_tokenizer_free(tok);
}

/* Feeds text in random pieces and checks that the released content and reasoning plus what
 * finish returns equal al_chat_parse on the whole text. */
static void check_stream(const char *text, unsigned flags, uint64_t seed)
{
    al_chat_parsed whole;
    REQUIRE(al_chat_parse(text, strlen(text), flags, &whole) == 0);
    al_chat_stream st = {.flags = flags};
    al_buf content = {0}, reasoning = {0};
    al_buf_append(&content, "", 0);
    al_buf_append(&reasoning, "", 0);
    size_t n = strlen(text);
    for (size_t at = 0; at < n;) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        size_t k = 1 + (seed >> 33) % 7;
        if (k > n - at) k = n - at;
        al_chat_delta d;
        REQUIRE(al_chat_stream_push(&st, text + at, k, &d) == 0);
        /* nothing released may be part of a tag */
        CHECK(!strstr(d.content, "<tool_call>"));
        al_buf_append(&content, d.content, d.content_len);
        al_buf_append(&reasoning, d.reasoning, d.reasoning_len);
        at += k;
    }
    al_chat_parsed rest;
    REQUIRE(al_chat_stream_finish(&st, &rest) == 0);
    al_buf_append(&content, rest.content, rest.content_len);
    if (rest.reasoning) al_buf_append(&reasoning, rest.reasoning, strlen(rest.reasoning));
    /* the whole-text parse trims the layout whitespace around tool calls */
    size_t a = 0, e = content.len;
    if (whole.n_calls) {
        while (a < e && strchr(" \n\r\t", content.data[a]))
            a++;
        while (e > a && strchr(" \n\r\t", content.data[e - 1]))
            e--;
    }
    CHECKF(e - a == whole.content_len && memcmp(content.data + a, whole.content, e - a) == 0,
           "streamed content \"%.*s\" != \"%s\"", (int)(e - a), content.data + a, whole.content);
    if (whole.reasoning) CHECK_EQ_STR(reasoning.data, whole.reasoning);
    CHECK_EQ_INT(rest.n_calls, whole.n_calls);
    for (size_t i = 0; i < rest.n_calls && i < whole.n_calls; i++) {
        CHECK_EQ_STR(rest.calls[i].name, whole.calls[i].name);
        CHECK_EQ_STR(rest.calls[i].arguments, whole.calls[i].arguments);
    }
    al_chat_parsed_free(&rest);
    al_chat_parsed_free(&whole);
    al_chat_stream_free(&st);
    free(content.data);
    free(reasoning.data);
}

TEST(stream_parse_matches_whole_parse)
{
    const char *texts[] = {
        "Plain answer with <b>tags</b> and a < sign and <tool_ but no call.",
        "Let me look.\n<tool_call>\n{\"name\": \"search\", \"arguments\": {\"q\": "
        "\"x\"}}\n</tool_call>",
        "<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n{\"name\": "
        "\"b\", "
        "\"arguments\": {\"k\": [1, 2]}}\n</tool_call>",
        "<think>\nI need the weather. <maybe> "
        "</thin\n</think>\n\nCalling.\n<tool_call>\n{\"name\": \"w\", "
        "\"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
        "<think>\nshort</think>The answer is 42.",
        "<thin",
        "<think>never closed",
        "",
    };
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++)
        for (uint64_t seed = 1; seed <= 20; seed++) {
            check_stream(texts[i], AL_CHAT_PARSE_REASONING, seed);
            check_stream(texts[i], 0, seed);
        }
}

TEST(stream_releases_early)
{
    al_chat_stream st = {.flags = AL_CHAT_PARSE_REASONING};
    al_chat_delta d;
    REQUIRE(al_chat_stream_push(&st, "<thi", 4, &d) == 0);
    CHECK_EQ_INT(d.content_len + d.reasoning_len, 0);
    REQUIRE(al_chat_stream_push(&st, "nk>Step one. </", 15, &d) == 0);
    CHECK_EQ_STR(d.reasoning, "Step one. ");
    REQUIRE(al_chat_stream_push(&st, "think>Hi <", 10, &d) == 0);
    CHECK_EQ_STR(d.content, "Hi ");
    CHECK_EQ_INT(d.reasoning_len, 0);
    REQUIRE(al_chat_stream_push(&st, "b>", 2, &d) == 0);
    CHECK_EQ_STR(d.content, "<b>");
    REQUIRE(al_chat_stream_push(&st, "<tool_call>{\"name\": \"f\"}", 24, &d) == 0);
    CHECK_EQ_INT(d.content_len, 0);
    al_chat_parsed p;
    REQUIRE(al_chat_stream_finish(&st, &p) == 0);
    CHECK_EQ_INT(p.n_calls, 1);
    CHECK_EQ_STR(p.calls[0].name, "f");
    al_chat_parsed_free(&p);
    al_chat_stream_free(&st);
}
