/*
 * t0700_tokenizer_ids: token ids against Hugging Face's reference implementation.
 *
 * The expected ids in tests/tokenizer/expected_*.json were produced by
 * @huggingface/tokenizers (tests/tokenizer/gen_expected.mjs) from the same tokenizer.json
 * files: the real Qwen3 tokenizer (NFC, Qwen2 regex, 151k merges; unpacked from
 * tests/tokenizer/qwen3.tar.xz at configure time), the tiny GPT-2-style tokenizer and its
 * Llama-3-style variant. Texts cover non-ASCII scripts, emoji, numbers, whitespace runs,
 * contractions and special tokens. Also: decode(encode(x)) == NFC(x), the
 * tokenizer_config.json fields, and round trips of random UTF-8 and random bytes.
 */
#include "text/tokenizer.h"
#include "text/unicode.h"
#include "t0749_tokenizer_util.h"
#include "testlib.h"

static al_tokenizer *qwen3;

static al_tokenizer *load_qwen3(void)
{
    if (qwen3) return qwen3;
    char *dir = tok_qwen3_dir();
    char err[300];
    double t0 = testlib_now();
    qwen3 = al_tokenizer_load_dir(dir, err, sizeof err);
    if (!qwen3)
        fprintf(stderr, "loading %s: %s\n", dir, err);
    else
        printf("  loaded the Qwen3 tokenizer in %.2fs\n", testlib_now() - t0);
    free(dir);
    return qwen3;
}

static al_tokenizer *load_rel(const char *rel_dir)
{
    char *dir = tok_source_path(rel_dir);
    char err[300];
    al_tokenizer *t = al_tokenizer_load_dir(dir, err, sizeof err);
    if (!t) fprintf(stderr, "loading %s: %s\n", dir, err);
    free(dir);
    return t;
}

/* Encodes every case of a fixture and compares with the reference ids; checks that the
 * ids decode back to the (normalized) text. Returns the number of cases checked. */
static int check_fixture(al_tokenizer *tok, const char *fixture, int nfc)
{
    al_json *fx = tok_load_fixture(fixture);
    if (!fx) return 0;
    const al_json *cases = al_json_get(fx, "cases");
    int checked = 0;
    for (size_t i = 0; cases && i < cases->count; i++) {
        const al_json *c = cases->items[i];
        const al_json *text = al_json_get(c, "text"), *ids = al_json_get(c, "ids");
        al_token_ids got = {0};
        CHECK(al_tokenizer_encode(tok, text->string, text->string_len, AL_TOKENIZER_ALLOW_SPECIAL,
                                  &got) == 0);
        int same = got.len == ids->count;
        for (size_t k = 0; same && k < got.len; k++)
            same = got.ids[k] == (int32_t)ids->items[k]->integer;
        if (!same) {
            size_t k = 0;
            while (k < got.len && k < ids->count && got.ids[k] == (int32_t)ids->items[k]->integer)
                k++;
            CHECKF(
                0,
                "%s case %zu \"%.60s\": %zu ids, reference %zu; first difference at %zu: %d vs %d",
                fixture, i, text->string, got.len, ids->count, k, k < got.len ? got.ids[k] : -1,
                k < ids->count ? (int)ids->items[k]->integer : -1);
        }
        char *dec = NULL, *norm = NULL;
        size_t dlen = 0, nlen = text->string_len;
        CHECK(al_tokenizer_decode(tok, got.ids, got.len, 0, &dec, &dlen) == 0);
        const char *want = text->string;
        if (nfc && al_unicode_nfc(text->string, text->string_len, &norm, &nlen) == 1) want = norm;
        CHECKF(dlen == nlen && memcmp(dec, want, nlen) == 0,
               "%s case %zu: decode(encode(x)) differs at byte %zu", fixture, i,
               tok_first_diff(dec, dlen, want, nlen));
        free(dec);
        free(norm);
        al_token_ids_free(&got);
        checked++;
    }
    al_json_free(fx);
    return checked;
}

TEST(qwen3_ids_match_reference)
{
    al_tokenizer *tok = load_qwen3();
    REQUIRE(tok);
    int n = check_fixture(tok, "tests/tokenizer/expected_qwen3.json", 1);
    CHECKF(n >= 40, "only %d cases", n);
    /* A second pass is served from the word cache and must give the same ids. */
    CHECK_EQ_INT(check_fixture(tok, "tests/tokenizer/expected_qwen3.json", 1), n);
}

TEST(tiny_ids_match_reference)
{
    al_tokenizer *tok = load_rel("tests/tokenizer/tiny");
    REQUIRE(tok);
    CHECK(check_fixture(tok, "tests/tokenizer/expected_tiny.json", 0) >= 40);
    al_tokenizer_free(tok);
}

