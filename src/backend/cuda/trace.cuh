/*
 * trace.cuh — a timeline of one decode step from inside the kernels (build option MOET_CUDA_TRACE, off by default:
 * compiled out, the macros below are empty).
 *
 * Why: a decode step of a 30b-shaped model is ~290 small kernels chained by programmatic dependent launch inside a
 * CUDA graph, and each moves a few MB; what bounds it is no longer bytes but each kernel's fixed latency and how
 * much of it the launch overlap hides. Nsight Compute times kernels one at a time (serialised, no overlap) and Nsight
 * Systems does not run on the device machine here (KINDS.md), so the kernels time themselves: every CTA of an
 * instrumented kernel writes one record, its %globaltimer at entry (t0), after its wait for the previous grid (tw),
 * when its last warp leaves (t1) and, where the kernel has them, at two points inside (CU_TRACE_MARK).
 * tools/trace_report.py groups the records into launches and prints, for each kernel of the step, when its first
 * CTA started and its last one ended relative to the previous kernel's end: the step's critical path, kernel by
 * kernel.
 *
 * Cost when on: one global atomic, one __syncthreads and a few stores a CTA. The device pointer lives in a
 * __constant__ per translation unit (no relocatable device code), so each .cu registers a binder at static
 * initialisation and the backend calls them all when MOET_TRACE names a file (cuda_backend.cu).
 */
#ifndef MOET_BACKEND_CUDA_TRACE_CUH
#define MOET_BACKEND_CUDA_TRACE_CUH

#include <stdint.h>

/* Kernel families of the record's kid (kid = family << 8 | the kernel's own variant bits). */
enum {
    CU_TK_GET_ROWS = 1,
    CU_TK_MV16P = 2,   /* variant: FMT << 2 | NORM << 1 | (MT > 1) */
    CU_TK_MV16 = 3,    /* variant: F16 << 2 | NORM << 1 | (MT > 1) */
    CU_TK_ATTN_DECODE = 4,
    CU_TK_ATTENTION = 5,
    CU_TK_ROUTER = 6,  /* variant: NT */
    CU_TK_GATE_UP = 7, /* variant: BN << 2 | DL << 1 | I8 */
    CU_TK_DOWN = 8,    /* variant: BN << 2 | DL << 1 | I8 */
    CU_TK_TOPK = 9,
    CU_TK_MUL_MAT = 10,
    CU_TK_ELEMWISE = 11, /* variant: 0 add, 1 rms_norm, 2 swiglu, 3 attn_prep */
    CU_TK_MV16S = 12,  /* variant: FMT (0 bf16, 1 f16, 2 q8t) << 2 | NORM << 1 | x permuted */
    CU_TK_GATE_UP_ST = 13, /* moe_st.cu; variant: M << 2 | TP */
    CU_TK_DOWN_ST = 14,    /* moe_st.cu; variant: M << 2 | TP */
};

typedef struct {
    uint32_t kid, cta, sm, pad;
    unsigned long long t0, tw, t1; /* %globaltimer, ns */
    unsigned long long m[2];       /* CU_TRACE_MARK(0 / 1): when the CTA's last warp got there (0: no mark) */
} cu_trace_rec;
typedef struct {
    cu_trace_rec *rec;
    unsigned *n;
    unsigned cap;
} cu_trace_buf;

typedef void (*cu_trace_binder)(const cu_trace_buf *);
extern "C" int cu_trace_register(cu_trace_binder f);

#ifdef MOET_CUDA_TRACE
static __constant__ cu_trace_buf c_trace;
static __shared__ unsigned cu_tr_slot;

__device__ __forceinline__ unsigned long long cu_now(void) {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

/* One per CTA of an instrumented kernel, built by all its threads at entry (it synchronises them once). */
struct cu_trace_scope {
    __device__ cu_trace_scope(uint32_t kid) {
        if (!c_trace.rec) return;
        if (threadIdx.x == 0) {
            const unsigned long long t = cu_now();
            const unsigned s = atomicAdd(c_trace.n, 1u);
            uint32_t sm;
            asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
            cu_tr_slot = s;
            if (s < c_trace.cap) {
                cu_trace_rec *r = c_trace.rec + s;
                r->kid = kid;
                r->cta = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
                r->sm = sm;
                r->t0 = t;
                r->tw = 0;
                r->t1 = 0;
                r->m[0] = r->m[1] = 0;
            }
        }
        __syncthreads();
    }
    __device__ void waited(void) {
        if (!c_trace.rec || threadIdx.x) return;
        const unsigned s = cu_tr_slot;
        if (s < c_trace.cap) atomicMax(&c_trace.rec[s].tw, cu_now());
    }
    /* a point inside the kernel (every warp that passes it records; the latest counts): where a CTA's time after
     * its wait goes, e.g. routing done, weights arrived */
    __device__ void mark(int i) {
        if (!c_trace.rec || (threadIdx.x & 31)) return;
        const unsigned s = cu_tr_slot;
        if (s < c_trace.cap) atomicMax(&c_trace.rec[s].m[i], cu_now());
    }
    __device__ ~cu_trace_scope() {
        if (!c_trace.rec || (threadIdx.x & 31)) return;
        const unsigned s = cu_tr_slot;
        if (s < c_trace.cap) atomicMax(&c_trace.rec[s].t1, cu_now());
    }
};
#define CU_TRACE(kid) cu_trace_scope cu_trs_(kid)
#define CU_TRACE_WAITED() cu_trs_.waited()
#define CU_TRACE_MARK(i) cu_trs_.mark(i)

static void cu_trace_bind_tu(const cu_trace_buf *b) { cudaMemcpyToSymbol(c_trace, b, sizeof *b); }
static const int cu_trace_registered_ __attribute__((unused)) = cu_trace_register(cu_trace_bind_tu);
#else
#define CU_TRACE(kid) ((void)0)
#define CU_TRACE_WAITED() ((void)0)
#define CU_TRACE_MARK(i) ((void)0)
#endif

#endif
