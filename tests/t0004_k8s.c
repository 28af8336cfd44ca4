/* 0004: deploy/k8s is consistent with the arclight binary and the repository (checked by
 * tests/k8s_check.py, which runs $ARCLIGHT_BIN CMD --help; no cluster here), and broken
 * copies of it are caught: a bogus flag, a second batch replica, a probe on the wrong port,
 * rollout controllers whose shards do not match their replicas or batch's step. */
#include "testlib.h"
#include "support.h"

#include <stdlib.h>
#include <sys/wait.h>

static const char *src_dir(void)
{
    const char *src = getenv("ARCLIGHT_SOURCE_DIR");
    return src ? src : ".";
}

/* Runs the checker on the tree at root; its exit status (-1 if it did not run) and its
 * output in out. */
static int run_check(const char *root, char *out, size_t outlen)
{
    char cmd[4096];
    snprintf(cmd, sizeof cmd,
             "ARCLIGHT_SOURCE_DIR='%s' /usr/bin/python3 '%s/tests/k8s_check.py' 2>&1", root,
             src_dir());
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    size_t n = fread(out, 1, outlen - 1, p);
    out[n] = '\0';
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* Copies what the checker reads into a fresh directory, applies `edit` (a shell command run
 * there), checks it; the checker's exit status, its output in out. */
static int check_broken_copy(const char *edit, char *out, size_t outlen)
{
    char dir[512], cmd[8192];
    if (!al_test_tmpdir(dir, sizeof dir, "t0004")) return -1;
    snprintf(cmd, sizeof cmd,
             "cp -r '%1$s/deploy' '%1$s/broker-config' '%2$s/' && mkdir -p '%2$s/tools' '%2$s/examples' &&"
             "cp '%1$s/tools/main.c' '%2$s/tools/' && cp -r '%1$s/examples/letters' '%2$s/examples/' &&"
             "cd '%2$s' && %3$s",
             src_dir(), dir, edit);
    int rc = system(cmd) == 0 ? run_check(dir, out, outlen) : -2;
    if (al_test_rmtree(dir) != 0) rc = -3;
    return rc;
}

TEST(manifests_are_consistent)
{
    char out[16384];
    REQUIRE(getenv("ARCLIGHT_BIN") != NULL);
    int rc = run_check(src_dir(), out, sizeof out);
    CHECKF(rc == 0, "k8s check failed (rc %d):\n%s", rc, out);
    CHECKF(strstr(out, "8 workloads") != NULL, "not every workload was checked:\n%s", out);
    /* the copy the broken cases start from passes too */
    rc = check_broken_copy("true", out, sizeof out);
    CHECKF(rc == 0, "the copy of the tree fails the check (rc %d):\n%s", rc, out);
}

TEST(rollout_shards_that_do_not_match_the_replicas_are_caught)
{
    char out[16384];
    int rc = check_broken_copy("sed -i 's|replicas: 2$|replicas: 3|' deploy/k8s/rollouts.yaml", out,
                               sizeof out);
    CHECKF(rc == 1, "3 replicas with --shard i/2 passed (rc %d):\n%s", rc, out);
    CHECKF(strstr(out, "--shard .../2 but 3 replicas") != NULL, "wrong complaint:\n%s", out);
    rc = check_broken_copy("sed -i 's|\"2\"$|\"3\"|' deploy/k8s/rollouts.yaml", out, sizeof out);
    CHECKF(rc == 1, "shards of 3 groups a step against batch's 4 passed (rc %d):\n%s", rc, out);
    CHECKF(strstr(out, "shards x --step-groups = 6 groups per step") != NULL, "wrong complaint:\n%s",
           out);
}

TEST(a_bogus_flag_is_caught)
{
    char out[16384];
    int rc = check_broken_copy("sed -i 's|- --estimator$|- --estimater|' deploy/k8s/credit.yaml",
                               out, sizeof out);
    CHECKF(rc == 1, "a bogus flag passed (rc %d):\n%s", rc, out);
    CHECKF(strstr(out, "--estimater is not a flag of `arclight credit`") != NULL,
           "wrong complaint:\n%s", out);
}

TEST(a_second_batch_replica_is_caught)
{
    char out[16384];
    int rc = check_broken_copy("sed -i 's|replicas: 1$|replicas: 2|' deploy/k8s/batch.yaml", out,
                               sizeof out);
    CHECKF(rc == 1, "two batch replicas passed (rc %d):\n%s", rc, out);
    CHECKF(strstr(out, "batch must run exactly 1 replica") != NULL, "wrong complaint:\n%s", out);
}

TEST(a_probe_on_another_port_is_caught)
{
    char out[16384];
    int rc = check_broken_copy("sed -i 's|- 0.0.0.0:9100$|- 0.0.0.0:9200|' deploy/k8s/credit.yaml",
                               out, sizeof out);
    CHECKF(rc == 1, "a probe on the wrong port passed (rc %d):\n%s", rc, out);
    CHECKF(strstr(out, "answers /healthz on its --metrics port 9200") != NULL,
           "wrong complaint:\n%s", out);
}

TEST(an_unknown_field_is_caught)
{
    char out[16384];
    int rc = check_broken_copy(
        "sed -i 's|setHostnameAsFQDN:|setHostnameAsFqdn:|' deploy/k8s/train.yaml", out, sizeof out);
    if (strstr(out, "python3-kubernetes is not installed")) {
        printf("  skipped: python3-kubernetes is not installed (scripts/setup.sh installs it)\n");
        return;
    }
    CHECKF(rc == 1, "an unknown field passed (rc %d):\n%s", rc, out);
    CHECKF(strstr(out, "unknown field 'setHostnameAsFqdn' (V1PodSpec)") != NULL,
           "wrong complaint:\n%s", out);
}
