/*
 * attention.cu — causal GQA attention over the paged per-layer KV cache (kv_page.h), decode and prefill alike.
 *
 * One CTA per (query head, token); its warps take groups of AT_G keys in turn (all of a group's K and V rows in
 * flight at once: per key, two dependent round trips to memory made decode attention grow ~0.3 us per key and
 * layer) and keep a running max, sum and output (the online softmax), merged across warps at the end in a fixed
 * order: deterministic, no scores buffer, any context length.
 * A query at position p reads keys 0..p, which it finds in device memory (pos), so one recorded decode step serves
 * every position. Bytes per query head: (p+1) × head_dim × 8 (K and V rows); FLOPs: 4 × (p+1) × head_dim.
 * Keys are found through the sequence's block table (one broadcast load a key, from L1 after the first); split-K
 * over long contexts is the next step (docs/performance.md).
 */
#include <math.h>
#include <stdlib.h>

#include "backend/cuda/common.cuh"
#include "backend/cuda/cuda_int.h"

#define AT_WARPS 8
#define AT_MAX_D 8 /* head_dim <= 256 */
#define AT_G 4     /* keys a warp takes at once: their K and V rows are all requested before any math */

/* The K and V rows of keys j0 .. j0 + AT_G - 1 (those < n_keys; past the end, key j0 again, masked later) of one kv
 * head into a warp's registers, lane l holding elements l, l + 32, ...; key `cur` comes from ks / vs (shared
 * memory). mode 1: every key; 0: all but key cur (from the cache only: what k_attn_decode may read before its
 * wait); 2: key cur only (the rest of a mode-0 load). */
template <typename E>
__device__ __forceinline__ void at_group_load(float (&kr)[AT_G][AT_MAX_D], float (&vr)[AT_G][AT_MAX_D], const E *kp0,
                                              const E *vp0, int64_t kv_stride, const int32_t *blocks, int32_t shift,
                                              int32_t j0, int32_t n_keys, int32_t cur, const float *ks, const float *vs,
                                              int head_dim, int mode) {
    const int lane = threadIdx.x & 31, nd = (head_dim + 31) / 32;
#pragma unroll
    for (int g = 0; g < AT_G; g++) {
        const int32_t j = j0 + g < n_keys ? j0 + g : j0;
        if ((mode == 0 && j == cur) || (mode == 2 && j != cur)) continue;
        if (j == cur) { /* (shared memory: the row as the cache holds it) */
#pragma unroll
            for (int d = 0; d < AT_MAX_D; d++) {
                int i = lane + 32 * d;
                const int ok = d < nd && i < head_dim;
                kr[g][d] = ok ? ks[i] : 0.f;
                vr[g][d] = ok ? vs[i] : 0.f;
            }
            continue;
        }
        const int64_t row = moet_kv_row(blocks, shift, j);
        const E *kp = kp0 + row * kv_stride, *vp = vp0 + row * kv_stride;
#pragma unroll
        for (int d = 0; d < AT_MAX_D; d++) {
            int i = lane + 32 * d;
            const int ok = d < nd && i < head_dim;
            kr[g][d] = ok ? cu_kv_ld(kp + i) : 0.f;
            vr[g][d] = ok ? cu_kv_ld(vp + i) : 0.f;
        }
    }
}

/* One query row against keys 0 .. n_keys - 1 of one kv head (kp0 / vp0: pool row 0 of that head, rows kv_stride
 * apart; key j at pool row moet_kv_row(blocks, shift, j)),
 * the CTA's warps over groups of AT_G keys, merged in warp order; key `cur` (>= 0) is read from ks / vs instead
 * (the fused decode kernel's own rows, bit-equal to what it wrote to the cache). pre: the warp's first group
 * (keys k0 + warp AT_G ...) is already in kr0 / vr0 but for key `cur` (k_attn_decode loads it before its wait).
 * Writes the head's output row. */
template <typename E>
__device__ __forceinline__ void at_heads(const float *qr, const E *kp0, const E *vp0, int64_t kv_stride,
                                         const int32_t *blocks, int32_t shift, int32_t n_keys, int32_t k0, float sink,
                                         int32_t cur, const float *ks, const float *vs, int head_dim,
                                         float scale, float *orow, float *sm_m, float *sm_l,
                                         float (*sm_o)[AT_MAX_D * 32], int pre, float (&kr0)[AT_G][AT_MAX_D],
                                         float (&vr0)[AT_G][AT_MAX_D]) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nd = (head_dim + 31) / 32;
    float qv[AT_MAX_D], o[AT_MAX_D];
