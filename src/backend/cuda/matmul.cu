/*
 * matmul.cu — y = x · Wᵀ for every weight type, and the embedding lookup.
 *
 * Decode is a matrix-vector product bound by the bytes of W: a warp per row, each lane on its own 32-element groups
 * (one quantization block), weights decoded in registers, activations from shared memory in the padded layout
 * (common.cuh), so W is read once per chunk of up to 8 tokens and x never conflicts in shared memory. Rotated W2
 * matrices (stored as W·R) multiply x·R, rotated in shared memory by the CTA before use.
 * BF16/F16 matrices that are not rotated (attention, lm_head, routers: most of a decode step's bytes) take
 * k_mv16 instead: a warp per row reading 16-byte chunks, consecutive lanes on consecutive chunks, so each load
 * instruction of a warp covers 512 contiguous bytes and MV16_UNROLL of them are in flight before the math; x sits
 * unpadded in shared memory and is read as float4 (a lane's 8 elements are contiguous). One chunk of tokens takes
 * its persistent form k_mv16p (one wave, rows in registers); one token takes k_mv16s (rows in a shared-memory ring
 * of bulk copies, so it can start beside the decode MoE's down kernel and stream the next q/k/v during it). All
 * three give bit-identical y.
 * Bytes per call: rows × row_bytes (+ n × cols × 4 of x); FLOPs: 2 × n × rows × cols.
 */
#include <stdlib.h>

#include "backend/cuda/common.cuh"
#include "backend/cuda/cuda_int.h"
#include "quant/tile.h"

#define MM_WARPS 8
#define MM_ROWS_PER_WARP 4
#define MM_MAX_TOK 8
#define MM_SMEM_MAX (96 * 1024)

/* Loads n_tok rows of x (cols each) into padded shared memory and rotates them if the weight is stored rotated. */
__device__ __forceinline__ void load_x(float *xs, int stride, const float *x, int n_tok, int64_t cols, int rotated,
                                       uint32_t seed) {
    for (int t = 0; t < n_tok; t++)
        for (int j = threadIdx.x; j < (int)cols; j += blockDim.x) xs[t * stride + CU_PAD(j)] = x[(int64_t)t * cols + j];
    __syncthreads();
    if (rotated) {
        cu_rotate_smem(xs, n_tok, stride, cols, seed);
        __syncthreads();
    }
}

__global__ void __launch_bounds__(MM_WARPS * 32)
k_mul_mat(const uint8_t *__restrict__ w, int32_t type, int64_t rows, int64_t cols, size_t row_bytes, float qscale,
          float qbeta, int rotated, uint32_t seed, const float *__restrict__ x, int64_t n, int ch, int rpw,
          const float *__restrict__ bias, float *__restrict__ y, int accum) {
    CU_TRACE(CU_TK_MUL_MAT << 8);
    extern __shared__ float xs[];
    const int stride = (int)CU_PAD(cols);
    const int64_t t0 = (int64_t)blockIdx.y * ch;
    const int nt = (int)(n - t0 < ch ? n - t0 : ch);
    load_x(xs, stride, x + t0 * cols, nt, cols, rotated, seed);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t G = cols / 32;
    for (int rr = 0; rr < rpw; rr++) {
        const int64_t r = ((int64_t)blockIdx.x * MM_WARPS + warp) * rpw + rr;
        if (r >= rows) break;
        const uint8_t *row = w + r * row_bytes;
        float acc[MM_MAX_TOK];
#pragma unroll
        for (int t = 0; t < MM_MAX_TOK; t++) acc[t] = 0.f;
        for (int64_t g = lane; g < G; g += 32) {
            float v[32];
            cu_decode32(type, row, g, qscale, qbeta, v);
#pragma unroll
            for (int t = 0; t < MM_MAX_TOK; t++) {
                if (t >= nt) break;
                const float *xg = xs + t * stride + 33 * g;
                float a = 0.f;
#pragma unroll
                for (int j = 0; j < 32; j++) a = fmaf(v[j], xg[j], a);
                acc[t] += a;
            }
        }
#pragma unroll
        for (int t = 0; t < MM_MAX_TOK; t++) {
            if (t >= nt) break;
            float s = cu_warp_sum(acc[t]);
            if (lane == 0) cu_mm_store(y + (t0 + t) * rows + r, s, bias, r, accum);
        }
    }
}

/* 16-bit weights (BF16 / F16: attention, lm_head, router, dense MLPs: most of a decode step's bytes). A warp per
 * row; lane l reads 16-byte chunks l, l + 32, ... of the row, so each warp-wide load is one contiguous 512-byte span,
 * MV16_UNROLL (8) chunks in flight per lane before any math; x in shared memory unpadded (two float4 reads per chunk;
 * in k_mv16s permuted by mv_x_swizzle unless MOET_MVS_SWZ=0). */
#define MV16_UNROLL 8

/* the row formats of the single-token GEMVs (k_mv16 takes the first two as its F16 parameter) */
#define MV_BF16 0
#define MV_F16 1
#define MV_Q8T 2

/* x swizzled in shared memory (stop 38). A lane reads its unit's floats of x as 16-byte loads, and neighbouring lanes
 * read at a fixed step: 64 bytes for q8t (16 quants a unit), 32 for BF16/F16 (8 weights). The 8 lanes of a
 * quarter-warp (one shared-memory wavefront of a 128-bit load) then fall on two (q8t) or four (16-bit) groups of four
 * banks: a 4-way or 2-way conflict. For q8t that was 16 wavefronts a load instead of 4, 64 a unit, ~0.11 wavefronts
 * a weight byte: more than the pipe's one a clock at the copy bandwidth (~11.5 bytes a clock an SM on an H100), and
 * the q8_0 GEMV ran at 46-54% of copy where BF16 reached 92%; with the swizzle 71-83% (stop 38, an H100). So the
 * float4 of unit u (u counted within its token's row) sit permuted: q8t chunk k at slot (k + ((u >> 1) & 3)) & 3,
 * 16-bit chunk k at k ^ ((u >> 2) & 1). Either way a quarter-warp's eight loads cover all 32 banks. Only where the
 * chunks sit changes, not which products are added in which order: y stays bit-identical. Permuted in place after
 * the staging (and pre-norm: h is written unpermuted), a thread a unit; every thread calls it; it synchronises.
 * The 16-bit rows are permuted only in k_mv16s (one token, beside the MoE's down, whose shared-memory traffic it
 * shares; MOET_MVS_SWZ=0 turns it off: tg64 +0.9-1.0% at both synthetic shapes, two calls, stop 39, an H100);
 * k_mv16 and k_mv16p keep x as staged (their 2-way conflicts cost no measurable time alone, 92-101% of copy, and the
 * permutation's offsets cost their multi-token forms spills). */
__device__ __forceinline__ int mv_swz(int fmt, int64_t u) { return fmt == MV_Q8T ? (int)(u >> 1) & 3 : (int)(u >> 2) & 1; }
/* the float4 slot of chunk k of unit u */
template <int FMT> __device__ __forceinline__ int mv_slot(int k, int64_t u) {
    const int r = mv_swz(FMT, u);
    return FMT == MV_Q8T ? (k + r) & 3 : k ^ r;
}
template <int FMT>
__device__ __forceinline__ void mv_x_swizzle(float *xs, int nt, int64_t cols) {
    constexpr int C4 = FMT == MV_Q8T ? 4 : 2; /* float4 a unit */
    float4 *x4 = (float4 *)xs;
    const int64_t ur = cols / (4 * C4); /* units a row */
    for (int t = 0; t < nt; t++)
        for (int64_t u = threadIdx.x; u < ur; u += blockDim.x) {
            float4 *p = x4 + (t * ur + u) * C4, a[C4];
#pragma unroll
            for (int k = 0; k < C4; k++) a[k] = p[k];
#pragma unroll
            for (int k = 0; k < C4; k++) p[mv_slot<FMT>(k, u)] = a[k];
        }
    __syncthreads();
}

