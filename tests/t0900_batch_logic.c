/* 0900: the batcher's logic (stages/batch/batcher.c) without Kafka: packing, groups, steps,
 * staleness, whitening, duplicates, chunking, determinism, bad input. */
#include "testlib.h"

#include "batch/batcher.h"

#include <stdint.h>

/* ---- a small deterministic generator and transition builder ----------------------------- */

static uint64_t rng_state = 88172645463325252ULL;
static uint64_t rng_next(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}
static int rng_int(int lo, int hi) { return lo + (int)(rng_next() % (uint64_t)(hi - lo + 1)); }

typedef struct tbuf {
    char id[64], group_id[32], rollout[32];
    int32_t prompt[4096], response[4096];
    uint8_t mask[4096];
    float logp[4096], tadv[4096];
    al_transition t;
} tbuf;

/* A transition of group g, rollout r, call c with np prompt and nr response tokens; every
 * token id encodes (group, rollout, position) so that a packed token can be traced back. */
static al_transition *make_t(tbuf *b, const char *model, int g, int gsize, int r, int c, int np,
                             int nr, int64_t version)
{
    memset(b, 0, sizeof *b);
    snprintf(b->rollout, sizeof b->rollout, "g%d-r%d", g, r);
    snprintf(b->id, sizeof b->id, "%s:0:%d", b->rollout, c);
    snprintf(b->group_id, sizeof b->group_id, "group-%d", g);
    for (int i = 0; i < np; i++) b->prompt[i] = (g * 100 + r) * 10000 + i;
    for (int i = 0; i < nr; i++) {
        b->response[i] = (g * 100 + r) * 10000 + np + i;
        b->mask[i] = (uint8_t)(i % 3 != 1); /* a tool turn every third token */
        b->logp[i] = b->mask[i] ? -0.001f * (float)(i + 1) : 0.0f;
        b->tadv[i] = 0.5f + 0.01f * (float)i;
    }
    al_transition *t = &b->t;
    t->id = b->id;
    t->group_key = "task";
    t->group_id = b->group_id;
    t->group_size = gsize;
    t->rollout_id = b->rollout;
    t->prompt_token_ids = b->prompt;
    t->n_prompt_tokens = (size_t)np;
    t->response_token_ids = b->response;
    t->n_response_tokens = (size_t)nr;
    t->loss_mask = b->mask;
    t->n_loss_mask = (size_t)nr;
    t->rollout_logprobs = b->logp;
    t->n_rollout_logprobs = (size_t)nr;
    t->advantage = 0.25 * (r + 1);
    t->reward = r;
    t->policy_version = version;
    t->model = model;
    return t;
}

static al_batcher *new_batcher(int64_t step_seqs, int64_t budget, int64_t max_msg)
{
    al_batch_config c;
    al_batch_config_default(&c);
    c.step_sequences = step_seqs;
    c.micro_batch_tokens = budget;
    if (max_msg) c.max_message_bytes = max_msg;
    c.dedup_window = 4096;
    char err[256];
    al_batcher *b = al_batcher_new(&c, err, sizeof err);
    if (!b) fprintf(stderr, "batcher: %s\n", err);
    return b;
}

/* Decodes every chunk of a step and checks the structural promises; returns the total
 * number of tokens seen (-1 on a broken chunk). */
static int64_t check_step_chunks(const al_batch_step *st, int64_t budget, int64_t max_msg)
{
    int64_t tokens = 0, seqs = 0, loss = 0;
    int32_t next_mb = 0;
    for (size_t c = 0; c < st->n_chunks; c++) {
        al_batch_chunk ch = {0};
        char err[256];
        CHECKF((int64_t)st->chunks[c].len <= max_msg, "chunk %zu is %zu bytes > %lld", c,
               st->chunks[c].len, (long long)max_msg);
        if (al_batch_chunk_decode(st->chunks[c].data, st->chunks[c].len, &ch, err, sizeof err)) {
            CHECKF(0, "chunk %zu does not decode: %s", c, err);
            return -1;
        }
        CHECK_EQ_STR(ch.model, st->model);
        CHECK_EQ_INT(ch.step, st->step);
        CHECK_EQ_INT(ch.chunk_index, (int)c);
        CHECK_EQ_INT(ch.chunk_count, (int)st->n_chunks);
        CHECK_EQ_INT(ch.step_sequences, st->n_sequences);
        CHECK_EQ_INT(ch.step_tokens, st->n_tokens);
        CHECK_EQ_INT(ch.step_micro_batches, st->n_micro_batches);
        for (size_t i = 0; i < ch.n_micro_batches; i++) {
            const al_micro_batch *mb = &ch.micro_batches[i];
            CHECK_EQ_INT(mb->index, next_mb++);
            CHECKF((int64_t)mb->n_tokens <= budget, "micro-batch of %zu tokens > %lld",
                   mb->n_tokens, (long long)budget);
            CHECK_EQ_INT(mb->n_rewards, mb->n_sequences);
            for (size_t s = 0; s < mb->n_sequences; s++) {
                int32_t a = mb->cu_seqlens[s], e = mb->cu_seqlens[s + 1];
                CHECK(e > a);
                for (int32_t t = a; t < e; t++) {
                    CHECK_EQ_INT(mb->position_ids[t], t - a);
                    if (!mb->loss_mask[t]) {
                        CHECK(mb->advantages[t] == 0.0f && mb->rollout_logprobs[t] == 0.0f);
                    } else {
                        loss++;
                    }
                }
                CHECK_EQ_INT(mb->loss_mask[a], 0); /* nothing predicts a first token */
            }
            tokens += (int64_t)mb->n_tokens;
            seqs += (int64_t)mb->n_sequences;
        }
        al_batch_chunk_clear(&ch);
    }
    CHECK_EQ_INT(next_mb, st->n_micro_batches);
    CHECK_EQ_INT(tokens, st->n_tokens);
    CHECK_EQ_INT(seqs, st->n_sequences);
    CHECK_EQ_INT(loss, st->n_loss_tokens);
    return tokens;
}