#pragma unroll
    for (int d = 0; d < AT_MAX_D; d++) {
        int i = lane + 32 * d;
        qv[d] = d < nd && i < head_dim ? qr[i] : 0.f;
        o[d] = 0.f;
    }
    float m = -INFINITY, l = 0.f;
    /* Each step a warp takes keys j0 .. j0 + AT_G - 1 (those < n_keys): one memory round trip for all of them,
     * not two per key, then the online-softmax update with the group's maximum. */
    for (int32_t j0 = k0 + warp * AT_G; j0 < n_keys; j0 += AT_WARPS * AT_G) { /* k0: a sliding window's first key */
        if (pre && j0 == k0 + warp * AT_G) { /* the preloaded group: only key cur is still to be read */
            at_group_load(kr0, vr0, kp0, vp0, kv_stride, blocks, shift, j0, n_keys, cur, ks, vs, head_dim, 2);
            cu_osm_step<AT_G, AT_MAX_D>(qv, kr0, vr0, j0, n_keys, scale, m, l, o);
            continue;
        }
        float kr[AT_G][AT_MAX_D], vr[AT_G][AT_MAX_D];
        at_group_load(kr, vr, kp0, vp0, kv_stride, blocks, shift, j0, n_keys, cur, ks, vs, head_dim, 1);
        cu_osm_step<AT_G, AT_MAX_D>(qv, kr, vr, j0, n_keys, scale, m, l, o);
    }
    if (lane == 0) { sm_m[warp] = m; sm_l[warp] = l; }
#pragma unroll
    for (int d = 0; d < AT_MAX_D; d++) sm_o[warp][lane + 32 * d] = o[d];
    __syncthreads();
    if (warp == 0) { /* sink (gpt-oss; -inf: none) is one more logit in the softmax, with no value */
        float M = sink;
        for (int w = 0; w < AT_WARPS; w++) M = fmaxf(M, sm_m[w]);
        float L = sink == -INFINITY ? 0.f : expf(sink - M), acc[AT_MAX_D];
#pragma unroll
        for (int d = 0; d < AT_MAX_D; d++) acc[d] = 0.f;
        for (int w = 0; w < AT_WARPS; w++) {
            if (sm_m[w] == -INFINITY) continue; /* a warp that saw no key */
            const float f = expf(sm_m[w] - M);
            L += sm_l[w] * f;
#pragma unroll
            for (int d = 0; d < AT_MAX_D; d++) acc[d] += sm_o[w][lane + 32 * d] * f;
        }
        const float inv = 1.0f / L;
#pragma unroll
        for (int d = 0; d < AT_MAX_D; d++) {
            int i = lane + 32 * d;
            if (d < nd && i < head_dim) orow[i] = acc[d] * inv;
        }
    }
}

template <typename E>
__global__ void __launch_bounds__(AT_WARPS * 32)
k_attention(const float *q, moet_kv_ref kv, const int32_t *pos, int32_t n_heads, int32_t n_kv,
            int32_t head_dim, float scale, const float *__restrict__ sinks, int32_t window, float *__restrict__ out) {
    CU_TRACE(CU_TK_ATTENTION << 8);
    cu_pdl_trigger();
    cu_pdl_wait();
    CU_TRACE_WAITED();
    __shared__ float sm_m[AT_WARPS], sm_l[AT_WARPS], sm_o[AT_WARPS][AT_MAX_D * 32];
    const int h = blockIdx.x, t = blockIdx.y;
    const int kvh = h / (n_heads / n_kv);
    const int64_t kv_stride = (int64_t)n_kv * head_dim;
    const float *qr = q + ((int64_t)t * n_heads + h) * head_dim;
    float nokr[AT_G][AT_MAX_D]; /* (no preloaded group) */
    at_heads(qr, (const E *)kv.k + (int64_t)kvh * head_dim, (const E *)kv.v + (int64_t)kvh * head_dim, kv_stride,
             kv.blocks, kv.shift, pos[t] + 1, window > 0 && pos[t] + 1 > window ? pos[t] + 1 - window : 0, sinks ? sinks[h] : -INFINITY, -1,
             NULL, NULL, head_dim, scale, out + ((int64_t)t * n_heads + h) * head_dim, sm_m, sm_l, sm_o, 0, nokr, nokr);
}

