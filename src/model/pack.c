/*
 * pack.c — writing and loading moet packs (see pack.h, docs/format.md).
 */
#include "model/pack.h"

#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/pool.h"
#include "core/progress.h"
#include "core/util.h"
#include "model/delta.h"
#include "model/rope.h"
#include "quant/formats.h"
#include "quant/requant.h"
#include "quant/types.h"

/* The int32 hyperparameters, by key. Every pack stores all of them. */
static const struct { const char *key; size_t off; } k_hp_i32[] = {
#define F(name) {"moet.hp." #name, offsetof(moet_hparams, name)}
    F(vocab), F(hidden), F(n_layers), F(n_heads), F(n_kv_heads), F(head_dim), F(dense_ffn), F(expert_ffn),
    F(n_experts), F(n_experts_used), F(norm_topk), F(router_scoring), F(rope_dim), F(max_pos), F(tie_embeddings),
    F(attn_bias), F(qk_norm), F(bos_id),
#undef F
};

/* Written since the sigmoid router and shared experts (GLM-4.5); a pack without them has their defaults. */
static const struct { const char *key; size_t off; int32_t def, lo, hi; } k_hp_i32_opt[] = {
    {"moet.hp.n_group", offsetof(moet_hparams, n_group), 1, 1, 32},
    {"moet.hp.topk_group", offsetof(moet_hparams, topk_group), 1, 1, 32},
    {"moet.hp.shared_ffn", offsetof(moet_hparams, shared_ffn), 0, 0, 1 << 20},
    /* since YaRN and MLA (DeepSeek-V3) */
    {"moet.hp.rope_type", offsetof(moet_hparams, rope_type), MOET_ROPE_DEFAULT, MOET_ROPE_DEFAULT, MOET_ROPE_YARN},
    {"moet.hp.rope_orig_max_pos", offsetof(moet_hparams, rope_orig_max_pos), 0, 0, 1 << 24},
    {"moet.hp.rope_truncate", offsetof(moet_hparams, rope_truncate), 1, 0, 1},
    {"moet.hp.q_lora_rank", offsetof(moet_hparams, q_lora_rank), 0, 0, 1 << 16},
    {"moet.hp.kv_lora_rank", offsetof(moet_hparams, kv_lora_rank), 0, 0, 1 << 16},
    {"moet.hp.qk_nope_dim", offsetof(moet_hparams, qk_nope_dim), 0, 0, 1024},
    {"moet.hp.v_head_dim", offsetof(moet_hparams, v_head_dim), 0, 0, 1024},
    {"moet.hp.rope_interleave", offsetof(moet_hparams, rope_interleave), 0, 0, 1},
    /* since gpt-oss */
    {"moet.hp.sliding_window", offsetof(moet_hparams, sliding_window), 0, 0, 1 << 24},
};

/* Optional f32 hyperparameters (written since YaRN and MLA; older packs take the defaults). */
static const struct { const char *key; size_t off; float def, lo, hi; } k_hp_f32_opt[] = {
    {"moet.hp.rope_factor", offsetof(moet_hparams, rope_factor), 0.0f, 0.0f, 1e6f},
    {"moet.hp.rope_beta_fast", offsetof(moet_hparams, rope_beta_fast), 32.0f, 0.0f, 1e6f},
    {"moet.hp.rope_beta_slow", offsetof(moet_hparams, rope_beta_slow), 1.0f, 0.0f, 1e6f},
    {"moet.hp.rope_attn_factor", offsetof(moet_hparams, rope_attn_factor), 1.0f, 0.0f, 1e6f},
    {"moet.hp.attn_scale", offsetof(moet_hparams, attn_scale), 0.0f, 0.0f, 1e6f},
    {"moet.hp.mla_eps", offsetof(moet_hparams, mla_eps), 1e-6f, 0.0f, 1.0f},
    {"moet.hp.swiglu_limit", offsetof(moet_hparams, swiglu_limit), 0.0f, 0.0f, 1e6f},
};

static const char *matrix_name(char *buf, size_t cap, int l, int64_t e, int k) {
    static const char *const kn[3] = {"gate_proj", "up_proj", "down_proj"};
    snprintf(buf, cap, "model.layers.%d.mlp.experts.%lld.%s.weight", l, (long long)e, kn[k]);
    return buf;
}

/* ---- write ---------------------------------------------------------------------------------------------------- */

static int cmp_uptr(const void *a, const void *b) {
    const uintptr_t x = *(const uintptr_t *)a, y = *(const uintptr_t *)b;
    return x < y ? -1 : x > y;
}

/* Whether one of the n sorted addresses s lies in [p, p + len). */
static int holds_expert(const uintptr_t *s, size_t n, uintptr_t p, uint64_t len) {
    size_t lo = 0, hi = n; /* the first s[i] >= p */
    while (lo < hi) {
        const size_t mid = lo + (hi - lo) / 2;
        if (s[mid] < p) lo = mid + 1; else hi = mid;
    }
    return lo < n && s[lo] - p < len;
}

