/*
 * 1703: serving on the CUDA backend against the CPU backend: the batched forward over paged
 * KV caches that `arclight serve` runs (al_infer_forward: chunked prefill of prompts of
 * different lengths, then decode steps of every sequence together, a cache copied for n > 1)
 * gives the CPU's greedy tokens and logprobs. Both backends are fed the CPU's greedy tokens;
 * the device's argmax must equal the CPU's wherever the CPU's best logit leads the second by
 * more than 0.05 (closer calls may flip in bf16), and the chosen token's raw logprob must be
 * within 3e-2. Then the device decodes on its own and must follow the CPU's tokens up to the
 * first such close call. Skipped without a CUDA device.
 */
#include "t1799_gpu_util.h"

#include "model/infer.h"
#include "model/model.h"

enum { NS = 3, STEPS = 40, MAXT = 400 };

static al_model *model(char *err, size_t errlen)
{
    al_model_config c = {0};
    al_model_config_set_arch(&c, AL_MODEL_ARCH_QWEN3);
    c.vocab_size = 500, c.hidden_size = 128, c.intermediate_size = 256, c.num_layers = 3;
    c.num_heads = 4, c.num_kv_heads = 2, c.head_dim = 64;
    c.rms_norm_eps = 1e-6, c.rope_theta = 1e6, c.tie_word_embeddings = 0;
    c.max_position_embeddings = 1024, c.bos_token_id = c.eos_token_id = -1;
    al_model *m = al_model_new(&c, err, errlen);
    if (!m) return NULL;
    al_model_init_random(m, 9);
    float *p = al_model_params(m);
    for (size_t i = 0; i < al_model_num_tensors(m); i++) {
        const al_model_tensor *t = &al_model_tensors(m)[i];
        if (strstr(t->name, "norm")) continue;
        for (size_t j = 0; j < t->numel; j++)
            p[t->offset + j] = bf16_round(p[t->offset + j] * 3.0f);
    }
    return m;
}

static int argmax2(const float *l, int V, float *margin)
{
    int b = 0, s = -1;
    for (int j = 1; j < V; j++)
        if (l[j] > l[b]) s = b, b = j;
        else if (s < 0 || l[j] > l[s]) s = j;
    *margin = l[b] - l[s];
    return b;
}

