/*
 * credit.c: rollout assembly, LightningRL decomposition, credit, GRPO groups and advantages
 * (see credit.h). No Kafka here: the unit tests drive it with hand-built spans.
 *
 * Data layout of a part:
 *   rollouts   map (rollout id, attempt) -> open rollout; every tracked rollout (open, or
 *              ended and waiting in a group) is also on `by_first`, in the order of its first
 *              span's offset (creation order), which gives the safe offset's lower bound
 *   open list  open rollouts by last activity (event clock at their latest span): the idle
 *              timeout pops from its head
 *   wait list  rollouts whose end span came before some of their spans (its sequence number
 *              says how many there are), by the time of the end: they settle when the last
 *              missing span arrives, or with what they have after the end wait (its head)
 *   groups     map group key -> open group; also a FIFO by opening time for group timeouts
 *   intervals  sorted, disjoint [lo, hi] offset ranges of emitted groups' first spans that
 *              the safe offset must not fall into
 *   ended      map of recently ended rollouts' keys, with a ring of its entries in end order
 *              (the oldest is forgotten first)
 * Outputs never depend on hash order (the maps are only looked up, and iterated only to be
 * freed): groups emit their members in end order and each rollout its calls in sequence
 * order.
 */
#include "credit.h"

#include "core/hash.h"
#include "core/map.h"
#include "core/util.h"
#include "core/vec.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------------------------
 * Configuration and estimators
 * ------------------------------------------------------------------------------------------ */

static const char *const estimator_names[] = {"grpo", "dr_grpo", "rloo", "reinforce", "none"};

void al_credit_config_init(al_credit_config *c)
{
    memset(c, 0, sizeof *c);
    c->estimator = AL_CREDIT_ESTIMATOR_GRPO;
    c->reward_mode = AL_CREDIT_REWARD_LAST;
    c->assign = AL_CREDIT_ASSIGN_IDENTICAL;
    c->gamma = 1.0;
    c->step_weight = 1.0;
    c->step_state = AL_CREDIT_STATE_OBSERVED;
    c->group_size = 8;
    c->idle_timeout_us = 600LL * 1000000;
    c->end_wait_us = 30LL * 1000000;
    c->group_timeout_us = 1800LL * 1000000;
    c->timeout_policy = AL_CREDIT_POLICY_DROP;
    c->failed_policy = AL_CREDIT_POLICY_DROP;
    c->eps = 1e-6;
    c->reinforce_alpha = 0.1;
}

const char *al_credit_estimator_name(al_credit_estimator e)
{
    return (unsigned)e < AL_ARRAY_LEN(estimator_names) ? estimator_names[e] : "unknown";
}

int al_credit_estimator_parse(const char *name)
{
    for (size_t i = 0; name && i < AL_ARRAY_LEN(estimator_names); i++)
        if (!strcmp(name, estimator_names[i])) return (int)i;
    return -1;
}

void al_credit_moments_of(const double *v, size_t n, al_credit_moments *m)
{
    double sum = 0, var = 0, maxabs = 0;
    for (size_t k = 0; k < n; k++) {
        sum += v[k];
        if (fabs(v[k]) > maxabs) maxabs = fabs(v[k]);
    }
    m->n = n;
    m->sum = sum;
    m->mean = n ? sum / (double)n : 0;
    /* The deviations are scaled by a power of two near the largest |v| (exactly, so the
     * result is the plain formula's, bit for bit, wherever that neither underflows nor
     * overflows): tiny returns keep their spread instead of squaring to 0 unevenly, which
     * would let a z-score exceed sqrt(n - 1). */
    int ex = 0;
    if (maxabs > 0) frexp(maxabs, &ex);
    double scale = ldexp(1.0, ex); /* maxabs < scale <= 2 maxabs, or 1 */
    for (size_t k = 0; k < n; k++) {
        double d = (v[k] - m->mean) / scale;
        var += d * d;
    }
    m->std = n ? sqrt(var / (double)n) * scale : 0;
    m->flat = n <= 1 || m->std <= AL_CREDIT_FLAT * maxabs;
}

double al_credit_advantage_of(al_credit_estimator e, const al_credit_moments *m, double g,
                              double eps)
{
    if (e == AL_CREDIT_ESTIMATOR_NONE) return g;
    if (e == AL_CREDIT_ESTIMATOR_REINFORCE) return m->n ? g - m->mean : 0;
    if (m->flat) return 0.0; /* no spread, or no group to compare with */
    switch (e) {
    case AL_CREDIT_ESTIMATOR_GRPO:
        return (g - m->mean) / (m->std + eps);
    case AL_CREDIT_ESTIMATOR_DR_GRPO:
        return g - m->mean;
    default: /* rloo */
        return g - (m->sum - g) / (double)(m->n - 1);
    }
}

double al_credit_advantage(al_credit_estimator e, const double *scores, size_t n, size_t i,
                           double g, double eps)
{
    al_credit_moments m;
    al_credit_moments_of(scores, n, &m);
    return al_credit_advantage_of(e, &m, e == AL_CREDIT_ESTIMATOR_RLOO && i < n ? scores[i] : g,
                                  eps);
}

/* ------------------------------------------------------------------------------------------
 * State
 * ------------------------------------------------------------------------------------------ */

typedef struct cr_call {
    int64_t seq;
    int32_t *prompt, *resp; /* prompt owns one block that also holds resp, lp and model */
    size_t np, nr;
    float *lp; /* NULL or nr entries */
    int64_t policy_version;
    char *model;
} cr_call;

typedef struct cr_reward {
    int64_t seq;
    char *name;
    double value;
    int64_t after;
} cr_reward;

typedef struct cr_rollout cr_rollout;
struct cr_rollout {
    al_map_entry *entry; /* in p->rollouts while open (key: rollout id \x1f attempt); then NULL */
    char *rollout_id, *task_id, *group_key;
    int32_t attempt;
    int64_t first_offset;
    int64_t last_activity; /* event clock at its latest span */
    int64_t max_ts;
    int seen_seq0;
    cr_call *calls;
    size_t ncalls, capcalls;
    cr_reward *rewards;
    size_t nrewards, caprewards;
    int64_t *other_seqs; /* sequences of end spans (duplicate detection) */
    size_t nother, capother;
    int ended;
    int waiting;      /* its end came, spans before it are missing: on the wait list */
    int64_t end_seq;  /* while waiting: the end span's sequence number */
    int64_t end_at;   /* while waiting: the clock when the end came */
    int end_retried;  /* while waiting: the end said a new attempt replaces this one */
    al_rollout_status status;
    int32_t group_size_hint;
    int kept;
    double score; /* identical credit: R; discounted: the sum of imm (the metrics' value) */
    double *imm, *ret; /* discounted and step credit: r_k and G_k per call (one block of 2
                        * ncalls; 3 under step credit, with sadv) */
    double *sadv;      /* step credit: each call's step-group advantage A_S */
    cr_rollout *open_prev, *open_next;   /* open list, or the wait list while waiting */
    cr_rollout *first_prev, *first_next; /* by_first list (until emitted) */
};

typedef struct cr_group cr_group;
struct cr_group {
    al_map_entry *entry; /* in p->groups until it is emitted */
    const char *key;     /* the entry's key */
    int32_t target;
    int target_set;
    cr_rollout **members; /* in end order */
    size_t nmembers, capmembers;
    int64_t opened; /* clock at its first member's end */
    cr_group *fifo_prev, *fifo_next;
};

#define CR_ENDED_MAX 65536 /* remembered ends per partition (oldest forgotten first) */

typedef struct cr_interval {
    int64_t lo, hi;
} cr_interval;

