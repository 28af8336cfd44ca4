/*
 * tokenizer.c: byte-level BPE over Hugging Face's tokenizer.json.
 *
 * Encoding runs in four steps, as Hugging Face's tokenizers do:
 *   1. added tokens are cut out of the raw text (leftmost-longest match);
 *   2. each remaining segment is normalized (NFC when the file asks for it);
 *   3. the pre-tokenizer splits the segment into words with the model's regex, matched by
 *      hand-written code for the few patterns byte-level models use;
 *   4. each word's bytes map to byte-level symbols that are merged by rank, lowest first
 *      (leftmost on ties), with a heap; results are kept in a bounded word cache.
 */
#include "text/tokenizer.h"

#include "core/hash.h"
#include "text/json.h"
#include "text/unicode.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_TOKEN_ID (1 << 24)      /* larger ids in a file are refused rather than allocated */
#define CACHE_MAX_ENTRIES (1 << 16) /* the word cache is emptied when it reaches this */
#define CACHE_MAX_WORD 128          /* longer words are not cached */
#define MAX_SPLITS 4

typedef enum pretok_pattern {
    PATTERN_GPT2,   /* 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ */
    PATTERN_QWEN2,  /* (?i:'s|...)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|
                       ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+ */
    PATTERN_LLAMA3, /* as Qwen2 with \p{N}{1,3} */
} pretok_pattern;

