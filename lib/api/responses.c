/*
 * responses.c: the OpenAI Responses API (POST /v1/responses) over chat completions. Owns
 * the request's translation (instructions, input items: messages, function and custom
 * tool calls and their outputs, reasoning items; function and custom tools, tool_choice,
 * text.format, sampling; previous_response_id from the proxy's store), the Response object
 * and the streaming events: response.created, response.in_progress,
 * response.output_item.added/.done, response.content_part.added/.done,
 * response.output_text.delta/.done, response.reasoning_text.delta/.done,
 * response.function_call_arguments.delta/.done, response.custom_tool_call_input.done, and
 * response.completed, response.incomplete or response.failed, each with its
 * sequence_number.
 *
 * Hosted tools (web_search, file_search, code_interpreter, computer use, MCP, ...) run on
 * OpenAI's servers, not on a model server: they are left out of the model's tools. A
 * reasoning item's text travels back in its content (and, when the agent asks for
 * reasoning.encrypted_content, in that field with a marker), since store: false agents
 * send the items back themselves.
 */
#include "translate_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ENC_MARK "arclight-reasoning:" /* encrypted_content of our own reasoning items */

static const char *const TEXT_PARTS[] = {"input_text", "output_text", "text", NULL};

/* Whether the agent asked for this in "include". */
static int included(const al_xl *x, const char *what)
{
    json_t *inc = json_object_get(x->req, "include"), *v;
    size_t i;
    json_array_foreach(inc, i,
                       v) if (json_is_string(v) && !strcmp(json_string_value(v), what)) return 1;
    return 0;
}

#define NS_SEP "." /* between a namespace and its tool's name, for the model */

/* The declared tool the model calls by full name (a namespace's: "namespace.name"), with
 * *ns its namespace (NULL: none), or NULL. */
static json_t *declared_tool(const al_xl *x, const char *full, const char **ns)
{
    json_t *tools = json_object_get(x->req, "tools"), *t, *u;
    size_t i, k;
    *ns = NULL;
    if (!full) return NULL;
    json_array_foreach(tools, i, t)
    {
        const char *ty = json_string_value(json_object_get(t, "type"));
        const char *n = json_string_value(json_object_get(t, "name"));
        if (!ty || !n) continue;
        if (strcmp(ty, "namespace")) {
            if (!strcmp(n, full)) return t;
            continue;
        }
        size_t nl = strlen(n);
        if (strncmp(full, n, nl) || strncmp(full + nl, NS_SEP, strlen(NS_SEP))) continue;
        const char *rest = full + nl + strlen(NS_SEP);
        json_array_foreach(json_object_get(t, "tools"), k, u)
        {
            const char *un = json_string_value(json_object_get(u, "name"));
            if (un && !strcmp(un, rest)) {
                *ns = n;
                return u;
            }
        }
    }
    return NULL;
}

/* Whether the tool the model calls by this name was declared a custom (freeform) tool. */
static int is_custom(const al_xl *x, const char *name)
{
    const char *ns;
    json_t *t = declared_tool(x, name, &ns);
    const char *ty = json_string_value(json_object_get(t, "type"));
    return ty && !strcmp(ty, "custom");
}

/* A call's item gets the tool's own name, and its namespace when it has one. */
static void name_item(const al_xl *x, json_t *item, const char *full)
{
    const char *ns;
    json_t *t = declared_tool(x, full, &ns);
    if (!t || !ns) return;
    json_object_set(item, "name", json_object_get(t, "name"));
    json_object_set_new(item, "namespace", json_string(ns));
}

/* ------------------------------------------------------------------------------------------
 * The request
 * ------------------------------------------------------------------------------------------ */

/* The last message of conv when it is an assistant's (to take more of the same turn). */
static json_t *open_assistant(json_t *conv)
{
    size_t n = json_array_size(conv);
    json_t *m = n ? json_array_get(conv, n - 1) : NULL;
    const char *role = json_string_value(json_object_get(m, "role"));
    return role && !strcmp(role, "assistant") ? m : NULL;
}

static json_t *new_assistant(json_t *conv)
{
    json_t *m = json_pack("{s:s,s:n}", "role", "assistant", "content");
    if (m && json_array_append_new(conv, m) == 0) return m;
    return NULL;
}

/* A message's content for chat: a string when it is all text, else parts (text and
 * image_url). NULL with err on a part this proxy cannot serve. */
