/*
 * gguf.h — GGUF v3, the pack container: a validating mmap reader and a crash-safe writer.
 *
 * Layout (little-endian): "GGUF" | u32 version = 3 | u64 n_tensors | u64 n_kv | n_kv × (string key, u32 type,
 * value) | n_tensors × (string name, u32 n_dims, u64 ne[n_dims] (ne[0] innermost), u32 type, u64 offset) | padding
 * to general.alignment | data. A string is u64 length + bytes (no NUL). docs/format.md gives moet's keys and types.
 *
 * The reader checks every length against the bytes left, every tensor's byte size (type traits × shape, checked
 * arithmetic) and offset (aligned, inside the file, no overlap), known type IDs, unique keys and names; any failure
 * rejects the file with a message naming the offset, key or tensor.
 */
#ifndef MOET_FORMAT_GGUF_H
#define MOET_FORMAT_GGUF_H

#include <stddef.h>
#include <stdint.h>

#include "core/strmap.h"
#include "core/util.h"

enum {
    MOET_GGUF_U8 = 0, MOET_GGUF_I8 = 1, MOET_GGUF_U16 = 2, MOET_GGUF_I16 = 3, MOET_GGUF_U32 = 4, MOET_GGUF_I32 = 5,
    MOET_GGUF_F32 = 6, MOET_GGUF_BOOL = 7, MOET_GGUF_STRING = 8, MOET_GGUF_ARRAY = 9, MOET_GGUF_U64 = 10,
    MOET_GGUF_I64 = 11, MOET_GGUF_F64 = 12, MOET_GGUF_TYPE_COUNT
};

#define MOET_GGUF_MAX_DIMS 4
#define MOET_GGUF_DEFAULT_ALIGNMENT 32

typedef struct {
    char *key;
    uint32_t type;
    uint64_t u;          /* integer and bool values (sign-extended for signed types) */
    double f;            /* float values */
    const char *str;     /* STRING: into the map, not NUL-terminated */
    uint64_t str_len;
    uint32_t arr_type;   /* ARRAY */
    uint64_t arr_n;
    const uint8_t *arr;  /* ARRAY of fixed-size elements: raw little-endian data; of strings: first string */
} moet_gguf_kv;

typedef struct {
    char *name;
    int32_t type;
    int32_t n_dims;
    int64_t ne[MOET_GGUF_MAX_DIMS];
    uint64_t offset;     /* from the data section start */
    uint64_t nbytes;
    const uint8_t *data;
} moet_gguf_tensor;

typedef struct {
    moet_mmap map;
    char *path;
    uint32_t alignment;
    uint64_t n_kv, n_tensors;
    moet_gguf_kv *kv;
    moet_gguf_tensor *tensors;
    moet_strmap index;   /* tensor name -> index: packs hold tens of thousands of expert tensors */
} moet_gguf;

/* Opens and validates; on error *g is left empty. */
int moet_gguf_open(const char *path, moet_gguf *g, char *err, size_t errlen);
/* Validates an in-memory image (fuzzing); nothing is kept. */
int moet_gguf_validate_buffer(const void *data, size_t size, char *err, size_t errlen);
void moet_gguf_close(moet_gguf *g);
const moet_gguf_kv *moet_gguf_find_kv(const moet_gguf *g, const char *key);
const moet_gguf_tensor *moet_gguf_find_tensor(const moet_gguf *g, const char *name);
/* Typed getters: 0 on success; integer getters accept any integer type whose value fits. */
int moet_gguf_get_i64(const moet_gguf *g, const char *key, int64_t *out);
int moet_gguf_get_f64(const moet_gguf *g, const char *key, double *out);
/* malloc'd NUL-terminated copy */
int moet_gguf_get_str(const moet_gguf *g, const char *key, char **out);

/* ---- writer ---- */
typedef struct moet_gguf_writer moet_gguf_writer;
/* Writes to path + ".tmp"; moet_gguf_writer_finish fsyncs and renames to path, so an interrupted write leaves no
 * file under the final name. */
moet_gguf_writer *moet_gguf_writer_create(const char *path, uint32_t alignment);
int moet_gguf_writer_kv_u32(moet_gguf_writer *w, const char *key, uint32_t v);
int moet_gguf_writer_kv_i32(moet_gguf_writer *w, const char *key, int32_t v);
int moet_gguf_writer_kv_f32(moet_gguf_writer *w, const char *key, float v);
int moet_gguf_writer_kv_bool(moet_gguf_writer *w, const char *key, int v);
int moet_gguf_writer_kv_str(moet_gguf_writer *w, const char *key, const char *s, size_t len);
int moet_gguf_writer_kv_arr_i32(moet_gguf_writer *w, const char *key, const int32_t *v, size_t n);
/* Adds a tensor (tensor i: the i-th added); data must stay valid until begin (or finish) writes it, or NULL: a
 * deferred tensor, written later by moet_gguf_writer_put. align: its offset is a multiple of this (>= alignment,
 * a multiple of it; 4096 for the first tensor of an expert record). */
int moet_gguf_writer_tensor(moet_gguf_writer *w, const char *name, int32_t type, int n_dims, const int64_t *ne,
                            const void *data, uint64_t nbytes, uint64_t align);
size_t moet_gguf_writer_n_tensors(const moet_gguf_writer *w);
/* Streaming writes (a pack's experts, written as they are quantized, none held back): once every tensor is added,
 * begin lays out the file and writes the header and the data given so far; put writes deferred tensor i (its
 * nbytes from data; any order, from several threads at once: positional writes); finish fails if one was never put.
 * Without begin, finish does it all (every tensor's data given at add). */
int moet_gguf_writer_begin(moet_gguf_writer *w, char *err, size_t errlen);
int moet_gguf_writer_put(moet_gguf_writer *w, size_t i, const void *data); /* 0, or -1 (errno) */
int moet_gguf_writer_finish(moet_gguf_writer *w, char *err, size_t errlen); /* frees w */
void moet_gguf_writer_abort(moet_gguf_writer *w);                           /* removes the temporary, frees w */

#endif
