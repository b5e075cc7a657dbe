/*
 * cpu_backend.c — the reference backend: f32 compute, weights widened from BF16/F16 on the fly, pthreads across
 * output rows. It is the oracle the CUDA backend is checked against, so clarity wins over speed where they
 * conflict; the inner dot products are still written so the compiler vectorises them (8 independent lanes) and
 * are built for AVX2+FMA where the CPU has it (function multi-versioning, chosen at load time).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/expert_cache.h"
#include "backend/mla_src.h"
#include "backend/route_ref.h"
#include "backend/topk_key.h"
#include "core/pool.h"
#include "core/util.h"
#include "quant/formats.h"
#include "quant/matq.h"
#include "quant/requant.h"
#include "quant/synth.h"
#include "quant/types.h"

#define MOET_ROUTE_GUESS_MAX 64 /* the prefetch guess of the sigmoid router: picks a token at most */

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(MOET_NO_CLONES)
#define MOET_SIMD_CLONES __attribute__((target_clones("avx2,fma", "default")))
#else
#define MOET_SIMD_CLONES
#endif

#define ROW_BLOCK 4

typedef struct {
    moet_backend base;
    moet_pool *pool;
    int n_threads;
    float **rowbuf;     /* per thread: ROW_BLOCK widened rows */
    size_t rowbuf_cap;  /* floats per thread buffer */
    float *xrot;        /* rotated activations for matrices stored as W·R */
    size_t xrot_cap;
    float *mla_buf;     /* mla_attn: per thread a head's widened kv_b rows, its query, scores and latent output */
    size_t mla_cap;     /* floats in all */
    moet_ecache ec;     /* the expert cache's protocol (nothing moves on the CPU: every expert lies in host memory) */
    int ec_prefetch;    /* guess the next MoE layer's experts from this one's output (MOET_EXPERT_PREFETCH=0: off) */
    char desc[64];
} cpu_backend;

static cpu_backend *cpu(moet_backend *be) { return (cpu_backend *)be; }

/* ---- dot products -------------------------------------------------------------------------------------------- */

MOET_SIMD_CLONES
static void dot4(const float *w0, const float *w1, const float *w2, const float *w3, const float *x, int64_t n,
                 float out[4]) {
    float a0[8] = {0}, a1[8] = {0}, a2[8] = {0}, a3[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) {
            float xv = x[i + j];
            a0[j] += w0[i + j] * xv;
            a1[j] += w1[i + j] * xv;
            a2[j] += w2[i + j] * xv;
            a3[j] += w3[i + j] * xv;
        }
    float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    for (int j = 0; j < 8; j++) { s0 += a0[j]; s1 += a1[j]; s2 += a2[j]; s3 += a3[j]; }
    for (; i < n; i++) { s0 += w0[i] * x[i]; s1 += w1[i] * x[i]; s2 += w2[i] * x[i]; s3 += w3[i] * x[i]; }
    out[0] = s0; out[1] = s1; out[2] = s2; out[3] = s3;
}

MOET_SIMD_CLONES
static float dot1(const float *a, const float *b, int64_t n) {
    float acc[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) acc[j] += a[i + j] * b[i + j];
    float s = 0;
    for (int j = 0; j < 8; j++) s += acc[j];
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

MOET_SIMD_CLONES
static void axpy(float *y, const float *x, float a, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] += a * x[i];
}

/* ---- buffers ------------------------------------------------------------------------------------------------- */

static void *cpu_alloc(moet_backend *be, size_t bytes) {
    (void)be;
    void *p = NULL;
    if (posix_memalign(&p, 64, bytes ? bytes : 64) != 0) return NULL;
    memset(p, 0, bytes);
    return p;
}
static void cpu_release(moet_backend *be, void *p) { (void)be; free(p); }

/* Grows the per-thread row buffers; only the first call at a new largest width allocates. */
static int ensure_rowbuf(cpu_backend *c, int64_t cols) {
    size_t need = (size_t)cols * ROW_BLOCK;
    if (need <= c->rowbuf_cap) return 0;
    for (int t = 0; t < c->n_threads; t++) {
        float *p = NULL;
        if (posix_memalign((void **)&p, 64, need * sizeof(float)) != 0) return -1;
        free(c->rowbuf[t]);
        c->rowbuf[t] = p;
    }
    c->rowbuf_cap = need;
    return 0;
}

/* ---- mul_mat ------------------------------------------------------------------------------------------------- */

typedef struct {
    cpu_backend *c;
    const moet_weight *w;
    const float *x;
    int64_t n;
    float *y;
    int acc;           /* y += the product (mul_mat_acc) */
    const float *bias; /* added to the product before it is stored or added (NULL: none) */
} mm_ctx;

/* nr products o of rows r0.. into y: (o + bias) rounded, then stored or added (the unfused ops' roundings) */
static inline void mm_store(float *y, const float *o, int nr, int acc, const float *bias, int64_t r0) {
    for (int j = 0; j < nr; j++) {
        const float v = bias ? o[j] + bias[r0 + j] : o[j];
        y[j] = acc ? y[j] + v : v;
    }
}