TEST(tiny_llama3_ids_match_reference)
{
    char *path = tok_source_path("tests/tokenizer/tiny_llama3/tokenizer.json");
    char err[300];
    al_tokenizer *tok = al_tokenizer_load(path, NULL, err, sizeof err);
    free(path);
    REQUIREF(tok, "%s", err);
    CHECK(check_fixture(tok, "tests/tokenizer/expected_tiny_llama3.json", 0) >= 40);
    al_tokenizer_free(tok);
}

/* For variants whose decode is not the input (prefix spaces added, whitespace stripped
 * around added tokens): compare the ids only. */
static void check_ids_only(const char *json_rel, const char *fixture)
{
    char *path = tok_source_path(json_rel);
    char err[300];
    al_tokenizer *tok = al_tokenizer_load(path, NULL, err, sizeof err);
    free(path);
    REQUIREF(tok, "%s", err);
    al_json *fx = tok_load_fixture(fixture);
    REQUIRE(fx);
    const al_json *cases = al_json_get(fx, "cases");
    CHECK(cases && cases->count >= 40);
    for (size_t i = 0; cases && i < cases->count; i++) {
        const al_json *text = al_json_get(cases->items[i], "text"),
                      *ids = al_json_get(cases->items[i], "ids");
        al_token_ids got = {0};
        CHECK(al_tokenizer_encode(tok, text->string, text->string_len, AL_TOKENIZER_ALLOW_SPECIAL,
                                  &got) == 0);
        int same = got.len == ids->count;
        for (size_t k = 0; same && k < got.len; k++)
            same = got.ids[k] == (int32_t)ids->items[k]->integer;
        CHECKF(same, "%s case %zu \"%.60s\": ids differ from the reference", fixture, i,
               text->string);
        al_token_ids_free(&got);
    }
    al_json_free(fx);
    al_tokenizer_free(tok);
}

TEST(tiny_prefix_space_ids_match_reference)
{
    check_ids_only("tests/tokenizer/tiny_prefix/tokenizer.json",
                   "tests/tokenizer/expected_tiny_prefix.json");
}

TEST(tiny_string_merges_ids_match_reference)
{
    check_ids_only("tests/tokenizer/tiny_strmerges/tokenizer.json",
                   "tests/tokenizer/expected_tiny_strmerges.json");
}

TEST(tiny_lstrip_rstrip_ids_match_reference)
{
    check_ids_only("tests/tokenizer/tiny_strip/tokenizer.json",
                   "tests/tokenizer/expected_tiny_strip.json");
}

TEST(qwen3_vocabulary_and_config)
{
    al_tokenizer *tok = load_qwen3();
    REQUIRE(tok);
    CHECK_EQ_INT(al_tokenizer_vocab_size(tok), 151669);
    CHECK_EQ_INT(al_tokenizer_token_to_id(tok, "<|im_start|>", 12), 151644);
    CHECK_EQ_INT(al_tokenizer_token_to_id(tok, "Hello", 5), 9707);
    CHECK_EQ_INT(al_tokenizer_token_to_id(tok, "no-such-token-xyz", 17), -1);
    CHECK_EQ_STR(al_tokenizer_id_to_token(tok, 9707), "Hello");
    CHECK_EQ_STR(al_tokenizer_id_to_token(tok, 1879), "\xC4\xA0world"); /* "Ġworld" */
    CHECK(al_tokenizer_id_to_token(tok, -1) == NULL);
    CHECK(al_tokenizer_id_to_token(tok, 151669) == NULL);
    size_t n = 0;
    const char *b = al_tokenizer_id_bytes(tok, 1879, &n);
    CHECK(b && n == 6 && memcmp(b, " world", 6) == 0);
    CHECK(al_tokenizer_id_is_special(tok, 151645));
    CHECK(!al_tokenizer_id_is_special(tok, 9707));
    CHECK(!al_tokenizer_id_is_special(tok, 151657)); /* <tool_call> is added but not special */
    CHECK_EQ_INT(al_tokenizer_eos_id(tok), 151645);  /* <|im_end|> */
    CHECK_EQ_INT(al_tokenizer_pad_id(tok), 151643);  /* <|endoftext|> */
    CHECK_EQ_INT(al_tokenizer_bos_id(tok), -1);
    CHECK_EQ_INT(al_tokenizer_chat_template(tok), AL_CHAT_TEMPLATE_QWEN3);
}

