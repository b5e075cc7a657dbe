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
 *
 * The pools hold f32 or f16 elements (moet_kv_ref.type; moet_session_options.kv_type). f16 halves the cache's
 * memory and the bytes a decode step's attention reads, which at long contexts are most of the step's bytes
 * (docs/performance.md, stop 41). Every path rounds a row to f16 once, when it is written (round to nearest even:
 * moet_f32_to_f16 on the CPU, __float2half_rn on the GPU, the same bits), and reads it back exactly, so the paths
 * agree as they do with an f32 cache: a kernel that keeps the row it wrote (the fused decode kernels) keeps it
 * rounded as stored.
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

/* The pools' element types (moet_kv_ref.type). */
#define MOET_KVE_F32 0
#define MOET_KVE_F16 1 /* IEEE binary16, as uint16_t bits */

/* One layer's view of one sequence's cache. Every pointer is backend memory. */
typedef struct {
    void *k, *v;           /* the layer's key and value pools: [n_blocks << shift][n_kv * head_dim] elements */
    const int32_t *blocks; /* the sequence's block table: its block i is pool block blocks[i] */
    int32_t shift;         /* log2 of the tokens a block holds, 0 .. MOET_KV_SHIFT_MAX */
    int32_t type;          /* MOET_KVE_F32 or MOET_KVE_F16 */
} moet_kv_ref;

#ifdef __cplusplus
static_assert(sizeof(moet_kv_ref) == 32, "moet_kv_ref is read by device code as 32 bytes");
#else
_Static_assert(sizeof(moet_kv_ref) == 32, "moet_kv_ref is read by device code as 32 bytes");
#endif

/* Bytes an element of a pool of this type. */
MOET_HD int64_t moet_kve_size(int32_t type) { return type == MOET_KVE_F16 ? 2 : 4; }

/* The pool row of token position p. */
MOET_HD int64_t moet_kv_row(const int32_t *blocks, int32_t shift, int64_t p) {
    return ((int64_t)blocks[p >> shift] << shift) | (p & (((int64_t)1 << shift) - 1));
}

#endif
