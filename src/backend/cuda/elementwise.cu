/*
 * elementwise.cu — the small bandwidth-trivial ops: residual/bias add, RMSNorm, RoPE, the KV-cache write, SwiGLU's
 * gating, and the synthetic weights' generator. Each follows the CPU reference's arithmetic (cpu_backend.c): RMSNorm
 * sums squares in double, RoPE's angle is the f32 product transformers computes, rounded cos/sin of it.
 */
#include "backend/cuda/common.cuh"
#include "backend/cuda/cuda_int.h"
#include "backend/mla_src.h"
#include "quant/synth.h"

__global__ void k_add(float *y, const float *x, const float *bias, int64_t n, int64_t dim) {
    CU_TRACE(CU_TK_ELEMWISE << 8 | 0);
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n * dim; i += (int64_t)gridDim.x * blockDim.x)
        y[i] += bias ? bias[i % dim] : x[i];
}

static unsigned grid_for(int64_t work, int threads) {
    int64_t b = (work + threads - 1) / threads;
    return (unsigned)(b < 1 ? 1 : b > 65535 ? 65535 : b);
}

extern "C" void cu_add(moet_backend *be, float *y, const float *x, const float *bias, int64_t n, int64_t dim) {
    cu_backend *c = cu_of(be);
    if (c->err[0] || n <= 0 || (!x && !bias)) return;
    const float *b = NULL;
    if (bias && !(b = (const float *)cu_weight(c, bias, (size_t)dim * sizeof(float)))) return;
    k_add<<<grid_for(n * dim, 256), 256, 0, c->stream>>>(y, bias ? NULL : x, b, n, dim);
    CU_LAUNCHED(c, "k_add");
}

__global__ void k_rms_norm(const float *x, const float *w, int64_t dim, float eps, float *y) {
    CU_TRACE(CU_TK_ELEMWISE << 8 | 1);
    __shared__ double part[32];
    const float *xr = x + (int64_t)blockIdx.x * dim;
    float *yr = y + (int64_t)blockIdx.x * dim;
    double ss = 0;
    for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) ss += (double)xr[i] * xr[i];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = ss;
    __syncthreads();
    if (threadIdx.x == 0) {
        double t = 0;
        for (int i = 0; i < (int)(blockDim.x >> 5); i++) t += part[i];
        part[0] = t;
    }
    __syncthreads();
    const float inv = (float)(1.0 / sqrt(part[0] / (double)dim + (double)eps));
    for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) yr[i] = w[i] * (xr[i] * inv);
}

extern "C" void cu_rms_norm(moet_backend *be, const float *x, const float *w, int64_t n, int64_t dim, float eps,
                            float *y) {
    cu_backend *c = cu_of(be);
    if (c->err[0] || n <= 0) return;
    const float *wd = (const float *)cu_weight(c, w, (size_t)dim * sizeof(float));
    if (!wd) return;
    int threads = dim >= 1024 ? 256 : dim >= 256 ? 128 : 64;
    k_rms_norm<<<(unsigned)n, threads, 0, c->stream>>>(x, wd, dim, eps, y);
    CU_LAUNCHED(c, "k_rms_norm");
}

__global__ void k_rope(float *x, int64_t n_tok, int32_t n_heads, int32_t head_dim, const __grid_constant__ moet_rope rp,
                       const int32_t *pos) {
    const int half = rp.dim / 2;
    const int64_t total = n_tok * n_heads * half;
    for (int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; k < total; k += (int64_t)gridDim.x * blockDim.x) {
        const int i = (int)(k % half);
        const int64_t th = k / half, t = th / n_heads;
        float co, si;
        cu_rope_cs(rp, i, pos[t], &co, &si);
        float *v = x + th * head_dim;
        const float a = v[i], b = v[i + half];
        v[i] = __fsub_rn(__fmul_rn(a, co), __fmul_rn(b, si)); /* no contraction: as k_attn_prep */
        v[i + half] = __fadd_rn(__fmul_rn(b, co), __fmul_rn(a, si));
    }
}

