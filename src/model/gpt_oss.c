/*
 * gpt_oss.c — GptOssForCausalLM (gpt-oss-20b, gpt-oss-120b).
 *
 * Per layer: RMSNorm -> GQA attention with q/k/v/o biases, rotate-half RoPE over the whole head (YaRN in the
 * released configs: factor 32 from 4096 tokens, not truncated), per-head attention sinks (a learned logit in every
 * row's softmax whose value is dropped) and, on the "sliding_attention" layers of layer_types, a sliding window of
 * sliding_window keys -> residual; RMSNorm -> the MoE block -> residual:
 *   router   logits = W x + b; the K largest, weighted by the softmax over those K (MOET_ROUTER_TOPK_SOFTMAX);
 *   experts  gate_up = x W_gu + b_gu with gate and up interleaved (gate = even columns, up = odd), the clamped
 *            SwiGLU act = (clamp(up, -7, 7) + 1) min(gate, 7) sigmoid(1.702 min(gate, 7)) (swiglu_limit), then
 *            act W_d + b_d; every expert of intermediate_size.
 * The experts come in three layouts, each turned here into moet's rows (gate / up [F x H], down [H x F], F =
 * intermediate_size) and de-interleaved biases:
 *   transformers'  mlp.experts.gate_up_proj [E, H, 2F] (x @ W) + gate_up_proj_bias [E, 2F], down_proj [E, F, H] +
 *                  down_proj_bias [E, H]: copied, transposed, into owned rows of the same dtype (or, stored
 *                  [E, 2F, H] and [E, H, F], copied as rows);
 *   the hub's      the same names with _blocks [E, rows, cols/32, 16] (u8, e2m1 pairs, first element in the low
 *                  nibble) and _scales [E, rows, cols/32] (u8, e8m0) for the weights: MXFP4, its nibbles reordered
 *                  into moet's block (quant/blocks.h: element j and j + 16 in a byte), rows as they are;
 *   moet packs     per expert under mlp.experts.E.{gate,up,down}_proj, biases as mlp.experts.{gate,up,down}_bias.
 *
 * CUDA: the attention kernels take the sinks and windows (the tensor-core prefill kernel declines them), the MoE runs
 * moe.cu's per-slot kernels with the biases and the clamp (its experts are never tiled); compiled, not yet run on a
 * GPU at stop 27.
 * Not supported (refused by name): a hidden_act other than silu, layer types other than full / sliding attention.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "format/hf_config.h"
#include "model/arch.h"
#include "model/hf_common.h"
#include "model/model.h"
#include "quant/blocks.h"
#include "quant/requant.h"
#include "quant/types.h"

#define TRY(x) do { int rc_ = (x); if (rc_) return rc_; } while (0)

static int oss_parse_config(const json_t *cfg, moet_hparams *hp, char *err, size_t errlen) {
    TRY(moet_hf_parse_common(cfg, 1.0, hp, err, errlen));
    TRY(moet_cfg_int(cfg, "intermediate_size", true, 0, 1, 1 << 20, &hp->expert_ffn, err, errlen));
    hp->dense_ffn = hp->expert_ffn;
    static const char *const k_nexp[] = {"num_local_experts", "num_experts", NULL};
    const char *kexp = moet_cfg_pick(cfg, k_nexp);
    if (!kexp) return moet_err(err, errlen, MOET_EFORMAT, "missing key 'num_local_experts'");
    TRY(moet_cfg_int(cfg, kexp, true, 0, 1, 4096, &hp->n_experts, err, errlen));
    static const char *const k_k[] = {"num_experts_per_tok", "experts_per_token", NULL};
    const char *kk = moet_cfg_pick(cfg, k_k);
    if (!kk) return moet_err(err, errlen, MOET_EFORMAT, "missing key 'num_experts_per_tok'");
    TRY(moet_cfg_int(cfg, kk, true, 0, 1, hp->n_experts, &hp->n_experts_used, err, errlen));
    double lim;
    TRY(moet_cfg_num(cfg, "swiglu_limit", false, 7.0, 0.0, 1e6, &lim, err, errlen));
    hp->swiglu_limit = (float)lim;
    TRY(moet_cfg_int(cfg, "sliding_window", false, 0, 0, 1 << 24, &hp->sliding_window, err, errlen));
    hp->router_scoring = MOET_ROUTER_TOPK_SOFTMAX;
    hp->norm_topk = 1; /* the softmax over the K picks sums to 1 */
    hp->attn_bias = 1;
    hp->layer_moe = malloc((size_t)hp->n_layers);
    if (!hp->layer_moe) return moet_err(err, errlen, MOET_ENOMEM, "out of memory");
    memset(hp->layer_moe, 1, (size_t)hp->n_layers);
    const json_t *lt = json_object_get(cfg, "layer_types");
    if (lt && !json_is_null(lt)) {
        if (!json_is_array(lt) || json_array_size(lt) != (size_t)hp->n_layers)
            return moet_err(err, errlen, MOET_EFORMAT, "layer_types must be an array of num_hidden_layers strings");
        if (!(hp->layer_sliding = calloc((size_t)hp->n_layers, 1)))
            return moet_err(err, errlen, MOET_ENOMEM, "out of memory");
        for (size_t i = 0; i < json_array_size(lt); i++) {
            const char *s = json_string_value(json_array_get(lt, i));
            if (!s || (strcmp(s, "full_attention") && strcmp(s, "sliding_attention")))
                return moet_err(err, errlen, MOET_EUNSUP, "layer_types[%zu] is not 'full_attention' or "
                                "'sliding_attention'", i);
            if (!strcmp(s, "sliding_attention") && hp->sliding_window <= 0)
                return moet_err(err, errlen, MOET_EFORMAT, "layer_types[%zu] slides without a sliding_window", i);
            hp->layer_sliding[i] = !strcmp(s, "sliding_attention");
        }
    }
    return MOET_OK;
}