struct al_credit_part {
    al_credit_config cfg;
    char *reward_name;
    al_credit_sink sink;
    al_credit_stats stats;
    int64_t clock;
    int64_t next_offset; /* one past the last span added; -1 before any */
    int64_t safe;        /* last safe offset returned (never decreases) */
    al_map rollouts;  /* open rollouts (cr_rollout *) by rollout id \x1f attempt */
    al_map groups;    /* open groups (cr_group *) by group key */
    al_map baselines; /* reinforce's running baselines (double *) by group key [\x1f position] */
    cr_rollout *open_head, *open_tail;
    cr_rollout *wait_head, *wait_tail;
    cr_rollout *first_head, *first_tail;
    cr_group *fifo_head, *fifo_tail;
    cr_interval *iv;
    size_t niv, capiv;
    /* exactly-once: the first offsets of the groups emitted at or above the safe offset
     * (sorted), and those a restart must not emit again (al_credit_part_skip_emitted) */
    int64_t *elo, *skip;
    size_t nelo, capelo, nskip;
    int suppress; /* the group being emitted was emitted before the restart */
    /* recently ended rollouts (keys, no values), so that a span arriving after the end is
     * told apart from a new rollout; ering holds their entries in end order from ehead
     * (ended.count of them) and grows to CR_ENDED_MAX */
    al_map ended;
    al_map_entry **ering;
    size_t ehead, eringcap;
    /* scratch buffers for building transitions, reused */
    int32_t *s_resp;
    uint8_t *s_mask;
    float *s_lp;
    float *s_tadv;
    int32_t *s_idx;
    size_t s_cap, s_idxcap;
};

static void rollout_free(cr_rollout *r)
{
    if (!r) return;
    for (size_t i = 0; i < r->ncalls; i++) {
        free(r->calls[i].prompt);
    }
    for (size_t i = 0; i < r->nrewards; i++)
        free(r->rewards[i].name);
    free(r->calls);
    free(r->imm);
    free(r->rewards);
    free(r->other_seqs);
    free(r->rollout_id);
    free(r->task_id);
    free(r->group_key);
    free(r);
}

static void group_free(cr_group *g)
{
    if (!g) return;
    for (size_t i = 0; i < g->nmembers; i++)
        rollout_free(g->members[i]);
    free(g->members);
    free(g);
}

al_credit_part *al_credit_part_new(const al_credit_config *cfg, const al_credit_sink *sink,
                                   char *errstr, size_t errlen)
{
    if (!sink || !sink->transition) {
        al_err(errstr, errlen, "credit: no transition sink");
        return NULL;
    }
    if (cfg->group_size < 1) {
        al_err(errstr, errlen, "credit: group size must be at least 1 (got %d)", cfg->group_size);
        return NULL;
    }
    if (!(cfg->gamma >= 0 && cfg->gamma <= 1)) {
        al_err(errstr, errlen, "credit: gamma must be within [0, 1] (got %g)", cfg->gamma);
        return NULL;
    }
    if (cfg->assign == AL_CREDIT_ASSIGN_STEP &&
        (!(cfg->step_weight >= 0 && cfg->step_weight <= 100) ||
         cfg->estimator == AL_CREDIT_ESTIMATOR_REINFORCE)) {
        al_err(errstr, errlen,
               "credit: step credit needs a step weight within [0, 100] (got %g) and an estimator "
               "that compares within a group (grpo, dr_grpo, rloo, none; not reinforce)",
               cfg->step_weight);
        return NULL;
    }
    if ((unsigned)cfg->assign > AL_CREDIT_ASSIGN_STEP ||
        (unsigned)cfg->step_state > AL_CREDIT_STATE_OBSERVED) {
        al_err(errstr, errlen, "credit: unknown credit assignment %d or step state %d",
               (int)cfg->assign, (int)cfg->step_state);
        return NULL;
    }
    if (cfg->reward_mode == AL_CREDIT_REWARD_NAMED && (!cfg->reward_name || !*cfg->reward_name)) {
        al_err(errstr, errlen, "credit: reward mode 'named' needs a reward name");
        return NULL;
    }
    if (!(fabs(cfg->timeout_reward) <= AL_REWARD_MAX) ||
        !(fabs(cfg->failed_reward) <= AL_REWARD_MAX)) {
        al_err(errstr, errlen,
               "credit: the timeout and failed rewards must be numbers within +-%g (got %g, %g)",
               AL_REWARD_MAX, cfg->timeout_reward, cfg->failed_reward);
        return NULL;
    }
    if ((unsigned)cfg->estimator > AL_CREDIT_ESTIMATOR_NONE || cfg->idle_timeout_us < 0 ||
        cfg->group_timeout_us < 0 || cfg->end_wait_us < 0 || !(cfg->eps >= 0) ||
        !(cfg->reinforce_alpha > 0 && cfg->reinforce_alpha <= 1)) {
        al_err(errstr, errlen,
               "credit: bad configuration (estimator, timeouts >= 0, eps >= 0, alpha in (0, 1])");
        return NULL;
    }
    al_credit_part *p = calloc(1, sizeof *p);
    if (!p) {
        al_err(errstr, errlen, "out of memory");
        return NULL;
    }
    p->cfg = *cfg;
    if (cfg->reward_name && !(p->reward_name = strdup(cfg->reward_name))) {
        free(p);
        al_err(errstr, errlen, "out of memory");
        return NULL;
    }
    p->cfg.reward_name = p->reward_name;
    p->sink = *sink;
    p->next_offset = -1;
    p->safe = -1;
    return p;
}

void al_credit_part_free(al_credit_part *p)
{
    if (!p) return;
    /* Every tracked rollout is on by_first (open ones and group members). */
    for (cr_rollout *r = p->first_head, *n; r; r = n) {
        n = r->first_next;
        rollout_free(r);
    }
    al_map_iter it;
    al_map_iter_init(&it, &p->groups);
    for (al_map_entry *e; (e = al_map_iter_next(&it));) {
        cr_group *g = e->value;
        g->nmembers = 0; /* freed above */
        group_free(g);
    }
    al_map_free(&p->groups, NULL);
    al_map_free(&p->rollouts, NULL);
    al_map_free(&p->baselines, free);
    al_map_free(&p->ended, NULL);
    free(p->ering);
    free(p->iv);
    free(p->elo);
    free(p->skip);
    free(p->s_resp);
    free(p->s_mask);
    free(p->s_lp);
    free(p->s_tadv);
    free(p->s_idx);
    free(p->reward_name);
    free(p);
}

int64_t al_credit_part_clock(const al_credit_part *p)
{
    return p->clock;
}

const al_credit_stats *al_credit_part_stats(const al_credit_part *p)
{
    return &p->stats;
}

/* ------------------------------------------------------------------------------------------
 * Lists
 * ------------------------------------------------------------------------------------------ */

/* The open list and the wait list share a rollout's open_prev/open_next: a rollout is on
 * one of them until it ends. */
static void list_unlink(cr_rollout **head, cr_rollout **tail, cr_rollout *r)
{
    if (r->open_prev)
        r->open_prev->open_next = r->open_next;
    else
        *head = r->open_next;
    if (r->open_next)
        r->open_next->open_prev = r->open_prev;
    else
        *tail = r->open_prev;
    r->open_prev = r->open_next = NULL;
}

static void list_append(cr_rollout **head, cr_rollout **tail, cr_rollout *r)
{
    r->open_prev = *tail;
    r->open_next = NULL;
    if (*tail)
        (*tail)->open_next = r;
    else
        *head = r;
    *tail = r;
}

static void open_unlink(al_credit_part *p, cr_rollout *r)
{
    if (r->waiting)
        list_unlink(&p->wait_head, &p->wait_tail, r);
    else
        list_unlink(&p->open_head, &p->open_tail, r);
}

static void open_append(al_credit_part *p, cr_rollout *r)
{
    list_append(&p->open_head, &p->open_tail, r);
}

