/*
 * t1420_letters_helpers.h: what the tests of the letters demo's example agents (1402-1419)
 * share. An agent of examples/letters runs unchanged, once per rollout, under `arclight
 * rollouts`, through `arclight proxy` (--upstream-kind vllm) to `arclight serve` (the tiny
 * model, warm-started or not) on the embedded broker; then the spans are read back from
 * arclight.spans and grouped by rollout. Header-only (static); include after testlib.h,
 * broker_fixture.h, t1099_proxy_helpers.h and t1199_serve_helpers.h.
 */
#ifndef ARCLIGHT_T1420_LETTERS_HELPERS_H
#define ARCLIGHT_T1420_LETTERS_HELPERS_H

#include <limits.h>

#include "core/sha256.h"
#include "core/util.h"
#include "support.h"

/* A tool agent's warm start as `arclight up --warm-start FILE` runs it (two passes over the
 * file in steps of 16, 160 to 500, at 1e-2, cosine) on the tiny model of seed 1. It takes
 * minutes, so the tests serve a fixture made by it, tests/serve/letters-AGENT/ (config.json,
 * model.safetensors and made-from.json, which names the data and its sha256); when the data
 * changed since, the test runs the warm start itself, says the fixture is stale, and
 * ARCLIGHT_REGEN_FIXTURES=1 writes the result back. */

/* model sft's flags for the file at path, as up picks them; 0, or -1 if it cannot be read */
static int lt_sft_args(const char *path, char *out, size_t outlen)
{
    long n = al_file_count_lines(path);
    if (n < 0) return -1;
    long steps = (2 * n + 15) / 16;
    steps = steps > 500 ? 500 : steps < 160 ? 160 : steps;
    snprintf(out, outlen, "--steps %ld --lr 1e-2 --batch 16", steps);
    return 0;
}

typedef struct lt_run {
    char dir[PATH_MAX];
    char model[PATH_MAX + 32];
    al_test_broker b;
    sv_server serve;
    px_child px;
    int started_broker, started_serve, started_proxy;
    char *rollouts_log; /* the controller's stderr */
    double rollouts_s;
    al_span *s; /* every decodable span on arclight.spans */
    size_t n;
} lt_run;

/* A tiny random model (seed 1) in DIR/tiny; with sft_path, the warm start on that file
 * (lt_sft_args) in DIR/sft, from the fixture when it was made from the same data, which
 * becomes the model served. 0, or -1 with the reason on stderr. */