typedef struct {
    const moet_model *m;
    const moet_pack_options *o;
    int64_t *task_layer;
    int64_t n_tasks;
    moet_gguf_writer *w; /* the pack: each expert matrix is written as soon as it is quantized (none held back) */
    size_t *tidx;        /* [task*3+k]: its tensor's index in w */
    float *qparams;      /* [task*3+k][4] */
    int failed;
    moet_progress prog;
    uint8_t **dense_bufs;  /* Q8_0 copies of dense projections (--dense q8_0), alive until the file is written */
    size_t n_dense;
    int delta;           /* w2+nvfp4: also the NVFP4 residual of each matrix */
    moet_gguf_writer *dw; /* the delta pack, streamed the same way */
    size_t *dtidx;        /* [task*3+k]: its residual's tensor in dw */
    float *dqparams;      /* [task*3+k][4] */
} pw_ctx;

/* --dense q8_0 converts the linear projections: attention, dense MLP, lm_head. Embeddings stay as stored (a row
 * gather), and so do the router (its logits pick the experts) and every vector. */
static int is_dense_projection(const moet_st_tensor *t) {
    size_t n = strlen(t->name);
    int proj = n > 12 && !strcmp(t->name + n - 12, "_proj.weight");
    return t->ndim == 2 && t->shape[1] % 32 == 0 && (proj || !strcmp(t->name, "lm_head.weight"));
}

/* An FP8 checkpoint's dense matrix (e4m3 times its 128 x 128 block scales, <name>_scale_inv) as BF16 rows (rounded to
 * nearest even: a pack holds no FP8), or as Q8_0 with q8; NULL when its scales are missing or malformed (binding
 * checked them already) or out of memory. */
static uint8_t *f8_dense(const moet_model *m, const moet_st_tensor *t, int q8, size_t *nbytes) {
    char sn[512];
    snprintf(sn, sizeof sn, "%s_scale_inv", t->name);
    const moet_st_tensor *s = moet_st_find(&m->st, sn);
    if (t->ndim != 2 || !s || s->dtype != MOET_ST_F32 || s->ndim != 2 || s->shape[0] != (t->shape[0] + 127) / 128 ||
        s->shape[1] != (t->shape[1] + 127) / 128 || (q8 && t->shape[1] % 32))
        return NULL;
    const int64_t rows = t->shape[0], cols = t->shape[1];
    const size_t rb = q8 ? moet_type_row_bytes(MOET_TYPE_Q8_0, cols) : (size_t)cols * 2;
    uint8_t *out = malloc(rb * (size_t)rows + 1);
    float *row = malloc((size_t)cols * sizeof(float));
    if (!out || !row) { free(out); free(row); return NULL; }
    for (int64_t r = 0; r < rows; r++) {
        const float *sc = (const float *)s->data + (r / 128) * s->shape[1];
        for (int64_t c = 0; c < cols; c++) row[c] = moet_e4m3_to_f32(t->data[(size_t)r * (size_t)cols + (size_t)c]) * sc[c / 128];
        if (q8) {
            moet_q8_0_quantize_row(row, (moet_block_q8_0 *)(out + (size_t)r * rb), cols);
        } else {
            for (int64_t c = 0; c < cols; c++) {
                const uint16_t h = moet_f32_to_bf16(row[c]);
                memcpy(out + (size_t)r * rb + 2 * (size_t)c, &h, 2);
            }
        }
    }
    free(row);
    *nbytes = rb * (size_t)rows;
    return out;
}

static uint8_t *dense_to_q8_0(const moet_st_tensor *t) {
    const int64_t rows = t->shape[0], cols = t->shape[1];
    const size_t rb = moet_type_row_bytes(MOET_TYPE_Q8_0, cols);
    uint8_t *out = malloc(rb * (size_t)rows + 1);
    float *row = malloc((size_t)cols * sizeof(float));
    if (!out || !row) { free(out); free(row); return NULL; }
    for (int64_t r = 0; r < rows; r++) {
        const uint8_t *src = t->data + (size_t)r * (size_t)cols * moet_st_dtype_size(t->dtype);
        for (int64_t c = 0; c < cols; c++) {
            uint16_t h;
            switch (t->dtype) {
            case MOET_ST_F32: memcpy(&row[c], src + 4 * c, 4); break;
            case MOET_ST_F16: memcpy(&h, src + 2 * c, 2); row[c] = moet_f16_to_f32(h); break;
            default: memcpy(&h, src + 2 * c, 2); row[c] = moet_bf16_to_f32(h); break;
            }
        }
        moet_q8_0_quantize_row(row, (moet_block_q8_0 *)(out + (size_t)r * rb), cols);
    }
    free(row);
    return out;
}

