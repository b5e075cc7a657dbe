/*
 * moe_grp.cu — the grouped (prefill) W2 / sym2 expert products on tensor cores with token tiles of up to 64.
 *
 * Why another grouped kernel: moe_tc.cu's k_tc_*_grp take 8 slots a CTA and one 16-row tile, split the hidden size
 * over the warps and re-stage every slot's x as f16 hi/lo inside every CTA. At 512 tokens of qwen3-30b-a3b (32 slots
 * an expert on average) that is 3.1 ms a layer, 12 TFLOP/s: each weight is decoded 4 times an expert, and the
 * staging (a row max, two conversions a value, per tile) costs as many instructions as the mma it feeds. Here:
 *   stage    one CTA a row (a token's rotated x for gate/up, a slot's activation rotated by its expert's down
 *            rotation): v 2^-e as f16 hi and lo (lo only where the products read it), e from the row's largest |v|
 *            (largest -> [2^14, 2^15)), written once, in the B-fragment order of mma.m16n8k16 (gb_perm; natural
 *            order for k_gw_experts), with q = 2^e beside it;
 *   products one CTA per (GB_W 16-row tiles, a chunk of slots of one expert: 8 NT with x as one f16, the default,
 *            4 NT as hi + lo): the slots' staged columns and the warps' code words and scale bytes go to shared
 *            memory by cp.async in pieces of GB_KP columns, GB_ST pieces in flight; each warp decodes its tile's
 *            levels once a block and runs them against every n-tile of 8 slots (4 as hi + lo; one 16-byte shared
 *            load a lane an n-tile), the block scale folded in by an FMA an accumulator. No split over the hidden
 *            size, so no reduction between warps: each lane ends with its own rows of its own slots and writes
 *            SwiGLU(gate, up) or the down product directly. k_gw_experts (opt-in) does the same work on wgmma.
 * Exactness: weights (levels) exact in f16, f32 accumulation, the scales in f32. By default (since stop 40, X1 below)
 * x is one f16 of the row scaled by its power of two (11 bits: a relative rounding of at most 2^-12 a value); with
 * MOET_MOE_X1=0 it is hi + lo as moe_tc.cu's (~22 bits of the row's largest value), the hi and lo columns' sums
 * added at the end, times q: fp32-exact. Fixed order, no float atomics: bit-identical on every run, graph or eager.
 * Bytes and FLOPs (30b, 512 tokens, one layer): 128 experts x 3 x 768 x 2048 x 9/32 = 170 MB of weights at most, each
 * read once a chunk of slots; 2 x 4096 slots x 3 x 768 x 2048 = 38.7 GFLOP useful, as many on the tensor cores with
 * the level operand and x as one f16 (2x with hi and lo, 4x with the sign planes too).
 */
#include <math.h>

#include <type_traits>

#include "backend/cuda/moe_tc.cuh"

#define GB_W 8                  /* warps a CTA, a 16-row tile each */
#define GB_KP 128               /* columns of a piece (4 blocks of 32) */
#define GB_LD (GB_KP + 32)      /* halves a staged column takes in shared memory: 80 words, 16 mod 32, so the eight
                                   lanes of a 16-byte load phase hit distinct banks */
#define GB_ST 3                 /* pieces in flight */
#define GB_STAGE_T 256          /* threads of the staging kernel */
#define GB_STAGE_SMEM (160 * 1024) /* its shared row (n floats) at most */

/* Position of column k in the staged order: within each block of 32, lane t's eight B values of both half-blocks
 * (k = 2t, 2t+1, 2t+8, 2t+9, 16+2t, 17+2t, 24+2t, 25+2t) lie together at 8t, one 16-byte load. */
__device__ __forceinline__ int gb_perm(int k) {
    const int kk = k & 31, r = kk & 15;
    return (k & ~31) + 8 * ((r & 7) >> 1) + 4 * (kk >> 4) + 2 * (r >> 3) + (kk & 1);
}

__device__ __forceinline__ void gb_cp16(void *dst, const void *src, int valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(cu_smem_u32(dst)), "l"(src), "r"(valid ? 16 : 0)
                 : "memory");
}
__device__ __forceinline__ void gb_commit(void) { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N> __device__ __forceinline__ void gb_wait(void) { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }

/* Piece p's staged columns into shared memory: hi and lo of each slot (cols = 2 slots), or with X1 the hi half alone
 * (cols = slots); rowof[slot] is the slot's staged row (-1: past the chunk, zero-filled), rows of 2 C halves. Every
 * thread of the CTA. */
template <int COLS, int X1>
__device__ __forceinline__ void gb_issue_cols(__half *xsm, const __half *xs, const int32_t *rowof, int64_t C, int p) {
    for (int i = threadIdx.x; i < COLS * (GB_KP / 8); i += blockDim.x) {
        const int col = i / (GB_KP / 8), ch = i % (GB_KP / 8), slot = X1 ? col : col >> 1;
        const int32_t row = rowof[slot];
        const __half *sp = xs + (row < 0 ? 0 : (size_t)row * 2 * C + (size_t)(X1 ? 0 : col & 1) * C) + (size_t)p * GB_KP + ch * 8;
        gb_cp16(xsm + (size_t)col * GB_LD + ch * 8, sp, row >= 0);
    }
}

/* ---- staging ------------------------------------------------------------------------------------------------- */

/* Row blockIdx.x of n values: from src (padded rows of CU_PAD(n), already rotated: gate/up's x) when table is NULL,
 * else from src row r / div (n apart) rotated by matrix `mi` of expert ids[r] (down's activations: div 1; the delta
 * residuals' view of x: div K). dst: [rows][2][n] halves (hi, lo) in gb_perm order, q[r] = 2^e. Dynamic shared
 * memory: n floats. dp (the residuals' passes; rows are slots): a slot that does not take the delta is staged as
 * zeros with q 0, so its products add exactly nothing. */
template <int M>
__global__ void __launch_bounds__(GB_STAGE_T)
k_gb_stage(const float *src, int64_t n, const cu_mat *__restrict__ table, int mi, const int32_t *ids, int div,
           __half *dst, float *q, int lo_too, int natural, cu_dpick dp) {
    extern __shared__ float vs[];
    __shared__ float wmax[GB_STAGE_T / 32];
    const int64_t r = blockIdx.x;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
    constexpr int b = 32 * M;
    float mx = 0.f;
    if (!cu_dpick_on(dp, r)) { /* the same in every thread */
        __half *hi = dst + r * 2 * n;
        for (int64_t i = threadIdx.x; i < (lo_too ? 2 : 1) * n; i += blockDim.x) hi[i] = __float2half_rn(0.f);
        if (threadIdx.x == 0) q[r] = 0.f;
        return;
    }
    if (table) {
        const cu_mat m = table[(int64_t)ids[r] * 3 + mi];
        for (int c = warp; c < (int)(n / b); c += nw) {
            float v[8];
            cu_rot_chunk_t<M>(v, src + (r / div) * n, m.rotated, m.rot_seed, c, m.signs);
#pragma unroll
            for (int i = 0; i < M; i++) { vs[c * b + lane * M + i] = v[i]; mx = fmaxf(mx, fabsf(v[i])); }
        }
    } else {
        const float *row = src + r * CU_PAD(n);
        for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
            const float v = __ldcg(row + CU_PAD(i));
            vs[i] = v;
            mx = fmaxf(mx, fabsf(v));
        }
    }
    mx = cu_warp_max(mx);
    if (lane == 0) wmax[warp] = mx;
    __syncthreads();
    mx = 0.f;
    for (int w = 0; w < nw; w++) mx = fmaxf(mx, wmax[w]);
    const int e = tc_stage_exp(mx);
    const float dn = __int_as_float((127 - e) << 23);
    __half *hi = dst + r * 2 * n, *lo = hi + n;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
        const float s = vs[i] * dn;
        const __half h = __float2half_rn(s);
        const int p = natural ? (int)i : gb_perm((int)i); /* natural: k_gw_experts' core matrices */
        hi[p] = h;
        if (lo_too) lo[p] = __float2half_rn(s - __half2float(h)); /* not read where x is one f16 (X1) */
    }
    if (threadIdx.x == 0) q[r] = __int_as_float((127 + e) << 23);
}

