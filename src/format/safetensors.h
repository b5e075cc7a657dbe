/*
 * safetensors.h — a validating, mmap-backed reader for Hugging Face safetensors files, single or sharded.
 *
 * Layout of one file: u64 little-endian header length N, N bytes of JSON {name: {dtype, shape, data_offsets}},
 * then the data section. Every tensor is checked before anything is returned: offsets inside the data section,
 * no two tensors overlapping, dtype size × shape == byte length (checked arithmetic), rank <= MOET_ST_MAX_DIMS.
 * A file that fails any check is rejected as a whole with a message naming the file and the tensor; the set is
 * left as it was before the call (no partial state).
 */
#ifndef MOET_FORMAT_SAFETENSORS_H
#define MOET_FORMAT_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "core/util.h"

#define MOET_ST_MAX_DIMS 8
#define MOET_ST_MAX_HEADER (256u << 20) /* the reference implementation caps headers at 100 MB; allow a bit more */

typedef enum {
    MOET_ST_BOOL, MOET_ST_U8, MOET_ST_I8, MOET_ST_I16, MOET_ST_U16, MOET_ST_I32, MOET_ST_U32, MOET_ST_I64,
    MOET_ST_U64, MOET_ST_F16, MOET_ST_BF16, MOET_ST_F32, MOET_ST_F64, MOET_ST_F8_E4M3, MOET_ST_F8_E5M2,
    MOET_ST_F8_E8M0, MOET_ST_DTYPE_COUNT
} moet_st_dtype;

const char *moet_st_dtype_name(moet_st_dtype t);
size_t moet_st_dtype_size(moet_st_dtype t);

typedef struct {
    char *name;
    moet_st_dtype dtype;
    int ndim;
    int64_t shape[MOET_ST_MAX_DIMS];
    const uint8_t *data; /* into the file's mapping */
    uint64_t nbytes;
    int file;            /* index into the set's files */
} moet_st_tensor;

typedef struct {
    int n_files;
    char **paths;
    moet_mmap *maps;
    size_t n_tensors;
    moet_st_tensor *tensors; /* sorted by name once moet_st_finish ran */
    int sorted;
} moet_st_set;

void moet_st_init(moet_st_set *s);
void moet_st_free(moet_st_set *s);
/* Parses, validates and adds one file's tensors. On error the set is unchanged. */
int moet_st_add_file(moet_st_set *s, const char *path, char *err, size_t errlen);
/* Loads a checkpoint directory: model.safetensors.index.json (sharded) or model.safetensors. */
int moet_st_open_dir(moet_st_set *s, const char *dir, char *err, size_t errlen);
/* Sorts by name and rejects duplicates across files. Called by moet_st_open_dir. */
int moet_st_finish(moet_st_set *s, char *err, size_t errlen);
/* Parses and validates a safetensors image in memory (label names it in errors); nothing is kept. For fuzzing. */
int moet_st_validate_buffer(const char *label, const void *data, size_t size, char *err, size_t errlen);
const moet_st_tensor *moet_st_find(const moet_st_set *s, const char *name);
/* "[a, b, c]" into buf. */
const char *moet_st_shape_str(const moet_st_tensor *t, char *buf, size_t cap);

#endif