static void mm_task(void *vctx, int64_t rb, int64_t re, int tid) {
    mm_ctx *m = vctx;
    const moet_weight *w = m->w;
    const int64_t K = w->cols, R = w->rows;
    float *buf = m->c->rowbuf[tid];
    /* 2-bit and NVFP4 rows (W2 experts, the FP4 delta's residuals) are dotted straight from their blocks at every
     * token count (q2dot.c, fp4dot.c; AVX2 where there is): each block decoded once for up to MOET_DOT_TOKENS tokens,
     * each token's sums in the order they take for it alone (the _dot_rows functions' per row, which one or two
     * tokens take), so the products do not depend on how many tokens share the matrix in a step. (Until stop 45
     * three or more tokens took the widened rows and dot4's order, so a pack's window evaluated at once and token by
     * token differed in the last bits.) */
    const int q2 = w->type == MOET_TYPE_W2 || w->type == MOET_TYPE_INT2 || w->type == MOET_TYPE_SYM2;
    const int fp4 = w->type == MOET_TYPE_NVFP4 && K % MOET_QK_NVFP4 == 0;
    if ((q2 && K % MOET_QK == 0) || fp4) {
        const moet_q2_params qp = {.kind = w->type == MOET_TYPE_W2 ? MOET_Q2_W2 : w->type == MOET_TYPE_INT2 ? MOET_Q2_INT2
                                                                                                         : MOET_Q2_SYM2,
                                   .base = w->qscale, .beta = w->qbeta};
        float o[ROW_BLOCK][MOET_DOT_TOKENS];
        for (int64_t blk = rb; blk < re; blk++) {
            const int64_t r0 = blk * ROW_BLOCK;
            const int nr = (int)(R - r0 < ROW_BLOCK ? R - r0 : ROW_BLOCK);
            if (m->n <= 2) { /* decode: four rows a call for each token (the same sums as the token-batched form) */
                const void *rows[ROW_BLOCK];
                for (int j = 0; j < nr; j++) rows[j] = (const uint8_t *)w->data + (size_t)(r0 + j) * w->row_bytes;
                for (int64_t t = 0; t < m->n; t++) {
                    float ot[ROW_BLOCK];
                    if (fp4) moet_nvfp4_dot_rows((const moet_block_nvfp4 *const *)rows, nr, w->qscale, m->x + (size_t)t * K, K, ot);
                    else moet_q2_dot_rows(&qp, (const moet_block_q2 *const *)rows, nr, m->x + (size_t)t * K, K, ot);
                    mm_store(m->y + (size_t)t * R + r0, ot, nr, m->acc, m->bias, r0);
                }
                continue;
            }
            for (int64_t t0 = 0; t0 < m->n; t0 += MOET_DOT_TOKENS) {
                const int nt = (int)(m->n - t0 < MOET_DOT_TOKENS ? m->n - t0 : MOET_DOT_TOKENS);
                for (int j = 0; j < nr; j++) {
                    const uint8_t *row = (const uint8_t *)w->data + (size_t)(r0 + j) * w->row_bytes;
                    if (fp4) moet_nvfp4_dot_tokens((const moet_block_nvfp4 *)row, w->qscale, m->x + (size_t)t0 * K, K, nt, K, o[j]);
                    else moet_q2_dot_tokens(&qp, (const moet_block_q2 *)row, m->x + (size_t)t0 * K, K, nt, K, o[j]);
                }
                for (int t = 0; t < nt; t++) {
                    float ot[ROW_BLOCK];
                    for (int j = 0; j < nr; j++) ot[j] = o[j][t];
                    mm_store(m->y + (size_t)(t0 + t) * R + r0, ot, nr, m->acc, m->bias, r0);
                }
            }
        }
        return;
    }
    /* Tasks are in units of ROW_BLOCK rows. */
    for (int64_t blk = rb; blk < re; blk++) {
        int64_t r0 = blk * ROW_BLOCK;
        int nr = (int)(R - r0 < ROW_BLOCK ? R - r0 : ROW_BLOCK);
        const float *rows[ROW_BLOCK];
        for (int j = 0; j < ROW_BLOCK; j++) {
            int rj = j < nr ? j : nr - 1;
            const uint8_t *src = (const uint8_t *)w->data + (size_t)(r0 + rj) * w->row_bytes;
            if (w->type == MOET_TYPE_F32) {
                rows[j] = (const float *)src;
            } else {
                if (j < nr) moet_weight_row_f32(w, r0 + rj, buf + (size_t)j * K);
                rows[j] = buf + (size_t)rj * K;
            }
        }
        for (int64_t t = 0; t < m->n; t++) {
            float o[4];
            dot4(rows[0], rows[1], rows[2], rows[3], m->x + (size_t)t * K, K, o);
            mm_store(m->y + (size_t)t * R + r0, o, nr, m->acc, m->bias, r0);
        }
    }
}

static void mul_mat_impl(moet_backend *be, const moet_weight *w, const float *x, int64_t n, float *y, int acc,
                         const float *bias) {
    cpu_backend *c = cpu(be);
    if (n <= 0 || w->rows <= 0) return;
    if (ensure_rowbuf(c, w->cols) != 0) abort(); /* out of memory at first use: nothing sane to return */
    if (w->rotated) { /* y = (W R)(R^T x): rotate each activation row once (x R as a row vector) */
        size_t need = (size_t)n * (size_t)w->cols;
        if (need > c->xrot_cap) {
            float *p = realloc(c->xrot, need * sizeof(float));
            if (!p) abort();
            c->xrot = p;
            c->xrot_cap = need;
        }
        for (int64_t t = 0; t < n; t++) {
            memcpy(c->xrot + (size_t)t * w->cols, x + (size_t)t * w->cols, (size_t)w->cols * sizeof(float));
            moet_rotate_row_f32(c->xrot + (size_t)t * w->cols, w->cols, w->rot_seed, 0);
        }
        x = c->xrot;
    }
    mm_ctx m = {c, w, x, n, y, acc, bias};
    int64_t blocks = (w->rows + ROW_BLOCK - 1) / ROW_BLOCK;
    /* Below ~64K multiply-adds a hand-off costs more than it saves. */
    if ((double)w->rows * (double)w->cols * (double)n < 65536.0)
        mm_task(&m, 0, blocks, 0);
    else
        moet_pool_for(c->pool, blocks, mm_task, &m);
}

static void cpu_mul_mat(moet_backend *be, const moet_weight *w, const float *x, int64_t n, float *y) {
    mul_mat_impl(be, w, x, n, y, 0, NULL);
}

static void cpu_mul_mat_acc(moet_backend *be, const moet_weight *w, const float *x, int64_t n, const float *bias,
                            float *y) {
    mul_mat_impl(be, w, x, n, y, 1, bias);
}

static void cpu_rms_norm(moet_backend *be, const float *x, const float *w, int64_t n, int64_t dim, float eps,
                         float *y);

/* The fused ops are their definitions here (backend.h): the CPU reference composes its own ops. */
static void cpu_norm_mul_mat(moet_backend *be, const float *x, const float *norm_w, float eps, int64_t n, int64_t dim,
                             float *h, int32_t nw, const moet_weight *const *w, const float *const *bias,
                             float *const *y) {
    cpu_rms_norm(be, x, norm_w, n, dim, eps, h);
    for (int32_t i = 0; i < nw; i++) mul_mat_impl(be, w[i], h, n, y[i], 0, bias ? bias[i] : NULL);
}

static void cpu_copy(moet_backend *be, void *dst, const void *src, size_t bytes) {
    (void)be;
    memmove(dst, src, bytes);
}

static void cpu_graph_release(moet_backend *be, uint32_t owner) { (void)be; (void)owner; }

static int cpu_graph_run(moet_backend *be, uint64_t key, void (*step)(void *ctx), void *ctx) {
    (void)be; (void)key;
    step(ctx);
    return 0;
}

