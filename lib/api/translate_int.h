/*
 * translate_int.h: what translate.c (the shared part: reading chat completions, building the
 * answer item by item) shares with responses.c and messages.c (each API's request
 * translation, events and answer object). Not for the rest of the proxy: see translate.h.
 *
 * Layers, top down: translate.c dispatches through one xl_ops table per API (responses.c,
 * messages.c); both build on common.c (errors, SSE framing, content text). No lower file
 * calls up.
 */
#ifndef ARCLIGHT_API_TRANSLATE_INT_H
#define ARCLIGHT_API_TRANSLATE_INT_H

#include "translate.h"

enum { XK_NONE = 0, XK_TEXT, XK_REASONING, XK_TOOL };

/* One tool call of the answer, by the upstream's index. */
typedef struct xl_ops xl_ops;

typedef struct xl_tool {
    int chat_index; /* the upstream's tool_calls[].index */
    int out_index;  /* responses: output_index; messages: content block index */
    char item_id[96];
    char *call_id; /* the upstream's id, or one made up */
    char *name;
    al_buf args;
    int closed;   /* its item is finished: later pieces only add to args */
    json_t *item; /* responses: the finished item in x->output (borrowed), once closed */
} xl_tool;

struct al_xl {
    const xl_ops *ops; /* the agent's API */
    json_t *req;  /* the agent's request as it sent it */
    json_t *conv; /* responses: the conversation without the instructions (chat messages) */
    char id[96], seed[64];
    int64_t created;
    int stream, store;
    int count_only;      /* messages: count_tokens */
    int lp_want, lp_top; /* responses: include message.output_text.logprobs, top_logprobs */
    char *model;         /* the agent's model */
    char *up_model;      /* the model the upstream named */
    /* the answer as it builds */
    int started, ended;
    int64_t seq; /* responses: the next sequence_number */
    int nout;    /* output items (responses) or content blocks (messages) started */
    int open;    /* XK_* of the open item; XK_TOOL: open_tool */
    int open_index;
    size_t open_tool;
    char open_id[96];
    al_buf text, reasoning; /* the open text or reasoning item's text */
    json_t *text_lps;        /* responses: the open text's logprobs */
    xl_tool *tools;
    size_t ntools, tools_cap;
    json_t *output; /* finished items / blocks, in order */
    char *finish;   /* the upstream's finish_reason */
    char *stop_str; /* vLLM's stop_reason when it is a string: the stop sequence hit */
    int64_t in_tok, out_tok, cached_tok, reasoning_tok;
    int have_usage;
    int64_t prompt_ids; /* prompt_token_ids seen in the stream: the input's size */
    json_t *final;
    json_t *final_members; /* merged into final when it is made (al_xl_set_final_members) */
};

/* One API's half of the translation: its request, its events and answer object, its errors.
 * translate.c owns the call's state and the reading of chat completions and calls these. */
struct xl_ops {
    const char *id_prefix;   /* the answer's id: PREFIX_seed */
    const char *tool_prefix; /* a tool call's item id: PREFIX_seed_N */
    int empty_message;       /* an answer with no item still gets one (an empty text) */
    /* The agent's request (x->req, an object) into *chat; 0, or -1 with *err filled. */
    int (*request)(al_xl *x, const al_xl_env *env, json_t **chat, al_xl_err *err);
    /* Events: the stream's opening; an item opening, a piece of it (lps: the piece's chat
     * logprobs, or NULL), its closing (the item is then appended to x->output); the end
     * (error NULL: success; sets x->final). emit 0: build, send nothing. 0, or -1 (memory). */
    int (*open_stream)(al_xl *x, al_buf *out);
    int (*item_open)(al_xl *x, al_buf *out, int emit);
    int (*piece)(al_xl *x, const char *s, size_t n, json_t *lps, al_buf *out, int emit);
    int (*item_close)(al_xl *x, al_buf *out, int emit);
    int (*end)(al_xl *x, const char *error, al_buf *out, int emit);
    /* The conversation a later call continues (al_xl_conversation), or NULL; the member
     * itself NULL: the API keeps no conversations (nothing is stored). */
    json_t *(*conversation)(const al_xl *x);
    /* An error body in the API's terms (al_xl_error_body). */
    char *(*error_body)(int status, const char *type, const char *code, const char *message);
};

extern const xl_ops xl_responses_ops; /* responses.c */
extern const xl_ops xl_messages_ops;  /* messages.c */

/* common.c: what both APIs build with. */

/* Formats into e (status, type, code, param, message). Returns -1 for `return` chains. */
int xl_fail(al_xl_err *e, int status, const char *type, const char *code, const char *param,
            const char *fmt, ...) __attribute__((format(printf, 6, 7)));

/* Appends "event: TYPE\ndata: JSON\n\n" (takes the reference to o). 0 or -1. */
int xl_sse(al_buf *out, const char *type, json_t *o);

/* A text of the agent's: the string itself, or the concatenated "text" of an array of
 * parts whose type is one of types (NULL-terminated); NULL for anything else. Malloc'd. */
char *xl_text_of(json_t *content, const char *const *types);
/* Arguments text as a JSON object (a new reference); {} when they are not one. */
json_t *xl_args_object(const char *args);

#endif
