/*
 * cuda_int.h — what the CUDA backend's .cu files share: the backend struct, error checking, the weight mirror, and
 * the launchers each op family's file exports to cuda_backend.cu (which fills the backend.h op table).
 *
 * Errors: every CUDA call and every launch is checked; the first failure is kept (sticky) with where it happened,
 * and the session reads it through the backend's error op after each step. An op never aborts the process.
 */
#ifndef MOET_BACKEND_CUDA_INT_H
#define MOET_BACKEND_CUDA_INT_H

#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"

/* One matrix as the kernels see it: device pointer and the per-matrix parameters. 32 bytes, in device tables. */
typedef struct {
    const uint8_t *w;
    float qscale, qbeta;
    uint32_t rot_seed;
    int32_t rotated;
    const uint32_t *signs; /* tiled tables: the rotation's signs of the input columns as bits (set: -1), or NULL */
} cu_mat;

typedef struct {
    const void *host;      /* key: the weight's host (or already-device) address */
    void *dev;
    size_t bytes;
    int owned;             /* 1: we cudaMalloc'd a mirror; 0: the pointer was already device memory */
    int tiled;             /* rewritten in place into the 2-bit tiled layout (quant/blocks.h) */
} cu_mirror;

typedef struct {
    const moet_weight *gate; /* key: the layer's expert array */
    int32_t n_experts;
    cu_mat *table;         /* device: [E][3] (gate, up, down) */
    int32_t type;          /* one type for every routed matrix of the layer */
    int32_t down_uniform;  /* every expert's down matrix has the same rotation: one pass rotates all k inputs */
    int32_t gu_uniform;    /* likewise for gate/up: x is rotated once per token, not once per expert */
    int32_t gu_rotated, down_rotated;
    uint32_t gu_seed, down_seed;
    int32_t aligned4;      /* every matrix and row starts 4-byte aligned: the 2-bit kernels fetch blocks as words */
    int32_t aligned16;     /* every matrix starts 16-byte aligned: moe_fused.cu bulk-copies tiles */
    int32_t tiled;         /* W2/sym2 in the tiled layout: only moe_tc.cu's kernels may read these matrices */
    uint32_t *signs;       /* device, tiled tables: every rotated matrix's column signs (cu_mat.signs points here) */
    int32_t levels_f16;    /* every matrix's two level magnitudes (W2: 1 and beta; sym2: 1.5, 0.5) are f16 values, so
                              a tile of levels is an exact f16 mma operand (moe_grp.cu's LV kernels) */
    /* The expert cache (expert_cache.cu; cached == 0: every expert mirrored, the fields below unused). A cached
     * table's entries point into the cache's slots, or at the stand-in slot when the expert is not resident. */
    int32_t cached;        /* 1: base experts (pool 0), 2: the delta's residuals (pool 1) */
    int32_t ec_row;        /* base tables: the layer's row of the cache's used-expert bytes (and its moet_ecache layer) */
    const moet_weight *base_gate; /* delta tables: the base layer's key (the slot an expert holds is the base's) */
    const moet_weight *w3[3];     /* the host matrices a fetch copies (gate, up, down arrays of E) */
    cu_mat *host_table;    /* host copy of table, rewritten entry by entry as experts come and go */
    int32_t ec_dirty;      /* host_table changed since its last upload */
    uint8_t *home;         /* pinned home (MOET_EXPERT_HOME_PINNED): [E] slot images in the layout the kernels read */
    uint8_t *home_dev;     /* the same memory as the device addresses it (mapped): a missing expert's entries */
} cu_expert_table;

/* The GPU as an expert cache (DESIGN.md 5; expert_cache.cu). n_slots experts resident at once; pool 0 holds the
 * base matrices, pool 1 (made at the first delta table) the delta residuals of the same expert in the same slot
 * index. The decision of what to fetch and evict is the shared host protocol (backend/expert_cache.h). */
