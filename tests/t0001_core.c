/* 0001: lib/core — CLI flag parsing, files, hashing. */
#include "testlib.h"

#include "core/cli.h"
#include "core/util.h"

#include <stdlib.h>
#include <unistd.h>

TEST(hostport_parses_ipv4_names_and_ipv6)
{
    char host[64];
    int port = 0;
    CHECK(al_cli_parse_hostport("127.0.0.1:9092", host, sizeof host, &port) == 0);
    CHECK_EQ_STR(host, "127.0.0.1");
    CHECK_EQ_INT(port, 9092);
    CHECK(al_cli_parse_hostport("[::1]:80", host, sizeof host, &port) == 0);
    CHECK_EQ_STR(host, "::1");
    CHECK_EQ_INT(port, 80);
    CHECK(al_cli_parse_hostport("kafka-0.local:19092", host, sizeof host, &port) == 0);
    CHECK_EQ_STR(host, "kafka-0.local");
    CHECK(al_cli_parse_hostport("nocolon", host, sizeof host, &port) != 0);
    CHECK(al_cli_parse_hostport(":9092", host, sizeof host, &port) != 0);
    CHECK(al_cli_parse_hostport("h:70000", host, sizeof host, &port) != 0);
    CHECK(al_cli_parse_hostport("h:12x", host, sizeof host, &port) != 0);
}

TEST(sha256_matches_known_vectors)
{
    char hex[65];
    al_sha256_hex("abc", 3, hex);
    CHECK_EQ_STR(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    al_sha256_hex("", 0, hex);
    CHECK_EQ_STR(hex, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    al_sha256_ctx c;
    al_sha256_init(&c);
    al_sha256_update(&c, "a", 1);
    al_sha256_update(&c, "bc", 2);
    uint8_t d[32];
    al_sha256_final(&c, d);
    al_hex(d, 32, hex);
    CHECK_EQ_STR(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

TEST(file_write_atomic_then_read_back)
{
    char path[] = "/tmp/arclight-t0001-XXXXXX";
    int fd = mkstemp(path);
    REQUIRE(fd >= 0);
    close(fd);
    char err[256];
    CHECK(al_file_write_atomic(path, "hello\n", 6, err, sizeof err) == 0);
    size_t n = 0;
    char *s = al_file_read(path, &n, err, sizeof err);
    REQUIRE(s);
    CHECK_EQ_INT(n, 6);
    CHECK_EQ_STR(s, "hello\n");
    free(s);
    unlink(path);
    CHECK(al_file_read("/nonexistent/arclight", &n, err, sizeof err) == NULL);
    CHECK(strstr(err, "/nonexistent/arclight") != NULL);
}

TEST(count_lines_skips_empty_ones_and_counts_an_unterminated_last)
{
    char path[] = "/tmp/arclight-t0001-XXXXXX";
    int fd = mkstemp(path);
    REQUIRE(fd >= 0);
    close(fd);
    char err[256];
    static const struct {
        const char *text;
        long want;
    } cases[] = {{"", 0}, {"\n\n", 0}, {"a", 1}, {"a\n", 1}, {"a\n\nb", 2}, {"\na\nb\n\n", 2}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        REQUIRE(al_file_write_atomic(path, cases[i].text, strlen(cases[i].text), err,
                                     sizeof err) == 0);
        CHECKF(al_file_count_lines(path) == cases[i].want, "case %zu: %ld lines, want %ld", i,
               al_file_count_lines(path), cases[i].want);
    }
    unlink(path);
    CHECK(al_file_count_lines("/nonexistent/arclight") == -1);
}

TEST(trim_strips_both_ends)
{
    char s[] = "  \t key = value \n";
    CHECK_EQ_STR(al_str_trim(s), "key = value");
}