/* ---- products ------------------------------------------------------------------------------------------------ */

/* Shared memory of one piece: the staged columns [8 NT][GB_LD] halves, then per warp and matrix the code words of
 * its tile's 4 blocks (512 bytes) and their scale bytes (64). */
template <int NT, int NM>
struct gb_piece {
    static constexpr int cols = 8 * NT;
    static constexpr size_t xbytes = (size_t)cols * GB_LD * 2;
    static constexpr size_t wbytes = (size_t)GB_W * NM * (512 + 64);
    static constexpr size_t bytes = xbytes + wbytes;
};

/* The level operand (LV kernels): f16x2 register r of half-block s of a lane's word w, holding the two weights'
 * levels themselves instead of two +-1 sign planes: level = u' (u' == v' ? m_same : m_diff) (W2: 1 and beta; sym2:
 * 1.5 and 0.5), exact when both magnitudes are f16 values (tab->levels_f16). The sign is u''s bit; where the two
 * sign bits differ, prmt replicates the difference bit over its half (selector nibbles 9 and B: the sign of bytes 1
 * and 3) and selects m_diff's bits over m_same's. one2 = m_same in both halves, dpair = one2 ^ (m_diff in both). */
/* d = w ^ (w << 8), once a word: (w << x) ^ (w << (8 + x)) = d << x, so each register takes two shifts, the prmt
 * and two three-input logic ops (the PTX of the form with w << (8 + x) kept a third shift and an xor a register:
 * 8 registers a word, ~1/6 of the decode). */
__device__ __forceinline__ uint32_t gb_level2(uint32_t w, uint32_t d, int x, uint32_t one2, uint32_t dpair) {
    uint32_t mask;
    asm("prmt.b32 %0, %1, 0, 0xBB99;" : "=r"(mask) : "r"(d << x));
    return (one2 ^ (mask & dpair)) | ((w << x) & 0x80008000u);
}

/* The CTA's work item (blockIdx.y: an expert e and its chunk from slot c0), tc_lut_fill's table, and the chunk's
 * slots into shared memory (every thread): outof[i] the slot (output row), rowof[i] its staged input row (the token
 * for gate/up, the slot for down), -1 past the chunk; returns the chunk's slot count (at most TB). The caller
 * syncs. */
template <int TB, int GU>
__device__ __forceinline__ int gb_chunk(const int32_t *items, const int32_t *count, const int32_t *list, int64_t T,
                                        int32_t K, float *lut, int32_t *rowof, int32_t *outof, int32_t *e_out) {
    const int32_t e = items[2 * blockIdx.y], c0 = items[2 * blockIdx.y + 1];
    const int nt = count[e] - c0 < TB ? count[e] - c0 : TB;
    tc_lut_fill(lut);
    for (int i = threadIdx.x; i < TB; i += blockDim.x) {
        const int32_t s = i < nt ? list[(int64_t)e * T + c0 + i] : -1;
        outof[i] = s;
        rowof[i] = s < 0 ? -1 : GU ? s / K : s;
    }
    *e_out = e;
    return nt;
}

/* The level operand's constants of a matrix (gb_level2): its two magnitudes (exact in f16: checked at upload) */
__device__ __forceinline__ void gb_level_consts(int32_t type, float beta, uint32_t *one2, uint32_t *dpair) {
    const uint32_t ms = __half_as_ushort(__float2half_rn(type == MOET_TYPE_SYM2 ? 1.5f : 1.0f));
    const uint32_t md = __half_as_ushort(__float2half_rn(type == MOET_TYPE_SYM2 ? 0.5f : beta));
    *one2 = ms | ms << 16;
    *dpair = *one2 ^ (md | md << 16);
}

/* The scaled-A forms (X1 = 2, k_gw_experts): the matrix scale a into [2^14, 2^15) so that a block's scale (lut <=
 * 1) times it is a normal f16; *pw undoes it on the sums */
__device__ __forceinline__ void gb_scale_pow(float *a, float *pw) {
    if (*a != 0.f) {
        const int E = ilogbf(*a);
        *a = ldexpf(*a, 14 - E);
        *pw = ldexpf(1.f, E - 14);
    }
}

/* A lane's k32 block of one matrix as scaled level operands (the AS forms, X1 = 2): out[hb][r] = f16(level x the
 * row's scale), s2 the scales of rows g (registers 0 and 2 of a half-block) and g + 8 (1 and 3) */
__device__ __forceinline__ void gb_levels_scaled(uint32_t w, __half2 s2, uint32_t one2, uint32_t dpair,
                                                 uint32_t out[2][4]) {
    const uint32_t d = w ^ (w << 8);
    const __half2 sg = __low2half2(s2), sg8 = __high2half2(s2);
#pragma unroll
    for (int hb = 0; hb < 2; hb++)
#pragma unroll
        for (int r = 0; r < 4; r++) {
            const uint32_t raw = gb_level2(w, d, 4 * hb + r, one2, dpair);
            const __half2 v = __hmul2(*(const __half2 *)&raw, (r & 1) ? sg8 : sg);
            out[hb][r] = *(const uint32_t *)&v;
        }
}

/* GU = 1: gate and up (rows F of hidden H), act[slot][F] = SwiGLU; GU = 0: down (rows H of F), ydn[slot][H]. xs /
 * qx: the staged input rows (tokens for gate/up, slots for down). LV = 1: the level operand (gb_level2): one mma a
 * half-block and n-tile instead of two, one FMA an accumulator instead of two. PRE (GU = 1, with the delta): the
 * products before SwiGLU, gate into out and up into out2, for k_gb_nv to add the residuals' and apply it.
 * X1 = 1 (the default; MOET_MOE_X1=0 for hi + lo): x as its hi half alone, one f16 of 11 bits scaled by the row's
 * power of two, so an n-tile is 8 slots instead of 4 slots' hi and lo: half the mma, B loads and FMAs a slot, the
 * same weight decode. Not fp32-exact: each x value carries a relative rounding of up to 2^-12 (bf16 activations, as
 * other engines run them, carry 2^-9); test_ops checks it against the reference at NMSE 1e-6 instead of 1e-10, and
 * docs/design.md decision 9 has what it costs end to end (moe-mini-c W2: KLD 2e-6 against the exact path, 1e-5 of
 * the perplexity) and buys (H100: the 30b MoE op at 512 tokens 1.42x, pp512 1.25x at 30b, 1.39x at 235b). */
/* X1 = 2 (LV only; MOET_MOE_AS=1, opt-in for A/B): x as with X1 = 1, and each block's scale folded into the level
 * operand: A = f16(level x f16(scale x 2^(14 - E))) (E the matrix scale's exponent, so every product is a normal f16
 * at most 1.5 x 2^15), one HMUL2 a register, so the mma accumulate straight into the sums across blocks: no product
 * a block to zero, no 4 FMAs an n-tile and block. The weights carry a further relative rounding of up to ~2^-11. */
