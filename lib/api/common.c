/*
 * common.c: what both API translators (responses.c, messages.c) and the shared half
 * (translate.c) build with: the SSE output buffer, an error in the agent's API's terms, one
 * SSE event's framing, the text of content parts, tool arguments as an object. Calls nothing
 * of lib/api's own.
 */
#include "translate_int.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int xl_fail(al_xl_err *e, int status, const char *type, const char *code, const char *param,
            const char *fmt, ...)
{
    if (!e) return -1;
    e->status = status;
    snprintf(e->type, sizeof e->type, "%s", type);
    snprintf(e->code, sizeof e->code, "%s", code ? code : "");
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    return -1;
}

int xl_sse(al_buf *out, const char *type, json_t *o)
{
    if (!o) return -1;
    char *s = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(o);
    if (!s) return -1;
    int rc = al_buf_printf(out, "event: %s\ndata: %s\n\n", type, s);
    free(s);
    return rc;
}

/* Whether a content part's type is one of types, or, with types NULL, the chat API's rule:
 * "text" or no type at all (a type that is not a string counts as none). */
static int content_part_ok(json_t *part, const char *const *types)
{
    json_t *ty = json_object_get(part, "type");
    const char *t = json_string_value(ty);
    if (!types) return !t || (strlen(t) == json_string_length(ty) && !strcmp(t, "text"));
    for (size_t k = 0; t && types[k]; k++)
        if (!strcmp(t, types[k])) return 1;
    return 0;
}

int al_api_content_text(json_t *c, const char *const *types, char **out, size_t *len)
{
    al_buf b = {0};
    size_t i;
    json_t *part;
    *out = NULL;
    if (len) *len = 0;
    if (!c || json_is_null(c)) return 0;
    if (json_is_string(c)) {
        al_buf_append(&b, json_string_value(c), json_string_length(c));
    } else if (json_is_array(c)) {
        json_array_foreach(c, i, part)
        {
            json_t *tx = json_object_get(part, "text");
            if (!content_part_ok(part, types) || !json_is_string(tx)) {
                al_buf_free(&b);
                return -1;
            }
            al_buf_append(&b, json_string_value(tx), json_string_length(tx));
        }
    } else {
        return -1;
    }
    if (b.oom) {
        al_buf_free(&b);
        return -1;
    }
    *out = al_buf_detach(&b, len); /* an empty array gives "" */
    return *out ? 0 : -1;
}

char *xl_text_of(json_t *content, const char *const *types)
{
    char *s;
    if (!json_is_string(content) && !json_is_array(content)) return NULL;
    return al_api_content_text(content, types, &s, NULL) == 0 ? s : NULL;
}

json_t *xl_args_object(const char *args)
{
    json_t *o = args && *args ? json_loads(args, JSON_DECODE_ANY, NULL) : NULL;
    if (json_is_object(o)) return o;
    json_decref(o);
    return json_object();
}
