/*
 * attn_tc.cu — causal GQA prefill attention on tensor cores (flash-attention form), fp32-exact by 3xTF32.
 *
 * Why: k_attention (attention.cu) runs a CTA per (query head, token) on CUDA cores; at 512 tokens it was 52% of a
 * qwen3-30b-a3b prefill layer's kernel time (720 us), ~3% of what the FLOPs allow. Here a CTA takes 64 query rows of
 * one kv head's group (row r = token r / G, head r % G, G = n_heads / n_kv, so a chunk of few tokens still fills the
 * tile and the group's heads share every K/V tile), walks the keys in tiles of 32 (cp.async, two in flight) and
 * keeps the online softmax in registers: S = Q K^T and O += P V are m16n8k8 TF32 mma.
 *
 * Exactness: every fp32 operand x is split as big = tf32(x) (round to nearest), small = tf32(x - big), and a
 * product is small·big + big·small + big·big (the small·small term, ~2^-22 relative, dropped), accumulated in
 * fp32 (an f16 cache's K and V are exact in TF32, 11 significant bits each: their small parts are zero, and the
 * products with them are skipped, two of three mma a term left): within a few fp32 ulps of the CUDA-core kernel, not a BF16/TF32 approximation. TF32 keeps fp32's exponent,
 * so no scaling is needed for range (an f16 split would need one per row, and V has none that works for P V).
 *
 * Fragment bookkeeping: the S accumulator holds keys 2t, 2t+1 of each 8-key n-tile in lane (g, t); P V needs A
 * columns t and t+4, so the k order of P V is permuted (k = t <-> key 2t, k = t + 4 <-> key 2t + 1) and V's B
 * fragment is read in the same order: P stays in registers, no shuffles. Rows are padded to HD + 4 floats, which
 * makes every fragment load (Q and K: row g, column t; V: row 2t, column g) hit 32 different banks.
 *
 * Balance: causal row tiles differ in work up to n_tok / 8 times (G = 8), and at 512 tokens the grid is one wave, so
 * the last tiles bounded the kernel. Where the grid is one wave at most the heavier half of
 * the row tiles is split over two CTAs, each taking half of the key tiles; each writes its running (o, m, l) to
 * scratch and takes a ticket; the second merges both, half 0's terms first whichever finished first, so the result
 * does not depend on timing, and resets the ticket.
 * Per CTA and key tile: 64 x 32 x HD x 2 useful MACs (x3 for the split), 2 x 32 x HD x 4 bytes from L2 (the cache of
 * a 512-token prefill is 256 KB a kv head). Deterministic: fixed order, no float atomics, so graph replays are
 * bit-equal.
 */
#include <math.h>
#include <stdlib.h>

#include "backend/cuda/common.cuh"
#include "backend/cuda/cuda_int.h"

#define TA_ROWS 64 /* query rows a CTA (4 warps x 16) */
#define TA_KT 32   /* keys a tile */
#define TA_W 4

__device__ __forceinline__ void ta_split(float x, uint32_t &big, uint32_t &small) {
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(big) : "f"(x));
    const float r = x - __uint_as_float(big);
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(small) : "f"(r));
}

/* not volatile: no side effects, so the compiler may interleave independent products */
__device__ __forceinline__ void ta_mma(float *d, const uint32_t *a, uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void ta_cp16(float *dst, const float *src, int valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(cu_smem_u32(dst)), "l"(src), "r"(valid ? 16 : 0)
                 : "memory");
}

template <int HD> struct ta_dims {
    static constexpr int LD = HD + 4;
    static constexpr size_t smem = (size_t)(TA_ROWS + 4 * TA_KT) * LD * sizeof(float);
};

/* 4 f16 pool elements (8 bytes) as floats into shared memory; zeros where !valid. */
__device__ __forceinline__ void ta_ld4h(float *dst, const __half *src, int valid) {
    uint2 raw = make_uint2(0u, 0u);
    if (valid) raw = *(const uint2 *)src;
    const float2 a = __half22float2(*(const __half2 *)&raw.x), b = __half22float2(*(const __half2 *)&raw.y);
    *(float4 *)dst = make_float4(a.x, a.y, b.x, b.y);
}

