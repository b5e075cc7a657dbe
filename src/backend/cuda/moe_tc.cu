/*
 * moe_tc.cu — the routed MoE block on tensor cores, for 2-bit experts (W2, sym2) in the tiled device layout
 * (quant/blocks.h), and the in-place rewrite into that layout.
 *
 * Why tensor cores for a GEMV: at batch 1 the MoE is bound by bytes, but decoding 2-bit weights on CUDA cores costs
 * ~6 instructions a weight (extract a code, pick one of four levels, FMA), which at 42 M weights a token (the 30B
 * layer) is more issue time than the 10.6 MB take to arrive. Split into two signs (level = A u' + B v', u', v' = +-1)
 * a 16 x 16 tile of one sign plane is 8 f16x2 registers, each one shift and one LOP3 from the stored word, and
 * mma.m16n8k16 does the multiply-adds: ~1 instruction a weight.
 *
 * Exactness: the weights enter as exact +-1.0; the activations enter as two f16 columns, hi = f16(x 2^-e) and
 * lo = f16(x 2^-e - hi), with e from the chunk's largest |x| (so nothing overflows f16), and the tensor core's f32
 * accumulators sum hi and lo products separately. The block scale, A/B, 2^e and the router weight multiply in f32.
 * The result matches the f32 CUDA-core kernels (moe.cu) to ~2^-22 relative, not bit for bit.
 * The decode kernels (template I8, the default where there is no delta and the chunks are 64+ wide) take the same
 * words as u8 operands of mma.m16n8k32 instead ("the integer form", quant/tile.h): a sign bit is worth 2^j wherever
 * it sits in its byte, so a mask makes four weights (~0.4 instructions a weight); the activations enter as four
 * exact int8 pieces (~27 bits) and the sums are exact s32.
 *
 * Work split (no float atomics, fixed orders: runs are bit-identical, graph or eager):
 *   decode   k_tc_router  router GEMV, one warp a row, writing the logits (and the pre-normed x); with
 *                         MOET_ROUTE_GU=0 the last CTA to finish (ticket) also routes every token (softmax, top-k,
 *                         renormalise) and resets the ticket for the next launch; in the integer form, extra CTAs
 *                         past the router rows rotate and stage gate/up's x chunks once (tc_prestage);
 *            k_tc_gate_up one CTA per (16-row tile of the FFN, token slot): it first routes its token from the logits
 *                         (the same tc_route_warps, so the same picks and weights; CTA (0, slot) writes the slot's
 *                         pick for k_tc_down), then warps over the rotation chunks of the
 *                         hidden size: each warp issues every load of its chunk (gate and up codes + scales), then
 *                         rotates its x chunk in registers and stages it as f16 hi/lo (or copies the router's
 *                         staged chunk), then mma; partial sums of the warps added in warp order, SwiGLU -> act;
 *                         where down's warps have several items, the last CTA of each 16-tile chunk stages it for
 *                         down (cu_tc_dpre);
 *            k_tc_down    one CTA per (16-row tile of hidden, token), warps over (pick k, chunk of the FFN) items,
 *                         act rotated by pick k's rotation (or gate/up's staged chunk), router weight folded in;
 *                         partials added in warp order.
 *            Where gate/up's or down's grid would take more than one wave (qwen3-235b-a22b: 768 and 256 CTAs),
 *            moe_st.cu's forms take two tiles a CTA and stream the weights through shared memory, bit-identically.
 *   grouped  k_tc_gate_up_grp / k_tc_down_grp: one CTA per (tile, chunk of up to 8 slots of one expert): two mma
 *            column groups of 4 tokens x (hi, lo), each weight decoded once for the 8 tokens.
 * Bytes (decode, per token): k x 3 x ffn x hidden x 9/32 + the router; FLOPs 2 x k x 3 x ffn x hidden.
 */
#include <math.h>

#include "backend/cuda/moe_tc.cuh"

/* Router GEMV for NT <= TC_RT_T tokens, a warp a row, TC_RT_W rows a CTA (x staged and pre-normed in shared memory
 * once a CTA); the last CTA to finish routes every token. Dynamic shared memory: x [NT][H] | logits [NT][E] |
 * softmax scratch [NT][E].
 * Why this shape: at the 30b shape the previous kernel (4 warps a CTA, every token count and weight type in one
 * unrolled body, 164 registers) took 21 us for 0.5 MB, and ncu's samples said where: a CTA's time is a chain of
 * latencies. 16 warps a CTA make the pre-norm 4 elements a thread (it was 16, each waiting on its own load of
 * norm_w); weights stay 16-byte words in registers until used (64 widened floats a lane before); the token count is a
 * template parameter and the loop over 16-byte chunks stays rolled, so a cold SM fetches little straight-line code
 * ("no instruction" was a third of the stall samples).
 * bf16 rows (H % 256 == 0) and f32 rows (H % 128 == 0) read 16 bytes a lane, TC_RT_U chunks in flight, the first
 * bf16 ones requested before the previous kernel's x is waited for; other types go block by block. */
/* gate/up's x chunk c of one token (a row of the router's staged, pre-normed x), rotated (cu_rot_regs, as
 * cu_rot_chunk_t: bit-identical to gate/up's own), into slot job. */
template <int M>
__device__ __forceinline__ void tc_prestage(const float *xrow, int c, int rot, uint32_t seed, uint8_t *stg, int job,
                                            int njobs) {
    const int base = c * 32 * M + (threadIdx.x & 31) * M;
    float v[8];
#pragma unroll
    for (int i = 0; i < 8; i++) v[i] = i < M ? xrow[base + i] : 0.f;
    cu_rot_regs<M>(v, rot, seed, base, NULL);
    tc_stage_slot<M>(v, stg, job, njobs);
}

/* The router's body; SP = 1: rsplit_arg warps a row (MOET_RT_SPLIT), SP = 0: one warp a row, rsplit 1 at compile
 * time (the measured kernel: the split's runtime arithmetic cost it registers). */
#define TC_ROUTER_PARAMS                                                                                             \
    const float *x, int64_t H, int32_t E, int32_t K, int32_t norm_topk, const uint8_t *__restrict__ rw,             \
        int32_t rtype, size_t rrow, float rqs, float rqb, float *__restrict__ logits, int32_t *__restrict__ ticket,  \
        int32_t *__restrict__ topk_ids, float *__restrict__ topk_w, const float *__restrict__ norm_w, float eps,      \
        float *__restrict__ h, int32_t route, uint8_t *__restrict__ stg, int32_t gb, int32_t grot, uint32_t gseed,   \
        int32_t rsplit_arg
#define TC_ROUTER_ARGS                                                                                               \
    x, H, E, K, norm_topk, rw, rtype, rrow, rqs, rqb, logits, ticket, topk_ids, topk_w, norm_w, eps, h, route, stg,   \
        gb, grot, gseed, rsplit_arg
