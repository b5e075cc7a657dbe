/* strmap.c — see strmap.h. FNV-1a for strings, a 64-bit mixer for integers, linear probing. */
#include "core/strmap.h"

#include <stdlib.h>
#include <string.h>

static uint64_t fnv(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 1099511628211ull;
    return h;
}

static uint64_t mix(uint64_t x) {
    x ^= x >> 33; x *= 0xff51afd7ed558ccdull; x ^= x >> 33; x *= 0xc4ceb9fe1a85ec53ull; x ^= x >> 33;
    return x;
}

void moet_strmap_init(moet_strmap *m) { memset(m, 0, sizeof(*m)); }

void moet_strmap_free(moet_strmap *m) {
    for (size_t i = 0; i < m->n; i++) free(m->keys[i]);
    free(m->slots);
    free(m->keys);
    free(m->key_len);
    free(m->vals);
    memset(m, 0, sizeof(*m));
}

static int strmap_grow(moet_strmap *m) {
    size_t nc = m->cap ? m->cap * 2 : 1024;
    uint32_t *ns = calloc(nc, sizeof(uint32_t));
    if (!ns) return -1;
    for (size_t i = 0; i < m->n; i++) {
        size_t j = fnv(m->keys[i], m->key_len[i]) & (nc - 1);
        while (ns[j]) j = (j + 1) & (nc - 1);
        ns[j] = (uint32_t)(i + 1);
    }
    free(m->slots);
    m->slots = ns;
    m->cap = nc;
    return 0;
}

int32_t moet_strmap_get(const moet_strmap *m, const char *key, size_t len) {
    if (!m->cap) return -1;
    size_t j = fnv(key, len) & (m->cap - 1);
    while (m->slots[j]) {
        size_t e = m->slots[j] - 1;
        if (m->key_len[e] == len && memcmp(m->keys[e], key, len) == 0) return m->vals[e];
        j = (j + 1) & (m->cap - 1);
    }
    return -1;
}

int moet_strmap_put(moet_strmap *m, const char *key, size_t len, int32_t val) {
    if ((m->n + 1) * 2 > m->cap && strmap_grow(m)) return -1;
    size_t j = fnv(key, len) & (m->cap - 1);
    while (m->slots[j]) {
        size_t e = m->slots[j] - 1;
        if (m->key_len[e] == len && memcmp(m->keys[e], key, len) == 0) return 1;
        j = (j + 1) & (m->cap - 1);
    }
    if (m->n == m->ecap) {
        size_t nc = m->ecap ? m->ecap * 2 : 1024;
        char **nk = realloc(m->keys, nc * sizeof(*nk));
        if (!nk) return -1;
        m->keys = nk;
        size_t *nl = realloc(m->key_len, nc * sizeof(*nl));
        if (!nl) return -1;
        m->key_len = nl;
        int32_t *nv = realloc(m->vals, nc * sizeof(*nv));
        if (!nv) return -1;
        m->vals = nv;
        m->ecap = nc;
    }
    char *k = malloc(len + 1);
    if (!k) return -1;
    memcpy(k, key, len);
    k[len] = 0;
    m->keys[m->n] = k;
    m->key_len[m->n] = len;
    m->vals[m->n] = val;
    m->n++;
    m->slots[j] = (uint32_t)m->n;
    return 0;
}

void moet_u64map_init(moet_u64map *m) { memset(m, 0, sizeof(*m)); }

void moet_u64map_free(moet_u64map *m) {
    free(m->keys);
    free(m->vals);
    free(m->used);
    memset(m, 0, sizeof(*m));
}

static int u64_grow(moet_u64map *m) {
    size_t nc = m->cap ? m->cap * 2 : 1024;
    uint64_t *nk = calloc(nc, sizeof(uint64_t));
    int64_t *nv = calloc(nc, sizeof(int64_t));
    uint8_t *nu = calloc(nc, 1);
    if (!nk || !nv || !nu) { free(nk); free(nv); free(nu); return -1; }
    for (size_t i = 0; i < m->cap; i++) {
        if (!m->used[i]) continue;
        size_t j = mix(m->keys[i]) & (nc - 1);
        while (nu[j]) j = (j + 1) & (nc - 1);
        nu[j] = 1;
        nk[j] = m->keys[i];
        nv[j] = m->vals[i];
    }
    free(m->keys); free(m->vals); free(m->used);
    m->keys = nk; m->vals = nv; m->used = nu; m->cap = nc;
    return 0;
}

int moet_u64map_put(moet_u64map *m, uint64_t key, int64_t val) {
    if ((m->n + 1) * 2 > m->cap && u64_grow(m)) return -1;
    size_t j = mix(key) & (m->cap - 1);
    while (m->used[j]) {
        if (m->keys[j] == key) return 1;
        j = (j + 1) & (m->cap - 1);
    }
    m->used[j] = 1;
    m->keys[j] = key;
    m->vals[j] = val;
    m->n++;
    return 0;
}

int moet_u64map_get(const moet_u64map *m, uint64_t key, int64_t *val) {
    if (!m->cap) return 0;
    size_t j = mix(key) & (m->cap - 1);
    while (m->used[j]) {
        if (m->keys[j] == key) { *val = m->vals[j]; return 1; }
        j = (j + 1) & (m->cap - 1);
    }
    return 0;
}