/* One token's x staged straight into mv_x_swizzle's slots (no second pass, no barrier more), where the caller does
 * not pre-norm it (o_proj, lm_head): float4 j of the row is chunk j % C4 of unit j / C4. No synchronisation. */
template <int FMT>
__device__ __forceinline__ void mv_stage_perm(float *xs, const float *x, int64_t cols) {
    if ((cols & 3) || ((uintptr_t)x & 15) || ((uintptr_t)xs & 15)) { /* never in k_mv16s (mvs_go checks x) */
        cu_stage_f32(xs, x, cols);
        __syncthreads();
        mv_x_swizzle<FMT>(xs, 1, cols);
        return;
    }
    constexpr int C4 = FMT == MV_Q8T ? 4 : 2; /* float4 a unit */
    const float4 *s4 = (const float4 *)x;
    float4 *d4 = (float4 *)xs;
    const int64_t n4 = cols >> 2, nt = blockDim.x;
    for (int64_t j = threadIdx.x; j < n4; j += 4 * nt) {
        float4 v[4];
#pragma unroll
        for (int u = 0; u < 4; u++)
            if (j + u * nt < n4) v[u] = __ldcg(s4 + j + u * nt);
#pragma unroll
        for (int u = 0; u < 4; u++) {
            const int64_t i = j + u * nt; /* unit i / C4, chunk i % C4 -> its slot */
            if (i < n4) d4[(i & ~(int64_t)(C4 - 1)) + mv_slot<FMT>((int)(i & (C4 - 1)), i / C4)] = v[u];
        }
    }
}

