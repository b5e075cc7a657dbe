/*
 * mla.cu — DeepSeek-V3's multi-head latent attention on the latent cache ("absorbed", backend.h: mla_attn).
 *
 * Why: the full keys and values MLA expands to are 2 x 128 heads x 192 floats a token and layer at V3's shape
 * (49152 floats); the latent row [k_pe', c] is 576. On a GPU that cannot hold the checkpoint the KV cache is the
 * other big buffer, so the latent form is what lets a long context fit at all.
 *
 * Two launches a layer:
 *   k_mla_store  one CTA a token: its cache row, k_pe de-interleaved (when asked) and rotated, then c. All of the
 *                chunk's rows go in before any query reads them (a token sees the chunk's earlier ones).
 *   k_mla_attn   one CTA a (head, token):
 *                  q_pe' as mla_prep would place it, rotated; q_lat = W_UK[h]^T q_nope (warps over W_UK's rows,
 *                  lanes over 32-column groups, partials added in warp order);
 *                  the online softmax over keys 0 .. pos[t] (warps over pairs of keys, each key row read once and
 *                  used as key and value: the value is the row's last kvlr floats), merged in warp order;
 *                  out = W_UV[h] o_lat (a warp a row, a fixed butterfly).
 * No atomics: runs are deterministic, graph or eager. Every size comes from the launch, positions from device
 * memory, so one recorded decode step serves every position.
 * Bytes a decode token and layer: kv_b once (n_heads (nope + vd) kvlr elements; L2 serves the heads' repeats within
 * a chunk) + (pos + 1) (rope + kvlr) x 4 per head (from L2 after the first head); FLOPs 2 n_heads ((nope + vd) kvlr
 * + 2 (pos + 1) (rope + kvlr)).
 * Next: several heads a CTA over one pass of the latent rows (they are one MQA group), tensor cores for the scores.
 */
#include <math.h>

#include "backend/cuda/common.cuh"
#include "backend/cuda/cuda_int.h"
#include "backend/mla_src.h"

#define MLA_WARPS 8
#define MLA_MAX_D 20 /* rope + kvlr <= 640 (V3 and Kimi-K2: 64 + 512) */
#define MLA_G 2      /* keys a warp takes at once, both rows requested before any math */

/* v[0 .. rope) rotate-half by pairs (i, i + rope/2) at position p, as the CPU's rope_vec. All threads; v in shared
 * memory; the caller synchronises before and after. */
__device__ __forceinline__ void mla_rotate(float *v, int rope, const moet_rope &rp, int32_t p) {
    const int half = rope / 2;
    for (int i = threadIdx.x; i < half && i < rp.dim / 2; i += blockDim.x) {
        float co, si;
        cu_rope_cs(rp, i, p, &co, &si);
        const float a = v[i], b = v[i + half];
        v[i] = a * co - b * si;
        v[i + half] = b * co + a * si;
    }
}

__global__ void k_mla_store(const float *__restrict__ ckv, const float *__restrict__ kpe, int32_t rope, int32_t kvlr,
                            int32_t interleave, const __grid_constant__ moet_rope rp, const int32_t *pos,
                            moet_kv_ref kv) {
    extern __shared__ float sp[];
    const int64_t t = blockIdx.x;
    const int32_t p = pos[t], rd = rope + kvlr;
    const int64_t row = moet_kv_row(kv.blocks, kv.shift, p) * rd; /* (f32 or f16 elements: kv.type) */
    for (int i = threadIdx.x; i < rope; i += blockDim.x) sp[i] = kpe[t * rope + moet_mla_src(i, rope, interleave)];
    __syncthreads();
    mla_rotate(sp, rope, rp, p);
    __syncthreads();
    for (int i = threadIdx.x; i < rope; i += blockDim.x) cu_kv_put(kv.k, kv.type, row + i, sp[i]);
    for (int i = threadIdx.x; i < kvlr; i += blockDim.x) cu_kv_put(kv.k, kv.type, row + rope + i, ckv[t * kvlr + i]);
}

/* Dynamic shared memory: qf [rd] | part [MLA_WARPS][kvlr] (q_lat's partials, then o_lat) | sm_o [MLA_WARPS][32 nd].
 * E: the pool's elements (float or __half). */
