/*
 * credit.h: credit assignment as pure logic (no Kafka): rollouts in, transitions out.
 *
 * One al_credit_part per consumed partition. The Kafka layer (main.c) feeds it the
 * decoded spans of that partition in offset order; the part assembles rollouts, decomposes
 * them into per-call transitions (LightningRL, optionally merged into multi-turn sequences),
 * assigns credit, completes GRPO groups and hands every transition to the sink.
 *
 * Time is event time: the part's clock is the largest span timestamp it has seen (never a
 * wall clock), so idle and group timeouts fire at the same place in the stream however it is
 * split into polls or workers. The Kafka layer may advance the clock explicitly
 * (al_credit_part_advance) when a partition has been quiet for a while; that is the one
 * place wall-clock time enters, and only for partitions with no traffic.
 *
 * Transitions carry event time too: timestamp_us is the latest span timestamp of their
 * group (not the wall-clock time of emission), so that replays give byte-identical output.
 *
 * Credit, exactly (the README's "Credit assignment" and schemas/transition.avsc say the same):
 *
 *   Calls. A rollout's calls are the LLM-call spans the part accepted, in sequence order;
 *   call position k (0-based) is the k-th of them (rejected calls do not count). A rollout
 *   trains when it is kept (succeeded, or failed / timed out under the keep policy) and has
 *   a call; a group's members are its training rollouts in end order, and every transition
 *   of the group carries their number as group_size (dropped rollouts do not count).
 *   A kept rollout without a counted reward has reward 0 if it succeeded, else the
 *   configured default (failed_reward, timeout_reward).
 *
 *   Identical credit. R is the last counted reward span (reward_mode last), the last one
 *   named reward_name (named), or the sum of all (sum). Every call has reward = return = R;
 *   the group's statistics (al_credit_moments) are over its members' R, and every call of a
 *   member has the advantage of its R.
 *
 *   Discounted credit. Every reward span counts (named mode: those with the name; last and
 *   sum do not differ here); each goes to the last call whose sequence is <= its
 *   after_sequence (the first call if there is none); r_k is the sum of those of call k (the
 *   default reward, if any, goes to the last call), G_k = r_k + gamma G_{k+1}. Position k's
 *   statistics are over the G_k of the members that have a call k; call k's advantage is its
 *   G_k against them (reinforce: against the task's running baseline of position k). So a
 *   position every rollout has converged on (no spread) gives 0 and does not scale the
 *   others, and a position only one rollout reached gives 0 (grpo, dr_grpo, rloo).
 *
 *   Step credit (group in group, after GiGPO, arXiv 2505.10978). r_k and G_k as under
 *   discounted credit (with one reward at the end, after the last call T-1: G_k =
 *   gamma^(T-1-k) R). A call's episode advantage A_E is its discounted-credit advantage (G_k
 *   against position k's G across the group): with one final reward and gamma 1 every G_k
 *   of a rollout is R, so A_E is the rollout's R against the group's (GiGPO's episode
 *   advantage; with gamma < 1 too under grpo, whose z-score the factor gamma^(T-1-k) leaves
 *   alone), and with a reward after each call a call is not credited with what later calls
 *   earned before it. A step group is the set of calls of the group's training members
 *   whose states are the same token ids (compared whole, not by hash alone): the same
 *   state reached by different rollouts, or twice by one. A call's state (step_state):
 *   prompt: its prompt token ids; observed (the default): what the environment and the
 *   agent have shown the model, without what the model answered: call 0's prompt, and for
 *   a call whose prompt extends the previous call's prompt and response (a conversation
 *   that grows), the previous call's state followed by the tokens after that response;
 *   any other call's state is its prompt. So two rollouts whose first answers differ
 *   ("kkkk", "kk k") but got the same answer from the door are twins at their second call,
 *   as GiGPO groups by the environment's state, not by the history. A call's step
 *   advantage A_S is its G_k
 *   against its step group's G (members in end order, a rollout's calls in call order); a
 *   call with no twin has A_S = 0 (it falls back to A_E), and so has one in a step group
 *   without spread (grpo, dr_grpo, rloo). Call k's advantage is A_E + step_weight * A_S,
 *   both by the estimator (grpo, dr_grpo, rloo, none; reinforce is refused). So call 0 of a
 *   task (every rollout's call 0 has the same prompt) gets (1 + w) A_E under grpo, and a
 *   later call is also compared with the calls made from exactly its state.

 *   Merged sequence of calls k..e-1: reward = R (identical) or r_k + ... + r_{e-1}
 *   (discounted, step); return_value = G_k; advantage = call k's. Under discounted and step
 *   credit it also carries token_advantages: call j's advantage (as a float) on call j's
 *   response tokens and 0 on the tokens the agent added between calls (loss_mask 0).
 *
 * Offsets: al_credit_part_safe_offset says below which offset every span is finished with:
 * it never passes the first span of a rollout that is open or waits in an open group, and
 * never falls inside the offset range of an emitted group (so that a restart re-reads either
 * all or none of a group's rollouts and re-forms the same groups). A restarted part skips the
 * remnants of rollouts whose sequence-0 span it did not see: their transitions were emitted
 * before the restart.
 */
