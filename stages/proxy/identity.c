/*
 * identity.c: who a call belongs to. Owns the rollout table (each rollout's sequence
 * numbers, forgotten after an hour idle), the session keys of POST /v1/sessions, the
 * resolution of a request's identity (URL prefix, X-Arclight-* headers, session key, else a
 * fresh untracked rollout), the --agent-key check, the proxy's ids (random hex), and the
 * state file that keeps sequence numbers and session keys across restarts.
 */
#include "proxy.h"

#include "core/log.h"
#include "core/map.h"
#include "core/vec.h"
#include "http/http1.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

static uint64_t rng_next(proxy *px)
{
    /* xorshift64*, seeded from getrandom: ids need to be unique, not secret */
    uint64_t x = px->rng;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    px->rng = x;
    return x * 0x2545F4914F6CDD1DULL;
}

void px_rand_hex(proxy *px, char *out, size_t nhex)
{
    static const char hx[] = "0123456789abcdef";
    for (size_t i = 0; i < nhex; i += 16) {
        uint64_t r = rng_next(px);
        for (size_t k = 0; k < 16 && i + k < nhex; k++)
            out[i + k] = hx[(r >> (4 * k)) & 15];
    }
    out[nhex] = '\0';
}

/* Secret-grade random hex for session keys. */
static int secret_hex(char *out, size_t nbytes)
{
    uint8_t b[32];
    if (nbytes > sizeof b || getrandom(b, nbytes, 0) != (ssize_t)nbytes) return -1;
    al_hex(b, nbytes, out);
    return 0;
}

/* Identity values: 1..128 of [A-Za-z0-9._:@-]. */
int px_id_valid(const char *p, size_t n)
{
    if (n == 0 || n > 128) return 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)p[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == ':' || c == '@' || c == '-'))
            return 0;
    }
    return 1;
}

/* ------------------------------------------------------------------------------------------
 * State file (spool_dir/proxy-state): what must outlive a restart besides the spans, so
 * that a rollout going on after a restart does not start again at sequence 0 and its
 * session key still works. Append-only lines, written with the spool's write at the end of
 * the loop turn that changed them:
 *   Q \t task\x1frollout\x1fattempt \t next_seq \t last_call_seq [\t e]
 *       (a rollout's latest line wins; e: an eval rollout)
 *   S \t session key \t task \t rollout \t attempt \t created (wall us) \t owner
 *       (a line of 5 fields, from an earlier version: created now, no owner)
 * Rewritten whole (temp file + rename) at start and when it is about twice its live size
 * (what a rewrite would write: each rollout's latest line and each live session), at least
 * STATE_COMPACT_MIN, so that the rewrites cost a constant per appended byte however large the
 * live state is; a torn last line (a crash mid-write) is skipped with a warning. Created 0600:
 * it holds live session keys.
 * ------------------------------------------------------------------------------------------ */

#define STATE_COMPACT_MIN (1u << 20)

static int session_add(proxy *px, session_ent *s);

static void state_mark(proxy *px, rollout_ent *e)
{
    if (e->dirty || px->state_fd < 0) return;
    /* not recorded when out of memory: after a restart this rollout restarts at 0 */
    if (al_vec_push(&px->dirty, e) != 0) return;
    e->dirty = 1;
    if (px->flush_ev) event_active(px->flush_ev, EV_TIMEOUT, 1);
}

/* Appends s's line; returns its length. */
static size_t session_line(al_buf *b, const session_ent *s)
{
    size_t before = b->len;
    al_buf_printf(b, "S\t%s\t%s\t%s\t%d\t%" PRId64 "\t%d\n", s->key, s->task, s->rollout,
                  s->attempt, s->created_us, s->owner);
    return b->len - before;
}

static char *put_i64(char *o, int64_t v)
{
    if (v < 0) *o++ = '-';
    return al_put_u64(o, v < 0 ? 0 - (uint64_t)v : (uint64_t)v);
}

/* Appends e's line ("Q\tKEY\tNEXT\tLAST[\te]\n", written per loop turn for each rollout
 * that called: with appenders, not printf); returns its length (0 when out of memory). */