static json_t *message_content(json_t *content, size_t i, al_xl_err *err)
{
    if (json_is_string(content)) return json_incref(content);
    if (!json_is_array(content)) {
        xl_fail(err, 400, "invalid_request_error", "invalid_value", "input",
                "input[%zu].content must be a string or an array of content parts", i);
        return NULL;
    }
    char *text = xl_text_of(content, TEXT_PARTS);
    if (text) {
        json_t *s = json_string(text);
        free(text);
        return s;
    }
    json_t *parts = json_array(), *p;
    size_t k;
    json_array_foreach(content, k, p)
    {
        const char *ty = json_string_value(json_object_get(p, "type"));
        json_t *tx = json_object_get(p, "text");
        json_t *q = NULL;
        if (ty &&
            (!strcmp(ty, "input_text") || !strcmp(ty, "output_text") || !strcmp(ty, "text")) &&
            json_is_string(tx)) {
            q = json_pack("{s:s,s:O}", "type", "text", "text", tx);
        } else if (ty && !strcmp(ty, "refusal") && json_is_string(json_object_get(p, "refusal"))) {
            q = json_pack("{s:s,s:O}", "type", "text", "text", json_object_get(p, "refusal"));
        } else if (ty && !strcmp(ty, "input_image") &&
                   json_is_string(json_object_get(p, "image_url"))) {
            const char *detail = json_string_value(json_object_get(p, "detail"));
            q = json_pack("{s:s,s:{s:O,s:s}}", "type", "image_url", "image_url", "url",
                          json_object_get(p, "image_url"), "detail", detail ? detail : "auto");
        } else {
            json_decref(parts);
            xl_fail(err, 400, "invalid_request_error", "unsupported_value", "input",
                    "input[%zu].content[%zu]: content of type '%s' is not supported by this "
                    "proxy (text, refusal and input_image with an image_url are)",
                    i, k, ty ? ty : "(none)");
            return NULL;
        }
        json_array_append_new(parts, q);
    }
    return parts;
}

/* A reasoning item's text: its content, else its summary, else our own encrypted_content. */
static char *reasoning_text(json_t *it)
{
    static const char *const rt[] = {"reasoning_text", "text", NULL};
    static const char *const st[] = {"summary_text", NULL};
    json_t *c = json_object_get(it, "content");
    char *t = json_array_size(c) ? xl_text_of(c, rt) : NULL;
    if (t && *t) return t;
    free(t);
    t = xl_text_of(json_object_get(it, "summary"), st);
    if (t && *t) return t;
    free(t);
    const char *e = json_string_value(json_object_get(it, "encrypted_content"));
    if (e && !strncmp(e, ENC_MARK, strlen(ENC_MARK))) return strdup(e + strlen(ENC_MARK));
    return NULL;
}

/* A call item's tool name as the model knows it: "namespace.name" in a namespace. */
static char *model_name(json_t *it)
{
    const char *name = json_string_value(json_object_get(it, "name"));
    const char *ns = json_string_value(json_object_get(it, "namespace"));
    if (!name) return NULL;
    size_t nl = strlen(name), sl = ns ? strlen(ns) + strlen(NS_SEP) : 0;
    char *r = malloc(nl + sl + 1);
    if (!r) return NULL;
    snprintf(r, nl + sl + 1, "%s%s%s", ns ? ns : "", ns ? NS_SEP : "", name);
    return r;
}

static int tool_call_append(json_t *asst, const char *call_id, const char *name, json_t *args)
{
    json_t *tcs = json_object_get(asst, "tool_calls");
    if (!json_is_array(tcs)) {
        tcs = json_array();
        if (json_object_set_new(asst, "tool_calls", tcs)) return -1;
    }
    return json_array_append_new(tcs, json_pack("{s:s,s:s,s:{s:s,s:O}}", "id", call_id, "type",
                                                "function", "function", "name", name, "arguments",
                                                args));
}

