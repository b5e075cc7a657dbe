/*
 * moe_tc.cuh — the device pieces the tensor-core MoE kernels share: moe_tc.cu (decode and grouped launches) and
 * moe_fused.cu (the persistent single-token block). The arithmetic lives here once, so the two stay bit-identical:
 * the sign-plane fragments and their mma, x staging as f16 hi/lo, the scale lookup, the router row dot and the
 * warp top-k. The tiled layout itself is specified in quant/blocks.h.
 */
#ifndef MOET_BACKEND_CUDA_MOE_TC_CUH
#define MOET_BACKEND_CUDA_MOE_TC_CUH

#include <cuda_fp16.h>
#include <math.h>

#include "backend/cuda/common.cuh"
#include "backend/cuda/cuda_int.h"
#include "backend/cuda/moe.cuh"
#include "quant/tile.h"

#define TC_GU_W 8             /* decode gate/up: warps a CTA at most (3 CTAs an SM: one wave at the 30b shape) */
#define TC_GU_CTAS(DL) ((DL) ? 2 : 3) /* decode gate/up: CTAs an SM its launch bounds promise */
#define TC_DN_W 24            /* decode down: warps a CTA at most (one (pick, chunk) item a warp at the 30b shape) */
#define TC_GRP_W 8            /* warps of the grouped kernels (8 tokens staged a warp: 8 KiB of shared memory) */
#define TC_RT_W 16            /* router: rows (warps) a CTA at most */
#define TC_RT_T 4             /* router: tokens at most (decode) */
#define TC_GU_MAX_E 2048      /* decode gate/up routes its token itself up to this many experts (2 x 8 KB of smem) */
#define TC_RT_U 8             /* router: 16-byte chunks of a row in flight a lane */
static_assert(MOE_DELTA_TOK <= TC_RT_T, "the delta path's passes go through the decode router");

/* ---- fragments ----------------------------------------------------------------------------------------------- */

/* not volatile: it has no side effects, so the compiler may schedule independent products and the FMAs that use
 * earlier ones around each other */
__device__ __forceinline__ void tc_mma(float c[4], const uint32_t a[4], const uint32_t b[2]) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

/* f16x2 register r of mma m of a lane's block word (blocks.h): the two sign bits moved to bits 15 and 31 of +-1.0 */
__device__ __forceinline__ uint32_t tc_sign2(uint32_t w, int x) { return ((w << x) & 0x80008000u) | 0x3C003C00u; }

/* The 2-bit family's levels as A u' + B v' (blocks.h). */
__device__ __forceinline__ void tc_ab(int32_t type, float beta, float *A, float *B) {
    if (type == MOET_TYPE_SYM2) { *A = 1.0f; *B = 0.5f; }
    else { *A = 0.5f * (1.0f + beta); *B = 0.5f * (1.0f - beta); }
}

/* The staging exponent of values whose largest magnitude is mx: mx 2^-e in [2^14, 2^15), so hi/lo f16 never
 * overflow (0 for zero or non-finite mx, clamped to +-100). */
__device__ __forceinline__ int tc_stage_exp(float mx) {
    int e = 0;
    if (mx > 0.f && mx <= 3.0e38f) e = ilogbf(mx) - 14;
    return e < -100 ? -100 : e > 100 ? 100 : e;
}

/* Stages a lane's m values of a b-wide chunk as hi/lo f16 (X[0..b) hi, X[b..2b) lo) of v 2^-e, e from the warp's
 * largest |v| (largest -> [2^14, 2^15)); returns 2^e. Warp-uniform. */
__device__ __forceinline__ float tc_stage(const float v[8], int m, int b, __half *X) {
    const int lane = threadIdx.x & 31;
    float mx = 0.f;
#pragma unroll
    for (int i = 0; i < 8; i++)
        if (i < m) mx = fmaxf(mx, fabsf(v[i]));
    mx = cu_warp_max(mx);
    const int e = tc_stage_exp(mx);
    const float dn = __int_as_float((127 - e) << 23), up = __int_as_float((127 + e) << 23);
#pragma unroll
    for (int i = 0; i < 8; i++)
        if (i < m) {
            const float s = v[i] * dn;
            const __half h = __float2half_rn(s);
            X[lane * m + i] = h;
            X[b + lane * m + i] = __float2half_rn(s - __half2float(h));
        }
    return up;
}

/* The lane's B operand source in a warp's staged tokens (2b halves each) for column group grp: column g of the
 * group is token 4 grp + g/2, hi (g even) or lo. NULL (zeros) for absent tokens. */
__device__ __forceinline__ const __half *tc_bsrc(const __half *X, int b, int grp, int ntok) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3, j = 4 * grp + (g >> 1);
    return j < ntok ? X + (2 * j + (g & 1)) * b + 2 * t : NULL;
}

/* B fragment of half-block step s (columns 16s ..) from a tc_bsrc pointer. */
__device__ __forceinline__ void tc_bfrag(const __half *p, int s, uint32_t bf[2]) {
    if (p) {
        bf[0] = *(const uint32_t *)(p + 16 * s);
        bf[1] = *(const uint32_t *)(p + 16 * s + 8);
    } else {
        bf[0] = 0u;
        bf[1] = 0u;
    }
}