static size_t rollout_line(al_buf *b, const rollout_ent *e)
{
    size_t kl = strlen(e->key);
    if (al_buf_reserve(b, kl + 56)) return 0;
    char *o = (char *)b->data + b->len, *start = o;
    o = al_put_mem(o, "Q\t", 2);
    o = al_put_mem(o, e->key, kl);
    *o++ = '\t';
    o = put_i64(o, e->next_seq);
    *o++ = '\t';
    o = put_i64(o, e->last_call_seq);
    if (e->eval) o = al_put_mem(o, "\te", 2);
    *o++ = '\n';
    b->len += (size_t)(o - start);
    return (size_t)(o - start);
}

/* Writes buf as path through a temporary file created 0600, fsynced and renamed into place. */
static int state_write(const char *path, const void *buf, size_t len, char *err, size_t errlen)
{
    char tmp[4300];
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) return al_err(err, errlen, "cannot create %s: %s", tmp, strerror(errno));
    const char *p = buf;
    for (size_t left = len; left;) {
        ssize_t n = write(fd, p, left);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            int e = errno;
            close(fd);
            unlink(tmp);
            return al_err(err, errlen, "cannot write %s: %s", tmp, strerror(e));
        }
        p += n, left -= (size_t)n;
    }
    if (fchmod(fd, 0600) != 0 || fsync(fd) != 0 || close(fd) != 0 || rename(tmp, path) != 0) {
        int e = errno;
        unlink(tmp);
        return al_err(err, errlen, "cannot write %s: %s", path, strerror(e));
    }
    return 0;
}

/* Rewrites the state file from memory and opens it for appending. */
void px_state_compact(proxy *px)
{
    al_buf b = {0};
    al_map_iter it;
    al_map_entry *me;
    for (al_map_iter_init(&it, &px->rtab); (me = al_map_iter_next(&it));) {
        rollout_ent *e = me->value;
        e->line_len = rollout_line(&b, e);
    }
    for (al_map_iter_init(&it, &px->sessions); (me = al_map_iter_next(&it));) {
        session_ent *s = me->value;
        s->line_len = session_line(&b, s);
    }
    char err[512];
    if (px->state_fd >= 0) close(px->state_fd);
    px->state_fd = -1;
    px->state_live = b.len;
    if (state_write(px->state_path, b.len ? (const char *)b.data : "", b.len, err, sizeof err) !=
        0) {
        al_log_warn(COMP, "state file: %s; sequence numbers restart at 0 after a restart", err);
    } else {
        px->state_fd = open(px->state_path, O_WRONLY | O_APPEND | O_CLOEXEC);
        if (px->state_fd < 0)
            al_log_warn(COMP, "state file %s: %s", px->state_path, strerror(errno));
    }
    px->state_bytes = b.len;
    al_buf_free(&b);
}

/* Appends this turn's changes: the dirty rollouts' numbers after the session lines already
 * queued in state_pend. */
void px_state_flush(proxy *px)
{
    for (size_t i = 0; i < px->dirty.n; i++) {
        rollout_ent *e = px->dirty.v[i];
        size_t n = rollout_line(&px->state_pend, e);
        px->state_live += n - e->line_len; /* this line replaces its earlier one */
        e->line_len = n;
        e->dirty = 0;
    }
    px->dirty.n = 0;
    if (!px->state_pend.len || px->state_fd < 0) {
        al_buf_reset(&px->state_pend);
        return;
    }
    ssize_t w = write(px->state_fd, px->state_pend.data, px->state_pend.len);
    if (w != (ssize_t)px->state_pend.len && !px->state_warned) {
        px->state_warned = 1;
        al_log_warn(COMP, "state file %s: %s; sequence numbers may restart after a restart",
                    px->state_path, w < 0 ? strerror(errno) : "short write");
    }
    px->state_bytes += px->state_pend.len;
    al_buf_reset(&px->state_pend);
    if (px->state_bytes > STATE_COMPACT_MIN && px->state_bytes > 2 * px->state_live)
        px_state_compact(px);
}

