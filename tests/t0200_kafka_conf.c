/* t0200: client configuration layering and the offset tracker (no broker needed). */
#include "testlib.h"
#include "support.h"

#include "kafka/kafka.h"

#include <unistd.h>

static char tmpdir[256];

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    fputs(text, f);
    fclose(f);
}

static void make_tmpdir(void)
{
    if (!tmpdir[0] && !al_test_tmpdir(tmpdir, sizeof tmpdir, "t0200")) abort();
}

TEST(conf_precedence_file_env_config_flag)
{
    char path[512], cfg[512], errstr[512];
    make_tmpdir();
    snprintf(path, sizeof path, "%s/client.conf", tmpdir);
    snprintf(cfg, sizeof cfg, "%s/override.conf", tmpdir);
    write_file(path, "# defaults\nlinger.ms = 11\nbatch.num.messages=111\n\nclient.id=from-file\n"
                     "bootstrap.servers=file:1\nsocket.timeout.ms=1111\n");
    write_file(cfg, "batch.num.messages=333\nclient.id=from-config\n");
    setenv("ARCLIGHT_BROKER_CONFIG", tmpdir, 1);
    setenv("ARCLIGHT_KAFKA_LINGER_MS", "22", 1);
    setenv("ARCLIGHT_KAFKA_BATCH_NUM_MESSAGES", "222", 1);
    setenv("ARCLIGHT_KAFKA_SOCKET_TIMEOUT_MS", "2222", 1);

    al_kafka_conf *c = al_kafka_conf_load(cfg, "flag:9", errstr, sizeof errstr);
    REQUIREF(c, "load: %s", errstr);
    CHECK_EQ_STR(al_kafka_conf_get(c, "linger.ms"), "22");             /* env over file */
    CHECK_EQ_STR(al_kafka_conf_get(c, "batch.num.messages"), "333");   /* config over env */
    CHECK_EQ_STR(al_kafka_conf_get(c, "client.id"), "from-config");    /* config over file */
    CHECK_EQ_STR(al_kafka_conf_get(c, "socket.timeout.ms"), "2222");   /* env over file */
    CHECK_EQ_STR(al_kafka_conf_get(c, "bootstrap.servers"), "flag:9"); /* flag over all */
    CHECK_EQ_STR(al_kafka_conf_get(c, "acks"), "all");                 /* built-in default */
    al_kafka_conf_free(c);

    /* No flag: the file's bootstrap.servers stays; the CLI default does not clobber it. */
    al_cli_common cc;
    unsetenv("ARCLIGHT_BOOTSTRAP");
    al_cli_common_init(&cc);
    c = al_kafka_conf_from_cli(&cc, errstr, sizeof errstr);
    REQUIREF(c, "from_cli: %s", errstr);
    CHECK_EQ_STR(al_kafka_conf_get(c, "bootstrap.servers"), "file:1");
    CHECK_EQ_STR(al_kafka_conf_get(c, "batch.num.messages"), "222");
    al_kafka_conf_free(c);
    cc.bootstrap = "cli:7";
    c = al_kafka_conf_from_cli(&cc, errstr, sizeof errstr);
    REQUIREF(c, "from_cli: %s", errstr);
    CHECK_EQ_STR(al_kafka_conf_get(c, "bootstrap.servers"), "cli:7");
    al_kafka_conf_free(c);

    unsetenv("ARCLIGHT_KAFKA_LINGER_MS");
    unsetenv("ARCLIGHT_KAFKA_BATCH_NUM_MESSAGES");
    unsetenv("ARCLIGHT_KAFKA_SOCKET_TIMEOUT_MS");
    unlink(path);
    unlink(cfg);
}

