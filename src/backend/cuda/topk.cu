/*
 * topk.cu — sampling candidates on the device: the k (<= 64) largest logits of each row, so a decode step downloads
 * k ids and values instead of the whole row (151936 floats, 608 KB, for the Qwen3 vocabulary) and the host sorts k
 * candidates instead of the vocabulary.
 *
 * Values and indices are packed into one uint64 key (topk_key.h: larger value first, equal values by lower index),
 * so every comparison is one unsigned compare and the result is unique and deterministic. A CTA reduces a chunk of
 * TK_CHUNK keys to its best k: each lane sorts its 16 keys in registers (a bitonic network), the warp merges its 32
 * sorted lists by taking the largest head k times (a shuffle max; the lane that held it shifts its list), then warp
 * 0 merges the 8 warps' lists the same way (each lane takes a sorted quarter of one list). Chunks' results are
 * chunks again, so a row of V logits takes ceil(log_{TK_CHUNK / k}(V)) launches (two for 151936 at k = 64); the
 * last writes ids and the original values.
 * Bytes: the row once (4 V) plus 8 k a chunk; no FLOPs to speak of: the cost is the merges' dependent chain (k
 * steps of two warp reductions a merge, two merges a pass), a few microseconds a pass whatever the batch.
 * lz (the delta gate's confidence, backend.h): the first pass's CTAs also reduce their chunk to (max, sum of
 * exp(x - max)) (lanes in float, the warps' and the CTA's sums in double, fixed order) into scratch, and the last
 * pass merges a row's chunks in chunk order: lz = log sum_c s_c exp(m_c - M). The gate then needs 4 bytes a row,
 * not the row (the host's scan of 151936 exp() in double took 0.66 ms a step on the CI machine).
 */
#include "backend/cuda/common.cuh"
#include "backend/cuda/cuda_int.h"
#include "backend/topk_key.h"

#define TK_W 8
#define TK_PER 16                     /* keys a lane */
#define TK_CHUNK (TK_W * 32 * TK_PER) /* 4096 keys a CTA */

/* the 16 keys of a lane sorted descending, in registers (all indices compile-time) */
__device__ __forceinline__ void tk_sort16(uint64_t (&a)[TK_PER]) {
#pragma unroll
    for (int size = 2; size <= TK_PER; size <<= 1)
#pragma unroll
        for (int stride = size >> 1; stride > 0; stride >>= 1)
#pragma unroll
            for (int i = 0; i < TK_PER; i++) {
                const int j = i ^ stride;
                if (j > i) {
                    const uint64_t x = a[i], y = a[j], hi = x > y ? x : y, lo = x > y ? y : x;
                    const bool desc = (i & size) == 0;
                    a[i] = desc ? hi : lo;
                    a[j] = desc ? lo : hi;
                }
            }
}

/* The k best of the warp's 32 sorted lists (a[0] the head of each), in order, to out[0..k) (lane 0 writes). */
__device__ __forceinline__ void tk_merge(uint64_t (&a)[TK_PER], int k, uint64_t *out) {
    const int lane = threadIdx.x & 31;
    for (int it = 0; it < k; it++) {
        /* the warp's largest head: two 32-bit warp reductions (REDUX, sm_80+), the value half then the index half
         * among the lanes that hold the largest value (5 dependent 64-bit shuffles took 2.5x as long) */
        const uint32_t hi = (uint32_t)(a[0] >> 32), mh = __reduce_max_sync(0xffffffffu, hi);
        const uint32_t ml = __reduce_max_sync(0xffffffffu, hi == mh ? (uint32_t)a[0] : 0u);
        const uint64_t m = (uint64_t)mh << 32 | ml;
        if (a[0] == m) { /* keys are unique (or 0, padding, where shifting changes nothing) */
#pragma unroll
            for (int i = 0; i < TK_PER - 1; i++) a[i] = a[i + 1];
            a[TK_PER - 1] = 0;
        }
        if (lane == 0) out[it] = m;
    }
}

/* The chunk's (max, sum exp(v - max)) of the F32 pass, every thread of the CTA with its lane's values v (ok: in the
 * row); to part (thread 0). */
