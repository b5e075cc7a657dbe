/* safetensors.c — see safetensors.h. The JSON header is parsed with jansson (duplicate keys rejected). */
#include "safetensors.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const struct { const char *name; size_t size; } k_dtypes[MOET_ST_DTYPE_COUNT] = {
    [MOET_ST_BOOL] = {"BOOL", 1}, [MOET_ST_U8] = {"U8", 1},      [MOET_ST_I8] = {"I8", 1},
    [MOET_ST_I16] = {"I16", 2},   [MOET_ST_U16] = {"U16", 2},    [MOET_ST_I32] = {"I32", 4},
    [MOET_ST_U32] = {"U32", 4},   [MOET_ST_I64] = {"I64", 8},    [MOET_ST_U64] = {"U64", 8},
    [MOET_ST_F16] = {"F16", 2},   [MOET_ST_BF16] = {"BF16", 2},  [MOET_ST_F32] = {"F32", 4},
    [MOET_ST_F64] = {"F64", 8},   [MOET_ST_F8_E4M3] = {"F8_E4M3", 1}, [MOET_ST_F8_E5M2] = {"F8_E5M2", 1},
    [MOET_ST_F8_E8M0] = {"F8_E8M0", 1},
};

const char *moet_st_dtype_name(moet_st_dtype t) { return (unsigned)t < MOET_ST_DTYPE_COUNT ? k_dtypes[t].name : "?"; }
size_t moet_st_dtype_size(moet_st_dtype t) { return (unsigned)t < MOET_ST_DTYPE_COUNT ? k_dtypes[t].size : 0; }

static int dtype_parse(const char *s) {
    for (int i = 0; i < MOET_ST_DTYPE_COUNT; i++)
        if (strcmp(s, k_dtypes[i].name) == 0) return i;
    return -1;
}

void moet_st_init(moet_st_set *s) { memset(s, 0, sizeof(*s)); }

void moet_st_free(moet_st_set *s) {
    for (size_t i = 0; i < s->n_tensors; i++) free(s->tensors[i].name);
    for (int i = 0; i < s->n_files; i++) {
        moet_mmap_close(&s->maps[i]);
        free(s->paths[i]);
    }
    free(s->tensors);
    free(s->maps);
    free(s->paths);
    memset(s, 0, sizeof(*s));
}