static const struct {
    pretok_pattern kind;
    const char *regex;
} known_patterns[] = {
    {PATTERN_GPT2,
     "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"},
    {PATTERN_QWEN2, "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
                    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
    {PATTERN_LLAMA3, "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
                     "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
};

enum { TOKEN_ADDED = 1, TOKEN_SPECIAL = 2 };

typedef struct added_token {
    int32_t id;
    const char *content; /* points into the token arena */
    size_t len;
    int lstrip, rstrip, special;
} added_token;

typedef struct cache_entry {
    struct cache_entry *next;
    uint64_t hash;
    uint32_t word_len, n_ids;
    int32_t *ids; /* points into the same allocation, after the word */
    char word[];
} cache_entry;

typedef struct arena_block {
    struct arena_block *next;
    size_t used, cap;
    char data[];
} arena_block;

struct al_tokenizer {
    int32_t n_ids;
    const char **tok_str;   /* (n_ids) vocabulary string, or added-token content; NULL for holes */
    uint32_t *tok_len;      /* (n_ids) */
    const char **tok_bytes; /* (n_ids) the bytes an id decodes to */
    uint32_t *bytes_len;    /* (n_ids) */
    uint8_t *tok_flags;     /* (n_ids) TOKEN_ADDED | TOKEN_SPECIAL */
    arena_block *arena;

    uint32_t *vocab_slots; /* open addressing: id + 1, or 0 for empty */
    size_t vocab_mask;

    uint64_t *merge_keys; /* (left id << 32 | right id) + 1, or 0 for empty */
    uint32_t *merge_rank;
    int32_t *merge_result;
    size_t merge_mask;

    int32_t byte_id[256];   /* id of the single-byte token of each byte */
    char byte_char[256][3]; /* the byte-level alphabet: UTF-8 of each byte's stand-in */
    uint8_t byte_char_len[256];
    int16_t char_byte[324]; /* and back: code point -> byte, or -1 */

    added_token *added;
    size_t n_added;
    uint16_t *added_by_byte[256]; /* indices into added, longest first, by first byte */
    uint16_t added_by_byte_n[256];

    int nfc;
    int add_prefix_space;
    int ignore_merges;
    pretok_pattern splits[MAX_SPLITS];
    int n_splits;

    int32_t bos_id, eos_id, pad_id;
    al_chat_template_kind chat_template;

    pthread_mutex_t cache_lock;
    cache_entry **cache_slots;
    size_t cache_mask, cache_count;
};

/* ------------------------------------------------------------------------------------ */
/* Small helpers                                                                        */

static void set_err(char *errstr, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void set_err(char *errstr, size_t errlen, const char *fmt, ...)
{
    if (!errstr || !errlen) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(errstr, errlen, fmt, ap);
    va_end(ap);
}

static uint64_t hash_bytes(const void *p, size_t n)
{
    uint64_t h = al_hash_fnv1a(p, n);
    return h ^ (h >> 29);
}

static uint64_t hash_u64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    return x ^ (x >> 33);
}

static size_t pow2_at_least(size_t n)
{
    size_t p = 16;
    while (p < n)
        p <<= 1;
    return p;
}

/* Copies n bytes plus a NUL into the tokenizer's arena (freed with it); NULL when out of
 * memory. Token strings live here: one allocation per MiB instead of one per token. */
static char *arena_copy(al_tokenizer *t, const void *src, size_t n)
{
    if (!t->arena || t->arena->cap - t->arena->used < n + 1) {
        size_t cap = n + 1 > (1u << 20) ? n + 1 : (1u << 20);
        arena_block *b = malloc(sizeof *b + cap);
        if (!b) return NULL;
        b->next = t->arena;
        b->used = 0;
        b->cap = cap;
        t->arena = b;
    }
    char *r = t->arena->data + t->arena->used;
    memcpy(r, src, n);
    r[n] = 0;
    t->arena->used += n + 1;
    return r;
}

/* Reads a whole file into a malloc'd, NUL-terminated buffer. Returns NULL with errno set. */
static char *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = NULL;
    size_t n = 0, cap = 0;
    for (;;) {
        if (cap - n < 65536) {
            size_t ncap = cap ? cap * 2 : 1 << 20;
            char *nb = realloc(buf, ncap + 1);
            if (!nb) {
                free(buf);
                fclose(f);
                errno = ENOMEM;
                return NULL;
            }
            buf = nb;
            cap = ncap;
        }
        size_t r = fread(buf + n, 1, cap - n, f);
        n += r;
        if (r == 0) break;
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) {
        free(buf);
        errno = EIO;
        return NULL;
    }
    buf[n] = 0;
    *len = n;
    return buf;
}

/* ------------------------------------------------------------------------------------ */
/* Vocabulary and merges                                                                */

static int32_t vocab_find(const al_tokenizer *t, const char *s, size_t n)
{
    if (!t->vocab_slots) return -1;
    size_t i = hash_bytes(s, n) & t->vocab_mask;
    for (;;) {
        uint32_t v = t->vocab_slots[i];
        if (!v) return -1;
        int32_t id = (int32_t)v - 1;
        if (t->tok_len[id] == n && memcmp(t->tok_str[id], s, n) == 0) return id;
        i = (i + 1) & t->vocab_mask;
    }
}

static void vocab_insert(al_tokenizer *t, int32_t id)
{
    size_t i = hash_bytes(t->tok_str[id], t->tok_len[id]) & t->vocab_mask;
    while (t->vocab_slots[i])
        i = (i + 1) & t->vocab_mask;
    t->vocab_slots[i] = (uint32_t)id + 1;
}

static int merge_find(const al_tokenizer *t, int32_t a, int32_t b, uint32_t *rank, int32_t *result)
{
    if (!t->merge_keys) return 0;
    uint64_t key = (((uint64_t)(uint32_t)a << 32) | (uint32_t)b) + 1;
    size_t i = hash_u64(key) & t->merge_mask;
    for (;;) {
        uint64_t k = t->merge_keys[i];
        if (!k) return 0;
        if (k == key) {
            *rank = t->merge_rank[i];
            *result = t->merge_result[i];
            return 1;
        }
        i = (i + 1) & t->merge_mask;
    }
}

/* Inserts a merge unless the pair is there already (the first, lowest rank wins, as in
 * Hugging Face). */
static void merge_insert(al_tokenizer *t, int32_t a, int32_t b, uint32_t rank, int32_t result)
{
    uint64_t key = (((uint64_t)(uint32_t)a << 32) | (uint32_t)b) + 1;
    size_t i = hash_u64(key) & t->merge_mask;
    while (t->merge_keys[i]) {
        if (t->merge_keys[i] == key) return;
        i = (i + 1) & t->merge_mask;
    }
    t->merge_keys[i] = key;
    t->merge_rank[i] = rank;
    t->merge_result[i] = result;
}

/* GPT-2's byte-to-unicode table: printable Latin-1 bytes stand for themselves, the others
 * for U+0100 upwards in byte order. */
static void init_byte_alphabet(al_tokenizer *t)
{
    uint32_t next = 256;
    for (int c = 0; c < 324; c++)
        t->char_byte[c] = -1;
    for (int b = 0; b < 256; b++) {
        int printable =
            (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        uint32_t cp = printable ? (uint32_t)b : next++;
        t->byte_char_len[b] = (uint8_t)al_utf8_encode(cp, (uint8_t *)t->byte_char[b]);
        t->char_byte[cp] = (int16_t)b;
    }
}

/* Maps a byte-level string back to bytes; -1 when a character is outside the alphabet. */
static int byte_level_to_bytes(const al_tokenizer *t, const char *s, size_t n, char *out,
                               size_t *out_len)
{
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        i += al_utf8_decode((const uint8_t *)s + i, n - i, &cp);
        if (cp >= 324 || t->char_byte[cp] < 0) return -1;
        out[o++] = (char)t->char_byte[cp];
    }
    *out_len = o;
    return 0;
}

/* ------------------------------------------------------------------------------------ */
/* Loading                                                                              */

static const char *json_type_name(const al_json *v)
{
    if (!v) return "missing";
    switch (v->type) {
    case AL_JSON_NULL:
        return "null";
    case AL_JSON_FALSE:
    case AL_JSON_TRUE:
        return "a boolean";
    case AL_JSON_NUMBER:
        return "a number";
    case AL_JSON_STRING:
        return "a string";
    case AL_JSON_ARRAY:
        return "an array";
    case AL_JSON_OBJECT:
        return "an object";
    }
    return "?";
}

static int load_normalizer(al_tokenizer *t, const al_json *n, char *errstr, size_t errlen)
{
    if (!n || n->type == AL_JSON_NULL) return 0;
    const char *type = al_json_get_string(n, "type", NULL);
    if (!type) {
        set_err(errstr, errlen, "normalizer has no \"type\"");
        return -1;
    }
    if (strcmp(type, "NFC") == 0) {
        t->nfc = 1;
        return 0;
    }
    if (strcmp(type, "Sequence") == 0) {
        const al_json *list = al_json_get(n, "normalizers");
        if (!list || list->type != AL_JSON_ARRAY) {
            set_err(errstr, errlen, "normalizer Sequence has no \"normalizers\" array");
            return -1;
        }
        for (size_t i = 0; i < list->count; i++)
            if (load_normalizer(t, list->items[i], errstr, errlen)) return -1;
        return 0;
    }
    set_err(errstr, errlen, "normalizer \"%s\" is not supported (only NFC)", type);
    return -1;
}

static int add_split(al_tokenizer *t, pretok_pattern p, char *errstr, size_t errlen)
{
    if (t->n_splits == MAX_SPLITS) {
        set_err(errstr, errlen, "pre_tokenizer: more than %d splitting steps", MAX_SPLITS);
        return -1;
    }
    t->splits[t->n_splits++] = p;
    return 0;
}

static int load_pretokenizer(al_tokenizer *t, const al_json *p, int depth, char *errstr,
                             size_t errlen)
{
    if (!p || p->type == AL_JSON_NULL) return 0;
    const char *type = al_json_get_string(p, "type", NULL);
    if (!type || depth > 4) {
        set_err(errstr, errlen, "pre_tokenizer has no \"type\"");
        return -1;
    }
    if (strcmp(type, "Sequence") == 0) {
        const al_json *list = al_json_get(p, "pretokenizers");
        if (!list || list->type != AL_JSON_ARRAY) {
            set_err(errstr, errlen, "pre_tokenizer Sequence has no \"pretokenizers\" array");
            return -1;
        }
        for (size_t i = 0; i < list->count; i++)
            if (load_pretokenizer(t, list->items[i], depth + 1, errstr, errlen)) return -1;
        return 0;
    }
    if (strcmp(type, "ByteLevel") == 0) {
        if (al_json_get_bool(p, "add_prefix_space", 0)) t->add_prefix_space = 1;
        if (al_json_get_bool(p, "use_regex", 1)) return add_split(t, PATTERN_GPT2, errstr, errlen);
        return 0;
    }
    if (strcmp(type, "Split") == 0) {
        const al_json *pat = al_json_get(p, "pattern");
        const char *regex = pat ? al_json_get_string(pat, "Regex", NULL) : NULL;
        const char *behavior = al_json_get_string(p, "behavior", "");
        if (!regex) {
            set_err(errstr, errlen, "pre_tokenizer Split: only a \"Regex\" pattern is supported");
            return -1;
        }
        if (strcmp(behavior, "Isolated") != 0 || al_json_get_bool(p, "invert", 0)) {
            set_err(errstr, errlen,
                    "pre_tokenizer Split: behavior \"%s\"%s is not supported (only Isolated)",
                    behavior, al_json_get_bool(p, "invert", 0) ? " with invert" : "");
            return -1;
        }
        for (size_t i = 0; i < sizeof known_patterns / sizeof known_patterns[0]; i++)
            if (strcmp(regex, known_patterns[i].regex) == 0)
                return add_split(t, known_patterns[i].kind, errstr, errlen);
        set_err(errstr, errlen,
                "pre_tokenizer Split: regex %.200s is not one of the supported patterns (GPT-2, "
                "Qwen2, Llama-3)",
                regex);
        return -1;
    }
    set_err(errstr, errlen, "pre_tokenizer \"%s\" is not supported (ByteLevel, Split, Sequence)",
            type);
    return -1;
}

static int check_decoder(const al_json *d, char *errstr, size_t errlen)
{
    if (!d || d->type == AL_JSON_NULL) return 0;
    const char *type = al_json_get_string(d, "type", "");
    if (strcmp(type, "ByteLevel") == 0) return 0;
    if (strcmp(type, "Sequence") == 0) {
        const al_json *list = al_json_get(d, "decoders");
        for (size_t i = 0; list && list->type == AL_JSON_ARRAY && i < list->count; i++)
            if (check_decoder(list->items[i], errstr, errlen)) return -1;
        return 0;
    }
    set_err(errstr, errlen, "decoder \"%s\" is not supported (only ByteLevel)", type);
    return -1;
}

/* Grows the id arrays to hold `n` ids. */
static int ensure_ids(al_tokenizer *t, int32_t n)
{
    if (n <= t->n_ids) return 0;
    size_t old = (size_t)t->n_ids, nn = (size_t)n;
    const char **s = realloc(t->tok_str, nn * sizeof *s);
    if (!s) return -1;
    t->tok_str = s;
    uint32_t *l = realloc(t->tok_len, nn * sizeof *l);
    if (!l) return -1;
    t->tok_len = l;
    const char **b = realloc(t->tok_bytes, nn * sizeof *b);
    if (!b) return -1;
    t->tok_bytes = b;
    uint32_t *bl = realloc(t->bytes_len, nn * sizeof *bl);
    if (!bl) return -1;
    t->bytes_len = bl;
    uint8_t *f = realloc(t->tok_flags, nn);
    if (!f) return -1;
    t->tok_flags = f;
    for (size_t i = old; i < nn; i++) {
        t->tok_str[i] = NULL;
        t->tok_len[i] = 0;
        t->tok_bytes[i] = NULL;
        t->bytes_len[i] = 0;
        t->tok_flags[i] = 0;
    }
    t->n_ids = n;
    return 0;
}

/* Fills the id tables from model.vocab (sized to the largest id of the vocabulary and the
 * added tokens) and the string -> id map. Every vocabulary string must be in the byte-level
 * alphabet; its bytes are kept for decoding. -1 with errstr on any bad entry. */
static int load_vocab(al_tokenizer *t, const al_json *vocab, const al_json *added, char *errstr,
                      size_t errlen)
{
    if (!vocab || vocab->type != AL_JSON_OBJECT) {
        set_err(errstr, errlen, "model.vocab is %s, expected an object of token -> id",
                json_type_name(vocab));
        return -1;
    }
    int64_t max_id = -1;
    for (size_t i = 0; i < vocab->count; i++) {
        const al_json *v = vocab->items[i];
        if (v->type != AL_JSON_NUMBER || !v->is_integer || v->integer < 0 ||
            v->integer >= MAX_TOKEN_ID) {
            set_err(errstr, errlen, "model.vocab[\"%.80s\"]: id is not an integer in [0, %d)",
                    vocab->keys[i], MAX_TOKEN_ID);
            return -1;
        }
        if (v->integer > max_id) max_id = v->integer;
    }
    if (added && added->type == AL_JSON_ARRAY) {
        for (size_t i = 0; i < added->count; i++) {
            const al_json *id = al_json_get(added->items[i], "id");
            if (!id || id->type != AL_JSON_NUMBER || !id->is_integer || id->integer < 0 ||
                id->integer >= MAX_TOKEN_ID) {
                set_err(errstr, errlen, "added_tokens[%zu]: \"id\" is not an integer in [0, %d)", i,
                        MAX_TOKEN_ID);
                return -1;
            }
            if (id->integer > max_id) max_id = id->integer;
        }
    }
    if (ensure_ids(t, (int32_t)(max_id + 1))) goto oom;
    size_t total = vocab->count + (added && added->type == AL_JSON_ARRAY ? added->count : 0);
    t->vocab_mask = pow2_at_least(total * 2 + 1) - 1;
    t->vocab_slots = calloc(t->vocab_mask + 1, sizeof *t->vocab_slots);
    if (!t->vocab_slots) goto oom;
    char *tmp = NULL;
    size_t tmp_cap = 0;
    for (size_t i = 0; i < vocab->count; i++) {
        int32_t id = (int32_t)vocab->items[i]->integer;
        const char *s = vocab->keys[i];
        size_t n = vocab->key_lens[i];
        if (t->tok_str[id]) {
            set_err(errstr, errlen, "model.vocab: id %d is used by both \"%.80s\" and \"%.80s\"",
                    id, t->tok_str[id], s);
            free(tmp);
            return -1;
        }
        if (vocab_find(t, s, n) >= 0) {
            set_err(errstr, errlen, "model.vocab: token \"%.80s\" appears twice", s);
            free(tmp);
            return -1;
        }
        if (n > tmp_cap) {
            char *nt = realloc(tmp, n);
            if (!nt) {
                free(tmp);
                goto oom;
            }
            tmp = nt;
            tmp_cap = n;
        }
        size_t blen;
        if (byte_level_to_bytes(t, s, n, tmp, &blen)) {
            set_err(errstr, errlen,
                    "model.vocab: token \"%.80s\" (id %d) has characters outside the byte-level "
                    "alphabet; "
                    "only byte-level BPE is supported",
                    s, id);
            free(tmp);
            return -1;
        }
        t->tok_str[id] = arena_copy(t, s, n);
        t->tok_bytes[id] = arena_copy(t, tmp, blen);
        if (!t->tok_str[id] || !t->tok_bytes[id]) {
            free(tmp);
            goto oom;
        }
        t->tok_len[id] = (uint32_t)n;
        t->bytes_len[id] = (uint32_t)blen;
        vocab_insert(t, id);
    }
    free(tmp);
    return 0;
oom:
    set_err(errstr, errlen, "out of memory loading the vocabulary");
    return -1;
}

/* Registers added_tokens (ids checked by load_vocab) and indexes them by first byte for the
 * leftmost-longest split of the raw text. An added token that is also in the vocabulary
 * must have the same string there. -1 with errstr otherwise. */
static int load_added(al_tokenizer *t, const al_json *added, char *errstr, size_t errlen)
{
    if (!added || added->type == AL_JSON_NULL) return 0;
    if (added->type != AL_JSON_ARRAY) {
        set_err(errstr, errlen, "added_tokens is %s, expected an array", json_type_name(added));
        return -1;
    }
    if (added->count > 65535) {
        set_err(errstr, errlen, "added_tokens: more than 65535 entries");
        return -1;
    }
    t->added = calloc(added->count ? added->count : 1, sizeof *t->added);
    if (!t->added) goto oom;
    for (size_t i = 0; i < added->count; i++) {
        const al_json *a = added->items[i];
        const al_json *content = al_json_get(a, "content");
        if (!content || content->type != AL_JSON_STRING || content->string_len == 0) {
            set_err(errstr, errlen, "added_tokens[%zu]: \"content\" is not a non-empty string", i);
            return -1;
        }
        int32_t id = (int32_t)al_json_get_int(a, "id", -1); /* checked in load_vocab */
        added_token *at = &t->added[t->n_added++];
        at->id = id;
        at->special = al_json_get_bool(a, "special", 0);
        at->lstrip = al_json_get_bool(a, "lstrip", 0);
        at->rstrip = al_json_get_bool(a, "rstrip", 0);
        if (t->tok_str[id]) {
            /* Already in the vocabulary (GPT-2's <|endoftext|>): it must be the same token. */
            if (t->tok_len[id] != content->string_len ||
                memcmp(t->tok_str[id], content->string, content->string_len)) {
                set_err(errstr, errlen,
                        "added_tokens[%zu]: id %d is \"%.80s\" but model.vocab has \"%.80s\" there",
                        i, id, content->string, t->tok_str[id]);
                return -1;
            }
        } else {
            t->tok_str[id] = arena_copy(t, content->string, content->string_len);
            if (!t->tok_str[id]) goto oom;
            t->tok_len[id] = (uint32_t)content->string_len;
            vocab_insert(t, id);
        }
        /* An added token decodes to its content, not to byte-level characters. */
        t->tok_bytes[id] = arena_copy(t, content->string, content->string_len);
        if (!t->tok_bytes[id]) goto oom;
        t->bytes_len[id] = (uint32_t)content->string_len;
        at->content = t->tok_bytes[id];
        at->len = content->string_len;
        t->tok_flags[id] = TOKEN_ADDED | (at->special ? TOKEN_SPECIAL : 0);
    }
    /* Index by first byte, longest first, so that the first hit is the longest match. */
    for (size_t i = 0; i < t->n_added; i++)
        t->added_by_byte_n[(uint8_t)t->added[i].content[0]]++;
    for (int b = 0; b < 256; b++) {
        if (!t->added_by_byte_n[b]) continue;
        t->added_by_byte[b] = malloc(t->added_by_byte_n[b] * sizeof(uint16_t));
        if (!t->added_by_byte[b]) goto oom;
        t->added_by_byte_n[b] = 0;
    }
    for (size_t i = 0; i < t->n_added; i++) {
        uint8_t b = (uint8_t)t->added[i].content[0];
        uint16_t *list = t->added_by_byte[b];
        size_t k = t->added_by_byte_n[b]++;
        while (k > 0 && t->added[list[k - 1]].len < t->added[i].len) {
            list[k] = list[k - 1];
            k--;
        }
        list[k] = (uint16_t)i;
    }
    return 0;
oom:
    set_err(errstr, errlen, "out of memory loading added_tokens");
    return -1;
}

/* Splits a merge entry into its two token strings. */
static int merge_parts(const al_json *m, const char **a, size_t *alen, const char **b, size_t *blen)
{
    if (m->type == AL_JSON_STRING) {
        const char *sp = memchr(m->string, ' ', m->string_len);
        if (!sp || sp == m->string ||
            memchr(sp + 1, ' ', m->string_len - (size_t)(sp + 1 - m->string)))
            return -1;
        *a = m->string;
        *alen = (size_t)(sp - m->string);
        *b = sp + 1;
        *blen = m->string_len - *alen - 1;
        return *blen ? 0 : -1;
    }
    if (m->type == AL_JSON_ARRAY && m->count == 2 && m->items[0]->type == AL_JSON_STRING &&
        m->items[1]->type == AL_JSON_STRING) {
        *a = m->items[0]->string;
        *alen = m->items[0]->string_len;
        *b = m->items[1]->string;
        *blen = m->items[1]->string_len;
        return 0;
    }
    return -1;
}

/* Builds the (left id, right id) -> (rank, merged id) table; rank is the merge's index.
 * Both halves and their concatenation must be in the vocabulary. -1 with errstr. */
static int load_merges(al_tokenizer *t, const al_json *merges, char *errstr, size_t errlen)
{
    if (!merges || merges->type != AL_JSON_ARRAY) {
        set_err(errstr, errlen, "model.merges is %s, expected an array", json_type_name(merges));
        return -1;
    }
    t->merge_mask = pow2_at_least(merges->count * 2 + 1) - 1;
    t->merge_keys = calloc(t->merge_mask + 1, sizeof *t->merge_keys);
    t->merge_rank = malloc((t->merge_mask + 1) * sizeof *t->merge_rank);
    t->merge_result = malloc((t->merge_mask + 1) * sizeof *t->merge_result);
    if (!t->merge_keys || !t->merge_rank || !t->merge_result) {
        set_err(errstr, errlen, "out of memory loading merges");
        return -1;
    }
    char *joined = NULL;
    size_t joined_cap = 0;
    for (size_t i = 0; i < merges->count; i++) {
        const char *a, *b;
        size_t alen, blen;
        if (merge_parts(merges->items[i], &a, &alen, &b, &blen)) {
            set_err(errstr, errlen,
                    "model.merges[%zu]: expected \"left right\" or [\"left\", \"right\"]", i);
            free(joined);
            return -1;
        }
        int32_t ia = vocab_find(t, a, alen), ib = vocab_find(t, b, blen);
        if (ia < 0 || ib < 0) {
            set_err(errstr, errlen, "model.merges[%zu]: token \"%.*s\" is not in the vocabulary", i,
                    (int)(ia < 0 ? (alen > 80 ? 80 : alen) : (blen > 80 ? 80 : blen)),
                    ia < 0 ? a : b);
            free(joined);
            return -1;
        }
        if (alen + blen > joined_cap) {
            joined_cap = (alen + blen) * 2;
            char *nj = realloc(joined, joined_cap);
            if (!nj) {
                free(joined);
                set_err(errstr, errlen, "out of memory loading merges");
                return -1;
            }
            joined = nj;
        }
        memcpy(joined, a, alen);
        memcpy(joined + alen, b, blen);
        int32_t ir = vocab_find(t, joined, alen + blen);
        if (ir < 0) {
            set_err(errstr, errlen,
                    "model.merges[%zu]: the merged token \"%.*s\" is not in the vocabulary", i,
                    (int)(alen + blen > 80 ? 80 : alen + blen), joined);
            free(joined);
            return -1;
        }
        merge_insert(t, ia, ib, (uint32_t)i, ir);
    }
    free(joined);
    return 0;
}

/* Reads everything tokenizer.json holds into t, refusing what it cannot reproduce exactly
 * (other models, byte fallback, dropout, unknown normalizers, pre-tokenizers, decoders). */
static int load_model(al_tokenizer *t, const al_json *root, char *errstr, size_t errlen)
{
    if (!root || root->type != AL_JSON_OBJECT) {
        set_err(errstr, errlen, "the top level is not an object");
        return -1;
    }
    const al_json *model = al_json_get(root, "model");
    if (!model || model->type != AL_JSON_OBJECT) {
        set_err(errstr, errlen, "no \"model\" object");
        return -1;
    }
    const char *type = al_json_get_string(model, "type", "BPE"); /* older files omit it */
    if (strcmp(type, "BPE") != 0) {
        set_err(errstr, errlen, "model.type is \"%s\"; only BPE is supported", type);
        return -1;
    }
    if (al_json_get_bool(model, "byte_fallback", 0)) {
        set_err(errstr, errlen, "model.byte_fallback is set; only byte-level BPE is supported");
        return -1;
    }
    const al_json *dropout = al_json_get(model, "dropout");
    if (dropout && dropout->type == AL_JSON_NUMBER && dropout->number != 0) {
        set_err(errstr, errlen, "model.dropout is set; BPE dropout is not supported");
        return -1;
    }
    const char *prefix = al_json_get_string(model, "continuing_subword_prefix", "");
    const char *suffix = al_json_get_string(model, "end_of_word_suffix", "");
    if (*prefix || *suffix) {
        set_err(errstr, errlen,
                "model.continuing_subword_prefix / end_of_word_suffix are not supported");
        return -1;
    }
    t->ignore_merges = al_json_get_bool(model, "ignore_merges", 0);
    const al_json *added = al_json_get(root, "added_tokens");
    if (load_vocab(t, al_json_get(model, "vocab"), added, errstr, errlen)) return -1;
    if (load_added(t, added, errstr, errlen)) return -1;
    if (load_merges(t, al_json_get(model, "merges"), errstr, errlen)) return -1;
    for (int b = 0; b < 256; b++) {
        t->byte_id[b] = vocab_find(t, t->byte_char[b], t->byte_char_len[b]);
        if (t->byte_id[b] < 0 || (t->tok_flags[t->byte_id[b]] & TOKEN_ADDED)) {
            set_err(
                errstr, errlen,
                "model.vocab has no token for byte 0x%02X (\"%.*s\"); byte-level BPE needs all 256",
                b, t->byte_char_len[b], t->byte_char[b]);
            return -1;
        }
    }
    if (load_normalizer(t, al_json_get(root, "normalizer"), errstr, errlen)) return -1;
    if (load_pretokenizer(t, al_json_get(root, "pre_tokenizer"), 0, errstr, errlen)) return -1;
    return check_decoder(al_json_get(root, "decoder"), errstr, errlen);
}

/* A special token in tokenizer_config.json: a string, or {"content": "..."}. */
static int32_t config_token(const al_tokenizer *t, const al_json *cfg, const char *key)
{
    const al_json *v = al_json_get(cfg, key);
    if (v && v->type == AL_JSON_OBJECT) v = al_json_get(v, "content");
    if (!v || v->type != AL_JSON_STRING) return -1;
    return vocab_find(t, v->string, v->string_len);
}

static al_chat_template_kind template_kind(const char *tpl)
{
    if (!tpl || !strstr(tpl, "<|im_start|>")) return AL_CHAT_TEMPLATE_NONE;
    if (strstr(tpl, "<think>") && strstr(tpl, "last_query_index")) return AL_CHAT_TEMPLATE_QWEN3;
    if (strstr(tpl, "You are Qwen, created by Alibaba Cloud.")) return AL_CHAT_TEMPLATE_QWEN2_5;
    return AL_CHAT_TEMPLATE_CHATML;
}

/* tokenizer_config.json: bos/eos/pad token ids (-1 when unset or not in the vocabulary)
 * and the kind of chat template. Unknown fields are ignored. */
static int load_config(al_tokenizer *t, const char *config, size_t len, char *errstr, size_t errlen)
{
    char jerr[160];
    al_json *cfg = al_json_parse(config, len, jerr, sizeof jerr);
    if (!cfg) {
        set_err(errstr, errlen, "tokenizer_config.json: %s", jerr);
        return -1;
    }
    if (cfg->type != AL_JSON_OBJECT) {
        set_err(errstr, errlen, "tokenizer_config.json: the top level is not an object");
        al_json_free(cfg);
        return -1;
    }
    t->bos_id = config_token(t, cfg, "bos_token");
    t->eos_id = config_token(t, cfg, "eos_token");
    t->pad_id = config_token(t, cfg, "pad_token");
    const al_json *tpl = al_json_get(cfg, "chat_template");
    if (tpl && tpl->type == AL_JSON_STRING) {
        t->chat_template = template_kind(tpl->string);
    } else if (tpl && tpl->type == AL_JSON_ARRAY) {
        /* [{"name": "default", "template": "..."}, {"name": "tool_use", ...}] */
        for (size_t i = 0; i < tpl->count; i++)
            if (strcmp(al_json_get_string(tpl->items[i], "name", ""), "default") == 0)
                t->chat_template =
                    template_kind(al_json_get_string(tpl->items[i], "template", NULL));
    }
    al_json_free(cfg);
    return 0;
}

al_tokenizer *al_tokenizer_from_json(const char *json, size_t len, const char *config,
                                     size_t config_len, char *errstr, size_t errlen)
{
    al_tokenizer *t = calloc(1, sizeof *t);
    if (!t) {
        set_err(errstr, errlen, "out of memory");
        return NULL;
    }
    pthread_mutex_init(&t->cache_lock, NULL);
    t->bos_id = t->eos_id = t->pad_id = -1;
    init_byte_alphabet(t);
    char jerr[160];
    al_json *root = al_json_parse(json, len, jerr, sizeof jerr);
    if (!root) {
        set_err(errstr, errlen, "%s", jerr);
        al_tokenizer_free(t);
        return NULL;
    }
    int rc = load_model(t, root, errstr, errlen);
    al_json_free(root);
    if (rc == 0 && config && load_config(t, config, config_len, errstr, errlen)) rc = -1;
    if (rc) {
        al_tokenizer_free(t);
        return NULL;
    }
    return t;
}

al_tokenizer *al_tokenizer_load(const char *tokenizer_json_path, const char *config_path,
                                char *errstr, size_t errlen)
{
    size_t len = 0, clen = 0;
    char *json = read_file(tokenizer_json_path, &len);
    if (!json) {
        set_err(errstr, errlen, "%s: %s", tokenizer_json_path, strerror(errno));
        return NULL;
    }
    char *cfg = NULL;
    if (config_path) {
        cfg = read_file(config_path, &clen);
        if (!cfg) {
            set_err(errstr, errlen, "%s: %s", config_path, strerror(errno));
            free(json);
            return NULL;
        }
    }
    char err[256];
    al_tokenizer *t = al_tokenizer_from_json(json, len, cfg, clen, err, sizeof err);
    if (!t) {
        static const char cfg_prefix[] = "tokenizer_config.json: ";
        if (strncmp(err, cfg_prefix, sizeof cfg_prefix - 1) == 0)
            set_err(errstr, errlen, "%s: %s", config_path, err + sizeof cfg_prefix - 1);
        else
            set_err(errstr, errlen, "%s: %s", tokenizer_json_path, err);
    }
    free(json);
    free(cfg);
    return t;
}

al_tokenizer *al_tokenizer_load_dir(const char *dir, char *errstr, size_t errlen)
{
    size_t n = strlen(dir) + 32;
    char *tj = malloc(n), *tc = malloc(n);
    if (!tj || !tc) {
        free(tj);
        free(tc);
        set_err(errstr, errlen, "out of memory");
        return NULL;
    }
    snprintf(tj, n, "%s/tokenizer.json", dir);
    snprintf(tc, n, "%s/tokenizer_config.json", dir);
    FILE *f = fopen(tc, "rb");
    if (f) fclose(f);
    al_tokenizer *t = al_tokenizer_load(tj, f ? tc : NULL, errstr, errlen);
    free(tj);
    free(tc);
    return t;
}

static void cache_clear(al_tokenizer *t)
{
    if (!t->cache_slots) return;
    for (size_t i = 0; i <= t->cache_mask; i++) {
        cache_entry *e = t->cache_slots[i];
        while (e) {
            cache_entry *nx = e->next;
            free(e);
            e = nx;
        }
        t->cache_slots[i] = NULL;
    }
    t->cache_count = 0;
}

void al_tokenizer_free(al_tokenizer *t)
{
    if (!t) return;
    cache_clear(t);
    free(t->cache_slots);
    pthread_mutex_destroy(&t->cache_lock);
    while (t->arena) {
        arena_block *nx = t->arena->next;
        free(t->arena);
        t->arena = nx;
    }
    free(t->tok_str);
    free(t->tok_len);
    free(t->tok_bytes);
    free(t->bytes_len);
    free(t->tok_flags);
    free(t->vocab_slots);
    free(t->merge_keys);
    free(t->merge_rank);
    free(t->merge_result);
    free(t->added);
    for (int b = 0; b < 256; b++)
        free(t->added_by_byte[b]);
    free(t);
}

/* ------------------------------------------------------------------------------------ */
/* Accessors                                                                            */

int32_t al_tokenizer_vocab_size(const al_tokenizer *t)
{
    return t->n_ids;
}

int32_t al_tokenizer_token_to_id(const al_tokenizer *t, const char *token, size_t len)
{
    return vocab_find(t, token, len);
}

const char *al_tokenizer_id_to_token(const al_tokenizer *t, int32_t id)
{
    return (id >= 0 && id < t->n_ids) ? t->tok_str[id] : NULL;
}

const char *al_tokenizer_id_bytes(const al_tokenizer *t, int32_t id, size_t *len)
{
    if (id < 0 || id >= t->n_ids || !t->tok_bytes[id]) return NULL;
    *len = t->bytes_len[id];
    return t->tok_bytes[id];
}

int al_tokenizer_id_is_special(const al_tokenizer *t, int32_t id)
{
    return id >= 0 && id < t->n_ids && (t->tok_flags[id] & TOKEN_SPECIAL);
}

int32_t al_tokenizer_bos_id(const al_tokenizer *t)
{
    return t->bos_id;
}
int32_t al_tokenizer_eos_id(const al_tokenizer *t)
{
    return t->eos_id;
}
int32_t al_tokenizer_pad_id(const al_tokenizer *t)
{
    return t->pad_id;
}
al_chat_template_kind al_tokenizer_chat_template(const al_tokenizer *t)
{
    return t->chat_template;
}

void al_token_ids_free(al_token_ids *v)
{
    free(v->ids);
    v->ids = NULL;
    v->len = v->cap = 0;
}

static int ids_push(al_token_ids *v, int32_t id)
{
    if (v->len == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 64;
        int32_t *n = realloc(v->ids, cap * sizeof *n);
        if (!n) return -1;
        v->ids = n;
        v->cap = cap;
    }
    v->ids[v->len++] = id;
    return 0;
}

/* ------------------------------------------------------------------------------------ */
/* Pre-tokenization: the regexes, matched by hand                                       */

typedef struct cpbuf {
    uint32_t *cp;  /* code points (AL_UNICODE_BAD_BYTE | b for a malformed byte) */
    uint8_t *cls;  /* their classes */
    uint32_t *off; /* byte offset of each, plus one past the end */
    size_t n, cap;
} cpbuf;

/* Decodes s into code points with their classes and byte offsets (reusing b's arrays). */
static int cpbuf_fill(cpbuf *b, const uint8_t *s, size_t len)
{
    if (len + 1 > b->cap) {
        size_t cap = len + 1;
        uint32_t *cp = realloc(b->cp, cap * sizeof *cp);
        if (!cp) return -1;
        b->cp = cp;
        uint8_t *cls = realloc(b->cls, cap);
        if (!cls) return -1;
        b->cls = cls;
        uint32_t *off = realloc(b->off, cap * sizeof *off);
        if (!off) return -1;
        b->off = off;
        b->cap = cap;
    }
    size_t n = 0;
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        size_t k = s[i] < 0x80 ? (cp = s[i], 1) : al_utf8_decode(s + i, len - i, &cp);
        b->cp[n] = cp;
        b->cls[n] = (uint8_t)al_unicode_class(cp);
        b->off[n] = (uint32_t)i;
        n++;
        i += k;
    }
    b->off[n] = (uint32_t)len;
    b->n = n;
    return 0;
}

