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
 */
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/common.cuh"
#include "backend/cuda/cuda_int.h"

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

#define GEMM_WORKSPACE ((size_t)32 << 20)
/* split x + partial products of one pass, allocated once and never moved (a recorded graph keeps its address):
 * larger calls go in passes of fewer tokens */
#define GEMM_SCRATCH ((size_t)64 << 20)

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

/* hi | mid | lo of x (n elements) as three BF16 arrays, each n long */
__global__ void k_gemm_split3(const float *__restrict__ x, int64_t n, __nv_bfloat16 *__restrict__ s) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const float v = x[i];
        const __nv_bfloat16 h = __float2bfloat16_rn(v);
        const float r = v - __bfloat162float(h);
        const __nv_bfloat16 m = __float2bfloat16_rn(r);
        s[i] = h;
        s[n + i] = m;
        s[2 * n + i] = __float2bfloat16_rn(r - __bfloat162float(m));
    }
}

/* y[i] (+)= (lo + mid) + hi from the three partial products p[0..n) hi, [n..2n) mid, [2n..3n) lo */
__global__ void k_gemm_sum3(const float *__restrict__ p, int64_t n, float *__restrict__ y, int acc) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const float v = (p[2 * n + i] + p[n + i]) + p[i];
        y[i] = acc ? y[i] + v : v;
    }
}

static unsigned gemm_grid(const cu_backend *c, int64_t n) {
    int64_t g = (n + 255) / 256, cap = (int64_t)c->prop.multiProcessorCount * 8;
    return (unsigned)(g < 1 ? 1 : g > cap ? cap : g);
}

static int gemm_min(void) {
    if (g_gemm_min < 0) {
        const char *m = getenv("MOET_GEMM_MIN_TOK");
        g_gemm_min = m && atoi(m) >= 1 ? atoi(m) : 4;
    }
    return g_gemm_min;
}

extern "C" int cu_gemm_wants(int32_t type, int64_t n) {
    if (type != MOET_TYPE_BF16 || n < gemm_min()) return 0; /* decode (1 token) stops here */
    const char *off = getenv("MOET_GEMM");
    return !(off && off[0] == '0') && blas_load();
}

extern "C" int cu_gemm_bf16(cu_backend *c, const moet_weight *w, const uint8_t *d, const float *x, int64_t n,
                            float *y, int acc) {
    /* MOET_GEMM is read at every call: an A/B in one process (test_ops --perf) */
    if (w->rotated || !cu_gemm_wants(w->type, n)) return 0;
    if (w->rows > INT32_MAX / 4 || w->cols > INT32_MAX / 4 || (w->row_bytes & 1) || (uintptr_t)d & 15) return 0;
    const int64_t rows = w->rows, cols = w->cols, ld = (int64_t)(w->row_bytes / 2);
    /* tokens a pass: split x (3 x cols bf16) and partials (3 x rows f32) of every token within the scratch */
    const size_t per_tok = (size_t)cols * 3 * sizeof(__nv_bfloat16) + (size_t)rows * 3 * sizeof(float) + 256;
    int64_t nc = (int64_t)(GEMM_SCRATCH / per_tok);
    if (nc < 1) return 0;
    if (nc > n) nc = n;
    const size_t xs_bytes = ((size_t)nc * cols * 3 * sizeof(__nv_bfloat16) + 255) & ~(size_t)255;
    if (!c->blas) {
        /* the first GEMM runs eagerly (graph_run records a step only after running it once), so the handle and
         * the scratch exist before any capture; a capture that came first (never, today) takes the GEMV kernels */
        if (c->capturing) return 0;
        cublasHandle_t h;
        if (g_blas.create(&h) != CUBLAS_STATUS_SUCCESS) {
            cu_fail(c, cudaErrorUnknown, "cublasCreate", __FILE__, __LINE__);
            return 1;
        }
        c->blas = h;
        if (CU_CHECK(c, cudaMalloc(&c->blas_ws, GEMM_WORKSPACE)) || CU_CHECK(c, cudaMalloc(&c->gemm_buf, GEMM_SCRATCH)))
            return 1;
        if (g_blas.set_stream(h, c->stream) != CUBLAS_STATUS_SUCCESS ||
            g_blas.set_workspace(h, c->blas_ws, GEMM_WORKSPACE) != CUBLAS_STATUS_SUCCESS) {
            cu_fail(c, cudaErrorUnknown, "cublasSetStream / cublasSetWorkspace", __FILE__, __LINE__);
            return 1;
        }
    }
    __nv_bfloat16 *xs = (__nv_bfloat16 *)c->gemm_buf;
    float *part = (float *)((uint8_t *)c->gemm_buf + xs_bytes);
    cublasHandle_t h = (cublasHandle_t)c->blas;
    const float one = 1.0f, zero = 0.0f;
    for (int64_t t0 = 0; t0 < n; t0 += nc) {
        const int64_t m = n - t0 < nc ? n - t0 : nc;
        k_gemm_split3<<<gemm_grid(c, m * cols), 256, 0, c->stream>>>(x + t0 * cols, m * cols, xs);
        if (CU_LAUNCHED(c, "k_gemm_split3")) return 1;
        /* column-major view: part (rows x 3m, ld rows) = W^T (W is cols x rows col-major, ld) . xs (cols x 3m) */
        cublasStatus_t st = g_blas.gemm_ex(h, CUBLAS_OP_T, CUBLAS_OP_N, (int)rows, (int)(3 * m), (int)cols, &one, d,
                                           CUDA_R_16BF, (int)ld, xs, CUDA_R_16BF, (int)cols, &zero, part, CUDA_R_32F,
                                           (int)rows, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        if (st != CUBLAS_STATUS_SUCCESS) {
            char msg[96];
            snprintf(msg, sizeof msg, "cublasGemmEx (%lld x %lld x %lld): status %d", (long long)rows,
                     (long long)(3 * m), (long long)cols, (int)st);
            cu_fail(c, cudaErrorUnknown, msg, __FILE__, __LINE__);
            return 1;
        }
        k_gemm_sum3<<<gemm_grid(c, m * rows), 256, 0, c->stream>>>(part, m * rows, y + t0 * rows, acc);
        if (CU_LAUNCHED(c, "k_gemm_sum3")) return 1;
    }
    return 1;
}

extern "C" void cu_gemm_release(cu_backend *c) {
    if (c->blas && g_blas_state > 0) g_blas.destroy((cublasHandle_t)c->blas);
    c->blas = NULL;
    cudaFree(c->blas_ws);
    cudaFree(c->gemm_buf);
    c->blas_ws = c->gemm_buf = NULL;
}