/* ---- tests ------------------------------------------------------------------------------- */

TEST(ffd_places_every_item_within_capacity)
{
    int64_t len[200];
    int32_t bin[200];
    int64_t total = 0;
    for (int i = 0; i < 200; i++) total += len[i] = rng_int(1, 1000);
    int n = al_batch_pack_ffd(len, NULL, 200, 1000, 0, bin);
    REQUIRE(n > 0);
    int64_t load[200] = {0};
    for (int i = 0; i < 200; i++) {
        REQUIRE(bin[i] >= 0 && bin[i] < n);
        load[bin[i]] += len[i];
    }
    for (int j = 0; j < n; j++) CHECKF(load[j] <= 1000, "bin %d holds %lld", j, (long long)load[j]);
    /* FFD uses at most 11/9 OPT + 6/9 bins; OPT >= total / cap */
    CHECKF(n <= (int)(11.0 / 9.0 * (double)(total + 999) / 1000.0 + 1), "%d bins for %lld", n,
           (long long)total);
    /* A case with a known answer: 6,5,4,3,2 into 10 -> {6,4},{5,3,2} */
    int64_t l2[] = {2, 6, 3, 5, 4};
    int32_t b2[5];
    CHECK_EQ_INT(al_batch_pack_ffd(l2, NULL, 5, 10, 0, b2), 2);
    CHECK_EQ_INT(b2[1], 0);
    CHECK_EQ_INT(b2[4], 0);
    CHECK_EQ_INT(b2[3], 1);
    CHECK_EQ_INT(b2[2], 1);
    CHECK_EQ_INT(b2[0], 1);
    /* An item over capacity is refused; the cost bound opens new bins */
    int64_t over[] = {11};
    CHECK_EQ_INT(al_batch_pack_ffd(over, NULL, 1, 10, 0, b2), -1);
    int64_t c3[] = {5, 5, 5};
    int64_t l3[] = {1, 1, 1};
    CHECK_EQ_INT(al_batch_pack_ffd(l3, c3, 3, 10, 10, b2), 2);
}

TEST(every_token_packed_exactly_once_with_masks_and_positions)
{
    const int64_t budget = 4096;
    al_batcher *b = new_batcher(32, budget, 0);
    REQUIRE(b);
    static tbuf tb;
    /* 8 groups of 4 rollouts, lengths 20..2500 */
    int np_of[32], nr_of[32];
    for (int g = 0; g < 8; g++)
        for (int r = 0; r < 4; r++) {
            int np = rng_int(1, 1500), nr = rng_int(1, 1000);
            np_of[g * 4 + r] = np;
            nr_of[g * 4 + r] = nr;
            char err[256];
            CHECK_EQ_INT(al_batcher_add(b, make_t(&tb, "m", g, 4, r, 0, np, nr, 3), 0, 0,
                                        (void *)(intptr_t)(g * 4 + r + 1), err, sizeof err),
                         AL_BATCH_ADDED);
        }
    al_batch_step *st = NULL;
    char err[256];
    CHECK_EQ_INT(al_batcher_next_step(b, &st, err, sizeof err), 0); /* last group still open */
    CHECK_EQ_INT(al_batcher_close_all(b), 1);
    REQUIRE(al_batcher_next_step(b, &st, err, sizeof err) == 1);
    CHECK_EQ_INT(st->step, 0);
    CHECK_EQ_INT(st->n_sequences, 32);
    CHECK_EQ_INT(st->n_groups, 8);
    CHECK_EQ_INT(st->n_opaques, 32);
    int64_t expect_tokens = 0;
    for (int i = 0; i < 32; i++) expect_tokens += np_of[i] + nr_of[i];
    CHECK_EQ_INT(st->n_tokens, expect_tokens);
    CHECK(check_step_chunks(st, budget, 1048576 - 65536) == expect_tokens);
    CHECK(st->efficiency > 0.5 && st->efficiency <= 1.0);
    /* every opaque exactly once */
    int seen[33] = {0};
    for (size_t i = 0; i < st->n_opaques; i++) seen[(intptr_t)st->opaques[i]]++;
    for (int i = 1; i <= 32; i++) CHECK_EQ_INT(seen[i], 1);

    /* Trace each sequence back: its tokens, mask, logprobs and advantages. */
    int found[32] = {0};
    for (size_t c = 0; c < st->n_chunks; c++) {
        al_batch_chunk ch = {0};
        REQUIRE(al_batch_chunk_decode(st->chunks[c].data, st->chunks[c].len, &ch, err, sizeof err) == 0);
        for (size_t i = 0; i < ch.n_micro_batches; i++) {
            const al_micro_batch *mb = &ch.micro_batches[i];
            for (size_t s = 0; s < mb->n_sequences; s++) {
                int g, r;
                REQUIRE(sscanf(mb->transition_ids[s], "g%d-r%d", &g, &r) == 2);
                int k = g * 4 + r, np = np_of[k], nr = nr_of[k];
                found[k]++;
                int32_t a = mb->cu_seqlens[s];
                CHECK_EQ_INT(mb->cu_seqlens[s + 1] - a, np + nr);
                CHECK_EQ_INT(mb->policy_versions[s], 3);
                CHECK_NEAR(mb->rewards[s], r, 0);
                int bad = 0;
                for (int t = 0; t < np + nr; t++) {
                    if (mb->token_ids[a + t] != (g * 100 + r) * 10000 + t) bad++;
                    int want_mask = t >= np && (t - np) % 3 != 1 && t > 0;
                    if (mb->loss_mask[a + t] != want_mask) bad++;
                    if (want_mask && mb->advantages[a + t] != (float)(0.25 * (r + 1))) bad++;
                    if (want_mask && mb->rollout_logprobs[a + t] != -0.001f * (float)(t - np + 1)) bad++;
                }
                CHECKF(bad == 0, "sequence %s: %d wrong token entries", mb->transition_ids[s], bad);
            }
        }
        al_batch_chunk_clear(&ch);
    }
    for (int i = 0; i < 32; i++) CHECKF(found[i] == 1, "sequence %d packed %d times", i, found[i]);
    al_batch_step_free(st);
    al_batcher_free(b);
}

