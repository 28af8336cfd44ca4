/*
 * tokenizer.h: byte-level BPE as Hugging Face's tokenizer.json describes it (GPT-2, Qwen2/3,
 * Llama-3 style), and the ChatML chat template of Qwen2.5 / Qwen3 for the serve stage.
 *
 * What is read from tokenizer.json:
 *   - model: type "BPE" with vocab and merges ("a b" strings or ["a", "b"] pairs),
 *     ignore_merges; byte_fallback, dropout and a continuing_subword_prefix are refused;
 *   - normalizer: null or NFC (also inside a Sequence); anything else is refused;
 *   - pre_tokenizer: ByteLevel (use_regex: the GPT-2 pattern; add_prefix_space), Split
 *     with one of the known patterns (GPT-2, Qwen2, Llama-3/cl100k), or a Sequence of
 *     those. The patterns are matched by hand-written code, not a regex engine; another
 *     pattern is refused with its text in the error;
 *   - added_tokens (id, content, special, lstrip, rstrip; single_word and normalized are
 *     ignored: every added token is matched on the raw text, before NFC); decoder ByteLevel.
 * tokenizer_config.json gives bos/eos/pad tokens and the chat template, of which only the
 * kind is kept (see al_chat_template_kind).
 *
 * A loaded tokenizer is immutable apart from its word cache (guarded by a mutex), so one
 * instance serves any number of threads.
 */
#ifndef ARCLIGHT_TEXT_TOKENIZER_H
#define ARCLIGHT_TEXT_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

typedef struct al_tokenizer al_tokenizer;

/* Which chat template tokenizer_config.json carries, recognized by its text. */
typedef enum al_chat_template_kind {
    AL_CHAT_TEMPLATE_NONE = 0, /* no template, or one that is not ChatML */
    AL_CHAT_TEMPLATE_CHATML,   /* ChatML without a default system prompt (Qwen2.5 shape) */
    AL_CHAT_TEMPLATE_QWEN2_5,  /* Qwen2.5's: default system prompt, <tools>, <tool_call> */
    AL_CHAT_TEMPLATE_QWEN3,    /* Qwen3's: no default system prompt, <think> handling */
} al_chat_template_kind;

/* Loads DIR/tokenizer.json and, when present, DIR/tokenizer_config.json. Returns NULL with
 * the reason in errstr (file, and what is wrong in it). The caller owns the result. */
al_tokenizer *al_tokenizer_load_dir(const char *dir, char *errstr, size_t errlen);
/* Same from two paths; config_path may be NULL. */
al_tokenizer *al_tokenizer_load(const char *tokenizer_json_path, const char *config_path,
                                char *errstr, size_t errlen);
/* Same from bytes in memory (config may be NULL). The inputs are not kept. */
al_tokenizer *al_tokenizer_from_json(const char *json, size_t len, const char *config,
                                     size_t config_len, char *errstr, size_t errlen);
void al_tokenizer_free(al_tokenizer *tok);

/* Ids run from 0 to al_tokenizer_vocab_size() - 1 (added tokens included). */
int32_t al_tokenizer_vocab_size(const al_tokenizer *tok);
/* Id of a token by its vocabulary string (byte-level alphabet, e.g. "Ġthe") or its added
 * token content ("<|im_end|>"); -1 when there is none. */
int32_t al_tokenizer_token_to_id(const al_tokenizer *tok, const char *token, size_t len);
/* Vocabulary string of an id (NUL-terminated, owned by the tokenizer), or NULL. */
const char *al_tokenizer_id_to_token(const al_tokenizer *tok, int32_t id);
/* The bytes an id decodes to (owned by the tokenizer); NULL for an unknown id. */
const char *al_tokenizer_id_bytes(const al_tokenizer *tok, int32_t id, size_t *len);
/* 1 when the id is an added token marked special (e.g. <|im_end|>). */
int al_tokenizer_id_is_special(const al_tokenizer *tok, int32_t id);
/* From tokenizer_config.json (a string or {"content": ...}); -1 when unset or no config. */
int32_t al_tokenizer_bos_id(const al_tokenizer *tok);
int32_t al_tokenizer_eos_id(const al_tokenizer *tok);
int32_t al_tokenizer_pad_id(const al_tokenizer *tok);
al_chat_template_kind al_tokenizer_chat_template(const al_tokenizer *tok);

