/*
 * t1401_rollouts_agents: `arclight rollouts` against agents that misbehave, through a real
 * proxy (tests/fake_upstream.c upstream) and the embedded broker. One shell agent acts on
 * its task's "act": it answers well and prints its reward, posts its reward itself, exits
 * non-zero, hangs (with a grandchild that must die with it), never reports a reward,
 * prints a malformed reward, kills itself in the middle of a streamed call, or fails its
 * first attempt only. Read back from arclight.spans, each rollout must end with the right
 * status and reason, retried attempts say so and run again as attempt 1, val tasks run
 * through the eval route (every span eval=true), and nothing is lost. Then credit runs over
 * the same spans: it trains on no eval call and on no retried attempt.
 */
#define _GNU_SOURCE /* memmem */
#include "broker_fixture.h"
#include "support.h"
#include "testlib.h"
#include "t1099_proxy_helpers.h"

#include <dirent.h>
#include <signal.h>
#include <sys/stat.h>

static const char AGENT[] =
    "#!/bin/sh\n"
    "# a test agent: what it does comes from its task's input\n"
    "act=$(printf '%s' \"$ARCLIGHT_TASK\" | sed -n 's/.*\"act\":\"\\([a-z_]*\\)\".*/\\1/p')\n"
    "call() {\n"
    "  curl -s -o /dev/null -w '%{http_code}' -H 'Content-Type: application/json' \\\n"
    "    -d \"{\\\"model\\\":\\\"$1\\\",\\\"messages\\\":[{\\\"role\\\":\\\"user\\\",\\\"content\\\":\\\"hi\\\"}]$2}\" \\\n"
    "    \"$OPENAI_BASE_URL/chat/completions\"\n"
    "}\n"
    "case \"$act\" in\n"
    "ok) [ \"$(call fake-model)\" = 200 ] || exit 9; echo 'some output'; echo '{\"reward\": 1}' ;;\n"
    "ok_post) call fake-model >/dev/null; curl -s -o /dev/null -d '{\"value\": 0.5}' "
    "-H 'Content-Type: application/json' \"$ARCLIGHT_REWARD_URL\"; echo done ;;\n"
    "fail) call fake-model >/dev/null; echo 'agent: giving up' >&2; exit 3 ;;\n"
    "hang) call fake-model >/dev/null; sleep 300 & echo $! > \"$T1401_DIR/hang-$ARCLIGHT_ROLLOUT_ID-$ARCLIGHT_ATTEMPT.pid\"; wait ;;\n"
    "noreward) call fake-model >/dev/null; echo 'no reward here' ;;\n"
    "garbage) call fake-model >/dev/null; echo '{\"reward\": \"lots\"}' ;;\n"
    "crash) call slow-stream ',\"stream\":true' >/dev/null & sleep 0.3; kill -9 $$ ;;\n"
    "flaky) call fake-model >/dev/null; [ \"$ARCLIGHT_ATTEMPT\" -ge 1 ] || exit 4; echo '{\"reward\": 0.25}' ;;\n"
    "*) echo \"unknown act '$act'\" >&2; exit 5 ;;\n"
    "esac\n";

/* The spans of the test's rollouts, decoded. */
typedef struct span_set {
    al_span *s;
    size_t n;
} span_set;

static int read_spans(const char *bootstrap, size_t want_ends, span_set *out)
{
    px_read_spans(bootstrap, want_ends, 60, &out->s, &out->n);
    return 0;
}

/* What the spans of one task (by task id) say, over all its rollouts and attempts. */
typedef struct task_view {
    int calls, rewards, ends, eval_spans, spans;
    int ends_by_status[5];
    int retried_ends, attempts_max;
    double reward_sum;
    char reason[512];
} task_view;

static task_view view(const span_set *ss, const char *task)
{
    task_view v;
    memset(&v, 0, sizeof v);
    for (size_t i = 0; i < ss->n; i++) {
        const al_span *s = &ss->s[i];
        if (strcmp(s->task_id, task)) continue;
        v.spans++;
        v.eval_spans += s->eval;
        if (s->attempt > v.attempts_max) v.attempts_max = s->attempt;
        if (s->kind == AL_SPAN_KIND_LLM_CALL) v.calls++;
        if (s->kind == AL_SPAN_KIND_REWARD) {
            v.rewards++;
            v.reward_sum += s->reward.value;
        }
        if (s->kind == AL_SPAN_KIND_ROLLOUT_END) {
            v.ends++;
            v.ends_by_status[s->rollout_end.status]++;
            v.retried_ends += s->rollout_end.retried;
            if (s->rollout_end.reason)
                snprintf(v.reason, sizeof v.reason, "%s", s->rollout_end.reason);
        }
    }
    return v;
}