/* 2^((sc - 255) / 16) for every scale code, in shared memory (the block scale is qscale x lut[sc], the product
 * cu_q2_scale forms): one load instead of an exp2f per row and block. All threads; the caller synchronises. */
__device__ __forceinline__ void tc_lut_fill(float *lut) {
    for (int i = threadIdx.x; i < 256; i += blockDim.x) lut[i] = exp2f(((float)i - 255.0f) / 16.0f);
}

/* The B fragments of block bi (both half-blocks) for NG column groups, from their tc_bsrc pointers. */
template <int NG>
__device__ __forceinline__ void tc_bfrags(const __half *const bs[NG], int bi, uint32_t bf[2][NG][2]) {
#pragma unroll
    for (int s = 0; s < 2; s++)
#pragma unroll
        for (int gi = 0; gi < NG; gi++) tc_bfrag(bs[gi], 2 * bi + s, bf[s][gi]);
}

/* One 16 x 32 block of one matrix against NG column groups: u' and v' accumulators, both half-blocks. */
template <int NG>
__device__ __forceinline__ void tc_block(uint32_t w, const uint32_t bf[2][NG][2], float cu[NG][4], float cv[NG][4]) {
#pragma unroll
    for (int gi = 0; gi < NG; gi++)
#pragma unroll
        for (int i = 0; i < 4; i++) { cu[gi][i] = 0.f; cv[gi][i] = 0.f; }
#pragma unroll
    for (int s = 0; s < 2; s++) {
        uint32_t au[4], av[4];
#pragma unroll
        for (int r = 0; r < 4; r++) { au[r] = tc_sign2(w, 4 * s + r); av[r] = tc_sign2(w, 8 + 4 * s + r); }
#pragma unroll
        for (int gi = 0; gi < NG; gi++) { tc_mma(cu[gi], au, bf[s][gi]); tc_mma(cv[gi], av, bf[s][gi]); }
    }
}

/* One block of one matrix into the lane's two row sums per column group: acc[gi][0] (row g) and acc[gi][1] (row
 * g + 8) += s (A u'.x + B v'.x), the block scales s0 / s1 of the two rows times the group's factor q[gi]. */
template <int NG>
__device__ __forceinline__ void tc_mac(uint32_t w, const uint32_t bf[2][NG][2], float A, float B, float s0, float s1,
                                       const float q[NG], float acc[NG][2]) {
    float cu[NG][4], cv[NG][4];
    tc_block<NG>(w, bf, cu, cv);
#pragma unroll
    for (int gi = 0; gi < NG; gi++) {
        acc[gi][0] = fmaf(s0 * q[gi], A * (cu[gi][0] + cu[gi][1]) + B * (cv[gi][0] + cv[gi][1]), acc[gi][0]);
        acc[gi][1] = fmaf(s1 * q[gi], A * (cu[gi][2] + cu[gi][3]) + B * (cv[gi][2] + cv[gi][3]), acc[gi][1]);
    }
}

/* Where a matrix's tiled parts lie. */
__device__ __forceinline__ const uint32_t *tc_codes(const cu_mat &m) { return (const uint32_t *)m.w; }
__device__ __forceinline__ const uint8_t *tc_scales(const cu_mat &m, int64_t rows, int64_t nb) {
    return m.w + (size_t)rows * nb * 8;
}

/* The loads of one chunk (NBK <= 8 blocks from block blk0) of tile ti of one matrix: each lane's code word of every
 * block, and one 32-bit word of the chunk's NBK x 16 scale codes (lanes < 4 NBK; contiguous in the tiled layout), which
 * tc_sc hands round by shuffle: 16 scale bytes a lane held in 16 registers took k_tc_gate_up to 128 registers, two
 * CTAs an SM, 1.45 waves at the 30b shape. */
template <int NBK>
__device__ __forceinline__ void tc_fetch(const cu_mat &m, int64_t rows, int64_t NB, int64_t ti, int64_t blk0,
                                         uint32_t wd[8], uint32_t &sw) {
    const int lane = threadIdx.x & 31;
    const int64_t tb = ti * NB + blk0;
    const uint32_t *cw = tc_codes(m) + tb * 32 + lane;
#pragma unroll
    for (int bi = 0; bi < NBK; bi++) wd[bi] = __ldg(cw + 32 * bi);
    sw = lane < 4 * NBK ? __ldg((const uint32_t *)(tc_scales(m, rows, NB) + tb * 16) + lane) : 0u;
}

/* Scale code of row r (0..15) of block bi from tc_fetch's word (every lane of the warp calls it). */
__device__ __forceinline__ uint32_t tc_sc(uint32_t sw, int bi, int r) {
    const int i = 16 * bi + r;
    return (__shfl_sync(0xffffffffu, sw, i >> 2) >> (8 * (i & 3))) & 0xffu;
}

/* ---- the integer form of the decode kernels (quant/tile.h: why, and every fragment's meaning) ------------------- */