static int lt_model(lt_run *r, const char *sft_path, const char *fixture)
{
    if (sv_make_model(r->dir, "tiny", 1)) return -1;
    snprintf(r->model, sizeof r->model, "%s/tiny", r->dir);
    if (!sft_path) return 0;
    char hex[65], err[512], path[PATH_MAX + 64];
    if (al_sha256_file(sft_path, hex, err, sizeof err)) {
        fprintf(stderr, "%s\n", err);
        return -1;
    }
    snprintf(path, sizeof path, "%s/made-from.json", fixture);
    json_t *made = json_load_file(path, 0, NULL);
    const char *had = json_string_value(json_object_get(made, "data_sha256"));
    int fresh = had && !strcmp(had, hex);
    json_decref(made);
    int rc;
    char sft_args[96], made_by[256];
    if (lt_sft_args(sft_path, sft_args, sizeof sft_args)) return -1;
    if (fresh) {
        rc = sv_sh("mkdir -p %s/sft && cp %s/config.json %s/model.safetensors %s/sft/", r->dir,
                   fixture, fixture, r->dir);
    } else {
        double t0 = testlib_now();
        fprintf(stderr, "the fixture %s was not made from %s as it is now (sha256 %s): warming "
                        "up here (slow); ARCLIGHT_REGEN_FIXTURES=1 rewrites it\n",
                fixture, sft_path, hex);
        rc = sv_sh("%s model sft --model %s/tiny --tokenizer tests/tokenizer/tiny --data %s %s "
                   "--out %s/sft > %s/sft.log 2>&1",
                   sv_bin(), r->dir, sft_path, sft_args, r->dir, r->dir);
        snprintf(path, sizeof path, "%s/sft.log", r->dir);
        char *log = al_test_slurp_text(path);
        fprintf(stderr, "warm start (%.0f s): %s", testlib_now() - t0, log);
        free(log);
        if (!rc && getenv("ARCLIGHT_REGEN_FIXTURES")) {
            rc = sv_sh("mkdir -p %s && cp %s/sft/config.json %s/sft/model.safetensors %s/", fixture,
                       r->dir, r->dir, fixture);
            snprintf(made_by, sizeof made_by,
                     "arclight model init --config tests/model/tiny-qwen2.json --seed 1; arclight "
                     "model sft --tokenizer tests/tokenizer/tiny --data DATA %s",
                     sft_args);
            json_t *j = json_pack("{s:s, s:s, s:s}", "data", sft_path, "data_sha256", hex,
                                  "made_by", made_by);
            snprintf(path, sizeof path, "%s/made-from.json", fixture);
            if (!rc && json_dump_file(j, path, JSON_INDENT(2) | JSON_PRESERVE_ORDER)) rc = -1;
            json_decref(j);
            fprintf(stderr, "wrote %s\n", fixture);
        }
    }
    if (rc) return -1;
    snprintf(r->model, sizeof r->model, "%s/sft", r->dir);
    return sv_sh("cp tests/tokenizer/tiny/tokenizer.json tests/tokenizer/tiny/tokenizer_config.json "
                 "%s/sft/",
                 r->dir);
}

/* A fresh directory, the broker, serve (model from lt_model) and the proxy. 0 or -1. */
static int lt_start(lt_run *r, const char *tag, const char *sft_path, const char *fixture)
{
    memset(r, 0, sizeof *r);
    al_test_tmpdir(r->dir, sizeof r->dir, "proxy"); /* arclight-proxy-XXXXXX under $TMPDIR */
    if (!r->dir[0]) return -1;
    fprintf(stderr, "%s: in %s\n", tag, r->dir);
    if (al_test_broker_start(&r->b, NULL)) return -1;
    r->started_broker = 1;
    if (lt_model(r, sft_path, fixture)) return -1;
    const char *sargs[] = {"--model", r->model, "--served-model-name", "tiny", NULL};
    if (sv_start(&r->serve, sargs)) return -1;
    r->started_serve = 1;
    char spool[900], log[900];
    snprintf(spool, sizeof spool, "%.800s/spool", r->dir);
    snprintf(log, sizeof log, "%.800s/proxy.log", r->dir);
    const char *pargs[] = {"--listen",    "127.0.0.1:0", "--upstream", r->serve.url,
                           "--upstream-kind", "vllm",    "--spool-dir", spool,
                           "--bootstrap", r->b.bootstrap, NULL};
    if (px_start(&r->px, log, pargs, NULL)) return -1;
    r->started_proxy = 1;
    return 0;
}

/* Runs the agent command (its file under the source tree's examples/letters/ named by
 * %s/examples/letters/ in it) under `arclight rollouts` over the first ntrain train
 * and nval val tasks of examples/letters/tasks.jsonl, group_size rollouts per train task,
 * one evaluation of each val task, no trainer (every group starts at version 0), with
 * ARCLIGHT_MAX_TOKENS=12 as `arclight up` sets it. Returns the controller's wait status;
 * its stderr is in r->rollouts_log. */
