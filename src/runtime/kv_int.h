/* kv_int.h — the paged KV pool (moet_kv) as the session sees it: block ids handed out and taken back, and the
 * prefix cache (full blocks registered by the hash of every token up to their end, shared by reference count). */
#ifndef MOET_RUNTIME_KV_INT_H
#define MOET_RUNTIME_KV_INT_H

#include <stdlib.h>

#include "backend/backend.h"
#include "model/model.h"
#include "moet.h"

struct moet_kv {
    const moet_model *m;
    moet_backend *be;
    int32_t n_blocks, shift, n_free, refs;
    void **k, **v;     /* [layer] pools: [n_blocks << shift][kdim] and [vdim] elements, backend memory (v NULL: vdim 0) */
    size_t kdim, vdim; /* elements a token: n_kv * head_dim each, or MLA's latent row (moet_kv_mla_latent) and none */
    int32_t type;      /* the elements: MOET_KVE_F32 or MOET_KVE_F16 (kv_page.h) */
    size_t esize;      /* bytes an element */
    int32_t *free_ids; /* a stack of the free block ids: the lowest id on top at first (deterministic layouts) */
    int32_t *ref;      /* [n_blocks] sessions holding the block */
    /* prefix cache (prefix != 0): a sealed block holds the KV of a full block whose tokens (toks) and the hash of
     * the whole prefix up to its end (hash) are known; it is found by that hash (buckets, chained through
     * bnext) and shared. A sealed block nobody holds stays cached on an LRU list until a take needs it. */
    int prefix;
    uint8_t *sealed;
    uint64_t *hash;
    int32_t *toks;             /* [n_blocks << shift] */
    int32_t *bucket, *bnext;   /* [n_buckets], [n_blocks]; -1 ends a chain */
    int32_t n_buckets;
    int32_t *lru_prev, *lru_next, lru_head, lru_tail, n_cached;
    uint64_t hit_tokens;       /* tokens evals took from the cache instead of computing */
};

/* A pool on `be` (the session's backend, which may differ from the model's). */
int moet_kv_create_on(const moet_model *m, moet_backend *be, int32_t n_tokens, int32_t block_tokens, int prefix,
                      int32_t type, moet_kv **out, char *err, size_t errlen);
/* Another reference (a session using the pool); moet_kv_free drops one. */
void moet_kv_retain(moet_kv *kv);
/* Blocks a take can return: free ones, and cached ones nobody holds (evicted, oldest first). */
static inline int32_t moet_kv_available(const moet_kv *kv) { return kv->n_free + kv->n_cached; }
/* A block for writing (ref 1, not sealed), or -1 when none is available; a reference dropped (the block is freed
 * or, sealed, cached when it was the last); a reference added to a block (a cached one leaves the LRU list). */
int32_t moet_kv_take(moet_kv *kv);
void moet_kv_give(moet_kv *kv, int32_t id);
void moet_kv_hold(moet_kv *kv, int32_t id);
/* Prefix cache: the sealed block for this prefix hash whose tokens are toks (2^shift of them), or -1; sealing a
 * full block (a no-op when prefix caching is off or an equal block is sealed already); unsealing one about to be
 * rewritten. */
int32_t moet_kv_lookup(const moet_kv *kv, uint64_t hash, const int32_t *toks);
void moet_kv_seal(moet_kv *kv, int32_t id, uint64_t hash, const int32_t *toks);
void moet_kv_unseal(moet_kv *kv, int32_t id);
/* The prefix hash chained over one block's tokens. */
uint64_t moet_kv_chain(uint64_t h, const int32_t *toks, int32_t n);

/* Whether MLA runs on the latent cache (backend.h, mla_attn) for model m on backend be: the backend has the op and
 * MOET_MLA_NAIVE is not 1 (full keys and values, the A/B). The KV pool and the forward ask the same question. */
static inline int moet_kv_mla_latent(const moet_model *m, const moet_backend *be) {
    const char *e = getenv("MOET_MLA_NAIVE");
    return m->hp.kv_lora_rank > 0 && be->ops->mla_attn && !(e && e[0] == '1');
}

#endif