static void first_unlink(al_credit_part *p, cr_rollout *r)
{
    if (r->first_prev)
        r->first_prev->first_next = r->first_next;
    else
        p->first_head = r->first_next;
    if (r->first_next)
        r->first_next->first_prev = r->first_prev;
    else
        p->first_tail = r->first_prev;
    r->first_prev = r->first_next = NULL;
}

static void fifo_unlink(al_credit_part *p, cr_group *g)
{
    if (g->fifo_prev)
        g->fifo_prev->fifo_next = g->fifo_next;
    else
        p->fifo_head = g->fifo_next;
    if (g->fifo_next)
        g->fifo_next->fifo_prev = g->fifo_prev;
    else
        p->fifo_tail = g->fifo_prev;
    g->fifo_prev = g->fifo_next = NULL;
}

/* Adds [lo, hi] to the sorted, disjoint interval list, merging overlapping or touching
 * neighbours. 0, or -1 out of memory. */
static int interval_add(al_credit_part *p, int64_t lo, int64_t hi)
{
    size_t i = 0;
    while (i < p->niv && p->iv[i].hi < lo)
        i++;
    size_t j = i;
    while (j < p->niv && p->iv[j].lo <= hi) {
        if (p->iv[j].lo < lo) lo = p->iv[j].lo;
        if (p->iv[j].hi > hi) hi = p->iv[j].hi;
        j++;
    }
    if (j > i) { /* replace iv[i..j) by one */
        p->iv[i].lo = lo;
        p->iv[i].hi = hi;
        memmove(&p->iv[i + 1], &p->iv[j], (p->niv - j) * sizeof *p->iv);
        p->niv -= j - i - 1;
        return 0;
    }
    if (al_vec_grow((void **)&p->iv, &p->capiv, p->niv + 1, sizeof *p->iv)) return -1;
    memmove(&p->iv[i + 1], &p->iv[i], (p->niv - i) * sizeof *p->iv);
    p->iv[i].lo = lo;
    p->iv[i].hi = hi;
    p->niv++;
    return 0;
}

int64_t al_credit_part_safe_offset(al_credit_part *p)
{
    if (p->next_offset < 0) return -1;
    int64_t s = p->first_head ? p->first_head->first_offset : p->next_offset;
    /* Drop intervals wholly below s; then step down to the start of the one s falls in. */
    size_t k = 0;
    while (k < p->niv && p->iv[k].hi < s)
        k++;
    if (k) {
        memmove(p->iv, p->iv + k, (p->niv - k) * sizeof *p->iv);
        p->niv -= k;
    }
    if (p->niv && p->iv[0].lo < s && s <= p->iv[0].hi) s = p->iv[0].lo;
    if (s < p->safe) s = p->safe; /* cannot happen (see credit.h); keep the promise anyway */
    p->safe = s;
    size_t e = 0;
    while (e < p->nelo && p->elo[e] < s)
        e++;
    if (e) {
        memmove(p->elo, p->elo + e, (p->nelo - e) * sizeof *p->elo);
        p->nelo -= e;
    }
    return s;
}

/* ------------------------------------------------------------------------------------------
 * Credit and emission
 * ------------------------------------------------------------------------------------------ */

/* Whether reward w counts for this configuration (named mode: only that name). */
static int reward_counts(const al_credit_part *p, const cr_reward *w)
{
    return p->cfg.reward_mode != AL_CREDIT_REWARD_NAMED || !strcmp(w->name, p->reward_name);
}

/* The rollout's reward R in identical mode; *found says whether any reward applied. */
static double rollout_reward(const al_credit_part *p, const cr_rollout *r, int *found)
{
    double v = 0;
    *found = 0;
    for (size_t i = 0; i < r->nrewards; i++) { /* rewards are in sequence order */
        if (!reward_counts(p, &r->rewards[i])) continue;
        if (p->cfg.reward_mode == AL_CREDIT_REWARD_SUM)
            v += r->rewards[i].value;
        else
            v = r->rewards[i].value;
        *found = 1;
    }
    return v;
}

/* Per-call immediate rewards rk[k] (k over the rollout's calls) for discounted assignment:
 * each counted reward goes to the last call at or before its after_sequence (the first call
 * when none). *found says whether any reward applied. */
static void call_rewards(const al_credit_part *p, const cr_rollout *r, double *rk, int *found)
{
    *found = 0;
    for (size_t k = 0; k < r->ncalls; k++)
        rk[k] = 0;
    if (!r->ncalls) return;
    for (size_t i = 0; i < r->nrewards; i++) {
        const cr_reward *w = &r->rewards[i];
        if (!reward_counts(p, w)) continue;
        size_t at = 0;
        for (size_t k = 0; k < r->ncalls; k++)
            if (r->calls[k].seq <= w->after) at = k;
        rk[at] += w->value;
        *found = 1;
    }
}

/* Returns G[k] for every call from immediate rewards: G[k] = r[k] + gamma * G[k+1]. */
static void discounted_returns(const double *rk, size_t n, double gamma, double *g)
{
    double acc = 0;
    for (size_t k = n; k-- > 0;) {
        acc = rk[k] + gamma * acc;
        g[k] = acc;
    }
}

/* The sum of the rollout's counted rewards (discounted credit's metric value of a rollout
 * without calls). */
static double reward_sum(const al_credit_part *p, const cr_rollout *r, int *found)
{
    double v = 0;
    *found = 0;
    for (size_t i = 0; i < r->nrewards; i++)
        if (reward_counts(p, &r->rewards[i])) {
            v += r->rewards[i].value;
            *found = 1;
        }
    return v;
}

/* Decides whether an ended rollout trains and what it scores (see credit.h, "Credit,
 * exactly"): fills r->kept and r->score, and under discounted credit r->imm and r->ret.
 * 0, or -1 out of memory. */
static int rollout_settle(al_credit_part *p, cr_rollout *r)
{
    al_credit_policy pol = AL_CREDIT_POLICY_KEEP;
    double dflt = 0;
    if (r->status == AL_ROLLOUT_STATUS_FAILED || r->status == AL_ROLLOUT_STATUS_ABORTED) {
        pol = p->cfg.failed_policy;
        dflt = p->cfg.failed_reward;
    } else if (r->status == AL_ROLLOUT_STATUS_TIMEOUT) {
        pol = p->cfg.timeout_policy;
        dflt = p->cfg.timeout_reward;
    }
    r->kept = pol == AL_CREDIT_POLICY_KEEP;
    if (!r->kept) {
        p->stats.rollouts_dropped++;
        return 0;
    }
    int found = 0;
    if (p->cfg.assign == AL_CREDIT_ASSIGN_IDENTICAL) {
        r->score = rollout_reward(p, r, &found);
        if (!found) r->score = dflt;
    } else if (!r->ncalls) {
        r->score = reward_sum(p, r, &found);
        if (!found) r->score = dflt;
    } else {
        int step = p->cfg.assign == AL_CREDIT_ASSIGN_STEP;
        if (!(r->imm = malloc((step ? 3 : 2) * r->ncalls * sizeof *r->imm))) return -1;
        r->ret = r->imm + r->ncalls;
        if (step) r->sadv = r->ret + r->ncalls;
        call_rewards(p, r, r->imm, &found);
        if (!found) r->imm[r->ncalls - 1] = dflt;
        discounted_returns(r->imm, r->ncalls, p->cfg.gamma, r->ret);
        r->score = 0;
        for (size_t k = 0; k < r->ncalls; k++)
            r->score += r->imm[k];
    }
    if (!found) p->stats.rollouts_no_reward++;
    if (p->sink.rollout) p->sink.rollout(p->sink.ud, r->score);
    return 0;
}

