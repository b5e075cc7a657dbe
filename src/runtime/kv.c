/*
 * kv.c — the paged KV cache pool (moet.h, backend/kv_page.h): per layer one key and one value pool of n_blocks
 * blocks, allocated once on the backend, and a free list of block ids that sessions take from as their sequences
 * grow and give back when truncated or freed. Nothing is allocated after create: taking a block is a pop.
 * Reference counted, so sessions keep their pool alive whatever order the caller frees things in.
 */
#include <stdlib.h>

#include "core/util.h"
#include "model/model.h"
#include "runtime/kv_int.h"

moet_kv_options moet_kv_default_options(void) {
    moet_kv_options o = {.n_tokens = 0, .block_tokens = 32};
    return o;
}

static void kv_destroy(moet_kv *kv) {
    const int32_t L = kv->m->hp.n_layers;
    for (int32_t l = 0; l < L; l++) {
        if (kv->k && kv->k[l]) kv->be->ops->release(kv->be, kv->k[l]);
        if (kv->v && kv->v[l]) kv->be->ops->release(kv->be, kv->v[l]);
    }
    free(kv->k);
    free(kv->v);
    free(kv->free_ids);
    free(kv);
}

int moet_kv_create_on(const moet_model *m, moet_backend *be, int32_t n_tokens, int32_t block_tokens, moet_kv **out,
                      char *err, size_t errlen) {
    *out = NULL;
    const moet_hparams *hp = &m->hp;
    if (n_tokens <= 0) n_tokens = hp->max_pos;
    if (block_tokens <= 0) block_tokens = 32;
    if (block_tokens > (1 << MOET_KV_SHIFT_MAX) || (block_tokens & (block_tokens - 1)))
        return moet_err(err, errlen, MOET_EINVAL, "KV block of %d tokens: a power of two up to %d is needed",
                        block_tokens, 1 << MOET_KV_SHIFT_MAX);
    int32_t shift = 0;
    while ((1 << shift) < block_tokens) shift++;
    const int64_t n_blocks = ((int64_t)n_tokens + block_tokens - 1) >> shift;
    const size_t Dkv = (size_t)hp->n_kv_heads * (size_t)hp->head_dim;
    size_t rows, bytes;
    if (n_blocks > INT32_MAX || !moet_mul_size((size_t)n_blocks, (size_t)block_tokens, &rows) ||
        !moet_mul_size(rows, Dkv * sizeof(float), &bytes))
        return moet_err(err, errlen, MOET_ERANGE, "KV pool of %d tokens is too large", n_tokens);
    moet_kv *kv = calloc(1, sizeof *kv);
    if (!kv) return moet_err(err, errlen, MOET_ENOMEM, "out of memory");
    kv->m = m;
    kv->be = be ? be : m->be;
    kv->n_blocks = (int32_t)n_blocks;
    kv->shift = shift;
    kv->refs = 1;
    kv->k = calloc((size_t)hp->n_layers, sizeof(float *));
    kv->v = calloc((size_t)hp->n_layers, sizeof(float *));
    kv->free_ids = malloc((size_t)n_blocks * sizeof(int32_t));
    if (!kv->k || !kv->v || !kv->free_ids) goto oom;
    for (int32_t l = 0; l < hp->n_layers; l++) {
        if (!(kv->k[l] = kv->be->ops->alloc(kv->be, bytes))) goto oom;
        if (!(kv->v[l] = kv->be->ops->alloc(kv->be, bytes))) goto oom;
    }
    for (int32_t i = 0; i < kv->n_blocks; i++) kv->free_ids[i] = kv->n_blocks - 1 - i;
    kv->n_free = kv->n_blocks;
    *out = kv;
    return MOET_OK;
oom:
    kv_destroy(kv);
    return moet_err(err, errlen, MOET_ENOMEM, "out of memory for a KV pool of %lld blocks of %d tokens (%.1f MiB)",
                    (long long)n_blocks, block_tokens, 2.0 * (double)hp->n_layers * (double)bytes / 1048576.0);
}

int moet_kv_create(const moet_model *m, const moet_kv_options *opt, moet_kv **out, char *err, size_t errlen) {
    const moet_kv_options o = opt ? *opt : moet_kv_default_options();
    return moet_kv_create_on(m, NULL, o.n_tokens, o.block_tokens, out, err, errlen);
}

void moet_kv_retain(moet_kv *kv) { kv->refs++; }

void moet_kv_free(moet_kv *kv) {
    if (kv && --kv->refs == 0) kv_destroy(kv);
}

int32_t moet_kv_take(moet_kv *kv) { return kv->n_free > 0 ? kv->free_ids[--kv->n_free] : -1; }

void moet_kv_give(moet_kv *kv, int32_t id) { kv->free_ids[kv->n_free++] = id; }

int32_t moet_kv_free_tokens(const moet_kv *kv) {
    const int64_t t = (int64_t)kv->n_free << kv->shift;
    return t > INT32_MAX ? INT32_MAX : (int32_t)t;
}

int32_t moet_kv_block_tokens(const moet_kv *kv) { return (int32_t)1 << kv->shift; }

int32_t moet_kv_tokens(const moet_kv *kv) {
    const int64_t t = (int64_t)kv->n_blocks << kv->shift;
    return t > INT32_MAX ? INT32_MAX : (int32_t)t;
}
