/*
 * fleet.h: what the proxy knows of its upstreams as a fleet (issue 23): which policy version
 * each replica serves and since when (followed from `arclight sync`'s records), the trainer's
 * newest version (followed from arclight.policy) for --max-staleness, each upstream's health
 * (active checks) and the rollout-sticky choice among the healthy ones.
 *
 * Two threads of its own (the followers, the health checks) write the state under a lock;
 * the loop thread reads it per call. Everything is off unless its flag is given.
 */
#ifndef ARCLIGHT_PROXY_FLEET_H
#define ARCLIGHT_PROXY_FLEET_H

#include "core/cli.h"

#include <stddef.h>
#include <stdint.h>

typedef struct px_fleet_conf {
    const char *sync_topic;   /* --sync-topic: replicas' versions from sync; NULL: not followed */
    const char *policy_topic; /* --policy-topic (arclight.policy): the trainer's newest version */
    const char *model;        /* --policy-model: whose versions count; NULL: any model */
    int64_t max_staleness;    /* --max-staleness; -1: off */
    int64_t health_ms;        /* --health-interval-ms; 0: no active checks */
    const char *health_path;  /* --health-path (/health) */
} px_fleet_conf;

struct proxy;
struct conn;
struct ident;

/* Starts what the flags ask for (followers, health checks, metrics). 0, or -1 with errstr. */
int px_fleet_start(struct proxy *px, const al_cli_common *common, char *errstr, size_t errlen);

/* Stops the threads and frees the state. NULL-safe on a proxy without a fleet. */
void px_fleet_stop(struct proxy *px);

/* The policy version a span of upstream up (a call from start_us to end_us, wall clock, µs)
 * carries; said: what the upstream's answer named (-1: nothing). Without --sync-topic, or for
 * an upstream sync has never recorded, that is `said`. Else sync's records decide (they use
 * the trainer's numbering; a replica's own label need not): the version of the last swap that
 * ended before the call began, or -1 when none did or a swap overlaps the call (began before
 * its end and ended after its start, or is still under way). */
int64_t px_fleet_version(struct proxy *px, int up, int64_t start_us, int64_t end_us,
                         int64_t said);

/* The upstream for a call of rollout (stable: rendezvous hashing over the upstreams' URLs,
 * healthy ones first). after < 0: the first choice; else the one ranked after `after` (the
 * failover of a call whose upstream failed). */
int px_fleet_pick(struct proxy *px, const char *rollout, int after);

/* A call of upstream up ended: ok (an answer below 500) or not. A connection failure marks it
 * unhealthy until its next good check (with active checks on). */
void px_fleet_count(struct proxy *px, int up, int ok, int conn_failed);

/* --max-staleness: 0 when c's call may go on; -1 after answering 429 (a new rollout's call
 * while the replicas are too far behind the trainer). Calls of a rollout the proxy has seen
 * before, and evaluation calls, always go on. */
int px_fleet_admit(struct proxy *px, struct conn *c, const struct ident *id);

#endif