static int ensure_scratch(al_credit_part *p, size_t n, size_t nidx)
{
    if (n > p->s_cap) {
        size_t c = n * 2;
        int32_t *a = realloc(p->s_resp, c * sizeof *a);
        if (a) p->s_resp = a;
        uint8_t *b = realloc(p->s_mask, c);
        if (b) p->s_mask = b;
        float *f = realloc(p->s_lp, c * sizeof *f);
        if (f) p->s_lp = f;
        float *g = realloc(p->s_tadv, c * sizeof *g);
        if (g) p->s_tadv = g;
        if (!a || !b || !f || !g) return -1;
        p->s_cap = c;
    }
    if (nidx > p->s_idxcap) {
        int32_t *a = realloc(p->s_idx, nidx * 2 * sizeof *a);
        if (!a) return -1;
        p->s_idx = a;
        p->s_idxcap = nidx * 2;
    }
    return 0;
}

/* Whether call b's prompt begins exactly with call a's prompt followed by its response. */
static int extends(const cr_call *a, const cr_call *b)
{
    if (b->np < a->np + a->nr) return 0;
    return !memcmp(b->prompt, a->prompt, a->np * sizeof(int32_t)) &&
           !memcmp(b->prompt + a->np, a->resp, a->nr * sizeof(int32_t));
}

/* What a group's advantages are computed from: per position (one under identical credit,
 * every call position under discounted credit) the moments of its returns and, for
 * reinforce, the task's baseline before this group. */
typedef struct cr_credit {
    const al_credit_moments *mo;
    const double *base;
} cr_credit;

/* The advantage of call k of rollout r (see credit.h, "Credit, exactly"). */
static double call_advantage(const al_credit_part *p, const cr_credit *cc, const cr_rollout *r,
                             size_t k)
{
    int disc = p->cfg.assign != AL_CREDIT_ASSIGN_IDENTICAL; /* per position */
    double g = disc ? r->ret[k] : r->score;
    size_t pos = disc ? k : 0;
    if (p->cfg.estimator == AL_CREDIT_ESTIMATOR_REINFORCE) return g - cc->base[pos];
    double a = al_credit_advantage_of(p->cfg.estimator, &cc->mo[pos], g, p->cfg.eps);
    if (p->cfg.assign == AL_CREDIT_ASSIGN_STEP) a += p->cfg.step_weight * r->sadv[k];
    return a;
}

/* Emits the transitions of one training member r of group g. 0, or -1 (errstr). */
static int emit_rollout(al_credit_part *p, const cr_group *g, const cr_rollout *r,
                        const cr_credit *cc, int64_t anchor, const char *group_id, int32_t gsize,
                        int64_t ts, char *errstr, size_t errlen)
{
    int disc = p->cfg.assign != AL_CREDIT_ASSIGN_IDENTICAL; /* per-call rewards and returns */
    int rc = 0;
    for (size_t k = 0; k < r->ncalls && !rc;) {
        /* calls k..e-1 form one sequence */
        size_t e = k + 1;
        if (p->cfg.merge)
            while (e < r->ncalls && extends(&r->calls[e - 1], &r->calls[e]))
                e++;
        const cr_call *c0 = &r->calls[k];
        const cr_call *cl = &r->calls[e - 1];
        size_t ntok = e - k == 1 ? c0->nr : cl->np + cl->nr - c0->np;
        int have_lp = 1;
        int64_t pv = -1;
        double reward = disc ? 0 : r->score;
        for (size_t j = k; j < e; j++) {
            const cr_call *c = &r->calls[j];
            if (!c->lp) have_lp = 0;
            if (c->policy_version >= 0 && (pv < 0 || c->policy_version < pv))
                pv = c->policy_version;
            if (disc) reward += r->imm[j];
        }
        if (ensure_scratch(p, ntok, e - k)) {
            rc = al_err(errstr, errlen, "out of memory");
            break;
        }
        size_t at = 0;
        int masked = 0;
        for (size_t j = k; j < e; j++) {
            const cr_call *c = &r->calls[j];
            if (j > k) { /* the tokens the agent added between two calls */
                size_t from = r->calls[j - 1].np + r->calls[j - 1].nr;
                size_t add = c->np - from;
                memcpy(p->s_resp + at, c->prompt + from, add * sizeof(int32_t));
                memset(p->s_mask + at, 0, add);
                for (size_t t = 0; t < add; t++)
                    p->s_lp[at + t] = 0;
                if (add) masked = 1;
                at += add;
            }
            memcpy(p->s_resp + at, c->resp, c->nr * sizeof(int32_t));
            memset(p->s_mask + at, 1, c->nr);
            if (c->lp) memcpy(p->s_lp + at, c->lp, c->nr * sizeof(float));
            at += c->nr;
            p->s_idx[j - k] = (int32_t)c->seq;
        }
        double adv = call_advantage(p, cc, r, k);
        /* A merged sequence under discounting: each call's tokens get their own call's
         * advantage (the scalar is the first call's); the agent's tokens get 0. */
        int per_token = disc && e - k > 1;
        if (per_token) {
            size_t pos = 0;
            for (size_t j = k; j < e; j++) {
                const cr_call *c = &r->calls[j];
                if (j > k) {
                    size_t add = c->np - (r->calls[j - 1].np + r->calls[j - 1].nr);
                    for (size_t t = 0; t < add; t++)
                        p->s_tadv[pos++] = 0;
                }
                float a = (float)(j == k ? adv : call_advantage(p, cc, r, j));
                for (size_t t = 0; t < c->nr; t++)
                    p->s_tadv[pos++] = a;
            }
        }
        char id[512];
        al_transition_id(id, sizeof id, r->rollout_id, r->attempt, (int32_t)c0->seq);
        al_transition t = {
            .id = id,
            .group_key = g->key,
            .group_id = group_id,
            .group_size = gsize,
            .task_id = r->task_id,
            .rollout_id = r->rollout_id,
            .attempt = r->attempt,
            .call_indices = p->s_idx,
            .n_call_indices = e - k,
            .prompt_token_ids = c0->prompt,
            .n_prompt_tokens = c0->np,
            .response_token_ids = p->s_resp,
            .n_response_tokens = at,
            .loss_mask = masked ? p->s_mask : NULL,
            .n_loss_mask = masked ? at : 0,
            .rollout_logprobs = have_lp ? p->s_lp : NULL,
            .n_rollout_logprobs = have_lp ? at : 0,
            .reward = reward,
            .return_value = disc ? r->ret[k] : r->score,
            .advantage = adv,
            .token_advantages = per_token ? p->s_tadv : NULL,
            .n_token_advantages = per_token ? at : 0,
            .estimator = al_credit_estimator_name(p->cfg.estimator),
            .policy_version = pv,
            .model = c0->model,
            .timestamp_us = ts,
        };
        if (p->suppress) {
            p->stats.transitions_replayed++;
        } else if (p->sink.transition(p->sink.ud, &t, anchor) != 0) {
            rc = al_err(errstr, errlen, "transition %s was not accepted by the sink", id);
            break;
        } else {
            p->stats.transitions++;
        }
        k = e;
    }
    return rc;
}

/* The running baseline of key, made (*created 1, value unset) when absent; NULL when out
 * of memory. */
static double *baseline_get(al_credit_part *p, const char *key, int *created)
{
    al_map_entry *e = al_map_upsertn(&p->baselines, key, strlen(key), created);
    if (!e) return NULL;
    if (*created && !(e->value = malloc(sizeof(double)))) {
        al_map_remove_entry(&p->baselines, e);
        return NULL;
    }
    return e->value;
}

/* Records that the group whose earliest first span is at `lo` was emitted (lo increases
 * from group to group only roughly: kept sorted). 0, or -1 out of memory. */
