/* 0005: lib/core's base layer — buffer, vector, map, hash, RNG, parsers, secret compare,
 * flag tables. */
#include "testlib.h"

#include "core/buf.h"
#include "core/flags.h"
#include "core/hash.h"
#include "core/map.h"
#include "core/parse.h"
#include "core/util.h"
#include "core/vec.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

TEST(buf_appends_stays_terminated_and_detaches)
{
    al_buf b = {0};
    CHECK_EQ_INT(al_buf_append(&b, "ab", 2), 0);
    CHECK_EQ_INT(al_buf_printf(&b, "-%d-", 42), 0);
    CHECK_EQ_INT(al_buf_puts(&b, "z"), 0);
    CHECK_EQ_STR(b.data, "ab-42-z");
    CHECK_EQ_INT((int)b.len, 7);
    for (int i = 0; i < 1000; i++) al_buf_append(&b, "0123456789", 10);
    CHECK_EQ_INT((int)b.len, 10007);
    CHECK(b.data[b.len] == '\0');
    CHECK(al_buf_reserve(&b, SIZE_MAX - 8) != 0); /* overflow is refused, and sticks */
    CHECK(b.oom);
    CHECK(al_buf_append(&b, "x", 1) != 0);
    CHECK_EQ_INT((int)b.len, 10007);
    al_buf_reset(&b);
    CHECK(!b.oom && b.len == 0 && al_buf_puts(&b, "again") == 0);
    size_t n;
    char *s = al_buf_detach(&b, &n);
    CHECK_EQ_STR(s, "again");
    CHECK(n == 5 && b.data == NULL && b.len == 0);
    free(s);
    s = al_buf_detach(&b, NULL); /* an empty buffer detaches as "" */
    CHECK(s && s[0] == '\0');
    free(s);
}

TEST(vec_pushes_and_grows)
{
    AL_VEC(int64_t) v = {0};
    for (int64_t i = 0; i < 1000; i++) CHECK_EQ_INT(al_vec_push(&v, i * 3), 0);
    CHECK_EQ_INT((int)v.n, 1000);
    CHECK(v.cap >= 1000);
    CHECK(v.v[999] == 2997 && v.v[0] == 0);
    size_t cap = 4;
    void *arr = NULL;
    CHECK(al_vec_grow(&arr, &cap, SIZE_MAX / 2, 16) != 0); /* too large: unchanged */
    CHECK(arr == NULL && cap == 4);
    al_vec_free(&v);
    CHECK(v.v == NULL && v.n == 0);
}

TEST(map_puts_finds_removes_and_iterates_while_removing)
{
    al_map m = {0};
    char key[32];
    for (long i = 0; i < 5000; i++) {
        snprintf(key, sizeof key, "k%ld", i);
        CHECK_EQ_INT(al_map_put(&m, key, (void *)(i + 1)), 0);
    }
    CHECK_EQ_INT((int)m.count, 5000);
    CHECK(al_map_get(&m, "k4999") == (void *)5000);
    CHECK(al_map_get(&m, "k5000") == NULL);
    al_map_entry *e = al_map_find(&m, "k7");
    REQUIRE(e != NULL);
    CHECK_EQ_STR(e->key, "k7");
    CHECK_EQ_INT(al_map_put(&m, "k7", (void *)77), 0); /* replaces, keeps the entry */
    CHECK(al_map_find(&m, "k7") == e && e->value == (void *)77 && m.count == 5000);
    int created = -1;
    CHECK(al_map_upsertn(&m, "k7xyz", 2, &created) == e && created == 0);
    /* keys are bytes: an embedded NUL is part of the key */
    al_map_entry *z = al_map_upsertn(&m, "a\0b", 3, &created);
    CHECK(z && created == 1 && z->klen == 3 && al_map_findn(&m, "a\0b", 3) == z);
    CHECK(al_map_find(&m, "a") == NULL);
    CHECK(al_map_remove(&m, "k1") == (void *)2);
    CHECK(al_map_remove(&m, "k1") == NULL);
    /* drop every even value during one iteration */
    al_map_iter it;
    al_map_iter_init(&it, &m);
    size_t seen = 0, removed = 0;
    while ((e = al_map_iter_next(&it))) {
        seen++;
        if (((uintptr_t)e->value & 1) == 0) {
            al_map_remove_entry(&m, e);
            removed++;
        }
    }
    CHECK_EQ_INT((int)seen, 5000);
    CHECK_EQ_INT((int)m.count, 5000 - (int)removed);
    CHECK(al_map_get(&m, "k0") == (void *)1);
    CHECK(al_map_find(&m, "k3") == NULL); /* value 4 */
    al_map_free(&m, NULL);
    CHECK(m.count == 0 && m.slots == NULL);
}