TEST(greedy_tokens_and_logprobs_match_cpu)
{
    char err[512];
    al_model *mc = model(err, sizeof err), *mg = model(err, sizeof err);
    REQUIREF(mc && mg, "%s", err);
    REQUIREF(al_model_set_backend(mg, gpu_be, err, sizeof err) == 0, "%s", err);
    int V = al_model_config_of(mc)->vocab_size;
    static const int plen[NS] = {300, 7, 45}; /* 300: two prefill chunks of the engine's size */
    int32_t prompt[NS][300];
    for (int i = 0; i < NS; i++)
        for (int t = 0; t < plen[i]; t++)
            prompt[i][t] = (int32_t)((t * 37 + i * 101 + t * t) % V);
    al_infer_kv *kc[NS], *kg[NS];
    for (int i = 0; i < NS; i++) {
        REQUIREF((kc[i] = al_infer_kv_new(mc, MAXT, err, sizeof err)), "%s", err);
        REQUIREF((kg[i] = al_infer_kv_new(mg, MAXT, err, sizeof err)), "%s", err);
    }
    al_infer_scratch *sc = al_infer_scratch_new(), *sg = al_infer_scratch_new();
    float *lc = malloc(sizeof(float) * NS * V), *lg = malloc(sizeof(float) * NS * V);
    int32_t cpu_tok[NS][STEPS], gpu_tok[NS][STEPS];
    float cpu_margin[NS][STEPS];
    /* prefill in chunks of 256, every sequence in the same forward */
    const int32_t *in[NS];
    int nin[NS], done[NS] = {0};
    for (;;) {
        int any = 0;
        for (int i = 0; i < NS; i++) {
            int left = plen[i] - done[i];
            nin[i] = left > 256 ? 256 : (left > 0 ? left : 0);
            any |= nin[i] > 0;
        }
        if (!any) break;
        /* sequences already prefilled wait (the engine would decode them meanwhile) */
        al_infer_kv *bc[NS], *bg[NS];
        int n = 0, idx[NS], cnt[NS];
        for (int i = 0; i < NS; i++)
            if (nin[i] > 0) bc[n] = kc[i], bg[n] = kg[i], in[n] = prompt[i] + done[i], cnt[n] = nin[i], idx[n++] = i;
        REQUIREF(al_infer_forward(mc, sc, bc, in, cnt, n, lc, err, sizeof err) == 0, "%s", err);
        REQUIREF(al_infer_forward(mg, sg, bg, in, cnt, n, lg, err, sizeof err) == 0, "%s", err);
        for (int b = 0; b < n; b++)
            done[idx[b]] += cnt[b];
    }
    /* teacher-forced decode: both get the CPU's greedy token */
    int flips = 0, checked = 0;
    double worst_lp = 0;
    int32_t next[NS];
    const int32_t *tin[NS];
    int one[NS];
    for (int step = 0; step < STEPS; step++) {
        for (int i = 0; i < NS; i++) {
            float mg_;
            int c = argmax2(lc + (size_t)i * V, V, &cpu_margin[i][step]);
            int g = argmax2(lg + (size_t)i * V, V, &mg_);
            cpu_tok[i][step] = c;
            if (cpu_margin[i][step] > 0.05f) {
                checked++;
                if (g != c) flips++;
            }
            double lpc = al_infer_logprob(lc + (size_t)i * V, al_infer_logsumexp(lc + (size_t)i * V, V), c);
            double lpg = al_infer_logprob(lg + (size_t)i * V, al_infer_logsumexp(lg + (size_t)i * V, V), c);
            worst_lp = fmax(worst_lp, fabs(lpc - lpg));
            next[i] = c, tin[i] = &next[i], one[i] = 1;
        }
        if (step + 1 == STEPS) break;
        REQUIREF(al_infer_forward(mc, sc, kc, tin, one, NS, lc, err, sizeof err) == 0, "%s", err);
        REQUIREF(al_infer_forward(mg, sg, kg, tin, one, NS, lg, err, sizeof err) == 0, "%s", err);
    }
    printf("    teacher-forced: %d clear argmaxes, %d differ; worst logprob difference %.3g\n",
           checked, flips, worst_lp);
    CHECKF(flips == 0, "%d of %d clear greedy choices differ from the CPU's", flips, checked);
    CHECKF(worst_lp <= 3e-2, "chosen-token logprobs differ by up to %.3g", worst_lp);

    /* free-running on the device from a copy of sequence 2's prompt cache (n > 1 samples) */
    al_infer_kv *cp = al_infer_kv_new(mg, MAXT, err, sizeof err);
    REQUIREF(cp, "%s", err);
    int32_t tok = prompt[2][plen[2] - 1];
    /* rebuild: the prompt minus its last token into a fresh cache, copy, then decode */
    al_infer_kv *base = al_infer_kv_new(mg, MAXT, err, sizeof err);
    REQUIREF(base, "%s", err);
    const int32_t *pin = prompt[2];
    int pn = plen[2] - 1;
    REQUIREF(al_infer_forward(mg, sg, &base, &pin, &pn, 1, lg, err, sizeof err) == 0, "%s", err);
    REQUIRE(al_infer_kv_copy_prefix(cp, base, pn) == 0);
    int agree = 0, limit = STEPS;
    for (int step = 0; step < STEPS; step++) {
        const int32_t *ti = &tok;
        int o = 1;
        REQUIREF(al_infer_forward(mg, sg, &cp, &ti, &o, 1, lg, err, sizeof err) == 0, "%s", err);
        float mgn;
        gpu_tok[2][step] = argmax2(lg, V, &mgn);
        if (cpu_margin[2][step] <= 0.05f) {
            limit = step;
            break;
        }
        if (gpu_tok[2][step] != cpu_tok[2][step]) break;
        agree++;
        tok = gpu_tok[2][step];
    }
    printf("    free-running on the device: %d of %d tokens equal the CPU's before the first close call\n",
           agree, limit);
    CHECKF(agree == limit, "the device's greedy decode left the CPU's at token %d", agree);
    al_infer_kv_free(cp), al_infer_kv_free(base);
    for (int i = 0; i < NS; i++)
        al_infer_kv_free(kc[i]), al_infer_kv_free(kg[i]);
    al_infer_scratch_free(sc), al_infer_scratch_free(sg);
    free(lc), free(lg);
    al_model_free(mc), al_model_free(mg);
}

int main(int argc, char **argv)
{
    return gpu_test_main(argc, argv);
}