template <int NT, int SP>
__device__ __forceinline__ void tc_router_body(TC_ROUTER_PARAMS) {
    const int rsplit = SP ? rsplit_arg : 1;
    CU_TRACE(CU_TK_ROUTER << 8 | SP << 4 | NT);
    extern __shared__ __align__(16) float rsm[];
    __shared__ int last;
    __shared__ double nred[TC_RT_W][TC_RT_T];
    __shared__ float ninv[TC_RT_T];
    __shared__ float rpart[TC_RT_W][TC_RT_T]; /* split rows: each part's sum, added in part order */
    float *xs = rsm, *lg = xs + NT * H, *p = lg + NT * E;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, rpc = (blockDim.x >> 5) / rsplit; /* rows a CTA */
    const int64_t e = (int64_t)blockIdx.x * rpc + warp / rsplit;
    const int part = warp % rsplit;
    const tc_rrow rr = tc_rrow_part(tc_rrow_of(rw, e < E ? e : 0, rrow, rtype, H), part, rsplit);
    const int dot = e < E && (part == 0 || tc_rrow_split_on(rr)); /* other types: part 0 reads the whole row */
    uint4 q[TC_RT_U];
    if (dot) tc_rrow_prefetch(rr, q);
    cu_pdl_wait();
    CU_TRACE_WAITED();
    cu_stage_f32(xs, x, NT * H);
    __syncthreads();
    if (norm_w) /* the block's pre-norm; CTA 0 writes h for the expert kernels */
        cu_prenorm_smem(xs, NT, (int)H, norm_w, eps, &nred[0][0], TC_RT_T, ninv, blockIdx.x == 0 ? h : NULL);
    CU_TRACE_MARK(0); /* x staged and normed */
    const int ncr = (E + rpc - 1) / rpc; /* the CTAs with router rows */
    if (gb && (int)blockIdx.x >= ncr) { /* the CTAs past them: gate/up's x chunks, staged once for every gate/up CTA */
        const int nch = (int)(H / gb), job = ((int)blockIdx.x - ncr) * (blockDim.x >> 5) + warp;
        if (job < NT * nch) {
            const int tok = job / nch, c = job - tok * nch;
            switch (gb) {
            case 64: tc_prestage<2>(xs + (int64_t)tok * H, c, grot, gseed, stg, job, NT * nch); break;
            case 128: tc_prestage<4>(xs + (int64_t)tok * H, c, grot, gseed, stg, job, NT * nch); break;
            default: tc_prestage<8>(xs + (int64_t)tok * H, c, grot, gseed, stg, job, NT * nch); break;
            }
        }
    }
    { /* the row's dot: one warp's sum (rsplit 1), or each part's warp sum, added by part 0 in part order */
        float acc[NT];
#pragma unroll
        for (int t = 0; t < NT; t++) acc[t] = 0.f;
        if (dot) tc_rrow_dot<NT>(rr, q, rtype, rqs, rqb, xs, H, acc);
#pragma unroll
        for (int t = 0; t < NT; t++) {
            const float s = cu_warp_sum(acc[t]);
            if (lane == 0) {
                if (rsplit == 1) {
                    if (e < E) logits[t * E + e] = s;
                } else {
                    rpart[warp][t] = s;
                }
            }
        }
        if (rsplit > 1) {
            __syncthreads(); /* rsplit is the launch's: every thread of the CTA comes here */
            if (e < E && part == 0 && lane == 0)
                for (int t = 0; t < NT; t++) {
                    float s = rpart[warp][t];
                    for (int j = 1; j < rsplit; j++) s += rpart[warp + j][t];
                    logits[t * E + e] = s;
                }
        }
    }
    CU_TRACE_MARK(1); /* the logits written */
    cu_pdl_trigger();
    if (!route) return; /* k_tc_gate_up routes each of its tokens from the logits */
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(ticket, 1) == (int)gridDim.x - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    __shared__ float pk[MOE_MAX_K];
    __shared__ int32_t ik[MOE_MAX_K];
    if (threadIdx.x == 0) *ticket = 0;
    for (int64_t i = threadIdx.x; i < NT * E; i += blockDim.x) lg[i] = __ldcg(logits + i);
    __syncthreads();
    for (int t = 0; t < NT; t++)
        tc_route_warps(lg + t * E, E, K, norm_topk, p + t * E, ik, pk, topk_ids + t * K, topk_w + t * K);
}

template <int NT>
__global__ void __launch_bounds__(TC_RT_W * 32) k_tc_router(TC_ROUTER_PARAMS) {
    tc_router_body<NT, 0>(TC_ROUTER_ARGS);
}

/* Split rows: its own kernel for __maxnreg__ (which excludes __launch_bounds__): at 88 registers a thread a 512-thread
 * CTA still starts beside o_proj's k_mv16s, and prefetches its rows there (without it: 89) */
template <int NT>
__global__ void __maxnreg__(88) k_tc_router_split(TC_ROUTER_PARAMS) {
    tc_router_body<NT, 1>(TC_ROUTER_ARGS);
}

/* ---- decode: gate/up ----------------------------------------------------------------------------------------- */

/* DL: the expert's NVFP4 delta residuals (dtable, tiled: blocks.h) are added into the same accumulators after each
 * chunk's base products, x staged again as the residual sees it (unrotated, as the quantizer stores NVFP4 residuals,
 * or by the residual's own rotation); only on the slots moet_delta_pick(dpick) keeps, the others' residual bytes
 * never requested. */