/* A growing array of token ids. Zero-initialize; release with al_token_ids_free. */
typedef struct al_token_ids {
    int32_t *ids;
    size_t len, cap;
} al_token_ids;
void al_token_ids_free(al_token_ids *v);

enum {
    /* encode: special added tokens in the text become their ids; without it they are
     * tokenized as ordinary text (what a server does with user content). Non-special
     * added tokens are always recognized, as in Hugging Face. */
    AL_TOKENIZER_ALLOW_SPECIAL = 1u << 0,
    /* decode: leave special tokens out of the text. */
    AL_TOKENIZER_SKIP_SPECIAL = 1u << 1,
    /* decode: replace bytes that are not well-formed UTF-8 with U+FFFD, as Hugging Face's
     * decoder does; without it the raw bytes come back. */
    AL_TOKENIZER_LOSSY = 1u << 2,
};

/* Appends the ids of len bytes of text to *out. Any bytes are accepted (malformed UTF-8
 * is encoded byte by byte). Returns 0, or -1 when memory ran out (*out then holds a
 * prefix). */
int al_tokenizer_encode(const al_tokenizer *tok, const char *text, size_t len, unsigned flags,
                        al_token_ids *out);

/* The pre-tokenizer's split of len bytes of text alone (no added tokens, no NFC, no
 * prefix space): fn gets each piece's byte range [start, end), in order. For tests and
 * inspection. Returns 0, or -1 when memory ran out. */
int al_tokenizer_pretokenize(const al_tokenizer *tok, const char *text, size_t len,
                             void (*fn)(void *ctx, size_t start, size_t end), void *ctx);

/* Decodes n ids into a malloc'd, NUL-terminated string (*out, *out_len bytes). Unknown
 * ids are skipped. Returns 0, or -1 when memory ran out. */
int al_tokenizer_decode(const al_tokenizer *tok, const int32_t *ids, size_t n, unsigned flags,
                        char **out, size_t *out_len);

/* Streaming decode: push one id at a time and get back only whole characters; the bytes
 * of a character split across tokens are held until it completes. Zero-initialize,
 * release with al_tokenizer_stream_free. */
typedef struct al_tokenizer_stream {
    char *buf; /* the text to emit; owned by the stream */
    size_t len, cap;
    uint8_t pending[4]; /* the unfinished start of a UTF-8 sequence */
    size_t npending;
} al_tokenizer_stream;
/* Returns the text that id completes (valid until the next call; *len may be 0), or NULL
 * when memory ran out. Flags as for decode (SKIP_SPECIAL; bytes that can never become a
 * character always come out as U+FFFD). */
const char *al_tokenizer_stream_push(const al_tokenizer *tok, al_tokenizer_stream *s, int32_t id,
                                     unsigned flags, size_t *len);
/* Ends the stream: a held, unfinished sequence comes out as U+FFFD. */
const char *al_tokenizer_stream_flush(al_tokenizer_stream *s, size_t *len);
void al_tokenizer_stream_free(al_tokenizer_stream *s);

/* ------------------------------------------------------------------------------------ */
/* Chat: ChatML rendering as Qwen2.5's / Qwen3's Jinja templates do it, and parsing of   */
/* <tool_call> blocks out of generated text. See tokenizer_chat.c for the subset of the  */
/* templates reproduced.                                                                 */

typedef enum al_chat_role {
    AL_CHAT_SYSTEM,
    AL_CHAT_USER,
    AL_CHAT_ASSISTANT,
    AL_CHAT_TOOL,
} al_chat_role;

typedef struct al_chat_tool_call {
    const char *name;
    const char *arguments; /* JSON text of the arguments (OpenAI's "arguments" string) */
} al_chat_tool_call;

typedef struct al_chat_message {
    al_chat_role role;
    const char *content;           /* NULL renders as "" */
    const char *reasoning_content; /* Qwen3 only; NULL when absent */
    /* Bytes of content and reasoning_content, for text that holds NUL bytes (a token's text
     * may be one); 0: strlen. */
    size_t content_len, reasoning_len;
    const al_chat_tool_call *tool_calls;
    size_t n_tool_calls;
} al_chat_message;

