/*
 * http1.c: the HTTP/1.1 request-head parser and the chunked-body decoder (http1.h).
 */
#include "http/http1.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>

#define CHUNK_LINE_MAX 4096
#define TRAILERS_MAX 8192

const al_slice *al_http_header_get(const al_http_head *h, const char *name)
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

int al_http_value_has_token(al_slice v, const char *tok)
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

/* Empty lines before the request line are skipped (RFC 9112 2.2). */
static size_t leading_empty(const char *buf, size_t len)
{
    size_t i = 0;
    while (i < len && (buf[i] == '\r' || buf[i] == '\n'))
        i++;
    return i;
}

size_t al_http_head_end(const char *buf, size_t len, size_t *scanned)
{
    size_t i0 = leading_empty(buf, len);
    size_t i = *scanned > i0 ? *scanned : i0;
    for (; i < len; i++) {
        if (buf[i] != '\n') continue;
        if (i + 1 < len && buf[i + 1] == '\n') return i + 2;
        if (i + 2 < len && buf[i + 1] == '\r' && buf[i + 2] == '\n') return i + 3;
        if (i + 2 >= len) break; /* the rest of a possible blank line is still to come */
    }
    *scanned = i < len ? i : len;
    return 0;
}

/* Splits the request target into path, query and (absolute-form) host. 0 or -1. */
static int split_target(al_http_head *h)
{
    const char *t = h->target.p;
    size_t n = h->target.n;
    if (n == 1 && t[0] == '*') {
        if (!al_slice_eq(h->method, "OPTIONS")) return -1;
        h->path = h->target;
        return 0;
    }
    size_t i = 0;
    if (t[0] != '/') {
        size_t s = n >= 7 && !strncasecmp(t, "http://", 7)    ? 7
                   : n >= 8 && !strncasecmp(t, "https://", 8) ? 8
                                                              : 0;
        if (!s) return -1;
        size_t a = s;
        while (a < n && t[a] != '/' && t[a] != '?' && t[a] != '#')
            a++;
        if (a == s) return -1; /* no authority */
        for (size_t k = s; k < a; k++)
            if (t[k] == '@') return -1; /* credentials have no place in a request */
        h->host = (al_slice){t + s, a - s};
        i = a;
    }
    size_t q = i;
    while (q < n && t[q] != '?' && t[q] != '#')
        q++;
    h->path = q > i ? (al_slice){t + i, q - i} : (al_slice){"/", 1};
    if (q < n && t[q] == '?') {
        size_t e = q + 1;
        while (e < n && t[e] != '#')
            e++;
        h->query = (al_slice){t + q + 1, e - q - 1};
    }
    return 0;
}