static int add_item(json_t *conv, json_t *it, size_t i, al_xl_err *err)
{
    if (!json_is_object(it))
        return xl_fail(err, 400, "invalid_request_error", "invalid_type", "input",
                       "input[%zu] must be an object", i);
    const char *type = json_string_value(json_object_get(it, "type"));
    const char *role = json_string_value(json_object_get(it, "role"));
    if (!type && role) type = "message";
    if (!type)
        return xl_fail(err, 400, "invalid_request_error", "missing_required_parameter", "input",
                       "input[%zu] has neither a type nor a role", i);
    if (!strcmp(type, "message")) {
        if (!role || (strcmp(role, "user") && strcmp(role, "assistant") && strcmp(role, "system") &&
                      strcmp(role, "developer")))
            return xl_fail(err, 400, "invalid_request_error", "invalid_value", "input",
                           "input[%zu].role must be user, assistant, system or developer", i);
        json_t *content = message_content(json_object_get(it, "content"), i, err);
        if (!content) return -1;
        json_t *m;
        if (!strcmp(role, "assistant") && (m = open_assistant(conv)) &&
            json_is_null(json_object_get(m, "content")) && !json_object_get(m, "tool_calls"))
            return json_object_set_new(m, "content", content); /* after its reasoning */
        const char *r = !strcmp(role, "developer") ? "system" : role;
        return json_array_append_new(conv, json_pack("{s:s,s:o}", "role", r, "content", content));
    }
    if (!strcmp(type, "function_call") || !strcmp(type, "custom_tool_call")) {
        int custom = type[0] == 'c';
        const char *call_id = json_string_value(json_object_get(it, "call_id"));
        json_t *a = json_object_get(it, custom ? "input" : "arguments");
        char *name = model_name(it);
        if (!call_id || !name || !json_is_string(a)) {
            free(name);
            return xl_fail(err, 400, "invalid_request_error", "missing_required_parameter", "input",
                           "input[%zu] (%s) needs call_id, name and %s", i, type,
                           custom ? "input" : "arguments");
        }
        json_t *args = custom ? json_pack("{s:O}", "input", a) : json_incref(a);
        if (custom && args) {
            char *s = json_dumps(args, JSON_COMPACT);
            json_decref(args);
            args = s ? json_string(s) : NULL;
            free(s);
        }
        json_t *asst = open_assistant(conv);
        if (!asst) asst = new_assistant(conv);
        int rc = args && asst ? tool_call_append(asst, call_id, name, args) : -1;
        json_decref(args);
        free(name);
        return rc ? xl_fail(err, 500, "server_error", "out_of_memory", NULL, "out of memory") : 0;
    }
    if (!strcmp(type, "function_call_output") || !strcmp(type, "custom_tool_call_output")) {
        const char *call_id = json_string_value(json_object_get(it, "call_id"));
        char *out = xl_text_of(json_object_get(it, "output"), TEXT_PARTS);
        if (!call_id || !out) {
            free(out);
            return xl_fail(err, 400, "invalid_request_error", "missing_required_parameter", "input",
                           "input[%zu] (%s) needs call_id and an output (a string or text parts)",
                           i, type);
        }
        int rc = json_array_append_new(conv, json_pack("{s:s,s:s,s:s}", "role", "tool",
                                                       "tool_call_id", call_id, "content", out));
        free(out);
        return rc;
    }
    if (!strcmp(type, "reasoning")) {
        char *t = reasoning_text(it);
        if (!t) return 0; /* nothing readable (another server's encrypted reasoning) */
        json_t *asst = open_assistant(conv);
        if (!asst || !json_is_null(json_object_get(asst, "content")) ||
            json_object_get(asst, "tool_calls"))
            asst = new_assistant(conv);
        const char *old = json_string_value(json_object_get(asst, "reasoning_content"));
        int rc = -1;
        if (asst && old) {
            size_t ol = strlen(old), tl = strlen(t);
            char *cat = malloc(ol + tl + 2);
            if (cat) {
                memcpy(cat, old, ol);
                cat[ol] = '\n';
                memcpy(cat + ol + 1, t, tl + 1);
                rc = json_object_set_new(asst, "reasoning_content", json_string(cat));
                free(cat);
            }
        } else if (asst) {
            rc = json_object_set_new(asst, "reasoning_content", json_string(t));
        }
        free(t);
        return rc ? xl_fail(err, 500, "server_error", "out_of_memory", NULL, "out of memory") : 0;
    }
    if (!strcmp(type, "item_reference"))
        return xl_fail(err, 400, "invalid_request_error", "unsupported_value", "input",
                       "input[%zu]: item_reference is not supported by this proxy; send the "
                       "item itself",
                       i);
    return xl_fail(err, 400, "invalid_request_error", "unsupported_value", "input",
                   "input[%zu]: items of type '%s' are not supported by this proxy (messages, "
                   "function and custom tool calls and their outputs, and reasoning are)",
                   i, type);
}

/* The agent's tools as chat tools, appended to out. A namespace's tools are named
 * "namespace.name" for the model (NS_SEP), and split again in its calls. */
static int chat_tools(json_t *tools, const char *ns, json_t *out, al_xl_err *err)
{
    json_t *t;
    size_t i;
    json_array_foreach(tools, i, t)
    {
        const char *ty = json_string_value(json_object_get(t, "type"));
        const char *name = json_string_value(json_object_get(t, "name"));
        json_t *desc = json_object_get(t, "description");
        if (ty && !strcmp(ty, "namespace") && name && !ns &&
            json_is_array(json_object_get(t, "tools"))) {
            if (chat_tools(json_object_get(t, "tools"), name, out, err)) return -1;
            continue;
        }
        if (!ty || (strcmp(ty, "function") && strcmp(ty, "custom")))
            continue; /* a hosted tool: it runs on OpenAI's servers, not here */
        if (!name)
            return xl_fail(err, 400, "invalid_request_error", "missing_required_parameter", "tools",
                           "tools[%zu].name is required", i);
        char full[300];
        snprintf(full, sizeof full, "%s%s%s", ns ? ns : "", ns ? NS_SEP : "", name);
        json_t *fn = json_pack("{s:s}", "name", full);
        if (!fn) return xl_fail(err, 500, "server_error", "out_of_memory", NULL, "out of memory");
        if (json_is_string(desc)) json_object_set(fn, "description", desc);
        if (!strcmp(ty, "function")) {
            json_t *params = json_object_get(t, "parameters");
            json_object_set_new(fn, "parameters",
                                json_is_object(params)
                                    ? json_incref(params)
                                    : json_pack("{s:s,s:{}}", "type", "object", "properties"));
            json_t *strict = json_object_get(t, "strict");
            if (json_is_boolean(strict)) json_object_set(fn, "strict", strict);
        } else {
            /* a freeform tool: its text travels as the one string argument "input" */
            json_object_set_new(fn, "parameters",
                                json_pack("{s:s,s:{s:{s:s}},s:[s]}", "type", "object", "properties",
                                          "input", "type", "string", "required", "input"));
        }
        json_array_append_new(out, json_pack("{s:s,s:o}", "type", "function", "function", fn));
    }
    return 0;
}

