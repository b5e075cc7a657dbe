/* kv_int.h — the paged KV pool (moet_kv) as the session sees it: block ids handed out and taken back. */
#ifndef MOET_RUNTIME_KV_INT_H
#define MOET_RUNTIME_KV_INT_H

#include "backend/backend.h"
#include "moet.h"

struct moet_kv {
    const moet_model *m;
    moet_backend *be;
    int32_t n_blocks, shift, n_free, refs;
    float **k, **v;    /* [layer] pools: [n_blocks << shift][n_kv * head_dim] floats, backend memory */
    int32_t *free_ids; /* a stack of the free block ids: the lowest id on top at first (deterministic layouts) */
};

/* A pool on `be` (the session's backend, which may differ from the model's). */
int moet_kv_create_on(const moet_model *m, moet_backend *be, int32_t n_tokens, int32_t block_tokens, moet_kv **out,
                      char *err, size_t errlen);
/* Another reference (a session using the pool); moet_kv_free drops one. */
void moet_kv_retain(moet_kv *kv);
/* A free block's id, or -1 when none is left; and a block given back. */
int32_t moet_kv_take(moet_kv *kv);
void moet_kv_give(moet_kv *kv, int32_t id);

#endif
