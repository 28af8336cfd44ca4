/*
 * 1100: the sampling half of inference (lib/model/infer.h). Raw logprobs equal the trainer's
 * (al_logprob_forward at temperature 1) for the same logits; tokens generated with the KV
 * cache carry logprobs equal to what the trainer's packed forward gives for the whole
 * sequence (the importance-sampling contract); seeded sampling is deterministic; greedy,
 * top-k and top-p keep exactly the candidates they promise; the sampled frequencies follow
 * softmax(logits / T). The batched forward (several sequences, each a prompt chunk or one
 * decode token, in one pass) gives the logits al_model_forward gives for each whole sequence,
 * for Qwen2 and Qwen3 shapes.
 */
#define _GNU_SOURCE
#include "testlib.h"

#include "model/infer.h"
#include "model/logprob.h"
#include "model/model.h"

static al_model *tiny_model_arch(al_model_arch arch)
{
    al_model_config c = {0};
    char err[256];
    al_model_config_set_arch(&c, arch);
    c.vocab_size = 96, c.hidden_size = 32, c.intermediate_size = 48, c.num_layers = 2;
    c.num_heads = 4, c.num_kv_heads = 2, c.head_dim = arch == AL_MODEL_ARCH_QWEN3 ? 10 : 8;
    c.rms_norm_eps = 1e-6, c.rope_theta = 1e4;
    c.tie_word_embeddings = arch == AL_MODEL_ARCH_QWEN2, c.max_position_embeddings = 256,
    c.bos_token_id = c.eos_token_id = -1;
    al_model *m = al_model_new(&c, err, sizeof err);
    if (!m) return NULL;
    al_model_init_random(m, 11);
    /* sharper than HF's 0.02 init, so that logprobs spread over several nats */
    for (size_t i = 0; i < al_model_num_tensors(m); i++) {
        const al_model_tensor *t = &al_model_tensors(m)[i];
        if (strstr(t->name, "norm")) continue;
        for (size_t j = 0; j < t->numel; j++)
            al_model_params(m)[t->offset + j] *= 8.0f;
    }
    return m;
}

static al_model *tiny_model(void)
{
    return tiny_model_arch(AL_MODEL_ARCH_QWEN2);
}

TEST(raw_logprobs_equal_logprob_forward)
{
    enum { V = 300 };
    float logits[V];
    al_infer_rng r;
    al_infer_rng_seed(&r, 1, 0);
    for (int j = 0; j < V; j++)
        logits[j] = (float)(al_infer_rng_uniform(&r) * 40 - 20);
    logits[7] = 88.0f; /* large: the max must be subtracted */
    double lse = al_infer_logsumexp(logits, V);
    char err[128];
    for (int32_t t = 0; t < V; t += 13) {
        float lp;
        REQUIRE(al_logprob_forward(logits, &t, 1, V, 1.0f, &lp, NULL, err, sizeof err) == 0);
        CHECK_NEAR(al_infer_logprob(logits, lse, t), lp, 1e-5);
        /* and at a temperature, as the trainer's temperature setting computes it */
        REQUIRE(al_logprob_forward(logits, &t, 1, V, 0.6f, &lp, NULL, err, sizeof err) == 0);
        double lse_t = al_infer_logsumexp_t(logits, V, 0.6f);
        CHECK_NEAR(al_infer_logprob_t(logits, lse_t, t, 0.6f), lp, 1e-5);
    }
    int32_t ids[5];
    double lps[5];
    CHECK_EQ_INT(al_infer_top_logprobs(logits, V, lse, 5, ids, lps), 5);
    CHECK_EQ_INT(ids[0], 7);
    for (int i = 1; i < 5; i++)
        CHECK(lps[i] <= lps[i - 1]);
    /* nothing outside the top 5 beats the 5th */
    int better = 0;
    for (int j = 0; j < V; j++) {
        int in = 0;
        for (int i = 0; i < 5; i++)
            in |= ids[i] == j;
        if (!in && logits[j] > logits[ids[4]]) better++;
    }
    CHECK_EQ_INT(better, 0);
    CHECK_EQ_INT(al_infer_top_logprobs(logits, V, lse, V + 1, ids, lps), -1);
}