extern "C" size_t cu_attn_scratch_bytes(moet_backend *be, int32_t n_ctx) { return 16; }

extern "C" void cu_attention(moet_backend *be, const moet_attn_args *a) {
    cu_backend *c = cu_of(be);
    if (c->err[0] || a->n_tok <= 0) return;
    if (a->head_dim > AT_MAX_D * 32 || a->n_kv <= 0 || a->n_heads % a->n_kv) {
        cu_fail(c, cudaErrorInvalidValue, "attention: head_dim > 256 or heads not a multiple of kv heads", __FILE__, __LINE__);
        return;
    }
    const float *sk = NULL; /* gpt-oss's sinks, mirrored */
    if (a->sinks && !(sk = (const float *)cu_weight(c, a->sinks, (size_t)a->n_heads * sizeof(float)))) return;
    if (!sk && !a->window && !cu_attn_tc(c, a)) return; /* prefill on tensor cores (attn_tc.cu) where it applies */
    /* decode-sized: a kv head's query heads together, the keys split over CTAs (attn_split.cu) where it applies */
    if (cu_attn_split(c, (float *)a->q, NULL, NULL, NULL, NULL, 0.f, NULL, NULL, a, 0, sk)) return;
    dim3 grid((unsigned)a->n_heads, (unsigned)a->n_tok);
    if (a->kv.type == MOET_KVE_F16)
        cu_launch_pdl(c, k_attention<__half>, grid, dim3(AT_WARPS * 32), 0, a->q, a->kv, a->pos, a->n_heads,
                      a->n_kv, a->head_dim, a->scale, sk, a->window, a->out);
    else
        cu_launch_pdl(c, k_attention<float>, grid, dim3(AT_WARPS * 32), 0, a->q, a->kv, a->pos, a->n_heads,
                      a->n_kv, a->head_dim, a->scale, sk, a->window, a->out);
    CU_LAUNCHED(c, "k_attention");
}

/* attn_prep + attention for one token (decode), one CTA per query head (and per row: attn_rows, a batched step
 * whose rows are one token each of different sequences, each row's cache from a device table): the q head and its kv head are normed and
 * rotated in shared memory with k_attn_prep's arithmetic (threads [0, T) the q row, [T, 2T) the k row, T = the
 * prep kernel's thread count, the same per-warp partial sums added in the same order), the first q head of each
 * group writes k, v to the cache row pos (every CTA writes its q in place), and the attention reads
 * keys 0 .. pos - 1 from the cache and key pos from its own shared rows: the same floats the composition reads, so
 * the output is bit-identical to attn_prep then attention, one launch and one dependent round trip fewer. A partial
 * rotary head (rot_dim < head_dim) goes through shared memory as k_attn_prep's partial path does. */
