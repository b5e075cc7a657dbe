/*
 * gemm.cu — dense BF16 matrices times many tokens (prefill, large batched steps) on tensor cores, through cuBLAS.
 *
 * Why: matmul.cu's GEMV kernels read W once per chunk of 8 tokens and multiply on CUDA cores in fp32; a 512-token
 * prefill of qwen3-30b-a3b spent about half its kernel time there (docs/performance.md). cuBLAS's BF16 GEMM runs the
 * same products on tensor cores.
 *
 * Exactness: the tensor cores take BF16 operands, and rounding x to BF16 would cost ~3 significant digits against
 * the fp32 reference. So x is split into three BF16 terms, x = hi + mid + lo (hi = bf16(x), mid = bf16(x - hi),
 * lo = bf16(x - hi - mid): 24 significant bits, all of an fp32's), stacked as 3n rows of one GEMM; a BF16 x BF16
 * product is exact in fp32 and the accumulation is fp32, so each of the three partial products carries fp32 rounding
 * only. k_gemm_sum3 adds them (lo + mid first, the small terms) into y (or onto y: mul_mat_acc). The result matches
 * the GEMV kernels and the CPU to fp32 rounding (tests/test_ops.c checks it against the float64 product), not bit
 * for bit: a prefill is "close" to, not bit-identical with, a token-by-token decode on CUDA (tests/test_logits.c
 * measures both; the decode path, n = 1, never comes here).
 * Cost: 3x the FLOPs of a plain BF16 GEMM, still ~20x the fp32 GEMV's rate at 512 tokens (bench: test_ops --perf).
 *
 * Loading: libcublas is opened at run time (dlopen), not linked: a machine without it (CI has no GPU and no library
 * path to it) runs everything else, and the GEMV kernels take every product (MOET_GEMM=0 forces that, for A/B;
 * MOET_GEMM_MIN_TOK=N moves the threshold, read once).
 * Inside CUDA graph captures too (session.c records chunks of up to 64 tokens): the handle, its workspace and the
 * scratch are made at the first (eager) call and never reallocated, so a recorded step allocates nothing and
 * computes what the eager one did, bit for bit. From MOET_GEMM_MIN_TOK tokens (default 4: on the H200 at the 30b QKV
 * shape the GEMV kernels take 10.2 us at 1 token, 20.0 at 4 and 34.4 at 8, cuBLAS 16.6, 20.8 and 21.8 (PDL on);
 * bench/results/cuda/ops-perf-h200.txt).
 * Bytes per call: rows x cols x 2 (W) + n x cols x (4 + 6) + n x rows x (12 + 4 or 8); FLOPs 3 x 2 x n x rows x cols.
 *
 * Q8_0 (cu_gemm_q8t, from MOET_GEMM_Q8_MIN_TOK tokens, default 32: below that the per-call F16 copy of W, 8 bytes a
 * weight written and read, outweighs the generic kernel's passes over 1.06; on an H100 the two cross between 16 and 32 tokens: this path
 * takes 1.11x the GEMV's time at 16 and 0.59x at 32, at the 5120 x 2048 shape, perf mode's "dense q8_0" table). A Q8_0 weight q d (int8 times an f16) has at most 18 significant bits; times a power of two a row (its
 * largest possible |q d| -> [2^14, 2^15)) it is exactly hi + lo, two F16 values (11 + 11 bits). Where lo falls in
 * F16's subnormals (weights 2^-25 below the row's largest and smaller) its error is below 2^-39 of the row's
 * largest weight: far under fp32's rounding of the sum. x of each token, times a power of two (largest -> [2^14,
 * 2^15)), is hi + lo in F16 too: 22 bits, as the W2 tensor-core kernels stage it (moe_tc.cu). One F16 GEMM of the
 * stacked rows [W hi; W lo] with the stacked columns [x hi | x lo] makes the four products (F16 x F16 is exact in
 * fp32, accumulated by the tensor cores in fp32, which loses more than fp32 rounding over long K: NMSE 6.3e-11 at
 * K = 4096 on test_ops' wide-range case vs 3e-13 on the CPU, measured on an H100); k_q8g_sum adds them small first
 * and undoes the two powers of two. The F16 copy of W is
 * made per call in a scratch of its own (64 MiB, passes of rows past that): a Q8_0 model keeps its 8.5 bits a weight
 * in memory, and a prefill chunk reads the copy once for all its tokens.
 * Bytes per pass: rows x cols x (1.0625 + 4 + 4) + n x cols x (4 + 4 + 4) + n x rows x (16 + 16 + 4 or 8); FLOPs
 * 4 x 2 x n x rows x cols.
 */
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/common.cuh"
#include "backend/cuda/cuda_int.h"
#include "quant/tile.h"