static void cpbuf_free(cpbuf *b)
{
    free(b->cp);
    free(b->cls);
    free(b->off);
}

#define IS_L(k) (b->cls[k] & AL_UNICODE_LETTER)
#define IS_N(k) (b->cls[k] & AL_UNICODE_NUMBER)
#define IS_S(k) (b->cls[k] & AL_UNICODE_SPACE)
#define IS_OTHER(k) (b->cls[k] == 0)
#define IS_NL(k) (b->cp[k] == '\r' || b->cp[k] == '\n')

/* Length (in code points) of the contraction at k ('s 't 're 've 'm 'll 'd), or 0. */
static size_t match_contraction(const cpbuf *b, size_t k, int fold)
{
    if (b->cp[k] != '\'' || k + 1 >= b->n) return 0;
    uint32_t c = b->cp[k + 1];
    if (fold) {
        if (c >= 'A' && c <= 'Z') c += 32;
        if (c == 0x17F) c = 's'; /* LATIN SMALL LETTER LONG S folds to s */
    }
    if (c == 's' || c == 't' || c == 'm' || c == 'd') return 2;
    if (k + 2 >= b->n) return 0;
    uint32_t c2 = b->cp[k + 2];
    if (fold && c2 >= 'A' && c2 <= 'Z') c2 += 32;
    if ((c == 'r' || c == 'v') && c2 == 'e') return 3;
    if (c == 'l' && c2 == 'l') return 3;
    return 0;
}

