/*
 * moe.cu — the routed MoE block on the device, from the router to the weighted combine, and the dense SwiGLU MLP.
 *
 * Three launches, no host round trip (the host never sees which experts a token chose):
 *   router   mul_mat of the router (spread over the whole GPU) -> logits [T][E];
 *   gate_up  one CTA per (32-row tile of the expert FFN, token slot): warp 0 routes the token again from its logits
 *            (softmax, top-k with ties to the lower id as on the CPU, renormalised weights; tile 0 of slot 0 stores
 *            them for down) while the other warps load x and rotate it (x R, warp-local Hadamard blocks) into shared
 *            memory; then each warp takes 4 gate and 4 up rows, a lane one 9-byte block of each (fetched as 3 aligned
 *            words, all 8 in flight before any math), silu(gate.x) * (up.x) -> act[slot];
 *   down     one CTA per (8-row tile of hidden, token): the k activation vectors loaded and rotated chunk by chunk,
 *            then a warp's lanes walk the flat (slot, block) list of its row so all lanes work for any FFN width,
 *            router weight x partial dot summed per lane, then a warp sum.
 * Routing is recomputed per CTA rather than launched apart: a launch in a graph costs more (~2-3 us on the H200)
 * than reading E logits from L2. A fixed order, no atomics: the result is the same on every run, graph or eager.
 * Bytes per token (decode): k × 3 × ffn × hidden × bpw/8 of experts + the router; FLOPs: 2 × k × 3 × ffn × hidden.
 * The weights are decoded in registers from their stored blocks (the 2-bit family's 9-byte blocks read as they lie
 * in the pack), so an expert's bytes go from HBM to the FMA units once.
 */
#include <math.h>

#include "backend/cuda/common.cuh"
#include "backend/cuda/cuda_int.h"
#include "backend/cuda/moe.cuh"

#define MOE_THREADS 256
#define MOE_WARPS (MOE_THREADS / 32)
#define GU_FPW 4                       /* expert-FFN rows per warp in gate/up (x 2 matrices: 8 blocks in flight) */
#define GU_ROWS (MOE_WARPS * GU_FPW)
#define DN_RPW 1                       /* hidden rows per warp in down (more CTAs: 256 at hidden 2048) */
#define DN_ROWS (MOE_WARPS * DN_RPW)
#define DN_UNROLL 4                    /* (expert, block) items a lane loads before it computes */
#define MOE_SMEM_MAX (160 * 1024)
#define Q2B ((uint64_t)sizeof(moet_block_q2))

/* Generic types (not the 2-bit family, or a matrix not 4-byte aligned): one block decoded and dotted. */
__device__ __forceinline__ float block_dot(int32_t type, const uint8_t *row, int64_t g, float qscale, float qbeta,
                                           const float *xg) {
    float v[32];
    cu_decode32(type, row, g, qscale, qbeta, v);
    float a = 0.f;
#pragma unroll
    for (int j = 0; j < 32; j++) a = fmaf(v[j], xg[j], a);
    return a;
}

/* ---- gate/up ------------------------------------------------------------------------------------------------- */

/* pre: every expert of the layer rotates x alike (rotated/seed from the host): warps 1.. load x while warp 0 routes.
 * Otherwise x is loaded after routing, with the chosen expert's rotation. */
template <int Q2>
__global__ void __launch_bounds__(MOE_THREADS)
k_moe_gate_up(const float *__restrict__ x, const float *__restrict__ logits, int64_t H, int64_t F, int32_t E,
              int32_t K, int32_t norm_topk, const cu_mat *__restrict__ table, int32_t type, size_t row_bytes,
              int32_t pre, int32_t pre_rot, uint32_t pre_seed, int32_t *__restrict__ topk_ids,
              float *__restrict__ topk_w, float *__restrict__ act, cu_moe_oss ox) {
    extern __shared__ float xs[];
    __shared__ float p[MOE_MAX_E];
    __shared__ int32_t sid[MOE_MAX_K];
    __shared__ float sw[MOE_MAX_K];
    const int slot = blockIdx.y, t = slot / K, j = slot - t * K, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int nch = cu_rot_chunks((int)H);
    if (warp == 0 && !logits) { /* routed by cu_moe_route_sigmoid */
        if (lane < K) sid[lane] = __ldcg(topk_ids + (int64_t)t * K + lane);
    } else if (warp == 0) {
        moe_route_warp(logits + (int64_t)t * E, E, K, norm_topk, p, sid, sw);
        if (blockIdx.x == 0 && j == 0 && lane < K) {
            topk_ids[(int64_t)t * K + lane] = sid[lane];
            topk_w[(int64_t)t * K + lane] = sw[lane];
        }
    } else if (pre) {
        for (int c = warp - 1; c < nch; c += MOE_WARPS - 1) cu_load_rot_chunk(xs, x + (int64_t)t * H, (int)H, pre_rot, pre_seed, c);
    }
    __syncthreads();
    const int32_t e = sid[j];
    const cu_mat gm = table[e * 3], um = table[e * 3 + 1];
    if (!pre) {
        for (int c = warp; c < nch; c += MOE_WARPS) cu_load_rot_chunk(xs, x + (int64_t)t * H, (int)H, gm.rotated, gm.rot_seed, c);
        __syncthreads();
    }
    const int64_t G = H / 32, f0 = ((int64_t)blockIdx.x * MOE_WARPS + warp) * GU_FPW;
    if (f0 >= F) return;
    const int nf = F - f0 < GU_FPW ? (int)(F - f0) : GU_FPW;
    float lg[4], lu[4];
    cu_q2_levels(type, gm.qbeta, lg);
    cu_q2_levels(type, um.qbeta, lu);
    float acc[2 * GU_FPW];
#pragma unroll
    for (int r = 0; r < 2 * GU_FPW; r++) acc[r] = 0.f;
    /* lane on block b of its warp's GU_FPW gate rows and GU_FPW up rows: every load issued before any math */
    for (int64_t b = lane; b < G; b += 32) {
        const float *xg = xs + 33 * b;
        if (Q2) {
            uint32_t wd[2 * GU_FPW][3];
#pragma unroll
            for (int r = 0; r < GU_FPW; r++)
                if (r < nf) {
                    const uint64_t off = (uint64_t)(f0 + r) * row_bytes + Q2B * (uint64_t)b;
                    cu_q2_fetch(gm.w, off, wd[2 * r]);
                    cu_q2_fetch(um.w, off, wd[2 * r + 1]);
                }
#pragma unroll
            for (int r = 0; r < GU_FPW; r++)
                if (r < nf) {
                    const uint64_t off = (uint64_t)(f0 + r) * row_bytes + Q2B * (uint64_t)b;
                    acc[2 * r] += cu_q2_dot_words(wd[2 * r], off, lg, gm.qscale, xg);
                    acc[2 * r + 1] += cu_q2_dot_words(wd[2 * r + 1], off, lu, um.qscale, xg);
                }
        } else {
#pragma unroll
            for (int r = 0; r < GU_FPW; r++)
                if (r < nf) {
                    acc[2 * r] += block_dot(type, gm.w + (f0 + r) * row_bytes, b, gm.qscale, gm.qbeta, xg);
                    acc[2 * r + 1] += block_dot(type, um.w + (f0 + r) * row_bytes, b, um.qscale, um.qbeta, xg);
                }
        }
    }
#pragma unroll
    for (int r = 0; r < GU_FPW; r++) {
        if (r >= nf) break;
        float g = cu_warp_sum(acc[2 * r]), u = cu_warp_sum(acc[2 * r + 1]);
        if (ox.gb) { /* gpt-oss: the experts' biases */
            g += ox.gb[(int64_t)e * F + f0 + r];
            u += ox.ub[(int64_t)e * F + f0 + r];
        }
        if (lane == 0) act[(int64_t)slot * F + f0 + r] = cu_moe_act(g, u, ox.lim);
    }
}