template <int NT, int GU, int LV, int PRE = 0, int X1 = 0>
__global__ void __launch_bounds__(GB_W * 32, 2)
k_gb_experts(const __half *xs, const float *qx, int64_t T, int64_t R, int64_t C, int32_t K,
             const cu_mat *__restrict__ table, int32_t type, const int32_t *count, const int32_t *n_items,
             const int32_t *items, const int32_t *list, float *out, float *out2) {
    constexpr int NM = GU ? 2 : 1, TB = (X1 ? 8 : 4) * NT;
    constexpr bool XS = X1 == 2 && LV;
    typedef gb_piece<NT, NM> P;
    extern __shared__ __align__(16) unsigned char smem[];
    if ((int)blockIdx.y >= *n_items) return;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    float *lut = (float *)smem;
    int32_t *rowof = (int32_t *)(lut + 256);          /* [TB]: the staged row of each slot, -1 past the chunk */
    int32_t *outof = rowof + TB;                      /* [TB]: the slot (output row) */
    unsigned char *pieces = (unsigned char *)(outof + TB);
    int32_t e;
    const int nt = gb_chunk<TB, GU>(items, count, list, T, K, lut, rowof, outof, &e);
    __syncthreads();
    const int64_t ti = (int64_t)blockIdx.x * GB_W + warp, NB = C / 32;
    const int live = ti < R / 16, np = (int)(C / GB_KP);
    cu_mat mt[NM];
    float A[NM], B[NM], pw[NM];
    uint32_t one2[NM], dpair[NM];
#pragma unroll
    for (int k = 0; k < NM; k++) {
        mt[k] = table[(int64_t)e * 3 + (GU ? k : 2)];
        tc_ab(type, mt[k].qbeta, &A[k], &B[k]);
        pw[k] = 1.f;
        if (LV) { /* the levels' two magnitudes, the scale alone in A */
            gb_level_consts(type, mt[k].qbeta, &one2[k], &dpair[k]);
            A[k] = mt[k].qscale;
            B[k] = 0.f;
            if (XS) gb_scale_pow(&A[k], &pw[k]);
        } else {
            one2[k] = dpair[k] = 0;
            A[k] *= mt[k].qscale;
            B[k] *= mt[k].qscale;
        }
    }
    /* issue piece p into stage p % GB_ST (every thread: x columns; each live warp: its own weights) */
    auto issue = [&](int p) {
        unsigned char *st = pieces + (size_t)(p % GB_ST) * P::bytes;
        __half *xsm = (__half *)st;
        gb_issue_cols<P::cols, X1>(xsm, xs, rowof, C, p);
        if (live) {
            unsigned char *wsm = st + P::xbytes + (size_t)warp * NM * (512 + 64);
#pragma unroll
            for (int k = 0; k < NM; k++) {
                const int64_t tb = ti * NB + (int64_t)p * (GB_KP / 32);
                gb_cp16(wsm + k * 576 + 16 * lane, (const unsigned char *)(tc_codes(mt[k]) + tb * 32) + 16 * lane, 1);
                if (lane < 4) gb_cp16(wsm + k * 576 + 512 + 16 * lane, tc_scales(mt[k], R, NB) + tb * 16 + 16 * lane, 1);
            }
        }
    };
    float acc[NM][NT][4];
#pragma unroll
    for (int k = 0; k < NM; k++)
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int i = 0; i < 4; i++) acc[k][j][i] = 0.f;
    const int ntl = X1 ? (nt + 7) >> 3 : (nt + 3) >> 2; /* n-tiles with a slot */
#pragma unroll
    for (int p = 0; p < GB_ST - 1; p++) {
        if (p < np) issue(p);
        gb_commit();
    }
    for (int p = 0; p < np; p++) {
        gb_wait<GB_ST - 2>();
        __syncthreads(); /* piece p landed for every thread; stage (p - 1) % GB_ST is free again */
        if (p + GB_ST - 1 < np) issue(p + GB_ST - 1);
        gb_commit();
        const unsigned char *st = pieces + (size_t)(p % GB_ST) * P::bytes;
        const __half *xsm = (const __half *)st;
        const unsigned char *wsm = st + P::xbytes + (size_t)warp * NM * (512 + 64);
        if (live && XS) {
#pragma unroll
            for (int bi = 0; bi < GB_KP / 32; bi++) {
                uint32_t lv[NM][2][4];
#pragma unroll
                for (int k = 0; k < NM; k++) {
                    const uint32_t w = ((const uint32_t *)(wsm + k * 576))[bi * 32 + lane];
                    const unsigned char *sc = wsm + k * 576 + 512 + bi * 16;
                    gb_levels_scaled(w, __floats2half2_rn(A[k] * lut[sc[g]], A[k] * lut[sc[g + 8]]), one2[k],
                                     dpair[k], lv[k]);
                }
#pragma unroll
                for (int j = 0; j < NT; j++) {
                    if (j >= ntl) break;
                    const uint4 bv = *(const uint4 *)(xsm + (size_t)(8 * j + g) * GB_LD + bi * 32 + 8 * t);
                    const uint32_t b0[2] = {bv.x, bv.y}, b1[2] = {bv.z, bv.w};
#pragma unroll
                    for (int k = 0; k < NM; k++) {
                        tc_mma(acc[k][j], lv[k][0], b0);
                        tc_mma(acc[k][j], lv[k][1], b1);
                    }
                }
            }
        }
        if (live && LV && !XS) {
#pragma unroll
            for (int bi = 0; bi < GB_KP / 32; bi++) {
                uint32_t lv[NM][2][4];
                float sa0[NM], sa1[NM];
#pragma unroll
                for (int k = 0; k < NM; k++) {
                    const uint32_t w = ((const uint32_t *)(wsm + k * 576))[bi * 32 + lane], d = w ^ (w << 8);
                    const unsigned char *sc = wsm + k * 576 + 512 + bi * 16;
                    sa0[k] = A[k] * lut[sc[g]];
                    sa1[k] = A[k] * lut[sc[g + 8]];
#pragma unroll
                    for (int hb = 0; hb < 2; hb++)
#pragma unroll
                        for (int r = 0; r < 4; r++) lv[k][hb][r] = gb_level2(w, d, 4 * hb + r, one2[k], dpair[k]);
                }
                constexpr int JJ = NT >= 4 ? 2 : 1;
#pragma unroll
                for (int j = 0; j < NT; j += JJ) {
                    if (j >= ntl) break;
                    float cl[JJ][NM][4];
#pragma unroll
                    for (int jj = 0; jj < JJ; jj++) {
                        const uint4 bv = *(const uint4 *)(xsm + (size_t)(8 * (j + jj) + g) * GB_LD + bi * 32 + 8 * t);
                        const uint32_t b0[2] = {bv.x, bv.y}, b1[2] = {bv.z, bv.w};
#pragma unroll
                        for (int k = 0; k < NM; k++) {
#pragma unroll
                            for (int i = 0; i < 4; i++) cl[jj][k][i] = 0.f;
                            tc_mma(cl[jj][k], lv[k][0], b0);
                            tc_mma(cl[jj][k], lv[k][1], b1);
                        }
                    }
#pragma unroll
                    for (int jj = 0; jj < JJ; jj++)
#pragma unroll
                        for (int k = 0; k < NM; k++) {
                            float *a = acc[k][j + jj];
                            a[0] = fmaf(sa0[k], cl[jj][k][0], a[0]);
                            a[1] = fmaf(sa0[k], cl[jj][k][1], a[1]);
                            a[2] = fmaf(sa1[k], cl[jj][k][2], a[2]);
                            a[3] = fmaf(sa1[k], cl[jj][k][3], a[3]);
                        }
                }
            }
        }
        if (live && !LV) {
#pragma unroll
            for (int bi = 0; bi < GB_KP / 32; bi++) {
                uint32_t au[NM][2][4], av[NM][2][4];
                float sa0[NM], sb0[NM], sa1[NM], sb1[NM];
#pragma unroll
                for (int k = 0; k < NM; k++) {
                    const uint32_t w = ((const uint32_t *)(wsm + k * 576))[bi * 32 + lane];
                    const unsigned char *sc = wsm + k * 576 + 512 + bi * 16;
                    const float s0 = lut[sc[g]], s1 = lut[sc[g + 8]];
                    sa0[k] = A[k] * s0; sb0[k] = B[k] * s0; sa1[k] = A[k] * s1; sb1[k] = B[k] * s1;
#pragma unroll
                    for (int s = 0; s < 2; s++)
#pragma unroll
                        for (int r = 0; r < 4; r++) { au[k][s][r] = tc_sign2(w, 4 * s + r); av[k][s][r] = tc_sign2(w, 8 + 4 * s + r); }
                }
                /* n-tiles JJ at a time: with 16+ slots a tile, two tiles' mma are issued before the FMAs that
                 * need the first one's results (at most one n-tile of empty slots past the chunk's last is
                 * computed: 512 tokens at the 30b shape 791 -> 774 us); with 8, where a chunk often has one n-tile
                 * of slots, one at a time (two cost 32 tokens 209 -> 234 us) */
                constexpr int JJ = NT >= 4 ? 2 : 1;
#pragma unroll
                for (int j = 0; j < NT; j += JJ) {
                    if (j >= ntl) break;
                    float cu[JJ][NM][4], cv[JJ][NM][4];
#pragma unroll
                    for (int jj = 0; jj < JJ; jj++) {
                        const uint4 bv = *(const uint4 *)(xsm + (size_t)(8 * (j + jj) + g) * GB_LD + bi * 32 + 8 * t);
                        const uint32_t b0[2] = {bv.x, bv.y}, b1[2] = {bv.z, bv.w};
#pragma unroll
                        for (int k = 0; k < NM; k++) {
#pragma unroll
                            for (int i = 0; i < 4; i++) cu[jj][k][i] = cv[jj][k][i] = 0.f;
                            tc_mma(cu[jj][k], au[k][0], b0);
                            tc_mma(cv[jj][k], av[k][0], b0);
                            tc_mma(cu[jj][k], au[k][1], b1);
                            tc_mma(cv[jj][k], av[k][1], b1);
                        }
                    }
#pragma unroll
                    for (int jj = 0; jj < JJ; jj++)
#pragma unroll
                        for (int k = 0; k < NM; k++) {
                            float *a = acc[k][j + jj];
                            a[0] = fmaf(sa0[k], cu[jj][k][0], fmaf(sb0[k], cv[jj][k][0], a[0]));
                            a[1] = fmaf(sa0[k], cu[jj][k][1], fmaf(sb0[k], cv[jj][k][1], a[1]));
                            a[2] = fmaf(sa1[k], cu[jj][k][2], fmaf(sb1[k], cv[jj][k][2], a[2]));
                            a[3] = fmaf(sa1[k], cu[jj][k][3], fmaf(sb1[k], cv[jj][k][3], a[3]));
                        }
                }
            }
        }
    }
    gb_wait<0>();
    if (!live) return;
    /* slot `slot`'s sums of rows g and g + 8 of gate (or down) and up, before the input's power of two */
    auto put = [&](int slot, float g0, float g1, float u0, float u1) {
        const float qv = __ldcg(qx + rowof[slot]);
        const int64_t o = (int64_t)outof[slot] * R + ti * 16 + g;
        g0 *= qv; g1 *= qv; u0 *= qv; u1 *= qv;
        if (GU && PRE) {
            out[o] = g0; out[o + 8] = g1;
            out2[o] = u0; out2[o + 8] = u1;
        } else if (GU) {
            out[o] = g0 / (1.0f + expf(-g0)) * u0;
            out[o + 8] = g1 / (1.0f + expf(-g1)) * u1;
        } else {
            out[o] = g0;
            out[o + 8] = g1;
        }
    };
