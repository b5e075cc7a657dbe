/*
 * attn_split.cu — decode attention over long contexts: a kv head's query heads together, its keys split over CTAs
 * (flash-decoding), partial results merged by the last CTA in a fixed order.
 *
 * Why: attention.cu's kernels run a CTA per (query head, token), whose warps walk the keys four at a time with a
 * memory round trip each step: 32 CTAs at qwen3-30b-a3b's 32 heads, each reading its kv head's whole cache (the 8
 * heads of a group read the same rows 8 times), so a decode step's attention grows with the context at the speed
 * of one SM's dependent loads, not of the GPU's memory. Here a CTA takes one kv head's G query heads and a range of
 * its keys: every K and V row is read once a token, and the keys of a long context are spread over up to AS_SMAX
 * CTAs a kv head (n_kv x AS_SMAX CTAs: 128 at the Qwen3 shapes, one an SM).
 *
 * How a warp reads K (MOET_ATTN_SPLITK_KS): 1, the default on f32 pools since stop 43, stages a step's K rows by cp.async beside
 * its V rows (coalesced: 512 contiguous bytes a warp instruction), q . k from shared memory (two lanes a key over
 * 16-key steps on f32 pools; a lane a key over 32 on f16); 2, the default on f16 pools, does both products on
 * tensor cores, the heads the rows of m16n8k16 tiles (see the KS = 2 branch); 0 is stop 41's form, below: an
 * H100's Nsight Compute found it bound by instructions at ~2 warps a scheduler (a lane's K row loads touch 32 rows
 * an instruction; ~4300 instructions a warp for a 32-key chunk at ~7 cycles each), not by memory: KS = 1 took
 * 1.3-1.7x less time at every span.
 * KS = 0: a warp takes AS_CHUNK = 32 keys at a time: their V rows go to the warp's staging by cp.async first; for q . k a
 * lane a key (its whole K row requested at once into registers, the G query heads from shared memory by broadcast:
 * no cross-lane sums), then the online-softmax update per head over the warp's 32 scores, then for p . v a lane 4
 * dims of every head (head_dim <= 128) from the staged rows, the 32 keys' probabilities by broadcast. Decode
 * attention is bound by memory latency, so every load a lane makes in a chunk is in flight at once. Each warp keeps its own running max, sum and
 * output; the CTA merges its warps in warp order, and where a token's keys span several CTAs each writes its
 * partial (o, m, l per head) to scratch and takes a ticket; the last merges them in split order and resets the
 * ticket. The result does not depend on timing; bit for bit the same in every path that takes it (attention,
 * attn_fused, attn_rows: tests/test_ops.c), since the splits depend only on the number of keys.
 *
 * Splits: S = ceil(keys / kmin) up to AS_SMAX, the keys cut in whole chunks (kmin = AS_KMIN = 256: no split is
 * empty, see as_range; MOET_ATTN_SPLITK_KMIN=N, a multiple of 32, tries others, where an empty split's partial is
 * m = -inf and drops out of the merge).
 * The grid has as_nsplit(n_ctx) CTAs a kv head; those past S for this token's position return at once, so one
 * recorded decode step serves every position.
 *
 * With prep (attn_fused, attn_rows) the CTA first norms and rotates its G q heads and the k head with
 * k_attn_prep's arithmetic (the same per-warp partial sums in the same order: bit-identical), split 0 writes the q
 * rows back and the k and v rows to the cache row pos, and key pos itself is read from shared memory by every split
 * (no split reads that cache row in the launch that writes it).
 * An f16 pool (kv_page.h) is read as f16: K rows by 8-byte loads widened in registers, V rows staged as f16 (a
 * cp.async step moves twice the rows) and widened in p . v; the k and v rows of key pos are kept in shared memory
 * rounded to f16, as the cache holds them.
 * Bytes a token: (keys) x n_kv x head_dim x 8 (K and V rows, once; x 4 with f16) + the partials (S x n_heads x (head_dim + 2) x 4,
 * written and read once); FLOPs 4 x keys x n_heads x head_dim.
 */
#include <math.h>
#include <stdlib.h>

#include "backend/cuda/common.cuh"
#include "backend/cuda/cuda_int.h"

#define AS_WARPS 8
#define AS_CHUNK 32                      /* keys a warp takes at once (a lane a key) */
#define AS_KMIN (AS_WARPS * AS_CHUNK)    /* keys a split at least (the default) */
#define AS_SMAX 32                       /* splits a kv head at most */
#define AS_MAX_ROWS 65535

/* Splits of a token with `span` keys (the same function on the host, for the grid, and on the device). */
__host__ __device__ __forceinline__ int32_t as_nsplit(int32_t span, int32_t kmin) {
    const int32_t s = (span + kmin - 1) / kmin;
    return s < 1 ? 1 : s > AS_SMAX ? AS_SMAX : s;
}

/* Keys [*ka, *kb) of split s of S over [k0, k0 + span): whole chunks, per = ceil(chunks / S) a split. Never empty:
 * S = ceil(span / 256) gives chunks >= 8 (S - 1) + 1 > (S - 1) per when S is not capped, and when it is (32),
 * chunks >= 249 > 31 x 8. */
__device__ __forceinline__ void as_range(int32_t k0, int32_t span, int32_t S, int32_t s, int32_t *ka, int32_t *kb) {
    const int32_t chunks = (span + AS_CHUNK - 1) / AS_CHUNK, per = (chunks + S - 1) / S;
    const int32_t a = s * per * AS_CHUNK, b = (s + 1) * per * AS_CHUNK;
    *ka = k0 + (a < span ? a : span);
    *kb = k0 + (b < span ? b : span);
}

__device__ __forceinline__ void as_cp16(float *dst, const float *src, int valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(cu_smem_u32(dst)), "l"(src), "r"(valid ? 16 : 0)
                 : "memory");
}

