/*
 * backend.h — the one ABI every compute backend implements (CPU now; CUDA builds against this same header).
 *
 * A backend is a table of ops over plain views: weights are (pointer, type, rows, cols) into the mapped model,
 * activations are dense row-major f32 arrays the caller owns (allocated through the backend, so for CUDA they are
 * device memory). Ops are the units a fused GPU kernel would cover: the whole MoE block (route, top-k, experts,
 * combine) is one op, so a backend can run it without a host round trip.
 *
 * Threading: a backend instance is used by one thread at a time (the session evaluating, or the server's scheduler).
 */
#ifndef MOET_BACKEND_H
#define MOET_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* A 2-D weight: rows × cols elements of `type`, row r at data + r * row_bytes. out = x · Wᵀ (HF Linear layout). */
typedef struct {
    const void *data;
    int32_t type;
    int64_t rows, cols;
    size_t row_bytes;
    /* Per-matrix quantization parameters (quant/blocks.h): the 2-bit formats' scale base and beta, NVFP4's tensor
     * scale. rotated: the matrix is stored as W·R (R = moet_rotate_row(seed)), so ops multiply it with x·R. */
    float qscale, qbeta;
    uint32_t rot_seed;
    int32_t rotated;
} moet_weight;

enum { MOET_ROUTER_SOFTMAX = 0 };

typedef struct {
    const float *x;            /* [n_tok][hidden] normed input */
    int64_t n_tok, hidden, ffn;
    const moet_weight *router; /* [n_experts × hidden] */
    int32_t n_experts, n_used;
    int32_t scoring;           /* MOET_ROUTER_* */
    int32_t norm_topk;         /* renormalise the chosen weights to sum 1 */
    const moet_weight *gate, *up, *down; /* arrays of n_experts: gate/up [ffn × hidden], down [hidden × ffn] */
    int32_t *topk_ids;         /* out: [n_tok][n_used], in descending weight order */
    float *topk_w;             /* out: [n_tok][n_used] */
    float *y;                  /* out: [n_tok][hidden] */
    void *scratch;             /* moe_scratch_bytes(...) bytes from alloc() */
    /* Calibration (host memory, NULL normally): per expert, += x x^T of gate/up inputs [E][hidden][hidden], of down
     * inputs [E][ffn][ffn], and the routed token count [E]. Backends without it leave them untouched. */
    double *calib_in, *calib_down;
    int64_t *calib_count;
} moet_moe_args;

typedef struct {
    const float *q;            /* [n_tok][n_heads * head_dim], already normed and rotated */
    const float *k_cache, *v_cache; /* [n_ctx][n_kv * head_dim]; positions 0 .. pos0+n_tok-1 valid */
    int32_t pos0;
    int64_t n_tok;
    int32_t n_heads, n_kv, head_dim, n_ctx;
    float scale;
    float *out;                /* [n_tok][n_heads * head_dim] */
    void *scratch;             /* attn_scratch_bytes(n_ctx) bytes */
} moet_attn_args;

typedef struct moet_backend moet_backend;

typedef struct {
    const char *name;
    void (*destroy)(moet_backend *be);
    void *(*alloc)(moet_backend *be, size_t bytes);
    void (*release)(moet_backend *be, void *p);
    void (*copy)(moet_backend *be, void *dst, const void *src, size_t bytes);
    /* y[i] = row ids[i] of w widened to f32 (embedding lookup). ids are host memory. */
    void (*get_rows)(moet_backend *be, const moet_weight *w, const int32_t *ids, int64_t n, float *y);
    /* y[r][i] += x[r][i] for n rows of dim; x == NULL adds nothing. bias != NULL: y[r][i] += bias[i] instead. */
    void (*add)(moet_backend *be, float *y, const float *x, const float *bias, int64_t n, int64_t dim);
    /* y[n][w->rows] = x[n][w->cols] · Wᵀ */
    void (*mul_mat)(moet_backend *be, const moet_weight *w, const float *x, int64_t n, float *y);
    /* y[i] = x[i] / rms(x[i]) * w, for n rows of dim; y may equal x. */
    void (*rms_norm)(moet_backend *be, const float *x, const float *w, int64_t n, int64_t dim, float eps, float *y);
    /* Rotary embedding, rotate-half (NeoX/HF) form, in place on n_tok rows of n_heads × head_dim.
     * cs: [n_tok][rot_dim/2][2] (cos, sin). */
    void (*rope)(moet_backend *be, float *x, int64_t n_tok, int32_t n_heads, int32_t head_dim, int32_t rot_dim,
                 const float *cs);
    void (*attention)(moet_backend *be, const moet_attn_args *a);
    size_t (*attn_scratch_bytes)(moet_backend *be, int32_t n_ctx);
    /* Dense SwiGLU MLP: y = down(silu(gate x) * up x); scratch: 2 * n * ffn floats. */
    void (*mlp)(moet_backend *be, const moet_weight *gate, const moet_weight *up, const moet_weight *down,
                const float *x, int64_t n, float *scratch, float *y);
    void (*moe)(moet_backend *be, const moet_moe_args *a);
    size_t (*moe_scratch_bytes)(moet_backend *be, int64_t n_tok, int64_t hidden, int64_t ffn, int32_t n_experts,
                                int32_t n_used);
} moet_backend_ops;

struct moet_backend {
    const moet_backend_ops *ops;
};

/* The CPU reference backend (pthreads across rows). n_threads <= 0: all cores. */
moet_backend *moet_backend_cpu_create(int n_threads);
int moet_backend_cpu_threads(const moet_backend *be);

#ifdef __cplusplus
}
#endif
#endif
