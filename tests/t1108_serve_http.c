/*
 * 1108: serve's HTTP surface as a careless or hostile client meets it (issue 15): what it
 * emits it accepts back (a NUL token's "\u0000" in a later turn), and the requests it refuses
 * say why.
 */
#include "testlib.h"
#include "t1199_serve_helpers.h"

static char *g_dir;
static sv_server g_srv;

TEST(setup)
{
    curl_global_init(CURL_GLOBAL_ALL);
    g_dir = sv_tmpdir("t1108");
    REQUIRE(g_dir);
    REQUIRE(sv_make_model(g_dir, "tiny", 3) == 0);
    char model[400];
    snprintf(model, sizeof model, "%s/tiny", g_dir);
    const char *args[] = {"--model", model, "--log-level", "warn", NULL};
    REQUIRE(sv_start(&g_srv, args) == 0);
}

/* Item 18: token 0's text is a NUL byte; serve writes it as \u0000 and must take it back in
 * the next turn (a multi-turn rollout that sampled it could never continue), as the token it
 * came from. */
TEST(what_serve_emits_it_accepts_back)
{
    REQUIRE(g_srv.pid > 0);
    long code = 0;
    json_t *d = sv_post_json(g_srv.url, "/detokenize", "{\"tokens\":[97,0,98]}", &code);
    CHECK_EQ_INT(code, 200);
    json_t *pr = json_object_get(d, "prompt");
    CHECK_EQ_INT(json_string_length(pr), 3);
    CHECK(json_string_length(pr) == 3 && !memcmp(json_string_value(pr), "a\0b", 3));
    json_decref(d);

    /* that text as an assistant turn, then a user turn: the prompt holds id 0 between them */
    json_t *j = sv_post_json(
        g_srv.url, "/v1/chat/completions",
        "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"},"
        "{\"role\":\"assistant\",\"content\":\"a\\u0000b\"},{\"role\":\"user\",\"content\":\"x\"}],"
        "\"max_tokens\":2,\"return_token_ids\":true}",
        &code);
    CHECK_EQ_INT(code, 200);
    json_t *ids = json_object_get(j, "prompt_token_ids");
    int seen = 0;
    for (size_t i = 1; i + 1 < json_array_size(ids); i++)
        if (json_integer_value(json_array_get(ids, i)) == 0 &&
            json_integer_value(json_array_get(ids, i - 1)) == 97 &&
            json_integer_value(json_array_get(ids, i + 1)) == 98)
            seen = 1;
    CHECKF(seen, "the prompt does not hold 97, 0, 98");
    json_decref(j);

    /* and in a completion prompt, and in /tokenize */
    j = sv_post_json(g_srv.url, "/tokenize", "{\"prompt\":\"a\\u0000b\"}", &code);
    CHECK_EQ_INT(code, 200);
    CHECK_EQ_INT(json_array_size(json_object_get(j, "tokens")), 3);
    CHECK_EQ_INT(json_integer_value(json_array_get(json_object_get(j, "tokens"), 1)), 0);
    json_decref(j);
    j = sv_post_json(g_srv.url, "/v1/completions",
                     "{\"prompt\":\"a\\u0000b\",\"max_tokens\":1,\"return_token_ids\":true}", &code);
    CHECK_EQ_INT(code, 200);
    json_t *c0 = json_array_get(json_object_get(j, "choices"), 0);
    CHECK_EQ_INT(json_array_size(json_object_get(c0, "prompt_token_ids")), 3);
    json_decref(j);

    /* where NUL is no text it is refused, never cut short: "tiny\u0000x" is not "tiny" */
    j = sv_post_json(g_srv.url, "/v1/completions",
                     "{\"model\":\"tiny\\u0000x\",\"prompt\":\"a\",\"max_tokens\":1}", &code);
    CHECK_EQ_INT(code, 404);
    json_decref(j);
    j = sv_post_json(g_srv.url, "/v1/completions",
                     "{\"prompt\":\"a\",\"max_tokens\":1,\"stop\":[\"x\\u0000y\"]}", &code);
    CHECK_EQ_INT(code, 400);
    CHECK(strstr(json_string_value(json_object_get(json_object_get(j, "error"), "message")) ?: "",
                 "NUL"));
    json_decref(j);
    j = sv_post_json(g_srv.url, "/v1/chat/completions",
                     "{\"messages\":[{\"role\":\"user\\u0000\",\"content\":\"a\"}],\"max_tokens\":1}",
                     &code);
    CHECK_EQ_INT(code, 400);
    json_decref(j);
}

TEST(teardown)
{
    if (g_srv.pid > 0) CHECK_EQ_INT(sv_stop(&g_srv), 0);
    if (g_dir) al_test_rmtree(g_dir);
    free(g_dir);
    curl_global_cleanup();
}