/* D += A B on mma.m16n8k32: A u8 (the masked sign bits), B s8 (the activations' pieces), D s32 (exact). */
__device__ __forceinline__ void tc_i8_mma(int32_t d[4], const uint32_t a[4], const uint32_t b[2]) {
    asm("mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

/* A warp's staged chunk of M blocks (M >= 2): pair words [M][4 pieces][16], then the C sums [M][4] (-32 X). */
#define TC_I8_STAGE_BYTES(M) ((size_t)(M) * (64 + 4) * 4)

/* Stages a lane's M rotated values of a chunk as the four int8 pieces of v 2^-e (e: moet_i8_exp of the warp's
 * largest |v|) into W / Xs (TC_I8_STAGE_BYTES); returns 2^e (NaN when the chunk holds a non-finite value, so the
 * products are NaN as the f32 reference's are). Warp-uniform; the caller __syncwarp()s before reading W. */
template <int M>
__device__ __forceinline__ float tc_stage_i8(const float v[8], uint32_t *W, int32_t *Xs) {
    static_assert(M >= 2 && M <= 8, "tc_stage_i8: a lane holds whole column pairs");
    const int lane = threadIdx.x & 31;
    float mx = 0.f;
#pragma unroll
    for (int i = 0; i < M; i++) mx = fmaxf(mx, fabsf(v[i]));
    mx = cu_warp_max(mx);
    const int e = moet_i8_exp(mx);
    const float dn = __int_as_float((127 - e) << 23);
    float up = __int_as_float((127 + e) << 23);
    if (!(mx <= 3.0e38f)) up = __int_as_float(0x7fc00000);
    const int c0 = lane * M, bi = c0 >> 5, cb = c0 & 31;
    int32_t xs[4] = {0, 0, 0, 0};
#pragma unroll
    for (int i = 0; i < M; i += 2) {
        int32_t q0[4], q1[4];
        moet_i8_split(v[i] * dn, q0);
        moet_i8_split(v[i + 1] * dn, q1);
        const int idx = moet_i8_pair_idx((cb + i) >> 1);
#pragma unroll
        for (int Q = 0; Q < 4; Q++) {
            W[(bi * 4 + Q) * 16 + idx] = moet_i8_pair(q0[Q], q1[Q]);
            xs[Q] += q0[Q] + q1[Q];
        }
    }
#pragma unroll
    for (int Q = 0; Q < 4; Q++)
#pragma unroll
        for (int o = 1; o < 32 / M; o <<= 1) xs[Q] += __shfl_xor_sync(0xffffffffu, xs[Q], o);
    if (cb == 0)
#pragma unroll
        for (int Q = 0; Q < 4; Q++) Xs[bi * 4 + Q] = -32 * xs[Q];
    return up;
}

/* Slot job of njobs chunks another kernel staged in global memory (tc_prestage's layout: the slots, then their 2^e)
 * copied to the warp's staging area W (read in place, a chunk's 16-byte loads held in registers spilled); returns its
 * 2^e. Loaded coherently; the caller __syncwarp()s before reading W. */
template <int M>
__device__ __forceinline__ float tc_i8_fetch_staged(const uint8_t *stg, int job, int njobs, uint32_t *W) {
    const uint4 *src = (const uint4 *)(stg + (size_t)job * TC_I8_STAGE_BYTES(M));
    for (int i = threadIdx.x & 31; i < (int)(TC_I8_STAGE_BYTES(M) / 16); i += 32) ((uint4 *)W)[i] = __ldcg(src + i);
    return __ldcg((const float *)(stg + (size_t)njobs * TC_I8_STAGE_BYTES(M)) + job);
}

/* The lane's B registers and C start of block bi of a staged chunk (shared memory). */
__device__ __forceinline__ void tc_i8_bfrag(const uint32_t *W, const int32_t *Xs, int bi, uint32_t b[2][2], int32_t ci[4]) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const uint4 bw = *(const uint4 *)(W + (bi * 4 + (g & 3)) * 16 + 4 * t);
    const int2 xm = *(const int2 *)(Xs + bi * 4 + 2 * (t & 1));
    b[0][0] = moet_i8_bword(bw.x, g);
    b[0][1] = moet_i8_bword(bw.y, g);
    b[1][0] = moet_i8_bword(bw.z, g);
    b[1][1] = moet_i8_bword(bw.w, g);
    ci[0] = moet_i8_cstart(xm.x, 0);
    ci[1] = moet_i8_cstart(xm.y, 0);
    ci[2] = moet_i8_cstart(xm.x, 1);
    ci[3] = moet_i8_cstart(xm.y, 1);
}

/* One 16 x 32 block: both half-blocks' products from the C start, then acc += the rows' block scales (s0: row g,
 * s1: row g + 8) times D. (The two mma chained through D. Stop 35's split form, the second from zero and added
 * after, exact in int32, was 2% slower at the 235b shape on the H200, stop 36: taken out.) */
__device__ __forceinline__ void tc_i8_tile(uint32_t w, const uint32_t b[2][2], const int32_t ci[4], float s0, float s1,
                                           float acc[4]) {
    int32_t d[4] = {ci[0], ci[1], ci[2], ci[3]};
    uint32_t a[4];
    moet_q2i8_afrag(w, 0, a);
    tc_i8_mma(d, a, b[0]);
    moet_q2i8_afrag(w, 1, a);
    tc_i8_mma(d, a, b[1]);
    acc[0] = fmaf(s0, moet_i8_dval(d[0]), acc[0]); /* an add, not an I2F (an eighth of the add rate) */
    acc[1] = fmaf(s0, moet_i8_dval(d[1]), acc[1]);
    acc[2] = fmaf(s1, moet_i8_dval(d[2]), acc[2]);
    acc[3] = fmaf(s1, moet_i8_dval(d[3]), acc[3]);
}

/* A chunk's sums into the running ones: tot += q k acc, k the lane's column factors for the matrix's A, B. */
__device__ __forceinline__ void tc_i8_chunk_done(float q, float A, float B, const float acc[4], float tot[4]) {
    float k[4];
    moet_i8_coef(threadIdx.x & 3, A, B, k);
#pragma unroll
    for (int j = 0; j < 4; j++) tot[j] = fmaf(q * k[j], acc[j], tot[j]);
}

/* The rows' sums from the running ones: row g, row g + 8, the four lanes of the group added (every lane gets them). */
__device__ __forceinline__ void tc_i8_rows(const float tot[4], float r[2]) {
    float a = tot[0] + tot[1], c = tot[2] + tot[3];
    a += __shfl_xor_sync(0xffffffffu, a, 1);
    c += __shfl_xor_sync(0xffffffffu, c, 1);
    a += __shfl_xor_sync(0xffffffffu, a, 2);
    c += __shfl_xor_sync(0xffffffffu, c, 2);
    r[0] = a;
    r[1] = c;
}

/* ---- the NVFP4 delta (the tiled NVFP4 layout: quant/blocks.h) --------------------------------------------------- */

/* The f16x2 register of one tiled code byte (quant/tile.h: low nibble -> low half, one byte permute). */
__device__ __forceinline__ uint32_t tc_fp4x2(uint32_t b) { return moet_fp4x2_f16x2(b); }

/* E4M3 (the NVFP4 block scale) for every code, in shared memory, as quant/formats.c decodes it. All threads; the
 * caller synchronises. */
__device__ __forceinline__ void tc_e4m3_fill(float *lut) {
    for (int i = threadIdx.x; i < 256; i += blockDim.x) {
        const int e = (i >> 3) & 15, m = i & 7;
        float r = e == 15 && m == 7 ? __int_as_float(0x7fc00000) : e == 0 ? ldexpf((float)m, -9) : ldexpf(1.0f + (float)m / 8.0f, e - 7);
        lut[i] = (i & 0x80) ? -r : r;
    }
}

/* The loads of one chunk (NBK <= 8 blocks of 32 columns from block blk0) of tile ti of a tiled NVFP4 matrix: the
 * lane's code pair of every block, and two 32-bit words of the chunk's NBK x 32 scale bytes (words lane and lane + 32),
 * handed round by tc_nv_sc. */
template <int NBK>
__device__ __forceinline__ void tc_nv_fetch(const cu_mat &m, int64_t rows, int64_t NB, int64_t ti, int64_t blk0,
                                            uint2 wd[8], uint32_t &s0, uint32_t &s1) {
    const int lane = threadIdx.x & 31;
    const int64_t tb = ti * NB + blk0;
    const uint2 *cw = (const uint2 *)m.w + tb * 32 + lane;
#pragma unroll
    for (int bi = 0; bi < NBK; bi++) wd[bi] = __ldg(cw + 32 * bi);
    const uint32_t *sp = (const uint32_t *)(m.w + (size_t)rows * NB * 16 + tb * 32);
    s0 = lane < 8 * NBK ? __ldg(sp + lane) : 0u;
    s1 = lane + 32 < 8 * NBK ? __ldg(sp + lane + 32) : 0u;
}

/* Scale code of row r (0..15), k-step s of block bi from tc_nv_fetch's words (every lane calls it; bi is known at
 * compile time, so which word is uniform). */
__device__ __forceinline__ uint32_t tc_nv_sc(uint32_t s0, uint32_t s1, int bi, int s, int r) {
    int which, src, byte;
    moet_nv_sc_pos(bi, s, r, &which, &src, &byte);
    return (__shfl_sync(0xffffffffu, which ? s1 : s0, src) >> (8 * byte)) & 0xffu;
}

/* One 16 x 32 block of a tiled NVFP4 matrix against NG column groups into the lane's row sums (as tc_mac): per
 * k-step a product into zeroed accumulators, then acc += (e4m3 scale x q) x (hi + lo). nvl: tc_e4m3_fill's table. */
template <int NG>
__device__ __forceinline__ void tc_nv_mac(uint2 wd, const uint32_t bf[2][NG][2], const float *nvl, uint32_t s0,
                                          uint32_t s1, int bi, const float q[NG], float acc[NG][2]) {
    const int g = (threadIdx.x & 31) >> 2;
#pragma unroll
    for (int s = 0; s < 2; s++) {
        const uint32_t w = s ? wd.y : wd.x;
        uint32_t a[4];
#pragma unroll
        for (int r = 0; r < 4; r++) a[r] = tc_fp4x2((w >> (8 * r)) & 0xffu);
        const float f0 = nvl[tc_nv_sc(s0, s1, bi, s, g)], f1 = nvl[tc_nv_sc(s0, s1, bi, s, g + 8)];
#pragma unroll
        for (int gi = 0; gi < NG; gi++) {
            float cc[4] = {0.f, 0.f, 0.f, 0.f};
            tc_mma(cc, a, bf[s][gi]);
            acc[gi][0] = fmaf(f0 * q[gi], cc[0] + cc[1], acc[gi][0]);
            acc[gi][1] = fmaf(f1 * q[gi], cc[2] + cc[3], acc[gi][1]);
        }
    }
}

/* ---- decode: router + top-k ---------------------------------------------------------------------------------- */

/* Routes one token from its E router logits l (shared) with the first nr = min(warps, ceil(E / 32)) warps of the
 * CTA, which synchronise among themselves on named barrier 1 only: every route warp takes the max and the sum of
 * p = exp(l - max) over all E itself (the same butterfly in each, so the same sum), writes its own p, then the
 * rank of e = how many p beat it (ties: the lower id first, the CPU's order); rank < K is pick number rank (a warp
 * picking K maxima one after another is a chain of K x 10 shuffles). Warp 0 then renormalises the K weights in
 * pick order (norm_topk) and writes ids / weights. The CTA-wide form (every thread, three __syncthreads and a walk
 * over the warps' partials) held a third of the router's stall samples, yet this one measured the same 14.3-14.7
 * us: the router's time is its whole chain, not this step. p: E floats, ik / pk: K
 * (shared). Warps past nr return at once; the caller must not __syncthreads after this. */
static_assert(MOE_MAX_K <= 32, "tc_route_warps: a lane a pick");
__device__ __forceinline__ void tc_route_bar(int nthreads) {
    asm volatile("bar.sync 1, %0;" ::"r"(nthreads) : "memory");
}

__device__ __forceinline__ void tc_route_warps(const float *l, int32_t E, int32_t K, int32_t norm_topk, float *p,
                                               int32_t *ik, float *pk, int32_t *ids, float *wts) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
    const int nr = (E + 31) / 32 < nw ? (E + 31) / 32 : nw, nth = 32 * nr;
    if (warp >= nr) return;
    float mx = -INFINITY;
    for (int e = lane; e < E; e += 32) mx = fmaxf(mx, l[e]);
    mx = cu_warp_max(mx);
    float sum = 0.f;
    for (int e = lane; e < E; e += 32) sum += expf(l[e] - mx);
    const float tot = cu_warp_sum(sum);
    for (int e = threadIdx.x; e < E; e += nth) p[e] = expf(l[e] - mx);
    tc_route_bar(nth);
    for (int e = threadIdx.x; e < E; e += nth) {
        const float v = p[e];
        int r0 = 0, r1 = 0, r2 = 0, r3 = 0;
        int j = 0;
        for (; j + 4 <= E; j += 4) {
            const float o0 = p[j], o1 = p[j + 1], o2 = p[j + 2], o3 = p[j + 3];
            r0 += (o0 > v) | ((o0 == v) & (j < e));
            r1 += (o1 > v) | ((o1 == v) & (j + 1 < e));
            r2 += (o2 > v) | ((o2 == v) & (j + 2 < e));
            r3 += (o3 > v) | ((o3 == v) & (j + 3 < e));
        }
        for (; j < E; j++) r0 += (p[j] > v) | ((p[j] == v) & (j < e));
        const int rank = r0 + r1 + r2 + r3;
        if (rank < K) { ik[rank] = e; pk[rank] = v; }
    }
    tc_route_bar(nth);
    if (warp == 0) { /* K <= MOE_MAX_K <= 32: a lane a pick */
        const float q = lane < K ? pk[lane] / tot : 0.f;
        float wsum = 0.f;
        for (int i = 0; i < K; i++) wsum += __shfl_sync(0xffffffffu, q, i);
        if (lane < K) {
            ids[lane] = ik[lane];
            wts[lane] = norm_topk ? q / wsum : q;
        }
    }
    tc_route_bar(nth); /* ik / pk are reused by the next token */
}