static json_t *chat_tool_choice(json_t *tc)
{
    if (json_is_string(tc)) return json_incref(tc);
    const char *ty = json_string_value(json_object_get(tc, "type"));
    const char *name = json_string_value(json_object_get(tc, "name"));
    if (ty && (!strcmp(ty, "function") || !strcmp(ty, "custom")) && name)
        return json_pack("{s:s,s:{s:s}}", "type", "function", "function", "name", name);
    const char *mode = json_string_value(json_object_get(tc, "mode"));
    if (ty && !strcmp(ty, "allowed_tools") && mode) return json_string(mode);
    return NULL;
}

static int check_type(json_t *r, const char *k, int (*ok)(const json_t *), const char *what,
                      al_xl_err *err)
{
    json_t *v = json_object_get(r, k);
    if (v && !json_is_null(v) && !ok(v))
        return xl_fail(err, 400, "invalid_request_error", "invalid_type", k, "%s must be %s", k,
                       what);
    return 0;
}

static int is_string(const json_t *v)
{
    return json_is_string(v);
}
static int is_number(const json_t *v)
{
    return json_is_number(v);
}
static int is_integer(const json_t *v)
{
    return json_is_integer(v);
}
static int is_boolean(const json_t *v)
{
    return json_is_boolean(v);
}
static int is_array(const json_t *v)
{
    return json_is_array(v);
}
static int is_object(const json_t *v)
{
    return json_is_object(v);
}