TEST(groups_are_never_split_and_steps_count_from_zero)
{
    al_batcher *b = new_batcher(10, 2048, 0);
    REQUIRE(b);
    static tbuf tb;
    char err[256];
    /* groups of 4: a step of >= 10 sequences takes 3 whole groups (12 sequences) */
    for (int g = 0; g < 7; g++)
        for (int r = 0; r < 4; r++)
            REQUIRE(al_batcher_add(b, make_t(&tb, "m", g, 4, r, 0, 10, 10, -1), 0, 0, NULL, err,
                                   sizeof err) == AL_BATCH_ADDED);
    al_batcher_close_all(b);
    al_batch_step *st;
    int64_t expect_step = 0;
    while (al_batcher_next_step(b, &st, err, sizeof err) == 1) {
        CHECK_EQ_INT(st->step, expect_step++);
        CHECK_EQ_INT(st->n_sequences, 12);
        CHECK_EQ_INT(st->n_groups, 3);
        for (int s = 0; s < st->n_sequences; s++) CHECK_EQ_INT(st->lags[s], -1);
        al_batch_step_free(st);
    }
    CHECK_EQ_INT(expect_step, 2);
    al_batcher_stats stats;
    al_batcher_get_stats(b, &stats);
    CHECK_EQ_INT(stats.queued_groups, 1); /* 7th group waits for more */
    REQUIRE(al_batcher_flush_step(b, &st, err, sizeof err) == 1);
    CHECK_EQ_INT(st->n_sequences, 4);
    CHECK_EQ_INT(st->step, 2);
    al_batch_step_free(st);
    al_batcher_free(b);

    /* token target: steps close at >= 1000 tokens of whole groups */
    al_batch_config c;
    al_batch_config_default(&c);
    c.step_sequences = 0;
    c.step_tokens = 1000;
    c.dedup_window = 64;
    b = al_batcher_new(&c, err, sizeof err);
    REQUIRE(b);
    for (int g = 0; g < 4; g++)
        for (int r = 0; r < 2; r++)
            al_batcher_add(b, make_t(&tb, "m", g, 2, r, 0, 100, 200, -1), 0, 0, NULL, err, sizeof err);
    al_batcher_close_all(b);
    REQUIRE(al_batcher_next_step(b, &st, err, sizeof err) == 1);
    CHECK_EQ_INT(st->n_tokens, 1200); /* two groups of 600 */
    CHECK_EQ_INT(st->n_groups, 2);
    al_batch_step_free(st);
    al_batcher_free(b);
}

/* Group target (what `arclight rollouts --step-groups K` paces on): a step is K whole
 * groups whatever their sizes: groups of 1, 3 and 6 sequences (rollouts of 1, 3 and 6 calls)
 * make steps of 3 groups. Two targets at once are refused. */