static int emitted_add(al_credit_part *p, int64_t lo)
{
    if (al_vec_grow((void **)&p->elo, &p->capelo, p->nelo + 1, sizeof *p->elo)) return -1;
    size_t i = p->nelo;
    while (i > 0 && p->elo[i - 1] > lo)
        i--;
    memmove(&p->elo[i + 1], &p->elo[i], (p->nelo - i) * sizeof *p->elo);
    p->elo[i] = lo;
    p->nelo++;
    return 0;
}

/* 1 (and forgets it) when the group at `lo` is one a restart must not emit again. */
static int skip_take(al_credit_part *p, int64_t lo)
{
    for (size_t i = 0; i < p->nskip; i++)
        if (p->skip[i] == lo) {
            p->skip[i] = p->skip[--p->nskip];
            return 1;
        }
    return 0;
}

/* One call of a group's training member, for forming step groups. */
typedef struct cr_stepref {
    uint64_t h;         /* hash of the call's state */
    const int32_t *st;  /* the state's token ids (ns of them) */
    size_t ns;
    cr_rollout *r;
    size_t member, k; /* the member's index in the group (end order), the call's position */
} cr_stepref;

/* Orders calls by state (hash, then length, then the ids themselves), then by member and
 * call position: equal states are adjacent, and within a step group the order is the
 * group's end order, so that its sums are taken in a fixed order (byte-identical replays). */
static int stepref_cmp(const void *pa, const void *pb)
{
    const cr_stepref *a = pa, *b = pb;
    if (a->h != b->h) return a->h < b->h ? -1 : 1;
    if (a->ns != b->ns) return a->ns < b->ns ? -1 : 1;
    int c = memcmp(a->st, b->st, a->ns * sizeof(int32_t));
    if (c) return c;
    if (a->member != b->member) return a->member < b->member ? -1 : 1;
    return a->k < b->k ? -1 : a->k > b->k;
}

static int stepref_same_state(const cr_stepref *a, const cr_stepref *b)
{
    return a->h == b->h && a->ns == b->ns && !memcmp(a->st, b->st, a->ns * sizeof(int32_t));
}

/* Writes the states of r's calls into buf (room for the sum of their prompt lengths) and
 * points refs[0..ncalls) at them (credit.h, "Step credit"): under AL_CREDIT_STATE_PROMPT
 * each call's prompt; under AL_CREDIT_STATE_OBSERVED, a call whose prompt extends the
 * previous call's prompt and response has the previous call's state followed by what
 * came after that response (the model's own earlier answers left out), any other call its
 * prompt. Returns the ids written. */
static size_t step_states(const al_credit_part *p, cr_rollout *r, size_t member, int32_t *buf,
                          cr_stepref *refs)
{
    size_t used = 0;
    for (size_t k = 0; k < r->ncalls; k++) {
        const cr_call *c = &r->calls[k];
        int32_t *st = buf + used;
        size_t ns;
        if (p->cfg.step_state == AL_CREDIT_STATE_OBSERVED && k && extends(&c[-1], c)) {
            size_t from = c[-1].np + c[-1].nr, prev = refs[k - 1].ns;
            memcpy(st, refs[k - 1].st, prev * sizeof(int32_t));
            memcpy(st + prev, c->prompt + from, (c->np - from) * sizeof(int32_t));
            ns = prev + c->np - from;
        } else {
            memcpy(st, c->prompt, c->np * sizeof(int32_t));
            ns = c->np;
        }
        used += ns;
        refs[k] = (cr_stepref){.h = al_hash_fnv1a(st, ns * sizeof(int32_t)),
                               .st = st,
                               .ns = ns,
                               .r = r,
                               .member = member,
                               .k = k};
    }
    return used;
}

/* Step credit: fills r->sadv[k] for every call of g's training members with its step
 * group's advantage (credit.h, "Step credit"); *spread is set when some step group has a
 * spread. 0, or -1 out of memory. */
static int step_groups_assign(al_credit_part *p, cr_group *g, int *spread)
{
    size_t n = 0, ntok = 0;
    for (size_t i = 0; i < g->nmembers; i++)
        if (g->members[i]->kept)
            for (size_t k = 0; k < g->members[i]->ncalls; k++) {
                n++;
                ntok += g->members[i]->calls[k].np;
            }
    *spread = 0;
    if (!n) return 0;
    cr_stepref *refs = malloc(n * sizeof *refs);
    double *vals = malloc(n * sizeof *vals);
    int32_t *states = malloc((ntok ? ntok : 1) * sizeof *states);
    if (!refs || !vals || !states) {
        free(refs);
        free(vals);
        free(states);
        return -1;
    }
    size_t m = 0, used = 0;
    for (size_t i = 0; i < g->nmembers; i++) {
        cr_rollout *r = g->members[i];
        if (!r->kept) continue;
        used += step_states(p, r, i, states + used, refs + m);
        m += r->ncalls;
    }
    qsort(refs, n, sizeof *refs, stepref_cmp);
    for (size_t a = 0; a < n;) {
        size_t b = a + 1;
        while (b < n && stepref_same_state(&refs[a], &refs[b]))
            b++;
        for (size_t j = a; j < b; j++)
            vals[j - a] = refs[j].r->ret[refs[j].k];
        al_credit_moments mo;
        al_credit_moments_of(vals, b - a, &mo);
        if (!mo.flat) *spread = 1;
        for (size_t j = a; j < b; j++) /* no twin: 0, whatever the estimator */
            refs[j].r->sadv[refs[j].k] =
                b - a < 2 ? 0
                          : al_credit_advantage_of(p->cfg.estimator, &mo, vals[j - a], p->cfg.eps);
        a = b;
    }
    free(refs);
    free(vals);
    free(states);
    return 0;
}

/* Completes group g: computes the statistics over its training members (kept, with a
 * call), emits their transitions (or drops the group), records its offset range, frees it.
 * It leaves p->groups at the end, with its key (the map entry's). 0, or -1 (errstr). */
