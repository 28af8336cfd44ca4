/*
 * arclight topics: applies broker-config/topics.conf to a Kafka cluster through the Admin API
 * (CreateTopics with each topic's settings), or lists the cluster's topics.
 *
 *   arclight topics create [--bootstrap H:P] [--topics FILE] [--timeout S]
 *   arclight topics list   [--bootstrap H:P] [--timeout S]
 *
 * Existing topics are reported ("exists"), not an error. Replication and min.insync.replicas
 * are capped at the cluster's broker count with a warning, so that one file serves a
 * single-node development cluster and a production one.
 */
#include "core/cli.h"
#include "core/flags.h"
#include "core/log.h"
#include "core/util.h"
#include "kafka/kafka.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A client handle for admin requests: the layered settings without the producer's
 * idempotence (which would ask the cluster for a producer id for nothing). */
static rd_kafka_t *admin_handle(const al_cli_common *cc, char *errstr, size_t errlen)
{
    al_kafka_conf *kc = al_kafka_conf_from_cli(cc, errstr, errlen);
    if (!kc) return NULL;
    al_kafka_conf_set(kc, "enable.idempotence", "false");
    al_kafka_conf_set(kc, "client.id", "arclight-topics");
    rd_kafka_conf_t *rc = al_kafka_conf_build(kc, errstr, errlen);
    al_kafka_conf_free(kc);
    if (!rc) return NULL;
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_PRODUCER, rc, errstr, errlen);
    if (!rk) rd_kafka_conf_destroy(rc);
    return rk;
}

static int topics_list(rd_kafka_t *rk, int timeout_ms)
{
    const struct rd_kafka_metadata *md;
    rd_kafka_resp_err_t err = rd_kafka_metadata(rk, 1, NULL, &md, timeout_ms);
    if (err) {
        al_log_error("topics", "metadata: %s", rd_kafka_err2str(err));
        return AL_EXIT_FAILURE;
    }
    for (int i = 0; i < md->topic_cnt; i++)
        if (md->topics[i].topic[0] != '_')
            printf("%s %d\n", md->topics[i].topic, md->topics[i].partition_cnt);
    rd_kafka_metadata_destroy(md);
    return AL_EXIT_OK;
}