TEST(group_target_counts_groups_not_sequences)
{
    al_batch_config c;
    al_batch_config_default(&c);
    c.step_sequences = 0;
    c.step_groups = 3;
    c.dedup_window = 64;
    char err[256];
    al_batcher *b = al_batcher_new(&c, err, sizeof err);
    REQUIRE(b);
    static tbuf tb;
    static const int sizes[] = {1, 3, 6, 6, 1, 3, 2};
    for (int g = 0; g < 7; g++)
        for (int r = 0; r < sizes[g]; r++)
            REQUIRE(al_batcher_add(b, make_t(&tb, "m", g, sizes[g], r, 0, 5, 5, -1), 0, 0, NULL,
                                   err, sizeof err) == AL_BATCH_ADDED);
    al_batcher_close_all(b);
    al_batch_step *st;
    REQUIRE(al_batcher_next_step(b, &st, err, sizeof err) == 1);
    CHECK_EQ_INT(st->n_groups, 3);
    CHECK_EQ_INT(st->n_sequences, 1 + 3 + 6);
    al_batch_step_free(st);
    REQUIRE(al_batcher_next_step(b, &st, err, sizeof err) == 1);
    CHECK_EQ_INT(st->n_groups, 3);
    CHECK_EQ_INT(st->n_sequences, 6 + 1 + 3);
    al_batch_step_free(st);
    CHECK(al_batcher_next_step(b, &st, err, sizeof err) == 0); /* one group waits */
    al_batcher_free(b);
    c.step_sequences = 8;
    CHECK(al_batcher_new(&c, err, sizeof err) == NULL);
    CHECK(strstr(err, "only one"));
}

static int busy_lane = -1;
static int lane_quiet(void *ctx, int32_t lane)
{
    (void)ctx;
    return lane != busy_lane;
}

TEST(lane_rule_and_idle_close_groups)
{
    al_batcher *b = new_batcher(100, 2048, 0);
    REQUIRE(b);
    static tbuf tb;
    char err[256];
    al_batcher_stats s;
    /* group 0 with 2 rollouts (2 calls each) on lane 5, then group 1 on lane 5 closes it */
    al_batcher_add(b, make_t(&tb, "m", 0, 2, 0, 0, 5, 5, -1), 5, 100, NULL, err, sizeof err);
    al_batcher_add(b, make_t(&tb, "m", 0, 2, 0, 1, 5, 5, -1), 5, 100, NULL, err, sizeof err);
    al_batcher_add(b, make_t(&tb, "m", 0, 2, 1, 0, 5, 5, -1), 5, 100, NULL, err, sizeof err);
    al_batcher_add(b, make_t(&tb, "m", 0, 2, 1, 1, 5, 5, -1), 5, 100, NULL, err, sizeof err);
    /* a group on another lane does not close it */
    al_batcher_add(b, make_t(&tb, "m", 9, 1, 0, 0, 5, 5, -1), 6, 100, NULL, err, sizeof err);
    al_batcher_get_stats(b, &s);
    CHECK_EQ_INT(s.open_groups, 2);
    al_batcher_add(b, make_t(&tb, "m", 1, 2, 0, 0, 5, 5, -1), 5, 200, NULL, err, sizeof err);
    al_batcher_get_stats(b, &s);
    CHECK_EQ_INT(s.open_groups, 2);
    CHECK_EQ_INT(s.queued_groups, 1);
    CHECK_EQ_INT(s.queued_sequences, 4);
    /* a group missing a rollout is not closed by the lane rule, only when idle */
    al_batcher_add(b, make_t(&tb, "m", 2, 2, 0, 0, 5, 5, -1), 5, 300, NULL, err, sizeof err);
    al_batcher_get_stats(b, &s);
    CHECK_EQ_INT(s.open_groups, 3);
    CHECK_EQ_INT(al_batcher_close_idle(b, 250, 100, NULL, NULL), 1); /* group 9 (last at 100) */
    /* group 1 (last at 200) is idle at 350, but not while its lane has more to read */
    busy_lane = 5;
    CHECK_EQ_INT(al_batcher_close_idle(b, 350, 100, lane_quiet, NULL), 0);
    busy_lane = -1;
    CHECK_EQ_INT(al_batcher_close_idle(b, 350, 100, lane_quiet, NULL), 1);
    al_batcher_get_stats(b, &s);
    CHECK_EQ_INT(s.open_groups, 1);
    /* a late transition of a closed, queued group joins it */
    al_batcher_add(b, make_t(&tb, "m", 1, 2, 1, 0, 5, 5, -1), 7, 400, NULL, err, sizeof err);
    al_batcher_get_stats(b, &s);
    CHECK_EQ_INT(s.open_groups, 1);
    CHECK_EQ_INT(s.queued_sequences, 7);
    al_batcher_free(b);
}

