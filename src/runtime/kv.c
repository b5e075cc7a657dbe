/*
 * kv.c — the paged KV cache pool (moet.h, backend/kv_page.h): per layer one key and one value pool of n_blocks
 * blocks, allocated once on the backend, and a free list of block ids that sessions take from as their sequences
 * grow and give back when truncated or freed. Nothing is allocated after create: taking a block is a pop.
 * Reference counted, so sessions keep their pool alive whatever order the caller frees things in.
 *
 * The prefix cache (moet_kv_options.prefix_cache): a block a session has filled is sealed under the hash of all the
 * tokens from position 0 to its end (and the delta mode: base and base + delta experts make different KV); a later
 * eval whose leading full blocks hash the same, with the same tokens in the block, takes those blocks by reference
 * instead of computing them (a server's repeated system prompt, n > 1 choices of one prompt, a chat's earlier turns).
 * A block is only shared while nobody writes it: a session about to write into a shared block copies it first, into
 * a sealed one of its own unseals it. A sealed block nobody holds stays cached, evicted oldest first when a take
 * finds no free block. The 64-bit hash names the whole prefix; the block's own tokens are compared too.
 */
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "model/model.h"
#include "runtime/kv_int.h"

moet_kv_options moet_kv_default_options(void) {
    moet_kv_options o = {.n_tokens = 0, .block_tokens = 32, .prefix_cache = 0, .type = MOET_KV_AUTO};
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
    free(kv->ref);
    free(kv->sealed);
    free(kv->hash);
    free(kv->toks);
    free(kv->bucket);
    free(kv->bnext);
    free(kv->lru_prev);
    free(kv->lru_next);
    free(kv);
}

/* The pool element type of a public MOET_KV_* on backend be, or -1. auto: f32 on the CPU (the reference's), f16 on
 * CUDA (docs/design.md decision 17: at depth the cache is most of a decode step's bytes, and f16 halves them and the
 * memory; llama.cpp's default is f16 too); MOET_KV_AUTO_CUDA=f32 keeps CUDA's auto at f32. */
static int32_t kv_elt(int32_t type, const moet_backend *be) {
    switch (type) {
    case MOET_KV_AUTO: {
        if (!be || strcmp(be->ops->name, "cuda")) return MOET_KVE_F32;
        const char *e = getenv("MOET_KV_AUTO_CUDA");
        return e && !strcmp(e, "f32") ? MOET_KVE_F32 : MOET_KVE_F16;
    }
    case MOET_KV_F32: return MOET_KVE_F32;
    case MOET_KV_F16: return MOET_KVE_F16;
    default: return -1;
    }
}