/* ---- down + combine ------------------------------------------------------------------------------------------ */

/* A warp owns DN_RPW output rows; its lanes walk the flat list of (slot k, block b) items of those rows, so a small
 * expert FFN (768 = 24 blocks) still keeps all 32 lanes busy, and each lane adds router weight x partial dot. The k
 * activation vectors are loaded (and rotated, each with its expert's rotation) chunk by chunk over all warps. */
template <int Q2>
__global__ void __launch_bounds__(MOE_THREADS)
k_moe_down(const float *__restrict__ act, int64_t H, int64_t F, int32_t K, const cu_mat *__restrict__ table,
           int32_t type, size_t row_bytes, const int32_t *__restrict__ topk_ids, const float *__restrict__ topk_w,
           float *__restrict__ y, int accum, cu_moe_oss ox) {
    extern __shared__ float as[];
    __shared__ cu_mat dmk[MOE_MAX_K];
    __shared__ float wk[MOE_MAX_K], lvk[MOE_MAX_K][4];
    __shared__ int32_t ek[MOE_MAX_K];
    const int t = blockIdx.y, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int stride = (int)CU_PAD(F);
    if (threadIdx.x < K) {
        const int k = threadIdx.x;
        ek[k] = topk_ids[(int64_t)t * K + k];
        dmk[k] = table[ek[k] * 3 + 2];
        wk[k] = topk_w[(int64_t)t * K + k];
        cu_q2_levels(type, dmk[k].qbeta, lvk[k]);
    }
    __syncthreads();
    const int nch = cu_rot_chunks((int)F);
    for (int it = warp; it < K * nch; it += MOE_WARPS) {
        const int k = it / nch;
        cu_load_rot_chunk(as + k * stride, act + ((int64_t)t * K + k) * F, (int)F, dmk[k].rotated, dmk[k].rot_seed, it - k * nch);
    }
    __syncthreads();
    const int G = (int)(F / 32), n_items = K * G;
    const int64_t r0 = ((int64_t)blockIdx.x * MOE_WARPS + warp) * DN_RPW;
    if (r0 >= H) return;
    const int nr = H - r0 < DN_RPW ? (int)(H - r0) : DN_RPW;
    float acc[DN_RPW];
#pragma unroll
    for (int r = 0; r < DN_RPW; r++) acc[r] = 0.f;
    for (int i0 = lane; i0 < n_items; i0 += 32 * DN_UNROLL) {
        uint32_t wd[DN_UNROLL][DN_RPW][3]; /* Q2: every item's words fetched before any math */
        if (Q2) {
#pragma unroll
            for (int u = 0; u < DN_UNROLL; u++) {
                const int i = i0 + 32 * u;
                if (i >= n_items) break;
                const int k = i / G, b = i - k * G;
#pragma unroll
                for (int r = 0; r < DN_RPW; r++)
                    if (r < nr) cu_q2_fetch(dmk[k].w, (uint64_t)(r0 + r) * row_bytes + Q2B * (uint64_t)b, wd[u][r]);
            }
        }
#pragma unroll
        for (int u = 0; u < DN_UNROLL; u++) {
            const int i = i0 + 32 * u;
            if (i >= n_items) break;
            const int k = i / G, b = i - k * G;
            const float *xg = as + k * stride + 33 * b;
#pragma unroll
            for (int r = 0; r < DN_RPW; r++) {
                if (r >= nr) break;
                const uint64_t off = (uint64_t)(r0 + r) * row_bytes + Q2B * (uint64_t)b;
                const float d = Q2 ? cu_q2_dot_words(wd[u][r], off, lvk[k], dmk[k].qscale, xg)
                                   : block_dot(type, dmk[k].w + (r0 + r) * row_bytes, b, dmk[k].qscale, dmk[k].qbeta, xg);
                acc[r] = fmaf(wk[k], d, acc[r]);
            }
        }
    }
#pragma unroll
    for (int r = 0; r < DN_RPW; r++) {
        if (r >= nr) break;
        float s = cu_warp_sum(acc[r]);
        if (ox.db) /* gpt-oss: each pick's down bias, at its router weight */
            for (int k = 0; k < K; k++) s = fmaf(wk[k], ox.db[(int64_t)ek[k] * H + r0 + r], s);
        if (lane == 0) y[(int64_t)t * H + r0 + r] = accum ? y[(int64_t)t * H + r0 + r] + s : s;
    }
}

