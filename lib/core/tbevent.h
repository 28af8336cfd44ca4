/*
 * tbevent.h: TensorBoard event files, written from C (scalars only).
 *
 * A file is a sequence of TFRecords: a little-endian u64 length, the masked CRC32C of those
 * eight bytes, the data, the masked CRC32C of the data (mask: rotate right 15, add
 * 0xa282ead8). Each record's data is a serialized tensorflow `Event` protobuf: the first
 * holds file_version "brain.Event:2", each later one a wall_time, a step and a Summary with
 * one simple_value per tag. TensorBoard, tensorboardX and tf.summary read it as their own.
 *
 * The file is DIR/events.out.tfevents.SECONDS.HOST.PID.NAME (DIR made if missing); every
 * al_tb_scalars call appends and flushes, so a TensorBoard pointed at DIR sees each step as
 * it is written. One writer per directory: TensorBoard reads a directory's files one after
 * the other, so two writers that interleave should each have a directory of their own.
 */
#ifndef ARCLIGHT_CORE_TBEVENT_H
#define ARCLIGHT_CORE_TBEVENT_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef struct al_tb_writer {
    FILE *f; /* NULL: closed (al_tb_scalars then does nothing) */
    char path[4096];
} al_tb_writer;

/* One scalar of a step: its tag ("reward/train") and value. */
typedef struct al_tb_scalar {
    const char *tag;
    double value; /* stored as a float, as TensorBoard's simple_value is */
} al_tb_scalar;

/* Opens a new event file in dir (made with its parents), name ending its file name, and
 * writes the file_version record. 0, or -1 with errstr (w left closed). */
int al_tb_open(al_tb_writer *w, const char *dir, const char *name, char *errstr, size_t errlen);
/* Appends one Event at step with wall_time (seconds since the epoch) and the n scalars, and
 * flushes it. 0, or -1 with errstr (a write error; w stays open). */
int al_tb_scalars(al_tb_writer *w, int64_t step, double wall_time, const al_tb_scalar *s, size_t n,
                  char *errstr, size_t errlen);
/* Closes the file (a closed or zeroed writer is fine). */
void al_tb_close(al_tb_writer *w);

/* CRC32C (Castagnoli) of n bytes, and the masked form TFRecords carry. */
uint32_t al_crc32c(const void *data, size_t n);
uint32_t al_tb_masked_crc(const void *data, size_t n);

#endif