/* Synthetic weights (quant/synth.h: the CUDA backend generates the same values). */
static void cpu_fill_random(moet_backend *be, void *p, int32_t type, int64_t rows, int64_t cols, float scale,
                            uint64_t seed) {
    (void)be;
    const moet_type_traits *tt = moet_type_get(type);
    size_t rb = moet_type_row_bytes(type, cols);
    if (!tt || !rb) return;
    if (type == MOET_TYPE_F32 || type == MOET_TYPE_F16 || type == MOET_TYPE_BF16) {
        for (int64_t i = 0; i < rows * cols; i++) {
            float v = moet_synth_float(seed, (uint64_t)i, scale);
            if (type == MOET_TYPE_F32) ((float *)p)[i] = v;
            else if (type == MOET_TYPE_F16) ((uint16_t *)p)[i] = moet_f32_to_f16(v);
            else ((uint16_t *)p)[i] = moet_f32_to_bf16(v);
        }
        return;
    }
    uint8_t *b = p;
    size_t total = rb * (size_t)rows;
    for (size_t i = 0; i < total; i += 8) {
        uint64_t z = moet_synth_word(seed, i / 8);
        for (size_t j = 0; j < 8 && i + j < total; j++) b[i + j] = (uint8_t)(z >> (8 * j));
    }
    const uint16_t q8d = moet_f32_to_f16(scale / 64.0f);
    for (size_t k = 0; k < total / (size_t)tt->type_size; k++) moet_synth_fix_block(type, b + k * (size_t)tt->type_size, q8d);
}

/* f16 bits to float: the normal numbers by shifts (the cache's common case), the rest by moet_f16_to_f32. */
static inline float kv_h2f(uint16_t h) {
    const uint32_t e = (h >> 10) & 0x1f;
    if (e == 0 || e == 31) return moet_f16_to_f32(h);
    union { uint32_t u; float f; } v = {.u = ((uint32_t)(h & 0x8000) << 16) | ((e + 112) << 23) | ((uint32_t)(h & 0x3ff) << 13)};
    return v.f;
}

/* n elements of a pool row (type MOET_KVE_*) from element off of pool row `row` of `stride` elements, as floats:
 * the row itself (f32) or tmp, widened (f16; n <= KV_TMP). */
#define KV_TMP 256
static const float *kv_floats(const void *pool, int32_t type, size_t row, size_t stride, size_t off, size_t n,
                              float *tmp) {
    if (type != MOET_KVE_F16) return (const float *)pool + row * stride + off;
    const uint16_t *h = (const uint16_t *)pool + row * stride + off;
    for (size_t i = 0; i < n; i++) tmp[i] = kv_h2f(h[i]);
    return tmp;
}

/* q . (n elements of pool row `row`, rows `stride` elements apart, from element off), and o += w (the same
 * elements): dot1 / axpy over the row as stored (f32: the sums of an f32 cache as they always were), or widened in
 * chunks of KV_TMP (f16). Attention reads a head's keys and values through them, MLA its latent rows. */
static float kv_dot(const float *q, const void *pool, int32_t type, size_t row, size_t stride, size_t off, size_t n) {
    if (type != MOET_KVE_F16) return dot1(q, (const float *)pool + row * stride + off, (int64_t)n);
    float tmp[KV_TMP], s = 0.f;
    for (size_t c = 0; c < n; c += KV_TMP) {
        const size_t m = n - c < KV_TMP ? n - c : KV_TMP;
        s += dot1(q + c, kv_floats(pool, type, row, stride, off + c, m, tmp), (int64_t)m);
    }
    return s;
}

static void kv_axpy(float *o, const void *pool, int32_t type, size_t row, size_t stride, size_t off, float w, size_t n) {
    if (type != MOET_KVE_F16) { axpy(o, (const float *)pool + row * stride + off, w, (int64_t)n); return; }
    float tmp[KV_TMP];
    for (size_t c = 0; c < n; c += KV_TMP) {
        const size_t m = n - c < KV_TMP ? n - c : KV_TMP;
        axpy(o + c, kv_floats(pool, type, row, stride, off + c, m, tmp), w, (int64_t)m);
    }
}

static void cpu_kv_store(moet_backend *be, void *pool, int32_t type, const int32_t *blocks, int32_t shift,
                         const float *src, const int32_t *pos, int64_t n_tok, int64_t dim) {
    (void)be;
    for (int64_t t = 0; t < n_tok; t++) {
        const size_t row = (size_t)moet_kv_row(blocks, shift, pos[t]) * (size_t)dim;
        const float *x = src + (size_t)t * (size_t)dim;
        if (type == MOET_KVE_F16)
            for (int64_t i = 0; i < dim; i++) ((uint16_t *)pool)[row + (size_t)i] = moet_f32_to_f16(x[i]);
        else
            memcpy((float *)pool + row, x, (size_t)dim * sizeof(float));
    }
}

static void cpu_get_rows(moet_backend *be, const moet_weight *w, const int32_t *ids, int64_t n, float *y) {
    (void)be;
    for (int64_t i = 0; i < n; i++) moet_weight_row_f32(w, ids[i], y + (size_t)i * w->cols);
}

static void cpu_add(moet_backend *be, float *y, const float *x, const float *bias, int64_t n, int64_t dim) {
    (void)be;
    for (int64_t r = 0; r < n; r++) {
        float *yr = y + (size_t)r * dim;
        const float *xr = bias ? bias : x ? x + (size_t)r * dim : NULL;
        if (!xr) return;
        for (int64_t i = 0; i < dim; i++) yr[i] += xr[i];
    }
}

/* ---- norms, rope ---------------------------------------------------------------------------------------------- */

static void cpu_rms_norm(moet_backend *be, const float *x, const float *w, int64_t n, int64_t dim, float eps,
                         float *y) {
    (void)be;
    for (int64_t r = 0; r < n; r++) {
        const float *xr = x + (size_t)r * dim;
        float *yr = y + (size_t)r * dim;
        double ss = 0;
        for (int64_t i = 0; i < dim; i++) ss += (double)xr[i] * xr[i];
        float inv = (float)(1.0 / sqrt(ss / (double)dim + (double)eps));
        for (int64_t i = 0; i < dim; i++) yr[i] = w[i] * (xr[i] * inv);
    }
}

/* RoPE's cos and sin of every pair at position p (backend.h, moet_rope), interleaved: cs[2i], cs[2i + 1]. */
static void rope_cs(const moet_rope *rp, int32_t p, float *cs) {
    for (int i = 0; i < rp->dim / 2 && i < MOET_ROPE_MAX_FREQ; i++) {
        const float ang = (float)p * rp->inv_freq[i];
        cs[2 * i] = (float)cos((double)ang) * rp->attn_factor;
        cs[2 * i + 1] = (float)sin((double)ang) * rp->attn_factor;
    }
}