#pragma unroll
    for (int j = 0; j < NT; j++) {
        const float *ag = acc[0][j], *au = acc[NM - 1][j];
        if (X1) { /* lane (g, t) of n-tile j holds rows g and g + 8 of slots 8 j + 2 t (column 2t) and 8 j + 2 t + 1 */
            const float pg = pw[0], pu = pw[NM - 1]; /* 1 but with XS */
#pragma unroll
            for (int h = 0; h < 2; h++)
                if (8 * j + 2 * t + h < nt) put(8 * j + 2 * t + h, ag[h] * pg, ag[2 + h] * pg, au[h] * pu, au[2 + h] * pu);
        } else { /* rows g and g + 8 of slot 4 j + t, hi (column 2t) and lo (2t + 1) */
            if (4 * j + t < nt) put(4 * j + t, ag[0] + ag[1], ag[2] + ag[3], au[0] + au[1], au[2] + au[3]);
        }
    }
}

/* ---- wgmma (sm_90a): the grouped products with the warpgroup's 64 rows at once ---------------------------------
 * gw_mma<N>: d[0 .. N/2) += A . B for wgmma.m64nNk16 (f32 += f16 x f16), A from registers (a warp's 16 rows in
 * mma.m16n8k16's A-fragment order), B (16 x N, K-major) from shared memory by descriptor; N = 8 .. 64 (the operand
 * lists are mechanical). Compiled only for sm_90a (a trap elsewhere, where the host never launches it). */
template <int N> __device__ __forceinline__ void gw_mma(float *d, const uint32_t a[4], uint64_t desc);
/* GW_MMA(N, D, A, DESC, ONE, outputs): the specialisation for N; D and A the asm operand numbers of the N / 2
 * accumulators and the 4 A registers, DESC and ONE those of the descriptor and of the scale-d predicate's source */
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define GW_MMA(N, D, A, DESC, ONE, ...)                                                                              \
    template <> __device__ __forceinline__ void gw_mma<N>(float *d, const uint32_t a[4], uint64_t desc) {             \
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " ONE ", 0;\nwgmma.mma_async.sync.aligned.m64n" #N            \
                     "k16.f32.f16.f16 {" D "}, {" A "}, " DESC ", p, 1, 1, 0;\n}\n"                                    \
                     : __VA_ARGS__                                                                                   \
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1));                              \
    }
#else /* never launched off sm_90a: the host takes k_gw_experts only on sm_90 */
#define GW_MMA(N, D, A, DESC, ONE, ...)                                                                              \
    template <> __device__ __forceinline__ void gw_mma<N>(float *d, const uint32_t a[4], uint64_t desc) {             \
        (void)d; (void)a; (void)desc;                                                                                \
        __trap();                                                                                                    \
    }