static int responses_request(al_xl *x, const al_xl_env *env, json_t **chat, al_xl_err *err)
{
    json_t *r = x->req;
    if (check_type(r, "model", is_string, "a string", err) ||
        check_type(r, "instructions", is_string, "a string", err) ||
        check_type(r, "previous_response_id", is_string, "a string", err) ||
        check_type(r, "stream", is_boolean, "a boolean", err) ||
        check_type(r, "store", is_boolean, "a boolean", err) ||
        check_type(r, "temperature", is_number, "a number", err) ||
        check_type(r, "top_p", is_number, "a number", err) ||
        check_type(r, "max_output_tokens", is_integer, "an integer", err) ||
        check_type(r, "top_logprobs", is_integer, "an integer", err) ||
        check_type(r, "parallel_tool_calls", is_boolean, "a boolean", err) ||
        check_type(r, "tools", is_array, "an array", err) ||
        check_type(r, "include", is_array, "an array", err) ||
        check_type(r, "text", is_object, "an object", err))
        return -1;
    if (json_is_true(json_object_get(r, "background")))
        return xl_fail(err, 400, "invalid_request_error", "unsupported_value", "background",
                       "background responses are not supported by this proxy");
    json_t *cv = json_object_get(r, "conversation");
    if (cv && !json_is_null(cv))
        return xl_fail(err, 400, "invalid_request_error", "unsupported_value", "conversation",
                       "conversations are not supported by this proxy; send the conversation "
                       "in input (or use previous_response_id)");
    const char *model = json_string_value(json_object_get(r, "model"));
    if (!model)
        return xl_fail(err, 400, "invalid_request_error", "missing_required_parameter", "model",
                       "Missing required parameter: 'model'.");
    if (!(x->model = strdup(model)))
        return xl_fail(err, 500, "server_error", "out_of_memory", NULL, "out of memory");
    x->stream = json_is_true(json_object_get(r, "stream"));
    x->store = !json_is_false(json_object_get(r, "store"));
    x->lp_want = included(x, "message.output_text.logprobs");
    json_t *tl = json_object_get(r, "top_logprobs");
    x->lp_top = json_is_integer(tl) ? (int)json_integer_value(tl) : 0;
    if (x->lp_top < 0 || x->lp_top > 20)
        return xl_fail(err, 400, "invalid_request_error", "invalid_value", "top_logprobs",
                       "top_logprobs must be from 0 to 20");

    const char *prev = json_string_value(json_object_get(r, "previous_response_id"));
    if (prev) {
        json_t *stored = env && env->lookup ? env->lookup(env->lookup_ud, prev) : NULL;
        if (!stored && !(env && env->lookup))
            return xl_fail(err, 400, "invalid_request_error", "unsupported_value",
                           "previous_response_id",
                           "previous_response_id is not supported: this proxy keeps no "
                           "responses (--response-store-mib 0); send the whole conversation "
                           "in input");
        if (!stored)
            return xl_fail(err, 400, "invalid_request_error", "previous_response_not_found",
                           "previous_response_id",
                           "Previous response with id '%.200s' not found (this proxy keeps a "
                           "bounded number of responses, in memory, since its start).",
                           prev);
        x->conv = json_copy(stored); /* its messages are shared, never changed: see below */
        json_decref(stored);
        /* the last stored message may take more of its turn: give it a copy of its own */
        size_t n = json_array_size(x->conv);
        if (n) json_array_set_new(x->conv, n - 1, json_deep_copy(json_array_get(x->conv, n - 1)));
    } else {
        x->conv = json_array();
    }
    if (!x->conv) return xl_fail(err, 500, "server_error", "out_of_memory", NULL, "out of memory");
    json_t *input = json_object_get(r, "input");
    if (json_is_string(input)) {
        json_array_append_new(x->conv, json_pack("{s:s,s:O}", "role", "user", "content", input));
    } else if (json_is_array(input)) {
        size_t i;
        json_t *it;
        json_array_foreach(input, i, it) if (add_item(x->conv, it, i, err)) return -1;
    } else if (input && !json_is_null(input)) {
        return xl_fail(err, 400, "invalid_request_error", "invalid_type", "input",
                       "input must be a string or an array of items");
    }
    if (!json_array_size(x->conv))
        return xl_fail(err, 400, "invalid_request_error", "missing_required_parameter", "input",
                       "Missing required parameter: 'input'.");

    json_t *c = *chat = json_pack("{s:s}", "model", model);
    json_t *msgs = json_array();
    if (!c || !msgs || json_object_set_new(c, "messages", msgs)) {
        json_decref(msgs);
        return xl_fail(err, 500, "server_error", "out_of_memory", NULL, "out of memory");
    }
    json_t *ins = json_object_get(r, "instructions");
    if (json_is_string(ins))
        json_array_append_new(msgs, json_pack("{s:s,s:O}", "role", "system", "content", ins));
    json_array_extend(msgs, x->conv);
    json_t *tools = json_object_get(r, "tools");
    if (json_array_size(tools)) {
        json_t *ct = json_array();
        if (!ct || chat_tools(tools, NULL, ct, err)) {
            json_decref(ct);
            return -1;
        }
        if (json_array_size(ct)) {
            json_object_set_new(c, "tools", ct);
            json_t *tc = chat_tool_choice(json_object_get(r, "tool_choice"));
            if (tc) json_object_set_new(c, "tool_choice", tc);
            json_t *ptc = json_object_get(r, "parallel_tool_calls");
            if (json_is_boolean(ptc)) json_object_set(c, "parallel_tool_calls", ptc);
        } else {
            json_decref(ct);
        }
    }
    static const char *const same[] = {"temperature", "top_p", NULL};
    for (size_t i = 0; same[i]; i++) {
        json_t *v = json_object_get(r, same[i]);
        if (json_is_number(v)) json_object_set(c, same[i], v);
    }
    json_t *mot = json_object_get(r, "max_output_tokens");
    if (json_is_integer(mot)) json_object_set(c, "max_tokens", mot);
    json_t *fmt = json_object_get(json_object_get(r, "text"), "format");
    const char *fty = json_string_value(json_object_get(fmt, "type"));
    if (fty && !strcmp(fty, "json_schema")) {
        json_t *js = json_object();
        static const char *const keys[] = {"name", "schema", "strict", "description", NULL};
        for (size_t i = 0; keys[i]; i++)
            if (json_object_get(fmt, keys[i]))
                json_object_set(js, keys[i], json_object_get(fmt, keys[i]));
        json_object_set_new(c, "response_format",
                            json_pack("{s:s,s:o}", "type", "json_schema", "json_schema", js));
    } else if (fty && !strcmp(fty, "json_object")) {
        json_object_set_new(c, "response_format", json_pack("{s:s}", "type", "json_object"));
    }
    if (x->lp_want) {
        json_object_set_new(c, "logprobs", json_true());
        if (x->lp_top) json_object_set_new(c, "top_logprobs", json_integer(x->lp_top));
    }
    if (x->stream) json_object_set_new(c, "stream", json_true());
    return 0;
}

/* ------------------------------------------------------------------------------------------
 * The answer
 * ------------------------------------------------------------------------------------------ */

static json_t *usage_object(const al_xl *x)
{
    if (!x->have_usage) return json_null();
    return json_pack("{s:I,s:{s:I},s:I,s:{s:I},s:I}", "input_tokens", (json_int_t)x->in_tok,
                     "input_tokens_details", "cached_tokens", (json_int_t)x->cached_tok,
                     "output_tokens", (json_int_t)x->out_tok, "output_tokens_details",
                     "reasoning_tokens", (json_int_t)x->reasoning_tok, "total_tokens",
                     (json_int_t)(x->in_tok + x->out_tok));
}

static json_t *or_default(json_t *r, const char *k, json_t *dflt)
{
    json_t *v = json_object_get(r, k);
    if (v && !json_is_null(v)) {
        json_decref(dflt);
        return json_incref(v);
    }
    return dflt;
}

