/*
 * moe.cuh — what the two MoE kernel families share: moe.cu (any expert type, CUDA cores) and moe_tc.cu (the 2-bit
 * family in the tiled layout, tensor cores): limits, the grouped path's chunk size, and the warp router.
 */
#ifndef MOET_BACKEND_CUDA_MOE_CUH
#define MOET_BACKEND_CUDA_MOE_CUH

#include <math.h>

#include "backend/cuda/common.cuh"
#include "backend/cuda/cuda_int.h"

#define MOE_MAX_K 32
#define MOE_MAX_E 1024
#define GR_TB 8                 /* grouped path: slots (tokens of one expert) per chunk */
#define MOE_GROUP_MIN 4         /* tokens from which the grouped path runs */
#define MOE_DELTA_TOK 4         /* tokens a pass of the delta path (moe_tc.cu's decode kernels; <= TC_RT_T) */

/* ---- route: softmax + top-k of one token's router logits, by one warp --------------------------------------
 * The logits come from mul_mat (spread over the whole GPU). Every gate/up CTA of a token routes it again (128
 * logits from L2 are cheaper than a launch): ties go to the lower id, as on the CPU; weights renormalised over the
 * chosen k when norm_topk. p is shared scratch of E floats; ids/w receive K entries. */
__device__ __forceinline__ void moe_route_warp(const float *__restrict__ lg, int32_t E, int32_t K, int32_t norm_topk,
                                               float *p, int32_t *ids, float *w) {
    const int lane = threadIdx.x & 31;
    float mx = -INFINITY;
    for (int32_t e = lane; e < E; e += 32) { p[e] = lg[e]; mx = fmaxf(mx, p[e]); }
    mx = cu_warp_max(mx);
    float sum = 0.f;
    for (int32_t e = lane; e < E; e += 32) { const float v = expf(p[e] - mx); p[e] = v; sum += v; }
    const float tot = cu_warp_sum(sum);
    float wsum = 0.f, mine = 0.f;
    for (int32_t j = 0; j < K; j++) {
        float best = -1.f;
        int32_t bi = 0x7fffffff;
        for (int32_t e = lane; e < E; e += 32) {
            const float v = p[e];
            if (v > best) { best = v; bi = e; } /* e ascends: the first maximum in this lane's share */
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float ov = __shfl_xor_sync(0xffffffffu, best, o);
            const int32_t oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (ov > best || (ov == best && oi < bi)) { best = ov; bi = oi; }
        }
        if ((bi & 31) == lane) p[bi] = -2.f; /* taken: by the lane that owns it, so its next scan sees it */
        if (lane == j) mine = best / tot;     /* K <= 32: lane j keeps pick j */
        if (lane == 0) ids[j] = bi;
        wsum += best / tot;
        __syncwarp();
    }
    if (lane < K) w[lane] = norm_topk ? mine / wsum : mine;
    __syncwarp();
}

/* ---- route: the sigmoid router with a choice bias and group-limited top-k (MOET_ROUTER_SIGMOID) -------------
 * backend/route_ref.h's algorithm pick for pick, by one warp: choice scores c = sigmoid + bias in c (E floats,
 * shared), each group's top-2 sum by a lane (n_group <= 32), the groups kept by rank (ties: the lower group), the
 * rest of c set to 0.0, then K maxima as moe_route_warp takes them (ties: the lower id); weights from the unbiased
 * sigmoid, renormalised over (sum + 1e-20) when norm_topk, times scale. Taken entries become -inf: biased scores
 * may be negative, unlike probabilities. */
/* The sigmoid router's group mask, which every lane of the calling warp gets (bit g: group g kept): group g's score
 * is the sum of its two largest c (E / G experts each), the TG best groups kept, ties to the lower group. G <= 32. */
__device__ __forceinline__ uint32_t moe_sig_group_keep(const float *c, int32_t E, int32_t G, int32_t TG) {
    const int lane = threadIdx.x & 31;
    const int32_t gs = E / G;
    float gsc = -INFINITY;
    if (lane < G) {
        float a = -INFINITY, b = -INFINITY;
        for (int32_t e = lane * gs; e < (lane + 1) * gs; e++) {
            const float v = c[e];
            if (v > a) { b = a; a = v; } else if (v > b) b = v;
        }
        gsc = a + b;
    }
    int rank = 0;
    for (int o = 0; o < G; o++) {
        const float og = __shfl_sync(0xffffffffu, gsc, o);
        rank += og > gsc || (og == gsc && o < lane);
    }
    return __ballot_sync(0xffffffffu, lane < G && rank < TG);
}