template <int M, int DL, int I8>
__global__ void __launch_bounds__(TC_GU_W * 32, TC_GU_CTAS(DL))
k_tc_gate_up(const float *x, int64_t H, int64_t F, int32_t K, const cu_mat *__restrict__ table,
             int32_t type, int32_t rot, uint32_t seed, int32_t *topk_ids, float *__restrict__ act,
             const cu_mat *__restrict__ dtable, const float *rlogits, int32_t E, int32_t norm_topk, float *topk_w,
             cu_route_sig rs, cu_moe_oss ox, const uint8_t *pre, int32_t npre, cu_tc_dpre dp, float dpick) {
    CU_TRACE(CU_TK_GATE_UP << 8 | M << 2 | DL << 1 | I8);
    extern __shared__ __align__(16) unsigned char smem[];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5, g = lane >> 2, t = lane & 3;
    const int slot = blockIdx.y, tok = slot / K;
    const int64_t ti = blockIdx.x, NB = H / 32;
    constexpr int b = 32 * M, m = M, nb = M;
    const int nch = (int)(H / b);
    float *lut = (float *)smem, *nvl = lut + 256, *red = nvl + (DL ? 256 : 0); /* [256] | DL: [256] | [nw][2][16] */
    constexpr size_t SB = I8 ? TC_I8_STAGE_BYTES(M) : 2 * b * sizeof(__half); /* a warp's staged chunk */
    unsigned char *stg = (unsigned char *)(red + (size_t)nw * 32);
    __half *X = (__half *)(stg + (size_t)warp * SB);
    uint32_t *W8 = (uint32_t *)X;
    int32_t *X8 = (int32_t *)(W8 + M * 64);
    tc_lut_fill(lut);
    if (DL) tc_e4m3_fill(nvl);
    cu_pdl_wait();
    CU_TRACE_WAITED();
    __syncthreads();
    int dl = DL;
    const int32_t e = tc_gu_route(rlogits, (float *)(stg + (size_t)nw * SB), tok, slot, E, K, norm_topk, rs,
                                  topk_ids, topk_w, dpick, DL ? &dl : nullptr);
    CU_TRACE_MARK(0); /* routed */
    const __half *const bs[1] = {tc_bsrc(X, b, 0, 1)};
    const cu_mat gm = table[e * 3], um = table[e * 3 + 1];
    float Ag, Bg, Au, Bu;
    tc_ab(type, gm.qbeta, &Ag, &Bg);
    tc_ab(type, um.qbeta, &Au, &Bu);
    float ag[1][2] = {{0.f, 0.f}}, au[1][2] = {{0.f, 0.f}};
    const float one[1] = {1.0f};
    float tg[4] = {0.f, 0.f, 0.f, 0.f}, tu[4] = {0.f, 0.f, 0.f, 0.f}; /* I8: the running sums */
    for (int c = warp; c < nch; c += nw) {
        uint32_t wg[8], wu[8], sg, su;
        tc_fetch<M>(gm, F, NB, ti, (int64_t)c * nb, wg, sg);
        tc_fetch<M>(um, F, NB, ti, (int64_t)c * nb, wu, su);
        if constexpr (I8) { /* the integer form (quant/tile.h); never with the delta */
            float p2;
            if (pre) { /* staged once by the router's extra CTAs (tc_prestage): chunk c of token tok, npre slots */
                p2 = tc_i8_fetch_staged<M>(pre, tok * nch + c, npre, W8);
                __syncwarp();
            } else {
                float v[8];
                cu_rot_chunk_t<M>(v, x + (int64_t)tok * H, rot, seed, c, gm.signs);
                p2 = tc_stage_i8<M>(v, W8, X8);
                __syncwarp();
            }
            float cg[4] = {0.f, 0.f, 0.f, 0.f}, cu4[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
            for (int bi = 0; bi < nb; bi++) {
                uint32_t bf[2][2];
                int32_t ci[4];
                tc_i8_bfrag(W8, X8, bi, bf, ci);
                tc_i8_tile(wg[bi], bf, ci, lut[tc_sc(sg, bi, g)], lut[tc_sc(sg, bi, g + 8)], cg);
                tc_i8_tile(wu[bi], bf, ci, lut[tc_sc(su, bi, g)], lut[tc_sc(su, bi, g + 8)], cu4);
            }
            __syncwarp();
            tc_i8_chunk_done(gm.qscale * p2, Ag, Bg, cg, tg);
            tc_i8_chunk_done(um.qscale * p2, Au, Bu, cu4, tu);
            continue;
        }
        cu_mat dg, du; /* the residuals' loads go out with the base's, before any math */
        uint2 cg[8], cu_[8];
        uint32_t g0 = 0, g1 = 0, u0 = 0, u1 = 0;
        if (DL && dl) {
            dg = dtable[e * 3];
            du = dtable[e * 3 + 1]; /* one rotation for both (cu_delta_experts) */
            tc_nv_fetch<M>(dg, F, NB, ti, (int64_t)c * nb, cg, g0, g1);
            tc_nv_fetch<M>(du, F, NB, ti, (int64_t)c * nb, cu_, u0, u1);
        }
        float v[8];
        cu_rot_chunk_t<M>(v, x + (int64_t)tok * H, rot, seed, c, gm.signs);
        const float p2 = tc_stage(v, m, b, X), qg = gm.qscale * p2, qu = um.qscale * p2; /* p2 = 2^e: exact */
        __syncwarp();
#pragma unroll
        for (int bi = 0; bi < nb; bi++) {
            uint32_t bf[2][1][2];
            tc_bfrags<1>(bs, bi, bf);
            tc_mac<1>(wg[bi], bf, Ag, Bg, lut[tc_sc(sg, bi, g)] * qg, lut[tc_sc(sg, bi, g + 8)] * qg, one, ag);
            tc_mac<1>(wu[bi], bf, Au, Bu, lut[tc_sc(su, bi, g)] * qu, lut[tc_sc(su, bi, g + 8)] * qu, one, au);
        }
        __syncwarp();
        if (DL && dl) {
            cu_rot_chunk_t<M>(v, x + (int64_t)tok * H, dg.rotated, dg.rot_seed, c, dg.signs);
            const float d2 = tc_stage(v, m, b, X), dq[1] = {dg.qscale * d2}, uq[1] = {du.qscale * d2};
            __syncwarp();
#pragma unroll
            for (int bi = 0; bi < nb; bi++) {
                uint32_t bf[2][1][2];
                tc_bfrags<1>(bs, bi, bf);
                tc_nv_mac<1>(cg[bi], bf, nvl, g0, g1, bi, dq, ag);
                tc_nv_mac<1>(cu_[bi], bf, nvl, u0, u1, bi, uq, au);
            }
            __syncwarp();
        }
    }
    if (I8) {
        tc_i8_rows(tg, ag[0]);
        tc_i8_rows(tu, au[0]);
    }
    CU_TRACE_MARK(1); /* the products done (the weights arrived) */
    cu_pdl_trigger();
    if (t == 0) {
        red[(warp * 2 + 0) * 16 + g] = ag[0][0];
        red[(warp * 2 + 0) * 16 + g + 8] = ag[0][1];
        red[(warp * 2 + 1) * 16 + g] = au[0][0];
        red[(warp * 2 + 1) * 16 + g + 8] = au[0][1];
    }
    __syncthreads();
    if (threadIdx.x < 16) {
        const int r = threadIdx.x;
        float sg = 0.f, su = 0.f;
        for (int w = 0; w < nw; w++) { sg += red[(w * 2) * 16 + r]; su += red[(w * 2 + 1) * 16 + r]; }
        act[(int64_t)slot * F + ti * 16 + r] = tc_act(sg, su, ox, (int64_t)e * F + ti * 16 + r);
    }
    if constexpr (I8) if (dp.stg) tc_dpre_finish(dp, slot, ti * 16, 16, act, F);
}

/* ---- decode: down + combine ---------------------------------------------------------------------------------- */

/* DL: at most TC_DN_W / 2 warps (170 registers a thread: the residual's words in flight beside the base's spilled
 * at 85), each over twice the work. */
template <int M, int DL, int I8>
__global__ void __launch_bounds__(DL ? TC_DN_W / 2 * 32 : TC_DN_W * 32)
k_tc_down(const float *act, int64_t H, int64_t F, int32_t K, const cu_mat *__restrict__ table,
          int32_t type, const int32_t *topk_ids, const float *topk_w, float *__restrict__ y,
          int accum, const cu_mat *__restrict__ dtable, const float *db, const uint8_t *pre, int32_t npre,
          int32_t early, float dpick) {
    CU_TRACE(CU_TK_DOWN << 8 | M << 2 | DL << 1 | I8);
    extern __shared__ __align__(16) unsigned char smem[];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5, g = lane >> 2, t = lane & 3;
    const int tok = blockIdx.y;
    const int64_t ti = blockIdx.x, NB = F / 32;
    constexpr int b = 32 * M, m = M, nb = M;
    const int nch = (int)(F / b), n_items = K * nch;
    float *lut = (float *)smem, *nvl = lut + 256, *red = nvl + (DL ? 256 : 0); /* [256] | DL: [256] | [nw][16] */
    constexpr size_t SB = I8 ? TC_I8_STAGE_BYTES(M) : 2 * b * sizeof(__half); /* a warp's staged chunk */
    __half *X = (__half *)((unsigned char *)(red + (size_t)nw * 16) + (size_t)warp * SB);
    uint32_t *W8 = (uint32_t *)X;
    int32_t *X8 = (int32_t *)(W8 + M * 64);
    tc_lut_fill(lut);
    if (DL) tc_e4m3_fill(nvl);
    /* early: the next kernel's CTAs may launch now, beside these (the streaming GEMV of the next layer's q/k/v,
     * matmul.cu's k_mv16s, which fits beside a down CTA and requests its rows into shared memory at once) */
    if (early) cu_pdl_trigger();
    cu_pdl_wait();
    CU_TRACE_WAITED();
    __syncthreads();
    const __half *const bs[1] = {tc_bsrc(X, b, 0, 1)};
    float acc[1][2] = {{0.f, 0.f}};
    const float one[1] = {1.0f};
    float tot[4] = {0.f, 0.f, 0.f, 0.f}; /* I8: the running sums */
    /* DL: bit k, pick k takes the residual (K <= MOE_MAX_K <= 32; every warp, one load a lane) */
    const unsigned dmk = DL ? cu_dpick_bits(cu_dpick{topk_w, K, dpick}, tok) : 0u;
    for (int it = warp; it < n_items; it += nw) {
        const int k = it / nch, c = it - k * nch;
        const int32_t e = __ldcg(topk_ids + tok * K + k);
        const float wk = __ldcg(topk_w + tok * K + k);
        const cu_mat dm = table[e * 3 + 2];
        if (it == warp) CU_TRACE_MARK(0); /* the first pick known */
        uint32_t wd[8], sd;
        tc_fetch<M>(dm, H, NB, ti, (int64_t)c * nb, wd, sd);
        cu_mat rm; /* the residual's loads go out with the base's, for the picks that take it */
        uint2 cr[8];
        uint32_t r0 = 0, r1 = 0;
        const int dk = DL && (dmk >> k & 1u);
        if (dk) {
            rm = dtable[e * 3 + 2];
            tc_nv_fetch<M>(rm, H, NB, ti, (int64_t)c * nb, cr, r0, r1);
        }
        float A, B;
        tc_ab(type, dm.qbeta, &A, &B);
        if constexpr (I8) { /* the integer form (quant/tile.h); never with the delta */
            const float p2 = tc_dn_stage<M>(pre, npre, act, tok, K, k, c, nch, F, dm, W8, X8);
            __syncwarp();
            float cd[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
            for (int bi = 0; bi < nb; bi++) {
                uint32_t bf[2][2];
                int32_t ci[4];
                tc_i8_bfrag(W8, X8, bi, bf, ci);
                tc_i8_tile(wd[bi], bf, ci, lut[tc_sc(sd, bi, g)], lut[tc_sc(sd, bi, g + 8)], cd);
            }
            __syncwarp();
            tc_i8_chunk_done(dm.qscale * p2 * wk, A, B, cd, tot);
            continue;
        }
        float v[8];
        cu_rot_chunk_t<M>(v, act + ((int64_t)tok * K + k) * F, dm.rotated, dm.rot_seed, c, dm.signs);
        const float p2 = tc_stage(v, m, b, X), qd = dm.qscale * p2 * wk; /* as (qscale lut) 2^e wk: 2^e is exact */
        __syncwarp();
#pragma unroll
        for (int bi = 0; bi < nb; bi++) {
            uint32_t bf[2][1][2];
            tc_bfrags<1>(bs, bi, bf);
            tc_mac<1>(wd[bi], bf, A, B, lut[tc_sc(sd, bi, g)] * qd, lut[tc_sc(sd, bi, g + 8)] * qd, one, acc);
        }
        __syncwarp();
        if (dk) {
            cu_rot_chunk_t<M>(v, act + ((int64_t)tok * K + k) * F, rm.rotated, rm.rot_seed, c, rm.signs);
            const float d2 = tc_stage(v, m, b, X), rq[1] = {rm.qscale * d2 * wk};
            __syncwarp();
#pragma unroll
            for (int bi = 0; bi < nb; bi++) {
                uint32_t bf[2][1][2];
                tc_bfrags<1>(bs, bi, bf);
                tc_nv_mac<1>(cr[bi], bf, nvl, r0, r1, bi, rq, acc);
            }
            __syncwarp();
        }
    }
    if (I8) tc_i8_rows(tot, acc[0]);
    CU_TRACE_MARK(1); /* the products done */
    if (!early) cu_pdl_trigger();
    if (t == 0) {
        red[warp * 16 + g] = acc[0][0];
        red[warp * 16 + g + 8] = acc[0][1];
    }
    __syncthreads();
    if (threadIdx.x < 16) {
        const int r = threadIdx.x;
        float s = 0.f;
        for (int w = 0; w < nw; w++) s += red[w * 16 + r];
        if (db) /* gpt-oss: each pick's down bias at its router weight */
            for (int k = 0; k < K; k++)
                s += __ldcg(topk_w + tok * K + k) * db[(int64_t)__ldcg(topk_ids + tok * K + k) * H + ti * 16 + r];
        float *yp = y + (int64_t)tok * H + ti * 16 + r;
        *yp = accum ? *yp + s : s;
    }
}

/* ---- grouped: gate/up and down over (tile, chunk of slots) --------------------------------------------------- */

/* The slots of work item blockIdx.y: expert e, up to GR_TB list entries from c0. */
__device__ __forceinline__ int tc_item(const int32_t *count, const int32_t *items, int32_t *e, int32_t *c0) {
    *e = items[2 * blockIdx.y];
    *c0 = items[2 * blockIdx.y + 1];
    const int n = count[*e] - *c0;
    return n < GR_TB ? n : GR_TB;
}

/* The lane's token of column group gi (4 gi + t) and that token's 2^e, from the warp's per-token factors. */
__device__ __forceinline__ float tc_pick(const float p2[GR_TB], int j) {
    float r = 0.f;
#pragma unroll
    for (int i = 0; i < GR_TB; i++)
        if (i == j) r = p2[i];
    return r;
}

/* Chunk c of the nt slots' rows staged for a grouped kernel as matrix m sees them (its rotation): slot j's row is row
 * lst[j] / div of src (ld apart); p2[j] = its 2^e (0 past nt). on: bit j clear (the delta's residuals, a slot that
 * does not take them: tc_dpick_mask) stages slot j as zeros with p2 0, so its products add exactly nothing. */
template <int M>
__device__ __forceinline__ void tc_stage_slots(const float *src, int64_t ld, const int32_t *lst, int div, int nt,
                                               const cu_mat &m, int c, __half *X, float p2[GR_TB],
                                               unsigned on = 0xffu) {
    constexpr int b = 32 * M;
#pragma unroll
    for (int j = 0; j < GR_TB; j++) {
        p2[j] = 0.f;
        if (j < nt) {
            float v[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
            if (on >> j & 1u) cu_rot_chunk_t<M>(v, src + (int64_t)(lst[j] / div) * ld, m.rotated, m.rot_seed, c, m.signs);
            p2[j] = tc_stage(v, M, b, X + (size_t)j * 2 * b);
            if (!(on >> j & 1u)) p2[j] = 0.f;
        }
    }
}

/* Bit j: slot lst[j] (j < nt) takes the delta's residuals (cu_dpick_on); once a CTA, not once a chunk. */
__device__ __forceinline__ unsigned tc_dpick_mask(const cu_dpick dp, const int32_t *lst, int nt) {
    unsigned on = 0;
    for (int j = 0; j < nt && j < GR_TB; j++) on |= (unsigned)cu_dpick_on(dp, lst[j]) << j;
    return on;
}

/* One chunk of one NVFP4 residual against the staged slots of a grouped kernel (bs: both column groups; q: the groups'
 * factors, the tensor scale times each token's 2^e): its loads, then its products into acc. One matrix at a time, so
 * gate/up's two residuals do not hold both sets of code words at once (that spilled 100 bytes). */
template <int M>
__device__ __forceinline__ void tc_nv_grp_mat(const cu_mat &dm, int64_t rows, int64_t NB, int64_t ti, int c,
                                              const __half *const bs[2], const float *nvl, const float q[2],
                                              float acc[2][2]) {
    uint2 cw[8];
    uint32_t s0, s1;
    tc_nv_fetch<M>(dm, rows, NB, ti, (int64_t)c * M, cw, s0, s1);
#pragma unroll
    for (int bi = 0; bi < M; bi++) {
        uint32_t bf[2][2][2];
        tc_bfrags<2>(bs, bi, bf);
        tc_nv_mac<2>(cw[bi], bf, nvl, s0, s1, bi, q, acc);
    }
}

/* DL: the NVFP4 delta residuals (dtable) added after each chunk's base products, the slots' x (x: the unrotated rows,
 * H apart) staged again as the residuals see it; as the decode kernels do. */
template <int M, int DL>
__global__ void __launch_bounds__(TC_GRP_W * 32)
k_tc_gate_up_grp(const float *__restrict__ xr, int64_t T, int64_t H, int64_t F, int32_t K,
                 const cu_mat *__restrict__ table, int32_t type, const int32_t *__restrict__ count,
                 const int32_t *__restrict__ n_items, const int32_t *__restrict__ items,
                 const int32_t *__restrict__ list, float *__restrict__ act, const float *__restrict__ x,
                 const cu_mat *__restrict__ dtable, cu_moe_oss ox, cu_dpick dp) {
    extern __shared__ __align__(16) unsigned char smem[];
    if ((int)blockIdx.y >= *n_items) return;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5, g = lane >> 2, t = lane & 3;
    int32_t e, c0;
    const int nt = tc_item(count, items, &e, &c0);
    const int64_t ti = blockIdx.x, NB = H / 32, pad = CU_PAD(H);
    constexpr int b = 32 * M, m = M, nb = M;
    const int nch = (int)(H / b);
    float *lut = (float *)smem, *nvl = lut + 256, *red = nvl + (DL ? 256 : 0); /* [256] | DL: [256] | [nw][2][GR_TB][16] */
    __half *X = (__half *)(red + (size_t)nw * 2 * GR_TB * 16) + (size_t)warp * GR_TB * 2 * b;
    tc_lut_fill(lut);
    if (DL) tc_e4m3_fill(nvl);
    __syncthreads();
    const __half *const bs[2] = {tc_bsrc(X, b, 0, nt), tc_bsrc(X, b, 1, nt)};
    const cu_mat gm = table[e * 3], um = table[e * 3 + 1];
    float Ag, Bg, Au, Bu;
    tc_ab(type, gm.qbeta, &Ag, &Bg);
    tc_ab(type, um.qbeta, &Au, &Bu);
    float ag[2][2] = {{0.f, 0.f}, {0.f, 0.f}}, au[2][2] = {{0.f, 0.f}, {0.f, 0.f}};
    const unsigned don = DL ? tc_dpick_mask(dp, list + (int64_t)e * T + c0, nt) : 0u;
    for (int c = warp; c < nch; c += nw) {
        uint32_t wg[8], wu[8], sg, su;
        tc_fetch<M>(gm, F, NB, ti, (int64_t)c * nb, wg, sg);
        tc_fetch<M>(um, F, NB, ti, (int64_t)c * nb, wu, su);
        float p2[GR_TB];
#pragma unroll
        for (int j = 0; j < GR_TB; j++) {
            p2[j] = 0.f;
            if (j < nt) {
                const float *xt = xr + (int64_t)(list[(int64_t)e * T + c0 + j] / K) * pad;
                float v[8];
#pragma unroll
                for (int i = 0; i < 8; i++) v[i] = i < m ? xt[CU_PAD(c * b + lane * m + i)] : 0.f;
                p2[j] = tc_stage(v, m, b, X + (size_t)j * 2 * b);
            }
        }
        __syncwarp();
        const float q[2] = {tc_pick(p2, t), tc_pick(p2, 4 + t)};
#pragma unroll
        for (int bi = 0; bi < nb; bi++) {
            uint32_t bf[2][2][2];
            tc_bfrags<2>(bs, bi, bf);
            tc_mac<2>(wg[bi], bf, Ag, Bg, gm.qscale * lut[tc_sc(sg, bi, g)], gm.qscale * lut[tc_sc(sg, bi, g + 8)], q, ag);
            tc_mac<2>(wu[bi], bf, Au, Bu, um.qscale * lut[tc_sc(su, bi, g)], um.qscale * lut[tc_sc(su, bi, g + 8)], q, au);
        }
        __syncwarp();
        if (DL) {
            const cu_mat dg = dtable[e * 3], du = dtable[e * 3 + 1]; /* one rotation for both (cu_delta_experts) */
            tc_stage_slots<M>(x, H, list + (int64_t)e * T + c0, K, nt, dg, c, X, p2, don);
            __syncwarp();
            const float dq[2] = {dg.qscale * tc_pick(p2, t), dg.qscale * tc_pick(p2, 4 + t)},
                        uq[2] = {du.qscale * tc_pick(p2, t), du.qscale * tc_pick(p2, 4 + t)};
            tc_nv_grp_mat<M>(dg, F, NB, ti, c, bs, nvl, dq, ag);
            tc_nv_grp_mat<M>(du, F, NB, ti, c, bs, nvl, uq, au);
            __syncwarp();
        }
    }
#pragma unroll
    for (int gi = 0; gi < 2; gi++) {
        const int j = 4 * gi + t;
        float *rg = red + ((size_t)(warp * 2 + 0) * GR_TB + j) * 16, *ru = red + ((size_t)(warp * 2 + 1) * GR_TB + j) * 16;
        rg[g] = ag[gi][0]; rg[g + 8] = ag[gi][1];
        ru[g] = au[gi][0]; ru[g + 8] = au[gi][1];
    }
    __syncthreads();
    for (int i = threadIdx.x; i < nt * 16; i += blockDim.x) {
        const int j = i >> 4, r = i & 15;
        float sg = 0.f, su = 0.f;
        for (int w = 0; w < nw; w++) {
            sg += red[((size_t)(w * 2 + 0) * GR_TB + j) * 16 + r];
            su += red[((size_t)(w * 2 + 1) * GR_TB + j) * 16 + r];
        }
        act[(int64_t)list[(int64_t)e * T + c0 + j] * F + ti * 16 + r] = tc_act(sg, su, ox, (int64_t)e * F + ti * 16 + r);
    }
}

template <int M, int DL>
__global__ void __launch_bounds__(TC_GRP_W * 32)
k_tc_down_grp(const float *__restrict__ act, int64_t T, int64_t H, int64_t F, const cu_mat *__restrict__ table,
              int32_t type, const int32_t *__restrict__ count, const int32_t *__restrict__ n_items,
              const int32_t *__restrict__ items, const int32_t *__restrict__ list, float *__restrict__ ydn,
              const cu_mat *__restrict__ dtable, const float *__restrict__ db, cu_dpick dp) {
    extern __shared__ __align__(16) unsigned char smem[];
    if ((int)blockIdx.y >= *n_items) return;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5, g = lane >> 2, t = lane & 3;
    int32_t e, c0;
    const int nt = tc_item(count, items, &e, &c0);
    const int64_t ti = blockIdx.x, NB = F / 32;
    constexpr int b = 32 * M, m = M, nb = M;
    const int nch = (int)(F / b);
    float *lut = (float *)smem, *nvl = lut + 256, *red = nvl + (DL ? 256 : 0); /* [256] | DL: [256] | [nw][GR_TB][16] */
    __half *X = (__half *)(red + (size_t)nw * GR_TB * 16) + (size_t)warp * GR_TB * 2 * b;
    tc_lut_fill(lut);
    if (DL) tc_e4m3_fill(nvl);
    __syncthreads();
    const __half *const bs[2] = {tc_bsrc(X, b, 0, nt), tc_bsrc(X, b, 1, nt)};
    const cu_mat dm = table[e * 3 + 2];
    float A, B;
    tc_ab(type, dm.qbeta, &A, &B);
    float acc[2][2] = {{0.f, 0.f}, {0.f, 0.f}};
    const unsigned don = DL ? tc_dpick_mask(dp, list + (int64_t)e * T + c0, nt) : 0u;
    for (int c = warp; c < nch; c += nw) {
        uint32_t wd[8], sd;
        tc_fetch<M>(dm, H, NB, ti, (int64_t)c * nb, wd, sd);
        float p2[GR_TB];
        tc_stage_slots<M>(act, F, list + (int64_t)e * T + c0, 1, nt, dm, c, X, p2);
        __syncwarp();
        const float q[2] = {tc_pick(p2, t), tc_pick(p2, 4 + t)};
#pragma unroll
        for (int bi = 0; bi < nb; bi++) {
            uint32_t bf[2][2][2];
            tc_bfrags<2>(bs, bi, bf);
            tc_mac<2>(wd[bi], bf, A, B, dm.qscale * lut[tc_sc(sd, bi, g)], dm.qscale * lut[tc_sc(sd, bi, g + 8)], q, acc);
        }
        __syncwarp();
        if (DL) {
            const cu_mat rm = dtable[e * 3 + 2];
            tc_stage_slots<M>(act, F, list + (int64_t)e * T + c0, 1, nt, rm, c, X, p2, don);
            __syncwarp();
            const float rq[2] = {rm.qscale * tc_pick(p2, t), rm.qscale * tc_pick(p2, 4 + t)};
            tc_nv_grp_mat<M>(rm, H, NB, ti, c, bs, nvl, rq, acc);
            __syncwarp();
        }
    }
#pragma unroll
    for (int gi = 0; gi < 2; gi++) {
        float *rr = red + ((size_t)warp * GR_TB + 4 * gi + t) * 16;
        rr[g] = acc[gi][0];
        rr[g + 8] = acc[gi][1];
    }
    __syncthreads();
    for (int i = threadIdx.x; i < nt * 16; i += blockDim.x) {
        const int j = i >> 4, r = i & 15;
        float s = 0.f;
        for (int w = 0; w < nw; w++) s += red[((size_t)w * GR_TB + j) * 16 + r];
        if (db) s += db[(int64_t)e * H + ti * 16 + r]; /* gpt-oss: the expert's down bias (k_moe_combine weights it) */
        ydn[(int64_t)list[(int64_t)e * T + c0 + j] * H + ti * 16 + r] = s;
    }
}

/* ---- the layout rewrite -------------------------------------------------------------------------------------- */

/* src: the stored layout (rows of C/32 9-byte blocks, row_bytes apart); dst: the tiled layout (blocks.h). One thread
 * a code word (and, for the first R * NB threads, one scale byte). */
__global__ void k_q2_tile(const uint8_t *__restrict__ src, uint8_t *__restrict__ dst, int64_t R, int64_t NB,
                          size_t row_bytes) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < R * NB * 2) {
        const int64_t tb = i >> 5, ti = tb / NB, b = tb - ti * NB;
        ((uint32_t *)dst)[i] = moet_q2_tile_word(src, row_bytes, ti, b, (int)(i & 31));
    }
    if (i < R * NB) {
        const int r = (int)(i & 15);
        const int64_t tb = i >> 4, ti = tb / NB, b = tb - ti * NB;
        dst[R * NB * 8 + i] = src[(ti * 16 + r) * row_bytes + b * 9];
    }
}

extern "C" int cu_q2_tile_repack(cu_backend *c, uint8_t *d, int64_t rows, int64_t cols, size_t row_bytes, uint8_t *tmp) {
    const int64_t NB = cols / 32, n = rows * NB * 2;
    if (CU_CHECK(c, cudaMemcpyAsync(tmp, d, (size_t)rows * row_bytes, cudaMemcpyDeviceToDevice, c->stream))) return -1;
    k_q2_tile<<<(unsigned)((n + 255) / 256), 256, 0, c->stream>>>(tmp, d, rows, NB, row_bytes);
    return CU_LAUNCHED(c, "k_q2_tile") ? -1 : 0;
}

/* src: NVFP4 rows of C/16 9-byte blocks (row_bytes apart); dst: the tiled NVFP4 layout (blocks.h). One thread per
 * (tile, 32-column block, lane): its two code words, and for lanes (s, r) = (l >> 4, l & 15) the scale of row r,
 * k-step s. */
__global__ void k_nv_tile(const uint8_t *__restrict__ src, uint8_t *__restrict__ dst, int64_t R, int64_t NB,
                          size_t row_bytes) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, n = R / 16 * NB * 32;
    if (i >= n) return;
    const int lane = (int)(i & 31);
    const int64_t tb = i >> 5, ti = tb / NB, bi = tb - ti * NB;
    ((uint2 *)dst)[i] = make_uint2(moet_nv_tile_word(src, row_bytes, ti, bi, lane, 0),
                                   moet_nv_tile_word(src, row_bytes, ti, bi, lane, 1));
    dst[(size_t)R * NB * 16 + tb * 32 + lane] = moet_nv_tile_scale(src, row_bytes, ti, bi, lane);
}

