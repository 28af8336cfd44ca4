/* 0400: lib/http metrics registry — Prometheus text format, escaping, thread safety. */
#include "testlib.h"

#include "http/metrics.h"

#include <pthread.h>

TEST(counter_gauge_render_with_help_type_and_labels)
{
    al_metrics *m = al_metrics_new();
    REQUIRE(m);
    al_counter *c = al_metrics_counter(m, "arclight_msgs_total", "Messages seen.", "topic",
                                       "arclight.spans", "partition", "0", NULL);
    al_gauge *g = al_metrics_gauge(m, "arclight_lag", "Consumer lag.", NULL);
    REQUIRE(c && g);
    al_counter_inc(c);
    al_counter_add(c, 2);
    al_counter_add(c, -5); /* ignored: counters only go up */
    al_gauge_set(g, 1.5);
    al_gauge_add(g, -3);
    CHECK_NEAR(al_counter_value(c), 3, 0);
    CHECK_NEAR(al_gauge_value(g), -1.5, 0);
    size_t len = 0;
    char *text = al_metrics_render(m, &len);
    REQUIRE(text);
    CHECK_EQ_INT(len, strlen(text));
    CHECK_EQ_STR(text, "# HELP arclight_msgs_total Messages seen.\n"
                       "# TYPE arclight_msgs_total counter\n"
                       "arclight_msgs_total{topic=\"arclight.spans\",partition=\"0\"} 3\n"
                       "# HELP arclight_lag Consumer lag.\n"
                       "# TYPE arclight_lag gauge\n"
                       "arclight_lag -1.5\n");
    free(text);
    al_metrics_free(m);
}

TEST(same_name_and_labels_give_the_same_series)
{
    al_metrics *m = al_metrics_new();
    al_counter *a = al_metrics_counter(m, "x_total", "h", "k", "v", NULL);
    al_counter *b = al_metrics_counter(m, "x_total", "other help", "k", "v", NULL);
    al_counter *c = al_metrics_counter(m, "x_total", "h", "k", "w", NULL);
    CHECK(a && a == b);
    CHECK(c && c != a);
    al_counter_inc(a);
    al_counter_inc(b);
    al_counter_inc(c);
    char *text = al_metrics_render(m, NULL);
    REQUIRE(text);
    CHECK(strstr(text, "x_total{k=\"v\"} 2\nx_total{k=\"w\"} 1\n") != NULL);
    /* one HELP/TYPE pair for the family, with the first help */
    CHECK(strstr(text, "# HELP x_total h\n") != NULL);
    CHECK(strstr(strstr(text, "# TYPE") + 1, "# TYPE") == NULL);
    free(text);
    al_metrics_free(m);
}

TEST(help_and_label_values_are_escaped)
{
    al_metrics *m = al_metrics_new();
    al_gauge *g = al_metrics_gauge(m, "esc", "line one\nback\\slash \"quoted\"", "path",
                                   "C:\\dir\n\"x\"", NULL);
    REQUIRE(g);
    char *text = al_metrics_render(m, NULL);
    REQUIRE(text);
    /* HELP escapes backslash and newline but not quotes; label values escape all three. */
    CHECK(strstr(text, "# HELP esc line one\\nback\\\\slash \"quoted\"\n") != NULL);
    CHECK(strstr(text, "esc{path=\"C:\\\\dir\\n\\\"x\\\"\"} 0\n") != NULL);
    free(text);
    al_metrics_free(m);
}

TEST(invalid_names_and_type_clashes_return_null_and_null_is_harmless)
{
    al_metrics *m = al_metrics_new();
    CHECK(al_metrics_counter(m, "9starts_with_digit", "h", NULL) == NULL);
    CHECK(al_metrics_counter(m, "has-dash", "h", NULL) == NULL);
    CHECK(al_metrics_counter(m, "", "h", NULL) == NULL);
    CHECK(al_metrics_counter(m, "ok_total", "h", "bad-label", "v", NULL) == NULL);
    CHECK(al_metrics_counter(m, "ok_total", "h", "__reserved", "v", NULL) == NULL);
    CHECK(al_metrics_counter(m, "ok_total", "h", "k", NULL, NULL) == NULL);
    CHECK(al_metrics_counter(m, "ns:sub_total", "colons are fine in metric names", NULL) != NULL);
    CHECK(al_metrics_gauge(m, "thing", "h", NULL) != NULL);
    CHECK(al_metrics_counter(m, "thing", "h", NULL) == NULL); /* already a gauge */
    double b[] = {1, 2};
    double unsorted[] = {2, 1};
    CHECK(al_metrics_histogram(m, "lat", "h", unsorted, 2, NULL) == NULL);
    CHECK(al_metrics_histogram(m, "lat", "h", b, 2, "le", "x", NULL) == NULL);
    CHECK(al_metrics_histogram(m, "lat", "h", b, 2, NULL) != NULL);
    CHECK(al_metrics_histogram(m, "lat", "h", b, 1, "k", "v", NULL) == NULL); /* other buckets */
    al_counter_inc(NULL);
    al_counter_add(NULL, 1);
    al_gauge_set(NULL, 1);
    al_histogram_observe(NULL, 1);
    CHECK_EQ_INT(al_histogram_count(NULL), 0);
    al_metrics_free(m);
}

