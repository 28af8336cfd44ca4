/*
 * fuzz_recording: libFuzzer target for replay's recording reader (tools/recording_reader.c),
 * which reads Avro container files a user hands to `arclight replay`. Each input is a whole
 * file (the seed corpus, tests/fuzz/recording_corpus, holds small recordings in the null,
 * deflate and snappy codecs); it is opened from a memfd and read to the end or the first
 * error, the block-header count included.
 *
 * Build: tests/tools.cmake (clang-14 -fsanitize=fuzzer,address,undefined).
 * Run:   build-asan/fuzz_recording -max_total_time=60 /tmp/fuzz-new tests/fuzz/recording_corpus
 */
#define _GNU_SOURCE /* memfd_create */
#include "recording_reader.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char err[512], path[64];
    int fd = memfd_create("recording", 0);
    if (fd < 0) return 0;
    if (size && write(fd, data, size) != (ssize_t)size) {
        close(fd);
        return 0;
    }
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    al_recording_reader *r = al_recording_open(path, err, sizeof err);
    if (r) {
        al_recorded m;
        long long total = al_recording_count(r, err, sizeof err);
        long long n = 0;
        int rc;
        while ((rc = al_recording_next(r, &m, err, sizeof err)) == 1) {
            /* touch every byte the reader hands out, so that ASan sees a bad pointer */
            volatile uint8_t sink = 0;
            for (size_t i = 0; i < m.key_len; i++)
                sink ^= m.key[i];
            for (size_t i = 0; i < m.value_len; i++)
                sink ^= m.value[i];
            for (size_t h = 0; h < m.n_headers; h++) {
                for (size_t i = 0; i < m.headers[h].name_len; i++)
                    sink ^= (uint8_t)m.headers[h].name[i];
                for (size_t i = 0; i < m.headers[h].value_len; i++)
                    sink ^= m.headers[h].value[i];
            }
            sink ^= (uint8_t)strlen(m.topic);
            (void)sink;
            n++;
        }
        /* a file read to its end holds as many records as its block headers say */
        if (rc == 0 && total >= 0 && n != total) __builtin_trap();
        al_recording_close(r);
    }
    close(fd);
    return 0;
}
