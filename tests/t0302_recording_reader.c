/* 0302: replay's recording reader (tools/recording_reader.c), in process: it reads back
 * exactly what avro-c's writer wrote in every codec, and a damaged file (every byte
 * flipped, every truncation) gives an error, never a crash or a sanitizer report. */
#include "testlib.h"
#include "support.h"

#include "avro/registry.h"
#include "recording_reader.h"

#include <avro.h>
#include <unistd.h>

#define NREC 60

static char path_null[64], path_deflate[64], path_snappy[64];

static void set_nullable(avro_value_t *u, const void *p, size_t n)
{
    avro_value_t b;
    if (!p) {
        avro_value_set_branch(u, 0, &b);
        avro_value_set_null(&b);
    } else {
        avro_value_set_branch(u, 1, &b);
        avro_value_set_bytes(&b, (void *)p, n);
    }
}

/* Record i's fields, so that reading can check them. */
static void expected(int i, char *topic, size_t tn, unsigned char *val, size_t *vlen)
{
    snprintf(topic, tn, "topic.%d", i % 3);
    *vlen = (size_t)(i * 13 % 200);
    for (size_t j = 0; j < *vlen; j++)
        val[j] = (unsigned char)(i + j * 29);
}

/* Writes NREC records with avro-c, the way `arclight record` does. 0 or -1. */
static int write_recording(const char *path, const char *codec)
{
    const al_schema_info *si = al_schema_by_name("ai.arclight.Recording");
    if (!si) return -1;
    avro_schema_t sch;
    if (avro_schema_from_json_length(si->json, strlen(si->json), &sch) != 0) return -1;
    avro_value_iface_t *iface = avro_generic_class_from_schema(sch);
    avro_value_t rec, f, arr, h, hf;
    avro_generic_value_new(iface, &rec);
    avro_file_writer_t w;
    /* small blocks: many block boundaries in a small file */
    if (avro_file_writer_create_with_codec(path, sch, &w, codec, 1024) != 0) return -1;
    for (int i = 0; i < NREC; i++) {
        char topic[32];
        unsigned char val[256];
        size_t vlen;
        expected(i, topic, sizeof topic, val, &vlen);
        avro_value_reset(&rec);
        avro_value_get_by_name(&rec, "topic", &f, NULL);
        avro_value_set_string(&f, topic);
        avro_value_get_by_name(&rec, "partition", &f, NULL);
        avro_value_set_int(&f, i % 5);
        avro_value_get_by_name(&rec, "offset", &f, NULL);
        avro_value_set_long(&f, 1000 + i);
        avro_value_get_by_name(&rec, "timestamp", &f, NULL);
        avro_value_set_long(&f, i == 7 ? -1 : 1764441000000LL + i);
        avro_value_get_by_name(&rec, "timestamp_type", &f, NULL);
        avro_value_set_enum(&f, i == 7 ? 0 : 1);
        avro_value_get_by_name(&rec, "key", &f, NULL);
        set_nullable(&f, i % 4 == 0 ? NULL : "key", 3);
        avro_value_get_by_name(&rec, "value", &f, NULL);
        set_nullable(&f, i % 9 == 0 ? NULL : val, vlen);
        avro_value_get_by_name(&rec, "headers", &arr, NULL);
        for (int k = 0; k < i % 3; k++) {
            avro_value_append(&arr, &h, NULL);
            avro_value_get_by_name(&h, "name", &hf, NULL);
            avro_value_set_string(&hf, k ? "second" : "first");
            avro_value_get_by_name(&h, "value", &hf, NULL);
            set_nullable(&hf, k ? NULL : "hv", 2);
        }
        if (avro_file_writer_append_value(w, &rec) != 0) return -1;
    }
    avro_file_writer_close(w);
    avro_value_decref(&rec);
    avro_value_iface_decref(iface);
    avro_schema_decref(sch);
    return 0;
}