/* ---- grouped path (several tokens: prefill) ------------------------------------------------------------------
 * Per slot, the fused kernels above read a chosen expert's rows once for every token that chose it, and every CTA
 * routes and rotates its token again: fine for one token, ruinous for hundreds (at 512 tokens the weights crossed
 * the memory system 4096 times a layer). Here the work is grouped by expert:
 *   prep     one CTA per token: routes it (topk_ids/w), appends its slots to their experts' lists (atomics: the
 *            order inside a list only decides which column a slot takes, never how its sums are formed), and writes
 *            x rotated once (padded rows) for gate/up;
 *   items    the chunks of GR_TB slots of every active expert, as a work list;
 *   gate_up  one CTA per (tile of FFN rows, chunk): each weight block decoded once and used for every token of the
 *            chunk (the expert's rows are read once per chunk instead of once per slot);
 *   down     one CTA per (tile of hidden rows, chunk): the same over the slots' activations, each slot's down
 *            product written alone;
 *   combine  one CTA per token: y = sum over its k picks, in pick order, of weight x down product.
 * No float atomics anywhere, so the result is the same on every run (graph or eager). */
#define GR_FPW 2                /* gate/up: FFN rows per warp (x 2 matrices x GR_TB tokens accumulators) */
#define GR_GU_ROWS (MOE_WARPS * GR_FPW)
#define GR_RPW 4                /* down: hidden rows per warp */
#define GR_DN_ROWS (MOE_WARPS * GR_RPW)

__global__ void __launch_bounds__(MOE_THREADS)
k_moe_prep(const float *__restrict__ x, const float *__restrict__ logits, int64_t T, int64_t H, int32_t E, int32_t K,
           int32_t norm_topk, int32_t rotated, uint32_t seed, int32_t *__restrict__ topk_ids,
           float *__restrict__ topk_w, int32_t *__restrict__ count, int32_t *__restrict__ n_active,
           int32_t *__restrict__ active, int32_t *__restrict__ list, float *__restrict__ xr) {
    extern __shared__ float xs[];
    __shared__ float p[MOE_MAX_E];
    __shared__ int32_t sid[MOE_MAX_K];
    __shared__ float sw[MOE_MAX_K];
    const int t = blockIdx.x, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int nch = cu_rot_chunks((int)H);
    if (warp == 0) {
        if (logits) moe_route_warp(logits + (int64_t)t * E, E, K, norm_topk, p, sid, sw);
        else if (lane < K) { sid[lane] = topk_ids[(int64_t)t * K + lane]; sw[lane] = topk_w[(int64_t)t * K + lane]; }
        __syncwarp(); /* (routed by cu_moe_route_sigmoid when logits is NULL) */
        if (lane < K) {
            const int32_t e = sid[lane];
            topk_ids[(int64_t)t * K + lane] = e;
            topk_w[(int64_t)t * K + lane] = sw[lane];
            const int32_t pos = atomicAdd(&count[e], 1);
            if (pos == 0) active[atomicAdd(n_active, 1)] = e;
            list[(int64_t)e * T + pos] = t * K + lane;
        }
    } else {
        for (int c = warp - 1; c < nch; c += MOE_WARPS - 1) cu_load_rot_chunk(xs, x + (int64_t)t * H, (int)H, rotated, seed, c);
    }
    __syncthreads();
    const int64_t pad = CU_PAD(H);
    for (int64_t i = threadIdx.x; i < pad; i += MOE_THREADS) xr[t * pad + i] = xs[i];
}

/* The work list of the grouped kernels: one (expert, first list entry) item per chunk of tb slots (GR_TB, or
 * moe_grp.cu's larger tiles) of an active
 * expert, so a CTA takes one chunk and small experts' chunks run side by side with big ones'. One CTA, a scan over
 * the active experts (at most MOE_MAX_E). */
__global__ void __launch_bounds__(1024)
k_moe_items(const int32_t *__restrict__ count, const int32_t *__restrict__ n_active, const int32_t *__restrict__ active,
            int32_t tb, int32_t *__restrict__ n_items, int32_t *__restrict__ items) {
    __shared__ int32_t sc[1024];
    const int i = threadIdx.x, na = *n_active;
    const int32_t e = i < na ? active[i] : 0, nc = i < na ? (count[e] + tb - 1) / tb : 0;
    sc[i] = nc;
    __syncthreads();
    for (int o = 1; o < 1024; o *= 2) {  /* inclusive scan */
        const int32_t v = i >= o ? sc[i - o] : 0;
        __syncthreads();
        sc[i] += v;
        __syncthreads();
    }
    const int32_t start = sc[i] - nc;
    for (int32_t c = 0; c < nc; c++) {
        items[2 * (start + c)] = e;
        items[2 * (start + c) + 1] = c * tb;
    }
    if (i == 1023) *n_items = sc[1023];
}

/* 32 weights of block b of a row: decoded once, used for every token of a chunk. */
template <int Q2>
__device__ __forceinline__ void grp_block(int32_t type, const cu_mat &m, const uint32_t wd[3], int64_t row,
                                          size_t row_bytes, int64_t b, const float lv[4], float v[32]) {
    if (Q2) cu_q2_decode_words(wd, (uint64_t)row * row_bytes + Q2B * (uint64_t)b, lv, m.qscale, v);
    else cu_decode32(type, m.w + row * row_bytes, b, m.qscale, m.qbeta, v);
}

