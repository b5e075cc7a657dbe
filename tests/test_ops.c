/*
 * test_ops.c — the op harness: each backend op on fresh random inputs against a float64 reference written here
 * from the op's definition, NMSE = ||out - ref||^2 / ||ref||^2 under a per-op tolerance, outputs poisoned with NaN
 * before every launch so an unwritten element fails. Today it runs the CPU backend; the CUDA backend joins the
 * same table.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/backend.h"
#include "quant/formats.h"
#include "quant/matq.h"
#include "quant/types.h"
#include "test_util.h"

static uint64_t g_rng;
static double urand(void) {
    g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(g_rng >> 11) / 9007199254740992.0;
}
static float gauss(void) { return (float)(sqrt(-2 * log(urand() + 1e-12)) * cos(6.283185307179586 * urand())); }
static void poison(float *p, size_t n) { for (size_t i = 0; i < n; i++) p[i] = NAN; }

static double nmse(const float *out, const double *ref, size_t n) {
    double e = 0, r = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)out[i] - ref[i];
        e += d * d;
        r += ref[i] * ref[i];
    }
    return isnan(e) ? INFINITY : e / (r > 0 ? r : 1);
}

static void report(const char *op, const char *variant, double v, double tol) {
    fprintf(stderr, "%-10s %-14s nmse %.3g (tol %.1g)\n", op, variant, v, tol);
    CHECK(v <= tol, "%s %s: nmse %.3g > %.1g", op, variant, v, tol);
}

/* Quantizes W (rows × cols) to a type and returns the packed buffer and the dequantized rows (original basis). */
static void *make_weight(int qf, const float *W, int64_t rows, int64_t cols, moet_weight *w, float *deq) {
    moet_matq_options o = moet_matq_default_options((moet_qformat)qf);
    o.seed = 11;
    moet_matq_info info;
    size_t rb = moet_type_row_bytes(moet_qformat_type((moet_qformat)qf), cols);
    void *blk = malloc(rb * (size_t)rows);
    REQUIRE(moet_matq_quantize(W, rows, cols, NULL, &o, deq, blk, &info, NULL) == 0, "quantize");
    memset(w, 0, sizeof(*w));
    w->data = blk;
    w->type = info.type;
    w->rows = rows;
    w->cols = cols;
    w->row_bytes = rb;
    w->qscale = info.qscale;
    w->qbeta = info.qbeta;
    w->rot_seed = info.rot_seed;
    w->rotated = info.rotated;
    return blk;
}