/* The Response object with this status (output: what is finished so far). */
static json_t *response_object(const al_xl *x, const char *status, json_t *error,
                               json_t *incomplete)
{
    json_t *r = x->req;
    json_t *o = json_pack("{s:s,s:s,s:I,s:s,s:b,s:o,s:o}", "id", x->id, "object", "response",
                          "created_at", (json_int_t)x->created, "status", status, "background", 0,
                          "error", error ? error : json_null(), "incomplete_details",
                          incomplete ? incomplete : json_null());
    if (!o) return NULL;
    json_object_set_new(o, "instructions", or_default(r, "instructions", json_null()));
    json_object_set_new(o, "max_output_tokens", or_default(r, "max_output_tokens", json_null()));
    json_object_set_new(o, "model", json_string(x->up_model ? x->up_model : x->model));
    json_object_set(o, "output", x->output);
    json_object_set_new(o, "parallel_tool_calls",
                        or_default(r, "parallel_tool_calls", json_true()));
    json_object_set_new(o, "previous_response_id",
                        or_default(r, "previous_response_id", json_null()));
    json_object_set_new(o, "reasoning",
                        or_default(r, "reasoning", json_pack("{s:n,s:n}", "effort", "summary")));
    json_object_set_new(o, "store", json_boolean(x->store));
    json_object_set_new(o, "temperature", or_default(r, "temperature", json_real(1.0)));
    json_object_set_new(o, "text",
                        or_default(r, "text", json_pack("{s:{s:s}}", "format", "type", "text")));
    json_object_set_new(o, "tool_choice", or_default(r, "tool_choice", json_string("auto")));
    json_object_set_new(o, "tools", or_default(r, "tools", json_array()));
    json_object_set_new(o, "top_p", or_default(r, "top_p", json_real(1.0)));
    json_object_set_new(o, "truncation", or_default(r, "truncation", json_string("disabled")));
    json_object_set_new(o, "usage", usage_object(x));
    json_object_set_new(o, "user", or_default(r, "user", json_null()));
    json_object_set_new(o, "metadata", or_default(r, "metadata", json_object()));
    return o;
}

static int event(al_xl *x, al_buf *out, const char *type, json_t *o)
{
    if (!o) return -1;
    json_t *e = json_pack("{s:s}", "type", type);
    if (!e) {
        json_decref(o);
        return -1;
    }
    json_object_update(e, o);
    json_decref(o);
    json_object_set_new(e, "sequence_number", json_integer(x->seq++));
    return xl_sse(out, type, e);
}

static int responses_open_stream(al_xl *x, al_buf *out)
{
    json_t *r1 = response_object(x, "in_progress", NULL, NULL);
    json_t *r2 = response_object(x, "in_progress", NULL, NULL);
    return event(x, out, "response.created", json_pack("{s:o}", "response", r1)) ||
                   event(x, out, "response.in_progress", json_pack("{s:o}", "response", r2))
               ? -1
               : 0;
}

/* The output_text part of the open text, with its logprobs. */
/* The output_text part of len bytes of text (by length: a NUL token, \u0000, is text too). */
static json_t *text_part(const al_xl *x, const char *text, size_t len)
{
    json_t *p = json_pack("{s:s,s:[],s:o}", "type", "output_text", "annotations", "text",
                          json_stringn(text, len));
    if (p) json_object_set_new(p, "logprobs", x->text_lps ? json_copy(x->text_lps) : json_array());
    return p;
}

static xl_tool *open_tool(al_xl *x)
{
    return &x->tools[x->open_tool];
}

static int responses_item_open(al_xl *x, al_buf *out, int emit)
{
    if (x->open == XK_TEXT && x->lp_want) x->text_lps = json_array();
    if (!emit) return 0;
    json_t *item;
    if (x->open == XK_TEXT) {
        item = json_pack("{s:s,s:s,s:s,s:s,s:[]}", "id", x->open_id, "type", "message", "status",
                         "in_progress", "role", "assistant", "content");
    } else if (x->open == XK_REASONING) {
        item = json_pack("{s:s,s:s,s:[]}", "id", x->open_id, "type", "reasoning", "summary");
    } else {
        xl_tool *t = open_tool(x);
        int custom = is_custom(x, t->name);
        item = json_pack("{s:s,s:s,s:s,s:s,s:s,s:s}", "id", x->open_id, "type",
                         custom ? "custom_tool_call" : "function_call", "status", "in_progress",
                         custom ? "input" : "arguments", "", "call_id", t->call_id, "name",
                         t->name ? t->name : "");
        if (item) name_item(x, item, t->name);
    }
    if (event(x, out, "response.output_item.added",
              json_pack("{s:i,s:o}", "output_index", x->open_index, "item", item)))
        return -1;
    if (x->open == XK_TEXT)
        return event(x, out, "response.content_part.added",
                     json_pack("{s:s,s:i,s:i,s:o}", "item_id", x->open_id, "output_index",
                               x->open_index, "content_index", 0, "part", text_part(x, "", 0)));
    return 0;
}