extern "C" int cu_nv_tile_repack(cu_backend *c, uint8_t *d, int64_t rows, int64_t cols, size_t row_bytes, uint8_t *tmp) {
    const int64_t NB = cols / 32, n = rows / 16 * NB * 32;
    if (CU_CHECK(c, cudaMemcpyAsync(tmp, d, (size_t)rows * row_bytes, cudaMemcpyDeviceToDevice, c->stream))) return -1;
    k_nv_tile<<<(unsigned)((n + 255) / 256), 256, 0, c->stream>>>(tmp, d, rows, NB, row_bytes);
    return CU_LAUNCHED(c, "k_nv_tile") ? -1 : 0;
}

/* ---- host side ----------------------------------------------------------------------------------------------- */

static size_t tc_smem_dec(int nw, int per_warp_red, int b, int dl, int i8 = 0) {
    return ((dl ? 512 : 256) + (size_t)nw * per_warp_red) * sizeof(float) +
           (size_t)nw * (i8 ? TC_I8_STAGE_BYTES(b / 32) : 2 * b * sizeof(__half));
}

/* The integer form of the decode kernels (quant/tile.h) where it applies: no delta, chunks of 64+ columns. On by
 * measurement (stop 30, an H100, one binary): the MoE op at the 30b shape, one token, 25.02 -> 23.38 us; 30b tg128
 * 318.4 -> 325.2 t/s, twice alternating. MOET_MOE_I8=0 keeps the f16 form (the fused block's, moe_fused.cu). */