template <typename E>
__global__ void __launch_bounds__(AT_WARPS * 32)
k_attn_decode(float *q, float *k, const float *v, int32_t n_heads, int32_t n_kv, int32_t head_dim,
              const float *__restrict__ q_norm, const float *__restrict__ k_norm, float eps,
              const __grid_constant__ moet_rope rp, const int32_t *pos, moet_kv_ref kv, const moet_kv_ref *rows,
              float scale, const float *__restrict__ sinks, int32_t window, float *__restrict__ out, int32_t pre) {
    CU_TRACE(CU_TK_ATTN_DECODE << 8);
    const int rot_dim = rp.dim, trig_late = pre & 2; /* pre: bit 0 the preload, bit 1 MOET_ATTN_TRIG=1 (at_pre) */
    if (!trig_late) cu_pdl_trigger();
    /* The rotation's cos and sin (double-precision cos/sin: a long dependent chain) before waiting for the QKV
     * product: they need only the position, which the host uploaded before the step's first kernel. */
    const int half = head_dim / 2, T = ((half + 31) / 32) * 32, tid = threadIdx.x;
    const int role = tid < T ? 0 : tid < 2 * T ? 1 : 2, i = role == 1 ? tid - T : tid;
    const int32_t p = pos[blockIdx.y];
    float co = 0.f, si = 0.f;
    if (role < 2 && i < rot_dim / 2) cu_rope_cs(rp, i, p, &co, &si);
    { /* row blockIdx.y of a batched step (attn_rows): its q/k/v/out rows, its position, its cache from rows (a
       * table the host uploaded before the step) */
        const int64_t r = blockIdx.y, dq = (int64_t)n_heads * head_dim, dk = (int64_t)n_kv * head_dim;
        q += r * dq;
        k += r * dk;
        v += r * dk;
        out += r * dq;
        if (rows) kv = rows[r];
    }
    /* pre: the warp's first group of keys before the wait, all but key p: they are cache rows earlier steps wrote
     * (complete before this step's first kernel), found through the block table the host uploaded; only the QKV
     * product (q, k, v and key p) depends on the kernel before this one. At a short context that is every key: the
     * attention's one memory round trip into the cache leaves the critical path (docs/performance.md, stop 31). */
    float kr0[AT_G][AT_MAX_D], vr0[AT_G][AT_MAX_D];
    const int32_t k0 = window > 0 && p + 1 > window ? p + 1 - window : 0;
    pre = (pre & 1) && k0 + (int32_t)(threadIdx.x >> 5) * AT_G <= p; /* the warp has keys (no other block-table reads) */
    if (pre) {
        const int kvh0 = blockIdx.x / (n_heads / n_kv);
        at_group_load(kr0, vr0, (const E *)kv.k + (int64_t)kvh0 * head_dim, (const E *)kv.v + (int64_t)kvh0 * head_dim,
                      (int64_t)n_kv * head_dim, kv.blocks, kv.shift, k0 + (int32_t)(threadIdx.x >> 5) * AT_G, p + 1, p,
                      NULL, NULL, head_dim, 0);
    }
    cu_pdl_wait();
    CU_TRACE_WAITED();
    if (trig_late) cu_pdl_trigger();
    __shared__ float sm_m[AT_WARPS], sm_l[AT_WARPS], sm_o[AT_WARPS][AT_MAX_D * 32];
    __shared__ float sq[AT_MAX_D * 32], sk[AT_MAX_D * 32], sv[AT_MAX_D * 32];
    __shared__ double part[2][AT_WARPS];
    const int h = blockIdx.x, grp = n_heads / n_kv, kvh = h / grp, leader = h % grp == 0;
    const int64_t kvd = (int64_t)n_kv * head_dim;
    const int64_t prow = moet_kv_row(kv.blocks, kv.shift, p);
    float *row = role == 0 ? q + (int64_t)h * head_dim : k + (int64_t)kvh * head_dim;
    const float *nw = role == 0 ? q_norm : k_norm;
    float a = 0.f, b = 0.f;
    if (role < 2 && i < half) { a = row[i]; b = row[i + half]; }
    double ss = (double)a * a + (double)b * b;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    if (role < 2 && (i & 31) == 0) part[role][i >> 5] = ss;
    for (int j = tid; j < head_dim; j += blockDim.x) { /* v row: shared copy, the cache by the group's leader */
        const float x = v[(int64_t)kvh * head_dim + j];
        sv[j] = cu_kv_as<E>(x);
        if (leader) cu_kv_st((E *)kv.v + prow * kvd + (int64_t)kvh * head_dim + j, x);
    }
    __syncthreads();
    if (role < 2 && i < half && nw) {
        double tot = 0;
        for (int w = 0; w < T / 32; w++) tot += part[role][w];
        const float inv = (float)(1.0 / sqrt(tot / (double)head_dim + (double)eps));
        a = nw[i] * (a * inv);
        b = nw[i + half] * (b * inv);
    }
    if (rot_dim != head_dim) { /* partial rotary (GLM-4.5): as k_attn_prep's partial path, in shared memory */
        const int rh = rot_dim / 2;
        float *dst = role == 0 ? sq : sk;
        if (role < 2 && i < half) { dst[i] = a; dst[i + half] = b; }
        __syncthreads();
        if (role < 2 && i < rh) {
            const float x0 = dst[i], x1 = dst[i + rh]; /* no FMA contraction: k_attn_prep's partial path, bit for bit */
            dst[i] = __fsub_rn(__fmul_rn(x0, co), __fmul_rn(x1, si));
            dst[i + rh] = __fadd_rn(__fmul_rn(x1, co), __fmul_rn(x0, si));
        }
        __syncthreads();
        if (role == 0 && i < half) { row[i] = dst[i]; row[i + half] = dst[i + half]; }
        if (role == 1 && i < half) { /* the k row as the cache holds it, in every CTA of the group */
            dst[i] = cu_kv_as<E>(dst[i]);
            dst[i + half] = cu_kv_as<E>(dst[i + half]);
            if (leader) {
                E *cr = (E *)kv.k + prow * kvd + (int64_t)kvh * head_dim;
                cu_kv_st(cr + i, dst[i]);
                cu_kv_st(cr + i + half, dst[i + half]);
            }
        }
    } else if (role < 2 && i < half) {
        /* no FMA contraction: which product nvcc fuses depends on the code around it, and k_attn_prep,
         * k_attn_decode and the CPU must round alike (bit for bit between the GPU paths) */
        const float ra = __fsub_rn(__fmul_rn(a, co), __fmul_rn(b, si));
        const float rb = __fadd_rn(__fmul_rn(b, co), __fmul_rn(a, si));
        float *dst = role == 0 ? sq : sk;
        dst[i] = role == 0 ? ra : cu_kv_as<E>(ra); /* k: the row as the cache holds it */
        dst[i + half] = role == 0 ? rb : cu_kv_as<E>(rb);
        if (role == 0) { row[i] = ra; row[i + half] = rb; } /* k is not rewritten: other CTAs read it (backend.h) */
        if (role == 1 && leader) {
            E *cr = (E *)kv.k + prow * kvd + (int64_t)kvh * head_dim;
            cu_kv_st(cr + i, ra);
            cu_kv_st(cr + i + half, rb);
        }
    }
    __syncthreads();
    at_heads(sq, (const E *)kv.k + (int64_t)kvh * head_dim, (const E *)kv.v + (int64_t)kvh * head_dim, kvd, kv.blocks,
             kv.shift, p + 1, k0,
             sinks ? sinks[h] : -INFINITY, p, sk, sv, head_dim, scale, out + (int64_t)h * head_dim, sm_m, sm_l, sm_o,
             pre, kr0, vr0);
}

