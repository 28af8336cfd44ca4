/*
 * recording_reader.h: reads the Avro object container files `arclight record` writes, for
 * `arclight replay`. Its own decoder, not avro-c's: avro-c 1.11 trusts the lengths in its
 * input (a crafted file makes it ask malloc for exabytes), while here every length is
 * checked against what is left of the block and every block against what is left of the
 * file. Codecs: null, deflate (zlib) and snappy (decoded here, CRC-32 checked).
 *
 * The file's writer schema must be a known version of ai.arclight.Recording (compared by
 * CRC-64-AVRO fingerprint of its Parsing Canonical Form, lib/avro/registry.h).
 */
#ifndef ARCLIGHT_TOOLS_RECORDING_READER_H
#define ARCLIGHT_TOOLS_RECORDING_READER_H

#include <stddef.h>
#include <stdint.h>

typedef struct al_recording_header {
    const char *name; /* NOT NUL-terminated: name_len bytes */
    size_t name_len;
    const uint8_t *value; /* NULL: a header without a value */
    size_t value_len;
} al_recording_header;

/* One recorded message. Everything points into the reader and stays valid until the next
 * al_recording_next or al_recording_close. */
typedef struct al_recorded {
    const char *topic; /* NUL-terminated */
    int32_t partition;
    int64_t offset;
    int64_t timestamp;  /* ms since the epoch; -1: none */
    int timestamp_type; /* 0 none, 1 create time, 2 log-append time */
    const uint8_t *key; /* NULL: no key */
    size_t key_len;
    const uint8_t *value; /* NULL: tombstone */
    size_t value_len;
    const al_recording_header *headers;
    size_t n_headers;
} al_recorded;

typedef struct al_recording_reader al_recording_reader;

/* Opens a recording and reads its container header. NULL with errstr: unreadable file, not
 * an Avro container, not a Recording, unknown codec. */
al_recording_reader *al_recording_open(const char *path, char *errstr, size_t errlen);

/* The next message: 1 (filled m), 0 at the end of the file, -1 with errstr naming the
 * record's index and what is wrong (truncation, a bad length, a bad sync marker, ...). */
int al_recording_next(al_recording_reader *r, al_recorded *m, char *errstr, size_t errlen);

/* The number of records, from the block headers (a quick pass that does not decompress);
 * -1 with errstr when the framing is broken. Leaves the read position where it was. */
long long al_recording_count(al_recording_reader *r, char *errstr, size_t errlen);

/* The codec named in the file ("null", "deflate", "snappy"). */
const char *al_recording_codec(const al_recording_reader *r);

void al_recording_close(al_recording_reader *r);

#endif
