/*
 * fetch.h: fetching a checkpoint's weights for the policy follower (policy.h), and the checks
 * that bound what a PolicyVersion can make the server read:
 *   - a download is refused past max_bytes (policy.h: al_serve_weights_max_bytes);
 *   - file:// reads only regular files under a checkpoint root (after resolving symbolic
 *     links); with no root configured, only the trainer's own layout .../step-N/model.safetensors;
 *   - redirects stay within the URI's origin (scheme, host and port), or are refused;
 *   - the sha256 must be 64 hex digits (no PolicyVersion skips the check);
 *   - a transfer slower than low_speed_limit bytes/s for low_speed_time s is abandoned, and the
 *     caller's abort callback (a newer version, a stop) cuts any fetch short;
 *   - error lines name the URI and the reason, never bytes of what was read.
 * No Kafka and no model here: the checks are fuzzed on their own (tests/fuzz/fuzz_serve_fetch.c).
 */
#ifndef ARCLIGHT_SERVE_FETCH_H
#define ARCLIGHT_SERVE_FETCH_H

#include <stddef.h>
#include <stdint.h>

typedef enum al_serve_redirects {
    AL_SERVE_REDIRECTS_OFF = 0,         /* a 3xx answer is an error */
    AL_SERVE_REDIRECTS_SAME_ORIGIN = 1, /* followed (up to 5) while scheme, host and port stay */
} al_serve_redirects;

/* How weights may be fetched. Borrowed pointers must outlive the call that uses them. */
typedef struct al_serve_fetch_opts {
    size_t max_bytes;          /* larger downloads are refused (0: no limit) */
    const char *const *roots;  /* absolute, symlink-free directories (realpath) for file:// */
    size_t nroots;             /* 0: file:// only as .../step-N/model.safetensors */
    al_serve_redirects redirects;
    long low_speed_limit;      /* bytes/s ... */
    long low_speed_time;       /* ... over this many seconds, else the fetch is abandoned */
    long connect_timeout;      /* seconds */
    /* polled during the fetch (may be NULL): nonzero abandons it, with "superseded" or
     * "stopping" as the reason (abort_why) */
    int (*abort)(void *ud, const char **abort_why);
    void *abort_ud;
} al_serve_fetch_opts;

/* ---- pieces without side effects ---------------------------------------------------- */

/* 1 when s is exactly 64 hex digits (either case), else 0. */
int al_serve_sha256_valid(const char *s);

/* A checkpoint URI taken apart. kind: 'f' file (path: the absolute path, with
 * "model.safetensors" appended when the URI ends in '/'), 'h' http or https (url: the URL to
 * fetch, the same append). 0, or -1 with errstr (empty, too long, control characters, another
 * scheme, a file:// URI with a host other than localhost, a relative path, "." or ".."
 * segments, a query or fragment in a file:// URI). */
typedef struct al_serve_uri {
    char kind;
    char target[4096];
} al_serve_uri;
int al_serve_uri_parse(const char *uri, al_serve_uri *out, char *errstr, size_t errlen);

/* 1 when URL b has the same scheme, host (case-insensitive) and port (defaults filled in) as
 * URL a; 0 otherwise, also when either does not parse. */
int al_serve_same_origin(const char *a, const char *b);

/* 1 when path is the trainer's layout: ".../step-N/model.safetensors" (N digits). */
int al_serve_trainer_layout(const char *path);

/* 1 when realpath-resolved `path` lies inside one of `roots` (also resolved), else 0. */
int al_serve_path_under(const char *path, const char *const *roots, size_t nroots);

/* Checks that len bytes look like a safetensors file before they are parsed: an 8-byte header
 * length within the file and at most 100 MB, and a header that starts with '{'. 0, or -1 with
 * a reason that quotes none of the bytes. */
int al_serve_st_precheck(const uint8_t *bytes, size_t len, char *errstr, size_t errlen);

/* Copies s into out (size cap) for a log line: control bytes, '\\' and bytes >= 0x7f become
 * \xHH, and the copy ends with "..." when s was longer. Returns out. */
char *al_serve_log_escape(const char *s, char *out, size_t cap);

/* ---- fetching and loading ------------------------------------------------------------- */

/* Fetches the safetensors bytes a checkpoint URI points at into *out (malloc'd, caller frees)
 * and checks them against sha256_hex (which must be 64 hex digits). 0, or -1 with errstr
 * naming the URI (escaped) and what failed. */
int al_serve_fetch_weights(const char *uri, const char *sha256_hex, const al_serve_fetch_opts *o,
                           uint8_t **out, size_t *len, char *errstr, size_t errlen);

#endif
