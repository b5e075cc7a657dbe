/*
 * moe_fused.cu — the routed MoE block of one decode token as one persistent launch (sm_90+): pre-norm, router,
 * top-k, gate/up, SwiGLU, down and the weighted combine, for 2-bit experts in the tiled layout (quant/blocks.h).
 *
 * Why: moe_tc.cu's three decode launches took 27.6 us at the qwen3-30b-a3b shape for 10.4 MB of weights (2.5 us of
 * DRAM time at the measured copy bandwidth). Each launch is a chain of latencies (stage x, reduce, write), and no
 * launch can ask for a byte of its weights before the one before it has finished. Here one CTA an SM stays resident
 * through the block; as soon as the token is routed every CTA requests all of its weight tiles at once (bulk copies
 * into shared memory), so the DRAM latency is paid once and the weights of the down projection are in flight while
 * the gate/up tiles they depend on are computed elsewhere.
 *
 * Work: units u < K F/16 are gate/up tiles (16 rows of the FFN of pick k = u / (F/16), gate and up, all of H);
 * units past that are down tiles (16 rows of H, every pick's F columns). CTA b takes units b, b + G, b + 2G, ... in
 * that order, as many at once as its shared pool holds (a wave), one mbarrier a unit.
 *
 * Synchronisation: no host round trip and no grid-wide barrier, only counters in device memory (c->fsync):
 *   [0]      +1 a CTA once it has staged x, + its router rows once written; every CTA waits for G + E, then routes
 *            the token itself (the same arithmetic everywhere, so the same picks). Nobody writes y (which may be x,
 *            the residual stream) before every CTA has read x.
 *   [1 + k]  gate/up tiles of pick k written to act; a down warp waits for F/16 before it reads pick k's row;
 *   [K + 1]  CTAs finished: the last one resets every counter for the next launch.
 * Progress: gate/up units wait on nothing and come before a CTA's down units, so every wait ends once every CTA is
 * resident; the host launches at most one CTA an SM and checks that one fits.
 *
 * Arithmetic: k_tc_router's, k_tc_gate_up's and k_tc_down's (moe_tc.cuh), with the same split of chunks over
 * (virtual) warps and the same order of partial sums, so the block equals the three-launch path bit for bit (the
 * pre-norm too where that router ran 16 warps, hidden >= 1024). tests/test_ops.c checks it.
 * Bytes (per token): K x 3 x F x H x 9/32 + the router rows; FLOPs 2 x K x 3 x F x H.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "backend/cuda/moe_tc.cuh"

#define FU_W 8      /* warps a CTA (k_tc_gate_up's TC_GU_W), several CTAs an SM */
#define FU_PER_SM 2 /* CTAs an SM the host sizes shared memory for: one CTA's barriers are another's issue slots */
#define FU_UNITS 16 /* units in shared memory at once (mbarriers) */
#define FU_DNV 24   /* down: virtual warps at most (k_tc_down's split, TC_DN_W) */
#define FU_BLK 144  /* bytes of one 16 x 32 tiled block: 128 of codes, 16 of scales */

static_assert(MOE_MAX_K + 2 <= 64, "c->fsync holds 64 counters");

static_assert(TC_GU_W <= FU_W, "fused gate/up: a warp a virtual warp of k_tc_gate_up");
static_assert(TC_DN_W <= FU_DNV && FU_DNV % FU_W == 0, "fused down: whole virtual warps a warp");
static_assert(TC_RT_W * 32 <= 512, "fused pre-norm: nred holds 16 virtual warps");

/* One gate/up unit: pick k, tile ti, weights at ub (gate codes | gate scales | up codes | up scales). Warp w < nvg
 * takes k_tc_gate_up's chunks w, w + nvg, ... of both matrices; act row k receives SwiGLU of the 16 rows. */