TEST(kv_decode_logprobs_equal_trainer)
{
    al_model *m = tiny_model();
    REQUIRE(m);
    int V = al_model_config_of(m)->vocab_size;
    char err[256];
    al_infer_kv *kv = al_infer_kv_new(m, 128, err, sizeof err);
    al_infer_scratch *sc = al_infer_scratch_new();
    REQUIRE(kv && sc);
    al_infer_sampler s;
    REQUIRE(al_infer_sampler_init(&s, V) == 0);
    al_infer_rng rng;
    al_infer_rng_seed(&rng, 42, 0);
    al_infer_sampling sp = {0.9, 0.95, 40};
    enum { P = 9, G = 40 };
    int32_t seq[P + G];
    for (int i = 0; i < P; i++)
        seq[i] = (int32_t)(i * 7 % V);
    float *logits = malloc(sizeof(float) * V);
    double served[G];
    const int32_t *in[1] = {seq};
    int nin[1] = {P};
    REQUIRE(al_infer_forward(m, sc, &kv, in, nin, 1, logits, err, sizeof err) == 0);
    for (int g = 0; g < G; g++) {
        int32_t id = al_infer_sample(&s, logits, &sp, &rng);
        served[g] = al_infer_logprob(logits, al_infer_logsumexp(logits, V), id);
        seq[P + g] = id;
        in[0] = &seq[P + g], nin[0] = 1;
        if (g + 1 < G)
            REQUIRE(al_infer_forward(m, sc, &kv, in, nin, 1, logits, err, sizeof err) == 0);
    }
    /* the trainer: one packed forward over the whole sequence, logprob of each next token */
    int T = P + G;
    int32_t pos[P + G], cu[2] = {0, P + G}, tgt[P + G];
    for (int t = 0; t < T; t++)
        pos[t] = t, tgt[t] = t + 1 < T ? seq[t + 1] : -1;
    float *all = malloc(sizeof(float) * (size_t)T * V), lp[P + G];
    REQUIRE(al_model_forward(m, seq, pos, cu, 1, T, all) == 0);
    REQUIRE(al_logprob_forward(all, tgt, T, V, 1.0f, lp, NULL, err, sizeof err) == 0);
    double worst = 0, spread = 0;
    for (int g = 0; g < G; g++) {
        worst = fmax(worst, fabs(served[g] - lp[P - 1 + g]));
        spread = fmax(spread, fabs(served[g]));
    }
    printf("  max |served - trainer| logprob over %d tokens: %.2e (largest |logprob| %.2f)\n", G,
           worst, spread);
    CHECKF(worst < 1e-4, "served logprobs differ from the trainer's by %g", worst);
    CHECK(spread > 0.5); /* the check is not vacuous */
    free(all);
    free(logits);
    al_infer_sampler_free(&s);
    al_infer_kv_free(kv);
    al_infer_scratch_free(sc);
    al_model_free(m);
}

TEST(seeded_sampling_is_deterministic)
{
    enum { V = 64 };
    float logits[V];
    for (int j = 0; j < V; j++)
        logits[j] = (float)sin(j * 0.7) * 3;
    al_infer_sampler s;
    REQUIRE(al_infer_sampler_init(&s, V) == 0);
    al_infer_sampling sp = {1.0, 0.9, 0};
    int32_t a[200], b[200], c[200];
    al_infer_rng r1, r2, r3;
    al_infer_rng_seed(&r1, 7, 0);
    al_infer_rng_seed(&r2, 7, 0);
    al_infer_rng_seed(&r3, 7, 1);
    int same_other = 0;
    for (int i = 0; i < 200; i++) {
        a[i] = al_infer_sample(&s, logits, &sp, &r1);
        b[i] = al_infer_sample(&s, logits, &sp, &r2);
        c[i] = al_infer_sample(&s, logits, &sp, &r3);
        same_other += a[i] == c[i];
    }
    CHECK(memcmp(a, b, sizeof a) == 0);
    CHECKF(same_other < 150, "stream 1 of the same seed repeats stream 0 (%d of 200)", same_other);
    al_infer_sampler_free(&s);
}

TEST(greedy_top_k_top_p_keep_what_they_promise)
{
    enum { V = 50 };
    float logits[V];
    for (int j = 0; j < V; j++)
        logits[j] = (float)((j * 37) % V) * 0.1f;
    /* ids by logit: (j*37)%V == 49 at the best */
    int32_t best = -1;
    for (int j = 0; j < V; j++)
        if (best < 0 || logits[j] > logits[best]) best = j;
    al_infer_sampler s;
    REQUIRE(al_infer_sampler_init(&s, V) == 0);
    al_infer_rng r;
    al_infer_rng_seed(&r, 3, 0);
    al_infer_sampling greedy = {0, 1, -1};
    for (int i = 0; i < 20; i++)
        CHECK_EQ_INT(al_infer_sample(&s, logits, &greedy, &r), best);
    /* top_k = 3: only the 3 largest */
    al_infer_sampling tk = {2.0, 1, 3};
    int seen[V] = {0};
    for (int i = 0; i < 3000; i++)
        seen[al_infer_sample(&s, logits, &tk, &r)]++;
    int kinds = 0;
    for (int j = 0; j < V; j++)
        if (seen[j]) {
            kinds++;
            CHECKF(logits[j] >= 4.7f - 1e-6f, "top_k=3 sampled id %d (logit %g)", j, logits[j]);
        }
    CHECK_EQ_INT(kinds, 3);
    /* top_p: logits 0..4.9 step .1 at T=0.1 -> probabilities ~ e^(10*l): the best holds
     * 1-1/e = 63%, the best two 86%; top_p 0.7 keeps exactly the best two */
    al_infer_sampling tp = {0.1, 0.7, -1};
    memset(seen, 0, sizeof seen);
    for (int i = 0; i < 3000; i++)
        seen[al_infer_sample(&s, logits, &tp, &r)]++;
    kinds = 0;
    for (int j = 0; j < V; j++)
        kinds += seen[j] > 0;
    CHECK_EQ_INT(kinds, 2);
    char err[128];
    al_infer_sampling badt = {2.5, 1, -1}, badp = {1, 0, -1}, badk = {1, 1, -5};
    CHECK(al_infer_sampling_check(&badt, err, sizeof err) == -1 && strstr(err, "temperature"));
    CHECK(al_infer_sampling_check(&badp, err, sizeof err) == -1 && strstr(err, "top_p"));
    CHECK(al_infer_sampling_check(&badk, err, sizeof err) == -1 && strstr(err, "top_k"));
    CHECK(al_infer_sampling_check(&tp, err, sizeof err) == 0);
    al_infer_sampler_free(&s);
}