TEST(histogram_buckets_are_cumulative_and_le_inclusive)
{
    al_metrics *m = al_metrics_new();
    double b[] = {0.005, 0.1, 1};
    al_histogram *h =
        al_metrics_histogram(m, "step_seconds", "Step time.", b, 3, "stage", "train", NULL);
    REQUIRE(h);
    al_histogram_observe(h, 0.005); /* on the bound: counts in le="0.005" */
    al_histogram_observe(h, 0.05);
    al_histogram_observe(h, 0.1);
    al_histogram_observe(h, 7);
    al_histogram_observe(h, 0.0 / 0.0); /* NaN: ignored */
    CHECK_EQ_INT(al_histogram_count(h), 4);
    CHECK_NEAR(al_histogram_sum(h), 7.155, 1e-12);
    char *text = al_metrics_render(m, NULL);
    REQUIRE(text);
    CHECK_EQ_STR(text, "# HELP step_seconds Step time.\n"
                       "# TYPE step_seconds histogram\n"
                       "step_seconds_bucket{stage=\"train\",le=\"0.005\"} 1\n"
                       "step_seconds_bucket{stage=\"train\",le=\"0.1\"} 3\n"
                       "step_seconds_bucket{stage=\"train\",le=\"1\"} 3\n"
                       "step_seconds_bucket{stage=\"train\",le=\"+Inf\"} 4\n"
                       "step_seconds_sum{stage=\"train\"} 7.155\n"
                       "step_seconds_count{stage=\"train\"} 4\n");
    free(text);
    al_metrics_free(m);
}

TEST(special_values_render_as_prometheus_reads_them)
{
    al_metrics *m = al_metrics_new();
    al_gauge *a = al_metrics_gauge(m, "a", "h", "v", "inf", NULL);
    al_gauge *b = al_metrics_gauge(m, "a", "h", "v", "ninf", NULL);
    al_gauge *c = al_metrics_gauge(m, "a", "h", "v", "nan", NULL);
    al_gauge *d = al_metrics_gauge(m, "a", "h", "v", "tiny", NULL);
    al_gauge *e = al_metrics_gauge(m, "a", "h", "v", "big", NULL);
    al_gauge_set(a, 1.0 / 0.0);
    al_gauge_set(b, -1.0 / 0.0);
    al_gauge_set(c, 0.0 / 0.0);
    al_gauge_set(d, 0.1);
    al_gauge_set(e, 1e300);
    char *text = al_metrics_render(m, NULL);
    REQUIRE(text);
    CHECK(strstr(text, "a{v=\"inf\"} +Inf\n"));
    CHECK(strstr(text, "a{v=\"ninf\"} -Inf\n"));
    CHECK(strstr(text, "a{v=\"nan\"} NaN\n"));
    CHECK(strstr(text, "a{v=\"tiny\"} 0.1\n"));
    CHECK(strstr(text, "a{v=\"big\"} 1e+300\n"));
    free(text);
    al_metrics_free(m);
}

#define NTHREADS 4
#define PER_THREAD 50000

struct worker {
    al_metrics *m;
    int id;
};

static void *hammer(void *arg)
{
    struct worker *w = arg;
    double b[] = {10, 100};
    /* Each thread looks the series up itself, racing with the others' creation. */
    al_counter *c = al_metrics_counter(w->m, "hits_total", "h", NULL);
    al_gauge *g = al_metrics_gauge(w->m, "level", "h", NULL);
    al_histogram *h = al_metrics_histogram(w->m, "sizes", "h", b, 2, NULL);
    for (int i = 0; i < PER_THREAD; i++) {
        al_counter_inc(c);
        al_gauge_add(g, 1);
        al_histogram_observe(h, (double)(i % 200));
    }
    return NULL;
}

