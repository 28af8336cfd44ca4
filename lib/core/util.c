#include "core/util.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
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

long al_file_count_lines(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    long n = 0;
    int c, prev = '\n';
    while ((c = getc(f)) != EOF) {
        if (c == '\n' && prev != '\n') n++;
        prev = c;
    }
    if (prev != '\n') n++;
    fclose(f);
    return n;
}

char *al_file_read(const char *path, size_t *len_out, char *errstr, size_t errlen)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        al_err(errstr, errlen, "cannot open %s: %s", path, strerror(errno));
        return NULL;
    }
    /* A directory or a device (/dev/zero, named by a message on a topic) is refused before
     * it is read; a pipe (a shell's <(...)) is read to its end. */
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || !(S_ISREG(st.st_mode) || S_ISFIFO(st.st_mode))) {
        al_err(errstr, errlen, "%s: not a regular file", path);
        fclose(f);
        return NULL;
    }
    size_t cap = S_ISREG(st.st_mode) && st.st_size > 0 ? (size_t)st.st_size + 1 : 1 << 16, len = 0;
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

/* Writes all n bytes to fd, through EINTR; 0, or -1 with errno. */
static int write_all(int fd, const void *buf, size_t n)
{
    const char *p = buf;
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

int al_file_write_atomic2(const char *path, const void *a, size_t alen, const void *b,
                          size_t blen, char *errstr, size_t errlen)
{
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid()) >= (int)sizeof tmp)
        return al_err(errstr, errlen, "path too long: %s", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return al_err(errstr, errlen, "cannot create %s: %s", tmp, strerror(errno));
    if (write_all(fd, a, alen) != 0 || write_all(fd, b, blen) != 0) {
        int e = errno;
        close(fd);
        unlink(tmp);
        return al_err(errstr, errlen, "cannot write %s: %s", tmp, strerror(e));
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

int al_file_write_atomic(const char *path, const void *buf, size_t len, char *errstr,
                         size_t errlen)
{
    return al_file_write_atomic2(path, buf, len, NULL, 0, errstr, errlen);
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


int al_secret_eq(const char *a, size_t n, const char *secret)
{
    size_t kl = strlen(secret);
    unsigned char d = (unsigned char)(n != kl);
    for (size_t i = 0; i < kl; i++)
        d |= (unsigned char)(secret[i] ^ (i < n ? a[i] : 0));
    return d == 0;
}
