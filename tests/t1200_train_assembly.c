/* 1200: the trainer's step assembly (stages/train/assembler.c, no Kafka): steps from their
 * chunks in order, incomplete steps wait, duplicates dropped, a step re-sent from chunk 0
 * replaces the cut-short attempt, applied steps skipped, other models ignored, bad chunks and
 * inconsistent steps refused with a reason, and the assembled chunks train the tiny model. */
#include "testlib.h"

#include "t1249_train_fixtures.h"

#include "model/config.h"
#include "model/model.h"
#include "model/trainer.h"
#include "train/assembler.h"

#include <math.h>
#include <stdlib.h>

static al_buf bufs[16];

/* Encodes into bufs[slot]; returns it. */
static al_buf *chunk(int slot, const char *model, int64_t step, int idx, int count, int mbs,
                     int seed)
{
    if (fx_encode_chunk(&bufs[slot], model, step, idx, count, mbs, seed, -1, 0) != 0) abort();
    return &bufs[slot];
}

static void free_bufs(void)
{
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) al_buf_free(&bufs[i]);
}

static al_train_asm_result add(al_train_asm *a, const al_buf *b, void *opaque, char *why)
{
    return al_train_asm_add(a, b->data, b->len, opaque, why, 512);
}

static int released;
static void count_release(void *ctx, void *opaque)
{
    (void)ctx;
    (void)opaque;
    released++;
}

static int tags[16];

TEST(step_from_chunks_in_order)
{
    char err[256], why[512];
    al_train_asm *a = al_train_asm_new("tiny", 512, 2048, -1, err, sizeof err);
    REQUIRE(a);
    al_train_ready *r = NULL;
    CHECK_EQ_INT(add(a, chunk(0, "tiny", 0, 0, 2, 3, 1), &tags[0], why), AL_TRAIN_ASM_HELD);
    CHECK_EQ_INT(al_train_asm_next(a, &r), 0); /* incomplete: waits */
    CHECK_EQ_INT((int)al_train_asm_pending(a), 1);
    CHECK_EQ_INT(add(a, chunk(1, "tiny", 0, 1, 2, 3, 1), &tags[1], why), AL_TRAIN_ASM_HELD);
    REQUIRE(al_train_asm_next(a, &r) == 1);
    CHECKF(!r->bad, "%s", r->reason);
    CHECK_EQ_INT((int)r->step, 0);
    CHECK_EQ_INT(r->nchunks, 6);
    CHECK_EQ_INT((int)r->n_current, 2);
    CHECK(r->current[0] == &tags[0] && r->current[1] == &tags[1]);
    CHECK_EQ_INT((int)r->n_retired, 0);
    CHECK_EQ_INT((int)r->tokens, 6 * FX_MB_TOKENS);
    CHECK_EQ_INT((int)r->sequences, 12);
    CHECK_NEAR(r->reward_mean, 0.5, 1e-12);
    /* micro-batch by micro-batch, with the mask as floats */
    for (int k = 0; k < r->nchunks; k++) {
        const al_train_chunk *c = &r->chunks[k];
        CHECK_EQ_INT(c->T, FX_MB_TOKENS);
        CHECK_EQ_INT(c->nseq, 2);
        CHECK_EQ_INT(c->cu_seqlens[1], FX_SEQ0);
        CHECK_NEAR(c->mask[0], 0.0, 0);
        CHECK_NEAR(c->mask[3], 1.0, 0);
        CHECK_NEAR(c->adv[FX_SEQ0 + 3], -1.0, 0);
        CHECK_EQ_INT(c->positions[FX_SEQ0], 0);
    }
    /* the first micro-batch of the second chunk comes fourth */
    CHECK_EQ_INT(r->chunks[3].tokens[0], (1 * 131 + 3 * 29) % 500);
    al_train_ready_free(r);
    CHECK_EQ_INT((int)al_train_asm_last_applied(a), 0);
    CHECK_EQ_INT((int)al_train_asm_pending(a), 0);
    /* chunks of step 0 again (a restart re-reads them): skipped */
    CHECK_EQ_INT(add(a, chunk(0, "tiny", 0, 0, 2, 3, 1), &tags[2], why), AL_TRAIN_ASM_APPLIED);
    CHECK_EQ_INT(al_train_asm_next(a, &r), 0);
    al_train_asm_free(a, NULL, NULL);
    free_bufs();
}