/* Rotate-half of the first 2 half elements of v by rope_cs's table. */
static void rope_apply(float *v, const float *cs, int half) {
    for (int i = 0; i < half; i++) {
        const float co = cs[2 * i], si = cs[2 * i + 1], a = v[i], b = v[i + half];
        v[i] = a * co - b * si;
        v[i + half] = b * co + a * si;
    }
}

static void cpu_rope(moet_backend *be, float *x, int64_t n_tok, int32_t n_heads, int32_t head_dim,
                     const moet_rope *rp, const int32_t *pos) {
    (void)be;
    float cs[2 * MOET_ROPE_MAX_FREQ];
    for (int64_t t = 0; t < n_tok; t++) {
        rope_cs(rp, pos[t], cs); /* once a token, for all its heads */
        for (int32_t h = 0; h < n_heads; h++) rope_apply(x + ((size_t)t * n_heads + h) * head_dim, cs, rp->dim / 2);
    }
}


static void cpu_attn_prep(moet_backend *be, float *q, float *k, const float *v, int64_t n_tok, int32_t n_heads,
                          int32_t n_kv, int32_t head_dim, const float *q_norm, const float *k_norm, float eps,
                          const moet_rope *rp, const int32_t *pos, const moet_kv_ref *kv) {
    if (q_norm) cpu_rms_norm(be, q, q_norm, n_tok * n_heads, head_dim, eps, q);
    if (k_norm) cpu_rms_norm(be, k, k_norm, n_tok * n_kv, head_dim, eps, k);
    cpu_rope(be, q, n_tok, n_heads, head_dim, rp, pos);
    cpu_rope(be, k, n_tok, n_kv, head_dim, rp, pos);
    cpu_kv_store(be, kv->k, kv->type, kv->blocks, kv->shift, k, pos, n_tok, (int64_t)n_kv * head_dim);
    cpu_kv_store(be, kv->v, kv->type, kv->blocks, kv->shift, v, pos, n_tok, (int64_t)n_kv * head_dim);
}

/* MLA's inputs as attn_prep takes them (backend.h): per token and head, q's rope dims moved first (de-interleaved
 * when asked), k = [kpe, k_nope], v = [v, zeros]. */
static void cpu_mla_prep(moet_backend *be, float *q, const float *kvb, const float *kpe, int64_t n, int32_t nh,
                         int32_t nope, int32_t rope, int32_t vd, int32_t interleave, float *k, float *v) {
    (void)be;
    const int32_t hd = nope + rope;
    float pe[2 * MOET_ROPE_MAX_FREQ];
    for (int64_t t = 0; t < n; t++)
        for (int32_t h = 0; h < nh; h++) {
            float *qh = q + ((size_t)t * nh + h) * hd, *kh = k + ((size_t)t * nh + h) * hd, *vh = v + ((size_t)t * nh + h) * hd;
            const float *src = kvb + ((size_t)t * nh + h) * (size_t)(nope + vd), *kp = kpe + (size_t)t * rope;
            for (int32_t i = 0; i < rope; i++) pe[i] = qh[nope + i];
            memmove(qh + rope, qh, (size_t)nope * sizeof *qh);
            for (int32_t i = 0; i < rope; i++) {
                qh[i] = pe[moet_mla_src(i, rope, interleave)];
                kh[i] = kp[moet_mla_src(i, rope, interleave)];
            }
            memcpy(kh + rope, src, (size_t)nope * sizeof *kh);
            memcpy(vh, src + nope, (size_t)vd * sizeof *vh);
            for (int32_t i = vd; i < hd; i++) vh[i] = 0.0f;
        }
}

/* Rotate-half RoPE of one vector of rp->dim at position p, cpu_rope's arithmetic. */
static void rope_vec(float *v, const moet_rope *rp, int32_t p) {
    float cs[2 * MOET_ROPE_MAX_FREQ];
    rope_cs(rp, p, cs);
    rope_apply(v, cs, rp->dim / 2);
}

typedef struct {
    const float *q;
    const moet_weight *kv_b;
    int32_t nh, nope, rope, vd, kvlr, interleave;
    const moet_rope *rp;
    const int32_t *pos;
    const moet_kv_ref *kv;
    float scale;
    float *out;
    float *buf;
    size_t per;
} mla_ctx;

/* One (token, head) of mla_attn: the head's kv_b rows widened, q absorbed, attention over the latent rows, the output
 * through W_UV. */
static void mla_task(void *vctx, int64_t b, int64_t e, int tid) {
    const mla_ctx *c = vctx;
    const int32_t nope = c->nope, rope = c->rope, vd = c->vd, kvlr = c->kvlr, qd = nope + rope, rd = rope + kvlr;
    float *W = c->buf + (size_t)tid * c->per, *qf = W + (size_t)(nope + vd) * kvlr, *ol = qf + rd, *sc = ol + kvlr;
    for (int64_t task = b; task < e; task++) {
        const int64_t t = task / c->nh;
        const int32_t h = (int32_t)(task % c->nh), p = c->pos[t];
        const float *qh = c->q + (size_t)task * qd;
        for (int32_t r = 0; r < nope + vd; r++) moet_weight_row_f32(c->kv_b, (int64_t)h * (nope + vd) + r, W + (size_t)r * kvlr);
        for (int32_t i = 0; i < rope; i++) qf[i] = qh[nope + moet_mla_src(i, rope, c->interleave)]; /* q_pe', as mla_prep */
        rope_vec(qf, c->rp, p);
        float *ql = qf + rope; /* q_lat = W_UK^T q_nope */
        for (int32_t j = 0; j < kvlr; j++) ql[j] = 0.0f;
        for (int32_t i = 0; i < nope; i++) axpy(ql, W + (size_t)i * kvlr, qh[i], kvlr);
        float mx = -INFINITY;
        for (int32_t j = 0; j <= p; j++) {
            sc[j] = kv_dot(qf, c->kv->k, c->kv->type, (size_t)moet_kv_row(c->kv->blocks, c->kv->shift, j), (size_t)rd, 0,
                           (size_t)rd) * c->scale;
            if (sc[j] > mx) mx = sc[j];
        }
        double sum = 0;
        for (int32_t j = 0; j <= p; j++) { sc[j] = expf(sc[j] - mx); sum += sc[j]; }
        const float inv = (float)(1.0 / sum);
        for (int32_t j = 0; j < kvlr; j++) ol[j] = 0.0f;
        for (int32_t j = 0; j <= p; j++)
            kv_axpy(ol, c->kv->k, c->kv->type, (size_t)moet_kv_row(c->kv->blocks, c->kv->shift, j), (size_t)rd,
                    (size_t)rope, sc[j] * inv, (size_t)kvlr);
        float *o = c->out + (size_t)task * vd; /* W_UV o_lat */
        for (int32_t r = 0; r < vd; r++) o[r] = dot1(W + (size_t)(nope + r) * kvlr, ol, kvlr);
    }
}