#endif
GW_MMA(8, "%0,%1,%2,%3", "%4,%5,%6,%7", "%8", "%9",
       "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]))
GW_MMA(16, "%0,%1,%2,%3,%4,%5,%6,%7", "%8,%9,%10,%11", "%12", "%13",
       "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]))
GW_MMA(24, "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11", "%12,%13,%14,%15", "%16", "%17",
       "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]))
GW_MMA(32, "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15", "%16,%17,%18,%19", "%20", "%21",
       "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]))
GW_MMA(40, "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19", "%20,%21,%22,%23", "%24", "%25",
       "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]))
GW_MMA(48, "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23", "%24,%25,%26,%27", "%28", "%29",
       "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]))
GW_MMA(56, "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27", "%28,%29,%30,%31", "%32", "%33",
       "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]))
GW_MMA(64, "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31", "%32,%33,%34,%35", "%36", "%37",
       "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]))
#undef GW_MMA

__device__ __forceinline__ void gw_fence(void) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void gw_commit(void) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
template <int N> __device__ __forceinline__ void gw_wait(void) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#endif
}
/* cp.async's writes (the generic proxy) made visible to wgmma's reads of shared memory (the async proxy) */
__device__ __forceinline__ void gw_proxy_fence(void) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}
/* B of one k16 step: N columns of 16 halves in core matrices of 8 columns x 8 k (128 bytes, a column's 8 k a
 * 16-byte row), no swizzle; K-adjacent core matrices 128 bytes apart (leading byte offset), N-adjacent 2048 (stride:
 * the piece's 16 k-groups) */
__device__ __forceinline__ uint64_t gw_desc(uint32_t saddr) {
    return (uint64_t)((saddr & 0x3FFFF) >> 4) | (uint64_t)(128 >> 4) << 16 | (uint64_t)(2048 >> 4) << 32;
}

/* k_gw_experts (MOET_MOE_WG=1, opt-in, sm_90a): k_gb_experts' work (a CTA: 128 rows of one expert's matrices for a
 * chunk of up to 64 slots) with its numerics at X1 = 2 (x as one f16, each block's scale folded into the f16 level
 * operand), on wgmma: each warpgroup multiplies its 64 rows by all the chunk's slots, one instruction a k16 step and
 * matrix (m64nNk16, N the chunk's live n-tiles x 8), A (the decoded levels times the scale) from each warp's
 * registers, B (x, natural order) from shared memory in core matrices. The accumulation is the tensor cores' own
 * across the whole row: no FMA a block and n-tile, no mma a n-tile. The level decode is k_gb_experts' (the A
 * fragment of a warp's 16 rows is mma.m16n8k16's); two register sets alternate by block so that the next block
 * is decoded while the last one's wgmma run. Not bit-identical to k_gb_experts (the tensor cores add in their own
 * order); test_ops checks it against the reference at NMSE 1e-6. */
template <int GU, int DEEP>
__global__ void __launch_bounds__(GB_W * 32, 2)
k_gw_experts(const __half *xs, const float *qx, int64_t T, int64_t R, int64_t C, int32_t K,
             const cu_mat *__restrict__ table, int32_t type, const int32_t *count, const int32_t *n_items,
             const int32_t *items, const int32_t *list, float *out) {
    constexpr int NM = GU ? 2 : 1, TB = 64, XB = TB * GB_KP * 2, PB = XB + GB_W * NM * 576;
    extern __shared__ __align__(128) unsigned char smem[];
    if ((int)blockIdx.y >= *n_items) return;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    float *lut = (float *)smem;
    int32_t *rowof = (int32_t *)(lut + 256); /* [TB] */
    int32_t *outof = rowof + TB;             /* [TB] */
    unsigned char *pieces = smem + 1536;
    int32_t e;
    const int nt = gb_chunk<TB, GU>(items, count, list, T, K, lut, rowof, outof, &e);
    __syncthreads();
    const int64_t ti = (int64_t)blockIdx.x * GB_W + warp, NB = C / 32;
    const int live = ti < R / 16, np = (int)(C / GB_KP), ntl = (nt + 7) >> 3;
    cu_mat mt[NM];
    float A[NM], pw[NM];
    uint32_t one2[NM], dpair[NM];
#pragma unroll
    for (int k = 0; k < NM; k++) {
        mt[k] = table[(int64_t)e * 3 + (GU ? k : 2)];
        gb_level_consts(type, mt[k].qbeta, &one2[k], &dpair[k]);
        A[k] = mt[k].qscale;
        pw[k] = 1.f;
        gb_scale_pow(&A[k], &pw[k]);
    }
    auto issue = [&](int p) {
        unsigned char *st = pieces + (size_t)(p % GB_ST) * PB;
        for (int i = threadIdx.x; i < TB * (GB_KP / 8); i += blockDim.x) {
            const int col = i / (GB_KP / 8), ch = i % (GB_KP / 8);
            const int32_t row = rowof[col];
            const __half *sp = xs + (row < 0 ? 0 : (size_t)row * 2 * C) + (size_t)p * GB_KP + ch * 8;
            gb_cp16(st + ((col >> 3) * (GB_KP / 8) + ch) * 128 + (col & 7) * 16, sp, row >= 0);
        }
        if (live) {
            unsigned char *wsm = st + XB + (size_t)warp * NM * 576;
#pragma unroll
            for (int k = 0; k < NM; k++) {
                const int64_t tb = ti * NB + (int64_t)p * (GB_KP / 32);
                gb_cp16(wsm + k * 576 + 16 * lane, (const unsigned char *)(tc_codes(mt[k]) + tb * 32) + 16 * lane, 1);
                if (lane < 4) gb_cp16(wsm + k * 576 + 512 + 16 * lane, tc_scales(mt[k], R, NB) + tb * 16 + 16 * lane, 1);
            }
        }
    };
    /* the whole loop for one N (the chunk's live n-tiles x 8), chosen once a CTA: a choice at every wgmma cost
     * more instructions than it saved (stop 40, ncu). The accumulators (N / 2 a matrix) and the epilogue are the
     * loop's own, so a small N holds few registers; there DEEP (MOET_MOE_WG=2: written at stop 40, first run at stop
     * 45 on an H100: correct, and no faster than WG=1 anywhere) rotates RS = 4 sets of A registers instead of 2, so a block waits only for the
     * groups 4 blocks back (the wgmma's latency is most exposed where N is small, 0.56x the mma.sync kernel at
     * 8-32 tokens; N <= 16: with more the gate/up kernel spills). */
    auto loop = [&](auto nn) {
        constexpr int NN = decltype(nn)::value, RS = DEEP && NN <= 16 ? 4 : 2;
        float d[NM][NN / 2];
#pragma unroll
        for (int k = 0; k < NM; k++)
#pragma unroll
            for (int i = 0; i < NN / 2; i++) d[k][i] = 0.f;
#pragma unroll
        for (int p = 0; p < GB_ST - 1; p++) {
            if (p < np) issue(p);
            gb_commit();
        }
        uint32_t lv[RS][NM][2][4];
        for (int p = 0; p < np; p++) {
            gb_wait<GB_ST - 2>();
            gw_proxy_fence();
            __syncthreads(); /* piece p landed for every thread; every wgmma of piece p - 1 is done (waited below) */
            if (p + GB_ST - 1 < np) issue(p + GB_ST - 1);
            gb_commit();
            const unsigned char *st = pieces + (size_t)(p % GB_ST) * PB;
            const uint32_t xb = cu_smem_u32(st);
            const unsigned char *wsm = st + XB + (size_t)warp * NM * 576;
#pragma unroll
            for (int bi = 0; bi < GB_KP / 32; bi++) {
                const int b = bi % RS;
                if (bi >= RS) gw_wait<RS - 1>(); /* block bi - RS's wgmma (they read lv[b]) done */
#pragma unroll
                for (int k = 0; k < NM; k++) { /* a dead warp's rows: zero operands (the wgmma are the group's) */
                    const uint32_t w = live ? ((const uint32_t *)(wsm + k * 576))[bi * 32 + lane] : 0u;
                    const unsigned char *sc = wsm + k * 576 + 512 + bi * 16;
                    gb_levels_scaled(w, live ? __floats2half2_rn(A[k] * lut[sc[g]], A[k] * lut[sc[g + 8]])
                                             : __floats2half2_rn(0.f, 0.f),
                                     one2[k], dpair[k], lv[b][k]);
                }
                gw_fence();
#pragma unroll
                for (int hb = 0; hb < 2; hb++) {
                    const uint64_t desc = gw_desc(xb + (uint32_t)(2 * bi + hb) * 256);
#pragma unroll
                    for (int k = 0; k < NM; k++) gw_mma<NN>(d[k], lv[b][k][hb], desc);
                }
                gw_commit();
            }
            gw_wait<0>();
        }
        gb_wait<0>();
        if (!live) return;
        const float pg = pw[0], pu = pw[NM - 1];
#pragma unroll
        for (int j = 0; j < NN / 8; j++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int slot = 8 * j + 2 * t + h;
                if (slot >= nt) continue;
                const float qv = __ldcg(qx + rowof[slot]);
                const int64_t o = (int64_t)outof[slot] * R + ti * 16 + g;
                const float g0 = d[0][4 * j + h] * pg * qv, g1 = d[0][4 * j + 2 + h] * pg * qv;
                if (GU) {
                    const float u0 = d[NM - 1][4 * j + h] * pu * qv, u1 = d[NM - 1][4 * j + 2 + h] * pu * qv;
                    out[o] = g0 / (1.0f + expf(-g0)) * u0;
                    out[o + 8] = g1 / (1.0f + expf(-g1)) * u1;
                } else {
                    out[o] = g0;
                    out[o + 8] = g1;
                }
            }
    };
    switch (ntl) {
    case 1: loop(std::integral_constant<int, 8>{}); break;
    case 2: loop(std::integral_constant<int, 16>{}); break;
    case 3: loop(std::integral_constant<int, 24>{}); break;
    case 4: loop(std::integral_constant<int, 32>{}); break;
    case 5: loop(std::integral_constant<int, 40>{}); break;
    case 6: loop(std::integral_constant<int, 48>{}); break;
    case 7: loop(std::integral_constant<int, 56>{}); break;
    default: loop(std::integral_constant<int, 64>{}); break;
    }
}

/* ---- the FP4 delta: the NVFP4 residuals as a second pass over the same work list --------------------------------
 * With the delta on, an expert is its W2 base plus an NVFP4 residual (docs/design.md decision 13). The base pass
 * (k_gb_experts, PRE for gate/up) writes its products; this pass adds the residuals' over the same (tiles, chunk of
 * slots) items and finishes: SwiGLU(gate, up) into act, or the down product added into ydn. Its input rows are the
 * slots' rows as the residuals see them (unrotated, as the quantizer stores NVFP4 residuals, or by their own
 * rotation), staged like the base's (k_gb_stage, hi/lo f16 in gb_perm order). The residual is in the tiled NVFP4
 * layout (quant/blocks.h): a lane's code pair of a 16 x 32 block holds its A fragments of the block's two k-steps
 * (tc_fp4x2: a byte permute and two sign bits a register), each k-step one NVFP4 block whose E4M3 scale multiplies
 * that step's product, rows g and g + 8 their own. A piece of GB_KP columns: per warp and matrix 1 KB of code pairs
 * and 128 scale bytes. Each output element is one lane's, in a fixed order after the base pass: no atomics, so runs
 * stay bit-identical. Bytes: the residuals (2 x 9/32 per weight of the base's: 4.5 bits) once a tile of slots. */
template <int NT, int NM>
struct gb_nv_piece {
    static constexpr int cols = 8 * NT;
    static constexpr size_t xbytes = (size_t)cols * GB_LD * 2;
    static constexpr size_t wbytes = (size_t)GB_W * NM * (1024 + 128);
    static constexpr size_t bytes = xbytes + wbytes;
};

template <int NT, int GU>
__global__ void __launch_bounds__(GB_W * 32, 1)
k_gb_nv(const __half *xs, const float *qx, int64_t T, int64_t R, int64_t C, const cu_mat *__restrict__ dtable,
        const int32_t *count, const int32_t *n_items, const int32_t *items, const int32_t *list, float *out,
        const float *pre_up) {
    constexpr int NM = GU ? 2 : 1, TB = 4 * NT;
    typedef gb_nv_piece<NT, NM> P;
    extern __shared__ __align__(16) unsigned char smem[];
    if ((int)blockIdx.y >= *n_items) return;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    float *nvl = (float *)smem;
    int32_t *rowof = (int32_t *)(nvl + 256);          /* [TB]: the staged row (= the slot) of each, -1 past the chunk */
    unsigned char *pieces = (unsigned char *)(rowof + TB);
    const int32_t e = items[2 * blockIdx.y], c0 = items[2 * blockIdx.y + 1];
    const int nt = count[e] - c0 < TB ? count[e] - c0 : TB;
    tc_e4m3_fill(nvl);
    for (int i = threadIdx.x; i < TB; i += blockDim.x) rowof[i] = i < nt ? list[(int64_t)e * T + c0 + i] : -1;
    __syncthreads();
    const int64_t ti = (int64_t)blockIdx.x * GB_W + warp, NB = C / 32;
    const int live = ti < R / 16, np = (int)(C / GB_KP);
    cu_mat mt[NM];
#pragma unroll
    for (int k = 0; k < NM; k++) mt[k] = dtable[(int64_t)e * 3 + (GU ? k : 2)];
    auto issue = [&](int p) {
        unsigned char *st = pieces + (size_t)(p % GB_ST) * P::bytes;
        __half *xsm = (__half *)st;
        gb_issue_cols<P::cols, 0>(xsm, xs, rowof, C, p);
        if (live) {
            unsigned char *wsm = st + P::xbytes + (size_t)warp * NM * (1024 + 128);
#pragma unroll
            for (int k = 0; k < NM; k++) {
                const int64_t tb = ti * NB + (int64_t)p * (GB_KP / 32);
                const unsigned char *cw = mt[k].w + tb * 256, *sw = mt[k].w + (size_t)R * NB * 16 + tb * 32;
                gb_cp16(wsm + k * 1152 + 16 * lane, cw + 16 * lane, 1);
                gb_cp16(wsm + k * 1152 + 512 + 16 * lane, cw + 512 + 16 * lane, 1);
                if (lane < 8) gb_cp16(wsm + k * 1152 + 1024 + 16 * lane, sw + 16 * lane, 1);
            }
        }
    };
    float acc[NM][NT][4];
#pragma unroll
    for (int k = 0; k < NM; k++)
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int i = 0; i < 4; i++) acc[k][j][i] = 0.f;
    const int ntl = (nt + 3) >> 2;
#pragma unroll
    for (int p = 0; p < GB_ST - 1; p++) {
        if (p < np) issue(p);
        gb_commit();
    }
    for (int p = 0; p < np; p++) {
        gb_wait<GB_ST - 2>();
        __syncthreads();
        if (p + GB_ST - 1 < np) issue(p + GB_ST - 1);
        gb_commit();
        if (!live) continue;
        const unsigned char *st = pieces + (size_t)(p % GB_ST) * P::bytes;
        const __half *xsm = (const __half *)st;
        const unsigned char *wsm = st + P::xbytes + (size_t)warp * NM * (1024 + 128);
#pragma unroll
        for (int bi = 0; bi < GB_KP / 32; bi++) {
#pragma unroll
            for (int s = 0; s < 2; s++) {
                uint32_t a[NM][4];
                float f0[NM], f1[NM];
#pragma unroll
                for (int k = 0; k < NM; k++) {
                    const uint32_t w = ((const uint32_t *)(wsm + k * 1152))[(bi * 32 + lane) * 2 + s];
#pragma unroll
                    for (int r = 0; r < 4; r++) a[k][r] = tc_fp4x2((w >> (8 * r)) & 0xffu);
                    const unsigned char *sc = wsm + k * 1152 + 1024 + bi * 32 + s * 16;
                    f0[k] = nvl[sc[g]];
                    f1[k] = nvl[sc[g + 8]];
                }
#pragma unroll
                for (int j = 0; j < NT; j++) {
                    if (j >= ntl) break;
                    const uint2 bv = *(const uint2 *)(xsm + (size_t)(8 * j + g) * GB_LD + bi * 32 + 8 * t + 4 * s);
                    const uint32_t b[2] = {bv.x, bv.y};
#pragma unroll
                    for (int k = 0; k < NM; k++) {
                        float cc[4] = {0.f, 0.f, 0.f, 0.f};
                        tc_mma(cc, a[k], b);
                        float *ac = acc[k][j];
                        ac[0] = fmaf(f0[k], cc[0], ac[0]);
                        ac[1] = fmaf(f0[k], cc[1], ac[1]);
                        ac[2] = fmaf(f1[k], cc[2], ac[2]);
                        ac[3] = fmaf(f1[k], cc[3], ac[3]);
                    }
                }
            }
        }
    }
    gb_wait<0>();
    if (!live) return;
    /* lane (g, t) of n-tile j holds rows g and g + 8 of slot 4 j + t, hi (column 2t) and lo (2t + 1) */
#pragma unroll
    for (int j = 0; j < NT; j++) {
        const int slot = 4 * j + t;
        if (slot >= nt) continue;
        const int32_t s = rowof[slot];
        const float qv = __ldcg(qx + s);
        const int64_t o = (int64_t)s * R + ti * 16 + g;
        if (GU) {
            const float qg = qv * mt[0].qscale, qu = qv * mt[NM - 1].qscale;
            const float g0 = __ldcg(out + o) + (acc[0][j][0] + acc[0][j][1]) * qg,
                        g1 = __ldcg(out + o + 8) + (acc[0][j][2] + acc[0][j][3]) * qg;
            const float u0 = __ldcg(pre_up + o) + (acc[NM - 1][j][0] + acc[NM - 1][j][1]) * qu,
                        u1 = __ldcg(pre_up + o + 8) + (acc[NM - 1][j][2] + acc[NM - 1][j][3]) * qu;
            out[o] = g0 / (1.0f + expf(-g0)) * u0;
            out[o + 8] = g1 / (1.0f + expf(-g1)) * u1;
        } else {
            const float q0 = qv * mt[0].qscale;
            out[o] = __ldcg(out + o) + (acc[0][j][0] + acc[0][j][1]) * q0;
            out[o + 8] = __ldcg(out + o + 8) + (acc[0][j][2] + acc[0][j][3]) * q0;
        }
    }
}

/* ---- host side ----------------------------------------------------------------------------------------------- */

extern "C" int cu_moe_gb_ok(const cu_expert_table *tab, int64_t H, int64_t F) {
    const char *s = getenv("MOET_MOE_GB");
    if (s && s[0] == '0') return 0;
    return tab->tiled && tab->aligned16 && H % GB_KP == 0 && F % GB_KP == 0;
}

/* MOET_MOE_X1: unset or 2 (the default since stop 40) x as one f16 and chunks of up to 64 slots without the delta;
 * 1 one f16 in chunks of up to 32; 0 x as hi + lo (fp32-exact products, stop 39's kernels) */
static int gb_x1(void) {
    const char *s = getenv("MOET_MOE_X1");
    return s && (s[0] == '0' || s[0] == '1') ? s[0] - '0' : 2;
}

/* slots a chunk of the work list takes for T tokens of K picks over E experts (4 NT; 8 NT with X1). With X1 = 2 and
 * no delta, 64 from 24 an expert on average: an expert past 32 slots then decodes its weights once, not twice (the
 * residuals' pass has no 64-slot form). H100, 30b experts at 512 tokens (stop 40): 1.05x chunks of 32. */
extern "C" int cu_moe_gb_tile(int64_t T, int32_t E, int32_t K, int delta) {
    const int64_t avg = T * K / (E > 0 ? E : 1);
    if (avg >= 24 && !delta && gb_x1() == 2) return 64;
    return avg >= 24 ? 32 : avg >= 10 ? 16 : 8;
}

extern "C" size_t cu_moe_gb_stage_bytes(int64_t T, int64_t H, int64_t F, int32_t K) {
    return ((size_t)T * 2 * H + (size_t)T * K * 2 * F) * sizeof(__half) + ((size_t)T + (size_t)T * K) * sizeof(float) + 64;
}

template <int NT, int GU, int X1 = 0> static size_t gb_smem(void) {
    return 256 * sizeof(float) + 2 * (X1 ? 8 : 4) * NT * sizeof(int32_t) + (size_t)GB_ST * gb_piece<NT, GU ? 2 : 1>::bytes;
}
template <int NT, int GU> static size_t gb_nv_smem(void) {
    return 256 * sizeof(float) + 4 * NT * sizeof(int32_t) + (size_t)GB_ST * gb_nv_piece<NT, GU ? 2 : 1>::bytes;
}

template <int GU> static size_t gw_smem(void) {
    return 1536 + (size_t)GB_ST * (64 * GB_KP * 2 + GB_W * (GU ? 2 : 1) * 576);
}

static int g_gb_attr_dev = -1;

template <int NT> static int gb_attrs_nt(cu_backend *c) {
    return CU_CHECK(c, cudaFuncSetAttribute(k_gb_experts<NT, 1, 0>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)gb_smem<NT, 1>())) ||
           CU_CHECK(c, cudaFuncSetAttribute(k_gb_experts<NT, 0, 0>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)gb_smem<NT, 0>())) ||
           CU_CHECK(c, cudaFuncSetAttribute(k_gb_experts<NT, 1, 1>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)gb_smem<NT, 1>())) ||
           CU_CHECK(c, cudaFuncSetAttribute(k_gb_experts<NT, 0, 1>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)gb_smem<NT, 0>())) ||
           CU_CHECK(c, cudaFuncSetAttribute(k_gb_experts<NT, 1, 0, 1>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)gb_smem<NT, 1>())) ||
           CU_CHECK(c, cudaFuncSetAttribute(k_gb_experts<NT, 1, 1, 1>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)gb_smem<NT, 1>())) ||
           CU_CHECK(c, cudaFuncSetAttribute(k_gb_nv<NT, 1>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)gb_nv_smem<NT, 1>())) ||
           CU_CHECK(c, cudaFuncSetAttribute(k_gb_nv<NT, 0>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)gb_nv_smem<NT, 0>()));
}
/* the scaled-A forms (X1 = 2, level operand only) */
template <int NT> static int gb_attrs_xs(cu_backend *c) {
    return CU_CHECK(c, cudaFuncSetAttribute(k_gb_experts<NT, 1, 1, 0, 2>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)gb_smem<NT, 1, 2>())) ||
           CU_CHECK(c, cudaFuncSetAttribute(k_gb_experts<NT, 0, 1, 0, 2>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)gb_smem<NT, 0, 2>())) ||
           CU_CHECK(c, cudaFuncSetAttribute(k_gb_experts<NT, 1, 1, 1, 2>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)gb_smem<NT, 1, 2>()));
}
/* the X1 forms' base passes: NT n-tiles of 8 slots (a tile of 8 NT slots) */
template <int NT> static int gb_attrs_x1(cu_backend *c) {
    return CU_CHECK(c, cudaFuncSetAttribute(k_gb_experts<NT, 1, 0, 0, 1>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)gb_smem<NT, 1, 1>())) ||
           CU_CHECK(c, cudaFuncSetAttribute(k_gb_experts<NT, 0, 0, 0, 1>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)gb_smem<NT, 0, 1>())) ||
           CU_CHECK(c, cudaFuncSetAttribute(k_gb_experts<NT, 1, 1, 0, 1>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)gb_smem<NT, 1, 1>())) ||
           CU_CHECK(c, cudaFuncSetAttribute(k_gb_experts<NT, 0, 1, 0, 1>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)gb_smem<NT, 0, 1>())) ||
           CU_CHECK(c, cudaFuncSetAttribute(k_gb_experts<NT, 1, 0, 1, 1>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)gb_smem<NT, 1, 1>())) ||
           CU_CHECK(c, cudaFuncSetAttribute(k_gb_experts<NT, 1, 1, 1, 1>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)gb_smem<NT, 1, 1>()));
}