TEST(hash_is_fnv1a_and_splitmix64)
{
    /* FNV-1a 64 with the project's basis (hash.h), computed independently in Python */
    CHECK(al_hash_str("") == 0x14650fb0739d0383ULL);
    CHECK(al_hash_str("a") == 0x44bd8ad473cd9906ULL);
    CHECK(al_hash_str("foobar") == 0x88fad7c0a8ff07f2ULL);
    CHECK(al_hash_fnv1a("foobar", 6) == al_hash_str("foobar"));
    CHECK(al_hash_fnv1a_more(al_hash_fnv1a("foo", 3), "bar", 3) == al_hash_str("foobar"));
    /* SplitMix64 from seed 0: the first outputs of the reference generator */
    uint64_t x = 0;
    CHECK(al_splitmix64(&x) == 0xe220a8397b1dcdafULL);
    CHECK(al_splitmix64(&x) == 0x6e789e6aa1b965f4ULL);
    CHECK(al_splitmix64(&x) == 0x06c45d188009454fULL);
}

TEST(parsers_take_whole_strings_in_range)
{
    int64_t v = 7;
    CHECK(al_parse_i64("42", 0, 100, &v) == 0 && v == 42);
    CHECK(al_parse_i64("-5", -10, 10, &v) == 0 && v == -5);
    v = 7;
    CHECK(al_parse_i64("101", 0, 100, &v) != 0 && v == 7);
    CHECK(al_parse_i64("", 0, 100, &v) != 0);
    CHECK(al_parse_i64("12x", 0, 100, &v) != 0);
    CHECK(al_parse_i64("99999999999999999999", INT64_MIN, INT64_MAX, &v) != 0);
    int i = 3;
    CHECK(al_parse_int("2147483647", 0, INT32_MAX, &i) == 0 && i == INT32_MAX);
    CHECK(al_parse_int("2147483648", 0, INT32_MAX, &i) != 0 && i == INT32_MAX);
    double d = 1;
    CHECK(al_parse_double("0.25", 0, 1, &d) == 0 && d == 0.25);
    CHECK(al_parse_double("1e-3", 0, 1, &d) == 0 && d == 1e-3);
    CHECK(al_parse_double("nan", -1e308, 1e308, &d) != 0);
    CHECK(al_parse_double("2", 0, 1, &d) != 0 && d == 1e-3);
    CHECK(al_parse_double("0.5s", 0, 1, &d) != 0);
}

TEST(secret_compare)
{
    CHECK(al_secret_eq("sk-123", 6, "sk-123"));
    CHECK(!al_secret_eq("sk-12", 5, "sk-123"));
    CHECK(!al_secret_eq("sk-1234", 7, "sk-123"));
    CHECK(!al_secret_eq("sk-124", 6, "sk-123"));
    CHECK(al_secret_eq("", 0, ""));
}

static int parse_even(void *dest, const char *v, char *err, size_t errlen)
{
    int64_t x;
    if (al_parse_i64(v, 0, 1000, &x) != 0 || x % 2) {
        snprintf(err, errlen, "wants an even number");
        return -1;
    }
    *(int64_t *)dest = x;
    return 0;
}

/* Runs al_flags_parse on a command line; stdout and stderr go to out/err. */
static int run_flags(const al_cmd_spec *spec, al_cli_common *c, const char *const *args, int n,
                     int *first, char *out, size_t outlen, char *err, size_t errlen)
{
    char *argv[16];
    argv[0] = (char *)"x";
    for (int i = 0; i < n; i++) argv[i + 1] = (char *)args[i];
    argv[n + 1] = NULL;
    fflush(stdout);
    fflush(stderr);
    FILE *o = tmpfile(), *e = tmpfile();
    int so = dup(1), se = dup(2);
    dup2(fileno(o), 1);
    dup2(fileno(e), 2);
    int rc = al_flags_parse(spec, c, n + 1, argv, first);
    fflush(stdout);
    fflush(stderr);
    dup2(so, 1);
    dup2(se, 2);
    close(so);
    close(se);
    rewind(o);
    rewind(e);
    out[fread(out, 1, outlen - 1, o)] = '\0';
    err[fread(err, 1, errlen - 1, e)] = '\0';
    fclose(o);
    fclose(e);
    return rc;
}