static void *scrape(void *arg)
{
    al_metrics *m = arg;
    for (int i = 0; i < 50; i++)
        free(al_metrics_render(m, NULL));
    return NULL;
}

TEST(concurrent_updates_are_exact)
{
    al_metrics *m = al_metrics_new();
    pthread_t t[NTHREADS], s;
    struct worker w[NTHREADS];
    for (int i = 0; i < NTHREADS; i++) {
        w[i].m = m;
        w[i].id = i;
        pthread_create(&t[i], NULL, hammer, &w[i]);
    }
    pthread_create(&s, NULL, scrape, m);
    for (int i = 0; i < NTHREADS; i++)
        pthread_join(t[i], NULL);
    pthread_join(s, NULL);
    double b[] = {10, 100};
    CHECK_NEAR(al_counter_value(al_metrics_counter(m, "hits_total", "h", NULL)),
               NTHREADS * PER_THREAD, 0);
    CHECK_NEAR(al_gauge_value(al_metrics_gauge(m, "level", "h", NULL)), NTHREADS * PER_THREAD, 0);
    al_histogram *h = al_metrics_histogram(m, "sizes", "h", b, 2, NULL);
    CHECK_EQ_INT(al_histogram_count(h), NTHREADS * PER_THREAD);
    char *text = al_metrics_render(m, NULL);
    REQUIRE(text);
    /* values 0..199 evenly: 11 of every 200 are <= 10, 101 are <= 100 */
    char want[128];
    snprintf(want, sizeof want, "sizes_bucket{le=\"10\"} %d\n", NTHREADS * PER_THREAD / 200 * 11);
    CHECKF(strstr(text, want), "missing '%s' in:\n%s", want, text);
    snprintf(want, sizeof want, "sizes_bucket{le=\"100\"} %d\n", NTHREADS * PER_THREAD / 200 * 101);
    CHECKF(strstr(text, want), "missing '%s'", want);
    free(text);
    al_metrics_free(m);
}

static void collect_sets_gauge(al_metrics *m, void *ud)
{
    int *calls = ud;
    (*calls)++;
    al_gauge_set(al_metrics_gauge(m, "queue_depth", "Depth read at scrape time.", NULL), *calls);
}

TEST(collect_hooks_run_on_each_render_and_process_metrics_exist)
{
    al_metrics *m = al_metrics_new();
    int calls = 0;
    CHECK(al_metrics_on_collect(m, collect_sets_gauge, &calls) == 0);
    CHECK(al_metrics_add_process_metrics(m) == 0);
    free(al_metrics_render(m, NULL));
    char *text = al_metrics_render(m, NULL);
    REQUIRE(text);
    CHECK_EQ_INT(calls, 2);
    CHECK(strstr(text, "queue_depth 2\n"));
    CHECK(strstr(text, "# TYPE process_start_time_seconds gauge\n"));
    CHECK(strstr(text, "# TYPE process_cpu_seconds_total counter\n"));
    const char *rss = strstr(text, "\nprocess_resident_memory_bytes ");
    REQUIRE(rss);
    CHECK(atof(rss + strlen("\nprocess_resident_memory_bytes ")) > 1e5);
    const char *st = strstr(text, "\nprocess_start_time_seconds ");
    REQUIRE(st);
    double start = atof(st + strlen("\nprocess_start_time_seconds "));
    CHECKF(start > 1.6e9 && start <= (double)time(NULL) + 1, "start time %f", start);
    free(text);
    al_metrics_free(m);
}

static void *get_global(void *arg)
{
    return al_metrics_global();
}

TEST(global_registry_is_one_per_process_and_survives_free)
{
    pthread_t t[4];
    void *seen[4];
    for (int i = 0; i < 4; i++)
        pthread_create(&t[i], NULL, get_global, NULL);
    for (int i = 0; i < 4; i++)
        pthread_join(t[i], &seen[i]);
    al_metrics *g = al_metrics_global();
    REQUIRE(g);
    for (int i = 0; i < 4; i++)
        CHECK(seen[i] == g);
    al_counter_inc(al_metrics_counter(g, "global_total", "h", NULL));
    al_metrics_free(g); /* a no-op for the global registry */
    char *text = al_metrics_render(al_metrics_global(), NULL);
    REQUIRE(text);
    CHECK(strstr(text, "global_total 1\n") != NULL);
    free(text);
}
