/*
 * buf.h: the one growable byte buffer (Avro encoders, JSON and SSE writers, the metrics
 * exposition, reports). Zero-initialise it (or al_buf_init) and free it with al_buf_free.
 *
 * data is malloc'd and, once anything was appended, NUL-terminated: one byte past len is
 * always reserved, so a buffer of text is a C string as it stands (a writer that stores into
 * data directly after al_buf_reserve, as the Avro encoders do, leaves that byte alone). An allocation that fails
 * sets oom; every append after that does nothing and returns -1, so that a writer may check
 * once at the end (data then holds what fit, never a hole). al_buf_reset clears it.
 */
#ifndef ARCLIGHT_CORE_BUF_H
#define ARCLIGHT_CORE_BUF_H

#include <stddef.h>

typedef struct al_buf {
    char *data; /* NULL until the first append; owned by the buffer */
    size_t len, cap;
    int oom;
} al_buf;

void al_buf_init(al_buf *b);
void al_buf_free(al_buf *b);
/* Empties the buffer (len 0, oom cleared) and keeps its memory for reuse. */
void al_buf_reset(al_buf *b);
/* Makes room for n more bytes (and the NUL after them); 0, or -1 on overflow or when out of
 * memory (oom set; b otherwise unchanged). */
int al_buf_reserve(al_buf *b, size_t n);
/* Appends n bytes; 0, or -1 (nothing appended). */
int al_buf_append(al_buf *b, const void *data, size_t n);
/* Appends a C string; 0 or -1. */
int al_buf_puts(al_buf *b, const char *s);
/* Appends formatted text; 0 or -1. */
int al_buf_printf(al_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Hands the bytes to the caller (who frees them; NUL-terminated, never NULL unless out of
 * memory) and leaves b empty. *len_out (if given) gets the length. */
char *al_buf_detach(al_buf *b, size_t *len_out);

#endif