#ifndef ARCLIGHT_CREDIT_H
#define ARCLIGHT_CREDIT_H

#include "avro/codec.h"

#include <stddef.h>
#include <stdint.h>

typedef enum al_credit_estimator {
    AL_CREDIT_ESTIMATOR_GRPO = 0,      /* (G - mean) / (std + eps), population std */
    AL_CREDIT_ESTIMATOR_DR_GRPO = 1,   /* G - mean */
    AL_CREDIT_ESTIMATOR_RLOO = 2,      /* G - mean of the other rollouts' returns */
    AL_CREDIT_ESTIMATOR_REINFORCE = 3, /* G - running baseline of the task (and position) */
    AL_CREDIT_ESTIMATOR_NONE = 4,      /* G */
} al_credit_estimator;

typedef enum al_credit_reward_mode {
    AL_CREDIT_REWARD_LAST = 0,  /* the rollout's last reward span */
    AL_CREDIT_REWARD_NAMED = 1, /* the last reward span with the configured name */
    AL_CREDIT_REWARD_SUM = 2,   /* the sum of all reward spans */
} al_credit_reward_mode;

typedef enum al_credit_assign {
    AL_CREDIT_ASSIGN_IDENTICAL = 0,  /* every call gets the rollout's reward R (LightningRL) */
    AL_CREDIT_ASSIGN_DISCOUNTED = 1, /* each reward belongs to the call it followed; returns */
    AL_CREDIT_ASSIGN_STEP = 2,       /* episode advantage + w * the call's step-group one */
} al_credit_assign;

typedef enum al_credit_step_state {
    AL_CREDIT_STATE_PROMPT = 0,   /* a call's state is its prompt token ids */
    AL_CREDIT_STATE_OBSERVED = 1, /* its prompt without the model's earlier answers */
} al_credit_step_state;

typedef enum al_credit_policy {
    AL_CREDIT_POLICY_DROP = 0, /* the rollout counts towards its group's size, trains nothing */
    AL_CREDIT_POLICY_KEEP = 1, /* trains with its own reward, else the configured default */
} al_credit_policy;

/* Rewards: reward spans and the configured defaults must be within +-AL_REWARD_MAX (the
 * Span contract, avro/codec.h); a reward span beyond it is rejected (bad_span). */
/* A set of returns (a group's rollout rewards; under discounted credit, one call position's
 * returns across the group) has no spread when its population std is at most AL_CREDIT_FLAT
 * times its largest |return|: grpo, dr_grpo and rloo then give every member 0, so that
 * rounding noise (0.1 + 0.2 against 0.3) is not scaled up by 1 / eps into a signal. With a
 * spread, grpo's |advantage| is at most sqrt(n - 1) (a z-score), so it always fits a float. */
#define AL_CREDIT_FLAT 1e-9

