/* gguf.c — see gguf.h. */
#include "format/gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "quant/types.h"

#define MAX_COUNT (1u << 24)  /* tensors, keys, array elements: far above any real model, far below overflow */

typedef struct {
    const uint8_t *p, *end, *base;
    const char *label;
    char *err;
    size_t errlen;
} cur;

static int fail(cur *c, const char *what) {
    return moet_err(c->err, c->errlen, MOET_EFORMAT, "%s: %s at offset %zu", c->label, what, (size_t)(c->p - c->base));
}

static int rd(cur *c, void *out, size_t n, const char *what) {
    if ((size_t)(c->end - c->p) < n) return fail(c, what);
    memcpy(out, c->p, n);
    c->p += n;
    return 0;
}
static int rd_u32(cur *c, uint32_t *v, const char *w) { return rd(c, v, 4, w); }
static int rd_u64(cur *c, uint64_t *v, const char *w) { return rd(c, v, 8, w); }
static int rd_str(cur *c, const char **s, uint64_t *len, const char *what) {
    if (rd_u64(c, len, what)) return MOET_EFORMAT;
    if (*len > (uint64_t)(c->end - c->p)) return fail(c, "string length past the end of the file");
    *s = (const char *)c->p;
    c->p += *len;
    return 0;
}

static int cmp16(const void *a, const void *b);

static const size_t k_scalar_size[MOET_GGUF_TYPE_COUNT] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};

static int rd_scalar(cur *c, uint32_t t, moet_gguf_kv *kv) {
    uint8_t b[8] = {0};
    if (rd(c, b, k_scalar_size[t], "value truncated")) return MOET_EFORMAT;
    uint64_t u = 0;
    memcpy(&u, b, 8);
    switch (t) {
    case MOET_GGUF_I8: kv->u = (uint64_t)(int64_t)(int8_t)b[0]; break;
    case MOET_GGUF_I16: { int16_t v; memcpy(&v, b, 2); kv->u = (uint64_t)(int64_t)v; break; }
    case MOET_GGUF_I32: { int32_t v; memcpy(&v, b, 4); kv->u = (uint64_t)(int64_t)v; break; }
    case MOET_GGUF_F32: { float v; memcpy(&v, b, 4); kv->f = v; break; }
    case MOET_GGUF_F64: { double v; memcpy(&v, b, 8); kv->f = v; break; }
    case MOET_GGUF_BOOL: if (b[0] > 1) return fail(c, "bool value is not 0 or 1"); kv->u = b[0]; break;
    default: kv->u = u; break;
    }
    return 0;
}