TEST(reads_back_exactly_what_avro_c_wrote_in_every_codec)
{
    snprintf(path_null, sizeof path_null, "/tmp/arclight-t0302-%d-null.avro", (int)getpid());
    snprintf(path_deflate, sizeof path_deflate, "/tmp/arclight-t0302-%d-deflate.avro",
             (int)getpid());
    snprintf(path_snappy, sizeof path_snappy, "/tmp/arclight-t0302-%d-snappy.avro", (int)getpid());
    const char *paths[] = {path_null, path_deflate, path_snappy};
    const char *codecs[] = {"null", "deflate", "snappy"};
    for (int c = 0; c < 3; c++) {
        REQUIREF(write_recording(paths[c], codecs[c]) == 0, "avro-c: %s", avro_strerror());
        char err[512];
        al_recording_reader *r = al_recording_open(paths[c], err, sizeof err);
        REQUIREF(r, "%s: %s", codecs[c], err);
        CHECK_EQ_STR(al_recording_codec(r), codecs[c]);
        CHECK_EQ_INT(al_recording_count(r, err, sizeof err), NREC);
        al_recorded m;
        int i = 0, rc;
        while ((rc = al_recording_next(r, &m, err, sizeof err)) == 1) {
            char topic[32];
            unsigned char val[256];
            size_t vlen;
            expected(i, topic, sizeof topic, val, &vlen);
            CHECK_EQ_STR(m.topic, topic);
            CHECK_EQ_INT(m.partition, i % 5);
            CHECK_EQ_INT(m.offset, 1000 + i);
            CHECK_EQ_INT(m.timestamp, i == 7 ? -1 : 1764441000000LL + i);
            CHECK_EQ_INT(m.timestamp_type, i == 7 ? 0 : 1);
            if (i % 4 == 0)
                CHECK(m.key == NULL);
            else
                CHECK(m.key && m.key_len == 3 && memcmp(m.key, "key", 3) == 0);
            if (i % 9 == 0)
                CHECK(m.value == NULL);
            else
                CHECKF(m.value && m.value_len == vlen && memcmp(m.value, val, vlen) == 0,
                       "%s: record %d value differs", codecs[c], i);
            CHECK_EQ_INT(m.n_headers, i % 3);
            if (m.n_headers >= 1) {
                CHECK(m.headers[0].name_len == 5 && memcmp(m.headers[0].name, "first", 5) == 0);
                CHECK(m.headers[0].value_len == 2 && memcmp(m.headers[0].value, "hv", 2) == 0);
            }
            if (m.n_headers == 2) CHECK(m.headers[1].value == NULL);
            i++;
        }
        CHECKF(rc == 0, "%s: %s", codecs[c], err);
        CHECK_EQ_INT(i, NREC);
        al_recording_close(r);
    }
}

/* Reads a whole (possibly damaged) file; returns records read before the end or error. */
static int read_all(const char *path, int *failed)
{
    char err[512];
    al_recorded m;
    int n = 0, rc = -1;
    *failed = 1;
    al_recording_reader *r = al_recording_open(path, err, sizeof err);
    if (!r) return 0;
    al_recording_count(r, err, sizeof err);
    while ((rc = al_recording_next(r, &m, err, sizeof err)) == 1)
        n++;
    *failed = rc < 0;
    if (rc < 0) CHECKF(strlen(err) > 10, "an error without a reason");
    al_recording_close(r);
    return n;
}

static void spit(const char *path, const unsigned char *b, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f) return;
    fwrite(b, 1, n, f);
    fclose(f);
}

TEST(damaged_files_give_errors_not_crashes)
{
    const char *paths[] = {path_null, path_deflate, path_snappy};
    const char *codecs_names[] = {"null", "deflate", "snappy"};
    char scratch[64];
    snprintf(scratch, sizeof scratch, "/tmp/arclight-t0302-%d-damaged.avro", (int)getpid());
    static const unsigned char values[] = {0x00, 0xff, 0x80};
    for (int c = 0; c < 3; c++) {
        size_t n;
        unsigned char *orig = (unsigned char *)al_test_slurp(paths[c], &n);
        REQUIRE(orig);
        unsigned char *b = malloc(n);
        int errors = 0, runs = 0;
        /* bytes replaced by a few telling values: every 4th byte of the blocks, a sample of
         * the header's schema text */
        for (size_t pos = 0; pos < n; pos += (pos > 40 && pos < 1500) ? 61 : 4) {
            for (size_t v = 0; v < sizeof values; v++) {
                if (orig[pos] == values[v]) continue;
                memcpy(b, orig, n);
                b[pos] = values[v];
                spit(scratch, b, n);
                int failed;
                read_all(scratch, &failed);
                errors += failed;
                runs++;
            }
        }
        /* every truncation */
        for (size_t len = 0; len < n; len += (len < 1600 ? 37 : 5)) {
            spit(scratch, orig, len);
            int failed;
            int got = read_all(scratch, &failed);
            CHECKF(failed || got < NREC, "a file cut at %zu of %zu bytes read as complete", len, n);
        }
        /* framing damage is refused; with no codec a flipped payload byte reads back as a
         * different but well-formed record, while deflate and snappy (CRC-32) catch most */
        CHECKF(errors > 0 && (c != 0 || errors < runs), "%s: %d of %d damaged files refused",
               codecs_names[c], errors, runs);
        free(b);
        free(orig);
        unlink(paths[c]);
    }
    unlink(scratch);
}