const char *moet_st_shape_str(const moet_st_tensor *t, char *buf, size_t cap) {
    size_t o = 0;
    o += (size_t)snprintf(buf + o, cap - o, "[");
    for (int i = 0; i < t->ndim && o < cap; i++)
        o += (size_t)snprintf(buf + o, cap - o, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
    if (o < cap) snprintf(buf + o, cap - o, "]");
    return buf;
}

static int cmp_begin(const void *a, const void *b) {
    const moet_st_tensor *x = a, *y = b;
    const uint8_t *pa = x->data, *pb = y->data;
    return pa < pb ? -1 : pa > pb ? 1 : 0;
}

/* Parses one file's header into a fresh tensor array; nothing is added to the set here. */
static int parse_header(const char *path, const moet_mmap *map, int file_index, moet_st_tensor **out, size_t *n_out,
                        char *err, size_t errlen) {
    *out = NULL;
    *n_out = 0;
    const uint8_t *base = map->data;
    if (map->size < 8)
        return moet_err(err, errlen, MOET_EFORMAT, "%s: truncated: %zu bytes, shorter than the 8-byte header length",
                        path, map->size);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | base[i];
    if (hlen > map->size - 8)
        return moet_err(err, errlen, MOET_EFORMAT, "%s: header length %llu runs past the end of the file (%zu bytes)",
                        path, (unsigned long long)hlen, map->size);
    if (hlen > MOET_ST_MAX_HEADER)
        return moet_err(err, errlen, MOET_EFORMAT, "%s: header length %llu exceeds the %u-byte limit", path,
                        (unsigned long long)hlen, MOET_ST_MAX_HEADER);
    if (hlen < 2) return moet_err(err, errlen, MOET_EFORMAT, "%s: header of %llu bytes is not JSON", path,
                                  (unsigned long long)hlen);
    const uint8_t *data0 = base + 8 + hlen;
    uint64_t data_size = map->size - 8 - hlen;

    json_error_t je;
    json_t *root = json_loadb((const char *)base + 8, (size_t)hlen, JSON_REJECT_DUPLICATES, &je);
    if (!root)
        return moet_err(err, errlen, MOET_EFORMAT, "%s: header is not valid JSON (line %d col %d): %s", path, je.line,
                        je.column, je.text);
    int rc = MOET_OK;
    moet_st_tensor *ts = NULL;
    size_t n = 0;
    if (!json_is_object(root)) {
        rc = moet_err(err, errlen, MOET_EFORMAT, "%s: header is not a JSON object", path);
        goto done;
    }
    size_t cap = json_object_size(root);
    ts = calloc(cap ? cap : 1, sizeof(*ts));
    if (!ts) { rc = moet_err(err, errlen, MOET_ENOMEM, "%s: out of memory", path); goto done; }
    const char *key;
    json_t *val;
    json_object_foreach(root, key, val) {
        if (strcmp(key, "__metadata__") == 0) {
            if (!json_is_object(val)) {
                rc = moet_err(err, errlen, MOET_EFORMAT, "%s: __metadata__ is not an object", path);
                goto done;
            }
            continue;
        }
        if (key[0] == 0) { rc = moet_err(err, errlen, MOET_EFORMAT, "%s: tensor with an empty name", path); goto done; }
        if (!json_is_object(val)) {
            rc = moet_err(err, errlen, MOET_EFORMAT, "%s: tensor '%s': entry is not an object", path, key);
            goto done;
        }
        json_t *jd = json_object_get(val, "dtype"), *js = json_object_get(val, "shape"),
               *jo = json_object_get(val, "data_offsets");
        if (!json_is_string(jd) || !json_is_array(js) || !json_is_array(jo)) {
            rc = moet_err(err, errlen, MOET_EFORMAT, "%s: tensor '%s': needs string dtype, array shape and data_offsets",
                          path, key);
            goto done;
        }
        int dt = dtype_parse(json_string_value(jd));
        if (dt < 0) {
            rc = moet_err(err, errlen, MOET_EFORMAT, "%s: tensor '%s': unknown dtype '%s'", path, key,
                          json_string_value(jd));
            goto done;
        }
        moet_st_tensor *t = &ts[n];
        t->dtype = (moet_st_dtype)dt;
        t->file = file_index;
        size_t nd = json_array_size(js);
        if (nd > MOET_ST_MAX_DIMS) {
            rc = moet_err(err, errlen, MOET_EFORMAT, "%s: tensor '%s': rank %zu exceeds %d", path, key, nd,
                          MOET_ST_MAX_DIMS);
            goto done;
        }
        t->ndim = (int)nd;
        uint64_t count = 1;
        for (size_t i = 0; i < nd; i++) {
            json_t *d = json_array_get(js, i);
            if (!json_is_integer(d) || json_integer_value(d) < 0) {
                rc = moet_err(err, errlen, MOET_EFORMAT, "%s: tensor '%s': shape[%zu] is not a non-negative integer",
                              path, key, i);
                goto done;
            }
            t->shape[i] = (int64_t)json_integer_value(d);
            if (!moet_mul_u64(count, (uint64_t)t->shape[i], &count)) {
                rc = moet_err(err, errlen, MOET_EFORMAT, "%s: tensor '%s': shape overflows 64 bits", path, key);
                goto done;
            }
        }
        uint64_t nbytes;
        if (!moet_mul_u64(count, moet_st_dtype_size(t->dtype), &nbytes)) {
            rc = moet_err(err, errlen, MOET_EFORMAT, "%s: tensor '%s': byte size overflows 64 bits", path, key);
            goto done;
        }
        if (json_array_size(jo) != 2 || !json_is_integer(json_array_get(jo, 0)) ||
            !json_is_integer(json_array_get(jo, 1))) {
            rc = moet_err(err, errlen, MOET_EFORMAT, "%s: tensor '%s': data_offsets must be two integers", path, key);
            goto done;
        }
        json_int_t b = json_integer_value(json_array_get(jo, 0)), e = json_integer_value(json_array_get(jo, 1));
        if (b < 0 || e < b || (uint64_t)e > data_size) {
            rc = moet_err(err, errlen, MOET_EFORMAT,
                          "%s: tensor '%s': data_offsets [%lld, %lld] outside the data section of %llu bytes", path,
                          key, (long long)b, (long long)e, (unsigned long long)data_size);
            goto done;
        }
        if ((uint64_t)(e - b) != nbytes) {
            char sb[128];
            rc = moet_err(err, errlen, MOET_EFORMAT,
                          "%s: tensor '%s': %s %s needs %llu bytes but data_offsets span %lld", path, key,
                          moet_st_dtype_name(t->dtype), moet_st_shape_str(t, sb, sizeof sb),
                          (unsigned long long)nbytes, (long long)(e - b));
            goto done;
        }
        t->data = data0 + b;
        t->nbytes = nbytes;
        t->name = strdup(key);
        if (!t->name) { rc = moet_err(err, errlen, MOET_ENOMEM, "%s: out of memory", path); goto done; }
        n++;
    }
    /* Overlap check on a copy sorted by start. Zero-byte tensors cannot overlap anything. */
    if (n > 1) {
        moet_st_tensor *tmp = malloc(n * sizeof(*tmp));
        if (!tmp) { rc = moet_err(err, errlen, MOET_ENOMEM, "%s: out of memory", path); goto done; }
        memcpy(tmp, ts, n * sizeof(*tmp));
        qsort(tmp, n, sizeof(*tmp), cmp_begin);
        const moet_st_tensor *prev = NULL;
        for (size_t i = 0; i < n; i++) {
            if (tmp[i].nbytes == 0) continue;
            if (prev && tmp[i].data < prev->data + prev->nbytes) {
                rc = moet_err(err, errlen, MOET_EFORMAT, "%s: tensors '%s' and '%s' overlap", path, prev->name,
                              tmp[i].name);
                break;
            }
            prev = &tmp[i];
        }
        free(tmp);
    }
done:
    json_decref(root);
    if (rc != MOET_OK) {
        for (size_t i = 0; i < n; i++) free(ts[i].name);
        free(ts);
        return rc;
    }
    *out = ts;
    *n_out = n;
    return MOET_OK;
}

int moet_st_add_file(moet_st_set *s, const char *path, char *err, size_t errlen) {
    moet_mmap map;
    int rc = moet_mmap_open(path, &map, err, errlen);
    if (rc) return rc;
    moet_st_tensor *ts;
    size_t n;
    rc = parse_header(path, &map, s->n_files, &ts, &n, err, errlen);
    if (rc) { moet_mmap_close(&map); return rc; }
    moet_mmap *nm = realloc(s->maps, (size_t)(s->n_files + 1) * sizeof(*nm));
    if (nm) s->maps = nm;
    char **np = nm ? realloc(s->paths, (size_t)(s->n_files + 1) * sizeof(*np)) : NULL;
    if (np) s->paths = np;
    moet_st_tensor *nt = np ? realloc(s->tensors, (s->n_tensors + n + 1) * sizeof(*nt)) : NULL;
    char *pcopy = nt ? strdup(path) : NULL;
    if (!pcopy) {
        if (nt) s->tensors = nt;
        for (size_t i = 0; i < n; i++) free(ts[i].name);
        free(ts);
        moet_mmap_close(&map);
        return moet_err(err, errlen, MOET_ENOMEM, "%s: out of memory", path);
    }
    s->tensors = nt;
    memcpy(s->tensors + s->n_tensors, ts, n * sizeof(*ts));
    free(ts);
    s->n_tensors += n;
    s->maps[s->n_files] = map;
    s->paths[s->n_files] = pcopy;
    s->n_files++;
    s->sorted = 0;
    return MOET_OK;
}

int moet_st_validate_buffer(const char *label, const void *data, size_t size, char *err, size_t errlen) {
    moet_mmap map = {.data = (void *)data, .size = size};
    moet_st_tensor *ts;
    size_t n;
    int rc = parse_header(label, &map, 0, &ts, &n, err, errlen);
    if (rc) return rc;
    for (size_t i = 0; i < n; i++) free(ts[i].name);
    free(ts);
    return MOET_OK;
}

static int cmp_name(const void *a, const void *b) {
    return strcmp(((const moet_st_tensor *)a)->name, ((const moet_st_tensor *)b)->name);
}

int moet_st_finish(moet_st_set *s, char *err, size_t errlen) {
    if (s->n_tensors) qsort(s->tensors, s->n_tensors, sizeof(*s->tensors), cmp_name);
    for (size_t i = 1; i < s->n_tensors; i++)
        if (strcmp(s->tensors[i - 1].name, s->tensors[i].name) == 0)
            return moet_err(err, errlen, MOET_EFORMAT, "tensor '%s' appears twice (%s and %s)", s->tensors[i].name,
                            s->paths[s->tensors[i - 1].file], s->paths[s->tensors[i].file]);
    s->sorted = 1;
    return MOET_OK;
}

const moet_st_tensor *moet_st_find(const moet_st_set *s, const char *name) {
    if (!s->sorted || !s->n_tensors) return NULL;
    moet_st_tensor key = {.name = (char *)name};
    return bsearch(&key, s->tensors, s->n_tensors, sizeof(key), cmp_name);
}

static int open_sharded(moet_st_set *s, const char *dir, const char *index_path, char *err, size_t errlen) {
    char *txt;
    size_t len;
    int rc = moet_file_read_all(index_path, 64u << 20, &txt, &len, err, errlen);
    if (rc) return rc;
    json_error_t je;
    json_t *root = json_loadb(txt, len, JSON_REJECT_DUPLICATES, &je);
    free(txt);
    if (!root) return moet_err(err, errlen, MOET_EFORMAT, "%s: invalid JSON (line %d): %s", index_path, je.line, je.text);
    json_t *wm = json_object_get(root, "weight_map");
    if (!json_is_object(wm)) {
        json_decref(root);
        return moet_err(err, errlen, MOET_EFORMAT, "%s: missing object 'weight_map'", index_path);
    }
    /* Open each distinct shard once, in order of first appearance. */
    const char *key;
    json_t *val;
    json_object_foreach(wm, key, val) {
        if (!json_is_string(val) || strchr(json_string_value(val), '/') || json_string_value(val)[0] == '.') {
            rc = moet_err(err, errlen, MOET_EFORMAT, "%s: weight_map['%s'] is not a plain file name", index_path, key);
            goto out;
        }
        const char *fname = json_string_value(val);
        char p[4096];
        if (!moet_path_join(p, sizeof p, dir, fname)) { rc = moet_err(err, errlen, MOET_EINVAL, "path too long"); goto out; }
        int seen = 0;
        for (int i = 0; i < s->n_files && !seen; i++) seen = strcmp(s->paths[i], p) == 0;
        if (!seen && (rc = moet_st_add_file(s, p, err, errlen)) != MOET_OK) goto out;
    }
    if ((rc = moet_st_finish(s, err, errlen)) != MOET_OK) goto out;
    json_object_foreach(wm, key, val) {
        const moet_st_tensor *t = moet_st_find(s, key);
        if (!t) { rc = moet_err(err, errlen, MOET_EFORMAT, "%s: tensor '%s' is not in %s", index_path, key,
                                json_string_value(val)); goto out; }
        const char *base = strrchr(s->paths[t->file], '/');
        if (strcmp(base ? base + 1 : s->paths[t->file], json_string_value(val)) != 0) {
            rc = moet_err(err, errlen, MOET_EFORMAT, "%s: tensor '%s' listed in %s but found in %s", index_path, key,
                          json_string_value(val), s->paths[t->file]);
            goto out;
        }
    }
out:
    json_decref(root);
    return rc;
}

int moet_st_open_dir(moet_st_set *s, const char *dir, char *err, size_t errlen) {
    char p[4096];
    int rc;
    if (!moet_path_join(p, sizeof p, dir, "model.safetensors.index.json"))
        return moet_err(err, errlen, MOET_EINVAL, "path too long: %s", dir);
    if (moet_file_exists(p)) {
        rc = open_sharded(s, dir, p, err, errlen);
    } else {
        if (!moet_path_join(p, sizeof p, dir, "model.safetensors"))
            return moet_err(err, errlen, MOET_EINVAL, "path too long: %s", dir);
        if (!moet_file_exists(p))
            return moet_err(err, errlen, MOET_EIO, "%s: no model.safetensors or model.safetensors.index.json", dir);
        rc = moet_st_add_file(s, p, err, errlen);
        if (!rc) rc = moet_st_finish(s, err, errlen);
    }
    if (rc) moet_st_free(s);
    return rc;
}
