/* 0002: scripts/setup.sh is idempotent: run twice, both succeed, the second installs nothing. */
#include "testlib.h"

#include <stdlib.h>
#include <sys/wait.h>

static int run_setup(char *out, size_t outlen)
{
    const char *src = getenv("ARCLIGHT_SOURCE_DIR");
    char cmd[4096];
    /* the compose image of this tree is built by t1507 when needed, not compiled here */
    snprintf(cmd, sizeof cmd, "ARCLIGHT_COMPOSE_IMAGE=0 bash '%s/scripts/setup.sh' 2>&1",
             src ? src : ".");
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    size_t n = fread(out, 1, outlen - 1, p);
    out[n] = '\0';
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

TEST(setup_runs_twice_and_the_second_run_installs_nothing)
{
    static char out1[1 << 16], out2[1 << 16];
    int rc1 = run_setup(out1, sizeof out1);
    CHECKF(rc1 == 0, "first run exited %d:\n%s", rc1, out1);
    int rc2 = run_setup(out2, sizeof out2);
    CHECKF(rc2 == 0, "second run exited %d:\n%s", rc2, out2);
    CHECKF(strstr(out2, "Debian packages already installed") != NULL,
           "second run installed packages again:\n%s", out2);
    CHECKF(strstr(out2, "setup: Python packages already in") != NULL,
           "second run installed the Python packages again:\n%s", out2);
    CHECKF(strstr(out2, "setup: ok") != NULL, "second run did not finish:\n%s", out2);
}