static int topics_create(rd_kafka_t *rk, const char *path, int timeout_ms)
{
    char errstr[512];
    al_topic_spec *t;
    size_t n;
    const struct rd_kafka_metadata *md;
    if (al_topics_load(path, &t, &n, errstr, sizeof errstr) != 0) {
        al_log_error("topics", "%s", errstr);
        return AL_EXIT_FAILURE;
    }
    rd_kafka_resp_err_t merr = rd_kafka_metadata(rk, 1, NULL, &md, timeout_ms);
    if (merr) {
        al_log_error("topics", "metadata: %s", rd_kafka_err2str(merr));
        al_topics_free(t, n);
        return AL_EXIT_FAILURE;
    }
    int nbrokers = md->broker_cnt;
    /* Admin requests go to the controller. A cluster whose controller id names none of its
     * brokers (librdkafka 2.0's mock cluster says 0) gets them on its first broker instead. */
    int32_t controller = rd_kafka_controllerid(rk, 0), direct = -1;
    int known = 0;
    for (int i = 0; i < md->broker_cnt; i++)
        if (md->brokers[i].id == controller) known = 1;
    if (!known && md->broker_cnt > 0) direct = md->brokers[0].id;
    /* Topics the cluster has already: reported, left alone, not sent. */
    size_t nnew = 0;
    int rc = AL_EXIT_OK;
    for (size_t i = 0; i < n; i++) {
        int exists = 0;
        for (int k = 0; k < md->topic_cnt; k++)
            if (!strcmp(md->topics[k].topic, t[i].name) && !md->topics[k].err) {
                exists = 1;
                printf("%s: exists (%d partitions)\n", t[i].name, md->topics[k].partition_cnt);
                if (md->topics[k].partition_cnt != t[i].partitions)
                    al_log_warn("topics", "%s has %d partitions, the file says %d (not changed)",
                                t[i].name, md->topics[k].partition_cnt, t[i].partitions);
            }
        if (!exists)
            t[nnew++] = t[i];
        else {
            free(t[i].name);
            al_kafka_conf_free(t[i].settings);
        }
    }
    rd_kafka_metadata_destroy(md);
    n = nnew;
    if (n == 0) {
        al_topics_free(t, n);
        fflush(stdout);
        return rc;
    }

    rd_kafka_NewTopic_t **nt = calloc(n, sizeof *nt);
    for (size_t i = 0; i < n; i++) {
        int repl = t[i].replication;
        if (repl > nbrokers) {
            al_log_warn("topics", "%s: replication %d capped at the cluster's %d broker%s",
                        t[i].name, repl, nbrokers, nbrokers == 1 ? "" : "s");
            repl = nbrokers;
        }
        nt[i] = rd_kafka_NewTopic_new(t[i].name, t[i].partitions, repl, errstr, sizeof errstr);
        if (!nt[i]) {
            al_log_error("topics", "%s: %s", t[i].name, errstr);
            rc = AL_EXIT_FAILURE;
            goto out;
        }
        for (size_t k = 0; k < al_kafka_conf_count(t[i].settings); k++) {
            const char *key, *val;
            char capped[16];
            al_kafka_conf_at(t[i].settings, k, &key, &val);
            if (!strcmp(key, "min.insync.replicas") && atoi(val) > repl) {
                snprintf(capped, sizeof capped, "%d", repl);
                al_log_warn("topics", "%s: min.insync.replicas %s capped at replication %d",
                            t[i].name, val, repl);
                val = capped;
            }
            if (rd_kafka_NewTopic_set_config(nt[i], key, val)) {
                al_log_error("topics", "%s: setting %s=%s refused", t[i].name, key, val);
                rc = AL_EXIT_FAILURE;
                goto out;
            }
        }
    }

    rd_kafka_queue_t *q = rd_kafka_queue_new(rk);
    rd_kafka_AdminOptions_t *opts = rd_kafka_AdminOptions_new(rk, RD_KAFKA_ADMIN_OP_CREATETOPICS);
    rd_kafka_AdminOptions_set_request_timeout(opts, timeout_ms, errstr, sizeof errstr);
    rd_kafka_AdminOptions_set_operation_timeout(opts, timeout_ms, errstr, sizeof errstr);
    if (direct >= 0) {
        al_log_info("topics", "controller id %d is not a broker; sending to broker %d",
                    (int)controller, (int)direct);
        rd_kafka_AdminOptions_set_broker(opts, direct, errstr, sizeof errstr);
    }
    rd_kafka_CreateTopics(rk, nt, n, opts, q);
    rd_kafka_event_t *ev = rd_kafka_queue_poll(q, timeout_ms + 5000);
    if (!ev) {
        al_log_error("topics", "no answer to CreateTopics within %d ms", timeout_ms + 5000);
        rc = AL_EXIT_FAILURE;
    } else if (rd_kafka_event_error(ev) == RD_KAFKA_RESP_ERR__UNSUPPORTED_FEATURE) {
        /* librdkafka 2.0's mock cluster (arclight broker) has no CreateTopics. */
        al_log_error("topics",
                     "the cluster does not support CreateTopics (%s); the embedded broker "
                     "creates its topics at start: arclight broker --topics FILE",
                     rd_kafka_event_error_string(ev));
        for (size_t i = 0; i < n; i++)
            printf("%s: failed: not created\n", t[i].name);
        rc = AL_EXIT_FAILURE;
    } else if (rd_kafka_event_error(ev)) {
        al_log_error("topics", "CreateTopics failed: %s", rd_kafka_event_error_string(ev));
        rc = AL_EXIT_FAILURE;
    } else {
        size_t cnt;
        const rd_kafka_topic_result_t **res =
            rd_kafka_CreateTopics_result_topics(rd_kafka_event_CreateTopics_result(ev), &cnt);
        for (size_t i = 0; i < cnt; i++) {
            const char *name = rd_kafka_topic_result_name(res[i]);
            rd_kafka_resp_err_t err = rd_kafka_topic_result_error(res[i]);
            if (!err) {
                printf("%s: created\n", name);
            } else if (err == RD_KAFKA_RESP_ERR_TOPIC_ALREADY_EXISTS) {
                printf("%s: exists\n", name);
            } else {
                const char *es = rd_kafka_topic_result_error_string(res[i]);
                printf("%s: failed: %s\n", name, es ? es : rd_kafka_err2str(err));
                rc = AL_EXIT_FAILURE;
            }
        }
    }
    if (ev) rd_kafka_event_destroy(ev);
    rd_kafka_AdminOptions_destroy(opts);
    rd_kafka_queue_destroy(q);
out:
    for (size_t i = 0; i < n; i++)
        if (nt[i]) rd_kafka_NewTopic_destroy(nt[i]);
    free(nt);
    al_topics_free(t, n);
    fflush(stdout);
    return rc;
}