typedef struct al_credit_config {
    al_credit_estimator estimator;
    al_credit_reward_mode reward_mode;
    const char *reward_name; /* for AL_CREDIT_REWARD_NAMED (the part copies it) */
    al_credit_assign assign;
    double gamma;             /* discount of AL_CREDIT_ASSIGN_DISCOUNTED and _STEP */
    double step_weight;       /* w of AL_CREDIT_ASSIGN_STEP, in [0, 100] */
    al_credit_step_state step_state; /* what makes two calls' states the same (step) */
    int merge;                /* merge consecutive calls whose prompts extend each other */
    int32_t group_size;       /* when no end span of the group carries one */
    int64_t idle_timeout_us;  /* a rollout silent this long (event time) times out; 0: never */
    int64_t group_timeout_us; /* a group waits this long after its first end; 0: forever */
    int64_t end_wait_us;      /* an end whose sequence number says spans before it are
                               * missing waits this long (event time) for them; 0: not */
    al_credit_policy timeout_policy;
    double timeout_reward;
    al_credit_policy failed_policy; /* failed and aborted rollouts */
    double failed_reward;
    int drop_equal_groups;  /* drop groups whose scores are all equal (no signal) */
    double eps;             /* grpo's std epsilon */
    double reinforce_alpha; /* the baseline moves by alpha * (group mean - baseline) */
} al_credit_config;

/* Defaults: grpo, last reward, identical assignment, gamma 1, step weight 1, observed step
 * states, no merge, group size 8,
 * idle timeout 600 s, group timeout 1800 s, end wait 30 s, timed-out and failed rollouts
 * dropped (reward 0 when kept), all-equal groups kept, eps 1e-6, alpha 0.1. */
void al_credit_config_init(al_credit_config *c);

/* "grpo", "dr_grpo", "rloo", "reinforce", "none"; parse returns -1 for anything else. */
const char *al_credit_estimator_name(al_credit_estimator e);
int al_credit_estimator_parse(const char *name);

/* The statistics of one set of returns v[0..n), each sum taken in index order (the order
 * of the group's rollouts by end, which makes replays byte-identical): sum, mean = sum / n,
 * population std = sqrt(sum (v - mean)^2 / n), and flat (no spread, see AL_CREDIT_FLAT;
 * always set for n <= 1). */
typedef struct al_credit_moments {
    size_t n;
    double sum, mean, std;
    int flat;
} al_credit_moments;

void al_credit_moments_of(const double *v, size_t n, al_credit_moments *m);

/* The advantage of return g, one of the set m was computed from, for estimators other than
 * reinforce (whose baseline lives in the part; given reinforce this returns g - mean):
 *   grpo     (g - mean) / (std + eps)
 *   dr_grpo  g - mean
 *   rloo     g - (sum - g) / (n - 1)       (the mean of the others)
 *   none     g
 * grpo, dr_grpo and rloo give 0 when m is flat (n == 1 included) or empty. */
double al_credit_advantage_of(al_credit_estimator e, const al_credit_moments *m, double g,
                              double eps);

/* The same over scores[0..n), for the member i (whose score rloo leaves out; g is used for
 * the other estimators and is normally scores[i]). */
double al_credit_advantage(al_credit_estimator e, const double *scores, size_t n, size_t i,
                           double g, double eps);

/* Counters a part keeps (monotonic, except open_rollouts/open_groups). */
typedef struct al_credit_stats {
    uint64_t spans;
    uint64_t rollouts_completed; /* ended with an end span (any status) */
    uint64_t rollouts_timed_out; /* idle timeout */
    uint64_t rollouts_dropped;   /* by the failed/timeout policy */
    uint64_t rollouts_skipped;   /* remnants without their sequence-0 span (resumed/late) */
    uint64_t rollouts_retried;   /* attempts whose end says a new attempt replaces them */
    uint64_t rollouts_incomplete; /* settled at the end wait with spans still missing */
    uint64_t eval_spans;         /* spans of held-out evaluation rollouts: counted, not used */
    uint64_t rollouts_no_reward; /* kept, but no reward span: reward 0 (or the default) */
    uint64_t groups_completed;   /* emitted */
    uint64_t groups_timed_out;   /* emitted (or dropped) at the group timeout */
    uint64_t groups_dropped_equal;
    uint64_t groups_dropped_empty; /* every rollout of the group dropped */
    uint64_t transitions;
    uint64_t groups_replayed;      /* re-formed after a restart, emitted before it: not again */
    uint64_t transitions_replayed; /* their transitions, not emitted */
    uint64_t open_rollouts;
    uint64_t rollouts_waiting; /* ended, waiting for spans the end overtook (in open_rollouts) */
    uint64_t open_groups;
} al_credit_stats;