template <int HD, int GT, typename E = float, int KS = 0> struct as_dims {
    static_assert(HD <= 128 && 128 % HD == 0 && GT <= AS_CHUNK, "a lane holds 4 dims of a head in p . v; o over the V staging");
    /* KS = 1 (K staged): keys a staging step (an f16 chunk whole; f32 in halves: K and V of 32 keys would not fit
     * 8 warps' shared memory), lanes a key in q . k, a staged K row's stride in elements (16 bytes of padding: the
     * lanes' row reads spread over the banks), the padded q rows' stride and half offset in floats */
    static constexpr int HK = sizeof(E) == 2 || KS >= 2 ? 32 : 16, LPK = 32 / HK;
    static constexpr int LDK = HD + 16 / (int)sizeof(E), LDQ = HD + 4 * LPK, QH = HD / LPK + 4;
    /* KS = 2 (tensor cores, f16 pools): V rows staged with K's padded stride (ldmatrix's 8 row addresses then fall
     * in 8 different bank groups) */
    static constexpr int LDV = KS >= 2 ? LDK : HD;
    static_assert(KS < 2 || (sizeof(E) == 2 && HD % 16 == 0), "the tensor-core path reads f16 pools");
    /* a warp's staging in floats: KS = 0 the chunk's V rows [32][HD] (E), KS = 1 a step's K rows [HK][LDK] then
     * its V rows [HK][HD] (E) */
    static constexpr size_t stg = KS ? (size_t)HK * (LDK + LDV) * sizeof(E) / 4 : (size_t)AS_CHUNK * HD;
    static_assert(stg >= (size_t)GT * HD, "the warps' outputs [W][GT][HD] go over the staging");
    /* dynamic shared memory, floats: q [GT][HD] | p [W][32][GT] | staging [W][stg] (then o [W][GT][HD]) | m, l [W][GT]
     * | k, v [HD] | cs [HD] | (KS = 1) q padded [GT][LDQ] */
    static constexpr size_t floats = (size_t)GT * HD + (size_t)AS_WARPS * 32 * GT + (size_t)AS_WARPS * stg +
                                     2 * (size_t)AS_WARPS * GT + 3 * (size_t)HD + (KS == 1 ? (size_t)GT * LDQ : 0);
    static constexpr size_t smem = floats * sizeof(float);
};

/* The CTA's rows normed and rotated in place as k_attn_prep does (elementwise.cu): rows r < G the group's query
 * heads (sq[r]), r = G its k head (sk). cs: the position's cos / sin (rot_dim / 2 each). A thread reads and writes the
 * same elements of a row (the partial path: after a barrier), so in place is safe. Every thread calls it (barriers). */
template <int HD>
__device__ __forceinline__ void as_prep(float *sq, float *sk, int G, const float *q_norm, const float *k_norm, float eps,
                                        int rot_dim, const float *cs, double *part) {
    const int half = HD / 2, T = ((half + 31) / 32) * 32, slots = AS_WARPS * 32 / T, nhw = T / 32;
    const int slot = threadIdx.x / T, i = threadIdx.x % T, rh = rot_dim / 2, partial = rot_dim != HD;
    for (int r0 = 0; r0 <= G; r0 += slots) { /* every thread runs every pass (the barriers) */
        const int r = r0 + slot, live = slot < slots && r <= G, is_q = r < G;
        float *dst = !live ? NULL : is_q ? sq + r * HD : sk; /* the raw row, normed and rotated in place */
        const float *row = dst;
        const float *nw = is_q ? q_norm : k_norm;
        float a = live && i < half ? row[i] : 0.f, b = live && i < half ? row[i + half] : 0.f;
        if (q_norm || k_norm) {
            const float inv = cu_head_rms_inv(a, b, slot, slots, i, nhw, part, HD, eps);
            if (live && nw && i < half) {
                a = nw[i] * (a * inv);
                b = nw[i + half] * (b * inv);
            }
        }
        if (partial) { /* rotate-half within the first rot_dim elements, the rest pass (k_attn_prep's partial path) */
            if (live && i < half) { dst[i] = a; dst[i + half] = b; }
            __syncthreads();
            if (live && i < rh) {
                const float x0 = dst[i], x1 = dst[i + rh], co = cs[i], si = cs[half + i];
                dst[i] = __fsub_rn(__fmul_rn(x0, co), __fmul_rn(x1, si));
                dst[i + rh] = __fadd_rn(__fmul_rn(x1, co), __fmul_rn(x0, si));
            }
        } else if (live && i < half) { /* no FMA contraction: k_attn_prep's floats */
            const float co = cs[i], si = cs[half + i];
            dst[i] = __fsub_rn(__fmul_rn(a, co), __fmul_rn(b, si));
            dst[i + half] = __fadd_rn(__fmul_rn(b, co), __fmul_rn(a, si));
        }
        __syncthreads();
    }
}

/* grid (n_kv, splits, rows). Row z: query row z of q / out (a token of a chunk, or with `rows` a sequence's own
 * token and cache), position pos[z]. prep: q, k, v are the raw projections (attn_fused / attn_rows), else q is
 * ready and the cache holds key pos (attention). part / tickets: as_scratch's layout for rows x n_kv x splits. */
/* 4 pool elements as floats (E = float: one 16-byte load; __half: one 8-byte load, widened) */
__device__ __forceinline__ float4 as_ld4(const float *p) { return __ldg((const float4 *)p); }
__device__ __forceinline__ float4 as_ld4(const __half *p) {
    const uint2 raw = __ldg((const uint2 *)p);
    const float2 a = __half22float2(*(const __half2 *)&raw.x), b = __half22float2(*(const __half2 *)&raw.y);
    return make_float4(a.x, a.y, b.x, b.y);
}
/* the same from shared memory (the V staging) */
__device__ __forceinline__ float4 as_sh4(const float *p) { return *(const float4 *)p; }
__device__ __forceinline__ float4 as_sh4(const __half *p) {
    const uint2 raw = *(const uint2 *)p;
    const float2 a = __half22float2(*(const __half2 *)&raw.x), b = __half22float2(*(const __half2 *)&raw.y);
    return make_float4(a.x, a.y, b.x, b.y);
}

/* p . v of a step (KS 0 and 1): a lane 4 dims of every head (head_dim <= 128), keys j0 .. j0 + nk - 1 in order,
 * their V rows staged at wv (rows HD apart; key cur from sv), their probabilities wp [key][GT] */
template <int HD, int GT, typename E>
__device__ __forceinline__ void as_pv(float (&o)[GT][4], const float *wp, const E *wv, int32_t nk, int32_t j0,
                                      int32_t cur, const float *sv, int G, int lane) {
    const int d = 4 * lane;
#pragma unroll 4
    for (int32_t c = 0; c < nk; c++) {
        const float4 vv = d >= HD ? make_float4(0.f, 0.f, 0.f, 0.f)
                          : j0 + c == cur ? *(const float4 *)(sv + d) : as_sh4(wv + c * HD + d);
#pragma unroll
        for (int h = 0; h < GT; h++) {
            if (h < G) {
                const float pr = wp[c * GT + h];
                o[h][0] = fmaf(pr, vv.x, o[h][0]);
                o[h][1] = fmaf(pr, vv.y, o[h][1]);
                o[h][2] = fmaf(pr, vv.z, o[h][2]);
                o[h][3] = fmaf(pr, vv.w, o[h][3]);
            }
        }
    }
}

/* KS = 2's fragments: two halves as one f16x2 register (lo half first), ldmatrix x4 (plain and transposed) from a
 * shared-memory address, m16n8k16 f16 mma with f32 accumulation (not volatile: no side effects) */