TEST(flags_from_a_table)
{
    static int follow;
    static int64_t max = -1, even = 0;
    static int count = 1;
    static double temp = 1.0;
    static const char *mode = "fast";
    static const char *const modes[] = {"fast", "slow", "exact", NULL};
    static const al_flag flags[] = {
        {"follow", 'f', AL_FLAG_SWITCH, &follow, .help = "keep waiting"},
        {"max", 'n', AL_FLAG_I64, &max, .lo = 1, .hi = INT64_MAX, .arg = "N",
         .help = "stop after N messages\nsecond line"},
        {"count", 0, AL_FLAG_INT, &count, .lo = 1, .hi = 64, .arg = "K", .help = "how many"},
        {"temperature", 0, AL_FLAG_DOUBLE, &temp, .dlo = 0, .dhi = 2, .arg = "T", .help = "t"},
        {"mode", 0, AL_FLAG_STRING, &mode, .arg = "M", .choices = modes, .help = "m"},
        {"even", 0, AL_FLAG_FUNC, &even, .arg = "E", .parse = parse_even, .help = "e"},
    };
    static const al_cmd_spec spec = {"demo", "TOPIC... [flags]", "Does a demo.\n", flags,
                                     AL_ARRAY_LEN(flags), 1, NULL};
    al_cli_common c;
    al_cli_common_init(&c);
    char out[4096], err[1024];
    int first = 0;
    const char *ok[] = {"t1", "-f", "--max", "5", "t2", "--count=3", "--temperature", "0.5",
                        "--mode", "exact", "--even", "8", "--bootstrap", "h:1"};
    CHECK_EQ_INT(run_flags(&spec, &c, ok, 14, &first, out, sizeof out, err, sizeof err),
                 AL_FLAGS_GO);
    CHECK(follow == 1 && max == 5 && count == 3 && temp == 0.5 && even == 8);
    CHECK_EQ_STR(mode, "exact");
    CHECK_EQ_STR(c.bootstrap, "h:1");
    CHECK_EQ_INT(first, 13); /* getopt moved the operands to the end */

    struct {
        const char *args[3];
        int n;
        const char *says;
    } bad[] = {
        {{"--max", "0"}, 2, "--max wants an integer of at least 1, got '0'"},
        {{"--count", "65"}, 2, "--count wants an integer from 1 to 64, got '65'"},
        {{"--temperature", "3"}, 2, "--temperature wants a number from 0 to 2, got '3'"},
        {{"--mode", "quick"}, 2, "--mode wants fast, slow or exact, got 'quick'"},
        {{"--even", "3"}, 2, "--even wants an even number, got '3'"},
        {{"--max"}, 1, "--max needs a value"},
        {{"--nope"}, 1, "unknown option '--nope'"},
        {{"--log-level", "loud"}, 2, "--log-level"},
    };
    for (size_t i = 0; i < AL_ARRAY_LEN(bad); i++) {
        int rc = run_flags(&spec, &c, bad[i].args, bad[i].n, &first, out, sizeof out, err,
                           sizeof err);
        CHECKF(rc == AL_EXIT_USAGE, "case %zu: rc %d", i, rc);
        CHECKF(strstr(err, bad[i].says) != NULL, "case %zu: stderr '%s'", i, err);
    }

    const char *help[] = {"--help"};
    CHECK_EQ_INT(run_flags(&spec, &c, help, 1, &first, out, sizeof out, err, sizeof err),
                 AL_EXIT_OK);
    CHECKF(strstr(out, "usage: arclight demo TOPIC... [flags]\n\nDoes a demo.\n") == out, "%s",
           out);
    CHECKF(strstr(out, "  -n, --max N                 stop after N messages\n"
                       "                              second line\n"),
           "%s", out);
    CHECK(strstr(out, "  --count K                   how many\n") != NULL);
    CHECK(strstr(out, "--bootstrap") != NULL); /* the shared flags' help */
}
