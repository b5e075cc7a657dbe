/*
 * moe_st.cu — the decode gate/up and down of moe_tc.cu (the integer form, no delta) for shapes whose grid would take
 * more than one wave: several 16-row tiles a CTA, the weights streamed into shared memory.
 *
 * Why: k_tc_gate_up is one CTA per (16-row tile, slot), k_tc_down one per (16-row tile, token), each warp holding
 * its chunk's weight words in registers. At qwen3-235b-a22b's shape that is 768 gate/up CTAs (3 an SM: 396 a wave)
 * and 256 down CTAs (24 warps: 1 an SM), two waves each, and the timeline (stop 32, trace build, H100) shows both
 * waves paying the whole chain again: gate/up routes 4.5 us, then its products take 10 us, twice (33 us a layer for
 * 28 MB, 0.86 TB/s); down 19 us for 14 MB. Here a CTA takes TP tiles of the same slot (gate/up) or token (down),
 * so the grid is one wave, and each warp's work units (a chunk of one tile: gate + up, or one pick's down) arrive by
 * cp.async into a ring of ST_D slots a warp: the next unit's bytes are in flight while this one is multiplied,
 * and no weight word waits in a register, so the register budget (3 gate/up CTAs an SM) holds.
 *
 * Bit for bit the legacy kernels' results: the same warps (tc_warps), each warp the same chunks (gate/up) or
 * (pick, chunk) items (down) in the same order, each unit through the same tc_i8_tile / tc_i8_chunk_done into one
 * running sum a tile, the warps' partials added in warp order. Only the place the weight words come from changed
 * (shared memory: the scale byte of row r of block bi is byte 16 bi + r of the unit's scales, which tc_sc shuffled
 * round before). test_ops checks it (MOET_MOE_ST=1 against the legacy kernels, the default at its shapes).
 * Measured at the 235b shape (stop 33, an H100, trace build): gate/up 33.7 -> 28.9 us a layer, down 18.9 -> 16.5,
 * tg64 +4.0%. Less than one wave's worth: a gate/up CTA's warps take 16 us over their four units once routed
 * (mark 0 -> 1), likely bound by instruction issue rather than bytes (an estimate, ~60 K warp instructions an SM
 * for the token's 28 MB at ~40 a 16 x 32 block; docs/performance.md "Stop 33"). Since stop 34 a staged chunk's B
 * fragments are built once a block for all the units that share them (st_units_mac: gate and up of a tile, down's
 * two tiles), as the legacy kernels do: 14-31% fewer instructions a mma, and no faster (stop 35, an H100: tg64
 * even with stop 33's build). Nsight Compute (stop 35, 235b, each launch alone) says why: both kernels are latency
 * bound, not issue bound: gate/up 29.6 us for 28 MB, issue slots 53% busy, 10.9 cycles between a warp's instructions
 * with 5.8 warps a scheduler (37.5% occupancy: registers and shared memory); down 17.6 us, 43%, 13.7 cycles, a third
 * of them waiting on global loads (its prestaged inputs: now cp.async'd with the weights, st_dncp).
 * Bytes and FLOPs as moe_tc.cu's decode: per token K x 3 x F x H x 9/32 and 2 x K x 3 x F x H.
 */
#include <math.h>
#include <stdlib.h>

#include "backend/cuda/moe_tc.cuh"

#define ST_D 2 /* units in flight a warp (ring slots) */