/* Length of the regex match at k (always >= 1: the patterns cover every character). */
static size_t match_at(const cpbuf *b, size_t k, pretok_pattern p)
{
    size_t n = b->n, j;
    size_t m = match_contraction(b, k, p != PATTERN_GPT2);
    if (m) return m;
    if (p == PATTERN_GPT2) {
        /* ' ?\p{L}+' | ' ?\p{N}+' */
        j = (b->cp[k] == ' ' && k + 1 < n) ? k + 1 : k;
        if (IS_L(j)) {
            while (j < n && IS_L(j))
                j++;
            return j - k;
        }
        if (IS_N(j)) {
            while (j < n && IS_N(j))
                j++;
            return j - k;
        }
    } else {
        /* '[^\r\n\p{L}\p{N}]?\p{L}+' */
        j = k;
        if (!IS_NL(k) && !IS_L(k) && !IS_N(k) && k + 1 < n && IS_L(k + 1)) j = k + 1;
        if (IS_L(j)) {
            while (j < n && IS_L(j))
                j++;
            return j - k;
        }
        /* '\p{N}' or '\p{N}{1,3}' */
        if (IS_N(k)) {
            size_t max = p == PATTERN_LLAMA3 ? 3 : 1;
            j = k;
            while (j < n && j - k < max && IS_N(j))
                j++;
            return j - k;
        }
    }
    /* ' ?[^\s\p{L}\p{N}]+' and, Qwen/Llama, '[\r\n]*' */
    j = (b->cp[k] == ' ' && k + 1 < n && IS_OTHER(k + 1)) ? k + 1 : k;
    if (IS_OTHER(j)) {
        while (j < n && IS_OTHER(j))
            j++;
        if (p != PATTERN_GPT2)
            while (j < n && IS_NL(j))
                j++;
        return j - k;
    }
    /* whitespace */
    size_t e = k;
    while (e < n && IS_S(e))
        e++;
    if (e == k) return 1; /* not reached: every character is a letter, number, space or other */
    if (p != PATTERN_GPT2) {
        /* '\s*[\r\n]+': up to the last line break of the run */
        size_t last = e;
        for (size_t x = k; x < e; x++)
            if (IS_NL(x)) last = x;
        if (last != e) return last + 1 - k;
    }
    /* '\s+(?!\S)' then '\s+' */
    if (e == n) return e - k;
    if (e - k >= 2) return e - 1 - k;
    return e - k;
}