typedef struct {
    int64_t n_slots;       /* 0: no cache */
    void *ec;              /* moet_ecache (host bookkeeping; void here: that header is C) */
    size_t slot_bytes[2], off[2][3]; /* a slot's size and its three matrices' offsets, per pool */
    int64_t mat_bytes[2][3];
    uint8_t *pool[2];      /* device: n_slots + 1 slots, the last the stand-in (zeros, never handed out) */
    uint8_t *tmp;          /* device: repack scratch of tmp_bytes */
    size_t tmp_bytes;
    int32_t pinned;        /* MOET_EXPERT_HOME_PINNED: each cached table keeps a pinned image of its experts */
    uint8_t *stage;        /* device: one slot of stage_bytes, where pinned images are made */
    size_t stage_bytes;
    const void **owner_key; /* [n_slots]: the layer key holding the slot (NULL: free) */
    int32_t *owner_e;      /* [n_slots]: and its expert */
    uint8_t *used;         /* device: [CU_EC_ROWS][E] bytes, 1 where a step routed to the expert (k_ecache_mark) */
    uint8_t *used_host;    /* pinned, the same */
    int32_t E;             /* experts a row (the first cached layer's; later layers must not have more) */
    int32_t n_rows;        /* rows handed out */
} cu_ecache;

#define CU_EC_ROWS 1024

typedef struct {
    uint64_t key;
    int seen;
    cudaGraphExec_t exec;
} cu_graph;

#define CU_MAX_GRAPHS 64

#define CU_ATTN_RETIRED 8 /* attn_split.cu: scratch buffers replaced by a larger one, kept until the backend goes */

typedef struct {
    moet_backend base;
    int device;
    cudaStream_t stream;
    cudaDeviceProp prop;
    char desc[160];
    char err[512];         /* first failure, "" while healthy */
    cu_mirror *mirrors;    /* open addressing, cap a power of two */
    size_t n_mirrors, cap_mirrors;
    cu_expert_table *etabs;
    size_t n_etabs, cap_etabs;
    cu_graph graphs[CU_MAX_GRAPHS];
    int n_graphs;
    int capturing;
    int32_t *ticket;       /* device int, 0 between launches: moe_tc.cu's router counts its finished CTAs on it */
    int32_t *fsync;        /* device ints, 0 between launches: moe_fused.cu's counters (MOE_MAX_K + 2 used) */
    int32_t *dn_tickets;   /* CU_DN_TICKETS device ints, 0 between launches: moe_tc.cu's gate/up CTAs count each
                              finished chunk of a slot's activations on them (cu_tc_dpre) */
    int pdl;               /* launch the decode kernels with programmatic dependent launch (sm_90+, MOET_PDL != 0) */
    void *blas;            /* gemm.cu: cublasHandle_t, created at the first GEMM (NULL: none yet) */
    void *blas_ws;         /* its workspace (device) */
    void *gemm_buf;        /* split x and partial products (device): GEMM_SCRATCH bytes, made once, never moved */
    int gemm_reuse;        /* set by cu_norm_mul_mat around its products of one x: a split of that x still in
                              gemm_buf (one pass of n tokens) is used again instead of made again */
    const float *gemm_xs_src; /* what gemm_buf's split holds (NULL: nothing reusable): x, its tokens, width, terms */
    int64_t gemm_xs_n, gemm_xs_cols;
    int gemm_xs_nt;
    void *gemm_wbuf;       /* Q8_0 rows as f16 hi | lo (device): GEMM_WSCRATCH bytes, made at the first Q8_0 GEMM */
    void *attn_part;       /* attn_tc.cu: split row tiles' tickets (0 between launches) and partial results; made
                              at the first split, sized for any shape, never moved */
    void *attn_split;      /* attn_split.cu: key splits' tickets (0 between launches) and partials, attn_split_cap
                              bytes; grown only by an eager launch, the buffers it replaces kept (recorded steps) */
    size_t attn_split_cap;
    void *attn_retired[CU_ATTN_RETIRED];
    int n_attn_retired;
    cu_ecache ecache;      /* the expert cache (n_slots 0: off) */
} cu_backend;

