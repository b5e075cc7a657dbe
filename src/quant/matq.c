/* matq.c — see matq.h. */
#include "quant/matq.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "quant/formats.h"
#include "quant/types.h"

static const char *const k_names[MOET_QF_COUNT] = {"bf16", "q8_0", "mxfp4", "nvfp4", "int2", "asym2", "sym2", "w2",
                                                   "w2+nvfp4", "w2+w2"};
static const double k_bpw[MOET_QF_COUNT] = {16, 8.5, 4.25, 4.5, 2.25, 2.5, 2.25, 2.25, 6.75, 4.5};

const char *moet_qformat_name(moet_qformat f) { return (unsigned)f < MOET_QF_COUNT ? k_names[f] : "?"; }
double moet_qformat_bpw(moet_qformat f) { return (unsigned)f < MOET_QF_COUNT ? k_bpw[f] : 0; }
int moet_qformat_parse(const char *s) {
    for (int i = 0; i < MOET_QF_COUNT; i++)
        if (!strcmp(s, k_names[i])) return i;
    return -1;
}

moet_matq_options moet_matq_default_options(moet_qformat f) {
    moet_matq_options o = {.format = f, .rotate = 1, .gptq = 1, .search = 1, .beta = 0, .damp = 0.01f, .seed = 1};
    return o;
}

/* ---- rotation --------------------------------------------------------------------------------------------------- */

int64_t moet_hadamard_block(int64_t cols) {
    int64_t b = 1;
    while (b < 256 && cols % (b * 2) == 0) b *= 2;
    return b;
}

static double sign_of(uint64_t seed, int64_t i) {
    uint64_t z = seed * 0x9e3779b97f4a7c15ull + (uint64_t)i * 0xbf58476d1ce4e5b9ull + 0x94d049bb133111ebull;
    z ^= z >> 31; z *= 0xd6e8feb86659fd93ull; z ^= z >> 32;
    return (z & 1) ? -1.0 : 1.0;
}

static void fwht(double *v, int64_t n) {
    for (int64_t h = 1; h < n; h *= 2)
        for (int64_t i = 0; i < n; i += 2 * h)
            for (int64_t j = i; j < i + h; j++) {
                double a = v[j], b = v[j + h];
                v[j] = a + b;
                v[j + h] = a - b;
            }
}

/* R = blockdiag(D_k H_b / sqrt(b)); forward w -> w R (signs, then FWHT), inverse w -> w R^T (FWHT, then signs). */
void moet_rotate_row(double *w, int64_t cols, uint64_t seed, int inverse) {
    int64_t b = moet_hadamard_block(cols);
    double sc = 1.0 / sqrt((double)b);
    for (int64_t o = 0; o < cols; o += b) {
        if (!inverse) for (int64_t j = 0; j < b; j++) w[o + j] *= sign_of(seed, o + j);
        fwht(w + o, b);
        for (int64_t j = 0; j < b; j++) w[o + j] *= sc;
        if (inverse) for (int64_t j = 0; j < b; j++) w[o + j] *= sign_of(seed, o + j);
    }
}

void moet_rotate_row_f32(float *w, int64_t cols, uint64_t seed, int inverse) {
    double tmp[256];
    int64_t b = moet_hadamard_block(cols);
    double sc = 1.0 / sqrt((double)b);
    for (int64_t o = 0; o < cols; o += b) {
        for (int64_t j = 0; j < b; j++) tmp[j] = inverse ? w[o + j] : w[o + j] * sign_of(seed, o + j);
        fwht(tmp, b);
        for (int64_t j = 0; j < b; j++) {
            double v = tmp[j] * sc;
            w[o + j] = (float)(inverse ? v * sign_of(seed, o + j) : v);
        }
    }
}

/* ---- linear algebra for GPTQ ------------------------------------------------------------------------------------ */

/* In-place lower Cholesky of an n×n SPD matrix; returns -1 if not positive definite. */
static int chol_lower(double *A, int64_t n) {
    for (int64_t j = 0; j < n; j++) {
        double d = A[j * n + j];
        for (int64_t k = 0; k < j; k++) d -= A[j * n + k] * A[j * n + k];
        if (!(d > 0)) return -1;
        d = sqrt(d);
        A[j * n + j] = d;
        for (int64_t i = j + 1; i < n; i++) {
            double s = A[i * n + j];
            for (int64_t k = 0; k < j; k++) s -= A[i * n + k] * A[j * n + k];
            A[i * n + j] = s / d;
        }
        for (int64_t k = j + 1; k < n; k++) A[j * n + k] = 0;
    }
    return 0;
}