/* The chat logprobs of a piece of text, in the Responses shape. */
static json_t *lps_of(json_t *lps, int top)
{
    json_t *out = json_array(), *e;
    size_t i;
    json_array_foreach(lps, i, e)
    {
        json_t *tops = json_array(), *t;
        size_t k;
        json_array_foreach(json_object_get(e, "top_logprobs"), k, t)
        {
            if ((int)k >= top) break;
            json_array_append_new(tops, json_pack("{s:o,s:o,s:o}", "token",
                                                  or_default(t, "token", json_string("")),
                                                  "logprob", or_default(t, "logprob", json_real(0)),
                                                  "bytes", or_default(t, "bytes", json_array())));
        }
        json_array_append_new(
            out, json_pack("{s:o,s:o,s:o,s:o}", "token", or_default(e, "token", json_string("")),
                           "logprob", or_default(e, "logprob", json_real(0)), "bytes",
                           or_default(e, "bytes", json_array()), "top_logprobs", tops));
    }
    return out;
}

static int responses_piece(al_xl *x, const char *s, size_t n, json_t *lps, al_buf *out,
                           int emit)
{
    json_t *mine = NULL;
    if (x->open == XK_TEXT && x->lp_want && lps) {
        mine = lps_of(lps, x->lp_top);
        if (mine && x->text_lps) json_array_extend(x->text_lps, mine);
    }
    if (!emit) {
        json_decref(mine);
        return 0;
    }
    json_t *d = json_stringn(s, n);
    if (x->open == XK_TEXT)
        return event(x, out, "response.output_text.delta",
                     json_pack("{s:s,s:i,s:i,s:o,s:o}", "item_id", x->open_id, "output_index",
                               x->open_index, "content_index", 0, "delta", d, "logprobs",
                               mine ? mine : json_array()));
    json_decref(mine);
    if (x->open == XK_REASONING)
        return event(x, out, "response.reasoning_text.delta",
                     json_pack("{s:s,s:i,s:i,s:o}", "item_id", x->open_id, "output_index",
                               x->open_index, "content_index", 0, "delta", d));
    if (is_custom(x, open_tool(x)->name)) {
        json_decref(d); /* a freeform input is sent whole when it is done */
        return 0;
    }
    return event(x, out, "response.function_call_arguments.delta",
                 json_pack("{s:s,s:i,s:o}", "item_id", x->open_id, "output_index", x->open_index,
                           "delta", d));
}

static int responses_item_close(al_xl *x, al_buf *out, int emit)
{
    json_t *item;
    const char *text = x->open == XK_TEXT ? (x->text.data ? x->text.data : "")
                       : x->reasoning.data ? x->reasoning.data
                                          : "";
    if (x->open == XK_TEXT) {
        size_t tn = x->text.len;
        item = json_pack("{s:s,s:s,s:s,s:s,s:[o]}", "id", x->open_id, "type", "message", "status",
                         "completed", "role", "assistant", "content", text_part(x, text, tn));
        if (emit &&
            (event(x, out, "response.output_text.done",
                   json_pack("{s:s,s:i,s:i,s:o,s:o}", "item_id", x->open_id, "output_index",
                             x->open_index, "content_index", 0, "text", json_stringn(text, tn),
                             "logprobs", x->text_lps ? json_copy(x->text_lps) : json_array())) ||
             event(x, out, "response.content_part.done",
                   json_pack("{s:s,s:i,s:i,s:o}", "item_id", x->open_id, "output_index",
                             x->open_index, "content_index", 0, "part",
                             text_part(x, text, tn))))) {
            json_decref(item);
            return -1;
        }
    } else if (x->open == XK_REASONING) {
        item = json_pack("{s:s,s:s,s:[],s:[{s:s,s:s}]}", "id", x->open_id, "type", "reasoning",
                         "summary", "content", "type", "reasoning_text", "text", text);
        if (item && included(x, "reasoning.encrypted_content")) {
            size_t ml = strlen(ENC_MARK), tl = strlen(text);
            char *enc = malloc(ml + tl + 1);
            if (enc) {
                memcpy(enc, ENC_MARK, ml);
                memcpy(enc + ml, text, tl + 1);
                json_object_set_new(item, "encrypted_content", json_string(enc));
                free(enc);
            }
        }
        if (emit && event(x, out, "response.reasoning_text.done",
                          json_pack("{s:s,s:i,s:i,s:s}", "item_id", x->open_id, "output_index",
                                    x->open_index, "content_index", 0, "text", text))) {
            json_decref(item);
            return -1;
        }
    } else {
        xl_tool *t = open_tool(x);
        const char *args = t->args.data ? t->args.data : "";
        if (is_custom(x, t->name)) {
            json_t *ao = xl_args_object(args);
            const char *in = json_string_value(json_object_get(ao, "input"));
            item = json_pack("{s:s,s:s,s:s,s:s,s:s,s:s}", "id", x->open_id, "type",
                             "custom_tool_call", "status", "completed", "call_id", t->call_id,
                             "input", in ? in : args, "name", t->name ? t->name : "");
            if (item) name_item(x, item, t->name);
            if (emit && event(x, out, "response.custom_tool_call_input.done",
                              json_pack("{s:s,s:i,s:s}", "item_id", x->open_id, "output_index",
                                        x->open_index, "input", in ? in : args))) {
                json_decref(ao);
                json_decref(item);
                return -1;
            }
            json_decref(ao);
        } else {
            item = json_pack("{s:s,s:s,s:s,s:s,s:s,s:s}", "id", x->open_id, "type", "function_call",
                             "status", "completed", "arguments", args, "call_id", t->call_id,
                             "name", t->name ? t->name : "");
            if (item) name_item(x, item, t->name);
            const char *shortname = json_string_value(json_object_get(item, "name"));
            if (emit && event(x, out, "response.function_call_arguments.done",
                              json_pack("{s:s,s:i,s:s,s:s}", "item_id", x->open_id, "output_index",
                                        x->open_index, "arguments", args, "name",
                                        shortname ? shortname : ""))) {
                json_decref(item);
                return -1;
            }
        }
        t->item = item;
    }
    if (!item || json_array_append(x->output, item)) {
        json_decref(item);
        return -1;
    }
    int rc = emit ? event(x, out, "response.output_item.done",
                          json_pack("{s:i,s:O}", "output_index", x->open_index, "item", item))
                  : 0;
    json_decref(item);
    return rc;
}