/* the entry points this file uses, with the header's own types (a signature change fails to compile: the
 * static_cast, unevaluated, must pick cublasGemmEx's C declaration) */
typedef cublasStatus_t (*cu_gemm_ex_fn)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
                                        const void *, const void *, cudaDataType, int, const void *, cudaDataType, int,
                                        const void *, void *, cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t);
typedef struct {
    void *lib;
    decltype(&cublasCreate_v2) create;
    decltype(&cublasDestroy_v2) destroy;
    decltype(&cublasSetStream_v2) set_stream;
    decltype(&cublasSetWorkspace_v2) set_workspace;
    decltype(static_cast<cu_gemm_ex_fn>(&cublasGemmEx)) gemm_ex;
} cu_blas_fns;

static cu_blas_fns g_blas;
static int g_blas_state; /* 0 not tried, 1 loaded, -1 unavailable or disabled */
static int g_gemm_min = -1; /* tokens from which a product comes here: MOET_GEMM_MIN_TOK, else 4 */
static int g_gemm_q8_min = -1; /* the same for Q8_0: MOET_GEMM_Q8_MIN_TOK, else 32 */

#define GEMM_WORKSPACE ((size_t)32 << 20)
/* split x + partial products of one pass, allocated once and never moved (a recorded graph keeps its address):
 * larger calls go in passes of fewer tokens */
#define GEMM_SCRATCH ((size_t)64 << 20)
/* Q8_0: the F16 hi | lo rows of one pass and their powers of two (made at the first Q8_0 GEMM, never moved) */
#define GEMM_WSCRATCH ((size_t)64 << 20)

static int blas_load(void) {
    if (g_blas_state) return g_blas_state > 0;
    g_blas_state = -1;
    void *lib = dlopen("libcublas.so.13", RTLD_NOW | RTLD_LOCAL);
    if (!lib) lib = dlopen("libcublas.so", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        fprintf(stderr, "moet: cuda: libcublas not found (%s): dense prefill runs the GEMV kernels\n", dlerror());
        return 0;
    }
    cu_blas_fns f = {};
    f.lib = lib;
    f.create = (decltype(f.create))dlsym(lib, "cublasCreate_v2");
    f.destroy = (decltype(f.destroy))dlsym(lib, "cublasDestroy_v2");
    f.set_stream = (decltype(f.set_stream))dlsym(lib, "cublasSetStream_v2");
    f.set_workspace = (decltype(f.set_workspace))dlsym(lib, "cublasSetWorkspace_v2");
    f.gemm_ex = (decltype(f.gemm_ex))dlsym(lib, "cublasGemmEx");
    if (!f.create || !f.destroy || !f.set_stream || !f.set_workspace || !f.gemm_ex) {
        fprintf(stderr, "moet: cuda: libcublas lacks an entry point moet uses: dense prefill runs the GEMV kernels\n");
        dlclose(lib);
        return 0;
    }
    g_blas = f;
    g_blas_state = 1;
    return 1;
}

/* hi | mid | lo of x (n elements) as three BF16 arrays, each n long; NT = 2: hi | mid (16 bits) */
template <int NT>
__global__ void k_gemm_split3(const float *__restrict__ x, int64_t n, __nv_bfloat16 *__restrict__ s) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const float v = x[i];
        const __nv_bfloat16 h = __float2bfloat16_rn(v);
        const float r = v - __bfloat162float(h);
        const __nv_bfloat16 m = __float2bfloat16_rn(r);
        s[i] = h;
        s[n + i] = m;
        if (NT == 3) s[2 * n + i] = __float2bfloat16_rn(r - __bfloat162float(m));
    }
}

/* y[i] (+)= (lo + mid) + hi (+ b[i % rows]) from the three partial products p[0..n) hi, [n..2n) mid, [2n..3n) lo;
 * NT = 2: mid + hi */
template <int NT>
__global__ void k_gemm_sum3(const float *__restrict__ p, int64_t n, int64_t rows, const float *__restrict__ b,
                            float *__restrict__ y, int acc) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        cu_mm_store(y + i, NT == 3 ? (p[2 * n + i] + p[n + i]) + p[i] : p[n + i] + p[i], b, i % rows, acc);
}

