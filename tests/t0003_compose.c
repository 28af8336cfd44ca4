/* 0003: docker-compose.yml is consistent (checked by tests/compose_check.py; no Docker
 * engine here), and a broken copy of it is caught. */
#include "testlib.h"

#include <stdlib.h>
#include <sys/wait.h>

static int run_check(const char *root, char *out, size_t outlen)
{
    char cmd[4096];
    const char *src = getenv("ARCLIGHT_SOURCE_DIR");
    snprintf(cmd, sizeof cmd, "ARCLIGHT_SOURCE_DIR='%s' /usr/bin/python3 '%s/tests/compose_check.py' 2>&1",
             root, src ? src : ".");
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    size_t n = fread(out, 1, outlen - 1, p);
    out[n] = '\0';
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

TEST(compose_file_is_consistent)
{
    char out[8192];
    const char *src = getenv("ARCLIGHT_SOURCE_DIR");
    int rc = run_check(src ? src : ".", out, sizeof out);
    CHECKF(rc == 0, "compose check failed:\n%s", out);
}

TEST(a_wrong_advertised_port_is_caught)
{
    const char *src = getenv("ARCLIGHT_SOURCE_DIR");
    char dir[] = "/tmp/arclight-t0003-XXXXXX", cmd[8192], out[8192];
    REQUIRE(mkdtemp(dir));
    snprintf(cmd, sizeof cmd,
             "cp -r '%1$s/docker-compose.yml' '%1$s/Dockerfile' '%1$s/broker-config' '%2$s/' 2>/dev/null;"
             "mkdir -p '%2$s/lib/core' '%2$s/tools' && cp '%1$s/lib/core/cli.c' '%2$s/lib/core/' &&"
             "cp '%1$s/tools/main.c' '%2$s/tools/' &&"
             "sed -i 's|HOST://127.0.0.1:9092|HOST://127.0.0.1:9093|' '%2$s/docker-compose.yml'",
             src ? src : ".", dir);
    REQUIRE(system(cmd) == 0);
    int rc = run_check(dir, out, sizeof out);
    CHECKF(rc == 1, "broken compose file passed (rc %d):\n%s", rc, out);
    CHECKF(strstr(out, "default bootstrap 127.0.0.1:9092") != NULL, "wrong complaint:\n%s", out);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    CHECK(system(cmd) == 0);
}