template <int MH>
__device__ __forceinline__ void fu_gate_up(const unsigned char *ub, int k, int64_t ti, int64_t H, int64_t F,
                                           const cu_mat *mats, int32_t type, int32_t gu_rot, uint32_t gu_seed,
                                           const float *xs, const float *lut, float *red, __half *X, int nvg,
                                           float *__restrict__ act, int32_t *sync) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    constexpr int b = 32 * MH;
    const int64_t NBH = H / 32;
    const int nch = (int)(H / b);
    if (warp < nvg) {
        const cu_mat gm = mats[k * 3], um = mats[k * 3 + 1];
        float Ag, Bg, Au, Bu;
        tc_ab(type, gm.qbeta, &Ag, &Bg);
        tc_ab(type, um.qbeta, &Au, &Bu);
        const uint32_t *cg = (const uint32_t *)ub, *cu = (const uint32_t *)(ub + NBH * FU_BLK);
        const uint8_t *sg = ub + NBH * 128, *su = ub + NBH * FU_BLK + NBH * 128;
        const __half *const bs[1] = {tc_bsrc(X, b, 0, 1)};
        const float one[1] = {1.0f};
        float ag[1][2] = {{0.f, 0.f}}, au[1][2] = {{0.f, 0.f}};
        for (int c = warp; c < nch; c += nvg) {
            const int base = c * b + lane * MH;
            float xv[8];
#pragma unroll
            for (int i = 0; i < 8; i++) xv[i] = i < MH ? xs[base + i] : 0.f;
            cu_rot_regs<MH>(xv, gu_rot, gu_seed, base, gm.signs);
            const float p2 = tc_stage(xv, MH, b, X), qg = gm.qscale * p2, qu = um.qscale * p2;
            __syncwarp();
#pragma unroll
            for (int bi = 0; bi < MH; bi++) {
                const int blk = c * MH + bi;
                uint32_t bf[2][1][2];
                tc_bfrags<1>(bs, bi, bf);
                tc_mac<1>(cg[blk * 32 + lane], bf, Ag, Bg, lut[sg[blk * 16 + g]] * qg, lut[sg[blk * 16 + g + 8]] * qg,
                          one, ag);
                tc_mac<1>(cu[blk * 32 + lane], bf, Au, Bu, lut[su[blk * 16 + g]] * qu, lut[su[blk * 16 + g + 8]] * qu,
                          one, au);
            }
            __syncwarp();
        }
        if (t == 0) {
            red[(warp * 2 + 0) * 16 + g] = ag[0][0];
            red[(warp * 2 + 0) * 16 + g + 8] = ag[0][1];
            red[(warp * 2 + 1) * 16 + g] = au[0][0];
            red[(warp * 2 + 1) * 16 + g + 8] = au[0][1];
        }
    }
    __syncthreads();
    if (threadIdx.x < 16) {
        const int r = threadIdx.x;
        float sg = 0.f, su = 0.f;
        for (int w = 0; w < nvg; w++) { sg += red[(w * 2) * 16 + r]; su += red[(w * 2 + 1) * 16 + r]; }
        act[(int64_t)k * F + ti * 16 + r] = sg / (1.0f + expf(-sg)) * su;
        __syncwarp(0xffffu);
        if (r == 0) cu_flag_add(sync + 1 + k, 1); /* release: the 16 stores of this warp's lanes before it */
    }
}

/* One down unit: tile ti of y, weights at ub (per pick k: codes | scales). Virtual warp vw (physical warp vw % FU_W)
 * takes k_tc_down's items vw, vw + nvd, ...; each waits for its pick's gate/up tiles before reading act. */