/* Reads the state file left by an earlier run (absent: a first start). */
void px_state_load(proxy *px)
{
    char err[512];
    size_t len = 0;
    char *buf = al_file_read(px->state_path, &len, err, sizeof err);
    if (!buf) return;
    /* an earlier version created it 0644: it holds live session keys */
    if (chmod(px->state_path, 0600) != 0)
        al_log_warn(COMP, "state file %s: cannot make it private: %s", px->state_path,
                    strerror(errno));
    size_t nq = 0, ns = 0, bad = 0, expired = 0;
    int64_t now_us = al_now_us();
    for (char *line = buf, *nl; line < buf + len; line = nl + 1) {
        nl = memchr(line, '\n', (size_t)(buf + len - line));
        if (!nl) {
            bad++; /* torn last line */
            break;
        }
        *nl = '\0';
        char *f[8];
        int nf = 0;
        for (char *p = line; nf < 8;) {
            f[nf++] = p;
            char *t = strchr(p, '\t');
            if (!t) break;
            *t = '\0';
            p = t + 1;
        }
        char *end;
        if ((nf == 4 || (nf == 5 && !strcmp(f[4], "e"))) && !strcmp(f[0], "Q")) {
            char *a = strchr(f[1], '\x1f'), *b = a ? strchr(a + 1, '\x1f') : NULL;
            if (!b) {
                bad++;
                continue;
            }
            *a = *b = '\0';
            long at = strtol(b + 1, &end, 10);
            long long nx = strtoll(f[2], NULL, 10), lc = strtoll(f[3], NULL, 10);
            if (*end || at < 0 || at > 999999 || !px_id_valid(a + 1, strlen(a + 1)) ||
                (*f[1] && !px_id_valid(f[1], strlen(f[1]))) || nx < 0 || lc < -1) {
                bad++;
                continue;
            }
            rollout_ent *e = px_rollout_get(px, f[1], a + 1, (int)at);
            if (!e) break;
            if (nx > e->next_seq) e->next_seq = nx;
            if (lc > e->last_call_seq) e->last_call_seq = lc;
            if (nf == 5) e->eval = 1;
            nq++;
        } else if ((nf == 5 || nf == 7) && !strcmp(f[0], "S")) {
            long at = strtol(f[4], &end, 10);
            int64_t created = now_us;
            long owner = -1;
            char *e2 = NULL, *e3 = NULL;
            if (nf == 7) {
                created = strtoll(f[5], &e2, 10);
                owner = strtol(f[6], &e3, 10);
            }
            if (*end || at < 0 || at > 999999 || strncmp(f[1], "sk-arclight-", 12) != 0 ||
                strlen(f[1]) >= sizeof((session_ent *)0)->key || !px_id_valid(f[3], strlen(f[3])) ||
                (*f[2] && !px_id_valid(f[2], strlen(f[2]))) || (e2 && *e2) || (e3 && *e3) ||
                owner < -1 || owner > 15) {
                bad++;
                continue;
            }
            if (created + (int64_t)px->cfg.session_ttl_s * 1000000 <= now_us) {
                expired++;
                continue;
            }
            /* a key the proxy no longer has: its sessions count as made without one */
            if (owner >= (long)px->cfg.n_agent_keys) owner = -1;
            session_ent *s = calloc(1, sizeof *s);
            if (!s) break;
            s->created_us = created;
            s->owner = (int)owner;
            snprintf(s->key, sizeof s->key, "%s", f[1]);
            s->task = strdup(f[2]);
            s->rollout = strdup(f[3]);
            s->attempt = (int)at;
            if (session_add(px, s) != 0) break;
            ns++;
        } else {
            bad++;
        }
    }
    free(buf);
    px->dirty.n = 0; /* what was just read is on disk already */
    al_map_iter it;
    al_map_entry *me;
    for (al_map_iter_init(&it, &px->rtab); (me = al_map_iter_next(&it));)
        ((rollout_ent *)me->value)->dirty = 0;
    if (nq || ns)
        al_log_info(COMP, "state: %zu rollouts' sequence numbers and %zu session keys from %s", nq,
                    ns, px->state_path);
    if (bad)
        al_log_warn(COMP, "state file %s: %zu lines not understood, skipped", px->state_path, bad);
    if (expired)
        al_log_info(COMP, "state: %zu session keys past --session-ttl forgotten", expired);
}

