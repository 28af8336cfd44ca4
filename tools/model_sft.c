/*
 * model_sft.c: `arclight model sft`, a supervised warm start from a file, before RL.
 *
 *   arclight model sft --model DIR --data FILE --out DIR [--tokenizer DIR] [--steps N]
 *                      [--batch B] [--lr LR] [--lr-schedule constant|cosine]
 *                      [--min-lr-ratio R] [--seed S] [--epochs E]
 *
 * FILE is JSONL, one conversation per line, {"messages": [{"role": "user", "content":
 * "..."}, ..., {"role": "assistant", "content": "..."}], "tools": [...]}: the last message
 * is the target (an assistant message), everything before it the prompt, rendered with the
 * tokenizer's chat template and its generation prompt exactly as `arclight serve` renders a
 * request, so the model learns what it will be asked. Messages and "tools" (optional;
 * OpenAI tools entries, which the template puts in the system prompt) are read as serve
 * reads a request's: content a string, null or text parts; an assistant message may carry
 * "tool_calls" (function name and arguments, a JSON string or object), a "tool" message is
 * a tool's result. A text target is the content's tokens and the end of turn (<|im_end|>,
 * else the tokenizer's eos); a target with tool calls is what the template renders for it
 * (<tool_call> blocks, which serve parses back into tool_calls): the rendering of the whole
 * conversation less the rendering of its prompt, up to and including the <|im_end|> that
 * follows, after checking that the one begins with the other. Each step packs B
 * conversations (in a seeded shuffled order, epoch after epoch) into one micro-batch and
 * makes one AdamW update on the SFT loss (token mean of -log p over the targets), the
 * learning rate decaying on a cosine to --min-lr-ratio (0) times --lr by the last step
 * (--lr-schedule constant keeps it); the loss is printed every 10 steps and the weights
 * written to --out (config.json + model.safetensors, f32) at the end. Bad lines are errors
 * naming the line; nothing is skipped.
 */
#include "api/translate.h"
#include "core/cli.h"
#include "core/flags.h"
#include "core/hash.h"
#include "core/parse.h"
#include "core/util.h"
#include "core/vec.h"
#include "model/model.h"
#include "model/safetensors.h"
#include "text/tokenizer.h"
#include "model/trainer.h"
#include "model.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct sft_example {
    int32_t *ids; /* prompt then target */
    int n, nprompt;
} sft_example;

static int parse_role(const char *s, al_chat_role *r)
{
    if (!s) return -1;
    if (!strcmp(s, "system")) *r = AL_CHAT_SYSTEM;
    else if (!strcmp(s, "user")) *r = AL_CHAT_USER;
    else if (!strcmp(s, "assistant")) *r = AL_CHAT_ASSISTANT;
    else if (!strcmp(s, "tool")) *r = AL_CHAT_TOOL;
    else return -1;
    return 0;
}

/* What one line's conversation holds, in the form the chat template takes; the strings
 * point into the line's JSON or into `owned`. */
typedef struct sft_conv {
    al_chat_message *m;
    size_t n;
    al_chat_tool_call *calls;
    const char **tools;
    size_t ntools;
    char **owned; /* message texts, argument and tool JSON written here */
    size_t nowned;
} sft_conv;

static void sft_conv_free(sft_conv *c)
{
    for (size_t i = 0; i < c->nowned; i++)
        free(c->owned[i]);
    free(c->owned);
    free(c->m);
    free(c->calls);
    free(c->tools);
}

/* Reads "messages" (and "tools") of a line as serve reads a request's. 0, or -1 with
 * errstr naming the message or tool. */
