/*
 * 0608: `arclight model sft`, the supervised warm start, run as a user would ($ARCLIGHT_BIN):
 * on a tiny random model and conversations whose answer repeats the letter they show, the
 * loss falls, the written model loads, and it answers a held-out prompt of that kind with
 * more probability on the right letter than the model it started from. Bad data is refused
 * with the line named.
 */
#include "testlib.h"

#include "model/model.h"
#include "model/safetensors.h"
#include "text/tokenizer.h"

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
    char dir[] = "/tmp/arclight-t0608-XXXXXX", out[16384], path[300];
    REQUIRE(mkdtemp(dir));
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
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (!testlib_cur_failed && system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
}