TEST(conf_missing_default_is_fine_missing_config_is_not)
{
    char errstr[512];
    make_tmpdir();
    setenv("ARCLIGHT_BROKER_CONFIG", "/nonexistent/arclight-broker-config", 1);
    setenv("ARCLIGHT_BOOTSTRAP", "env:5", 1);
    al_kafka_conf *c = al_kafka_conf_load(NULL, NULL, errstr, sizeof errstr);
    REQUIREF(c, "load without default file: %s", errstr);
    CHECK_EQ_STR(al_kafka_conf_get(c, "bootstrap.servers"), "env:5");
    CHECK_EQ_STR(al_kafka_conf_get(c, "enable.idempotence"), "true");
    CHECK_EQ_STR(al_kafka_conf_get(c, "partition.assignment.strategy"), "cooperative-sticky");
    al_kafka_conf_free(c);

    errstr[0] = '\0';
    c = al_kafka_conf_load("/nonexistent/override.conf", NULL, errstr, sizeof errstr);
    CHECK(c == NULL);
    CHECKF(strstr(errstr, "/nonexistent/override.conf") != NULL, "error: %s", errstr);
    al_kafka_conf_free(c);
    unsetenv("ARCLIGHT_BOOTSTRAP");
    unsetenv("ARCLIGHT_BROKER_CONFIG");
}

TEST(conf_malformed_line_names_file_and_line)
{
    char path[512], errstr[512];
    make_tmpdir();
    snprintf(path, sizeof path, "%s/bad.conf", tmpdir);
    write_file(path, "linger.ms=5\n# ok\nthis line has no equals sign\n");
    al_kafka_conf *c = al_kafka_conf_new();
    CHECK(al_kafka_conf_load_file(c, path, errstr, sizeof errstr) == -1);
    CHECKF(strstr(errstr, "bad.conf:3") != NULL, "error: %s", errstr);
    al_kafka_conf_free(c);
    unlink(path);
}

TEST(conf_shipped_client_conf_is_accepted_by_librdkafka)
{
    char errstr[512], path[1024];
    unsetenv("ARCLIGHT_BROKER_CONFIG");
    al_kafka_conf_default_path(path, sizeof path);
    CHECKF(access(path, R_OK) == 0, "default client.conf %s not readable", path);
    al_kafka_conf *c = al_kafka_conf_load(NULL, "127.0.0.1:1", errstr, sizeof errstr);
    REQUIREF(c, "%s", errstr);
    CHECK_EQ_STR(al_kafka_conf_get(c, "compression.type"), "lz4");
    rd_kafka_conf_t *rc = al_kafka_conf_build(c, errstr, sizeof errstr);
    CHECKF(rc != NULL, "librdkafka refused client.conf: %s", errstr);
    if (rc) rd_kafka_conf_destroy(rc);
    al_kafka_conf_set(c, "no.such.property", "1");
    rc = al_kafka_conf_build(c, errstr, sizeof errstr);
    CHECK(rc == NULL);
    CHECKF(strstr(errstr, "no.such.property") != NULL, "error: %s", errstr);
    al_kafka_conf_free(c);
}

TEST(producer_refuses_weaker_acks)
{
    char errstr[512];
    al_kafka_conf *c = al_kafka_conf_new();
    al_kafka_conf_set(c, "bootstrap.servers", "127.0.0.1:1");
    al_kafka_conf_set(c, "acks", "1");
    al_producer *p = al_producer_new(c, errstr, sizeof errstr);
    CHECK(p == NULL);
    CHECKF(strstr(errstr, "acks=1") != NULL, "error: %s", errstr);
    al_producer_free(p);
    al_kafka_conf_set(c, "acks", "all");
    al_kafka_conf_set(c, "enable.idempotence", "false");
    p = al_producer_new(c, errstr, sizeof errstr);
    CHECK(p == NULL);
    CHECKF(strstr(errstr, "enable.idempotence=false") != NULL, "error: %s", errstr);
    al_producer_free(p);
    al_kafka_conf_free(c);
}