/* The sigmoid router (DeepSeek-V3, GLM-4.5: moe_route_sig_warp's picks and weights, bit for bit) by rank over the
 * first nr warps, as tc_route_warps ranks the softmax: the route warps write c = sigmoid(l) + choice bias, then each
 * warp takes the group mask itself (the same shuffles in each: group score = the sum of its two largest c, the TG
 * best groups kept, ties to the lower group), an expert of a dropped group competes at 0 (HF's masked_fill, as
 * moe_route_sig_warp zeroes it), and e's rank = how many beat it (ties: the lower id), walking the groups so the
 * loop divides nothing. Warp 0 then forms the weights from the picks' unbiased sigmoids, summed in pick order.
 * moe_route_sig_warp in every gate/up CTA was one warp's chain of K shuffle rounds (gate/up 1.27x its time at
 * GLM-4.5-Air's shape, stop 26); this is three short parallel steps. c: E floats, ik: K (shared). */
__device__ __forceinline__ void tc_route_sig_warps(const float *lg, const float *__restrict__ bias, int32_t E,
                                                   int32_t K, int32_t G, int32_t TG, int32_t norm_topk, float scale,
                                                   float *c, int32_t *ik, int32_t *ids, float *wts) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
    const int nr = (E + 31) / 32 < nw ? (E + 31) / 32 : nw, nth = 32 * nr;
    if (warp >= nr) return;
    for (int e = threadIdx.x; e < E; e += nth) c[e] = 1.0f / (1.0f + expf(-lg[e])) + (bias ? bias[e] : 0.0f);
    tc_route_bar(nth);
    const int grouped = G > 1 && TG < G;
    const int32_t ng = grouped ? G : 1, gs = grouped ? E / G : E;
    const uint32_t keep = grouped ? moe_sig_group_keep(c, E, G, TG) : 0xffffffffu;
    for (int e = threadIdx.x; e < E; e += nth) {
        const float v = (keep >> (e / gs)) & 1u ? c[e] : 0.0f;
        int r = 0;
        for (int32_t gi = 0; gi < ng; gi++) {
            const int kept = (keep >> gi) & 1u;
            for (int32_t j = gi * gs; j < (gi + 1) * gs; j++) {
                const float o = kept ? c[j] : 0.0f;
                r += (o > v) | ((o == v) & (j < e));
            }
        }
        for (int32_t j = ng * gs; j < E; j++) { /* E not a multiple of G (configs forbid it): as the warp form */
            const float o = j / gs < 32 && ((keep >> (j / gs)) & 1u) ? c[j] : 0.0f;
            r += (o > v) | ((o == v) & (j < e));
        }
        if (r < K) ik[r] = e;
    }
    tc_route_bar(nth);
    if (warp == 0) { /* K <= MOE_MAX_K <= 32: a lane a pick */
        const float s = lane < K ? 1.0f / (1.0f + expf(-lg[ik[lane]])) : 0.f;
        float wsum = 0.f;
        for (int i = 0; i < K; i++) wsum += __shfl_sync(0xffffffffu, s, i);
        if (lane < K) {
            ids[lane] = ik[lane];
            wts[lane] = (norm_topk ? s / (wsum + 1e-20f) : s) * scale;
        }
    }
    tc_route_bar(nth); /* c / ik are reused by the next token */
}