static int lt_rollouts_cmd(lt_run *r, const char *program, const char *agent, int ntrain,
                           int nval, int group_size)
{
    char tasks[PATH_MAX + 32], work[PATH_MAX + 32], log[PATH_MAX + 32], cmd[6 * PATH_MAX];
    snprintf(tasks, sizeof tasks, "%s/tasks.jsonl", r->dir);
    snprintf(work, sizeof work, "%s/work", r->dir);
    snprintf(log, sizeof log, "%s/rollouts.log", r->dir);
    FILE *in = fopen("examples/letters/tasks.jsonl", "r"), *out = fopen(tasks, "w");
    if (!in || !out) {
        if (in) fclose(in);
        if (out) fclose(out);
        return -1;
    }
    char line[1024];
    int nt = 0, nv = 0;
    while (fgets(line, sizeof line, in)) {
        int val = strstr(line, "\"split\":\"val\"") != NULL;
        if (val ? nv++ < nval : nt++ < ntrain) fputs(line, out);
    }
    fclose(in);
    fclose(out);
    const char *src = getenv("ARCLIGHT_SOURCE_DIR");
    char abs_src[PATH_MAX];
    if (!src || !realpath(src, abs_src)) snprintf(abs_src, sizeof abs_src, ".");
    snprintf(cmd, sizeof cmd,
             "ARCLIGHT_MAX_TOKENS=12 '%s' rollouts --tasks '%s' --agent '%s %s/examples/letters/%s' "
             "--proxy '%s' --bootstrap '%s' --model tiny --group-size %d --step-groups 1 "
             "--max-staleness 1000 --rollout-timeout 120 --max-attempts 1 --epochs 1 --eval-every 0 "
             "--workdir '%s' 2> '%s'",
             al_test_bin(), tasks, program, abs_src, agent, r->px.base, r->b.bootstrap, group_size,
             work, log);
    double t0 = testlib_now();
    int st = system(cmd);
    r->rollouts_s = testlib_now() - t0;
    r->rollouts_log = al_test_slurp_text(log);
    return st;
}

/* lt_rollouts_cmd for `node examples/letters/AGENT`. */
static __attribute__((unused)) int lt_rollouts(lt_run *r, const char *agent, int ntrain, int nval,
                                               int group_size)
{
    return lt_rollouts_cmd(r, "node", agent, ntrain, nval, group_size);
}

/* Reads arclight.spans until want_ends rollout ends have arrived (or a minute passed) and
 * decodes every span into r->s. Returns the number of ends. */
static size_t lt_read_spans(lt_run *r, size_t want_ends)
{
    return px_read_spans(r->b.bootstrap, want_ends, 40, &r->s, &r->n);
}

/* What one rollout's spans say, in sequence order. */
typedef struct lt_rollout {
    const char *task, *rollout;
    int eval;
    const al_span *calls[8];
    int ncalls;
    const al_span *rewards[8];
    int nrewards;
    const al_span *end;
} lt_rollout;

/* Groups r's spans by rollout into out (at most max). Returns how many rollouts. */
static size_t lt_rollouts_of(const lt_run *r, lt_rollout *out, size_t max)
{
    size_t n = 0;
    for (size_t i = 0; i < r->n; i++) {
        const al_span *s = &r->s[i];
        size_t k = 0;
        while (k < n && strcmp(out[k].rollout, s->rollout_id))
            k++;
        if (k == n) {
            if (n == max) continue;
            memset(&out[n], 0, sizeof out[n]);
            out[n].task = s->task_id, out[n].rollout = s->rollout_id;
            n++;
        }
        lt_rollout *o = &out[k];
        o->eval |= s->eval;
        if (s->kind == AL_SPAN_KIND_LLM_CALL && o->ncalls < 8) o->calls[o->ncalls++] = s;
        if (s->kind == AL_SPAN_KIND_REWARD && o->nrewards < 8) o->rewards[o->nrewards++] = s;
        if (s->kind == AL_SPAN_KIND_ROLLOUT_END) o->end = s;
    }
    for (size_t k = 0; k < n; k++) /* sequence order */
        for (int a = 1; a < out[k].ncalls; a++)
            for (int b = a; b > 0 && out[k].calls[b - 1]->sequence > out[k].calls[b]->sequence; b--) {
                const al_span *t = out[k].calls[b];
                out[k].calls[b] = out[k].calls[b - 1];
                out[k].calls[b - 1] = t;
            }
    return n;
}

