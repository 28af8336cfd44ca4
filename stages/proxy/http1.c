/*
 * http1.c: HTTP/1.1 request-head parsing (see http1.h).
 */
#include "http1.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const al_slice *al_http1_header_get(const al_http1_head *h, const char *name)
{
    for (size_t i = 0; i < h->nheaders; i++)
        if (al_slice_caseeq(h->headers[i].name, name)) return &h->headers[i].value;
    return NULL;
}

static int is_tchar(unsigned char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           (c && strchr("!#$%&'*+-.^_`|~", c));
}

static int perr(int status, char *errstr, size_t errlen, const char *msg)
{
    if (errstr && errlen) snprintf(errstr, errlen, "%s", msg);
    return -status;
}

/* Whether the comma-separated header value v holds token tok (case-insensitive). */
static int value_has_token(al_slice v, const char *tok)
{
    size_t i = 0;
    while (i < v.n) {
        while (i < v.n && (v.p[i] == ' ' || v.p[i] == '\t' || v.p[i] == ','))
            i++;
        size_t s = i;
        while (i < v.n && v.p[i] != ',')
            i++;
        size_t e = i;
        while (e > s && (v.p[e - 1] == ' ' || v.p[e - 1] == '\t'))
            e--;
        al_slice t = {v.p + s, e - s};
        if (e > s && al_slice_caseeq(t, tok)) return 1;
    }
    return 0;
}

/* Parses the head once a full "\r\n\r\n" (or bare "\n\n") is present. Bare LF line ends are
 * accepted like nginx does; obsolete line folding is refused (RFC 9112 5.2). */
int al_http1_parse_head(const char *buf, size_t len, const al_http1_limits *lim, al_http1_head *out,
                        char *errstr, size_t errlen)
{
    size_t maxhead = lim && lim->max_head_bytes ? lim->max_head_bytes : 32768;
    size_t maxhdr = lim && lim->max_headers ? lim->max_headers : 100;
    if (maxhdr > AL_HTTP1_HEADERS_CAP) maxhdr = AL_HTTP1_HEADERS_CAP;
    /* the scalars only: the header array (8 KiB) is read up to nheaders, and clearing it
     * was a measurable part of each request */
    out->method = out->target = (al_slice){0};
    out->minor_version = 0;
    out->nheaders = 0;
    out->chunked = out->keep_alive = 0;
    out->content_length = -1;

    /* find the end of the head */
    size_t end = 0, scan = len < maxhead ? len : maxhead;
    size_t i0 = 0;
    while (i0 < scan && (buf[i0] == '\r' || buf[i0] == '\n'))
        i0++; /* RFC 9112 2.2 */
    for (size_t i = i0; i < scan; i++) {
        if (buf[i] != '\n') continue;
        if (i + 1 < len && buf[i + 1] == '\n') {
            end = i + 2;
            break;
        }
        if (i + 2 < len && buf[i + 1] == '\r' && buf[i + 2] == '\n') {
            end = i + 3;
            break;
        }
    }
    if (!end) {
        if (len >= maxhead) return perr(431, errstr, errlen, "request header fields too large");
        return 0;
    }
    if (end > maxhead) return perr(431, errstr, errlen, "request header fields too large");

    const char *p = buf + i0, *e = buf + end;
    /* request line: METHOD SP TARGET SP HTTP/1.x */
    const char *m = p;
    while (p < e && is_tchar((unsigned char)*p))
        p++;
    if (p == m || p >= e || *p != ' ') return perr(400, errstr, errlen, "malformed request line");
    out->method = (al_slice){m, (size_t)(p - m)};
    p++;
    const char *t = p;
    while (p < e && (unsigned char)*p > ' ' && *p != 0x7f)
        p++;
    if (p == t || p >= e || *p != ' ') return perr(400, errstr, errlen, "malformed request target");
    out->target = (al_slice){t, (size_t)(p - t)};
    p++;
    if (e - p < 9 || memcmp(p, "HTTP/", 5) != 0)
        return perr(400, errstr, errlen, "malformed HTTP version");
    if (p[5] != '1' || p[6] != '.' || p[7] < '0' || p[7] > '9')
        return perr(505, errstr, errlen, "HTTP version not supported");
    out->minor_version = p[7] - '0';
    p += 8;
    if (*p == '\r') p++;
    if (p >= e || *p != '\n') return perr(400, errstr, errlen, "malformed request line");
    p++;

    int conn_close = 0, conn_keep = 0, have_te = 0;
    for (;;) {
        if (p >= e) return perr(400, errstr, errlen, "malformed header section");
        if (*p == '\n') break;
        if (*p == '\r' && p + 1 < e && p[1] == '\n') break;
        if (*p == ' ' || *p == '\t')
            return perr(400, errstr, errlen, "obsolete header line folding");
        const char *n = p;
        while (p < e && is_tchar((unsigned char)*p))
            p++;
        if (p == n || p >= e || *p != ':')
            return perr(400, errstr, errlen, "malformed header name");
        al_slice name = {n, (size_t)(p - n)};
        p++;
        while (p < e && (*p == ' ' || *p == '\t'))
            p++;
        const char *v = p;
        while (p < e && *p != '\n') {
            unsigned char c = (unsigned char)*p;
            if ((c < ' ' && c != '\t' && c != '\r') || c == 0x7f)
                return perr(400, errstr, errlen, "invalid character in header value");
            if (c == '\r' && (p + 1 >= e || p[1] != '\n'))
                return perr(400, errstr, errlen, "bare CR in header value");
            p++;
        }
        if (p >= e) return perr(400, errstr, errlen, "malformed header section");
        const char *ve = p;
        p++;
        while (ve > v && (ve[-1] == '\r' || ve[-1] == ' ' || ve[-1] == '\t'))
            ve--;
        if (out->nheaders >= maxhdr) return perr(431, errstr, errlen, "too many header fields");
        al_slice val = {v, (size_t)(ve - v)};
        out->headers[out->nheaders].name = name;
        out->headers[out->nheaders].value = val;
        out->nheaders++;

        if (al_slice_caseeq(name, "content-length")) {
            if (val.n == 0 || val.n > 15)
                return perr(400, errstr, errlen, "invalid Content-Length");
            int64_t cl = 0;
            for (size_t k = 0; k < val.n; k++) {
                if (val.p[k] < '0' || val.p[k] > '9')
                    return perr(400, errstr, errlen, "invalid Content-Length");
                cl = cl * 10 + (val.p[k] - '0');
            }
            if (out->content_length >= 0 && out->content_length != cl)
                return perr(400, errstr, errlen, "conflicting Content-Length headers");
            out->content_length = cl;
        } else if (al_slice_caseeq(name, "transfer-encoding")) {
            have_te = 1;
            if (!al_slice_caseeq(val, "chunked"))
                return perr(501, errstr, errlen, "unsupported Transfer-Encoding");
            out->chunked = 1;
        } else if (al_slice_caseeq(name, "connection")) {
            if (value_has_token(val, "close")) conn_close = 1;
            if (value_has_token(val, "keep-alive")) conn_keep = 1;
        }
    }
    if (have_te && out->content_length >= 0) /* request smuggling guard, RFC 9112 6.1 */
        return perr(400, errstr, errlen, "both Transfer-Encoding and Content-Length");
    out->keep_alive = out->minor_version >= 1 ? !conn_close : conn_keep;
    return (int)end;
}