template <typename E>
__global__ void __launch_bounds__(MLA_WARPS * 32)
k_mla_attn(const float *__restrict__ q, const uint8_t *__restrict__ wb, int32_t wtype, size_t row_bytes, float qscale,
           float qbeta, int32_t nh, int32_t nope, int32_t rope, int32_t vd, int32_t kvlr, int32_t interleave,
           const __grid_constant__ moet_rope rp, const int32_t *pos, moet_kv_ref kv, float scale,
           float *__restrict__ out) {
    extern __shared__ __align__(16) float msm[];
    __shared__ float sm_m[MLA_WARPS], sm_l[MLA_WARPS];
    const int h = blockIdx.x, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t t = blockIdx.y;
    const int32_t p = pos[t], rd = rope + kvlr, nd = (rd + 31) / 32, G = kvlr / 32;
    float *qf = msm, *part = qf + rd, *sm_o = part + MLA_WARPS * kvlr;
    const float *qh = q + (t * nh + h) * (int64_t)(nope + rope);
    const uint8_t *wh = wb + (size_t)h * (size_t)(nope + vd) * row_bytes; /* head h's W_UK rows, then W_UV's */
    for (int i = threadIdx.x; i < rope; i += blockDim.x) qf[i] = qh[nope + moet_mla_src(i, rope, interleave)];
    /* q_lat: warp w over rows i = w, w + 8, ..; lane over column groups */
    for (int g = lane; g < G; g += 32) {
        float acc[32];
#pragma unroll
        for (int j = 0; j < 32; j++) acc[j] = 0.f;
        for (int i = warp; i < nope; i += MLA_WARPS) {
            float v[32];
            cu_decode32(wtype, wh + (size_t)i * row_bytes, g, qscale, qbeta, v);
            const float qi = qh[i];
#pragma unroll
            for (int j = 0; j < 32; j++) acc[j] = fmaf(qi, v[j], acc[j]);
        }
#pragma unroll
        for (int j = 0; j < 32; j++) part[warp * kvlr + 32 * g + j] = acc[j];
    }
    __syncthreads();
    mla_rotate(qf, rope, rp, p);
    for (int c = threadIdx.x; c < kvlr; c += blockDim.x) {
        float s = 0.f;
        for (int w = 0; w < MLA_WARPS; w++) s += part[w * kvlr + c];
        qf[rope + c] = s;
    }
    __syncthreads();
    /* the online softmax: each key row is its own value (its last kvlr floats) */
    float qv[MLA_MAX_D], o[MLA_MAX_D];
#pragma unroll
    for (int d = 0; d < MLA_MAX_D; d++) {
        const int i = lane + 32 * d;
        qv[d] = d < nd && i < rd ? qf[i] : 0.f;
        o[d] = 0.f;
    }
    float m = -INFINITY, l = 0.f;
    const int32_t n_keys = p + 1;
    for (int32_t j0 = warp * MLA_G; j0 < n_keys; j0 += MLA_WARPS * MLA_G) {
        float kr[MLA_G][MLA_MAX_D];
#pragma unroll
        for (int g = 0; g < MLA_G; g++) {
            const int32_t j = j0 + g < n_keys ? j0 + g : j0;
            const E *kp = (const E *)kv.k + moet_kv_row(kv.blocks, kv.shift, j) * rd;
#pragma unroll
            for (int d = 0; d < MLA_MAX_D; d++) {
                const int i = lane + 32 * d;
                kr[g][d] = d < nd && i < rd ? cu_kv_ld(kp + i) : 0.f;
            }
        }
        cu_osm_step<MLA_G, MLA_MAX_D>(qv, kr, kr, j0, n_keys, scale, m, l, o); /* each row its own value */
    }
    if (lane == 0) { sm_m[warp] = m; sm_l[warp] = l; }
#pragma unroll
    for (int d = 0; d < MLA_MAX_D; d++)
        if (d < nd) sm_o[warp * 32 * nd + lane + 32 * d] = o[d];
    __syncthreads();
    float *ol = part; /* o_lat [kvlr], merged in warp order (q_lat's partials are spent) */
    {
        float M = -INFINITY;
        for (int w = 0; w < MLA_WARPS; w++) M = fmaxf(M, sm_m[w]);
        float L = 0.f;
        for (int w = 0; w < MLA_WARPS; w++)
            if (sm_m[w] != -INFINITY) L += sm_l[w] * expf(sm_m[w] - M);
        const float inv = 1.0f / L;
        for (int c = threadIdx.x; c < kvlr; c += blockDim.x) {
            float acc = 0.f;
            for (int w = 0; w < MLA_WARPS; w++) {
                if (sm_m[w] == -INFINITY) continue; /* a warp that saw no key */
                acc += sm_o[w * 32 * nd + rope + c] * expf(sm_m[w] - M);
            }
            ol[c] = acc * inv;
        }
    }
    __syncthreads();
    /* out = W_UV[h] o_lat: a warp a row */
    float *orow = out + (t * nh + h) * (int64_t)vd;
    for (int r = warp; r < vd; r += MLA_WARPS) {
        const uint8_t *wr = wh + (size_t)(nope + r) * row_bytes;
        float a = 0.f;
        for (int g = lane; g < G; g += 32) {
            float v[32];
            cu_decode32(wtype, wr, g, qscale, qbeta, v);
#pragma unroll
            for (int j = 0; j < 32; j++) a = fmaf(v[j], ol[32 * g + j], a);
        }
        a = cu_warp_sum(a);
        if (lane == 0) orow[r] = a;
    }
}

