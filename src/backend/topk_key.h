/*
 * topk_key.h — the order of the top-k op (backend.h), shared by the CPU reference and the CUDA kernels so the two
 * agree bit for bit: a value and its index packed in one uint64 whose unsigned order is "larger value first, equal
 * values by lower index". The value's bits are mapped to an order-preserving unsigned (negatives flipped, positives
 * with the sign bit set); -0 counts as +0 (they compare equal as floats, so the lower index must win, as a scan
 * with `>` does); NaN ranks below every number. Key 0 is below every element: the kernels pad with it.
 */
#ifndef MOET_BACKEND_TOPK_KEY_H
#define MOET_BACKEND_TOPK_KEY_H

#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define MOET_HD __host__ __device__ __forceinline__
#else
#define MOET_HD static inline
#endif

#define MOET_TOPK_MAX 64 /* k at most */

MOET_HD uint64_t moet_topk_key(float v, uint32_t idx) {
    uint32_t u;
    memcpy(&u, &v, sizeof u);
    uint32_t o;
    if (v != v) o = 0;                       /* NaN */
    else if (v == 0.0f) o = 0x80000000u;     /* +0 and -0 */
    else o = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
    return ((uint64_t)o << 32) | (uint64_t)(0xFFFFFFFFu - idx);
}

MOET_HD uint32_t moet_topk_key_index(uint64_t key) { return 0xFFFFFFFFu - (uint32_t)key; }

#endif