/* A matrix's (qscale, qbeta, rot_seed, rotated) as the qparams tensors store them. */
static void put_qparams(float *qp, const moet_matq_info *info) {
    qp[0] = info->qscale;
    qp[1] = info->qbeta;
    qp[2] = (float)info->rot_seed;
    qp[3] = (float)info->rotated;
}

static void pw_task(void *vctx, int64_t b, int64_t e, int tid) {
    (void)tid;
    pw_ctx *x = vctx;
    const moet_hparams *hp = &x->m->hp;
    const int64_t E = hp->n_experts;
    for (int64_t t = b; t < e; t++) {
        int l = (int)x->task_layer[t];
        int64_t ex = t % E;
        const moet_layer *L = &x->m->layers[l];
        const moet_weight *ws[3] = {&L->exp_gate[ex], &L->exp_up[ex], &L->exp_down[ex]};
        double *hin = moet_calib_hessian(x->o->calib, l, ex, 0), *hdn = moet_calib_hessian(x->o->calib, l, ex, 1);
        for (int k = 0; k < 3; k++) {
            const moet_weight *w = ws[k];
            float *src = moet_weight_widen(w);
            float *deq = malloc((size_t)(w->rows * w->cols) * sizeof(float));
            moet_matq_options q = x->o->q;
            if (x->delta) q.format = MOET_QF_W2;
            q.seed = moet_expert_rot_seed(l, k);
            size_t rb = moet_type_row_bytes(moet_qformat_type(q.format), w->cols);
            uint8_t *blk = malloc(rb * (size_t)w->rows + 1);
            moet_matq_info info;
            if (!src || !deq || !blk) { x->failed = 1; free(src); free(deq); free(blk); continue; }
            if (moet_matq_quantize(src, w->rows, w->cols, k == 2 ? hdn : hin, &q, deq, blk, &info, NULL)) x->failed = 1;
            put_qparams(x->qparams + (t * 3 + k) * 4, &info);
            if (!x->failed && moet_gguf_writer_put(x->w, x->tidx[t * 3 + k], blk)) x->failed = 2; /* 2: the write */
            free(blk);
            if (x->delta) { /* the residual in the original basis, NVFP4 with the options the in-memory path uses */
                for (int64_t i = 0; i < w->rows * w->cols; i++) src[i] -= deq[i];
                moet_matq_options dq = x->o->q;
                dq.format = MOET_QF_NVFP4;
                dq.seed = q.seed + 0x5bd1e995u;
                const size_t drb = moet_type_row_bytes(MOET_TYPE_NVFP4, w->cols);
                uint8_t *dblk = malloc(drb * (size_t)w->rows + 1);
                moet_matq_info di;
                if (!dblk || moet_matq_quantize(src, w->rows, w->cols, k == 2 ? hdn : hin, &dq, deq, dblk, &di, NULL)) x->failed = 1;
                put_qparams(x->dqparams + (t * 3 + k) * 4, &di);
                if (!x->failed && moet_gguf_writer_put(x->dw, x->dtidx[t * 3 + k], dblk)) x->failed = 2;
                free(dblk);
            }
            free(src);
            free(deq);
        }
        free(hin);
        free(hdn);
        moet_progress_add(&x->prog, 1);
    }
}