static int tc_i8_on(int b, int dl) {
    const char *e = getenv("MOET_MOE_I8");
    return !dl && b >= 64 && !(e && e[0] == '0');
}

/* Runs KERNEL<M> for the rotation chunk b = 32 M of a width (b: the largest power of two <= 256 dividing it). */
#define TC_DISPATCH(b, KERNEL, GRID, BLOCK, SMEM, ...)                                                            \
    switch (b) {                                                                                                  \
    case 32: KERNEL<1><<<GRID, BLOCK, SMEM, c->stream>>>(__VA_ARGS__); break;                                     \
    case 64: KERNEL<2><<<GRID, BLOCK, SMEM, c->stream>>>(__VA_ARGS__); break;                                     \
    case 128: KERNEL<4><<<GRID, BLOCK, SMEM, c->stream>>>(__VA_ARGS__); break;                                    \
    default: KERNEL<8><<<GRID, BLOCK, SMEM, c->stream>>>(__VA_ARGS__); break;                                     \
    }

/* KERNEL<M, DL> through cu_launch_pdl (the decode kernels: DL, the NVFP4 delta, known at compile time). */
#define TC_DISPATCH_PDL_DL(b, KERNEL, DL, GRID, BLOCK, SMEM, ...)                                                 \
    switch (b) {                                                                                                  \
    case 32: cu_launch_pdl(c, KERNEL<1, DL, 0>, GRID, dim3(BLOCK), SMEM, __VA_ARGS__); break;                     \
    case 64: cu_launch_pdl(c, KERNEL<2, DL, 0>, GRID, dim3(BLOCK), SMEM, __VA_ARGS__); break;                     \
    case 128: cu_launch_pdl(c, KERNEL<4, DL, 0>, GRID, dim3(BLOCK), SMEM, __VA_ARGS__); break;                    \
    default: cu_launch_pdl(c, KERNEL<8, DL, 0>, GRID, dim3(BLOCK), SMEM, __VA_ARGS__); break;                     \
    }