static int parse(const char *label, const uint8_t *data, size_t size, moet_gguf *g, char *err, size_t errlen) {
    cur c = {data, data + size, data, label, err, errlen};
    uint32_t magic, version;
    if (size < 24) return moet_err(err, errlen, MOET_EFORMAT, "%s: truncated: %zu bytes, shorter than a GGUF header", label, size);
    rd_u32(&c, &magic, "magic");
    if (memcmp(data, "GGUF", 4) != 0) return moet_err(err, errlen, MOET_EFORMAT, "%s: not a GGUF file (bad magic)", label);
    rd_u32(&c, &version, "version");
    if (version != 3) return moet_err(err, errlen, MOET_EFORMAT, "%s: GGUF version %u (supported: 3)", label, version);
    rd_u64(&c, &g->n_tensors, "tensor count");
    rd_u64(&c, &g->n_kv, "kv count");
    /* each key takes at least 13 bytes and each tensor info 33: counts the file cannot hold are rejected before
     * anything is allocated for them */
    if (g->n_tensors > MAX_COUNT || g->n_kv > MAX_COUNT || g->n_kv > size / 13 || g->n_tensors > size / 33)
        return moet_err(err, errlen, MOET_EFORMAT, "%s: absurd counts (%llu tensors, %llu keys)", label,
                        (unsigned long long)g->n_tensors, (unsigned long long)g->n_kv);
    g->kv = calloc(g->n_kv + 1, sizeof(moet_gguf_kv));
    g->tensors = calloc(g->n_tensors + 1, sizeof(moet_gguf_tensor));
    if (!g->kv || !g->tensors) return moet_err(err, errlen, MOET_ENOMEM, "%s: out of memory", label);
    g->alignment = MOET_GGUF_DEFAULT_ALIGNMENT;
    for (uint64_t i = 0; i < g->n_kv; i++) {
        moet_gguf_kv *kv = &g->kv[i];
        const char *k;
        uint64_t kl;
        if (rd_str(&c, &k, &kl, "key truncated")) return MOET_EFORMAT;
        if (kl == 0 || kl > 65535) return fail(&c, "key length 0 or over 65535");
        if (!(kv->key = malloc(kl + 1))) return moet_err(err, errlen, MOET_ENOMEM, "out of memory");
        memcpy(kv->key, k, kl);
        kv->key[kl] = 0;
        if (strlen(kv->key) != kl) return fail(&c, "key contains a NUL byte");
        for (uint64_t j = 0; j < i; j++)
            if (!strcmp(g->kv[j].key, kv->key)) return moet_err(err, errlen, MOET_EFORMAT, "%s: key '%s' appears twice", label, kv->key);
        if (rd_u32(&c, &kv->type, "value type truncated")) return MOET_EFORMAT;
        if (kv->type >= MOET_GGUF_TYPE_COUNT)
            return moet_err(err, errlen, MOET_EFORMAT, "%s: key '%s' has unknown value type %u", label, kv->key, kv->type);
        if (kv->type == MOET_GGUF_STRING) {
            if (rd_str(&c, &kv->str, &kv->str_len, "string value truncated")) return MOET_EFORMAT;
        } else if (kv->type == MOET_GGUF_ARRAY) {
            if (rd_u32(&c, &kv->arr_type, "array type") || rd_u64(&c, &kv->arr_n, "array length")) return MOET_EFORMAT;
            if (kv->arr_type >= MOET_GGUF_TYPE_COUNT || kv->arr_type == MOET_GGUF_ARRAY)
                return moet_err(err, errlen, MOET_EFORMAT, "%s: key '%s': arrays of type %u are not supported", label,
                                kv->key, kv->arr_type);
            if (kv->arr_n > (uint64_t)size) return moet_err(err, errlen, MOET_EFORMAT, "%s: key '%s': absurd array length", label, kv->key);
            kv->arr = c.p;
            if (kv->arr_type == MOET_GGUF_STRING) {
                for (uint64_t j = 0; j < kv->arr_n; j++) {
                    const char *s;
                    uint64_t sl;
                    if (rd_str(&c, &s, &sl, "array string truncated")) return MOET_EFORMAT;
                }
            } else {
                uint64_t nb;
                if (!moet_mul_u64(kv->arr_n, k_scalar_size[kv->arr_type], &nb) || nb > (uint64_t)(c.end - c.p))
                    return moet_err(err, errlen, MOET_EFORMAT, "%s: key '%s': array runs past the end of the file", label, kv->key);
                c.p += nb;
            }
        } else if (rd_scalar(&c, kv->type, kv)) {
            return MOET_EFORMAT;
        }
        if (!strcmp(kv->key, "general.alignment")) {
            if (kv->type != MOET_GGUF_U32 || kv->u == 0 || (kv->u & (kv->u - 1)) || kv->u > (1u << 20))
                return moet_err(err, errlen, MOET_EFORMAT, "%s: general.alignment must be a u32 power of two", label);
            g->alignment = (uint32_t)kv->u;
        }
    }
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        moet_gguf_tensor *t = &g->tensors[i];
        const char *nm;
        uint64_t nl;
        if (rd_str(&c, &nm, &nl, "tensor name truncated")) return MOET_EFORMAT;
        if (nl == 0 || nl > 1024) return fail(&c, "tensor name length 0 or over 1024");
        if (!(t->name = malloc(nl + 1))) return moet_err(err, errlen, MOET_ENOMEM, "out of memory");
        memcpy(t->name, nm, nl);
        t->name[nl] = 0;
        if (strlen(t->name) != nl) return fail(&c, "tensor name contains a NUL byte");
        uint32_t nd = 0, type = 0;
        if (rd_u32(&c, &nd, "n_dims truncated")) return MOET_EFORMAT;
        if (nd == 0 || nd > MOET_GGUF_MAX_DIMS)
            return moet_err(err, errlen, MOET_EFORMAT, "%s: tensor '%s': %u dimensions (1..%d)", label, t->name, nd, MOET_GGUF_MAX_DIMS);
        t->n_dims = (int32_t)nd;
        uint64_t count = 1;
        for (uint32_t d = 0; d < nd; d++) {
            uint64_t ne = 0;
            if (rd_u64(&c, &ne, "dims truncated")) return MOET_EFORMAT;
            if (ne == 0 || ne > (1ull << 40) || !moet_mul_u64(count, ne, &count))
                return moet_err(err, errlen, MOET_EFORMAT, "%s: tensor '%s': bad dimension %llu", label, t->name, (unsigned long long)ne);
            t->ne[d] = (int64_t)ne;
        }
        for (uint32_t d = nd; d < MOET_GGUF_MAX_DIMS; d++) t->ne[d] = 1;
        if (rd_u32(&c, &type, "type truncated") || rd_u64(&c, &t->offset, "offset truncated")) return MOET_EFORMAT;
        t->type = (int32_t)type;
        size_t rb = moet_type_row_bytes((int32_t)type, t->ne[0]);
        if (!moet_type_get((int32_t)type))
            return moet_err(err, errlen, MOET_EFORMAT, "%s: tensor '%s': unknown type id %u", label, t->name, type);
        if (rb == 0)
            return moet_err(err, errlen, MOET_EFORMAT, "%s: tensor '%s': ne[0] = %lld is not a multiple of the %s block",
                            label, t->name, (long long)t->ne[0], moet_type_get((int32_t)type)->name);
        if (!moet_mul_u64(rb, count / (uint64_t)t->ne[0], &t->nbytes))
            return moet_err(err, errlen, MOET_EFORMAT, "%s: tensor '%s': size overflows", label, t->name);
        if (t->offset % g->alignment)
            return moet_err(err, errlen, MOET_EFORMAT, "%s: tensor '%s': offset %llu not aligned to %u", label, t->name,
                            (unsigned long long)t->offset, g->alignment);
        const int put = moet_strmap_put(&g->index, t->name, strlen(t->name), (int32_t)i);
        if (put < 0) return moet_err(err, errlen, MOET_ENOMEM, "out of memory");
        if (put > 0) return moet_err(err, errlen, MOET_EFORMAT, "%s: tensor '%s' appears twice", label, t->name);
    }
    size_t hdr = (size_t)(c.p - data);
    size_t data_start = (hdr + g->alignment - 1) / g->alignment * g->alignment;
    if (data_start > size && g->n_tensors) return moet_err(err, errlen, MOET_EFORMAT, "%s: truncated before the tensor data", label);
    uint64_t data_size = size > data_start ? size - data_start : 0;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        moet_gguf_tensor *t = &g->tensors[i];
        uint64_t end;
        if (!moet_add_u64(t->offset, t->nbytes, &end) || end > data_size)
            return moet_err(err, errlen, MOET_EFORMAT, "%s: tensor '%s': [%llu, +%llu) runs past the end of the data (%llu bytes): truncated?",
                            label, t->name, (unsigned long long)t->offset, (unsigned long long)t->nbytes, (unsigned long long)data_size);
        t->data = data + data_start + t->offset;
    }
    /* overlap: sort indices by offset */
    if (g->n_tensors > 1) {
        uint64_t *ord = malloc(g->n_tensors * 2 * sizeof(uint64_t));
        if (!ord) return moet_err(err, errlen, MOET_ENOMEM, "out of memory");
        for (uint64_t i = 0; i < g->n_tensors; i++) { ord[2 * i] = g->tensors[i].offset; ord[2 * i + 1] = i; }
        qsort(ord, g->n_tensors, 16, cmp16);
        int rc = 0;
        for (uint64_t i = 1; i < g->n_tensors && !rc; i++) {
            const moet_gguf_tensor *a = &g->tensors[ord[2 * (i - 1) + 1]], *b = &g->tensors[ord[2 * i + 1]];
            if (a->offset + a->nbytes > b->offset)
                rc = moet_err(err, errlen, MOET_EFORMAT, "%s: tensors '%s' and '%s' overlap", label, a->name, b->name);
        }
        free(ord);
        if (rc) return rc;
    }
    return MOET_OK;
}