__device__ __forceinline__ void tc_bf16x8(uint4 q, float w[8]) {
    const uint32_t u[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
    for (int i = 0; i < 4; i++) { w[2 * i] = __uint_as_float(u[i] << 16); w[2 * i + 1] = __uint_as_float(u[i] & 0xffff0000u); }
}

/* acc[t] += w[0..N) . xs[t][0..N) for the NT staged tokens (row stride H; xs 16-byte aligned; N = 4 or 8). */
template <int NT, int N>
__device__ __forceinline__ void tc_dot_smem(const float w[N], const float *xs, int64_t H, float acc[NT]) {
#pragma unroll
    for (int t = 0; t < NT; t++) {
        const float4 *xp = (const float4 *)(xs + t * H);
        float s = acc[t];
#pragma unroll
        for (int j = 0; j < N / 4; j++) {
            const float4 a = xp[j];
            s = fmaf(w[4 * j], a.x, s); s = fmaf(w[4 * j + 1], a.y, s);
            s = fmaf(w[4 * j + 2], a.z, s); s = fmaf(w[4 * j + 3], a.w, s);
        }
        acc[t] = s;
    }
}

/* ---- router rows ---------------------------------------------------------------------------------------------- */

/* One router row as a warp reads it: bf16 rows (H % 256 == 0) and f32 rows (H % 128 == 0), 16-byte aligned, go 16
 * bytes a lane with TC_RT_U chunks in flight; other types block by block through cu_decode32. */
typedef struct {
    const uint4 *row4;
    const uint8_t *row;
    int bf, fv;
    int64_t U0, U;          /* the 16-byte chunks [U0, U) of the row this warp reads (tc_rrow_part) */
} tc_rrow;

__device__ __forceinline__ tc_rrow tc_rrow_of(const uint8_t *rw, int64_t e, size_t rrow, int32_t rtype, int64_t H) {
    tc_rrow r;
    r.row = rw + e * rrow;
    const int aligned = !((uintptr_t)r.row & 15);
    r.bf = rtype == MOET_TYPE_BF16 && H % 256 == 0 && aligned;
    r.fv = rtype == MOET_TYPE_F32 && H % 128 == 0 && aligned;
    r.row4 = (const uint4 *)r.row;
    r.U0 = 0;
    r.U = r.bf ? H / 8 : H / 4;
    return r;
}

/* Part p of S of a bf16 or f32 row (k_tc_router's split rows): chunks [p n, (p + 1) n), n = ceil(U / S). Other types
 * stay whole: part 0 reads the row and the other parts add nothing (tc_rrow_split_on). */
__device__ __forceinline__ int tc_rrow_split_on(const tc_rrow &r) { return r.bf || r.fv; }
__device__ __forceinline__ tc_rrow tc_rrow_part(tc_rrow r, int p, int S) {
    if (S > 1 && tc_rrow_split_on(r)) {
        const int64_t n = (r.U + S - 1) / S, u1 = (p + 1) * n;
        r.U0 = p * n;
        if (u1 < r.U) r.U = u1;
    }
    return r;
}

/* The first TC_RT_U chunks of a bf16 row, requested before the caller waits for its x (weights only). */
__device__ __forceinline__ void tc_rrow_prefetch(const tc_rrow &r, uint4 q[TC_RT_U]) {
    const int lane = threadIdx.x & 31;
    if (!r.bf) return;
#pragma unroll
    for (int i = 0; i < TC_RT_U; i++)
        if (r.U0 + lane + 32 * i < r.U) q[i] = __ldg(r.row4 + r.U0 + lane + 32 * i);
}

/* acc[t] = the lane's share of row . xs[t] for NT tokens staged at xs (row stride H); q: tc_rrow_prefetch's chunks.
 * The caller adds the lanes (cu_warp_sum). */
template <int NT>
__device__ __forceinline__ void tc_rrow_dot(const tc_rrow &r, uint4 q[TC_RT_U], int32_t rtype, float rqs, float rqb,
                                            const float *xs, int64_t H, float acc[NT]) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int t = 0; t < NT; t++) acc[t] = 0.f;
    if (r.bf || r.fv) {
        for (int64_t u0 = r.U0 + lane; u0 < r.U; u0 += 32 * TC_RT_U) {
            if (u0 != r.U0 + lane || !r.bf) {
#pragma unroll
                for (int i = 0; i < TC_RT_U; i++)
                    if (u0 + 32 * i < r.U) q[i] = __ldg(r.row4 + u0 + 32 * i);
            }
#pragma unroll
            for (int i = 0; i < TC_RT_U; i++) {
                const int64_t u = u0 + 32 * i;
                if (u >= r.U) break;
                if (r.bf) {
                    float w[8];
                    tc_bf16x8(q[i], w);
                    tc_dot_smem<NT, 8>(w, xs + 8 * u, H, acc);
                } else {
                    const float w[4] = {__uint_as_float(q[i].x), __uint_as_float(q[i].y), __uint_as_float(q[i].z),
                                        __uint_as_float(q[i].w)};
                    tc_dot_smem<NT, 4>(w, xs + 4 * u, H, acc);
                }
            }
        }
    } else {
        for (int64_t b = lane; b < H / 32; b += 32) {
            float v[32];
            cu_decode32(rtype, r.row, b, rqs, rqb, v);
#pragma unroll
            for (int t = 0; t < NT; t++)
#pragma unroll
                for (int j = 0; j < 32; j++) acc[t] = fmaf(v[j], xs[t * H + 32 * b + j], acc[t]);
        }
    }
}