int moet_kv_create_on(const moet_model *m, moet_backend *be, int32_t n_tokens, int32_t block_tokens, int prefix,
                      int32_t type, moet_kv **out, char *err, size_t errlen) {
    *out = NULL;
    const int32_t elt = kv_elt(type, be ? be : m->be);
    if (elt < 0) return moet_err(err, errlen, MOET_EINVAL, "KV cache type %d: f32 (%d) or f16 (%d) is needed", type,
                                 MOET_KV_F32, MOET_KV_F16);
    const moet_hparams *hp = &m->hp;
    if (n_tokens <= 0) n_tokens = hp->max_pos;
    if (block_tokens <= 0) block_tokens = 32;
    if (block_tokens > (1 << MOET_KV_SHIFT_MAX) || (block_tokens & (block_tokens - 1)))
        return moet_err(err, errlen, MOET_EINVAL, "KV block of %d tokens: a power of two up to %d is needed",
                        block_tokens, 1 << MOET_KV_SHIFT_MAX);
    int32_t shift = 0;
    while ((1 << shift) < block_tokens) shift++;
    const int64_t n_blocks = ((int64_t)n_tokens + block_tokens - 1) >> shift;
    /* MLA's latent cache: [k_pe', c] a token, no values (backend.h, mla_attn); otherwise keys and values a head */
    const int latent = moet_kv_mla_latent(m, be ? be : m->be);
    const size_t Dkv = latent ? (size_t)(hp->rope_dim + hp->kv_lora_rank) : (size_t)hp->n_kv_heads * (size_t)hp->head_dim;
    size_t rows, bytes;
    if (n_blocks > INT32_MAX || !moet_mul_size((size_t)n_blocks, (size_t)block_tokens, &rows) ||
        !moet_mul_size(rows, Dkv * (size_t)moet_kve_size(elt), &bytes))
        return moet_err(err, errlen, MOET_ERANGE, "KV pool of %d tokens is too large", n_tokens);
    moet_kv *kv = calloc(1, sizeof *kv);
    if (!kv) return moet_err(err, errlen, MOET_ENOMEM, "out of memory");
    kv->m = m;
    kv->be = be ? be : m->be;
    kv->n_blocks = (int32_t)n_blocks;
    kv->shift = shift;
    kv->refs = 1;
    kv->kdim = Dkv;
    kv->vdim = latent ? 0 : Dkv;
    kv->type = elt;
    kv->esize = (size_t)moet_kve_size(elt);
    kv->k = calloc((size_t)hp->n_layers, sizeof(void *));
    kv->v = calloc((size_t)hp->n_layers, sizeof(void *));
    kv->free_ids = malloc((size_t)n_blocks * sizeof(int32_t));
    kv->ref = calloc((size_t)n_blocks, sizeof(int32_t));
    if (!kv->k || !kv->v || !kv->free_ids || !kv->ref) goto oom;
    kv->prefix = prefix != 0;
    kv->lru_head = kv->lru_tail = -1;
    if (kv->prefix) {
        kv->n_buckets = 1;
        while (kv->n_buckets < kv->n_blocks && kv->n_buckets < (1 << 30)) kv->n_buckets <<= 1;
        kv->sealed = calloc((size_t)n_blocks, 1);
        kv->hash = calloc((size_t)n_blocks, sizeof(uint64_t));
        kv->toks = malloc(rows * sizeof(int32_t));
        kv->bucket = malloc((size_t)kv->n_buckets * sizeof(int32_t));
        kv->bnext = malloc((size_t)n_blocks * sizeof(int32_t));
        kv->lru_prev = malloc((size_t)n_blocks * sizeof(int32_t));
        kv->lru_next = malloc((size_t)n_blocks * sizeof(int32_t));
        if (!kv->sealed || !kv->hash || !kv->toks || !kv->bucket || !kv->bnext || !kv->lru_prev || !kv->lru_next)
            goto oom;
        for (int32_t i = 0; i < kv->n_buckets; i++) kv->bucket[i] = -1;
    }
    for (int32_t l = 0; l < hp->n_layers; l++) {
        if (!(kv->k[l] = kv->be->ops->alloc(kv->be, bytes))) goto oom;
        if (!latent && !(kv->v[l] = kv->be->ops->alloc(kv->be, bytes))) goto oom;
    }
    for (int32_t i = 0; i < kv->n_blocks; i++) kv->free_ids[i] = kv->n_blocks - 1 - i;
    kv->n_free = kv->n_blocks;
    *out = kv;
    return MOET_OK;
oom:
    kv_destroy(kv);
    return moet_err(err, errlen, MOET_ENOMEM, "out of memory for a KV pool of %lld blocks of %d tokens (%.1f MiB)",
                    (long long)n_blocks, block_tokens, (latent ? 1.0 : 2.0) * (double)hp->n_layers * (double)bytes / 1048576.0);
}

int moet_kv_create(const moet_model *m, const moet_kv_options *opt, moet_kv **out, char *err, size_t errlen) {
    const moet_kv_options o = opt ? *opt : moet_kv_default_options();
    return moet_kv_create_on(m, NULL, o.n_tokens, o.block_tokens, o.prefix_cache, o.type, out, err, errlen);
}

void moet_kv_retain(moet_kv *kv) { kv->refs++; }

void moet_kv_free(moet_kv *kv) {
    if (kv && --kv->refs == 0) kv_destroy(kv);
}

/* ---- the cached blocks' LRU list and the sealed blocks' buckets ---- */

static void lru_remove(moet_kv *kv, int32_t b) {
    const int32_t p = kv->lru_prev[b], n = kv->lru_next[b];
    if (p >= 0) kv->lru_next[p] = n; else kv->lru_head = n;
    if (n >= 0) kv->lru_prev[n] = p; else kv->lru_tail = p;
    kv->n_cached--;
}