__device__ __forceinline__ void moe_route_sig_warp(const float *__restrict__ lg, const float *__restrict__ bias,
                                                   int32_t E, int32_t K, int32_t G, int32_t TG, int32_t norm_topk,
                                                   float scale, float *c, int32_t *ids, float *w) {
    const int lane = threadIdx.x & 31;
    for (int32_t e = lane; e < E; e += 32) c[e] = 1.0f / (1.0f + expf(-lg[e])) + (bias ? bias[e] : 0.0f);
    __syncwarp();
    if (G > 1 && TG < G) {
        const int32_t gs = E / G;
        const uint32_t keep = moe_sig_group_keep(c, E, G, TG);
        for (int32_t e = lane; e < E; e += 32)
            if (!((keep >> (e / gs)) & 1u)) c[e] = 0.0f;
        __syncwarp();
    }
    float wsum = 0.f, mine = 0.f;
    for (int32_t j = 0; j < K; j++) {
        float best = -INFINITY;
        int32_t bi = 0x7fffffff;
        for (int32_t e = lane; e < E; e += 32) {
            const float v = c[e];
            if (v > best || bi == 0x7fffffff) { best = v; bi = e; } /* e ascends: the first maximum of the lane */
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float ov = __shfl_xor_sync(0xffffffffu, best, o);
            const int32_t oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (ov > best || (ov == best && oi < bi)) { best = ov; bi = oi; }
        }
        const float s = 1.0f / (1.0f + expf(-lg[bi]));
        if ((bi & 31) == lane) c[bi] = -INFINITY; /* taken, by the lane that owns it */
        if (lane == j) mine = s;
        if (lane == 0) ids[j] = bi;
        wsum += s;
        __syncwarp();
    }
    if (lane < K) w[lane] = (norm_topk ? mine / (wsum + 1e-20f) : mine) * scale;
    __syncwarp();
}

/* gpt-oss's expert extras as a kernel argument: the biases' device copies (gate / up [E][F], down [E][H]) and the
 * SwiGLU clamp; all NULL / 0 for the other architectures (moe.cu's per-slot kernels take them). */
typedef struct {
    const float *gb, *ub, *db;
    float lim;
} cu_moe_oss;

/* The expert activation (backend.h, moet_moe_args.swiglu_limit): silu(g) u, or with lim > 0 the clamped form
 * (min(u, lim) clamped below at -lim, + 1) g' sigmoid(1.702 g'), g' = min(g, lim), in the CPU backend's order. */
__device__ __forceinline__ float cu_moe_act(float g, float u, float lim) {
    if (lim > 0.f) {
        const float gc = fminf(g, lim), uc = fminf(fmaxf(u, -lim), lim);
        return (uc + 1.0f) * (gc * (1.0f / (1.0f + expf(-(gc * 1.702f)))));
    }
    return g / (1.0f + expf(-g)) * u;
}

/* MOET_ROUTER_TOPK_SOFTMAX (route_ref.h) for one token, one warp: the K largest logits (ties: the lower id) in that
 * order, weighted by the softmax over those K. */
__device__ __forceinline__ void moe_route_topk_warp(const float *lg, int32_t E, int32_t K, int32_t *ids, float *w) {
    const int lane = threadIdx.x & 31;
    float mine = 0.f, top = 0.f;
    int32_t taken[MOE_MAX_K];
    for (int j = 0; j < K; j++) {
        float best = -INFINITY;
        int32_t bi = 0x7fffffff;
        for (int e = lane; e < E; e += 32) {
            int tk = 0;
            for (int q = 0; q < j; q++) tk |= taken[q] == e;
            const float v = lg[e];
            if (!tk && (v > best || (v == best && e < bi) || bi == 0x7fffffff)) { best = v; bi = e; }
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float ov = __shfl_xor_sync(0xffffffffu, best, o);
            const int32_t oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (ov > best || (ov == best && oi < bi)) { best = ov; bi = oi; }
        }
        taken[j] = bi;
        if (j == 0) top = best;
        if (lane == j) mine = best;
        if (lane == 0) ids[j] = bi;
    }
    float sum = 0.f; /* in pick order, as the CPU */
    for (int j = 0; j < K; j++) sum += expf(__shfl_sync(0xffffffffu, mine, j) - top);
    if (lane < K) w[lane] = expf(mine - top) / sum;
    __syncwarp();
}

/* The sigmoid router's parameters as a kernel argument (on = 0: the softmax router). */
typedef struct {
    const float *bias; /* device memory, or NULL */
    int32_t G, TG, on;
    float scale;
} cu_route_sig;

/* The delta's picks as a kernel argument (backend.h, moet_delta_pick): slot i (token i / K, pick i % K) takes the
 * residuals where cu_dpick_on holds; w the routing weights [T][K] as topk_w holds them (read after the kernel that
 * wrote them), r <= 0 or w NULL: every slot. The same arithmetic as moet_delta_pick, so both backends pick alike. */
typedef struct {
    const float *w;
    int32_t K;
    float r;
} cu_dpick;

/* Bit k: pick k of token tok takes the residuals. Every lane of the warp calls it (a full warp): lane k loads weight
 * k (one round trip to L2, not K dependent ones: a loop of K loads a thread cost the 30b decode 7% on an H100), the
 * sum runs in pick order through shuffles, as moet_delta_pick's loop does. */