static int group_emit(al_credit_part *p, cr_group *g, int timed_out, char *errstr, size_t errlen)
{
    int rc = 0;
    fifo_unlink(p, g);
    p->stats.open_groups--;
    if (timed_out) p->stats.groups_timed_out++;

    int disc = p->cfg.assign != AL_CREDIT_ASSIGN_IDENTICAL; /* statistics per position */
    int64_t lo = INT64_MAX, hi = -1, ts = 0;
    size_t n = 0, npos = disc ? 0 : 1;
    for (size_t i = 0; i < g->nmembers; i++) {
        cr_rollout *r = g->members[i];
        if (r->first_offset < lo) lo = r->first_offset;
        if (r->first_offset > hi) hi = r->first_offset;
        if (r->max_ts > ts) ts = r->max_ts;
        if (r->kept && r->ncalls) {
            n++;
            if (disc && r->ncalls > npos) npos = r->ncalls;
        }
    }
    /* per position: the members' returns there, their moments, reinforce's baseline */
    double *vals = malloc((n ? n : 1) * sizeof *vals);
    double *base = calloc(npos ? npos : 1, sizeof *base);
    al_credit_moments *mo = calloc(npos ? npos : 1, sizeof *mo);
    if (!vals || !base || !mo) rc = al_err(errstr, errlen, "out of memory");
    int all_flat = 1;
    for (size_t k = 0; !rc && k < npos; k++) {
        size_t m = 0;
        for (size_t i = 0; i < g->nmembers; i++) {
            const cr_rollout *r = g->members[i];
            if (!r->kept || !r->ncalls) continue;
            if (!disc)
                vals[m++] = r->score;
            else if (r->ncalls > k)
                vals[m++] = r->ret[k];
        }
        al_credit_moments_of(vals, m, &mo[k]);
        if (!mo[k].flat) all_flat = 0;
    }
    if (!rc && p->cfg.assign == AL_CREDIT_ASSIGN_STEP) {
        int spread = 0;
        if (step_groups_assign(p, g, &spread) != 0) rc = al_err(errstr, errlen, "out of memory");
        if (spread) all_flat = 0;
    }

    if (!rc && n == 0) {
        p->stats.groups_dropped_empty++;
    } else if (!rc && p->cfg.drop_equal_groups && all_flat) {
        p->stats.groups_dropped_equal++;
    } else if (!rc) {
        if (p->cfg.estimator == AL_CREDIT_ESTIMATOR_REINFORCE)
            for (size_t k = 0; !rc && k < npos; k++) {
                /* the task's baseline (under discounted credit, of position k) */
                char key[1100];
                if (disc)
                    snprintf(key, sizeof key, "%s\x1f%zu", g->key, k);
                else
                    snprintf(key, sizeof key, "%s", g->key);
                int created;
                double *b = baseline_get(p, key, &created);
                if (!b) {
                    rc = al_err(errstr, errlen, "out of memory");
                    break;
                }
                if (created) *b = mo[k].mean; /* its first group: its own mean */
                base[k] = *b;
                *b += p->cfg.reinforce_alpha * (mo[k].mean - *b);
            }
        /* The group id: the group key and the first member (in end order) to end. */
        const cr_rollout *f = g->members[0];
        char gid[1024];
        snprintf(gid, sizeof gid, "%s/%s:%d", g->key, f->rollout_id, f->attempt);
        cr_credit cc = {.mo = mo, .base = base};
        p->suppress = skip_take(p, lo);
        if (p->suppress) p->stats.groups_replayed++;
        for (size_t i = 0; !rc && i < g->nmembers; i++) {
            const cr_rollout *r = g->members[i];
            if (!r->kept || !r->ncalls) continue;
            rc = emit_rollout(p, g, r, &cc, lo, gid, (int32_t)n, ts, errstr, errlen);
        }
        if (!rc && !p->suppress) p->stats.groups_completed++;
    }
    /* a held-back group is named already (al_credit_part_skip_emitted) */
    if (hi >= 0 && !p->suppress && emitted_add(p, lo) != 0 && !rc)
        rc = al_err(errstr, errlen, "out of memory");
    p->suppress = 0;
    free(vals);
    free(base);
    free(mo);
    if (hi >= 0 && interval_add(p, lo, hi) != 0 && !rc)
        rc = al_err(errstr, errlen, "out of memory");
    for (size_t i = 0; i < g->nmembers; i++)
        first_unlink(p, g->members[i]);
    al_map_remove_entry(&p->groups, g->entry);
    group_free(g);
    return rc;
}

/* Remembers that the rollout with key[0..klen) ended; the oldest memory goes beyond
 * CR_ENDED_MAX. 0, or -1 out of memory. */
static int ended_remember(al_credit_part *p, const char *key, size_t klen)
{
    if (al_map_findn(&p->ended, key, klen)) return 0;
    size_t n = p->ended.count;
    if (n == p->eringcap && p->eringcap < CR_ENDED_MAX) {
        /* the ring grows with use (a full-size ring is 512 KB per partition) */
        size_t cap = p->eringcap ? p->eringcap * 2 : 64;
        if (cap > CR_ENDED_MAX) cap = CR_ENDED_MAX;
        al_map_entry **ring = malloc(cap * sizeof *ring);
        if (!ring) return -1;
        for (size_t i = 0; i < n; i++)
            ring[i] = p->ering[(p->ehead + i) % p->eringcap];
        free(p->ering);
        p->ering = ring;
        p->eringcap = cap;
        p->ehead = 0;
    }
    if (n == p->eringcap) { /* full: the oldest goes */
        al_map_remove_entry(&p->ended, p->ering[p->ehead]);
        p->ehead = (p->ehead + 1) % p->eringcap;
    }
    al_map_entry *e = al_map_upsertn(&p->ended, key, klen, NULL);
    if (!e) return -1;
    p->ering[(p->ehead + p->ended.count - 1) % p->eringcap] = e;
    return 0;
}

/* Ends rollout r (end span or idle timeout): takes it out of the open state, then either
 * skips it (a remnant without its sequence-0 span, or an attempt whose end says it was
 * retried) or settles it and adds it to its group, which may complete. 0, or -1 (errstr). */
static int rollout_end(al_credit_part *p, cr_rollout *r, int retried, char *errstr, size_t errlen)
{
    /* its key lives in its entry of p->rollouts: remembered before the entry goes */
    int oom = ended_remember(p, r->entry->key, r->entry->klen);
    al_map_remove_entry(&p->rollouts, r->entry);
    r->entry = NULL;
    open_unlink(p, r);
    if (r->waiting) p->stats.rollouts_waiting--;
    r->waiting = 0;
    p->stats.open_rollouts--;
    r->ended = 1;
    if (oom) return al_err(errstr, errlen, "out of memory");
    if (!r->seen_seq0 || retried) { /* a remnant, or an attempt replaced by a new one */
        if (retried)
            p->stats.rollouts_retried++;
        else
            p->stats.rollouts_skipped++;
        first_unlink(p, r);
        rollout_free(r);
        return 0;
    }
    if (rollout_settle(p, r)) {
        first_unlink(p, r);
        rollout_free(r);
        return al_err(errstr, errlen, "out of memory");
    }
    int created;
    al_map_entry *ge = al_map_upsertn(&p->groups, r->group_key, strlen(r->group_key), &created);
    cr_group *g = ge ? ge->value : NULL;
    if (ge && created && !(g = calloc(1, sizeof *g))) al_map_remove_entry(&p->groups, ge);
    if (!g) {
        first_unlink(p, r);
        rollout_free(r);
        return al_err(errstr, errlen, "out of memory");
    }
    if (created) {
        ge->value = g;
        g->entry = ge;
        g->key = ge->key;
        /* No task id: the rollout is its own group. */
        g->target = r->task_id[0] ? p->cfg.group_size : 1;
        g->opened = p->clock;
        g->fifo_prev = p->fifo_tail;
        if (p->fifo_tail)
            p->fifo_tail->fifo_next = g;
        else
            p->fifo_head = g;
        p->fifo_tail = g;
        p->stats.open_groups++;
    }
    if (!g->target_set && r->group_size_hint > 0 && r->task_id[0]) {
        g->target = r->group_size_hint; /* the first end that knows the size sets it */
        g->target_set = 1;
    }
    if (al_vec_grow((void **)&g->members, &g->capmembers, g->nmembers + 1, sizeof *g->members)) {
        first_unlink(p, r);
        rollout_free(r);
        return al_err(errstr, errlen, "out of memory");
    }
    g->members[g->nmembers++] = r;
    if ((int32_t)g->nmembers >= g->target) return group_emit(p, g, 0, errstr, errlen);
    return 0;
}

/* Whether more than `limit` has passed from `since` to `now`. Timestamps come from spans
 * (any int64), so the difference is taken without overflowing. */
static int passed(int64_t since, int64_t now, int64_t limit)
{
    return now > since && (uint64_t)now - (uint64_t)since > (uint64_t)limit;
}

