/* requant.c — see requant.h. One task per (layer, expert): three matrices, quantized independently in parallel. */
#include "quant/requant.h"

#include "quant/formats.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/pool.h"
#include "core/progress.h"
#include "core/util.h"
#include "model/model.h"
#include "quant/types.h"

typedef struct {
    moet_model *m;
    const moet_matq_options *o;
    const moet_calib *c;
    float **bufs;         /* [task*3 + k] new f32 weights */
    float **dbufs;        /* base + delta, delta formats only */
    double *num, *den, *beta; /* per task */
    int64_t *task_layer;
    int64_t n_tasks;
    int failed;
    moet_progress prog;
    double t0;
} rq_ctx;

void moet_weight_row_f32(const moet_weight *w, int64_t r, float *dst) {
    const uint8_t *src = (const uint8_t *)w->data + (size_t)r * w->row_bytes;
    if (w->type == MOET_TYPE_F8_E4M3) {
        const float *s = w->bscale + (r / 128) * w->bscale_ld;
        for (int64_t c = 0; c < w->cols; c++) dst[c] = moet_e4m3_to_f32(src[c]) * s[c / 128];
        return;
    }
    moet_type_row_to_f32_p(w->type, src, dst, w->cols, w->qscale, w->qbeta);
}

float *moet_weight_widen(const moet_weight *w) {
    float *f = malloc((size_t)(w->rows * w->cols) * sizeof(float) + 1);
    if (!f) return NULL;
    for (int64_t r = 0; r < w->rows; r++) moet_weight_row_f32(w, r, f + r * w->cols);
    return f;
}

static void rq_task(void *vctx, int64_t b, int64_t e, int tid) {
    (void)tid;
    rq_ctx *x = vctx;
    const moet_hparams *hp = &x->m->hp;
    const int64_t E = hp->n_experts;
    for (int64_t t = b; t < e; t++) {
        int64_t l = x->task_layer[t], ex = t % E;
        moet_layer *L = &x->m->layers[l];
        moet_weight *ws[3] = {&L->exp_gate[ex], &L->exp_up[ex], &L->exp_down[ex]};
        double *hin = moet_calib_hessian(x->c, (int)l, ex, 0), *hdn = moet_calib_hessian(x->c, (int)l, ex, 1);
        for (int k = 0; k < 3; k++) {
            const moet_weight *w = ws[k];
            float *src = moet_weight_widen(w);
            float *dst = malloc((size_t)(w->rows * w->cols) * sizeof(float));
            if (!src || !dst) { free(src); free(dst); x->failed = 1; continue; }
            moet_matq_options o = *x->o;
            o.seed = moet_expert_rot_seed((int)l, k);
            moet_matq_stats st;
            const double *h = k == 2 ? hdn : hin;
            if (moet_qformat_has_delta(o.format)) {
                float *dd = malloc((size_t)(w->rows * w->cols) * sizeof(float));
                if (!dd || moet_matq_roundtrip_delta(src, w->rows, w->cols, h, &o, dst, dd, &st)) x->failed = 1;
                x->dbufs[t * 3 + k] = dd;
            } else if (moet_matq_roundtrip(src, w->rows, w->cols, h, &o, dst, &st)) {
                x->failed = 1;
            }
            double s2 = 0;
            for (int64_t i = 0; i < w->rows * w->cols; i++) s2 += (double)src[i] * src[i];
            x->num[t] += st.err_w * s2;
            x->den[t] += s2;
            x->beta[t] += st.beta / 3.0;
            x->bufs[t * 3 + k] = dst;
            free(src);
        }
        free(hin);
        free(hdn);
        moet_progress_add(&x->prog, 1);
    }
}