#define CU_DN_TICKETS 4096

static inline cu_backend *cu_of(moet_backend *be) { return (cu_backend *)be; }

#ifdef __cplusplus
extern "C" {
#endif

/* Records the first failure; returns 1 when e is an error. */
int cu_fail(cu_backend *c, cudaError_t e, const char *what, const char *file, int line);
/* Device copy of a weight (host memory) of `bytes`, uploaded at first use; NULL after recording an error. */
const void *cu_weight(cu_backend *c, const void *host, size_t bytes);
const uint8_t *cu_weight_mat(cu_backend *c, const moet_weight *w);
/* The mirror entry of a weight already mirrored (cu_weight), NULL if none. */
cu_mirror *cu_mirror_of(cu_backend *c, const void *host);
/* Enters a mirror (made by the caller, keyed on m->host) into the table; 0, or 1 after recording an error. */
int cu_mirror_put(cu_backend *c, const cu_mirror *m);
/* Rewrites a 2-bit matrix (rows % 16 == 0, cols % 32 == 0) in place into the tiled layout; tmp: rows * row_bytes of
 * device scratch. 0 on success. */
int cu_q2_tile_repack(cu_backend *c, uint8_t *d, int64_t rows, int64_t cols, size_t row_bytes, uint8_t *tmp);
/* The same for a tiled NVFP4 matrix (a delta residual: rows % 16 == 0, cols % 32 == 0, rows of cols/16 blocks). */
int cu_nv_tile_repack(cu_backend *c, uint8_t *d, int64_t rows, int64_t cols, size_t row_bytes, uint8_t *tmp);
/* The layer's routed experts as one device table (built at first use). NULL after recording an error. */
const cu_expert_table *cu_experts(cu_backend *c, const moet_moe_args *a);
/* The layer's delta residuals (a->dgate/dup/ddown, NVFP4) as a table of tiled matrices with their rotations' sign
 * rows, keyed on a->dgate; an expert's gate and up residuals must share one rotation. NULL after recording an error
 * (a->dgate NULL: NULL, no error). */
const cu_expert_table *cu_delta_experts(cu_backend *c, const moet_moe_args *a);

/* expert_cache.cu: the GPU as an expert cache. cu_ecache_table fills a new table's device pointers with the stand-in
 * slot (nothing is mirrored; experts arrive at fetches) and registers it (t->w3, t->base_gate set by the caller);
 * 0, or -1 after recording an error. cu_ecache_mark, after a cached layer's MoE launches: marks the experts its
 * n picks (ids, device) routed to. cu_ecache_forget: a table keyed on key goes away. */
int cu_ecache_table(cu_backend *c, cu_expert_table *t, cu_mat *host);
void cu_ecache_mark(cu_backend *c, const cu_expert_table *t, const int32_t *ids, int64_t n);
void cu_ecache_forget(cu_backend *c, const cu_expert_table *t);
int cu_expert_cache(moet_backend *be, int64_t n_slots, int32_t home);
int64_t cu_expert_cache_resolve(moet_backend *be);
void cu_expert_cache_stats(moet_backend *be, int64_t out[5]);
void cu_ecache_free(cu_backend *c);

/* op families (matmul.cu, elementwise.cu, attention.cu, moe.cu) */
void cu_mul_mat(moet_backend *be, const moet_weight *w, const float *x, int64_t n, float *y);
void cu_mul_mat_acc(moet_backend *be, const moet_weight *w, const float *x, int64_t n, const float *bias, float *y);
/* y = x W^T + bias (bias: host weights, w->rows floats; NULL: cu_mul_mat), the bias added in the product's store */
void cu_mul_mat_bias(moet_backend *be, const moet_weight *w, const float *x, int64_t n, const float *bias, float *y);
void cu_norm_mul_mat(moet_backend *be, const float *x, const float *norm_w, float eps, int64_t n, int64_t dim,
                     float *h, int32_t nw, const moet_weight *const *w, const float *const *bias, float *const *y);
/* gemm.cu: y (+)= x W^T (+ b: a device bias, NULL none) on tensor cores (cuBLAS) when n is large: BF16 with x as
 * three BF16 terms, Q8_0 (its q8t copy d) as two F16 terms against x as two; 1 when it ran (or recorded an error),
 * 0 to leave the product to the GEMV kernels. */
int cu_gemm_wants(int32_t type, int64_t n); /* whether n tokens of a type-`type` matrix would come here */
int cu_gemm_bf16(cu_backend *c, const moet_weight *w, const uint8_t *d, const float *x, int64_t n, float *y, int acc,
                 const float *b);
int cu_gemm_q8t(cu_backend *c, const moet_weight *w, const uint8_t *d, const float *x, int64_t n, float *y, int acc,
                const float *b);
void cu_gemm_release(cu_backend *c);
void cu_get_rows(moet_backend *be, const moet_weight *w, const int32_t *ids, int64_t n, float *y);
void cu_add(moet_backend *be, float *y, const float *x, const float *bias, int64_t n, int64_t dim);
void cu_rms_norm(moet_backend *be, const float *x, const float *w, int64_t n, int64_t dim, float eps, float *y);
void cu_rope(moet_backend *be, float *x, int64_t n_tok, int32_t n_heads, int32_t head_dim, const moet_rope *rp,
             const int32_t *pos);
void cu_kv_store(moet_backend *be, void *pool, int32_t type, const int32_t *blocks, int32_t shift, const float *src,
                 const int32_t *pos, int64_t n_tok, int64_t dim);
void cu_attn_prep(moet_backend *be, float *q, float *k, const float *v, int64_t n_tok, int32_t n_heads, int32_t n_kv,
                  int32_t head_dim, const float *q_norm, const float *k_norm, float eps, const moet_rope *rp,
                  const int32_t *pos, const moet_kv_ref *kv);
void cu_swiglu(cu_backend *c, float *g, const float *u, int64_t n);
void cu_fill_random(moet_backend *be, void *p, int32_t type, int64_t rows, int64_t cols, float scale, uint64_t seed);
void cu_attention(moet_backend *be, const moet_attn_args *a);
int cu_attn_tc(cu_backend *c, const moet_attn_args *a);
int cu_attn_split(cu_backend *c, float *q, float *k, const float *v, const float *q_norm, const float *k_norm, float eps,
                  const moet_rope *rp, const moet_kv_ref *rows, const moet_attn_args *a, int prep, const float *sinks);
void cu_topk(moet_backend *be, const float *x, int64_t n, int64_t vocab, int32_t k, void *scratch, int32_t *ids,
             float *vals, float *lz);
size_t cu_topk_scratch_bytes(moet_backend *be, int64_t n, int64_t vocab, int32_t k);
void cu_attn_fused(moet_backend *be, float *q, float *k, const float *v, const float *q_norm, const float *k_norm,
                   float eps, const moet_rope *rp, const moet_attn_args *a);
size_t cu_attn_scratch_bytes(moet_backend *be, int32_t n_ctx);
int cu_attn_rows(moet_backend *be, float *q, float *k, const float *v, const float *q_norm, const float *k_norm,
                 float eps, const moet_rope *rp, const moet_kv_ref *rows, const moet_attn_args *a);
void cu_mla_prep(moet_backend *be, float *q, const float *kvb, const float *kpe, int64_t n, int32_t nh, int32_t nope,
                 int32_t rope, int32_t vd, int32_t interleave, float *k, float *v);
void cu_heads_narrow(moet_backend *be, const float *x, int64_t n, int32_t nh, int32_t xd, int32_t w, float *y);
void cu_mla_attn(moet_backend *be, const float *q, const float *ckv, const float *kpe, const moet_weight *kv_b,
                 int64_t n, int32_t nh, int32_t nope, int32_t rope, int32_t vd, int32_t kvlr, int32_t interleave,
                 const moet_rope *rp, const int32_t *pos, const moet_kv_ref *kv, float scale, float *out);
void cu_mlp(moet_backend *be, const moet_weight *gate, const moet_weight *up, const moet_weight *down,
            const float *x, const float *norm_w, float eps, float *h, int64_t n, float *scratch, float *y);
void cu_moe(moet_backend *be, const moet_moe_args *a);
/* MOET_MOE_TRACE=1: prints the last fused MoE launch's phase times (stderr); called at teardown (moe_fused.cu). */
void cu_moe_fused_report(cu_backend *c);
void cu_moe_fused_trace_init(cu_backend *c);
/* matmul.cu: whether the decode down kernel lets the next kernel (k_mv16s) launch at its start */
/* moe_st.cu's launches so far (0: gate/up, 1: down): moet_backend_cuda_launches */
long long cu_moe_st_launches(int down);
int cu_mv_early_next(void);
int cu_mv_carve_down(void);
/* moet_backend_cuda_kernel_regs's sources: registers a thread of the decode router (down 0) or down (1), moe_tc.cu,
 * and of the pre-normed bf16 k_mv16s, matmul.cu; -1 on an error */
int cu_moe_tc_regs(int down);
int cu_mv16s_regs(void);
/* trace.cu: the kernel timeline (MOET_CUDA_TRACE builds, MOET_TRACE=FILE; no-ops otherwise) */
void cu_trace_init(cu_backend *c);
void cu_trace_step(cu_backend *c);
void cu_trace_dump(cu_backend *c);
size_t cu_moe_scratch_bytes(moet_backend *be, int64_t n_tok, int64_t hidden, int64_t ffn, int32_t n_experts,
                            int32_t n_used);

#ifdef __cplusplus
}
#endif