/* acc[k] += v . x_k over the nt tokens of a chunk (x_k: token k's padded row in shared memory, at this block). */
__device__ __forceinline__ void grp_fma(const float v[32], const float *xg0, int64_t pad, int nt, float acc[GR_TB]) {
#pragma unroll
    for (int k = 0; k < GR_TB; k++) {
        if (k >= nt) break;
        const float *xg = xg0 + k * pad;
        float a = acc[k];
#pragma unroll
        for (int j = 0; j < 32; j++) a = fmaf(v[j], xg[j], a);
        acc[k] = a;
    }
}

template <int Q2>
__global__ void __launch_bounds__(MOE_THREADS)
k_moe_gate_up_grp(const float *__restrict__ xr, int64_t T, int64_t H, int64_t F, int32_t K,
                  const cu_mat *__restrict__ table, int32_t type, size_t row_bytes, const int32_t *__restrict__ count,
                  const int32_t *__restrict__ n_items, const int32_t *__restrict__ items,
                  const int32_t *__restrict__ list, float *__restrict__ act) {
    extern __shared__ float xs[];
    if ((int)blockIdx.y >= *n_items) return;
    const int32_t e = items[2 * blockIdx.y], c0 = items[2 * blockIdx.y + 1], n = count[e];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const cu_mat gm = table[e * 3], um = table[e * 3 + 1];
    const int64_t G = H / 32, pad = CU_PAD(H), f0 = ((int64_t)blockIdx.x * MOE_WARPS + warp) * GR_FPW;
    const int nf = f0 >= F ? 0 : F - f0 < GR_FPW ? (int)(F - f0) : GR_FPW;
    float lg[4], lu[4];
    cu_q2_levels(type, gm.qbeta, lg);
    cu_q2_levels(type, um.qbeta, lu);
    {
        const int nt = n - c0 < GR_TB ? n - c0 : GR_TB;
        for (int i = 0; i < nt; i++) {
            const int t = list[(int64_t)e * T + c0 + i] / K;
            for (int64_t q = threadIdx.x; q < pad; q += MOE_THREADS) xs[i * pad + q] = xr[t * pad + q];
        }
        __syncthreads();
        if (nf == 0) return;
        float acc[2 * GR_FPW][GR_TB];
#pragma unroll
        for (int r = 0; r < 2 * GR_FPW; r++)
#pragma unroll
            for (int k = 0; k < GR_TB; k++) acc[r][k] = 0.f;
        for (int64_t b = lane; b < G; b += 32) {
            uint32_t wd[2 * GR_FPW][3];
            if (Q2) {
#pragma unroll
                for (int r = 0; r < GR_FPW; r++)
                    if (r < nf) {
                        const uint64_t off = (uint64_t)(f0 + r) * row_bytes + Q2B * (uint64_t)b;
                        cu_q2_fetch(gm.w, off, wd[2 * r]);
                        cu_q2_fetch(um.w, off, wd[2 * r + 1]);
                    }
            }
#pragma unroll
            for (int r = 0; r < 2 * GR_FPW; r++) {
                if ((r >> 1) >= nf) break;
                float v[32];
                grp_block<Q2>(type, (r & 1) ? um : gm, wd[r], f0 + (r >> 1), row_bytes, b, (r & 1) ? lu : lg, v);
                grp_fma(v, xs + 33 * b, pad, nt, acc[r]);
            }
        }
#pragma unroll
        for (int r = 0; r < GR_FPW; r++) {
            if (r >= nf) break;
#pragma unroll
            for (int k = 0; k < GR_TB; k++) {
                if (k >= nt) break;
                const float g = cu_warp_sum(acc[2 * r][k]), u = cu_warp_sum(acc[2 * r + 1][k]);
                if (lane == 0) act[(int64_t)list[(int64_t)e * T + c0 + k] * F + f0 + r] = g / (1.0f + expf(-g)) * u;
            }
        }
    }
}

template <int Q2>
__global__ void __launch_bounds__(MOE_THREADS)
k_moe_down_grp(const float *__restrict__ act, int64_t T, int64_t H, int64_t F, const cu_mat *__restrict__ table,
               int32_t type, size_t row_bytes, const int32_t *__restrict__ count, const int32_t *__restrict__ n_items,
               const int32_t *__restrict__ items, const int32_t *__restrict__ list, float *__restrict__ ydn) {
    extern __shared__ float as[];
    if ((int)blockIdx.y >= *n_items) return;
    const int32_t e = items[2 * blockIdx.y], c0 = items[2 * blockIdx.y + 1], n = count[e];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const cu_mat dm = table[e * 3 + 2];
    const int64_t G = F / 32, pad = CU_PAD(F), r0 = ((int64_t)blockIdx.x * MOE_WARPS + warp) * GR_RPW;
    const int nr = r0 >= H ? 0 : H - r0 < GR_RPW ? (int)(H - r0) : GR_RPW;
    const int nch = cu_rot_chunks((int)F);
    float lv[4];
    cu_q2_levels(type, dm.qbeta, lv);
    {
        const int nt = n - c0 < GR_TB ? n - c0 : GR_TB;
        for (int it = warp; it < nt * nch; it += MOE_WARPS) {
            const int k = it / nch;
            const int32_t slot = list[(int64_t)e * T + c0 + k];
            cu_load_rot_chunk(as + k * pad, act + (int64_t)slot * F, (int)F, dm.rotated, dm.rot_seed, it - k * nch);
        }
        __syncthreads();
        if (nr == 0) return;
        float acc[GR_RPW][GR_TB];
#pragma unroll
        for (int r = 0; r < GR_RPW; r++)
#pragma unroll
            for (int k = 0; k < GR_TB; k++) acc[r][k] = 0.f;
        for (int64_t b = lane; b < G; b += 32) {
            uint32_t wd[GR_RPW][3];
            if (Q2) {
#pragma unroll
                for (int r = 0; r < GR_RPW; r++)
                    if (r < nr) cu_q2_fetch(dm.w, (uint64_t)(r0 + r) * row_bytes + Q2B * (uint64_t)b, wd[r]);
            }
#pragma unroll
            for (int r = 0; r < GR_RPW; r++) {
                if (r >= nr) break;
                float v[32];
                grp_block<Q2>(type, dm, wd[r], r0 + r, row_bytes, b, lv, v);
                grp_fma(v, as + 33 * b, pad, nt, acc[r]);
            }
        }
#pragma unroll
        for (int r = 0; r < GR_RPW; r++) {
            if (r >= nr) break;
#pragma unroll
            for (int k = 0; k < GR_TB; k++) {
                if (k >= nt) break;
                const float d = cu_warp_sum(acc[r][k]);
                if (lane == 0) ydn[(int64_t)list[(int64_t)e * T + c0 + k] * H + r0 + r] = d;
            }
        }
    }
}

