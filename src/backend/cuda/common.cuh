/*
 * common.cuh — device helpers every op family uses: the formats' decoders (written from quant/formats.c, the scalar
 * oracle, and checked against it by tests/test_ops.c), the rotation (random-sign block Hadamard of quant/matq.c),
 * reductions, and the padded shared-memory layout for activations.
 *
 * Activations in shared memory are stored "padded natural": element i at i + i/32. A lane that owns group g (the
 * 32 elements one quantization block covers) reads element 32g + j at 33g + j, so the 32 lanes of a warp, each on its
 * own group, hit 32 different banks.
 */
#ifndef MOET_BACKEND_CUDA_COMMON_CUH
#define MOET_BACKEND_CUDA_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "backend/backend.h"
#include "quant/blocks.h"
#include "quant/tile.h"
#include "quant/types.h"
#include "backend/cuda/trace.cuh"

#define CU_PAD(i) ((i) + ((i) >> 5))

/* Programmatic dependent launch (sm_90+; no-ops below). A kernel launched with cu_launch_pdl may start while the
 * kernel before it in the stream is still running: before cu_pdl_wait() it may only read what no earlier kernel
 * writes (weights), after it everything earlier kernels wrote is visible. cu_pdl_trigger() lets the next kernel's
 * CTAs launch (they then sit in their own wait, their weight loads in flight). Every kernel launched with
 * cu_launch_pdl calls cu_pdl_wait() before it reads or writes activations.
 * Those activations were written by a grid that may still have been running when this one started: they must come through coherent loads (plain or __ldcg), never the read-only path (__ldg, or what
 * the compiler emits for `const T *__restrict__`: ld.global.nc requires the data to be read-only for the kernel's
 * whole lifetime). Measured: k_tc_gate_up reading topk_ids through a const __restrict__ pointer gave wrong experts
 * under MOET_PDL=1 (test_ops, hidden 256 / ffn 128). So activation parameters of PDL kernels are not __restrict__,
 * and cu_stage_f32 / cu_rot_chunk_t load with __ldcg. */
__device__ __forceinline__ void cu_pdl_wait(void) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void cu_pdl_trigger(void) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}

/* sm_90 bulk copies and cross-CTA flags (moe_fused.cu). A bulk copy (cp.async.bulk, the TMA's 1-D form) moves a
 * contiguous global range (16-byte aligned, a multiple of 16 bytes) into shared memory and counts its bytes down on
 * an mbarrier; the consumer waits on the barrier's phase parity. Flags: writers store, __threadfence, then
 * cu_flag_add (a release add at GPU scope); readers poll with cu_flag_read (an acquire load) and read what the
 * writers stored with __ldcg (L2: another SM's stores are not in this SM's L1). Compiled to nothing below sm_90:
 * the host never launches their users there. */
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define CU_HAS_BULK 1
#endif
__device__ __forceinline__ uint32_t cu_smem_u32(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void cu_mbar_init(uint64_t *bar, uint32_t count) {
#ifdef CU_HAS_BULK
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(cu_smem_u32(bar)), "r"(count) : "memory");
#endif
}
/* after cu_mbar_init, before any thread or the async proxy uses the barriers (then __syncthreads) */
__device__ __forceinline__ void cu_mbar_init_fence(void) {
#ifdef CU_HAS_BULK
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#endif
}
/* one arrival that also expects `bytes` of bulk copies in the barrier's current phase */
__device__ __forceinline__ void cu_mbar_expect(uint64_t *bar, uint32_t bytes) {
#ifdef CU_HAS_BULK
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(cu_smem_u32(bar)), "r"(bytes) : "memory");
#endif
}
__device__ __forceinline__ void cu_mbar_wait(uint64_t *bar, uint32_t parity) {
#ifdef CU_HAS_BULK
    uint32_t done = 0;
    while (!done)
        asm volatile("{\n\t.reg .pred p;\n\tmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\tselp.u32 %0, 1, 0, p;\n\t}"
                     : "=r"(done)
                     : "r"(cu_smem_u32(bar)), "r"(parity)
                     : "memory");
#endif
}
__device__ __forceinline__ void cu_bulk_load(void *dst, const void *src, uint32_t bytes, uint64_t *bar) {
#ifdef CU_HAS_BULK
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                     cu_smem_u32(dst)),
                 "l"(src), "r"(bytes), "r"(cu_smem_u32(bar))
                 : "memory");