/* MOET_ATTN_PRE=0: k_attn_decode reads all its keys after its wait (the A/B of the preloaded first group); bit 0.
 * MOET_ATTN_TRIG=1 (an experiment; bit 1): k_attn_decode lets o_proj launch only once its own wait has returned,
 * not at its start. The timeline (stop 37, 30b, an H100) has the attention's waits returning 0.8-4 us (median 3.2)
 * after the q/k/v product's last CTA, while o_proj's CTAs, launched at the attention's start, have ~13 MB of ring
 * reads in flight: the same signature as down's completion flush queued behind q/k/v's bulk reads (stop 31). Late,
 * o_proj gives up most of its head start; whether the earlier release pays for that is what the A/B says. */
static int32_t at_pre(void) {
    const char *e = getenv("MOET_ATTN_PRE"), *t = getenv("MOET_ATTN_TRIG");
    return (int32_t)!(e && e[0] == '0') | (t && t[0] == '1' ? 2 : 0);
}

/* The q / k norm weights' device copies (NULL where there is none); 0 after recording an error. */
static int at_norms(cu_backend *c, const float *q_norm, const float *k_norm, int hd, const float **qn, const float **kn) {
    *qn = *kn = NULL;
    if (q_norm && !(*qn = (const float *)cu_weight(c, q_norm, (size_t)hd * sizeof(float)))) return 0;
    if (k_norm && !(*kn = (const float *)cu_weight(c, k_norm, (size_t)hd * sizeof(float)))) return 0;
    return 1;
}