/* ---- decode pieces of gate/up and down, shared by moe_tc.cu and moe_st.cu (the same code, so the same bits) ---- */

/* A warp's rotated chunk staged in the integer form into slot job of njobs in global memory (the slots, then their
 * 2^e: what tc_i8_fetch_staged reads). */
template <int M>
__device__ __forceinline__ void tc_stage_slot(const float v[8], uint8_t *stg, int job, int njobs) {
    uint32_t *W = (uint32_t *)(stg + (size_t)job * TC_I8_STAGE_BYTES(M));
    const float p2 = tc_stage_i8<M>(v, W, (int32_t *)(W + M * 64));
    if ((threadIdx.x & 31) == 0) ((float *)(stg + (size_t)njobs * TC_I8_STAGE_BYTES(M)))[job] = p2;
}

/* Down's inputs staged once (the integer form): the last gate/up CTA to finish a chunk of a slot's activations
 * (counted on cnt: T K (F / b) device ints, 0 between launches) rotates and stages it for every down CTA, as
 * tc_prestage does gate/up's x. stg: NULL for none. */
typedef struct {
    uint8_t *stg;
    int32_t *cnt;
    int32_t b, rot, n; /* the down matrices' rotation chunk and rotation, and T K (F / b) slots */
    uint32_t seed;
} cu_tc_dpre;