__device__ __forceinline__ unsigned cu_dpick_bits(const cu_dpick d, int64_t tok) {
    if (!(d.r > 0.f) || !d.w) return 0xffffffffu;
    const int lane = threadIdx.x & 31;
    const float mine = lane < d.K ? __ldcg(d.w + tok * d.K + lane) : 0.f;
    float s = 0.f;
    for (int j = 0; j < d.K; j++) s = __fadd_rn(s, __shfl_sync(0xffffffffu, mine, j));
    return __ballot_sync(0xffffffffu, lane < d.K && __fmul_rn(mine, (float)d.K) >= __fmul_rn(d.r, s));
}

/* Slot i (token i / K, pick i % K) takes the residuals; a full warp calls it (cu_dpick_bits). */
__device__ __forceinline__ int cu_dpick_on(const cu_dpick d, int64_t i) {
    return (int)(cu_dpick_bits(d, i / d.K) >> (i % d.K) & 1u);
}

/* moe.cu: the device copy of a's sigmoid router parameters (bias mirrored); 0 on error (c->err set). */
int cu_route_sig_of(cu_backend *c, const moet_moe_args *a, cu_route_sig *rs);

/* moe.cu: MOET_ROUTER_SIGMOID's own launch, a warp a token: logits [T][E] -> topk_ids / topk_w, which the expert
 * kernels then read instead of routing themselves (their logits argument NULL). */
void cu_moe_route_sigmoid(cu_backend *c, const moet_moe_args *a, const float *logits, int64_t T);
/* moe.cu: MOET_ROUTER_TOPK_SOFTMAX's launch, the same way. */
void cu_moe_route_topk(cu_backend *c, const moet_moe_args *a, const float *logits, int64_t T);

/* moe_tc.cu: the tensor-core path (tab->tiled). Decode (T < MOE_GROUP_MIN): router + top-k, gate/up, down, three
 * launches. Grouped: gate/up and down over the work list of moe.cu's k_moe_prep / k_moe_items. ox (NULL: none):
 * gpt-oss's biases and clamp (tiled unless MOET_OSS_TC=0: cuda_backend.cu's tiled_ok); its decode routes in a
 * launch of its own (cu_moe_route_topk after the router's bias). */
void cu_moe_tc_decode(cu_backend *c, const moet_moe_args *a, const cu_expert_table *tab, const cu_expert_table *dtab,
                      float *logits, float *act, const cu_moe_oss *ox);
/* dtab (NULL: none): the NVFP4 delta residuals, added in the same kernels on the slots dp keeps; x: the unrotated
 * rows (the residuals' input, H apart), read only with dtab. */
void cu_moe_tc_gate_up_grp(cu_backend *c, const cu_expert_table *tab, const cu_expert_table *dtab, const float *xr,
                           const float *x, int64_t T, int64_t H, int64_t F, int32_t K, const int32_t *count,
                           const int32_t *n_items, const int32_t *items, const int32_t *list, unsigned n_chunks,
                           float *act, const cu_moe_oss *ox, cu_dpick dp);
void cu_moe_tc_down_grp(cu_backend *c, const cu_expert_table *tab, const cu_expert_table *dtab, const float *act,
                        int64_t T, int64_t H, int64_t F, const int32_t *count, const int32_t *n_items,
                        const int32_t *items, const int32_t *list, unsigned n_chunks, float *ydn,
                        const cu_moe_oss *ox, cu_dpick dp);

/* moe_grp.cu: the grouped products with token tiles of up to 64 (H and F multiples of 128, tiled, 16-byte aligned
 * experts; MOET_MOE_GB=0 turns it off). cu_moe_gb_tile: the slots a work-list chunk takes (the k_moe_items tile;
 * delta: whether the FP4 residuals' pass runs too). */
extern "C" int cu_moe_gb_ok(const cu_expert_table *tab, int64_t H, int64_t F);
extern "C" int cu_moe_gb_tile(int64_t T, int32_t E, int32_t K, int delta);
extern "C" size_t cu_moe_gb_stage_bytes(int64_t T, int64_t H, int64_t F, int32_t K);
extern "C" size_t cu_moe_tc_stage_bytes(int64_t T, int64_t H, int64_t F, int32_t K); /* moe_tc.cu: decode's staged
                                                                                       * gate/up and down inputs */
/* dtab: the delta's residuals (NULL: none) on the slots dp keeps, then x: the unrotated rows and spare: T*K floats of
 * scratch. */
extern "C" void cu_moe_gb(cu_backend *c, const cu_expert_table *tab, const cu_expert_table *dtab, const float *xr,
                          const float *x, int64_t T, int64_t H, int64_t F, int32_t K, const int32_t *topk_ids,
                          const int32_t *count, const int32_t *n_items, const int32_t *items, const int32_t *list,
                          unsigned n_chunks, int tile, void *stage, float *spare, float *act, float *ydn, cu_dpick dp);

/* moe_fused.cu: one token's whole block in one persistent launch (sm_90+, hidden a multiple of 256, ffn of 64);
 * 1 when it launched (or recorded an error), 0 when the call is not for it (the caller runs cu_moe_tc_decode). */
extern "C" int cu_moe_fused(cu_backend *c, const moet_moe_args *a, const cu_expert_table *tab, float *logits,
                            float *act);

#endif