__device__ __forceinline__ uint32_t as_h2(__half a, __half b) {
    return (uint32_t)__half_as_ushort(a) | (uint32_t)__half_as_ushort(b) << 16;
}
__device__ __forceinline__ void as_ldsm4(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr) : "memory");
}
__device__ __forceinline__ void as_ldsm4t(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr) : "memory");
}
__device__ __forceinline__ void as_mma16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

template <int HD, int GT, typename E, int KS>
__global__ void __launch_bounds__(AS_WARPS * 32, 1)
k_attn_split(float *q, float *k, const float *v, int32_t n_heads, int32_t n_kv, const float *__restrict__ q_norm,
             const float *__restrict__ k_norm, float eps, const __grid_constant__ moet_rope rp, const int32_t *pos,
             moet_kv_ref kv, const moet_kv_ref *rows, float scale, const float *__restrict__ sinks, int32_t window,
             float *__restrict__ out, int32_t prep, float *part, int32_t *tickets, int32_t kmin) {
    CU_TRACE(CU_TK_ATTN_DECODE << 8 | 1);
    extern __shared__ __align__(16) float as_sm[];
    using DM = as_dims<HD, GT, E, KS>;
    float *sq = as_sm, *sp = sq + GT * HD, *stg = sp + AS_WARPS * 32 * GT, *smx = stg + AS_WARPS * DM::stg,
          *sl = smx + AS_WARPS * GT, *sk = sl + AS_WARPS * GT, *sv = sk + HD, *cs = sv + HD, *sqp = cs + HD;
    float *so = stg; /* the warps' outputs [W][GT][HD] after the loop, over the V staging (GT <= AS_CHUNK) */
    __shared__ double dpart[AS_WARPS];
    __shared__ int s_last;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int G = n_heads / n_kv, kvh = blockIdx.x, s = blockIdx.y, S_grid = gridDim.y;
    const int64_t z = blockIdx.z, dq = (int64_t)n_heads * HD, dk = (int64_t)n_kv * HD;
    cu_pdl_trigger();
    const int32_t p = pos[z]; /* uploaded before the step's first kernel */
    const int32_t k0 = window > 0 && p + 1 > window ? p + 1 - window : 0, span = p + 1 - k0;
    const int32_t S = min(as_nsplit(span, kmin), S_grid);
    if (s >= S) return;
    int32_t ka, kb;
    as_range(k0, span, S, s, &ka, &kb);
    q += z * dq;
    out += z * dq;
    if (prep) { k += z * dk; v += z * dk; }
    if (rows) kv = rows[z];
    const int rot_dim = rp.dim;
    if (prep)
        for (int i = tid; i < rot_dim / 2; i += blockDim.x) cu_rope_cs(rp, i, p, &cs[i], &cs[HD / 2 + i]);
    const int32_t cur = prep ? p : -1;
    const int64_t kvd = dk;
    const E *kb0 = (const E *)kv.k + (int64_t)kvh * HD, *vb0 = (const E *)kv.v + (int64_t)kvh * HD;
    E *wv = (E *)(stg + (size_t)warp * DM::stg); /* KS = 0: the warp's chunk of V rows [32][HD] (f16: half of it) */
    E *wk = wv, *wv1 = wv + DM::HK * DM::LDK;     /* KS >= 1: a step's K rows [HK][LDK], V rows [HK][LDV] */
    constexpr int KP = HD / 4 > 16 && GT >= 16 ? 16 : HD / 4; /* float4 of a K row a piece: 32 at most (128 registers) */
    /* The chunk's V rows from j0 (nk of them; roff: each lane's key's row offset) into the warp's staging by
     * cp.async (16 bytes a lane a step, rows whole; past the last key zero-filled), one group: in flight while q . k
     * runs (what bounds a decode attention is memory latency). The rows' offsets by shuffle: a block-table load a
     * row was a dependent round trip each (the first run took 3.2x attention.cu's time at 128 keys, an H100). */
    auto stage = [&](int32_t nk, int64_t roff) {
        constexpr int EP = 16 / (int)sizeof(E);            /* elements a 16-byte step */
        constexpr int RPI = 32 * EP / HD, C4 = HD / EP;    /* rows a step (32 lanes x 16 bytes), steps a row */
#pragma unroll
        for (int it = 0; it < AS_CHUNK / RPI; it++) {
            const int r = it * RPI + lane / C4, c4 = lane % C4;
            const int64_t ro = __shfl_sync(0xffffffffu, roff, r);
            as_cp16((float *)(wv + r * HD + EP * c4), (const float *)(vb0 + ro + EP * c4), r < nk);
        }
        asm volatile("cp.async.commit_group;" ::: "memory");
    };
    /* KS >= 1: a step's K rows, then its V rows, into the warp's staging by cp.async (rows whole, coalesced: a lane
     * 16 bytes of a row; rows past nk zero-filled), a group each; row r's offset is lane hoff + r's roff. which:
     * bit 0 the K rows, bit 1 the V rows */
    auto stage_kv = [&](int32_t nk, int64_t roff, int hoff, int which = 3) {
        constexpr int EP = 16 / (int)sizeof(E), RPI = 32 * EP / HD, C4 = HD / EP;
#pragma unroll
        for (int kvs = 0; kvs < 2; kvs++) {
            if (!((which >> kvs) & 1)) continue;
#pragma unroll
            for (int it = 0; it < DM::HK / RPI; it++) {
                const int r = it * RPI + lane / C4, c4 = lane % C4;
                const int64_t ro = __shfl_sync(0xffffffffu, roff, hoff + r);
                E *dst = kvs ? wv1 + r * DM::LDV : wk + r * DM::LDK;
                as_cp16((float *)(dst + EP * c4), (const float *)((kvs ? vb0 : kb0) + ro + EP * c4), r < nk);
            }
            asm volatile("cp.async.commit_group;" ::: "memory");
        }
    };
    /* With prep (one token a row: every cache row but pos was written by earlier steps, before this step's first
     * kernel) the warp's first chunk is requested before the wait: its V rows staged, each lane's K row fetched
     * into L2 (held in registers it took 128 more and spilled). At a short context that is all of the attention's
     * memory traffic, off the critical path, as k_attn_decode's first group (stop 31). */
    const int32_t j0f = ka + warp * AS_CHUNK;
    const int pre = prep && j0f < kb;
    int64_t roff_pre = 0;
    if (pre) {
        const int32_t j = j0f + lane;
        roff_pre = moet_kv_row(kv.blocks, kv.shift, j < kb ? j : ka) * kvd;
        if constexpr (KS) {
            stage_kv(kb - j0f < DM::HK ? kb - j0f : DM::HK, roff_pre, 0);
        } else {
            stage(kb - j0f < AS_CHUNK ? kb - j0f : AS_CHUNK, roff_pre);
            if (j != cur && j < kb)
                for (int b = 0; b < HD * (int)sizeof(E); b += 128)
                    asm volatile("prefetch.global.L2 [%0];" ::"l"((const char *)(kb0 + roff_pre) + b));
        }
    }
    cu_pdl_wait();
    CU_TRACE_WAITED();
    if (prep) { /* the raw rows into shared memory in one round trip, then normed and rotated there */
        for (int j = tid; j < G * HD; j += blockDim.x) sq[j] = q[(int64_t)kvh * G * HD + j];
        for (int j = tid; j < HD; j += blockDim.x) {
            sk[j] = k[(int64_t)kvh * HD + j];
            sv[j] = v[(int64_t)kvh * HD + j];
        }
        __syncthreads();
        as_prep<HD>(sq, sk, G, q_norm, k_norm, eps, rot_dim, cs, dpart);
        /* key cur's rows as the cache holds them (f16: rounded), for every split's reads of them */
        for (int j = tid; j < HD; j += blockDim.x) { sk[j] = cu_kv_as<E>(sk[j]); sv[j] = cu_kv_as<E>(sv[j]); }
        __syncthreads();
        if (s == 0) { /* k and v into the cache row pos (no split reads that row: key cur comes from sk / sv); the q
                       * rows go back at the end, by the CTA that merges (other splits still read the raw q here) */
            const int64_t prow = moet_kv_row(kv.blocks, kv.shift, p);
            for (int j = tid; j < HD; j += blockDim.x) {
                cu_kv_st((E *)kv.k + prow * kvd + (int64_t)kvh * HD + j, sk[j]);
                cu_kv_st((E *)kv.v + prow * kvd + (int64_t)kvh * HD + j, sv[j]);
            }
        }
    } else {
        for (int j = tid; j < G * HD; j += blockDim.x) sq[j] = q[(int64_t)kvh * G * HD + j];
        __syncthreads();
    }
    if constexpr (KS == 1) { /* the q rows padded for q . k: a head's LPK parts of HD / LPK dims QH apart */
        constexpr int PD = HD / DM::LPK;
        for (int e = tid; e < G * HD; e += blockDim.x) sqp[(e / HD) * DM::LDQ + (e % HD) / PD * DM::QH + e % PD] = sq[e];
        __syncthreads();
    }
    float m[GT], l[GT], o[GT][4];
#pragma unroll
    for (int h = 0; h < GT; h++) {
        m[h] = -INFINITY;
        l[h] = 0.f;
        o[h][0] = o[h][1] = o[h][2] = o[h][3] = 0.f;
    }
    float *wp = sp + warp * 32 * GT; /* the warp's probabilities [32 keys][GT] */
    /* KS = 2's state: a lane (g, t) = (lane / 4, lane % 4) of the m16n8k16 fragments; rows (query heads) g and g + 8 */
    const int tg = lane >> 2, tt = lane & 3;
    float tm[2] = {-INFINITY, -INFINITY}, tl[2] = {0.f, 0.f}, to[KS >= 2 ? HD / 8 : 1][4];
    if constexpr (KS >= 2) {
#pragma unroll
        for (int n = 0; n < HD / 8; n++) to[n][0] = to[n][1] = to[n][2] = to[n][3] = 0.f;
    }
    if constexpr (KS == 0) {
        for (int32_t j0 = ka + warp * AS_CHUNK; j0 < kb; j0 += AS_WARPS * AS_CHUNK) {
            const int32_t nk = kb - j0 < AS_CHUNK ? kb - j0 : AS_CHUNK;
            const int32_t j = j0 + lane, valid = j < kb;
            const int first = pre && j0 == j0f; /* requested before the wait */
            /* the lane's key's row in the pools (one block-table load a lane) */
            const int64_t roff = first ? roff_pre : moet_kv_row(kv.blocks, kv.shift, valid ? j : ka) * kvd;
            if (!first) stage(nk, roff);
            /* q . k, a lane its key: the whole K row requested at once (HD / 4 loads in flight a lane), then the sums;
             * key cur (this launch's own) from its shared copy, the same sums */
            float acc[GT];
#pragma unroll
            for (int h = 0; h < GT; h++) acc[h] = 0.f;
            {
                const E *kr = kb0 + roff;
#pragma unroll
                for (int pc = 0; pc < HD / 4; pc += KP) {
                    float4 kk[KP];
                    if (j == cur) {
#pragma unroll
                        for (int u = 0; u < KP; u++) kk[u] = ((const float4 *)sk)[pc + u];
                    } else {
#pragma unroll
                        for (int u = 0; u < KP; u++) kk[u] = as_ld4(kr + 4 * (pc + u));
                    }
#pragma unroll
                    for (int u = 0; u < KP; u++)
#pragma unroll
                        for (int h = 0; h < GT; h++) {
                            if (h < G) {
                                const float4 qq = *(const float4 *)(sq + h * HD + 4 * (pc + u));
                                acc[h] = fmaf(qq.x, kk[u].x, acc[h]);
                                acc[h] = fmaf(qq.y, kk[u].y, acc[h]);
                                acc[h] = fmaf(qq.z, kk[u].z, acc[h]);
                                acc[h] = fmaf(qq.w, kk[u].w, acc[h]);
                            }
                        }
                }
            }
            /* the online softmax over the warp's 32 scores, a head at a time (the warp's own running m, l, o) */
#pragma unroll
            for (int h = 0; h < GT; h++) {
                if (h < G) {
                    const float sc = valid ? acc[h] * scale : -INFINITY;
                    float mx = sc;
#pragma unroll
                    for (int off = 16; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
                    const float mn = fmaxf(m[h], mx), corr = expf(m[h] - mn), pr = expf(sc - mn);
                    l[h] = l[h] * corr + pr; /* a lane's share: summed over the lanes at the end */
#pragma unroll
                    for (int e = 0; e < 4; e++) o[h][e] *= corr;
                    m[h] = mn;
                    wp[lane * GT + h] = pr;
                }
            }
            asm volatile("cp.async.wait_all;" ::: "memory");
            __syncwarp();
            /* p . v: a lane 4 dims of every head (head_dim <= 128), the chunk's keys in order */
            as_pv<HD, GT>(o, wp, wv, nk, j0, cur, sv, G, lane);
            __syncwarp(); /* wp and wv are rewritten by the next chunk */
        }
    } else if constexpr (KS == 1) {
        /* K staged (KS = 1): a warp's chunk in steps of HK keys, each step's K and V rows by cp.async into shared
         * memory (coalesced: a warp reads 512 contiguous bytes an instruction, where KS = 0's lane-a-row loads
         * touch 32 rows each); q . k from there, LPK lanes a key (each HD / LPK dims, then one shuffle), the V
         * rows arriving meanwhile; the online softmax and p . v as KS = 0 */
        constexpr int LPK = DM::LPK, PD = HD / LPK;
        const int kk = lane / LPK, hh = lane % LPK;
        for (int32_t j0 = ka + warp * AS_CHUNK; j0 < kb; j0 += AS_WARPS * AS_CHUNK) {
            const int first = pre && j0 == j0f; /* its first step requested before the wait */
            const int32_t jl = j0 + lane;
            const int64_t roff = first ? roff_pre : moet_kv_row(kv.blocks, kv.shift, jl < kb ? jl : ka) * kvd;
            for (int hoff = 0; hoff < AS_CHUNK && j0 + hoff < kb; hoff += DM::HK) {
                const int32_t hb = j0 + hoff, nk = kb - hb < DM::HK ? kb - hb : DM::HK;
                if (!(first && hoff == 0)) stage_kv(nk, roff, hoff);
                asm volatile("cp.async.wait_group 1;" ::: "memory"); /* the K rows */
                __syncwarp();
                const int32_t jk = hb + kk;
                const int valid = jk < kb, isc = jk == cur;
                float acc[GT];
#pragma unroll
                for (int h = 0; h < GT; h++) acc[h] = 0.f;
                const E *kr = wk + kk * DM::LDK + hh * PD;
                const float *kc = sk + hh * PD, *qb = sqp + hh * DM::QH;
#pragma unroll 8
                for (int u = 0; u < PD / 4; u++) {
                    const float4 k4 = isc ? *(const float4 *)(kc + 4 * u) : as_sh4(kr + 4 * u);
#pragma unroll
                    for (int h = 0; h < GT; h++) {
                        if (h < G) {
                            const float4 qq = *(const float4 *)(qb + h * DM::LDQ + 4 * u);
                            acc[h] = fmaf(qq.x, k4.x, acc[h]);
                            acc[h] = fmaf(qq.y, k4.y, acc[h]);
                            acc[h] = fmaf(qq.z, k4.z, acc[h]);
                            acc[h] = fmaf(qq.w, k4.w, acc[h]);
                        }
                    }
                }
#pragma unroll
                for (int h = 0; h < GT; h++) {
                    if (h < G) {
                        if (LPK == 2) acc[h] += __shfl_xor_sync(0xffffffffu, acc[h], 1);
                        const float sc = valid ? acc[h] * scale : -INFINITY;
                        float mx = sc;
#pragma unroll
                        for (int off = 16; off >= LPK; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
                        const float mn = fmaxf(m[h], mx), corr = expf(m[h] - mn), pr = expf(sc - mn);
                        l[h] = l[h] * corr + (hh == 0 ? pr : 0.f); /* a key's lanes count it once */
#pragma unroll
                        for (int e = 0; e < 4; e++) o[h][e] *= corr;
                        m[h] = mn;
                        if (hh == 0) wp[kk * GT + h] = pr;
                    }
                }
                asm volatile("cp.async.wait_group 0;" ::: "memory"); /* the V rows */
                __syncwarp();
                as_pv<HD, GT>(o, wp, (const E *)wv1, nk, hb, cur, sv, G, lane);
                __syncwarp(); /* wp and the staging are rewritten by the next step */
            }
        }
    } else {
        /* Tensor cores (KS = 2, f16 pools): a warp's 32 keys a step, staged as KS = 1 (one step: K and V of 32 keys
         * in f16 fit), S = Q K^T and O += P V as m16n8k16 mma with f32 accumulation, the G query heads the rows
         * (up to 16; rows past G are zero). K and V are f16 already (exact); q and p are split as hi + lo f16
         * (hi = f16(x), lo = f16(x - hi): x to ~2^-22 relative, fp32's order), two mma a product. The S fragments
         * become P V's A fragments in registers (FA2's layout), the online softmax per row over the step's 32 keys,
         * the row max across the 4 lanes of a row by shuffles. The q fragments are built once from sq. */
        constexpr int KT = HD / 16, NO = HD / 8; /* k-steps of q . k, dim n-tiles of p . v */
        uint32_t qh[KT][4], ql[KT][4];
#pragma unroll
        for (int kt = 0; kt < KT; kt++)
#pragma unroll
            for (int r = 0; r < 4; r++) { /* a[r]: row tg (+8 for r odd), dims 16 kt + 2 tt (+8 for r >= 2) */
                const int row = tg + 8 * (r & 1), d = 16 * kt + 2 * tt + 8 * (r >> 1);
                const float x0 = row < G ? sq[row * HD + d] : 0.f, x1 = row < G ? sq[row * HD + d + 1] : 0.f;
                const __half h0 = __float2half_rn(x0), h1 = __float2half_rn(x1);
                const __half l0 = __float2half_rn(x0 - __half2float(h0)), l1 = __float2half_rn(x1 - __half2float(h1));
                qh[kt][r] = as_h2(h0, h1);
                ql[kt][r] = as_h2(l0, l1);
            }
        const uint32_t kbase = cu_smem_u32(wk), vbase = cu_smem_u32(wv1);
        /* KS = 3 (opt-in, not yet timed): the next step's K rows requested once this step's q . k has read the K
         * staging, its V rows once p . v has read the V staging, so a step's loads overlap the step before's
         * products (one staging a warp: two would not fit 8 warps' shared memory) */
        constexpr int PIPE = KS == 3;
        if (PIPE && j0f < kb && !pre) {
            const int32_t jl = j0f + lane;
            stage_kv(kb - j0f < AS_CHUNK ? kb - j0f : AS_CHUNK, moet_kv_row(kv.blocks, kv.shift, jl < kb ? jl : ka) * kvd, 0);
        }
        for (int32_t j0 = ka + warp * AS_CHUNK; j0 < kb; j0 += AS_WARPS * AS_CHUNK) {
            const int first = pre && j0 == j0f;
            const int32_t jl = j0 + lane, nk = kb - j0 < AS_CHUNK ? kb - j0 : AS_CHUNK;
            const int32_t jn = j0 + AS_WARPS * AS_CHUNK, nkn = PIPE && jn < kb ? (kb - jn < AS_CHUNK ? kb - jn : AS_CHUNK) : 0;
            if (!PIPE && !first)
                stage_kv(nk, moet_kv_row(kv.blocks, kv.shift, jl < kb ? jl : ka) * kvd, 0);
            const int cr = cur - j0; /* key cur's row in the step, if there: its rows from sk / sv, as stored */
            asm volatile("cp.async.wait_group 1;" ::: "memory");
            __syncwarp(); /* every lane's pieces of the K rows landed (before the patch of row cr) */
            if (cr >= 0 && cr < nk)
                for (int d = lane; d < HD; d += 32) wk[cr * DM::LDK + d] = __float2half_rn(sk[d]);
            __syncwarp();
            float sc[4][4]; /* S: n-tile j (keys 8 j ..), c[0..1] row tg keys 2 tt, +1; c[2..3] row tg + 8 */
#pragma unroll
            for (int j = 0; j < 4; j++) sc[j][0] = sc[j][1] = sc[j][2] = sc[j][3] = 0.f;
#pragma unroll
            for (int kt = 0; kt < KT; kt++)
#pragma unroll
                for (int jp = 0; jp < 2; jp++) { /* n-tiles 2 jp, 2 jp + 1: one ldmatrix.x4 */
                    const int key = 16 * jp + 8 * (lane >> 4) + (lane & 7), dim = 16 * kt + 8 * ((lane >> 3) & 1);
                    uint32_t b[4];
                    as_ldsm4(b, kbase + (uint32_t)(key * DM::LDK + dim) * 2u);
                    as_mma16(sc[2 * jp], qh[kt], b[0], b[1]);
                    as_mma16(sc[2 * jp], ql[kt], b[0], b[1]);
                    as_mma16(sc[2 * jp + 1], qh[kt], b[2], b[3]);
                    as_mma16(sc[2 * jp + 1], ql[kt], b[2], b[3]);
                }
            int64_t roffn = 0;
            if (nkn > 0) { /* (PIPE) the next step's K rows, over this step's, read by now */
                __syncwarp();
                const int32_t jn_l = jn + lane;
                roffn = moet_kv_row(kv.blocks, kv.shift, jn_l < kb ? jn_l : ka) * kvd;
                stage_kv(nkn, roffn, 0, 1);
            }
            /* the online softmax per row (r = 0: head tg, 1: head tg + 8) */
            float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
            for (int j = 0; j < 4; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int key = 8 * j + 2 * tt + (e & 1);
                    sc[j][e] = key < nk ? sc[j][e] * scale : -INFINITY;
                    mx[e >> 1] = fmaxf(mx[e >> 1], sc[j][e]);
                }
            float corr[2];
#pragma unroll
            for (int r = 0; r < 2; r++) {
                mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
                mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
                const float mn = fmaxf(tm[r], mx[r]);
                corr[r] = expf(tm[r] - mn);
                tm[r] = mn;
                tl[r] *= corr[r];
            }
#pragma unroll
            for (int j = 0; j < 4; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    sc[j][e] = expf(sc[j][e] - tm[e >> 1]);
                    tl[e >> 1] += sc[j][e]; /* the lane's share of the row's sum */
                }
#pragma unroll
            for (int n = 0; n < NO; n++) {
                to[n][0] *= corr[0]; to[n][1] *= corr[0];
                to[n][2] *= corr[1]; to[n][3] *= corr[1];
            }
            if (nkn > 0) asm volatile("cp.async.wait_group 1;" ::: "memory"); /* (the next K rows may fly on) */
            else asm volatile("cp.async.wait_group 0;" ::: "memory");
            __syncwarp();
            if (cr >= 0 && cr < nk)
                for (int d = lane; d < HD; d += 32) wv1[cr * DM::LDV + d] = __float2half_rn(sv[d]);
            __syncwarp();
#pragma unroll
            for (int ks2 = 0; ks2 < 2; ks2++) { /* keys 16 ks2 ..: P's A fragments from S's n-tiles 2 ks2, 2 ks2 + 1 */
                uint32_t ph[4], pl[4];
#pragma unroll
                for (int r = 0; r < 4; r++) {
                    const float *c = sc[2 * ks2 + (r >> 1)] + 2 * (r & 1);
                    const __half h0 = __float2half_rn(c[0]), h1 = __float2half_rn(c[1]);
                    ph[r] = as_h2(h0, h1);
                    pl[r] = as_h2(__float2half_rn(c[0] - __half2float(h0)), __float2half_rn(c[1] - __half2float(h1)));
                }
#pragma unroll
                for (int np = 0; np < NO / 2; np++) { /* dim n-tiles 2 np, 2 np + 1: one ldmatrix.x4.trans */
                    const int key = 16 * ks2 + 8 * ((lane >> 3) & 1) + (lane & 7), dim = 16 * np + 8 * (lane >> 4);
                    uint32_t b[4];
                    as_ldsm4t(b, vbase + (uint32_t)(key * DM::LDV + dim) * 2u);
                    as_mma16(to[2 * np], ph, b[0], b[1]);
                    as_mma16(to[2 * np], pl, b[0], b[1]);
                    as_mma16(to[2 * np + 1], ph, b[2], b[3]);
                    as_mma16(to[2 * np + 1], pl, b[2], b[3]);
                }
            }
            __syncwarp(); /* the staging is rewritten by the next step */
            if (nkn > 0) stage_kv(nkn, roffn, 0, 2); /* (PIPE) the next step's V rows */
        }
    }
    __syncthreads(); /* the staging becomes the warps' outputs */
    /* the warp's partials to shared memory: l summed over its lanes (a fixed tree), m, o as they are */
    if constexpr (KS >= 2) { /* from the fragments: row tg + 8 r, dims 8 n + 2 tt, +1 */
#pragma unroll
        for (int r = 0; r < 2; r++) {
            float lt = tl[r];
            lt += __shfl_xor_sync(0xffffffffu, lt, 1);
            lt += __shfl_xor_sync(0xffffffffu, lt, 2);
            const int row = tg + 8 * r;
            if (row < G) {
                if (tt == 0) { smx[warp * GT + row] = tm[r]; sl[warp * GT + row] = lt; }
#pragma unroll
                for (int n = 0; n < HD / 8; n++)
                    *(float2 *)(so + (warp * GT + row) * HD + 8 * n + 2 * tt) = make_float2(to[n][2 * r], to[n][2 * r + 1]);
            }
        }
    }
#pragma unroll
    for (int h = 0; h < (KS >= 2 ? 0 : GT); h++) {
        if (h < G) {
            float lt = l[h];
#pragma unroll
            for (int off = 16; off > 0; off >>= 1) lt += __shfl_xor_sync(0xffffffffu, lt, off);
            if (lane == 0) { smx[warp * GT + h] = m[h]; sl[warp * GT + h] = lt; }
            if (4 * lane < HD) *(float4 *)(so + (warp * GT + h) * HD + 4 * lane) = make_float4(o[h][0], o[h][1], o[h][2], o[h][3]);
        }
    }
    __syncthreads();
    /* the CTA's partial per head over its warps in warp order (a warp that saw no key has m = -inf): into so[0]
     * (o), smx[0], sl[0] */
    for (int e = tid; e < G * HD; e += blockDim.x) {
        const int h = e / HD, d = e % HD;
        float M = -INFINITY;
        for (int w = 0; w < AS_WARPS; w++) M = fmaxf(M, smx[w * GT + h]);
        float L = 0.f, acc = 0.f;
        for (int w = 0; w < AS_WARPS; w++) {
            const float mw = smx[w * GT + h];
            if (mw == -INFINITY) continue;
            const float f = expf(mw - M);
            L += sl[w * GT + h] * f;
            acc += so[(w * GT + h) * HD + d] * f;
        }
        so[h * HD + d] = acc; /* row h of warp 0's block: only this thread reads or writes it from here */
        if (d == HD - 1) { sp[h] = M; sp[GT + h] = L; } /* sp is free now */
    }
    __syncthreads();
    const int64_t slot0 = (z * n_kv + kvh) * (int64_t)S_grid;
    const int64_t PS = (int64_t)G * (HD + 2); /* floats of a split's partial */
    if (S > 1) { /* the partial to scratch, then a ticket; the last CTA of the token's kv head merges */
        float *mine = part + (slot0 + s) * PS;
        for (int e = tid; e < G * HD; e += blockDim.x) mine[e] = so[e];
        for (int h = tid; h < G; h += blockDim.x) { mine[G * HD + h] = sp[h]; mine[G * HD + G + h] = sp[GT + h]; }
        __threadfence();
        __syncthreads();
        if (tid == 0) s_last = atomicAdd(&tickets[z * n_kv + kvh], 1) == S - 1;
        __syncthreads();
        if (!s_last) return;
        __threadfence();
    }
    /* the final merge (splits in order; sink: one more logit with no value, gpt-oss) and the normalised rows */
    for (int e = tid; e < G * HD; e += blockDim.x) {
        const int h = e / HD, d = e % HD, head = kvh * G + h;
        const float sink = sinks ? sinks[head] : -INFINITY;
        float M = sink;
        if (S == 1) {
            M = fmaxf(M, sp[h]);
        } else {
            for (int t = 0; t < S; t++) M = fmaxf(M, __ldcg(part + (slot0 + t) * PS + G * HD + h));
        }
        float L = sink == -INFINITY ? 0.f : expf(sink - M), acc = 0.f;
        if (S == 1) {
            if (sp[h] != -INFINITY) {
                const float f = expf(sp[h] - M);
                L += sp[GT + h] * f;
                acc += so[h * HD + d] * f;
            }
        } else {
            for (int t = 0; t < S; t++) {
                const float *pt = part + (slot0 + t) * PS;
                const float mt = __ldcg(pt + G * HD + h);
                if (mt == -INFINITY) continue;
                const float f = expf(mt - M);
                L += __ldcg(pt + G * HD + G + h) * f;
                acc += __ldcg(pt + h * HD + d) * f;
            }
        }
        out[(int64_t)head * HD + d] = acc * (1.0f / L);
        if (prep) q[(int64_t)head * HD + d] = sq[e]; /* the normed, rotated q (attn_prep's contract): every split has
                                                        read the raw rows by now (they took their tickets after) */
    }
    if (S > 1 && tid == 0) tickets[z * n_kv + kvh] = 0; /* for the next launch */
}

/* ---- host ----------------------------------------------------------------------------------------------------- */

/* Decode-sized attention (<= AS_TOK tokens a launch where attn_tc declines, and every attn_fused / attn_rows) by
 * key splits: MOET_ATTN_SPLITK=1 always, 0 never, unset for sessions sized for AS_AUTO_CTX keys or more (n_ctx).
 * Why by n_ctx: a recorded step serves every position, so the kernel cannot follow the position. On an H100 the
 * split kernel with K staged (stop 43, KS = 1, the op at the 30b shape) took 1.9x attention.cu's time at 128 keys
 * (its fixed cost is a warp's instructions for a chunk, ~4300 at ~7 cycles each, not memory), and won from a few hundred keys (1.54x at 1024, 3.7x at 4096, 11.5x at 32768). With stop 42's
 * kernel (lane-a-row K loads, 1.3-1.7x slower than KS = 1) the crossing was ~1k keys and the rule 8192. A session
 * sized for 2048 keys or more spends most of its steps past the crossing; a shorter one keeps attention.cu's
 * kernels. On an f16 cache attention.cu's kernels are slower than on f32 (1.2x at 128 keys, 1.7x at 1024) and
 * the crossing comes at ~250 keys: sessions of 1024 keys or more. Read at every launch (test_ops switches it). */
#define AS_TOK 64
#define AS_AUTO_CTX 2048
#define AS_AUTO_CTX_F16 1024
static int as_enabled(int32_t n_ctx, int32_t kv_type) {
    const char *e = getenv("MOET_ATTN_SPLITK");
    if (e && e[0]) return e[0] == '1';
    return n_ctx >= (kv_type == MOET_KVE_F16 ? AS_AUTO_CTX_F16 : AS_AUTO_CTX);
}

static int32_t as_kmin(void) {
    const char *e = getenv("MOET_ATTN_SPLITK_KMIN");
    const long v = e ? strtol(e, NULL, 10) : 0;
    return v >= AS_CHUNK && v <= 65536 && v % AS_CHUNK == 0 ? (int32_t)v : AS_KMIN;
}

/* The kernel for a head shape (NULL: not taken here). */
typedef void (*as_kernel_fn)(float *, float *, const float *, int32_t, int32_t, const float *, const float *, float,
                             const moet_rope, const int32_t *, moet_kv_ref, const moet_kv_ref *, float, const float *,
                             int32_t, float *, int32_t, float *, int32_t *, int32_t);
template <int HD, typename E, int KS> static as_kernel_fn as_pick_g(int G, size_t *smem) {
    static_assert(KS < 2 || sizeof(E) == 2, "tensor cores on f16 pools only");
#define AS_G(GT) if (G <= GT) { *smem = as_dims<HD, GT, E, KS>::smem; return k_attn_split<HD, GT, E, KS>; }
    AS_G(1) AS_G(2) AS_G(4) AS_G(8) AS_G(16)
#undef AS_G
    return NULL;
}
template <int KS> static as_kernel_fn as_pick_k(int hd, int G, int f16, size_t *smem) {
    switch (hd) {
    case 64: return f16 ? as_pick_g<64, __half, KS>(G, smem) : as_pick_g<64, float, KS>(G, smem);
    case 128: return f16 ? as_pick_g<128, __half, KS>(G, smem) : as_pick_g<128, float, KS>(G, smem);
    default: return NULL;
    }
}
/* K rows: 0 a lane's key's row loaded whole into its registers (stops 41-42), 1 staged by cp.async with the V rows,
 * 2 staged and multiplied on tensor cores (f16 pools; on f32 ones 2 and 3 are 1), 3 as 2 with the next step's loads
 * overlapping this step's products (opt-in; an H100 at stop 45: the op 1.02-1.04x KS 2's at 16k-32k keys, 0.985-1.00x
 * below, so not the default) (MOET_ATTN_SPLITK_KS, read at every
 * launch: the A/B). The default is 2: on an H200 (stop 43) the op on f16 pools took 1.29-1.52x less time than with
 * 1 at the 30b shape and 1.41-1.84x at the 235b one, and tg32 of the 30b shape ran 1.07x (depth 0 and 4096) and
 * 1.16x (16384) faster. On f32 pools it is 1 (1.3-1.7x faster than 0 on an H100). */
static int as_ks(int f16) {
    const char *e = getenv("MOET_ATTN_SPLITK_KS");
    const int v = e && e[0] >= '0' && e[0] <= '3' ? e[0] - '0' : 2; /* default: 2 on f16, 1 on f32 (stop 43) */
    return v >= 2 && !f16 ? 1 : v;
}
static as_kernel_fn as_pick(int hd, int G, int f16, int ks, size_t *smem) {
    if (ks >= 2) {
        switch (hd) {
        case 64: return ks == 3 ? as_pick_g<64, __half, 3>(G, smem) : as_pick_g<64, __half, 2>(G, smem);
        case 128: return ks == 3 ? as_pick_g<128, __half, 3>(G, smem) : as_pick_g<128, __half, 2>(G, smem);
        default: return NULL;
        }
    }
    return ks ? as_pick_k<1>(hd, G, f16, smem) : as_pick_k<0>(hd, G, f16, smem);
}

/* Scratch: [tickets: rows x n_kv int32, 256-byte aligned][partials: rows x n_kv x splits x G x (hd + 2) floats].
 * Grown only outside a recording (graph_run runs a shape eagerly before it records it); a buffer a recorded step
 * may use is never freed before the backend (retired ones are kept; tickets are zero between launches). */
static int as_scratch(cu_backend *c, int64_t rows, int32_t n_kv, int32_t splits, int32_t n_heads, int hd, float **part,
                      int32_t **tickets) {
    const size_t tb = (((size_t)rows * (size_t)n_kv * sizeof(int32_t)) + 255) & ~(size_t)255;
    const size_t need = tb + (size_t)rows * (size_t)splits * (size_t)n_heads * (size_t)(hd + 2) * sizeof(float);
    if (need > c->attn_split_cap) {
        /* at least 4 MiB, at least twice the old: 8 retired buffers cover needs up to 1 GiB (64 rows x 32 splits x
         * 128 heads at head_dim 128 is 136 MB). Freeing one could pull memory from under a recorded step. */
        if (c->attn_split && c->n_attn_retired == CU_ATTN_RETIRED) {
            cu_fail(c, cudaErrorMemoryAllocation, "attention split scratch: grown past its retired buffers", __FILE__,
                    __LINE__);
            return 0;
        }
        if (c->attn_split) c->attn_retired[c->n_attn_retired++] = c->attn_split;
        size_t cap = need + need / 2;
        if (cap < 2 * c->attn_split_cap) cap = 2 * c->attn_split_cap;
        if (cap < ((size_t)4 << 20)) cap = (size_t)4 << 20;
        c->attn_split = NULL;
        c->attn_split_cap = 0;
        if (CU_CHECK(c, cudaMalloc(&c->attn_split, cap)) || CU_CHECK(c, cudaMemsetAsync(c->attn_split, 0, cap, c->stream)))
            return 0;
        c->attn_split_cap = cap;
    }
    *tickets = (int32_t *)c->attn_split;
    *part = (float *)((char *)c->attn_split + tb);
    return 1;
}

/* Launches k_attn_split for `rows` query rows when it takes this shape; 1 if it did (or recorded an error), 0 if the
 * caller should run attention.cu's kernels. */
extern "C" int cu_attn_split(cu_backend *c, float *q, float *k, const float *v, const float *q_norm, const float *k_norm,
                             float eps, const moet_rope *rp, const moet_kv_ref *rows, const moet_attn_args *a, int prep,
                             const float *sinks) {
    if (!as_enabled(a->n_ctx, a->kv.type) || a->n_kv <= 0 || a->n_heads % a->n_kv || a->n_tok < 1 || a->n_tok > AS_MAX_ROWS) return 0;
    if (!prep && a->n_tok > AS_TOK) return 0;
    const int hd = a->head_dim, G = a->n_heads / a->n_kv;
    if (prep && (rp->dim < 2 || rp->dim > hd || rp->dim % 2)) return 0;
    size_t smem = 0;
    const int f16 = a->kv.type == MOET_KVE_F16; /* (attn_rows: every row's pools of a->kv.type, backend.h) */
    const int ks = as_ks(f16);
    as_kernel_fn fn = as_pick(hd, G, f16, ks, &smem);
    if (!fn || smem > c->prop.sharedMemPerBlockOptin) return 0; /* (158 KB at head_dim 128 x 16 heads) */
    if (c->err[0]) return 1;
    static int attr_dev[4][2][2][5]; /* device + 1 whose attribute is set; 0: none yet */
    const int hi = hd == 64 ? 0 : 1, gi = G <= 1 ? 0 : G <= 2 ? 1 : G <= 4 ? 2 : G <= 8 ? 3 : 4;
    if (attr_dev[ks][f16][hi][gi] != c->device + 1) { /* (per device: the attribute belongs to the current context) */
        if (CU_CHECK(c, cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem))) return 1;
        attr_dev[ks][f16][hi][gi] = c->device + 1;
    }
    const int32_t kmin = as_kmin(), splits = as_nsplit(a->n_ctx > 0 ? a->n_ctx : 1, kmin);
    float *part;
    int32_t *tickets;
    if (!as_scratch(c, a->n_tok, a->n_kv, splits, a->n_heads, hd, &part, &tickets)) return 1;
    const moet_rope none_rp = {0};
    cu_launch_pdl(c, fn, dim3((unsigned)a->n_kv, (unsigned)splits, (unsigned)a->n_tok), dim3(AS_WARPS * 32), smem, q, k,
                  v, a->n_heads, a->n_kv, q_norm, k_norm, eps, prep ? *rp : none_rp, a->pos, a->kv, rows, a->scale,
                  sinks, a->window, a->out, (int32_t)prep, part, tickets, kmin);
    CU_LAUNCHED(c, "k_attn_split");
    return 1;
}