/* Chunk c of one slot's activation row (written by other CTAs of this launch: loaded coherently) into job's slot. */
template <int M>
__device__ __forceinline__ void tc_prestage_act(const float *arow, int c, int rot, uint32_t seed, uint8_t *stg, int job,
                                                int njobs) {
    float v[8];
    cu_rot_chunk_t<M>(v, arow, rot, seed, c, NULL);
    tc_stage_slot<M>(v, stg, job, njobs);
}

/* The activation of one row's gate and up sums: silu(g) u (the formula these kernels always had, so their results
 * stay bit for bit), or for gpt-oss (ox) the expert's biases at index bi (e F + row) and the clamped form. */
__device__ __forceinline__ float tc_act(float g, float u, const cu_moe_oss &ox, int64_t bi) {
    if (!ox.gb && !(ox.lim > 0.f)) return g / (1.0f + expf(-g)) * u;
    if (ox.gb) {
        g += ox.gb[bi];
        u += ox.ub[bi];
    }
    return cu_moe_act(g, u, ox.lim);
}

/* Down's input chunk c of pick k of token tok in the integer form, into the warp's staging W8 / X8: copied from
 * gate/up's staging (pre: cu_tc_dpre's slots, npre of them) or rotated by the pick's matrix dm and staged here;
 * returns its 2^e. The caller __syncwarp()s before reading W8. */
template <int M>
__device__ __forceinline__ float tc_dn_stage(const uint8_t *pre, int32_t npre, const float *act, int tok, int32_t K,
                                             int k, int c, int nch, int64_t F, const cu_mat &dm, uint32_t *W8,
                                             int32_t *X8) {
    if (pre) return tc_i8_fetch_staged<M>(pre, (tok * K + k) * nch + c, npre, W8);
    float v[8];
    cu_rot_chunk_t<M>(v, act + ((int64_t)tok * K + k) * F, dm.rotated, dm.rot_seed, c, dm.signs);
    return tc_stage_i8<M>(v, W8, X8);
}