/* n bytes of host memory the model owns (freed with it). */
static void *owned(moet_model *m, size_t n) {
    if (moet_model_f32_reserve(m, 1)) return NULL;
    void *p = aligned_alloc(64, (n + 63) / 64 * 64);
    if (p) m->f32_bufs[m->n_f32_bufs++] = p;
    return p;
}


/* The biases [E, 2F] (interleaved gate / up) or [E, H] into owned f32 arrays. */
static int bind_bias(moet_model *m, const char *name, int64_t E, int64_t n, int interleaved, float **a, float **b,
                     char *err, size_t errlen) {
    moet_weight w;
    TRY(moet_bind_matrix(m, name, E, n, &w, err, errlen));
    const int64_t F = interleaved ? n / 2 : n;
    float *row = malloc((size_t)n * sizeof(float));
    *a = owned(m, (size_t)(E * F) * sizeof(float));
    if (b) *b = owned(m, (size_t)(E * F) * sizeof(float));
    if (!row || !*a || (b && !*b)) { free(row); return moet_err(err, errlen, MOET_ENOMEM, "out of memory"); }
    for (int64_t e = 0; e < E; e++) {
        moet_weight_row_f32(&w, e, row);
        for (int64_t f = 0; f < F; f++) {
            (*a)[e * F + f] = interleaved ? row[2 * f] : row[f];
            if (b) (*b)[e * F + f] = row[2 * f + 1];
        }
    }
    free(row);
    return MOET_OK;
}

/* transformers' layout: W [E, in, out] (x @ W). Expert e's rows o0, o0 + step, .. (n of them) of the product, i.e.
 * columns of W[e], into an owned [n x in] matrix of W's dtype. */
static int gather_cols(moet_model *m, const char *name, int64_t E, int64_t e, int64_t in, int64_t out, int64_t o0,
                       int64_t step, int64_t n, moet_weight *dst, char *err, size_t errlen) {
    moet_weight w;
    TRY(moet_bind_matrix_slice(m, name, E, e, in, 0, in, out, &w, err, errlen));
    const size_t es = w.row_bytes / (size_t)out; /* 2 or 4 bytes an element */
    uint8_t *d = owned(m, (size_t)(n * in) * es);
    if (!d) return moet_err(err, errlen, MOET_ENOMEM, "out of memory");
    for (int64_t r = 0; r < n; r++)
        for (int64_t i = 0; i < in; i++)
            memcpy(d + ((size_t)r * (size_t)in + (size_t)i) * es,
                   (const uint8_t *)w.data + (size_t)i * w.row_bytes + (size_t)(o0 + r * step) * es, es);
    *dst = (moet_weight){.data = d, .type = w.type, .rows = n, .cols = in, .row_bytes = (size_t)in * es, .qscale = 1.0f};
    return MOET_OK;
}