static unsigned gemm_grid(const cu_backend *c, int64_t n) {
    int64_t g = (n + 255) / 256, cap = (int64_t)c->prop.multiProcessorCount * 8;
    return (unsigned)(g < 1 ? 1 : g > cap ? cap : g);
}

static int env_min(int *cache, const char *name, int dflt) {
    if (*cache < 0) {
        const char *m = getenv(name);
        *cache = m && atoi(m) >= 1 ? atoi(m) : dflt;
    }
    return *cache;
}

extern "C" int cu_gemm_wants(int32_t type, int64_t n) {
    /* decode (1 token) stops here */
    if (type == MOET_TYPE_BF16) {
        if (n < env_min(&g_gemm_min, "MOET_GEMM_MIN_TOK", 4)) return 0;
    } else if (type == MOET_TYPE_Q8_0) {
        if (n < env_min(&g_gemm_q8_min, "MOET_GEMM_Q8_MIN_TOK", 32)) return 0;
    } else return 0;
    const char *off = getenv("MOET_GEMM");
    return !(off && off[0] == '0') && blas_load();
}

/* The handle, its workspace and the scratch, at the first (eager) GEMM: 0 ready, 1 not now (a capture came first:
 * never today, graph_run records a step only after running it once; the GEMV kernels take it), -1 error recorded. */
static int gemm_setup(cu_backend *c) {
    if (c->blas) return 0;
    if (c->capturing) return 1;
    cublasHandle_t h;
    if (g_blas.create(&h) != CUBLAS_STATUS_SUCCESS) {
        cu_fail(c, cudaErrorUnknown, "cublasCreate", __FILE__, __LINE__);
        return -1;
    }
    c->blas = h;
    if (CU_CHECK(c, cudaMalloc(&c->blas_ws, GEMM_WORKSPACE)) || CU_CHECK(c, cudaMalloc(&c->gemm_buf, GEMM_SCRATCH)))
        return -1;
    if (g_blas.set_stream(h, c->stream) != CUBLAS_STATUS_SUCCESS ||
        g_blas.set_workspace(h, c->blas_ws, GEMM_WORKSPACE) != CUBLAS_STATUS_SUCCESS) {
        cu_fail(c, cudaErrorUnknown, "cublasSetStream / cublasSetWorkspace", __FILE__, __LINE__);
        return -1;
    }
    return 0;
}

/* column-major out (m x n, ld m) = A^T B in fp32: A k x m (lda), B k x n (ld k), both of type ty; 0, or 1 after
 * recording an error */
static int gemm_tn(cu_backend *c, int64_t m, int64_t n, int64_t k, const void *a, int64_t lda, const void *b,
                   cudaDataType ty, float *out) {
    const float one = 1.0f, zero = 0.0f;
    cublasStatus_t st = g_blas.gemm_ex((cublasHandle_t)c->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)m, (int)n, (int)k, &one,
                                       a, ty, (int)lda, b, ty, (int)k, &zero, out, CUDA_R_32F, (int)m,
                                       CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    if (st == CUBLAS_STATUS_SUCCESS) return 0;
    char msg[96];
    snprintf(msg, sizeof msg, "cublasGemmEx (%lld x %lld x %lld): status %d", (long long)m, (long long)n,
             (long long)k, (int)st);
    cu_fail(c, cudaErrorUnknown, msg, __FILE__, __LINE__);
    return 1;
}