/* The integer form (no delta) for chunks of 64 columns or more. */
#define TC_DISPATCH_PDL_I8(b, KERNEL, GRID, BLOCK, SMEM, ...)                                                     \
    switch (b) {                                                                                                  \
    case 64: cu_launch_pdl(c, KERNEL<2, 0, 1>, GRID, dim3(BLOCK), SMEM, __VA_ARGS__); break;                      \
    case 128: cu_launch_pdl(c, KERNEL<4, 0, 1>, GRID, dim3(BLOCK), SMEM, __VA_ARGS__); break;                     \
    default: cu_launch_pdl(c, KERNEL<8, 0, 1>, GRID, dim3(BLOCK), SMEM, __VA_ARGS__); break;                      \
    }

/* The same through cu_launch_pdl (kernels that follow the cu_pdl_wait rule). */
#define TC_DISPATCH_PDL(b, KERNEL, GRID, BLOCK, SMEM, ...)                                                        \
    switch (b) {                                                                                                  \
    case 32: cu_launch_pdl(c, KERNEL<1>, GRID, dim3(BLOCK), SMEM, __VA_ARGS__); break;                            \
    case 64: cu_launch_pdl(c, KERNEL<2>, GRID, dim3(BLOCK), SMEM, __VA_ARGS__); break;                            \
    case 128: cu_launch_pdl(c, KERNEL<4>, GRID, dim3(BLOCK), SMEM, __VA_ARGS__); break;                           \
    default: cu_launch_pdl(c, KERNEL<8>, GRID, dim3(BLOCK), SMEM, __VA_ARGS__); break;                            \
    }

/* cu_carveout_max of KERNEL<M, DL, I8> for the chunk width B (TC_DISPATCH's cases) */
#define TC_CARVE_M(B, KERNEL, DL, I8)                                                                                 \
    switch (B) {                                                                                                     \
    case 64: cu_carveout_max(c, (const void *)KERNEL<2, DL, I8>); break;                                             \
    case 128: cu_carveout_max(c, (const void *)KERNEL<4, DL, I8>); break;                                            \
    default: cu_carveout_max(c, (const void *)KERNEL<8, DL, I8>); break;                                             \
    }

static int g_tc_attr_dev = -1;

/* The router's forms for NT tokens (one warp a row, split rows): their dynamic shared memory limit */
template <int NT> static int tc_attrs_rt(cu_backend *c) {
    return CU_CHECK(c, cudaFuncSetAttribute(k_tc_router<NT>, cudaFuncAttributeMaxDynamicSharedMemorySize, 160 * 1024)) ||
           CU_CHECK(c, cudaFuncSetAttribute(k_tc_router_split<NT>, cudaFuncAttributeMaxDynamicSharedMemorySize, 160 * 1024));
}

template <int M> static int tc_attrs_m(cu_backend *c, int big) {
    return CU_CHECK(c, cudaFuncSetAttribute(k_tc_gate_up_grp<M, 0>, cudaFuncAttributeMaxDynamicSharedMemorySize, big)) ||
           CU_CHECK(c, cudaFuncSetAttribute(k_tc_down_grp<M, 0>, cudaFuncAttributeMaxDynamicSharedMemorySize, big)) ||
           CU_CHECK(c, cudaFuncSetAttribute(k_tc_gate_up_grp<M, 1>, cudaFuncAttributeMaxDynamicSharedMemorySize, big)) ||
           CU_CHECK(c, cudaFuncSetAttribute(k_tc_down_grp<M, 1>, cudaFuncAttributeMaxDynamicSharedMemorySize, big));
}

/* the integer form's staging is 2.1 KB a warp: 24 down warps need more than the default 48 KB */
template <int M> static int tc_attrs_i8(cu_backend *c, int big) {
    return CU_CHECK(c, cudaFuncSetAttribute(k_tc_gate_up<M, 0, 1>, cudaFuncAttributeMaxDynamicSharedMemorySize, big)) ||
           CU_CHECK(c, cudaFuncSetAttribute(k_tc_down<M, 0, 1>, cudaFuncAttributeMaxDynamicSharedMemorySize, big));
}

static int tc_attrs(cu_backend *c) {
    if (g_tc_attr_dev == c->device) return 0;
    const int big = 96 * 1024;
    if (tc_attrs_rt<1>(c) || tc_attrs_rt<2>(c) || tc_attrs_rt<3>(c) || tc_attrs_rt<4>(c) ||
        tc_attrs_m<1>(c, big) || tc_attrs_m<2>(c, big) || tc_attrs_m<4>(c, big) || tc_attrs_m<8>(c, big) ||
        tc_attrs_i8<2>(c, big) || tc_attrs_i8<4>(c, big) || tc_attrs_i8<8>(c, big))
        return -1;
    g_tc_attr_dev = c->device;
    return 0;
}

/* CTAs of the integer-form k_tc_down an SM holds at nw warps (the streamed kernels take over where its grid is more
 * than one wave); the last answer kept. */
static int tc_occ_down(cu_backend *c, int b, int nw) {
    static int last_b = -1, last_nw = -1, last_dev = -1, last = 1;
    if (b == last_b && nw == last_nw && c->device == last_dev) return last;
    int n = 0;
    const size_t sm = tc_smem_dec(nw, 16, b, 0, 1);
    cudaError_t e;
    switch (b) {
    case 64: e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, k_tc_down<2, 0, 1>, nw * 32, sm); break;
    case 128: e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, k_tc_down<4, 0, 1>, nw * 32, sm); break;
    default: e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, k_tc_down<8, 0, 1>, nw * 32, sm); break;
    }
    if (e != cudaSuccess) { cudaGetLastError(); n = 1; }
    last_b = b; last_nw = nw; last_dev = c->device; last = n > 0 ? n : 1;
    return last;
}

