/*
 * moe.cu — the routed MoE block on the device, from the router to the weighted combine, and the dense SwiGLU MLP.
 *
 * Three kernels, no host round trip (the host never sees which experts a token chose):
 *   route    one CTA per token: router logits, softmax, top-k (ties to the lower id, as the CPU), renormalised
 *            weights -> topk_ids / topk_w in device memory;
 *   gate_up  one CTA per (32-row tile of the expert FFN, token slot): the slot's expert from topk_ids, x rotated once
 *            in shared memory when the experts are stored rotated, silu(gate·x) * (up·x) -> act[slot];
 *   down     one CTA per (16-row tile of hidden, token): the token's k act vectors (rotated), each expert's down rows,
 *            summed in slot order with the router weights -> y. A fixed order, no atomics: the result is the same
 *            on every run, graph or eager.
 * Bytes per token (decode): k × 3 × ffn × hidden × bpw/8 of experts + the router; FLOPs: 2 × k × 3 × ffn × hidden.
 * The weights are decoded in registers from their stored blocks (the 2-bit family's 9-byte blocks read as they lie
 * in the pack), so an expert's bytes go from HBM to the FMA units once.
 */
#include <math.h>

#include "backend/cuda/common.cuh"
#include "backend/cuda/cuda_int.h"

#define MOE_THREADS 256
#define MOE_WARPS (MOE_THREADS / 32)
#define GU_RPW 4                       /* gate/up rows per warp */
#define GU_ROWS (MOE_WARPS * GU_RPW)
#define DN_RPW 2                       /* down rows per warp */
#define DN_ROWS (MOE_WARPS * DN_RPW)
#define MOE_MAX_K 32
#define MOE_MAX_E 1024
#define MOE_SMEM_MAX (160 * 1024)

/* This lane's share of row · x (x padded in shared memory), over groups g = lane, lane + 32, ... */
template <int Q2>
__device__ __forceinline__ float lane_dot(int32_t type, const uint8_t *row, int64_t G, float qscale, float qbeta,
                                          const float *xs, int lane) {
    float acc = 0.f;
    if (Q2) {
        float lv[4];
        cu_q2_levels(type, qbeta, lv);
        for (int64_t g = lane; g < G; g += 32) acc += cu_q2_dot(row + g * 9, lv, qscale, xs + 33 * g);
    } else {
        for (int64_t g = lane; g < G; g += 32) {
            float v[32];
            cu_decode32(type, row, g, qscale, qbeta, v);
            const float *xg = xs + 33 * g;
            float a = 0.f;
#pragma unroll
            for (int j = 0; j < 32; j++) a = fmaf(v[j], xg[j], a);
            acc += a;
        }
    }
    return acc;
}

/* ---- route: softmax + top-k over router logits (the logits come from mul_mat, spread over the whole GPU) ---- */

