/*
 * t0702_tokenizer_input: what a user sees on bad input, and the special-token switches.
 *
 * Malformed tokenizer.json files (each a one-place edit of the tiny tokenizer, plus every
 * truncation and random byte flips) must fail with an error that names the problem, or
 * load; never crash. Special tokens in the text become ids only when allowed; non-special
 * added tokens always do; lstrip/rstrip eat the whitespace around a token.
 */
#include "text/tokenizer.h"
#include "t0749_tokenizer_util.h"
#include "testlib.h"

static char *tiny_json(size_t *len)
{
    char *path = tok_source_path("tests/tokenizer/tiny/tokenizer.json");
    char *t = al_test_slurp(path, len);
    free(path);
    return t;
}

/* text with the first occurrence of `from` replaced by `to` (malloc'd), or NULL. */
static char *replace_once(const char *text, const char *from, const char *to)
{
    const char *at = strstr(text, from);
    if (!at) return NULL;
    size_t a = (size_t)(at - text), fl = strlen(from), tl = strlen(to), n = strlen(text);
    char *out = malloc(n - fl + tl + 1);
    memcpy(out, text, a);
    memcpy(out + a, to, tl);
    memcpy(out + a + tl, at + fl, n - a - fl + 1);
    return out;
}

TEST(malformed_tokenizer_json)
{
    size_t len = 0;
    char *base = tiny_json(&len);
    REQUIRE(base);
    static const struct {
        const char *from, *to, *want;
    } cases[] = {
        {"\"type\": \"BPE\"", "\"type\": \"Unigram\"", "only BPE"},
        {"\"model\": {", "\"modelx\": {", "no \"model\""},
        {"\"vocab\": {", "\"vocab\": 5, \"old_vocab\": {", "model.vocab is a number"},
        {"\"merges\": [", "\"merges\": 3, \"old_merges\": [", "model.merges is a number"},
        {"\"byte_fallback\": false", "\"byte_fallback\": true", "byte_fallback"},
        {"\"normalizer\": null", "\"normalizer\": {\"type\": \"NFKC\"}",
         "\"NFKC\" is not supported"},
        {"\"pre_tokenizer\": {", "\"pre_tokenizer\": {\"type\": \"Metaspace\"}, \"old\": {",
         "\"Metaspace\" is not supported"},
        {"\"pre_tokenizer\": {",
         "\"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": \"\\\\w+\"}, "
         "\"behavior\": \"Isolated\"}, \"old\": {",
         "\\w+ is not one of the supported patterns"},
        {"\"pre_tokenizer\": {",
         "\"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": \"x\"}, \"behavior\": "
         "\"Removed\"}, \"old\": {",
         "only Isolated"},
        {"\"decoder\": {", "\"decoder\": {\"type\": \"WordPiece\"}, \"old\": {",
         "decoder \"WordPiece\""},
        {"\"!\": 33", "\"!\": -1", "id is not an integer"},
        {"\"!\": 33", "\"!\": 99999999999", "id is not an integer"},
        {"\"!\": 33", "\"!\": 33.5", "id is not an integer"},
        {"\"\\\"\": 34", "\"\\\"\": 33", "is used by both"},
        {"\"!\": 33", "\"\xE2\x98\x83\": 33", "outside the byte-level alphabet"},
        {"\"!\": 33", "\"!!!!\": 33", "no token for byte 0x21"},
        {"\"merges\": [", "\"merges\": [[\"x\"], ", "model.merges[0]: expected"},
        {"\"merges\": [", "\"merges\": [\"ab\", ", "model.merges[0]: expected"},
        {"\"merges\": [", "\"merges\": [\"a  b\", ", "model.merges[0]: expected"},
        {"\"merges\": [", "\"merges\": [[\"zz-not-a-token\", \"a\"], ",
         "\"zz-not-a-token\" is not in the vocabulary"},
        {"\"merges\": [", "\"merges\": [[\"Q\", \"Z\"], ", "the merged token \"QZ\""},
        {"\"content\": \"<|endoftext|>\"", "\"content\": \"\"", "added_tokens[0]: \"content\""},
        {"\"id\": 505", "\"id\": 33", "but model.vocab has"},
        {"\"id\": 505", "\"id\": \"505\"", "added_tokens[0]: \"id\""},
        {"\"added_tokens\": [", "\"added_tokens\": 7, \"old\": [", "added_tokens is a number"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *text = replace_once(base, cases[i].from, cases[i].to);
        REQUIREF(text, "case %zu: \"%s\" is not in the tiny tokenizer.json", i, cases[i].from);
        char err[300] = "";
        al_tokenizer *t = al_tokenizer_from_json(text, strlen(text), NULL, 0, err, sizeof err);
        CHECKF(!t, "case %zu loaded", i);
        CHECKF(strstr(err, cases[i].want) != NULL, "case %zu: error \"%s\" does not say \"%s\"", i,
               err, cases[i].want);
        al_tokenizer_free(t);
        free(text);
    }
    char err[300] = "";
    CHECK(!al_tokenizer_from_json("[1, 2]", 6, NULL, 0, err, sizeof err));
    CHECK(strstr(err, "top level") != NULL);
    CHECK(!al_tokenizer_from_json("{\"model\": ", 10, NULL, 0, err, sizeof err));
    CHECK(strstr(err, "invalid JSON") != NULL);
    CHECK(!al_tokenizer_from_json("", 0, NULL, 0, err, sizeof err));
    free(base);
}

TEST(truncated_and_corrupted_files)
{
    size_t len = 0;
    char *base = tiny_json(&len);
    REQUIRE(base);
    char err[300];
    /* every truncation point (in steps) fails cleanly with a message */
    for (size_t cut = 0; cut < len - 2; cut += 1 + len / 300) {
        err[0] = 0;
        al_tokenizer *t = al_tokenizer_from_json(base, cut, NULL, 0, err, sizeof err);
        CHECKF(!t && err[0], "truncated at %zu of %zu: %s", cut, len, t ? "loaded" : "no message");
        al_tokenizer_free(t);
    }
    /* random byte flips: a clear error or a working tokenizer, never a crash */
    uint64_t x = 88172645463325252ull;
    int loaded = 0;
    for (int r = 0; r < 200; r++) {
        char *copy = malloc(len);
        memcpy(copy, base, len);
        /* one printable byte, so that many files still parse as JSON and reach the loader */
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        copy[x % len] = (char)(r % 2 ? 0x20 + (x >> 40) % 95 : (x >> 40));
        err[0] = 0;
        al_tokenizer *t = al_tokenizer_from_json(copy, len, NULL, 0, err, sizeof err);
        if (t) {
            loaded++;
            al_token_ids ids = {0};
            CHECK(al_tokenizer_encode(t, "Hello, world! <|im_end|>", 24, AL_TOKENIZER_ALLOW_SPECIAL,
                                      &ids) == 0);
            CHECK(ids.len > 0);
            al_token_ids_free(&ids);
        } else {
            CHECKF(err[0] != 0, "flip round %d: failed without a message", r);
        }
        al_tokenizer_free(t);
        free(copy);
    }
    printf("  %d of 200 corrupted files still loaded\n", loaded);
    free(base);
}

TEST(missing_files_and_config)
{
    char err[300] = "";
    CHECK(!al_tokenizer_load_dir("/nonexistent/tokenizer-dir", err, sizeof err));
    CHECK(strstr(err, "/nonexistent/tokenizer-dir/tokenizer.json") != NULL);
    CHECK(strstr(err, "No such file") != NULL);

    size_t len = 0;
    char *base = tiny_json(&len);
    REQUIRE(base);
    const char *bad_cfg = "{\"eos_token\": ";
    al_tokenizer *t = al_tokenizer_from_json(base, len, bad_cfg, strlen(bad_cfg), err, sizeof err);
    CHECK(!t);
    CHECK(strstr(err, "tokenizer_config.json") != NULL);
    al_tokenizer_free(t);

    /* token objects and the list form of chat_template */
    const char *cfg =
        "{\"bos_token\": {\"content\": \"<|im_start|>\", \"special\": true}, \"eos_token\": "
        "\"<|endoftext|>\","
        " \"pad_token\": null, \"chat_template\": [{\"name\": \"tool_use\", \"template\": \"x\"},"
        " {\"name\": \"default\", \"template\": \"{{ '<|im_start|>' + m }}\"}]}";
    t = al_tokenizer_from_json(base, len, cfg, strlen(cfg), err, sizeof err);
    REQUIREF(t, "%s", err);
    CHECK_EQ_INT(al_tokenizer_bos_id(t), 506);
    CHECK_EQ_INT(al_tokenizer_eos_id(t), 505);
    CHECK_EQ_INT(al_tokenizer_pad_id(t), -1);
    CHECK_EQ_INT(al_tokenizer_chat_template(t), AL_CHAT_TEMPLATE_CHATML);
    al_tokenizer_free(t);
    /* no config at all */
    t = al_tokenizer_from_json(base, len, NULL, 0, err, sizeof err);
    REQUIRE(t);
    CHECK_EQ_INT(al_tokenizer_eos_id(t), -1);
    CHECK_EQ_INT(al_tokenizer_chat_template(t), AL_CHAT_TEMPLATE_NONE);
    al_tokenizer_free(t);
    free(base);
}

static int count_id(const al_token_ids *v, int32_t id)
{
    int n = 0;
    for (size_t i = 0; i < v->len; i++)
        n += v->ids[i] == id;
    return n;
}

TEST(special_tokens)
{
    size_t len = 0;
    char *base = tiny_json(&len);
    REQUIRE(base);
    char err[300];
    al_tokenizer *t = al_tokenizer_from_json(base, len, NULL, 0, err, sizeof err);
    REQUIRE(t);
    const char *text = "<|im_start|>user\nhi <tool_call>{}</tool_call><|im_end|>";
    al_token_ids with = {0}, without = {0};
    REQUIRE(al_tokenizer_encode(t, text, strlen(text), AL_TOKENIZER_ALLOW_SPECIAL, &with) == 0);
    REQUIRE(al_tokenizer_encode(t, text, strlen(text), 0, &without) == 0);
    CHECK_EQ_INT(with.ids[0], 506);
    CHECK_EQ_INT(with.ids[with.len - 1], 507);
    CHECK_EQ_INT(count_id(&with, 508) + count_id(&with, 509), 2);
    /* without permission, user text cannot smuggle in control tokens... */
    CHECK_EQ_INT(count_id(&without, 505) + count_id(&without, 506) + count_id(&without, 507), 0);
    /* ...but non-special added tokens are still recognized, as in Hugging Face */
    CHECK_EQ_INT(count_id(&without, 508) + count_id(&without, 509), 2);
    char *dec = NULL;
    size_t dlen = 0;
    REQUIRE(al_tokenizer_decode(t, without.ids, without.len, 0, &dec, &dlen) == 0);
    CHECK_EQ_STR(dec, text);
    free(dec);
    REQUIRE(al_tokenizer_decode(t, with.ids, with.len, AL_TOKENIZER_SKIP_SPECIAL, &dec, &dlen) ==
            0);
    CHECK_EQ_STR(dec, "user\nhi <tool_call>{}</tool_call>");
    free(dec);
    /* unknown ids are skipped */
    int32_t odd[] = {'o', -5, 'k', 100000};
    REQUIRE(al_tokenizer_decode(t, odd, 4, 0, &dec, &dlen) == 0);
    CHECK_EQ_STR(dec, "ok");
    free(dec);
    al_token_ids_free(&with);
    al_token_ids_free(&without);
    al_tokenizer_free(t);

    /* lstrip / rstrip on <|endoftext|> */
    char *s1 = replace_once(base, "\"lstrip\": false", "\"lstrip\": true");
    char *s2 = replace_once(s1, "\"rstrip\": false", "\"rstrip\": true");
    t = al_tokenizer_from_json(s2, strlen(s2), NULL, 0, err, sizeof err);
    REQUIREF(t, "%s", err);
    al_token_ids a = {0}, b = {0};
    const char *spaced = "x \xE3\x80\x80\n<|endoftext|> \t\xC2\xA0y"; /* ideographic space, NBSP */
    REQUIRE(al_tokenizer_encode(t, spaced, strlen(spaced), AL_TOKENIZER_ALLOW_SPECIAL, &a) == 0);
    REQUIRE(al_tokenizer_encode(t, "x", 1, 0, &b) == 0);
    REQUIRE(al_tokenizer_encode(t, "<|endoftext|>", 13, AL_TOKENIZER_ALLOW_SPECIAL, &b) == 0);
    REQUIRE(al_tokenizer_encode(t, "y", 1, 0, &b) == 0);
    CHECK_EQ_INT(a.len, b.len);
    CHECK(a.len == b.len && memcmp(a.ids, b.ids, a.len * sizeof(int32_t)) == 0);
    al_token_ids_free(&a);
    al_token_ids_free(&b);
    al_tokenizer_free(t);
    free(s1);
    free(s2);
    free(base);
}