TEST(a_group_fed_from_two_lanes_is_forgotten_on_both)
{
    al_batcher *b = new_batcher(2, 2048, 0);
    REQUIRE(b);
    static tbuf tb;
    char err[256];
    al_batch_step *st;
    /* group 0 starts on lane 1 and goes on on lane 2 (two producers, say) */
    al_batcher_add(b, make_t(&tb, "m", 0, 2, 0, 0, 5, 5, -1), 1, 0, NULL, err, sizeof err);
    al_batcher_add(b, make_t(&tb, "m", 0, 2, 1, 0, 5, 5, -1), 2, 0, NULL, err, sizeof err);
    /* group 1 on lane 1 closes group 0, which becomes step 0 and is freed */
    al_batcher_add(b, make_t(&tb, "m", 1, 2, 0, 0, 5, 5, -1), 1, 0, NULL, err, sizeof err);
    REQUIRE(al_batcher_next_step(b, &st, err, sizeof err) == 1);
    CHECK_EQ_INT(st->n_sequences, 2);
    al_batch_step_free(st);
    /* lane 2 must not remember the freed group (ASan would see a use after free) */
    CHECK_EQ_INT(al_batcher_add(b, make_t(&tb, "m", 2, 1, 0, 0, 5, 5, -1), 2, 0, NULL, err, sizeof err),
                 AL_BATCH_ADDED);
    al_batcher_stats s;
    al_batcher_get_stats(b, &s);
    CHECK_EQ_INT(s.open_groups, 2);
    al_batcher_free(b);
}

static int drops;
static void count_drop(void *ctx, void *opaque, const char *reason)
{
    (void)ctx;
    (void)opaque;
    if (strcmp(reason, "stale") == 0) drops++;
}

TEST(stale_groups_are_dropped_or_kept_and_marked)
{
    for (int policy = 0; policy < 2; policy++) {
        al_batch_config c;
        al_batch_config_default(&c);
        c.step_sequences = 4;
        c.micro_batch_tokens = 1024;
        c.max_staleness = 2;
        c.stale_policy = policy ? AL_BATCH_STALE_KEEP : AL_BATCH_STALE_DROP;
        c.dedup_window = 64;
        c.on_drop = count_drop;
        drops = 0;
        char err[256];
        al_batcher *b = al_batcher_new(&c, err, sizeof err);
        REQUIRE(b);
        static tbuf tb;
        /* group 0: versions 10 and 7 (lag 0 and 3 at latest 10): stale as a whole.
         * group 1, 2: versions 9, 8 (lags 1, 2): fresh. */
        REQUIRE(al_batcher_set_policy_version(b, "m", 10) == 0);
        al_batcher_set_policy_version(b, "m", 4); /* older: ignored */
        al_batcher_add(b, make_t(&tb, "m", 0, 2, 0, 0, 5, 5, 10), 0, 0, NULL, err, sizeof err);
        al_batcher_add(b, make_t(&tb, "m", 0, 2, 1, 0, 5, 5, 7), 0, 0, NULL, err, sizeof err);
        al_batcher_add(b, make_t(&tb, "m", 1, 2, 0, 0, 5, 5, 9), 0, 0, NULL, err, sizeof err);
        al_batcher_add(b, make_t(&tb, "m", 1, 2, 1, 0, 5, 5, 9), 0, 0, NULL, err, sizeof err);
        al_batcher_add(b, make_t(&tb, "m", 2, 2, 0, 0, 5, 5, 8), 0, 0, NULL, err, sizeof err);
        al_batcher_add(b, make_t(&tb, "m", 2, 2, 1, 0, 5, 5, 8), 0, 0, NULL, err, sizeof err);
        al_batcher_close_all(b);
        al_batch_step *st = NULL;
        REQUIRE(al_batcher_next_step(b, &st, err, sizeof err) == 1);
        CHECK_EQ_INT(st->policy_version, 10);
        CHECK_EQ_INT(st->n_sequences, 4);
        if (policy == 0) {
            CHECK_EQ_INT(drops, 2);
            CHECK_EQ_INT(st->n_dropped_stale, 2);
            CHECK_EQ_INT(st->n_stale, 0);
            CHECK_EQ_INT(st->lags[0], 1);
            CHECK_EQ_INT(st->lags[3], 2);
        } else {
            CHECK_EQ_INT(drops, 0);
            CHECK_EQ_INT(st->n_stale, 1); /* group 0 kept, its version-7 sequence counted */
            CHECK_EQ_INT(st->lags[0], 0);
            CHECK_EQ_INT(st->lags[1], 3);
        }
        al_batch_step_free(st);
        al_batcher_free(b);
    }
}

TEST(whitening_gives_zero_mean_unit_std_over_loss_tokens)
{
    al_batch_config c;
    al_batch_config_default(&c);
    c.step_sequences = 6;
    c.micro_batch_tokens = 2048;
    c.whiten = 1;
    c.dedup_window = 64;
    char err[256];
    al_batcher *b = al_batcher_new(&c, err, sizeof err);
    REQUIRE(b);
    static tbuf tb;
    for (int g = 0; g < 3; g++)
        for (int r = 0; r < 2; r++) {
            al_transition *t = make_t(&tb, "m", g, 2, r, 0, 7, 50 + 10 * r, -1);
            if (g == 1) { /* per-token advantages on one group */
                t->token_advantages = tb.tadv;
                t->n_token_advantages = t->n_response_tokens;
            }
            al_batcher_add(b, t, 0, 0, NULL, err, sizeof err);
        }
    al_batcher_close_all(b);
    al_batch_step *st;
    REQUIRE(al_batcher_next_step(b, &st, err, sizeof err) == 1);
    double sum = 0, sq = 0;
    int64_t n = 0;
    for (size_t ci = 0; ci < st->n_chunks; ci++) {
        al_batch_chunk ch = {0};
        REQUIRE(al_batch_chunk_decode(st->chunks[ci].data, st->chunks[ci].len, &ch, err, sizeof err) == 0);
        for (size_t i = 0; i < ch.n_micro_batches; i++)
            for (size_t t = 0; t < ch.micro_batches[i].n_tokens; t++)
                if (ch.micro_batches[i].loss_mask[t]) {
                    double a = ch.micro_batches[i].advantages[t];
                    sum += a;
                    sq += a * a;
                    n++;
                }
        al_batch_chunk_clear(&ch);
    }
    REQUIRE(n == st->n_loss_tokens && n > 0);
    CHECK_NEAR(sum / (double)n, 0.0, 1e-5);
    CHECK_NEAR(sqrt(sq / (double)n), 1.0, 1e-4);
    al_batch_step_free(st);
    al_batcher_free(b);
}