/* ------------------------------------------------------------------------------------ */
/* BPE                                                                                  */

typedef struct sym {
    int32_t id;
    int32_t prev, next; /* -1 at the ends */
    int alive;
} sym;

typedef struct heap_item {
    uint32_t rank;
    int32_t pos;
    int32_t left_id, right_id;
} heap_item;

typedef struct bpe_work {
    sym *syms;
    heap_item *heap;
    size_t cap, heap_n, heap_cap;
    char *scratch; /* byte-level form of a word, for ignore_merges */
    size_t scratch_cap;
} bpe_work;

static int heap_less(const heap_item *a, const heap_item *b)
{
    return a->rank < b->rank || (a->rank == b->rank && a->pos < b->pos);
}

static int heap_push(bpe_work *w, heap_item it)
{
    if (w->heap_n == w->heap_cap) {
        size_t cap = w->heap_cap ? w->heap_cap * 2 : 64;
        heap_item *h = realloc(w->heap, cap * sizeof *h);
        if (!h) return -1;
        w->heap = h;
        w->heap_cap = cap;
    }
    size_t i = w->heap_n++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!heap_less(&it, &w->heap[p])) break;
        w->heap[i] = w->heap[p];
        i = p;
    }
    w->heap[i] = it;
    return 0;
}