static int gb_stage(cu_backend *c, const float *src, int64_t rows, int64_t n, const cu_mat *table, int mi,
                    const int32_t *ids, int div, __half *dst, float *q, int lo_too = 1, int natural = 0,
                    cu_dpick dp = cu_dpick{NULL, 1, 0.f}) {
    const size_t sm = (size_t)n * sizeof(float);
    const int b = cu_hadamard_block(n);
    if (sm > GB_STAGE_SMEM) return cu_fail(c, cudaErrorInvalidValue, "moe grouped: row exceeds shared memory", __FILE__, __LINE__);
    switch (b) {
    case 32: k_gb_stage<1><<<(unsigned)rows, GB_STAGE_T, sm, c->stream>>>(src, n, table, mi, ids, div, dst, q, lo_too, natural, dp); break;
    case 64: k_gb_stage<2><<<(unsigned)rows, GB_STAGE_T, sm, c->stream>>>(src, n, table, mi, ids, div, dst, q, lo_too, natural, dp); break;
    case 128: k_gb_stage<4><<<(unsigned)rows, GB_STAGE_T, sm, c->stream>>>(src, n, table, mi, ids, div, dst, q, lo_too, natural, dp); break;
    default: k_gb_stage<8><<<(unsigned)rows, GB_STAGE_T, sm, c->stream>>>(src, n, table, mi, ids, div, dst, q, lo_too, natural, dp); break;
    }
    return CU_LAUNCHED(c, "k_gb_stage");
}

