/*
 * t1400_rollouts_logic: the rollout controller's pure parts (stages/rollouts): the task
 * dataset (format, errors, splits, shards), pacing on the trainer, the agent's reward line,
 * the rollout URLs, and the report files (metrics.csv, reward.svg).
 */
#include "rollouts/controller.h"
#include "rollouts/report.h"
#include "rollouts/tasks.h"
#include "testlib.h"
#include "support.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char err[1024];

static int parse(const char *text, double ratio, int shard, int nshards, rl_tasks *out)
{
    rl_tasks_opts o = {ratio, shard, nshards};
    return rl_tasks_parse(text, strlen(text), "tasks.jsonl", &o, out, err, sizeof err);
}

TEST(dataset_records_and_splits)
{
    rl_tasks ts;
    const char *text = "# a comment\n"
                       "{\"id\": \"q1\", \"input\": {\"question\": \"2+2?\"}, \"split\": \"train\"}\n"
                       "\n"
                       "{\"id\": 17, \"input\": [1, 2], \"split\": \"val\", \"extra\": true}\r\n"
                       "{\"id\": \"what is this?\", \"input\": \"text\", \"split\": \"validation\"}\n";
    REQUIREF(parse(text, 0.5, 0, 1, &ts) == 0, "%s", err);
    REQUIRE(ts.n == 3);
    CHECK_EQ_STR(ts.t[0].id, "q1");
    CHECK_EQ_STR(ts.t[0].key, "q1");
    CHECK(ts.t[0].split == RL_SPLIT_TRAIN);
    CHECK_EQ_INT(ts.t[0].line, 2);
    CHECK_EQ_STR(ts.t[1].id, "17");
    CHECK(ts.t[1].split == RL_SPLIT_VAL);
    /* the whole record goes to the agent, extra members included */
    CHECK(strstr(ts.t[1].record, "\"extra\":true"));
    CHECK(strstr(ts.t[1].record, "\"input\":[1,2]"));
    /* an id with characters a URL path segment cannot carry gets a safe key */
    CHECK(ts.t[2].split == RL_SPLIT_VAL);
    CHECK(!strcmp(ts.t[2].id, "what is this?"));
    CHECKF(!strncmp(ts.t[2].key, "what_is_this_-", 14) && strlen(ts.t[2].key) == 14 + 12,
           "key %s", ts.t[2].key);
    rl_tasks_free(&ts);
}