TEST(duplicates_are_dropped_within_the_window)
{
    al_batch_config c;
    al_batch_config_default(&c);
    c.step_sequences = 1000;
    c.micro_batch_tokens = 1024;
    c.dedup_window = 4;
    char err[256];
    al_batcher *b = al_batcher_new(&c, err, sizeof err);
    REQUIRE(b);
    static tbuf tb;
    CHECK_EQ_INT(al_batcher_add(b, make_t(&tb, "m", 0, 1, 0, 0, 5, 5, -1), 0, 0, NULL, err, sizeof err), AL_BATCH_ADDED);
    CHECK_EQ_INT(al_batcher_add(b, make_t(&tb, "m", 0, 1, 0, 0, 5, 5, -1), 0, 0, NULL, err, sizeof err), AL_BATCH_DUPLICATE);
    al_batcher_mark_seen(b, "recovered:0:0");
    tb.t.id = "recovered:0:0";
    CHECK_EQ_INT(al_batcher_add(b, &tb.t, 0, 0, NULL, err, sizeof err), AL_BATCH_DUPLICATE);
    /* four newer ids push the first out of the window of 4 */
    for (int r = 1; r <= 4; r++)
        CHECK_EQ_INT(al_batcher_add(b, make_t(&tb, "m", 0, 1, r, 0, 5, 5, -1), 0, 0, NULL, err, sizeof err), AL_BATCH_ADDED);
    CHECK_EQ_INT(al_batcher_add(b, make_t(&tb, "m", 0, 1, 4, 0, 5, 5, -1), 0, 0, NULL, err, sizeof err), AL_BATCH_DUPLICATE);
    CHECK_EQ_INT(al_batcher_add(b, make_t(&tb, "m", 0, 1, 0, 0, 5, 5, -1), 0, 0, NULL, err, sizeof err), AL_BATCH_ADDED);
    al_batcher_stats s;
    al_batcher_get_stats(b, &s);
    CHECK_EQ_INT(s.duplicates, 3);
    CHECK_EQ_INT(s.added, 6);
    /* a large window keeps everything: 20000 ids, each refused the second time */
    al_batcher_free(b);
    c.dedup_window = 20000;
    b = al_batcher_new(&c, err, sizeof err);
    REQUIRE(b);
    char id[32];
    for (int i = 0; i < 20000; i++) {
        snprintf(id, sizeof id, "x:0:%d", i);
        al_batcher_mark_seen(b, id);
    }
    int dup = 0;
    make_t(&tb, "m", 0, 1, 0, 0, 5, 5, -1);
    for (int i = 0; i < 20000; i += 7) {
        snprintf(id, sizeof id, "x:0:%d", i);
        tb.t.id = id;
        dup += al_batcher_add(b, &tb.t, 0, 0, NULL, err, sizeof err) == AL_BATCH_DUPLICATE;
    }
    CHECK_EQ_INT(dup, (20000 + 6) / 7);
    al_batcher_free(b);
}

TEST(chunks_stay_under_the_message_limit)
{
    /* 64 KiB messages, 2048-token micro-batches (~35 KiB each): one or two per chunk */
    const int64_t max_msg = 65536;
    al_batcher *b = new_batcher(40, 2048, max_msg);
    REQUIRE(b);
    static tbuf tb;
    char err[256];
    for (int g = 0; g < 10; g++)
        for (int r = 0; r < 4; r++)
            al_batcher_add(b, make_t(&tb, "m", g, 4, r, 0, rng_int(1, 800), rng_int(1, 1200), 1), 0, 0, NULL, err, sizeof err);
    al_batcher_close_all(b);
    al_batch_step *st;
    REQUIRE(al_batcher_next_step(b, &st, err, sizeof err) == 1);
    CHECK(st->n_chunks > 1);
    CHECK(check_step_chunks(st, 2048, max_msg) == st->n_tokens);
    al_batch_step_free(st);
    al_batcher_free(b);
}

/* Feeds the same pseudo-random stream (two models, lanes, idle closes) to a batcher and
 * hashes every chunk it produces. */
