/* t1507: docker-compose.yml run for real with podman-compose: the image of this tree built
 * from the Dockerfile (its layers cached; scripts/setup.sh builds it once), Kafka and every
 * stage in containers, the letters demo cut to 2 policy versions (tests/compose_podman.py
 * brings it up under a project name of its own, waits for the jobs and health checks
 * itself, stops every service and brings the stack down). The loop must train: metrics.csv,
 * copied out of the rollouts volume, has rows up to policy version 2 with the trainer's
 * numbers, and every service exits cleanly. A machine without podman or the local base
 * images (scripts/compose_deps.sh) skips it: exit 77, ctest's SKIP_RETURN_CODE. Label
 * `compose`. */
#include "testlib.h"
#include "support.h"

#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>

static const char *src_dir(void)
{
    const char *s = getenv("ARCLIGHT_SOURCE_DIR");
    return s ? s : ".";
}

TEST(the_compose_stack_runs_in_podman)
{
    char dir[512], cmd[2048], path[1200], line[2048];
    REQUIRE(al_test_tmpdir(dir, sizeof dir, "t1507"));
    snprintf(cmd, sizeof cmd,
             "/usr/bin/python3 '%s/tests/compose_podman.py' --source '%s' --dir '%s' "
             "--project arclight-t1507-%ld --steps 2 --timeout 840 2>&1",
             src_dir(), src_dir(), dir, (long)getpid());
    FILE *p = popen(cmd, "r");
    REQUIRE(p != NULL);
    int ok = 0, skipped = 0, healthy = 0;
    while (fgets(line, sizeof line, p)) {
        fputs(line, stdout);
        fflush(stdout);
        if (!strncmp(line, "compose-podman: ok:", 19)) ok = 1;
        if (!strncmp(line, "compose-podman: SKIP:", 21)) skipped = 1;
        if (strstr(line, " healthy [")) healthy++;
    }
    int st = pclose(p);
    if (skipped && WIFEXITED(st) && WEXITSTATUS(st) == 77) {
        char rm[600];
        snprintf(rm, sizeof rm, "rm -rf '%s'", dir);
        if (system(rm) != 0) fprintf(stderr, "could not remove %s\n", dir);
        exit(77);
    }
    CHECKF(WIFEXITED(st) && WEXITSTATUS(st) == 0 && ok, "compose_podman.py failed (status 0x%x)",
           st);
    /* serve, proxy, credit, batch, train and rollouts passed their health checks */
    CHECKF(healthy >= 6, "%d services were seen healthy, want 6", healthy);

    long maxv = -1;
    snprintf(path, sizeof path, "%s/metrics.csv", dir);
    int rows = al_test_metrics_trained_rows(path, 1, &maxv);
    CHECKF(rows >= 2 && maxv >= 2, "%s: %d rows with the trainer's numbers, up to v%ld", path,
           rows, maxv);
    snprintf(path, sizeof path, "%s/reward.svg", dir);
    struct stat sb;
    CHECKF(stat(path, &sb) == 0 && sb.st_size > 0, "no %s", path);

    if (testlib_cur_failed == 0) {
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
        CHECK(system(cmd) == 0);
    } else {
        printf("  logs kept in %s/logs\n", dir);
    }
}