TEST(tracker_out_of_order_acks_never_pass_a_pending_input)
{
    al_offset_tracker *t = al_offset_tracker_new();
    REQUIRE(t);
    CHECK_EQ_INT(al_offset_tracker_committable(t), -1);
    /* inputs 10, 11, 12, 15 with 2, 1, 3, 1 outputs */
    CHECK_EQ_INT(al_offset_tracker_add(t, 10, 2), 0);
    CHECK_EQ_INT(al_offset_tracker_add(t, 11, 1), 0);
    CHECK_EQ_INT(al_offset_tracker_add(t, 12, 3), 0);
    CHECK_EQ_INT(al_offset_tracker_add(t, 15, 1), 0);
    CHECK_EQ_INT(al_offset_tracker_add(t, 15, 1), -1); /* offsets must increase */
    CHECK_EQ_INT(al_offset_tracker_committable(t), 10);
    CHECK_EQ_INT(al_offset_tracker_pending(t), 4);
    /* later inputs finish first: the stored offset stays at 10 */
    CHECK_EQ_INT(al_offset_tracker_ack(t, 15), 0);
    CHECK_EQ_INT(al_offset_tracker_ack(t, 11), 0);
    CHECK_EQ_INT(al_offset_tracker_ack(t, 12), 0);
    CHECK_EQ_INT(al_offset_tracker_ack(t, 12), 0);
    CHECK_EQ_INT(al_offset_tracker_committable(t), 10);
    CHECK_EQ_INT(al_offset_tracker_ack(t, 10), 0);
    CHECK_EQ_INT(al_offset_tracker_committable(t), 10); /* one output of 10 still pending */
    CHECK_EQ_INT(al_offset_tracker_ack(t, 10), 0);
    /* 10 and 11 done, 12 has one output left */
    CHECK_EQ_INT(al_offset_tracker_committable(t), 12);
    CHECK_EQ_INT(al_offset_tracker_ack(t, 11), -1); /* finished already */
    CHECK_EQ_INT(al_offset_tracker_ack(t, 13), -1); /* never tracked */
    CHECK_EQ_INT(al_offset_tracker_ack(t, 12), 0);
    CHECK_EQ_INT(al_offset_tracker_committable(t), 16);
    CHECK_EQ_INT(al_offset_tracker_pending(t), 0);
    /* an input without outputs is done at once */
    CHECK_EQ_INT(al_offset_tracker_add(t, 20, 0), 0);
    CHECK_EQ_INT(al_offset_tracker_committable(t), 21);
    al_offset_tracker_free(t);
}

TEST(tracker_random_order_against_a_model)
{
    /* 5000 inputs with 0..3 outputs each, acknowledged in a shuffled order; after every ack
     * the committable offset must equal the first unfinished input of a simple model. */
    enum { N = 5000 };
    static int left[N];
    static int64_t acks[4 * N];
    int nacks = 0;
    uint64_t rng = 42;
    al_offset_tracker *t = al_offset_tracker_new();
    REQUIRE(t);
    for (int i = 0; i < N; i++) {
        rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
        left[i] = (int)((rng >> 33) % 4);
        REQUIRE(al_offset_tracker_add(t, 100 + 2 * i, left[i]) == 0);
        for (int k = 0; k < left[i]; k++)
            acks[nacks++] = i;
    }
    for (int i = nacks - 1; i > 0; i--) {
        rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
        int j = (int)((rng >> 33) % (uint64_t)(i + 1));
        int64_t tmp = acks[i];
        acks[i] = acks[j];
        acks[j] = tmp;
    }
    int first = 0, bad = 0;
    while (first < N && left[first] == 0)
        first++;
    for (int a = 0; a < nacks; a++) {
        int i = (int)acks[a];
        if (al_offset_tracker_ack(t, 100 + 2 * i) != 0) bad++;
        left[i]--;
        while (first < N && left[first] == 0)
            first++;
        int64_t want = first < N ? 100 + 2 * first : 100 + 2 * (N - 1) + 1;
        if (al_offset_tracker_committable(t) != want) bad++;
    }
    CHECK_EQ_INT(bad, 0);
    CHECK_EQ_INT(al_offset_tracker_committable(t), 100 + 2 * (N - 1) + 1);
    al_offset_tracker_free(t);
}
