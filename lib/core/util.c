#include "core/util.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

int64_t al_now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

int64_t al_mono_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

int al_err(char *errstr, size_t errlen, const char *fmt, ...)
{
    if (errstr && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(errstr, errlen, fmt, ap);
        va_end(ap);
    }
    return -1;
}

char *al_file_read(const char *path, size_t *len_out, char *errstr, size_t errlen)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        al_err(errstr, errlen, "cannot open %s: %s", path, strerror(errno));
        return NULL;
    }
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap + 1);
    if (!buf) {
        fclose(f);
        al_err(errstr, errlen, "out of memory reading %s", path);
        return NULL;
    }
    for (;;) {
        if (len == cap) {
            char *nb = realloc(buf, cap * 2 + 1);
            if (!nb) {
                free(buf);
                fclose(f);
                al_err(errstr, errlen, "out of memory reading %s", path);
                return NULL;
            }
            buf = nb;
            cap *= 2;
        }
        size_t n = fread(buf + len, 1, cap - len, f);
        len += n;
        if (n == 0) break;
    }
    if (ferror(f)) {
        al_err(errstr, errlen, "error reading %s: %s", path, strerror(errno));
        free(buf);
        fclose(f);
        return NULL;
    }
    fclose(f);
    buf[len] = '\0';
    if (len_out) *len_out = len;
    return buf;
}

int al_file_write_atomic(const char *path, const void *buf, size_t len, char *errstr,
                         size_t errlen)
{
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid()) >= (int)sizeof tmp)
        return al_err(errstr, errlen, "path too long: %s", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return al_err(errstr, errlen, "cannot create %s: %s", tmp, strerror(errno));
    const char *p = buf;
    size_t left = len;
    while (left > 0) {
        ssize_t n = write(fd, p, left);
        if (n < 0) {
            if (errno == EINTR) continue;
            int e = errno;
            close(fd);
            unlink(tmp);
            return al_err(errstr, errlen, "cannot write %s: %s", tmp, strerror(e));
        }
        p += n;
        left -= (size_t)n;
    }
    if (fsync(fd) != 0 || close(fd) != 0) {
        int e = errno;
        unlink(tmp);
        return al_err(errstr, errlen, "cannot sync %s: %s", tmp, strerror(e));
    }
    if (rename(tmp, path) != 0) {
        int e = errno;
        unlink(tmp);
        return al_err(errstr, errlen, "cannot rename %s to %s: %s", tmp, path, strerror(e));
    }
    return 0;
}

char *al_str_trim(char *s)
{
    char *e;
    while (*s && isspace((unsigned char)*s))
        s++;
    e = s + strlen(s);
    while (e > s && isspace((unsigned char)e[-1]))
        *--e = '\0';
    return s;
}

struct al_sha256_ctx {
    EVP_MD_CTX *md;
};

al_sha256_ctx *al_sha256_init(void)
{
    al_sha256_ctx *c = malloc(sizeof *c);
    if (!c) return NULL;
    c->md = EVP_MD_CTX_new();
    if (!c->md || EVP_DigestInit_ex(c->md, EVP_sha256(), NULL) != 1) {
        EVP_MD_CTX_free(c->md);
        free(c);
        return NULL;
    }
    return c;
}

void al_sha256_update(al_sha256_ctx *c, const void *data, size_t len)
{
    EVP_DigestUpdate(c->md, data, len);
}

void al_sha256_final(al_sha256_ctx *c, uint8_t out[32])
{
    unsigned int n = 32;
    EVP_DigestFinal_ex(c->md, out, &n);
    EVP_MD_CTX_free(c->md);
    free(c);
}

void al_sha256(const void *data, size_t len, uint8_t out[32])
{
    unsigned int n = 32;
    EVP_Digest(data, len, out, &n, EVP_sha256(), NULL);
}

void al_hex(const uint8_t *bytes, size_t n, char *out)
{
    static const char digits[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = digits[bytes[i] >> 4];
        out[2 * i + 1] = digits[bytes[i] & 15];
    }
    out[2 * n] = '\0';
}

void al_sha256_hex(const void *data, size_t len, char out[65])
{
    uint8_t d[32];
    al_sha256(data, len, d);
    al_hex(d, 32, out);
}