rollout_ent *px_rollout_get(proxy *px, const char *task, const char *rollout, int attempt)
{
    /* "TASK\x1fROLLOUT\x1fATTEMPT" cut at 511 bytes (as snprintf into 512 bytes cut it),
     * with appenders: it is built for every call */
    char key[512], full[1100], *o = full;
    size_t tl = strnlen(task, 511), rl = strnlen(rollout, 511);
    o = al_put_mem(o, task, tl);
    *o++ = '\x1f';
    o = al_put_mem(o, rollout, rl);
    *o++ = '\x1f';
    if (attempt < 0) *o++ = '-';
    o = al_put_u64(o, attempt < 0 ? 0 - (uint64_t)attempt : (uint64_t)attempt);
    size_t klen = (size_t)(o - full) < sizeof key ? (size_t)(o - full) : sizeof key - 1;
    memcpy(key, full, klen);
    int created;
    al_map_entry *me = al_map_upsertn(&px->rtab, key, klen, &created);
    if (!me) return NULL;
    rollout_ent *e = me->value;
    if (created) {
        if (!(e = calloc(1, sizeof *e))) {
            al_map_remove_entry(&px->rtab, me);
            return NULL;
        }
        me->value = e;
        e->key = me->key;
        e->last_call_seq = -1;
    }
    e->last_used_mono = al_mono_us();
    state_mark(px, e);
    return e;
}

/* The entry of id's rollout (NULL when out of memory). A rollout is an eval rollout from its
 * first eval request on: id->eval then holds for each of its spans, whatever route they
 * come by. */
rollout_ent *px_rollout_of(proxy *px, ident *id)
{
    rollout_ent *r = px_rollout_get(px, id->task, id->rollout, id->attempt);
    if (!r) return NULL;
    if (id->eval) r->eval = 1; /* px_rollout_get marked it for the state file */
    id->eval = r->eval;
    return r;
}

/* Forgets rollouts idle for an hour (their sequence numbers restart only if the agent comes
 * back after that, which a rollout does not). */
void px_sweep_cb(evutil_socket_t fd, short what, void *arg)
{
    proxy *px = arg;
    (void)fd;
    (void)what;
    int64_t cutoff = al_mono_us() - 3600LL * 1000000;
    px_state_flush(px); /* no dirty entry may be freed below */
    px_session_expire(px);
    al_map_iter it;
    al_map_entry *me;
    for (al_map_iter_init(&it, &px->rtab); (me = al_map_iter_next(&it));) {
        rollout_ent *e = me->value;
        if (e->last_used_mono >= cutoff) continue;
        px->state_live -= e->line_len < px->state_live ? e->line_len : px->state_live;
        al_map_remove_entry(&px->rtab, me);
        free(e);
    }
}

/* Frees a session (its map entry already gone). */
static void session_free(void *v)
{
    session_ent *s = v;
    free(s->task);
    free(s->rollout);
    free(s);
}

/* Enters s under its key, counted for its owner (a key already there: that session goes);
 * -1 when out of memory (s freed). */
static int session_add(proxy *px, session_ent *s)
{
    al_map_entry *me = al_map_upsertn(&px->sessions, s->key, strlen(s->key), NULL);
    if (!me) {
        session_free(s);
        return -1;
    }
    session_ent *old = me->value;
    if (old) {
        px->session_count[old->owner + 1]--;
        session_free(old);
    }
    me->value = s;
    px->session_count[s->owner + 1]++;
    return 0;
}

static int session_expired(const proxy *px, const session_ent *s, int64_t now_us)
{
    return s->created_us + (int64_t)px->cfg.session_ttl_s * 1000000 <= now_us;
}

void px_session_expire(proxy *px)
{
    int64_t now = al_now_us();
    size_t n = 0;
    al_map_iter it;
    al_map_entry *me;
    for (al_map_iter_init(&it, &px->sessions); (me = al_map_iter_next(&it));) {
        session_ent *s = me->value;
        if (!session_expired(px, s, now)) continue;
        px->state_live -= s->line_len < px->state_live ? s->line_len : px->state_live;
        px->session_count[s->owner + 1]--;
        al_map_remove_entry(&px->sessions, me);
        session_free(s);
        n++;
    }
    if (n) al_log_info(COMP, "%zu session keys expired (--session-ttl %d s)", n, px->cfg.session_ttl_s);
}

