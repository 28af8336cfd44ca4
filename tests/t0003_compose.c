/* 0003: docker-compose.yml is consistent with the arclight binary and the repository
 * (checked by tests/compose_check.py, which runs $ARCLIGHT_BIN CMD --help; no Docker engine
 * here), and broken copies of it are caught: a wrong advertised port, a bogus flag, a health
 * check on the wrong port, a trainer that cannot resume, serve not seeing the checkpoints. */
#include "testlib.h"
#include "support.h"

#include <stdlib.h>
#include <sys/wait.h>

static const char *src_dir(void)
{
    const char *src = getenv("ARCLIGHT_SOURCE_DIR");
    return src ? src : ".";
}

static int run_check(const char *root, char *out, size_t outlen)
{
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "ARCLIGHT_SOURCE_DIR='%s' /usr/bin/python3 '%s/tests/compose_check.py' 2>&1",
             root, src_dir());
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    size_t n = fread(out, 1, outlen - 1, p);
    out[n] = '\0';
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* Copies what the checker reads into a fresh directory, applies `edit` (a shell command run
 * there) and checks the copy; the checker's exit status, its output in out. */
static int check_broken_copy(const char *edit, char *out, size_t outlen)
{
    char dir[512], cmd[8192];
    if (!al_test_tmpdir(dir, sizeof dir, "t0003")) return -1;
    snprintf(cmd, sizeof cmd,
             "cd '%1$s' && cp -r docker-compose.yml Dockerfile broker-config tools '%2$s/' &&"
             "mkdir -p '%2$s/lib/core' '%2$s/tests' '%2$s/examples' &&"
             "cp lib/core/cli.c '%2$s/lib/core/' && cp -r tests/model tests/tokenizer '%2$s/tests/' &&"
             "cp -r examples/letters '%2$s/examples/' && cd '%2$s' && %3$s",
             src_dir(), dir, edit);
    int rc = system(cmd) == 0 ? run_check(dir, out, outlen) : -2;
    if (al_test_rmtree(dir) != 0) rc = -3;
    return rc;
}

TEST(compose_file_is_consistent)
{
    char out[8192];
    REQUIRE(getenv("ARCLIGHT_BIN") != NULL);
    int rc = run_check(src_dir(), out, sizeof out);
    CHECKF(rc == 0, "compose check failed:\n%s", out);
    /* the copy the broken cases start from passes too */
    rc = check_broken_copy("true", out, sizeof out);
    CHECKF(rc == 0, "the copy of the tree fails the check (rc %d):\n%s", rc, out);
}

TEST(a_wrong_advertised_port_is_caught)
{
    char out[8192];
    int rc = check_broken_copy("sed -i 's|HOST://127.0.0.1:9092|HOST://127.0.0.1:9093|' docker-compose.yml",
                               out, sizeof out);
    CHECKF(rc == 1, "broken compose file passed (rc %d):\n%s", rc, out);
    CHECKF(strstr(out, "default bootstrap 127.0.0.1:9092") != NULL, "wrong complaint:\n%s", out);
}

TEST(a_bogus_flag_is_caught)
{
    char out[8192];
    int rc = check_broken_copy("sed -i 's|\"--quiet-flush\"|\"--quiet-flash\"|' docker-compose.yml",
                               out, sizeof out);
    CHECKF(rc == 1, "a bogus flag passed (rc %d):\n%s", rc, out);
    CHECKF(strstr(out, "credit: --quiet-flash is not a flag of `arclight credit`") != NULL,
           "wrong complaint:\n%s", out);
}

TEST(a_health_check_on_another_port_is_caught)
{
    char out[8192];
    int rc = check_broken_copy(
        "sed -i 's|\"rollouts\", \"--metrics\", \"0.0.0.0:9100\"|\"rollouts\", \"--metrics\", "
        "\"0.0.0.0:9101\"|' docker-compose.yml",
        out, sizeof out);
    CHECKF(rc == 1, "a health check on the wrong port passed (rc %d):\n%s", rc, out);
    CHECKF(strstr(out, "rollouts: health check asks /healthz on port 9100; rollouts answers "
                       "/healthz on its --metrics port 9101") != NULL,
           "wrong complaint:\n%s", out);
}

TEST(wiring_that_breaks_the_loop_is_caught)
{
    char out[8192];
    int rc = check_broken_copy("sed -i 's|, \"--resume\"]|]|' docker-compose.yml", out, sizeof out);
    CHECKF(rc == 1 && strstr(out, "train does not --resume"), "rc %d:\n%s", rc, out);
    rc = check_broken_copy("sed -i 's|checkpoints:/var/lib/arclight/checkpoints:ro|"
                           "checkpoints:/var/lib/arclight/ckpt:ro|' docker-compose.yml",
                           out, sizeof out);
    CHECKF(rc == 1 && strstr(out, "serve does not see train's checkpoints"), "rc %d:\n%s", rc, out);
    rc = check_broken_copy("sed -i 's|\"http://serve:8000\"|\"http://serve:8001\"|' docker-compose.yml",
                           out, sizeof out);
    CHECKF(rc == 1 && strstr(out, "proxy: serve:8001: serve listens on [8000]"), "rc %d:\n%s", rc,
           out);
}