extern "C" int cu_gemm_bf16(cu_backend *c, const moet_weight *w, const uint8_t *d, const float *x, int64_t n,
                            float *y, int acc, const float *b) {
    /* MOET_GEMM is read at every call: an A/B in one process (test_ops --perf) */
    if (w->type != MOET_TYPE_BF16 || w->rotated || !cu_gemm_wants(w->type, n)) return 0;
    if (w->rows > INT32_MAX / 4 || w->cols > INT32_MAX / 4 || (w->row_bytes & 1) || (uintptr_t)d & 15) return 0;
    const int64_t rows = w->rows, cols = w->cols, ld = (int64_t)(w->row_bytes / 2);
    /* MOET_GEMM_TERMS=2 (opt-in, for A/B): x as hi + mid, 16 significant bits (2^-17 relative a value), 2/3 of the
     * FLOPs; not fp32-exact */
    const char *te = getenv("MOET_GEMM_TERMS");
    const int nt = te && te[0] == '2' ? 2 : 3;
    /* tokens a pass: split x (nt x cols bf16) and partials (nt x rows f32) of every token within the scratch */
    const size_t per_tok = (size_t)cols * nt * sizeof(__nv_bfloat16) + (size_t)rows * nt * sizeof(float) + 256;
    int64_t nc = (int64_t)(GEMM_SCRATCH / per_tok);
    if (nc < 1) return 0;
    if (nc > n) nc = n;
    const size_t xs_bytes = ((size_t)nc * cols * nt * sizeof(__nv_bfloat16) + 255) & ~(size_t)255;
    const int st = gemm_setup(c);
    if (st) return st < 0;
    __nv_bfloat16 *xs = (__nv_bfloat16 *)c->gemm_buf;
    float *part = (float *)((uint8_t *)c->gemm_buf + xs_bytes);
    /* q, k and v of one normed x (cu_norm_mul_mat): the split made for the first product serves the others where
     * it covers all n tokens in one pass (the same bytes at the same place: bit-identical) */
    const int reuse = c->gemm_reuse && nc >= n && c->gemm_xs_src == x && c->gemm_xs_n == n &&
                      c->gemm_xs_cols == cols && c->gemm_xs_nt == nt;
    c->gemm_xs_src = NULL;
    for (int64_t t0 = 0; t0 < n; t0 += nc) {
        const int64_t m = n - t0 < nc ? n - t0 : nc;
        if (!reuse) {
            if (nt == 3) k_gemm_split3<3><<<gemm_grid(c, m * cols), 256, 0, c->stream>>>(x + t0 * cols, m * cols, xs);
            else k_gemm_split3<2><<<gemm_grid(c, m * cols), 256, 0, c->stream>>>(x + t0 * cols, m * cols, xs);
            if (CU_LAUNCHED(c, "k_gemm_split3")) return 1;
        }
        /* column-major view: part (rows x 3m, ld rows) = W^T (W is cols x rows col-major, ld) . xs (cols x 3m) */
        if (gemm_tn(c, rows, nt * m, cols, d, ld, xs, CUDA_R_16BF, part)) return 1;
        if (nt == 3) k_gemm_sum3<3><<<gemm_grid(c, m * rows), 256, 0, c->stream>>>(part, m * rows, rows, b, y + t0 * rows, acc);
        else k_gemm_sum3<2><<<gemm_grid(c, m * rows), 256, 0, c->stream>>>(part, m * rows, rows, b, y + t0 * rows, acc);
        if (CU_LAUNCHED(c, "k_gemm_sum3")) return 1;
    }
    if (nc >= n) { /* one pass: gemm_buf holds x's whole split (the partials lie past it) */
        c->gemm_xs_src = x;
        c->gemm_xs_n = n;
        c->gemm_xs_cols = cols;
        c->gemm_xs_nt = nt;
    }
    return 1;
}

/* ---- Q8_0 ---------------------------------------------------------------------------------------------------- */

#define Q8G_WARPS 8

/* 2^-s with v 2^s's largest |v| (m) in [2^14, 2^15); s kept within float's exponent range (m 0 or not finite: 1) */
__device__ __forceinline__ float q8g_pow2(float m, float *down) {
    int E = 0;
    if (!(m > 0.f) || !isfinite(m)) {
        *down = 1.0f;
        return 1.0f;
    }
    frexpf(m, &E); /* m = f 2^E, f in [0.5, 1) */
    int s = 15 - E;
    s = s > 126 ? 126 : s < -126 ? -126 : s;
    *down = ldexpf(1.0f, -s);
    return ldexpf(1.0f, s);
}

/* Rows r0 .. r0 + rc of a q8t matrix (rows of row_bytes, cols % 256 == 0) as F16: wh[i][cols] = hi of row r0 + i,
 * wh[rc + i][cols] = its lo; ws[i] = 2^-s of the row. A warp a row: its largest block scale first, then 16 quants a
 * lane a step (one 16-byte load, two of hi and two of lo stored). */