void cu_moe_tc_decode(cu_backend *c, const moet_moe_args *a, const cu_expert_table *tab, const cu_expert_table *dtab,
                      float *logits, float *act, const cu_moe_oss *ox) {
    const int64_t T = a->n_tok, H = a->hidden, F = a->ffn;
    const int32_t E = a->n_experts, K = a->n_used;
    const moet_weight *rw = a->router;
    const uint8_t *rd = cu_weight_mat(c, rw);
    if (!rd || tc_attrs(c)) return;
    const float *nrm = NULL; /* the fused pre-norm: the router kernel normalises x and writes h */
    if (a->norm_w && !(nrm = (const float *)cu_weight(c, a->norm_w, (size_t)H * sizeof(float)))) return;
    const float *xin = a->norm_w ? a->h : a->x;
    if (T > TC_RT_T) { cu_fail(c, cudaErrorInvalidValue, "moe tc decode: too many tokens", __FILE__, __LINE__); return; }
    const size_t rsm = ((size_t)T * H + 2 * (size_t)T * E) * sizeof(float);
    if (rsm > 160 * 1024) { cu_fail(c, cudaErrorInvalidValue, "moe tc decode: router input exceeds shared memory", __FILE__, __LINE__); return; }
    /* 16 warps a CTA for wide rows (the pre-norm's elements a thread are the CTA's latency chain), 4 for narrow ones
     * (moe-mini-a, width 256: a 512-thread CTA's barriers cost more than the 2 elements a thread they save) */
    const int rnw = H >= 1024 ? TC_RT_W : 4;
    /* Split rows: S warps a router row, each with its share of the row in registers before the PDL wait, where one
     * warp cannot hold the row: a warp prefetches TC_RT_U 16-byte chunks a lane (4 KB, a bf16 row of 2048), so at
     * hidden 4096 half of each row was requested only after the wait, on the layer's critical path (the 235b timeline,
     * stop 36, H200: the router's dot 3.9 us after its pre-norm, the 30b's, whole rows in flight, 2.1 us). S = the
     * smallest power of two that puts a bf16 row's chunks in flight (S = 1 otherwise, and for other types), at most
     * rnw. The parts add in part order: another rounding of the logits than one warp's sum. Timed at stop 39 (an
     * H100, tg64, two rounds in each of two calls): S = 2 at 235b 1.009x and 1.002x (the second with the x permutation
     * on both sides); S = 2 at 30b, where one warp holds the row, 0.987x and 0.991x: hence only where it does not.
     * MOET_RT_SPLIT=S forces S (1: one warp a row). */
    int rsplit = 1;
    if (rw->type == MOET_TYPE_BF16 && H % 256 == 0) /* H / 8 chunks a row, 32 TC_RT_U in flight a warp */
        while (rsplit < rnw && (int64_t)rsplit * 32 * TC_RT_U < H / 8) rsplit *= 2;
    const char *rse = getenv("MOET_RT_SPLIT");
    if (rse) rsplit = atoi(rse);
    if (rsplit < 1 || rsplit > rnw || (rsplit & (rsplit - 1))) rsplit = 1;
    const int rpc = rnw / rsplit; /* router rows a CTA */
    /* Who routes. The router's last CTA (ticket) meant a fence, an atomic and one CTA re-reading every logit on the
     * layer's critical path (~40% of the router's stall samples at the 30b shape), so each gate/up CTA routes its
     * own token from the logits instead: one short chain, in parallel (30b decode 1.07x on an H100). Stop 25 kept
     * the router routing where gate/up's grid takes two waves (each wave routes again); the A/B in one binary (stop
     * 26, H100) says otherwise: 30b with the delta (two waves) 1.037x the decode speed, 235b (768 CTAs) 1.010x.
     * MOET_ROUTE_GU=0 / =1 force either; gate/up also needs E logits and their softmax beside its staging. */
    const char *rg = getenv("MOET_ROUTE_GU");
    /* The sigmoid router: its own launch (k_route_sigmoid) by default. Routing in gate/up (MOET_ROUTE_GU=1) was one
     * warp's serial chain in every CTA (moe_route_sig_warp: K picks of shuffle rounds): at GLM-4.5-Air's shape
     * gate/up took 1.27x its time and decode ran at 0.988x (an H100, stop 26, one binary). Stop 29 made it
     * rank-based (tc_route_sig_warps, bit-identical picks and weights); until its A/B has run it stays opt-in. */
    cu_route_sig rs;
    if (!cu_route_sig_of(c, a, &rs)) return;
    const int sig = rs.on;
    /* gpt-oss (ox): the router's bias, then its own top-k softmax launch, as moe.cu's per-slot path routes */
    const int tks = ox != NULL || a->scoring == MOET_ROUTER_TOPK_SOFTMAX;
    const int route_gu = !tks && E <= TC_GU_MAX_E && (sig ? rg && rg[0] == '1' : !(rg && rg[0] == '0'));
    const cu_moe_oss nox = {NULL, NULL, NULL, 0.f}, oxv = ox ? *ox : nox;
    const int bh = cu_hadamard_block(H), bf = cu_hadamard_block(F);
    const cu_tc_dpre nodp = {NULL, NULL, 0, 0, 0, 0u};
    /* Gate/up's x chunks staged once. Every gate/up CTA (F / 16 of them a slot) rotated and staged the same x
     * chunks itself, ~40% of a gate/up warp's instructions in the integer form; extra CTAs of the router (its
     * pre-normed x is in their shared memory already) now do each chunk once, beside the router rows, into the MoE
     * scratch after act (cu_moe_scratch_bytes), and gate/up reads them (bit-identical). Where every gate/up matrix
     * shares one rotation (tab->gu_uniform: the quantizer's seed is per layer). MOET_MOE_PRESTAGE=0 for the A/B. */
    const char *pe = getenv("MOET_MOE_PRESTAGE");
    const int npre = tc_i8_on(bh, dtab != NULL) && tab->gu_uniform && !(pe && pe[0] == '0') ? (int)(T * (H / bh)) : 0;
    uint8_t *sbase = (uint8_t *)(((uintptr_t)(act + (size_t)T * K * F) + 15) & ~(uintptr_t)15);
    uint8_t *stg = npre ? sbase : NULL;
    /* Down's inputs likewise, by the last gate/up CTA of each chunk (cu_tc_dpre): each down CTA rotated and staged
     * all K chunks of its token's activations itself, ~60% of a down warp's instructions. But a down warp with a
     * single (pick, chunk) item rotates and stages while its weights are on their way, and the ticket and the last
     * CTA's staging lengthen gate/up's tail: measured (H100, stop 30, one binary) 30b (24 items, 24 warps) tg128
     * 340 t/s without it, 325 with it; 235b (48 items) 79.6 -> 83.2. So by default only where a down warp has more
     * than one item; MOET_MOE_PRESTAGE_DN=0 / =1 force it (MOET_MOE_PRESTAGE=0 turns both off). */
    const char *pd = getenv("MOET_MOE_PRESTAGE_DN");
    const int dn_items = K * (int)(F / bf), dn_warps = tc_warps(dn_items, TC_DN_W);
    const int dn_want = pd && pd[0] == '1' ? 1 : pd && pd[0] == '0' ? 0 : dn_items > dn_warps;
    const int npd = dn_want && tc_i8_on(bf, dtab != NULL) && tab->down_uniform && !(pe && pe[0] == '0') &&
                    T * K * (F / bf) <= CU_DN_TICKETS ? (int)(T * K * (F / bf)) : 0;
    const cu_tc_dpre dpre = {npd ? sbase + (cu_moe_tc_stage_bytes(T, H, 0, 0) & ~(size_t)15) : NULL, c->dn_tickets,
                             (int32_t)bf, tab->down_rotated, npd, tab->down_seed};
    const dim3 rgrid((unsigned)((E + rpc - 1) / rpc + (npre + rnw - 1) / rnw)), rblock(rnw * 32);
#define TC_ROUTER_GO(NT)                                                                                             \
    cu_launch_pdl(c, rsplit > 1 ? k_tc_router_split<NT> : k_tc_router<NT>, rgrid, rblock, rsm, a->x, H, E, K,        \
                  a->norm_topk, rd, rw->type, rw->row_bytes,                                                         \
                  rw->qscale, rw->qbeta, logits, c->ticket, a->topk_ids, a->topk_w, nrm, a->eps, a->h,      \
                  !route_gu && !sig && !tks, stg, npre ? bh : 0, tab->gu_rotated, tab->gu_seed, rsplit)
    switch (T) {
    case 1: TC_ROUTER_GO(1); break;
    case 2: TC_ROUTER_GO(2); break;
    case 3: TC_ROUTER_GO(3); break;
    default: TC_ROUTER_GO(4); break;
    }
#undef TC_ROUTER_GO
    if (CU_LAUNCHED(c, "k_tc_router")) return;
    if (sig && !route_gu) { /* its own launch */
        cu_moe_route_sigmoid(c, a, logits, T);
        if (c->err[0]) return;
    }
    if (tks) {
        if (a->router_lbias) cu_add(&c->base, logits, NULL, a->router_lbias, T, E);
        cu_moe_route_topk(c, a, logits, T);
        if (c->err[0]) return;
    }
    const int nwg = tc_warps(H / bh, TC_GU_W), nwd = tc_warps(K * (F / bf), dtab ? TC_DN_W / 2 : TC_DN_W);
    const dim3 ggu((unsigned)(F / 16), (unsigned)(T * K)), gdn((unsigned)(H / 16), (unsigned)T);
    const cu_mat *dt = dtab ? dtab->table : NULL;
    const size_t rsm_gu = route_gu ? 2 * (size_t)E * sizeof(float) : 0; /* the logits and their softmax */
    const float *rlg = route_gu ? logits : NULL;
    /* where the legacy grid takes two waves: several tiles a CTA, weights streamed into shared memory (moe_st.cu) */
    int st_gu = 0;
    if (tc_i8_on(bh, dtab != NULL) && tab->aligned16) {
        const cu_moe_st_gu g = {xin, H, F, K, (int32_t)T, E, bh, nwg, tab->type, tab->gu_rotated, a->norm_topk, npre,
                                tab->gu_seed, tab->table, a->topk_ids, act, a->topk_w, rlg, rs, oxv, stg, dpre};
        if ((st_gu = cu_moe_st_gate_up(c, &g, TC_GU_CTAS(0))) < 0) return;
    }
    if (st_gu) { /* launched (moe_st.cu) */
    } else if (tc_i8_on(bh, dtab != NULL))
        TC_DISPATCH_PDL_I8(bh, k_tc_gate_up, ggu, nwg * 32, tc_smem_dec(nwg, 32, bh, 0, 1) + rsm_gu, xin, H, F, K,
                           tab->table, tab->type, tab->gu_rotated, tab->gu_seed, a->topk_ids, act, dt, rlg, E,
                           a->norm_topk, a->topk_w, rs, oxv, stg, npre, dpre, 0.f)
    else if (dtab)
        TC_DISPATCH_PDL_DL(bh, k_tc_gate_up, 1, ggu, nwg * 32, tc_smem_dec(nwg, 32, bh, 1) + rsm_gu, xin, H, F, K,
                           tab->table, tab->type, tab->gu_rotated, tab->gu_seed, a->topk_ids, act, dt, rlg, E,
                           a->norm_topk, a->topk_w, rs, oxv, (const uint8_t *)NULL, 0, nodp, a->delta_pick)
    else
        TC_DISPATCH_PDL_DL(bh, k_tc_gate_up, 0, ggu, nwg * 32, tc_smem_dec(nwg, 32, bh, 0) + rsm_gu, xin, H, F, K,
                           tab->table, tab->type, tab->gu_rotated, tab->gu_seed, a->topk_ids, act, dt, rlg, E,
                           a->norm_topk, a->topk_w, rs, oxv, (const uint8_t *)NULL, 0, nodp, 0.f)
    if (CU_LAUNCHED(c, "k_tc_gate_up")) return;
    const int32_t dne = cu_mv_early_next(); /* down lets the next kernel launch at its start (matmul.cu) */
    if (dne && cu_mv_carve_down()) { /* ... which needs the largest shared split to fit beside it (cuda_int.h) */
        if (tc_i8_on(bf, dtab != NULL)) TC_CARVE_M(bf, k_tc_down, 0, 1)
        else if (dtab) TC_CARVE_M(bf, k_tc_down, 1, 0)
        else TC_CARVE_M(bf, k_tc_down, 0, 0)
    }
    int st_dn = 0;
    if (tc_i8_on(bf, dtab != NULL) && tab->aligned16) {
        const cu_moe_st_dn d = {act, H, F, K, (int32_t)T, bf, nwd, tab->type, a->accumulate, npd, dne, tab->table,
                                a->topk_ids, a->topk_w, oxv.db, a->y, (const uint8_t *)dpre.stg};
        if ((st_dn = cu_moe_st_down(c, &d, tc_occ_down(c, bf, nwd))) < 0) return;
    }
    if (st_dn) { /* launched (moe_st.cu) */
    } else if (tc_i8_on(bf, dtab != NULL))
        TC_DISPATCH_PDL_I8(bf, k_tc_down, gdn, nwd * 32, tc_smem_dec(nwd, 16, bf, 0, 1), act, H, F, K, tab->table,
                           tab->type, a->topk_ids, a->topk_w, a->y, a->accumulate, dt, oxv.db, (const uint8_t *)dpre.stg,
                           npd, dne, 0.f)
    else if (dtab)
        TC_DISPATCH_PDL_DL(bf, k_tc_down, 1, gdn, nwd * 32, tc_smem_dec(nwd, 16, bf, 1), act, H, F, K, tab->table,
                           tab->type, a->topk_ids, a->topk_w, a->y, a->accumulate, dt, oxv.db, (const uint8_t *)NULL, 0, dne, a->delta_pick)
    else
        TC_DISPATCH_PDL_DL(bf, k_tc_down, 0, gdn, nwd * 32, tc_smem_dec(nwd, 16, bf, 0), act, H, F, K, tab->table,
                           tab->type, a->topk_ids, a->topk_w, a->y, a->accumulate, dt, oxv.db, (const uint8_t *)NULL, 0, dne, 0.f)
    CU_LAUNCHED(c, "k_tc_down");
}

