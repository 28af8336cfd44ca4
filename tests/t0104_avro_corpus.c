/*
 * t0104_avro_corpus: the fuzz seed corpus (tests/fuzz/corpus) holds one valid message of
 * each schema, as the current codecs write them. The test fails when a schema change made
 * the corpus stale; regenerate it with
 *   ARCLIGHT_WRITE_CORPUS=tests/fuzz/corpus build/t0104_avro_corpus
 */
#include "avro/codec.h"
#include "core/util.h"
#include "t0199_avro_fixtures.h"
#include "testlib.h"

static char err[512];

typedef struct seed {
    const char *file;
    al_buf msg;
} seed;

static size_t make_seeds(seed *s)
{
    size_t n = 0;
    fx_span f;
    fx_span_llm(&f, 16, 6, 120);
    s[n].file = "span_llm_call.bin";
    al_span_encode(&f.s, &s[n++].msg, err, sizeof err);
    fx_span_free(&f);
    al_span sp;
    fx_span_reward(&sp);
    s[n].file = "span_reward.bin";
    al_span_encode(&sp, &s[n++].msg, err, sizeof err);
    fx_span_end(&sp);
    s[n].file = "span_rollout_end.bin";
    al_span_encode(&sp, &s[n++].msg, err, sizeof err);
    fx_transition ft;
    fx_transition_fill(&ft);
    s[n].file = "transition.bin";
    al_transition_encode(&ft.t, &s[n++].msg, err, sizeof err);
    fx_batch fb;
    fx_batch_fill(&fb);
    s[n].file = "batch_chunk.bin";
    al_batch_chunk_encode(&fb.c, &s[n++].msg, err, sizeof err);
    al_policy_version p;
    fx_policy_fill(&p);
    s[n].file = "policy_version.bin";
    al_policy_version_encode(&p, &s[n++].msg, err, sizeof err);
    al_deadletter d;
    fx_deadletter_fill(&d);
    s[n].file = "deadletter.bin";
    al_deadletter_encode(&d, &s[n++].msg, err, sizeof err);
    return n;
}

TEST(corpus_matches_the_current_codecs)
{
    seed seeds[8] = {{0}};
    size_t n = make_seeds(seeds);
    const char *write_dir = getenv("ARCLIGHT_WRITE_CORPUS");
    for (size_t i = 0; i < n; i++) {
        char path[512];
        if (write_dir) {
            snprintf(path, sizeof path, "%s/%s", write_dir, seeds[i].file);
            CHECKF(al_file_write_atomic(path, seeds[i].msg.data, seeds[i].msg.len, err, sizeof err) == 0, "%s", err);
        }
        snprintf(path, sizeof path, "tests/fuzz/corpus/%s", seeds[i].file);
        size_t len = 0;
        char *have = al_file_read(path, &len, err, sizeof err);
        CHECKF(have, "%s (regenerate the corpus: see the top of this file)", err);
        if (have)
            CHECKF(len == seeds[i].msg.len && memcmp(have, seeds[i].msg.data, len) == 0,
                   "%s is stale: regenerate the corpus (see the top of this file)", path);
        free(have);
        al_buf_free(&seeds[i].msg);
    }
}
