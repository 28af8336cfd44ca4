/*
 * member.c: the static group membership id of a consumer (KIP-345, group.instance.id).
 *
 * A consumer group member that restarts under the id it had gets its partitions back at
 * once, without a rebalance; a dynamic one waits until the coordinator gives up on its dead
 * predecessor (session.timeout.ms, plus the rebalance). The id must therefore be the same
 * for a worker across restarts and different between workers of one group. It is chosen so:
 *
 *   1. group.instance.id in the client settings (client.conf, ARCLIGHT_KAFKA_GROUP_INSTANCE_ID,
 *      --config): taken as it is; "none" (or empty) means dynamic membership.
 *   2. else INSTANCE.GROUP.SLOT, where INSTANCE is $ARCLIGHT_INSTANCE_ID ("none": dynamic)
 *      or else the host name (a pod's or a container's name), and SLOT the lowest number
 *      N >= 0 whose lock file ${TMPDIR:-/tmp}/arclight-member.GROUP.N.lock this process can
 *      lock (flock, held until the consumer is freed). Two workers of one group on one host
 *      get slots 0 and 1; a worker restarted after kill -9 finds its slot free again (the
 *      kernel drops a dead process's locks) and takes it back.
 *
 * A worker stopped for good leaves its partitions to the others only after session.timeout.ms
 * (45 s in broker-config/client.conf): a static member does not leave its group on close,
 * which is what lets its successor take over without a rebalance.
 *
 * The embedded broker (librdkafka's mock cluster, `arclight broker`) takes an instance id in
 * JoinGroup but keeps no static members: a successor joining under the dead worker's id is a
 * new member there, and the group waits out the dead one's whole session before it rebalances
 * (45 s after one kill -9, two minutes after two in a row). So a consumer asks the cluster its
 * id first (al_kafka__keeps_static_members): on the mock ("mockCluster...") it joins as a
 * dynamic member with a session of at most AL_MEMBER_EMBEDDED_SESSION_MS (4 s; a stage
 * that stops when it loses its partitions asks for more with AL_KAFKA_EMBEDDED_SESSION), so
 * that a restart after kill -9 has its partitions back within seconds, and a clean stop
 * leaves the group at
 * once (a dynamic member sends LeaveGroup). The id is still chosen as above: --exactly-once's
 * transactional.id needs it stable across restarts on any broker. A broker that does not
 * answer within the probe's time counts as real Kafka (static membership, as before).
 */
#include "kafka/internal.h"

#include "core/log.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <unistd.h>

#define AL_MEMBER_SLOTS 256
#define AL_MEMBER_PROBE_MS 2000

int al_kafka__keeps_static_members(rd_kafka_t *rk)
{
    char *id = rd_kafka_clusterid(rk, AL_MEMBER_PROBE_MS);
    int mock = id && !strncmp(id, "mockCluster", 11);
    if (id) rd_kafka_mem_free(rk, id);
    return !mock;
}

/* Copies s into out keeping what a Kafka id and a file name may safely hold. */
static void member_clean(const char *s, char *out, size_t outlen)
{
    size_t n = 0;
    for (; *s && n + 1 < outlen; s++) {
        unsigned char ch = (unsigned char)*s;
        int ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
                 ch == '-' || ch == '_' || ch == '.';
        out[n++] = ok ? (char)ch : '_';
    }
    out[n] = '\0';
}

int al_kafka__member_id(const al_kafka_conf *conf, const char *group, char *id, size_t idlen,
                        int *lock_fd)
{
    *lock_fd = -1;
    id[0] = '\0';
    const char *given = al_kafka_conf_get(conf, "group.instance.id");
    if (given) {
        if (*given && strcmp(given, "none")) snprintf(id, idlen, "%s", given);
        return 0;
    }
    char inst[256], host[256], g[200];
    const char *env = getenv("ARCLIGHT_INSTANCE_ID");
    if (env && !strcmp(env, "none")) return 0;
    if (env && *env) {
        member_clean(env, inst, sizeof inst);
    } else {
        if (gethostname(host, sizeof host) != 0) snprintf(host, sizeof host, "localhost");
        host[sizeof host - 1] = '\0';
        member_clean(host, inst, sizeof inst);
    }
    member_clean(group, g, sizeof g);
    const char *tmp = getenv("TMPDIR");
    if (!tmp || !*tmp) tmp = "/tmp";
    for (int slot = 0; slot < AL_MEMBER_SLOTS; slot++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/arclight-member.%s.%d.lock", tmp, g, slot);
        int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
        if (fd < 0) {
            al_log_warn("kafka",
                        "group %s: cannot open %s (%s): dynamic group membership (a restart "
                        "waits for the session timeout); set ARCLIGHT_INSTANCE_ID or "
                        "group.instance.id for a static one",
                        group, path, strerror(errno));
            return 0;
        }
        if (flock(fd, LOCK_EX | LOCK_NB) == 0) {
            *lock_fd = fd;
            /* Kafka allows 249 characters; the slot keeps its place at the end */
            snprintf(id, idlen, "%.200s.%.40s.%d", inst, g, slot);
            return 0;
        }
        close(fd);
    }
    al_log_warn("kafka", "group %s: all %d member slots of this host are taken: dynamic group "
                         "membership",
                group, AL_MEMBER_SLOTS);
    return 0;
}