TEST(duplicates_dropped_and_resend_replaces_attempt)
{
    char err[256], why[512];
    al_train_asm *a = al_train_asm_new("tiny", 512, 2048, -1, err, sizeof err);
    REQUIRE(a);
    al_train_ready *r = NULL;
    CHECK_EQ_INT(add(a, chunk(0, "tiny", 4, 0, 3, 1, 1), &tags[0], why), AL_TRAIN_ASM_HELD);
    CHECK_EQ_INT(add(a, chunk(0, "tiny", 4, 0, 3, 1, 1), &tags[1], why), AL_TRAIN_ASM_DUPLICATE);
    CHECK_EQ_INT(add(a, chunk(1, "tiny", 4, 1, 3, 1, 1), &tags[2], why), AL_TRAIN_ASM_HELD);
    CHECK_EQ_INT(add(a, chunk(1, "tiny", 4, 1, 3, 1, 1), &tags[3], why), AL_TRAIN_ASM_DUPLICATE);
    /* the batch stage crashed and rebuilt step 4 (other contents, two chunks): from chunk 0 */
    CHECK_EQ_INT(add(a, chunk(2, "tiny", 4, 0, 2, 1, 7), &tags[4], why), AL_TRAIN_ASM_HELD);
    CHECK_EQ_INT(al_train_asm_next(a, &r), 0);
    CHECK_EQ_INT(add(a, chunk(3, "tiny", 4, 1, 2, 1, 7), &tags[5], why), AL_TRAIN_ASM_HELD);
    REQUIRE(al_train_asm_next(a, &r) == 1);
    CHECKF(!r->bad, "%s", r->reason);
    CHECK_EQ_INT(r->nchunks, 2);
    CHECK_EQ_INT((int)r->n_current, 2);
    CHECK(r->current[0] == &tags[4] && r->current[1] == &tags[5]);
    CHECK_EQ_INT((int)r->n_retired, 2); /* the first attempt's chunks 0 and 1 */
    CHECK_EQ_INT(r->chunks[0].tokens[0], (7 * 131) % 500);
    al_train_ready_free(r);
    al_train_asm_free(a, NULL, NULL);
    free_bufs();
}

TEST(skips_applied_and_other_models)
{
    char err[256], why[512];
    al_train_asm *a = al_train_asm_new("tiny", 512, 2048, 3, err, sizeof err);
    REQUIRE(a);
    CHECK_EQ_INT(add(a, chunk(0, "tiny", 3, 0, 1, 1, 1), &tags[0], why), AL_TRAIN_ASM_APPLIED);
    CHECK_EQ_INT(add(a, chunk(1, "other", 4, 0, 1, 1, 1), &tags[1], why), AL_TRAIN_ASM_OTHER_MODEL);
    CHECKF(strstr(why, "other") != NULL, "%s", why);
    CHECK_EQ_INT(add(a, chunk(2, "tiny", 4, 0, 2, 1, 1), &tags[2], why), AL_TRAIN_ASM_HELD);
    released = 0;
    al_train_asm_free(a, count_release, NULL); /* held chunks are handed back */
    CHECK_EQ_INT(released, 1);
    free_bufs();
}