static void cpu_mla_attn(moet_backend *be, const float *q, const float *ckv, const float *kpe, const moet_weight *kv_b,
                         int64_t n, int32_t nh, int32_t nope, int32_t rope, int32_t vd, int32_t kvlr, int32_t interleave,
                         const moet_rope *rp, const int32_t *pos, const moet_kv_ref *kv, float scale, float *out) {
    cpu_backend *cb = cpu(be);
    const int32_t rd = rope + kvlr;
    int32_t pmax = 0;
    float rowf[2 * MOET_ROPE_MAX_FREQ];
    for (int64_t t = 0; t < n; t++) { /* the latent rows first: a token sees the chunk's earlier ones */
        const size_t prow = (size_t)moet_kv_row(kv->blocks, kv->shift, pos[t]) * (size_t)rd;
        for (int32_t i = 0; i < rope; i++) rowf[i] = kpe[(size_t)t * rope + moet_mla_src(i, rope, interleave)];
        rope_vec(rowf, rp, pos[t]);
        if (kv->type == MOET_KVE_F16) {
            uint16_t *row = (uint16_t *)kv->k + prow;
            for (int32_t i = 0; i < rope; i++) row[i] = moet_f32_to_f16(rowf[i]);
            for (int32_t i = 0; i < kvlr; i++) row[rope + i] = moet_f32_to_f16(ckv[(size_t)t * kvlr + i]);
        } else {
            float *row = (float *)kv->k + prow;
            memcpy(row, rowf, (size_t)rope * sizeof(float));
            memcpy(row + rope, ckv + (size_t)t * kvlr, (size_t)kvlr * sizeof(float));
        }
        if (pos[t] > pmax) pmax = pos[t];
    }
    const size_t per = (size_t)(nope + vd) * kvlr + (size_t)rd + (size_t)kvlr + (size_t)pmax + 1;
    if (per * (size_t)cb->n_threads > cb->mla_cap) { /* grows with the context, doubling: rare */
        const size_t cap = per * (size_t)cb->n_threads * 2;
        float *nb = realloc(cb->mla_buf, cap * sizeof(float));
        if (!nb) abort(); /* out of memory: nothing sane to return */
        cb->mla_buf = nb;
        cb->mla_cap = cap;
    }
    mla_ctx c = {q, kv_b, nh, nope, rope, vd, kvlr, interleave, rp, pos, kv, scale, out, cb->mla_buf,
                 cb->mla_cap / (size_t)cb->n_threads};
    moet_pool_for(cb->pool, n * nh, mla_task, &c);
}

static void cpu_heads_narrow(moet_backend *be, const float *x, int64_t n, int32_t nh, int32_t xd, int32_t w, float *y) {
    (void)be;
    for (int64_t r = 0; r < n * nh; r++) memmove(y + (size_t)r * w, x + (size_t)r * xd, (size_t)w * sizeof *y);
}

/* ---- attention ------------------------------------------------------------------------------------------------ */

typedef struct {
    const moet_attn_args *a;
    int n_threads;
} attn_ctx;

static void attn_task(void *vctx, int64_t b, int64_t e, int tid) {
    const moet_attn_args *a = ((attn_ctx *)vctx)->a;
    const int hd = a->head_dim, group = a->n_heads / a->n_kv;
    const size_t kv_stride = (size_t)a->n_kv * hd;
    float *scores = (float *)a->scratch + (size_t)tid * a->n_ctx;
    for (int64_t task = b; task < e; task++) {
        int64_t t = task / a->n_heads;
        int h = (int)(task % a->n_heads), kvh = h / group;
        const float *q = a->q + ((size_t)t * a->n_heads + h) * hd;
        int32_t n_keys = a->pos[t] + 1;
        /* a sliding window: keys j0 .. pos (gpt-oss's sliding layers); the others get no weight */
        const int32_t j0 = a->window > 0 && n_keys > a->window ? n_keys - a->window : 0;
        float mx = a->sinks ? a->sinks[h] : -INFINITY;
        for (int32_t j = j0; j < n_keys; j++) {
            const size_t row = (size_t)moet_kv_row(a->kv.blocks, a->kv.shift, j);
            float s = kv_dot(q, a->kv.k, a->kv.type, row, kv_stride, (size_t)kvh * hd, (size_t)hd) * a->scale;
            scores[j] = s;
            if (s > mx) mx = s;
        }
        double sum = a->sinks ? expf(a->sinks[h] - mx) : 0; /* the sink's share of the softmax, its value dropped */
        for (int32_t j = j0; j < n_keys; j++) {
            scores[j] = expf(scores[j] - mx);
            sum += scores[j];
        }
        float inv = (float)(1.0 / sum);
        float *o = a->out + ((size_t)t * a->n_heads + h) * hd;
        memset(o, 0, (size_t)hd * sizeof(float));
        for (int32_t j = j0; j < n_keys; j++)
            kv_axpy(o, a->kv.v, a->kv.type, (size_t)moet_kv_row(a->kv.blocks, a->kv.shift, j), kv_stride,
                    (size_t)kvh * hd, scores[j] * inv, (size_t)hd);
    }
}

static size_t cpu_attn_scratch_bytes(moet_backend *be, int32_t n_ctx) {
    return (size_t)cpu(be)->n_threads * (size_t)n_ctx * sizeof(float);
}

static void cpu_attention(moet_backend *be, const moet_attn_args *a) {
    attn_ctx c = {a, cpu(be)->n_threads};
    int64_t tasks = a->n_tok * a->n_heads;
    if ((double)tasks * (a->pos[a->n_tok - 1] + 1) * a->head_dim < 65536.0)
        attn_task(&c, 0, tasks, 0);
    else
        moet_pool_for(cpu(be)->pool, tasks, attn_task, &c);
}

/* ---- MLP / MoE ------------------------------------------------------------------------------------------------ */

static inline float silu(float x) { return x / (1.0f + expf(-x)); }