extern "C" void cu_rope(moet_backend *be, float *x, int64_t n_tok, int32_t n_heads, int32_t head_dim,
                        const moet_rope *rp, const int32_t *pos) {
    cu_backend *c = cu_of(be);
    if (c->err[0] || n_tok <= 0) return;
    k_rope<<<grid_for(n_tok * n_heads * (rp->dim / 2), 256), 256, 0, c->stream>>>(x, n_tok, n_heads, head_dim, *rp,
                                                                                  pos);
    CU_LAUNCHED(c, "k_rope");
}

__global__ void k_kv_store(void *pool, int32_t type, const int32_t *blocks, int32_t shift, const float *src,
                           const int32_t *pos, int64_t n_tok, int64_t dim) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n_tok * dim; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t t = i / dim;
        cu_kv_put(pool, type, moet_kv_row(blocks, shift, pos[t]) * dim + i % dim, src[i]);
    }
}

extern "C" void cu_kv_store(moet_backend *be, void *pool, int32_t type, const int32_t *blocks, int32_t shift,
                            const float *src, const int32_t *pos, int64_t n_tok, int64_t dim) {
    cu_backend *c = cu_of(be);
    if (c->err[0] || n_tok <= 0) return;
    k_kv_store<<<grid_for(n_tok * dim, 256), 256, 0, c->stream>>>(pool, type, blocks, shift, src, pos, n_tok, dim);
    CU_LAUNCHED(c, "k_kv_store");
}

/* The attention inputs of n_tok tokens in one launch: a CTA a token, its heads in passes of AP_THREADS / T at once
 * (T = head_dim / 2 rounded up to warps): n_heads q heads, then n_kv k heads, then n_kv v heads. q and k heads:
 * per-head RMSNorm (double sums, as k_rms_norm) when a norm weight is given, then rotate-half RoPE with k_rope's
 * arithmetic, in place; k heads are also written to the cache row pos[t], v heads only copied there. Thread i of a
 * head's group owns elements i and i + head_dim / 2 (with rot_dim < head_dim, GLM-4.5's partial rotary, also the
 * pair i, i + rot_dim / 2 once the normed head is back in its row). The token's RoPE
 * cos / sin (double-precision pow, cos, sin: the costly part) are computed once into shared memory for all its
 * heads, not once a head (a CTA a (head, token) took 30 us at 512 tokens of qwen3-30b-a3b). Since stop 40 a token's
 * passes are split over gridDim.y CTAs (at most AP_SPLIT), each computing the cos / sin again: one CTA a token ran
 * ten passes of two barriers each in a row at 30b (40 heads, 4 a pass): 4% of a 512-token layer's kernel time on an
 * H100 for ~10 MB (a latency chain: 0.65 of a wave). Each head's arithmetic is the same wherever it runs:
 * bit-identical. */