int moet_model_requant_experts(moet_model *m, const moet_matq_options *o, const moet_calib *c, int n_threads,
                               moet_requant_stats *st, char *err, size_t errlen) {
    const moet_hparams *hp = &m->hp;
    const int64_t E = hp->n_experts;
    int64_t n_moe = 0;
    for (int l = 0; l < hp->n_layers; l++) n_moe += hp->layer_moe[l];
    if (n_moe == 0 || E == 0) return moet_err(err, errlen, MOET_EINVAL, "the model has no routed experts");
    if (hp->hidden % 32 || hp->expert_ffn % 32)
        return moet_err(err, errlen, MOET_EUNSUP, "expert input dims %d/%d are not multiples of 32", hp->hidden,
                        hp->expert_ffn);
    rq_ctx x = {.m = m, .o = o, .c = c, .n_tasks = n_moe * E, .t0 = moet_time_s()};
    char what[64];
    snprintf(what, sizeof what, "quantizing experts to %s", moet_qformat_name(o->format));
    moet_progress_init(&x.prog, what, "experts", x.n_tasks);
    x.bufs = calloc((size_t)x.n_tasks * 3, sizeof(float *));
    x.dbufs = calloc((size_t)x.n_tasks * 3, sizeof(float *));
    x.num = calloc((size_t)x.n_tasks, sizeof(double));
    x.den = calloc((size_t)x.n_tasks, sizeof(double));
    x.beta = calloc((size_t)x.n_tasks, sizeof(double));
    x.task_layer = calloc((size_t)x.n_tasks, sizeof(int64_t));
    int rc = MOET_OK;
    if (!x.bufs || !x.dbufs || !x.num || !x.den || !x.beta || !x.task_layer) { rc = moet_err(err, errlen, MOET_ENOMEM, "out of memory"); goto out; }
    for (int l = 0, t = 0; l < hp->n_layers; l++)
        if (hp->layer_moe[l])
            for (int64_t e = 0; e < E; e++) x.task_layer[t++] = l;
    moet_pool *pool = moet_pool_create(n_threads);
    moet_pool_for(pool, x.n_tasks, rq_task, &x);
    moet_pool_free(pool);
    moet_progress_end(&x.prog);
    if (x.failed) { rc = moet_err(err, errlen, MOET_ENOMEM, "quantization failed (out of memory)"); goto out; }
    /* Install the new weights (ownership to the model). */
    const int delta = moet_qformat_has_delta(o->format);
    /* with a delta format, fresh dexp arrays; without, none: a delta loaded with the old experts (a delta pack)
     * does not belong to the new ones */
    if (moet_model_f32_reserve(m, (size_t)x.n_tasks * 3 * (delta ? 2 : 1)) || moet_model_dexp_reset(m, delta)) {
        rc = moet_err(err, errlen, MOET_ENOMEM, "out of memory");
        goto out;
    }
    double num = 0, den = 0, beta = 0;
    for (int64_t t = 0; t < x.n_tasks; t++) {
        moet_layer *L = &m->layers[x.task_layer[t]];
        int64_t e = t % E;
        moet_weight *ws[3] = {&L->exp_gate[e], &L->exp_up[e], &L->exp_down[e]};
        for (int k = 0; k < 3; k++) {
            ws[k]->data = x.bufs[t * 3 + k];
            ws[k]->type = MOET_TYPE_F32;
            ws[k]->row_bytes = (size_t)ws[k]->cols * sizeof(float);
            m->f32_bufs[m->n_f32_bufs++] = x.bufs[t * 3 + k];
            x.bufs[t * 3 + k] = NULL;
            if (delta) {
                moet_weight *dw = k == 0 ? &L->dexp_gate[e] : k == 1 ? &L->dexp_up[e] : &L->dexp_down[e];
                *dw = *ws[k];
                dw->data = x.dbufs[t * 3 + k];
                m->f32_bufs[m->n_f32_bufs++] = x.dbufs[t * 3 + k];
                x.dbufs[t * 3 + k] = NULL;
            }
        }
        num += x.num[t];
        den += x.den[t];
        beta += x.beta[t];
    }
    if (st) {
        st->rel_err = den > 0 ? num / den : 0;
        st->mean_beta = beta / (double)x.n_tasks;
        st->n_matrices = x.n_tasks * 3;
        st->seconds = moet_time_s() - x.t0;
    }
out:
    if (x.bufs) for (int64_t i = 0; i < x.n_tasks * 3; i++) free(x.bufs[i]);
    if (x.dbufs) for (int64_t i = 0; i < x.n_tasks * 3; i++) free(x.dbufs[i]);
    free(x.bufs);
    free(x.dbufs); free(x.num); free(x.den); free(x.beta); free(x.task_layer);
    return rc;
}