static int cmp16(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static void free_parsed(moet_gguf *g) {
    if (g->kv) for (uint64_t i = 0; i < g->n_kv; i++) free(g->kv[i].key);
    if (g->tensors) for (uint64_t i = 0; i < g->n_tensors; i++) free(g->tensors[i].name);
    free(g->kv);
    free(g->tensors);
    moet_strmap_free(&g->index);
    g->kv = NULL;
    g->tensors = NULL;
}

int moet_gguf_open(const char *path, moet_gguf *g, char *err, size_t errlen) {
    memset(g, 0, sizeof(*g));
    int rc = moet_mmap_open(path, &g->map, err, errlen);
    if (rc) return rc;
    rc = parse(path, g->map.data, g->map.size, g, err, errlen);
    if (!rc && !(g->path = strdup(path))) rc = moet_err(err, errlen, MOET_ENOMEM, "out of memory");
    if (rc) { free_parsed(g); moet_mmap_close(&g->map); memset(g, 0, sizeof(*g)); }
    return rc;
}

int moet_gguf_validate_buffer(const void *data, size_t size, char *err, size_t errlen) {
    moet_gguf g;
    memset(&g, 0, sizeof g);
    int rc = parse("buffer", data, size, &g, err, errlen);
    free_parsed(&g);
    return rc;
}

void moet_gguf_close(moet_gguf *g) {
    free_parsed(g);
    moet_mmap_close(&g->map);
    free(g->path);
    memset(g, 0, sizeof(*g));
}

const moet_gguf_kv *moet_gguf_find_kv(const moet_gguf *g, const char *key) {
    for (uint64_t i = 0; i < g->n_kv; i++)
        if (!strcmp(g->kv[i].key, key)) return &g->kv[i];
    return NULL;
}

const moet_gguf_tensor *moet_gguf_find_tensor(const moet_gguf *g, const char *name) {
    const int32_t i = g->n_tensors ? moet_strmap_get(&g->index, name, strlen(name)) : -1;
    return i >= 0 && (uint64_t)i < g->n_tensors ? &g->tensors[i] : NULL;
}

static int is_int(uint32_t t) {
    return t == MOET_GGUF_U8 || t == MOET_GGUF_I8 || t == MOET_GGUF_U16 || t == MOET_GGUF_I16 || t == MOET_GGUF_U32 ||
           t == MOET_GGUF_I32 || t == MOET_GGUF_U64 || t == MOET_GGUF_I64 || t == MOET_GGUF_BOOL;
}

int moet_gguf_get_i64(const moet_gguf *g, const char *key, int64_t *out) {
    const moet_gguf_kv *kv = moet_gguf_find_kv(g, key);
    if (!kv || !is_int(kv->type)) return -1;
    if (kv->type == MOET_GGUF_U64 && kv->u > INT64_MAX) return -1;
    *out = (int64_t)kv->u;
    return 0;
}

int moet_gguf_get_f64(const moet_gguf *g, const char *key, double *out) {
    const moet_gguf_kv *kv = moet_gguf_find_kv(g, key);
    if (!kv) return -1;
    if (kv->type == MOET_GGUF_F32 || kv->type == MOET_GGUF_F64) *out = kv->f;
    else if (is_int(kv->type)) *out = (double)(int64_t)kv->u;
    else return -1;
    return 0;
}

int moet_gguf_get_str(const moet_gguf *g, const char *key, char **out) {
    const moet_gguf_kv *kv = moet_gguf_find_kv(g, key);
    if (!kv || kv->type != MOET_GGUF_STRING) return -1;
    if (!(*out = malloc(kv->str_len + 1))) return -1;
    memcpy(*out, kv->str, kv->str_len);
    (*out)[kv->str_len] = 0;
    return 0;
}

/* ---- writer ------------------------------------------------------------------------------------------------------ */

typedef struct {
    char *name;
    int32_t type, n_dims;
    int64_t ne[MOET_GGUF_MAX_DIMS];
    const void *data;
    uint64_t nbytes, align, offset;
    int put;          /* a deferred tensor's data has been written */
} wtensor;

struct moet_gguf_writer {
    char *path, *tmp;
    uint32_t alignment;
    uint8_t *kvbuf;      /* serialized kv section */
    size_t kvlen, kvcap;
    uint64_t n_kv;
    wtensor *t;
    size_t n_t, cap_t;
    int oom;
    int fd;              /* the temporary, once begun (-1 before) */
    uint64_t data_start; /* the data section's file offset */
};

static void put(moet_gguf_writer *w, const void *p, size_t n) {
    if (w->oom) return;
    if (w->kvlen + n > w->kvcap) {
        size_t nc = w->kvcap ? w->kvcap * 2 : 4096;
        while (nc < w->kvlen + n) nc *= 2;
        uint8_t *nb = realloc(w->kvbuf, nc);
        if (!nb) { w->oom = 1; return; }
        w->kvbuf = nb;
        w->kvcap = nc;
    }
    memcpy(w->kvbuf + w->kvlen, p, n);
    w->kvlen += n;
}
static void put_u32(moet_gguf_writer *w, uint32_t v) { put(w, &v, 4); }
static void put_u64(moet_gguf_writer *w, uint64_t v) { put(w, &v, 8); }
static void put_str(moet_gguf_writer *w, const char *s, size_t n) { put_u64(w, n); put(w, s, n); }
static int kv_head(moet_gguf_writer *w, const char *key, uint32_t type) {
    put_str(w, key, strlen(key));
    put_u32(w, type);
    w->n_kv++;
    return w->oom ? -1 : 0;
}

moet_gguf_writer *moet_gguf_writer_create(const char *path, uint32_t alignment) {
    moet_gguf_writer *w = calloc(1, sizeof(*w));
    if (!w) return NULL;
    w->alignment = alignment ? alignment : MOET_GGUF_DEFAULT_ALIGNMENT;
    w->fd = -1;
    w->path = strdup(path);
    w->tmp = malloc(strlen(path) + 5);
    if (!w->path || !w->tmp) { moet_gguf_writer_abort(w); return NULL; }
    sprintf(w->tmp, "%s.tmp", path);
    moet_gguf_writer_kv_u32(w, "general.alignment", w->alignment);
    return w;
}

int moet_gguf_writer_kv_u32(moet_gguf_writer *w, const char *key, uint32_t v) { kv_head(w, key, MOET_GGUF_U32); put_u32(w, v); return w->oom ? -1 : 0; }
int moet_gguf_writer_kv_i32(moet_gguf_writer *w, const char *key, int32_t v) { kv_head(w, key, MOET_GGUF_I32); put(w, &v, 4); return w->oom ? -1 : 0; }
int moet_gguf_writer_kv_f32(moet_gguf_writer *w, const char *key, float v) { kv_head(w, key, MOET_GGUF_F32); put(w, &v, 4); return w->oom ? -1 : 0; }
int moet_gguf_writer_kv_bool(moet_gguf_writer *w, const char *key, int v) { uint8_t b = v ? 1 : 0; kv_head(w, key, MOET_GGUF_BOOL); put(w, &b, 1); return w->oom ? -1 : 0; }
int moet_gguf_writer_kv_str(moet_gguf_writer *w, const char *key, const char *s, size_t len) { kv_head(w, key, MOET_GGUF_STRING); put_str(w, s, len); return w->oom ? -1 : 0; }
int moet_gguf_writer_kv_arr_i32(moet_gguf_writer *w, const char *key, const int32_t *v, size_t n) {
    kv_head(w, key, MOET_GGUF_ARRAY);
    put_u32(w, MOET_GGUF_I32);
    put_u64(w, n);
    put(w, v, n * 4);
    return w->oom ? -1 : 0;
}

int moet_gguf_writer_tensor(moet_gguf_writer *w, const char *name, int32_t type, int n_dims, const int64_t *ne,
                            const void *data, uint64_t nbytes, uint64_t align) {
    if (n_dims < 1 || n_dims > MOET_GGUF_MAX_DIMS || w->fd >= 0) return -1;
    if (w->n_t == w->cap_t) {
        size_t nc = w->cap_t ? w->cap_t * 2 : 256;
        wtensor *nt = realloc(w->t, nc * sizeof(*nt));
        if (!nt) return -1;
        w->t = nt;
        w->cap_t = nc;
    }
    wtensor *t = &w->t[w->n_t];
    memset(t, 0, sizeof(*t));
    if (!(t->name = strdup(name))) return -1;
    t->type = type;
    t->n_dims = n_dims;
    for (int i = 0; i < n_dims; i++) t->ne[i] = ne[i];
    t->data = data;
    t->nbytes = nbytes;
    t->align = align < w->alignment ? w->alignment : align;
    w->n_t++;
    return 0;
}

void moet_gguf_writer_abort(moet_gguf_writer *w) {
    if (!w) return;
    if (w->fd >= 0) close(w->fd);
    if (w->tmp) unlink(w->tmp);
    for (size_t i = 0; i < w->n_t; i++) free(w->t[i].name);
    free(w->t);
    free(w->kvbuf);
    free(w->path);
    free(w->tmp);
    free(w);
}

/* All n bytes at file offset off (pwrite may write fewer): 0, or -1 with errno. */
static int pwrite_all(int fd, const void *p, size_t n, uint64_t off) {
    const uint8_t *b = p;
    while (n) {
        const ssize_t k = pwrite(fd, b, n, (off_t)off);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return -1;
        b += k;
        n -= (size_t)k;
        off += (uint64_t)k;
    }
    return 0;
}

/* Lays the file out (every tensor's offset, at its own alignment), writes the header and every tensor whose data was
 * given; deferred tensors (data NULL) come later through moet_gguf_writer_put. The gaps stay holes, which read as the
 * zero padding GGUF wants. */
int moet_gguf_writer_begin(moet_gguf_writer *w, char *err, size_t errlen) {
    if (w->fd >= 0) return MOET_OK;
    if (w->oom) return moet_err(err, errlen, MOET_ENOMEM, "out of memory");
    uint64_t off = 0;
    for (size_t i = 0; i < w->n_t; i++) {
        off = (off + w->t[i].align - 1) / w->t[i].align * w->t[i].align;
        w->t[i].offset = off;
        off += w->t[i].nbytes;
    }
    /* Records aligned to more than general.alignment (4 KiB expert records, for O_DIRECT reads) must be aligned in
     * the file too, so the header is padded with a string key to end on a multiple of the largest alignment; then
     * the data section starts there for every GGUF reader. */
    uint64_t maxal = w->alignment;
    for (size_t i = 0; i < w->n_t; i++) maxal = w->t[i].align > maxal ? w->t[i].align : maxal;
    if (maxal > w->alignment) {
        static const char pk[] = "moet.header_pad";
        uint64_t h = 24 + w->kvlen + (8 + sizeof pk - 1 + 4 + 8);
        for (size_t i = 0; i < w->n_t; i++) h += 8 + strlen(w->t[i].name) + 4 + 8 * (uint64_t)w->t[i].n_dims + 12;
        uint64_t padlen = (maxal - h % maxal) % maxal;
        char *pad = malloc(padlen + 1);
        if (!pad) return moet_err(err, errlen, MOET_ENOMEM, "out of memory");
        memset(pad, ' ', padlen);
        moet_gguf_writer_kv_str(w, pk, pad, padlen);
        free(pad);
        if (w->oom) return moet_err(err, errlen, MOET_ENOMEM, "out of memory");
    }
    /* the header, built where the kv section is (it ends with the tensor infos) */
    const size_t kvlen = w->kvlen;
    uint32_t v3 = 3;
    uint64_t nt = w->n_t;
    for (size_t i = 0; i < w->n_t; i++) {
        const wtensor *t = &w->t[i];
        uint64_t nl = strlen(t->name);
        uint32_t nd = (uint32_t)t->n_dims, ty = (uint32_t)t->type;
        put(w, &nl, 8);
        put(w, t->name, nl);
        put(w, &nd, 4);
        for (int d = 0; d < t->n_dims; d++) { uint64_t ne = (uint64_t)t->ne[d]; put(w, &ne, 8); }
        put(w, &ty, 4);
        put(w, &t->offset, 8);
    }
    if (w->oom) return moet_err(err, errlen, MOET_ENOMEM, "out of memory");
    const uint64_t hdr = 24 + w->kvlen;
    w->data_start = (hdr + w->alignment - 1) / w->alignment * w->alignment;
    w->fd = open(w->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (w->fd < 0) return moet_err(err, errlen, MOET_EIO, "cannot create temporary file: %s", strerror(errno));
    uint8_t head[24];
    memcpy(head, "GGUF", 4);
    memcpy(head + 4, &v3, 4);
    memcpy(head + 8, &nt, 8);
    memcpy(head + 16, &w->n_kv, 8);
    if (pwrite_all(w->fd, head, 24, 0) || pwrite_all(w->fd, w->kvbuf, w->kvlen, 24))
        return moet_err(err, errlen, MOET_EIO, "write failed: %s", strerror(errno));
    w->kvlen = kvlen; /* the tensor infos are written; the kv section is what it was */
    for (size_t i = 0; i < w->n_t; i++)
        if (w->t[i].data && moet_gguf_writer_put(w, i, w->t[i].data))
            return moet_err(err, errlen, MOET_EIO, "write failed (disk full?): %s", strerror(errno));
    return MOET_OK;
}

int moet_gguf_writer_put(moet_gguf_writer *w, size_t i, const void *data) {
    if (w->fd < 0 || i >= w->n_t) return -1;
    if (pwrite_all(w->fd, data, w->t[i].nbytes, w->data_start + w->t[i].offset)) return -1;
    w->t[i].put = 1;
    return 0;
}

size_t moet_gguf_writer_n_tensors(const moet_gguf_writer *w) { return w->n_t; }

int moet_gguf_writer_finish(moet_gguf_writer *w, char *err, size_t errlen) {
    int rc = moet_gguf_writer_begin(w, err, errlen);
    if (rc) { moet_gguf_writer_abort(w); return rc; }
    uint64_t end = w->data_start;
    for (size_t i = 0; i < w->n_t; i++) {
        if (!w->t[i].put) {
            rc = moet_err(err, errlen, MOET_EINVAL, "tensor '%s' was never written", w->t[i].name);
            moet_gguf_writer_abort(w);
            return rc;
        }
        if (w->data_start + w->t[i].offset + w->t[i].nbytes > end) end = w->data_start + w->t[i].offset + w->t[i].nbytes;
    }
    /* the file ends where its last tensor does, even when that one is empty */
    if (ftruncate(w->fd, (off_t)end) || fsync(w->fd)) {
        moet_gguf_writer_abort(w);
        return moet_err(err, errlen, MOET_EIO, "write failed (disk full?)");
    }
    rc = close(w->fd);
    w->fd = -1;
    if (rc) { moet_gguf_writer_abort(w); return moet_err(err, errlen, MOET_EIO, "write failed (disk full?)"); }
    if (rename(w->tmp, w->path)) {
        int e = errno;
        moet_gguf_writer_abort(w);
        return moet_err(err, errlen, MOET_EIO, "rename to final name failed: %s", strerror(e));
    }
    free(w->tmp);
    w->tmp = NULL;
    moet_gguf_writer_abort(w);
    return MOET_OK;
}