typedef struct al_chat_request {
    const al_chat_message *messages;
    size_t n_messages;
    const char *const *tools; /* JSON text of each OpenAI "tools" entry; rendered in order */
    size_t n_tools;
    int add_generation_prompt;
    int enable_thinking; /* Qwen3: 0 appends an empty <think></think> to the generation
                            prompt; anything else leaves thinking on (the default) */
} al_chat_request;

/* "none", "chatml", "qwen2.5" or "qwen3". */
const char *al_chat_template_name(al_chat_template_kind kind);

/* Renders a conversation to the prompt text. Returns a malloc'd NUL-terminated string
 * (owned by the caller) and its length in *out_len, or NULL with the reason in errstr
 * (no messages, an unknown role, a template kind that cannot render, no memory). */
char *al_chat_render(al_chat_template_kind kind, const al_chat_request *req, size_t *out_len,
                     char *errstr, size_t errlen);

/* Renders with the tokenizer's own template and appends the prompt's ids to *out, special
 * tokens recognized (as vLLM and transformers do: a special token's text inside a message
 * becomes that token too). Returns 0, or -1 with the reason in errstr. */
int al_chat_encode(const al_tokenizer *tok, const al_chat_request *req, al_token_ids *out,
                   char *errstr, size_t errlen);

/* A tool call found in generated text. */
typedef struct al_chat_parsed_call {
    char *name;
    char *arguments; /* JSON text, serialized as Python's json.dumps does (what vLLM sends) */
} al_chat_parsed_call;

typedef struct al_chat_parsed {
    char *content; /* the text outside <tool_call> blocks (and <think>), never NULL */
    size_t content_len;
    char *reasoning; /* the text of a leading <think>...</think> when asked for; or NULL */
    al_chat_parsed_call *calls;
    size_t n_calls;
} al_chat_parsed;

enum {
    /* parse: take a leading "<think>...</think>" (or text up to "</think>") out of the
     * content into `reasoning`, as vLLM's qwen3 reasoning parser does; an opened but
     * never closed <think> (generation stopped while thinking) is all reasoning. */
    AL_CHAT_PARSE_REASONING = 1u << 0,
};

/* Splits generated text into content and tool calls. A block whose JSON is malformed or
 * lacks a string "name" stays in the content as text. An unterminated <tool_call> at the
 * end (generation stopped) is parsed when its JSON is complete. Returns 0, or -1 when
 * memory ran out. Release with al_chat_parsed_free. */
int al_chat_parse(const char *text, size_t len, unsigned flags, al_chat_parsed *out);
void al_chat_parsed_free(al_chat_parsed *p);

/* Streaming form of al_chat_parse for server-sent events: push generated text as it comes
 * and get back what can be shown now, as content or (with AL_CHAT_PARSE_REASONING, when the
 * output opens with <think>) as reasoning. Text that may be the start of a tag is held
 * back; from the first <tool_call> on everything is held, and al_chat_stream_finish parses
 * it into tool calls. Zero-initialize and set `flags`; release with al_chat_stream_free. */
typedef struct al_chat_stream {
    unsigned flags;             /* AL_CHAT_PARSE_REASONING or 0 */
    int phase;                  /* internal: 0 start, 1 reasoning, 2 content, 3 tool calls */
    struct al_buf *held;   /* internal: text not yet released */
    struct al_buf *out[2]; /* internal: the last push's content and reasoning */
} al_chat_stream;

typedef struct al_chat_delta {
    const char *content; /* valid until the next push; never NULL */
    size_t content_len;
    const char *reasoning;
    size_t reasoning_len;
} al_chat_delta;

/* Returns 0 and the releasable text in *delta, or -1 when memory ran out. */
int al_chat_stream_push(al_chat_stream *s, const char *text, size_t len, al_chat_delta *delta);
/* Ends the stream: *out gets the tool calls and whatever content or reasoning was still
 * held (what was released before is not repeated). Returns 0, or -1 when memory ran out.
 * Release *out with al_chat_parsed_free. */
int al_chat_stream_finish(al_chat_stream *s, al_chat_parsed *out);
void al_chat_stream_free(al_chat_stream *s);

/* Appends the JSON text `json` re-serialized the way Python's json.dumps (and the
 * templates' tojson) writes it: ", " and ": " separators, non-ASCII kept. Returns 0, or
 * -1 when json is not valid JSON. Exposed for the serve stage and the tests. */
struct al_buf;
int al_chat_json_pyformat(const char *json, size_t len, struct al_buf *out);

#endif