__global__ void __launch_bounds__(Q8G_WARPS * 32)
k_q8g_wsplit(const uint8_t *__restrict__ q8t, size_t row_bytes, int64_t cols, int64_t r0, int64_t rc,
             __half *__restrict__ wh, float *__restrict__ ws) {
    const int lane = threadIdx.x & 31;
    const int64_t i = (int64_t)blockIdx.x * Q8G_WARPS + (threadIdx.x >> 5);
    if (i >= rc) return;
    const uint8_t *row = q8t + (size_t)(r0 + i) * row_bytes;
    const int64_t nblk = cols / 32, nword = cols / 16;
    float md = 0.f;
    for (int64_t b = lane; b < nblk; b += 32)
        md = fmaxf(md, fabsf(__half2float(*(const __half *)(row + moet_q8t_d_off(2 * b)))));
    for (int o = 16; o; o >>= 1) md = fmaxf(md, __shfl_xor_sync(0xffffffffu, md, o));
    float down;
    const float up = q8g_pow2(md * 128.0f, &down); /* |q| <= 128 */
    if (lane == 0) ws[i] = down;
    __half *hi = wh + (size_t)i * cols, *lo = wh + (size_t)(rc + i) * cols;
    for (int64_t v = lane; v < nword; v += 32) {
        const uint4 qv = *(const uint4 *)(row + moet_q8t_qs_off(v));
        const float dv = __half2float(*(const __half *)(row + moet_q8t_d_off(v))) * up; /* exact: times 2^s */
        const int8_t *q = (const int8_t *)&qv;
        uint32_t h[8], l[8];
#pragma unroll
        for (int j = 0; j < 8; j++) {
            const float a = (float)q[2 * j] * dv, b = (float)q[2 * j + 1] * dv; /* 18 bits: exact in fp32 */
            const __half ha = __float2half_rn(a), hb = __float2half_rn(b);
            const __half la = __float2half_rn(a - __half2float(ha)), lb = __float2half_rn(b - __half2float(hb));
            h[j] = (uint32_t)__half_as_ushort(ha) | (uint32_t)__half_as_ushort(hb) << 16;
            l[j] = (uint32_t)__half_as_ushort(la) | (uint32_t)__half_as_ushort(lb) << 16;
        }
        uint4 *hp = (uint4 *)(hi + 16 * v), *lp = (uint4 *)(lo + 16 * v);
        hp[0] = make_uint4(h[0], h[1], h[2], h[3]);
        hp[1] = make_uint4(h[4], h[5], h[6], h[7]);
        lp[0] = make_uint4(l[0], l[1], l[2], l[3]);
        lp[1] = make_uint4(l[4], l[5], l[6], l[7]);
    }
}

/* Token blockIdx.x of x (m rows of cols) as F16: xh[t][cols] hi, xh[m + t][cols] lo, xe[t] = 2^-e. */
__global__ void __launch_bounds__(256)
k_q8g_xsplit(const float *__restrict__ x, int64_t cols, int64_t m, __half *__restrict__ xh, float *__restrict__ xe) {
    __shared__ float red[8];
    const int64_t t = blockIdx.x;
    const float *row = x + t * cols;
    float mx = 0.f;
    for (int64_t k = threadIdx.x; k < cols; k += blockDim.x) mx = fmaxf(mx, fabsf(row[k]));
    for (int o = 16; o; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = mx;
    __syncthreads();
    mx = 0.f;
    for (int w = 0; w < (int)(blockDim.x >> 5); w++) mx = fmaxf(mx, red[w]);
    float down;
    const float up = q8g_pow2(mx, &down);
    if (threadIdx.x == 0) xe[t] = down;
    __half *hi = xh + t * cols, *lo = xh + (m + t) * cols;
    for (int64_t k = threadIdx.x; k < cols; k += blockDim.x) {
        const float v = row[k] * up;
        const __half h = __float2half_rn(v);
        hi[k] = h;
        lo[k] = __float2half_rn(v - __half2float(h));
    }
}

/* y[t][r0 + r] (+)= the four products of part (2 rc x 2 m, column-major: rows hi | lo of W, columns hi | lo of x),
 * the small ones first, times 2^-s_r 2^-e_t. */
__global__ void k_q8g_sum(const float *__restrict__ part, int64_t rc, int64_t m, const float *__restrict__ ws,
                          const float *__restrict__ xe, const float *__restrict__ b, float *__restrict__ y,
                          int64_t rows, int64_t r0, int acc) {
    const int64_t n = rc * m;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t t = i / rc, r = i - t * rc;
        const float *ph = part + t * 2 * rc, *pl = part + (m + t) * 2 * rc; /* x hi / x lo columns */
        const float v = ((pl[rc + r] + pl[r]) + ph[rc + r]) + ph[r];      /* lo lo, W hi x lo, W lo x hi, hi hi */
        cu_mm_store(y + t * rows + r0 + r, v * ws[r] * xe[t], b, r0 + r, acc);
    }
}