static void run_stream(uint64_t seed, al_buf *all)
{
    rng_state = seed;
    al_batcher *b = new_batcher(16, 4096, 0);
    if (!b) return;
    static tbuf tb;
    char err[256];
    int64_t now = 0;
    for (int g = 0; g < 40; g++) {
        const char *model = g % 3 ? "qwen" : "llama";
        int lane = rng_int(0, 3);
        for (int r = 0; r < 4; r++)
            for (int call = 0; call < rng_int(1, 2); call++)
                al_batcher_add(b, make_t(&tb, model, g, 4, r, call, rng_int(1, 1000), rng_int(1, 1000), 5), lane, now, NULL, err, sizeof err);
        now += 10;
        al_batcher_close_idle(b, now, 25, NULL, NULL);
        al_batch_step *st;
        while (al_batcher_next_step(b, &st, err, sizeof err) == 1) {
            for (size_t c = 0; c < st->n_chunks; c++) al_buf_append(all, st->chunks[c].data, st->chunks[c].len);
            al_batch_step_free(st);
        }
    }
    al_batcher_free(b);
}

TEST(same_input_gives_the_same_bytes)
{
    al_buf a = {0}, b2 = {0}, c = {0};
    run_stream(12345, &a);
    run_stream(12345, &b2);
    run_stream(999, &c);
    CHECK(a.len > 100000);
    CHECK(a.len == b2.len && memcmp(a.data, b2.data, a.len) == 0);
    CHECK(a.len != c.len || memcmp(a.data, c.data, a.len) != 0);
    al_buf_free(&a);
    al_buf_free(&b2);
    al_buf_free(&c);
}

TEST(bad_transitions_and_configs_are_refused_with_reasons)
{
    al_batcher *b = new_batcher(4, 100, 0);
    REQUIRE(b);
    static tbuf tb;
    char err[256];
    CHECK_EQ_INT(al_batcher_add(b, make_t(&tb, "m", 0, 1, 0, 0, 60, 50, -1), 0, 0, NULL, err, sizeof err), AL_BATCH_INVALID);
    CHECKF(strstr(err, "110 tokens") && strstr(err, "budget of 100"), "%s", err);
    make_t(&tb, "m", 0, 1, 0, 0, 5, 5, -1);
    tb.t.n_loss_mask = 3;
    CHECK_EQ_INT(al_batcher_add(b, &tb.t, 0, 0, NULL, err, sizeof err), AL_BATCH_INVALID);
    CHECKF(strstr(err, "loss_mask length"), "%s", err);
    make_t(&tb, "m", 0, 1, 0, 0, 5, 5, -1);
    tb.t.model = "";
    CHECK_EQ_INT(al_batcher_add(b, &tb.t, 0, 0, NULL, err, sizeof err), AL_BATCH_INVALID);
    CHECKF(strstr(err, "model name is empty"), "%s", err);
    make_t(&tb, "m", 0, 1, 0, 0, 5, 5, -1);
    tb.t.advantage = NAN;
    CHECK_EQ_INT(al_batcher_add(b, &tb.t, 0, 0, NULL, err, sizeof err), AL_BATCH_INVALID);
    /* finite as a double, infinite as the float the trainer reads */
    make_t(&tb, "m", 0, 1, 0, 0, 5, 5, -1);
    tb.t.advantage = -1e39;
    CHECK_EQ_INT(al_batcher_add(b, &tb.t, 0, 0, NULL, err, sizeof err), AL_BATCH_INVALID);
    CHECKF(strstr(err, "advantage is not a finite 32-bit float"), "%s", err);
    make_t(&tb, "m", 0, 1, 0, 0, 5, 5, -1);
    tb.t.reward = 1e300;
    CHECK_EQ_INT(al_batcher_add(b, &tb.t, 0, 0, NULL, err, sizeof err), AL_BATCH_INVALID);
    CHECKF(strstr(err, "reward is not a finite 32-bit float"), "%s", err);
    make_t(&tb, "m", 0, 1, 0, 0, 5, 0, -1);
    CHECK_EQ_INT(al_batcher_add(b, &tb.t, 0, 0, NULL, err, sizeof err), AL_BATCH_INVALID);
    make_t(&tb, "m", 0, 1, 0, 0, 5, 5, -1);
    tb.mask[2] = 7;
    CHECK_EQ_INT(al_batcher_add(b, &tb.t, 0, 0, NULL, err, sizeof err), AL_BATCH_INVALID);
    make_t(&tb, "m", 0, 1, 0, 0, 5, 5, -1);
    tb.t.group_id = "";
    CHECK_EQ_INT(al_batcher_add(b, &tb.t, 0, 0, NULL, err, sizeof err), AL_BATCH_INVALID);
    /* step numbers count up from 0 and stop far before they could overflow */
    CHECK_EQ_INT(al_batcher_set_next_step(b, "m", -1), -1);
    CHECK_EQ_INT(al_batcher_set_next_step(b, "m", INT64_MAX), -1);
    CHECK_EQ_INT(al_batcher_set_next_step(b, "m", AL_STEP_MAX + 1), -1);
    CHECK_EQ_INT(al_batcher_set_next_step(b, "m", AL_STEP_MAX), 0);
    CHECK(al_batcher_next_step_number(b, "m") == AL_STEP_MAX);
    CHECK_EQ_INT(al_batcher_set_next_step(b, "m", 0), 0);
    /* an invalid transition is not remembered: the fixed one is accepted */
    make_t(&tb, "m", 0, 1, 0, 0, 5, 5, -1);
    CHECK_EQ_INT(al_batcher_add(b, &tb.t, 0, 0, NULL, err, sizeof err), AL_BATCH_ADDED);
    al_batcher_free(b);

    al_batch_config c;
    al_batch_config_default(&c);
    c.step_sequences = 0;
    CHECK(al_batcher_new(&c, err, sizeof err) == NULL);
    CHECKF(strstr(err, "positive target"), "%s", err);
    al_batch_config_default(&c);
    c.step_tokens = 100;
    CHECK(al_batcher_new(&c, err, sizeof err) == NULL);
    al_batch_config_default(&c);
    c.micro_batch_tokens = 65536;
    c.max_message_bytes = 100000;
    CHECK(al_batcher_new(&c, err, sizeof err) == NULL);
    CHECKF(strstr(err, "limited to 100000 bytes"), "%s", err);
}