#define AP_THREADS 256
#define AP_SPLIT 4 /* CTAs a token at most */
__global__ void __launch_bounds__(AP_THREADS)
k_attn_prep(float *q, float *k, const float *v, int32_t n_heads, int32_t n_kv, int32_t head_dim,
            const float *__restrict__ q_norm, const float *__restrict__ k_norm, float eps,
            const __grid_constant__ moet_rope rp, const int32_t *pos, moet_kv_ref kv) {
    CU_TRACE(CU_TK_ELEMWISE << 8 | 3);
    const int rot_dim = rp.dim;
    __shared__ double part[AP_THREADS / 32];
    __shared__ float cs[2][AP_THREADS]; /* cos, sin of element i < rot_dim / 2 (head_dim <= 2 AP_THREADS) */
    const int t = blockIdx.x, half = head_dim / 2, T = ((half + 31) / 32) * 32, slots = AP_THREADS / T;
    const int rh = rot_dim / 2, partial = rot_dim != head_dim;
    const int slot = threadIdx.x / T, i = threadIdx.x % T, nhw = T / 32;
    const int64_t kvd = (int64_t)n_kv * head_dim;
    cu_pdl_trigger();
    cu_pdl_wait();
    CU_TRACE_WAITED();
    const int32_t p = pos[t];
    const int64_t prow = moet_kv_row(kv.blocks, kv.shift, p); /* the token's row in the pools */
    for (int j = threadIdx.x; j < rh; j += blockDim.x) cu_rope_cs(rp, j, p, &cs[0][j], &cs[1][j]);
    __syncthreads();
    const int nh = n_heads + 2 * n_kv, per = (nh + slots - 1) / slots, per_cta = (per + gridDim.y - 1) / gridDim.y;
    const int hb = (int)blockIdx.y * per_cta * slots, he = min(nh, hb + per_cta * slots);
    for (int h0 = hb; h0 < he; h0 += slots) { /* every thread runs every pass (the barriers) */
        const int hh = h0 + slot, live = slot < slots && hh < he;
        if (live && hh >= n_heads + n_kv) { /* v head: a copy */
            const int64_t off = (int64_t)(hh - n_heads - n_kv) * head_dim;
            for (int j = i; j < head_dim; j += T) cu_kv_put(kv.v, kv.type, prow * kvd + off + j, v[t * kvd + off + j]);
        }
        const int qk = live && hh < n_heads + n_kv, is_q = hh < n_heads;
        float *row = !qk ? NULL : is_q ? q + ((int64_t)t * n_heads + hh) * head_dim
                                       : k + t * kvd + (int64_t)(hh - n_heads) * head_dim;
        const float *nw = is_q ? q_norm : k_norm;
        float a = qk && i < half ? row[i] : 0.f, b = qk && i < half ? row[i + half] : 0.f;
        if (q_norm || k_norm) { /* the same per-warp partials, added in the same order, as one CTA a head; the
                                  * barriers uniform over the CTA (a pass may mix q, k and v heads) */
            const float inv = cu_head_rms_inv(a, b, slot, slots, i, nhw, part, head_dim, eps);
            if (qk && nw && i < half) {
                a = nw[i] * (a * inv);
                b = nw[i + half] * (b * inv);
            }
        }
        if (partial) { /* rotate-half within the first rot_dim elements (pairs i, i + rot_dim / 2), the rest pass:
                        * the normed head back to its row, then the pairs, then the k row to the cache; the barriers
                        * uniform over the CTA as above */
            if (qk && i < half) { row[i] = a; row[i + half] = b; }
            __syncthreads();
            if (qk && i < rh) {
                const float x0 = row[i], x1 = row[i + rh], co = cs[0][i], si = cs[1][i];
                /* rounded products and sum, no FMA contraction: k_attn_decode's partial path gives the same floats
                 * whatever either compiles to (its tests compare them bit for bit) */
                row[i] = __fsub_rn(__fmul_rn(x0, co), __fmul_rn(x1, si));
                row[i + rh] = __fadd_rn(__fmul_rn(x1, co), __fmul_rn(x0, si));
            }
            __syncthreads();
            if (qk && !is_q && i < half) {
                const int64_t cr = prow * kvd + (int64_t)(hh - n_heads) * head_dim;
                cu_kv_put(kv.k, kv.type, cr + i, row[i]);
                cu_kv_put(kv.k, kv.type, cr + i + half, row[i + half]);
            }
            continue;
        }
        if (!qk || i >= half) continue;
        const float co = cs[0][i], si = cs[1][i];
        /* no FMA contraction: which product nvcc fuses depends on the code around it, and k_attn_prep,
         * k_attn_decode and the CPU must round alike (bit for bit between the GPU paths) */
        const float ra = __fsub_rn(__fmul_rn(a, co), __fmul_rn(b, si));
        const float rb = __fadd_rn(__fmul_rn(b, co), __fmul_rn(a, si));
        row[i] = ra;
        row[i + half] = rb;
        if (!is_q) {
            const int64_t cr = prow * kvd + (int64_t)(hh - n_heads) * head_dim;
            cu_kv_put(kv.k, kv.type, cr + i, ra);
            cu_kv_put(kv.k, kv.type, cr + i + half, rb);
        }
    }
}