__global__ void __launch_bounds__(MOE_THREADS)
k_moe_combine(const float *__restrict__ ydn, const float *__restrict__ topk_w, int64_t H, int32_t K, float *__restrict__ y,
              int accum) {
    const int64_t t = blockIdx.x;
    if (!(H & 3) && !((uintptr_t)ydn & 15) && !((uintptr_t)y & 15)) {
        /* four columns a thread, 16-byte loads: the same FMAs in the same order per element (this kernel took 2x
         * its bytes' time at 512 tokens of 30b on an H100, scalar) */
        const float *w = topk_w + t * K;
        for (int64_t i = 4 * (int64_t)threadIdx.x; i < H; i += 4 * MOE_THREADS) {
            float4 s = make_float4(0.f, 0.f, 0.f, 0.f);
            for (int32_t j = 0; j < K; j++) {
                const float4 v = __ldcs((const float4 *)(ydn + (t * K + j) * H + i));
                s.x = fmaf(w[j], v.x, s.x);
                s.y = fmaf(w[j], v.y, s.y);
                s.z = fmaf(w[j], v.z, s.z);
                s.w = fmaf(w[j], v.w, s.w);
            }
            float4 *yp = (float4 *)(y + t * H + i);
            if (accum) {
                const float4 o = *yp;
                s.x = o.x + s.x; s.y = o.y + s.y; s.z = o.z + s.z; s.w = o.w + s.w;
            }
            *yp = s;
        }
        return;
    }
    for (int64_t i = threadIdx.x; i < H; i += MOE_THREADS) {
        float s = 0.f;
        for (int32_t j = 0; j < K; j++) s = fmaf(topk_w[t * K + j], ydn[(t * K + j) * H + i], s);
        y[t * H + i] = accum ? y[t * H + i] + s : s;
    }
}

/* ---- host side ----------------------------------------------------------------------------------------------- */

/* scratch: router logits [T][E] | act [T*K][F] | grouped path: rotated x [T][pad H] | down products [T*K][H] |
 * int32: count [E] | n_active [1] | n_items [1] | active [E] | lists [E][T] | items [chunks][2] | moe_grp.cu's
 * staged rows (16-byte aligned) */
static size_t grp_floats(int64_t T, int64_t H, int32_t K) {
    return T < MOE_GROUP_MIN ? 0 : (size_t)T * CU_PAD(H) + (size_t)T * K * H;
}
static size_t grp_items_cap(int64_t T, int32_t E, int32_t K, int tb = GR_TB) {  /* chunks: at most T*K/tb + one partial per expert */
    const int64_t s = T * K, a = s < E ? s : E;
    return (size_t)((s + tb - 1) / tb + a);
}
static size_t grp_ints(int64_t T, int32_t E, int32_t K) {
    return T < MOE_GROUP_MIN ? 0 : (size_t)E * 2 + 2 + (size_t)E * T + 2 * grp_items_cap(T, E, K);
}

extern "C" size_t cu_moe_scratch_bytes(moet_backend *be, int64_t T, int64_t H, int64_t F, int32_t E, int32_t K) {
    return ((size_t)T * E + (size_t)T * K * F + grp_floats(T, H, K)) * sizeof(float) + grp_ints(T, E, K) * sizeof(int32_t) +
           (T < MOE_GROUP_MIN ? cu_moe_tc_stage_bytes(T, H, F, K) : cu_moe_gb_stage_bytes(T, H, F, K) + 16) + 256;
}

#define RS_WARPS 4

__global__ void __launch_bounds__(RS_WARPS * 32)
k_route_sigmoid(const float *__restrict__ logits, int64_t T, int32_t E, int32_t K, const float *__restrict__ bias,
                int32_t G, int32_t TG, int32_t norm_topk, float scale, int32_t *__restrict__ topk_ids,
                float *__restrict__ topk_w) {
    extern __shared__ float rs_c[]; /* [RS_WARPS][E] */
    const int warp = threadIdx.x >> 5;
    const int64_t t = (int64_t)blockIdx.x * RS_WARPS + warp;
    cu_pdl_wait();
    if (t < T)
        moe_route_sig_warp(logits + t * E, bias, E, K, G, TG, norm_topk, scale, rs_c + (size_t)warp * E,
                           topk_ids + t * K, topk_w + t * K);
    cu_pdl_trigger();
}

__global__ void __launch_bounds__(RS_WARPS * 32)
k_route_topk(const float *__restrict__ logits, int64_t T, int32_t E, int32_t K, int32_t *__restrict__ topk_ids,
             float *__restrict__ topk_w) {
    const int warp = threadIdx.x >> 5;
    const int64_t t = (int64_t)blockIdx.x * RS_WARPS + warp;
    cu_pdl_wait();
    if (t < T) moe_route_topk_warp(logits + t * E, E, K, topk_ids + t * K, topk_w + t * K);
    cu_pdl_trigger();
}