TEST(tiny_config)
{
    al_tokenizer *tok = load_rel("tests/tokenizer/tiny");
    REQUIRE(tok);
    CHECK_EQ_INT(al_tokenizer_vocab_size(tok), 512);
    CHECK_EQ_INT(al_tokenizer_eos_id(tok), 507);
    CHECK_EQ_INT(al_tokenizer_pad_id(tok), 505);
    CHECK_EQ_INT(al_tokenizer_chat_template(tok), AL_CHAT_TEMPLATE_QWEN2_5);
    /* ids 0..255 are the bytes themselves */
    for (int b = 0; b < 256; b++) {
        size_t n = 0;
        const char *s = al_tokenizer_id_bytes(tok, b, &n);
        CHECK(s && n == 1 && (uint8_t)s[0] == b);
    }
    al_tokenizer_free(tok);
}

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint32_t rnd(uint32_t n)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state % n);
}

/* A random valid UTF-8 string mixing ASCII, spaces, Latin, combining marks, CJK, emoji. */
static size_t random_utf8(char *out, size_t max_chars)
{
    static const uint32_t lo[] = {0x20,   0x0A,   0xC0,   0x300,   0x400, 0x600,
                                  0x3040, 0x4E00, 0xAC00, 0x1F300, 0x2000};
    static const uint32_t span[] = {0x5F, 4,      0x140,  0x70,  0x100, 0x100,
                                    0xC0, 0x5000, 0x2BA4, 0x300, 0x70};
    size_t n = 0, chars = 1 + rnd((uint32_t)max_chars);
    for (size_t i = 0; i < chars; i++) {
        int k = (int)rnd(sizeof lo / sizeof lo[0]);
        if (rnd(3) == 0) k = 0; /* lots of ASCII */
        uint32_t cp = lo[k] + rnd(span[k]);
        if (cp >= 0xD800 && cp <= 0xDFFF) cp = 'x';
        n += al_utf8_encode(cp, (uint8_t *)out + n);
    }
    return n;
}

static void roundtrip(al_tokenizer *tok, int nfc, int rounds)
{
    char buf[4 * 80 + 1];
    for (int r = 0; r < rounds; r++) {
        size_t len = random_utf8(buf, 80);
        al_token_ids ids = {0};
        REQUIRE(al_tokenizer_encode(tok, buf, len, 0, &ids) == 0);
        char *dec = NULL, *norm = NULL;
        size_t dlen = 0, nlen = len;
        REQUIRE(al_tokenizer_decode(tok, ids.ids, ids.len, 0, &dec, &dlen) == 0);
        const char *want = buf;
        if (nfc && al_unicode_nfc(buf, len, &norm, &nlen) == 1) want = norm;
        CHECKF(dlen == nlen && memcmp(dec, want, nlen) == 0, "round %d: differs at byte %zu of %zu",
               r, tok_first_diff(dec, dlen, want, nlen), nlen);
        /* streaming the same ids gives the same text */
        al_tokenizer_stream st = {0};
        al_buf acc = {0};
        al_buf_append(&acc, "", 0);
        for (size_t k = 0; k < ids.len; k++) {
            size_t n = 0;
            const char *piece = al_tokenizer_stream_push(tok, &st, ids.ids[k], 0, &n);
            REQUIRE(piece);
            al_buf_append(&acc, piece, n);
        }
        size_t n = 0;
        const char *tail = al_tokenizer_stream_flush(&st, &n);
        al_buf_append(&acc, tail, n);
        CHECKF(acc.len == nlen && memcmp(acc.data, want, nlen) == 0,
               "round %d: streamed text differs", r);
        free(acc.data);
        al_tokenizer_stream_free(&st);
        free(dec);
        free(norm);
        al_token_ids_free(&ids);
    }
}

TEST(random_utf8_roundtrip)
{
    al_tokenizer *tiny = load_rel("tests/tokenizer/tiny");
    REQUIRE(tiny);
    roundtrip(tiny, 0, 300);
    al_tokenizer *q = load_qwen3();
    REQUIRE(q);
    roundtrip(q, 1, 300);
    al_tokenizer_free(tiny);
}