static int sft_conv_read(json_t *j, sft_conv *c, char *errstr, size_t errlen)
{
    json_t *msgs = json_object_get(j, "messages"), *tl = json_object_get(j, "tools");
    size_t n = json_array_size(msgs), ncalls = 0;
    memset(c, 0, sizeof *c);
    if (!json_is_array(msgs) || n < 2)
        return al_err(errstr, errlen, "wants {\"messages\": [at least 2 messages]}");
    if (tl && !json_is_array(tl))
        return al_err(errstr, errlen, "\"tools\" must be an array of OpenAI tools entries");
    size_t ntools = json_array_size(tl);
    for (size_t i = 0; i < n; i++)
        ncalls += json_array_size(json_object_get(json_array_get(msgs, i), "tool_calls"));
    c->n = n;
    c->m = calloc(n, sizeof *c->m);
    c->calls = calloc(ncalls + 1, sizeof *c->calls);
    c->tools = calloc(ntools + 1, sizeof *c->tools);
    c->owned = calloc(n + ncalls + ntools + 1, sizeof *c->owned);
    if (!c->m || !c->calls || !c->tools || !c->owned) return al_err(errstr, errlen, "out of memory");
    size_t at = 0;
    for (size_t i = 0; i < n; i++) {
        json_t *x = json_array_get(msgs, i), *tc = json_object_get(x, "tool_calls");
        char *text = NULL;
        if (parse_role(json_string_value(json_object_get(x, "role")), &c->m[i].role))
            return al_err(errstr, errlen, "message %zu needs a role (system, user, assistant, tool)",
                          i);
        if (tc && !json_is_null(tc) && (!json_is_array(tc) || c->m[i].role != AL_CHAT_ASSISTANT))
            return al_err(errstr, errlen, "message %zu: \"tool_calls\" must be an array, on an "
                                          "assistant message", i);
        int has_calls = json_array_size(tc) > 0;
        if (al_api_content_text(json_object_get(x, "content"), NULL, &text, NULL))
            return al_err(errstr, errlen, "message %zu: content must be a string or an array of "
                                          "text parts", i);
        if (!text && !has_calls)
            return al_err(errstr, errlen, "message %zu needs a string content (or, an assistant's, "
                                          "tool_calls)", i);
        if (text) c->owned[c->nowned++] = text;
        c->m[i].content = text;
        if (!has_calls) continue;
        c->m[i].tool_calls = c->calls + at;
        size_t k;
        json_t *call;
        json_array_foreach(tc, k, call)
        {
            json_t *fn = json_object_get(call, "function"), *args = json_object_get(fn, "arguments");
            const char *name = json_string_value(json_object_get(fn, "name"));
            if (!name || !(json_is_string(args) || json_is_object(args)))
                return al_err(errstr, errlen, "message %zu: tool_calls[%zu] needs function.name "
                                              "and function.arguments (a JSON string or object)",
                              i, k);
            if (json_is_string(args)) {
                json_t *parsed = json_loads(json_string_value(args), JSON_DECODE_ANY, NULL);
                int ok = json_is_object(parsed);
                json_decref(parsed);
                if (!ok)
                    return al_err(errstr, errlen, "message %zu: tool_calls[%zu].function.arguments "
                                                  "is not the JSON text of an object", i, k);
                c->calls[at].arguments = json_string_value(args);
            } else {
                char *a = json_dumps(args, JSON_COMPACT);
                if (!a) return al_err(errstr, errlen, "out of memory");
                c->owned[c->nowned++] = a;
                c->calls[at].arguments = a;
            }
            c->calls[at++].name = name;
            c->m[i].n_tool_calls++;
        }
    }
    for (size_t i = 0; i < ntools; i++) {
        json_t *t = json_array_get(tl, i);
        if (!json_is_object(t) ||
            !json_is_string(json_object_get(json_object_get(t, "function"), "name")))
            return al_err(errstr, errlen, "tools[%zu] must be {\"type\": \"function\", "
                                          "\"function\": {\"name\": ...}}", i);
        /* as serve writes a request's tools before the template re-serializes them */
        char *d = json_dumps(t, JSON_COMPACT | JSON_PRESERVE_ORDER);
        if (!d) return al_err(errstr, errlen, "out of memory");
        c->owned[c->nowned++] = d;
        c->tools[c->ntools++] = d;
    }
    return 0;
}

/* One line into an example: the prompt is the conversation before its last message,
 * rendered with the generation prompt. A target that is plain text is its content's tokens
 * and the end of turn; one with tool calls is what the template renders for it: the
 * rendering of the whole conversation less that of the prompt, up to and including the
 * first <|im_end|> after it (the prompt's tokens must be a prefix of the whole's). 0, or -1
 * with errstr. */