/* Key tile kt into buffer b (all threads of the CTA; one cp.async group): rows past the last key are zero, so P V
 * sees 0 x 0 there, never stale memory. An f16 pool's rows are loaded through registers and widened (the group is
 * then empty: the tile is in place at the barrier that follows; the next tile's loads are not overlapped with this
 * tile's products as cp.async's are, which costs what the L2 latency is, once a tile). */
template <int HD, typename E>
__device__ __forceinline__ void ta_load_tile(float *sk, float *sv, const E *kb, const E *vb, int64_t kv_stride,
                                             const int32_t *blocks, int32_t shift, int32_t n_keys, int kt, int b) {
    constexpr int LD = ta_dims<HD>::LD;
    for (int i = threadIdx.x; i < TA_KT * (HD / 4); i += TA_W * 32) {
        const int row = i / (HD / 4), c4 = i % (HD / 4);
        const int64_t j = (int64_t)kt * TA_KT + row;
        const int valid = j < n_keys;
        const int64_t off = moet_kv_row(blocks, shift, valid ? j : 0) * kv_stride + 4 * c4;
        if constexpr (sizeof(E) == 2) {
            ta_ld4h(sk + (b * TA_KT + row) * LD + 4 * c4, (const __half *)kb + off, valid);
            ta_ld4h(sv + (b * TA_KT + row) * LD + 4 * c4, (const __half *)vb + off, valid);
        } else {
            ta_cp16(sk + (b * TA_KT + row) * LD + 4 * c4, (const float *)kb + off, valid);
            ta_cp16(sv + (b * TA_KT + row) * LD + 4 * c4, (const float *)vb + off, valid);
        }
    }
    asm volatile("cp.async.commit_group;" ::: "memory");
}

/* floats a thread leaves for its split partner: o, then m and l of its two rows */
template <int HD> struct ta_part { static constexpr int per_thread = HD / 8 * 4 + 4; };

/* grid (n_kv, n_rt + n_split): the row tiles by rank, heaviest (the last rows) first; ranks < n_split as two CTAs
 * (y = 2 rank + half), the rest one (y = n_split + rank). part / tickets: n_kv n_split slots (n_split > 0). */