template <int MF>
__device__ __forceinline__ void fu_down(const unsigned char *ub, int64_t ti, int64_t H, int64_t F, int32_t K,
                                        const cu_mat *mats, int32_t type, const float *wts, const float *lut, float *red, __half *X, int nvd,
                                        const float *act, float *__restrict__ y, int accum, const int32_t *sync) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    constexpr int b = 32 * MF;
    const int64_t NBF = F / 32, TF = F / 16;
    const int nch = (int)(F / b), n_items = K * nch;
    const __half *const bs[1] = {tc_bsrc(X, b, 0, 1)};
    const float one[1] = {1.0f};
    for (int j = 0; j < FU_DNV / FU_W; j++) {
        const int vw = warp + FU_W * j;
        if (vw >= nvd) break;
        float acc[1][2] = {{0.f, 0.f}};
        for (int it = vw; it < n_items; it += nvd) {
            const int k = it / nch, c = it - k * nch;
            const cu_mat dm = mats[k * 3 + 2];
            const float wk = wts[k];
            const uint32_t *cw = (const uint32_t *)(ub + (size_t)k * NBF * FU_BLK);
            const uint8_t *scb = ub + (size_t)k * NBF * FU_BLK + NBF * 128;
            float A, B;
            tc_ab(type, dm.qbeta, &A, &B);
            while (cu_flag_read(sync + 1 + k) < TF) {
            }
            const int base = c * b + lane * MF;
            const float *ap = act + (int64_t)k * F + base;
            float v[8];
            if (MF == 8 && !((uintptr_t)ap & 15)) {
                const float4 a0 = __ldcg((const float4 *)ap), a1 = __ldcg((const float4 *)ap + 1);
                v[0] = a0.x; v[1] = a0.y; v[2] = a0.z; v[3] = a0.w; v[4] = a1.x; v[5] = a1.y; v[6] = a1.z; v[7] = a1.w;
            } else {
#pragma unroll
                for (int i = 0; i < 8; i++) v[i] = i < MF ? __ldcg(ap + i) : 0.f;
            }
            cu_rot_regs<MF>(v, dm.rotated, dm.rot_seed, base, dm.signs);
            const float p2 = tc_stage(v, MF, b, X), qd = dm.qscale * p2 * wk;
            __syncwarp();
#pragma unroll
            for (int bi = 0; bi < MF; bi++) {
                const int blk = c * MF + bi;
                uint32_t bf[2][1][2];
                tc_bfrags<1>(bs, bi, bf);
                tc_mac<1>(cw[blk * 32 + lane], bf, A, B, lut[scb[blk * 16 + g]] * qd, lut[scb[blk * 16 + g + 8]] * qd,
                          one, acc);
            }
            __syncwarp();
        }
        if (t == 0) {
            red[vw * 16 + g] = acc[0][0];
            red[vw * 16 + g + 8] = acc[0][1];
        }
    }
    __syncthreads();
    if (threadIdx.x < 16) {
        const int r = threadIdx.x;
        float s = 0.f;
        for (int w = 0; w < nvd; w++) s += red[w * 16 + r];
        float *yp = y + ti * 16 + r;
        *yp = accum ? *yp + s : s;
    }
}

/* Dynamic shared memory: mbarriers [FU_UNITS] | pool (pool_bytes, weight tiles) | x [H] | logits [E] | softmax
 * scratch [E] | scale lut [256] | partial sums [2][FU_DNV][16] | f16 staging [FU_W][2 x 256]. */