/* The same from a [E, out, in] tensor (rows already): rows o0, o0 + step, .. (n of them) of expert e, copied. */
static int gather_rows(moet_model *m, const char *name, int64_t E, int64_t e, int64_t out, int64_t in, int64_t o0,
                       int64_t step, int64_t n, moet_weight *dst, char *err, size_t errlen) {
    moet_weight w;
    TRY(moet_bind_matrix_slice(m, name, E, e, out, 0, out, in, &w, err, errlen));
    uint8_t *d = owned(m, (size_t)n * w.row_bytes);
    if (!d) return moet_err(err, errlen, MOET_ENOMEM, "out of memory");
    for (int64_t r = 0; r < n; r++)
        memcpy(d + (size_t)r * w.row_bytes, (const uint8_t *)w.data + (size_t)(o0 + r * step) * w.row_bytes, w.row_bytes);
    *dst = (moet_weight){.data = d, .type = w.type, .rows = n, .cols = in, .row_bytes = w.row_bytes, .qscale = 1.0f};
    return MOET_OK;
}

/* The hub's MXFP4 layout: rows o0, o0 + step, .. (n of them) of expert e of <base>_blocks [E, R, C/32, 16] and
 * <base>_scales [E, R, C/32] into owned moet MXFP4 rows. */
static int gather_mxfp4(moet_model *m, const char *base, int64_t E, int64_t e, int64_t R, int64_t C, int64_t o0,
                        int64_t step, int64_t n, moet_weight *dst, char *err, size_t errlen) {
    char bn[300], sn[300];
    snprintf(bn, sizeof bn, "%s_blocks", base);
    snprintf(sn, sizeof sn, "%s_scales", base);
    const moet_st_tensor *tb = moet_st_find(&m->st, bn), *ts = moet_st_find(&m->st, sn);
    const int64_t nb = C / MOET_QK;
    if (!tb || !ts || tb->dtype != MOET_ST_U8 || ts->dtype != MOET_ST_U8 || tb->ndim != 4 || ts->ndim != 3 ||
        tb->shape[0] != E || tb->shape[1] != R || tb->shape[2] != nb || tb->shape[3] != 16 || ts->shape[0] != E ||
        ts->shape[1] != R || ts->shape[2] != nb || C % MOET_QK)
        return moet_err(err, errlen, MOET_EFORMAT, "%s: MXFP4 blocks / scales missing or not [%lld, %lld, %lld, 16] "
                        "u8", base, (long long)E, (long long)R, (long long)nb);
    m->st_used[tb - m->st.tensors] = m->st_used[ts - m->st.tensors] = 1;
    moet_block_mxfp4 *d = owned(m, (size_t)(n * nb) * sizeof(moet_block_mxfp4));
    if (!d) return moet_err(err, errlen, MOET_ENOMEM, "out of memory");
    for (int64_t r = 0; r < n; r++) {
        const size_t src = (size_t)(e * R + o0 + r * step) * (size_t)nb;
        for (int64_t k = 0; k < nb; k++) {
            const uint8_t *q = tb->data + (src + (size_t)k) * 16; /* element 2b low nibble, 2b + 1 high */
            moet_block_mxfp4 *o = &d[r * nb + k];
            o->e = ts->data[src + (size_t)k];
            for (int j = 0; j < 16; j++) {
                const int lo = (q[j / 2] >> (4 * (j & 1))) & 15, hi = (q[8 + j / 2] >> (4 * (j & 1))) & 15;
                o->qs[j] = (uint8_t)(lo | hi << 4);
            }
        }
    }
    *dst = (moet_weight){.data = d, .type = MOET_TYPE_MXFP4, .rows = n, .cols = C,
                         .row_bytes = (size_t)nb * sizeof(moet_block_mxfp4), .qscale = 1.0f};
    return MOET_OK;
}

