/* calib.c — see calib.h. */
#include "quant/calib.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/progress.h"
#include "core/util.h"
#include "model/model.h"
#include "runtime/session_int.h"

moet_calib *moet_calib_create(const moet_model *m) {
    const moet_hparams *hp = &m->hp;
    moet_calib *c = calloc(1, sizeof(*c));
    if (!c) return NULL;
    c->n_layers = hp->n_layers;
    c->n_experts = hp->n_experts;
    c->hidden = hp->hidden;
    c->ffn = hp->expert_ffn;
    c->h_in = calloc((size_t)hp->n_layers, sizeof(double *));
    c->h_down = calloc((size_t)hp->n_layers, sizeof(double *));
    c->count = calloc((size_t)hp->n_layers, sizeof(int64_t *));
    if (!c->h_in || !c->h_down || !c->count) { moet_calib_free(c); return NULL; }
    const size_t E = (size_t)hp->n_experts, H = (size_t)hp->hidden, F = (size_t)hp->expert_ffn;
    for (int l = 0; l < hp->n_layers; l++) {
        if (!hp->layer_moe[l]) continue;
        c->h_in[l] = calloc(E * H * H, sizeof(double));
        c->h_down[l] = calloc(E * F * F, sizeof(double));
        c->count[l] = calloc(E, sizeof(int64_t));
        if (!c->h_in[l] || !c->h_down[l] || !c->count[l]) { moet_calib_free(c); return NULL; }
    }
    return c;
}

void moet_calib_free(moet_calib *c) {
    if (!c) return;
    for (int l = 0; l < c->n_layers; l++) {
        if (c->h_in) free(c->h_in[l]);
        if (c->h_down) free(c->h_down[l]);
        if (c->count) free(c->count[l]);
    }
    free(c->h_in);
    free(c->h_down);
    free(c->count);
    free(c);
}

double *moet_calib_hessian(const moet_calib *c, int l, int64_t e, int which) {
    if (!c || l < 0 || l >= c->n_layers || !c->count[l] || c->count[l][e] <= 0) return NULL;
    const int64_t dim = which ? c->ffn : c->hidden, n = c->count[l][e];
    const double *acc = (which ? c->h_down[l] : c->h_in[l]) + e * dim * dim;
    double *h = malloc((size_t)(dim * dim) * sizeof(double));
    if (!h) return NULL;
    /* the accumulator holds the upper triangle (see cpu_backend.c accum_xxt) */
    for (int64_t i = 0; i < dim; i++)
        for (int64_t j = i; j < dim; j++) h[i * dim + j] = h[j * dim + i] = acc[i * dim + j] / (double)n;
    return h;
}

int moet_calib_run(const moet_model *m, moet_calib *c, const char *text, size_t len, int32_t ctx, int64_t max_tokens,
                   char *err, size_t errlen) {
    int32_t *ids;
    size_t n;
    int rc = moet_tokenizer_encode(m->tok, text, len, &ids, &n, err, errlen);
    if (rc) return rc;
    moet_session_options so = moet_session_default_options();
    so.n_ctx = ctx;
    so.n_batch = ctx < 512 ? ctx : 512;
    moet_session *s;
    /* The statistics accumulate in host memory inside the CPU backend's MoE op: calibration always runs there. */
    moet_backend *cpu = NULL;
    if (strcmp(m->be->ops->name, "cpu") != 0 && !(cpu = moet_backend_cpu_create(0))) {
        free(ids);
        return moet_err(err, errlen, MOET_ENOMEM, "cannot create the CPU backend for calibration");
    }
    if ((rc = moet_session_create_on(m, cpu, &so, &s, err, errlen))) {
        free(ids);
        if (cpu) cpu->ops->destroy(cpu);
        return rc;
    }
    moet_session_set_calib(s, c);
    size_t n_win = n / (size_t)ctx;
    if (max_tokens > 0 && (int64_t)n_win * ctx > max_tokens) n_win = (size_t)(max_tokens / ctx);
    if (n_win == 0) n_win = n ? 1 : 0;
    moet_progress prog;
    moet_progress_init(&prog, "calibrating", "tokens", (int64_t)((size_t)n_win * ctx < n ? (size_t)n_win * ctx : n));
    for (size_t w = 0; w < n_win && !rc; w++) {
        int32_t cnt = (int32_t)((size_t)ctx < n - w * ctx ? (size_t)ctx : n - w * ctx);
        moet_session_truncate(s, 0, NULL, 0);
        rc = moet_session_eval(s, ids + w * (size_t)ctx, cnt, MOET_LOGITS_LAST, err, errlen);
        c->tokens += cnt;
        moet_progress_add(&prog, cnt);
    }
    moet_progress_end(&prog);
    moet_session_free(s);
    if (cpu) cpu->ops->destroy(cpu);
    free(ids);
    return rc;
}