void cu_moe_route_topk(cu_backend *c, const moet_moe_args *a, const float *logits, int64_t T) {
    cu_launch_pdl(c, k_route_topk, dim3((unsigned)((T + RS_WARPS - 1) / RS_WARPS)), dim3(RS_WARPS * 32), 0, logits, T,
                  a->n_experts, a->n_used, a->topk_ids, a->topk_w);
    CU_LAUNCHED(c, "k_route_topk");
}

int cu_route_sig_of(cu_backend *c, const moet_moe_args *a, cu_route_sig *rs) {
    const int32_t E = a->n_experts;
    *rs = (cu_route_sig){NULL, 1, 1, a->scoring == MOET_ROUTER_SIGMOID, a->route_scale};
    if (!rs->on) return 1;
    if (a->router_bias && !(rs->bias = (const float *)cu_weight(c, a->router_bias, (size_t)E * sizeof(float)))) return 0;
    rs->G = a->n_group > 0 ? a->n_group : 1;
    rs->TG = a->topk_group > 0 ? a->topk_group : rs->G;
    if (rs->G > 32 || E % rs->G || (rs->G > 1 && E / rs->G < 2) || rs->TG > rs->G) {
        cu_fail(c, cudaErrorInvalidValue, "moe: sigmoid router groups outside the kernel's limits", __FILE__, __LINE__);
        return 0;
    }
    return 1;
}

void cu_moe_route_sigmoid(cu_backend *c, const moet_moe_args *a, const float *logits, int64_t T) {
    const int32_t E = a->n_experts, K = a->n_used;
    cu_route_sig rs;
    if (!cu_route_sig_of(c, a, &rs)) return;
    cu_launch_pdl(c, k_route_sigmoid, dim3((unsigned)((T + RS_WARPS - 1) / RS_WARPS)), dim3(RS_WARPS * 32),
                  (size_t)RS_WARPS * E * sizeof(float), logits, T, E, K, rs.bias, rs.G, rs.TG, a->norm_topk, rs.scale,
                  a->topk_ids, a->topk_w);
    CU_LAUNCHED(c, "k_route_sigmoid");
}

static int g_moe_attr_dev = -1;

static int set_attrs(cu_backend *c) {
    if (g_moe_attr_dev == c->device) return 0;
    if (CU_CHECK(c, cudaFuncSetAttribute(k_moe_gate_up<0>, cudaFuncAttributeMaxDynamicSharedMemorySize, MOE_SMEM_MAX)) ||
        CU_CHECK(c, cudaFuncSetAttribute(k_moe_gate_up<1>, cudaFuncAttributeMaxDynamicSharedMemorySize, MOE_SMEM_MAX)) ||
        CU_CHECK(c, cudaFuncSetAttribute(k_moe_down<0>, cudaFuncAttributeMaxDynamicSharedMemorySize, MOE_SMEM_MAX)) ||
        CU_CHECK(c, cudaFuncSetAttribute(k_moe_down<1>, cudaFuncAttributeMaxDynamicSharedMemorySize, MOE_SMEM_MAX)) ||
        CU_CHECK(c, cudaFuncSetAttribute(k_moe_prep, cudaFuncAttributeMaxDynamicSharedMemorySize, MOE_SMEM_MAX)) ||
        CU_CHECK(c, cudaFuncSetAttribute(k_moe_gate_up_grp<0>, cudaFuncAttributeMaxDynamicSharedMemorySize, MOE_SMEM_MAX)) ||
        CU_CHECK(c, cudaFuncSetAttribute(k_moe_gate_up_grp<1>, cudaFuncAttributeMaxDynamicSharedMemorySize, MOE_SMEM_MAX)) ||
        CU_CHECK(c, cudaFuncSetAttribute(k_moe_down_grp<0>, cudaFuncAttributeMaxDynamicSharedMemorySize, MOE_SMEM_MAX)) ||
        CU_CHECK(c, cudaFuncSetAttribute(k_moe_down_grp<1>, cudaFuncAttributeMaxDynamicSharedMemorySize, MOE_SMEM_MAX)))
        return -1;
    g_moe_attr_dev = c->device;
    return 0;
}