static heap_item heap_pop(bpe_work *w)
{
    heap_item top = w->heap[0], last = w->heap[--w->heap_n];
    size_t i = 0, n = w->heap_n;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && heap_less(&w->heap[c + 1], &w->heap[c])) c++;
        if (!heap_less(&w->heap[c], &last)) break;
        w->heap[i] = w->heap[c];
        i = c;
    }
    if (n) w->heap[i] = last;
    return top;
}

static int push_pair(const al_tokenizer *t, bpe_work *w, int32_t left)
{
    int32_t right = w->syms[left].next;
    if (right < 0) return 0;
    uint32_t rank;
    int32_t result;
    if (!merge_find(t, w->syms[left].id, w->syms[right].id, &rank, &result)) return 0;
    heap_item it = {rank, left, w->syms[left].id, w->syms[right].id};
    return heap_push(w, it);
}

/* Encodes one pre-tokenized word (raw bytes) by merging byte symbols, lowest rank first. */
static int bpe_word(const al_tokenizer *t, bpe_work *w, const uint8_t *s, size_t n,
                    al_token_ids *out)
{
    if (t->ignore_merges) {
        size_t need = n * 2;
        if (need > w->scratch_cap) {
            char *sc = realloc(w->scratch, need);
            if (!sc) return -1;
            w->scratch = sc;
            w->scratch_cap = need;
        }
        size_t len = 0;
        for (size_t i = 0; i < n; i++) {
            memcpy(w->scratch + len, t->byte_char[s[i]], t->byte_char_len[s[i]]);
            len += t->byte_char_len[s[i]];
        }
        int32_t id = vocab_find(t, w->scratch, len);
        if (id >= 0 && !(t->tok_flags[id] & TOKEN_ADDED)) return ids_push(out, id);
    }
    if (n == 1) return ids_push(out, t->byte_id[s[0]]);
    if (n > w->cap) {
        sym *sy = realloc(w->syms, n * sizeof *sy);
        if (!sy) return -1;
        w->syms = sy;
        w->cap = n;
    }
    for (size_t i = 0; i < n; i++) {
        w->syms[i].id = t->byte_id[s[i]];
        w->syms[i].prev = (int32_t)i - 1;
        w->syms[i].next = i + 1 < n ? (int32_t)i + 1 : -1;
        w->syms[i].alive = 1;
    }
    w->heap_n = 0;
    for (size_t i = 0; i + 1 < n; i++)
        if (push_pair(t, w, (int32_t)i)) return -1;
    while (w->heap_n) {
        heap_item it = heap_pop(w);
        sym *l = &w->syms[it.pos];
        if (!l->alive || l->id != it.left_id || l->next < 0) continue;
        sym *r = &w->syms[l->next];
        if (r->id != it.right_id) continue;
        uint32_t rank;
        int32_t result = -1;
        if (!merge_find(t, l->id, r->id, &rank, &result))
            continue; /* cannot happen: it was pushed */
        l->id = result;
        r->alive = 0;
        l->next = r->next;
        if (r->next >= 0) w->syms[r->next].prev = it.pos;
        if (l->prev >= 0 && push_pair(t, w, l->prev)) return -1;
        if (push_pair(t, w, it.pos)) return -1;
    }
    for (int32_t i = 0; i >= 0; i = w->syms[i].next)
        if (ids_push(out, w->syms[i].id)) return -1;
    return 0;
}