template <int MH, int MF>
__global__ void __launch_bounds__(FU_W * 32, FU_PER_SM)
k_moe_fused(const float *x, int64_t H, int64_t F, int32_t E, int32_t K, int32_t norm_topk,
            const uint8_t *__restrict__ rw, int32_t rtype, size_t rrow, float rqs, float rqb,
            const float *__restrict__ norm_w, float eps, float *__restrict__ h, float *__restrict__ logits,
            int32_t *__restrict__ topk_ids, float *__restrict__ topk_w, const cu_mat *__restrict__ table,
            int32_t type, int32_t gu_rot, uint32_t gu_seed, float *act, float *y, int accum,
            int32_t *sync, uint32_t pool_bytes, int nvg, int nvd, unsigned long long *trace) {
#ifdef CU_HAS_BULK
#define FU_T(slot)                                                                                                     \
    do {                                                                                                               \
        if (trace && threadIdx.x == 0) {                                                                               \
            unsigned long long t_;                                                                                     \
            asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t_));                                                     \
            trace[blockIdx.x * 16 + (slot)] = t_;                                                                      \
        }                                                                                                              \
    } while (0)
    FU_T(0);
    extern __shared__ __align__(128) unsigned char fsm[];
    __shared__ double nred[TC_RT_W];
    __shared__ float ninv[1];
    __shared__ int32_t ids[MOE_MAX_K], ik[MOE_MAX_K];
    __shared__ float wts[MOE_MAX_K], pk[MOE_MAX_K];
    __shared__ cu_mat mats[MOE_MAX_K * 3]; /* the picks' gate, up, down table entries */
    uint64_t *bar = (uint64_t *)fsm;
    unsigned char *pool = fsm + 128;
    float *xs = (float *)(pool + pool_bytes), *lg = xs + H, *p = lg + E, *lut = p + E, *red = lut + 256;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    __half *X = (__half *)(red + 2 * FU_DNV * 16) + (size_t)warp * 2 * 256;
    const int G = (int)gridDim.x;

    /* router rows r = b + G (warp + FU_W j): their first bytes requested before the previous kernel is waited for */
    const int64_t r0 = (int64_t)blockIdx.x + (int64_t)G * warp;
    const tc_rrow rr0 = tc_rrow_of(rw, r0 < E ? r0 : 0, rrow, rtype, H);
    uint4 q[TC_RT_U];
    if (r0 < E) tc_rrow_prefetch(rr0, q);
    if (threadIdx.x == 0) {
        for (int i = 0; i < FU_UNITS; i++) cu_mbar_init(bar + i, 1);
        cu_mbar_init_fence();
    }
    tc_lut_fill(lut);
    cu_pdl_wait();
    FU_T(1);
    cu_stage_f32(xs, x, H);
    __syncthreads();
    if (norm_w) /* k_tc_router's pre-norm: its sums of squares as its 512 or 128 threads add them */
        cu_prenorm_smem(xs, 1, (int)H, norm_w, eps, nred, 1, ninv, blockIdx.x == 0 ? h : NULL,
                        (H >= 1024 ? TC_RT_W : 4) * 32);
    for (int64_t r = r0; r < E; r += (int64_t)G * FU_W) {
        const tc_rrow rr = r == r0 ? rr0 : tc_rrow_of(rw, r, rrow, rtype, H);
        if (r != r0) tc_rrow_prefetch(rr, q);
        float acc[1];
        tc_rrow_dot<1>(rr, q, rtype, rqs, rqb, xs, H, acc);
        const float s = cu_warp_sum(acc[0]);
        if (lane == 0) logits[r] = s;
    }
    __syncthreads();
    const int my_rows = (int)blockIdx.x < E ? (int)((E - 1 - (int)blockIdx.x) / G + 1) : 0;
    FU_T(2);
    if (threadIdx.x == 0) cu_flag_add(sync, 1 + my_rows);
    if (warp == 0)
        while (cu_flag_read(sync) < G + E) {
        }
    __syncthreads();
    (void)cu_flag_read(sync);
    for (int i = threadIdx.x; i < E; i += blockDim.x) lg[i] = __ldcg(logits + i);
    __syncthreads();
    tc_route_warps(lg, E, K, norm_topk, p, ik, pk, ids, wts);
    __syncthreads();
    if (blockIdx.x == 0 && (int)threadIdx.x < K) {
        topk_ids[threadIdx.x] = ids[threadIdx.x];
        topk_w[threadIdx.x] = wts[threadIdx.x];
    }
    FU_T(3);
    for (int i = threadIdx.x; i < 3 * K; i += blockDim.x) mats[i] = table[ids[i / 3] * 3 + i % 3];
    __syncthreads();
    FU_T(4);

    const int64_t TF = F / 16, NGU = (int64_t)K * TF, NU = NGU + H / 16, NBH = H / 32, NBF = F / 32;
    const uint32_t gu_bytes = (uint32_t)(2 * NBH * FU_BLK), dn_bytes = (uint32_t)(K * NBF * FU_BLK);
    uint32_t par = 0, nunit = 0;
    for (int64_t u0 = blockIdx.x; u0 < NU;) {
        int n = 0;
        uint32_t off = 0;
        int64_t u = u0;
        while (u < NU && n < FU_UNITS) { /* the host checked that one unit of each kind fits */
            const uint32_t bytes = u < NGU ? gu_bytes : dn_bytes;
            if (off + bytes > pool_bytes) break;
            off += bytes;
            n++;
            u += G;
        }
        if (warp == 0) { /* every tile of the wave requested at once */
            uint32_t o = 0;
            for (int i = 0; i < n; i++) {
                const int64_t ui = u0 + (int64_t)i * G;
                unsigned char *dst = pool + o;
                if (lane == 0) cu_mbar_expect(bar + i, ui < NGU ? gu_bytes : dn_bytes);
                __syncwarp();
                if (ui < NGU) {
                    const int k = (int)(ui / TF);
                    const int64_t ti = ui - k * TF;
                    if (lane < 4) {
                        const int mat = lane >> 1, sc = lane & 1;
                        const uint8_t *w = mats[k * 3 + mat].w;
                        const uint8_t *src = sc ? w + F * NBH * 8 + ti * NBH * 16 : w + ti * NBH * 128;
                        cu_bulk_load(dst + mat * NBH * FU_BLK + (sc ? NBH * 128 : 0), src,
                                     (uint32_t)(sc ? NBH * 16 : NBH * 128), bar + i);
                    }
                    o += gu_bytes;
                } else {
                    const int64_t ti = ui - NGU;
                    for (int j = lane; j < 2 * K; j += 32) {
                        const int k = j >> 1, sc = j & 1;
                        const uint8_t *w = mats[k * 3 + 2].w;
                        const uint8_t *src = sc ? w + H * NBF * 8 + ti * NBF * 16 : w + ti * NBF * 128;
                        cu_bulk_load(dst + k * NBF * FU_BLK + (sc ? NBF * 128 : 0), src,
                                     (uint32_t)(sc ? NBF * 16 : NBF * 128), bar + i);
                    }
                    o += dn_bytes;
                }
            }
        }
        uint32_t o = 0;
        for (int i = 0; i < n; i++) {
            const int64_t ui = u0 + (int64_t)i * G;
            float *rb = red + (nunit++ & 1) * FU_DNV * 16; /* two partial-sum buffers: one __syncthreads a unit */
            cu_mbar_wait(bar + i, (par >> i) & 1u);
            if (nunit == 1) FU_T(5);
            if (ui >= NGU) FU_T(7);
            if (ui < NGU) {
                const int k = (int)(ui / TF);
                fu_gate_up<MH>(pool + o, k, ui - k * TF, H, F, mats, type, gu_rot, gu_seed, xs, lut, rb, X, nvg, act,
                               sync);
                FU_T(6);
                o += gu_bytes;
            } else {
                fu_down<MF>(pool + o, ui - NGU, H, F, K, mats, type, wts, lut, rb, X, nvd, act, y, accum, sync);
                FU_T(8);
                o += dn_bytes;
            }
        }
        par ^= (1u << n) - 1u;
        __syncthreads(); /* the pool is read: the next wave may overwrite it */
        cu_fence_proxy_async();
        u0 = u;
    }
    FU_T(9);
    cu_pdl_trigger();
    if (threadIdx.x == 0 && atomicAdd(sync + K + 1, 1) == G - 1) {
        for (int i = 0; i <= K + 1; i++) sync[i] = 0; /* every other CTA is done: reset for the next launch */
        __threadfence();
    }