TEST(dataset_errors_name_the_line)
{
    static const struct {
        const char *text, *want;
    } cases[] = {
        {"{\"id\": \"a\", \"input\": 1}\n[1, 2]\n", "tasks.jsonl:2: a task is a JSON object"},
        {"{\"input\": 1}\n", "tasks.jsonl:1: 'id' is missing"},
        {"{\"id\": \"a\"}\n", "tasks.jsonl:1: task a has no 'input'"},
        {"{\"id\": 1.5, \"input\": 1}\n", "'id' must be a string or an integer"},
        {"{\"id\": \"a\", \"input\": 1, \"split\": \"test\"}\n", "it must be \"train\" or \"val\""},
        {"{\"id\": \"a\", \"input\": 1}\n{\"id\": \"a\", \"input\": 2}\n",
         "tasks.jsonl:2: task id 'a' is already used on line 1"},
        {"{\"id\": \"a\", \"input\": 1, \"input\": 2}\n", "tasks.jsonl:1: not a JSON object"},
        {"{\"id\": \"a\", \"input\": 1\n", "tasks.jsonl:1: not a JSON object"},
        {"\n# nothing\n", "no tasks in the file"},
        {"{\"id\": \"\", \"input\": 1}\n", "'id' must be 1-1024 bytes"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        rl_tasks ts;
        int rc = parse(cases[i].text, 0, 0, 1, &ts);
        CHECKF(rc == -1 && strstr(err, cases[i].want), "case %zu: rc %d, error '%s'", i, rc, err);
    }
    rl_tasks_opts o = {0, 0, 1};
    rl_tasks ts;
    CHECK(rl_tasks_load("/nonexistent/tasks.jsonl", &o, &ts, err, sizeof err) == -1);
    CHECK(strstr(err, "/nonexistent/tasks.jsonl"));
}

/* Without split fields, --split-ratio decides by the id alone: the same ids split the same
 * way whatever their order, and the share is close to the ratio. */
TEST(split_ratio_is_deterministic_and_about_right)
{
    size_t n = 2000, cap = n * 48 + 1;
    char *a = malloc(cap), *b = malloc(cap);
    size_t la = 0, lb = 0;
    for (size_t i = 0; i < n; i++)
        la += (size_t)snprintf(a + la, cap - la, "{\"id\": \"task-%zu\", \"input\": %zu}\n", i, i);
    for (size_t i = n; i-- > 0;)
        lb += (size_t)snprintf(b + lb, cap - lb, "{\"id\": \"task-%zu\", \"input\": %zu}\n", i, i);
    rl_tasks x, y;
    REQUIRE(parse(a, 0.2, 0, 1, &x) == 0 && parse(b, 0.2, 0, 1, &y) == 0);
    size_t val = 0, same = 0;
    for (size_t i = 0; i < n; i++) {
        val += x.t[i].split == RL_SPLIT_VAL;
        const rl_task *o = &y.t[n - 1 - i];
        same += !strcmp(o->id, x.t[i].id) && o->split == x.t[i].split;
    }
    CHECK_EQ_INT(same, n);
    CHECKF(val > 340 && val < 460, "%zu of %zu in val for ratio 0.2", val, n);
    rl_tasks_free(&x);
    rl_tasks_free(&y);
    free(a);
    free(b);
}

/* N shards together hold every task exactly once. */
TEST(shards_cover_the_dataset_exactly_once)
{
    size_t n = 997, cap = n * 48 + 1;
    char *a = malloc(cap);
    size_t la = 0;
    for (size_t i = 0; i < n; i++)
        la += (size_t)snprintf(a + la, cap - la, "{\"id\": \"t%zu\", \"input\": null}\n", i);
    int *seen = calloc(n, sizeof *seen);
    for (int nsh = 1; nsh <= 7; nsh += 3) {
        memset(seen, 0, n * sizeof *seen);
        size_t total = 0;
        for (int s = 0; s < nsh; s++) {
            rl_tasks ts;
            REQUIREF(parse(a, 0.1, s, nsh, &ts) == 0, "%s", err);
            for (size_t i = 0; i < ts.n; i++)
                seen[atoi(ts.t[i].id + 1)]++;
            total += ts.n;
            if (nsh > 1) CHECKF(ts.n > n / nsh / 2, "shard %d of %d holds %zu", s, nsh, ts.n);
            rl_tasks_free(&ts);
        }
        CHECK_EQ_INT(total, n);
        for (size_t i = 0; i < n; i++)
            CHECKF(seen[i] == 1, "task t%zu in %d shards of %d", i, seen[i], nsh);
    }
    int i, k;
    CHECK(rl_parse_shard("2/5", &i, &k) == 0 && i == 2 && k == 5);
    CHECK(rl_parse_shard("5/5", &i, &k) == -1);
    CHECK(rl_parse_shard("-1/5", &i, &k) == -1);
    CHECK(rl_parse_shard("1/0", &i, &k) == -1);
    CHECK(rl_parse_shard("1", &i, &k) == -1);
    CHECK(rl_parse_shard("1/2x", &i, &k) == -1);
    free(seen);
    free(a);
}

TEST(shuffle_is_a_permutation_per_epoch)
{
    size_t idx[50], idx2[50];
    int seen[50] = {0};
    rl_shuffle(idx, 50, 7, 3);
    for (int i = 0; i < 50; i++)
        seen[idx[i]]++;
    for (int i = 0; i < 50; i++)
        CHECK(seen[i] == 1);
    rl_shuffle(idx2, 50, 7, 3);
    CHECK(!memcmp(idx, idx2, sizeof idx));
    rl_shuffle(idx2, 50, 7, 4);
    CHECK(memcmp(idx, idx2, sizeof idx) != 0);
}

/* Pacing: with staleness 0 the controller starts one step's groups, then waits for the
 * version those groups update to. */
TEST(pacing_follows_the_trainer)
{
    /* trainer at v0 (start), 4 groups per step */
    CHECK(rl_pace_may_start(0, 0, 0, 4, 3, 0));
    CHECK(!rl_pace_may_start(0, 0, 0, 4, 4, 0));
    CHECK(rl_pace_may_start(1, 0, 0, 4, 4, 0)); /* v1 published: the next step's groups */
    CHECK(!rl_pace_may_start(1, 0, 0, 4, 8, 0));
    /* staleness 2: up to three steps ahead */
    CHECK(rl_pace_may_start(0, 0, 2, 4, 11, 0));
    CHECK(!rl_pace_may_start(0, 0, 2, 4, 12, 0));
    /* a lost group (all its rollouts failed) does not count */
    CHECK(rl_pace_may_start(0, 0, 0, 4, 4, 1));
    /* a controller started when the trainer was at v50 paces from there */
    CHECK(rl_pace_may_start(50, 50, 0, 4, 3, 0));
    CHECK(!rl_pace_may_start(50, 50, 0, 4, 4, 0));
}

TEST(reward_lines)
{
    double r = 0;
    char body[256];
    CHECK(rl_parse_reward_line("{\"reward\": 0.75}", &r, body, sizeof body, err, sizeof err) == 1);
    CHECK(r == 0.75);
    CHECK(!strcmp(body, "{\"value\":0.75}"));
    CHECK(rl_parse_reward_line("  {\"reward\": -1, \"rewards\": {\"tests\": 3}}", &r, body,
                               sizeof body, err, sizeof err) == 1);
    CHECK(r == -1 && strstr(body, "\"rewards\":{\"tests\":3}"));
    /* not reward lines: the agent printed something else last */
    CHECK(rl_parse_reward_line("done", &r, body, sizeof body, err, sizeof err) == 0);
    CHECK(rl_parse_reward_line("{\"status\": \"ok\"}", &r, body, sizeof body, err, sizeof err) == 0);
    CHECK(rl_parse_reward_line("{not json", &r, body, sizeof body, err, sizeof err) == 0);
    /* malformed reward lines: the rollout fails with the reason */
    CHECK(rl_parse_reward_line("{\"reward\": \"high\"}", &r, body, sizeof body, err, sizeof err) ==
          -1);
    CHECK(strstr(err, "not a finite number"));
    CHECK(rl_parse_reward_line("{\"reward\": 1e300}", &r, body, sizeof body, err, sizeof err) == -1);
    CHECK(rl_parse_reward_line("{\"reward\": 1, \"rewards\": [1]}", &r, body, sizeof body, err,
                               sizeof err) == -1);
    CHECK(rl_parse_reward_line("{\"reward\": 1, \"rewards\": {\"a\": null}}", &r, body,
                               sizeof body, err, sizeof err) == -1);
    CHECK(rl_parse_reward_line("{\"reward\": 1,", &r, body, sizeof body, err, sizeof err) == -1);
}

TEST(rollout_urls)
{
    char u[512];
    rl_rollout_base(u, sizeof u, "http://p:8080", 0, 0, "t1", "r1", 0);
    CHECK_EQ_STR(u, "http://p:8080/r/t1/r1");
    rl_rollout_base(u, sizeof u, "http://p:8080", 0, 0, "t1", "r1", 2);
    CHECK_EQ_STR(u, "http://p:8080/r/t1/r1/2");
    rl_rollout_base(u, sizeof u, "http://p:8080", 1, 0, "t1", "r1", 0);
    CHECK_EQ_STR(u, "http://p:8080/e/t1/r1");
    rl_rollout_base(u, sizeof u, "http://p:8080", 1, 0.7, "t1", "r1", 1);
    CHECK_EQ_STR(u, "http://p:8080/e:0.7/t1/r1/1");
}

TEST(report_rows_csv_and_svg)
{
    rl_report r = {0};
    rl_report_row(&r, 3)->time_s = 30;
    rl_report_row(&r, 1)->time_s = 10;
    rl_version_row *w = rl_report_row(&r, 2);
    w->time_s = 20;
    w->have_train_metrics = 1;
    w->loss = -0.5;
    w->tokens_per_s = 1234.5;
    rl_report_add_train(&r, 2, 0.25);
    rl_report_add_train(&r, 2, 0.75);
    rl_report_add_val(&r, 2, 0.5);
    rl_report_add_val(&r, 3, 1.0);
    REQUIRE(r.n == 3);
    CHECK(r.rows[0].version == 1 && r.rows[1].version == 2 && r.rows[2].version == 3);
    const rl_version_row *f = rl_report_find(&r, 2);
    REQUIRE(f);
    CHECK(fabs(rl_row_train_mean(f) - 0.5) < 1e-12);
    CHECK(fabs(rl_row_train_std(f) - 0.25) < 1e-12);
    char *csv = rl_report_csv(&r);
    REQUIRE(csv);
    CHECKF(!strncmp(csv, "version,time_s,rollouts,train_reward_mean,train_reward_std,val_reward,"
                         "val_rollouts,tokens_per_s,loss,kl,entropy,clip_frac\n1,10.000,0,,,,0,,,,,\n"
                         "2,20.000,2,0.500000,0.250000,0.500000,1,1234.5,-0.5,0,0,0\n"
                         "3,30.000,0,,,1.000000,1,,,,,\n",
                    400),
           "csv:\n%s", csv);
    free(csv);
    char *svg = rl_report_svg(&r, "a <title> & more");
    REQUIRE(svg);
    CHECK(!strncmp(svg, "<svg xmlns=\"http://www.w3.org/2000/svg\"", 39));
    CHECK(strstr(svg, "a &lt;title&gt; &amp; more"));
    CHECK(strstr(svg, "<polyline"));
    CHECK(strstr(svg, "policy version"));
    CHECK(strstr(svg, "</svg>"));
    /* the legend: the train entry's text (about 7 px a character at 12 px) ends before the
     * val entry's line starts */
    const char *tr = strstr(svg, ">train (mean"), *va = strstr(svg, ">val (held-out");
    REQUIRE(tr && va);
    const char *tx = tr, *vl = va;
    while (tx > svg && strncmp(tx, "<text x=\"", 9)) tx--;
    while (vl > svg && strncmp(vl, "<line x1=\"", 10)) vl--;
    double train_x = atof(tx + 9), val_x = atof(vl + 10);
    size_t train_chars = strcspn(tr + 1, "<");
    CHECKF(train_x + 7.0 * (double)train_chars < val_x,
           "the train legend (x %.0f, %zu characters) runs into the val legend at x %.0f",
           train_x, train_chars, val_x);
    free(svg);
    char dir[512];
    REQUIRE(al_test_tmpdir(dir, sizeof dir, "t1400"));
    REQUIREF(rl_report_write(&r, dir, "t", err, sizeof err) == 0, "%s", err);
    char p[600];
    snprintf(p, sizeof p, "%s/metrics.csv", dir);
    CHECK(access(p, R_OK) == 0);
    unlink(p);
    snprintf(p, sizeof p, "%s/reward.svg", dir);
    CHECK(access(p, R_OK) == 0);
    unlink(p);
    rmdir(dir);
    rl_report_free(&r);
}