template <int HD, typename E>
__global__ void __launch_bounds__(TA_W * 32, 2)
k_attn_tc(const float *q, moet_kv_ref kv, const int32_t *pos, int32_t n_tok, int32_t n_heads,
          int32_t n_kv, float scale, float *out, int32_t n_rt, int32_t n_split, float *part, int32_t *tickets) {
    constexpr int LD = ta_dims<HD>::LD, ND = HD / 8;
    extern __shared__ __align__(16) float ta_sm[];
    float *sq = ta_sm, *sk = sq + TA_ROWS * LD, *sv = sk + 2 * TA_KT * LD;
    __shared__ int32_t s_pos[TA_ROWS];
    __shared__ int32_t s_max;
    cu_pdl_trigger();
    cu_pdl_wait();
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const int G = n_heads / n_kv, kvh = blockIdx.x, Y = blockIdx.y;
    const int rank = Y < 2 * n_split ? Y >> 1 : Y - n_split, half = Y < 2 * n_split ? Y & 1 : -1;
    const int64_t R = (int64_t)n_tok * G, r0 = (int64_t)(n_rt - 1 - rank) * TA_ROWS;
    const int64_t kv_stride = (int64_t)n_kv * HD;
    if (tid == 0) s_max = -1;
    __syncthreads();
    if (tid < TA_ROWS) {
        const int64_t r = r0 + tid;
        const int32_t p = r < R ? pos[r / G] : -1;
        s_pos[tid] = p;
        atomicMax(&s_max, p);
    }
    /* Q rows (zero past the last row) */
    for (int i = tid; i < TA_ROWS * (HD / 4); i += TA_W * 32) {
        const int row = i / (HD / 4), c4 = i % (HD / 4);
        const int64_t r = r0 + row;
        const int valid = r < R;
        const int64_t tok = valid ? r / G : 0, h = valid ? (int64_t)kvh * G + r % G : 0;
        ta_cp16(sq + row * LD + 4 * c4, q + (tok * n_heads + h) * HD + 4 * c4, valid);
    }
    __syncthreads(); /* s_max */
    const int32_t n_keys = s_max + 1, n_all = (n_keys + TA_KT - 1) / TA_KT;
    /* this CTA's key tiles: all, or half of them (a split row tile) */
    const int32_t kt0 = half == 1 ? (n_all + 1) / 2 : 0, kt1 = half == 0 ? (n_all + 1) / 2 : n_all;
    const E *kb = (const E *)kv.k + (int64_t)kvh * HD, *vb = (const E *)kv.v + (int64_t)kvh * HD;
    if (kt1 > kt0) ta_load_tile<HD, E>(sk, sv, kb, vb, kv_stride, kv.blocks, kv.shift, n_keys, kt0, 0);
    else asm volatile("cp.async.commit_group;" ::: "memory"); /* the Q rows' group, waited for below */

    const int rw = warp * 16; /* this warp's rows in the tile */
    const int32_t p_lo = s_pos[rw + g], p_hi = s_pos[rw + g + 8];
    float o[ND][4];
#pragma unroll
    for (int d = 0; d < ND; d++) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.f;
    float m_lo = -INFINITY, m_hi = -INFINITY, l_lo = 0.f, l_hi = 0.f;

    for (int kt = kt0; kt < kt1; kt++) {
        const int b = (kt - kt0) & 1;
        if (kt + 1 < kt1) {
            ta_load_tile<HD, E>(sk, sv, kb, vb, kv_stride, kv.blocks, kv.shift, n_keys, kt + 1, b ^ 1);
            asm volatile("cp.async.wait_group 1;" ::: "memory");
        } else {
            asm volatile("cp.async.wait_group 0;" ::: "memory");
        }
        __syncthreads();
        const float *K = sk + b * TA_KT * LD, *V = sv + b * TA_KT * LD;
        /* S = Q K^T over this tile's 32 keys: 4 n-tiles of 8. Each k-step's three products go to a zeroed
         * accumulator (small terms first) that is then added to S in fp32: the tensor cores' accumulation
         * truncates, so adding into the running sum directly lost bits at the sum's scale every step (rows off by
         * up to 2e-6 of their largest value, against ~4e-7 this way). */
        float s[4][4];
#pragma unroll
        for (int n = 0; n < 4; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) s[n][e] = 0.f;
#pragma unroll 4
        for (int ks = 0; ks < ND; ks++) {
            const float *qa = sq + (rw + g) * LD + ks * 8 + t;
            uint32_t ab[4], as[4], bb[4][2], bs[4][2];
            ta_split(qa[0], ab[0], as[0]);
            ta_split(qa[8 * LD], ab[1], as[1]);
            ta_split(qa[4], ab[2], as[2]);
            ta_split(qa[8 * LD + 4], ab[3], as[3]);
#pragma unroll
            for (int n = 0; n < 4; n++) {
                const float *kr = K + (n * 8 + g) * LD + ks * 8 + t;
                ta_split(kr[0], bb[n][0], bs[n][0]);
                ta_split(kr[4], bb[n][1], bs[n][1]);
            }
            float tk[4][4];
#pragma unroll
            for (int n = 0; n < 4; n++) tk[n][0] = tk[n][1] = tk[n][2] = tk[n][3] = 0.f;
#pragma unroll
            for (int n = 0; n < 4; n++) ta_mma(tk[n], as, bb[n][0], bb[n][1]);
            if constexpr (sizeof(E) != 2) /* an f16 key is exact in TF32: its small part is zero, the product too */
#pragma unroll
                for (int n = 0; n < 4; n++) ta_mma(tk[n], ab, bs[n][0], bs[n][1]);
#pragma unroll
            for (int n = 0; n < 4; n++) ta_mma(tk[n], ab, bb[n][0], bb[n][1]);
#pragma unroll
            for (int n = 0; n < 4; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) s[n][e] += tk[n][e];
        }
        /* scale, causal mask (key j visible to a row at position p iff j <= p), online softmax per row */
        float mx_lo = m_lo, mx_hi = m_hi;
#pragma unroll
        for (int n = 0; n < 4; n++) {
            const int32_t j = kt * TA_KT + n * 8 + 2 * t;
            s[n][0] = j <= p_lo ? s[n][0] * scale : -INFINITY;
            s[n][1] = j + 1 <= p_lo ? s[n][1] * scale : -INFINITY;
            s[n][2] = j <= p_hi ? s[n][2] * scale : -INFINITY;
            s[n][3] = j + 1 <= p_hi ? s[n][3] * scale : -INFINITY;
            mx_lo = fmaxf(mx_lo, fmaxf(s[n][0], s[n][1]));
            mx_hi = fmaxf(mx_hi, fmaxf(s[n][2], s[n][3]));
        }
        mx_lo = fmaxf(mx_lo, __shfl_xor_sync(0xffffffffu, mx_lo, 1));
        mx_lo = fmaxf(mx_lo, __shfl_xor_sync(0xffffffffu, mx_lo, 2));
        mx_hi = fmaxf(mx_hi, __shfl_xor_sync(0xffffffffu, mx_hi, 1));
        mx_hi = fmaxf(mx_hi, __shfl_xor_sync(0xffffffffu, mx_hi, 2));
        const float ref_lo = mx_lo == -INFINITY ? 0.f : mx_lo, ref_hi = mx_hi == -INFINITY ? 0.f : mx_hi;
        const float c_lo = expf(m_lo - ref_lo), c_hi = expf(m_hi - ref_hi);
        m_lo = mx_lo;
        m_hi = mx_hi;
        float ps_lo = 0.f, ps_hi = 0.f;
#pragma unroll
        for (int n = 0; n < 4; n++) {
            s[n][0] = expf(s[n][0] - ref_lo);
            s[n][1] = expf(s[n][1] - ref_lo);
            s[n][2] = expf(s[n][2] - ref_hi);
            s[n][3] = expf(s[n][3] - ref_hi);
            ps_lo += s[n][0] + s[n][1];
            ps_hi += s[n][2] + s[n][3];
        }
        l_lo = l_lo * c_lo + ps_lo; /* a lane's partial of the row sum; the 4 lanes of a row are added at the end */
        l_hi = l_hi * c_hi + ps_hi;
#pragma unroll
        for (int d = 0; d < ND; d++) {
            o[d][0] *= c_lo;
            o[d][1] *= c_lo;
            o[d][2] *= c_hi;
            o[d][3] *= c_hi;
        }
        /* O += P V: k-step n is S's n-tile n, with k = t <-> key 2t and k = t + 4 <-> key 2t + 1 */
#pragma unroll
        for (int n = 0; n < 4; n++) {
            uint32_t ab[4], as[4];
            ta_split(s[n][0], ab[0], as[0]);
            ta_split(s[n][2], ab[1], as[1]);
            ta_split(s[n][1], ab[2], as[2]);
            ta_split(s[n][3], ab[3], as[3]);
            const float *vr = V + (n * 8 + 2 * t) * LD + g;
            /* four head-dim n-tiles at a time, term-major: 12 mma, each o[d] updated every 4th */
#pragma unroll
            for (int d0 = 0; d0 < ND; d0 += 4) {
                uint32_t bb[4][2], bs[4][2];
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    ta_split(vr[8 * (d0 + i)], bb[i][0], bs[i][0]);
                    ta_split(vr[LD + 8 * (d0 + i)], bb[i][1], bs[i][1]);
                }
                float tv[4][4]; /* as for S: a zeroed accumulator a k-step, added to O in fp32 */
#pragma unroll
                for (int i = 0; i < 4; i++) tv[i][0] = tv[i][1] = tv[i][2] = tv[i][3] = 0.f;
#pragma unroll
                for (int i = 0; i < 4; i++) ta_mma(tv[i], as, bb[i][0], bb[i][1]);
                if constexpr (sizeof(E) != 2) /* (f16 values: exact in TF32, as for K) */
#pragma unroll
                    for (int i = 0; i < 4; i++) ta_mma(tv[i], ab, bs[i][0], bs[i][1]);
#pragma unroll
                for (int i = 0; i < 4; i++) ta_mma(tv[i], ab, bb[i][0], bb[i][1]);
#pragma unroll
                for (int i = 0; i < 4; i++)
#pragma unroll
                    for (int e = 0; e < 4; e++) o[d0 + i][e] += tv[i][e];
            }
        }
        __syncthreads(); /* buffer b is refilled by the next iteration's load */
    }
    asm volatile("cp.async.wait_group 0;" ::: "memory");
    if (half >= 0) { /* a split row tile: leave the partial, the second to finish merges */
        constexpr int PS = ta_part<HD>::per_thread, NT = TA_W * 32;
        const int64_t slot = (int64_t)kvh * n_split + rank;
        float *mine = part + (slot * 2 + half) * (int64_t)(PS * NT);
#pragma unroll
        for (int d = 0; d < ND; d++)
#pragma unroll
            for (int e = 0; e < 4; e++) mine[(d * 4 + e) * NT + tid] = o[d][e];
        mine[(ND * 4 + 0) * NT + tid] = m_lo;
        mine[(ND * 4 + 1) * NT + tid] = m_hi;
        mine[(ND * 4 + 2) * NT + tid] = l_lo;
        mine[(ND * 4 + 3) * NT + tid] = l_hi;
        __threadfence();
        __syncthreads();
        __shared__ int32_t s_first;
        if (tid == 0) s_first = atomicAdd(&tickets[slot], 1) == 0;
        __syncthreads();
        if (s_first) return;
        __threadfence();
        const float *oth = part + (slot * 2 + (half ^ 1)) * (int64_t)(PS * NT);
        const float om_lo = __ldcg(oth + (ND * 4 + 0) * NT + tid), om_hi = __ldcg(oth + (ND * 4 + 1) * NT + tid);
        const float ol_lo = __ldcg(oth + (ND * 4 + 2) * NT + tid), ol_hi = __ldcg(oth + (ND * 4 + 3) * NT + tid);
        /* terms in half order: (0, 1) */
        const float m0l = half ? om_lo : m_lo, m1l = half ? m_lo : om_lo, m0h = half ? om_hi : m_hi, m1h = half ? m_hi : om_hi;
        const float Ml = fmaxf(m0l, m1l), Mh = fmaxf(m0h, m1h); /* finite: key 0 is in half 0 */
        const float f0l = m0l == -INFINITY ? 0.f : expf(m0l - Ml), f1l = m1l == -INFINITY ? 0.f : expf(m1l - Ml);
        const float f0h = m0h == -INFINITY ? 0.f : expf(m0h - Mh), f1h = m1h == -INFINITY ? 0.f : expf(m1h - Mh);
        const float l0l = half ? ol_lo : l_lo, l1l = half ? l_lo : ol_lo, l0h = half ? ol_hi : l_hi, l1h = half ? l_hi : ol_hi;
        l_lo = l0l * f0l + l1l * f1l;
        l_hi = l0h * f0h + l1h * f1h;
#pragma unroll
        for (int d = 0; d < ND; d++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const float ov = __ldcg(oth + (d * 4 + e) * NT + tid), x0 = half ? ov : o[d][e], x1 = half ? o[d][e] : ov;
                o[d][e] = e < 2 ? x0 * f0l + x1 * f1l : x0 * f0h + x1 * f1h;
            }
        if (tid == 0) tickets[slot] = 0; /* for the next launch */
    }
    l_lo += __shfl_xor_sync(0xffffffffu, l_lo, 1);
    l_lo += __shfl_xor_sync(0xffffffffu, l_lo, 2);
    l_hi += __shfl_xor_sync(0xffffffffu, l_hi, 1);
    l_hi += __shfl_xor_sync(0xffffffffu, l_hi, 2);
