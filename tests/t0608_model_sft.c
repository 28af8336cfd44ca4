/*
 * 0608: `arclight model sft`, the supervised warm start, run as a user would ($ARCLIGHT_BIN):
 * on a tiny random model and conversations whose answer repeats the letter they show, the
 * loss falls, the written model loads, and it answers a held-out prompt of that kind with
 * more probability on the right letter than the model it started from. Bad data is refused
 * with the line named.
 *
 * Conversations with tools: a line's "tools" go into the system prompt as serve renders a
 * request's, and an assistant target with "tool_calls" is trained on the template's
 * rendering of them. The first step's loss (the untrained model's, printed before its
 * update) must equal the token-mean cross-entropy, computed here, of exactly the tokens a
 * model must write for serve to parse that call (<tool_call>\n{"name": ..., "arguments":
 * ...}\n</tool_call> and <|im_end|>) after the prompt serve would render; the same for a
 * text target after a tool's result. After training on one such conversation the model's
 * greedy answer parses (al_chat_parse, serve's parser) into that call. Malformed tools and
 * tool calls are refused with the line named.
 */
#include "testlib.h"
#include "support.h"

#include "model/model.h"
#include "model/safetensors.h"
#include "text/tokenizer.h"

#include <stdarg.h>
#include <sys/wait.h>
#include <unistd.h>