__device__ __forceinline__ void tk_lz_part(const float (&v)[TK_PER], const bool (&ok)[TK_PER], double2 *part) {
    __shared__ float wm[TK_W];
    __shared__ double ws[TK_W];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    float m = -INFINITY;
#pragma unroll
    for (int i = 0; i < TK_PER; i++)
        if (ok[i]) m = fmaxf(m, v[i]);
    for (int o = 16; o; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    if (lane == 0) wm[warp] = m;
    __syncthreads();
    m = wm[0];
    for (int w = 1; w < TK_W; w++) m = fmaxf(m, wm[w]);
    float sl = 0.f;
    if (m > -INFINITY)
#pragma unroll
        for (int i = 0; i < TK_PER; i++)
            if (ok[i]) sl += expf(v[i] - m);
    double sd = sl;
    for (int o = 16; o; o >>= 1) sd += __shfl_xor_sync(0xffffffffu, sd, o);
    if (lane == 0) ws[warp] = sd;
    __syncthreads();
    if (threadIdx.x == 0) {
        double t = 0;
        for (int w = 0; w < TK_W; w++) t += ws[w];
        *part = make_double2((double)m, t);
    }
}

/* grid (chunks, rows). F32: in is the float rows (row stride `stride`, `len` values), else keys of an earlier pass.
 * ids == NULL: the chunk's k keys to okeys[row * ostride + chunk * k]; else (one chunk a row) the row's result.
 * lz (the last pass, lz != NULL): F32 (one chunk a row) from its own part, else from the first pass's nparts parts a
 * row in parts; parts (the F32 pass when it is not the last): the chunk's part to parts[row * gridDim.x + chunk]. */
template <int F32>
__global__ void __launch_bounds__(TK_W * 32)
k_topk(const void *in, int64_t len, int64_t stride, int32_t k, uint64_t *okeys, int64_t ostride, const float *x,
       int64_t vocab, int32_t *ids, float *vals, double2 *parts, int64_t nparts, float *lz) {
    CU_TRACE(CU_TK_TOPK << 8 | F32);
    cu_pdl_trigger();
    cu_pdl_wait();
    CU_TRACE_WAITED();
    __shared__ uint64_t lists[TK_W][MOET_TOPK_MAX];
    __shared__ double2 own;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t row = blockIdx.y, base = (int64_t)blockIdx.x * TK_CHUNK + warp * (32 * TK_PER);
    uint64_t a[TK_PER];
    float v[TK_PER];
    bool ok[TK_PER];
#pragma unroll
    for (int i = 0; i < TK_PER; i++) {
        const int64_t e = base + lane + 32 * i;
        ok[i] = e < len;
        v[i] = 0.f;
        if (e >= len) a[i] = 0;
        else if (F32) { v[i] = __ldcg((const float *)in + row * stride + e); a[i] = moet_topk_key(v[i], (uint32_t)e); }
        else a[i] = __ldcg((const unsigned long long *)in + row * stride + e);
    }
    if (F32 && (parts || lz)) tk_lz_part(v, ok, lz && ids ? &own : parts + row * gridDim.x + blockIdx.x);
    tk_sort16(a);
    tk_merge(a, k, lists[warp]);
    __syncthreads();
    if (warp) return;
    { /* lane l: a quarter (16 keys, sorted) of warp l / 4's list; past k: padding */
        const int w = lane >> 2, q = (lane & 3) * TK_PER;
#pragma unroll
        for (int i = 0; i < TK_PER; i++) a[i] = q + i < k ? lists[w][q + i] : 0;
    }
    __shared__ uint64_t res[MOET_TOPK_MAX];
    tk_merge(a, k, res);
    __syncwarp();
    if (ids && lz && lane == 0) { /* the row's chunks merged in chunk order */
        double M = -INFINITY, S = 0;
        if (F32) { M = own.x; S = own.y; }
        else {
            const double2 *pr = parts + row * nparts;
            for (int64_t c = 0; c < nparts; c++) M = fmax(M, __ldcg(&pr[c].x));
            if (M > -INFINITY)
                for (int64_t c = 0; c < nparts; c++) S += __ldcg(&pr[c].y) * exp(__ldcg(&pr[c].x) - M);
        }
        lz[row] = (float)log(S);
    }
    for (int i = lane; i < k; i += 32) {
        const uint64_t key = res[i];
        if (ids) {
            const uint32_t id = moet_topk_key_index(key);
            ids[row * k + i] = (int32_t)id;
            vals[row * k + i] = __ldcg(x + row * vocab + id);
        } else {
            okeys[row * ostride + (int64_t)blockIdx.x * k + i] = key;
        }
    }
}

static int64_t tk_chunks(int64_t len) { return (len + TK_CHUNK - 1) / TK_CHUNK; }

/* keys of two passes, then the first pass's lz parts (16 bytes a chunk a row) */
extern "C" size_t cu_topk_scratch_bytes(moet_backend *be, int64_t n, int64_t vocab, int32_t k) {
    (void)be;
    return 2 * (size_t)n * (size_t)tk_chunks(vocab) * (size_t)(k > 0 ? k : 1) * sizeof(uint64_t) +
           (size_t)n * (size_t)tk_chunks(vocab) * sizeof(double2) + 16;
}

extern "C" void cu_topk(moet_backend *be, const float *x, int64_t n, int64_t vocab, int32_t k, void *scratch,
                        int32_t *ids, float *vals, float *lz) {
    cu_backend *c = cu_of(be);
    if (c->err[0] || n <= 0) return;
    if (k < 1 || k > MOET_TOPK_MAX || k > vocab || n > 65535) {
        cu_fail(c, cudaErrorInvalidValue, "topk: k outside [1, min(64, vocab)] or more than 65535 rows", __FILE__, __LINE__);
        return;
    }
    const size_t keys = (size_t)n * (size_t)tk_chunks(vocab) * (size_t)k;
    uint64_t *buf[2] = {(uint64_t *)scratch, (uint64_t *)scratch + keys};
    /* past the keys, rounded up to 16 bytes (double2 stores; the size has the 16 to spare) */
    double2 *parts = (double2 *)(((uintptr_t)((uint64_t *)scratch + 2 * keys) + 15) & ~(uintptr_t)15);
    const void *in = x;
    int64_t len = vocab, stride = vocab;
    const int64_t nparts = tk_chunks(vocab);
    int p = 0, f32 = 1;
    for (;;) {
        const int64_t nch = tk_chunks(len);
        const int last = nch == 1;
        const dim3 grid((unsigned)nch, (unsigned)n), block(TK_W * 32);
        int32_t *oi = last ? ids : NULL;
        float *ov = last ? vals : NULL, *olz = last ? lz : NULL;
        double2 *pp = lz && !last && f32 ? parts : NULL; /* the first pass writes them, the last reads them */
        if (f32)
            cu_launch_pdl(c, k_topk<1>, grid, block, 0, in, len, stride, k, buf[p], nch * k, x, vocab, oi, ov, pp,
                          nparts, olz);
        else
            cu_launch_pdl(c, k_topk<0>, grid, block, 0, in, len, stride, k, buf[p], nch * k, x, vocab, oi, ov, parts,
                          nparts, olz);
        if (CU_LAUNCHED(c, "k_topk") || last) return;
        in = buf[p];
        len = stride = nch * k;
        p ^= 1;
        f32 = 0;
    }
}