/* The next code point of a UTF-8 string (malformed bytes count as one each). */
static unsigned lt_next_cp(const unsigned char **p)
{
    const unsigned char *s = *p;
    unsigned c = *s++;
    int extra = c >= 0xf0 ? 3 : c >= 0xe0 ? 2 : c >= 0xc0 ? 1 : 0;
    for (int i = 0; i < extra && (*s & 0xc0) == 0x80; i++)
        c = c << 6 | (*s++ & 0x3f);
    if (extra == 1) c &= 0x7ff;
    if (extra == 2) c &= 0xffff;
    if (extra == 3) c &= 0x1fffff;
    *p = s;
    return c;
}

/* JavaScript's /\s/ */
static int lt_js_space(unsigned c)
{
    return (c >= 9 && c <= 13) || c == ' ' || c == 0xa0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f ||
           c == 0x205f || c == 0x3000 || c == 0xfeff;
}

/* How many code points of text are the letter l (lower case, or upper: toLowerCase(), the
 * Kelvin sign included for k), and how many are visible (not /\s/): task.js's counts. */
static void lt_count_n(const char *text, size_t len, char l, int *hits, int *visible)
{
    *hits = *visible = 0;
    const unsigned char *p = (const unsigned char *)(text ? text : ""), *end = p + len;
    while (p < end) {
        if (!*p) { /* a NUL token (\u0000): a visible character to task.js and letters.py */
            p++, (*visible)++;
            continue;
        }
        unsigned c = lt_next_cp(&p);
        if (lt_js_space(c)) continue;
        (*visible)++;
        if (c == (unsigned char)l || c == (unsigned char)(l - 32) || (l == 'k' && c == 0x212a))
            (*hits)++;
    }
}

static void lt_count(const char *text, char l, int *hits, int *visible)
{
    lt_count_n(text, text ? strlen(text) : 0, l, hits, visible);
}

/* task.js's share(): the share of the visible characters of text that are the letter l. */
static double lt_share(const char *text, char l)
{
    int hits, visible;
    lt_count(text, l, &hits, &visible);
    return visible ? (double)hits / visible : 0;
}

/* The same of a JSON string, whole (a NUL inside it included). */
static double lt_share_json(const json_t *text, char l)
{
    int hits, visible;
    lt_count_n(json_string_value(text), json_string_length(text), l, &hits, &visible);
    return visible ? (double)hits / visible : 0;
}

/* task.js's doorAnswer() to an attempt, into buf. */
static void lt_door_answer(char room, const char *attempt, char *buf, size_t n)
{
    int hits = 0;
    for (const unsigned char *p = (const unsigned char *)(attempt ? attempt : ""); *p;) {
        unsigned c = lt_next_cp(&p);
        hits += c == 'k' || c == 'K' || c == 0x212a;
    }
    if (hits > 4) hits = 4;
    if (!hits) {
        snprintf(buf, n, "The door stays shut. Write the room.");
        return;
    }
    int w = snprintf(buf, n, "The door opens. Room:");
    for (int i = 0; i < hits && w > 0 && (size_t)w < n; i++)
        w += snprintf(buf + w, n - (size_t)w, " %c", room);
    if (w > 0 && (size_t)w < n) snprintf(buf + w, n - (size_t)w, ". Write the room.");
}

/* The "room" letter of a task id of examples/letters/tasks.jsonl ("jade-j": 'j'). */
static char lt_room_of(const char *task)
{
    const char *d = strrchr(task, '-');
    return d && d[1] && !d[2] ? d[1] : 0;
}

