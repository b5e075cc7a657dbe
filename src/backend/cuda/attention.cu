/*
 * attention.cu — causal GQA attention over the contiguous per-layer KV cache, decode and prefill alike.
 *
 * One CTA per (query head, token); its warps take groups of AT_G keys in turn (all of a group's K and V rows in
 * flight at once: per key, two dependent round trips to memory made decode attention grow ~0.3 us per key and
 * layer) and keep a running max, sum and output (the online softmax), merged across warps at the end in a fixed
 * order: deterministic, no scores buffer, any context length.
 * A query at position p reads keys 0..p, which it finds in device memory (pos), so one recorded decode step serves
 * every position. Bytes per query head: (p+1) × head_dim × 8 (K and V rows); FLOPs: 4 × (p+1) × head_dim.
 * Paged KV blocks and split-K over long contexts are the next steps (docs/performance.md).
 */
#include <math.h>

#include "backend/cuda/common.cuh"
#include "backend/cuda/cuda_int.h"

#define AT_WARPS 8
#define AT_MAX_D 8 /* head_dim <= 256 */
#define AT_G 4     /* keys a warp takes at once: their K and V rows are all requested before any math */

__global__ void __launch_bounds__(AT_WARPS * 32)
k_attention(const float *__restrict__ q, const float *__restrict__ kc, const float *__restrict__ vc,
            const int32_t *__restrict__ pos, int32_t n_heads, int32_t n_kv, int32_t head_dim, float scale,
            float *__restrict__ out) {
    cu_pdl_trigger();
    cu_pdl_wait();
    __shared__ float sm_m[AT_WARPS], sm_l[AT_WARPS], sm_o[AT_WARPS][AT_MAX_D * 32];
    const int h = blockIdx.x, t = blockIdx.y, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int kvh = h / (n_heads / n_kv), nd = (head_dim + 31) / 32;
    const int64_t kv_stride = (int64_t)n_kv * head_dim;
    const float *qr = q + ((int64_t)t * n_heads + h) * head_dim;
    float qv[AT_MAX_D], o[AT_MAX_D];
#pragma unroll
    for (int d = 0; d < AT_MAX_D; d++) {
        int i = lane + 32 * d;
        qv[d] = d < nd && i < head_dim ? qr[i] : 0.f;
        o[d] = 0.f;
    }
    float m = -INFINITY, l = 0.f;
    const int32_t n_keys = pos[t] + 1;
    /* Each step a warp takes keys j0 .. j0 + AT_G - 1 (those < n_keys): one memory round trip for all of them,
     * not two per key, then the online-softmax update with the group's maximum. */
    for (int32_t j0 = warp * AT_G; j0 < n_keys; j0 += AT_WARPS * AT_G) {
        float kr[AT_G][AT_MAX_D], vr[AT_G][AT_MAX_D];
#pragma unroll
        for (int g = 0; g < AT_G; g++) {
            const int32_t j = j0 + g < n_keys ? j0 + g : j0;
            const float *kp = kc + (int64_t)j * kv_stride + (int64_t)kvh * head_dim;
            const float *vp = vc + (int64_t)j * kv_stride + (int64_t)kvh * head_dim;
#pragma unroll
            for (int d = 0; d < AT_MAX_D; d++) {
                int i = lane + 32 * d;
                const int ok = d < nd && i < head_dim;
                kr[g][d] = ok ? kp[i] : 0.f;
                vr[g][d] = ok ? vp[i] : 0.f;
            }
        }
        float s[AT_G];
#pragma unroll
        for (int g = 0; g < AT_G; g++) {
            float a = 0.f;
#pragma unroll
            for (int d = 0; d < AT_MAX_D; d++) a = fmaf(qv[d], kr[g][d], a);
            s[g] = a;
        }
#pragma unroll
        for (int off = 16; off > 0; off >>= 1)
#pragma unroll
            for (int g = 0; g < AT_G; g++) s[g] += __shfl_xor_sync(0xffffffffu, s[g], off);
        float mn = m;
#pragma unroll
        for (int g = 0; g < AT_G; g++) {
            s[g] = j0 + g < n_keys ? s[g] * scale : -INFINITY;
            mn = fmaxf(mn, s[g]);
        }
        const float corr = expf(m - mn);
        float p[AT_G], ps = 0.f;
#pragma unroll
        for (int g = 0; g < AT_G; g++) { p[g] = expf(s[g] - mn); ps += p[g]; }
        l = l * corr + ps;
#pragma unroll
        for (int d = 0; d < AT_MAX_D; d++) {
            float acc = o[d] * corr;
#pragma unroll
            for (int g = 0; g < AT_G; g++) acc = fmaf(p[g], vr[g][d], acc);
            o[d] = acc;
        }
        m = mn;
    }
    if (lane == 0) { sm_m[warp] = m; sm_l[warp] = l; }
#pragma unroll
    for (int d = 0; d < AT_MAX_D; d++) sm_o[warp][lane + 32 * d] = o[d];
    __syncthreads();
    if (warp == 0) {
        float M = -INFINITY;
        for (int w = 0; w < AT_WARPS; w++) M = fmaxf(M, sm_m[w]);
        float L = 0.f, acc[AT_MAX_D];
#pragma unroll
        for (int d = 0; d < AT_MAX_D; d++) acc[d] = 0.f;
        for (int w = 0; w < AT_WARPS; w++) {
            if (sm_m[w] == -INFINITY) continue; /* a warp that saw no key */
            const float f = expf(sm_m[w] - M);
            L += sm_l[w] * f;
#pragma unroll
            for (int d = 0; d < AT_MAX_D; d++) acc[d] += sm_o[w][lane + 32 * d] * f;
        }
        float *orow = out + ((int64_t)t * n_heads + h) * head_dim;
        const float inv = 1.0f / L;
#pragma unroll
        for (int d = 0; d < AT_MAX_D; d++) {
            int i = lane + 32 * d;
            if (d < nd && i < head_dim) orow[i] = acc[d] * inv;
        }
    }
}

extern "C" size_t cu_attn_scratch_bytes(moet_backend *be, int32_t n_ctx) { return 16; }

extern "C" void cu_attention(moet_backend *be, const moet_attn_args *a) {
    cu_backend *c = cu_of(be);
    if (c->err[0] || a->n_tok <= 0) return;
    if (a->head_dim > AT_MAX_D * 32 || a->n_kv <= 0 || a->n_heads % a->n_kv) {
        cu_fail(c, cudaErrorInvalidValue, "attention: head_dim > 256 or heads not a multiple of kv heads", __FILE__, __LINE__);
        return;
    }
    dim3 grid((unsigned)a->n_heads, (unsigned)a->n_tok);
    cu_launch_pdl(c, k_attention, grid, dim3(AT_WARPS * 32), 0, a->q, a->k_cache, a->v_cache, a->pos, a->n_heads,
                  a->n_kv, a->head_dim, a->scale, a->out);
    CU_LAUNCHED(c, "k_attention");
}