static void moe_run(moet_backend *be, const moet_moe_args *args) {
    cu_backend *c = cu_of(be);
    if (c->err[0] || args->n_tok <= 0) return;
    moet_moe_args na = *args;
    const moet_moe_args *a = &na;
    const int64_t T = a->n_tok, H = a->hidden, F = a->ffn;
    const int32_t E = a->n_experts, K = a->n_used;
    if (E > MOE_MAX_E || K > MOE_MAX_K || K > E || H % 32 || F % 32 ||
        (a->scoring != MOET_ROUTER_SOFTMAX && a->scoring != MOET_ROUTER_SIGMOID &&
         a->scoring != MOET_ROUTER_TOPK_SOFTMAX)) {
        cu_fail(c, cudaErrorInvalidValue, "moe: shape outside the kernels' limits", __FILE__, __LINE__);
        return;
    }
    const size_t sm_gu = (size_t)CU_PAD(H) * sizeof(float), sm_dn = (size_t)K * CU_PAD(F) * sizeof(float);
    if (sm_gu > MOE_SMEM_MAX || sm_dn > MOE_SMEM_MAX) {
        cu_fail(c, cudaErrorInvalidValue, "moe: activations exceed shared memory", __FILE__, __LINE__);
        return;
    }
    if (set_attrs(c)) return;
    /* gpt-oss (biased router and experts, the clamped SwiGLU): the per-slot kernels below, whatever the token count,
     * unless its experts were tiled (W2/sym2, the default: cuda_backend.cu's tiled_ok), then moe_tc.cu's kernels with ox;
     * the delta is not there yet */
    const int oss = a->scoring == MOET_ROUTER_TOPK_SOFTMAX || a->router_lbias || a->gate_b || a->swiglu_limit > 0;
    cu_moe_oss ox = {NULL, NULL, NULL, a->swiglu_limit};
    if (oss && a->dgate) {
        cu_fail(c, cudaErrorNotSupported, "moe: the delta with gpt-oss's experts is not supported yet", __FILE__, __LINE__);
        return;
    }
    if (a->gate_b && (!(ox.gb = (const float *)cu_weight(c, a->gate_b, (size_t)E * F * sizeof(float))) ||
                      !(ox.ub = (const float *)cu_weight(c, a->up_b, (size_t)E * F * sizeof(float))) ||
                      !(ox.db = (const float *)cu_weight(c, a->down_b, (size_t)E * H * sizeof(float)))))
        return;
    if (a->dgate && !cu_delta_experts(c, a)) return;
    const cu_expert_table *tab = cu_experts(c, a);
    if (!tab) return;
    /* the delta (W2 base + NVFP4 residuals): the tensor-core kernels in their DL form, decode or grouped */
    const cu_expert_table *dtab = a->dgate ? cu_delta_experts(c, a) : NULL; /* again: cu_experts may have moved them */
    if (a->dgate && !dtab) return;
    if (dtab && (!tab->tiled || !tab->gu_uniform)) {
        cu_fail(c, cudaErrorInvalidValue, "moe: the delta runs with W2/sym2 experts in the tiled layout only", __FILE__, __LINE__);
        return;
    }
    const char *ev = dtab ? getenv("MOET_DELTA_GRP") : NULL; /* 0: a prefill with the delta as decode passes (A/B) */
    if (dtab && (T < MOE_GROUP_MIN || (ev && ev[0] == '0'))) { /* the decode kernels, MOE_DELTA_TOK tokens a pass */
        float *logits = (float *)a->scratch, *act = logits + (size_t)T * E;
        for (int64_t t0 = 0; t0 < T && !c->err[0]; t0 += MOE_DELTA_TOK) {
            moet_moe_args pa = *a;
            pa.n_tok = T - t0 < MOE_DELTA_TOK ? T - t0 : MOE_DELTA_TOK;
            pa.x = a->x + t0 * H;
            pa.y = a->y + t0 * H;
            if (a->h) pa.h = a->h + t0 * H;
            pa.topk_ids = a->topk_ids + t0 * K;
            pa.topk_w = a->topk_w + t0 * K;
            cu_moe_tc_decode(c, &pa, tab, dtab, logits, act, NULL);
        }
        return;
    }
    float *logits = (float *)a->scratch, *act = logits + (size_t)T * E;
    const int q2 = cu_is_q2(tab->type) && tab->aligned4;
    const size_t rb_gu = moet_type_row_bytes(tab->type, H), rb_dn = moet_type_row_bytes(tab->type, F);

    const int pre = tab->gu_uniform;
    if (tab->tiled && T < MOE_GROUP_MIN) { /* the router kernel applies the pre-norm itself */
        if (a->scoring != MOET_ROUTER_SOFTMAX || !cu_moe_fused(c, a, tab, logits, act))
            cu_moe_tc_decode(c, a, tab, NULL, logits, act, oss ? &ox : NULL);
        return;
    }
    if (a->norm_w) { /* the pre-norm as its own launch on the other paths */
        cu_rms_norm(be, a->x, a->norm_w, T, H, a->eps, a->h);
        na.x = a->h;
        na.norm_w = NULL;
    }
    cu_mul_mat_bias(be, a->router, a->x, T, a->router_lbias, logits); /* gpt-oss: the router's bias in the store */
    const int sig = a->scoring == MOET_ROUTER_SIGMOID, tks = a->scoring == MOET_ROUTER_TOPK_SOFTMAX;
    if (sig) cu_moe_route_sigmoid(c, a, logits, T); /* routed here; the kernels below read the picks */
    if (tks) cu_moe_route_topk(c, a, logits, T);
    const float *rlg = sig || tks ? NULL : logits;
    const size_t sm_gr = (size_t)GR_TB * CU_PAD(H) * sizeof(float), sm_gd = (size_t)GR_TB * CU_PAD(F) * sizeof(float);
    if (T >= MOE_GROUP_MIN && pre && (!oss || tab->tiled) && (tab->tiled || (sm_gr <= MOE_SMEM_MAX && sm_gd <= MOE_SMEM_MAX))) {
        float *xr = act + (size_t)T * K * F, *ydn = xr + (size_t)T * CU_PAD(H);
        int32_t *count = (int32_t *)(ydn + (size_t)T * K * H), *n_active = count + E, *n_items = n_active + 1,
                *active = n_items + 1, *list = active + E, *items = list + (size_t)E * T;
        if (CU_CHECK(c, cudaMemsetAsync(count, 0, ((size_t)E + 2) * sizeof(int32_t), c->stream))) return;
        k_moe_prep<<<(unsigned)T, MOE_THREADS, sm_gu, c->stream>>>(a->x, rlg, T, H, E, K, a->norm_topk, tab->gu_rotated,
                                                                  tab->gu_seed, a->topk_ids, a->topk_w, count, n_active,
                                                                  active, list, xr);
        if (CU_LAUNCHED(c, "k_moe_prep")) return;
        /* moe_grp.cu's tiles take the delta too (its residuals in a second pass) where the buffers it borrows are
         * 16-byte aligned; MOET_DELTA_GB=0 keeps the delta on moe_tc.cu's 8-slot kernels (A/B) */
        const char *dge = dtab ? getenv("MOET_DELTA_GB") : NULL;
        const int gb = !oss && cu_moe_gb_ok(tab, H, F) &&
                       (!dtab || (!(dge && dge[0] == '0') && !((uintptr_t)ydn & 15) && !((uintptr_t)a->x & 15) &&
                                  dtab->tiled && dtab->aligned16)),
                  tile = gb ? cu_moe_gb_tile(T, E, K, dtab != NULL) : GR_TB;
        k_moe_items<<<1, 1024, 0, c->stream>>>(count, n_active, active, tile, n_items, items);
        if (CU_LAUNCHED(c, "k_moe_items")) return;
        const unsigned ny = (unsigned)grp_items_cap(T, E, K, tile);
        const cu_dpick dpk = {a->topk_w, K, a->delta_pick}; /* the delta's slots (k_moe_prep wrote topk_w) */
        if (gb) {
            const uintptr_t ip = (uintptr_t)(items + 2 * grp_items_cap(T, E, K));
            void *stage = (void *)((ip + 15) & ~(uintptr_t)15);
            cu_moe_gb(c, tab, dtab, xr, a->x, T, H, F, K, a->topk_ids, count, n_items, items, list, ny, tile, stage,
                      logits, act, ydn, dpk);
        } else if (tab->tiled) {
            cu_moe_tc_gate_up_grp(c, tab, dtab, xr, a->x, T, H, F, K, count, n_items, items, list, ny, act,
                                  oss ? &ox : NULL, dpk);
            cu_moe_tc_down_grp(c, tab, dtab, act, T, H, F, count, n_items, items, list, ny, ydn, oss ? &ox : NULL, dpk);
        } else {
            dim3 gg((unsigned)((F + GR_GU_ROWS - 1) / GR_GU_ROWS), ny), gd((unsigned)((H + GR_DN_ROWS - 1) / GR_DN_ROWS), ny);
            if (q2)
                k_moe_gate_up_grp<1><<<gg, MOE_THREADS, sm_gr, c->stream>>>(xr, T, H, F, K, tab->table, tab->type, rb_gu,
                                                                            count, n_items, items, list, act);
            else
                k_moe_gate_up_grp<0><<<gg, MOE_THREADS, sm_gr, c->stream>>>(xr, T, H, F, K, tab->table, tab->type, rb_gu,
                                                                            count, n_items, items, list, act);
            if (CU_LAUNCHED(c, "k_moe_gate_up_grp")) return;
            if (q2)
                k_moe_down_grp<1><<<gd, MOE_THREADS, sm_gd, c->stream>>>(act, T, H, F, tab->table, tab->type, rb_dn, count,
                                                                         n_items, items, list, ydn);
            else
                k_moe_down_grp<0><<<gd, MOE_THREADS, sm_gd, c->stream>>>(act, T, H, F, tab->table, tab->type, rb_dn, count,
                                                                         n_items, items, list, ydn);
            if (CU_LAUNCHED(c, "k_moe_down_grp")) return;
        }
        if (c->err[0]) return;
        k_moe_combine<<<(unsigned)T, MOE_THREADS, 0, c->stream>>>(ydn, a->topk_w, H, K, a->y, a->accumulate);
        CU_LAUNCHED(c, "k_moe_combine");
        return;
    }
    if (tab->tiled) { /* only moe_tc.cu reads the tiled layout */
        cu_fail(c, cudaErrorInvalidValue, "moe: tiled experts outside the tensor-core path", __FILE__, __LINE__);
        return;
    }
    dim3 g1((unsigned)((F + GU_ROWS - 1) / GU_ROWS), (unsigned)(T * K));
    if (q2)
        k_moe_gate_up<1><<<g1, MOE_THREADS, sm_gu, c->stream>>>(a->x, rlg, H, F, E, K, a->norm_topk, tab->table,
                                                                tab->type, rb_gu, pre, tab->gu_rotated, tab->gu_seed,
                                                                a->topk_ids, a->topk_w, act, ox);
    else
        k_moe_gate_up<0><<<g1, MOE_THREADS, sm_gu, c->stream>>>(a->x, rlg, H, F, E, K, a->norm_topk, tab->table,
                                                                tab->type, rb_gu, pre, tab->gu_rotated, tab->gu_seed,
                                                                a->topk_ids, a->topk_w, act, ox);
    if (CU_LAUNCHED(c, "k_moe_gate_up")) return;
    dim3 g2((unsigned)((H + DN_ROWS - 1) / DN_ROWS), (unsigned)T);
    if (q2) k_moe_down<1><<<g2, MOE_THREADS, sm_dn, c->stream>>>(act, H, F, K, tab->table, tab->type, rb_dn, a->topk_ids, a->topk_w, a->y, a->accumulate, ox);
    else k_moe_down<0><<<g2, MOE_THREADS, sm_dn, c->stream>>>(act, H, F, K, tab->table, tab->type, rb_dn, a->topk_ids, a->topk_w, a->y, a->accumulate, ox);
    CU_LAUNCHED(c, "k_moe_down");
}