/* The reward span named `name` of a rollout, or NULL. */
static const al_span *lt_reward(const lt_rollout *o, const char *name)
{
    for (int i = 0; i < o->nrewards; i++)
        if (o->rewards[i]->reward.name && !strcmp(o->rewards[i]->reward.name, name))
            return o->rewards[i];
    return NULL;
}

/* A member of the first choice's message of a captured response (a new reference), or NULL. */
static json_t *lt_message(const al_span *call, const char *member)
{
    json_t *j = json_loads(call->llm_call.response_json ? call->llm_call.response_json : "", JSON_ALLOW_NUL, NULL);
    json_t *v = json_object_get(
        json_object_get(json_array_get(json_object_get(j, "choices"), 0), "message"), member);
    json_incref(v);
    json_decref(j);
    return v;
}

/* What every agent's rollouts must show: want rollouts (nval of them evaluation rollouts,
 * every span marked eval), each ended succeeded with 1 to max_calls calls, each call a span
 * with the served prompt and response token ids (and a logprob per response token), and a
 * reward in [0, 1] in all. Returns the number of calls. */
static int lt_check_rollouts(const lt_rollout *o, size_t n, size_t want, int nval, int max_calls)
{
    CHECKF(n == want, "%zu rollouts, expected %zu", n, want);
    int calls = 0, evals = 0;
    for (size_t k = 0; k < n; k++) {
        CHECKF(o[k].end && o[k].end->rollout_end.status == AL_ROLLOUT_STATUS_SUCCEEDED,
               "rollout %s of %s: %s (%s)", o[k].rollout, o[k].task,
               o[k].end ? al_rollout_status_name(o[k].end->rollout_end.status) : "no end",
               o[k].end && o[k].end->rollout_end.reason ? o[k].end->rollout_end.reason : "");
        CHECKF(o[k].ncalls >= 1 && o[k].ncalls <= max_calls, "rollout %s: %d calls", o[k].rollout,
               o[k].ncalls);
        evals += o[k].eval;
        double total = 0;
        for (int i = 0; i < o[k].nrewards; i++)
            total += o[k].rewards[i]->reward.value;
        CHECKF(o[k].nrewards >= 1 && total >= 0 && total <= 1, "rollout %s: %d rewards, sum %g",
               o[k].rollout, o[k].nrewards, total);
        for (int i = 0; i < o[k].ncalls; i++) {
            const al_llm_call *c = &o[k].calls[i]->llm_call;
            calls++;
            CHECKF(c->http_status == 200 && c->n_prompt_tokens > 0 && c->n_response_tokens > 0 &&
                       c->n_response_logprobs == c->n_response_tokens && c->policy_version == 0,
                   "rollout %s call %d: HTTP %d, %zu prompt and %zu response tokens, %zu "
                   "logprobs, version %lld",
                   o[k].rollout, i, (int)c->http_status, c->n_prompt_tokens, c->n_response_tokens,
                   c->n_response_logprobs, (long long)c->policy_version);
            CHECKF(o[k].calls[i]->eval == o[k].eval, "rollout %s: eval on some spans only",
                   o[k].rollout);
        }
    }
    CHECKF(evals == nval, "%d evaluation rollouts, expected %d", evals, nval);
    return calls;
}

/* The "tools" of the first line of a warm-start file (a new reference), or NULL. */
static json_t *lt_sft_tools(const char *path)
{
    FILE *f = fopen(path, "r");
    char *line = NULL;
    size_t cap = 0;
    json_t *tools = NULL;
    if (f && getline(&line, &cap, f) > 0) {
        json_t *j = json_loads(line, 0, NULL);
        tools = json_incref(json_object_get(j, "tools"));
        json_decref(j);
    }
    free(line);
    if (f) fclose(f);
    return tools;
}