/* Gate/up's pick for its slot: routed here from the token's logits (tc_route_warps / tc_route_sig_warps, as the
 * router would; lg: 2 E floats of shared memory), or the router's (rlogits NULL). CTA x = 0 of the slot writes the
 * pick and weight for down and the expert cache. Every thread of the CTA calls it after cu_pdl_wait(). dl (not NULL):
 * whether the slot takes the delta's residuals (moet_delta_pick with r = dpick), the same in every thread. */
__device__ __forceinline__ int32_t tc_gu_route(const float *rlogits, float *lg, int tok, int slot, int32_t E, int32_t K,
                                               int32_t norm_topk, const cu_route_sig &rs, int32_t *topk_ids,
                                               float *topk_w, float dpick = 0.f, int *dl = nullptr) {
    if (!rlogits) { /* the router's output: coherent (cu_pdl_wait) */
        if (dl) *dl = cu_dpick_on(cu_dpick{topk_w, K, dpick}, slot);
        return __ldcg(topk_ids + slot);
    }
    __shared__ int32_t rids[MOE_MAX_K], rik[MOE_MAX_K];
    __shared__ float rwts[MOE_MAX_K], rpk[MOE_MAX_K];
    float *p = lg + E;
    for (int i = threadIdx.x; i < E; i += blockDim.x) lg[i] = __ldcg(rlogits + (int64_t)tok * E + i);
    __syncthreads();
    if (!rs.on) tc_route_warps(lg, E, K, norm_topk, p, rik, rpk, rids, rwts);
    else tc_route_sig_warps(lg, rs.bias, E, K, rs.G, rs.TG, norm_topk, rs.scale, p, rik, rids, rwts);
    __syncthreads();
    const int32_t e = rids[slot - tok * K];
    if (dl) *dl = moet_delta_pick(rwts, K, slot - tok * K, dpick); /* the token's weights are all here */
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        topk_ids[slot] = e;
        topk_w[slot] = rwts[slot - tok * K];
    }
    return e;
}

/* After a gate/up CTA wrote act rows [r0, r0 + nr) of slot: the CTA that completes a chunk of dp.b rows (counted on
 * dp.cnt, reset by it) rotates and stages the chunk for down (cu_tc_dpre). nr divides dp.b and the rows of a CTA
 * lie in one chunk. Every thread of the CTA calls it. */
__device__ __forceinline__ void tc_dpre_finish(const cu_tc_dpre &dp, int slot, int64_t r0, int nr, const float *act,
                                               int64_t F) {
    __shared__ int dlast;
    const int nchd = (int)(F / dp.b), cd = (int)(r0 / dp.b), ci = slot * nchd + cd;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) dlast = atomicAdd(dp.cnt + ci, nr / 16) == dp.b / 16 - nr / 16;
    __syncthreads();
    if (dlast) {
        if (threadIdx.x == 0) dp.cnt[ci] = 0;
        __threadfence();
        if (threadIdx.x < 32) {
            const float *arow = act + (int64_t)slot * F;
            switch (dp.b) {
            case 64: tc_prestage_act<2>(arow, cd, dp.rot, dp.seed, dp.stg, ci, dp.n); break;
            case 128: tc_prestage_act<4>(arow, cd, dp.rot, dp.seed, dp.stg, ci, dp.n); break;
            default: tc_prestage_act<8>(arow, cd, dp.rot, dp.seed, dp.stg, ci, dp.n); break;
            }
        }
    }
}

/* ---- moe_st.cu: the decode gate/up and down with several tiles a CTA (where the legacy grid takes two waves) --- */

typedef struct { /* k_tc_gate_up's arguments (the integer form, no delta), b its rotation chunk, nw its warps */
    const float *x;
    int64_t H, F;
    int32_t K, T, E, b, nw, type, rot, norm_topk, npre;
    uint32_t seed;
    const cu_mat *table;
    int32_t *topk_ids;
    float *act, *topk_w;
    const float *rlogits;
    cu_route_sig rs;
    cu_moe_oss ox;
    const uint8_t *pre;
    cu_tc_dpre dp;
} cu_moe_st_gu;

typedef struct { /* k_tc_down's (the integer form, no delta) */
    const float *act;
    int64_t H, F;
    int32_t K, T, b, nw, type, accum, npre, early;
    const cu_mat *table;
    const int32_t *topk_ids;
    const float *topk_w, *db;
    float *y;
    const uint8_t *pre;
} cu_moe_st_dn;

/* Launch the streamed kernel and return 1, or return 0 where the legacy one keeps the shape (its grid, at
 * legacy_per_sm CTAs an SM, fits one wave; tiles that do not pair; shared memory), -1 on an error (recorded in c).
 * The experts' matrices must be 16-byte aligned (cu_expert_table.aligned16). MOET_MOE_ST=0: never, =1: wherever
 * the tiles pair (the tests). */
int cu_moe_st_gate_up(cu_backend *c, const cu_moe_st_gu *g, int legacy_per_sm);
int cu_moe_st_down(cu_backend *c, const cu_moe_st_dn *d, int legacy_per_sm);

/* Warps for `items` equal work items, at most cap: as few as keep every warp's share the same (24 -> 12 x 2). The
 * decode kernels' split; the fused block reproduces it to stay bit-identical. */
static inline int tc_warps(int64_t items, int cap) {
    if (items < 1) return 1;
    const int64_t per = (items + cap - 1) / cap;
    return (int)((items + per - 1) / per);
}


#endif