__device__ __forceinline__ void st_cp16(void *dst, const void *src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(cu_smem_u32(dst)), "l"(src) : "memory");
}
__device__ __forceinline__ void st_commit(void) { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N> __device__ __forceinline__ void st_wait(void) { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }

/* Bytes of one matrix's unit: M blocks of tile codes (128 bytes each), then their 16 scale bytes each. */
template <int M> struct st_unit {
    static constexpr int bytes = M * 144;
};

/* The warp's copy of one unit of matrix m (tile ti, chunk c of M blocks) to dst: 9 M pieces of 16 bytes. */
template <int M>
__device__ __forceinline__ void st_issue_mat(unsigned char *dst, const cu_mat &m, int64_t rows, int64_t NB, int64_t ti,
                                             int c) {
    const int64_t tb = ti * NB + (int64_t)c * M;
    const unsigned char *cw = (const unsigned char *)tc_codes(m) + tb * 128, *sw = tc_scales(m, rows, NB) + tb * 16;
    for (int i = threadIdx.x & 31; i < 9 * M; i += 32) st_cp16(dst + 16 * i, i < 8 * M ? cw + 16 * i : sw + 16 * (i - 8 * M));
}

/* NU matrices' units (gate and up of one tile, or one pick's down of NU tiles) against the staged chunk: tc_i8_tile
 * over their M blocks (scale bytes read in place), block bi's B fragments built once for all NU (the legacy kernels
 * build them once a block too). Each accumulator still takes its blocks in order: the same sums as one unit at a time. */
template <int M, int NU>
__device__ __forceinline__ void st_units_mac(const unsigned char *const u[NU], const uint32_t *W8, const int32_t *X8,
                                             const float *lut, float cacc[NU][4]) {
    const int lane = threadIdx.x & 31, g = lane >> 2;
#pragma unroll 2 /* full unrolling held all units' loads at once: 460 bytes spilled at M = 8 (stop 33) */
    for (int bi = 0; bi < M; bi++) {
        uint32_t bf[2][2];
        int32_t ci[4];
        tc_i8_bfrag(W8, X8, bi, bf, ci);
#pragma unroll
        for (int n = 0; n < NU; n++) {
            const uint32_t *cw = (const uint32_t *)u[n];
            const unsigned char *sc = u[n] + 128 * M;
            tc_i8_tile(cw[32 * bi + lane], bf, ci, lut[sc[16 * bi + g]], lut[sc[16 * bi + g + 8]], cacc[n]);
        }
    }
}

/* ---- gate/up: TP tiles of one slot a CTA ----------------------------------------------------------------------
 * Grid (F / 16 / TP, T K). Dynamic shared memory: lut [256] | red [nw][2 TP][16] | staging [nw] | ring [nw][ST_D]
 * units (gate then up) | the routing's 2 E floats. (Stop 36's cp.async of the prestaged inputs with each chunk's
 * first unit, as down's: 1.5% slower at 235b on an H100, stop 37; taken out.) */
template <int M, int TP>
__global__ void __launch_bounds__(TC_GU_W * 32, TC_GU_CTAS(0))
k_st_gate_up(const float *x, int64_t H, int64_t F, int32_t K, const cu_mat *__restrict__ table, int32_t type,
             int32_t rot, uint32_t seed, int32_t *topk_ids, float *__restrict__ act, const float *rlogits, int32_t E,
             int32_t norm_topk, float *topk_w, cu_route_sig rs, cu_moe_oss ox, const uint8_t *pre, int32_t npre,
             cu_tc_dpre dp) {
    CU_TRACE(CU_TK_GATE_UP_ST << 8 | M << 2 | TP);
    extern __shared__ __align__(16) unsigned char smem[];
    constexpr int UB = 2 * st_unit<M>::bytes, SB = (int)TC_I8_STAGE_BYTES(M);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
    const int slot = blockIdx.y, tok = slot / K;
    const int64_t ti0 = (int64_t)blockIdx.x * TP, NB = H / 32;
    const int nch = (int)(H / (32 * M));
    float *lut = (float *)smem, *red = lut + 256;
    uint32_t *W8 = (uint32_t *)(red + (size_t)nw * 2 * TP * 16 + (size_t)warp * SB / 4);
    int32_t *X8 = (int32_t *)(W8 + M * 64);
    unsigned char *rings = (unsigned char *)(red + (size_t)nw * 2 * TP * 16) + (size_t)nw * SB;
    unsigned char *ring = rings + (size_t)warp * ST_D * UB;
    tc_lut_fill(lut);
    cu_pdl_wait();
    CU_TRACE_WAITED();
    __syncthreads();
    const int32_t e = tc_gu_route(rlogits, (float *)(rings + (size_t)nw * ST_D * UB), tok, slot, E, K, norm_topk, rs,
                                  topk_ids, topk_w);
    CU_TRACE_MARK(0); /* routed */
    const cu_mat gm = table[e * 3], um = table[e * 3 + 1];
    float Ag, Bg, Au, Bu;
    tc_ab(type, gm.qbeta, &Ag, &Bg);
    tc_ab(type, um.qbeta, &Au, &Bu);
    const int nci = warp < nch ? (nch - warp + nw - 1) / nw : 0, U = nci * TP; /* the warp's chunks and units */
    auto issue = [&](int u) {
        if (u < U) {
            const int c = warp + (u / TP) * nw;
            unsigned char *d = ring + (size_t)(u % ST_D) * UB;
            st_issue_mat<M>(d, gm, F, NB, ti0 + u % TP, c);
            st_issue_mat<M>(d + st_unit<M>::bytes, um, F, NB, ti0 + u % TP, c);
        }
        st_commit();
    };
#pragma unroll
    for (int u = 0; u < ST_D; u++) issue(u);
    float tg[TP][4], tu[TP][4];
#pragma unroll
    for (int j = 0; j < TP; j++)
#pragma unroll
        for (int i = 0; i < 4; i++) tg[j][i] = tu[j][i] = 0.f;
    for (int ci = 0; ci < nci; ci++) {
        const int c = warp + ci * nw;
        float p2;
        if (pre) { /* staged once by the router's extra CTAs (tc_prestage) */
            p2 = tc_i8_fetch_staged<M>(pre, tok * nch + c, npre, W8);
        } else {
            float v[8];
            cu_rot_chunk_t<M>(v, x + (int64_t)tok * H, rot, seed, c, gm.signs);
            p2 = tc_stage_i8<M>(v, W8, X8);
        }
        __syncwarp();
#pragma unroll
        for (int j = 0; j < TP; j++) {
            const int u = ci * TP + j;
            st_wait<ST_D - 1>();
            __syncwarp(); /* every lane's pieces of unit u landed */
            const unsigned char *ub = ring + (size_t)(u % ST_D) * UB;
            const unsigned char *const us[2] = {ub, ub + st_unit<M>::bytes};
            float cgu[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
            st_units_mac<M, 2>(us, W8, X8, lut, cgu);
            tc_i8_chunk_done(gm.qscale * p2, Ag, Bg, cgu[0], tg[j]);
            tc_i8_chunk_done(um.qscale * p2, Au, Bu, cgu[1], tu[j]);
            __syncwarp(); /* its slot read by every lane */
            issue(u + ST_D);
        }
    }
    st_wait<0>();
    CU_TRACE_MARK(1); /* the products done */
    cu_pdl_trigger();
#pragma unroll
    for (int j = 0; j < TP; j++) {
        float ag[2], au[2];
        tc_i8_rows(tg[j], ag);
        tc_i8_rows(tu[j], au);
        if ((lane & 3) == 0) {
            const int g = lane >> 2;
            red[((warp * TP + j) * 2 + 0) * 16 + g] = ag[0];
            red[((warp * TP + j) * 2 + 0) * 16 + g + 8] = ag[1];
            red[((warp * TP + j) * 2 + 1) * 16 + g] = au[0];
            red[((warp * TP + j) * 2 + 1) * 16 + g + 8] = au[1];
        }
    }
    __syncthreads();
    if (threadIdx.x < 16 * TP) {
        const int j = threadIdx.x >> 4, r = threadIdx.x & 15;
        float sg = 0.f, su = 0.f;
        for (int w = 0; w < nw; w++) { sg += red[((w * TP + j) * 2) * 16 + r]; su += red[((w * TP + j) * 2 + 1) * 16 + r]; }
        const int64_t row = (ti0 + j) * 16 + r;
        act[(int64_t)slot * F + row] = tc_act(sg, su, ox, (int64_t)e * F + row);
    }
    if (dp.stg) tc_dpre_finish(dp, slot, ti0 * 16, 16 * TP, act, F);
}

/* ---- down + combine: TP tiles of one token a CTA --------------------------------------------------------------
 * Grid (H / 16 / TP, T). Dynamic shared memory: lut [256] | red [nw][TP][16] | staging [nw][1, or ST_D with the
 * inputs cp.async'd (cpst)] | ring [nw][ST_D]. */
template <int M, int TP>
__global__ void __launch_bounds__(TC_DN_W * 32)
k_st_down(const float *act, int64_t H, int64_t F, int32_t K, const cu_mat *__restrict__ table, int32_t type,
          const int32_t *topk_ids, const float *topk_w, float *__restrict__ y, int accum, const float *db,
          const uint8_t *pre, int32_t npre, int32_t early, int32_t cpst) {
    CU_TRACE(CU_TK_DOWN_ST << 8 | M << 2 | TP);
    extern __shared__ __align__(16) unsigned char smem[];
    __shared__ cu_mat dms[MOE_MAX_K];
    __shared__ float wks[MOE_MAX_K];
    constexpr int UB = TP * st_unit<M>::bytes, SB = (int)TC_I8_STAGE_BYTES(M);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
    const int tok = blockIdx.y;
    const int64_t ti0 = (int64_t)blockIdx.x * TP, NB = F / 32;
    const int nch = (int)(F / (32 * M)), n_items = K * nch;
    /* cp: each item's prestaged input comes by cp.async with its weights, one staging slot a ring slot (cpst, with
     * the prestaged inputs, and at most 32 items a warp: their 2^e are read at the start, one a lane) */
    const int cp = cpst && pre && (n_items + nw - 1) / nw <= 32, NS = cp ? ST_D : 1;
    float *lut = (float *)smem, *red = lut + 256;
    uint32_t *W8s = (uint32_t *)(red + (size_t)nw * TP * 16) + (size_t)warp * NS * (SB / 4);
    unsigned char *ring = (unsigned char *)(red + (size_t)nw * TP * 16) + (size_t)nw * NS * SB + (size_t)warp * ST_D * UB;
    tc_lut_fill(lut);
    if (early) cu_pdl_trigger(); /* as k_tc_down: the next kernel may launch beside this one */
    cu_pdl_wait();
    CU_TRACE_WAITED();
    if (threadIdx.x < K) { /* the token's picks: their down matrices and router weights, once a CTA */
        const int32_t e = __ldcg(topk_ids + tok * K + threadIdx.x);
        dms[threadIdx.x] = table[e * 3 + 2];
        wks[threadIdx.x] = __ldcg(topk_w + tok * K + threadIdx.x);
    }
    __syncthreads();
    CU_TRACE_MARK(0); /* the picks known */
    const int nli = warp < n_items ? (n_items - warp + nw - 1) / nw : 0;
    float p2l = 0.f; /* cp: lane li's item's 2^e */
    if (cp && lane < nli) {
        const int it = warp + lane * nw, k = it / nch;
        p2l = __ldcg((const float *)(pre + (size_t)npre * SB) + (tok * K + k) * nch + (it - k * nch));
    }
    auto issue = [&](int li) { /* item li's unit: its TP tiles (and with cp its staged input) */
        if (li < nli) {
            const int it = warp + li * nw, k = it / nch;
            if (cp) {
                const unsigned char *src = pre + (size_t)((tok * K + k) * nch + (it - k * nch)) * SB;
                unsigned char *dst = (unsigned char *)(W8s + (size_t)(li % ST_D) * (SB / 4));
                for (int i = lane; i < SB / 16; i += 32) st_cp16(dst + 16 * i, src + 16 * i);
            }
#pragma unroll
            for (int j = 0; j < TP; j++)
                st_issue_mat<M>(ring + (size_t)(li % ST_D) * UB + j * st_unit<M>::bytes, dms[k], H, NB, ti0 + j,
                                it - k * nch);
        }
        st_commit();
    };
#pragma unroll
    for (int li = 0; li < ST_D; li++) issue(li);
    float tot[TP][4];
#pragma unroll
    for (int j = 0; j < TP; j++)
#pragma unroll
        for (int i = 0; i < 4; i++) tot[j][i] = 0.f;
    for (int li = 0; li < nli; li++) {
        const int it = warp + li * nw, k = it / nch, c = it - k * nch;
        const cu_mat &dm = dms[k];
        float A, B;
        tc_ab(type, dm.qbeta, &A, &B);
        uint32_t *W8 = W8s + (cp ? (size_t)(li % ST_D) * (SB / 4) : 0);
        int32_t *X8 = (int32_t *)(W8 + M * 64);
        float p2;
        if (cp) {
            p2 = __shfl_sync(0xffffffffu, p2l, li);
        } else {
            p2 = tc_dn_stage<M>(pre, npre, act, tok, K, k, c, nch, F, dm, W8, X8);
            __syncwarp();
        }
        const float q = dm.qscale * p2 * wks[k];
        st_wait<ST_D - 1>();
        __syncwarp(); /* every lane's pieces of the item's unit (and staged input) landed */
        const unsigned char *ub = ring + (size_t)(li % ST_D) * UB, *us[TP];
        float cd[TP][4];
#pragma unroll
        for (int j = 0; j < TP; j++) {
            us[j] = ub + j * st_unit<M>::bytes;
            cd[j][0] = cd[j][1] = cd[j][2] = cd[j][3] = 0.f;
        }
        st_units_mac<M, TP>(us, W8, X8, lut, cd);
#pragma unroll
        for (int j = 0; j < TP; j++) tc_i8_chunk_done(q, A, B, cd[j], tot[j]);
        __syncwarp(); /* its slot read by every lane */
        issue(li + ST_D);
    }
    st_wait<0>();
    CU_TRACE_MARK(1); /* the products done */
    if (!early) cu_pdl_trigger();
#pragma unroll
    for (int j = 0; j < TP; j++) {
        float acc[2];
        tc_i8_rows(tot[j], acc);
        if ((lane & 3) == 0) {
            red[(warp * TP + j) * 16 + (lane >> 2)] = acc[0];
            red[(warp * TP + j) * 16 + (lane >> 2) + 8] = acc[1];
        }
    }
    __syncthreads();
    if (threadIdx.x < 16 * TP) {
        const int j = threadIdx.x >> 4, r = threadIdx.x & 15;
        const int64_t row = (ti0 + j) * 16 + r;
        float s = 0.f;
        for (int w = 0; w < nw; w++) s += red[(w * TP + j) * 16 + r];
        if (db) /* gpt-oss: each pick's down bias at its router weight */
            for (int k = 0; k < K; k++)
                s += __ldcg(topk_w + tok * K + k) * db[(int64_t)__ldcg(topk_ids + tok * K + k) * H + row];
        float *yp = y + (int64_t)tok * H + row;
        *yp = accum ? *yp + s : s;
    }
}

/* ---- host side ----------------------------------------------------------------------------------------------- */

static size_t st_smem_gu(int nw, int M, int TP, int32_t E, int route) {
    return (256 + (size_t)nw * 2 * TP * 16) * sizeof(float) + (size_t)nw * TC_I8_STAGE_BYTES(M) +
           (size_t)nw * ST_D * 2 * 144 * M + (route ? 2 * (size_t)E * sizeof(float) : 0);
}
static size_t st_smem_dn(int nw, int M, int TP, int cp) {
    return (256 + (size_t)nw * TP * 16) * sizeof(float) + (size_t)nw * TC_I8_STAGE_BYTES(M) * (cp ? ST_D : 1) +
           (size_t)nw * ST_D * TP * 144 * M;
}

/* Down's prestaged inputs come by cp.async beside each item's weights (one L2 round trip a warp for their 2^e,
 * instead of a load of the staged chunk at the head of every item, after its weights were asked for): ncu (H100,
 * 235b shape, each launch alone) 17.6 -> 16.9 us, warp cycles an instruction 13.7 -> 11.4; tg64 +0.4-0.8% (stop 35).
 * Only with the prestaged inputs (cu_tc_dpre) and where the larger ring fits; MOET_MOE_DNCP=0 turns it off. */
static int st_dncp(cu_backend *c, const cu_moe_st_dn *d) {
    const char *s = getenv("MOET_MOE_DNCP");
    return !(s && s[0] == '0') && d->pre && st_smem_dn(d->nw, d->b / 32, 2, 1) + 2048 <= c->prop.sharedMemPerBlockOptin;
}

/* Tiles a CTA for a legacy grid of `ctas` CTAs of which `per_sm` fit an SM: 1 (the legacy kernel) where one wave
 * holds them, else 2 where the tiles pair up. MOET_MOE_ST=0: the legacy kernels always, =1: 2 wherever the tiles
 * pair up (the tests). Measured (stop 33, an H100, one call, against the previous build): 235b tg64 88.1 / 88.2 ->
 * 91.7 / 91.7 t/s; 30b (one wave already) unchanged. */
static int st_tiles(cu_backend *c, int64_t ctas, int per_sm, int64_t tiles) {
    const char *s = getenv("MOET_MOE_ST");
    if ((s && s[0] == '0') || tiles % 2) return 1;
    if (s && s[0] == '1') return 2;
    return ctas > (int64_t)per_sm * c->prop.multiProcessorCount ? 2 : 1;
}

/* The largest dynamic shared memory a kernel may ask for: the opt-in limit less its static arrays (asking for the
 * whole limit fails the attribute call where the kernel has any). */
static int st_dyn_max(cu_backend *c, const void *k) {
    cudaFuncAttributes fa;
    if (CU_CHECK(c, cudaFuncGetAttributes(&fa, k))) return -1;
    return (int)(c->prop.sharedMemPerBlockOptin - fa.sharedSizeBytes);
}

template <int M, int TP> static int st_attrs(cu_backend *c) {
    static int dev = -1;
    if (dev == c->device) return 0;
    const void *ks[2] = {(const void *)k_st_gate_up<M, TP>, (const void *)k_st_down<M, TP>};
    for (int i = 0; i < 2; i++) {
        const int b = st_dyn_max(c, ks[i]);
        if (b < 0 || CU_CHECK(c, cudaFuncSetAttribute(ks[i], cudaFuncAttributeMaxDynamicSharedMemorySize, b))) return -1;
        cu_carveout_max(c, ks[i]);
    }
    dev = c->device;
    return 0;
}

static long long g_st_launches[2]; /* gate/up, down: moet_backend_cuda_launches (the tests) */

extern "C" long long cu_moe_st_launches(int down) { return g_st_launches[down ? 1 : 0]; }

template <int M>
static int st_gate_up_m(cu_backend *c, const cu_moe_st_gu *g) {
    if (st_attrs<M, 2>(c)) return -1;
    const dim3 grid((unsigned)(g->F / 32), (unsigned)(g->T * g->K));
    cu_launch_pdl(c, k_st_gate_up<M, 2>, grid, dim3(g->nw * 32), st_smem_gu(g->nw, M, 2, g->E, g->rlogits != NULL),
                  g->x, g->H, g->F, g->K, g->table, g->type, g->rot, g->seed, g->topk_ids, g->act, g->rlogits, g->E,
                  g->norm_topk, g->topk_w, g->rs, g->ox, g->pre, g->npre, g->dp);
    g_st_launches[0]++;
    return CU_LAUNCHED(c, "k_st_gate_up") ? -1 : 0;
}

/* Launches the streamed gate/up (moe_st.h's contract) and returns 1, or returns 0 where the legacy kernel keeps
 * the shape (one wave holds it, or tiles that do not pair up), -1 on an error (recorded in c). */
int cu_moe_st_gate_up(cu_backend *c, const cu_moe_st_gu *g, int legacy_per_sm) {
    const int64_t tiles = g->F / 16;
    if (st_tiles(c, tiles * g->T * g->K, legacy_per_sm, tiles) == 1) return 0;
    if (st_smem_gu(g->nw, g->b / 32, 2, g->E, g->rlogits != NULL) + 1024 > c->prop.sharedMemPerBlockOptin) return 0;
    switch (g->b) {
    case 64: return st_gate_up_m<2>(c, g) ? -1 : 1;
    case 128: return st_gate_up_m<4>(c, g) ? -1 : 1;
    case 256: return st_gate_up_m<8>(c, g) ? -1 : 1;
    default: return 0;
    }
}

template <int M>
static int st_down_m(cu_backend *c, const cu_moe_st_dn *d) {
    if (st_attrs<M, 2>(c)) return -1;
    const dim3 grid((unsigned)(d->H / 32), (unsigned)d->T);
    const int cp = st_dncp(c, d);
    cu_launch_pdl(c, k_st_down<M, 2>, grid, dim3(d->nw * 32),
                  st_smem_dn(d->nw, M, 2, cp), d->act, d->H, d->F, d->K,
                  d->table, d->type, d->topk_ids, d->topk_w, d->y, d->accum, d->db, d->pre, d->npre, d->early, cp);
    g_st_launches[1]++;
    return CU_LAUNCHED(c, "k_st_down") ? -1 : 0;
}

int cu_moe_st_down(cu_backend *c, const cu_moe_st_dn *d, int legacy_per_sm) {
    const int64_t tiles = d->H / 16;
    if (d->K > MOE_MAX_K || st_tiles(c, tiles * d->T, legacy_per_sm, tiles) == 1) return 0;
    if (st_smem_dn(d->nw, d->b / 32, 2, 0) + 2048 > c->prop.sharedMemPerBlockOptin) return 0; /* + its static arrays */
    switch (d->b) {
    case 64: return st_down_m<2>(c, d) ? -1 : 1;
    case 128: return st_down_m<4>(c, d) ? -1 : 1;
    case 256: return st_down_m<8>(c, d) ? -1 : 1;
    default: return 0;
    }
}
