/*
 * t0701_tokenizer_unicode: UTF-8 coding, character classes (pre-tokenizer splits against HF
 * Rust, tests/tokenizer/expected_pretok.json), NFC (against HF Rust = ICU, see
 * tests/tokenizer/expected_nfc.json), and the streaming decoder's handling of characters
 * split across tokens and of bytes that never become characters.
 */
#include "text/tokenizer.h"
#include "text/unicode.h"
#include "t0749_tokenizer_util.h"
#include "testlib.h"

TEST(character_classes)
{
    CHECK_EQ_INT(al_unicode_class('a'), AL_UNICODE_LETTER);
    CHECK_EQ_INT(al_unicode_class('Z'), AL_UNICODE_LETTER);
    CHECK_EQ_INT(al_unicode_class('7'), AL_UNICODE_NUMBER);
    CHECK_EQ_INT(al_unicode_class(' '), AL_UNICODE_SPACE);
    CHECK_EQ_INT(al_unicode_class('\n'), AL_UNICODE_SPACE);
    CHECK_EQ_INT(al_unicode_class('_'), 0);
    CHECK_EQ_INT(al_unicode_class('\''), 0);
    CHECK_EQ_INT(al_unicode_class(0xE9), AL_UNICODE_LETTER);    /* é */
    CHECK_EQ_INT(al_unicode_class(0x4E2D), AL_UNICODE_LETTER);  /* 中 */
    CHECK_EQ_INT(al_unicode_class(0xAC00), AL_UNICODE_LETTER);  /* 가 */
    CHECK_EQ_INT(al_unicode_class(0x0663), AL_UNICODE_NUMBER);  /* Arabic-Indic 3 */
    CHECK_EQ_INT(al_unicode_class(0x216B), AL_UNICODE_NUMBER);  /* Ⅻ (Nl) */
    CHECK_EQ_INT(al_unicode_class(0x00BD), AL_UNICODE_NUMBER);  /* ½ (No) */
    CHECK_EQ_INT(al_unicode_class(0x00A0), AL_UNICODE_SPACE);   /* no-break space */
    CHECK_EQ_INT(al_unicode_class(0x0085), AL_UNICODE_SPACE);   /* next line */
    CHECK_EQ_INT(al_unicode_class(0x3000), AL_UNICODE_SPACE);   /* ideographic space */
    CHECK_EQ_INT(al_unicode_class(0x200B), 0);                  /* zero width space is not \s */
    CHECK_EQ_INT(al_unicode_class(0x0301), 0);                  /* combining mark (Mn) */
    CHECK_EQ_INT(al_unicode_class(0x1F600), 0);                 /* emoji */
    CHECK_EQ_INT(al_unicode_class(0x1D7D8), AL_UNICODE_NUMBER); /* 𝟘 */
    CHECK_EQ_INT(al_unicode_class(0x110000), 0);
    CHECK_EQ_INT(al_unicode_class(AL_UNICODE_BAD_BYTE | 0xFF), 0);
    CHECK_EQ_INT(al_unicode_ccc(0x0301), 230);
    CHECK_EQ_INT(al_unicode_ccc(0x0323), 220);
    CHECK_EQ_INT(al_unicode_ccc('a'), 0);
}

static size_t dec(const char *s, size_t n, uint32_t *cp)
{
    return al_utf8_decode((const uint8_t *)s, n, cp);
}

TEST(utf8_decoding)
{
    uint32_t cp;
    CHECK_EQ_INT(dec("A", 1, &cp), 1);
    CHECK_EQ_INT(cp, 'A');
    CHECK_EQ_INT(dec("\xC3\xA9", 2, &cp), 2);
    CHECK_EQ_INT(cp, 0xE9);
    CHECK_EQ_INT(dec("\xE4\xB8\xAD", 3, &cp), 3);
    CHECK_EQ_INT(cp, 0x4E2D);
    CHECK_EQ_INT(dec("\xF0\x9F\x98\x80", 4, &cp), 4);
    CHECK_EQ_INT(cp, 0x1F600);
    /* ill-formed: each comes back as one bad byte */
    const char *bad[] = {
        "\xC0\x80",         "\xC1\xBF",         "\xE0\x80\x80", "\xED\xA0\x80", "\xF0\x80\x80\x80",
        "\xF4\x90\x80\x80", "\xF5\x80\x80\x80", "\xFF",         "\x80",         "\xE4\xB8",
        "\xE4\x41\x41"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        CHECKF(dec(bad[i], strlen(bad[i]), &cp) == 1 && (cp & AL_UNICODE_BAD_BYTE), "case %zu", i);
        CHECK_EQ_INT(cp & 0xFF, (uint8_t)bad[i][0]);
    }
    uint8_t out[4];
    CHECK_EQ_INT(al_utf8_encode(0x10FFFF, out), 4);
    CHECK_EQ_INT(dec((const char *)out, 4, &cp), 4);
    CHECK_EQ_INT(cp, 0x10FFFF);
}

