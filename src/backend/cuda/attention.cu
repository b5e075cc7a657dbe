/*
 * attention.cu — causal GQA attention over the contiguous per-layer KV cache, decode and prefill alike.
 *
 * One CTA per (query head, token); its warps take keys in turn and keep a running max, sum and output (the online
 * softmax), merged across warps at the end in a fixed order: deterministic, no scores buffer, any context length.
 * A query at position p reads keys 0..p, which it finds in device memory (pos), so one recorded decode step serves
 * every position. Bytes per query head: (p+1) × head_dim × 8 (K and V rows); FLOPs: 4 × (p+1) × head_dim.
 * Paged KV blocks and split-K over long contexts are the next steps (docs/performance.md).
 */
#include <math.h>

#include "backend/cuda/common.cuh"
#include "backend/cuda/cuda_int.h"

#define AT_WARPS 4
#define AT_MAX_D 8 /* head_dim <= 256 */

__global__ void __launch_bounds__(AT_WARPS * 32)
k_attention(const float *__restrict__ q, const float *__restrict__ kc, const float *__restrict__ vc,
            const int32_t *__restrict__ pos, int32_t n_heads, int32_t n_kv, int32_t head_dim, float scale,
            float *__restrict__ out) {
    __shared__ float sm_m[AT_WARPS], sm_l[AT_WARPS], sm_o[AT_WARPS][AT_MAX_D * 32];
    cu_pdl_trigger();
    cu_pdl_wait();
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
    for (int32_t j = warp; j < n_keys; j += AT_WARPS) {
        const float *kr = kc + (int64_t)j * kv_stride + (int64_t)kvh * head_dim;
        float s = 0.f;
#pragma unroll
        for (int d = 0; d < AT_MAX_D; d++) {
            int i = lane + 32 * d;
            if (d < nd && i < head_dim) s = fmaf(qv[d], kr[i], s);
        }
        s = cu_warp_sum(s) * scale;
        const float mn = fmaxf(m, s), corr = expf(m - mn), p = expf(s - mn);
        l = l * corr + p;
        const float *vr = vc + (int64_t)j * kv_stride + (int64_t)kvh * head_dim;
#pragma unroll
        for (int d = 0; d < AT_MAX_D; d++) {
            int i = lane + 32 * d;
            if (d < nd && i < head_dim) o[d] = o[d] * corr + p * vr[i];
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