int moet_pack_write(const moet_model *m, const char *src_dir, const char *out_path, const moet_pack_options *o,
                    char *err, size_t errlen) {
    const moet_hparams *hp = &m->hp;
    uintptr_t *ex_starts = NULL; /* the routed experts' matrices' first bytes, sorted (the dense copy skips them) */
    if (m->pack) return moet_err(err, errlen, MOET_EINVAL, "re-quantizing a pack is not supported; give the HF directory");
    const int delta = moet_qformat_has_delta(o->q.format);
    if (delta && o->q.format != MOET_QF_W2_NVFP4)
        return moet_err(err, errlen, MOET_EUNSUP, "delta packs hold an NVFP4 delta (w2+nvfp4); %s is in-memory only",
                        moet_qformat_name(o->q.format));
    if (delta && !o->delta_path) return moet_err(err, errlen, MOET_EINVAL, "w2+nvfp4 needs a delta pack path");
    const int64_t E = hp->n_experts;
    pw_ctx x = {.m = m, .o = o, .delta = delta};
    for (int l = 0; l < hp->n_layers; l++) x.n_tasks += hp->layer_moe[l] ? E : 0;
    char what[64];
    snprintf(what, sizeof what, "quantizing experts to %s", moet_qformat_name(o->q.format));
    moet_progress_init(&x.prog, what, "experts", x.n_tasks);
    x.task_layer = calloc((size_t)x.n_tasks + 1, sizeof(int64_t));
    x.tidx = calloc((size_t)x.n_tasks * 3 + 1, sizeof(size_t));
    x.qparams = calloc((size_t)x.n_tasks * 12 + 1, sizeof(float));
    x.dense_bufs = calloc(m->st.n_tensors + 1, sizeof(uint8_t *));
    x.dtidx = calloc((size_t)x.n_tasks * 3 + 1, sizeof(size_t));
    x.dqparams = calloc((size_t)x.n_tasks * 12 + 1, sizeof(float));
    /* ties a delta pack to this pack: a fresh random id (time, clock, address, pid mixed) */
    char pack_id[40];
    {
        uint64_t z = (uint64_t)(moet_time_s() * 1e9) ^ ((uint64_t)(uintptr_t)&x << 16) ^ ((uint64_t)clock() << 40);
        for (int r = 0; r < 2; r++) { z ^= z >> 33; z *= 0xff51afd7ed558ccdull; z ^= z >> 29; }
        snprintf(pack_id, sizeof pack_id, "%016llx", (unsigned long long)z);
    }
    char *tok_json = NULL, *tmpl = NULL;
    int rc = MOET_OK;
    moet_gguf_writer *w = NULL;
    if (!x.task_layer || !x.tidx || !x.qparams || !x.dense_bufs || !x.dtidx || !x.dqparams) { rc = moet_err(err, errlen, MOET_ENOMEM, "out of memory"); goto out; }
    for (int l = 0, t = 0; l < hp->n_layers; l++)
        if (hp->layer_moe[l])
            for (int64_t e = 0; e < E; e++) x.task_layer[t++] = l;
    char p[4096];
    size_t tl;
    if (!moet_path_join(p, sizeof p, src_dir, "tokenizer.json") || (rc = moet_file_read_all(p, 512u << 20, &tok_json, &tl, err, errlen)))
        goto out;
    if (!(w = moet_gguf_writer_create(out_path, 32))) { rc = moet_err(err, errlen, MOET_ENOMEM, "out of memory"); goto out; }
    moet_gguf_writer_kv_str(w, "general.architecture", "moet-qwen3moe", strlen("moet-qwen3moe"));
    moet_gguf_writer_kv_u32(w, "moet.format_version", MOET_PACK_FORMAT_VERSION);
    moet_gguf_writer_kv_str(w, "moet.architecture", hp->architecture, strlen(hp->architecture));
    const int bfmt = delta ? MOET_QF_W2 : o->q.format;
    const char *fname = moet_qformat_name(bfmt);
    moet_gguf_writer_kv_str(w, "moet.expert_format", fname, strlen(fname));
    moet_gguf_writer_kv_f32(w, "moet.expert_bpw", (float)moet_qformat_bpw(bfmt));
    moet_gguf_writer_kv_str(w, "moet.pack_id", pack_id, strlen(pack_id));
    moet_gguf_writer_kv_str(w, "moet.dense_format", o->dense_q8 ? "q8_0" : "as stored", o->dense_q8 ? 4 : 9);
    for (size_t i = 0; i < sizeof k_hp_i32 / sizeof k_hp_i32[0]; i++)
        moet_gguf_writer_kv_i32(w, k_hp_i32[i].key, *(const int32_t *)((const char *)hp + k_hp_i32[i].off));
    for (size_t i = 0; i < sizeof k_hp_i32_opt / sizeof k_hp_i32_opt[0]; i++)
        moet_gguf_writer_kv_i32(w, k_hp_i32_opt[i].key, *(const int32_t *)((const char *)hp + k_hp_i32_opt[i].off));
    moet_gguf_writer_kv_f32(w, "moet.hp.route_scale", hp->route_scale);
    for (size_t i = 0; i < sizeof k_hp_f32_opt / sizeof k_hp_f32_opt[0]; i++)
        moet_gguf_writer_kv_f32(w, k_hp_f32_opt[i].key, *(const float *)((const char *)hp + k_hp_f32_opt[i].off));
    moet_gguf_writer_kv_f32(w, "moet.hp.rms_eps", hp->rms_eps);
    moet_gguf_writer_kv_f32(w, "moet.hp.rope_theta", (float)hp->rope_theta);
    {
        int32_t lm[1024];
        for (int l = 0; l < hp->n_layers; l++) lm[l] = hp->layer_moe[l];
        moet_gguf_writer_kv_arr_i32(w, "moet.hp.layer_moe", lm, (size_t)hp->n_layers);
        if (hp->layer_sliding) {
            for (int l = 0; l < hp->n_layers; l++) lm[l] = hp->layer_sliding[l];
            moet_gguf_writer_kv_arr_i32(w, "moet.hp.layer_sliding", lm, (size_t)hp->n_layers);
        }
        moet_gguf_writer_kv_arr_i32(w, "moet.hp.eos_ids", hp->eos_ids, (size_t)hp->n_eos);
    }
    moet_gguf_writer_kv_str(w, "moet.tokenizer_json", tok_json, tl);
    if (m->chat_template) moet_gguf_writer_kv_str(w, "tokenizer.chat_template", m->chat_template, strlen(m->chat_template));
    /* Dense tensors: every checkpoint tensor that is not a routed expert, as stored. A tensor is an expert's when
     * the bytes of a bound expert matrix lie in it (whatever the architecture calls it: Qwen3's mlp.experts.E.*,
     * Mixtral's block_sparse_moe.experts.E.w*, a fused gate_up_proj), found by bisection in the sorted starts. */
    size_t n_ex = 0;
    for (int l = 0; l < hp->n_layers; l++) n_ex += hp->layer_moe[l] ? 3 * (size_t)hp->n_experts : 0;
    ex_starts = malloc((n_ex ? n_ex : 1) * sizeof *ex_starts);
    if (!ex_starts) { rc = moet_err(err, errlen, MOET_ENOMEM, "out of memory"); goto out; }
    n_ex = 0;
    for (int l = 0; l < hp->n_layers; l++)
        for (int64_t e = 0; hp->layer_moe[l] && e < hp->n_experts; e++) {
            const moet_layer *L = &m->layers[l];
            ex_starts[n_ex++] = (uintptr_t)L->exp_gate[e].data;
            ex_starts[n_ex++] = (uintptr_t)L->exp_up[e].data;
            ex_starts[n_ex++] = (uintptr_t)L->exp_down[e].data;
        }
    qsort(ex_starts, n_ex, sizeof *ex_starts, cmp_uptr);
    size_t n_unbound = 0;
    for (size_t i = 0; i < m->st.n_tensors; i++) {
        const moet_st_tensor *t = &m->st.tensors[i];
        if (strstr(t->name, ".mlp.experts.") || holds_expert(ex_starts, n_ex, (uintptr_t)t->data, t->nbytes)) continue;
        /* what the architecture does not bind (GLM-4.5's and DeepSeek-V3's multi-token-prediction layers, buffers
         * of old checkpoints) is not needed to load the pack either: left out */
        if (m->st_used && !m->st_used[i]) { n_unbound++; continue; }
        const size_t nl = strlen(t->name);
        if (nl > 10 && !strcmp(t->name + nl - 10, "_scale_inv")) continue; /* an FP8 matrix's scales: applied below */
        if (t->dtype == MOET_ST_F8_E4M3) { /* FP8 (DeepSeek-V3, Kimi-K2, Qwen3-FP8): dequantized, as BF16 or Q8_0 */
            const int q8 = o->dense_q8 && is_dense_projection(t);
            size_t nb = 0;
            uint8_t *d = f8_dense(m, t, q8, &nb);
            if (!d) { rc = moet_err(err, errlen, MOET_ENOMEM, "FP8 tensor '%s': out of memory or bad scales", t->name); goto out; }
            x.dense_bufs[x.n_dense++] = d;
            const int64_t ne2[2] = {t->shape[1], t->shape[0]};
            moet_gguf_writer_tensor(w, t->name, q8 ? MOET_TYPE_Q8_0 : MOET_TYPE_BF16, 2, ne2, d, nb, 32);
            continue;
        }
        int ty = t->dtype == MOET_ST_F32 ? MOET_TYPE_F32 : t->dtype == MOET_ST_F16 ? MOET_TYPE_F16
                 : t->dtype == MOET_ST_BF16 ? MOET_TYPE_BF16 : -1;
        if (ty < 0 || t->ndim < 1 || t->ndim > 4) {
            rc = moet_err(err, errlen, MOET_EUNSUP, "tensor '%s': dtype %s / rank %d not packable", t->name,
                          moet_st_dtype_name(t->dtype), t->ndim);
            goto out;
        }
        int64_t ne[4];
        for (int d = 0; d < t->ndim; d++) ne[d] = t->shape[t->ndim - 1 - d];
        if (o->dense_q8 && is_dense_projection(t)) {
            uint8_t *q8 = dense_to_q8_0(t);
            if (!q8) { rc = moet_err(err, errlen, MOET_ENOMEM, "out of memory"); goto out; }
            x.dense_bufs[x.n_dense++] = q8;  /* the writer reads the data when it finishes */
            moet_gguf_writer_tensor(w, t->name, MOET_TYPE_Q8_0, 2, ne, q8,
                                    moet_type_row_bytes(MOET_TYPE_Q8_0, t->shape[1]) * (uint64_t)t->shape[0], 32);
            continue;
        }
        moet_gguf_writer_tensor(w, t->name, ty, t->ndim, ne, t->data, t->nbytes, 32);
    }
    if (n_unbound) MOET_LOGI("pack: %zu tensors the architecture does not use left out", n_unbound);
    /* gpt-oss: the experts' biases, de-interleaved as bound (its checkpoint tensors hold them beside the experts) */
    for (int l = 0; l < hp->n_layers; l++) {
        const moet_layer *L = &m->layers[l];
        if (!L->exp_gate_b) continue;
        static const char *const bn[3] = {"gate_bias", "up_bias", "down_bias"};
        const float *bv[3] = {L->exp_gate_b, L->exp_up_b, L->exp_down_b};
        for (int k = 0; k < 3; k++) {
            char nm[256];
            snprintf(nm, sizeof nm, "model.layers.%d.mlp.experts.%s", l, bn[k]);
            const int64_t ne[1] = {(int64_t)hp->n_experts * (k == 2 ? hp->hidden : hp->expert_ffn)};
            moet_gguf_writer_tensor(w, nm, MOET_TYPE_F32, 1, ne, bv[k], (uint64_t)ne[0] * sizeof(float), 32);
        }
    }
    /* Experts: one 4 KiB-aligned record each (gate, up, down back to back), then the layer's qparams. Their data is
     * deferred: the file is laid out first, and each matrix is written the moment it is quantized (a 671B model's
     * 183 GB of W2 records never sit in memory); the qparams go last. */
    int32_t ty = moet_qformat_type(bfmt);
    for (int64_t t = 0; t < x.n_tasks; t++) {
        int l = (int)x.task_layer[t];
        int64_t e = t % E;
        const moet_layer *L = &m->layers[l];
        const moet_weight *ws[3] = {&L->exp_gate[e], &L->exp_up[e], &L->exp_down[e]};
        for (int k = 0; k < 3; k++) {
            char nm[256];
            int64_t ne[2] = {ws[k]->cols, ws[k]->rows};
            x.tidx[t * 3 + k] = moet_gguf_writer_n_tensors(w);
            moet_gguf_writer_tensor(w, matrix_name(nm, sizeof nm, l, e, k), ty, 2, ne, NULL,
                                    moet_type_row_bytes(ty, ws[k]->cols) * (uint64_t)ws[k]->rows,
                                    k == 0 ? MOET_PACK_RECORD_ALIGN : 32);
        }
        if (e == E - 1) {
            char nm[256];
            snprintf(nm, sizeof nm, "model.layers.%d.mlp.experts.qparams", l);
            int64_t ne[2] = {4, 3 * E};
            moet_gguf_writer_tensor(w, nm, MOET_TYPE_F32, 2, ne, NULL, (uint64_t)(12 * E) * sizeof(float), 32);
        }
    }
    if ((rc = moet_gguf_writer_begin(w, err, errlen))) goto out;
    x.w = w;
    moet_delta_data dd = {.task_layer = x.task_layer, .n_tasks = x.n_tasks, .qparams = x.dqparams, .pack_id = pack_id};
    if (delta && (rc = moet_delta_begin(m, o->delta_path, &dd, &x.dw, x.dtidx, err, errlen))) goto out;
    for (size_t i = 0; i < x.n_dense; i++) free(x.dense_bufs[i]); /* written by begin */
    x.n_dense = 0;
    {
        moet_pool *pool = moet_pool_create(o->n_threads);
        moet_pool_for(pool, x.n_tasks, pw_task, &x);
        moet_pool_free(pool);
        moet_progress_end(&x.prog);
    }
    if (x.failed) {
        rc = x.failed == 2 ? moet_err(err, errlen, MOET_EIO, "writing %s failed (disk full?)", out_path)
                           : moet_err(err, errlen, MOET_ENOMEM, "quantization failed (out of memory)");
        goto out;
    }
    for (int64_t t = E - 1; t < x.n_tasks; t += E) /* each layer's qparams, after its last expert's record */
        if (moet_gguf_writer_put(w, x.tidx[t * 3 + 2] + 1, x.qparams + (t - (E - 1)) * 12)) {
            rc = moet_err(err, errlen, MOET_EIO, "writing %s failed (disk full?)", out_path);
            goto out;
        }
    rc = moet_gguf_writer_finish(w, err, errlen);
    w = NULL;
    if (delta) { /* its qparams, then closed (or removed when the pack failed) */
        if (!rc) rc = moet_delta_finish(x.dw, &dd, x.dtidx, E, err, errlen);
        else moet_gguf_writer_abort(x.dw);
        x.dw = NULL;
    }
out:
    free(ex_starts);
    if (w) moet_gguf_writer_abort(w);
    free(x.tidx);
    free(x.qparams);
    if (x.dw) moet_gguf_writer_abort(x.dw);
    free(x.dtidx);
    free(x.dqparams);
    free(x.task_layer);
    for (size_t i = 0; i < x.n_dense; i++) free(x.dense_bufs[i]);
    free(x.dense_bufs);
    free(tok_json);
    free(tmpl);
    return rc;
}