static void lru_append(moet_kv *kv, int32_t b) {
    kv->lru_prev[b] = kv->lru_tail;
    kv->lru_next[b] = -1;
    if (kv->lru_tail >= 0) kv->lru_next[kv->lru_tail] = b; else kv->lru_head = b;
    kv->lru_tail = b;
    kv->n_cached++;
}

static int32_t *bucket_of(const moet_kv *kv, uint64_t h) {
    return &kv->bucket[(h ^ (h >> 29)) & (uint64_t)(kv->n_buckets - 1)];
}

uint64_t moet_kv_chain(uint64_t h, const int32_t *toks, int32_t n) {
    for (int32_t i = 0; i < n; i++) { /* FNV-1a over the ids' bytes, then a final mix */
        uint32_t t = (uint32_t)toks[i];
        for (int k = 0; k < 4; k++, t >>= 8) h = (h ^ (t & 0xffu)) * 0x100000001b3ull;
    }
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    return h ^ (h >> 33);
}

int32_t moet_kv_lookup(const moet_kv *kv, uint64_t hash, const int32_t *toks) {
    if (!kv->prefix) return -1;
    const size_t B = (size_t)1 << kv->shift;
    for (int32_t b = *bucket_of(kv, hash); b >= 0; b = kv->bnext[b])
        if (kv->hash[b] == hash && !memcmp(kv->toks + (size_t)b * B, toks, B * sizeof(int32_t))) return b;
    return -1;
}

void moet_kv_seal(moet_kv *kv, int32_t id, uint64_t hash, const int32_t *toks) {
    if (!kv->prefix || kv->sealed[id] || moet_kv_lookup(kv, hash, toks) >= 0) return;
    const size_t B = (size_t)1 << kv->shift;
    kv->sealed[id] = 1;
    kv->hash[id] = hash;
    memcpy(kv->toks + (size_t)id * B, toks, B * sizeof(int32_t));
    int32_t *head = bucket_of(kv, hash);
    kv->bnext[id] = *head;
    *head = id;
}

void moet_kv_unseal(moet_kv *kv, int32_t id) {
    if (!kv->prefix || !kv->sealed[id]) return;
    for (int32_t *pp = bucket_of(kv, kv->hash[id]); *pp >= 0; pp = &kv->bnext[*pp])
        if (*pp == id) { *pp = kv->bnext[id]; break; }
    kv->sealed[id] = 0;
}

int32_t moet_kv_take(moet_kv *kv) {
    int32_t b = -1;
    if (kv->n_free > 0) {
        b = kv->free_ids[--kv->n_free];
    } else if (kv->n_cached > 0) { /* evict the cached block unused longest */
        b = kv->lru_head;
        lru_remove(kv, b);
        moet_kv_unseal(kv, b);
    }
    if (b >= 0) kv->ref[b] = 1;
    return b;
}

void moet_kv_give(moet_kv *kv, int32_t id) {
    if (--kv->ref[id] > 0) return;
    if (kv->prefix && kv->sealed[id]) lru_append(kv, id);
    else kv->free_ids[kv->n_free++] = id;
}

void moet_kv_hold(moet_kv *kv, int32_t id) {
    if (kv->ref[id]++ == 0 && kv->prefix) lru_remove(kv, id); /* only sealed blocks are held from ref 0 */
}

int32_t moet_kv_free_tokens(const moet_kv *kv) {
    const int64_t t = (int64_t)moet_kv_available(kv) << kv->shift;
    return t > INT32_MAX ? INT32_MAX : (int32_t)t;
}

int32_t moet_kv_block_tokens(const moet_kv *kv) { return (int32_t)1 << kv->shift; }

int32_t moet_kv_tokens(const moet_kv *kv) {
    const int64_t t = (int64_t)kv->n_blocks << kv->shift;
    return t > INT32_MAX ? INT32_MAX : (int32_t)t;
}

uint64_t moet_kv_hit_tokens(const moet_kv *kv) { return kv->hit_tokens; }

int32_t moet_kv_type(const moet_kv *kv) { return kv->type == MOET_KVE_F16 ? MOET_KV_F16 : MOET_KV_F32; }