TEST(bad_chunks_refused_with_reason)
{
    char err[256], why[512];
    al_train_asm *a = al_train_asm_new("tiny", 512, 2048, -1, err, sizeof err);
    REQUIRE(a);
    static const uint8_t junk[] = {0xC3, 0x01, 1, 2, 3, 4, 5, 6, 7, 8, 9};
    CHECK_EQ_INT(al_train_asm_add(a, junk, sizeof junk, NULL, why, sizeof why), AL_TRAIN_ASM_BAD);
    CHECKF(strstr(why, "not a BatchChunk") != NULL, "%s", why);
    CHECK_EQ_INT(al_train_asm_add(a, NULL, 0, NULL, why, sizeof why), AL_TRAIN_ASM_BAD);
    /* a token id outside the 512-token vocabulary */
    REQUIRE(fx_encode_chunk(&bufs[0], "tiny", 0, 0, 1, 1, 1, 512, 0) == 0);
    CHECK_EQ_INT(add(a, &bufs[0], NULL, why), AL_TRAIN_ASM_BAD);
    CHECKF(strstr(why, "id 512 is outside the vocabulary") != NULL, "%s", why);
    REQUIRE(fx_encode_chunk(&bufs[0], "tiny", 0, 0, 1, 1, 1, -3, 0) == 0);
    CHECK_EQ_INT(add(a, &bufs[0], NULL, why), AL_TRAIN_ASM_HELD); /* -3 means "none" */
    al_train_ready *r = NULL;
    REQUIRE(al_train_asm_next(a, &r) == 1);
    CHECK(!r->bad);
    al_train_ready_free(r);
    /* a later chunk that disagrees with the step's chunk 0 */
    CHECK_EQ_INT(add(a, chunk(1, "tiny", 1, 0, 2, 1, 1), &tags[0], why), AL_TRAIN_ASM_HELD);
    CHECK_EQ_INT(add(a, chunk(2, "tiny", 1, 1, 3, 1, 1), &tags[1], why), AL_TRAIN_ASM_BAD);
    CHECKF(strstr(why, "chunk_count") != NULL, "%s", why);
    /* index outside the count */
    CHECK_EQ_INT(add(a, chunk(3, "tiny", 1, 2, 2, 1, 1), &tags[1], why), AL_TRAIN_ASM_BAD);
    /* totals that do not add up: the complete step comes out bad */
    CHECK_EQ_INT(add(a, chunk(4, "tiny", 1, 1, 2, 1, 1), &tags[2], why), AL_TRAIN_ASM_HELD);
    REQUIRE(al_train_asm_next(a, &r) == 1);
    CHECK(!r->bad);
    al_train_ready_free(r);
    REQUIRE(fx_encode_chunk(&bufs[5], "tiny", 2, 0, 1, 2, 1, -1, 3) == 0);
    CHECK_EQ_INT(add(a, &bufs[5], &tags[3], why), AL_TRAIN_ASM_HELD);
    REQUIRE(al_train_asm_next(a, &r) == 1);
    CHECK(r->bad);
    CHECKF(strstr(r->reason, "announce") != NULL && strstr(r->reason, "tokens") != NULL, "%s", r->reason);
    CHECK_EQ_INT((int)r->n_current, 1);
    CHECK(r->current[0] == &tags[3]);
    al_train_ready_free(r);
    /* a step number beyond the contract's: taken, it would count every later step as
     * trained on */
    CHECK_EQ_INT(add(a, chunk(6, "tiny", INT64_MAX, 0, 1, 1, 1), NULL, why), AL_TRAIN_ASM_BAD);
    CHECKF(strstr(why, "beyond the largest step number") != NULL, "%s", why);
    CHECK_EQ_INT(add(a, chunk(7, "tiny", 3, 0, 1, 1, 1), NULL, why), AL_TRAIN_ASM_HELD);
    REQUIRE(al_train_asm_next(a, &r) == 1);
    CHECK(!r->bad && r->step == 3);
    al_train_ready_free(r);
    al_train_asm_free(a, NULL, NULL);
    free_bufs();
}

TEST(incomplete_step_overtaken_comes_out_bad)
{
    char err[256], why[512];
    al_train_asm *a = al_train_asm_new("tiny", 512, 2048, -1, err, sizeof err);
    REQUIRE(a);
    al_train_ready *r = NULL;
    CHECK_EQ_INT(add(a, chunk(0, "tiny", 5, 0, 2, 1, 1), &tags[0], why), AL_TRAIN_ASM_HELD);
    CHECK_EQ_INT(add(a, chunk(1, "tiny", 6, 0, 1, 1, 1), &tags[1], why), AL_TRAIN_ASM_HELD);
    REQUIRE(al_train_asm_next(a, &r) == 1);
    CHECK(r->bad);
    CHECK_EQ_INT((int)r->step, 5);
    CHECKF(strstr(r->reason, "incomplete") != NULL, "%s", r->reason);
    CHECK(r->n_current == 1 && r->current[0] == &tags[0]);
    al_train_ready_free(r);
    REQUIRE(al_train_asm_next(a, &r) == 1);
    CHECK(!r->bad);
    CHECK_EQ_INT((int)r->step, 6);
    al_train_ready_free(r);
    CHECK_EQ_INT(al_train_asm_next(a, &r), 0);
    /* a straggler of step 5 is now behind the last step trained on */
    CHECK_EQ_INT(add(a, chunk(2, "tiny", 5, 1, 2, 1, 1), &tags[2], why), AL_TRAIN_ASM_APPLIED);
    al_train_asm_free(a, NULL, NULL);
    free_bufs();
}