int cmd_topics(int argc, char **argv)
{
    al_cli_common common;
    char topics_path[4096], errstr[512];
    const char *topics_file = NULL;
    int timeout_s = 30;
    const al_flag flags[] = {
        {"topics", 0, AL_FLAG_STRING, &topics_file, .arg = "FILE", .help = "topics file"},
        {"timeout", 0, AL_FLAG_INT, &timeout_s, .lo = 1, .hi = 3600, .arg = "S",
         .help = "how long to wait for the cluster (default 30)"},
    };
    const al_cmd_spec spec = {
        "topics",
        "create [--topics FILE] [--timeout S] [shared flags]\n"
        "       arclight topics list [--timeout S] [shared flags]",
        "create: creates the topics of FILE (default broker-config/topics.conf: lines of\n"
        "        NAME PARTITIONS REPLICATION [key=value ...]) on the cluster with their\n"
        "        settings; existing topics are reported, not changed. Replication and\n"
        "        min.insync.replicas are capped at the cluster's broker count.\n"
        "list:   prints NAME PARTITIONS for every topic of the cluster.\n",
        flags, AL_ARRAY_LEN(flags), .common = 1};
    int first;
    al_cli_common_init(&common);
    int prc = al_flags_parse(&spec, &common, argc, argv, &first);
    if (prc != AL_FLAGS_GO) return prc;
    if (topics_file)
        snprintf(topics_path, sizeof topics_path, "%s", topics_file);
    else
        al_kafka_config_file_path("topics.conf", topics_path, sizeof topics_path);
    if (first >= argc) return al_cli_usage_error("topics", "missing subcommand (create or list)");
    const char *sub = argv[first];
    if (strcmp(sub, "create") && strcmp(sub, "list"))
        return al_cli_usage_error("topics", "unknown subcommand '%s' (create or list)", sub);
    if (first + 1 < argc)
        return al_cli_usage_error("topics", "unexpected argument '%s'", argv[first + 1]);

    if (!strcmp(sub, "create")) {
        /* Read the file first: a typo should not wait for a cluster. */
        al_topic_spec *t;
        size_t n;
        if (al_topics_load(topics_path, &t, &n, errstr, sizeof errstr) != 0) {
            al_log_error("topics", "%s", errstr);
            return AL_EXIT_FAILURE;
        }
        al_topics_free(t, n);
    }
    rd_kafka_t *rk = admin_handle(&common, errstr, sizeof errstr);
    if (!rk) {
        al_log_error("topics", "%s", errstr);
        return AL_EXIT_FAILURE;
    }
    int rc;
    if (al_kafka_check_reachable(rk, timeout_s * 1000, errstr, sizeof errstr) != 0) {
        al_log_error("topics", "%s", errstr);
        rc = AL_EXIT_FAILURE;
    } else if (!strcmp(sub, "create")) {
        rc = topics_create(rk, topics_path, timeout_s * 1000);
    } else {
        rc = topics_list(rk, timeout_s * 1000);
    }
    rd_kafka_destroy(rk);
    return rc;
}