extern "C" void cu_attn_prep(moet_backend *be, float *q, float *k, const float *v, int64_t n_tok, int32_t n_heads,
                             int32_t n_kv, int32_t head_dim, const float *q_norm, const float *k_norm, float eps,
                             const moet_rope *rp, const int32_t *pos, const moet_kv_ref *kv) {
    cu_backend *c = cu_of(be);
    if (c->err[0] || n_tok <= 0) return;
    const float *qn = NULL, *kn = NULL;
    if (q_norm && !(qn = (const float *)cu_weight(c, q_norm, (size_t)head_dim * sizeof(float)))) return;
    if (k_norm && !(kn = (const float *)cu_weight(c, k_norm, (size_t)head_dim * sizeof(float)))) return;
    const int32_t rot_dim = rp->dim;
    if (rot_dim > head_dim || rot_dim < 2 || rot_dim % 2 || head_dim > 2 * AP_THREADS || head_dim % 2) { /* the composition */
        if (q_norm) cu_rms_norm(be, q, q_norm, n_tok * n_heads, head_dim, eps, q);
        if (k_norm) cu_rms_norm(be, k, k_norm, n_tok * n_kv, head_dim, eps, k);
        cu_rope(be, q, n_tok, n_heads, head_dim, rp, pos);
        cu_rope(be, k, n_tok, n_kv, head_dim, rp, pos);
        cu_kv_store(be, kv->k, kv->type, kv->blocks, kv->shift, k, pos, n_tok, (int64_t)n_kv * head_dim);
        cu_kv_store(be, kv->v, kv->type, kv->blocks, kv->shift, v, pos, n_tok, (int64_t)n_kv * head_dim);
        return;
    }
    /* a token's passes over up to AP_SPLIT CTAs (see k_attn_prep) */
    const int T = ((head_dim / 2 + 31) / 32) * 32, slots = AP_THREADS / T, passes = (n_heads + 2 * n_kv + slots - 1) / slots;
    const unsigned split = passes < AP_SPLIT ? (unsigned)passes : AP_SPLIT;
    cu_launch_pdl(c, k_attn_prep, dim3((unsigned)n_tok, split), dim3(AP_THREADS), 0, q, k, v, n_heads, n_kv, head_dim,
                  qn, kn, eps, *rp, pos, *kv);
    CU_LAUNCHED(c, "k_attn_prep");
}

/* MLA's inputs as attn_prep takes them (backend.h): a CTA a (token, head); q's head goes through shared memory
 * because it is rewritten in place. Copies only. */
__global__ void k_mla_prep(float *q, const float *kvb, const float *kpe, int32_t nh, int32_t nope, int32_t rope,
                           int32_t vd, int32_t interleave, float *k, float *v) {
    extern __shared__ float sq[];
    const int64_t th = blockIdx.x, t = th / nh;
    const int hd = nope + rope;
    float *qh = q + th * hd, *kh = k + th * hd, *vh = v + th * hd;
    const float *src = kvb + th * (int64_t)(nope + vd), *kp = kpe + t * rope;
    for (int i = threadIdx.x; i < hd; i += blockDim.x) sq[i] = qh[i];
    __syncthreads();
    for (int i = threadIdx.x; i < hd; i += blockDim.x) {
        if (i < rope) {
            const int s = moet_mla_src(i, rope, interleave);
            qh[i] = sq[nope + s];
            kh[i] = kp[s];
        } else {
            qh[i] = sq[i - rope];
            kh[i] = src[i - rope];
        }
        vh[i] = i < vd ? src[nope + i] : 0.f;
    }
}

extern "C" void cu_mla_prep(moet_backend *be, float *q, const float *kvb, const float *kpe, int64_t n, int32_t nh,
                            int32_t nope, int32_t rope, int32_t vd, int32_t interleave, float *k, float *v) {
    cu_backend *c = cu_of(be);
    if (c->err[0] || n <= 0) return;
    const int hd = nope + rope;
    k_mla_prep<<<(unsigned)(n * nh), hd >= 256 ? 256 : 128, (size_t)hd * sizeof(float), c->stream>>>(
        q, kvb, kpe, nh, nope, rope, vd, interleave, k, v);
    CU_LAUNCHED(c, "k_mla_prep");
}

__global__ void k_heads_narrow(const float *x, int64_t rows, int32_t xd, int32_t w, float *y) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < rows * w; i += (int64_t)gridDim.x * blockDim.x)
        y[i] = x[(i / w) * xd + i % w];
}