__global__ void __launch_bounds__(MOE_THREADS)
k_moe_topk(const float *__restrict__ logits, int32_t E, int32_t K, int32_t norm_topk, int32_t *__restrict__ topk_ids,
           float *__restrict__ topk_w) {
    __shared__ float p[MOE_MAX_E];
    __shared__ float red[MOE_WARPS];
    __shared__ float sel_w[MOE_MAX_K];
    const int t = blockIdx.x, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    float mx = -INFINITY;
    for (int32_t e = threadIdx.x; e < E; e += blockDim.x) { p[e] = logits[(int64_t)t * E + e]; mx = fmaxf(mx, p[e]); }
    mx = cu_warp_max(mx);
    if (lane == 0) red[warp] = mx;
    __syncthreads();
    mx = red[0];
    for (int w = 1; w < MOE_WARPS; w++) mx = fmaxf(mx, red[w]);
    __syncthreads();
    float sum = 0.f;
    for (int32_t e = threadIdx.x; e < E; e += blockDim.x) { float v = expf(p[e] - mx); p[e] = v; sum += v; }
    sum = cu_warp_sum(sum);
    if (lane == 0) red[warp] = sum;
    __syncthreads();
    if (warp == 0) {
        float tot = 0.f;
        for (int w = 0; w < MOE_WARPS; w++) tot += red[w];
        float wsum = 0.f;
        for (int32_t j = 0; j < K; j++) {
            float best = -1.f;
            int32_t bi = 0x7fffffff;
            for (int32_t e = lane; e < E; e += 32) {
                float v = p[e];
                if (v > best) { best = v; bi = e; } /* e ascends: the first maximum in this lane's share */
            }
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) {
                float ov = __shfl_xor_sync(0xffffffffu, best, o);
                int32_t oi = __shfl_xor_sync(0xffffffffu, bi, o);
                if (ov > best || (ov == best && oi < bi)) { best = ov; bi = oi; }
            }
            if (lane == 0) {
                topk_ids[(int64_t)t * K + j] = bi;
                sel_w[j] = best / tot;
                p[bi] = -2.f; /* taken */
            }
            wsum += best / tot;
            __syncwarp();
        }
        if (lane == 0)
            for (int32_t j = 0; j < K; j++) topk_w[(int64_t)t * K + j] = norm_topk ? sel_w[j] / wsum : sel_w[j];
    }
}

/* rows of n floats -> rows · R (one CTA per row), for inputs every expert of a layer rotates alike */
__global__ void k_rotate_rows(const float *__restrict__ x, float *__restrict__ y, int64_t n, uint32_t seed) {
    extern __shared__ float xs[];
    const float *xr = x + (int64_t)blockIdx.x * n;
    for (int j = threadIdx.x; j < (int)n; j += blockDim.x) xs[CU_PAD(j)] = xr[j];
    __syncthreads();
    cu_rotate_smem(xs, 1, 0, n, seed);
    __syncthreads();
    float *yr = y + (int64_t)blockIdx.x * n;
    for (int j = threadIdx.x; j < (int)n; j += blockDim.x) yr[j] = xs[CU_PAD(j)];
}

/* ---- gate/up ------------------------------------------------------------------------------------------------- */

template <int Q2>
__global__ void __launch_bounds__(MOE_THREADS)
k_moe_gate_up(const float *__restrict__ x, int64_t H, int64_t F, int32_t K, const cu_mat *__restrict__ table,
              int32_t type, size_t row_bytes, int32_t prerot, const int32_t *__restrict__ topk_ids,
              float *__restrict__ act) {
    extern __shared__ float xs[];
    const int slot = blockIdx.y, t = slot / K, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int32_t e = topk_ids[slot];
    const cu_mat gm = table[e * 3], um = table[e * 3 + 1];
    for (int i = threadIdx.x; i < (int)H; i += blockDim.x) xs[CU_PAD(i)] = x[(int64_t)t * H + i];
    __syncthreads();
    if (gm.rotated && !prerot) {
        cu_rotate_smem(xs, 1, 0, H, gm.rot_seed);
        __syncthreads();
    }
    const int64_t G = H / 32;
    for (int rr = 0; rr < GU_RPW; rr++) {
        const int64_t f = (int64_t)blockIdx.x * GU_ROWS + warp * GU_RPW + rr;
        if (f >= F) break;
        float g = lane_dot<Q2>(type, gm.w + f * row_bytes, G, gm.qscale, gm.qbeta, xs, lane);
        float u = lane_dot<Q2>(type, um.w + f * row_bytes, G, um.qscale, um.qbeta, xs, lane);
        g = cu_warp_sum(g);
        u = cu_warp_sum(u);
        if (lane == 0) act[(int64_t)slot * F + f] = g / (1.0f + expf(-g)) * u;
    }
}

/* ---- down + combine ------------------------------------------------------------------------------------------ */