extern "C" int cu_gemm_q8t(cu_backend *c, const moet_weight *w, const uint8_t *d, const float *x, int64_t n,
                           float *y, int acc, const float *b) {
    if (w->type != MOET_TYPE_Q8_0 || w->rotated || !cu_gemm_wants(w->type, n)) return 0;
    const int64_t rows = w->rows, cols = w->cols;
    if (cols % 256 || rows > INT32_MAX / 4 || cols > INT32_MAX / 4 || (uintptr_t)d & 15 || w->row_bytes & 15) return 0;
    /* rows a pass: hi and lo (2 x cols halves) and the power of two of each within the weight scratch */
    int64_t rc = (int64_t)((GEMM_WSCRATCH - 1024) / ((size_t)cols * 4 + 4)) & ~(int64_t)7;
    const char *cap = getenv("MOET_GEMM_Q8_ROWS"); /* fewer rows a pass (tests/test_ops.c runs the passes) */
    if (cap && atoll(cap) >= 1 && atoll(cap) < rc) rc = atoll(cap);
    if (rc > rows) rc = rows;
    if (rc < 1) return 0;
    /* tokens a pass: x hi and lo (2 x cols halves), its power of two, the 2 rc x 2 partial products */
    const size_t per_tok = (size_t)cols * 4 + 4 + (size_t)rc * 16;
    int64_t nc = (int64_t)((GEMM_SCRATCH - 1024) / per_tok);
    if (nc < 1) return 0;
    if (nc > n) nc = n;
    const int st = gemm_setup(c);
    if (st) return st < 0;
    if (!c->gemm_wbuf) {
        if (c->capturing) return 0; /* as gemm_setup: the eager run first made it */
        if (CU_CHECK(c, cudaMalloc(&c->gemm_wbuf, GEMM_WSCRATCH))) return 1;
    }
    __half *wh = (__half *)c->gemm_wbuf;
    float *ws = (float *)((uint8_t *)c->gemm_wbuf + (((size_t)rc * cols * 4 + 255) & ~(size_t)255));
    c->gemm_xs_src = NULL; /* gemm_buf is rewritten: no BF16 split left to reuse */
    __half *xh = (__half *)c->gemm_buf;
    const size_t xh_bytes = ((size_t)nc * cols * 4 + 255) & ~(size_t)255;
    float *xe = (float *)((uint8_t *)c->gemm_buf + xh_bytes);
    float *part = (float *)((uint8_t *)xe + (((size_t)nc * 4 + 255) & ~(size_t)255));
    for (int64_t r0 = 0; r0 < rows; r0 += rc) {
        const int64_t rr = rows - r0 < rc ? rows - r0 : rc;
        k_q8g_wsplit<<<(unsigned)((rr + Q8G_WARPS - 1) / Q8G_WARPS), Q8G_WARPS * 32, 0, c->stream>>>(
            d, w->row_bytes, cols, r0, rr, wh, ws);
        if (CU_LAUNCHED(c, "k_q8g_wsplit")) return 1;
        for (int64_t t0 = 0; t0 < n; t0 += nc) {
            const int64_t m = n - t0 < nc ? n - t0 : nc;
            k_q8g_xsplit<<<(unsigned)m, 256, 0, c->stream>>>(x + t0 * cols, cols, m, xh, xe);
            if (CU_LAUNCHED(c, "k_q8g_xsplit")) return 1;
            /* part (2 rr x 2 m) = [W hi; W lo] [x hi | x lo]^T */
            if (gemm_tn(c, 2 * rr, 2 * m, cols, wh, cols, xh, CUDA_R_16F, part)) return 1;
            k_q8g_sum<<<gemm_grid(c, m * rr), 256, 0, c->stream>>>(part, rr, m, ws, xe, b, y + t0 * rows, rows, r0, acc);
            if (CU_LAUNCHED(c, "k_q8g_sum")) return 1;
        }
    }
    return 1;
}

extern "C" void cu_gemm_release(cu_backend *c) {
    if (c->blas && g_blas_state > 0) g_blas.destroy((cublasHandle_t)c->blas);
    c->blas = NULL;
    cudaFree(c->blas_ws);
    cudaFree(c->gemm_buf);
    cudaFree(c->gemm_wbuf);
    c->blas_ws = c->gemm_buf = c->gemm_wbuf = NULL;
}