/* What a tool agent's rollouts must show beyond lt_check_rollouts: every call asked with the
 * tools of its warm start (sft_path: what the framework sent when the data was made is
 * what it sends now), two reward parts, "key" and "room". Chat completions agents only (the
 * spans keep the agent's own request and answer). A first call that serve parsed as
 * an open_door call has its key's share of k, halved, as the key reward, is followed by a
 * second call whose last message is the door's answer to that key as the tool's result,
 * and the room reward is half the second answer's share of the room's letter; a first call
 * in text is the rollout's only call, scored on its text, room 0. Returns how many first
 * calls were tool calls. */
static __attribute__((unused)) int lt_check_tool_agent(const lt_rollout *o, size_t n, const char *sft_path)
{
    json_t *want_tools = lt_sft_tools(sft_path);
    CHECKF(want_tools && json_array_size(want_tools) == 1, "no tools in %s", sft_path);
    int tool_calls = 0;
    for (size_t k = 0; k < n; k++) {
        const lt_rollout *r = &o[k];
        if (!r->ncalls) continue;
        for (int i = 0; i < r->ncalls; i++) {
            json_t *req = json_loads(r->calls[i]->llm_call.request_json, JSON_ALLOW_NUL, NULL);
            CHECKF(json_equal(json_object_get(req, "tools"), want_tools),
                   "rollout %s call %d: the agent's tools differ from %s's (run node "
                   "examples/letters/make_tool_sft.js): %s",
                   r->rollout, i, sft_path, r->calls[i]->llm_call.request_json);
            json_decref(req);
        }
        const al_span *key = lt_reward(r, "key"), *room = lt_reward(r, "room");
        CHECKF(key && room && r->nrewards == 2, "rollout %s: rewards key %p, room %p of %d",
               r->rollout, (const void *)key, (const void *)room, r->nrewards);
        if (!key || !room) continue;
        char letter = lt_room_of(r->task);
        json_t *tc = lt_message(r->calls[0], "tool_calls");
        /* the first open_door call with a string key is the one the tool runs first */
        json_t *args = NULL;
        const char *attempt = NULL;
        for (size_t i = 0; i < json_array_size(tc) && !attempt; i++) {
            json_t *fn = json_object_get(json_array_get(tc, i), "function");
            if (strcmp(json_string_value(json_object_get(fn, "name")) ?: "", "open_door")) continue;
            json_decref(args);
            args = json_loads(json_string_value(json_object_get(fn, "arguments")) ?: "", 0, NULL);
            attempt = json_string_value(json_object_get(args, "key"));
        }
        if (attempt) {
            /* the door opened (or not) on this key, and call 2 saw what it said */
            tool_calls++;
            CHECK_NEAR(key->reward.value, lt_share(attempt, 'k') / 2, 1e-9);
            CHECKF(key->reward.after_sequence == r->calls[0]->sequence,
                   "rollout %s: the key reward follows sequence %lld, call 1 is %lld", r->rollout,
                   (long long)key->reward.after_sequence, (long long)r->calls[0]->sequence);
            CHECKF(r->ncalls == 2, "rollout %s: a tool call, then %d calls in all", r->rollout,
                   r->ncalls);
            if (r->ncalls == 2) {
                char door[128];
                lt_door_answer(letter, attempt, door, sizeof door);
                json_t *req = json_loads(r->calls[1]->llm_call.request_json, JSON_ALLOW_NUL, NULL);
                json_t *msgs = json_object_get(req, "messages");
                json_t *last = json_array_get(msgs, json_array_size(msgs) - 1);
                CHECKF(!strcmp(json_string_value(json_object_get(last, "role")) ?: "", "tool") &&
                           !strcmp(json_string_value(json_object_get(last, "content")) ?: "", door),
                       "rollout %s: call 2 does not end with the door's answer '%s': %s",
                       r->rollout, door, r->calls[1]->llm_call.request_json);
                json_decref(req);
                json_t *text = lt_message(r->calls[1], "content");
                json_t *tc2 = lt_message(r->calls[1], "tool_calls");
                double want = json_array_size(tc2) ? 0 : lt_share_json(text, letter) / 2;
                CHECK_NEAR(room->reward.value, want, 1e-9);
                json_decref(text);
                json_decref(tc2);
            }
        } else if (json_array_size(tc)) {
            /* a tool call the framework could not run (another name, arguments without a
             * string key): the door never answered, both parts 0 */
            CHECK_NEAR(key->reward.value, 0, 0);
            CHECK_NEAR(room->reward.value, 0, 0);
        } else {
            /* text: the framework ends the run; the text is the attempt, the room 0 */
            json_t *text = lt_message(r->calls[0], "content");
            CHECKF(r->ncalls == 1, "rollout %s: call 1 in text, then %d calls", r->rollout,
                   r->ncalls);
            CHECK_NEAR(key->reward.value, lt_share_json(text, 'k') / 2, 1e-9);
            CHECK_NEAR(room->reward.value, 0, 0);
            json_decref(text);
        }
        json_decref(args);
        json_decref(tc);
    }
    json_decref(want_tools);
    return tool_calls;
}

