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

int al_xbuf_add(al_xbuf *b, const char *s, size_t n)
{
    if (b->n + n + 1 > b->cap) {
        size_t nc = b->cap ? b->cap : 256;
        while (nc < b->n + n + 1)
            nc *= 2;
        char *np = realloc(b->p, nc);
        if (!np) return -1;
        b->p = np;
        b->cap = nc;
    }
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
    return 0;
}

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

int xl_sse(al_xbuf *out, const char *type, json_t *o)
{
    if (!o) return -1;
    char *s = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(o);
    if (!s) return -1;
    int rc = al_xbuf_add(out, "event: ", 7) || al_xbuf_add(out, type, strlen(type)) ||
             al_xbuf_add(out, "\ndata: ", 7) || al_xbuf_add(out, s, strlen(s)) ||
             al_xbuf_add(out, "\n\n", 2);
    free(s);
    return rc ? -1 : 0;
}

char *xl_text_of(json_t *content, const char *const *types)
{
    if (json_is_string(content)) return strdup(json_string_value(content));
    if (!json_is_array(content)) return NULL;
    al_xbuf b = {0};
    size_t i;
    json_t *p;
    json_array_foreach(content, i, p)
    {
        const char *t = json_string_value(json_object_get(p, "type"));
        int ok = 0;
        for (size_t k = 0; t && types[k] && !ok; k++)
            ok = !strcmp(t, types[k]);
        json_t *tx = json_object_get(p, "text");
        if (!ok || !json_is_string(tx)) {
            free(b.p);
            return NULL;
        }
        if (al_xbuf_add(&b, json_string_value(tx), json_string_length(tx))) {
            free(b.p);
            return NULL;
        }
    }
    return b.p ? b.p : strdup("");
}

json_t *xl_args_object(const char *args)
{
    json_t *o = args && *args ? json_loads(args, JSON_DECODE_ANY, NULL) : NULL;
    if (json_is_object(o)) return o;
    json_decref(o);
    return json_object();
}