extern "C" void cu_heads_narrow(moet_backend *be, const float *x, int64_t n, int32_t nh, int32_t xd, int32_t w,
                                float *y) {
    cu_backend *c = cu_of(be);
    if (c->err[0] || n <= 0) return;
    k_heads_narrow<<<grid_for(n * nh * w, 256), 256, 0, c->stream>>>(x, n * nh, xd, w, y);
    CU_LAUNCHED(c, "k_heads_narrow");
}

__global__ void k_swiglu(float *g, const float *u, int64_t n) {
    CU_TRACE(CU_TK_ELEMWISE << 8 | 2);
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const float a = g[i];
        g[i] = a / (1.0f + expf(-a)) * u[i];
    }
}

extern "C" void cu_swiglu(cu_backend *c, float *g, const float *u, int64_t n) {
    if (c->err[0] || n <= 0) return;
    k_swiglu<<<grid_for(n, 256), 256, 0, c->stream>>>(g, u, n);
    CU_LAUNCHED(c, "k_swiglu");
}

/* ---- synthetic weights: quant/synth.h, the same generator as the CPU backend's ------------------------------ */

__device__ __forceinline__ uint16_t f32_to_bf16(float f) { /* core/util.c moet_f32_to_bf16 */
    uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

__global__ void k_fill_float(void *p, int32_t type, int64_t n, float scale, uint64_t seed) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        float v = moet_synth_float(seed, (uint64_t)i, scale);
        if (type == MOET_TYPE_F32) ((float *)p)[i] = v;
        else if (type == MOET_TYPE_F16) ((uint16_t *)p)[i] = __half_as_ushort(__float2half_rn(v));
        else ((uint16_t *)p)[i] = f32_to_bf16(v);
    }
}

__global__ void k_fill_bytes(uint8_t *b, size_t total, uint64_t seed) {
    for (size_t w = (size_t)blockIdx.x * blockDim.x + threadIdx.x; w < (total + 7) / 8; w += (size_t)gridDim.x * blockDim.x) {
        uint64_t z = moet_synth_word(seed, w);
        for (size_t j = 0; j < 8 && w * 8 + j < total; j++) b[w * 8 + j] = (uint8_t)(z >> (8 * j));
    }
}

__global__ void k_fix_blocks(uint8_t *b, size_t nb, int32_t type, int32_t type_size, uint16_t q8d) {
    for (size_t k = (size_t)blockIdx.x * blockDim.x + threadIdx.x; k < nb; k += (size_t)gridDim.x * blockDim.x)
        moet_synth_fix_block(type, b + k * (size_t)type_size, q8d);
}

extern "C" void cu_fill_random(moet_backend *be, void *p, int32_t type, int64_t rows, int64_t cols, float scale,
                               uint64_t seed) {
    cu_backend *c = cu_of(be);
    if (c->err[0]) return;
    const moet_type_traits *tt = moet_type_get(type);
    size_t rb = moet_type_row_bytes(type, cols);
    if (!tt || !rb) return;
    if (type == MOET_TYPE_F32 || type == MOET_TYPE_F16 || type == MOET_TYPE_BF16) {
        k_fill_float<<<grid_for(rows * cols, 256), 256, 0, c->stream>>>(p, type, rows * cols, scale, seed);
        CU_LAUNCHED(c, "k_fill_float");
        return;
    }
    size_t total = rb * (size_t)rows;
    uint16_t q8d = __half_as_ushort(__float2half_rn(scale / 64.0f));
    k_fill_bytes<<<grid_for((int64_t)((total + 7) / 8), 256), 256, 0, c->stream>>>((uint8_t *)p, total, seed);
    if (CU_LAUNCHED(c, "k_fill_bytes")) return;
    k_fix_blocks<<<grid_for((int64_t)(total / tt->type_size), 256), 256, 0, c->stream>>>(
        (uint8_t *)p, total / (size_t)tt->type_size, type, tt->type_size, q8d);
    CU_LAUNCHED(c, "k_fix_blocks");
}