int al_http_parse_head(const char *buf, size_t len, const al_http_limits *lim, al_http_head *out,
                       char *errstr, size_t errlen)
{
    size_t max_line = lim && lim->max_line ? lim->max_line : 8192;
    size_t max_head = lim && lim->max_head ? lim->max_head : 32768;
    size_t max_hdrs = lim && lim->max_headers ? lim->max_headers : 100;
    if (max_hdrs > AL_HTTP_HEADERS_CAP) max_hdrs = AL_HTTP_HEADERS_CAP;
    if (max_line > max_head) max_line = max_head;
    /* the scalars only: the header array is read up to nheaders */
    out->method = out->target = out->path = out->query = out->host = (al_slice){"", 0};
    out->minor_version = 0;
    out->nheaders = 0;
    out->chunked = out->keep_alive = out->expect_continue = 0;
    out->content_length = -1;

    size_t i0 = leading_empty(buf, len);
    if (i0 >= max_head) return perr(400, errstr, errlen, "only empty lines");
    /* the request line first: a long one is 414, as nginx answers it */
    size_t look = len - i0 < max_line + 2 ? len - i0 : max_line + 2;
    const char *nl = memchr(buf + i0, '\n', look);
    size_t line_len = nl ? (size_t)(nl - (buf + i0)) : look;
    if (nl && line_len && nl[-1] == '\r') line_len--;
    if (line_len > max_line) return perr(414, errstr, errlen, "request line too long");
    if (!nl) return len >= max_head ? perr(431, errstr, errlen, "request header fields too large") : 0;
    size_t scanned = 0;
    size_t end = al_http_head_end(buf, len < max_head ? len : max_head, &scanned);
    if (!end) {
        if (len >= max_head) return perr(431, errstr, errlen, "request header fields too large");
        return 0;
    }

    const char *p = buf + i0, *e = buf + end;
    const char *m = p;
    while (p < e && is_tchar((unsigned char)*p))
        p++;
    if (p == m || p >= e || *p != ' ') return perr(400, errstr, errlen, "malformed request line");
    out->method = (al_slice){m, (size_t)(p - m)};
    p++;
    const char *t = p;
    while (p < e && (unsigned char)*p > ' ' && *p != 0x7f)
        p++;
    if (p < e && *p == '\0') return perr(400, errstr, errlen, "NUL byte in the request target");
    if (p == t || p >= e || *p != ' ') return perr(400, errstr, errlen, "malformed request target");
    out->target = (al_slice){t, (size_t)(p - t)};
    p++;
    if (e - p < 9 || memcmp(p, "HTTP/", 5) != 0)
        return perr(400, errstr, errlen, "malformed HTTP version");
    if (p[5] < '0' || p[5] > '9' || p[6] != '.' || p[7] < '0' || p[7] > '9')
        return perr(400, errstr, errlen, "malformed HTTP version");
    if (p[5] != '1') return perr(505, errstr, errlen, "HTTP version not supported");
    out->minor_version = p[7] - '0';
    p += 8;
    if (*p == '\r') p++;
    if (p >= e || *p != '\n') return perr(400, errstr, errlen, "malformed request line");
    p++;

    int conn_close = 0, conn_keep = 0, have_te = 0, nhost = 0;
    for (;;) {
        if (p >= e) return perr(400, errstr, errlen, "malformed header section");
        if (*p == '\n') break;
        if (*p == '\r' && p + 1 < e && p[1] == '\n') break;
        if (*p == ' ' || *p == '\t')
            return perr(400, errstr, errlen, "obsolete header line folding");
        const char *n = p;
        while (p < e && is_tchar((unsigned char)*p))
            p++;
        if (p < e && (*p == ' ' || *p == '\t') && p > n)
            return perr(400, errstr, errlen, "whitespace between a header name and its colon");
        if (p == n || p >= e || *p != ':') return perr(400, errstr, errlen, "malformed header name");
        al_slice name = {n, (size_t)(p - n)};
        p++;
        while (p < e && (*p == ' ' || *p == '\t'))
            p++;
        const char *v = p;
        while (p < e && *p != '\n') {
            unsigned char c = (unsigned char)*p;
            if (c == '\0') return perr(400, errstr, errlen, "NUL byte in a header value");
            if ((c < ' ' && c != '\t' && c != '\r') || c == 0x7f)
                return perr(400, errstr, errlen, "control character in a header value");
            if (c == '\r' && (p + 1 >= e || p[1] != '\n'))
                return perr(400, errstr, errlen, "bare CR in a header value");
            p++;
        }
        if (p >= e) return perr(400, errstr, errlen, "malformed header section");
        const char *ve = p;
        p++;
        while (ve > v && (ve[-1] == '\r' || ve[-1] == ' ' || ve[-1] == '\t'))
            ve--;
        if (out->nheaders >= max_hdrs) return perr(431, errstr, errlen, "too many header fields");
        al_slice val = {v, (size_t)(ve - v)};
        out->headers[out->nheaders].name = name;
        out->headers[out->nheaders].value = val;
        out->nheaders++;

        if (al_slice_caseeq(name, "content-length")) {
            if (out->content_length >= 0)
                return perr(400, errstr, errlen, "more than one Content-Length");
            if (val.n == 0 || val.n > 15)
                return perr(400, errstr, errlen, "invalid Content-Length");
            int64_t cl = 0;
            for (size_t k = 0; k < val.n; k++) {
                if (val.p[k] < '0' || val.p[k] > '9')
                    return perr(400, errstr, errlen, "invalid Content-Length");
                cl = cl * 10 + (val.p[k] - '0');
            }
            out->content_length = cl;
        } else if (al_slice_caseeq(name, "transfer-encoding")) {
            if (have_te) return perr(400, errstr, errlen, "more than one Transfer-Encoding");
            have_te = 1;
            if (!al_slice_caseeq(val, "chunked"))
                return perr(501, errstr, errlen, "unsupported Transfer-Encoding");
            out->chunked = 1;
        } else if (al_slice_caseeq(name, "host")) {
            if (++nhost > 1) return perr(400, errstr, errlen, "more than one Host header");
            for (size_t k = 0; k < val.n; k++)
                if (val.p[k] == ' ' || val.p[k] == '\t' || val.p[k] == '/' || val.p[k] == '@')
                    return perr(400, errstr, errlen, "invalid Host header");
            out->host = val;
        } else if (al_slice_caseeq(name, "connection")) {
            if (al_http_value_has_token(val, "close")) conn_close = 1;
            if (al_http_value_has_token(val, "keep-alive")) conn_keep = 1;
        } else if (al_slice_caseeq(name, "expect")) {
            if (al_slice_caseeq(val, "100-continue")) out->expect_continue = 1;
        }
    }
    if (have_te && out->content_length >= 0) /* request smuggling guard, RFC 9112 6.1 */
        return perr(400, errstr, errlen, "both Transfer-Encoding and Content-Length");
    if (have_te && out->minor_version == 0)
        return perr(400, errstr, errlen, "Transfer-Encoding in an HTTP/1.0 request");
    if (out->minor_version >= 1 && nhost == 0)
        return perr(400, errstr, errlen, "an HTTP/1.1 request needs a Host header");
    if (split_target(out) != 0) return perr(400, errstr, errlen, "malformed request target");
    out->keep_alive = out->minor_version >= 1 ? !conn_close : conn_keep && !conn_close;
    return (int)end;
}