/* ---- load ----------------------------------------------------------------------------------------------------- */

int moet_pack_load(moet_model *m, const char *path, char *err, size_t errlen) {
    moet_hparams *hp = &m->hp;
    if (!(m->pack = calloc(1, sizeof(moet_gguf)))) return moet_err(err, errlen, MOET_ENOMEM, "out of memory");
    int rc = moet_gguf_open(path, m->pack, err, errlen);
    if (rc) { free(m->pack); m->pack = NULL; return rc; }
    const moet_gguf *g = m->pack;
    int64_t v;
    char *s = NULL;
    if (moet_gguf_get_i64(g, "moet.format_version", &v) || v != MOET_PACK_FORMAT_VERSION)
        return moet_err(err, errlen, MOET_EFORMAT, "%s: not a moet pack of format version %d", path, MOET_PACK_FORMAT_VERSION);
    if (moet_gguf_get_str(g, "moet.architecture", &s))
        return moet_err(err, errlen, MOET_EFORMAT, "%s: missing moet.architecture", path);
    snprintf(hp->architecture, sizeof hp->architecture, "%s", s);
    free(s);
    if (!(m->arch = moet_arch_find(hp->architecture)))
        return moet_err(err, errlen, MOET_EUNSUP, "%s: unsupported architecture '%s' (supported: %s)", path,
                        hp->architecture, moet_arch_list());
    for (size_t i = 0; i < sizeof k_hp_i32 / sizeof k_hp_i32[0]; i++) {
        if (moet_gguf_get_i64(g, k_hp_i32[i].key, &v) || v < -1 || v > (1 << 24))
            return moet_err(err, errlen, MOET_EFORMAT, "%s: missing or bad %s", path, k_hp_i32[i].key);
        *(int32_t *)((char *)hp + k_hp_i32[i].off) = (int32_t)v;
    }
    for (size_t i = 0; i < sizeof k_hp_i32_opt / sizeof k_hp_i32_opt[0]; i++) {
        v = k_hp_i32_opt[i].def;
        if (moet_gguf_find_kv(g, k_hp_i32_opt[i].key) &&
            (moet_gguf_get_i64(g, k_hp_i32_opt[i].key, &v) || v < k_hp_i32_opt[i].lo || v > k_hp_i32_opt[i].hi))
            return moet_err(err, errlen, MOET_EFORMAT, "%s: bad %s", path, k_hp_i32_opt[i].key);
        *(int32_t *)((char *)hp + k_hp_i32_opt[i].off) = (int32_t)v;
    }
    double d;
    hp->route_scale = 1.0f;
    if (moet_gguf_find_kv(g, "moet.hp.route_scale")) {
        if (moet_gguf_get_f64(g, "moet.hp.route_scale", &d) || !(d >= 0 && d <= 1e6))
            return moet_err(err, errlen, MOET_EFORMAT, "%s: bad moet.hp.route_scale", path);
        hp->route_scale = (float)d;
    }
    for (size_t i = 0; i < sizeof k_hp_f32_opt / sizeof k_hp_f32_opt[0]; i++) {
        d = k_hp_f32_opt[i].def;
        if (moet_gguf_find_kv(g, k_hp_f32_opt[i].key) &&
            (moet_gguf_get_f64(g, k_hp_f32_opt[i].key, &d) || !(d >= k_hp_f32_opt[i].lo && d <= k_hp_f32_opt[i].hi)))
            return moet_err(err, errlen, MOET_EFORMAT, "%s: bad %s", path, k_hp_f32_opt[i].key);
        *(float *)((char *)hp + k_hp_f32_opt[i].off) = (float)d;
    }
    if (moet_gguf_get_f64(g, "moet.hp.rms_eps", &d)) return moet_err(err, errlen, MOET_EFORMAT, "%s: missing moet.hp.rms_eps", path);
    hp->rms_eps = (float)d;
    if (moet_gguf_get_f64(g, "moet.hp.rope_theta", &d)) return moet_err(err, errlen, MOET_EFORMAT, "%s: missing moet.hp.rope_theta", path);
    hp->rope_theta = d;
    if (hp->vocab < 1 || hp->hidden < 1 || hp->n_layers < 1 || hp->n_layers > 1024 || hp->n_heads < 1 ||
        hp->n_kv_heads < 1 || hp->n_heads % hp->n_kv_heads || hp->head_dim < 2 || hp->head_dim % 2 ||
        hp->rope_dim < 2 || hp->rope_dim > hp->head_dim || hp->rope_dim % 2 || hp->n_experts < 0 ||
        hp->n_experts_used > hp->n_experts || hp->max_pos < 1 || hp->router_scoring < MOET_ROUTER_SOFTMAX ||
        hp->router_scoring > MOET_ROUTER_TOPK_SOFTMAX || hp->topk_group > hp->n_group ||
        (hp->n_experts > 0 && hp->n_experts % hp->n_group) ||
        (hp->kv_lora_rank > 0 && (hp->head_dim != hp->qk_nope_dim + hp->rope_dim || hp->v_head_dim < 1 ||
                                  hp->v_head_dim > hp->head_dim || hp->n_kv_heads != hp->n_heads)))
        return moet_err(err, errlen, MOET_EFORMAT, "%s: inconsistent hyperparameters", path);
    if ((rc = moet_rope_init(hp, err, errlen))) return rc;
    const moet_gguf_kv *lm = moet_gguf_find_kv(g, "moet.hp.layer_moe"), *eo = moet_gguf_find_kv(g, "moet.hp.eos_ids");
    if (!lm || lm->type != MOET_GGUF_ARRAY || lm->arr_type != MOET_GGUF_I32 || lm->arr_n != (uint64_t)hp->n_layers)
        return moet_err(err, errlen, MOET_EFORMAT, "%s: moet.hp.layer_moe must be %d i32", path, hp->n_layers);
    if (!(hp->layer_moe = calloc((size_t)hp->n_layers, 1))) return moet_err(err, errlen, MOET_ENOMEM, "out of memory");
    for (int l = 0; l < hp->n_layers; l++) {
        int32_t x;
        memcpy(&x, lm->arr + 4 * l, 4);
        hp->layer_moe[l] = x != 0;
    }
    const moet_gguf_kv *ls = moet_gguf_find_kv(g, "moet.hp.layer_sliding");
    if (ls) {
        if (ls->type != MOET_GGUF_ARRAY || ls->arr_type != MOET_GGUF_I32 || ls->arr_n != (uint64_t)hp->n_layers ||
            hp->sliding_window <= 0)
            return moet_err(err, errlen, MOET_EFORMAT, "%s: moet.hp.layer_sliding must be %d i32 with a sliding window",
                            path, hp->n_layers);
        if (!(hp->layer_sliding = calloc((size_t)hp->n_layers, 1))) return moet_err(err, errlen, MOET_ENOMEM, "out of memory");
        for (int l = 0; l < hp->n_layers; l++) {
            int32_t x;
            memcpy(&x, ls->arr + 4 * l, 4);
            hp->layer_sliding[l] = x != 0;
        }
    }
    if (eo && eo->type == MOET_GGUF_ARRAY && eo->arr_type == MOET_GGUF_I32)
        for (uint64_t i = 0; i < eo->arr_n && hp->n_eos < MOET_MAX_EOS; i++) {
            int32_t x;
            memcpy(&x, eo->arr + 4 * i, 4);
            if (x >= 0 && x < hp->vocab) hp->eos_ids[hp->n_eos++] = x;
        }
    const moet_gguf_kv *tj = moet_gguf_find_kv(g, "moet.tokenizer_json");
    if (!tj || tj->type != MOET_GGUF_STRING) return moet_err(err, errlen, MOET_EFORMAT, "%s: missing moet.tokenizer_json", path);
    if ((rc = moet_tokenizer_load_buffer(path, tj->str, tj->str_len, &m->tok, err, errlen))) return rc;
    if (!moet_gguf_get_str(g, "tokenizer.chat_template", &s)) m->chat_template = s;
    if ((rc = m->arch->bind(m, err, errlen))) return rc;
    /* Per-matrix parameters of the experts. */
    for (int l = 0; l < hp->n_layers; l++) {
        if (!hp->layer_moe[l]) continue;
        char nm[256];
        snprintf(nm, sizeof nm, "model.layers.%d.mlp.experts.qparams", l);
        const moet_gguf_tensor *t = moet_gguf_find_tensor(g, nm);
        if (!t || t->type != MOET_TYPE_F32 || t->ne[0] != 4 || t->ne[1] != 3 * (int64_t)hp->n_experts)
            return moet_err(err, errlen, MOET_EFORMAT, "%s: %s missing or of the wrong shape", path, nm);
        const float *qp = (const float *)t->data;
        moet_layer *L = &m->layers[l];
        for (int64_t e = 0; e < hp->n_experts; e++) {
            moet_weight *ws[3] = {&L->exp_gate[e], &L->exp_up[e], &L->exp_down[e]};
            for (int k = 0; k < 3; k++) {
                const float *q = qp + (e * 3 + k) * 4;
                if (!(q[0] > 0) || q[1] < 0 || q[1] >= 1 || q[2] < 0 || q[2] > 16777216.0f || (q[3] != 0 && q[3] != 1))
                    return moet_err(err, errlen, MOET_EFORMAT, "%s: bad qparams for layer %d expert %lld", path, l, (long long)e);
                ws[k]->qscale = q[0];
                ws[k]->qbeta = q[1];
                ws[k]->rot_seed = (uint32_t)q[2];
                ws[k]->rotated = (int32_t)q[3];
                if (ws[k]->rotated && ws[k]->cols % 32)
                    return moet_err(err, errlen, MOET_EFORMAT, "%s: rotated matrix of width %lld", path, (long long)ws[k]->cols);
            }
        }
    }
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const moet_type_traits *tr = moet_type_get(g->tensors[i].type);
        m->n_params += (int64_t)(g->tensors[i].nbytes / (uint64_t)tr->type_size * (uint64_t)tr->block_size);
        m->weight_bytes += (int64_t)g->tensors[i].nbytes;
    }
    return MOET_OK;
}