extern "C" void cu_moe(moet_backend *be, const moet_moe_args *a) {
    cu_backend *c = cu_of(be);
    moe_run(be, a);
    /* the expert cache: which experts this layer's picks routed to (expert_cache.cu; the table exists by now) */
    if (c->ecache.n_slots && !c->err[0] && a->n_tok > 0) {
        const cu_expert_table *tab = cu_experts(c, a);
        if (tab) cu_ecache_mark(c, tab, a->topk_ids, a->n_tok * a->n_used);
    }
}

/* Dense SwiGLU MLP: the pre-norm (dense layers) and gate and up products (one launch where they take one GEMV
 * kernel: cu_norm_mul_mat; decode), the gating, the down product added onto the residual in its store. */
extern "C" void cu_mlp(moet_backend *be, const moet_weight *gate, const moet_weight *up, const moet_weight *down,
                       const float *x, const float *norm_w, float eps, float *h, int64_t n, float *scratch, float *y) {
    cu_backend *c = cu_of(be);
    float *g = scratch, *u = scratch + (size_t)n * gate->rows;
    const moet_weight *gu[2] = {gate, up};
    float *const gy[2] = {g, u};
    cu_norm_mul_mat(be, x, norm_w, eps, n, gate->cols, norm_w ? h : NULL, 2, gu, NULL, gy);
    cu_swiglu(c, g, u, n * gate->rows);
    cu_mul_mat_acc(be, down, g, n, NULL, y);
}