TEST(sampled_frequencies_follow_the_softmax)
{
    enum { V = 6, N = 60000 };
    float logits[V] = {0.0f, 1.0f, -1.0f, 2.0f, 0.5f, -3.0f};
    double T = 0.7;
    al_infer_sampler s;
    REQUIRE(al_infer_sampler_init(&s, V) == 0);
    al_infer_rng r;
    al_infer_rng_seed(&r, 99, 0);
    al_infer_sampling sp = {T, 1, -1};
    int count[V] = {0};
    for (int i = 0; i < N; i++)
        count[al_infer_sample(&s, logits, &sp, &r)]++;
    double z = 0, chi2 = 0;
    for (int j = 0; j < V; j++)
        z += exp(logits[j] / T);
    for (int j = 0; j < V; j++) {
        double e = N * exp(logits[j] / T) / z;
        chi2 += (count[j] - e) * (count[j] - e) / e;
    }
    /* 5 degrees of freedom: P(chi2 > 20.5) = 0.001 */
    CHECKF(chi2 < 20.5, "chi-square %g: the draws do not follow softmax(logits/T)", chi2);
    al_infer_sampler_free(&s);
}

/* Three sequences advanced together: a prompt chunk for one while the others decode, for
 * several steps; each sequence's logits equal the packed forward of that sequence alone. */
static void batched_equals_whole(al_model_arch arch)
{
    al_model *m = tiny_model_arch(arch);
    REQUIRE(m);
    const al_model_config *c = al_model_config_of(m);
    int V = c->vocab_size;
    char err[256];
    enum { NS = 3, MAXT = 60 };
    int32_t seq[NS][MAXT];
    for (int i = 0; i < NS; i++)
        for (int t = 0; t < MAXT; t++)
            seq[i][t] = (int32_t)((t * 13 + i * 29 + t * t) % V);
    /* per step, how many new tokens each sequence takes (0: idle this step) */
    static const int plan[][NS] = {{7, 0, 1}, {1, 12, 1}, {1, 1, 9},
                                   {1, 1, 1}, {5, 1, 1},  {1, 3, 1}};
    int nsteps = (int)(sizeof plan / sizeof plan[0]);
    al_infer_kv *kv[NS];
    for (int i = 0; i < NS; i++)
        REQUIRE((kv[i] = al_infer_kv_new(m, MAXT, err, sizeof err)));
    al_infer_scratch *sc = al_infer_scratch_new();
    float *got = malloc(sizeof(float) * NS * V), *want = malloc(sizeof(float) * MAXT * V);
    int32_t pos[MAXT], cu[2];
    double worst = 0;
    for (int st = 0; st < nsteps; st++) {
        al_infer_kv *k[NS];
        const int32_t *tk[NS];
        int nt[NS], who[NS], n = 0;
        for (int i = 0; i < NS; i++)
            if (plan[st][i]) {
                k[n] = kv[i], tk[n] = seq[i] + kv[i]->len, nt[n] = plan[st][i], who[n] = i;
                n++;
            }
        REQUIRE(al_infer_forward(m, sc, k, tk, nt, n, got, err, sizeof err) == 0);
        for (int b = 0; b < n; b++) {
            int i = who[b], L = kv[i]->len;
            for (int t = 0; t < L; t++)
                pos[t] = t;
            cu[0] = 0, cu[1] = L;
            REQUIRE(al_model_forward(m, seq[i], pos, cu, 1, L, want) == 0);
            const float *w = want + (size_t)(L - 1) * V;
            double e = 0, sc2 = 1e-6;
            for (int j = 0; j < V; j++) {
                e = fmax(e, fabs((double)got[(size_t)b * V + j] - w[j]));
                sc2 = fmax(sc2, fabs(w[j]));
            }
            worst = fmax(worst, e / sc2);
        }
    }
    printf("  %s: max relative logit difference, batched vs whole: %.2e\n",
           arch == AL_MODEL_ARCH_QWEN3 ? "qwen3" : "qwen2", worst);
    CHECKF(worst < 1e-4, "batched forward differs by %g", worst);
    /* a copied prefix continues exactly like the original */
    al_infer_kv *cp = al_infer_kv_new(m, MAXT, err, sizeof err);
    REQUIRE(cp);
    CHECK(al_infer_kv_copy_prefix(cp, kv[1], kv[1]->len + 1) == -1);
    REQUIRE(al_infer_kv_copy_prefix(cp, kv[1], kv[1]->len) == 0);
    {
        al_infer_kv *two[2] = {kv[1], cp};
        const int32_t *tk2[2] = {seq[1] + kv[1]->len, seq[1] + kv[1]->len};
        int one2[2] = {1, 1};
        REQUIRE(al_infer_forward(m, sc, two, tk2, one2, 2, got, err, sizeof err) == 0);
        double d = 0;
        for (int j = 0; j < V; j++)
            d = fmax(d, fabs((double)got[j] - got[V + j]));
        CHECKF(d < 1e-5, "copied cache differs by %g", d);
    }
    al_infer_kv_free(cp);
    /* a step past a cache's end fails and changes nothing */
    const int32_t *tk0[1] = {seq[0]};
    int big[1] = {MAXT};
    al_infer_kv *k0[1] = {kv[0]};
    int before = kv[0]->len;
    CHECK(al_infer_forward(m, sc, k0, tk0, big, 1, got, err, sizeof err) == -1 &&
          strstr(err, "do not fit"));
    CHECK_EQ_INT(kv[0]->len, before);
    for (int i = 0; i < NS; i++)
        al_infer_kv_free(kv[i]);
    al_infer_scratch_free(sc);
    free(got), free(want);
    al_model_free(m);
}