static void cpu_mlp(moet_backend *be, const moet_weight *gate, const moet_weight *up, const moet_weight *down,
                    const float *x, const float *norm_w, float eps, float *h, int64_t n, float *scratch, float *y) {
    const int64_t F = gate->rows;
    float *g = scratch, *u = scratch + (size_t)n * F;
    if (norm_w) {
        cpu_rms_norm(be, x, norm_w, n, gate->cols, eps, h);
        x = h;
    }
    cpu_mul_mat(be, gate, x, n, g);
    cpu_mul_mat(be, up, x, n, u);
    for (int64_t i = 0; i < n * F; i++) g[i] = silu(g[i]) * u[i];
    cpu_mul_mat_acc(be, down, g, n, NULL, y);
}

/* Calibration statistics: acc[i][j] += sum_r x[r][i] x[r][j] for j >= i (upper triangle; consumers mirror it),
 * double accumulation. Rows i and dim-1-i form one task, so every task has the same amount of work. */
typedef struct {
    double *acc;
    const float *x;
    int32_t n;
    int64_t dim;
} xxt_ctx;

static void xxt_row(const xxt_ctx *c, int64_t i) {
    double *ar = c->acc + (size_t)i * c->dim;
    for (int32_t r = 0; r < c->n; r++) {
        const float *xr = c->x + (size_t)r * c->dim;
        double xi = xr[i];
        if (xi == 0) continue;
        for (int64_t j = i; j < c->dim; j++) ar[j] += xi * xr[j];
    }
}

static void xxt_task(void *vctx, int64_t b, int64_t e, int tid) {
    (void)tid;
    const xxt_ctx *c = vctx;
    for (int64_t t = b; t < e; t++) {
        xxt_row(c, t);
        if (c->dim - 1 - t != t) xxt_row(c, c->dim - 1 - t);
    }
}

static void accum_xxt(moet_backend *be, double *acc, const float *x, int32_t n, int64_t dim) {
    xxt_ctx c = {acc, x, n, dim};
    moet_pool_for(cpu(be)->pool, (dim + 1) / 2, xxt_task, &c);
}

/* Scratch layout for moe: logits [T][E] | xg [T][H] | g [T][F] | u [T][F] | d [T][H] | out [T][H] (accumulate) |
 * list [T*k] | cnt [E+1] | fill [E] | the sigmoid router's choice scores [E] */
static size_t cpu_moe_scratch_bytes(moet_backend *be, int64_t T, int64_t H, int64_t F, int32_t E, int32_t k) {
    (void)be;
    size_t fl = (size_t)T * E + (size_t)T * H * 3 + (size_t)T * F * 2;
    return fl * sizeof(float) + ((size_t)T * k + 3 * (size_t)E + 1) * sizeof(int32_t) + 256;
}