/* U upper with H^-1 = U^T U, from H (n×n). GPTQ's error feedback uses the rows of U. */
static int gptq_u(const double *H, int64_t n, double *U) {
    double *L = malloc((size_t)(n * n) * sizeof(double)), *Hi = malloc((size_t)(n * n) * sizeof(double));
    if (!L || !Hi) { free(L); free(Hi); return -1; }
    memcpy(L, H, (size_t)(n * n) * sizeof(double));
    int rc = chol_lower(L, n);
    if (!rc) {
        /* H^-1 = L^-T L^-1: solve column by column */
        double *col = malloc((size_t)n * sizeof(double));
        for (int64_t c = 0; c < n && col; c++) {
            for (int64_t i = 0; i < n; i++) { /* forward: L y = e_c */
                double s = i == c ? 1.0 : 0.0;
                for (int64_t k = 0; k < i; k++) s -= L[i * n + k] * col[k];
                col[i] = s / L[i * n + i];
            }
            for (int64_t i = n - 1; i >= 0; i--) { /* backward: L^T x = y */
                double s = col[i];
                for (int64_t k = i + 1; k < n; k++) s -= L[k * n + i] * col[k];
                col[i] = s / L[i * n + i];
            }
            for (int64_t i = 0; i < n; i++) Hi[i * n + c] = col[i];
        }
        if (!col) rc = -1;
        free(col);
    }
    if (!rc) {
        memcpy(L, Hi, (size_t)(n * n) * sizeof(double));
        rc = chol_lower(L, n); /* Hi = L L^T  =>  U = L^T satisfies Hi = U^T U */
        if (!rc)
            for (int64_t i = 0; i < n; i++)
                for (int64_t j = 0; j < n; j++) U[i * n + j] = j >= i ? L[j * n + i] : 0.0;
    }
    free(L);
    free(Hi);
    return rc;
}

/* ---- the roundtrip ---------------------------------------------------------------------------------------------- */

static void rtn_rows(const float *W, int64_t rows, int64_t cols, moet_qformat f, float *out, uint8_t *blocks,
                     moet_matq_info *info) {
    float amax = 0;
    for (int64_t i = 0; i < rows * cols; i++) amax = fmaxf(amax, fabsf(W[i]));
    float ts = moet_nvfp4_tensor_scale(amax);
    void *own = malloc((size_t)cols * 2 + 64);
    size_t rb = info ? moet_type_row_bytes(info->type, cols) : 0;
    if (info) info->qscale = f == MOET_QF_NVFP4 ? ts : f == MOET_QF_ASYM2 ? amax : 1.0f;
    for (int64_t r = 0; r < rows; r++) {
        const float *x = W + r * cols;
        float *y = out + r * cols;
        void *blk = blocks ? blocks + (size_t)r * rb : own;
        switch (f) {
        case MOET_QF_BF16:
            for (int64_t j = 0; j < cols; j++) y[j] = moet_bf16_to_f32(moet_f32_to_bf16(x[j]));
            break;
        case MOET_QF_Q8_0: moet_q8_0_quantize_row(x, blk, cols); moet_q8_0_dequantize_row(blk, y, cols); break;
        case MOET_QF_MXFP4: moet_mxfp4_quantize_row(x, blk, cols); moet_mxfp4_dequantize_row(blk, y, cols); break;
        case MOET_QF_NVFP4: moet_nvfp4_quantize_row(x, ts, blk, cols); moet_nvfp4_dequantize_row(blk, ts, y, cols); break;
        case MOET_QF_ASYM2: moet_asym2_quantize_row(x, amax, blk, cols); moet_asym2_dequantize_row(blk, amax, y, cols); break;
        default: break;
        }
    }
    free(own);
}

