/*
 * trace.cu — the host half of trace.cuh's kernel timeline (build option MOET_CUDA_TRACE; with it off this file
 * defines only no-op entry points). MOET_TRACE=FILE turns it on for a run: every replay of a recorded step (graph_run)
 * starts the record count over, so what the backend writes to FILE when it is destroyed is the last replayed step
 * and whatever ran after it. One line a CTA: kid cta sm t0 tw t1 (ns of %globaltimer; tw 0 where the kernel does not
 * wait on a previous grid); tools/trace_report.py reads it.
 */
#include <stdio.h>
#include <stdlib.h>

#include "backend/cuda/common.cuh"
#include "backend/cuda/cuda_int.h"

#define CU_TRACE_CAP (1u << 19) /* records (CTAs) kept a step: ~100k for a 30b-shaped decode step */

static cu_trace_binder g_binders[64];
static int g_n_binders;
static cu_trace_buf g_buf;
static const char *g_path;

extern "C" int cu_trace_register(cu_trace_binder f) {
    if (g_n_binders < (int)(sizeof g_binders / sizeof g_binders[0])) g_binders[g_n_binders++] = f;
    return 0;
}

extern "C" void cu_trace_init(cu_backend *c) {
#ifdef MOET_CUDA_TRACE
    const char *p = getenv("MOET_TRACE");
    if (!p || !p[0] || g_buf.rec) return;
    if (CU_CHECK(c, cudaMalloc(&g_buf.rec, (size_t)CU_TRACE_CAP * sizeof(cu_trace_rec))) ||
        CU_CHECK(c, cudaMalloc(&g_buf.n, sizeof(unsigned))) || CU_CHECK(c, cudaMemset(g_buf.n, 0, sizeof(unsigned))))
        return;
    g_buf.cap = CU_TRACE_CAP;
    for (int i = 0; i < g_n_binders; i++) g_binders[i](&g_buf);
    if (CU_CHECK(c, cudaGetLastError())) return;
    g_path = p;
    fprintf(stderr, "moet: tracing kernels (%d translation units) to %s\n", g_n_binders, p);
#else
    (void)c;
    if (getenv("MOET_TRACE")) fprintf(stderr, "moet: MOET_TRACE ignored: this build has no kernel trace (-DMOET_CUDA_TRACE=ON)\n");
#endif
}

/* before a replay: the count starts over (a stream operation, so it orders with the step's kernels) */
extern "C" void cu_trace_step(cu_backend *c) {
    if (g_buf.rec) CU_CHECK(c, cudaMemsetAsync(g_buf.n, 0, sizeof(unsigned), c->stream));
}

extern "C" void cu_trace_dump(cu_backend *c) {
    if (!g_buf.rec) return;
    unsigned n = 0;
    cu_trace_rec *h = NULL;
    if (cudaStreamSynchronize(c->stream) == cudaSuccess && cudaMemcpy(&n, g_buf.n, sizeof n, cudaMemcpyDeviceToHost) == cudaSuccess) {
        const unsigned m = n < g_buf.cap ? n : g_buf.cap;
        FILE *f = fopen(g_path, "w");
        if (!f) {
            fprintf(stderr, "moet: MOET_TRACE: cannot write %s\n", g_path);
        } else if ((h = (cu_trace_rec *)malloc((size_t)m * sizeof *h + 1)) &&
                   cudaMemcpy(h, g_buf.rec, (size_t)m * sizeof *h, cudaMemcpyDeviceToHost) == cudaSuccess) {
            fprintf(f, "# moet kernel trace: %u CTAs recorded (%u kept); kid cta sm t0 tw t1 m0 m1\n", n, m);
            for (unsigned i = 0; i < m; i++)
                fprintf(f, "%u %u %u %llu %llu %llu %llu %llu\n", h[i].kid, h[i].cta, h[i].sm, h[i].t0, h[i].tw,
                        h[i].t1, h[i].m[0], h[i].m[1]);
            fprintf(stderr, "moet: kernel trace of the last step (%u CTAs) written to %s\n", m, g_path);
        }
        if (f) fclose(f);
    }
    free(h);
    cudaFree(g_buf.rec);
    cudaFree(g_buf.n);
    g_buf.rec = NULL;
}