/* Whether k_attn_decode takes rows of this shape: the rows fit the fused kernel (2 x the prep's threads <= the CTA). */
static int at_decode_ok(const moet_attn_args *a, int32_t rot_dim) {
    const int hd = a->head_dim;
    return rot_dim >= 2 && rot_dim <= hd && !(rot_dim % 2) && !(hd % 2) && hd <= AT_MAX_D * 32 && a->n_kv > 0 && !(a->n_heads % a->n_kv) &&
           2 * (((hd / 2 + 31) / 32) * 32) <= AT_WARPS * 32;
}

extern "C" int cu_attn_rows(moet_backend *be, float *q, float *k, const float *v, const float *q_norm,
                            const float *k_norm, float eps, const moet_rope *rp, const moet_kv_ref *rows,
                            const moet_attn_args *a) {
    cu_backend *c = cu_of(be);
    if (!at_decode_ok(a, rp->dim) || a->n_tok < 1 || a->n_tok > 65535 || a->q != q) return 1;
    if (c->err[0]) return 0;
    const int hd = a->head_dim;
    const float *qn, *kn, *sk = NULL;
    if (!at_norms(c, q_norm, k_norm, hd, &qn, &kn)) return 0;
    if (a->sinks && !(sk = (const float *)cu_weight(c, a->sinks, (size_t)a->n_heads * sizeof(float)))) return 0;
    if (cu_attn_split(c, q, k, v, qn, kn, eps, rp, rows, a, 1, sk)) return 0; /* (attn_split.cu, where it applies) */
    const moet_kv_ref none = {NULL, NULL, NULL, 0, a->kv.type};
    const dim3 grid((unsigned)a->n_heads, (unsigned)a->n_tok);
    if (a->kv.type == MOET_KVE_F16)
        cu_launch_pdl(c, k_attn_decode<__half>, grid, dim3(AT_WARPS * 32), 0, q, k, v, a->n_heads, a->n_kv, hd, qn,
                      kn, eps, *rp, a->pos, none, rows, a->scale, sk, a->window, a->out, at_pre());
    else
        cu_launch_pdl(c, k_attn_decode<float>, grid, dim3(AT_WARPS * 32), 0, q, k, v, a->n_heads, a->n_kv, hd, qn,
                      kn, eps, *rp, a->pos, none, rows, a->scale, sk, a->window, a->out, at_pre());
    CU_LAUNCHED(c, "k_attn_decode (rows)");
    return 0;
}

extern "C" void cu_attn_fused(moet_backend *be, float *q, float *k, const float *v, const float *q_norm,
                              const float *k_norm, float eps, const moet_rope *rp, const moet_attn_args *a) {
    cu_backend *c = cu_of(be);
    if (c->err[0] || a->n_tok <= 0) return;
    const int hd = a->head_dim;
    /* one token whose rows fit the fused kernel; otherwise the composition */
    if (a->n_tok != 1 || !at_decode_ok(a, rp->dim) || a->q != q) {
        cu_attn_prep(be, q, k, v, a->n_tok, a->n_heads, a->n_kv, hd, q_norm, k_norm, eps, rp, a->pos, &a->kv);
        cu_attention(be, a);
        return;
    }
    const float *qn, *kn, *sk = NULL;
    if (!at_norms(c, q_norm, k_norm, hd, &qn, &kn)) return;
    if (a->sinks && !(sk = (const float *)cu_weight(c, a->sinks, (size_t)a->n_heads * sizeof(float)))) return;
    if (cu_attn_split(c, q, k, v, qn, kn, eps, rp, NULL, a, 1, sk)) return; /* (attn_split.cu, where it applies) */
    if (a->kv.type == MOET_KVE_F16)
        cu_launch_pdl(c, k_attn_decode<__half>, dim3((unsigned)a->n_heads), dim3(AT_WARPS * 32), 0, q, k, v,
                      a->n_heads, a->n_kv, hd, qn, kn, eps, *rp, a->pos, a->kv, (const moet_kv_ref *)NULL, a->scale, sk,
                      a->window, a->out, at_pre());
    else
        cu_launch_pdl(c, k_attn_decode<float>, dim3((unsigned)a->n_heads), dim3(AT_WARPS * 32), 0, q, k, v,
                      a->n_heads, a->n_kv, hd, qn, kn, eps, *rp, a->pos, a->kv, (const moet_kv_ref *)NULL, a->scale, sk,
                      a->window, a->out, at_pre());
    CU_LAUNCHED(c, "k_attn_decode");
}
