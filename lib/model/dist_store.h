/*
 * dist_store.h: the rendezvous of a CPU data-parallel group (dist.h): a small key-value
 * store that rank 0 serves on ARCLIGHT_DIST_ADDR while the group lives, which gloo's
 * connectFullMesh uses to trade the ranks' addresses, and the membership links that let
 * every rank notice within a second that another one is gone.
 *
 * Protocol (TCP, one request per connection, lengths as 4-byte little-endian):
 *   'S' klen key vlen value        set key (reply: 1 byte 0)
 *   'G' klen key                   get key (reply: 1 byte 0, vlen value; or 1 byte 1: absent)
 *   'J' rank                       join: the connection stays open while both live; rank 0
 *                                  answers 1 byte 0 once every rank has joined
 * Keys are at most 1 KiB and values 64 KiB: the store holds addresses, nothing more, and a
 * request that says more is closed unanswered.
 *
 * A membership link that closes (a rank killed, its host gone: the kernel closes a dead
 * process's sockets; an idle link is probed every second) calls the group's `lost` callback
 * once, from the store's thread.
 */
#ifndef ARCLIGHT_MODEL_DIST_STORE_H
#define ARCLIGHT_MODEL_DIST_STORE_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct al_dist_store al_dist_store;

/* Called once when the group lost a member (rank 0: a rank's link closed; others: rank 0's
 * link closed). `why` says which; runs on the store's thread. */
typedef void (*al_dist_lost_fn)(void *ud, const char *why);

/* Rank 0: listens on ADDR's port (every address), serves the store and waits until the other
 * world-1 ranks have joined (timeout_s). Others: joins rank 0 at ADDR (retrying until
 * timeout_s: pods start in any order). Either way the membership link is then watched by a
 * thread. NULL with errstr (bad address, a port in use, a rank that never came). */
al_dist_store *al_dist_store_open(const char *addr, int rank, int world, double timeout_s,
                                  al_dist_lost_fn lost, void *ud, char *errstr, size_t errlen);

/* Sets key to n bytes of value on rank 0's store. 0, or -1 with errstr. */
int al_dist_store_set(al_dist_store *s, const char *key, const void *value, size_t n,
                      char *errstr, size_t errlen);

/* Waits (until timeout_s) for key and returns its value (malloc'd, *n bytes); NULL with
 * errstr when it never came or the store is gone. */
void *al_dist_store_get(al_dist_store *s, const char *key, double timeout_s, size_t *n,
                        char *errstr, size_t errlen);

/* The local address (numeric) this host uses to reach rank 0: where its gloo pairs listen. */
const char *al_dist_store_local_host(const al_dist_store *s);

/* Stops watching, closes the links (the others see this rank leave) and frees. NULL: no-op. */
void al_dist_store_close(al_dist_store *s);

#ifdef __cplusplus
}
#endif

#endif
