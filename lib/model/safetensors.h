/*
 * safetensors.h: Hugging Face's safetensors format for the model's weights.
 *
 * A file is an 8-byte little-endian header length N, N bytes of JSON mapping each tensor
 * name to {"dtype", "shape", "data_offsets": [begin, end]} (offsets relative to the byte
 * after the header, optional "__metadata__" of strings), then the raw little-endian data.
 * F32 and BF16 are read (BF16 widened to f32) and written (f32 rounded to nearest even,
 * NaN kept a NaN). F16 is read too. Every other dtype is an error.
 *
 * Everything in a file is untrusted: each length, offset and shape is checked before use,
 * and every failure is an error naming the file and tensor, never a crash.
 */
#ifndef ARCLIGHT_MODEL_SAFETENSORS_H
#define ARCLIGHT_MODEL_SAFETENSORS_H

#include "model/model.h"

#include <stddef.h>
#include <stdint.h>

typedef enum al_st_dtype {
    AL_ST_DTYPE_F32,
    AL_ST_DTYPE_BF16,
    AL_ST_DTYPE_F16,
} al_st_dtype;

/* One tensor of a parsed file. `data` points into the file's bytes. */
typedef struct al_st_tensor {
    char *name; /* NUL-terminated */
    al_st_dtype dtype;
    int ndim; /* 0..8 */
    int64_t shape[8];
    size_t numel;
    const uint8_t *data;
    size_t nbytes;
} al_st_tensor;

/* A parsed file: its bytes (owned) and its tensors, in header order. */
typedef struct al_st_file {
    uint8_t *bytes;
    size_t len;
    al_st_tensor *tensors;
    size_t ntensors;
    int mapped; /* bytes is an mmap of the file (al_st_open), else malloc'd */
} al_st_file;

/* Parses `len` bytes (takes ownership of `bytes`, a malloc'd buffer, even on failure).
 * `what` names the source in errors (a path). 0, or -1 with errstr: truncated header,
 * header length past the end, bad JSON, unknown dtype, shape/offset mismatch, offsets out
 * of range or overlapping, duplicate names. */
int al_st_parse(al_st_file *f, uint8_t *bytes, size_t len, const char *what, char *errstr,
                size_t errlen);
/* Maps the file at `path` read-only and parses it. */
int al_st_open(al_st_file *f, const char *path, char *errstr, size_t errlen);
void al_st_close(al_st_file *f);
const al_st_tensor *al_st_find(const al_st_file *f, const char *name);

/* Converts a tensor's data to f32 into `out` (numel floats). */
void al_st_tensor_to_f32(const al_st_tensor *t, float *out);

/* f32 <-> bf16 (round to nearest even; NaN stays NaN). */
uint16_t al_f32_to_bf16(float x);
float al_bf16_to_f32(uint16_t h);

/* Loads a model's weights into m's parameters from `path`: a model.safetensors file, a
 * model.safetensors.index.json (sharded; the shards next to it), or a directory holding
 * either. Every tensor of the model must be present with its exact shape (lm_head.weight
 * is absent when tied, and ignored if a tied file carries it anyway); extra tensors are an
 * error too (a config that does not match the weights). 0 or -1 with errstr. */
int al_model_load_safetensors(al_model *m, const char *path, char *errstr, size_t errlen);

/* The same from one already parsed file (e.g. bytes received over HTTP and given to
 * al_st_parse); `what` names it in errors. */
int al_model_load_st(al_model *m, const al_st_file *f, const char *what, char *errstr,
                     size_t errlen);

/* Writes m's parameters as `path` (a .safetensors file) in `dtype` (F32 or BF16), with
 * Hugging Face names, {"format": "pt"} metadata, no lm_head.weight when tied. The file is
 * written to a temporary name and renamed into place. 0 or -1 with errstr. */
int al_model_save_safetensors(const al_model *m, const char *path, al_st_dtype dtype, char *errstr,
                              size_t errlen);

/* Writes DIR/config.json and DIR/model.safetensors (DIR is created if missing). */
int al_model_save_dir(const al_model *m, const char *dir, al_st_dtype dtype, char *errstr,
                      size_t errlen);

/* Reads DIR/config.json, builds a model of that shape and loads DIR's weights into it.
 * NULL with errstr on any failure. */
al_model *al_model_load_dir(const char *dir, char *errstr, size_t errlen);

/* Whether DIR holds a whole model: config.json (al_model_save_dir writes it last, by rename)
 * and model.safetensors or its shard index. */
int al_model_dir_ready(const char *dir);

/* Waits up to timeout_s seconds (polling every 200 ms) for al_model_dir_ready(DIR): a stage
 * started before the job that writes its model has finished (compose starts them in any
 * order). 0 once ready (at once when it already is), -1 with errstr after the timeout. */
int al_model_dir_wait(const char *dir, int timeout_s, char *errstr, size_t errlen);


#endif