extern "C" void cu_mla_attn(moet_backend *be, const float *q, const float *ckv, const float *kpe,
                            const moet_weight *kv_b, int64_t n, int32_t nh, int32_t nope, int32_t rope, int32_t vd,
                            int32_t kvlr, int32_t interleave, const moet_rope *rp, const int32_t *pos,
                            const moet_kv_ref *kv, float scale, float *out) {
    cu_backend *c = cu_of(be);
    if (c->err[0] || n <= 0) return;
    const int32_t rd = rope + kvlr;
    if (kvlr <= 0 || kvlr % 32 || rope < 0 || rope % 2 || rd > 32 * MLA_MAX_D || nope < 0 || vd <= 0 || nh <= 0 ||
        kv_b->rotated || kv_b->cols != kvlr || kv_b->rows != (int64_t)nh * (nope + vd) || rp->dim > rope) {
        cu_fail(c, cudaErrorInvalidValue, "mla_attn: a shape or weight layout this kernel does not take", __FILE__,
                __LINE__);
        return;
    }
    const uint8_t *d = cu_weight_mat(c, kv_b);
    if (!d) return;
    k_mla_store<<<(unsigned)n, 128, (size_t)(rope > 0 ? rope : 1) * sizeof(float), c->stream>>>(
        ckv, kpe, rope, kvlr, interleave, *rp, pos, *kv);
    CU_LAUNCHED(c, "k_mla_store");
    const int nd = (rd + 31) / 32;
    const size_t smem = ((size_t)rd + (size_t)MLA_WARPS * kvlr + (size_t)MLA_WARPS * 32 * nd) * sizeof(float);
    if (smem > 48 * 1024) {
        cu_fail(c, cudaErrorInvalidValue, "mla_attn: latent rank too large for the kernel's shared memory", __FILE__,
                __LINE__);
        return;
    }
    if (kv->type == MOET_KVE_F16)
        k_mla_attn<__half><<<dim3((unsigned)nh, (unsigned)n), MLA_WARPS * 32, smem, c->stream>>>(
            q, d, kv_b->type, kv_b->row_bytes, kv_b->qscale, kv_b->qbeta, nh, nope, rope, vd, kvlr, interleave, *rp, pos,
            *kv, scale, out);
    else
        k_mla_attn<float><<<dim3((unsigned)nh, (unsigned)n), MLA_WARPS * 32, smem, c->stream>>>(
            q, d, kv_b->type, kv_b->row_bytes, kv_b->qscale, kv_b->qbeta, nh, nope, rope, vd, kvlr, interleave, *rp, pos,
            *kv, scale, out);
    CU_LAUNCHED(c, "k_mla_attn");
}
