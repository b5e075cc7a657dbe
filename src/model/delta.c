/*
 * delta.c — writing and loading delta packs (see delta.h, docs/format.md).
 */
#include "model/delta.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/pool.h"
#include "core/progress.h"
#include "core/util.h"
#include "format/gguf.h"
#include "quant/matq.h"
#include "quant/types.h"

static const char *const k_mat[3] = {"gate_proj", "up_proj", "down_proj"};

static void delta_name(char *buf, size_t cap, int l, int64_t e, int k) {
    snprintf(buf, cap, "model.layers.%d.mlp.experts.%lld.%s.delta", l, (long long)e, k_mat[k]);
}

int moet_delta_default_path(const char *pack_path, char *out, size_t cap) {
    size_t n = strlen(pack_path);
    int r = n > 5 && !strcmp(pack_path + n - 5, ".gguf")
                ? snprintf(out, cap, "%.*s.delta.gguf", (int)(n - 5), pack_path)
                : snprintf(out, cap, "%s.delta.gguf", pack_path);
    return r > 0 && (size_t)r < cap ? 0 : -1;
}

/* ---- write ---------------------------------------------------------------------------------------------------- */

int moet_delta_begin(const moet_model *m, const char *path, const moet_delta_data *d, moet_gguf_writer **out,
                     size_t *tidx, char *err, size_t errlen) {
    const moet_hparams *hp = &m->hp;
    const int64_t E = hp->n_experts;
    moet_gguf_writer *w = moet_gguf_writer_create(path, 32);
    *out = NULL;
    if (!w) return moet_err(err, errlen, MOET_ENOMEM, "out of memory");
    moet_gguf_writer_kv_str(w, "general.architecture", "moet-delta", strlen("moet-delta"));
    moet_gguf_writer_kv_u32(w, "moet.format_version", MOET_DELTA_FORMAT_VERSION);
    moet_gguf_writer_kv_str(w, "moet.delta_format", "nvfp4", 5);
    moet_gguf_writer_kv_f32(w, "moet.delta_bpw", (float)moet_qformat_bpw(MOET_QF_NVFP4));
    moet_gguf_writer_kv_str(w, "moet.base_expert_format", "w2", 2);
    moet_gguf_writer_kv_str(w, "moet.base_pack_id", d->pack_id, strlen(d->pack_id));
    moet_gguf_writer_kv_i32(w, "moet.hp.n_layers", hp->n_layers);
    moet_gguf_writer_kv_i32(w, "moet.hp.n_experts", hp->n_experts);
    moet_gguf_writer_kv_i32(w, "moet.hp.hidden", hp->hidden);
    moet_gguf_writer_kv_i32(w, "moet.hp.expert_ffn", hp->expert_ffn);
    for (int64_t t = 0; t < d->n_tasks; t++) {
        const int l = (int)d->task_layer[t];
        const int64_t e = t % E;
        const moet_layer *L = &m->layers[l];
        const moet_weight *ws[3] = {&L->exp_gate[e], &L->exp_up[e], &L->exp_down[e]};
        for (int k = 0; k < 3; k++) {
            char nm[256];
            delta_name(nm, sizeof nm, l, e, k);
            const int64_t ne[2] = {ws[k]->cols, ws[k]->rows};
            tidx[t * 3 + k] = moet_gguf_writer_n_tensors(w);
            moet_gguf_writer_tensor(w, nm, MOET_TYPE_NVFP4, 2, ne, NULL,
                                    moet_type_row_bytes(MOET_TYPE_NVFP4, ws[k]->cols) * (uint64_t)ws[k]->rows,
                                    k == 0 ? 4096 : 32);
        }
        if (e == E - 1) { /* deferred too: written by finish, tensor tidx[t * 3 + 2] + 1 */
            char nm[256];
            snprintf(nm, sizeof nm, "model.layers.%d.mlp.experts.delta_qparams", l);
            const int64_t ne[2] = {4, 3 * E};
            moet_gguf_writer_tensor(w, nm, MOET_TYPE_F32, 2, ne, NULL, (uint64_t)(12 * E) * sizeof(float), 32);
        }
    }
    int rc = moet_gguf_writer_begin(w, err, errlen);
    if (rc) { moet_gguf_writer_abort(w); return rc; }
    *out = w;
    return MOET_OK;
}