/* W2 / int2 / sym2 on the (rotated) rows. imp: cols importances. U: GPTQ factor or NULL. */
static double q2_rows(const double *Wr, int64_t rows, int64_t cols, const moet_q2_params *p, const float *imp,
                      const double *U, int search, double *deq, moet_block_q2 *blocks) {
    double err = 0;
    double *w = malloc((size_t)cols * sizeof(double));
    float xs[MOET_QK], lv[4];
    moet_q2_levels(p, lv);
    for (int64_t r = 0; r < rows; r++) {
        memcpy(w, Wr + r * cols, (size_t)cols * sizeof(double));
        for (int64_t g = 0; g < cols; g += MOET_QK) {
            for (int j = 0; j < MOET_QK; j++) xs[j] = (float)w[g + j];
            moet_block_q2 b;
            moet_q2_quantize_group(p, xs, imp ? imp + g : NULL, search, &b);
            float s = moet_q2_scale(p, b.sc);
            for (int j = 0; j < MOET_QK; j++) {
                int64_t c = g + j;
                /* with error feedback the code is re-chosen on the updated weight */
                uint8_t code = U ? moet_q2_nearest(lv, s, (float)w[c]) : (uint8_t)((b.qs[j / 4] >> (2 * (j % 4))) & 3);
                double q = (double)(lv[code] * s), e = w[c] - q;
                deq[r * cols + c] = q;
                if (blocks) {
                    moet_block_q2 *ob = &blocks[(r * cols + g) / MOET_QK];
                    if (j == 0) { ob->sc = b.sc; memset(ob->qs, 0, sizeof ob->qs); }
                    ob->qs[j / 4] |= (uint8_t)(code << (2 * (j % 4)));
                }
                err += (imp ? imp[c] : 1.0) * e * e;
                if (U) {
                    double f = e / U[c * cols + c];
                    const double *ur = U + c * cols;
                    for (int64_t k = c + 1; k < cols; k++) w[k] -= f * ur[k];
                }
            }
        }
    }
    free(w);
    return err;
}

static const int32_t k_types[MOET_QF_COUNT] = {MOET_TYPE_BF16, MOET_TYPE_Q8_0, MOET_TYPE_MXFP4, MOET_TYPE_NVFP4,
                                               MOET_TYPE_INT2, MOET_TYPE_ASYM2, MOET_TYPE_SYM2, MOET_TYPE_W2,
                                               MOET_TYPE_W2, MOET_TYPE_W2};
int32_t moet_qformat_type(moet_qformat f) { return (unsigned)f < MOET_QF_COUNT ? k_types[f] : -1; }

int moet_matq_roundtrip(const float *W, int64_t rows, int64_t cols, const double *H, const moet_matq_options *o,
                        float *out, moet_matq_stats *st) {
    return moet_matq_quantize(W, rows, cols, H, o, out, NULL, NULL, st);
}