/* Fires idle timeouts (head of the open list) and group timeouts (head of the FIFO). */
static int fire_timeouts(al_credit_part *p, char *errstr, size_t errlen)
{
    if (p->cfg.idle_timeout_us > 0)
        while (p->open_head &&
               passed(p->open_head->last_activity, p->clock, p->cfg.idle_timeout_us)) {
            cr_rollout *r = p->open_head;
            r->status = AL_ROLLOUT_STATUS_TIMEOUT;
            p->stats.rollouts_timed_out++;
            if (rollout_end(p, r, 0, errstr, errlen)) return -1;
        }
    /* Ends whose missing spans did not come within the end wait settle with what they
     * have; a missing span that comes later is a late span. */
    while (p->wait_head && passed(p->wait_head->end_at, p->clock, p->cfg.end_wait_us)) {
        cr_rollout *r = p->wait_head;
        p->stats.rollouts_incomplete++;
        if (rollout_end(p, r, r->end_retried, errstr, errlen)) return -1;
    }
    if (p->cfg.group_timeout_us > 0)
        while (p->fifo_head && passed(p->fifo_head->opened, p->clock, p->cfg.group_timeout_us))
            if (group_emit(p, p->fifo_head, 1, errstr, errlen)) return -1;
    return 0;
}

int al_credit_part_advance(al_credit_part *p, int64_t clock_us, char *errstr, size_t errlen)
{
    if (clock_us > p->clock) p->clock = clock_us;
    return fire_timeouts(p, errstr, errlen);
}

/* ------------------------------------------------------------------------------------------
 * Adding spans
 * ------------------------------------------------------------------------------------------ */

static int reject(const char **code, const char *c, char *reason, size_t reasonlen, const char *fmt,
                  ...) __attribute__((format(printf, 5, 6)));
static int reject(const char **code, const char *c, char *reason, size_t reasonlen, const char *fmt,
                  ...)
{
    va_list ap;
    *code = c;
    va_start(ap, fmt);
    if (reason && reasonlen) vsnprintf(reason, reasonlen, fmt, ap);
    va_end(ap);
    return 1;
}

static int seq_seen(const cr_rollout *r, int64_t seq)
{
    for (size_t i = 0; i < r->ncalls; i++)
        if (r->calls[i].seq == seq) return 1;
    for (size_t i = 0; i < r->nrewards; i++)
        if (r->rewards[i].seq == seq) return 1;
    for (size_t i = 0; i < r->nother; i++)
        if (r->other_seqs[i] == seq) return 1;
    return 0;
}

/* How many of r's spans have a sequence number below n (each number is there once). */
static int64_t seqs_below(const cr_rollout *r, int64_t n)
{
    int64_t k = 0;
    for (size_t i = 0; i < r->ncalls; i++)
        k += r->calls[i].seq < n;
    for (size_t i = 0; i < r->nrewards; i++)
        k += r->rewards[i].seq < n;
    for (size_t i = 0; i < r->nother; i++)
        k += r->other_seqs[i] < n;
    return k;
}

/* Inserts call c into r->calls keeping sequence order (spans normally come in order). Its
 * tokens, logprobs and model name are copied into one allocation (one malloc and one free
 * per call instead of four: calls are the stage's bulk). */
static int add_call(cr_rollout *r, const al_span *s)
{
    const al_llm_call *lc = &s->llm_call;
    cr_call c = {.seq = s->sequence,
                 .np = lc->n_prompt_tokens,
                 .nr = lc->n_response_tokens,
                 .policy_version = lc->policy_version};
    const char *model = lc->model ? lc->model : "";
    size_t nlp = lc->n_response_logprobs ? c.nr : 0, nmodel = strlen(model) + 1;
    size_t bytes = (c.np + c.nr) * sizeof(int32_t) + nlp * sizeof(float) + nmodel;
    char *block = malloc(bytes);
    if (!block || al_vec_grow((void **)&r->calls, &r->capcalls, r->ncalls + 1, sizeof c)) {
        free(block);
        return -1;
    }
    c.prompt = (int32_t *)block;
    c.resp = c.prompt + c.np;
    c.lp = nlp ? (float *)(c.resp + c.nr) : NULL;
    c.model = block + (c.np + c.nr) * sizeof(int32_t) + nlp * sizeof(float);
    if (c.np) memcpy(c.prompt, lc->prompt_token_ids, c.np * sizeof(int32_t));
    if (c.nr) memcpy(c.resp, lc->response_token_ids, c.nr * sizeof(int32_t));
    if (nlp) memcpy(c.lp, lc->response_logprobs, nlp * sizeof(float));
    memcpy(c.model, model, nmodel);
    size_t i = r->ncalls;
    while (i > 0 && r->calls[i - 1].seq > c.seq) {
        r->calls[i] = r->calls[i - 1];
        i--;
    }
    r->calls[i] = c;
    r->ncalls++;
    return 0;
}

static int add_reward(cr_rollout *r, const al_span *s)
{
    cr_reward w = {.seq = s->sequence,
                   .name = strdup(s->reward.name ? s->reward.name : ""),
                   .value = s->reward.value,
                   .after = s->reward.after_sequence};
    if (!w.name || al_vec_grow((void **)&r->rewards, &r->caprewards, r->nrewards + 1, sizeof w)) {
        free(w.name);
        return -1;
    }
    size_t i = r->nrewards;
    while (i > 0 && r->rewards[i - 1].seq > w.seq) {
        r->rewards[i] = r->rewards[i - 1];
        i--;
    }
    r->rewards[i] = w;
    r->nrewards++;
    return 0;
}

/* A new open rollout of span s under key[0..klen) (absent from p->rollouts), first seen at
 * offset; NULL when out of memory. */
static cr_rollout *rollout_new(al_credit_part *p, const al_span *s, const char *key, size_t klen,
                               int64_t offset)
{
    cr_rollout *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    const char *task = s->task_id ? s->task_id : "";
    r->rollout_id = strdup(s->rollout_id);
    r->task_id = strdup(task);
    r->group_key = strdup(task[0] ? task : s->rollout_id);
    r->attempt = s->attempt;
    r->first_offset = offset;
    r->status = AL_ROLLOUT_STATUS_UNKNOWN;
    if (!r->rollout_id || !r->task_id || !r->group_key ||
        !(r->entry = al_map_upsertn(&p->rollouts, key, klen, NULL))) {
        rollout_free(r);
        return NULL;
    }
    r->entry->value = r;
    r->first_prev = p->first_tail;
    if (p->first_tail)
        p->first_tail->first_next = r;
    else
        p->first_head = r;
    p->first_tail = r;
    r->last_activity = p->clock;
    open_append(p, r);
    p->stats.open_rollouts++;
    return r;
}

void al_credit_part_note_offset(al_credit_part *p, int64_t offset)
{
    if (offset >= p->next_offset) p->next_offset = offset + 1;
}

/* Checks of a call's content; 1 (rejected, with reason) or 0. */
static int check_call(const al_span *s, const char **reason_code, char *reason, size_t reasonlen)
{
    const al_llm_call *lc = &s->llm_call;
    if (!lc->n_prompt_tokens || !lc->n_response_tokens)
        return reject(reason_code, "no_token_ids", reason, reasonlen,
                      "LLM call %lld of rollout %s has no %s token ids (the upstream did not "
                      "return them%s%s)",
                      (long long)s->sequence, s->rollout_id,
                      !lc->n_prompt_tokens ? "prompt" : "response", lc->error ? "; error: " : "",
                      lc->error ? lc->error : "");
    if (lc->n_response_logprobs && lc->n_response_logprobs != lc->n_response_tokens)
        return reject(reason_code, "logprobs_mismatch", reason, reasonlen,
                      "LLM call %lld of rollout %s has %zu logprobs for %zu response tokens",
                      (long long)s->sequence, s->rollout_id, lc->n_response_logprobs,
                      lc->n_response_tokens);
    return 0;
}