/* The live session of key[0..n), or NULL. The map compares key bytes only once a whole 64-bit
 * hash matched; al_secret_eq then confirms in constant time, so a wrong guess's timing says
 * nothing of a key. */
session_ent *px_session_find(proxy *px, const char *key, size_t n)
{
    if (n >= sizeof((session_ent *)0)->key) return NULL;
    al_map_entry *me = al_map_findn(&px->sessions, key, n);
    session_ent *s = me ? me->value : NULL;
    if (!s || !al_secret_eq(key, n, s->key)) return NULL;
    return session_expired(px, s, al_now_us()) ? NULL : s;
}

int px_session_room(const proxy *px, int owner)
{
    return px->session_count[owner + 1] < px->cfg.max_sessions_per_key;
}

/* A temperature for /e:T/ or X-Arclight-Eval-Temperature: a plain decimal number from 0
 * to 2 (OpenAI's range, and arclight serve's). 0 with *t, or -1. */
int px_parse_temperature(const char *p, size_t n, double *t)
{
    char buf[32];
    if (n == 0 || n >= sizeof buf) return -1;
    for (size_t i = 0; i < n; i++)
        if (!((p[i] >= '0' && p[i] <= '9') || p[i] == '.')) return -1;
    memcpy(buf, p, n);
    buf[n] = '\0';
    char *e;
    double v = strtod(buf, &e);
    if (*e || !(v >= 0 && v <= 2)) return -1;
    *t = v;
    return 0;
}

static int bearer(const al_http_head *head, al_slice *tok)
{
    const al_slice *a = al_http_header_get(head, "authorization");
    if (!a || a->n < 7 || strncasecmp(a->p, "Bearer ", 7) != 0) return 0;
    tok->p = a->p + 7;
    tok->n = a->n - 7;
    while (tok->n && tok->p[0] == ' ')
        tok->p++, tok->n--;
    return 1;
}

/* The API key of the request: its Bearer token (OpenAI's clients), else its x-api-key
 * (Anthropic's). */
int px_api_key(const al_http_head *head, al_slice *tok)
{
    if (bearer(head, tok)) return 1;
    const al_slice *x = al_http_header_get(head, "x-api-key");
    if (!x || !x->n) return 0;
    *tok = *x;
    return 1;
}

/* The index of the agent key tok is, or -1. Every key is compared, in constant time each. */
static int agent_key_index(const proxy *px, al_slice tok)
{
    int found = -1;
    for (size_t i = 0; i < px->cfg.n_agent_keys; i++)
        if (al_secret_eq(tok.p, tok.n, px->cfg.agent_keys[i]) && found < 0) found = (int)i;
    return found;
}

static int is_agent_key(const proxy *px, al_slice tok)
{
    return agent_key_index(px, tok) >= 0;
}

int px_agent_key_index(const proxy *px, const al_http_head *head)
{
    al_slice tok;
    return px_api_key(head, &tok) ? agent_key_index(px, tok) : -1;
}

/* Resolves identity from the URL prefix (already in id), else headers, else the session
 * key; none at all gives an untracked rollout with a fresh id. -1 with the 400 to answer in
 * *err. */
