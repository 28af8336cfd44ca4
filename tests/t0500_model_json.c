/* 0500: lib/text/json — the JSON reader of lib/text and lib/model. */
#include "testlib.h"

#include "text/json.h"

static al_json *parse(const char *s, char *err, size_t errlen)
{
    return al_json_parse(s, strlen(s), err, errlen);
}

TEST(parses_a_config_like_document)
{
    char err[256];
    const char *doc = "{\"architectures\":[\"Qwen2ForCausalLM\"],\"hidden_size\":64,"
                      "\"rope_theta\":1e6,\"tie_word_embeddings\":true,\"rms_norm_eps\":1e-06,"
                      "\"torch_dtype\":null,\"max_position_embeddings\": 4096 }";
    al_json *j = parse(doc, err, sizeof err);
    REQUIREF(j, "%s", err);
    CHECK_EQ_INT(j->type, AL_JSON_OBJECT);
    CHECK_EQ_INT(j->count, 7);
    const al_json *arch = al_json_get(j, "architectures");
    REQUIRE(arch && arch->type == AL_JSON_ARRAY && arch->count == 1);
    CHECK_EQ_STR(arch->items[0]->string, "Qwen2ForCausalLM");
    CHECK_EQ_INT(al_json_get_int(j, "hidden_size", 0), 64);
    CHECK_NEAR(al_json_get_number(j, "rope_theta", 0), 1e6, 0);
    CHECK_NEAR(al_json_get_number(j, "rms_norm_eps", 0), 1e-6, 1e-18);
    CHECK_EQ_INT(al_json_get_bool(j, "tie_word_embeddings", 0), 1);
    CHECK_EQ_STR(al_json_get_string(j, "torch_dtype", "float32"), "float32");
    CHECK_EQ_INT(al_json_get_int(j, "missing", -7), -7);
    CHECK(al_json_get(j, "missing") == NULL);
    al_json_free(j);
}

TEST(unescapes_strings_to_utf8)
{
    char err[256];
    al_json *j = parse("[\"a\\\"b\\\\c\\n\", \"\\u00e9\\u4e2d\", \"\\ud83d\\ude00\", \"x\\u0000y\","
                       " \"\xc4\xa0hello\"]",
                       err, sizeof err);
    REQUIREF(j, "%s", err);
    REQUIRE(j->count == 5);
    CHECK_EQ_STR(j->items[0]->string, "a\"b\\c\n");
    CHECK_EQ_STR(j->items[1]->string, "\xc3\xa9\xe4\xb8\xad");
    CHECK_EQ_STR(j->items[2]->string, "\xf0\x9f\x98\x80");
    CHECK_EQ_INT(j->items[3]->string_len, 3);
    CHECK(memcmp(j->items[3]->string, "x\0y", 3) == 0);
    CHECK_EQ_STR(j->items[4]->string, "\xc4\xa0hello");
    al_json_free(j);
}

TEST(numbers_keep_integers_exact)
{
    char err[256];
    al_json *j = parse("[9007199254740993, -0, 1.5, -2e-3, 151643]", err, sizeof err);
    REQUIREF(j, "%s", err);
    CHECK(j->items[0]->is_integer);
    CHECK_EQ_INT(j->items[0]->integer, 9007199254740993LL);
    CHECK(!j->items[2]->is_integer);
    CHECK_NEAR(j->items[3]->number, -2e-3, 1e-15);
    CHECK_EQ_INT(j->items[4]->integer, 151643);
    al_json_free(j);
}

TEST(rejects_malformed_input_with_a_position)
{
    const char *bad[] = {"",       "{",        "{\"a\"}",  "{\"a\":1,}", "[1 2]",   "\"abc",
                         "tru",    "01",       "1.",       "1e",         "[\"\\x\"]", "{} x",
                         "[\"\\u12\"]", "{\"a\":[}", "\"a\nb\""};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char err[256] = "";
        al_json *j = parse(bad[i], err, sizeof err);
        CHECKF(j == NULL, "accepted malformed input #%zu: %s", i, bad[i]);
        CHECKF(strstr(err, "at byte") != NULL, "no position in error for #%zu: %s", i, err);
        al_json_free(j);
    }
}

TEST(deep_nesting_is_an_error_not_a_crash)
{
    size_t n = 100000;
    char *s = malloc(2 * n + 1);
    memset(s, '[', n);
    memset(s + n, ']', n);
    s[2 * n] = '\0';
    char err[256];
    al_json *j = al_json_parse(s, 2 * n, err, sizeof err);
    CHECK(j == NULL);
    CHECK(strstr(err, "too deep") != NULL);
    free(s);
}

TEST(truncation_at_every_byte_never_crashes)
{
    const char *doc = "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"\\u0120b\":1},"
                      "\"merges\":[\"a b\",[\"c\",\"d\"]]},\"x\":[1.5e3,true,false,null]}";
    size_t len = strlen(doc);
    char err[256];
    al_json *full = al_json_parse(doc, len, err, sizeof err);
    REQUIREF(full, "%s", err);
    al_json_free(full);
    for (size_t i = 0; i < len; i++) {
        char *copy = malloc(i ? i : 1); /* exact size so ASan sees any over-read */
        memcpy(copy, doc, i);
        al_json *j = al_json_parse(copy, i, err, sizeof err);
        CHECKF(j == NULL, "accepted a truncation at %zu", i);
        al_json_free(j);
        free(copy);
    }
}

TEST(buffer_quotes_and_escapes)
{
    al_buf b = {0};
    al_json_quote(&b, "a\"b\\\n\x01\xc3\xa9", 8);
    al_buf_printf(&b, ",%d", 42);
    CHECK_EQ_STR(b.data, "\"a\\\"b\\\\\\n\\u0001\xc3\xa9\",42");
    free(b.data);
}

TEST(compact_writer_round_trips)
{
    char err[256];
    const char *doc = "{ \"name\" : \"get_weather\", \"arguments\": {\"city\": \"Par\\u00eds\\n\","
                      " \"days\": [1, 2.5, -3e-2, true, false, null], \"big\": 9007199254740993} }";
    al_json *j = al_json_parse(doc, strlen(doc), err, sizeof err);
    REQUIREF(j, "%s", err);
    al_buf b = {0};
    al_json_write(&b, j);
    CHECK_EQ_STR(b.data, "{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Par\xc3\xad"
                         "s\\n\",\"days\":[1,2.5,-0.029999999999999999,true,false,null],"
                         "\"big\":9007199254740993}}");
    al_json *again = al_json_parse(b.data, b.len, err, sizeof err);
    REQUIREF(again, "%s", err);
    al_buf c = {0};
    al_json_write(&c, again);
    CHECK_EQ_STR(c.data, b.data);
    free(b.data);
    free(c.data);
    al_json_free(j);
    al_json_free(again);
}
