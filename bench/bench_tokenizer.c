/*
 * bench_tokenizer: encode throughput of the Qwen3 tokenizer (byte-level BPE, NFC, Qwen2
 * regex, 151k merges) on a 2 MB mixed corpus (prose in several scripts, code, JSON),
 * against Hugging Face's JavaScript tokenizer (@huggingface/tokenizers under node) on
 * the same chunks in the same run. Both single-threaded, both after a warm-up pass that
 * fills their word caches; the ids must agree (checksum).
 *
 *   build/bench_tokenizer [SECONDS]      (from the repository root; needs node and
 *                                         tests/node/node_modules from scripts/setup.sh)
 */
#include "text/tokenizer.h"
#include "text/unicode.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#ifndef ARCLIGHT_QWEN3_TOKENIZER_DIR
#define ARCLIGHT_QWEN3_TOKENIZER_DIR "build/tokenizer/qwen3"
#endif

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static uint64_t rng = 0x2545F4914F6CDD1Dull;
static uint32_t rnd(uint32_t n)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng % n);
}

/* A deterministic corpus: Zipf-distributed pseudo-words from Latin, accented, Cyrillic and
 * CJK syllables, numbers, punctuation and newlines, plus code and JSON lines. */
static char *make_corpus(size_t target, size_t *len)
{
    static const char *syl[] = {
        "the", "an", "ing", "tion", "re", "con", "ver", "al", "ment", "pro",  "er",  "st", "qu",
        "ph",  "é",  "è",   "ü",    "ñ",  "ção", "ст",  "ра", "но",   "ко",   "中",  "文", "字",
        "の",  "テ", "キ",  "한",   "국", "ab",  "zy",  "ox", "ly",   "ness", "ous", "ic", "ed"};
    static const char *code[] = {
        "    for (size_t i = 0; i < n; i++) {\n", "        sum += a[i] * b[i];\n", "    }\n",
        "def f(x):\n    return x ** 2  # square\n",
        "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 3}}\n"};
    enum { NWORDS = 20000 };
    char(*words)[40] = malloc(NWORDS * sizeof *words);
    for (int w = 0; w < NWORDS; w++) {
        words[w][0] = 0;
        int ns = 1 + (int)rnd(4);
        for (int k = 0; k < ns; k++)
            strcat(words[w], syl[rnd(sizeof syl / sizeof syl[0])]);
    }
    char *out = malloc(target + 256);
    size_t n = 0;
    while (n < target) {
        uint32_t r = rnd(100);
        if (r < 3) {
            const char *c = code[rnd(sizeof code / sizeof code[0])];
            memcpy(out + n, c, strlen(c));
            n += strlen(c);
            continue;
        }
        /* Zipf-ish: square of a uniform variate favours low indices */
        double u = (double)rnd(1000000) / 1e6;
        const char *w = words[(int)(u * u * u * (NWORDS - 1))];
        if (r < 8) n += (size_t)sprintf(out + n, " %u", rnd(100000));
        out[n++] = ' ';
        memcpy(out + n, w, strlen(w));
        n += strlen(w);
        if (r >= 90) out[n++] = (r % 3) ? ',' : '.';
        if (r >= 97) out[n++] = '\n';
    }
    free(words);
    out[n] = 0;
    *len = n;
    return out;
}

typedef struct chunk {
    size_t at, len;
} chunk;