int px_resolve_identity(proxy *px, const al_http_head *head, ident *id, int have_prefix,
                        px_err *err)
{
    const al_slice *h;
    if (!have_prefix) {
        const al_slice *ht = al_http_header_get(head, "x-arclight-task");
        const al_slice *hr = al_http_header_get(head, "x-arclight-rollout");
        al_slice tok;
        session_ent *s;
        if (ht || hr) {
            if (!hr || !px_id_valid(hr->p, hr->n) || (ht && ht->n && !px_id_valid(ht->p, ht->n))) {
                *err = (px_err){400, "invalid_request_error", "invalid_identity",
                                "X-Arclight-Task and X-Arclight-Rollout must be 1-128 characters of "
                                "A-Z a-z 0-9 . _ : @ - (X-Arclight-Rollout is required with them)"};
                return -1;
            }
            snprintf(id->task, sizeof id->task, "%.*s", ht ? (int)ht->n : 0, ht ? ht->p : "");
            snprintf(id->rollout, sizeof id->rollout, "%.*s", (int)hr->n, hr->p);
        } else if (px_api_key(head, &tok) && (s = px_session_find(px, tok.p, tok.n))) {
            snprintf(id->task, sizeof id->task, "%s", s->task);
            snprintf(id->rollout, sizeof id->rollout, "%s", s->rollout);
            id->attempt = s->attempt;
            id->from_session = 1;
        } else {
            id->task[0] = '\0';
            memcpy(id->rollout, "untracked-", 10);
            px_rand_hex(px, id->rollout + 10, 32);
            id->untracked = 1;
        }
    }
    if ((h = al_http_header_get(head, "x-arclight-attempt"))) {
        int a = 0;
        if (h->n == 0 || h->n > 6) a = -1;
        for (size_t i = 0; i < h->n && a >= 0; i++)
            a = h->p[i] >= '0' && h->p[i] <= '9' ? a * 10 + (h->p[i] - '0') : -1;
        if (a < 0) {
            *err = (px_err){400, "invalid_request_error", "invalid_identity",
                            "X-Arclight-Attempt must be an integer from 0 to 999999"};
            return -1;
        }
        id->attempt = a;
    }
    if ((h = al_http_header_get(head, "x-arclight-eval"))) {
        if (al_slice_eq(*h, "1") || al_slice_caseeq(*h, "true")) {
            id->eval = 1;
        } else if (!al_slice_eq(*h, "0") && !al_slice_caseeq(*h, "false")) {
            *err = (px_err){400, "invalid_request_error", "invalid_eval",
                            "X-Arclight-Eval must be 1 or 0 (true or false)"};
            return -1;
        }
    }
    if ((h = al_http_header_get(head, "x-arclight-eval-temperature")) &&
        px_parse_temperature(h->p, h->n, &id->eval_temperature) != 0) {
        *err = (px_err){400, "invalid_request_error", "invalid_eval_temperature",
                        "X-Arclight-Eval-Temperature must be a number from 0 to 2"};
        return -1;
    }
    return 0;
}

/* With --agent-key configured, a request must carry one of the keys or a session key, as
 * its Bearer token or its x-api-key. */
int px_authorized(proxy *px, const al_http_head *head)
{
    if (!px->cfg.n_agent_keys) return 1;
    al_slice tok;
    if (bearer(head, &tok) && (is_agent_key(px, tok) || px_session_find(px, tok.p, tok.n))) return 1;
    const al_slice *x = al_http_header_get(head, "x-api-key");
    return x && (is_agent_key(px, *x) || px_session_find(px, x->p, x->n));
}

/* A new session key standing for task/rollout/attempt (rollout NULL: a fresh rollout id),
 * recorded in the state file with this turn's flush. NULL when out of memory or randomness. */
session_ent *px_session_new(proxy *px, const char *task, const char *rollout, int attempt,
                            int owner)
{
    session_ent *s = calloc(1, sizeof *s);
    char gen[40];
    if (!rollout) {
        px_rand_hex(px, gen, 32);
        rollout = gen;
    }
    char hex[65];
    if (!s || secret_hex(hex, 24) != 0) {
        free(s);
        return NULL;
    }
    snprintf(s->key, sizeof s->key, "sk-arclight-%s", hex);
    s->task = strdup(task ? task : "");
    s->rollout = strdup(rollout);
    s->attempt = attempt;
    s->created_us = al_now_us();
    s->owner = owner >= -1 && owner < 16 ? owner : -1;
    if (session_add(px, s) != 0) return NULL;
    if (px->state_fd >= 0) {
        s->line_len = session_line(&px->state_pend, s);
        px->state_live += s->line_len;
        event_active(px->flush_ev, EV_TIMEOUT, 1);
    }
    return s;
}

/* Frees the rollout table and the sessions (at exit). */
void px_identity_free(proxy *px)
{
    al_map_free(&px->rtab, free);
    al_map_free(&px->sessions, session_free);
    al_vec_free(&px->dirty);
}