#undef FU_T
#else
    __trap();
#endif
}

/* ---- host side ----------------------------------------------------------------------------------------------- */

static int g_fu_attr_dev = -1;
/* MOET_MOE_TRACE=1: every CTA stamps %globaltimer at its phase boundaries (slots: 0 start, 1 after the PDL wait, 2
 * router rows written, 3 routed, 4 table entries loaded, 5 first unit's tiles landed, 6 last gate/up unit done,
 * 7 down unit's tiles landed, 8 down unit done, 9 end); cu_moe_fused_report prints the last launch's at teardown. */
static unsigned long long *g_fu_trace;
static int g_fu_trace_G;

#define FU_TRACE_MAX 4096
extern "C" void cu_moe_fused_trace_init(cu_backend *c) {
    const char *te = getenv("MOET_MOE_TRACE");
    if (!te || te[0] != '1' || g_fu_trace) return;
    if (!CU_CHECK(c, cudaMalloc(&g_fu_trace, (size_t)FU_TRACE_MAX * 16 * sizeof(unsigned long long))))
        CU_CHECK(c, cudaMemset(g_fu_trace, 0, (size_t)FU_TRACE_MAX * 16 * sizeof(unsigned long long)));
}

extern "C" void cu_moe_fused_report(cu_backend *c) {
    if (!g_fu_trace) return;
    const int G = g_fu_trace_G;
    unsigned long long *h = (unsigned long long *)calloc((size_t)G * 16, sizeof *h);
    if (h && cudaStreamSynchronize(c->stream) == cudaSuccess &&
        cudaMemcpy(h, g_fu_trace, (size_t)G * 16 * sizeof *h, cudaMemcpyDeviceToHost) == cudaSuccess) {
        unsigned long long t0 = ~0ull;
        for (int b = 0; b < G; b++) if (h[b * 16] && h[b * 16] < t0) t0 = h[b * 16];
        static const char *nm[10] = {"start", "pdl waited", "router rows", "routed", "table", "first tiles",
                                     "last gate/up", "down tiles", "down done", "end"};
        fprintf(stderr, "moe_fused trace (last launch, %d CTAs, us from the first start): phase min / median / max\n", G);
        for (int sl = 0; sl < 10; sl++) {
            double v[4096];
            int n = 0;
            for (int b = 0; b < G && n < 4096; b++) if (h[b * 16 + sl] >= t0) v[n++] = (double)(h[b * 16 + sl] - t0) / 1e3;
            if (!n) continue;
            for (int i = 1; i < n; i++) { double x = v[i]; int j = i - 1; while (j >= 0 && v[j] > x) { v[j + 1] = v[j]; j--; } v[j + 1] = x; }
            fprintf(stderr, "  %-13s %7.2f %7.2f %7.2f (%d)\n", nm[sl], v[0], v[n / 2], v[n - 1], n);
        }
    }
    free(h);
    cudaFree(g_fu_trace);
    g_fu_trace = NULL;
}
static size_t g_fu_static; /* k_moe_fused's static shared memory */