TEST(misbehaving_agents_each_end_with_the_right_status)
{
    char dir[PATH_MAX], path[2 * PATH_MAX], log[PATH_MAX + 64], spool[PATH_MAX + 64];
    al_test_tmpdir(dir, sizeof dir, "proxy");
    REQUIRE(dir[0]);
    al_test_broker b;
    REQUIRE(al_test_broker_start(&b, NULL) == 0);
    fake_upstream *up = fake_upstream_start(0, 2);
    REQUIRE(up);
    char upurl[128];
    snprintf(upurl, sizeof upurl, "http://127.0.0.1:%d", fake_upstream_port(up));
    snprintf(spool, sizeof spool, "%s/spool", dir);
    snprintf(log, sizeof log, "%s/proxy.log", dir);
    const char *pargs[] = {"--listen",      "127.0.0.1:0", "--upstream", upurl,
                           "--upstream-kind", "vllm",      "--spool-dir", spool,
                           "--bootstrap",   b.bootstrap,   NULL};
    px_child px;
    REQUIRE(px_start(&px, log, pargs, NULL) == 0);

    /* the dataset: two rollouts per training task, one val task */
    snprintf(path, sizeof path, "%s/tasks.jsonl", dir);
    FILE *f = fopen(path, "w");
    REQUIRE(f);
    const char *acts[] = {"ok", "ok_post", "fail", "hang", "noreward", "garbage", "crash", "flaky"};
    for (size_t i = 0; i < sizeof acts / sizeof acts[0]; i++)
        fprintf(f, "{\"id\": \"t-%s\", \"input\": {\"act\":\"%s\"}, \"split\": \"train\"}\n", acts[i],
                acts[i]);
    fprintf(f, "{\"id\": \"v-ok\", \"input\": {\"act\":\"ok\"}, \"split\": \"val\"}\n");
    fclose(f);
    char agent[PATH_MAX + 64];
    snprintf(agent, sizeof agent, "%s/agent.sh", dir);
    f = fopen(agent, "w");
    REQUIRE(f);
    fputs(AGENT, f);
    fclose(f);
    chmod(agent, 0755);

    char envdir[PATH_MAX + 16];
    snprintf(envdir, sizeof envdir, "T1401_DIR=%s", dir);
    putenv(envdir);
    char work[PATH_MAX + 64], rlog[PATH_MAX + 64], cmd[8 * PATH_MAX];
    snprintf(work, sizeof work, "%s/work", dir);
    snprintf(rlog, sizeof rlog, "%s/rollouts.log", dir);
    /* no trainer here: staleness wide enough for every group to start at version 0 */
    snprintf(cmd, sizeof cmd,
             "'%s' rollouts --tasks '%s' --agent '%s' --proxy '%s' --bootstrap '%s' --model "
             "fake-model --group-size 2 --step-groups 1 --max-staleness 100 --rollout-timeout 8 "
             "--max-attempts 2 --epochs 1 --eval-every 0 --workdir '%s' 2> '%s'",
             al_test_bin(), path, agent, px.base, b.bootstrap, work, rlog);
    double t0 = testlib_now();
    int st = system(cmd);
    double took = testlib_now() - t0;
    char *rl = al_test_slurp(rlog, NULL);
    CHECKF(WIFEXITED(st) && WEXITSTATUS(st) == 0, "rollouts exit %d after %.1f s:\n%s", st, took,
           rl ? rl : "");
    CHECKF(took < 60, "the run took %.1f s", took);

    /* 8 training tasks x 2 rollouts, retried attempts (fail, hang, garbage, crash, flaky:
     * 2 each) and one val rollout: 16 + 10 + 1 end spans */
    span_set ss;
    read_spans(b.bootstrap, 27, &ss);

    task_view v = view(&ss, "t-ok");
    CHECKF(v.ends == 2 && v.ends_by_status[AL_ROLLOUT_STATUS_SUCCEEDED] == 2 && v.rewards == 2 &&
               v.reward_sum == 2.0 && v.calls == 2 && v.retried_ends == 0 && v.eval_spans == 0,
           "t-ok: %d ends, %d rewards (sum %g), %d calls", v.ends, v.rewards, v.reward_sum, v.calls);
    v = view(&ss, "t-ok_post");
    CHECKF(v.ends_by_status[AL_ROLLOUT_STATUS_SUCCEEDED] == 2 && v.rewards == 2 &&
               v.reward_sum == 1.0,
           "t-ok_post: %d succeeded, %d rewards (sum %g)", v.ends_by_status[0], v.rewards,
           v.reward_sum);
    v = view(&ss, "t-fail");
    CHECKF(v.ends == 4 && v.ends_by_status[AL_ROLLOUT_STATUS_FAILED] == 4 && v.retried_ends == 2 &&
               v.attempts_max == 1 && strstr(v.reason, "exit status 3") &&
               strstr(v.reason, "giving up"),
           "t-fail: %d ends (%d failed, %d retried), attempts to %d, reason '%s'", v.ends,
           v.ends_by_status[AL_ROLLOUT_STATUS_FAILED], v.retried_ends, v.attempts_max, v.reason);
    v = view(&ss, "t-hang");
    CHECKF(v.ends == 4 && v.ends_by_status[AL_ROLLOUT_STATUS_TIMEOUT] == 4 && v.retried_ends == 2 &&
               strstr(v.reason, "process group was killed"),
           "t-hang: %d ends (%d timeout), reason '%s'", v.ends,
           v.ends_by_status[AL_ROLLOUT_STATUS_TIMEOUT], v.reason);
    v = view(&ss, "t-noreward");
    CHECKF(v.ends_by_status[AL_ROLLOUT_STATUS_SUCCEEDED] == 2 && v.rewards == 0,
           "t-noreward: %d succeeded, %d rewards", v.ends_by_status[0], v.rewards);
    v = view(&ss, "t-garbage");
    CHECKF(v.ends_by_status[AL_ROLLOUT_STATUS_FAILED] == 4 && v.rewards == 0 &&
               strstr(v.reason, "not a finite number"),
           "t-garbage: %d failed, %d rewards, reason '%s'", v.ends_by_status[1], v.rewards,
           v.reason);
    v = view(&ss, "t-crash");
    CHECKF(v.ends_by_status[AL_ROLLOUT_STATUS_FAILED] == 4 && strstr(v.reason, "signal 9"),
           "t-crash: %d failed, reason '%s'", v.ends_by_status[1], v.reason);
    v = view(&ss, "t-flaky");
    CHECKF(v.ends == 4 && v.ends_by_status[AL_ROLLOUT_STATUS_FAILED] == 2 &&
               v.ends_by_status[AL_ROLLOUT_STATUS_SUCCEEDED] == 2 && v.retried_ends == 2 &&
               v.rewards == 2 && v.reward_sum == 0.5,
           "t-flaky: %d ends (%d failed, %d succeeded, %d retried), rewards %d", v.ends,
           v.ends_by_status[1], v.ends_by_status[0], v.retried_ends, v.rewards);
    v = view(&ss, "v-ok");
    CHECKF(v.ends == 1 && v.eval_spans == v.spans && v.spans >= 3 && v.rewards == 1,
           "v-ok: %d ends, %d of %d spans eval", v.ends, v.eval_spans, v.spans);

    /* the hanging agent's grandchild died with its process group */
    DIR *d = opendir(dir);
    int pids = 0;
    for (struct dirent *e; d && (e = readdir(d));) {
        if (strncmp(e->d_name, "hang-", 5)) continue;
        char p[PATH_MAX + 300];
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        FILE *pf = fopen(p, "r");
        int pid = 0;
        if (pf && fscanf(pf, "%d", &pid) == 1) {
            pids++;
            CHECKF(kill(pid, 0) != 0, "the hanging agent's child %d still runs", pid);
        }
        if (pf) fclose(pf);
    }
    if (d) closedir(d);
    CHECKF(pids == 4, "%d hang pid files", pids);

    /* the controller's own account, and its files */
    CHECKF(rl && strstr(rl, "done at policy v0"), "no summary line:\n%s", rl ? rl : "");
    snprintf(path, sizeof path, "%s/metrics.csv", work);
    CHECK(access(path, R_OK) == 0);
    snprintf(path, sizeof path, "%s/reward.svg", work);
    CHECK(access(path, R_OK) == 0);

    /* credit over the same spans: no transition from the eval task, none from a retried
     * attempt (t-flaky trains its attempt-1 calls only), none from failed groups */
    const char *cargs[] = {al_test_bin(),  "credit", "--bootstrap", b.bootstrap, "--group-size",
                           "2",           "--idle-timeout", "5", "--quiet-flush", "1",
                           "--log-level", "warn", NULL};
    pid_t cp = al_test_spawn(cargs, NULL, 1);
    REQUIRE(cp > 0);
    al_test_msgs tm;
    /* t-ok, t-ok_post, t-noreward (2 calls each) and t-flaky's two attempt-1 calls */
    al_test_topic_read(b.bootstrap, "arclight.transitions", NULL, 8, 60000, &tm);
    kill(cp, SIGTERM);
    CHECK(al_test_wait(cp, 30) == 0);
    size_t from_eval = 0, from_retried = 0, from_failed = 0;
    char err[256];
    for (size_t i = 0; i < tm.n; i++) {
        al_transition t = {0};
        if (al_transition_decode(tm.val[i], tm.len[i], &t, err, sizeof err) != 0) continue;
        if (!strcmp(t.task_id, "v-ok")) from_eval++;
        if (!strcmp(t.task_id, "t-flaky") && t.attempt == 0) from_retried++;
        if (!strcmp(t.task_id, "t-fail") || !strcmp(t.task_id, "t-garbage") ||
            !strcmp(t.task_id, "t-crash") || !strcmp(t.task_id, "t-hang"))
            from_failed++;
        al_transition_clear(&t);
    }
    CHECKF(tm.n == 8, "%zu transitions, expected 8", tm.n);
    CHECK(from_eval == 0);
    CHECK(from_retried == 0);
    CHECK(from_failed == 0);
    al_test_msgs_free(&tm);

    for (size_t i = 0; i < ss.n; i++)
        al_span_clear(&ss.s[i]);
    free(ss.s);
    free(rl);
    px_stop(&px, SIGTERM, 10);
    fake_upstream_stop(up);
    al_test_broker_stop(&b);
    if (!testlib_cur_failed && al_test_rmtree(dir) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
}