#pragma unroll
    for (int half = 0; half < 2; half++) {
        const int64_t r = r0 + rw + g + 8 * half;
        if (r >= R) continue;
        const int64_t tok = r / G, h = (int64_t)kvh * G + r % G;
        float *orow = out + (tok * n_heads + h) * HD;
        const float inv = 1.0f / (half ? l_hi : l_lo);
#pragma unroll
        for (int d = 0; d < ND; d++) {
            float2 v2 = make_float2(o[d][2 * half] * inv, o[d][2 * half + 1] * inv);
            *(float2 *)(orow + d * 8 + 2 * t) = v2;
        }
    }
}

static int g_ta_attr_dev = -1;

/* Runs the tensor-core kernel where it applies (returns 1 where it does not: the caller runs k_attention):
 * head_dim 64 or 128, at least TA_MIN_TOK tokens (MOET_ATTN_TC=0 turns it off, for A/B). */
extern "C" int cu_attn_tc(cu_backend *c, const moet_attn_args *a) {
    const char *e = getenv("MOET_ATTN_TC");
    const int off = e && e[0] == '0';
    const int hd = a->head_dim;
    if (off || a->n_tok < 2 || (hd != 64 && hd != 128) || a->n_kv <= 0 || a->n_heads % a->n_kv) return 1;
    const int64_t rows = (int64_t)a->n_tok * (a->n_heads / a->n_kv), tiles = (rows + TA_ROWS - 1) / TA_ROWS;
    if (tiles > 65535) return 1;
    if (g_ta_attr_dev != c->device) {
        if (CU_CHECK(c, cudaFuncSetAttribute(k_attn_tc<64, float>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)ta_dims<64>::smem)) ||
            CU_CHECK(c, cudaFuncSetAttribute(k_attn_tc<128, float>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)ta_dims<128>::smem)) ||
            CU_CHECK(c, cudaFuncSetAttribute(k_attn_tc<64, __half>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)ta_dims<64>::smem)) ||
            CU_CHECK(c, cudaFuncSetAttribute(k_attn_tc<128, __half>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)ta_dims<128>::smem)))
            return 0;
        g_ta_attr_dev = c->device;
    }
    /* split the heavier half of the row tiles where the grid is one wave at most (2 CTAs an SM: 30b at 512 tokens
     * 109 -> 97 us; at 235b's two waves it lost, 134 -> 146); MOET_ATTN_SPLIT=0 turns it off. The decision depends
     * on the shape alone, so a recorded step splits as its eager run did. */
    const char *se = getenv("MOET_ATTN_SPLIT");
    const int64_t sms = c->prop.multiProcessorCount;
    int32_t n_split = 0;
    if (!(se && se[0] == '0') && (int64_t)a->n_kv * tiles <= 2 * sms) n_split = (int32_t)(tiles / 2);
    float *part = NULL;
    int32_t *tickets = NULL;
    if (n_split > 0) {
        /* one buffer for every shape, made once and never moved (recorded steps keep its address): n_kv n_split <=
         * SMs slots by the rule above; [tickets, 256-byte aligned][partials], tickets zero between launches */
        const size_t tb = ((size_t)sms * sizeof(int32_t) + 255) & ~(size_t)255;
        if (!c->attn_part) {
            const size_t need = tb + (size_t)sms * 2 * (size_t)ta_part<128>::per_thread * TA_W * 32 * sizeof(float);
            if (c->capturing) return 1; /* cannot allocate while recording: the CUDA-core kernel (never reached:
                                            every recorded step ran eagerly first) */
            if (CU_CHECK(c, cudaMalloc(&c->attn_part, need)) ||
                CU_CHECK(c, cudaMemsetAsync(c->attn_part, 0, need, c->stream)))
                return 0;
        }
        tickets = (int32_t *)c->attn_part;
        part = (float *)((char *)c->attn_part + tb);
    }
    const dim3 grid((unsigned)a->n_kv, (unsigned)(tiles + n_split)), block(TA_W * 32);
    const int f16 = a->kv.type == MOET_KVE_F16;
#define TA_GO(HD, E) cu_launch_pdl(c, k_attn_tc<HD, E>, grid, block, ta_dims<HD>::smem, a->q, a->kv, a->pos, \
                                   (int32_t)a->n_tok, a->n_heads, a->n_kv, a->scale, a->out, (int32_t)tiles, n_split, \
                                   part, tickets)
    if (hd == 64 && f16) TA_GO(64, __half);
    else if (hd == 64) TA_GO(64, float);
    else if (f16) TA_GO(128, __half);
    else TA_GO(128, float);
#undef TA_GO
    CU_LAUNCHED(c, "k_attn_tc");
    return 0;
}