/* cuda_int.h: the decode router (one token; 2: its split-row form) or the integer-form down (1: 256-column chunks) */
extern "C" int cu_moe_tc_regs(int down) {
    cudaFuncAttributes fa;
    const cudaError_t e = down == 1 ? cudaFuncGetAttributes(&fa, k_tc_down<8, 0, 1>)
                          : down == 2 ? cudaFuncGetAttributes(&fa, k_tc_router_split<1>)
                                      : cudaFuncGetAttributes(&fa, k_tc_router<1>);
    if (e != cudaSuccess) { cudaGetLastError(); return -1; }
    return fa.numRegs;
}

/* The MoE scratch the decode path's staged gate/up chunks take after act (cu_moe_tc_decode), T tokens of width H. */
extern "C" size_t cu_moe_tc_stage_bytes(int64_t T, int64_t H, int64_t F, int32_t K) {
    return (size_t)T * ((size_t)H / 32 * 68 * 4 + (size_t)H / 64 * sizeof(float)) + 16 +
           (size_t)T * K * ((size_t)F / 32 * 68 * 4 + (size_t)F / 64 * sizeof(float)) + 16;
}

static size_t tc_smem_grp(int nw, int red_per_warp, int b, int dl) {
    return ((dl ? 512 : 256) + (size_t)nw * red_per_warp) * sizeof(float) + (size_t)nw * GR_TB * 2 * b * sizeof(__half);
}

/* KERNEL<M, DL> by the chunk width b, plain launches (the grouped kernels). */
#define TC_DISPATCH_DL(b, KERNEL, DL, GRID, BLOCK, SMEM, ...)                                                     \
    switch (b) {                                                                                                  \
    case 32: KERNEL<1, DL><<<GRID, BLOCK, SMEM, c->stream>>>(__VA_ARGS__); break;                                 \
    case 64: KERNEL<2, DL><<<GRID, BLOCK, SMEM, c->stream>>>(__VA_ARGS__); break;                                 \
    case 128: KERNEL<4, DL><<<GRID, BLOCK, SMEM, c->stream>>>(__VA_ARGS__); break;                                \
    default: KERNEL<8, DL><<<GRID, BLOCK, SMEM, c->stream>>>(__VA_ARGS__); break;                                 \
    }

void cu_moe_tc_gate_up_grp(cu_backend *c, const cu_expert_table *tab, const cu_expert_table *dtab, const float *xr,
                           const float *x, int64_t T, int64_t H, int64_t F, int32_t K, const int32_t *count,
                           const int32_t *n_items, const int32_t *items, const int32_t *list, unsigned n_chunks,
                           float *act, const cu_moe_oss *ox, cu_dpick dp) {
    const cu_moe_oss nox = {NULL, NULL, NULL, 0.f}, oxv = ox ? *ox : nox;
    if (tc_attrs(c)) return;
    const int b = cu_hadamard_block(H), nw = tc_warps(H / b, TC_GRP_W);
    const dim3 grid((unsigned)(F / 16), n_chunks);
    if (dtab)
        TC_DISPATCH_DL(b, k_tc_gate_up_grp, 1, grid, nw * 32, tc_smem_grp(nw, 2 * GR_TB * 16, b, 1), xr, T, H, F, K,
                       tab->table, tab->type, count, n_items, items, list, act, x, dtab->table, oxv, dp)
    else
        TC_DISPATCH_DL(b, k_tc_gate_up_grp, 0, grid, nw * 32, tc_smem_grp(nw, 2 * GR_TB * 16, b, 0), xr, T, H, F, K,
                       tab->table, tab->type, count, n_items, items, list, act, x, (const cu_mat *)NULL, oxv, dp)
    CU_LAUNCHED(c, "k_tc_gate_up_grp");
}

void cu_moe_tc_down_grp(cu_backend *c, const cu_expert_table *tab, const cu_expert_table *dtab, const float *act,
                        int64_t T, int64_t H, int64_t F, const int32_t *count, const int32_t *n_items,
                        const int32_t *items, const int32_t *list, unsigned n_chunks, float *ydn,
                        const cu_moe_oss *ox, cu_dpick dp) {
    const float *db = ox ? ox->db : NULL;
    if (tc_attrs(c)) return;
    const int b = cu_hadamard_block(F), nw = tc_warps(F / b, TC_GRP_W);
    const dim3 grid((unsigned)(H / 16), n_chunks);
    if (dtab)
        TC_DISPATCH_DL(b, k_tc_down_grp, 1, grid, nw * 32, tc_smem_grp(nw, GR_TB * 16, b, 1), act, T, H, F, tab->table,
                       tab->type, count, n_items, items, list, ydn, dtab->table, db, dp)
    else
        TC_DISPATCH_DL(b, k_tc_down_grp, 0, grid, nw * 32, tc_smem_grp(nw, GR_TB * 16, b, 0), act, T, H, F, tab->table,
                       tab->type, count, n_items, items, list, ydn, (const cu_mat *)NULL, db, dp)
    CU_LAUNCHED(c, "k_tc_down_grp");
}