static int sft_line(const al_tokenizer *tok, int32_t end_id, const char *line, size_t len,
                    sft_example *ex, char *errstr, size_t errlen)
{
    json_error_t je;
    json_t *j = json_loadb(line, len, 0, &je);
    if (!j) return al_err(errstr, errlen, "%s", je.text);
    sft_conv c;
    int rc = -1;
    al_token_ids ids = {0}, whole = {0};
    if (sft_conv_read(j, &c, errstr, errlen)) goto out;
    const al_chat_message *target = &c.m[c.n - 1];
    if (target->role != AL_CHAT_ASSISTANT) {
        al_err(errstr, errlen, "the last message is the target and must be the assistant's");
        goto out;
    }
    al_chat_request req = {.messages = c.m, .n_messages = c.n - 1, .tools = c.tools,
                           .n_tools = c.ntools, .add_generation_prompt = 1};
    if (al_chat_encode(tok, &req, &ids, errstr, errlen)) goto out;
    size_t np = ids.len;
    if (!target->n_tool_calls) {
        const char *t = target->content;
        if (al_tokenizer_encode(tok, t, strlen(t), 0, &ids)) {
            al_err(errstr, errlen, "out of memory");
            goto out;
        }
    } else {
        al_chat_request all = req;
        all.n_messages = c.n;
        all.add_generation_prompt = 0;
        if (al_chat_encode(tok, &all, &whole, errstr, errlen)) goto out;
        size_t i = 0;
        while (i < np && i < whole.len && whole.ids[i] == ids.ids[i])
            i++;
        if (i < np) {
            al_err(errstr, errlen, "the template's rendering of the conversation does not begin "
                                   "with that of its prompt (token %zu of %zu differs), so the "
                                   "target's tokens cannot be told apart", i, np);
            goto out;
        }
        size_t e = np;
        while (e < whole.len && whole.ids[e] != end_id)
            e++;
        if (e == whole.len || e == np) {
            al_err(errstr, errlen, "the template renders the target's tool calls without an end "
                                   "of turn after them");
            goto out;
        }
        al_token_ids_free(&ids); /* the prompt's tokens are the whole's first np */
        ids = whole;
        ids.len = e; /* the target's tokens before its end of turn, which is added below */
        whole = (al_token_ids){0};
    }
    ex->nprompt = (int)np;
    ex->n = (int)ids.len + 1;
    ex->ids = malloc((size_t)ex->n * sizeof *ex->ids);
    if (!ex->ids) {
        al_err(errstr, errlen, "out of memory");
        goto out;
    }
    memcpy(ex->ids, ids.ids, ids.len * sizeof *ex->ids);
    ex->ids[ex->n - 1] = end_id;
    rc = 0;
out:
    al_token_ids_free(&ids);
    al_token_ids_free(&whole);
    sft_conv_free(&c);
    json_decref(j);
    return rc;
}

/* --min-lr-ratio: a number in [0, 1], kept as text for the trainer's config. */
static int sft_parse_ratio(void *dest, const char *v, char *err, size_t errlen)
{
    double x;
    if (al_parse_double(v, 0, 1, &x) != 0) {
        snprintf(err, errlen, "wants a number in [0, 1]");
        return -1;
    }
    *(const char **)dest = v;
    return 0;
}

static const char *const sft_schedules[] = {"constant", "cosine", NULL};

/* Reads the JSONL file of conversations into *ex (*nex of them; each example's ids and the
 * array owned by the caller, as is *text, the file's bytes). 0; -1 after saying what was wrong
 * (the file, a line); -2 when out of memory. */
static int sft_read(const char *data, al_tokenizer *tok, int32_t end_id, char **text,
                    sft_example **ex, size_t *nex)
{
    char err[1024];
    size_t len, cap = 0;
    if (!(*text = al_file_read(data, &len, err, sizeof err))) {
        fprintf(stderr, "arclight model sft: %s\n", err);
        return -1;
    }
    const char *t = *text;
    int lineno = 0;
    for (size_t pos = 0; pos < len;) {
        const char *nl = memchr(t + pos, '\n', len - pos);
        size_t e = nl ? (size_t)(nl - t) : len, n = e - pos;
        const char *line = t + pos;
        pos = e + 1;
        lineno++;
        while (n && (line[n - 1] == '\r' || line[n - 1] == ' ')) n--;
        if (!n || line[0] == '#') continue;
        if (al_vec_grow((void **)ex, &cap, *nex + 1, sizeof **ex) != 0) return -2;
        if (sft_line(tok, end_id, line, n, &(*ex)[*nex], err, sizeof err)) {
            fprintf(stderr, "arclight model sft: %s:%d: %s\n", data, lineno, err);
            return -1;
        }
        (*nex)++;
    }
    return 0;
}

/* Packs the next batch examples in the shuffled order into tokens, mask (1 on the target)
 * and cu (batch + 1 offsets); a new pass reshuffles order with the generator *rs. Returns
 * the tokens packed. */