/* The grouped gate/up + down of a tiled layer on the work list built for tiles of `tile` slots (cu_moe_gb_tile):
 * xr the rotated x rows (k_moe_prep), act [T*K][F] and ydn [T*K][H] as moe_tc.cu's grouped kernels; stage: scratch of
 * cu_moe_gb_stage_bytes, 16-byte aligned. With the delta (dtab, cu_moe_gb_dl_ok): x the unrotated rows [T][H] the
 * residuals see, spare [T*K] floats (the router logits, consumed by then); no scratch of its own: the residuals' view
 * of x is staged into ydn (T*K*2H halves: ydn's size) and the up products wait in the down staging buffer (T*K*F
 * floats: its size), each free until the base's down pass, which runs after the gate/up residuals are in. */
extern "C" void cu_moe_gb(cu_backend *c, const cu_expert_table *tab, const cu_expert_table *dtab, const float *xr,
                          const float *x, int64_t T, int64_t H, int64_t F, int32_t K, const int32_t *topk_ids,
                          const int32_t *count, const int32_t *n_items, const int32_t *items, const int32_t *list,
                          unsigned n_chunks, int tile, void *stage, float *spare, float *act, float *ydn, cu_dpick dp) {
    if (g_gb_attr_dev != c->device) {
        const int big = GB_STAGE_SMEM;
        if (gb_attrs_nt<2>(c) || gb_attrs_nt<4>(c) || gb_attrs_nt<8>(c) || gb_attrs_x1<1>(c) || gb_attrs_x1<2>(c) ||
            gb_attrs_x1<4>(c) || gb_attrs_x1<8>(c) || gb_attrs_xs<1>(c) || gb_attrs_xs<2>(c) || gb_attrs_xs<4>(c) ||
            gb_attrs_xs<8>(c) ||
            CU_CHECK(c, cudaFuncSetAttribute(k_gw_experts<1, 0>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)gw_smem<1>())) ||
            CU_CHECK(c, cudaFuncSetAttribute(k_gw_experts<0, 0>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)gw_smem<0>())) ||
            CU_CHECK(c, cudaFuncSetAttribute(k_gw_experts<1, 1>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)gw_smem<1>())) ||
            CU_CHECK(c, cudaFuncSetAttribute(k_gw_experts<0, 1>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)gw_smem<0>())) ||
            CU_CHECK(c, cudaFuncSetAttribute(k_gb_stage<1>, cudaFuncAttributeMaxDynamicSharedMemorySize, big)) ||
            CU_CHECK(c, cudaFuncSetAttribute(k_gb_stage<2>, cudaFuncAttributeMaxDynamicSharedMemorySize, big)) ||
            CU_CHECK(c, cudaFuncSetAttribute(k_gb_stage<4>, cudaFuncAttributeMaxDynamicSharedMemorySize, big)) ||
            CU_CHECK(c, cudaFuncSetAttribute(k_gb_stage<8>, cudaFuncAttributeMaxDynamicSharedMemorySize, big)))
            return;
        g_gb_attr_dev = c->device;
    }
    __half *xg = (__half *)stage, *xd = xg + (size_t)T * 2 * H;
    float *qg = (float *)(xd + (size_t)T * K * 2 * F), *qd = qg + T;
    const char *lve = getenv("MOET_MOE_LV"), *ase = getenv("MOET_MOE_AS");
    const int lv = tab->levels_f16 && !(lve && lve[0] == '0'), x1 = gb_x1() != 0;
    /* MOET_MOE_AS=1 (opt-in, with x as one f16 and the level operand): the block scales folded into the operand */
    const int as = x1 && lv && ase && ase[0] == '1';
    /* MOET_MOE_WG=1 (opt-in, sm_90a): k_gw_experts, the numerics of AS on wgmma; every tile size (its chunks hold
     * up to 64 slots), not with the delta; =2 its deeper rotation of A registers at small N. Stop 45 (an H100): the
     * MoE op at 512 tokens 1.06x the default (AS=1 alone 1.09x), 1.7x slower at 8-32 tokens; pp512 1.03x */
    const char *wge = getenv("MOET_MOE_WG");
    const int wg = wge && (wge[0] == '1' || wge[0] == '2') && c->prop.major == 9 && x1 && lv && !dtab && tile <= 64,
              deep = wg && wge[0] == '2';
    const dim3 block(GB_W * 32), ggu((unsigned)((F / 16 + GB_W - 1) / GB_W), n_chunks),
            gdn((unsigned)((H / 16 + GB_W - 1) / GB_W), n_chunks);
    if (wg) {
        if (gb_stage(c, xr, T, H, NULL, 0, NULL, 1, xg, qg, 0, 1)) return;
        auto *gu = deep ? k_gw_experts<1, 1> : k_gw_experts<1, 0>, *dn = deep ? k_gw_experts<0, 1> : k_gw_experts<0, 0>;
        gu<<<ggu, block, gw_smem<1>(), c->stream>>>(xg, qg, T, F, H, K, tab->table, tab->type, count, n_items, items,
                                                    list, act);
        if (CU_LAUNCHED(c, "k_gw_experts gate/up")) return;
        if (gb_stage(c, act, T * K, F, tab->table, 2, topk_ids, 1, xd, qd, 0, 1)) return;
        dn<<<gdn, block, gw_smem<0>(), c->stream>>>(xd, qd, T, H, F, K, tab->table, tab->type, count, n_items, items,
                                                    list, ydn);
        CU_LAUNCHED(c, "k_gw_experts down");
        return;
    }
    if (gb_stage(c, xr, T, H, NULL, 0, NULL, 1, xg, qg, !x1)) return;
    const cu_mat *dt = dtab ? dtab->table : NULL;
    __half *xgr = (__half *)ydn; /* delta: the residuals' view of x, then the base's down products */
    float *aux = (float *)xd;    /* delta: the up products, then the base's down staging */