/* The assembled chunks are what the trainer takes: SFT on one fixed step lowers the loss. */
TEST(assembled_chunks_train_the_tiny_model)
{
    char err[512], why[512];
    const char *src = getenv("ARCLIGHT_SOURCE_DIR");
    char path[1024];
    snprintf(path, sizeof path, "%s/tests/model/tiny-qwen2.json", src ? src : ".");
    al_model_config cfg;
    REQUIREF(al_model_config_load(&cfg, path, err, sizeof err) == 0, "%s", err);
    al_model *m = al_model_new(&cfg, err, sizeof err);
    REQUIRE(m);
    al_model_init_random(m, 3);
    al_trainer_config tc;
    al_trainer_config_default(&tc);
    REQUIRE(al_trainer_config_set(&tc, "loss", "sft", err, sizeof err) == 0);
    REQUIRE(al_trainer_config_set(&tc, "lr", "0.01", err, sizeof err) == 0);
    al_trainer *tr = al_trainer_new(m, NULL, &tc, err, sizeof err);
    REQUIREF(tr, "%s", err);
    al_train_asm *a = al_train_asm_new("tiny", cfg.vocab_size, cfg.max_position_embeddings, -1,
                                       err, sizeof err);
    REQUIRE(a);
    double first = 0, last = 0;
    for (int s = 0; s < 4; s++) {
        CHECK_EQ_INT(add(a, chunk(0, "tiny", s, 0, 2, 2, 1), NULL, why), AL_TRAIN_ASM_HELD);
        CHECK_EQ_INT(add(a, chunk(1, "tiny", s, 1, 2, 2, 1), NULL, why), AL_TRAIN_ASM_HELD);
        al_train_ready *r = NULL;
        REQUIRE(al_train_asm_next(a, &r) == 1);
        REQUIRE(!r->bad);
        al_train_stats st;
        REQUIREF(al_trainer_step(tr, r->chunks, r->nchunks, &st, err, sizeof err) == 0, "%s", err);
        CHECK_NEAR(st.tokens, 4 * FX_MB_LOSS_TOKENS, 0.5);
        if (s == 0) first = st.loss;
        last = st.loss;
        al_train_ready_free(r);
    }
    CHECKF(last < first - 0.05, "loss %g -> %g", first, last);
    al_train_asm_free(a, NULL, NULL);
    al_trainer_free(tr);
    al_model_free(m);
    free_bufs();
}

/* An empty sequence at the end of a micro-batch (cu_seqlens 0, 3, 3) and a 1-token
 * micro-batch are shapes the trainer takes; neither is read out of bounds. */