#ifdef __cplusplus
/* The SM's split of its 256 KB between L1 and shared memory is chosen per kernel at launch and can change only on
 * an SM with nothing resident: a kernel that asks for more shared memory than the split of the kernel running there
 * cannot start beside it, however early that kernel let it launch. So the decode down kernel (moe_tc.cu) and the
 * streaming GEMV after it (matmul.cu's k_mv16s, ~140 KB) ask for the largest shared split
 * (cudaSharedmemCarveoutMaxShared), once a kernel (sticky for the process); MOET_CARVEOUT=0 leaves the driver's
 * choice (the A/B). Measured on an H100 (stop 31): for every PDL launch, 30b tg64 +1.8% but 235b -3.7%; for down
 * and k_mv16s only, 30b +5.1%, 235b -1.8%: so down takes it only where the ring holds the q/k/v rows
 * (matmul.cu, cu_mv_carve_down). */
void cu_carveout_max(cu_backend *c, const void *k);
/* Launches kernel k like <<<grid, block, smem, c->stream>>>, with programmatic stream serialization when c->pdl:
 * the kernel must follow the cu_pdl_wait() rule of common.cuh. The launch error is left for CU_LAUNCHED. */
template <typename... KArgs, typename... Args>
static inline void cu_launch_pdl(cu_backend *c, void (*k)(KArgs...), dim3 grid, dim3 block, size_t smem,
                                 Args... args) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = c->stream;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = at;
    cfg.numAttrs = c->pdl ? 1 : 0;
    const cudaError_t e = cudaLaunchKernelEx(&cfg, k, ((KArgs)args)...);
    if (e != cudaSuccess) cu_fail(c, e, "cudaLaunchKernelEx", __FILE__, __LINE__);
}
#endif

#define CU_CHECK(c, call) cu_fail((c), (call), #call, __FILE__, __LINE__)
#define CU_LAUNCHED(c, name) cu_fail((c), cudaGetLastError(), name, __FILE__, __LINE__)

#endif