/* Many random streams: several models, lanes, multi-call rollouts, late transitions of closed
 * groups, idle closes; every transition ends up in exactly one step (or is still held), no
 * group of a step is split between steps, and every chunk checks out. */
TEST(random_streams_keep_every_transition_once)
{
    static tbuf tb;
    char err[256];
    for (int round = 0; round < 20; round++) {
        rng_state = 1000 + (uint64_t)round;
        al_batch_config c;
        al_batch_config_default(&c);
        c.step_sequences = rng_int(1, 40);
        c.micro_batch_tokens = 3000;
        c.max_message_bytes = rng_int(0, 1) ? 120000 : 1048576;
        c.max_staleness = -1;
        c.dedup_window = 100000;
        al_batcher *b = al_batcher_new(&c, err, sizeof err);
        REQUIRE(b);
        /* ids are "gG-rR:0:C": step_of_seq[G][R][C] records where each went */
        static int where[60][6][3];
        memset(where, -1, sizeof where);
        int added = 0, stepped = 0;
        int64_t now = 0;
        int64_t step_no[2] = {0, 0};
        for (int g = 0; g < 60; g++) {
            const char *model = g % 2 ? "a" : "b";
            int lane = rng_int(0, 3), gs = rng_int(1, 6);
            for (int r = 0; r < gs; r++)
                for (int call = 0; call < rng_int(1, 3); call++) {
                    al_transition *t = make_t(&tb, model, g, gs, r, call, rng_int(1, 1500), rng_int(1, 1400), -1);
                    /* now and then a transition comes on another lane (two producers) */
                    int ln = rng_int(0, 9) ? lane : rng_int(0, 3);
                    if (al_batcher_add(b, t, ln, now, (void *)(intptr_t)1, err, sizeof err) == AL_BATCH_ADDED)
                        added++;
                    now += rng_int(0, 3);
                }
            if (rng_int(0, 4) == 0) al_batcher_close_idle(b, now, 5, NULL, NULL);
            al_batch_step *st;
            for (;;) {
                int r = (g == 59) ? (al_batcher_close_all(b), al_batcher_flush_step(b, &st, err, sizeof err))
                                  : al_batcher_next_step(b, &st, err, sizeof err);
                if (r != 1) break;
                int mi = strcmp(st->model, "a") == 0;
                CHECK_EQ_INT(st->step, step_no[mi]++);
                check_step_chunks(st, 3000, c.max_message_bytes);
                stepped += st->n_sequences;
                for (size_t ci = 0; ci < st->n_chunks; ci++) {
                    al_batch_chunk ch = {0};
                    REQUIRE(al_batch_chunk_decode(st->chunks[ci].data, st->chunks[ci].len, &ch, err, sizeof err) == 0);
                    for (size_t i = 0; i < ch.n_micro_batches; i++)
                        for (size_t s = 0; s < ch.micro_batches[i].n_sequences; s++) {
                            int G, R, C;
                            REQUIRE(sscanf(ch.micro_batches[i].transition_ids[s], "g%d-r%d:0:%d", &G, &R, &C) == 3);
                            CHECKF(where[G][R][C] == -1, "g%d-r%d:%d in two steps", G, R, C);
                            where[G][R][C] = (int)(st->step * 2 + mi);
                        }
                    al_batch_chunk_clear(&ch);
                }
                al_batch_step_free(st);
            }
        }
        CHECK_EQ_INT(stepped, added);
        /* a group's transitions are all in one step */
        int split = 0;
        for (int g = 0; g < 60; g++) {
            int w0 = -2;
            for (int r = 0; r < 6; r++)
                for (int call = 0; call < 3; call++) {
                    int w = where[g][r][call];
                    if (w < 0) continue;
                    if (w0 == -2) w0 = w;
                    else if (w != w0) split++;
                }
        }
        /* steps are taken between groups here, so no transition arrives after its group left:
         * lane hops, idle closes and the lane rule must never split one */
        CHECKF(split == 0, "round %d: %d transitions in another step than their group", round, split);
        al_batcher_free(b);
    }
}