TEST(utf8_complete_prefix)
{
    const struct {
        const char *s;
        size_t want;
    } cases[] = {
        {"abc", 3},          {"a\xE2\x82", 1},        {"a\xE2\x82\xAC", 4}, {"a\xE2", 1},
        {"\xF0\x9F\x98", 0}, {"\xF0\x9F\x98\x80", 4}, {"a\xFF", 2},         {"a\xE2\x41", 3},
        {"a\xE0\x80", 3},    {"a\xED\xA0", 3},        {"\x80\x80", 2},      {"\xC3", 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        CHECKF(al_utf8_complete_prefix((const uint8_t *)cases[i].s, strlen(cases[i].s)) ==
                   cases[i].want,
               "case %zu: %zu != %zu", i,
               al_utf8_complete_prefix((const uint8_t *)cases[i].s, strlen(cases[i].s)),
               cases[i].want);
}

TEST(nfc_matches_icu)
{
    al_json *fx = tok_load_fixture("tests/tokenizer/expected_nfc.json");
    REQUIRE(fx);
    const al_json *cases = al_json_get(fx, "cases");
    REQUIRE(cases && cases->count >= 100);
    size_t changed = 0;
    for (size_t i = 0; i < cases->count; i++) {
        const al_json *in = al_json_get(cases->items[i], "text"),
                      *want = al_json_get(cases->items[i], "nfc");
        char *out = NULL;
        size_t olen = 0;
        int r = al_unicode_nfc(in->string, in->string_len, &out, &olen);
        const char *got = r == 1 ? out : in->string;
        size_t glen = r == 1 ? olen : in->string_len;
        CHECKF(r >= 0 && glen == want->string_len && memcmp(got, want->string, glen) == 0,
               "case %zu: NFC differs at byte %zu", i,
               tok_first_diff(got, glen, want->string, want->string_len));
        if (want->string_len != in->string_len || memcmp(want->string, in->string, in->string_len))
            changed++;
        free(out);
    }
    CHECKF(changed >= 20, "only %zu cases change under NFC", changed);
    al_json_free(fx);
}

TEST(nfc_cases)
{
    const struct {
        const char *in, *want;
    } cases[] = {
        {"Cafe\xCC\x81", "Caf\xC3\xA9"},                          /* e + acute -> é */
        {"\xE2\x84\xAB", "\xC3\x85"},                             /* Angstrom sign -> Å */
        {"\xE1\x84\x80\xE1\x85\xA1\xE1\x86\xA8", "\xEA\xB0\x81"}, /* jamo -> 각 */
        {"a\xCC\x81\xCC\xA8", "\xC4\x85\xCC\x81"},                /* marks reordered, ą + acute */
        {"x\xFF\xCC\x81", "x\xFF\xCC\x81"}, /* a bad byte blocks composition */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *out = NULL;
        size_t olen = 0;
        int r = al_unicode_nfc(cases[i].in, strlen(cases[i].in), &out, &olen);
        CHECKF(r == 1 && olen == strlen(cases[i].want) && memcmp(out, cases[i].want, olen) == 0,
               "case %zu", i);
        free(out);
    }
    char *out = NULL;
    size_t olen = 0;
    CHECK_EQ_INT(al_unicode_nfc("plain ASCII and caf\xC3\xA9 \xE4\xB8\xAD", 24, &out, &olen), 0);
    CHECK(out == NULL);
}

static al_tokenizer *tiny(void)
{
    char *dir = tok_source_path("tests/tokenizer/tiny");
    char err[200];
    al_tokenizer *t = al_tokenizer_load_dir(dir, err, sizeof err);
    free(dir);
    return t;
}

TEST(stream_holds_split_characters)
{
    al_tokenizer *tok = tiny();
    REQUIRE(tok);
    /* ids 0..255 are single bytes: feed "é中😀" one byte at a time */
    const char *text = "\xC3\xA9\xE4\xB8\xAD\xF0\x9F\x98\x80!";
    al_tokenizer_stream st = {0};
    size_t emitted_at[16] = {0};
    al_buf acc = {0};
    al_buf_append(&acc, "", 0);
    for (size_t i = 0; i < strlen(text); i++) {
        size_t n = 0;
        const char *p = al_tokenizer_stream_push(tok, &st, (uint8_t)text[i], 0, &n);
        REQUIRE(p);
        emitted_at[i] = n;
        al_buf_append(&acc, p, n);
    }
    CHECK_EQ_STR(acc.data, text);
    /* text comes out only when a character completes */
    size_t want[] = {0, 2, 0, 0, 3, 0, 0, 0, 4, 1};
    for (size_t i = 0; i < 10; i++)
        CHECKF(emitted_at[i] == want[i], "byte %zu: emitted %zu, want %zu", i, emitted_at[i],
               want[i]);
    free(acc.data);
    al_tokenizer_stream_free(&st);

    /* bytes that can never become a character come out as U+FFFD at once; an unfinished
     * sequence at the end comes out as U+FFFD on flush */
    al_tokenizer_stream s2 = {0};
    size_t n = 0;
    CHECK_EQ_STR(al_tokenizer_stream_push(tok, &s2, 0xFF, 0, &n), "\xEF\xBF\xBD");
    CHECK_EQ_STR(al_tokenizer_stream_push(tok, &s2, 0xE4, 0, &n), "");
    CHECK_EQ_STR(al_tokenizer_stream_push(tok, &s2, 'A', 0, &n), "\xEF\xBF\xBD"
                                                                 "A");
    CHECK_EQ_STR(al_tokenizer_stream_push(tok, &s2, 0xF0, 0, &n), "");
    CHECK_EQ_STR(al_tokenizer_stream_push(tok, &s2, 0x9F, 0, &n), "");
    CHECK_EQ_STR(al_tokenizer_stream_flush(&s2, &n), "\xEF\xBF\xBD");
    CHECK_EQ_STR(al_tokenizer_stream_flush(&s2, &n), "");
    /* special tokens: shown, or skipped on request; unknown ids are skipped */
    CHECK_EQ_STR(al_tokenizer_stream_push(tok, &s2, 507, 0, &n), "<|im_end|>");
    CHECK_EQ_STR(al_tokenizer_stream_push(tok, &s2, 507, AL_TOKENIZER_SKIP_SPECIAL, &n), "");
    CHECK_EQ_STR(al_tokenizer_stream_push(tok, &s2, 99999, 0, &n), "");
    al_tokenizer_stream_free(&s2);
    al_tokenizer_free(tok);
}

TEST(lossy_decode)
{
    al_tokenizer *tok = tiny();
    REQUIRE(tok);
    /* E2 82 is the start of €, cut short: one U+FFFD, as Rust's from_utf8_lossy gives */
    int32_t ids[] = {'a', 0xE2, 0x82, 'b', 0xFF, 0xC3, 0xA9};
    char *out = NULL;
    size_t len = 0;
    REQUIRE(al_tokenizer_decode(tok, ids, 7, AL_TOKENIZER_LOSSY, &out, &len) == 0);
    CHECK_EQ_STR(out, "a\xEF\xBF\xBD"
                      "b\xEF\xBF\xBD\xC3\xA9");
    free(out);
    REQUIRE(al_tokenizer_decode(tok, ids, 7, 0, &out, &len) == 0);
    CHECK(len == 7 && memcmp(out,
                             "a\xE2\x82"
                             "b\xFF\xC3\xA9",
                             7) == 0);
    free(out);
    al_tokenizer_free(tok);
}

typedef struct ends_acc {
    size_t ends[256];
    size_t n;
} ends_acc;

static void collect_end(void *ctx, size_t start, size_t end)
{
    ends_acc *a = ctx;
    (void)start;
    if (a->n < 256) a->ends[a->n] = end;
    a->n++;
}

TEST(pretokenizer_splits_match_reference)
{
    /* expected_pretok.json: the Rust library's splits of 600 random strings (code points
     * from the whole code space and from a regex-relevant pool) for the GPT-2, Qwen2 and
     * Llama-3 patterns. A wrong class for any code point in the tables shows up here. */
    al_json *fx = tok_load_fixture("tests/tokenizer/expected_pretok.json");
    REQUIRE(fx);
    const al_json *all = al_json_get(fx, "cases");
    REQUIRE(all && all->count == 3);
    for (size_t t = 0; t < all->count; t++) {
        char rel[128];
        snprintf(rel, sizeof rel, "tests/tokenizer/%s/tokenizer.json", all->keys[t]);
        char *path = tok_source_path(rel);
        char err[200];
        al_tokenizer *tok = al_tokenizer_load(path, NULL, err, sizeof err);
        free(path);
        REQUIREF(tok, "%s: %s", rel, err);
        const al_json *cases = all->items[t];
        CHECK(cases->count >= 500);
        int bad = 0;
        for (size_t i = 0; i < cases->count && bad < 5; i++) {
            const al_json *text = al_json_get(cases->items[i], "text");
            const al_json *ends = al_json_get(cases->items[i], "ends");
            ends_acc acc = {.n = 0};
            CHECK(al_tokenizer_pretokenize(tok, text->string, text->string_len, collect_end,
                                           &acc) == 0);
            int same = acc.n == ends->count;
            for (size_t k = 0; same && k < acc.n; k++)
                same = acc.ends[k] == (size_t)ends->items[k]->integer;
            if (!same) {
                bad++;
                char hex[200] = "";
                for (size_t k = 0; k < text->string_len && k < 48; k++)
                    snprintf(hex + strlen(hex), sizeof hex - strlen(hex), "%02x",
                             (uint8_t)text->string[k]);
                CHECKF(0, "%s case %zu (%s): %zu pieces, reference %zu", all->keys[t], i, hex,
                       acc.n, ends->count);
            }
        }
        al_tokenizer_free(tok);
    }
    al_json_free(fx);
}