/* Encodes a word through the cache. */
static int encode_word(const al_tokenizer *tc, bpe_work *w, const uint8_t *s, size_t n,
                       al_token_ids *out)
{
    al_tokenizer *t = (al_tokenizer *)tc; /* the cache is the only mutable part */
    if (n > CACHE_MAX_WORD) return bpe_word(t, w, s, n, out);
    uint64_t h = hash_bytes(s, n);
    pthread_mutex_lock(&t->cache_lock);
    if (t->cache_slots) {
        for (cache_entry *e = t->cache_slots[h & t->cache_mask]; e; e = e->next) {
            if (e->hash != h || e->word_len != n || memcmp(e->word, s, n)) continue;
            for (uint32_t i = 0; i < e->n_ids; i++)
                if (ids_push(out, e->ids[i])) {
                    pthread_mutex_unlock(&t->cache_lock);
                    return -1;
                }
            pthread_mutex_unlock(&t->cache_lock);
            return 0;
        }
    }
    pthread_mutex_unlock(&t->cache_lock);
    size_t start = out->len;
    if (bpe_word(t, w, s, n, out)) return -1;
    size_t nid = out->len - start;
    size_t off =
        (sizeof(cache_entry) + n + sizeof(int32_t) - 1) / sizeof(int32_t) * sizeof(int32_t);
    cache_entry *e = malloc(off + nid * sizeof(int32_t));
    if (!e) return 0; /* the cache is an optimization: no memory, no entry */
    e->hash = h;
    e->word_len = (uint32_t)n;
    e->n_ids = (uint32_t)nid;
    memcpy(e->word, s, n);
    e->ids = (int32_t *)((char *)e + off);
    memcpy(e->ids, out->ids + start, nid * sizeof(int32_t));
    pthread_mutex_lock(&t->cache_lock);
    if (!t->cache_slots) {
        t->cache_mask = CACHE_MAX_ENTRIES - 1;
        t->cache_slots = calloc(CACHE_MAX_ENTRIES, sizeof *t->cache_slots);
    }
    if (t->cache_slots) {
        if (t->cache_count >= CACHE_MAX_ENTRIES) cache_clear(t);
        size_t slot = h & t->cache_mask;
        e->next = t->cache_slots[slot];
        t->cache_slots[slot] = e;
        t->cache_count++;
        e = NULL;
    }
    pthread_mutex_unlock(&t->cache_lock);
    free(e);
    return 0;
}

typedef struct span {
    size_t a, b;
} span;

typedef struct encode_ctx {
    cpbuf cps;
    bpe_work work;
    span *spans, *next_spans;
    size_t spans_cap, next_cap;
} encode_ctx;

static int spans_reserve(span **s, size_t *cap, size_t n)
{
    if (n <= *cap) return 0;
    size_t c = *cap ? *cap : 64;
    while (c < n)
        c *= 2;
    span *ns = realloc(*s, c * sizeof *ns);
    if (!ns) return -1;
    *s = ns;
    *cap = c;
    return 0;
}

/* Splits a segment with each pre-tokenizer pattern in turn; the pieces (byte ranges of s)
 * end up in c->spans. Returns their number, or -1 when memory ran out. */
static long split_segment(const al_tokenizer *t, encode_ctx *c, const uint8_t *s, size_t len)
{
    if (len == 0) return 0;
    if (spans_reserve(&c->spans, &c->spans_cap, 1)) return -1;
    c->spans[0] = (span){0, len};
    size_t nspans = 1;
    for (int step = 0; step < t->n_splits; step++) {
        size_t nn = 0;
        for (size_t i = 0; i < nspans; i++) {
            span sp = c->spans[i];
            if (cpbuf_fill(&c->cps, s + sp.a, sp.b - sp.a)) return -1;
            const cpbuf *b = &c->cps;
            for (size_t k = 0; k < b->n;) {
                size_t m = match_at(b, k, t->splits[step]);
                if (spans_reserve(&c->next_spans, &c->next_cap, nn + 1)) return -1;
                c->next_spans[nn++] = (span){sp.a + b->off[k], sp.a + b->off[k + m]};
                k += m;
            }
        }
        span *tmp = c->spans;
        size_t tcap = c->spans_cap;
        c->spans = c->next_spans;
        c->spans_cap = c->next_cap;
        c->next_spans = tmp;
        c->next_cap = tcap;
        nspans = nn;
    }
    return (long)nspans;
}

/* Pre-tokenizes and encodes one normalized segment (no added tokens inside). */
static int encode_segment(const al_tokenizer *t, encode_ctx *c, const uint8_t *s, size_t len,
                          al_token_ids *out)
{
    long nspans = split_segment(t, c, s, len);
    if (nspans < 0) return -1;
    for (long i = 0; i < nspans; i++)
        if (encode_word(t, &c->work, s + c->spans[i].a, c->spans[i].b - c->spans[i].a, out))
            return -1;
    return 0;
}

static void encode_ctx_free(encode_ctx *c)
{
    cpbuf_free(&c->cps);
    free(c->work.syms);
    free(c->work.heap);
    free(c->work.scratch);
    free(c->spans);
    free(c->next_spans);
}

int al_tokenizer_pretokenize(const al_tokenizer *t, const char *text, size_t len,
                             void (*fn)(void *ctx, size_t start, size_t end), void *ctx)
{
    encode_ctx c;
    memset(&c, 0, sizeof c);
    long n = split_segment(t, &c, (const uint8_t *)text, len);
    for (long i = 0; i < n; i++)
        fn(ctx, c.spans[i].a, c.spans[i].b);
    encode_ctx_free(&c);
    return n < 0 ? -1 : 0;
}

/* Normalizes (NFC), adds the prefix space when asked, and encodes a text segment. */
static int encode_text(const al_tokenizer *t, encode_ctx *c, const char *s, size_t len,
                       al_token_ids *out)
{
    if (len == 0) return 0;
    char *norm = NULL;
    size_t nlen = len;
    if (t->nfc) {
        int r = al_unicode_nfc(s, len, &norm, &nlen);
        if (r < 0) return -1;
        if (r == 1)
            s = norm;
        else
            nlen = len;
    }
    int rc;
    if (t->add_prefix_space && s[0] != ' ') {
        char *p = malloc(nlen + 1);
        if (!p) {
            free(norm);
            return -1;
        }
        p[0] = ' ';
        memcpy(p + 1, s, nlen);
        rc = encode_segment(t, c, (const uint8_t *)p, nlen + 1, out);
        free(p);
    } else {
        rc = encode_segment(t, c, (const uint8_t *)s, nlen, out);
    }
    free(norm);
    return rc;
}

/* The added token that starts at text[i] (longest first), or NULL. */
static const added_token *added_at(const al_tokenizer *t, const char *text, size_t len, size_t i,
                                   unsigned flags)
{
    uint8_t b = (uint8_t)text[i];
    for (size_t k = 0; k < t->added_by_byte_n[b]; k++) {
        const added_token *a = &t->added[t->added_by_byte[b][k]];
        if (a->special && !(flags & AL_TOKENIZER_ALLOW_SPECIAL)) continue;
        if (a->len <= len - i && memcmp(text + i, a->content, a->len) == 0) return a;
    }
    return NULL;
}