#define GB_GO(NT, NB, X, LV)                                                                                        \
    do {                                                                                                            \
        if (dt) {                                                                                                   \
            k_gb_experts<NB, 1, LV, 1, X><<<ggu, block, gb_smem<NB, 1, X>(), c->stream>>>(                          \
                xg, qg, T, F, H, K, tab->table, tab->type, count, n_items, items, list, act, aux);                  \
            if (CU_LAUNCHED(c, "k_gb_experts gate/up (pre)")) return;                                               \
            if (gb_stage(c, x, T * K, H, dt, 0, topk_ids, K, xgr, spare, 1, 0, dp)) return;                         \
            k_gb_nv<NT, 1><<<ggu, block, gb_nv_smem<NT, 1>(), c->stream>>>(xgr, spare, T, F, H, dt, count, n_items, \
                                                                           items, list, act, aux);                  \
            if (CU_LAUNCHED(c, "k_gb_nv gate/up")) return;                                                          \
        } else {                                                                                                    \
            k_gb_experts<NB, 1, LV, 0, X><<<ggu, block, gb_smem<NB, 1, X>(), c->stream>>>(                          \
                xg, qg, T, F, H, K, tab->table, tab->type, count, n_items, items, list, act, NULL);                 \
            if (CU_LAUNCHED(c, "k_gb_experts gate/up")) return;                                                     \
        }                                                                                                           \
        if (gb_stage(c, act, T * K, F, tab->table, 2, topk_ids, 1, xd, qd, X == 0)) return;                         \
        k_gb_experts<NB, 0, LV, 0, X><<<gdn, block, gb_smem<NB, 0, X>(), c->stream>>>(xd, qd, T, H, F, K, tab->table, \
                                                                             tab->type, count, n_items, items,      \
                                                                             list, ydn, NULL);                      \
        if (CU_LAUNCHED(c, "k_gb_experts down")) return;                                                            \
        if (dt) {                                                                                                   \
            if (gb_stage(c, act, T * K, F, dt, 2, topk_ids, 1, xd, qd, 1, 0, dp)) return;                           \
            k_gb_nv<NT, 0><<<gdn, block, gb_nv_smem<NT, 0>(), c->stream>>>(xd, qd, T, H, F, dt, count, n_items,     \
                                                                           items, list, ydn, NULL);                 \
            if (CU_LAUNCHED(c, "k_gb_nv down")) return;                                                             \
        }                                                                                                           \
    } while (0)
    /* the level operand where every matrix's magnitudes are f16 values (MOET_MOE_LV=0: the sign planes, for A/B) */
    /* the X1 base passes take a tile of slots in half the n-tiles (8 slots an n-tile); the residuals' pass keeps hi
     * and lo (4 slots an n-tile) over the same work list */
    switch (tile) {
    case 64: /* X1 = 2 without the delta only (cu_moe_gb_tile): the residuals' pass below is never reached */
        if (!x1 || dt) {
            cu_fail(c, cudaErrorInvalidValue, "moe grouped: a 64-slot tile without X1 or with the delta", __FILE__, __LINE__);
            return;
        }
        if (as) GB_GO(8, 8, 2, 1); else if (lv) GB_GO(8, 8, 1, 1); else GB_GO(8, 8, 1, 0);
        break;
    case 8:
        if (as) GB_GO(2, 1, 2, 1);
        else if (x1) { if (lv) GB_GO(2, 1, 1, 1); else GB_GO(2, 1, 1, 0); }
        else if (lv) GB_GO(2, 2, 0, 1); else GB_GO(2, 2, 0, 0);
        break;
    case 16:
        if (as) GB_GO(4, 2, 2, 1);
        else if (x1) { if (lv) GB_GO(4, 2, 1, 1); else GB_GO(4, 2, 1, 0); }
        else if (lv) GB_GO(4, 4, 0, 1); else GB_GO(4, 4, 0, 0);
        break;
    default:
        if (as) GB_GO(8, 4, 2, 1);
        else if (x1) { if (lv) GB_GO(8, 4, 1, 1); else GB_GO(8, 4, 1, 0); }
        else if (lv) GB_GO(8, 8, 0, 1); else GB_GO(8, 8, 0, 0);
        break;
    }
#undef GB_GO
}