TEST(random_bytes_roundtrip)
{
    /* Byte-level BPE encodes any bytes, malformed UTF-8 included, and gets them back. */
    al_tokenizer *tok = load_rel("tests/tokenizer/tiny");
    REQUIRE(tok);
    al_tokenizer *q = load_qwen3();
    REQUIRE(q);
    char buf[200];
    for (int r = 0; r < 300; r++) {
        size_t len = 1 + rnd(sizeof buf);
        for (size_t i = 0; i < len; i++)
            buf[i] = (char)(rnd(4) == 0 ? 0x80 + rnd(0x80) : rnd(256));
        for (int which = 0; which < 2; which++) {
            al_tokenizer *t = which ? q : tok;
            al_token_ids ids = {0};
            REQUIRE(al_tokenizer_encode(t, buf, len, AL_TOKENIZER_ALLOW_SPECIAL, &ids) == 0);
            char *dec = NULL;
            size_t dlen = 0;
            REQUIRE(al_tokenizer_decode(t, ids.ids, ids.len, 0, &dec, &dlen) == 0);
            if (which == 0)
                CHECKF(dlen == len && memcmp(dec, buf, len) == 0, "round %d: bytes differ at %zu",
                       r, tok_first_diff(dec, dlen, buf, len));
            free(dec);
            al_token_ids_free(&ids);
        }
    }
    al_tokenizer_free(tok);
}

#include <pthread.h>

typedef struct worker {
    al_tokenizer *tok;
    const char *text;
    size_t len;
    const al_token_ids *want;
    int mismatches;
} worker;

static void *encode_worker(void *arg)
{
    worker *w = arg;
    for (int r = 0; r < 20; r++) {
        al_token_ids ids = {0};
        if (al_tokenizer_encode(w->tok, w->text, w->len, AL_TOKENIZER_ALLOW_SPECIAL, &ids) != 0 ||
            ids.len != w->want->len ||
            memcmp(ids.ids, w->want->ids, ids.len * sizeof(int32_t)) != 0)
            w->mismatches++;
        al_token_ids_free(&ids);
    }
    return NULL;
}

TEST(concurrent_encode_shares_the_cache)
{
    al_tokenizer *tok = load_qwen3();
    REQUIRE(tok);
    /* a few KB of mixed text, encoded by 4 threads at once against a single-thread result */
    al_json *fx = tok_load_fixture("tests/tokenizer/expected_qwen3.json");
    REQUIRE(fx);
    al_buf text = {0};
    const al_json *cases = al_json_get(fx, "cases");
    for (size_t i = 0; i < cases->count; i++)
        al_buf_append(&text, al_json_get(cases->items[i], "text")->string,
                           al_json_get(cases->items[i], "text")->string_len);
    al_json_free(fx);
    al_tokenizer *fresh = NULL;
    char *dir = tok_qwen3_dir();
    char err[300];
    fresh =
        al_tokenizer_load_dir(dir, err, sizeof err); /* empty cache: the threads race to fill it */
    free(dir);
    REQUIRE(fresh);
    al_token_ids want = {0};
    REQUIRE(al_tokenizer_encode(tok, text.data, text.len, AL_TOKENIZER_ALLOW_SPECIAL, &want) == 0);
    pthread_t th[4];
    worker w[4];
    for (int i = 0; i < 4; i++) {
        w[i] = (worker){fresh, text.data, text.len, &want, 0};
        pthread_create(&th[i], NULL, encode_worker, &w[i]);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        CHECK_EQ_INT(w[i].mismatches, 0);
    }
    al_token_ids_free(&want);
    free(text.data);
    al_tokenizer_free(fresh);
}

TEST(cache_eviction)
{
    /* more distinct words than the cache holds (65536): it is emptied and refilled, and
     * the ids stay those of an uncached encode */
    al_tokenizer *tok = load_rel("tests/tokenizer/tiny");
    REQUIRE(tok);
    al_buf text = {0};
    for (int w = 0; w < 70000; w++) {
        char word[8];
        int n = 0, x = w;
        do {
            word[n++] = (char)('a' + x % 26);
            x /= 26;
        } while (x);
        al_buf_append(&text, " ", 1);
        al_buf_append(&text, word, (size_t)n);
    }
    al_token_ids all = {0};
    REQUIRE(al_tokenizer_encode(tok, text.data, text.len, 0, &all) == 0);
    /* the same words again one at a time, now partly from the refilled cache */
    size_t at = 0;
    int bad = 0;
    const char *p = text.data;
    for (size_t i = 0; i < text.len && !bad;) {
        size_t j = i + 1;
        while (j < text.len && p[j] != ' ')
            j++;
        al_token_ids one = {0};
        REQUIRE(al_tokenizer_encode(tok, p + i, j - i, 0, &one) == 0);
        if (at + one.len > all.len || memcmp(all.ids + at, one.ids, one.len * sizeof(int32_t)) != 0)
            bad = 1;
        at += one.len;
        al_token_ids_free(&one);
        i = j;
    }
    CHECK(!bad);
    CHECK_EQ_INT(at, all.len);
    al_token_ids_free(&all);
    free(text.data);
    al_tokenizer_free(tok);
}

TEST(zz_release)
{
    al_tokenizer_free(qwen3);
    qwen3 = NULL;
}