/* Length of the White_Space character that ends at text[end] (exclusive), or 0. */
static size_t space_before(const char *text, size_t start, size_t end)
{
    size_t i = end;
    while (i > start && end - i < 4) {
        i--;
        if (((uint8_t)text[i] & 0xC0) != 0x80) break; /* found the lead byte */
    }
    if (i == end) return 0;
    uint32_t cp;
    size_t n = al_utf8_decode((const uint8_t *)text + i, end - i, &cp);
    return (i + n == end && (al_unicode_class(cp) & AL_UNICODE_SPACE)) ? n : 0;
}

/* Length of the White_Space character that starts at text[i], or 0. */
static size_t space_after(const char *text, size_t len, size_t i)
{
    uint32_t cp;
    size_t n = al_utf8_decode((const uint8_t *)text + i, len - i, &cp);
    return (al_unicode_class(cp) & AL_UNICODE_SPACE) ? n : 0;
}

int al_tokenizer_encode(const al_tokenizer *t, const char *text, size_t len, unsigned flags,
                        al_token_ids *out)
{
    encode_ctx c;
    memset(&c, 0, sizeof c);
    int rc = 0;
    size_t seg = 0; /* start of the text not yet encoded */
    for (size_t i = 0; i < len && rc == 0;) {
        const added_token *a = t->n_added ? added_at(t, text, len, i, flags) : NULL;
        if (!a) {
            i++;
            continue;
        }
        size_t end = i, k;
        if (a->lstrip)
            while ((k = space_before(text, seg, end)) > 0)
                end -= k;
        rc = encode_text(t, &c, text + seg, end - seg, out);
        if (rc == 0) rc = ids_push(out, a->id);
        i += a->len;
        if (a->rstrip)
            while (i < len && (k = space_after(text, len, i)) > 0)
                i += k;
        seg = i;
    }
    if (rc == 0) rc = encode_text(t, &c, text + seg, len - seg, out);
    encode_ctx_free(&c);
    return rc;
}

/* ------------------------------------------------------------------------------------ */
/* Decoding                                                                             */

/* Length of the maximal prefix of an ill-formed sequence at s (what one U+FFFD replaces,
 * as Rust's from_utf8_lossy counts it). */
static size_t bad_sequence_len(const uint8_t *s, size_t len)
{
    uint8_t b0 = s[0];
    size_t need = 0;
    uint8_t lo = 0x80, hi = 0xBF;
    if (b0 >= 0xC2 && b0 <= 0xDF) {
        need = 2;
    } else if (b0 >= 0xE0 && b0 <= 0xEF) {
        need = 3;
        if (b0 == 0xE0) lo = 0xA0;
        if (b0 == 0xED) hi = 0x9F;
    } else if (b0 >= 0xF0 && b0 <= 0xF4) {
        need = 4;
        if (b0 == 0xF0) lo = 0x90;
        if (b0 == 0xF4) hi = 0x8F;
    } else {
        return 1;
    }
    size_t k = 1;
    if (k < len && k < need && s[k] >= lo && s[k] <= hi)
        k++;
    else
        return 1;
    while (k < len && k < need && (s[k] & 0xC0) == 0x80)
        k++;
    return k;
}

/* Appends s, replacing ill-formed sequences with U+FFFD. */
static void append_lossy(al_buf *o, const uint8_t *s, size_t len)
{
    size_t run = 0;
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        size_t k = al_utf8_decode(s + i, len - i, &cp);
        if (!(cp & AL_UNICODE_BAD_BYTE)) {
            i += k;
            continue;
        }
        al_buf_append(o, (const char *)s + run, i - run);
        al_buf_append(o, "\xEF\xBF\xBD", 3);
        i += bad_sequence_len(s + i, len - i);
        run = i;
    }
    al_buf_append(o, (const char *)s + run, len - run);
}

int al_tokenizer_decode(const al_tokenizer *t, const int32_t *ids, size_t n, unsigned flags,
                        char **out, size_t *out_len)
{
    al_buf raw = {0};
    al_buf_append(&raw, "", 0);
    for (size_t i = 0; i < n; i++) {
        int32_t id = ids[i];
        if (id < 0 || id >= t->n_ids || !t->tok_bytes[id]) continue;
        if ((flags & AL_TOKENIZER_SKIP_SPECIAL) && (t->tok_flags[id] & TOKEN_SPECIAL)) continue;
        al_buf_append(&raw, t->tok_bytes[id], t->bytes_len[id]);
    }
    if (raw.oom) {
        free(raw.data);
        return -1;
    }
    if (flags & AL_TOKENIZER_LOSSY) {
        al_buf l = {0};
        al_buf_append(&l, "", 0);
        append_lossy(&l, (const uint8_t *)raw.data, raw.len);
        free(raw.data);
        if (l.oom) {
            free(l.data);
            return -1;
        }
        raw = l;
    }
    *out = raw.data;
    *out_len = raw.len;
    return 0;
}

static int stream_reserve(al_tokenizer_stream *s, size_t extra)
{
    if (s->len + extra + 1 <= s->cap) return 0;
    size_t cap = s->cap ? s->cap : 256;
    while (cap < s->len + extra + 1)
        cap *= 2;
    char *b = realloc(s->buf, cap);
    if (!b) return -1;
    s->buf = b;
    s->cap = cap;
    return 0;
}

/* Emits whole characters of pending + bytes; keeps an unfinished, still-valid tail. */
static int stream_feed(al_tokenizer_stream *s, const uint8_t *bytes, size_t n)
{
    size_t total = s->npending + n;
    uint8_t small[64];
    uint8_t *data = total <= sizeof small ? small : malloc(total);
    if (!data) return -1;
    memcpy(data, s->pending, s->npending);
    memcpy(data + s->npending, bytes, n);
    size_t keep = total - al_utf8_complete_prefix(data, total);
    size_t emit = total - keep;
    al_buf tmp = {0};
    append_lossy(&tmp, data, emit);
    int rc = 0;
    if (tmp.oom || stream_reserve(s, tmp.len)) {
        rc = -1;
    } else {
        memcpy(s->buf + s->len, tmp.data, tmp.len);
        s->len += tmp.len;
        s->buf[s->len] = 0;
        memcpy(s->pending, data + emit, keep);
        s->npending = keep;
    }
    free(tmp.data);
    if (data != small) free(data);
    return rc;
}

const char *al_tokenizer_stream_push(const al_tokenizer *t, al_tokenizer_stream *s, int32_t id,
                                     unsigned flags, size_t *len)
{
    s->len = 0;
    if (stream_reserve(s, 0)) return NULL;
    s->buf[0] = 0;
    if (id >= 0 && id < t->n_ids && t->tok_bytes[id] &&
        !((flags & AL_TOKENIZER_SKIP_SPECIAL) && (t->tok_flags[id] & TOKEN_SPECIAL))) {
        if (stream_feed(s, (const uint8_t *)t->tok_bytes[id], t->bytes_len[id])) return NULL;
    }
    *len = s->len;
    return s->buf;
}

const char *al_tokenizer_stream_flush(al_tokenizer_stream *s, size_t *len)
{
    s->len = 0;
    if (stream_reserve(s, 3)) return NULL;
    if (s->npending) {
        memcpy(s->buf, "\xEF\xBF\xBD", 3);
        s->len = 3;
        s->npending = 0;
    }
    s->buf[s->len] = 0;
    *len = s->len;
    return s->buf;
}

void al_tokenizer_stream_free(al_tokenizer_stream *s)
{
    free(s->buf);
    memset(s, 0, sizeof *s);
}