template <int F16>
__device__ __forceinline__ void mv16_unpack(uint4 q, float v[8]) {
    const uint32_t w[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
    for (int k = 0; k < 4; k++) {
        if (F16) {
            v[2 * k] = cu_f16((uint16_t)(w[k] & 0xffff));
            v[2 * k + 1] = cu_f16((uint16_t)(w[k] >> 16));
        } else {
            v[2 * k] = __uint_as_float(w[k] << 16);
            v[2 * k + 1] = __uint_as_float(w[k] & 0xffff0000u);
        }
    }
}

/* accv[t] += the lane's MV16_UNROLL chunks u0, u0 + 32, ... (< U) of a row . x row t, for the nt staged tokens. */
template <int F16, int MT, int SW = 0>
__device__ __forceinline__ void mv16_group(const uint4 q[MV16_UNROLL], int64_t u0, int64_t U, const float4 *xs4,
                                           int64_t cols, int nt, float accv[MT]) {
    const int r = SW ? mv_swz(MV_BF16, u0) : 0; /* SW: x permuted by mv_x_swizzle (u0 + 32 i has the same slots) */
#pragma unroll
    for (int i = 0; i < MV16_UNROLL; i++) {
        const int64_t u = u0 + 32 * i;
        if (u >= U) break;
        float v[8];
        mv16_unpack<F16>(q[i], v);
#pragma unroll
        for (int t = 0; t < MT; t++) {
            if (t >= nt) break;
            const float4 a = xs4[(t * cols + 8 * u) / 4 + r], b = xs4[(t * cols + 8 * u) / 4 + (r ^ 1)];
            float s = accv[t];
            s = fmaf(v[0], a.x, s); s = fmaf(v[1], a.y, s); s = fmaf(v[2], a.z, s); s = fmaf(v[3], a.w, s);
            s = fmaf(v[4], b.x, s); s = fmaf(v[5], b.y, s); s = fmaf(v[6], b.z, s); s = fmaf(v[7], b.w, s);
            accv[t] = s;
        }
    }
}

/* Up to MV16_MATS 16-bit matrices of the same width in one launch (q, k, v: one x, three outputs): CTA ranges
 * [cta0[i], cta0[i+1]) of the grid take matrix i, MM_WARPS rows a CTA. */
#define MV16_MATS 4
typedef struct {
    const uint8_t *w[MV16_MATS];
    float *y[MV16_MATS];
    int64_t rows[MV16_MATS];
    size_t row_bytes[MV16_MATS];
    const float *b[MV16_MATS]; /* biases added in the store (device memory; NULL: none) */
    int32_t cta0[MV16_MATS + 1];
    int64_t r0[MV16_MATS + 1]; /* row prefix sums: matrix i holds rows [r0[i], r0[i+1]) of the set */
    int32_t n;
} cu_mv16_set;

/* BF16/F16 GEMV of the matrices in set over n tokens of x (chunks of ch a CTA along y).
 * NORM: x is a raw residual; the CTA stages it, takes each token's sum of squares in double (as the reference
 * rms_norm) and multiplies the rows in shared memory by inv_rms · norm_w, so the pre-norm costs no launch; CTA x = 0
 * also writes the normed rows to h. The first MV16_UNROLL chunks of the warp's row are requested before x is staged:
 * they do not depend on it, so the weight fetch overlaps the staging. acc: y += the product. */
template <int F16, int NORM, int MT>
__global__ void __launch_bounds__(MM_WARPS * 32, MT == 1 ? 4 : 3)
k_mv16(cu_mv16_set set, int64_t cols, const float *x, int64_t n, int ch, const float *__restrict__ norm_w,
       float eps, float *__restrict__ h, int acc) {
    CU_TRACE(CU_TK_MV16 << 8 | F16 << 2 | NORM << 1 | (MT > 1));
    extern __shared__ __align__(16) float xs[];
    __shared__ double red[MM_WARPS][MM_MAX_TOK];
    __shared__ float inv[MM_MAX_TOK];
    const int64_t t0 = (int64_t)blockIdx.y * ch;
    const int nt = (int)(n - t0 < ch ? n - t0 : ch);
    const float4 *xs4 = (const float4 *)xs;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int mi = 0;
    while (mi + 1 < set.n && (int32_t)blockIdx.x >= set.cta0[mi + 1]) mi++;
    const int64_t rows = set.rows[mi];
    const int64_t r = (int64_t)(blockIdx.x - set.cta0[mi]) * MM_WARPS + warp;
    const int64_t U = cols / 8;
    const uint4 *row = (const uint4 *)(set.w[mi] + (r < rows ? r : 0) * set.row_bytes[mi]);
    uint4 q[MV16_UNROLL];
#pragma unroll
    for (int i = 0; i < MV16_UNROLL; i++)
        if (r < rows && lane + 32 * i < U) q[i] = __ldg(row + lane + 32 * i);
    cu_pdl_wait();
    CU_TRACE_WAITED();
    cu_stage_f32(xs, x + t0 * cols, nt * cols);
    __syncthreads();
    if (NORM) cu_prenorm_smem(xs, nt, (int)cols, norm_w, eps, &red[0][0], MM_MAX_TOK, inv,
                              blockIdx.x == 0 ? h + t0 * cols : NULL);
    if (r >= rows) return;
    float accv[MT];
#pragma unroll
    for (int t = 0; t < MT; t++) accv[t] = 0.f;
    for (int64_t u0 = lane; u0 < U; u0 += 32 * MV16_UNROLL) {
        if (u0 != lane) {
#pragma unroll
            for (int i = 0; i < MV16_UNROLL; i++)
                if (u0 + 32 * i < U) q[i] = __ldg(row + u0 + 32 * i);
        }
        mv16_group<F16, MT>(q, u0, U, xs4, cols, nt, accv);
    }
    cu_pdl_trigger(); /* late: the next kernel's CTAs fill the SMs this one's tail leaves idle */
    float *y = set.y[mi];
#pragma unroll
    for (int t = 0; t < MT; t++) {
        if (t >= nt) break;
        const float s = cu_warp_sum(accv[t]);
        if (lane == 0) cu_mm_store(y + (t0 + t) * rows + r, s, set.b[mi], r, acc);
    }
}

/* The persistent form of k_mv16 for one chunk of tokens (decode, batched decode: n <= ch). k_mv16 gives every
 * CTA 8 rows: at the 30b QKV shape 640 CTAs, 1.2 waves, and each CTA's chain (stage x, pre-norm, weights, reduce)
 * runs twice over with the SMs half idle in the second wave; under Nsight Compute the staging and the pre-norm were
 * 45% of its stall samples and the weight wait 17%. Here one wave of CTAs stages x (and the pre-norm) once and
 * every warp walks rows gw, gw + stride, ... of the whole set in groups of UN 16-byte units a lane, the next
 * group's loads issued before the current group's math (two groups in flight, the first two before x is staged).
 * For BF16/F16 a lane takes the same chunks in the same order as in k_mv16 and the warp sum is the same, so y is
 * bit-identical to k_mv16's.
 * FMT MV_Q8T: Q8_0 matrices in the q8t layout (quant/blocks.h; made at first use by cu_weight_q8t): a unit is 16
 * quants (one 16-byte load: consecutive lanes read consecutive words of a group's quants) and its block's f16 scale
 * (a 2-byte load); sum_j q_j x_j over the unit in fp32, then times d. 8.5 bits a weight instead of 16: the dense
 * half of a W2 model's decode bytes (attention, lm_head) nearly halved. */
#define MVQ8_UNROLL 4 /* q8t units in flight a lane and group: a 2048-wide row is one group of the warp */

struct mv_q8u { uint4 q; uint32_t d; }; /* a q8t unit: 16 quants and their block's f16 scale */

/* unit: what a lane holds of one 16-byte unit (BF16/F16: the 16 bytes themselves, so k_mv16's code runs unchanged) */
template <int FMT> struct mv_fmt {
    typedef uint4 unit;
    static constexpr int UN = MV16_UNROLL;
    static __device__ __forceinline__ int64_t units(int64_t cols) { return cols / 8; }
};
template <> struct mv_fmt<MV_Q8T> {
    typedef mv_q8u unit;
    static constexpr int UN = MVQ8_UNROLL;
    static __device__ __forceinline__ int64_t units(int64_t cols) { return cols / 16; }
};

__device__ __forceinline__ int64_t mv16p_row(const cu_mv16_set &set, int64_t R, int &mi, int64_t &r) {
    mi = 0;
    while (mi + 1 < set.n && R >= set.r0[mi + 1]) mi++;
    r = R - set.r0[mi];
    return r;
}

template <int FMT>
__device__ __forceinline__ void mvp_load(const uint8_t *row, int64_t u0, int64_t U,
                                         typename mv_fmt<FMT>::unit q[mv_fmt<FMT>::UN]) {
#pragma unroll
    for (int i = 0; i < mv_fmt<FMT>::UN; i++) {
        const int64_t u = u0 + 32 * i;
        if constexpr (FMT == MV_Q8T) {
            if (u < U) {
                q[i].q = __ldg((const uint4 *)(row + moet_q8t_qs_off(u)));
                q[i].d = __ldg((const unsigned short *)(row + moet_q8t_d_off(u)));
            }
        } else {
            if (u < U) q[i] = __ldg((const uint4 *)row + u);
        }
    }
}

/* accv[t] += the lane's units u0, u0 + 32, ... (< U) of a row . x row t, for the nt staged tokens (x permuted by
 * mv_x_swizzle). */
template <int FMT, int MT>
__device__ __forceinline__ void mvp_group(const typename mv_fmt<FMT>::unit q[mv_fmt<FMT>::UN], int64_t u0, int64_t U,
                                          const float4 *xs4, int64_t cols, int nt, float accv[MT]) {
    if constexpr (FMT != MV_Q8T) {
        mv16_group<FMT == MV_F16, MT>(q, u0, U, xs4, cols, nt, accv);
    } else {
        const int rot = mv_swz(MV_Q8T, u0); /* u0 + 32 i has the same: mv_x_swizzle's slots */
#pragma unroll
        for (int i = 0; i < mv_fmt<FMT>::UN; i++) {
            const int64_t u = u0 + 32 * i;
            if (u >= U) break;
            const float d = cu_f16((uint16_t)q[i].d);
            /* each byte's sign flipped once: moet_i8_f32 is then a permute and an add, no conversion (quant/tile.h) */
            const uint32_t w[4] = {moet_i8x4_flip(q[i].q.x), moet_i8x4_flip(q[i].q.y), moet_i8x4_flip(q[i].q.z),
                                   moet_i8x4_flip(q[i].q.w)};
#pragma unroll
            for (int t = 0; t < MT; t++) {
                if (t >= nt) break;
                const float4 *xp = xs4 + (t * cols + 16 * u) / 4;
                float s = 0.f;
#pragma unroll
                for (int k = 0; k < 4; k++) {
                    const float4 a = xp[(k + rot) & 3];
                    s = fmaf(moet_i8_f32(w[k], 0), a.x, s); s = fmaf(moet_i8_f32(w[k], 1), a.y, s);
                    s = fmaf(moet_i8_f32(w[k], 2), a.z, s); s = fmaf(moet_i8_f32(w[k], 3), a.w, s);
                }
                accv[t] = fmaf(d, s, accv[t]);
            }
        }
    }
}

template <int FMT, int NORM, int MT>
__global__ void __launch_bounds__(MM_WARPS * 32, 2)
k_mv16p(cu_mv16_set set, int64_t cols, const float *x, int64_t n, const float *__restrict__ norm_w,
        float eps, float *__restrict__ h, int acc) {
    CU_TRACE(CU_TK_MV16P << 8 | FMT << 2 | NORM << 1 | (MT > 1));
    constexpr int UN = mv_fmt<FMT>::UN;
    extern __shared__ __align__(16) float xs[];
    __shared__ double red[MM_WARPS][MM_MAX_TOK];
    __shared__ float inv[MM_MAX_TOK];
    const int nt = (int)n;
    const float4 *xs4 = (const float4 *)xs;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t total = set.r0[set.n], stride = (int64_t)gridDim.x * MM_WARPS;
    const int64_t U = mv_fmt<FMT>::units(cols), G = (U + 32 * UN - 1) / (32 * UN); /* groups a row */
    /* the current item (row R, group g) and the next (Rn, gn), both requested before x is staged */
    int64_t R = (int64_t)blockIdx.x * MM_WARPS + warp, Rn = R;
    int64_t g = 0, gn = 0;
    int mi = 0, min_ = 0;
    int64_t r = 0, rn = 0;
    typename mv_fmt<FMT>::unit q[UN], qn[UN];
    const uint8_t *row = NULL, *rown;
    if (R < total) { mv16p_row(set, R, mi, r); row = set.w[mi] + r * set.row_bytes[mi]; }
    rown = row;
    if (row) mvp_load<FMT>(row, lane, U, q);
    if (++gn == G) {
        gn = 0; Rn += stride; rown = NULL;
        if (Rn < total) { mv16p_row(set, Rn, min_, rn); rown = set.w[min_] + rn * set.row_bytes[min_]; }
    } else { min_ = mi; rn = r; }
    if (rown) mvp_load<FMT>(rown, lane + 32 * UN * gn, U, qn);
    cu_pdl_wait();
    CU_TRACE_WAITED();
    cu_stage_f32(xs, x, nt * cols);
    __syncthreads();
    if (NORM) cu_prenorm_smem(xs, nt, (int)cols, norm_w, eps, &red[0][0], MM_MAX_TOK, inv, blockIdx.x == 0 ? h : NULL);
    if constexpr (FMT == MV_Q8T) mv_x_swizzle<FMT>(xs, nt, cols);
    float accv[MT];
#pragma unroll
    for (int t = 0; t < MT; t++) accv[t] = 0.f;
    while (row) {
        const int64_t u0 = lane + 32 * UN * g;
        mvp_group<FMT, MT>(q, u0, U, xs4, cols, nt, accv);
        if (g == G - 1) { /* the row is done: reduce and store */
            const int64_t rows = set.rows[mi];
            float *y = set.y[mi];
#pragma unroll
            for (int t = 0; t < MT; t++) {
                if (t >= nt) break;
                const float s = cu_warp_sum(accv[t]);
                accv[t] = 0.f;
                if (lane == 0) cu_mm_store(y + (int64_t)t * rows + r, s, set.b[mi], r, acc);
            }
        }
        /* the next item becomes current; the one after it is requested */
        row = rown; R = Rn; g = gn; mi = min_; r = rn;
#pragma unroll
        for (int i = 0; i < UN; i++) q[i] = qn[i];
        if (!row) break;
        if (++gn == G) {
            gn = 0; Rn += stride; rown = NULL;
            if (Rn < total) { mv16p_row(set, Rn, min_, rn); rown = set.w[min_] + rn * set.row_bytes[min_]; }
        }
        if (rown) mvp_load<FMT>(rown, lane + 32 * UN * gn, U, qn);
    }
    cu_pdl_trigger();
}

/* The streaming form for one token (decode, batch 1): one CTA an SM, each of its warps walking rows
 * gw, gw + W, ... of the set (W: warps in the grid) as k_mv16p's warps do, but a row goes into shared memory by one
 * bulk copy (the TMA's 1-D form, cp.async.bulk) instead of into registers, into a ring of nsw slots a warp, each with
 * its mbarrier. Why: k_mv16p holds its in-flight rows in registers (two CTAs of 128 registers a thread fill an SM's
 * register file), so it can start only when the kernel before it leaves the SM, and at the 30b shape the q/k/v
 * product then ran at ~1.4 TB/s (tools/trace_report.py: 19 us of a ~61 us layer). Here the CTA needs ~64 registers
 * a thread and nsw rows of shared memory a warp: it fits beside a decode down CTA (moe_tc.cu), which lets it
 * launch at its start (`early`), so the first nsw rows of every warp (4 of its 5 q/k/v rows at the 30b shape, with
 * the default 128 KB ring) are requested while the MoE of the previous layer runs; after the wait only x is staged (and pre-normed) and the rows
 * are multiplied from shared memory, each slot refilled with the warp's next row as soon as it is read.
 * Arithmetic: a lane takes the same 16-byte units in the same order as in k_mv16p, and the warp sum is the same,
 * so y is bit-identical to k_mv16p's (and k_mv16's). Bytes: rows x row_bytes (+ x); FLOPs: 2 x rows x cols.
 * FMT as k_mv16p's: BF16, F16, or Q8_0 in the q8t layout (since stop 37: a q8t row is a whole number of 272-byte
 * groups, so it is one bulk copy as well; a unit is 16 quants and its block's scale, read from the ring where
 * k_mv16p reads them from global memory, in the same order: bit-identical to k_mv16p<MV_Q8T> too). */
#define MVS_WARPS 8

/* The lane's q8t units u0, u0 + 32, ... (< U) of a row staged in shared memory, as mvp_load reads them from global. */
template <int FMT>
__device__ __forceinline__ void mvs_load(const unsigned char *row, int64_t u0, int64_t U,
                                         typename mv_fmt<FMT>::unit q[mv_fmt<FMT>::UN]) {
    static_assert(FMT == MV_Q8T, "mvs_load: the 16-bit rows are read in k_mv16s itself");
#pragma unroll
    for (int i = 0; i < mv_fmt<FMT>::UN; i++) {
        const int64_t u = u0 + 32 * i;
        if (u < U) {
            q[i].q = *(const uint4 *)(row + moet_q8t_qs_off(u));
            q[i].d = *(const unsigned short *)(row + moet_q8t_d_off(u));
        }
    }
}

template <int FMT, int NORM, int SW>
__global__ void __launch_bounds__(MVS_WARPS * 32, 4)
k_mv16s(cu_mv16_set set, int64_t cols, const float *x, const float *__restrict__ norm_w, float eps,
        float *__restrict__ h, int acc, int nsw, int early) {
    CU_TRACE(CU_TK_MV16S << 8 | FMT << 2 | NORM << 1 | SW);
    static_assert(FMT != MV_Q8T || SW, "q8t x is always permuted");
    extern __shared__ __align__(16) unsigned char mvs_sm[];
    __shared__ double red[MVS_WARPS][MM_MAX_TOK];
    __shared__ float inv[MM_MAX_TOK];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const uint32_t rb = (uint32_t)set.row_bytes[0];
    const int64_t total = set.r0[set.n], W = (int64_t)gridDim.x * MVS_WARPS, gw = (int64_t)blockIdx.x * MVS_WARPS + warp;
    const int64_t nrw = gw < total ? (total - gw + W - 1) / W : 0; /* this warp's rows */
    float *xs = (float *)mvs_sm;
    uint64_t *bar = (uint64_t *)(mvs_sm + cols * sizeof(float)) + (size_t)warp * nsw;
    unsigned char *ring = mvs_sm + cols * sizeof(float) + (size_t)MVS_WARPS * nsw * sizeof(uint64_t) + (size_t)warp * nsw * rb;
    if (early) cu_pdl_trigger();
    if (lane == 0) {
        for (int s = 0; s < nsw; s++) cu_mbar_init(bar + s, 1);
        cu_mbar_init_fence();
        for (int64_t k = 0; k < nrw && k < nsw; k++) {
            int mi;
            int64_t r;
            mv16p_row(set, gw + k * W, mi, r);
            cu_mbar_expect(bar + k, rb);
            cu_bulk_load(ring + k * rb, set.w[mi] + r * rb, rb, bar + k);
        }
    }
    cu_pdl_wait();
    CU_TRACE_WAITED();
    if (NORM || !SW) {
        cu_stage_f32(xs, x, cols);
        __syncthreads();
        if (NORM) cu_prenorm_smem(xs, 1, (int)cols, norm_w, eps, &red[0][0], MM_MAX_TOK, inv, blockIdx.x == 0 ? h : NULL);
        if (SW) mv_x_swizzle<FMT>(xs, 1, cols);
    } else {
        mv_stage_perm<FMT>(xs, x, cols);
        __syncthreads();
    }
    const float4 *xs4 = (const float4 *)xs;
    const int64_t U = mv_fmt<FMT>::units(cols);
    constexpr int UN = mv_fmt<FMT>::UN;
    for (int64_t k = 0; k < nrw; k++) {
        const int s = (int)(k % nsw);
        cu_mbar_wait(bar + s, (uint32_t)((k / nsw) & 1));
        float accv[1] = {0.f};
        if constexpr (FMT == MV_Q8T) {
            const unsigned char *row = ring + (size_t)s * rb;
            for (int64_t u0 = lane; u0 < U; u0 += 32 * UN) {
                typename mv_fmt<FMT>::unit q[UN];
                mvs_load<FMT>(row, u0, U, q);
                mvp_group<FMT, 1>(q, u0, U, xs4, cols, 1, accv);
            }
        } else { /* the 16-bit loop as it was before q8t came (the same registers, 64) */
            const uint4 *row = (const uint4 *)(ring + (size_t)s * rb);
            for (int64_t u0 = lane; u0 < U; u0 += 32 * UN) {
                uint4 q[UN];
#pragma unroll
                for (int i = 0; i < UN; i++)
                    if (u0 + 32 * i < U) q[i] = row[u0 + 32 * i];
                mv16_group<FMT == MV_F16, 1, SW>(q, u0, U, xs4, cols, 1, accv);
            }
        }
        __syncwarp(); /* every lane has read the slot: it may be refilled */
        int mi;
        int64_t r;
        if (lane == 0 && k + nsw < nrw) {
            mv16p_row(set, gw + (k + nsw) * W, mi, r);
            cu_fence_proxy_async();
            cu_mbar_expect(bar + s, rb);
            cu_bulk_load(ring + (size_t)s * rb, set.w[mi] + r * rb, rb, bar + s);
        }
        mv16p_row(set, gw + k * W, mi, r);
        const float sum = cu_warp_sum(accv[0]);
        if (lane == 0) cu_mm_store(set.y[mi] + r, sum, set.b[mi], r, acc);
    }
    if (!early) cu_pdl_trigger();
}

/* MOET_MVS=0: k_mv16p for one token too (the A/B of the streaming kernel); MOET_MVS_KB: its ring a CTA (default
 * 128 KB: whole rows, as many a warp as fit; x and the barriers besides). Measured on an H100 (stop 31, tg64): 30b
 * (4 KB rows) 4 slots a warp beat 5 (375.9 vs 364.9 t/s), 235b (8 KB rows) 2 beat 1 (87.8 vs 84.6);
 * MOET_MVS_EARLY=0: it and the decode down kernel trigger their dependents at the end, as the others do.
 * (Stop 36's last rows by ticket, for the SMs' 3-4 us spread of end times: the earliest ends rose, the latest did
 * not move, 235b tg64 -3% on an H100 at stop 37; taken out, docs/design.md decision 14.) */
static int g_mvs = 1, g_mvs_kb = 128, g_mvs_early = 1;
/* Q8_0 (q8t) rows of one token go through k_mv16s as the 16-bit ones do (stop 38, an H100, tg64 of --dense q8_0, two
 * rounds: 235b 1.031x, 30b 1.013x against k_mv16p, bit-identical); MOET_MVS_Q8=0: k_mv16p. Alone k_mv16p is the
 * faster of the two (83% of copy against 68% at 81920 rows of 2048): k_mv16s wins in the step because it starts
 * beside down, as it does for BF16. */
static int g_mvs_q8 = 1;
/* BF16/F16 x permuted in k_mv16s as q8t's is (mv_x_swizzle: its 2-way conflicts gone, and o_proj's and lm_head's x
 * staged straight into the slots). Written at stop 38, timed at stop 39 (an H100, tg64, two rounds in each of two
 * calls): 235b 1.010x / 1.010x, 30b 1.008x / 1.010x; MOET_MVS_SWZ=0 for the A/B. test_ops checks it bit for bit. */
static int g_mvs_swz = 1;
static void mvs_env(void) { /* read at every launch (not in a replay): test_ops switches it between ops */
    const char *e = getenv("MOET_MVS"), *kb = getenv("MOET_MVS_KB"), *ea = getenv("MOET_MVS_EARLY");
    const char *q8 = getenv("MOET_MVS_Q8"), *sz = getenv("MOET_MVS_SWZ");
    g_mvs = !(e && e[0] == '0');
    g_mvs_q8 = !(q8 && q8[0] == '0');
    g_mvs_swz = !(sz && sz[0] == '0');
    g_mvs_kb = kb && atoi(kb) >= 16 && atoi(kb) <= 227 ? atoi(kb) : 128;
    g_mvs_early = !(ea && ea[0] == '0');
}
/* Whether the kernel after a decode down may launch at down's start (k_tc_down's `early`). */
extern "C" int cu_mv_early_next(void) {
    mvs_env();
    return g_mvs && g_mvs_early;
}
/* Whether the last pre-normed k_mv16s (the q/k/v product that follows a decode down) held at least 3/4 of its
 * warps' rows in its ring. Only then does down take the largest shared split so that it runs beside down
 * (cuda_int.h, cu_carveout_max): measured on an H100 (stop 31, tg64), 30b (4 of 5 rows a warp in the ring)
 * 367.8 -> 386.5 t/s with it, 235b (2 of 9) 87.0 -> 85.5: a ring that cannot hold the matrix only competes with
 * down's latency-bound loads for the memory. */
static int g_mvs_cover = 0;
extern "C" int cu_mv_carve_down(void) { return cu_mv_early_next() && g_mvs_cover; }

static int g_mm_attr_set = -1;
static int g_mv16p = -1; /* MOET_MV16P=0: k_mv16 for every 16-bit launch (A/B of the persistent kernel) */

#define MV16_SMEM(k) CU_CHECK(c, cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, MM_SMEM_MAX))
template <int MT> static int mv16_attrs(cu_backend *c) {
    return MV16_SMEM((k_mv16<0, 0, MT>)) || MV16_SMEM((k_mv16<1, 0, MT>)) || MV16_SMEM((k_mv16<0, 1, MT>)) ||
           MV16_SMEM((k_mv16<1, 1, MT>)) || MV16_SMEM((k_mv16p<MV_BF16, 0, MT>)) ||
           MV16_SMEM((k_mv16p<MV_F16, 0, MT>)) || MV16_SMEM((k_mv16p<MV_BF16, 1, MT>)) ||
           MV16_SMEM((k_mv16p<MV_F16, 1, MT>)) || MV16_SMEM((k_mv16p<MV_Q8T, 0, MT>)) ||
           MV16_SMEM((k_mv16p<MV_Q8T, 1, MT>));
}
#undef MV16_SMEM

/* CTAs of a k_mv16p instance resident on one SM at `smem` bytes of x, from the occupancy calculator (a few
 * entries cached: the decode shapes repeat every step). 0 on failure. */
typedef struct { const void *k; size_t smem; int device, blocks; } mv16p_occ;
static mv16p_occ g_mv16p_occ[32];

template <typename K> static int mv16p_blocks(cu_backend *c, K k, size_t smem) {
    for (int i = 0; i < 32; i++)
        if (g_mv16p_occ[i].k == (const void *)k && g_mv16p_occ[i].smem == smem && g_mv16p_occ[i].device == c->device)
            return g_mv16p_occ[i].blocks;
    int nb = 0;
    if (CU_CHECK(c, cudaOccupancyMaxActiveBlocksPerMultiprocessor(&nb, k, MM_WARPS * 32, smem))) return 0;
    for (int i = 0; i < 32; i++)
        if (!g_mv16p_occ[i].k) {
            g_mv16p_occ[i].k = (const void *)k;
            g_mv16p_occ[i].smem = smem;
            g_mv16p_occ[i].device = c->device;
            g_mv16p_occ[i].blocks = nb;
            break;
        }
    return nb;
}

/* One wave of k_mv16p (at most one CTA a MM_WARPS rows). */
template <typename K, typename... Args>
static void mv16p_go(cu_backend *c, K k, const cu_mv16_set *set, size_t sm, Args... args) {
    int nb = mv16p_blocks(c, k, sm);
    if (nb <= 0) {
        cu_fail(c, cudaErrorInvalidConfiguration, "k_mv16p: no CTA fits an SM", __FILE__, __LINE__);
        return;
    }
    int64_t grid = (int64_t)nb * c->prop.multiProcessorCount;
    const int64_t need = (set->r0[set->n] + MM_WARPS - 1) / MM_WARPS;
    if (grid > need) grid = need;
    cu_launch_pdl(c, k, dim3((unsigned)grid), dim3(MM_WARPS * 32), sm, *set, args...);
}

static int mm_attrs(cu_backend *c) {
    if (g_mv16p < 0) {
        const char *e = getenv("MOET_MV16P");
        g_mv16p = !(e && e[0] == '0');
    }
    if (g_mm_attr_set == c->device) return 0;
    if (CU_CHECK(c, cudaFuncSetAttribute(k_mul_mat, cudaFuncAttributeMaxDynamicSharedMemorySize, MM_SMEM_MAX)) ||
        mv16_attrs<1>(c) || mv16_attrs<MM_MAX_TOK>(c))
        return -1;
    g_mm_attr_set = c->device;
    return 0;
}

/* Whether w takes k_mv16: 16-bit, not rotated, rows and data 16-byte aligned, x 16-byte aligned. */
static int mv16_ok(const moet_weight *w, const uint8_t *d, const float *x) {
    return (w->type == MOET_TYPE_BF16 || w->type == MOET_TYPE_F16) && !w->rotated && !((uintptr_t)d & 15) &&
           !(w->row_bytes & 15) && !((uintptr_t)x & 15);
}

/* Whether a Q8_0 matrix goes to the q8t layout (quant/blocks.h): rows of whole groups of 8 blocks, exactly. */
static int q8t_ok(const moet_weight *w) {
    return w->type == MOET_TYPE_Q8_0 && w->cols > 0 && !(w->cols % 256) &&
           w->row_bytes == (size_t)(w->cols / 32) * sizeof(moet_block_q8_0);
}

__global__ void k_q8t(const uint8_t *__restrict__ src, uint8_t *__restrict__ dst, int64_t groups) {
    for (int64_t g = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; g < groups; g += (int64_t)gridDim.x * blockDim.x)
        moet_q8t_group(src + 272 * g, dst + 272 * g);
}

/* The q8t copy of a Q8_0 matrix (q8t_ok), made at its first use and kept in the mirror table under the key one byte
 * past the weight's address (no other weight can start there), beside any mirror of the stored layout (get_rows of
 * a tied embedding reads that one). The source is the weight itself when it is device memory (synthetic models), a
 * mirror of it when one exists, else a temporary upload. NULL after recording an error. */
static const uint8_t *cu_weight_q8t(cu_backend *c, const moet_weight *w) {
    const void *key = (const uint8_t *)w->data + 1;
    const size_t bytes = (size_t)w->rows * w->row_bytes;
    const cu_mirror *have = cu_mirror_of(c, key);
    if (have && have->bytes >= bytes) return (const uint8_t *)have->dev;
    if (c->capturing) {
        cu_fail(c, cudaErrorStreamCaptureUnsupported, "weight first used while recording a graph", __FILE__, __LINE__);
        return NULL;
    }
    const uint8_t *src = NULL;
    void *tmp = NULL, *dst = NULL;
    const cu_mirror *raw = cu_mirror_of(c, w->data);
    cudaPointerAttributes at;
    if (raw && raw->bytes >= bytes) src = (const uint8_t *)raw->dev;
    else if (cudaPointerGetAttributes(&at, w->data) == cudaSuccess && at.type == cudaMemoryTypeDevice)
        src = (const uint8_t *)w->data;
    else {
        cudaGetLastError();
        if (CU_CHECK(c, cudaMalloc(&tmp, bytes)) ||
            CU_CHECK(c, cudaMemcpyAsync(tmp, w->data, bytes, cudaMemcpyHostToDevice, c->stream)))
            goto fail;
        src = (const uint8_t *)tmp;
    }
    if (CU_CHECK(c, cudaMalloc(&dst, bytes))) goto fail;
    {
        const int64_t groups = (int64_t)(bytes / 272);
        k_q8t<<<(unsigned)((groups + 255) / 256 < 4096 ? (groups + 255) / 256 : 4096), 256, 0, c->stream>>>(
            src, (uint8_t *)dst, groups);
        if (CU_LAUNCHED(c, "k_q8t") || (tmp && CU_CHECK(c, cudaStreamSynchronize(c->stream)))) goto fail;
        const cu_mirror m = {key, dst, bytes, 1, 0};
        if (cu_mirror_put(c, &m)) goto fail;
    }
    if (tmp) cudaFree(tmp);
    return (const uint8_t *)dst;
fail:
    if (tmp) { cudaStreamSynchronize(c->stream); cudaFree(tmp); }
    if (dst) cudaFree(dst);
    return NULL;
}

/* The set of one matrix (its device copy d, output y). */
static cu_mv16_set mv_set_one(const moet_weight *w, const uint8_t *d, const float *b, float *y) {
    cu_mv16_set set = {};
    set.w[0] = d;
    set.b[0] = b;
    set.y[0] = y;
    set.rows[0] = w->rows;
    set.row_bytes[0] = w->row_bytes;
    set.cta0[1] = (int32_t)((w->rows + MM_WARPS - 1) / MM_WARPS);
    set.r0[1] = w->rows;
    set.n = 1;
    return set;
}

/* Tokens a CTA stages (x of ch tokens in shared memory), 0 when one row does not fit. */
static int mv16_chunk(int64_t cols, int64_t n) {
    int ch = (int)(MM_SMEM_MAX / ((size_t)cols * sizeof(float)));
    if (ch > MM_MAX_TOK) ch = MM_MAX_TOK;
    if (ch > n) ch = (int)n;
    return ch;
}

template <int FMT, int SW> static void mvs_launch(cu_backend *c, const cu_mv16_set *set, dim3 g, size_t sm, int64_t cols,
                                                  const float *x, const float *norm_w, float eps, float *h, int acc,
                                                  int ns, int ea) {
    const dim3 b(MVS_WARPS * 32);
    if (norm_w) {
        cu_launch_pdl(c, k_mv16s<FMT, 1, SW>, g, b, sm, *set, cols, x, norm_w, eps, h, acc, ns, ea);
    } else {
        const float *nul = NULL;
        float *nulh = NULL;
        cu_launch_pdl(c, k_mv16s<FMT, 0, SW>, g, b, sm, *set, cols, x, nul, 0.f, nulh, acc, ns, ea);
    }
}

/* k_mv16s for one token where it applies (MOET_MVS, every row of the set the same width of one format: BF16, F16 or
 * q8t; a ring slot a warp fitting in MOET_MVS_KB); 1 when launched (or an error recorded), 0 to take another
 * kernel. */
static int mvs_go(cu_backend *c, const cu_mv16_set *set, int fmt, int64_t cols, const float *x, const float *norm_w,
                  float eps, float *h, int acc) {
    mvs_env();
    if (!g_mvs || (fmt == MV_Q8T && !g_mvs_q8) || c->prop.major < 9 || ((uintptr_t)x & 15)) return 0;
    const size_t rb = fmt == MV_Q8T ? (size_t)cols / 32 * sizeof(moet_block_q8_0) : (size_t)cols * 2;
    if (rb % 16) return 0; /* a bulk copy moves whole 16-byte pieces (q8t rows are whole 272-byte groups) */
    for (int i = 0; i < set->n; i++)
        if (set->row_bytes[i] != rb || ((uintptr_t)set->w[i] & 15)) return 0;
    const int64_t total = set->r0[set->n];
    int64_t grid = c->prop.multiProcessorCount;
    if (grid > (total + MVS_WARPS - 1) / MVS_WARPS) grid = (total + MVS_WARPS - 1) / MVS_WARPS;
    const int64_t rpw = (total + grid * MVS_WARPS - 1) / (grid * MVS_WARPS);
    const int64_t big = (int64_t)c->prop.sharedMemPerBlockOptin - 1024; /* the kernel's static arrays: 560 bytes */
    int64_t nsw = (int64_t)g_mvs_kb * 1024 / (int64_t)(MVS_WARPS * rb);
    if ((int64_t)(cols * sizeof(float) + MVS_WARPS * nsw * (rb + sizeof(uint64_t))) > big)
        nsw = (big - cols * (int64_t)sizeof(float)) / (int64_t)(MVS_WARPS * (rb + sizeof(uint64_t)));
    if (nsw > rpw) nsw = rpw;
    if (nsw < 1) return 0;
    if (norm_w) g_mvs_cover = 4 * nsw >= 3 * rpw;
    const size_t sm = (size_t)cols * sizeof(float) + (size_t)MVS_WARPS * nsw * (rb + sizeof(uint64_t));
    static int attr_dev = -1;
    /* [format][16-bit x permuted][pre-norm] (q8t x is always permuted) */
    const void *ks[3][2][2] = {{{(const void *)k_mv16s<MV_BF16, 0, 0>, (const void *)k_mv16s<MV_BF16, 1, 0>},
                                {(const void *)k_mv16s<MV_BF16, 0, 1>, (const void *)k_mv16s<MV_BF16, 1, 1>}},
                               {{(const void *)k_mv16s<MV_F16, 0, 0>, (const void *)k_mv16s<MV_F16, 1, 0>},
                                {(const void *)k_mv16s<MV_F16, 0, 1>, (const void *)k_mv16s<MV_F16, 1, 1>}},
                               {{(const void *)k_mv16s<MV_Q8T, 0, 1>, (const void *)k_mv16s<MV_Q8T, 1, 1>},
                                {(const void *)k_mv16s<MV_Q8T, 0, 1>, (const void *)k_mv16s<MV_Q8T, 1, 1>}}};
    if (attr_dev != c->device) {
        for (int f = 0; f < 3; f++)
            for (int sw = 0; sw < 2; sw++)
                for (int nm = 0; nm < 2; nm++)
                    if (CU_CHECK(c, cudaFuncSetAttribute(ks[f][sw][nm], cudaFuncAttributeMaxDynamicSharedMemorySize, (int)big)))
                        return 1;
        attr_dev = c->device;
    }
    const int sw = g_mvs_swz;
    if (norm_w && g_mvs_cover) cu_carveout_max(c, ks[fmt][sw][1]); /* beside down (cu_mv_carve_down), where down takes it */
    const dim3 g((unsigned)grid);
    const int ns = (int)nsw, ea = g_mvs_early;
    if (fmt == MV_Q8T) mvs_launch<MV_Q8T, 1>(c, set, g, sm, cols, x, norm_w, eps, h, acc, ns, ea);
    else if (fmt == MV_F16 && sw) mvs_launch<MV_F16, 1>(c, set, g, sm, cols, x, norm_w, eps, h, acc, ns, ea);
    else if (fmt == MV_F16) mvs_launch<MV_F16, 0>(c, set, g, sm, cols, x, norm_w, eps, h, acc, ns, ea);
    else if (sw) mvs_launch<MV_BF16, 1>(c, set, g, sm, cols, x, norm_w, eps, h, acc, ns, ea);
    else mvs_launch<MV_BF16, 0>(c, set, g, sm, cols, x, norm_w, eps, h, acc, ns, ea);
    return 1;
}

/* cuda_int.h: registers a thread of the pre-normed bf16 k_mv16s */
extern "C" int cu_mv16s_regs(void) {
    cudaFuncAttributes fa;
    if (cudaFuncGetAttributes(&fa, k_mv16s<MV_BF16, 1, 0>) != cudaSuccess) { cudaGetLastError(); return -1; }
    return fa.numRegs;
}

/* type: BF16, F16 or CU_TYPE_Q8T (the persistent kernel only: n <= ch). */
static void mv16_launch(cu_backend *c, const cu_mv16_set *set, int32_t type, int64_t cols, const float *x, int64_t n,
                        int ch, const float *norm_w, float eps, float *h, int acc) {
    dim3 grid((unsigned)set->cta0[set->n], (unsigned)((n + ch - 1) / ch));
    const size_t sm = (size_t)ch * cols * sizeof(float);
    const int f16 = type == MOET_TYPE_F16;
    const dim3 block(MM_WARPS * 32);
    const float *nul = NULL;
    float *nulh = NULL;
    /* one token (decode): the single-accumulator instance, fewer registers, more CTAs resident */
#define MV16_GO(MT)                                                                                                  \
    if (norm_w) {                                                                                                    \
        if (f16) cu_launch_pdl(c, k_mv16<1, 1, MT>, grid, block, sm, *set, cols, x, n, ch, norm_w, eps, h, acc);      \
        else cu_launch_pdl(c, k_mv16<0, 1, MT>, grid, block, sm, *set, cols, x, n, ch, norm_w, eps, h, acc);         \
    } else {                                                                                                         \
        if (f16) cu_launch_pdl(c, k_mv16<1, 0, MT>, grid, block, sm, *set, cols, x, n, ch, nul, 0.f, nulh, acc);      \
        else cu_launch_pdl(c, k_mv16<0, 0, MT>, grid, block, sm, *set, cols, x, n, ch, nul, 0.f, nulh, acc);         \
    }
    /* one chunk of tokens: the persistent kernel (bit-identical, one wave); MOET_MV16P=0 keeps k_mv16 */
#define MV16P_GO(FMT, MT)                                                                                            \
    if (norm_w) mv16p_go(c, k_mv16p<FMT, 1, MT>, set, sm, cols, x, n, norm_w, eps, h, acc);                          \
    else mv16p_go(c, k_mv16p<FMT, 0, MT>, set, sm, cols, x, n, nul, 0.f, nulh, acc);
    if (type == CU_TYPE_Q8T) {
        if (n > ch) {
            cu_fail(c, cudaErrorInvalidValue, "k_mv16p (q8t): more tokens than a CTA stages", __FILE__, __LINE__);
            return;
        }
        if (n == 1 && mvs_go(c, set, MV_Q8T, cols, x, norm_w, eps, h, acc)) {
            /* one token: the streaming kernel */
        } else if (n == 1) { MV16P_GO(MV_Q8T, 1) } else { MV16P_GO(MV_Q8T, MM_MAX_TOK) }
    } else if (n == 1 && mvs_go(c, set, f16 ? MV_F16 : MV_BF16, cols, x, norm_w, eps, h, acc)) {
        /* one token: the streaming kernel */
    } else if (n <= ch && g_mv16p) {
        if (f16) {
            if (n == 1) { MV16P_GO(MV_F16, 1) } else { MV16P_GO(MV_F16, MM_MAX_TOK) }
        } else {
            if (n == 1) { MV16P_GO(MV_BF16, 1) } else { MV16P_GO(MV_BF16, MM_MAX_TOK) }
        }
    } else if (ch == 1) { MV16_GO(1) } else { MV16_GO(MM_MAX_TOK) }
#undef MV16_GO
#undef MV16P_GO
    CU_LAUNCHED(c, "k_mv16");
}

static void mul_mat_impl(moet_backend *be, const moet_weight *w, const float *x, int64_t n, float *y, int acc,
                         const float *bias) {
    cu_backend *c = cu_of(be);
    if (n <= 0 || w->rows <= 0 || c->err[0]) return;
    if (mm_attrs(c)) return;
    const float *b = NULL; /* the bias, added in every kernel's store */
    if (bias && !(b = (const float *)cu_weight(c, bias, (size_t)w->rows * sizeof(float)))) return;
    int32_t type = w->type;
    const uint8_t *d;
    int ch;
    if (q8t_ok(w)) { /* Q8_0: the q8t copy; many tokens on tensor cores (gemm.cu), else by the persistent GEMV up
                      * to a chunk of tokens, else k_mul_mat */
        if (!(d = cu_weight_q8t(c, w))) return;
        type = CU_TYPE_Q8T;
        if (cu_gemm_q8t(c, w, d, x, n, y, acc, b)) return;
        if (!w->rotated && !((uintptr_t)x & 15) && (ch = mv16_chunk(w->cols, n)) >= 1 && n <= ch) {
            const cu_mv16_set set = mv_set_one(w, d, b, y);
            mv16_launch(c, &set, type, w->cols, x, n, ch, NULL, 0.f, NULL, acc);
            return;
        }
    } else {
        if (!(d = cu_weight_mat(c, w))) return;
        if (cu_gemm_bf16(c, w, d, x, n, y, acc, b)) return; /* many tokens of a BF16 matrix: tensor cores (gemm.cu) */
        if (mv16_ok(w, d, x) && (ch = mv16_chunk(w->cols, n)) >= 1) {
            const cu_mv16_set set = mv_set_one(w, d, b, y);
            mv16_launch(c, &set, w->type, w->cols, x, n, ch, NULL, 0.f, NULL, acc);
            return;
        }
    }
    /* k_mul_mat decodes whole 32-column groups; the 16-bit GEMVs above take any width of 16-byte rows (DeepSeek's
     * q_lora_rank need not be a multiple of 32), cuBLAS any width */
    if (w->cols % 32) {
        cu_fail(c, cudaErrorInvalidValue, "mul_mat: cols not a multiple of 32", __FILE__, __LINE__);
        return;
    }
    const size_t row_f = (size_t)CU_PAD(w->cols);
    ch = (int)(MM_SMEM_MAX / (row_f * sizeof(float)));
    if (ch > MM_MAX_TOK) ch = MM_MAX_TOK;
    if (ch < 1) {
        cu_fail(c, cudaErrorInvalidValue, "mul_mat: row too wide for shared memory", __FILE__, __LINE__);
        return;
    }
    if (ch > n) ch = (int)n;
    /* rows per warp: 4 when there are rows enough to fill the GPU twice over, fewer for small matrices (router) */
    int rpw = MM_ROWS_PER_WARP;
    while (rpw > 1 && w->rows / (MM_WARPS * rpw) < 2 * c->prop.multiProcessorCount) rpw /= 2;
    const int64_t per_cta = (int64_t)MM_WARPS * rpw;
    dim3 grid((unsigned)((w->rows + per_cta - 1) / per_cta), (unsigned)((n + ch - 1) / ch));
    k_mul_mat<<<grid, MM_WARPS * 32, (size_t)ch * row_f * sizeof(float), c->stream>>>(
        d, type, w->rows, w->cols, w->row_bytes, w->qscale, w->qbeta, w->rotated, w->rot_seed, x, n, ch, rpw, b, y,
        acc);
    CU_LAUNCHED(c, "k_mul_mat");
}

extern "C" void cu_mul_mat(moet_backend *be, const moet_weight *w, const float *x, int64_t n, float *y) {
    mul_mat_impl(be, w, x, n, y, 0, NULL);
}

extern "C" void cu_mul_mat_acc(moet_backend *be, const moet_weight *w, const float *x, int64_t n, const float *bias,
                               float *y) {
    mul_mat_impl(be, w, x, n, y, 1, bias);
}

extern "C" void cu_mul_mat_bias(moet_backend *be, const moet_weight *w, const float *x, int64_t n, const float *bias,
                                float *y) {
    mul_mat_impl(be, w, x, n, y, 0, bias);
}

/* Pre-norm + projections: one k_mv16(p) launch over all matrices when they are of one type (BF16, F16, or Q8_0 in
 * the q8t layout) and width; otherwise the composition (rms_norm, then mul_mat each). norm_w NULL (internal callers
 * only: cu_mlp): no pre-norm, the products of x. */
extern "C" void cu_norm_mul_mat(moet_backend *be, const float *x, const float *norm_w, float eps, int64_t n,
                                int64_t dim, float *h, int32_t nw, const moet_weight *const *w,
                                const float *const *bias, float *const *y) {
    cu_backend *c = cu_of(be);
    if (n <= 0 || c->err[0]) return;
    if (mm_attrs(c)) return;
    /* More tokens than one CTA stages (prefill): every CTA column would redo the norm of its chunk, so the norm runs
     * once (rms_norm) and the matrices take the plain kernel (or gemm.cu). */
    int fused = nw >= 1 && nw <= MV16_MATS && !(dim % 32) && mv16_chunk(dim, n) >= 1 && n <= mv16_chunk(dim, n);
    const int q8 = fused && w[0]->type == MOET_TYPE_Q8_0;
    /* Tokens enough for tensor cores (gemm.cu): rms_norm once, then each product there. */
    for (int32_t i = 0; fused && i < nw; i++)
        fused = !cu_gemm_wants(w[i]->type, n) && w[i]->type == w[0]->type && w[i]->cols == dim && w[i]->rows > 0 &&
                (!q8 || (q8t_ok(w[i]) && !w[i]->rotated && !((uintptr_t)x & 15)));
    cu_mv16_set set = {};
    for (int32_t i = 0; fused && i < nw; i++) {
        const uint8_t *d = q8 ? cu_weight_q8t(c, w[i]) : cu_weight_mat(c, w[i]);
        if (!d) return;
        fused = q8 || mv16_ok(w[i], d, x);
        set.w[i] = d;
        set.y[i] = y[i];
        if (bias && bias[i] && !(set.b[i] = (const float *)cu_weight(c, bias[i], (size_t)w[i]->rows * sizeof(float))))
            return;
        set.rows[i] = w[i]->rows;
        set.row_bytes[i] = w[i]->row_bytes;
        set.cta0[i + 1] = set.cta0[i] + (int32_t)((w[i]->rows + MM_WARPS - 1) / MM_WARPS);
        set.r0[i + 1] = set.r0[i] + w[i]->rows;
    }
    if (!fused) {
        if (norm_w) cu_rms_norm(be, x, norm_w, n, dim, eps, h);
        /* the products of one input: gemm.cu splits it for tensor cores once, not once a matrix */
        c->gemm_reuse = 1;
        c->gemm_xs_src = NULL;
        for (int32_t i = 0; i < nw; i++) mul_mat_impl(be, w[i], norm_w ? h : x, n, y[i], 0, bias ? bias[i] : NULL);
        c->gemm_reuse = 0;
        c->gemm_xs_src = NULL;
        return;
    }
    set.n = nw;
    const float *nwd = NULL; /* norm_w NULL (cu_mlp's gate and up): the products of x alone, one launch */
    if (norm_w && !(nwd = (const float *)cu_weight(c, norm_w, (size_t)dim * sizeof(float)))) return;
    mv16_launch(c, &set, q8 ? CU_TYPE_Q8T : w[0]->type, dim, x, n, mv16_chunk(dim, n), nwd, eps, h, 0);
}

__global__ void k_get_rows(const uint8_t *__restrict__ w, int32_t type, int64_t cols, size_t row_bytes, float qscale,
                           float qbeta, const int32_t *__restrict__ ids, int64_t rows, float *__restrict__ y) {
    CU_TRACE(CU_TK_GET_ROWS << 8);
    const int64_t i = blockIdx.x;
    int32_t id = ids[i];
    if (id < 0 || id >= rows) id = 0; /* ids are validated on the host; never read outside the table */
    const uint8_t *row = w + (int64_t)id * row_bytes;
    for (int64_t g = threadIdx.x; g < cols / 32; g += blockDim.x) {
        float v[32];
        cu_decode32(type, row, g, qscale, qbeta, v);
#pragma unroll
        for (int j = 0; j < 32; j++) y[i * cols + 32 * g + j] = v[j];
    }
}

extern "C" void cu_get_rows(moet_backend *be, const moet_weight *w, const int32_t *ids, int64_t n, float *y) {
    cu_backend *c = cu_of(be);
    if (n <= 0 || c->err[0]) return;
    if (w->cols % 32) {
        cu_fail(c, cudaErrorInvalidValue, "get_rows: cols not a multiple of 32", __FILE__, __LINE__);
        return;
    }
    const uint8_t *d = cu_weight_mat(c, w);
    if (!d) return;
    k_get_rows<<<(unsigned)n, 128, 0, c->stream>>>(d, w->type, w->cols, w->row_bytes, w->qscale, w->qbeta, ids,
                                                    w->rows, y);
    CU_LAUNCHED(c, "k_get_rows");
}