static int sft_pack(const sft_example *ex, size_t nex, size_t *order, size_t *at, uint64_t *rs,
                    long batch, int32_t *tokens, float *mask, int32_t *cu)
{
    int T = 0;
    cu[0] = 0;
    for (long b = 0; b < batch; b++) {
        if (*at == nex) { /* next pass: a new order */
            for (size_t i = nex; i > 1; i--) {
                size_t j = (size_t)(al_splitmix64(rs) % i), t = order[i - 1];
                order[i - 1] = order[j];
                order[j] = t;
            }
            *at = 0;
        }
        const sft_example *x = &ex[order[(*at)++]];
        memcpy(tokens + T, x->ids, (size_t)x->n * sizeof *tokens);
        for (int i = 0; i < x->n; i++)
            mask[T + i] = i >= x->nprompt ? 1.0f : 0.0f;
        T += x->n;
        cu[b + 1] = T;
    }
    return T;
}

int model_sft(int argc, char **argv)
{
    const char *model_dir = NULL, *tok_dir = NULL, *data = NULL, *out = NULL;
    int64_t steps = 0, epochs = 1, batch = 16;
    int model_wait = 0;
    model_seed seed_flag = {1, 0};
    const char *lr = "1e-3", *schedule = "cosine", *min_lr_ratio = "0";
    const al_flag flags[] = {
        {"model", 0, AL_FLAG_STRING, &model_dir, .arg = "DIR",
         .help = "the weights to start from (config.json + model.safetensors)"},
        {"tokenizer", 0, AL_FLAG_STRING, &tok_dir, .arg = "DIR",
         .help = "tokenizer.json dir (default: --model)"},
        {"model-wait", 0, AL_FLAG_INT, &model_wait, .lo = 0, .hi = 86400, .arg = "S",
         .help = "wait up to S seconds (default 0) for --model to be written\n"
                 "(config.json + model.safetensors): a job that writes it may\n"
                 "still be running when this starts (docker-compose.yml)"},
        {"data", 0, AL_FLAG_STRING, &data, .arg = "FILE", .help = "the conversations"},
        {"out", 0, AL_FLAG_STRING, &out, .arg = "DIR", .help = "where the tuned weights go"},
        {"steps", 0, AL_FLAG_I64, &steps, .lo = 1, .hi = 10000000, .arg = "N",
         .help = "updates (default: --epochs passes over the data)"},
        {"epochs", 0, AL_FLAG_I64, &epochs, .lo = 1, .hi = 10000000, .arg = "E",
         .help = "passes over the data when --steps is not given (default 1)"},
        {"batch", 0, AL_FLAG_I64, &batch, .lo = 1, .hi = 10000000, .arg = "B",
         .help = "conversations per update (default 16)"},
        {"lr", 0, AL_FLAG_STRING, &lr, .arg = "LR", .help = "AdamW learning rate (default 1e-3)"},
        {"lr-schedule", 0, AL_FLAG_STRING, &schedule, .arg = "S", .choices = sft_schedules,
         .help = "cosine (default): from LR down to LR x --min-lr-ratio (default 0)\n"
                 "at the last step; or constant"},
        {"min-lr-ratio", 0, AL_FLAG_FUNC, &min_lr_ratio, .arg = "R",
         .help = "the cosine's floor, a fraction of LR (default 0)", .parse = sft_parse_ratio},
        {"seed", 0, AL_FLAG_FUNC, &seed_flag, .arg = "S",
         .help = "order of the conversations (default 1)", .parse = model_parse_seed},
    };
    const al_cmd_spec spec = {
        "model sft", "--model DIR --data FILE --out DIR [flags]",
        "Supervised fine-tuning from a JSONL file of conversations ({\"messages\": [...]}, the\n"
        "last one the assistant's target: text or tool_calls; optional \"tools\" as in a chat\n"
        "request), rendered with the tokenizer's chat template as serve renders a request.\n",
        flags, AL_ARRAY_LEN(flags), .common = 0};
    int first;
    int prc = al_flags_parse(&spec, NULL, argc, argv, &first);
    if (prc != AL_FLAGS_GO) return prc;
    if (first < argc)
        return al_cli_usage_error("model sft", "unexpected argument '%s'", argv[first]);
    if (!model_dir || !data || !out)
        return al_cli_usage_error("model sft", "--model, --data and --out are required");
    if (!tok_dir) tok_dir = model_dir;
    uint64_t seed = seed_flag.value;

    char err[1024];
    int rc = AL_EXIT_FAILURE;
    al_model *m = NULL;
    al_tokenizer *tok = NULL;
    al_trainer *tr = NULL;
    sft_example *ex = NULL;
    size_t nex = 0, *order = NULL;
    char *text = NULL;
    int32_t *tokens = NULL, *cu = NULL;
    float *mask = NULL;
    if (!al_model_dir_ready(model_dir) && model_wait > 0) {
        fprintf(stderr, "arclight model sft: waiting up to %d s for the model in %s\n", model_wait,
                model_dir);
        if (al_model_dir_wait(model_dir, model_wait, err, sizeof err) != 0) {
            fprintf(stderr, "arclight model sft: %s\n", err);
            goto out;
        }
    }
    if (!(tok = al_tokenizer_load_dir(tok_dir, err, sizeof err)) ||
        !(m = al_model_load_dir(model_dir, err, sizeof err))) {
        fprintf(stderr, "arclight model sft: %s\n", err);
        goto out;
    }
    int32_t end_id = al_tokenizer_token_to_id(tok, "<|im_end|>", 10);
    if (end_id < 0) end_id = al_tokenizer_eos_id(tok);
    int rr = sft_read(data, tok, end_id, &text, &ex, &nex);
    if (rr == -2) goto oom;
    if (rr != 0) goto out;
    if (!nex) {
        fprintf(stderr, "arclight model sft: %s holds no conversations\n", data);
        goto out;
    }
    if (batch > (long)nex) batch = (long)nex;
    if (!steps) steps = (long)((nex * (size_t)epochs + (size_t)batch - 1) / (size_t)batch);

    al_trainer_config cfg;
    al_trainer_config_default(&cfg);
    char total[32];
    snprintf(total, sizeof total, "%ld", steps);
    /* cosine by default: the last updates are small, so the result is not pulled towards
     * the last few batches' examples */
    if (al_trainer_config_set(&cfg, "loss", "sft", err, sizeof err) ||
        al_trainer_config_set(&cfg, "lr", lr, err, sizeof err) ||
        al_trainer_config_set(&cfg, "lr_schedule", schedule, err, sizeof err) ||
        al_trainer_config_set(&cfg, "total_steps", total, err, sizeof err) ||
        al_trainer_config_set(&cfg, "min_lr_ratio", min_lr_ratio, err, sizeof err) ||
        !(tr = al_trainer_new(m, NULL, &cfg, err, sizeof err))) {
        fprintf(stderr, "arclight model sft: %s\n", err);
        goto out;
    }
    if (!(order = malloc(nex * sizeof *order))) goto oom;
    for (size_t i = 0; i < nex; i++)
        order[i] = i;
    uint64_t rs = seed;
    size_t at = nex; /* position in the current shuffled pass */
    size_t maxtok = 0;
    for (size_t i = 0; i < nex; i++)
        maxtok = (size_t)ex[i].n > maxtok ? (size_t)ex[i].n : maxtok;
    size_t tcap = maxtok * (size_t)batch;
    tokens = malloc(tcap * sizeof *tokens);
    mask = malloc(tcap * sizeof *mask);
    cu = malloc(((size_t)batch + 1) * sizeof *cu);
    if (!tokens || !mask || !cu) goto oom;
    printf("sft: %zu conversations from %s, %ld steps of %ld, lr %s", nex, data, steps, batch, lr);
    if (strcmp(schedule, "constant")) printf(" (%s to x%s)", schedule, min_lr_ratio);
    printf("\n");
    fflush(stdout);
    for (long s = 0; s < steps; s++) {
        int T = sft_pack(ex, nex, order, &at, &rs, batch, tokens, mask, cu);
        al_train_chunk ch = {.T = T, .nseq = (int)batch, .tokens = tokens, .cu_seqlens = cu,
                             .mask = mask};
        al_train_stats st;
        if (al_trainer_step(tr, &ch, 1, &st, err, sizeof err)) {
            fprintf(stderr, "arclight model sft: step %ld: %s\n", s + 1, err);
            goto out;
        }
        if ((s + 1) % 10 == 0 || s == 0 || s + 1 == steps) {
            printf("sft: step %ld/%ld loss %.4f grad-norm %.3f\n", s + 1, steps, st.loss,
                   st.grad_norm);
            fflush(stdout);
        }
    }
    if (al_model_save_dir(m, out, AL_ST_DTYPE_F32, err, sizeof err)) {
        fprintf(stderr, "arclight model sft: %s\n", err);
        goto out;
    }
    printf("sft: wrote %s\n", out);
    rc = AL_EXIT_OK;
    goto out;
oom:
    fprintf(stderr, "arclight model sft: out of memory\n");
out:
    for (size_t i = 0; i < nex; i++)
        free(ex[i].ids);
    free(ex);
    free(order);
    free(text);
    free(tokens);
    free(mask);
    free(cu);
    al_trainer_free(tr);
    al_model_free(m);
    al_tokenizer_free(tok);
    return rc;
}