template <int Q2>
__global__ void __launch_bounds__(MOE_THREADS)
k_moe_down(const float *__restrict__ act, int64_t H, int64_t F, int32_t K, const cu_mat *__restrict__ table,
           int32_t type, size_t row_bytes, int32_t prerot, const int32_t *__restrict__ topk_ids,
           const float *__restrict__ topk_w, float *__restrict__ y) {
    extern __shared__ float as[];
    const int t = blockIdx.y, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int stride = (int)CU_PAD(F);
    for (int k = 0; k < K; k++)
        for (int j = threadIdx.x; j < (int)F; j += blockDim.x) as[k * stride + CU_PAD(j)] = act[((int64_t)t * K + k) * F + j];
    __syncthreads();
    if (!prerot) {
        for (int k = 0; k < K; k++) {
            const cu_mat dk = table[topk_ids[(int64_t)t * K + k] * 3 + 2];
            if (dk.rotated) { cu_rotate_smem(as + k * stride, 1, 0, F, dk.rot_seed); __syncthreads(); }
        }
    }
    const int64_t G = F / 32;
    for (int rr = 0; rr < DN_RPW; rr++) {
        const int64_t r = (int64_t)blockIdx.x * DN_ROWS + warp * DN_RPW + rr;
        if (r >= H) break;
        float acc = 0.f;
        for (int k = 0; k < K; k++) {
            const cu_mat dm = table[topk_ids[(int64_t)t * K + k] * 3 + 2];
            float d = cu_warp_sum(lane_dot<Q2>(type, dm.w + r * row_bytes, G, dm.qscale, dm.qbeta, as + k * stride, lane));
            acc = fmaf(topk_w[(int64_t)t * K + k], d, acc);
        }
        if (lane == 0) y[(int64_t)t * H + r] = acc;
    }
}

/* ---- host side ----------------------------------------------------------------------------------------------- */

/* scratch: router logits [T][E] | x rotated [T][H] | act [T*K][F] */
extern "C" size_t cu_moe_scratch_bytes(moet_backend *be, int64_t T, int64_t H, int64_t F, int32_t E, int32_t K) {
    return ((size_t)T * E + (size_t)T * H + (size_t)T * K * F) * sizeof(float) + 256;
}

static int g_moe_attr_dev = -1;

static int set_attrs(cu_backend *c) {
    if (g_moe_attr_dev == c->device) return 0;
    if (CU_CHECK(c, cudaFuncSetAttribute(k_rotate_rows, cudaFuncAttributeMaxDynamicSharedMemorySize, MOE_SMEM_MAX)) ||
        CU_CHECK(c, cudaFuncSetAttribute(k_moe_gate_up<0>, cudaFuncAttributeMaxDynamicSharedMemorySize, MOE_SMEM_MAX)) ||
        CU_CHECK(c, cudaFuncSetAttribute(k_moe_gate_up<1>, cudaFuncAttributeMaxDynamicSharedMemorySize, MOE_SMEM_MAX)) ||
        CU_CHECK(c, cudaFuncSetAttribute(k_moe_down<0>, cudaFuncAttributeMaxDynamicSharedMemorySize, MOE_SMEM_MAX)) ||
        CU_CHECK(c, cudaFuncSetAttribute(k_moe_down<1>, cudaFuncAttributeMaxDynamicSharedMemorySize, MOE_SMEM_MAX)))
        return -1;
    g_moe_attr_dev = c->device;
    return 0;
}