static int responses_end(al_xl *x, const char *error, al_buf *out, int emit)
{
    const char *status = "completed", *type = "response.completed";
    json_t *err = NULL, *inc = NULL;
    if (error) {
        status = "failed";
        type = "response.failed";
        err = json_pack("{s:s,s:s}", "code", "server_error", "message", error);
    } else if (x->finish && !strcmp(x->finish, "length")) {
        status = "incomplete";
        type = "response.incomplete";
        inc = json_pack("{s:s}", "reason", "max_output_tokens");
    }
    x->final = response_object(x, status, err, inc);
    if (!x->final) return -1;
    if (x->final_members && json_object_update(x->final, x->final_members)) return -1;
    if (!emit) return 0;
    return event(x, out, type, json_pack("{s:O}", "response", x->final));
}

/* The conversation a later call may continue: the one this call sent, then its answer as
 * one assistant message. */
static json_t *responses_conversation(const al_xl *x)
{
    if (!x->conv || !x->final) return NULL;
    json_t *conv = json_copy(x->conv);
    json_t *asst = json_pack("{s:s,s:n}", "role", "assistant", "content");
    if (!conv || !asst) {
        json_decref(conv);
        json_decref(asst);
        return NULL;
    }
    al_buf text = {0};
    size_t i;
    json_t *it;
    json_array_foreach(x->output, i, it)
    {
        const char *ty = json_string_value(json_object_get(it, "type"));
        if (!ty) continue;
        if (!strcmp(ty, "message")) {
            json_t *p = json_array_get(json_object_get(it, "content"), 0);
            const char *t = json_string_value(json_object_get(p, "text"));
            if (t) al_buf_puts(&text, t);
        } else if (!strcmp(ty, "reasoning")) {
            char *t = reasoning_text(it);
            if (t) json_object_set_new(asst, "reasoning_content", json_string(t));
            free(t);
        } else if (!strcmp(ty, "function_call") || !strcmp(ty, "custom_tool_call")) {
            const char *call_id = json_string_value(json_object_get(it, "call_id"));
            char *name = model_name(it);
            json_t *a;
            if (ty[0] == 'c') {
                json_t *o = json_pack("{s:O}", "input", json_object_get(it, "input"));
                char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
                a = s ? json_string(s) : NULL;
                free(s);
                json_decref(o);
            } else {
                a = json_incref(json_object_get(it, "arguments"));
            }
            if (call_id && name && a) tool_call_append(asst, call_id, name, a);
            json_decref(a);
            free(name);
        }
    }
    if (text.data) json_object_set_new(asst, "content", json_stringn(text.data, text.len));
    al_buf_free(&text);
    json_array_append_new(conv, asst);
    return conv;
}

/* {"error": {"message", "type", "param", "code"}}: type NULL, derived from status. Malloc'd,
 * or NULL when out of memory. Chat completions errors share the shape. */
static char *responses_error_body(int status, const char *type, const char *code,
                                  const char *message)
{
    json_t *o = json_pack("{s:{s:s,s:s,s:n,s:o}}", "error", "message", message ? message : "",
                          "type",
                          type ? type : (status < 500 ? "invalid_request_error" : "server_error"),
                          "param", "code", code && *code ? json_string(code) : json_null());
    char *s = o ? json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    json_decref(o);
    return s;
}

const xl_ops xl_responses_ops = {
    .id_prefix = "resp",
    .tool_prefix = "fc",
    .empty_message = 1,
    .request = responses_request,
    .open_stream = responses_open_stream,
    .item_open = responses_item_open,
    .piece = responses_piece,
    .item_close = responses_item_close,
    .end = responses_end,
    .conversation = responses_conversation,
    .error_body = responses_error_body,
};
