/* t0808: --credit step on recorded spans, against an independent reference.
 *
 * tests/credit/letters-final-spans.avro is `arclight record arclight.spans` of the first two
 * minutes of a letters run (`arclight up --credit-args '--credit step'`) whose agent posts
 * one final reward (examples/letters/agent.js --final-reward): 864 spans of real rollouts,
 * two calls each, with the tiny model's token ids; 384 transitions. By observed states 76
 * step groups, 59 with twins, 34 of them with a spread (10 at call 1); by prompts 177, 54,
 * 26 (2 at call 1). The reference prints these counts. Each partition's spans go to a part of their own (as `arclight credit` does), twice
 * over: the two passes must give the same transitions byte for byte. Then
 * t0808_credit_step_reference.py, which shares no code with credit.c, computes every
 * transition's advantage and return from the same spans (written out as JSON lines) by the
 * documented definition, and each must agree with credit's to 1e-12 (the reference sums
 * the population variance the plain way; credit scales it first, see al_credit_moments_of).
 */
#include "testlib.h"
#include "support.h"

#include "core/vec.h"
#include "credit.h"
#include "recording_reader.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#define PARTS 64

typedef AL_VEC(al_buf) bufs;

static int keep(void *ud, const al_transition *t, int64_t anchor)
{
    (void)anchor;
    bufs *b = ud;
    char err[256];
    if (al_vec_reserve(b, 1)) return -1;
    al_buf_init(&b->v[b->n]);
    if (al_transition_encode(t, &b->v[b->n], err, sizeof err) != 0) return -1;
    b->n++;
    return 0;
}

static void bufs_free(bufs *b)
{
    for (size_t i = 0; i < b->n; i++)
        al_buf_free(&b->v[i]);
    al_vec_free(b);
}

/* One decoded span as a JSON line of what the reference reads. */
static void span_json(FILE *f, int32_t partition, int64_t offset, const al_span *s)
{
    json_t *o = json_pack("{s:i, s:I, s:s, s:s, s:i, s:I, s:b}", "partition", (int)partition,
                          "offset", (json_int_t)offset, "task", s->task_id, "rollout",
                          s->rollout_id, "attempt", (int)s->attempt, "seq",
                          (json_int_t)s->sequence, "eval", s->eval);
    if (s->kind == AL_SPAN_KIND_LLM_CALL) {
        json_t *p = json_array();
        for (size_t i = 0; i < s->llm_call.n_prompt_tokens; i++)
            json_array_append_new(p, json_integer(s->llm_call.prompt_token_ids[i]));
        json_t *q = json_array();
        for (size_t i = 0; i < s->llm_call.n_response_tokens; i++)
            json_array_append_new(q, json_integer(s->llm_call.response_token_ids[i]));
        json_object_set_new(o, "kind", json_string("call"));
        json_object_set_new(o, "prompt", p);
        json_object_set_new(o, "response", q);
    } else if (s->kind == AL_SPAN_KIND_REWARD) {
        json_object_set_new(o, "kind", json_string("reward"));
        json_object_set_new(o, "value", json_real(s->reward.value));
        json_object_set_new(o, "after", json_integer(s->reward.after_sequence));
    } else {
        json_object_set_new(o, "kind", json_string("end"));
        json_object_set_new(o, "status",
                            json_string(al_rollout_status_name(s->rollout_end.status)));
        json_object_set_new(o, "group_size", json_integer(s->rollout_end.group_size));
    }
    char *line = json_dumps(o, JSON_COMPACT | JSON_REAL_PRECISION(17));
    fprintf(f, "%s\n", line);
    free(line);
    json_decref(o);
}

/* Feeds the recording to one part per partition; the transitions' bytes go to *out, and
 * (when jsonl is not NULL) every span to that file. 0, or -1 after a failed CHECK. */
static int replay(const al_credit_config *cfg, bufs *out, FILE *jsonl)
{
    char path[1024], err[512], reason[512];
    snprintf(path, sizeof path, "%s/tests/credit/letters-final-spans.avro",
             getenv("ARCLIGHT_SOURCE_DIR") ? getenv("ARCLIGHT_SOURCE_DIR") : ".");
    al_recording_reader *rd = al_recording_open(path, err, sizeof err);
    CHECKF(rd != NULL, "%s", err);
    if (!rd) return -1;
    al_credit_part *parts[PARTS] = {0};
    al_credit_sink sink = {.transition = keep, .ud = out};
    al_recorded m;
    al_span s = {0};
    int rc = 0, got;
    while (!rc && (got = al_recording_next(rd, &m, err, sizeof err)) == 1) {
        if (m.partition < 0 || m.partition >= PARTS || !m.value) {
            rc = -1;
            break;
        }
        if (al_span_decode(m.value, m.value_len, &s, err, sizeof err) != 0) {
            CHECKF(0, "offset %lld: %s", (long long)m.offset, err);
            rc = -1;
            break;
        }
        if (jsonl) span_json(jsonl, m.partition, m.offset, &s);
        al_credit_part **p = &parts[m.partition];
        if (!*p && !(*p = al_credit_part_new(cfg, &sink, err, sizeof err))) {
            CHECKF(0, "%s", err);
            rc = -1;
            break;
        }
        const char *code;
        int a = al_credit_part_add(*p, m.offset, &s, &code, reason, sizeof reason, err, sizeof err);
        CHECKF(a == 0, "offset %lld: %s", (long long)m.offset, a > 0 ? reason : err);
        if (a) rc = -1;
    }
    CHECKF(rc || got == 0, "%s", err);
    al_span_clear(&s);
    for (int i = 0; i < PARTS; i++)
        al_credit_part_free(parts[i]);
    al_recording_close(rd);
    return rc;
}