#endif
}
/* shared memory the generic proxy read is about to be overwritten by bulk copies (after a __syncthreads) */
__device__ __forceinline__ void cu_fence_proxy_async(void) {
#ifdef CU_HAS_BULK
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
#endif
}
__device__ __forceinline__ int32_t cu_flag_read(const int32_t *p) {
    int32_t v = 0;
#ifdef CU_HAS_BULK
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
#else
    v = *(const volatile int32_t *)p;
#endif
    return v;
}
__device__ __forceinline__ void cu_flag_add(int32_t *p, int32_t v) {
#ifdef CU_HAS_BULK
    asm volatile("red.release.gpu.global.add.s32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
#else
    atomicAdd(p, v);
#endif
}

__device__ __forceinline__ float cu_bf16(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }
__device__ __forceinline__ float cu_f16(uint16_t h) { return __half2float(__ushort_as_half(h)); }

__device__ __forceinline__ float cu_e2m1(uint32_t q) {
    const float mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    float v = mag[q & 7];
    return (q & 8) ? -v : v;
}

__device__ __forceinline__ float cu_e4m3(uint32_t v) {
    int s = (v >> 7) & 1, e = (v >> 3) & 15, m = v & 7;
    float r;
    if (e == 15 && m == 7) r = __int_as_float(0x7fc00000);
    else if (e == 0) r = ldexpf((float)m, -9);
    else r = ldexpf(1.0f + (float)m / 8.0f, e - 7);
    return s ? -r : r;
}

/* The 2-bit family's four levels (quant/formats.c moet_q2_levels). */
__device__ __forceinline__ void cu_q2_levels(int32_t type, float beta, float lv[4]) {
    if (type == MOET_TYPE_INT2) { lv[0] = -2; lv[1] = -1; lv[2] = 0; lv[3] = 1; }
    else if (type == MOET_TYPE_SYM2) { lv[0] = -1.5f; lv[1] = -0.5f; lv[2] = 0.5f; lv[3] = 1.5f; }
    else { lv[0] = -1; lv[1] = -beta; lv[2] = beta; lv[3] = 1; }
}

__device__ __forceinline__ float cu_q2_scale(float base, uint32_t sc) {
    return base * exp2f(((float)sc - 255.0f) / 16.0f);
}

__host__ __device__ __forceinline__ int cu_is_q2(int32_t type) {
    return type == MOET_TYPE_W2 || type == MOET_TYPE_INT2 || type == MOET_TYPE_SYM2;
}

/* A block's pre-norm of nt rows of cols floats staged in shared memory (row t at xs + t * cols), in place, with the
 * reference rms_norm's arithmetic: sums of squares in double, inv = (f32)(1 / sqrt(ss / cols + eps)), then
 * norm_w[c] * (x * inv) in f32. h != NULL also receives the normed rows. Shared scratch: red [warps][max_t] doubles,
 * inv [max_t] floats (nt <= max_t). Every thread of the CTA calls it; it synchronises.
 * norm_w is read CU_PN_U elements a thread at a time, the first ones before the sums of squares: a loop of one
 * dependent global load an element was 8-16 round trips a CTA (most of the router's 20 us at the 30b shape). Not
 * fetched before the caller stages x: live across the staging, those registers push k_mv16 past 64. */
#define CU_PN_U 8
__device__ __forceinline__ void cu_prenorm_smem(float *xs, int nt, int cols, const float *__restrict__ norm_w, float eps,
                                                double *red, int max_t, float *inv, float *h, int vth = 0) {
    const int lane = threadIdx.x & 31, tid = threadIdx.x, nth = blockDim.x;
    /* vth: the sums of squares as a CTA of vth threads (a multiple of 32) would add them, so a kernel of another size
     * reproduces that kernel's pre-norm bit for bit (red: vth / 32 rows) */
    const int vn = vth > 0 ? vth : nth, nw = vn >> 5;
    float g[CU_PN_U];
#pragma unroll
    for (int u = 0; u < CU_PN_U; u++) g[u] = tid + u * nth < cols ? __ldg(norm_w + tid + u * nth) : 0.f;
    for (int t = 0; t < nt; t++)
        for (int v0 = 0; v0 < vn; v0 += nth) {
            const int vt = v0 + tid;
            double ss = 0;
            if (vt < vn)
                for (int i = vt; i < cols; i += vn) ss += (double)xs[t * cols + i] * xs[t * cols + i];
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
            if (lane == 0 && vt < vn) red[(vt >> 5) * max_t + t] = ss;
        }
    __syncthreads();
    if (tid < nt) {
        double tot = 0;
        for (int w = 0; w < nw; w++) tot += red[w * max_t + tid];
        inv[tid] = (float)(1.0 / sqrt(tot / (double)cols + (double)eps));
    }
    __syncthreads();
    for (int c0 = tid; c0 < cols; c0 += CU_PN_U * nth) {
        if (c0 != tid) {
#pragma unroll
            for (int u = 0; u < CU_PN_U; u++) g[u] = c0 + u * nth < cols ? __ldg(norm_w + c0 + u * nth) : 0.f;
        }
#pragma unroll
        for (int u = 0; u < CU_PN_U; u++) {
            const int c = c0 + u * nth;
            if (c >= cols) break;
            for (int t = 0; t < nt; t++) {
                const float v = g[u] * (xs[t * cols + c] * inv[t]);
                xs[t * cols + c] = v;
                if (h) h[t * cols + c] = v;
            }
        }
    }
    __syncthreads();
}

/* KV pool elements (kv_page.h): E = float (MOET_KVE_F32) or __half (MOET_KVE_F16). A value goes in rounded to
 * nearest even (__float2half_rn: moet_f32_to_f16's bits) and comes out exactly; cu_kv_as<E>(x) is x as the pool
 * stores it, for a kernel that keeps the row it wrote (the fused decode kernels read key p from shared memory, and
 * must read what the composition reads from the cache). The hot loops are templated on E; the writes of the prep
 * kernels take the type at run time (cu_kv_put). */
__device__ __forceinline__ float cu_kv_ld(const float *p) { return *p; }
__device__ __forceinline__ float cu_kv_ld(const __half *p) { return __half2float(*p); }
__device__ __forceinline__ void cu_kv_st(float *p, float x) { *p = x; }
__device__ __forceinline__ void cu_kv_st(__half *p, float x) { *p = __float2half_rn(x); }
template <typename E> __device__ __forceinline__ float cu_kv_as(float x) { return x; }
template <> __device__ __forceinline__ float cu_kv_as<__half>(float x) { return __half2float(__float2half_rn(x)); }
__device__ __forceinline__ void cu_kv_put(void *pool, int32_t type, int64_t i, float x) {
    if (type == MOET_KVE_F16) ((__half *)pool)[i] = __float2half_rn(x);
    else ((float *)pool)[i] = x;
}

/* RoPE's cos and sin for pair i at position p, as transformers computes them (backend.h, moet_rope): angle =
 * f32(p) * inv_freq[i] in f32, cos and sin of it rounded to f32, times attn_factor in f32. Kernels take the
 * moet_rope by value as a __grid_constant__ argument, so the table is read from the parameter bank. */
/* The RMSNorm factor of a head held by a group of T threads (thread i: elements i and i + head_dim / 2 as a, b; 0 past
 * the half): double squares summed by a warp xor tree, the group's warp partials (part[slot nhw + w], nhw = T / 32)
 * added in warp order. k_attn_prep and attn_split.cu's prep both call it, so their heads round alike (bit for bit).
 * Every thread of the CTA calls it (two barriers); slot >= slots: a thread in no group. */
__device__ __forceinline__ float cu_head_rms_inv(float a, float b, int slot, int slots, int i, int nhw, double *part,
                                                 int head_dim, float eps) {
    double ss = (double)a * a + (double)b * b;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    if (slot < slots && (i & 31) == 0) part[slot * nhw + (i >> 5)] = ss;
    __syncthreads();
    double tot = 0;
    for (int w = 0; w < nhw; w++) tot += part[(slot < slots ? slot : 0) * nhw + w];
    __syncthreads(); /* part is rewritten by the next head */
    return (float)(1.0 / sqrt(tot / (double)head_dim + (double)eps));
}

__device__ __forceinline__ void cu_rope_cs(const moet_rope &rp, int i, int32_t p, float *co, float *si) {
    const float ang = (float)p * rp.inv_freq[i];
    *co = (float)cos((double)ang) * rp.attn_factor;
    *si = (float)sin((double)ang) * rp.attn_factor;
}

/* cu_decode32's name for a Q8_0 matrix rewritten into the q8t device layout (matmul.cu): never a file type. */
#define CU_TYPE_Q8T (-8)

/* Decodes group g (elements 32g .. 32g+31) of one row of any supported type into v. */
__device__ __forceinline__ void cu_decode32(int32_t type, const uint8_t *row, int64_t g, float qscale, float qbeta,
                                            float v[32]) {
    switch (type) {
    case MOET_TYPE_F32: {
        const float4 *p = (const float4 *)(row + g * 128);
#pragma unroll
        for (int j = 0; j < 8; j++) { float4 f = p[j]; v[4 * j] = f.x; v[4 * j + 1] = f.y; v[4 * j + 2] = f.z; v[4 * j + 3] = f.w; }
        break;
    }
    case MOET_TYPE_BF16: case MOET_TYPE_F16: {
        const uint4 *p = (const uint4 *)(row + g * 64);
#pragma unroll
        for (int j = 0; j < 4; j++) {
            uint4 q = p[j];
            uint32_t w[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
            for (int k = 0; k < 4; k++) {
                uint16_t lo = (uint16_t)(w[k] & 0xffff), hi = (uint16_t)(w[k] >> 16);
                v[8 * j + 2 * k] = type == MOET_TYPE_BF16 ? cu_bf16(lo) : cu_f16(lo);
                v[8 * j + 2 * k + 1] = type == MOET_TYPE_BF16 ? cu_bf16(hi) : cu_f16(hi);
            }
        }
        break;
    }
    case MOET_TYPE_Q8_0: { /* quants to f32 by permute and add, not a conversion (quant/tile.h: the same values) */
        const uint8_t *b = row + g * sizeof(moet_block_q8_0);
        float d = cu_f16((uint16_t)(b[0] | (b[1] << 8)));
#pragma unroll /* byte loads: a row may start at any byte where the caller's layout puts it */
        for (int j = 0; j < 32; j++) v[j] = d * moet_i8_f32(moet_i8x4_flip(b[2 + j]), 0);
        break;
    }
    case CU_TYPE_Q8T: { /* Q8_0 in the q8t layout (quant/blocks.h): block g is block g % 8 of group g / 8 */
        const uint8_t *gp = row + 272 * (g >> 3);
        const int k = (int)(g & 7);
        const float d = cu_f16(*(const uint16_t *)(gp + 2 * k));
        const uint4 *p = (const uint4 *)(gp + 16 + 32 * k);
#pragma unroll
        for (int j = 0; j < 2; j++) {
            const uint4 q = p[j];
            const uint32_t w[4] = {moet_i8x4_flip(q.x), moet_i8x4_flip(q.y), moet_i8x4_flip(q.z), moet_i8x4_flip(q.w)};
#pragma unroll
            for (int m = 0; m < 16; m++) v[16 * j + m] = d * moet_i8_f32(w[m >> 2], m & 3);
        }
        break;
    }
    case MOET_TYPE_MXFP4: {
        const uint8_t *b = row + g * sizeof(moet_block_mxfp4);
        float d = ldexpf(1.0f, (int)b[0] - 127);
#pragma unroll
        for (int j = 0; j < 16; j++) { v[j] = cu_e2m1(b[1 + j] & 15) * d; v[j + 16] = cu_e2m1(b[1 + j] >> 4) * d; }
        break;
    }
    case MOET_TYPE_NVFP4: {
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const uint8_t *b = row + (2 * g + h) * sizeof(moet_block_nvfp4);
            float d = cu_e4m3(b[0]) * qscale;
#pragma unroll
            for (int j = 0; j < 8; j++) { v[16 * h + j] = cu_e2m1(b[1 + j] & 15) * d; v[16 * h + j + 8] = cu_e2m1(b[1 + j] >> 4) * d; }
        }
        break;
    }
    case MOET_TYPE_ASYM2: {
        const uint8_t *b = row + g * sizeof(moet_block_asym2);
        float d = qscale * exp2f(((float)b[0] - 255.0f) / 16.0f);
        float m = qscale * exp2f(((float)(b[1] & 127) - 127.0f) / 8.0f);
        if (b[1] & 128) m = -m;
#pragma unroll
        for (int j = 0; j < 32; j++) v[j] = (float)((b[2 + j / 4] >> (2 * (j % 4))) & 3) * d + m;
        break;
    }
    default: { /* W2 / INT2 / SYM2 */
        const uint8_t *b = row + g * sizeof(moet_block_q2);
        float lv[4];
        cu_q2_levels(type, qbeta, lv);
        float s = cu_q2_scale(qscale, b[0]);
#pragma unroll
        for (int j = 0; j < 32; j++) v[j] = lv[(b[1 + j / 4] >> (2 * (j % 4))) & 3] * s;
        break;
    }
    }
}

/* Dot of one 2-bit block (scale code sc, 32 codes in q0 | q1) with 32 activations xs[0..31] (padded layout:
 * contiguous within a group). The 4-level select is two predicated moves; the block scale multiplies once. */
__device__ __forceinline__ float cu_q2_dot_codes(uint32_t sc, uint32_t q0, uint32_t q1, const float lv[4], float base,
                                                 const float *xs) {
    float acc0 = 0.f, acc1 = 0.f;
#pragma unroll
    for (int j = 0; j < 16; j++) {
        uint32_t c0 = (q0 >> (2 * j)) & 3, c1 = (q1 >> (2 * j)) & 3;
        float l0 = (c0 & 2) ? ((c0 & 1) ? lv[3] : lv[2]) : ((c0 & 1) ? lv[1] : lv[0]);
        float l1 = (c1 & 2) ? ((c1 & 1) ? lv[3] : lv[2]) : ((c1 & 1) ? lv[1] : lv[0]);
        acc0 = fmaf(l0, xs[j], acc0);
        acc1 = fmaf(l1, xs[16 + j], acc1);
    }
    return (acc0 + acc1) * cu_q2_scale(base, sc);
}

/* The same block fetched as three aligned 32-bit words: the block at byte offset `off` of a matrix whose base is
 * 4-byte aligned lies within words off/4 .. off/4 + 2 (9 bytes from a 0..3 offset end by byte 12). Three loads in
 * place of nine byte loads, and consecutive lanes on consecutive blocks read one contiguous span (coalesced). The
 * last word may reach up to 3 bytes past a matrix whose size is not a multiple of 4: inside the allocation's
 * granularity (cudaMalloc rounds to 256 bytes), never read into another allocation. */
__device__ __forceinline__ void cu_q2_fetch(const uint8_t *base, uint64_t off, uint32_t w[3]) {
    const uint32_t *p = (const uint32_t *)(base + (off & ~(uint64_t)3));
    w[0] = __ldg(p);
    w[1] = __ldg(p + 1);
    w[2] = __ldg(p + 2);
}

__device__ __forceinline__ float cu_q2_dot_words(const uint32_t w[3], uint64_t off, const float lv[4], float base,
                                                 const float *xs) {
    const uint32_t s8 = (uint32_t)(off & 3) * 8;
    return cu_q2_dot_codes((w[0] >> s8) & 0xffu, __funnelshift_rc(w[0], w[1], s8 + 8), __funnelshift_rc(w[1], w[2], s8 + 8),
                           lv, base, xs);
}

/* The block of cu_q2_dot_words decoded to 32 weights (level x block scale) for reuse across several tokens. */
__device__ __forceinline__ void cu_q2_decode_words(const uint32_t w[3], uint64_t off, const float lv[4], float base,
                                                   float v[32]) {
    const uint32_t s8 = (uint32_t)(off & 3) * 8;
    const uint32_t q0 = __funnelshift_rc(w[0], w[1], s8 + 8), q1 = __funnelshift_rc(w[1], w[2], s8 + 8);
    const float sc = cu_q2_scale(base, (w[0] >> s8) & 0xffu);
#pragma unroll
    for (int j = 0; j < 16; j++) {
        const uint32_t c0 = (q0 >> (2 * j)) & 3, c1 = (q1 >> (2 * j)) & 3;
        v[j] = ((c0 & 2) ? ((c0 & 1) ? lv[3] : lv[2]) : ((c0 & 1) ? lv[1] : lv[0])) * sc;
        v[16 + j] = ((c1 & 2) ? ((c1 & 1) ? lv[3] : lv[2]) : ((c1 & 1) ? lv[1] : lv[0])) * sc;
    }
}

/* dst[0..n) = src[0..n) by all threads of the block, float4 when both are 16-byte aligned and n % 4 == 0, four
 * loads in flight per thread (a plain strided loop waits out one load latency per iteration). No synchronisation. */
__device__ __forceinline__ void cu_stage_f32(float *dst, const float *src, int64_t n) {
    const int64_t tid = threadIdx.x, nt = blockDim.x;
    if (!(n & 3) && !((uintptr_t)dst & 15) && !((uintptr_t)src & 15)) {
        const float4 *s4 = (const float4 *)src;
        float4 *d4 = (float4 *)dst;
        const int64_t n4 = n >> 2;
        for (int64_t j = tid; j < n4; j += 4 * nt) {
            float4 v[4];
#pragma unroll
            for (int u = 0; u < 4; u++)
                if (j + u * nt < n4) v[u] = __ldcg(s4 + j + u * nt);
#pragma unroll
            for (int u = 0; u < 4; u++)
                if (j + u * nt < n4) d4[j + u * nt] = v[u];
        }
    } else {
        for (int64_t j = tid; j < n; j += nt) dst[j] = __ldcg(src + j);
    }
}

/* A product's store: (s + bias[r]) rounded (bias NULL: s), then stored at yp or added onto it (mul_mat_acc): the
 * roundings of the unfused mul_mat, add of the bias, add onto the residual (backend.h). */
__device__ __forceinline__ void cu_mm_store(float *yp, float s, const float *bias, int64_t r, int acc) {
    if (bias) s += bias[r];
    *yp = acc ? *yp + s : s;
}

__device__ __forceinline__ float cu_warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float cu_warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* One step of a warp's online softmax over G keys j0 .. j0 + G - 1 (those < n_keys count): qv the query and kr the
 * keys as this lane holds them (dims lane, lane + 32, ..), vr the values; m, l, o the running maximum, sum and output.
 * The CUDA-core attention kernels (attention.cu, mla.cu) share it, so their arithmetic is one. */
template <int G, int D>
__device__ __forceinline__ void cu_osm_step(const float (&qv)[D], const float (&kr)[G][D], const float (&vr)[G][D],
                                            int32_t j0, int32_t n_keys, float scale, float &m, float &l,
                                            float (&o)[D]) {
    float s[G];
#pragma unroll
    for (int g = 0; g < G; g++) {
        float a = 0.f;
#pragma unroll
        for (int d = 0; d < D; d++) a = fmaf(qv[d], kr[g][d], a);
        s[g] = a;
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1)
#pragma unroll
        for (int g = 0; g < G; g++) s[g] += __shfl_xor_sync(0xffffffffu, s[g], off);
    float mn = m;
#pragma unroll
    for (int g = 0; g < G; g++) {
        s[g] = j0 + g < n_keys ? s[g] * scale : -INFINITY;
        mn = fmaxf(mn, s[g]);
    }
    const float corr = expf(m - mn);
    float p[G], ps = 0.f;
#pragma unroll
    for (int g = 0; g < G; g++) { p[g] = expf(s[g] - mn); ps += p[g]; }
    l = l * corr + ps;
#pragma unroll
    for (int d = 0; d < D; d++) {
        float acc = o[d] * corr;
#pragma unroll
        for (int g = 0; g < G; g++) acc = fmaf(p[g], vr[g][d], acc);
        o[d] = acc;
    }
    m = mn;
}

/* quant/matq.c sign_of: the rotation's random sign of column i. */
__host__ __device__ __forceinline__ float cu_rot_sign(uint64_t seed, int64_t i) {
    uint64_t z = seed * 0x9e3779b97f4a7c15ull + (uint64_t)i * 0xbf58476d1ce4e5b9ull + 0x94d049bb133111ebull;
    z ^= z >> 31;
    z *= 0xd6e8feb86659fd93ull;
    z ^= z >> 32;
    return (z & 1) ? -1.0f : 1.0f;
}

__host__ __device__ __forceinline__ int cu_hadamard_block(int64_t cols) {
    int b = 1;
    while (b < 256 && cols % (b * 2) == 0) b *= 2;
    return b;
}

/* In-place x -> x R on a padded shared-memory vector of n elements (R = blockdiag(D H_b / sqrt(b)), matq.c), by all
 * threads of the block; the caller synchronises before and after. nv vectors of stride `stride` floats at once.
 * 32-bit indices and shifts only: b and h are powers of two (a 64-bit division here cost more than the whole GEMV). */
__device__ __forceinline__ void cu_rotate_smem(float *xs, int nv, int stride, int64_t n64, uint64_t seed) {
    const int n = (int)n64, b = cu_hadamard_block(n64), half = n >> 1;
    const int tid = threadIdx.x, nt = blockDim.x;
    for (int v = 0; v < nv; v++)
        for (int j = tid; j < n; j += nt) xs[v * stride + CU_PAD(j)] *= cu_rot_sign(seed, j);
    __syncthreads();
    for (int h = 1, lh = 0; h < b; h *= 2, lh++) {
        for (int v = 0; v < nv; v++) {
            float *xv = xs + v * stride;
            for (int q = tid; q < half; q += nt) {
                const int i = ((q >> lh) << (lh + 1)) + (q & (h - 1)), k = i + h;
                const float a = xv[CU_PAD(i)], c = xv[CU_PAD(k)];
                xv[CU_PAD(i)] = a + c;
                xv[CU_PAD(k)] = a - c;
            }
        }
        __syncthreads();
    }
    const float sc = (float)(1.0 / sqrt((double)b));
    for (int v = 0; v < nv; v++)
        for (int j = tid; j < n; j += nt) xs[v * stride + CU_PAD(j)] *= sc;
}

/* The rotation of cu_rot_chunk_t on a lane's M loaded values v of a chunk whose first element is column base of the
 * row (every lane of the warp calls it): the caller loads, so sources other than read-only global memory (shared
 * memory, activations another CTA of the same launch wrote) share one arithmetic. */
template <int M>
__device__ __forceinline__ void cu_rot_regs(float v[8], int rotated, uint64_t seed, int base,
                                            const uint32_t *__restrict__ signs) {
    const int lane = threadIdx.x & 31;
    if (!rotated) return;
    if (signs) {
        const uint32_t sw = __ldg(signs + (base >> 5)) >> (base & 31);
#pragma unroll
        for (int i = 0; i < M; i++)
            if ((sw >> i) & 1u) v[i] = -v[i];
    } else {
#pragma unroll
        for (int i = 0; i < M; i++) v[i] *= cu_rot_sign(seed, base + i);
    }
#pragma unroll
    for (int h = 1; h < M; h *= 2)
#pragma unroll
        for (int i = 0; i < M; i++)
            if (!(i & h)) { const float a = v[i], d = v[i + h]; v[i] = a + d; v[i + h] = a - d; }
#pragma unroll
    for (int lm = 1; lm < 32; lm *= 2) {
        const int up = lane & lm;
#pragma unroll
        for (int i = 0; i < M; i++) { const float o = __shfl_xor_sync(0xffffffffu, v[i], lm); v[i] = up ? o - v[i] : v[i] + o; }
    }
    const float sc = M == 1 ? 0.17677669529663687f : M == 2 ? 0.125f : M == 4 ? 0.08838834764831845f : 0.0625f;
#pragma unroll
    for (int i = 0; i < M; i++) v[i] *= sc;
}

/* Chunk c (b = 32 M elements, b = cu_hadamard_block(n), M known at compile time) of a row x into registers (lane l:
 * elements l*M .. l*M + M - 1 of the chunk in v[0 .. M-1]), rotated (x R, the same butterflies in the same order as
 * cu_rotate_smem, so bit-identical to it) when `rotated`, the signs from a bit table (set: -1) or, NULL, from the
 * hash. Warp-local: R is block-diagonal with blocks of b <= 256 (a power of two >= 32 for any row a multiple of 32
 * wide), so one warp owns a whole chunk: the butterflies of span < M in registers, the rest through shuffles; a
 * lane's loads are issued before any math. The caller hands chunks to warps. x: activations, loaded coherently
 * (__ldcg: the kernel that wrote them may have been running when a PDL launch of this one started). */
template <int M>
__device__ __forceinline__ void cu_rot_chunk_t(float v[8], const float *x, int rotated, uint64_t seed,
                                               int c, const uint32_t *__restrict__ signs) {
    const int lane = threadIdx.x & 31, base = c * 32 * M + lane * M;
    if (M == 8 && !((uintptr_t)(x + base) & 15)) {
        const float4 a = __ldcg((const float4 *)(x + base)), d = __ldcg((const float4 *)(x + base) + 1);
        v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w; v[4] = d.x; v[5] = d.y; v[6] = d.z; v[7] = d.w;
    } else {
#pragma unroll
        for (int i = 0; i < 8; i++) v[i] = i < M ? __ldcg(x + base + i) : 0.f;
    }
    cu_rot_regs<M>(v, rotated, seed, base, signs);
}

/* The chunk size known at run time: dispatches to cu_rot_chunk_t (b = 32, 64, 128 or 256). */
__device__ __forceinline__ void cu_rot_chunk_regs(float v[8], const float *__restrict__ x, int n, int rotated,
                                                  uint64_t seed, int c, const uint32_t *__restrict__ signs = NULL) {
    switch (cu_hadamard_block(n) >> 5) {
    case 1: cu_rot_chunk_t<1>(v, x, rotated, seed, c, signs); break;
    case 2: cu_rot_chunk_t<2>(v, x, rotated, seed, c, signs); break;
    case 4: cu_rot_chunk_t<4>(v, x, rotated, seed, c, signs); break;
    default: cu_rot_chunk_t<8>(v, x, rotated, seed, c, signs); break;
    }
}

/* cu_rot_chunk_regs, stored to padded shared memory. */
__device__ __forceinline__ void cu_load_rot_chunk(float *xs, const float *__restrict__ x, int n, int rotated,
                                                  uint64_t seed, int c) {
    const int lane = threadIdx.x & 31, m = cu_hadamard_block(n) >> 5, base = c * (m << 5) + lane * m;
    float v[8];
    cu_rot_chunk_regs(v, x, n, rotated, seed, c);
#pragma unroll
    for (int i = 0; i < 8; i++)
        if (i < m) xs[CU_PAD(base + i)] = v[i];
}

/* the number of chunks cu_load_rot_chunk splits a row of n into */
__device__ __forceinline__ int cu_rot_chunks(int n) { return n / cu_hadamard_block(n); }

#endif