int moet_delta_finish(moet_gguf_writer *w, const moet_delta_data *d, const size_t *tidx, int64_t n_experts, char *err,
                      size_t errlen) {
    for (int64_t t = n_experts - 1; t < d->n_tasks; t += n_experts)
        if (moet_gguf_writer_put(w, tidx[t * 3 + 2] + 1, d->qparams + (t - (n_experts - 1)) * 12)) {
            moet_gguf_writer_abort(w);
            return moet_err(err, errlen, MOET_EIO, "writing the delta pack failed (disk full?)");
        }
    return moet_gguf_writer_finish(w, err, errlen);
}

/* ---- load ----------------------------------------------------------------------------------------------------- */

/* Why no materialisation: the "on" expert is base + residual, and a backend multiplies both as they are stored (W2
 * blocks and NVFP4 blocks, each with its own rotation flag: backend.h's dgate/dup/ddown), so the delta costs its 4.5 bpw in
 * memory, mapped from the file, instead of the 32 of an f32 copy of every expert (116 GB at the qwen3-30b-a3b
 * shape). The pack stays mapped for the model's life (moet_model.delta_pack). */
int moet_delta_load(moet_model *m, const char *path, int n_threads, char *err, size_t errlen) {
    const moet_hparams *hp = &m->hp;
    const int64_t E = hp->n_experts;
    if (!m->pack) return moet_err(err, errlen, MOET_EINVAL, "%s: a delta pack applies to a moet pack, not a checkpoint", path);
    moet_gguf g;
    int rc = moet_gguf_open(path, &g, err, errlen);
    if (rc) return rc;
    char *s = NULL, *base_id = NULL, *ef = NULL;
    int64_t v;
    struct {
        const moet_gguf_tensor **dt; /* [task*3+k] the delta matrices, found and checked once */
        const float **qp;            /* [task] the expert's 3 x 4 delta qparams */
    } x = {0};
    int64_t n_tasks = 0;
    (void)n_threads; /* nothing left to compute at load */
    if (moet_gguf_get_i64(&g, "moet.format_version", &v) || v != MOET_DELTA_FORMAT_VERSION ||
        moet_gguf_get_str(&g, "general.architecture", &s) || strcmp(s, "moet-delta")) {
        rc = moet_err(err, errlen, MOET_EFORMAT, "%s: not a moet delta pack of format version %d", path, MOET_DELTA_FORMAT_VERSION);
        goto out;
    }
    free(s);
    s = NULL;
    if (moet_gguf_get_str(&g, "moet.delta_format", &s) || strcmp(s, "nvfp4")) {
        rc = moet_err(err, errlen, MOET_EUNSUP, "%s: delta format '%s' (supported: nvfp4)", path, s ? s : "missing");
        goto out;
    }
    if (moet_gguf_get_str(m->pack, "moet.expert_format", &ef) || strcmp(ef, "w2")) {
        rc = moet_err(err, errlen, MOET_EINVAL, "%s: the base pack's experts are %s, a delta needs w2", path, ef ? ef : "of no format");
        goto out;
    }
    free(s);
    s = NULL;
    if (moet_gguf_get_str(&g, "moet.base_pack_id", &s) ||
        moet_gguf_get_str(m->pack, "moet.pack_id", &base_id) || strcmp(s, base_id)) {
        rc = moet_err(err, errlen, MOET_EINVAL, "%s: written for another pack (base id %s, this pack's %s)", path,
                      s ? s : "missing", base_id ? base_id : "missing");
        goto out;
    }
    static const char *const hk[4] = {"moet.hp.n_layers", "moet.hp.n_experts", "moet.hp.hidden", "moet.hp.expert_ffn"};
    const int32_t hv[4] = {hp->n_layers, hp->n_experts, hp->hidden, hp->expert_ffn};
    for (int i = 0; i < 4; i++)
        if (moet_gguf_get_i64(&g, hk[i], &v) || v != hv[i]) {
            rc = moet_err(err, errlen, MOET_EFORMAT, "%s: %s does not match the pack's %d", path, hk[i], hv[i]);
            goto out;
        }
    for (int l = 0; l < hp->n_layers; l++) n_tasks += hp->layer_moe[l] ? E : 0;
    if (!(x.dt = calloc((size_t)n_tasks * 3 + 1, sizeof(*x.dt))) || !(x.qp = calloc((size_t)n_tasks + 1, sizeof(*x.qp)))) {
        rc = moet_err(err, errlen, MOET_ENOMEM, "out of memory");
        goto out;
    }
    /* every tensor present, typed and shaped as its base matrix; every qparam sane */
    for (int l = 0, t = 0; l < hp->n_layers; l++) {
        if (!hp->layer_moe[l]) continue;
        char nm[256];
        snprintf(nm, sizeof nm, "model.layers.%d.mlp.experts.delta_qparams", l);
        const moet_gguf_tensor *qt = moet_gguf_find_tensor(&g, nm);
        if (!qt || qt->type != MOET_TYPE_F32 || qt->n_dims != 2 || qt->ne[0] != 4 || qt->ne[1] != 3 * E) {
            rc = moet_err(err, errlen, MOET_EFORMAT, "%s: %s missing or of the wrong shape", path, nm);
            goto out;
        }
        const float *qp = (const float *)qt->data;
        const moet_layer *L = &m->layers[l];
        for (int64_t e = 0; e < E; e++, t++) {
            x.qp[t] = qp + e * 12;
            const moet_weight *ws[3] = {&L->exp_gate[e], &L->exp_up[e], &L->exp_down[e]};
            for (int k = 0; k < 3; k++) {
                delta_name(nm, sizeof nm, l, e, k);
                const moet_gguf_tensor *dt = moet_gguf_find_tensor(&g, nm);
                const float *q = qp + (e * 3 + k) * 4;
                if (!dt || dt->type != MOET_TYPE_NVFP4 || dt->n_dims != 2 || dt->ne[0] != ws[k]->cols || dt->ne[1] != ws[k]->rows) {
                    rc = moet_err(err, errlen, MOET_EFORMAT, "%s: %s missing or not an NVFP4 [%lld x %lld] matrix", path, nm,
                                  (long long)ws[k]->rows, (long long)ws[k]->cols);
                    goto out;
                }
                if (!(q[0] > 0) || q[0] > 1e30f || q[2] < 0 || q[2] > 16777216.0f || (q[3] != 0 && q[3] != 1) ||
                    (q[3] != 0 && ws[k]->cols % 32)) {
                    rc = moet_err(err, errlen, MOET_EFORMAT, "%s: bad delta qparams for layer %d expert %lld", path, l, (long long)e);
                    goto out;
                }
                x.dt[t * 3 + k] = dt;
            }
        }
    }
    if (moet_model_dexp_reset(m, 0)) { rc = moet_err(err, errlen, MOET_ENOMEM, "out of memory"); goto out; }
    for (int l = 0, t = 0; l < hp->n_layers; l++) {
        if (!hp->layer_moe[l]) continue;
        moet_layer *L = &m->layers[l];
        if (!(L->dres_gate = calloc((size_t)E * 3, sizeof(moet_weight)))) {
            moet_model_dexp_reset(m, 0);
            rc = moet_err(err, errlen, MOET_ENOMEM, "out of memory");
            goto out;
        }
        L->dres_up = L->dres_gate + E;
        L->dres_down = L->dres_up + E;
        for (int64_t e = 0; e < E; e++, t++) {
            const moet_weight *ws[3] = {&L->exp_gate[e], &L->exp_up[e], &L->exp_down[e]};
            moet_weight *dw[3] = {&L->dres_gate[e], &L->dres_up[e], &L->dres_down[e]};
            for (int k = 0; k < 3; k++) {
                const float *q = x.qp[t] + k * 4;
                *dw[k] = (moet_weight){.data = x.dt[t * 3 + k]->data, .type = MOET_TYPE_NVFP4, .rows = ws[k]->rows,
                                       .cols = ws[k]->cols, .row_bytes = moet_type_row_bytes(MOET_TYPE_NVFP4, ws[k]->cols),
                                       .qscale = q[0], .qbeta = q[1], .rot_seed = (uint32_t)q[2], .rotated = (int32_t)q[3]};
            }
        }
    }
    if (m->delta_pack) { moet_gguf_close(m->delta_pack); free(m->delta_pack); m->delta_pack = NULL; } /* a reload */
    if (!(m->delta_pack = malloc(sizeof *m->delta_pack))) {
        moet_model_dexp_reset(m, 0);
        rc = moet_err(err, errlen, MOET_ENOMEM, "out of memory");
        goto out;
    }
    *m->delta_pack = g; /* the mapping moves to the model: the residuals point into it */
    memset(&g, 0, sizeof g);
    MOET_LOGI("delta %s: %lld experts, NVFP4 residuals beside the base (%.1f MiB mapped)", path, (long long)n_tasks,
              (double)m->delta_pack->map.size / (1024.0 * 1024.0));
out:
    free(x.dt);
    free(x.qp);
    free(s);
    free(base_id);
    free(ef);
    moet_gguf_close(&g);
    return rc;
}