static size_t fu_fixed_bytes(int64_t H, int32_t E) {
    return 128 + ((size_t)H + 2 * (size_t)E + 256 + 2 * FU_DNV * 16) * sizeof(float) + (size_t)FU_W * 2 * 256 * sizeof(__half);
}

#define FU_DISPATCH(MF, ...)                                                                                           \
    switch (MF) {                                                                                                      \
    case 2: __VA_ARGS__((k_moe_fused<8, 2>)); break;                                                                     \
    case 4: __VA_ARGS__((k_moe_fused<8, 4>)); break;                                                                     \
    default: __VA_ARGS__((k_moe_fused<8, 8>)); break;                                                                    \
    }

/* Whether the fused block takes this call: only with MOET_MOE_FUSED=1 (read at every call, so a test can compare
 * both paths in one process). It is opt-in because it measured slower than the three launches it replaces (H200,
 * qwen3-30b-a3b: MoE op 28.9 vs 27.3 us, tg128 266 vs 303 t/s; docs/performance.md). 1 when it launched (or
 * recorded an error), 0 to fall back to the three launches. */
extern "C" int cu_moe_fused(cu_backend *c, const moet_moe_args *a, const cu_expert_table *tab, float *logits,
                            float *act) {
    const char *env = getenv("MOET_MOE_FUSED");
    if (!env || env[0] != '1') return 0;
    const int64_t H = a->hidden, F = a->ffn;
    const int32_t E = a->n_experts, K = a->n_used;
    const int bh = cu_hadamard_block(H), bf = cu_hadamard_block(F);
    if (a->n_tok != 1 || c->prop.major < 9 || !c->fsync || !tab->tiled || !tab->aligned16 || bh != 256 || bf < 64)
        return 0;
    if (g_fu_attr_dev != c->device) {
        cudaFuncAttributes fa;
        if (CU_CHECK(c, cudaFuncGetAttributes(&fa, (k_moe_fused<8, 8>)))) return 1;
        g_fu_static = fa.sharedSizeBytes;
#define FU_ATTR(KERN)                                                                                                  \
    CU_CHECK(c, cudaFuncSetAttribute(KERN, cudaFuncAttributeMaxDynamicSharedMemorySize,                               \
                                     (int)(c->prop.sharedMemPerBlockOptin - g_fu_static)))
        if (FU_ATTR((k_moe_fused<8, 2>)) || FU_ATTR((k_moe_fused<8, 4>)) || FU_ATTR((k_moe_fused<8, 8>))) return 1;
#undef FU_ATTR
        g_fu_attr_dev = c->device;
    }
    /* shared memory for FU_PER_SM CTAs an SM: the fixed part, and the rest as the weight pool */
    size_t per_cta = c->prop.sharedMemPerMultiprocessor / FU_PER_SM - c->prop.reservedSharedMemPerBlock;
    if (per_cta > c->prop.sharedMemPerBlockOptin) per_cta = c->prop.sharedMemPerBlockOptin;
    const size_t fixed = fu_fixed_bytes(H, E);
    if (fixed + g_fu_static + 128 >= per_cta) return 0;
    const uint32_t pool = (uint32_t)((per_cta - fixed - g_fu_static) & ~(size_t)127);
    const size_t gu_bytes = 2 * (size_t)(H / 32) * FU_BLK, dn_bytes = (size_t)K * (F / 32) * FU_BLK;
    if (gu_bytes > pool || dn_bytes > pool) return 0;
    const moet_weight *rw = a->router;
    const uint8_t *rd = cu_weight_mat(c, rw);
    if (!rd) return 1;
    const float *nrm = NULL;
    if (a->norm_w && !(nrm = (const float *)cu_weight(c, a->norm_w, (size_t)H * sizeof(float)))) return 1;
    const size_t smem = fixed + pool;
    int per_sm = 0;
#define FU_OCC(KERN) CU_CHECK(c, cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, KERN, FU_W * 32, smem))
    int occ_err = 0;
    FU_DISPATCH(bf / 32, occ_err = FU_OCC)
#undef FU_OCC
    if (occ_err) return 1;
    if (per_sm < 1) return 0;
    const int64_t NU = (int64_t)K * (F / 16) + H / 16, slots = (int64_t)per_sm * c->prop.multiProcessorCount;
    const int G = (int)(NU < slots ? NU : slots); /* every CTA resident at once: the counters' waits need it */
    if (G > FU_TRACE_MAX) g_fu_trace = NULL; /* (never at today's SM counts) */
    g_fu_trace_G = G;
    const int nvg = tc_warps(H / bh, TC_GU_W), nvd = tc_warps(K * (F / bf), TC_DN_W);
#define FU_GO(KERN)                                                                                                    \
    cu_launch_pdl(c, KERN, dim3((unsigned)G), dim3(FU_W * 32), smem, a->x, H, F, E, K, a->norm_topk, rd, rw->type,    \
                  rw->row_bytes, rw->qscale, rw->qbeta, nrm, a->eps, a->h, logits, a->topk_ids, a->topk_w, tab->table, \
                  tab->type, tab->gu_rotated, tab->gu_seed, act, a->y, a->accumulate, c->fsync, pool, nvg, nvd, g_fu_trace)
    FU_DISPATCH(bf / 32, FU_GO)
#undef FU_GO
    CU_LAUNCHED(c, "k_moe_fused");
    return 1;
}