/* Where a part's results go. Both are called from inside al_credit_part_add/advance.
 *   transition: one transition (valid during the call only; the sink copies or encodes
 *     it); anchor_offset is the offset of the earliest span of its group, whose input must
 *     stay unfinished until the transition is acknowledged. Returns 0, or -1 to stop: the
 *     part then returns -1 from add/advance (its state for that group is gone; the caller
 *     is expected to stop without storing offsets).
 *   rollout: a kept rollout's score, for reward windows (may be NULL). */
typedef struct al_credit_sink {
    int (*transition)(void *ud, const al_transition *t, int64_t anchor_offset);
    void (*rollout)(void *ud, double score);
    void *ud;
} al_credit_sink;

typedef struct al_credit_part al_credit_part;

/* A new part with a copy of cfg (and of its strings). NULL with errstr on a bad config or
 * out of memory. sink is copied. */
al_credit_part *al_credit_part_new(const al_credit_config *cfg, const al_credit_sink *sink,
                                   char *errstr, size_t errlen);
/* Frees the part and every rollout still open in it (nothing is emitted). NULL-safe. */
void al_credit_part_free(al_credit_part *p);

/* Feeds one span read at `offset` (offsets increase from call to call). Returns
 *   0  accepted (the span now belongs to a rollout, or completed one);
 *   1  rejected: *reason_code is a short metric label (no_token_ids, bad_span,
 *      duplicate_sequence, logprobs_mismatch, late_span) and reason a sentence naming the
 *      span; the caller dead-letters it. A rejected call of a known rollout still counts as
 *      one of its spans (its offset may be the group's anchor), so the caller keeps holding
 *      its input like any other until the safe offset passes it;
 *  -1  the sink refused a transition (errstr says why).
 * The span is read only; the part copies what it keeps. */
int al_credit_part_add(al_credit_part *p, int64_t offset, const al_span *s,
                       const char **reason_code, char *reason, size_t reasonlen, char *errstr,
                       size_t errlen);

/* Tells the part that `offset` was consumed but not handed to add (an undecodable message),
 * so that the safe offset can move past it. */
void al_credit_part_note_offset(al_credit_part *p, int64_t offset);

/* Moves the event-time clock forward to clock_us (never back) and fires idle and group
 * timeouts that are due. 0, or -1 as for add. */
int al_credit_part_advance(al_credit_part *p, int64_t clock_us, char *errstr, size_t errlen);

/* Every span below this offset is finished with (see the top of this file); -1 before the
 * first span. Never decreases. */
int64_t al_credit_part_safe_offset(al_credit_part *p);
/* Exactly once across restarts. A restart re-reads from the safe offset, which stays at the
 * first span of the oldest open rollout: every group emitted after that span (above the
 * safe offset) is re-formed whole and would be emitted again. Each emitted group is named
 * by the offset of its earliest first span (distinct for distinct groups: a span belongs
 * to one rollout), and those names are what a transactional stage commits next to its
 * offset and hands back to the restarted part.
 *   emitted: the names >= from of the groups emitted (or re-formed and not emitted again)
 *     whose names are not below the safe offset, ascending, in *out (valid until the next
 *     call into the part); returns their number.
 *   skip_emitted: the names join the emitted ones (named again by every commit until the
 *     safe offset passes them); a re-formed group with one of these names is completed without calling
 *     the sink (groups_replayed, transitions_replayed count it; its transitions are the ones
 *     emitted before the restart, since the same spans form the same groups). 0, or -1 out
 *     of memory. */
size_t al_credit_part_emitted(const al_credit_part *p, int64_t from, const int64_t **out);
int al_credit_part_skip_emitted(al_credit_part *p, const int64_t *lo, size_t n);

/* The event-time clock: the largest timestamp seen or advanced to; 0 before any. */
int64_t al_credit_part_clock(const al_credit_part *p);
const al_credit_stats *al_credit_part_stats(const al_credit_part *p);

#endif
