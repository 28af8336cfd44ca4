/*
 * tasks.h: the rollout controller's task dataset (pure logic: no processes, no Kafka).
 *
 * A dataset is a JSONL file, one task per line (blank lines and lines starting with '#'
 * are skipped):
 *
 *   {"id": "q17", "input": {"question": "..."}, "split": "train"}
 *
 *   id      a string or an integer, unique in the file (required)
 *   input   any JSON value: what the agent works on (required)
 *   split   "train" or "val" (optional); a task without one goes to val with probability
 *           split_ratio, decided by a hash of its id (so the same file always splits the
 *           same way, whatever the order of its lines)
 *   other members are kept and passed to the agent with the rest of the record
 *
 * Every line that is not such a record is an error naming the file, the line and what is
 * wrong; nothing is skipped silently.
 *
 * Identity: a task's id becomes part of URLs (/r/{task}/{rollout}/v1) and Kafka keys, which
 * take 1-128 characters of A-Z a-z 0-9 . _ : @ -. An id made only of those (and at most 100
 * long) is used as it is; any other id is turned into its allowed characters (others become
 * '_', cut at 80) plus '-' and 12 hex digits of its SHA-256, so distinct ids stay distinct.
 *
 * Shards: shard i of N holds the tasks whose id hash is i mod N: N controllers given
 * --shard 0/N .. N-1/N cover the dataset exactly once, however the file is ordered.
 */
#ifndef ARCLIGHT_ROLLOUTS_TASKS_H
#define ARCLIGHT_ROLLOUTS_TASKS_H

#include <stddef.h>
#include <stdint.h>

typedef enum rl_split {
    RL_SPLIT_TRAIN = 0,
    RL_SPLIT_VAL = 1,
} rl_split;

typedef struct rl_task {
    char *id;      /* the id as given (an integer id in its decimal form) */
    char *key;     /* the id as used in URLs and Kafka keys (see above) */
    char *record;  /* the whole record as compact JSON: what the agent gets */
    rl_split split;
    uint64_t hash; /* al_hash_str of id (FNV-1a, stable across versions): split and shard */
    int line;      /* line number in the file */
} rl_task;

typedef struct rl_tasks {
    rl_task *t;
    size_t n;
} rl_tasks;

typedef struct rl_tasks_opts {
    double split_ratio; /* share of tasks without a split that go to val, in [0, 1] */
    int shard_index;    /* 0 <= shard_index < shard_count */
    int shard_count;    /* >= 1 */
} rl_tasks_opts;

/* Reads a dataset file and keeps the tasks of the given shard. 0 with *out filled (free
 * with rl_tasks_free), or -1 with errstr ("tasks.jsonl:12: 'id' is missing"). A file with
 * no task at all (in any shard) is an error too. */
int rl_tasks_load(const char *path, const rl_tasks_opts *o, rl_tasks *out, char *errstr,
                  size_t errlen);
/* The same from text in memory (name: what errors call it). */
int rl_tasks_parse(const char *text, size_t len, const char *name, const rl_tasks_opts *o,
                   rl_tasks *out, char *errstr, size_t errlen);
void rl_tasks_free(rl_tasks *ts);

/* Writes the URL-safe key of id into key (at least 130 bytes). */
void rl_task_key(const char *id, char *key, size_t keylen);

/* Parses "i/N" (0 <= i < N <= 65536). 0, or -1. */
int rl_parse_shard(const char *s, int *index, int *count);

/* A deterministic permutation of 0..n-1 for epoch `epoch` under `seed` (Fisher-Yates over
 * an al_splitmix64 stream): the order in which an epoch visits the training tasks. */
void rl_shuffle(size_t *idx, size_t n, uint64_t seed, uint64_t epoch);

#endif