/* Runs the reference on jsonl_path and checks every transition of got against it. */
static void check_reference(const al_credit_config *cfg, const char *jsonl_path, bufs *got)
{
    char cmd[2048], out[1100];
    snprintf(out, sizeof out, "%s.ref", jsonl_path);
    snprintf(cmd, sizeof cmd,
             "/usr/bin/python3 '%s/tests/t0808_credit_step_reference.py' '%s' %s %.17g %.17g "
             "%.17g %d %s > '%s'",
             getenv("ARCLIGHT_SOURCE_DIR") ? getenv("ARCLIGHT_SOURCE_DIR") : ".", jsonl_path,
             al_credit_estimator_name(cfg->estimator), cfg->gamma, cfg->step_weight, cfg->eps,
             (int)cfg->group_size,
             cfg->step_state == AL_CREDIT_STATE_PROMPT ? "prompt" : "observed", out);
    REQUIRE(system(cmd) == 0);
    FILE *f = fopen(out, "r");
    REQUIRE(f != NULL);
    char id[512];
    double adv, ret, worst = 0;
    size_t n = 0, nonzero = 0;
    al_transition t = {0};
    char err[256];
    while (fscanf(f, "%511s %lf %lf", id, &adv, &ret) == 3) {
        int found = 0;
        for (size_t i = 0; i < got->n && !found; i++) {
            REQUIRE(al_transition_decode(got->v[i].data, got->v[i].len, &t, err, sizeof err) == 0);
            if (strcmp(t.id, id)) continue;
            found = 1;
            double d = fabs(t.advantage - adv);
            if (d > worst) worst = d;
            CHECKF(d <= 1e-12 * fmax(1, fabs(adv)), "%s: advantage %.17g, the reference %.17g",
                   id, t.advantage, adv);
            CHECKF(t.return_value == ret, "%s: return %.17g, the reference %.17g", id,
                   t.return_value, ret);
        }
        CHECKF(found, "the reference has %s, credit emitted no such transition", id);
        if (fabs(adv) > 0) nonzero++;
        n++;
    }
    fclose(f);
    al_transition_clear(&t);
    CHECKF(n == got->n, "the reference has %zu transitions, credit %zu", n, got->n);
    CHECK(n >= 300 && nonzero > 0); /* the recording has this much to compare */
    printf("  %s gamma %g w %g %s: %zu transitions agree (largest difference %.3g)\n",
           al_credit_estimator_name(cfg->estimator), cfg->gamma, cfg->step_weight,
           cfg->step_state == AL_CREDIT_STATE_PROMPT ? "prompt" : "observed", n, worst);
}

static void run_config(al_credit_estimator e, double gamma, double w, al_credit_step_state state)
{
    char dir[256], jsonl[512];
    REQUIRE(al_test_tmpdir(dir, sizeof dir, "t0808") != NULL);
    snprintf(jsonl, sizeof jsonl, "%s/spans.jsonl", dir);
    al_credit_config cfg;
    al_credit_config_init(&cfg);
    cfg.assign = AL_CREDIT_ASSIGN_STEP;
    cfg.estimator = e;
    cfg.gamma = gamma;
    cfg.step_weight = w;
    cfg.step_state = state;
    bufs a = {0}, b = {0};
    FILE *f = fopen(jsonl, "w");
    REQUIRE(f != NULL);
    int ra = replay(&cfg, &a, f);
    fclose(f);
    int rb = replay(&cfg, &b, NULL);
    REQUIRE(ra == 0 && rb == 0);
    /* the same spans give the same transitions, byte for byte */
    CHECKF(a.n == b.n, "%zu transitions, then %zu", a.n, b.n);
    for (size_t i = 0; i < a.n && i < b.n; i++)
        CHECKF(a.v[i].len == b.v[i].len && !memcmp(a.v[i].data, b.v[i].data, a.v[i].len),
               "transition %zu differs between the two replays", i);
    check_reference(&cfg, jsonl, &a);
    bufs_free(&a);
    bufs_free(&b);
    al_test_rmtree(dir);
}

TEST(grpo_default_against_reference)
{
    run_config(AL_CREDIT_ESTIMATOR_GRPO, 1, 1, AL_CREDIT_STATE_OBSERVED);
}

TEST(rloo_discounted_weighted_against_reference)
{
    run_config(AL_CREDIT_ESTIMATOR_RLOO, 0.9, 0.5, AL_CREDIT_STATE_OBSERVED);
}

TEST(dr_grpo_prompt_states_heavy_step_weight_against_reference)
{
    run_config(AL_CREDIT_ESTIMATOR_DR_GRPO, 0.5, 3, AL_CREDIT_STATE_PROMPT);
}
