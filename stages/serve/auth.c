/*
 * auth.c: serve's API key. With --api-key (or its file or environment variable) set, the
 * API's routes need it as the Bearer token, compared in time that depends on the lengths only.
 */
#include "serve.h"

#include "core/util.h"

#include <string.h>
#include <strings.h>

/* With an API key set, the API's routes (as vLLM's --api-key guards /v1) need it as the
 * Bearer token; /health and /metrics stay open for probes and scrapes. */
int serve_auth_check(const serve_ctx *sc, al_httpd_req *req, const char *path)
{
    if (!sc->api_key) return 1;
    if (strncmp(path, "/v1/", 4) != 0 && strcmp(path, "/tokenize") != 0 &&
        strcmp(path, "/detokenize") != 0)
        return 1;
    const al_slice *a = al_http_header_get(al_httpd_req_head(req), "authorization");
    if (!a || a->n < 7 || strncasecmp(a->p, "Bearer ", 7) != 0) return 0;
    return al_secret_eq(a->p + 7, a->n - 7, sc->api_key);
}

