/* t1503: docker-compose.yml's stack, run without Docker against real Apache Kafka. The
 * file's services (all but kafka, which is this file's Kafka node of the same release,
 * tests/kafka_fixture.h) run as local processes with the file's commands, environment,
 * start order and health checks (tests/compose_run.py: ports rewritten to free loopback
 * ports, volumes to directories, /src/arclight to this tree), credit scaled to two workers
 * as `docker compose up --scale credit=2` would. The letters demo must train: the rollout
 * controller's metrics.csv gets rows up to policy version 2 with the trainer's numbers, the
 * trainer's checkpoints and the proxy's spool are on their volumes, and every process
 * stops cleanly. Label `kafka`. */
#include "testlib.h"
#include "support.h"

#include "kafka_fixture.h"

#include <dirent.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>

static const char *src_dir(void)
{
    const char *s = getenv("ARCLIGHT_SOURCE_DIR");
    return s ? s : ".";
}

/* The highest N of DIR/step-N with a model.safetensors; -1 when none. */
static long newest_step(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return -1;
    long best = -1;
    for (struct dirent *e; (e = readdir(d));) {
        char *end, p[1200];
        struct stat st;
        if (strncmp(e->d_name, "step-", 5) != 0) continue;
        long v = strtol(e->d_name + 5, &end, 10);
        snprintf(p, sizeof p, "%s/%s/model.safetensors", dir, e->d_name);
        if (!*end && v > best && stat(p, &st) == 0) best = v;
    }
    closedir(d);
    return best;
}

TEST(the_compose_stack_trains_on_real_kafka)
{
    REQUIREF(al_test_kafka_available(), "no Kafka jars in %s (run scripts/setup.sh)",
             al_test_kafka_libs());
    REQUIRE(getenv("ARCLIGHT_BIN") != NULL);
    al_test_kafka k;
    /* as docker-compose.yml's kafka service: messages up to 16 MiB */
    const char *props[] = {"message.max.bytes=16777216", NULL};
    REQUIRE(al_test_kafka_start(&k, 1, props) == 0);

    char dir[512], cmd[4096], path[1200];
    REQUIRE(al_test_tmpdir(dir, sizeof dir, "t1503"));
    snprintf(cmd, sizeof cmd,
             "/usr/bin/python3 '%s/tests/compose_run.py' --bootstrap '%s' --bin '%s' --dir '%s' "
             "--source '%s' --scale credit=2 --until-version 2 --timeout 420 2>&1",
             src_dir(), k.bootstrap, getenv("ARCLIGHT_BIN"), dir, src_dir());
    FILE *p = popen(cmd, "r");
    REQUIRE(p != NULL);
    char line[2048];
    int ok = 0, healthy = 0;
    while (fgets(line, sizeof line, p)) {
        fputs(line, stdout);
        fflush(stdout);
        if (!strncmp(line, "compose-run: ok:", 16)) ok = 1;
        if (strstr(line, " healthy\n")) healthy++;
    }
    int st = pclose(p);
    CHECKF(WIFEXITED(st) && WEXITSTATUS(st) == 0 && ok, "compose_run.py failed (status 0x%x)", st);
    /* proxy, serve, credit, batch, train: waited for as healthy */
    CHECKF(healthy >= 5, "%d services were seen healthy, want at least 5", healthy);

    long maxv = -1;
    snprintf(path, sizeof path, "%s/volumes/rollouts/metrics.csv", dir);
    int rows = al_test_metrics_trained_rows(path, 1, &maxv);
    CHECKF(rows >= 2 && maxv >= 2, "%s: %d rows with the trainer's numbers, up to v%ld", path,
           rows, maxv);
    snprintf(path, sizeof path, "%s/volumes/rollouts/reward.svg", dir);
    struct stat sb;
    CHECKF(stat(path, &sb) == 0 && sb.st_size > 0, "no %s", path);
    snprintf(path, sizeof path, "%s/volumes/checkpoints", dir);
    CHECKF(newest_step(path) >= 2, "newest checkpoint in %s: %ld", path, newest_step(path));
    snprintf(path, sizeof path, "%s/volumes/spool/LOCK", dir);
    CHECKF(stat(path, &sb) == 0, "the proxy's spool is not on the spool volume (%s)", path);
    snprintf(path, sizeof path, "%s/volumes/models/tiny-sft/model.safetensors", dir);
    CHECKF(stat(path, &sb) == 0, "no warm-started model at %s", path);

    CHECK(al_test_kafka_stop(&k) == 0);
    if (testlib_cur_failed == 0) {
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
        CHECK(system(cmd) == 0);
    } else {
        printf("  logs kept in %s/logs\n", dir);
    }
}