static void cpu_moe(moet_backend *be, const moet_moe_args *a) {
    const int64_t T = a->n_tok, H = a->hidden, F = a->ffn;
    const int32_t E = a->n_experts, K = a->n_used;
    float *logits = a->scratch;
    float *xg = logits + (size_t)T * E, *g = xg + (size_t)T * H, *u = g + (size_t)T * F, *d = u + (size_t)T * F;
    float *out = a->accumulate ? d + (size_t)T * H : a->y;
    int32_t *list = (int32_t *)(d + (size_t)T * H * 2), *cnt = list + (size_t)T * K;
    const float *x = a->x;
    if (a->norm_w) { /* the fused pre-norm: route and run the experts on h */
        cpu_rms_norm(be, a->x, a->norm_w, T, H, a->eps, a->h);
        x = a->h;
    }

    /* Route: softmax over all experts in f32, then the top k, as transformers' Qwen3-MoE/Mixtral router does. */
    cpu_mul_mat(be, a->router, x, T, logits);
    if (a->router_lbias)
        for (int64_t t = 0; t < T; t++)
            for (int32_t e = 0; e < E; e++) logits[(size_t)t * E + e] += a->router_lbias[e];
    for (int64_t t = 0; t < T && a->scoring == MOET_ROUTER_TOPK_SOFTMAX; t++) /* route_ref.h */
        moet_route_topk_softmax_ref(logits + (size_t)t * E, E, K, a->topk_ids + (size_t)t * K, a->topk_w + (size_t)t * K);
    for (int64_t t = 0; t < T && a->scoring == MOET_ROUTER_SIGMOID; t++) /* route_ref.h */
        moet_route_sigmoid_ref(logits + (size_t)t * E, a->router_bias, E, K, a->n_group, a->topk_group, a->norm_topk,
                               a->route_scale, (float *)(cnt + 2 * (size_t)E + 1), a->topk_ids + (size_t)t * K,
                               a->topk_w + (size_t)t * K);
    for (int64_t t = 0; t < T && a->scoring == MOET_ROUTER_SOFTMAX; t++) {
        float *p = logits + (size_t)t * E;
        float mx = p[0];
        for (int32_t e = 1; e < E; e++) mx = p[e] > mx ? p[e] : mx;
        float sum = 0;
        for (int32_t e = 0; e < E; e++) { p[e] = expf(p[e] - mx); sum += p[e]; }
        for (int32_t e = 0; e < E; e++) p[e] /= sum;
        int32_t *ids = a->topk_ids + (size_t)t * K;
        float *w = a->topk_w + (size_t)t * K;
        float wsum = 0;
        moet_route_pick(p, E, K, ids);
        for (int32_t j = 0; j < K; j++) {
            w[j] = p[ids[j]];
            wsum += w[j];
        }
        if (a->route_stats) { /* before renormalising: the K-th pick's probability against the best unpicked one */
            float best_out = 0.0f;
            double ent = 0.0;
            for (int32_t e = 0; e < E; e++) {
                int taken = 0;
                for (int32_t q = 0; q < K && !taken; q++) taken = ids[q] == e;
                if (!taken && p[e] > best_out) best_out = p[e];
                if (p[e] > 0) ent -= (double)p[e] * log((double)p[e]);
            }
            a->route_stats[2 * t] = w[K - 1] - best_out;
            a->route_stats[2 * t + 1] = (float)ent;
        }
        if (a->norm_topk)
            for (int32_t j = 0; j < K; j++) w[j] /= wsum;
    }
    /* Group the (token, slot) pairs by expert: a counting sort, so each expert's rows run as one batch. */
    memset(cnt, 0, (size_t)(E + 1) * sizeof(int32_t));
    for (int64_t i = 0; i < T * K; i++) cnt[a->topk_ids[i] + 1]++;
    for (int32_t e = 0; e < E; e++) cnt[e + 1] += cnt[e];
    int32_t *fill = cnt + E + 1;
    memcpy(fill, cnt, (size_t)E * sizeof(int32_t));
    for (int64_t i = 0; i < T * K; i++) list[fill[a->topk_ids[i]]++] = (int32_t)i;
    /* The delta on some picks only (a->delta_pick, backend.h): each expert's rows that take it first, so its
     * residuals multiply a prefix of the expert's batch; fill[e] becomes that prefix's length. */
    for (int32_t e = 0; e < E && a->dgate; e++) {
        int32_t *seg = list + cnt[e], n = cnt[e + 1] - cnt[e], m = 0;
        for (int32_t r = 0; r < n; r++) {
            const int32_t i = seg[r];
            if (!moet_delta_pick(a->topk_w + (size_t)(i / K) * K, K, i % K, a->delta_pick)) continue;
            seg[r] = seg[m];
            seg[m++] = i;
        }
        fill[e] = m;
        if (a->delta_count) a->delta_count[0] += m;
    }
    if (a->delta_count) a->delta_count[1] += T * K;

    memset(out, 0, (size_t)T * H * sizeof(float));
    moet_ecache_layer *cl = NULL;
    if (cpu(be)->ec.n_slots && !(cl = moet_ecache_layer_of(&cpu(be)->ec, a->gate, E))) abort(); /* out of memory */
    for (int32_t e = 0; e < E; e++) {
        int32_t n = cnt[e + 1] - cnt[e];
        if (n == 0) continue;
        /* not resident: a miss; the step runs again, or (direct mode) the expert is computed where it lies */
        if (cl && !moet_ecache_use(&cpu(be)->ec, cl, e) && !cpu(be)->ec.direct) continue;
        const int32_t *sel = list + cnt[e];
        for (int32_t r = 0; r < n; r++) memcpy(xg + (size_t)r * H, x + (size_t)(sel[r] / K) * H, H * sizeof(float));
        cpu_mul_mat(be, &a->gate[e], xg, n, g);
        cpu_mul_mat(be, &a->up[e], xg, n, u);
        if (a->dgate) { /* the delta's residuals, added after the base products (backend.h) */
            cpu_mul_mat_acc(be, &a->dgate[e], xg, fill[e], NULL, g);
            cpu_mul_mat_acc(be, &a->dup[e], xg, fill[e], NULL, u);
        }
        if (a->gate_b) /* gpt-oss: the experts' biases, then the clamped SwiGLU (backend.h) */
            for (int32_t r = 0; r < n; r++) {
                axpy(g + (size_t)r * F, a->gate_b + (size_t)e * F, 1.0f, F);
                axpy(u + (size_t)r * F, a->up_b + (size_t)e * F, 1.0f, F);
            }
        if (a->swiglu_limit > 0) {
            const float lim = a->swiglu_limit;
            for (int64_t i = 0; i < (int64_t)n * F; i++) {
                const float gc = g[i] < lim ? g[i] : lim, uc = u[i] < -lim ? -lim : u[i] > lim ? lim : u[i];
                g[i] = (uc + 1.0f) * (gc * (1.0f / (1.0f + expf(-(gc * 1.702f))))); /* transformers' order */
            }
        } else {
            for (int64_t i = 0; i < (int64_t)n * F; i++) g[i] = silu(g[i]) * u[i];
        }
        if (a->calib_in) {
            accum_xxt(be, a->calib_in + (size_t)e * H * H, xg, n, H);
            accum_xxt(be, a->calib_down + (size_t)e * F * F, g, n, F);
            a->calib_count[e] += n;
        }
        cpu_mul_mat(be, &a->down[e], g, n, d);
        if (a->ddown) cpu_mul_mat_acc(be, &a->ddown[e], g, fill[e], NULL, d);
        if (a->down_b)
            for (int32_t r = 0; r < n; r++) axpy(d + (size_t)r * H, a->down_b + (size_t)e * H, 1.0f, H);
        for (int32_t r = 0; r < n; r++)
            axpy(out + (size_t)(sel[r] / K) * H, d + (size_t)r * H, a->topk_w[sel[r]], H);
    }
    if (a->accumulate) /* y += out: the residual add as session.c did it before it was fused */
        for (int64_t i = 0; i < T * H; i++) a->y[i] += out[i];
    /* the cache's prefetch: y (the stream this block leaves) through the next MoE layer's pre-norm and router; its
     * top k experts of each token are fetched now where that evicts only experts of earlier steps */
    if (cl && cpu(be)->ec_prefetch && a->next_router && a->next_norm_w && a->next_gate) {
        moet_ecache_layer *nl = moet_ecache_layer_of(&cpu(be)->ec, a->next_gate, E);
        if (!nl) abort();
        cpu_rms_norm(be, a->y, a->next_norm_w, T, H, a->eps, xg);
        cpu_mul_mat(be, a->next_router, xg, T, logits);
        for (int64_t t = 0; t < T; t++) {
            float *p = logits + (size_t)t * E;
            if (a->scoring == MOET_ROUTER_SIGMOID) { /* the guess is the next router's own choice (bias, groups) */
                int32_t gid[MOET_ROUTE_GUESS_MAX];
                float gw[MOET_ROUTE_GUESS_MAX];
                if (K > MOET_ROUTE_GUESS_MAX) continue;
                moet_route_sigmoid_ref(p, a->next_router_bias, E, K, a->n_group, a->topk_group, a->norm_topk,
                                       a->route_scale, (float *)(cnt + 2 * (size_t)E + 1), gid, gw);
                for (int32_t j = 0; j < K; j++) moet_ecache_hint(&cpu(be)->ec, nl, gid[j], NULL, NULL);
                continue;
            }
            for (int32_t j = 0; j < K; j++) {
                int32_t best = 0;
                for (int32_t e = 1; e < E; e++) best = p[e] > p[best] ? e : best;
                moet_ecache_hint(&cpu(be)->ec, nl, best, NULL, NULL);
                p[best] = -INFINITY;
            }
        }
    }
}

/* ---- lifecycle ------------------------------------------------------------------------------------------------ */

static void cpu_destroy(moet_backend *be) {
    cpu_backend *c = cpu(be);
    if (!c) return;
    moet_ecache_free(&c->ec);
    moet_pool_free(c->pool);
    for (int t = 0; t < c->n_threads; t++) free(c->rowbuf[t]);
    free(c->rowbuf);
    free(c->xrot);
    free(c->mla_buf);
    free(c);
}

static const char *cpu_device_name(moet_backend *be) { return cpu(be)->desc; }
static void cpu_forget(moet_backend *be, const void *host) { (void)be; (void)host; }
static int cpu_status(moet_backend *be, char *err, size_t errlen) { (void)be; (void)err; (void)errlen; return 0; }

