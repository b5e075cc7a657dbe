/*
 * strmap.h — open-addressing hash maps: byte string -> int32 (vocabularies) and u64 -> int64 (BPE merge pairs).
 * Keys are copied into one arena; maps only grow (tokenizers are built once and then read).
 */
#ifndef MOET_CORE_STRMAP_H
#define MOET_CORE_STRMAP_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    uint32_t *slots;   /* index+1 into entries, 0 = empty */
    size_t cap;        /* power of two */
    size_t n;
    char **keys;
    size_t *key_len;
    int32_t *vals;
    size_t ecap;
} moet_strmap;

void moet_strmap_init(moet_strmap *m);
void moet_strmap_free(moet_strmap *m);
/* Returns 0, or -1 on OOM. An existing key keeps its first value and returns 1. */
int moet_strmap_put(moet_strmap *m, const char *key, size_t len, int32_t val);
/* Value or -1. */
int32_t moet_strmap_get(const moet_strmap *m, const char *key, size_t len);

typedef struct {
    uint64_t *keys;
    int64_t *vals;
    uint8_t *used;
    size_t cap, n;
} moet_u64map;

void moet_u64map_init(moet_u64map *m);
void moet_u64map_free(moet_u64map *m);
int moet_u64map_put(moet_u64map *m, uint64_t key, int64_t val); /* 0 ok, 1 existed (kept), -1 OOM */
int moet_u64map_get(const moet_u64map *m, uint64_t key, int64_t *val); /* 1 found */

#endif