int al_credit_part_add(al_credit_part *p, int64_t offset, const al_span *s,
                       const char **reason_code, char *reason, size_t reasonlen, char *errstr,
                       size_t errlen)
{
    static const char *dummy;
    if (!reason_code) reason_code = &dummy;
    *reason_code = NULL;
    al_credit_part_note_offset(p, offset);
    p->stats.spans++;
    /* A held-out evaluation's spans train nothing and count towards no group: counted and
     * passed over (their offsets are finished with at once). */
    if (s->eval) {
        p->stats.eval_spans++;
        return 0;
    }

    /* Spans that cannot be placed in a rollout at all. */
    if (!s->rollout_id || !*s->rollout_id)
        return reject(reason_code, "bad_span", reason, reasonlen, "span %s has no rollout_id",
                      s->span_id ? s->span_id : "?");
    if (strlen(s->rollout_id) > 400 || (s->task_id && strlen(s->task_id) > 400))
        return reject(reason_code, "bad_span", reason, reasonlen,
                      "span %s: rollout or task id longer than 400 bytes",
                      s->span_id ? s->span_id : "?");
    if (s->sequence < 0 || s->sequence > INT32_MAX || s->attempt < 0)
        return reject(reason_code, "bad_span", reason, reasonlen,
                      "span of rollout %s has sequence %lld or attempt %d out of range",
                      s->rollout_id, (long long)s->sequence, s->attempt);
    /* Spans placed in their rollout but refused for their content: they still count as
     * one of its sequence numbers (an end waiting for its spans must not wait for them). */
    int bad = 0;
    if (s->kind == AL_SPAN_KIND_REWARD && !isfinite(s->reward.value))
        bad = reject(reason_code, "bad_span", reason, reasonlen,
                     "reward %s of rollout %s is not a finite number",
                     s->reward.name ? s->reward.name : "", s->rollout_id);
    else if (s->kind == AL_SPAN_KIND_REWARD && fabs(s->reward.value) > AL_REWARD_MAX)
        bad = reject(reason_code, "bad_span", reason, reasonlen,
                     "reward %s of rollout %s is %g, beyond the +-%g credit takes",
                     s->reward.name ? s->reward.name : "", s->rollout_id, s->reward.value,
                     AL_REWARD_MAX);
    else if (s->kind != AL_SPAN_KIND_LLM_CALL && s->kind != AL_SPAN_KIND_REWARD &&
             s->kind != AL_SPAN_KIND_ROLLOUT_END)
        bad = reject(reason_code, "bad_span", reason, reasonlen, "span of rollout %s has kind %d",
                     s->rollout_id, (int)s->kind);

    /* The event clock moves first, so that what this span's time makes due fires before it. */
    if (s->timestamp_us > p->clock) p->clock = s->timestamp_us;
    if (fire_timeouts(p, errstr, errlen)) return -1;

    /* rollout id, 0x1f, attempt (an id of at most 400 bytes and an attempt >= 0, both checked
     * above): built by hand, as this runs once per span */
    char key[600];
    size_t kl = strlen(s->rollout_id);
    memcpy(key, s->rollout_id, kl);
    key[kl++] = '\x1f';
    char digits[12];
    size_t nd = 0;
    unsigned a = (unsigned)s->attempt;
    do
        digits[nd++] = (char)('0' + a % 10);
    while (a /= 10);
    while (nd)
        key[kl++] = digits[--nd];
    key[kl] = '\0';
    al_map_entry *open = al_map_findn(&p->rollouts, key, kl);
    cr_rollout *r = open ? open->value : NULL;
    if (!r && al_map_findn(&p->ended, key, kl))
        return reject(reason_code, "late_span", reason, reasonlen,
                      "span %lld of rollout %s attempt %d arrived after the rollout ended "
                      "(or timed out)",
                      (long long)s->sequence, s->rollout_id, s->attempt);
    if (r && r->waiting && s->sequence > r->end_seq)
        return reject(reason_code, "late_span", reason, reasonlen,
                      "span %lld of rollout %s attempt %d comes after the rollout's end "
                      "(sequence %lld)",
                      (long long)s->sequence, s->rollout_id, s->attempt,
                      (long long)r->end_seq);
    if (r && seq_seen(r, s->sequence))
        return reject(reason_code, "duplicate_sequence", reason, reasonlen,
                      "rollout %s attempt %d has sequence %lld twice", s->rollout_id, s->attempt,
                      (long long)s->sequence);
    if (r && r->waiting && s->kind == AL_SPAN_KIND_ROLLOUT_END)
        return reject(reason_code, "late_span", reason, reasonlen,
                      "rollout %s attempt %d has a second end (sequence %lld; the one with "
                      "sequence %lld came first)",
                      s->rollout_id, s->attempt, (long long)s->sequence,
                      (long long)r->end_seq);
    if (bad && !r) return 1;
    /* A rejected call still belongs to its rollout: it marks sequence 0 as seen and keeps the
     * rollout alive, so that the rest of the rollout trains. */
    if (!r && !(r = rollout_new(p, s, key, kl, offset)))
        return al_err(errstr, errlen, "out of memory");
    if (s->sequence == 0) r->seen_seq0 = 1;
    if (s->timestamp_us > r->max_ts) r->max_ts = s->timestamp_us;
    if (!r->waiting) { /* a waiting rollout's time runs from its end */
        r->last_activity = p->clock;
        open_unlink(p, r);
        open_append(p, r);
    }

    int oom = 0, rej = bad;
    switch (bad ? -1 : (int)s->kind) {
    case AL_SPAN_KIND_LLM_CALL:
        rej = check_call(s, reason_code, reason, reasonlen);
        if (!rej) oom = add_call(r, s);
        break;
    case AL_SPAN_KIND_REWARD:
        oom = add_reward(r, s);
        break;
    default:
        break;
    }
    if (!oom && (rej || s->kind == AL_SPAN_KIND_ROLLOUT_END)) {
        oom = al_vec_grow((void **)&r->other_seqs, &r->capother, r->nother + 1, sizeof(int64_t));
        if (!oom) r->other_seqs[r->nother++] = s->sequence;
    }
    if (oom) return al_err(errstr, errlen, "out of memory");
    if (s->kind == AL_SPAN_KIND_ROLLOUT_END && !rej) {
        r->status = s->rollout_end.status;
        r->group_size_hint = s->rollout_end.group_size;
        p->stats.rollouts_completed++;
        int retried = s->rollout_end.retried;
        /* Its sequence number counts the rollout's spans before it: an end that overtook
         * some of them (a span retried by the proxy's spool after a broker error, a second
         * proxy's spans, a call still running when the agent ended) waits for them. */
        if (retried || !p->cfg.end_wait_us || seqs_below(r, s->sequence) == s->sequence)
            return rollout_end(p, r, retried, errstr, errlen) ? -1 : 0;
        open_unlink(p, r);
        r->waiting = 1;
        r->end_seq = s->sequence;
        r->end_at = p->clock;
        r->end_retried = retried;
        list_append(&p->wait_head, &p->wait_tail, r);
        p->stats.rollouts_waiting++;
        return 0;
    }
    if (r->waiting && seqs_below(r, r->end_seq) == r->end_seq &&
        rollout_end(p, r, r->end_retried, errstr, errlen))
        return -1;
    return rej;
}

size_t al_credit_part_emitted(const al_credit_part *p, int64_t from, const int64_t **out)
{
    size_t i = 0;
    while (i < p->nelo && p->elo[i] < from)
        i++;
    *out = p->elo + i;
    return p->nelo - i;
}

int al_credit_part_skip_emitted(al_credit_part *p, const int64_t *lo, size_t n)
{
    if (!n) return 0;
    int64_t *ns = realloc(p->skip, (p->nskip + n) * sizeof *ns);
    if (!ns) return -1;
    p->skip = ns;
    memcpy(p->skip + p->nskip, lo, n * sizeof *lo);
    p->nskip += n;
    /* still emitted: the next commit names them too, until the safe offset passes them,
     * also before they are re-formed */
    for (size_t i = 0; i < n; i++)
        if (emitted_add(p, lo[i]) != 0) return -1;
    return 0;
}