TEST(batched_forward_equals_whole_sequences_qwen2)
{
    batched_equals_whole(AL_MODEL_ARCH_QWEN2);
}

TEST(batched_forward_equals_whole_sequences_qwen3)
{
    batched_equals_whole(AL_MODEL_ARCH_QWEN3);
}

/* top_p alone over a large vocabulary keeps exactly the prefix a full sort keeps, whether
 * that prefix is short (peaked logits) or most of the vocabulary (flat ones). */
static int cmp_desc(const void *a, const void *b, void *l)
{
    const float *lg = l;
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    if (lg[x] != lg[y]) return lg[x] > lg[y] ? -1 : 1;
    return x < y ? -1 : x > y;
}

static void top_p_matches_full_sort(double scale, double top_p, double T, int N)
{
    enum { V = 5000 };
    static float logits[V];
    static int32_t order[V];
    static int seen[V], in_set[V];
    al_infer_rng r;
    al_infer_rng_seed(&r, 77, 0);
    for (int j = 0; j < V; j++)
        logits[j] = (float)(al_infer_rng_uniform(&r) * scale);
    for (int j = 0; j < V; j++)
        order[j] = j, seen[j] = 0, in_set[j] = 0;
    qsort_r(order, V, sizeof(int32_t), cmp_desc, logits);
    double mx = logits[order[0]], total = 0, acc = 0;
    for (int j = 0; j < V; j++)
        total += exp((logits[j] - mx) / T);
    int keep = 0;
    while (keep < V) {
        acc += exp((logits[order[keep]] - mx) / T);
        in_set[order[keep++]] = 1;
        if (acc >= top_p * total) break;
    }
    al_infer_sampler s;
    REQUIRE(al_infer_sampler_init(&s, V) == 0);
    al_infer_sampling sp = {T, top_p, -1};
    int outside = 0, distinct = 0;
    for (int i = 0; i < N; i++) {
        int32_t id = al_infer_sample(&s, logits, &sp, &r);
        outside += !in_set[id];
        distinct += !seen[id]++;
    }
    printf("  top_p %.2f, scale %g: the full sort keeps %d ids; %d distinct drawn, %d outside\n",
           top_p, scale, keep, distinct, outside);
    CHECK_EQ_INT(outside, 0);
    CHECK(distinct >= (keep < 20 ? keep : 20));
    al_infer_sampler_free(&s);
}

TEST(top_p_over_a_large_vocabulary_keeps_the_sorted_prefix)
{
    top_p_matches_full_sort(30.0, 0.6, 0.8, 1500); /* peaked: a short prefix */
    top_p_matches_full_sort(0.5, 0.9, 1.0, 300);   /* flat: most of the vocabulary */
}