int main(void) {
    g_rng = (uint64_t)time(NULL) * 0x9e3779b97f4a7c15ull | 1;
    fprintf(stderr, "seed %llu\n", (unsigned long long)g_rng);
    moet_backend *be = moet_backend_cpu_create(2);
    REQUIRE(be, "cpu backend");
    const moet_backend_ops *op = be->ops;

    /* mul_mat on every weight type: the reference is the float64 product with the dequantized matrix, so the
     * tolerance measures the kernel (widening, rotation of x, accumulation), not the format's error. */
    const int64_t R = 96, C = 256, N = 5;
    float *W = malloc(sizeof(float) * R * C), *deq = malloc(sizeof(float) * R * C), *x = malloc(sizeof(float) * N * C),
          *y = malloc(sizeof(float) * N * R);
    double *ref = malloc(sizeof(double) * N * R);
    for (int64_t i = 0; i < R * C; i++) W[i] = gauss() * 0.05f;
    for (int64_t i = 0; i < N * C; i++) x[i] = gauss();
    const int qfs[] = {MOET_QF_BF16, MOET_QF_Q8_0, MOET_QF_MXFP4, MOET_QF_NVFP4, MOET_QF_INT2, MOET_QF_ASYM2,
                       MOET_QF_SYM2, MOET_QF_W2};
    for (size_t k = 0; k < sizeof qfs / sizeof qfs[0]; k++) {
        moet_weight w;
        void *blk = make_weight(qfs[k], W, R, C, &w, deq);
        for (int64_t t = 0; t < N; t++)
            for (int64_t r = 0; r < R; r++) {
                double s = 0;
                for (int64_t c = 0; c < C; c++) s += (double)deq[r * C + c] * x[t * C + c];
                ref[t * R + r] = s;
            }
        poison(y, (size_t)(N * R));
        op->mul_mat(be, &w, x, N, y);
        report("mul_mat", moet_qformat_name((moet_qformat)qfs[k]), nmse(y, ref, (size_t)(N * R)), w.rotated ? 1e-11 : 1e-12);
        free(blk);
    }
    { /* f32 and f16 weights directly */
        moet_weight w = {.data = W, .type = MOET_TYPE_F32, .rows = R, .cols = C, .row_bytes = C * 4, .qscale = 1};
        for (int64_t t = 0; t < N; t++)
            for (int64_t r = 0; r < R; r++) {
                double s = 0;
                for (int64_t c = 0; c < C; c++) s += (double)W[r * C + c] * x[t * C + c];
                ref[t * R + r] = s;
            }
        poison(y, (size_t)(N * R));
        op->mul_mat(be, &w, x, N, y);
        report("mul_mat", "f32", nmse(y, ref, (size_t)(N * R)), 1e-12);
    }

    /* rms_norm */
    {
        const int64_t D = 192, M = 7;
        float *a = malloc(sizeof(float) * M * D), *g = malloc(sizeof(float) * D), *o = malloc(sizeof(float) * M * D);
        double *rr = malloc(sizeof(double) * M * D);
        for (int64_t i = 0; i < M * D; i++) a[i] = gauss() * 3;
        for (int64_t i = 0; i < D; i++) g[i] = 1 + 0.3f * gauss();
        for (int64_t r = 0; r < M; r++) {
            double ss = 0;
            for (int64_t i = 0; i < D; i++) ss += (double)a[r * D + i] * a[r * D + i];
            double inv = 1 / sqrt(ss / D + 1e-6);
            for (int64_t i = 0; i < D; i++) rr[r * D + i] = g[i] * a[r * D + i] * inv;
        }
        poison(o, (size_t)(M * D));
        op->rms_norm(be, a, g, M, D, 1e-6f, o);
        report("rms_norm", "f32", nmse(o, rr, (size_t)(M * D)), 1e-13);
        free(a); free(g); free(o); free(rr);
    }
    /* attention (causal, GQA) against the textbook softmax(q k^T / sqrt(d)) v */
    {
        const int nh = 4, nkv = 2, hd = 32, pos0 = 9, T = 6, ctx = 32;
        float *q = malloc(sizeof(float) * T * nh * hd), *kc = malloc(sizeof(float) * ctx * nkv * hd),
              *vc = malloc(sizeof(float) * ctx * nkv * hd), *o = malloc(sizeof(float) * T * nh * hd);
        double *rr = malloc(sizeof(double) * T * nh * hd);
        for (int i = 0; i < T * nh * hd; i++) q[i] = gauss();
        for (int i = 0; i < ctx * nkv * hd; i++) { kc[i] = gauss(); vc[i] = gauss(); }
        for (int t = 0; t < T; t++)
            for (int h = 0; h < nh; h++) {
                int kh = h / (nh / nkv), nk = pos0 + t + 1;
                double sc[64], mx = -1e300, sum = 0;
                for (int j = 0; j < nk; j++) {
                    double s = 0;
                    for (int d = 0; d < hd; d++) s += (double)q[(t * nh + h) * hd + d] * kc[(j * nkv + kh) * hd + d];
                    sc[j] = s / sqrt((double)hd);
                    mx = fmax(mx, sc[j]);
                }
                for (int j = 0; j < nk; j++) { sc[j] = exp(sc[j] - mx); sum += sc[j]; }
                for (int d = 0; d < hd; d++) {
                    double acc = 0;
                    for (int j = 0; j < nk; j++) acc += sc[j] / sum * vc[(j * nkv + kh) * hd + d];
                    rr[(t * nh + h) * hd + d] = acc;
                }
            }
        void *scr = op->alloc(be, op->attn_scratch_bytes(be, ctx));
        moet_attn_args aa = {.q = q, .k_cache = kc, .v_cache = vc, .pos0 = pos0, .n_tok = T, .n_heads = nh,
                             .n_kv = nkv, .head_dim = hd, .n_ctx = ctx, .scale = 1.0f / sqrtf((float)hd), .out = o,
                             .scratch = scr};
        poison(o, (size_t)(T * nh * hd));
        op->attention(be, &aa);
        report("attention", "gqa causal", nmse(o, rr, (size_t)(T * nh * hd)), 1e-12);
        op->release(be, scr);
        free(q); free(kc); free(vc); free(o); free(rr);
    }
    /* moe: route (softmax, top-k, renormalise) + SwiGLU experts + weighted combine, on W2 experts */
    {
        const int E = 8, K = 3, H = 64, F = 32, T = 5;
        float *xr = malloc(sizeof(float) * T * H), *rw = malloc(sizeof(float) * E * H), *o = malloc(sizeof(float) * T * H);
        float *dq[3][8];
        void *blks[3][8];
        moet_weight gw[8], uw[8], dw[8];
        double *rr = calloc((size_t)(T * H), sizeof(double));
        for (int i = 0; i < T * H; i++) xr[i] = gauss();
        for (int i = 0; i < E * H; i++) rw[i] = gauss() * 0.3f;
        for (int e = 0; e < E; e++) {
            moet_weight *ws[3] = {&gw[e], &uw[e], &dw[e]};
            for (int k = 0; k < 3; k++) {
                int64_t rows = k == 2 ? H : F, cols = k == 2 ? F : H;
                float *m = malloc(sizeof(float) * rows * cols);
                for (int64_t i = 0; i < rows * cols; i++) m[i] = gauss() * 0.2f;
                dq[k][e] = malloc(sizeof(float) * rows * cols);
                blks[k][e] = make_weight(MOET_QF_W2, m, rows, cols, ws[k], dq[k][e]);
                free(m);
            }
        }
        for (int t = 0; t < T; t++) {
            double p[8], mx = -1e300, s = 0;
            for (int e = 0; e < E; e++) {
                double l = 0;
                for (int i = 0; i < H; i++) l += (double)rw[e * H + i] * xr[t * H + i];
                p[e] = l;
                mx = fmax(mx, l);
            }
            for (int e = 0; e < E; e++) { p[e] = exp(p[e] - mx); s += p[e]; }
            int used[8] = {0}, ids[3];
            double wsum = 0;
            for (int j = 0; j < K; j++) {
                int b = -1;
                for (int e = 0; e < E; e++) if (!used[e] && (b < 0 || p[e] > p[b])) b = e;
                used[b] = 1;
                ids[j] = b;
                wsum += p[b] / s;
            }
            for (int j = 0; j < K; j++) {
                int e = ids[j];
                double g[32];
                for (int f = 0; f < F; f++) {
                    double a = 0, u = 0;
                    for (int i = 0; i < H; i++) { a += (double)dq[0][e][f * H + i] * xr[t * H + i]; u += (double)dq[1][e][f * H + i] * xr[t * H + i]; }
                    g[f] = a / (1 + exp(-a)) * u;
                }
                for (int i = 0; i < H; i++) {
                    double d = 0;
                    for (int f = 0; f < F; f++) d += (double)dq[2][e][i * F + f] * g[f];
                    rr[t * H + i] += (p[e] / s / wsum) * d;
                }
            }
        }
        moet_weight router = {.data = rw, .type = MOET_TYPE_F32, .rows = E, .cols = H, .row_bytes = H * 4, .qscale = 1};
        int32_t tid[15];
        float tw[15];
        void *scr = op->alloc(be, op->moe_scratch_bytes(be, T, H, F, E, K));
        moet_moe_args ma = {.x = xr, .n_tok = T, .hidden = H, .ffn = F, .router = &router, .n_experts = E, .n_used = K,
                            .norm_topk = 1, .gate = gw, .up = uw, .down = dw, .topk_ids = tid, .topk_w = tw, .y = o,
                            .scratch = scr};
        poison(o, (size_t)(T * H));
        op->moe(be, &ma);
        report("moe", "w2 top-3/8", nmse(o, rr, (size_t)(T * H)), 1e-10);
        op->release(be, scr);
        for (int k = 0; k < 3; k++) for (int e = 0; e < E; e++) { free(dq[k][e]); free(blks[k][e]); }
        free(xr); free(rw); free(o); free(rr);
    }
    free(W); free(deq); free(x); free(y); free(ref);
    op->destroy(be);
    TEST_END();
}