extern "C" void cu_moe(moet_backend *be, const moet_moe_args *a) {
    cu_backend *c = cu_of(be);
    if (c->err[0] || a->n_tok <= 0) return;
    const int64_t T = a->n_tok, H = a->hidden, F = a->ffn;
    const int32_t E = a->n_experts, K = a->n_used;
    if (E > MOE_MAX_E || K > MOE_MAX_K || K > E || H % 32 || F % 32) {
        cu_fail(c, cudaErrorInvalidValue, "moe: shape outside the kernels' limits", __FILE__, __LINE__);
        return;
    }
    const size_t sm_gu = (size_t)CU_PAD(H) * sizeof(float), sm_dn = (size_t)K * CU_PAD(F) * sizeof(float);
    if (sm_gu > MOE_SMEM_MAX || sm_dn > MOE_SMEM_MAX) {
        cu_fail(c, cudaErrorInvalidValue, "moe: activations exceed shared memory", __FILE__, __LINE__);
        return;
    }
    if (set_attrs(c)) return;
    const cu_expert_table *tab = cu_experts(c, a);
    if (!tab) return;
    float *logits = (float *)a->scratch, *xr = logits + (size_t)T * E, *act = xr + (size_t)T * H;
    const int q2 = tab->type == MOET_TYPE_W2 || tab->type == MOET_TYPE_INT2 || tab->type == MOET_TYPE_SYM2;
    const size_t rb_gu = moet_type_row_bytes(tab->type, H), rb_dn = moet_type_row_bytes(tab->type, F);

    cu_mul_mat(be, a->router, a->x, T, logits);
    k_moe_topk<<<(unsigned)T, MOE_THREADS, 0, c->stream>>>(logits, E, K, a->norm_topk, a->topk_ids, a->topk_w);
    if (CU_LAUNCHED(c, "k_moe_topk")) return;
    const float *xin = a->x;
    const int gu_pre = tab->gu_uniform && tab->gu_rotated;
    if (gu_pre) {
        k_rotate_rows<<<(unsigned)T, MOE_THREADS, sm_gu, c->stream>>>(a->x, xr, H, tab->gu_seed);
        if (CU_LAUNCHED(c, "k_rotate_rows")) return;
        xin = xr;
    }
    dim3 g1((unsigned)((F + GU_ROWS - 1) / GU_ROWS), (unsigned)(T * K));
    if (q2) k_moe_gate_up<1><<<g1, MOE_THREADS, sm_gu, c->stream>>>(xin, H, F, K, tab->table, tab->type, rb_gu, gu_pre, a->topk_ids, act);
    else k_moe_gate_up<0><<<g1, MOE_THREADS, sm_gu, c->stream>>>(xin, H, F, K, tab->table, tab->type, rb_gu, gu_pre, a->topk_ids, act);
    if (CU_LAUNCHED(c, "k_moe_gate_up")) return;
    /* down inputs rotated once per slot when every expert rotates alike; otherwise per CTA (prerot = 0) */
    const int dn_pre = tab->down_uniform;
    if (tab->down_uniform && tab->down_rotated) {
        k_rotate_rows<<<(unsigned)(T * K), MOE_THREADS, (size_t)CU_PAD(F) * sizeof(float), c->stream>>>(act, act, F, tab->down_seed);
        if (CU_LAUNCHED(c, "k_rotate_rows")) return;
    }
    dim3 g2((unsigned)((H + DN_ROWS - 1) / DN_ROWS), (unsigned)T);
    if (q2) k_moe_down<1><<<g2, MOE_THREADS, sm_dn, c->stream>>>(act, H, F, K, tab->table, tab->type, rb_dn, dn_pre, a->topk_ids, a->topk_w, a->y);
    else k_moe_down<0><<<g2, MOE_THREADS, sm_dn, c->stream>>>(act, H, F, K, tab->table, tab->type, rb_dn, dn_pre, a->topk_ids, a->topk_w, a->y);
    CU_LAUNCHED(c, "k_moe_down");
}

/* Dense SwiGLU MLP: gate and up products, the gating, the down product (three matmul launches + one elementwise). */
extern "C" void cu_mlp(moet_backend *be, const moet_weight *gate, const moet_weight *up, const moet_weight *down,
                       const float *x, int64_t n, float *scratch, float *y) {
    cu_backend *c = cu_of(be);
    float *g = scratch, *u = scratch + (size_t)n * gate->rows;
    cu_mul_mat(be, gate, x, n, g);
    cu_mul_mat(be, up, x, n, u);
    cu_swiglu(c, g, u, n * gate->rows);
    cu_mul_mat(be, down, g, n, y);
}
