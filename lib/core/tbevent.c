/*
 * tbevent.c: TensorBoard event files (see tbevent.h): CRC32C, the TFRecord framing and the
 * few fields of tensorflow's Event and Summary protobufs a scalar needs, encoded by hand:
 *
 *   Event   { double wall_time = 1; int64 step = 2; string file_version = 3;
 *             Summary summary = 5; }
 *   Summary { repeated Value value = 1; }
 *   Value   { string tag = 1; float simple_value = 2; }
 */
#include "core/tbevent.h"

#include "core/buf.h"
#include "core/util.h"

#include <errno.h>
#include <pthread.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* ------------------------------------------------------------------------------------------
 * CRC32C: the reflected Castagnoli polynomial, a byte at a time from a table made once
 * ------------------------------------------------------------------------------------------ */

static uint32_t crc_table[256];
static pthread_once_t crc_once = PTHREAD_ONCE_INIT;

static void crc_table_make(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = c & 1 ? (c >> 1) ^ 0x82f63b78u : c >> 1;
        crc_table[i] = c;
    }
}

uint32_t al_crc32c(const void *data, size_t n)
{
    pthread_once(&crc_once, crc_table_make);
    const unsigned char *p = data;
    uint32_t c = 0xffffffffu;
    for (size_t i = 0; i < n; i++)
        c = crc_table[(c ^ p[i]) & 0xff] ^ (c >> 8);
    return c ^ 0xffffffffu;
}

uint32_t al_tb_masked_crc(const void *data, size_t n)
{
    uint32_t c = al_crc32c(data, n);
    return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

/* ------------------------------------------------------------------------------------------
 * Protobuf: varints, keys, length-delimited fields, fixed 32- and 64-bit values
 * ------------------------------------------------------------------------------------------ */

static void pb_varint(al_buf *b, uint64_t v)
{
    unsigned char tmp[10];
    size_t n = 0;
    do {
        tmp[n++] = (unsigned char)((v & 0x7f) | (v > 0x7f ? 0x80 : 0));
        v >>= 7;
    } while (v);
    al_buf_append(b, tmp, n);
}

/* wire types: 0 varint, 1 fixed64, 2 length-delimited, 5 fixed32 */
static void pb_key(al_buf *b, unsigned field, unsigned wire)
{
    pb_varint(b, (uint64_t)field << 3 | wire);
}

static void pb_bytes(al_buf *b, unsigned field, const void *data, size_t n)
{
    pb_key(b, field, 2);
    pb_varint(b, n);
    al_buf_append(b, data, n);
}

static void pb_le(al_buf *b, uint64_t v, int nbytes)
{
    unsigned char tmp[8];
    for (int i = 0; i < nbytes; i++)
        tmp[i] = (unsigned char)(v >> (8 * i));
    al_buf_append(b, tmp, (size_t)nbytes);
}

static void pb_double(al_buf *b, unsigned field, double d)
{
    uint64_t bits;
    memcpy(&bits, &d, sizeof bits);
    pb_key(b, field, 1);
    pb_le(b, bits, 8);
}

static void pb_float(al_buf *b, unsigned field, float f)
{
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    pb_key(b, field, 5);
    pb_le(b, bits, 4);
}

/* ------------------------------------------------------------------------------------------
 * Records and the file
 * ------------------------------------------------------------------------------------------ */

/* Writes data as one TFRecord and flushes. 0, or -1 with errstr. */
static int tb_record(al_tb_writer *w, const al_buf *data, char *errstr, size_t errlen)
{
    if (data->oom) return al_err(errstr, errlen, "%s: out of memory", w->path);
    unsigned char head[12];
    uint64_t len = data->len;
    for (int i = 0; i < 8; i++)
        head[i] = (unsigned char)(len >> (8 * i));
    uint32_t lc = al_tb_masked_crc(head, 8), dc = al_tb_masked_crc(data->data, data->len);
    for (int i = 0; i < 4; i++)
        head[8 + i] = (unsigned char)(lc >> (8 * i));
    unsigned char tail[4];
    for (int i = 0; i < 4; i++)
        tail[i] = (unsigned char)(dc >> (8 * i));
    if (fwrite(head, 1, sizeof head, w->f) != sizeof head ||
        fwrite(data->data, 1, data->len, w->f) != data->len ||
        fwrite(tail, 1, sizeof tail, w->f) != sizeof tail || fflush(w->f))
        return al_err(errstr, errlen, "%s: %s", w->path, strerror(errno));
    return 0;
}

/* mkdir -p; 0, or -1 with errstr */
static int tb_mkdirs(const char *dir, char *errstr, size_t errlen)
{
    char p[4096];
    if (snprintf(p, sizeof p, "%s", dir) >= (int)sizeof p)
        return al_err(errstr, errlen, "the TensorBoard directory's name is too long");
    for (char *s = p + 1;; s++) {
        char c = *s;
        if (c != '/' && c) continue;
        *s = 0;
        if (mkdir(p, 0777) && errno != EEXIST)
            return al_err(errstr, errlen, "cannot make %s: %s", p, strerror(errno));
        *s = c;
        if (!c) return 0;
    }
}

static double tb_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

int al_tb_open(al_tb_writer *w, const char *dir, const char *name, char *errstr, size_t errlen)
{
    memset(w, 0, sizeof *w);
    if (!dir || !*dir) return al_err(errstr, errlen, "no TensorBoard directory given");
    if (tb_mkdirs(dir, errstr, errlen)) return -1;
    char host[256] = "localhost";
    gethostname(host, sizeof host - 1);
    double now = tb_now();
    if (snprintf(w->path, sizeof w->path, "%s/events.out.tfevents.%lld.%s.%d.%s", dir,
                 (long long)now, host, (int)getpid(), name ? name : "arclight") >=
        (int)sizeof w->path)
        return al_err(errstr, errlen, "the TensorBoard directory's name is too long");
    if (!(w->f = fopen(w->path, "wb")))
        return al_err(errstr, errlen, "cannot create %s: %s", w->path, strerror(errno));
    al_buf b = {0};
    pb_double(&b, 1, now);
    pb_bytes(&b, 3, "brain.Event:2", strlen("brain.Event:2"));
    int rc = tb_record(w, &b, errstr, errlen);
    al_buf_free(&b);
    if (rc) al_tb_close(w);
    return rc;
}

int al_tb_scalars(al_tb_writer *w, int64_t step, double wall_time, const al_tb_scalar *s, size_t n,
                  char *errstr, size_t errlen)
{
    if (!w->f) return 0;
    al_buf summary = {0}, value = {0}, ev = {0};
    for (size_t i = 0; i < n; i++) {
        al_buf_reset(&value);
        pb_bytes(&value, 1, s[i].tag, strlen(s[i].tag));
        pb_float(&value, 2, (float)s[i].value);
        pb_bytes(&summary, 1, value.data, value.len);
    }
    pb_double(&ev, 1, wall_time);
    pb_key(&ev, 2, 0);
    pb_varint(&ev, (uint64_t)step); /* int64: a negative step is ten bytes, as protobuf says */
    pb_bytes(&ev, 5, summary.data ? summary.data : "", summary.len);
    int rc = summary.oom || value.oom ? al_err(errstr, errlen, "%s: out of memory", w->path)
                                      : tb_record(w, &ev, errstr, errlen);
    al_buf_free(&summary);
    al_buf_free(&value);
    al_buf_free(&ev);
    return rc;
}

void al_tb_close(al_tb_writer *w)
{
    if (w->f) fclose(w->f);
    w->f = NULL;
}