TEST(empty_sequence_and_single_token_micro_batch)
{
    char err[256], why[512];
    int32_t tok[3] = {5, 6, 7}, pos[3] = {0, 1, 2}, cu[3] = {0, 3, 3}, cu1[2] = {0, 1};
    uint8_t mask[3] = {0, 1, 1};
    float logp[3] = {-1, -1, -1}, adv[3] = {1, 1, 1};
    const char *ids[2] = {"a:0:0", "b:0:0"};
    int64_t pv[2] = {0, 0};
    al_micro_batch mb[2] = {
        {.index = 0, .n_tokens = 3, .token_ids = tok, .loss_mask = mask, .position_ids = pos,
         .rollout_logprobs = logp, .advantages = adv, .n_sequences = 2, .cu_seqlens = cu,
         .transition_ids = ids, .policy_versions = pv},
        {.index = 1, .n_tokens = 1, .token_ids = tok, .loss_mask = mask + 1, .position_ids = pos,
         .rollout_logprobs = logp, .advantages = adv, .n_sequences = 1, .cu_seqlens = cu1,
         .transition_ids = ids, .policy_versions = pv},
    };
    al_batch_chunk c = {.model = "tiny", .step = 0, .chunk_index = 0, .chunk_count = 1,
                        .step_micro_batches = 2, .step_sequences = 3, .step_tokens = 4,
                        .step_loss_tokens = 3, .micro_batches = mb, .n_micro_batches = 2};
    al_buf b = {0};
    REQUIREF(al_batch_chunk_encode(&c, &b, err, sizeof err) == 0, "%s", err);
    al_train_asm *a = al_train_asm_new("tiny", 512, 2048, -1, err, sizeof err);
    REQUIRE(a);
    CHECKF(add(a, &b, NULL, why) == AL_TRAIN_ASM_HELD, "%s", why);
    al_train_ready *r = NULL;
    REQUIRE(al_train_asm_next(a, &r) == 1);
    CHECKF(!r->bad, "%s", r->reason);
    CHECK_EQ_INT(r->nchunks, 2);
    CHECK_EQ_INT((int)r->loss_tokens, 2); /* the 1-token sequence predicts nothing */
    al_train_ready_free(r);
    al_train_asm_free(a, NULL, NULL);
    al_buf_free(&b);
}

/* The sampler's entropy per call position (assembler.h): a step of one micro-batch holding
 * rollout A's calls 2 and 0 (in that order) and rollout B's call 5, 3 tokens each, the last
 * two trained. Position 0 is A:0 (-logprob 1, 1) and B:5 (2, 2): mean 1.5; position 1 is
 * A:2 (0.5, 0.5); positions 2 and 3 have no call: NaN. */
TEST(sampled_entropy_by_call_position)
{
    char err[256], why[512];
    const int32_t tok[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9}, pos[9] = {0, 1, 2, 0, 1, 2, 0, 1, 2};
    const int32_t cu[4] = {0, 3, 6, 9};
    const uint8_t mask[9] = {0, 1, 1, 0, 1, 1, 0, 1, 1};
    const float lp[9] = {0, -0.5f, -0.5f, 0, -1, -1, 0, -2, -2}, adv[9] = {0};
    const char *ids[3] = {"A:0:2", "A:0:0", "B:0:5"};
    const int64_t pv[3] = {0, 0, 0};
    al_micro_batch mb = {.index = 0, .n_tokens = 9, .token_ids = tok, .loss_mask = mask,
                         .position_ids = pos, .rollout_logprobs = lp, .advantages = adv,
                         .n_sequences = 3, .cu_seqlens = cu, .transition_ids = ids,
                         .policy_versions = pv};
    al_batch_chunk c = {.model = "tiny", .step = 0, .chunk_index = 0, .chunk_count = 1,
                        .step_micro_batches = 1, .step_sequences = 3, .step_tokens = 9,
                        .step_loss_tokens = 6, .micro_batches = &mb, .n_micro_batches = 1};
    al_buf b;
    al_buf_init(&b);
    REQUIRE(al_batch_chunk_encode(&c, &b, err, sizeof err) == 0);
    al_train_asm *a = al_train_asm_new("tiny", 512, 2048, -1, err, sizeof err);
    REQUIRE(a);
    al_train_ready *r = NULL;
    CHECK_EQ_INT(add(a, &b, &tags[0], why), AL_TRAIN_ASM_HELD);
    REQUIRE(al_train_asm_next(a, &r) == 1);
    CHECKF(!r->bad, "%s", r->reason);
    CHECK_NEAR(r->call_entropy[0], 1.5, 1e-12);
    CHECK_NEAR(r->call_entropy[1], 0.5, 1e-12);
    CHECK(isnan(r->call_entropy[2]) && isnan(r->call_entropy[3]));
    al_train_ready_free(r);
    al_train_asm_free(a, NULL, NULL);
    al_buf_free(&b);
}