/* Batched decode's attention (backend.h): the per-row composition, each row on its own cache (the table is host
 * memory here, as all CPU backend memory is). */
static int cpu_attn_rows(moet_backend *be, float *q, float *k, const float *v, const float *q_norm, const float *k_norm,
                         float eps, const moet_rope *rp, const moet_kv_ref *rows, const moet_attn_args *a) {
    const int64_t dq = (int64_t)a->n_heads * a->head_dim, dk = (int64_t)a->n_kv * a->head_dim;
    for (int64_t r = 0; r < a->n_tok; r++) {
        moet_attn_args ar = *a;
        ar.q = q + r * dq;
        ar.out = a->out + r * dq;
        ar.pos = a->pos + r;
        ar.n_tok = 1;
        ar.kv = rows[r];
        cpu_attn_prep(be, q + r * dq, k + r * dk, v + r * dk, 1, a->n_heads, a->n_kv, a->head_dim, q_norm, k_norm, eps,
                      rp, a->pos + r, &rows[r]);
        cpu_attention(be, &ar);
    }
    return 0;
}

/* top-k: a sorted list of the k best keys a row, an element inserted where it beats the last (k <= 64, so the
 * shifts are cheap against the scan of the row) */
static void cpu_topk(moet_backend *be, const float *x, int64_t n, int64_t vocab, int32_t k, void *scratch, int32_t *ids,
                     float *vals, float *lz) {
    (void)be;
    uint64_t *best = scratch;
    for (int64_t r = 0; r < n; r++) {
        const float *row = x + r * vocab;
        if (lz) { /* the row's max, then sum exp(x - max) in double, in index order */
            float mx = row[0];
            for (int64_t i = 1; i < vocab; i++) mx = row[i] > mx ? row[i] : mx;
            double z = 0;
            for (int64_t i = 0; i < vocab; i++) z += exp((double)row[i] - mx);
            lz[r] = (float)log(z);
        }
        int32_t have = 0;
        for (int64_t i = 0; i < vocab; i++) {
            const uint64_t key = moet_topk_key(row[i], (uint32_t)i);
            if (have == k && key <= best[k - 1]) continue;
            int32_t j = have < k ? have++ : k - 1;
            while (j > 0 && best[j - 1] < key) { best[j] = best[j - 1]; j--; }
            best[j] = key;
        }
        for (int32_t i = 0; i < k; i++) {
            const uint32_t id = moet_topk_key_index(best[i]);
            ids[r * k + i] = (int32_t)id;
            vals[r * k + i] = row[id];
        }
    }
}

static size_t cpu_topk_scratch_bytes(moet_backend *be, int64_t n, int64_t vocab, int32_t k) {
    (void)be; (void)n; (void)vocab;
    return (size_t)(k > 0 ? k : 1) * sizeof(uint64_t);
}

/* Every expert is host memory here, so nothing moves; home PINNED runs the direct mode's protocol (a missing expert
 * computed where it lies, fetched after the step, nothing replayed) as the CUDA backend runs it with pinned homes. */
static int cpu_expert_cache(moet_backend *be, int64_t n_slots, int32_t home) {
    const char *pf = getenv("MOET_EXPERT_PREFETCH");
    cpu(be)->ec_prefetch = !(pf && pf[0] == '0');
    moet_ecache_free(&cpu(be)->ec);
    const int rc = moet_ecache_init(&cpu(be)->ec, n_slots);
    cpu(be)->ec.direct = home == MOET_EXPERT_HOME_PINNED;
    return rc;
}
static int64_t cpu_expert_cache_resolve(moet_backend *be) {
    moet_ecache *ec = &cpu(be)->ec;
    if (!ec->n_slots) return 0;
    if (ec->direct) {
        moet_ecache_settle(ec, NULL, NULL);
        return 0;
    }
    return moet_ecache_resolve(ec, NULL, NULL);
}
static void cpu_expert_cache_stats(moet_backend *be, int64_t out[5]) { moet_ecache_counts(&cpu(be)->ec, out); }

static const moet_backend_ops k_cpu_ops = {
    .name = "cpu",
    .destroy = cpu_destroy,
    .alloc = cpu_alloc,
    .release = cpu_release,
    .device_name = cpu_device_name,
    .status = cpu_status,
    .forget = cpu_forget,
    .copy = cpu_copy,
    .upload = cpu_copy,
    .download = cpu_copy,
    .fill_random = cpu_fill_random,
    .graph_run = cpu_graph_run,
    .graph_release = cpu_graph_release,
    .kv_store = cpu_kv_store,
    .get_rows = cpu_get_rows,
    .add = cpu_add,
    .mul_mat = cpu_mul_mat,
    .mul_mat_acc = cpu_mul_mat_acc,
    .norm_mul_mat = cpu_norm_mul_mat,
    .attn_prep = cpu_attn_prep,
    .rms_norm = cpu_rms_norm,
    .rope = cpu_rope,
    .attention = cpu_attention,
    .mla_prep = cpu_mla_prep,
    .heads_narrow = cpu_heads_narrow,
    .mla_attn = cpu_mla_attn,
    .attn_scratch_bytes = cpu_attn_scratch_bytes,
    .mlp = cpu_mlp,
    .moe = cpu_moe,
    .moe_scratch_bytes = cpu_moe_scratch_bytes,
    .attn_rows = cpu_attn_rows,
    .topk = cpu_topk,
    .topk_scratch_bytes = cpu_topk_scratch_bytes,
    .expert_cache = cpu_expert_cache,
    .expert_cache_resolve = cpu_expert_cache_resolve,
    .expert_cache_stats = cpu_expert_cache_stats,
};

moet_backend *moet_backend_cpu_create(int n_threads) {
    cpu_backend *c = calloc(1, sizeof(*c));
    if (!c) return NULL;
    c->base.ops = &k_cpu_ops;
    c->pool = moet_pool_create(n_threads);
    if (!c->pool) { free(c); return NULL; }
    c->n_threads = moet_pool_threads(c->pool);
    snprintf(c->desc, sizeof c->desc, "cpu, %d thread%s", c->n_threads, c->n_threads == 1 ? "" : "s");
    c->rowbuf = calloc((size_t)c->n_threads, sizeof(float *));
    if (!c->rowbuf) { cpu_destroy(&c->base); return NULL; }
    return &c->base;
}

int moet_backend_cpu_threads(const moet_backend *be) { return ((const cpu_backend *)be)->n_threads; }