/* ------------------------------------------------------------------------------------------
 * Chunked bodies
 * ------------------------------------------------------------------------------------------ */

enum {
    CH_SIZE = 0, /* hex digits of a chunk size */
    CH_EXT,      /* after the size: whitespace, extensions, up to the line's end */
    CH_SIZE_LF,  /* CR seen at the end of a size line */
    CH_DATA,     /* chunk data */
    CH_DATA_CR,  /* the CRLF after the data */
    CH_DATA_LF,
    CH_TRAILER,  /* at the start of a trailer line (or the final blank line) */
    CH_TRAILER_LINE,
    CH_TRAILER_LF,
    CH_FINAL_LF, /* CR of the final blank line seen */
    CH_DONE,
};

static int hexval(char c)
{
    return c >= '0' && c <= '9' ? c - '0'
           : c >= 'a' && c <= 'f' ? c - 'a' + 10
           : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                  : -1;
}

int al_http_chunked_feed(al_http_chunked *c, const char *in, size_t n, size_t *used,
                         uint64_t max_body, al_http_sink_fn sink, void *ud, char *errstr,
                         size_t errlen)
{
    size_t i = 0;
    int rc = 0;
    while (i < n && c->state != CH_DONE) {
        char ch = in[i];
        switch (c->state) {
        case CH_SIZE: {
            int h = hexval(ch);
            if (h >= 0) {
                if (++c->digits > 15) {
                    rc = perr(400, errstr, errlen, "chunk size of more than 15 hex digits");
                    goto out;
                }
                c->left = c->left * 16 + (uint64_t)h;
                i++, c->line++;
                break;
            }
            if (c->digits == 0) {
                rc = perr(400, errstr, errlen, "a chunk size that is not hex");
                goto out;
            }
            c->state = CH_EXT;
            break; /* the same byte again, as part of the rest of the line */
        }
        case CH_EXT:
            /* after the digits: whitespace, then the line's end or ';' and extensions */
            if (!c->ext && ch != ' ' && ch != '\t' && ch != ';' && ch != '\n' && ch != '\r') {
                rc = perr(400, errstr, errlen, "a chunk size that is not hex");
                goto out;
            }
            if (ch == ';') c->ext = 1;
            if (ch == '\n' || ch == '\r') {
                c->state = ch == '\r' ? CH_SIZE_LF : CH_DATA;
                i++;
                if (c->state == CH_DATA) goto size_done;
                break;
            }
            if (((unsigned char)ch < ' ' && ch != '\t') || ch == 0x7f) {
                rc = perr(400, errstr, errlen, "control character in a chunk size line");
                goto out;
            }
            if (++c->line > CHUNK_LINE_MAX) {
                rc = perr(400, errstr, errlen, "chunk size line too long");
                goto out;
            }
            i++;
            break;
        case CH_SIZE_LF:
            if (ch != '\n') {
                rc = perr(400, errstr, errlen, "bare CR in a chunk size line");
                goto out;
            }
            i++;
            c->state = CH_DATA;
        size_done:
            c->line = 0, c->digits = 0, c->ext = 0;
            if (c->left == 0) {
                c->state = CH_TRAILER;
                break;
            }
            if (c->left > max_body || c->total + c->left > max_body) {
                rc = perr(413, errstr, errlen, "request body too large");
                goto out;
            }
            break;
        case CH_DATA: {
            size_t take = n - i < c->left ? n - i : (size_t)c->left;
            if (sink(ud, in + i, take) != 0) {
                rc = perr(500, errstr, errlen, "out of memory reading the body");
                goto out;
            }
            i += take;
            c->left -= take;
            c->total += take;
            if (c->left == 0) c->state = CH_DATA_CR;
            break;
        }
        case CH_DATA_CR:
            if (ch == '\n') {
                c->state = CH_SIZE;
            } else if (ch == '\r') {
                c->state = CH_DATA_LF;
            } else {
                rc = perr(400, errstr, errlen, "no CRLF after chunk data");
                goto out;
            }
            i++;
            break;
        case CH_DATA_LF:
            if (ch != '\n') {
                rc = perr(400, errstr, errlen, "no CRLF after chunk data");
                goto out;
            }
            i++;
            c->state = CH_SIZE;
            break;
        case CH_TRAILER:
            if (ch == '\n') {
                i++;
                c->state = CH_DONE;
            } else if (ch == '\r') {
                i++;
                c->state = CH_FINAL_LF;
            } else {
                c->state = CH_TRAILER_LINE;
                c->line = 0;
            }
            break;
        case CH_FINAL_LF:
            if (ch != '\n') {
                rc = perr(400, errstr, errlen, "bare CR after the last chunk");
                goto out;
            }
            i++;
            c->state = CH_DONE;
            break;
        case CH_TRAILER_LINE:
            if (ch == '\n' || ch == '\r') {
                c->state = ch == '\r' ? CH_TRAILER_LF : CH_TRAILER;
                i++;
                break;
            }
            if (((unsigned char)ch < ' ' && ch != '\t') || ch == 0x7f) {
                rc = perr(400, errstr, errlen, "control character in a trailer");
                goto out;
            }
            if (++c->line > CHUNK_LINE_MAX || ++c->trailer > TRAILERS_MAX) {
                rc = perr(400, errstr, errlen, "trailers too large");
                goto out;
            }
            i++;
            break;
        case CH_TRAILER_LF:
            if (ch != '\n') {
                rc = perr(400, errstr, errlen, "bare CR in a trailer");
                goto out;
            }
            i++;
            c->state = CH_TRAILER;
            break;
        }
    }
    rc = c->state == CH_DONE ? 1 : 0;
out:
    *used = i;
    return rc;
}