static void lt_stop(lt_run *r);
/* The test of a tool agent (1403, 1404): the tiny model warm-started on the agent's own
 * warm-start file (lt_model: the fixture), then ntrain train tasks in groups of two and one val task
 * through `arclight rollouts`, the proxy and serve. Every rollout succeeds and is scored as
 * the agent documents (lt_check_tool_agent), and at least min_tool_calls of the first calls
 * are open_door calls that serve parsed out of the model's <tool_call> text. */
static __attribute__((unused)) void lt_tool_agent_test_cmd(const char *tag, const char *program,
                                                           const char *agent, const char *sft_path,
                                                           const char *fixture, int ntrain,
                                                           int min_tool_calls)
{
    lt_run r;
    REQUIRE(lt_start(&r, tag, sft_path, fixture) == 0);
    int st = lt_rollouts_cmd(&r, program, agent, ntrain, 1, 2);
    CHECKF(WIFEXITED(st) && WEXITSTATUS(st) == 0, "rollouts: status %d after %.0f s:\n%s", st,
           r.rollouts_s, r.rollouts_log);
    size_t want = (size_t)ntrain * 2 + 1;
    CHECK(lt_read_spans(&r, want) == want);
    lt_rollout o[64];
    size_t n = lt_rollouts_of(&r, o, 64);
    int calls = lt_check_rollouts(o, n, want, 1, 2);
    int tools = lt_check_tool_agent(o, n, sft_path);
    fprintf(stderr, "%s: %zu rollouts, %d calls in %.0f s; %d first calls were open_door calls\n",
            agent, n, calls, r.rollouts_s, tools);
    CHECKF(tools >= min_tool_calls, "%d of %zu first calls were tool calls, expected %d or more",
           tools, n, min_tool_calls);
    lt_stop(&r);
}

/* lt_tool_agent_test_cmd for `node examples/letters/AGENT`. */
static __attribute__((unused)) void lt_tool_agent_test(const char *tag, const char *agent,
                                                       const char *sft_path, const char *fixture,
                                                       int ntrain, int min_tool_calls)
{
    lt_tool_agent_test_cmd(tag, "node", agent, sft_path, fixture, ntrain, min_tool_calls);
}

static void lt_stop(lt_run *r)
{
    for (size_t i = 0; i < r->n; i++)
        al_span_clear(&r->s[i]);
    free(r->s);
    free(r->rollouts_log);
    if (r->started_proxy) px_stop(&r->px, SIGTERM, 10);
    if (r->started_serve) sv_stop(&r->serve);
    if (r->started_broker) al_test_broker_stop(&r->b);
    if (!testlib_cur_failed && r->dir[0] && al_test_rmtree(r->dir) != 0)
        fprintf(stderr, "could not remove %s\n", r->dir);
}

#endif