static int oss_bind_experts(moet_model *m, int il, char *err, size_t errlen) {
    const moet_hparams *hp = &m->hp;
    moet_layer *L = &m->layers[il];
    const int64_t E = hp->n_experts, F = hp->expert_ffn, H = hp->hidden;
    char n[256], n2[256];
    snprintf(n, sizeof n, "model.layers.%d.mlp.experts.gate_bias", il);
    if (moet_has_tensor(m, n)) { /* a moet pack: per-expert rows, de-interleaved biases */
        static const char *const k_names[1][3] = {{"mlp.experts.%lld.gate_proj.weight", "mlp.experts.%lld.up_proj.weight",
                                                   "mlp.experts.%lld.down_proj.weight"}};
        TRY(moet_hf_bind_experts(m, il, k_names, 1, NULL, err, errlen));
        TRY(moet_bind_vector(m, n, E * F, &L->exp_gate_b, err, errlen));
        snprintf(n, sizeof n, "model.layers.%d.mlp.experts.up_bias", il);
        TRY(moet_bind_vector(m, n, E * F, &L->exp_up_b, err, errlen));
        snprintf(n, sizeof n, "model.layers.%d.mlp.experts.down_bias", il);
        return moet_bind_vector(m, n, E * H, &L->exp_down_b, err, errlen);
    }
    L->exp_gate = calloc((size_t)E * 3, sizeof(moet_weight));
    if (!L->exp_gate) return moet_err(err, errlen, MOET_ENOMEM, "out of memory");
    L->exp_up = L->exp_gate + E;
    L->exp_down = L->exp_up + E;
    float *gb, *ub, *db;
    snprintf(n, sizeof n, "model.layers.%d.mlp.experts.gate_up_proj_bias", il);
    TRY(bind_bias(m, n, E, 2 * F, 1, &gb, &ub, err, errlen));
    snprintf(n, sizeof n, "model.layers.%d.mlp.experts.down_proj_bias", il);
    TRY(bind_bias(m, n, E, H, 0, &db, NULL, err, errlen));
    L->exp_gate_b = gb;
    L->exp_up_b = ub;
    L->exp_down_b = db;
    snprintf(n, sizeof n, "model.layers.%d.mlp.experts.gate_up_proj", il);
    snprintf(n2, sizeof n2, "model.layers.%d.mlp.experts.down_proj", il);
    const int mx = !moet_has_tensor(m, n);
    if (mx && m->pack) return moet_err(err, errlen, MOET_EFORMAT, "%s: layer %d's experts are missing", m->pack->path, il);
    /* transformers lays the experts out [E, in, out] (x @ W); a checkpoint that stores them [E, out, in] is told apart
     * by gate_up's shape (2F != H in every released config), and down_proj is taken the same way */
    const moet_st_tensor *tg = mx || m->pack ? NULL : moet_st_find(&m->st, n);
    const int rows_first = tg && tg->ndim == 3 && tg->shape[1] == 2 * F && tg->shape[2] == H && 2 * F != H;
    for (int64_t e = 0; e < E; e++) {
        if (mx) { /* the hub's MXFP4: [out, in] rows already, gate / up interleaved */
            TRY(gather_mxfp4(m, n, E, e, 2 * F, H, 0, 2, F, &L->exp_gate[e], err, errlen));
            TRY(gather_mxfp4(m, n, E, e, 2 * F, H, 1, 2, F, &L->exp_up[e], err, errlen));
            TRY(gather_mxfp4(m, n2, E, e, H, F, 0, 1, H, &L->exp_down[e], err, errlen));
        } else if (rows_first) { /* [out, in]: rows as they are, de-interleaved */
            TRY(gather_rows(m, n, E, e, 2 * F, H, 0, 2, F, &L->exp_gate[e], err, errlen));
            TRY(gather_rows(m, n, E, e, 2 * F, H, 1, 2, F, &L->exp_up[e], err, errlen));
            TRY(gather_rows(m, n2, E, e, H, F, 0, 1, H, &L->exp_down[e], err, errlen));
        } else { /* transformers': [in, out], transposed */
            TRY(gather_cols(m, n, E, e, H, 2 * F, 0, 2, F, &L->exp_gate[e], err, errlen));
            TRY(gather_cols(m, n, E, e, H, 2 * F, 1, 2, F, &L->exp_up[e], err, errlen));
            TRY(gather_cols(m, n2, E, e, F, H, 0, 1, H, &L->exp_down[e], err, errlen));
        }
    }
    return MOET_OK;
}

static int oss_bind(moet_model *m, char *err, size_t errlen) {
    const moet_hparams *hp = &m->hp;
    TRY(moet_hf_bind_model(m, err, errlen));
    char n[256];
    for (int il = 0; il < hp->n_layers; il++) {
        moet_layer *L = &m->layers[il];
        TRY(moet_hf_bind_attention(m, il, err, errlen)); /* q/k/v/o with biases (attention_bias) */
        snprintf(n, sizeof n, "model.layers.%d.self_attn.sinks", il);
        TRY(moet_bind_vector(m, n, hp->n_heads, &L->sinks, err, errlen));
        L->window = hp->layer_sliding && hp->layer_sliding[il] ? hp->sliding_window : 0;
        L->is_moe = 1;
        snprintf(n, sizeof n, "model.layers.%d.mlp.router.weight", il);
        TRY(moet_bind_matrix(m, n, hp->n_experts, hp->hidden, &L->router, err, errlen));
        snprintf(n, sizeof n, "model.layers.%d.mlp.router.bias", il);
        TRY(moet_bind_vector(m, n, hp->n_experts, &L->router_lbias, err, errlen));
        TRY(oss_bind_experts(m, il, err, errlen));
    }
    return MOET_OK;
}

const moet_arch moet_arch_gpt_oss = {
    .hf_name = "GptOssForCausalLM",
    .family = "gpt_oss",
    .parse_config = oss_parse_config,
    .bind = oss_bind,
};