int moet_matq_quantize(const float *W, int64_t rows, int64_t cols, const double *H, const moet_matq_options *o,
                       float *out, void *blocks_v, moet_matq_info *info, moet_matq_stats *st) {
    uint8_t *blocks = blocks_v;
    if (rows <= 0 || cols <= 0 || cols % MOET_QK) return -1;
    if (info) {
        memset(info, 0, sizeof(*info));
        info->type = moet_qformat_type(o->format);
        info->qscale = 1.0f;
    }
    double sw = 0;
    for (int64_t i = 0; i < rows * cols; i++) sw += (double)W[i] * W[i];
    float *tmp = NULL;
    const float *src = W;
    if (out == W) {
        if (!(tmp = malloc((size_t)(rows * cols) * sizeof(float)))) return -1;
        memcpy(tmp, W, (size_t)(rows * cols) * sizeof(float));
        src = tmp;
    }
    moet_matq_stats s = {0};
    if (o->format != MOET_QF_W2 && o->format != MOET_QF_INT2 && o->format != MOET_QF_SYM2) {
        rtn_rows(src, rows, cols, o->format, out, blocks, info);
        if (blocks && o->format == MOET_QF_BF16)
            for (int64_t i = 0; i < rows * cols; i++) ((uint16_t *)blocks)[i] = moet_f32_to_bf16(src[i]);
    } else {
        const int w2 = o->format == MOET_QF_W2;
        const int rot = w2 && o->rotate;
        double *Wr = malloc((size_t)(rows * cols) * sizeof(double)), *deq = malloc((size_t)(rows * cols) * sizeof(double));
        double *Hr = NULL, *U = NULL;
        float *imp = NULL;
        if (!Wr || !deq) { free(Wr); free(deq); free(tmp); return -1; }
        for (int64_t i = 0; i < rows * cols; i++) Wr[i] = src[i];
        if (rot) for (int64_t r = 0; r < rows; r++) moet_rotate_row(Wr + r * cols, cols, o->seed, 0);
        if (w2 && H) {
            /* H in the rotated basis: R^T H R, by rotating rows then columns (H symmetric) */
            Hr = malloc((size_t)(cols * cols) * sizeof(double));
            imp = malloc((size_t)cols * sizeof(float));
            memcpy(Hr, H, (size_t)(cols * cols) * sizeof(double));
            if (rot) {
                for (int64_t r = 0; r < cols; r++) moet_rotate_row(Hr + r * cols, cols, o->seed, 0);
                for (int64_t r = 0; r < cols; r++)
                    for (int64_t c = r + 1; c < cols; c++) {
                        double t = Hr[r * cols + c];
                        Hr[r * cols + c] = Hr[c * cols + r];
                        Hr[c * cols + r] = t;
                    }
                for (int64_t r = 0; r < cols; r++) moet_rotate_row(Hr + r * cols, cols, o->seed, 0);
            }
            double md = 0;
            for (int64_t j = 0; j < cols; j++) md += Hr[j * cols + j];
            md /= (double)cols;
            if (!(md > 0)) md = 1;
            for (int64_t j = 0; j < cols; j++) {
                if (!(Hr[j * cols + j] > 0)) Hr[j * cols + j] = md; /* a channel the calibration never saw */
                Hr[j * cols + j] += o->damp * md;
                imp[j] = (float)Hr[j * cols + j];
            }
            if (o->gptq) {
                U = malloc((size_t)(cols * cols) * sizeof(double));
                if (U && gptq_u(Hr, cols, U)) { free(U); U = NULL; MOET_LOGW("GPTQ: H not positive definite; RTN"); }
            }
        }
        float amax = 0;
        for (int64_t i = 0; i < rows * cols; i++) amax = fmaxf(amax, (float)fabs(Wr[i]));
        moet_q2_params p = {.kind = w2 ? MOET_Q2_W2 : o->format == MOET_QF_INT2 ? MOET_Q2_INT2 : MOET_Q2_SYM2,
                            .base = amax, .beta = o->beta};
        const int search = w2 && o->search;
        if (w2 && o->beta <= 0) { /* fit beta on the weighted error, without feedback (cheap) */
            /* every candidate is an f16 value (a change of < 2^-12 relative against the plain grid), so a tile of
             * levels {-1, -beta, beta, 1} is an exact f16 tensor-core operand (the CUDA backend's moe_grp.cu) */
            double best = INFINITY;
            float bb = moet_f16_round(0.33f);
            for (float b = 0.20f; b <= 0.50f; b += 0.02f) {
                p.beta = moet_f16_round(b);
                double e = q2_rows(Wr, rows, cols, &p, imp, NULL, search, deq, NULL);
                if (e < best) { best = e; bb = p.beta; }
            }
            p.beta = bb;
        }
        q2_rows(Wr, rows, cols, &p, imp, U, search, deq, (moet_block_q2 *)blocks);
        if (info) { info->qscale = p.base; info->qbeta = p.beta; info->rotated = rot; info->rot_seed = (uint32_t)o->seed; }
        if (rot) for (int64_t r = 0; r < rows; r++) moet_rotate_row(deq + r * cols, cols, o->seed, 1);
        for (int64_t i = 0; i < rows * cols; i++) out[i] = (float)deq[i];
        s.beta = p.beta;
        free(Wr); free(deq); free(Hr); free(U); free(imp);
    }
    double se = 0;
    for (int64_t i = 0; i < rows * cols; i++) { double d = (double)src[i] - out[i]; se += d * d; }
    s.err_w = sw > 0 ? se / sw : 0;
    if (st) *st = s;
    free(tmp);
    return 0;
}

int moet_matq_roundtrip_delta(const float *W, int64_t rows, int64_t cols, const double *H, const moet_matq_options *o,
                              float *out, float *out_delta, moet_matq_stats *st) {
    if (!moet_qformat_has_delta(o->format) || !out_delta || out == W) return -1;
    moet_matq_options bo = *o;
    bo.format = MOET_QF_W2;
    if (moet_matq_roundtrip(W, rows, cols, H, &bo, out, st)) return -1;
    float *res = malloc((size_t)(rows * cols) * sizeof(float));
    if (!res) return -1;
    for (int64_t i = 0; i < rows * cols; i++) res[i] = W[i] - out[i];
    moet_matq_options dopt = *o;
    dopt.format = o->format == MOET_QF_W2_NVFP4 ? MOET_QF_NVFP4 : MOET_QF_W2;
    dopt.seed = o->seed + 0x5bd1e995u; /* the second stage sees the residual in its own basis */
    moet_matq_stats ds;
    int rc = moet_matq_roundtrip(res, rows, cols, H, &dopt, res, &ds);
    if (!rc)
        for (int64_t i = 0; i < rows * cols; i++) out_delta[i] = out[i] + res[i];
    free(res);
    return rc;
}
