/*
 * kv_page.h — the paged KV cache's addressing, shared by the CPU reference and the CUDA kernels.
 *
 * Why paged: a contiguous cache per sequence reserves n_ctx rows whether the sequence uses them or not, so a server
 * with 16 slots of 32k context reserves 16 x 32k rows for requests that are mostly short. Here each layer's keys and
 * values live in pools of blocks of 2^shift token rows; a sequence holds a table of the blocks it uses (taken from
 * the pool as it grows, given back when it is truncated or freed), and token position p is pool row
 *     (blocks[p >> shift] << shift) | (p & (2^shift - 1)).
 * The table is in backend memory and its address does not change while the sequence lives, so a recorded decode
 * step (CUDA graph) reads the new blocks as the sequence grows. Block ids are shared by all layers (block b of
 * every layer belongs to the same sequence), so one table serves the whole model. A contiguous cache is the
 * identity table; blocks of 32 or more keep the tensor-core attention's 32-key tiles inside one block.
 */
#ifndef MOET_BACKEND_KV_PAGE_H
#define MOET_BACKEND_KV_PAGE_H

#include <stdint.h>

#ifndef MOET_HD
#ifdef __CUDACC__
#define MOET_HD __host__ __device__ __forceinline__
#else
#define MOET_HD static inline
#endif
#endif

#define MOET_KV_SHIFT_MAX 16 /* blocks of at most 65536 tokens */

/* One layer's view of one sequence's cache. Every pointer is backend memory. */
typedef struct {
    float *k, *v;          /* the layer's key and value pools: [n_blocks << shift][n_kv * head_dim] floats */
    const int32_t *blocks; /* the sequence's block table: its block i is pool block blocks[i] */
    int32_t shift;         /* log2 of the tokens a block holds, 0 .. MOET_KV_SHIFT_MAX */
    int32_t pad_;
} moet_kv_ref;

#ifdef __cplusplus
static_assert(sizeof(moet_kv_ref) == 32, "moet_kv_ref is read by device code as 32 bytes");
#else
_Static_assert(sizeof(moet_kv_ref) == 32, "moet_kv_ref is read by device code as 32 bytes");
#endif

/* The pool row of token position p. */
MOET_HD int64_t moet_kv_row(const int32_t *blocks, int32_t shift, int64_t p) {
    return ((int64_t)blocks[p >> shift] << shift) | (p & (((int64_t)1 << shift) - 1));
}

#endif