static int run(char *out, size_t outlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int run(char *out, size_t outlen, const char *fmt, ...)
{
    char cmd[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    strncat(cmd, " 2>&1", sizeof cmd - strlen(cmd) - 1);
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    size_t n = fread(out, 1, outlen - 1, p);
    out[n] = 0;
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static const char *bin(void)
{
    const char *b = getenv("ARCLIGHT_BIN");
    return b ? b : "build/arclight";
}

/* The model's probability of `letter` as the first answer token to "Letters: L L L." */
static double p_first(const char *dir, const al_tokenizer *tok, char letter)
{
    char err[512];
    al_model *m = al_model_load_dir(dir, err, sizeof err);
    if (!m) {
        fprintf(stderr, "load %s: %s\n", dir, err);
        return -1;
    }
    char text[64];
    snprintf(text, sizeof text, "Letters: %c %c %c. Repeat them.", letter, letter, letter);
    al_chat_message msg = {.role = AL_CHAT_USER, .content = text};
    al_chat_request req = {.messages = &msg, .n_messages = 1, .add_generation_prompt = 1};
    al_token_ids ids = {0};
    double p = -1;
    if (al_chat_encode(tok, &req, &ids, err, sizeof err) == 0) {
        int V = al_model_config_of(m)->vocab_size;
        float *logits = malloc((size_t)V * ids.len * sizeof *logits);
        int32_t cu[2] = {0, (int32_t)ids.len}, *pos = malloc(ids.len * sizeof *pos);
        for (size_t i = 0; pos && i < ids.len; i++)
            pos[i] = (int32_t)i;
        if (logits && pos && al_model_forward(m, ids.ids, pos, cu, 1, (int)ids.len, logits) == 0) {
            const float *row = logits + (ids.len - 1) * (size_t)V;
            double mx = row[0], sum = 0;
            for (int v = 1; v < V; v++)
                if (row[v] > mx) mx = row[v];
            for (int v = 0; v < V; v++)
                sum += exp(row[v] - mx);
            char s[2] = {letter, 0};
            int32_t id = al_tokenizer_token_to_id(tok, s, 1);
            p = id >= 0 ? exp(row[id] - mx) / sum : -1;
        }
        free(logits);
        free(pos);
    }
    al_token_ids_free(&ids);
    al_model_free(m);
    return p;
}

TEST(sft_learns_from_a_file_and_refuses_bad_lines)
{
    char dir[128], out[16384], path[300];
    REQUIRE(al_test_tmpdir(dir, sizeof dir, "t0608"));
    int rc = run(out, sizeof out, "%s model init --config tests/model/tiny-qwen2.json --out %s/a "
                                  "--seed 3", bin(), dir);
    REQUIREF(rc == 0, "%s", out);
    snprintf(path, sizeof path, "%s/data.jsonl", dir);
    FILE *f = fopen(path, "w");
    REQUIRE(f);
    const char letters[] = "bjkqvx";
    for (int i = 0; i < 120; i++) {
        char l = letters[i % 5]; /* 'x' is held out */
        fprintf(f, "{\"messages\": [{\"role\": \"user\", \"content\": \"Letters: %c %c %c. Repeat "
                   "them.\"}, {\"role\": \"assistant\", \"content\": \"%c%c%c%c\"}]}\n",
                l, l, l, l, l, l, l);
    }
    fclose(f);
    rc = run(out, sizeof out,
             "%s model sft --model %s/a --tokenizer tests/tokenizer/tiny --data %s --out %s/b "
             "--steps 25 --batch 8 --lr 2e-2",
             bin(), dir, path, dir);
    REQUIREF(rc == 0, "exit %d:\n%s", rc, out);
    double first = -1, last = -1;
    for (const char *p = out; (p = strstr(p, " loss ")); p++) {
        double v = atof(p + 6);
        if (first < 0) first = v;
        last = v;
    }
    CHECKF(first > 0 && last > 0 && last < first / 2, "loss %g -> %g:\n%s", first, last, out);
    CHECK(strstr(out, "120 conversations"));

    char err[512];
    al_tokenizer *tok = al_tokenizer_load_dir("tests/tokenizer/tiny", err, sizeof err);
    REQUIREF(tok, "%s", err);
    snprintf(path, sizeof path, "%s/a", dir);
    double before = p_first(path, tok, 'k');
    snprintf(path, sizeof path, "%s/b", dir);
    double after = p_first(path, tok, 'k');
    CHECKF(before >= 0 && after > 10 * before, "p('k') %g -> %g", before, after);
    al_tokenizer_free(tok);

    /* bad data: named by line, nothing written */
    snprintf(path, sizeof path, "%s/bad.jsonl", dir);
    f = fopen(path, "w");
    REQUIRE(f);
    fprintf(f, "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}, {\"role\": \"assistant\", "
               "\"content\": \"b\"}]}\n\n");
    fprintf(f, "{\"messages\": [{\"role\": \"assistant\", \"content\": \"b\"}, {\"role\": \"user\", "
               "\"content\": \"a\"}]}\n");
    fclose(f);
    rc = run(out, sizeof out, "%s model sft --model %s/a --tokenizer tests/tokenizer/tiny --data %s "
                              "--out %s/c --steps 2",
             bin(), dir, path, dir);
    CHECKF(rc == 1 && strstr(out, "bad.jsonl:3:") && strstr(out, "must be the assistant's"),
           "exit %d: %s", rc, out);
    snprintf(path, sizeof path, "%s/c/model.safetensors", dir);
    CHECK(access(path, F_OK) != 0);
    rc = run(out, sizeof out, "%s model sft --model %s/a --out %s/c", bin(), dir, dir);
    CHECKF(rc == 2 && strstr(out, "--data"), "exit %d: %s", rc, out);
    if (!testlib_cur_failed && al_test_rmtree(dir) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
}

/* Token-mean -log p of target[0..nt) after prompt[0..np) under the model in dir; -1 on
 * failure. */
static double nll(const char *dir, const int32_t *prompt, size_t np, const int32_t *target,
                  size_t nt)
{
    char err[512];
    al_model *m = al_model_load_dir(dir, err, sizeof err);
    if (!m) return -1;
    int V = al_model_config_of(m)->vocab_size, T = (int)(np + nt);
    int32_t *ids = malloc((size_t)T * sizeof *ids), *pos = malloc((size_t)T * sizeof *pos);
    float *logits = malloc((size_t)T * (size_t)V * sizeof *logits);
    double sum = -1;
    if (ids && pos && logits) {
        memcpy(ids, prompt, np * sizeof *ids);
        memcpy(ids + np, target, nt * sizeof *ids);
        for (int i = 0; i < T; i++)
            pos[i] = i;
        int32_t cu[2] = {0, T};
        if (al_model_forward(m, ids, pos, cu, 1, T, logits) == 0) {
            sum = 0;
            for (int t = (int)np; t < T; t++) {
                const float *row = logits + (size_t)(t - 1) * V;
                double mx = row[0], z = 0;
                for (int v = 1; v < V; v++)
                    mx = row[v] > mx ? row[v] : mx;
                for (int v = 0; v < V; v++)
                    z += exp(row[v] - mx);
                sum += -(row[ids[t]] - mx - log(z));
            }
            sum /= (double)nt;
        }
    }
    free(ids), free(pos), free(logits);
    al_model_free(m);
    return sum;
}

/* The loss `model sft` prints for its first step. */
static double first_loss(const char *out)
{
    const char *p = strstr(out, "step 1/");
    p = p ? strstr(p, " loss ") : NULL;
    return p ? atof(p + 6) : -1;
}

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    if (f) {
        fputs(text, f);
        fclose(f);
    }
}

static const char TOOL[] =
    "{\"type\": \"function\", \"function\": {\"name\": \"get_letter\", \"description\": \"Reads "
    "a letter.\", \"parameters\": {\"type\": \"object\", \"properties\": {\"letter\": {\"type\": "
    "\"string\"}}, \"required\": [\"letter\"]}}}";

TEST(sft_trains_tool_calls_as_the_template_renders_them)
{
    char dir[128], out[16384], path[300], model[320];
    REQUIRE(al_test_tmpdir(dir, sizeof dir, "t0608t"));
    int rc = run(out, sizeof out, "%s model init --config tests/model/tiny-qwen2.json --out %s/a "
                                  "--seed 5", bin(), dir);
    REQUIREF(rc == 0, "%s", out);
    snprintf(model, sizeof model, "%s/a", dir);
    char err[512];
    al_tokenizer *tok = al_tokenizer_load_dir("tests/tokenizer/tiny", err, sizeof err);
    REQUIREF(tok, "%s", err);
    const char *tools[] = {TOOL};
    al_chat_message sys = {.role = AL_CHAT_SYSTEM, .content = "You read letters."};
    al_chat_message user = {.role = AL_CHAT_USER, .content = "Letters: q q."};
    int32_t im_end = al_tokenizer_token_to_id(tok, "<|im_end|>", 10);

    /* 1. a tool call target, its arguments as OpenAI sends them (a JSON string) and as an
     * object: the prompt is what serve renders for the request, the target the call as
     * serve parses it back */
    al_chat_message convo[] = {sys, user};
    al_chat_request req = {.messages = convo, .n_messages = 2, .tools = tools, .n_tools = 1,
                           .add_generation_prompt = 1};
    al_token_ids prompt = {0}, target = {0};
    REQUIRE(al_chat_encode(tok, &req, &prompt, err, sizeof err) == 0);
    const char *call_text =
        "<tool_call>\n{\"name\": \"get_letter\", \"arguments\": {\"letter\": \"q\"}}\n</tool_call>";
    REQUIRE(al_tokenizer_encode(tok, call_text, strlen(call_text), AL_TOKENIZER_ALLOW_SPECIAL,
                                &target) == 0);
    REQUIRE(target.len + 1 < 200);
    int32_t want[200];
    memcpy(want, target.ids, target.len * sizeof *want);
    want[target.len] = im_end;
    double expect = nll(model, prompt.ids, prompt.len, want, target.len + 1);
    REQUIRE(expect > 0);
    /* the tools entry goes between each pair */
    const char *lines[][2] = {
        {"{\"tools\": [",
         "], \"messages\": [{\"role\": \"system\", \"content\": \"You read letters.\"}, {\"role\": "
         "\"user\", \"content\": \"Letters: q q.\"}, {\"role\": \"assistant\", \"content\": null, "
         "\"tool_calls\": [{\"id\": \"c1\", \"type\": \"function\", \"function\": {\"name\": "
         "\"get_letter\", \"arguments\": \"{\\\"letter\\\":\\\"q\\\"}\"}}]}]}\n"},
        {"{\"tools\": [",
         "], \"messages\": [{\"role\": \"system\", \"content\": [{\"type\": \"text\", \"text\": "
         "\"You read letters.\"}]}, {\"role\": \"user\", \"content\": \"Letters: q q.\"}, "
         "{\"role\": \"assistant\", \"tool_calls\": [{\"type\": \"function\", \"function\": "
         "{\"name\": \"get_letter\", \"arguments\": {\"letter\": \"q\"}}}]}]}\n"},
    };
    char line[2048];
    for (int i = 0; i < 2; i++) {
        snprintf(line, sizeof line, "%s%s%s", lines[i][0], TOOL, lines[i][1]);
        snprintf(path, sizeof path, "%s/call%d.jsonl", dir, i);
        write_file(path, line);
        rc = run(out, sizeof out, "%s model sft --model %s --tokenizer tests/tokenizer/tiny "
                                  "--data %s --out %s/b --steps 1 --batch 1",
                 bin(), model, path, dir);
        CHECKF(rc == 0, "exit %d:\n%s", rc, out);
        CHECKF(fabs(first_loss(out) - expect) < 2e-4, "line %d: first loss %g, the call's "
               "tokens give %g:\n%s", i, first_loss(out), expect, out);
    }

    /* 2. a text target after the tool's result: the prompt renders the earlier call and the
     * result as serve does */
    al_chat_tool_call tc = {.name = "get_letter", .arguments = "{\"letter\": \"q\"}"};
    al_chat_message asked = {.role = AL_CHAT_ASSISTANT, .tool_calls = &tc, .n_tool_calls = 1};
    al_chat_message result = {.role = AL_CHAT_TOOL, .content = "Letters: v v."};
    al_chat_message convo2[] = {sys, user, asked, result};
    req.messages = convo2;
    req.n_messages = 4;
    al_token_ids prompt2 = {0}, target2 = {0};
    REQUIRE(al_chat_encode(tok, &req, &prompt2, err, sizeof err) == 0);
    REQUIRE(al_tokenizer_encode(tok, "vvv", 3, 0, &target2) == 0);
    int32_t want2[16];
    memcpy(want2, target2.ids, target2.len * sizeof *want2);
    want2[target2.len] = im_end;
    double expect2 = nll(model, prompt2.ids, prompt2.len, want2, target2.len + 1);
    snprintf(line, sizeof line,
             "{\"tools\": [%s], \"messages\": [{\"role\": \"system\", \"content\": \"You read "
             "letters.\"}, {\"role\": \"user\", \"content\": \"Letters: q q.\"}, {\"role\": "
             "\"assistant\", \"content\": null, \"tool_calls\": [{\"id\": \"c1\", \"type\": "
             "\"function\", \"function\": {\"name\": \"get_letter\", \"arguments\": "
             "\"{\\\"letter\\\": \\\"q\\\"}\"}}]}, {\"role\": \"tool\", \"tool_call_id\": \"c1\", "
             "\"content\": \"Letters: v v.\"}, {\"role\": \"assistant\", \"content\": \"vvv\"}]}\n",
             TOOL);
    snprintf(path, sizeof path, "%s/after.jsonl", dir);
    write_file(path, line);
    rc = run(out, sizeof out, "%s model sft --model %s --tokenizer tests/tokenizer/tiny --data %s "
                              "--out %s/b --steps 1 --batch 1",
             bin(), model, path, dir);
    CHECKF(rc == 0 && fabs(first_loss(out) - expect2) < 2e-4,
           "exit %d, first loss %g, the answer's tokens give %g:\n%s", rc, first_loss(out), expect2,
           out);

    /* 3. it learns the call: trained on the conversation of 1 (at a constant rate: 40 steps
     * are too few under the cosine), its greedy answer is that call once serve's parser has
     * read it */
    snprintf(path, sizeof path, "%s/call0.jsonl", dir);
    rc = run(out, sizeof out, "%s model sft --model %s --tokenizer tests/tokenizer/tiny --data %s "
                              "--out %s/c --steps 40 --batch 2 --lr 1e-2 --lr-schedule constant",
             bin(), model, path, dir);
    REQUIREF(rc == 0, "exit %d:\n%s", rc, out);
    snprintf(path, sizeof path, "%s/c", dir);
    al_model *m = al_model_load_dir(path, err, sizeof err);
    REQUIREF(m, "%s", err);
    int V = al_model_config_of(m)->vocab_size;
    int32_t ids[1024], pos[1024];
    size_t n = prompt.len;
    REQUIRE(n + 64 < 1024);
    memcpy(ids, prompt.ids, n * sizeof *ids);
    float *logits = malloc((n + 64) * (size_t)V * sizeof *logits);
    REQUIRE(logits);
    for (int step = 0; step < 60; step++) {
        for (size_t i = 0; i < n; i++)
            pos[i] = (int32_t)i;
        int32_t cu[2] = {0, (int32_t)n};
        REQUIRE(al_model_forward(m, ids, pos, cu, 1, (int)n, logits) == 0);
        const float *row = logits + (n - 1) * (size_t)V;
        int best = 0;
        for (int v = 1; v < V; v++)
            best = row[v] > row[best] ? v : best;
        if (best == im_end) break;
        ids[n++] = best;
    }
    char *text = NULL;
    size_t tlen = 0;
    REQUIRE(al_tokenizer_decode(tok, ids + prompt.len, n - prompt.len, 0, &text, &tlen) == 0);
    al_chat_parsed parsed = {0};
    REQUIRE(al_chat_parse(text, tlen, 0, &parsed) == 0);
    CHECKF(parsed.n_calls == 1 && !strcmp(parsed.calls[0].name, "get_letter") &&
               !strcmp(parsed.calls[0].arguments, "{\"letter\": \"q\"}"),
           "the trained model answers '%s'", text);
    al_chat_parsed_free(&parsed);
    free(text);
    free(logits);
    al_model_free(m);

    /* 4. malformed tools and calls: refused, the line named */
    const char *bad[][2] = {
        {"{\"tools\": {\"type\": \"function\"}, \"messages\": [{\"role\": \"user\", \"content\": "
         "\"a\"}, {\"role\": \"assistant\", \"content\": \"b\"}]}",
         "\"tools\" must be an array"},
        {"{\"tools\": [{\"type\": \"function\"}], \"messages\": [{\"role\": \"user\", \"content\": "
         "\"a\"}, {\"role\": \"assistant\", \"content\": \"b\"}]}",
         "tools[0] must be"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}, {\"role\": \"assistant\", "
         "\"tool_calls\": [{\"function\": {\"name\": \"f\", \"arguments\": \"{not json\"}}]}]}",
         "not the JSON text of an object"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}, {\"role\": \"assistant\", "
         "\"tool_calls\": [{\"function\": {\"arguments\": {}}}]}]}",
         "needs function.name"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"a\", \"tool_calls\": []}, "
         "{\"role\": \"assistant\", \"content\": \"b\"}]}",
         "on an assistant message"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}, {\"role\": \"assistant\"}]}",
         "needs a string content"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(path, sizeof path, "%s/bad%zu.jsonl", dir, i);
        snprintf(line, sizeof line, "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}, "
                                    "{\"role\": \"assistant\", \"content\": \"b\"}]}\n%s\n",
                 bad[i][0]);
        write_file(path, line);
        rc = run(out, sizeof out, "%s model sft --model %s --tokenizer tests/tokenizer/tiny "
                                  "--data %s --out %s/d --steps 1",
                 bin(), model, path, dir);
        char where[320];
        snprintf(where, sizeof where, "bad%zu.jsonl:2:", i);
        CHECKF(rc == 1 && strstr(out, where) && strstr(out, bad[i][1]), "case %zu: exit %d: %s", i,
               rc, out);
    }
    al_token_ids_free(&prompt), al_token_ids_free(&target);
    al_token_ids_free(&prompt2), al_token_ids_free(&target2);
    al_tokenizer_free(tok);
    if (!testlib_cur_failed && al_test_rmtree(dir) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
}