int main(int argc, char **argv)
{
    double seconds = argc > 1 ? atof(argv[1]) : 1.0;
    char err[300];
    double t0 = now();
    al_tokenizer *tok = al_tokenizer_load_dir(ARCLIGHT_QWEN3_TOKENIZER_DIR, err, sizeof err);
    if (!tok) {
        fprintf(stderr, "bench_tokenizer: %s\n", err);
        return 1;
    }
    double load_s = now() - t0;
    size_t len;
    char *corpus = make_corpus(2u << 20, &len);
    size_t nchunks = 0;
    chunk *chunks = malloc((len / 64 + 2) * sizeof *chunks);
    for (size_t at = 0; at < len;) {
        size_t end = at + 4096 < len ? at + 4096 : len;
        if (end < len) {
            size_t nl = end;
            while (nl > at && corpus[nl - 1] != '\n')
                nl--;
            if (nl > at) end = nl;
        }
        chunks[nchunks++] = (chunk){at, end - at};
        at = end;
    }
    /* pass 1 is cold (empty word cache); then timed warm passes */
    al_token_ids ids = {0};
    uint32_t sum = 0;
    size_t tokens = 0;
    double c0 = now();
    for (size_t i = 0; i < nchunks; i++) {
        ids.len = 0;
        al_tokenizer_encode(tok, corpus + chunks[i].at, chunks[i].len, 0, &ids);
        for (size_t k = 0; k < ids.len; k++)
            sum = sum * 31u + (uint32_t)ids.ids[k];
        tokens += ids.len;
    }
    double cold_s = now() - c0;
    int passes = 0;
    double w0 = now(), el;
    do {
        for (size_t i = 0; i < nchunks; i++) {
            ids.len = 0;
            al_tokenizer_encode(tok, corpus + chunks[i].at, chunks[i].len, 0, &ids);
        }
        passes++;
        el = now() - w0;
    } while (el < seconds);
    double mbs = len * (double)passes / el / 1e6;
    printf("corpus %zu bytes in %zu chunks, %zu tokens (%.2f bytes/token); tokenizer loaded in "
           "%.2fs\n",
           len, nchunks, tokens, (double)len / tokens, load_s);
    printf("  arclight al_tokenizer_encode  cold %7.2f MB/s   warm %7.2f MB/s\n",
           len / cold_s / 1e6, mbs);

    char corpus_path[] = "/tmp/arclight-bench-corpus-XXXXXX";
    int fd = mkstemp(corpus_path);
    FILE *f = fd >= 0 ? fdopen(fd, "wb") : NULL;
    if (!f || fwrite(corpus, 1, len, f) != len) {
        fprintf(stderr, "bench_tokenizer: cannot write %s\n", corpus_path);
        return 1;
    }
    fclose(f);
    int same = 1;
    double rust_mbs = 0;
    static const char *impls[] = {"rust", "js"};
    static const char *names[] = {"tokenizers (HF Rust, node bindings)",
                                  "@huggingface/tokenizers (JS)"};
    for (int r = 0; r < 2; r++) {
        char cmd[1024];
        snprintf(cmd, sizeof cmd,
                 "RAYON_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false node "
                 "bench/bench_tokenizer_ref.mjs %s %s %s %g",
                 impls[r], ARCLIGHT_QWEN3_TOKENIZER_DIR, corpus_path, seconds);
        FILE *p = popen(cmd, "r");
        double ref_mbs = 0;
        size_t ref_tokens = 0;
        unsigned ref_sum = 0;
        int got = p ? fscanf(p, "%lf %zu %u", &ref_mbs, &ref_tokens, &ref_sum) : 0;
        int rc = p ? pclose(p) : -1;
        if (got != 3 || rc != 0) {
            fprintf(stderr,
                    "bench_tokenizer: the reference (%s) did not run; run scripts/setup.sh for "
                    "node packages\n",
                    cmd);
            remove(corpus_path);
            return 1;
        }
        if (r == 0) rust_mbs = ref_mbs;
        int agree = ref_sum == sum && ref_tokens == tokens;
        same &= agree;
        printf("  %-40s warm %7.2f MB/s   ids identical: %s   arclight is %.2fx\n", names[r],
               ref_mbs, agree ? "yes" : "NO", mbs / ref_mbs);
    }
    remove(corpus_path);
    printf("ratio arclight / HF Rust tokenizers (warm, 1 thread): %.2f\n", mbs / rust_mbs);
    free(ids.ids);
    free(chunks);
    free(corpus);
    al_tokenizer_free(tok);
    return same ? 0 : 1;
}
